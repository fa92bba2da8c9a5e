/*
 * judges.c — the feature spaces a client scores samples in (judges.h): a judge file of
 * model/judge.h or the evaluation classifier, opened and run alike, and the scores of every judge
 * as tables, an HTML report section or JSON, for `tessera judge` and `tessera eval --judges`.
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
