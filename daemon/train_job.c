/*
 * train_job.c — tesserad's training job (train_job.h).
 *
 * The job's thread owns the engine, the model, the trainer and the data set; the caller's thread
 * touches none of them after ts_train_job_start returns. What the two share lives under `mu`:
 * the progress (copied out by ts_train_job_progress), the newest snapshot pointer, and `ended`,
 * which the thread sets last and signals on `cv` so that ts_train_job_stop can wait with a
 * deadline. The stop request is an atomic flag the thread reads between steps. The job's writer
 * thread (started and joined by the job's thread) takes the periodic checkpoints' bytes through
 * a one-slot hand-over under the same mutex (`w_*`, signalled on `wcv`).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/train_job.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "daemon/log.h"
#include "model/dit_io.h"
#include "model/fmnist.h"
#include "model/heldout.h"
#include "model/latents.h"
#include "model/partition.h"
#include "model/safetensors.h"
#include "store/ckpt.h"

struct ts_train_job {
    /* the job thread's own, after start */
    ts_store_t *store;
    int64_t steps;
    int ckpt_every, keep, snapshots;
    char *out;
    void (*notify)(void *ctx);
    void *ctx;
    char partition_id[TS_PARTITION_ID_HEX];
    char shard[32]; /* "shard-<k>", the weights' shard metadata, as `tessera train` writes it */
    int cluster;
    ts_dataset_t data;
    ts_engine_t eng;
    ts_dit_t model;
    ts_trainer_t tr;
    /* the EMA weights' loss on held-out images of the cluster (model/heldout.h), measured where a
     * snapshot or the final weights are made. Opened by the job's thread at the first measure
     * (loading the test split and embedding it takes ~0.4 s, which the daemon's loop must not
     * wait for); has_heldout 0 when it could not be (no test split: the job trains all the same) */
    ts_heldout_own_t heldout;
    int heldout_tried, has_heldout;
    char *heldout_partition, *heldout_data; /* copies of opts.partition and opts.data */
    char latent_space[65]; /* trained on latents: their space (model/latents.h); "" on pixels */
    int latents;           /* on a latent data set: no test split, no held-out loss */
    int heldout_batch;
    double heldout_loss; /* at heldout_step (NaN: not measured) */
    int64_t heldout_step;
    pthread_t thread;
    int joined;
    atomic_int stop;
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when ended is set */
    int ended;
    ts_train_progress_t progress;
    ts_train_snapshot_t *snapshot;
    /* The writer: a periodic checkpoint (and its snapshot) is copied out into the stage — on a
     * GPU queued behind the step, so the next step overlaps the copy — and the writer's thread
     * waits for the copy, encodes it and puts it into the store while the steps go on; one write
     * in flight, the next waits for it. Under mu, but for the stage and w_meta, which only the
     * writer touches while w_busy and only the job's thread otherwise. */
    pthread_t writer;
    pthread_cond_t wcv;       /* a write was handed over, finished, or the writer must quit */
    int w_busy, w_quit;       /* w_busy: a write handed over and not finished */
    int64_t w_step;           /* the step the write holds */
    ts_trainer_stage_t stage; /* the state copied out (made at the first periodic checkpoint) */
    int staged;               /* stage made */
    ts_train_meta_t w_meta;   /* the snapshot's metadata at the staged step */
    int w_rc;                 /* the first failed write's error; the job ends with it */
    int64_t w_at;
    char w_err[320];
};

const char *ts_train_state_name(ts_train_state_t s) {
    static const char *const names[] = {"running", "stopped", "done", "failed"};
    return (unsigned)s < 4 ? names[s] : "?";
}

static void notify(ts_train_job_t *j) {
    if (j->notify)
        j->notify(j->ctx);
}

/* ---- run id ------------------------------------------------------------------------------ */

