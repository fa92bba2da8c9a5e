/*
 * cpu_rows.c — the CPU backend's row ops: LayerNorm (alone and with adaLN's modulate), softmax,
 * and adaLN's modulate and gated residual, whose rows take their shift, scale or gate from their
 * sample's chunk of mod. A row is computed by one thread, in element order, so its bits do not
 * depend on the thread count.
 */
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/row_max.h"
#include "kernels/cpu/vec.h"
#include "kernels/math.h"

/* Softmax: the row sums this many rows at a time. */
#define SUM_ROWS 8

/* ---- row ops: LayerNorm, softmax ------------------------------------------------------- */

typedef struct {
    float *out, *mean, *rstd, *dinp;
    const float *inp, *dout, *y, *cmean, *crstd;
    int64_t C;
    float scale;
    int accumulate;
    /* LayerNorm + modulate: mod_out (B, T, C) from the chunks shift_idx, scale_idx of mod */
    float *mod_out;
    const float *mod;
    int64_t T, M;
    int shift_idx, scale_idx;
    const ts_cpu_vec_t *vec;
} row_t;

/* Rows lo..hi: per row the sum in element order, the mean, the sum of squared deviations in
 * element order, rstd, then (x − mean)·rstd — several rows' sums side by side (vec.c). With
 * mod_out, each row is modulated by its sample's shift and scale in the same pass. */
static void layernorm_fwd_range(void *arg, int64_t lo, int64_t hi) {
    row_t *j = arg;
    int64_t C = j->C;
    for (int64_t r = lo; r < hi;) {
        int64_t end = hi; /* rows of one sample: one shift and scale */
        const float *shift = NULL, *scale = NULL;
        if (j->mod_out) {
            int64_t b = r / j->T;
            end = (b + 1) * j->T < hi ? (b + 1) * j->T : hi;
            shift = j->mod + b * j->M * C + j->shift_idx * C;
            scale = j->mod + b * j->M * C + j->scale_idx * C;
        }
        j->vec->layernorm(j->out ? j->out + r * C : NULL, j->mean ? j->mean + r : NULL,
                          j->rstd ? j->rstd + r : NULL, j->mod_out ? j->mod_out + r * C : NULL,
                          j->inp + r * C, shift, scale, end - r, C);
        r = end;
    }
}

int ts_cpu_layernorm_forward(ts_engine_t *e, float *out, float *mean, float *rstd, const float *inp,
                             int64_t rows, int64_t C) {
    row_t j = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .C = C, .vec = e->vec};
    parallel(e, rows, 1 + GRAIN_ELEMS / (4 * C), layernorm_fwd_range, &j);
    return TS_OK;
}

int ts_cpu_layernorm_modulate_forward(ts_engine_t *e, float *ln, float *mean, float *rstd,
                                      float *out, const float *inp, const float *mod, int64_t B,
                                      int64_t T, int64_t C, int64_t M, int shift_idx,
                                      int scale_idx) {
    row_t j = {.out = ln,
               .mean = mean,
               .rstd = rstd,
               .inp = inp,
               .C = C,
               .mod_out = out,
               .mod = mod,
               .T = T,
               .M = M,
               .shift_idx = shift_idx,
               .scale_idx = scale_idx,
               .vec = e->vec};
    parallel(e, B * T, 1 + GRAIN_ELEMS / (4 * C), layernorm_fwd_range, &j);
    return TS_OK;
}

static void layernorm_bwd_range(void *arg, int64_t lo, int64_t hi) {
    row_t *j = arg;
    int64_t C = j->C;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->inp + r * C;
        const float *dy = j->dout + r * C;
        float *dx = j->dinp + r * C;
        float m = j->cmean[r], rs = j->crstd[r];
        float sdy = 0.0f, sdyx = 0.0f;
        for (int64_t i = 0; i < C; i++) {
            float xhat = (x[i] - m) * rs;
            sdy += dy[i];
            sdyx += dy[i] * xhat;
        }
        float mdy = sdy / (float)C, mdyx = sdyx / (float)C;
        for (int64_t i = 0; i < C; i++)
            dx[i] += ts_ln_grad(dy[i], (x[i] - m) * rs, rs, mdy, mdyx);
    }
}

int ts_cpu_layernorm_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                              const float *mean, const float *rstd, int64_t rows, int64_t C) {
    row_t j = {.dinp = dinp, .dout = dout, .inp = inp, .cmean = mean, .crstd = rstd, .C = C};
    parallel(e, rows, 1 + GRAIN_ELEMS / (4 * C), layernorm_bwd_range, &j);
    return TS_OK;
}

