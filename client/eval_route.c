/*
 * eval_route.c — the routing along t of a `tessera eval` entry: while the entry samples,
 * ts_eval_route_chunk adds each chunk's routing record (model/ensemble.h) to per-evaluation sums
 * (route_diag_t, eval_internal.h), which eval_report.c turns into means for the JSON and the
 * report's figures.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/eval_internal.h"

int ts_eval_route_alloc(route_diag_t *r, int cap, int n) {
    memset(r, 0, sizeof *r);
    r->cap = cap;
    r->t = calloc((size_t)cap, sizeof *r->t);
    r->entropy = calloc((size_t)cap, sizeof *r->entropy);
    r->top_p = calloc((size_t)cap, sizeof *r->top_p);
    r->spread = calloc((size_t)cap, sizeof *r->spread);
    r->switches = calloc((size_t)cap, sizeof *r->switches);
    r->count = calloc((size_t)cap, sizeof *r->count);
    r->spread_count = calloc((size_t)cap, sizeof *r->spread_count);
    r->prev = calloc((size_t)n, sizeof *r->prev);
    return r->t && r->entropy && r->top_p && r->spread && r->switches && r->count &&
                   r->spread_count && r->prev
               ? TS_OK
               : TS_ENOMEM;
}

void ts_eval_route_free(route_diag_t *r) {
    free(r->t), free(r->entropy), free(r->top_p), free(r->spread), free(r->switches);
    free(r->count), free(r->spread_count), free(r->prev);
    memset(r, 0, sizeof *r);
}

/* ts_local_gen_t.on_chunk: adds one chunk's record (samples start…start+n) to the sums. */
void ts_eval_route_chunk(void *ctx, const ts_ensemble_t *ens, int start) {
    route_diag_t *r = ctx;
    int K = ens->K;
    for (int j = 0; j < ens->n_steps && j < r->cap; j++) {
        const ts_route_step_t *st = &ens->steps[j];
        r->t[j] = st->t;
        r->n_eval = j + 1 > r->n_eval ? j + 1 : r->n_eval;
        for (int b = 0; b < ens->n; b++) {
            const float *p = st->p + (size_t)b * K, *w = st->w + (size_t)b * K;
            double h = 0.0, top = 0.0;
            int best = 0;
            for (int k = 0; k < K; k++) {
                h -= p[k] > 0.0f ? p[k] * log2(p[k]) : 0.0;
                top = p[k] > top ? p[k] : top;
                best = w[k] > w[best] ? k : best;
            }
            r->entropy[j] += h;
            r->top_p[j] += top;
            r->count[j]++;
            if (isfinite(st->spread[b])) {
                r->spread[j] += st->spread[b];
                r->spread_count[j]++;
            }
            if (j > 0)
                r->switches[j] += best != r->prev[start + b];
            r->prev[start + b] = best;
        }
    }
}
