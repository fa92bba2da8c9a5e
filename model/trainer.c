/*
 * trainer.c — the flow-matching training step, its random streams, and checkpoints.
 *
 * Streams. Each purpose has its own stream key derived from the run's seed (stream_key), and a
 * step's draws sit at a fixed offset in it (step · batch · size), so the draws of step s never
 * depend on what happened before it:
 *   PERM   epoch e's data order: a Fisher–Yates shuffle driven by stream (PERM, e)
 *   TIME   t of sample i of step s: element s·B + i
 *   DROP   label-dropout coin of sample i of step s: element s·B + i
 *   NOISE  ε of step s: elements s·B·CHW … (s+1)·B·CHW − 1
 */
#include "model/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/math.h"
#include "model/optim.h"
#include "model/safetensors.h"

enum { STREAM_PERM = 1, STREAM_TIME = 2, STREAM_DROP = 3, STREAM_NOISE = 4 };

/* SplitMix64's finaliser: a well-mixed 64-bit key per (seed, purpose). */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t ts_stream_key(uint64_t seed, uint64_t purpose) {
    return mix64(seed + 0x9e3779b97f4a7c15ull * (purpose + 1));
}

void ts_epoch_permutation(uint64_t key, int64_t epoch, int n, int32_t *perm) {
    uint64_t k0 = mix64(key ^ (uint64_t)epoch);
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        uint64_t k = (uint64_t)(n - 1 - i);
        ts_u32x4_t w = ts_rng_block(k0, k >> 2);
        int j = (int)(((uint64_t)w.v[k & 3] * (uint64_t)(i + 1)) >> 32);
        int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
}

void ts_train_config_default(ts_train_config_t *c) {
    memset(c, 0, sizeof *c);
    c->batch = 64;
    c->lr = 3e-4f;
    c->warmup = 200;
    c->weight_decay = 0.0f;
    c->beta1 = TS_OPTIM_BETA1;
    c->beta2 = TS_OPTIM_BETA2;
    c->eps = TS_OPTIM_EPS;
    c->grad_clip = TS_OPTIM_GRAD_CLIP;
    c->ema_decay = 0.999f;
    c->label_dropout = 0.1f;
    c->logit_normal = 0;
    c->seed = 0;
}

float ts_trainer_lr(const ts_train_config_t *c, int64_t s) {
    return ts_optim_lr(c->lr, c->warmup, 0, s); /* constant after the warm-up */
}

static int check_config(const ts_train_config_t *c) {
    if (c->batch < 1 || !(c->lr > 0.0f) || !isfinite(c->lr) || c->warmup < 0 ||
        !(c->weight_decay >= 0.0f) || !(c->beta1 >= 0.0f && c->beta1 < 1.0f) ||
        !(c->beta2 >= 0.0f && c->beta2 < 1.0f) || !(c->eps > 0.0f) || !(c->grad_clip >= 0.0f) ||
        !(c->ema_decay >= 0.0f && c->ema_decay <= 1.0f) ||
        !(c->label_dropout >= 0.0f && c->label_dropout <= 1.0f) ||
        (c->graphs != 0 && c->graphs != 1))
        return TS_EINVAL;
    return TS_OK;
}

