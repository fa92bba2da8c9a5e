/*
 * train_job.h — tesserad's training job: the expert of one cluster of a partition, trained on a
 * thread of its own, checkpointed into the store, resumed bit-identically after any kill.
 *
 * A job is what `tessera train --partition DIR --cluster K` does, run inside the daemon: the
 * images of cluster K (ts_partition_load_cluster: the set shard-K.txt lists), flow matching
 * (model/trainer.h), a checkpoint in the store every ckpt_every steps, and at the end the EMA
 * weights imported into the store (ts_weights_import_buf) with the metadata of ts_train_meta —
 * partition_id, cluster, objective velocity, train_steps — so that ts_expert_prepare
 * (daemon/expert.h) accepts them with the partition and the node can host them.
 *
 * Threads. ts_train_job_start does, on the calling thread, everything that a bad input can make
 * fail — it loads the partition and the cluster's images, builds the model and a CPU engine,
 * and resumes from the run's newest checkpoint (well under a second for `tiny`) — so that a
 * misconfigured node stops at start with a sentence. Then a pthread of the job runs the steps,
 * and a second one, its writer, puts the periodic checkpoints and their snapshots into the store
 * while the steps go on (the final checkpoint and weights the job's thread writes itself, after
 * the writer has finished); the caller's thread (the daemon's uv loop) never waits for a step.
 * The two share only a few hundred bytes under a mutex that is never held across compute or
 * I/O: the progress, the newest snapshot, and the stop flag. The engine is the job's alone.
 *
 * Run id. A job's checkpoints are the store's run
 *
 *     tesserad/<partition_id>/<cluster>/<16 hex digits>
 *
 * where the digits begin the BLAKE2b-256 of the training configuration written out in full
 * (model config, batch, lr, warm-up, weight decay, betas, eps, clip, EMA decay, label dropout,
 * the t distribution, seed; ts_train_run_id). A job started again with the same partition,
 * cluster and configuration therefore resumes, and any change that would make the steps differ
 * starts another run instead of tripping over an incompatible checkpoint. The number of steps is
 * not part of it (the learning-rate schedule does not depend on it): raising it continues the run.
 *
 * Checkpoints. Every ckpt_every steps, when stopped, and at the end, in one store transaction
 * each (store/ckpt.h, keeping the newest `keep`); they hold every slab, the step and the loss
 * average, and the draws of a step depend only on (seed, step), so a job killed at any moment
 * and started again continues from its last checkpoint bit for bit — on the same build and
 * thread count — and ends with the same weights hash as a run never interrupted.
 *
 * Held-out loss. At its first measure the job's thread loads the test split and picks its
 * cluster's first TS_HELDOUT_PER test images (model/heldout.h; ~0.4 s, kept off the daemon's
 * loop); at every checkpoint, snapshot and the end it measures the EMA weights' flow-matching
 * loss on them (~0.1 s for `mini`, ~0.5 s for `tiny` on two cores; the steps wait for it), puts
 * it in the progress and in the weights' metadata (heldout_loss), so the node can advertise how
 * trained its expert is and a client compare it with the finished experts of the partition.
 * Without the test split the job trains all the same and says why once.
 *
 * Snapshots (serve_while_training). With `snapshots` set, at every checkpoint (and on start when
 * resuming) the job encodes its EMA weights as a safetensors file, imports it into the store
 * and publishes it as the job's newest snapshot: reference-counted bytes plus their weights
 * hash. The store then holds a real expert (ts_expert_prepare, ts_weights_open_dit and the
 * weight server all work with its hash), and the serving code may instead build its ts_dit_t
 * straight from the bytes (ts_train_snapshot_open_dit). The previous snapshot's manifest is
 * removed from the store when a newer one is published (its chunks go with the next gc); the
 * final weights are never removed. The last snapshot is the final weights, byte for byte.
 *
 * Notify. After a checkpoint, after a new snapshot and when the job ends, the job's thread or its
 * writer (never both at once) calls opts.notify(ctx) — the daemon passes a function calling uv_async_send — and the loop then reads
 * ts_train_job_progress and ts_train_job_snapshot. Calls may coalesce; they carry no data.
 */