int ts_train_run_id(const char *partition_id, int cluster, const ts_dit_config_t *model,
                    const ts_train_config_t *train, char out[TS_TRAIN_RUN_ID_MAX]) {
    ts_hash_t pid;
    if (!partition_id || !model || !train || !out || cluster < 0 ||
        ts_hash_parse(partition_id, &pid) != TS_OK)
        return TS_EINVAL;
    /* Everything the steps depend on, written out in full (%.9g: a float's exact round trip). */
    char text[512];
    const ts_dit_config_t *m = model;
    const ts_train_config_t *t = train;
    int n = snprintf(text, sizeof text,
                     "model=%d/%d/%d/%d/%d/%d/%d/%d/%d batch=%d lr=%.9g warmup=%d wd=%.9g "
                     "beta1=%.9g beta2=%.9g eps=%.9g clip=%.9g ema=%.9g dropout=%.9g "
                     "logit_normal=%d seed=%llu",
                     m->input_size, m->in_channels, m->patch_size, m->hidden_size, m->depth,
                     m->num_heads, m->num_classes, m->mlp_ratio, m->freq_dim, t->batch, t->lr,
                     t->warmup, t->weight_decay, t->beta1, t->beta2, t->eps, t->grad_clip,
                     t->ema_decay, t->label_dropout, t->logit_normal, (unsigned long long)t->seed);
    ts_hash_t h;
    ts_hash_compute(&h, text, (size_t)n);
    char hex[TS_HASH_HEX];
    ts_hash_hex(&h, hex);
    hex[16] = '\0';
    snprintf(out, TS_TRAIN_RUN_ID_MAX, "tesserad/%s/%d/%s", partition_id, cluster, hex);
    return TS_OK;
}

/* ---- snapshots --------------------------------------------------------------------------- */

void ts_train_snapshot_release(ts_train_snapshot_t *s) {
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        free((void *)s->bytes);
        free(s);
    }
}

ts_train_snapshot_t *ts_train_job_snapshot(ts_train_job_t *j) {
    pthread_mutex_lock(&j->mu);
    ts_train_snapshot_t *s = j->snapshot;
    if (s)
        atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(&j->mu);
    return s;
}

int ts_train_snapshot_open_dit(const ts_train_snapshot_t *s, ts_engine_t *e, int max_batch,
                               int trainable, ts_dit_t *m, char *err, size_t errlen) {
    if (!s || !m) {
        ts_set_err(err, errlen, "ts_train_snapshot_open_dit: NULL argument");
        return TS_EINVAL;
    }
    unsigned char *copy = malloc(s->len); /* ts_st_parse owns the buffer it is given */
    if (!copy)
        return TS_ENOMEM;
    memcpy(copy, s->bytes, s->len);
    ts_st_file_t f;
    int rc = ts_st_parse(copy, s->len, &f, err, errlen);
    if (rc != TS_OK)
        return rc;
    rc = ts_dit_open_file(m, &f, e, max_batch, trainable, err, errlen);
    ts_st_free(&f);
    return rc;
}

/* The held-out loss of the EMA weights at this step (measured once per step; NaN without the
 * test split or when the measure fails, which only loses the figure), into the progress. */
static double measure_heldout(ts_train_job_t *j) {
    if (!j->heldout_tried && j->latents) { /* a latent data set has no test split here */
        j->heldout_tried = 1;
        ts_log_info("train", "no held-out loss for an expert of latents: it trains all the same");
    }
    if (!j->heldout_tried) {
        char why[320] = "";
        j->heldout_tried = 1;
        j->has_heldout =
            ts_heldout_own_open(&j->heldout, j->heldout_partition, j->cluster, j->heldout_data,
                                &j->model.cfg, &j->eng, j->heldout_batch, why, sizeof why) == TS_OK;
        if (!j->has_heldout)
            ts_log_warn("train", "no held-out loss for this expert (%s): it trains all the same",
                        why);
    }
    if (!j->has_heldout || j->heldout_step == j->tr.step)
        return j->heldout_loss;
    double loss = NAN;
    if (ts_heldout_own_measure(&j->heldout, &j->tr.ema_mem, &loss) != TS_OK)
        loss = NAN;
    j->heldout_loss = loss, j->heldout_step = j->tr.step;
    pthread_mutex_lock(&j->mu);
    j->progress.heldout_loss = (float)loss;
    j->progress.heldout_step = j->tr.step;
    pthread_mutex_unlock(&j->mu);
    return loss;
}

/* The EMA weights as a safetensors file, with the metadata `tessera train --partition` writes. */
static int encode_weights(ts_train_job_t *j, unsigned char **buf, size_t *len, char *err,
                          size_t errlen) {
    ts_train_meta_t meta;
    ts_train_meta(&meta, &j->tr, j->shard, j->partition_id, j->cluster, measure_heldout(j));
    if (j->latent_space[0])
        ts_train_meta_add(&meta, TS_LATENT_SPACE_KEY, j->latent_space);
    return ts_dit_save_mem(&j->model, &j->tr.ema_mem, TS_ST_F32, meta.kv, meta.n, buf, len, err,
                           errlen);
}

