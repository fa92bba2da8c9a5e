/*
 * heldout.c — the held-out flow-matching loss (model/heldout.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "model/heldout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "model/trainer.h"

int ts_heldout_parse_grid(const char *s, float *t, int *T) {
    if (!s || !t || !T)
        return TS_EINVAL;
    *T = 0;
    for (const char *p = s;; p++) { /* every field a number: no empty one */
        char *end = NULL;
        double v = strtod(p, &end);
        if (end == p || (*end != ',' && *end != '\0') || !(v >= 0.0 && v <= 1.0) ||
            *T == TS_HELDOUT_MAX_T)
            return TS_EINVAL;
        t[(*T)++] = (float)v;
        if (*end == '\0')
            return TS_OK;
        p = end;
    }
}

int ts_heldout_init(ts_heldout_t *h, ts_engine_t *e, const ts_dataset_t *data, const float *t,
                    int T, uint64_t seed, char *err, size_t errlen) {
    memset(h, 0, sizeof *h);
    if (!e || !data || !t || T < 1 || T > TS_HELDOUT_MAX_T || data->n < 1) {
        ts_set_err(err, errlen, "held-out loss: no images or no times");
        return TS_EINVAL;
    }
    for (int j = 0; j < T; j++)
        if (!(t[j] >= 0.0f && t[j] <= 1.0f)) {
            ts_set_err(err, errlen, "held-out loss: time %g is outside [0, 1]", (double)t[j]);
            return TS_EINVAL;
        }
    h->eng = e;
    h->data = data;
    memcpy(h->t, t, (size_t)T * sizeof *t);
    h->T = T;
    h->key = ts_stream_key(seed, 0);
    h->chw = (int64_t)data->channels * data->height * data->width;
    const int64_t *shape = TS_SHAPE(TS_HELDOUT_CHUNK, data->channels, data->height, data->width);
    ts_tensor_t *bufs[] = {&h->x0, &h->eps, &h->xt, &h->target};
    int rc = TS_OK;
    for (int b = 0; b < 4 && rc == TS_OK; b++)
        rc = ts_tensor_alloc(bufs[b], TS_F32, e->device, 4, shape);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&h->tt, TS_F32, e->device, 1, TS_SHAPE(TS_HELDOUT_CHUNK));
    if (rc == TS_OK && !(h->th = malloc(TS_HELDOUT_CHUNK * sizeof *h->th)))
        rc = TS_ENOMEM;
    if (rc != TS_OK)
        ts_set_err(err, errlen, "held-out loss: no memory for its buffers");
    return rc;
}

void ts_heldout_free(ts_heldout_t *h) {
    if (!h)
        return;
    ts_tensor_t *bufs[] = {&h->x0, &h->eps, &h->xt, &h->target, &h->tt};
    for (int b = 0; b < 5; b++)
        ts_tensor_free(bufs[b]);
    free(h->th);
    memset(h, 0, sizeof *h);
}

/* Adds Σ (v − target)² over the m images idx[0..m) at time index j into *sum. */
static int chunk_loss(ts_heldout_t *h, ts_dit_t *model, const int32_t *idx, int m, int j,
                      double *sum) {
    ts_tensor_t x0, eps, xt, tg, tt, host, v;
    int32_t y[TS_HELDOUT_CHUNK];
    const ts_dataset_t *d = h->data;
    int rc = ts_tensor_slice(&x0, &h->x0, 0, m);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&eps, &h->eps, 0, m);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&xt, &h->xt, 0, m);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&tg, &h->target, 0, m);
    if (rc == TS_OK)
        rc = ts_tensor_slice(&tt, &h->tt, 0, m);
    float *x0h = NULL;
    if (rc == TS_OK && h->eng->device != TS_CPU &&
        !(x0h = malloc((size_t)m * (size_t)h->chw * sizeof *x0h)))
        rc = TS_ENOMEM;
    for (int i = 0; i < m && rc == TS_OK; i++) {
        ts_tensor_t row;
        y[i] = d->labels[idx[i]];
        h->th[i] = h->t[j];
        memcpy((x0h ? x0h : (float *)x0.data) + i * h->chw, d->images + (int64_t)idx[i] * h->chw,
               (size_t)h->chw * sizeof(float));
        rc = ts_tensor_slice(&row, &eps, i, 1);
        if (rc == TS_OK)
            rc =
                ts_rng_normal(h->eng, &row, h->key,
                              ((uint64_t)idx[i] * (uint64_t)h->T + (uint64_t)j) * (uint64_t)h->chw);
    }
    if (rc == TS_OK && x0h) {
        rc = ts_tensor_wrap(&host, x0h, TS_F32, TS_CPU, 4, x0.shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&x0, &host);
    }
    free(x0h);
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&host, h->th, TS_F32, TS_CPU, 1, tt.shape);
    if (rc == TS_OK)
        rc = ts_tensor_copy(&tt, &host);
    if (rc == TS_OK)
        rc = ts_flow_interp(h->eng, &xt, &tg, &x0, &eps, &tt);
    if (rc == TS_OK)
        rc = ts_dit_forward(model, &xt, &tt, y, m, &v);
    if (rc != TS_OK)
        return rc;
    size_t count = (size_t)m * (size_t)h->chw;
    float *vv = NULL, *gg = NULL;
    if (h->eng->device != TS_CPU) { /* the two results, brought to the host */
        vv = malloc(count * sizeof *vv);
        gg = malloc(count * sizeof *gg);
        ts_tensor_t hv, hg;
        rc = vv && gg ? TS_OK : TS_ENOMEM;
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&hv, vv, TS_F32, TS_CPU, v.ndim, v.shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&hv, &v);
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&hg, gg, TS_F32, TS_CPU, tg.ndim, tg.shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&hg, &tg);
    }
    const float *pv = vv ? vv : v.data, *pg = gg ? gg : tg.data;
    for (size_t k = 0; rc == TS_OK && k < count; k++) {
        double dd = (double)pv[k] - (double)pg[k];
        *sum += dd * dd;
    }
    free(vv);
    free(gg);
    return rc;
}

