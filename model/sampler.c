/* sampler.c — Euler, Heun, DDIM and DDPM over a velocity field, and a DiT with CFG as one. */
#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ts_sampler_parse(const char *name, ts_sampler_kind_t *kind) {
    if (!name || !kind)
        return TS_EINVAL;
    if (strcmp(name, "euler") == 0)
        *kind = TS_SAMPLER_EULER;
    else if (strcmp(name, "heun") == 0)
        *kind = TS_SAMPLER_HEUN;
    else if (strcmp(name, "ddim") == 0)
        *kind = TS_SAMPLER_DDIM;
    else if (strcmp(name, "ddpm") == 0)
        *kind = TS_SAMPLER_DDPM;
    else
        return TS_EINVAL;
    return TS_OK;
}

int ts_sampler_noise(ts_engine_t *e, ts_tensor_t *x, const uint64_t *seeds) {
    if (!e || !x || !seeds || ts_tensor_check(x))
        return TS_EINVAL;
    int64_t n = x->shape[0];
    for (int64_t i = 0; i < n; i++) {
        ts_tensor_t row;
        TS_TRY(ts_tensor_slice(&row, x, i, 1));
        TS_TRY(ts_rng_normal(e, &row, seeds[i], 0));
    }
    return TS_OK;
}

int ts_sampler_ddpm_grid(const ts_ddpm_schedule_t *s, int steps, double *t, double *abar) {
    if (!s || !t || !abar || steps < 1 || steps > s->n)
        return TS_EINVAL;
    for (int k = 0; k < steps; k++) { /* trailing: the first step is the schedule's last */
        long tau = lround((double)(s->n - 1) - (double)k * (double)s->n / (double)steps);
        tau = tau < 0 ? 0 : tau;
        double ab = s->abar[tau], a = sqrt(ab), b = sqrt(1.0 - ab);
        t[k] = b / (a + b);
        abar[k] = ab;
    }
    t[steps] = 0.0, abar[steps] = 1.0;
    return TS_OK;
}

/* z ·= σ per element, log σ² = ½(v + 1)·log β + ½(1 − v)·log β̃ for the variance output v (DiT's
 * learned range, v clamped to [−1, 1]), in double, on the host (one copy each way when the
 * tensors live on a GPU: one step's noise, small beside the model's forward). */
static int learned_noise(ts_tensor_t *z, const ts_tensor_t *v, double beta, double beta_tilde) {
    int64_t n = ts_tensor_numel(z);
    if (ts_tensor_numel(v) != n || beta <= 0.0 || beta_tilde <= 0.0)
        return TS_EINVAL;
    int host = z->device == TS_CPU && v->device == TS_CPU;
    float *hz = host ? z->data : malloc((size_t)n * sizeof *hz);
    float *hv = host ? v->data : malloc((size_t)n * sizeof *hv);
    ts_tensor_t tz, tv;
    int rc = hz && hv ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK && !host) {
        rc = ts_tensor_wrap(&tz, hz, TS_F32, TS_CPU, z->ndim, z->shape);
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&tv, hv, TS_F32, TS_CPU, v->ndim, v->shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&tz, z);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&tv, v);
    }
    double lb = log(beta), lbt = log(beta_tilde);
    for (int64_t i = 0; i < n && rc == TS_OK; i++) {
        double f = ((double)hv[i] + 1.0) / 2.0;
        f = f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
        hz[i] = (float)((double)hz[i] * exp(0.5 * (f * lb + (1.0 - f) * lbt)));
    }
    if (rc == TS_OK && !host)
        rc = ts_tensor_copy(z, &tz);
    if (!host) {
        free(hz);
        free(hv);
    }
    return rc;
}

/* DDIM and DDPM (sampler.h): the grid of the schedule, x scaled from DDPM's start, then per step
 * the Euler step to the next time (DDIM, and every last step), or DDPM's ancestral step. */
