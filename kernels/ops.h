/*
 * ops.h — every op the DiT expert needs, forward and backward, on either backend.
 *
 * Conventions (llm.c's):
 *   - outputs first, then inputs; sizes come from the tensors' shapes, and a comment gives the
 *     shape of every buffer. "(..., C)" means any leading dimensions flattened into rows.
 *   - every _backward ACCUMULATES into its gradient outputs (+=); callers clear gradients with
 *     ts_zero. A gradient output passed as NULL is not computed.
 *   - the math ops take F32 tensors; TS_EDTYPE for anything else. ts_convert moves between dtypes.
 *   - every op checks its arguments (NULL, dtype, device, shapes) and returns an error code rather
 *     than aborting. In-place use (out == inp) is allowed where a comment says so.
 *
 * The per-element and per-row formulas live in kernels/math.h and are shared with the CUDA
 * kernels; the dispatch below picks the backend from the engine.
 */
#ifndef TS_OPS_H
#define TS_OPS_H

#include <stdint.h>

#include "kernels/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise and copies ------------------------------------------------------------ */

/* t = value everywhere. */
int ts_fill(ts_engine_t *e, ts_tensor_t *t, float value);
/* t = 0 (any dtype). */
int ts_zero(ts_engine_t *e, ts_tensor_t *t);
/* y += alpha * x; same element count. */
int ts_axpy(ts_engine_t *e, ts_tensor_t *y, float alpha, const ts_tensor_t *x);
/* t *= alpha. */
int ts_scale(ts_engine_t *e, ts_tensor_t *t, float alpha);
/* t = alpha · t + beta. */
int ts_affine(ts_engine_t *e, ts_tensor_t *t, float alpha, float beta);
/* out = a + b; same element count. out may alias a or b. Backward: ts_axpy(da, 1, dout). */
int ts_add(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *a, const ts_tensor_t *b);
/* out (..., S) = x (..., S) + b (S), b broadcast over the leading rows; S is b's element count
 * and must divide x's. out may alias x. Used for bias and for pos_embed (S = T*C). */
int ts_add_bcast_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *x,
                         const ts_tensor_t *b);
/* dx += dout; db += Σ_rows dout. */
int ts_add_bcast_backward(ts_engine_t *e, ts_tensor_t *dx, ts_tensor_t *db,
                          const ts_tensor_t *dout);
/* out (m, ...) = rows idx[i] of inp (n, ...); idx (m) I32, each in [0, n). Used to group the
 * samples bound for one expert into one batch. */
int ts_gather_rows(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                   const ts_tensor_t *idx);
/* out[idx[i]] += w[i] · inp[i] for every row i of inp (m, ...); out (n, ...), idx (m) I32
 * distinct and in [0, n), w (m) F32. The inverse of ts_gather_rows, weighted: it adds one
 * expert's answers into the combined velocity. Indices are checked on the host first. */
int ts_scatter_axpy_rows(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                         const ts_tensor_t *idx, const ts_tensor_t *w);
/* dst = src converted between F32, F16, BF16 (round to nearest even; NaN stays NaN, overflow
 * becomes ±Inf). Same element count. */
int ts_convert(ts_engine_t *e, ts_tensor_t *dst, const ts_tensor_t *src);
/* TS_OK when every value of t (F32, F16 or BF16) is finite, TS_ENONFINITE otherwise. */
int ts_check_finite(ts_engine_t *e, const ts_tensor_t *t);

/* ---- matrix products ------------------------------------------------------------------- */

/* out (..., N) = inp (..., K) · weightᵀ + bias. weight is (N, K) as in torch.nn.Linear;
 * bias (N) may be NULL. A BF16 weight takes the bf16 path: inp rounded to bf16, fp32
 * accumulation, out and bias fp32 (TS_ENOTSUP where it cannot run: ts_engine_precision_check).
 * An F16 weight takes the f16 path likewise (and ts_linear_backward its f16 backward). With a
 * 16-bit weight, inp may be in the weight's dtype already (a 16-bit activation: the bits of the
 * fp32 input it was rounded from, with no rounding here). */
