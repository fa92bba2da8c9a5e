/*
 * test_metrics.c — Gaussian fits, the Fréchet distance and class coverage (model/metrics.h).
 *
 * Covers: ts_gauss_fit against a naive two-pass computation (over several accumulation blocks,
 * exactly symmetric); FD of a set with itself ≈ 0; a mean shift δ adds exactly ‖δ‖² (on dyadic
 * data, whose fits are exact) and FD grows with the shift; the closed form for diagonal
 * covariances, both on given matrices and on samples with exactly known moments (Walsh sign
 * patterns); invariance under rotating both sets by one orthogonal matrix; non-commuting
 * covariances against Tr (Σ1 Σ2)^½ computed here independently by the Denman–Beavers iteration
 * (no eigendecomposition); singular covariances (the eigenvalue clamp); coverage entropy
 * (uniform = log2 K, one class = 0, a 3:1 split) and argmax ties and NaNs; the refusals.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/metrics.h"
#include "tests/testutil.h"

#define CHECK_RC(expr, want) TU_CHECK_RC_MSG(expr, want, err)
#define CHECK_OK(expr) CHECK_RC(expr, TS_OK)

#define DMAX 8 /* the largest d of the dense reference computations below */

static char err[512];

/* ---- helpers ------------------------------------------------------------------------------ */

/* A normal draw (Box–Muller) from r. */
static double normal(tu_rng_t *r) {
    double u1 = tu_rng_uniform(r, 1e-7f, 1.0f), u2 = tu_rng_uniform(r, 0.0f, 1.0f);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* n rows of x = A z + b, z standard normal, A (d, d) and b (d) random with the given scale:
 * correlated features. Caller frees. */
static float *correlated(tu_rng_t *r, int64_t n, int d, double shift) {
    double A[DMAX * DMAX], b[DMAX];
    for (int i = 0; i < d * d; i++)
        A[i] = tu_rng_uniform(r, -1.0f, 1.0f);
    for (int i = 0; i < d; i++)
        b[i] = shift + tu_rng_uniform(r, -1.0f, 1.0f);
    float *x = tu_floats(n * d);
    double z[DMAX];
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < d; j++)
            z[j] = normal(r);
        for (int a = 0; a < d; a++) {
            double s = b[a];
            for (int j = 0; j < d; j++)
                s += A[a * d + j] * z[j];
            x[i * d + a] = (float)s;
        }
    }
    return x;
}

static double trace(const double *m, int d) {
    double t = 0.0;
    for (int i = 0; i < d; i++)
        t += m[i * d + i];
    return t;
}

/* c = a b for (d, d) matrices. */
static void matmul(double *c, const double *a, const double *b, int d) {
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double s = 0.0;
            for (int k = 0; k < d; k++)
                s += a[i * d + k] * b[k * d + j];
            c[i * d + j] = s;
        }
}

/* inv = a⁻¹ by Gauss–Jordan elimination with partial pivoting (d ≤ DMAX). */
static void invert(double *inv, const double *a, int d) {
    double m[DMAX * 2 * DMAX];
    int w = 2 * d;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < w; j++)
            m[i * w + j] = j < d ? a[i * d + j] : (j - d == i);
    for (int c = 0; c < d; c++) {
        int p = c;
        for (int i = c + 1; i < d; i++)
            if (fabs(m[i * w + c]) > fabs(m[p * w + c]))
                p = i;
        assert_true(fabs(m[p * w + c]) > 1e-300);
        for (int j = 0; j < w; j++) {
            double t = m[c * w + j];
            m[c * w + j] = m[p * w + j];
            m[p * w + j] = t;
        }
        double piv = m[c * w + c];
        for (int j = 0; j < w; j++)
            m[c * w + j] /= piv;
        for (int i = 0; i < d; i++)
            if (i != c) {
                double f = m[i * w + c];
                for (int j = 0; j < w; j++)
                    m[i * w + j] -= f * m[c * w + j];
            }
    }
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++)
            inv[i * d + j] = m[i * w + d + j];
}

/* Tr M^½ of a matrix M with positive real eigenvalues, by the Denman–Beavers iteration
 * Y ← (Y + Z⁻¹)/2, Z ← (Z + Y⁻¹)/2 from Y = M, Z = I (Y → M^½, Z → M^−½). */
