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
 * trajectory rather than per step; POLICY+until=T routes every step while t > T, then keeps the
 * last weights. POLICY+exact (with --cfg ≠ 1) guides with the exact mixture:
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
 *
 * This file is the verb (options, entries, models, the run); the statistics of an entry are
 * eval_score.c's, its routing along t eval_route.c's, and the table, JSON and HTML report
 * eval_report.c's (eval_internal.h holds what they share).
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/args.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/eval_internal.h"
#include "client/judges.h"
#include "client/local.h"
#include "model/classifier.h"
#include "model/fmnist.h"
#include "model/metrics.h"

#define PROG "tessera eval"
#define MAX_MONOLITHS 8
#define MONOLITH "monolith"
#define DEFAULT_POLICIES                                                                           \
    "monolith learned:top1 learned:top2 uniform:full learned:full learned:threshold=0.9 "          \
    "learned:t>0.7:full,t>0.3:top2,top1 centroid:top1 confidence:top1"

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
            else if (strncmp(plus, "+until=", 7) == 0 && !x->hold) {
                char *end = NULL;
                double v = strtod(plus + 7, &end);
                if (end == plus + 7 || *end || !(v > 0.0 && v < 1.0))
                    bad_mod = 1;
                x->hold = TS_HOLD_BELOW;
                x->hold_t = (float)v;
            } else if (strcmp(plus, "+exact") == 0)
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
                       "each optionally +prior, +hold, +draw or +until=T (0 < T < 1), +exact, "
                       "+temp=T with T > 0, or "
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

/* ---- the verb: parse → validate → run → print ---------------------------------------------- */

typedef struct {
    const char *dir, *classifier, *monolith, *policies, *sampler, *report, *fmnist_dir;
    const char *save_dir, *judges;
    int n, steps, threads, json, grid_n, ref_n, boot, pr_k, tau_set;
    ts_device_spec_t device;  /* --device (zeroed: the CPU) */
    ts_precision_t precision; /* --precision (zeroed: f32): experts and monoliths */
    const char *attention;    /* --attention (NULL: each model's default): experts and monoliths */
    float cfg, tau;
    uint64_t seed;
} eval_opts_t;

/* Everything one run opens and allocates (eval_free releases it all). */
typedef struct {
    eval_opts_t o;
    entry_t *e, floor_row;
    int n_entries, n_mono;
    const char *mono_paths[MAX_MONOLITHS];
    char *mono_copy;
    ts_sampler_opts_t so;
    ts_engine_t eng;
    ts_local_t loc, mono[MAX_MONOLITHS];
    ts_classifier_t *cls;
    ts_dataset_t test, train;
    float *images, *feat, *ref_feat, *logits, *log_prior;
    int32_t *pred, *labels, *cluster, *ref_cluster, *scratch;
    uint64_t *seeds;
    double *mu_ref, *cov_ref, *cmu, *ccov, *kmu, *kcov;
    int64_t ccount[MAX_CLASSES], kcount[MAX_CLUSTERS];
    char **sample_paths;
    scoring_t sc;
    /* --judges: each judge's features of every entry's samples, then their scores */
    ts_cli_judge_t jd[TS_CLI_MAX_JUDGES];
    ts_engine_t jeng; /* the judges' CPU engine when the run's is a GPU's (has_jeng) */
    int n_judges, has_jeng;
    char *judges_copy;
    float *jfeat[TS_CLI_MAX_JUDGES][MAX_ENTRIES];
    ts_space_score_t *jsc; /* (n_judges, n_entries) */
    int chunk, pairs, D, K, C, S, Kp, usage;
    int64_t chw;
    char err[1024];
} eval_run_t;

