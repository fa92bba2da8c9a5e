/*
 * test_quality.c — bootstrap resamples, quantiles, precision/recall and the Inception Score
 * (model/quality.h).
 *
 * Covers: resample indices in range, a pure function of (seed, b, n), different across b, and
 * uniform (each index drawn about once per resample on average); quantiles against hand-worked
 * order statistics; ts_fd_rows against ts_fd_from_features on the same rows (identity and
 * repeated rows), and the paired bootstrap of a set against itself, whose interval is exactly
 * {0}; precision/recall against a naive triple loop written here (sorting every row's distances),
 * on overlapping and on disjoint sets, and 1/1 for a set against itself; a dropped mode lowers
 * recall and not precision; the Inception Score against a naive float computation, 1 for equal
 * predictions and K for certain balanced ones; the refusals.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/metrics.h"
#include "model/quality.h"
#include "tests/testutil.h"

static char err[512];

static float normal(tu_rng_t *r) {
    float u1 = tu_rng_uniform(r, 1e-7f, 1.0f), u2 = tu_rng_uniform(r, 0.0f, 1.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static float *gaussian_set(uint64_t seed, int n, int d, float shift) {
    tu_rng_t r = {seed};
    float *x = tu_floats((int64_t)n * d);
    for (int i = 0; i < n * d; i++)
        x[i] = normal(&r) + shift;
    return x;
}

static void test_bootstrap_indices(void **state) {
    (void)state;
    enum { N = 5000 };
    int32_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c);
    int *count = calloc(N, sizeof *count);
    ts_bootstrap_indices(7, 3, N, a);
    ts_bootstrap_indices(7, 3, N, b);
    ts_bootstrap_indices(7, 4, N, c);
    assert_memory_equal(a, b, N * sizeof *a);
    int same = 0;
    for (int i = 0; i < N; i++) {
        assert_true(a[i] >= 0 && a[i] < N);
        same += a[i] == c[i];
        count[a[i]]++;
    }
    assert_true(same < 20); /* two resamples agree by chance at ~1 of N positions each */
    /* with replacement: about N/e indices are never drawn */
    int never = 0;
    for (int i = 0; i < N; i++)
        never += count[i] == 0;
    assert_true(never > N * 0.33 && never < N * 0.41);
    free(a), free(b), free(c), free(count);
}

static void test_quantile(void **state) {
    (void)state;
    double x[5] = {5, 1, 4, 2, 3};
    tu_check_scalar(ts_quantile(x, 5, 0.5), 3.0, 0, "median");
    tu_check_scalar(ts_quantile(x, 5, 0.25), 2.0, 0, "q25");
    tu_check_scalar(ts_quantile(x, 5, 0.1), 1.4, 1e-12, "q10 interpolates");
    tu_check_scalar(ts_quantile(x, 5, 0.0), 1.0, 0, "min");
    tu_check_scalar(ts_quantile(x, 5, 1.0), 5.0, 0, "max");
    double one = 2.5;
    tu_check_scalar(ts_quantile(&one, 1, 0.975), 2.5, 0, "one value");
}

