/*
 * test_partition.c — PCA, k-means++ and the partition artifact (model/partition.h).
 *
 * Covers: k-means recovers well-separated Gaussian blobs exactly (up to a relabelling), also in
 * the hierarchical variant; k-means and PCA give bit-identical results for 1, 2, 3 and "all"
 * threads and the same seed, and a different result for another seed; PCA against an
 * independent reference (the covariance formed here and diagonalised by a cyclic Jacobi solver,
 * in double) — eigenvalues, |cos| between eigenvectors, the sign convention, explained variance;
 * projection reconstruction error falling as k grows and reaching ~0 at k = D; the artifact's
 * round trip, its id (the BLAKE2b-256 of the file, the same bytes for the same seed) and
 * ts_partition_load refusing tampered files (assignment ≥ K, sizes that are not the histogram,
 * inconsistent shapes, wrong dtype, foreign format, an extra tensor, metadata that disagrees);
 * embed (batch = row by row) and nearest; bad arguments.
 *
 * All data is synthetic (Philox normals), small enough to run in well under a second.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/math.h"
#include "model/partition.h"
#include "model/safetensors.h"

static char err[512];

#define CHECK_RC(expr, want)                                                                       \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != (want)) {                                                                       \
            print_error("%s:%d: %s returned %d (%s), expected %d (%s); err: %s\n", __FILE__,       \
                        __LINE__, #expr, rc_, ts_strerror(rc_), (want), ts_strerror(want), err);   \
            fail();                                                                                \
        }                                                                                          \
    } while (0)
#define CHECK_OK(expr) CHECK_RC(expr, TS_OK)

#define CHECK_MSG(msg, needle)                                                                     \
    do {                                                                                           \
        if (!strstr((msg), (needle))) {                                                            \
            print_error("%s:%d: message \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__,     \
                        (msg), (needle));                                                          \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

/* ---- a temporary folder --------------------------------------------------------------------- */

static char g_dir[256];

static int setup_dir(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/ts_partition_XXXXXX", base && *base ? base : "/tmp");
    err[0] = '\0';
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(g_dir);
    return 0;
}

static const char *in_dir(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return path;
}

/* ---- synthetic data --------------------------------------------------------------------------- */

#define NB 5    /* blobs */
#define PER 100 /* points per blob */
#define BD 8    /* dims */

/* NB blobs of PER points in BD dims, interleaved (point i is in blob i % NB): centre b has
 * coordinate 20·(±1) on dims b and b + 1, noise N(0, 1). */
static float *make_blobs(uint64_t seed) {
    float *x = malloc(NB * PER * BD * sizeof *x);
    assert_non_null(x);
    for (int i = 0; i < NB * PER; i++) {
        int b = i % NB;
        for (int d = 0; d < BD; d++) {
            float c = (d == b) ? 20.0f : (d == b + 1) ? -20.0f : 0.0f;
            x[i * BD + d] = c + ts_rng_normal_at(seed, (uint64_t)(i * BD + d));
        }
    }
    return x;
}

/* Each blob lands in one cluster, and different blobs in different clusters. */
static void assert_recovers_blobs(const int32_t *assign) {
    int label[NB];
    for (int b = 0; b < NB; b++) {
        label[b] = assign[b];
        for (int b2 = 0; b2 < b; b2++)
            assert_int_not_equal(label[b], label[b2]);
    }
    for (int i = 0; i < NB * PER; i++)
        assert_int_equal(assign[i], label[i % NB]);
}

/* n points (n, D) = z · M with z standard normal and M a fixed D×D mixing matrix, plus a shift:
 * a full-rank covariance with distinct eigenvalues. */
static float *make_correlated(int n, int D, uint64_t seed) {
    float *x = malloc((size_t)n * D * sizeof *x);
    double *m = malloc((size_t)D * D * sizeof *m);
    assert_non_null(x);
    assert_non_null(m);
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++)
            m[i * D + j] = (i == j ? (double)(D - i) : 0.0) +
                           0.5 * ts_rng_normal_at(seed + 1, (uint64_t)(i * D + j));
    for (int r = 0; r < n; r++)
        for (int j = 0; j < D; j++) {
            double s = 3.0 + j;
            for (int i = 0; i < D; i++)
                s += ts_rng_normal_at(seed, (uint64_t)(r * D + i)) * m[i * D + j];
            x[(size_t)r * D + j] = (float)s;
        }
    free(m);
    return x;
}

/* ---- k-means ---------------------------------------------------------------------------------- */

