/*
 * sampler.h — integrating the flow from noise (t = 1) to data (t = 0).
 *
 * The sampler knows nothing about models: it calls a velocity function v(x, t) for the whole
 * batch at each evaluation. One DiT with classifier-free guidance is one such function
 * (ts_dit_velocity below); a routed ensemble of experts is another (later issues), so every
 * generation path shares this integrator.
 *
 * Time grid: t_k = 1 − k/steps, k = 0..steps. Euler: x ← x − Δt·v(x, t_k). Heun: a predictor
 * x' = x − Δt·v1 with v1 = v(x, t_k), then x ← x − Δt·(v1 + v(x', t_{k+1}))/2, at every step
 * (the flow is defined at t = 0, so the last step is corrected too). Evaluations per sample:
 * steps (Euler) or 2·steps (Heun).
 */
#ifndef TS_SAMPLER_H
#define TS_SAMPLER_H

#include "model/dit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* v (same shape as x) = velocity at (x, t). Returns TS_OK or an error, which stops sampling. */
typedef int (*ts_velocity_fn)(void *ctx, const ts_tensor_t *x, float t, ts_tensor_t *v);
/* Called after each step k (1..steps); return non-zero to stop early (TS_EINVAL is returned). */
typedef int (*ts_sample_progress_fn)(void *ctx, int step, int steps);

typedef enum { TS_SAMPLER_EULER = 0, TS_SAMPLER_HEUN = 1 } ts_sampler_kind_t;

typedef struct ts_sampler_opts {
    ts_sampler_kind_t kind;
    int steps;
} ts_sampler_opts_t;

/* Parses "euler" / "heun". */
int ts_sampler_parse(const char *name, ts_sampler_kind_t *kind);

/* Fills x (n, ...) with per-sample noise: sample i is the normal stream seeds[i] from offset 0,
 * so a sample's noise does not depend on the batch it is generated in. */
int ts_sampler_noise(ts_engine_t *e, ts_tensor_t *x, const uint64_t *seeds);

/* Integrates x in place from t = 1 to t = 0. scratch: 3 tensors shaped like x. TS_ENONFINITE
 * when a sample is not finite at the end (a velocity that overflowed: f16's range). */
int ts_sampler_run(ts_engine_t *e, const ts_sampler_opts_t *o, ts_tensor_t *x,
                   ts_tensor_t scratch[3], ts_velocity_fn fn, void *ctx,
                   ts_sample_progress_fn progress, void *pctx);

/* A DiT as a velocity function with classifier-free guidance:
 * v = v(∅) + s·(v(y) − v(∅)); with s == 1 only the conditional pass runs. The model's
 * max_batch must be ≥ 2n when s != 1 (≥ n otherwise). */
typedef struct ts_dit_velocity_ctx {
    ts_dit_t *model;
    const int32_t *labels; /* n class labels (num_classes = unconditional) */
    int n;
    float cfg_scale;
    ts_tensor_t xx, tt; /* (2n, C, H, W) and (2n) staging, allocated by _init */
    int32_t *yy;        /* 2n labels */
    int64_t evals;      /* model evaluations per sample so far (a CFG pair counts as 2) */
} ts_dit_velocity_ctx_t;

int ts_dit_velocity_init(ts_dit_velocity_ctx_t *c, ts_dit_t *m, const int32_t *labels, int n,
                         float cfg_scale);
void ts_dit_velocity_free(ts_dit_velocity_ctx_t *c);
/* ts_velocity_fn for ctx = ts_dit_velocity_ctx_t. */
int ts_dit_velocity(void *ctx, const ts_tensor_t *x, float t, ts_tensor_t *v);

#ifdef __cplusplus
}
#endif

#endif
