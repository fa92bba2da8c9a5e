/*
 * test_judge.c — the judges' networks (model/judge.h): every gradient against central finite
 * differences in double of the loss, the convolution against a naive loop, a file round trip
 * that gives the same features, training that learns a task a judge can learn, and the errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/ops.h"
#include "model/judge.h"
#include "model/safetensors.h"
#include "tests/testutil.h"

enum { C = 1, H = 8, W = 8, P = C * H * W, K = 3, B = 4 };

static void fill(float *x, int n, unsigned seed) {
    srand(seed);
    for (int i = 0; i < n; i++)
        x[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
}

/* Every parameter's gradient against (L(p + h) − L(p − h)) / 2h at a sample of its elements. */
static void check_gradients(ts_engine_t *e, ts_judge_kind_t kind, int c0, int h0, int w0) {
    ts_judge_t *j;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_judge_create(&j, kind, c0, h0, w0, K, 7, e, B, 1, err, sizeof err), TS_OK,
                    err);
    float x[B * 2 * 8 * 12];
    int32_t y[B] = {0, 2, 1, 2};
    fill(x, B * c0 * h0 * w0, 3);
    /* biases start at zero: give them values so that their gradients are not a special case */
    for (int i = 0; i < ts_judge_num_params(j); i++) {
        ts_tensor_t *p, *g;
        TU_CHECK_OK(ts_judge_param(j, i, &p, &g));
        if (p->ndim == 1)
            fill(p->data, (int)ts_tensor_numel(p), 11 + (unsigned)i);
    }
    float loss;
    TU_CHECK_OK(ts_judge_loss_backward(j, x, y, B, &loss));
    assert_true(isfinite(loss) && loss > 0.0f);
    double worst = 0.0;
    int checked = 0;
    for (int i = 0; i < ts_judge_num_params(j); i++) {
        ts_tensor_t *p, *g;
        TU_CHECK_OK(ts_judge_param(j, i, &p, &g));
        int64_t n = ts_tensor_numel(p);
        float *gs = malloc((size_t)n * sizeof *gs);
        memcpy(gs, g->data, (size_t)n * sizeof *gs);
        for (int64_t k = 0; k < n; k += n / 7 + 1) {
            float *w = (float *)p->data + k, keep = *w;
            const float h = 3e-3f; /* truncation O(h²) and float rounding O(eps/h) both small */
            float lp, lm;
            *w = keep + h;
            TU_CHECK_OK(ts_judge_loss_backward(j, x, y, B, &lp));
            *w = keep - h;
            TU_CHECK_OK(ts_judge_loss_backward(j, x, y, B, &lm));
            *w = keep;
            double fd = ((double)lp - (double)lm) / (2.0 * h);
            double rel = fabs(fd - gs[k]) / (fabs(fd) + fabs(gs[k]) + 1e-3);
            if (rel > worst)
                worst = rel;
            if (rel > 0.05)
                print_error("%s param %d elem %lld: analytic %.6g, finite differences %.6g\n",
                            ts_judge_kind_name(kind), i, (long long)k, (double)gs[k], fd);
            checked++;
        }
        free(gs);
    }
    printf("%s %d×%d×%d: %d gradients checked, worst relative difference %.3g\n",
           ts_judge_kind_name(kind), c0, h0, w0, checked, worst);
    assert_true(worst < 0.05);
    ts_judge_free(j);
}

static void test_gradients_cnn(void **state) {
    check_gradients(*state, TS_JUDGE_CNN, 1, 8, 8);
    check_gradients(*state, TS_JUDGE_CNN, 2, 8, 12);
}
static void test_gradients_ae(void **state) { check_gradients(*state, TS_JUDGE_AE, 1, 8, 8); }

static float gelu(float v) {
    return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
}

/* The cnn's features by plain loops from its parameters: conv, pool, conv, pool, linear, for an
 * image x (c0, h0, w0) as the judge takes it (channels first). */
