/*
 * cuda_image.cu — the image ops of kernels/backend.h on the CUDA backend (NCHW): im2col (fp32, or
 * rounded to 16 bits for a 16-bit product: ts_im2col_lp_elem, the CPU's element), a
 * per-channel bias, GroupNorm (optionally followed by SiLU) and nearest ×2 upsampling — what the
 * VAE (model/vae.c) needs beside the GEMM, which kernels/ops_image.c sends to cuBLAS.
 *
 * Every element's value comes from kernels/math.h, the functions the CPU backend
 * (kernels/cpu/cpu_image.c) calls too: the index maps of im2col and the upsampling
 * (ts_im2col_src, ts_upsample2x_src, checked against the CPU ops by tests/test_image_ops.c) and
 * GroupNorm's per-channel coefficients and element (ts_groupnorm_coeffs, ts_groupnorm_elem). The
 * copies and the bias are exact, so they equal the CPU's bits. GroupNorm's statistics are sums in
 * double, as on the CPU, over one group per block (each thread a strided share, then a tree), or
 * for a few large groups over several blocks per group, their partials gathered in a fixed order
 * (ts_groupnorm_chunk, _gather: tests/test_image_ops.c runs those steps on the CPU): the
 * order differs from the CPU's element order, but a double sum of at most a few million floats
 * rounds to the same float mean and 1/std but for a last-place tie, which the parity test allows.
 *
 * Launches are queued on the engine's stream (ts_cuda_ctx_enter); a launch failure is TS_ECUDA at
 * once, a fault inside a kernel at the next synchronisation. Arguments arrive checked by
 * kernels/ops_image.c.
 */
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/math.h"

/* Defined in cuda_backend.cu: makes e's device current, returns its stream and scratch. */
int ts_cuda_ctx_enter(ts_engine_t *e, cudaStream_t *stream, void **scratch, size_t *scratch_bytes);

#define IMG_THREADS 256      /* threads per block */
#define IMG_MAX_BLOCKS 8192  /* grid-stride loops cover the rest */
#define IMG_MAX_GROUPS 65535 /* GroupNorm: one block per group, looping beyond this */

#define IMG_GRID_LOOP(i, n)                                                                        \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

static unsigned blocks_for(int64_t n) {
    int64_t b = (n + IMG_THREADS - 1) / IMG_THREADS;
    return (unsigned)(b < 1 ? 1 : b > IMG_MAX_BLOCKS ? IMG_MAX_BLOCKS : b);
}

/* Queues kernel<<<blocks, IMG_THREADS>>>(args...) on e's stream. */
template <typename... P, typename... A>
static int launch(ts_engine_t *e, unsigned blocks, void (*kernel)(P...), A... args) {
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    kernel<<<blocks, IMG_THREADS, 0, stream>>>(args...);
    return cudaGetLastError() == cudaSuccess ? TS_OK : TS_ECUDA;
}

/* ---- im2col ---------------------------------------------------------------------------- */

/* col (C·kh·kw, rows·Wo): element (r, t, ox) from the image, 0 in the padding */
static __global__ void k_im2col(float *col, const float *img, int64_t n, int64_t H, int64_t W,
                                int64_t kh, int64_t kw, int64_t stride, int64_t pad_top,
                                int64_t pad_left, int64_t Wo, int64_t oy0, int64_t rows) {
    IMG_GRID_LOOP(i, n) {
        int64_t ox = i % Wo, t = i / Wo % rows, r = i / (Wo * rows);
        int64_t src = ts_im2col_src(r, t, ox, H, W, kh, kw, stride, pad_top, pad_left, oy0);
        col[i] = src < 0 ? 0.0f : img[src];
    }
}

int ts_cuda_im2col(ts_engine_t *e, float *col, const float *img, int64_t C, int64_t H, int64_t W,
                   int64_t kh, int64_t kw, int64_t stride, int64_t pad_top, int64_t pad_left,
                   int64_t Wo, int64_t oy0, int64_t rows) {
    int64_t n = C * kh * kw * rows * Wo;
    if (n <= 0)
        return TS_OK;
    return launch(e, blocks_for(n), k_im2col, col, img, n, H, W, kh, kw, stride, pad_top, pad_left,
                  Wo, oy0, rows);
}

