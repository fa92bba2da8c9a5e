/*
 * ops_image.c — the public image ops of kernels/ops.h (conv2d, GroupNorm, nearest ×2
 * upsampling): argument checks, then dispatch to a backend, as kernels/ops.c does for the rest.
 *
 * A convolution is composed here from two backend primitives, im2col and the GEMM that every
 * linear layer runs on, so its multiply-adds reach OpenBLAS (or, one day, cuBLAS) unchanged:
 *
 *     for each image b:                          (one image at a time: batch-invariant)
 *         for each tile of output rows that fits in scratch:
 *             col (Cin·kh·kw, rows·Wo) = im2col(inp_b)
 *             out_b[:, tile] (Cout, rows·Wo) = weight (Cout, Cin·kh·kw) · col
 *     out += bias per channel
 *
 * A 1×1 kernel of stride 1 without padding skips im2col: the image already is its col matrix.
 * At bf16 or f16 with a weight already in that precision (the VAE converts its weights once),
 * col is written in 16 bits (im2col_lp) and the product takes both operands as they are
 * (gemm_lp_in): on a GPU no rounding kernel runs per tile; the bits are those of the fp32
 * weight's product, which rounds the same values.
 * The tile is as many whole output rows as scratch holds, so the working memory is the caller's
 * choice (the VAE's decoder would need 600 MB of col for one 256×256 layer at once).
 */
#include "kernels/ops.h"

#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/ops_internal.h"

/* An F32 tensor on a started engine's device. */
static int check_arg(const ts_engine_t *e, const ts_tensor_t *t) {
    TS_TRY(check_engine(e));
    return check_f32(e, t);
}


/* ---- conv2d ---------------------------------------------------------------------------- */

int64_t ts_conv2d_out_dim(int64_t in, int64_t k, int stride, int pad_a, int pad_b) {
    if (in < 1 || k < 1 || stride < 1 || pad_a < 0 || pad_b < 0)
        return 0;
    int64_t span = in + pad_a + pad_b - k;
    return span < 0 ? 0 : span / stride + 1;
}

/* A weight already in the conv's 16-bit precision (bf16 or f16, converted once by its owner):
 * the conv then runs on 16-bit operands end to end (im2col_lp, gemm_lp_in). */
static int lp_weight(const ts_tensor_t *weight, const ts_conv2d_t *g) {
    return g->precision != TS_PREC_F32 && weight->dtype == ts_precision_dtype(g->precision);
}

static int direct_conv(const ts_tensor_t *weight, const ts_conv2d_t *g) {
    return !lp_weight(weight, g) && weight->shape[2] == 1 && weight->shape[3] == 1 &&
           g->stride == 1 && g->pad_top == 0 && g->pad_bottom == 0 && g->pad_left == 0 &&
           g->pad_right == 0;
}

int64_t ts_conv2d_scratch_min(const ts_tensor_t *inp, const ts_tensor_t *weight,
                              const ts_conv2d_t *g) {
    if (!inp || !weight || !g || inp->ndim != 4 || weight->ndim != 4)
        return -1;
    int64_t Wo =
        ts_conv2d_out_dim(inp->shape[3], weight->shape[3], g->stride, g->pad_left, g->pad_right);
    if (Wo < 1)
        return -1;
    if (direct_conv(weight, g))
        return 0;
    int64_t row = weight->shape[1] * weight->shape[2] * weight->shape[3] * Wo;
    return lp_weight(weight, g) ? (row + 1) / 2 : row;
}

/* The shapes of a conv: inp (B, Cin, H, W), weight (Cout, Cin, kh, kw), bias (Cout) or NULL,
 * out (B, Cout, Ho, Wo). */
static int check_conv(ts_engine_t *e, const ts_tensor_t *out, const ts_tensor_t *inp,
                      const ts_tensor_t *weight, const ts_tensor_t *bias, const ts_conv2d_t *g) {
    TS_TRY(check_arg(e, out));
    TS_TRY(check_arg(e, inp));
    if (g && g->precision != TS_PREC_F32 && weight &&
        weight->dtype == ts_precision_dtype(g->precision)) /* lp_weight */
        TS_TRY(check_on(e, weight, weight->dtype));
    else
        TS_TRY(check_arg(e, weight));
    if (bias)
        TS_TRY(check_arg(e, bias));
    if (!g || g->stride < 1 || g->pad_top < 0 || g->pad_bottom < 0 || g->pad_left < 0 ||
        g->pad_right < 0)
        return TS_EINVAL;
    if (inp->ndim != 4 || weight->ndim != 4 || out->ndim != 4)
        return TS_ESHAPE;
    if (weight->shape[1] != inp->shape[1] || out->shape[0] != inp->shape[0] ||
        out->shape[1] != weight->shape[0])
        return TS_ESHAPE;
    if (bias && ts_tensor_numel(bias) != weight->shape[0])
        return TS_ESHAPE;
    int64_t Ho =
        ts_conv2d_out_dim(inp->shape[2], weight->shape[2], g->stride, g->pad_top, g->pad_bottom);
    int64_t Wo =
        ts_conv2d_out_dim(inp->shape[3], weight->shape[3], g->stride, g->pad_left, g->pad_right);
    if (Ho < 1 || Wo < 1 || out->shape[2] != Ho || out->shape[3] != Wo)
        return TS_ESHAPE;
    if (overlaps(out, inp) || overlaps(out, weight) || (bias && overlaps(out, bias)))
        return TS_EINVAL;
    return TS_OK;
}

