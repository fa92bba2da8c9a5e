/*
 * ops_matmul.c — the public matrix products (linear layers, matmul) and attention, composed and
 * fused: argument checks, then dispatch to a backend, as kernels/ops.c does for the rest.
 *
 * Ops built from other ops (linear's backward, matmul's backward, attention) are composed here
 * from the backends' GEMM and row primitives, so both backends share the composition as well as
 * the per-element math. A linear layer's forward is one backend op (GEMM, then the bias), so the
 * CPU can add the bias to each slice of the product while the slice is in cache.
 */
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "kernels/math.h"
#include "kernels/ops_internal.h"

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
    ts_dtype_t wt =
        weight && (weight->dtype == TS_BF16 || weight->dtype == TS_F16) ? weight->dtype : TS_F32;
    /* a 16-bit input only beside a weight of its dtype */
    int lp_in = inp && wt != TS_F32 && inp->dtype == wt;
    TS_TRY(check_on(e, inp, lp_in ? wt : TS_F32));
    TS_TRY(check_on(e, weight, wt));
    TS_TRY(check_opt(e, bias));
    linear_dims_t d;
    TS_TRY(linear_dims(out, inp, weight, bias, &d));
    if (lp_in)
        return DISPATCH(e, linear_forward_lp_in, wt, F(out), (const uint16_t *)inp->data,
                        (const uint16_t *)weight->data, OPT(bias), d.M, d.N, d.K, d.group);
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

int ts_linear_gelu_forward_lp(ts_engine_t *e, ts_tensor_t *pre, ts_tensor_t *act,
                              const ts_tensor_t *inp, const ts_tensor_t *weight,
                              const ts_tensor_t *bias, int keep_pre) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, pre));
    if (!weight || (weight->dtype != TS_BF16 && weight->dtype != TS_F16))
        return TS_EDTYPE;
    ts_dtype_t lp = weight->dtype;
    TS_TRY(check_on(e, weight, lp));
    TS_TRY(check_on(e, inp, lp));
    TS_TRY(check_on(e, act, lp));
    TS_TRY(check_opt(e, bias));
    if (ts_tensor_numel(pre) != ts_tensor_numel(act) || ts_tensor_cols(pre) != ts_tensor_cols(act))
        return TS_ESHAPE;
    if (overlaps(pre, act) || overlaps(pre, inp) || overlaps(act, inp))
        return TS_EINVAL;
    linear_dims_t d;
    TS_TRY(linear_dims(pre, inp, weight, bias, &d));
    return DISPATCH(e, linear_gelu_forward_lp, lp, F(pre), (uint16_t *)act->data,
                    (const uint16_t *)inp->data, (const uint16_t *)weight->data, OPT(bias), d.M,
                    d.N, d.K, d.group, keep_pre != 0);
}