static void test_kmeans_blobs(void **state) {
    (void)state;
    float *x = make_blobs(11);
    ts_kmeans_opts_t o = {.K = NB, .restarts = 4, .max_iter = 100, .seed = 3};
    ts_kmeans_t km;
    CHECK_OK(ts_kmeans_fit(x, NB * PER, BD, &o, &km, err, sizeof err));
    assert_int_equal(km.K, NB);
    assert_int_equal(km.n, NB * PER);
    assert_recovers_blobs(km.assignment);
    /* Converged: every centroid is within noise of its blob's centre; inertia ≈ n·D·σ². */
    for (int b = 0; b < NB; b++) {
        const float *c = km.centroids + km.assignment[b] * BD;
        for (int d = 0; d < BD; d++) {
            float want = (d == b) ? 20.0f : (d == b + 1) ? -20.0f : 0.0f;
            assert_true(fabsf(c[d] - want) < 0.5f);
        }
    }
    assert_true(km.inertia > 0.7 * NB * PER * BD && km.inertia < 1.3 * NB * PER * BD);
    ts_kmeans_free(&km);
    free(x);
}

static void test_kmeans_k_equals_n_and_one(void **state) {
    (void)state;
    float x[6] = {0, 0, 1, 0, 0, 5};
    ts_kmeans_opts_t o = {.K = 3, .restarts = 2, .max_iter = 10, .seed = 1};
    ts_kmeans_t km;
    CHECK_OK(ts_kmeans_fit(x, 3, 2, &o, &km, err, sizeof err));
    assert_true(km.inertia == 0.0);
    assert_int_not_equal(km.assignment[0], km.assignment[1]);
    assert_int_not_equal(km.assignment[0], km.assignment[2]);
    assert_int_not_equal(km.assignment[1], km.assignment[2]);
    ts_kmeans_free(&km);
    /* Duplicated points, K > distinct values: no cluster may be empty. */
    float dup[8] = {1, 1, 1, 1, 1, 1, 2, 2};
    o.K = 3;
    CHECK_OK(ts_kmeans_fit(dup, 4, 2, &o, &km, err, sizeof err));
    int seen[3] = {0};
    for (int i = 0; i < 4; i++)
        seen[km.assignment[i]]++;
    for (int j = 0; j < 3; j++)
        assert_true(seen[j] > 0);
    ts_kmeans_free(&km);
    o.K = 1;
    CHECK_OK(ts_kmeans_fit(x, 3, 2, &o, &km, err, sizeof err));
    assert_true(fabsf(km.centroids[0] - 1.0f / 3) < 1e-6f &&
                fabsf(km.centroids[1] - 5.0f / 3) < 1e-6f);
    ts_kmeans_free(&km);
}

/* Uniform points in the square: many local optima, so a different seed shows. n spans many
 * assignment and seeding blocks, so the thread split is exercised. */
static void test_kmeans_determinism(void **state) {
    (void)state;
    const int n = 5000, dims = 3;
    float *x = malloc((size_t)n * dims * sizeof *x);
    assert_non_null(x);
    for (int i = 0; i < n * dims; i++)
        x[i] = ts_rng_uniform_at(77, (uint64_t)i);
    ts_kmeans_opts_t o = {.K = 12, .restarts = 2, .max_iter = 50, .seed = 5, .threads = 1};
    ts_kmeans_t ref, km;
    CHECK_OK(ts_kmeans_fit(x, n, dims, &o, &ref, err, sizeof err));
    int threads[] = {2, 3, 0};
    for (int t = 0; t < 3; t++) {
        o.threads = threads[t];
        CHECK_OK(ts_kmeans_fit(x, n, dims, &o, &km, err, sizeof err));
        assert_memory_equal(km.centroids, ref.centroids, 12 * dims * sizeof(float));
        assert_memory_equal(km.assignment, ref.assignment, n * sizeof(int32_t));
        assert_true(km.inertia == ref.inertia);
        ts_kmeans_free(&km);
    }
    o.seed = 6;
    CHECK_OK(ts_kmeans_fit(x, n, dims, &o, &km, err, sizeof err));
    assert_true(memcmp(km.centroids, ref.centroids, 12 * dims * sizeof(float)) != 0);
    ts_kmeans_free(&km);
    /* More restarts never do worse: the best inertia is kept. */
    o.seed = 5;
    o.restarts = 4;
    CHECK_OK(ts_kmeans_fit(x, n, dims, &o, &km, err, sizeof err));
    assert_true(km.inertia <= ref.inertia);
    ts_kmeans_free(&km);
    ts_kmeans_free(&ref);
    free(x);
}

static void test_kmeans_weighted(void **state) {
    (void)state;
    /* Two points, K = 1: the centroid is the weighted mean. */
    float x[4] = {0, 0, 4, 8};
    double w[2] = {3.0, 1.0};
    ts_kmeans_opts_t o = {.K = 1, .restarts = 1, .max_iter = 5, .seed = 0, .weights = w};
    ts_kmeans_t km;
    CHECK_OK(ts_kmeans_fit(x, 2, 2, &o, &km, err, sizeof err));
    assert_true(km.centroids[0] == 1.0f && km.centroids[1] == 2.0f);
    assert_true(fabs(km.inertia - (3.0 * 5.0 + 1.0 * 45.0)) < 1e-9);
    ts_kmeans_free(&km);
    w[1] = 0.0;
    CHECK_RC(ts_kmeans_fit(x, 2, 2, &o, &km, err, sizeof err), TS_EINVAL);
}

