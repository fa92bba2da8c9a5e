/*
 * ops.c — the public ops: argument checks, then dispatch to a backend (see ops.h, backend.h).
 *
 * Every check happens here, once, before either backend sees a pointer: engine and tensors
 * present, F32 where the math needs it, every tensor on the engine's device, shapes consistent.
 * The backends can then assume valid input. Ops built from other ops (linear's backward, matmul's
 * backward, attention) are composed here from the backends' GEMM and row primitives, so both
 * backends share the composition as well as the per-element math. A linear layer's forward is one
 * backend op (GEMM, then the bias), so the CPU can add the bias to each slice of the product
 * while the slice is in cache.
 */
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/ops_internal.h"

/* ---- checks ---------------------------------------------------------------------------- */

static int check_index(const ts_engine_t *e, const ts_tensor_t *ids, int64_t V, int distinct);

/* NULL is allowed (a gradient not wanted); otherwise as check_f32. */
static int check_opt(const ts_engine_t *e, const ts_tensor_t *t) {
    return t ? check_f32(e, t) : TS_OK;
}

static int check_float_any(const ts_engine_t *e, const ts_tensor_t *t) {
    TS_TRY(ts_tensor_check(t));
    if (t->device != e->device)
        return TS_EDEVICE;
    if (t->dtype != TS_F32 && t->dtype != TS_F16 && t->dtype != TS_BF16)
        return TS_EDTYPE;
    return TS_OK;
}

static int same_numel(const ts_tensor_t *a, const ts_tensor_t *b) {
    return ts_tensor_numel(a) == ts_tensor_numel(b) ? TS_OK : TS_ESHAPE;
}

/* For a NULL-able tensor: same element count as ref, when present. */
static int same_numel_opt(const ts_tensor_t *t, const ts_tensor_t *ref) {
    return t ? same_numel(t, ref) : TS_OK;
}

static int check_scalar(const ts_engine_t *e, const ts_tensor_t *t) {
    TS_TRY(check_f32(e, t));
    return ts_tensor_numel(t) == 1 ? TS_OK : TS_ESHAPE;
}

/* ---- elementwise and copies ------------------------------------------------------------ */

int ts_fill(ts_engine_t *e, ts_tensor_t *t, float value) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, t));
    return DISPATCH(e, fill, F(t), ts_tensor_numel(t), value);
}

int ts_zero(ts_engine_t *e, ts_tensor_t *t) {
    TS_TRY(check_engine(e));
    TS_TRY(ts_tensor_check(t));
    if (t->device != e->device)
        return TS_EDEVICE;
    return DISPATCH(e, memzero, t->data, ts_tensor_nbytes(t));
}

int ts_axpy(ts_engine_t *e, ts_tensor_t *y, float alpha, const ts_tensor_t *x) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, y));
    TS_TRY(check_f32(e, x));
    TS_TRY(same_numel(y, x));
    return DISPATCH(e, axpy, F(y), alpha, CF(x), ts_tensor_numel(y));
}

int ts_scale(ts_engine_t *e, ts_tensor_t *t, float alpha) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, t));
    return DISPATCH(e, scale, F(t), alpha, ts_tensor_numel(t));
}

int ts_affine(ts_engine_t *e, ts_tensor_t *t, float alpha, float beta) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, t));
    return DISPATCH(e, affine, F(t), alpha, beta, ts_tensor_numel(t));
}

int ts_add(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *a, const ts_tensor_t *b) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, a));
    TS_TRY(check_f32(e, b));
    TS_TRY(same_numel(out, a));
    TS_TRY(same_numel(out, b));
    return DISPATCH(e, add, F(out), CF(a), CF(b), ts_tensor_numel(out));
}

/* x's element count is rows · S with S = b's element count. */
static int bcast_rows(const ts_tensor_t *x, const ts_tensor_t *b, int64_t *rows, int64_t *S) {
    *S = ts_tensor_numel(b);
    int64_t n = ts_tensor_numel(x);
    if (n % *S != 0)
        return TS_ESHAPE;
    *rows = n / *S;
    return TS_OK;
}

int ts_add_bcast_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *x,
                         const ts_tensor_t *b) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, x));
    TS_TRY(check_f32(e, b));
    TS_TRY(same_numel(out, x));
    int64_t rows, S;
    TS_TRY(bcast_rows(x, b, &rows, &S));
    return DISPATCH(e, add_bcast_forward, F(out), CF(x), CF(b), rows, S);
}

int ts_add_bcast_backward(ts_engine_t *e, ts_tensor_t *dx, ts_tensor_t *db,
                          const ts_tensor_t *dout) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_opt(e, dx));
    TS_TRY(check_opt(e, db));
    TS_TRY(same_numel_opt(dx, dout));
    int64_t rows = ts_tensor_numel(dout), S = 1;
    if (db)
        TS_TRY(bcast_rows(dout, db, &rows, &S));
    else
        S = ts_tensor_cols(dout), rows = ts_tensor_rows(dout);
    return DISPATCH(e, add_bcast_backward, OPT(dx), OPT(db), CF(dout), rows, S);
}

/* inp (n, ...) and rows (m, ...) with the same row size; returns it. */
static int row_size(const ts_tensor_t *inp, const ts_tensor_t *rows_t, int64_t *S) {
    int64_t n = inp->shape[0], m = rows_t->shape[0];
    *S = ts_tensor_numel(inp) / n;
    return ts_tensor_numel(rows_t) / m == *S ? TS_OK : TS_ESHAPE;
}

int ts_gather_rows(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                   const ts_tensor_t *idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, inp));
    TS_TRY(ts_tensor_check(idx));
    int64_t S;
    TS_TRY(row_size(inp, out, &S));
    if (ts_tensor_numel(idx) != out->shape[0])
        return TS_ESHAPE;
    TS_TRY(check_index(e, idx, inp->shape[0], 0));
    return DISPATCH(e, gather_rows, F(out), CF(inp), (const int32_t *)idx->data, out->shape[0], S);
}

int ts_scatter_axpy_rows(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                         const ts_tensor_t *idx, const ts_tensor_t *w) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, inp));
    TS_TRY(check_f32(e, w));
    TS_TRY(ts_tensor_check(idx));
    int64_t S, m = inp->shape[0];
    TS_TRY(row_size(out, inp, &S));
    if (ts_tensor_numel(idx) != m || ts_tensor_numel(w) != m)
        return TS_ESHAPE;
    TS_TRY(check_index(e, idx, out->shape[0], 1));
    return DISPATCH(e, scatter_axpy_rows, F(out), CF(inp), (const int32_t *)idx->data, CF(w), m, S);
}

