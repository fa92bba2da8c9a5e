/*
 * cuda_flash.cu — the 16-bit flash attention on tensor cores, forward and backward
 * (FlashAttention-2's scheme, `mma.sync` with bf16 or f16 inputs and fp32 accumulation): bf16 on
 * sm_80 and later, f16 on sm_75 and later (there as two m16n8k8 per m16n8k16).
 *
 * A thread block is TS_FA_WARPS warps over 16·TS_FA_WARPS query rows of one head of one sample:
 * grid (⌈T / 64⌉, H, B). Each block of TS_FA_KB keys and values is staged in shared memory as
 * 16 bits by all the block's threads (four columns each at a time); then each warp computes its
 * scores S = Q·Kᵀ, the online softmax in registers, and O += P·V with P's fragments taken
 * straight from S's registers, K's and V's by ldmatrix. Every per-lane step and address is
 * kernels/flash_mma.h's, which tests/test_flash_mma.c runs on the CPU in this order on an
 * emulated warp (the mma, ldmatrix and the quad shuffles emulated); what only a GPU checks is the
 * hardware's instructions and this file's launch (test_cuda_parity, "flash").
 *
 * A row's result depends on its own head's q, k and v only (the key blocks and their order are
 * fixed by T), so it does not depend on the batch. Not bit-identical to the CPU's bf16 fused
 * attention (another order of summation inside the tensor cores). Every kernel is a template on
 * F16 (1: f16, 0: bf16), passed to the steps as a constant.
 */
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_heads.h"
#include "kernels/flash_mma.h"
#include "kernels/ops.h"

int ts_cuda_ctx_enter(ts_engine_t *e, cudaStream_t *stream, void **scratch, size_t *scratch_bytes);
int ts_cuda_compute_capability(ts_engine_t *e, int *major, int *minor);
int ts_cuda_lp_room(ts_engine_t *e, int64_t n, uint16_t **out);

#define LDK TS_FA_LDK /* the staged rows' stride (16-bit elements): flash_mma.h */

/* c += a · b for one m16n8k16 tile, bf16 or f16 inputs. */
template <int F16>
static __device__ __forceinline__ void mma16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    if (F16) { /* k = 0..7 from (a0, a1, b0), then k = 8..15 from (a2, a3, b1): flash_mma.h */
        TS_UNROLL
        for (int h = 0; h < 2; h++)
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                         "{%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a[2 * h]), "r"(a[2 * h + 1]), "r"(b[h]));
    } else {
        __trap(); /* no bf16 mma below sm_80: never launched there (the entry point checks) */
    }
#else
    (void)c, (void)a, (void)b;
    __trap(); /* never launched below sm_75 (the entry point checks) */
#endif
}

/* r = four 8×8 matrices from shared memory, lane's row address p (flash_mma.h: ts_fa_k_ldm,
 * ts_fa_v_ldm); TRANS: each matrix transposed. */
template <int TRANS>
static __device__ __forceinline__ void ldsm4(uint32_t r[4], const uint16_t *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
#else
    (void)r, (void)p;
    __trap(); /* never launched below sm_75 (the entry point checks) */
#endif
}

/* The quad's (lanes 4i .. 4i+3) max, and sum, of v: shuffles by 1 then 2, as the test's loops. */
static __device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* Stages TS_FA_KB rows of src (ld apart, n of them valid) into dst (TS_FA_KB rows, LDK apart) in
 * 16 bits, four columns a thread at a time (flash_mma.h's ts_fa_stage4_at): one 16-byte load
 * where vec (src and ld keep every group 16-byte aligned), else four; one 8-byte store. */
template <int F16>
static __device__ __forceinline__ void stage(uint16_t *dst, const float *src, int64_t ld, int n,
                                             int hd, int dp, int vec) {
    for (int e = threadIdx.x; e < TS_FA_KB * dp / 4; e += blockDim.x) {
        int key, col;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ts_fa_stage4_at(e, dp, n, hd, &key, &col)) {
            const float *p = src + (int64_t)key * ld + col;
            v = vec ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);
        }
        *(uint2 *)(dst + key * LDK + col) =
            make_uint2(ts_fa_pack(v.x, v.y, F16), ts_fa_pack(v.z, v.w, F16));
    }
}

