/*
 * cpu_elem.c — the CPU backend's elementwise ops (fill, axpy, scale, add, the broadcast add and
 * its column sums) and activations (GELU, SiLU). Each output element is written by one thread,
 * and the column sums add their rows in order, so no result depends on the thread count.
 */
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/vec.h"
#include "kernels/math.h"

/* ---- elementwise ----------------------------------------------------------------------- */

typedef struct {
    float *out;
    float *y;
    const float *a, *b, *x;
    float alpha, beta;
    int64_t S;
    const ts_cpu_vec_t *vec;
} ew_t;

int ts_cpu_memzero(ts_engine_t *e, void *p, size_t bytes) {
    memset(p, 0, bytes);
    return TS_OK;
}

static void fill_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    float *out = j->out, v = j->alpha;
    for (int64_t i = lo; i < hi; i++)
        out[i] = v;
}

int ts_cpu_fill(ts_engine_t *e, float *t, int64_t n, float v) {
    ew_t j = {.out = t, .alpha = v};
    parallel(e, n, GRAIN_ELEMS, fill_range, &j);
    return TS_OK;
}

static void axpy_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    j->vec->axpy(j->y + lo, j->alpha, j->x + lo, hi - lo);
}

int ts_cpu_axpy(ts_engine_t *e, float *y, float alpha, const float *x, int64_t n) {
    ew_t j = {.y = y, .x = x, .alpha = alpha, .vec = e->vec};
    parallel(e, n, GRAIN_ELEMS, axpy_range, &j);
    return TS_OK;
}

static void scale_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    float *y = j->y, alpha = j->alpha;
    for (int64_t i = lo; i < hi; i++)
        y[i] *= alpha;
}

int ts_cpu_scale(ts_engine_t *e, float *t, float alpha, int64_t n) {
    ew_t j = {.y = t, .alpha = alpha};
    parallel(e, n, GRAIN_ELEMS, scale_range, &j);
    return TS_OK;
}

static void affine_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    float *y = j->y, alpha = j->alpha, beta = j->beta;
    for (int64_t i = lo; i < hi; i++)
        y[i] = alpha * y[i] + beta;
}

int ts_cpu_affine(ts_engine_t *e, float *t, float alpha, float beta, int64_t n) {
    ew_t j = {.y = t, .alpha = alpha, .beta = beta};
    parallel(e, n, GRAIN_ELEMS, affine_range, &j);
    return TS_OK;
}

static void add_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    float *out = j->out;
    const float *a = j->a, *b = j->b;
    for (int64_t i = lo; i < hi; i++)
        out[i] = a[i] + b[i];
}

int ts_cpu_add(ts_engine_t *e, float *out, const float *a, const float *b, int64_t n) {
    ew_t j = {.out = out, .a = a, .b = b};
    parallel(e, n, GRAIN_ELEMS, add_range, &j);
    return TS_OK;
}

static void add_bcast_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    int64_t S = j->S;
    const float *b = j->b;
    for (int64_t r = lo; r < hi; r++) {
        float *o = j->out + r * S;
        const float *x = j->x + r * S;
        for (int64_t i = 0; i < S; i++)
            o[i] = x[i] + b[i];
    }
}

int ts_cpu_add_bcast_forward(ts_engine_t *e, float *out, const float *x, const float *b,
                             int64_t rows, int64_t S) {
    ew_t j = {.out = out, .x = x, .b = b, .S = S};
    parallel(e, rows, 1 + GRAIN_ELEMS / S, add_bcast_range, &j);
    return TS_OK;
}

typedef struct {
    float *out;
    const float *inp;
    int64_t rows, C;
} colsum_t;

/* out[c] (+)= Σ_r inp[r, c] for the columns [lo, hi); rows in order, so deterministic. */
static void colsum_range(void *arg, int64_t lo, int64_t hi) {
    colsum_t *j = arg;
    float *out = j->out;
    int64_t rows = j->rows, C = j->C;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = j->inp + r * C;
        for (int64_t c = lo; c < hi; c++)
            out[c] += row[c];
    }
}

int ts_cpu_add_bcast_backward(ts_engine_t *e, float *dx, float *db, const float *dout, int64_t rows,
                              int64_t S) {
    if (dx)
        ts_cpu_axpy(e, dx, 1.0f, dout, rows * S);
    if (db) {
        colsum_t j = {db, dout, rows, S};
        parallel(e, S, 1 + GRAIN_ELEMS / (rows + 1), colsum_range, &j);
    }
    return TS_OK;
}

int ts_cpu_sum_rows(ts_engine_t *e, float *out, const float *inp, int64_t rows, int64_t C) {
    memset(out, 0, (size_t)C * sizeof *out);
    colsum_t j = {out, inp, rows, C};
    parallel(e, C, 1 + GRAIN_ELEMS / (rows + 1), colsum_range, &j);
    return TS_OK;
}

/* ---- activations ----------------------------------------------------------------------- */

typedef struct {
    float *out; /* the output; dinp in a backward */
    const float *inp, *dout;
    const ts_cpu_vec_t *vec;
} act_t;

static void gelu_fwd_range(void *arg, int64_t lo, int64_t hi) {
    act_t *j = arg;
    j->vec->gelu(j->out + lo, j->inp + lo, hi - lo);
}

static void gelu_bwd_range(void *arg, int64_t lo, int64_t hi) {
    act_t *j = arg;
    j->vec->gelu_backward(j->out + lo, j->dout + lo, j->inp + lo, hi - lo);
}

static void silu_fwd_range(void *arg, int64_t lo, int64_t hi) {
    act_t *j = arg;
    float *out = j->out;
    const float *inp = j->inp;
    for (int64_t i = lo; i < hi; i++)
        out[i] = ts_silu(inp[i]);
}

static void silu_bwd_range(void *arg, int64_t lo, int64_t hi) {
    act_t *j = arg;
    float *dinp = j->out;
    const float *dout = j->dout, *inp = j->inp;
    for (int64_t i = lo; i < hi; i++)
        dinp[i] += dout[i] * ts_silu_grad(inp[i]);
}

/* Vectorised, GELU and SiLU still cost several times a plain load/store per element: a smaller
 * grain (ACT_GRAIN). */
int ts_cpu_gelu_forward(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    act_t j = {out, inp, NULL, e->vec};
    parallel(e, n, ACT_GRAIN, gelu_fwd_range, &j);
    return TS_OK;
}

int ts_cpu_gelu_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                         int64_t n) {
    act_t j = {dinp, inp, dout, e->vec};
    parallel(e, n, ACT_GRAIN, gelu_bwd_range, &j);
    return TS_OK;
}

int ts_cpu_silu_forward(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    act_t j = {out, inp, NULL};
    parallel(e, n, ACT_GRAIN, silu_fwd_range, &j);
    return TS_OK;
}

int ts_cpu_silu_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                         int64_t n) {
    act_t j = {dinp, inp, dout};
    parallel(e, n, ACT_GRAIN, silu_bwd_range, &j);
    return TS_OK;
}