int ts_convert(ts_engine_t *e, ts_tensor_t *dst, const ts_tensor_t *src) {
    TS_TRY(check_engine(e));
    TS_TRY(check_float_any(e, dst));
    TS_TRY(check_float_any(e, src));
    TS_TRY(same_numel(dst, src));
    if (dst->data == src->data)
        return TS_EINVAL;
    if (dst->dtype == src->dtype)
        return ts_tensor_copy(dst, src);
    return DISPATCH(e, convert, dst->data, dst->dtype, src->data, src->dtype, ts_tensor_numel(src));
}

int ts_check_finite(ts_engine_t *e, const ts_tensor_t *t) {
    TS_TRY(check_engine(e));
    TS_TRY(check_float_any(e, t));
    int64_t count = 0;
    TS_TRY(DISPATCH(e, count_nonfinite, t->data, t->dtype, ts_tensor_numel(t), &count));
    return count ? TS_ENONFINITE : TS_OK;
}

/* ---- matrix products ------------------------------------------------------------------- */

typedef struct {
    int64_t M, N, K, group;
} linear_dims_t;

/* The sizes of out (..., N) = inp (..., K) · weightᵀ (N, K) + bias (N), checked; an item of the
 * batch is inp's leading index: its rows are M / shape[0] (1 for a 2-D input). */
static int linear_dims(const ts_tensor_t *out, const ts_tensor_t *inp, const ts_tensor_t *weight,
                       const ts_tensor_t *bias, linear_dims_t *d) {
    if (weight->ndim != 2)
        return TS_ESHAPE;
    int64_t N = weight->shape[0], K = weight->shape[1];
    int64_t M = ts_tensor_rows(inp);
    if (ts_tensor_cols(inp) != K || ts_tensor_cols(out) != N || ts_tensor_rows(out) != M)
        return TS_ESHAPE;
    if (bias && ts_tensor_numel(bias) != N)
        return TS_ESHAPE;
    int64_t group = inp->ndim >= 3 && inp->shape[0] > 0 ? M / inp->shape[0] : 1;
    *d = (linear_dims_t){M, N, K, group};
    return TS_OK;
}

int ts_linear_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                      const ts_tensor_t *weight, const ts_tensor_t *bias) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, inp));
    ts_dtype_t wt = weight && (weight->dtype == TS_BF16 || weight->dtype == TS_F16) ? weight->dtype
                                                                                  : TS_F32;
    TS_TRY(check_on(e, weight, wt));
    TS_TRY(check_opt(e, bias));
    linear_dims_t d;
    TS_TRY(linear_dims(out, inp, weight, bias, &d));
    if (wt == TS_BF16)
        return DISPATCH(e, linear_forward_bf16, F(out), CF(inp), (const uint16_t *)weight->data,
                        OPT(bias), d.M, d.N, d.K, d.group);
    if (wt == TS_F16)
        return DISPATCH(e, linear_forward_f16, F(out), CF(inp), (const uint16_t *)weight->data,
                        OPT(bias), d.M, d.N, d.K, d.group);
    return DISPATCH(e, linear_forward, F(out), CF(inp), CF(weight), OPT(bias), d.M, d.N, d.K,
                    d.group);
}

int ts_linear_gelu_forward(ts_engine_t *e, ts_tensor_t *pre, ts_tensor_t *act,
                           const ts_tensor_t *inp, const ts_tensor_t *weight,
                           const ts_tensor_t *bias) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, pre));
    TS_TRY(check_f32(e, act));
    TS_TRY(check_f32(e, inp));
    TS_TRY(check_f32(e, weight)); /* the bf16 forward runs its own GELU (ts_gelu_forward_bf16) */
    TS_TRY(check_opt(e, bias));
    if (!ts_tensor_same_shape(pre, act))
        return TS_ESHAPE;
    linear_dims_t d;
    TS_TRY(linear_dims(pre, inp, weight, bias, &d));
    return DISPATCH(e, linear_gelu_forward, F(pre), F(act), CF(inp), CF(weight), OPT(bias), d.M,
                    d.N, d.K, d.group);
}

int ts_linear_backward(ts_engine_t *e, ts_tensor_t *dinp, ts_tensor_t *dweight, ts_tensor_t *dbias,
                       const ts_tensor_t *dout, const ts_tensor_t *inp, const ts_tensor_t *weight) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, inp));
    ts_dtype_t wt = weight && (weight->dtype == TS_BF16 || weight->dtype == TS_F16) ? weight->dtype
                                                                                  : TS_F32;
    int bf16 = wt == TS_BF16, lp = wt != TS_F32;
    TS_TRY(check_on(e, weight, wt));
    TS_TRY(check_opt(e, dinp));
    TS_TRY(check_opt(e, dweight));
    TS_TRY(check_opt(e, dbias));
    if (weight->ndim != 2)
        return TS_ESHAPE;
    int64_t N = weight->shape[0], K = weight->shape[1];
    int64_t M = ts_tensor_rows(inp);
    if (ts_tensor_cols(inp) != K || ts_tensor_cols(dout) != N || ts_tensor_rows(dout) != M)
        return TS_ESHAPE;
    if ((dinp && ts_tensor_numel(dinp) != M * K) ||
        (dweight && ts_tensor_numel(dweight) != N * K) || (dbias && ts_tensor_numel(dbias) != N))
        return TS_ESHAPE;
    if (bf16 && (dinp || dweight)) /* both products in bf16, as the bf16 forward's */
        TS_TRY(DISPATCH(e, linear_backward_bf16, OPT(dinp), OPT(dweight), CF(dout), CF(inp),
                        (const uint16_t *)weight->data, M, N, K));
    if (lp && !bf16 && (dinp || dweight)) /* f16 likewise */
        TS_TRY(DISPATCH(e, linear_backward_f16, OPT(dinp), OPT(dweight), CF(dout), CF(inp),
                        (const uint16_t *)weight->data, M, N, K));
    /* dinp (M, K) += dout (M, N) · weight (N, K) */
    if (dinp && !lp)
        TS_TRY(DISPATCH(e, gemm, 0, 0, M, K, N, 1.0f, CF(dout), N, 0, CF(weight), K, 0, 1.0f,
                        F(dinp), K, 0, 1));
    /* dweight (N, K) += doutᵀ (N, M) · inp (M, K) */
    if (dweight && !lp)
        TS_TRY(DISPATCH(e, gemm, 1, 0, N, K, M, 1.0f, CF(dout), N, 0, CF(inp), K, 0, 1.0f,
                        F(dweight), K, 0, 1));
    if (dbias)
        TS_TRY(DISPATCH(e, add_bcast_backward, NULL, F(dbias), CF(dout), M, N));
    return TS_OK;
}

/* Reads a 2-D or 3-D operand as (batch, rows, cols) as stored. */
static void as_batched(const ts_tensor_t *t, int64_t *batch, int64_t *r, int64_t *c) {
    *batch = t->ndim == 3 ? t->shape[0] : 1;
    *r = t->shape[t->ndim - 2];
    *c = t->shape[t->ndim - 1];
}

