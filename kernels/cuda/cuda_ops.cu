/*
 * cuda_ops.cu — the CUDA kernels behind every ts_cuda_<op> of kernels/backend.h except the GEMM.
 *
 * The per-element math is not written here: every formula comes from kernels/math.h, compiled
 * as __host__ __device__, so the GPU evaluates exactly the expressions the CPU backend does
 * (both compiled without fused multiply-adds). What this file adds is the parallel structure:
 *
 *   - elementwise ops: one grid-stride loop over n elements, 256 threads a block, at most
 *     TS_MAX_BLOCKS blocks, so any n works (n == 0 launches nothing);
 *   - row ops (LayerNorm, softmax, the timestep-embedding backward): one block per row, a
 *     grid-stride loop over rows, block sums from warp shuffles and a 32-slot shared array.
 *     LayerNorm's mean and variance are two passes over the row in float;
 *   - column sums (Σ over rows or tokens: add_bcast's db, sum_rows, the adaLN dmod): 32
 *     columns × 8 row-threads a block, rows split into chunks across blockIdx.y so small column
 *     counts still fill the GPU, each chunk's sum added with atomicAdd (the order of those few
 *     additions is not fixed, so the last bit may vary from run to run);
 *   - full sums (sum, sumsq, mse): deterministic two-stage reduction in double — per-block
 *     partials in the engine's scratch buffer, then one block adds them in a fixed order —
 *     matching the CPU backend's double accumulator;
 *   - count_nonfinite: a 64-bit counter in scratch, copied back to the host synchronously.
 *
 * Everything is queued on the engine's stream (ts_cuda_ctx_enter); a launch failure is
 * reported as TS_ECUDA right away, a fault inside a kernel at the next synchronisation.
 * Arguments arrive validated by kernels/ops.c; the only checks here are the ones a raw-pointer
 * interface needs (n == 0, unknown dtype).
 */
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/math.h"

/* Defined in cuda_backend.cu: makes e's device current, returns its stream and scratch. */
int ts_cuda_ctx_enter(ts_engine_t *e, cudaStream_t *stream, void **scratch,
                      size_t *scratch_bytes);

#define TS_THREADS 256       /* threads per block for elementwise and reduction kernels */
#define TS_MAX_BLOCKS 8192   /* grid-stride loops cover whatever lies beyond */
#define TS_ROW_BLOCKS 65535  /* row kernels loop over rows beyond this */
#define TS_RED_BLOCKS 1024   /* blocks (and double partials) of a two-stage reduction */
#define TS_COUNTER_OFFSET (TS_RED_BLOCKS * sizeof(double)) /* count_nonfinite's counter */
#define TS_COL_X 32          /* column-sum block: 32 columns ... */
#define TS_COL_Y 8           /* ... × 8 row-threads */

/* ---- launching ------------------------------------------------------------------------- */

static unsigned grid_for(int64_t n) {
    int64_t blocks = (n + TS_THREADS - 1) / TS_THREADS;
    if (blocks > TS_MAX_BLOCKS)
        blocks = TS_MAX_BLOCKS;
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

static unsigned row_blocks(int64_t rows) {
    return (unsigned)(rows < TS_ROW_BLOCKS ? rows : TS_ROW_BLOCKS);
}

/* Enough whole warps to cover a row of C, at most 256. */
static unsigned row_threads(int64_t C) {
    if (C >= 256)
        return 256;
    int64_t t = (C + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : t);
}

static int launch_status(void) { return cudaGetLastError() == cudaSuccess ? TS_OK : TS_ECUDA; }

/* Queues kernel<<<grid, block>>>(args...) on e's stream. */
template <typename... P, typename... A>
static int launch(ts_engine_t *e, dim3 grid, dim3 block, void (*kernel)(P...), A... args) {
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    kernel<<<grid, block, 0, stream>>>(args...);
    return launch_status();
}

/* An elementwise kernel over n elements (grid-stride); nothing to do when n == 0. */
template <typename... P, typename... A>
static int launch_n(ts_engine_t *e, int64_t n, void (*kernel)(P...), A... args) {
    if (n <= 0)
        return TS_OK;
    return launch(e, dim3(grid_for(n)), dim3(TS_THREADS), kernel, args...);
}

/* A row kernel: one block per row, rows of C elements. */
template <typename... P, typename... A>
static int launch_rows(ts_engine_t *e, int64_t rows, int64_t C, void (*kernel)(P...),
                       A... args) {
    if (rows <= 0 || C <= 0)
        return TS_OK;
    return launch(e, dim3(row_blocks(rows)), dim3(row_threads(C)), kernel, args...);
}

#define TS_GRID_LOOP(i, n)                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
         i += (int64_t)gridDim.x * blockDim.x)
#define TS_ROW_LOOP(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)
#define TS_COL_LOOP(i, C) for (int64_t i = threadIdx.x; i < (C); i += blockDim.x)

/* ---- block reductions ------------------------------------------------------------------ */

