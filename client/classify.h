/*
 * classify.h — what the verbs of the two DiT-trunk classifiers of model/classifier.h share:
 * `tessera train-classifier` (cmd_train_classifier.c), `train-router` (cmd_train_router.c) and
 * `calibrate` (cmd_calibrate.c). The training verbs print the progress line of `tessera train` on
 * stderr (rewritten in place on a terminal) and with --json one JSON object per log line and a
 * summary on stdout. The trunk is a DiT preset (--model) whose sizes --hidden, --depth, --heads
 * and --patch may override.
 */
#ifndef TS_CLIENT_CLASSIFY_H
#define TS_CLIENT_CLASSIFY_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/engine.h"
#include "model/classifier.h"
#include "model/fmnist.h"
#include "model/partition.h"

#define N_BUCKETS 10 /* the t-buckets [0, 0.1), [0.1, 0.2), … of a router's evaluation */

/* The options of train-classifier and train-router. */
typedef struct {
    const char *prog, *fmnist_dir, *partition, *model, *out;
    int64_t steps;
    int batch, threads, warmup, log_every, json, eval_n;
    ts_device_spec_t device; /* --device (zeroed: the CPU) */
    int hidden, depth, heads, patch, no_augment, shift;
    float lr, wd, clip;
    uint64_t seed;
    /* train-router only: the objective and, for the expert objectives, the experts */
    const char *objective, *experts;
    float align_tau;
    int label_aware;     /* the router also reads the class label (trained with dropout) */
    float label_dropout; /* its probability of the null label */
    ts_router_residuals_fn residuals;
    void *residuals_ctx;
} cls_opts_t;

/* Evaluation buffers for batches of up to B images of ds's shape. */
typedef struct {
    ts_tensor_t x0, eps, xt, vel, t;
    float *logits, *t_host;
} eval_bufs_t;

/* The data, the engine and a freshly initialised classifier: common to both verbs. */
typedef struct {
    ts_dataset_t train, test;
    ts_engine_t eng;
    ts_classifier_t *c;
} cls_run_t;

/* The options both verbs share, then the verb's own (router: train-router's), parsed into o:
 * TS_ARGS_RUN, or the exit code (ts_args_parse). */
int ts_classify_parse(cls_opts_t *o, int router, int argc, char **argv);
/* o zeroed, then the defaults; prog is the verb's name for the messages. */
void ts_classify_defaults(cls_opts_t *o, const char *prog);
/* Trains c for o->steps steps on (ds, targets), printing progress; *secs the time it took. */
int ts_classify_train_loop(const cls_opts_t *o, ts_classifier_t *c, const ts_dataset_t *ds,
                           const int32_t *targets, double *secs);
/* The index of the largest of z[0..K). */
int ts_classify_argmax(const float *z, int K);
/* Evaluation buffers for batches of up to B images of ds's shape, K logits each. */
int ts_classify_eval_init(eval_bufs_t *b, const ts_engine_t *e, const ts_dataset_t *ds, int B,
                          int K);
void ts_classify_eval_free(eval_bufs_t *b);
/* Logits of images [lo, lo + n) of ds into b->logits: clean at t = 0, or, when bucket ≥ 0, as
 * x_t with t uniform in [bucket/10, (bucket+1)/10) and ε from the fixed evaluation stream. */
int ts_classify_eval_batch(ts_classifier_t *c, ts_engine_t *e, eval_bufs_t *b,
                           const ts_dataset_t *ds, int lo, int n, int bucket);
/* Correct predictions over the first n images of ds against truth (clean, or noisy in bucket). */
int ts_classify_eval_accuracy(ts_classifier_t *c, ts_engine_t *e, const ts_dataset_t *ds,
                              const int32_t *truth, int n, int B, int bucket, int *right);
/* The train and test splits, the engine and a freshly initialised classifier of K outputs. */
int ts_classify_run_start(cls_run_t *r, const cls_opts_t *o, int K, int time_conditioned, char *err,
                          size_t errlen);
void ts_classify_run_free(cls_run_t *r);
/* Records the run in the metadata (acc under acc_key) and writes the file --out. */
int ts_classify_save_model(cls_run_t *r, const cls_opts_t *o, const char *acc_key, double acc,
                           char *err, size_t errlen);
/* --partition is a folder holding partition.safetensors, or the file itself. */
int ts_classify_load_partition(const char *where, ts_partition_t *p, char *err, size_t errlen);

#endif