typedef struct {
    int64_t batch, M, N, K;
} mm_dims_t;

/* Checks c = op(a) · op(b) and returns its dimensions. */
static int matmul_dims(const ts_tensor_t *c, const ts_tensor_t *a, int ta, const ts_tensor_t *b,
                       int tb, mm_dims_t *d) {
    if (a->ndim < 2 || a->ndim > 3 || a->ndim != b->ndim || a->ndim != c->ndim)
        return TS_ESHAPE;
    int64_t ba, ra, ca, bb, rb, cb, bc, rc, cc;
    as_batched(a, &ba, &ra, &ca);
    as_batched(b, &bb, &rb, &cb);
    as_batched(c, &bc, &rc, &cc);
    int64_t M = ta ? ca : ra, K = ta ? ra : ca;
    int64_t Kb = tb ? cb : rb, N = tb ? rb : cb;
    if (ba != bb || ba != bc || K != Kb || rc != M || cc != N)
        return TS_ESHAPE;
    d->batch = ba;
    d->M = M;
    d->N = N;
    d->K = K;
    return TS_OK;
}

/* The backend's gemm with operands in precision lp: TS_F32 (as stored), TS_BF16 or TS_F16
 * (rounded, fp32 accumulation). */
static int gemm_in(ts_engine_t *e, ts_dtype_t lp, int trans_a, int trans_b, int64_t M, int64_t N,
                   int64_t K, float alpha, const float *A, int64_t lda, int64_t stride_a,
                   const float *B, int64_t ldb, int64_t stride_b, float beta, float *C,
                   int64_t ldc, int64_t stride_c, int64_t batch) {
    if (lp == TS_BF16)
        return DISPATCH(e, gemm_bf16, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb,
                        stride_b, beta, C, ldc, stride_c, batch);
    if (lp == TS_F16)
        return DISPATCH(e, gemm_f16, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb,
                        stride_b, beta, C, ldc, stride_c, batch);
    return DISPATCH(e, gemm, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b,
                    beta, C, ldc, stride_c, batch);
}

static int matmul(ts_engine_t *e, ts_tensor_t *c, const ts_tensor_t *a, int trans_a,
                  const ts_tensor_t *b, int trans_b, float alpha, float beta, ts_dtype_t lp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, c));
    TS_TRY(check_f32(e, a));
    TS_TRY(check_f32(e, b));
    mm_dims_t d;
    TS_TRY(matmul_dims(c, a, trans_a, b, trans_b, &d));
    int64_t lda = a->shape[a->ndim - 1], ldb = b->shape[b->ndim - 1];
    return gemm_in(e, lp, trans_a, trans_b, d.M, d.N, d.K, alpha, CF(a), lda, d.M * d.K, CF(b), ldb,
                   d.K * d.N, beta, F(c), d.N, d.M * d.N, d.batch);
}

int ts_matmul(ts_engine_t *e, ts_tensor_t *c, const ts_tensor_t *a, int trans_a,
              const ts_tensor_t *b, int trans_b, float alpha, float beta) {
    return matmul(e, c, a, trans_a, b, trans_b, alpha, beta, TS_F32);
}

int ts_matmul_bf16(ts_engine_t *e, ts_tensor_t *c, const ts_tensor_t *a, int trans_a,
                   const ts_tensor_t *b, int trans_b, float alpha, float beta) {
    return matmul(e, c, a, trans_a, b, trans_b, alpha, beta, TS_BF16);
}

int ts_matmul_f16(ts_engine_t *e, ts_tensor_t *c, const ts_tensor_t *a, int trans_a,
                  const ts_tensor_t *b, int trans_b, float alpha, float beta) {
    return matmul(e, c, a, trans_a, b, trans_b, alpha, beta, TS_F16);
}

int ts_matmul_backward(ts_engine_t *e, ts_tensor_t *da, ts_tensor_t *db, const ts_tensor_t *dc,
                       const ts_tensor_t *a, int trans_a, const ts_tensor_t *b, int trans_b,
                       float alpha) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dc));
    TS_TRY(check_f32(e, a));
    TS_TRY(check_f32(e, b));
    TS_TRY(check_opt(e, da));
    TS_TRY(check_opt(e, db));
    mm_dims_t d;
    TS_TRY(matmul_dims(dc, a, trans_a, b, trans_b, &d));
    if ((da && !ts_tensor_same_shape(da, a)) || (db && !ts_tensor_same_shape(db, b)))
        return TS_ESHAPE;
    int64_t M = d.M, N = d.N, K = d.K, sa = M * K, sb = K * N, sc = M * N;
    int64_t lda = a->shape[a->ndim - 1], ldb = b->shape[b->ndim - 1];
    /* With A = op(a), B = op(b): dA = alpha · dC · Bᵀ, dB = alpha · Aᵀ · dC. When a is stored
     * transposed, da = dAᵀ = alpha · B · dCᵀ; likewise for b. */
    if (da) {
        if (!trans_a) /* da (M, K) += dC (M, N) · op(b)ᵀ */
            TS_TRY(DISPATCH(e, gemm, 0, !trans_b, M, K, N, alpha, CF(dc), N, sc, CF(b), ldb, sb,
                            1.0f, F(da), K, sa, d.batch));
        else /* da (K, M) += op(b) (K, N) · dCᵀ */
            TS_TRY(DISPATCH(e, gemm, trans_b, 1, K, M, N, alpha, CF(b), ldb, sb, CF(dc), N, sc,
                            1.0f, F(da), M, sa, d.batch));
    }
    if (db) {
        if (!trans_b) /* db (K, N) += op(a)ᵀ · dC */
            TS_TRY(DISPATCH(e, gemm, !trans_a, 0, K, N, M, alpha, CF(a), lda, sa, CF(dc), N, sc,
                            1.0f, F(db), N, sb, d.batch));
        else /* db (N, K) += dCᵀ · op(a) */
            TS_TRY(DISPATCH(e, gemm, 1, trans_a, N, K, M, alpha, CF(dc), N, sc, CF(a), lda, sa,
                            1.0f, F(db), K, sb, d.batch));
    }
    return TS_OK;
}

/* ---- normalisation and activations ------------------------------------------------------ */

static int check_rows(const ts_engine_t *e, const ts_tensor_t *stat, int64_t rows) {
    if (!stat)
        return TS_OK;
    TS_TRY(check_f32(e, stat));
    return ts_tensor_numel(stat) == rows ? TS_OK : TS_ESHAPE;
}

