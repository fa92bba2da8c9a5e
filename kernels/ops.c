/*
 * ops.c — the public ops: argument checks, then dispatch to a backend (see ops.h, backend.h).
 * This file holds the elementwise ops and copies, embeddings, patches, reductions and losses, the
 * optimiser and random numbers. Beside it: ops_matmul.c (matrix products and attention),
 * ops_norm.c (normalisation, activations, adaLN-Zero) and ops_image.c (the VAE's image ops), with
 * the checks they share in ops_internal.h.
 *
 * Every check happens in these files, once, before either backend sees a pointer: engine and
 * tensors present, F32 where the math needs it, every tensor on the engine's device, shapes
 * consistent. The backends can then assume valid input.
 */
#include "kernels/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/ops_internal.h"

/* ---- checks ---------------------------------------------------------------------------- */

static int check_index(ts_engine_t *e, const ts_tensor_t *ids, int64_t V, int distinct);

static int check_float_any(const ts_engine_t *e, const ts_tensor_t *t) {
    TS_TRY(ts_tensor_check(t));
    if (t->device != e->device)
        return TS_EDEVICE;
    if (t->dtype != TS_F32 && t->dtype != TS_F16 && t->dtype != TS_BF16)
        return TS_EDTYPE;
    return TS_OK;
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
    e->host_reads++;
    TS_TRY(DISPATCH(e, count_nonfinite, t->data, t->dtype, ts_tensor_numel(t), &count));
    return count ? TS_ENONFINITE : TS_OK;
}

/* ---- embeddings ------------------------------------------------------------------------ */

static int timestep_dims(const ts_tensor_t *emb, const ts_tensor_t *t, int64_t *B, int64_t *D) {
    if (emb->ndim != 2 || ts_tensor_numel(t) != emb->shape[0] || emb->shape[1] < 2)
        return TS_ESHAPE;
    *B = emb->shape[0];
    *D = emb->shape[1];
    return TS_OK;
}

/* 1 when out is a 16-bit output an op may round into (checked on e's device). */
static int lp_out(const ts_tensor_t *out) {
    return out && (out->dtype == TS_BF16 || out->dtype == TS_F16);
}

int ts_timestep_embedding_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *t,
                                  float scale) {
    TS_TRY(check_engine(e));
    int lp = lp_out(out);
    TS_TRY(lp ? check_on(e, out, out->dtype) : check_f32(e, out));
    TS_TRY(check_f32(e, t));
    int64_t B, D;
    TS_TRY(timestep_dims(out, t, &B, &D));
    if (lp)
        return DISPATCH(e, timestep_embedding_forward_lp, (uint16_t *)out->data, out->dtype, CF(t),
                        B, D, scale);
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
static int check_index(ts_engine_t *e, const ts_tensor_t *ids, int64_t V, int distinct) {
    TS_TRY(check_on(e, ids, TS_I32));
    e->host_reads++;
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

static int check_ids(ts_engine_t *e, const ts_tensor_t *ids, int64_t V) {
    return check_index(e, ids, V, 0);
}

static int embedding_dims(const ts_tensor_t *rows, const ts_tensor_t *table,
                          const ts_tensor_t *ids) {
    if (table->ndim != 2 || rows->ndim != 2 || rows->shape[1] != table->shape[1] ||
        rows->shape[0] != ts_tensor_numel(ids))
        return TS_ESHAPE;
    return TS_OK;
}

/* An embedding's arguments: rows (B, D) and table (V, D) F32 on e, ids (B) I32, each id in
 * [0, V) when check_values (read on the host: on a GPU copied back), else only its dtype and
 * device checked. */
static int embedding_args(ts_engine_t *e, const ts_tensor_t *rows, const ts_tensor_t *table,
                          const ts_tensor_t *ids, int check_values) {
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, rows));
    TS_TRY(check_f32(e, table));
    TS_TRY(ts_tensor_check(ids));
    TS_TRY(embedding_dims(rows, table, ids));
    return check_values ? check_ids(e, ids, table->shape[0]) : check_on(e, ids, TS_I32);
}

static int embedding_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *table,
                             const ts_tensor_t *ids, int check_values) {
    TS_TRY(embedding_args(e, out, table, ids, check_values));
    return DISPATCH(e, embedding_forward, F(out), CF(table), (const int32_t *)ids->data,
                    out->shape[0], out->shape[1]);
}

int ts_embedding_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *table,
                         const ts_tensor_t *ids) {
    return embedding_forward(e, out, table, ids, 1);
}

int ts_embedding_forward_prechecked(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *table,
                                    const ts_tensor_t *ids) {
    return embedding_forward(e, out, table, ids, 0);
}

static int embedding_backward(ts_engine_t *e, ts_tensor_t *dtable, const ts_tensor_t *dout,
                              const ts_tensor_t *ids, int check_values) {
    TS_TRY(embedding_args(e, dout, dtable, ids, check_values));
    return DISPATCH(e, embedding_backward, F(dtable), CF(dout), (const int32_t *)ids->data,
                    dout->shape[0], dout->shape[1]);
}

int ts_embedding_backward(ts_engine_t *e, ts_tensor_t *dtable, const ts_tensor_t *dout,
                          const ts_tensor_t *ids) {
    return embedding_backward(e, dtable, dout, ids, 1);
}

int ts_embedding_backward_prechecked(ts_engine_t *e, ts_tensor_t *dtable, const ts_tensor_t *dout,
                                     const ts_tensor_t *ids) {
    return embedding_backward(e, dtable, dout, ids, 0);
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
    if (!lp_out(out)) {
        TS_TRY(check_patch(e, img, out, p, &d));
        return DISPATCH(e, patchify_forward, F(out), CF(img), d.B, d.C, d.H, d.W, p);
    }
    TS_TRY(check_engine(e));
    TS_TRY(check_f32(e, img));
    TS_TRY(check_on(e, out, out->dtype));
    TS_TRY(patch_dims(img, out, p, &d));
    if (overlaps(out, img)) /* a GPU thread would write over what another still reads */
        return TS_EINVAL;
    return DISPATCH(e, patchify_forward_lp, (uint16_t *)out->data, out->dtype, CF(img), d.B, d.C,
                    d.H, d.W, p);
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
static int check_xent(ts_engine_t *e, const ts_tensor_t *logits, const ts_tensor_t *labels) {
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
    e->host_reads++;
    if (e->device == TS_CPU) {
        *value = CF(t)[0];
        return TS_OK;
    }
    ts_tensor_t h;
    TS_TRY(ts_tensor_wrap(&h, value, TS_F32, TS_CPU, 1, TS_SHAPE(1)));
    return ts_tensor_copy(&h, t);
}
