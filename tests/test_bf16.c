/*
 * test_bf16.c — the CPU's 16-bit paths, against fp32: bf16 (kernels/cpu/cpu_bf16.c) and, run as
 * `test_bf16 --f16` (ctest's test_f16), f16 (kernels/cpu/cpu_f16.c, emulated), both through
 * ts_dit_set_precision.
 *
 * Tolerances, and why:
 *   linear, matmul     against a naive loop over the same inputs rounded to bf16 (f16),
 *                      accumulated in double: a bf16·bf16 (f16·f16) product is exact in fp32, so
 *                      the only error is fp32 accumulation in oneDNN's (OpenBLAS's) order:
 *                      |got − ref| ≤ 1e-5 · Σ_k |a_k·b_k| + 1e-7.
 *   gelu for bf16      against ts_gelu_forward: 1e-6 relative + 1e-6 absolute (the same formula with
 *                      another vector exp; the output is rounded to bf16 by the next product, 2^-9
 *                      relative).
 *   attention          bf16 against the fp32 op: q, k, v and the softmax weights rounded to bf16
 *                      (2^-9 relative each): 2e-2 abs + 2e-2 rel on values of O(1); f16 (2^-12
 *                      each): 3e-3.
 *   DiT forward        bf16 against fp32 on the same random weights: the velocity's relative
 *                      L2 error ≤ 3e-2 (measured ~5e-3 on `tiny`), and the largest element
 *                      error ≤ 0.1 · max |v|; f16: ≤ 2e-3 (measured 3e-4) and 0.01 · max |v|.
 * Also: f32 after bf16 is bit-identical to a model that never left f32; a sample's bf16 velocity
 * does not depend on the rest of its batch (the server batches strangers' requests). bf16
 * training (the backward) is tests/test_bf16_train.c's.
 *
 * f16 only: its rounding at the edges (±65504 and past it, subnormals, NaN) is kernels/math.h's
 * bit for bit (NaN's payload aside), with the vector (F16C) conversion and without
 * (TESSERA_F16_SCALAR); an f16 model refuses the fused attention.
 *
 * A machine that cannot run bf16 (no oneDNN in the build, or a CPU without AVX-512 BF16) skips
 * every bf16 test (exit 77) with the reason; f16 runs everywhere. `test_bf16 --expect-refusal` instead checks that bf16
 * IS refused with a reason — ctest runs it with DNNL_MAX_CPU_ISA=AVX2, oneDNN's own switch, so
 * the refusal path is exercised on a machine that has the instructions.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "model/dit.h"
#include "tests/testutil.h"

/* The precision under test: its rounding, its ops and its tolerances. */
typedef struct {
    const char *name;
    ts_precision_t prec;
    ts_dtype_t dtype;
    float (*round)(float);
    int (*matmul)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *, int, const ts_tensor_t *, int,
                  float, float);
    int (*attention)(ts_engine_t *, ts_tensor_t *, ts_tensor_t *, const ts_tensor_t *, int);
    double att_tol, dit_rel, dit_max;
} lowp_t;

static float bf(float x) { return ts_bf16_to_f32(ts_f32_to_bf16(x)); }
static float hf(float x) { return ts_f16_to_f32(ts_f32_to_f16(x)); }

static const lowp_t BF16 = {"bf16",         TS_PREC_BF16, TS_BF16, bf, ts_matmul_bf16,
                            ts_attention_forward_bf16, 2e-2, 3e-2, 0.1};
static const lowp_t F16 = {"f16",         TS_PREC_F16, TS_F16, hf, ts_matmul_f16,
                           ts_attention_forward_f16, 3e-3, 2e-3, 0.01};
static const lowp_t *LP = &BF16;

/* ---- linear and matmul against the naive loop -------------------------------------------- */

/* Checks out (M, N) = bf16(A) (M, K) · bf16(B)ᵀ-or-not + bias, elements of A at a[m·ars + k·acs]
 * and of op(B) (K, N) at b[k·brs + n·bcs]. */
static void check_naive(const float *got, const float *a, int64_t ars, int64_t acs, const float *b,
                        int64_t brs, int64_t bcs, const float *bias, float alpha, int64_t M,
                        int64_t N, int64_t K, int64_t ldc, const char *what) {
    double worst = 0.0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double t = (double)LP->round(a[m * ars + k * acs]) *
                           (double)LP->round(b[k * brs + n * bcs]);
                s += t;
                mag += fabs(t);
            }
            s *= alpha;
            if (bias)
                s += bias[n];
            double err = fabs((double)got[m * ldc + n] - s);
            double tol = 1e-5 * fabs(alpha) * mag + 1e-7;
            if (err > tol)
                fail_msg("%s: element (%lld, %lld) is %.9g, want %.9g (tolerance %.3g)", what,
                         (long long)m, (long long)n, got[m * ldc + n], s, tol);
            worst = err > worst ? err : worst;
        }
    printf("  %-40s max |diff| %.3g\n", what, worst);
}

