/*
 * ensemble.c — a routed ensemble of local experts as one velocity function (model/ensemble.h).
 *
 * One evaluation, top to bottom (ts_ensemble_velocity):
 *   1. scores (n, K) on the host, by the policy (score_learned / score_centroid / the confidence
 *      pass, which already runs every expert);
 *   2. ts_route_weights turns them into weights, sparse and renormalised per sample;
 *   3. v = 0; for each expert k, the rows b with w[b, k] > 0, in increasing b, form one batch:
 *      gathered into [x_b; x_b] with labels [y_b; ∅], one forward, guided as
 *      v_k = s·v(y) + (1 − s)·v(∅) (the same operations in the same order as ts_dit_velocity, so
 *      one expert with weight 1 gives its bits unchanged), then v[b] += w[b, k] · v_k[b];
 *   4. the centroid policy keeps φ(x − t·v) for the next evaluation; the record keeps the weights.
 * Experts are visited in index order and v starts at 0, so each sample's result is the same sum
 * in the same order whatever the other samples in the batch are.
 *
 * Invariant: every buffer is sized at init for n samples; an evaluation allocates nothing except
 * when it grows the record.
 *
 * With opts.eval the experts' answers come from a hook instead (ensemble_remote.c); the experts
 * outside an evaluation (files, one job on one model, the residuals) are experts.c's, a classifier
 * as the router classifier_router.c's. ensemble_internal.h holds what these files share.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/ensemble.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "kernels/math.h"
#include "model/ensemble_internal.h"
#include "model/trainer.h"

/* ---- init and free ---------------------------------------------------------------------------- */

void ts_ensemble_free(ts_ensemble_t *s) {
    if (!s)
        return;
    ts_tensor_free(&s->xx);
    ts_tensor_free(&s->tt);
    ts_tensor_free(&s->vk);
    ts_tensor_free(&s->vall);
    ts_tensor_free(&s->idx);
    ts_tensor_free(&s->wk);
    free(s->yy);
    free(s->idx_h);
    free(s->conv_x);
    free(s->conv_f);
    free(s->w);
    free(s->wk_h);
    free(s->xh);
    free(s->vh);
    free(s->xhat);
    free(s->emb);
    free(s->d2);
    free(s->prev_emb);
    free(s->sig);
    free(s->sig_k);
    free(s->expert_forwards);
    free(s->jobs);
    free(s->job_rows);
    free(s->job_y);
    free(s->job_x);
    free(s->job_v);
    free(s->job_vp);
    free(s->job_sig);
    free(s->job_done);
    free(s->scores);
    free(s->held);
    free(s->wu);
    free(s->p);
    free(s->spread);
    free(s->sq);
    free(s->absent_mass);
    free(s->absent_w);
    for (int i = 0; i < s->n_steps; i++) {
        free(s->steps[i].w);
        free(s->steps[i].p);
        free(s->steps[i].spread);
    }
    free(s->steps);
    memset(s, 0, sizeof *s);
}