static double trace_sqrt_db(const double *mat, int d) {
    double y[DMAX * DMAX], z[DMAX * DMAX], yi[DMAX * DMAX], zi[DMAX * DMAX];
    memcpy(y, mat, sizeof(double) * d * d);
    for (int i = 0; i < d * d; i++)
        z[i] = (i / d == i % d);
    for (int it = 0; it < 100; it++) {
        invert(yi, y, d);
        invert(zi, z, d);
        double change = 0.0;
        for (int i = 0; i < d * d; i++) {
            double ny = 0.5 * (y[i] + zi[i]);
            change = fmax(change, fabs(ny - y[i]));
            y[i] = ny;
            z[i] = 0.5 * (z[i] + yi[i]);
        }
        if (change < 1e-15 * (1.0 + trace(y, d)))
            break;
    }
    return trace(y, d);
}

/* ---- the Gaussian fit --------------------------------------------------------------------- */

static void test_gauss_fit_matches_naive(void **state) {
    (void)state;
    tu_rng_t rng = {1};
    const int64_t n = 3 * TS_METRICS_BLOCK + 17; /* several blocks, the last one partial */
    const int d = 5;
    float *x = correlated(&rng, n, d, 3.0);
    double mean[DMAX], cov[DMAX * DMAX], rm[DMAX] = {0}, rc[DMAX * DMAX] = {0};
    CHECK_OK(ts_gauss_fit(x, n, d, mean, cov, err, sizeof err));
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < d; j++)
            rm[j] += x[i * d + j];
    for (int j = 0; j < d; j++)
        rm[j] /= (double)n;
    for (int64_t i = 0; i < n; i++)
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++)
                rc[a * d + b] += (x[i * d + a] - rm[a]) * (x[i * d + b] - rm[b]);
    for (int a = 0; a < d; a++) {
        tu_check_scalar(mean[a], rm[a], 1e-12 * (1.0 + fabs(rm[a])), "mean[%d]", a);
        for (int b = 0; b < d; b++) {
            double want = rc[a * d + b] / (double)(n - 1);
            tu_check_scalar(cov[a * d + b], want, 1e-12 * (1.0 + fabs(want)), "cov[%d][%d]", a, b);
            assert_true(cov[a * d + b] == cov[b * d + a]); /* exactly symmetric */
        }
    }
    free(x);
}

/* ---- the Fréchet distance ----------------------------------------------------------------- */

static void test_fd_self_is_zero(void **state) {
    (void)state;
    tu_rng_t rng = {2};
    const int64_t n = 2000;
    const int d = 8;
    float *x = correlated(&rng, n, d, 0.5);
    double mean[DMAX], cov[DMAX * DMAX], fd = -1.0;
    CHECK_OK(ts_gauss_fit(x, n, d, mean, cov, err, sizeof err));
    CHECK_OK(ts_frechet_distance(mean, cov, mean, cov, d, &fd, err, sizeof err));
    double tr = trace(cov, d);
    assert_true(tr > 1.0);
    tu_check_scalar(fd, 0.0, 1e-6 * tr, "FD of a fit with itself (trace %g)", tr);
    fd = -1.0;
    CHECK_OK(ts_fd_from_features(x, n, x, n, d, &fd, err, sizeof err));
    tu_check_scalar(fd, 0.0, 1e-6 * tr, "FD of a set with itself");
    free(x);
}

/* Dyadic features (multiples of 1/256 below 8 in magnitude, 1024 rows) shifted by dyadic δ:
 * every sum and the division by n of the fit are exact, so both sets have bit-identical covariances and the FD is ‖δ‖² plus only the
 * rounding of the self term. */
static void test_fd_mean_shift(void **state) {
    (void)state;
    tu_rng_t rng = {3};
    const int64_t n = 1024;
    const int d = 6;
    float *x = tu_floats(n * d), *y = tu_floats(n * d);
    for (int64_t i = 0; i < n * d; i++)
        x[i] = (float)((int)(tu_rng_next(&rng) % 512) - 256) / 64.0f;
    /* a correlated pair of coordinates, so the covariance is not diagonal */
    for (int64_t i = 0; i < n; i++)
        x[i * d + 1] = x[i * d + 0] * 0.5f + x[i * d + 1] * 0.25f;
    double prev = -1.0;
    for (int k = 1; k <= 3; k++) {
        const float delta[6] = {0.5f, -1.25f, 0.0f, 2.0f, 0.125f, -0.75f};
        double want = 0.0;
        for (int j = 0; j < d; j++)
            want += (double)(k * delta[j]) * (k * delta[j]);
        for (int64_t i = 0; i < n; i++)
            for (int j = 0; j < d; j++)
                y[i * d + j] = x[i * d + j] + (float)k * delta[j];
        double fd = -1.0;
        CHECK_OK(ts_fd_from_features(x, n, y, n, d, &fd, err, sizeof err));
        tu_check_scalar(fd, want, 1e-6 * want, "FD after a shift of %d·δ", k);
        assert_true(fd > prev); /* grows with the shift */
        prev = fd;
    }
    free(x);
    free(y);
}