static void test_linear(void **state) {
    ts_engine_t *e = *state;
    /* rows × out × in: one row (adaLN at batch 1), tiny's 49 tokens, a batch cut into row
     * slices, few rows and many columns (a column split), and an odd everything */
    static const int64_t shapes[][3] = {
        {1, 768, 128}, {49, 384, 128}, {3136, 512, 128}, {40, 2048, 512}, {77, 33, 19}};
    tu_rng_t r = {19};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            ts_tensor_t inp, w, wb, bias, out;
            tu_alloc_f32(&inp, 2, TS_SHAPE(M, K));
            tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
            tu_alloc_f32(&bias, 1, TS_SHAPE(N));
            tu_alloc_f32(&out, 2, TS_SHAPE(M, N));
            tu_fill_uniform(&r, &inp, -1, 1);
            tu_fill_uniform(&r, &w, -1, 1);
            tu_fill_uniform(&r, &bias, -1, 1);
            assert_int_equal(ts_tensor_alloc(&wb, LP->dtype, TS_CPU, 2, TS_SHAPE(N, K)), TS_OK);
            assert_int_equal(ts_convert(e, &wb, &w), TS_OK);
            assert_int_equal(ts_linear_forward(e, &out, &inp, &wb, with_bias ? &bias : NULL),
                             TS_OK);
            char what[96];
            snprintf(what, sizeof what, "%s linear %lldx%lldx%lld%s", LP->name, (long long)M,
                     (long long)N, (long long)K, with_bias ? " + bias" : "");
            /* op(B) (K, N) = wᵀ: element (k, n) at w[n·K + k] */
            check_naive(tu_f32(&out), tu_f32(&inp), K, 1, tu_f32(&w), 1, K,
                        with_bias ? tu_f32(&bias) : NULL, 1.0f, M, N, K, N, what);
            TU_FREE_TENSORS(&inp, &w, &wb, &bias, &out);
        }
    }
}

static void test_matmul(void **state) {
    ts_engine_t *e = *state;
    /* batch (0 = 2-D), M, N, K, with every transpose, alpha ≠ 1 and beta ∈ {0, 1} */
    static const int64_t shapes[][4] = {
        {0, 49, 49, 32}, {8, 49, 32, 49}, {0, 300, 200, 96}, {3, 17, 5, 64}};
    tu_rng_t r = {23};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++)
            for (int beta1 = 0; beta1 < 2; beta1++) {
                int64_t Bt = shapes[s][0], M = shapes[s][1], N = shapes[s][2], K = shapes[s][3];
                int ta = tr & 1, tb = tr >> 1;
                float alpha = 0.75f, beta = beta1 ? 1.0f : 0.0f;
                ts_tensor_t a, b, c;
                tu_alloc_f32_batch(&a, Bt, ta ? K : M, ta ? M : K);
                tu_alloc_f32_batch(&b, Bt, tb ? N : K, tb ? K : N);
                tu_alloc_f32_batch(&c, Bt, M, N);
                tu_fill_uniform(&r, &a, -1, 1);
                tu_fill_uniform(&r, &b, -1, 1);
                tu_fill_uniform(&r, &c, -1, 1);
                float *c0 = tu_host_copy(&c);
                assert_int_equal(LP->matmul(e, &c, &a, ta, &b, tb, alpha, beta), TS_OK);
                int64_t nb = Bt ? Bt : 1;
                for (int64_t i = 0; i < nb; i++) {
                    const float *A = tu_f32(&a) + i * M * K, *Bm = tu_f32(&b) + i * K * N;
                    float *got = tu_f32(&c) + i * M * N;
                    /* take beta · c0 out first: what is left is the product */
                    for (int64_t j = 0; j < M * N; j++)
                        got[j] -= beta * c0[i * M * N + j];
                    char what[96];
                    snprintf(what, sizeof what, "%s matmul b%lld %lldx%lldx%lld ta%d tb%d beta%g",
                             LP->name, (long long)Bt, (long long)M, (long long)N, (long long)K, ta,
                             tb, (double)beta);
                    check_naive(got, A, ta ? 1 : K, ta ? M : 1, Bm, tb ? 1 : N, tb ? K : 1, NULL,
                                alpha, M, N, K, N, what);
                }
                free(c0);
                TU_FREE_TENSORS(&a, &b, &c);
            }
}