/* The checks of ts_ensemble_init that need no allocation. */
static int check_opts(ts_engine_t *e, ts_dit_t *experts, int K, const ts_ensemble_opts_t *o,
                      char *err, size_t errlen) {
    int remote = o && o->eval;
    if (!e || (!experts && !(remote && o->config)) || !o || K < 1 || K > TS_ROUTE_MAX_EXPERTS ||
        o->n < 1 || !o->labels || o->select.n_rules < 1 || o->select.n_rules > TS_ROUTE_MAX_RULES) {
        ts_set_err(err, errlen,
                   "ts_ensemble_init: invalid arguments (1..%d experts, n >= 1, labels and a "
                   "parsed selection are required)",
                   TS_ROUTE_MAX_EXPERTS);
        return TS_EINVAL;
    }
    if ((int)o->policy < TS_POLICY_LEARNED || o->policy > TS_POLICY_UNIFORM) {
        ts_set_err(err, errlen, "ts_ensemble_init: unknown policy %d", (int)o->policy);
        return TS_EINVAL;
    }
    if (o->hold < TS_HOLD_NONE || o->hold > TS_HOLD_BELOW ||
        (o->hold && o->policy == TS_POLICY_CONFIDENCE) || (o->hold == TS_HOLD_DRAW && !o->seeds) ||
        (o->hold == TS_HOLD_BELOW && !(o->hold_t > 0.0f && o->hold_t < 1.0f))) {
        ts_set_err(err, errlen,
                   "ts_ensemble_init: hold %d: per-trajectory routing is 0, 1 (hold), 2 (draw, "
                   "which needs the samples' seeds) or 3 (below hold_t, 0 < hold_t < 1), and not "
                   "with the confidence policy",
                   o->hold);
        return TS_EINVAL;
    }
    if (o->absent) {
        int present = 0;
        for (int k = 0; k < K; k++)
            present += !o->absent[k];
        if (present == 0) {
            ts_set_err(err, errlen, "every one of the %d experts is absent: none can answer", K);
            return TS_EINVAL;
        }
    }
    if (o->exact_guidance && (remote || o->hold || o->policy == TS_POLICY_CONFIDENCE)) {
        ts_set_err(err, errlen,
                   "exact mixture guidance routes the two halves of the guidance apart at every "
                   "evaluation: it runs with local experts only, not held, and not with the "
                   "confidence policy");
        return TS_ENOTSUP;
    }
    int ddpm = 0;
    for (int k = 0; o->objectives && k < K; k++)
        ddpm |= o->objectives[k] != TS_OBJ_VELOCITY;
    if (ddpm && (o->exact_guidance || o->policy == TS_POLICY_CONFIDENCE)) {
        ts_set_err(err, errlen,
                   "experts of a DDPM objective (epsilon, v_prediction, x0) do not run with the "
                   "confidence policy nor exact guidance");
        return TS_ENOTSUP;
    }
    if (!isfinite(o->cfg_scale)) {
        ts_set_err(err, errlen, "the guidance scale %g is not finite", (double)o->cfg_scale);
        return TS_EINVAL;
    }
    if (remote && o->policy == TS_POLICY_CONFIDENCE) {
        ts_set_err(err, errlen,
                   "the confidence policy needs every expert's answer before it "
                   "can score them: it runs with local experts only");
        return TS_ENOTSUP;
    }
    int pairs = o->cfg_scale != 1.0f ? 2 : 1;
    const ts_dit_config_t *c0 = remote ? o->config : &experts[0].cfg;
    for (int k = 0; !remote && k < K; k++) {
        const ts_dit_config_t *c = &experts[k].cfg;
        if (experts[k].eng != e) {
            ts_set_err(err, errlen, "expert %d runs on another engine than the ensemble", k);
            return TS_EINVAL;
        }
        if (c->input_size != c0->input_size || c->in_channels != c0->in_channels ||
            c->num_classes != c0->num_classes) {
            ts_set_err(err, errlen,
                       "expert %d makes %dx%dx%d images with %d classes but expert 0 makes "
                       "%dx%dx%d with %d: the experts of one ensemble must share the image config",
                       k, c->in_channels, c->input_size, c->input_size, c->num_classes,
                       c0->in_channels, c0->input_size, c0->input_size, c0->num_classes);
            return TS_EINVAL;
        }
        if (experts[k].max_batch < pairs * o->n) {
            ts_set_err(err, errlen,
                       "expert %d has room for %d samples per forward but %d are needed (%d "
                       "samples%s)",
                       k, experts[k].max_batch, pairs * o->n, o->n,
                       pairs == 2 ? ", twice for guidance" : "");
            return TS_ERANGE;
        }
    }
    for (int i = 0; i < o->n; i++)
        if (o->labels[i] < 0 || o->labels[i] > c0->num_classes) {
            ts_set_err(err, errlen, "label %d of sample %d is not a class 0..%d (or %d for none)",
                       (int)o->labels[i], i, c0->num_classes - 1, c0->num_classes);
            return TS_ERANGE;
        }
    for (int j = 0; o->log_prior && j < (c0->num_classes + 1) * K; j++)
        if (!isfinite(o->log_prior[j])) {
            ts_set_err(err, errlen, "the class prior's log p(y | k) at (%d, %d) is not finite",
                       j / K, j % K);
            return TS_ENONFINITE;
        }
    int distance = o->policy == TS_POLICY_CENTROID || o->policy == TS_POLICY_CONFIDENCE;
    if (distance && !(o->tau > 0.0f && isfinite(o->tau))) {
        ts_set_err(err, errlen, "the %s policy needs a temperature tau > 0 (got %g)",
                   ts_policy_name(o->policy), (double)o->tau);
        return TS_EINVAL;
    }
    if (o->policy == TS_POLICY_LEARNED && !o->router) {
        ts_set_err(err, errlen, "the learned policy needs a router, and none was given");
        return TS_EINVAL;
    }
    if (distance && !o->partition) {
        ts_set_err(err, errlen,
                   "the %s policy needs the partition (its embedding and centroids), and none "
                   "was given",
                   ts_policy_name(o->policy));
        return TS_EINVAL;
    }
    if (o->partition) {
        const ts_partition_t *p = o->partition;
        int64_t chw = (int64_t)c0->in_channels * c0->input_size * c0->input_size;
        if (p->K != K) {
            ts_set_err(err, errlen,
                       "the partition has %d clusters but %d experts are given: one expert per "
                       "cluster is required",
                       p->K, K);
            return TS_EINVAL;
        }
        if (p->D != chw || p->k < 1 || !p->basis || !p->mean || !p->centroids) {
            ts_set_err(err, errlen,
                       "the partition embeds images of %d values but the experts make %lld: "
                       "they do not belong together",
                       p->D, (long long)chw);
            return TS_EINVAL;
        }
    }
    return TS_OK;
}

