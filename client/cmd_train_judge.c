/*
 * cmd_train_judge.c — `tessera train-judge`: trains one of model/judge.h (a plain convolutional
 * classifier on the labels, or an autoencoder without them) on the Fashion-MNIST train split,
 * measures it on the test split (accuracy, or reconstruction MSE) and writes it with that figure
 * in its metadata. `tessera judge` (cmd_judge.c) and `eval --judges` score samples in it.
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
#include "client/cli.h"
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
