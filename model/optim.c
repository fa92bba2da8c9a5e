#include "model/optim.h"

#include <math.h>

float ts_optim_lr(float lr, int warmup, int64_t total_steps, int64_t s) {
    if (warmup > 0 && s < warmup)
        return lr * (float)(s + 1) / (float)warmup;
    if (total_steps > warmup) {
        double p = (double)(s - warmup) / (double)(total_steps - warmup);
        p = p > 1.0 ? 1.0 : p;
        return (float)(lr * 0.5 * (1.0 + cos(3.14159265358979323846 * p)));
    }
    return lr;
}

int ts_optim_step(ts_engine_t *e, const ts_optim_slab_t *slabs, int n, const ts_adamw_t *hp,
                  int64_t t, float clip, ts_tensor_t *sumsq, float *norm_out) {
    return ts_optim_step_scaled(e, slabs, n, hp, t, clip, 1.0f, sumsq, norm_out);
}

int ts_optim_step_scaled(ts_engine_t *e, const ts_optim_slab_t *slabs, int n, const ts_adamw_t *hp,
                         int64_t t, float clip, float unscale, ts_tensor_t *sumsq,
                         float *norm_out) {
    if (!e || !slabs || n < 1 || !hp || !sumsq || !(unscale > 0.0f))
        return TS_EINVAL;
    float total = 0.0f; /* summed in slab order, in float: the trainers' arithmetic */
    for (int i = 0; i < n; i++) {
        float ss;
        TS_TRY(ts_sumsq(e, sumsq, slabs[i].grad));
        TS_TRY(ts_tensor_item(e, sumsq, &ss));
        total = i ? total + ss : ss;
    }
    float norm = sqrtf(total) * unscale; /* unscale 1: the same bits as without it */
    if (norm_out)
        *norm_out = norm;
    if (!isfinite(norm))
        return TS_ENONFINITE;
    float scale = ((clip > 0.0f && norm > clip) ? clip / norm : 1.0f) * unscale;
    for (int i = 0; i < n; i++)
        TS_TRY(
            ts_adamw_step(e, slabs[i].param, slabs[i].grad, slabs[i].m, slabs[i].v, hp, t, scale));
    return TS_OK;
}
