/*
 * test_bf16_train.c — bf16 training (ts_dit_set_precision on a trainable model, the bf16 linear
 * backward of kernels/cpu/cpu_bf16.c, the refresh of the bf16 weights in model/trainer.c); run as
 * `test_bf16_train --f16` (ctest's test_f16_train), the same for f16 training (the emulated f16
 * backward of kernels/cpu/cpu_f16.c) and its dynamic loss scaling.
 *
 * Tolerances, and why:
 *   linear backward    against a naive loop over the same operands rounded to bf16, accumulated
 *                      in double, added to the gradient's previous value: a bf16·bf16 product is
 *                      exact in fp32, so the only error is fp32 accumulation (oneDNN's order) and
 *                      the one add: |got − ref| ≤ 1e-5 · (Σ_k |a_k·b_k| + |previous|) + 1e-7.
 *                      dbias is computed in fp32 from the fp32 dout: equal to the fp32 path's.
 *   DiT gradients      bf16 training step against the fp32 one, same weights and batch: the
 *                      relative L2 error of the whole gradient ≤ 1e-2. Why that bound: each product
 *                      rounds its operands to bf16 (8 bits of mantissa, 2^-9 relative each), the
 *                      errors of independent roundings add in quadrature along a sum of K terms,
 *                      so one product's output carries ~2^-9 ≈ 2e-3 relative; a gradient passes
 *                      through ~3·depth products forward and back, partly averaging out. The
 *                      forward alone was measured at ~5e-3 (test_bf16); 1e-2 is twice that, and
 *                      far below the gradient's own step-to-step noise (a different batch
 *                      changes it by O(1) relative). Each tensor's own error ≤ 5e-2 (the small
 *                      ones, few products deep, are noisier in relative terms).
 * Also: the loss falls over 50 bf16 steps on a small config; the masters, gradients, moments and
 * EMA are F32 and the bf16 copy equals the masters rounded after every step (and a step changes
 * it); a checkpoint of a bf16 run resumes bit-identically in bf16; a model that went bf16 and
 * back to f32 trains bit for bit as one that never left f32.
 *
 * f16: the gradients are taken as the trainer takes them (the loss scaled by 2^16, the gradient
 * divided by it) and held to 2e-3 (each tensor 1e-2): f16 rounds to 2^-12, eight times finer
 * than bf16. Its loss scale: an overflowing step (scale 2^40) changes no parameter, counts as
 * skipped and halves the scale; TS_LOSS_SCALE_INTERVAL good steps double it; a resumed run
 * continues with the checkpoint's scale, bit for bit.
 *
 * A machine that cannot run bf16 skips (exit 77) with the reason; `--expect-refusal` (ctest runs
 * it with DNNL_MAX_CPU_ISA=AVX2) checks that a trainable model and the bf16 linear backward are
 * refused with the reason of ts_engine_precision_check.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "model/dit.h"
#include "model/trainer.h"
#include "tests/testutil.h"

/* The precision under test (bf16, or f16 with --f16) and its rounding and tolerances. */
static ts_precision_t P = TS_PREC_BF16;
static ts_dtype_t DT = TS_BF16;
static float SCALE = 1.0f;              /* the loss scale the gradients are taken with */
static double TOL_ALL = 1e-2, TOL_EACH = 5e-2;
static float bf(float x) {
    return DT == TS_F16 ? ts_f16_to_f32(ts_f32_to_f16(x)) : ts_bf16_to_f32(ts_f32_to_bf16(x));
}

/* ---- the linear backward against the naive loop ----------------------------------------- */

/* Checks got (R, C) = prev + bf16(A) (R, I) · bf16(B) (I, C), element (r, i) of A at
 * a[r·ars + i·acs] and (i, c) of B at b[i·brs + c·bcs]; returns the largest error. */
static double check_acc(const float *got, const float *prev, const float *a, int64_t ars,
                        int64_t acs, const float *b, int64_t brs, int64_t bcs, int64_t R, int64_t C,
                        int64_t I, const char *what) {
    double worst = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            double acc = 0, mag = 0;
            for (int64_t i = 0; i < I; i++) {
                double t = (double)bf(a[r * ars + i * acs]) * (double)bf(b[i * brs + c * bcs]);
                acc += t, mag += fabs(t);
            }
            double want = (double)prev[r * C + c] + acc, err = fabs((double)got[r * C + c] - want);
            if (err > 1e-5 * (mag + fabs((double)prev[r * C + c])) + 1e-7)
                fail_msg("%s (%lld, %lld) of %lldx%lld·%lld: %.9g, want %.9g", what, (long long)r,
                         (long long)c, (long long)R, (long long)C, (long long)I, got[r * C + c],
                         want);
            worst = err > worst ? err : worst;
        }
    return worst;
}

