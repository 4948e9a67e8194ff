"""C source of the pass shim against libllama (compiled by :mod:`specmoe.engines.llamacpp_pass`
on first use, against the llama.cpp build's headers).

Legend: ``n`` tokens of one pass, ``L`` layers, ``k`` experts per token, ``V`` vocabulary,
``M`` graph nodes of one pass.

One model and up to two contexts (slot 0: the timed passes; slot 1: a scratch context for
plain greedy decoding, made on first use), each holding one sequence. ``lp_decode`` decodes n
tokens at positions p..p+n-1 (p the sequence's length: the pass extends the cache) with the
logits of every row, and returns each row's argmax and top-1 minus top-2 logit margin, and the
thread CPU time (CLOCK_THREAD_CPUTIME_ID) and wall time (CLOCK_MONOTONIC) of the
``llama_decode`` call and ``llama_synchronize`` alone. ``lp_crop`` removes the positions >= p
(``llama_memory_seq_rm``).

The eval callback (``llama_context_params.cb_eval``) of slot 0 has three modes. Off (mode 0):
it asks for no node, so the scheduler computes each split whole (a loop over the nodes asking,
and one graph view: no split of the graph). Routing (mode 1): it asks for
``ffn_moe_topk-<l>`` and copies each row's experts, as the routing recorder does; the graph is
cut at every such node. Profile (mode 2): it asks for every node, so that each node is
computed alone, and on each ``ask=false`` call records the node's name, its op
(``ggml_op_desc``) and the thread CPU and wall timestamps; node i's time is the difference to
the previous timestamp, the first node's from the start of the decode call (so it holds the
graph's build and the inputs' upload).
"""

from specmoe.engines._llamacpp_common_csrc import PRELUDE

