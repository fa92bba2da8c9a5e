/*
 * cmd_train_router.c — `tessera train-router`: a router, a DiT trunk (model/classifier.h)
 * trained with cross-entropy on noisy x_t = (1 − t)·x0 + t·ε with t ~ U(0, 1) → the image's
 * cluster in a partition (its assignment of the train set). At the end it reports the accuracy
 * per t-bucket [0, 0.1), [0.1, 0.2), … on test images, each labelled with its nearest centroid
 * (ts_partition_embed + ts_partition_nearest): high near t = 0, down to chance near t = 1, where
 * x_t is almost pure noise. What it shares with train-classifier and calibrate is in classify.h.
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
#include "client/local.h"
#include "model/ensemble.h"

/* train-router's run: the partition, the trunk, the experts of the expert objectives, the held-out
 * truth and the accuracy per t-bucket (router_free releases it all). */
typedef struct {
    cls_opts_t o;
    cls_run_t r;
    ts_partition_t p;
    ts_local_t experts;
    ts_expert_residuals_t res;
    int32_t *truth; /* (n) each test image's nearest centroid */
    float *emb;
    int n;
    double secs, acc[N_BUCKETS], mean;
    char err[512];
} router_run_t;

/* train-router's own options: 0, or 2 with the message printed. */
static int router_validate(cls_opts_t *o) {
    int expert_objective = strcmp(o->objective, "cluster") != 0;
    if (strcmp(o->objective, "cluster") != 0 && strcmp(o->objective, "alignment") != 0 &&
        strcmp(o->objective, "mixture") != 0) {
        fprintf(stderr, "%s: --objective %s: must be cluster, alignment or mixture\n", o->prog,
                o->objective);
        return 2;
    }
    if (o->label_dropout >= 0.0f && !o->label_aware) {
        fprintf(stderr, "%s: --label-dropout goes with --label-aware\n", o->prog);
        return 2;
    }
    if (o->label_dropout < 0.0f)
        o->label_dropout = 0.1f; /* the default */
    if (expert_objective != (o->experts != NULL)) {
        fprintf(stderr,
                "%s: --experts DIR goes with --objective alignment or mixture, and they "
                "need it\n",
                o->prog);
        return 2;
    }
    return 0;
}

/* The partition, the data and the trunk; the partition must cover the train set. The router's
 * metadata: its partition, its objective and its label dropout. */
static int router_start(router_run_t *rr) {
    const cls_opts_t *o = &rr->o;
    cls_run_t *r = &rr->r;
    char *err = rr->err;
    size_t errlen = sizeof rr->err;
    int rc = ts_classify_load_partition(o->partition, &rr->p, err, errlen);
    if (rc == TS_OK)
        rc = ts_classify_run_start(r, o, rr->p.K, 1, err, errlen);
    int64_t D = (int64_t)r->train.channels * r->train.height * r->train.width;
    if (rc == TS_OK && (rr->p.n != r->train.n || rr->p.D != D)) {
        snprintf(err, errlen,
                 "partition %s covers %lld images of %d values, the train set has "
                 "%d of %lld: partition the full train set",
                 o->partition, (long long)rr->p.n, rr->p.D, r->train.n, (long long)D);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK && (rc = ts_classifier_set_meta(r->c, "partition_id", rr->p.id)) != TS_OK)
        snprintf(err, errlen, "cannot set the metadata");
    if (rc == TS_OK && (rc = ts_classifier_set_meta(r->c, "objective", o->objective)) != TS_OK)
        snprintf(err, errlen, "cannot set the metadata");
    char drop[32];
    snprintf(drop, sizeof drop, "%g", (double)o->label_dropout);
    if (rc == TS_OK && o->label_aware &&
        (rc = ts_classifier_set_meta(r->c, "label_dropout", drop)) != TS_OK)
        snprintf(err, errlen, "cannot set the metadata");
    return rc;
}

/* The alignment and mixture objectives: the experts of --experts, trained on this partition,
 * whose residuals the targets are made of. */
static int open_experts(router_run_t *rr) {
    cls_opts_t *o = &rr->o;
    ts_local_t *ex = &rr->experts;
    char *err = rr->err;
    size_t errlen = sizeof rr->err;
    int rc = ts_local_open(ex, o->experts, &rr->r.eng, o->batch, 1, 0, o->prog, err, errlen);
    if (rc == TS_OK && ex->ex.K != rr->p.K) {
        snprintf(err, errlen, "%s holds %d experts, the partition has %d clusters", o->experts,
                 ex->ex.K, rr->p.K);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK && ex->has_part && strcmp(ex->part.id, rr->p.id) != 0) {
        snprintf(err, errlen,
                 "the experts of %s were trained on partition %.12s…, not "
                 "on %.12s…",
                 o->experts, ex->part.id, rr->p.id);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK)
        rc = ts_expert_residuals_init(&rr->res, ex->ex.models, ex->ex.K, o->batch);
    o->residuals = ts_expert_residuals_fn;
    o->residuals_ctx = &rr->res;
    return rc;
}