int ts_trainer_init(ts_trainer_t *tr, ts_dit_t *m, const ts_dataset_t *data,
                    const ts_train_config_t *cfg) {
    if (!tr || !m || !data || !cfg)
        return TS_EINVAL;
    memset(tr, 0, sizeof *tr);
    TS_TRY(check_config(cfg));
    const ts_dit_config_t *c = &m->cfg;
    if (!m->trainable || cfg->batch > m->max_batch || data->n < 1 ||
        data->channels != c->in_channels || data->height != c->input_size ||
        data->width != c->input_size)
        return TS_EINVAL;
    tr->model = m;
    tr->data = data;
    tr->cfg = *cfg;
    tr->perm_epoch = -1;
    tr->loss_avg = NAN;
    ts_graph_cache_set(&tr->graphs, cfg->graphs);
    ts_device_t dev = m->eng->device;
    int64_t B = cfg->batch, S = c->input_size;
    const int64_t *img = TS_SHAPE(B, c->in_channels, S, S);
    int rc = TS_OK;
    ts_tensor_t *slabs[] = {&tr->m_mem, &tr->v_mem, &tr->ema_mem};
    for (int i = 0; i < 3 && rc == TS_OK; i++)
        rc = ts_tensor_alloc(slabs[i], TS_F32, dev, 1, TS_SHAPE(m->num_params));
    /* AdamW walks the whole moment slabs, the padding between tensors included: zero them all
     * (a GPU's fresh memory holds whatever was there, and NaN in v poisons every parameter) */
    for (int i = 0; i < 2 && rc == TS_OK; i++)
        rc = ts_zero(m->eng, slabs[i]);
    ts_tensor_t *imgs[] = {&tr->x0, &tr->eps, &tr->xt, &tr->target, &tr->dv};
    for (int i = 0; i < 5 && rc == TS_OK; i++)
        rc = ts_tensor_alloc(imgs[i], TS_F32, dev, 4, img);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&tr->t, TS_F32, dev, 1, TS_SHAPE(B));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&tr->loss, TS_F32, dev, 1, TS_SHAPE(1));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&tr->sumsq, TS_F32, dev, 1, TS_SHAPE(1));
    tr->x0_host = malloc((size_t)ts_tensor_numel(&tr->x0) * sizeof(float));
    tr->t_host = malloc((size_t)B * sizeof(float));
    tr->u_host = malloc((size_t)B * sizeof(float));
    tr->y_host = malloc((size_t)B * sizeof(int32_t));
    tr->perm = malloc((size_t)data->n * sizeof(int32_t));
    if (rc == TS_OK && (!tr->x0_host || !tr->t_host || !tr->u_host || !tr->y_host || !tr->perm))
        rc = TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_tensor_copy(&tr->ema_mem, &m->param_mem);
    if (rc == TS_OK) /* at bf16 or f16, the copy of the parameters as they are now */
        rc = ts_dit_refresh_lp(m);
    tr->loss_scale = TS_LOSS_SCALE_INIT;
    if (rc != TS_OK)
        ts_trainer_free(tr);
    return rc;
}

void ts_trainer_free(ts_trainer_t *tr) {
    if (!tr)
        return;
    ts_graph_cache_drop(&tr->graphs); /* before the buffers it recorded */
    ts_tensor_t *all[] = {&tr->m_mem,  &tr->v_mem, &tr->ema_mem, &tr->x0,   &tr->eps,  &tr->xt,
                          &tr->target, &tr->dv,    &tr->t,       &tr->loss, &tr->sumsq};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ts_tensor_free(all[i]);
    free(tr->x0_host);
    free(tr->t_host);
    free(tr->u_host);
    free(tr->y_host);
    free(tr->perm);
    memset(tr, 0, sizeof *tr);
}

/* Makes tr->perm the order of epoch ep. */
static void ensure_perm(ts_trainer_t *tr, int64_t ep) {
    if (tr->perm_epoch == ep)
        return;
    ts_epoch_permutation(ts_stream_key(tr->cfg.seed, STREAM_PERM), ep, tr->data->n, tr->perm);
    tr->perm_epoch = ep;
}

/* Fills x0 (host), labels (with dropout) and t for step s. */
static void draw_batch(ts_trainer_t *tr, int64_t s) {
    const ts_dataset_t *d = tr->data;
    const ts_dit_config_t *c = &tr->model->cfg;
    int B = tr->cfg.batch;
    int64_t chw = (int64_t)d->channels * d->height * d->width;
    uint64_t tkey = ts_stream_key(tr->cfg.seed, STREAM_TIME);
    uint64_t dkey = ts_stream_key(tr->cfg.seed, STREAM_DROP);
    for (int i = 0; i < B; i++) {
        int64_t g = s * B + i;
        ensure_perm(tr, g / d->n);
        int32_t idx = tr->perm[g % d->n];
        memcpy(tr->x0_host + i * chw, d->images + (int64_t)idx * chw, (size_t)chw * sizeof(float));
        uint64_t pos = (uint64_t)g;
        int drop = ts_rng_uniform_at(dkey, pos) < tr->cfg.label_dropout;
        tr->y_host[i] = drop ? c->num_classes : d->labels[idx];
        if (tr->cfg.logit_normal)
            tr->t_host[i] = 1.0f / (1.0f + expf(-ts_rng_normal_at(tkey, pos)));
        else
            tr->t_host[i] = ts_rng_uniform_at(tkey, pos);
    }
}