/* s[k] = Σ_i rows[k·C + i] for k < n ≤ SUM_ROWS, each sum in its row's element order (the order
 * is the result's rounding). One row's sum is a chain of dependent additions; a full block runs
 * SUM_ROWS chains side by side. */
static void row_sums(float *s, const float *rows, int64_t n, int64_t C) {
    for (int64_t k = 0; k < n; k++)
        s[k] = 0.0f;
    if (n == SUM_ROWS) {
        for (int64_t i = 0; i < C; i++)
            for (int k = 0; k < SUM_ROWS; k++)
                s[k] += rows[k * C + i];
    } else {
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < C; i++)
                s[k] += rows[k * C + i];
    }
}

/* Blocks of SUM_ROWS rows: each row's max and e^(x − max), then the block's row sums, then each
 * row scaled by 1 / its sum. Per row the arithmetic is that of the plain loop: max, e^(x − max),
 * the sum in element order, × 1/sum. */
static void softmax_fwd_range(void *arg, int64_t lo, int64_t hi) {
    row_t *j = arg;
    int64_t C = j->C;
    for (int64_t r0 = lo; r0 < hi; r0 += SUM_ROWS) {
        int64_t n = hi - r0 < SUM_ROWS ? hi - r0 : SUM_ROWS;
        float *o = j->out + r0 * C;
        for (int64_t k = 0; k < n; k++) {
            const float *x = j->inp + (r0 + k) * C;
            float *ok = o + k * C;
            float mx = ts_row_max(x, C);
            for (int64_t i = 0; i < C; i++)
                ok[i] = ts_expf(x[i] - mx);
        }
        float s[SUM_ROWS];
        row_sums(s, o, n, C);
        for (int64_t k = 0; k < n; k++) {
            float *ok = o + k * C;
            float inv = 1.0f / s[k];
            for (int64_t i = 0; i < C; i++)
                ok[i] *= inv;
        }
    }
}

int ts_cpu_softmax_forward(ts_engine_t *e, float *out, const float *inp, int64_t rows, int64_t C) {
    row_t j = {.out = out, .inp = inp, .C = C};
    parallel(e, rows, 1 + ACT_GRAIN / C, softmax_fwd_range, &j);
    return TS_OK;
}

static void softmax_bwd_range(void *arg, int64_t lo, int64_t hi) {
    row_t *j = arg;
    int64_t C = j->C;
    for (int64_t r = lo; r < hi; r++) {
        const float *y = j->y + r * C;
        const float *dy = j->dout + r * C;
        float *dx = j->dinp + r * C;
        float dot = 0.0f;
        for (int64_t i = 0; i < C; i++)
            dot += dy[i] * y[i];
        if (j->accumulate)
            for (int64_t i = 0; i < C; i++)
                dx[i] += j->scale * ts_softmax_grad(y[i], dy[i], dot);
        else
            for (int64_t i = 0; i < C; i++)
                dx[i] = j->scale * ts_softmax_grad(y[i], dy[i], dot);
    }
}

int ts_cpu_softmax_backward(ts_engine_t *e, float *dinp, const float *dout, const float *out,
                            int64_t rows, int64_t C, float scale, int accumulate) {
    row_t j = {
        .dinp = dinp, .dout = dout, .y = out, .C = C, .scale = scale, .accumulate = accumulate};
    parallel(e, rows, 1 + GRAIN_ELEMS / (4 * C), softmax_bwd_range, &j);
    return TS_OK;
}

/* ---- adaLN: modulate and gated residual ------------------------------------------------ */

typedef struct {
    float *out, *dx, *dmod, *dres, *dy;
    const float *x, *mod, *dout, *res, *y;
    int64_t T, C, M;
    int i0, i1; /* chunk indices: shift/scale, or gate */
    const ts_cpu_vec_t *vec;
} ada_t;

/* The rows [r, end) of (B·T, C) that belong to r's sample, end ≤ hi; *b = that sample. */
static int64_t sample_end(const ada_t *j, int64_t r, int64_t hi, int64_t *b) {
    *b = r / j->T;
    return (*b + 1) * j->T < hi ? (*b + 1) * j->T : hi;
}

static void modulate_fwd_range(void *arg, int64_t lo, int64_t hi) {
    ada_t *j = arg;
    int64_t C = j->C, b;
    for (int64_t r = lo, end; r < hi; r = end) {
        end = sample_end(j, r, hi, &b);
        const float *shift = j->mod + b * j->M * C + j->i0 * C;
        const float *scale = j->mod + b * j->M * C + j->i1 * C;
        j->vec->modulate(j->out + r * C, j->x + r * C, shift, scale, end - r, C);
    }
}