/* For diagonal covariances, FD = Σ (μ1 − μ2)² + Σ (σ1 − σ2)². */
static void test_fd_diagonal_matrices(void **state) {
    (void)state;
    enum { D = 6 };
    const double mu1[D] = {0.0, 1.0, -2.0, 0.5, 3.0, 0.0};
    const double mu2[D] = {1.0, 1.0, 0.0, -0.5, 2.5, 0.25};
    const double s1[D] = {1.0, 2.0, 0.5, 3.0, 0.1, 0.0}; /* one zero variance */
    const double s2[D] = {2.0, 0.5, 0.5, 1.0, 4.0, 1.5};
    double c1[D * D] = {0}, c2[D * D] = {0}, want = 0.0;
    for (int j = 0; j < D; j++) {
        c1[j * D + j] = s1[j] * s1[j];
        c2[j * D + j] = s2[j] * s2[j];
        want += (mu1[j] - mu2[j]) * (mu1[j] - mu2[j]) + (s1[j] - s2[j]) * (s1[j] - s2[j]);
    }
    double fd = -1.0;
    CHECK_OK(ts_frechet_distance(mu1, c1, mu2, c2, D, &fd, err, sizeof err));
    tu_check_scalar(fd, want, 1e-12 * want, "FD of diagonal Gaussians");
    /* symmetric in its two arguments */
    CHECK_OK(ts_frechet_distance(mu2, c2, mu1, c1, D, &fd, err, sizeof err));
    tu_check_scalar(fd, want, 1e-12 * want, "FD of diagonal Gaussians, swapped");
}

/* Sign (±1) of row i, column j of a Walsh pattern of 16 rows: the columns (j < 15) are orthogonal
 * to each other and to the constant, so features μ_j + s_j·sign have mean exactly μ and a sample
 * covariance exactly diagonal, s_j² · 16/15. */
static float walsh(int i, int j) {
    return __builtin_popcount((unsigned)(i & (j + 1))) & 1 ? -1.0f : 1.0f;
}

static void test_fd_diagonal_samples(void **state) {
    (void)state;
    enum { N = 16, D = 5 };
    const float mu1[D] = {0.0f, 1.0f, -2.0f, 0.5f, 3.0f}, mu2[D] = {1.0f, 1.0f, 0.0f, -0.5f, 2.5f};
    const float s1[D] = {1.0f, 2.0f, 0.5f, 3.0f, 0.25f}, s2[D] = {2.0f, 0.5f, 0.5f, 1.0f, 4.0f};
    float x[N * D], y[N * D];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++) {
            x[i * D + j] = mu1[j] + s1[j] * walsh(i, j);
            y[i * D + j] = mu2[j] + s2[j] * walsh(i, j + 7); /* other columns: still diagonal */
        }
    double want = 0.0, k = sqrt((double)N / (N - 1)); /* σ = s · √(16/15) */
    for (int j = 0; j < D; j++)
        want += (double)(mu1[j] - mu2[j]) * (mu1[j] - mu2[j]) +
                (k * s1[j] - k * s2[j]) * (k * s1[j] - k * s2[j]);
    double fd = -1.0;
    CHECK_OK(ts_fd_from_features(x, N, y, N, D, &fd, err, sizeof err));
    tu_check_scalar(fd, want, 1e-12 * want, "FD of samples with diagonal moments");
}

/* A random orthogonal matrix q (d, d): Gram–Schmidt (twice) of random columns. */
static void random_orthogonal(tu_rng_t *r, double *q, int d) {
    for (int i = 0; i < d * d; i++)
        q[i] = normal(r);
    for (int c = 0; c < d; c++)
        for (int pass = 0; pass < 2; pass++) {
            for (int p = 0; p < c; p++) {
                double dot = 0.0;
                for (int i = 0; i < d; i++)
                    dot += q[i * d + c] * q[i * d + p];
                for (int i = 0; i < d; i++)
                    q[i * d + c] -= dot * q[i * d + p];
            }
            double nrm = 0.0;
            for (int i = 0; i < d; i++)
                nrm += q[i * d + c] * q[i * d + c];
            for (int i = 0; i < d; i++)
                q[i * d + c] /= sqrt(nrm);
        }
}

static void rotate(float *out, const float *x, int64_t n, const double *q, int d) {
    for (int64_t i = 0; i < n; i++)
        for (int a = 0; a < d; a++) {
            double s = 0.0;
            for (int b = 0; b < d; b++)
                s += q[a * d + b] * x[i * d + b];
            out[i * d + a] = (float)s;
        }
}

