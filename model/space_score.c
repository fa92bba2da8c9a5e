/*
 * space_score.c — FD, KID, precision and recall of sample sets in one feature space
 * (model/space_score.h).
 */
#include "model/space_score.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/metrics.h"
#include "model/quality.h"

#define BLOCK 512 /* rows per kernel block */

/* x (n, d) in double, each dimension standardised by the reference's mean and 1 / std (the KID's
 * kernel then sees every feature space at one scale) */
static double *to_double(const float *x, int64_t n, int d, const double *mean,
                         const double *inv_std) {
    double *y = malloc((size_t)(n * d) * sizeof *y);
    for (int64_t i = 0; y && i < n * d; i++)
        y[i] = ((double)x[i] - mean[i % d]) * inv_std[i % d];
    return y;
}

/* mean and 1 / std (population; 1 for a constant dimension) of the columns of y (r, d) */
static void column_scale(const float *y, int64_t r, int d, double *mean, double *inv_std) {
    for (int k = 0; k < d; k++) {
        double m = 0.0, v = 0.0;
        for (int64_t i = 0; i < r; i++)
            m += y[i * d + k];
        m /= (double)r;
        for (int64_t i = 0; i < r; i++)
            v += (y[i * d + k] - m) * (y[i * d + k] - m);
        v /= (double)r;
        mean[k] = m;
        inv_std[k] = v > 0.0 ? 1.0 / sqrt(v) : 1.0;
    }
}

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* g (ma, mb) = k(a_i, b_j) for a (ma, d) and b (mb, d), in double */
static void kernel_block(const double *a, int64_t ma, const double *b, int64_t mb, int d,
                         double *g) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ma, (int)mb, d, 1.0 / d, a, d, b, d,
                0.0, g, (int)mb);
    for (int64_t i = 0; i < ma * mb; i++) {
        double v = g[i] + 1.0;
        g[i] = v * v * v;
    }
}

/* Σ_{i≠j} k(y_i, y_j) of y (r, d) */
static int self_sum(const double *y, int64_t r, int d, double *sum) {
    double *g = malloc((size_t)(BLOCK * r) * sizeof *g), s = 0.0;
    if (!g)
        return TS_ENOMEM;
    for (int64_t lo = 0; lo < r; lo += BLOCK) {
        int64_t m = r - lo < BLOCK ? r - lo : BLOCK;
        kernel_block(y + lo * d, m, y, r, d, g);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < r; j++)
                if (lo + i != j)
                    s += g[i * r + j];
    }
    free(g);
    *sum = s;
    return TS_OK;
}

/* kxx (m, m) in float, and rowsum[i] = Σ_j k(x_i, y_j) */
static int entry_kernels(const double *x, int64_t m, const double *y, int64_t r, int d, float *kxx,
                         double *rowsum) {
    int64_t w = m > r ? m : r;
    double *g = malloc((size_t)(BLOCK * w) * sizeof *g);
    if (!g)
        return TS_ENOMEM;
    for (int64_t lo = 0; lo < m; lo += BLOCK) {
        int64_t h = m - lo < BLOCK ? m - lo : BLOCK;
        kernel_block(x + lo * d, h, x, m, d, g);
        for (int64_t i = 0; i < h * m; i++)
            kxx[lo * m + i] = (float)g[i];
        kernel_block(x + lo * d, h, y, r, d, g);
        for (int64_t i = 0; i < h; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < r; j++)
                s += g[i * r + j];
            rowsum[lo + i] = s;
        }
    }
    free(g);
    return TS_OK;
}

/* The KID of the samples drawn c_u times each (c NULL: each once, the plain estimate) */
static double kid_of(const float *kxx, const double *rowsum, int64_t m, int64_t r, double yy,
                     const int32_t *c) {
    double within = 0.0, diag = 0.0, cross = 0.0, sq = 0.0;
    for (int64_t u = 0; u < m; u++) {
        double cu = c ? c[u] : 1.0;
        if (cu == 0.0)
            continue;
        const float *row = kxx + u * m;
        double s = 0.0;
        if (c) {
            for (int64_t v = 0; v < m; v++)
                s += (double)c[v] * row[v];
        } else {
            for (int64_t v = 0; v < m; v++)
                s += row[v];
        }
        within += cu * s;
        diag += cu * cu * row[u];
        sq += cu * cu;
        cross += cu * rowsum[u];
    }
    double md = (double)m, pairs = md * md - sq;
    if (pairs <= 0.0) /* a resample of one sample drawn m times: no pair to compare */
        return NAN;
    return (within - diag) / pairs + yy - 2.0 * cross / (md * (double)r);
}

