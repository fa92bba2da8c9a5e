/*
 * quality.c — bootstrap resamples, quantiles, precision/recall and the Inception Score
 * (model/quality.h).
 */
#include "model/quality.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/math.h"
#include "model/metrics.h"
#include "model/trainer.h"

/* ---- bootstrap ---------------------------------------------------------------------------- */

void ts_bootstrap_indices(uint64_t seed, int64_t b, int64_t n, int32_t *idx) {
    uint64_t key = ts_stream_key(seed, (uint64_t)b);
    for (int64_t i = 0; i < n; i++) {
        ts_u32x4_t w = ts_rng_block(key, (uint64_t)i >> 2);
        idx[i] = (int32_t)(((uint64_t)w.v[i & 3] * (uint64_t)n) >> 32);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ts_quantile(double *x, int64_t n, double q) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    double pos = q * (double)(n - 1);
    int64_t lo = (int64_t)floor(pos);
    if (lo >= n - 1)
        return x[n - 1];
    if (lo < 0)
        return x[0];
    double f = pos - (double)lo;
    return x[lo] + f * (x[lo + 1] - x[lo]);
}

int ts_fd_rows(const float *feat, const int32_t *idx, int64_t m, int d, const double *mu_ref,
               const double *cov_ref, double *fd, char *err, size_t errlen) {
    if (!feat || !idx || !fd || m < 2 || d < 1 || d > TS_METRICS_MAX_DIM) {
        ts_set_err(err, errlen, "ts_fd_rows: bad arguments (%lld rows of %d)", (long long)m, d);
        return TS_EINVAL;
    }
    float *rows = malloc((size_t)m * (size_t)d * sizeof *rows);
    double *mu = malloc((size_t)d * sizeof *mu), *cov = malloc((size_t)d * d * sizeof *cov);
    int rc = rows && mu && cov ? TS_OK : TS_ENOMEM;
    if (rc == TS_ENOMEM)
        ts_set_err(err, errlen, "ts_fd_rows: out of memory for %lld rows of %d", (long long)m, d);
    for (int64_t i = 0; i < m && rc == TS_OK; i++)
        memcpy(rows + i * d, feat + (int64_t)idx[i] * d, (size_t)d * sizeof *rows);
    if (rc == TS_OK)
        rc = ts_gauss_fit(rows, m, d, mu, cov, err, errlen);
    if (rc == TS_OK)
        rc = ts_frechet_distance(mu, cov, mu_ref, cov_ref, d, fd, err, errlen);
    free(rows);
    free(mu);
    free(cov);
    return rc;
}

/* ---- precision and recall ----------------------------------------------------------------- */

#define PR_BLOCK 256 /* query rows per dgemm */

/* sq[i] = ‖x_i‖² for x (n, d) in double. */
static void row_norms(const double *x, int64_t n, int d, double *sq) {
    for (int64_t i = 0; i < n; i++) {
        double s = 0.0;
        for (int j = 0; j < d; j++)
            s += x[i * d + j] * x[i * d + j];
        sq[i] = s;
    }
}

/* g (m, nb) = squared distances between rows q[0..m) and b[0..nb). */
static void sq_dist_block(const double *q, const double *sqq, int m, const double *b,
                          const double *sqb, int64_t nb, int d, double *g) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, (int)nb, d, -2.0, q, d, b, d, 0.0, g,
                (int)nb);
    for (int i = 0; i < m; i++)
        for (int64_t j = 0; j < nb; j++) {
            double v = g[(int64_t)i * nb + j] + sqq[i] + sqb[j];
            g[(int64_t)i * nb + j] = v > 0.0 ? v : 0.0;
        }
}

