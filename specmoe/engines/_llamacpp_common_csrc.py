"""C prelude shared by the shims against libllama (:mod:`specmoe.engines._llamacpp_pass_csrc`,
:mod:`specmoe.engines._llamacpp_routing_csrc`): each shim's ``SOURCE`` starts with
:data:`PRELUDE`.

It holds the log callback (llama.cpp's last error or warning line kept for error messages; the
whole log on stderr when ``SPECMOE_LLAMACPP_VERBOSE`` is set), the parser of node names
``<prefix>-<layer>``, the copy of a per-layer node's rows into a ``[n, L, width]`` output at
the next free positions of its layer, the opening of a GGUF model (float metadata overrides,
the MoE dimensions), the context parameters both shims use (CPU only, flash attention off,
one sequence, ``n_batch = n_ubatch``), the token check, the batch of one sequence and a
batch's error message.
"""

PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#define SM_ERRLEN 512

static char sm_log_last[SM_ERRLEN];

static void sm_log(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        size_t n = strlen(text);
        if (n >= SM_ERRLEN) n = SM_ERRLEN - 1;
        memcpy(sm_log_last, text, n);
        sm_log_last[n] = 0;
        while (n > 0 && (sm_log_last[n - 1] == '\n' || sm_log_last[n - 1] == '\r')) sm_log_last[--n] = 0;
    }
    if (getenv("SPECMOE_LLAMACPP_VERBOSE")) fputs(text, stderr);
}

/* llama.cpp's last error or warning line since sm_log_last was cleared */
static const char * sm_log_text(void) { return sm_log_last[0] ? sm_log_last : "no message"; }

/* the layer of a node named exactly "<prefix>-<layer>", else -1 */
static int sm_layer(const char * name, const char * prefix) {
    size_t p = strlen(prefix);
    if (strncmp(name, prefix, p) != 0 || name[p] != '-') return -1;
    const char * s = name + p + 1;
    if (*s < '0' || *s > '9') return -1;
    char * end = NULL;
    long l = strtol(s, &end, 10);
    if (*end != 0) return -1;
    return (int) l;
}

/* the first failure of a pass kept: *failed set and msg copied into err [SM_ERRLEN] */
static void sm_fail(int * failed, char * err, const char * msg) {
    if (!*failed) {
        *failed = 1;
        snprintf(err, SM_ERRLEN, "%s", msg);
    }
}

/* Node t of layer l, [width, rows] of ggml type `type` (i32 or f32), copied row by row into
   out [n, n_layer, width] at positions fill[l].. of layer l. 0, or 1 with msg [SM_ERRLEN] set
   (layers: the message names the count of layers). */
static int sm_take_rows(struct ggml_tensor * t, int l, int n_layer, enum ggml_type type, int width,
                        int layers, int64_t n, void * out, int64_t * fill, char * msg) {
    if (l >= n_layer || t->type != type || t->ne[0] != width) {
        int k = snprintf(msg, SM_ERRLEN, "%s: type %d shape [%lld, %lld], expected %s [%d, n]", t->name,
                         (int) t->type, (long long) t->ne[0], (long long) t->ne[1],
                         type == GGML_TYPE_I32 ? "i32" : "f32", width);
        if (layers && k >= 0 && k < SM_ERRLEN) snprintf(msg + k, SM_ERRLEN - k, " of %d layers", n_layer);
        return 1;
    }
    int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (fill[l] + rows > n) {
        snprintf(msg, SM_ERRLEN, "%s: more positions than the %lld tokens given", t->name, (long long) n);
        return 1;
    }
    size_t es = type == GGML_TYPE_I32 ? sizeof(int32_t) : sizeof(float);
    for (int64_t j = 0; j < rows; j++) {
        char * dst = (char *) out + (size_t) ((fill[l] + j) * n_layer + l) * width * es;
        ggml_backend_tensor_get(t, dst, (size_t) j * t->nb[1], (size_t) width * es);
    }
    fill[l] += rows;
    return 0;
}

static int sm_meta_int(struct llama_model * m, const char * arch, const char * key) {
    char k[256], v[64];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (llama_model_meta_val_str(m, k, v, sizeof v) < 0) return -1;
    return atoi(v);
}

/* The model at path on the CPU, with n_over float metadata overrides (keys over_keys[i],
   values over_vals[i]: llama.cpp's --override-kv KEY=float:VALUE), and its layers, experts per
   token and experts; NULL with err set when it does not load or is not a mixture of experts. */
