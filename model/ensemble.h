/*
 * ensemble.h — K experts in one process, composed per step and per sample into one velocity
 * field for the sampler (architecture.md §3): v(x_t, t) = Σ_k w_k · v_k(x_t, t).
 *
 * At every evaluation the ensemble scores the K experts for every sample by a policy (router
 * logits, distances of an estimate to the partition's centroids, each expert's own confidence,
 * or nothing), turns the scores into sparse weights with model/routing.h, then, expert by expert,
 * gathers the samples that expert has a non-zero weight for into ONE batch (ts_gather_rows),
 * runs the expert once on it with classifier-free guidance ([x; x] with labels [y; ∅]) and adds
 * the weighted answers into the combined velocity (ts_scatter_axpy_rows). So each sample's
 * result does not depend on which other samples share its batch, and an expert nobody needs is
 * not run.
 *
 * Policies (ts_policy_t):
 *   learned     scores = router logits on (x_t, t), through a ts_router_fn.
 *   centroid    scores = −‖φ(x̂0) − c_k‖² / τ with x̂0 = x_t − t·v from the previous evaluation's
 *               COMBINED velocity and φ the partition's PCA embedding. The first evaluation of a
 *               run (pure noise) has no x̂0 yet: it uses the router when one is given, else
 *               uniform scores.
 *   confidence  every expert runs on every sample at every evaluation; scores
 *               −‖φ(x̂0_k) − c_k‖² / τ from each expert's own x̂0_k, then the selection picks whose
 *               answers are combined (an analysis policy: K times the cost).
 *   uniform     scores 0: every expert equally likely (full = the plain mean).
 *
 * Counting: one sample through one expert is one forward; a CFG pair is two. forwards / n is
 * the expert evaluations per sample (top1 with CFG: 2 per evaluation; full: 2K).
 *
 * What it is not: a loader of a generation folder (client/cmd_generate.c), nor a network client —
 * the network client calls model/routing.h the same way, with remote experts.
 */
#ifndef TS_ENSEMBLE_H
#define TS_ENSEMBLE_H

#include <stdint.h>

#include "model/classifier.h"
#include "model/dit.h"
#include "model/objective.h"
#include "model/partition.h"
#include "model/routing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The learned policy's scores: logits (B, K) in host memory for x (B, C, H, W) on the engine's
 * device at time t (the same t for every sample) and the samples' labels (host, B; num_classes =
 * none; NULL = none), which a label-aware router reads and another ignores. Returns TS_OK or an
 * error, which stops the step. A ts_classifier_t router is one (ts_classifier_router_fn). */
typedef int (*ts_router_fn)(void *ctx, const ts_tensor_t *x, float t, const int32_t *labels, int B,
                            float *logits);

/* A ts_classifier_t router (model/classifier.h) as a ts_router_fn: logits of the K clusters on
 * (x_t, t). init borrows c (time-conditioned or not) and allocates the t staging for max_batch
 * samples on engine e. */
typedef struct ts_classifier_router {
    ts_classifier_t *c; /* borrowed */
    ts_engine_t *eng;
    ts_tensor_t t; /* (max_batch) F32 */
    int max_batch;
    /* the logits are divided by it (1 after init): > 1 flattens an over-confident router's
     * p(k | x_t) before the class prior is added (temperature scaling, `tessera calibrate`) */
    float temperature;
} ts_classifier_router_t;

int ts_classifier_router_init(ts_classifier_router_t *r, ts_classifier_t *c, ts_engine_t *e,
                              int max_batch);
void ts_classifier_router_free(ts_classifier_router_t *r);
/* ts_router_fn for ctx = ts_classifier_router_t. */
int ts_classifier_router_fn(void *ctx, const ts_tensor_t *x, float t, const int32_t *labels, int B,
                            float *logits);

/* ---- the experts' residuals, for the router's expert objectives (model/classifier.h) -------- */

/* A ts_router_residuals_fn over K local experts (borrowed, each with max_batch ≥ the router's
 * batch): each expert's forward on (x_t, t, y), its residual v_k − vel, and the per-sample Gram
 * matrix of the residuals, accumulated in double. */