static void naive_cnn(ts_judge_t *j, const float *x, int c0, int h0, int w0, float *feat) {
    ts_tensor_t *p[6], *g;
    for (int i = 0; i < 6; i++)
        TU_CHECK_OK(ts_judge_param(j, i, &p[i], &g));
    int hs[2] = {h0, h0 / 2}, ws[2] = {w0, w0 / 2}, cs[3] = {c0, 16, 32};
    size_t cap = (size_t)h0 * w0 * 32 + (size_t)h0 * w0 * c0;
    float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap);
    for (int c = 0; c < c0; c++) /* channels-last, [(y·w + x)·c0 + c] */
        for (int q = 0; q < h0 * w0; q++)
            a[q * c0 + c] = x[c * h0 * w0 + q];
    for (int l = 0; l < 2; l++) {
        int h = hs[l], w = ws[l], ci = cs[l], co = cs[l + 1];
        const float *wt = p[2 * l]->data, *bs = p[2 * l + 1]->data;
        for (int y = 0; y < h; y++)
            for (int xx = 0; xx < w; xx++)
                for (int o = 0; o < co; o++) {
                    double sum = bs[o];
                    for (int ky = 0; ky < 3; ky++)
                        for (int kx = 0; kx < 3; kx++)
                            for (int c = 0; c < ci; c++) {
                                int sy = y + ky - 1, sx = xx + kx - 1;
                                if (sy >= 0 && sy < h && sx >= 0 && sx < w)
                                    sum += (double)wt[o * 9 * ci + (ky * 3 + kx) * ci + c] *
                                           a[(sy * w + sx) * ci + c];
                            }
                    b[(y * w + xx) * co + o] = gelu((float)sum);
                }
        for (int y = 0; y < h / 2; y++)
            for (int xx = 0; xx < w / 2; xx++)
                for (int o = 0; o < co; o++)
                    a[(y * (w / 2) + xx) * co + o] =
                        0.25f *
                        (b[(2 * y * w + 2 * xx) * co + o] + b[(2 * y * w + 2 * xx + 1) * co + o] +
                         b[((2 * y + 1) * w + 2 * xx) * co + o] +
                         b[((2 * y + 1) * w + 2 * xx + 1) * co + o]);
    }
    int in = 32 * (h0 / 4) * (w0 / 4);
    const float *wt = p[4]->data, *bs = p[5]->data;
    for (int o = 0; o < 128; o++) {
        double sum = bs[o];
        for (int k = 0; k < in; k++)
            sum += (double)wt[o * in + k] * a[k];
        feat[o] = gelu((float)sum);
    }
    free(a), free(b);
}

/* Square and grey, and two channels on a wide image (the channels-last layout and H ≠ W). */
static void test_cnn_against_loops(void **state) {
    ts_engine_t *e = *state;
    const int shapes[2][3] = {{1, 8, 8}, {2, 8, 12}};
    for (int sh = 0; sh < 2; sh++) {
        int c0 = shapes[sh][0], h0 = shapes[sh][1], w0 = shapes[sh][2], p0 = c0 * h0 * w0;
        ts_judge_t *j;
        char err[256] = "";
        TU_CHECK_RC_MSG(
            ts_judge_create(&j, TS_JUDGE_CNN, c0, h0, w0, K, 5, e, B, 0, err, sizeof err), TS_OK,
            err);
        assert_int_equal(ts_judge_feature_dim(j), 128);
        float *x = malloc(sizeof(float) * B * p0), feat[B * 128], ref[128];
        fill(x, B * p0, 9);
        TU_CHECK_OK(ts_judge_features(j, x, B, feat));
        double worst = 0.0;
        for (int b = 0; b < B; b++) {
            naive_cnn(j, x + b * p0, c0, h0, w0, ref);
            for (int k = 0; k < 128; k++) {
                double d = fabs((double)feat[b * 128 + k] - ref[k]);
                worst = d > worst ? d : worst;
            }
        }
        printf("cnn features of %d×%d×%d images against loops: max |difference| %.3g\n", c0, h0, w0,
               worst);
        assert_true(worst < 1e-5);
        free(x);
        ts_judge_free(j);
    }
}

