/*
 * classify.c — what `tessera train-classifier`, `train-router` and `calibrate` share (classify.h):
 * the options of the two training verbs, the trunk, the training loop with its progress line,
 * the evaluation of a classifier on clean or noisy test images, saving the model and opening a
 * partition.
 */
#define _POSIX_C_SOURCE 200809L

#include "client/classify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "client/args.h"
#include "client/cli.h"
#include "client/local.h"
#include "kernels/math.h"
#include "kernels/ops.h"

#define EVAL_SEED 0x5eedull /* the router evaluation's noise: the same for every run */

/* The trunk config: the preset, then any size overrides, then the data's image shape. */
static int trunk_config(const cls_opts_t *o, const ts_dataset_t *ds, ts_dit_config_t *cfg,
                        char *err, size_t errlen) {
    if (ts_dit_config_preset(o->model, cfg) != TS_OK) {
        snprintf(err, errlen, "unknown model '%s' (mini, tiny, small, S/2 … XL/8)", o->model);
        return TS_EINVAL;
    }
    if (o->hidden)
        cfg->hidden_size = o->hidden;
    if (o->depth)
        cfg->depth = o->depth;
    if (o->heads)
        cfg->num_heads = o->heads;
    if (o->patch)
        cfg->patch_size = o->patch;
    cfg->in_channels = ds->channels, cfg->input_size = ds->height;
    int rc = ts_dit_config_check(cfg);
    if (rc != TS_OK)
        snprintf(err, errlen,
                 "the trunk (hidden %d, depth %d, heads %d, patch %d on %d×%d images) "
                 "is not a valid DiT: hidden must divide by heads and by 4, the image "
                 "by the patch",
                 cfg->hidden_size, cfg->depth, cfg->num_heads, cfg->patch_size, cfg->input_size,
                 cfg->input_size);
    return rc;
}

/* Trains c for o->steps steps on (ds, targets), printing progress. */
int ts_classify_train_loop(const cls_opts_t *o, ts_classifier_t *c, const ts_dataset_t *ds,
                           const int32_t *targets, double *secs) {
    ts_classifier_train_config_t tc;
    ts_classifier_train_config_default(&tc);
    tc.batch = o->batch, tc.lr = o->lr, tc.warmup = o->warmup, tc.weight_decay = o->wd;
    tc.grad_clip = o->clip, tc.seed = o->seed, tc.total_steps = o->steps;
    tc.augment = !o->no_augment;
    tc.shift = o->shift;
    tc.objective = !o->objective || strcmp(o->objective, "cluster") == 0 ? TS_ROUTER_CLUSTER
                   : strcmp(o->objective, "alignment") == 0              ? TS_ROUTER_ALIGNMENT
                                                                         : TS_ROUTER_MIXTURE;
    tc.align_tau = o->align_tau;
    tc.label_dropout = o->label_dropout > 0.0f ? o->label_dropout : 0.0f;
    tc.residuals = o->residuals;
    tc.residuals_ctx = o->residuals_ctx;
    ts_classifier_trainer_t *tr = NULL;
    int rc = ts_classifier_trainer_init(&tr, c, ds, targets, &tc);
    if (rc != TS_OK) {
        fprintf(stderr, "%s: cannot start training (batch %d, %d images): %s\n", o->prog, o->batch,
                ds->n, ts_strerror(rc));
        return rc;
    }
    int tty = isatty(STDERR_FILENO);
    double t0 = ts_now_s(), t_log = t0;
    int64_t at_log = 0;
    float loss = NAN, acc = NAN, norm = NAN, avg = NAN, avg_acc = NAN;
    for (int64_t s = 0; s < o->steps; s++) {
        rc = ts_classifier_trainer_step(tr, &loss, &acc, &norm);
        if (rc != TS_OK) {
            fprintf(stderr, "\n%s: step %lld failed: %s (loss %g, grad norm %g)\n", o->prog,
                    (long long)s + 1, ts_strerror(rc), loss, norm);
            break;
        }
        avg = isnan(avg) ? loss : 0.98f * avg + 0.02f * loss;
        avg_acc = isnan(avg_acc) ? acc : 0.98f * avg_acc + 0.02f * acc;
        int64_t done = s + 1;
        if (done % o->log_every == 0 || done == o->steps) {
            double t = ts_now_s();
            double sps = (double)(done - at_log) * o->batch / (t - t_log + 1e-9);
            double eta = (double)(o->steps - done) * o->batch / (sps + 1e-9);
            fprintf(stderr,
                    "%sstep %lld/%lld  loss %.4f (avg %.4f)  acc %.3f (avg %.3f)  |g| %.3f  "
                    "lr %.2e  %.0f samples/s  ETA %dm%02ds%s",
                    tty ? "\r" : "", (long long)done, (long long)o->steps, loss, avg, acc, avg_acc,
                    norm, ts_classifier_lr(&tc, s), sps, (int)eta / 60, (int)eta % 60,
                    tty ? "   " : "\n");
            if (o->json)
                printf("{\"step\":%lld,\"loss\":%.6f,\"loss_avg\":%.6f,\"acc_avg\":%.4f,"
                       "\"grad_norm\":%.4f,\"samples_per_s\":%.1f}\n",
                       (long long)done, loss, avg, avg_acc, norm, sps);
            t_log = t, at_log = done;
        }
    }
    if (tty)
        fprintf(stderr, "\n");
    *secs = ts_now_s() - t0;
    ts_classifier_trainer_free(tr);
    return rc;
}

