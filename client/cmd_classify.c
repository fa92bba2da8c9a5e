/*
 * cmd_classify.c — `tessera train-classifier` and `tessera train-router`: the two DiT-trunk
 * classifiers of model/classifier.h, trained with cross-entropy.
 *
 *   train-classifier  clean Fashion-MNIST images → the 10 labels. At the end it reports the
 *                     accuracy on the 10k test split (the issue asks ≥ 90 %); its features are
 *                     the evaluation space of the Fréchet distance.
 *   train-router      noisy x_t = (1 − t)·x0 + t·ε with t ~ U(0, 1) → the image's cluster in a
 *                     partition (its assignment of the train set). At the end it reports the
 *                     accuracy per t-bucket [0, 0.1), [0.1, 0.2), … on test images, each labelled
 *                     with its nearest centroid (ts_partition_embed + ts_partition_nearest): high
 *                     near t = 0, down to chance near t = 1, where x_t is almost pure noise.
 *   calibrate         how calibrated a router's probabilities are along t: per t-bucket on
 *                     held-out test images (nearest-centroid truth), accuracy, NLL and expected
 *                     calibration error (model/quality.h), and the temperature that minimises the
 *                     NLL — per bucket and one for every t, each fitted on the first half of the
 *                     images and scored on the second. The class prior of class-aware routing
 *                     multiplies p(k | x_t) as if it were calibrated; `eval --policies
 *                     POLICY+temp=T` applies the temperature.
 *
 * Both print the progress line of `tessera train` on stderr (rewritten in place on a terminal)
 * and with --json one JSON object per log line and a summary on stdout. The trunk is a DiT
 * preset (--model) whose sizes --hidden, --depth, --heads and --patch may override.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "client/args.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "client/local.h"
#include "kernels/math.h"
#include "model/classifier.h"
#include "model/ensemble.h"
#include "model/fmnist.h"
#include "model/partition.h"
#include "model/quality.h"

#define N_BUCKETS 10
#define EVAL_SEED 0x5eedull /* the router evaluation's noise: the same for every run */

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
static int train_loop(const cls_opts_t *o, ts_classifier_t *c, const ts_dataset_t *ds,
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

static int argmax(const float *z, int K) {
    int best = 0;
    for (int k = 1; k < K; k++)
        best = z[k] > z[best] ? k : best;
    return best;
}

/* Evaluation buffers for batches of up to B images of ds's shape. */
typedef struct {
    ts_tensor_t x0, eps, xt, vel, t;
    float *logits, *t_host;
} eval_bufs_t;

static void eval_free(eval_bufs_t *b) {
    ts_tensor_t *all[] = {&b->x0, &b->eps, &b->xt, &b->vel, &b->t};
    for (int i = 0; i < 5; i++)
        ts_tensor_free(all[i]);
    free(b->logits);
    free(b->t_host);
}

static int eval_init(eval_bufs_t *b, const ts_engine_t *e, const ts_dataset_t *ds, int B, int K) {
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
        eval_free(b);
        memset(b, 0, sizeof *b);
    }
    return rc;
}

/* Logits of images [lo, lo + n) of ds into b->logits: clean at t = 0, or, when bucket ≥ 0, as
 * x_t with t uniform in [bucket/10, (bucket+1)/10) and ε from the fixed evaluation stream. */
