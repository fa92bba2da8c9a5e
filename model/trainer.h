/*
 * trainer.h — training one expert with flow matching.
 *
 * A trainer owns the optimiser state of one model (AdamW moments, the EMA copy of the weights,
 * all three slabs laid out like the parameters) and a read-only view of its data set. One
 * ts_trainer_step is: draw a batch, draw noise and times, x_t = (1 − t)·x0 + t·ε, predict
 * v, loss = mean((v − (ε − x0))²), backward, clip the gradient norm, AdamW with a linear
 * warm-up, update the EMA.
 *
 * Reproducibility. Every random draw is a pure function of (seed, step): the data order is a
 * per-epoch permutation drawn from the counter-based RNG, and the noise, times and label drops of
 * step s come from fixed stretches of their streams. The whole training state is therefore the
 * three slabs, the parameters and the step number; a checkpoint holds exactly that, so a resumed
 * run continues bit-identically (on the same build and thread count). In particular the
 * checkpoint's "RNG state and data cursor" (architecture.md §8) are exactly (seed, step): there is
 * no generator state or file position to save, because every draw — the epoch permutation, the
 * position in it, the noise, the times and the label drops — is a pure function of the two.
 */
#ifndef TS_MODEL_TRAINER_H
#define TS_MODEL_TRAINER_H

#include "model/dit.h"
#include "model/fmnist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_train_config {
    int batch;
    float lr;   /* peak learning rate */
    int warmup; /* steps of linear warm-up from 0 */
    float weight_decay;
    float beta1, beta2, eps;
    float grad_clip; /* max global gradient norm; 0 = no clipping */
    float ema_decay;
    float label_dropout; /* probability of the null class (for CFG) */
    int logit_normal;    /* 1: t = sigmoid(N(0, 1)); 0: t ~ U(0, 1) */
    uint64_t seed;
    int graphs; /* 1: the step's forward and backward through CUDA graphs (ts_trainer_step) */
} ts_train_config_t;

/* A well-mixed stream key for one purpose (noise, times, data order, ...) of a run's seed:
 * SplitMix64's finaliser of seed + φ·(purpose + 1). Purposes are small integers each trainer
 * keeps distinct. */
uint64_t ts_stream_key(uint64_t seed, uint64_t purpose);
/* perm (n) = the order of epoch `epoch` of the stream `key`: Fisher–Yates over the Philox words
 * of key ⊕ epoch (mixed), j = ⌊word · (i + 1) / 2³²⌋. A pure function of (key, epoch, n). */
void ts_epoch_permutation(uint64_t key, int64_t epoch, int n, int32_t *perm);

/* The defaults: batch 64, lr 3e-4, warmup 200, wd 0, betas (0.9, 0.999), eps 1e-8, clip 1,
 * EMA 0.999, label dropout 0.1, uniform t, seed 0. */
void ts_train_config_default(ts_train_config_t *c);

typedef struct ts_trainer {
    ts_dit_t *model;          /* borrowed; trainable, max_batch ≥ batch */
    const ts_dataset_t *data; /* borrowed */
    ts_train_config_t cfg;
    int64_t step; /* steps completed */
    ts_tensor_t m_mem, v_mem, ema_mem;
    /* per-step buffers on the engine's device */
    ts_tensor_t x0, eps, xt, target, dv, t, loss, sumsq;
    float *x0_host, *t_host, *u_host;
    int32_t *y_host;
    int32_t *perm;      /* the current epoch's order */
    int64_t perm_epoch; /* which epoch perm holds; −1 none */
    /* The running average of the loss, avg ← 0.98·avg + 0.02·loss after each step (the first
     * step's loss to begin with; NaN before any step). Checkpoints carry it, so a resumed run
     * reports — and writes into its weights — the same value as an uninterrupted one. */
    float loss_avg;
    /* f16 training (the model at TS_PREC_F16): the loss is multiplied by loss_scale before the
     * backward, so that small gradients survive the f16 rounding of the backward's products, and
     * the gradients are divided by it before clipping and AdamW (ts_loss_scale_next's policy).
     * A skipped step changes no parameter, moment or EMA; it consumes its batch and moves the
     * learning-rate schedule, not AdamW's own count (its bias correction counts updates made,
     * step − skipped, as PyTorch's AdamW under GradScaler). All three travel in checkpoints.
     * Unused at f32 and bf16 (bf16 has fp32's range). */
    float loss_scale;   /* a power of two in [1, 2^24], TS_LOSS_SCALE_INIT to start */
    int64_t scale_good; /* good f16 steps since the scale last changed, < the interval */
    int64_t skipped;    /* f16 steps of the run skipped for non-finite gradients */
    /* CUDA graphs of the step's forward, loss and backward (cfg.graphs; ts_trainer_step) */
    ts_graph_cache_t graphs;
} ts_trainer_t;