int ts_ensemble_init(ts_ensemble_t *s, ts_engine_t *e, ts_dit_t *experts, int K,
                     const ts_ensemble_opts_t *opts, char *err, size_t errlen) {
    if (!s) {
        ts_set_err(err, errlen, "ts_ensemble_init: invalid arguments");
        return TS_EINVAL;
    }
    memset(s, 0, sizeof *s);
    int rc = check_opts(e, experts, K, opts, err, errlen);
    if (rc)
        return rc;
    const ts_dit_config_t *c = opts->eval ? opts->config : &experts[0].cfg;
    int n = opts->n;
    s->eng = e;
    s->experts = experts;
    s->K = K;
    s->n = n;
    s->o = *opts;
    s->pairs = opts->cfg_scale != 1.0f ? 2 : 1;
    s->chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    int64_t B = (int64_t)s->pairs * n, H = c->input_size, C = c->in_channels;
    int confidence = opts->policy == TS_POLICY_CONFIDENCE;
    int kd = opts->partition ? opts->partition->k : 1;
    /* exact guidance: one expert's rows of both halves, up to 2n */
    int exact = opts->exact_guidance && s->pairs == 2;
    int64_t rows = exact ? 2 * (int64_t)n : n;
    s->o.exact_guidance = exact;
    rc = ts_tensor_alloc(&s->xx, TS_F32, e->device, 4, TS_SHAPE(B, C, H, H));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&s->tt, TS_F32, e->device, 1, TS_SHAPE(B));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&s->vk, TS_F32, e->device, 4, TS_SHAPE(n, C, H, H));
    if (rc == TS_OK && confidence)
        rc = ts_tensor_alloc(&s->vall, TS_F32, e->device, 4, TS_SHAPE((int64_t)K * n, C, H, H));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&s->idx, TS_I32, e->device, 1, TS_SHAPE(rows));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&s->wk, TS_F32, e->device, 1, TS_SHAPE(rows));
    size_t nv = (size_t)(s->chw * n);
    s->yy = malloc((size_t)B * sizeof *s->yy);
    s->idx_h = malloc((size_t)rows * sizeof *s->idx_h);
    s->w = malloc((size_t)n * K * sizeof *s->w);
    s->wk_h = malloc((size_t)rows * sizeof *s->wk_h);
    s->xh = malloc(nv * sizeof *s->xh);
    s->vh = malloc(nv * (confidence ? (size_t)K : 1) * sizeof *s->vh);
    s->xhat = malloc(nv * sizeof *s->xhat);
    for (int k = 0; opts->objectives && k < K; k++)
        s->ddpm |= opts->objectives[k] != TS_OBJ_VELOCITY;
    if (s->ddpm && (!(s->conv_x = malloc(nv * sizeof *s->conv_x)) ||
                    !(s->conv_f = malloc(nv * sizeof *s->conv_f))))
        rc = rc == TS_OK ? TS_ENOMEM : rc;
    s->emb = malloc((size_t)n * kd * sizeof *s->emb);
    s->d2 = malloc((size_t)n * K * sizeof *s->d2);
    s->prev_emb = malloc((size_t)n * kd * sizeof *s->prev_emb);
    s->expert_forwards = calloc((size_t)K, sizeof *s->expert_forwards);
    if (opts->hold && !(s->held = malloc((size_t)n * K * sizeof *s->held)))
        rc = rc == TS_OK ? TS_ENOMEM : rc;
    if (exact && !(s->wu = malloc((size_t)n * K * sizeof *s->wu)))
        rc = rc == TS_OK ? TS_ENOMEM : rc;
    if (opts->record) {
        s->p = malloc((size_t)n * K * sizeof *s->p);
        s->spread = malloc((size_t)n * sizeof *s->spread);
        s->sq = malloc((size_t)n * sizeof *s->sq);
        if (!s->p || !s->spread || !s->sq)
            rc = rc == TS_OK ? TS_ENOMEM : rc;
    }
    int learned_sigma = 0;
    for (int k = 0; k < K; k++)
        learned_sigma |= opts->eval ? opts->learn_sigma && opts->learn_sigma[k]
                                    : experts && experts[k].cfg.learn_sigma;
    if (opts->variance && learned_sigma && !exact) {
        s->sig = malloc((size_t)nv * sizeof *s->sig);
        s->sig_k = malloc((size_t)nv * sizeof *s->sig_k);
        if (!s->sig || !s->sig_k)
            rc = rc == TS_OK ? TS_ENOMEM : rc;
    }
    if (opts->absent) {
        s->absent_mass = calloc((size_t)K, sizeof *s->absent_mass);
        s->absent_w = malloc((size_t)n * K * sizeof *s->absent_w);
        if (!s->absent_mass || !s->absent_w)
            rc = rc == TS_OK ? TS_ENOMEM : rc;
    }
    if (opts->eval) {
        s->jobs = calloc((size_t)K, sizeof *s->jobs);
        s->job_rows = malloc((size_t)K * n * sizeof *s->job_rows);
        s->job_y = malloc((size_t)K * n * sizeof *s->job_y);
        s->job_x = malloc((size_t)K * nv * sizeof *s->job_x);
        s->job_v = malloc((size_t)K * nv * sizeof *s->job_v);
        s->job_vp = malloc((size_t)K * nv * (s->sig ? 2 : 1) * sizeof *s->job_vp);
        if (s->sig && !(s->job_sig = malloc((size_t)K * nv * sizeof *s->job_sig)))
            rc = rc == TS_OK ? TS_ENOMEM : rc;
        s->job_done = malloc((size_t)K * n);
        s->scores = malloc((size_t)n * K * sizeof *s->scores);
        if (!s->jobs || !s->job_rows || !s->job_y || !s->job_x || !s->job_v || !s->job_vp ||
            !s->job_done || !s->scores)
            rc = rc == TS_OK ? TS_ENOMEM : rc;
    }
    if (rc == TS_OK && (!s->yy || !s->idx_h || !s->w || !s->wk_h || !s->xh || !s->vh || !s->xhat ||
                        !s->emb || !s->d2 || !s->prev_emb || !s->expert_forwards))
        rc = TS_ENOMEM;
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "cannot allocate the ensemble's buffers for %d samples: %s", n,
                   ts_strerror(rc));
        ts_ensemble_free(s);
    }
    return rc;
}

