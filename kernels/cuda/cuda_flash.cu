/*
 * cuda_flash.cu — the bf16 flash attention forward on tensor cores (FlashAttention-2's scheme,
 * `mma.sync.m16n8k16` with bf16 inputs and fp32 accumulation; sm_80 and later).
 *
 * A thread block is TS_FA_WARPS warps over 16·TS_FA_WARPS query rows of one head of one sample:
 * grid (⌈T / 64⌉, H, B). Each block of TS_FA_KB keys and values is staged in shared memory as
 * bf16 by all the block's threads; then each warp computes its scores S = Q·Kᵀ, the online
 * softmax in registers, and O += P·V with P's fragments taken straight from S's registers. Every
 * per-lane step is kernels/flash_mma.h's, which tests/test_flash_mma.c runs on the CPU in this
 * order on an emulated warp (the mma and the quad shuffles emulated); what only a GPU checks is
 * the hardware's products and this file's staging and launch (test_cuda_parity, "flash").
 *
 * A row's result depends on its own head's q, k and v only (the key blocks and their order are
 * fixed by T), so it does not depend on the batch. Not bit-identical to the CPU's bf16 fused
 * attention (another order of summation inside the tensor cores).
 */
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/flash_mma.h"
#include "kernels/ops.h"

int ts_cuda_ctx_enter(ts_engine_t *e, cudaStream_t *stream, void **scratch, size_t *scratch_bytes);
int ts_cuda_compute_capability(ts_engine_t *e, int *major, int *minor);

#define LDK (TS_FA_DMAX + 8) /* staged row stride (bf16): +8 keeps the rows off one bank */

static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4],
                                                const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)c, (void)a, (void)b;
    __trap(); /* never launched below sm_80 (the entry point checks) */
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

/* HD > 0: the head size known at compile time (the steps' loops unroll and the lane's registers
 * stay registers); 0: hd_rt at run time (the lane's arrays then live in local memory). */
template <int HD>
static __global__ void __launch_bounds__(32 * TS_FA_WARPS)
    k_flash_bf16(float *out, float *lse, const float *qkv, int T, int C, int H, int hd_rt,
                 float scale) {
    const int hd = HD > 0 ? HD : hd_rt;
    __shared__ uint16_t sk[TS_FA_KB * LDK], sv[TS_FA_KB * LDK];
    const int b = blockIdx.z, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * TS_FA_WARPS + warp) * TS_FA_ROWS;
    const int rows = row0 < T ? min(TS_FA_ROWS, T - row0) : 0; /* 0: this warp only stages */
    const int dp = ts_fa_padded(hd);
    const int64_t ld = 3 * (int64_t)C;
    const float *base = qkv + (int64_t)b * T * ld;
    ts_fa_lane_t L;
    ts_fa_begin(&L);
    ts_fa_load_q(&L, lane, base + (int64_t)row0 * ld + (int64_t)h * hd, ld, rows, hd);
    for (int k0 = 0; k0 < T; k0 += TS_FA_KB) {
        const int n = min(TS_FA_KB, T - k0);
        __syncthreads(); /* the previous block is read by every warp */
        for (int e = threadIdx.x; e < TS_FA_KB * dp; e += blockDim.x) {
            ts_fa_stage(sk, LDK, base + (int64_t)k0 * ld + C + (int64_t)h * hd, ld, n, hd, e);
            ts_fa_stage(sv, LDK, base + (int64_t)k0 * ld + 2 * (int64_t)C + (int64_t)h * hd, ld, n,
                        hd, e);
        }
        __syncthreads();
        if (rows == 0)
            continue;
        for (int nt = 0; nt < TS_FA_KB / 8; nt++) {
            float *c = L.s[nt];
            c[0] = c[1] = c[2] = c[3] = 0.0f;
            for (int ks = 0; ks < dp / 16; ks++) {
                uint32_t bf[2];
                ts_fa_k_frag(bf, sk, LDK, lane, ks, nt);
                mma_bf16(c, L.q[ks], bf);
            }
        }
        float mx[2], bm[2];
        ts_fa_scores(&L, lane, n, scale, mx);
        bm[0] = quad_max(mx[0]);
        bm[1] = quad_max(mx[1]);
        ts_fa_softmax(&L, bm, dp);
        for (int nt = 0; nt < dp / 8; nt++)
            for (int ks = 0; ks < TS_FA_KB / 16; ks++) {
                uint32_t bf[2];
                ts_fa_v_frag(bf, sv, LDK, lane, ks, nt);
                mma_bf16(L.o[nt], L.p[ks], bf);
            }
    }
    if (rows == 0)
        return;
    float sum[2] = {quad_sum(L.l[0]), quad_sum(L.l[1])};
    ts_fa_finish(&L, lane, sum, out + ((int64_t)b * T + row0) * C + (int64_t)h * hd, C, rows, hd,
                 lse ? lse + ((int64_t)b * H + h) * T + row0 : NULL);
}

int ts_cuda_flash_forward_bf16(ts_engine_t *e, float *out, float *lse, const float *qkv, int64_t B,
                               int64_t T, int64_t C, int64_t H) {
    if (B <= 0 || T <= 0)
        return TS_OK;
    if (C % H != 0)
        return TS_ESHAPE;
    int64_t hd = C / H;
    if (hd > TS_FA_DMAX || hd % 8 != 0)
        return TS_ENOTSUP; /* the composed attention takes any head */
    if (B > TS_CUDA_FUSED_MAX_BATCH || H > 65535 || T > INT32_MAX / 2 || 3 * C > INT32_MAX)
        return TS_ERANGE;
    int major = 0, minor = 0;
    int err = ts_cuda_compute_capability(e, &major, &minor);
    if (err != TS_OK)
        return err;
    if (major < 8)
        return TS_ENOTSUP; /* bf16 mma needs sm_80 */
    cudaStream_t st;
    if ((err = ts_cuda_ctx_enter(e, &st, NULL, NULL)) != TS_OK)
        return err;
    const int per = TS_FA_ROWS * TS_FA_WARPS;
    dim3 grid((unsigned)((T + per - 1) / per), (unsigned)H, (unsigned)B);
    const float scale = 1.0f / sqrtf((float)hd);
    const int t = (int)T, c = (int)C, h = (int)H, d = (int)hd;
    const unsigned threads = 32 * TS_FA_WARPS;
    if (hd == 32)
        k_flash_bf16<32><<<grid, threads, 0, st>>>(out, lse, qkv, t, c, h, d, scale);
    else if (hd == 64)
        k_flash_bf16<64><<<grid, threads, 0, st>>>(out, lse, qkv, t, c, h, d, scale);
    else if (hd == 72)
        k_flash_bf16<72><<<grid, threads, 0, st>>>(out, lse, qkv, t, c, h, d, scale);
    else if (hd == 128)
        k_flash_bf16<128><<<grid, threads, 0, st>>>(out, lse, qkv, t, c, h, d, scale);
    else
        k_flash_bf16<0><<<grid, threads, 0, st>>>(out, lse, qkv, t, c, h, d, scale);
    return cudaGetLastError() == cudaSuccess ? TS_OK : TS_ECUDA;
}
