/*
 * cmd_eval.c — `tessera eval --local DIR`: how good are the samples of each routing policy (and
 * of a monolith), measured in the evaluation classifier's feature space (architecture.md §10).
 *
 * For every entry of --policies the same n samples are generated — sample i from the noise
 * stream seed + i with label i mod 10, so the entries differ only by their routing — quantised to
 * 8 bits exactly as a PNG of them would hold them, and run through the classifier
 * (`tessera train-classifier`). Reported per entry:
 *   fd          Fréchet distance between the samples' features and the reference set's (the
 *               test split by default): model/metrics.h.
 *   coverage    entropy (bits) of the histogram of predicted classes: log2 10 = 3.32 when every
 *               class is produced equally often.
 *   agreement   the fraction of samples the classifier puts in the class they were asked for.
 *   evals       expert evaluations per sample (a CFG pair counts two), and router evaluations.
 *   fd_ci95     a 95 % bootstrap interval on the FD (--bootstrap B resamples of the samples, the
 *               same resamples for every entry, model/quality.h): the percentile interval shifted
 *               by the bootstrap's bias (mean of the resampled FDs − FD), since resampling with
 *               repeats inflates an FD. Also the paired difference to the first entry with its
 *               interval (entries share sample i's noise and label, so their differences are
 *               measured more tightly than two separate intervals suggest).
 *   precision, recall   k-nearest-neighbour manifolds in feature space (model/quality.h) against
 *               min(n, ref-n) reference images: recall drops when a mode is dropped.
 *   IS          the Inception Score in the classifier's space, with its bootstrap interval.
 *   per class   the FD of the samples asked for class c against the test images of class c.
 *   per cluster with a partition in the folder: the share of samples whose nearest centroid
 *               (in the partition's PCA space) is k against the test set's share, and the FD of
 *               those samples against the test images of cluster k: which region of the data loses.
 * An entry POLICY+prior routes class-aware: the policy's scores plus log p(y | k), the class mix
 * of each cluster (client/local.h), so a sample asked for class y goes to the experts that saw y.
 * POLICY+hold routes each sample once, at t = 1, and keeps those weights to the end;
 * POLICY+draw draws one expert per sample from them and keeps it (model/ensemble.h): routing per
 * trajectory rather than per step. POLICY+exact (with --cfg ≠ 1) guides with the exact mixture:
 * the conditional half weighted by the class-aware weights, the unconditional half by the weights
 * without the class prior (model/ensemble.h). POLICY+temp=T divides the router's logits by T
 * before the prior (`tessera calibrate` fits T). Every routed entry also reports its routing
 * along t ("route" in the JSON, three figures in the report): per evaluation, the entropy (bits)
 * and top probability of the routing distribution before the selection, the selected experts'
 * spread Σ_k w_k ‖v_k − v‖² per pixel, and the share of samples whose top expert switched since
 * the previous evaluation.
 * Plus one baseline row, "train data": n train images in place of samples, the FD a perfect
 * generator would get at this n (FD is biased upward at small n, by the same amount for every
 * row).
 *
 * Entries "monolith", "monolith2", … are the files of --monolith FILE[,FILE…] in order (several
 * seeds of one recipe, or several recipes). --save-samples DIR writes each entry's samples as an
 * IDX pair (DIR/<entry>-images-idx3-ubyte, …-labels-idx1-ubyte with the asked classes; the entry's
 * name with characters other than letters, digits and "+._-" as "_"), the format of Fashion-MNIST
 * itself, so that anyone can score them with another network.
 *
 * Output: a table on stdout (or one JSON object with --json), and with --report a self-contained
 * HTML page (client/report.h) with the table, the quality/cost frontier (FD with its interval
 * against expert evaluations per sample), per-class FD, and a sample grid per entry.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/args.h"
#include "client/commands.h"
#include "client/local.h"
#include "client/report.h"
#include "model/classifier.h"
#include "model/fmnist.h"
#include "model/metrics.h"
#include "model/quality.h"

#define PROG "tessera eval"
#define CHUNK 64 /* samples per ensemble call */
#define MAX_ENTRIES 32
#define MAX_MONOLITHS 8
#define MAX_CLASSES 64
#define MAX_CLUSTERS TS_ROUTE_MAX_EXPERTS
#define MIN_GROUP 10 /* fewest samples a per-class or per-cluster FD is computed from */
#define MONOLITH "monolith"
#define DEFAULT_POLICIES                                                                           \
    "monolith learned:top1 learned:top2 uniform:full learned:full learned:threshold=0.9 "          \
    "learned:t>0.7:full,t>0.3:top2,top1 centroid:top1 confidence:top1"

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
    int hold;     /* per-trajectory routing (POLICY+hold, POLICY+draw): model/ensemble.h */
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

/* Splits the whitespace-separated list into entries: "monolith" or POLICY[+MOD…][:SELECTION]
 * (the selection defaults to top1; it may itself hold colons, as a schedule does; +prior adds the
 * clusters' class mix to the scores, client/local.h; +hold, +draw, +exact and +temp=T as at the
 * top of the file). */
