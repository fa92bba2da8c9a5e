/*
 * test_attention.c — the fused (flash-style) attention (ts_attention_fused_*, kernels/cpu/
 * cpu_attention.c) against the naive reference (kernels/ref.c: plain loops, double) and against
 * the composed op (gemm · softmax · gemm), on a CPU engine with 2 threads.
 *
 * Shapes: T = 1, T below, at and past a block of queries (64) and of keys (256), T not a multiple
 * of either (257, 300: a second block of keys, so the online softmax rescales); head sizes 1 to 64,
 * odd ones included; 1 to 6 heads; batches of 1 to 3. Inputs uniform in [−2, 2).
 *
 * Tolerances, and why:
 *   fp32 forward    |got − ref| ≤ 2e-5 + 1e-5·|ref|, as the composed op's test: the scores, sums
 *                   and products in fp32 in another order. lse: 2e-5 + 1e-6·|ref| (an fp32 log
 *                   of a sum of up to 300 terms).
 *   fp32 backward   |got − ref| ≤ 1e-5·max|ref| + 1e-5·|ref|: P is recomputed as e^(S − lse) from
 *                   an fp32 lse, whose rounding (~|lse|·6e-8) is a relative error of P, and each
 *                   gradient element is a sum of T products of such terms that partly cancel
 *                   (Σ_j dS_ij = 0; for T = 1 dq and dk are exactly 0 and we give ~1e-7), so the
 *                   error is relative to the largest element, not to each. Measured worst over
 *                   these cases: 5e-7 of max|ref|.
 *   bf16 forward    against the reference on q, k, v already rounded to bf16 (the rest of the
 *                   error): |got − ref| ≤ 2^-8 · max|v| + 1e-5 per head, because each softmax
 *                   weight is rounded to bf16 (relative 2^-9) before it multiplies v, and the
 *                   weights sum to 1 (2× margin). Against the composed bf16 op (which rounds the
 *                   normalised weights instead): 2e-2 abs + 2e-2 rel, as test_bf16.
 *   bf16 backward   against the reference on q, k, v and dout rounded to bf16: 1e-2 of max|ref|
 *                   (P and dS rounded before their products, D from the bf16 forward's output;
 *                   the worst measured is printed), and the same against the fp32 backward.
 * The CUDA kernels' steps (kernels/math.h's ts_attn_row_tile and ts_attn_pair_grad, in the
 * kernels' tiles of 32) are emulated here and held to the fp32 tolerances above.
 * Exact checks: a sample's result (forward fp32 and bf16, lse, backward fp32 and bf16) is
 * bit-identical alone and
 * in a batch, and with 1 thread or 2; the backward accumulates (+=); a NaN in q spreads to its own
 * row of its head and a NaN in k to every row of its head, exactly where the composed op puts
 * them, and nowhere else; bad shapes, dtypes and NULLs give the codes the other ops give.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "kernels/ref.h"
#include "tests/testutil.h"

/* B, T, C, heads */
static const int64_t cases[][4] = {{1, 1, 4, 1},   {2, 5, 8, 2},    {1, 3, 6, 6},
                                   {3, 7, 12, 3},  {2, 49, 128, 4}, {1, 64, 256, 4},
                                   {1, 65, 30, 2}, {1, 257, 16, 2}, {1, 300, 24, 3}};
#define NCASES (sizeof cases / sizeof cases[0])

typedef struct {
    int64_t B, T, C, H;
    ts_tensor_t qkv, out, lse;
} fwd_t;

static void fwd_alloc(fwd_t *f, const int64_t *c, tu_rng_t *r) {
    f->B = c[0], f->T = c[1], f->C = c[2], f->H = c[3];
    tu_alloc_f32(&f->qkv, 3, TS_SHAPE(f->B, f->T, 3 * f->C));
    tu_alloc_f32(&f->out, 3, TS_SHAPE(f->B, f->T, f->C));
    tu_alloc_f32(&f->lse, 3, TS_SHAPE(f->B, f->H, f->T));
    tu_fill_uniform(r, &f->qkv, -2, 2);
}

static void fwd_free(fwd_t *f) { TU_FREE_TENSORS(&f->qkv, &f->out, &f->lse); }

#define DESC "B=%lld T=%lld C=%lld heads=%lld"
#define ARGS(f) (long long)(f)->B, (long long)(f)->T, (long long)(f)->C, (long long)(f)->H

/* ---- fp32 forward ------------------------------------------------------------------------ */