/* Saved and opened again: the same features, to the bit; the metadata kept. */
static void test_file_round_trip(void **state) {
    ts_engine_t *e = *state;
    char err[256] = "", path[256];
    tu_make_temp_file(path, sizeof path, "test_judge");
    for (int kind = 0; kind < 2; kind++) {
        ts_judge_t *a, *b;
        TU_CHECK_OK(
            ts_judge_create(&a, (ts_judge_kind_t)kind, C, H, W, K, 21, e, B, 0, err, sizeof err));
        TU_CHECK_OK(ts_judge_set_meta(a, "test_accuracy", "0.5"));
        TU_CHECK_RC_MSG(ts_judge_save(a, path, err, sizeof err), TS_OK, err);
        TU_CHECK_RC_MSG(ts_judge_open(&b, path, e, 2, err, sizeof err), TS_OK, err);
        assert_int_equal(ts_judge_kind(b), kind);
        assert_string_equal(ts_judge_meta(b, "test_accuracy"), "0.5");
        assert_string_equal(ts_judge_meta(b, "seed"), "21");
        int D = ts_judge_feature_dim(a);
        float x[2 * P], fa[2 * 128], fb[2 * 128];
        fill(x, 2 * P, 4);
        TU_CHECK_OK(ts_judge_features(a, x, 2, fa));
        TU_CHECK_OK(ts_judge_features(b, x, 2, fb));
        assert_memory_equal(fa, fb, (size_t)(2 * D) * sizeof(float));
        ts_judge_free(a), ts_judge_free(b);
    }
    unlink(path);
}

/* Three classes told apart by where an image is bright: a cnn learns them; an ae learns to
 * reconstruct them better than it did untrained. */
static void test_training_learns(void **state) {
    ts_engine_t *e = *state;
    enum { N = 240 };
    ts_dataset_t d = {.n = N, .channels = C, .height = H, .width = W, .num_classes = K};
    d.images = calloc((size_t)N * P, sizeof(float));
    d.labels = calloc(N, sizeof(int32_t));
    srand(17);
    for (int i = 0; i < N; i++) {
        int k = i % K;
        d.labels[i] = k;
        for (int p = 0; p < P; p++) {
            int row = p / W;
            float noise = ((float)rand() / (float)RAND_MAX - 0.5f) * 0.6f;
            d.images[(int64_t)i * P + p] = (row / 3 == k ? 0.8f : -0.8f) + noise;
        }
    }
    char err[256] = "";
    for (int kind = 0; kind < 2; kind++) {
        ts_judge_t *j;
        TU_CHECK_OK(
            ts_judge_create(&j, (ts_judge_kind_t)kind, C, H, W, K, 3, e, 32, 1, err, sizeof err));
        double before, after;
        TU_CHECK_OK(ts_judge_score(j, &d, &before, err, sizeof err));
        TU_CHECK_RC_MSG(ts_judge_train(j, &d, 150, 32, 3e-3f, 1, 0, NULL, NULL, err, sizeof err),
                        TS_OK, err);
        TU_CHECK_OK(ts_judge_score(j, &d, &after, err, sizeof err));
        printf("%s: score %.4f untrained, %.4f after 150 steps\n",
               ts_judge_kind_name((ts_judge_kind_t)kind), before, after);
        if (kind == TS_JUDGE_CNN)
            assert_true(after > 0.95);
        else
            assert_true(after < 0.5 * before);
        assert_string_equal(ts_judge_meta(j, "steps"), "150");
        ts_judge_free(j);
    }
    ts_dataset_free(&d);
}

