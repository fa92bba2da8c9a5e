/*
 * fuzz_partition.c — libFuzzer harness for the two artifacts a node names in its advert and
 * others fetch: the partition file (model/partition.h, ts_partition_load) and the router, a
 * classifier file (model/classifier.h, ts_classifier_open, on a one-thread CPU engine made
 * once). Both loaders read a path, so the input is written to a file under /tmp (mkstemp, made
 * once and removed at exit) and loaded as each.
 *
 * Checked for a partition: a failure leaves *p zeroed and says why; a success has
 * 1 ≤ k ≤ D, 1 ≤ K ≤ n, every assignment in [0, K), sizes equal to the histogram of the
 * assignment with no empty cluster, finite basis, mean and centroids, a 64-hex-digit id; the
 * members of every cluster (ts_partition_members) are sizes[k] increasing indices of that
 * cluster; the mean embeds (ts_partition_embed) to a point whose nearest centroid
 * (ts_partition_nearest) is a cluster, at a non-negative squared distance. For a router: a
 * failure leaves no classifier and says why; a success has its format, at least one output and
 * feature, a time flag of 0 or 1, and, when its images are at most 16×16 pixels, runs a batch of
 * one.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "kernels/engine.h"
#include "kernels/tensor.h"
#include "model/classifier.h"
#include "model/partition.h"

static ts_engine_t engine;
static char path[] = "/tmp/fuzz_partition-XXXXXX";

static void cleanup(void) { unlink(path); }

/* The engine and the file, made once; the file is removed at exit. */
static void setup(void) {
    static int ready;
    if (ready)
        return;
    ts_engine_opts_t o = {.device = TS_CPU, .threads = 1};
    if (ts_engine_init(&engine, &o) != TS_OK)
        abort();
    int fd = mkstemp(path);
    if (fd < 0)
        abort();
    close(fd);
    atexit(cleanup);
    ready = 1;
}

/* The input as the file's contents; 0 on success. */
static int write_input(const uint8_t *data, size_t size) {
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    int ok = fwrite(data, 1, size, fp) == size;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

static void check_partition(const ts_partition_t *p) {
    if (p->k < 1 || p->D < p->k || p->K < 1 || p->n < p->K || p->n > INT32_MAX)
        abort();
    if (!p->basis || !p->mean || !p->centroids || !p->assignment || !p->sizes)
        abort();
    if (!all_finite(p->basis, (int64_t)p->k * p->D) || !all_finite(p->mean, p->D) ||
        !all_finite(p->centroids, (int64_t)p->K * p->k))
        abort();
    if (strlen(p->id) != TS_PARTITION_ID_HEX - 1 ||
        strspn(p->id, "0123456789abcdef") != TS_PARTITION_ID_HEX - 1)
        abort();
    if (!memchr(p->embed, 0, sizeof p->embed) || !memchr(p->dataset, 0, sizeof p->dataset) ||
        !memchr(p->strategy, 0, sizeof p->strategy))
        abort();
    int64_t total = 0;
    for (int k = 0; k < p->K; k++) {
        if (p->sizes[k] < 1)
            abort();
        int32_t *idx = NULL;
        int n = 0;
        if (ts_partition_members(p, k, &idx, &n) != TS_OK)
            abort();
        if (n != p->sizes[k])
            abort();
        for (int i = 0; i < n; i++)
            if (idx[i] < 0 || idx[i] >= p->n || p->assignment[idx[i]] != k ||
                (i > 0 && idx[i] <= idx[i - 1]))
                abort();
        free(idx);
        total += n;
    }
    if (total != p->n)
        abort(); /* every image is in exactly one cluster */
    float *e = malloc((size_t)p->k * sizeof *e), *d2 = malloc((size_t)p->K * sizeof *d2);
    if (!e || !d2)
        abort();
    int32_t nearest = -1;
    if (ts_partition_embed(p, p->mean, 1, e) != TS_OK ||
        ts_partition_nearest(p, e, 1, &nearest, d2) != TS_OK)
        abort();
    if (nearest < 0 || nearest >= p->K)
        abort();
    for (int j = 0; j < p->K; j++)
        if (!(d2[j] >= 0))
            abort();
    free(e);
    free(d2);
}

static int meta_int(const ts_classifier_t *c, const char *key) {
    const char *v = ts_classifier_meta(c, key);
    if (!v)
        abort(); /* the model's own keys are always there */
    return atoi(v);
}

static void check_router(ts_classifier_t *c) {
    const char *fmt = ts_classifier_meta(c, "format");
    if (!fmt || strcmp(fmt, "tessera-classifier/1") != 0)
        abort();
    int D = ts_classifier_feature_dim(c), K = ts_classifier_num_outputs(c),
        tc = ts_classifier_time_conditioned(c);
    if (D < 1 || K < 1 || (tc != 0 && tc != 1))
        abort();
    int S = meta_int(c, "input_size"), C = meta_int(c, "in_channels");
    if (S < 1 || C < 1)
        abort();
    if (S > 16 || C > 4)
        return; /* keep runs fast: only small models go through a forward pass */
    ts_tensor_t x, t;
    if (ts_tensor_alloc(&x, TS_F32, TS_CPU, 4, TS_SHAPE(1, C, S, S)) != TS_OK ||
        ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, TS_SHAPE(1)) != TS_OK)
        abort();
    float *feat = malloc((size_t)D * sizeof *feat), *logits = malloc((size_t)K * sizeof *logits);
    if (!feat || !logits)
        abort();
    if (ts_classifier_run(c, &x, tc ? &t : NULL, 1, feat, logits) != TS_OK)
        abort();
    free(feat);
    free(logits);
    ts_tensor_free(&x);
    ts_tensor_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    if (write_input(data, size) != 0)
        return 0; /* /tmp is full: nothing to learn from this input */
    char err[512] = "";
    ts_partition_t p;
    if (ts_partition_load(path, &p, err, sizeof err) == TS_OK) {
        check_partition(&p);
        ts_partition_free(&p);
    } else {
        static const ts_partition_t zero;
        if (memcmp(&p, &zero, sizeof p) != 0 || !err[0])
            abort(); /* a failure leaves *p zeroed and says why */
    }
    ts_classifier_t *c = (ts_classifier_t *)&engine; /* not NULL: a failure must clear it */
    err[0] = '\0';
    if (ts_classifier_open(&c, path, &engine, 1, err, sizeof err) == TS_OK) {
        if (!c)
            abort();
        check_router(c);
        ts_classifier_free(c);
    } else if (c || !err[0]) {
        abort();
    }
    return 0;
}