/* Imports buf (taken: freed or kept by the snapshot) into the store and, with snapshots on,
 * publishes it as the newest snapshot, removing the previous one's manifest unless it is the
 * same file. *hash gets the weights hash. */
static int publish(ts_train_job_t *j, unsigned char *buf, size_t len, int64_t step, ts_hash_t *hash,
                   char *err, size_t errlen) {
    int rc = ts_weights_import_buf(j->store, buf, len, hash, NULL, NULL, err, errlen);
    if (rc != TS_OK || !j->snapshots) {
        free(buf);
        return rc;
    }
    ts_train_snapshot_t *s = calloc(1, sizeof *s);
    if (!s) {
        free(buf);
        return TS_ENOMEM;
    }
    s->step = step;
    s->hash = *hash;
    s->bytes = buf;
    s->len = len;
    atomic_init(&s->refs, 1); /* the job's */
    pthread_mutex_lock(&j->mu);
    ts_train_snapshot_t *old = j->snapshot;
    j->snapshot = s;
    j->progress.snapshots++;
    j->progress.snapshot_step = s->step;
    pthread_mutex_unlock(&j->mu);
    if (old && memcmp(old->hash.b, hash->b, TS_HASH_BYTES) != 0)
        (void)ts_weights_remove(j->store, &old->hash); /* already gone is fine */
    ts_train_snapshot_release(old);
    return TS_OK;
}

static int publish_snapshot(ts_train_job_t *j, char *err, size_t errlen) {
    unsigned char *buf = NULL;
    size_t len = 0;
    ts_hash_t hash;
    int rc = encode_weights(j, &buf, &len, err, errlen);
    return rc == TS_OK ? publish(j, buf, len, j->tr.step, &hash, err, errlen) : rc;
}

/* ---- the job's thread -------------------------------------------------------------------- */

/* A checkpoint, then (snapshot) a snapshot of the same step. */
static int checkpoint(ts_train_job_t *j, int snapshot, char *err, size_t errlen) {
    int rc = ts_ckpt_save_trainer(j->store, j->progress.run_id, &j->tr, j->keep, err, errlen);
    if (rc != TS_OK)
        return rc;
    pthread_mutex_lock(&j->mu);
    j->progress.ckpt_step = j->tr.step;
    pthread_mutex_unlock(&j->mu);
    return snapshot && j->snapshots ? publish_snapshot(j, err, errlen) : TS_OK;
}

/* ---- the writer ----------------------------------------------------------------------------- */

/* The writer's thread: each handed-over checkpoint into the store, then its snapshot published;
 * progress.ckpt_step moves when the checkpoint is in. A failure is kept for the job to end with. */
static void *writer_main(void *arg) {
    ts_train_job_t *j = arg;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        while (!j->w_busy && !j->w_quit)
            pthread_cond_wait(&j->wcv, &j->mu);
        if (!j->w_busy)
            break;
        int64_t step = j->w_step;
        pthread_mutex_unlock(&j->mu);
        char err[320] = "";
        unsigned char *ckpt = NULL, *snap = NULL;
        size_t ckpt_len = 0, snap_len = 0;
        /* waits for the copy out, then encodes: the checkpoint, and the snapshot from its EMA */
        int rc = ts_trainer_stage_encode(&j->stage, &ckpt, &ckpt_len, err, sizeof err);
        if (rc == TS_OK && j->snapshots)
            rc = ts_dit_save_mem(&j->model, &j->stage.host[TS_STAGE_EMA], TS_ST_F32, j->w_meta.kv,
                                 j->w_meta.n, &snap, &snap_len, err, sizeof err);
        if (rc == TS_OK && (rc = ts_ckpt_save(j->store, j->progress.run_id, step, ckpt, ckpt_len,
                                              j->keep)) != TS_OK)
            snprintf(err, sizeof err, "store %s: cannot save the checkpoint (%zu bytes)",
                     ts_store_dir(j->store), ckpt_len);
        free(ckpt);
        if (rc == TS_OK) {
            pthread_mutex_lock(&j->mu);
            j->progress.ckpt_step = step;
            pthread_mutex_unlock(&j->mu);
        }
        ts_hash_t hash;
        if (rc == TS_OK && snap)
            rc = publish(j, snap, snap_len, step, &hash, err, sizeof err); /* takes snap */
        else
            free(snap);
        if (rc == TS_OK)
            notify(j);
        pthread_mutex_lock(&j->mu);
        j->w_busy = 0;
        if (rc != TS_OK && j->w_rc == TS_OK) {
            j->w_rc = rc, j->w_at = step;
            snprintf(j->w_err, sizeof j->w_err, "%s", err);
        }
        pthread_cond_broadcast(&j->wcv);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* With mu held: waits until no write is in flight; the first failed write's error, if any (its
 * step in *at, its sentence in err). */
