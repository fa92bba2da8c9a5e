/*
 * cpu_f16.c — the CPU backend's f16 products (`--precision f16`), emulated.
 *
 * A CPU has no f16 matrix product that this build can use (Debian's oneDNN 2.6 has no f16
 * matmul on x86; OpenBLAS none at all), yet the GPU's f16 path needs a reference that computes the
 * same thing, and the model's f16 plumbing needs to run in CI. So: each operand is rounded to f16
 * (nearest even, kernels/math.h's rounding: NaN stays NaN, past ±65504 becomes ±Inf, tiny values
 * become subnormals) and widened back to fp32 into the engine's scratch, and the fp32 product runs
 * on that. A product of two f16 values has at most 22 significant bits, so fp32 holds it exactly:
 * this is an f16 product with fp32 accumulation, as cuBLAS computes it with CUBLAS_COMPUTE_32F,
 * up to the order of the sums. It costs a rounding pass per operand on top of the fp32 product;
 * it saves nothing, and is for reference and tests. gemm_lp_in (operands already 16-bit) is
 * here too: widened, then the same products.
 */
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/math.h"

void ts_cpu_f16_free(ts_engine_t *e) {
    free(e->f16_scratch);
    e->f16_scratch = NULL;
    e->f16_cap = 0;
}

/* Room for n floats of rounded operands; grows, never shrinks, contents not kept. */
static int room(ts_engine_t *e, int64_t n, float **out) {
    return ts_cpu_room(&e->f16_scratch, &e->f16_cap, n, out);
}

#if defined(__x86_64__) || defined(__i386__)
/* F16C's conversions round to nearest even with subnormals kept (MXCSR's DAZ/FTZ are off in this
 * process), the same bits as ts_f32_to_f16 (test_f16 checks the edge cases) but for a NaN's
 * payload, which F16C keeps and ts_f32_to_f16 makes the quiet NaN 0x7e00 (a NaN either way). */
__attribute__((target("f16c,avx"))) static void round_f16c(float *d, const float *s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(s + i),
                                                                _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++)
        d[i] = ts_f16_to_f32(ts_f32_to_f16(s[i]));
}

/* The CPU has F16C and AVX and the OS saves the ymm registers (cpuid leaf 1: ECX bits 29, 28
 * and 27, OSXSAVE; XCR0 bits 1 and 2). Asked directly: clang's __builtin_cpu_supports knows no
 * "f16c". */
static int have_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    unsigned need = (1u << 29) | (1u << 28) | (1u << 27);
    if ((c & need) != need)
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 6u) == 6u;
}
#endif