/* acc += a · B on the tensor cores, B's fragments from the staged block sb two n-tiles a load
 * (flash_mma.h), each n-tile adding its k-steps in order. TRANS 0: B = sbᵀ (ts_fa_k_ldm; the
 * scores' pattern, 16 × TS_FA_KB from dp / 16 k-steps); 1: B = sb (ts_fa_v_ldm, transposed;
 * the P·V pattern, 16 × dp from TS_FA_KB / 16 k-steps). */
template <int F16, int TRANS>
static __device__ __forceinline__ void mma_staged(float acc[][4], const uint32_t a[][4],
                                                  const uint16_t *sb, int lane, int dp) {
    TS_UNROLL
    for (int ks = 0; ks < (TRANS ? TS_FA_KB : dp) / 16; ks++) {
        TS_UNROLL
        for (int np = 0; np < (TRANS ? dp : TS_FA_KB) / 16; np++) {
            uint32_t bf[4];
            ldsm4<TRANS>(
                bf, sb + (TRANS ? ts_fa_v_ldm(LDK, lane, ks, np) : ts_fa_k_ldm(LDK, lane, ks, np)));
            mma16<F16>(acc[2 * np], a[ks], bf);
            mma16<F16>(acc[2 * np + 1], a[ks], bf + 2);
        }
    }
}

/* c (16 × TS_FA_KB) = a · Bᵀ, B from the staged block sb: the scores' pattern. */
template <int F16>
static __device__ __forceinline__ void scores(float c[][4], const uint32_t a[][4],
                                              const uint16_t *sb, int lane, int dp) {
    TS_UNROLL
    for (int nt = 0; nt < TS_FA_KB / 8; nt++)
        c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
    mma_staged<F16, 0>(c, a, sb, lane, dp);
}

/* acc (16 × dp) += pa · B, B from the staged block sb: the P·V pattern. */
template <int F16>
static __device__ __forceinline__ void accumulate(float acc[][4], const uint32_t pa[][4],
                                                  const uint16_t *sb, int lane, int dp) {
    mma_staged<F16, 1>(acc, pa, sb, lane, dp);
}

/* HD > 0: the head size known at compile time (the steps' loops unroll and the lane's registers
 * stay registers); 0: hd_rt at run time (the lane's arrays then live in local memory). */
template <int HD, int F16>
static __global__ void __launch_bounds__(32 * TS_FA_WARPS)
    k_flash(float *out, uint16_t *out16, float *lse, const float *qkv, int T, int C, int H,
            int hd_rt, float scale, int vec) {
    const int hd = HD > 0 ? HD : hd_rt;
    __shared__ __align__(16) uint16_t sk[TS_FA_KB * LDK], sv[TS_FA_KB * LDK];
    const int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * TS_FA_WARPS + warp) * TS_FA_ROWS;
    const int rows = row0 < T ? min(TS_FA_ROWS, T - row0) : 0; /* 0: this warp only stages */
    const int dp = ts_fa_padded(hd);
    const int64_t ld = 3 * (int64_t)C;
    const float *base = qkv + (int64_t)b * T * ld;
    ts_fa_lane_t L;
    ts_fa_begin(&L);
    ts_fa_load_q(&L, lane, base + (int64_t)row0 * ld + (int64_t)h * hd, ld, rows, hd, F16);
    for (int k0 = 0; k0 < T; k0 += TS_FA_KB) {
        const int n = min(TS_FA_KB, T - k0);
        __syncthreads(); /* the previous block is read by every warp */
        const float *kb = base + (int64_t)k0 * ld + C + (int64_t)h * hd;
        stage<F16>(sk, kb, ld, n, hd, dp, vec);
        stage<F16>(sv, kb + C, ld, n, hd, dp, vec);
        __syncthreads();
        if (rows == 0)
            continue;
        scores<F16>(L.s, L.q, sk, lane, dp); /* S = Q·Kᵀ */
        float mx[2], bm[2];
        ts_fa_scores(&L, lane, n, scale, mx);
        bm[0] = quad_max(mx[0]);
        bm[1] = quad_max(mx[1]);
        ts_fa_softmax(&L, bm, dp, F16);
        accumulate<F16>(L.o, L.p, sv, lane, dp); /* O += P·V */
    }
    if (rows == 0)
        return;
    float sum[2] = {quad_sum(L.l[0]), quad_sum(L.l[1])};
    const int64_t at = ((int64_t)b * T + row0) * C + (int64_t)h * hd;
    ts_fa_finish(&L, lane, sum, out ? out + at : NULL, out16 ? out16 + at : NULL, C, rows, hd,
                 lse ? lse + ((int64_t)b * H + h) * T + row0 : NULL, F16);
}