static void test_errors(void **state) {
    ts_engine_t *e = *state;
    ts_judge_t *j = NULL;
    char err[256] = "";
    /* a cnn needs sides that are multiples of 4 */
    assert_int_equal(ts_judge_create(&j, TS_JUDGE_CNN, 1, 10, 10, 3, 1, e, 2, 0, err, sizeof err),
                     TS_EINVAL);
    TU_CHECK_CONTAINS(err, "shape");
    assert_null(j);
    ts_judge_kind_t kind;
    assert_int_equal(ts_judge_kind_parse("vae", &kind), TS_EINVAL);
    TU_CHECK_OK(ts_judge_kind_parse("ae", &kind));
    assert_int_equal(kind, TS_JUDGE_AE);
    /* a safetensors file of another kind */
    char path[256];
    tu_make_temp_file(path, sizeof path, "test_judge");
    float w = 1.0f;
    ts_st_entry_t ent = {.name = "x", .dtype = TS_ST_F32, .ndim = 1, .shape = {1}, .data = &w};
    const char *meta[] = {"format", "tessera-classifier/1"};
    TU_CHECK_OK(ts_st_write(path, &ent, 1, meta, 1, err, sizeof err));
    assert_int_equal(ts_judge_open(&j, path, e, 2, err, sizeof err), TS_EKIND);
    TU_CHECK_CONTAINS(err, "not a judge");
    /* a judge file with a tensor of the wrong shape */
    const char *meta2[] = {
        "format", "tessera-judge/1", "kind", "ae",          "channels", "1", "height",
        "8",      "width",           "8",    "num_classes", "0"};
    TU_CHECK_OK(ts_st_write(path, &ent, 1, meta2, 6, err, sizeof err));
    assert_int_equal(ts_judge_open(&j, path, e, 2, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "l0.weight");
    assert_null(j);
    unlink(path);
    /* a cnn needs labels to learn; images of another shape are refused */
    ts_judge_t *t;
    TU_CHECK_OK(ts_judge_create(&t, TS_JUDGE_CNN, C, H, W, K, 1, e, 4, 1, err, sizeof err));
    float imgs[8 * P] = {0};
    ts_dataset_t d = {
        .n = 8, .channels = C, .height = H, .width = W, .num_classes = K, .images = imgs};
    assert_int_equal(ts_judge_train(t, &d, 2, 4, 1e-3f, 1, 0, NULL, NULL, err, sizeof err),
                     TS_EINVAL);
    TU_CHECK_CONTAINS(err, "labels");
    d.height = 4, d.width = 16;
    assert_int_equal(ts_judge_train(t, &d, 2, 4, 1e-3f, 1, 0, NULL, NULL, err, sizeof err),
                     TS_EINVAL);
    TU_CHECK_CONTAINS(err, "the judge's");
    int sc, sh, sw;
    ts_judge_shape(t, &sc, &sh, &sw);
    assert_true(sc == C && sh == H && sw == W);
    ts_judge_free(t);
    /* absurd sizes (a file may claim them) are refused before any arithmetic on them */
    assert_int_equal(ts_judge_create(&t, TS_JUDGE_CNN, 1000000, 1000000, 1000000, 3, 1, e, 2, 0,
                                     err, sizeof err),
                     TS_EINVAL);
    assert_int_equal(
        ts_judge_create(&t, TS_JUDGE_CNN, 1, 1024, 1024, 3, 1, e, 128, 0, err, sizeof err),
        TS_EINVAL); /* its buffers would take ~40 GB */
    /* a NaN image gives no features */
    TU_CHECK_OK(ts_judge_create(&j, TS_JUDGE_AE, C, H, W, K, 1, e, 2, 0, err, sizeof err));
    float x[P], f[32];
    fill(x, P, 1);
    x[5] = NAN;
    assert_int_equal(ts_judge_features(j, x, 1, f), TS_ENONFINITE);
    assert_int_equal(ts_judge_features(j, x, 3, f), TS_EINVAL); /* past max_batch */
    ts_judge_free(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients_cnn),     cmocka_unit_test(test_gradients_ae),
        cmocka_unit_test(test_cnn_against_loops), cmocka_unit_test(test_file_round_trip),
        cmocka_unit_test(test_training_learns),   cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