static struct llama_model * sm_load_model(const char * path, int n_over, const char ** over_keys,
                                          const double * over_vals, int * n_layer, int * top_k,
                                          int * n_expert, char * err, int errlen) {
    static int backend_ready = 0;
    llama_log_set(sm_log, NULL);
    if (!backend_ready) {
        llama_backend_init();
        backend_ready = 1;
    }
    sm_log_last[0] = 0;
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model_kv_override * over = NULL;
    if (n_over > 0) {
        over = (struct llama_model_kv_override *) calloc((size_t) n_over + 1, sizeof *over);
        for (int i = 0; i < n_over; i++) {
            over[i].tag = LLAMA_KV_OVERRIDE_TYPE_FLOAT;
            snprintf(over[i].key, sizeof over[i].key, "%s", over_keys[i]);
            over[i].val_f64 = over_vals[i];
        }
        over[n_over].key[0] = 0;
        mp.kv_overrides = over;
    }
    struct llama_model * model = llama_model_load_from_file(path, mp);
    free(over);
    if (!model) {
        snprintf(err, errlen, "llama.cpp could not load it (%s)", sm_log_text());
        return NULL;
    }
    char arch[128];
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0) arch[0] = 0;
    *n_layer = llama_model_n_layer(model);
    *top_k = sm_meta_int(model, arch, "expert_used_count");
    *n_expert = sm_meta_int(model, arch, "expert_count");
    if (*top_k <= 0 || *n_expert <= 0) {
        snprintf(err, errlen, "not a mixture-of-experts model (architecture %s has no %s.expert_count)", arch, arch);
        llama_model_free(model);
        return NULL;
    }
    return model;
}

/* one sequence of n_ctx tokens, n_batch = n_ubatch = batch, flash attention off, the KV cache
   in kv: 0 llama.cpp's default float16, 1 float32, 2 keys in q8_0 and values in float16
   (llama.cpp quantizes V only with flash attention), no performance counters */
static struct llama_context_params sm_context_params(int n_ctx, int batch, int threads, int kv) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) n_ctx;
    cp.n_batch = (uint32_t) batch;
    cp.n_ubatch = (uint32_t) batch;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if (kv == 1) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
    } else if (kv == 2) {
        cp.type_k = GGML_TYPE_Q8_0;
    }
    cp.no_perf = true;
    return cp;
}

/* dims [5]: layers, experts per token, experts, context, vocabulary */
static void sm_dims(struct llama_model * model, int n_layer, int top_k, int n_expert, int n_ctx, int32_t * dims) {
    dims[0] = n_layer;
    dims[1] = top_k;
    dims[2] = n_expert;
    dims[3] = n_ctx;
    dims[4] = llama_vocab_n_tokens(llama_model_get_vocab(model));
}

/* 0 when tokens[0..n) are all in a vocabulary of n_vocab, else 2 with err naming the first
   outside it by its `unit` ("position", "row") */
static int sm_check_tokens(const int32_t * tokens, int n, int n_vocab, const char * unit, char * err, int errlen) {
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            snprintf(err, errlen, "token %d at %s %d is outside the vocabulary of %d", tokens[i], unit, i, n_vocab);
            return 2;
        }
    }
    return 0;
}

/* b: tokens[0..m) at positions pos..pos+m-1 of sequence 0, row j an output when all_logits or
   j is the last */
static void sm_fill_batch(struct llama_batch * b, const int32_t * tokens, int m, int pos, int all_logits) {
    b->n_tokens = m;
    for (int j = 0; j < m; j++) {
        b->token[j] = tokens[j];
        b->pos[j] = pos + j;
        b->n_seq_id[j] = 1;
        b->seq_id[j][0] = 0;
        b->logits[j] = all_logits || j == m - 1;
    }
}

/* a batch's outcome: 0, or 1 with err set from llama_decode's result r (the batch starting at
   `unit` start) or from the eval callback's message cb_err (NULL when it did not fail) */
static int sm_decode_status(int32_t r, const char * unit, int start, const char * cb_err, char * err, int errlen) {
    if (r != 0) {
        snprintf(err, errlen, "llama_decode returned %d at %s %d (%s)", r, unit, start, sm_log_text());
        return 1;
    }
    if (cb_err) {
        snprintf(err, errlen, "%s", cb_err);
        return 1;
    }
    return 0;
}

/* a metadata value of the model as text ("<arch>." prefixed when key starts with a dot);
   its length, or -1 when absent */
static int sm_meta(struct llama_model * model, const char * key, char * buf, int buf_size) {
    char full[256];
    if (key[0] == '.') {
        char arch[128];
        if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0) return -1;
        snprintf(full, sizeof full, "%s%s", arch, key);
    } else {
        snprintf(full, sizeof full, "%s", key);
    }
    return llama_model_meta_val_str(model, full, buf, (size_t) buf_size);
}
"""