static void test_fd_rows(void **state) {
    (void)state;
    enum { N = 400, D = 6 };
    float *x = gaussian_set(1, N, D, 0.0f), *y = gaussian_set(2, N, D, 0.3f);
    double mu[D], cov[D * D], fd_direct, fd_rows;
    TU_CHECK_OK(ts_gauss_fit(y, N, D, mu, cov, err, sizeof err));
    TU_CHECK_OK(ts_fd_from_features(x, N, y, N, D, &fd_direct, err, sizeof err));
    int32_t idx[N];
    for (int i = 0; i < N; i++)
        idx[i] = i;
    TU_CHECK_OK(ts_fd_rows(x, idx, N, D, mu, cov, &fd_rows, err, sizeof err));
    tu_check_scalar(fd_rows, fd_direct, 1e-12, "all rows in order = the plain FD");
    /* repeated rows: the same as the FD of the materialised resample */
    ts_bootstrap_indices(3, 0, N, idx);
    float *rs = tu_floats(N * D);
    for (int i = 0; i < N; i++)
        memcpy(rs + i * D, x + idx[i] * D, D * sizeof *rs);
    TU_CHECK_OK(ts_fd_rows(x, idx, N, D, mu, cov, &fd_rows, err, sizeof err));
    TU_CHECK_OK(ts_fd_from_features(rs, N, y, N, D, &fd_direct, err, sizeof err));
    tu_check_scalar(fd_rows, fd_direct, 1e-12, "a resample = the FD of the copied rows");
    /* the paired bootstrap of a set against itself: every difference is 0, so is the interval */
    double diff[50];
    for (int b = 0; b < 50; b++) {
        double f1, f2;
        ts_bootstrap_indices(9, b, N, idx);
        TU_CHECK_OK(ts_fd_rows(x, idx, N, D, mu, cov, &f1, err, sizeof err));
        TU_CHECK_OK(ts_fd_rows(x, idx, N, D, mu, cov, &f2, err, sizeof err));
        diff[b] = f1 - f2;
    }
    assert_true(ts_quantile(diff, 50, 0.025) <= 0.0 && ts_quantile(diff, 50, 0.975) >= 0.0);
    /* and the interval of one set's FD contains its point estimate here */
    double fds[200], fd0;
    for (int i = 0; i < N; i++)
        idx[i] = i;
    TU_CHECK_OK(ts_fd_rows(x, idx, N, D, mu, cov, &fd0, err, sizeof err));
    for (int b = 0; b < 200; b++) {
        ts_bootstrap_indices(11, b, N, idx);
        TU_CHECK_OK(ts_fd_rows(x, idx, N, D, mu, cov, &fds[b], err, sizeof err));
    }
    double lo = ts_quantile(fds, 200, 0.025), hi = ts_quantile(fds, 200, 0.975);
    assert_true(lo < fd0 + 0.05 && hi > fd0 && hi - lo > 0.0);
    TU_CHECK_RC(ts_fd_rows(x, idx, 1, D, mu, cov, &fd0, err, sizeof err), TS_EINVAL);
    free(x), free(y), free(rs);
}

/* The naive reference: every pairwise distance, each row's distances sorted. */
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double naive_d2(const float *a, const float *b, int d) {
    double s = 0.0;
    for (int j = 0; j < d; j++)
        s += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
    return s;
}

static void naive_radii(const float *x, int n, int d, int k, double *rad) {
    double *row = malloc((size_t)n * sizeof *row);
    for (int i = 0; i < n; i++) {
        int m = 0;
        for (int j = 0; j < n; j++)
            if (j != i)
                row[m++] = naive_d2(x + i * d, x + j * d, d);
        qsort(row, (size_t)m, sizeof *row, cmp_d);
        rad[i] = row[k - 1];
    }
    free(row);
}

static double naive_share(const float *q, int nq, const float *b, const double *rad, int nb,
                          int d) {
    int in = 0;
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nb; j++)
            if (naive_d2(q + i * d, b + j * d, d) <= rad[j] * (1 + 1e-12)) {
                in++;
                break;
            }
    return (double)in / nq;
}

static void naive_pr(const float *real, int nr, const float *fake, int nf, int d, int k, double *p,
                     double *r) {
    double *rr = malloc((size_t)nr * sizeof *rr), *rf = malloc((size_t)nf * sizeof *rf);
    naive_radii(real, nr, d, k, rr);
    naive_radii(fake, nf, d, k, rf);
    *p = naive_share(fake, nf, real, rr, nr, d);
    *r = naive_share(real, nr, fake, rf, nf, d);
    free(rr), free(rf);
}

static void test_precision_recall_naive(void **state) {
    (void)state;
    enum { NR = 600, NF = 300, D = 5, K = 3 };
    float *real = gaussian_set(4, NR, D, 0.0f), *fake = gaussian_set(5, NF, D, 0.8f);
    double p, r, pn, rn;
    TU_CHECK_OK(ts_precision_recall(real, NR, fake, NF, D, K, &p, &r, err, sizeof err));
    naive_pr(real, NR, fake, NF, D, K, &pn, &rn);
    tu_check_scalar(p, pn, 1e-12, "precision = naive");
    tu_check_scalar(r, rn, 1e-12, "recall = naive");
    assert_true(p > 0.2 && p < 0.99 && r > 0.2 && r < 0.99); /* partly overlapping */
    /* a set against itself */
    TU_CHECK_OK(ts_precision_recall(real, NR, real, NR, D, K, &p, &r, err, sizeof err));
    tu_check_scalar(p, 1.0, 0, "self precision");
    tu_check_scalar(r, 1.0, 0, "self recall");
    /* far apart: nothing inside */
    float *far = gaussian_set(6, NF, D, 50.0f);
    TU_CHECK_OK(ts_precision_recall(real, NR, far, NF, D, K, &p, &r, err, sizeof err));
    tu_check_scalar(p, 0.0, 0, "disjoint precision");
    tu_check_scalar(r, 0.0, 0, "disjoint recall");
    free(real), free(fake), free(far);
}