int ts_classify_argmax(const float *z, int K) {
    int best = 0;
    for (int k = 1; k < K; k++)
        best = z[k] > z[best] ? k : best;
    return best;
}

void ts_classify_eval_free(eval_bufs_t *b) {
    ts_tensor_t *all[] = {&b->x0, &b->eps, &b->xt, &b->vel, &b->t};
    for (int i = 0; i < 5; i++)
        ts_tensor_free(all[i]);
    free(b->logits);
    free(b->t_host);
}

int ts_classify_eval_init(eval_bufs_t *b, const ts_engine_t *e, const ts_dataset_t *ds, int B,
                          int K) {
    memset(b, 0, sizeof *b);
    const int64_t *shape = TS_SHAPE(B, ds->channels, ds->height, ds->width);
    ts_tensor_t *imgs[] = {&b->x0, &b->eps, &b->xt, &b->vel};
    int rc = TS_OK;
    for (int i = 0; i < 4 && rc == TS_OK; i++)
        rc = ts_tensor_alloc(imgs[i], TS_F32, e->device, 4, shape);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&b->t, TS_F32, e->device, 1, TS_SHAPE(B));
    b->logits = malloc((size_t)B * (size_t)K * sizeof(float));
    b->t_host = malloc((size_t)B * sizeof(float));
    if (rc == TS_OK && (!b->logits || !b->t_host))
        rc = TS_ENOMEM;
    if (rc != TS_OK) {
        ts_classify_eval_free(b);
        memset(b, 0, sizeof *b);
    }
    return rc;
}

/* Logits of images [lo, lo + n) of ds into b->logits: clean at t = 0, or, when bucket ≥ 0, as
 * x_t with t uniform in [bucket/10, (bucket+1)/10) and ε from the fixed evaluation stream. */
