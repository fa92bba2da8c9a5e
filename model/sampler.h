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
 *
 * DDIM and DDPM: the samplers of DDPM-trained experts (DiT's published checkpoints), run on any
 * velocity field. Their grid is a DDPM schedule's (opts.schedule; DiT's linear β 1e-4..0.02 over
 * 1000 steps by default), spaced "trailing": τ_k = round(n − 1 − k·n/steps), k = 0..steps − 1,
 * so the first step is the schedule's last. Each τ is the flow time of equal SNR (objective.h):
 * with a = √ᾱ_τ, b = √(1 − ᾱ_τ), t = b / (a + b), and a DDPM state x_τ is the flow state scaled
 * by a + b. The input noise z is x_τ0 (DDPM starts from N(0, I) at its last step), so the run
 * starts from x = z / (a0 + b0) at t_0; the last step goes to t = 0. From the velocity v at
 * (x, t) the predictions are x̂0 = x − t·v and ε̂ = x + (1 − t)·v (x = (1 − t)·x0 + t·ε).
 *   DDIM (η = 0): x_τ' = √ᾱ'·x̂0 + √(1 − ᾱ')·ε̂ — in flow time exactly the Euler step from t to t'.
 *   DDPM (ancestral, DDIM's η = 1): x_τ' = √ᾱ'·x̂0 + √(1 − ᾱ' − β̃)·ε̂ + σ·z_k — the
 *       posterior's mean plus noise — with β = 1 − ᾱ/ᾱ' (the step's β on the respaced grid),
 *       β̃ = (1 − ᾱ')/(1 − ᾱ)·β, σ² = β̃, or with opts.variance a learned σ per element,
 *       log σ² = ½(v + 1)·log β + ½(1 − v)·log β̃ (DiT's sampling); z_k sample i's normal
 *       stream opts.seeds[i] at offset (k + 1)·C·H·W (offset 0 is its starting noise): the same
 *       draws whatever the batch.
 *   The last step of both returns x̂0. Evaluations per sample: steps.
 */
#ifndef TS_SAMPLER_H
#define TS_SAMPLER_H

#include "model/dit.h"
#include "model/objective.h"

#ifdef __cplusplus
extern "C" {
#endif

/* v (same shape as x) = velocity at (x, t). Returns TS_OK or an error, which stops sampling. */
typedef int (*ts_velocity_fn)(void *ctx, const ts_tensor_t *x, float t, ts_tensor_t *v);
/* DDPM with a learned variance (DiT's published checkpoints): into out (shaped like x), the
 * model's variance interpolation v ∈ [−1, 1] at the (x, t) of the velocity just evaluated, which
 * sets the step's noise per element: log σ² = ½(v + 1)·log β + ½(1 − v)·log β̃. */
typedef int (*ts_variance_fn)(void *ctx, ts_tensor_t *out);
/* Called after each step k (1..steps); return non-zero to stop early (TS_EINVAL is returned). */
typedef int (*ts_sample_progress_fn)(void *ctx, int step, int steps);

typedef enum {
    TS_SAMPLER_EULER = 0,
    TS_SAMPLER_HEUN = 1,
    TS_SAMPLER_DDIM = 2,
    TS_SAMPLER_DDPM = 3,
} ts_sampler_kind_t;

typedef struct ts_sampler_opts {
    ts_sampler_kind_t kind;
    int steps;
    /* DDIM, DDPM: the schedule of the grid; NULL: DiT's (ts_ddpm_linear 1000, 1e-4, 0.02) */
    const ts_ddpm_schedule_t *schedule;
    /* DDPM: the n samples' noise streams (those ts_sampler_noise drew their start from) */
    const uint64_t *seeds;
    /* DDPM: the model's learned variance (called after each velocity but the last), or NULL:
     * the posterior's β̃ */
    ts_variance_fn variance;
    void *variance_ctx;
} ts_sampler_opts_t;

/* Parses "euler" / "heun" / "ddim" / "ddpm". */
int ts_sampler_parse(const char *name, ts_sampler_kind_t *kind);

/* The flow times of a DDIM/DDPM run of `steps` over schedule s (see above): t[0..steps) and
 * t[steps] = 0, with abar[k] = ᾱ at t[k] (abar[steps] = 1). TS_EINVAL for steps outside
 * 1..s->n. */
int ts_sampler_ddpm_grid(const ts_ddpm_schedule_t *s, int steps, double *t, double *abar);

/* Fills x (n, ...) with per-sample noise: sample i is the normal stream seeds[i] from offset 0,
 * so a sample's noise does not depend on the batch it is generated in. */
int ts_sampler_noise(ts_engine_t *e, ts_tensor_t *x, const uint64_t *seeds);

/* Integrates x in place from t = 1 to t = 0. scratch: 3 tensors shaped like x. TS_ENONFINITE
 * when a sample is not finite at the end (a velocity that overflowed: f16's range). TS_EINVAL:
 * steps outside 1..100000 (DDIM, DDPM: 1..the schedule's steps), DDPM without seeds. */
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