static int writer_idle(ts_train_job_t *j, int64_t *at, char *err, size_t errlen) {
    while (j->w_busy)
        pthread_cond_wait(&j->wcv, &j->mu);
    if (j->w_rc != TS_OK) {
        *at = j->w_at;
        snprintf(err, errlen, "%s", j->w_err);
    }
    return j->w_rc;
}

/* Page-locked staging up to this many bytes of state (16 per parameter: DiT-B/2 and smaller);
 * past it the stage is ordinary memory, into which a GPU's copy is synchronous. */
#define STAGE_PINNED_MAX ((size_t)2 << 30)

/* A periodic checkpoint without stopping the steps: once the previous write is done, the
 * trainer's state is copied out into the stage (on a GPU queued on the engine's stream: the
 * call returns at once) and the writer does the rest. */
static int checkpoint_async(ts_train_job_t *j, int64_t *at, char *err, size_t errlen) {
    pthread_mutex_lock(&j->mu);
    int rc = writer_idle(j, at, err, errlen);
    pthread_mutex_unlock(&j->mu);
    if (rc != TS_OK)
        return rc;
    if (!j->staged) {
        int pinned =
            j->model.eng->device == TS_CUDA && (size_t)j->model.num_params * 16 <= STAGE_PINNED_MAX;
        if ((rc = ts_trainer_stage_init(&j->stage, &j->tr, pinned)) != TS_OK) {
            snprintf(err, errlen, "no memory for a copy of the training state (%lld bytes)",
                     (long long)j->model.num_params * 16);
            return rc;
        }
        j->staged = 1;
    }
    if ((rc = ts_trainer_stage_begin(&j->stage, &j->tr)) != TS_OK) {
        snprintf(err, errlen, "cannot copy the training state out: %s", ts_strerror(rc));
        return rc;
    }
    ts_train_meta(&j->w_meta, &j->tr, j->shard, j->partition_id, j->cluster, measure_heldout(j));
    if (j->latent_space[0])
        ts_train_meta_add(&j->w_meta, TS_LATENT_SPACE_KEY, j->latent_space);
    pthread_mutex_lock(&j->mu);
    j->w_step = j->tr.step;
    j->w_busy = 1;
    pthread_cond_broadcast(&j->wcv);
    pthread_mutex_unlock(&j->mu);
    return TS_OK;
}

/* Waits for the write in flight, then ends the writer; its error, if any. */
static int writer_stop(ts_train_job_t *j, int64_t *at, char *err, size_t errlen) {
    pthread_mutex_lock(&j->mu);
    int rc = writer_idle(j, at, err, errlen);
    j->w_quit = 1;
    pthread_cond_broadcast(&j->wcv);
    pthread_mutex_unlock(&j->mu);
    pthread_join(j->writer, NULL);
    return rc;
}

/* The end of a complete run: the final weights into the store (and the file, if asked). */
static int finish(ts_train_job_t *j, ts_hash_t *weights, char *err, size_t errlen) {
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = encode_weights(j, &buf, &len, err, errlen);
    if (rc == TS_OK)
        rc = publish(j, buf, len, j->tr.step, weights, err, errlen);
    if (rc == TS_OK && j->out)
        rc = ts_weights_export(j->store, weights, j->out, err, errlen);
    return rc;
}