int ts_classify_eval_batch(ts_classifier_t *c, ts_engine_t *e, eval_bufs_t *b,
                           const ts_dataset_t *ds, int lo, int n, int bucket) {
    int64_t chw = (int64_t)ds->channels * ds->height * ds->width;
    ts_tensor_t host, x0, eps, xt, vel, t;
    int rc = ts_tensor_slice(&x0, &b->x0, 0, n);
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&host, ds->images + (int64_t)lo * chw, TS_F32, TS_CPU, 4, x0.shape);
    if (rc == TS_OK)
        rc = ts_tensor_copy(&x0, &host);
    if (rc != TS_OK || bucket < 0)
        return rc != TS_OK ? rc : ts_classifier_run(c, &x0, NULL, n, NULL, b->logits);
    uint64_t key = EVAL_SEED + (uint64_t)bucket;
    for (int i = 0; i < n; i++)
        b->t_host[i] = ((float)bucket + ts_rng_uniform_at(key, (uint64_t)(lo + i))) / N_BUCKETS;
    rc = ts_tensor_slice(&t, &b->t, 0, n);
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&host, b->t_host, TS_F32, TS_CPU, 1, TS_SHAPE(n));
    if (rc == TS_OK)
        rc = ts_tensor_copy(&t, &host);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&eps, &b->eps, 0, n);
    if (rc == TS_OK)
        rc = ts_rng_normal(e, &eps, key ^ 0xabcdefull, (uint64_t)lo * (uint64_t)chw);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&xt, &b->xt, 0, n);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&vel, &b->vel, 0, n);
    if (rc == TS_OK)
        rc = ts_flow_interp(e, &xt, &vel, &x0, &eps, &t);
    if (rc == TS_OK)
        rc = ts_classifier_run_labels(c, &xt, &t, ds->labels + lo, n, NULL, b->logits);
    return rc;
}

/* Correct predictions over the first n images of ds against truth (clean, or noisy in bucket). */
int ts_classify_eval_accuracy(ts_classifier_t *c, ts_engine_t *e, const ts_dataset_t *ds,
                              const int32_t *truth, int n, int B, int bucket, int *right) {
    eval_bufs_t b;
    int K = ts_classifier_num_outputs(c);
    int rc = ts_classify_eval_init(&b, e, ds, B, K);
    *right = 0;
    for (int lo = 0; lo < n && rc == TS_OK; lo += B) {
        int m = n - lo < B ? n - lo : B;
        rc = ts_classify_eval_batch(c, e, &b, ds, lo, m, bucket);
        for (int i = 0; rc == TS_OK && i < m; i++)
            *right += ts_classify_argmax(b.logits + (int64_t)i * K, K) == truth[lo + i];
    }
    ts_classify_eval_free(&b);
    return rc;
}

/* The options both verbs share, then the verb's own, parsed into o: TS_ARGS_RUN, or the exit code
 * (ts_args_parse). */