static void test_linear_backward(void **state) {
    ts_engine_t *e = *state;
    /* rows × out × in: tiny's fc1 at b8 (row split), the adaLN at b64 (few rows: a column
     * split), the final linear (few outputs: dweight split by columns), an odd shape */
    static const int64_t shapes[][3] = {
        {392, 512, 128}, {64, 768, 128}, {3136, 16, 128}, {77, 33, 19}};
    tu_rng_t r = {23};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        ts_tensor_t inp, w, wb, dout, dinp, dw, db, db32;
        tu_alloc_f32(&inp, 2, TS_SHAPE(M, K));
        tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
        tu_alloc_f32(&dout, 2, TS_SHAPE(M, N));
        tu_alloc_f32(&dinp, 2, TS_SHAPE(M, K));
        tu_alloc_f32(&dw, 2, TS_SHAPE(N, K));
        tu_alloc_f32(&db, 1, TS_SHAPE(N));
        tu_alloc_f32(&db32, 1, TS_SHAPE(N));
        tu_fill_uniform(&r, &inp, -1.0f, 1.0f);
        tu_fill_uniform(&r, &w, -1.0f, 1.0f);
        tu_fill_uniform(&r, &dout, -1.0f, 1.0f);
        tu_fill_uniform(&r, &dinp, -1.0f, 1.0f); /* the backward accumulates */
        tu_fill_uniform(&r, &dw, -1.0f, 1.0f);
        assert_int_equal(ts_zero(e, &db), TS_OK);
        assert_int_equal(ts_zero(e, &db32), TS_OK);
        float *dinp_prev = tu_host_copy(&dinp), *dw_prev = tu_host_copy(&dw);
        assert_int_equal(ts_tensor_alloc(&wb, DT, TS_CPU, 2, TS_SHAPE(N, K)), TS_OK);
        assert_int_equal(ts_convert(e, &wb, &w), TS_OK);
        assert_int_equal(ts_linear_backward(e, &dinp, &dw, &db, &dout, &inp, &wb), TS_OK);
        assert_int_equal(ts_linear_backward(e, NULL, NULL, &db32, &dout, &inp, &w), TS_OK);
        assert_memory_equal(tu_f32(&db), tu_f32(&db32), (size_t)N * sizeof(float));
        const float *a = tu_f32(&dout), *x = tu_f32(&inp), *W = tu_f32(&w);
        /* dinp (M, K) += dout (M, N) · W (N, K); dw (N, K) += doutᵀ (N, M) · inp (M, K) */
        double worst_x = check_acc(tu_f32(&dinp), dinp_prev, a, N, 1, W, K, 1, M, K, N, "dinp");
        double worst_w = check_acc(tu_f32(&dw), dw_prev, a, 1, N, x, K, 1, N, K, M, "dweight");
        printf("  %s linear backward %4lldx%4lldx%4lld: max |diff| dinp %.3g, dweight %.3g\n",
               ts_precision_name(P), (long long)M, (long long)N, (long long)K, worst_x, worst_w);
        free(dinp_prev), free(dw_prev);
        TU_FREE_TENSORS(&inp, &w, &wb, &dout, &dinp, &dw, &db, &db32);
    }
}

/* ---- the DiT's gradients, bf16 against fp32 --------------------------------------------- */

/* A trainable `tiny` DiT with every parameter N(0, 0.05) (DiT's init zeroes the adaLN and final
 * layers, whose gradients would then mostly vanish). */
static void make_model(ts_engine_t *e, ts_dit_t *m, int max_batch) {
    ts_dit_config_t cfg;
    assert_int_equal(ts_dit_config_preset("tiny", &cfg), TS_OK);
    assert_int_equal(ts_dit_create(m, &cfg, e, max_batch, 1), TS_OK);
    assert_int_equal(ts_rng_normal(e, &m->param_mem, 7, 0), TS_OK);
    assert_int_equal(ts_scale(e, &m->param_mem, 0.05f), TS_OK);
}

/* The gradient of mean((v − target)²) for a fixed batch, at the model's precision (host copy),
 * taken with the loss scaled by scale and divided by it afterwards, as the trainer does. */
static float *gradient(ts_dit_t *m, int B, float scale) {
    const ts_dit_config_t *c = &m->cfg;
    ts_engine_t *e = m->eng;
    ts_tensor_t x, t, target, dv, loss, v;
    const int64_t *img = TS_SHAPE(B, c->in_channels, c->input_size, c->input_size);
    tu_alloc_f32(&x, 4, img);
    tu_alloc_f32(&target, 4, img);
    tu_alloc_f32(&dv, 4, img);
    tu_alloc_f32(&t, 1, TS_SHAPE(B));
    tu_alloc_f32(&loss, 1, TS_SHAPE(1));
    assert_int_equal(ts_rng_normal(e, &x, 3, 0), TS_OK);
    assert_int_equal(ts_rng_normal(e, &target, 4, 0), TS_OK);
    int32_t y[64];
    for (int b = 0; b < B; b++) {
        tu_f32(&t)[b] = (float)(b + 1) / (float)(B + 1);
        y[b] = b % (c->num_classes + 1);
    }
    assert_int_equal(ts_dit_forward(m, &x, &t, y, B, &v), TS_OK);
    assert_int_equal(ts_mse_forward(e, &loss, &v, &target), TS_OK);
    assert_int_equal(ts_zero(e, &dv), TS_OK);
    assert_int_equal(ts_mse_backward(e, &dv, scale, &v, &target), TS_OK);
    assert_int_equal(ts_dit_zero_grad(m), TS_OK);
    assert_int_equal(ts_dit_backward(m, &dv, B), TS_OK);
    TU_FREE_TENSORS(&x, &t, &target, &dv, &loss);
    float *g = tu_host_copy(&m->grad_mem);
    for (int64_t i = 0; i < m->num_params; i++)
        g[i] /= scale; /* a power of two: exact */
    return g;
}

static double rel_l2(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d, den += (double)want[i] * (double)want[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
}

static void test_gradients_vs_f32(void **state) {
    ts_engine_t *e = *state;
    ts_dit_t m;
    make_model(e, &m, 8);
    float *g32 = gradient(&m, 8, 1.0f);
    char why[256] = "";
    assert_int_equal(ts_dit_set_precision(&m, P, why, sizeof why), TS_OK);
    float *g16 = gradient(&m, 8, SCALE);
    double all = rel_l2(g16, g32, m.num_params), worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < m.n_params; i++) {
        const ts_dit_param_info_t *p = &m.info[i];
        double r = rel_l2(g16 + p->offset, g32 + p->offset, p->numel);
        if (r > worst)
            worst = r, worst_name = p->name;
        if (r > TOL_EACH)
            fail_msg("%s: gradient relative L2 %.3g > %.3g", p->name, r, TOL_EACH);
    }
    printf("  tiny b8 gradient %s vs f32: relative L2 %.3g (worst tensor %s %.3g)\n",
           ts_precision_name(P), all, worst_name, worst);
    assert_true(all <= TOL_ALL);
    assert_true(all > 0.0); /* the 16-bit path really ran */
    /* back to f32: the gradient is the fp32 one, bit for bit */
    assert_int_equal(ts_dit_set_precision(&m, TS_PREC_F32, NULL, 0), TS_OK);
    float *back = gradient(&m, 8, 1.0f);
    assert_memory_equal(back, g32, (size_t)m.num_params * sizeof *back);
    free(g32), free(g16), free(back);
    ts_dit_free(&m);
}

/* n values of t rounded to DT */
static void round_to(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = ts_f32_to_lp(src[i], DT == TS_F16);
}

