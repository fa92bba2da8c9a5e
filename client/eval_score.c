/*
 * eval_score.c — the statistics of one `tessera eval` entry (cmd_eval.c's top comment says what
 * each one is): its samples through the evaluation classifier, the FD overall, per class and per
 * cluster, coverage, agreement, precision and recall, the Inception Score, and their bootstrap
 * intervals. The primitives are model/metrics.h's and model/quality.h's; this file applies them
 * to an entry (eval_internal.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/eval_internal.h"
#include "model/metrics.h"
#include "model/quality.h"

/* Rounds images to the 8-bit grey levels a PNG of them holds (model/png.c's mapping), in place. */
void ts_eval_score_quantise(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] < -1.0f ? -1.0f : x[i] > 1.0f ? 1.0f : x[i];
        v = isnan(v) ? -1.0f : v;
        x[i] = floorf((v + 1.0f) * 127.5f + 0.5f) / 127.5f - 1.0f;
    }
}

/* The classifier's features (n, D), logits (n, K) and predicted classes (n) of host images
 * (n, C, H, W). */
int ts_eval_score_classify(ts_classifier_t *c, ts_engine_t *e, const float *images, int n, int C,
                           int H, int W, float *feat, float *logits, int32_t *pred) {
    int D = ts_classifier_feature_dim(c), K = ts_classifier_num_outputs(c);
    int64_t chw = (int64_t)C * H * W;
    ts_tensor_t x = {0};
    int rc = ts_tensor_alloc(&x, TS_F32, e->device, 4, TS_SHAPE(CHUNK, C, H, W));
    for (int lo = 0; lo < n && rc == TS_OK; lo += CHUNK) {
        int m = n - lo < CHUNK ? n - lo : CHUNK;
        ts_tensor_t host, xs;
        rc = ts_tensor_slice(&xs, &x, 0, m);
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&host, (float *)images + lo * chw, TS_F32, TS_CPU, 4, xs.shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&xs, &host);
        if (rc == TS_OK)
            rc = ts_classifier_run(c, &xs, NULL, m, feat + (int64_t)lo * D,
                                   logits + (int64_t)lo * K);
        if (rc == TS_OK)
            ts_argmax_rows(logits + (int64_t)lo * K, m, K, pred + lo);
    }
    ts_tensor_free(&x);
    return rc;
}

/* Fits the Gaussians of the groups of feat (n, D) rows: group[i] in [0, G) (others ignored);
 * mu (G, D), cov (G, D, D), count (G). Groups of fewer than MIN_GROUP rows are left unfitted. */
int ts_eval_score_group_fits(const float *feat, const int32_t *group, int64_t n, int G, int D,
                             double *mu, double *cov, int64_t *count, char *err, size_t errlen) {
    float *sub = malloc((size_t)n * (size_t)D * sizeof *sub);
    int rc = sub ? TS_OK : TS_ENOMEM;
    for (int g = 0; g < G && rc == TS_OK; g++) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (group[i] == g)
                memcpy(sub + m++ * D, feat + i * D, (size_t)D * sizeof *sub);
        count[g] = m;
        if (m >= MIN_GROUP)
            rc =
                ts_gauss_fit(sub, m, D, mu + (int64_t)g * D, cov + (int64_t)g * D * D, err, errlen);
    }
    free(sub);
    return rc;
}

/* The FD of the rows of feat whose group is g against the fit (mu, cov); NAN below MIN_GROUP. */
static int group_fd(const float *feat, const int32_t *group, int n, int g, int D, int32_t *idx,
                    const double *mu, const double *cov, int64_t ref_count, double *fd, char *err,
                    size_t errlen) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (group[i] == g)
            idx[m++] = i;
    *fd = NAN;
    if (m < MIN_GROUP || ref_count < MIN_GROUP)
        return TS_OK;
    return ts_fd_rows(feat, idx, m, D, mu, cov, fd, err, errlen);
}