/* ts_linear_backward, with dout16 (NULL, or dout rounded: only beside a 16-bit input) */
static int linear_backward(ts_engine_t *e, ts_tensor_t *dinp, ts_tensor_t *dweight,
                           ts_tensor_t *dbias, const ts_tensor_t *dout, const ts_tensor_t *dout16,
                           const ts_tensor_t *inp, const ts_tensor_t *weight) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, dout));
    ts_dtype_t wt =
        weight && (weight->dtype == TS_BF16 || weight->dtype == TS_F16) ? weight->dtype : TS_F32;
    int bf16 = wt == TS_BF16, lp = wt != TS_F32;
    /* a 16-bit input (kept so by the forward) only beside a weight of its dtype */
    int lp_in = inp && lp && inp->dtype == wt;
    TS_TRY(check_on(e, inp, lp_in ? wt : TS_F32));
    TS_TRY(check_on(e, weight, wt));
    TS_TRY(check_opt(e, dinp));
    TS_TRY(check_opt(e, dweight));
    TS_TRY(check_opt(e, dbias));
    if (dout16) {
        if (!lp_in)
            return TS_EDTYPE;
        TS_TRY(check_on(e, dout16, wt));
        if (ts_tensor_numel(dout16) != ts_tensor_numel(dout))
            return TS_ESHAPE;
        if ((dinp && overlaps(dout16, dinp)) || (dweight && overlaps(dout16, dweight)) ||
            (dbias && overlaps(dout16, dbias)))
            return TS_EINVAL; /* a product would write over what it reads */
    }
    if (weight->ndim != 2)
        return TS_ESHAPE;
    int64_t N = weight->shape[0], K = weight->shape[1];
    int64_t M = ts_tensor_rows(inp);
    if (ts_tensor_cols(inp) != K || ts_tensor_cols(dout) != N || ts_tensor_rows(dout) != M)
        return TS_ESHAPE;
    if ((dinp && ts_tensor_numel(dinp) != M * K) ||
        (dweight && ts_tensor_numel(dweight) != N * K) || (dbias && ts_tensor_numel(dbias) != N))
        return TS_ESHAPE;
    int bias_in_op = lp_in && (dinp || dweight); /* the op adds dbias itself */
    if (bias_in_op)
        TS_TRY(DISPATCH(e, linear_backward_lp_in, wt, OPT(dinp), OPT(dweight), OPT(dbias), CF(dout),
                        dout16 ? (const uint16_t *)dout16->data : NULL, (const uint16_t *)inp->data,
                        (const uint16_t *)weight->data, M, N, K));
    else if (bf16 && (dinp || dweight)) /* both products in bf16, as the bf16 forward's */
        TS_TRY(DISPATCH(e, linear_backward_bf16, OPT(dinp), OPT(dweight), CF(dout), CF(inp),
                        (const uint16_t *)weight->data, M, N, K));
    else if (lp && !bf16 && (dinp || dweight)) /* f16 likewise */
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
    if (dbias && !bias_in_op)
        TS_TRY(DISPATCH(e, add_bcast_backward, NULL, F(dbias), CF(dout), M, N));
    return TS_OK;
}

int ts_linear_backward(ts_engine_t *e, ts_tensor_t *dinp, ts_tensor_t *dweight, ts_tensor_t *dbias,
                       const ts_tensor_t *dout, const ts_tensor_t *inp, const ts_tensor_t *weight) {
    return linear_backward(e, dinp, dweight, dbias, dout, NULL, inp, weight);
}