static int run_ddpm(ts_engine_t *e, const ts_sampler_opts_t *o, ts_tensor_t *x,
                    ts_tensor_t scratch[3], ts_velocity_fn fn, void *ctx,
                    ts_sample_progress_fn progress, void *pctx) {
    const ts_ddpm_schedule_t *s = o->schedule ? o->schedule : ts_ddpm_dit();
    int steps = o->steps;
    if (steps > s->n || (o->kind == TS_SAMPLER_DDPM && !o->seeds))
        return TS_EINVAL;
    double *t = malloc((size_t)(steps + 1) * 2 * sizeof *t);
    if (!t)
        return TS_ENOMEM;
    double *abar = t + steps + 1;
    int rc = ts_sampler_ddpm_grid(s, steps, t, abar);
    ts_tensor_t *v = &scratch[0], *z = &scratch[1];
    int64_t n = x->shape[0], chw = ts_tensor_numel(x) / (n ? n : 1);
    /* DDPM's start x_τ0 ~ N(0, I) is the flow state times a0 + b0 */
    if (rc == TS_OK)
        rc = ts_scale(e, x, (float)(1.0 / (sqrt(abar[0]) + sqrt(1.0 - abar[0]))));
    for (int k = 0; k < steps && rc == TS_OK; k++) {
        rc = fn(ctx, x, (float)t[k], v);
        if (rc != TS_OK)
            break;
        if (o->kind == TS_SAMPLER_DDIM || k + 1 == steps) {
            rc = ts_axpy(e, x, (float)-(t[k] - t[k + 1]), v); /* x̂0 at the last step */
        } else {
            /* x_τ' = √ᾱ'·x̂0 + c2·ε̂ + σ·z, x̂0 = x − t·v, ε̂ = x + (1 − t)·v, flow x' = x_τ'/(a'+b') */
            double ab = abar[k], ab1 = abar[k + 1], a1 = sqrt(ab1), b1 = sqrt(1.0 - ab1);
            double beta = 1.0 - ab / ab1, var = (1.0 - ab1) / (1.0 - ab) * beta;
            double c2 = sqrt(fmax(0.0, 1.0 - ab1 - var)), den = a1 + b1, tk = t[k];
            for (int64_t i = 0; i < n && rc == TS_OK; i++) {
                ts_tensor_t row;
                rc = ts_tensor_slice(&row, z, i, 1);
                if (rc == TS_OK)
                    rc = ts_rng_normal(e, &row, o->seeds[i], (uint64_t)(k + 1) * (uint64_t)chw);
            }
            if (rc == TS_OK)
                rc = ts_scale(e, x, (float)((a1 + c2) / den));
            if (rc == TS_OK)
                rc = ts_axpy(e, x, (float)((c2 * (1.0 - tk) - tk * a1) / den), v);
            if (rc == TS_OK && o->variance) {
                rc = o->variance(o->variance_ctx, &scratch[2]);
                if (rc == TS_OK)
                    rc = learned_noise(z, &scratch[2], beta, var);
                if (rc == TS_OK)
                    rc = ts_axpy(e, x, (float)(1.0 / den), z);
            } else if (rc == TS_OK) {
                rc = ts_axpy(e, x, (float)(sqrt(fmax(0.0, var)) / den), z);
            }
        }
        if (rc == TS_OK && progress && progress(pctx, k + 1, steps))
            rc = TS_EINVAL;
    }
    free(t);
    return rc == TS_OK ? ts_check_finite(e, x) : rc;
}

int ts_sampler_run(ts_engine_t *e, const ts_sampler_opts_t *o, ts_tensor_t *x,
                   ts_tensor_t scratch[3], ts_velocity_fn fn, void *ctx,
                   ts_sample_progress_fn progress, void *pctx) {
    if (!e || !o || !x || !scratch || !fn || o->steps < 1 || o->steps > 100000)
        return TS_EINVAL;
    for (int i = 0; i < 3; i++)
        if (!ts_tensor_same_shape(&scratch[i], x))
            return TS_ESHAPE;
    if (o->kind == TS_SAMPLER_DDIM || o->kind == TS_SAMPLER_DDPM)
        return run_ddpm(e, o, x, scratch, fn, ctx, progress, pctx);
    ts_tensor_t *v1 = &scratch[0], *v2 = &scratch[1], *xp = &scratch[2];
    for (int k = 0; k < o->steps; k++) {
        /* t computed from k each time (not accumulated) so the grid has no drift */
        float t = 1.0f - (float)k / (float)o->steps;
        float t_next = 1.0f - (float)(k + 1) / (float)o->steps;
        float dt = t - t_next;
        TS_TRY(fn(ctx, x, t, v1));
        if (o->kind == TS_SAMPLER_EULER) {
            TS_TRY(ts_axpy(e, x, -dt, v1));
        } else {
            TS_TRY(ts_tensor_copy(xp, x));
            TS_TRY(ts_axpy(e, xp, -dt, v1));
            TS_TRY(fn(ctx, xp, t_next, v2));
            TS_TRY(ts_axpy(e, x, -0.5f * dt, v1));
            TS_TRY(ts_axpy(e, x, -0.5f * dt, v2));
        }
        if (progress && progress(pctx, k + 1, o->steps))
            return TS_EINVAL;
    }
    /* a model that overflowed (f16's range) leaves NaN or Inf: an error, never an image */
    return ts_check_finite(e, x);
}