static void test_forward_f32(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {11};
    for (size_t c = 0; c < NCASES; c++) {
        fwd_t f;
        fwd_alloc(&f, cases[c], &r);
        int64_t n = f.B * f.T * f.C, nl = f.B * f.H * f.T;
        float *want = tu_floats(n), *wlse = tu_floats(nl);
        ts_ref_attention(want, NULL, tu_f32(&f.qkv), f.B, f.T, f.C, f.H);
        ts_ref_attention_lse(wlse, tu_f32(&f.qkv), f.B, f.T, f.C, f.H);
        TU_CHECK_OK(ts_attention_fused_forward(e, &f.out, &f.lse, &f.qkv, (int)f.H));
        tu_check_close(tu_f32(&f.out), want, n, 2e-5, 1e-5, "fused out " DESC, ARGS(&f));
        tu_check_close(tu_f32(&f.lse), wlse, nl, 2e-5, 1e-6, "fused lse " DESC, ARGS(&f));
        /* against the composed op; and without lse the output is the same */
        ts_tensor_t att, out2;
        tu_alloc_f32(&att, 4, TS_SHAPE(f.B, f.H, f.T, f.T));
        tu_alloc_like(&out2, &f.out);
        TU_CHECK_OK(ts_attention_forward(e, &out2, &att, &f.qkv, (int)f.H));
        tu_check_close(tu_f32(&f.out), tu_f32(&out2), n, 2e-5, 1e-5, "fused vs composed " DESC,
                       ARGS(&f));
        TU_CHECK_OK(ts_attention_fused_forward(e, &out2, NULL, &f.qkv, (int)f.H));
        assert_memory_equal(tu_f32(&out2), tu_f32(&f.out), (size_t)n * sizeof(float));
        free(want);
        free(wlse);
        TU_FREE_TENSORS(&att, &out2);
        fwd_free(&f);
    }
}

/* ---- fp32 backward ----------------------------------------------------------------------- */

static double max_abs(const float *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = fabs((double)x[i]) > m ? fabs((double)x[i]) : m;
    return m;
}

typedef int (*fused_bwd_fn)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *, const ts_tensor_t *,
                            const ts_tensor_t *, const ts_tensor_t *, int);

/* The backward accumulates: a second call into dqkv (holding one call's gradient) gives twice
 * the gradient, up to the order in which the blocks' parts are added to what was there. */
static void check_accumulates(ts_engine_t *e, fused_bwd_fn bwd, ts_tensor_t *dqkv,
                              const ts_tensor_t *dout, const fwd_t *f, const char *what) {
    int64_t n = ts_tensor_numel(dqkv);
    float *once = tu_host_copy(dqkv);
    TU_CHECK_OK(bwd(e, dqkv, dout, &f->qkv, &f->out, &f->lse, (int)f->H));
    for (int64_t i = 0; i < n; i++)
        once[i] *= 2.0f;
    tu_check_close(tu_f32(dqkv), once, n, 1e-6 * max_abs(once, n), 1e-6,
                   "%s dqkv accumulated twice " DESC, what, ARGS(f));
    free(once);
}

static void test_backward_f32(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {12};
    for (size_t c = 0; c < NCASES; c++) {
        fwd_t f;
        fwd_alloc(&f, cases[c], &r);
        ts_tensor_t dout, dqkv, dqkv2, att, datt, out2;
        tu_alloc_like(&dout, &f.out);
        tu_alloc_like(&dqkv, &f.qkv);
        tu_alloc_like(&dqkv2, &f.qkv);
        tu_alloc_like(&out2, &f.out);
        tu_alloc_f32(&att, 4, TS_SHAPE(f.B, f.H, f.T, f.T));
        tu_alloc_like(&datt, &att);
        tu_fill_uniform(&r, &dout, -1, 1);
        int64_t n = ts_tensor_numel(&f.qkv);
        float *want = tu_floats(n);
        ts_ref_attention_backward(want, tu_f32(&dout), tu_f32(&f.qkv), f.B, f.T, f.C, f.H);
        double tol = 1e-5 * max_abs(want, n);

        TU_CHECK_OK(ts_attention_fused_forward(e, &f.out, &f.lse, &f.qkv, (int)f.H));
        TU_CHECK_OK(ts_zero(e, &dqkv));
        TU_CHECK_OK(ts_attention_fused_backward(e, &dqkv, &dout, &f.qkv, &f.out, &f.lse, (int)f.H));
        tu_check_close(tu_f32(&dqkv), want, n, tol, 1e-5, "fused dqkv " DESC, ARGS(&f));
        /* against the composed backward */
        TU_CHECK_OK(ts_attention_forward(e, &out2, &att, &f.qkv, (int)f.H));
        TU_CHECK_OK(ts_zero(e, &dqkv2));
        TU_CHECK_OK(ts_attention_backward(e, &dqkv2, &datt, &dout, &f.qkv, &att, (int)f.H));
        tu_check_close(tu_f32(&dqkv), tu_f32(&dqkv2), n, tol, 1e-5, "fused vs composed dqkv " DESC,
                       ARGS(&f));
        check_accumulates(e, ts_attention_fused_backward, &dqkv, &dout, &f, "fused");
        /* a dqkv over what the backward still reads is refused, and nothing is written */
        float *before = tu_host_copy(&f.qkv);
        assert_int_equal(
            ts_attention_fused_backward(e, &f.qkv, &dout, &f.qkv, &f.out, &f.lse, (int)f.H),
            TS_EINVAL);
        ts_tensor_t over; /* a dqkv whose bytes begin in dout, out, or lse */
        const ts_tensor_t *read[] = {&dout, &f.out, &f.lse};
        for (int k = 0; k < 3; k++) {
            TU_CHECK_OK(ts_tensor_wrap(&over, read[k]->data, TS_F32, TS_CPU, 3, f.qkv.shape));
            assert_int_equal(
                ts_attention_fused_backward(e, &over, &dout, &f.qkv, &f.out, &f.lse, (int)f.H),
                TS_EINVAL);
        }
        assert_memory_equal(before, f.qkv.data, (size_t)n * sizeof *before);
        free(before);
        free(want);
        TU_FREE_TENSORS(&dout, &dqkv, &dqkv2, &att, &datt, &out2);
        fwd_free(&f);
    }
}

