/*
 * judges.h — the feature spaces a client scores samples in: a judge file of model/judge.h or the
 * evaluation classifier (model/classifier.h), opened and run alike.
 */
#ifndef TS_CLIENT_JUDGES_H
#define TS_CLIENT_JUDGES_H

#include <stddef.h>

#include "model/classifier.h"
#include "model/judge.h"

typedef struct ts_cli_judge {
    const char *path;
    char name[64]; /* "cnn seed 2", "ae seed 3", "classifier" */
    ts_judge_t *judge;
    ts_classifier_t *classifier;
    int D;
} ts_cli_judge_t;

/* Opens path as a judge, or as a classifier when it is one (its "format" says which). */
int ts_cli_judge_open(ts_cli_judge_t *j, const char *path, ts_engine_t *e, int max_batch, char *err,
                      size_t errlen);
/* features (n, D) of n host images (n, C, H, W) in [−1, 1]. */
int ts_cli_judge_features(ts_cli_judge_t *j, ts_engine_t *e, const float *images, int n, int C,
                          int H, int W, float *features);
void ts_cli_judge_close(ts_cli_judge_t *j);

#endif