int ts_linear_backward_lp(ts_engine_t *e, ts_tensor_t *dinp, ts_tensor_t *dweight,
                          ts_tensor_t *dbias, const ts_tensor_t *dout, const ts_tensor_t *dout16,
                          const ts_tensor_t *inp, const ts_tensor_t *weight) {
    if (!dout16)
        return TS_EINVAL;
    return linear_backward(e, dinp, dweight, dbias, dout, dout16, inp, weight);
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

int ts_ops__gemm_in(ts_engine_t *e, ts_dtype_t lp, int trans_a, int trans_b, int64_t M, int64_t N,
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
    return ts_ops__gemm_in(e, lp, trans_a, trans_b, d.M, d.N, d.K, alpha, CF(a), lda, d.M * d.K,
                           CF(b), ldb, d.K * d.N, beta, F(c), d.N, d.M * d.N, d.batch);
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
 * permuted copies of q, k, v are ever made: the GEMMs read them in place. lp TS_BF16 or TS_F16:
 * out may be of dtype lp, the output then written rounded (here each sample's fp32 output
 * rounded; a GPU's last product writes it in lp). */
static int attention_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *att,
                             const ts_tensor_t *qkv, int heads, ts_dtype_t lp) {
    TS_TRY(check_engine(e));
    int out16 = lp != TS_F32 && out && out->dtype == lp;
    TS_TRY(check_on(e, out, out16 ? lp : TS_F32));
    TS_TRY(check_f32(e, att));
    TS_TRY(check_f32(e, qkv));
    att_dims_t d;
    TS_TRY(attention_dims(qkv, out, heads, &d));
    TS_TRY(att_shape(att, &d));
    if (out16 && (overlaps(out, qkv) || overlaps(out, att)))
        return TS_EINVAL;
    if (lp != TS_F32 && e->device == TS_CUDA) /* the same loop, its roundings grouped */
        return ts_cuda_attention_forward_lp(e, lp, out16 ? NULL : F(out),
                                            out16 ? (uint16_t *)out->data : NULL, F(att), CF(qkv),
                                            d.B, d.T, d.C, d.H, 0);
    int64_t T = d.T, C = d.C, H = d.H, hd = d.hd, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    float *row = NULL; /* out16: one sample's fp32 output, then rounded (made before anything is
                        * written: TS_ENOMEM changes nothing) */
    if (out16 && !(row = malloc((size_t)(T * C) * sizeof *row)))
        return TS_ENOMEM;
    int rc = TS_OK;
    for (int64_t b = 0; b < d.B && rc == TS_OK; b++) {
        const float *q = CF(qkv) + b * T * ld;
        float *a = F(att) + b * H * T * T;
        /* att[b, h] (T, T) = scale · Q_h · K_hᵀ */
        rc = ts_ops__gemm_in(e, lp, 0, 1, T, T, hd, scale, q, ld, hd, q + C, ld, hd, 0.0f, a, T,
                             T * T, H);
    }
    if (rc == TS_OK)
        rc = DISPATCH(e, softmax_forward, F(att), CF(att), d.B * H * T, T);
    for (int64_t b = 0; b < d.B && rc == TS_OK; b++) {
        const float *v = CF(qkv) + b * T * ld + 2 * C;
        const float *a = CF(att) + b * H * T * T;
        float *o = out16 ? row : F(out) + b * T * C;
        /* out[b, :, h·hd:(h+1)·hd] (T, hd) = att[b, h] (T, T) · V_h (T, hd) */
        rc =
            ts_ops__gemm_in(e, lp, 0, 0, T, hd, T, 1.0f, a, T, T * T, v, ld, hd, 0.0f, o, C, hd, H);
        if (rc == TS_OK && out16) {
            uint16_t *o16 = (uint16_t *)out->data + b * T * C;
            for (int64_t i = 0; i < T * C; i++)
                o16[i] = ts_f32_to_lp(row[i], lp == TS_F16);
        }
    }
    free(row);
    return rc;
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

/* lp: TS_F32 (the fp32 fused attention), TS_BF16 or TS_F16 (its products in 16 bits; out may
 * then be of dtype lp: written rounded). */
/* out: fp32, or (lp) of dtype lp; also16 (NULL, or of dtype lp beside an fp32 out): the output
 * rounded there too. */
static int fused_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *also16, ts_tensor_t *lse,
                         const ts_tensor_t *qkv, int heads, ts_dtype_t lp) {
    TS_TRY(check_engine(e));
    int out16 = lp != TS_F32 && out && out->dtype == lp;
    TS_TRY(check_on(e, out, out16 ? lp : TS_F32));
    TS_TRY(check_opt(e, lse));
    TS_TRY(check_f32(e, qkv));
    att_dims_t d;
    TS_TRY(attention_dims(qkv, out, heads, &d));
    TS_TRY(lse_shape(lse, &d));
    if (also16) {
        if (out16 || lp == TS_F32)
            return TS_EINVAL;
        TS_TRY(check_on(e, also16, lp));
        if (ts_tensor_numel(also16) != ts_tensor_numel(out))
            return TS_ESHAPE;
        if (overlaps(also16, out) || overlaps(also16, qkv) || (lse && overlaps(also16, lse)))
            return TS_EINVAL;
    }
    uint16_t *o16 = out16 ? (uint16_t *)out->data : also16 ? (uint16_t *)also16->data : NULL;
    if (lp != TS_F32)
        return DISPATCH(e, attention_fused_forward_lp, lp, out16 ? NULL : F(out), o16, OPT(lse),
                        CF(qkv), d.B, d.T, d.C, d.H);
    return DISPATCH(e, attention_fused_forward, F(out), OPT(lse), CF(qkv), d.B, d.T, d.C, d.H);
}

int ts_attention_fused_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *lse,
                               const ts_tensor_t *qkv, int heads) {
    return fused_forward(e, out, NULL, lse, qkv, heads, TS_F32);
}

/* The 16-bit types a fused attention's products take. */
static int check_lp(ts_dtype_t lp) { return lp == TS_BF16 || lp == TS_F16 ? TS_OK : TS_EINVAL; }

int ts_attention_fused_forward_lp(ts_engine_t *e, ts_dtype_t lp, ts_tensor_t *out, ts_tensor_t *lse,
                                  const ts_tensor_t *qkv, int heads) {
    TS_TRY(check_lp(lp));
    return fused_forward(e, out, NULL, lse, qkv, heads, lp);
}

int ts_attention_fused_forward_lp_both(ts_engine_t *e, ts_dtype_t lp, ts_tensor_t *out,
                                       ts_tensor_t *out16, ts_tensor_t *lse, const ts_tensor_t *qkv,
                                       int heads) {
    TS_TRY(check_lp(lp));
    if (!out16)
        return TS_EINVAL;
    return fused_forward(e, out, out16, lse, qkv, heads, lp);
}

int ts_attention_fused_forward_bf16(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *lse,
                                    const ts_tensor_t *qkv, int heads) {
    return fused_forward(e, out, NULL, lse, qkv, heads, TS_BF16);
}

int ts_attention_fused_lp_check(ts_engine_t *e, ts_dtype_t lp) {
    TS_TRY(check_engine(e));
    TS_TRY(check_lp(lp));
    if (e->device == TS_CUDA) /* the flash attention on tensor cores: bf16 sm_80, f16 sm_75 */
        return ts_cuda_flash_ok(e, lp) == TS_OK ? TS_OK : TS_ENOTSUP;
    return e->device == TS_CPU && lp == TS_BF16 && ts_cpu_attention_fused_bf16_ok() ? TS_OK
                                                                                    : TS_ENOTSUP;
}

int ts_attention_fused_bf16_check(ts_engine_t *e) {
    return ts_attention_fused_lp_check(e, TS_BF16);
}

static int fused_backward(ts_engine_t *e, ts_tensor_t *dqkv, ts_tensor_t *dqkv16,
                          const ts_tensor_t *dout, const ts_tensor_t *qkv, const ts_tensor_t *out,
                          const ts_tensor_t *lse, int heads, ts_dtype_t lp) {
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
    /* dqkv is written while q, k, v, dout, out and lse are still read (by other blocks) */
    if (overlaps(dqkv, qkv) || overlaps(dqkv, dout) || overlaps(dqkv, out) || overlaps(dqkv, lse))
        return TS_EINVAL;
    if (dqkv16) { /* the 16-bit copy: lp, dqkv's size, apart from every operand */
        TS_TRY(check_on(e, dqkv16, lp));
        if (ts_tensor_numel(dqkv16) != ts_tensor_numel(dqkv))
            return TS_ESHAPE;
        const ts_tensor_t *others[] = {dqkv, dout, qkv, out, lse};
        for (int i = 0; i < 5; i++)
            if (overlaps(dqkv16, others[i]))
                return TS_EINVAL;
    }
    if (lp != TS_F32)
        return DISPATCH(e, attention_fused_backward_lp, lp, F(dqkv),
                        dqkv16 ? (uint16_t *)dqkv16->data : NULL, CF(dout), CF(qkv), CF(out),
                        CF(lse), d.B, d.T, d.C, d.H);
    return DISPATCH(e, attention_fused_backward, F(dqkv), CF(dout), CF(qkv), CF(out), CF(lse), d.B,
                    d.T, d.C, d.H);
}

int ts_attention_fused_backward(ts_engine_t *e, ts_tensor_t *dqkv, const ts_tensor_t *dout,
                                const ts_tensor_t *qkv, const ts_tensor_t *out,
                                const ts_tensor_t *lse, int heads) {
    return fused_backward(e, dqkv, NULL, dout, qkv, out, lse, heads, TS_F32);
}

int ts_attention_fused_backward_bf16(ts_engine_t *e, ts_tensor_t *dqkv, const ts_tensor_t *dout,
                                     const ts_tensor_t *qkv, const ts_tensor_t *out,
                                     const ts_tensor_t *lse, int heads) {
    return fused_backward(e, dqkv, NULL, dout, qkv, out, lse, heads, TS_BF16);
}

int ts_attention_fused_backward_lp(ts_engine_t *e, ts_dtype_t lp, ts_tensor_t *dqkv,
                                   ts_tensor_t *dqkv16, const ts_tensor_t *dout,
                                   const ts_tensor_t *qkv, const ts_tensor_t *out,
                                   const ts_tensor_t *lse, int heads) {
    TS_TRY(check_lp(lp));
    return fused_backward(e, dqkv, dqkv16, dout, qkv, out, lse, heads, lp);
}