int ts_cpu_modulate_forward(ts_engine_t *e, float *out, const float *x, const float *mod, int64_t B,
                            int64_t T, int64_t C, int64_t M, int shift_idx, int scale_idx) {
    ada_t j = {.out = out,
               .x = x,
               .mod = mod,
               .T = T,
               .C = C,
               .M = M,
               .i0 = shift_idx,
               .i1 = scale_idx,
               .vec = e->vec};
    parallel(e, B * T, 1 + GRAIN_ELEMS / C, modulate_fwd_range, &j);
    return TS_OK;
}

/* One sample per item: the dmod rows of a sample are written by one thread only. */
static void modulate_bwd_range(void *arg, int64_t lo, int64_t hi) {
    ada_t *j = arg;
    int64_t T = j->T, C = j->C;
    for (int64_t b = lo; b < hi; b++) {
        const float *scale = j->mod + b * j->M * C + j->i1 * C;
        float *dshift = j->dmod ? j->dmod + b * j->M * C + j->i0 * C : NULL;
        float *dscale = j->dmod ? j->dmod + b * j->M * C + j->i1 * C : NULL;
        for (int64_t t = 0; t < T; t++) {
            const float *dy = j->dout + (b * T + t) * C;
            const float *x = j->x + (b * T + t) * C;
            if (j->dx) {
                float *dx = j->dx + (b * T + t) * C;
                for (int64_t c = 0; c < C; c++)
                    dx[c] += dy[c] * (1.0f + scale[c]);
            }
            if (dshift)
                for (int64_t c = 0; c < C; c++) {
                    dshift[c] += dy[c];
                    dscale[c] += dy[c] * x[c];
                }
        }
    }
}

int ts_cpu_modulate_backward(ts_engine_t *e, float *dx, float *dmod, const float *dout,
                             const float *x, const float *mod, int64_t B, int64_t T, int64_t C,
                             int64_t M, int shift_idx, int scale_idx) {
    ada_t j = {.dx = dx,
               .dmod = dmod,
               .dout = dout,
               .x = x,
               .mod = mod,
               .T = T,
               .C = C,
               .M = M,
               .i0 = shift_idx,
               .i1 = scale_idx};
    parallel(e, B, 1, modulate_bwd_range, &j);
    return TS_OK;
}

static void gate_fwd_range(void *arg, int64_t lo, int64_t hi) {
    ada_t *j = arg;
    int64_t C = j->C, b;
    for (int64_t r = lo, end; r < hi; r = end) {
        end = sample_end(j, r, hi, &b);
        const float *gate = j->mod + b * j->M * C + j->i0 * C;
        j->vec->gate_residual(j->out + r * C, j->res + r * C, j->y + r * C, gate, end - r, C);
    }
}

int ts_cpu_gate_residual_forward(ts_engine_t *e, float *out, const float *res, const float *y,
                                 const float *mod, int64_t B, int64_t T, int64_t C, int64_t M,
                                 int gate_idx) {
    ada_t j = {.out = out,
               .res = res,
               .y = y,
               .mod = mod,
               .T = T,
               .C = C,
               .M = M,
               .i0 = gate_idx,
               .vec = e->vec};
    parallel(e, B * T, 1 + GRAIN_ELEMS / C, gate_fwd_range, &j);
    return TS_OK;
}

static void gate_bwd_range(void *arg, int64_t lo, int64_t hi) {
    ada_t *j = arg;
    int64_t T = j->T, C = j->C;
    for (int64_t b = lo; b < hi; b++) {
        const float *gate = j->mod + b * j->M * C + j->i0 * C;
        float *dgate = j->dmod ? j->dmod + b * j->M * C + j->i0 * C : NULL;
        for (int64_t t = 0; t < T; t++) {
            int64_t off = (b * T + t) * C;
            const float *dout = j->dout + off, *y = j->y + off;
            float *dres = j->dres ? j->dres + off : NULL, *dy = j->dy ? j->dy + off : NULL;
            if (dres)
                for (int64_t c = 0; c < C; c++)
                    dres[c] += dout[c];
            if (dy)
                for (int64_t c = 0; c < C; c++)
                    dy[c] += gate[c] * dout[c];
            if (dgate)
                for (int64_t c = 0; c < C; c++)
                    dgate[c] += dout[c] * y[c];
        }
    }
}

int ts_cpu_gate_residual_backward(ts_engine_t *e, float *dres, float *dy, float *dmod,
                                  const float *dout, const float *y, const float *mod, int64_t B,
                                  int64_t T, int64_t C, int64_t M, int gate_idx) {
    ada_t j = {.dres = dres,
               .dy = dy,
               .dmod = dmod,
               .dout = dout,
               .y = y,
               .mod = mod,
               .T = T,
               .C = C,
               .M = M,
               .i0 = gate_idx};
    parallel(e, B, 1, gate_bwd_range, &j);
    return TS_OK;
}
