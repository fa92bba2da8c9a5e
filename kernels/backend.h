/*
 * backend.h — internal: the raw entry points each backend implements.
 *
 * kernels/ops*.c check every argument, then call ts_cpu_<name> or ts_cuda_<name> with raw
 * pointers and sizes. Both backends implement the same list with the same parameters, declared
 * once here. Pointers are device pointers of the engine's device; sizes are already validated
 * (positive, consistent), and nullable gradient outputs are NULL when not wanted. The functions
 * return TS_OK or an error (the CUDA ones report launch and library failures).
 *
 * When the CUDA backend is not built, kernels/cuda_stub.c implements every ts_cuda_* as
 * TS_ENODEV. Matrices are row-major throughout; gemm maps them onto column-major BLAS itself.
 */
#ifndef TS_BACKEND_H
#define TS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The one list of backend ops: X(name, parameters after the engine), each under its comment.
 * Expanded with TS_BACKEND_DECLARE below it declares ts_cpu_<name> and ts_cuda_<name>;
 * kernels/cuda_stub.c expands it again to define the TS_ENODEV stubs, so a new op is added in
 * exactly one place. (The table is aligned by hand: clang-format mangles comments in macros.) */
/* clang-format off */
#define TS_BACKEND_OPS(X)                                                                          \
    /* p[0..bytes) = 0 */                                                                          \
    X(memzero, void *p, size_t bytes)                                                              \
    /* t[i] = v */                                                                                 \
    X(fill, float *t, int64_t n, float v)                                                          \
    /* y[i] += alpha·x[i] */                                                                       \
    X(axpy, float *y, float alpha, const float *x, int64_t n)                                      \
    /* t[i] *= alpha */                                                                            \
    X(scale, float *t, float alpha, int64_t n)                                                     \
    /* t[i] = alpha·t[i] + beta */                                                                 \
    X(affine, float *t, float alpha, float beta, int64_t n)                                        \
    /* out[i] = a[i] + b[i] (out may alias a or b) */                                              \
    X(add, float *out, const float *a, const float *b, int64_t n)                                  \
    /* out (rows, S) = x (rows, S) + b (S) (out may alias x) */                                    \
    X(add_bcast_forward, float *out, const float *x, const float *b, int64_t rows, int64_t S)      \
    /* dx (rows, S) += dout; db (S) += Σ_rows dout */                                              \
    X(add_bcast_backward, float *dx, float *db, const float *dout, int64_t rows, int64_t S)        \
    /* dst[i] = convert(src[i]) between F32/F16/BF16 (dst and src do not overlap) */               \
    X(convert, void *dst, ts_dtype_t dst_dtype, const void *src, ts_dtype_t src_dtype, int64_t n)  \
    /* *count = number of NaN/Inf values in t (F32/F16/BF16); *count is host memory */             \
    X(count_nonfinite, const void *t, ts_dtype_t dtype, int64_t n, int64_t *count)                 \
                                                                                                   \
    /* Row-major strided-batched GEMM: for b < batch,                                              \
     *   C_b (M, N) = alpha · op(A_b) · op(B_b) + beta · C_b,                                      \
     * op(A_b) (M, K), op(B_b) (K, N); A_b = A + b·stride_a (likewise B, C); lda/ldb/ldc are the   \
     * row strides of A, B, C as stored (A is (M, K) or, transposed, (K, M)). */                   \
    X(gemm, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,                \
      const float *A, int64_t lda, int64_t stride_a, const float *B, int64_t ldb,                  \
      int64_t stride_b, float beta, float *C, int64_t ldc, int64_t stride_c, int64_t batch)        \
    /* A linear layer: out (M, N) = inp (M, K) · weightᵀ, weight (N, K); then, when bias is not    \
     * NULL, + bias (N) on every row, added to the finished product (one rounding per add, as a    \
     * separate add_bcast_forward: the CPU adds it to each slice right after the slice's GEMM).    \
     * group: the rows of one item of the batch (a sample's tokens; 1 for one row per sample),     \
     * which the CPU may compute apart so that an item's rows do not depend on the batch. */       \
    X(linear_forward, float *out, const float *inp, const float *weight, const float *bias,        \
      int64_t M, int64_t N, int64_t K, int64_t group)                                              \
    /* linear_forward into pre, then act = gelu(pre) (the CPU in the same pass as the bias) */     \
    X(linear_gelu_forward, float *pre, float *act, const float *inp, const float *weight,          \
      const float *bias, int64_t M, int64_t N, int64_t K, int64_t group)                           \
    /* As gemm, with op(A) and op(B) rounded to bf16 (nearest even) and the products accumulated \
     * in fp32; C stays fp32. The CPU runs it through oneDNN (kernels/cpu/cpu_bf16.c); TS_ENOTSUP \
     * where bf16 cannot run (ts_engine_precision_check says why). */                             \
    X(gemm_bf16, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,           \
      const float *A, int64_t lda, int64_t stride_a, const float *B, int64_t ldb,                  \
      int64_t stride_b, float beta, float *C, int64_t ldc, int64_t stride_c, int64_t batch)        \
    /* As linear_forward with a bf16 weight (N, K): inp rounded to bf16, fp32 accumulation, fp32   \
     * out, bias (fp32) added to the fp32 product. TS_ENOTSUP as gemm_bf16. */                     \
    X(linear_forward_bf16, float *out, const float *inp, const uint16_t *weight,                   \
      const float *bias, int64_t M, int64_t N, int64_t K, int64_t group)                           \
    /* The backward of a linear layer with a bf16 weight (N, K) (bf16 training): dout rounded to  \
     * bf16, dinp (M, K) += dout · weight and dweight (N, K) += doutᵀ · inp (inp rounded to bf16), \
     * fp32 accumulation into the fp32 gradients; either may be NULL. TS_ENOTSUP as gemm_bf16. */  \
    X(linear_backward_bf16, float *dinp, float *dweight, const float *dout, const float *inp,      \
      const uint16_t *weight, int64_t M, int64_t N, int64_t K)                                     \
    /* As gemm_bf16, linear_forward_bf16 and linear_backward_bf16 in IEEE half precision (f16,    \
     * nearest even). The GPU's are cuBLAS products on f16 operands; the CPU has no f16 product,  \
     * so it emulates one (kernels/cpu/cpu_f16.c): operands rounded to f16 and widened back, then \
     * the fp32 gemm, whose products of two f16 values are exact. */                              \
    X(gemm_f16, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,            \
      const float *A, int64_t lda, int64_t stride_a, const float *B, int64_t ldb,                  \
      int64_t stride_b, float beta, float *C, int64_t ldc, int64_t stride_c, int64_t batch)        \
    X(linear_forward_f16, float *out, const float *inp, const uint16_t *weight,                    \
      const float *bias, int64_t M, int64_t N, int64_t K, int64_t group)                           \
    X(linear_backward_f16, float *dinp, float *dweight, const float *dout, const float *inp,       \
      const uint16_t *weight, int64_t M, int64_t N, int64_t K)                                     \
    /* GELU (tanh form) for a bf16 consumer: a vector exp, within 1e-6 of gelu_forward. */         \
    X(gelu_forward_bf16, float *out, const float *inp, int64_t n)                                  \
    /* 16-bit activations (lp: bf16 or f16, rounded to nearest even as ts_convert): what a linear \
     * layer with an lp weight reads, written once by its producer instead of rounded by it. The   \
     * values are those of the fp32 ops, rounded: layernorm_modulate_forward's out; GELU of        \
     * gelu_forward_bf16 at bf16, of gelu_forward at f16; and linear_forward_{bf16,f16} of an      \
     * input already in lp (its bits: those of the fp32 input the layer would have rounded). */    \
    X(layernorm_modulate_forward_lp, float *ln, float *mean, float *rstd, uint16_t *out,          \
      ts_dtype_t lp, const float *inp, const float *mod, int64_t B, int64_t T, int64_t C,          \
      int64_t M, int shift_idx, int scale_idx)                                                     \
    X(gelu_forward_lp, uint16_t *out, ts_dtype_t lp, const float *inp, int64_t n)                 \
    X(silu_forward_lp, uint16_t *out, ts_dtype_t lp, const float *inp, int64_t n)                 \
    X(linear_forward_lp_in, ts_dtype_t lp, float *out, const uint16_t *inp,                       \
      const uint16_t *weight, const float *bias, int64_t M, int64_t N, int64_t K, int64_t group)  \
    /* linear_backward_{bf16,f16} of such an input, kept in lp for the backward (the same bits:   \
     * the fp32 one rounds its input to lp for dweight and nothing else reads it); dout16, when   \
     * not NULL, is dout rounded to lp by its producer (gelu_backward_lp, ...), read instead of   \
     * rounding dout here (the same bits); dbias, when not NULL, += dout's column sums            \
     * (add_bcast_backward's) — on a GPU in the pass that rounds dout, when dout16 is NULL */      \
    X(linear_backward_lp_in, ts_dtype_t lp, float *dinp, float *dweight, float *dbias,            \
      const float *dout, const uint16_t *dout16, const uint16_t *inp, const uint16_t *weight,     \
      int64_t M, int64_t N, int64_t K)                                                             \
    /* act (M, N) = lp(gelu(inp · weightᵀ + bias)) of an lp input and weight: the values of       \
     * linear_forward_lp_in into pre, then gelu_forward_lp of pre. keep_pre 1: pre holds that      \
     * fp32 product afterwards (a backward reads it); 0: pre is scratch the op may leave as it     \
     * was, and a GPU with cuBLASLt's epilogues on writes act in one product (bias, GELU and the   \
     * rounding in its epilogue: no fp32 (M, N) written or read). */                              \
    X(linear_gelu_forward_lp, ts_dtype_t lp, float *pre, uint16_t *act, const uint16_t *inp,      \
      const uint16_t *weight, const float *bias, int64_t M, int64_t N, int64_t K, int64_t group,  \
      int keep_pre)                                                                                \
                                                                                                   \
    /* out, inp (rows, C); mean, rstd (rows), each may be NULL */                                  \
    X(layernorm_forward, float *out, float *mean, float *rstd, const float *inp, int64_t rows,     \
      int64_t C)                                                                                   \
    /* layernorm_forward into ln, then modulate_forward of ln into out (both backends in one pass  \
     * over each row); ln, out (B, T, C); mean, rstd (B·T) nullable; mod (B, M·C) */               \
    X(layernorm_modulate_forward, float *ln, float *mean, float *rstd, float *out,                 \
      const float *inp, const float *mod, int64_t B, int64_t T, int64_t C, int64_t M,              \
      int shift_idx, int scale_idx)                                                                \
    /* dinp (rows, C) += ...; mean and rstd (from the forward) are required */                     \
    X(layernorm_backward, float *dinp, const float *dout, const float *inp, const float *mean,     \
      const float *rstd, int64_t rows, int64_t C)                                                  \
    X(gelu_forward, float *out, const float *inp, int64_t n)                                       \
    X(gelu_backward, float *dinp, const float *dout, const float *inp, int64_t n)                  \
    /* gelu_backward, then dinp16 = lp(dinp) as it ends: the dout of the linear below, rounded    \
     * by its producer (linear_backward_lp_in's dout16) instead of by a kernel of the linear's */  \
    X(gelu_backward_lp, float *dinp, uint16_t *dinp16, ts_dtype_t lp, const float *dout,          \
      const float *inp, int64_t n)                                                                 \
    X(silu_forward, float *out, const float *inp, int64_t n)                                       \
    X(silu_backward, float *dinp, const float *dout, const float *inp, int64_t n)                  \
    /* out, inp (rows, C), softmax over each row (out may alias inp) */                            \
    X(softmax_forward, float *out, const float *inp, int64_t rows, int64_t C)                      \
    /* dinp = (accumulate ? dinp : 0) + scale · softmax'(out)·dout, per row. With accumulate == 0, \
     * dinp may alias dout. */                                                                     \
    X(softmax_backward, float *dinp, const float *dout, const float *out, int64_t rows, int64_t C, \
      float scale, int accumulate)                                                                 \
    /* Fused (flash-style) attention, not causal: qkv (B, T, 3C) laid out (3, H, C/H), out      \
     * (B, T, C), lse (B, H, T) each row's log-sum-exp of the scaled scores (nullable in the      \
     * forwards). _lp: the products in lp (TS_BF16 or TS_F16), fp32 accumulation, and with out16 \
     * (not NULL) the output written there rounded to lp (proj's 16-bit input), and into out too  \
     * where out is not NULL. The backward adds into dqkv; _lp's with dqkv16 (nullable) also     \
     * writes dqkv as it ends rounded to lp there (the qkv linear's dout, as gelu_backward_lp).   \
     * The CPU's is kernels/cpu/cpu_attention.c (no f16 one); TS_ENOTSUP where there is none. */  \
    X(attention_fused_forward, float *out, float *lse, const float *qkv, int64_t B, int64_t T,     \
      int64_t C, int64_t H)                                                                        \
    X(attention_fused_forward_lp, ts_dtype_t lp, float *out, uint16_t *out16, float *lse,         \
      const float *qkv, int64_t B, int64_t T, int64_t C, int64_t H)                                \
    X(attention_fused_backward, float *dqkv, const float *dout, const float *qkv,                  \
      const float *out, const float *lse, int64_t B, int64_t T, int64_t C, int64_t H)              \
    X(attention_fused_backward_lp, ts_dtype_t lp, float *dqkv, uint16_t *dqkv16,                 \
      const float *dout, const float *qkv, const float *out, const float *lse, int64_t B,         \
      int64_t T, int64_t C, int64_t H)                                                             \
                                                                                                   \
    /* x, out (B, T, C); mod (B, M·C); chunk i of sample b is mod + b·M·C + i·C */                 \
    X(modulate_forward, float *out, const float *x, const float *mod, int64_t B, int64_t T,        \
      int64_t C, int64_t M, int shift_idx, int scale_idx)                                          \
    /* dx (nullable) += ...; dmod (nullable) += ... */                                             \
    X(modulate_backward, float *dx, float *dmod, const float *dout, const float *x,                \
      const float *mod, int64_t B, int64_t T, int64_t C, int64_t M, int shift_idx, int scale_idx)  \
    X(gate_residual_forward, float *out, const float *res, const float *y, const float *mod,       \
      int64_t B, int64_t T, int64_t C, int64_t M, int gate_idx)                                    \
    /* dres, dy, dmod each nullable */                                                             \
    X(gate_residual_backward, float *dres, float *dy, float *dmod, const float *dout,              \
      const float *y, const float *mod, int64_t B, int64_t T, int64_t C, int64_t M, int gate_idx)  \
    /* gate_residual_backward, then dy16 = lp(dy) as it ends (dy required), as gelu_backward_lp */ \
    X(gate_residual_backward_lp, float *dres, float *dy, uint16_t *dy16, ts_dtype_t lp,           \
      float *dmod, const float *dout, const float *y, const float *mod, int64_t B, int64_t T,      \
      int64_t C, int64_t M, int gate_idx)                                                          \
                                                                                                   \
    /* out (B, D), t (B) */                                                                        \
    X(timestep_embedding_forward, float *out, const float *t, int64_t B, int64_t D, float scale)   \
    /* the same rounded to lp (BF16 or F16) as written: a 16-bit linear's input */                 \
    X(timestep_embedding_forward_lp, uint16_t *out, ts_dtype_t lp, const float *t, int64_t B,      \
      int64_t D, float scale)                                                                      \
    X(timestep_embedding_backward, float *dt, const float *dout, const float *t, int64_t B,        \
      int64_t D, float scale)                                                                      \
    /* out (B, D) = table[ids[b]]; ids already range-checked */                                    \
    X(embedding_forward, float *out, const float *table, const int32_t *ids, int64_t B,            \
      int64_t D)                                                                                   \
    X(embedding_backward, float *dtable, const float *dout, const int32_t *ids, int64_t B,         \
      int64_t D)                                                                                   \
                                                                                                   \
    /* img (B, C, H, W) ↔ tok (B, T, C·p·p), (c, py, px) order; backward accumulates */            \
    X(patchify_forward, float *out, const float *img, int64_t B, int64_t C, int64_t H, int64_t W,  \
      int64_t p)                                                                                   \
    X(patchify_forward_lp, uint16_t *out, ts_dtype_t lp, const float *img, int64_t B, int64_t C,   \
      int64_t H, int64_t W, int64_t p)                                                             \
    X(patchify_backward, float *dimg, const float *dout, int64_t B, int64_t C, int64_t H,          \
      int64_t W, int64_t p)                                                                        \
    /* tok (B, T, p·p·C), (py, px, c) order → img (B, C, H, W); backward accumulates */            \
    X(unpatchify_forward, float *img, const float *tok, int64_t B, int64_t C, int64_t H,           \
      int64_t W, int64_t p)                                                                        \
    X(unpatchify_backward, float *dtok, const float *dimg, int64_t B, int64_t C, int64_t H,        \
      int64_t W, int64_t p)                                                                        \
                                                                                                   \
    /* Image ops of the VAE (kernels/cpu/cpu_image.c, kernels/cuda/cuda_image.cu).               \
     * im2col: col (C·kh·kw, rows·Wo) = the patches of img (C, H, W) under output rows            \
     * [oy0, oy0 + rows) of a conv with this stride and top/left padding, zero outside the image; \
     * col row (c·kh + ky)·kw + kx, column (oy − oy0)·Wo + ox. */                                  \
    X(im2col, float *col, const float *img, int64_t C, int64_t H, int64_t W, int64_t kh,          \
      int64_t kw, int64_t stride, int64_t pad_top, int64_t pad_left, int64_t Wo, int64_t oy0,      \
      int64_t rows)                                                                                \
    /* im2col with each element rounded to lp (bf16 or f16, nearest even): the 16-bit operand of \
     * a conv's product, written once instead of rounded by the product */                       \
    X(im2col_lp, uint16_t *col, ts_dtype_t lp, const float *img, int64_t C, int64_t H, int64_t W, \
      int64_t kh, int64_t kw, int64_t stride, int64_t pad_top, int64_t pad_left, int64_t Wo,      \
      int64_t oy0, int64_t rows)                                                                  \
    /* C (M, N), row stride ldc = A (M, K) · B (K, N), both lp (bf16 or f16) already, fp32         \
     * accumulation: gemm_bf16 / gemm_f16 without their rounding of the operands (the GPU: one     \
     * cuBLAS product on tensor cores; the CPU widens the operands, exactly, and runs those) */    \
    X(gemm_lp_in, ts_dtype_t lp, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,  \
      const uint16_t *B, int64_t ldb, float *C, int64_t ldc)                                      \
    /* x (B, C, S) += bias (C), per channel */                                                     \
    X(add_channel_bias, float *x, const float *bias, int64_t B, int64_t C, int64_t S)              \
    /* GroupNorm: out, inp (B, C, S), statistics over each group of C/G channels × S; weight,     \
     * bias (C) nullable (both or neither); silu: out = silu(normalised) (out may alias inp) */     \
    X(groupnorm_forward, float *out, const float *inp, const float *weight, const float *bias,    \
      int64_t B, int64_t C, int64_t S, int64_t G, float eps, int silu)                             \
    /* out (R, 2H, 2W) = nearest ×2 upsample of inp (R, H, W) */                                   \
    X(upsample_nearest2x, float *out, const float *inp, int64_t R, int64_t H, int64_t W)          \
                                                                                                   \
    /* out[0] = Σ inp (device scalar) */                                                           \
    X(sum, float *out, const float *inp, int64_t n)                                                \
    /* out[0] = Σ inp² */                                                                          \
    X(sumsq, float *out, const float *inp, int64_t n)                                              \
    /* dinp[i] += scalar[0] · mult (scalar is a device pointer) */                                 \
    X(add_scaled_scalar, float *dinp, const float *scalar, float mult, int64_t n)                  \
    /* out (C) = Σ_rows inp (rows, C) */                                                           \
    X(sum_rows, float *out, const float *inp, int64_t rows, int64_t C)                             \
    /* loss[0] = mean((pred − target)²) */                                                         \
    X(mse_forward, float *loss, const float *pred, const float *target, int64_t n)                 \
    /* dpred += dloss · 2·(pred − target)/n */                                                     \
    X(mse_backward, float *dpred, float dloss, const float *pred, const float *target, int64_t n)  \
    /* loss[0] = mean over rows b of −log softmax(logits_b)[labels_b]; logits (B, K) */            \
    X(cross_entropy_forward, float *loss, const float *logits, const int32_t *labels, int64_t B,   \
      int64_t K)                                                                                   \
    /* dlogits (B, K) += scale · (softmax(logits_b) − onehot(labels_b)), scale = dloss / B */      \
    X(cross_entropy_backward, float *dlogits, float scale, const float *logits,                    \
      const int32_t *labels, int64_t B, int64_t K)                                                 \
    /* out (B, C) = mean over T of x (B, T, C) */                                                  \
    X(mean_tokens_forward, float *out, const float *x, int64_t B, int64_t T, int64_t C)            \
    /* dx (B, T, C) += dout (B, C) / T */                                                          \
    X(mean_tokens_backward, float *dx, const float *dout, int64_t B, int64_t T, int64_t C)         \
                                                                                                   \
    /* out (m, S) = inp rows idx[i]; idx already range-checked */                                \
    X(gather_rows, float *out, const float *inp, const int32_t *idx, int64_t m, int64_t S)        \
    /* out[idx[i]] += w[i]·inp[i] (m, S); idx range-checked and distinct */                       \
    X(scatter_axpy_rows, float *out, const float *inp, const int32_t *idx, const float *w,        \
      int64_t m, int64_t S)                                                                        \
                                                                                                   \
    /* xt, target, x0, eps (B, S); t (B): see ts_flow_interp. Outputs do not alias inputs. */      \
    X(flow_interp, float *xt, float *target, const float *x0, const float *eps, const float *t,    \
      int64_t B, int64_t S)                                                                        \
                                                                                                   \
    /* AdamW, see ts_adamw_elem; g = grad · grad_scale */                                          \
    X(adamw, float *param, const float *grad, float *m, float *v, int64_t n, float lr,             \
      float beta1, float beta2, float eps, float wd, float bc1, float sqrt_bc2, float grad_scale)  \
    X(ema, float *ema, const float *param, int64_t n, float decay)                                 \
                                                                                                   \
    /* out[j] = stream element offset + j */                                                       \
    X(rng_uniform, float *out, int64_t n, uint64_t seed, uint64_t offset)                          \
    X(rng_normal, float *out, int64_t n, uint64_t seed, uint64_t offset)
