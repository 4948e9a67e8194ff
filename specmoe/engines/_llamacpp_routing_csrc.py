"""C source of the routing recorder against libllama (compiled by
:mod:`specmoe.engines.llamacpp_routing` on first use, against the llama.cpp build's headers).

Legend: ``n`` tokens of one sequence, ``L`` layers, ``k`` experts per token, ``E`` experts.

The recorder is llama.cpp's own eval callback (``llama_context_params.cb_eval``): asked about a
graph node, it says yes only for ``ffn_moe_topk-<l>`` (and ``ffn_moe_probs-<l>`` when the router
probabilities are wanted), so that the scheduler computes up to that node and hands it over;
handed one, it copies each token's row into the output at the next free position of layer l.
Ubatches are decoded in order and each layer's node holds the ubatch's tokens in order, so the
positions of a layer fill in the sequence's order. Every position asks for its logits, so the
last layer's MoE block (which llama.cpp runs on the output rows only) sees every token.
"""

from specmoe.engines._llamacpp_common_csrc import PRELUDE

SOURCE = (
    PRELUDE
    + r"""
typedef struct {
    struct llama_model * model;
    struct llama_context * ctx;
    int n_layer, top_k, n_expert, n_ctx, batch;
    /* one record call */
    int64_t n;           /* positions of the sequence */
    int32_t * out_ids;   /* [n, L, k] */
    float * out_probs;   /* [n, L, E] or NULL */
    int64_t * fill_ids;  /* [L] positions filled so far */
    int64_t * fill_probs;
    int failed;
    char err[SM_ERRLEN];
} rr_state;

static bool rr_callback(struct ggml_tensor * t, bool ask, void * user) {
    rr_state * st = (rr_state *) user;
    int lt = sm_layer(t->name, "ffn_moe_topk");
    int lp = st->out_probs ? sm_layer(t->name, "ffn_moe_probs") : -1;
    if (ask) return lt >= 0 || lp >= 0;
    if (st->n == 0) return true; /* a pass outside record (none is made) */
    char msg[SM_ERRLEN];
    if (lt >= 0 && sm_take_rows(t, lt, st->n_layer, GGML_TYPE_I32, st->top_k, 1, st->n, st->out_ids,
                                st->fill_ids, msg)) {
        sm_fail(&st->failed, st->err, msg);
        return true;
    }
    if (lp >= 0 && sm_take_rows(t, lp, st->n_layer, GGML_TYPE_F32, st->n_expert, 0, st->n, st->out_probs,
                                st->fill_probs, msg)) {
        sm_fail(&st->failed, st->err, msg);
        return true;
    }
    return true;
}

const char * rr_version(void) { return "specmoe-routing-1"; }

/* kv: the KV cache's type (sm_context_params: 0 f16, 1 f32, 2 q8_0 keys);
   n_over float metadata overrides, keys over_keys[i] and values over_vals[i] (llama.cpp's
   --override-kv KEY=float:VALUE) */
void * rr_open(const char * path, int n_ctx, int batch, int threads, int kv,
               int n_over, const char ** over_keys, const double * over_vals,
               char * err, int errlen) {
    rr_state * st = (rr_state *) calloc(1, sizeof(rr_state));
    st->model = sm_load_model(path, n_over, over_keys, over_vals, &st->n_layer, &st->top_k, &st->n_expert,
                              err, errlen);
    if (!st->model) {
        free(st);
        return NULL;
    }
    struct llama_context_params cp = sm_context_params(n_ctx, batch, threads, kv);
    cp.cb_eval = rr_callback;
    cp.cb_eval_user_data = st;
    st->ctx = llama_init_from_model(st->model, cp);
    if (!st->ctx) {
        snprintf(err, errlen, "llama.cpp could not make a context (%s)", sm_log_text());
        llama_model_free(st->model);
        free(st);
        return NULL;
    }
    st->n_ctx = (int) llama_n_ctx(st->ctx);
    st->batch = batch;
    st->fill_ids = (int64_t *) calloc((size_t) st->n_layer, sizeof(int64_t));
    st->fill_probs = (int64_t *) calloc((size_t) st->n_layer, sizeof(int64_t));
    return st;
}

void rr_dims(void * h, int32_t * dims) {
    rr_state * st = (rr_state *) h;
    sm_dims(st->model, st->n_layer, st->top_k, st->n_expert, st->n_ctx, dims);
}

/* Teacher-forced pass over tokens[0..n) at positions 0..n-1 on an empty cache, in batches of
   st->batch tokens. out_ids [n, L, k] (-1 where a layer saw no MoE node), out_probs [n, L, E]
   or NULL; filled [L] gets each layer's count of positions. 0 on success. */
int rr_record(void * h, const int32_t * tokens, int n, int32_t * out_ids, float * out_probs,
              int64_t * filled, char * err, int errlen) {
    rr_state * st = (rr_state *) h;
    if (n <= 0 || n > st->n_ctx) {
        snprintf(err, errlen, "%d tokens for a context of %d", n, st->n_ctx);
        return 2;
    }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(st->model));
    if (sm_check_tokens(tokens, n, n_vocab, "position", err, errlen)) return 2;
    for (int64_t i = 0; i < (int64_t) n * st->n_layer * st->top_k; i++) out_ids[i] = -1;
    memset(st->fill_ids, 0, sizeof(int64_t) * st->n_layer);
    memset(st->fill_probs, 0, sizeof(int64_t) * st->n_layer);
    st->n = n;
    st->out_ids = out_ids;
    st->out_probs = out_probs;
    st->failed = 0;
    st->err[0] = 0;
    llama_memory_clear(llama_get_memory(st->ctx), true);
    struct llama_batch b = llama_batch_init(st->batch, 0, 1);
    int rc = 0;
    for (int start = 0; start < n && rc == 0; start += st->batch) {
        int m = n - start < st->batch ? n - start : st->batch;
        /* every position is an output: the last layer's MoE sees them all */
        sm_fill_batch(&b, tokens + start, m, start, 1);
        sm_log_last[0] = 0;
        int32_t r = llama_decode(st->ctx, b);
        rc = sm_decode_status(r, "position", start, st->failed ? st->err : NULL, err, errlen);
    }
    llama_batch_free(b);
    for (int l = 0; l < st->n_layer; l++) filled[l] = st->fill_ids[l];
    if (rc == 0 && out_probs) {
        for (int l = 0; l < st->n_layer; l++) {
            if (st->fill_probs[l] != st->fill_ids[l]) {
                snprintf(err, errlen, "layer %d: %lld positions of probabilities, %lld of experts", l,
                         (long long) st->fill_probs[l], (long long) st->fill_ids[l]);
                rc = 1;
                break;
            }
        }
    }
    st->n = 0;
    st->out_ids = NULL;
    st->out_probs = NULL;
    return rc;
}

/* a metadata value of the model as text ("<arch>." prefixed when key starts with a dot);
   its length, or -1 when absent */
int rr_meta(void * h, const char * key, char * buf, int buf_size) {
    return sm_meta(((rr_state *) h)->model, key, buf, buf_size);
}

/* llama.cpp's tokens of text (no special tokens added; special tokens in the text parsed),
   at most n_max of them; the count, or minus the count needed when n_max is too small. */
int rr_tokenize(void * h, const char * text, int text_len, int32_t * out, int n_max) {
    rr_state * st = (rr_state *) h;
    return llama_tokenize(llama_model_get_vocab(st->model), text, text_len, out, n_max, false, true);
}

void rr_close(void * h) {
    rr_state * st = (rr_state *) h;
    if (!st) return;
    llama_free(st->ctx);
    llama_model_free(st->model);
    free(st->fill_ids);
    free(st->fill_probs);
    free(st);
}
"""
)
