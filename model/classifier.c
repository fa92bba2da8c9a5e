/*
 * classifier.c — the DiT-trunk classifier (and router): model, file format, training step.
 *
 * The model is a ts_dit_t used up to its last block (ts_dit_forward_trunk) with a small head of
 * its own: LayerNorm without affine over each token, the mean over tokens (the features, D = h),
 * and a linear layer to K logits. Forward and backward are lists of op calls like the DiT's;
 * the backward hands dL/dx_final to ts_dit_backward_trunk, so no block code is repeated here.
 * Parameters live in two slabs — the trunk's (the DiT's own, final layer included but unused)
 * and the head's (weight then bias) — and the optimiser runs one AdamW step on each with one
 * global gradient-norm clip.
 *
 * Files: safetensors, the trunk's tensors under DiT's names (final_layer.* left out), head.weight
 * (K, h), head.bias (K), all F32, with the metadata described in classifier.h. Loading is
 * strict: every expected tensor present with its exact shape and finite values, nothing else.
 *
 * Training streams follow model/trainer.c's scheme (a key per purpose derived from the seed; step
 * s's draws at a fixed offset), with purposes of their own:
 *   PERM   epoch e's data order (Fisher–Yates from stream (PERM, e))
 *   TIME   t of sample i of step s: element s·B + i       (time-conditioned models only)
 *   NOISE  ε of step s: elements s·B·CHW … (s+1)·B·CHW − 1 (time-conditioned models only)
 */
#include "model/classifier.h"
#include "model/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/str.h"
#include "kernels/math.h"
#include "model/optim.h"
#include "model/safetensors.h"

#define CLS_FORMAT "tessera-classifier/1"
#define CLS_MAX_OUTPUTS 100000
#define CLS_MAX_META 64

struct ts_classifier {
    ts_dit_t trunk;
    ts_engine_t *eng; /* borrowed */
    int K, D, T, time_conditioned, max_batch, trainable;
    int num_labels; /* 0, or L: a label-aware model whose trunk has L classes (null = L) */
    ts_tensor_t head_mem, head_grad; /* (K·D + K): weight (K, D) then bias (K) */
    ts_tensor_t head_w, head_b, dhead_w, dhead_b;
    /* activations for max_batch samples */
    ts_tensor_t lnf, lnf_mean, lnf_rstd; /* (B, T, D), (B·T), (B·T) */
    ts_tensor_t feat, logits;            /* (B, D), (B, K) */
    ts_tensor_t dlogits, dfeat, dlnf, dxf;
    ts_tensor_t tzero;  /* (max_batch) zeros: t of a model that is not time-conditioned */
    ts_tensor_t labels; /* (max_batch) I32 staging */
    ts_tensor_t loss;   /* (1) */
    int32_t *cond_y;    /* (max_batch) host: the trunk's labels (the null row unless labelled) */
    int n_meta;
    char *meta_keys[CLS_MAX_META], *meta_vals[CLS_MAX_META];
};

/* ---- metadata -------------------------------------------------------------------------- */

static int meta_put(ts_classifier_t *c, const char *key, const char *val) {
    for (int i = 0; i < c->n_meta; i++)
        if (strcmp(c->meta_keys[i], key) == 0) {
            char *v = ts_dup_str(val);
            if (!v)
                return TS_ENOMEM;
            free(c->meta_vals[i]);
            c->meta_vals[i] = v;
            return TS_OK;
        }
    if (c->n_meta == CLS_MAX_META)
        return TS_ERANGE;
    char *k = ts_dup_str(key), *v = ts_dup_str(val);
    if (!k || !v) {
        free(k);
        free(v);
        return TS_ENOMEM;
    }
    c->meta_keys[c->n_meta] = k;
    c->meta_vals[c->n_meta++] = v;
    return TS_OK;
}

static const char *const CONFIG_KEYS[9] = {"input_size",  "patch_size", "in_channels",
                                           "hidden_size", "depth",      "num_heads",
                                           "num_classes", "mlp_ratio",  "freq_dim"};

static int *config_field(ts_dit_config_t *cfg, int i) {
    int *f[9] = {&cfg->input_size,  &cfg->patch_size, &cfg->in_channels,
                 &cfg->hidden_size, &cfg->depth,      &cfg->num_heads,
                 &cfg->num_classes, &cfg->mlp_ratio,  &cfg->freq_dim};
    return f[i];
}

/* The model's own keys: the format, the trunk config, K, time conditioning and the labels. */
static int own_meta(ts_classifier_t *c) {
    char buf[32];
    TS_TRY(meta_put(c, "format", CLS_FORMAT));
    for (int i = 0; i < 9; i++) {
        snprintf(buf, sizeof buf, "%d", *config_field(&c->trunk.cfg, i));
        TS_TRY(meta_put(c, CONFIG_KEYS[i], buf));
    }
    snprintf(buf, sizeof buf, "%d", c->K);
    TS_TRY(meta_put(c, "num_outputs", buf));
    if (c->num_labels) {
        snprintf(buf, sizeof buf, "%d", c->num_labels);
        TS_TRY(meta_put(c, "num_labels", buf));
    }
    return meta_put(c, "time_conditioned", c->time_conditioned ? "1" : "0");
}

/* ---- creation -------------------------------------------------------------------------- */

void ts_classifier_free(ts_classifier_t *c) {
    if (!c)
        return;
    ts_tensor_t *all[] = {&c->head_mem, &c->head_grad, &c->lnf,     &c->lnf_mean, &c->lnf_rstd,
                          &c->feat,     &c->logits,    &c->dlogits, &c->dfeat,    &c->dlnf,
                          &c->dxf,      &c->tzero,     &c->labels,  &c->loss};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ts_tensor_free(all[i]);
    ts_dit_free(&c->trunk);
    for (int i = 0; i < c->n_meta; i++) {
        free(c->meta_keys[i]);
        free(c->meta_vals[i]);
    }
    free(c->cond_y);
    free(c);
}