static void test_fd_rotation_invariance(void **state) {
    (void)state;
    tu_rng_t rng = {4};
    const int64_t n = 1500;
    const int d = 8;
    float *x = correlated(&rng, n, d, 0.0), *y = correlated(&rng, n, d, 1.0);
    float *xr = tu_floats(n * d), *yr = tu_floats(n * d);
    double q[DMAX * DMAX];
    random_orthogonal(&rng, q, d);
    rotate(xr, x, n, q, d);
    rotate(yr, y, n, q, d);
    double fd = -1.0, fdr = -1.0, mean[DMAX], c1[DMAX * DMAX], c2[DMAX * DMAX];
    CHECK_OK(ts_fd_from_features(x, n, y, n, d, &fd, err, sizeof err));
    CHECK_OK(ts_fd_from_features(xr, n, yr, n, d, &fdr, err, sizeof err));
    CHECK_OK(ts_gauss_fit(x, n, d, mean, c1, err, sizeof err));
    CHECK_OK(ts_gauss_fit(y, n, d, mean, c2, err, sizeof err));
    double scale = trace(c1, d) + trace(c2, d);
    assert_true(fd > 0.1 * scale); /* the two sets differ: the check is not 0 = 0 */
    tu_check_scalar(fdr, fd, 1e-5 * scale, "FD after rotating both sets (FD %g)", fd);
    free(x);
    free(y);
    free(xr);
    free(yr);
}

static void test_fd_noncommuting(void **state) {
    (void)state;
    enum { D = 6 };
    tu_rng_t rng = {5};
    double a[D * D], b[D * D], at[D * D], bt[D * D], c1[D * D], c2[D * D];
    for (int i = 0; i < D * D; i++) {
        a[i] = tu_rng_uniform(&rng, -1.0f, 1.0f);
        b[i] = tu_rng_uniform(&rng, -1.0f, 2.0f);
    }
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++) {
            at[i * D + j] = a[j * D + i];
            bt[i * D + j] = b[j * D + i];
        }
    matmul(c1, a, at, D); /* A Aᵀ + 0.1 I, B Bᵀ + 0.2 I: symmetric positive definite */
    matmul(c2, b, bt, D);
    for (int i = 0; i < D; i++) {
        c1[i * D + i] += 0.1;
        c2[i * D + i] += 0.2;
    }
    double p12[D * D], p21[D * D], comm = 0.0, size = 0.0;
    matmul(p12, c1, c2, D);
    matmul(p21, c2, c1, D);
    for (int i = 0; i < D * D; i++) {
        comm = fmax(comm, fabs(p12[i] - p21[i]));
        size = fmax(size, fabs(p12[i]));
    }
    assert_true(comm > 0.1 * size); /* they do not commute: the symmetric form matters */

    const double mu1[D] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, mu2[D] = {0.0, -0.2, 0.5, 0.4, 1.0, 0.0};
    double diff2 = 0.0;
    for (int j = 0; j < D; j++)
        diff2 += (mu1[j] - mu2[j]) * (mu1[j] - mu2[j]);
    double want = diff2 + trace(c1, D) + trace(c2, D) - 2.0 * trace_sqrt_db(p12, D);
    double fd = -1.0;
    CHECK_OK(ts_frechet_distance(mu1, c1, mu2, c2, D, &fd, err, sizeof err));
    double scale = trace(c1, D) + trace(c2, D);
    tu_check_scalar(fd, want, 1e-9 * scale, "FD against Denman–Beavers (want %.12g)", want);
    assert_true(want > 0.05 * scale);
}

/* Fewer rows than features, and a constant feature: singular covariances, whose eigenvalues
 * come out as ±rounding around 0. The FD stays finite and ≥ 0, and still ≈ 0 for a set with
 * itself. */
static void test_fd_singular(void **state) {
    (void)state;
    tu_rng_t rng = {6};
    const int d = 8;
    const int64_t n = 4;
    float *x = correlated(&rng, n, d, 0.0), *y = correlated(&rng, n, d, 0.0);
    for (int64_t i = 0; i < n; i++)
        x[i * d + 3] = 1.5f;
    double fd = -1.0, mean[DMAX], cov[DMAX * DMAX];
    CHECK_OK(ts_fd_from_features(x, n, x, n, d, &fd, err, sizeof err));
    CHECK_OK(ts_gauss_fit(x, n, d, mean, cov, err, sizeof err));
    tu_check_scalar(fd, 0.0, 1e-6 * trace(cov, d), "FD of a singular fit with itself");
    CHECK_OK(ts_fd_from_features(x, n, y, n, d, &fd, err, sizeof err));
    assert_true(isfinite(fd) && fd > 0.0);
    free(x);
    free(y);
}