static int parse_entries(const char *list, entry_t *e, int *n, char *err, size_t errlen) {
    char *copy = strdup(list), *save = NULL;
    if (!copy)
        return TS_ENOMEM;
    int rc = TS_OK;
    *n = 0;
    for (char *tok = strtok_r(copy, " \t\n", &save); tok && rc == TS_OK;
         tok = strtok_r(NULL, " \t\n", &save)) {
        if (*n == MAX_ENTRIES) {
            ts_set_err(err, errlen, "--policies: more than %d entries", MAX_ENTRIES);
            rc = TS_EINVAL;
            break;
        }
        entry_t *x = &e[*n];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", tok);
        if (strncmp(tok, MONOLITH, strlen(MONOLITH)) == 0) {
            const char *num = tok + strlen(MONOLITH);
            char *end = NULL;
            long m = *num ? strtol(num, &end, 10) : 1;
            if ((*num && *end) || m < 1 || m > MAX_MONOLITHS) {
                ts_set_err(err, errlen, "--policies: '%s': want monolith, monolith2, … monolith%d",
                           tok, MAX_MONOLITHS);
                rc = TS_EINVAL;
                break;
            }
            x->monolith = (int)m;
            (*n)++;
            continue;
        }
        char *colon = strchr(tok, ':');
        if (colon)
            *colon = '\0';
        int bad_mod = 0;
        for (char *plus = strrchr(tok, '+'); plus; plus = strrchr(tok, '+')) {
            if (strcmp(plus, "+prior") == 0)
                x->prior = 1;
            else if (strcmp(plus, "+hold") == 0 && !x->hold)
                x->hold = TS_HOLD_FIRST;
            else if (strcmp(plus, "+draw") == 0 && !x->hold)
                x->hold = TS_HOLD_DRAW;
            else if (strcmp(plus, "+exact") == 0)
                x->exact = 1;
            else if (strncmp(plus, "+temp=", 6) == 0) {
                char *end = NULL;
                double v = strtod(plus + 6, &end);
                if (end == plus + 6 || *end || !(v > 0.0) || !isfinite(v) || v > 1e6)
                    bad_mod = 1;
                x->temp = (float)v;
            } else
                bad_mod = 1;
            *plus = '\0';
        }
        if (bad_mod || ts_policy_parse(tok, &x->policy) != TS_OK) {
            ts_set_err(err, errlen,
                       "--policies: '%s' is not a policy (learned, centroid, confidence, uniform, "
                       "each optionally +prior, +hold or +draw, +exact, +temp=T with T > 0, or "
                       "monolith)",
                       x->name);
            rc = TS_EINVAL;
        } else {
            char why[256] = "";
            const char *sel = colon ? colon + 1 : "top1";
            if (ts_selection_parse(sel, &x->select, why, sizeof why) != TS_OK) {
                ts_set_err(err, errlen, "--policies %s: %s", x->name, why);
                rc = TS_EINVAL;
            }
            (*n)++;
        }
    }
    free(copy);
    if (rc == TS_OK && *n == 0) {
        ts_set_err(err, errlen, "--policies: empty list");
        rc = TS_EINVAL;
    }
    return rc;
}

/* Rounds images to the 8-bit grey levels a PNG of them holds (model/png.c's mapping), in place. */
static void quantise(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] < -1.0f ? -1.0f : x[i] > 1.0f ? 1.0f : x[i];
        v = isnan(v) ? -1.0f : v;
        x[i] = floorf((v + 1.0f) * 127.5f + 0.5f) / 127.5f - 1.0f;
    }
}

/* The classifier's features (n, D), logits (n, K) and predicted classes (n) of host images
 * (n, C, H, W). */
static int classify(ts_classifier_t *c, ts_engine_t *e, const float *images, int n, int C, int H,
                    int W, float *feat, float *logits, int32_t *pred) {
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

/* A 95 % interval from B resampled values of a statistic whose estimate is est: the 2.5 and 97.5
 * percentiles shifted by the bootstrap bias (mean − est). Sorts a copy. */
static void interval(const double *boot, int B, double est, double *lo, double *hi,
                     double *bias_out) {
    double *c = malloc((size_t)B * sizeof *c), mean = 0.0;
    if (!c) {
        *lo = *hi = NAN;
        return;
    }
    for (int b = 0; b < B; b++)
        mean += (c[b] = boot[b]) / B;
    double bias = mean - est;
    *lo = ts_quantile(c, B, 0.025) - bias;
    *hi = ts_quantile(c, B, 0.975) - bias;
    if (bias_out)
        *bias_out = bias;
    free(c);
}

/* Fits the Gaussians of the groups of feat (n, D) rows: group[i] in [0, G) (others ignored);
 * mu (G, D), cov (G, D, D), count (G). Groups of fewer than MIN_GROUP rows are left unfitted. */
static int group_fits(const float *feat, const int32_t *group, int64_t n, int G, int D, double *mu,
                      double *cov, int64_t *count, char *err, size_t errlen) {
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
static int clusters_of(const ts_partition_t *p, const float *images, int64_t n, int32_t *out) {
    float *emb = malloc((size_t)n * (size_t)p->k * sizeof *emb);
    int rc = emb ? ts_partition_embed(p, images, n, emb) : TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_partition_nearest(p, emb, n, out, NULL);
    free(emb);
    return rc;
}

/* Every statistic of one entry (see the top of the file) from its n samples' features, logits,
 * predicted classes, asked classes and (with a partition) clusters. */
static int score(scoring_t *sc, const float *feat, const float *logits, const int32_t *pred,
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
        interval(x->boot, sc->B, x->fd, &x->fd_lo, &x->fd_hi, &x->fd_bias);
        interval(isb, sc->B, x->is, &x->is_lo, &x->is_hi, NULL);
        if (sc->first_boot) {
            for (int b = 0; b < sc->B; b++)
                diff[b] = x->boot[b] - sc->first_boot[b];
            x->d_fd = x->fd - sc->first_fd;
            interval(diff, sc->B, x->d_fd, &x->d_lo, &x->d_hi, NULL);
        }
    }
    free(isb);
    free(diff);
    return rc;
}

/* An entry's name as a file prefix: letters, digits and "+._-" kept, anything else "_". */
static void file_prefix(const char *name, char *out, size_t len) {
    size_t i = 0;
    for (; name[i] && i + 1 < len; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '+' || c == '.' || c == '_' || c == '-';
        out[i] = ok && !(i == 0 && c == '.') ? c : '_';
    }
    out[i] = '\0';
}

/* ---- the routing along t ---------------------------------------------------------------------- */

static json_t *num(double v);

static int route_alloc(route_diag_t *r, int cap, int n) {
    memset(r, 0, sizeof *r);
    r->cap = cap;
    r->t = calloc((size_t)cap, sizeof *r->t);
    r->entropy = calloc((size_t)cap, sizeof *r->entropy);
    r->top_p = calloc((size_t)cap, sizeof *r->top_p);
    r->spread = calloc((size_t)cap, sizeof *r->spread);
    r->switches = calloc((size_t)cap, sizeof *r->switches);
    r->count = calloc((size_t)cap, sizeof *r->count);
    r->spread_count = calloc((size_t)cap, sizeof *r->spread_count);
    r->prev = calloc((size_t)n, sizeof *r->prev);
    return r->t && r->entropy && r->top_p && r->spread && r->switches && r->count &&
                   r->spread_count && r->prev
               ? TS_OK
               : TS_ENOMEM;
}

static void route_free(route_diag_t *r) {
    free(r->t), free(r->entropy), free(r->top_p), free(r->spread), free(r->switches);
    free(r->count), free(r->spread_count), free(r->prev);
    memset(r, 0, sizeof *r);
}

/* ts_local_gen_t.on_chunk: adds one chunk's record (samples start…start+n) to the sums. */
static void route_chunk(void *ctx, const ts_ensemble_t *ens, int start) {
    route_diag_t *r = ctx;
    int K = ens->K;
    for (int j = 0; j < ens->n_steps && j < r->cap; j++) {
        const ts_route_step_t *st = &ens->steps[j];
        r->t[j] = st->t;
        r->n_eval = j + 1 > r->n_eval ? j + 1 : r->n_eval;
        for (int b = 0; b < ens->n; b++) {
            const float *p = st->p + (size_t)b * K, *w = st->w + (size_t)b * K;
            double h = 0.0, top = 0.0;
            int best = 0;
            for (int k = 0; k < K; k++) {
                h -= p[k] > 0.0f ? p[k] * log2(p[k]) : 0.0;
                top = p[k] > top ? p[k] : top;
                best = w[k] > w[best] ? k : best;
            }
            r->entropy[j] += h;
            r->top_p[j] += top;
            r->count[j]++;
            if (isfinite(st->spread[b])) {
                r->spread[j] += st->spread[b];
                r->spread_count[j]++;
            }
            if (j > 0)
                r->switches[j] += best != r->prev[start + b];
            r->prev[start + b] = best;
        }
    }
}

/* The entry's routing along t as JSON: per evaluation, t and the means over the samples. */
static json_t *route_json(const route_diag_t *r) {
    json_t *t = json_array(), *h = json_array(), *top = json_array(), *sp = json_array(),
           *sw = json_array();
    double total_switches = 0.0;
    int64_t samples = r->n_eval ? r->count[0] : 0;
    for (int j = 0; j < r->n_eval; j++) {
        double c = r->count[j] ? (double)r->count[j] : NAN;
        json_array_append_new(t, json_real(r->t[j]));
        json_array_append_new(h, num(r->entropy[j] / c));
        json_array_append_new(top, num(r->top_p[j] / c));
        json_array_append_new(sp,
                              num(r->spread_count[j] ? r->spread[j] / r->spread_count[j] : NAN));
        json_array_append_new(sw, num(j ? r->switches[j] / c : NAN));
        total_switches += r->switches[j];
    }
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "t", t, "entropy_bits", h, "top_p", top,
                     "spread", sp, "switch_rate", sw, "switches_per_sample",
                     num(samples ? total_switches / (double)samples : NAN));
}

