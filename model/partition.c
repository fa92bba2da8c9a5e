/*
 * partition.c — the partition artifact (model/partition.h): fit (PCA of model/pca.c, then the
 * k-means of model/kmeans.c, or given clusters), save, load with its checks, embed and nearest.
 *
 * Determinism is the invariant everything here keeps: a partition is named by the hash of its
 * bytes, so the same data and seed must give the same bytes on any machine with the same BLAS and
 * for any --threads. Hence (a) every parallel loop runs over blocks fixed by the problem size,
 * never by the thread count, and each block writes its own outputs or its own partial sum, which
 * are then combined in block order; (b) every sum whose order could vary is in double and done in
 * a fixed order; (c) BLAS runs single-threaded inside our blocks; (d) random draws are pure
 * functions of (seed, stage, restart, draw) on the Philox stream.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/partition.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/str.h"
#include "kernels/math.h"
#include "model/latents.h"
#include "model/safetensors.h"

/* ---- the partition artifact -------------------------------------------------------------- */

void ts_partition_free(ts_partition_t *p) {
    if (!p)
        return;
    free(p->basis);
    free(p->mean);
    free(p->centroids);
    free(p->assignment);
    free(p->sizes);
    memset(p, 0, sizeof *p);
}

typedef struct {
    const ts_partition_opts_t *o;
    int fine;
} fit_progress_t;

static void fit_line(const ts_partition_opts_t *o, const char *fmt, ...) TS_PRINTF(2, 3);

static void fit_line(const ts_partition_opts_t *o, const char *fmt, ...) {
    if (!o->progress)
        return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->progress(o->ctx, line);
}

static void fit_restart(void *ctx, int stage, int restart, int restarts, double inertia,
                        int iters) {
    const fit_progress_t *f = ctx;
    const char *what = !f->fine ? "k-means" : stage == 0 ? "fine k-means" : "coarse k-means";
    fit_line(f->o, "%s (K = %d) restart %d/%d: inertia %.6g%s after %d iteration%s", what,
             f->fine && stage == 0 ? f->fine : f->o->experts, restart + 1, restarts, inertia,
             stage == 1 ? " (over the fine centroids, weighted by size)" : "", iters,
             iters == 1 ? "" : "s");
}

/* km = the clusters assign (n) of the points e (n, dims): the assignment copied, centroids the
 * clusters' means and the inertia, both accumulated in double in point order. Every cluster must
 * hold a point. */
static int given_clusters(const float *e, int64_t n, int dims, int K, const int32_t *assign,
                          ts_kmeans_t *km, char *err, size_t errlen) {
    memset(km, 0, sizeof *km);
    double *sum = calloc((size_t)K * dims, sizeof *sum);
    int64_t *count = calloc((size_t)K, sizeof *count);
    km->assignment = malloc((size_t)n * sizeof *km->assignment);
    km->centroids = malloc((size_t)K * dims * sizeof *km->centroids);
    int rc = sum && count && km->assignment && km->centroids ? TS_OK : TS_ENOMEM;
    for (int64_t i = 0; i < n && rc == TS_OK; i++) {
        if (assign[i] < 0 || assign[i] >= K) {
            ts_set_err(err, errlen,
                       "partition: point %" PRId64 " is given cluster %d, not in [0, %d)", i,
                       (int)assign[i], K);
            rc = TS_EINVAL;
            break;
        }
        km->assignment[i] = assign[i];
        count[assign[i]]++;
        for (int j = 0; j < dims; j++)
            sum[(int64_t)assign[i] * dims + j] += e[i * dims + j];
    }
    for (int k = 0; k < K && rc == TS_OK; k++) {
        if (count[k] == 0) {
            ts_set_err(err, errlen, "partition: cluster %d of the given %d is empty", k, K);
            rc = TS_EINVAL;
        }
        for (int j = 0; j < dims && rc == TS_OK; j++)
            km->centroids[k * dims + j] = (float)(sum[(int64_t)k * dims + j] / (double)count[k]);
    }
    double inertia = 0.0;
    for (int64_t i = 0; i < n && rc == TS_OK; i++)
        for (int j = 0; j < dims; j++) {
            double d = (double)e[i * dims + j] - km->centroids[assign[i] * dims + j];
            inertia += d * d;
        }
    km->inertia = inertia;
    km->K = K;
    km->dims = dims;
    km->n = n;
    free(sum);
    free(count);
    if (rc != TS_OK) {
        if (rc == TS_ENOMEM)
            ts_set_err(err, errlen, "partition: out of memory");
        ts_kmeans_free(km);
    }
    return rc;
}