/* A backward's dout rounded by its producer (16-bit activations): GELU's and gate_residual's
 * backwards give the fp32 op's bits and their result rounded (the += onto a gradient that was
 * not zero); a linear's backward reading that dout16 gives the bits of the one that rounds dout
 * itself — and reads it: a dout16 of 2·dout doubles dinp and dweight (exact) and not dbias, which
 * sums the fp32 dout. The refusals. */
static void test_lp_dout(void **state) {
    ts_engine_t *e = *state;
    const int64_t B = 3, T = 5, C = 8, Nn = B * T * C, H = 12;
    tu_rng_t r = {53};
    ts_tensor_t g0, g1, dout, inp, y, mod, dres0, dres1, dmod0, dmod1, g16, want16;
    tu_alloc_f32(&g0, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&g1, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&dout, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&inp, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&y, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&mod, 2, TS_SHAPE(B, 6 * C));
    tu_alloc_f32(&dres0, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&dres1, 3, TS_SHAPE(B, T, C));
    tu_alloc_f32(&dmod0, 2, TS_SHAPE(B, 6 * C));
    tu_alloc_f32(&dmod1, 2, TS_SHAPE(B, 6 * C));
    ts_tensor_t *rnd[] = {&g0, &dout, &inp, &y, &mod, &dres0, &dmod0};
    for (size_t i = 0; i < sizeof rnd / sizeof rnd[0]; i++)
        tu_fill_uniform(&r, rnd[i], -2, 2);
    assert_int_equal(ts_tensor_alloc(&g16, DT, TS_CPU, 3, TS_SHAPE(B, T, C)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&want16, DT, TS_CPU, 3, TS_SHAPE(B, T, C)), TS_OK);
    size_t nb = (size_t)Nn * sizeof(float);
    /* GELU's backward */
    memcpy(g1.data, g0.data, nb);
    assert_int_equal(ts_gelu_backward(e, &g0, &dout, &inp), TS_OK);
    assert_int_equal(ts_gelu_backward_lp(e, &g1, &g16, &dout, &inp), TS_OK);
    assert_memory_equal(g1.data, g0.data, nb);
    round_to(want16.data, g0.data, Nn);
    assert_memory_equal(g16.data, want16.data, (size_t)Nn * 2);
    /* gate_residual's backward, all three gradients */
    memcpy(g1.data, g0.data, nb);
    memcpy(dres1.data, dres0.data, nb);
    memcpy(dmod1.data, dmod0.data, (size_t)(B * 6 * C) * sizeof(float));
    assert_int_equal(ts_gate_residual_backward(e, &dres0, &g0, &dmod0, &dout, &y, &mod, 5), TS_OK);
    assert_int_equal(ts_gate_residual_backward_lp(e, &dres1, &g1, &g16, &dmod1, &dout, &y, &mod, 5),
                     TS_OK);
    assert_memory_equal(g1.data, g0.data, nb);
    assert_memory_equal(dres1.data, dres0.data, nb);
    assert_memory_equal(dmod1.data, dmod0.data, (size_t)(B * 6 * C) * sizeof(float));
    round_to(want16.data, g0.data, Nn);
    assert_memory_equal(g16.data, want16.data, (size_t)Nn * 2);
    /* a linear (C → H) of a 16-bit input, its dout (B, T, H) rounded by the producer */
    ts_tensor_t x16, w, w16, lo, lo16, lo2, di[3], dw[3], db[3];
    tu_alloc_f32(&w, 2, TS_SHAPE(H, C));
    tu_alloc_f32(&lo, 3, TS_SHAPE(B, T, H));
    tu_alloc_f32(&lo2, 3, TS_SHAPE(B, T, H));
    tu_fill_uniform(&r, &w, -1, 1);
    tu_fill_uniform(&r, &lo, -1, 1);
    assert_int_equal(ts_tensor_alloc(&x16, DT, TS_CPU, 3, TS_SHAPE(B, T, C)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&w16, DT, TS_CPU, 2, TS_SHAPE(H, C)), TS_OK);
    assert_int_equal(ts_tensor_alloc(&lo16, DT, TS_CPU, 3, TS_SHAPE(B, T, H)), TS_OK);
    assert_int_equal(ts_convert(e, &x16, &inp), TS_OK);
    assert_int_equal(ts_convert(e, &w16, &w), TS_OK);
    for (int k = 0; k < 3; k++) {
        tu_alloc_f32(&di[k], 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&dw[k], 2, TS_SHAPE(H, C));
        tu_alloc_f32(&db[k], 1, TS_SHAPE(H));
        assert_int_equal(ts_zero(e, &di[k]), TS_OK); /* (allocations may be poisoned) */
        assert_int_equal(ts_zero(e, &dw[k]), TS_OK);
        assert_int_equal(ts_zero(e, &db[k]), TS_OK);
    }
    assert_int_equal(ts_linear_backward(e, &di[0], &dw[0], &db[0], &lo, &x16, &w16), TS_OK);
    round_to(lo16.data, lo.data, B * T * H);
    assert_int_equal(ts_linear_backward_lp(e, &di[1], &dw[1], &db[1], &lo, &lo16, &x16, &w16),
                     TS_OK);
    assert_memory_equal(di[1].data, di[0].data, nb);
    assert_memory_equal(dw[1].data, dw[0].data, (size_t)(H * C) * sizeof(float));
    assert_memory_equal(db[1].data, db[0].data, (size_t)H * sizeof(float));
    for (int64_t i = 0; i < B * T * H; i++)
        tu_f32(&lo2)[i] = 2.0f * tu_f32(&lo)[i];
    round_to(lo16.data, lo2.data, B * T * H);
    assert_int_equal(ts_zero(e, &di[1]), TS_OK);
    assert_int_equal(ts_zero(e, &dw[1]), TS_OK);
    assert_int_equal(ts_zero(e, &db[1]), TS_OK);
    assert_int_equal(ts_linear_backward(e, &di[2], &dw[2], NULL, &lo2, &x16, &w16), TS_OK);
    assert_int_equal(ts_linear_backward_lp(e, &di[1], &dw[1], &db[1], &lo, &lo16, &x16, &w16),
                     TS_OK);
    assert_memory_equal(di[1].data, di[2].data, nb);
    assert_memory_equal(dw[1].data, dw[2].data, (size_t)(H * C) * sizeof(float));
    assert_memory_equal(db[1].data, db[0].data, (size_t)H * sizeof(float));
    /* the fused attention's backward (bf16 on a CPU with AVX-512 BF16): its copy of dqkv */
    if (ts_attention_fused_lp_check(e, DT) == TS_OK) {
        const int64_t Ta = 21, Ca = 16, Ha = 2;
        ts_tensor_t qkv, o, lse, dq0, dq1, dq16, want_q;
        tu_alloc_f32(&qkv, 3, TS_SHAPE(2, Ta, 3 * Ca));
        tu_alloc_f32(&o, 3, TS_SHAPE(2, Ta, Ca));
        tu_alloc_f32(&lse, 3, TS_SHAPE(2, Ha, Ta));
        tu_alloc_f32(&dq0, 3, TS_SHAPE(2, Ta, 3 * Ca));
        tu_alloc_f32(&dq1, 3, TS_SHAPE(2, Ta, 3 * Ca));
        assert_int_equal(ts_tensor_alloc(&dq16, DT, TS_CPU, 3, TS_SHAPE(2, Ta, 3 * Ca)), TS_OK);
        assert_int_equal(ts_tensor_alloc(&want_q, DT, TS_CPU, 3, TS_SHAPE(2, Ta, 3 * Ca)), TS_OK);
        tu_fill_uniform(&r, &qkv, -1, 1);
        tu_fill_uniform(&r, &dq0, -1, 1);
        memcpy(dq1.data, dq0.data, ts_tensor_nbytes(&dq0));
        ts_tensor_t dao; /* the gradient of the attention's output */
        tu_alloc_f32(&dao, 3, TS_SHAPE(2, Ta, Ca));
        tu_fill_uniform(&r, &dao, -1, 1);
        assert_int_equal(ts_attention_fused_forward_lp(e, DT, &o, &lse, &qkv, (int)Ha), TS_OK);
        /* the forward writing its output twice (training's proj input): the same fp32 bits, and
         * those rounded */
        ts_tensor_t o2, o16, o_over;
        tu_alloc_f32(&o2, 3, TS_SHAPE(2, Ta, Ca));
        assert_int_equal(ts_tensor_alloc(&o16, DT, TS_CPU, 3, TS_SHAPE(2, Ta, Ca)), TS_OK);
        assert_int_equal(ts_attention_fused_forward_lp_both(e, DT, &o2, &o16, NULL, &qkv, (int)Ha),
                         TS_OK);
        assert_memory_equal(o2.data, o.data, ts_tensor_nbytes(&o));
        uint16_t *want_o = malloc(ts_tensor_nbytes(&o16));
        assert_non_null(want_o);
        round_to(want_o, o.data, ts_tensor_numel(&o));
        assert_memory_equal(o16.data, want_o, ts_tensor_nbytes(&o16));
        free(want_o);
        assert_int_equal(ts_tensor_wrap(&o_over, o2.data, DT, TS_CPU, 3, TS_SHAPE(2, Ta, Ca)),
                         TS_OK);
        assert_int_equal(
            ts_attention_fused_forward_lp_both(e, DT, &o2, &o_over, NULL, &qkv, (int)Ha),
            TS_EINVAL);
        assert_int_equal(ts_attention_fused_forward_lp_both(e, DT, &o2, NULL, NULL, &qkv, (int)Ha),
                         TS_EINVAL);
        TU_FREE_TENSORS(&o2, &o16);
        assert_int_equal(
            ts_attention_fused_backward_lp(e, DT, &dq0, NULL, &dao, &qkv, &o, &lse, (int)Ha),
            TS_OK);
        assert_int_equal(
            ts_attention_fused_backward_lp(e, DT, &dq1, &dq16, &dao, &qkv, &o, &lse, (int)Ha),
            TS_OK);
        assert_memory_equal(dq1.data, dq0.data, ts_tensor_nbytes(&dq0));
        round_to(want_q.data, dq0.data, ts_tensor_numel(&dq0));
        assert_memory_equal(dq16.data, want_q.data, ts_tensor_nbytes(&dq16));
        ts_tensor_t over_q; /* a copy over dqkv: refused */
        assert_int_equal(ts_tensor_wrap(&over_q, dq1.data, DT, TS_CPU, 3, TS_SHAPE(2, Ta, 3 * Ca)),
                         TS_OK);
        assert_int_equal(
            ts_attention_fused_backward_lp(e, DT, &dq1, &over_q, &dao, &qkv, &o, &lse, (int)Ha),
            TS_EINVAL);
        printf("  %s fused attention backward: its dqkv copy is dqkv rounded\n",
               ts_precision_name(P));
        TU_FREE_TENSORS(&qkv, &o, &lse, &dq0, &dq1, &dq16, &want_q, &dao);
    }
    /* refusals: no dout16, a dout16 beside an fp32 input, of the other dtype or another size; a
     * 16-bit copy over its gradient; gate_residual's without dy */
    ts_tensor_t other, small, over;
    assert_int_equal(
        ts_tensor_alloc(&other, DT == TS_F16 ? TS_BF16 : TS_F16, TS_CPU, 3, TS_SHAPE(B, T, H)),
        TS_OK);
    assert_int_equal(ts_tensor_wrap(&small, lo16.data, DT, TS_CPU, 3, TS_SHAPE(B, T, H - 1)),
                     TS_OK);
    assert_int_equal(ts_tensor_wrap(&over, g1.data, DT, TS_CPU, 3, TS_SHAPE(B, T, C)), TS_OK);
    assert_int_equal(ts_linear_backward_lp(e, &di[1], &dw[1], NULL, &lo, NULL, &x16, &w16),
                     TS_EINVAL);
    assert_int_equal(ts_linear_backward_lp(e, &di[1], &dw[1], NULL, &lo, &lo16, &inp, &w16),
                     TS_EDTYPE);
    assert_int_equal(ts_linear_backward_lp(e, &di[1], &dw[1], NULL, &lo, &other, &x16, &w16),
                     TS_EDTYPE);
    assert_int_equal(ts_linear_backward_lp(e, &di[1], &dw[1], NULL, &lo, &small, &x16, &w16),
                     TS_ESHAPE);
    ts_tensor_t on_dinp; /* a dout16 in dinp's memory: the product would write over it */
    assert_int_equal(ts_tensor_wrap(&on_dinp, di[1].data, DT, TS_CPU, 3, TS_SHAPE(B, T, H)), TS_OK);
    assert_true(ts_tensor_nbytes(&on_dinp) <= ts_tensor_nbytes(&di[1]));
    assert_int_equal(ts_linear_backward_lp(e, &di[1], &dw[1], NULL, &lo, &on_dinp, &x16, &w16),
                     TS_EINVAL);
    assert_int_equal(ts_gelu_backward_lp(e, &g1, &over, &dout, &inp), TS_EINVAL);
    assert_int_equal(ts_gate_residual_backward_lp(e, NULL, &g1, &over, NULL, &dout, &y, &mod, 5),
                     TS_EINVAL);
    assert_int_equal(ts_gate_residual_backward_lp(e, NULL, NULL, &g16, NULL, &dout, &y, &mod, 5),
                     TS_EINVAL);
    printf("  %s: the dout rounded by its producer gives the same gradients, and is read\n",
           ts_precision_name(P));
    for (int k = 0; k < 3; k++)
        TU_FREE_TENSORS(&di[k], &dw[k], &db[k]);
    TU_FREE_TENSORS(&g0, &g1, &dout, &inp, &y, &mod, &dres0, &dres1, &dmod0, &dmod1, &g16, &want16,
                    &x16, &w, &w16, &lo, &lo16, &lo2, &other);
}