#define TS_LOSS_SCALE_INIT 65536.0f
#define TS_LOSS_SCALE_MAX 16777216.0f /* 2^24 */
#define TS_LOSS_SCALE_INTERVAL 2000

/* f16's loss-scale policy (PyTorch's GradScaler's) after a step whose gradients were finite or
 * not, updating *scale and *good. Finite: 0, apply the step; after TS_LOSS_SCALE_INTERVAL of them
 * in a row the scale doubles (up to TS_LOSS_SCALE_MAX). Not finite: 1, skip the step, with the
 * scale halved; or TS_ENONFINITE when the scale is already 1 (nothing left to lower: the run
 * itself has diverged, and stops as an f32 run does). */
int ts_loss_scale_next(float *scale, int64_t *good, int finite);
/* log2 of a power of two (a loss scale), for messages. */
int ts_log2i(float power_of_two);

/* Starts a trainer at step 0 with zero moments and EMA = the current parameters. */
int ts_trainer_init(ts_trainer_t *tr, ts_dit_t *m, const ts_dataset_t *data,
                    const ts_train_config_t *cfg);
void ts_trainer_free(ts_trainer_t *tr);

/* One optimisation step. *loss (the batch loss before the update) and *grad_norm (before
 * clipping) may be NULL. A non-finite loss or gradient is TS_ENONFINITE, and the parameters are
 * left as they were — but for a non-finite gradient at f16 above scale 1, which skips the step
 * (loss_scale above): TS_OK, the step counted, *grad_norm not finite.
 *
 * CUDA graphs (cfg.graphs 1; off by default). With the model on a GPU, the device work of a step
 * from the forward to the backward — the forward, the loss, its gradient and the model's
 * backward, hundreds of kernel launches — runs through tr->graphs (ts_graph_cache_run,
 * kernels/engine.h: eager at the first step of a key, captured at the second, one launch at
 * every step after); the batch's upload, its noise (whose stream offset moves each step) and the
 * optimiser (a few launches around the host's read of the gradient norm) run as before. The key:
 * the batch, the f16 loss scale, the model's buffers and the settings that choose its kernels
 * (its graph_epoch). The same kernels on the same buffers: the eager step's arithmetic (a GPU's
 * backward adds some sums with atomics in no fixed order, so two steps agree to rounding,
 * graphed or not). A capture that fails turns them off (tr->graphs.on −1) and the step runs
 * eagerly, correct either way. A CPU engine ignores them. */
int ts_trainer_step(ts_trainer_t *tr, float *loss, float *grad_norm);

/* The learning rate used at step s (0-based). */
float ts_trainer_lr(const ts_train_config_t *c, int64_t s);