/* ---- a DiT with classifier-free guidance ---------------------------------------------- */

int ts_dit_velocity_init(ts_dit_velocity_ctx_t *c, ts_dit_t *m, const int32_t *labels, int n,
                         float cfg_scale) {
    if (!c || !m || !labels || n < 1)
        return TS_EINVAL;
    memset(c, 0, sizeof *c);
    int pairs = cfg_scale != 1.0f ? 2 : 1;
    if ((int64_t)pairs * n > m->max_batch)
        return TS_ERANGE;
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] > m->cfg.num_classes)
            return TS_ERANGE;
    const ts_dit_config_t *cf = &m->cfg;
    c->model = m;
    c->labels = labels;
    c->n = n;
    c->cfg_scale = cfg_scale;
    int64_t B = (int64_t)pairs * n;
    int rc = ts_tensor_alloc(&c->xx, TS_F32, m->eng->device, 4,
                             TS_SHAPE(B, cf->in_channels, cf->input_size, cf->input_size));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->tt, TS_F32, m->eng->device, 1, TS_SHAPE(B));
    c->yy = malloc((size_t)B * sizeof *c->yy);
    if (rc == TS_OK && !c->yy)
        rc = TS_ENOMEM;
    if (rc != TS_OK) {
        ts_dit_velocity_free(c);
        return rc;
    }
    for (int i = 0; i < n; i++) {
        c->yy[i] = labels[i];
        if (pairs == 2)
            c->yy[n + i] = cf->num_classes; /* the null class */
    }
    return TS_OK;
}

void ts_dit_velocity_free(ts_dit_velocity_ctx_t *c) {
    if (!c)
        return;
    ts_tensor_free(&c->xx);
    ts_tensor_free(&c->tt);
    free(c->yy);
    memset(c, 0, sizeof *c);
}

int ts_dit_velocity(void *ctx, const ts_tensor_t *x, float t, ts_tensor_t *v) {
    ts_dit_velocity_ctx_t *c = ctx;
    ts_engine_t *e = c->model->eng;
    int n = c->n, pairs = c->cfg_scale != 1.0f ? 2 : 1;
    if (x->shape[0] != n || !ts_tensor_same_shape(x, v))
        return TS_ESHAPE;
    /* the batch is [x; x] with labels [y; ∅] when guiding */
    for (int p = 0; p < pairs; p++) {
        ts_tensor_t half;
        TS_TRY(ts_tensor_slice(&half, &c->xx, (int64_t)p * n, n));
        TS_TRY(ts_tensor_copy(&half, x));
    }
    TS_TRY(ts_fill(e, &c->tt, t));
    ts_tensor_t out;
    TS_TRY(ts_dit_forward(c->model, &c->xx, &c->tt, c->yy, pairs * n, &out));
    c->evals += pairs;
    ts_tensor_t cond, uncond;
    TS_TRY(ts_tensor_slice(&cond, &out, 0, n));
    TS_TRY(ts_tensor_copy(v, &cond));
    if (pairs == 2) {
        /* v = v_u + s·(v_c − v_u) = s·v_c + (1 − s)·v_u */
        TS_TRY(ts_tensor_slice(&uncond, &out, n, n));
        TS_TRY(ts_scale(e, v, c->cfg_scale));
        TS_TRY(ts_axpy(e, v, 1.0f - c->cfg_scale, &uncond));
    }
    return TS_OK;
}
