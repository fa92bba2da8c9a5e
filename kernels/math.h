/*
 * math.h — the per-element and per-row formulas, written once for both backends.
 *
 * Every function here is TS_HD: `__host__ __device__` inline under nvcc, `static inline` under the
 * C compiler. The CPU loops (kernels/cpu/) and the CUDA kernels (kernels/cuda/) call the same
 * functions, so the CPU tests cover the math the GPU runs. Both compilers are told not to fuse
 * multiply-adds (-ffp-contract=off, --fmad=false), so the formulas that use only + − × ÷ and
 * sqrt (the conversions, the RNG, AdamW, EMA, modulate) round identically on the two backends.
 * exp and tanh are written here too (ts_expf, ts_tanhf), so GELU, SiLU and softmax also agree
 * bitwise; sin and cos (timestep embedding) come from each platform's library and may differ in
 * the last place, which the parity test allows for.
 *
 * What is here: dtype conversions, GELU (tanh) and SiLU with derivatives, LayerNorm and softmax
 * element formulas, adaLN modulate, AdamW and EMA updates, the timestep-embedding frequency,
 * the Philox4x32-10 counter-based generator and the uniform / normal streams built on it, and the
 * per-row steps of the CUDA fused attention (an online-softmax tile, a backward pair), and the
 * image ops' index maps and GroupNorm's per-channel coefficients (the VAE).
 */
#ifndef TS_MATH_H
#define TS_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#if defined(__CUDACC__)
#define TS_HD static __host__ __device__ __forceinline__
#else
#define TS_HD static inline
#endif
/* Before a loop whose trip count is a constant in a kernel's instance: unrolled in the device
 * code, so that the per-lane arrays it indexes stay in registers (tests/test_flash_regs.sh);
 * nothing in host code, the CPU's included. */
#if defined(__CUDA_ARCH__)
#define TS_UNROLL _Pragma("unroll")
#else
#define TS_UNROLL
#endif

#define TS_LN_EPS 1e-6f
#define TS_GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define TS_GELU_K1 0.044715f
#define TS_LN_10000 9.210340371976184f /* ln(10000), DiT's max_period */

/* ---- bit casts ------------------------------------------------------------------------- */

TS_HD uint32_t ts_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

TS_HD float ts_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- F16 and BF16 ---------------------------------------------------------------------- */

/* Shifts m right by s (1 ≤ s ≤ 31), rounding to nearest, ties to even. */
TS_HD uint32_t ts_shift_rne(uint32_t m, int s) {
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1u);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q += 1u;
    return q;
}

/* IEEE binary16 from binary32, round to nearest even. NaN → quiet NaN (sign kept), values that
 * round past 65504 → ±Inf, tiny values → subnormals or ±0. */
TS_HD uint16_t ts_f32_to_f16(float f) {
    uint32_t x = ts_f32_bits(f);
#if defined(__CUDA_ARCH__)
    /* On a GPU, the hardware's conversion (cvt.rn.f16.f32: IEEE's nearest even, ±Inf past 65504,
     * subnormals kept): one instruction for the twenty below, the same bits — but a NaN's, which
     * is made as below (sign, 0x7e00) rather than the hardware's canonical 0x7fff. */
    uint16_t nan = (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u);
    return f == f ? __half_as_ushort(__float2half_rn(f)) : nan;
#else
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    int exp = (int)(ax >> 23) - 127 + 15; /* binary16 biased exponent */
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u); /* Inf, or too large */
    if (exp <= 0) {
        int shift = 14 - exp; /* 24-bit significand → 10-bit subnormal field */
        if (shift > 24)
            return (uint16_t)sign;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        return (uint16_t)(sign | ts_shift_rne(mant, shift));
    }
    /* normal: a carry out of the mantissa bumps the exponent, up to Inf — both are correct */
    uint32_t h = ((uint32_t)exp << 10) | ((ax & 0x7fffffu) >> 13);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h += 1u;
    return (uint16_t)(sign | h);