/* radius[i] = the squared distance from x_i to its k-th nearest other row of x (n, d). */
static int knn_radii(const double *x, const double *sq, int64_t n, int d, int k, double *radius) {
    double *g = malloc((size_t)PR_BLOCK * (size_t)n * sizeof *g);
    double *best = malloc((size_t)k * sizeof *best);
    if (!g || !best) {
        free(g);
        free(best);
        return TS_ENOMEM;
    }
    for (int64_t lo = 0; lo < n; lo += PR_BLOCK) {
        int m = (int)(n - lo < PR_BLOCK ? n - lo : PR_BLOCK);
        sq_dist_block(x + lo * d, sq + lo, m, x, sq, n, d, g);
        for (int i = 0; i < m; i++) {
            int have = 0; /* best[0..have) ascending: the smallest distances so far */
            for (int64_t j = 0; j < n; j++) {
                if (j == lo + i)
                    continue;
                double v = g[(int64_t)i * n + j];
                if (have == k && v >= best[k - 1])
                    continue;
                int p = have < k ? have++ : k - 1;
                while (p > 0 && best[p - 1] > v) {
                    best[p] = best[p - 1];
                    p--;
                }
                best[p] = v;
            }
            radius[lo + i] = best[k - 1];
        }
    }
    free(g);
    free(best);
    return TS_OK;
}

/* *frac = the share of the rows of q (nq, d) within radius[j] of some row j of b (nb, d). */
static int inside_share(const double *q, const double *sqq, int64_t nq, const double *b,
                        const double *sqb, const double *radius, int64_t nb, int d, double *frac) {
    double *g = malloc((size_t)PR_BLOCK * (size_t)nb * sizeof *g);
    if (!g)
        return TS_ENOMEM;
    int64_t in = 0;
    for (int64_t lo = 0; lo < nq; lo += PR_BLOCK) {
        int m = (int)(nq - lo < PR_BLOCK ? nq - lo : PR_BLOCK);
        sq_dist_block(q + lo * d, sqq + lo, m, b, sqb, nb, d, g);
        for (int i = 0; i < m; i++)
            for (int64_t j = 0; j < nb; j++)
                if (g[(int64_t)i * nb + j] <= radius[j]) {
                    in++;
                    break;
                }
    }
    free(g);
    *frac = (double)in / (double)nq;
    return TS_OK;
}

int ts_precision_recall(const float *real, int64_t nr, const float *fake, int64_t nf, int d, int k,
                        double *precision, double *recall, char *err, size_t errlen) {
    if (!real || !fake || !precision || !recall || k < 1 || nr <= k || nf <= k || d < 1) {
        ts_set_err(err, errlen,
                   "ts_precision_recall: need more than k = %d points in each set (%lld real, "
                   "%lld generated) and d ≥ 1",
                   k, (long long)nr, (long long)nf);
        return TS_EINVAL;
    }
    size_t total = (size_t)(nr + nf) * (size_t)(d + 2);
    double *buf = malloc(total * sizeof *buf);
    if (!buf) {
        ts_set_err(err, errlen, "ts_precision_recall: out of memory");
        return TS_ENOMEM;
    }
    double *r = buf, *f = r + nr * d, *sqr = f + nf * d, *sqf = sqr + nr, *rad_r = sqf + nf,
           *rad_f = rad_r + nr;
    for (int64_t i = 0; i < nr * d; i++)
        r[i] = real[i];
    for (int64_t i = 0; i < nf * d; i++)
        f[i] = fake[i];
    for (int64_t i = 0; i < nr * d; i++)
        if (!isfinite(r[i])) {
            free(buf);
            ts_set_err(err, errlen, "ts_precision_recall: a real feature is not finite");
            return TS_ENONFINITE;
        }
    for (int64_t i = 0; i < nf * d; i++)
        if (!isfinite(f[i])) {
            free(buf);
            ts_set_err(err, errlen, "ts_precision_recall: a generated feature is not finite");
            return TS_ENONFINITE;
        }
    row_norms(r, nr, d, sqr);
    row_norms(f, nf, d, sqf);
    int rc = knn_radii(r, sqr, nr, d, k, rad_r);
    if (rc == TS_OK)
        rc = knn_radii(f, sqf, nf, d, k, rad_f);
    if (rc == TS_OK)
        rc = inside_share(f, sqf, nf, r, sqr, rad_r, nr, d, precision);
    if (rc == TS_OK)
        rc = inside_share(r, sqr, nr, f, sqf, rad_f, nf, d, recall);
    if (rc != TS_OK)
        ts_set_err(err, errlen, "ts_precision_recall: out of memory for the distances");
    free(buf);
    return rc;
}