typedef struct {
    int tty, done, total;
    const char *name;
} progress_t;

static int on_step(void *ctx, int step, int steps) {
    progress_t *p = ctx;
    p->done++;
    if (p->tty)
        fprintf(stderr, "\r%-40.40s step %d/%d (%d/%d)   ", p->name, step, steps, p->done,
                p->total);
    return 0;
}

static void print_table(const entry_t *e, int n_entries, const entry_t *floor_row, int boot) {
    printf("%-40s %8s %17s %9s %6s %6s %6s %6s %7s %7s\n", "policy", "FD",
           boot ? "95% interval" : "", boot ? "vs first" : "", "prec", "recall", "IS", "agree",
           "evals", "seconds");
    const entry_t *rows[MAX_ENTRIES + 1];
    int n = 0;
    rows[n++] = floor_row;
    for (int i = 0; i < n_entries; i++)
        rows[n++] = &e[i];
    for (int i = 0; i < n; i++) {
        const entry_t *x = rows[i];
        char ci[48] = "", d[32] = "";
        if (boot && isfinite(x->fd_lo))
            snprintf(ci, sizeof ci, "[%.3f, %.3f]", x->fd_lo, x->fd_hi);
        if (boot && isfinite(x->d_fd))
            snprintf(d, sizeof d, "%+.3f%s", x->d_fd, x->d_lo > 0 || x->d_hi < 0 ? "*" : "");
        printf("%-40.40s %8.3f %17s %9s %6.3f %6.3f %6.2f %6.3f %7.1f %7.1f\n", x->name, x->fd, ci,
               d, x->precision, x->recall, x->is, x->agreement, x->evals, x->seconds);
    }
    if (boot)
        printf("(vs first: FD minus the first entry's; * where its paired 95%% interval excludes "
               "0)\n");
}

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *pair(double lo, double hi) {
    return isfinite(lo) ? json_pack("[f, f]", lo, hi) : json_null();
}

static json_t *entry_json(const entry_t *x, int K, int Kp, const char *first, const char *samples) {
    json_t *o = json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:f, s:f, s:f}",
                          "policy", x->name, "fd", num(x->fd), "fd_ci95", pair(x->fd_lo, x->fd_hi),
                          "fd_bootstrap_bias", num(x->fd_bias), "precision", num(x->precision),
                          "recall", num(x->recall), "inception_score", num(x->is), "is_ci95",
                          pair(x->is_lo, x->is_hi), "coverage_bits", num(x->coverage), "agreement",
                          num(x->agreement), "evals_per_sample", x->evals,
                          "router_evals_per_sample", x->router_evals, "seconds", x->seconds);
    if (!o)
        return NULL;
    if (first && isfinite(x->d_fd))
        json_object_set_new(o, "fd_minus_first",
                            json_pack("{s:s, s:f, s:o}", "first", first, "value", x->d_fd, "ci95",
                                      pair(x->d_lo, x->d_hi)));
    json_t *cf = json_array();
    for (int c = 0; c < K && c < MAX_CLASSES; c++)
        json_array_append_new(cf, num(x->class_fd[c]));
    json_object_set_new(o, "per_class_fd", cf);
    if (Kp > 0) {
        json_t *pc = json_array();
        for (int k = 0; k < Kp; k++)
            json_array_append_new(pc, json_pack("{s:i, s:f, s:o}", "cluster", k, "share",
                                                x->cluster_share[k], "fd", num(x->cluster_fd[k])));
        json_object_set_new(o, "per_cluster", pc);
    }
    if (samples)
        json_object_set_new(o, "samples", json_string(samples));
    if (!x->monolith && x->route.n_eval)
        json_object_set_new(o, "route", route_json(&x->route));
    return o;
}