int ts_layernorm_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *mean, ts_tensor_t *rstd,
                         const ts_tensor_t *inp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, inp));
    TS_TRY(same_numel(out, inp));
    if (ts_tensor_cols(out) != ts_tensor_cols(inp))
        return TS_ESHAPE;
    int64_t rows = ts_tensor_rows(inp), C = ts_tensor_cols(inp);
    TS_TRY(check_rows(e, mean, rows));
    TS_TRY(check_rows(e, rstd, rows));
    return DISPATCH(e, layernorm_forward, F(out), OPT(mean), OPT(rstd), CF(inp), rows, C);
}

int ts_layernorm_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                          const ts_tensor_t *inp, const ts_tensor_t *mean,
                          const ts_tensor_t *rstd) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dinp));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, inp));
    if (!mean || !rstd)
        return TS_EINVAL;
    TS_TRY(same_numel(dinp, inp));
    TS_TRY(same_numel(dout, inp));
    int64_t rows = ts_tensor_rows(inp), C = ts_tensor_cols(inp);
    TS_TRY(check_rows(e, mean, rows));
    TS_TRY(check_rows(e, rstd, rows));
    return DISPATCH(e, layernorm_backward, F(dinp), CF(dout), CF(inp), CF(mean), CF(rstd), rows, C);
}

/* Two or three F32 tensors on the engine with the same element count, all required: an
 * elementwise forward (out, inp) or backward (dinp, dout, inp). */
static int check_same2(const ts_engine_t *e, const ts_tensor_t *a, const ts_tensor_t *b) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, a));
    TS_TRY(check_f32(e, b));
    return same_numel(a, b);
}

static int check_same3(const ts_engine_t *e, const ts_tensor_t *a, const ts_tensor_t *b,
                       const ts_tensor_t *c) {
    TS_TRY(check_same2(e, a, b));
    TS_TRY(check_f32(e, c));
    return same_numel(a, c);
}

int ts_gelu_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_same2(e, out, inp));
    return DISPATCH(e, gelu_forward, F(out), CF(inp), ts_tensor_numel(out));
}

int ts_gelu_forward_bf16(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_same2(e, out, inp));
    return DISPATCH(e, gelu_forward_bf16, F(out), CF(inp), ts_tensor_numel(out));
}

int ts_gelu_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                     const ts_tensor_t *inp) {
    TS_TRY(check_same3(e, dinp, dout, inp));
    return DISPATCH(e, gelu_backward, F(dinp), CF(dout), CF(inp), ts_tensor_numel(dinp));
}

int ts_silu_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_same2(e, out, inp));
    return DISPATCH(e, silu_forward, F(out), CF(inp), ts_tensor_numel(out));
}

int ts_silu_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                     const ts_tensor_t *inp) {
    TS_TRY(check_same3(e, dinp, dout, inp));
    return DISPATCH(e, silu_backward, F(dinp), CF(dout), CF(inp), ts_tensor_numel(dinp));
}

int ts_softmax_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_same2(e, out, inp));
    if (ts_tensor_cols(out) != ts_tensor_cols(inp))
        return TS_ESHAPE;
    return DISPATCH(e, softmax_forward, F(out), CF(inp), ts_tensor_rows(inp), ts_tensor_cols(inp));
}

int ts_softmax_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                        const ts_tensor_t *out) {
    TS_TRY(check_same3(e, dinp, dout, out));
    if (ts_tensor_cols(dinp) != ts_tensor_cols(out) || ts_tensor_cols(dout) != ts_tensor_cols(out))
        return TS_ESHAPE;
    return DISPATCH(e, softmax_backward, F(dinp), CF(dout), CF(out), ts_tensor_rows(out),
                    ts_tensor_cols(out), 1.0f, 1);
}

/* ---- attention ------------------------------------------------------------------------- */

typedef struct {
    int64_t B, T, C, H, hd;
} att_dims_t;

/* qkv (B, T, 3C), the last axis (3, heads, C/heads); out (B, T, C). */
static int attention_dims(const ts_tensor_t *qkv, const ts_tensor_t *out, int heads,
                          att_dims_t *d) {
    if (heads < 1 || qkv->ndim != 3 || out->ndim != 3)
        return TS_ESHAPE;
    int64_t B = qkv->shape[0], T = qkv->shape[1], C3 = qkv->shape[2];
    if (C3 % 3 != 0 || (C3 / 3) % heads != 0)
        return TS_ESHAPE;
    int64_t C = C3 / 3;
    if (out->shape[0] != B || out->shape[1] != T || out->shape[2] != C)
        return TS_ESHAPE;
    *d = (att_dims_t){B, T, C, heads, C / heads};
    return TS_OK;
}

/* att (B, heads, T, T): the composed op's softmax weights. */
static int att_shape(const ts_tensor_t *att, const att_dims_t *d) {
    int64_t want[4] = {d->B, d->H, d->T, d->T};
    if (att->ndim != 4)
        return TS_ESHAPE;
    for (int i = 0; i < 4; i++)
        if (att->shape[i] != want[i])
            return TS_ESHAPE;
    return TS_OK;
}

/* For sample b, head h: Q, K, V are (T, hd) slices of qkv with row stride 3C, at column offsets
 * h·hd, C + h·hd, 2C + h·hd; the heads of one sample are a strided batch (stride hd). So no
 * permuted copies of q, k, v are ever made: the GEMMs read them in place. */
static int attention_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *att,
                             const ts_tensor_t *qkv, int heads, ts_dtype_t lp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, att));
    TS_TRY(check_f32(e, qkv));
    att_dims_t d;
    TS_TRY(attention_dims(qkv, out, heads, &d));
    TS_TRY(att_shape(att, &d));
    int64_t T = d.T, C = d.C, H = d.H, hd = d.hd, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t b = 0; b < d.B; b++) {
        const float *q = CF(qkv) + b * T * ld;
        float *a = F(att) + b * H * T * T;
        /* att[b, h] (T, T) = scale · Q_h · K_hᵀ */
        TS_TRY(gemm_in(e, lp, 0, 1, T, T, hd, scale, q, ld, hd, q + C, ld, hd, 0.0f, a, T, T * T,
                       H));
    }
    TS_TRY(DISPATCH(e, softmax_forward, F(att), CF(att), d.B * H * T, T));
    for (int64_t b = 0; b < d.B; b++) {
        const float *v = CF(qkv) + b * T * ld + 2 * C;
        const float *a = CF(att) + b * H * T * T;
        /* out[b, :, h·hd:(h+1)·hd] (T, hd) = att[b, h] (T, T) · V_h (T, hd) */
        TS_TRY(gemm_in(e, lp, 0, 0, T, hd, T, 1.0f, a, T, T * T, v, ld, hd, 0.0f,
                       F(out) + b * T * C, C, hd, H));
    }
    return TS_OK;
}