double ts_ensemble_evals_per_sample(const ts_ensemble_t *s) {
    return s && s->n > 0 ? (double)s->forwards / (double)s->n : 0.0;
}

/* ---- one expert on the rows bound for it ------------------------------------------------------ */

/* Uploads idx_h[0..m) and wk_h[0..m) into the device tensors idx and wk. */
int ts_ensemble__upload_rows(ts_ensemble_t *s, int m) {
    ts_tensor_t dst, src;
    TS_TRY(ts_tensor_slice(&dst, &s->idx, 0, m));
    TS_TRY(ts_tensor_wrap(&src, s->idx_h, TS_I32, TS_CPU, 1, TS_SHAPE(m)));
    TS_TRY(ts_tensor_copy(&dst, &src));
    TS_TRY(ts_tensor_slice(&dst, &s->wk, 0, m));
    TS_TRY(ts_tensor_wrap(&src, s->wk_h, TS_F32, TS_CPU, 1, TS_SHAPE(m)));
    return ts_tensor_copy(&dst, &src);
}

ts_ensemble_ask_t ts_ensemble__ask(const ts_ensemble_t *s, int k, float t) {
    ts_ensemble_ask_t a = {
        .obj = s->o.objectives ? s->o.objectives[k] : TS_OBJ_VELOCITY, .t = t, .scale = 1.0};
    if (a.obj != TS_OBJ_VELOCITY) { /* at (c·x_t, the step of equal SNR) */
        double step = 0.0;
        (void)ts_ddpm_from_flow(s->o.schedule ? s->o.schedule : ts_ddpm_dit(), t, &step, &a.abar,
                                &a.scale);
        a.t = (float)(step / 1000.0); /* DiT embeds 1000·t: the step itself */
    }
    return a;
}

/* dst (m, C, H, W) = expert k's guided velocity for the rows idx[0..m) of x, in one forward of
 * pairs·m samples: [x_idx; x_idx] with labels [y_idx; ∅]. An expert of a DDPM objective is asked
 * at (c·x, its step) and its guided answer converted to the velocity (opts.objectives). */
static int run_expert(ts_ensemble_t *s, int k, const ts_tensor_t *x, float t, int m,
                      ts_tensor_t *dst) {
    ts_engine_t *e = s->eng;
    ts_dit_t *model = &s->experts[k];
    int B = s->pairs * m;
    ts_tensor_t idx, xb, tb, half, out, cond, uncond, host;
    ts_ensemble_ask_t ask = ts_ensemble__ask(s, k, t);
    ts_objective_t obj = ask.obj;
    TS_TRY(ts_tensor_slice(&idx, &s->idx, 0, m));
    TS_TRY(ts_tensor_slice(&xb, &s->xx, 0, B));
    TS_TRY(ts_tensor_slice(&tb, &s->tt, 0, B));
    for (int p = 0; p < s->pairs; p++) {
        TS_TRY(ts_tensor_slice(&half, &xb, (int64_t)p * m, m));
        TS_TRY(ts_gather_rows(e, &half, x, &idx));
    }
    if (obj != TS_OBJ_VELOCITY) { /* the rows of x_t kept for the conversion, then scaled */
        TS_TRY(ts_tensor_slice(&half, &xb, 0, m));
        TS_TRY(ts_tensor_wrap(&host, s->conv_x, TS_F32, TS_CPU, half.ndim, half.shape));
        TS_TRY(ts_tensor_copy(&host, &half));
        TS_TRY(ts_scale(e, &xb, (float)ask.scale));
    }
    for (int i = 0; i < m; i++) {
        s->yy[i] = s->o.labels[s->idx_h[i]];
        if (s->pairs == 2)
            s->yy[m + i] = model->cfg.num_classes; /* the null class */
    }
    TS_TRY(ts_fill(e, &tb, ask.t));
    TS_TRY(ts_dit_forward(model, &xb, &tb, s->yy, B, &out));
    s->forwards += B;
    s->expert_forwards[k] += B;
    TS_TRY(ts_tensor_slice(&cond, &out, 0, m));
    TS_TRY(ts_tensor_copy(dst, &cond));
    if (s->pairs == 2) {
        /* v = v_u + s·(v_c − v_u) = s·v_c + (1 − s)·v_u, as ts_dit_velocity (for a DDPM expert
         * on its own output: the conversion below is affine, so guiding before it is the same) */
        TS_TRY(ts_tensor_slice(&uncond, &out, m, m));
        TS_TRY(ts_scale(e, dst, s->o.cfg_scale));
        TS_TRY(ts_axpy(e, dst, 1.0f - s->o.cfg_scale, &uncond));
    }
    if (obj != TS_OBJ_VELOCITY) { /* the answer to the velocity at (x_t, t), on the host */
        TS_TRY(ts_tensor_wrap(&host, s->conv_f, TS_F32, TS_CPU, dst->ndim, dst->shape));
        TS_TRY(ts_tensor_copy(&host, dst));
        TS_TRY(ts_objective_to_velocity(obj, t, ask.abar, ask.scale, s->conv_x, s->conv_f,
                                        s->conv_f, (int64_t)m * s->chw));
        TS_TRY(ts_tensor_copy(dst, &host));
    }
    return TS_OK;
}

