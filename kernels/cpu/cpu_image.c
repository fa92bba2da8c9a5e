/*
 * cpu_image.c — the CPU backend's image ops (NCHW): im2col (fp32, or rounded to 16 bits for a
 * 16-bit product), a per-channel bias, GroupNorm
 * (optionally followed by SiLU in the same pass) and nearest ×2 upsampling.
 *
 * These are the pieces the VAE (model/vae.c) needs beside the GEMM: kernels/ops_image.c builds a
 * 2-D convolution from im2col and the backend's GEMM, so the multiply-adds run in OpenBLAS and
 * only the copying lives here. Every op writes disjoint outputs per work item, so its result does
 * not depend on the thread count. GroupNorm's statistics are sums in double, in element order,
 * over one group, then rounded once: the same bits whatever the batch or the threads.
 *
 * What it is not: a backward. The VAE here is inference only.
 */
#include <math.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/pool.h"
#include "kernels/math.h"

/* Below this many elements per thread an op runs on the caller alone (as GRAIN_ELEMS,
 * cpu_internal.h). */
#define IMG_GRAIN 32768

/* ---- im2col ---------------------------------------------------------------------------- */

typedef struct {
    float *col;
    const float *img;
    int64_t H, W, kh, kw, stride, pad_top, pad_left, Wo, oy0, rows;
} im2col_t;

/* col rows lo..hi, each one (channel, ky, kx) over the tile's rows·Wo output pixels */
static void im2col_range(void *arg, int64_t lo, int64_t hi) {
    const im2col_t *j = arg;
    const int64_t H = j->H, W = j->W, Wo = j->Wo, s = j->stride;
    for (int64_t r = lo; r < hi; r++) {
        int64_t kx = r % j->kw, ky = r / j->kw % j->kh, c = r / (j->kw * j->kh);
        const float *plane = j->img + c * H * W;
        float *dst = j->col + r * j->rows * Wo;
        for (int64_t t = 0; t < j->rows; t++, dst += Wo) {
            int64_t iy = (j->oy0 + t) * s - j->pad_top + ky;
            if (iy < 0 || iy >= H) {
                memset(dst, 0, (size_t)Wo * sizeof *dst);
                continue;
            }
            const float *src = plane + iy * W;
            int64_t ix0 = kx - j->pad_left; /* ix = ox·s + ix0 */
            if (s == 1 && ix0 >= 0 && Wo - 1 + ix0 < W) {
                memcpy(dst, src + ix0, (size_t)Wo * sizeof *dst);
                continue;
            }
            for (int64_t ox = 0; ox < Wo; ox++) {
                int64_t ix = ox * s + ix0;
                dst[ox] = ix >= 0 && ix < W ? src[ix] : 0.0f;
            }
        }
    }
}

int ts_cpu_im2col(ts_engine_t *e, float *col, const float *img, int64_t C, int64_t H, int64_t W,
                  int64_t kh, int64_t kw, int64_t stride, int64_t pad_top, int64_t pad_left,
                  int64_t Wo, int64_t oy0, int64_t rows) {
    im2col_t j = {col, img, H, W, kh, kw, stride, pad_top, pad_left, Wo, oy0, rows};
    int64_t per_row = rows * Wo;
    ts_pool_for(e->pool, C * kh * kw, 1 + IMG_GRAIN / (per_row + 1), im2col_range, &j);
    return TS_OK;
}

/* ---- im2col in 16 bits ----------------------------------------------------------------- */

typedef struct {
    uint16_t *col;
    const float *img;
    int bf16;
    int64_t H, W, kh, kw, stride, pad_top, pad_left, Wo, oy0, rows;
} im2col_lp_t;

/* col rows lo..hi, each element by ts_im2col_lp_elem (the GPU's kernel calls the same) */
static void im2col_lp_range(void *arg, int64_t lo, int64_t hi) {
    const im2col_lp_t *j = arg;
    for (int64_t r = lo; r < hi; r++) {
        uint16_t *dst = j->col + r * j->rows * j->Wo;
        for (int64_t t = 0; t < j->rows; t++)
            for (int64_t ox = 0; ox < j->Wo; ox++)
                *dst++ = ts_im2col_lp_elem(j->img, j->bf16, r, t, ox, j->H, j->W, j->kh, j->kw,
                                           j->stride, j->pad_top, j->pad_left, j->oy0);
    }
}