/* clang-format on */

#define TS_BACKEND_DECLARE(name, ...)                                                              \
    int ts_cpu_##name(ts_engine_t *e, __VA_ARGS__);                                                \
    int ts_cuda_##name(ts_engine_t *e, __VA_ARGS__);
TS_BACKEND_OPS(TS_BACKEND_DECLARE)
#undef TS_BACKEND_DECLARE

/* ---- engine and memory hooks (not per-op) ---- */
int ts_cpu_engine_init(ts_engine_t *e, int threads);
void ts_cpu_engine_free(ts_engine_t *e);
/* TS_OK when the CPU's bf16 path can run here (this build has oneDNN, the CPU has AVX-512 BF16);
 * TS_ENOTSUP otherwise, with the reason in why (may be NULL). */
int ts_cpu_bf16_check(ts_engine_t *e, char *why, size_t why_len);
/* Whether the CPU's fused bf16 attention can run here: this compiler knows AVX-512 BF16 and the
 * CPU has it (kernels/cpu/cpu_attention.c). */
int ts_cpu_attention_fused_bf16_ok(void);
/* Releases the engine's oneDNN state (primitives, scratch), made on the first bf16 product. */
void ts_cpu_bf16_free(ts_engine_t *e);
/* Releases the engine's f16 scratch (kernels/cpu/cpu_f16.c), made on the first f16 product. */
void ts_cpu_f16_free(ts_engine_t *e);

