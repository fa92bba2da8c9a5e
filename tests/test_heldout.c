/*
 * test_heldout.c — the held-out loss (model/heldout.h) against a naive loop: for each image and
 * time, x_t and the target built element by element in double from the same noise, one forward
 * per image at batch 1, the squared error summed in double. Also: the value does not depend on
 * how the images are cut into batches (bit for bit), another noise seed gives another value, the
 * grid parser refuses what it must, and the cluster's images are picked in data order.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "model/heldout.h"
#include "model/trainer.h"
#include "tests/testutil.h"

static ts_dit_config_t small_config(void) {
    ts_dit_config_t c = {.input_size = 8,
                         .in_channels = 1,
                         .patch_size = 2,
                         .hidden_size = 32,
                         .depth = 2,
                         .num_heads = 2,
                         .num_classes = 3,
                         .mlp_ratio = 4,
                         .freq_dim = 16};
    return c;
}

/* A model whose every parameter is nudged off DiT's zero initialisation, so the output is not 0. */
static void make_model(ts_engine_t *e, ts_dit_t *m, int max_batch) {
    ts_dit_config_t c = small_config();
    assert_int_equal(ts_dit_create(m, &c, e, max_batch, 0), TS_OK);
    assert_int_equal(ts_dit_init_weights(m, 7), TS_OK);
    float *p = m->param_mem.data;
    uint64_t s = 12345;
    for (int64_t i = 0; i < m->num_params; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] += 0.05f * ((float)(s >> 40) / (float)(1 << 24) - 0.5f);
    }
}

/* The naive loss: per image and time, one forward at batch 1. */
static double naive_loss(ts_engine_t *e, ts_dit_t *m1, const ts_dataset_t *d, const int32_t *idx,
                         int n, const float *t, int T, uint64_t seed) {
    int64_t chw = (int64_t)d->channels * d->height * d->width;
    const int64_t *shape = TS_SHAPE(1, d->channels, d->height, d->width);
    ts_tensor_t eps, xt, tt, v;
    assert_int_equal(ts_tensor_alloc(&eps, TS_F32, TS_CPU, 4, shape), TS_OK);
    assert_int_equal(ts_tensor_alloc(&xt, TS_F32, TS_CPU, 4, shape), TS_OK);
    assert_int_equal(ts_tensor_alloc(&tt, TS_F32, TS_CPU, 1, TS_SHAPE(1)), TS_OK);
    uint64_t key = ts_stream_key(seed, 0);
    double total = 0.0;
    for (int j = 0; j < T; j++) {
        double sum = 0.0;
        for (int i = 0; i < n; i++) {
            const float *x0 = d->images + (int64_t)idx[i] * chw;
            assert_int_equal(
                ts_rng_normal(e, &eps, key,
                              ((uint64_t)idx[i] * (uint64_t)T + (uint64_t)j) * (uint64_t)chw),
                TS_OK);
            const float *ep = eps.data;
            float *x = xt.data;
            for (int64_t k = 0; k < chw; k++)
                x[k] = (float)((1.0 - (double)t[j]) * x0[k] + (double)t[j] * ep[k]);
            ((float *)tt.data)[0] = t[j];
            int32_t y = d->labels[idx[i]];
            assert_int_equal(ts_dit_forward(m1, &xt, &tt, &y, 1, &v), TS_OK);
            const float *vv = v.data;
            for (int64_t k = 0; k < chw; k++) {
                double diff = (double)vv[k] - ((double)ep[k] - (double)x0[k]);
                sum += diff * diff;
            }
        }
        total += sum / ((double)n * (double)chw);
    }
    ts_tensor_free(&eps), ts_tensor_free(&xt), ts_tensor_free(&tt);
    return total / T;
}

static void test_against_naive(void **state) {
    ts_engine_t *e = *state;
    ts_dataset_t d;
    tu_quarters_dataset(&d, 40);
    ts_dit_t big, small, one;
    make_model(e, &big, 16);
    make_model(e, &small, 3);
    make_model(e, &one, 1);
    int32_t idx[] = {3, 0, 17, 25, 8, 39, 11, 30, 21, 5, 14, 2, 33, 36, 27, 19, 9, 1, 38, 24};
    int n = 20;
    float t[TS_HELDOUT_MAX_T];
    int T = 0;
    assert_int_equal(ts_heldout_parse_grid("0.05,0.5,0.95,1", t, &T), TS_OK);
    assert_int_equal(T, 4);
    ts_heldout_t h;
    char err[256];
    assert_int_equal(ts_heldout_init(&h, e, &d, t, T, 4, err, sizeof err), TS_OK);
    double by_t[4], mean_big, mean_small;
    assert_int_equal(ts_heldout_loss(&h, &big, idx, n, by_t, &mean_big), TS_OK);
    assert_int_equal(ts_heldout_loss(&h, &small, idx, n, NULL, &mean_small), TS_OK);
    double naive = naive_loss(e, &one, &d, idx, n, t, T, 4);
    print_message("held-out loss %.9f, naive %.9f, by t %.4f %.4f %.4f %.4f\n", mean_big, naive,
                  by_t[0], by_t[1], by_t[2], by_t[3]);
    assert_true(mean_big > 0.1);
    assert_true(fabs(mean_big - naive) <= 1e-5 * naive);
    assert_true(mean_big == mean_small); /* batches of 16 or of 3: the same bits */
    assert_true(fabs((by_t[0] + by_t[1] + by_t[2] + by_t[3]) / 4 - mean_big) < 1e-12);
    /* another noise stream: another value */
    ts_heldout_t h2;
    double other;
    assert_int_equal(ts_heldout_init(&h2, e, &d, t, T, 5, err, sizeof err), TS_OK);
    assert_int_equal(ts_heldout_loss(&h2, &big, idx, n, NULL, &other), TS_OK);
    assert_true(other != mean_big);
    /* bad calls */
    int32_t out_of_range[] = {40};
    assert_int_equal(ts_heldout_loss(&h, &big, out_of_range, 1, NULL, &other), TS_EINVAL);
    assert_int_equal(ts_heldout_loss(&h, &big, idx, 0, NULL, &other), TS_EINVAL);
    ts_heldout_free(&h2);
    ts_heldout_free(&h);
    ts_dit_free(&big), ts_dit_free(&small), ts_dit_free(&one);
    ts_dataset_free(&d);
}

static void test_grid_and_pick(void **state) {
    (void)state;
    float t[TS_HELDOUT_MAX_T];
    int T = 0;
    assert_int_equal(ts_heldout_parse_grid(TS_HELDOUT_GRID, t, &T), TS_OK);
    assert_int_equal(T, 10);
    assert_true(t[0] == 0.05f && t[9] == 0.95f);
    const char *bad[] = {
        "",     "1.5",
        "-0.1", "a",
        "0.5,", "0.5,,0.6",
        "nan",  "0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(ts_heldout_parse_grid(bad[i], t, &T), TS_EINVAL);
    int32_t cluster[] = {1, 0, 1, 1, 2, 1, 0};
    int32_t idx[3];
    int n;
    ts_heldout_pick(cluster, 7, 1, 3, idx, &n);
    assert_int_equal(n, 3);
    assert_true(idx[0] == 0 && idx[1] == 2 && idx[2] == 3);
    ts_heldout_pick(cluster, 7, 3, 3, idx, &n);
    assert_int_equal(n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_naive),
        cmocka_unit_test(test_grid_and_pick),
    };
    return cmocka_run_group_tests(tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