/* Views of weight (K, D) and bias (K) in a head slab. */
static int bind_head(const ts_classifier_t *c, const ts_tensor_t *slab, ts_tensor_t *w,
                     ts_tensor_t *b) {
    float *base = slab->data;
    TS_TRY(ts_tensor_wrap(w, base, TS_F32, slab->device, 2, TS_SHAPE(c->K, c->D)));
    return ts_tensor_wrap(b, base + (int64_t)c->K * c->D, TS_F32, slab->device, 1, TS_SHAPE(c->K));
}

int ts_classifier_create(ts_classifier_t **out, const ts_dit_config_t *trunk, int num_outputs,
                         int time_conditioned, ts_engine_t *e, int max_batch, int trainable) {
    return ts_classifier_create_labelled(out, trunk, num_outputs, 0, time_conditioned, e, max_batch,
                                         trainable);
}

int ts_classifier_create_labelled(ts_classifier_t **out, const ts_dit_config_t *trunk,
                                  int num_outputs, int num_labels, int time_conditioned,
                                  ts_engine_t *e, int max_batch, int trainable) {
    if (!out)
        return TS_EINVAL;
    *out = NULL;
    if (!trunk || !e || num_outputs < 1 || num_outputs > CLS_MAX_OUTPUTS || max_batch < 1 ||
        num_labels < 0 || num_labels > TS_CLASSIFIER_MAX_LABELS)
        return TS_EINVAL;
    ts_classifier_t *c = calloc(1, sizeof *c);
    if (!c)
        return TS_ENOMEM;
    ts_dit_config_t cfg = *trunk;
    cfg.num_classes = num_labels ? num_labels : 1;
    c->num_labels = num_labels;
    int rc = ts_dit_create(&c->trunk, &cfg, e, max_batch, trainable);
    if (rc != TS_OK) {
        free(c);
        return rc;
    }
    c->eng = e;
    c->K = num_outputs;
    c->D = cfg.hidden_size;
    c->T = ts_dit_tokens(&cfg);
    c->time_conditioned = time_conditioned ? 1 : 0;
    c->max_batch = max_batch;
    c->trainable = trainable ? 1 : 0;
    ts_device_t dev = e->device;
    int64_t B = max_batch, T = c->T, D = c->D, K = c->K;
    rc = ts_tensor_alloc(&c->head_mem, TS_F32, dev, 1, TS_SHAPE(K * D + K));
    if (rc == TS_OK)
        rc = bind_head(c, &c->head_mem, &c->head_w, &c->head_b);
    if (rc == TS_OK)
        rc = ts_zero(e, &c->head_mem);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->lnf, TS_F32, dev, 3, TS_SHAPE(B, T, D));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->lnf_mean, TS_F32, dev, 1, TS_SHAPE(B * T));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->lnf_rstd, TS_F32, dev, 1, TS_SHAPE(B * T));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->feat, TS_F32, dev, 2, TS_SHAPE(B, D));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->logits, TS_F32, dev, 2, TS_SHAPE(B, K));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->tzero, TS_F32, dev, 1, TS_SHAPE(B));
    if (rc == TS_OK)
        rc = ts_zero(e, &c->tzero);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->labels, TS_I32, dev, 1, TS_SHAPE(B));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&c->loss, TS_F32, dev, 1, TS_SHAPE(1));
    if (rc == TS_OK && trainable) {
        rc = ts_tensor_alloc(&c->head_grad, TS_F32, dev, 1, TS_SHAPE(K * D + K));
        if (rc == TS_OK)
            rc = bind_head(c, &c->head_grad, &c->dhead_w, &c->dhead_b);
        if (rc == TS_OK)
            rc = ts_zero(e, &c->head_grad);
        if (rc == TS_OK)
            rc = ts_tensor_alloc(&c->dlogits, TS_F32, dev, 2, TS_SHAPE(B, K));
        if (rc == TS_OK)
            rc = ts_tensor_alloc(&c->dfeat, TS_F32, dev, 2, TS_SHAPE(B, D));
        if (rc == TS_OK)
            rc = ts_tensor_alloc(&c->dlnf, TS_F32, dev, 3, TS_SHAPE(B, T, D));
        if (rc == TS_OK)
            rc = ts_tensor_alloc(&c->dxf, TS_F32, dev, 3, TS_SHAPE(B, T, D));
    }
    c->cond_y = malloc((size_t)B * sizeof *c->cond_y);
    if (rc == TS_OK && !c->cond_y)
        rc = TS_ENOMEM;
    for (int64_t b = 0; rc == TS_OK && b < B; b++)
        c->cond_y[b] = cfg.num_classes; /* the null row */
    if (rc == TS_OK)
        rc = own_meta(c);
    if (rc != TS_OK) {
        ts_classifier_free(c);
        return rc;
    }
    *out = c;
    return TS_OK;
}

int ts_classifier_init_weights(ts_classifier_t *c, uint64_t seed) {
    if (!c)
        return TS_EINVAL;
    TS_TRY(ts_dit_init_weights(&c->trunk, seed));
    TS_TRY(ts_zero(c->eng, &c->head_mem));
    double a = sqrt(6.0 / (double)(c->D + c->K));
    TS_TRY(ts_rng_uniform(c->eng, &c->head_w, seed, (uint64_t)c->trunk.num_params));
    return ts_affine(c->eng, &c->head_w, (float)(2.0 * a), (float)-a);
}

int ts_classifier_feature_dim(const ts_classifier_t *c) { return c ? c->D : 0; }
int ts_classifier_num_outputs(const ts_classifier_t *c) { return c ? c->K : 0; }
int ts_classifier_time_conditioned(const ts_classifier_t *c) { return c ? c->time_conditioned : 0; }