int ts_partition_fit(const float *x, int64_t n, int D, const ts_partition_opts_t *opts,
                     ts_partition_t *p, char *err, size_t errlen) {
    if (!p)
        return TS_EINVAL;
    memset(p, 0, sizeof *p);
    if (!x || !opts || D < 1 || n < 2) {
        ts_set_err(err, errlen, "partition: need at least 2 images of at least 1 value");
        return TS_EINVAL;
    }
    ts_partition_opts_t o = *opts;
    if (o.dims == 0)
        o.dims = TS_PARTITION_DEFAULT_DIMS;
    if (o.restarts == 0)
        o.restarts = TS_PARTITION_DEFAULT_RESTARTS;
    if (o.max_iter == 0)
        o.max_iter = TS_PARTITION_DEFAULT_MAX_ITER;
    if (!o.dataset)
        o.dataset = TS_PARTITION_FMNIST;
    if (o.experts < 1 || o.experts > n) {
        ts_set_err(err, errlen,
                   "partition: experts K = %d must be between 1 and the %" PRId64 " images",
                   o.experts, n);
        return TS_EINVAL;
    }
    if (o.dims < 1 || o.dims > D) {
        ts_set_err(err, errlen, "partition: dims = %d must be between 1 and %d", o.dims, D);
        return TS_EINVAL;
    }
    if (o.hierarchical < 0 ||
        (o.hierarchical > 0 && (o.hierarchical < o.experts || o.hierarchical > n))) {
        ts_set_err(err, errlen,
                   "partition: hierarchical FINE = %d must be 0 (off) or between K = %d "
                   "and the %" PRId64 " images",
                   o.hierarchical, o.experts, n);
        return TS_EINVAL;
    }
    if (strlen(o.dataset) >= sizeof p->dataset) {
        ts_set_err(err, errlen, "partition: dataset name too long");
        return TS_EINVAL;
    }
    ts_pca_t pca;
    int rc = ts_pca_fit(x, n, D, o.dims, o.threads, &pca, err, errlen);
    if (rc != TS_OK)
        return rc;
    fit_line(&o, "PCA: %d of %d dims keep %.2f %% of the variance", o.dims, D,
             100.0 * pca.explained);
    float *e = malloc((size_t)n * o.dims * sizeof *e);
    if (!e) {
        ts_pca_free(&pca);
        ts_set_err(err, errlen, "partition: out of memory");
        return TS_ENOMEM;
    }
    rc = ts_pca_project(pca.basis, pca.mean, x, n, D, o.dims, e, o.threads);
    fit_progress_t fp = {&o, o.hierarchical};
    ts_kmeans_opts_t ko = {.K = o.experts,
                           .restarts = o.restarts,
                           .max_iter = o.max_iter,
                           .seed = o.seed,
                           .threads = o.threads,
                           .progress = fit_restart,
                           .ctx = &fp};
    ts_kmeans_t km = {0};
    if (rc == TS_OK && o.assign)
        rc = given_clusters(e, n, o.dims, o.experts, o.assign, &km, err, errlen);
    else if (rc == TS_OK && o.space) {
        rc = o.space_dims < 1 ? TS_EINVAL
             : o.hierarchical ? ts_kmeans_hierarchical(o.space, n, o.space_dims, o.hierarchical,
                                                       &ko, &km, err, errlen)
                              : ts_kmeans_fit(o.space, n, o.space_dims, &ko, &km, err, errlen);
        if (rc == TS_OK) { /* centroids and inertia in the PCA embedding */
            int32_t *a = km.assignment;
            km.assignment = NULL;
            ts_kmeans_free(&km);
            rc = given_clusters(e, n, o.dims, o.experts, a, &km, err, errlen);
            free(a);
        }
    } else if (rc == TS_OK)
        rc = o.hierarchical
                 ? ts_kmeans_hierarchical(e, n, o.dims, o.hierarchical, &ko, &km, err, errlen)
                 : ts_kmeans_fit(e, n, o.dims, &ko, &km, err, errlen);
    free(e);
    if (rc == TS_OK) {
        p->sizes = calloc((size_t)o.experts, sizeof *p->sizes);
        if (!p->sizes)
            rc = TS_ENOMEM;
    }
    if (rc != TS_OK) {
        ts_pca_free(&pca);
        ts_kmeans_free(&km);
        return rc;
    }
    p->K = o.experts;
    p->k = o.dims;
    p->D = D;
    p->n = n;
    p->basis = pca.basis;
    p->mean = pca.mean;
    p->centroids = km.centroids;
    p->assignment = km.assignment;
    for (int64_t i = 0; i < n; i++)
        p->sizes[p->assignment[i]]++;
    p->seed = o.seed;
    p->restarts = o.restarts;
    p->hierarchical = o.hierarchical;
    p->inertia = km.inertia;
    p->explained = pca.explained;
    snprintf(p->embed, sizeof p->embed, "pca%d", o.dims);
    snprintf(p->dataset, sizeof p->dataset, "%s", o.dataset);
    snprintf(p->strategy, sizeof p->strategy, "%s", o.strategy ? o.strategy : "kmeans");
    free(pca.eigenvalues);
    return TS_OK;
}