SOURCE = (
    PRELUDE
    + r"""
#define LP_NAME 64
#define LP_OP 32

typedef struct {
    struct llama_model * model;
    struct llama_context * ctx[2];
    struct llama_context_params cp;
    int n_layer, top_k, n_expert, n_ctx, n_vocab, batch;
    int mode; /* 0 off, 1 routing, 2 profile */
    /* routing */
    int64_t n;
    int32_t * out_ids; /* [n, L, k] */
    int64_t * fill_ids; /* [L] */
    /* profile */
    int64_t prof_cap, prof_n;
    char * prof_names; /* [cap, LP_NAME] */
    char * prof_ops;   /* [cap, LP_OP] */
    int64_t * prof_cpu; /* [cap] ns */
    int64_t * prof_wall;
    int64_t last_cpu, last_wall;
    int failed;
    char err[SM_ERRLEN];
} lp_state;

static int64_t lp_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static bool lp_callback(struct ggml_tensor * t, bool ask, void * user) {
    lp_state * st = (lp_state *) user;
    if (st->mode == 0) return ask ? false : true;
    if (st->mode == 2) {
        if (ask) return true;
        int64_t c = lp_ns(CLOCK_THREAD_CPUTIME_ID), w = lp_ns(CLOCK_MONOTONIC);
        if (st->prof_n >= st->prof_cap) {
            sm_fail(&st->failed, st->err, "more graph nodes than the profile buffer holds");
        } else {
            int64_t i = st->prof_n++;
            snprintf(st->prof_names + i * LP_NAME, LP_NAME, "%s", t->name);
            snprintf(st->prof_ops + i * LP_OP, LP_OP, "%s", ggml_op_desc(t));
            st->prof_cpu[i] = c - st->last_cpu;
            st->prof_wall[i] = w - st->last_wall;
        }
        st->last_cpu = lp_ns(CLOCK_THREAD_CPUTIME_ID); /* the recording itself is left out */
        st->last_wall = lp_ns(CLOCK_MONOTONIC);
        return true;
    }
    int lt = sm_layer(t->name, "ffn_moe_topk");
    if (ask) return lt >= 0;
    if (lt < 0 || st->out_ids == NULL) return true;
    char msg[SM_ERRLEN];
    if (sm_take_rows(t, lt, st->n_layer, GGML_TYPE_I32, st->top_k, 1, st->n, st->out_ids, st->fill_ids, msg))
        sm_fail(&st->failed, st->err, msg);
    return true;
}

const char * lp_version(void) { return "specmoe-pass-1"; }

/* kv: the KV cache's type (sm_context_params: 0 f16, 1 f32, 2 q8_0 keys); n_over float metadata
   overrides (llama.cpp's --override-kv KEY=float:VALUE); batch: n_batch = n_ubatch */
void * lp_open(const char * path, int n_ctx, int batch, int threads, int kv,
               int n_over, const char ** over_keys, const double * over_vals,
               char * err, int errlen) {
    lp_state * st = (lp_state *) calloc(1, sizeof(lp_state));
    st->model = sm_load_model(path, n_over, over_keys, over_vals, &st->n_layer, &st->top_k, &st->n_expert,
                              err, errlen);
    if (!st->model) {
        free(st);
        return NULL;
    }
    st->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(st->model));
    struct llama_context_params cp = sm_context_params(n_ctx, batch, threads, kv);
    st->cp = cp;
    cp.cb_eval = lp_callback;
    cp.cb_eval_user_data = st;
    st->ctx[0] = llama_init_from_model(st->model, cp);
    if (!st->ctx[0]) {
        snprintf(err, errlen, "llama.cpp could not make a context (%s)", sm_log_text());
        llama_model_free(st->model);
        free(st);
        return NULL;
    }
    st->n_ctx = (int) llama_n_ctx(st->ctx[0]);
    st->batch = batch;
    st->fill_ids = (int64_t *) calloc((size_t) st->n_layer, sizeof(int64_t));
    return st;
}

void lp_dims(void * h, int32_t * dims) {
    lp_state * st = (lp_state *) h;
    sm_dims(st->model, st->n_layer, st->top_k, st->n_expert, st->n_ctx, dims);
}

static struct llama_context * lp_ctx(lp_state * st, int slot, char * err, int errlen) {
    if (slot < 0 || slot > 1) {
        snprintf(err, errlen, "no context slot %d", slot);
        return NULL;
    }
    if (!st->ctx[slot]) { /* the scratch context: no eval callback */
        sm_log_last[0] = 0;
        st->ctx[slot] = llama_init_from_model(st->model, st->cp);
        if (!st->ctx[slot]) {
            snprintf(err, errlen, "llama.cpp could not make a context (%s)", sm_log_text());
            return NULL;
        }
    }
    return st->ctx[slot];
}

/* tokens in the sequence of a slot (its largest position + 1), -1 on a bad slot */
int lp_length(void * h, int slot) {
    lp_state * st = (lp_state *) h;
    char err[SM_ERRLEN];
    struct llama_context * ctx = lp_ctx(st, slot, err, SM_ERRLEN);
    if (!ctx) return -1;
    return (int) llama_memory_seq_pos_max(llama_get_memory(ctx), 0) + 1;
}

/* remove positions >= p; 0 on success */
int lp_crop(void * h, int slot, int p, char * err, int errlen) {
    lp_state * st = (lp_state *) h;
    struct llama_context * ctx = lp_ctx(st, slot, err, errlen);
    if (!ctx) return 2;
    if (p <= 0) {
        llama_memory_clear(llama_get_memory(ctx), true);
        return 0;
    }
    if (!llama_memory_seq_rm(llama_get_memory(ctx), 0, p, -1)) {
        snprintf(err, errlen, "llama_memory_seq_rm could not remove positions from %d", p);
        return 1;
    }
    return 0;
}

/* Decode tokens[0..n) at positions len..len+n-1 of a slot's sequence, in batches of st->batch.
   all_logits: every row is an output and argmax/margin [n] are filled (else only the last row
   of each batch is an output and argmax/margin are not written). mode: the callback's mode
   (slot 0 only): 1 fills out_ids [n, L, k] (-1 where a layer saw no node) and filled [L];
   2 fills up to prof_cap profile rows (prof_names [cap, 64], prof_ops [cap, 32], prof_cpu,
   prof_wall [cap] ns) and sets *prof_n. times [2]: thread CPU and wall ns of the decode calls.
   0 on success, 2 on bad input, 1 on a failure. */
int lp_decode(void * h, int slot, const int32_t * tokens, int n, int all_logits, int mode,
              int32_t * argmax, float * margin, int32_t * out_ids, int64_t * filled,
              int64_t prof_cap, char * prof_names, char * prof_ops, int64_t * prof_cpu,
              int64_t * prof_wall, int64_t * prof_n, int64_t * times, char * err, int errlen) {
    lp_state * st = (lp_state *) h;
    struct llama_context * ctx = lp_ctx(st, slot, err, errlen);
    if (!ctx) return 2;
    if (mode != 0 && slot != 0) {
        snprintf(err, errlen, "routing and profiles are recorded in slot 0 only");
        return 2;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    int pos = (int) llama_memory_seq_pos_max(mem, 0) + 1;
    if (n <= 0 || pos + n > st->n_ctx) {
        snprintf(err, errlen, "%d tokens after %d for a context of %d", n, pos, st->n_ctx);
        return 2;
    }
    if (sm_check_tokens(tokens, n, st->n_vocab, "row", err, errlen)) return 2;
    if (mode == 1) {
        for (int64_t i = 0; i < (int64_t) n * st->n_layer * st->top_k; i++) out_ids[i] = -1;
        memset(st->fill_ids, 0, sizeof(int64_t) * st->n_layer);
        st->n = n;
        st->out_ids = out_ids;
    }
    if (mode == 2) {
        st->prof_cap = prof_cap;
        st->prof_n = 0;
        st->prof_names = prof_names;
        st->prof_ops = prof_ops;
        st->prof_cpu = prof_cpu;
        st->prof_wall = prof_wall;
    }
    st->failed = 0;
    st->err[0] = 0;
    times[0] = times[1] = 0;
    struct llama_batch b = llama_batch_init(st->batch, 0, 1);
    int rc = 0;
    for (int start = 0; start < n && rc == 0; start += st->batch) {
        int m = n - start < st->batch ? n - start : st->batch;
        sm_fill_batch(&b, tokens + start, m, pos + start, all_logits);
        sm_log_last[0] = 0;
        if (slot == 0) st->mode = mode;
        int64_t c0 = lp_ns(CLOCK_THREAD_CPUTIME_ID), w0 = lp_ns(CLOCK_MONOTONIC);
        st->last_cpu = c0;
        st->last_wall = w0;
        int32_t r = llama_decode(ctx, b);
        llama_synchronize(ctx);
        int64_t c1 = lp_ns(CLOCK_THREAD_CPUTIME_ID), w1 = lp_ns(CLOCK_MONOTONIC);
        st->mode = 0;
        times[0] += c1 - c0;
        times[1] += w1 - w0;
        rc = sm_decode_status(r, "row", start, st->failed ? st->err : NULL, err, errlen);
        if (rc == 0 && all_logits) {
            for (int j = 0; j < m; j++) {
                const float * row = llama_get_logits_ith(ctx, j);
                if (!row) {
                    snprintf(err, errlen, "no logits for row %d", start + j);
                    rc = 1;
                    break;
                }
                int best = 0;
                float v1 = row[0], v2 = -INFINITY;
                for (int v = 1; v < st->n_vocab; v++) {
                    float x = row[v];
                    if (x > v1) {
                        v2 = v1;
                        v1 = x;
                        best = v;
                    } else if (x > v2) {
                        v2 = x;
                    }
                }
                argmax[start + j] = best;
                margin[start + j] = v1 - v2;
            }
        }
    }
    llama_batch_free(b);
    if (mode == 1) {
        for (int l = 0; l < st->n_layer; l++) filled[l] = st->fill_ids[l];
        st->n = 0;
        st->out_ids = NULL;
    }
    if (mode == 2) {
        *prof_n = st->prof_n;
        st->prof_names = st->prof_ops = NULL;
        st->prof_cpu = st->prof_wall = NULL;
        st->prof_cap = 0;
    }
    return rc;
}

/* a metadata value of the model as text ("<arch>." prefixed when key starts with a dot);
   its length, or -1 when absent */
int lp_meta(void * h, const char * key, char * buf, int buf_size) {
    return sm_meta(((lp_state *) h)->model, key, buf, buf_size);
}

void lp_close(void * h) {
    lp_state * st = (lp_state *) h;
    if (!st) return;
    for (int s = 0; s < 2; s++) if (st->ctx[s]) llama_free(st->ctx[s]);
    llama_model_free(st->model);
    free(st->fill_ids);
    free(st);
}
"""
)