const char *ts_classifier_meta(const ts_classifier_t *c, const char *key) {
    if (!c || !key)
        return NULL;
    for (int i = 0; i < c->n_meta; i++)
        if (strcmp(c->meta_keys[i], key) == 0)
            return c->meta_vals[i];
    return NULL;
}

int ts_classifier_set_meta(ts_classifier_t *c, const char *key, const char *value) {
    if (!c || !key || !value || !*key)
        return TS_EINVAL;
    if (strcmp(key, "format") == 0 || strcmp(key, "num_outputs") == 0 ||
        strcmp(key, "time_conditioned") == 0 || strcmp(key, "num_labels") == 0)
        return TS_EINVAL;
    for (int i = 0; i < 9; i++)
        if (strcmp(key, CONFIG_KEYS[i]) == 0)
            return TS_EINVAL;
    return meta_put(c, key, value);
}

int ts_classifier_head(ts_classifier_t *c, ts_tensor_t *w, ts_tensor_t *b, ts_tensor_t *dw,
                       ts_tensor_t *db) {
    if (!c)
        return TS_EINVAL;
    if (w)
        *w = c->head_w;
    if (b)
        *b = c->head_b;
    if (dw)
        *dw = c->dhead_w;
    if (db)
        *db = c->dhead_b;
    return TS_OK;
}

/* ---- forward and backward -------------------------------------------------------------- */

static ts_tensor_t rows(const ts_tensor_t *t, int64_t n) {
    ts_tensor_t v;
    if (ts_tensor_slice(&v, t, 0, n) != TS_OK)
        memset(&v, 0, sizeof v); /* an empty tensor: the next op reports TS_EINVAL */
    return v;
}

/* trunk → LayerNorm → mean over tokens (features) → linear (logits), for B samples. */
static int forward(ts_classifier_t *c, const ts_tensor_t *x, const ts_tensor_t *t, int B) {
    ts_engine_t *e = c->eng;
    if (B < 1 || B > c->max_batch || !x)
        return TS_EINVAL;
    ts_tensor_t tz = rows(&c->tzero, B);
    const ts_tensor_t *tt = c->time_conditioned ? t : &tz;
    if (!tt)
        return TS_EINVAL;
    ts_tensor_t xf, lnf = rows(&c->lnf, B), feat = rows(&c->feat, B);
    ts_tensor_t mean = rows(&c->lnf_mean, (int64_t)B * c->T);
    ts_tensor_t rstd = rows(&c->lnf_rstd, (int64_t)B * c->T), logits = rows(&c->logits, B);
    TS_TRY(ts_dit_forward_trunk(&c->trunk, x, tt, c->cond_y, B, &xf));
    TS_TRY(ts_layernorm_forward(e, &lnf, &mean, &rstd, &xf));
    TS_TRY(ts_mean_tokens_forward(e, &feat, &lnf));
    return ts_linear_forward(e, &logits, &feat, &c->head_w, &c->head_b);
}

/* Gradients of the last forward's loss, accumulated: CE(logits, c->labels) when dlogits_host is
 * NULL, else the given d loss / d logits (B, K, host). */
static int backward(ts_classifier_t *c, int B, const float *dlogits_host) {
    ts_engine_t *e = c->eng;
    ts_tensor_t dlogits = rows(&c->dlogits, B), dfeat = rows(&c->dfeat, B);
    ts_tensor_t dlnf = rows(&c->dlnf, B), dxf = rows(&c->dxf, B);
    ts_tensor_t logits = rows(&c->logits, B), feat = rows(&c->feat, B);
    ts_tensor_t xf = rows(&c->trunk.acts.x_final, B), ids = rows(&c->labels, B);
    ts_tensor_t mean = rows(&c->lnf_mean, (int64_t)B * c->T);
    ts_tensor_t rstd = rows(&c->lnf_rstd, (int64_t)B * c->T);
    ts_tensor_t *scratch[] = {&dlogits, &dfeat, &dlnf, &dxf};
    for (int i = 0; i < 4; i++)
        TS_TRY(ts_zero(e, scratch[i]));
    if (dlogits_host) {
        ts_tensor_t host;
        TS_TRY(ts_tensor_wrap(&host, (void *)dlogits_host, TS_F32, TS_CPU, 2, dlogits.shape));
        TS_TRY(ts_tensor_copy(&dlogits, &host));
    } else {
        TS_TRY(ts_cross_entropy_backward(e, &dlogits, 1.0f, &logits, &ids));
    }
    TS_TRY(ts_linear_backward(e, &dfeat, &c->dhead_w, &c->dhead_b, &dlogits, &feat, &c->head_w));
    TS_TRY(ts_mean_tokens_backward(e, &dlnf, &dfeat));
    TS_TRY(ts_layernorm_backward(e, &dxf, &dlnf, &xf, &mean, &rstd));
    return ts_dit_backward_trunk(&c->trunk, &dxf, B);
}

/* Copies the first n floats of a device tensor to host memory. */
static int to_host(const ts_tensor_t *t, int64_t n, float *dst) {
    ts_tensor_t h, src;
    TS_TRY(ts_tensor_wrap(&h, dst, TS_F32, TS_CPU, 1, TS_SHAPE(n)));
    TS_TRY(ts_tensor_wrap(&src, t->data, TS_F32, t->device, 1, TS_SHAPE(n)));
    return ts_tensor_copy(&h, &src);
}

int ts_classifier_num_labels(const ts_classifier_t *c) { return c ? c->num_labels : 0; }

int ts_classifier_condition(ts_classifier_t *c, const int32_t *labels, int B) {
    if (!c || B < 1 || B > c->max_batch)
        return TS_EINVAL;
    int null = c->trunk.cfg.num_classes;
    for (int b = 0; labels && c->num_labels && b < B; b++)
        if (labels[b] < 0 || labels[b] > c->num_labels)
            return TS_ERANGE;
    for (int b = 0; b < B; b++)
        c->cond_y[b] = labels && c->num_labels ? labels[b] : null;
    return TS_OK;
}