static int hash_bytes(const unsigned char *buf, size_t len, char hex[TS_PARTITION_ID_HEX]) {
    unsigned char h[32];
    if (sodium_init() < 0)
        return TS_EIO;
    if (crypto_generichash(h, sizeof h, buf, len, NULL, 0) != 0)
        return TS_EIO;
    ts_hex(h, sizeof h, hex);
    return TS_OK;
}

int ts_partition_save(ts_partition_t *p, const char *path, char *err, size_t errlen) {
    if (!p || !path || !p->basis || !p->mean || !p->centroids || !p->assignment || !p->sizes ||
        p->K < 1 || p->k < 1 || p->D < p->k || p->n < p->K) {
        ts_set_err(err, errlen, "partition: nothing valid to save");
        return TS_EINVAL;
    }
    ts_st_entry_t e[5] = {
        {"basis", TS_ST_F32, 2, {p->k, p->D}, p->basis},
        {"mean", TS_ST_F32, 1, {p->D}, p->mean},
        {"centroids", TS_ST_F32, 2, {p->K, p->k}, p->centroids},
        {"assignment", TS_ST_I32, 1, {p->n}, p->assignment},
        {"sizes", TS_ST_I32, 1, {p->K}, p->sizes},
    };
    char experts[24], dims[24], seed[24], restarts[24], inertia[40], explained[40], n[24], hier[24];
    snprintf(experts, sizeof experts, "%d", p->K);
    snprintf(dims, sizeof dims, "%d", p->k);
    snprintf(seed, sizeof seed, "%" PRIu64, p->seed);
    snprintf(restarts, sizeof restarts, "%d", p->restarts);
    snprintf(inertia, sizeof inertia, "%.17g", p->inertia);
    snprintf(explained, sizeof explained, "%.17g", p->explained);
    snprintf(n, sizeof n, "%" PRId64, p->n);
    snprintf(hier, sizeof hier, "%d", p->hierarchical);
    const char *meta[] = {"format",
                          TS_PARTITION_FORMAT,
                          "embed",
                          p->embed,
                          "experts",
                          experts,
                          "dims",
                          dims,
                          "seed",
                          seed,
                          "restarts",
                          restarts,
                          "inertia",
                          inertia,
                          "explained_variance",
                          explained,
                          "dataset",
                          p->dataset,
                          "n",
                          n,
                          "hierarchical",
                          hier};
    int n_meta = (int)(sizeof meta / sizeof meta[0]) / 2;
    const char *meta2[sizeof meta / sizeof meta[0] + 2];
    memcpy(meta2, meta, sizeof meta);
    if (p->strategy[0] && strcmp(p->strategy, "kmeans") != 0) {
        meta2[2 * n_meta] = "strategy";
        meta2[2 * n_meta + 1] = p->strategy;
        n_meta++;
    }
    int rc = ts_st_write(path, e, 5, meta2, n_meta, err, errlen);
    if (rc == TS_OK)
        rc = ts_file_blake2b(path, p->id, err, errlen);
    return rc;
}