#ifndef TS_DAEMON_TRAIN_JOB_H
#define TS_DAEMON_TRAIN_JOB_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"
#include "model/dit.h"
#include "model/trainer.h"
#include "store/store.h"
#include "store/weights.h"

#define TS_TRAIN_RUN_ID_MAX 128 /* bytes of a run id, NUL included */

typedef struct ts_train_job_opts {
    ts_store_t *store;       /* borrowed: must outlive the job */
    const char *partition;   /* the partition file (`tessera partition`'s partition.safetensors) */
    int cluster;             /* 0..K−1 */
    const char *data;        /* the Fashion-MNIST IDX folder; NULL = TS_FMNIST_DEFAULT_DIR */
    const char *latents;     /* a latent data set (model/latents.h) instead; NULL: Fashion-MNIST */
    const char *model;       /* a preset of ts_dit_config_preset; NULL = "tiny" */
    int64_t steps;           /* the run is complete at this step (≥ 1) */
    ts_train_config_t train; /* from ts_train_config_default, then batch, lr, warmup, ... */
    int threads;             /* the job's compute threads; 0 = one per online core */
    ts_device_spec_t device; /* the job's engine ({0}: the CPU; tesserad: [compute] device) */
    /* the products (tesserad: [compute] precision): f32 (zeroed), or bf16 or f16 training (fp32
     * masters, AdamW and EMA; ts_dit_set_precision; f16 with the trainer's loss scaling). Where
     * the precision cannot run the job trains in f32 and logs why, as the server does. */
    ts_precision_t precision;
    int ckpt_every;  /* steps between checkpoints, ≥ 1 */
    int keep;        /* checkpoints of the run kept in the store, ≥ 1 */
    int snapshots;   /* 1: publish the EMA weights at every checkpoint (see above) */
    const char *out; /* may be NULL: also write the final weights to this file */
    /* May be NULL. Called on the job's thread or its writer's (never at once); must be
     * thread-safe and return at once (uv_async_send is both). */
    void (*notify)(void *ctx);
    void *ctx;
} ts_train_job_opts_t;

/* The options of [expert] mode = train and [train] (daemon/config.h): partition, cluster, the
 * [train] keys (over ts_train_config_default), weights as `out` when set, serve_while_training as
 * `snapshots`. The strings point into c, which must outlive the call to ts_train_job_start;
 * notify and ctx are left NULL for the caller. */
void ts_train_job_opts_from_config(ts_train_job_opts_t *o, const ts_daemon_config_t *c,
                                   ts_store_t *store);

typedef enum {
    TS_TRAIN_RUNNING = 0, /* stepping (or stopping: the stop was asked for) */
    TS_TRAIN_STOPPED,     /* stopped before the end: checkpointed, a new job resumes it */
    TS_TRAIN_DONE,        /* reached `steps`: the weights are in the store (progress.weights) */
    TS_TRAIN_FAILED,      /* progress.message says why; the last checkpoint is intact */
} ts_train_state_t;

const char *ts_train_state_name(ts_train_state_t s); /* "running", "stopped", "done", "failed" */

typedef struct ts_train_progress {
    ts_train_state_t state;
    int64_t step, steps;   /* steps completed, of steps */
    int64_t resumed_from;  /* the checkpoint's step the job started from; 0 for a fresh run */
    int64_t ckpt_step;     /* the newest checkpoint in the store; −1 none yet */
    float loss;            /* the last step's loss (NaN before the job's first step) */
    float loss_avg;        /* the run's running average (model/trainer.h; carried by checkpoints) */
    double samples_per_s;  /* since the job started */
    double step_s;         /* the last step's wall time */
    double step_device_s;  /* its span on the device's timeline (CUDA events on a GPU; idle gaps
                            * between its kernels included); on a CPU the same as step_s */
    int f16;               /* the job trains in f16 (the two below mean something) */
    float loss_scale;      /* f16: the trainer's loss scale now (model/trainer.h) */
    int64_t skipped;       /* f16: steps of the run skipped for overflowing gradients */
    uint64_t snapshots;    /* snapshots published so far: a new value means a new snapshot */
    int64_t snapshot_step; /* the newest snapshot's step; −1 none */
    /* the EMA weights' loss on held-out images of the cluster (model/heldout.h), measured at
     * every checkpoint, snapshot and the end; NaN and −1 before the first or without the test
     * split. The snapshot of heldout_step carries it as its heldout_loss metadata. */
    float heldout_loss;
    int64_t heldout_step;
    ts_hash_t weights; /* TS_TRAIN_DONE: the final EMA weights' hash in the store */
    char run_id[TS_TRAIN_RUN_ID_MAX];
    char message[512]; /* TS_TRAIN_FAILED: a sentence */
} ts_train_progress_t;