/* Selects the rows with a non-zero weight for expert k into idx_h / wk_h; returns their count. */
int ts_ensemble__rows_for(ts_ensemble_t *s, int k) {
    int m = 0;
    for (int b = 0; b < s->n; b++) {
        float wb = s->w[(size_t)b * s->K + k];
        if (wb != 0.0f) {
            s->idx_h[m] = b;
            s->wk_h[m] = wb;
            m++;
        }
    }
    return m;
}

/* ---- policies ----------------------------------------------------------------------------------- */

/* out (n·chw) = x − t·v, on the host. */
static void denoised(float *out, const float *x, const float *v, float t, size_t count) {
    for (size_t i = 0; i < count; i++)
        out[i] = x[i] - t * v[i];
}

static int score_router(ts_ensemble_t *s, const ts_tensor_t *x, float t) {
    s->router_calls++;
    return s->o.router(s->o.router_ctx, x, t, s->o.labels, s->n, s->w);
}

/* Scores of the distance to the centroids from the previous evaluation's x̂0, or the fallback
 * (router, else uniform) when there is none yet. */
static int score_centroid(ts_ensemble_t *s, const ts_tensor_t *x, float t, ts_policy_t *used) {
    size_t nk = (size_t)s->n * s->K;
    if (!s->has_prev) {
        s->fallbacks++;
        if (s->o.router) {
            *used = TS_POLICY_LEARNED;
            return score_router(s, x, t);
        }
        *used = TS_POLICY_UNIFORM;
        memset(s->w, 0, nk * sizeof *s->w);
        return TS_OK;
    }
    const ts_partition_t *p = s->o.partition;
    ts_route_sq_dist(s->d2, s->prev_emb, p->centroids, s->n, s->K, p->k);
    for (size_t i = 0; i < nk; i++)
        s->w[i] = -s->d2[i] / s->o.tau;
    return TS_OK;
}

/* Runs every expert on every sample into vall and scores each by the distance of its own x̂0_k
 * to its own centroid. */
static int score_confidence(ts_ensemble_t *s, const ts_tensor_t *x, float t) {
    const ts_partition_t *p = s->o.partition;
    int n = s->n, K = s->K;
    size_t nv = (size_t)(s->chw * n);
    for (int b = 0; b < n; b++)
        s->idx_h[b] = b;
    TS_TRY(ts_ensemble__upload_rows(s, n));
    TS_TRY(to_host(s->xh, x));
    for (int k = 0; k < K; k++) {
        ts_tensor_t vk;
        TS_TRY(ts_tensor_slice(&vk, &s->vall, (int64_t)k * n, n));
        TS_TRY(run_expert(s, k, x, t, n, &vk));
        TS_TRY(to_host(s->vh + (size_t)k * nv, &vk));
        denoised(s->xhat, s->xh, s->vh + (size_t)k * nv, t, nv);
        TS_TRY(ts_partition_embed(p, s->xhat, n, s->emb));
        for (int b = 0; b < n; b++) {
            float d;
            ts_route_sq_dist(&d, s->emb + (size_t)b * p->k, p->centroids + (size_t)k * p->k, 1, 1,
                             p->k);
            s->w[(size_t)b * K + k] = -d / s->o.tau;
        }
    }
    return TS_OK;
}

/* Appends this evaluation's weights to the record. */
static int record_step(ts_ensemble_t *s, float t, ts_policy_t used) {
    if (s->n_steps == s->cap_steps) {
        int cap = s->cap_steps ? 2 * s->cap_steps : 64;
        ts_route_step_t *st = realloc(s->steps, (size_t)cap * sizeof *st);
        if (!st)
            return TS_ENOMEM;
        s->steps = st;
        s->cap_steps = cap;
    }
    size_t nk = (size_t)s->n * s->K;
    float *w = malloc(nk * sizeof *w), *p = malloc(nk * sizeof *p);
    float *spread = malloc((size_t)s->n * sizeof *spread);
    if (!w || !p || !spread) {
        free(w);
        free(p);
        free(spread);
        return TS_ENOMEM;
    }
    memcpy(w, s->w, nk * sizeof *w);
    memcpy(p, s->p, nk * sizeof *p);
    memcpy(spread, s->spread, (size_t)s->n * sizeof *spread);
    s->steps[s->n_steps++] =
        (ts_route_step_t){.t = t, .policy = used, .w = w, .p = p, .spread = spread};
    return TS_OK;
}

