/*
 * test_cuda_dit.c — the whole DiT on the CUDA engine against the CPU engine (correctness where
 * a GPU exists): the forward pass, the backward pass into every parameter's
 * gradient, ten training steps (AdamW, EMA, the data draws), and a guided Euler sampler's images,
 * each from the same weights and inputs on both engines; and two CUDA runs of the same forward,
 * which must agree bit for bit (replicas of one GPU model answer alike, so a client's replica
 * comparison holds per device type).
 *
 * Tolerances (fp32 on both sides; the backends share their per-element formulas but add in
 * other orders, and cuBLAS picks its own GEMM kernels), as normalised errors
 * nmse = Σ (a − b)² / Σ b²: forward 1e-8, gradients 1e-6, parameters after ten steps 1e-8,
 * the training losses within 1e-4 relative, sampled images 1e-5 (20 steps compound the
 * differences). They are an order of magnitude above what test_cuda_parity allows one op.
 *
 * test_bf16 runs the model with bf16 products on the GPU (where it has them) against the CPU's
 * fp32, to bf16's tolerance (nmse 1e-4 forward, 2 % per training loss); test_f16 the f16
 * forward against the CPU's emulated f16 (nmse 1e-7) and its fp32 (1e-5), and five f16 training
 * steps against the CPU's (losses to 1e-3, parameters to nmse 1e-7); test_flash_model a bf16
 * and an f16 model on the flash attention against the composed one (nmse 1e-4, 1e-5), and the
 * same bits with 16-bit activations off; test_graphs the forward through CUDA graphs, bit for bit
 * the eager forward (captured on a key's second forward, inputs changed in place, another batch,
 * another precision); test_train_graphs the training step's forward and backward through CUDA
 * graphs against the eager step; test_tune the attention and graphs chosen by measuring them
 * (model/dit_tune.c).
 *
 * Without a usable GPU (or without the CUDA backend) it prints why and exits 77: ctest skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/engine.h"
#include "kernels/ops.h"
#include "model/dit.h"
#include "model/fmnist.h"
#include "model/sampler.h"
#include "model/trainer.h"
#include "tests/testutil.h"

#define B 4

typedef struct {
    ts_engine_t e[2]; /* [0] CPU (the reference), [1] CUDA */
    ts_dit_config_t cfg;
} fixture_t;

static int setup(void **state) {
    fixture_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    ts_engine_opts_t cpu = {.device = TS_CPU, .threads = 1};
    ts_engine_opts_t gpu = {.device = TS_CUDA, .gpu = 0};
    if (ts_engine_init(&fx->e[0], &cpu) != TS_OK || ts_engine_init(&fx->e[1], &gpu) != TS_OK)
        return -1;
    if (ts_dit_config_preset("mini", &fx->cfg) != TS_OK)
        return -1;
    fx->cfg.in_channels = 1, fx->cfg.input_size = 28;
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    fixture_t *fx = *state;
    ts_engine_free(&fx->e[1]);
    ts_engine_free(&fx->e[0]);
    free(fx);
    return 0;
}

/* The normalised error of a (any device) against b (any device), both F32 of n elements. */
static double nmse(const ts_tensor_t *a, const ts_tensor_t *b) {
    int64_t n = ts_tensor_numel(b);
    ts_tensor_t ha, hb;
    TU_CHECK_OK(ts_tensor_alloc(&ha, TS_F32, TS_CPU, 1, TS_SHAPE(n)));
    TU_CHECK_OK(ts_tensor_alloc(&hb, TS_F32, TS_CPU, 1, TS_SHAPE(n)));
    ts_tensor_t va = *a, vb = *b;
    va.ndim = vb.ndim = 1, va.shape[0] = vb.shape[0] = n;
    TU_CHECK_OK(ts_tensor_copy(&ha, &va));
    TU_CHECK_OK(ts_tensor_copy(&hb, &vb));
    double num = 0, den = 0;
    const float *x = ha.data, *y = hb.data;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)y[i];
        num += d * d, den += (double)y[i] * (double)y[i];
    }
    ts_tensor_free(&ha);
    ts_tensor_free(&hb);
    return den > 0 ? num / den : num;
}

/* Both models with the same weights (made on the CPU, copied to the GPU): every parameter
 * random, N(0, 0.05²) — DiT's initialisation zeroes adaLN and the final layer, and a forward of
 * those weights is exactly zero on any backend, which would compare nothing. */
static void models(fixture_t *fx, ts_dit_t m[2], int max_batch, int training) {
    for (int s = 0; s < 2; s++)
        TU_CHECK_OK(ts_dit_create(&m[s], &fx->cfg, &fx->e[s], max_batch, training));
    TU_CHECK_OK(ts_rng_normal(&fx->e[0], &m[0].param_mem, 7, 0));
    TU_CHECK_OK(ts_scale(&fx->e[0], &m[0].param_mem, 0.05f));
    TU_CHECK_OK(ts_tensor_copy(&m[1].param_mem, &m[0].param_mem));
}