/* ---- loading ------------------------------------------------------------------------------- */

/* A metadata integer in [lo, hi], or a message. */
static int meta_i64(const ts_st_file_t *f, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    char *err, size_t errlen) {
    const char *v = ts_st_meta(f, key);
    if (!v) {
        ts_set_err(err, errlen, "metadata '%s' is missing", key);
        return TS_ECORRUPT;
    }
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        ts_set_err(err, errlen,
                   "metadata '%s' = \"%.40s\" is not an integer in [%" PRId64 ", %" PRId64 "]", key,
                   v, lo, hi);
        return TS_ECORRUPT;
    }
    *out = x;
    return TS_OK;
}

static int meta_double(const ts_st_file_t *f, const char *key, double *out, char *err,
                       size_t errlen) {
    const char *v = ts_st_meta(f, key);
    char *end;
    double x = v ? strtod(v, &end) : 0.0;
    if (!v || end == v || *end || !isfinite(x)) {
        ts_set_err(err, errlen, "metadata '%s' is missing or not a finite number", key);
        return TS_ECORRUPT;
    }
    *out = x;
    return TS_OK;
}

static int meta_string(const ts_st_file_t *f, const char *key, char *out, size_t cap, char *err,
                       size_t errlen) {
    const char *v = ts_st_meta(f, key);
    if (!v || !*v || strlen(v) >= cap) {
        ts_set_err(err, errlen, "metadata '%s' is missing, empty or longer than %zu bytes", key,
                   cap - 1);
        return TS_ECORRUPT;
    }
    memcpy(out, v, strlen(v) + 1);
    return TS_OK;
}

/* The tensor `name` with dtype and ndim as given, or a message. */
static const ts_st_tensor_t *want_tensor(const ts_st_file_t *f, const char *name,
                                         ts_st_dtype_t dtype, int ndim, char *err, size_t errlen) {
    const ts_st_tensor_t *t = ts_st_find(f, name);
    if (!t)
        ts_set_err(err, errlen, "tensor '%s' is missing", name);
    else if (t->dtype != dtype || t->ndim != ndim)
        ts_set_err(err, errlen, "tensor '%s' must be %s with %d dim%s (is %s with %d)", name,
                   ts_st_dtype_name(dtype), ndim, ndim == 1 ? "" : "s", ts_st_dtype_name(t->dtype),
                   t->ndim);
    else
        return t;
    return NULL;
}

static int load_floats(const ts_st_tensor_t *t, float **out, char *err, size_t errlen) {
    *out = malloc((size_t)t->numel * sizeof **out);
    if (!*out)
        return TS_ENOMEM;
    int rc = ts_st_to_f32(t, *out, t->numel);
    if (rc != TS_OK)
        return rc;
    for (int64_t i = 0; i < t->numel; i++)
        if (!isfinite((*out)[i])) {
            ts_set_err(err, errlen, "tensor '%s' holds NaN or Inf at %" PRId64, t->name, i);
            return TS_ECORRUPT;
        }
    return TS_OK;
}

static int load_ints(const ts_st_tensor_t *t, int32_t **out) {
    int64_t *tmp = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *tmp);
    *out = malloc((size_t)(t->numel ? t->numel : 1) * sizeof **out);
    int rc = tmp && *out ? ts_st_to_i64(t, tmp, t->numel) : TS_ENOMEM;
    for (int64_t i = 0; rc == TS_OK && i < t->numel; i++)
        (*out)[i] = (int32_t)tmp[i]; /* I32 on disk: always in range */
    free(tmp);
    return rc;
}