/* d[i] = f16(s[i]) widened back to fp32. */
static void round_f16(float *d, const float *s, int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
    if (have_f16c() && !getenv("TESSERA_F16_SCALAR")) {
        round_f16c(d, s, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        d[i] = ts_f16_to_f32(ts_f32_to_f16(s[i]));
}

/* Elements spanned by a strided batch of (rows, cols) matrices with row stride ld. */
static int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
    return (batch - 1) * stride + (rows - 1) * ld + cols;
}

int ts_cpu_gemm_f16(ts_engine_t *e, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                    float alpha, const float *A, int64_t lda, int64_t stride_a, const float *B,
                    int64_t ldb, int64_t stride_b, float beta, float *C, int64_t ldc,
                    int64_t stride_c, int64_t batch) {
    if (M <= 0 || N <= 0 || batch <= 0 || K <= 0) /* nothing to round */
        return ts_cpu_gemm(e, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b,
                           beta, C, ldc, stride_c, batch);
    /* each operand rounded in its own layout (the whole span a strided batch covers, gaps
     * included), so that lda, ldb and the strides carry over */
    int64_t sa = batch > 1 ? stride_a : 0, sb = batch > 1 ? stride_b : 0;
    int64_t na = span(trans_a ? K : M, trans_a ? M : K, lda, sa, batch);
    int64_t nb = span(trans_b ? N : K, trans_b ? K : N, ldb, sb, batch);
    int64_t ob = (na + 15) / 16 * 16;
    float *buf;
    TS_TRY(room(e, ob + nb, &buf));
    round_f16(buf, A, na);
    round_f16(buf + ob, B, nb);
    return ts_cpu_gemm(e, trans_a, trans_b, M, N, K, alpha, buf, lda, sa, buf + ob, ldb, sb, beta,
                       C, ldc, stride_c, batch);
}

int ts_cpu_linear_forward_f16(ts_engine_t *e, float *out, const float *inp, const uint16_t *weight,
                              const float *bias, int64_t M, int64_t N, int64_t K, int64_t group) {
    if (M <= 0 || N <= 0)
        return TS_OK;
    int64_t ow = (M * K + 15) / 16 * 16;
    float *buf;
    TS_TRY(room(e, ow + N * K, &buf));
    round_f16(buf, inp, M * K);
    for (int64_t i = 0; i < N * K; i++) /* the weight, already f16: widening is exact */
        buf[ow + i] = ts_f16_to_f32(weight[i]);
    /* the fp32 linear (its slicing by group: an item's rows do not depend on the batch) */
    return ts_cpu_linear_forward(e, out, buf, buf + ow, bias, M, N, K, group);
}

/* linear_backward_f16 with its input in fp32 (inp, rounded here) or already f16 (inp16). */
static int linear_backward_f16(ts_engine_t *e, float *dinp, float *dweight, const float *dout,
                               const uint16_t *dout16, const float *inp, const uint16_t *inp16,
                               const uint16_t *weight, int64_t M, int64_t N, int64_t K) {
    if (M <= 0 || N <= 0 || K <= 0 || (!dinp && !dweight))
        return TS_OK;
    /* scratch: f16(dout) (M, N), the weight widened (N, K), and f16(inp) (M, K) for dweight */
    int64_t og = (M * N + 15) / 16 * 16, ow = (N * K + 15) / 16 * 16;
    float *buf;
    TS_TRY(room(e, og + ow + (dweight ? M * K : 0), &buf));
    float *g = buf, *w = buf + og, *x = buf + og + ow;
    if (dout16) /* rounded by its producer: widened, exactly */
        for (int64_t i = 0; i < M * N; i++)
            g[i] = ts_f16_to_f32(dout16[i]);
    else
        round_f16(g, dout, M * N);
    if (dinp) { /* dinp (M, K) += f16(dout) (M, N) · weight (N, K) */
        for (int64_t i = 0; i < N * K; i++)
            w[i] = ts_f16_to_f32(weight[i]);
        TS_TRY(ts_cpu_gemm(e, 0, 0, M, K, N, 1.0f, g, N, 0, w, K, 0, 1.0f, dinp, K, 0, 1));
    }
    if (dweight) { /* dweight (N, K) += f16(dout)ᵀ (N, M) · f16(inp) (M, K) */
        if (inp16)
            for (int64_t i = 0; i < M * K; i++)
                x[i] = ts_f16_to_f32(inp16[i]);
        else
            round_f16(x, inp, M * K);
        TS_TRY(ts_cpu_gemm(e, 1, 0, N, K, M, 1.0f, g, N, 0, x, K, 0, 1.0f, dweight, K, 0, 1));
    }
    return TS_OK;
}

int ts_cpu_linear_backward_f16(ts_engine_t *e, float *dinp, float *dweight, const float *dout,
                               const float *inp, const uint16_t *weight, int64_t M, int64_t N,
                               int64_t K) {
    return linear_backward_f16(e, dinp, dweight, dout, NULL, inp, NULL, weight, M, N, K);
}

/* Operands already in 16 bits (a conv's weight converted once, its im2col rounded as written):
 * widened to fp32 in the scratch — exact — and the product that would have rounded them runs
 * (gemm_bf16 rounds them again, which changes nothing; f16's emulated product is the fp32 one),
 * so the bits are those of gemm_bf16 / gemm_f16 on the fp32 values. */
int ts_cpu_gemm_lp_in(ts_engine_t *e, ts_dtype_t lp, int64_t M, int64_t N, int64_t K,
                      const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C,
                      int64_t ldc) {
    if (M <= 0 || N <= 0)
        return TS_OK;
    int64_t na = K > 0 ? (M - 1) * lda + K : 0, nb = K > 0 ? (K - 1) * ldb + N : 0;
    int64_t ob = (na + 15) / 16 * 16;
    float *buf;
    TS_TRY(room(e, ob + nb, &buf));
    int bf16 = lp == TS_BF16;
    for (int64_t i = 0; i < na; i++)
        buf[i] = bf16 ? ts_bf16_to_f32(A[i]) : ts_f16_to_f32(A[i]);
    for (int64_t i = 0; i < nb; i++)
        buf[ob + i] = bf16 ? ts_bf16_to_f32(B[i]) : ts_f16_to_f32(B[i]);
    if (bf16)
        return ts_cpu_gemm_bf16(e, 0, 0, M, N, K, 1.0f, buf, lda, 0, buf + ob, ldb, 0, 0.0f, C, ldc,
                                0, 1);
    return ts_cpu_gemm(e, 0, 0, M, N, K, 1.0f, buf, lda, 0, buf + ob, ldb, 0, 0.0f, C, ldc, 0, 1);
}

/* ---- 16-bit activations (backend.h): the fp32 op into scratch, then rounded ------------------ */

/* n fp32 values rounded to lp */
static void round_lp(uint16_t *dst, const float *src, int64_t n, ts_dtype_t lp) {
    if (lp == TS_BF16)
        for (int64_t i = 0; i < n; i++)
            dst[i] = ts_f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = ts_f32_to_f16(src[i]);
}

int ts_cpu_layernorm_modulate_forward_lp(ts_engine_t *e, float *ln, float *mean, float *rstd,
                                         uint16_t *out, ts_dtype_t lp, const float *inp,
                                         const float *mod, int64_t B, int64_t T, int64_t C,
                                         int64_t M, int shift_idx, int scale_idx) {
    float *buf;
    TS_TRY(room(e, B * T * C, &buf));
    TS_TRY(ts_cpu_layernorm_modulate_forward(e, ln, mean, rstd, buf, inp, mod, B, T, C, M,
                                             shift_idx, scale_idx));
    round_lp(out, buf, B * T * C, lp);
    return TS_OK;
}

int ts_cpu_gelu_forward_lp(ts_engine_t *e, uint16_t *out, ts_dtype_t lp, const float *inp,
                           int64_t n) {
    float *buf;
    TS_TRY(room(e, n, &buf));
    TS_TRY(lp == TS_BF16 ? ts_cpu_gelu_forward_bf16(e, buf, inp, n)
                         : ts_cpu_gelu_forward(e, buf, inp, n));
    round_lp(out, buf, n, lp);
    return TS_OK;
}

/* The fp32 backwards, then their gradient rounded: a linear's dout as its backward reads it. */
int ts_cpu_gelu_backward_lp(ts_engine_t *e, float *dinp, uint16_t *dinp16, ts_dtype_t lp,
                            const float *dout, const float *inp, int64_t n) {
    TS_TRY(ts_cpu_gelu_backward(e, dinp, dout, inp, n));
    round_lp(dinp16, dinp, n, lp);
    return TS_OK;
}

int ts_cpu_gate_residual_backward_lp(ts_engine_t *e, float *dres, float *dy, uint16_t *dy16,
                                     ts_dtype_t lp, float *dmod, const float *dout, const float *y,
                                     const float *mod, int64_t B, int64_t T, int64_t C, int64_t M,
                                     int gate_idx) {
    TS_TRY(ts_cpu_gate_residual_backward(e, dres, dy, dmod, dout, y, mod, B, T, C, M, gate_idx));
    round_lp(dy16, dy, B * T * C, lp);
    return TS_OK;
}

int ts_cpu_silu_forward_lp(ts_engine_t *e, uint16_t *out, ts_dtype_t lp, const float *inp,
                           int64_t n) {
    float *buf;
    TS_TRY(room(e, n, &buf));
    TS_TRY(ts_cpu_silu_forward(e, buf, inp, n));
    round_lp(out, buf, n, lp);
    return TS_OK;
}

int ts_cpu_timestep_embedding_forward_lp(ts_engine_t *e, uint16_t *out, ts_dtype_t lp,
                                         const float *t, int64_t B, int64_t D, float scale) {
    float *buf;
    TS_TRY(room(e, B * D, &buf));
    TS_TRY(ts_cpu_timestep_embedding_forward(e, buf, t, B, D, scale));
    round_lp(out, buf, B * D, lp);
    return TS_OK;
}

int ts_cpu_patchify_forward_lp(ts_engine_t *e, uint16_t *out, ts_dtype_t lp, const float *img,
                               int64_t B, int64_t C, int64_t H, int64_t W, int64_t p) {
    float *buf;
    TS_TRY(room(e, B * C * H * W, &buf));
    TS_TRY(ts_cpu_patchify_forward(e, buf, img, B, C, H, W, p));
    round_lp(out, buf, B * C * H * W, lp);
    return TS_OK;
}

/* The input widened (exactly) and given to the layer that rounds it (at f16, the fp32 layer on
 * the widened operands, as linear_forward_f16 runs it): the same bits. */
int ts_cpu_linear_forward_lp_in(ts_engine_t *e, ts_dtype_t lp, float *out, const uint16_t *inp,
                                const uint16_t *weight, const float *bias, int64_t M, int64_t N,
                                int64_t K, int64_t group) {
    if (M <= 0 || N <= 0)
        return TS_OK;
    int bf16 = lp == TS_BF16;
    int64_t ow = (M * K + 15) / 16 * 16;
    float *buf; /* bf16: the input; f16: the input and the weight, as linear_forward_f16 */
    TS_TRY(room(e, ow + (bf16 ? 0 : N * K), &buf));
    for (int64_t i = 0; i < M * K; i++)
        buf[i] = bf16 ? ts_bf16_to_f32(inp[i]) : ts_f16_to_f32(inp[i]);
    if (bf16) /* oneDNN's layer rounds it again (no change), in scratch of its own */
        return ts_cpu_linear_forward_bf16(e, out, buf, weight, bias, M, N, K, group);
    for (int64_t i = 0; i < N * K; i++)
        buf[ow + i] = ts_f16_to_f32(weight[i]);
    return ts_cpu_linear_forward(e, out, buf, buf + ow, bias, M, N, K, group);
}

/* The two ops in turn (the CPU has no fused epilogue): pre is always written. */
int ts_cpu_linear_gelu_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *pre, uint16_t *act,
                                  const uint16_t *inp, const uint16_t *weight, const float *bias,
                                  int64_t M, int64_t N, int64_t K, int64_t group, int keep_pre) {
    (void)keep_pre;
    TS_TRY(ts_cpu_linear_forward_lp_in(e, lp, pre, inp, weight, bias, M, N, K, group));
    return ts_cpu_gelu_forward_lp(e, act, lp, pre, M * N);
}