/* ---- the backward: a dK, dV pass and a dQ pass (kernels/flash_mma.h) ----------------------- */

/* D = dO·O per row and head (B, H, T), once: what both passes read (ts_fa_delta). */
static __global__ void k_flash_bwd_d(float *d, const float *dout, const float *out, int64_t B,
                                     int64_t T, int64_t C, int64_t H, int hd) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < B * T * H;
         i += (int64_t)gridDim.x * blockDim.x)
        ts_fa_delta(d, dout, out, T, C, H, hd, i);
}

/* dK, dV: a warp per 16 keys, the queries in blocks of TS_FA_KB (q and dO staged in 16 bits,
 * each query's lse and D in fp32). */
template <int HD, int F16>
static __global__ void __launch_bounds__(32 * TS_FA_WARPS)
    k_flash_bwd_kv(float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv,
                   const float *dsum, const float *lse, int T, int C, int H, int hd_rt, float scale,
                   int vec) {
    __shared__ __align__(16) uint16_t sq[TS_FA_KB * LDK], sd[TS_FA_KB * LDK];
    __shared__ float lse_col[TS_FA_KB], d_col[TS_FA_KB];
    const int hd = HD > 0 ? HD : hd_rt;
    const int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int key0 = (blockIdx.x * TS_FA_WARPS + warp) * TS_FA_ROWS;
    const int rows = key0 < T ? min(TS_FA_ROWS, T - key0) : 0;
    const int dp = ts_fa_padded(hd);
    const int64_t ld = 3 * (int64_t)C, hc = (int64_t)h * hd;
    const float *base = qkv + (int64_t)b * T * ld;
    const float *dob = dout + (int64_t)b * T * C;
    const float *lse_h = lse + ((int64_t)b * H + h) * T, *d_h = dsum + ((int64_t)b * H + h) * T;
    ts_fa_grad_lane_t G;
    ts_fa_grad_begin(&G);
    ts_fa_load_a(G.a, lane, base + (int64_t)key0 * ld + C + hc, ld, rows, hd, F16);
    ts_fa_load_a(G.b, lane, base + (int64_t)key0 * ld + 2 * C + hc, ld, rows, hd, F16);
    for (int q0 = 0; q0 < T; q0 += TS_FA_KB) {
        const int n = min(TS_FA_KB, T - q0);
        __syncthreads();
        stage<F16>(sq, base + (int64_t)q0 * ld + hc, ld, n, hd, dp, vec);
        stage<F16>(sd, dob + (int64_t)q0 * C + hc, C, n, hd, dp, vec);
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            lse_col[i] = lse_h[q0 + i];
            d_col[i] = d_h[q0 + i];
        }
        __syncthreads();
        if (rows == 0)
            continue;
        scores<F16>(G.s, G.a, sq, lane, dp); /* Sᵀ = K·Qᵀ */
        ts_fa_probs(&G, lane, n, scale, NULL, lse_col, F16);
        accumulate<F16>(G.acc1, G.pa, sd, lane, dp); /* dV += Pᵀ·dO */
        scores<F16>(G.dp, G.b, sd, lane, dp);        /* dPᵀ = V·dOᵀ */
        ts_fa_dscores(&G, lane, n, NULL, d_col, F16);
        accumulate<F16>(G.acc0, G.pa, sq, lane, dp); /* dK += dSᵀ·Q */
    }
    if (rows == 0)
        return;
    const int64_t at = ((int64_t)b * T + key0) * ld + hc;
    float *dst = dqkv + at;
    uint16_t *d16 = dqkv16 ? dqkv16 + at : NULL;
    ts_fa_add_rows(G.acc0, lane, dst + C, d16 ? d16 + C : NULL, ld, rows, hd, scale, F16);
    ts_fa_add_rows(G.acc1, lane, dst + 2 * C, d16 ? d16 + 2 * C : NULL, ld, rows, hd, 1.0f, F16);
}

