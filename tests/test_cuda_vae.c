/*
 * test_cuda_vae.c — the VAE (model/vae.h) on a CUDA engine against the CPU engine: encode and
 * decode of a model with random weights, three 64×48 images, the tensors on the CPU (staged
 * through the GPU workspace) and on the GPU, in fp32 (normalised error ≤ 1e-6, as the op parity
 * test holds every op) and, where the GPU has it, bf16 products (≤ 1e-4 against the CPU's fp32:
 * each product's operands rounded to 8 bits). Weights written after a GPU forward reach the GPU
 * only after ts_vae_weights_changed, and then do.
 *
 * The config has two resolution levels of 32 and 64 channels, 8 groups, one layer per block and
 * the mid block's attention: every layer kind the sd-vae-ft-mse decoder has. Without a usable GPU
 * (or without the CUDA backend) it prints why and exits 77, which ctest reports as skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/vae.h"
#include "tests/testutil.h"

#define B 3
#define H 64
#define W 48

static ts_engine_t cpu, gpu;

static double nmse(const ts_tensor_t *a, const ts_tensor_t *b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < ts_tensor_numel(b); i++) {
        double d = (double)tu_f32(a)[i] - (double)tu_f32(b)[i];
        num += d * d;
        den += (double)tu_f32(b)[i] * (double)tu_f32(b)[i];
    }
    return den > 0 ? num / den : num;
}

static void expect(const char *what, const ts_tensor_t *got, const ts_tensor_t *want, double tol) {
    double e = nmse(got, want);
    printf("test_cuda_vae: %-44s nmse %.3e (tolerance %.0e)\n", what, e, tol);
    if (!(e <= tol)) {
        print_error("%s: nmse %.3e over %.0e\n", what, e, tol);
        fail();
    }
}

static ts_vae_t *model(void) {
    ts_vae_config_t c;
    ts_vae_config_sd(&c);
    c.n_blocks = 2, c.block_out[0] = 32, c.block_out[1] = 64, c.layers_per_block = 1;
    c.groups = 8;
    ts_vae_t *m;
    char err[512] = "";
    TU_CHECK_RC_MSG(ts_vae_new(&m, &c, err, sizeof err), TS_OK, err);
    tu_rng_t r = {7};
    tu_fill_uniform(&r, &m->slab, -0.2f, 0.2f);
    return m;
}

/* latent and image from the CPU engine, then from the GPU with CPU tensors and with GPU ones. */
static void check(ts_vae_t *m, ts_precision_t p, double tol, const char *name) {
    char err[512] = "", what[96];
    const int f = ts_vae_factor(&m->cfg), L = m->cfg.latent_channels;
    ts_tensor_t img, lat_cpu, lat_gpu, back_cpu, back_gpu, dimg, dlat, dback;
    tu_alloc_f32(&img, 4, TS_SHAPE(B, 3, H, W));
    tu_alloc_f32(&lat_cpu, 4, TS_SHAPE(B, L, H / f, W / f));
    tu_alloc_f32(&lat_gpu, 4, TS_SHAPE(B, L, H / f, W / f));
    tu_alloc_f32(&back_cpu, 4, TS_SHAPE(B, 3, H, W));
    tu_alloc_f32(&back_gpu, 4, TS_SHAPE(B, 3, H, W));
    tu_rng_t r = {11};
    tu_fill_uniform(&r, &img, -1, 1);
    TU_CHECK_RC_MSG(ts_vae_set_precision(m, &cpu, TS_PREC_F32, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_encode(m, &cpu, &lat_cpu, NULL, &img, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_decode(m, &cpu, &back_cpu, &lat_cpu, err, sizeof err), TS_OK, err);

    TU_CHECK_RC_MSG(ts_vae_set_precision(m, &gpu, p, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_encode(m, &gpu, &lat_gpu, NULL, &img, err, sizeof err), TS_OK, err);
    snprintf(what, sizeof what, "encode %s, CPU tensors", name);
    expect(what, &lat_gpu, &lat_cpu, tol);
    TU_CHECK_RC_MSG(ts_vae_decode(m, &gpu, &back_gpu, &lat_cpu, err, sizeof err), TS_OK, err);
    snprintf(what, sizeof what, "decode %s, CPU tensors", name);
    expect(what, &back_gpu, &back_cpu, tol);

    TU_CHECK_OK(ts_tensor_alloc(&dimg, TS_F32, TS_CUDA, 4, img.shape));
    TU_CHECK_OK(ts_tensor_alloc(&dlat, TS_F32, TS_CUDA, 4, lat_cpu.shape));
    TU_CHECK_OK(ts_tensor_alloc(&dback, TS_F32, TS_CUDA, 4, img.shape));
    TU_CHECK_OK(ts_tensor_copy(&dimg, &img));
    TU_CHECK_RC_MSG(ts_vae_encode(m, &gpu, &dlat, NULL, &dimg, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_decode(m, &gpu, &dback, &dlat, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_tensor_copy(&lat_gpu, &dlat));
    TU_CHECK_OK(ts_tensor_copy(&back_gpu, &dback));
    snprintf(what, sizeof what, "encode %s, GPU tensors", name);
    expect(what, &lat_gpu, &lat_cpu, tol);
    snprintf(what, sizeof what, "encode then decode %s, GPU tensors", name);
    expect(what, &back_gpu, &back_cpu, 10 * tol);
    TU_FREE_TENSORS(&img, &lat_cpu, &lat_gpu, &back_cpu, &back_gpu, &dimg, &dlat, &dback);
}

static void test_parity(void **state) {
    (void)state;
    ts_vae_t *m = model();
    check(m, TS_PREC_F32, 1e-6, "fp32");
    char why[256] = "";
    if (ts_engine_precision_check(&gpu, TS_PREC_BF16, why, sizeof why) == TS_OK)
        check(m, TS_PREC_BF16, 1e-4, "bf16");
    else
        printf("test_cuda_vae: bf16 not checked: %s\n", why);
    ts_vae_free(m);
}

static void test_weights_changed(void **state) {
    (void)state;
    ts_vae_t *m = model();
    char err[512] = "";
    const int L = m->cfg.latent_channels, f = ts_vae_factor(&m->cfg);
    ts_tensor_t lat, a, b;
    tu_alloc_f32(&lat, 4, TS_SHAPE(1, L, H / f, W / f));
    tu_alloc_f32(&a, 4, TS_SHAPE(1, 3, H, W));
    tu_alloc_f32(&b, 4, TS_SHAPE(1, 3, H, W));
    tu_rng_t r = {12};
    tu_fill_uniform(&r, &lat, -1, 1);
    TU_CHECK_RC_MSG(ts_vae_decode(m, &gpu, &a, &lat, err, sizeof err), TS_OK, err);
    tu_f32(&m->slab)[ts_vae_numel(m) - 1] += 1.0f; /* conv_out's last bias: channel 2 */
    TU_CHECK_RC_MSG(ts_vae_decode(m, &gpu, &b, &lat, err, sizeof err), TS_OK, err);
    assert_memory_equal(a.data, b.data, ts_tensor_nbytes(&a)); /* the copy on the GPU is kept */
    ts_vae_weights_changed(m);
    TU_CHECK_RC_MSG(ts_vae_decode(m, &gpu, &b, &lat, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_decode(m, &cpu, &a, &lat, err, sizeof err), TS_OK, err);
    expect("decode after ts_vae_weights_changed", &b, &a, 1e-6);
    TU_FREE_TENSORS(&lat, &a, &b);
    ts_vae_free(m);
}

int main(void) {
    ts_engine_opts_t co = {.device = TS_CPU}, go = {.device = TS_CUDA, .gpu = 0};
    char why[256] = "";
    if (!ts_cuda_built() || ts_cuda_count(why, sizeof why) < 1) {
        printf("test_cuda_vae: SKIPPED: %s\n", ts_cuda_built() ? why : "no CUDA backend");
        return 77;
    }
    if (ts_engine_init(&cpu, &co) != TS_OK || ts_engine_init(&gpu, &go) != TS_OK) {
        printf("test_cuda_vae: SKIPPED: cannot start a CPU and a CUDA engine\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_parity),
                                       cmocka_unit_test(test_weights_changed)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ts_engine_free(&gpu);
    ts_engine_free(&cpu);
    return rc;
}