typedef struct {
    ts_trainer_t *tr;
    int B;
    float scale; /* the loss's, f16's: its gradient is scaled by it */
} grads_job_t;

/* A step's device work between the batch's upload and the optimiser: the forward, the loss (in
 * tr->loss), its gradient and the backward (into the model's gradients). */
static int grads_work(void *ctx) {
    grads_job_t *j = ctx;
    ts_trainer_t *tr = j->tr;
    ts_dit_t *m = tr->model;
    ts_engine_t *e = m->eng;
    ts_tensor_t v;
    TS_TRY(ts_dit_forward_queue(m, &tr->xt, &tr->t, j->B, &v));
    TS_TRY(ts_mse_forward(e, &tr->loss, &v, &tr->target));
    TS_TRY(ts_zero(e, &tr->dv));
    TS_TRY(ts_mse_backward(e, &tr->dv, j->scale, &v, &tr->target));
    TS_TRY(ts_dit_zero_grad(m));
    return ts_dit_backward(m, &tr->dv, j->B);
}

int ts_trainer_step(ts_trainer_t *tr, float *loss_out, float *norm_out) {
    if (!tr || !tr->model)
        return TS_EINVAL;
    ts_dit_t *m = tr->model;
    ts_engine_t *e = m->eng;
    int B = tr->cfg.batch;
    int64_t s = tr->step;
    draw_batch(tr, s);
    ts_tensor_t host;
    TS_TRY(ts_tensor_wrap(&host, tr->x0_host, TS_F32, TS_CPU, 4, tr->x0.shape));
    TS_TRY(ts_tensor_copy(&tr->x0, &host));
    TS_TRY(ts_tensor_wrap(&host, tr->t_host, TS_F32, TS_CPU, 1, TS_SHAPE(B)));
    TS_TRY(ts_tensor_copy(&tr->t, &host));
    uint64_t noise_off = (uint64_t)s * (uint64_t)ts_tensor_numel(&tr->eps);
    TS_TRY(ts_rng_normal(e, &tr->eps, ts_stream_key(tr->cfg.seed, STREAM_NOISE), noise_off));
    TS_TRY(ts_flow_interp(e, &tr->xt, &tr->target, &tr->x0, &tr->eps, &tr->t));
    TS_TRY(ts_dit_forward_stage(m, &tr->xt, &tr->t, tr->y_host, B));

    /* forward, loss, backward; f16: the loss scaled (a power of two: scaling and unscaling are
     * exact). A non-finite loss stops the step after it: the gradients are scratch, nothing else
     * has changed yet. */
    int f16 = m->precision == TS_PREC_F16;
    float scale = f16 ? tr->loss_scale : 1.0f;
    grads_job_t job = {tr, B, scale};
    uint32_t scale_bits;
    memcpy(&scale_bits, &scale, sizeof scale_bits);
    ts_graph_key_t k = {
        {(uint64_t)B, scale_bits, (uint64_t)m->attn, (uint64_t)m->precision, (uint64_t)m->lp_acts,
         m->graph_epoch, (uint64_t)(uintptr_t)m->param_mem.data,
         (uint64_t)(uintptr_t)m->param_lp.data, (uint64_t)(uintptr_t)m->acts.x0.data,
         (uint64_t)(uintptr_t)m->grad_mem.data}};
    TS_TRY(ts_graph_cache_run(e, &tr->graphs, &k, grads_work, &job));
    float loss;
    TS_TRY(ts_tensor_item(e, &tr->loss, &loss));
    if (loss_out)
        *loss_out = loss;
    if (!isfinite(loss))
        return TS_ENONFINITE;

    /* unscale, clip, step (model/optim.h), average */
    ts_adamw_t hp = {ts_trainer_lr(&tr->cfg, s), tr->cfg.beta1, tr->cfg.beta2, tr->cfg.eps,
                     tr->cfg.weight_decay};
    ts_optim_slab_t slab = {&m->param_mem, &m->grad_mem, &tr->m_mem, &tr->v_mem};
    /* AdamW counts the updates made (skipped f16 steps made none) */
    int rc = ts_optim_step_scaled(e, &slab, 1, &hp, s + 1 - tr->skipped, tr->cfg.grad_clip,
                                  1.0f / scale, &tr->sumsq, norm_out);
    if (f16 && (rc == TS_OK || rc == TS_ENONFINITE)) {
        int skip = ts_loss_scale_next(&tr->loss_scale, &tr->scale_good, rc == TS_OK);
        if (skip < 0)
            return skip; /* not finite at scale 1: diverged */
        if (skip) { /* a product overflowed: nothing changed; the next step at half the scale */
            tr->skipped++;
            tr->step = s + 1;
            tr->loss_avg = isnan(tr->loss_avg) ? loss : 0.98f * tr->loss_avg + 0.02f * loss;
            return TS_OK;
        }
    }
    TS_TRY(rc);
    /* EMA warm-up: a short memory early on, so the average is not dominated by the init */
    float decay = (float)(1 + s) / (float)(10 + s);
    if (decay > tr->cfg.ema_decay)
        decay = tr->cfg.ema_decay;
    TS_TRY(ts_ema_update(e, &tr->ema_mem, &m->param_mem, decay));
    /* bf16 and f16 training: the next forward multiplies by the updated masters, rounded */
    TS_TRY(ts_dit_refresh_lp(m));
    tr->step = s + 1;
    tr->loss_avg = isnan(tr->loss_avg) ? loss : 0.98f * tr->loss_avg + 0.02f * loss;
    return TS_OK;
}