/* One published copy of the EMA weights. Immutable once published; shared by reference. */
typedef struct ts_train_snapshot {
    int64_t step;               /* the training step of these weights */
    ts_hash_t hash;             /* BLAKE2b-256 of bytes: the weights hash in the store */
    const unsigned char *bytes; /* a safetensors file: the EMA weights, config, ts_train_meta */
    size_t len;
    atomic_int refs; /* private: use ts_train_job_snapshot / ts_train_snapshot_release */
} ts_train_snapshot_t;

typedef struct ts_train_job ts_train_job_t;

/* Loads, builds and resumes (see Threads), then starts the job's thread. On failure *out is
 * NULL, nothing runs, and err says what was wrong and what to do: TS_EINVAL (a bad option, a
 * cluster ≥ K, a model name), TS_EIO (the partition file or the data set cannot be read),
 * TS_ECORRUPT (either is malformed, or the run's checkpoint is), TS_ENOMEM. The job borrows
 * opts->store; the strings of opts are used only during the call. */
int ts_train_job_start(ts_train_job_t **out, const ts_train_job_opts_t *opts, char *err,
                       size_t errlen);

/* Asks the job to stop after its current step, writing a checkpoint; returns at once. Any
 * thread. The end is announced by notify and by progress.state. */
void ts_train_job_request_stop(ts_train_job_t *j);

/* Asks the job to stop (as above) and waits up to timeout_ms (< 0: without limit) for its thread
 * to finish the current step, write its checkpoint and end; then joins it. TS_OK once the
 * thread has ended (also when it had ended before), TS_ETIMEDOUT when it has not yet — call
 * again, or exit: the last checkpoint is intact either way. Once notify has reported the end
 * (progress.state no longer running), ts_train_job_stop(j, 0) joins at once. The caller's
 * thread (one of them), never from notify. */
int ts_train_job_stop(ts_train_job_t *j, int timeout_ms);

/* A copy of the job's progress. Any thread; holds the job's mutex only to copy. */
void ts_train_job_progress(ts_train_job_t *j, ts_train_progress_t *out);

/* The newest snapshot, with a reference the caller owns (ts_train_snapshot_release), or NULL
 * when none has been published. Any thread. A snapshot outlives its job. */
ts_train_snapshot_t *ts_train_job_snapshot(ts_train_job_t *j);
void ts_train_snapshot_release(ts_train_snapshot_t *s); /* NULL-safe */

/* Builds *m from a snapshot's bytes on engine e (max_batch, trainable as ts_dit_create). On
 * failure *m is empty and err says why. */
int ts_train_snapshot_open_dit(const ts_train_snapshot_t *s, ts_engine_t *e, int max_batch,
                               int trainable, ts_dit_t *m, char *err, size_t errlen);

/* Stops the job (waiting without limit, as ts_train_job_stop(j, −1)) and frees it; snapshots
 * still referenced live on. NULL-safe. */
void ts_train_job_free(ts_train_job_t *j);

/* The run id of a job (see Run id) into out. TS_EINVAL for a NULL argument or a partition_id
 * that is not 64 hex digits. */
int ts_train_run_id(const char *partition_id, int cluster, const ts_dit_config_t *model,
                    const ts_train_config_t *train, char out[TS_TRAIN_RUN_ID_MAX]);

#endif