static void *job_main(void *arg) {
    ts_train_job_t *j = arg;
    char err[320] = "";
    int rc = TS_OK;
    const char *what = ""; /* what failed, at step `at` */
    int64_t at = j->tr.step;
    int64_t first = j->tr.step;
    double t0 = ts_now_s();
    if (pthread_create(&j->writer, NULL, writer_main, j) != 0) {
        rc = TS_ENOMEM, what = "the checkpoint writer";
        snprintf(err, sizeof err, "cannot start its thread");
        pthread_mutex_lock(&j->mu);
        j->progress.state = TS_TRAIN_FAILED;
        snprintf(j->progress.message, sizeof j->progress.message, "%s: %s", what, err);
        j->ended = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        notify(j);
        return NULL;
    }
    /* resumed mid-run: serve what the checkpoint holds at once (a complete run: finish does) */
    if (j->snapshots && j->tr.step > 0 && j->tr.step < j->steps) {
        what = "snapshot";
        if ((rc = publish_snapshot(j, err, sizeof err)) == TS_OK)
            notify(j);
    }
    ts_engine_mark_t mk[2] = {{0}, {0}}; /* a step's device time */
    int64_t captures = j->tr.graphs.captures, graphs_was = j->tr.graphs.on;
    while (rc == TS_OK && j->tr.step < j->steps && !atomic_load(&j->stop)) {
        float loss = NAN;
        double s0 = ts_now_s(), dev = 0.0;
        int marked = ts_engine_mark(&j->eng, &mk[0]) == TS_OK;
        if ((rc = ts_trainer_step(&j->tr, &loss, NULL)) != TS_OK) {
            snprintf(err, sizeof err, "loss %g", loss);
            what = "step", at = j->tr.step + 1;
            break;
        }
        if (j->tr.graphs.on != graphs_was) /* −1: a capture failed (model/trainer.h) */
            ts_log_warn("train", "graphs: the step's capture into a CUDA graph failed; the steps "
                                 "run eagerly (the same arithmetic, more launches)");
        else if (j->tr.graphs.captures > captures)
            ts_log_info("train",
                        "graphs: step %lld's forward and backward captured into a CUDA "
                        "graph; the steps after launch it",
                        (long long)j->tr.step);
        graphs_was = j->tr.graphs.on, captures = j->tr.graphs.captures;
        /* the device's timeline from before the step's batch went up to after its last kernel
         * (elapsed waits for that kernel: AdamW and EMA are queued after the loss is read) */
        if (!(marked && ts_engine_mark(&j->eng, &mk[1]) == TS_OK &&
              ts_engine_marks_elapsed(&j->eng, &mk[0], &mk[1], &dev) == TS_OK))
            dev = 0.0;
        double now = ts_now_s();
        double sps = (double)(j->tr.step - first) * j->tr.cfg.batch / (now - t0 + 1e-9);
        pthread_mutex_lock(&j->mu);
        j->progress.step = j->tr.step;
        j->progress.loss = loss;
        j->progress.loss_avg = j->tr.loss_avg;
        j->progress.samples_per_s = sps;
        j->progress.step_s = now - s0;
        j->progress.step_device_s = dev;
        j->progress.f16 = j->model.precision == TS_PREC_F16;
        j->progress.loss_scale = j->tr.loss_scale;
        j->progress.skipped = j->tr.skipped;
        if (j->w_rc != TS_OK) { /* a periodic write failed: stop now, not at the next hand-over */
            rc = writer_idle(j, &at, err, sizeof err);
            what = "checkpoint";
        }
        pthread_mutex_unlock(&j->mu);
        if (rc != TS_OK)
            break;
        if (j->tr.step % j->ckpt_every == 0 && j->tr.step < j->steps) {
            what = "checkpoint", at = j->tr.step;
            rc = checkpoint_async(j, &at, err, sizeof err);
        }
    }
    /* the last periodic write in, before the final checkpoint or the weights; a write's failure
     * names its own step and sentence only when nothing else failed first */
    int64_t wat = at;
    char werr[320] = "";
    int wrc = writer_stop(j, &wat, werr, sizeof werr);
    if (j->staged) { /* the final checkpoint makes its own copy: not a third one at the end */
        ts_trainer_stage_free(&j->stage);
        j->staged = 0;
    }
    if (rc == TS_OK && wrc != TS_OK) {
        rc = wrc, what = "checkpoint", at = wat;
        snprintf(err, sizeof err, "%s", werr);
    }
    ts_engine_mark_free(&mk[0]);
    ts_engine_mark_free(&mk[1]);
    ts_train_state_t state = TS_TRAIN_FAILED;
    ts_hash_t weights = {{0}};
    int complete = j->tr.step >= j->steps;
    if (rc == TS_OK && j->progress.ckpt_step != j->tr.step) { /* stopped, or the last step */
        what = "checkpoint", at = j->tr.step;
        rc = checkpoint(j, !complete, err, sizeof err); /* complete: finish publishes */
    }
    if (rc == TS_OK && complete) {
        what = "final weights", at = j->tr.step;
        if ((rc = finish(j, &weights, err, sizeof err)) == TS_OK)
            state = TS_TRAIN_DONE;
    } else if (rc == TS_OK) {
        state = TS_TRAIN_STOPPED;
    }
    pthread_mutex_lock(&j->mu);
    j->progress.state = state;
    j->progress.weights = weights;
    if (state == TS_TRAIN_FAILED)
        snprintf(j->progress.message, sizeof j->progress.message,
                 "%s at step %lld failed: %s%s%s; the checkpoint at step %lld is intact", what,
                 (long long)at, err, *err ? ": " : "", ts_strerror(rc),
                 (long long)j->progress.ckpt_step);
    /* ended before the last notify, so that the loop it wakes can join at once; the join
     * then waits for this thread to return, and the job cannot be freed under notify */
    j->ended = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    notify(j);
    return NULL;
}