int ts_classify_parse(cls_opts_t *o, int router, int argc, char **argv) {
    /* clang-format off */
    o->device = (ts_device_spec_t){.automatic = 1}; /* as tesserad: a GPU when there is one */
    ts_arg_t common[] = {
        {"data", TS_ARG_STRING, &o->fmnist_dir, "DIR", "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"partition", TS_ARG_STRING, &o->partition, "DIR", "the partition (a folder with partition.safetensors, or the file)", 0, 0, 1},
        {"model", TS_ARG_STRING, &o->model, "NAME", "trunk config: mini, tiny, small, S/2, ... (default tiny)"},
        {"hidden", TS_ARG_INT, &o->hidden, "N", "override the trunk's hidden size", 4, 8192},
        {"depth", TS_ARG_INT, &o->depth, "N", "override the trunk's depth", 1, 256},
        {"heads", TS_ARG_INT, &o->heads, "N", "override the trunk's attention heads", 1, 1024},
        {"patch", TS_ARG_INT, &o->patch, "N", "override the trunk's patch size", 1, 64},
        {"steps", TS_ARG_I64, &o->steps, "N", "optimisation steps (default 3000)", 1, 1e12},
        {"batch", TS_ARG_INT, &o->batch, "B", "samples per step (default 64)", 1, 65536},
        {"lr", TS_ARG_FLOAT, &o->lr, "X", "peak learning rate, cosine-decayed to 0 (default 1e-3)", 1e-9, 10},
        {"warmup", TS_ARG_INT, &o->warmup, "N", "linear warm-up steps (default 200)", 0, 1e9},
        {"weight-decay", TS_ARG_FLOAT, &o->wd, "X", "AdamW decoupled weight decay (default 0.05)", 0, 10},
        {"grad-clip", TS_ARG_FLOAT, &o->clip, "X", "max gradient norm, 0 = off (default 1)", 0, 1e9},
        {"seed", TS_ARG_U64, &o->seed, "S", "seed of every random draw (default 0)"},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"device", TS_ARG_DEVICE, &o->device, "NAME", "where to compute: " TS_DEVICE_SPEC_HELP " (default auto)"},
        {"eval-n", TS_ARG_INT, &o->eval_n, "N", router ? "test images per t-bucket (default 2000)" : "test images evaluated (default all 10000)", 1, 1e9},
        {"log-every", TS_ARG_INT, &o->log_every, "N", "progress line every N steps (default 100)", 1, 1e9},
        {"json", TS_ARG_FLAG, &o->json, NULL, "JSON lines on stdout (progress and summary)"},
        {"out", TS_ARG_STRING, &o->out, "FILE", "where to write the model (.safetensors)", 0, 0, 1},
        {"shift", TS_ARG_INT, &o->shift, "N", "augmentation: random shifts of up to N pixels each way, 0 = flips only (default 2)", 0, 8},
        {"no-augment", TS_ARG_FLAG, &o->no_augment, NULL, "train on the images as they are (default: random horizontal flips and shifts of up to --shift pixels)"},
    };
    ts_arg_t router_only[] = {
        {"objective", TS_ARG_STRING, &o->objective, "NAME", "cluster (the image's cluster), alignment (the expert with the lowest denoising loss, soft targets softmax(-loss/tau)) or mixture (the weights whose mixture of the experts' velocities is closest to the flow target) (default cluster)"},
        {"experts", TS_ARG_STRING, &o->experts, "DIR", "the generation folder whose experts (trained on this partition) the alignment and mixture objectives run"},
        {"align-tau", TS_ARG_FLOAT, &o->align_tau, "T", "the temperature of the alignment targets (default 0.02)", 1e-9, 1e9},
        {"label-aware", TS_ARG_FLAG, &o->label_aware, NULL, "the router also reads the class asked for: it learns p(k | x_t, y), and p(k | x_t) for the null label (no class prior needed)"},
        {"label-dropout", TS_ARG_FLOAT, &o->label_dropout, "P", "with --label-aware: the probability a training sample's label is replaced by the null label (default 0.1)", 0, 1},
    };
    /* clang-format on */
    int n = (int)(sizeof common / sizeof common[0]);
    ts_arg_t all[sizeof common / sizeof common[0] + sizeof router_only / sizeof router_only[0]];
    if (router) { /* a router is never augmented (model/classifier.h): no --shift, --no-augment */
        n -= 2;
        memcpy(all, common, (size_t)n * sizeof common[0]);
        memcpy(all + n, router_only, sizeof router_only);
        n += (int)(sizeof router_only / sizeof router_only[0]);
    } else { /* no --partition */
        memmove(&common[1], &common[2], (size_t)(n - 2) * sizeof common[0]);
        n--;
        memcpy(all, common, (size_t)n * sizeof common[0]);
    }
    return ts_args_parse(o->prog,
                         router
                             ? "Train a router: a DiT-trunk classifier of noisy x_t (t ~ U(0,1)) "
                               "predicting the image's cluster in a partition.\nexample: tessera "
                               "train-router --partition experts --steps 2000 --out "
                               "experts/router.safetensors"
                             : "Train the evaluation classifier: a DiT trunk on clean "
                               "Fashion-MNIST images predicting the 10 labels.\nexample: tessera "
                               "train-classifier --steps 3000 --out classifier.safetensors",
                         all, n, argc, argv);
}

