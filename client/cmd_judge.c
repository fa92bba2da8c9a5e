/*
 * cmd_judge.c — the judges: `tessera train-judge` trains one of model/judge.h (a plain
 * convolutional classifier on the labels, or an autoencoder without them) on the Fashion-MNIST
 * train split, measures it on the test split (accuracy, or reconstruction MSE) and writes it with
 * that figure in its metadata; `tessera judge` scores saved sample sets (IDX files, as `tessera
 * eval --save-samples` writes them) in every judge given — FD and KID with 95 % bootstrap
 * intervals and paired differences to the first set, precision and recall (model/space_score.h)
 * — and says, for each set against the first, whether every judge agrees.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/str.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/judges.h"
#include "client/jsonout.h"
#include "client/report.h"
#include "client/local.h"
#include "model/fmnist.h"
#include "model/judge.h"
#include "model/safetensors.h"
#include "model/space_score.h"

typedef struct {
    const char *prog, *kind, *out, *fmnist_dir;
    int64_t steps;
    int batch, threads, json, quiet, eval_n;
    float lr;
    uint64_t seed;
    ts_device_spec_t device;
} judge_opts_t;

static void on_progress(void *ctx, int64_t step, int64_t steps, double loss) {
    const judge_opts_t *o = ctx;
    if (!o->quiet)
        fprintf(stderr, "%s: step %lld/%lld, loss %.5f\n", o->prog, (long long)step,
                (long long)steps, loss);
}

int ts_cmd_train_judge(int argc, char **argv) {
    judge_opts_t o = {.prog = "tessera train-judge",
                      .fmnist_dir = TS_FMNIST_DEFAULT_DIR,
                      .steps = 3000,
                      .batch = 128,
                      .lr = 2e-3f,
                      .seed = 1};
    /* clang-format off */
    ts_arg_t args[] = {
        {"kind", TS_ARG_STRING, &o.kind, "KIND", "cnn (a plain convolutional classifier, trained on the labels) or ae (an autoencoder, trained without labels; its 32-wide bottleneck is the feature space)", 0, 0, 1},
        {"out", TS_ARG_STRING, &o.out, "FILE", "where to write the judge (safetensors)", 0, 0, 1},
        {"seed", TS_ARG_U64, &o.seed, "S", "the initialisation's and the shuffling's seed (default 1)"},
        {"steps", TS_ARG_I64, &o.steps, "N", "AdamW steps (default 3000)", 1, 1e9},
        {"batch", TS_ARG_INT, &o.batch, "B", "images per step (default 128)", 1, 4096},
        {"lr", TS_ARG_FLOAT, &o.lr, "LR", "peak learning rate, warm-up over the first 5 %, then cosine (default 2e-3)", 1e-9, 10},
        {"fmnist", TS_ARG_STRING, &o.fmnist_dir, "DIR", "the Fashion-MNIST IDX files (default " TS_FMNIST_DEFAULT_DIR ")"},
                {"threads", TS_ARG_INT, &o.threads, "N", "CPU threads (default: every core)", 0, 1024},
        {"eval-n", TS_ARG_INT, &o.eval_n, "N", "measure on the first N test images only (default all 10 000)", 0, 1e7},
        {"quiet", TS_ARG_FLAG, &o.quiet, NULL, "no progress lines"},
        {"json", TS_ARG_FLAG, &o.json, NULL, "print the result as one JSON object on stdout"},
    };
    /* clang-format on */
    int n = (int)(sizeof args / sizeof args[0]);
    int pr = ts_args_parse(o.prog,
                           "Train a judge: a feature space for `tessera eval --judge`, of another "
                           "architecture than the evaluation classifier (cnn) or learnt without "
                           "labels (ae).\nexample: tessera train-judge --kind ae --seed 2 --out "
                           "judge-ae.safetensors",
                           args, n, argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    ts_judge_kind_t kind;
    if (ts_judge_kind_parse(o.kind, &kind) != TS_OK) {
        fprintf(stderr, "%s: --kind %s: must be cnn or ae\n", o.prog, o.kind);
        return 2;
    }
    o.device.automatic = 0, o.device.device = TS_CPU; /* the judges run on the CPU */
    char err[512] = "";
    ts_dataset_t train = {0}, test = {0};
    ts_engine_t eng = {0};
    ts_judge_t *j = NULL;
    int have_eng = 0;
    int rc = ts_fmnist_load(o.fmnist_dir, "train", &train, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_fmnist_load(o.fmnist_dir, "test", &test, err, sizeof err);
    if (rc == TS_OK &&
        (rc = ts_cli_engine(&eng, &o.device, o.threads, o.prog, err, sizeof err)) == TS_OK)
        have_eng = 1;
    if (rc == TS_OK)
        rc = ts_judge_create(&j, kind, train.channels, train.height, train.width, train.num_classes,
                             o.seed, &eng, o.batch, 1, err, sizeof err);
    double t0 = ts_now_s(), score = 0.0;
    if (rc == TS_OK) {
        if (!o.quiet)
            fprintf(stderr,
                    "%s: %s judge, %d features, seed %llu; %d train images, batch %d, "
                    "%lld steps, %d threads\n",
                    o.prog, o.kind, ts_judge_feature_dim(j), (unsigned long long)o.seed, train.n,
                    o.batch, (long long)o.steps, eng.threads);
        rc = ts_judge_train(j, &train, o.steps, o.batch, o.lr, o.seed,
                            o.steps / 20 > 0 ? o.steps / 20 : 1, on_progress, &o, err, sizeof err);
    }
    double secs = ts_now_s() - t0;
    if (rc == TS_OK && o.eval_n && o.eval_n < test.n)
        test.n = o.eval_n; /* the first N; the buffers stay whole until freed */
    if (rc == TS_OK)
        rc = ts_judge_score(j, &test, &score, err, sizeof err);
    const char *key = kind == TS_JUDGE_CNN ? "test_accuracy" : "test_mse";
    if (rc == TS_OK) {
        char v[32];
        snprintf(v, sizeof v, "%.6f", score);
        rc = ts_judge_set_meta(j, key, v);
        if (rc == TS_OK)
            rc = ts_judge_set_meta(j, "dataset", "fashion-mnist");
        snprintf(v, sizeof v, "%d", test.n);
        if (rc == TS_OK)
            rc = ts_judge_set_meta(j, "test_n", v);
        if (rc == TS_OK)
            rc = ts_judge_save(j, o.out, err, sizeof err);
    }
    if (rc == TS_OK) {
        if (kind == TS_JUDGE_CNN)
            fprintf(stderr, "test accuracy %.2f %% after %lld steps in %.1f s; judge → %s\n",
                    100.0 * score, (long long)o.steps, secs, o.out);
        else
            fprintf(stderr, "test reconstruction MSE %.5f after %lld steps in %.1f s; judge → %s\n",
                    score, (long long)o.steps, secs, o.out);
        if (o.json)
            ts_json_print(json_pack("{s:b, s:s, s:I, s:f, s:I, s:f, s:s}", "done", 1, "kind",
                                    o.kind, "seed", (json_int_t)o.seed, key, score, "steps",
                                    (json_int_t)o.steps, "seconds", secs, "out", o.out));
    } else {
        ts_args_fail(o.prog, err, rc);
    }
    ts_judge_free(j);
    if (have_eng)
        ts_engine_free(&eng);
    ts_dataset_free(&train);
    ts_dataset_free(&test);
    return rc == TS_OK ? 0 : 1;
}

/* ---- the feature spaces ------------------------------------------------------------------ */

/* The shape a judge or classifier file takes, against the images' (C, H, W). */
static int shape_check(ts_cli_judge_t *j, int C, int H, int W, char *err, size_t errlen) {
    int c = 0, h = 0, w = 0;
    if (j->judge) {
        ts_judge_shape(j->judge, &c, &h, &w);
    } else {
        const char *cs = ts_classifier_meta(j->classifier, "in_channels");
        const char *ss = ts_classifier_meta(j->classifier, "input_size");
        c = cs ? atoi(cs) : 0, h = w = ss ? atoi(ss) : 0;
    }
    if (c == C && h == H && w == W) {
        if (err && errlen)
            err[0] = '\0'; /* a judge file's "not a judge" before the classifier opened */
        return TS_OK;
    }
    return ts_fail(err, errlen, TS_EINVAL, "%s takes images of %d×%d×%d, these are %d×%d×%d",
                   j->path, c, h, w, C, H, W);
}

int ts_cli_judge_open(ts_cli_judge_t *j, const char *path, ts_engine_t *e, int max_batch, int C,
                      int H, int W, char *err, size_t errlen) {
    memset(j, 0, sizeof *j);
    j->path = path, j->max_batch = max_batch;
    int rc = ts_judge_open(&j->judge, path, e, max_batch, err, errlen);
    if (rc == TS_OK) {
        const char *seed = ts_judge_meta(j->judge, "seed");
        snprintf(j->name, sizeof j->name, "%s seed %s", ts_judge_kind_name(ts_judge_kind(j->judge)),
                 seed ? seed : "?");
        j->D = ts_judge_feature_dim(j->judge);
        return shape_check(j, C, H, W, err, errlen);
    }
    if (rc == TS_ECORRUPT) { /* not safetensors, or a judge file that does not hold together */
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        ts_set_err(err, errlen, "%s is not a judge file: %s", path, why);
        return rc;
    }
    if (rc != TS_EKIND) /* a missing file, no memory, ...: its own message */
        return rc;
    char cerr[512] = "";
    rc = ts_classifier_open(&j->classifier, path, e, max_batch, cerr, sizeof cerr);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "%s is neither a judge nor a classifier: %s", path, cerr);
        return rc == TS_ECORRUPT ? TS_EKIND : rc;
    }
    if (ts_classifier_time_conditioned(j->classifier))
        return ts_fail(err, errlen, TS_EKIND, "%s is a router (time-conditioned), not a judge",
                       path);
    snprintf(j->name, sizeof j->name, "classifier");
    j->D = ts_classifier_feature_dim(j->classifier);
    return shape_check(j, C, H, W, err, errlen);
}