static void test_kmeans_hierarchical(void **state) {
    (void)state;
    float *x = make_blobs(12);
    ts_kmeans_opts_t o = {.K = NB, .restarts = 3, .max_iter = 100, .seed = 9};
    ts_kmeans_t km;
    CHECK_OK(ts_kmeans_hierarchical(x, NB * PER, BD, 40, &o, &km, err, sizeof err));
    assert_int_equal(km.K, NB);
    int64_t count[NB] = {0};
    for (int i = 0; i < NB * PER; i++) {
        assert_true(km.assignment[i] >= 0 && km.assignment[i] < NB);
        count[km.assignment[i]]++;
    }
    for (int j = 0; j < NB; j++)
        assert_true(count[j] > 0);
    assert_recovers_blobs(km.assignment);
    /* Centroids are the means of the points of each coarse cluster. */
    for (int j = 0; j < NB; j++)
        for (int d = 0; d < BD; d++) {
            double s = 0.0;
            for (int i = 0; i < NB * PER; i++)
                if (km.assignment[i] == j)
                    s += x[i * BD + d];
            assert_true(fabs(s / (double)count[j] - km.centroids[j * BD + d]) < 1e-4);
        }
    /* Thread count does not matter here either. */
    ts_kmeans_t km2;
    o.threads = 3;
    CHECK_OK(ts_kmeans_hierarchical(x, NB * PER, BD, 40, &o, &km2, err, sizeof err));
    assert_memory_equal(km.assignment, km2.assignment, NB * PER * sizeof(int32_t));
    assert_memory_equal(km.centroids, km2.centroids, NB * BD * sizeof(float));
    ts_kmeans_free(&km2);
    ts_kmeans_free(&km);
    /* FINE below K or above n is refused. */
    CHECK_RC(ts_kmeans_hierarchical(x, NB * PER, BD, NB - 1, &o, &km, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_kmeans_hierarchical(x, NB * PER, BD, NB * PER + 1, &o, &km, err, sizeof err),
             TS_EINVAL);
    free(x);
}

static void test_kmeans_bad_input(void **state) {
    (void)state;
    float x[4] = {0, 1, 2, 3};
    ts_kmeans_t km;
    ts_kmeans_opts_t o = {.K = 3, .restarts = 1, .max_iter = 5};
    CHECK_RC(ts_kmeans_fit(x, 2, 2, &o, &km, err, sizeof err), TS_EINVAL); /* K > n */
    CHECK_MSG(err, "K = 3");
    o.K = 0;
    CHECK_RC(ts_kmeans_fit(x, 2, 2, &o, &km, err, sizeof err), TS_EINVAL);
    o.K = 1;
    o.restarts = 0;
    CHECK_RC(ts_kmeans_fit(x, 2, 2, &o, &km, err, sizeof err), TS_EINVAL);
    o.restarts = 1;
    x[3] = NAN;
    CHECK_RC(ts_kmeans_fit(x, 2, 2, &o, &km, err, sizeof err), TS_ENONFINITE);
    assert_null(km.centroids);
    assert_null(km.assignment);
}

/* ---- PCA ----------------------------------------------------------------------------------- */

/* Cyclic Jacobi on a symmetric a (D, D): on return the diagonal holds the eigenvalues and column
 * j of v the eigenvector of a[j][j]. */
static void jacobi(double *a, double *v, int D) {
    for (int i = 0; i < D * D; i++)
        v[i] = (i % (D + 1)) == 0 ? 1.0 : 0.0;
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0.0;
        for (int p = 0; p < D; p++)
            for (int q = p + 1; q < D; q++)
                off += a[p * D + q] * a[p * D + q];
        if (off < 1e-30)
            return;
        for (int p = 0; p < D; p++)
            for (int q = p + 1; q < D; q++) {
                double apq = a[p * D + q];
                if (fabs(apq) < 1e-300)
                    continue;
                double theta = (a[q * D + q] - a[p * D + p]) / (2.0 * apq);
                double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
                for (int k = 0; k < D; k++) { /* a ← a·J */
                    double akp = a[k * D + p], akq = a[k * D + q];
                    a[k * D + p] = c * akp - s * akq;
                    a[k * D + q] = s * akp + c * akq;
                }
                for (int k = 0; k < D; k++) { /* a ← Jᵀ·a */
                    double apk = a[p * D + k], aqk = a[q * D + k];
                    a[p * D + k] = c * apk - s * aqk;
                    a[q * D + k] = s * apk + c * aqk;
                }
                for (int k = 0; k < D; k++) {
                    double vkp = v[k * D + p], vkq = v[k * D + q];
                    v[k * D + p] = c * vkp - s * vkq;
                    v[k * D + q] = s * vkp + c * vkq;
                }
            }
    }
}