/* x (B, 1, 28, 28) uniform in [−1, 1], t in (0, 1), on both devices. */
static void inputs(ts_tensor_t x[2], ts_tensor_t t[2], int32_t y[B]) {
    tu_rng_t r = {11};
    for (int s = 0; s < 2; s++) {
        ts_device_t d = s ? TS_CUDA : TS_CPU;
        TU_CHECK_OK(ts_tensor_alloc(&x[s], TS_F32, d, 4, TS_SHAPE(B, 1, 28, 28)));
        TU_CHECK_OK(ts_tensor_alloc(&t[s], TS_F32, d, 1, TS_SHAPE(B)));
    }
    for (int64_t i = 0; i < ts_tensor_numel(&x[0]); i++)
        ((float *)x[0].data)[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
    for (int i = 0; i < B; i++) {
        ((float *)t[0].data)[i] = tu_rng_uniform(&r, 0.05f, 0.95f);
        y[i] = i % 10;
    }
    TU_CHECK_OK(ts_tensor_copy(&x[1], &x[0]));
    TU_CHECK_OK(ts_tensor_copy(&t[1], &t[0]));
}

/* A synthetic data set of n 28×28 images and labels (free with free_data). */
static ts_dataset_t synthetic_data(int n) {
    ts_dataset_t data = {.n = n, .channels = 1, .height = 28, .width = 28, .num_classes = 10};
    data.images = calloc((size_t)n * 784, sizeof(float));
    data.labels = calloc((size_t)n, sizeof(int32_t));
    assert_non_null(data.images);
    assert_non_null(data.labels);
    tu_rng_t r = {5};
    for (int i = 0; i < n * 784; i++)
        data.images[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
    for (int i = 0; i < n; i++)
        data.labels[i] = i % 10;
    return data;
}

static void free_data(ts_dataset_t *data) {
    free(data->images);
    free(data->labels);
}

static void test_forward_backward(void **state) {
    fixture_t *fx = *state;
    ts_dit_t m[2];
    ts_tensor_t x[2], t[2], v[2], dv[2];
    int32_t y[B];
    models(fx, m, B, 1);
    inputs(x, t, y);
    for (int s = 0; s < 2; s++)
        TU_CHECK_OK(ts_dit_forward(&m[s], &x[s], &t[s], y, B, &v[s]));
    double e = nmse(&v[1], &v[0]);
    printf("  forward nmse %.3g\n", e);
    assert_true(e <= 1e-8);
    /* backward from the same upstream gradient (the output itself) */
    for (int s = 0; s < 2; s++) {
        TU_CHECK_OK(ts_tensor_alloc(&dv[s], TS_F32, s ? TS_CUDA : TS_CPU, 4, v[0].shape));
        TU_CHECK_OK(ts_tensor_copy(&dv[s], &v[0]));
        TU_CHECK_OK(ts_dit_zero_grad(&m[s]));
        TU_CHECK_OK(ts_dit_backward(&m[s], &dv[s], B));
    }
    e = nmse(&m[1].grad_mem, &m[0].grad_mem);
    printf("  gradients nmse %.3g\n", e);
    assert_true(e <= 1e-6);
    for (int s = 0; s < 2; s++) {
        ts_tensor_free(&x[s]), ts_tensor_free(&t[s]), ts_tensor_free(&dv[s]);
        ts_dit_free(&m[s]);
    }
}

/* The same forward twice on the GPU: bit for bit. */
static void test_gpu_repeatable(void **state) {
    fixture_t *fx = *state;
    ts_dit_t m[2];
    ts_tensor_t x[2], t[2], v, first;
    int32_t y[B];
    models(fx, m, B, 0);
    inputs(x, t, y);
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v));
    TU_CHECK_OK(ts_tensor_alloc(&first, TS_F32, TS_CPU, 4, v.shape));
    TU_CHECK_OK(ts_tensor_copy(&first, &v));
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v));
    ts_tensor_t second;
    TU_CHECK_OK(ts_tensor_alloc(&second, TS_F32, TS_CPU, 4, v.shape));
    TU_CHECK_OK(ts_tensor_copy(&second, &v));
    assert_memory_equal(first.data, second.data, (size_t)ts_tensor_numel(&first) * sizeof(float));
    ts_tensor_free(&first), ts_tensor_free(&second);
    for (int s = 0; s < 2; s++) {
        ts_tensor_free(&x[s]), ts_tensor_free(&t[s]);
        ts_dit_free(&m[s]);
    }
}