typedef struct ts_expert_residuals {
    ts_dit_t *experts;
    int K, max_batch;
    int64_t chw;
    float *r, *vel; /* (K, max_batch, chw) residuals, (max_batch, chw) the target, host */
} ts_expert_residuals_t;

int ts_expert_residuals_init(ts_expert_residuals_t *x, ts_dit_t *experts, int K, int max_batch);
void ts_expert_residuals_free(ts_expert_residuals_t *x);
int ts_expert_residuals_fn(void *ctx, const ts_tensor_t *xt, const ts_tensor_t *t,
                           const ts_tensor_t *vel, const int32_t *labels, int B, double *G);

/* ---- a set of experts loaded from files ---------------------------------------------------- */

typedef struct ts_experts {
    int K;
    ts_dit_t *models;    /* K models, in cluster order */
    int *cluster;        /* K: the metadata "cluster" of each, or −1 when the files carry none */
    char **paths;        /* K: the file each came from (malloc'd copies) */
    char **partition_id; /* K: metadata "partition_id" (malloc'd), or NULL when absent */
    ts_objective_t *objective; /* K: metadata "objective" (model/objective.h); absent: velocity */
    char latent_space[65];     /* their latent space (model/latents.h), shared; "": pixels */
} ts_experts_t;

/* Opens n expert files on engine e with activations for max_batch samples each. When every file
 * has a metadata "cluster", the experts are ordered by it, and the clusters must be exactly
 * 0..n−1; when none has one, file order is kept; a mix is an error. Every expert must have the
 * same image config (input_size, in_channels), the same num_classes and the same latent space
 * (model/latents.h). On success *x owns the
 * models (ts_experts_free); on failure *x is empty and err names the file and the problem. */
int ts_experts_open(ts_experts_t *x, const char *const *paths, int n, ts_engine_t *e, int max_batch,
                    char *err, size_t errlen);
void ts_experts_free(ts_experts_t *x);

/* ---- the ensemble as a velocity function ---------------------------------------------------- */

/* One expert's share of one evaluation, for experts the ensemble does not run itself (the
 * network client's). Host memory throughout. The hook computes v for the m rows exactly as a
 * local expert does: one forward of [x; x] with labels [y; ∅] and v = s·v_c + (1 − s)·v_u when
 * cfg_scale ≠ 1, else one forward of x with labels y. */
typedef struct ts_expert_job {
    int k;                 /* the expert (cluster) */
    int m;                 /* rows: samples bound for it */
    const int32_t *rows;   /* (m) their indices in the batch */
    const float *x;        /* (m, C, H, W) x_t of those samples */
    const int32_t *labels; /* (m) their labels (num_classes = none) */
    float t, cfg_scale;
    /* 1: the expert's learned variance too (a DDPM run; an expert with learned σ only): v is
     * then (m, 2C, H, W), each sample's C channels of answer followed by its C channels of
     * variance interpolation from the conditional rows (ts_dit_sigma) */
    int with_sigma;
    float *v;   /* (m, C, H, W) the answer ((m, 2C, H, W) with_sigma), written by the hook */
    int status; /* set by the hook: TS_OK, or why it could not (the expert is then dropped) */
} ts_expert_job_t;

/* Runs job j on the local expert m (on a CPU engine: x and v are host memory) exactly as the
 * ensemble runs a local expert — one forward of [x; x] with labels [y; ∅] (one of x with y when
 * cfg_scale = 1), then v = s·v_c + (1 − s)·v_u with the engine's ops — so that whoever computes
 * a job this way (a server, a client's fallback) gives the local answer bit for bit for the same
 * rows. Needs m->max_batch ≥ pairs·j->m; TS_EDEVICE on a GPU engine; TS_EINVAL for with_sigma
 * on a model without learned σ. Sets nothing in j but v. */
int ts_expert_job_run(ts_dit_t *m, const ts_expert_job_t *j);

/* Completes the n jobs of one evaluation, in any order (in parallel over the network). Returns
 * TS_OK when it ran (each job's status says how that went), or an error that stops the step. */