/* 16-bit activations in training (ts_dit_set_lp_activations on a trainable model): the linears'
 * inputs kept in 16 bits give the gradient, and the forward, of the fp32-kept run bit for bit; the
 * kept buffers (a block's mod2, GELU's output, the final linear's input, the conditioning the
 * adaLN linears read) hold the fp32 run's
 * values rounded. A 16-bit input beside a weight of another dtype is refused by the backward. */
static void test_lp_activations_train(void **state) {
    ts_engine_t *e = *state;
    ts_dit_t m;
    make_model(e, &m, 8);
    char why[256] = "";
    assert_int_equal(ts_dit_set_precision(&m, P, why, sizeof why), TS_OK);
    assert_false(m.lp_acts); /* a CPU model starts off */
    int T = ts_dit_tokens(&m.cfg);
    int64_t nm = 8 * (int64_t)T * m.cfg.hidden_size, ng = 4 * nm; /* mod2's, GELU's elements */
    float *g32 = gradient(&m, 8, SCALE);
    const ts_dit_block_acts_t *A = &m.acts.blocks[1];
    float *mod32 = tu_host_copy(&A->mod2), *gelu32 = tu_host_copy(&A->gelu);
    float *fx32 = tu_host_copy(&m.acts.fx), *c32 = tu_host_copy(&m.acts.c_silu);
    float *atty32 = tu_host_copy(&A->atty); /* the composed attention's output, proj's input */
    ts_dit_set_lp_activations(&m, 1);
    float *g16 = gradient(&m, 8, SCALE);
    assert_memory_equal(g16, g32, (size_t)m.num_params * sizeof *g16);
    const struct {
        const char *name;
        const float *want;
        const void *got;
        int64_t n;
    } kept[] = {{"mod2", mod32, A->mod2.data, nm},
                {"gelu", gelu32, A->gelu.data, ng},
                {"fx", fx32, m.acts.fx.data, nm},
                {"c_silu", c32, m.acts.c_silu.data, 8 * (int64_t)m.cfg.hidden_size},
                {"atty", atty32, A->atty.data, nm}};
    for (size_t k = 0; k < sizeof kept / sizeof kept[0]; k++)
        for (int64_t i = 0; i<kept[k].n; i += kept[k].n> 4096 ? 89 : 1) {
            uint16_t got = ((const uint16_t *)kept[k].got)[i];
            uint16_t want =
                DT == TS_BF16 ? ts_f32_to_bf16(kept[k].want[i]) : ts_f32_to_f16(kept[k].want[i]);
            if (got != want)
                fail_msg("%s[%lld] is 0x%04x, the fp32-kept run's value rounded is 0x%04x",
                         kept[k].name, (long long)i, got, want);
        }
    /* the backward refuses a 16-bit input beside an fp32 weight */
    ts_tensor_t x16, w, dw, dout;
    assert_int_equal(ts_tensor_alloc(&x16, DT, TS_CPU, 2, TS_SHAPE(3, 8)), TS_OK);
    tu_alloc_f32(&w, 2, TS_SHAPE(4, 8));
    tu_alloc_f32(&dw, 2, TS_SHAPE(4, 8));
    tu_alloc_f32(&dout, 2, TS_SHAPE(3, 4));
    assert_int_not_equal(ts_linear_backward(e, NULL, &dw, NULL, &dout, &x16, &w), TS_OK);
    TU_FREE_TENSORS(&x16, &w, &dw, &dout);
    /* with the fused attention (bf16 on a CPU with AVX-512 BF16), whose backward writes qkv's
     * dout rounded too: the gradient of 16-bit activations is the fp32-kept one's, bit for bit */
    if (ts_dit_set_attention(&m, TS_ATTN_FUSED) == TS_OK) {
        ts_dit_set_lp_activations(&m, 0);
        float *f32 = gradient(&m, 8, SCALE);
        float *att32 = tu_host_copy(&m.acts.blocks[1].atty);
        ts_dit_set_lp_activations(&m, 1);
        float *f16 = gradient(&m, 8, SCALE);
        assert_memory_equal(f16, f32, (size_t)m.num_params * sizeof *f16);
        /* proj's input kept in 16 bits beside the fp32 output the backward reads */
        const uint16_t *att16 = m.acts.blocks[1].atty16.data;
        for (int64_t i = 0; i < nm; i += 7)
            if (att16[i] != ts_f32_to_lp(att32[i], DT == TS_F16))
                fail_msg("atty16[%lld] is 0x%04x, the fp32 run's atty rounded is 0x%04x",
                         (long long)i, att16[i], ts_f32_to_lp(att32[i], DT == TS_F16));
        free(att32);
        printf("  %s, fused attention: the gradient with 16-bit activations bit for bit\n",
               ts_precision_name(P));
        free(f32), free(f16);
    }
    printf("  %s training with 16-bit activations: the gradient bit for bit\n",
           ts_precision_name(P));
    free(g32), free(g16), free(mod32), free(gelu32), free(fx32), free(c32), free(atty32);
    ts_dit_free(&m);
}