/* The 16-bit fused attention on a CUDA engine (the flash attention on tensor cores,
 * cuda_flash.cu), lp TS_BF16 or TS_F16: TS_OK on sm_80 or later for bf16, sm_75 for f16;
 * TS_ENOTSUP below, TS_ENODEV without the backend. */
int ts_cuda_flash_ok(ts_engine_t *e, ts_dtype_t lp);
/* The composed attention's forward with both products in lp (TS_BF16 or TS_F16) on a CUDA engine
 * (kernels/ops_matmul.c's loop over samples, with the operands rounded once per group of
 * samples instead of once per sample and product): out (B, T, C) fp32 or, when out is NULL,
 * out16 in lp (the last product writes it in lp), att (B, H, T, T) the fp32 softmax weights,
 * qkv (B, T, 3C), as ts_attention_forward_bf16. A group's rounded operands take at most
 * group_bytes of 16-bit scratch (or one sample's, where that is more); ≤ 0: 64 MiB, what
 * ts_attention_forward_bf16 / _f16 use. The grouping does not change a bit of the result. */
int ts_cuda_attention_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *out, uint16_t *out16,
                                 float *att, const float *qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t H, int64_t group_bytes);
int ts_cuda_engine_init(ts_engine_t *e, int gpu);
void ts_cuda_engine_free(ts_engine_t *e);
int ts_cuda_engine_sync(ts_engine_t *e);
/* Device memory on the current device (the engine's; ordinal 0 for tensors made without an
 * engine). */