static void test_pca_reference(void **state) {
    (void)state;
    enum { N = 300, D = 7, K = 4 };
    float *x = make_correlated(N, D, 21);
    /* Reference: covariance in double, written out plainly. */
    double mean[D] = {0}, cov[D * D] = {0}, vec[D * D];
    for (int i = 0; i < N; i++)
        for (int d = 0; d < D; d++)
            mean[d] += x[i * D + d] / (double)N;
    for (int i = 0; i < N; i++)
        for (int a = 0; a < D; a++)
            for (int b = 0; b < D; b++)
                cov[a * D + b] += ((double)x[i * D + a] - mean[a]) *
                                  ((double)x[i * D + b] - mean[b]) / (double)(N - 1);
    double trace = 0.0;
    for (int d = 0; d < D; d++)
        trace += cov[d * D + d];
    jacobi(cov, vec, D);
    int order[D];
    for (int i = 0; i < D; i++)
        order[i] = i;
    for (int i = 0; i < D; i++) /* by decreasing eigenvalue */
        for (int j = i + 1; j < D; j++)
            if (cov[order[j] * D + order[j]] > cov[order[i] * D + order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }

    ts_pca_t pca;
    CHECK_OK(ts_pca_fit(x, N, D, K, 1, &pca, err, sizeof err));
    assert_int_equal(pca.k, K);
    assert_int_equal(pca.D, D);
    assert_true(fabs(pca.total_variance - trace) < 1e-9 * trace);
    double kept = 0.0;
    for (int r = 0; r < K; r++) {
        double want = cov[order[r] * D + order[r]];
        assert_true(fabs(pca.eigenvalues[r] - want) < 1e-9 * want);
        if (r > 0)
            assert_true(pca.eigenvalues[r] < pca.eigenvalues[r - 1]);
        kept += want;
        double dot = 0.0, norm = 0.0, big = 0.0;
        int arg = 0;
        for (int d = 0; d < D; d++) {
            double b = pca.basis[r * D + d];
            dot += b * vec[d * D + order[r]];
            norm += b * b;
            if (fabs(b) > big) {
                big = fabs(b);
                arg = d;
            }
        }
        assert_true(fabs(norm - 1.0) < 1e-6);
        assert_true(fabs(fabs(dot) - 1.0) < 1e-6);  /* |cos| ≈ 1 */
        assert_true(pca.basis[r * D + arg] > 0.0f); /* the sign convention */
        for (int s = 0; s < r; s++) {               /* orthogonal rows */
            double o = 0.0;
            for (int d = 0; d < D; d++)
                o += (double)pca.basis[r * D + d] * pca.basis[s * D + d];
            assert_true(fabs(o) < 1e-6);
        }
    }
    assert_true(fabs(pca.explained - kept / trace) < 1e-9);
    for (int d = 0; d < D; d++)
        assert_true(fabs(pca.mean[d] - mean[d]) < 1e-5 * (1.0 + fabs(mean[d])));

    /* Bit-identical for any thread count (n spans several covariance blocks here). */
    float *big = make_correlated(5000, D, 22);
    ts_pca_t p1, p3;
    CHECK_OK(ts_pca_fit(big, 5000, D, K, 1, &p1, err, sizeof err));
    CHECK_OK(ts_pca_fit(big, 5000, D, K, 3, &p3, err, sizeof err));
    assert_memory_equal(p1.basis, p3.basis, K * D * sizeof(float));
    assert_memory_equal(p1.eigenvalues, p3.eigenvalues, K * sizeof(double));
    float e1[5000 * K], e3[5000 * K];
    CHECK_OK(ts_pca_project(p1.basis, p1.mean, big, 5000, D, K, e1, 1));
    CHECK_OK(ts_pca_project(p1.basis, p1.mean, big, 5000, D, K, e3, 3));
    assert_memory_equal(e1, e3, sizeof e1);
    ts_pca_free(&p1);
    ts_pca_free(&p3);
    free(big);
    ts_pca_free(&pca);
    free(x);
}

/* A diagonal covariance has the axes as eigenvectors: the closed form. Points ±s_d on each axis
 * in turn (symmetric, so the mean is 0 and the covariance exactly diagonal). */
static void test_pca_diagonal(void **state) {
    (void)state;
    enum { D = 5 };
    const float s[D] = {1.0f, 4.0f, 2.0f, 5.0f, 3.0f};
    float x[2 * D * D] = {0};
    for (int d = 0; d < D; d++) {
        x[(2 * d) * D + d] = s[d];
        x[(2 * d + 1) * D + d] = -s[d];
    }
    ts_pca_t pca;
    CHECK_OK(ts_pca_fit(x, 2 * D, D, D, 0, &pca, err, sizeof err));
    const int axis[D] = {3, 1, 4, 2, 0}; /* by decreasing s */
    for (int r = 0; r < D; r++) {
        double want = 2.0 * s[axis[r]] * s[axis[r]] / (2 * D - 1);
        assert_true(fabs(pca.eigenvalues[r] - want) < 1e-12 * want);
        for (int d = 0; d < D; d++)
            assert_true(fabsf(pca.basis[r * D + d] - (d == axis[r] ? 1.0f : 0.0f)) < 1e-7f);
    }
    assert_true(fabs(pca.explained - 1.0) < 1e-12);
    ts_pca_free(&pca);
}

static double reconstruction_error(const float *x, int n, int D, int k) {
    ts_pca_t pca;
    CHECK_OK(ts_pca_fit(x, n, D, k, 0, &pca, err, sizeof err));
    float *e = malloc((size_t)n * k * sizeof *e);
    assert_non_null(e);
    CHECK_OK(ts_pca_project(pca.basis, pca.mean, x, n, D, k, e, 0));
    double total = 0.0;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++) {
            double r = pca.mean[d];
            for (int j = 0; j < k; j++)
                r += (double)e[i * k + j] * pca.basis[j * D + d];
            total += (r - x[i * D + d]) * (r - x[i * D + d]);
        }
    free(e);
    ts_pca_free(&pca);
    return total / n;
}