/* ---- start, stop, progress --------------------------------------------------------------- */

void ts_train_job_opts_from_config(ts_train_job_opts_t *o, const ts_daemon_config_t *c,
                                   ts_store_t *store) {
    *o = (ts_train_job_opts_t){.store = store,
                               .partition = c->expert_partition,
                               .cluster = c->expert_cluster,
                               .data = c->train_data,
                               .latents = c->train_latents[0] ? c->train_latents : NULL,
                               .model = c->train_model,
                               .steps = c->train_steps,
                               .threads = c->train_threads,
                               .device = c->compute_device,
                               .precision = c->compute_precision,
                               .ckpt_every = c->train_ckpt_every,
                               .keep = c->train_keep,
                               .snapshots = c->train_serve_while_training,
                               .out = c->expert_weights[0] ? c->expert_weights : NULL};
    ts_train_config_default(&o->train);
    o->train.batch = c->train_batch, o->train.lr = (float)c->train_lr;
    o->train.warmup = c->train_warmup, o->train.ema_decay = (float)c->train_ema;
    o->train.seed = c->train_seed, o->train.graphs = c->train_graphs;
}

static int check_opts(const ts_train_job_opts_t *o, char *err, size_t errlen) {
    const char *bad = !o->store           ? "store"
                      : !o->partition     ? "partition"
                      : o->cluster < 0    ? "cluster"
                      : o->steps < 1      ? "steps"
                      : o->ckpt_every < 1 ? "ckpt_every"
                      : o->keep < 1       ? "keep"
                      : o->threads < 0    ? "threads"
                                          : NULL;
    if (bad)
        ts_set_err(err, errlen, "training job: option %s is missing or out of range", bad);
    return bad ? TS_EINVAL : TS_OK;
}

/* Builds the model and the trainer on the job's data, then resumes the run if it has a
 * checkpoint. */