/* The partition's cluster (nearest centroid in its PCA space) of each of n host images. */
int ts_eval_score_clusters(const ts_partition_t *p, const float *images, int64_t n, int32_t *out) {
    float *emb = malloc((size_t)n * (size_t)p->k * sizeof *emb);
    int rc = emb ? ts_partition_embed(p, images, n, emb) : TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_partition_nearest(p, emb, n, out, NULL);
    free(emb);
    return rc;
}

/* Every statistic of one entry (see the top of cmd_eval.c) from its n samples' features, logits,
 * predicted classes, asked classes and (with a partition) clusters. */
int ts_eval_score(scoring_t *sc, const float *feat, const float *logits, const int32_t *pred,
                  const int32_t *asked, const int32_t *cluster, entry_t *x, char *err,
                  size_t errlen) {
    int n = sc->n, D = sc->D, K = sc->K;
    int32_t *idx = sc->idx;
    for (int i = 0; i < n; i++)
        idx[i] = i;
    int rc = ts_fd_rows(feat, idx, n, D, sc->mu, sc->cov, &x->fd, err, errlen);
    if (rc == TS_OK)
        rc = ts_class_coverage(pred, n, K, &x->coverage, NULL, err, errlen);
    if (rc == TS_OK)
        rc = ts_inception_score(logits, NULL, n, K, &x->is, err, errlen);
    int right = 0, conditional = 0;
    for (int i = 0; i < n; i++) {
        conditional += asked[i] < K;
        right += pred[i] == asked[i];
    }
    x->agreement = conditional ? (double)right / conditional : NAN;
    if (rc == TS_OK)
        rc = ts_precision_recall(sc->pr_ref, sc->pr_n, feat, n, D, sc->pr_k, &x->precision,
                                 &x->recall, err, errlen);
    for (int c = 0; c < K && c < MAX_CLASSES && rc == TS_OK; c++)
        rc = group_fd(feat, asked, n, c, D, idx, sc->cmu + (int64_t)c * D,
                      sc->ccov + (int64_t)c * D * D, sc->ccount[c], &x->class_fd[c], err, errlen);
    for (int k = 0; k < sc->Kp && rc == TS_OK; k++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            m += cluster[i] == k;
        x->cluster_share[k] = (double)m / n;
        rc = group_fd(feat, cluster, n, k, D, idx, sc->kmu + (int64_t)k * D,
                      sc->kcov + (int64_t)k * D * D, sc->kcount[k], &x->cluster_fd[k], err, errlen);
    }
    /* the bootstrap: FD and IS on the same B resamples for every entry */
    x->fd_lo = x->fd_hi = x->fd_bias = x->is_lo = x->is_hi = NAN;
    x->d_fd = x->d_lo = x->d_hi = NAN;
    if (rc != TS_OK || sc->B < 2)
        return rc;
    double *isb = malloc((size_t)sc->B * sizeof *isb), *diff = malloc((size_t)sc->B * sizeof *diff);
    x->boot = malloc((size_t)sc->B * sizeof *x->boot);
    if (!isb || !diff || !x->boot)
        rc = TS_ENOMEM;
    for (int b = 0; b < sc->B && rc == TS_OK; b++) {
        ts_bootstrap_indices(0, b, n, idx);
        rc = ts_fd_rows(feat, idx, n, D, sc->mu, sc->cov, &x->boot[b], err, errlen);
        if (rc == TS_OK)
            rc = ts_inception_score(logits, idx, n, K, &isb[b], err, errlen);
    }
    if (rc == TS_OK) {
        ts_bootstrap_interval(x->boot, sc->B, x->fd, &x->fd_lo, &x->fd_hi, &x->fd_bias);
        ts_bootstrap_interval(isb, sc->B, x->is, &x->is_lo, &x->is_hi, NULL);
        if (sc->first_boot) {
            for (int b = 0; b < sc->B; b++)
                diff[b] = x->boot[b] - sc->first_boot[b];
            x->d_fd = x->fd - sc->first_fd;
            ts_bootstrap_interval(diff, sc->B, x->d_fd, &x->d_lo, &x->d_hi, NULL);
        }
    }
    free(isb);
    free(diff);
    return rc;
}