int ts_classifier_run(ts_classifier_t *c, const ts_tensor_t *x, const ts_tensor_t *t, int B,
                      float *features, float *logits) {
    return ts_classifier_run_labels(c, x, t, NULL, B, features, logits);
}

int ts_classifier_run_labels(ts_classifier_t *c, const ts_tensor_t *x, const ts_tensor_t *t,
                             const int32_t *labels, int B, float *features, float *logits) {
    if (!c)
        return TS_EINVAL;
    TS_TRY(ts_classifier_condition(c, labels, B));
    TS_TRY(forward(c, x, t, B));
    if (features)
        TS_TRY(to_host(&c->feat, (int64_t)B * c->D, features));
    if (logits)
        TS_TRY(to_host(&c->logits, (int64_t)B * c->K, logits));
    return TS_OK;
}

int ts_classifier_loss_backward(ts_classifier_t *c, const ts_tensor_t *x, const ts_tensor_t *t,
                                const int32_t *labels, int B, float *loss) {
    if (!c || !c->trainable || !labels || B < 1 || B > c->max_batch)
        return TS_EINVAL;
    for (int b = 0; b < B; b++)
        if (labels[b] < 0 || labels[b] >= c->K)
            return TS_ERANGE;
    ts_tensor_t host, ids = rows(&c->labels, B);
    TS_TRY(ts_tensor_wrap(&host, (void *)labels, TS_I32, TS_CPU, 1, TS_SHAPE(B)));
    TS_TRY(ts_tensor_copy(&ids, &host));
    TS_TRY(forward(c, x, t, B));
    ts_tensor_t logits = rows(&c->logits, B);
    TS_TRY(ts_cross_entropy_forward(c->eng, &c->loss, &logits, &ids));
    float l;
    TS_TRY(ts_tensor_item(c->eng, &c->loss, &l));
    if (loss)
        *loss = l;
    if (!isfinite(l))
        return TS_ENONFINITE;
    TS_TRY(ts_dit_zero_grad(&c->trunk));
    TS_TRY(ts_zero(c->eng, &c->head_grad));
    return backward(c, B, NULL);
}

double ts_router_objective_loss(ts_router_objective_t obj, const float *logits, const double *G,
                                int B, int K, float tau, float *dlogits) {
    double total = 0.0;
    double p[TS_ROUTER_MAX_EXPERTS], q[TS_ROUTER_MAX_EXPERTS], g[TS_ROUTER_MAX_EXPERTS];
    for (int b = 0; b < B; b++) {
        const float *z = logits + (int64_t)b * K;
        const double *Gb = G + (int64_t)b * K * K;
        double mx = -INFINITY, s = 0.0;
        for (int k = 0; k < K; k++)
            mx = z[k] > mx ? z[k] : mx;
        for (int k = 0; k < K; k++)
            s += (p[k] = exp((double)z[k] - mx));
        for (int k = 0; k < K; k++)
            p[k] /= s;
        if (obj == TS_ROUTER_ALIGNMENT) {
            double qm = -INFINITY, qs = 0.0;
            for (int k = 0; k < K; k++)
                qm = -Gb[k * K + k] / tau > qm ? -Gb[k * K + k] / tau : qm;
            for (int k = 0; k < K; k++)
                qs += (q[k] = exp(-Gb[k * K + k] / tau - qm));
            for (int k = 0; k < K; k++) {
                q[k] /= qs;
                total -= q[k] * (((double)z[k] - mx) - log(s));
                dlogits[(int64_t)b * K + k] = (float)((p[k] - q[k]) / B);
            }
        } else { /* mixture: L = pᵀ G p, dL/dp = 2 G p, dL/dz_k = p_k (g_k − Σ_j p_j g_j) */
            double pg = 0.0;
            for (int j = 0; j < K; j++) {
                g[j] = 0.0;
                for (int k = 0; k < K; k++)
                    g[j] += 2.0 * Gb[j * K + k] * p[k];
                pg += p[j] * g[j];
                total += 0.5 * p[j] * g[j];
            }
            for (int k = 0; k < K; k++)
                dlogits[(int64_t)b * K + k] = (float)(p[k] * (g[k] - pg) / B);
        }
    }
    return total / B;
}

/* ---- files ------------------------------------------------------------------------------ */

static int is_final_layer(const char *name) { return strncmp(name, "final_layer.", 12) == 0; }

int ts_classifier_save(const ts_classifier_t *c, const char *path, char *err, size_t errlen) {
    if (!c || !path) {
        ts_set_err(err, errlen, "ts_classifier_save: invalid arguments");
        return TS_EINVAL;
    }
    const ts_dit_t *m = &c->trunk;
    int64_t nt = m->num_params, nh = ts_tensor_numel(&c->head_mem);
    float *host = malloc((size_t)(nt + nh) * sizeof *host);
    ts_st_entry_t *entries = calloc((size_t)m->n_params + 2, sizeof *entries);
    const char **meta = calloc(2 * (size_t)c->n_meta, sizeof *meta);
    int rc = (!host || !entries || !meta) ? TS_ENOMEM : TS_OK;
    ts_tensor_t h;
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&h, host, TS_F32, TS_CPU, 1, TS_SHAPE(nt));
    if (rc == TS_OK)
        rc = ts_tensor_copy(&h, &m->param_mem);
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&h, host + nt, TS_F32, TS_CPU, 1, TS_SHAPE(nh));
    if (rc == TS_OK)
        rc = ts_tensor_copy(&h, &c->head_mem);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "'%s': cannot copy the weights to the host: %s", path,
                   ts_strerror(rc));
    } else {
        int n = 0;
        for (int i = 0; i < m->n_params; i++) {
            const ts_dit_param_info_t *pi = &m->info[i];
            if (is_final_layer(pi->name))
                continue;
            ts_st_entry_t *en = &entries[n++];
            en->name = pi->name;
            en->dtype = TS_ST_F32;
            en->ndim = pi->ndim;
            for (int d = 0; d < pi->ndim; d++)
                en->shape[d] = pi->shape[d];
            en->data = host + pi->offset;
        }
        entries[n++] = (ts_st_entry_t){.name = "head.weight",
                                       .dtype = TS_ST_F32,
                                       .ndim = 2,
                                       .shape = {c->K, c->D},
                                       .data = host + nt};
        entries[n++] = (ts_st_entry_t){.name = "head.bias",
                                       .dtype = TS_ST_F32,
                                       .ndim = 1,
                                       .shape = {c->K},
                                       .data = host + nt + (int64_t)c->K * c->D};
        for (int i = 0; i < c->n_meta; i++) {
            meta[2 * i] = c->meta_keys[i];
            meta[2 * i + 1] = c->meta_vals[i];
        }
        rc = ts_st_write(path, entries, n, meta, c->n_meta, err, errlen);
    }
    free(meta);
    free(entries);
    free(host);
    return rc;
}

