/*
 * ensemble_remote.c — the ensemble's evaluation when the experts answer through a hook
 * (ts_ensemble_opts_t.eval: the network client, or a test's): the samples bound for each expert
 * are handed over as jobs (ts_expert_job_t), all at once; an expert whose job failed is left out
 * and the samples it served are routed again among the others, in further rounds; the answers are
 * then combined in expert order, as ensemble.c does with local experts.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <string.h>

#include "base/clock.h"
#include "model/ensemble.h"
#include "model/ensemble_internal.h"

/* Whether expert k's jobs ask for its learned variance. */
static int has_sigma(const ts_ensemble_t *s, int k) {
    return s->sig && s->o.learn_sigma && s->o.learn_sigma[k];
}

/* sig[b] += w · v_k(b) for the m rows of expert k (idx_h, wk_h) from its variance answers, or
 * −w for an expert without a learned variance: in the order and the float arithmetic of
 * ensemble.c's add_sigma for a local expert. */
static void add_sigma(ts_ensemble_t *s, int k, int m) {
    size_t chw = (size_t)s->chw, n = (size_t)s->n;
    for (int i = 0; i < m; i++) {
        float *dst = s->sig + (size_t)s->idx_h[i] * chw;
        if (!has_sigma(s, k)) {
            for (size_t j = 0; j < chw; j++)
                dst[j] -= s->wk_h[i];
            continue;
        }
        const float *src = s->job_sig + ((size_t)k * n + (size_t)s->idx_h[i]) * chw;
        for (size_t j = 0; j < chw; j++)
            dst[j] += s->wk_h[i] * src[j];
    }
}

/* Runs one round of jobs: for every expert still available, the samples that now route to it
 * and have no answer from it yet. Answers land in job_v by sample ((k, b) → row k·n + b);
 * *failed gets the experts whose job failed. Returns how many jobs ran (0: nothing left). */
static int remote_round(ts_ensemble_t *s, float t, uint8_t *done, uint8_t *failed, int *ran) {
    int n = s->n, K = s->K, n_jobs = 0;
    size_t chw = (size_t)s->chw;
    ts_ensemble_ask_t asks[TS_ROUTE_MAX_EXPERTS]; /* where each expert is asked, for its answers */
    for (int k = 0; k < K; k++) {
        if (failed[k])
            continue;
        int m = 0;
        int32_t *rows = s->job_rows + (size_t)k * n, *y = s->job_y + (size_t)k * n;
        float *xk = s->job_x + (size_t)k * n * chw;
        ts_ensemble_ask_t ask = asks[k] = ts_ensemble__ask(s, k, t);
        for (int b = 0; b < n; b++)
            if (s->w[(size_t)b * K + k] != 0.0f && !done[(size_t)k * n + b]) {
                rows[m] = b;
                y[m] = s->o.labels[b];
                float *row = xk + (size_t)m * chw;
                const float *xb = s->xh + (size_t)b * chw;
                if (ask.obj == TS_OBJ_VELOCITY)
                    memcpy(row, xb, chw * sizeof *xk);
                else /* the scaled input, rounded as ts_scale rounds it for a local expert */
                    for (size_t i = 0; i < chw; i++)
                        row[i] = xb[i] * (float)ask.scale;
                m++;
            }
        if (m == 0)
            continue;
        int with_sigma = has_sigma(s, k);
        s->jobs[n_jobs++] =
            (ts_expert_job_t){.k = k,
                              .m = m,
                              .rows = rows,
                              .x = xk,
                              .labels = y,
                              .t = ask.t,
                              .cfg_scale = s->o.cfg_scale,
                              .with_sigma = with_sigma,
                              .v = s->job_vp + (size_t)k * n * chw * (s->sig ? 2 : 1),
                              .status = TS_EIO};
    }
    *ran = n_jobs;
    if (n_jobs == 0)
        return TS_OK;
    TS_TRY(s->o.eval(s->o.eval_ctx, s->jobs, n_jobs));
    for (int j = 0; j < n_jobs; j++) {
        const ts_expert_job_t *jb = &s->jobs[j];
        if (jb->status != TS_OK) {
            failed[jb->k] = 1;
            s->dropped++;
            continue;
        }
        s->forwards += (int64_t)s->pairs * jb->m;
        s->expert_forwards[jb->k] += (int64_t)s->pairs * jb->m;
        const ts_ensemble_ask_t ask = asks[jb->k];
        size_t stride = chw * (jb->with_sigma ? 2 : 1); /* an answer row, with its variance */
        for (int r = 0; r < jb->m; r++) {
            size_t at = (size_t)jb->k * n + (size_t)jb->rows[r];
            const float *ans = jb->v + (size_t)r * stride;
            if (ask.obj == TS_OBJ_VELOCITY) /* the answer is the velocity */
                memcpy(s->job_v + at * chw, ans, chw * sizeof *jb->v);
            else /* converted to the velocity at (x_t, t), as run_expert does for a local one */
                TS_TRY(ts_objective_to_velocity(ask.obj, t, ask.abar, ask.scale,
                                                s->xh + (size_t)jb->rows[r] * chw, ans,
                                                s->job_v + at * chw, (int64_t)chw));
            if (jb->with_sigma)
                memcpy(s->job_sig + at * chw, ans + chw, chw * sizeof *jb->v);
            done[at] = 1;
        }
    }
    return TS_OK;
}

