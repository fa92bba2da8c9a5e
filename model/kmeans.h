/*
 * kmeans.h — k-means++ with Lloyd's iterations and restarts, and DDM's hierarchical variant: the
 * clusters of a partition (model/partition.h). Squared Euclidean distance only.
 *
 * Numerics: points are held in double; the assignment step takes, for fixed blocks of 256
 * points, the cross term with cblas_dgemm (argmin of ‖c‖² − 2x·c, lowest index on a tie);
 * inertia and the centroid means are accumulated in double in point order.
 * Threads: the loops run over blocks fixed by the problem size (model/par.h), so every result is
 * bit-identical for any thread count; BLAS runs single-threaded (ts_kmeans_fit sets OpenBLAS to
 * one thread, process-wide, as ts_engine_init does).
 * Randomness: k-means++ draws from the Philox stream of kernels/math.h under the seed: draw j of
 * restart r of stage s is block (s << 48 | r << 32 | j) of ts_rng_block(seed, ·), two words
 * making a 53-bit uniform. The same seed gives the same clusters.
 *
 * `err`/`errlen`: where a function takes them, a failure writes one NUL-terminated sentence there.
 */
#ifndef TS_KMEANS_H
#define TS_KMEANS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called after each restart: stage 0 (plain, or the fine stage of the hierarchical variant) or
 * 1 (the coarse stage), restart index, its inertia and Lloyd iterations. */
typedef void (*ts_kmeans_progress_fn)(void *ctx, int stage, int restart, int restarts,
                                      double inertia, int iters);

typedef struct ts_kmeans_opts {
    int K;        /* clusters, 1 ≤ K ≤ n */
    int restarts; /* ≥ 1: k-means++ seedings; the lowest inertia wins (earliest on a tie) */
    int max_iter; /* ≥ 1: Lloyd iterations per restart at most */
    uint64_t seed;
    int threads;                    /* 0 = one per online core; the result does not depend on it */
    const double *weights;          /* (n) point weights > 0, or NULL for all ones */
    ts_kmeans_progress_fn progress; /* may be NULL */
    void *ctx;
} ts_kmeans_opts_t;

typedef struct ts_kmeans {
    int K, dims;
    int64_t n;
    float *centroids;    /* (K, dims): the (weighted) mean of each cluster's points */
    int32_t *assignment; /* (n), each in [0, K); every cluster has at least one point */
    double inertia;      /* Σ weight·‖x − centroid‖² over the points */
    int best_restart, iters;
} ts_kmeans_t;

/* Clusters x (n, dims): per restart, k-means++ seeding (D² sampling, weighted by the point
 * weights) then Lloyd iterations until no assignment changes or max_iter; a cluster left empty
 * is re-seeded with the point farthest from its centroid among clusters of two or more points
 * (lowest index on a tie). On success *km owns its buffers (ts_kmeans_free); on failure it is
 * zeroed. Errors: TS_EINVAL (sizes, options, a weight ≤ 0), TS_ENONFINITE, TS_ENOMEM. */
int ts_kmeans_fit(const float *x, int64_t n, int dims, const ts_kmeans_opts_t *o, ts_kmeans_t *km,
                  char *err, size_t errlen);

/* DDM's hierarchical variant: `fine` clusters by ts_kmeans_fit (o->K ≤ fine ≤ n), then the fine
 * centroids clustered into o->K by k-means weighted by the fine clusters' sizes (stage 1, its
 * own Philox stream); every point takes its fine cluster's coarse label. The centroids returned
 * are the means of the points of each coarse cluster and the inertia is over the points.
 * o->weights must be NULL. Same ownership and errors as ts_kmeans_fit. */
int ts_kmeans_hierarchical(const float *x, int64_t n, int dims, int fine, const ts_kmeans_opts_t *o,
                           ts_kmeans_t *km, char *err, size_t errlen);
void ts_kmeans_free(ts_kmeans_t *km);

#ifdef __cplusplus
}
#endif

#endif