void ts_cli_judge_close(ts_cli_judge_t *j) {
    ts_judge_free(j->judge);
    ts_classifier_free(j->classifier);
    memset(j, 0, sizeof *j);
}

#define CHUNK 128

int ts_cli_judge_features(ts_cli_judge_t *j, ts_engine_t *e, const float *images, int n, int C,
                          int H, int W, float *features) {
    int64_t chw = (int64_t)C * H * W;
    ts_tensor_t x = {0};
    int B = j->max_batch;
    int rc =
        j->classifier ? ts_tensor_alloc(&x, TS_F32, e->device, 4, TS_SHAPE(B, C, H, W)) : TS_OK;
    for (int lo = 0; lo < n && rc == TS_OK; lo += B) {
        int m = n - lo < B ? n - lo : B;
        const float *img = images + lo * chw;
        float *f = features + (int64_t)lo * j->D;
        if (j->judge) {
            rc = ts_judge_features(j->judge, img, m, f);
            continue;
        }
        ts_tensor_t host, xs;
        rc = ts_tensor_slice(&xs, &x, 0, m);
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&host, (float *)img, TS_F32, TS_CPU, 4, xs.shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&xs, &host);
        if (rc == TS_OK)
            rc = ts_classifier_run(j->classifier, &xs, NULL, m, f, NULL);
    }
    ts_tensor_free(&x);
    return rc;
}