/* The report's routing along t: the routing distribution's entropy, the selected experts' spread
 * and the switch rate, one line per routed entry (the entries share their evaluation times). */
static void route_figures(ts_report_t *r, const entry_t *e, int n_entries) {
    const entry_t *first = NULL;
    int ns = 0;
    for (int i = 0; i < n_entries; i++)
        if (!e[i].monolith && e[i].route.n_eval) {
            first = first ? first : &e[i];
            ns++;
        }
    if (!first)
        return;
    int np = first->route.n_eval;
    const char **labels = calloc((size_t)ns, sizeof *labels);
    double *y = calloc((size_t)3 * ns * np, sizeof *y);
    if (!labels || !y) {
        free(labels), free(y);
        return;
    }
    double *h = y, *sp = y + (size_t)ns * np, *sw = y + (size_t)2 * ns * np;
    int s = 0;
    for (int i = 0; i < n_entries; i++) {
        const route_diag_t *q = &e[i].route;
        if (e[i].monolith || !q->n_eval)
            continue;
        labels[s] = e[i].name;
        for (int j = 0; j < np; j++) {
            double c = j < q->n_eval && q->count[j] ? (double)q->count[j] : NAN;
            h[(size_t)s * np + j] = j < q->n_eval ? q->entropy[j] / c : NAN;
            sp[(size_t)s * np + j] = j < q->n_eval && q->spread_count[j]
                                         ? q->spread[j] / (double)q->spread_count[j]
                                         : NAN;
            sw[(size_t)s * np + j] = j > 0 && j < q->n_eval ? q->switches[j] / c : NAN;
        }
        s++;
    }
    ts_report_heading(r, 2, "Routing along t (sampling runs from t = 1 to 0)");
    ts_report_paragraph(r, "The entropy of each sample's routing distribution before the "
                           "selection (its scores' softmax, class prior included), the selected "
                           "experts' disagreement Σ_k w_k ‖v_k − v‖² per pixel, and the share of "
                           "samples whose top expert differs from the previous evaluation's, "
                           "averaged over the samples at each evaluation.");
    ts_report_lines_svg(r, "Routing entropy", "t", "bits", labels, first->route.t, h, ns, np);
    ts_report_lines_svg(r, "Selected experts' disagreement", "t", "Σ w‖v_k − v‖² / pixel", labels,
                        first->route.t, sp, ns, np);
    ts_report_lines_svg(r, "Top expert switches", "t", "share of samples", labels, first->route.t,
                        sw, ns, np);
    free(labels), free(y);
}

