/*
 * cmd_train.c — `tessera train`: train one expert on Fashion-MNIST (or a shard of it).
 *
 * Prints a live progress line (step, loss, samples/s, ETA) on stderr — rewritten in place on a
 * terminal, one line per --log-every steps otherwise — and with --json one JSON object per log
 * line on stdout. Checkpoints go to the store (store/ckpt.h: the LMDB environment in --data-dir)
 * under the run's name (--run, default the basename of --out) every --ckpt-every steps and at the
 * end, keeping the newest --keep; each is written in one transaction, so a kill at any moment
 * leaves the previous one intact. The same command again continues the run from its newest
 * checkpoint, bit-identically (--restart starts it over instead; a run whose checkpoints hold
 * another configuration is refused, naming both ways out). SIGINT/SIGTERM finish the current
 * step, write a checkpoint and stop (exit 130), saying how to continue. The output file
 * (--out) holds the EMA weights, with the config in its metadata.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "client/args.h"
#include "client/cli.h"
#include "client/local.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "model/heldout.h"
#include "model/dit_io.h"
#include "model/fmnist.h"
#include "model/shard.h"
#include "model/latents.h"
#include "model/partition.h"
#include "model/trainer.h"
#include "store/ckpt.h"
#include "store/store.h"

static volatile sig_atomic_t g_stop; /* set by SIGINT/SIGTERM: stop after this step */

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void fmt_eta(double s, char *buf, size_t len) {
    if (!isfinite(s) || s < 0)
        snprintf(buf, len, "?");
    else if (s < 3600)
        snprintf(buf, len, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, len, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

typedef struct {
    const char *fmnist_dir, *shard, *model, *out, *loss_log, *init;
    const char *store_dir, *run, *from_ckpt, *partition, *latents;
    const char *dtype; /* --dtype: the --out file's */
    int64_t steps;
    int cluster;
    int batch, threads, ckpt_every, keep, log_every, resume, restart, json, warmup, logit_normal;
    int graphs;               /* --graphs */
    ts_device_spec_t device;  /* --device (zeroed: the CPU) */
    ts_precision_t precision; /* --precision (zeroed: f32) */
    float lr, wd, clip, ema, dropout;
    uint64_t seed;
} train_opts_t;

/* Everything one run opens (train_free releases it all). */
typedef struct {
    train_opts_t o;
    ts_train_config_t tc;
    char run_default[TS_CKPT_RUN_MAX + 1];
    char partition_id[TS_PARTITION_ID_HEX], shard_name[32];
    char latent_space[TS_LATENT_SPACE_HEX]; /* --latents: their VAE's (model/latents.h) */
    ts_dataset_t ds;
    ts_engine_t eng;
    ts_dit_t model;
    ts_trainer_t tr;
    ts_heldout_own_t heldout; /* --partition: the EMA weights' held-out loss on the cluster */
    int has_heldout;
    double heldout_loss; /* at the last save (NaN: none) */
    FILE *loss_log;
    ts_store_t *store;
    float loss, norm; /* the last step's */
    int64_t first;    /* the step this run started from */
    double t0;
    int usage; /* the failure is the command line's (exit 2) */
    char err[1024];
} train_run_t;

/* Loads the data set and keeps the partition's cluster or the shard, if any. */
static int load_data(train_run_t *r) {
    const train_opts_t *o = &r->o;
    ts_dataset_t *ds = &r->ds;
    char *err = r->err;
    size_t errlen = sizeof r->err;
    char path[4096];
    snprintf(path, sizeof path, "%s/partition.safetensors", o->partition ? o->partition : "");
    if (o->partition)
        snprintf(r->shard_name, sizeof r->shard_name, "shard-%d", o->cluster);
    if (o->latents) {  /* a latent data set of `tessera encode` (shards index it like the images) */
        char name[64]; /* the partition's name for them (hashing the file): only with one */
        int rc = o->partition
                     ? ts_partition_latents(o->latents, ds, name, r->latent_space, err, errlen)
                     : ts_latents_load(o->latents, ds, r->latent_space, err, errlen);
        if (rc == TS_OK && ds->height != ds->width)
            rc = ts_fail(err, errlen, TS_EINVAL, "%s: latents of %d×%d; a DiT takes square ones",
                         o->latents, ds->height, ds->width);
        if (rc == TS_OK && o->partition) /* a partition of these latents: its cluster */
            rc = ts_partition_take_cluster(path, o->cluster, ds, name, o->latents, r->partition_id,
                                           err, errlen);
        if (rc || !o->shard)
            return rc;
        goto shard;
    }
    if (o->partition)
        return ts_partition_load_cluster(path, o->cluster, o->fmnist_dir, ds, r->partition_id, err,
                                         errlen);
    int rc = ts_fmnist_load(o->fmnist_dir, "train", ds, err, errlen);
    if (rc || !o->shard)
        return rc;
shard:;
    int32_t *idx = NULL;
    int n = 0;
    rc = ts_shard_read(o->shard, &idx, &n, ds->n, err, errlen);
    if (rc == TS_OK) {
        ts_dataset_t sub;
        rc = ts_dataset_subset(ds, idx, n, &sub);
        if (rc == TS_OK) {
            ts_dataset_free(ds);
            *ds = sub;
        } else {
            snprintf(err, errlen, "shard %s: %s", o->shard, ts_strerror(rc));
        }
    }
    free(idx);
    return rc;
}

/* The default run name: the basename of --out without its extension ("runs/tiny.safetensors"
 * → "tiny"). */
static void default_run(const char *out, char *buf, size_t len) {
    const char *base = strrchr(out, '/');
    base = base ? base + 1 : out;
    snprintf(buf, len, "%s", base);
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf)
        *dot = '\0';
}

/* Remembers the newest step of a run (the list walks in step order). */
static int note_step(void *ctx, const char *run_id, int64_t step, size_t len) {
    (void)run_id, (void)len;
    *(int64_t *)ctx = step;
    return TS_OK;
}

/* Starts from a checkpoint: --from-ckpt FILE, else the run's newest in the store (unless
 * --restart: an existing run is then started over, and says so). */
static int start_point(train_run_t *r) {
    const train_opts_t *o = &r->o;
    ts_trainer_t *tr = &r->tr;
    ts_store_t *st = r->store;
    char *err = r->err;
    size_t errlen = sizeof r->err;
    if (o->from_ckpt) {
        int rc = ts_trainer_load(tr, o->from_ckpt, err, errlen);
        if (rc == TS_OK)
            fprintf(stderr, "starting from checkpoint file %s at step %lld\n", o->from_ckpt,
                    (long long)tr->step);
        return rc;
    }
    if (o->restart) {
        int64_t newest = -1;
        int rc = ts_ckpt_list(st, o->run, note_step, &newest);
        if (rc != TS_OK) {
            snprintf(err, errlen, "store %s: cannot list the checkpoints of run '%s'",
                     ts_store_dir(st), o->run);
            return rc;
        }
        if (newest >= 0)
            fprintf(stderr,
                    "run '%s' has checkpoints up to step %lld in %s; starting over at step 0 "
                    "(--restart): the new checkpoints replace them\n",
                    o->run, (long long)newest, ts_store_dir(st));
        return TS_OK;
    }
    char sub[512] = "";
    int rc = ts_ckpt_resume_trainer(st, o->run, tr, sub, sizeof sub);
    if (rc == TS_ENOTFOUND) {
        fprintf(stderr, "no checkpoint of run '%s' in %s: starting at step 0\n", o->run,
                ts_store_dir(st));
        return TS_OK;
    }
    if (rc == TS_OK) {
        fprintf(stderr, "resuming run '%s' from step %lld (%s; --restart starts it over)\n", o->run,
                (long long)tr->step, ts_store_dir(st));
        return TS_OK;
    }
    if (rc != TS_EINVAL) { /* the store could not be read: a failure, not a choice to make */
        snprintf(err, errlen, "run '%s' in %s: %s", o->run, ts_store_dir(st),
                 sub[0] ? sub : ts_strerror(rc));
        return rc;
    }
    /* another configuration's checkpoint: the command line must choose */
    snprintf(err, errlen,
             "run '%s' in %s has a checkpoint this command cannot continue (%s): --restart "
             "replaces it, or --run NAME trains a separate run",
             o->run, ts_store_dir(st), sub);
    r->usage = 1;
    return rc;
}

/* --dtype's name as a safetensors dtype (checked by validate: f32, bf16 or f16). */
static ts_st_dtype_t out_dtype(const char *name) {
    return strcmp(name, "bf16") == 0  ? TS_ST_BF16
           : strcmp(name, "f16") == 0 ? TS_ST_F16
                                      : TS_ST_F32;
}

/* A checkpoint into the store, then the EMA weights to --out. */
static int save_outputs(train_run_t *r) {
    const train_opts_t *o = &r->o;
    ts_trainer_t *tr = &r->tr;
    ts_train_meta_t meta;
    r->heldout_loss = NAN;
    if (r->has_heldout && ts_heldout_own_measure(&r->heldout, &tr->ema_mem, &r->heldout_loss))
        r->heldout_loss = NAN;
    ts_train_meta(&meta, tr, o->partition ? r->shard_name : o->shard,
                  o->partition ? r->partition_id : NULL, o->cluster, r->heldout_loss);
    if (r->latent_space[0])
        ts_train_meta_add(&meta, TS_LATENT_SPACE_KEY, r->latent_space);
    int rc = ts_ckpt_save_trainer(r->store, o->run, tr, o->keep, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_dit_save(tr->model, &tr->ema_mem, o->out, out_dtype(o->dtype), meta.kv, meta.n,
                         r->err, sizeof r->err);
    return rc;
}

/* ---- the verb: parse → validate → run → print ---------------------------------------------- */

/* The options from the command line, their defaults from tc: TS_ARGS_RUN, or the exit code
 * (ts_args_parse). */
static int parse_opts(int argc, char **argv, train_opts_t *o, const ts_train_config_t *tc) {
    *o = (train_opts_t){.fmnist_dir = TS_FMNIST_DEFAULT_DIR,
                        .dtype = "f32",
                        .model = "tiny",
                        .steps = 1000,
                        .batch = 64,
                        .ckpt_every = 500,
                        .keep = 3,
                        .log_every = 50,
                        .seed = 0,
                        .cluster = -1,
                        .lr = tc->lr,
                        .wd = tc->weight_decay,
                        .clip = tc->grad_clip,
                        .ema = tc->ema_decay,
                        .dropout = tc->label_dropout,
                        .warmup = tc->warmup};
    o->device = (ts_device_spec_t){.automatic = 1}; /* as tesserad: a GPU when there is one */
    ts_arg_t args[] = {
        {"data", TS_ARG_STRING, &o->fmnist_dir, "DIR",
         "Fashion-MNIST IDX directory (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"shard", TS_ARG_STRING, &o->shard, "FILE",
         "train only on these image indices (one per line)"},
        {"latents", TS_ARG_STRING, &o->latents, "FILE",
         "train on a latent data set of `tessera encode` instead of Fashion-MNIST: the model takes "
         "its channels, side and classes, and the weights its latent space (with --partition: a "
         "`tessera partition --latents` of it)"},
        {"partition", TS_ARG_STRING, &o->partition, "DIR",
         "a `tessera partition` folder: train on the images of its cluster --cluster (those of "
         "shard-<cluster>.txt) and record partition_id and cluster in the weights"},
        {"cluster", TS_ARG_INT, &o->cluster, "K", "the cluster of --partition to train on", 0,
         65535},
        {"model", TS_ARG_STRING, &o->model, "NAME",
         "config: mini, tiny, small, S/2, B/4, ... (default tiny)"},
        {"init", TS_ARG_STRING, &o->init, "FILE",
         "start from these weights instead of a fresh init"},
        {"steps", TS_ARG_I64, &o->steps, "N", "total optimisation steps (default 1000)", 1, 1e12},
        {"batch", TS_ARG_INT, &o->batch, "B", "samples per step (default 64)", 1, 65536},
        {"lr", TS_ARG_FLOAT, &o->lr, "X", "peak learning rate (default 3e-4)", 1e-9, 10},
        {"warmup", TS_ARG_INT, &o->warmup, "N", "linear warm-up steps (default 200)", 0, 1e9},
        {"weight-decay", TS_ARG_FLOAT, &o->wd, "X", "AdamW decoupled weight decay (default 0)", 0,
         10},
        {"grad-clip", TS_ARG_FLOAT, &o->clip, "X", "max gradient norm, 0 = off (default 1)", 0,
         1e9},
        {"ema", TS_ARG_FLOAT, &o->ema, "X", "EMA decay (default 0.999)", 0, 1},
        {"label-dropout", TS_ARG_FLOAT, &o->dropout, "P",
         "null-class probability for CFG (default 0.1)", 0, 1},
        {"logit-normal", TS_ARG_FLAG, &o->logit_normal, NULL,
         "draw t = sigmoid(N(0,1)) instead of U(0,1)"},
        {"seed", TS_ARG_U64, &o->seed, "S", "seed of every random draw (default 0)"},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"device", TS_ARG_DEVICE, &o->device, "NAME",
         "where to compute: " TS_DEVICE_SPEC_HELP " (default auto)"},
        {"precision", TS_ARG_PRECISION, &o->precision, "P",
         "the products, forward and backward: " TS_PRECISION_HELP
         "; bf16 keeps fp32 master weights, AdamW, EMA, checkpoints and --out"},
        {"graphs", TS_ARG_FLAG, &o->graphs, NULL,
         "on a GPU, run each step's forward and backward as one CUDA graph (captured at the second "
         "step; the same kernels, far fewer launches; a capture that fails falls back to the "
         "eager step and says so); a CPU ignores it"},
        {"out", TS_ARG_STRING, &o->out, "FILE", "where to write the EMA weights (.safetensors)", 0,
         0, 1},
        {"dtype", TS_ARG_STRING, &o->dtype, "D",
         "the --out file's weights: f32 (default), bf16 or f16 (half the bytes to store and serve: "
         "a node hosting it serves half the chunks; checkpoints stay f32)"},
        {"data-dir", TS_ARG_STRING, &o->store_dir, "DIR",
         "the store that holds the checkpoints (default $XDG_DATA_HOME/tessera)"},
        {"run", TS_ARG_STRING, &o->run, "NAME",
         "the run's name in the store (default: --out's basename without extension)"},
        {"ckpt-every", TS_ARG_INT, &o->ckpt_every, "N", "checkpoint every N steps (default 500)", 1,
         1e9},
        {"keep", TS_ARG_INT, &o->keep, "N", "checkpoints of the run kept in the store (default 3)",
         1, 1e6},
        {"resume", TS_ARG_FLAG, &o->resume, NULL,
         "continue from the run's newest checkpoint, if any (the default; kept for scripts)"},
        {"restart", TS_ARG_FLAG, &o->restart, NULL,
         "start the run over at step 0, replacing its checkpoints (default: continue it)"},
        {"from-ckpt", TS_ARG_STRING, &o->from_ckpt, "FILE",
         "start from a checkpoint file (an earlier tessera's OUT.ckpt)"},
        {"log-every", TS_ARG_INT, &o->log_every, "N", "progress line every N steps (default 50)", 1,
         1e9},
        {"loss-log", TS_ARG_STRING, &o->loss_log, "FILE",
         "append 'step loss grad_norm' per step to FILE"},
        {"json", TS_ARG_FLAG, &o->json, NULL, "JSON lines on stdout (progress and summary)"},
    };
    return ts_args_parse("tessera train",
                         "Train one DiT expert with flow matching on Fashion-MNIST or a shard.\n"
                         "example: tessera train --partition experts --cluster 0 --model tiny "
                         "--steps 2000 --out experts/expert-0.safetensors",
                         args, (int)(sizeof args / sizeof args[0]), argc, argv);
}

/* The run name (defaulted from --out) and the data options, then the training config from the
 * options: 0, or 2 with the message printed. */
static int validate(train_run_t *r) {
    train_opts_t *o = &r->o;
    if (!o->run) {
        default_run(o->out, r->run_default, sizeof r->run_default);
        o->run = r->run_default;
    }
    if (!o->run[0] || strlen(o->run) > TS_CKPT_RUN_MAX)
        fprintf(stderr, "tessera train: the run name must be 1..%d bytes (pass --run NAME)\n",
                TS_CKPT_RUN_MAX);
    else if ((o->partition != NULL) != (o->cluster >= 0))
        fprintf(stderr, "tessera train: --partition and --cluster go together\n");
    else if (strcmp(o->dtype, "f32") != 0 && strcmp(o->dtype, "bf16") != 0 &&
             strcmp(o->dtype, "f16") != 0)
        fprintf(stderr, "tessera train: --dtype %s: want f32, bf16 or f16\n", o->dtype);
    else if (o->partition && o->shard)
        fprintf(stderr, "tessera train: --shard and --partition both name the data; pass one\n");
    else if (o->restart && (o->resume || o->from_ckpt))
        fprintf(stderr, "tessera train: --restart starts over; --resume and --from-ckpt continue: "
                        "pass one\n");
    else {
        ts_train_config_t *tc = &r->tc;
        tc->batch = o->batch, tc->lr = o->lr, tc->warmup = o->warmup, tc->weight_decay = o->wd;
        tc->grad_clip = o->clip, tc->ema_decay = o->ema, tc->label_dropout = o->dropout;
        tc->logit_normal = o->logit_normal, tc->seed = o->seed, tc->graphs = o->graphs;
        return 0;
    }
    return 2;
}

/* The model: --init's weights, or a fresh --model preset for the data's images. */
static int open_model(train_run_t *r) {
    const train_opts_t *o = &r->o;
    if (o->init)
        return ts_dit_open(&r->model, o->init, &r->eng, o->batch, 1, r->err, sizeof r->err);
    ts_dit_config_t cfg;
    int rc = ts_dit_config_preset(o->model, &cfg);
    if (rc != TS_OK) {
        snprintf(r->err, sizeof r->err, "unknown model '%s' (mini, tiny, small, S/2 … XL/8)",
                 o->model);
        return rc;
    }
    cfg.in_channels = r->ds.channels, cfg.input_size = r->ds.height;
    cfg.num_classes = r->ds.num_classes; /* Fashion-MNIST's 10, or a latent set's own */
    if (cfg.input_size % cfg.patch_size) {
        snprintf(r->err, sizeof r->err,
                 "model '%s' cuts images into %d×%d patches, and these are %d×%d: pick a model "
                 "whose patch divides the side (mini and tiny: 4, small and */2: 2)",
                 o->model, cfg.patch_size, cfg.patch_size, cfg.input_size, cfg.input_size);
        r->usage = 1;
        return TS_EINVAL;
    }
    rc = ts_dit_create(&r->model, &cfg, &r->eng, o->batch, 1);
    if (rc == TS_OK)
        rc = ts_dit_init_weights(&r->model, o->seed);
    if (rc)
        snprintf(r->err, sizeof r->err, "cannot build model '%s'", o->model);
    return rc;
}

/* The store, the data, the engine, the model and its trainer at its start point, the loss log. */
static int open_run(train_run_t *r) {
    const train_opts_t *o = &r->o;
    ts_store_opts_t so = {.dir = o->store_dir};
    int rc = ts_store_open(&r->store, &so, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = load_data(r);
    if (rc == TS_OK)
        rc = ts_cli_engine(&r->eng, &o->device, o->threads, "tessera train", r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = open_model(r);
    if (rc == TS_OK) /* before the trainer: it takes the bf16 copy of the start weights */
        rc = ts_cli_precision(&r->model, 1, o->precision, NULL, r->err, sizeof r->err);
    if (rc == TS_OK && (rc = ts_trainer_init(&r->tr, &r->model, &r->ds, &r->tc)) != TS_OK)
        snprintf(r->err, sizeof r->err, "cannot start training (batch %d, %d images)", o->batch,
                 r->ds.n);
    if (rc == TS_OK)
        rc = start_point(r);
    /* a latent data set has no test split here: no held-out loss (its experts are all "trained") */
    if (rc == TS_OK && o->partition &&
        !o->latents) { /* without the test split: trained all the same */
        char path[4096], why[320] = "";
        snprintf(path, sizeof path, "%s/partition.safetensors", o->partition);
        r->has_heldout =
            ts_heldout_own_open(&r->heldout, path, o->cluster, o->fmnist_dir, &r->model.cfg,
                                &r->eng, o->batch, why, sizeof why) == TS_OK;
        if (!r->has_heldout)
            fprintf(stderr, "tessera train: no held-out loss for this expert (%s)\n", why);
    }
    if (rc == TS_OK && o->loss_log && !(r->loss_log = fopen(o->loss_log, "a"))) {
        snprintf(r->err, sizeof r->err, "cannot open loss log %s", o->loss_log);
        rc = TS_EIO;
    }
    /* whole lines: a reader (or a kill) never sees half of one */
    if (r->loss_log)
        setvbuf(r->loss_log, NULL, _IOLBF, 0);
    return rc;
}

/* The progress line's state: where the last line was written. */
typedef struct {
    int tty;
    double t_log;
    int64_t at_log;
} progress_t;

/* The progress line on stderr (and with --json its JSON line on stdout). */
static void log_progress(const train_run_t *r, progress_t *p) {
    const train_opts_t *o = &r->o;
    const ts_trainer_t *tr = &r->tr;
    double t = ts_now_s();
    double sps = (double)(tr->step - p->at_log) * o->batch / (t - p->t_log + 1e-9);
    double eta = (double)(o->steps - tr->step) * o->batch / (sps + 1e-9);
    char etab[32];
    fmt_eta(eta, etab, sizeof etab);
    /* a finite norm, or an f16 step skipped for overflowing gradients (model/trainer.h) */
    int skipped = !isfinite(r->norm);
    char g[32] = "skipped (f16 overflow)", gj[32] = "null";
    if (!skipped) {
        snprintf(g, sizeof g, "%.3f", (double)r->norm);
        snprintf(gj, sizeof gj, "%.4f", (double)r->norm);
    }
    fprintf(stderr,
            "%sstep %lld/%lld  loss %.4f (avg %.4f)  |g| %s  lr %.2e  %.0f samples/s "
            " ETA %s%s",
            p->tty ? "\r" : "", (long long)tr->step, (long long)o->steps, r->loss, tr->loss_avg, g,
            ts_trainer_lr(&r->tc, tr->step - 1), sps, etab, p->tty ? "   " : "\n");
    if (o->json)
        printf("{\"step\":%lld,\"loss\":%.6f,\"loss_avg\":%.6f,\"grad_norm\":%s,"
               "\"skipped\":%s,\"samples_per_s\":%.1f,\"eta_s\":%.0f}\n",
               (long long)tr->step, r->loss, tr->loss_avg, gj, skipped ? "true" : "false", sps,
               eta);
    p->t_log = t, p->at_log = tr->step;
}

/* Steps until --steps or a signal, with the loss log, the progress line and the checkpoints,
 * then the last checkpoint and the weights. Failures are printed here. */
static int train(train_run_t *r) {
    const train_opts_t *o = &r->o;
    ts_trainer_t *tr = &r->tr;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    r->first = tr->step;
    r->t0 = ts_now_s();
    progress_t p = {isatty(STDERR_FILENO), r->t0, tr->step};
    r->loss = NAN, r->norm = NAN;
    int rc = TS_OK, graphs_was = tr->graphs.on;
    while (tr->step < o->steps && !g_stop) {
        if ((rc = ts_trainer_step(tr, &r->loss, &r->norm)) != TS_OK) {
            fprintf(stderr,
                    "\ntessera train: step %lld failed: %s (loss %g, grad norm %g); the "
                    "last checkpoint is intact\n",
                    (long long)tr->step + 1, ts_strerror(rc), r->loss, r->norm);
            return rc;
        }
        if (tr->graphs.on != graphs_was) { /* −1: a capture failed (model/trainer.h) */
            fprintf(stderr,
                    "%stessera train: --graphs: the step's capture into a CUDA graph failed; the "
                    "steps run eagerly (the same arithmetic, more launches)\n",
                    p.tty ? "\n" : "");
            graphs_was = tr->graphs.on;
        }
        if (r->loss_log)
            fprintf(r->loss_log, "%lld %.9g %.9g\n", (long long)tr->step, r->loss, r->norm);
        int last = tr->step == o->steps;
        if (tr->step % o->log_every == 0 || last)
            log_progress(r, &p);
        if (tr->step % o->ckpt_every == 0 && !last && (rc = save_outputs(r)) != TS_OK) {
            fprintf(stderr, "\ntessera train: checkpoint: %s: %s\n", r->err, ts_strerror(rc));
            return rc;
        }
    }
    if (p.tty)
        fprintf(stderr, "\n");
    if ((rc = save_outputs(r)) != TS_OK)
        fprintf(stderr, "tessera train: %s: %s\n", r->err, ts_strerror(rc));
    return rc;
}

/* What is trained on what, and from which step to which. */
static void print_start(const train_run_t *r) {
    const train_opts_t *o = &r->o;
    fprintf(stderr,
            "training %s (%lld parameters, %.1f MFLOP/sample fwd) on %d images, batch %d, "
            "%d threads, %s, steps %lld → %lld\n",
            o->init ? o->init : o->model, (long long)r->model.num_params,
            ts_dit_flops_per_sample(&r->model.cfg) / 1e6, r->ds.n, o->batch, r->eng.threads,
            o->precision == TS_PREC_BF16
                ? r->eng.device == TS_CPU
                      ? "bf16 products forward and backward (oneDNN), fp32 masters, AdamW and EMA"
                      : "bf16 products forward and backward (cuBLAS), fp32 masters, AdamW and EMA"
            : o->precision == TS_PREC_F16
                ? r->eng.device == TS_CPU
                      ? "f16 products forward and backward (emulated on the CPU: slower than "
                        "f32), dynamic loss scaling, fp32 masters, AdamW and EMA"
                      : "f16 products forward and backward (cuBLAS), dynamic loss scaling, fp32 "
                        "masters, AdamW and EMA"
                : "f32",
            (long long)r->tr.step, (long long)o->steps);
}

/* The summary line on stderr, and with --json as one JSON object on stdout. */
static void print_summary(const train_run_t *r) {
    const train_opts_t *o = &r->o;
    const ts_trainer_t *tr = &r->tr;
    double secs = ts_now_s() - r->t0;
    fprintf(stderr,
            "%s at step %lld: loss %.4f (avg %.4f), %.1f s, %.0f samples/s; weights → %s, "
            "checkpoint → run '%s' in %s\n",
            g_stop ? "stopped" : "done", (long long)tr->step, r->loss, tr->loss_avg, secs,
            (double)(tr->step - r->first) * o->batch / (secs + 1e-9), o->out, o->run,
            ts_store_dir(r->store));
    int f16 = o->precision == TS_PREC_F16;
    if (f16)
        fprintf(stderr,
                "f16: loss scale 2^%d, %lld steps of the run skipped for overflowing "
                "gradients\n",
                ts_log2i(tr->loss_scale), (long long)tr->skipped);
    if (o->graphs)
        fprintf(stderr, "CUDA graphs: %s, %lld captured, %lld steps launched as one\n",
                r->eng.device != TS_CUDA ? "none (a CPU engine runs every step eagerly)"
                : tr->graphs.on == 1     ? "on"
                                         : "off after a capture failed",
                (long long)tr->graphs.captures, (long long)tr->graphs.launches);
    if (isfinite(r->heldout_loss))
        fprintf(stderr,
                "held-out loss %.4f on %d test images of cluster %d (heldout_loss in the "
                "weights' metadata)\n",
                r->heldout_loss, r->heldout.n, o->cluster);
    if (g_stop)
        fprintf(stderr, "the same command again continues from step %lld (--restart starts over)\n",
                (long long)tr->step);
    if (o->json) { /* jansson escapes the paths (a quote in a file name must not break the JSON) */
        json_t *j = json_pack("{s:b, s:I, s:f, s:f, s:f, s:s, s:s, s:s, s:s}", "done", !g_stop,
                              "step", (json_int_t)tr->step, "loss", (double)r->loss, "loss_avg",
                              (double)tr->loss_avg, "seconds", secs, "out", o->out, "run", o->run,
                              "data_dir", ts_store_dir(r->store), "precision",
                              ts_precision_name(o->precision));
        if (j && isfinite(r->heldout_loss))
            json_object_set_new(j, "heldout_loss", json_real(r->heldout_loss));
        if (j && o->graphs)
            json_object_set_new(j, "graphs",
                                json_pack("{s:b, s:I, s:I}", "on",
                                          tr->graphs.on == 1 && r->eng.device == TS_CUDA,
                                          "captures", (json_int_t)tr->graphs.captures, "launches",
                                          (json_int_t)tr->graphs.launches));
        if (j && f16) {
            json_object_set_new(j, "loss_scale", json_real(tr->loss_scale));
            json_object_set_new(j, "skipped_steps", json_integer((json_int_t)tr->skipped));
        }
        ts_json_print(j);
    }
}

static void train_free(train_run_t *r) {
    if (r->loss_log)
        fclose(r->loss_log);
    ts_trainer_free(&r->tr);
    ts_heldout_own_free(&r->heldout);
    ts_dit_free(&r->model);
    ts_engine_free(&r->eng);
    ts_dataset_free(&r->ds);
    ts_store_close(r->store);
}

int ts_cmd_train(int argc, char **argv) {
    train_run_t r;
    memset(&r, 0, sizeof r);
    r.heldout_loss = NAN;
    ts_train_config_default(&r.tc);
    int pr = parse_opts(argc, argv, &r.o, &r.tc);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (validate(&r))
        return 2;
    int rc = open_run(&r);
    if (rc != TS_OK)
        ts_args_fail("tessera train", r.err, rc);
    if (rc == TS_OK) {
        print_start(&r);
        rc = train(&r);
    }
    if (rc == TS_OK)
        print_summary(&r);
    train_free(&r);
    return rc != TS_OK ? (r.usage ? 2 : 1) : g_stop ? 130 : 0;
}