int ts_log2i(float power_of_two) {
    int e = 0;
    frexpf(power_of_two, &e); /* 2^k = 0.5 · 2^(k+1) */
    return e - 1;
}

int ts_loss_scale_next(float *scale, int64_t *good, int finite) {
    if (!scale || !good)
        return TS_EINVAL;
    if (!finite) {
        if (*scale <= 1.0f)
            return TS_ENONFINITE;
        *scale *= 0.5f;
        *good = 0;
        return 1;
    }
    if (++*good >= TS_LOSS_SCALE_INTERVAL) {
        *scale = *scale < TS_LOSS_SCALE_MAX ? 2.0f * *scale : TS_LOSS_SCALE_MAX;
        *good = 0;
    }
    return 0;
}

/* ---- checkpoints ----------------------------------------------------------------------- */

static const char *const SLAB_NAMES[4] = {"params", "adam_m", "adam_v", "ema"};

static ts_tensor_t *slab_of(ts_trainer_t *tr, int i) {
    ts_tensor_t *s[4] = {&tr->model->param_mem, &tr->m_mem, &tr->v_mem, &tr->ema_mem};
    return s[i];
}

/* Decimal metadata: the step, the keys a checkpoint must agree on to be resumed (1..4), the
 * loss average (%.9g: a float's exact decimal round trip), and f16 training's loss scale, its
 * good steps and the run's skipped steps (checkpoints before them: the initial values). */
#define N_META 9
_Static_assert(N_META ==
                   sizeof((ts_trainer_stage_t *)0)->vals / sizeof((ts_trainer_stage_t *)0)->vals[0],
               "ts_trainer_stage_t holds every metadata value");
#define N_META_MATCH 5 /* keys [1, N_META_MATCH) must match */
static void meta_values(const ts_trainer_t *tr, char vals[][32]) {
    const ts_dit_config_t *c = &tr->model->cfg;
    snprintf(vals[0], 32, "%lld", (long long)tr->step);
    snprintf(vals[1], 32, "%llu", (unsigned long long)tr->cfg.seed);
    snprintf(vals[2], 32, "%d", tr->cfg.batch);
    snprintf(vals[3], 32, "%d", tr->data->n);
    snprintf(vals[4], 32, "%d/%d/%d/%d/%d/%d/%d/%d/%d", c->input_size, c->in_channels,
             c->patch_size, c->hidden_size, c->depth, c->num_heads, c->num_classes, c->mlp_ratio,
             c->freq_dim);
    snprintf(vals[5], 32, "%.9g", tr->loss_avg);
    snprintf(vals[6], 32, "%.9g", tr->loss_scale);
    snprintf(vals[7], 32, "%lld", (long long)tr->scale_good);
    snprintf(vals[8], 32, "%lld", (long long)tr->skipped);
}