/* Routes again, without the failed experts, every sample that one of them was serving: its
 * scores for them become −∞ and its row of weights is made anew (so top1 moves to the next best
 * expert). TS_EPEER when a sample has no expert left. */
static int reroute(ts_ensemble_t *s, float t, const uint8_t *failed) {
    int n = s->n, K = s->K;
    for (int b = 0; b < n; b++) {
        float *wb = s->w + (size_t)b * K, *sb = s->scores + (size_t)b * K;
        int hit = 0, left = 0;
        for (int k = 0; k < K; k++) {
            hit |= failed[k] && wb[k] != 0.0f;
            if (failed[k])
                sb[k] = -INFINITY;
            else
                left++;
        }
        if (!hit)
            continue;
        if (left == 0)
            return TS_EPEER;
        memcpy(wb, sb, (size_t)K * sizeof *wb);
        TS_TRY(ts_route_weights(wb, 1, K, &s->o.select, t));
        s->renormalised++;
    }
    return TS_OK;
}

/* v = Σ_k w_k · v_k with every expert's answer computed by the hook: the jobs are made in expert
 * order, handed over at once, and combined in expert order as the local path does. A failed
 * expert is left out and the samples it served are routed again among the others, in further
 * rounds, until every sample has the answers of the experts it now routes to. */
int ts_ensemble__remote_combine(ts_ensemble_t *s, const ts_tensor_t *x, float t, ts_tensor_t *v) {
    ts_engine_t *e = s->eng;
    int n = s->n, K = s->K;
    size_t chw = (size_t)s->chw;
    uint8_t failed[TS_ROUTE_MAX_EXPERTS] = {0};
    memset(s->job_done, 0, (size_t)K * n);
    TS_TRY(to_host(s->xh, x));
    for (int round = 0; round <= K; round++) {
        int ran = 0, any_failed = 0;
        uint8_t before[TS_ROUTE_MAX_EXPERTS];
        memcpy(before, failed, sizeof before);
        TS_TRY(remote_round(s, t, s->job_done, failed, &ran));
        if (ran == 0)
            break;
        for (int k = 0; k < K; k++)
            any_failed |= failed[k] && !before[k];
        if (!any_failed)
            break;
        TS_TRY(reroute(s, t, failed));
    }
    double t_combine = ts_now_s();
    TS_TRY(ts_zero(e, v));
    for (int k = 0; k < K; k++) {
        int m = ts_ensemble__rows_for(s, k);
        if (m == 0)
            continue;
        float *packed = s->job_vp + (size_t)k * n * chw;
        for (int r = 0; r < m; r++)
            memcpy(packed + (size_t)r * chw, s->job_v + ((size_t)k * n + s->idx_h[r]) * chw,
                   chw * sizeof *packed);
        TS_TRY(ts_ensemble__upload_rows(s, m));
        ts_tensor_t vk, idx, wk, src;
        TS_TRY(ts_tensor_slice(&vk, &s->vk, 0, m));
        TS_TRY(ts_tensor_slice(&idx, &s->idx, 0, m));
        TS_TRY(ts_tensor_slice(&wk, &s->wk, 0, m));
        TS_TRY(ts_tensor_wrap(&src, packed, TS_F32, TS_CPU, 4,
                              TS_SHAPE(m, x->shape[1], x->shape[2], x->shape[3])));
        TS_TRY(ts_tensor_copy(&vk, &src));
        TS_TRY(ts_scatter_axpy_rows(e, v, &vk, &idx, &wk));
        if (s->sig)
            add_sigma(s, k, m);
    }
    s->combine_s += ts_now_s() - t_combine;
    return TS_OK;
}