/* ---- tessera judge ------------------------------------------------------------------------- */

#define MAX_LIST TS_CLI_MAX_JUDGES

typedef struct {
    const char *prog, *samples, *judges, *ref, *fmnist_dir;
    int n, ref_n, boot, pr_k, threads, json;
} score_opts_t;

int ts_cli_split_list(char *s, const char **out, int max) {
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max)
            return -1;
        out[n++] = tok;
    }
    return n;
}

/* The labels file beside a samples file, and the entry's name: "X.idx[.gz]" has "X-labels.idx[.gz]";
 * "X-images-idx3-ubyte[.gz]" has "X-labels-idx1-ubyte[.gz]". 0 when the name is neither. */
static int sample_paths(const char *path, char *labels, size_t llen, char *name, size_t nlen) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *forms[][2] = {{".idx.gz", "-labels.idx.gz"},
                              {".idx", "-labels.idx"},
                              {"-images-idx3-ubyte.gz", "-labels-idx1-ubyte.gz"},
                              {"-images-idx3-ubyte", "-labels-idx1-ubyte"}};
    size_t len = strlen(path), blen = strlen(base);
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        size_t sl = strlen(forms[f][0]);
        if (blen <= sl || strcmp(path + len - sl, forms[f][0]) != 0)
            continue;
        snprintf(labels, llen, "%.*s%s", (int)(len - sl), path, forms[f][1]);
        snprintf(name, nlen, "%.*s", (int)(blen - sl), base);
        return 1;
    }
    return 0;
}

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *pair(double lo, double hi) { return json_pack("[o, o]", jnum(lo), jnum(hi)); }