/* col in 16 bits: each element by ts_im2col_lp_elem, the CPU's function */
static __global__ void k_im2col_lp(uint16_t *col, const float *img, int bf16, int64_t n, int64_t H,
                                   int64_t W, int64_t kh, int64_t kw, int64_t stride,
                                   int64_t pad_top, int64_t pad_left, int64_t Wo, int64_t oy0,
                                   int64_t rows) {
    IMG_GRID_LOOP(i, n) {
        int64_t ox = i % Wo, t = i / Wo % rows, r = i / (Wo * rows);
        col[i] =
            ts_im2col_lp_elem(img, bf16, r, t, ox, H, W, kh, kw, stride, pad_top, pad_left, oy0);
    }
}

int ts_cuda_im2col_lp(ts_engine_t *e, uint16_t *col, ts_dtype_t lp, const float *img, int64_t C,
                      int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t stride, int64_t pad_top,
                      int64_t pad_left, int64_t Wo, int64_t oy0, int64_t rows) {
    int64_t n = C * kh * kw * rows * Wo;
    if (n <= 0)
        return TS_OK;
    return launch(e, blocks_for(n), k_im2col_lp, col, img, lp == TS_BF16 ? 1 : 0, n, H, W, kh, kw,
                  stride, pad_top, pad_left, Wo, oy0, rows);
}

/* ---- per-channel bias ------------------------------------------------------------------ */

static __global__ void k_channel_bias(float *x, const float *bias, int64_t n, int64_t C,
                                      int64_t S) {
    IMG_GRID_LOOP(i, n) { x[i] += bias[ts_channel_of(i, C, S)]; }
}

int ts_cuda_add_channel_bias(ts_engine_t *e, float *x, const float *bias, int64_t B, int64_t C,
                             int64_t S) {
    int64_t n = B * C * S;
    if (n <= 0)
        return TS_OK;
    return launch(e, blocks_for(n), k_channel_bias, x, bias, n, C, S);
}

/* ---- GroupNorm ------------------------------------------------------------------------- */

/* The sum of v over the block (IMG_THREADS threads), returned to every thread; sh holds one
 * double per warp. */
static __device__ double block_sum(double v, double *sh) {
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    double w = lane < (IMG_THREADS >> 5) ? sh[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1)
        w += __shfl_xor_sync(0xffffffffu, w, off);
    return w;
}

/* One block per group (b, g): n = C/G·S contiguous values; mean and biased variance in double,
 * then each channel's coefficients and every element as the CPU computes them. */
static __global__ void k_groupnorm(float *out, const float *inp, const float *weight,
                                   const float *bias, int64_t groups, int64_t C, int64_t S,
                                   int64_t G, float eps, int silu) {
    __shared__ double sh[IMG_THREADS / 32];
    const int64_t cg = C / G, n = cg * S;
    for (int64_t q = blockIdx.x; q < groups; q += gridDim.x) {
        const float *x = inp + q * n;
        double s = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            s += (double)x[i];
        const double mean = block_sum(s, sh) / (double)n;
        double ss = 0.0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            double d = (double)x[i] - mean;
            ss += d * d;
        }
        const double rstd = ts_groupnorm_rstd(block_sum(ss, sh), n, eps);
        ts_groupnorm_apply(out + q * n, x, weight, bias, q % G * cg, cg, S, 0, n, mean, rstd, silu,
                           threadIdx.x, blockDim.x);
    }
}

/* A group's statistics split over `splits` blocks (ts_groupnorm_splits: few, large groups, such
 * as the VAE decoder's 32 groups of a 256 × 256 image, which one block each would leave most of
 * the GPU idle): block (q, k) works on chunk k of group q (ts_groupnorm_chunk). Three launches —
 * the chunks' sums; the chunks' squared deviations from the mean, which every block gathers from
 * the sums in chunk order (ts_groupnorm_gather); the elements — the partials in the engine's
 * scratch. The statistics are the one-block kernel's: double sums, in another order. */
/* DEVS 0: part[block] = the sum of its chunk; DEVS 1: the sum of its chunk's squared deviations
 * from the group's mean, gathered from the sums (sums: the first launch's partials). */