/* Ten steps of training on a synthetic data set: losses and parameters agree. */
static void test_training_steps(void **state) {
    fixture_t *fx = *state;
    ts_dataset_t data = synthetic_data(64);
    ts_train_config_t tc;
    ts_train_config_default(&tc);
    tc.batch = 8, tc.seed = 3, tc.warmup = 2;
    ts_dit_t m[2];
    ts_trainer_t tr[2];
    models(fx, m, tc.batch, 1);
    for (int s = 0; s < 2; s++)
        TU_CHECK_OK(ts_trainer_init(&tr[s], &m[s], &data, &tc));
    for (int step = 0; step < 10; step++) {
        float loss[2];
        for (int s = 0; s < 2; s++)
            TU_CHECK_OK(ts_trainer_step(&tr[s], &loss[s], NULL));
        assert_true(fabs(loss[1] - loss[0]) <= 1e-4 * fabs(loss[0]));
    }
    double e = nmse(&m[1].param_mem, &m[0].param_mem);
    printf("  parameters after 10 steps nmse %.3g\n", e);
    assert_true(e <= 1e-8);
    for (int s = 0; s < 2; s++) {
        ts_trainer_free(&tr[s]);
        ts_dit_free(&m[s]);
    }
    free_data(&data);
}

/* A checkpoint copied out into pinned memory on the engine's stream (tesserad's writer): the
 * copy is queued behind the step before it, and work queued after it — here a scaling of every
 * slab, queued with nothing in between that waits for the device, then a whole step — cannot
 * change what it copies: the bytes encoded afterwards are those of the step staged. */
static void test_stage_async(void **state) {
    fixture_t *fx = *state;
    ts_dataset_t data = synthetic_data(64);
    ts_train_config_t tc;
    ts_train_config_default(&tc);
    tc.batch = 8, tc.seed = 5, tc.warmup = 2;
    ts_dit_t m[2];
    ts_trainer_t tr;
    models(fx, m, tc.batch, 1);
    TU_CHECK_OK(ts_trainer_init(&tr, &m[1], &data, &tc));
    char err[256] = "";
    ts_trainer_stage_t st;
    TU_CHECK_OK(ts_trainer_stage_init(&st, &tr, 1));
    for (int i = 0; i < 4; i++)
        assert_int_equal(st.host[i].owns, 2); /* page-locked: the copy is truly asynchronous */
    for (int round = 0; round < 3; round++) {
        TU_CHECK_OK(ts_trainer_step(&tr, NULL, NULL));
        unsigned char *want = NULL, *got = NULL;
        size_t want_len = 0, got_len = 0;
        TU_CHECK_OK(ts_trainer_save_mem(&tr, &want, &want_len, err, sizeof err));
        TU_CHECK_OK(ts_trainer_stage_begin(&st, &tr));
        TU_CHECK_OK(ts_scale(&fx->e[1], &m[1].param_mem, 2.0f)); /* queued behind the copy */
        TU_CHECK_OK(ts_scale(&fx->e[1], &tr.ema_mem, 2.0f));
        TU_CHECK_OK(ts_scale(&fx->e[1], &tr.m_mem, 2.0f));
        TU_CHECK_OK(ts_trainer_step(&tr, NULL, NULL));
        TU_CHECK_OK(ts_trainer_stage_encode(&st, &got, &got_len, err, sizeof err));
        assert_int_equal(got_len, want_len);
        assert_memory_equal(got, want, want_len);
        free(want), free(got);
    }
    printf("  staged checkpoints equal the synchronous ones (3 rounds, a step between)\n");
    ts_trainer_stage_free(&st);
    ts_trainer_free(&tr);
    for (int s = 0; s < 2; s++)
        ts_dit_free(&m[s]);
    free_data(&data);
}

/* Five training steps on the CPU at cpu_p and on the GPU at gpu_p from the same weights and
 * data: each loss within loss_tol (relative), the same skipped steps and loss scale, and the
 * parameters within nmse param_tol. */
static void train_both(fixture_t *fx, ts_precision_t cpu_p, ts_precision_t gpu_p, double loss_tol,
                       double param_tol) {
    ts_dataset_t data = synthetic_data(64);
    ts_train_config_t tc;
    ts_train_config_default(&tc);
    tc.batch = 8, tc.seed = 3, tc.warmup = 2;
    ts_trainer_t tr[2];
    ts_dit_t m[2];
    char why[256] = "";
    models(fx, m, tc.batch, 1);
    for (int s = 0; s < 2; s++) {
        ts_precision_t p = s ? gpu_p : cpu_p;
        if (p != TS_PREC_F32)
            TU_CHECK_OK(ts_dit_set_precision(&m[s], p, why, sizeof why));
        TU_CHECK_OK(ts_trainer_init(&tr[s], &m[s], &data, &tc));
    }
    for (int step = 0; step < 5; step++) {
        float loss[2];
        for (int s = 0; s < 2; s++)
            TU_CHECK_OK(ts_trainer_step(&tr[s], &loss[s], NULL));
        printf("  %s training step %d: loss %.5f (CPU %s %.5f)\n", ts_precision_name(gpu_p), step,
               loss[1], ts_precision_name(cpu_p), loss[0]);
        assert_true(fabs(loss[1] - loss[0]) <= loss_tol * fabs(loss[0]));
    }
    assert_int_equal(tr[1].skipped, tr[0].skipped);
    assert_true(tr[1].loss_scale == tr[0].loss_scale);
    double e = nmse(&m[1].param_mem, &m[0].param_mem);
    printf("  parameters after 5 %s steps nmse %.3g\n", ts_precision_name(gpu_p), e);
    assert_true(e <= param_tol);
    for (int s = 0; s < 2; s++) {
        ts_trainer_free(&tr[s]);
        ts_dit_free(&m[s]);
    }
    free_data(&data);
}