/* A trainable model's 16-bit rooms (gacts.dout16, the blocks' atty16 beside the flash attention)
 * are laid out at bf16 / f16 only, in an arena of their own: none at f32, there from
 * ts_dit_set_precision(P) on (and with the fused attention where it runs), gone again back at
 * f32 — the activations' arena never moved by it (a move would want both at once: a DiT-XL/2 at
 * batch 64 has ~48 GiB of them) —; and a gradient at P after the round trip is the one before
 * it, bit for bit. */
static void test_lp_rooms(void **state) {
    ts_engine_t *e = *state;
    ts_dit_t m;
    make_model(e, &m, 8);
    const ts_dit_config_t *c = &m.cfg;
    int T = ts_dit_tokens(c), h = c->hidden_size, r = c->mlp_ratio * h;
    void *acts = m.arena.base;
    size_t cap0 = m.arena.cap;
    assert_null(m.gacts.dout16.data);
    assert_int_equal(m.rooms.cap, 0);
    assert_int_equal(ts_dit_set_attention(&m, TS_ATTN_FUSED), TS_OK);
    for (int l = 0; l < c->depth; l++)
        assert_null(m.acts.blocks[l].atty16.data);
    assert_int_equal(m.rooms.cap, 0);
    assert_int_equal(ts_dit_set_attention(&m, TS_ATTN_COMPOSED), TS_OK);
    assert_int_equal(m.arena.cap, cap0);
    acts = m.arena.base;

    assert_int_equal(ts_dit_set_precision(&m, P, NULL, 0), TS_OK);
    ts_dit_set_lp_activations(&m, 1);
    assert_int_equal(m.attn, TS_ATTN_COMPOSED); /* a trainable model's default */
    assert_ptr_equal(m.arena.base, acts);       /* not laid out again */
    size_t room = (size_t)8 * T * (r > 3 * h ? r : 3 * h) * 2;
    assert_non_null(m.gacts.dout16.data);
    assert_true(ts_tensor_nbytes(&m.gacts.dout16) == room);
    assert_true(m.rooms.cap >= room && m.rooms.cap <= room + TS_ALIGN);
    float *g1 = gradient(&m, 8, SCALE);
    if (ts_dit_set_attention(&m, TS_ATTN_FUSED) == TS_OK) { /* bf16 with AVX-512 BF16 */
        size_t att = (size_t)8 * T * h * 2;
        for (int l = 0; l < c->depth; l++) {
            assert_non_null(m.acts.blocks[l].atty16.data);
            assert_true(ts_tensor_nbytes(&m.acts.blocks[l].atty16) == att);
        }
        size_t want = room + c->depth * att;
        assert_true(m.rooms.cap >= want && m.rooms.cap <= want + (c->depth + 1) * TS_ALIGN);
        float *gf = gradient(&m, 8, SCALE); /* reads atty16 and dout16 */
        assert_true(rel_l2(gf, g1, m.num_params) < TOL_ALL);
        free(gf);
        assert_int_equal(ts_dit_set_attention(&m, TS_ATTN_COMPOSED), TS_OK);
        assert_null(m.acts.blocks[0].atty16.data);
        printf("  %s: the fused attention's atty16 laid out in every block\n",
               ts_precision_name(P));
    }
    acts = m.arena.base;
    assert_int_equal(ts_dit_set_precision(&m, TS_PREC_F32, NULL, 0), TS_OK);
    assert_null(m.gacts.dout16.data);
    assert_int_equal(m.rooms.cap, 0);
    assert_ptr_equal(m.arena.base, acts);
    assert_int_equal(m.arena.cap, cap0);
    assert_int_equal(ts_dit_set_precision(&m, P, NULL, 0), TS_OK);
    float *g2 = gradient(&m, 8, SCALE);
    assert_memory_equal(g2, g1, (size_t)m.num_params * sizeof *g1);
    printf("  %s: the 16-bit rooms (%zu bytes of dout16) laid out only at %s, the activations "
           "left where they were\n",
           ts_precision_name(P), room, ts_precision_name(P));
    free(g1), free(g2);
    ts_dit_free(&m);
}