static void test_pca_reconstruction(void **state) {
    (void)state;
    enum { N = 400, D = 10 };
    float *x = make_correlated(N, D, 31);
    double prev = INFINITY;
    for (int k = 1; k <= D; k++) {
        double r = reconstruction_error(x, N, D, k);
        assert_true(r < prev);
        prev = r;
    }
    assert_true(prev < 1e-6); /* k = D: the basis spans everything */
    free(x);
}

static void test_pca_bad_input(void **state) {
    (void)state;
    float x[6] = {1, 2, 3, 4, 5, 6};
    ts_pca_t pca;
    CHECK_RC(ts_pca_fit(x, 1, 6, 1, 0, &pca, err, sizeof err), TS_EINVAL); /* n < 2 */
    CHECK_RC(ts_pca_fit(x, 2, 3, 4, 0, &pca, err, sizeof err), TS_EINVAL); /* k > D */
    CHECK_RC(ts_pca_fit(x, 2, 3, 0, 0, &pca, err, sizeof err), TS_EINVAL);
    x[4] = INFINITY;
    CHECK_RC(ts_pca_fit(x, 2, 3, 2, 0, &pca, err, sizeof err), TS_ENONFINITE);
    assert_null(pca.basis);
    float out[2];
    CHECK_RC(ts_pca_project(x, x, x, 2, 3, 4, out, 0), TS_EINVAL);
}

/* ---- the artifact ------------------------------------------------------------------------------ */

#define AN 600 /* images */
#define AD 16  /* pixels */
#define AK 4   /* clusters */
#define AE 3   /* embedding dims */

/* AK blobs in AD dims (point i in blob i % AK) whose centres differ along a few pixels. */
static float *make_images(void) {
    float *x = malloc(AN * AD * sizeof *x);
    assert_non_null(x);
    for (int i = 0; i < AN; i++)
        for (int d = 0; d < AD; d++)
            x[i * AD + d] = (d % AK == i % AK ? 0.8f : -0.5f) +
                            0.1f * ts_rng_normal_at(41, (uint64_t)(i * AD + d));
    return x;
}

static void fit_images(const float *x, int threads, int hierarchical, ts_partition_t *p) {
    ts_partition_opts_t o = {.experts = AK,
                             .dims = AE,
                             .restarts = 3,
                             .seed = 7,
                             .threads = threads,
                             .hierarchical = hierarchical,
                             .dataset = "synthetic"};
    CHECK_OK(ts_partition_fit(x, AN, AD, &o, p, err, sizeof err));
}