static const char *const META_KEYS[N_META] = {"step",       "seed",       "batch",
                                              "data_size",  "model",      "loss_avg",
                                              "loss_scale", "scale_good", "skipped"};

void ts_trainer_stage_free(ts_trainer_stage_t *s) {
    if (!s)
        return;
    for (int i = 0; i < 4; i++)
        ts_tensor_free(&s->host[i]);
    ts_engine_mark_free(&s->done);
    memset(s, 0, sizeof *s);
}

int ts_trainer_stage_init(ts_trainer_stage_t *s, const ts_trainer_t *tr, int pinned) {
    if (!s || !tr || !tr->model)
        return TS_EINVAL;
    memset(s, 0, sizeof *s);
    int64_t n = tr->model->num_params;
    int rc = TS_OK;
    for (int i = 0; i < 4 && rc == TS_OK; i++)
        rc = pinned ? ts_tensor_alloc_pinned(&s->host[i], TS_F32, 1, TS_SHAPE(n))
                    : ts_tensor_alloc(&s->host[i], TS_F32, TS_CPU, 1, TS_SHAPE(n));
    if (rc != TS_OK)
        ts_trainer_stage_free(s);
    return rc;
}

int ts_trainer_stage_begin(ts_trainer_stage_t *s, const ts_trainer_t *tr) {
    if (!s || !tr || !tr->model || !s->host[0].data ||
        ts_tensor_numel(&s->host[0]) != tr->model->num_params)
        return TS_EINVAL;
    ts_trainer_t *t = (ts_trainer_t *)tr; /* slab_of only reads */
    ts_engine_t *e = tr->model->eng;
    int rc = TS_OK;
    for (int i = 0; i < 4 && rc == TS_OK; i++)
        rc = ts_engine_copy_async(e, &s->host[i], slab_of(t, i));
    if (rc == TS_OK)
        rc = ts_engine_mark(e, &s->done);
    if (rc != TS_OK)
        return rc;
    s->eng = e;
    s->step = tr->step;
    meta_values(tr, s->vals);
    return TS_OK;
}

int ts_trainer_stage_wait(ts_trainer_stage_t *s) {
    if (!s || !s->eng)
        return TS_EINVAL;
    return ts_engine_mark_wait(s->eng, &s->done);
}

/* The stage's tensors and metadata as the encoder takes them (the copies waited for). */
static int stage_parts(ts_trainer_stage_t *s, ts_st_entry_t entries[4],
                       const char *meta[2 * N_META], char *err, size_t errlen) {
    int rc = ts_trainer_stage_wait(s);
    if (rc != TS_OK) {
        snprintf(err, errlen, "checkpoint: cannot copy the training state to the host");
        return rc;
    }
    for (int i = 0; i < 4; i++)
        entries[i] = (ts_st_entry_t){.name = SLAB_NAMES[i],
                                     .dtype = TS_ST_F32,
                                     .ndim = 1,
                                     .shape = {ts_tensor_numel(&s->host[i])},
                                     .data = s->host[i].data};
    for (int i = 0; i < N_META; i++) {
        meta[2 * i] = META_KEYS[i];
        meta[2 * i + 1] = s->vals[i];
    }
    return TS_OK;
}

int ts_trainer_stage_encode(ts_trainer_stage_t *s, unsigned char **buf, size_t *len, char *err,
                            size_t errlen) {
    if (buf)
        *buf = NULL;
    if (len)
        *len = 0;
    if (!s || !buf || !len)
        return TS_EINVAL;
    ts_st_entry_t entries[4];
    const char *meta[2 * N_META];
    TS_TRY(stage_parts(s, entries, meta, err, errlen));
    return ts_st_serialize(entries, 4, meta, N_META, buf, len, err, errlen);
}

/* The trainer's state, copied out and waited for, in ordinary memory. */
static int stage_now(const ts_trainer_t *tr, ts_trainer_stage_t *s, char *err, size_t errlen) {
    int rc = ts_trainer_stage_init(s, tr, 0);
    if (rc == TS_OK && (rc = ts_trainer_stage_begin(s, tr)) == TS_OK)
        rc = ts_trainer_stage_wait(s);
    if (rc != TS_OK) {
        snprintf(err, errlen, "checkpoint: cannot copy the training state to the host");
        ts_trainer_stage_free(s);
    }
    return rc;
}