/* dQ: a warp per 16 queries (q and dO as A fragments, lse and D per row), the keys in blocks. */
template <int HD, int F16>
static __global__ void __launch_bounds__(32 * TS_FA_WARPS)
    k_flash_bwd_q(float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv,
                  const float *dsum, const float *lse, int T, int C, int H, int hd_rt, float scale,
                  int vec) {
    __shared__ __align__(16) uint16_t sk[TS_FA_KB * LDK], sv[TS_FA_KB * LDK];
    const int hd = HD > 0 ? HD : hd_rt;
    const int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * TS_FA_WARPS + warp) * TS_FA_ROWS;
    const int rows = row0 < T ? min(TS_FA_ROWS, T - row0) : 0;
    const int dp = ts_fa_padded(hd);
    const int64_t ld = 3 * (int64_t)C, hc = (int64_t)h * hd;
    const float *base = qkv + (int64_t)b * T * ld;
    const float *dob = dout + ((int64_t)b * T + row0) * C + hc;
    const int64_t rows_at = ((int64_t)b * H + h) * T + row0; /* the warp's rows of lse and D */
    ts_fa_grad_lane_t G;
    ts_fa_grad_begin(&G);
    ts_fa_load_a(G.a, lane, base + (int64_t)row0 * ld + hc, ld, rows, hd, F16);
    ts_fa_load_a(G.b, lane, dob, C, rows, hd, F16);
    ts_fa_row_stats(&G, lane, lse + rows_at, dsum + rows_at, rows);
    for (int k0 = 0; k0 < T; k0 += TS_FA_KB) {
        const int n = min(TS_FA_KB, T - k0);
        __syncthreads();
        stage<F16>(sk, base + (int64_t)k0 * ld + C + hc, ld, n, hd, dp, vec);
        stage<F16>(sv, base + (int64_t)k0 * ld + 2 * C + hc, ld, n, hd, dp, vec);
        __syncthreads();
        if (rows == 0)
            continue;
        scores<F16>(G.s, G.a, sk, lane, dp); /* S = Q·Kᵀ */
        ts_fa_probs(&G, lane, n, scale, G.ra, NULL, F16);
        scores<F16>(G.dp, G.b, sv, lane, dp); /* dP = dO·Vᵀ */
        ts_fa_dscores(&G, lane, n, G.rb, NULL, F16);
        accumulate<F16>(G.acc0, G.pa, sk, lane, dp); /* dQ += dS·K */
    }
    if (rows == 0)
        return;
    const int64_t at = ((int64_t)b * T + row0) * ld + hc;
    ts_fa_add_rows(G.acc0, lane, dqkv + at, dqkv16 ? dqkv16 + at : NULL, ld, rows, hd, scale, F16);
}

int ts_cuda_flash_ok(ts_engine_t *e, ts_dtype_t lp) {
    int major = 0, minor = 0;
    int err = ts_cuda_compute_capability(e, &major, &minor);
    if (err != TS_OK)
        return err;
    if (lp != TS_BF16 && lp != TS_F16)
        return TS_EINVAL;
    /* bf16 mma: sm_80; f16: sm_75 (m16n8k8) */
    return major * 10 + minor >= (lp == TS_BF16 ? 80 : 75) ? TS_OK : TS_ENOTSUP;
}

/* What both directions launch with. */
typedef struct flash_launch {
    dim3 grid;
    cudaStream_t st;
    int t, c, h, hd;
    float scale;
} flash_launch_t;

/* The checks and the launch geometry both directions share; *run 0 when there is nothing to do. */
static int flash_setup(ts_engine_t *e, ts_dtype_t lp, int64_t B, int64_t T, int64_t C, int64_t H,
                       flash_launch_t *L, int *run) {
    *run = 0;
    if (lp != TS_BF16 && lp != TS_F16)
        return TS_EINVAL;
    if (B <= 0 || T <= 0)
        return TS_OK;
    if (C % H != 0)
        return TS_ESHAPE;
    int64_t hd = C / H;
    if (hd > TS_FA_DMAX || hd % 8 != 0)
        return TS_ENOTSUP; /* the composed attention takes any head */
    if (B > TS_CUDA_FUSED_MAX_BATCH || H > 65535 || T > INT32_MAX / 2 || 3 * C > INT32_MAX)
        return TS_ERANGE;
    int err = ts_cuda_flash_ok(e, lp);
    if (err != TS_OK || (err = ts_cuda_ctx_enter(e, &L->st, NULL, NULL)) != TS_OK)
        return err;
    const int per = TS_FA_ROWS * TS_FA_WARPS;
    L->grid = dim3((unsigned)((T + per - 1) / per), (unsigned)H, (unsigned)B);
    L->t = (int)T, L->c = (int)C, L->h = (int)H, L->hd = (int)hd;
    L->scale = 1.0f / sqrtf((float)hd);
    *run = 1;
    return TS_OK;
}

