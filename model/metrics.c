/*
 * metrics.c — Gaussian fits, the Fréchet distance and class coverage (model/metrics.h).
 *
 * The Fréchet distance between N(μ1, Σ1) and N(μ2, Σ2) is
 *
 *     FD = ‖μ1 − μ2‖² + Tr Σ1 + Tr Σ2 − 2 Tr (Σ1^½ Σ2 Σ1^½)^½.
 *
 * Why the symmetric form. The textbook writes the last term Tr (Σ1 Σ2)^½. Σ1 Σ2 is not symmetric
 * (unless the two commute), so its square root would need a general (Schur) method, and rounding
 * can give it complex eigenvalues. But Σ1 Σ2 = Σ1^½ (Σ1^½ Σ2 Σ1^½) Σ1^−½ is similar to
 * M = Σ1^½ Σ2 Σ1^½, which is symmetric positive semi-definite (xᵀ M x = (Σ1^½ x)ᵀ Σ2 (Σ1^½ x) ≥ 0),
 * so both have the same eigenvalues λ_i ≥ 0 and Tr (Σ1 Σ2)^½ = Tr M^½ = Σ_i √λ_i. We therefore:
 *   1. eigendecompose Σ1 = V Λ Vᵀ (LAPACKE_dsyevd) and form Σ1^½ = V Λ^½ Vᵀ;
 *   2. form M = Σ1^½ Σ2 Σ1^½ with two dgemms, and make it exactly symmetric ((M + Mᵀ) / 2);
 *   3. take M's eigenvalues (dsyevd, values only) and sum their square roots.
 * Everything is in double.
 *
 * Why the clamp. Σ1 and M are positive semi-definite in exact arithmetic, but a covariance of
 * n < d points, or of features with a dead (constant) unit, is singular, and the eigensolver then
 * returns eigenvalues like −1e-17 where the true value is 0: rounding, of the size of
 * ε·‖Σ‖. Their square roots would be NaN, so eigenvalues below 0 are set to 0 — a change of the
 * order of the rounding itself. For the same reason the FD is clamped at 0 (for two equal
 * Gaussians it is 0 up to rounding, of either sign).
 */
#include "model/metrics.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the Gaussian fit --------------------------------------------------------------------- */