/* ---- training runs ---------------------------------------------------------------------- */

static ts_dit_config_t small_config(void) {
    ts_dit_config_t c = {.input_size = 8,
                         .in_channels = 1,
                         .patch_size = 2,
                         .hidden_size = 64,
                         .depth = 2,
                         .num_heads = 2,
                         .num_classes = 3,
                         .mlp_ratio = 4,
                         .freq_dim = 32};
    return c;
}

typedef struct {
    ts_dataset_t data;
    ts_dit_t model;
    ts_trainer_t tr;
} run_t;

/* A run at precision p: the model, then its precision, then the trainer (as `tessera train`). */
static void run_start(ts_engine_t *e, run_t *r, uint64_t seed, ts_precision_t p) {
    ts_dit_config_t c = small_config();
    tu_quarters_dataset(&r->data, 48);
    assert_int_equal(ts_dit_create(&r->model, &c, e, 16, 1), TS_OK);
    assert_int_equal(ts_dit_init_weights(&r->model, seed), TS_OK);
    char why[256] = "";
    assert_int_equal(ts_dit_set_precision(&r->model, p, why, sizeof why), TS_OK);
    ts_train_config_t tc;
    ts_train_config_default(&tc);
    tc.batch = 16, tc.lr = 3e-3f, tc.warmup = 2, tc.seed = seed;
    assert_int_equal(ts_trainer_init(&r->tr, &r->model, &r->data, &tc), TS_OK);
}

static void run_end(run_t *r) {
    ts_trainer_free(&r->tr);
    ts_dit_free(&r->model);
    ts_dataset_free(&r->data);
}

static void run_steps(run_t *r, int n, float *losses) {
    for (int i = 0; i < n; i++)
        assert_int_equal(ts_trainer_step(&r->tr, &losses[i], NULL), TS_OK);
}

/* The 16-bit copy holds exactly the masters rounded (ts_convert's rounding). */
static void check_copy_fresh(ts_engine_t *e, const ts_dit_t *m) {
    ts_tensor_t want;
    assert_int_equal(ts_tensor_alloc(&want, DT, TS_CPU, 1, TS_SHAPE(m->num_params)), TS_OK);
    assert_int_equal(ts_convert(e, &want, &m->param_mem), TS_OK);
    assert_memory_equal(want.data, m->param_lp.data, ts_tensor_nbytes(&want));
    ts_tensor_free(&want);
}