/* bf16: the input (and dout16) widened (exactly) into this file's scratch and given to the bf16
 * backward, which rounds them again into its own (no change); f16: the emulated backward reads
 * them as they are. */
static int lp_in_products(ts_engine_t *e, ts_dtype_t lp, float *dinp, float *dweight,
                          const float *dout, const uint16_t *dout16, const uint16_t *inp,
                          const uint16_t *weight, int64_t M, int64_t N, int64_t K) {
    if (lp == TS_F16)
        return linear_backward_f16(e, dinp, dweight, dout, dout16, NULL, inp, weight, M, N, K);
    if (M <= 0 || N <= 0 || K <= 0 || (!dinp && !dweight))
        return TS_OK;
    int64_t og = dout16 ? (M * N + 15) / 16 * 16 : 0;
    float *buf = NULL;
    if (dweight || dout16)
        TS_TRY(room(e, og + (dweight ? M * K : 0), &buf));
    for (int64_t i = 0; dout16 && i < M * N; i++)
        buf[i] = ts_bf16_to_f32(dout16[i]);
    for (int64_t i = 0; dweight && i < M * K; i++)
        buf[og + i] = ts_bf16_to_f32(inp[i]);
    return ts_cpu_linear_backward_bf16(e, dinp, dweight, dout16 ? buf : dout,
                                       dweight ? buf + og : NULL, weight, M, N, K);
}

/* linear_backward_lp_in: the products above, then the bias's sums (the same function as an fp32
 * linear's) once the products succeeded, where the ops layer added them before. */
int ts_cpu_linear_backward_lp_in(ts_engine_t *e, ts_dtype_t lp, float *dinp, float *dweight,
                                 float *dbias, const float *dout, const uint16_t *dout16,
                                 const uint16_t *inp, const uint16_t *weight, int64_t M, int64_t N,
                                 int64_t K) {
    TS_TRY(lp_in_products(e, lp, dinp, dweight, dout, dout16, inp, weight, M, N, K));
    return dbias ? ts_cpu_add_bcast_backward(e, NULL, dbias, dout, M, N) : TS_OK;
}
