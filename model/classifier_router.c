/*
 * classifier_router.c — a classifier (model/classifier.h) as the ensemble's router function
 * (ts_router_fn, model/ensemble.h): the time filled into a tensor of its own, the logits divided
 * by a temperature.
 */
#include <string.h>

#include "model/ensemble.h"

int ts_classifier_router_init(ts_classifier_router_t *r, ts_classifier_t *c, ts_engine_t *e,
                              int max_batch) {
    if (!r || !c || !e || max_batch < 1)
        return TS_EINVAL;
    memset(r, 0, sizeof *r);
    r->c = c;
    r->eng = e;
    r->max_batch = max_batch;
    r->temperature = 1.0f;
    return ts_tensor_alloc(&r->t, TS_F32, e->device, 1, TS_SHAPE(max_batch));
}

void ts_classifier_router_free(ts_classifier_router_t *r) {
    if (!r)
        return;
    ts_tensor_free(&r->t);
    memset(r, 0, sizeof *r);
}

int ts_classifier_router_fn(void *ctx, const ts_tensor_t *x, float t, const int32_t *labels, int B,
                            float *logits) {
    ts_classifier_router_t *r = ctx;
    if (!r || !r->c || B < 1 || B > r->max_batch)
        return TS_EINVAL;
    ts_tensor_t tb;
    TS_TRY(ts_tensor_slice(&tb, &r->t, 0, B));
    TS_TRY(ts_fill(r->eng, &tb, t));
    TS_TRY(ts_classifier_run_labels(r->c, x, &tb, labels, B, NULL, logits));
    if (r->temperature != 1.0f) {
        int K = ts_classifier_num_outputs(r->c);
        for (int64_t i = 0; i < (int64_t)B * K; i++)
            logits[i] /= r->temperature;
    }
    return TS_OK;
}
