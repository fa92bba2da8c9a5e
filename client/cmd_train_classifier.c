/*
 * cmd_train_classifier.c — `tessera train-classifier`: the evaluation classifier, a DiT trunk
 * (model/classifier.h) trained with cross-entropy on clean Fashion-MNIST images → the 10
 * labels. At the end it reports the accuracy on the 10k test split (the target: ≥ 90 %); its
 * features are the evaluation space of the Fréchet distance. What it shares with train-router
 * and calibrate is in classify.h.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/args.h"
#include "client/classify.h"
#include "client/commands.h"
#include "client/jsonout.h"

int ts_cmd_train_classifier(int argc, char **argv) {
    cls_opts_t o;
    ts_classify_defaults(&o, "tessera train-classifier");
    int pr = ts_classify_parse(&o, 0, argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    char err[512] = "";
    cls_run_t r;
    double secs = 0;
    int rc = ts_classify_run_start(&r, &o, TS_FMNIST_NUM_CLASSES, 0, err, sizeof err);
    if (rc == TS_OK &&
        (rc = ts_classify_train_loop(&o, r.c, &r.train, r.train.labels, &secs)) != TS_OK)
        snprintf(err, sizeof err, "training failed");
    int n = o.eval_n && o.eval_n < r.test.n ? o.eval_n : r.test.n, right = 0;
    if (rc == TS_OK && (rc = ts_classify_eval_accuracy(r.c, &r.eng, &r.test, r.test.labels, n,
                                                       o.batch, -1, &right)) != TS_OK)
        snprintf(err, sizeof err, "evaluation on the test split failed");
    double acc = n ? (double)right / n : 0.0;
    if (rc == TS_OK)
        rc = ts_classify_save_model(&r, &o, "test_accuracy", acc, err, sizeof err);
    if (rc != TS_OK) {
        ts_args_fail(o.prog, err, rc);
        ts_classify_run_free(&r);
        return 1;
    }
    fprintf(stderr, "test accuracy %.2f %% (%d/%d) after %lld steps in %.1f s; classifier → %s\n",
            100.0 * acc, right, n, (long long)o.steps, secs, o.out);
    if (o.json)
        ts_json_print(json_pack("{s:b, s:f, s:i, s:I, s:f, s:s}", "done", 1, "test_accuracy", acc,
                                "test_n", n, "steps", (json_int_t)o.steps, "seconds", secs, "out",
                                o.out));
    ts_classify_run_free(&r);
    return 0;
}