static void test_artifact_roundtrip(void **state) {
    (void)state;
    float *x = make_images();
    ts_partition_t p, q, r;
    fit_images(x, 1, 0, &p);
    assert_string_equal(p.id, "");
    assert_string_equal(p.embed, "pca3");
    int sum = 0;
    for (int j = 0; j < AK; j++) {
        assert_true(p.sizes[j] > 0);
        sum += p.sizes[j];
    }
    assert_int_equal(sum, AN);
    for (int i = 0; i < AN; i++) /* the blobs are recovered: same blob, same cluster */
        assert_int_equal(p.assignment[i], p.assignment[i % AK]);
    CHECK_OK(ts_partition_save(&p, in_dir("a.safetensors"), err, sizeof err));
    assert_int_equal(strlen(p.id), 64);
    for (int i = 0; i < 64; i++)
        assert_non_null(strchr("0123456789abcdef", p.id[i]));
    char fid[TS_PARTITION_ID_HEX];
    CHECK_OK(ts_file_blake2b(in_dir("a.safetensors"), fid, err, sizeof err));
    assert_string_equal(fid, p.id);

    CHECK_OK(ts_partition_load(in_dir("a.safetensors"), &q, err, sizeof err));
    assert_string_equal(q.id, p.id);
    assert_int_equal(q.K, AK);
    assert_int_equal(q.k, AE);
    assert_int_equal(q.D, AD);
    assert_int_equal(q.n, AN);
    assert_true(q.seed == 7);
    assert_int_equal(q.restarts, 3);
    assert_int_equal(q.hierarchical, 0);
    assert_true(q.inertia == p.inertia);
    assert_true(q.explained == p.explained);
    assert_string_equal(q.embed, "pca3");
    assert_string_equal(q.dataset, "synthetic");
    assert_memory_equal(q.basis, p.basis, AE * AD * sizeof(float));
    assert_memory_equal(q.mean, p.mean, AD * sizeof(float));
    assert_memory_equal(q.centroids, p.centroids, AK * AE * sizeof(float));
    assert_memory_equal(q.assignment, p.assignment, AN * sizeof(int32_t));
    assert_memory_equal(q.sizes, p.sizes, AK * sizeof(int32_t));

    /* The same data and seed with another thread count: the same bytes, the same id. */
    fit_images(x, 3, 0, &r);
    CHECK_OK(ts_partition_save(&r, in_dir("b.safetensors"), err, sizeof err));
    assert_string_equal(r.id, p.id);
    ts_partition_free(&r);

    /* embed: a batch gives the same bits as row by row; the images' nearest centroid is their
     * cluster (well-separated blobs); a centroid's nearest is itself at distance 0. */
    float e[AN * AE], one[AE];
    CHECK_OK(ts_partition_embed(&q, x, AN, e));
    for (int i = 0; i < AN; i += 37) {
        CHECK_OK(ts_partition_embed(&q, x + i * AD, 1, one));
        assert_memory_equal(one, e + i * AE, sizeof one);
    }
    int32_t nearest[AN];
    float d2[AN * AK];
    CHECK_OK(ts_partition_nearest(&q, e, AN, nearest, d2));
    for (int i = 0; i < AN; i++) {
        assert_int_equal(nearest[i], q.assignment[i]);
        for (int j = 0; j < AK; j++)
            assert_true(d2[i * AK + j] >= d2[i * AK + nearest[i]]);
    }
    CHECK_OK(ts_partition_nearest(&q, q.centroids, AK, nearest, d2));
    for (int j = 0; j < AK; j++) {
        assert_int_equal(nearest[j], j);
        assert_true(d2[j * AK + j] == 0.0f);
    }
    CHECK_OK(ts_partition_nearest(&q, e, 3, nearest, NULL));
    /* members: each cluster's images in increasing order, every image once */
    int seen = 0;
    for (int j = 0; j < AK; j++) {
        int32_t *idx = NULL;
        int m = 0;
        CHECK_OK(ts_partition_members(&q, j, &idx, &m));
        assert_int_equal(m, q.sizes[j]);
        for (int i = 0; i < m; i++) {
            assert_int_equal(q.assignment[idx[i]], j);
            assert_true(i == 0 || idx[i] > idx[i - 1]);
        }
        seen += m;
        free(idx);
    }
    assert_int_equal(seen, AN);
    int32_t *none = NULL;
    int nn = 0;
    assert_int_equal(ts_partition_members(&q, AK, &none, &nn), TS_EINVAL);
    assert_int_equal(ts_partition_members(&q, -1, &none, &nn), TS_EINVAL);
    ts_partition_free(&q);
    ts_partition_free(&p);
    free(x);
}

static void test_artifact_hierarchical(void **state) {
    (void)state;
    float *x = make_images();
    ts_partition_t p, q;
    fit_images(x, 0, 24, &p);
    int sum = 0;
    for (int j = 0; j < AK; j++) {
        assert_true(p.sizes[j] > 0);
        sum += p.sizes[j];
    }
    assert_int_equal(sum, AN);
    CHECK_OK(ts_partition_save(&p, in_dir("h.safetensors"), err, sizeof err));
    CHECK_OK(ts_partition_load(in_dir("h.safetensors"), &q, err, sizeof err));
    assert_int_equal(q.hierarchical, 24);
    ts_partition_free(&q);
    ts_partition_free(&p);
    free(x);
}

/* Writes a partition-like file from p with one thing changed. */
typedef enum {
    T_NONE,
    T_ASSIGN_RANGE,
    T_ASSIGN_NEG,
    T_SIZES,
    T_SHAPE_CENT,
    T_SHAPE_MEAN,
    T_DTYPE,
    T_FORMAT,
    T_EXTRA,
    T_META_EXPERTS,
    T_MISSING,
    T_NAN,
} tamper_t;