template <int DEVS>
static __global__ void k_groupnorm_chunk_sums(double *part, const double *sums, const float *inp,
                                              int64_t n, int64_t splits) {
    __shared__ double sh[IMG_THREADS / 32];
    const int64_t q = blockIdx.x / splits, k = blockIdx.x % splits;
    int64_t lo, hi;
    ts_groupnorm_chunk(n, splits, k, &lo, &hi);
    const double mean = DEVS ? ts_groupnorm_gather(sums + q * splits, splits) / (double)n : 0.0;
    const float *x = inp + q * n;
    double s = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        double d = (double)x[i] - mean;
        s += DEVS ? d * d : (double)x[i];
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

static __global__ void k_groupnorm_split_apply(float *out, const float *inp, const float *weight,
                                               const float *bias, const double *part_sum,
                                               const double *part_ss, int64_t C, int64_t S,
                                               int64_t G, int64_t splits, float eps, int silu) {
    const int64_t cg = C / G, n = cg * S;
    const int64_t q = blockIdx.x / splits, k = blockIdx.x % splits;
    int64_t lo, hi;
    ts_groupnorm_chunk(n, splits, k, &lo, &hi);
    const double mean = ts_groupnorm_gather(part_sum + q * splits, splits) / (double)n;
    const double rstd =
        ts_groupnorm_rstd(ts_groupnorm_gather(part_ss + q * splits, splits), n, eps);
    ts_groupnorm_apply(out + q * n, inp + q * n, weight, bias, q % G * cg, cg, S, lo, hi, mean,
                       rstd, silu, threadIdx.x, blockDim.x);
}

int ts_cuda_groupnorm_forward(ts_engine_t *e, float *out, const float *inp, const float *weight,
                              const float *bias, int64_t B, int64_t C, int64_t S, int64_t G,
                              float eps, int silu) {
    int64_t groups = B * G;
    if (groups <= 0 || S <= 0)
        return TS_OK;
    cudaStream_t stream;
    void *scratch;
    size_t scratch_bytes;
    int err = ts_cuda_ctx_enter(e, &stream, &scratch, &scratch_bytes);
    if (err)
        return err;
    /* the scratch holds both statistics' partials */
    int64_t n = C / G * S, cap = (int64_t)(scratch_bytes / (2 * sizeof(double)));
    if (cap > TS_GN_MAX_PARTIALS)
        cap = TS_GN_MAX_PARTIALS;
    int64_t splits = ts_groupnorm_splits(n, groups, cap);
    if (splits < 2) {
        unsigned blocks = (unsigned)(groups < IMG_MAX_GROUPS ? groups : IMG_MAX_GROUPS);
        return launch(e, blocks, k_groupnorm, out, inp, weight, bias, groups, C, S, G, eps, silu);
    }
    double *part_sum = (double *)scratch, *part_ss = part_sum + groups * splits;
    unsigned blocks = (unsigned)(groups * splits); /* at most cap */
    if ((err = launch(e, blocks, k_groupnorm_chunk_sums<0>, part_sum, (const double *)NULL, inp, n,
                      splits)) != TS_OK ||
        (err = launch(e, blocks, k_groupnorm_chunk_sums<1>, part_ss, (const double *)part_sum, inp,
                      n, splits)) != TS_OK)
        return err;
    return launch(e, blocks, k_groupnorm_split_apply, out, inp, weight, bias,
                  (const double *)part_sum, (const double *)part_ss, C, S, G, splits, eps, silu);
}

/* ---- nearest ×2 upsampling ------------------------------------------------------------- */

static __global__ void k_upsample2x(float *out, const float *inp, int64_t n, int64_t H, int64_t W) {
    IMG_GRID_LOOP(o, n) { out[o] = inp[ts_upsample2x_src(o, H, W)]; }
}

int ts_cuda_upsample_nearest2x(ts_engine_t *e, float *out, const float *inp, int64_t R, int64_t H,
                               int64_t W) {
    int64_t n = R * 4 * H * W;
    if (n <= 0)
        return TS_OK;
    return launch(e, blocks_for(n), k_upsample2x, out, inp, n, H, W);
}
