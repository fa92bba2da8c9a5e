/*
 * space_score.h — several sets of samples scored against one reference set in one feature space:
 * what `tessera judge` (and each judge of `tessera eval --judge`) reports per entry.
 *
 * For every entry: the Fréchet distance (model/metrics.h) with a 95 % bootstrap interval, the
 * Kernel Inception Distance with its own, the paired differences of both to the first entry, and
 * precision and recall (model/quality.h) against the first min(n, reference) reference rows.
 *
 * KID (Bińkowski et al., "Demystifying MMD GANs", ICLR 2018): the unbiased estimate of the squared
 * maximum mean discrepancy between the samples X (m rows) and the reference Y (r rows) under the
 * cubic polynomial kernel k(a, b) = (aᵀb / d + 1)³, on features standardised per dimension by the
 * reference's mean and standard deviation (the judges' features come at any scale, and the cubic
 * kernel of large features is dominated by a few samples):
 *     KID = Σ_{i≠j} k(x_i, x_j) / (m(m − 1)) + Σ_{i≠j} k(y_i, y_j) / (r(r − 1))
 *           − 2 Σ_{i,j} k(x_i, y_j) / (m r).
 * Unbiased, so unlike the FD it does not grow as n shrinks, and it may be slightly negative when
 * the two sets come from one distribution. Its bootstrap resamples the samples (the resamples of
 * model/quality.h, seed 0: the same ones the FD's bootstrap uses, and the same for every entry, so
 * differences are paired); within a resample the first sum runs over the pairs of distinct
 * original samples only (a repeated sample is not its own neighbour), Σ_{u≠v} c_u c_v k(x_u, x_v)
 * / (m² − Σ_u c_u²) with c_u the times sample u was drawn. Kernel sums in double (each kernel
 * value from a double product), the m × m matrix of the samples kept in float.
 *
 * Intervals: ts_bootstrap_interval (model/quality.h), as `tessera eval` reports the FD's.
 */
#ifndef TS_SPACE_SCORE_H
#define TS_SPACE_SCORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_space_score {
    double fd, fd_lo, fd_hi;       /* FD and its 95 % interval (NaN bounds without a bootstrap) */
    double d_fd, d_fd_lo, d_fd_hi; /* FD − the first entry's FD, paired (NaN for the first) */
    double kid, kid_lo, kid_hi;
    double d_kid, d_kid_lo, d_kid_hi;
    double precision, recall;
} ts_space_score_t;

#define TS_SPACE_SCORE_MIN_N 10 /* samples per entry at least (a resample then has pairs) */

/* Scores E ≥ 1 entries, entry e having feat[e] (n[e], d) rows, against ref (r, d): B bootstrap
 * resamples (0: no intervals; paired differences need every n[e] equal), precision/recall with
 * k-th-neighbour radii (pr_k). out: E scores. A resample whose KID is undefined (every draw the
 * same sample: odds n^(1−n)) leaves the KID's interval NaN. Errors: TS_EINVAL (n[e] <
 * TS_SPACE_SCORE_MIN_N, r < 2, d < 1, pr_k too large for the sets), TS_ENONFINITE (a feature that is not finite), TS_ENOMEM; the message says
 * which. */
int ts_space_score(const float *const *feat, const int64_t *n, int E, const float *ref, int64_t r,
                   int d, int B, int pr_k, ts_space_score_t *out, char *err, size_t errlen);

/* The unbiased KID of x (m, d) against y (r, d), as above, without intervals. */
int ts_kid(const float *x, int64_t m, const float *y, int64_t r, int d, double *kid, char *err,
           size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
