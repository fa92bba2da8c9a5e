/*
 * experts.c — experts outside the ensemble's evaluation (model/ensemble.h): a set of experts
 * loaded from files (their cluster, partition id and objective read from the metadata), one
 * expert job run on one CPU model exactly as the ensemble runs a local expert (a server, a
 * client's fallback), and the experts' residuals against a velocity, for the router's expert
 * objectives.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/str.h"
#include "model/dit_io.h"
#include "model/ensemble.h"
#include "model/ensemble_internal.h"
#include "model/latents.h"
#include "model/safetensors.h"

/* ---- experts from files --------------------------------------------------------------------- */

void ts_experts_free(ts_experts_t *x) {
    if (!x)
        return;
    for (int k = 0; k < x->K; k++) {
        if (x->models)
            ts_dit_free(&x->models[k]);
        if (x->paths)
            free(x->paths[k]);
        if (x->partition_id)
            free(x->partition_id[k]);
    }
    free(x->models);
    free(x->cluster);
    free(x->paths);
    free(x->partition_id);
    free(x->objective);
    memset(x, 0, sizeof *x);
}

/* Reads "cluster" as a non-negative decimal: 1 and *out when present and valid, 0 when absent,
 * −1 when malformed. */
static int meta_cluster(const ts_st_file_t *f, int *out) {
    const char *s = ts_st_meta(f, "cluster");
    if (!s)
        return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 0 || v >= TS_ROUTE_MAX_EXPERTS)
        return -1;
    *out = (int)v;
    return 1;
}