/* −1: the paired interval lies below 0 (lower than the first), +1 above, 0 it holds 0 */
static int side(double lo, double hi) {
    return !isfinite(lo) || !isfinite(hi) ? 0 : hi < 0.0 ? -1 : lo > 0.0 ? 1 : 0;
}

void ts_cli_judges_print(const char *ref, int boot, char *const *names, int E,
                         const ts_cli_judge_t *jd, int J, const ts_space_score_t *sc,
                         const int64_t *n, int64_t r) {
    printf("%d sample sets scored against %lld %s images; 95 %% bootstrap intervals (%d "
           "resamples), differences paired with %s\n",
           E, (long long)r, ref, boot, names[0]);
    for (int k = 0; k < J; k++) {
        printf("\njudge %d: %s (%s, %d features)\n", k + 1, jd[k].name, jd[k].path, jd[k].D);
        printf("  %-32s %6s  %-22s  %-26s  %-24s  %-26s  %6s  %6s\n", "samples", "n", "FD [95 %]",
               "FD − first [95 %]", "KID ×1e3 [95 %]", "KID − first ×1e3 [95 %]", "prec", "recall");
        for (int e = 0; e < E; e++) {
            const ts_space_score_t *s = &sc[k * E + e];
            char a[96], b[96], c[96], d[96];
            snprintf(a, sizeof a, "%.3f [%.3f, %.3f]", s->fd, s->fd_lo, s->fd_hi);
            snprintf(b, sizeof b, e ? "%+.3f [%+.3f, %+.3f]" : "(first)", s->d_fd, s->d_fd_lo,
                     s->d_fd_hi);
            snprintf(c, sizeof c, "%.2f [%.2f, %.2f]", 1e3 * s->kid, 1e3 * s->kid_lo,
                     1e3 * s->kid_hi);
            snprintf(d, sizeof d, e ? "%+.2f [%+.2f, %+.2f]" : "(first)", 1e3 * s->d_kid,
                     1e3 * s->d_kid_lo, 1e3 * s->d_kid_hi);
            printf("  %-32s %6lld  %-22s  %-26s  %-24s  %-26s  %6.3f  %6.3f\n", names[e],
                   (long long)n[e], a, b, c, d, s->precision, s->recall);
        }
    }
    if (E < 2 || boot < 2)
        return;
    printf("\nagreement, against %s (a difference counts where its 95 %% interval excludes 0):\n",
           names[0]);
    for (int e = 1; e < E; e++) {
        int lower = 0, higher = 0;
        for (int k = 0; k < J; k++) {
            const ts_space_score_t *s = &sc[k * E + e];
            int f = side(s->d_fd_lo, s->d_fd_hi), g = side(s->d_kid_lo, s->d_kid_hi);
            lower += f < 0 && g < 0;
            higher += f > 0 && g > 0;
        }
        const char *verdict = n[e] != n[0] ? "not paired (a different n): no verdict"
                              : lower == J ? "lower in every judge: holds"
                              : higher == J
                                  ? "higher in every judge: holds"
                                  : "the judges disagree or find no difference: does not hold";
        printf("  %-32s FD and KID lower in %d of %d judges, higher in %d — %s\n", names[e], lower,
               J, higher, verdict);
    }
}