static void test_attention(void **state) {
    ts_engine_t *e = *state;
    int64_t B = 3, T = 49, C = 128, H = 4;
    tu_rng_t r = {29};
    ts_tensor_t qkv, out, out16, att, att16;
    tu_alloc_f32(&qkv, 3, TS_SHAPE(B, T, 3 * C));
    tu_alloc_f32(&out, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&out16, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&att, 4, TS_SHAPE(B, H, T, T));
    tu_alloc_f32(&att16, 4, TS_SHAPE(B, H, T, T));
    tu_fill_uniform(&r, &qkv, -1, 1);
    assert_int_equal(ts_attention_forward(e, &out, &att, &qkv, (int)H), TS_OK);
    assert_int_equal(LP->attention(e, &out16, &att16, &qkv, (int)H), TS_OK);
    tu_check_close(tu_f32(&att16), tu_f32(&att), B * H * T * T, LP->att_tol, LP->att_tol,
                   "%s attention weights", LP->name);
    tu_check_close(tu_f32(&out16), tu_f32(&out), B * T * C, LP->att_tol, LP->att_tol,
                   "%s attention output", LP->name);
    assert_memory_not_equal(tu_f32(&out16), tu_f32(&out), (size_t)(B * T * C) * sizeof(float));
    TU_FREE_TENSORS(&qkv, &out, &out16, &att, &att16);
}

static void test_gelu(void **state) {
    ts_engine_t *e = *state;
    int64_t n = 100003; /* odd: a masked tail */
    ts_tensor_t x, want, got;
    tu_alloc_f32(&x, 1, TS_SHAPE(n));
    tu_alloc_f32(&want, 1, TS_SHAPE(n));
    tu_alloc_f32(&got, 1, TS_SHAPE(n));
    tu_rng_t r = {31};
    tu_fill_uniform(&r, &x, -12, 12);
    float *xs = tu_f32(&x);
    xs[0] = 0.0f, xs[1] = -100.0f, xs[2] = 100.0f, xs[3] = -1e30f, xs[4] = 1e30f, xs[5] = 1e-30f;
    assert_int_equal(ts_gelu_forward(e, &want, &x), TS_OK);
    assert_int_equal(ts_gelu_forward_bf16(e, &got, &x), TS_OK);
    tu_check_close(tu_f32(&got), tu_f32(&want), n, 1e-6, 1e-6, "gelu for bf16 vs gelu");
    TU_FREE_TENSORS(&x, &want, &got);
}

/* ts_linear_gelu_forward_lp (fc1 with 16-bit activations): the bits of the linear into pre then
 * the rounding GELU, with pre kept or not (the CPU writes it either way), within one ulp of the
 * lp output of a naive double loop with the tanh GELU; and its refusals. */