int ts_experts_open(ts_experts_t *x, const char *const *paths, int n, ts_engine_t *e, int max_batch,
                    char *err, size_t errlen) {
    if (x)
        memset(x, 0, sizeof *x);
    if (!x || !paths || !e || n < 1 || n > TS_ROUTE_MAX_EXPERTS || max_batch < 1) {
        ts_set_err(err, errlen, "ts_experts_open: invalid arguments (need 1..%d expert files)",
                   TS_ROUTE_MAX_EXPERTS);
        return TS_EINVAL;
    }
    x->models = calloc((size_t)n, sizeof *x->models);
    x->cluster = calloc((size_t)n, sizeof *x->cluster);
    x->paths = calloc((size_t)n, sizeof *x->paths);
    x->partition_id = calloc((size_t)n, sizeof *x->partition_id);
    x->objective = calloc((size_t)n, sizeof *x->objective);
    if (!x->models || !x->cluster || !x->paths || !x->partition_id || !x->objective) {
        ts_experts_free(x);
        return TS_ENOMEM;
    }
    int rc = TS_OK, with_cluster = 0;
    for (int i = 0; i < n && rc == TS_OK; i++) {
        ts_st_file_t f;
        x->K = i + 1; /* so a failure frees what was opened */
        rc = ts_st_read(paths[i], &f, err, errlen);
        if (rc)
            break;
        int c = -1, has = meta_cluster(&f, &c);
        const char *pid = ts_st_meta(&f, "partition_id"), *obj = ts_st_meta(&f, "objective");
        char space[TS_LATENT_SPACE_HEX], s_i[32], s_0[32];
        int sp = ts_latent_space_meta(&f, space);
        if (i == 0 && sp >= 0)
            memcpy(x->latent_space, space, sizeof space);
        if (sp < 0) {
            ts_set_err(err, errlen, "'%s': metadata %s is not 64 hex digits", paths[i],
                       TS_LATENT_SPACE_KEY);
            rc = TS_ECORRUPT;
        } else if (strcmp(space, x->latent_space) != 0) {
            ts_set_err(err, errlen,
                       "'%s' works in %s and '%s' in %s: the experts of one ensemble must share "
                       "their latent space (one VAE made their data)",
                       paths[i], ts_latent_space_name(space, s_i, sizeof s_i), paths[0],
                       ts_latent_space_name(x->latent_space, s_0, sizeof s_0));
            rc = TS_EINVAL;
        } else if (obj && ts_objective_parse(obj, &x->objective[i]) != TS_OK) {
            ts_set_err(err, errlen,
                       "'%s': metadata objective '%s' is not velocity, epsilon, v_prediction or "
                       "x0",
                       paths[i], obj);
            rc = TS_EINVAL;
        } else if (has < 0) {
            ts_set_err(err, errlen, "'%s': metadata cluster '%s' is not an index 0..%d", paths[i],
                       ts_st_meta(&f, "cluster"), TS_ROUTE_MAX_EXPERTS - 1);
            rc = TS_ECORRUPT;
        } else {
            x->cluster[i] = has ? c : -1;
            with_cluster += has;
            x->paths[i] = ts_dup_str(paths[i]);
            x->partition_id[i] = pid && *pid ? ts_dup_str(pid) : NULL;
            if (!x->paths[i] || (pid && *pid && !x->partition_id[i]))
                rc = TS_ENOMEM;
        }
        if (rc == TS_OK &&
            (rc = ts_dit_open_file(&x->models[i], &f, e, max_batch, 0, err, errlen)) != TS_OK) {
            char why[384];
            snprintf(why, sizeof why, "%s", err ? err : "");
            ts_set_err(err, errlen, "'%s': %s", paths[i], why);
        }
        ts_st_free(&f);
        if (rc == TS_OK && i > 0) {
            const ts_dit_config_t *a = &x->models[0].cfg, *b = &x->models[i].cfg;
            if (a->input_size != b->input_size || a->in_channels != b->in_channels ||
                a->num_classes != b->num_classes) {
                ts_set_err(err, errlen,
                           "'%s' makes %dx%dx%d images with %d classes but '%s' makes %dx%dx%d "
                           "with %d: the experts of one ensemble must share the image config",
                           paths[i], b->in_channels, b->input_size, b->input_size, b->num_classes,
                           paths[0], a->in_channels, a->input_size, a->input_size, a->num_classes);
                rc = TS_EINVAL;
            }
        }
    }
    if (rc == TS_OK && with_cluster != 0 && with_cluster != n) {
        ts_set_err(err, errlen,
                   "%d of the %d expert files have a metadata cluster and %d do not: either all "
                   "name their cluster or none does (then file order is used)",
                   with_cluster, n, n - with_cluster);
        rc = TS_EINVAL;
    }
    if (rc == TS_OK && with_cluster == n) {
        /* order by cluster: a permutation of 0..n−1 is required */
        int where[TS_ROUTE_MAX_EXPERTS];
        for (int k = 0; k < n; k++)
            where[k] = -1;
        for (int i = 0; i < n && rc == TS_OK; i++) {
            int c = x->cluster[i];
            if (c >= n) {
                ts_set_err(err, errlen,
                           "'%s' is expert of cluster %d but only %d experts are given (clusters "
                           "must be 0..%d)",
                           x->paths[i], c, n, n - 1);
                rc = TS_EINVAL;
            } else if (where[c] >= 0) {
                ts_set_err(err, errlen, "'%s' and '%s' are both the expert of cluster %d",
                           x->paths[where[c]], x->paths[i], c);
                rc = TS_EINVAL;
            } else {
                where[c] = i;
            }
        }
        if (rc == TS_OK) {
            ts_experts_t s = *x;
            ts_dit_t *models = malloc((size_t)n * sizeof *models);
            int *cl = malloc((size_t)n * sizeof *cl);
            char **pa = malloc((size_t)n * sizeof *pa), **pid = malloc((size_t)n * sizeof *pid);
            ts_objective_t *ob = malloc((size_t)n * sizeof *ob);
            if (!models || !cl || !pa || !pid || !ob) {
                free(ob);
                free(models);
                free(cl);
                free(pa);
                free(pid);
                rc = TS_ENOMEM;
            } else {
                for (int k = 0; k < n; k++) {
                    models[k] = s.models[where[k]];
                    cl[k] = k;
                    pa[k] = s.paths[where[k]];
                    pid[k] = s.partition_id[where[k]];
                    ob[k] = s.objective[where[k]];
                }
                free(s.objective);
                x->objective = ob;
                free(s.models);
                free(s.cluster);
                free(s.paths);
                free(s.partition_id);
                x->models = models;
                x->cluster = cl;
                x->paths = pa;
                x->partition_id = pid;
            }
        }
    }
    if (rc != TS_OK)
        ts_experts_free(x);
    return rc;
}

/* ---- one job on one expert ------------------------------------------------------------------- */