/* bf16 on the GPU (compute capability 8.0 or newer; cuBLAS with fp32 accumulation): the forward
 * within bf16's error of the CPU's fp32 forward (nmse ≤ 1e-4; a bf16 rounding is 2⁻⁹ relative)
 * yet not equal to the GPU's fp32 one (the bf16 path ran), the same bits twice, and with 16-bit
 * activations off within an ulp's error of the composed attention's output; five bf16
 * training steps with losses within 2 % of the CPU's fp32 steps and the same parameters to
 * nmse 1e-6. */
static void test_bf16(void **state) {
    fixture_t *fx = *state;
    char why[256] = "";
    if (ts_engine_precision_check(&fx->e[1], TS_PREC_BF16, why, sizeof why) != TS_OK) {
        printf("  bf16 not checked: %s\n", why);
        skip();
    }
    ts_dit_t m[2];
    ts_tensor_t x[2], t[2], v[2], f32, bf;
    int32_t y[B];
    models(fx, m, B, 0);
    inputs(x, t, y);
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
    TU_CHECK_OK(ts_tensor_alloc(&f32, TS_F32, TS_CPU, 4, v[1].shape));
    TU_CHECK_OK(ts_tensor_alloc(&bf, TS_F32, TS_CPU, 4, v[1].shape));
    TU_CHECK_OK(ts_tensor_copy(&f32, &v[1]));
    TU_CHECK_OK(ts_dit_set_precision(&m[1], TS_PREC_BF16, why, sizeof why));
    TU_CHECK_OK(ts_dit_forward(&m[0], &x[0], &t[0], y, B, &v[0]));
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
    TU_CHECK_OK(ts_tensor_copy(&bf, &v[1]));
    double e = nmse(&v[1], &v[0]), d = nmse(&bf, &f32);
    printf("  bf16 forward nmse %.3g against the CPU's fp32, %.3g against the GPU's fp32\n", e, d);
    assert_true(e <= 1e-4);
    assert_true(d > 1e-12);
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
    TU_CHECK_OK(ts_tensor_copy(&f32, &v[1]));
    assert_memory_equal(f32.data, bf.data, (size_t)ts_tensor_numel(&bf) * sizeof(float));
    /* the linears round their inputs instead: the same values rounded the same way, but for
     * the composed attention's output, which its last product writes in 16 bits itself (within
     * an ulp of the fp32 output rounded, test_cuda_parity): close, not the same bits */
    assert_int_equal(m[1].attn, TS_ATTN_COMPOSED);
    ts_dit_set_lp_activations(&m[1], 0);
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
    TU_CHECK_OK(ts_tensor_copy(&f32, &v[1]));
    double off = nmse(&f32, &bf);
    printf("  bf16, 16-bit activations off: nmse %.3g against on\n", off);
    /* the attention output's one-ulp differences (2^-8 relative) carried to the output: far
     * below bf16's own error (1e-4, above) */
    assert_true(off <= 1e-6);
    ts_tensor_free(&f32), ts_tensor_free(&bf);
    for (int s = 0; s < 2; s++) {
        ts_tensor_free(&x[s]), ts_tensor_free(&t[s]);
        ts_dit_free(&m[s]);
    }

    train_both(fx, TS_PREC_F32, TS_PREC_BF16, 2e-2, 1e-6);
}

/* f16 on the GPU (cuBLAS, fp32 accumulation; every GPU this backend is built for) against the
 * CPU's f16 (emulated: the same rounded operands, fp32 sums in another order): nmse ≤ 1e-7 (an
 * activation's f16 rounding may fall the other way now and then: 2⁻¹¹ relative where it does);
 * against the CPU's fp32, within f16's error (nmse ≤ 1e-5; measured ~1e-7 on the CPU); the same
 * bits twice, and with 16-bit activations off within an ulp's error of the composed attention's
 * output. */
