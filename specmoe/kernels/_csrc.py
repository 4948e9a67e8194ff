"""C source of the CPU expert kernels (compiled on first use by :mod:`specmoe.kernels._cbuild`).

One routine, ``specmoe_expert_op``, runs both CPU kernels; they differ only in how the nm slots
of a pass are grouped before the weights are streamed:

* per-slot: nm groups of one slot each, in token-major slot order; each group streams its
  expert's weights once (a GEMV), so an expert named by r slots is requested r times (E_slot,
  paper 002 Section 1).
* dedup: one group per distinct expert, holding every slot that names it; the expert's weights
  are streamed once and each weight row is applied to all of the group's tokens while it is in
  registers and L1 (E_dedup = U·b). This is the fused loop over expert weights that paper 002
  cites from MonoMoE for small passes.

Both read the weights in place through the caller's pointers and strides (a view: no gather
copy). Work is split across OpenMP threads by output rows, so every output element has one
writer and is summed in one fixed order: the result is bitwise the same for every thread count.
Experts under 1 MiB run on one thread: a barrier per group would cost more than it saves.

Weights may be float32 (code 0), bfloat16 (1) or float16 (2); accumulation and the output are
float32. bfloat16 weights on a core with AVX-512 BF16 (built with ``-march=native`` there) take
a dot-product path: x and the intermediate activation are rounded to bfloat16 once per call
(x exactly: it is bfloat16 under the contract), and ``vdpbf16ps`` multiplies 32 weights read
straight from memory by 32 activations per instruction, fp32 accumulation, register blocks of
up to 4 rows by 9 tokens (``specmoe_set_bf16dp(0)`` turns it off, for tests). Otherwise
activations are float32 and AVX2+FMA register blocks (rows x tokens: 4x1, 4x2, 4x3, 3x4, then 2x3
to 2x6) load each weight vector once for all of a group's tokens and prefetch the next block's
rows while they compute, so the memory stream overlaps the FMAs; activation rows are copied to
64-byte-aligned buffers so that no vector load splits a cache line. A portable loop
(auto-vectorised by the compiler) covers other machines and the tails.

Why not ``F.linear`` on each group's rows (``dedup_torch``): on the CPUs measured, a matrix
product of 2 to 8 rows by one expert moves far fewer bytes per second than a one-row product
(``benchmarks/kernel_roofline.py`` prints both), which is the slow deduplicating kernel paper
002 describes; this loop keeps the one-row bandwidth for up to about four tokens per expert.
"""

