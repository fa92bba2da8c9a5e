/*
 * metrics.h — the numbers `tessera eval` reports (architecture.md §10): the Fréchet distance
 * between two sets of features, and the class coverage of a set of predictions.
 *
 * Fréchet distance (FD). Each set of features (n rows of d floats, e.g. the evaluation
 * classifier's penultimate layer) is summarised by a Gaussian N(μ, Σ) fitted to it; the FD of two
 * sets is the squared 2-Wasserstein distance between their Gaussians:
 *
 *     FD = ‖μ1 − μ2‖² + Tr(Σ1 + Σ2 − 2 (Σ1^½ Σ2 Σ1^½)^½)
 *
 * (the FID of the literature when the features are Inception's; ours are the project's own
 * classifier's, so our numbers are comparable with each other, not with published FIDs).
 *
 * Numerics:
 *   - ts_gauss_fit accumulates in double: the mean over fixed blocks of TS_METRICS_BLOCK rows
 *     (each block summed in row order, the block sums added in block order), then the centred
 *     outer products the same way, divided by n − 1. Nothing depends on a thread count (it runs
 *     on the calling thread), so a fit is the same bits on every run.
 *   - ts_frechet_distance takes matrix square roots by symmetric eigendecomposition
 *     (LAPACKE_dsyevd, double); see metrics.c for why the symmetric form is used and why tiny
 *     negative eigenvalues are clamped to 0.
 *
 * Class coverage: the histogram of the classes the evaluation classifier predicts for generated
 * samples, and its entropy in bits — log2 K when every class is produced equally often, 0 when
 * the model produces one class only (mode collapse).
 *
 * What it is not: the classifier (model/classifier.h) or the `eval` command; this module sees
 * only arrays of numbers.
 *
 * `err`/`errlen`: where a function takes them, a failure writes one NUL-terminated sentence there
 * (err may be NULL or errlen 0 to not get one).
 */
#ifndef TS_METRICS_H
#define TS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_METRICS_BLOCK 256    /* rows per accumulation block of ts_gauss_fit */
#define TS_METRICS_MAX_DIM 4096 /* bound on the feature dimension d */

/* Fits a Gaussian to feat (n, d): mean (d) and the unbiased covariance cov (d, d), row-major,
 * both triangles filled (exactly symmetric). The caller owns mean and cov. Errors: TS_EINVAL
 * (NULL, n < 2, d < 1 or d > TS_METRICS_MAX_DIM), TS_ENONFINITE (a NaN or Inf in feat), TS_ENOMEM
 * (the block partials). */
int ts_gauss_fit(const float *feat, int64_t n, int d, double *mean, double *cov, char *err,
                 size_t errlen);

/* *fd = ‖μ1 − μ2‖² + Tr(Σ1 + Σ2 − 2 (Σ1^½ Σ2 Σ1^½)^½) for the Gaussians (mu1 (d), cov1 (d, d))
 * and (mu2, cov2). The covariances must be symmetric positive semi-definite (as ts_gauss_fit
 * makes them; only their upper triangles are read). The result is clamped at 0 (rounding can
 * leave −1e-15-sized values for two equal Gaussians). Errors: TS_EINVAL (NULL, d out of range),
 * TS_ENONFINITE (a NaN or Inf in the inputs), TS_ERANGE (the eigensolver did not converge),
 * TS_ENOMEM. */
int ts_frechet_distance(const double *mu1, const double *cov1, const double *mu2,
                        const double *cov2, int d, double *fd, char *err, size_t errlen);

/* ts_gauss_fit of feat1 (n1, d) and feat2 (n2, d), then ts_frechet_distance of the two fits.
 * Errors: those of the two. */
int ts_fd_from_features(const float *feat1, int64_t n1, const float *feat2, int64_t n2, int d,
                        double *fd, char *err, size_t errlen);

/* pred[i] = the index of the largest of logits row i (logits is (n, K)); the lowest index wins a
 * tie, NaNs never win (a row of NaNs gives 0). n ≥ 0, K ≥ 1. */
void ts_argmax_rows(const float *logits, int64_t n, int K, int32_t *pred);

/* hist[k] = the fraction of pred (n) equal to k, for k in [0, K) (hist sums to 1), and
 * *entropy_bits = −Σ hist[k] · log2 hist[k] (0 · log 0 = 0), in [0, log2 K]. hist may be NULL if
 * only the entropy is wanted. Errors: TS_EINVAL (NULL pred or entropy_bits, n < 1, K < 1, a pred
 * outside [0, K)), TS_ENOMEM. */
int ts_class_coverage(const int32_t *pred, int64_t n, int K, double *entropy_bits, double *hist,
                      char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