/* The options from the command line: TS_ARGS_RUN, or the exit code (ts_args_parse). */
static int parse_opts(int argc, char **argv, eval_opts_t *o) {
    *o = (eval_opts_t){.policies = DEFAULT_POLICIES,
                       .sampler = "heun",
                       .fmnist_dir = TS_FMNIST_DEFAULT_DIR,
                       .n = 1000,
                       .steps = 30,
                       .grid_n = 100,
                       .boot = 200,
                       .pr_k = 3,
                       .cfg = 1.0f};
    /* clang-format off */
    o->device = (ts_device_spec_t){.automatic = 1}; /* as tesserad: a GPU when there is one */
    ts_arg_t args[] = {
        {"local", TS_ARG_STRING, &o->dir, "DIR", "the generation folder of `tessera generate --local` (experts, partition, router)", 0, 0, 1},
        {"classifier", TS_ARG_STRING, &o->classifier, "FILE", "the evaluation classifier (`tessera train-classifier`)", 0, 0, 1},
        {"monolith", TS_ARG_STRING, &o->monolith, "FILE[,FILE…]", "models trained on all the data: the entries 'monolith', 'monolith2', … in this order"},
        {"policies", TS_ARG_STRING, &o->policies, "LIST", "entries separated by spaces: monolith[N], or POLICY[+prior][+hold|+draw][+exact][+temp=T][:SELECTION] as in tessera generate (default: \"" DEFAULT_POLICIES "\")"},
        {"n", TS_ARG_INT, &o->n, "N", "samples per entry (default 1000)", 2, 1000000},
        {"steps", TS_ARG_INT, &o->steps, "S", "integration steps (default 30)", 1, 10000},
        {"sampler", TS_ARG_STRING, &o->sampler, "NAME", "euler, heun, ddim or ddpm (default heun; a DDPM expert needs ddim or ddpm)"},
        {"cfg", TS_ARG_FLOAT, &o->cfg, "S", "classifier-free guidance scale inside each expert, 1 = off (default 1)", 0, 100},
        {"tau", TS_ARG_FLOAT, &o->tau, "T", "temperature of centroid/confidence (default: the partition's)", 0, 1e30},
        {"seed", TS_ARG_U64, &o->seed, "S", "sample i uses noise stream seed+i (default 0)"},
        {"ref-n", TS_ARG_INT, &o->ref_n, "N", "reference images from the test split (default all 10000)", 2, 1000000},
        {"bootstrap", TS_ARG_INT, &o->boot, "B", "resamples for the 95 % intervals, 0 = none (default 200)", 0, 100000},
        {"pr-k", TS_ARG_INT, &o->pr_k, "K", "the k of precision/recall's k-nearest-neighbour radii (default 3)", 1, 100},
        {"judges", TS_ARG_STRING, &o->judges, "FILE,...", "further feature spaces: judges of `tessera train-judge` (or other classifiers); every entry is also scored in each (FD and KID with paired intervals, precision, recall), side by side, with where they all agree"},
        {"save-samples", TS_ARG_STRING, &o->save_dir, "DIR", "write each entry's samples as IDX files (Fashion-MNIST's format) into DIR"},
        {"data", TS_ARG_STRING, &o->fmnist_dir, "DIR", "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"report", TS_ARG_STRING, &o->report, "FILE", "write a self-contained HTML report (table, frontier, per-class FD, sample grids)"},
        {"grid", TS_ARG_INT, &o->grid_n, "N", "samples per grid in the report (default 100)", 1, 10000},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print the results as one JSON object on stdout instead of the table"},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"device", TS_ARG_DEVICE, &o->device, "NAME", "where to compute: " TS_DEVICE_SPEC_HELP " (default auto)"},
        {"precision", TS_ARG_PRECISION, &o->precision, "P", "the experts' and monoliths' matrix products in " TS_PRECISION_HELP "; the classifier and the router stay f32"},
        {"attention", TS_ARG_STRING, &o->attention, "A", "the experts' and monoliths' attention: " TS_CLI_ATTENTION_HELP},
    };
    /* clang-format on */
    int n = (int)(sizeof args / sizeof args[0]);
    int pr = ts_args_parse(PROG,
                           "Compare routing policies (and monoliths) by the Fréchet distance of "
                           "their samples to the test set in the evaluation classifier's feature "
                           "space, with bootstrap intervals, precision/recall, Inception Score, "
                           "per-class and per-cluster FD, class coverage and expert evaluations "
                           "per sample.\nexample: tessera eval --local experts/demo --classifier "
                           "classifier.safetensors --n 500 --policies \"learned uniform:full\"",
                           args, n, argc, argv);
    o->tau_set = ts_arg_seen(args, n, "tau");
    return pr;
}

/* The checks that need no file: the entries, the sampler, the monoliths, the numbers. 0, or 2
 * with the message printed. */
static int validate(eval_run_t *r) {
    const eval_opts_t *o = &r->o;
    r->so = (ts_sampler_opts_t){.steps = o->steps};
    if (parse_entries(o->policies, r->e, &r->n_entries, r->err, sizeof r->err) != TS_OK)
        fprintf(stderr, PROG ": %s\n", r->err);
    else if (ts_sampler_parse(o->sampler, &r->so.kind) != TS_OK)
        fprintf(stderr, PROG ": --sampler %s: must be euler, heun, ddim or ddpm\n", o->sampler);
    else if (r->mono_copy &&
             (r->n_mono = ts_cli_split_list(r->mono_copy, r->mono_paths, MAX_MONOLITHS)) < 1)
        fprintf(stderr, PROG ": --monolith %s: want 1 to %d files separated by commas\n",
                o->monolith, MAX_MONOLITHS);
    else if (o->tau_set && !(o->tau > 0.0f))
        fprintf(stderr, PROG ": --tau %g: must be > 0\n", (double)o->tau);
    else if (o->n <= o->pr_k)
        fprintf(stderr, PROG ": --n %d: want more samples than --pr-k (%d)\n", o->n, o->pr_k);
    else if (o->boot == 1)
        fprintf(stderr, PROG ": --bootstrap 1: want 0 (none) or at least 2 resamples\n");
    else if (o->judges && o->n < TS_SPACE_SCORE_MIN_N)
        fprintf(stderr, PROG ": --judges scores sets of %d samples at least; --n is %d\n",
                TS_SPACE_SCORE_MIN_N, o->n);
    else if (!ts_cli_attention_ok(o->attention, PROG))
        ; /* said */
    else {
        for (int i = 0; i < r->n_entries; i++)
            if (r->e[i].monolith > r->n_mono) {
                fprintf(stderr, PROG ": the entry '%s' needs %d file%s in --monolith (%d given)\n",
                        r->e[i].name, r->e[i].monolith, r->e[i].monolith > 1 ? "s" : "", r->n_mono);
                return 2;
            }
        return 0;
    }
    return 2;
}

/* Monoliths and data make the experts' images; the class prior; the shapes of the run. */
static int check_models(eval_run_t *r) {
    const ts_dit_config_t *c = &r->loc.ex.models[0].cfg;
    int rc = ts_local_check_images(&r->loc, r->o.dir, r->mono, r->mono_paths, r->n_mono, &r->test,
                                   r->err, sizeof r->err);
    if (rc != TS_OK)
        return rc;
    int wants_prior = 0;
    for (int i = 0; i < r->n_entries; i++)
        wants_prior |= r->e[i].prior && !r->e[i].monolith;
    if (wants_prior) {
        rc = ts_local_class_prior(&r->loc, r->train.labels, r->train.n, c->num_classes,
                                  &r->log_prior, r->err, sizeof r->err);
        if (rc != TS_OK)
            return rc;
    }
    if (!r->o.ref_n || r->o.ref_n > r->test.n)
        r->o.ref_n = r->test.n;
    if (r->o.n > r->train.n)
        r->o.n = r->train.n; /* the floor row takes n train images */
    r->D = ts_classifier_feature_dim(r->cls), r->K = ts_classifier_num_outputs(r->cls);
    r->C = c->in_channels, r->S = c->input_size;
    r->Kp = r->loc.has_part ? r->loc.part.K : 0;
    r->chw = (int64_t)r->C * r->S * r->S;
    if (r->K > MAX_CLASSES || r->Kp > MAX_CLUSTERS) {
        ts_set_err(r->err, sizeof r->err, "%d classes or %d clusters: at most %d and %d are scored",
                   r->K, r->Kp, MAX_CLASSES, MAX_CLUSTERS);
        return TS_EINVAL;
    }
    return TS_OK;
}

static ts_engine_t *judge_engine(eval_run_t *r) { return r->has_jeng ? &r->jeng : &r->eng; }

/* The engine, the experts, the monoliths, the classifier and the data, checked against each
 * other; the class prior when an entry wants it. */
static int open_models(eval_run_t *r) {
    const eval_opts_t *o = &r->o;
    char *err = r->err;
    size_t errlen = sizeof r->err;
    int rc = ts_cli_engine(&r->eng, &o->device, o->threads, PROG, err, errlen);
    if (rc == TS_OK)
        rc = ts_local_open(&r->loc, o->dir, &r->eng, r->chunk, r->pairs, 1, PROG, err, errlen);
    for (int m = 0; m < r->n_mono && rc == TS_OK; m++)
        rc = ts_local_open_file(&r->mono[m], r->mono_paths[m], &r->eng, r->chunk, r->pairs, err,
                                errlen);
    if (rc == TS_OK)
        rc = ts_local_set_precision(&r->loc, o->precision, PROG, err, errlen);
    for (int m = 0; m < r->n_mono && rc == TS_OK; m++)
        rc = ts_local_set_precision(&r->mono[m], o->precision, r->loc.ex.K ? NULL : PROG, err,
                                    errlen); /* announced once */
    if (rc == TS_OK)
        rc = ts_local_set_attention(&r->loc, o->attention, PROG, err, errlen);
    for (int m = 0; m < r->n_mono && rc == TS_OK; m++) {
        char who[48];
        snprintf(who, sizeof who, PROG ": monolith %d", m + 1);
        rc = ts_local_set_attention(&r->mono[m], o->attention, who, err, errlen);
    }
    if (rc == TS_OK)
        rc = ts_local_check_sampler(&r->loc, r->so.kind, o->sampler, err, errlen);
    for (int m = 0; m < r->n_mono && rc == TS_OK; m++)
        rc = ts_local_check_sampler(&r->mono[m], r->so.kind, o->sampler, err, errlen);
    for (int i = 0; i < r->n_entries && rc == TS_OK; i++)
        if (!r->e[i].monolith)
            rc = ts_local_check_policy(&r->loc, r->e[i].policy, PROG, err, errlen);
    if (rc == TS_OK)
        rc = ts_classifier_open(&r->cls, o->classifier, &r->eng, CHUNK, err, errlen);
    if (rc == TS_OK && ts_classifier_time_conditioned(r->cls)) {
        ts_set_err(err, errlen,
                   "--classifier %s is a router (time-conditioned); want the evaluation "
                   "classifier of `tessera train-classifier`",
                   o->classifier);
        r->usage = 1;
        return TS_EINVAL;
    }
    const char *jpath[TS_CLI_MAX_JUDGES];
    if (rc == TS_OK && o->judges) {
        r->judges_copy = strdup(o->judges);
        r->n_judges =
            r->judges_copy ? ts_cli_split_list(r->judges_copy, jpath, TS_CLI_MAX_JUDGES) : 0;
        if (r->n_judges < 1) {
            ts_set_err(err, errlen, "--judges: want 1 to %d files separated by commas",
                       TS_CLI_MAX_JUDGES);
            r->usage = 1;
            return TS_EINVAL;
        }
    }
    if (rc == TS_OK)
        rc = ts_fmnist_load(o->fmnist_dir, "test", &r->test, err, errlen);
    if (rc == TS_OK)
        rc = ts_fmnist_load(o->fmnist_dir, "train", &r->train, err, errlen);
    if (rc == TS_OK)
        rc = check_models(r);
    /* the judges run on the CPU (model/judge.h): the run's engine when it is one, else their own */
    if (rc == TS_OK && r->n_judges && r->eng.device != TS_CPU) {
        ts_device_spec_t cpu = {.device = TS_CPU};
        if ((rc = ts_cli_engine(&r->jeng, &cpu, o->threads, PROG, err, errlen)) == TS_OK)
            r->has_jeng = 1;
    }
    for (int k = 0; k < r->n_judges && rc == TS_OK; k++)
        rc = ts_cli_judge_open(&r->jd[k], jpath[k], judge_engine(r), CHUNK, r->C, r->S, r->S, err,
                               errlen);
    return rc;
}

static int alloc_buffers(eval_run_t *r) {
    int n = r->o.n, ref_n = r->o.ref_n, D = r->D, K = r->K, Kp1 = r->Kp ? r->Kp : 1;
    int rows = ref_n > n ? ref_n : n;
    r->images = malloc((size_t)(rows * r->chw) * sizeof *r->images);
    r->feat = malloc((size_t)n * D * sizeof *r->feat);
    r->ref_feat = malloc((size_t)ref_n * D * sizeof *r->ref_feat);
    r->logits = malloc((size_t)rows * K * sizeof *r->logits);
    r->pred = malloc((size_t)rows * sizeof *r->pred);
    r->labels = malloc((size_t)n * sizeof *r->labels);
    r->cluster = malloc((size_t)n * sizeof *r->cluster);
    r->ref_cluster = malloc((size_t)ref_n * sizeof *r->ref_cluster);
    r->scratch = malloc((size_t)n * sizeof *r->scratch);
    r->seeds = malloc((size_t)n * sizeof *r->seeds);
    r->mu_ref = malloc((size_t)D * sizeof *r->mu_ref);
    r->cov_ref = malloc((size_t)D * D * sizeof *r->cov_ref);
    r->cmu = calloc((size_t)K * D, sizeof *r->cmu);
    r->ccov = calloc((size_t)K * D * D, sizeof *r->ccov);
    r->kmu = calloc((size_t)Kp1 * D, sizeof *r->kmu);
    r->kcov = calloc((size_t)Kp1 * D * D, sizeof *r->kcov);
    if (!r->images || !r->feat || !r->ref_feat || !r->logits || !r->pred || !r->labels ||
        !r->cluster || !r->ref_cluster || !r->scratch || !r->seeds || !r->mu_ref || !r->cov_ref ||
        !r->cmu || !r->ccov || !r->kmu || !r->kcov)
        return TS_ENOMEM;
    for (int i = 0; i < r->n_entries; i++)
        if (!(r->e[i].grid = malloc((size_t)(r->o.grid_n * r->chw) * sizeof(float))) ||
            (!r->e[i].monolith &&
             ts_eval_route_alloc(&r->e[i].route, 2 * r->o.steps + 2, n) != TS_OK))
            return TS_ENOMEM;
    return TS_OK;
}

/* r->images (n) through the classifier (and the partition) into the scores of x. */
static int score_images(eval_run_t *r, entry_t *x) {
    int n = r->o.n;
    int rc = ts_eval_score_classify(r->cls, &r->eng, r->images, n, r->C, r->S, r->S, r->feat,
                                    r->logits, r->pred);
    if (rc == TS_OK && r->Kp)
        rc = ts_eval_score_clusters(&r->loc.part, r->images, n, r->cluster);
    if (rc == TS_OK)
        rc = ts_eval_score(&r->sc, r->feat, r->logits, r->pred, r->labels, r->cluster, x, r->err,
                           sizeof r->err);
    return rc;
}

/* The reference (the test split's features, overall, per class and per cluster) and the
 * scoring context; then the floor row (n train images through the same pipeline). */
static int fit_reference(eval_run_t *r) {
    int ref_n = r->o.ref_n, n = r->o.n, D = r->D;
    char *err = r->err;
    size_t errlen = sizeof r->err;
    fprintf(stderr,
            PROG ": %d entries × %d samples, %d %s steps, cfg %g; reference: %d test images; "
                 "%d bootstrap resamples\n",
            r->n_entries, n, r->o.steps, r->o.sampler, (double)r->o.cfg, ref_n, r->o.boot);
    memcpy(r->images, r->test.images, (size_t)(ref_n * r->chw) * sizeof *r->images);
    int rc = ts_eval_score_classify(r->cls, &r->eng, r->images, ref_n, r->C, r->S, r->S,
                                    r->ref_feat, r->logits, r->pred);
    if (rc == TS_OK)
        rc = ts_gauss_fit(r->ref_feat, ref_n, D, r->mu_ref, r->cov_ref, err, errlen);
    if (rc == TS_OK)
        rc = ts_eval_score_group_fits(r->ref_feat, r->test.labels, ref_n, r->K, D, r->cmu, r->ccov,
                                      r->ccount, err, errlen);
    if (rc == TS_OK && r->Kp)
        rc = ts_eval_score_clusters(&r->loc.part, r->images, ref_n, r->ref_cluster);
    if (rc == TS_OK && r->Kp)
        rc = ts_eval_score_group_fits(r->ref_feat, r->ref_cluster, ref_n, r->Kp, D, r->kmu, r->kcov,
                                      r->kcount, err, errlen);
    r->sc = (scoring_t){.n = n,
                        .D = D,
                        .K = r->K,
                        .B = r->o.boot,
                        .mu = r->mu_ref,
                        .cov = r->cov_ref,
                        .cmu = r->cmu,
                        .ccov = r->ccov,
                        .ccount = r->ccount,
                        .Kp = r->Kp,
                        .part = r->Kp ? &r->loc.part : NULL,
                        .kmu = r->kmu,
                        .kcov = r->kcov,
                        .kcount = r->kcount,
                        .ref_n = ref_n,
                        .pr_ref = r->ref_feat,
                        .pr_n = n < ref_n ? n : ref_n,
                        .pr_k = r->o.pr_k,
                        .idx = r->scratch};
    for (int i = 0; i < n; i++)
        r->labels[i] = r->train.labels[i];
    memcpy(r->images, r->train.images, (size_t)(n * r->chw) * sizeof *r->images);
    ts_eval_score_quantise(r->images, n * r->chw);
    if (rc == TS_OK)
        rc = score_images(r, &r->floor_row);
    return rc;
}

/* --save-samples: entry i's samples (r->images) as an IDX pair. */
static int save_samples(eval_run_t *r, int i) {
    char prefix[160], path[1400];
    file_prefix(r->e[i].name, prefix, sizeof prefix);
    int rc = ts_fmnist_write(r->o.save_dir, prefix, r->images, r->labels, r->o.n, r->S, r->S,
                             r->err, sizeof r->err);
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", r->o.save_dir, prefix);
    if (rc == TS_OK && !(r->sample_paths[i] = strdup(path)))
        rc = TS_ENOMEM;
    return rc;
}

/* Entry i: its n samples, saved when asked, scored. */
static int run_entry(eval_run_t *r, int i, progress_t *prog) {
    entry_t *x = &r->e[i];
    const eval_opts_t *o = &r->o;
    int n = o->n;
    ts_local_t *l = x->monolith ? &r->mono[x->monolith - 1] : &r->loc;
    prog->name = x->name;
    prog->done = 0;
    prog->total = o->steps * ((n + r->chunk - 1) / r->chunk);
    ts_local_gen_t g = {.policy = x->monolith ? TS_POLICY_UNIFORM : x->policy,
                        .select = x->select,
                        .tau = o->tau_set ? o->tau : ts_local_default_tau(&r->loc),
                        .cfg = o->cfg,
                        .log_prior = x->prior ? r->log_prior : NULL,
                        .hold = x->monolith ? TS_HOLD_NONE : x->hold,
                        .hold_t = x->hold_t,
                        .exact_guidance = x->exact,
                        .router_temp = x->temp,
                        .record = !x->monolith,
                        .on_chunk = x->monolith ? NULL : ts_eval_route_chunk,
                        .chunk_ctx = &x->route,
                        .sampler = r->so,
                        .n = n,
                        .labels = r->labels,
                        .seeds = r->seeds,
                        .on_step = on_step,
                        .step_ctx = prog};
    if (x->monolith)
        ts_selection_parse("top1", &g.select, NULL, 0);
    ts_local_stats_t st = {0};
    int rc = ts_local_generate(l, &r->eng, &g, r->images, &st, r->err, sizeof r->err);
    if (prog->tty)
        fprintf(stderr, "\r%60s\r", "");
    if (rc != TS_OK)
        return rc;
    ts_eval_score_quantise(r->images, n * r->chw);
    memcpy(x->grid, r->images, (size_t)(o->grid_n * r->chw) * sizeof(float));
    if (o->save_dir && (rc = save_samples(r, i)) != TS_OK)
        return rc;
    if ((rc = score_images(r, x)) != TS_OK)
        return rc;
    for (int k = 0; k < r->n_judges && rc == TS_OK; k++) {
        if (!(r->jfeat[k][i] = malloc((size_t)n * r->jd[k].D * sizeof(float))))
            return ts_fail(r->err, sizeof r->err, TS_ENOMEM,
                           "no memory for %s's features of %d "
                           "samples",
                           r->jd[k].path, n);
        if ((rc = ts_cli_judge_features(&r->jd[k], judge_engine(r), r->images, n, r->C, r->S, r->S,
                                        r->jfeat[k][i])) != TS_OK)
            ts_set_err(r->err, sizeof r->err, "%s: the features of '%s' failed: %s", r->jd[k].path,
                       x->name, ts_strerror(rc));
    }
    if (rc != TS_OK)
        return rc;
    if (i == 0 && x->boot) {
        r->sc.first_boot = x->boot;
        r->sc.first_fd = x->fd;
    }
    x->evals = (double)st.forwards / n;
    x->router_evals = (double)st.router_evals / n;
    x->seconds = st.seconds;
    fprintf(stderr,
            "%-40s FD %.3f [%.3f, %.3f]  precision %.3f  recall %.3f  IS %.2f  "
            "agreement %.3f  %.1f evals/sample  %.1f s\n",
            x->name, x->fd, x->fd_lo, x->fd_hi, x->precision, x->recall, x->is, x->agreement,
            x->evals, x->seconds);
    return TS_OK;
}

/* --judges: every entry scored in each judge's space against the reference (the test split's
 * first ref_n images). */
static int score_judges(eval_run_t *r) {
    int E = r->n_entries, ref_n = r->o.ref_n;
    if (!r->n_judges || !E)
        return TS_OK;
    if (!(r->jsc = calloc((size_t)(r->n_judges * E), sizeof *r->jsc)))
        return ts_fail(r->err, sizeof r->err, TS_ENOMEM, "no memory for the judges' scores");
    int64_t n[MAX_ENTRIES];
    for (int i = 0; i < E; i++)
        n[i] = r->o.n;
    int rc = TS_OK;
    for (int k = 0; k < r->n_judges && rc == TS_OK; k++) {
        float *ref = malloc((size_t)ref_n * r->jd[k].D * sizeof *ref);
        rc = ref ? ts_cli_judge_features(&r->jd[k], judge_engine(r), r->test.images, ref_n, r->C,
                                         r->S, r->S, ref)
                 : TS_ENOMEM;
        if (rc != TS_OK)
            ts_set_err(r->err, sizeof r->err, "%s: the reference's features: %s", r->jd[k].path,
                       ts_strerror(rc));
        if (rc == TS_OK)
            rc =
                ts_space_score((const float *const *)r->jfeat[k], n, E, ref, ref_n, r->jd[k].D,
                               r->o.boot, r->o.pr_k, r->jsc + (size_t)k * E, r->err, sizeof r->err);
        free(ref);
    }
    return rc;
}

static void print_json(const eval_run_t *r) {
    const eval_opts_t *o = &r->o;
    json_t *list = json_array();
    const char *first = r->n_entries ? r->e[0].name : NULL;
    json_array_append_new(list, ts_eval_report_entry_json(&r->floor_row, r->K, r->Kp, NULL, NULL));
    for (int i = 0; i < r->n_entries; i++)
        json_array_append_new(
            list,
            ts_eval_report_entry_json(&r->e[i], r->K, r->Kp, i ? first : NULL, r->sample_paths[i]));
    json_t *ref_share = json_array();
    for (int k = 0; k < r->Kp; k++)
        json_array_append_new(ref_share, json_real((double)r->kcount[k] / o->ref_n));
    json_t *root = json_pack(
        "{s:i, s:i, s:s, s:f, s:I, s:i, s:i, s:i, s:s, s:i, s:s*, s:s*, s:s*, s:o, s:o}", "n", o->n,
        "steps", o->steps, "sampler", o->sampler, "cfg", (double)o->cfg, "seed",
        (json_int_t)o->seed, "ref_n", o->ref_n, "bootstrap", o->boot, "pr_k", o->pr_k, "local",
        o->dir, "experts", r->loc.ex.K, "monolith", o->monolith, "report", o->report, "classifier",
        o->classifier, "cluster_ref_share", ref_share, "entries", list);
    if (root)
        json_object_set_new(root, "precision", json_string(ts_precision_name(o->precision)));
    if (root && r->n_judges) {
        char *names[MAX_ENTRIES];
        int64_t n[MAX_ENTRIES];
        for (int i = 0; i < r->n_entries; i++)
            names[i] = (char *)r->e[i].name, n[i] = o->n;
        json_object_set_new(root, "judges",
                            ts_cli_judges_json("test", o->boot, o->pr_k, names, r->n_entries, r->jd,
                                               r->n_judges, r->jsc, n, o->ref_n));
    }
    if (root) {
        json_dumpf(root, stdout, JSON_COMPACT);
        printf("\n");
    }
    json_decref(root);
}

/* The report (with --report), then the JSON object or the table. */
static int print_results(eval_run_t *r) {
    const eval_opts_t *o = &r->o;
    const ts_dit_config_t *c = &r->loc.ex.models[0].cfg;
    char setup[1536];
    snprintf(setup, sizeof setup,
             "%d samples per entry (sample i: noise stream %llu + i, class i mod %d), %d %s steps, "
             "CFG %g, experts from %s (K = %d)%s%s; reference: %d images of the test split; "
             "features: %s (%d dims). Intervals: 95 %%, %d bootstrap resamples of the samples "
             "(the same for every entry), bias-corrected percentile. FD is biased upward at "
             "small n; the first row is the FD of %d train images, what a perfect generator "
             "would score.",
             o->n, (unsigned long long)o->seed, c->num_classes, o->steps, o->sampler,
             (double)o->cfg, o->dir, r->loc.ex.K, r->n_mono ? ", monoliths " : "",
             r->n_mono ? o->monolith : "", o->ref_n, o->classifier, r->D, o->boot, o->n);
    int rc = TS_OK;
    if (o->report && (rc = ts_eval_report_write(o->report, r->e, r->n_entries, &r->floor_row, setup,
                                                o->grid_n, r->K, c, r->jd, r->n_judges, r->jsc,
                                                r->err, sizeof r->err)) != TS_OK)
        return rc;
    if (o->json)
        print_json(r);
    else
        ts_eval_report_table(r->e, r->n_entries, &r->floor_row, o->boot >= 2);
    if (!o->json && r->n_judges) {
        char *names[MAX_ENTRIES];
        int64_t n[MAX_ENTRIES];
        for (int i = 0; i < r->n_entries; i++)
            names[i] = r->e[i].name, n[i] = o->n;
        printf("\nthe same entries in further judges' spaces:\n");
        ts_cli_judges_print("test", o->boot, names, r->n_entries, r->jd, r->n_judges, r->jsc, n,
                            o->ref_n);
    }
    if (o->report)
        fprintf(stderr, PROG ": report → %s\n", o->report);
    if (o->save_dir)
        fprintf(stderr, PROG ": samples → %s\n", o->save_dir);
    return TS_OK;
}

static void eval_free(eval_run_t *r) {
    for (int i = 0; r->e && i < r->n_entries; i++) {
        free(r->e[i].grid);
        free(r->e[i].boot);
        ts_eval_route_free(&r->e[i].route);
    }
    for (int i = 0; r->sample_paths && i < MAX_ENTRIES; i++)
        free(r->sample_paths[i]);
    free(r->sample_paths);
    free(r->floor_row.boot);
    free(r->e);
    free(r->mono_copy);
    free(r->images), free(r->feat), free(r->ref_feat), free(r->logits), free(r->pred);
    free(r->labels), free(r->cluster), free(r->ref_cluster), free(r->scratch), free(r->seeds);
    free(r->mu_ref), free(r->cov_ref), free(r->cmu), free(r->ccov), free(r->kmu), free(r->kcov);
    free(r->log_prior);
    for (int k = 0; k < TS_CLI_MAX_JUDGES; k++) {
        for (int i = 0; i < MAX_ENTRIES; i++)
            free(r->jfeat[k][i]);
        ts_cli_judge_close(&r->jd[k]);
    }
    free(r->judges_copy), free(r->jsc);
    if (r->has_jeng)
        ts_engine_free(&r->jeng);
    ts_dataset_free(&r->test);
    ts_dataset_free(&r->train);
    ts_classifier_free(r->cls);
    for (int m = 0; m < MAX_MONOLITHS; m++)
        ts_local_free(&r->mono[m]);
    ts_local_free(&r->loc);
    ts_engine_free(&r->eng);
}

int ts_cmd_eval(int argc, char **argv) {
    eval_run_t *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    int pr = parse_opts(argc, argv, &r->o);
    if (pr != TS_ARGS_RUN) {
        free(r);
        return pr;
    }
    r->e = calloc(MAX_ENTRIES, sizeof *r->e);
    r->mono_copy = r->o.monolith ? strdup(r->o.monolith) : NULL;
    r->sample_paths = calloc(MAX_ENTRIES + 1, sizeof *r->sample_paths);
    r->floor_row = (entry_t){.agreement = NAN};
    snprintf(r->floor_row.name, sizeof r->floor_row.name, "train data (the floor at this n)");
    int rc = !r->e || !r->sample_paths || (r->o.monolith && !r->mono_copy) ? TS_ENOMEM : TS_OK;
    int usage = rc == TS_OK ? validate(r) : 0;
    if (rc != TS_OK || usage) {
        eval_free(r);
        free(r);
        return usage ? usage : 1;
    }
    r->o.grid_n = r->o.grid_n > r->o.n ? r->o.n : r->o.grid_n;
    r->chunk = r->o.n < CHUNK ? r->o.n : CHUNK;
    r->pairs = r->o.cfg != 1.0f ? 2 : 1;
    rc = open_models(r);
    if (rc == TS_OK)
        rc = alloc_buffers(r);
    if (rc == TS_OK)
        rc = fit_reference(r);
    for (int i = 0; rc == TS_OK && i < r->o.n; i++) {
        r->labels[i] = i % r->loc.ex.models[0].cfg.num_classes;
        r->seeds[i] = r->o.seed + (uint64_t)i;
    }
    progress_t prog = {isatty(STDERR_FILENO), 0, 0, NULL};
    for (int i = 0; i < r->n_entries && rc == TS_OK; i++)
        rc = run_entry(r, i, &prog);
    if (rc == TS_OK)
        rc = score_judges(r);
    if (rc == TS_OK)
        rc = print_results(r);
    if (rc != TS_OK)
        ts_args_fail(PROG, r->err, rc);
    int code = rc == TS_OK ? 0 : r->usage ? 2 : 1;
    eval_free(r);
    free(r);
    return code;
}
