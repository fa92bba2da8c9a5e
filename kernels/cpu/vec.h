/*
 * vec.h — internal: the CPU backend's hot per-element and per-row loops, built once per
 * instruction set and chosen when the engine starts.
 *
 * kernels/cpu/vec.c is compiled three times (kernels/CMakeLists.txt): with -mavx512f, with -mavx2,
 * and for baseline x86-64 (SSE2). Each build fills one table of function pointers; the engine
 * takes the widest its CPU runs (ts_cpu_vec_pick), so the same loop runs 16, 8 or 4 lanes wide.
 *
 * Every variant gives the same bits. Each loop computes, per element, the kernels/math.h formula
 * the plain loop computes, with the same IEEE operations in the same order: no build fuses a
 * multiply-add (-ffp-contract=off everywhere), gcc never reorders a float sum without
 * -ffast-math, and the one reduction here (LayerNorm's row statistics) is a chain per row in
 * element order, several rows side by side. Only the vector width differs, and every lane does
 * what the scalar loop does. tests/test_cpu_vec.c checks each variant the CPU can run against
 * the plain loops, with memcmp, on sizes with tails.
 *
 * What is not here: the GEMMs (OpenBLAS picks its own kernels; the AVX2 and AVX-512 builds'
 * linear forward is kernels/cpu/lin_tile.c's, in the table below), softmax and attention (the
 * attention kernel's own file, which takes its exponentials from here and, in the AVX2 and
 * AVX-512 builds, its block products from kernels/cpu/att_tile.c), the reductions in double
 * (their order is their rounding).
 */
#ifndef TS_CPU_VEC_H
#define TS_CPU_VEC_H

#include <stdint.h>

/* The fp32 fused attention's block products (kernels/cpu/att_tile.c): one FMA chain per output in
 * the order of the summed index, so the AVX-512 and AVX2 builds give the same bits. */
typedef struct ts_cpu_att_tiles {
    /* kt (hd, mp) = the transpose of k (m, hd), row stride ld; kt's columns m..mp zero */
    void (*kt)(float *kt, const float *k, int64_t m, int64_t mp, int64_t hd, int64_t ld);
    /* s[i·lds + j] = scale · Σ_p q[i·ldq + p] · kt[p·mp + j], for i < n, j < mp; kt is (hd, mp)
     * with mp a multiple of 16 */
    void (*qk)(float *s, int64_t lds, const float *q, int64_t ldq, const float *kt, int64_t mp,
               int64_t n, int64_t hd, float scale);
    /* o[i·ldo + d] = (accumulate ? o[i·ldo + d] : 0) + Σ_k p[i·ldp + k] · v[k·ldv + d], for
     * i < n, d < hd, k < m */
    void (*pv)(float *o, int64_t ldo, const float *p, int64_t ldp, const float *v, int64_t ldv,
               int64_t n, int64_t m, int64_t hd, int accumulate);
} ts_cpu_att_tiles_t;

/* A linear layer's forward product (kernels/cpu/lin_tile.c): each output one FMA chain over k in
 * order, then the bias, then GELU — the same bits in the AVX-512 and AVX2 builds, whatever the
 * batch or the cut of the work. */
typedef struct ts_cpu_lin_tiles {
    int64_t panel; /* the columns of a packed panel of the weight */
    /* panels lo..hi of weight w (n, K) into packed: panel p (w's rows [p·panel, p·panel + panel),
     * zeros past n) as K rows of `panel` floats at packed + p·panel·K */
    void (*pack)(float *packed, const float *w, int64_t n, int64_t K, int64_t lo, int64_t hi);
    /* rows 0..m, columns of panels lo..hi (and < n) of c (row stride ldc) = a (m, K; row stride
     * lda) · wᵀ + bias (bias NULL: none); when act is not NULL, act = gelu(that) (c's layout;
     * act == c leaves only the GELU), as bias_act */
    void (*forward)(float *c, float *act, int64_t ldc, const float *a, int64_t lda,
                    const float *packed, const float *bias, int64_t m, int64_t n, int64_t K,
                    int64_t lo, int64_t hi);
    /* forward's result for rows 0..m (m ≤ LIN_DIRECT_ROWS) and columns [j0, j1), from w (n, K)
     * unpacked; bias is the whole layer's (N) */
    void (*direct)(float *c, float *act, int64_t ldc, const float *a, int64_t lda, const float *w,
                   const float *bias, int64_t m, int64_t K, int64_t j0, int64_t j1);
} ts_cpu_lin_tiles_t;

