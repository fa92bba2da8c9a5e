/*
 * test_classifier.c — the DiT-trunk classifier and router of model/classifier.h.
 *
 * On a small trunk (8×8 images, patch 4, hidden 16, one block) and a CPU engine:
 *   - the accessors and metadata (feature_dim, num_outputs, time_conditioned, the model's own
 *     keys, which set_meta refuses to overwrite);
 *   - save then open gives the same features and logits bit for bit, for a classifier and for a
 *     time-conditioned router (whose output must depend on t), each trained a few steps first so
 *     the adaLN weights are not zero, and keeps extra metadata;
 *   - files that are not classifiers are refused with a sentence: a DiT file, a truncated file, a
 *     head of the wrong shape;
 *   - the head's gradient against central finite differences of ts_classifier_loss_backward's
 *     loss, with head weights large enough that the softmax is far from uniform;
 *   - training on a small separable synthetic set drives the loss down and the accuracy to 100 %,
 *     and two runs with the same seed give the same losses (every draw is a function of
 *     (seed, step)).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "model/classifier.h"
#include "model/dit_io.h"
#include "model/safetensors.h"
#include "tests/testutil.h"

#define S_ 8 /* image side */
#define K_ 3 /* classes */

static ts_dit_config_t small_trunk(void) {
    ts_dit_config_t c = {.input_size = S_,
                         .in_channels = 1,
                         .patch_size = 4,
                         .hidden_size = 16,
                         .depth = 1,
                         .num_heads = 2,
                         .num_classes = 10,
                         .mlp_ratio = 2,
                         .freq_dim = 8};
    return c;
}

static ts_classifier_t *make(ts_engine_t *e, int tc, int max_batch, int trainable, uint64_t seed) {
    ts_dit_config_t cfg = small_trunk();
    ts_classifier_t *c = NULL;
    TU_CHECK_OK(ts_classifier_create(&c, &cfg, K_, tc, e, max_batch, trainable));
    TU_CHECK_OK(ts_classifier_init_weights(c, seed));
    return c;
}

static void test_accessors_meta(void **state) {
    ts_engine_t *e = *state;
    ts_classifier_t *c = make(e, 0, 4, 0, 1);
    assert_int_equal(ts_classifier_feature_dim(c), 16);
    assert_int_equal(ts_classifier_num_outputs(c), K_);
    assert_int_equal(ts_classifier_time_conditioned(c), 0);
    assert_string_equal(ts_classifier_meta(c, "format"), "tessera-classifier/1");
    assert_string_equal(ts_classifier_meta(c, "num_outputs"), "3");
    assert_string_equal(ts_classifier_meta(c, "time_conditioned"), "0");
    assert_string_equal(ts_classifier_meta(c, "num_classes"), "1"); /* the trunk's null row */
    assert_null(ts_classifier_meta(c, "partition_id"));
    TU_CHECK_OK(ts_classifier_set_meta(c, "partition_id", "abc"));
    TU_CHECK_OK(ts_classifier_set_meta(c, "partition_id", "def"));
    assert_string_equal(ts_classifier_meta(c, "partition_id"), "def");
    assert_int_equal(ts_classifier_set_meta(c, "format", "x"), TS_EINVAL);
    assert_int_equal(ts_classifier_set_meta(c, "hidden_size", "7"), TS_EINVAL);
    assert_int_equal(ts_classifier_set_meta(c, "num_outputs", "7"), TS_EINVAL);
    ts_classifier_free(c);
    ts_classifier_t *r = make(e, 1, 4, 0, 1);
    assert_int_equal(ts_classifier_time_conditioned(r), 1);
    ts_tensor_t x;
    tu_alloc_f32(&x, 4, TS_SHAPE(2, 1, S_, S_));
    float logits[2 * K_];
    assert_int_equal(ts_classifier_run(r, &x, NULL, 2, NULL, logits), TS_EINVAL); /* needs t */
    assert_int_equal(ts_classifier_run(r, &x, NULL, 5, NULL, logits), TS_EINVAL); /* > max */
    ts_tensor_free(&x);
    ts_classifier_free(r);
    ts_dit_config_t cfg = small_trunk();
    assert_int_equal(ts_classifier_create(&c, &cfg, 0, 0, e, 4, 0), TS_EINVAL);
    assert_null(c);
}