int ts_linear_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                      const ts_tensor_t *weight, const ts_tensor_t *bias);
/* pre (..., N) = inp · weightᵀ + bias, as ts_linear_forward; act = GELU(pre), as ts_gelu_forward
 * — the same bits as the two calls; the CPU applies GELU in the bias's pass over each slice of
 * the product, while it is in cache. F32 weight only (TS_EDTYPE otherwise). act may be pre itself
 * (it then holds GELU(pre) alone: a forward that keeps no activations); neither aliases inp. */
int ts_linear_gelu_forward(ts_engine_t *e, ts_tensor_t *pre, ts_tensor_t *act,
                           const ts_tensor_t *inp, const ts_tensor_t *weight,
                           const ts_tensor_t *bias);
/* The 16-bit-activation form: act (..., N) = GELU(inp · weightᵀ + bias) rounded to act's dtype,
 * inp, weight and act all BF16 or all F16 — the values of ts_linear_forward into pre, then
 * ts_gelu_forward_lp of pre. pre (F32, act's shape) is written when keep_pre is 1 (a backward
 * reads it); when 0 it is scratch, left as it was where a GPU with cuBLASLt's epilogues on runs
 * the product, the bias, GELU and the rounding in one call (ts_cuda_set_epilogues). pre, act
 * and inp do not overlap. */
int ts_linear_gelu_forward_lp(ts_engine_t *e, ts_tensor_t *pre, ts_tensor_t *act,
                              const ts_tensor_t *inp, const ts_tensor_t *weight,
                              const ts_tensor_t *bias, int keep_pre);
/* dinp (..., K) += dout · weight; dweight (N, K) += doutᵀ · inp; dbias (N) += Σ_rows dout. A BF16
 * weight (the bf16 copy the bf16 forward used) takes the bf16 path of bf16 training: dout, inp
 * and the weight in bf16, fp32 accumulation into the fp32 gradients, dbias in fp32 (TS_ENOTSUP
 * where it cannot run, as ts_linear_forward). An F16 weight likewise in f16 (f16 training). As in
 * ts_linear_forward, inp may be 16-bit beside a weight of its dtype (kept so by the forward): the
 * same bits, with no rounding of it. */
int ts_linear_backward(ts_engine_t *e, ts_tensor_t *dinp, ts_tensor_t *dweight, ts_tensor_t *dbias,
                       const ts_tensor_t *dout, const ts_tensor_t *inp, const ts_tensor_t *weight);
/* ts_linear_backward of a 16-bit input beside a weight of its dtype, with dout16 (that dtype,
 * dout's element count) = dout rounded, as its producer wrote it (ts_gelu_backward_lp,
 * ts_gate_residual_backward_lp): the products read dout16 instead of rounding dout (the same
 * bits when dout16 is dout rounded); dbias still sums the fp32 dout. */
int ts_linear_backward_lp(ts_engine_t *e, ts_tensor_t *dinp, ts_tensor_t *dweight,
                          ts_tensor_t *dbias, const ts_tensor_t *dout, const ts_tensor_t *dout16,
                          const ts_tensor_t *inp, const ts_tensor_t *weight);

/* c = alpha · op(a) · op(b) + beta · c, op(x) = x or xᵀ. 2-D tensors, or 3-D tensors with a
 * common leading batch dimension (a strided-batched GEMM, one product per batch entry). */
int ts_matmul(ts_engine_t *e, ts_tensor_t *c, const ts_tensor_t *a, int trans_a,
              const ts_tensor_t *b, int trans_b, float alpha, float beta);
/* As ts_matmul, with op(a) and op(b) rounded to bf16 and fp32 accumulation (all tensors stay
 * F32). TS_ENOTSUP where bf16 cannot run (ts_engine_precision_check says why). */
int ts_matmul_bf16(ts_engine_t *e, ts_tensor_t *c, const ts_tensor_t *a, int trans_a,
                   const ts_tensor_t *b, int trans_b, float alpha, float beta);
