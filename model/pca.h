/*
 * pca.h — principal components of a set of images: the basis of a partition's embedding
 * (model/partition.h).
 *
 * Numerics:
 *   - The covariance (D×D, divided by n − 1) is accumulated in double: rows are centred in
 *     double, in chunks of 512, and added with cblas_dsyrk into one partial matrix per fixed
 *     block of rows; the partials are summed in block order. LAPACKE_dsyevd (double) gives the
 *     eigenvectors; the top k are kept in decreasing eigenvalue order, each with its
 *     largest-magnitude component made positive (the lowest index wins a tie), and stored as F32.
 *   - Projection: e_j = Σ_d (x_d − mean_d)·basis_{j,d}, accumulated in double in increasing d,
 *     row by row — the embedding of an image is the same bits whether it is projected alone or in
 *     a batch, at training time or at routing time.
 * Threads: the loops run over blocks fixed by the problem size (model/par.h), so every result is
 * bit-identical for any thread count; BLAS runs single-threaded (ts_pca_fit sets OpenBLAS to one
 * thread, process-wide, as ts_engine_init does).
 *
 * `err`/`errlen`: where a function takes them, a failure writes one NUL-terminated sentence there.
 */
#ifndef TS_PCA_H
#define TS_PCA_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_pca {
    int D, k;
    float *basis;          /* (k, D), rows orthonormal, by decreasing eigenvalue */
    float *mean;           /* (D) */
    double *eigenvalues;   /* (k), the variances along the basis rows, decreasing */
    double total_variance; /* trace of the covariance: Σ of all D eigenvalues */
    double explained;      /* Σ eigenvalues / total_variance, in [0, 1] (0 when total is 0) */
} ts_pca_t;

/* Fits PCA to x (n, D): the mean and the top k eigenvectors of the covariance (see Numerics).
 * n ≥ 2, 1 ≤ k ≤ D, threads ≥ 0 (0 = one per online core; the result does not depend on it).
 * On success *pca owns its buffers (ts_pca_free); on failure it is zeroed. Errors: TS_EINVAL,
 * TS_ENONFINITE (x holds NaN or Inf), TS_ENOMEM, TS_ECORRUPT (the eigensolver failed). */
int ts_pca_fit(const float *x, int64_t n, int D, int k, int threads, ts_pca_t *pca, char *err,
               size_t errlen);
void ts_pca_free(ts_pca_t *pca);

/* out (n, k) = (x (n, D) − mean (D)) · basis (k, D)ᵀ, row by row in double (see Numerics).
 * threads as above. Errors: TS_EINVAL, TS_ENOMEM. */
int ts_pca_project(const float *basis, const float *mean, const float *x, int64_t n, int D, int k,
                   float *out, int threads);

#ifdef __cplusplus
}
#endif

#endif
