/*
 * cmd_calibrate.c — `tessera calibrate`: how calibrated a router's probabilities are along t: per
 * t-bucket on held-out test images (nearest-centroid truth), accuracy, NLL and expected
 * calibration error (model/quality.h), and the temperature that minimises the NLL — per bucket
 * and one for every t, each fitted on the first half of the images and scored on the second. The
 * class prior of class-aware routing multiplies p(k | x_t) as if it were calibrated; `eval
 * --policies POLICY+temp=T` applies the temperature. What it shares with train-router is in
 * classify.h.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/args.h"
#include "client/classify.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "model/quality.h"

#define CAL_BINS_DEFAULT 15

typedef struct {
    double acc, nll, ece;   /* raw logits, on the scoring half */
    double T, nll_t, ece_t; /* this bucket's own temperature (fitted on the fitting half) */
    double ece_g, nll_g;    /* the global temperature */
} cal_bucket_t;

/* Logits (n, K) of the router for the first n test images in t-bucket j. */
static int bucket_logits(ts_classifier_t *c, ts_engine_t *e, const ts_dataset_t *test, int n, int B,
                         int j, float *out) {
    eval_bufs_t b;
    int K = ts_classifier_num_outputs(c);
    int rc = ts_classify_eval_init(&b, e, test, B, K);
    for (int lo = 0; lo < n && rc == TS_OK; lo += B) {
        int m = n - lo < B ? n - lo : B;
        rc = ts_classify_eval_batch(c, e, &b, test, lo, m, j);
        if (rc == TS_OK)
            memcpy(out + (int64_t)lo * K, b.logits, (size_t)m * K * sizeof *out);
    }
    ts_classify_eval_free(&b);
    return rc;
}

/* One bucket's statistics: fit on rows [0, h), score on [h, n). */
static int cal_score(const float *z, const int32_t *y, int n, int K, int bins, double Tg,
                     cal_bucket_t *q, char *err, size_t errlen) {
    int h = n / 2;
    const float *zs = z + (int64_t)h * K;
    const int32_t *ys = y + h;
    int right = 0;
    for (int i = h; i < n; i++)
        right += ts_classify_argmax(z + (int64_t)i * K, K) == y[i];
    q->acc = (double)right / (n - h);
    TS_TRY(ts_calib_nll(zs, ys, n - h, K, 1.0, &q->nll, err, errlen));
    TS_TRY(ts_calib_ece(zs, ys, n - h, K, 1.0, bins, &q->ece, err, errlen));
    TS_TRY(ts_calib_fit_temperature(z, y, h, K, &q->T, err, errlen));
    TS_TRY(ts_calib_nll(zs, ys, n - h, K, q->T, &q->nll_t, err, errlen));
    TS_TRY(ts_calib_ece(zs, ys, n - h, K, q->T, bins, &q->ece_t, err, errlen));
    TS_TRY(ts_calib_nll(zs, ys, n - h, K, Tg, &q->nll_g, err, errlen));
    return ts_calib_ece(zs, ys, n - h, K, Tg, bins, &q->ece_g, err, errlen);
}

