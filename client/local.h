/*
 * local.h — a generation folder in this process: the experts, the partition and the router that
 * `tessera generate --local DIR` and `tessera eval --local DIR` read, and routed generation from
 * them (model/ensemble.h), chunk by chunk.
 *
 * The folder DIR holds:
 *   partition.safetensors   the partition artifact (`tessera partition`): PCA basis, mean, the K
 *                           centroids. Required by the centroid and confidence policies; when
 *                           present its K must equal the number of experts.
 *   expert-<k>.safetensors  the experts, k = 0..K−1 (`tessera train --partition DIR --cluster k`),
 *                           taken in k order; when there is no expert-0.safetensors, every other
 *                           *.safetensors with a metadata "cluster" is an expert, ordered by it.
 *   router.safetensors      optional: the router (`tessera train-router`), required by the
 *                           learned policy; the centroid policy uses it for its first step.
 *
 * Generation: sample i starts from the noise stream seeds[i] with label labels[i]; samples go
 * through the ensemble in chunks of at most `chunk`, and since routing is per sample the
 * chunking changes no result. A folder of one expert with any policy and top1 is that expert
 * alone, so it reproduces `tessera sample` bit for bit (the monolith of `tessera eval`).
 *
 * `prog` prefixes the notes and warnings written to stderr; `err`/`errlen` receive one sentence
 * on failure.
 */
#ifndef TS_CLIENT_LOCAL_H
#define TS_CLIENT_LOCAL_H

#include <stdint.h>

#include "model/classifier.h"
#include "model/ensemble.h"
#include "model/partition.h"
#include "model/routing.h"
#include "model/sampler.h"

typedef struct ts_local {
    ts_experts_t ex;
    ts_partition_t part; /* valid when has_part */
    ts_classifier_t *router;
    ts_classifier_router_t rr; /* valid when has_router */
    int has_part, has_router;
    int chunk;           /* samples per ensemble call */
    ts_dit_config_t cfg; /* the experts' (shared image config and classes) */
    /* remote experts (ts_local_open_remote): ex.K is set, ex.models is NULL */
    ts_expert_eval_fn eval;
    void *eval_ctx;
    uint8_t *learn_sigma; /* (ex.K) which remote experts have a learned variance (owned) */
    /* optional, borrowed: (ex.K) experts that cannot answer, routed around from the first step
     * (model/ensemble.h opts.absent); set by the network client for uncovered clusters */
    const uint8_t *absent;
    char dir[1024];
} ts_local_t;

/* Opens the folder dir for engine e, with activations for chunk samples (2·chunk when pairs = 2,
 * i.e. with CFG): the experts (required), the partition (when the file exists) and the router
 * (when the file exists and load_router is set). A router or partition whose K differs from the
 * folder's experts is an error; files trained on another partition give a warning. Free with
 * ts_local_free (also after a failure). */
int ts_local_open(ts_local_t *l, const char *dir, ts_engine_t *e, int chunk, int pairs,
                  int load_router, const char *prog, char *err, size_t errlen);

/* Opens one expert file as a folder of one (no partition, no router): a monolith. */
int ts_local_open_file(ts_local_t *l, const char *path, ts_engine_t *e, int chunk, int pairs,
                       char *err, size_t errlen);

/* Opens a folder of artifacts (partition.safetensors, optional router.safetensors) for K experts
 * that run elsewhere: every evaluation's work goes to eval (model/ensemble.h), which computes
 * it as the local experts would. cfg is their shared config; objectives (K, or NULL: all
 * velocity) what each expert predicts (the ensemble asks and converts a DDPM one); learn_sigma
 * (K flags, or NULL: none) which have DiT's learned variance (asked for in a DDPM run). */
int ts_local_open_remote(ts_local_t *l, const char *dir, int K, const ts_dit_config_t *cfg,
                         const ts_objective_t *objectives, const uint8_t *learn_sigma,
                         ts_engine_t *e, int chunk, int load_router, ts_expert_eval_fn eval,
                         void *eval_ctx, char *err, size_t errlen);

void ts_local_free(ts_local_t *l);

/* Whether the sampler kind (named `sampler` in the message) can ask every expert of l: a DDPM
 * expert (ε, v or x0) cannot be asked at pure noise, where euler and heun start. TS_EINVAL with
 * the sentence naming the expert and the samplers that can. */
int ts_local_check_sampler(const ts_local_t *l, ts_sampler_kind_t kind, const char *sampler,
                           char *err, size_t errlen);