static void test_linear_gelu_lp(void **state) {
    ts_engine_t *e = *state;
    const int64_t M = 37, N = 40, K = 24;
    ts_dtype_t lp = LP->dtype;
    int f16 = lp == TS_F16;
    ts_tensor_t x, w, bias, x16, w16, pre, act, want_pre, want_act;
    tu_alloc_f32(&x, 2, TS_SHAPE(M, K));
    tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
    tu_alloc_f32(&bias, 1, TS_SHAPE(N));
    tu_alloc_f32(&pre, 2, TS_SHAPE(M, N));
    tu_alloc_f32(&want_pre, 2, TS_SHAPE(M, N));
    tu_rng_t r = {37};
    tu_fill_uniform(&r, &x, -1, 1);
    tu_fill_uniform(&r, &w, -0.6f, 0.6f);
    tu_fill_uniform(&r, &bias, -1, 1);
    assert_int_equal(ts_tensor_alloc(&x16, lp, TS_CPU, 2, TS_SHAPE(M, K)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&w16, lp, TS_CPU, 2, TS_SHAPE(N, K)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&act, lp, TS_CPU, 2, TS_SHAPE(M, N)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&want_act, lp, TS_CPU, 2, TS_SHAPE(M, N)), TS_OK);
    assert_int_equal(ts_convert(e, &x16, &x), TS_OK);
    assert_int_equal(ts_convert(e, &w16, &w), TS_OK);
    assert_int_equal(ts_linear_forward(e, &want_pre, &x16, &w16, &bias), TS_OK);
    assert_int_equal(ts_gelu_forward_lp(e, &want_act, &want_pre), TS_OK);
    const uint16_t *X = x16.data, *W = w16.data, *A = act.data;
    for (int keep = 0; keep < 2; keep++) {
        assert_int_equal(ts_fill(e, &pre, 7.0f), TS_OK);
        assert_int_equal(ts_linear_gelu_forward_lp(e, &pre, &act, &x16, &w16, &bias, keep), TS_OK);
        assert_memory_equal(act.data, want_act.data, (size_t)(M * N) * sizeof(uint16_t));
        assert_memory_equal(pre.data, want_pre.data, (size_t)(M * N) * sizeof(float));
    }
    double worst = 0.0, ulp = f16 ? 0x1p-10 : 0x1p-7;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = tu_f32(&bias)[n];
            for (int64_t k = 0; k < K; k++)
                s += (double)ts_lp_to_f32(X[m * K + k], f16) *
                     (double)ts_lp_to_f32(W[n * K + k], f16);
            double g = 0.5 * s * (1.0 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
            double got = ts_lp_to_f32(A[m * N + n], f16), err = fabs(got - g);
            if (err > ulp * fabs(g) + 1e-6)
                fail_msg("linear+gelu (%lld, %lld) is %.6g, want %.6g", (long long)m, (long long)n,
                         got, g);
            worst = err > worst ? err : worst;
        }
    printf("  %s linear+gelu: the two ops' bits, max |diff| from the naive loop %.3g\n", LP->name,
           worst);
    /* refusals: an fp32 act, an fp32 weight, act over pre, a shape that is not the product's */
    assert_int_equal(ts_linear_gelu_forward_lp(e, &pre, &want_pre, &x16, &w16, &bias, 0),
                     TS_EDTYPE);
    assert_int_equal(ts_linear_gelu_forward_lp(e, &pre, &act, &x16, &w, &bias, 0), TS_EDTYPE);
    assert_int_equal(ts_linear_gelu_forward_lp(e, &pre, &act, &x, &w16, &bias, 0), TS_EDTYPE);
    ts_tensor_t over, small;
    assert_int_equal(ts_tensor_wrap(&over, pre.data, lp, TS_CPU, 2, TS_SHAPE(M, N)), TS_OK);
    assert_int_equal(ts_linear_gelu_forward_lp(e, &pre, &over, &x16, &w16, &bias, 0), TS_EINVAL);
    assert_int_equal(ts_tensor_wrap(&small, want_pre.data, TS_F32, TS_CPU, 2, TS_SHAPE(M, N - 1)),
                     TS_OK);
    assert_int_equal(ts_linear_gelu_forward_lp(e, &small, &act, &x16, &w16, &bias, 0), TS_ESHAPE);
    TU_FREE_TENSORS(&x, &w, &bias, &x16, &w16, &pre, &act, &want_pre, &want_act);
}

/* ---- the DiT forward --------------------------------------------------------------------- */

/* A `tiny` DiT with every parameter N(0, 0.05): DiT's own init zeroes the adaLN and final layers,
 * whose output would be 0 in any precision. */
static void make_model(ts_engine_t *e, ts_dit_t *m, int max_batch) {
    ts_dit_config_t cfg;
    assert_int_equal(ts_dit_config_preset("tiny", &cfg), TS_OK);
    assert_int_equal(ts_dit_create(m, &cfg, e, max_batch, 0), TS_OK);
    assert_int_equal(ts_rng_normal(e, &m->param_mem, 7, 0), TS_OK);
    assert_int_equal(ts_scale(e, &m->param_mem, 0.05f), TS_OK);
}

/* v (B, C, H, W) of the model at its precision for x drawn from stream seed, t and labels fixed. */
static float *velocity(ts_dit_t *m, int B, uint64_t seed) {
    const ts_dit_config_t *c = &m->cfg;
    ts_tensor_t x, t, v;
    tu_alloc_f32(&x, 4, TS_SHAPE(B, c->in_channels, c->input_size, c->input_size));
    tu_alloc_f32(&t, 1, TS_SHAPE(B));
    assert_int_equal(ts_rng_normal(m->eng, &x, seed, 0), TS_OK);
    int32_t y[64];
    for (int b = 0; b < B; b++) {
        tu_f32(&t)[b] = (float)(b + 1) / 65.0f; /* sample b gets the same t in any batch */
        y[b] = b % (c->num_classes + 1);
    }
    assert_int_equal(ts_dit_forward(m, &x, &t, y, B, &v), TS_OK);
    float *out = tu_host_copy(&v);
    TU_FREE_TENSORS(&x, &t);
    return out;
}