/* A decimal integer in [lo, hi] from metadata key, or TS_ECORRUPT naming it. */
static int meta_int(const ts_st_file_t *f, const char *key, int lo, int hi, int *out, char *err,
                    size_t errlen) {
    const char *v = ts_st_meta(f, key);
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || x < lo || x > hi) {
        ts_set_err(err, errlen, "metadata '%s' is %s%s%s, expected an integer in [%d, %d]", key,
                   v ? "'" : "", v ? v : "missing", v ? "'" : "", lo, hi);
        return TS_ECORRUPT;
    }
    *out = (int)x;
    return TS_OK;
}

/* Copies tensor name of f, which must be F32/F16/BF16 of exactly shape and finite, into
 * dst (a device view of numel elements); host is scratch of numel floats. */
static int load_tensor(const ts_st_file_t *f, const char *name, int ndim, const int64_t *shape,
                       ts_tensor_t *dst, float *host, char *err, size_t errlen) {
    const ts_st_tensor_t *t = ts_st_find(f, name);
    if (!t) {
        ts_set_err(err, errlen, "missing tensor '%s'", name);
        return TS_ECORRUPT;
    }
    int ok = (t->dtype == TS_ST_F32 || t->dtype == TS_ST_F16 || t->dtype == TS_ST_BF16) &&
             t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = t->shape[d] == shape[d];
    if (!ok) {
        ts_set_err(err, errlen, "tensor '%s': dtype %s or shape differs from the model's", name,
                   ts_st_dtype_name(t->dtype));
        return TS_ECORRUPT;
    }
    int64_t n = ts_tensor_numel(dst);
    TS_TRY(ts_st_to_f32(t, host, n));
    for (int64_t i = 0; i < n; i++)
        if (!ts_isfinite_f32(host[i])) {
            ts_set_err(err, errlen, "tensor '%s' holds a non-finite value at element %lld", name,
                       (long long)i);
            return TS_ECORRUPT;
        }
    ts_tensor_t h;
    TS_TRY(ts_tensor_wrap(&h, host, TS_F32, TS_CPU, 1, TS_SHAPE(n)));
    return ts_tensor_copy(dst, &h);
}

static int load_weights(ts_classifier_t *c, const ts_st_file_t *f, char *err, size_t errlen) {
    const ts_dit_t *m = &c->trunk;
    int expected = 2;
    for (int i = 0; i < m->n_params; i++)
        expected += !is_final_layer(m->info[i].name);
    if (f->n_tensors != expected) {
        ts_set_err(err, errlen, "%d tensors in the file, a classifier of this config has %d",
                   f->n_tensors, expected);
        return TS_ECORRUPT;
    }
    int64_t nmax = ts_tensor_numel(&c->head_mem);
    for (int i = 0; i < m->n_params; i++)
        nmax = m->info[i].numel > nmax ? m->info[i].numel : nmax;
    float *host = malloc((size_t)nmax * sizeof *host);
    if (!host)
        return TS_ENOMEM;
    int rc = TS_OK;
    for (int i = 0; i < m->n_params && rc == TS_OK; i++) {
        const ts_dit_param_info_t *pi = &m->info[i];
        if (is_final_layer(pi->name))
            continue;
        ts_tensor_t dst;
        rc = ts_tensor_wrap(&dst, (float *)m->param_mem.data + pi->offset, TS_F32,
                            m->param_mem.device, 1, TS_SHAPE(pi->numel));
        if (rc == TS_OK)
            rc = load_tensor(f, pi->name, pi->ndim, pi->shape, &dst, host, err, errlen);
    }
    if (rc == TS_OK)
        rc = load_tensor(f, "head.weight", 2, TS_SHAPE(c->K, c->D), &c->head_w, host, err, errlen);
    if (rc == TS_OK)
        rc = load_tensor(f, "head.bias", 1, TS_SHAPE(c->K), &c->head_b, host, err, errlen);
    free(host);
    return rc;
}

