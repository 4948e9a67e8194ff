"""C source of the ggml MUL_MAT_ID harness (compiled by :mod:`specmoe.engines.ggml_mmid` on
first use, against the llama.cpp build's ggml headers and libraries).

The graph is llama.cpp's ``build_moe_ffn`` for a SwiGLU MoE layer without biases: three
``ggml_mul_mat_id`` (gate, up, down), ``ggml_swiglu_split``, the routing weights and the sum over
slots, on ggml's CPU compute (``ggml_graph_plan`` / ``ggml_graph_compute`` with a threadpool).
"""

SOURCE = r"""
// One MoE layer's expert FFN through ggml's own CPU MUL_MAT_ID, at any shapes.
//
// Legend: E experts, d hidden, m expert width, k slots per token (top-k), n tokens.
// Weights are the caller's memory (zero copy), one row per output feature:
//   gate, up [E, m, d]  (row stride, expert stride in bytes: views of a concatenated gate_up)
//   down     [E, d, m]
// in f32, bf16 or q8_0 (ggml's layout: 34 bytes per 32 weights). The graph is llama.cpp's
// build_moe_ffn for a SwiGLU MoE without biases:
//   g = MUL_MAT_ID(gate, x, ids); u = MUL_MAT_ID(up, x, ids)      # [m, k, n]
//   a = swiglu_split(g, u)                                         # silu(g) * u
//   o = MUL_MAT_ID(down, a, ids) * weights                         # [d, k, n]
//   y = sum over the k slots of o                                  # [d, n]
// Modes: 0 the whole FFN (output y [n, d]); 1 the gate MUL_MAT_ID alone, 2 up alone (input x,
// output [n, k, m]); 3 down alone (input a [n, k, m], output [n, k, d]).
// Nothing here checks ids: the caller does (ggml indexes weights with them unchecked).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

typedef struct {
    struct ggml_context *ctx, *wctx;  // wctx: the weights' headers only (no data)
    struct ggml_cgraph *graph;
    struct ggml_tensor *in, *ids, *wts, *out;
    struct ggml_threadpool *tp;
    struct ggml_cplan plan;
    uint8_t *work;
    int mode;
} smm_t;

int smm_version(void) { return 1; }

int smm_type_id(const char *name) {
    if (!strcmp(name, "f32")) return GGML_TYPE_F32;
    if (!strcmp(name, "bf16")) return GGML_TYPE_BF16;
    if (!strcmp(name, "q8_0")) return GGML_TYPE_Q8_0;
    return -1;
}

long long smm_row_size(int type, long long ncols) { return (long long)ggml_row_size(type, ncols); }

// q8_0 (or any type ggml quantizes) rows of f32 src into dst; returns bytes written.
long long smm_quantize(int type, const float *src, void *dst, long long nrows, long long ncols) {
    return (long long)ggml_quantize_chunk(type, src, dst, 0, nrows, ncols, NULL);
}

// ggml's own dequantization back to f32 (the q8_0 values ggml multiplies with).
void smm_dequantize(int type, const void *src, float *dst, long long n) {
    const struct ggml_type_traits *t = ggml_get_type_traits(type);
    t->to_float(src, dst, n);
}

static struct ggml_tensor *weight(struct ggml_context *ctx, int type, int cols, int rows, int E,
                                  void *data, long long nb1, long long nb2) {
    struct ggml_tensor *w = ggml_new_tensor_3d(ctx, type, cols, rows, E);
    w->nb[1] = (size_t)nb1;
    w->nb[2] = (size_t)nb2;
    w->nb[3] = (size_t)nb2 * E;
    w->data = data;
    return w;
}

void smm_free(smm_t *s) {
    if (!s) return;
    if (s->tp) ggml_threadpool_free(s->tp);
    if (s->ctx) ggml_free(s->ctx);
    if (s->wctx) ggml_free(s->wctx);
    free(s->work);
    free(s);
}

smm_t *smm_new(int type, int E, int d, int m, int k, int n, int threads, int mode,
               void *gate, long long gate_nb1, long long gate_nb2,
               void *up, long long up_nb1, long long up_nb2,
               void *down, long long down_nb1, long long down_nb2) {
    static int inited = 0;
    if (!inited) { ggml_cpu_init(); inited = 1; }
    smm_t *s = calloc(1, sizeof(smm_t));
    if (!s) return NULL;
    s->mode = mode;
    size_t tensors = 64 + 4 * (size_t)k;
    size_t data = 4 * ((size_t)d * n + (size_t)k * n * 2 + (size_t)m * k * n * 3 +
                       (size_t)d * k * n * 2 + (size_t)d * n * (k + 1)) + 4096 * tensors;
    struct ggml_init_params ip = {tensors * ggml_tensor_overhead() + ggml_graph_overhead() + data,
                                  NULL, false};
    s->ctx = ggml_init(ip);
    if (!s->ctx) { smm_free(s); return NULL; }
    struct ggml_init_params wp = {8 * ggml_tensor_overhead(), NULL, true};
    s->wctx = ggml_init(wp);
    if (!s->wctx) { smm_free(s); return NULL; }
    struct ggml_context *c = s->ctx, *wc = s->wctx;
    s->ids = ggml_new_tensor_2d(c, GGML_TYPE_I32, k, n);
    struct ggml_tensor *y;
    if (mode == 3) {
        s->in = ggml_new_tensor_3d(c, GGML_TYPE_F32, m, k, n);
        y = ggml_mul_mat_id(c, weight(wc, type, m, d, E, down, down_nb1, down_nb2), s->in, s->ids);
    } else {
        s->in = ggml_new_tensor_3d(c, GGML_TYPE_F32, d, 1, n);
        struct ggml_tensor *wg = weight(wc, type, d, m, E, gate, gate_nb1, gate_nb2);
        struct ggml_tensor *wu = weight(wc, type, d, m, E, up, up_nb1, up_nb2);
        if (mode == 1) {
            y = ggml_mul_mat_id(c, wg, s->in, s->ids);
        } else if (mode == 2) {
            y = ggml_mul_mat_id(c, wu, s->in, s->ids);
        } else {
            struct ggml_tensor *g = ggml_mul_mat_id(c, wg, s->in, s->ids);
            struct ggml_tensor *u = ggml_mul_mat_id(c, wu, s->in, s->ids);
            struct ggml_tensor *a = ggml_swiglu_split(c, g, u);
            struct ggml_tensor *wd = weight(wc, type, m, d, E, down, down_nb1, down_nb2);
            struct ggml_tensor *o = ggml_mul_mat_id(c, wd, a, s->ids);  // [d, k, n]
            s->wts = ggml_new_tensor_3d(c, GGML_TYPE_F32, 1, k, n);
            o = ggml_mul(c, o, s->wts);
            y = ggml_view_2d(c, o, d, n, o->nb[2], 0);
            for (int j = 1; j < k; j++)
                y = ggml_add(c, y, ggml_view_2d(c, o, d, n, o->nb[2], j * o->nb[1]));
            if (k == 1) y = ggml_cont(c, y);
        }
    }
    s->out = y;
    s->graph = ggml_new_graph(c);
    ggml_build_forward_expand(s->graph, y);
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    s->tp = ggml_threadpool_new(&tpp);
    s->plan = ggml_graph_plan(s->graph, threads, s->tp);
    if (s->plan.work_size) {
        s->work = malloc(s->plan.work_size);
        if (!s->work) { smm_free(s); return NULL; }
        s->plan.work_data = s->work;
    }
    return s;
}

static double now(int clock) {
    struct timespec ts;
    clock_gettime(clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Copy the inputs in, compute the graph, copy the output out; the seconds ggml_graph_compute
// took on the given clock (0 wall, 1 the calling thread's CPU time), or -1 on failure.
double smm_run(smm_t *s, const float *in, const int32_t *ids, const float *wts, float *out,
               int clock) {
    memcpy(s->in->data, in, ggml_nbytes(s->in));
    memcpy(s->ids->data, ids, ggml_nbytes(s->ids));
    if (s->wts) memcpy(s->wts->data, wts, ggml_nbytes(s->wts));
    double t0 = now(clock);
    enum ggml_status st = ggml_graph_compute(s->graph, &s->plan);
    double t = now(clock) - t0;
    if (st != GGML_STATUS_SUCCESS) return -1.0;
    if (out) memcpy(out, s->out->data, ggml_nbytes(s->out));
    return t;
}

// ggml's own vec_dot for a type (its CPU type traits), on `rows` weight rows of `cols` against
// `tokens` activation rows converted to the vec_dot type, every token against every row, in the
// order ggml's MUL_MAT_ID block takes them (token outer, row inner); `reps` sweeps after one
// warm sweep. Returns ns per (row, token) vec_dot on the calling thread's CPU clock.
double smm_vec_dot_ns(int type, int rows, int cols, int tokens, int reps) {
    static int inited = 0;
    if (!inited) { ggml_cpu_init(); inited = 1; }
    const struct ggml_type_traits_cpu *tc = ggml_get_type_traits_cpu(type);
    enum ggml_type vt = tc->vec_dot_type;
    size_t rs = ggml_row_size(type, cols), vs = ggml_row_size(vt, cols);
    float *f = malloc(sizeof(float) * (size_t)cols * (rows > tokens ? rows : tokens));
    char *w = malloc(rs * rows + 64), *x = malloc(vs * tokens + 64);
    if (!f || !w || !x) { free(f); free(w); free(x); return -1.0; }
    uint32_t z = 12345;
    for (size_t i = 0; i < (size_t)cols * (rows > tokens ? rows : tokens); i++) {
        z = z * 1664525u + 1013904223u;
        f[i] = ((z >> 8) / 16777216.0f - 0.5f) * 0.05f;
    }
    ggml_quantize_chunk(type, f, w, 0, rows, cols, NULL);
    for (int t = 0; t < tokens; t++) ggml_get_type_traits_cpu(vt)->from_float(f + (size_t)t * cols, x + t * vs, cols);
    volatile float sink = 0;
    float s;
    double t0 = 0;
    for (int it = 0; it <= reps; it++) {
        if (it == 1) t0 = now(1);
        for (int t = 0; t < tokens; t++)
            for (int r = 0; r < rows; r++) {
                tc->vec_dot(cols, &s, 0, w + r * rs, 0, x + t * vs, 0, 1);
                sink += s;
            }
    }
    double dt = now(1) - t0;
    free(f); free(w); free(x);
    return 1e9 * dt / ((double)reps * rows * tokens);
}

// Read n floats (the cache flush between timed calls); returns their sum so it is not elided.
double smm_read(const float *buf, long long n) {
    double acc = 0;
    for (long long i = 0; i < n; i += 16) acc += buf[i];
    return acc;
}
"""