static void test_precision_recall_mode_drop(void **state) {
    (void)state;
    /* real: two modes (at 0 and at 20); fake A: both modes; fake B: only the first */
    enum { N = 400, D = 4, K = 3 };
    float *real = gaussian_set(7, N, D, 0.0f), *a = gaussian_set(8, N, D, 0.0f),
          *b = gaussian_set(9, N, D, 0.0f);
    for (int i = N / 2; i < N; i++)
        for (int j = 0; j < D; j++) {
            real[i * D + j] += 20.0f;
            a[i * D + j] += 20.0f;
        }
    double pa, ra, pb, rb;
    TU_CHECK_OK(ts_precision_recall(real, N, a, N, D, K, &pa, &ra, err, sizeof err));
    TU_CHECK_OK(ts_precision_recall(real, N, b, N, D, K, &pb, &rb, err, sizeof err));
    assert_true(ra > 0.85 && pa > 0.85);
    assert_true(pb > 0.85);             /* what it draws is realistic */
    assert_true(rb < 0.55 && rb > 0.3); /* but half of the real set is not covered */
    TU_CHECK_RC(ts_precision_recall(real, 3, a, N, D, 3, &pa, &ra, err, sizeof err), TS_EINVAL);
    real[5] = NAN;
    TU_CHECK_RC(ts_precision_recall(real, N, a, N, D, K, &pa, &ra, err, sizeof err), TS_ENONFINITE);
    free(real), free(a), free(b);
}

static void test_inception_score(void **state) {
    (void)state;
    enum { N = 200, K = 10 };
    float *logits = tu_floats(N * K);
    /* equal predictions: IS = 1 */
    for (int i = 0; i < N * K; i++)
        logits[i] = (float)(i % K) * 0.3f;
    double is;
    TU_CHECK_OK(ts_inception_score(logits, NULL, N, K, &is, err, sizeof err));
    tu_check_scalar(is, 1.0, 1e-12, "identical predictions");
    /* certain and balanced: IS = K */
    for (int i = 0; i < N; i++)
        for (int c = 0; c < K; c++)
            logits[i * K + c] = c == i % K ? 60.0f : -60.0f;
    TU_CHECK_OK(ts_inception_score(logits, NULL, N, K, &is, err, sizeof err));
    tu_check_scalar(is, (double)K, 1e-6, "certain, balanced");
    /* random logits against a naive computation, on a subset of rows */
    tu_rng_t r = {12};
    for (int i = 0; i < N * K; i++)
        logits[i] = tu_rng_uniform(&r, -3.0f, 3.0f);
    int32_t idx[50];
    for (int i = 0; i < 50; i++)
        idx[i] = (i * 7) % N;
    double p[50][K], marg[K] = {0}, kl = 0.0;
    for (int i = 0; i < 50; i++) {
        double s = 0.0;
        for (int c = 0; c < K; c++)
            s += exp(logits[idx[i] * K + c]);
        for (int c = 0; c < K; c++) {
            p[i][c] = exp(logits[idx[i] * K + c]) / s;
            marg[c] += p[i][c] / 50.0;
        }
    }
    for (int i = 0; i < 50; i++)
        for (int c = 0; c < K; c++)
            kl += p[i][c] * log(p[i][c] / marg[c]);
    TU_CHECK_OK(ts_inception_score(logits, idx, 50, K, &is, err, sizeof err));
    tu_check_scalar(is, exp(kl / 50.0), 1e-9, "random logits = naive");
    logits[idx[3] * K + 2] = INFINITY;
    TU_CHECK_RC(ts_inception_score(logits, idx, 50, K, &is, err, sizeof err), TS_ENONFINITE);
    TU_CHECK_RC(ts_inception_score(logits, NULL, N, 1, &is, err, sizeof err), TS_EINVAL);
    free(logits);
}

/* Calibration: the NLL against the formula, the ECE of a hand-made set, the fitted temperature of
 * logits made three times over-confident (labels drawn from the softmax of z, logits 3z: T ≈ 3, and
 * a minimum: the NLL rises 2 % either side), and the refusals. */