static void test_dit_forward(void **state) {
    ts_engine_t *e = *state;
    ts_dit_t m;
    make_model(e, &m, 24);
    int B = 24;
    int64_t n = (int64_t)B * m.cfg.in_channels * m.cfg.input_size * m.cfg.input_size;
    float *v32 = velocity(&m, B, 3);
    char why[256] = "";
    assert_int_equal(ts_dit_set_precision(&m, LP->prec, why, sizeof why), TS_OK);
    float *v16 = velocity(&m, B, 3);
    double num = 0, den = 0, worst = 0, vmax = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)v16[i] - (double)v32[i];
        num += d * d;
        den += (double)v32[i] * (double)v32[i];
        worst = fabs(d) > worst ? fabs(d) : worst;
        vmax = fabs(v32[i]) > vmax ? fabs(v32[i]) : vmax;
    }
    double rel = sqrt(num / den);
    printf("  DiT tiny forward %s vs f32: relative L2 %.3g, max |diff| %.3g of max |v| %.3g\n",
           LP->name, rel, worst, vmax);
    assert_true(rel <= LP->dit_rel);
    assert_true(worst <= LP->dit_max * vmax);
    assert_true(rel > 0.0); /* the 16-bit path really ran */

    /* batch invariance: sample 0 alone gives the bits it had in the batch of 24 */
    float *one = velocity(&m, 1, 3);
    int64_t per = n / B;
    assert_memory_equal(one, v16, (size_t)per * sizeof *one);

    /* back to f32: bit for bit the fp32 forward */
    assert_int_equal(ts_dit_set_precision(&m, TS_PREC_F32, NULL, 0), TS_OK);
    float *back = velocity(&m, B, 3);
    assert_memory_equal(back, v32, (size_t)n * sizeof *back);
    free(v32), free(v16), free(one), free(back);
    ts_dit_free(&m);
}

/* 16-bit activations (ts_dit_set_lp_activations): the same bits as the linears rounding their
 * fp32 inputs, at batch 24 and 1; and they were written in 16 bits (the block's mod1 buffer
 * holds the rounded values of the fp32 run, two bytes each, and so does the attention's output
 * where the attention is the fused one). A linear refuses a 16-bit input
 * beside a weight of another dtype. */
/* The patch embedding's and the timestep MLP's first inputs in 16 bits, written by their
 * producers (ts_patchify_forward, ts_timestep_embedding_forward with a 16-bit out): the fp32
 * op's values rounded, bit for bit, for an odd and an even D and two patch sizes; a 16-bit
 * patchify written over its own image is refused. */
static void test_lp_inputs(void **state) {
    ts_engine_t *e = *state;
    int f16 = LP->dtype == TS_F16;
    tu_rng_t r = {31};
    const int64_t Ds[] = {7, 256}, B = 5;
    for (int k = 0; k < 2; k++) {
        int64_t D = Ds[k];
        ts_tensor_t t, o32, o16;
        tu_alloc_f32(&t, 1, TS_SHAPE(B));
        for (int64_t i = 0; i < B; i++)
            ((float *)t.data)[i] = tu_rng_uniform(&r, 0.0f, 1.0f);
        tu_alloc_f32(&o32, 2, TS_SHAPE(B, D));
        assert_int_equal(ts_tensor_alloc(&o16, LP->dtype, TS_CPU, 2, TS_SHAPE(B, D)), TS_OK);
        assert_int_equal(ts_timestep_embedding_forward(e, &o32, &t, 1000.0f), TS_OK);
        assert_int_equal(ts_timestep_embedding_forward(e, &o16, &t, 1000.0f), TS_OK);
        for (int64_t i = 0; i < B * D; i++)
            assert_int_equal(((uint16_t *)o16.data)[i], ts_f32_to_lp(((float *)o32.data)[i], f16));
        TU_FREE_TENSORS(&t, &o32, &o16);
    }
    for (int p = 2; p <= 4; p += 2) {
        const int64_t C = 3, H = 8, T = (H / p) * (H / p), F = C * p * p;
        ts_tensor_t img, t32, t16, over;
        tu_alloc_f32(&img, 4, TS_SHAPE(2, C, H, H));
        for (int64_t i = 0; i < 2 * C * H * H; i++)
            ((float *)img.data)[i] = tu_rng_uniform(&r, -3.0f, 3.0f);
        tu_alloc_f32(&t32, 3, TS_SHAPE(2, T, F));
        assert_int_equal(ts_tensor_alloc(&t16, LP->dtype, TS_CPU, 3, TS_SHAPE(2, T, F)), TS_OK);
        assert_int_equal(ts_patchify_forward(e, &t32, &img, p), TS_OK);
        assert_int_equal(ts_patchify_forward(e, &t16, &img, p), TS_OK);
        for (int64_t i = 0; i < 2 * T * F; i++)
            assert_int_equal(((uint16_t *)t16.data)[i], ts_f32_to_lp(((float *)t32.data)[i], f16));
        assert_int_equal(ts_tensor_wrap(&over, img.data, LP->dtype, TS_CPU, 3, TS_SHAPE(2, T, F)),
                         TS_OK);
        assert_int_equal(ts_patchify_forward(e, &over, &img, p), TS_EINVAL);
        TU_FREE_TENSORS(&img, &t32, &t16);
    }
}