int ts_expert_job_run(ts_dit_t *m, const ts_expert_job_t *j) {
    if (!m || !j || j->m < 1 || !j->x || !j->labels || !j->v)
        return TS_EINVAL;
    if (m->eng->device != TS_CPU)
        return TS_EDEVICE;
    const ts_dit_config_t *c = &m->cfg;
    int pairs = j->cfg_scale != 1.0f ? 2 : 1, B = pairs * j->m;
    if (j->with_sigma && !c->learn_sigma)
        return TS_EINVAL;
    if (B > m->max_batch)
        return TS_ERANGE;
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    ts_tensor_t x = {0}, t = {0}, out, dst, half, packed = {0};
    int32_t *y = malloc((size_t)B * sizeof *y);
    int rc = y ? TS_OK : TS_ENOMEM;
    /* with_sigma: the answer rows are made apart, then interleaved with the variance rows */
    if (rc == TS_OK && j->with_sigma)
        rc = ts_tensor_alloc(&packed, TS_F32, TS_CPU, 4,
                             TS_SHAPE(j->m, c->in_channels, c->input_size, c->input_size));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&x, TS_F32, TS_CPU, 4,
                             TS_SHAPE(B, c->in_channels, c->input_size, c->input_size));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, TS_SHAPE(B));
    if (rc == TS_OK) {
        float *xs = x.data;
        for (int p = 0; p < pairs; p++) {
            memcpy(xs + (size_t)p * j->m * chw, j->x, (size_t)(j->m * chw) * sizeof *xs);
            for (int i = 0; i < j->m; i++)
                y[p * j->m + i] = p ? c->num_classes : j->labels[i];
        }
        rc = ts_fill(m->eng, &t, j->t);
    }
    if (rc == TS_OK)
        rc = ts_dit_forward(m, &x, &t, y, B, &out);
    if (rc == TS_OK && j->with_sigma)
        dst = packed;
    else if (rc == TS_OK)
        rc = ts_tensor_wrap(&dst, j->v, TS_F32, TS_CPU, 4,
                            TS_SHAPE(j->m, c->in_channels, c->input_size, c->input_size));
    if (rc == TS_OK)
        rc = ts_tensor_slice(&half, &out, 0, j->m);
    if (rc == TS_OK)
        rc = ts_tensor_copy(&dst, &half);
    if (rc == TS_OK && pairs == 2) {
        /* as ensemble.c's run_expert */
        rc = ts_tensor_slice(&half, &out, j->m, j->m);
        if (rc == TS_OK)
            rc = ts_scale(m->eng, &dst, j->cfg_scale);
        if (rc == TS_OK)
            rc = ts_axpy(m->eng, &dst, 1.0f - j->cfg_scale, &half);
    }
    ts_tensor_t sg;
    if (rc == TS_OK && j->with_sigma)
        rc = ts_dit_sigma(m, B, &sg);
    if (rc == TS_OK && j->with_sigma) { /* the conditional rows' variance: the first m */
        const float *a = packed.data, *g = sg.data;
        for (int i = 0; i < j->m; i++) {
            memcpy(j->v + (size_t)(2 * i) * chw, a + (size_t)i * chw, (size_t)chw * sizeof *a);
            memcpy(j->v + (size_t)(2 * i + 1) * chw, g + (size_t)i * chw, (size_t)chw * sizeof *g);
        }
    }
    ts_tensor_free(&packed);
    ts_tensor_free(&x);
    ts_tensor_free(&t);
    free(y);
    return rc;
}

/* ---- the experts' residuals ------------------------------------------------------------------- */

int ts_expert_residuals_init(ts_expert_residuals_t *x, ts_dit_t *experts, int K, int max_batch) {
    if (!x || !experts || K < 1 || max_batch < 1)
        return TS_EINVAL;
    memset(x, 0, sizeof *x);
    const ts_dit_config_t *c = &experts[0].cfg;
    x->experts = experts;
    x->K = K;
    x->max_batch = max_batch;
    x->chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    for (int k = 0; k < K; k++)
        if (experts[k].max_batch < max_batch)
            return TS_EINVAL;
    x->r = malloc((size_t)K * max_batch * x->chw * sizeof *x->r);
    x->vel = malloc((size_t)max_batch * x->chw * sizeof *x->vel);
    if (!x->r || !x->vel) {
        ts_expert_residuals_free(x);
        return TS_ENOMEM;
    }
    return TS_OK;
}

void ts_expert_residuals_free(ts_expert_residuals_t *x) {
    if (!x)
        return;
    free(x->r);
    free(x->vel);
    memset(x, 0, sizeof *x);
}

int ts_expert_residuals_fn(void *ctx, const ts_tensor_t *xt, const ts_tensor_t *t,
                           const ts_tensor_t *vel, const int32_t *labels, int B, double *G) {
    ts_expert_residuals_t *x = ctx;
    if (!x || !xt || !t || !vel || !labels || !G || B < 1 || B > x->max_batch)
        return TS_EINVAL;
    int K = x->K;
    int64_t n = (int64_t)B * x->chw;
    TS_TRY(to_host(x->vel, vel));
    for (int k = 0; k < K; k++) {
        ts_tensor_t v;
        TS_TRY(ts_dit_forward(&x->experts[k], xt, t, labels, B, &v));
        float *rk = x->r + (int64_t)k * x->max_batch * x->chw;
        TS_TRY(to_host(rk, &v));
        for (int64_t i = 0; i < n; i++)
            rk[i] -= x->vel[i];
    }
    for (int b = 0; b < B; b++)
        for (int j = 0; j < K; j++)
            for (int k = j; k < K; k++) {
                const float *rj = x->r + ((int64_t)j * x->max_batch + b) * x->chw;
                const float *rk = x->r + ((int64_t)k * x->max_batch + b) * x->chw;
                double s = 0.0;
                for (int64_t p = 0; p < x->chw; p++)
                    s += (double)rj[p] * (double)rk[p];
                G[((int64_t)b * K + j) * K + k] = G[((int64_t)b * K + k) * K + j] = s / x->chw;
            }
    return TS_OK;
}