int ts_classifier_open(ts_classifier_t **out, const char *path, ts_engine_t *e, int max_batch,
                       char *err, size_t errlen) {
    if (!out || !path || !e || max_batch < 1) {
        ts_set_err(err, errlen, "ts_classifier_open: invalid arguments");
        return TS_EINVAL;
    }
    *out = NULL;
    ts_st_file_t f;
    TS_TRY(ts_st_read(path, &f, err, errlen)); /* its messages name the file */
    char why[384] = "";
    const char *format = ts_st_meta(&f, "format");
    int rc = TS_OK;
    if (!format || strcmp(format, CLS_FORMAT) != 0) {
        ts_set_err(why, sizeof why, "metadata 'format' is %s, expected '%s' (not a classifier)",
                   format ? format : "missing", CLS_FORMAT);
        rc = TS_ECORRUPT;
    }
    ts_dit_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    for (int i = 0; i < 9 && rc == TS_OK; i++)
        rc = meta_int(&f, CONFIG_KEYS[i], 1, 1000000000, config_field(&cfg, i), why, sizeof why);
    int K = 0, tc = 0;
    if (rc == TS_OK)
        rc = meta_int(&f, "num_outputs", 1, CLS_MAX_OUTPUTS, &K, why, sizeof why);
    if (rc == TS_OK)
        rc = meta_int(&f, "time_conditioned", 0, 1, &tc, why, sizeof why);
    int L = 0;
    if (rc == TS_OK && ts_st_meta(&f, "num_labels"))
        rc = meta_int(&f, "num_labels", 1, TS_CLASSIFIER_MAX_LABELS, &L, why, sizeof why);
    if (rc == TS_OK && (cfg.num_classes != (L ? L : 1) || ts_dit_config_check(&cfg) != TS_OK)) {
        ts_set_err(why, sizeof why, "the trunk config in the metadata is not valid");
        rc = TS_ECORRUPT;
    }
    ts_classifier_t *c = NULL;
    if (rc == TS_OK &&
        (rc = ts_classifier_create_labelled(&c, &cfg, K, L, tc, e, max_batch, 0)) != TS_OK)
        ts_set_err(why, sizeof why, "cannot build the model: %s", ts_strerror(rc));
    if (rc == TS_OK)
        rc = load_weights(c, &f, why, sizeof why);
    for (int i = 0; rc == TS_OK && i < f.n_meta; i++)
        rc = meta_put(c, f.meta_keys[i], f.meta_vals[i]);
    ts_st_free(&f);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "'%s': %s", path, why[0] ? why : ts_strerror(rc));
        ts_classifier_free(c);
        return rc;
    }
    *out = c;
    return TS_OK;
}

/* ---- training ------------------------------------------------------------------------- */

enum {
    STREAM_PERM = 11,
    STREAM_TIME = 12,
    STREAM_NOISE = 13,
    STREAM_AUGMENT = 14,
    STREAM_LABEL_DROP = 15
};

struct ts_classifier_trainer {
    ts_classifier_t *c;
    const ts_dataset_t *data;
    const int32_t *targets;
    ts_classifier_train_config_t cfg;
    int64_t step;
    ts_tensor_t m_trunk, v_trunk, m_head, v_head;
    ts_tensor_t x0, eps, xt, vel, t, sumsq;
    float *x0_host, *t_host, *logits_host, *aug_tmp, *dlogits_host;
    int32_t *y_host, *perm, *cls_host;
    int32_t *cond_host; /* (B) a label-aware model's conditioning labels, after dropout */
    double *G;          /* (B, K, K): the experts' residual Gram matrices (expert objectives) */
    int64_t perm_epoch;
};

void ts_classifier_train_config_default(ts_classifier_train_config_t *c) {
    memset(c, 0, sizeof *c);
    c->batch = 64;
    c->lr = 1e-3f;
    c->warmup = 200;
    c->weight_decay = 0.05f;
    c->beta1 = TS_OPTIM_BETA1;
    c->beta2 = TS_OPTIM_BETA2;
    c->eps = TS_OPTIM_EPS;
    c->grad_clip = TS_OPTIM_GRAD_CLIP;
    c->shift = 2;
}

float ts_classifier_lr(const ts_classifier_train_config_t *c, int64_t s) {
    return ts_optim_lr(c->lr, c->warmup, c->total_steps, s);
}

void ts_classifier_trainer_free(ts_classifier_trainer_t *tr) {
    if (!tr)
        return;
    ts_tensor_t *all[] = {&tr->m_trunk, &tr->v_trunk, &tr->m_head, &tr->v_head, &tr->x0,
                          &tr->eps,     &tr->xt,      &tr->vel,    &tr->t,      &tr->sumsq};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ts_tensor_free(all[i]);
    free(tr->x0_host);
    free(tr->t_host);
    free(tr->logits_host);
    free(tr->y_host);
    free(tr->perm);
    free(tr->aug_tmp);
    free(tr->dlogits_host);
    free(tr->cls_host);
    free(tr->cond_host);
    free(tr->G);
    free(tr);
}

