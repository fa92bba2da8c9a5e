/*
 * cuda_attention.cu — the fused (flash-style) attention on a GPU, fp32: no (B, heads, T, T)
 * tensor, forward and backward (FlashAttention-2's recomputation from each row's log-sum-exp).
 *
 * Layout as the CPU's (kernels/ops.h): qkv (B, T, 3C) with the last axis (3, H, hd), out
 * (B, T, C), lse (B, H, T). A block is one warp of TS_ATTN_TILE threads for one (tile, head,
 * sample): grid (⌈T / tile⌉, H, B).
 *   forward   a thread per query row: q, the output and the running max and sum in registers;
 *             tiles of keys and values staged in shared memory; kernels/math.h's
 *             ts_attn_row_tile per tile.
 *   dK, dV    a thread per key row: k, v and their gradients in registers; tiles of queries, dO,
 *             their lse and D = dO·O staged in shared memory; ts_attn_pair_grad per pair.
 *   dQ        a thread per query row, tiles of keys and values, ts_attn_pair_grad per pair.
 * Two backward kernels instead of atomics: every gradient element has one writer, which adds
 * into dqkv (the backward accumulates), so the result does not depend on scheduling.
 *
 * The per-row steps are kernels/math.h's, which tests/test_attention.c runs on the CPU in the
 * kernels' tile order against the reference attention; what only a GPU checks is the staging
 * and indexing here (test_cuda_parity, "attention fused"). Head sizes 32, 64, 72 and 128 have
 * their own instances (registers sized at compile time; cuda_heads.h, shared with the bf16 flash
 * attention); others up to TS_ATTN_HD_MAX share one with the size at run time; larger is TS_ENOTSUP (the composed attention has no limit).
 */
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_heads.h"
#include "kernels/math.h"
#include "kernels/ops.h"

int ts_cuda_ctx_enter(ts_engine_t *e, cudaStream_t *stream, void **scratch, size_t *scratch_bytes);

#define TS_ATTN_HD_MAX TS_CUDA_FUSED_HD_MAX

/* HD > 0: the head size, known at compile time; 0: hd_rt (≤ TS_ATTN_HD_MAX) at run time. */
#define TS_HD_OF(HD, hd_rt) ((HD) > 0 ? (HD) : (hd_rt))
#define TS_HD_CAP(HD) ((HD) > 0 ? (HD) : TS_ATTN_HD_MAX)

/* Stages rows r0 .. r0+n−1 of one head's slice (column offset col) of a (T, ld) matrix into
 * dst (n, hd): every thread of the block takes a share. */
static __device__ void stage(float *dst, const float *src, int r0, int n, int hd, int64_t ld,
                             int64_t col) {
    for (int x = threadIdx.x; x < n * hd; x += blockDim.x) {
        int r = x / hd, d = x - r * hd;
        dst[x] = src[(int64_t)(r0 + r) * ld + col + d];
    }
}

template <int HD>
static __global__ void k_attn_forward(float *out, float *lse, const float *qkv, int T, int C, int H,
                                      int hd_rt, float scale) {
    constexpr int CAP = TS_HD_CAP(HD);
    const int hd = TS_HD_OF(HD, hd_rt);
    __shared__ float Ks[TS_ATTN_TILE * CAP], Vs[TS_ATTN_TILE * CAP];
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * TS_ATTN_TILE + threadIdx.x;
    const int64_t ld = 3 * (int64_t)C;
    const float *base = qkv + (int64_t)b * T * ld;
    const bool row = i < T;
    float q[CAP], acc[CAP], m = -FLT_MAX, l = 0.0f;
    for (int d = 0; d < hd; d++) {
        q[d] = row ? base[(int64_t)i * ld + (int64_t)h * hd + d] : 0.0f;
        acc[d] = 0.0f;
    }
    for (int j0 = 0; j0 < T; j0 += TS_ATTN_TILE) {
        int n = T - j0 < TS_ATTN_TILE ? T - j0 : TS_ATTN_TILE;
        stage(Ks, base, j0, n, hd, ld, C + (int64_t)h * hd);
        stage(Vs, base, j0, n, hd, ld, 2 * (int64_t)C + (int64_t)h * hd);
        __syncthreads();
        if (row)
            ts_attn_row_tile(q, Ks, Vs, n, hd, hd, scale, &m, &l, acc);
        __syncthreads();
    }
    if (!row)
        return;
    float inv = 1.0f / l;
    float *o = out + ((int64_t)b * T + i) * C + (int64_t)h * hd;
    for (int d = 0; d < hd; d++)
        o[d] = acc[d] * inv;
    if (lse)
        lse[((int64_t)b * H + h) * T + i] = m + ts_rng_log(l);
}