/* n images of S_×S_: class k is a bright band in rows [3k, 3k + 2) plus noise. */
static void separable_set(ts_dataset_t *d, int n, tu_rng_t *r) {
    memset(d, 0, sizeof *d);
    d->n = n, d->channels = 1, d->height = S_, d->width = S_, d->num_classes = K_;
    d->images = malloc((size_t)n * S_ * S_ * sizeof(float));
    d->labels = malloc((size_t)n * sizeof(int32_t));
    assert_non_null(d->images);
    assert_non_null(d->labels);
    for (int i = 0; i < n; i++) {
        int k = i % K_;
        d->labels[i] = k;
        for (int py = 0; py < S_; py++)
            for (int px = 0; px < S_; px++)
                d->images[(i * S_ + py) * S_ + px] =
                    (py >= 3 * k && py < 3 * k + 2 ? 0.8f : -0.8f) + tu_rng_uniform(r, -0.3f, 0.3f);
    }
}

/* Trains a fresh classifier for steps and returns the losses (caller frees). */
static float *train(ts_engine_t *e, const ts_dataset_t *d, int tc, int steps,
                    ts_classifier_t **out) {
    ts_classifier_t *c = make(e, tc, 16, 1, 21);
    ts_classifier_train_config_t cfg;
    ts_classifier_train_config_default(&cfg);
    cfg.batch = 16, cfg.lr = 3e-3f, cfg.warmup = 10, cfg.seed = 4;
    ts_classifier_trainer_t *tr = NULL;
    TU_CHECK_OK(ts_classifier_trainer_init(&tr, c, d, d->labels, &cfg));
    float *losses = tu_floats(steps);
    for (int s = 0; s < steps; s++) {
        float acc;
        TU_CHECK_OK(ts_classifier_trainer_step(tr, &losses[s], &acc, NULL));
        assert_true(acc >= 0.0f && acc <= 1.0f);
    }
    assert_int_equal(ts_classifier_trainer_steps_done(tr), steps);
    ts_classifier_trainer_free(tr);
    *out = c;
    return losses;
}