int ts_classifier_trainer_init(ts_classifier_trainer_t **out, ts_classifier_t *c,
                               const ts_dataset_t *data, const int32_t *targets,
                               const ts_classifier_train_config_t *cfg) {
    if (!out)
        return TS_EINVAL;
    *out = NULL;
    if (!c || !data || !targets || !cfg || !c->trainable || cfg->batch < 1 ||
        cfg->batch > c->max_batch || !(cfg->lr > 0.0f) || !isfinite(cfg->lr) || cfg->warmup < 0 ||
        !(cfg->weight_decay >= 0.0f) || !(cfg->grad_clip >= 0.0f) || data->n < 1 ||
        cfg->shift < 0 || cfg->shift > 8 || cfg->objective < TS_ROUTER_CLUSTER ||
        !(cfg->label_dropout >= 0.0f && cfg->label_dropout <= 1.0f) ||
        (c->num_labels && !data->labels) || cfg->objective > TS_ROUTER_MIXTURE ||
        (cfg->objective != TS_ROUTER_CLUSTER &&
         (!c->time_conditioned || !cfg->residuals || !data->labels ||
          c->K > TS_ROUTER_MAX_EXPERTS ||
          (cfg->objective == TS_ROUTER_ALIGNMENT && !(cfg->align_tau > 0.0f)))))
        return TS_EINVAL;
    const ts_dit_config_t *mc = &c->trunk.cfg;
    if (data->channels != mc->in_channels || data->height != mc->input_size ||
        data->width != mc->input_size)
        return TS_ESHAPE;
    for (int i = 0; i < data->n; i++)
        if (targets[i] < 0 || targets[i] >= c->K)
            return TS_ERANGE;
    ts_classifier_trainer_t *tr = calloc(1, sizeof *tr);
    if (!tr)
        return TS_ENOMEM;
    tr->c = c;
    tr->data = data;
    tr->targets = targets;
    tr->cfg = *cfg;
    tr->perm_epoch = -1;
    ts_device_t dev = c->eng->device;
    int64_t B = cfg->batch, S = mc->input_size;
    const int64_t *img = TS_SHAPE(B, mc->in_channels, S, S);
    int rc = TS_OK;
    ts_tensor_t *trunk_slabs[] = {&tr->m_trunk, &tr->v_trunk};
    ts_tensor_t *head_slabs[] = {&tr->m_head, &tr->v_head};
    for (int i = 0; i < 2 && rc == TS_OK; i++) {
        rc = ts_tensor_alloc(trunk_slabs[i], TS_F32, dev, 1, TS_SHAPE(c->trunk.num_params));
        if (rc == TS_OK)
            rc = ts_zero(c->eng, trunk_slabs[i]);
        if (rc == TS_OK)
            rc = ts_tensor_alloc(head_slabs[i], TS_F32, dev, 1, c->head_mem.shape);
        if (rc == TS_OK)
            rc = ts_zero(c->eng, head_slabs[i]);
    }
    ts_tensor_t *imgs[] = {&tr->x0, &tr->eps, &tr->xt, &tr->vel};
    for (int i = 0; i < 4 && rc == TS_OK; i++)
        rc = ts_tensor_alloc(imgs[i], TS_F32, dev, 4, img);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&tr->t, TS_F32, dev, 1, TS_SHAPE(B));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&tr->sumsq, TS_F32, dev, 1, TS_SHAPE(1));
    tr->x0_host = malloc((size_t)ts_tensor_numel(&tr->x0) * sizeof(float));
    tr->t_host = malloc((size_t)B * sizeof(float));
    tr->logits_host = malloc((size_t)(B * c->K) * sizeof(float));
    tr->y_host = malloc((size_t)B * sizeof(int32_t));
    tr->perm = malloc((size_t)data->n * sizeof(int32_t));
    tr->aug_tmp = malloc((size_t)(S * S) * sizeof(float));
    if (rc == TS_OK && (!tr->x0_host || !tr->t_host || !tr->logits_host || !tr->y_host ||
                        !tr->perm || !tr->aug_tmp))
        rc = TS_ENOMEM;
    if (rc == TS_OK && c->num_labels && !(tr->cond_host = malloc((size_t)B * sizeof(int32_t))))
        rc = TS_ENOMEM;
    for (int i = 0; rc == TS_OK && c->num_labels && i < data->n; i++)
        if (data->labels[i] < 0 || data->labels[i] >= c->num_labels)
            rc = TS_ERANGE;
    if (rc == TS_OK && cfg->objective != TS_ROUTER_CLUSTER) {
        tr->dlogits_host = malloc((size_t)(B * c->K) * sizeof(float));
        tr->cls_host = malloc((size_t)B * sizeof(int32_t));
        tr->G = malloc((size_t)(B * c->K * c->K) * sizeof(double));
        if (!tr->dlogits_host || !tr->cls_host || !tr->G)
            rc = TS_ENOMEM;
    }
    if (rc != TS_OK) {
        ts_classifier_trainer_free(tr);
        return rc;
    }
    *out = tr;
    return TS_OK;
}

int64_t ts_classifier_trainer_steps_done(const ts_classifier_trainer_t *tr) {
    return tr ? tr->step : 0;
}

/* Makes tr->perm the order of epoch ep (model/trainer.h). */
static void ensure_perm(ts_classifier_trainer_t *tr, int64_t ep) {
    if (tr->perm_epoch == ep)
        return;
    ts_epoch_permutation(ts_stream_key(tr->cfg.seed, STREAM_PERM), ep, tr->data->n, tr->perm);
    tr->perm_epoch = ep;
}

/* Augments one image in place (C planes of S×S): flip horizontally when flip, then shift by
 * (dx, dy) pixels, filling what comes in from outside with −1 (the background: Fashion-MNIST's 0
 * mapped to [−1, 1]). tmp holds one plane. */
static void augment_image(float *img, float *tmp, int C, int S, int flip, int dx, int dy) {
    for (int ch = 0; ch < C; ch++) {
        float *p = img + (int64_t)ch * S * S;
        memcpy(tmp, p, (size_t)S * S * sizeof(float));
        for (int y = 0; y < S; y++) {
            int sy = y - dy;
            for (int x = 0; x < S; x++) {
                int sx = x - dx;
                sx = flip ? S - 1 - sx : sx;
                int inside = sy >= 0 && sy < S && sx >= 0 && sx < S;
                p[y * S + x] = inside ? tmp[sy * S + sx] : -1.0f;
            }
        }
    }
}