/* ---- the CUDA kernels' steps, on the CPU ------------------------------------------------- */

/* kernels/cuda/cuda_attention.cu's three kernels, emulated: the same tiles of TS_ATTN_TILE,
 * staged into (n, hd) buffers as the kernels stage shared memory, and the same kernels/math.h
 * steps (ts_attn_row_tile, ts_attn_pair_grad) — so the per-row math a GPU runs is checked here
 * against the reference, at the fp32 fused tolerances; only the kernels' indexing and
 * synchronisation wait for a GPU (test_cuda_parity). */
static void stage_rows(float *dst, const float *src, int64_t r0, int n, int hd, int64_t ld,
                       int64_t col) {
    for (int r = 0; r < n; r++)
        for (int d = 0; d < hd; d++)
            dst[r * hd + d] = src[(r0 + r) * ld + col + d];
}

static void gpu_steps_forward(float *out, float *lse, const float *qkv, const fwd_t *f) {
    int64_t T = f->T, C = f->C, ld = 3 * C;
    int hd = (int)(C / f->H);
    float scale = 1.0f / sqrtf((float)hd);
    float *Ks = tu_floats(TS_ATTN_TILE * hd), *Vs = tu_floats(TS_ATTN_TILE * hd);
    float *acc = tu_floats(hd);
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t h = 0; h < f->H; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *base = qkv + b * T * ld, *q = base + i * ld + h * hd;
                float m = -FLT_MAX, l = 0.0f;
                memset(acc, 0, (size_t)hd * sizeof *acc);
                for (int64_t j0 = 0; j0 < T; j0 += TS_ATTN_TILE) {
                    int n = (int)(T - j0 < TS_ATTN_TILE ? T - j0 : TS_ATTN_TILE);
                    stage_rows(Ks, base, j0, n, hd, ld, C + h * hd);
                    stage_rows(Vs, base, j0, n, hd, ld, 2 * C + h * hd);
                    ts_attn_row_tile(q, Ks, Vs, n, hd, hd, scale, &m, &l, acc);
                }
                for (int d = 0; d < hd; d++)
                    out[(b * T + i) * C + h * hd + d] = acc[d] * (1.0f / l);
                lse[(b * f->H + h) * T + i] = m + ts_rng_log(l);
            }
    free(Ks), free(Vs), free(acc);
}

/* The dK/dV kernel (a key row against tiles of queries) and the dQ kernel (a query row against
 * tiles of keys), adding into dqkv. */
static void gpu_steps_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, const fwd_t *f) {
    int64_t T = f->T, C = f->C, ld = 3 * C;
    int hd = (int)(C / f->H);
    float scale = 1.0f / sqrtf((float)hd);
    float *A = tu_floats(TS_ATTN_TILE * hd), *Bt = tu_floats(TS_ATTN_TILE * hd);
    float *g1 = tu_floats(hd), *g2 = tu_floats(hd), Ls[TS_ATTN_TILE], Ds[TS_ATTN_TILE];
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t h = 0; h < f->H; h++) {
            const float *base = qkv + b * T * ld, *dO = dout + b * T * C, *O = out + b * T * C;
            const float *L = lse + (b * f->H + h) * T;
            int64_t ho = h * hd;
            for (int64_t j = 0; j < T; j++) { /* dK, dV of key j */
                const float *k = base + j * ld + C + ho, *v = base + j * ld + 2 * C + ho;
                memset(g1, 0, (size_t)hd * sizeof *g1), memset(g2, 0, (size_t)hd * sizeof *g2);
                for (int64_t i0 = 0; i0 < T; i0 += TS_ATTN_TILE) {
                    int n = (int)(T - i0 < TS_ATTN_TILE ? T - i0 : TS_ATTN_TILE);
                    stage_rows(A, base, i0, n, hd, ld, ho);
                    stage_rows(Bt, dO, i0, n, hd, C, ho);
                    for (int t = 0; t < n; t++) {
                        Ls[t] = L[i0 + t];
                        Ds[t] = ts_dot(dO + (i0 + t) * C + ho, O + (i0 + t) * C + ho, hd);
                    }
                    for (int t = 0; t < n; t++) {
                        float p, ds;
                        ts_attn_pair_grad(A + t * hd, k, v, Bt + t * hd, hd, scale, Ls[t], Ds[t],
                                          &p, &ds);
                        for (int d = 0; d < hd; d++) {
                            g2[d] += p * Bt[t * hd + d];
                            g1[d] += scale * ds * A[t * hd + d];
                        }
                    }
                }
                for (int d = 0; d < hd; d++) {
                    dqkv[(b * T + j) * ld + C + ho + d] += g1[d];
                    dqkv[(b * T + j) * ld + 2 * C + ho + d] += g2[d];
                }
            }
            for (int64_t i = 0; i < T; i++) { /* dQ of query i */
                const float *q = base + i * ld + ho, *dOi = dO + i * C + ho;
                float D = ts_dot(dOi, O + i * C + ho, hd);
                memset(g1, 0, (size_t)hd * sizeof *g1);
                for (int64_t j0 = 0; j0 < T; j0 += TS_ATTN_TILE) {
                    int n = (int)(T - j0 < TS_ATTN_TILE ? T - j0 : TS_ATTN_TILE);
                    stage_rows(A, base, j0, n, hd, ld, C + ho);
                    stage_rows(Bt, base, j0, n, hd, ld, 2 * C + ho);
                    for (int t = 0; t < n; t++) {
                        float p, ds;
                        ts_attn_pair_grad(q, A + t * hd, Bt + t * hd, dOi, hd, scale, L[i], D, &p,
                                          &ds);
                        for (int d = 0; d < hd; d++)
                            g1[d] += scale * ds * A[t * hd + d];
                    }
                }
                for (int d = 0; d < hd; d++)
                    dqkv[(b * T + i) * ld + ho + d] += g1[d];
            }
        }
    free(A), free(Bt), free(g1), free(g2);
}