static void write_tampered(const ts_partition_t *p, tamper_t t, const char *path) {
    int32_t *assign = malloc(AN * sizeof *assign);
    int32_t sizes[AK];
    float cent[AK * (AE + 1)] = {0};
    float mean[AD + 1] = {0};
    assert_non_null(assign);
    memcpy(assign, p->assignment, AN * sizeof *assign);
    memcpy(sizes, p->sizes, sizeof sizes);
    memcpy(cent, p->centroids, AK * AE * sizeof(float));
    memcpy(mean, p->mean, AD * sizeof(float));
    if (t == T_ASSIGN_RANGE)
        assign[5] = AK; /* sizes left alone: the range check must fire first */
    if (t == T_ASSIGN_NEG)
        assign[5] = -1;
    if (t == T_SIZES) {
        sizes[0]++;
        sizes[1]--;
    }
    if (t == T_NAN)
        mean[3] = NAN;
    ts_st_entry_t e[6] = {
        {"basis", TS_ST_F32, 2, {AE, AD}, p->basis},
        {"mean", TS_ST_F32, 1, {t == T_SHAPE_MEAN ? AD + 1 : AD}, mean},
        {"centroids", TS_ST_F32, 2, {AK, t == T_SHAPE_CENT ? AE + 1 : AE}, cent},
        {"assignment", t == T_DTYPE ? TS_ST_F32 : TS_ST_I32, 1, {AN}, assign},
        {"sizes", TS_ST_I32, 1, {AK}, sizes},
        {"extra", TS_ST_I32, 1, {1}, sizes},
    };
    const char *meta[] = {"format",
                          t == T_FORMAT ? "tessera-dit/1" : TS_PARTITION_FORMAT,
                          "embed",
                          "pca3",
                          "experts",
                          t == T_META_EXPERTS ? "5" : "4",
                          "dims",
                          "3",
                          "seed",
                          "7",
                          "restarts",
                          "3",
                          "inertia",
                          "1.5",
                          "explained_variance",
                          "0.9",
                          "dataset",
                          "synthetic",
                          "n",
                          "600",
                          "hierarchical",
                          "0"};
    int n = t == T_EXTRA ? 6 : t == T_MISSING ? 4 : 5;
    CHECK_OK(ts_st_write(path, e, n, meta, 11, err, sizeof err));
    free(assign);
}

static void test_artifact_tampered(void **state) {
    (void)state;
    float *x = make_images();
    ts_partition_t p, q;
    fit_images(x, 0, 0, &p);
    const struct {
        tamper_t t;
        const char *needle;
    } cases[] = {
        {T_ASSIGN_RANGE, "assignment[5] = 4"},
        {T_ASSIGN_NEG, "assignment[5] = -1"},
        {T_SIZES, "sizes[0]"},
        {T_SHAPE_CENT, "inconsistent shapes"},
        {T_SHAPE_MEAN, "inconsistent shapes"},
        {T_DTYPE, "'assignment' must be I32"},
        {T_FORMAT, "not a partition"},
        {T_EXTRA, "unexpected tensor 'extra'"},
        {T_META_EXPERTS, "metadata experts = 5"},
        {T_MISSING, "'sizes' is missing"},
        {T_NAN, "NaN"},
    };
    /* The untampered rewrite loads (so each case below fails for its own reason). */
    write_tampered(&p, T_NONE, in_dir("ok.safetensors"));
    CHECK_OK(ts_partition_load(in_dir("ok.safetensors"), &q, err, sizeof err));
    ts_partition_free(&q);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_tampered(&p, cases[c].t, in_dir("bad.safetensors"));
        err[0] = '\0';
        CHECK_RC(ts_partition_load(in_dir("bad.safetensors"), &q, err, sizeof err), TS_ECORRUPT);
        CHECK_MSG(err, cases[c].needle);
        CHECK_MSG(err, "bad.safetensors");
        assert_null(q.basis);
        assert_null(q.assignment);
    }
    /* Not a safetensors file at all; a missing file. */
    FILE *f = fopen(in_dir("junk"), "wb");
    assert_non_null(f);
    fputs("hello", f);
    fclose(f);
    CHECK_RC(ts_partition_load(in_dir("junk"), &q, err, sizeof err), TS_ECORRUPT);
    assert_int_not_equal(ts_partition_load(in_dir("nope"), &q, err, sizeof err), TS_OK);
    ts_partition_free(&p);
    free(x);
}

/* Given clusters (--by label / random) and k-means on another space (--features): the assignment
 * is kept or found there, the centroids are the clusters' means in the PCA embedding (against a
 * naive mean of ts_pca_project's rows), the strategy survives save and load, and a default
 * partition writes no strategy key (so its bytes, and id, are what they were). */