int ts_kid(const float *x, int64_t m, const float *y, int64_t r, int d, double *kid, char *err,
           size_t errlen) {
    if (!x || !y || !kid || m < 2 || r < 2 || d < 1 || m > INT32_MAX || r > INT32_MAX)
        return ts_fail(err, errlen, TS_EINVAL,
                       "KID: %lld samples and %lld reference rows of %d "
                       "dimensions (two each at least)",
                       (long long)m, (long long)r, d);
    if (!all_finite(x, m * d) || !all_finite(y, r * d))
        return ts_fail(err, errlen, TS_ENONFINITE, "KID: a feature is not finite");
    double *scale = malloc((size_t)(2 * d) * sizeof *scale), *xd = NULL, *yd = NULL, yy = 0.0;
    if (scale) {
        column_scale(y, r, d, scale, scale + d);
        xd = to_double(x, m, d, scale, scale + d), yd = to_double(y, r, d, scale, scale + d);
    }
    float *kxx = malloc((size_t)(m * m) * sizeof *kxx);
    double *rowsum = malloc((size_t)m * sizeof *rowsum);
    int rc = xd && yd && kxx && rowsum ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK)
        rc = self_sum(yd, r, d, &yy);
    if (rc == TS_OK)
        rc = entry_kernels(xd, m, yd, r, d, kxx, rowsum);
    if (rc == TS_OK)
        *kid = kid_of(kxx, rowsum, m, r, yy / ((double)r * (double)(r - 1)), NULL);
    else
        ts_set_err(err, errlen, "KID: out of memory for %lld samples", (long long)m);
    free(scale), free(xd), free(yd), free(kxx), free(rowsum);
    return rc;
}

/* One entry: FD (+ bootstrap values into fdb), KID (+ kidb), precision and recall. */
static int score_entry(const float *feat, int64_t n, const double *yd, const double *scale,
                       const float *ref, int64_t r, int d, double yy, const double *mu,
                       const double *cov, int B, int pr_k, ts_space_score_t *s, double *fdb,
                       double *kidb, char *err, size_t errlen) {
    int32_t *idx = malloc((size_t)n * sizeof *idx), *cnt = malloc((size_t)n * sizeof *cnt);
    double *xd = to_double(feat, n, d, scale, scale + d);
    double *rowsum = malloc((size_t)n * sizeof *rowsum);
    float *kxx = malloc((size_t)(n * n) * sizeof *kxx);
    int rc = idx && cnt && xd && rowsum && kxx ? TS_OK : TS_ENOMEM;
    if (rc != TS_OK)
        ts_set_err(err, errlen, "scores: out of memory for %lld samples", (long long)n);
    for (int64_t i = 0; rc == TS_OK && i < n; i++)
        idx[i] = (int32_t)i;
    if (rc == TS_OK)
        rc = ts_fd_rows(feat, idx, n, d, mu, cov, &s->fd, err, errlen);
    if (rc == TS_OK && (rc = entry_kernels(xd, n, yd, r, d, kxx, rowsum)) != TS_OK)
        ts_set_err(err, errlen, "scores: out of memory for the kernel of %lld samples",
                   (long long)n);
    if (rc == TS_OK)
        s->kid = kid_of(kxx, rowsum, n, r, yy, NULL);
    int64_t pr_n = n < r ? n : r;
    if (rc == TS_OK)
        rc = ts_precision_recall(ref, pr_n, feat, n, d, pr_k, &s->precision, &s->recall, err,
                                 errlen);
    for (int b = 0; rc == TS_OK && b < B; b++) {
        ts_bootstrap_indices(0, b, n, idx);
        rc = ts_fd_rows(feat, idx, n, d, mu, cov, &fdb[b], err, errlen);
        memset(cnt, 0, (size_t)n * sizeof *cnt);
        for (int64_t i = 0; i < n; i++)
            cnt[idx[i]]++;
        kidb[b] = kid_of(kxx, rowsum, n, r, yy, cnt);
    }
    if (rc == TS_OK && B >= 2) {
        ts_bootstrap_interval(fdb, B, s->fd, &s->fd_lo, &s->fd_hi, NULL);
        ts_bootstrap_interval(kidb, B, s->kid, &s->kid_lo, &s->kid_hi, NULL);
    }
    free(idx), free(cnt), free(xd), free(rowsum), free(kxx);
    return rc;
}