/* The structural and value checks of ts_partition_load, on a parsed file. */
static int load_checked(const ts_st_file_t *f, ts_partition_t *p, char *err, size_t errlen) {
    const char *fmt = ts_st_meta(f, "format");
    if (!fmt || strcmp(fmt, TS_PARTITION_FORMAT) != 0) {
        ts_set_err(err, errlen, "not a partition: metadata format is %s%.40s%s, want \"%s\"",
                   fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "", TS_PARTITION_FORMAT);
        return TS_ECORRUPT;
    }
    static const char *const names[] = {"basis", "mean", "centroids", "assignment", "sizes"};
    for (int i = 0; i < f->n_tensors; i++) {
        int known = 0;
        for (int j = 0; j < 5; j++)
            known |= strcmp(f->tensors[i].name, names[j]) == 0;
        if (!known) {
            ts_set_err(err, errlen, "unexpected tensor '%.60s'", f->tensors[i].name);
            return TS_ECORRUPT;
        }
    }
    const ts_st_tensor_t *basis, *mean, *cent, *assign, *sizes;
    if (!(basis = want_tensor(f, "basis", TS_ST_F32, 2, err, errlen)) ||
        !(mean = want_tensor(f, "mean", TS_ST_F32, 1, err, errlen)) ||
        !(cent = want_tensor(f, "centroids", TS_ST_F32, 2, err, errlen)) ||
        !(assign = want_tensor(f, "assignment", TS_ST_I32, 1, err, errlen)) ||
        !(sizes = want_tensor(f, "sizes", TS_ST_I32, 1, err, errlen)))
        return TS_ECORRUPT;
    int64_t k = basis->shape[0], D = basis->shape[1], K = cent->shape[0], n = assign->shape[0];
    if (k < 1 || D < k || D > INT32_MAX) {
        ts_set_err(err, errlen, "basis has shape (%" PRId64 ", %" PRId64 "): need 1 <= k <= D", k,
                   D);
        return TS_ECORRUPT;
    }
    if (mean->shape[0] != D || cent->shape[1] != k || sizes->shape[0] != K || K < 1 || n < K ||
        n > INT32_MAX) {
        ts_set_err(err, errlen,
                   "inconsistent shapes: basis (%" PRId64 ", %" PRId64 "), mean (%" PRId64
                   "), centroids (%" PRId64 ", %" PRId64 "), assignment (%" PRId64
                   "), sizes (%" PRId64 ")",
                   k, D, mean->shape[0], K, cent->shape[1], n, sizes->shape[0]);
        return TS_ECORRUPT;
    }
    int64_t v;
    int rc;
    if ((rc = meta_i64(f, "experts", 1, INT32_MAX, &v, err, errlen)) != TS_OK)
        return rc;
    if (v != K) {
        ts_set_err(err, errlen,
                   "metadata experts = %" PRId64 " but there are %" PRId64 " centroids", v, K);
        return TS_ECORRUPT;
    }
    if ((rc = meta_i64(f, "n", 1, INT32_MAX, &v, err, errlen)) != TS_OK)
        return rc;
    if (v != n) {
        ts_set_err(err, errlen,
                   "metadata n = %" PRId64 " but the assignment has %" PRId64 " entries", v, n);
        return TS_ECORRUPT;
    }
    if ((rc = meta_i64(f, "dims", 1, INT32_MAX, &v, err, errlen)) != TS_OK)
        return rc;
    if (v != k) {
        ts_set_err(err, errlen, "metadata dims = %" PRId64 " but the basis has %" PRId64 " rows", v,
                   k);
        return TS_ECORRUPT;
    }
    p->K = (int)K;
    p->k = (int)k;
    p->D = (int)D;
    p->n = n;
    if ((rc = meta_i64(f, "restarts", 1, 65535, &v, err, errlen)) != TS_OK)
        return rc;
    p->restarts = (int)v;
    if ((rc = meta_i64(f, "hierarchical", 0, INT32_MAX, &v, err, errlen)) != TS_OK)
        return rc;
    p->hierarchical = (int)v;
    const char *seed = ts_st_meta(f, "seed");
    char *end;
    errno = 0;
    unsigned long long s = seed && *seed != '-' ? strtoull(seed, &end, 10) : 0;
    if (!seed || *seed == '-' || end == seed || *end || errno) {
        ts_set_err(err, errlen, "metadata 'seed' is missing or not an unsigned integer");
        return TS_ECORRUPT;
    }
    p->seed = s;
    if ((rc = meta_double(f, "inertia", &p->inertia, err, errlen)) != TS_OK ||
        (rc = meta_double(f, "explained_variance", &p->explained, err, errlen)) != TS_OK ||
        (rc = meta_string(f, "embed", p->embed, sizeof p->embed, err, errlen)) != TS_OK ||
        (rc = meta_string(f, "dataset", p->dataset, sizeof p->dataset, err, errlen)) != TS_OK)
        return rc;
    if (ts_st_meta(f, "strategy")) {
        if ((rc = meta_string(f, "strategy", p->strategy, sizeof p->strategy, err, errlen)) !=
            TS_OK)
            return rc;
    } else {
        snprintf(p->strategy, sizeof p->strategy, "kmeans");
    }

    if ((rc = load_floats(basis, &p->basis, err, errlen)) != TS_OK ||
        (rc = load_floats(mean, &p->mean, err, errlen)) != TS_OK ||
        (rc = load_floats(cent, &p->centroids, err, errlen)) != TS_OK ||
        (rc = load_ints(assign, &p->assignment)) != TS_OK ||
        (rc = load_ints(sizes, &p->sizes)) != TS_OK)
        return rc;
    int64_t *hist = calloc((size_t)K, sizeof *hist);
    if (!hist)
        return TS_ENOMEM;
    for (int64_t i = 0; i < n; i++) {
        int32_t a = p->assignment[i];
        if (a < 0 || a >= K) {
            ts_set_err(err, errlen, "assignment[%" PRId64 "] = %d is outside [0, %" PRId64 ")", i,
                       (int)a, K);
            free(hist);
            return TS_ECORRUPT;
        }
        hist[a]++;
    }
    for (int64_t j = 0; j < K; j++)
        if (hist[j] != p->sizes[j] || hist[j] == 0) {
            ts_set_err(err, errlen,
                       "sizes[%" PRId64 "] = %d but %" PRId64 " images are assigned to "
                       "cluster %" PRId64 "%s",
                       j, (int)p->sizes[j], hist[j], j, hist[j] == 0 ? " (an empty cluster)" : "");
            free(hist);
            return TS_ECORRUPT;
        }
    free(hist);
    return TS_OK;
}

