/*
 * test_space_score.c — scores in one feature space (model/space_score.h): KID against a naive
 * double loop of its formula, the bootstrap's paired differences, FD as model/quality.h computes
 * it, and the errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/metrics.h"
#include "model/quality.h"
#include "model/space_score.h"
#include "tests/testutil.h"

static void gaussian(tu_rng_t *r, float *x, int64_t n, int d, float shift, float scale) {
    for (int64_t i = 0; i < n * d; i++) {
        float u1 = tu_rng_uniform(r, 1e-7f, 1.0f), u2 = tu_rng_uniform(r, 0.0f, 1.0f);
        x[i] = shift + scale * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
    }
}

static long double k3(const float *a, const float *b, int d) {
    long double s = 0.0L;
    for (int i = 0; i < d; i++)
        s += (long double)a[i] * b[i];
    long double v = s / d + 1.0L;
    return v * v * v;
}

/* x0, y0 into x, y standardised by y0's column mean and (population) std */
static void standardise(const float *x0, int m, const float *y0, int r, int d, float *x, float *y) {
    for (int k = 0; k < d; k++) {
        long double mean = 0, var = 0;
        for (int i = 0; i < r; i++)
            mean += y0[i * d + k];
        mean /= r;
        for (int i = 0; i < r; i++)
            var += (y0[i * d + k] - mean) * (y0[i * d + k] - mean);
        long double sd = sqrtl(var / r);
        for (int i = 0; i < r; i++)
            y[i * d + k] = (float)((y0[i * d + k] - mean) / sd);
        for (int i = 0; i < m; i++)
            x[i * d + k] = (float)((x0[i * d + k] - mean) / sd);
    }
}

/* the KID of x against y by its formula, on copies standardised by y's column mean and std */
static double naive_kid(const float *x0, int m, const float *y0, int r, int d) {
    float *x = malloc(sizeof(float) * m * d), *y = malloc(sizeof(float) * r * d);
    standardise(x0, m, y0, r, d, x, y);
    long double xx = 0, yy = 0, xy = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < m; j++)
            if (i != j)
                xx += k3(x + i * d, x + j * d, d);
    for (int i = 0; i < r; i++)
        for (int j = 0; j < r; j++)
            if (i != j)
                yy += k3(y + i * d, y + j * d, d);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < r; j++)
            xy += k3(x + i * d, y + j * d, d);
    free(x), free(y);
    return (double)(xx / ((long double)m * (m - 1)) + yy / ((long double)r * (r - 1)) -
                    2.0L * xy / ((long double)m * r));
}

static void test_kid_against_loops(void **state) {
    (void)state;
    tu_rng_t r = {42};
    enum { M = 37, R = 700, D = 6 }; /* R past one block of kernel rows */
    float x[M * D], *y = malloc(sizeof(float) * R * D);
    gaussian(&r, x, M, D, 0.3f, 1.2f);
    gaussian(&r, y, R, D, 5.0f, 3.0f); /* off-centre and wide: the standardisation matters */
    double kid, want = naive_kid(x, M, y, R, D);
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_kid(x, M, y, R, D, &kid, err, sizeof err), TS_OK, err);
    printf("KID %.9g, naive %.9g\n", kid, want);
    tu_check_scalar(kid, want, 1e-9 + 1e-6 * fabs(want),
                    "KID"); /* the samples' kernel is kept in float */
    free(y);
}

/* Same distribution: KID near 0 (unbiased: either sign), a shifted one clearly above; the FD is
 * ts_fd_rows's; an entry scored twice has paired differences of exactly 0. */
static void test_scores(void **state) {
    (void)state;
    tu_rng_t r = {7};
    enum { N = 400, R = 600, D = 4 };
    float *ref = malloc(sizeof(float) * R * D), *same = malloc(sizeof(float) * N * D),
          *shifted = malloc(sizeof(float) * N * D);
    gaussian(&r, ref, R, D, 0.0f, 1.0f);
    gaussian(&r, same, N, D, 0.0f, 1.0f);
    gaussian(&r, shifted, N, D, 0.5f, 1.0f);
    const float *feat[3] = {same, shifted, same};
    int64_t n[3] = {N, N, N};
    ts_space_score_t s[3];
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_space_score(feat, n, 3, ref, R, D, 50, 3, s, err, sizeof err), TS_OK, err);
    printf("same: FD %.4f [%.4f, %.4f] KID %.5f [%.5f, %.5f]; shifted: FD %.4f KID %.5f, "
           "d KID %.5f [%.5f, %.5f]\n",
           s[0].fd, s[0].fd_lo, s[0].fd_hi, s[0].kid, s[0].kid_lo, s[0].kid_hi, s[1].fd, s[1].kid,
           s[1].d_kid, s[1].d_kid_lo, s[1].d_kid_hi);
    assert_true(fabs(s[0].kid) < 0.02);
    assert_true(s[0].kid_lo <= s[0].kid && s[0].kid <= s[0].kid_hi);
    assert_true(s[0].fd_lo < s[0].fd_hi);
    assert_true(s[1].kid > 0.1 && s[1].d_kid_lo > 0.0); /* the shift is found, paired */
    assert_true(s[1].d_fd_lo > 0.0);
    assert_true(isnan(s[0].d_fd)); /* the first entry has no difference */
    assert_true(s[2].d_fd == 0.0 && s[2].d_fd_lo == 0.0 && s[2].d_fd_hi == 0.0);
    assert_true(s[2].d_kid == 0.0 && s[2].d_kid_lo == 0.0 && s[2].d_kid_hi == 0.0);
    /* the FD as model/quality.h computes it */
    double mu[D], cov[D * D], fd;
    int32_t idx[N];
    for (int i = 0; i < N; i++)
        idx[i] = i;
    TU_CHECK_OK(ts_gauss_fit(ref, R, D, mu, cov, err, sizeof err));
    TU_CHECK_OK(ts_fd_rows(shifted, idx, N, D, mu, cov, &fd, err, sizeof err));
    assert_true(fd == s[1].fd);
    double kid;
    TU_CHECK_OK(ts_kid(shifted, N, ref, R, D, &kid, err, sizeof err));
    tu_check_scalar(s[1].kid, kid, 1e-12, "KID of the entry");
    free(ref), free(same), free(shifted);
}