int ts_space_score(const float *const *feat, const int64_t *n, int E, const float *ref, int64_t r,
                   int d, int B, int pr_k, ts_space_score_t *out, char *err, size_t errlen) {
    if (!feat || !n || E < 1 || !ref || r < 2 || d < 1 || B < 0 || !out || r > INT32_MAX)
        return ts_fail(err, errlen, TS_EINVAL, "scores: no entries or no reference");
    for (int e = 0; e < E; e++) {
        if (!feat[e] || n[e] < TS_SPACE_SCORE_MIN_N || n[e] > INT32_MAX)
            return ts_fail(err, errlen, TS_EINVAL,
                           "scores: entry %d has %lld samples; the scores want %d at least", e,
                           (long long)(feat[e] ? n[e] : 0), TS_SPACE_SCORE_MIN_N);
        if (!all_finite(feat[e], n[e] * d))
            return ts_fail(err, errlen, TS_ENONFINITE,
                           "scores: entry %d has a feature that is "
                           "not finite",
                           e);
        if (pr_k < 1 || pr_k >= n[e] || pr_k >= (n[e] < r ? n[e] : r))
            return ts_fail(err, errlen, TS_EINVAL, "scores: k = %d neighbours for %lld samples",
                           pr_k, (long long)n[e]);
    }
    if (!all_finite(ref, r * d))
        return ts_fail(err, errlen, TS_ENONFINITE, "scores: a reference feature is not finite");
    int paired = 1;
    for (int e = 1; e < E; e++)
        paired &= n[e] == n[0];
    double *mu = malloc((size_t)d * sizeof *mu), *cov = malloc((size_t)d * d * sizeof *cov);
    double *scale = malloc((size_t)(2 * d) * sizeof *scale), *yd = NULL, yy = 0.0;
    if (scale) {
        column_scale(ref, r, d, scale, scale + d);
        yd = to_double(ref, r, d, scale, scale + d);
    }
    double *fdb = calloc((size_t)E * (B ? B : 1), sizeof *fdb);
    double *kidb = calloc((size_t)E * (B ? B : 1), sizeof *kidb);
    double *diff = malloc((size_t)(B ? B : 1) * sizeof *diff);
    int rc = mu && cov && yd && fdb && kidb && diff ? TS_OK : TS_ENOMEM;
    if (rc != TS_OK)
        ts_set_err(err, errlen, "scores: out of memory for %lld reference rows", (long long)r);
    if (rc == TS_OK)
        rc = ts_gauss_fit(ref, r, d, mu, cov, err, errlen);
    if (rc == TS_OK && (rc = self_sum(yd, r, d, &yy)) != TS_OK)
        ts_set_err(err, errlen, "scores: out of memory for the reference kernel");
    yy /= (double)r * (double)(r - 1);
    for (int e = 0; rc == TS_OK && e < E; e++) {
        ts_space_score_t *s = &out[e];
        *s = (ts_space_score_t){.fd_lo = NAN,
                                .fd_hi = NAN,
                                .d_fd = NAN,
                                .d_fd_lo = NAN,
                                .d_fd_hi = NAN,
                                .kid_lo = NAN,
                                .kid_hi = NAN,
                                .d_kid = NAN,
                                .d_kid_lo = NAN,
                                .d_kid_hi = NAN};
        rc = score_entry(feat[e], n[e], yd, scale, ref, r, d, yy, mu, cov, B, pr_k, s,
                         fdb + (size_t)e * B, kidb + (size_t)e * B, err, errlen);
        if (rc != TS_OK || e == 0 || !paired)
            continue;
        s->d_fd = s->fd - out[0].fd, s->d_kid = s->kid - out[0].kid;
        if (B < 2)
            continue;
        for (int b = 0; b < B; b++)
            diff[b] = fdb[(size_t)e * B + b] - fdb[b];
        ts_bootstrap_interval(diff, B, s->d_fd, &s->d_fd_lo, &s->d_fd_hi, NULL);
        for (int b = 0; b < B; b++)
            diff[b] = kidb[(size_t)e * B + b] - kidb[b];
        ts_bootstrap_interval(diff, B, s->d_kid, &s->d_kid_lo, &s->d_kid_hi, NULL);
    }
    free(mu), free(cov), free(scale), free(yd), free(fdb), free(kidb), free(diff);
    return rc;
}
