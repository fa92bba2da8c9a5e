/*
 * ops_internal.h — internal to the public ops (kernels/ops.c, ops_matmul.c, ops_norm.c,
 * ops_image.c): the dispatch to a backend and the argument checks every public op starts with.
 */
#ifndef TS_KERNELS_OPS_INTERNAL_H
#define TS_KERNELS_OPS_INTERNAL_H

#include "base/error.h"
#include "kernels/backend.h"
#include "kernels/tensor.h"

/* Calls ts_cpu_<name> or ts_cuda_<name> for the engine's device. */
#define DISPATCH(e, name, ...)                                                                     \
    ((e)->device == TS_CPU ? ts_cpu_##name((e), __VA_ARGS__) : ts_cuda_##name((e), __VA_ARGS__))

#define F(t) ((float *)(t)->data)
#define CF(t) ((const float *)(t)->data)
#define OPT(t) ((t) ? (float *)(t)->data : NULL)

/* e is a started engine: TS_EINVAL, or TS_ENODEV for a CUDA engine without its device. */
static inline int check_engine(const ts_engine_t *e) {
    if (!e)
        return TS_EINVAL;
    if (e->device == TS_CPU)
        return e->pool ? TS_OK : TS_EINVAL;
    if (e->device == TS_CUDA)
        return e->cuda ? TS_OK : TS_ENODEV;
    return TS_EINVAL;
}

/* t is a valid tensor of dtype dt on the engine's device. */
static inline int check_on(const ts_engine_t *e, const ts_tensor_t *t, ts_dtype_t dt) {
    TS_TRY(ts_tensor_check(t));
    if (t->device != e->device)
        return TS_EDEVICE;
    if (t->dtype != dt)
        return TS_EDTYPE;
    return TS_OK;
}

/* 1 when the memory of a and b overlaps. */
static inline int overlaps(const ts_tensor_t *a, const ts_tensor_t *b) {
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return a0 < b0 + ts_tensor_nbytes(b) && b0 < a0 + ts_tensor_nbytes(a);
}

static inline int check_f32(const ts_engine_t *e, const ts_tensor_t *t) {
    return check_on(e, t, TS_F32);
}

/* NULL is allowed (a gradient not wanted); otherwise as check_f32. */
static inline int check_opt(const ts_engine_t *e, const ts_tensor_t *t) {
    return t ? check_f32(e, t) : TS_OK;
}

static inline int same_numel(const ts_tensor_t *a, const ts_tensor_t *b) {
    return ts_tensor_numel(a) == ts_tensor_numel(b) ? TS_OK : TS_ESHAPE;
}

/* Two or three F32 tensors on the engine with the same element count, all required: an
 * elementwise forward (out, inp) or backward (dinp, dout, inp). */
static inline int check_same2(const ts_engine_t *e, const ts_tensor_t *a, const ts_tensor_t *b) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, a));
    TS_TRY(check_f32(e, b));
    return same_numel(a, b);
}

static inline int check_same3(const ts_engine_t *e, const ts_tensor_t *a, const ts_tensor_t *b,
                              const ts_tensor_t *c) {
    TS_TRY(check_same2(e, a, b));
    TS_TRY(check_f32(e, c));
    return same_numel(a, c);
}

/* The backend's gemm with operands in precision lp: TS_F32 (as stored), TS_BF16 or TS_F16
 * (rounded, fp32 accumulation) — ops_matmul.c's, for ts_matmul* and ts_conv2d_forward. */
int ts_ops__gemm_in(ts_engine_t *e, ts_dtype_t lp, int trans_a, int trans_b, int64_t M, int64_t N,
                    int64_t K, float alpha, const float *A, int64_t lda, int64_t stride_a,
                    const float *B, int64_t ldb, int64_t stride_b, float beta, float *C,
                    int64_t ldc, int64_t stride_c, int64_t batch);

#endif