int ts_attention_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *att, const ts_tensor_t *qkv,
                         int heads) {
    return attention_forward(e, out, att, qkv, heads, TS_F32);
}

int ts_attention_forward_bf16(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *att,
                              const ts_tensor_t *qkv, int heads) {
    return attention_forward(e, out, att, qkv, heads, TS_BF16);
}

int ts_attention_forward_f16(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *att,
                             const ts_tensor_t *qkv, int heads) {
    return attention_forward(e, out, att, qkv, heads, TS_F16);
}

int ts_attention_backward(ts_engine_t *e, ts_tensor_t *dqkv, ts_tensor_t *datt,
                          const ts_tensor_t *dout, const ts_tensor_t *qkv, const ts_tensor_t *att,
                          int heads) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dqkv));
    TS_TRY(check_f32(e, datt));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, qkv));
    TS_TRY(check_f32(e, att));
    att_dims_t d;
    TS_TRY(attention_dims(qkv, dout, heads, &d));
    TS_TRY(att_shape(att, &d));
    if (!ts_tensor_same_shape(dqkv, qkv) || !ts_tensor_same_shape(datt, att))
        return TS_ESHAPE;
    int64_t T = d.T, C = d.C, H = d.H, hd = d.hd, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t b = 0; b < d.B; b++) {
        const float *q = CF(qkv) + b * T * ld, *k = q + C, *v = q + 2 * C;
        float *dq = F(dqkv) + b * T * ld, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = CF(att) + b * H * T * T;
        float *da = F(datt) + b * H * T * T;
        const float *dy = CF(dout) + b * T * C;
        /* datt (T, T) = dY_h (T, hd) · V_hᵀ */
        TS_TRY(
            DISPATCH(e, gemm, 0, 1, T, T, hd, 1.0f, dy, C, hd, v, ld, hd, 0.0f, da, T, T * T, H));
        /* dV_h (T, hd) += attᵀ (T, T) · dY_h */
        TS_TRY(
            DISPATCH(e, gemm, 1, 0, T, hd, T, 1.0f, a, T, T * T, dy, C, hd, 1.0f, dv, ld, hd, H));
        /* dS = scale · softmax'(att) · datt, in place */
        TS_TRY(DISPATCH(e, softmax_backward, da, da, a, H * T, T, scale, 0));
        /* dQ_h += dS · K_h; dK_h += dSᵀ · Q_h */
        TS_TRY(
            DISPATCH(e, gemm, 0, 0, T, hd, T, 1.0f, da, T, T * T, k, ld, hd, 1.0f, dq, ld, hd, H));
        TS_TRY(
            DISPATCH(e, gemm, 1, 0, T, hd, T, 1.0f, da, T, T * T, q, ld, hd, 1.0f, dk, ld, hd, H));
    }
    return TS_OK;
}

/* ---- fused attention ------------------------------------------------------------------- */

/* lse (B, heads, T) when present. */
static int lse_shape(const ts_tensor_t *lse, const att_dims_t *d) {
    if (!lse)
        return TS_OK;
    if (lse->ndim != 3 || lse->shape[0] != d->B || lse->shape[1] != d->H || lse->shape[2] != d->T)
        return TS_ESHAPE;
    return TS_OK;
}

static int fused_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *lse, const ts_tensor_t *qkv,
                         int heads, int bf16) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_opt(e, lse));
    TS_TRY(check_f32(e, qkv));
    att_dims_t d;
    TS_TRY(attention_dims(qkv, out, heads, &d));
    TS_TRY(lse_shape(lse, &d));
    if (bf16)
        return DISPATCH(e, attention_fused_forward_bf16, F(out), OPT(lse), CF(qkv), d.B, d.T, d.C,
                        d.H);
    return DISPATCH(e, attention_fused_forward, F(out), OPT(lse), CF(qkv), d.B, d.T, d.C, d.H);
}

int ts_attention_fused_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *lse,
                               const ts_tensor_t *qkv, int heads) {
    return fused_forward(e, out, lse, qkv, heads, 0);
}

int ts_attention_fused_forward_bf16(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *lse,
                                    const ts_tensor_t *qkv, int heads) {
    return fused_forward(e, out, lse, qkv, heads, 1);
}

int ts_attention_fused_bf16_check(ts_engine_t *e) {
    TS_TRY(check_engine(e));
    return e->device == TS_CPU && ts_cpu_attention_fused_bf16_ok() ? TS_OK : TS_ENOTSUP;
}

static int fused_backward(ts_engine_t *e, ts_tensor_t *dqkv, const ts_tensor_t *dout,
                          const ts_tensor_t *qkv, const ts_tensor_t *out, const ts_tensor_t *lse,
                          int heads, int bf16) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dqkv));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, qkv));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, lse));
    att_dims_t d;
    TS_TRY(attention_dims(qkv, out, heads, &d));
    TS_TRY(lse_shape(lse, &d));
    if (!ts_tensor_same_shape(dqkv, qkv) || !ts_tensor_same_shape(dout, out))
        return TS_ESHAPE;
    if (bf16)
        return DISPATCH(e, attention_fused_backward_bf16, F(dqkv), CF(dout), CF(qkv), CF(out),
                        CF(lse), d.B, d.T, d.C, d.H);
    return DISPATCH(e, attention_fused_backward, F(dqkv), CF(dout), CF(qkv), CF(out), CF(lse), d.B,
                    d.T, d.C, d.H);
}

int ts_attention_fused_backward(ts_engine_t *e, ts_tensor_t *dqkv, const ts_tensor_t *dout,
                                const ts_tensor_t *qkv, const ts_tensor_t *out,
                                const ts_tensor_t *lse, int heads) {
    return fused_backward(e, dqkv, dout, qkv, out, lse, heads, 0);
}

int ts_attention_fused_backward_bf16(ts_engine_t *e, ts_tensor_t *dqkv, const ts_tensor_t *dout,
                                     const ts_tensor_t *qkv, const ts_tensor_t *out,
                                     const ts_tensor_t *lse, int heads) {
    return fused_backward(e, dqkv, dout, qkv, out, lse, heads, 1);
}

/* ---- adaLN-Zero pieces ----------------------------------------------------------------- */

typedef struct {
    int64_t B, T, C, M;
} ada_dims_t;

/* x (B, T, C) and mod (B, M·C); chunk indices within [0, M). */
static int ada_dims(const ts_tensor_t *x, const ts_tensor_t *mod, int i0, int i1, ada_dims_t *d) {
    if (x->ndim != 3 || mod->ndim != 2)
        return TS_ESHAPE;
    int64_t B = x->shape[0], T = x->shape[1], C = x->shape[2];
    if (mod->shape[0] != B || mod->shape[1] % C != 0)
        return TS_ESHAPE;
    int64_t M = mod->shape[1] / C;
    if (i0 < 0 || i0 >= M || i1 < 0 || i1 >= M)
        return TS_ERANGE;
    *d = (ada_dims_t){B, T, C, M};
    return TS_OK;
}