/* The bootstrap's KID: each resample's value by its formula — the pairs of draws of distinct
 * samples, in long double — then the same interval: the counted path of ts_space_score. */
static void test_kid_bootstrap_against_loops(void **state) {
    (void)state;
    tu_rng_t r = {3};
    enum { M = 12, R = 30, D = 3, NB = 25 };
    float x[M * D], y[R * D], xs[M * D], xz[M * D], yz[R * D];
    gaussian(&r, x, M, D, 0.4f, 1.0f);
    gaussian(&r, y, R, D, 0.0f, 1.0f);
    const float *feat[1] = {x};
    int64_t n[1] = {M};
    ts_space_score_t s;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_space_score(feat, n, 1, y, R, D, NB, 3, &s, err, sizeof err), TS_OK, err);
    double boot[NB];
    int32_t idx[M];
    for (int b = 0; b < NB; b++) {
        ts_bootstrap_indices(0, b, M, idx);
        for (int i = 0; i < M; i++)
            memcpy(xs + i * D, x + idx[i] * D, sizeof(float) * D);
        /* naive_kid counts every pair i ≠ j of the resample; two draws of one sample must not
         * pair: its within-set mean replaced by the mean over pairs of distinct samples */
        double full = naive_kid(xs, M, y, R, D);
        standardise(xs, M, y, R, D, xz, yz);
        long double all = 0, same = 0;
        long pairs_all = 0, pairs_distinct = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < M; j++) {
                if (i == j)
                    continue;
                long double k = k3(xz + i * D, xz + j * D, D);
                all += k, pairs_all++;
                if (idx[i] == idx[j])
                    same += k;
                else
                    pairs_distinct++;
            }
        boot[b] = full - (double)(all / pairs_all) + (double)((all - same) / pairs_distinct);
    }
    double lo, hi;
    ts_bootstrap_interval(boot, NB, s.kid, &lo, &hi, NULL);
    printf("KID %.6f [%.6f, %.6f]; by the formula per resample [%.6f, %.6f]\n", s.kid, s.kid_lo,
           s.kid_hi, lo, hi);
    tu_check_scalar(s.kid_lo, lo, 1e-6 * (1 + fabs(lo)), "KID interval, low");
    tu_check_scalar(s.kid_hi, hi, 1e-6 * (1 + fabs(hi)), "KID interval, high");
}

static void test_errors(void **state) {
    (void)state;
    float x[24], y[24];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i, y[i] = (float)(i % 7);
    x[23] = NAN;
    const float *feat[1] = {x};
    int64_t n[1] = {12};
    ts_space_score_t s;
    char err[256] = "";
    assert_int_equal(ts_space_score(feat, n, 1, y, 12, 2, 0, 1, &s, err, sizeof err),
                     TS_ENONFINITE);
    TU_CHECK_CONTAINS(err, "not finite");
    n[0] = 9; /* below TS_SPACE_SCORE_MIN_N */
    assert_int_equal(ts_space_score(feat, n, 1, y, 12, 2, 0, 1, &s, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "at least");
    double kid;
    assert_int_equal(ts_kid(y, 1, y, 4, 2, &kid, err, sizeof err), TS_EINVAL);
    assert_int_equal(ts_kid(x, 12, y, 4, 2, &kid, err, sizeof err), TS_ENONFINITE);
    double lo, hi, one = 1.0, vals[3] = {1.0, NAN, 2.0};
    ts_bootstrap_interval(&one, 1, 0.0, &lo, &hi, NULL);
    assert_true(isnan(lo) && isnan(hi));
    ts_bootstrap_interval(vals, 3, 1.0, &lo, &hi, NULL); /* a NaN resample: no interval */
    assert_true(isnan(lo) && isnan(hi));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kid_against_loops),
        cmocka_unit_test(test_kid_bootstrap_against_loops),
        cmocka_unit_test(test_scores),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