static void test_gpu_kernel_steps(void **state) {
    (void)state;
    tu_rng_t r = {17};
    for (size_t c = 0; c < NCASES; c++) {
        fwd_t f;
        fwd_alloc(&f, cases[c], &r);
        int64_t n = f.B * f.T * f.C, nl = f.B * f.H * f.T, nq = 3 * n;
        float *out = tu_floats(n), *lse = tu_floats(nl), *want = tu_floats(n);
        float *wlse = tu_floats(nl), *dout = tu_floats(n), *dqkv = tu_floats(nq);
        float *wd = tu_floats(nq);
        for (int64_t i = 0; i < n; i++)
            dout[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
        memset(dqkv, 0, (size_t)nq * sizeof *dqkv);
        ts_ref_attention(want, NULL, tu_f32(&f.qkv), f.B, f.T, f.C, f.H);
        ts_ref_attention_lse(wlse, tu_f32(&f.qkv), f.B, f.T, f.C, f.H);
        ts_ref_attention_backward(wd, dout, tu_f32(&f.qkv), f.B, f.T, f.C, f.H);
        gpu_steps_forward(out, lse, tu_f32(&f.qkv), &f);
        tu_check_close(out, want, n, 2e-5, 1e-5, "GPU steps out " DESC, ARGS(&f));
        tu_check_close(lse, wlse, nl, 2e-5, 1e-6, "GPU steps lse " DESC, ARGS(&f));
        gpu_steps_backward(dqkv, dout, tu_f32(&f.qkv), out, lse, &f);
        tu_check_close(dqkv, wd, nq, 1e-5 * max_abs(wd, nq), 1e-5, "GPU steps dqkv " DESC,
                       ARGS(&f));
        free(out), free(lse), free(want), free(wlse), free(dout), free(dqkv), free(wd);
        fwd_free(&f);
    }
}

/* ---- bf16 forward ------------------------------------------------------------------------ */

static void test_forward_bf16(void **state) {
    ts_engine_t *e = *state;
    if (ts_attention_fused_bf16_check(e) != TS_OK)
        skip(); /* no AVX-512 BF16 here */
    tu_rng_t r = {13};
    for (size_t c = 0; c < NCASES; c++) {
        fwd_t f;
        fwd_alloc(&f, cases[c], &r);
        int64_t n = f.B * f.T * f.C, nq = ts_tensor_numel(&f.qkv), hd = f.C / f.H;
        /* the reference on the operands rounded to bf16 */
        float *rounded = tu_host_copy(&f.qkv), *want = tu_floats(n);
        for (int64_t i = 0; i < nq; i++)
            rounded[i] = ts_bf16_to_f32(ts_f32_to_bf16(rounded[i]));
        ts_ref_attention(want, NULL, rounded, f.B, f.T, f.C, f.H);
        TU_CHECK_OK(ts_attention_fused_forward_bf16(e, &f.out, &f.lse, &f.qkv, (int)f.H));
        const float *got = tu_f32(&f.out);
        for (int64_t b = 0; b < f.B; b++)
            for (int64_t h = 0; h < f.H; h++) {
                double vmax = 0.0; /* the head's largest |v| */
                for (int64_t t = 0; t < f.T; t++)
                    for (int64_t d = 0; d < hd; d++) {
                        double v = fabs(rounded[(b * f.T + t) * 3 * f.C + 2 * f.C + h * hd + d]);
                        vmax = v > vmax ? v : vmax;
                    }
                for (int64_t t = 0; t < f.T; t++) {
                    int64_t at = (b * f.T + t) * f.C + h * hd;
                    tu_check_close(got + at, want + at, hd, vmax / 256.0 + 1e-5, 0.0,
                                   "bf16 out " DESC " b=%lld h=%lld t=%lld", ARGS(&f), (long long)b,
                                   (long long)h, (long long)t);
                }
            }
        ts_tensor_t att, out2;
        tu_alloc_f32(&att, 4, TS_SHAPE(f.B, f.H, f.T, f.T));
        tu_alloc_like(&out2, &f.out);
        TU_CHECK_OK(ts_attention_forward_bf16(e, &out2, &att, &f.qkv, (int)f.H));
        tu_check_close(got, tu_f32(&out2), n, 2e-2, 2e-2, "bf16 fused vs composed " DESC, ARGS(&f));
        free(rounded);
        free(want);
        TU_FREE_TENSORS(&att, &out2);
        fwd_free(&f);
    }
}

/* The composed attention with its products in 16 bits (ts_attention_forward_f16, and _bf16
 * where the CPU has it) against tu_attention_lp_ref, the reference test_cuda_parity holds the
 * GPU's grouped-rounding path to: the weights within nmse 1e-9 of the softmax of the rounded
 * q·k in double, the output within 1e-9 of the rounded weights times the rounded v. */
static void test_composed_lp_reference(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {17};
    const ts_dtype_t lps[2] = {TS_F16, TS_BF16};
    for (int i = 0; i < 4; i++) {
        if (lps[i % 2] == TS_BF16 && ts_engine_precision_check(e, TS_PREC_BF16, NULL, 0) != TS_OK) {
            printf("  composed bf16: no bf16 products on this CPU, f16 only\n");
            continue;
        }
        fwd_t f;
        fwd_alloc(&f, cases[3 + i / 2], &r); /* B 3, T 7, C 12, 3 heads; then 2, 49, 128, 4 */
        ts_tensor_t att;
        tu_alloc_f32(&att, 4, TS_SHAPE(f.B, f.H, f.T, f.T));
        ts_dtype_t lp = lps[i % 2];
        TU_CHECK_OK((lp == TS_F16 ? ts_attention_forward_f16
                                  : ts_attention_forward_bf16)(e, &f.out, &att, &f.qkv, (int)f.H));
        int64_t na = ts_tensor_numel(&att), no = ts_tensor_numel(&f.out);
        double *ra = malloc((size_t)na * sizeof *ra), *ro = malloc((size_t)no * sizeof *ro);
        assert_non_null(ra);
        assert_non_null(ro);
        tu_attention_lp_ref(lp, tu_f32(&f.qkv), tu_f32(&att), f.B, f.T, f.C, f.H, ra, ro);
        double ea = tu_nmse(tu_f32(&att), ra, na), eo = tu_nmse(tu_f32(&f.out), ro, no);
        printf("  composed %s T=%lld: weights nmse %.2e, output nmse %.2e\n",
               lp == TS_F16 ? "f16" : "bf16", (long long)f.T, ea, eo);
        assert_true(ea <= 1e-9);
        assert_true(eo <= 1e-9);
        /* the output written in lp (proj's 16-bit input): the fp32 output's bits rounded */
        ts_tensor_t o16, att2;
        TU_CHECK_OK(ts_tensor_alloc(&o16, lp, TS_CPU, 3, TS_SHAPE(f.B, f.T, f.C)));
        tu_alloc_f32(&att2, 4, TS_SHAPE(f.B, f.H, f.T, f.T));
        int (*fwd)(ts_engine_t *, ts_tensor_t *, ts_tensor_t *, const ts_tensor_t *, int) =
            lp == TS_F16 ? ts_attention_forward_f16 : ts_attention_forward_bf16;
        TU_CHECK_OK(fwd(e, &o16, &att2, &f.qkv, (int)f.H));
        assert_memory_equal(att2.data, att.data, (size_t)na * sizeof(float));
        const uint16_t *p16 = o16.data;
        for (int64_t k = 0; k < no; k++)
            if (p16[k] != ts_f32_to_lp(tu_f32(&f.out)[k], lp == TS_F16))
                fail_msg("composed %s out16[%lld] 0x%04x, the fp32 output rounded 0x%04x",
                         lp == TS_F16 ? "f16" : "bf16", (long long)k, p16[k],
                         ts_f32_to_lp(tu_f32(&f.out)[k], lp == TS_F16));
        /* refused: an lp output over the weights, and an lp output beside an fp32 product */
        ts_tensor_t over;
        TU_CHECK_OK(ts_tensor_wrap(&over, att2.data, lp, TS_CPU, 3, TS_SHAPE(f.B, f.T, f.C)));
        assert_int_equal(fwd(e, &over, &att2, &f.qkv, (int)f.H), TS_EINVAL);
        assert_int_not_equal(ts_attention_forward(e, &o16, &att2, &f.qkv, (int)f.H), TS_OK);
        TU_FREE_TENSORS(&o16, &att2);
        free(ra);
        free(ro);
        ts_tensor_free(&att);
        fwd_free(&f);
    }
}

/* ---- bf16 backward ----------------------------------------------------------------------- */

/* The reference backward on q, k, v and dout rounded to bf16 (in double), against the bf16
 * backward after the bf16 forward (as a bf16 training step runs them): what is left is P and dS
 * rounded to bf16 (relative 2^-9 each) before their products, and D = dO·O from the bf16
 * forward's O (off by up to 2^-8 · max|v|); every gradient element is a sum of T such terms
 * that partly cancel, so the error is relative to the largest element, as in fp32: 1e-2 of
 * max|ref| (measured worst over these cases 4.0e-3, printed). Against the fp32 fused backward
 * the same bound. */
static void test_backward_bf16(void **state) {
    ts_engine_t *e = *state;
    if (ts_attention_fused_bf16_check(e) != TS_OK)
        skip(); /* no AVX-512 BF16 here */
    tu_rng_t r = {16};
    double worst = 0.0;
    for (size_t c = 0; c < NCASES; c++) {
        fwd_t f;
        fwd_alloc(&f, cases[c], &r);
        ts_tensor_t dout, dqkv, dqkv32, out32, lse32;
        tu_alloc_like(&dout, &f.out);
        tu_alloc_like(&dqkv, &f.qkv);
        tu_alloc_like(&dqkv32, &f.qkv);
        tu_alloc_like(&out32, &f.out);
        tu_alloc_like(&lse32, &f.lse);
        tu_fill_uniform(&r, &dout, -1, 1);
        int64_t n = ts_tensor_numel(&f.qkv), no = ts_tensor_numel(&f.out);
        float *rq = tu_host_copy(&f.qkv), *rd = tu_host_copy(&dout), *want = tu_floats(n);
        for (int64_t i = 0; i < n; i++)
            rq[i] = ts_bf16_to_f32(ts_f32_to_bf16(rq[i]));
        for (int64_t i = 0; i < no; i++)
            rd[i] = ts_bf16_to_f32(ts_f32_to_bf16(rd[i]));
        ts_ref_attention_backward(want, rd, rq, f.B, f.T, f.C, f.H);
        double big = max_abs(want, n), tol = 1e-2 * big;

        TU_CHECK_OK(ts_attention_fused_forward_bf16(e, &f.out, &f.lse, &f.qkv, (int)f.H));
        TU_CHECK_OK(ts_zero(e, &dqkv));
        TU_CHECK_OK(
            ts_attention_fused_backward_bf16(e, &dqkv, &dout, &f.qkv, &f.out, &f.lse, (int)f.H));
        const float *got = tu_f32(&dqkv);
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)got[i] - want[i]);
            worst = big > 0.0 && d / big > worst ? d / big : worst;
        }
        tu_check_close(got, want, n, tol, 0.0, "bf16 fused dqkv " DESC, ARGS(&f));
        /* against the fp32 fused backward on the unrounded operands */
        TU_CHECK_OK(ts_attention_fused_forward(e, &out32, &lse32, &f.qkv, (int)f.H));
        TU_CHECK_OK(ts_zero(e, &dqkv32));
        TU_CHECK_OK(
            ts_attention_fused_backward(e, &dqkv32, &dout, &f.qkv, &out32, &lse32, (int)f.H));
        tu_check_close(got, tu_f32(&dqkv32), n, 1e-2 * max_abs(tu_f32(&dqkv32), n), 0.0,
                       "bf16 vs fp32 fused dqkv " DESC, ARGS(&f));
        check_accumulates(e, ts_attention_fused_backward_bf16, &dqkv, &dout, &f, "bf16 fused");
        free(rq);
        free(rd);
        free(want);
        TU_FREE_TENSORS(&dout, &dqkv, &dqkv32, &out32, &lse32);
        fwd_free(&f);
    }
    printf("# bf16 backward: worst |got − ref| = %.2e of max|ref|\n", worst);
}