static void test_calibration(void **state) {
    (void)state;
    const float L19 = logf(19.0f), L3 = logf(3.0f);
    const float z[4 * 2] = {0, 0, L3, 0, L19, 0, 0, L19};
    const int32_t y[4] = {1, 0, 0, 0};
    double nll, ece, want = 0.0;
    TU_CHECK_OK(ts_calib_nll(z, y, 4, 2, 1.7, &nll, err, sizeof err));
    for (int i = 0; i < 4; i++) {
        double a = z[2 * i] / 1.7, b = z[2 * i + 1] / 1.7;
        want += (log(exp(a) + exp(b)) - (y[i] ? b : a)) / 4;
    }
    tu_check_scalar(nll, want, 1e-12, "nll at T = 1.7");
    /* top probabilities .5 (wrong: tie → class 0), .75 (right), .95 (right), .95 (wrong) */
    TU_CHECK_OK(ts_calib_ece(z, y, 4, 2, 1.0, 10, &ece, err, sizeof err));
    tu_check_scalar(ece, (0.5 + 0.25 + fabs(1.0 - 1.9)) / 4, 1e-6, "ece");
    TU_CHECK_OK(ts_calib_ece(z, y, 4, 2, 1.0, 1, &ece, err, sizeof err));
    tu_check_scalar(ece, fabs(2.0 - 3.15) / 4, 1e-6, "ece, one bin");

    enum { N = 20000, K = 5 };
    float *logits = malloc(sizeof(float) * N * K);
    int32_t *truth = malloc(sizeof(int32_t) * N);
    assert_non_null(logits);
    assert_non_null(truth);
    tu_rng_t r = {77};
    for (int i = 0; i < N; i++) {
        double p[K], sum = 0.0, u = tu_rng_uniform(&r, 0.0f, 1.0f), acc = 0.0;
        for (int k = 0; k < K; k++) {
            double u1 = tu_rng_uniform(&r, 1e-7f, 1.0f), u2 = tu_rng_uniform(&r, 0.0f, 1.0f);
            double zk = 1.5 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
            logits[i * K + k] = (float)(3.0 * zk);
            sum += (p[k] = exp(zk));
        }
        truth[i] = K - 1;
        for (int k = 0; k < K; k++)
            if ((acc += p[k] / sum) > u) {
                truth[i] = k;
                break;
            }
    }
    double T, at, lo, hi;
    TU_CHECK_OK(ts_calib_fit_temperature(logits, truth, N, K, &T, err, sizeof err));
    tu_check_scalar(T, 3.0, 0.15, "fitted temperature");
    TU_CHECK_OK(ts_calib_nll(logits, truth, N, K, T, &at, err, sizeof err));
    TU_CHECK_OK(ts_calib_nll(logits, truth, N, K, T * 1.02, &hi, err, sizeof err));
    TU_CHECK_OK(ts_calib_nll(logits, truth, N, K, T / 1.02, &lo, err, sizeof err));
    assert_true(at <= hi && at <= lo);
    double raw_ece, fit_ece;
    TU_CHECK_OK(ts_calib_ece(logits, truth, N, K, 1.0, 15, &raw_ece, err, sizeof err));
    TU_CHECK_OK(ts_calib_ece(logits, truth, N, K, T, 15, &fit_ece, err, sizeof err));
    assert_true(fit_ece < 0.03 && raw_ece > 0.1);

    int32_t bad[4] = {0, 2, 0, 0};
    TU_CHECK_RC(ts_calib_nll(z, bad, 4, 2, 1.0, &nll, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "label 2 of row 1");
    TU_CHECK_RC(ts_calib_nll(z, y, 4, 2, 0.0, &nll, err, sizeof err), TS_EINVAL);
    logits[7] = NAN;
    TU_CHECK_RC(ts_calib_fit_temperature(logits, truth, N, K, &T, err, sizeof err), TS_ENONFINITE);
    free(logits);
    free(truth);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bootstrap_indices),
        cmocka_unit_test(test_quantile),
        cmocka_unit_test(test_fd_rows),
        cmocka_unit_test(test_precision_recall_naive),
        cmocka_unit_test(test_precision_recall_mode_drop),
        cmocka_unit_test(test_inception_score),
        cmocka_unit_test(test_calibration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
