/* sampler.c — Euler and Heun integration of a velocity field, and a DiT with CFG as one. */
#include "model/sampler.h"

#include <stdlib.h>
#include <string.h>

int ts_sampler_parse(const char *name, ts_sampler_kind_t *kind) {
    if (!name || !kind)
        return TS_EINVAL;
    if (strcmp(name, "euler") == 0)
        *kind = TS_SAMPLER_EULER;
    else if (strcmp(name, "heun") == 0)
        *kind = TS_SAMPLER_HEUN;
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

int ts_sampler_run(ts_engine_t *e, const ts_sampler_opts_t *o, ts_tensor_t *x,
                   ts_tensor_t scratch[3], ts_velocity_fn fn, void *ctx,
                   ts_sample_progress_fn progress, void *pctx) {
    if (!e || !o || !x || !scratch || !fn || o->steps < 1 || o->steps > 100000)
        return TS_EINVAL;
    for (int i = 0; i < 3; i++)
        if (!ts_tensor_same_shape(&scratch[i], x))
            return TS_ESHAPE;
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