/* As ts_matmul_bf16 in f16 (nearest even: past ±65504 becomes ±Inf); runs on every engine (the
 * CPU's is emulated: kernels/cpu/cpu_f16.c). */
int ts_matmul_f16(ts_engine_t *e, ts_tensor_t *c, const ts_tensor_t *a, int trans_a,
                  const ts_tensor_t *b, int trans_b, float alpha, float beta);
/* Gradients of c = alpha · op(a) · op(b): da += ..., db += ... (either may be NULL). */
int ts_matmul_backward(ts_engine_t *e, ts_tensor_t *da, ts_tensor_t *db, const ts_tensor_t *dc,
                       const ts_tensor_t *a, int trans_a, const ts_tensor_t *b, int trans_b,
                       float alpha);

/* ---- normalisation and activations ------------------------------------------------------ */

/* LayerNorm without affine, eps 1e-6. out, inp (..., C); mean, rstd (rows) saved for backward.
 * mean and rstd may be NULL at inference. */
int ts_layernorm_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *mean, ts_tensor_t *rstd,
                         const ts_tensor_t *inp);
int ts_layernorm_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                          const ts_tensor_t *inp, const ts_tensor_t *mean, const ts_tensor_t *rstd);

/* GELU, tanh form, computed as x / (1 + e^(−2u)) (kernels/math.h, ts_gelu). out may alias inp. */
int ts_gelu_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
int ts_gelu_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                     const ts_tensor_t *inp);
/* ts_gelu_backward, then dinp16 (BF16 or F16, dinp's element count, apart from every other
 * operand) = dinp as it ends, rounded: a linear's dout written once in 16 bits by its producer,
 * for ts_linear_backward_lp. */
int ts_gelu_backward_lp(ts_engine_t *e, ts_tensor_t *dinp, ts_tensor_t *dinp16,
                        const ts_tensor_t *dout, const ts_tensor_t *inp);
/* GELU for the bf16 forward, whose next op rounds it to bf16 anyway: the same formula as
 * ts_gelu_forward, x / (1 + exp(−2u)), with a vectorised exp (AVX-512), within 1e-6 relative + 1e-6
 * absolute of ts_gelu_forward — far below a bf16 rounding
 * (2^-9), and several times faster. F32 in and out; out may alias inp. TS_ENOTSUP where bf16
 * cannot run (ts_engine_precision_check). */
int ts_gelu_forward_bf16(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
/* out (BF16 or F16) = GELU(inp) rounded to out's dtype: at bf16 ts_gelu_forward_bf16's values, at
 * f16 ts_gelu_forward's — the 16-bit activation a linear layer of that precision reads. out does
 * not overlap inp (TS_EINVAL). */
int ts_gelu_forward_lp(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
/* SiLU, x·sigmoid(x). out may alias inp. */
int ts_silu_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
/* out (BF16 or F16) = ts_silu_forward's values rounded to out's dtype (a DiT's conditioning, as
 * its adaLN linears read it at that precision). out does not overlap inp (TS_EINVAL). */
int ts_silu_forward_lp(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
int ts_silu_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                     const ts_tensor_t *inp);
/* Softmax over the last dimension. out, inp (..., C). out may alias inp. */
int ts_softmax_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
/* dinp += softmax backward, from the forward's output. */
int ts_softmax_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout,
                        const ts_tensor_t *out);

/* ---- attention ------------------------------------------------------------------------- */

/* Scaled dot-product self-attention over heads, not causal (DiT).
 * qkv (B, T, 3C), the last axis laid out (3, heads, head_dim) as DiT's attn.qkv;
 * out (B, T, C), heads concatenated; att (B, heads, T, T) the softmax weights, saved for
 * backward. Scale 1/sqrt(head_dim). */
int ts_attention_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *att, const ts_tensor_t *qkv,
                         int heads);