static void test_f16(void **state) {
    fixture_t *fx = *state;
    char why[256] = "";
    ts_dit_t m[2];
    ts_tensor_t x[2], t[2], v[2], h16, first;
    int32_t y[B];
    models(fx, m, B, 0);
    inputs(x, t, y);
    TU_CHECK_OK(ts_dit_forward(&m[0], &x[0], &t[0], y, B, &v[0]));
    TU_CHECK_OK(ts_tensor_alloc(&h16, TS_F32, TS_CPU, 4, v[0].shape));
    TU_CHECK_OK(ts_tensor_alloc(&first, TS_F32, TS_CPU, 4, v[0].shape));
    TU_CHECK_OK(ts_tensor_copy(&h16, &v[0])); /* the CPU's fp32, for now */
    for (int s = 0; s < 2; s++)
        TU_CHECK_OK(ts_dit_set_precision(&m[s], TS_PREC_F16, why, sizeof why));
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
    TU_CHECK_OK(ts_tensor_copy(&first, &v[1]));
    double e32 = nmse(&first, &h16);
    TU_CHECK_OK(ts_dit_forward(&m[0], &x[0], &t[0], y, B, &v[0]));
    TU_CHECK_OK(ts_tensor_copy(&h16, &v[0]));
    double e16 = nmse(&first, &h16);
    printf("  f16 forward nmse %.3g against the CPU's f16, %.3g against the CPU's fp32\n", e16,
           e32);
    assert_true(e16 <= 1e-7);
    assert_true(e32 <= 1e-5);
    assert_true(e32 > 1e-12); /* the f16 path ran */
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
    TU_CHECK_OK(ts_tensor_copy(&h16, &v[1]));
    assert_memory_equal(first.data, h16.data, (size_t)ts_tensor_numel(&h16) * sizeof(float));
    /* a GPU model writes its linears' inputs in 16 bits; rounded by the linears instead, the
     * same values, but for the composed attention's 16-bit output (test_bf16, above) */
    assert_true(m[1].lp_acts);
    assert_int_equal(m[1].attn, TS_ATTN_COMPOSED);
    ts_dit_set_lp_activations(&m[1], 0);
    TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
    TU_CHECK_OK(ts_tensor_copy(&h16, &v[1]));
    double off = nmse(&h16, &first);
    printf("  f16, 16-bit activations off: nmse %.3g against on\n", off);
    assert_true(off <= 1e-8); /* the same for f16's ulp (2^-11), within its 1e-5 */
    ts_tensor_free(&h16), ts_tensor_free(&first);
    for (int s = 0; s < 2; s++) {
        ts_tensor_free(&x[s]), ts_tensor_free(&t[s]);
        ts_dit_free(&m[s]);
    }

    /* five f16 training steps (loss scaling) on both, both in f16: the same losses to 1e-3, the
     * same skips and scale, the same parameters to nmse 1e-7 */
    train_both(fx, TS_PREC_F16, TS_PREC_F16, 1e-3, 1e-7);
}

/* The 16-bit flash attention in a model (ts_dit_set_attention fused at bf16 on sm_80+, f16 on
 * sm_75+): the forward within the 16-bit error of the GPU's composed-attention forward at the
 * same precision (nmse ≤ 1e-4 bf16, 1e-5 f16; the two attentions round different things), the
 * same bits with 16-bit activations off (the attention then writes proj's input in fp32 and proj
 * rounds it). */
static void test_flash_model(void **state) {
    fixture_t *fx = *state;
    const ts_precision_t precs[2] = {TS_PREC_BF16, TS_PREC_F16};
    for (int i = 0; i < 2; i++) {
        char why[256] = "";
        ts_dit_t m[2];
        ts_tensor_t x[2], t[2], v[2], comp, on;
        int32_t y[B];
        if (ts_engine_precision_check(&fx->e[1], precs[i], why, sizeof why) != TS_OK ||
            ts_attention_fused_lp_check(&fx->e[1], ts_precision_dtype(precs[i])) != TS_OK) {
            printf("  flash %s not checked: not on this GPU\n", ts_precision_name(precs[i]));
            continue;
        }
        models(fx, m, B, 0);
        inputs(x, t, y);
        TU_CHECK_OK(ts_dit_set_precision(&m[1], precs[i], why, sizeof why));
        TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1])); /* composed */
        TU_CHECK_OK(ts_tensor_alloc(&comp, TS_F32, TS_CPU, 4, v[1].shape));
        TU_CHECK_OK(ts_tensor_alloc(&on, TS_F32, TS_CPU, 4, v[1].shape));
        TU_CHECK_OK(ts_tensor_copy(&comp, &v[1]));
        TU_CHECK_OK(ts_dit_set_attention(&m[1], TS_ATTN_FUSED));
        assert_true(m[1].lp_acts);
        TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
        TU_CHECK_OK(ts_tensor_copy(&on, &v[1]));
        double e = nmse(&on, &comp), bound = precs[i] == TS_PREC_F16 ? 1e-5 : 1e-4;
        printf("  flash %s model forward nmse %.3g against the composed attention's\n",
               ts_precision_name(precs[i]), e);
        assert_true(e <= bound);
        ts_dit_set_lp_activations(&m[1], 0);
        TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &t[1], y, B, &v[1]));
        TU_CHECK_OK(ts_tensor_copy(&comp, &v[1]));
        assert_memory_equal(comp.data, on.data, (size_t)ts_tensor_numel(&on) * sizeof(float));
        ts_tensor_free(&comp), ts_tensor_free(&on);
        for (int s = 0; s < 2; s++) {
            ts_tensor_free(&x[s]), ts_tensor_free(&t[s]);
            ts_dit_free(&m[s]);
        }
    }
}

/* The 16-bit precision the GPU has: bf16 where it can, else f16. */
static ts_precision_t gpu_lp(fixture_t *fx) {
    return ts_engine_precision_check(&fx->e[1], TS_PREC_BF16, NULL, 0) == TS_OK ? TS_PREC_BF16
                                                                                : TS_PREC_F16;
}