static void test_fd_errors(void **state) {
    (void)state;
    float x[4 * 2] = {0, 1, 2, 3, 4, 5, 6, 7};
    double mean[2], cov[4], fd;
    CHECK_RC(ts_gauss_fit(x, 1, 2, mean, cov, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "at least 2 rows"));
    CHECK_RC(ts_gauss_fit(x, 4, 0, mean, cov, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_gauss_fit(NULL, 4, 2, mean, cov, err, sizeof err), TS_EINVAL);
    x[5] = NAN;
    CHECK_RC(ts_gauss_fit(x, 4, 2, mean, cov, err, sizeof err), TS_ENONFINITE);
    CHECK_RC(ts_fd_from_features(x, 4, x, 4, 2, &fd, NULL, 0), TS_ENONFINITE);
    x[5] = 5;
    CHECK_OK(ts_gauss_fit(x, 4, 2, mean, cov, err, sizeof err));
    cov[1] = INFINITY;
    CHECK_RC(ts_frechet_distance(mean, cov, mean, cov, 2, &fd, err, sizeof err), TS_ENONFINITE);
    CHECK_RC(ts_frechet_distance(mean, cov, mean, NULL, 2, &fd, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_frechet_distance(mean, cov, mean, cov, 0, &fd, err, sizeof err), TS_EINVAL);
}

/* ---- class coverage ----------------------------------------------------------------------- */

static void test_coverage(void **state) {
    (void)state;
    enum { K = 10, N = 1000 };
    int32_t pred[N];
    double h = -1.0, hist[K];
    for (int i = 0; i < N; i++)
        pred[i] = i % K;
    CHECK_OK(ts_class_coverage(pred, N, K, &h, hist, err, sizeof err));
    tu_check_scalar(h, log2((double)K), 1e-12, "entropy of a uniform histogram");
    for (int k = 0; k < K; k++)
        tu_check_scalar(hist[k], 0.1, 1e-15, "hist[%d]", k);

    for (int i = 0; i < N; i++)
        pred[i] = 7;
    CHECK_OK(ts_class_coverage(pred, N, K, &h, hist, err, sizeof err));
    assert_true(h == 0.0 && !signbit(h));
    assert_true(hist[7] == 1.0 && hist[0] == 0.0);

    for (int i = 0; i < N; i++)
        pred[i] = i % 4 == 0 ? 2 : 5; /* 1/4, 3/4 */
    CHECK_OK(ts_class_coverage(pred, N, K, &h, NULL, err, sizeof err));
    tu_check_scalar(h, -(0.25 * log2(0.25) + 0.75 * log2(0.75)), 1e-12, "entropy of a 1:3 split");

    pred[9] = K;
    CHECK_RC(ts_class_coverage(pred, N, K, &h, hist, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "prediction 9"));
    pred[9] = -1;
    CHECK_RC(ts_class_coverage(pred, N, K, &h, hist, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_class_coverage(pred, 0, K, &h, hist, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_class_coverage(pred, N, 0, &h, hist, err, sizeof err), TS_EINVAL);
}

static void test_argmax(void **state) {
    (void)state;
    const float logits[5 * 3] = {0.1f,  0.9f,  0.2f,  /* 1 */
                                 3.0f,  3.0f,  1.0f,  /* tie: the lowest index, 0 */
                                 NAN,   -1.0f, -2.0f, /* NaN never wins: 1 */
                                 NAN,   NAN,   NAN,   /* all NaN: 0 */
                                 -5.0f, -4.0f, 2.0f}; /* 2 */
    int32_t pred[5] = {-1, -1, -1, -1, -1};
    ts_argmax_rows(logits, 5, 3, pred);
    assert_int_equal(pred[0], 1);
    assert_int_equal(pred[1], 0);
    assert_int_equal(pred[2], 1);
    assert_int_equal(pred[3], 0);
    assert_int_equal(pred[4], 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gauss_fit_matches_naive),
        cmocka_unit_test(test_fd_self_is_zero),
        cmocka_unit_test(test_fd_mean_shift),
        cmocka_unit_test(test_fd_diagonal_matrices),
        cmocka_unit_test(test_fd_diagonal_samples),
        cmocka_unit_test(test_fd_rotation_invariance),
        cmocka_unit_test(test_fd_noncommuting),
        cmocka_unit_test(test_fd_singular),
        cmocka_unit_test(test_fd_errors),
        cmocka_unit_test(test_coverage),
        cmocka_unit_test(test_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