static void roundtrip(ts_engine_t *e, int tc) {
    tu_rng_t r = {7};
    ts_dataset_t ds;
    separable_set(&ds, 16, &r);
    ts_classifier_t *c;
    free(train(e, &ds, tc, 3, &c)); /* a few steps: the adaLN weights leave zero */
    ts_dataset_free(&ds);
    TU_CHECK_OK(ts_classifier_set_meta(c, "partition_id", "0123abcd"));
    ts_tensor_t x, t;
    tu_alloc_f32(&x, 4, TS_SHAPE(5, 1, S_, S_));
    tu_alloc_f32(&t, 1, TS_SHAPE(5));
    tu_fill_uniform(&r, &x, -1, 1);
    tu_fill_uniform(&r, &t, 0, 1);
    float f1[5 * 16], l1[5 * K_], f2[5 * 16], l2[5 * K_];
    TU_CHECK_OK(ts_classifier_run(c, &x, &t, 5, f1, l1));
    char path[512];
    tu_make_temp_file(path, sizeof path, "cls");
    char err[512] = "";
    TU_CHECK_RC_MSG(ts_classifier_save(c, path, err, sizeof err), TS_OK, err);
    ts_classifier_t *d = NULL;
    TU_CHECK_RC_MSG(ts_classifier_open(&d, path, e, 5, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_classifier_run(d, &x, &t, 5, f2, l2));
    assert_memory_equal(f1, f2, sizeof f1);
    assert_memory_equal(l1, l2, sizeof l1);
    assert_string_equal(ts_classifier_meta(d, "partition_id"), "0123abcd");
    assert_int_equal(ts_classifier_feature_dim(d), 16);
    assert_int_equal(ts_classifier_num_outputs(d), K_);
    assert_int_equal(ts_classifier_time_conditioned(d), tc);
    /* a smaller batch gives the same rows */
    float l3[2 * K_];
    ts_tensor_t x2, t2;
    TU_CHECK_OK(ts_tensor_slice(&x2, &x, 0, 2));
    TU_CHECK_OK(ts_tensor_slice(&t2, &t, 0, 2));
    TU_CHECK_OK(ts_classifier_run(d, &x2, &t2, 2, NULL, l3));
    assert_memory_equal(l1, l3, sizeof l3);
    /* a router's answer depends on t, a classifier's does not */
    for (int i = 0; i < 5; i++)
        tu_f32(&t)[i] = 1.0f - tu_f32(&t)[i];
    TU_CHECK_OK(ts_classifier_run(d, &x, &t, 5, f2, l2));
    if (tc)
        assert_true(memcmp(f1, f2, sizeof f1) != 0);
    else
        assert_memory_equal(f1, f2, sizeof f1);
    ts_classifier_free(d);
    ts_classifier_free(c);
    remove(path);
    TU_FREE_TENSORS(&x, &t);
}

static void test_save_open_roundtrip(void **state) {
    roundtrip(*state, 0);
    roundtrip(*state, 1);
}

static void test_bad_files_refused(void **state) {
    ts_engine_t *e = *state;
    char path[512], err[512] = "";
    tu_make_temp_file(path, sizeof path, "clsbad");
    ts_classifier_t *d = (ts_classifier_t *)0x1;

    /* a DiT expert is not a classifier */
    ts_dit_t m;
    ts_dit_config_t cfg = small_trunk();
    TU_CHECK_OK(ts_dit_create(&m, &cfg, e, 1, 0));
    TU_CHECK_OK(ts_dit_save(&m, &m.param_mem, path, TS_ST_F32, NULL, 0, err, sizeof err));
    ts_dit_free(&m);
    assert_int_equal(ts_classifier_open(&d, path, e, 2, err, sizeof err), TS_ECORRUPT);
    assert_null(d);
    TU_CHECK_CONTAINS(err, "format");

    /* a truncated classifier */
    ts_classifier_t *c = make(e, 0, 2, 0, 5);
    TU_CHECK_RC_MSG(ts_classifier_save(c, path, err, sizeof err), TS_OK, err);
    size_t len;
    unsigned char *bytes = tu_read_file(path, &len);
    tu_write_file(path, bytes, len - 5);
    assert_true(ts_classifier_open(&d, path, e, 2, err, sizeof err) != TS_OK);
    assert_null(d);
    assert_true(strlen(err) > 0);

    /* a head of the wrong shape: rewrite the file with head.bias of K + 1 values */
    ts_st_file_t f;
    tu_write_file(path, bytes, len);
    free(bytes);
    TU_CHECK_RC_MSG(ts_st_read(path, &f, err, sizeof err), TS_OK, err);
    ts_st_entry_t *en = calloc((size_t)f.n_tensors, sizeof *en);
    float bias[K_ + 1] = {0};
    for (int i = 0; i < f.n_tensors; i++) {
        const ts_st_tensor_t *t = &f.tensors[i];
        en[i] =
            (ts_st_entry_t){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(en[i].shape, t->shape, sizeof en[i].shape);
        if (strcmp(t->name, "head.bias") == 0) {
            en[i].shape[0] = K_ + 1;
            en[i].data = bias;
        }
    }
    const char **meta = calloc(2 * (size_t)f.n_meta, sizeof *meta);
    for (int i = 0; i < f.n_meta; i++)
        meta[2 * i] = f.meta_keys[i], meta[2 * i + 1] = f.meta_vals[i];
    char path2[512];
    tu_make_temp_file(path2, sizeof path2, "clsbad2");
    TU_CHECK_RC_MSG(ts_st_write(path2, en, f.n_tensors, meta, f.n_meta, err, sizeof err), TS_OK,
                    err);
    assert_int_equal(ts_classifier_open(&d, path2, e, 2, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "head.bias");
    free(meta);
    free(en);
    ts_st_free(&f);
    ts_classifier_free(c);

    /* metadata only, with a trunk of 256×256 in 1×1 patches: ~17 GB of activations for 2
     * samples, refused before anything that size is allocated (tests/fuzz/fuzz_partition) */
    static const char big[] =
        "{\"__metadata__\":{\"format\":\"tessera-classifier/1\",\"input_size\":\"256\","
        "\"patch_size\":\"1\",\"in_channels\":\"1\",\"hidden_size\":\"4\",\"depth\":\"1\","
        "\"num_heads\":\"1\",\"num_classes\":\"1\",\"mlp_ratio\":\"1\",\"freq_dim\":\"2\","
        "\"num_outputs\":\"2\",\"time_conditioned\":\"0\"}}";
    unsigned char hdr[8 + sizeof big];
    uint64_t n = sizeof big - 1;
    for (int i = 0; i < 8; i++)
        hdr[i] = (unsigned char)(n >> (8 * i));
    memcpy(hdr + 8, big, n);
    tu_write_file(path, hdr, 8 + n);
    d = (ts_classifier_t *)0x1;
    assert_true(ts_classifier_open(&d, path, e, 2, err, sizeof err) != TS_OK);
    assert_null(d);
    TU_CHECK_CONTAINS(err, "cannot build the model");
    remove(path);
    remove(path2);
}

/* The loss of one batch at the current parameters. */
static double loss_at(ts_classifier_t *c, const ts_tensor_t *x, const int32_t *y, int B) {
    float l;
    TU_CHECK_OK(ts_classifier_loss_backward(c, x, NULL, y, B, &l));
    return l;
}

static void test_head_gradient_fd(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {11};
    const int B = 4;
    ts_classifier_t *c = make(e, 0, B, 1, 9);
    ts_tensor_t x, w, b, dw, db;
    tu_alloc_f32(&x, 4, TS_SHAPE(B, 1, S_, S_));
    tu_fill_uniform(&r, &x, -1, 1);
    int32_t y[4] = {0, 2, 1, 2};
    TU_CHECK_OK(ts_classifier_head(c, &w, &b, &dw, &db));
    tu_fill_uniform(&r, &w, -1, 1); /* logits of order 1: a softmax far from uniform */
    tu_fill_uniform(&r, &b, -0.5f, 0.5f);
    float l0;
    TU_CHECK_OK(ts_classifier_loss_backward(c, &x, NULL, y, B, &l0));
    assert_true(l0 > 0.0f && isfinite(l0));
    float *g_w = tu_host_copy(&dw), *g_b = tu_host_copy(&db);
    ts_tensor_t *params[2] = {&w, &b};
    float *grads[2] = {g_w, g_b};
    const double h = 1e-2;
    for (int p = 0; p < 2; p++) {
        int64_t n = ts_tensor_numel(params[p]);
        double gmax = 0;
        for (int64_t i = 0; i < n; i++)
            gmax = fmax(gmax, fabs(grads[p][i]));
        assert_true(gmax > 1e-3); /* the check below must be able to fail */
        for (int64_t i = 0; i < n; i++) {
            float *v = &tu_f32(params[p])[i], v0 = *v;
            float vp = (float)(v0 + h), vm = (float)(v0 - h);
            *v = vp;
            double Lp = loss_at(c, &x, y, B);
            *v = vm;
            double Lm = loss_at(c, &x, y, B);
            *v = v0;
            double fd = (Lp - Lm) / ((double)vp - (double)vm);
            tu_check_scalar(grads[p][i], fd, 2e-3 * fabs(fd) + 5e-4 * gmax + 2e-5, "d%s[%lld]",
                            p ? "bias" : "weight", (long long)i);
        }
    }
    free(g_w);
    free(g_b);
    ts_tensor_free(&x);
    ts_classifier_free(c);
}

static void test_training_separable(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {13};
    ts_dataset_t d;
    separable_set(&d, 48, &r);
    ts_classifier_t *c, *c2;
    const int steps = 120;
    float *l1 = train(e, &d, 0, steps, &c);
    float *l2 = train(e, &d, 0, steps, &c2);
    assert_memory_equal(l1, l2, steps * sizeof *l1); /* (seed, step) → the same run */
    double first = (l1[0] + l1[1] + l1[2]) / 3, last = (l1[steps - 1] + l1[steps - 2]) / 2;
    if (!(last < 0.1 * first)) {
        print_error("loss went from %g to %g, expected a 10x drop\n", first, last);
        fail();
    }
    ts_tensor_t x;
    int right = 0;
    for (int lo = 0; lo < d.n; lo += 16) {
        float logits[16 * K_];
        TU_CHECK_OK(ts_tensor_wrap(&x, d.images + lo * S_ * S_, TS_F32, TS_CPU, 4,
                                   TS_SHAPE(16, 1, S_, S_)));
        TU_CHECK_OK(ts_classifier_run(c, &x, NULL, 16, NULL, logits));
        for (int i = 0; i < 16; i++) {
            const float *z = logits + i * K_;
            int best = z[1] > z[0] ? 1 : 0;
            best = z[2] > z[best] ? 2 : best;
            right += best == d.labels[lo + i];
        }
    }
    assert_int_equal(right, d.n);
    free(l1);
    free(l2);
    ts_classifier_free(c);
    ts_classifier_free(c2);

    /* a router trains on noisy x_t: a few steps run, the loss stays finite, and the targets must
     * be in range */
    float *l3 = train(e, &d, 1, 5, &c);
    for (int s = 0; s < 5; s++)
        assert_true(isfinite(l3[s]));
    free(l3);
    ts_classifier_train_config_t cfg;
    ts_classifier_train_config_default(&cfg);
    cfg.batch = 16;
    ts_classifier_trainer_t *tr = NULL;
    int32_t *bad = malloc((size_t)d.n * sizeof *bad);
    memcpy(bad, d.labels, (size_t)d.n * sizeof *bad);
    bad[7] = K_;
    assert_int_equal(ts_classifier_trainer_init(&tr, c, &d, bad, &cfg), TS_ERANGE);
    assert_null(tr);
    free(bad);
    ts_classifier_free(c);
    ts_dataset_free(&d);
}

/* A label-aware router (num_labels = 3) on images that carry no information (noise) with the
 * label as its target: trained with label dropout it answers the label when given it and (about)
 * uniformly for the null label, which is bit for bit ts_classifier_run; it keeps num_labels
 * through a file; labels out of range are refused; a router without labels ignores them; the
 * trainer wants labelled data. */
static void test_label_aware(void **state) {
    ts_engine_t *e = *state;
    enum { N = 48, B = 16 };
    tu_rng_t r = {29};
    ts_dataset_t d;
    separable_set(&d, N, &r);
    for (int i = 0; i < N * S_ * S_; i++)
        d.images[i] = tu_rng_uniform(&r, -1.0f, 1.0f); /* no class information in the image */
    ts_dit_config_t cfg = small_trunk();
    ts_classifier_t *c = NULL;
    TU_CHECK_OK(ts_classifier_create_labelled(&c, &cfg, K_, K_, 1, e, B, 1));
    TU_CHECK_OK(ts_classifier_init_weights(c, 5));
    assert_int_equal(ts_classifier_num_labels(c), K_);
    assert_string_equal(ts_classifier_meta(c, "num_labels"), "3");
    assert_string_equal(ts_classifier_meta(c, "num_classes"), "3");
    assert_int_equal(ts_classifier_set_meta(c, "num_labels", "2"), TS_EINVAL);
    ts_classifier_train_config_t tc;
    ts_classifier_train_config_default(&tc);
    tc.batch = B, tc.lr = 3e-3f, tc.warmup = 10, tc.seed = 2, tc.label_dropout = 0.1f;
    ts_classifier_trainer_t *tr = NULL;
    TU_CHECK_OK(ts_classifier_trainer_init(&tr, c, &d, d.labels, &tc));
    for (int s = 0; s < 200; s++)
        TU_CHECK_OK(ts_classifier_trainer_step(tr, NULL, NULL, NULL));
    ts_classifier_trainer_free(tr);

    ts_tensor_t x, t;
    TU_CHECK_OK(ts_tensor_wrap(&x, d.images, TS_F32, TS_CPU, 4, TS_SHAPE(B, 1, S_, S_)));
    tu_alloc_f32(&t, 1, TS_SHAPE(B));
    tu_fill_uniform(&r, &t, 0, 1);
    float with[B * K_], none[B * K_], plain[B * K_];
    TU_CHECK_OK(ts_classifier_run_labels(c, &x, &t, d.labels, B, NULL, with));
    int32_t nulls[B];
    for (int i = 0; i < B; i++)
        nulls[i] = K_;
    TU_CHECK_OK(ts_classifier_run_labels(c, &x, &t, nulls, B, NULL, none));
    TU_CHECK_OK(ts_classifier_run(c, &x, &t, B, NULL, plain));
    assert_memory_equal(none, plain, sizeof none);
    double h_with = 0.0, h_none = 0.0; /* mean entropies (nats) of the two answers */
    for (int i = 0; i < B; i++) {
        const float *z = with + i * K_;
        int best = z[1] > z[0] ? 1 : 0;
        best = z[2] > z[best] ? 2 : best;
        assert_int_equal(best, d.labels[i]); /* the label alone decides */
        for (int v = 0; v < 2; v++) {
            const float *q = v ? none + i * K_ : z;
            double mx = fmax(q[0], fmax(q[1], q[2])), zs = 0.0, h = 0.0;
            for (int k = 0; k < K_; k++)
                zs += exp(q[k] - mx);
            for (int k = 0; k < K_; k++) {
                double p = exp(q[k] - mx) / zs;
                h -= p > 0 ? p * log(p) : 0.0;
            }
            *(v ? &h_none : &h_with) += h / B;
        }
    }
    /* without the label the router is unsure (the image says nothing), with it sure */
    if (!(h_with < 0.2 && h_none > h_with + 0.3)) {
        print_error("mean entropy %g with the labels, %g without: want < 0.2 and 0.3 more\n",
                    h_with, h_none);
        fail();
    }
    int32_t bad[B];
    memcpy(bad, d.labels, sizeof bad);
    bad[3] = K_ + 1;
    assert_int_equal(ts_classifier_run_labels(c, &x, &t, bad, B, NULL, with), TS_ERANGE);

    /* through a file */
    char path[512], err[512] = "";
    tu_make_temp_file(path, sizeof path, "lab");
    TU_CHECK_RC_MSG(ts_classifier_save(c, path, err, sizeof err), TS_OK, err);
    ts_classifier_t *o = NULL;
    TU_CHECK_RC_MSG(ts_classifier_open(&o, path, e, B, err, sizeof err), TS_OK, err);
    assert_int_equal(ts_classifier_num_labels(o), K_);
    float again[B * K_], before[B * K_];
    TU_CHECK_OK(ts_classifier_run_labels(c, &x, &t, d.labels, B, NULL, before));
    TU_CHECK_OK(ts_classifier_run_labels(o, &x, &t, d.labels, B, NULL, again));
    assert_memory_equal(before, again, sizeof again);
    ts_classifier_free(o);
    remove(path);

    /* a router without labels ignores them; the trainer of a label-aware one wants labels */
    ts_classifier_t *u = make(e, 1, B, 0, 3);
    TU_CHECK_OK(ts_classifier_run_labels(u, &x, &t, bad, B, NULL, with));
    TU_CHECK_OK(ts_classifier_run(u, &x, &t, B, NULL, plain));
    assert_memory_equal(with, plain, sizeof with);
    ts_classifier_free(u);
    int32_t *labels = d.labels;
    d.labels = NULL;
    assert_int_equal(ts_classifier_trainer_init(&tr, c, &d, labels, &tc), TS_EINVAL);
    d.labels = labels;
    tc.label_dropout = 1.5f;
    assert_int_equal(ts_classifier_trainer_init(&tr, c, &d, labels, &tc), TS_EINVAL);
    ts_tensor_free(&t);
    ts_classifier_free(c);
    ts_dataset_free(&d);
}

/* The expert objectives' loss and gradient (ts_router_objective_loss) against central finite
 * differences in double, on random logits and random positive semi-definite Gram matrices; and
 * their fixed points: alignment's loss is smallest when the logits are the targets' log-odds,
 * mixture's gradient pushes weight towards the expert with the lowest loss. */
static void test_router_objectives_fd(void **state) {
    (void)state;
    enum { B = 3, K = 4, P = 6 };
    tu_rng_t r = {99};
    float z[B * K], dz[B * K], dz2[B * K];
    double G[B * K * K];
    for (int b = 0; b < B; b++) {
        double res[K][P]; /* residuals: G = R Rᵀ / P is PSD */
        for (int k = 0; k < K; k++)
            for (int p = 0; p < P; p++)
                res[k][p] = tu_rng_uniform(&r, -1.0f, 1.0f) * (1.0 + k * 0.3);
        for (int j = 0; j < K; j++)
            for (int k = 0; k < K; k++) {
                double sum = 0.0;
                for (int p = 0; p < P; p++)
                    sum += res[j][p] * res[k][p];
                G[(b * K + j) * K + k] = sum / P;
            }
    }
    for (int i = 0; i < B * K; i++)
        z[i] = tu_rng_uniform(&r, -2.0f, 2.0f);
    for (int obj = TS_ROUTER_ALIGNMENT; obj <= TS_ROUTER_MIXTURE; obj++) {
        float tau = 0.3f;
        ts_router_objective_loss((ts_router_objective_t)obj, z, G, B, K, tau, dz);
        for (int i = 0; i < B * K; i++) {
            const float h = 1e-2f;
            float zp[B * K], zm[B * K];
            memcpy(zp, z, sizeof z);
            memcpy(zm, z, sizeof z);
            zp[i] += h, zm[i] -= h;
            double lp = ts_router_objective_loss((ts_router_objective_t)obj, zp, G, B, K, tau, dz2);
            double lm = ts_router_objective_loss((ts_router_objective_t)obj, zm, G, B, K, tau, dz2);
            double fd = (lp - lm) / (2.0 * h);
            tu_check_scalar(dz[i], fd, 2e-4 + 2e-3 * fabs(fd), "objective %d, logit %d", obj, i);
        }
    }
    /* alignment: at z = −diag(G)/τ the gradient vanishes (p = q) */
    float zq[B * K];
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++)
            zq[b * K + k] = (float)(-G[(b * K + k) * K + k] / 0.3);
    ts_router_objective_loss(TS_ROUTER_ALIGNMENT, zq, G, B, K, 0.3f, dz);
    for (int i = 0; i < B * K; i++)
        assert_true(fabsf(dz[i]) < 1e-6f);
    /* mixture with a diagonal G at equal weights: the lowest-loss expert gains */
    double D[K * K] = {0};
    for (int k = 0; k < K; k++)
        D[k * K + k] = 1.0 + k;
    float z0[K] = {0};
    ts_router_objective_loss(TS_ROUTER_MIXTURE, z0, D, 1, K, 1.0f, dz);
    for (int k = 1; k < K; k++)
        assert_true(dz[0] < dz[k]);
}

/* A router trained with the alignment objective against fixed residuals that make expert
 * (label mod K) the best for every sample learns to pick it: its loss falls. */
static int fake_residuals(void *ctx, const ts_tensor_t *xt, const ts_tensor_t *t,
                          const ts_tensor_t *vel, const int32_t *labels, int B, double *G) {
    (void)xt, (void)t, (void)vel;
    int *calls = ctx;
    (*calls)++;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < K_; j++)
            for (int k = 0; k < K_; k++)
                G[(b * K_ + j) * K_ + k] = j == k ? (k == labels[b] % K_ ? 0.1 : 1.0) : 0.0;
    return TS_OK;
}

static void test_router_alignment_training(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {17};
    ts_dataset_t d;
    separable_set(&d, 48, &r);
    ts_classifier_t *c = make(e, 1, 16, 1, 21);
    ts_classifier_train_config_t cfg;
    ts_classifier_train_config_default(&cfg);
    cfg.batch = 16, cfg.lr = 3e-3f, cfg.warmup = 10, cfg.seed = 4;
    cfg.objective = TS_ROUTER_ALIGNMENT, cfg.align_tau = 0.1f;
    int calls = 0;
    cfg.residuals = fake_residuals, cfg.residuals_ctx = &calls;
    int32_t *zeros = calloc((size_t)d.n, sizeof *zeros); /* the cluster targets are unused */
    ts_classifier_trainer_t *tr = NULL;
    TU_CHECK_OK(ts_classifier_trainer_init(&tr, c, &d, zeros, &cfg));
    float first = 0, last = 0, loss, acc;
    const int steps = 150;
    for (int s = 0; s < steps; s++) {
        TU_CHECK_OK(ts_classifier_trainer_step(tr, &loss, &acc, NULL));
        if (s < 3)
            first += loss / 3;
        if (s >= steps - 3)
            last += loss / 3;
    }
    assert_int_equal(calls, steps);
    if (!(last < 0.5f * first)) {
        print_error("alignment loss went from %g to %g, expected it to halve\n", first, last);
        fail();
    }
    ts_classifier_trainer_free(tr);
    /* the expert objectives need residuals and a time-conditioned model */
    cfg.residuals = NULL;
    assert_int_equal(ts_classifier_trainer_init(&tr, c, &d, zeros, &cfg), TS_EINVAL);
    free(zeros);
    ts_classifier_free(c);
    ts_dataset_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_objectives_fd),      cmocka_unit_test(test_accessors_meta),
        cmocka_unit_test(test_save_open_roundtrip),       cmocka_unit_test(test_bad_files_refused),
        cmocka_unit_test(test_head_gradient_fd),          cmocka_unit_test(test_training_separable),
        cmocka_unit_test(test_router_alignment_training), cmocka_unit_test(test_label_aware),
    };
    return cmocka_run_group_tests_name("classifier", tests, tu_setup_cpu_engine,
                                       tu_teardown_cpu_engine);
}