/* ---- batch and thread invariance ----------------------------------------------------------- */

/* Runs forward (fp32 or bf16) and backward over the batch in f with dout, writing out, lse and
 * dqkv (cleared first). */
static void run_all(ts_engine_t *e, fwd_t *f, const ts_tensor_t *dout, ts_tensor_t *dqkv,
                    ts_tensor_t *out16, int bf16) {
    TU_CHECK_OK(ts_attention_fused_forward(e, &f->out, &f->lse, &f->qkv, (int)f->H));
    TU_CHECK_OK(ts_zero(e, dqkv));
    TU_CHECK_OK(ts_attention_fused_backward(e, dqkv, dout, &f->qkv, &f->out, &f->lse, (int)f->H));
    if (bf16) {
        TU_CHECK_OK(ts_attention_fused_forward_bf16(e, out16, &f->lse, &f->qkv, (int)f->H));
        /* the bf16 backward, from the bf16 forward's out and lse, into the same dqkv */
        TU_CHECK_OK(
            ts_attention_fused_backward_bf16(e, dqkv, dout, &f->qkv, out16, &f->lse, (int)f->H));
        TU_CHECK_OK(ts_attention_fused_forward(e, &f->out, &f->lse, &f->qkv, (int)f->H));
    }
}

/* Sample s of every output of a batch run equals the same sample run alone (on engine e1). */
static void check_sample_alone(ts_engine_t *e1, fwd_t *batch, const ts_tensor_t *dout,
                               const ts_tensor_t *dqkv, const ts_tensor_t *out16, int bf16,
                               int64_t s) {
    int64_t T = batch->T, C = batch->C, H = batch->H;
    fwd_t one = {1, T, C, H};
    ts_tensor_t d1, g1, o16;
    tu_alloc_f32(&one.qkv, 3, TS_SHAPE(1, T, 3 * C));
    tu_alloc_f32(&one.out, 3, TS_SHAPE(1, T, C));
    tu_alloc_f32(&one.lse, 3, TS_SHAPE(1, H, T));
    tu_alloc_like(&d1, &one.out);
    tu_alloc_like(&g1, &one.qkv);
    tu_alloc_like(&o16, &one.out);
    memcpy(tu_f32(&one.qkv), tu_f32(&batch->qkv) + s * T * 3 * C, (size_t)(T * 3 * C) * 4);
    memcpy(tu_f32(&d1), tu_f32(dout) + s * T * C, (size_t)(T * C) * 4);
    run_all(e1, &one, &d1, &g1, &o16, bf16);
    assert_memory_equal(tu_f32(&one.out), tu_f32(&batch->out) + s * T * C, (size_t)(T * C) * 4);
    assert_memory_equal(tu_f32(&one.lse), tu_f32(&batch->lse) + s * H * T, (size_t)(H * T) * 4);
    assert_memory_equal(tu_f32(&g1), tu_f32(dqkv) + s * T * 3 * C, (size_t)(T * 3 * C) * 4);
    if (bf16)
        assert_memory_equal(tu_f32(&o16), tu_f32(out16) + s * T * C, (size_t)(T * C) * 4);
    TU_FREE_TENSORS(&one.qkv, &one.out, &one.lse, &d1, &g1, &o16);
}