int ts_modulate_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *x,
                        const ts_tensor_t *mod, int shift_idx, int scale_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, x));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(out, x))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(x, mod, shift_idx, scale_idx, &d));
    return DISPATCH(e, modulate_forward, F(out), CF(x), CF(mod), d.B, d.T, d.C, d.M, shift_idx,
                    scale_idx);
}

int ts_layernorm_modulate_forward(ts_engine_t *e, ts_tensor_t *ln, ts_tensor_t *mean,
                                  ts_tensor_t *rstd, ts_tensor_t *out, const ts_tensor_t *x,
                                  const ts_tensor_t *mod, int shift_idx, int scale_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, ln));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, x));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(ln, x) || !ts_tensor_same_shape(out, x))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(x, mod, shift_idx, scale_idx, &d));
    TS_TRY(check_rows(e, mean, d.B * d.T));
    TS_TRY(check_rows(e, rstd, d.B * d.T));
    return DISPATCH(e, layernorm_modulate_forward, F(ln), OPT(mean), OPT(rstd), F(out), CF(x),
                    CF(mod), d.B, d.T, d.C, d.M, shift_idx, scale_idx);
}

int ts_modulate_backward(ts_engine_t *e, ts_tensor_t *dx, ts_tensor_t *dmod,
                         const ts_tensor_t *dout, const ts_tensor_t *x, const ts_tensor_t *mod,
                         int shift_idx, int scale_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_opt(e, dx));
    TS_TRY(check_opt(e, dmod));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, x));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(dout, x) || (dx && !ts_tensor_same_shape(dx, x)) ||
        (dmod && !ts_tensor_same_shape(dmod, mod)))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(x, mod, shift_idx, scale_idx, &d));
    return DISPATCH(e, modulate_backward, OPT(dx), OPT(dmod), CF(dout), CF(x), CF(mod), d.B, d.T,
                    d.C, d.M, shift_idx, scale_idx);
}

int ts_gate_residual_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *res,
                             const ts_tensor_t *y, const ts_tensor_t *mod, int gate_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, res));
    TS_TRY(check_f32(e, y));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(out, y) || !ts_tensor_same_shape(res, y))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(y, mod, gate_idx, gate_idx, &d));
    return DISPATCH(e, gate_residual_forward, F(out), CF(res), CF(y), CF(mod), d.B, d.T, d.C, d.M,
                    gate_idx);
}

int ts_gate_residual_backward(ts_engine_t *e, ts_tensor_t *dres, ts_tensor_t *dy, ts_tensor_t *dmod,
                              const ts_tensor_t *dout, const ts_tensor_t *y, const ts_tensor_t *mod,
                              int gate_idx) {
    TS_TRY(check_engine(e));
    TS_TRY(check_opt(e, dres));
    TS_TRY(check_opt(e, dy));
    TS_TRY(check_opt(e, dmod));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, y));
    TS_TRY(check_f32(e, mod));
    if (!ts_tensor_same_shape(dout, y) || (dres && !ts_tensor_same_shape(dres, y)) ||
        (dy && !ts_tensor_same_shape(dy, y)) || (dmod && !ts_tensor_same_shape(dmod, mod)))
        return TS_ESHAPE;
    ada_dims_t d;
    TS_TRY(ada_dims(y, mod, gate_idx, gate_idx, &d));
    return DISPATCH(e, gate_residual_backward, OPT(dres), OPT(dy), OPT(dmod), CF(dout), CF(y),
                    CF(mod), d.B, d.T, d.C, d.M, gate_idx);
}

/* ---- embeddings ------------------------------------------------------------------------ */

static int timestep_dims(const ts_tensor_t *emb, const ts_tensor_t *t, int64_t *B, int64_t *D) {
    if (emb->ndim != 2 || ts_tensor_numel(t) != emb->shape[0] || emb->shape[1] < 2)
        return TS_ESHAPE;
    *B = emb->shape[0];
    *D = emb->shape[1];
    return TS_OK;
}

int ts_timestep_embedding_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *t,
                                  float scale) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, t));
    int64_t B, D;
    TS_TRY(timestep_dims(out, t, &B, &D));
    return DISPATCH(e, timestep_embedding_forward, F(out), CF(t), B, D, scale);
}

int ts_timestep_embedding_backward(ts_engine_t *e, ts_tensor_t *dt, const ts_tensor_t *dout,
                                   const ts_tensor_t *t, float scale) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dt));
    TS_TRY(check_f32(e, dout));
    TS_TRY(check_f32(e, t));
    TS_TRY(same_numel(dt, t));
    int64_t B, D;
    TS_TRY(timestep_dims(dout, t, &B, &D));
    return DISPATCH(e, timestep_embedding_backward, F(dt), CF(dout), CF(t), B, D, scale);
}

int ts_pos_embed_2d(ts_engine_t *e, ts_tensor_t *out, int grid) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    if (grid < 1 || out->ndim != 2 || out->shape[0] != (int64_t)grid * grid ||
        out->shape[1] % 4 != 0)
        return TS_ESHAPE;
    int64_t D = out->shape[1], Q = D / 4, T = out->shape[0];
    float *host = malloc((size_t)(T * D) * sizeof *host);
    if (!host)
        return TS_ENOMEM;
    /* token m = i·grid + j: [sin(j·ω), cos(j·ω), sin(i·ω), cos(i·ω)], ω_k = 10000^(−k/Q) */
    for (int64_t m = 0; m < T; m++) {
        double coord[2] = {(double)(m % grid), (double)(m / grid)};
        for (int half = 0; half < 2; half++)
            for (int64_t k = 0; k < Q; k++) {
                double arg = coord[half] * pow(10000.0, -(double)k / (double)Q);
                host[m * D + half * 2 * Q + k] = (float)sin(arg);
                host[m * D + half * 2 * Q + Q + k] = (float)cos(arg);
            }
    }
    ts_tensor_t h;
    int rc = ts_tensor_wrap(&h, host, TS_F32, TS_CPU, 2, out->shape);
    if (rc == TS_OK)
        rc = ts_tensor_copy(out, &h);
    free(host);
    return rc;
}

/* ids (B) I32 within [0, V), and pairwise distinct when `distinct`. For a CUDA engine the ids
 * are copied to the host to be checked. */