int ts_trainer_save_mem(const ts_trainer_t *tr, unsigned char **buf, size_t *len, char *err,
                        size_t errlen) {
    if (buf)
        *buf = NULL;
    if (len)
        *len = 0;
    if (!tr || !tr->model || !buf || !len)
        return TS_EINVAL;
    ts_trainer_stage_t s;
    TS_TRY(stage_now(tr, &s, err, errlen));
    int rc = ts_trainer_stage_encode(&s, buf, len, err, errlen);
    ts_trainer_stage_free(&s);
    return rc;
}

int ts_trainer_save(const ts_trainer_t *tr, const char *path, char *err, size_t errlen) {
    if (!tr || !tr->model || !path)
        return TS_EINVAL;
    ts_trainer_stage_t s;
    TS_TRY(stage_now(tr, &s, err, errlen));
    /* the same bytes as ts_trainer_save_mem, streamed to the file (one encoder) */
    ts_st_entry_t entries[4];
    const char *meta[2 * N_META];
    int rc = stage_parts(&s, entries, meta, err, errlen);
    if (rc == TS_OK)
        rc = ts_st_write(path, entries, 4, meta, N_META, err, errlen);
    ts_trainer_stage_free(&s);
    return rc;
}

/* Checks a parsed checkpoint against this run — every check before any slab changes, so a
 * refused checkpoint leaves the trainer as it was — then loads it. what names the source in
 * messages (a path, or "checkpoint"). */
static int ckpt_apply(ts_trainer_t *tr, const ts_st_file_t *f, const char *what, char *err,
                      size_t errlen) {
    char vals[N_META][32];
    meta_values(tr, vals);
    /* every key but the step and the loss average must match this run */
    for (int i = 1; i < N_META_MATCH; i++) {
        const char *v = ts_st_meta(f, META_KEYS[i]);
        if (!v || strcmp(v, vals[i]) != 0) {
            snprintf(err, errlen, "%s: %s is %s but this run has %s", what, META_KEYS[i],
                     v ? v : "(missing)", vals[i]);
            return TS_EINVAL;
        }
    }
    const char *step = ts_st_meta(f, "step");
    char *end = NULL;
    long long s = step ? strtoll(step, &end, 10) : -1;
    if (!step || end == step || *end != '\0' || s < 0) {
        snprintf(err, errlen, "%s: bad or missing step", what);
        return TS_ECORRUPT;
    }
    /* f16's loss scale: a power of two in [1, 2^24], and its good steps (both absent before) */
    const char *ls = ts_st_meta(f, "loss_scale"), *lg = ts_st_meta(f, "scale_good");
    float scale = ls ? strtof(ls, &end) : TS_LOSS_SCALE_INIT;
    int e2 = 0;
    if (ls && (end == ls || *end != '\0' || !(scale >= 1.0f && scale <= TS_LOSS_SCALE_MAX) ||
               frexpf(scale, &e2) != 0.5f)) {
        snprintf(err, errlen, "%s: bad loss_scale '%s' (want a power of two in [1, 2^24])", what,
                 ls);
        return TS_ECORRUPT;
    }
    long long good = lg ? strtoll(lg, &end, 10) : 0;
    if (lg && (end == lg || *end != '\0' || good < 0 || good >= TS_LOSS_SCALE_INTERVAL)) {
        snprintf(err, errlen, "%s: bad scale_good '%s'", what, lg);
        return TS_ECORRUPT;
    }
    const char *sk = ts_st_meta(f, "skipped");
    long long skipped = sk ? strtoll(sk, &end, 10) : 0;
    if (sk && (end == sk || *end != '\0' || skipped < 0 || skipped > s)) {
        snprintf(err, errlen, "%s: bad skipped '%s' (want 0 to the step, %lld)", what, sk, s);
        return TS_ECORRUPT;
    }
    int64_t n = tr->model->num_params;
    const ts_st_tensor_t *t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = ts_st_find(f, SLAB_NAMES[i]);
        /* F32 only: the slabs are F32, and anything narrower would not resume bit-identically */
        if (!t[i] || t[i]->numel != n || t[i]->dtype != TS_ST_F32) {
            snprintf(err, errlen, "%s: tensor '%s' missing, not F32, or not of %lld elements", what,
                     SLAB_NAMES[i], (long long)n);
            return TS_ECORRUPT;
        }
    }
    float *host = malloc((size_t)n * sizeof(float));
    if (!host)
        return TS_ENOMEM;
    int rc = TS_OK;
    for (int i = 0; i < 4 && rc == TS_OK; i++) {
        rc = ts_st_to_f32(t[i], host, n);
        ts_tensor_t h;
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&h, host, TS_F32, TS_CPU, 1, TS_SHAPE(n));
        if (rc == TS_OK)
            rc = ts_tensor_copy(slab_of(tr, i), &h);
    }
    free(host);
    if (rc != TS_OK) {
        snprintf(err, errlen, "%s: cannot copy the training state to the device", what);
        return rc;
    }
    if ((rc = ts_dit_refresh_lp(tr->model)) != TS_OK) { /* the loaded masters, rounded */
        snprintf(err, errlen, "%s: cannot refresh the 16-bit weights", what);
        return rc;
    }
    tr->step = s;
    tr->perm_epoch = -1;
    const char *avg = ts_st_meta(f, "loss_avg");
    tr->loss_avg = avg ? strtof(avg, NULL) : NAN;
    tr->loss_scale = scale, tr->scale_good = good, tr->skipped = skipped;
    return TS_OK;
}