/* Whether the staging may load four floats at once from p's rows: every group of four columns
 * (a head starts at a multiple of 8 floats, rows 3C or C floats apart, C a multiple of 8) is then
 * 16-byte aligned. */
static int aligned16(const float *p) { return (uintptr_t)p % 16 == 0; }

/* Calls launch(k, f) with k the head's instance (cuda_heads.h) and f an integral_constant, 1 for
 * f16 and 0 for bf16; then reports the launch. */
template <typename F> static int by_head_and_type(int hd, ts_dtype_t lp, F launch) {
    if (lp == TS_F16)
        return ts_cuda_by_head(hd, [&](auto k) { launch(k, std::integral_constant<int, 1>{}); });
    return ts_cuda_by_head(hd, [&](auto k) { launch(k, std::integral_constant<int, 0>{}); });
}

int ts_cuda_flash_backward(ts_engine_t *e, ts_dtype_t lp, float *dqkv, uint16_t *dqkv16,
                           const float *dout, const float *qkv, const float *out, const float *lse,
                           int64_t B, int64_t T, int64_t C, int64_t H) {
    flash_launch_t L;
    int run = 0, err = flash_setup(e, lp, B, T, C, H, &L, &run);
    if (err || !run)
        return err;
    /* D (B, H, T) fp32 in the engine's operand buffer: two 16-bit elements a value (the
     * buffer is cudaMalloc's, aligned for floats); nothing else uses it until both passes ran */
    uint16_t *room = NULL;
    if ((err = ts_cuda_lp_room(e, 2 * B * H * T, &room)) != TS_OK)
        return err;
    float *dsum = (float *)room;
    int64_t n = B * H * T, blocks = (n + 255) / 256;
    unsigned grid = (unsigned)(blocks < 65535 ? blocks : 65535);
    k_flash_bwd_d<<<grid, 256, 0, L.st>>>(dsum, dout, out, B, T, C, H, L.hd);
    const int vec = aligned16(qkv) && aligned16(dout);
    if (cudaGetLastError() != cudaSuccess) /* no pass reads a D that was never written */
        return TS_ECUDA;
    return by_head_and_type(L.hd, lp, [&](auto k, auto f) {
        constexpr int HD = decltype(k)::value, F16 = decltype(f)::value;
        k_flash_bwd_kv<HD, F16><<<L.grid, 32 * TS_FA_WARPS, 0, L.st>>>(
            dqkv, dqkv16, dout, qkv, dsum, lse, L.t, L.c, L.h, L.hd, L.scale, vec);
        k_flash_bwd_q<HD, F16><<<L.grid, 32 * TS_FA_WARPS, 0, L.st>>>(
            dqkv, dqkv16, dout, qkv, dsum, lse, L.t, L.c, L.h, L.hd, L.scale, vec);
    });
}

int ts_cuda_flash_forward(ts_engine_t *e, ts_dtype_t lp, float *out, uint16_t *out16, float *lse,
                          const float *qkv, int64_t B, int64_t T, int64_t C, int64_t H) {
    flash_launch_t L;
    int run = 0, err = flash_setup(e, lp, B, T, C, H, &L, &run);
    if (err || !run)
        return err;
    return by_head_and_type(L.hd, lp, [&](auto k, auto f) {
        constexpr int HD = decltype(k)::value, F16 = decltype(f)::value;
        k_flash<HD, F16><<<L.grid, 32 * TS_FA_WARPS, 0, L.st>>>(out, out16, lse, qkv, L.t, L.c, L.h,
                                                                L.hd, L.scale, aligned16(qkv));
    });
}