/* The accuracy per t-bucket on the first --eval-n test images, against their nearest centroid. */
static int eval_router(router_run_t *rr) {
    cls_run_t *r = &rr->r;
    const ts_partition_t *p = &rr->p;
    int n = rr->n;
    rr->truth = malloc((size_t)n * sizeof *rr->truth);
    rr->emb = malloc((size_t)n * (size_t)p->k * sizeof *rr->emb);
    int rc =
        (!rr->truth || !rr->emb) ? TS_ENOMEM : ts_partition_embed(p, r->test.images, n, rr->emb);
    if (rc == TS_OK)
        rc = ts_partition_nearest(p, rr->emb, n, rr->truth, NULL);
    if (rc != TS_OK)
        snprintf(rr->err, sizeof rr->err, "cannot assign the test images to clusters");
    for (int j = 0; j < N_BUCKETS && rc == TS_OK; j++) {
        int right = 0;
        rc = ts_classify_eval_accuracy(r->c, &r->eng, &r->test, rr->truth, n, rr->o.batch, j,
                                       &right);
        rr->acc[j] = (double)right / n;
        rr->mean += rr->acc[j] / N_BUCKETS;
        if (rc != TS_OK)
            snprintf(rr->err, sizeof rr->err, "evaluation failed");
    }
    return rc;
}

/* The accuracy table on stdout (and with --json one JSON object), the last line on stderr. */
static void print_router(const router_run_t *rr) {
    const cls_opts_t *o = &rr->o;
    const ts_partition_t *p = &rr->p;
    int largest = 0;
    for (int k = 0; k < p->K; k++)
        largest = p->sizes[k] > largest ? p->sizes[k] : largest;
    printf("router accuracy by t on %d test images (nearest-centroid truth%s; chance: 1/K "
           "= %.3f, largest cluster %.3f)\n",
           rr->n, o->label_aware ? ", each given its label" : "", 1.0 / p->K,
           (double)largest / (double)p->n);
    printf("  t bucket       accuracy\n");
    for (int j = 0; j < N_BUCKETS; j++)
        printf("  [%.1f, %.1f)     %.3f\n", j / 10.0, (j + 1) / 10.0, rr->acc[j]);
    printf("  mean           %.3f\n", rr->mean);
    if (o->json) {
        json_t *buckets = json_array();
        for (int j = 0; buckets && j < N_BUCKETS; j++)
            json_array_append_new(buckets, json_real(rr->acc[j]));
        ts_json_print(json_pack("{s:b, s:s, s:I, s:f, s:o*, s:s, s:b}", "done", 1, "partition_id",
                                p->id, "steps", (json_int_t)o->steps, "seconds", rr->secs,
                                "bucket_accuracy", buckets, "out", o->out, "label_aware",
                                o->label_aware));
    }
    fprintf(stderr, "trained %lld steps in %.1f s; router → %s\n", (long long)o->steps, rr->secs,
            o->out);
}

static void router_free(router_run_t *rr) {
    free(rr->truth);
    free(rr->emb);
    ts_expert_residuals_free(&rr->res);
    ts_local_free(&rr->experts);
    ts_classify_run_free(&rr->r);
    ts_partition_free(&rr->p);
}

int ts_cmd_train_router(int argc, char **argv) {
    router_run_t *rr = calloc(1, sizeof *rr);
    if (!rr)
        return 1;
    ts_classify_defaults(&rr->o, "tessera train-router");
    rr->o.eval_n = 2000;
    int code = ts_classify_parse(&rr->o, 1, argc, argv);
    int go = code == TS_ARGS_RUN;
    if (go)
        code = router_validate(&rr->o);
    if (go && code == 0) {
        const cls_opts_t *o = &rr->o;
        int rc = router_start(rr);
        if (rc == TS_OK && o->experts)
            rc = open_experts(rr);
        if (rc == TS_OK && (rc = ts_classify_train_loop(o, rr->r.c, &rr->r.train, rr->p.assignment,
                                                        &rr->secs)) != TS_OK)
            snprintf(rr->err, sizeof rr->err, "training failed");
        rr->n = o->eval_n < rr->r.test.n ? o->eval_n : rr->r.test.n;
        if (rc == TS_OK)
            rc = eval_router(rr);
        if (rc == TS_OK)
            rc = ts_classify_save_model(&rr->r, o, "ts_classify_eval_accuracy", rr->mean, rr->err,
                                        sizeof rr->err);
        if (rc == TS_OK)
            print_router(rr);
        code = rc == TS_OK ? 0 : ts_args_fail(o->prog, rr->err, rc);
    }
    router_free(rr);
    free(rr);
    return code;
}