/* As ts_attention_forward with both products in bf16 (q, k, v and the softmax weights rounded
 * to bf16, fp32 accumulation); the softmax and every tensor stay fp32 (bf16 training runs it too;
 * its backward is the fp32 op), but out may be of dtype bf16: the output then written rounded
 * (the fp32 output's bits rounded on the CPU; on a GPU the last product writes 16 bits, within an
 * ulp of that), apart from qkv and att (TS_EINVAL). */
int ts_attention_forward_bf16(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *att,
                              const ts_tensor_t *qkv, int heads);
/* As ts_attention_forward_bf16 in f16 (the forward of `--precision f16`; its backward is the fp32
 * op, as bf16's). */
int ts_attention_forward_f16(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *att,
                             const ts_tensor_t *qkv, int heads);
/* dqkv (B, T, 3C) += ...; datt (B, heads, T, T) is scratch (overwritten). */
int ts_attention_backward(ts_engine_t *e, ts_tensor_t *dqkv, ts_tensor_t *datt,
                          const ts_tensor_t *dout, const ts_tensor_t *qkv, const ts_tensor_t *att,
                          int heads);

/* Fused (flash-style) attention: the same function as ts_attention_forward, computed in blocks
 * of queries with an online softmax, so no (B, heads, T, T) tensor exists. qkv (B, T, 3C) and
 * out (B, T, C) as above; lse (B, heads, T) each query row's log-sum-exp of its scaled scores,
 * saved for the backward (NULL at inference). Not bit-identical to the composed op (another
 * order of summation; within 1e-5 relative), but a row's result does not depend on the batch
 * or the thread count. On a CUDA engine (kernels/cuda/cuda_attention.cu): fp32, heads at most
 * TS_CUDA_FUSED_HD_MAX wide (TS_ENOTSUP beyond; the composed op has no limit), batches of at
 * most TS_CUDA_FUSED_MAX_BATCH (TS_ERANGE). */
#define TS_CUDA_FUSED_HD_MAX 128
#define TS_CUDA_FUSED_MAX_BATCH 65535 /* the samples are the grid's third dimension */
int ts_attention_fused_forward(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *lse,
                               const ts_tensor_t *qkv, int heads);
/* As ts_attention_fused_forward with both products in bf16 (q, k, v and the unnormalised softmax
 * weights rounded to bf16, fp32 accumulation; softmax and every tensor fp32). TS_ENOTSUP where
 * the CPU lacks AVX-512 BF16 (ts_attention_fused_bf16_check); on a CUDA engine the flash
 * attention on tensor cores (kernels/cuda/cuda_flash.cu): sm_80 or later, heads up to 128 wide
 * in steps of 8 (TS_ENOTSUP otherwise). */
int ts_attention_fused_forward_bf16(ts_engine_t *e, ts_tensor_t *out, ts_tensor_t *lse,
                                    const ts_tensor_t *qkv, int heads);
/* The same in lp, TS_BF16 (as above) or TS_F16 (the products in f16: on a CUDA engine of sm_75
 * or later only; the CPU has no f16 fused attention). out may be of dtype lp: the output is then
 * written rounded to it (the fp32 output's bits, rounded: what a 16-bit linear reading it would
 * round). */
int ts_attention_fused_forward_lp(ts_engine_t *e, ts_dtype_t lp, ts_tensor_t *out, ts_tensor_t *lse,
                                  const ts_tensor_t *qkv, int heads);
/* The same with the output written twice: fp32 into out (the backward reads it) and rounded to
 * lp into out16 (proj's 16-bit input in training), in the one pass. */
int ts_attention_fused_forward_lp_both(ts_engine_t *e, ts_dtype_t lp, ts_tensor_t *out,
                                       ts_tensor_t *out16, ts_tensor_t *lse, const ts_tensor_t *qkv,
                                       int heads);
/* TS_OK when ts_attention_fused_forward_bf16 can run on e (a CPU with AVX-512 BF16, a GPU of
 * sm_80 or later), TS_ENOTSUP otherwise; _lp_check for either 16-bit type (f16: a GPU of sm_75
 * or later). */