int ts_cli_judges_report(ts_report_t *rep, char *const *names, int E, const ts_cli_judge_t *jd,
                         int J, const ts_space_score_t *sc) {
    enum { COLS = 7 };
    const char *head[COLS] = {
        "samples",   "FD (95 %)", "FD − first (95 %)", "KID ×1e3 (95 %)", "KID − first ×1e3 (95 %)",
        "precision", "recall"};
    char(*buf)[COLS][96] = calloc((size_t)E, sizeof *buf);
    const char **cells = calloc((size_t)(E + 1) * COLS, sizeof *cells);
    if (!buf || !cells) {
        free(buf), free(cells);
        return TS_ENOMEM;
    }
    ts_report_heading(rep, 2, "Every judge");
    ts_report_paragraph(rep, "The same samples in further feature spaces (model/judge.h): FD and "
                             "KID with 95 % bootstrap intervals, paired with the first entry. A "
                             "difference holds only where every judge finds it.");
    for (int k = 0; k < J; k++) {
        char title[160];
        snprintf(title, sizeof title, "%s (%d features)", jd[k].name, jd[k].D);
        ts_report_heading(rep, 3, title);
        for (int c = 0; c < COLS; c++)
            cells[c] = head[c];
        for (int e = 0; e < E; e++) {
            const ts_space_score_t *s = &sc[k * E + e];
            char(*b)[96] = buf[e];
            snprintf(b[0], 96, "%s", names[e]);
            snprintf(b[1], 96, "%.3f [%.3f, %.3f]", s->fd, s->fd_lo, s->fd_hi);
            snprintf(b[2], 96, e ? "%+.3f [%+.3f, %+.3f]" : "", s->d_fd, s->d_fd_lo, s->d_fd_hi);
            snprintf(b[3], 96, "%.2f [%.2f, %.2f]", 1e3 * s->kid, 1e3 * s->kid_lo, 1e3 * s->kid_hi);
            snprintf(b[4], 96, e ? "%+.2f [%+.2f, %+.2f]" : "", 1e3 * s->d_kid, 1e3 * s->d_kid_lo,
                     1e3 * s->d_kid_hi);
            snprintf(b[5], 96, "%.3f", s->precision);
            snprintf(b[6], 96, "%.3f", s->recall);
            for (int c = 0; c < COLS; c++)
                cells[(e + 1) * COLS + c] = b[c];
        }
        ts_report_table(rep, COLS, E + 1, cells);
    }
    free(buf), free(cells);
    return TS_OK;
}

json_t *ts_cli_judges_json(const char *ref, int boot, int pr_k, char *const *names, int E,
                           const ts_cli_judge_t *jd, int J, const ts_space_score_t *sc,
                           const int64_t *n, int64_t r) {
    json_t *root = json_pack("{s:s, s:I, s:i, s:i}", "reference", ref, "reference_n", (json_int_t)r,
                             "bootstrap", boot, "pr_k", pr_k);
    json_t *entries = json_array(), *judges = json_array();
    for (int e = 0; e < E; e++)
        json_array_append_new(entries,
                              json_pack("{s:s, s:I}", "name", names[e], "n", (json_int_t)n[e]));
    for (int k = 0; k < J; k++) {
        json_t *rows = json_array();
        for (int e = 0; e < E; e++) {
            const ts_space_score_t *s = &sc[k * E + e];
            json_array_append_new(
                rows, json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "entry",
                                names[e], "fd", jnum(s->fd), "fd_ci95", pair(s->fd_lo, s->fd_hi),
                                "fd_minus_first", jnum(s->d_fd), "fd_minus_first_ci95",
                                pair(s->d_fd_lo, s->d_fd_hi), "kid", jnum(s->kid), "kid_ci95",
                                pair(s->kid_lo, s->kid_hi), "kid_minus_first", jnum(s->d_kid),
                                "kid_minus_first_ci95", pair(s->d_kid_lo, s->d_kid_hi), "precision",
                                jnum(s->precision), "recall", jnum(s->recall)));
        }
        json_t *meta = json_object();
        const char *keys[] = {"seed", "steps", "test_accuracy", "test_mse", "train_steps"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            const char *v = jd[k].judge ? ts_judge_meta(jd[k].judge, keys[i])
                                        : ts_classifier_meta(jd[k].classifier, keys[i]);
            if (v)
                json_object_set_new(meta, keys[i], json_string(v));
        }
        json_array_append_new(judges, json_pack("{s:s, s:s, s:i, s:o, s:o}", "name", jd[k].name,
                                                "file", jd[k].path, "features", jd[k].D, "meta",
                                                meta, "scores", rows));
    }
    json_object_set_new(root, "entries", entries);
    json_object_set_new(root, "judges", judges);
    return root;
}

