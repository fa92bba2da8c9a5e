/*
 * eval_internal.h — what the files of `tessera eval` share: an entry (one row of the results),
 * its routing along t, the reference statistics every entry is scored against, and the functions
 * of eval_score.c (the statistics of one entry), eval_route.c (the routing along t, recorded
 * while sampling) and eval_report.c (the table, the JSON and the HTML report). cmd_eval.c is the
 * verb that drives them; its top comment says what each statistic is.
 */
#ifndef TS_CLIENT_EVAL_INTERNAL_H
#define TS_CLIENT_EVAL_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "client/judges.h"
#include "client/local.h"
#include "model/classifier.h"

#define CHUNK 64 /* samples per ensemble call */
#define MAX_ENTRIES 32
#define MAX_CLASSES 64
#define MAX_CLUSTERS TS_ROUTE_MAX_EXPERTS
#define MIN_GROUP 10 /* fewest samples a per-class or per-cluster FD is computed from */

/* The routing along t of one entry, per evaluation index j (the same t for every sample), summed
 * over the samples: the entropy (bits) and the largest probability of the routing distribution
 * before the selection, the selected experts' spread (model/ensemble.h), and whether the top
 * expert differs from the previous evaluation's (a switch). */
typedef struct {
    int cap, n_eval;
    double *t, *entropy, *top_p, *spread, *switches;
    int64_t *count, *spread_count;
    int32_t *prev; /* (n) each sample's top expert at the previous evaluation */
} route_diag_t;

/* One row of the table: a policy and selection over the folder, or the monolith. */
typedef struct {
    char name[160];
    int monolith; /* 0: a policy over the folder; m ≥ 1: the m-th --monolith file */
    int prior;    /* class-aware routing (POLICY+prior) */
    int hold;     /* per-trajectory routing (POLICY+hold, +draw, +until=T): model/ensemble.h */
    float hold_t; /* +until=T */
    int exact;    /* exact mixture guidance (POLICY+exact): model/ensemble.h */
    float temp;   /* the router's temperature (POLICY+temp=T), 0 = raw */
    ts_policy_t policy;
    ts_selection_t select;
    /* results */
    double fd, coverage, agreement, evals, router_evals, seconds;
    double fd_lo, fd_hi, fd_bias; /* the bootstrap interval and bias (NAN without) */
    double d_fd, d_lo, d_hi;      /* FD − the first entry's FD, and its paired interval */
    double precision, recall, is, is_lo, is_hi;
    double class_fd[MAX_CLASSES]; /* NAN where fewer than MIN_GROUP samples */
    double cluster_share[MAX_CLUSTERS], cluster_fd[MAX_CLUSTERS];
    double *boot; /* (B) the resampled FDs */
    float *grid;  /* the first grid_n samples */
    route_diag_t route;
} entry_t;

/* What every entry is scored against: the reference set's statistics. */
typedef struct {
    int n, D, K, B;           /* samples per entry, feature dims, classes, bootstrap resamples */
    const double *mu, *cov;   /* the reference Gaussian */
    const double *cmu, *ccov; /* (K, D), (K, D, D): per class (count < MIN_GROUP: unused) */
    const int64_t *ccount;    /* (K) reference images per class */
    int Kp;                   /* partition clusters, 0 when the folder has no partition */
    const ts_partition_t *part;
    const double *kmu, *kcov; /* (Kp, D), (Kp, D, D): per cluster */
    const int64_t *kcount;    /* (Kp) reference images per cluster */
    int64_t ref_n;
    const float *pr_ref; /* (pr_n, D) reference features for precision/recall */
    int pr_n, pr_k;
    const double *first_boot; /* the first scored entry's resampled FDs, NULL before it */
    double first_fd;
    int32_t *idx; /* (n) scratch */
} scoring_t;

/* ---- eval_score.c: the statistics of one entry ------------------------------------------------ */

/* Rounds images to the 8-bit grey levels a PNG of them holds (model/png.c's mapping), in place. */
void ts_eval_score_quantise(float *x, int64_t n);

/* The classifier's features (n, D), logits (n, K) and predicted classes (n) of host images
 * (n, C, H, W). */
int ts_eval_score_classify(ts_classifier_t *c, ts_engine_t *e, const float *images, int n, int C,
                           int H, int W, float *feat, float *logits, int32_t *pred);

/* Fits the Gaussians of the groups of feat (n, D) rows: group[i] in [0, G) (others ignored);
 * mu (G, D), cov (G, D, D), count (G). Groups of fewer than MIN_GROUP rows are left unfitted. */
int ts_eval_score_group_fits(const float *feat, const int32_t *group, int64_t n, int G, int D,
                             double *mu, double *cov, int64_t *count, char *err, size_t errlen);

/* The partition's cluster (nearest centroid in its PCA space) of each of n host images. */
int ts_eval_score_clusters(const ts_partition_t *p, const float *images, int64_t n, int32_t *out);

/* Every statistic of one entry (see the top of cmd_eval.c) from its n samples' features, logits,
 * predicted classes, asked classes and (with a partition) clusters. */
int ts_eval_score(scoring_t *sc, const float *feat, const float *logits, const int32_t *pred,
                  const int32_t *asked, const int32_t *cluster, entry_t *x, char *err,
                  size_t errlen);

/* ---- eval_route.c: the routing along t -------------------------------------------------------- */

/* Allocates r's sums, zeroed, for cap evaluations of n samples; after a failure (TS_ENOMEM)
 * ts_eval_route_free releases what was allocated. */
int ts_eval_route_alloc(route_diag_t *r, int cap, int n);
void ts_eval_route_free(route_diag_t *r);

/* ts_local_gen_t.on_chunk: adds one chunk's record (samples start…start+n) to the sums. */
void ts_eval_route_chunk(void *ctx, const ts_ensemble_t *ens, int start);

/* ---- eval_report.c: the results as a table, JSON and an HTML page ----------------------------- */

/* The table on stdout: the floor row, then the entries (boot: with the bootstrap's columns). */
void ts_eval_report_table(const entry_t *e, int n_entries, const entry_t *floor_row, int boot);

/* One entry as a JSON object (new reference): first names the first entry when x has an FD
 * difference to it, samples the file its samples were saved to (both may be NULL). */
json_t *ts_eval_report_entry_json(const entry_t *x, int K, int Kp, const char *first,
                                  const char *samples);

/* The self-contained HTML report at path: setup (a paragraph on how the run was made), the main
 * table, FD bars and frontier, the per-class FD, the further judges' tables (J of them, scores
 * jsc judge-major; J = 0: none), the routing along t, a grid of grid_n samples (images of config
 * c) per entry. */
int ts_eval_report_write(const char *path, const entry_t *e, int n_entries,
                         const entry_t *floor_row, const char *setup, int grid_n, int K,
                         const ts_dit_config_t *c, const ts_cli_judge_t *jd, int J,
                         const ts_space_score_t *jsc, char *err, size_t errlen);

#endif