int ts_heldout_loss(ts_heldout_t *h, ts_dit_t *m, const int32_t *idx, int n, double *by_t,
                    double *mean) {
    if (!h || !h->eng || !m || !idx || n < 1 || !mean || m->max_batch < 1)
        return TS_EINVAL;
    const ts_dit_config_t *c = &m->cfg;
    if ((int64_t)c->in_channels * c->input_size * c->input_size != h->chw)
        return TS_EINVAL;
    for (int i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= h->data->n)
            return TS_EINVAL;
    int chunk = m->max_batch < TS_HELDOUT_CHUNK ? m->max_batch : TS_HELDOUT_CHUNK;
    double total = 0.0;
    for (int j = 0; j < h->T; j++) {
        double sum = 0.0;
        for (int lo = 0; lo < n; lo += chunk) {
            int rc = chunk_loss(h, m, idx + lo, n - lo < chunk ? n - lo : chunk, j, &sum);
            if (rc != TS_OK)
                return rc;
        }
        double l = sum / ((double)n * (double)h->chw);
        if (by_t)
            by_t[j] = l;
        total += l;
    }
    *mean = total / h->T;
    return isfinite(*mean) ? TS_OK : TS_ENONFINITE;
}

int ts_heldout_assign(const ts_partition_t *p, const ts_dataset_t *data, int32_t *cluster) {
    if (!p || !data || !cluster ||
        (int64_t)data->channels * data->height * data->width != (int64_t)p->D)
        return TS_EINVAL;
    float *emb = malloc((size_t)data->n * (size_t)p->k * sizeof *emb);
    if (!emb)
        return TS_ENOMEM;
    int rc = ts_partition_embed(p, data->images, data->n, emb);
    if (rc == TS_OK)
        rc = ts_partition_nearest(p, emb, data->n, cluster, NULL);
    free(emb);
    return rc;
}

void ts_heldout_pick(const int32_t *cluster, int64_t n_data, int k, int per, int32_t *idx, int *n) {
    *n = 0;
    for (int64_t i = 0; i < n_data && *n < per; i++)
        if (cluster[i] == k)
            idx[(*n)++] = (int32_t)i;
}

int ts_heldout_own_open(ts_heldout_own_t *o, const char *partition_path, int cluster,
                        const char *fmnist_dir, const ts_dit_config_t *cfg, ts_engine_t *e,
                        int max_batch, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    if (!partition_path || !cfg || !e || cluster < 0 || max_batch < 1) {
        ts_set_err(err, errlen, "held-out loss: bad arguments");
        return TS_EINVAL;
    }
    ts_partition_t p;
    int rc = ts_partition_load(partition_path, &p, err, errlen);
    if (rc != TS_OK)
        return rc;
    int32_t *cl = NULL;
    if (cluster >= p.K) {
        ts_set_err(err, errlen, "held-out loss: cluster %d of a %d-cluster partition", cluster,
                   p.K);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK)
        rc = ts_fmnist_load(fmnist_dir, "test", &o->test, err, errlen);
    if (rc == TS_OK && !(cl = malloc((size_t)o->test.n * sizeof *cl)))
        rc = TS_ENOMEM;
    if (rc == TS_OK && (rc = ts_heldout_assign(&p, &o->test, cl)) != TS_OK)
        ts_set_err(err, errlen, "held-out loss: the test images do not fit the partition");
    if (rc == TS_OK) {
        ts_heldout_pick(cl, o->test.n, cluster, TS_HELDOUT_PER, o->idx, &o->n);
        if (o->n == 0) {
            ts_set_err(err, errlen, "held-out loss: no test image falls in cluster %d", cluster);
            rc = TS_ENOTFOUND;
        }
    }
    free(cl);
    ts_partition_free(&p);
    float t[TS_HELDOUT_MAX_T];
    int T = 0;
    if (rc == TS_OK)
        rc = ts_heldout_parse_grid(TS_HELDOUT_GRID, t, &T);
    if (rc == TS_OK)
        rc = ts_heldout_init(&o->h, e, &o->test, t, T, 0, err, errlen);
    if (rc == TS_OK) {
        int b = max_batch < TS_HELDOUT_CHUNK ? max_batch : TS_HELDOUT_CHUNK;
        if ((rc = ts_dit_create(&o->eval, cfg, e, b, 0)) != TS_OK)
            ts_set_err(err, errlen, "held-out loss: cannot build a model for batch %d", b);
        o->has_eval = rc == TS_OK;
    }
    return rc;
}

int ts_heldout_own_measure(ts_heldout_own_t *o, const ts_tensor_t *slab, double *loss) {
    if (!o || !o->has_eval || !slab || !loss)
        return TS_EINVAL;
    int rc = ts_tensor_copy(&o->eval.param_mem, slab);
    return rc == TS_OK ? ts_heldout_loss(&o->h, &o->eval, o->idx, o->n, NULL, loss) : rc;
}

void ts_heldout_own_free(ts_heldout_own_t *o) {
    if (!o)
        return;
    ts_heldout_free(&o->h);
    if (o->has_eval)
        ts_dit_free(&o->eval);
    ts_dataset_free(&o->test);
    memset(o, 0, sizeof *o);
}