static int all_finite_f32(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

static int all_finite_f64(const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* mean (d) of feat (n, d): each block of TS_METRICS_BLOCK rows summed in row order into part,
 * the block sums added into mean in block order, then divided by n. */
static void fit_mean(const float *feat, int64_t n, int d, double *mean, double *part) {
    memset(mean, 0, (size_t)d * sizeof *mean);
    for (int64_t lo = 0; lo < n; lo += TS_METRICS_BLOCK) {
        int64_t hi = lo + TS_METRICS_BLOCK < n ? lo + TS_METRICS_BLOCK : n;
        memset(part, 0, (size_t)d * sizeof *part);
        for (int64_t i = lo; i < hi; i++)
            for (int j = 0; j < d; j++)
                part[j] += (double)feat[(size_t)i * d + j];
        for (int j = 0; j < d; j++)
            mean[j] += part[j];
    }
    for (int j = 0; j < d; j++)
        mean[j] /= (double)n;
}

/* cov (d, d) of feat about mean, upper triangle: per block, Σ (x − μ)ᵀ(x − μ) over its rows in
 * row order into part (d, d); the block sums added in block order; divided by n − 1; then the
 * lower triangle mirrored. c is a (d) scratch row. */
static void fit_cov(const float *feat, int64_t n, int d, const double *mean, double *cov,
                    double *part, double *c) {
    size_t dd = (size_t)d * d;
    memset(cov, 0, dd * sizeof *cov);
    for (int64_t lo = 0; lo < n; lo += TS_METRICS_BLOCK) {
        int64_t hi = lo + TS_METRICS_BLOCK < n ? lo + TS_METRICS_BLOCK : n;
        memset(part, 0, dd * sizeof *part);
        for (int64_t i = lo; i < hi; i++) {
            for (int j = 0; j < d; j++)
                c[j] = (double)feat[(size_t)i * d + j] - mean[j];
            for (int a = 0; a < d; a++) {
                double ca = c[a];
                double *row = part + (size_t)a * d;
                for (int b = a; b < d; b++)
                    row[b] += ca * c[b];
            }
        }
        for (int a = 0; a < d; a++)
            for (int b = a; b < d; b++)
                cov[(size_t)a * d + b] += part[(size_t)a * d + b];
    }
    double inv = 1.0 / (double)(n - 1);
    for (int a = 0; a < d; a++) {
        for (int b = a; b < d; b++)
            cov[(size_t)a * d + b] *= inv;
        for (int b = 0; b < a; b++)
            cov[(size_t)a * d + b] = cov[(size_t)b * d + a];
    }
}

int ts_gauss_fit(const float *feat, int64_t n, int d, double *mean, double *cov, char *err,
                 size_t errlen) {
    if (!feat || !mean || !cov) {
        ts_set_err(err, errlen, "ts_gauss_fit: feat, mean or cov is NULL");
        return TS_EINVAL;
    }
    if (n < 2 || d < 1 || d > TS_METRICS_MAX_DIM) {
        ts_set_err(err, errlen,
                   "ts_gauss_fit: %lld rows of %d features; a covariance needs at least 2 rows "
                   "and 1 to %d features",
                   (long long)n, d, TS_METRICS_MAX_DIM);
        return TS_EINVAL;
    }
    if (!all_finite_f32(feat, n * d)) {
        ts_set_err(err, errlen, "ts_gauss_fit: the features hold a NaN or Inf");
        return TS_ENONFINITE;
    }
    double *part = malloc(((size_t)d * d + (size_t)d) * sizeof *part);
    if (!part) {
        ts_set_err(err, errlen, "ts_gauss_fit: out of memory for a %d×%d covariance", d, d);
        return TS_ENOMEM;
    }
    double *c = part + (size_t)d * d;
    fit_mean(feat, n, d, mean, part);
    fit_cov(feat, n, d, mean, cov, part, c);
    free(part);
    return TS_OK;
}

/* ---- the Fréchet distance ----------------------------------------------------------------- */

/* Eigenvalues of the symmetric a (d, d) (upper triangle read) into w, ascending, negatives set to
 * 0 (see the top of the file); with vectors, a is overwritten by the eigenvectors (column j of a
 * is the vector of w[j]). Returns 0 or TS_ERANGE. */
static int eig_psd(double *a, int d, double *w, int vectors, const char *what, char *err,
                   size_t errlen) {
    lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, vectors ? 'V' : 'N', 'U', d, a, d, w);
    if (info != 0) {
        ts_set_err(err, errlen,
                   "Fréchet distance: the eigendecomposition of %s failed (LAPACKE "
                   "info %d)",
                   what, (int)info);
        return info < 0 ? TS_EINVAL : TS_ERANGE;
    }
    for (int j = 0; j < d; j++)
        if (w[j] < 0.0)
            w[j] = 0.0;
    return TS_OK;
}

/* s = Σ^½ (d, d) of the PSD cov: cov = V Λ Vᵀ, then s = (V Λ^½) Vᵀ. v, b (d, d) and w (d) are
 * scratch. */
static int sqrt_psd(const double *cov, int d, double *s, double *v, double *b, double *w, char *err,
                    size_t errlen) {
    memcpy(v, cov, (size_t)d * d * sizeof *v);
    int rc = eig_psd(v, d, w, 1, "the first covariance", err, errlen);
    if (rc)
        return rc;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++)
            b[(size_t)i * d + j] = v[(size_t)i * d + j] * sqrt(w[j]);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d, d, d, 1.0, b, d, v, d, 0.0, s, d);
    return TS_OK;
}

