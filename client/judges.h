/*
 * judges.h — the feature spaces a client scores samples in: a judge file of model/judge.h or the
 * evaluation classifier (model/classifier.h), opened and run alike.
 */
#ifndef TS_CLIENT_JUDGES_H
#define TS_CLIENT_JUDGES_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "client/report.h"
#include "model/classifier.h"
#include "model/judge.h"
#include "model/space_score.h"

#define TS_CLI_MAX_JUDGES 16 /* judges, and sample sets of `tessera judge`, at most */

typedef struct ts_cli_judge {
    const char *path;
    char name[64]; /* "cnn seed 2", "ae seed 3", "classifier" */
    ts_judge_t *judge;
    ts_classifier_t *classifier;
    int D, max_batch;
} ts_cli_judge_t;

/* Opens path as a judge, or as a classifier when it is one (its "format" says which), for images
 * of (C, H, W): TS_EINVAL, naming both shapes, when it takes others. A judge needs a CPU engine
 * (model/judge.h); a classifier runs on any. */
int ts_cli_judge_open(ts_cli_judge_t *j, const char *path, ts_engine_t *e, int max_batch, int C,
                      int H, int W, char *err, size_t errlen);
/* features (n, D) of n host images (n, C, H, W) in [−1, 1]. */
int ts_cli_judge_features(ts_cli_judge_t *j, ts_engine_t *e, const float *images, int n, int C,
                          int H, int W, float *features);
void ts_cli_judge_close(ts_cli_judge_t *j);

/* The scores sc (J judges × E entries, judge-major) of entries names[0..E) with n[e] samples
 * against r reference images of split ref: one table per judge and the agreement of every judge
 * on each entry against the first (printed on stdout), or the same as one JSON object. */
void ts_cli_judges_print(const char *ref, int boot, char *const *names, int E,
                         const ts_cli_judge_t *jd, int J, const ts_space_score_t *sc,
                         const int64_t *n, int64_t r);
/* The same as tables of an HTML report (a section "Every judge"). */
int ts_cli_judges_report(ts_report_t *rep, char *const *names, int E, const ts_cli_judge_t *jd,
                         int J, const ts_space_score_t *sc);
json_t *ts_cli_judges_json(const char *ref, int boot, int pr_k, char *const *names, int E,
                           const ts_cli_judge_t *jd, int J, const ts_space_score_t *sc,
                           const int64_t *n, int64_t r);

#endif