int ts_cuda_malloc(void **p, size_t bytes);
void ts_cuda_free(void *p);
/* Copies bytes between host and device or within a device; kind from the two devices. Blocks. */
int ts_cuda_memcpy(void *dst, ts_device_t dst_dev, const void *src, ts_device_t src_dev,
                   size_t bytes);
/* Page-locked host memory (cudaHostAlloc; TS_ENODEV without the backend or a driver). */
int ts_cuda_host_alloc(void **p, size_t bytes);
void ts_cuda_host_free(void *p);
/* ts_cuda_built (engine.h) is defined by the backend: 1 in cuda_backend.cu, 0 in cuda_stub.c */
/* Opens cuBLAS (once per process; the CUDA engine does it when it starts): TS_OK, or TS_ECUBLAS
 * with the reason in err (cannot be opened, a function missing), TS_ENODEV without the backend. */
int ts_cuda_blas_load(char *err, size_t errlen);
/* device count, or 0 with the reason written to why */
int ts_cuda_count(char *why, size_t why_len);
/* Device gpu's name and memory in bytes (total, and free now); TS_ENODEV when there is none. */
int ts_cuda_info(int gpu, char *name, size_t name_len, size_t *total, size_t *free_now);
/* Events on e's stream: *ev is made on the first record (timing enabled) and recorded each
 * call; elapsed waits for b and gives the seconds from a to b; free destroys one. */