static void test_artifact_strategies(void **state) {
    (void)state;
    float *x = make_images();
    int32_t given[AN];
    for (int i = 0; i < AN; i++)
        given[i] = (i / 7) % AK; /* unrelated to the blobs */
    ts_partition_opts_t o = {.experts = AK,
                             .dims = AE,
                             .restarts = 3,
                             .seed = 7,
                             .threads = 1,
                             .dataset = "synthetic",
                             .assign = given,
                             .strategy = "random"};
    ts_partition_t p, q;
    CHECK_OK(ts_partition_fit(x, AN, AD, &o, &p, err, sizeof err));
    assert_memory_equal(p.assignment, given, sizeof given);
    assert_string_equal(p.strategy, "random");
    float e[AN * AE];
    CHECK_OK(ts_pca_project(p.basis, p.mean, x, AN, AD, AE, e, 1));
    for (int k = 0; k < AK; k++) {
        double sum[AE] = {0};
        int cnt = 0;
        for (int i = 0; i < AN; i++)
            if (given[i] == k) {
                cnt++;
                for (int j = 0; j < AE; j++)
                    sum[j] += e[i * AE + j];
            }
        assert_int_equal(p.sizes[k], cnt);
        for (int j = 0; j < AE; j++)
            assert_float_equal(p.centroids[k * AE + j], sum[j] / cnt, 1e-5);
    }
    CHECK_OK(ts_partition_save(&p, in_dir("s.safetensors"), err, sizeof err));
    CHECK_OK(ts_partition_load(in_dir("s.safetensors"), &q, err, sizeof err));
    assert_string_equal(q.strategy, "random");
    assert_memory_equal(q.assignment, given, sizeof given);
    ts_partition_free(&q);
    ts_partition_free(&p);
    /* an empty given cluster, a cluster out of range */
    given[0] = AK;
    CHECK_RC(ts_partition_fit(x, AN, AD, &o, &p, err, sizeof err), TS_EINVAL);
    for (int i = 0; i < AN; i++)
        given[i] = i % (AK - 1);
    CHECK_RC(ts_partition_fit(x, AN, AD, &o, &p, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "empty"));
    /* k-means on another space: blobs there by (i / 3) % AK, not by the images' i % AK */
    float space[AN * 2];
    for (int i = 0; i < AN; i++) {
        int b = (i / 3) % AK;
        space[i * 2] = 30.0f * (float)b + 0.1f * ts_rng_normal_at(5, (uint64_t)i);
        space[i * 2 + 1] = 0.1f * ts_rng_normal_at(6, (uint64_t)i);
    }
    ts_partition_opts_t f = {.experts = AK,
                             .dims = AE,
                             .restarts = 3,
                             .seed = 7,
                             .threads = 1,
                             .dataset = "synthetic",
                             .space = space,
                             .space_dims = 2,
                             .strategy = "features"};
    CHECK_OK(ts_partition_fit(x, AN, AD, &f, &p, err, sizeof err));
    for (int i = 0; i < AN; i++)
        assert_int_equal(p.assignment[i], p.assignment[((i / 3) % AK) * 3]);
    assert_string_equal(p.strategy, "features");
    ts_partition_free(&p);
    /* the default: strategy "kmeans" in memory, no key in the file */
    fit_images(x, 1, 0, &p);
    assert_string_equal(p.strategy, "kmeans");
    CHECK_OK(ts_partition_save(&p, in_dir("d.safetensors"), err, sizeof err));
    FILE *fp = fopen(in_dir("d.safetensors"), "rb");
    assert_non_null(fp);
    static char bytes[1 << 16];
    size_t len = fread(bytes, 1, sizeof bytes, fp);
    fclose(fp);
    assert_true(len > 0 && len < sizeof bytes);
    for (size_t i = 0; i + 8 <= len; i++)
        assert_false(memcmp(bytes + i, "strategy", 8) == 0);
    CHECK_OK(ts_partition_load(in_dir("d.safetensors"), &q, err, sizeof err));
    assert_string_equal(q.strategy, "kmeans");
    ts_partition_free(&q);
    ts_partition_free(&p);
    free(x);
}

static void test_partition_bad_options(void **state) {
    (void)state;
    float *x = make_images();
    ts_partition_t p;
    ts_partition_opts_t o = {.experts = AN + 1, .dims = AE};
    CHECK_RC(ts_partition_fit(x, AN, AD, &o, &p, err, sizeof err), TS_EINVAL);
    CHECK_MSG(err, "experts K = 601");
    o.experts = 0;
    CHECK_RC(ts_partition_fit(x, AN, AD, &o, &p, err, sizeof err), TS_EINVAL);
    o.experts = AK;
    o.dims = AD + 1;
    CHECK_RC(ts_partition_fit(x, AN, AD, &o, &p, err, sizeof err), TS_EINVAL);
    o.dims = AE;
    o.hierarchical = AK - 1;
    CHECK_RC(ts_partition_fit(x, AN, AD, &o, &p, err, sizeof err), TS_EINVAL);
    assert_null(p.basis);
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kmeans_blobs),
        cmocka_unit_test(test_kmeans_k_equals_n_and_one),
        cmocka_unit_test(test_kmeans_determinism),
        cmocka_unit_test(test_kmeans_weighted),
        cmocka_unit_test(test_kmeans_hierarchical),
        cmocka_unit_test(test_kmeans_bad_input),
        cmocka_unit_test(test_pca_reference),
        cmocka_unit_test(test_pca_diagonal),
        cmocka_unit_test(test_pca_reconstruction),
        cmocka_unit_test(test_pca_bad_input),
        cmocka_unit_test_setup_teardown(test_artifact_roundtrip, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_artifact_hierarchical, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_artifact_tampered, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_artifact_strategies, setup_dir, teardown_dir),
        cmocka_unit_test(test_partition_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