/* ---- Inception Score ---------------------------------------------------------------------- */

int ts_inception_score(const float *logits, const int32_t *idx, int64_t m, int K, double *is,
                       char *err, size_t errlen) {
    if (!logits || !is || m < 1 || K < 2) {
        ts_set_err(err, errlen, "ts_inception_score: need at least 1 row and 2 classes");
        return TS_EINVAL;
    }
    double *p = malloc((size_t)m * (size_t)K * sizeof *p), *marg = calloc((size_t)K, sizeof *marg);
    if (!p || !marg) {
        free(p);
        free(marg);
        ts_set_err(err, errlen, "ts_inception_score: out of memory");
        return TS_ENOMEM;
    }
    for (int64_t i = 0; i < m; i++) {
        const float *row = logits + (idx ? (int64_t)idx[i] : i) * K;
        double mx = -INFINITY, s = 0.0;
        for (int c = 0; c < K; c++) {
            if (!isfinite(row[c])) {
                free(p);
                free(marg);
                ts_set_err(err, errlen, "ts_inception_score: logit %d of row %lld is not finite", c,
                           (long long)i);
                return TS_ENONFINITE;
            }
            mx = row[c] > mx ? row[c] : mx;
        }
        for (int c = 0; c < K; c++)
            s += (p[i * K + c] = exp((double)row[c] - mx));
        for (int c = 0; c < K; c++) {
            p[i * K + c] /= s;
            marg[c] += p[i * K + c];
        }
    }
    for (int c = 0; c < K; c++)
        marg[c] /= (double)m;
    double kl = 0.0;
    for (int64_t i = 0; i < m; i++)
        for (int c = 0; c < K; c++) {
            double q = p[i * K + c];
            if (q > 0.0)
                kl += q * (log(q) - log(marg[c]));
        }
    *is = exp(kl / (double)m);
    free(p);
    free(marg);
    return TS_OK;
}

/* ---- calibration -------------------------------------------------------------------------------- */

static int calib_check(const float *logits, const int32_t *truth, int64_t n, int K, double T,
                       char *err, size_t errlen) {
    if (!logits || !truth || n < 1 || K < 2 || !(T > 0.0) || !isfinite(T)) {
        ts_set_err(err, errlen, "calibration: want n >= 1 rows of K >= 2 logits and T > 0");
        return TS_EINVAL;
    }
    for (int64_t i = 0; i < n; i++) {
        if (truth[i] < 0 || truth[i] >= K) {
            ts_set_err(err, errlen, "calibration: label %d of row %lld is not in [0, %d)",
                       (int)truth[i], (long long)i, K);
            return TS_EINVAL;
        }
        for (int k = 0; k < K; k++)
            if (!isfinite(logits[i * K + k])) {
                ts_set_err(err, errlen, "calibration: logit %d of row %lld is not finite", k,
                           (long long)i);
                return TS_ENONFINITE;
            }
    }
    return TS_OK;
}

/* Row i of softmax(logits / T): the log of its normaliser and the top probability and class. */
static double row_logz(const float *z, int K, double beta, double *top, int *arg) {
    double mx = -INFINITY, s = 0.0;
    int best = 0;
    for (int k = 0; k < K; k++)
        if (beta * z[k] > mx)
            mx = beta * z[k], best = k;
    for (int k = 0; k < K; k++)
        s += exp(beta * z[k] - mx);
    if (top)
        *top = 1.0 / s; /* exp(max − max) / s */
    if (arg)
        *arg = best;
    return mx + log(s);
}