/* Stages step s's images (and, for a router, its noisy x_t) on the device; returns the input. */
static int stage_batch(ts_classifier_trainer_t *tr, int64_t s, const ts_tensor_t **input) {
    const ts_dataset_t *d = tr->data;
    ts_engine_t *e = tr->c->eng;
    int B = tr->cfg.batch;
    int64_t chw = (int64_t)d->channels * d->height * d->width;
    uint64_t tkey = ts_stream_key(tr->cfg.seed, STREAM_TIME);
    uint64_t akey = ts_stream_key(tr->cfg.seed, STREAM_AUGMENT);
    int augment = tr->cfg.augment && !tr->c->time_conditioned, span = 2 * tr->cfg.shift + 1;
    for (int i = 0; i < B; i++) {
        int64_t g = s * B + i;
        ensure_perm(tr, g / d->n);
        int32_t idx = tr->perm[g % d->n];
        memcpy(tr->x0_host + i * chw, d->images + (int64_t)idx * chw, (size_t)chw * sizeof(float));
        if (augment) {
            uint64_t a = 3 * (uint64_t)g;
            int flip = ts_rng_uniform_at(akey, a) < 0.5f;
            int dx = (int)(ts_rng_uniform_at(akey, a + 1) * (float)span) - tr->cfg.shift;
            int dy = (int)(ts_rng_uniform_at(akey, a + 2) * (float)span) - tr->cfg.shift;
            dx = dx > tr->cfg.shift ? tr->cfg.shift : dx; /* u may round up to 1 */
            dy = dy > tr->cfg.shift ? tr->cfg.shift : dy;
            augment_image(tr->x0_host + i * chw, tr->aug_tmp, d->channels, d->height, flip, dx, dy);
        }
        tr->y_host[i] = tr->targets[idx];
        if (tr->cls_host)
            tr->cls_host[i] = d->labels[idx];
        if (tr->cond_host) { /* label dropout: the null label with probability p */
            float u =
                ts_rng_uniform_at(ts_stream_key(tr->cfg.seed, STREAM_LABEL_DROP), (uint64_t)g);
            tr->cond_host[i] = u < tr->cfg.label_dropout ? tr->c->num_labels : d->labels[idx];
        }
        tr->t_host[i] = ts_rng_uniform_at(tkey, (uint64_t)g);
    }
    ts_tensor_t host;
    TS_TRY(ts_tensor_wrap(&host, tr->x0_host, TS_F32, TS_CPU, 4, tr->x0.shape));
    TS_TRY(ts_tensor_copy(&tr->x0, &host));
    *input = &tr->x0;
    if (!tr->c->time_conditioned)
        return TS_OK;
    TS_TRY(ts_tensor_wrap(&host, tr->t_host, TS_F32, TS_CPU, 1, TS_SHAPE(B)));
    TS_TRY(ts_tensor_copy(&tr->t, &host));
    uint64_t off = (uint64_t)s * (uint64_t)ts_tensor_numel(&tr->eps);
    TS_TRY(ts_rng_normal(e, &tr->eps, ts_stream_key(tr->cfg.seed, STREAM_NOISE), off));
    TS_TRY(ts_flow_interp(e, &tr->xt, &tr->vel, &tr->x0, &tr->eps, &tr->t));
    *input = &tr->xt;
    return TS_OK;
}

int ts_classifier_trainer_step(ts_classifier_trainer_t *tr, float *loss_out, float *acc_out,
                               float *norm_out) {
    if (!tr)
        return TS_EINVAL;
    ts_classifier_t *c = tr->c;
    ts_engine_t *e = c->eng;
    int B = tr->cfg.batch;
    int64_t s = tr->step;
    const ts_tensor_t *input;
    TS_TRY(stage_batch(tr, s, &input));
    TS_TRY(ts_classifier_condition(c, tr->cond_host, B));
    float loss;
    int rc;
    if (tr->cfg.objective == TS_ROUTER_CLUSTER) {
        rc = ts_classifier_loss_backward(c, input, &tr->t, tr->y_host, B, &loss);
    } else {
        /* the experts' residuals, then the objective on the host, then backward from there */
        TS_TRY(tr->cfg.residuals(tr->cfg.residuals_ctx, input, &tr->t, &tr->vel, tr->cls_host, B,
                                 tr->G));
        TS_TRY(forward(c, input, &tr->t, B));
        TS_TRY(to_host(&c->logits, (int64_t)B * c->K, tr->logits_host));
        loss = (float)ts_router_objective_loss(tr->cfg.objective, tr->logits_host, tr->G, B, c->K,
                                               tr->cfg.align_tau, tr->dlogits_host);
        /* the batch accuracy: the router's top expert is the one with the lowest loss */
        for (int b = 0; b < B; b++) {
            int best = 0;
            for (int k = 1; k < c->K; k++)
                best = tr->G[((int64_t)b * c->K + k) * c->K + k] <
                               tr->G[((int64_t)b * c->K + best) * c->K + best]
                           ? k
                           : best;
            tr->y_host[b] = best;
        }
        rc = isfinite(loss) ? TS_OK : TS_ENONFINITE;
        if (rc == TS_OK)
            rc = ts_dit_zero_grad(&c->trunk);
        if (rc == TS_OK)
            rc = ts_zero(c->eng, &c->head_grad);
        if (rc == TS_OK)
            rc = backward(c, B, tr->dlogits_host);
    }
    if (loss_out)
        *loss_out = loss;
    if (rc != TS_OK)
        return rc;
    if (acc_out) {
        TS_TRY(to_host(&c->logits, (int64_t)B * c->K, tr->logits_host));
        int right = 0;
        for (int b = 0; b < B; b++) {
            const float *z = tr->logits_host + (int64_t)b * c->K;
            int best = 0;
            for (int k = 1; k < c->K; k++)
                best = z[k] > z[best] ? k : best;
            right += best == tr->y_host[b];
        }
        *acc_out = (float)right / (float)B;
    }
    /* one global norm over both slabs, then AdamW on each (model/optim.h) */
    ts_adamw_t hp = {ts_classifier_lr(&tr->cfg, s), tr->cfg.beta1, tr->cfg.beta2, tr->cfg.eps,
                     tr->cfg.weight_decay};
    ts_optim_slab_t slabs[2] = {
        {&c->trunk.param_mem, &c->trunk.grad_mem, &tr->m_trunk, &tr->v_trunk},
        {&c->head_mem, &c->head_grad, &tr->m_head, &tr->v_head}};
    TS_TRY(ts_optim_step(e, slabs, 2, &hp, s + 1, tr->cfg.grad_clip, &tr->sumsq, norm_out));
    tr->step = s + 1;
    return TS_OK;
}