static int build(ts_train_job_t *j, const ts_train_job_opts_t *o, char *err, size_t errlen) {
    const char *name = o->model ? o->model : "tiny";
    ts_dit_config_t cfg;
    if (ts_dit_config_preset(name, &cfg) != TS_OK) {
        ts_set_err(err, errlen, "unknown model '%s' (mini, tiny, small, S/2 … XL/8)", name);
        return TS_EINVAL;
    }
    cfg.in_channels = j->data.channels, cfg.input_size = j->data.height;
    cfg.num_classes = j->data.num_classes; /* Fashion-MNIST's 10, or a latent set's own */
    if (j->data.height != j->data.width || cfg.input_size % cfg.patch_size != 0) {
        ts_set_err(err, errlen,
                   "the model %s (patch %d) does not fit the data's %d×%d images: [train] model "
                   "names one whose patch divides the side",
                   name, cfg.patch_size, j->data.height, j->data.width);
        return TS_EINVAL;
    }
    int rc = ts_train_run_id(j->partition_id, j->cluster, &cfg, &o->train, j->progress.run_id);
    char note[384] = "";
    if (rc == TS_OK &&
        (rc = ts_engine_init_spec(&j->eng, &o->device, o->threads, note, sizeof note)) != TS_OK)
        ts_set_err(err, errlen, "cannot start the training engine: %s", note);
    /* the memory of the model, its gradients, AdamW, EMA and a batch's activations, from the
     * config, against what the device has free: a batch that cannot fit is refused with both */
    ts_dit_memory_t mem;
    uint64_t need = 0, free_b = 0, total = 0;
    if (rc == TS_OK) {
        int mrc = ts_dit_memory(&cfg, o->precision, TS_ATTN_COMPOSED, &mem);
        if (mrc == TS_OK && !mem.can_train)
            mrc = TS_ERANGE;
        if (mrc != TS_OK) {
            ts_set_err(err, errlen,
                       "model '%s' cannot be trained here: its parameters or activations per "
                       "sample pass this project's memory bounds (model/dit.h)",
                       name);
            rc = mrc;
        }
    }
    if (rc == TS_OK) {
        need = ts_dit_memory_total(&mem, 1, o->train.batch);
        const double gib = (double)(1u << 30);
        if (ts_engine_memory_usable(&j->eng, &free_b, &total) == TS_OK && total > 0) {
            if (need > free_b) {
                ts_set_err(err, errlen,
                           "model '%s' at batch %d needs %.3f GiB to train (%.1f MiB per sample) "
                           "and %.3f GiB of the %s's %.3f are usable: lower [train] batch",
                           name, o->train.batch, (double)need / gib,
                           (double)mem.train_per_sample / (1 << 20), (double)free_b / gib,
                           j->eng.device == TS_CUDA ? "device" : "machine", (double)total / gib);
                rc = TS_ENOMEM;
            }
        }
        if (rc == TS_OK)
            ts_log_info(
                "train", "training on %s; memory %.3f GiB for batch %d (%.1f MiB per sample)", note,
                (double)need / gib, o->train.batch, (double)mem.train_per_sample / (1 << 20));
    }
    if (rc == TS_OK && ((rc = ts_dit_create(&j->model, &cfg, &j->eng, o->train.batch, 1)) ||
                        (rc = ts_dit_init_weights(&j->model, o->train.seed))))
        ts_set_err(err, errlen, "cannot build model '%s' for batch %d", name, o->train.batch);
    if (rc == TS_OK && o->precision != TS_PREC_F32) { /* where it cannot run: f32, and why */
        char why[256] = "";
        if (ts_dit_set_precision(&j->model, o->precision, why, sizeof why) == TS_OK)
            ts_log_info("train",
                        "precision %s: %s products forward and backward%s, fp32 masters, "
                        "AdamW and EMA%s",
                        ts_precision_name(o->precision), ts_precision_name(o->precision),
                        j->eng.device == TS_CPU && o->precision == TS_PREC_F16
                            ? " (emulated on the CPU: slower than f32)"
                            : "",
                        o->precision == TS_PREC_F16 ? ", dynamic loss scaling" : "");
        else
            ts_log_warn("train", "precision %s refused (%s): training in f32",
                        ts_precision_name(o->precision), why[0] ? why : "not supported");
    }
    if (rc == TS_OK && (rc = ts_trainer_init(&j->tr, &j->model, &j->data, &o->train)) != TS_OK)
        ts_set_err(err, errlen, "cannot start training (batch %d, lr %g, %d images)",
                   o->train.batch, o->train.lr, j->data.n);
    if (rc != TS_OK)
        return rc;
    if (o->train.graphs && j->eng.device != TS_CUDA)
        ts_log_info("train", "graphs: a CPU engine has no CUDA graphs; the steps run eagerly");
    rc = ts_ckpt_resume_trainer(j->store, j->progress.run_id, &j->tr, err, errlen);
    if (rc == TS_ENOTFOUND)
        return TS_OK;
    if (rc == TS_OK)
        j->progress.resumed_from = j->progress.ckpt_step = j->tr.step;
    return rc;
}

static void job_free_parts(ts_train_job_t *j) {
    if (j->staged)
        ts_trainer_stage_free(&j->stage);
    ts_trainer_free(&j->tr);
    ts_heldout_own_free(&j->heldout);
    free(j->heldout_partition);
    free(j->heldout_data);
    ts_dit_free(&j->model);
    ts_engine_free(&j->eng);
    ts_dataset_free(&j->data);
    ts_train_snapshot_release(j->snapshot);
    pthread_cond_destroy(&j->cv);
    pthread_cond_destroy(&j->wcv);
    pthread_mutex_destroy(&j->mu);
    free(j->out);
    free(j);
}