typedef int (*ts_expert_eval_fn)(void *ctx, ts_expert_job_t *jobs, int n);

typedef struct ts_ensemble_opts {
    ts_policy_t policy;
    ts_selection_t select;
    float tau;             /* > 0: the temperature of the distance policies */
    float cfg_scale;       /* 1 = no guidance (one pass per expert) */
    const int32_t *labels; /* n class labels (num_classes = unconditional), borrowed */
    int n;                 /* samples per call */
    ts_router_fn router;   /* learned policy (and the centroid policy's first step); may be NULL */
    void *router_ctx;
    const ts_partition_t *partition; /* centroid, confidence: required; borrowed */
    /* optional, borrowed: (num_classes + 1, K) log p(y | k), added to sample i's scores by its
     * label before the weights are made (class-aware routing: p(k | x_t, y) ∝ p(k | x_t) p(y | k)
     * when x_t and y are independent given the cluster); the null label's row should be 0 */
    const float *log_prior;
    int record; /* keep every evaluation's weights (ts_ensemble_t.steps) */
    /* Per-trajectory routing: TS_HOLD_NONE routes every evaluation afresh; TS_HOLD_FIRST keeps
     * the weights of a run's first evaluation (t = 1) for all of its evaluations; TS_HOLD_DRAW
     * draws ONE expert per sample from the first evaluation's weights (after the selection:
     * with full, from the whole distribution) with the uniform at position 0 of the stream
     * ts_stream_key(seeds[i], TS_HOLD_STREAM), and keeps it to the end. TS_HOLD_BELOW routes
     * every evaluation while t > hold_t and keeps the weights of the first evaluation at or
     * below hold_t to the end: the router commits early in a trajectory (docs/routing.md), so
     * its late evaluations can be skipped. Held evaluations run no policy (no router, no
     * distances). The confidence policy cannot be held. */
    int hold;
    float hold_t;          /* TS_HOLD_BELOW: 0 < hold_t < 1 */
    const uint64_t *seeds; /* n: the samples' noise seeds (TS_HOLD_DRAW); borrowed */
    /* Remote experts: when eval is set, the experts argument of ts_ensemble_init may be NULL and
     * config names the experts' shared config. Every evaluation then hands its work to eval at
     * once — one job per expert with at least one row, in expert order — and combines the
     * answers in expert order exactly as it combines its own, so equal answers give the local
     * result bit for bit. A job that failed drops that expert for this evaluation: each sample
     * it served is routed again with the expert's score at −∞ (top1 moves to the next best
     * expert; a wider selection renormalises over what is left), and the experts it now needs
     * are asked in a further round (a sample left with no expert fails the step, TS_EPEER). The confidence policy needs every expert's answer
     * before it can score, and runs with local experts only. */
    ts_expert_eval_fn eval;
    void *eval_ctx;
    const ts_dit_config_t *config;
    /* Optional, borrowed: K flags, 1 for an expert that cannot answer at all (an uncovered
     * cluster: no live replica and no cached weights). Its score is −∞ at every evaluation
     * before the selection, so each sample's weights renormalise over the others from the first
     * step (top1 takes the next best expert) and it is never asked. The weight it would have had
     * is summed in ts_ensemble_t.absent_mass. Not every expert may be absent (TS_EINVAL). */
    const uint8_t *absent;
    /* Exact mixture guidance (with cfg_scale ≠ 1): the conditional half of the guidance is
     * weighted by the weights of the class-aware scores, p(k | x_t, y), and the unconditional
     * half by those of the scores without the class prior (its null row), p(k | x_t):
     *   v = s·Σ_k w^c_k v_k(x, y) + (1 − s)·Σ_k w^u_k v_k(x, ∅).
     * Expert k runs once, on the rows of either half it is selected for. Without it, both halves
     * take w^c (each expert guides itself: v = Σ_k w^c_k (s·v_k(x, y) + (1 − s)·v_k(x, ∅))).
     * The two agree when the scores do not depend on the label. Local experts only, routed every
     * evaluation (no hold), not the confidence policy; with cfg_scale = 1 it changes nothing. */
    int exact_guidance;
    /* keep the experts' learned variance of each evaluation for ts_ensemble_variance (a DDPM
     * run); off, no evaluation pays for it. Remote experts (eval): learn_sigma (K flags,
     * borrowed; NULL: none) says which have one, and their jobs ask for it (with_sigma). */
    int variance;
    const uint8_t *learn_sigma;
    /* Optional, borrowed: K objectives (model/objective.h), NULL: every expert a velocity (flow)
     * expert. An expert of a DDPM objective is asked at (c·x_t, its schedule's step of equal SNR)
     * — its time input is that step / 1000, DiT's convention — and its (guided) answer is
     * converted to the velocity before the weighted sum, so one ensemble mixes both kinds at
     * every step. schedule: the DDPM experts' (NULL: DiT's linear β, 1000 steps). Local experts
     * only, not the confidence policy nor exact guidance (TS_ENOTSUP at init, said). */
    const ts_objective_t *objectives;
    const ts_ddpm_schedule_t *schedule;
} ts_ensemble_opts_t;