static void cal_print(const char *router, int n, double Tg, const cal_bucket_t *q, int json) {
    if (json) {
        json_t *list = json_array();
        for (int j = 0; j < N_BUCKETS; j++)
            json_array_append_new(
                list,
                json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "t_lo", j / 10.0,
                          "t_hi", (j + 1) / 10.0, "accuracy", q[j].acc, "nll", q[j].nll, "ece",
                          q[j].ece, "temperature", q[j].T, "nll_fit", q[j].nll_t, "ece_fit",
                          q[j].ece_t, "nll_global", q[j].nll_g, "ece_global", q[j].ece_g));
        ts_json_print(json_pack("{s:s, s:i, s:f, s:o}", "router", router, "n", n, "temperature", Tg,
                                "buckets", list));
        return;
    }
    printf("router calibration on %d test images per t-bucket (nearest-centroid truth); each "
           "temperature fitted on the first half, every number scored on the second\n",
           n);
    printf("  t bucket     accuracy   NLL    ECE   |  T (own)  NLL    ECE   |  ECE at T = %.3f\n",
           Tg);
    for (int j = 0; j < N_BUCKETS; j++)
        printf("  [%.1f, %.1f)   %.3f   %6.3f %6.3f |  %6.3f  %6.3f %6.3f |  %6.3f\n", j / 10.0,
               (j + 1) / 10.0, q[j].acc, q[j].nll, q[j].ece, q[j].T, q[j].nll_t, q[j].ece_t,
               q[j].ece_g);
    printf("one temperature for every t: %.4f (eval --policies 'learned+prior+temp=%.3f:top1')\n",
           Tg, Tg);
}

typedef struct {
    const char *router, *partition, *fmnist_dir;
    int n, bins, batch, threads, json;
} cal_opts_t;

/* Everything one calibration opens and allocates (cal_free releases it all). */
typedef struct {
    cal_opts_t o;
    ts_engine_t eng;
    ts_classifier_t *c;
    ts_partition_t p;
    ts_dataset_t test;
    int K, h;       /* clusters; the fitting half of the n images */
    float *z, *emb; /* (buckets, n, K) logits */
    float *zf;      /* (buckets, h, K) the fitting halves, for the global temperature */
    int32_t *truth; /* (n) nearest centroids */
    int32_t *yf;    /* (buckets, h) */
    double Tg;      /* the global temperature */
    cal_bucket_t q[N_BUCKETS];
    char err[512];
} cal_run_t;

/* The options from the command line: TS_ARGS_RUN, or the exit code (ts_args_parse). */
static int cal_parse(int argc, char **argv, cal_opts_t *o) {
    *o = (cal_opts_t){
        .fmnist_dir = TS_FMNIST_DEFAULT_DIR, .n = 2000, .bins = CAL_BINS_DEFAULT, .batch = 64};
    /* clang-format off */
    ts_arg_t args[] = {
        {"router", TS_ARG_STRING, &o->router, "FILE", "the router (`tessera train-router`)", 0, 0, 1},
        {"partition", TS_ARG_STRING, &o->partition, "DIR", "its partition (a folder with partition.safetensors, or the file): the truth is each test image's nearest centroid", 0, 0, 1},
        {"data", TS_ARG_STRING, &o->fmnist_dir, "DIR", "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"n", TS_ARG_INT, &o->n, "N", "test images per t-bucket, half to fit and half to score (default 2000)", 4, 10000},
        {"bins", TS_ARG_INT, &o->bins, "B", "confidence bins of the expected calibration error (default 15)", 1, 1000},
        {"batch", TS_ARG_INT, &o->batch, "B", "images per forward (default 64)", 1, 4096},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print one JSON object on stdout instead of the table"},
    };
    /* clang-format on */
    return ts_args_parse("tessera calibrate",
                         "How calibrated a router's p(k | x_t) is along t (accuracy, NLL, "
                         "expected calibration error per t-bucket on held-out test images) and "
                         "the temperature that calibrates it (temperature scaling), per bucket "
                         "and one for every t.\nexample: tessera calibrate --router "
                         "experts/router.safetensors --partition experts",
                         args, (int)(sizeof args / sizeof args[0]), argc, argv);
}

/* The engine, the router, its partition and the test split (--n at most its size). */
static int cal_open(cal_run_t *r) {
    cal_opts_t *o = &r->o;
    char *err = r->err;
    size_t errlen = sizeof r->err;
    ts_engine_opts_t eo = {TS_CPU, o->threads, 0};
    int rc = ts_engine_init(&r->eng, &eo);
    if (rc == TS_OK)
        rc = ts_classifier_open(&r->c, o->router, &r->eng, o->batch, err, errlen);
    if (rc == TS_OK && !ts_classifier_time_conditioned(r->c)) {
        snprintf(err, errlen, "%s is not a router (it does not take t)", o->router);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK)
        rc = ts_classify_load_partition(o->partition, &r->p, err, errlen);
    if (rc == TS_OK && (r->K = ts_classifier_num_outputs(r->c)) != r->p.K) {
        snprintf(err, errlen, "the router scores %d clusters, the partition has %d", r->K, r->p.K);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK)
        rc = ts_fmnist_load(o->fmnist_dir, "test", &r->test, err, errlen);
    o->n = rc == TS_OK && o->n > r->test.n ? r->test.n : o->n;
    r->h = o->n / 2;
    return rc;
}

/* Every bucket's logits of the n images and their nearest centroids; the fitting halves apart. */
static int cal_logits(cal_run_t *r) {
    int n = r->o.n, h = r->h, K = r->K;
    r->z = malloc((size_t)N_BUCKETS * n * K * sizeof *r->z);
    r->zf = malloc((size_t)N_BUCKETS * h * K * sizeof *r->zf);
    r->yf = malloc((size_t)N_BUCKETS * h * sizeof *r->yf);
    r->truth = malloc((size_t)n * sizeof *r->truth);
    r->emb = malloc((size_t)n * r->p.k * sizeof *r->emb);
    int rc = r->z && r->zf && r->yf && r->truth && r->emb
                 ? ts_partition_embed(&r->p, r->test.images, n, r->emb)
                 : TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_partition_nearest(&r->p, r->emb, n, r->truth, NULL);
    for (int j = 0; j < N_BUCKETS && rc == TS_OK; j++) {
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "\rt-bucket %d/%d", j + 1, N_BUCKETS);
        rc = bucket_logits(r->c, &r->eng, &r->test, n, r->o.batch, j, r->z + (int64_t)j * n * K);
        memcpy(r->zf + (int64_t)j * h * K, r->z + (int64_t)j * n * K,
               (size_t)h * K * sizeof *r->zf);
        memcpy(r->yf + (int64_t)j * h, r->truth, (size_t)h * sizeof *r->yf);
    }
    return rc;
}

