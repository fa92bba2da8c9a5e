/*
 * routing.h — how one denoising step weighs the experts (architecture.md §3), and nothing else.
 *
 * Pure functions from scores to weights: a policy turns what it knows about each sample
 * (router logits, distances of an estimate to the cluster centroids, each expert's own
 * confidence, or nothing) into scores over the K experts; a selection sparsifies them (top1,
 * topK, full, threshold=p, or a schedule over t); the weights are renormalised over the selected
 * experts. Routing is per sample. This module does not know where experts run or how they are
 * called: the local ensemble (model/ensemble.h) and the network client both call it unchanged.
 */
#ifndef TS_ROUTING_H
#define TS_ROUTING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_ROUTE_MAX_EXPERTS 256
#define TS_ROUTE_MAX_RULES 8

typedef enum {
    TS_POLICY_LEARNED = 0, /* w = softmax(router logits) */
    TS_POLICY_CENTROID,    /* w ∝ exp(−‖φ(x̂0) − c_k‖² / τ), x̂0 from the previous step */
    TS_POLICY_CONFIDENCE,  /* w ∝ exp(−‖φ(x̂0_k) − c_k‖² / τ), every expert's own x̂0_k */
    TS_POLICY_UNIFORM,     /* w = 1/K */
} ts_policy_t;

typedef enum {
    TS_SELECT_TOPK = 0, /* the k largest weights (k = 1: top1; k ≥ K: full) */
    TS_SELECT_FULL,
    TS_SELECT_THRESHOLD, /* the smallest set of largest weights whose sum reaches p */
} ts_select_kind_t;

typedef struct ts_select_rule {
    float t_above;       /* the rule applies when t > t_above; −1 for the final catch-all */
    ts_select_kind_t kind;
    int k;               /* TOPK */
    float p;             /* THRESHOLD, in (0, 1] */
} ts_select_rule_t;

/* A selection: one rule, or a schedule "t>0.7:full,t>0.3:top2,top1" — rules tried in order,
 * the first whose t_above is exceeded applies; the last rule has no condition. */
typedef struct ts_selection {
    int n_rules;
    ts_select_rule_t rules[TS_ROUTE_MAX_RULES];
} ts_selection_t;

/* Parses "top1", "top3", "full", "threshold=0.9", or a schedule of those with "t>x:" prefixes
 * separated by commas (the last without a prefix). Writes a sentence to err on failure. */
int ts_selection_parse(const char *text, ts_selection_t *sel, char *err, size_t errlen);
/* The rule of sel that applies at time t: the first whose t_above is exceeded (t > t_above,
 * strictly), else the last. NULL when sel is NULL or has no rules. */
const ts_select_rule_t *ts_selection_rule(const ts_selection_t *sel, float t);
/* Writes sel back as text in the syntax ts_selection_parse reads ("t>0.7:full,top1"); always
 * NUL-terminated. Returns buf. */
char *ts_selection_format(const ts_selection_t *sel, char *buf, size_t len);
/* Parses "learned", "centroid", "confidence", "uniform". */
int ts_policy_parse(const char *text, ts_policy_t *policy);
const char *ts_policy_name(ts_policy_t policy);

/* Scores → weights for B samples over K experts, in place: scores (B, K) are logits (a larger
 * score means a better expert; for the distance policies pass −d/τ). Each row becomes a softmax,
 * is sparsified by the rule for time t, and renormalised over the selected experts: on return
 * w[b, k] = 0 for the unselected and the row sums to 1. Ties are broken toward the lower expert
 * index, so the result is deterministic. */
int ts_route_weights(float *w, int B, int K, const ts_selection_t *sel, float t);

/* Squared distances (B, K) from embeddings e (B, D) to centroids c (K, D), in double. */
void ts_route_sq_dist(float *out, const float *e, const float *c, int B, int K, int D);

#ifdef __cplusplus
}
#endif

#endif