/* Whether the folder has what policy needs (TS_ENOTFOUND with a sentence saying how to get it);
 * prints a note when the policy falls back or costs K times more. */
int ts_local_check_policy(const ts_local_t *l, ts_policy_t policy, const char *prog, char *err,
                          size_t errlen);

/* The distance policies' default temperature: the partition's mean squared distance of an image
 * to its centroid (1 without a partition). */
float ts_local_default_tau(const ts_local_t *l);

/* The class prior of class-aware routing: *out = (num_classes + 1, K) log p(y | k) from the
 * partition's assignment of the train set and the train labels (labels, n = the partition's n),
 * with add-one smoothing so no class is impossible in any cluster; the null label's row is 0.
 * Needs the partition (TS_ENOTFOUND). The caller frees *out. */
int ts_local_class_prior(const ts_local_t *l, const int32_t *labels, int64_t n, int num_classes,
                         float **out, char *err, size_t errlen);

typedef struct ts_local_gen {
    ts_policy_t policy;
    ts_selection_t select;
    float tau, cfg;
    const float *log_prior; /* NULL, or ts_local_class_prior's: class-aware routing */
    ts_sampler_opts_t sampler;
    int n;
    const int32_t *labels; /* n, borrowed */
    const uint64_t *seeds; /* n, borrowed */
    /* optional: called after each chunk with its ensemble (e.g. to copy the routing record,
     * which needs record = 1); start is the chunk's first sample */
    void (*on_chunk)(void *ctx, const ts_ensemble_t *ens, int start);
    void *chunk_ctx;
    int record;
    int hold; /* TS_HOLD_NONE, _FIRST, _DRAW or _BELOW (model/ensemble.h): per-trajectory routing */
    float hold_t;                  /* _BELOW: route while t > hold_t */
    int exact_guidance;            /* model/ensemble.h: guidance halves routed apart (cfg ≠ 1) */
    float router_temp;             /* the router's logits are divided by it; 0 = 1 (raw) */
    ts_sample_progress_fn on_step; /* optional, per sampler step of every chunk */
    void *step_ctx;
    int *chunk_start; /* optional: set to each chunk's first sample before the chunk runs */
} ts_local_gen_t;

typedef struct ts_local_stats {
    int64_t forwards;     /* sample-forwards through any expert (a CFG pair is two) */
    int64_t router_evals; /* sample-evaluations of the router */
    int64_t *use;         /* (K) sample-forwards per expert; the caller's array, or NULL */
    double seconds;
    double policy_s, combine_s; /* the ensembles' (model/ensemble.h) */
    int64_t sample_evals;       /* evaluations × samples: what routing masses are divided by */
    double *absent_mass;        /* (K) with l->absent: the caller's array, added to */
    int64_t absent_routed;      /* with l->absent: samples routed afresh (its divisor) */
    int learned_variance;       /* DDPM's noise came from the experts' learned σ (DiT's) */
} ts_local_stats_t;

/* Generates g->n samples into images (n, C, H, W) in host memory. stats (may be NULL) is
 * overwritten, except that stats->use is added to. */
int ts_local_generate(ts_local_t *l, ts_engine_t *e, const ts_local_gen_t *g, float *images,
                      ts_local_stats_t *stats, char *err, size_t errlen);

/* Whether the n monoliths (opened from paths) make the images of the folder l opened from dir —
 * the same size, channels and classes — and the data set ds holds images of that shape: TS_OK,
 * or TS_EINVAL with a sentence naming the first that does not. */
int ts_local_check_images(const ts_local_t *l, const char *dir, const ts_local_t *mono,
                          const char *const *paths, int n, const ts_dataset_t *ds, char *err,
                          size_t errlen);

/* Parses a class option: "null" (the null label, unconditional) or 0..num_classes−1 into
 * *label; NULL gives −1 (cycle through the classes). TS_EINVAL with a sentence otherwise. */
int ts_local_parse_class(const char *cls, int num_classes, int *label, char *err, size_t errlen);

/* --attention on the folder's experts (client/cli.h ts_cli_attention); nothing for a remote
 * ensemble (each node chooses its own). */
int ts_local_set_attention(ts_local_t *l, const char *choice, const char *prog, char *err,
                           size_t errlen);
/* ts_cli_precision (client/cli.h) on the experts of a folder opened here (remote experts have none: nothing to do). */
int ts_local_set_precision(ts_local_t *l, ts_precision_t p, const char *prog, char *err,
                           size_t errlen);

#endif