int ts_partition_load(const char *path, ts_partition_t *p, char *err, size_t errlen) {
    if (!p)
        return TS_EINVAL;
    memset(p, 0, sizeof *p);
    if (!path)
        return TS_EINVAL;
    ts_st_file_t f;
    char why[400] = "";
    int rc = ts_st_read(path, &f, why, sizeof why);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "partition '%s': %s", path, why);
        return rc;
    }
    rc = load_checked(&f, p, why, sizeof why);
    if (rc == TS_OK)
        rc = hash_bytes(f.buf, f.len, p->id);
    ts_st_free(&f);
    if (rc != TS_OK) {
        if (rc == TS_ENOMEM && !*why)
            snprintf(why, sizeof why, "out of memory");
        ts_set_err(err, errlen, "partition '%s': %s", path, why);
        ts_partition_free(p);
    }
    return rc;
}

int ts_partition_members(const ts_partition_t *p, int k, int32_t **idx, int *n) {
    if (!p || !p->assignment || !idx || !n || k < 0 || k >= p->K)
        return TS_EINVAL;
    *idx = malloc((size_t)p->sizes[k] * sizeof **idx);
    if (!*idx)
        return TS_ENOMEM;
    int m = 0;
    for (int64_t i = 0; i < p->n; i++)
        if (p->assignment[i] == k)
            (*idx)[m++] = (int32_t)i;
    *n = m; /* = sizes[k]: ts_partition_load checked the histogram */
    return TS_OK;
}