int ts_frechet_distance(const double *mu1, const double *cov1, const double *mu2,
                        const double *cov2, int d, double *fd, char *err, size_t errlen) {
    if (!mu1 || !cov1 || !mu2 || !cov2 || !fd) {
        ts_set_err(err, errlen, "ts_frechet_distance: NULL argument");
        return TS_EINVAL;
    }
    if (d < 1 || d > TS_METRICS_MAX_DIM) {
        ts_set_err(err, errlen, "ts_frechet_distance: dimension %d is not in [1, %d]", d,
                   TS_METRICS_MAX_DIM);
        return TS_EINVAL;
    }
    size_t dd = (size_t)d * d;
    if (!all_finite_f64(mu1, d) || !all_finite_f64(mu2, d) || !all_finite_f64(cov1, (int64_t)dd) ||
        !all_finite_f64(cov2, (int64_t)dd)) {
        ts_set_err(err, errlen, "ts_frechet_distance: a mean or covariance holds a NaN or Inf");
        return TS_ENONFINITE;
    }
    /* s1 = Σ1^½, c2 = Σ2 with both triangles, t = s1·Σ2, m = t·s1 (d, d each); w (d) */
    double *buf = malloc((4 * dd + (size_t)d) * sizeof *buf);
    if (!buf) {
        ts_set_err(err, errlen, "ts_frechet_distance: out of memory for %d×%d matrices", d, d);
        return TS_ENOMEM;
    }
    double *s1 = buf, *c2 = s1 + dd, *t = c2 + dd, *m = t + dd, *w = m + dd;
    int rc = sqrt_psd(cov1, d, s1, t, m, w, err, errlen);
    if (rc)
        goto out;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++)
            c2[(size_t)i * d + j] = i <= j ? cov2[(size_t)i * d + j] : cov2[(size_t)j * d + i];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, s1, d, c2, d, 0.0, t, d);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, t, d, s1, d, 0.0, m, d);
    for (int i = 0; i < d; i++)
        for (int j = i + 1; j < d; j++) {
            double avg = 0.5 * (m[(size_t)i * d + j] + m[(size_t)j * d + i]);
            m[(size_t)i * d + j] = m[(size_t)j * d + i] = avg;
        }
    rc = eig_psd(m, d, w, 0, "Σ1^½ Σ2 Σ1^½", err, errlen);
    if (rc)
        goto out;

    double diff2 = 0.0, tr1 = 0.0, tr2 = 0.0, tr_sqrt = 0.0;
    for (int j = 0; j < d; j++) {
        double dm = mu1[j] - mu2[j];
        diff2 += dm * dm;
        tr1 += cov1[(size_t)j * d + j];
        tr2 += cov2[(size_t)j * d + j];
        tr_sqrt += sqrt(w[j]);
    }
    double v = diff2 + tr1 + tr2 - 2.0 * tr_sqrt;
    *fd = v > 0.0 ? v : 0.0;
out:
    free(buf);
    return rc;
}

int ts_fd_from_features(const float *feat1, int64_t n1, const float *feat2, int64_t n2, int d,
                        double *fd, char *err, size_t errlen) {
    if (!fd || d < 1 || d > TS_METRICS_MAX_DIM) {
        ts_set_err(err, errlen,
                   "ts_fd_from_features: fd is NULL or dimension %d is not in "
                   "[1, %d]",
                   d, TS_METRICS_MAX_DIM);
        return TS_EINVAL;
    }
    size_t dd = (size_t)d * d;
    double *buf = malloc((2 * dd + 2 * (size_t)d) * sizeof *buf);
    if (!buf) {
        ts_set_err(err, errlen, "ts_fd_from_features: out of memory for %d×%d covariances", d, d);
        return TS_ENOMEM;
    }
    double *cov1 = buf, *cov2 = cov1 + dd, *mu1 = cov2 + dd, *mu2 = mu1 + d;
    int rc = ts_gauss_fit(feat1, n1, d, mu1, cov1, err, errlen);
    if (!rc)
        rc = ts_gauss_fit(feat2, n2, d, mu2, cov2, err, errlen);
    if (!rc)
        rc = ts_frechet_distance(mu1, cov1, mu2, cov2, d, fd, err, errlen);
    free(buf);
    return rc;
}

/* ---- class coverage ----------------------------------------------------------------------- */

void ts_argmax_rows(const float *logits, int64_t n, int K, int32_t *pred) {
    for (int64_t i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * K;
        int best = 0;
        float bv = row[0];
        for (int k = 1; k < K; k++)
            if (row[k] > bv || (isnan(bv) && !isnan(row[k]))) {
                best = k;
                bv = row[k];
            }
        pred[i] = best;
    }
}

int ts_class_coverage(const int32_t *pred, int64_t n, int K, double *entropy_bits, double *hist,
                      char *err, size_t errlen) {
    if (!pred || !entropy_bits || n < 1 || K < 1) {
        ts_set_err(err, errlen,
                   "ts_class_coverage: NULL argument, or %lld predictions over %d "
                   "classes (need at least 1 of each)",
                   (long long)n, K);
        return TS_EINVAL;
    }
    int64_t *count = calloc((size_t)K, sizeof *count);
    if (!count) {
        ts_set_err(err, errlen, "ts_class_coverage: out of memory for %d classes", K);
        return TS_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        if (pred[i] < 0 || pred[i] >= K) {
            ts_set_err(err, errlen,
                       "ts_class_coverage: prediction %lld is class %d, not in "
                       "[0, %d)",
                       (long long)i, (int)pred[i], K);
            free(count);
            return TS_EINVAL;
        }
        count[pred[i]]++;
    }
    double h = 0.0;
    for (int k = 0; k < K; k++) {
        double p = (double)count[k] / (double)n;
        if (hist)
            hist[k] = p;
        if (count[k] > 0)
            h -= p * log2(p);
    }
    free(count);
    *entropy_bits = h > 0.0 ? h : 0.0; /* a single class gives −1·log2 1 = −0.0 */
    return TS_OK;
}