int ts_cuda_event_record(ts_engine_t *e, void **ev);
int ts_cuda_event_elapsed(ts_engine_t *e, void *a, void *b, double *seconds);
void ts_cuda_event_free(void *ev);
/* Waits for event ev of e's device (any thread). */
int ts_cuda_event_wait(ts_engine_t *e, void *ev);
/* As ts_cuda_memcpy, queued on e's stream (cudaMemcpyAsync): returns at once for page-locked host
 * memory; ordered after the stream's earlier work and before its later work. */
int ts_cuda_memcpy_async(ts_engine_t *e, void *dst, ts_device_t dst_dev, const void *src,
                         ts_device_t src_dev, size_t bytes);
/* cuBLASLt's epilogues on e — the 16-bit linears' bias, and linear_gelu_forward_lp's bias, GELU
 * and rounding when it need not keep pre — (on: 1; off by default, or on from the engine's start
 * with TESSERA_CUDA_EPILOGUES=1): TS_OK, TS_ENOTSUP when cuBLASLt could not be
 * opened or started here; and how many products ran so (tests, benchmarks). */
int ts_cuda_set_epilogues(ts_engine_t *e, int on);
int64_t ts_cuda_epilogue_calls(ts_engine_t *e);
/* The setting: 1 on, 0 off, −1 off because cuBLASLt could not be opened or started (0 off a
 * CUDA engine). */
int ts_cuda_epilogues(ts_engine_t *e);
/* CUDA graphs (ts_engine_capture_begin and the rest): capture of e's stream in thread-local mode
 * (a call from this thread that would be unsafe during a capture fails it, so it is seen), its
 * end into an instantiated graph (*exec; NULL, with TS_ECUDA, when the capture failed or was
 * invalidated), a launch on e's stream, and the graph's release. */
int ts_cuda_capture_begin(ts_engine_t *e);
int ts_cuda_capture_end(ts_engine_t *e, void **exec);
int ts_cuda_graph_launch(ts_engine_t *e, void *exec);
void ts_cuda_graph_free(void *exec);
/* The fraction of the last sample period (NVML: 1/6 s to 1 s) in which a kernel ran on device
 * gpu, in [0, 1]; TS_ENOTSUP where NVML (the driver's libnvidia-ml.so.1) is not there. */
int ts_cuda_utilization(int gpu, double *ratio);
/* TS_OK when the bf16 products can run on e's GPU (compute capability 8.0 or newer: bf16
 * tensor cores, which cuBLAS needs for CUDA_R_16BF); TS_ENOTSUP otherwise, with the reason in
 * why (may be NULL). */
int ts_cuda_bf16_check(ts_engine_t *e, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
