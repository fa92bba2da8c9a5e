/*
 * optim.h — the training-loop skeleton both trainers share (the DiT trainer of model/trainer.h and
 * the classifier/router trainer of model/classifier.h): the optimiser's defaults, the
 * learning-rate schedule, and one step of AdamW over a model's parameter slabs after a global
 * gradient-norm clip. What differs between them — the loss, the data, the EMA of the weights
 * (the DiT trainer's alone) — stays with each trainer.
 */
#ifndef TS_OPTIM_H
#define TS_OPTIM_H

#include <stdint.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* AdamW's defaults for every trainer: betas (0.9, 0.999), eps 1e-8, clip at norm 1. */
#define TS_OPTIM_BETA1 0.9f
#define TS_OPTIM_BETA2 0.999f
#define TS_OPTIM_EPS 1e-8f
#define TS_OPTIM_GRAD_CLIP 1.0f

/* The learning rate at step s (0-based): lr · (s + 1) / warmup during the linear warm-up, then
 * lr (total_steps ≤ warmup: constant), or a cosine decay from lr to 0 at step total_steps. */
float ts_optim_lr(float lr, int warmup, int64_t total_steps, int64_t s);

/* One parameter slab with its gradient and AdamW moments (same shape, same device). */
typedef struct ts_optim_slab {
    ts_tensor_t *param, *grad, *m, *v;
} ts_optim_slab_t;

/* The global gradient norm over the n slabs, √(Σ ‖grad‖²), into *norm (may be NULL); then, when
 * it is finite, one AdamW step (hp, step number t ≥ 1) of every slab with the gradients scaled
 * by clip / norm when clip > 0 and the norm exceeds it. sumsq is a (1) F32 scratch tensor on the
 * engine. A norm that is not finite changes nothing and returns TS_ENONFINITE.
 * ts_optim_step_scaled multiplies the gradients by unscale (> 0) first — the norm, the clipping
 * and the step all see unscale · grad (f16 training's loss scale undone; a power of two is
 * exact); ts_optim_step is unscale 1. */
int ts_optim_step_scaled(ts_engine_t *e, const ts_optim_slab_t *slabs, int n, const ts_adamw_t *hp,
                         int64_t t, float clip, float unscale, ts_tensor_t *sumsq,
                         float *norm_out);
int ts_optim_step(ts_engine_t *e, const ts_optim_slab_t *slabs, int n, const ts_adamw_t *hp,
                  int64_t t, float clip, ts_tensor_t *sumsq, float *norm);

#ifdef __cplusplus
}
#endif

#endif