int ts_attention_fused_bf16_check(ts_engine_t *e);
int ts_attention_fused_lp_check(ts_engine_t *e, ts_dtype_t lp);
/* dqkv (B, T, 3C) += the gradient, from the forward's out and lse (FlashAttention-2: the softmax
 * weights are recomputed block by block from lse; no scratch argument). */
int ts_attention_fused_backward(ts_engine_t *e, ts_tensor_t *dqkv, const ts_tensor_t *dout,
                                const ts_tensor_t *qkv, const ts_tensor_t *out,
                                const ts_tensor_t *lse, int heads);
/* As ts_attention_fused_backward with its five products in bf16 (q, k, v, dout and the
 * recomputed weights and their gradients rounded to bf16, fp32 accumulation; the softmax, D and
 * every sum into dqkv in fp32). TS_ENOTSUP where ts_attention_fused_bf16_check says so. */
int ts_attention_fused_backward_bf16(ts_engine_t *e, ts_tensor_t *dqkv, const ts_tensor_t *dout,
                                     const ts_tensor_t *qkv, const ts_tensor_t *out,
                                     const ts_tensor_t *lse, int heads);
/* The same in lp (TS_BF16 or TS_F16, where ts_attention_fused_lp_check says so). dqkv16 (NULL,
 * or of dtype lp and dqkv's element count, apart from every operand): dqkv as it ends, rounded —
 * the qkv linear's dout for ts_linear_backward_lp, as ts_gelu_backward_lp's copy. */
int ts_attention_fused_backward_lp(ts_engine_t *e, ts_dtype_t lp, ts_tensor_t *dqkv,
                                   ts_tensor_t *dqkv16, const ts_tensor_t *dout,
                                   const ts_tensor_t *qkv, const ts_tensor_t *out,
                                   const ts_tensor_t *lse, int heads);

/* ---- adaLN-Zero pieces ----------------------------------------------------------------- */
/* mod (B, M·C) is the adaLN modulation output, read as M chunks of C (DiT's .chunk(M, dim=1));
 * a chunk index picks shift, scale or gate, so no chunk is ever copied out. */

/* out (B, T, C) = x · (1 + scale) + shift, scale = mod chunk scale_idx, shift = chunk shift_idx,
 * per sample, broadcast over tokens. out may alias x. */
int ts_modulate_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *x,
                        const ts_tensor_t *mod, int shift_idx, int scale_idx);
/* ln = LayerNorm(x) as ts_layernorm_forward (mean, rstd (B·T) saved, may be NULL), and
 * out = ln · (1 + scale) + shift as ts_modulate_forward — the same bits as the two calls; the CPU
 * modulates each row in the LayerNorm's pass, while the row is in cache. x, ln, out (B, T, C),
 * none aliasing another; mod (B, M·C). out may be BF16 or F16: those values rounded (a 16-bit
 * activation for the linear layer that reads it; TS_EINVAL when it overlaps x or ln). */
int ts_layernorm_modulate_forward(ts_engine_t *e, ts_tensor_t *ln, ts_tensor_t *mean,
                                  ts_tensor_t *rstd, ts_tensor_t *out, const ts_tensor_t *x,
                                  const ts_tensor_t *mod, int shift_idx, int scale_idx);
/* dx += dout · (1 + scale); dmod[shift] += Σ_T dout; dmod[scale] += Σ_T dout · x. */
int ts_modulate_backward(ts_engine_t *e, ts_tensor_t *dx, ts_tensor_t *dmod,
                         const ts_tensor_t *dout, const ts_tensor_t *x, const ts_tensor_t *mod,
                         int shift_idx, int scale_idx);
/* out (B, T, C) = res + gate · y, gate = mod chunk gate_idx. out may alias res. */
int ts_gate_residual_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *res,
                             const ts_tensor_t *y, const ts_tensor_t *mod, int gate_idx);