static void test_batch_invariance(void **state) {
    ts_engine_t *e = *state, e1;
    ts_engine_opts_t opts = {.device = TS_CPU, .threads = 1};
    TU_CHECK_OK(ts_engine_init(&e1, &opts));
    int bf16 = ts_attention_fused_bf16_check(e) == TS_OK;
    static const int64_t shapes[][4] = {{5, 49, 128, 4}, {3, 300, 24, 3}, {4, 65, 30, 2}};
    tu_rng_t r = {14};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        fwd_t f;
        fwd_alloc(&f, shapes[c], &r);
        ts_tensor_t dout, dqkv, out16;
        tu_alloc_like(&dout, &f.out);
        tu_alloc_like(&dqkv, &f.qkv);
        tu_alloc_like(&out16, &f.out);
        tu_fill_uniform(&r, &dout, -1, 1);
        run_all(e, &f, &dout, &dqkv, &out16, bf16); /* the batch, 2 threads */
        for (int64_t s = 0; s < f.B; s++) {
            check_sample_alone(e, &f, &dout, &dqkv, &out16, bf16, s);   /* alone, 2 threads */
            check_sample_alone(&e1, &f, &dout, &dqkv, &out16, bf16, s); /* alone, 1 thread */
        }
        TU_FREE_TENSORS(&dout, &dqkv, &out16);
        fwd_free(&f);
    }
    ts_engine_free(&e1);
}