struct ts_op_sum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct ts_op_max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op> __device__ T warp_allreduce(T v, Op op) {
    for (int off = 16; off > 0; off >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* Reduces v over the block and returns the result to every thread. blockDim.x is a multiple
 * of 32; sh holds 32 values. All threads of the block must call it. The first barrier lets the
 * block call it again right after a previous call that still reads sh. */
template <typename T, typename Op> __device__ T block_allreduce(T v, T *sh, Op op, T identity) {
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    v = warp_allreduce(v, op);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    T w = lane < (blockDim.x >> 5) ? sh[lane] : identity;
    return warp_allreduce(w, op);
}

template <typename T> __device__ T block_sum(T v, T *sh) {
    return block_allreduce(v, sh, ts_op_sum(), (T)0);
}

/* ---- dtype access ---------------------------------------------------------------------- */

static __device__ __forceinline__ float load_f32(const void *p, int dtype, int64_t i) {
    switch (dtype) {
    case TS_F16: return ts_f16_to_f32(((const uint16_t *)p)[i]);
    case TS_BF16: return ts_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static __device__ __forceinline__ void store_f32(void *p, int dtype, int64_t i, float v) {
    switch (dtype) {
    case TS_F16: ((uint16_t *)p)[i] = ts_f32_to_f16(v); break;
    case TS_BF16: ((uint16_t *)p)[i] = ts_f32_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

static int is_float_dtype(ts_dtype_t d) { return d == TS_F32 || d == TS_F16 || d == TS_BF16; }

/* ---- elementwise and copies ------------------------------------------------------------ */

static __global__ void k_fill(float *t, int64_t n, float v) {
    TS_GRID_LOOP(i, n) t[i] = v;
}
static __global__ void k_axpy(float *y, float alpha, const float *x, int64_t n) {
    TS_GRID_LOOP(i, n) y[i] += alpha * x[i];
}
static __global__ void k_scale(float *t, float alpha, int64_t n) {
    TS_GRID_LOOP(i, n) t[i] *= alpha;
}
static __global__ void k_affine(float *t, float alpha, float beta, int64_t n) {
    TS_GRID_LOOP(i, n) t[i] = alpha * t[i] + beta;
}
static __global__ void k_add(float *out, const float *a, const float *b, int64_t n) {
    TS_GRID_LOOP(i, n) out[i] = a[i] + b[i];
}
/* out, x (n = rows·S); b (S) */
static __global__ void k_add_bcast(float *out, const float *x, const float *b, int64_t n,
                                   int64_t S) {
    TS_GRID_LOOP(i, n) out[i] = x[i] + b[i % S];
}
static __global__ void k_convert(void *dst, int dst_dtype, const void *src, int src_dtype,
                                 int64_t n) {
    TS_GRID_LOOP(i, n) store_f32(dst, dst_dtype, i, load_f32(src, src_dtype, i));
}
static __global__ void k_count_nonfinite(unsigned long long *count, const void *t, int dtype,
                                         int64_t n) {
    __shared__ unsigned long long sh[32];
    unsigned long long c = 0;
    /* F16 and BF16 widen to F32 exactly, Inf and NaN included. */
    TS_GRID_LOOP(i, n) c += ts_isfinite_f32(load_f32(t, dtype, i)) ? 0u : 1u;
    c = block_sum(c, sh);
    if (threadIdx.x == 0 && c)
        atomicAdd(count, c);
}

int ts_cuda_memzero(ts_engine_t *e, void *p, size_t bytes) {
    if (bytes == 0)
        return TS_OK;
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    return cudaMemsetAsync(p, 0, bytes, stream) == cudaSuccess ? TS_OK : TS_ECUDA;
}

int ts_cuda_fill(ts_engine_t *e, float *t, int64_t n, float v) {
    return launch_n(e, n, k_fill, t, n, v);
}

int ts_cuda_axpy(ts_engine_t *e, float *y, float alpha, const float *x, int64_t n) {
    return launch_n(e, n, k_axpy, y, alpha, x, n);
}

int ts_cuda_scale(ts_engine_t *e, float *t, float alpha, int64_t n) {
    return launch_n(e, n, k_scale, t, alpha, n);
}

int ts_cuda_affine(ts_engine_t *e, float *t, float alpha, float beta, int64_t n) {
    return launch_n(e, n, k_affine, t, alpha, beta, n);
}

int ts_cuda_add(ts_engine_t *e, float *out, const float *a, const float *b, int64_t n) {
    return launch_n(e, n, k_add, out, a, b, n);
}

int ts_cuda_add_bcast_forward(ts_engine_t *e, float *out, const float *x, const float *b,
                              int64_t rows, int64_t S) {
    if (S <= 0)
        return TS_OK;
    return launch_n(e, rows * S, k_add_bcast, out, x, b, rows * S, S);
}

int ts_cuda_convert(ts_engine_t *e, void *dst, ts_dtype_t dst_dtype, const void *src,
                    ts_dtype_t src_dtype, int64_t n) {
    if (!is_float_dtype(dst_dtype) || !is_float_dtype(src_dtype))
        return TS_EDTYPE;
    if (n <= 0)
        return TS_OK;
    if (dst_dtype == src_dtype) { /* the identity: a plain copy keeps every bit, NaN payloads too */
        cudaStream_t stream;
        int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
        if (err)
            return err;
        size_t bytes = (size_t)n * (dst_dtype == TS_F32 ? 4u : 2u);
        return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess
                   ? TS_OK
                   : TS_ECUDA;
    }
    return launch_n(e, n, k_convert, dst, (int)dst_dtype, src, (int)src_dtype, n);
}

int ts_cuda_count_nonfinite(ts_engine_t *e, const void *t, ts_dtype_t dtype, int64_t n,
                            int64_t *count) {
    if (!is_float_dtype(dtype))
        return TS_EDTYPE;
    *count = 0;
    if (n <= 0)
        return TS_OK;
    cudaStream_t stream;
    void *scratch;
    size_t scratch_bytes;
    int err = ts_cuda_ctx_enter(e, &stream, &scratch, &scratch_bytes);
    if (err)
        return err;
    if (scratch_bytes < TS_COUNTER_OFFSET + sizeof(unsigned long long))
        return TS_ENOMEM;
    unsigned long long *dcount =
        (unsigned long long *)((unsigned char *)scratch + TS_COUNTER_OFFSET);
    if (cudaMemsetAsync(dcount, 0, sizeof *dcount, stream) != cudaSuccess)
        return TS_ECUDA;
    k_count_nonfinite<<<grid_for(n), TS_THREADS, 0, stream>>>(dcount, t, (int)dtype, n);
    if ((err = launch_status()) != TS_OK)
        return err;
    unsigned long long host = 0;
    if (cudaMemcpyAsync(&host, dcount, sizeof host, cudaMemcpyDeviceToHost, stream) !=
            cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
        return TS_ECUDA;
    *count = (int64_t)host;
    return TS_OK;
}

/* ---- column sums ----------------------------------------------------------------------- */

/*
 * For every group g < groups and column c < C: reduces F::term over rows r < rows into NOUT
 * sums and hands each to F::add (which atomically adds it where it belongs). Block (32, 8):
 * threadIdx.x picks the column, threadIdx.y strides over the rows of this block's chunk
 * (blockIdx.y), shared memory adds the 8 row-threads up. Loops over columns and groups cover
 * grids too small for them.
 */
template <int NOUT, typename F>
static __global__ void k_col_sum(F f, int64_t groups, int64_t rows, int64_t C,
                                 int64_t rows_per_chunk) {
    __shared__ float sh[NOUT][TS_COL_Y][TS_COL_X + 1];
    int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    for (int64_t g = blockIdx.z; g < groups; g += gridDim.z) {
        for (int64_t c0 = (int64_t)blockIdx.x * TS_COL_X; c0 < C;
             c0 += (int64_t)gridDim.x * TS_COL_X) {
            int64_t c = c0 + threadIdx.x;
            float acc[NOUT];
            for (int k = 0; k < NOUT; k++)
                acc[k] = 0.0f;
            if (c < C)
                for (int64_t r = r0 + threadIdx.y; r < r1; r += TS_COL_Y)
                    f.term(acc, g, r, c);
            for (int k = 0; k < NOUT; k++)
                sh[k][threadIdx.y][threadIdx.x] = acc[k];
            __syncthreads();
            if (threadIdx.y == 0 && c < C) {
                for (int k = 0; k < NOUT; k++) {
                    float s = 0.0f;
                    for (int y = 0; y < TS_COL_Y; y++)
                        s += sh[k][y][threadIdx.x];
                    f.add(k, g, c, s);
                }
            }
            __syncthreads();
        }
    }
}

/* Launches k_col_sum<NOUT, F> over (groups, rows, C). */
template <int NOUT, typename F>
static int launch_col_sum(ts_engine_t *e, F f, int64_t groups, int64_t rows, int64_t C) {
    if (groups <= 0 || rows <= 0 || C <= 0)
        return TS_OK;
    int64_t xb = (C + TS_COL_X - 1) / TS_COL_X;
    if (xb > 65535)
        xb = 65535;
    int64_t zb = groups < 65535 ? groups : 65535;
    /* Split the rows into chunks of at least 64 until there are about 1024 blocks. */
    int64_t chunks = 1024 / (xb * zb);
    int64_t max_chunks = (rows + 63) / 64;
    if (chunks > max_chunks)
        chunks = max_chunks;
    if (chunks < 1)
        chunks = 1;
    int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
    chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    dim3 grid((unsigned)xb, (unsigned)chunks, (unsigned)zb);
    return launch(e, grid, dim3(TS_COL_X, TS_COL_Y), k_col_sum<NOUT, F>, f, groups, rows, C,
                  rows_per_chunk);
}

/* out (C) += Σ_rows in (rows, C) */
struct ts_colsum_rows {
    float *out;
    const float *in;
    int64_t C;
    __device__ void term(float *acc, int64_t, int64_t r, int64_t c) const {
        acc[0] += in[r * C + c];
    }
    __device__ void add(int, int64_t, int64_t c, float s) const { atomicAdd(out + c, s); }
};

/* ---- bias broadcast backward and sum_rows ---------------------------------------------- */

static __global__ void k_add_inplace(float *dx, const float *dout, int64_t n) {
    TS_GRID_LOOP(i, n) dx[i] += dout[i];
}

int ts_cuda_add_bcast_backward(ts_engine_t *e, float *dx, float *db, const float *dout,
                               int64_t rows, int64_t S) {
    int err = TS_OK;
    /* db first: it reads dout, which dx might alias. */
    if (db)
        err = launch_col_sum<1>(e, ts_colsum_rows{db, dout, S}, 1, rows, S);
    if (!err && dx)
        err = launch_n(e, rows * S, k_add_inplace, dx, dout, rows * S);
    return err;
}

/* out element i = v: fp32, or v rounded to bf16 / f16 (ts_convert's rounding) for a 16-bit reader */
template <int LP> __device__ void put_act(void *out, int64_t i, float v) {
    if (LP == 0)
        ((float *)out)[i] = v;
    else if (LP == 1)
        ((uint16_t *)out)[i] = ts_f32_to_bf16(v);
    else
        ((uint16_t *)out)[i] = ts_f32_to_f16(v);
}

/* out (C) += Σ_rows in (rows, C), and in16 = in rounded to bf16 (LP 1) or f16 (2) as each
 * element is read — k_col_sum reads each once: a 16-bit linear's bias gradient and its dout for
 * the products in one pass over dout, where a rounding kernel would read it a second time. */
template <int LP> struct ts_colsum_rows_lp {
    float *out;
    const float *in;
    uint16_t *in16;
    int64_t C;
    __device__ void term(float *acc, int64_t, int64_t r, int64_t c) const {
        float v = in[r * C + c];
        acc[0] += v;
        put_act<LP>(in16, r * C + c, v);
    }
    __device__ void add(int, int64_t, int64_t c, float s) const { atomicAdd(out + c, s); }
};

int ts_cuda_bias_grad_lp(ts_engine_t *e, float *db, uint16_t *dout16, ts_dtype_t lp,
                         const float *dout, int64_t rows, int64_t N) {
    if (lp == TS_BF16)
        return launch_col_sum<1>(e, ts_colsum_rows_lp<1>{db, dout, dout16, N}, 1, rows, N);
    return launch_col_sum<1>(e, ts_colsum_rows_lp<2>{db, dout, dout16, N}, 1, rows, N);
}

int ts_cuda_sum_rows(ts_engine_t *e, float *out, const float *inp, int64_t rows, int64_t C) {
    int err = ts_cuda_memzero(e, out, (size_t)(C > 0 ? C : 0) * sizeof(float));
    if (err)
        return err;
    return launch_col_sum<1>(e, ts_colsum_rows{out, inp, C}, 1, rows, C);
}

/* ---- LayerNorm ------------------------------------------------------------------------- */

/* Mean and rstd of one row x (C), two passes in float; every thread gets both. */
static __device__ void row_stats(const float *x, int64_t C, float *sh, float *mean, float *rstd) {
    float s = 0.0f;
    TS_COL_LOOP(i, C) s += x[i];
    float m = block_sum(s, sh) / (float)C;
    float v = 0.0f;
    TS_COL_LOOP(i, C) {
        float d = x[i] - m;
        v += d * d;
    }
    float var = block_sum(v, sh) / (float)C;
    *mean = m;
    *rstd = ts_ln_rstd(var);
}

/* out, inp (rows, C); mean, rstd (rows), nullable */
static __global__ void k_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                           int64_t rows, int64_t C) {
    __shared__ float sh[32];
    TS_ROW_LOOP(r, rows) {
        const float *x = inp + r * C;
        float *o = out + r * C;
        float m, rs;
        row_stats(x, C, sh, &m, &rs);
        TS_COL_LOOP(i, C) o[i] = (x[i] - m) * rs;
        if (threadIdx.x == 0) {
            if (mean)
                mean[r] = m;
            if (rstd)
                rstd[r] = rs;
        }
    }
}

/* dinp (rows, C) += rstd · (dy − mean(dy) − x̂ · mean(dy · x̂)); mean, rstd recomputed if NULL */
static __global__ void k_layernorm_backward(float *dinp, const float *dout, const float *inp,
                                            const float *mean, const float *rstd, int64_t rows,
                                            int64_t C) {
    __shared__ float sh[32];
    TS_ROW_LOOP(r, rows) {
        const float *x = inp + r * C;
        const float *dy = dout + r * C;
        float *dx = dinp + r * C;
        float m, rs;
        if (mean && rstd) {
            m = mean[r];
            rs = rstd[r];
        } else {
            row_stats(x, C, sh, &m, &rs);
        }
        float s_dy = 0.0f, s_dyx = 0.0f;
        TS_COL_LOOP(i, C) {
            float xhat = (x[i] - m) * rs;
            s_dy += dy[i];
            s_dyx += dy[i] * xhat;
        }
        float mean_dy = block_sum(s_dy, sh) / (float)C;
        float mean_dyx = block_sum(s_dyx, sh) / (float)C;
        TS_COL_LOOP(i, C) {
            float xhat = (x[i] - m) * rs;
            dx[i] += ts_ln_grad(dy[i], xhat, rs, mean_dy, mean_dyx);
        }
    }
}

int ts_cuda_layernorm_forward(ts_engine_t *e, float *out, float *mean, float *rstd,
                              const float *inp, int64_t rows, int64_t C) {
    return launch_rows(e, rows, C, k_layernorm_forward, out, mean, rstd, inp, rows, C);
}

int ts_cuda_layernorm_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                               const float *mean, const float *rstd, int64_t rows, int64_t C) {
    return launch_rows(e, rows, C, k_layernorm_backward, dinp, dout, inp, mean, rstd, rows, C);
}

/* ---- GELU and SiLU --------------------------------------------------------------------- */

static __global__ void k_gelu_forward(float *out, const float *inp, int64_t n) {
    TS_GRID_LOOP(i, n) out[i] = ts_gelu(inp[i]);
}
/* dinp += dout · gelu'(inp); LP 1 or 2: dinp as it ends also rounded into dinp16 (the dout of
 * the linear below, gelu_backward_lp) */
template <int LP>
static __global__ void k_gelu_backward(float *dinp, uint16_t *dinp16, const float *dout,
                                       const float *inp, int64_t n) {
    TS_GRID_LOOP(i, n) {
        dinp[i] += dout[i] * ts_gelu_grad(inp[i]);
        if (LP != 0)
            put_act<LP>(dinp16, i, dinp[i]);
    }
}
static __global__ void k_silu_forward(float *out, const float *inp, int64_t n) {
    TS_GRID_LOOP(i, n) out[i] = ts_silu(inp[i]);
}
static __global__ void k_silu_backward(float *dinp, const float *dout, const float *inp,
                                       int64_t n) {
    TS_GRID_LOOP(i, n) dinp[i] += dout[i] * ts_silu_grad(inp[i]);
}

int ts_cuda_gelu_forward(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    return launch_n(e, n, k_gelu_forward, out, inp, n);
}
int ts_cuda_gelu_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                          int64_t n) {
    return launch_n(e, n, k_gelu_backward<0>, dinp, (uint16_t *)NULL, dout, inp, n);
}
int ts_cuda_silu_forward(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    return launch_n(e, n, k_silu_forward, out, inp, n);
}
int ts_cuda_silu_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                          int64_t n) {
    return launch_n(e, n, k_silu_backward, dinp, dout, inp, n);
}

/* ---- softmax --------------------------------------------------------------------------- */

/* out, inp (rows, C); out may alias inp: each thread reads x[i] before it writes out[i], and
 * the max is complete (a barrier) before any write. LP 1 or 2: the weights also rounded to bf16
 * or f16 into out16 as they are written (the composed 16-bit attention's operand of its second
 * product); LP 0: out16 unused. */
template <int LP>
static __global__ void k_softmax_forward(float *out, uint16_t *out16, const float *inp,
                                         int64_t rows, int64_t C) {
    __shared__ float sh[32];
    TS_ROW_LOOP(r, rows) {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float mx = -INFINITY;
        TS_COL_LOOP(i, C) mx = fmaxf(mx, x[i]);
        mx = block_allreduce(mx, sh, ts_op_max(), -INFINITY);
        float s = 0.0f;
        TS_COL_LOOP(i, C) {
            float ex = expf(x[i] - mx);
            y[i] = ex;
            s += ex;
        }
        float inv = 1.0f / block_sum(s, sh);
        TS_COL_LOOP(i, C) { /* the thread's own writes from the loop above */
            const float v = y[i] * inv;
            y[i] = v;
            if (LP)
                put_act<LP>(out16, r * C + i, v);
        }
    }
}

/* dinp = (accumulate ? dinp : 0) + scale · y · (dy − Σ dy·y); with accumulate == 0 dinp may
 * alias dout (the dot is complete before any write, and each thread reads dy[i] first). */
static __global__ void k_softmax_backward(float *dinp, const float *dout, const float *out,
                                          int64_t rows, int64_t C, float scale, int accumulate) {
    __shared__ float sh[32];
    TS_ROW_LOOP(r, rows) {
        const float *y = out + r * C;
        const float *dy = dout + r * C;
        float *dx = dinp + r * C;
        float dot = 0.0f;
        TS_COL_LOOP(i, C) dot += dy[i] * y[i];
        dot = block_sum(dot, sh);
        TS_COL_LOOP(i, C) {
            float g = scale * ts_softmax_grad(y[i], dy[i], dot);
            dx[i] = accumulate ? dx[i] + g : g;
        }
    }
}

int ts_cuda_softmax_forward(ts_engine_t *e, float *out, const float *inp, int64_t rows,
                            int64_t C) {
    return launch_rows(e, rows, C, k_softmax_forward<0>, out, (uint16_t *)NULL, inp, rows, C);
}

int ts_cuda_softmax_forward_lp_copy(ts_engine_t *e, float *out, uint16_t *out16, ts_dtype_t lp,
                                    const float *inp, int64_t rows, int64_t C) {
    return lp == TS_BF16 ? launch_rows(e, rows, C, k_softmax_forward<1>, out, out16, inp, rows, C)
                         : launch_rows(e, rows, C, k_softmax_forward<2>, out, out16, inp, rows, C);
}

int ts_cuda_softmax_backward(ts_engine_t *e, float *dinp, const float *dout, const float *out,
                             int64_t rows, int64_t C, float scale, int accumulate) {
    return launch_rows(e, rows, C, k_softmax_backward, dinp, dout, out, rows, C, scale,
                       accumulate);
}

/* ---- adaLN: modulate and gated residual ------------------------------------------------ */
/* x, out (B, T, C); mod (B, M·C), chunk k of sample b at mod + b·M·C + k·C. */

static __device__ __forceinline__ const float *mod_chunk(const float *mod, int64_t b, int64_t M,
                                                         int64_t C, int k) {
    return mod + b * M * C + (int64_t)k * C;
}

static __global__ void k_modulate_forward(float *out, const float *x, const float *mod,
                                          int64_t B, int64_t T, int64_t C, int64_t M,
                                          int shift_idx, int scale_idx) {
    TS_GRID_LOOP(i, B * T * C) {
        int64_t c = i % C, b = i / (T * C);
        float shift = mod_chunk(mod, b, M, C, shift_idx)[c];
        float scale = mod_chunk(mod, b, M, C, scale_idx)[c];
        out[i] = ts_modulate(x[i], shift, scale);
    }
}

static __global__ void k_modulate_backward_dx(float *dx, const float *dout, const float *mod,
                                              int64_t B, int64_t T, int64_t C, int64_t M,
                                              int scale_idx) {
    TS_GRID_LOOP(i, B * T * C) {
        int64_t c = i % C, b = i / (T * C);
        float scale = mod_chunk(mod, b, M, C, scale_idx)[c];
        dx[i] += dout[i] * (1.0f + scale);
    }
}

/* dmod[b, shift] += Σ_t dout; dmod[b, scale] += Σ_t dout · x (groups = samples, rows = tokens) */
struct ts_colsum_modulate {
    float *dmod;
    const float *dout, *x;
    int64_t T, C, M;
    int shift_idx, scale_idx;
    __device__ void term(float *acc, int64_t b, int64_t t, int64_t c) const {
        int64_t i = (b * T + t) * C + c;
        float d = dout[i];
        acc[0] += d;
        acc[1] += d * x[i];
    }
    __device__ void add(int k, int64_t b, int64_t c, float s) const {
        int chunk = k == 0 ? shift_idx : scale_idx;
        atomicAdd(dmod + b * M * C + (int64_t)chunk * C + c, s);
    }
};

static __global__ void k_gate_residual_forward(float *out, const float *res, const float *y,
                                               const float *mod, int64_t B, int64_t T, int64_t C,
                                               int64_t M, int gate_idx) {
    TS_GRID_LOOP(i, B * T * C) {
        int64_t c = i % C, b = i / (T * C);
        float gate = mod_chunk(mod, b, M, C, gate_idx)[c];
        out[i] = res[i] + gate * y[i];
    }
}

/* dres += dout; dy += gate · dout (each nullable; dout read once, before either write); LP 1 or
 * 2: dy as it ends also rounded into dy16 (gate_residual_backward_lp) */
template <int LP>
static __global__ void k_gate_residual_backward(float *dres, float *dy, uint16_t *dy16,
                                                const float *dout, const float *mod, int64_t B,
                                                int64_t T, int64_t C, int64_t M, int gate_idx) {
    TS_GRID_LOOP(i, B * T * C) {
        int64_t c = i % C, b = i / (T * C);
        float d = dout[i];
        if (dy) {
            dy[i] += mod_chunk(mod, b, M, C, gate_idx)[c] * d;
            if (LP != 0)
                put_act<LP>(dy16, i, dy[i]);
        }
        if (dres)
            dres[i] += d;
    }
}

/* dmod[b, gate] += Σ_t dout · y */
struct ts_colsum_gate {
    float *dmod;
    const float *dout, *y;
    int64_t T, C, M;
    int gate_idx;
    __device__ void term(float *acc, int64_t b, int64_t t, int64_t c) const {
        int64_t i = (b * T + t) * C + c;
        acc[0] += dout[i] * y[i];
    }
    __device__ void add(int, int64_t b, int64_t c, float s) const {
        atomicAdd(dmod + b * M * C + (int64_t)gate_idx * C + c, s);
    }
};

int ts_cuda_modulate_forward(ts_engine_t *e, float *out, const float *x, const float *mod,
                             int64_t B, int64_t T, int64_t C, int64_t M, int shift_idx,
                             int scale_idx) {
    return launch_n(e, B * T * C, k_modulate_forward, out, x, mod, B, T, C, M, shift_idx,
                    scale_idx);
}

/* Two kernels here; the CPU modulates each row in the LayerNorm's pass. The same bits. */
/* LayerNorm then modulate in one pass over each row (one kernel, one read of the row): ln is
 * written for the backward, out = ln·(1 + scale) + shift of the row's sample. The same formulas,
 * so the same bits, as layernorm_forward followed by modulate_forward. LP: out in fp32 (0), bf16
 * (1) or f16 (2). */
template <int LP>
static __global__ void k_layernorm_modulate_forward(float *ln, float *mean, float *rstd, void *out,
                                                    const float *inp, const float *mod,
                                                    int64_t rows, int64_t T, int64_t C, int64_t M,
                                                    int shift_idx, int scale_idx) {
    __shared__ float sh[32];
    TS_ROW_LOOP(r, rows) {
        const float *x = inp + r * C;
        const float *shift = mod_chunk(mod, r / T, M, C, shift_idx);
        const float *scale = mod_chunk(mod, r / T, M, C, scale_idx);
        float m, rs;
        row_stats(x, C, sh, &m, &rs);
        TS_COL_LOOP(i, C) {
            float v = (x[i] - m) * rs;
            ln[r * C + i] = v;
            put_act<LP>(out, r * C + i, ts_modulate(v, shift[i], scale[i]));
        }
        if (threadIdx.x == 0) {
            if (mean)
                mean[r] = m;
            if (rstd)
                rstd[r] = rs;
        }
    }
}

int ts_cuda_layernorm_modulate_forward(ts_engine_t *e, float *ln, float *mean, float *rstd,
                                       float *out, const float *inp, const float *mod, int64_t B,
                                       int64_t T, int64_t C, int64_t M, int shift_idx,
                                       int scale_idx) {
    return launch_rows(e, B * T, C, k_layernorm_modulate_forward<0>, ln, mean, rstd, (void *)out,
                       inp, mod, B * T, T, C, M, shift_idx, scale_idx);
}

int ts_cuda_layernorm_modulate_forward_lp(ts_engine_t *e, float *ln, float *mean, float *rstd,
                                          uint16_t *out, ts_dtype_t lp, const float *inp,
                                          const float *mod, int64_t B, int64_t T, int64_t C,
                                          int64_t M, int shift_idx, int scale_idx) {
    if (lp == TS_BF16)
        return launch_rows(e, B * T, C, k_layernorm_modulate_forward<1>, ln, mean, rstd,
                           (void *)out, inp, mod, B * T, T, C, M, shift_idx, scale_idx);
    return launch_rows(e, B * T, C, k_layernorm_modulate_forward<2>, ln, mean, rstd, (void *)out,
                       inp, mod, B * T, T, C, M, shift_idx, scale_idx);
}

/* GELU rounded for a 16-bit reader (the GPU's bf16 GELU is the fp32 one) */
template <int LP> static __global__ void k_gelu_lp(uint16_t *out, const float *inp, int64_t n) {
    TS_GRID_LOOP(i, n) { put_act<LP>(out, i, ts_gelu(inp[i])); }
}

int ts_cuda_gelu_forward_lp(ts_engine_t *e, uint16_t *out, ts_dtype_t lp, const float *inp,
                            int64_t n) {
    return lp == TS_BF16 ? launch_n(e, n, k_gelu_lp<1>, out, inp, n)
                         : launch_n(e, n, k_gelu_lp<2>, out, inp, n);
}

int ts_cuda_gelu_backward_lp(ts_engine_t *e, float *dinp, uint16_t *dinp16, ts_dtype_t lp,
                             const float *dout, const float *inp, int64_t n) {
    return lp == TS_BF16 ? launch_n(e, n, k_gelu_backward<1>, dinp, dinp16, dout, inp, n)
                         : launch_n(e, n, k_gelu_backward<2>, dinp, dinp16, dout, inp, n);
}

template <int LP> static __global__ void k_silu_lp(uint16_t *out, const float *inp, int64_t n) {
    TS_GRID_LOOP(i, n) { put_act<LP>(out, i, ts_silu(inp[i])); }
}

int ts_cuda_silu_forward_lp(ts_engine_t *e, uint16_t *out, ts_dtype_t lp, const float *inp,
                            int64_t n) {
    return lp == TS_BF16 ? launch_n(e, n, k_silu_lp<1>, out, inp, n)
                         : launch_n(e, n, k_silu_lp<2>, out, inp, n);
}

int ts_cuda_modulate_backward(ts_engine_t *e, float *dx, float *dmod, const float *dout,
                              const float *x, const float *mod, int64_t B, int64_t T, int64_t C,
                              int64_t M, int shift_idx, int scale_idx) {
    int err = TS_OK;
    /* dmod first: it reads dout, which dx might alias. */
    if (dmod) {
        ts_colsum_modulate f = {dmod, dout, x, T, C, M, shift_idx, scale_idx};
        err = launch_col_sum<2>(e, f, B, T, C);
    }
    if (!err && dx)
        err = launch_n(e, B * T * C, k_modulate_backward_dx, dx, dout, mod, B, T, C, M,
                       scale_idx);
    return err;
}

int ts_cuda_gate_residual_forward(ts_engine_t *e, float *out, const float *res, const float *y,
                                  const float *mod, int64_t B, int64_t T, int64_t C, int64_t M,
                                  int gate_idx) {
    return launch_n(e, B * T * C, k_gate_residual_forward, out, res, y, mod, B, T, C, M,
                    gate_idx);
}

/* The gate_residual backward, dy16 written where LP is 1 or 2. */
template <int LP>
static int gate_residual_backward(ts_engine_t *e, float *dres, float *dy, uint16_t *dy16,
                                  float *dmod, const float *dout, const float *y, const float *mod,
                                  int64_t B, int64_t T, int64_t C, int64_t M, int gate_idx) {
    int err = TS_OK;
    /* dmod first: it reads dout, which dres or dy might alias. */
    if (dmod) {
        ts_colsum_gate f = {dmod, dout, y, T, C, M, gate_idx};
        err = launch_col_sum<1>(e, f, B, T, C);
    }
    if (!err && (dres || dy))
        err = launch_n(e, B * T * C, k_gate_residual_backward<LP>, dres, dy, dy16, dout, mod, B, T,
                       C, M, gate_idx);
    return err;
}

int ts_cuda_gate_residual_backward(ts_engine_t *e, float *dres, float *dy, float *dmod,
                                   const float *dout, const float *y, const float *mod, int64_t B,
                                   int64_t T, int64_t C, int64_t M, int gate_idx) {
    return gate_residual_backward<0>(e, dres, dy, NULL, dmod, dout, y, mod, B, T, C, M, gate_idx);
}

int ts_cuda_gate_residual_backward_lp(ts_engine_t *e, float *dres, float *dy, uint16_t *dy16,
                                      ts_dtype_t lp, float *dmod, const float *dout, const float *y,
                                      const float *mod, int64_t B, int64_t T, int64_t C, int64_t M,
                                      int gate_idx) {
    return lp == TS_BF16 ? gate_residual_backward<1>(e, dres, dy, dy16, dmod, dout, y, mod, B, T, C,
                                                     M, gate_idx)
                         : gate_residual_backward<2>(e, dres, dy, dy16, dmod, dout, y, mod, B, T, C,
                                                     M, gate_idx);
}

/* ---- timestep embedding ---------------------------------------------------------------- */

/* out (B, D) = [cos(args), sin(args), 0 if D is odd], args_j = scale·t[b] · freq_j, j < D/2 */
template <int LP>
static __global__ void k_timestep_forward(void *out, const float *t, int64_t B, int64_t D,
                                          float scale) {
    int half = (int)(D / 2);
    TS_GRID_LOOP(i, B * D) {
        int64_t b = i / D;
        int j = (int)(i % D);
        float v = 0.0f;
        if (j < 2 * half) {
            int k = j < half ? j : j - half;
            float arg = (scale * t[b]) * ts_timestep_freq(k, half);
            v = j < half ? cosf(arg) : sinf(arg);
        }
        put_act<LP>(out, i, v);
    }
}

/* dt[b] += Σ_j dout[b, j] · d out[b, j] / d t[b]; one block per sample */
static __global__ void k_timestep_backward(float *dt, const float *dout, const float *t,
                                           int64_t B, int64_t D, float scale) {
    __shared__ float sh[32];
    int half = (int)(D / 2);
    TS_ROW_LOOP(b, B) {
        const float *g = dout + b * D;
        float tt = scale * t[b];
        float acc = 0.0f;
        /* d cos(tt·f)/dt = −sin(tt·f)·f·scale, d sin(tt·f)/dt = cos(tt·f)·f·scale */
        for (int k = threadIdx.x; k < half; k += blockDim.x) {
            float f = ts_timestep_freq(k, half);
            float arg = tt * f;
            acc += (-g[k] * sinf(arg) + g[half + k] * cosf(arg)) * f;
        }
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0)
            dt[b] += acc * scale;
    }
}

int ts_cuda_timestep_embedding_forward(ts_engine_t *e, float *out, const float *t, int64_t B,
                                       int64_t D, float scale) {
    return launch_n(e, B * D, k_timestep_forward<0>, (void *)out, t, B, D, scale);
}

int ts_cuda_timestep_embedding_forward_lp(ts_engine_t *e, uint16_t *out, ts_dtype_t lp,
                                          const float *t, int64_t B, int64_t D, float scale) {
    return lp == TS_BF16 ? launch_n(e, B * D, k_timestep_forward<1>, (void *)out, t, B, D, scale)
                         : launch_n(e, B * D, k_timestep_forward<2>, (void *)out, t, B, D, scale);
}

int ts_cuda_timestep_embedding_backward(ts_engine_t *e, float *dt, const float *dout,
                                        const float *t, int64_t B, int64_t D, float scale) {
    if (D / 2 <= 0)
        return TS_OK; /* only the constant zero column: no gradient */
    return launch_rows(e, B, D / 2, k_timestep_backward, dt, dout, t, B, D, scale);
}

/* ---- class embedding ------------------------------------------------------------------- */

/* out (B, D) = table (V, D) [ids (B)] */
static __global__ void k_embedding_forward(float *out, const float *table, const int32_t *ids,
                                           int64_t B, int64_t D) {
    TS_GRID_LOOP(i, B * D) out[i] = table[(int64_t)ids[i / D] * D + i % D];
}

/* dtable[ids[b]] += dout[b]; ids repeat, so the scatter adds atomically */
static __global__ void k_embedding_backward(float *dtable, const float *dout, const int32_t *ids,
                                            int64_t B, int64_t D) {
    TS_GRID_LOOP(i, B * D) atomicAdd(dtable + (int64_t)ids[i / D] * D + i % D, dout[i]);
}

int ts_cuda_embedding_forward(ts_engine_t *e, float *out, const float *table, const int32_t *ids,
                              int64_t B, int64_t D) {
    return launch_n(e, B * D, k_embedding_forward, out, table, ids, B, D);
}

int ts_cuda_embedding_backward(ts_engine_t *e, float *dtable, const float *dout,
                               const int32_t *ids, int64_t B, int64_t D) {
    return launch_n(e, B * D, k_embedding_backward, dtable, dout, ids, B, D);
}

/* ---- patches --------------------------------------------------------------------------- */
/*
 * Both layouts are bijections between a token tensor (B, T, F), T = (H/p)·(W/p), F = C·p·p,
 * and an image (B, C, H, W). The kernels walk the token index i and compute the image index, so
 * forward gathers and backward scatters without two threads touching the same element.
 */

/* image index of token element i, features in (c, py, px) order (patchify) */
static __device__ __forceinline__ int64_t patch_cpp(int64_t i, int64_t C, int64_t H, int64_t W,
                                                    int64_t p) {
    int64_t F = C * p * p, gw = W / p, T = (H / p) * gw;
    int64_t f = i % F, t = (i / F) % T, b = i / (F * T);
    int64_t c = f / (p * p), py = (f / p) % p, px = f % p;
    int64_t y = (t / gw) * p + py, x = (t % gw) * p + px;
    return ((b * C + c) * H + y) * W + x;
}

/* image index of token element i, features in (py, px, c) order (unpatchify) */
static __device__ __forceinline__ int64_t patch_ppc(int64_t i, int64_t C, int64_t H, int64_t W,
                                                    int64_t p) {
    int64_t F = C * p * p, gw = W / p, T = (H / p) * gw;
    int64_t f = i % F, t = (i / F) % T, b = i / (F * T);
    int64_t c = f % C, px = (f / C) % p, py = f / (C * p);
    int64_t y = (t / gw) * p + py, x = (t % gw) * p + px;
    return ((b * C + c) * H + y) * W + x;
}

template <int LP>
static __global__ void k_patchify_forward(void *out, const float *img, int64_t n, int64_t C,
                                          int64_t H, int64_t W, int64_t p) {
    TS_GRID_LOOP(i, n) put_act<LP>(out, i, img[patch_cpp(i, C, H, W, p)]);
}
static __global__ void k_patchify_backward(float *dimg, const float *dout, int64_t n, int64_t C,
                                           int64_t H, int64_t W, int64_t p) {
    TS_GRID_LOOP(i, n) dimg[patch_cpp(i, C, H, W, p)] += dout[i];
}
static __global__ void k_unpatchify_forward(float *img, const float *tok, int64_t n, int64_t C,
                                            int64_t H, int64_t W, int64_t p) {
    TS_GRID_LOOP(i, n) img[patch_ppc(i, C, H, W, p)] = tok[i];
}
static __global__ void k_unpatchify_backward(float *dtok, const float *dimg, int64_t n,
                                             int64_t C, int64_t H, int64_t W, int64_t p) {
    TS_GRID_LOOP(i, n) dtok[i] += dimg[patch_ppc(i, C, H, W, p)];
}

int ts_cuda_patchify_forward(ts_engine_t *e, float *out, const float *img, int64_t B, int64_t C,
                             int64_t H, int64_t W, int64_t p) {
    return launch_n(e, B * C * H * W, k_patchify_forward<0>, (void *)out, img, B * C * H * W, C, H,
                    W, p);
}
int ts_cuda_patchify_forward_lp(ts_engine_t *e, uint16_t *out, ts_dtype_t lp, const float *img,
                                int64_t B, int64_t C, int64_t H, int64_t W, int64_t p) {
    const int64_t n = B * C * H * W;
    return lp == TS_BF16 ? launch_n(e, n, k_patchify_forward<1>, (void *)out, img, n, C, H, W, p)
                         : launch_n(e, n, k_patchify_forward<2>, (void *)out, img, n, C, H, W, p);
}
int ts_cuda_patchify_backward(ts_engine_t *e, float *dimg, const float *dout, int64_t B,
                              int64_t C, int64_t H, int64_t W, int64_t p) {
    return launch_n(e, B * C * H * W, k_patchify_backward, dimg, dout, B * C * H * W, C, H, W,
                    p);
}
int ts_cuda_unpatchify_forward(ts_engine_t *e, float *img, const float *tok, int64_t B,
                               int64_t C, int64_t H, int64_t W, int64_t p) {
    return launch_n(e, B * C * H * W, k_unpatchify_forward, img, tok, B * C * H * W, C, H, W,
                    p);
}
int ts_cuda_unpatchify_backward(ts_engine_t *e, float *dtok, const float *dimg, int64_t B,
                                int64_t C, int64_t H, int64_t W, int64_t p) {
    return launch_n(e, B * C * H * W, k_unpatchify_backward, dtok, dimg, B * C * H * W, C, H, W,
                    p);
}

/* ---- full reductions: sum, sumsq, mse -------------------------------------------------- */

struct ts_term_x {
    const float *x;
    __device__ double operator()(int64_t i) const { return (double)x[i]; }
};
struct ts_term_x2 {
    const float *x;
    __device__ double operator()(int64_t i) const { return (double)x[i] * (double)x[i]; }
};
struct ts_term_sqdiff {
    const float *a, *b;
    __device__ double operator()(int64_t i) const {
        double d = (double)a[i] - (double)b[i];
        return d * d;
    }
};

/* Stage 1: partials[blockIdx.x] = Σ over this block's share of f(i), in double. */
template <typename F> static __global__ void k_reduce_partials(double *partials, int64_t n, F f) {
    __shared__ double sh[32];
    double acc = 0.0;
    TS_GRID_LOOP(i, n) acc += f(i);
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = acc;
}

/* Stage 2, one block: out[0] = (Σ partials) / div, in a fixed order. */
static __global__ void k_reduce_finish(float *out, const double *partials, int nparts,
                                       double div) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        acc += partials[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0)
        out[0] = (float)(acc / div);
}

/* out[0] = Σ_i f(i) / div over i < n (0 when n == 0). */
template <typename F>
static int reduce_to_scalar(ts_engine_t *e, float *out, int64_t n, F f, double div) {
    if (n <= 0)
        return ts_cuda_memzero(e, out, sizeof(float));
    cudaStream_t stream;
    void *scratch;
    size_t scratch_bytes;
    int err = ts_cuda_ctx_enter(e, &stream, &scratch, &scratch_bytes);
    if (err)
        return err;
    int64_t blocks = (n + TS_THREADS - 1) / TS_THREADS;
    if (blocks > TS_RED_BLOCKS)
        blocks = TS_RED_BLOCKS;
    if (scratch_bytes < (size_t)blocks * sizeof(double))
        return TS_ENOMEM;
    double *partials = (double *)scratch;
    k_reduce_partials<F><<<(unsigned)blocks, TS_THREADS, 0, stream>>>(partials, n, f);
    if ((err = launch_status()) != TS_OK)
        return err;
    k_reduce_finish<<<1, TS_THREADS, 0, stream>>>(out, partials, (int)blocks, div);
    return launch_status();
}

int ts_cuda_sum(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    return reduce_to_scalar(e, out, n, ts_term_x{inp}, 1.0);
}

int ts_cuda_sumsq(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    return reduce_to_scalar(e, out, n, ts_term_x2{inp}, 1.0);
}

int ts_cuda_mse_forward(ts_engine_t *e, float *loss, const float *pred, const float *target,
                        int64_t n) {
    return reduce_to_scalar(e, loss, n, ts_term_sqdiff{pred, target}, (double)n);
}

/* ---- scalar-driven backward ops -------------------------------------------------------- */

/* dinp[i] += scalar[0] · mult, scalar on the device */
static __global__ void k_add_scaled_scalar(float *dinp, const float *scalar, float mult,
                                           int64_t n) {
    float v = scalar[0] * mult;
    TS_GRID_LOOP(i, n) dinp[i] += v;
}

/* dpred[i] += k · (pred[i] − target[i]), k = dloss · 2 / n */
static __global__ void k_mse_backward(float *dpred, float k, const float *pred,
                                      const float *target, int64_t n) {
    TS_GRID_LOOP(i, n) dpred[i] += k * (pred[i] - target[i]);
}

int ts_cuda_add_scaled_scalar(ts_engine_t *e, float *dinp, const float *scalar, float mult,
                              int64_t n) {
    return launch_n(e, n, k_add_scaled_scalar, dinp, scalar, mult, n);
}

int ts_cuda_mse_backward(ts_engine_t *e, float *dpred, float dloss, const float *pred,
                         const float *target, int64_t n) {
    if (n <= 0)
        return TS_OK;
    float k = (float)(2.0 * dloss / (double)n); /* as the CPU backend rounds it */
    return launch_n(e, n, k_mse_backward, dpred, k, pred, target, n);
}

/* ---- classification -------------------------------------------------------------------- */
/* K (classes) is small, so one thread handles one row, with math.h's row formulas: the same
 * bits per row as the CPU; only the forward's sum over rows is added in another order. */

struct ts_term_xent {
    const float *z;
    const int32_t *labels;
    int64_t K;
    __device__ double operator()(int64_t b) const {
        return (double)ts_xent_row(z + b * K, K, labels[b]);
    }
};

static __global__ void k_xent_backward(float *dz, float scale, const float *z,
                                       const int32_t *labels, int64_t B, int64_t K) {
    TS_GRID_LOOP(b, B) ts_xent_grad_row(dz + b * K, z + b * K, K, labels[b], scale);
}

int ts_cuda_cross_entropy_forward(ts_engine_t *e, float *loss, const float *logits,
                                  const int32_t *labels, int64_t B, int64_t K) {
    return reduce_to_scalar(e, loss, B, ts_term_xent{logits, labels, K}, (double)B);
}

int ts_cuda_cross_entropy_backward(ts_engine_t *e, float *dlogits, float scale,
                                   const float *logits, const int32_t *labels, int64_t B,
                                   int64_t K) {
    return launch_n(e, B, k_xent_backward, dlogits, scale, logits, labels, B, K);
}

/* out (B, C): one thread per (b, c), summing its T tokens in order */
static __global__ void k_mean_tokens_forward(float *out, const float *x, int64_t B, int64_t T,
                                             int64_t C) {
    TS_GRID_LOOP(i, B * C) out[i] = ts_mean_tokens_elem(x + (i / C) * T * C + i % C, T, C);
}

/* dx (B, T, C) += dout[b, c] / T */
static __global__ void k_mean_tokens_backward(float *dx, const float *dout, int64_t B, int64_t T,
                                              int64_t C) {
    TS_GRID_LOOP(i, B * T * C) dx[i] += dout[(i / (T * C)) * C + i % C] / (float)T;
}

int ts_cuda_mean_tokens_forward(ts_engine_t *e, float *out, const float *x, int64_t B, int64_t T,
                                int64_t C) {
    return launch_n(e, B * C, k_mean_tokens_forward, out, x, B, T, C);
}

int ts_cuda_mean_tokens_backward(ts_engine_t *e, float *dx, const float *dout, int64_t B,
                                 int64_t T, int64_t C) {
    return launch_n(e, B * T * C, k_mean_tokens_backward, dx, dout, B, T, C);
}

/* ---- flow matching --------------------------------------------------------------------- */

/* xt, target, x0, eps (B, S), t (B): xt = ts_flow_xt(x0, eps, t_b), target = eps − x0 */
static __global__ void k_flow_interp(float *xt, float *target, const float *x0, const float *eps,
                                     const float *t, int64_t B, int64_t S) {
    TS_GRID_LOOP(i, B * S) {
        float a = x0[i], n = eps[i];
        xt[i] = ts_flow_xt(a, n, t[i / S]);
        target[i] = n - a;
    }
}

int ts_cuda_flow_interp(ts_engine_t *e, float *xt, float *target, const float *x0,
                        const float *eps, const float *t, int64_t B, int64_t S) {
    return launch_n(e, B * S, k_flow_interp, xt, target, x0, eps, t, B, S);
}

/* ---- optimiser ------------------------------------------------------------------------- */

static __global__ void k_adamw(float *param, const float *grad, float *m, float *v, int64_t n,
                               float lr, float beta1, float beta2, float eps, float wd, float bc1,
                               float sqrt_bc2, float grad_scale) {
    TS_GRID_LOOP(i, n) {
        float p = param[i], mm = m[i], vv = v[i];
        ts_adamw_elem(&p, &mm, &vv, grad[i] * grad_scale, lr, beta1, beta2, eps, wd, bc1,
                      sqrt_bc2);
        param[i] = p;
        m[i] = mm;
        v[i] = vv;
    }
}

static __global__ void k_gather_rows(float *out, const float *inp, const int32_t *idx, int64_t m,
                                     int64_t S) {
    TS_GRID_LOOP(j, m * S) out[j] = inp[(int64_t)idx[j / S] * S + j % S];
}

/* idx is distinct (checked by ops.c), so no two threads add into the same element */
static __global__ void k_scatter_axpy_rows(float *out, const float *inp, const int32_t *idx,
                                           const float *w, int64_t m, int64_t S) {
    TS_GRID_LOOP(j, m * S) {
        int64_t i = j / S;
        out[(int64_t)idx[i] * S + j % S] += w[i] * inp[j];
    }
}

int ts_cuda_gather_rows(ts_engine_t *e, float *out, const float *inp, const int32_t *idx,
                        int64_t m, int64_t S) {
    return launch_n(e, m * S, k_gather_rows, out, inp, idx, m, S);
}

int ts_cuda_scatter_axpy_rows(ts_engine_t *e, float *out, const float *inp, const int32_t *idx,
                              const float *w, int64_t m, int64_t S) {
    return launch_n(e, m * S, k_scatter_axpy_rows, out, inp, idx, w, m, S);
}

static __global__ void k_ema(float *ema, const float *param, int64_t n, float decay) {
    TS_GRID_LOOP(i, n) ema[i] = ts_ema_elem(ema[i], param[i], decay);
}

int ts_cuda_adamw(ts_engine_t *e, float *param, const float *grad, float *m, float *v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float wd, float bc1,
                  float sqrt_bc2, float grad_scale) {
    return launch_n(e, n, k_adamw, param, grad, m, v, n, lr, beta1, beta2, eps, wd, bc1,
                    sqrt_bc2, grad_scale);
}

int ts_cuda_ema(ts_engine_t *e, float *ema, const float *param, int64_t n, float decay) {
    return launch_n(e, n, k_ema, ema, param, n, decay);
}

/* ---- random numbers -------------------------------------------------------------------- */
/* Element j is stream element offset + j, computed by itself: the same bits as the CPU's for
 * any split of the work (kernels/math.h). */

static __global__ void k_rng_uniform(float *out, int64_t n, uint64_t seed, uint64_t offset) {
    TS_GRID_LOOP(j, n) out[j] = ts_rng_uniform_at(seed, offset + (uint64_t)j);
}
static __global__ void k_rng_normal(float *out, int64_t n, uint64_t seed, uint64_t offset) {
    TS_GRID_LOOP(j, n) out[j] = ts_rng_normal_at(seed, offset + (uint64_t)j);
}

int ts_cuda_rng_uniform(ts_engine_t *e, float *out, int64_t n, uint64_t seed, uint64_t offset) {
    return launch_n(e, n, k_rng_uniform, out, n, seed, offset);
}

int ts_cuda_rng_normal(ts_engine_t *e, float *out, int64_t n, uint64_t seed, uint64_t offset) {
    return launch_n(e, n, k_rng_normal, out, n, seed, offset);
}