static int check_index(const ts_engine_t *e, const ts_tensor_t *ids, int64_t V, int distinct) {
    TS_TRY(check_on(e, ids, TS_I32));
    int64_t B = ts_tensor_numel(ids);
    int32_t *host = ids->data;
    if (e->device != TS_CPU) {
        host = malloc((size_t)B * sizeof *host);
        if (!host)
            return TS_ENOMEM;
        ts_tensor_t h;
        int rc = ts_tensor_wrap(&h, host, TS_I32, TS_CPU, 1, TS_SHAPE(B));
        if (rc == TS_OK)
            rc = ts_tensor_copy(&h, ids);
        if (rc != TS_OK) {
            free(host);
            return rc;
        }
    }
    int rc = TS_OK;
    unsigned char *seen = distinct ? calloc((size_t)V, 1) : NULL;
    if (distinct && !seen)
        rc = TS_ENOMEM;
    for (int64_t b = 0; b < B && rc == TS_OK; b++) {
        if (host[b] < 0 || host[b] >= V)
            rc = TS_ERANGE;
        else if (seen && seen[host[b]]++)
            rc = TS_EINVAL;
    }
    free(seen);
    if (host != ids->data)
        free(host);
    return rc;
}

static int check_ids(const ts_engine_t *e, const ts_tensor_t *ids, int64_t V) {
    return check_index(e, ids, V, 0);
}

static int embedding_dims(const ts_tensor_t *rows, const ts_tensor_t *table,
                          const ts_tensor_t *ids) {
    if (table->ndim != 2 || rows->ndim != 2 || rows->shape[1] != table->shape[1] ||
        rows->shape[0] != ts_tensor_numel(ids))
        return TS_ESHAPE;
    return TS_OK;
}

int ts_embedding_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *table,
                         const ts_tensor_t *ids) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, table));
    TS_TRY(ts_tensor_check(ids));
    TS_TRY(embedding_dims(out, table, ids));
    TS_TRY(check_ids(e, ids, table->shape[0]));
    return DISPATCH(e, embedding_forward, F(out), CF(table), (const int32_t *)ids->data,
                    out->shape[0], out->shape[1]);
}

int ts_embedding_backward(ts_engine_t *e, ts_tensor_t *dtable, const ts_tensor_t *dout,
                          const ts_tensor_t *ids) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dtable));
    TS_TRY(check_f32(e, dout));
    TS_TRY(ts_tensor_check(ids));
    TS_TRY(embedding_dims(dout, dtable, ids));
    TS_TRY(check_ids(e, ids, dtable->shape[0]));
    return DISPATCH(e, embedding_backward, F(dtable), CF(dout), (const int32_t *)ids->data,
                    dout->shape[0], dout->shape[1]);
}

/* ---- patches --------------------------------------------------------------------------- */

typedef struct {
    int64_t B, C, H, W;
} img_dims_t;

/* img (B, C, H, W) and tok (B, (H/p)·(W/p), C·p·p). */
static int patch_dims(const ts_tensor_t *img, const ts_tensor_t *tok, int p, img_dims_t *d) {
    if (p < 1 || img->ndim != 4 || tok->ndim != 3)
        return TS_ESHAPE;
    int64_t B = img->shape[0], C = img->shape[1], H = img->shape[2], W = img->shape[3];
    if (H % p != 0 || W % p != 0)
        return TS_ESHAPE;
    if (tok->shape[0] != B || tok->shape[1] != (H / p) * (W / p) || tok->shape[2] != C * p * p)
        return TS_ESHAPE;
    *d = (img_dims_t){B, C, H, W};
    return TS_OK;
}

static int check_patch(const ts_engine_t *e, const ts_tensor_t *img, const ts_tensor_t *tok, int p,
                       img_dims_t *d) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, img));
    TS_TRY(check_f32(e, tok));
    return patch_dims(img, tok, p, d);
}

int ts_patchify_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *img, int p) {
    img_dims_t d;
    TS_TRY(check_patch(e, img, out, p, &d));
    return DISPATCH(e, patchify_forward, F(out), CF(img), d.B, d.C, d.H, d.W, p);
}

int ts_patchify_backward(ts_engine_t *e, ts_tensor_t *dimg, const ts_tensor_t *dout, int p) {
    img_dims_t d;
    TS_TRY(check_patch(e, dimg, dout, p, &d));
    return DISPATCH(e, patchify_backward, F(dimg), CF(dout), d.B, d.C, d.H, d.W, p);
}

int ts_unpatchify_forward(ts_engine_t *e, ts_tensor_t *img, const ts_tensor_t *tok, int p) {
    img_dims_t d;
    TS_TRY(check_patch(e, img, tok, p, &d));
    return DISPATCH(e, unpatchify_forward, F(img), CF(tok), d.B, d.C, d.H, d.W, p);
}

int ts_unpatchify_backward(ts_engine_t *e, ts_tensor_t *dtok, const ts_tensor_t *dimg, int p) {
    img_dims_t d;
    TS_TRY(check_patch(e, dimg, dtok, p, &d));
    return DISPATCH(e, unpatchify_backward, F(dtok), CF(dimg), d.B, d.C, d.H, d.W, p);
}

/* ---- reductions and losses ------------------------------------------------------------- */

int ts_sum_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_scalar(e, out));
    TS_TRY(check_f32(e, inp));
    return DISPATCH(e, sum, F(out), CF(inp), ts_tensor_numel(inp));
}

int ts_sum_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dinp));
    TS_TRY(check_scalar(e, dout));
    return DISPATCH(e, add_scaled_scalar, F(dinp), CF(dout), 1.0f, ts_tensor_numel(dinp));
}

int ts_mean_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(ts_sum_forward(e, out, inp));
    return DISPATCH(e, scale, F(out), (float)(1.0 / (double)ts_tensor_numel(inp)), 1);
}

int ts_mean_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dinp));
    TS_TRY(check_scalar(e, dout));
    int64_t n = ts_tensor_numel(dinp);
    return DISPATCH(e, add_scaled_scalar, F(dinp), CF(dout), (float)(1.0 / (double)n), n);
}

int ts_sum_rows(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    TS_TRY(check_f32(e, inp));
    int64_t C = ts_tensor_cols(inp);
    if (ts_tensor_numel(out) != C)
        return TS_ESHAPE;
    return DISPATCH(e, sum_rows, F(out), CF(inp), ts_tensor_rows(inp), C);
}

int ts_sumsq(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_scalar(e, out));
    TS_TRY(check_f32(e, inp));
    return DISPATCH(e, sumsq, F(out), CF(inp), ts_tensor_numel(inp));
}

int ts_mse_forward(ts_engine_t *e, ts_tensor_t *loss, const ts_tensor_t *pred,
                   const ts_tensor_t *target) {
    TS_TRY(check_engine(e));
    TS_TRY(check_scalar(e, loss));
    TS_TRY(check_same2(e, pred, target));
    return DISPATCH(e, mse_forward, F(loss), CF(pred), CF(target), ts_tensor_numel(pred));
}