int ts_cmd_judge(int argc, char **argv) {
    score_opts_t o = {.prog = "tessera judge",
                      .ref = "test",
                      .fmnist_dir = TS_FMNIST_DEFAULT_DIR,
                      .boot = 200,
                      .pr_k = 3};
    /* clang-format off */
    ts_arg_t args[] = {
        {"samples", TS_ARG_STRING, &o.samples, "FILE,...", "the sample sets, IDX images (X.idx.gz with X-labels.idx.gz beside it, or P-images-idx3-ubyte[.gz] as `tessera eval --save-samples` writes); the first is what the others are compared with", 0, 0, 1},
        {"judges", TS_ARG_STRING, &o.judges, "FILE,...", "the feature spaces: judges of `tessera train-judge` and/or the evaluation classifier of `tessera train-classifier`", 0, 0, 1},
        {"ref", TS_ARG_STRING, &o.ref, "SPLIT", "the reference images: the Fashion-MNIST split test (default) or train"},
        {"ref-n", TS_ARG_INT, &o.ref_n, "N", "the first N reference images only (default all)", 0, 1e7},
        {"n", TS_ARG_INT, &o.n, "N", "the first N samples of each set only (default all)", 0, 1e7},
        {"bootstrap", TS_ARG_INT, &o.boot, "B", "bootstrap resamples for the intervals (default 200; 0: none)", 0, 100000},
        {"pr-k", TS_ARG_INT, &o.pr_k, "K", "the k of precision/recall's k-nearest-neighbour radii (default 3)", 1, 100},
        {"fmnist", TS_ARG_STRING, &o.fmnist_dir, "DIR", "the Fashion-MNIST IDX files (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"threads", TS_ARG_INT, &o.threads, "N", "CPU threads (default: every core)", 0, 1024},
        {"json", TS_ARG_FLAG, &o.json, NULL, "print one JSON object on stdout instead of the tables"},
    };
    /* clang-format on */
    int pr =
        ts_args_parse(o.prog,
                      "Score saved sample sets in several feature spaces: FD and KID with 95 % "
                      "intervals, paired differences to the first set, precision and recall, "
                      "and whether every judge agrees.\nexample: tessera judge --samples "
                      "monolith.idx.gz,best-ensemble.idx.gz --judges classifier.safetensors,"
                      "judge-cnn.safetensors,judge-ae.safetensors",
                      args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (strcmp(o.ref, "test") != 0 && strcmp(o.ref, "train") != 0) {
        fprintf(stderr, "%s: --ref %s: must be test or train\n", o.prog, o.ref);
        return 2;
    }
    char *slist = ts_dup_str(o.samples), *jlist = ts_dup_str(o.judges);
    const char *spath[MAX_LIST], *jpath[MAX_LIST];
    int E = slist ? ts_cli_split_list(slist, spath, MAX_LIST) : 0,
        J = jlist ? ts_cli_split_list(jlist, jpath, MAX_LIST) : 0;
    if (E < 1 || J < 1) {
        fprintf(stderr, "%s: --samples and --judges take 1 to %d comma-separated files\n", o.prog,
                MAX_LIST);
        free(slist), free(jlist);
        return 2;
    }
    char labels[MAX_LIST][4096], names_buf[MAX_LIST][256], *names[MAX_LIST];
    for (int e = 0; e < E; e++) {
        names[e] = names_buf[e];
        if (!sample_paths(spath[e], labels[e], sizeof labels[e], names_buf[e], 256)) {
            fprintf(stderr,
                    "%s: %s: name a samples file X.idx.gz (labels in X-labels.idx.gz) or "
                    "P-images-idx3-ubyte[.gz] (labels in P-labels-idx1-ubyte[.gz])\n",
                    o.prog, spath[e]);
            free(slist), free(jlist);
            return 2;
        }
    }
    char err[1024] = "";
    ts_dataset_t ref = {0}, sets[MAX_LIST] = {{0}};
    ts_cli_judge_t jd[MAX_LIST] = {{0}};
    ts_engine_t eng = {0};
    ts_device_spec_t cpu = {.device = TS_CPU};
    float *rfeat = NULL, *feat[MAX_LIST] = {0};
    ts_space_score_t *sc = calloc((size_t)(E * J), sizeof *sc);
    int64_t n[MAX_LIST];
    int rc = sc ? TS_OK : TS_ENOMEM, have_eng = 0;
    if (rc == TS_OK)
        rc = ts_fmnist_load(o.fmnist_dir, o.ref, &ref, err, sizeof err);
    int64_t r = o.ref_n && o.ref_n < ref.n ? o.ref_n : ref.n;
    for (int e = 0; e < E && rc == TS_OK; e++) {
        rc = ts_idx_load_files(spath[e], labels[e], &sets[e], err, sizeof err);
        if (rc == TS_OK && (sets[e].height != ref.height || sets[e].width != ref.width)) {
            rc = ts_fail(err, sizeof err, TS_EINVAL, "%s: images of %d×%d, the reference's %d×%d",
                         spath[e], sets[e].height, sets[e].width, ref.height, ref.width);
        }
        n[e] = o.n && o.n < sets[e].n ? o.n : sets[e].n;
    }
    if (rc == TS_OK &&
        (rc = ts_cli_engine(&eng, &cpu, o.threads, o.prog, err, sizeof err)) == TS_OK)
        have_eng = 1;
    int C = ref.channels, H = ref.height, W = ref.width;
    double t0 = ts_now_s();
    for (int k = 0; k < J && rc == TS_OK; k++) {
        rc = ts_cli_judge_open(&jd[k], jpath[k], &eng, CHUNK, C, H, W, err, sizeof err);
        int D = jd[k].D, opened = rc == TS_OK;
        if (rc == TS_OK && !(rfeat = malloc((size_t)(r * D) * sizeof *rfeat)))
            rc = TS_ENOMEM;
        if (rc == TS_OK)
            rc = ts_cli_judge_features(&jd[k], &eng, ref.images, (int)r, C, H, W, rfeat);
        for (int e = 0; e < E && rc == TS_OK; e++) {
            if (!(feat[e] = malloc((size_t)(n[e] * D) * sizeof *feat[e])))
                rc = TS_ENOMEM;
            else
                rc = ts_cli_judge_features(&jd[k], &eng, sets[e].images, (int)n[e], C, H, W,
                                           feat[e]);
        }
        if (rc != TS_OK && opened)
            ts_set_err(err, sizeof err, "%s: the features: %s", jpath[k], ts_strerror(rc));
        if (rc == TS_OK)
            rc = ts_space_score((const float *const *)feat, n, E, rfeat, r, D, o.boot, o.pr_k,
                                sc + (size_t)k * E, err, sizeof err);
        if (rc == TS_OK && !o.json)
            fprintf(stderr, "%s: judge %d of %d (%s) done, %.1f s\n", o.prog, k + 1, J, jd[k].name,
                    ts_now_s() - t0);
        for (int e = 0; e < E; e++)
            free(feat[e]), feat[e] = NULL;
        free(rfeat), rfeat = NULL;
    }
    if (rc == TS_OK) {
        if (o.json)
            ts_json_print(ts_cli_judges_json(o.ref, o.boot, o.pr_k, names, E, jd, J, sc, n, r));
        else
            ts_cli_judges_print(o.ref, o.boot, names, E, jd, J, sc, n, r);
    } else {
        ts_args_fail(o.prog, err, rc);
    }
    for (int k = 0; k < J; k++)
        ts_cli_judge_close(&jd[k]);
    for (int e = 0; e < E; e++)
        ts_dataset_free(&sets[e]);
    ts_dataset_free(&ref);
    if (have_eng)
        ts_engine_free(&eng);
    free(sc), free(slist), free(jlist);
    return rc == TS_OK ? 0 : 1;
}