/* dres += dout; dy += gate · dout; dmod[gate] += Σ_T dout · y. */
int ts_gate_residual_backward(ts_engine_t *e, ts_tensor_t *dres, ts_tensor_t *dy, ts_tensor_t *dmod,
                              const ts_tensor_t *dout, const ts_tensor_t *y, const ts_tensor_t *mod,
                              int gate_idx);
/* ts_gate_residual_backward with dy required, then dy16 (BF16 or F16) = dy as it ends, rounded,
 * as ts_gelu_backward_lp. */
int ts_gate_residual_backward_lp(ts_engine_t *e, ts_tensor_t *dres, ts_tensor_t *dy,
                                 ts_tensor_t *dy16, ts_tensor_t *dmod, const ts_tensor_t *dout,
                                 const ts_tensor_t *y, const ts_tensor_t *mod, int gate_idx);

/* ---- embeddings ------------------------------------------------------------------------ */

/* out (B, D) = [cos(args), sin(args)], args_i = scale·t · exp(−ln(10000)·i/(D/2)), i < D/2;
 * a trailing zero column when D is odd (DiT's TimestepEmbedder, scale = 1000). t (B). out may
 * be BF16 or F16: the values rounded as they are written (a 16-bit linear's input). */
int ts_timestep_embedding_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *t,
                                  float scale);
/* dt (B) += Σ_i dout · d out / d t. */
int ts_timestep_embedding_backward(ts_engine_t *e, ts_tensor_t *dt, const ts_tensor_t *dout,
                                   const ts_tensor_t *t, float scale);
/* out (grid·grid, D) = DiT's fixed 2-D sin-cos table (get_2d_sincos_pos_embed), computed in
 * double precision and rounded once. D must be a multiple of 4. Has no backward. */
int ts_pos_embed_2d(ts_engine_t *e, ts_tensor_t *out, int grid);
/* out (B, D) = table (V, D) rows picked by ids (B, I32). An id outside [0, V) is TS_ERANGE
 * (checked before anything is written; ids are read on the host for the CPU engine). */
int ts_embedding_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *table,
                         const ts_tensor_t *ids);
/* The same for ids the caller has already checked to be in [0, V) (the values it copied to the
 * device): on a CUDA engine nothing is copied back to check them — what a CUDA graph's capture
 * needs (no copy through the legacy stream during one). Out-of-range ids are the caller's bug. */
int ts_embedding_forward_prechecked(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *table,
                                    const ts_tensor_t *ids);
/* dtable (V, D) += scatter of dout (B, D) by ids (checked as the forward's); _prechecked for ids
 * the caller has checked, as ts_embedding_forward_prechecked. */
int ts_embedding_backward(ts_engine_t *e, ts_tensor_t *dtable, const ts_tensor_t *dout,
                          const ts_tensor_t *ids);
int ts_embedding_backward_prechecked(ts_engine_t *e, ts_tensor_t *dtable, const ts_tensor_t *dout,
                                     const ts_tensor_t *ids);

/* ---- patches --------------------------------------------------------------------------- */

/* out (B, T, C·p·p) from img (B, C, H, W): token (gy, gx) → t = gy·(W/p) + gx, features in
 * (c, py, px) order — what a stride-p Conv2d patch embed sees. H, W multiples of p. out may be
 * BF16 or F16 (the values rounded, as the patch embedding's 16-bit linear reads them); it must
 * not overlap img. */
int ts_patchify_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *img, int p);
int ts_patchify_backward(ts_engine_t *e, ts_tensor_t *dimg, const ts_tensor_t *dout, int p);
/* img (B, C, H, W) from tok (B, T, p·p·C), features in (py, px, c) order (DiT's unpatchify). */
int ts_unpatchify_forward(ts_engine_t *e, ts_tensor_t *img, const ts_tensor_t *tok, int p);
int ts_unpatchify_backward(ts_engine_t *e, ts_tensor_t *dtok, const ts_tensor_t *dimg, int p);