int ts_mse_backward(ts_engine_t *e, ts_tensor_t *dpred, float dloss, const ts_tensor_t *pred,
                    const ts_tensor_t *target) {
    TS_TRY(check_same3(e, dpred, pred, target));
    return DISPATCH(e, mse_backward, F(dpred), dloss, CF(pred), CF(target), ts_tensor_numel(pred));
}

/* logits (B, K) F32 and labels (B) I32 with every label in [0, K). */
static int check_xent(const ts_engine_t *e, const ts_tensor_t *logits, const ts_tensor_t *labels) {
    TS_TRY(check_f32(e, logits));
    TS_TRY(ts_tensor_check(labels));
    if (logits->ndim != 2 || ts_tensor_numel(labels) != logits->shape[0])
        return TS_ESHAPE;
    return check_index(e, labels, logits->shape[1], 0);
}

int ts_cross_entropy_forward(ts_engine_t *e, ts_tensor_t *loss, const ts_tensor_t *logits,
                             const ts_tensor_t *labels) {
    TS_TRY(check_engine(e));
    TS_TRY(check_scalar(e, loss));
    TS_TRY(check_xent(e, logits, labels));
    return DISPATCH(e, cross_entropy_forward, F(loss), CF(logits), (const int32_t *)labels->data,
                    logits->shape[0], logits->shape[1]);
}

int ts_cross_entropy_backward(ts_engine_t *e, ts_tensor_t *dlogits, float dloss,
                              const ts_tensor_t *logits, const ts_tensor_t *labels) {
    TS_TRY(check_engine(e));
    if (!dlogits)
        return TS_EINVAL; /* the only gradient output */
    TS_TRY(check_f32(e, dlogits));
    TS_TRY(check_xent(e, logits, labels));
    if (!ts_tensor_same_shape(dlogits, logits))
        return TS_ESHAPE;
    if (!isfinite(dloss))
        return TS_EINVAL;
    int64_t B = logits->shape[0];
    float scale = (float)((double)dloss / (double)B);
    return DISPATCH(e, cross_entropy_backward, F(dlogits), scale, CF(logits),
                    (const int32_t *)labels->data, B, logits->shape[1]);
}

/* x (B, T, C) and its token mean (B, C). */
static int check_mean_tokens(const ts_engine_t *e, const ts_tensor_t *x, const ts_tensor_t *m) {
    TS_TRY(check_f32(e, x));
    TS_TRY(check_f32(e, m));
    if (x->ndim != 3 || m->ndim != 2 || m->shape[0] != x->shape[0] || m->shape[1] != x->shape[2])
        return TS_ESHAPE;
    return TS_OK;
}

int ts_mean_tokens_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *x) {
    TS_TRY(check_engine(e));
    TS_TRY(check_mean_tokens(e, x, out));
    return DISPATCH(e, mean_tokens_forward, F(out), CF(x), x->shape[0], x->shape[1], x->shape[2]);
}

int ts_mean_tokens_backward(ts_engine_t *e, ts_tensor_t *dx, const ts_tensor_t *dout) {
    TS_TRY(check_engine(e));
    if (!dx)
        return TS_EINVAL; /* the only gradient output */
    TS_TRY(check_mean_tokens(e, dx, dout));
    return DISPATCH(e, mean_tokens_backward, F(dx), CF(dout), dx->shape[0], dx->shape[1],
                    dx->shape[2]);
}

int ts_flow_interp(ts_engine_t *e, ts_tensor_t *xt, ts_tensor_t *target, const ts_tensor_t *x0,
                   const ts_tensor_t *eps, const ts_tensor_t *t) {
    TS_TRY(check_same3(e, xt, target, x0));
    TS_TRY(check_f32(e, eps));
    TS_TRY(check_f32(e, t));
    TS_TRY(same_numel(xt, eps));
    int64_t B = ts_tensor_numel(t), n = ts_tensor_numel(xt);
    if (x0->shape[0] != B || n % B != 0)
        return TS_ESHAPE;
    if (xt->data == x0->data || xt->data == eps->data || target->data == x0->data ||
        target->data == eps->data || xt->data == target->data)
        return TS_EINVAL; /* the backends read the inputs in different orders */
    return DISPATCH(e, flow_interp, F(xt), F(target), CF(x0), CF(eps), CF(t), B, n / B);
}

/* ---- optimiser ------------------------------------------------------------------------- */

int ts_adamw_step(ts_engine_t *e, ts_tensor_t *param, const ts_tensor_t *grad, ts_tensor_t *m,
                  ts_tensor_t *v, const ts_adamw_t *hp, int64_t step, float grad_scale) {
    TS_TRY(check_same3(e, param, grad, m));
    TS_TRY(check_f32(e, v));
    TS_TRY(same_numel(param, v));
    if (!hp || step < 1 || !(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) ||
        !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f) || !(hp->eps > 0.0f) || !isfinite(hp->lr) ||
        !isfinite(hp->weight_decay) || !isfinite(grad_scale))
        return TS_EINVAL;
    double bc1 = 1.0 - pow(hp->beta1, (double)step);
    double bc2 = 1.0 - pow(hp->beta2, (double)step);
    return DISPATCH(e, adamw, F(param), CF(grad), F(m), F(v), ts_tensor_numel(param), hp->lr,
                    hp->beta1, hp->beta2, hp->eps, hp->weight_decay, (float)bc1, (float)sqrt(bc2),
                    grad_scale);
}

int ts_ema_update(ts_engine_t *e, ts_tensor_t *ema, const ts_tensor_t *param, float decay) {
    TS_TRY(check_same2(e, ema, param));
    if (!(decay >= 0.0f && decay <= 1.0f))
        return TS_EINVAL;
    return DISPATCH(e, ema, F(ema), CF(param), ts_tensor_numel(ema), decay);
}

/* ---- random numbers -------------------------------------------------------------------- */

int ts_rng_uniform(ts_engine_t *e, ts_tensor_t *out, uint64_t seed, uint64_t offset) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    return DISPATCH(e, rng_uniform, F(out), ts_tensor_numel(out), seed, offset);
}

int ts_rng_normal(ts_engine_t *e, ts_tensor_t *out, uint64_t seed, uint64_t offset) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, out));
    return DISPATCH(e, rng_normal, F(out), ts_tensor_numel(out), seed, offset);
}

int ts_tensor_item(ts_engine_t *e, const ts_tensor_t *t, float *value) {
    TS_TRY(check_engine(e));
    TS_TRY(check_scalar(e, t));
    if (!value)
        return TS_EINVAL;
    if (e->device == TS_CPU) {
        *value = CF(t)[0];
        return TS_OK;
    }
    ts_tensor_t h;
    TS_TRY(ts_tensor_wrap(&h, value, TS_F32, TS_CPU, 1, TS_SHAPE(1)));
    return ts_tensor_copy(&h, t);
}