/* ---- NaN ------------------------------------------------------------------------------------ */

/* The NaNs of got are exactly those of want. */
static void same_nans(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (isnan(got[i]) != isnan(want[i]))
            fail_msg("%s: element %lld is %g, the composed op's %g", what, (long long)i,
                     (double)got[i], (double)want[i]);
}

static void test_nan(void **state) {
    ts_engine_t *e = *state;
    int bf16 = ts_attention_fused_bf16_check(e) == TS_OK;
    int64_t B = 2, T = 70, C = 16, H = 2, hd = C / H;
    tu_rng_t r = {15};
    for (int which = 0; which < 3; which++) { /* a NaN in q, in k, in v */
        fwd_t f;
        fwd_alloc(&f, (int64_t[]){B, T, C, H}, &r);
        /* sample 1, token 3, head 1, element 2 of q, k or v */
        tu_f32(&f.qkv)[(1 * T + 3) * 3 * C + which * C + 1 * hd + 2] = NAN;
        ts_tensor_t att, want, out16;
        tu_alloc_f32(&att, 4, TS_SHAPE(B, H, T, T));
        tu_alloc_like(&want, &f.out);
        tu_alloc_like(&out16, &f.out);
        TU_CHECK_OK(ts_attention_forward(e, &want, &att, &f.qkv, (int)H));
        TU_CHECK_OK(ts_attention_fused_forward(e, &f.out, &f.lse, &f.qkv, (int)H));
        same_nans(tu_f32(&f.out), tu_f32(&want), B * T * C, "fused forward with a NaN");
        if (bf16) {
            TU_CHECK_OK(ts_attention_fused_forward_bf16(e, &out16, NULL, &f.qkv, (int)H));
            same_nans(tu_f32(&out16), tu_f32(&want), B * T * C, "bf16 fused forward with a NaN");
        }
        /* and how many: a q row's NaN fills its output row of the head (hd elements), a k row's
         * every row of the head (T·hd), a v element its column of the head (T) */
        int64_t nans = 0;
        for (int64_t i = 0; i < B * T * C; i++)
            nans += isnan(tu_f32(&f.out)[i]);
        assert_int_equal(nans, which == 0 ? hd : which == 1 ? T * hd : T);
        TU_FREE_TENSORS(&att, &want, &out16);
        fwd_free(&f);
    }
}