/* ---- images (NCHW), for the VAE: kernels/ops_image.c ------------------------------------ */
/* Inference only (no backward), on the CPU and CUDA backends. */

/* A 2-D convolution's stride and zero padding, each side on its own (a downsampler pads only
 * the bottom and the right). */
typedef struct ts_conv2d {
    int stride;
    int pad_top, pad_bottom, pad_left, pad_right;
    /* the products: f32 (zeroed), or bf16 / f16 — the weight and the patches rounded, fp32
     * accumulation, out and bias fp32 (TS_ENOTSUP where that precision cannot run). A weight
     * given in that precision already (converted once by its owner) is not rounded again, and
     * the patches are then written in 16 bits (im2col_lp): no product rounds an operand, and
     * the bits are those of the fp32 weight at the same tile */
    ts_precision_t precision;
} ts_conv2d_t;

/* The output size along one axis: (in + pad_a + pad_b − k) / stride + 1, or 0 when the kernel
 * does not fit in the padded input (or an argument is out of range). */
int64_t ts_conv2d_out_dim(int64_t in, int64_t k, int stride, int pad_a, int pad_b);
/* The fewest floats of scratch ts_conv2d_forward takes for this input, weight and geometry:
 * one output row's patches, Cin·kh·kw·Wo; 0 for a 1×1 kernel of stride 1 without padding and an
 * fp32 weight (it reads the input directly); with a 16-bit weight the patches are 16-bit, two to
 * a float, ⌈Cin·kh·kw·Wo / 2⌉ for every kernel. −1 when the shapes are not a conv's. */
int64_t ts_conv2d_scratch_min(const ts_tensor_t *inp, const ts_tensor_t *weight,
                              const ts_conv2d_t *g);
/* out (B, Cout, Ho, Wo) = conv2d(inp (B, Cin, H, W), weight (Cout, Cin, kh, kw)) + bias (Cout,
 * nullable), torch's Conv2d (cross-correlation), with g's stride and padding; Ho, Wo as
 * ts_conv2d_out_dim. Computed image by image as im2col into scratch (F32, any shape, at least
 * ts_conv2d_scratch_min floats; NULL allowed when that is 0), as many output rows at a time as
 * fit, then one GEMM per tile: an image's result depends on the scratch size and the thread
 * count, never on the other images of the batch. out aliases neither inp nor scratch.
 * TS_ESHAPE for shapes that disagree, TS_EINVAL for a bad geometry, missing or small scratch. */
int ts_conv2d_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                      const ts_tensor_t *weight, const ts_tensor_t *bias, const ts_conv2d_t *g,
                      ts_tensor_t *scratch);
/* GroupNorm as torch.nn.GroupNorm: out, inp (B, C, ...) normalised over each group of C/groups
 * channels and all positions, biased variance, 1/sqrt(var + eps), then · weight[c] + bias[c]
 * (both (C), or both NULL for no affine). The statistics are summed in double. out may alias
 * inp. TS_ESHAPE when groups does not divide C; TS_EINVAL for groups < 1 or eps < 0. */
int ts_groupnorm_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                         const ts_tensor_t *weight, const ts_tensor_t *bias, int groups, float eps);
/* out = SiLU(GroupNorm(inp)), in one pass (the VAE's norm + act pairs). As above otherwise. */
int ts_groupnorm_silu_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp,
                              const ts_tensor_t *weight, const ts_tensor_t *bias, int groups,
                              float eps);
/* out (B, C, 2H, 2W) = inp (B, C, H, W), each pixel repeated 2×2 (F.interpolate, nearest). */
int ts_upsample_nearest2x_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);

/* ---- reductions and losses ------------------------------------------------------------- */