int ts_conv2d_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                      const ts_tensor_t *weight, const ts_tensor_t *bias, const ts_conv2d_t *g,
                      ts_tensor_t *scratch) {
    TS_TRY(check_conv(e, out, inp, weight, bias, g));
    if (g->precision != TS_PREC_F32 && g->precision != TS_PREC_BF16 && g->precision != TS_PREC_F16)
        return TS_EINVAL;
    if (g->precision != TS_PREC_F32 && ts_engine_precision_check(e, g->precision, NULL, 0) != TS_OK)
        return TS_ENOTSUP;
    const ts_dtype_t lp = ts_precision_dtype(g->precision);
    const int64_t B = inp->shape[0], Cin = inp->shape[1], H = inp->shape[2], W = inp->shape[3];
    const int64_t Cout = weight->shape[0], kh = weight->shape[2], kw = weight->shape[3];
    const int64_t Ho = out->shape[2], Wo = out->shape[3], K = Cin * kh * kw;
    const int direct = direct_conv(weight, g), lpw = lp_weight(weight, g);
    int64_t tile = Ho; /* output rows per GEMM */
    if (!direct) {
        if (!scratch)
            return TS_EINVAL;
        TS_TRY(check_arg(e, scratch));
        if (overlaps(scratch, out) || overlaps(scratch, inp))
            return TS_EINVAL;
        /* a 16-bit col takes half an F32 element per entry */
        tile = ts_tensor_numel(scratch) * (lpw ? 2 : 1) / (K * Wo);
        if (tile < 1)
            return TS_EINVAL; /* smaller than ts_conv2d_scratch_min */
        tile = tile < Ho ? tile : Ho;
    }
    for (int64_t b = 0; b < B; b++) {
        const float *img = CF(inp) + b * Cin * H * W;
        float *o = F(out) + b * Cout * Ho * Wo;
        for (int64_t oy0 = 0; oy0 < Ho; oy0 += tile) {
            int64_t rows = Ho - oy0 < tile ? Ho - oy0 : tile, N = rows * Wo;
            if (lpw) { /* 16-bit operands end to end: col rounded as written, no product rounds */
                uint16_t *col16 = (uint16_t *)scratch->data;
                TS_TRY(DISPATCH(e, im2col_lp, col16, lp, img, Cin, H, W, kh, kw, g->stride,
                                g->pad_top, g->pad_left, Wo, oy0, rows));
                TS_TRY(DISPATCH(e, gemm_lp_in, lp, Cout, N, K, (const uint16_t *)weight->data, K,
                                col16, N, o + oy0 * Wo, Ho * Wo));
                continue;
            }
            const float *col = img;
            if (!direct) {
                TS_TRY(DISPATCH(e, im2col, F(scratch), img, Cin, H, W, kh, kw, g->stride,
                                g->pad_top, g->pad_left, Wo, oy0, rows));
                col = CF(scratch);
            }
            /* o[:, oy0·Wo ..] (Cout, N), row stride Ho·Wo = weight (Cout, K) · col (K, N) */
            TS_TRY(ts_ops__gemm_in(e, lp, 0, 0, Cout, N, K, 1.0f, CF(weight), K, 0, col, N, 0, 0.0f,
                                   o + oy0 * Wo, Ho * Wo, 0, 1));
        }
    }
    if (bias)
        TS_TRY(DISPATCH(e, add_channel_bias, F(out), CF(bias), B, Cout, Ho * Wo));
    return TS_OK;
}

/* ---- GroupNorm ------------------------------------------------------------------------- */

static int groupnorm(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                     const ts_tensor_t *weight, const ts_tensor_t *bias, int groups, float eps,
                     int silu) {
    TS_TRY(check_arg(e, out));
    TS_TRY(check_arg(e, inp));
    if (inp->ndim < 2 || !ts_tensor_same_shape(out, inp))
        return TS_ESHAPE;
    if (groups < 1 || !(eps >= 0.0f) || eps > 1.0f)
        return TS_EINVAL;
    const int64_t B = inp->shape[0], C = inp->shape[1], S = ts_tensor_numel(inp) / (B * C);
    if (C % groups != 0)
        return TS_ESHAPE;
    if (!weight != !bias)
        return TS_EINVAL; /* affine means both */
    if (weight) {
        TS_TRY(check_arg(e, weight));
        TS_TRY(check_arg(e, bias));
        if (ts_tensor_numel(weight) != C || ts_tensor_numel(bias) != C)
            return TS_ESHAPE;
    }
    if (out->data != inp->data && overlaps(out, inp))
        return TS_EINVAL; /* in place is exact aliasing only */
    return DISPATCH(e, groupnorm_forward, F(out), CF(inp), weight ? CF(weight) : NULL,
                    bias ? CF(bias) : NULL, B, C, S, groups, eps, silu);
}

int ts_groupnorm_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                         const ts_tensor_t *weight, const ts_tensor_t *bias, int groups,
                         float eps) {
    return groupnorm(e, out, inp, weight, bias, groups, eps, 0);
}

int ts_groupnorm_silu_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                              const ts_tensor_t *weight, const ts_tensor_t *bias, int groups,
                              float eps) {
    return groupnorm(e, out, inp, weight, bias, groups, eps, 1);
}

/* ---- upsampling ------------------------------------------------------------------------ */

int ts_upsample_nearest2x_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp) {
    TS_TRY(check_arg(e, out));
    TS_TRY(check_arg(e, inp));
    if (inp->ndim != 4 || out->ndim != 4 || out->shape[0] != inp->shape[0] ||
        out->shape[1] != inp->shape[1] || out->shape[2] != 2 * inp->shape[2] ||
        out->shape[3] != 2 * inp->shape[3])
        return TS_ESHAPE;
    if (overlaps(out, inp))
        return TS_EINVAL;
    return DISPATCH(e, upsample_nearest2x, F(out), CF(inp), inp->shape[0] * inp->shape[1],
                    inp->shape[2], inp->shape[3]);
}