/* A checkpoint is safetensors bytes: params, adam_m, adam_v, ema (flat F32) and metadata (step,
 * seed, batch, the model config, the data set size, loss_avg). Loading checks that the tensors
 * are there, F32 and of the model's size, and that every metadata key but the step and loss_avg
 * matches this run (and says which one does not) — all before changing anything, so a refused
 * checkpoint leaves the trainer untouched. It then sets the step and the loss average (NaN when
 * an older checkpoint has none); the draws follow from (seed, step).
 *
 * ts_trainer_save_mem builds the bytes in memory: *buf (malloc'd, the caller frees it) holds *len
 * bytes. ts_trainer_load_mem reads them (buf is only read; it is copied). The file versions
 * write the same bytes atomically (ts_st_write) and read them back (ts_st_read). */
int ts_trainer_save_mem(const ts_trainer_t *tr, unsigned char **buf, size_t *len, char *err,
                        size_t errlen);
int ts_trainer_load_mem(ts_trainer_t *tr, const unsigned char *buf, size_t len, char *err,
                        size_t errlen);
int ts_trainer_save(const ts_trainer_t *tr, const char *path, char *err, size_t errlen);
int ts_trainer_load(ts_trainer_t *tr, const char *path, char *err, size_t errlen);

/* A checkpoint copied out while the steps go on (tesserad's trainer): host buffers for the four
 * slabs (page-locked with pinned, where the engine's device can give them), filled by
 * ts_trainer_stage_begin — on a GPU the copies are queued on the engine's stream behind the step
 * before and return at once, so the next step overlaps them (a later step cannot change what
 * they read: the same stream) — and encoded by ts_trainer_stage_encode, which first waits for
 * them and may run on another thread. ts_trainer_save_mem is init, begin, encode and free in one.
 * One stage holds one checkpoint at a time: begin again only after the encode (or wait). */
#define TS_STAGE_EMA 3 /* host[TS_STAGE_EMA]: the EMA weights */
typedef struct ts_trainer_stage {
    ts_tensor_t host[4];   /* params, adam_m, adam_v, ema: F32 (num_params), on the host */
    ts_engine_mark_t done; /* recorded after the copies */
    ts_engine_t *eng;      /* whose queue they are in (set by begin) */
    int64_t step;          /* the step staged */
    char vals[9][32];      /* the checkpoint's metadata values at that step */
} ts_trainer_stage_t;
int ts_trainer_stage_init(ts_trainer_stage_t *s, const ts_trainer_t *tr, int pinned);
int ts_trainer_stage_begin(ts_trainer_stage_t *s, const ts_trainer_t *tr);
/* Waits for the copies of the last begin (any thread). */
int ts_trainer_stage_wait(ts_trainer_stage_t *s);
/* The checkpoint bytes of the staged step (as ts_trainer_save_mem's): *buf malloc'd. */
int ts_trainer_stage_encode(ts_trainer_stage_t *s, unsigned char **buf, size_t *len, char *err,
                            size_t errlen);
void ts_trainer_stage_free(ts_trainer_stage_t *s);

/* The metadata an expert's EMA weights carry besides the model config, as key/value pairs for
 * ts_dit_save's `extra`: objective "velocity", weights "ema", train_steps (tr->step),
 * train_loss (tr->loss_avg), shard, — when partition_id is not NULL — partition_id and
 * cluster, and — when heldout is finite — heldout_loss (model/heldout.h: the EMA weights' loss
 * on held-out images of their cluster). Every value is a function of the training state, so a
 * resumed run writes the same bytes as an uninterrupted one. `tessera train` and tesserad's trainer both write it; the
 * hosted expert (daemon/expert.h) reads partition_id, cluster and objective back. kv points into
 * *m and into the caller's strings, which must outlive its use. */
typedef struct ts_train_meta {
    const char *kv[24];
    int n; /* pairs in kv */
    char steps[24], loss[32], cluster[16], heldout[32];
} ts_train_meta_t;
void ts_train_meta(ts_train_meta_t *m, const ts_trainer_t *tr, const char *shard,
                   const char *partition_id, int cluster, double heldout);
/* One more pair (the caller's strings, which must outlive m's use); dropped past the room. */
void ts_train_meta_add(ts_train_meta_t *m, const char *key, const char *value);

#ifdef __cplusplus
}
#endif

#endif