/* out (1) = Σ inp. Computed with a double accumulator on the CPU. */
int ts_sum_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
/* dinp += dout[0]. */
int ts_sum_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout);
/* out (1) = mean of inp. */
int ts_mean_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
/* dinp += dout[0] / N. */
int ts_mean_backward(ts_engine_t *e, ts_tensor_t *dinp, const ts_tensor_t *dout);
/* out (C) = Σ over rows of inp (..., C) (overwrites out). */
int ts_sum_rows(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
/* out (1) = Σ x² (for gradient-norm clipping). */
int ts_sumsq(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *inp);
/* loss (1) = mean((pred − target)²). */
int ts_mse_forward(ts_engine_t *e, ts_tensor_t *loss, const ts_tensor_t *pred,
                   const ts_tensor_t *target);
/* dpred += dloss · 2 (pred − target) / N. */
int ts_mse_backward(ts_engine_t *e, ts_tensor_t *dpred, float dloss, const ts_tensor_t *pred,
                    const ts_tensor_t *target);
/* loss (1) = mean over the batch of −log softmax(logits_b)[labels_b], computed per row as a
 * log-sum-exp around the row's max (stable for any logits). logits (B, K); labels (B) I32, each
 * in [0, K) (TS_ERANGE otherwise, checked before anything is written). */
int ts_cross_entropy_forward(ts_engine_t *e, ts_tensor_t *loss, const ts_tensor_t *logits,
                             const ts_tensor_t *labels);
/* dlogits (B, K) += dloss · (softmax(logits_b) − onehot(labels_b)) / B. */
int ts_cross_entropy_backward(ts_engine_t *e, ts_tensor_t *dlogits, float dloss,
                              const ts_tensor_t *logits, const ts_tensor_t *labels);
/* out (B, C) = mean over the T tokens of x (B, T, C) (the classifier's pooling). */
int ts_mean_tokens_forward(ts_engine_t *e, ts_tensor_t *out, const ts_tensor_t *x);
/* dx (B, T, C) += dout (B, C) / T, broadcast over the tokens. */
int ts_mean_tokens_backward(ts_engine_t *e, ts_tensor_t *dx, const ts_tensor_t *dout);

/* Flow matching, rectified-flow convention (architecture.md §3): per sample b with t_b in [0, 1],
 * xt = (1 − t_b)·x0 + t_b·eps and target = eps − x0 (the velocity). x0, eps, xt, target are
 * (B, ...) with the same shape; t (B). */
int ts_flow_interp(ts_engine_t *e, ts_tensor_t *xt, ts_tensor_t *target, const ts_tensor_t *x0,
                   const ts_tensor_t *eps, const ts_tensor_t *t);

/* ---- optimiser ------------------------------------------------------------------------- */

typedef struct ts_adamw {
    float lr, beta1, beta2, eps, weight_decay;
} ts_adamw_t;

/* One AdamW step (decoupled weight decay, bias-corrected moments) at step number `step` (1 for
 * the first step). param, grad, m, v have the same element count. grad is scaled by grad_scale
 * first (1 for none; the clipping factor otherwise). */
int ts_adamw_step(ts_engine_t *e, ts_tensor_t *param, const ts_tensor_t *grad, ts_tensor_t *m,
                  ts_tensor_t *v, const ts_adamw_t *hp, int64_t step, float grad_scale);
/* ema = decay · ema + (1 − decay) · param. */
int ts_ema_update(ts_engine_t *e, ts_tensor_t *ema, const ts_tensor_t *param, float decay);

/* ---- random numbers -------------------------------------------------------------------- */
/* Counter-based (Philox4x32-10): element j of the output is element offset+j of the stream
 * named by seed, the same on every backend and for any split of the work. See kernels/math.h. */

/* out = uniform in [0, 1) (24-bit resolution). */
int ts_rng_uniform(ts_engine_t *e, ts_tensor_t *out, uint64_t seed, uint64_t offset);
/* out = standard normal (Box-Muller over pairs of stream elements). */
int ts_rng_normal(ts_engine_t *e, ts_tensor_t *out, uint64_t seed, uint64_t offset);

/* Copies a 1-element F32 tensor's value to the host (synchronises a CUDA engine). */
int ts_tensor_item(ts_engine_t *e, const ts_tensor_t *t, float *value);

#ifdef __cplusplus
}
#endif

#endif