/* ---- one evaluation ------------------------------------------------------------------------------- */

/* opts.absent: the weights the absent experts would have had go into absent_mass, then their
 * scores become −∞, so that the selection renormalises over the experts that can answer. */
static int route_around(ts_ensemble_t *s, float t) {
    int n = s->n, K = s->K;
    size_t nk = (size_t)n * K;
    memcpy(s->absent_w, s->w, nk * sizeof *s->w);
    TS_TRY(ts_route_weights(s->absent_w, n, K, &s->o.select, t));
    s->absent_routed += n;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < K; k++)
            if (s->o.absent[k]) {
                s->absent_mass[k] += s->absent_w[(size_t)i * K + k];
                s->w[(size_t)i * K + k] = -INFINITY;
            }
    return TS_OK;
}

/* TS_HOLD_DRAW: each row of w (n, K) becomes one-hot at an expert drawn from it: the first k
 * whose cumulative weight exceeds u · Σw, u the sample's uniform (opts.hold). */
static void draw_one(float *w, int n, int K, const uint64_t *seeds) {
    for (int i = 0; i < n; i++) {
        float *row = w + (size_t)i * K;
        double total = 0.0, acc = 0.0;
        for (int k = 0; k < K; k++)
            total += row[k];
        double u = ts_rng_uniform_at(ts_stream_key(seeds[i], TS_HOLD_STREAM), 0) * total;
        int pick = -1;
        for (int k = 0; k < K; k++) {
            acc += row[k];
            if (pick < 0 && row[k] > 0.0f && (acc > u || k == K - 1))
                pick = k;
        }
        for (int k = K - 1; pick < 0 && k >= 0; k--) /* rounding: the last expert with weight */
            if (row[k] > 0.0f)
                pick = k;
        for (int k = 0; k < K; k++)
            row[k] = k == pick ? 1.0f : 0.0f;
    }
}

/* out (n, K) = the softmax of each row of the scores (n, K) (−∞ entries get 0). */
static void softmax_rows(float *out, const float *scores, int n, int K) {
    for (int i = 0; i < n; i++) {
        const float *r = scores + (size_t)i * K;
        float *o = out + (size_t)i * K, top = -INFINITY;
        double z = 0.0;
        for (int k = 0; k < K; k++)
            top = r[k] > top ? r[k] : top;
        for (int k = 0; k < K; k++)
            z += (o[k] = isfinite(r[k]) ? expf(r[k] - top) : 0.0f);
        for (int k = 0; k < K; k++)
            o[k] = z > 0.0 ? (float)(o[k] / z) : 1.0f / (float)K;
    }
}

/* Exact guidance: expert k once on [x rows with w^c_k ≠ 0 ; x rows with w^u_k ≠ 0] with labels
 * [y; ∅], added into v with the weights s·w^c and (1 − s)·w^u. */
static int run_expert_exact(ts_ensemble_t *s, int k, const ts_tensor_t *x, float t,
                            ts_tensor_t *v) {
    int n = s->n, K = s->K, mc = 0, m = 0;
    float g = s->o.cfg_scale;
    for (int half = 0; half < 2; half++) {
        const float *w = half ? s->wu : s->w;
        float scale = half ? 1.0f - g : g;
        for (int b = 0; b < n; b++)
            if (w[(size_t)b * K + k] != 0.0f) {
                s->idx_h[m] = b;
                s->wk_h[m++] = scale * w[(size_t)b * K + k];
            }
        mc = half ? mc : m;
    }
    if (m == 0)
        return TS_OK;
    ts_engine_t *e = s->eng;
    ts_dit_t *model = &s->experts[k];
    TS_TRY(ts_ensemble__upload_rows(s, m));
    ts_tensor_t idx, xb, tb, out, part, pidx, pw;
    TS_TRY(ts_tensor_slice(&idx, &s->idx, 0, m));
    TS_TRY(ts_tensor_slice(&xb, &s->xx, 0, m));
    TS_TRY(ts_tensor_slice(&tb, &s->tt, 0, m));
    TS_TRY(ts_gather_rows(e, &xb, x, &idx));
    for (int i = 0; i < m; i++)
        s->yy[i] = i < mc ? s->o.labels[s->idx_h[i]] : model->cfg.num_classes;
    TS_TRY(ts_fill(e, &tb, t));
    TS_TRY(ts_dit_forward(model, &xb, &tb, s->yy, m, &out));
    s->forwards += m;
    s->expert_forwards[k] += m;
    for (int half = 0; half < 2; half++) {
        int lo = half ? mc : 0, len = half ? m - mc : mc;
        if (len == 0)
            continue;
        TS_TRY(ts_tensor_slice(&part, &out, lo, len));
        TS_TRY(ts_tensor_slice(&pidx, &s->idx, lo, len));
        TS_TRY(ts_tensor_slice(&pw, &s->wk, lo, len));
        TS_TRY(ts_scatter_axpy_rows(e, v, &part, &pidx, &pw));
    }
    return TS_OK;
}