int ts_partition_take_cluster(const char *path, int cluster, ts_dataset_t *ds, const char *dataset,
                              const char *where, char partition_id[TS_PARTITION_ID_HEX], char *err,
                              size_t errlen) {
    if (!ds || !dataset || !where)
        return TS_EINVAL;
    ts_partition_t part;
    int rc = ts_partition_load(path, &part, err, errlen);
    if (rc != TS_OK)
        return rc;
    ts_dataset_t sub = {0};
    int32_t *idx = NULL;
    int n = 0;
    if (cluster < 0 || cluster >= part.K) {
        ts_set_err(err, errlen, "cluster %d: partition '%s' has clusters 0..%d", cluster, path,
                   part.K - 1);
        rc = TS_EINVAL;
    } else if (strcmp(part.dataset, dataset) != 0) {
        ts_set_err(err, errlen,
                   "partition '%s' was made from %s, not from %s (%s): not the data set it "
                   "partitions",
                   path, part.dataset, where, dataset);
        rc = TS_EINVAL;
    } else if (ds->n != part.n) {
        ts_set_err(err, errlen,
                   "partition '%s' was made from %lld images, but %s has %d: not the data set it "
                   "partitions",
                   path, (long long)part.n, where, ds->n);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK && (rc = ts_partition_members(&part, cluster, &idx, &n)) == TS_OK &&
        (rc = ts_dataset_subset(ds, idx, n, &sub)) == TS_OK) {
        ts_dataset_free(ds);
        *ds = sub;
    }
    if (rc == TS_OK && partition_id)
        memcpy(partition_id, part.id, TS_PARTITION_ID_HEX);
    if (rc == TS_ENOMEM)
        ts_set_err(err, errlen, "out of memory selecting cluster %d of '%s'", cluster, path);
    free(idx);
    ts_partition_free(&part);
    return rc;
}

int ts_partition_load_cluster(const char *path, int cluster, const char *fmnist_dir,
                              ts_dataset_t *out, char partition_id[TS_PARTITION_ID_HEX], char *err,
                              size_t errlen) {
    if (!out)
        return TS_EINVAL;
    int rc = ts_fmnist_load(fmnist_dir, "train", out, err, errlen);
    char where[1100];
    snprintf(where, sizeof where, "the train set in %s",
             fmnist_dir ? fmnist_dir : TS_FMNIST_DEFAULT_DIR);
    if (rc == TS_OK)
        rc = ts_partition_take_cluster(path, cluster, out, TS_PARTITION_FMNIST, where, partition_id,
                                       err, errlen);
    if (rc != TS_OK)
        ts_dataset_free(out);
    return rc;
}

int ts_partition_latents(const char *path, ts_dataset_t *ds, char dataset[64], char *space,
                         char *err, size_t errlen) {
    char hex[65];
    int rc = ts_latents_load(path, ds, space, err, errlen);
    if (rc == TS_OK && (rc = ts_file_blake2b(path, hex, err, errlen)) != TS_OK)
        ts_dataset_free(ds);
    if (rc == TS_OK)
        snprintf(dataset, 64, "tessera-latents:%.32s", hex);
    return rc;
}

/* ---- routing helpers ------------------------------------------------------------------------- */

int ts_partition_embed(const ts_partition_t *p, const float *x, int64_t B, float *out) {
    if (!p || !p->basis || !p->mean || B < 0 || (B > 0 && (!x || !out)))
        return TS_EINVAL;
    if (B == 0)
        return TS_OK;
    return ts_pca_project(p->basis, p->mean, x, B, p->D, p->k, out, 1); /* row by row: same bits */
}

int ts_partition_nearest(const ts_partition_t *p, const float *e, int64_t B, int32_t *nearest,
                         float *d2) {
    if (!p || !p->centroids || B < 0 || (B > 0 && !e))
        return TS_EINVAL;
    for (int64_t i = 0; i < B; i++) {
        const float *ei = e + (size_t)i * p->k;
        int best = 0;
        double bd = INFINITY;
        for (int j = 0; j < p->K; j++) {
            const float *c = p->centroids + (size_t)j * p->k;
            double s = 0.0;
            for (int d = 0; d < p->k; d++) {
                double t = (double)ei[d] - (double)c[d];
                s += t * t;
            }
            if (d2)
                d2[(size_t)i * p->K + j] = (float)s;
            if (s < bd) {
                bd = s;
                best = j;
            }
        }
        if (nearest)
            nearest[i] = best;
    }
    return TS_OK;
}