void ts_classify_defaults(cls_opts_t *o, const char *prog) {
    memset(o, 0, sizeof *o);
    ts_classifier_train_config_t tc;
    ts_classifier_train_config_default(&tc);
    o->prog = prog, o->fmnist_dir = TS_FMNIST_DEFAULT_DIR, o->model = "tiny", o->steps = 3000;
    o->batch = tc.batch, o->lr = tc.lr, o->warmup = tc.warmup, o->wd = tc.weight_decay;
    o->clip = tc.grad_clip, o->log_every = 100, o->shift = tc.shift;
    o->objective = "cluster", o->align_tau = 0.02f, o->label_dropout = -1.0f; /* unset */
}

void ts_classify_run_free(cls_run_t *r) {
    ts_classifier_free(r->c);
    ts_engine_free(&r->eng);
    ts_dataset_free(&r->train);
    ts_dataset_free(&r->test);
}

int ts_classify_run_start(cls_run_t *r, const cls_opts_t *o, int K, int time_conditioned, char *err,
                          size_t errlen) {
    memset(r, 0, sizeof *r);
    int rc = ts_fmnist_load(o->fmnist_dir, "train", &r->train, err, errlen);
    if (rc == TS_OK)
        rc = ts_fmnist_load(o->fmnist_dir, "test", &r->test, err, errlen);
    if (rc == TS_OK)
        rc = ts_cli_engine(&r->eng, &o->device, o->threads, o->prog, err, errlen);
    ts_dit_config_t cfg;
    if (rc == TS_OK)
        rc = trunk_config(o, &r->train, &cfg, err, errlen);
    int L = o->label_aware ? TS_FMNIST_NUM_CLASSES : 0;
    if (rc == TS_OK && (rc = ts_classifier_create_labelled(&r->c, &cfg, K, L, time_conditioned,
                                                           &r->eng, o->batch, 1)) != TS_OK)
        snprintf(err, errlen, "cannot build the classifier");
    if (rc == TS_OK && (rc = ts_classifier_init_weights(r->c, o->seed)) != TS_OK)
        snprintf(err, errlen, "cannot initialise the classifier");
    if (rc == TS_OK)
        fprintf(stderr,
                "%s: trunk hidden %d, depth %d, heads %d, patch %d; %d outputs; %d train "
                "images, batch %d, %d steps, %d threads\n",
                o->prog, cfg.hidden_size, cfg.depth, cfg.num_heads, cfg.patch_size, K, r->train.n,
                o->batch, (int)o->steps, r->eng.threads);
    return rc;
}

/* Records the run in the metadata and writes the file. */
int ts_classify_save_model(cls_run_t *r, const cls_opts_t *o, const char *acc_key, double acc,
                           char *err, size_t errlen) {
    char steps[32], accb[32];
    snprintf(steps, sizeof steps, "%lld", (long long)o->steps);
    snprintf(accb, sizeof accb, "%.4f", acc);
    int rc = ts_classifier_set_meta(r->c, "train_steps", steps);
    if (rc == TS_OK)
        rc = ts_classifier_set_meta(r->c, acc_key, accb);
    if (rc == TS_OK)
        rc = ts_classifier_set_meta(r->c, "dataset", "fashion-mnist");
    if (rc != TS_OK)
        snprintf(err, errlen, "cannot set the metadata");
    else
        rc = ts_classifier_save(r->c, o->out, err, errlen);
    return rc;
}

/* --partition is a folder holding partition.safetensors, or the file itself. */
int ts_classify_load_partition(const char *where, ts_partition_t *p, char *err, size_t errlen) {
    size_t len = strlen(where);
    const char *ext = ".safetensors";
    if (len >= strlen(ext) && strcmp(where + len - strlen(ext), ext) == 0)
        return ts_partition_load(where, p, err, errlen);
    char path[4096];
    snprintf(path, sizeof path, "%s/partition.safetensors", where);
    return ts_partition_load(path, p, err, errlen);
}