static void test_dit_lp_activations(void **state) {
    ts_engine_t *e = *state;
    ts_dit_t m;
    make_model(e, &m, 24);
    assert_false(m.lp_acts); /* a CPU model starts off */
    char why[256] = "";
    assert_int_equal(ts_dit_set_precision(&m, LP->prec, why, sizeof why), TS_OK);
    int B = 24, T = ts_dit_tokens(&m.cfg);
    int64_t n = (int64_t)B * m.cfg.in_channels * m.cfg.input_size * m.cfg.input_size;
    int64_t nm = (int64_t)B * T * m.cfg.hidden_size; /* mod1's elements */
    float *v32 = velocity(&m, B, 5);
    float *mod32 = malloc((size_t)nm * sizeof *mod32), *att32 = malloc((size_t)nm * sizeof *att32);
    assert_non_null(mod32);
    assert_non_null(att32);
    memcpy(mod32, m.acts.blocks[0].mod1.data, (size_t)nm * sizeof *mod32);
    memcpy(att32, m.acts.blocks[0].atty.data, (size_t)nm * sizeof *att32);
    ts_dit_set_lp_activations(&m, 1);
    float *v16 = velocity(&m, B, 5);
    assert_memory_equal(v16, v32, (size_t)n * sizeof *v16);
    const uint16_t *mod16 = m.acts.blocks[0].mod1.data;
    for (int64_t i = 0; i < nm; i += 97) {
        uint16_t want = LP->dtype == TS_BF16 ? ts_f32_to_bf16(mod32[i]) : ts_f32_to_f16(mod32[i]);
        if (mod16[i] != want)
            fail_msg("mod1[%lld] is 0x%04x, the fp32 run's value rounded is 0x%04x", (long long)i,
                     mod16[i], want);
    }
    /* the fused attention (bf16 on a CPU with AVX-512 BF16) writes proj's input in 16 bits too */
    const uint16_t *att16 = m.acts.blocks[0].atty.data;
    printf("  %s attention: its output %s\n", m.attn == TS_ATTN_FUSED ? "fused" : "composed",
           m.attn == TS_ATTN_FUSED ? "written in 16 bits" : "fp32");
    for (int64_t i = 0; m.attn == TS_ATTN_FUSED && i < nm; i += 97)
        if (att16[i] != ts_f32_to_lp(att32[i], LP->dtype == TS_F16))
            fail_msg("atty[%lld] is 0x%04x, the fp32 run's value rounded is 0x%04x", (long long)i,
                     att16[i], ts_f32_to_lp(att32[i], LP->dtype == TS_F16));
    float *one = velocity(&m, 1, 5);
    assert_memory_equal(one, v32, (size_t)(n / B) * sizeof *one);
    /* CUDA graphs asked for on a CPU model: ignored, the same bits, nothing captured */
    ts_dit_set_graphs(&m, 1);
    for (int call = 0; call < 3; call++) {
        float *g = velocity(&m, B, 5);
        assert_memory_equal(g, v32, (size_t)n * sizeof *g);
        free(g);
    }
    assert_int_equal(m.graphs.captures, 0);
    assert_int_equal(m.graphs.launches, 0);
    /* a 16-bit input beside an fp32 weight, or the other 16-bit dtype: refused */
    ts_tensor_t x16, w, b, out;
    assert_int_equal(ts_tensor_alloc(&x16, LP->dtype, TS_CPU, 2, TS_SHAPE(3, 8)), TS_OK);
    tu_alloc_f32(&w, 2, TS_SHAPE(4, 8));
    tu_alloc_f32(&b, 1, TS_SHAPE(4));
    tu_alloc_f32(&out, 2, TS_SHAPE(3, 4));
    assert_int_not_equal(ts_linear_forward(e, &out, &x16, &w, &b), TS_OK);
    ts_tensor_t wo; /* the other 16-bit dtype */
    assert_int_equal(ts_tensor_alloc(&wo, LP->dtype == TS_BF16 ? TS_F16 : TS_BF16, TS_CPU, 2,
                                     TS_SHAPE(4, 8)),
                     TS_OK);
    assert_int_not_equal(ts_linear_forward(e, &out, &x16, &wo, &b), TS_OK);
    ts_tensor_free(&wo);
    /* a 16-bit GELU written over its own input: refused */
    ts_tensor_t g32, g16;
    tu_alloc_f32(&g32, 1, TS_SHAPE(16));
    assert_int_equal(ts_tensor_wrap(&g16, g32.data, LP->dtype, TS_CPU, 1, TS_SHAPE(16)), TS_OK);
    assert_int_equal(ts_gelu_forward_lp(e, &g16, &g32), TS_EINVAL);
    assert_int_equal(ts_silu_forward_lp(e, &g16, &g32), TS_EINVAL);
    assert_int_equal(ts_silu_forward_lp(e, &g32, &g32), TS_EDTYPE); /* an fp32 "16-bit" output */
    ts_tensor_free(&g32);
    free(v32), free(v16), free(one), free(mod32), free(att32);
    TU_FREE_TENSORS(&x16, &w, &b, &out);
    ts_dit_free(&m);
}