static double nll_at(const float *logits, const int32_t *truth, int64_t n, int K, double beta) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float *z = logits + i * K;
        sum += row_logz(z, K, beta, NULL, NULL) - beta * z[truth[i]];
    }
    return sum / (double)n;
}

int ts_calib_nll(const float *logits, const int32_t *truth, int64_t n, int K, double T, double *nll,
                 char *err, size_t errlen) {
    TS_TRY(calib_check(logits, truth, n, K, T, err, errlen));
    *nll = nll_at(logits, truth, n, K, 1.0 / T);
    return TS_OK;
}

int ts_calib_ece(const float *logits, const int32_t *truth, int64_t n, int K, double T, int bins,
                 double *ece, char *err, size_t errlen) {
    TS_TRY(calib_check(logits, truth, n, K, T, err, errlen));
    if (bins < 1) {
        ts_set_err(err, errlen, "calibration: want at least one bin");
        return TS_EINVAL;
    }
    double *conf = calloc((size_t)bins, sizeof *conf), *right = calloc((size_t)bins, sizeof *right);
    int64_t *count = calloc((size_t)bins, sizeof *count);
    if (!conf || !right || !count) {
        free(conf), free(right), free(count);
        return TS_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        double top;
        int arg;
        row_logz(logits + i * K, K, 1.0 / T, &top, &arg);
        int b = (int)(top * bins);
        b = b >= bins ? bins - 1 : b;
        conf[b] += top;
        right[b] += arg == truth[i];
        count[b]++;
    }
    double e = 0.0;
    for (int b = 0; b < bins; b++)
        if (count[b])
            e += fabs(right[b] - conf[b]) / (double)n; /* |b|/n · |acc_b − conf_b| */
    *ece = e;
    free(conf), free(right), free(count);
    return TS_OK;
}

int ts_calib_fit_temperature(const float *logits, const int32_t *truth, int64_t n, int K, double *T,
                             char *err, size_t errlen) {
    TS_TRY(calib_check(logits, truth, n, K, 1.0, err, errlen));
    /* golden-section search over log β in [log 0.01, log 100]: the NLL is convex in β, hence
     * unimodal in log β */
    const double g = (sqrt(5.0) - 1.0) / 2.0;
    double a = log(0.01), b = log(100.0);
    double c = b - g * (b - a), d = a + g * (b - a);
    double fc = nll_at(logits, truth, n, K, exp(c)), fd = nll_at(logits, truth, n, K, exp(d));
    while (b - a > 1e-6) {
        if (fc <= fd) {
            b = d, d = c, fd = fc;
            c = b - g * (b - a);
            fc = nll_at(logits, truth, n, K, exp(c));
        } else {
            a = c, c = d, fc = fd;
            d = a + g * (b - a);
            fd = nll_at(logits, truth, n, K, exp(d));
        }
    }
    *T = 1.0 / exp((a + b) / 2.0);
    return TS_OK;
}

void ts_bootstrap_interval(const double *boot, int B, double est, double *lo, double *hi,
                           double *bias_out) {
    double *c = B >= 2 ? malloc((size_t)B * sizeof *c) : NULL, mean = 0.0;
    *lo = *hi = NAN;
    if (bias_out)
        *bias_out = NAN;
    for (int b = 0; c && b < B; b++)
        if (!isfinite(boot[b])) { /* ts_quantile takes no NaN: no interval */
            free(c);
            return;
        }
    if (!c)
        return;
    for (int b = 0; b < B; b++)
        mean += (c[b] = boot[b]) / B;
    double bias = mean - est;
    *lo = ts_quantile(c, B, 0.025) - bias;
    *hi = ts_quantile(c, B, 0.975) - bias;
    if (bias_out)
        *bias_out = bias;
    free(c);
}