/* v's values (any device) into a fresh host buffer. */
static float *host_of(const ts_tensor_t *v) {
    float *p = malloc(ts_tensor_nbytes(v));
    assert_non_null(p);
    ts_tensor_t h;
    TU_CHECK_OK(ts_tensor_wrap(&h, p, TS_F32, TS_CPU, v->ndim, v->shape));
    TU_CHECK_OK(ts_tensor_copy(&h, v));
    return p;
}

/* A forward of m[1] with graphs as set, against the same forward with graphs off on a twin
 * (m[0]'s weights on the GPU too): the same bits. */
static void graph_vs_eager(ts_dit_t *g, ts_dit_t *eager, ts_tensor_t *x, ts_tensor_t *t,
                           const int32_t *y, int n, const char *what) {
    ts_tensor_t v;
    TU_CHECK_OK(ts_dit_forward(g, x, t, y, n, &v));
    float *a = host_of(&v);
    TU_CHECK_OK(ts_dit_forward(eager, x, t, y, n, &v));
    float *b = host_of(&v);
    if (memcmp(a, b, (size_t)ts_tensor_numel(&v) * sizeof *a) != 0)
        fail_msg("graphs: %s: the graph's output differs from the eager forward's", what);
    free(a), free(b);
}

/* CUDA graphs of the inference forward (ts_dit_set_graphs): the first forward of a key runs
 * eagerly, the second is captured and launched, the third launched; each gives the eager
 * forward's bits, also after the inputs' contents change (the graph reads its buffers at
 * launch), for another batch size (its own graph), and after a change of precision (the graphs
 * are dropped and captured again). A capture that fails turns graphs off: reported, and a fail,
 * since every op of the forward is meant to be capturable. */
static void test_graphs(void **state) {
    fixture_t *fx = *state;
    ts_dit_t m[2], twin;
    ts_tensor_t x[2], t[2];
    int32_t y[B];
    models(fx, m, B, 0);
    TU_CHECK_OK(ts_dit_create(&twin, &fx->cfg, &fx->e[1], B, 0));
    TU_CHECK_OK(ts_tensor_copy(&twin.param_mem, &m[0].param_mem));
    inputs(x, t, y);
    ts_dit_set_graphs(&m[1], 1);
    for (int call = 0; call < 3; call++) {
        char what[32];
        snprintf(what, sizeof what, "call %d", call + 1);
        graph_vs_eager(&m[1], &twin, &x[1], &t[1], y, B, what);
        if (m[1].graphs.on != 1)
            fail_msg("graphs: the capture failed (graphs %d): an op of the forward is not "
                     "capturable",
                     m[1].graphs.on);
    }
    printf("  graphs: %lld captured, %lld launched over 3 forwards\n",
           (long long)m[1].graphs.captures, (long long)m[1].graphs.launches);
    assert_int_equal(m[1].graphs.captures, 1);
    assert_int_equal(m[1].graphs.launches, 2);
    /* new contents in the same buffers: the graph reads them */
    TU_CHECK_OK(ts_rng_normal(&fx->e[1], &x[1], 99, 0));
    graph_vs_eager(&m[1], &twin, &x[1], &t[1], y, B, "new inputs");
    assert_int_equal(m[1].graphs.launches, 3);
    /* another batch size: eager, then its own graph */
    ts_tensor_t x1, t1;
    TU_CHECK_OK(ts_tensor_slice(&x1, &x[1], 0, 1));
    TU_CHECK_OK(ts_tensor_slice(&t1, &t[1], 0, 1));
    for (int call = 0; call < 2; call++)
        graph_vs_eager(&m[1], &twin, &x1, &t1, y, 1, "batch 1");
    assert_int_equal(m[1].graphs.captures, 2);
    /* another precision: dropped, captured again */
    char why[256] = "";
    ts_precision_t p = gpu_lp(fx);
    TU_CHECK_OK(ts_dit_set_precision(&m[1], p, why, sizeof why));
    TU_CHECK_OK(ts_dit_set_precision(&twin, p, why, sizeof why));
    for (int call = 0; call < 3; call++)
        graph_vs_eager(&m[1], &twin, &x[1], &t[1], y, B, ts_precision_name(p));
    assert_int_equal(m[1].graphs.captures, 3);
    assert_int_equal(m[1].graphs.on, 1);
    ts_dit_free(&twin);
    for (int s = 0; s < 2; s++) {
        ts_tensor_free(&x[s]), ts_tensor_free(&t[s]);
        ts_dit_free(&m[s]);
    }
}

/* The training step through CUDA graphs (ts_train_config_t graphs), at f32 and at the GPU's
 * 16-bit precision: two trainers on the GPU from the same weights and data, one graphed. Its
 * first step runs eagerly, the second is captured and launched, the later ones launched; after
 * a change of attention (the model's graph_epoch moves) the same again. Each loss agrees with the
 * eager trainer's, and the parameters at the end (the backward's atomics add in no fixed order,
 * so not bit for bit: losses within 1e-5 relative at f32 and 1e-3 at 16 bits, parameters within
 * nmse 1e-9 and 1e-6). A capture that fails is a fail (every op of the step is meant to be
 * capturable). */