int ts_train_job_start(ts_train_job_t **out, const ts_train_job_opts_t *o, char *err,
                       size_t errlen) {
    if (!out || !o) {
        ts_set_err(err, errlen, "ts_train_job_start: NULL argument");
        return TS_EINVAL;
    }
    *out = NULL;
    int rc = check_opts(o, err, errlen);
    ts_train_job_t *j = rc == TS_OK ? calloc(1, sizeof *j) : NULL;
    if (rc != TS_OK)
        return rc;
    if (!j)
        return TS_ENOMEM;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&j->wcv, NULL);
    pthread_mutex_init(&j->mu, NULL);
    atomic_init(&j->stop, 0);
    j->store = o->store, j->steps = o->steps, j->ckpt_every = o->ckpt_every, j->keep = o->keep;
    j->snapshots = o->snapshots, j->notify = o->notify, j->ctx = o->ctx, j->cluster = o->cluster;
    j->progress = (ts_train_progress_t){.state = TS_TRAIN_RUNNING,
                                        .steps = o->steps,
                                        .ckpt_step = -1,
                                        .loss = NAN,
                                        .loss_avg = NAN,
                                        .snapshot_step = -1,
                                        .heldout_loss = NAN,
                                        .heldout_step = -1};
    j->heldout_loss = NAN, j->heldout_step = -1;
    snprintf(j->shard, sizeof j->shard, "shard-%d", o->cluster);
    if (o->out && !(j->out = strdup(o->out)))
        rc = TS_ENOMEM;
    j->heldout_batch = o->train.batch;
    if (!(j->heldout_partition = strdup(o->partition)) ||
        (o->data && !(j->heldout_data = strdup(o->data))))
        rc = TS_ENOMEM;
    char name[64];
    j->latents = o->latents != NULL;
    if (rc == TS_OK && o->latents) { /* a partition of a latent data set: its cluster */
        rc = ts_partition_latents(o->latents, &j->data, name, j->latent_space, err, errlen);
        if (rc == TS_OK)
            rc = ts_partition_take_cluster(o->partition, o->cluster, &j->data, name, o->latents,
                                           j->partition_id, err, errlen);
    } else if (rc == TS_OK) {
        rc = ts_partition_load_cluster(o->partition, o->cluster, o->data, &j->data, j->partition_id,
                                       err, errlen);
    }
    if (rc == TS_OK)
        rc = build(j, o, err, errlen);
    if (rc == TS_OK) {
        j->progress.step = j->tr.step;
        j->progress.loss_avg = j->tr.loss_avg;
        if ((rc = pthread_create(&j->thread, NULL, job_main, j)) != 0) {
            ts_set_err(err, errlen, "cannot start the training thread: %s", strerror(rc));
            rc = TS_ENOMEM;
        }
    }
    if (rc != TS_OK) {
        job_free_parts(j);
        return rc;
    }
    *out = j;
    return TS_OK;
}

void ts_train_job_request_stop(ts_train_job_t *j) {
    if (j)
        atomic_store(&j->stop, 1);
}

int ts_train_job_stop(ts_train_job_t *j, int timeout_ms) {
    if (!j)
        return TS_EINVAL;
    ts_train_job_request_stop(j);
    if (j->joined)
        return TS_OK;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ms >= 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L)
            deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&j->mu);
    int timed_out = 0;
    while (!j->ended && !timed_out) {
        if (timeout_ms < 0)
            pthread_cond_wait(&j->cv, &j->mu);
        else
            timed_out = pthread_cond_timedwait(&j->cv, &j->mu, &deadline) == ETIMEDOUT;
    }
    int ended = j->ended;
    pthread_mutex_unlock(&j->mu);
    if (!ended)
        return TS_ETIMEDOUT;
    pthread_join(j->thread, NULL);
    j->joined = 1;
    return TS_OK;
}

void ts_train_job_progress(ts_train_job_t *j, ts_train_progress_t *out) {
    pthread_mutex_lock(&j->mu);
    *out = j->progress;
    pthread_mutex_unlock(&j->mu);
}

void ts_train_job_free(ts_train_job_t *j) {
    if (!j)
        return;
    ts_train_job_stop(j, -1);
    job_free_parts(j);
}
