/*
 * vec.c — the CPU backend's hot loops (kernels/cpu/vec.h), compiled once per instruction set.
 *
 * kernels/CMakeLists.txt builds this file three times, defining TS_VEC_ISA as avx512, avx2 or
 * base and passing -mavx512f, -mavx2 (each with -mfma, for the register tiles' (kernels/cpu/att_tile.c, lin_tile.c) explicit
 * fused multiply-adds; -ffp-contract=off keeps these loops unfused) or nothing; each build
 * defines one table,
 * ts_cpu_vec_<isa>. The base build also defines ts_cpu_vec_pick (TS_VEC_PICK), which chooses
 * among the three at engine start. Every build gets -fno-math-errno: sqrtf (AdamW) then
 * vectorises — its result is the correctly rounded root either way; only errno is not set, and
 * the argument is never negative here.
 *
 * The loops are plain `for` loops that gcc vectorises at the build's width; their pointers are
 * arguments, never re-read from a struct (see kernels/cpu/cpu_ops.c). The same bits in every build
 * is the rule (vec.h says why it holds); the per-loop comments say what is computed.
 */
#include "kernels/cpu/vec.h"

#include "kernels/math.h"

#ifndef TS_VEC_ISA
#error "vec.c is built with -DTS_VEC_ISA=avx512|avx2|base (kernels/CMakeLists.txt)"
#endif

#define VEC_CAT2(a, b) a##b
#define VEC_CAT(a, b) VEC_CAT2(a, b)
#define VEC_STR2(a) #a
#define VEC_STR(a) VEC_STR2(a)

/* LayerNorm's row statistics run this many rows side by side: one row's sum is a chain of
 * dependent additions (4 cycles each), eight chains keep the adder busy. */
#define LN_ROWS 8

static void gelu(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = ts_gelu(inp[i]);
}

static void gelu_backward(float *dinp, const float *dout, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dinp[i] += dout[i] * ts_gelu_grad(inp[i]);
}

static void bias_act(float *c, float *act, const float *bias, int64_t M, int64_t N, int64_t ld) {
    for (int64_t r = 0; r < M; r++) {
        float *cr = c + r * ld;
        float *ar = act ? act + r * ld : NULL;
        if (bias && ar == cr) /* GELU in place: one store per element */
            for (int64_t i = 0; i < N; i++)
                cr[i] = ts_gelu(cr[i] + bias[i]);
        else if (bias && ar)
            for (int64_t i = 0; i < N; i++) {
                float v = cr[i] + bias[i];
                cr[i] = v;
                ar[i] = ts_gelu(v);
            }
        else if (bias)
            for (int64_t i = 0; i < N; i++)
                cr[i] += bias[i];
        else if (ar)
            for (int64_t i = 0; i < N; i++)
                ar[i] = ts_gelu(cr[i]);
    }
}

/* mean and rstd of n ≤ LN_ROWS rows x (n, C): the sum in element order, the mean, then the sum
 * of squared deviations in element order — per row the plain loop's arithmetic. */
static void row_stats(float *mean, float *rstd, const float *x, int64_t n, int64_t C) {
    float s[LN_ROWS] = {0}, v[LN_ROWS] = {0};
    if (n == LN_ROWS) {
        for (int64_t i = 0; i < C; i++)
            for (int k = 0; k < LN_ROWS; k++)
                s[k] += x[k * C + i];
    } else {
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < C; i++)
                s[k] += x[k * C + i];
    }
    for (int64_t k = 0; k < n; k++)
        mean[k] = s[k] / (float)C;
    if (n == LN_ROWS) {
        for (int64_t i = 0; i < C; i++)
            for (int k = 0; k < LN_ROWS; k++) {
                float d = x[k * C + i] - mean[k];
                v[k] += d * d;
            }
    } else {
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < C; i++) {
                float d = x[k * C + i] - mean[k];
                v[k] += d * d;
            }
    }
    for (int64_t k = 0; k < n; k++)
        rstd[k] = ts_ln_rstd(v[k] / (float)C);
}

/* One row: out = (x − m)·rs and/or mod = modulate(out, shift, scale). */
static void ln_row(float *out, float *mod, const float *x, float m, float rs, const float *shift,
                   const float *scale, int64_t C) {
    if (out && mod)
        for (int64_t i = 0; i < C; i++) {
            float o = (x[i] - m) * rs;
            out[i] = o;
            mod[i] = ts_modulate(o, shift[i], scale[i]);
        }
    else if (mod)
        for (int64_t i = 0; i < C; i++)
            mod[i] = ts_modulate((x[i] - m) * rs, shift[i], scale[i]);
    else if (out)
        for (int64_t i = 0; i < C; i++)
            out[i] = (x[i] - m) * rs;
}