static void test_train_graphs(void **state) {
    fixture_t *fx = *state;
    char why[256] = "";
    const ts_precision_t ps[2] = {TS_PREC_F32, gpu_lp(fx)};
    ts_dataset_t data = synthetic_data(64);
    for (int i = 0; i < 2; i++) {
        ts_train_config_t tc;
        ts_train_config_default(&tc);
        tc.batch = 8, tc.seed = 3, tc.warmup = 2;
        ts_dit_t m[2], cpu[2];
        ts_trainer_t tr[2];
        models(fx, cpu, tc.batch, 1); /* cpu[1]'s weights, on the GPU, for both trainers */
        for (int s = 0; s < 2; s++) {
            TU_CHECK_OK(ts_dit_create(&m[s], &fx->cfg, &fx->e[1], tc.batch, 1));
            TU_CHECK_OK(ts_tensor_copy(&m[s].param_mem, &cpu[1].param_mem));
            if (ps[i] != TS_PREC_F32)
                TU_CHECK_OK(ts_dit_set_precision(&m[s], ps[i], why, sizeof why));
            tc.graphs = s;
            TU_CHECK_OK(ts_trainer_init(&tr[s], &m[s], &data, &tc));
        }
        for (int s = 0; s < 2; s++)
            ts_dit_free(&cpu[s]);
        int f16 = ps[i] == TS_PREC_F16;
        for (int step = 0; step < 9; step++) {
            if (step == 5) /* the other attention: the graphs recorded before are stale */
                for (int s = 0; s < 2; s++)
                    TU_CHECK_OK(ts_dit_set_attention(
                        &m[s], m[s].attn == TS_ATTN_FUSED ? TS_ATTN_COMPOSED : TS_ATTN_FUSED));
            float loss[2];
            for (int s = 0; s < 2; s++)
                TU_CHECK_OK(ts_trainer_step(&tr[s], &loss[s], NULL));
            if (tr[1].graphs.on != 1)
                fail_msg("train graphs: the step's capture failed (graphs %d): an op of the "
                         "step is not capturable",
                         tr[1].graphs.on);
            printf("  %s step %d: loss eager %.6f, graphs %.6f\n", ts_precision_name(ps[i]), step,
                   loss[0], loss[1]);
            assert_true(fabs(loss[1] - loss[0]) <=
                        (ps[i] == TS_PREC_F32 ? 1e-5 : 1e-3) * fabs(loss[0]));
        }
        printf("  %s: %lld captured, %lld launched over 9 steps\n", ts_precision_name(ps[i]),
               (long long)tr[1].graphs.captures, (long long)tr[1].graphs.launches);
        if (!f16) { /* f16: a change of loss scale is a key of its own */
            assert_int_equal(tr[1].graphs.captures, 2);
            assert_int_equal(tr[1].graphs.launches, 7); /* steps 2-5 and 7-9 */
        } else {
            assert_true(tr[1].graphs.captures >= 2);
            assert_true(tr[1].graphs.launches >= 3);
        }
        assert_int_equal(tr[0].graphs.launches, 0);
        assert_int_equal(tr[1].skipped, tr[0].skipped);
        double e = nmse(&m[1].param_mem, &m[0].param_mem);
        printf("  %s: parameters after 9 steps, graphs against eager: nmse %.3g\n",
               ts_precision_name(ps[i]), e);
        assert_true(e <= (ps[i] == TS_PREC_F32 ? 1e-9 : 1e-6));
        for (int s = 0; s < 2; s++) {
            ts_trainer_free(&tr[s]);
            ts_dit_free(&m[s]);
        }
    }
    free_data(&data);
}

/* ts_dit_tune on the GPU, at f32 and at the 16-bit precision the GPU has: both attentions timed
 * (the fused one within its bound of the composed one's output), at 16 bits the cuBLASLt
 * epilogues (within 1e-2 of the two kernels), the graphs measured with the chosen attention and
 * bit for bit its eager forward (a capture that fails is a fail here, as in test_graphs), and
 * the model left on what the rules pick from the times. */
