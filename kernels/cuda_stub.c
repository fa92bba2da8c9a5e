/*
 * cuda_stub.c — the CUDA backend in a build without CUDA.
 *
 * Every ts_cuda_* entry point of kernels/backend.h exists so kernels/ops.c links the same way
 * in every build; here each one reports TS_ENODEV (the void ones do nothing), ts_cuda_is_built
 * says 0 and ts_cuda_count explains how to get the real backend. The parameter lists are the
 * ones declared in backend.h, which the compiler checks against these definitions.
 */
#include <stdio.h>

#include "kernels/backend.h"

/* The stubs ignore their arguments by design; C11 definitions must still name them. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif

#define TS_CUDA_STUB(name, ...)                                                                  \
    int ts_cuda_##name(ts_engine_t *e, __VA_ARGS__) { return TS_ENODEV; }

TS_CUDA_STUB(memzero, void *p, size_t bytes)
TS_CUDA_STUB(fill, float *t, int64_t n, float v)
TS_CUDA_STUB(axpy, float *y, float alpha, const float *x, int64_t n)
TS_CUDA_STUB(scale, float *t, float alpha, int64_t n)
TS_CUDA_STUB(affine, float *t, float alpha, float beta, int64_t n)
TS_CUDA_STUB(add, float *out, const float *a, const float *b, int64_t n)
TS_CUDA_STUB(add_bcast_forward, float *out, const float *x, const float *b, int64_t rows,
             int64_t S)
TS_CUDA_STUB(add_bcast_backward, float *dx, float *db, const float *dout, int64_t rows,
             int64_t S)
TS_CUDA_STUB(convert, void *dst, ts_dtype_t dst_dtype, const void *src, ts_dtype_t src_dtype,
             int64_t n)
TS_CUDA_STUB(count_nonfinite, const void *t, ts_dtype_t dtype, int64_t n, int64_t *count)
TS_CUDA_STUB(gemm, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const float *A, int64_t lda, int64_t stride_a, const float *B, int64_t ldb,
             int64_t stride_b, float beta, float *C, int64_t ldc, int64_t stride_c,
             int64_t batch)
TS_CUDA_STUB(layernorm_forward, float *out, float *mean, float *rstd, const float *inp,
             int64_t rows, int64_t C)
TS_CUDA_STUB(layernorm_backward, float *dinp, const float *dout, const float *inp,
             const float *mean, const float *rstd, int64_t rows, int64_t C)
TS_CUDA_STUB(gelu_forward, float *out, const float *inp, int64_t n)
TS_CUDA_STUB(gelu_backward, float *dinp, const float *dout, const float *inp, int64_t n)
TS_CUDA_STUB(silu_forward, float *out, const float *inp, int64_t n)
TS_CUDA_STUB(silu_backward, float *dinp, const float *dout, const float *inp, int64_t n)
TS_CUDA_STUB(softmax_forward, float *out, const float *inp, int64_t rows, int64_t C)
TS_CUDA_STUB(softmax_backward, float *dinp, const float *dout, const float *out, int64_t rows,
             int64_t C, float scale, int accumulate)
TS_CUDA_STUB(modulate_forward, float *out, const float *x, const float *mod, int64_t B,
             int64_t T, int64_t C, int64_t M, int shift_idx, int scale_idx)
TS_CUDA_STUB(modulate_backward, float *dx, float *dmod, const float *dout, const float *x,
             const float *mod, int64_t B, int64_t T, int64_t C, int64_t M, int shift_idx,
             int scale_idx)
TS_CUDA_STUB(gate_residual_forward, float *out, const float *res, const float *y,
             const float *mod, int64_t B, int64_t T, int64_t C, int64_t M, int gate_idx)
TS_CUDA_STUB(gate_residual_backward, float *dres, float *dy, float *dmod, const float *dout,
             const float *y, const float *mod, int64_t B, int64_t T, int64_t C, int64_t M,
             int gate_idx)
TS_CUDA_STUB(timestep_embedding_forward, float *out, const float *t, int64_t B, int64_t D,
             float scale)
TS_CUDA_STUB(timestep_embedding_backward, float *dt, const float *dout, const float *t,
             int64_t B, int64_t D, float scale)
TS_CUDA_STUB(embedding_forward, float *out, const float *table, const int32_t *ids, int64_t B,
             int64_t D)
TS_CUDA_STUB(embedding_backward, float *dtable, const float *dout, const int32_t *ids,
             int64_t B, int64_t D)
TS_CUDA_STUB(patchify_forward, float *out, const float *img, int64_t B, int64_t C, int64_t H,
             int64_t W, int64_t p)
TS_CUDA_STUB(patchify_backward, float *dimg, const float *dout, int64_t B, int64_t C, int64_t H,
             int64_t W, int64_t p)
TS_CUDA_STUB(unpatchify_forward, float *img, const float *tok, int64_t B, int64_t C, int64_t H,
             int64_t W, int64_t p)
TS_CUDA_STUB(unpatchify_backward, float *dtok, const float *dimg, int64_t B, int64_t C,
             int64_t H, int64_t W, int64_t p)
TS_CUDA_STUB(sum, float *out, const float *inp, int64_t n)
TS_CUDA_STUB(sumsq, float *out, const float *inp, int64_t n)
TS_CUDA_STUB(add_scaled_scalar, float *dinp, const float *scalar, float mult, int64_t n)
TS_CUDA_STUB(sum_rows, float *out, const float *inp, int64_t rows, int64_t C)
TS_CUDA_STUB(mse_forward, float *loss, const float *pred, const float *target, int64_t n)
TS_CUDA_STUB(mse_backward, float *dpred, float dloss, const float *pred, const float *target,
             int64_t n)
TS_CUDA_STUB(flow_interp, float *xt, float *target, const float *x0, const float *eps,
             const float *t, int64_t B, int64_t S)
TS_CUDA_STUB(adamw, float *param, const float *grad, float *m, float *v, int64_t n, float lr,
             float beta1, float beta2, float eps, float wd, float bc1, float sqrt_bc2,
             float grad_scale)
TS_CUDA_STUB(ema, float *ema, const float *param, int64_t n, float decay)
TS_CUDA_STUB(rng_uniform, float *out, int64_t n, uint64_t seed, uint64_t offset)
TS_CUDA_STUB(rng_normal, float *out, int64_t n, uint64_t seed, uint64_t offset)

/* ---- engine and memory hooks ---- */

int ts_cuda_engine_init(ts_engine_t *e, int gpu) { return TS_ENODEV; }
void ts_cuda_engine_free(ts_engine_t *e) {}
int ts_cuda_engine_sync(ts_engine_t *e) { return TS_ENODEV; }

int ts_cuda_malloc(void **p, size_t bytes) {
    if (p)
        *p = NULL;
    return TS_ENODEV;
}
void ts_cuda_free(void *p) {}
int ts_cuda_memcpy(void *dst, ts_device_t dst_dev, const void *src, ts_device_t src_dev,
                   size_t bytes) {
    return TS_ENODEV;
}

int ts_cuda_is_built(void) { return 0; }

int ts_cuda_count(char *why, size_t why_len) {
    if (why && why_len > 0)
        snprintf(why, why_len, "%s",
                 "CUDA backend not built (configure with -DTESSERA_CUDA=ON on a machine with nvcc "
                 "and cuBLAS)");
    return 0;
}