/* opts.record: sq[b] += w · ‖v_k(b)‖² for the m rows of one expert's answers vk (m, C, H, W). */
static int add_sq(ts_ensemble_t *s, const ts_tensor_t *vk, int m) {
    TS_TRY(to_host(s->vh, vk));
    for (int i = 0; i < m; i++) {
        const float *r = s->vh + (size_t)i * s->chw;
        double q = 0.0;
        for (int64_t j = 0; j < s->chw; j++)
            q += (double)r[j] * r[j];
        s->sq[s->idx_h[i]] += s->wk_h[i] * q;
    }
    return TS_OK;
}

/* sig[b] += w · v_k(b) for the m rows of expert k just run (idx_h, wk_h): its variance output,
 * the conditional rows of its last forward (all n in order when the confidence policy ran it,
 * else the m rows), or −1 for an expert without a learned variance. */
static int add_sigma(ts_ensemble_t *s, int k, int m) {
    ts_dit_t *model = &s->experts[k];
    int64_t chw = s->chw;
    if (!model->cfg.learn_sigma) {
        for (int i = 0; i < m; i++)
            for (int64_t j = 0; j < chw; j++)
                s->sig[(size_t)s->idx_h[i] * chw + j] -= s->wk_h[i];
        return TS_OK;
    }
    int all = s->o.policy == TS_POLICY_CONFIDENCE, rows = all ? s->n : m;
    ts_tensor_t sg, cond, host;
    TS_TRY(ts_dit_sigma(model, s->pairs * rows, &sg));
    TS_TRY(ts_tensor_slice(&cond, &sg, 0, rows));
    TS_TRY(ts_tensor_wrap(&host, s->sig_k, TS_F32, TS_CPU, cond.ndim, cond.shape));
    TS_TRY(ts_tensor_copy(&host, &cond));
    for (int i = 0; i < m; i++) {
        const float *src = s->sig_k + (size_t)(all ? s->idx_h[i] : i) * chw;
        float *dst = s->sig + (size_t)s->idx_h[i] * chw;
        for (int64_t j = 0; j < chw; j++)
            dst[j] += s->wk_h[i] * src[j];
    }
    return TS_OK;
}

int ts_ensemble_has_variance(const ts_ensemble_t *s) { return s && s->sig; }

int ts_ensemble_variance(void *ctx, ts_tensor_t *out) {
    ts_ensemble_t *s = ctx;
    if (!s || !s->sig || !out || ts_tensor_numel(out) != (int64_t)s->n * s->chw)
        return TS_EINVAL;
    ts_tensor_t host;
    TS_TRY(ts_tensor_wrap(&host, s->sig, TS_F32, TS_CPU, out->ndim, out->shape));
    return ts_tensor_copy(out, &host);
}

/* opts.record: spread[b] = (Σ_k w_k ‖v_k‖² − ‖v‖²) / chw = Σ_k w_k ‖v_k − v‖² / chw (the
 * weights of a sample sum to 1 and v = Σ_k w_k v_k). */
static int finish_spread(ts_ensemble_t *s, const ts_tensor_t *v) {
    if (s->o.eval || s->o.exact_guidance) {
        for (int b = 0; b < s->n; b++)
            s->spread[b] = NAN;
        return TS_OK;
    }
    TS_TRY(to_host(s->vh, v));
    for (int b = 0; b < s->n; b++) {
        const float *r = s->vh + (size_t)b * s->chw;
        double q = 0.0;
        for (int64_t j = 0; j < s->chw; j++)
            q += (double)r[j] * r[j];
        double d = (s->sq[b] - q) / (double)s->chw;
        s->spread[b] = d > 0.0 ? (float)d : 0.0f;
    }
    return TS_OK;
}