static int write_report(const char *path, const entry_t *e, int n_entries, const entry_t *floor_row,
                        const char *setup, int grid_n, int K, const ts_dit_config_t *c, char *err,
                        size_t errlen) {
    ts_report_t *r = NULL;
    int rc = ts_report_open(&r, path, "tessera eval", err, errlen);
    if (rc != TS_OK)
        return rc;
    ts_report_heading(r, 1, "tessera eval: routing policies compared");
    ts_report_paragraph(r, setup);
    /* the table */
    enum { COLS = 10 };
    const char *head[COLS] = {"policy", "FD", "95 % interval", "FD − first (95 %)", "precision",
                              "recall", "IS", "agreement",     "evals/sample",      "seconds"};
    int rows = n_entries + 2;
    char(*buf)[COLS][160] = calloc((size_t)rows, sizeof *buf);
    const char **cells = calloc((size_t)rows * COLS, sizeof *cells);
    const char **labels = calloc((size_t)n_entries + 1, sizeof *labels);
    double *fds = calloc((size_t)n_entries + 1, sizeof *fds);
    double *xs = calloc((size_t)n_entries + 1, sizeof *xs);
    double *lo = calloc((size_t)n_entries + 1, sizeof *lo);
    double *hi = calloc((size_t)n_entries + 1, sizeof *hi);
    int cls_cols = K + 1;
    char(*cbuf)[MAX_CLASSES + 1][32] = calloc((size_t)n_entries + 1, sizeof *cbuf);
    const char **ccells = calloc((size_t)(n_entries + 1) * cls_cols, sizeof *ccells);
    if (!buf || !cells || !labels || !fds || !xs || !lo || !hi || !cbuf || !ccells) {
        free(buf), free(cells), free(labels), free(fds), free(xs), free(lo), free(hi);
        free(cbuf), free(ccells);
        ts_report_discard(r);
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    for (int j = 0; j < COLS; j++)
        cells[j] = head[j];
    for (int i = 0; i < n_entries + 1; i++) {
        const entry_t *x = i == 0 ? floor_row : &e[i - 1];
        char(*b)[160] = buf[i + 1];
        snprintf(b[0], 160, "%s", x->name);
        snprintf(b[1], 160, "%.3f", x->fd);
        snprintf(b[2], 160, isfinite(x->fd_lo) ? "[%.3f, %.3f]" : "", x->fd_lo, x->fd_hi);
        snprintf(b[3], 160, isfinite(x->d_fd) ? "%+.3f [%+.3f, %+.3f]" : "", x->d_fd, x->d_lo,
                 x->d_hi);
        snprintf(b[4], 160, "%.3f", x->precision);
        snprintf(b[5], 160, "%.3f", x->recall);
        snprintf(b[6], 160, "%.2f", x->is);
        snprintf(b[7], 160, "%.3f", x->agreement);
        snprintf(b[8], 160, "%.1f", x->evals);
        snprintf(b[9], 160, "%.1f", x->seconds);
        for (int j = 0; j < COLS; j++)
            cells[(i + 1) * COLS + j] = b[j];
        labels[i] = x->name;
        fds[i] = x->fd;
        xs[i] = x->evals;
        lo[i] = isfinite(x->fd_lo) ? x->fd_lo : x->fd;
        hi[i] = isfinite(x->fd_hi) ? x->fd_hi : x->fd;
    }
    ts_report_table(r, COLS, n_entries + 2, cells);
    ts_report_bar_chart_svg(r, "Fréchet distance (lower is better)", labels, fds, n_entries + 1,
                            NULL);
    /* the frontier: the entries only (the floor has no cost) */
    ts_report_scatter_svg(r,
                          "Quality against cost: FD (95 % interval) vs expert evaluations per "
                          "sample",
                          "expert evaluations per sample (log scale)", "FD", labels + 1, xs + 1,
                          fds + 1, lo + 1, hi + 1, n_entries);
    /* per-class FD */
    ts_report_heading(r, 2,
                      "FD per class (samples asked for class c against the test images of c)");
    ccells[0] = "policy";
    for (int cidx = 0; cidx < K && cidx < MAX_CLASSES; cidx++) {
        snprintf(cbuf[0][cidx + 1], 32, "class %d", cidx);
        ccells[cidx + 1] = cbuf[0][cidx + 1];
    }
    for (int i = 0; i < n_entries; i++) {
        ccells[(i + 1) * cls_cols] = e[i].name;
        for (int cidx = 0; cidx < K && cidx < MAX_CLASSES; cidx++) {
            snprintf(cbuf[i + 1][cidx + 1], 32, "%.2f", e[i].class_fd[cidx]);
            ccells[(i + 1) * cls_cols + cidx + 1] = cbuf[i + 1][cidx + 1];
        }
    }
    if (K <= MAX_CLASSES)
        ts_report_table(r, cls_cols, n_entries + 1, ccells);
    route_figures(r, e, n_entries);
    ts_report_heading(r, 2, "Samples");
    for (int i = 0; i < n_entries; i++) {
        char cap[256];
        snprintf(cap, sizeof cap, "%s: FD %.3f, %.1f expert evaluations per sample", e[i].name,
                 e[i].fd, e[i].evals);
        ts_report_heading(r, 3, e[i].name);
        ts_report_png_grid(r, e[i].grid, grid_n, c->in_channels, c->input_size, c->input_size, 10,
                           cap);
    }
    free(buf), free(cells), free(labels), free(fds), free(xs), free(lo), free(hi);
    free(cbuf), free(ccells);
    return ts_report_close(r, err, errlen);
}

/* Splits --monolith's comma-separated list into at most MAX_MONOLITHS paths (copy: modified). */
static int split_monoliths(char *copy, const char **paths, int *n) {
    *n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_MONOLITHS)
            return TS_EINVAL;
        paths[(*n)++] = tok;
    }
    return *n > 0 ? TS_OK : TS_EINVAL;
}