static void test_loss_falls(void **state) {
    ts_engine_t *e = *state;
    run_t a;
    float l[50];
    run_start(e, &a, 3, P);
    run_steps(&a, 50, l);
    double first = 0, last = 0;
    for (int i = 0; i < 10; i++) {
        first += l[i] / 10.0;
        last += l[40 + i] / 10.0;
    }
    printf("  %s loss: first 10 steps %.4f, last 10 steps %.4f (%lld skipped)\n",
           ts_precision_name(P), first, last, (long long)a.tr.skipped);
    assert_true(last < 0.6 * first);
    run_end(&a);
}

static void test_masters_and_refresh(void **state) {
    ts_engine_t *e = *state;
    run_t a;
    float l[2];
    run_start(e, &a, 4, P);
    ts_dit_t *m = &a.model;
    assert_int_equal(m->precision, P);
    /* the masters and everything the optimiser keeps are fp32; the copy is bf16 */
    assert_int_equal(m->param_mem.dtype, TS_F32);
    assert_int_equal(m->grad_mem.dtype, TS_F32);
    assert_int_equal(a.tr.m_mem.dtype, TS_F32);
    assert_int_equal(a.tr.v_mem.dtype, TS_F32);
    assert_int_equal(a.tr.ema_mem.dtype, TS_F32);
    assert_int_equal(m->param_lp.dtype, DT);
    assert_int_equal(m->wlp.blocks[0].fc1_w.dtype, DT);
    check_copy_fresh(e, m);
    size_t nb = ts_tensor_nbytes(&m->param_lp);
    void *before = malloc(nb);
    assert_non_null(before);
    for (int i = 0; i < 2; i++) {
        memcpy(before, m->param_lp.data, nb);
        run_steps(&a, 1, &l[i]);
        check_copy_fresh(e, m);                                   /* refreshed after the step */
        assert_true(memcmp(before, m->param_lp.data, nb) != 0); /* and the step changed it */
    }
    free(before);
    run_end(&a);
}

static void test_resume_bf16(void **state) {
    ts_engine_t *e = *state;
    char path[256], err[256] = "";
    tu_make_temp_file(path, sizeof path, "tessera-test-bf16-train");
    run_t a, b, c;
    float la[8], lb[8];
    run_start(e, &a, 11, P); /* straight through */
    /* a scale other than the initial one (f16: it must travel with the checkpoint) */
    a.tr.loss_scale = 1048576.0f, a.tr.scale_good = 5;
    run_steps(&a, 8, la);
    run_start(e, &b, 11, P); /* 3 steps, checkpoint, resumed for 5 */
    b.tr.loss_scale = 1048576.0f, b.tr.scale_good = 5;
    run_steps(&b, 3, lb);
    assert_int_equal(ts_trainer_save(&b.tr, path, err, sizeof err), TS_OK);
    float saved_scale = b.tr.loss_scale;
    int64_t saved_good = b.tr.scale_good, saved_skipped = b.tr.skipped;
    run_end(&b);
    run_start(e, &c, 11, P);
    assert_int_equal(ts_trainer_load(&c.tr, path, err, sizeof err), TS_OK);
    assert_int_equal(c.tr.step, 3);
    assert_true(c.tr.loss_scale == saved_scale);
    assert_int_equal(c.tr.scale_good, saved_good);
    assert_int_equal(c.tr.skipped, saved_skipped);
    check_copy_fresh(e, &c.model); /* the loaded masters, rounded */
    run_steps(&c, 5, lb + 3);
    assert_memory_equal(la, lb, sizeof la);
    assert_memory_equal(a.model.param_mem.data, c.model.param_mem.data,
                        ts_tensor_nbytes(&a.model.param_mem));
    assert_memory_equal(a.tr.ema_mem.data, c.tr.ema_mem.data, ts_tensor_nbytes(&a.tr.ema_mem));
    /* the checkpoint holds the fp32 masters: an f32 run loads it too */
    run_t d;
    run_start(e, &d, 11, TS_PREC_F32);
    assert_int_equal(ts_trainer_load(&d.tr, path, err, sizeof err), TS_OK);
    assert_int_equal(d.tr.step, 3);
    run_end(&d);
    run_end(&a);
    run_end(&c);
    unlink(path);
}

static void test_f32_after_bf16(void **state) {
    ts_engine_t *e = *state;
    run_t a, b;
    float la[4], lb[4];
    run_start(e, &a, 5, TS_PREC_F32);
    run_start(e, &b, 5, P);
    assert_int_equal(ts_dit_set_precision(&b.model, TS_PREC_F32, NULL, 0), TS_OK);
    run_steps(&a, 4, la);
    run_steps(&b, 4, lb);
    assert_memory_equal(la, lb, sizeof la);
    assert_memory_equal(a.model.param_mem.data, b.model.param_mem.data,
                        ts_tensor_nbytes(&a.model.param_mem));
    run_end(&a);
    run_end(&b);
}

/* With --expect-refusal: a trainable model refuses bf16 with the engine's reason and stays f32,
 * and the bf16 linear backward answers TS_ENOTSUP. */
static int expect_refusal(void) {
    ts_engine_t e;
    if (tu_engine_init_cpu(&e) != TS_OK)
        return 1;
    char why[256] = "", why2[256] = "";
    int ok = ts_engine_precision_check(&e, TS_PREC_BF16, why, sizeof why) == TS_ENOTSUP && why[0];
    ts_dit_config_t cfg = small_config();
    ts_dit_t m;
    if (ok && ts_dit_create(&m, &cfg, &e, 2, 1) == TS_OK) {
        ok = ts_dit_set_precision(&m, TS_PREC_BF16, why2, sizeof why2) == TS_ENOTSUP &&
             m.precision == TS_PREC_F32 && strcmp(why, why2) == 0;
        ts_dit_free(&m);
    } else
        ok = 0;
    ts_tensor_t w, x, d, dx;
    if (ok && ts_tensor_alloc(&w, TS_BF16, TS_CPU, 2, TS_SHAPE(4, 4)) == TS_OK) {
        tu_alloc_f32(&x, 2, TS_SHAPE(2, 4));
        tu_alloc_f32(&d, 2, TS_SHAPE(2, 4));
        tu_alloc_f32(&dx, 2, TS_SHAPE(2, 4));
        ts_zero(&e, &w), ts_zero(&e, &x), ts_zero(&e, &d), ts_zero(&e, &dx);
        ok = ts_linear_backward(&e, &dx, NULL, NULL, &d, &x, &w) == TS_ENOTSUP;
        TU_FREE_TENSORS(&w, &x, &d, &dx);
    }
    printf("test_bf16_train --expect-refusal: %s (%s)\n",
           ok ? "refused as expected" : "NOT refused", why);
    ts_engine_free(&e);
    return ok ? 0 : 1;
}