int ts_trainer_load_mem(ts_trainer_t *tr, const unsigned char *buf, size_t len, char *err,
                        size_t errlen) {
    if (!tr || !tr->model || (!buf && len))
        return TS_EINVAL;
    /* ts_st_parse takes a malloc'd buffer it owns */
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy)
        return TS_ENOMEM;
    if (len)
        memcpy(copy, buf, len);
    ts_st_file_t f;
    char why[384] = "";
    int rc = ts_st_parse(copy, len, &f, why, sizeof why);
    if (rc != TS_OK) {
        snprintf(err, errlen, "checkpoint: %s", why);
        return rc;
    }
    rc = ckpt_apply(tr, &f, "checkpoint", err, errlen);
    ts_st_free(&f);
    return rc;
}

int ts_trainer_load(ts_trainer_t *tr, const char *path, char *err, size_t errlen) {
    if (!tr || !tr->model || !path)
        return TS_EINVAL;
    ts_st_file_t f;
    TS_TRY(ts_st_read(path, &f, err, errlen));
    size_t wlen = strlen(path) + 16;
    char *what = malloc(wlen);
    if (!what) {
        ts_st_free(&f);
        return TS_ENOMEM;
    }
    snprintf(what, wlen, "checkpoint %s", path);
    int rc = ckpt_apply(tr, &f, what, err, errlen);
    free(what);
    ts_st_free(&f);
    return rc;
}

void ts_train_meta(ts_train_meta_t *m, const ts_trainer_t *tr, const char *shard,
                   const char *partition_id, int cluster, double heldout) {
    snprintf(m->steps, sizeof m->steps, "%lld", (long long)tr->step);
    snprintf(m->loss, sizeof m->loss, "%.6f", tr->loss_avg);
    snprintf(m->cluster, sizeof m->cluster, "%d", cluster);
    /* clang-format off */
    const char *kv[] = {"objective", "velocity",
                        "weights", "ema",
                        "train_steps", m->steps,
                        "train_loss", m->loss,
                        "shard", shard ? shard : "all",
                        "partition_id", partition_id,
                        "cluster", m->cluster};
    /* clang-format on */
    m->n = partition_id ? 7 : 5;
    memcpy(m->kv, kv, sizeof(const char *) * 2 * (size_t)m->n);
    if (isfinite(heldout)) {
        snprintf(m->heldout, sizeof m->heldout, "%.6f", heldout);
        m->kv[2 * m->n] = "heldout_loss";
        m->kv[2 * m->n + 1] = m->heldout;
        m->n++;
    }
}

void ts_train_meta_add(ts_train_meta_t *m, const char *key, const char *value) {
    if (2 * (m->n + 1) > (int)(sizeof m->kv / sizeof m->kv[0]))
        return;
    m->kv[2 * m->n] = key;
    m->kv[2 * m->n + 1] = value;
    m->n++;
}