int ts_cmd_eval(int argc, char **argv) {
    const char *dir = NULL, *classifier = NULL, *monolith = NULL, *policies = DEFAULT_POLICIES;
    const char *sampler = "heun", *report = NULL, *fmnist_dir = TS_FMNIST_DEFAULT_DIR;
    const char *save_dir = NULL;
    int n = 1000, steps = 30, threads = 0, json = 0, grid_n = 100, ref_n = 0, boot = 200;
    int pr_k = 3;
    float cfg = 1.0f, tau = 0.0f;
    uint64_t seed = 0;
    /* clang-format off */
    ts_arg_t args[] = {
        {"local", TS_ARG_STRING, &dir, "DIR", "the generation folder of `tessera generate --local` (experts, partition, router)", 0, 0, 1},
        {"classifier", TS_ARG_STRING, &classifier, "FILE", "the evaluation classifier (`tessera train-classifier`)", 0, 0, 1},
        {"monolith", TS_ARG_STRING, &monolith, "FILE[,FILE…]", "models trained on all the data: the entries 'monolith', 'monolith2', … in this order"},
        {"policies", TS_ARG_STRING, &policies, "LIST", "entries separated by spaces: monolith[N], or POLICY[+prior][+hold|+draw][+exact][+temp=T][:SELECTION] as in tessera generate (default: \"" DEFAULT_POLICIES "\")"},
        {"n", TS_ARG_INT, &n, "N", "samples per entry (default 1000)", 2, 1000000},
        {"steps", TS_ARG_INT, &steps, "S", "integration steps (default 30)", 1, 10000},
        {"sampler", TS_ARG_STRING, &sampler, "NAME", "euler or heun (default heun)"},
        {"cfg", TS_ARG_FLOAT, &cfg, "S", "classifier-free guidance scale inside each expert, 1 = off (default 1)", 0, 100},
        {"tau", TS_ARG_FLOAT, &tau, "T", "temperature of centroid/confidence (default: the partition's)", 0, 1e30},
        {"seed", TS_ARG_U64, &seed, "S", "sample i uses noise stream seed+i (default 0)"},
        {"ref-n", TS_ARG_INT, &ref_n, "N", "reference images from the test split (default all 10000)", 2, 1000000},
        {"bootstrap", TS_ARG_INT, &boot, "B", "resamples for the 95 % intervals, 0 = none (default 200)", 0, 100000},
        {"pr-k", TS_ARG_INT, &pr_k, "K", "the k of precision/recall's k-nearest-neighbour radii (default 3)", 1, 100},
        {"save-samples", TS_ARG_STRING, &save_dir, "DIR", "write each entry's samples as IDX files (Fashion-MNIST's format) into DIR"},
        {"data", TS_ARG_STRING, &fmnist_dir, "DIR", "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"report", TS_ARG_STRING, &report, "FILE", "write a self-contained HTML report (table, frontier, per-class FD, sample grids)"},
        {"grid", TS_ARG_INT, &grid_n, "N", "samples per grid in the report (default 100)", 1, 10000},
        {"json", TS_ARG_FLAG, &json, NULL, "print the results as one JSON object on stdout instead of the table"},
        {"threads", TS_ARG_INT, &threads, "N", "compute threads (default: all cores)", 0, 1024},
    };
    /* clang-format on */
    ts_arg_t *tau_arg = &args[8];
    int pr = ts_args_parse(PROG,
                           "Compare routing policies (and monoliths) by the Fréchet distance of "
                           "their samples to the test set in the evaluation classifier's feature "
                           "space, with bootstrap intervals, precision/recall, Inception Score, "
                           "per-class and per-cluster FD, class coverage and expert evaluations "
                           "per sample.",
                           args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr)
        return pr == 1 ? 0 : 2;
    char err[1024] = "";
    entry_t *e = calloc(MAX_ENTRIES, sizeof *e);
    int n_entries = 0, n_mono = 0;
    const char *mono_paths[MAX_MONOLITHS];
    char *mono_copy = monolith ? strdup(monolith) : NULL;
    ts_sampler_opts_t so = {.steps = steps};
    if (!e || (monolith && !mono_copy)) {
        free(e);
        free(mono_copy);
        return 1;
    }
    int usage_rc = 0;
    if (parse_entries(policies, e, &n_entries, err, sizeof err) != TS_OK) {
        fprintf(stderr, PROG ": %s\n", err);
        usage_rc = 2;
    } else if (ts_sampler_parse(sampler, &so.kind) != TS_OK) {
        fprintf(stderr, PROG ": --sampler %s: must be euler or heun\n", sampler);
        usage_rc = 2;
    } else if (mono_copy && split_monoliths(mono_copy, mono_paths, &n_mono) != TS_OK) {
        fprintf(stderr, PROG ": --monolith %s: want 1 to %d files separated by commas\n", monolith,
                MAX_MONOLITHS);
        usage_rc = 2;
    } else if (tau_arg->seen && !(tau > 0.0f)) {
        fprintf(stderr, PROG ": --tau %g: must be > 0\n", (double)tau);
        usage_rc = 2;
    } else if (n <= pr_k) {
        fprintf(stderr, PROG ": --n %d: want more samples than --pr-k (%d)\n", n, pr_k);
        usage_rc = 2;
    } else if (boot == 1) {
        fprintf(stderr, PROG ": --bootstrap 1: want 0 (none) or at least 2 resamples\n");
        usage_rc = 2;
    }
    for (int i = 0; i < n_entries && !usage_rc; i++)
        if (e[i].monolith > n_mono) {
            fprintf(stderr, PROG ": the entry '%s' needs %d file%s in --monolith (%d given)\n",
                    e[i].name, e[i].monolith, e[i].monolith > 1 ? "s" : "", n_mono);
            usage_rc = 2;
        }
    if (usage_rc) {
        free(e);
        free(mono_copy);
        return usage_rc;
    }
    if (grid_n > n)
        grid_n = n;

    ts_engine_t eng = {0};
    ts_engine_opts_t eo = {TS_CPU, threads, 0};
    ts_local_t loc = {0}, mono[MAX_MONOLITHS];
    memset(mono, 0, sizeof mono);
    ts_classifier_t *cls = NULL;
    ts_dataset_t test = {0}, train = {0};
    float *images = NULL, *feat = NULL, *ref_feat = NULL, *logits = NULL;
    int32_t *pred = NULL, *labels = NULL, *cluster = NULL, *ref_cluster = NULL, *scratch = NULL;
    uint64_t *seeds = NULL;
    double *mu_ref = NULL, *cov_ref = NULL, *cmu = NULL, *ccov = NULL, *kmu = NULL, *kcov = NULL;
    int64_t ccount[MAX_CLASSES] = {0}, kcount[MAX_CLUSTERS] = {0};
    float *log_prior = NULL;
    char **sample_paths = calloc(MAX_ENTRIES + 1, sizeof *sample_paths);
    int chunk = n < CHUNK ? n : CHUNK, pairs = cfg != 1.0f ? 2 : 1, usage = 0;
    entry_t floor_row = {.agreement = NAN};
    snprintf(floor_row.name, sizeof floor_row.name, "train data (the floor at this n)");
    int rc = sample_paths ? ts_engine_init(&eng, &eo) : TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_local_open(&loc, dir, &eng, chunk, pairs, 1, PROG, err, sizeof err);
    for (int m = 0; m < n_mono && rc == TS_OK; m++)
        rc = ts_local_open_file(&mono[m], mono_paths[m], &eng, chunk, pairs, err, sizeof err);
    for (int i = 0; i < n_entries && rc == TS_OK; i++)
        if (!e[i].monolith)
            rc = ts_local_check_policy(&loc, e[i].policy, PROG, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_classifier_open(&cls, classifier, &eng, CHUNK, err, sizeof err);
    if (rc == TS_OK && ts_classifier_time_conditioned(cls)) {
        ts_set_err(err, sizeof err,
                   "--classifier %s is a router (time-conditioned); want the evaluation "
                   "classifier of `tessera train-classifier`",
                   classifier);
        rc = TS_EINVAL;
        usage = 1;
    }
    if (rc == TS_OK)
        rc = ts_fmnist_load(fmnist_dir, "test", &test, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_fmnist_load(fmnist_dir, "train", &train, err, sizeof err);
    if (rc != TS_OK)
        goto done;
    const ts_dit_config_t *c = &loc.ex.models[0].cfg;
    for (int m = 0; m < n_mono; m++) {
        const ts_dit_config_t *mc = &mono[m].ex.models[0].cfg;
        if (mc->input_size != c->input_size || mc->in_channels != c->in_channels ||
            mc->num_classes != c->num_classes) {
            ts_set_err(err, sizeof err, "--monolith %s makes other images than the experts of %s",
                       mono_paths[m], dir);
            rc = TS_EINVAL;
            goto done;
        }
    }
    if (test.channels != c->in_channels || test.height != c->input_size ||
        test.width != c->input_size) {
        ts_set_err(err, sizeof err, "the experts of %s do not make %dx%dx%d images", dir,
                   test.channels, test.height, test.width);
        rc = TS_EINVAL;
        goto done;
    }
    int wants_prior = 0;
    for (int i = 0; i < n_entries; i++)
        wants_prior |= e[i].prior && !e[i].monolith;
    if (wants_prior && (rc = ts_local_class_prior(&loc, train.labels, train.n, c->num_classes,
                                                  &log_prior, err, sizeof err)) != TS_OK)
        goto done;
    if (!ref_n || ref_n > test.n)
        ref_n = test.n;
    if (n > train.n)
        n = train.n; /* the floor row takes n train images */
    int D = ts_classifier_feature_dim(cls), K = ts_classifier_num_outputs(cls);
    int C = c->in_channels, S = c->input_size;
    int Kp = loc.has_part ? loc.part.K : 0;
    if (K > MAX_CLASSES || Kp > MAX_CLUSTERS) {
        ts_set_err(err, sizeof err, "%d classes or %d clusters: at most %d and %d are scored", K,
                   Kp, MAX_CLASSES, MAX_CLUSTERS);
        rc = TS_EINVAL;
        goto done;
    }
    int64_t chw = (int64_t)C * S * S;
    int rows = ref_n > n ? ref_n : n;
    images = malloc((size_t)(rows * chw) * sizeof *images);
    feat = malloc((size_t)n * D * sizeof *feat);
    ref_feat = malloc((size_t)ref_n * D * sizeof *ref_feat);
    logits = malloc((size_t)rows * K * sizeof *logits);
    pred = malloc((size_t)rows * sizeof *pred);
    labels = malloc((size_t)n * sizeof *labels);
    cluster = malloc((size_t)n * sizeof *cluster);
    ref_cluster = malloc((size_t)ref_n * sizeof *ref_cluster);
    scratch = malloc((size_t)n * sizeof *scratch);
    seeds = malloc((size_t)n * sizeof *seeds);
    mu_ref = malloc((size_t)D * sizeof *mu_ref);
    cov_ref = malloc((size_t)D * D * sizeof *cov_ref);
    cmu = calloc((size_t)K * D, sizeof *cmu);
    ccov = calloc((size_t)K * D * D, sizeof *ccov);
    kmu = calloc((size_t)(Kp ? Kp : 1) * D, sizeof *kmu);
    kcov = calloc((size_t)(Kp ? Kp : 1) * D * D, sizeof *kcov);
    if (!images || !feat || !ref_feat || !logits || !pred || !labels || !cluster || !ref_cluster ||
        !scratch || !seeds || !mu_ref || !cov_ref || !cmu || !ccov || !kmu || !kcov) {
        rc = TS_ENOMEM;
        goto done;
    }
    for (int i = 0; i < n_entries; i++)
        if (!(e[i].grid = malloc((size_t)(grid_n * chw) * sizeof(float))) ||
            (!e[i].monolith && route_alloc(&e[i].route, 2 * steps + 2, n) != TS_OK)) {
            rc = TS_ENOMEM;
            goto done;
        }

    /* the reference: the test split's features, overall, per class and per cluster */
    fprintf(stderr,
            PROG ": %d entries × %d samples, %d %s steps, cfg %g; reference: %d test images; "
                 "%d bootstrap resamples\n",
            n_entries, n, steps, sampler, (double)cfg, ref_n, boot);
    memcpy(images, test.images, (size_t)(ref_n * chw) * sizeof *images);
    rc = classify(cls, &eng, images, ref_n, C, S, S, ref_feat, logits, pred);
    if (rc == TS_OK)
        rc = ts_gauss_fit(ref_feat, ref_n, D, mu_ref, cov_ref, err, sizeof err);
    if (rc == TS_OK)
        rc = group_fits(ref_feat, test.labels, ref_n, K, D, cmu, ccov, ccount, err, sizeof err);
    if (rc == TS_OK && Kp)
        rc = clusters_of(&loc.part, images, ref_n, ref_cluster);
    if (rc == TS_OK && Kp)
        rc = group_fits(ref_feat, ref_cluster, ref_n, Kp, D, kmu, kcov, kcount, err, sizeof err);
    if (rc != TS_OK)
        goto done;
    scoring_t sc = {.n = n,
                    .D = D,
                    .K = K,
                    .B = boot,
                    .mu = mu_ref,
                    .cov = cov_ref,
                    .cmu = cmu,
                    .ccov = ccov,
                    .ccount = ccount,
                    .Kp = Kp,
                    .part = Kp ? &loc.part : NULL,
                    .kmu = kmu,
                    .kcov = kcov,
                    .kcount = kcount,
                    .ref_n = ref_n,
                    .pr_ref = ref_feat,
                    .pr_n = n < ref_n ? n : ref_n,
                    .pr_k = pr_k,
                    .idx = scratch};
    /* the floor: n train images through the same pipeline */
    for (int i = 0; i < n; i++)
        labels[i] = train.labels[i];
    memcpy(images, train.images, (size_t)(n * chw) * sizeof *images);
    quantise(images, n * chw);
    rc = classify(cls, &eng, images, n, C, S, S, feat, logits, pred);
    if (rc == TS_OK && Kp)
        rc = clusters_of(&loc.part, images, n, cluster);
    if (rc == TS_OK)
        rc = score(&sc, feat, logits, pred, labels, cluster, &floor_row, err, sizeof err);
    if (rc != TS_OK)
        goto done;

    for (int i = 0; i < n; i++) {
        labels[i] = i % c->num_classes;
        seeds[i] = seed + (uint64_t)i;
    }
    float tau_used = tau_arg->seen ? tau : ts_local_default_tau(&loc);
    progress_t prog = {isatty(STDERR_FILENO), 0, 0, NULL};
    for (int i = 0; i < n_entries && rc == TS_OK; i++) {
        entry_t *x = &e[i];
        ts_local_t *l = x->monolith ? &mono[x->monolith - 1] : &loc;
        prog.name = x->name;
        prog.done = 0;
        prog.total = steps * ((n + chunk - 1) / chunk);
        ts_local_gen_t g = {.policy = x->monolith ? TS_POLICY_UNIFORM : x->policy,
                            .select = x->select,
                            .tau = tau_used,
                            .cfg = cfg,
                            .log_prior = x->prior ? log_prior : NULL,
                            .hold = x->monolith ? TS_HOLD_NONE : x->hold,
                            .exact_guidance = x->exact,
                            .router_temp = x->temp,
                            .record = !x->monolith,
                            .on_chunk = x->monolith ? NULL : route_chunk,
                            .chunk_ctx = &x->route,
                            .sampler = so,
                            .n = n,
                            .labels = labels,
                            .seeds = seeds,
                            .on_step = on_step,
                            .step_ctx = &prog};
        if (x->monolith)
            ts_selection_parse("top1", &g.select, NULL, 0);
        ts_local_stats_t st = {0};
        rc = ts_local_generate(l, &eng, &g, images, &st, err, sizeof err);
        if (prog.tty)
            fprintf(stderr, "\r%60s\r", "");
        if (rc != TS_OK)
            break;
        quantise(images, n * chw);
        memcpy(x->grid, images, (size_t)(grid_n * chw) * sizeof(float));
        if (save_dir) {
            char prefix[160], path[1400];
            file_prefix(x->name, prefix, sizeof prefix);
            rc = ts_idx_write(save_dir, prefix, images, labels, n, S, S, err, sizeof err);
            snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", save_dir, prefix);
            if (rc == TS_OK && !(sample_paths[i] = strdup(path)))
                rc = TS_ENOMEM;
            if (rc != TS_OK)
                break;
        }
        rc = classify(cls, &eng, images, n, C, S, S, feat, logits, pred);
        if (rc == TS_OK && Kp)
            rc = clusters_of(&loc.part, images, n, cluster);
        if (rc == TS_OK)
            rc = score(&sc, feat, logits, pred, labels, cluster, x, err, sizeof err);
        if (rc == TS_OK && i == 0 && x->boot) {
            sc.first_boot = x->boot;
            sc.first_fd = x->fd;
        }
        x->evals = (double)st.forwards / n;
        x->router_evals = (double)st.router_evals / n;
        x->seconds = st.seconds;
        if (rc == TS_OK)
            fprintf(stderr,
                    "%-40s FD %.3f [%.3f, %.3f]  precision %.3f  recall %.3f  IS %.2f  "
                    "agreement %.3f  %.1f evals/sample  %.1f s\n",
                    x->name, x->fd, x->fd_lo, x->fd_hi, x->precision, x->recall, x->is,
                    x->agreement, x->evals, x->seconds);
    }
    if (rc != TS_OK)
        goto done;

    char setup[1536];
    snprintf(setup, sizeof setup,
             "%d samples per entry (sample i: noise stream %llu + i, class i mod %d), %d %s steps, "
             "CFG %g, experts from %s (K = %d)%s%s; reference: %d images of the test split; "
             "features: %s (%d dims). Intervals: 95 %%, %d bootstrap resamples of the samples "
             "(the same for every entry), bias-corrected percentile. FD is biased upward at "
             "small n; the first row is the FD of %d train images, what a perfect generator "
             "would score.",
             n, (unsigned long long)seed, c->num_classes, steps, sampler, (double)cfg, dir,
             loc.ex.K, n_mono ? ", monoliths " : "", n_mono ? monolith : "", ref_n, classifier, D,
             boot, n);
    if (report && (rc = write_report(report, e, n_entries, &floor_row, setup, grid_n, K, c, err,
                                     sizeof err)) != TS_OK)
        goto done;
    if (json) {
        json_t *list = json_array();
        const char *first = n_entries ? e[0].name : NULL;
        json_array_append_new(list, entry_json(&floor_row, K, Kp, NULL, NULL));
        for (int i = 0; i < n_entries; i++)
            json_array_append_new(list,
                                  entry_json(&e[i], K, Kp, i ? first : NULL, sample_paths[i]));
        json_t *ref_share = json_array();
        for (int k = 0; k < Kp; k++)
            json_array_append_new(ref_share, json_real((double)kcount[k] / ref_n));
        json_t *root =
            json_pack("{s:i, s:i, s:s, s:f, s:I, s:i, s:i, s:i, s:s, s:i, s:s*, s:s*, "
                      "s:s*, s:o, s:o}",
                      "n", n, "steps", steps, "sampler", sampler, "cfg", (double)cfg, "seed",
                      (json_int_t)seed, "ref_n", ref_n, "bootstrap", boot, "pr_k", pr_k, "local",
                      dir, "experts", loc.ex.K, "monolith", monolith, "report", report,
                      "classifier", classifier, "cluster_ref_share", ref_share, "entries", list);
        if (root) {
            json_dumpf(root, stdout, JSON_COMPACT);
            printf("\n");
        }
        json_decref(root);
    } else {
        print_table(e, n_entries, &floor_row, boot >= 2);
    }
    if (report)
        fprintf(stderr, PROG ": report → %s\n", report);
    if (save_dir)
        fprintf(stderr, PROG ": samples → %s\n", save_dir);

done:
    if (rc != TS_OK)
        fprintf(stderr, PROG ": %s%s%s\n", err, *err ? ": " : "", ts_strerror(rc));
    for (int i = 0; i < n_entries; i++) {
        free(e[i].grid);
        free(e[i].boot);
        route_free(&e[i].route);
    }
    for (int i = 0; sample_paths && i < MAX_ENTRIES; i++)
        free(sample_paths[i]);
    free(sample_paths);
    free(floor_row.boot);
    free(e);
    free(mono_copy);
    free(images), free(feat), free(ref_feat), free(logits), free(pred), free(labels);
    free(cluster), free(ref_cluster), free(scratch), free(seeds);
    free(mu_ref), free(cov_ref), free(cmu), free(ccov), free(kmu), free(kcov);
    free(log_prior);
    ts_dataset_free(&test);
    ts_dataset_free(&train);
    ts_classifier_free(cls);
    for (int m = 0; m < MAX_MONOLITHS; m++)
        ts_local_free(&mono[m]);
    ts_local_free(&loc);
    ts_engine_free(&eng);
    return rc == TS_OK ? 0 : usage ? 2 : 1;
}