/* The most rows lin's direct takes. */
#define LIN_DIRECT_ROWS 8

typedef struct ts_cpu_vec {
    const char *name; /* "avx512", "avx2" or "base" */
    /* out[i] = gelu(inp[i]); out may alias inp */
    void (*gelu)(float *out, const float *inp, int64_t n);
    /* dinp[i] += dout[i] · gelu'(inp[i]) */
    void (*gelu_backward)(float *dinp, const float *dout, const float *inp, int64_t n);
    /* A linear layer's output pass over c (M, N), row stride ld: c += bias (when bias is not
     * NULL), then, when act is not NULL, act = gelu(c) (act has c's layout; act == c leaves
     * only gelu(c + bias) in c) — one pass over each row while the GEMM's output is in cache. */
    void (*bias_act)(float *c, float *act, const float *bias, int64_t M, int64_t N, int64_t ld);
    /* LayerNorm of rows x (rows, C): out (nullable) = (x − mean)·rstd; mean, rstd (rows)
     * nullable; when mod_out is not NULL, also mod_out = modulate(that, shift, scale), shift and
     * scale (C) shared by these rows. */
    void (*layernorm)(float *out, float *mean, float *rstd, float *mod_out, const float *x,
                      const float *shift, const float *scale, int64_t rows, int64_t C);
    /* out (rows, C) = modulate(x, shift, scale), shift and scale (C); out may alias x */
    void (*modulate)(float *out, const float *x, const float *shift, const float *scale,
                     int64_t rows, int64_t C);
    /* out (rows, C) = res + gate · y, gate (C); out may alias res */
    void (*gate_residual)(float *out, const float *res, const float *y, const float *gate,
                          int64_t rows, int64_t C);
    /* ts_adamw_elem on n elements, g = grad · grad_scale */
    void (*adamw)(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float bc1, float sqrt_bc2,
                  float grad_scale);
    /* ema[i] = ts_ema_elem(ema[i], param[i], decay) */
    void (*ema)(float *ema, const float *param, int64_t n, float decay);
    /* y[i] += alpha · x[i] */
    void (*axpy)(float *y, float alpha, const float *x, int64_t n);
    /* x[i] = e^(x[i] − sub) for i < n (the fused attention's softmax weights) */
    void (*exp_sub)(float *x, int64_t n, float sub);
    /* exp_sub, and returns Σ x[i]: TS_EXP_LANES chains (element i in chain i mod TS_EXP_LANES,
     * the tail past the last full group in chain 0), added in chain order at the end */
    float (*exp_sum)(float *x, int64_t n, float sub);
    /* the fp32 fused attention's products; NULL in the base build (OpenBLAS's there) */
    const ts_cpu_att_tiles_t *att;
    /* the fp32 linear layers' forward products; NULL in the base build (OpenBLAS's there) */
    const ts_cpu_lin_tiles_t *lin;
} ts_cpu_vec_t;

#define TS_EXP_LANES 16

/* The table of the widest build this CPU runs, no wider than `cap` ("avx512", "avx2", "base";
 * NULL or "" for no cap; an unknown name caps nothing). The engine passes the environment's
 * TESSERA_CPU_ISA, so a test or a measurement can run the narrower builds on a wide CPU. */
const ts_cpu_vec_t *ts_cpu_vec_pick(const char *cap);

#endif