int ts_cpu_im2col_lp(ts_engine_t *e, uint16_t *col, ts_dtype_t lp, const float *img, int64_t C,
                     int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t stride, int64_t pad_top,
                     int64_t pad_left, int64_t Wo, int64_t oy0, int64_t rows) {
    im2col_lp_t j = {col,    img,     lp == TS_BF16, H,  W,   kh,  kw,
                     stride, pad_top, pad_left,      Wo, oy0, rows};
    int64_t per_row = rows * Wo;
    ts_pool_for(e->pool, C * kh * kw, 1 + IMG_GRAIN / (per_row + 1), im2col_lp_range, &j);
    return TS_OK;
}

/* ---- per-channel bias ------------------------------------------------------------------ */

typedef struct {
    float *x;
    const float *bias;
    int64_t C, S;
} chan_bias_t;

/* planes lo..hi of x (B·C planes of S) */
static void chan_bias_range(void *arg, int64_t lo, int64_t hi) {
    const chan_bias_t *j = arg;
    const int64_t S = j->S;
    for (int64_t p = lo; p < hi; p++) {
        float *x = j->x + p * S;
        const float b = j->bias[p % j->C];
        for (int64_t i = 0; i < S; i++)
            x[i] += b;
    }
}

int ts_cpu_add_channel_bias(ts_engine_t *e, float *x, const float *bias, int64_t B, int64_t C,
                            int64_t S) {
    chan_bias_t j = {x, bias, C, S};
    ts_pool_for(e->pool, B * C, 1 + IMG_GRAIN / (S + 1), chan_bias_range, &j);
    return TS_OK;
}

/* ---- GroupNorm ------------------------------------------------------------------------- */

typedef struct {
    float *out;
    const float *inp, *weight, *bias;
    int64_t C, S, G;
    float eps;
    int silu;
} groupnorm_t;

/* groups lo..hi of the B·G groups; group (b, g) is channels [g·C/G, (g+1)·C/G) of sample b,
 * contiguous in NCHW: n = C/G · S values. mean and variance (biased, as torch) in double. */
static void groupnorm_range(void *arg, int64_t lo, int64_t hi) {
    const groupnorm_t *j = arg;
    const int64_t cg = j->C / j->G, S = j->S, n = cg * S;
    for (int64_t q = lo; q < hi; q++) {
        const float *x = j->inp + q * n;
        float *y = j->out + q * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            sum += (double)x[i];
        double mean = sum / (double)n, ss = 0.0;
        for (int64_t i = 0; i < n; i++) {
            double d = (double)x[i] - mean;
            ss += d * d;
        }
        double rstd = ts_groupnorm_rstd(ss, n, j->eps);
        /* kernels/math.h: y = (x − m)·a + b, the coefficients rounded once per channel */
        ts_groupnorm_apply(y, x, j->weight, j->bias, q % j->G * cg, cg, S, 0, n, mean, rstd,
                           j->silu, 0, 1);
    }
}

int ts_cpu_groupnorm_forward(ts_engine_t *e, float *out, const float *inp, const float *weight,
                             const float *bias, int64_t B, int64_t C, int64_t S, int64_t G,
                             float eps, int silu) {
    groupnorm_t j = {out, inp, weight, bias, C, S, G, eps, silu};
    ts_pool_for(e->pool, B * G, 1 + IMG_GRAIN / (C / G * S + 1), groupnorm_range, &j);
    return TS_OK;
}

/* ---- nearest ×2 upsampling ------------------------------------------------------------- */

typedef struct {
    float *out;
    const float *inp;
    int64_t H, W;
} upsample_t;

/* input rows lo..hi of the R·H rows; each becomes two output rows of 2W */
static void upsample_range(void *arg, int64_t lo, int64_t hi) {
    const upsample_t *j = arg;
    const int64_t W = j->W;
    for (int64_t r = lo; r < hi; r++) {
        const float *src = j->inp + r * W;
        float *dst = j->out + r * 4 * W; /* row r = (plane, y) → output rows 2y, 2y + 1 */
        for (int64_t x = 0; x < W; x++)
            dst[2 * x] = dst[2 * x + 1] = src[x];
        memcpy(dst + 2 * W, dst, (size_t)(2 * W) * sizeof *dst);
    }
}

int ts_cpu_upsample_nearest2x(ts_engine_t *e, float *out, const float *inp, int64_t R, int64_t H,
                              int64_t W) {
    upsample_t j = {out, inp, H, W};
    ts_pool_for(e->pool, R * H, 1 + IMG_GRAIN / (4 * W + 1), upsample_range, &j);
    return TS_OK;
}
