/*
 * ensemble_internal.h — what the files of the ensemble share (ensemble.c, ensemble_remote.c,
 * experts.c): the functions one of them calls in another, and a small copy helper.
 */
#ifndef TS_MODEL_ENSEMBLE_INTERNAL_H
#define TS_MODEL_ENSEMBLE_INTERNAL_H

#include "model/ensemble.h"

/* Copies a device tensor of count floats into host memory. */
static inline int to_host(float *dst, const ts_tensor_t *src) {
    ts_tensor_t h;
    TS_TRY(ts_tensor_wrap(&h, dst, TS_F32, TS_CPU, src->ndim, src->shape));
    return ts_tensor_copy(&h, src);
}

/* ---- ensemble.c ---- */

/* Uploads idx_h[0..m) and wk_h[0..m) into the device tensors idx and wk. */
int ts_ensemble__upload_rows(ts_ensemble_t *s, int m);
/* Selects the rows with a non-zero weight for expert k into idx_h / wk_h; returns their count. */
int ts_ensemble__rows_for(ts_ensemble_t *s, int k);
/* Where expert k is asked for flow time t: its objective, and for a DDPM one the time its network
 * takes (its step / 1000), ᾱ there and the scale of x_t (model/objective.h); a velocity expert
 * is asked at (x_t, t) as it is. */
typedef struct ts_ensemble_ask {
    ts_objective_t obj;
    float t;
    double abar, scale;
} ts_ensemble_ask_t;
ts_ensemble_ask_t ts_ensemble__ask(const ts_ensemble_t *s, int k, float t);

/* ---- ensemble_remote.c ---- */

/* v = Σ_k w_k · v_k with every expert's answer computed by opts.eval (see ensemble_remote.c). */
int ts_ensemble__remote_combine(ts_ensemble_t *s, const ts_tensor_t *x, float t, ts_tensor_t *v);

#endif
