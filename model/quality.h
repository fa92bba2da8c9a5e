/*
 * quality.h — the statistics `tessera eval` reports beside the Fréchet distance (model/metrics.h):
 * bootstrap intervals, precision and recall in a feature space, and the Inception Score of a
 * classifier's predictions.
 *
 * Bootstrap. A resample of n items draws n indices uniformly with replacement; resample b of a
 * seed is a pure function of (seed, b, n): index i is ⌊w · n / 2³²⌋ for the Philox word i of the
 * stream ts_stream_key(seed, b) (model/trainer.h), so every run and every machine resamples the
 * same rows. `tessera eval` resamples the generated samples only (the reference set is the fixed
 * definition of the target), and uses the same resamples for every entry, so that entries, which
 * share sample i's noise and label, can be compared pairwise (the interval of a difference).
 *
 * Precision and recall (Kynkäänniemi et al., "Improved Precision and Recall Metric for Assessing
 * Generative Models", NeurIPS 2019): each set's manifold is the union of balls around its points,
 * a point's radius being the distance to its k-th nearest neighbour in its own set (itself not
 * counted). Precision is the share of generated points inside the real manifold (are the samples
 * realistic?), recall the share of real points inside the generated manifold (is every mode
 * covered? a generator that drops a mode loses recall, whatever its FD). Distances are Euclidean,
 * computed in double as ‖a‖² + ‖b‖² − 2 a·b with cblas_dgemm over blocks of rows; a point is
 * inside a ball when its squared distance is ≤ the squared radius.
 *
 * Inception Score, in the evaluation classifier's space: IS = exp(E_x KL(p(y|x) ‖ p(y))), with
 * p(y|x) the softmax of the classifier's logits and p(y) their mean over the set. 1 when every
 * prediction is the same distribution; K (the number of classes) when every prediction is certain
 * and the classes are equally frequent. Computed in double.
 *
 * Calibration of a classifier's probabilities (a router's p(k | x_t), which the class prior
 * multiplies as if it were calibrated): the mean negative log-likelihood of the true labels and
 * the expected calibration error (top label, B equal-width confidence bins: Σ_b |b|/n ·
 * |accuracy_b − mean confidence_b|) of softmax(logits / T), and temperature scaling (Guo et al.,
 * "On Calibration of Modern Neural Networks", ICML 2017): the one T > 0 minimising the NLL. The
 * NLL is convex in β = 1/T (a log-sum-exp minus a linear term), so a golden-section search over β
 * finds it. Computed in double.
 *
 * What it is not: a feature extractor (model/classifier.h) or the FD itself (model/metrics.h).
 *
 * `err`/`errlen`: where a function takes them, a failure writes one NUL-terminated sentence there.
 */
#ifndef TS_QUALITY_H
#define TS_QUALITY_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* idx (n) = resample b of n items under seed (see above). n ≥ 1. */
void ts_bootstrap_indices(uint64_t seed, int64_t b, int64_t n, int32_t *idx);

/* The 95 % interval from B resampled values of a statistic whose estimate is est: the 2.5 and
 * 97.5 percentiles shifted by the bootstrap bias (mean − est), which *bias receives (may be
 * NULL). NaN bounds when B < 2, a value is not finite, or memory runs out. */
void ts_bootstrap_interval(const double *boot, int B, double est, double *lo, double *hi,
                           double *bias);

/* The q-quantile (q in [0, 1]) of x (n ≥ 1) by linear interpolation between the order statistics
 * (x sorted; position q·(n − 1)). Sorts x in place. NaNs are not allowed. */
double ts_quantile(double *x, int64_t n, double q);

/* *fd = the Fréchet distance between the Gaussian fitted to the rows idx[0..m) of feat (·, d)
 * (repeats allowed) and the reference (mu_ref, cov_ref). Errors: those of ts_gauss_fit and
 * ts_frechet_distance, TS_ENOMEM. */
int ts_fd_rows(const float *feat, const int32_t *idx, int64_t m, int d, const double *mu_ref,
               const double *cov_ref, double *fd, char *err, size_t errlen);

/* Precision and recall of fake (nf, d) against real (nr, d) with k-th-nearest-neighbour radii
 * (see above). Needs nr > k, nf > k, k ≥ 1. Errors: TS_EINVAL, TS_ENONFINITE, TS_ENOMEM. */
int ts_precision_recall(const float *real, int64_t nr, const float *fake, int64_t nf, int d, int k,
                        double *precision, double *recall, char *err, size_t errlen);

/* *is = the Inception Score of logits (n, K) (rows idx[0..m) when idx is not NULL, else all n = m
 * rows). Errors: TS_EINVAL (m < 1, K < 2), TS_ENONFINITE, TS_ENOMEM. */
int ts_inception_score(const float *logits, const int32_t *idx, int64_t m, int K, double *is,
                       char *err, size_t errlen);

/* *nll = mean over the n rows of −log softmax(logits_i / T)[truth_i], logits (n, K), truth in
 * [0, K). Errors: TS_EINVAL (n < 1, K < 2, T ≤ 0, a label out of range), TS_ENONFINITE. */
int ts_calib_nll(const float *logits, const int32_t *truth, int64_t n, int K, double T, double *nll,
                 char *err, size_t errlen);

/* *ece = the expected calibration error of softmax(logits / T) over `bins` equal-width bins of
 * the top probability (a top probability of exactly 1 falls in the last bin). Errors: those of
 * ts_calib_nll, and bins < 1. */
int ts_calib_ece(const float *logits, const int32_t *truth, int64_t n, int K, double T, int bins,
                 double *ece, char *err, size_t errlen);

/* *T = the temperature minimising ts_calib_nll, searched over β = 1/T in [1/100, 100] to a
 * relative precision of 1e-6 (a T at an end of the range means the optimum is at or beyond it).
 * Errors: those of ts_calib_nll. */
int ts_calib_fit_temperature(const float *logits, const int32_t *truth, int64_t n, int K, double *T,
                             char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