int ts_ensemble_velocity(void *ctx, const ts_tensor_t *x, float t, ts_tensor_t *v) {
    ts_ensemble_t *s = ctx;
    if (!s || !x || !v || (!s->experts && !s->o.eval))
        return TS_EINVAL;
    if (x->ndim != 4 || x->shape[0] != s->n || !ts_tensor_same_shape(x, v) ||
        x->shape[1] * x->shape[2] * x->shape[3] != s->chw)
        return TS_ESHAPE;
    ts_engine_t *e = s->eng;
    int n = s->n, K = s->K;
    if (t >= 1.0f || t > s->last_t)
        s->has_prev = s->has_held = 0; /* a new run starts from pure noise */
    s->last_t = t;
    s->evaluations++;
    ts_policy_t used = s->o.policy;
    double t_policy = ts_now_s();
    if (s->o.hold && s->has_held) {
        memcpy(s->w, s->held, (size_t)n * K * sizeof *s->w);
        if (s->o.record)
            memcpy(s->p, s->held, (size_t)n * K * sizeof *s->p);
        if (s->o.eval)
            for (size_t j = 0; j < (size_t)n * K; j++)
                s->scores[j] = s->held[j] > 0.0f ? logf(s->held[j]) : -INFINITY;
        goto weighted;
    }
    switch (s->o.policy) {
    case TS_POLICY_LEARNED: TS_TRY(score_router(s, x, t)); break;
    case TS_POLICY_CENTROID: TS_TRY(score_centroid(s, x, t, &used)); break;
    case TS_POLICY_CONFIDENCE: TS_TRY(score_confidence(s, x, t)); break;
    case TS_POLICY_UNIFORM:
    default: memset(s->w, 0, (size_t)n * K * sizeof *s->w); break;
    }
    if (s->o.exact_guidance) {
        /* the unconditional half's scores: the router asked without the labels (a label-aware
         * router reads them; another gives the same logits) or the policy's own scores, plus the
         * prior's null row */
        if (used == TS_POLICY_LEARNED) {
            s->router_calls++;
            TS_TRY(s->o.router(s->o.router_ctx, x, t, NULL, n, s->wu));
        } else {
            memcpy(s->wu, s->w, (size_t)n * K * sizeof *s->wu);
        }
        const float *null_row =
            s->o.log_prior ? s->o.log_prior + (size_t)s->experts[0].cfg.num_classes * K : NULL;
        for (int i = 0; null_row && i < n; i++)
            for (int k = 0; k < K; k++)
                s->wu[(size_t)i * K + k] += null_row[k];
    }
    if (s->o.log_prior)
        for (int i = 0; i < n; i++)
            for (int k = 0; k < K; k++)
                s->w[(size_t)i * K + k] += s->o.log_prior[(size_t)s->o.labels[i] * K + k];
    if (s->o.absent) {
        TS_TRY(route_around(s, t));
        for (int i = 0; s->o.exact_guidance && i < n; i++)
            for (int k = 0; k < K; k++)
                if (s->o.absent[k])
                    s->wu[(size_t)i * K + k] = -INFINITY;
    }
    if (s->o.record)
        softmax_rows(s->p, s->w, n, K);
    if (s->o.eval)
        memcpy(s->scores, s->w, (size_t)n * K * sizeof *s->w);
    TS_TRY(ts_route_weights(s->w, n, K, &s->o.select, t));
    if (s->o.exact_guidance)
        TS_TRY(ts_route_weights(s->wu, n, K, &s->o.select, t));
    if (s->o.hold && (s->o.hold != TS_HOLD_BELOW || t <= s->o.hold_t)) {
        if (s->o.hold == TS_HOLD_DRAW)
            draw_one(s->w, n, K, s->o.seeds);
        memcpy(s->held, s->w, (size_t)n * K * sizeof *s->w);
        s->has_held = 1;
    }
weighted:
    s->policy_s += ts_now_s() - t_policy;
    if (s->sig)
        memset(s->sig, 0, (size_t)(n * s->chw) * sizeof *s->sig);
    if (s->o.eval)
        TS_TRY(ts_ensemble__remote_combine(s, x, t, v));
    else
        TS_TRY(ts_zero(e, v));
    if (s->o.record)
        memset(s->sq, 0, (size_t)n * sizeof *s->sq);
    for (int k = 0; !s->o.eval && k < K; k++) {
        if (s->o.exact_guidance) {
            TS_TRY(run_expert_exact(s, k, x, t, v));
            continue;
        }
        int m = ts_ensemble__rows_for(s, k);
        if (m == 0)
            continue;
        TS_TRY(ts_ensemble__upload_rows(s, m));
        ts_tensor_t vk, idx, wk;
        TS_TRY(ts_tensor_slice(&vk, &s->vk, 0, m));
        TS_TRY(ts_tensor_slice(&idx, &s->idx, 0, m));
        TS_TRY(ts_tensor_slice(&wk, &s->wk, 0, m));
        if (s->o.policy == TS_POLICY_CONFIDENCE) {
            ts_tensor_t all;
            TS_TRY(ts_tensor_slice(&all, &s->vall, (int64_t)k * n, n));
            TS_TRY(ts_gather_rows(e, &vk, &all, &idx)); /* already computed */
        } else {
            TS_TRY(run_expert(s, k, x, t, m, &vk));
        }
        TS_TRY(ts_scatter_axpy_rows(e, v, &vk, &idx, &wk));
        if (s->o.record)
            TS_TRY(add_sq(s, &vk, m));
        if (s->sig)
            TS_TRY(add_sigma(s, k, m));
    }
    if (s->o.record)
        TS_TRY(finish_spread(s, v));
    if (s->o.policy == TS_POLICY_CENTROID) {
        size_t nv = (size_t)(s->chw * n);
        TS_TRY(to_host(s->xh, x));
        TS_TRY(to_host(s->vh, v));
        denoised(s->xhat, s->xh, s->vh, t, nv);
        TS_TRY(ts_partition_embed(s->o.partition, s->xhat, n, s->prev_emb));
        s->has_prev = 1;
    }
    if (s->o.record)
        TS_TRY(record_step(s, t, used));
    return TS_OK;
}