/* dK and dV of one key row per thread. */
template <int HD>
static __global__ void k_attn_backward_kv(float *dqkv, const float *dout, const float *qkv,
                                          const float *out, const float *lse, int T, int C, int H,
                                          int hd_rt, float scale) {
    constexpr int CAP = TS_HD_CAP(HD);
    const int hd = TS_HD_OF(HD, hd_rt);
    __shared__ float Qs[TS_ATTN_TILE * CAP], dOs[TS_ATTN_TILE * CAP];
    __shared__ float Ls[TS_ATTN_TILE], Ds[TS_ATTN_TILE];
    const int b = blockIdx.z, h = blockIdx.y, j = blockIdx.x * TS_ATTN_TILE + threadIdx.x;
    const int64_t ld = 3 * (int64_t)C, hoff = (int64_t)h * hd;
    const float *base = qkv + (int64_t)b * T * ld;
    const float *dO = dout + (int64_t)b * T * C, *O = out + (int64_t)b * T * C;
    const float *L = lse + ((int64_t)b * H + h) * T;
    const bool row = j < T;
    float k[CAP], v[CAP], dk[CAP], dv[CAP];
    for (int d = 0; d < hd; d++) {
        k[d] = row ? base[(int64_t)j * ld + C + hoff + d] : 0.0f;
        v[d] = row ? base[(int64_t)j * ld + 2 * (int64_t)C + hoff + d] : 0.0f;
        dk[d] = dv[d] = 0.0f;
    }
    for (int i0 = 0; i0 < T; i0 += TS_ATTN_TILE) {
        int n = T - i0 < TS_ATTN_TILE ? T - i0 : TS_ATTN_TILE;
        stage(Qs, base, i0, n, hd, ld, hoff);
        stage(dOs, dO, i0, n, hd, C, hoff);
        if ((int)threadIdx.x < n) {
            int i = i0 + threadIdx.x;
            Ls[threadIdx.x] = L[i];
            Ds[threadIdx.x] = ts_dot(dO + (int64_t)i * C + hoff, O + (int64_t)i * C + hoff, hd);
        }
        __syncthreads();
        if (row)
            for (int t = 0; t < n; t++) {
                float p, ds;
                ts_attn_pair_grad(Qs + t * hd, k, v, dOs + t * hd, hd, scale, Ls[t], Ds[t], &p,
                                  &ds);
                for (int d = 0; d < hd; d++) {
                    dv[d] += p * dOs[t * hd + d];
                    dk[d] += scale * ds * Qs[t * hd + d];
                }
            }
        __syncthreads();
    }
    if (!row)
        return;
    float *g = dqkv + ((int64_t)b * T + j) * ld;
    for (int d = 0; d < hd; d++) {
        g[C + hoff + d] += dk[d];
        g[2 * (int64_t)C + hoff + d] += dv[d];
    }
}

/* dQ of one query row per thread. */
template <int HD>
static __global__ void k_attn_backward_q(float *dqkv, const float *dout, const float *qkv,
                                         const float *out, const float *lse, int T, int C, int H,
                                         int hd_rt, float scale) {
    constexpr int CAP = TS_HD_CAP(HD);
    const int hd = TS_HD_OF(HD, hd_rt);
    __shared__ float Ks[TS_ATTN_TILE * CAP], Vs[TS_ATTN_TILE * CAP];
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * TS_ATTN_TILE + threadIdx.x;
    const int64_t ld = 3 * (int64_t)C, hoff = (int64_t)h * hd;
    const float *base = qkv + (int64_t)b * T * ld;
    const bool row = i < T;
    float q[CAP], dO[CAP], dq[CAP], D = 0.0f, L = 0.0f;
    for (int d = 0; d < hd; d++) {
        q[d] = row ? base[(int64_t)i * ld + hoff + d] : 0.0f;
        dO[d] = row ? dout[((int64_t)b * T + i) * C + hoff + d] : 0.0f;
        dq[d] = 0.0f;
    }
    if (row) {
        D = ts_dot(dO, out + ((int64_t)b * T + i) * C + hoff, hd);
        L = lse[((int64_t)b * H + h) * T + i];
    }
    for (int j0 = 0; j0 < T; j0 += TS_ATTN_TILE) {
        int n = T - j0 < TS_ATTN_TILE ? T - j0 : TS_ATTN_TILE;
        stage(Ks, base, j0, n, hd, ld, C + hoff);
        stage(Vs, base, j0, n, hd, ld, 2 * (int64_t)C + hoff);
        __syncthreads();
        if (row)
            for (int t = 0; t < n; t++) {
                float p, ds;
                ts_attn_pair_grad(q, Ks + t * hd, Vs + t * hd, dO, hd, scale, L, D, &p, &ds);
                for (int d = 0; d < hd; d++)
                    dq[d] += scale * ds * Ks[t * hd + d];
            }
        __syncthreads();
    }
    if (!row)
        return;
    float *g = dqkv + ((int64_t)b * T + i) * ld + hoff;
    for (int d = 0; d < hd; d++)
        g[d] += dq[d];
}

/* ---- launching ------------------------------------------------------------------------- */