/* ---- f16 only ------------------------------------------------------------------------------ */

/* The emulation's rounding, through a K = 1 product by 1 (exact in fp32), is kernels/math.h's
 * f16 rounding bit for bit at its edges and over the whole exponent range. */
static void check_edges(ts_engine_t *e, const char *how) {
    static const float edge[] = {65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e6f, -INFINITY,
                                 6.1035156e-5f, 6.0e-5f, 5.9604645e-8f, 2.9802322e-8f,
                                 2.9802326e-8f, 1e-8f, -1e-8f, 1e-30f, -0.0f, 0.0f, 1.0f,
                                 1.0004883f, 1.0009766f, 1.0014648f, 2049.0f, 2051.0f, NAN};
    int64_t ne = sizeof edge / sizeof edge[0], n = ne + 20000;
    ts_tensor_t a, b, c;
    tu_alloc_f32(&a, 2, TS_SHAPE(n, 1));
    tu_alloc_f32(&b, 2, TS_SHAPE(1, 1));
    tu_alloc_f32(&c, 2, TS_SHAPE(n, 1));
    float *x = tu_f32(&a);
    memcpy(x, edge, sizeof edge);
    tu_rng_t r = {41};
    for (int64_t i = ne; i < n; i++) { /* mantissa × 2^[-30, 20), either sign */
        float u = tu_rng_uniform(&r, 1.0f, 2.0f), ex = floorf(tu_rng_uniform(&r, -30.0f, 20.0f));
        x[i] = (i & 1 ? -1.0f : 1.0f) * ldexpf(u, (int)ex);
    }
    tu_f32(&b)[0] = 1.0f;
    memset(tu_f32(&c), 0, (size_t)n * sizeof(float));
    assert_int_equal(ts_matmul_f16(e, &c, &a, 0, &b, 0, 1.0f, 0.0f), TS_OK);
    int64_t inf = 0, sub = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = hf(x[i]), got = tu_f32(&c)[i];
        if (isnan(want)) {
            if (!isnan(got))
                fail_msg("%s: f16(NaN) is %g", how, (double)got);
            continue;
        }
        /* a zero's sign is the product's sum's (0 + −0 = +0), not the rounding's */
        if (memcmp(&want, &got, sizeof want) != 0 && !(want == 0.0f && got == 0.0f))
            fail_msg("%s: f16(%.9g) is %.9g, want %.9g", how, (double)x[i], (double)got,
                     (double)want);
        inf += isinf(got) && !isinf(x[i]);
        sub += got != 0.0f && fabsf(got) < 6.1035156e-5f;
    }
    printf("  %-40s %lld values bit-exact (%lld became ±Inf, %lld subnormal)\n", how,
           (long long)n, (long long)inf, (long long)sub);
    assert_true(inf >= 4 && sub >= 4); /* the edges were reached */
    TU_FREE_TENSORS(&a, &b, &c);
}

static void test_f16_edges(void **state) {
    ts_engine_t *e = *state;
    check_edges(e, "f16 rounding (vector where the CPU has it)");
    setenv("TESSERA_F16_SCALAR", "1", 1);
    check_edges(e, "f16 rounding (scalar)");
    unsetenv("TESSERA_F16_SCALAR");
}