SOURCE = r"""
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SM_AVX2 1
#else
#define SM_AVX2 0
#endif

/* bfloat16 weights on a core with AVX-512 BF16: vdpbf16ps multiplies 32 bf16 weights by 32
   bf16 activations per instruction and accumulates pairs in fp32, so the weights are never
   widened (the AVX2 path spends a shift and a widening per 8 weights). The activations are
   rounded to bf16 once per call (x is bf16 already under the contract: exact; the
   intermediate activation is rounded, as transformers' bf16 experts do). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define SM_BF16DP 1
#else
#define SM_BF16DP 0
#endif
static int sm_bf16dp_on = 1;  /* runtime switch (specmoe_set_bf16dp), e.g. to test the fallback */
static int sm_f32z_on = 1;  /* runtime switch (specmoe_set_f32z): the AVX-512F fp32 path */
static int sm_q8_portable_on = 0;
static int sm_q8_mode = 0;  /* q8_0: 0 fp32 activations (dequantised weights), 1 int16 activations */  /* runtime switch (specmoe_set_q8_portable): the portable q8_0 loop */

#define WT_F32 0
#define WT_BF16 1
#define WT_F16 2
#define WT_Q8 3      /* llama.cpp's q8_0: blocks of one fp16 scale d and 32 int8 q, w = d * q */
#define SM_Q8_BLOCK 34
#define SM_MIN_PARALLEL_BYTES (1 << 20)

static inline float sm_bf16_to_f32(uint16_t v) {
    uint32_t u = ((uint32_t)v) << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline float sm_f16_to_f32(uint16_t hv) {
    uint32_t s = (uint32_t)(hv & 0x8000u) << 16, e = (hv >> 10) & 0x1fu, m = hv & 0x3ffu, u;
    if (e == 0) {
        if (m == 0) { u = s; }
        else { e = 127 - 15 + 1; while (!(m & 0x400u)) { m <<= 1; e--; } m &= 0x3ffu;
               u = s | (e << 23) | (m << 13); }
    } else if (e == 31) { u = s | 0x7f800000u | (m << 13); }
    else { u = s | ((e + 127 - 15) << 23) | (m << 13); }
    float f; memcpy(&f, &u, 4); return f;
}
static inline float sm_load1(const void *w, int wt, size_t i) {
    if (wt == WT_F32) return ((const float *)w)[i];
    if (wt == WT_BF16) return sm_bf16_to_f32(((const uint16_t *)w)[i]);
    return sm_f16_to_f32(((const uint16_t *)w)[i]);
}

/* Scalar dot of one weight row with one activation row (tails and other machines). */
static float sm_dot1(const void *w, int wt, const float *x, int c0, int cols) {
    float s = 0.0f;
    if (wt == WT_F32) {
        const float *wf = (const float *)w;
#ifdef _OPENMP
        #pragma omp simd reduction(+:s)
#endif
        for (int c = c0; c < cols; c++) s += wf[c] * x[c];
    }
    else { for (int c = c0; c < cols; c++) s += sm_load1(w, wt, (size_t)c) * x[c]; }
    return s;
}

#if SM_AVX2
static inline __m256 sm_load8(const void *w, int wt, size_t i) {
    if (wt == WT_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i hv = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (wt == WT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hv), 16));
#ifdef __F16C__
    return _mm256_cvtph_ps(hv);
#else
    float t[8]; for (int j = 0; j < 8; j++) t[j] = sm_load1(w, wt, i + j);
    return _mm256_loadu_ps(t);
#endif
}
static inline float sm_hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}
/* A register block: RB weight rows rs rows apart (row stride ldw elements) times TB
   activation rows xp[t]: out[t * ldo + r * rs] = sum_c W[r * rs, c] * xp[t][c]. Each weight
   vector is loaded once and applied to all TB rows; the weights stream from memory once per
   block of rows. While a block is computed, the next block's rows are prefetched (rs > 1: the
   row after each of the block's rows; rs = 1: the RB rows after the block), so the memory
   stream overlaps the FMAs (a single core otherwise serialises the two once TB >= 3). */
#ifndef SM_PF_HINT
#define SM_PF_HINT _MM_HINT_T0
#endif
#define SM_STEP(RB, TB, cc)                                                                 \
    {                                                                                       \
        __m256 wv[RB];                                                                      \
        for (int r = 0; r < RB; r++) wv[r] = sm_load8(w, wt, (size_t)r * ldw + (cc));       \
        for (int t = 0; t < TB; t++) {                                                      \
            __m256 xv = _mm256_loadu_ps(xp[t] + (cc));                                      \
            for (int r = 0; r < RB; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]); \
        }                                                                                   \
    }
#define SM_BLOCK(RB, TB)                                                                    \
static inline __attribute__((always_inline)) void sm_block_##RB##x##TB(                     \
        const void *w, int wt, size_t ldw0, const float *const *xp, int cols, float *out,   \
        size_t ldo, size_t rs) {                                                            \
    __m256 acc[RB][TB];                                                                     \
    size_t es = (wt == WT_F32) ? 4 : 2, ldw = ldw0 * rs;                                    \
    const char *pf = (const char *)w + (rs > 1 ? 1 : (size_t)RB) * ldw0 * es;               \
    int c8 = cols & ~7;                                                                     \
    for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++) acc[r][t] = _mm256_setzero_ps(); \
    for (int c = 0; c < c8; c += 8) {                                                       \
        if (!(c & 15))                                                                      \
            for (int r = 0; r < RB; r++)                                                    \
                _mm_prefetch(pf + ((size_t)r * ldw + c) * es, SM_PF_HINT);                  \
        SM_STEP(RB, TB, c)                                                                  \
    }                                                                                       \
    for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++)                               \
        out[(size_t)t * ldo + r * rs] = sm_hsum(acc[r][t])                                  \
            + sm_dot1((const char *)w + (size_t)r * ldw * es, wt, xp[t], c8, cols);         \
}
SM_BLOCK(4, 1)
SM_BLOCK(4, 2)
SM_BLOCK(4, 3)
SM_BLOCK(3, 4)
SM_BLOCK(2, 1)
SM_BLOCK(2, 2)
SM_BLOCK(2, 3)
SM_BLOCK(2, 4)
SM_BLOCK(2, 5)
SM_BLOCK(2, 6)
SM_BLOCK(1, 1)
SM_BLOCK(1, 4)
#endif

static inline uint16_t sm_f32_to_bf16(float f) {  /* round to nearest even; NaN stays NaN */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* the blocks of RB far-apart rows of [r, r1) (sm_rows_impl says why): the statement after
   RB, with the block's first row rr and row spacing q; r moves past the rows they cover */
#define SM_FAR(RB, ...)                                                                     \
    {                                                                                       \
        size_t q = (size_t)(r1 - r) / (RB);                                                 \
        for (size_t i = 0; i < q; i++) {                                                    \
            int rr = r + (int)i;                                                            \
            __VA_ARGS__;                                                                    \
        }                                                                                   \
        r += (int)q * (RB);                                                                 \
    }

/* one case of a switch over a token block's size: PFX_<RB>x<T>(args) */
#define SM_TB_CASE(PFX, RB, T, ...) case T: PFX##_##RB##x##T(__VA_ARGS__); break;
#define SM_TB_1TO5(PFX, RB, ...)                                                            \
    SM_TB_CASE(PFX, RB, 1, __VA_ARGS__) SM_TB_CASE(PFX, RB, 2, __VA_ARGS__)                 \
    SM_TB_CASE(PFX, RB, 3, __VA_ARGS__) SM_TB_CASE(PFX, RB, 4, __VA_ARGS__)                 \
    SM_TB_CASE(PFX, RB, 5, __VA_ARGS__)

#ifndef SM_ZFAR
#define SM_ZFAR 0
#endif
#ifndef SM_ZFAR_PFB
#define SM_ZFAR_PFB 8192  /* far rows: prefetch the row at least this many bytes ahead in each stream */
#endif
#ifndef SM_PF1
#define SM_PF1 1  /* 0: the AVX-512 blocks of one token do not prefetch (the
                     hardware's prefetchers alone: 7-11% faster on a Zen 5 core, where the
                     blocks of 2 or more tokens still gain from it: results/cpu/kernels/
                     ab-2026-12-04-zen5/) */
#endif
#ifndef SM_PFHEAD
#define SM_PFHEAD 0  /* > 0: a block that does not prefetch as it goes (SM_PF1=0) asks, as it
                        starts, for the first SM_PFHEAD lines of each row of the next block: a
                        bf16 row of 2048 weights is one 4 KiB page, which the hardware's
                        prefetchers do not cross, so each row's stream starts cold without it
                        (one line: 7-11% faster on a Zen 5 core, results/cpu/kernels/
                        ab-2026-12-04-zen5/) */
#endif
/* AVX-512 blocks of 1-4 tokens with SM_ZFAR: as many far-apart rows as 32 registers hold */
#ifndef SM_FAR34
#define SM_FAR34 4  /* far-apart rows of the blocks of 3 and 4 tokens: 4 or 6. GCC 12 keeps
                       part of the 6x4 block's accumulators on the stack (about 35 stack loads
                       and stores a step; 4x3 and 4x4 have 0-2). On a Zen 4 core, groups of 3
                       and 4 tokens: 4 rows 5-6% faster in fp32, in bf16 7% faster at 3 and 6%
                       slower at 4 (results/cpu/kernels/ab-2026-12-07-zen4-tree-vact/) */
#endif
#ifndef SM_FAR2
#define SM_FAR2 8  /* far-apart rows of the blocks of 2 tokens: 8 or 4 (4x2: 8 accumulators) */
#endif
static inline int sm_far_rb(int tb) { return tb == 1 ? 8 : (tb == 2 ? SM_FAR2 : (tb <= 4 ? SM_FAR34 : 0)); }
/* AVX-512 blocks (bf16 and fp32), rows per block of tb tokens: as many as the 32 vector
   registers hold (RB * TB accumulators + RB weight vectors + one activation vector). */
#ifndef SM_DP_RB24
#define SM_DP_RB24 4  /* rows per block of 2-4 tokens: 2, 3 or 4 (results/cpu/kernels/) */
#endif
static inline int sm_dp_rb(int tb) {
    if (tb == 1) return 4;
    if (tb <= 4) return SM_DP_RB24;
    if (tb <= 7) return 3;
    return 2;
}
/* The rows [r0, r1) of W times tokens [0, k) on AVX-512 register blocks of weight type T
   (PFX##_RBxTB, dispatched by CALL; RB1 rows for one token without far rows): tokens in
   blocks of at most 9 (as even as possible); 1-4 tokens on far-apart rows with SM_ZFAR
   (sm_far_rb), else rows in blocks of sm_dp_rb(tb); leftover rows one at a time. Each
   adjacent block prefetches the rows pfr rows after its own (0: its own row count, the
   next block's rows). */
#define SM_ROWS_PASS(NAME, T, PFX, CALL, RB1)                                           \
static void NAME(const T *w, size_t ldw, int r0, int r1, const T *const *xp, int k,     \
                 int cols, float *out, size_t ldo, size_t pfr) {                        \
    int nb = (k + 8) / 9;                                                               \
    for (int b = 0, t = 0; b < nb; b++) {                                               \
        int tb = k / nb + (b < k % nb);                                                 \
        int rb = tb == 1 ? RB1 : sm_dp_rb(tb);                                          \
        const T *const *xt = xp + t;                                                    \
        int r = r0;                                                                     \
        int fr = SM_ZFAR && !pfr ? sm_far_rb(tb) : 0;                                   \
        if (fr) {  /* fr far-apart rows: fr streams, each prefetching a row SM_ZFAR_PFB ahead */\
            size_t q = (size_t)(r1 - r) / (size_t)fr;                                   \
            size_t pfo = (SM_ZFAR_PFB + ldw * sizeof(*w) - 1) / (ldw * sizeof(*w)) * ldw;\
            for (size_t i = 0; i < q; i++) {                                            \
                const T *wr = w + (size_t)(r + (int)i) * ldw;                           \
                float *o = out + (size_t)t * ldo + r + (int)i;                          \
                if (tb == 1) PFX##_8x1(wr, ldw * q, xt, cols, o, ldo, pfo, q);          \
                else if (tb == 2 && fr == 4) PFX##_4x2(wr, ldw * q, xt, cols, o, ldo, pfo, q); \
                else if (tb == 2) PFX##_8x2(wr, ldw * q, xt, cols, o, ldo, pfo, q);     \
                else if (fr == 6 && tb == 3) PFX##_6x3(wr, ldw * q, xt, cols, o, ldo, pfo, q); \
                else if (fr == 6) PFX##_6x4(wr, ldw * q, xt, cols, o, ldo, pfo, q);     \
                else if (tb == 3) PFX##_4x3(wr, ldw * q, xt, cols, o, ldo, pfo, q);     \
                else PFX##_4x4(wr, ldw * q, xt, cols, o, ldo, pfo, q);                  \
            }                                                                           \
            r += (int)q * fr;                                                           \
        }                                                                               \
        for (; r + rb <= r1; r += rb) {                                                 \
            const T *wr = w + (size_t)r * ldw;                                          \
            float *o = out + (size_t)t * ldo + r;                                       \
            size_t po = (pfr ? pfr : (size_t)rb) * ldw;                                 \
            if (rb == 8) PFX##_8x1(wr, ldw, xt, cols, o, ldo, po, 1);                   \
            else if (rb == 6) PFX##_6x1(wr, ldw, xt, cols, o, ldo, po, 1);              \
            else if (rb == 4) { CALL(4, tb, wr, ldw, xt, cols, o, ldo, po, 1) }         \
            else if (rb == 3) { CALL(3, tb, wr, ldw, xt, cols, o, ldo, po, 1) }         \
            else { CALL(2, tb, wr, ldw, xt, cols, o, ldo, po, 1) }                      \
        }                                                                               \
        for (; r < r1; r++) {                                                           \
            const T *wr = w + (size_t)r * ldw;                                          \
            float *o = out + (size_t)t * ldo + r;                                       \
            CALL(1, tb, wr, ldw, xt, cols, o, ldo, (pfr ? pfr : 1) * ldw, 1)            \
        }                                                                               \
        t += tb;                                                                        \
    }                                                                                   \
}
/* SM_WPIN=1: the weight vectors a step loaded are kept in registers for all its tokens. Without
   it GCC 12 may load each weight line once per token (it takes the vector as equal to its
   memory and reloads it rather than keep RB registers), so a block of TB tokens issues RB * TB
   weight loads a step where RB would do. An empty asm that "changes" each vector stops that.
   Only in blocks of 2 or more tokens: with one, an FMA's weight operand straight from memory
   is the better code (pinned, the fp32 one-token blocks were 3-4% slower on a Zen 5 core). */
#ifndef SM_WPIN
#define SM_WPIN 0
#endif
#define SM_PIN(V, RB, TB)                                                                   \
    if (SM_WPIN && (TB) > 1)                                                                \
        for (int r_ = 0; r_ < (RB); r_++) __asm__("" : "+v"(V[r_]));
/* The sums of a register block's RB * TB accumulators, out[t * ldo + r * rs] = the sum of the
   lanes of acc[r][t]. SM_TREE=1 (blocks of 2 or more tokens), 2 (every block) or 3 (blocks of
   one token): by sm_hsum16,
   a transposing tree that sums 16 vectors with 30 shuffles and 15 adds, where a reduction of
   each vector on its own takes 16 x 8; else each accumulator reduced on its own. A block of TB
   tokens reduces TB accumulators a row, so its reductions grow with TB while its reads do not:
   on the down projection's rows (2 KiB in bf16) they are the same order as a row's read. */
#ifndef SM_TREE
#define SM_TREE 3  /* 3: one-token blocks only. On the blocks of 2 or more tokens the tree's
                      16 live vectors made GCC 12 spill accumulators inside their loops */
#endif
/* dst[i] = the sum of the lanes of v[i] for i < m <= 16 (v[m..15] taken as zero). Step 1 adds
   the 256-bit halves of pairs (v[2i], v[2i+1]), step 2 the 128-bit quarters of fours, steps 3-4
   the lanes in each quarter; the result's lane 4q + p holds the sum of v[4p + q]. Every
   vector's lanes are added in the order _mm512_reduce_add_ps adds them (GCC's: the 256-bit
   halves, the 128-bit halves, then (e0 + e2) + (e1 + e3)), so the sums are the same bits. */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void sm_hsum16(const __m512 *v, int m, float *dst) {
    const __m512 z = _mm512_setzero_ps();
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) {
        __m512 x = 2 * i < m ? v[2 * i] : z, y = 2 * i + 1 < m ? v[2 * i + 1] : z;
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
    }
    for (int j = 0; j < 4; j++)
        b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xDD));
    for (int j = 0; j < 2; j++)
        c[j] = _mm512_add_ps(_mm512_unpacklo_ps(b[2 * j], b[2 * j + 1]),
                             _mm512_unpackhi_ps(b[2 * j], b[2 * j + 1]));
    __m512d c0 = _mm512_castps_pd(c[0]), c1 = _mm512_castps_pd(c[1]);
    __m512 d = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c0, c1)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(c0, c1)));
    float s[16];
    _mm512_storeu_ps(s, d);
    for (int i = 0; i < m; i++) dst[i] = s[(i & 3) * 4 + (i >> 2)];
}
#endif
#define SM_SUMS(RB, TB, acc, out, ldo, rs)                                                  \
    if (SM_TREE == 2 || (SM_TREE == 1 && (TB) > 1) || (SM_TREE == 3 && (TB) == 1)) {          \
        float s_[(RB) * (TB)];                                                              \
        for (int i_ = 0; i_ < (RB) * (TB); i_ += 16)                                        \
            sm_hsum16(&acc[0][0] + i_, (RB) * (TB) - i_ < 16 ? (RB) * (TB) - i_ : 16, s_ + i_); \
        for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++)                           \
            out[(size_t)t * ldo + r * rs] = s_[r * (TB) + t];                               \
    } else                                                                                  \
        for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++)                           \
            out[(size_t)t * ldo + r * rs] = _mm512_reduce_add_ps(acc[r][t]);
/* An AVX-512 register block PFX_<RB>x<TB> for weights of type T (bf16 or fp32): RB rows (row
   stride ldw) by TB tokens, 16-lane fp32 accumulators, STEP(RB, TB, column, masked) on L
   weights of each row per step, a masked STEP for the tail. Each step prefetches (PFON) with
   HINT the line pfo elements after each row's (PFB > 0: PFB bytes after instead); the sums go
   to out[t * ldo + r * rs]. */
#define SM_AVX512_BLOCK(PFX, T, STEP, L, MT, PFB, PFON, HINT, RB, TB)                   \
static inline __attribute__((always_inline)) void PFX##_##RB##x##TB(                    \
        const T *w, size_t ldw, const T *const *xp, int cols, float *out, size_t ldo,   \
        size_t pfo, size_t rs) {                                                        \
    __m512 acc[RB][TB];                                                                 \
    const char *pf = PFB ? (const char *)w + PFB : (const char *)(w + pfo);             \
    int cl = cols & ~(L - 1);                                                           \
    MT mk = (MT)~0ull;                                                                  \
    for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++) acc[r][t] = _mm512_setzero_ps();\
    if (!(PFON) && SM_PFHEAD > 0)                                                       \
        for (int r = 0; r < RB; r++)                                                    \
            for (int l = 0; l < SM_PFHEAD; l++)                                         \
                _mm_prefetch(pf + (size_t)r * ldw * sizeof(T) + (size_t)l * 64, _MM_HINT_T0); \
    for (int c = 0; c < cl; c += L) {                                                   \
        if (PFON)                                                                       \
            for (int r = 0; r < RB; r++)                                                \
                _mm_prefetch(pf + ((size_t)r * ldw + c) * sizeof(T), HINT);             \
        STEP(RB, TB, c, 0)                                                              \
    }                                                                                   \
    if (cl < cols) {                                                                    \
        mk = (MT)((1ull << (cols - cl)) - 1);                                           \
        STEP(RB, TB, cl, 1)                                                             \
    }                                                                                   \
    SM_SUMS(RB, TB, acc, out, ldo, rs)                                                  \
}
/* The block of RB rows for a token block of tb (1..9) tokens: PFX_<RB>x<tb>(...) */
#define SM_TB_CALL(PFX, RB, tb, ...)                                                        \
    switch (tb) {                                                                           \
    SM_TB_1TO5(PFX, RB, __VA_ARGS__)                                                        \
    SM_TB_CASE(PFX, RB, 6, __VA_ARGS__) SM_TB_CASE(PFX, RB, 7, __VA_ARGS__)                 \
    SM_TB_CASE(PFX, RB, 8, __VA_ARGS__)                                                     \
    default: PFX##_##RB##x9(__VA_ARGS__); break;                                            \
    }
/* Every block the passes call: 1-4 rows by 1-9 tokens (ROW), the one-token blocks of 8 and 6
   rows and the far-row blocks 8x2, 6x3, 6x4 (BLOCK; 4x3 and 4x4 are ROW's). */
#define SM_AVX512_BLOCKS(ROW, BLOCK)                                                        \
    ROW(1) ROW(2) ROW(3) ROW(4)                                                             \
    BLOCK(8, 1) BLOCK(6, 1) BLOCK(8, 2) BLOCK(6, 3) BLOCK(6, 4)
#if SM_BF16DP
/* A register block for bf16 weights: RB rows by TB tokens, 16-lane fp32 accumulators fed by
   vdpbf16ps on one 64-byte line of each row per step. Activation rows xp[t] are bf16,
   64-byte aligned and zero-padded to a multiple of 32, so the tail is a masked weight load.
   The rows SM_DP_PF bytes ahead in the same rows' stream are prefetched one line per row per
   step. */
#ifndef SM_DP_PF
#define SM_DP_PF 0   /* 0: the next block's rows (RB rows ahead); > 0: bytes ahead; < 0: none */
#endif
#ifndef SM_DP_HINT
#define SM_DP_HINT _MM_HINT_T0
#endif
#define SM_DPSTEP(RB, TB, cc, MASKED)                                                        \
    {                                                                                       \
        __m512i wv[RB];                                                                     \
        for (int r = 0; r < RB; r++)                                                        \
            wv[r] = MASKED ? _mm512_maskz_loadu_epi16(mk, w + (size_t)r * ldw + (cc))       \
                           : _mm512_loadu_si512((const void *)(w + (size_t)r * ldw + (cc))); \
        SM_PIN(wv, RB, TB)                                                                  \
        for (int t = 0; t < TB; t++) {                                                      \
            __m512i xv = _mm512_load_si512((const void *)(xp[t] + (cc)));                   \
            for (int r = 0; r < RB; r++)                                                    \
                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], (__m512bh)xv);     \
        }                                                                                   \
    }
#define SM_DPBLOCK(RB, TB)                                                                  \
    SM_AVX512_BLOCK(sm_dpblock, uint16_t, SM_DPSTEP, 32, __mmask32, SM_DP_PF,               \
                    SM_DP_PF >= 0 && ((TB) > 1 || SM_PF1), SM_DP_HINT, RB, TB)
#define SM_DPROW(RB) SM_DPBLOCK(RB, 1) SM_DPBLOCK(RB, 2) SM_DPBLOCK(RB, 3) SM_DPBLOCK(RB, 4)  \
    SM_DPBLOCK(RB, 5) SM_DPBLOCK(RB, 6) SM_DPBLOCK(RB, 7) SM_DPBLOCK(RB, 8) SM_DPBLOCK(RB, 9)
SM_AVX512_BLOCKS(SM_DPROW, SM_DPBLOCK)  /* SM_DP_RB1=8 or 6: one token on 8 or 6 rows (measured) */

#ifndef SM_DP_RB1
#define SM_DP_RB1 4  /* rows per one-token block: 4, 6 or 8 (results/cpu/kernels/tuning.md) */
#endif
#define SM_DP_CALL(RB, tb, ...) SM_TB_CALL(sm_dpblock, RB, tb, __VA_ARGS__)

SM_ROWS_PASS(sm_rows_dp_pass, uint16_t, sm_dpblock, SM_DP_CALL, SM_DP_RB1)

/* Many tokens on one expert. A block of 6-9 tokens multiplies at 130-180 GFLOP/s on a Zen 4
   core with its rows in L2, and at 75-95 while they stream from memory: the multiplies and
   the reads of one block do not overlap, so such a block read its weights at half the
   bandwidth of a one-token block (results/cpu/kernels/many-tokens/). Past SM_DP_SUB tokens,
   the rows are taken in chunks of about SM_CHUNK_BYTES (L2-resident) and each chunk in
   passes of at most SM_DP_SUB tokens: the first pass reads the chunk from memory, the later
   ones from L2, and the last pass prefetches the next chunk, so its multiplies run while
   the next chunk's rows arrive. The weights still come from memory once. */
#ifndef SM_DP_SUB
#define SM_DP_SUB 6
#endif
#ifndef SM_CHUNK_BYTES
#define SM_CHUNK_BYTES (256 << 10)
#endif
static void sm_rows_dp(const uint16_t *w, size_t ldw, int r0, int r1, const uint16_t *const *xp,
                       int k, int cols, float *out, size_t ldo) {
    if (SM_DP_SUB <= 0 || k <= SM_DP_SUB) { sm_rows_dp_pass(w, ldw, r0, r1, xp, k, cols, out, ldo, 0); return; }
    int np = (k + SM_DP_SUB - 1) / SM_DP_SUB;
    int rc = (int)(SM_CHUNK_BYTES / ((size_t)cols * 2)) / 12 * 12;  /* whole blocks of 2, 3, 4 */
    if (rc < 12) rc = 12;
    for (int c = r0; c < r1; c += rc) {
        int ce = r1 - c < rc ? r1 : c + rc;
        for (int p = 0, t = 0; p < np; p++) {
            int tp = k / np + (p < k % np);
            sm_rows_dp_pass(w, ldw, c, ce, xp + t, tp, cols, out + (size_t)t * ldo, ldo,
                            p == np - 1 ? (size_t)rc : 0);
            t += tp;
        }
    }
}
#endif

/* fp32 weights on 16-lane vectors (AVX-512F), built with -DSM_F32Z=1 (specmoe.kernels._cbuild
   sets it where it was measured faster than the AVX2 blocks). The same register blocks as the
   bf16 path (rows by tokens, sm_dp_rb rows for a block of tb tokens, 32 vector registers), one
   64-byte line of each row per step and FMA per token; tails are masked loads of weights and
   activations, so the activation rows' padding is never read. */
#if defined(__AVX512F__) && defined(SM_F32Z) && SM_F32Z
#define SM_ZON 1
#define SM_ZSTEP(RB, TB, cc, MASKED)                                                         \
    {                                                                                       \
        __m512 wv[RB];                                                                      \
        for (int r = 0; r < RB; r++)                                                        \
            wv[r] = MASKED ? _mm512_maskz_loadu_ps(mk, w + (size_t)r * ldw + (cc))          \
                           : _mm512_loadu_ps(w + (size_t)r * ldw + (cc));                   \
        SM_PIN(wv, RB, TB)                                                                  \
        for (int t = 0; t < TB; t++) {                                                      \
            __m512 xv = MASKED ? _mm512_maskz_loadu_ps(mk, xp[t] + (cc))                    \
                               : _mm512_loadu_ps(xp[t] + (cc));                             \
            for (int r = 0; r < RB; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]); \
        }                                                                                   \
    }
#define SM_ZBLOCK(RB, TB)                                                                   \
    SM_AVX512_BLOCK(sm_zblock, float, SM_ZSTEP, 16, __mmask16, 0, (TB) > 1 || SM_PF1,       \
                    SM_PF_HINT, RB, TB)
#define SM_ZROW(RB) SM_ZBLOCK(RB, 1) SM_ZBLOCK(RB, 2) SM_ZBLOCK(RB, 3) SM_ZBLOCK(RB, 4)      \
    SM_ZBLOCK(RB, 5) SM_ZBLOCK(RB, 6) SM_ZBLOCK(RB, 7) SM_ZBLOCK(RB, 8) SM_ZBLOCK(RB, 9)
SM_AVX512_BLOCKS(SM_ZROW, SM_ZBLOCK)
#ifndef SM_Z_RB1
#define SM_Z_RB1 4
#endif
#define SM_Z_CALL(RB, tb, ...) SM_TB_CALL(sm_zblock, RB, tb, __VA_ARGS__)
SM_ROWS_PASS(sm_rows_z_pass, float, sm_zblock, SM_Z_CALL, SM_Z_RB1)
static void sm_rows_z(const float *w, size_t ldw, int r0, int r1, const float *const *xp, int k,
                      int cols, float *out, size_t ldo) {
    sm_rows_z_pass(w, ldw, r0, r1, xp, k, cols, out, ldo, 0);
}
#else
#define SM_ZON 0
#endif

/* q8_0 weights (WT_Q8): each row of cols weights (cols a multiple of 32) is cols / 32 blocks of
   34 bytes, an fp16 scale d then 32 int8 q; the weight is d * q, exact in fp32 (an int8 times
   an fp16 has at most 19 significant bits). The row stride ldw is in bytes. The weights are
   dequantised on the fly against fp32 activations: per 8 weights a sign-extending load
   (vpmovsxbd), a conversion (vcvtdq2ps) and one multiply by d, then one FMA per token, so the
   products are those of the dequantised weights and the result is within fp32 rounding of the
   contract's y on them. */
static inline float sm_q8_scale(const uint8_t *blk) {
    uint16_t hv; memcpy(&hv, blk, 2);
#if defined(__F16C__)
    return _cvtsh_ss(hv);
#else
    return sm_f16_to_f32(hv);
#endif
}

/* Portable: one row against one token at a time, a block's 32 products summed then scaled. */
static void sm_rows_q8_portable(const uint8_t *w, size_t ldw, int r0, int r1,
                                const float *const *xp, int k, int cols, float *out,
                                size_t ldo) {
    int nb = cols / 32;
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = w + (size_t)r * ldw;
        for (int t = 0; t < k; t++) {
            float s = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = wr + (size_t)b * SM_Q8_BLOCK;
                const int8_t *q = (const int8_t *)(blk + 2);
                const float *xb = xp[t] + (size_t)b * 32;
                float sb = 0.0f;
                for (int j = 0; j < 32; j++) sb += (float)q[j] * xb[j];
                s += sm_q8_scale(blk) * sb;
            }
            out[(size_t)t * ldo + r] = s;
        }
    }
}

#if SM_AVX2
#ifndef SM_Q8_PF
#define SM_Q8_PF 2   /* prefetch 2 rows ahead in each of a block's far-apart row streams
                        (adjacent rows: 2 row blocks ahead), one line per row per 32 weights
                        (without it about 1.5x slower; 1-6 blocks ahead within the noise of
                        a loaded machine: results/cpu/kernels/q8_0.md) */
#endif
/* A register block: RB q8_0 rows rs rows apart by TB tokens, 8-lane fp32 accumulators; per
   32-weight block each row's scale is broadcast and its 4 vectors of 8 weights dequantised
   once for all TB tokens. sm_rows_q8 takes the rows far apart, as sm_rows_impl does: 1.17-1.47x
   the adjacent rows' speed (results/cpu/kernels/far-rows/). */
#define SM_Q8BLOCK(RB, TB, FOLD)                                                            \
static inline __attribute__((always_inline)) void sm_q8block_##RB##x##TB(                   \
        const uint8_t *w, size_t ldw0, const float *const *xp, int cols, float *out,        \
        size_t ldo, size_t rs) {                                                            \
    __m256 acc[RB][TB];                                                                     \
    size_t ldw = ldw0 * rs;                                                                 \
    const uint8_t *pf = w + (size_t)SM_Q8_PF * (rs > 1 ? 1 : RB) * ldw0;                    \
    int nb = cols / 32;                                                                     \
    for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++) acc[r][t] = _mm256_setzero_ps(); \
    for (int b = 0; b < nb; b++) {                                                          \
        size_t off = (size_t)b * SM_Q8_BLOCK;                                               \
        __m256 dv[RB], sb[RB][TB];                                                          \
        for (int r = 0; r < RB; r++) {                                                      \
            if (SM_Q8_PF) _mm_prefetch((const char *)(pf + (size_t)r * ldw + off), _MM_HINT_T0); \
            dv[r] = _mm256_set1_ps(sm_q8_scale(w + (size_t)r * ldw + off));                 \
            if (FOLD) for (int t = 0; t < TB; t++) sb[r][t] = _mm256_setzero_ps();          \
        }                                                                                   \
        for (int v = 0; v < 4; v++) {                                                       \
            __m256 wv[RB];                                                                  \
            for (int r = 0; r < RB; r++) {                                                  \
                __m128i q = _mm_loadl_epi64(                                                \
                    (const __m128i *)(w + (size_t)r * ldw + off + 2 + 8 * v));              \
                wv[r] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));                        \
                if (!FOLD) wv[r] = _mm256_mul_ps(wv[r], dv[r]);                             \
            }                                                                               \
            for (int t = 0; t < TB; t++) {                                                  \
                __m256 xv = _mm256_load_ps(xp[t] + (size_t)b * 32 + 8 * v);                 \
                for (int r = 0; r < RB; r++) {                                              \
                    if (FOLD) sb[r][t] = _mm256_fmadd_ps(wv[r], xv, sb[r][t]);              \
                    else acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);                 \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        if (FOLD)                                                                           \
            for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++)                       \
                acc[r][t] = _mm256_fmadd_ps(sb[r][t], dv[r], acc[r][t]);                    \
    }                                                                                       \
    for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++)                               \
        out[(size_t)t * ldo + r * rs] = sm_hsum(acc[r][t]);                                 \
}
#ifndef SM_Q8_FOLD
#define SM_Q8_FOLD 1  /* 1-2 tokens: a block's products summed, then scaled by d (one FMA) */
#endif
SM_Q8BLOCK(4, 1, SM_Q8_FOLD)
SM_Q8BLOCK(4, 2, 0)
SM_Q8BLOCK(3, 2, SM_Q8_FOLD)
SM_Q8BLOCK(4, 3, 0)
SM_Q8BLOCK(3, 4, 0)
SM_Q8BLOCK(2, 5, 0)
SM_Q8BLOCK(2, 6, 0)
SM_Q8BLOCK(1, 1, SM_Q8_FOLD)
SM_Q8BLOCK(1, 2, SM_Q8_FOLD)
SM_Q8BLOCK(1, 3, 0)
SM_Q8BLOCK(1, 4, 0)
SM_Q8BLOCK(1, 5, 0)
SM_Q8BLOCK(1, 6, 0)
#define SM_Q8_CALL(RB, tb, ...)                                                             \
    switch (tb) {                                                                           \
    SM_TB_1TO5(sm_q8block, RB, __VA_ARGS__)                                                 \
    default: sm_q8block_##RB##x6(__VA_ARGS__); break;                                       \
    }
#endif

#if SM_AVX2
/* q8_0 weights against int16 activations (sm_q8_mode 1): each 32-element block of an
   activation row quantised to int16 with its own scale s = max|x| / 32767 (relative error at
   most 2^-16 of the block's largest element); per block vpmovsxbw widens the 32 int8 weights
   once for all tokens, vpmaddwd multiplies 16 pairs per instruction, exact int32 sums
   (|sum| <= 32 * 127 * 32767 < 2^31), then one conversion and one FMA by d * s per row,
   token and block. */
#define SM_Q8IBLOCK(RB, TB)                                                                 \
static inline __attribute__((always_inline)) void sm_q8iblock_##RB##x##TB(                  \
        const uint8_t *w, size_t ldw, const int16_t *const *xq, const float *const *xs,     \
        int cols, float *out, size_t ldo) {                                                 \
    __m256 acc[RB][TB];                                                                     \
    const uint8_t *pf = w + (size_t)SM_Q8_PF * RB * ldw;                                    \
    int nb = cols / 32;                                                                     \
    for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++) acc[r][t] = _mm256_setzero_ps(); \
    for (int b = 0; b < nb; b++) {                                                          \
        size_t off = (size_t)b * SM_Q8_BLOCK;                                               \
        __m256 dv[RB];                                                                      \
        __m256i wlo[RB], whi[RB];                                                           \
        for (int r = 0; r < RB; r++) {                                                      \
            const uint8_t *blk = w + (size_t)r * ldw + off;                                 \
            if (SM_Q8_PF) _mm_prefetch((const char *)(pf + (size_t)r * ldw + off), _MM_HINT_T0); \
            dv[r] = _mm256_set1_ps(sm_q8_scale(blk));                                       \
            wlo[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 2)));     \
            whi[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 18)));    \
        }                                                                                   \
        for (int t = 0; t < TB; t++) {                                                      \
            __m256i xlo = _mm256_load_si256((const __m256i *)(xq[t] + (size_t)b * 32));     \
            __m256i xhi = _mm256_load_si256((const __m256i *)(xq[t] + (size_t)b * 32 + 16)); \
            __m256 sv = _mm256_set1_ps(xs[t][b]);                                           \
            for (int r = 0; r < RB; r++) {                                                  \
                __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(wlo[r], xlo),              \
                                               _mm256_madd_epi16(whi[r], xhi));             \
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),                        \
                                            _mm256_mul_ps(dv[r], sv), acc[r][t]);           \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    for (int r = 0; r < RB; r++) for (int t = 0; t < TB; t++)                               \
        out[(size_t)t * ldo + r] = sm_hsum(acc[r][t]);                                      \
}
SM_Q8IBLOCK(4, 1)
SM_Q8IBLOCK(3, 2)
SM_Q8IBLOCK(2, 3)
SM_Q8IBLOCK(2, 4)
SM_Q8IBLOCK(1, 1)
SM_Q8IBLOCK(1, 2)
SM_Q8IBLOCK(1, 3)
SM_Q8IBLOCK(1, 4)
SM_Q8IBLOCK(1, 5)
SM_Q8IBLOCK(1, 6)

/* rows [r0, r1), tokens [0, k) in blocks of at most 6 (as even as possible); rows in blocks of
   4 (1 token), 3 (2), 2 (3-4) or 1 (5-6). */
static void sm_rows_q8i(const uint8_t *w, size_t ldw, int r0, int r1, const int16_t *const *xq,
                        const float *const *xs, int k, int cols, float *out, size_t ldo) {
    int nb = (k + 5) / 6;
    for (int b = 0, t = 0; b < nb; b++) {
        int tb = k / nb + (b < k % nb);
        const int16_t *const *qt = xq + t;
        const float *const *st = xs + t;
        float *o = out + (size_t)t * ldo;
        int r = r0;
#define SM_Q8IA(r) w + (size_t)(r) * ldw, ldw, qt, st, cols, o + (r), ldo
        if (tb == 1) for (; r + 4 <= r1; r += 4) sm_q8iblock_4x1(SM_Q8IA(r));
        else if (tb == 2) for (; r + 3 <= r1; r += 3) sm_q8iblock_3x2(SM_Q8IA(r));
        else if (tb == 3) for (; r + 2 <= r1; r += 2) sm_q8iblock_2x3(SM_Q8IA(r));
        else if (tb == 4) for (; r + 2 <= r1; r += 2) sm_q8iblock_2x4(SM_Q8IA(r));
        for (; r < r1; r++) {
            switch (tb) {
            case 1: sm_q8iblock_1x1(SM_Q8IA(r)); break;
            case 2: sm_q8iblock_1x2(SM_Q8IA(r)); break;
            case 3: sm_q8iblock_1x3(SM_Q8IA(r)); break;
            case 4: sm_q8iblock_1x4(SM_Q8IA(r)); break;
            case 5: sm_q8iblock_1x5(SM_Q8IA(r)); break;
            default: sm_q8iblock_1x6(SM_Q8IA(r)); break;
            }
        }
#undef SM_Q8IA
        t += tb;
    }
}
#endif

/* One activation row's 32-element blocks [b0, b1) quantised to int16: s = max|x| / 32767,
   q = round(x / s) (s = 0, q = 0 for an all-zero block). */
static void sm_quant_i16(const float *x, int b0, int b1, int16_t *q, float *sc) {
    for (int b = b0; b < b1; b++) {
        const float *xb = x + (size_t)b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) { float v = fabsf(xb[j]); amax = v > amax ? v : amax; }
        float s = amax / 32767.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
        for (int j = 0; j < 32; j++) {
            float v = nearbyintf(xb[j] * inv);
            v = v > 32767.0f ? 32767.0f : (v < -32767.0f ? -32767.0f : v);
            q[(size_t)b * 32 + j] = (int16_t)v;
        }
        sc[b] = s;
    }
}

/* out[t * ldo + r] = dequant(W)[r, :] . xp[t] for rows [r0, r1) and tokens [0, k): tokens in
   blocks of at most 6 (as even as possible), rows in blocks of 4 (1 or 3 tokens), 3 (2 or 4
   tokens) or 2 (5-6 tokens), leftover rows one at a time. */
static void sm_rows_q8(const uint8_t *w, size_t ldw, int r0, int r1, const float *const *xp,
                       int k, int cols, float *out, size_t ldo) {
#if SM_AVX2
    int nb = (k + 5) / 6;
    for (int b = 0, t = 0; b < nb; b++) {
        int tb = k / nb + (b < k % nb);
        const float *const *xt = xp + t;
        int r = r0;
#define SM_Q8W(r) (w + (size_t)(r) * ldw)
#define SM_Q8O(r) (out + (size_t)t * ldo + (r))
        if (tb == 2 && SM_Q8_FOLD) {
            SM_FAR(3, sm_q8block_3x2(SM_Q8W(rr), ldw, xt, cols, SM_Q8O(rr), ldo, q))
        } else if (tb <= 3) {
            SM_FAR(4, {
                if (tb == 1) sm_q8block_4x1(SM_Q8W(rr), ldw, xt, cols, SM_Q8O(rr), ldo, q);
                else if (tb == 2) sm_q8block_4x2(SM_Q8W(rr), ldw, xt, cols, SM_Q8O(rr), ldo, q);
                else sm_q8block_4x3(SM_Q8W(rr), ldw, xt, cols, SM_Q8O(rr), ldo, q);
            })
        } else if (tb == 4) {
            SM_FAR(3, sm_q8block_3x4(SM_Q8W(rr), ldw, xt, cols, SM_Q8O(rr), ldo, q))
        } else {
            SM_FAR(2, {
                if (tb == 5) sm_q8block_2x5(SM_Q8W(rr), ldw, xt, cols, SM_Q8O(rr), ldo, q);
                else sm_q8block_2x6(SM_Q8W(rr), ldw, xt, cols, SM_Q8O(rr), ldo, q);
            })
        }
        for (; r < r1; r++) { SM_Q8_CALL(1, tb, SM_Q8W(r), ldw, xt, cols, SM_Q8O(r), ldo, 1) }
#undef SM_Q8W
#undef SM_Q8O
        t += tb;
    }
#else
    sm_rows_q8_portable(w, ldw, r0, r1, xp, k, cols, out, ldo);
#endif
}

/* out[t * ldo + r] = W[r, :] . xp[t] for rows r in [r0, r1) and t in [0, k).
   Register blocks (rows x tokens), chosen by measurement on an AVX2 core streaming from
   memory: 4x1, 4x2, 4x3 and 3x4 for one to four tokens, else 2x3..2x6 (token blocks of at most
   six, as even as possible); leftover rows one at a time;
   always inlined into one copy per weight type, so the type test leaves the inner loops.
   A block's RB rows are far apart: with q = (r1 - r0) / RB blocks, block i holds the rows
   r0 + i + j q (j < RB), so each of its rows continues the row before it in memory and the
   range is read as RB sequential streams. Blocks of adjacent rows make every block jump RB
   rows ahead in each stream; on an AMD EPYC core (AVX2) the far rows were 8-15% faster in
   fp32 and 20-37% in bf16, paired call by call (benchmarks/kernel_ab.py,
   results/cpu/kernels/far-rows/); 2, 6 or 8 far rows for one token were slower than 4. */
static inline __attribute__((always_inline)) void
sm_rows_impl(const void *w, int wt, size_t ldw, int r0, int r1, const float *const *xp, int k,
             int cols, float *out, size_t ldo) {
    size_t es = (wt == WT_F32) ? 4 : 2;
#define WROW(r) ((const char *)w + (size_t)(r) * ldw * es)
#define OUT(t, r) (out + (size_t)(t) * ldo + (r))
#if SM_AVX2
    int r = r0;
    if (k <= 2) {
        if (k == 1) SM_FAR(4, sm_block_4x1(WROW(rr), wt, ldw, xp, cols, OUT(0, rr), ldo, q))
        else SM_FAR(4, sm_block_4x2(WROW(rr), wt, ldw, xp, cols, OUT(0, rr), ldo, q))
        for (; r < r1; r++)
            for (int t = 0; t < k; t++)
                sm_block_1x1(WROW(r), wt, ldw, xp + t, cols, OUT(t, r), ldo, 1);
        return;
    }
    if (k == 3) {
        SM_FAR(4, sm_block_4x3(WROW(rr), wt, ldw, xp, cols, OUT(0, rr), ldo, q))
    } else if (k == 4) {
        SM_FAR(3, sm_block_3x4(WROW(rr), wt, ldw, xp, cols, OUT(0, rr), ldo, q))
    }
    int nb = (k + 5) / 6;  /* token blocks of at most 6, sizes as even as possible */
    if (k > 4) SM_FAR(2, {
        for (int b = 0, t = 0; b < nb; b++) {
            int tb = k / nb + (b < k % nb);
            const float *const *xt = xp + t;
            float *o = OUT(t, rr);
            const void *wr = WROW(rr);
            switch (tb) {
            case 6: sm_block_2x6(wr, wt, ldw, xt, cols, o, ldo, q); break;
            case 5: sm_block_2x5(wr, wt, ldw, xt, cols, o, ldo, q); break;
            case 4: sm_block_2x4(wr, wt, ldw, xt, cols, o, ldo, q); break;
            case 3: sm_block_2x3(wr, wt, ldw, xt, cols, o, ldo, q); break;
            case 2: sm_block_2x2(wr, wt, ldw, xt, cols, o, ldo, q); break;
            default: sm_block_2x1(wr, wt, ldw, xt, cols, o, ldo, q); break;
            }
            t += tb;
        }
    })
    for (; r < r1; r++) {
        int t = 0;
        for (; t + 4 <= k; t += 4) sm_block_1x4(WROW(r), wt, ldw, xp + t, cols, OUT(t, r), ldo, 1);
        for (; t < k; t++) sm_block_1x1(WROW(r), wt, ldw, xp + t, cols, OUT(t, r), ldo, 1);
    }
#else
    for (int r = r0; r < r1; r++)
        for (int t = 0; t < k; t++) *OUT(t, r) = sm_dot1(WROW(r), wt, xp[t], 0, cols);
#endif
#undef WROW
#undef OUT
}

static void sm_rows(const void *w, int wt, size_t ldw, int r0, int r1, const float *const *xp,
                    int k, int cols, float *out, size_t ldo) {
#if SM_ZON
    if (wt == WT_F32 && sm_f32z_on) { sm_rows_z((const float *)w, ldw, r0, r1, xp, k, cols, out, ldo); return; }
#endif
    if (wt == WT_F32) sm_rows_impl(w, WT_F32, ldw, r0, r1, xp, k, cols, out, ldo);
    else if (wt == WT_BF16) sm_rows_impl(w, WT_BF16, ldw, r0, r1, xp, k, cols, out, ldo);
    else if (wt == WT_F16) sm_rows_impl(w, WT_F16, ldw, r0, r1, xp, k, cols, out, ldo);
    else if (sm_q8_portable_on) sm_rows_q8_portable((const uint8_t *)w, ldw, r0, r1, xp, k, cols, out, ldo);
    else sm_rows_q8((const uint8_t *)w, ldw, r0, r1, xp, k, cols, out, ldo);
}

static inline float sm_act(float g, float u, int act, float alpha, float limit) {
    if (act == 0) return g / (1.0f + expf(-g)) * u;          /* SwiGLU: silu(g) * u */
    g = g < limit ? g : limit;                               /* gpt-oss: clamp, then      */
    u = u < -limit ? -limit : (u > limit ? limit : u);       /* (u + 1) * g * sigmoid(a g) */
    return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
}

/* SM_VACT=1: the SwiGLU activations of a slot on 16 lanes (AVX-512F, BW, VL). Scalar, the expf per
   element costs about as much as streaming 1/60 of an expert's bytes per slot, in a phase
   between two weight streams where nothing is read: a group of k tokens pays it k times per
   expert read, so it weighs on the deduplicating kernel's groups most. */
#ifndef SM_VACT
#define SM_VACT 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && SM_VACT
#define SM_VACT_ON 1
/* exp(x) on 16 lanes: Cephes' expf (x = n ln 2 + r, |r| <= ln 2 / 2, a degree-7 polynomial in
   r, 2^n by scalef), within 2 ulp of expf where expf is finite and normal; x is clamped to
   [-103, 88.7], so the result is 0 or huge where expf's is 0 or inf. */
static inline __m512 sm_exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-103.0f)), _mm512_set1_ps(88.72283f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
/* sm_f32_to_bf16 on 16 lanes, bit for bit (round to nearest even; NaN stays NaN) */
static inline __m256i sm_bf16x16(__m512 v) {
    __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(hi, _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}
/* silu(g) * u = g / (1 + exp(-g)) * u for j in [a0, a1): gate gi[j], up gi[I + j], biases
   b[j], b[I + j] (b may be NULL); into dst (fp32) or dst16 (bf16) */
static void sm_swiglu16(const float *gi, int I, int a0, int a1, const float *b, float *dst,
                        uint16_t *dst16) {
    for (int j = a0; j < a1; j += 16) {
        __mmask16 mk = a1 - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (a1 - j)) - 1);
        __m512 g = _mm512_maskz_loadu_ps(mk, gi + j), u = _mm512_maskz_loadu_ps(mk, gi + I + j);
        if (b) {
            g = _mm512_add_ps(g, _mm512_maskz_loadu_ps(mk, b + j));
            u = _mm512_add_ps(u, _mm512_maskz_loadu_ps(mk, b + I + j));
        }
        __m512 e = sm_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 av = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
        if (dst16) _mm256_mask_storeu_epi16(dst16 + j, mk, sm_bf16x16(av));
        else _mm512_mask_storeu_ps(dst + j, mk, av);
    }
}
#else
#define SM_VACT_ON 0
#endif

static void *sm_alloc(size_t bytes) {  /* 64-byte aligned: vector loads never split lines */
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) return NULL;
    return p;
}

static void sm_split(int total, int tid, int nth, int align, int *a, int *b) {
    int chunk = (total + nth - 1) / nth;
    chunk = (chunk + align - 1) / align * align;
    int s = tid * chunk; if (s > total) s = total;
    int e = s + chunk; if (e > total) e = total;
    *a = s; *b = e;
}

/* The expert operation of one MoE layer.
   x [n, h] f32; w_gate_up [P, 2I, h] (rows 0..I-1 gate, I..2I-1 up), strides sgu_e, sgu_r;
   w_down [P, h, I], strides sd_e, sd_r; biases b_gate_up [P, 2I], b_down [P, h] f32 or NULL;
   ids [n, m] int64 in [0, P); wts [n, m] f32; y [n, h] f32, zeroed by the caller.
   mode 0: per-slot (one group per slot, token-major); mode 1: dedup (one group per expert).
   wt 3 (q8_0): w_gate_up [P, 2I, h/32*34] and w_down [P, h, I/32*34] bytes, strides in bytes.
   Returns 0, or -1 for an id out of range, -2 for an allocation failure, -3 for q8_0 weights
   whose rows are not a whole number of 32-weight blocks. */
int specmoe_expert_op(const float *x, int n, int h, const void *wgu, const void *wd, int wt,
                      int inter, long long sgu_e, long long sgu_r, long long sd_e,
                      long long sd_r, const float *bgu, const float *bd, const int64_t *ids,
                      const float *wts, int m, long long num_experts, int mode, int act,
                      float alpha, float limit, int threads, float *y) {
    int nm = n * m, I = inter;
    for (int s = 0; s < nm; s++) if (ids[s] < 0 || ids[s] >= num_experts) return -1;
    int *ord = (int *)malloc(sizeof(int) * (size_t)(nm > 0 ? nm : 1));
    int *gs = (int *)malloc(sizeof(int) * (size_t)(nm + 1));
    if (!ord || !gs) { free(ord); free(gs); return -2; }
    int ng = 0, kmax = 1;
    if (mode == 0) {
        for (int s = 0; s < nm; s++) { ord[s] = s; gs[s] = s; }
        ng = nm; gs[nm] = nm;
    } else {
        /* stable sort of slots by expert id (insertion sort: nm is small) */
        for (int s = 0; s < nm; s++) {
            int j = s;
            while (j > 0 && ids[ord[j - 1]] > ids[s]) { ord[j] = ord[j - 1]; j--; }
            ord[j] = s;
        }
        for (int s = 0; s < nm; s++) {
            if (s == 0 || ids[ord[s]] != ids[ord[s - 1]]) gs[ng++] = s;
        }
        gs[ng] = nm;
        for (int g = 0; g < ng; g++) if (gs[g + 1] - gs[g] > kmax) kmax = gs[g + 1] - gs[g];
    }
    /* element size of the strides: q8_0 strides are in bytes */
    size_t es = (wt == WT_F32) ? 4 : (wt == WT_Q8 ? 1 : 2);
    double wbytes = (wt == WT_Q8) ? (double)SM_Q8_BLOCK / 32 : (double)es;
    if (wt == WT_Q8 && ((h % 32) || (I % 32))) { free(ord); free(gs); return -3; }
    /* Activation rows are padded to 16 floats so that every row starts on a cache line. */
    int ldx = (h + 15) & ~15, lda = (I + 15) & ~15;
    float *X = (float *)sm_alloc(sizeof(float) * (size_t)n * ldx);
    float *G = (float *)sm_alloc(sizeof(float) * (size_t)kmax * 2 * I);
    float *A = (float *)sm_alloc(sizeof(float) * (size_t)kmax * lda * 2);  /* double buffer */
    float *Y = (float *)sm_alloc(sizeof(float) * (size_t)kmax * h);
    /* bf16 dot-product path: x and the activations as bf16 rows padded (with zeros) to 32 */
    int dp = SM_BF16DP && wt == WT_BF16 && sm_bf16dp_on;
    int ldx16 = (h + 31) & ~31, lda16 = (I + 31) & ~31;
    uint16_t *X16 = dp ? (uint16_t *)sm_alloc(2 * (size_t)n * ldx16) : NULL;
    uint16_t *A16 = dp ? (uint16_t *)sm_alloc(2 * (size_t)kmax * lda16 * 2) : NULL;
    /* q8_0 with int16 activations: x and the intermediate activation as int16 blocks */
    int qi = SM_AVX2 && wt == WT_Q8 && sm_q8_mode == 1 && !sm_q8_portable_on;
    int16_t *XQ = qi ? (int16_t *)sm_alloc(2 * (size_t)n * h) : NULL;
    float *XS = qi ? (float *)sm_alloc(sizeof(float) * (size_t)n * (h / 32)) : NULL;
    int16_t *AQ = qi ? (int16_t *)sm_alloc(2 * (size_t)kmax * I * 2) : NULL;
    float *AS = qi ? (float *)sm_alloc(sizeof(float) * (size_t)kmax * (I / 32) * 2) : NULL;
    if (!X || !G || !A || !Y || (dp && (!X16 || !A16)) || (qi && (!XQ || !XS || !AQ || !AS))) {
        free(ord); free(gs); free(X); free(G); free(A); free(Y); free(X16); free(A16);
        free(XQ); free(XS); free(AQ); free(AS); return -2;
    }
    if (qi)
        for (int t = 0; t < n; t++)
            sm_quant_i16(x + (size_t)t * h, 0, h / 32, XQ + (size_t)t * h, XS + (size_t)t * (h / 32));
    for (int t = 0; t < n; t++) memcpy(X + (size_t)t * ldx, x + (size_t)t * h, sizeof(float) * (size_t)h);
    if (dp) {
        memset(X16, 0, 2 * (size_t)n * ldx16);
        memset(A16, 0, 2 * (size_t)kmax * lda16 * 2);
        for (int t = 0; t < n; t++)
            for (int c = 0; c < h; c++) X16[(size_t)t * ldx16 + c] = sm_f32_to_bf16(x[(size_t)t * h + c]);
    }
    int nth = threads > 0 ? threads : 1;
    /* Small experts: a barrier per group costs more than the bytes it splits. */
    if ((double)3 * h * I * wbytes < SM_MIN_PARALLEL_BYTES) nth = 1;
    (void)nth;
#ifdef _OPENMP
    #pragma omp parallel num_threads(nth) if (nth > 1)
#endif
    {
        int tid = 0, T = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num(); T = omp_get_num_threads();
#endif
        int a0, a1, h0, h1;
        sm_split(I, tid, T, qi ? 32 : 4, &a0, &a1);  /* int16 blocks: whole 32s */
        sm_split(h, tid, T, 4, &h0, &h1);
        /* each thread keeps its own row pointers: no sharing, no barrier to build them */
        const float **xg = (const float **)malloc(sizeof(float *) * (size_t)kmax);
        const float **ag = (const float **)malloc(sizeof(float *) * (size_t)kmax);
        const uint16_t **xg16 = (const uint16_t **)malloc(sizeof(uint16_t *) * (size_t)kmax);
        const uint16_t **ag16 = (const uint16_t **)malloc(sizeof(uint16_t *) * (size_t)kmax);
        const int16_t **xgq = (const int16_t **)malloc(sizeof(int16_t *) * (size_t)kmax);
        const int16_t **agq = (const int16_t **)malloc(sizeof(int16_t *) * (size_t)kmax);
        const float **xgs = (const float **)malloc(sizeof(float *) * (size_t)kmax);
        const float **ags = (const float **)malloc(sizeof(float *) * (size_t)kmax);
        for (int g = 0; g < ng; g++) {
            int k = gs[g + 1] - gs[g];
            const int *sl = ord + gs[g];
            long long e = ids[sl[0]];
            const char *wg = (const char *)wgu + (size_t)e * sgu_e * es;
            const char *wdn = (const char *)wd + (size_t)e * sd_e * es;
            float *Ab = A + (size_t)(g & 1) * kmax * lda;
            uint16_t *Ab16 = dp ? A16 + (size_t)(g & 1) * kmax * lda16 : NULL;
            for (int i = 0; i < k; i++) { xg[i] = X + (size_t)(sl[i] / m) * ldx; ag[i] = Ab + (size_t)i * lda; }
            int16_t *AQb = qi ? AQ + (size_t)(g & 1) * kmax * I : NULL;
            float *ASb = qi ? AS + (size_t)(g & 1) * kmax * (I / 32) : NULL;
            if (qi)
                for (int i = 0; i < k; i++) {
                    xgq[i] = XQ + (size_t)(sl[i] / m) * h;
                    xgs[i] = XS + (size_t)(sl[i] / m) * (h / 32);
                    agq[i] = AQb + (size_t)i * I;
                    ags[i] = ASb + (size_t)i * (I / 32);
                }
            if (dp)
                for (int i = 0; i < k; i++) {
                    xg16[i] = X16 + (size_t)(sl[i] / m) * ldx16;
                    ag16[i] = Ab16 + (size_t)i * lda16;
                }
            /* phase 1: this thread's gate rows [a0, a1) and the matching up rows */
            if (a1 > a0) {
#if SM_BF16DP
                if (dp) {
                    const uint16_t *w16 = (const uint16_t *)wg;
                    sm_rows_dp(w16, (size_t)sgu_r, a0, a1, xg16, k, h, G, (size_t)2 * I);
                    sm_rows_dp(w16, (size_t)sgu_r, I + a0, I + a1, xg16, k, h, G, (size_t)2 * I);
                } else
#endif
#if SM_AVX2
                if (qi) {
                    const uint8_t *w8 = (const uint8_t *)wg;
                    sm_rows_q8i(w8, (size_t)sgu_r, a0, a1, xgq, xgs, k, h, G, (size_t)2 * I);
                    sm_rows_q8i(w8, (size_t)sgu_r, I + a0, I + a1, xgq, xgs, k, h, G, (size_t)2 * I);
                } else
#endif
                {
                    sm_rows(wg, wt, (size_t)sgu_r, a0, a1, xg, k, h, G, (size_t)2 * I);
                    sm_rows(wg, wt, (size_t)sgu_r, I + a0, I + a1, xg, k, h, G, (size_t)2 * I);
                }
                for (int i = 0; i < k; i++) {
                    float *gi = G + (size_t)i * 2 * I;
#if SM_VACT_ON
                    if (act == 0) {
                        sm_swiglu16(gi, I, a0, a1, bgu ? bgu + (size_t)e * 2 * I : NULL,
                                    Ab + (size_t)i * lda, dp ? Ab16 + (size_t)i * lda16 : NULL);
                        continue;
                    }
#endif
                    for (int j = a0; j < a1; j++) {
                        float gv = gi[j], uv = gi[I + j];
                        if (bgu) { gv += bgu[(size_t)e * 2 * I + j]; uv += bgu[(size_t)e * 2 * I + I + j]; }
                        float av = sm_act(gv, uv, act, alpha, limit);
                        if (dp) Ab16[(size_t)i * lda16 + j] = sm_f32_to_bf16(av);
                        else Ab[(size_t)i * lda + j] = av;
                    }
                }
                if (qi)
                    for (int i = 0; i < k; i++)
                        sm_quant_i16(Ab + (size_t)i * lda, a0 / 32, a1 / 32, AQb + (size_t)i * I,
                                     ASb + (size_t)i * (I / 32));
            }
#ifdef _OPENMP
            #pragma omp barrier
#endif
            /* phase 2: this thread's output rows [h0, h1), then the weighted sum over slots */
            if (h1 > h0) {
#if SM_BF16DP
                if (dp) sm_rows_dp((const uint16_t *)wdn, (size_t)sd_r, h0, h1, ag16, k, I, Y, (size_t)h);
                else
#endif
#if SM_AVX2
                if (qi) sm_rows_q8i((const uint8_t *)wdn, (size_t)sd_r, h0, h1, agq, ags, k, I, Y, (size_t)h);
                else
#endif
                sm_rows(wdn, wt, (size_t)sd_r, h0, h1, ag, k, I, Y, (size_t)h);
                for (int i = 0; i < k; i++) {
                    int s = sl[i];
                    float wv = wts[s];
                    float *yt = y + (size_t)(s / m) * h;
                    const float *yi = Y + (size_t)i * h;
                    if (bd) { const float *b = bd + (size_t)e * h; for (int r = h0; r < h1; r++) yt[r] += wv * (yi[r] + b[r]); }
                    else { for (int r = h0; r < h1; r++) yt[r] += wv * yi[r]; }
                }
            }
        }
        free(xg); free(ag); free(xg16); free(ag16); free(xgq); free(agq); free(xgs); free(ags);
    }
    free(ord); free(gs); free(X); free(G); free(A); free(Y); free(X16); free(A16);
    free(XQ); free(XS); free(AQ); free(AS);
    return 0;
}

/* Read nbytes of buf with `threads` threads; returns the sum (keeps the reads alive).
   SM_READ_PF > 0: each stream also prefetches (into L2: prefetcht2) the line SM_READ_PF bytes
   ahead, as the kernels' blocks do; on a Zen 4 core the kernels with their prefetches read
   faster than the plain streams (results/cpu/kernels/many-tokens/), which then were no
   ceiling. SM_READ_PF < 0: the same 16-lane loads with no prefetch; SM_READ_STREAMS streams
   (8 by default; on a Zen 5 core 4 of them on 16-lane loads read fastest, above the kernels:
   results/cpu/kernels/ab-2026-12-04-zen5/). */
#ifndef SM_READ_PF
#define SM_READ_PF 0
#endif
#ifndef SM_READ_STREAMS
#define SM_READ_STREAMS 8
#endif
double specmoe_read(const float *buf, long long count, int threads) {
    double total = 0.0;
    int nth = threads > 0 ? threads : 1;
    (void)nth;
#ifdef _OPENMP
    #pragma omp parallel num_threads(nth) if (nth > 1) reduction(+:total)
#endif
    {
        int tid = 0, T = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num(); T = omp_get_num_threads();
#endif
        long long chunk = ((count + T - 1) / T + 31) / 32 * 32;
        long long s = tid * chunk, e = s + chunk;
        if (s > count) s = count;
        if (e > count) e = count;
        /* Eight interleaved streams per thread: one sequential stream leaves the memory
           system idle between the prefetcher's requests on some cores (a single stream read
           about 12 GB/s where the kernels, whose register blocks read several weight rows at
           once, moved 14); eight streams reach the ceiling the kernels can. */
        enum { SM_STREAMS = SM_READ_STREAMS, SM_W = 16 };
        float acc[SM_STREAMS][SM_W];
        memset(acc, 0, sizeof acc);
        long long per = (e - s) / SM_STREAMS / SM_W * SM_W;
#if defined(__AVX512F__)
        if (SM_READ_PF) {  /* one 64-byte line per stream per step, and its prefetch (< 0:
                              the same 16-lane loads without one) */
            __m512 va[SM_STREAMS];
            for (int q = 0; q < SM_STREAMS; q++) va[q] = _mm512_setzero_ps();
            for (long long i = 0; i < per; i += SM_W)
                for (int q = 0; q < SM_STREAMS; q++) {
                    const float *p = buf + s + (long long)q * per + i;
                    if (SM_READ_PF > 0) _mm_prefetch((const char *)p + SM_READ_PF, _MM_HINT_T2);
                    va[q] = _mm512_add_ps(va[q], _mm512_loadu_ps(p));
                }
            for (int q = 0; q < SM_STREAMS; q++) _mm512_storeu_ps(acc[q], va[q]);
        } else
#endif
        for (long long i = 0; i < per; i += SM_W)
            for (int q = 0; q < SM_STREAMS; q++) {
                const float *p = buf + s + (long long)q * per + i;
                for (int j = 0; j < SM_W; j++) acc[q][j] += p[j];
            }
        for (long long i = s + (long long)SM_STREAMS * per; i < e; i++) acc[0][0] += buf[i];
        for (int q = 0; q < SM_STREAMS; q++)
            for (int j = 0; j < SM_W; j++) total += acc[q][j];
    }
    return total;
}

int specmoe_has_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
int specmoe_has_avx2(void) { return SM_AVX2; }
int specmoe_has_bf16dp(void) { return SM_BF16DP; }
int specmoe_has_f32z(void) { return SM_ZON; }
/* Turn the AVX-512F fp32 path on (1) or off (0: the AVX2 blocks); returns the previous setting.
   Not thread-safe: set it between calls. */
int specmoe_set_f32z(int on) { int prev = sm_f32z_on; sm_f32z_on = on ? 1 : 0; return prev; }
/* Turn the bf16 dot-product path on (1) or off (0: bf16 weights take the widening path);
   returns the previous setting. Not thread-safe: set it between calls. */
int specmoe_set_bf16dp(int on) { int prev = sm_bf16dp_on; sm_bf16dp_on = on ? 1 : 0; return prev; }
/* q8_0 activations: 0 fp32 (the default), 1 int16 blocks (AVX2 only); returns the previous. */
int specmoe_set_q8_mode(int mode) { int prev = sm_q8_mode; sm_q8_mode = mode ? 1 : 0; return prev; }
/* Run q8_0 weights through the portable loop (1) or the vector blocks (0, the default);
   returns the previous setting. Not thread-safe: set it between calls. */
int specmoe_set_q8_portable(int on) { int prev = sm_q8_portable_on; sm_q8_portable_on = on ? 1 : 0; return prev; }
/* The calling convention of specmoe_expert_op, specmoe_read and the setters, as the loader
   expects it (specmoe.kernels._cbuild.ABI); a source without this function is version 1. */
int specmoe_abi(void) { return 1; }
"""