#endif
}

/* binary32 from binary16; exact. */
TS_HD float ts_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x3ffu;
    if (exp == 0x1fu)
        return ts_bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        float v = (float)mant * 5.9604644775390625e-8f; /* mant · 2^-24, exact */
        return sign ? -v : v;
    }
    return ts_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* bfloat16 from binary32, round to nearest even; NaN → quiet NaN; overflow rounds to ±Inf. */
TS_HD uint16_t ts_f32_to_bf16(float f) {
    uint32_t x = ts_f32_bits(f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    /* cvt.rn.bf16.f32 (sm_80 on), as ts_f32_to_f16's: a NaN's bits made as below */
    return f == f ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : (uint16_t)((x >> 16) | 0x0040u);
#else
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
#endif
}

TS_HD float ts_bf16_to_f32(uint16_t b) { return ts_bits_f32((uint32_t)b << 16); }

/* v rounded to a 16-bit type, nearest even: f16 when f16, else bf16; and back (exact). */
TS_HD uint16_t ts_f32_to_lp(float v, int f16) { return f16 ? ts_f32_to_f16(v) : ts_f32_to_bf16(v); }
TS_HD float ts_lp_to_f32(uint16_t h, int f16) { return f16 ? ts_f16_to_f32(h) : ts_bf16_to_f32(h); }

TS_HD int ts_isfinite_f32(float f) { return (ts_f32_bits(f) & 0x7f800000u) != 0x7f800000u; }

/* ---- exp and tanh ---------------------------------------------------------------------- */

/* c ? a : b, without a branch: both sides are computed and one is picked by a bit mask. The
 * formulas below evaluate both sides of each choice anyway; written as a ternary, gcc moves the
 * side it does not always need into a branch (or threads one choice through the next), and a loop
 * with a branch in it is not vectorised ("control flow in loop"). */
TS_HD float ts_select_f32(int c, float a, float b) {
    uint32_t m = 0u - (uint32_t)(c != 0);
    return ts_bits_f32((ts_f32_bits(a) & m) | (ts_f32_bits(b) & ~m));
}

/* e^x for x clamped to [−87, 88] (NaN stays NaN), with + − × and bit operations only: branch-free,
 * so gcc vectorises the loops that call it (glibc's expf and tanhf do not vectorise and were a
 * quarter of a training step), and the CPU and the GPU compute the same bits. x = k·ln2 + r with
 * |r| ≤ ln2/2: k is x·log2(e) rounded to nearest by adding 1.5·2²³, which leaves k in the low
 * bits of the sum (read there as an integer, so NaN converts nothing); e^r by its Taylor series to
 * r⁷ (relative error < 1e-8 before rounding), then the exponent field gets k. */
TS_HD float ts_expf(float x) {
    x = ts_select_f32(x < -87.0f, -87.0f, x);
    x = ts_select_f32(x > 88.0f, 88.0f, x);
    float kb = x * 1.44269504f + 12582912.0f; /* 1.5·2²³ + k, k in [−126, 127] */
    float kf = kb - 12582912.0f;
    float r = (x - kf * 0.693145752f) - kf * 1.42860677e-6f;
    float p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                                            r * (4.1666668e-2f +
                                                 r * (8.3333338e-3f +
                                                      r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    uint32_t biased = ts_f32_bits(kb) - ts_f32_bits(12582912.0f) + 127u; /* k + 127 */
    return p * ts_bits_f32(biased << 23);
}

/* tanh, absolute error ~1e-7: (1 − e)/(1 + e) with e = e^(−2|x|), and its odd series below
 * |x| = 1/16 where that form loses relative accuracy; x's sign last (tanh(−0) = −0).
 * Branch-free. */
TS_HD float ts_tanhf(float x) {
    float ax = fabsf(x);
    float e = ts_expf(-2.0f * ax);
    float big = (1.0f - e) / (1.0f + e);
    float x2 = ax * ax;
    float small = ax * (1.0f - x2 * (0.33333333f - x2 * (0.13333333f - x2 * 0.053968254f)));
    return copysignf(ts_select_f32(ax < 0.0625f, small, big), x);
}

/* ---- activations ----------------------------------------------------------------------- */

/* GELU, tanh approximation: 0.5·x·(1 + tanh u), u = √(2/π)·(x + 0.044715·x³), computed as
 * x / (1 + e^(−2u)) — the same function (1 + tanh u = 2 / (1 + e^(−2u))), one exp and one division
 * where the tanh form needs those and a series besides, and no cancellation in 1 + tanh u for
 * x < −3, where that form lost all relative accuracy. */
TS_HD float ts_gelu(float x) {
    float u = TS_GELU_K0 * (x + TS_GELU_K1 * x * x * x);
    return x / (1.0f + ts_expf(-2.0f * u));
}

/* d gelu / dx = s + 2·x·s·(1 − s)·du/dx, s = 1 / (1 + e) and e = e^(−2u) (the tanh form's
 * ½(1 + tanh u) + ½x(1 − tanh² u)·du/dx with 1 + tanh u = 2s); 1 − s taken as e·s, which does not
 * cancel where s nears 1. */
TS_HD float ts_gelu_grad(float x) {
    float u = TS_GELU_K0 * (x + TS_GELU_K1 * x * x * x);
    float e = ts_expf(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    float du = TS_GELU_K0 * (1.0f + 3.0f * TS_GELU_K1 * x * x);
    return s + 2.0f * x * s * (e * s) * du;
}

TS_HD float ts_sigmoid(float x) { return 1.0f / (1.0f + ts_expf(-x)); }

TS_HD float ts_silu(float x) { return x * ts_sigmoid(x); }

TS_HD float ts_silu_grad(float x) {
    float s = ts_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/* ---- LayerNorm and softmax, per element given the row statistics ---------------------- */

/* rstd from a row's variance (biased, as torch.nn.LayerNorm). */
TS_HD float ts_ln_rstd(float var) { return 1.0f / sqrtf(var + TS_LN_EPS); }

/* dx for one element: rstd · (dy − mean(dy) − x̂ · mean(dy · x̂)). */
TS_HD float ts_ln_grad(float dy, float xhat, float rstd, float mean_dy, float mean_dy_xhat) {
    return rstd * (dy - mean_dy - xhat * mean_dy_xhat);
}

/* softmax backward for one element: y · (dy − Σ dy·y). */
TS_HD float ts_softmax_grad(float y, float dy, float dot) { return y * (dy - dot); }

/* ---- adaLN ----------------------------------------------------------------------------- */

TS_HD float ts_modulate(float x, float shift, float scale) { return x * (1.0f + scale) + shift; }

/* ---- timestep embedding ---------------------------------------------------------------- */

/* Frequency i of a half-width `half` sinusoidal embedding, as DiT computes it in float32. */
TS_HD float ts_timestep_freq(int i, int half) {
    return expf(-TS_LN_10000 * (float)i / (float)half);
}

/* ---- flow matching ------------------------------------------------------------------- */

/* x_t = (1 − t)·x0 + t·ε */
TS_HD float ts_flow_xt(float x0, float eps, float t) { return (1.0f - t) * x0 + t * eps; }

/* ---- optimiser ------------------------------------------------------------------------- */

/* One AdamW element step in PyTorch's order: decay, moments, bias-corrected update.
 * bc1 = 1 − β1^t, sqrt_bc2 = √(1 − β2^t), computed by the caller in double. */
TS_HD void ts_adamw_elem(float *p, float *m, float *v, float g, float lr, float beta1, float beta2,
                         float eps, float wd, float bc1, float sqrt_bc2) {
    float pp = *p * (1.0f - lr * wd);
    float mm = beta1 * *m + (1.0f - beta1) * g;
    float vv = beta2 * *v + (1.0f - beta2) * g * g;
    float denom = sqrtf(vv) / sqrt_bc2 + eps;
    *p = pp - (lr / bc1) * mm / denom;
    *m = mm;
    *v = vv;
}

TS_HD float ts_ema_elem(float ema, float p, float decay) {
    return decay * ema + (1.0f - decay) * p;
}

/* ---- Philox4x32-10 (Salmon et al., SC'11) ---------------------------------------------- */

#define TS_PHILOX_M0 0xD2511F53u
#define TS_PHILOX_M1 0xCD9E8D57u
#define TS_PHILOX_W0 0x9E3779B9u
#define TS_PHILOX_W1 0xBB67AE85u

typedef struct {
    uint32_t v[4];
} ts_u32x4_t;

TS_HD ts_u32x4_t ts_philox4x32_10(ts_u32x4_t ctr, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)TS_PHILOX_M0 * ctr.v[0];
        uint64_t p1 = (uint64_t)TS_PHILOX_M1 * ctr.v[2];
        ts_u32x4_t next;
        next.v[0] = (uint32_t)(p1 >> 32) ^ ctr.v[1] ^ k0;
        next.v[1] = (uint32_t)p1;
        next.v[2] = (uint32_t)(p0 >> 32) ^ ctr.v[3] ^ k1;
        next.v[3] = (uint32_t)p0;
        ctr = next;
        k0 += TS_PHILOX_W0;
        k1 += TS_PHILOX_W1;
    }
    return ctr;
}

/* The 4 stream words of block `block` (elements 4·block .. 4·block+3) of stream `seed`:
 * key = seed, counter = (block, 0). */
TS_HD ts_u32x4_t ts_rng_block(uint64_t seed, uint64_t block) {
    ts_u32x4_t c;
    c.v[0] = (uint32_t)block;
    c.v[1] = (uint32_t)(block >> 32);
    c.v[2] = 0;
    c.v[3] = 0;
    return ts_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* A 32-bit word → uniform in [0, 1) and in (0, 1], 24 bits of resolution. */
TS_HD float ts_u32_to_uniform(uint32_t x) { return (float)(x >> 8) * 5.9604644775390625e-8f; }
TS_HD float ts_u32_to_uniform_pos(uint32_t x) {
    return (float)((x >> 8) + 1u) * 5.9604644775390625e-8f;
}

/* ln(x) for normal positive x, with + − × ÷ only (no libm), so both backends agree bitwise.
 * Relative error below 1e-7: ln m = 2·atanh((m−1)/(m+1)) with m in [√½, √2). */
TS_HD float ts_rng_log(float x) {
    uint32_t b = ts_f32_bits(x);
    int e = (int)(b >> 23) - 127;
    float m = ts_bits_f32((b & 0x7fffffu) | 0x3f800000u);
    if (m > 1.41421356f) {
        m *= 0.5f;
        e += 1;
    }
    float s = (m - 1.0f) / (m + 1.0f);
    float s2 = s * s;
    float series = s2 * (0.33333333f + s2 * (0.2f + s2 * (0.14285714f + s2 * 0.11111111f)));
    float fe = (float)e;
    return (2.0f * s + 2.0f * s * series) + (fe * 0.693145752f + fe * 1.42860677e-6f);
}

/* sin and cos of 2π·u for u in [0, 1), with + − × only: quarter turns are exact (u·4), the
 * remainder angle in [0, π/2) goes through Taylor series to degree 13/14 (error < 1e-9). */
TS_HD void ts_rng_sincos_2pi(float u, float *s, float *c) {
    float q = u * 4.0f;
    int k = (int)q;
    float r = q - (float)k;
    float t = r * 1.57079632679f;
    float t2 = t * t;
    float sn =
        t *
        (1.0f -
         t2 / 6.0f *
             (1.0f -
              t2 / 20.0f *
                  (1.0f - t2 / 42.0f *
                              (1.0f - t2 / 72.0f * (1.0f - t2 / 110.0f * (1.0f - t2 / 156.0f))))));
    float cs =
        1.0f -
        t2 / 2.0f *
            (1.0f -
             t2 / 12.0f *
                 (1.0f -
                  t2 / 30.0f *
                      (1.0f -
                       t2 / 56.0f *
                           (1.0f - t2 / 90.0f * (1.0f - t2 / 132.0f * (1.0f - t2 / 182.0f))))));
    switch (k & 3) {
    case 0:
        *s = sn;
        *c = cs;
        break;
    case 1:
        *s = cs;
        *c = -sn;
        break;
    case 2:
        *s = -sn;
        *c = -cs;
        break;
    default:
        *s = -cs;
        *c = sn;
        break;
    }
}

/* Element n of the uniform stream `seed`. */
TS_HD float ts_rng_uniform_at(uint64_t seed, uint64_t n) {
    ts_u32x4_t b = ts_rng_block(seed, n >> 2);
    return ts_u32_to_uniform(b.v[n & 3]);
}

/* Element n of the normal stream `seed`: stream words (2j, 2j+1) give the Box-Muller pair
 * (r·cos θ, r·sin θ), r = √(−2 ln u1), u1 in (0, 1] from word 2j, θ = 2π·u2 from word 2j+1. */
TS_HD float ts_rng_normal_at(uint64_t seed, uint64_t n) {
    ts_u32x4_t b = ts_rng_block(seed, n >> 2);
    int pair = (int)(n & 2u);
    float u1 = ts_u32_to_uniform_pos(b.v[pair]);
    float u2 = ts_u32_to_uniform(b.v[pair + 1]);
    float r = sqrtf(-2.0f * ts_rng_log(u1));
    float sn, cs;
    ts_rng_sincos_2pi(u2, &sn, &cs);
    return (n & 1u) ? r * sn : r * cs;
}

/* ---- classification ------------------------------------------------------------------ */

/* Cross-entropy of one row of K logits against label: −log softmax(z)[label], as a log-sum-exp
 * around the row's max (every exponent ≤ 0, the sum ≥ 1), with this file's exp and log so both
 * backends compute the same bits. */
TS_HD float ts_xent_row(const float *z, int64_t K, int32_t label) {
    float mx = z[0];
    for (int64_t i = 1; i < K; i++)
        mx = z[i] > mx ? z[i] : mx;
    float s = 0.0f;
    for (int64_t i = 0; i < K; i++)
        s += ts_expf(z[i] - mx);
    return (ts_rng_log(s) + mx) - z[label];
}

/* dz += scale · (softmax(z) − onehot(label)) for one row of K logits. */
TS_HD void ts_xent_grad_row(float *dz, const float *z, int64_t K, int32_t label, float scale) {
    float mx = z[0];
    for (int64_t i = 1; i < K; i++)
        mx = z[i] > mx ? z[i] : mx;
    float s = 0.0f;
    for (int64_t i = 0; i < K; i++)
        s += ts_expf(z[i] - mx);
    float inv = 1.0f / s;
    for (int64_t i = 0; i < K; i++)
        dz[i] += scale * (ts_expf(z[i] - mx) * inv - (i == (int64_t)label ? 1.0f : 0.0f));
}

/* ---- fused attention: the steps of the CUDA kernels (kernels/cuda/cuda_attention.cu) ---- */

/* Keys (forward, dQ) or queries (dK, dV) per tile of the CUDA fused-attention kernels. */
#define TS_ATTN_TILE 32

TS_HD float ts_dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* One query row q (hd) against a tile of n ≤ TS_ATTN_TILE keys K and values V (rows ld apart):
 * the online softmax's running max *m (start at −FLT_MAX), sum *l (0) and unnormalised output
 * acc (hd, 0) move to include the tile, the max once per tile. The row's result is acc / l and
 * its log-sum-exp *m + ln *l once every tile is in. */
TS_HD void ts_attn_row_tile(const float *q, const float *K, const float *V, int n, int hd, int ld,
                            float scale, float *m, float *l, float *acc) {
    float s[TS_ATTN_TILE];
    float mt = *m;
    for (int j = 0; j < n; j++) {
        s[j] = ts_dot(q, K + j * ld, hd) * scale;
        mt = s[j] > mt ? s[j] : mt;
    }
    float corr = ts_expf(*m - mt);
    *l *= corr;
    for (int d = 0; d < hd; d++)
        acc[d] *= corr;
    for (int j = 0; j < n; j++) {
        float p = ts_expf(s[j] - mt);
        *l += p;
        for (int d = 0; d < hd; d++)
            acc[d] += p * V[j * ld + d];
    }
    *m = mt;
}

/* The backward of one (query, key) pair from the forward's log-sum-exp lse of the query row and
 * D = dO·O of that row (FlashAttention-2): the weight *p = exp(scale·q·k − lse) and the score's
 * gradient *ds = p·(dO·v − D); then dV_k += p·dO, dK_k += scale·ds·q, dQ_q += scale·ds·k. */
TS_HD void ts_attn_pair_grad(const float *q, const float *k, const float *v, const float *dO,
                             int hd, float scale, float lse, float D, float *p, float *ds) {
    *p = ts_expf(ts_dot(q, k, hd) * scale - lse);
    *ds = *p * (ts_dot(dO, v, hd) - D);
}

/* The mean over T tokens of one channel: x points at token 0 of that channel, tokens C apart. */
TS_HD float ts_mean_tokens_elem(const float *x, int64_t T, int64_t C) {
    float s = 0.0f;
    for (int64_t t = 0; t < T; t++)
        s += x[t * C];
    return s / (float)T;
}

/* ---- image ops (NCHW; kernels/cpu/cpu_image.c and kernels/cuda/cuda_image.cu) ---------------- */

/* im2col: the image index (into one image of C planes H × W) that element (r, t, ox) of a tile's
 * col matrix copies — col row r = (channel, ky, kx), output row oy0 + t, output column ox — or −1
 * where the kernel window lies in the padding (the element is 0). */
TS_HD int64_t ts_im2col_src(int64_t r, int64_t t, int64_t ox, int64_t H, int64_t W, int64_t kh,
                            int64_t kw, int64_t stride, int64_t pad_top, int64_t pad_left,
                            int64_t oy0) {
    int64_t kx = r % kw, ky = r / kw % kh, c = r / (kw * kh);
    int64_t iy = (oy0 + t) * stride - pad_top + ky, ix = ox * stride - pad_left + kx;
    return iy < 0 || iy >= H || ix < 0 || ix >= W ? -1 : (c * H + iy) * W + ix;
}

/* Element (r, t, ox) of a tile's col matrix (ts_im2col_src) rounded to 16 bits, nearest even:
 * bf16 when bf16, else f16 — what the conv's 16-bit product reads (im2col_lp, CPU and GPU). */
TS_HD uint16_t ts_im2col_lp_elem(const float *img, int bf16, int64_t r, int64_t t, int64_t ox,
                                 int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t stride,
                                 int64_t pad_top, int64_t pad_left, int64_t oy0) {
    int64_t src = ts_im2col_src(r, t, ox, H, W, kh, kw, stride, pad_top, pad_left, oy0);
    float v = src < 0 ? 0.0f : img[src];
    return ts_f32_to_lp(v, !bf16);
}

/* The channel of element i of a (B, C, S) tensor: the bias k_channel_bias adds to it. */
TS_HD int64_t ts_channel_of(int64_t i, int64_t C, int64_t S) { return i / S % C; }

/* Nearest ×2 upsampling: the input index of output element o, planes of H × W in, 2H × 2W out. */
TS_HD int64_t ts_upsample2x_src(int64_t o, int64_t H, int64_t W) {
    int64_t x2 = o % (2 * W), y2 = o / (2 * W) % (2 * H), plane = o / (4 * H * W);
    return (plane * H + y2 / 2) * W + x2 / 2;
}

/* GroupNorm's per-channel affine map y = (x − m)·a + b from the group's mean and 1/std (double),
 * the channel's weight w and bias (1 and 0 without affine): m is the mean rounded to float, and
 * b is the bias corrected for that rounding, so x − m is exact near the mean and y stays
 * accurate when the mean is large beside the spread (x·a + (b − mean·a) would cancel there). */
TS_HD void ts_groupnorm_coeffs(double mean, double rstd, double w, double bias, float *m, float *a,
                               float *b) {
    *m = (float)mean;
    *a = (float)(rstd * w);
    *b = (float)(bias - (mean - (double)*m) * rstd * w);
}

/* GroupNorm's 1/std from the group's sum of squared deviations ss over n values (biased
 * variance, as torch). */
TS_HD double ts_groupnorm_rstd(double ss, int64_t n, float eps) {
    return 1.0 / sqrt(ss / (double)n + (double)eps);
}

/* A GPU splits each group's statistics over blocks when the groups are few and large: the number
 * of chunks per group for `groups` groups of n values, with room for `cap` partial sums per
 * statistic — ⌈n / TS_GN_CHUNK⌉ where the room allows, so a chunk holds at most TS_GN_CHUNK
 * values and more than half that; 1: one block per group. */
#define TS_GN_CHUNK 4096
#define TS_GN_MAX_PARTIALS 1024 /* per statistic: the CUDA engine's scratch holds 2 × this */
TS_HD int64_t ts_groupnorm_splits(int64_t n, int64_t groups, int64_t cap) {
    int64_t want = (n + TS_GN_CHUNK - 1) / TS_GN_CHUNK, room = groups > 0 ? cap / groups : 0;
    int64_t s = want < room ? want : room;
    return s < 1 ? 1 : s;
}

/* Chunk k of `splits` of a group of n values: [*lo, *hi), consecutive, covering 0..n. */
TS_HD void ts_groupnorm_chunk(int64_t n, int64_t splits, int64_t k, int64_t *lo, int64_t *hi) {
    int64_t len = (n + splits - 1) / splits;
    *lo = k * len < n ? k * len : n;
    *hi = (k + 1) * len < n ? (k + 1) * len : n;
}

/* A group's statistic from its chunks' partial sums, added in chunk order (every block of the
 * group adds them alike, so all see the same mean and 1/std). */
TS_HD double ts_groupnorm_gather(const double *part, int64_t splits) {
    double s = 0.0;
    for (int64_t k = 0; k < splits; k++)
        s += part[k];
    return s;
}

/* One element of GroupNorm (then SiLU when silu) from its channel's coefficients. */
TS_HD float ts_groupnorm_elem(float x, float m, float a, float b, int silu) {
    float y = (x - m) * a + b;
    return silu ? ts_silu(y) : y;
}

/* GroupNorm's elements [lo, hi) of one group (cg channels of S values from channel c0 on; y and
 * x at the group's first value), each channel's coefficients from the group's mean and 1/std:
 * the elements first, first + step, … of each channel's share of the range (a GPU block's
 * threads share them; the CPU passes 0, 1). */
TS_HD void ts_groupnorm_apply(float *y, const float *x, const float *weight, const float *bias,
                              int64_t c0, int64_t cg, int64_t S, int64_t lo, int64_t hi,
                              double mean, double rstd, int silu, int64_t first, int64_t step) {
    for (int64_t c = lo / S; c < cg && c * S < hi; c++) {
        float m, a, b;
        ts_groupnorm_coeffs(mean, rstd, weight ? (double)weight[c0 + c] : 1.0,
                            bias ? (double)bias[c0 + c] : 0.0, &m, &a, &b);
        const int64_t from = c * S > lo ? c * S : lo, to = (c + 1) * S < hi ? (c + 1) * S : hi;
        for (int64_t i = from + first; i < to; i += step)
            y[i] = ts_groupnorm_elem(x[i], m, a, b, silu);
    }
}

#endif