/* f16's loss scale: an overflowing step changes nothing but the scale (halved) and the step
 * count; a good step after TS_LOSS_SCALE_INTERVAL - 1 others doubles it. */
static void test_f16_loss_scale(void **state) {
    ts_engine_t *e = *state;
    run_t a;
    float l;
    run_start(e, &a, 6, TS_PREC_F16);
    assert_true(a.tr.loss_scale == TS_LOSS_SCALE_INIT);
    run_steps(&a, 1, &l);
    ts_dit_t *m = &a.model;
    size_t nb = ts_tensor_nbytes(&m->param_mem);
    float *before = tu_host_copy(&m->param_mem), *ema = tu_host_copy(&a.tr.ema_mem);
    float *mom = tu_host_copy(&a.tr.m_mem), *var = tu_host_copy(&a.tr.v_mem);
    a.tr.loss_scale = 1099511627776.0f; /* 2^40: the gradients pass ±65504 in the products */
    float norm = 0.0f;
    assert_int_equal(ts_trainer_step(&a.tr, &l, &norm), TS_OK);
    assert_false(isfinite(norm));
    assert_true(isfinite(l));
    assert_int_equal(a.tr.step, 2);
    assert_int_equal(a.tr.skipped, 1);
    assert_true(a.tr.loss_scale == 549755813888.0f); /* 2^39 */
    assert_int_equal(a.tr.scale_good, 0);
    assert_memory_equal(before, m->param_mem.data, nb); /* nothing moved */
    assert_memory_equal(ema, a.tr.ema_mem.data, nb);
    assert_memory_equal(mom, a.tr.m_mem.data, nb);
    assert_memory_equal(var, a.tr.v_mem.data, nb);
    check_copy_fresh(e, m);
    /* a good step at the end of an interval: the parameters move, the scale doubles */
    a.tr.loss_scale = TS_LOSS_SCALE_INIT;
    a.tr.scale_good = TS_LOSS_SCALE_INTERVAL - 1;
    assert_int_equal(ts_trainer_step(&a.tr, &l, &norm), TS_OK);
    assert_true(isfinite(norm));
    assert_true(memcmp(before, m->param_mem.data, nb) != 0);
    assert_true(a.tr.loss_scale == 2.0f * TS_LOSS_SCALE_INIT);
    assert_int_equal(a.tr.scale_good, 0);
    assert_int_equal(a.tr.skipped, 1);
    printf("  f16 loss scale: an overflowing step skipped (2^40 -> 2^39), a good one doubled it\n");
    free(before), free(ema), free(mom), free(var);
    run_end(&a);

    /* the policy alone: halving, the floor at 1 (a diverged run stops), growth, the cap */
    float sc = 4.0f;
    int64_t good = 7;
    assert_int_equal(ts_loss_scale_next(&sc, &good, 0), 1);
    assert_true(sc == 2.0f && good == 0);
    assert_int_equal(ts_loss_scale_next(&sc, &good, 0), 1);
    assert_true(sc == 1.0f);
    assert_int_equal(ts_loss_scale_next(&sc, &good, 0), TS_ENONFINITE);
    assert_true(sc == 1.0f && good == 0);
    for (int i = 0; i < TS_LOSS_SCALE_INTERVAL - 1; i++)
        assert_int_equal(ts_loss_scale_next(&sc, &good, 1), 0);
    assert_true(sc == 1.0f && good == TS_LOSS_SCALE_INTERVAL - 1);
    assert_int_equal(ts_loss_scale_next(&sc, &good, 1), 0);
    assert_true(sc == 2.0f && good == 0);
    sc = TS_LOSS_SCALE_MAX, good = TS_LOSS_SCALE_INTERVAL - 1;
    assert_int_equal(ts_loss_scale_next(&sc, &good, 1), 0);
    assert_true(sc == TS_LOSS_SCALE_MAX && good == 0);
    assert_int_equal(ts_log2i(TS_LOSS_SCALE_MAX), 24);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--expect-refusal") == 0)
        return expect_refusal();
    if (argc > 1 && strcmp(argv[1], "--f16") == 0) { /* runs on every CPU: no skip */
        P = TS_PREC_F16, DT = TS_F16, SCALE = TS_LOSS_SCALE_INIT, TOL_ALL = 2e-3, TOL_EACH = 1e-2;
        const struct CMUnitTest f16[] = {
            cmocka_unit_test(test_linear_backward), cmocka_unit_test(test_gradients_vs_f32),
            cmocka_unit_test(test_loss_falls),      cmocka_unit_test(test_masters_and_refresh),
            cmocka_unit_test(test_resume_bf16),     cmocka_unit_test(test_f32_after_bf16),
            cmocka_unit_test(test_f16_loss_scale),  cmocka_unit_test(test_lp_activations_train),
            cmocka_unit_test(test_lp_dout),         cmocka_unit_test(test_lp_rooms),
        };
        return cmocka_run_group_tests(f16, tu_setup_cpu_engine, tu_teardown_cpu_engine);
    }
    int skip = tu_bf16_or_skip("test_bf16_train");
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_backward),
        cmocka_unit_test(test_gradients_vs_f32),
        cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_masters_and_refresh),
        cmocka_unit_test(test_resume_bf16),
        cmocka_unit_test(test_f32_after_bf16),
        cmocka_unit_test(test_lp_activations_train),
        cmocka_unit_test(test_lp_dout),
        cmocka_unit_test(test_lp_rooms),
    };
    return cmocka_run_group_tests(tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