/* ---- argument errors ----------------------------------------------------------------------- */

static void test_bad_arguments(void **state) {
    ts_engine_t *e = *state;
    ts_tensor_t qkv, out, lse, lse_bad, out_bad, qkv_bad, dqkv, i32;
    tu_alloc_f32(&qkv, 3, TS_SHAPE(2, 4, 18)); /* C = 6 */
    tu_alloc_f32(&out, 3, TS_SHAPE(2, 4, 6));
    tu_alloc_f32(&lse, 3, TS_SHAPE(2, 2, 4));
    tu_alloc_f32(&lse_bad, 3, TS_SHAPE(2, 3, 4));
    tu_alloc_f32(&out_bad, 3, TS_SHAPE(2, 5, 6));
    tu_alloc_f32(&qkv_bad, 3, TS_SHAPE(2, 4, 19));
    tu_alloc_like(&dqkv, &qkv);
    TU_CHECK_OK(ts_tensor_alloc(&i32, TS_I32, TS_CPU, 3, TS_SHAPE(2, 4, 6)));
    TU_CHECK_OK(ts_fill(e, &out, 7.0f));
    int (*fwd[2])(ts_engine_t *, ts_tensor_t *, ts_tensor_t *, const ts_tensor_t *,
                  int) = {ts_attention_fused_forward, ts_attention_fused_forward_bf16};
    for (int k = 0; k < 2; k++) {
        TU_CHECK_RC(fwd[k](e, &out, &lse, &qkv, 4), TS_ESHAPE); /* 6 % 4 heads */
        TU_CHECK_RC(fwd[k](e, &out, &lse, &qkv, 0), TS_ESHAPE);
        TU_CHECK_RC(fwd[k](e, &out, &lse, &qkv, -1), TS_ESHAPE);
        TU_CHECK_RC(fwd[k](e, &out, &lse_bad, &qkv, 2), TS_ESHAPE); /* lse has 3 heads */
        TU_CHECK_RC(fwd[k](e, &out_bad, &lse, &qkv, 2), TS_ESHAPE); /* out has 5 tokens */
        TU_CHECK_RC(fwd[k](e, &out, &lse, &qkv_bad, 2), TS_ESHAPE); /* 19 is not 3C */
        TU_CHECK_RC(fwd[k](e, &i32, &lse, &qkv, 2), TS_EDTYPE);
        TU_CHECK_RC(fwd[k](e, NULL, &lse, &qkv, 2), TS_EINVAL);
        TU_CHECK_RC(fwd[k](e, &out, &lse, NULL, 2), TS_EINVAL);
        TU_CHECK_RC(fwd[k](NULL, &out, &lse, &qkv, 2), TS_EINVAL);
    }
    for (int64_t i = 0; i < 2 * 4 * 6; i++)
        assert_true(tu_f32(&out)[i] == 7.0f); /* nothing was written */
    TU_CHECK_OK(ts_attention_fused_forward(e, &out, &lse, &qkv, 2));
    fused_bwd_fn bwd[2] = {ts_attention_fused_backward, ts_attention_fused_backward_bf16};
    for (int k = 0; k < 2; k++) {
        TU_CHECK_OK(ts_fill(e, &dqkv, 5.0f));
        TU_CHECK_RC(bwd[k](e, &dqkv, &out, &qkv, &out, NULL, 2), TS_EINVAL);
        TU_CHECK_RC(bwd[k](e, &dqkv, &out, &qkv, &out, &lse_bad, 2), TS_ESHAPE);
        TU_CHECK_RC(bwd[k](e, &qkv_bad, &out, &qkv, &out, &lse, 2), TS_ESHAPE);
        TU_CHECK_RC(bwd[k](e, &dqkv, &out_bad, &qkv, &out, &lse, 2), TS_ESHAPE);
        TU_CHECK_RC(bwd[k](e, &dqkv, &out, &qkv, &out, &lse, 3), TS_ESHAPE);
        TU_CHECK_RC(bwd[k](e, &dqkv, &i32, &qkv, &out, &lse, 2), TS_EDTYPE);
        TU_CHECK_RC(bwd[k](NULL, &dqkv, &out, &qkv, &out, &lse, 2), TS_EINVAL);
        for (int64_t i = 0; i < 2 * 4 * 18; i++)
            assert_true(tu_f32(&dqkv)[i] == 5.0f); /* nothing was written */
    }
    TU_FREE_TENSORS(&qkv, &out, &lse, &lse_bad, &out_bad, &qkv_bad, &dqkv, &i32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_f32),           cmocka_unit_test(test_backward_f32),
        cmocka_unit_test(test_forward_bf16),          cmocka_unit_test(test_backward_bf16),
        cmocka_unit_test(test_composed_lp_reference), cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_gpu_kernel_steps),      cmocka_unit_test(test_nan),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests_name("attention", tests, tu_setup_cpu_engine,
                                       tu_teardown_cpu_engine);
}