enum { TS_HOLD_NONE = 0, TS_HOLD_FIRST = 1, TS_HOLD_DRAW = 2, TS_HOLD_BELOW = 3 };
#define TS_HOLD_STREAM 0x686f6c64u /* "hold" */

/* One evaluation's routing, recorded when opts.record is set. */
typedef struct ts_route_step {
    float t;
    ts_policy_t
        policy; /* the policy that scored it (the centroid policy's first step falls back) */
    float *w;   /* (n, K): the weights; 0 for the experts not selected */
    float *p;   /* (n, K): softmax of the scores before the selection (the routing distribution;
                   a held evaluation records its held weights) */
    float *spread; /* (n): Σ_k w_k ‖v_k − v‖² / (C·H·W) over the experts run for the sample —
                      how much the selected experts disagree (0 with one); NAN with remote
                      experts or exact guidance */
} ts_route_step_t;

typedef struct ts_ensemble {
    ts_engine_t *eng;
    ts_dit_t *experts; /* K, borrowed */
    int K, n, pairs;   /* pairs: 2 with CFG, else 1 */
    int64_t chw;       /* C·H·W of one sample */
    ts_ensemble_opts_t o;
    /* device staging */
    ts_tensor_t xx, tt;  /* (pairs·n, C, H, W), (pairs·n): one expert's batch */
    ts_tensor_t vk;      /* (n, C, H, W): one expert's guided answers */
    ts_tensor_t vall;    /* (K·n, C, H, W): every expert's answers (confidence only) */
    ts_tensor_t idx, wk; /* (n) I32, (n) F32: the rows bound for one expert and their weights */
    /* host scratch */
    int32_t *yy, *idx_h;    /* (pairs·n) labels, (n) rows */
    float *w, *wk_h;        /* (n, K) scores → weights, (n) */
    float *xh, *vh;         /* (n·chw) x and v (v: K·n·chw for confidence) */
    float *xhat;            /* (n·chw) x − t·v */
    float *conv_x, *conv_f; /* (n·chw) host: a DDPM expert's rows of x and its answer */
    int ddpm;               /* some expert has a DDPM objective (opts.objectives) */
    float *emb, *d2;        /* (n, k) embeddings, (n, K) squared distances */
    float *prev_emb;        /* (n, k): φ(x̂0) of the previous evaluation (centroid) */
    int has_prev;
    float *held;       /* (n, K): the held weights (opts.hold) */
    float *wu;         /* (n, K): exact guidance's unconditional weights */
    float *p, *spread; /* (n, K), (n): this evaluation's distribution and spread (opts.record) */
    double *sq;        /* (n): Σ_k w_k ‖v_k‖² (opts.record) */
    int has_held;
    float last_t; /* the previous call's t: a later time starts a new run (0 before any) */
    /* counters since init */
    int64_t forwards;         /* sample-forwards through any expert (CFG pair = 2) */
    int64_t *expert_forwards; /* (K) the same per expert */
    int64_t evaluations;      /* calls of ts_ensemble_velocity */
    int64_t router_calls;     /* router runs (on n samples each) */
    int64_t fallbacks;        /* centroid evaluations scored without an x̂0 */
    int64_t dropped;          /* remote jobs that failed: an expert left out of one evaluation */
    int64_t renormalised;     /* samples routed again after a drop */
    double policy_s;          /* wall time spent scoring and routing (router, distances, weights) */
    double combine_s;         /* remote experts: wall time spent combining their answers */
    /* opts.absent: (K) Σ over routed evaluations and samples of the weight each absent expert
     * would have had with every expert present (÷ absent_routed: its routing mass); NULL
     * otherwise */
    double *absent_mass;
    int64_t absent_routed; /* samples routed afresh so far (held evaluations route nothing) */
    float *absent_w;       /* (n, K) scratch for it */
    /* DiT's learned variance (an expert with learn_sigma, local or remote; no exact guidance):
     * (n·chw) host, Σ_k w_k·v_k over the experts run for each sample of the last evaluation,
     * v_k an expert's variance output (−1 — the posterior's β̃ — for one without); NULL
     * otherwise. sig_k: (n·chw) one expert's. */
    float *sig, *sig_k;
    /* remote experts: one job per expert, and their host buffers */
    ts_expert_job_t *jobs;     /* (K) */
    int32_t *job_rows, *job_y; /* (K·n) */
    float *job_x, *job_vp;     /* (K·n·chw) a job's rows and answers, packed (×2 with sig) */
    float *job_v;              /* (K·n·chw) answers by (expert, sample) */
    float *job_sig;            /* (K·n·chw) with sig: the variance answers, the same way */
    uint8_t *job_done;         /* (K·n) which of those are in */
    float *scores;             /* (n, K) the scores before selection, for rerouting */
    /* the record */
    ts_route_step_t *steps;
    int n_steps, cap_steps;
} ts_ensemble_t;