static int eval_batch(ts_classifier_t *c, ts_engine_t *e, eval_bufs_t *b, const ts_dataset_t *ds,
                      int lo, int n, int bucket) {
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
static int eval_accuracy(ts_classifier_t *c, ts_engine_t *e, const ts_dataset_t *ds,
                         const int32_t *truth, int n, int B, int bucket, int *right) {
    eval_bufs_t b;
    int K = ts_classifier_num_outputs(c);
    int rc = eval_init(&b, e, ds, B, K);
    *right = 0;
    for (int lo = 0; lo < n && rc == TS_OK; lo += B) {
        int m = n - lo < B ? n - lo : B;
        rc = eval_batch(c, e, &b, ds, lo, m, bucket);
        for (int i = 0; rc == TS_OK && i < m; i++)
            *right += argmax(b.logits + (int64_t)i * K, K) == truth[lo + i];
    }
    eval_free(&b);
    return rc;
}

/* The options both verbs share, then the verb's own, parsed into o: TS_ARGS_RUN, or the exit code
 * (ts_args_parse). */
static int parse(cls_opts_t *o, int router, int argc, char **argv) {
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

static void cls_defaults(cls_opts_t *o, const char *prog) {
    memset(o, 0, sizeof *o);
    ts_classifier_train_config_t tc;
    ts_classifier_train_config_default(&tc);
    o->prog = prog, o->fmnist_dir = TS_FMNIST_DEFAULT_DIR, o->model = "tiny", o->steps = 3000;
    o->batch = tc.batch, o->lr = tc.lr, o->warmup = tc.warmup, o->wd = tc.weight_decay;
    o->clip = tc.grad_clip, o->log_every = 100, o->shift = tc.shift;
    o->objective = "cluster", o->align_tau = 0.02f, o->label_dropout = -1.0f; /* unset */
}

/* The data, the engine and a freshly initialised classifier: common to both verbs. */
typedef struct {
    ts_dataset_t train, test;
    ts_engine_t eng;
    ts_classifier_t *c;
} cls_run_t;

static void run_free(cls_run_t *r) {
    ts_classifier_free(r->c);
    ts_engine_free(&r->eng);
    ts_dataset_free(&r->train);
    ts_dataset_free(&r->test);
}

static int run_start(cls_run_t *r, const cls_opts_t *o, int K, int time_conditioned, char *err,
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
static int save_model(cls_run_t *r, const cls_opts_t *o, const char *acc_key, double acc, char *err,
                      size_t errlen) {
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

int ts_cmd_train_classifier(int argc, char **argv) {
    cls_opts_t o;
    cls_defaults(&o, "tessera train-classifier");
    int pr = parse(&o, 0, argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    char err[512] = "";
    cls_run_t r;
    double secs = 0;
    int rc = run_start(&r, &o, TS_FMNIST_NUM_CLASSES, 0, err, sizeof err);
    if (rc == TS_OK && (rc = train_loop(&o, r.c, &r.train, r.train.labels, &secs)) != TS_OK)
        snprintf(err, sizeof err, "training failed");
    int n = o.eval_n && o.eval_n < r.test.n ? o.eval_n : r.test.n, right = 0;
    if (rc == TS_OK &&
        (rc = eval_accuracy(r.c, &r.eng, &r.test, r.test.labels, n, o.batch, -1, &right)) != TS_OK)
        snprintf(err, sizeof err, "evaluation on the test split failed");
    double acc = n ? (double)right / n : 0.0;
    if (rc == TS_OK)
        rc = save_model(&r, &o, "test_accuracy", acc, err, sizeof err);
    if (rc != TS_OK) {
        ts_args_fail(o.prog, err, rc);
        run_free(&r);
        return 1;
    }
    fprintf(stderr, "test accuracy %.2f %% (%d/%d) after %lld steps in %.1f s; classifier → %s\n",
            100.0 * acc, right, n, (long long)o.steps, secs, o.out);
    if (o.json)
        ts_json_print(json_pack("{s:b, s:f, s:i, s:I, s:f, s:s}", "done", 1, "test_accuracy", acc,
                                "test_n", n, "steps", (json_int_t)o.steps, "seconds", secs, "out",
                                o.out));
    run_free(&r);
    return 0;
}

/* --partition is a folder holding partition.safetensors, or the file itself. */
static int load_partition(const char *where, ts_partition_t *p, char *err, size_t errlen) {
    size_t len = strlen(where);
    const char *ext = ".safetensors";
    if (len >= strlen(ext) && strcmp(where + len - strlen(ext), ext) == 0)
        return ts_partition_load(where, p, err, errlen);
    char path[4096];
    snprintf(path, sizeof path, "%s/partition.safetensors", where);
    return ts_partition_load(path, p, err, errlen);
}

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
    int rc = load_partition(o->partition, &rr->p, err, errlen);
    if (rc == TS_OK)
        rc = run_start(r, o, rr->p.K, 1, err, errlen);
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
        rc = eval_accuracy(r->c, &r->eng, &r->test, rr->truth, n, rr->o.batch, j, &right);
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
    run_free(&rr->r);
    ts_partition_free(&rr->p);
}

int ts_cmd_train_router(int argc, char **argv) {
    router_run_t *rr = calloc(1, sizeof *rr);
    if (!rr)
        return 1;
    cls_defaults(&rr->o, "tessera train-router");
    rr->o.eval_n = 2000;
    int code = parse(&rr->o, 1, argc, argv);
    int go = code == TS_ARGS_RUN;
    if (go)
        code = router_validate(&rr->o);
    if (go && code == 0) {
        const cls_opts_t *o = &rr->o;
        int rc = router_start(rr);
        if (rc == TS_OK && o->experts)
            rc = open_experts(rr);
        if (rc == TS_OK &&
            (rc = train_loop(o, rr->r.c, &rr->r.train, rr->p.assignment, &rr->secs)) != TS_OK)
            snprintf(rr->err, sizeof rr->err, "training failed");
        rr->n = o->eval_n < rr->r.test.n ? o->eval_n : rr->r.test.n;
        if (rc == TS_OK)
            rc = eval_router(rr);
        if (rc == TS_OK)
            rc = save_model(&rr->r, o, "eval_accuracy", rr->mean, rr->err, sizeof rr->err);
        if (rc == TS_OK)
            print_router(rr);
        code = rc == TS_OK ? 0 : ts_args_fail(o->prog, rr->err, rc);
    }
    router_free(rr);
    free(rr);
    return code;
}

/* ---- tessera calibrate ------------------------------------------------------------------------ */

#define CAL_BINS_DEFAULT 15

typedef struct {
    double acc, nll, ece;   /* raw logits, on the scoring half */
    double T, nll_t, ece_t; /* this bucket's own temperature (fitted on the fitting half) */
    double ece_g, nll_g;    /* the global temperature */
} cal_bucket_t;

/* Logits (n, K) of the router for the first n test images in t-bucket j. */
static int bucket_logits(ts_classifier_t *c, ts_engine_t *e, const ts_dataset_t *test, int n, int B,
                         int j, float *out) {
    eval_bufs_t b;
    int K = ts_classifier_num_outputs(c);
    int rc = eval_init(&b, e, test, B, K);
    for (int lo = 0; lo < n && rc == TS_OK; lo += B) {
        int m = n - lo < B ? n - lo : B;
        rc = eval_batch(c, e, &b, test, lo, m, j);
        if (rc == TS_OK)
            memcpy(out + (int64_t)lo * K, b.logits, (size_t)m * K * sizeof *out);
    }
    eval_free(&b);
    return rc;
}

/* One bucket's statistics: fit on rows [0, h), score on [h, n). */
static int cal_score(const float *z, const int32_t *y, int n, int K, int bins, double Tg,
                     cal_bucket_t *q, char *err, size_t errlen) {
    int h = n / 2;
    const float *zs = z + (int64_t)h * K;
    const int32_t *ys = y + h;
    int right = 0;
    for (int i = h; i < n; i++)
        right += argmax(z + (int64_t)i * K, K) == y[i];
    q->acc = (double)right / (n - h);
    TS_TRY(ts_calib_nll(zs, ys, n - h, K, 1.0, &q->nll, err, errlen));
    TS_TRY(ts_calib_ece(zs, ys, n - h, K, 1.0, bins, &q->ece, err, errlen));
    TS_TRY(ts_calib_fit_temperature(z, y, h, K, &q->T, err, errlen));
    TS_TRY(ts_calib_nll(zs, ys, n - h, K, q->T, &q->nll_t, err, errlen));
    TS_TRY(ts_calib_ece(zs, ys, n - h, K, q->T, bins, &q->ece_t, err, errlen));
    TS_TRY(ts_calib_nll(zs, ys, n - h, K, Tg, &q->nll_g, err, errlen));
    return ts_calib_ece(zs, ys, n - h, K, Tg, bins, &q->ece_g, err, errlen);
}

static void cal_print(const char *router, int n, double Tg, const cal_bucket_t *q, int json) {
    if (json) {
        json_t *list = json_array();
        for (int j = 0; j < N_BUCKETS; j++)
            json_array_append_new(
                list,
                json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "t_lo", j / 10.0,
                          "t_hi", (j + 1) / 10.0, "accuracy", q[j].acc, "nll", q[j].nll, "ece",
                          q[j].ece, "temperature", q[j].T, "nll_fit", q[j].nll_t, "ece_fit",
                          q[j].ece_t, "nll_global", q[j].nll_g, "ece_global", q[j].ece_g));
        ts_json_print(json_pack("{s:s, s:i, s:f, s:o}", "router", router, "n", n, "temperature", Tg,
                                "buckets", list));
        return;
    }
    printf("router calibration on %d test images per t-bucket (nearest-centroid truth); each "
           "temperature fitted on the first half, every number scored on the second\n",
           n);
    printf("  t bucket     accuracy   NLL    ECE   |  T (own)  NLL    ECE   |  ECE at T = %.3f\n",
           Tg);
    for (int j = 0; j < N_BUCKETS; j++)
        printf("  [%.1f, %.1f)   %.3f   %6.3f %6.3f |  %6.3f  %6.3f %6.3f |  %6.3f\n", j / 10.0,
               (j + 1) / 10.0, q[j].acc, q[j].nll, q[j].ece, q[j].T, q[j].nll_t, q[j].ece_t,
               q[j].ece_g);
    printf("one temperature for every t: %.4f (eval --policies 'learned+prior+temp=%.3f:top1')\n",
           Tg, Tg);
}

typedef struct {
    const char *router, *partition, *fmnist_dir;
    int n, bins, batch, threads, json;
} cal_opts_t;

/* Everything one calibration opens and allocates (cal_free releases it all). */
typedef struct {
    cal_opts_t o;
    ts_engine_t eng;
    ts_classifier_t *c;
    ts_partition_t p;
    ts_dataset_t test;
    int K, h;       /* clusters; the fitting half of the n images */
    float *z, *emb; /* (buckets, n, K) logits */
    float *zf;      /* (buckets, h, K) the fitting halves, for the global temperature */
    int32_t *truth; /* (n) nearest centroids */
    int32_t *yf;    /* (buckets, h) */
    double Tg;      /* the global temperature */
    cal_bucket_t q[N_BUCKETS];
    char err[512];
} cal_run_t;

/* The options from the command line: TS_ARGS_RUN, or the exit code (ts_args_parse). */
static int cal_parse(int argc, char **argv, cal_opts_t *o) {
    *o = (cal_opts_t){
        .fmnist_dir = TS_FMNIST_DEFAULT_DIR, .n = 2000, .bins = CAL_BINS_DEFAULT, .batch = 64};
    /* clang-format off */
    ts_arg_t args[] = {
        {"router", TS_ARG_STRING, &o->router, "FILE", "the router (`tessera train-router`)", 0, 0, 1},
        {"partition", TS_ARG_STRING, &o->partition, "DIR", "its partition (a folder with partition.safetensors, or the file): the truth is each test image's nearest centroid", 0, 0, 1},
        {"data", TS_ARG_STRING, &o->fmnist_dir, "DIR", "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"n", TS_ARG_INT, &o->n, "N", "test images per t-bucket, half to fit and half to score (default 2000)", 4, 10000},
        {"bins", TS_ARG_INT, &o->bins, "B", "confidence bins of the expected calibration error (default 15)", 1, 1000},
        {"batch", TS_ARG_INT, &o->batch, "B", "images per forward (default 64)", 1, 4096},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print one JSON object on stdout instead of the table"},
    };
    /* clang-format on */
    return ts_args_parse("tessera calibrate",
                         "How calibrated a router's p(k | x_t) is along t (accuracy, NLL, "
                         "expected calibration error per t-bucket on held-out test images) and "
                         "the temperature that calibrates it (temperature scaling), per bucket "
                         "and one for every t.\nexample: tessera calibrate --router "
                         "experts/router.safetensors --partition experts",
                         args, (int)(sizeof args / sizeof args[0]), argc, argv);
}

/* The engine, the router, its partition and the test split (--n at most its size). */
static int cal_open(cal_run_t *r) {
    cal_opts_t *o = &r->o;
    char *err = r->err;
    size_t errlen = sizeof r->err;
    ts_engine_opts_t eo = {TS_CPU, o->threads, 0};
    int rc = ts_engine_init(&r->eng, &eo);
    if (rc == TS_OK)
        rc = ts_classifier_open(&r->c, o->router, &r->eng, o->batch, err, errlen);
    if (rc == TS_OK && !ts_classifier_time_conditioned(r->c)) {
        snprintf(err, errlen, "%s is not a router (it does not take t)", o->router);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK)
        rc = load_partition(o->partition, &r->p, err, errlen);
    if (rc == TS_OK && (r->K = ts_classifier_num_outputs(r->c)) != r->p.K) {
        snprintf(err, errlen, "the router scores %d clusters, the partition has %d", r->K, r->p.K);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK)
        rc = ts_fmnist_load(o->fmnist_dir, "test", &r->test, err, errlen);
    o->n = rc == TS_OK && o->n > r->test.n ? r->test.n : o->n;
    r->h = o->n / 2;
    return rc;
}

/* Every bucket's logits of the n images and their nearest centroids; the fitting halves apart. */
static int cal_logits(cal_run_t *r) {
    int n = r->o.n, h = r->h, K = r->K;
    r->z = malloc((size_t)N_BUCKETS * n * K * sizeof *r->z);
    r->zf = malloc((size_t)N_BUCKETS * h * K * sizeof *r->zf);
    r->yf = malloc((size_t)N_BUCKETS * h * sizeof *r->yf);
    r->truth = malloc((size_t)n * sizeof *r->truth);
    r->emb = malloc((size_t)n * r->p.k * sizeof *r->emb);
    int rc = r->z && r->zf && r->yf && r->truth && r->emb
                 ? ts_partition_embed(&r->p, r->test.images, n, r->emb)
                 : TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_partition_nearest(&r->p, r->emb, n, r->truth, NULL);
    for (int j = 0; j < N_BUCKETS && rc == TS_OK; j++) {
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "\rt-bucket %d/%d", j + 1, N_BUCKETS);
        rc = bucket_logits(r->c, &r->eng, &r->test, n, r->o.batch, j, r->z + (int64_t)j * n * K);
        memcpy(r->zf + (int64_t)j * h * K, r->z + (int64_t)j * n * K,
               (size_t)h * K * sizeof *r->zf);
        memcpy(r->yf + (int64_t)j * h, r->truth, (size_t)h * sizeof *r->yf);
    }
    return rc;
}

/* The global temperature on every bucket's fitting half, then each bucket's statistics. */
static int cal_fit(cal_run_t *r) {
    int n = r->o.n, K = r->K;
    r->Tg = 1.0;
    int rc = ts_calib_fit_temperature(r->zf, r->yf, (int64_t)N_BUCKETS * r->h, K, &r->Tg, r->err,
                                      sizeof r->err);
    for (int j = 0; j < N_BUCKETS && rc == TS_OK; j++)
        rc = cal_score(r->z + (int64_t)j * n * K, r->truth, n, K, r->o.bins, r->Tg, &r->q[j],
                       r->err, sizeof r->err);
    return rc;
}

static void cal_free(cal_run_t *r) {
    free(r->z), free(r->zf), free(r->yf), free(r->truth), free(r->emb);
    ts_dataset_free(&r->test);
    ts_partition_free(&r->p);
    ts_classifier_free(r->c);
    ts_engine_free(&r->eng);
}

int ts_cmd_calibrate(int argc, char **argv) {
    cal_run_t *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    int pr = cal_parse(argc, argv, &r->o);
    if (pr != TS_ARGS_RUN) {
        free(r);
        return pr;
    }
    int rc = cal_open(r);
    if (rc == TS_OK)
        rc = cal_logits(r);
    if (isatty(STDERR_FILENO)) /* the end of the progress line */
        fprintf(stderr, "\r%30s\r", "");
    if (rc == TS_OK)
        rc = cal_fit(r);
    if (rc == TS_OK)
        cal_print(r->o.router, r->o.n, r->Tg, r->q, r->o.json);
    int code = rc == TS_OK ? 0 : ts_args_fail("tessera calibrate", r->err, rc);
    cal_free(r);
    free(r);
    return code;
}