static void test_tune(void **state) {
    fixture_t *fx = *state;
    char why[256] = "";
    const ts_precision_t ps[2] = {TS_PREC_F32, gpu_lp(fx)};
    for (int i = 0; i < 2; i++) {
        ts_dit_t m[2];
        models(fx, m, B, 0);
        if (ps[i] != TS_PREC_F32)
            TU_CHECK_OK(ts_dit_set_precision(&m[1], ps[i], why, sizeof why));
        ts_attn_impl_t def = ts_dit_default_attention(&m[1]);
        ts_dit_tune_t t;
        int64_t captures = m[1].graphs.captures, launches = m[1].graphs.launches;
        TU_CHECK_OK(ts_dit_tune(&m[1], B, 5, &t));
        printf("  tune %s: %s\n", ts_precision_name(ps[i]), t.note);
        /* the graphs really ran: captured once, launched for the compared forward and the 5
         * timed ones */
        assert_int_equal(m[1].graphs.captures - captures, 1);
        assert_int_equal(m[1].graphs.launches - launches, 6);
        assert_true(t.ms[TS_ATTN_COMPOSED] > 0.0);
        assert_true(t.ms[TS_ATTN_FUSED] > 0.0); /* `tiny`'s heads: the fused kernels take them */
        assert_true(t.fused_diff <= (ps[i] == TS_PREC_F32 ? 1e-4 : 0.1));
        assert_int_equal(t.attn, ts_dit_tune_pick(&t, ps[i], def));
        assert_int_equal(m[1].attn, t.attn);
        /* the epilogues, at 16 bits wherever cuBLASLt starts (else the note says it did not),
         * and the engine left as decided: one more forward takes them only where kept */
        if (ps[i] == TS_PREC_F32)
            assert_false(t.epilogues_measured);
        else if (ts_cuda_epilogues(&fx->e[1]) != -1 && !t.epilogues_measured)
            fail_msg("tune: cuBLASLt started but its epilogues were not measured: %s", t.note);
        if (t.epilogues_measured) {
            assert_true(t.epilogues_diff <= 1e-2);
            assert_int_equal(t.epilogues, ts_dit_tune_epilogues_keep(&t, t.attn));
            int64_t calls = ts_cuda_epilogue_calls(&fx->e[1]);
            ts_dit_set_graphs(&m[1], 0); /* eager: the counter counts enqueued products */
            ts_tensor_t x[2], tt[2], v;
            int32_t y[B];
            inputs(x, tt, y);
            TU_CHECK_OK(ts_dit_forward(&m[1], &x[1], &tt[1], y, B, &v));
            free(host_of(&v));
            for (int s = 0; s < 2; s++)
                ts_tensor_free(&x[s]), ts_tensor_free(&tt[s]);
            assert_int_equal(ts_cuda_epilogue_calls(&fx->e[1]) > calls, t.epilogues);
            ts_dit_set_graphs(&m[1], t.graphs);
        }
        assert_true(t.graphs_measured);
        if (!t.graphs_same)
            fail_msg("tune: the forward through graphs is not the eager one's, bit for bit "
                     "(graphs %d)",
                     m[1].graphs.on);
        assert_int_equal(t.graphs, ts_dit_tune_graphs_keep(&t, t.attn));
        assert_int_equal(m[1].graphs.on, t.graphs);
        TU_CHECK_OK(ts_cuda_set_epilogues(&fx->e[1], 0)); /* the engine's: off for the others */
        for (int s = 0; s < 2; s++)
            ts_dit_free(&m[s]);
    }
}

/* 20 guided Euler steps from the same noise: the images agree. */
static void test_sampler(void **state) {
    fixture_t *fx = *state;
    ts_dit_t m[2];
    models(fx, m, 2 * B, 0);
    int32_t y[B] = {0, 3, 7, 10};
    uint64_t seeds[B] = {1, 2, 3, 4};
    ts_tensor_t x[2], scratch[2][3];
    ts_sampler_opts_t so = {.kind = TS_SAMPLER_EULER, .steps = 20};
    for (int s = 0; s < 2; s++) {
        ts_device_t d = s ? TS_CUDA : TS_CPU;
        TU_CHECK_OK(ts_tensor_alloc(&x[s], TS_F32, d, 4, TS_SHAPE(B, 1, 28, 28)));
        for (int k = 0; k < 3; k++)
            TU_CHECK_OK(ts_tensor_alloc(&scratch[s][k], TS_F32, d, 4, TS_SHAPE(B, 1, 28, 28)));
        TU_CHECK_OK(ts_sampler_noise(&fx->e[s], &x[s], seeds));
        ts_dit_velocity_ctx_t vc;
        TU_CHECK_OK(ts_dit_velocity_init(&vc, &m[s], y, B, 1.5f));
        TU_CHECK_OK(
            ts_sampler_run(&fx->e[s], &so, &x[s], scratch[s], ts_dit_velocity, &vc, NULL, NULL));
        ts_dit_velocity_free(&vc);
    }
    double e = nmse(&x[1], &x[0]);
    printf("  sampled images nmse %.3g\n", e);
    assert_true(e <= 1e-5);
    for (int s = 0; s < 2; s++) {
        ts_tensor_free(&x[s]);
        for (int k = 0; k < 3; k++)
            ts_tensor_free(&scratch[s][k]);
        ts_dit_free(&m[s]);
    }
}

int main(void) {
    char why[256] = "";
    if (ts_cuda_device_count(why, sizeof why) == 0) {
        printf("test_cuda_dit: SKIPPED: %s\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_backward),
        cmocka_unit_test(test_gpu_repeatable),
        cmocka_unit_test(test_training_steps),
        cmocka_unit_test(test_stage_async),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_flash_model),
        cmocka_unit_test(test_graphs),
        cmocka_unit_test(test_train_graphs),
        cmocka_unit_test(test_tune),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