/* Prepares ens for K experts (borrowed, all on engine e, each with max_batch ≥ pairs·n; or NULL
 * with opts.eval and opts.config for remote experts) and
 * opts (copied; labels, router_ctx and partition stay the caller's and must outlive ens).
 * Checks: 1 ≤ K ≤ TS_ROUTE_MAX_EXPERTS, the experts share the image config and num_classes, the
 * labels are in [0, num_classes], tau > 0 for the distance policies, a router for learned, a
 * partition for centroid and confidence, and when a partition is given its K equals the
 * experts' and its input dims C·H·W. Free with ts_ensemble_free. On failure err says why. */
int ts_ensemble_init(ts_ensemble_t *ens, ts_engine_t *e, ts_dit_t *experts, int K,
                     const ts_ensemble_opts_t *opts, char *err, size_t errlen);
void ts_ensemble_free(ts_ensemble_t *ens);

/* ts_velocity_fn for ctx = ts_ensemble_t: the combined velocity v (n, C, H, W) at (x, t). A call
 * at t = 1, or at a later time than the previous call (the first step of every sampler run:
 * DDIM and DDPM start below 1), starts a new run: the centroid policy forgets its previous x̂0. */
int ts_ensemble_velocity(void *ctx, const ts_tensor_t *x, float t, ts_tensor_t *v);
/* Whether the ensemble has a learned variance to give (ens.sig): opts.variance asked for it,
 * some expert has learn_sigma, the experts are local and guidance is not exact. */
int ts_ensemble_has_variance(const ts_ensemble_t *ens);
/* ts_variance_fn (model/sampler.h) for ctx = ts_ensemble_t: the variance outputs of the last
 * ts_ensemble_velocity, combined with its weights (ens.sig) into out (n, C, H, W). TS_EINVAL
 * without one. */
int ts_ensemble_variance(void *ctx, ts_tensor_t *out);

/* Expert evaluations per sample so far: forwards / n. */
double ts_ensemble_evals_per_sample(const ts_ensemble_t *ens);

#ifdef __cplusplus
}
#endif

#endif