static void layernorm(float *out, float *mean, float *rstd, float *mod_out, const float *x,
                      const float *shift, const float *scale, int64_t rows, int64_t C) {
    for (int64_t r0 = 0; r0 < rows; r0 += LN_ROWS) {
        int64_t n = rows - r0 < LN_ROWS ? rows - r0 : LN_ROWS;
        float m[LN_ROWS], rs[LN_ROWS];
        row_stats(m, rs, x + r0 * C, n, C);
        for (int64_t k = 0; k < n; k++) {
            int64_t off = (r0 + k) * C;
            ln_row(out ? out + off : NULL, mod_out ? mod_out + off : NULL, x + off, m[k], rs[k],
                   shift, scale, C);
            if (mean)
                mean[r0 + k] = m[k];
            if (rstd)
                rstd[r0 + k] = rs[k];
        }
    }
}

static void modulate(float *out, const float *x, const float *shift, const float *scale,
                     int64_t rows, int64_t C) {
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * C;
        const float *xr = x + r * C;
        for (int64_t i = 0; i < C; i++)
            o[i] = ts_modulate(xr[i], shift[i], scale[i]);
    }
}

static void gate_residual(float *out, const float *res, const float *y, const float *gate,
                          int64_t rows, int64_t C) {
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * C;
        const float *rr = res + r * C, *yr = y + r * C;
        for (int64_t i = 0; i < C; i++)
            o[i] = rr[i] + gate[i] * yr[i];
    }
}

static void adamw(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float bc1, float sqrt_bc2,
                  float grad_scale) {
    for (int64_t i = 0; i < n; i++)
        ts_adamw_elem(&param[i], &m[i], &v[i], grad[i] * grad_scale, lr, beta1, beta2, eps, wd, bc1,
                      sqrt_bc2);
}

static void ema(float *e, const float *param, int64_t n, float decay) {
    for (int64_t i = 0; i < n; i++)
        e[i] = ts_ema_elem(e[i], param[i], decay);
}

static void axpy(float *y, float alpha, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

static void exp_sub(float *x, int64_t n, float sub) {
    for (int64_t i = 0; i < n; i++)
        x[i] = ts_expf(x[i] - sub);
}

/* The chains are independent, so each build runs them as lanes of its vectors (one 16-wide
 * vector, two of 8, four of 4): every chain adds its own elements in element order. */
static float exp_sum(float *x, int64_t n, float sub) {
    float s[TS_EXP_LANES] = {0};
    int64_t i = 0;
    for (; i + TS_EXP_LANES <= n; i += TS_EXP_LANES)
        for (int l = 0; l < TS_EXP_LANES; l++) {
            x[i + l] = ts_expf(x[i + l] - sub);
            s[l] += x[i + l];
        }
    for (; i < n; i++) {
        x[i] = ts_expf(x[i] - sub);
        s[0] += x[i];
    }
    float total = 0.0f;
    for (int l = 0; l < TS_EXP_LANES; l++)
        total += s[l];
    return total;
}

#ifdef TS_VEC_TILES /* the AVX2 and AVX-512 builds: kernels/cpu/att_tile.c, lin_tile.c */
extern const ts_cpu_att_tiles_t VEC_CAT(ts_cpu_att_tiles_, TS_VEC_ISA);
extern const ts_cpu_lin_tiles_t VEC_CAT(ts_cpu_lin_tiles_, TS_VEC_ISA);
#define ATT_TILES (&VEC_CAT(ts_cpu_att_tiles_, TS_VEC_ISA))
#define LIN_TILES (&VEC_CAT(ts_cpu_lin_tiles_, TS_VEC_ISA))
#else
#define ATT_TILES NULL
#define LIN_TILES NULL
#endif

extern const ts_cpu_vec_t VEC_CAT(ts_cpu_vec_, TS_VEC_ISA);
const ts_cpu_vec_t VEC_CAT(ts_cpu_vec_, TS_VEC_ISA) = {
    .name = VEC_STR(TS_VEC_ISA),
    .gelu = gelu,
    .gelu_backward = gelu_backward,
    .bias_act = bias_act,
    .layernorm = layernorm,
    .modulate = modulate,
    .gate_residual = gate_residual,
    .adamw = adamw,
    .ema = ema,
    .axpy = axpy,
    .exp_sub = exp_sub,
    .exp_sum = exp_sum,
    .att = ATT_TILES,
    .lin = LIN_TILES,
};

#ifdef TS_VEC_PICK
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
extern const ts_cpu_vec_t ts_cpu_vec_avx512, ts_cpu_vec_avx2;

const ts_cpu_vec_t *ts_cpu_vec_pick(const char *cap) {
    int rank = 2; /* 2: avx512, 1: avx2, 0: base */
    if (cap && strcmp(cap, "avx2") == 0)
        rank = 1;
    else if (cap && strcmp(cap, "base") == 0)
        rank = 0;
    __builtin_cpu_init();
    if (rank >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"))
        return &ts_cpu_vec_avx512;
    if (rank >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return &ts_cpu_vec_avx2;
    return &ts_cpu_vec_base;
}
#else
const ts_cpu_vec_t *ts_cpu_vec_pick(const char *cap) { return &ts_cpu_vec_base; }
#endif
#endif