/* An f16 model on the CPU has no fused attention; switching away and back gives the same bits. (f16
 * training is test_bf16_train --f16's.) */
static void test_f16_refusals(void **state) {
    ts_engine_t *e = *state;
    ts_dit_config_t cfg;
    ts_dit_t m;
    assert_int_equal(ts_dit_config_preset("tiny", &cfg), TS_OK);
    char why[256] = "";
    make_model(e, &m, 4);
    assert_int_equal(ts_dit_set_precision(&m, TS_PREC_F16, why, sizeof why), TS_OK);
    assert_int_equal(m.attn, TS_ATTN_COMPOSED);
    assert_int_equal(ts_dit_set_attention(&m, TS_ATTN_FUSED), TS_ENOTSUP);
    assert_int_equal(m.param_lp.dtype, TS_F16);
    float *v1 = velocity(&m, 4, 5);
    int64_t n = 4 * (int64_t)cfg.in_channels * cfg.input_size * cfg.input_size;
    /* f16 → f32 → f16, and where bf16 runs f16 → bf16 → f16 directly: the same bits */
    assert_int_equal(ts_dit_set_precision(&m, TS_PREC_F32, NULL, 0), TS_OK);
    assert_int_equal(ts_dit_set_precision(&m, TS_PREC_F16, NULL, 0), TS_OK);
    float *v2 = velocity(&m, 4, 5);
    assert_memory_equal(v1, v2, (size_t)n * sizeof *v1);
    if (ts_dit_set_precision(&m, TS_PREC_BF16, NULL, 0) == TS_OK) {
        assert_int_equal(m.param_lp.dtype, TS_BF16);
        float *vb = velocity(&m, 4, 5);
        assert_memory_not_equal(vb, v1, (size_t)n * sizeof *v1);
        assert_int_equal(ts_dit_set_precision(&m, TS_PREC_F16, NULL, 0), TS_OK);
        assert_int_equal(m.param_lp.dtype, TS_F16);
        free(v2);
        v2 = velocity(&m, 4, 5);
        assert_memory_equal(v1, v2, (size_t)n * sizeof *v1);
        free(vb);
    }
    free(v1), free(v2);
    ts_dit_free(&m);
}

/* With --expect-refusal: bf16 must be refused, with a reason, and the model must stay f32. */
static int expect_refusal(void) {
    ts_engine_t e;
    if (tu_engine_init_cpu(&e) != TS_OK)
        return 1;
    char why[256] = "";
    int rc = ts_engine_precision_check(&e, TS_PREC_BF16, why, sizeof why);
    ts_dit_config_t cfg;
    ts_dit_t m;
    int ok = rc == TS_ENOTSUP && why[0];
    if (ok && ts_dit_config_preset("mini", &cfg) == TS_OK &&
        ts_dit_create(&m, &cfg, &e, 1, 0) == 0) {
        char why2[256] = "";
        ok = ts_dit_set_precision(&m, TS_PREC_BF16, why2, sizeof why2) == TS_ENOTSUP &&
             m.precision == TS_PREC_F32 && strcmp(why, why2) == 0;
        ts_dit_free(&m);
    }
    printf("test_bf16 --expect-refusal: %s (%s)\n", ok ? "refused as expected" : "NOT refused",
           why);
    ts_engine_free(&e);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--expect-refusal") == 0)
        return expect_refusal();
    if (argc > 1 && strcmp(argv[1], "--f16") == 0) { /* runs on every CPU: no skip */
        LP = &F16;
        const struct CMUnitTest f16[] = {
            cmocka_unit_test(test_linear),
            cmocka_unit_test(test_matmul),
            cmocka_unit_test(test_attention),
            cmocka_unit_test(test_dit_forward),
            cmocka_unit_test(test_f16_edges),
            cmocka_unit_test(test_f16_refusals),
            cmocka_unit_test(test_dit_lp_activations),
            cmocka_unit_test(test_linear_gelu_lp),
            cmocka_unit_test(test_lp_inputs),
        };
        return cmocka_run_group_tests(f16, tu_setup_cpu_engine, tu_teardown_cpu_engine);
    }
    int skip = tu_bf16_or_skip("test_bf16");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),         cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_attention),      cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_dit_forward),    cmocka_unit_test(test_dit_lp_activations),
        cmocka_unit_test(test_linear_gelu_lp), cmocka_unit_test(test_lp_inputs),
    };
    return cmocka_run_group_tests(tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