/* The global temperature on every bucket's fitting half, then each bucket's statistics. */
static int cal_fit(cal_run_t *r) {
    int n = r->o.n, K = r->K;
    r->Tg = 1.0;
    int rc = ts_calib_fit_temperature(r->zf, r->yf, (int64_t)N_BUCKETS * r->h, K, &r->Tg, r->err,
                                      sizeof r->err);
    for (int j = 0; j < N_BUCKETS && rc == TS_OK; j++)
        rc = cal_score(r->z + (int64_t)j * n * K, r->truth, n, K, r->o.bins, r->Tg, &r->q[j],
                       r->err, sizeof r->err);
    return rc;
}

static void cal_free(cal_run_t *r) {
    free(r->z), free(r->zf), free(r->yf), free(r->truth), free(r->emb);
    ts_dataset_free(&r->test);
    ts_partition_free(&r->p);
    ts_classifier_free(r->c);
    ts_engine_free(&r->eng);
}

int ts_cmd_calibrate(int argc, char **argv) {
    cal_run_t *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    int pr = cal_parse(argc, argv, &r->o);
    if (pr != TS_ARGS_RUN) {
        free(r);
        return pr;
    }
    int rc = cal_open(r);
    if (rc == TS_OK)
        rc = cal_logits(r);
    if (isatty(STDERR_FILENO)) /* the end of the progress line */
        fprintf(stderr, "\r%30s\r", "");
    if (rc == TS_OK)
        rc = cal_fit(r);
    if (rc == TS_OK)
        cal_print(r->o.router, r->o.n, r->Tg, r->q, r->o.json);
    int code = rc == TS_OK ? 0 : ts_args_fail("tessera calibrate", r->err, rc);
    cal_free(r);
    free(r);
    return code;
}