/* The shape checks every fused call shares; *grid set for (⌈T / tile⌉, H, B). */
static int attn_grid(int64_t B, int64_t T, int64_t C, int64_t H, dim3 *grid, int *hd) {
    if (B <= 0 || T <= 0)
        return TS_OK;
    if (C % H != 0)
        return TS_ESHAPE;
    *hd = (int)(C / H);
    if (*hd > TS_ATTN_HD_MAX)
        return TS_ENOTSUP; /* the composed attention has no such limit */
    if (B > TS_CUDA_FUSED_MAX_BATCH || H > 65535 || T > INT32_MAX / 2 || 3 * C > INT32_MAX)
        return TS_ERANGE;
    *grid = dim3((unsigned)((T + TS_ATTN_TILE - 1) / TS_ATTN_TILE), (unsigned)H, (unsigned)B);
    return TS_OK;
}

/* What both entry points start with: the grid, the head size, the stream and the scale. */
typedef struct attn_launch {
    dim3 grid, block;
    int hd, t, c, h;
    cudaStream_t st;
    float scale;
} attn_launch_t;

/* Fills *L; *run is 0 when there is nothing to compute (B or T is 0). */
static int attn_setup(ts_engine_t *e, int64_t B, int64_t T, int64_t C, int64_t H, attn_launch_t *L,
                      int *run) {
    *run = 0;
    int err = attn_grid(B, T, C, H, &L->grid, &L->hd);
    if (err || B <= 0 || T <= 0)
        return err;
    if ((err = ts_cuda_ctx_enter(e, &L->st, NULL, NULL)) != TS_OK)
        return err;
    L->block = dim3(TS_ATTN_TILE);
    L->t = (int)T, L->c = (int)C, L->h = (int)H;
    L->scale = 1.0f / sqrtf((float)L->hd);
    *run = 1;
    return TS_OK;
}

int ts_cuda_attention_fused_forward(ts_engine_t *e, float *out, float *lse, const float *qkv,
                                    int64_t B, int64_t T, int64_t C, int64_t H) {
    attn_launch_t L;
    int run = 0, err = attn_setup(e, B, T, C, H, &L, &run);
    if (err || !run)
        return err;
    return ts_cuda_by_head(L.hd, [&](auto k) {
        k_attn_forward<decltype(k)::value>
            <<<L.grid, L.block, 0, L.st>>>(out, lse, qkv, L.t, L.c, L.h, L.hd, L.scale);
    });
}

int ts_cuda_attention_fused_backward(ts_engine_t *e, float *dqkv, const float *dout,
                                     const float *qkv, const float *out, const float *lse,
                                     int64_t B, int64_t T, int64_t C, int64_t H) {
    attn_launch_t L;
    int run = 0, err = attn_setup(e, B, T, C, H, &L, &run);
    if (err || !run)
        return err;
    return ts_cuda_by_head(L.hd, [&](auto k) {
        constexpr int HD = decltype(k)::value;
        k_attn_backward_kv<HD>
            <<<L.grid, L.block, 0, L.st>>>(dqkv, dout, qkv, out, lse, L.t, L.c, L.h, L.hd, L.scale);
        k_attn_backward_q<HD>
            <<<L.grid, L.block, 0, L.st>>>(dqkv, dout, qkv, out, lse, L.t, L.c, L.h, L.hd, L.scale);
    });
}

/* The 16-bit fused attention on a GPU, forward and backward: the flash attention on tensor cores
 * (cuda_flash.cu; bf16 on sm_80 and later, f16 on sm_75 and later, heads up to 128 in steps of 8,
 * TS_ENOTSUP otherwise). A 16-bit model on a GPU takes it only when asked (ts_dit_set_attention),
 * until a GPU run has measured it faster than the composed one and checked it. */
int ts_cuda_flash_forward(ts_engine_t *e, ts_dtype_t lp, float *out, uint16_t *out16, float *lse,
                          const float *qkv, int64_t B, int64_t T, int64_t C, int64_t H);

int ts_cuda_attention_fused_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *out, uint16_t *out16,
                                       float *lse, const float *qkv, int64_t B, int64_t T,
                                       int64_t C, int64_t H) {
    return ts_cuda_flash_forward(e, lp, out, out16, lse, qkv, B, T, C, H);
}

int ts_cuda_flash_backward(ts_engine_t *e, ts_dtype_t lp, float *dqkv, uint16_t *dqkv16,
                           const float *dout, const float *qkv, const float *out, const float *lse,
                           int64_t B, int64_t T, int64_t C, int64_t H);

int ts_cuda_attention_fused_backward_lp(ts_engine_t *e, ts_dtype_t lp, float *dqkv,
                                        uint16_t *dqkv16, const float *dout, const float *qkv,
                                        const float *out, const float *lse, int64_t B, int64_t T,
                                        int64_t C, int64_t H) {
    return ts_cuda_flash_backward(e, lp, dqkv, dqkv16, dout, qkv, out, lse, B, T, C, H);
}
