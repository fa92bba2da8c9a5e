/*
 * ref.h — naive reference implementations of the forward ops (and attention's backward), for
 * checking.
 *
 * Plain loops over host float arrays, accumulating in double, written for obviousness rather
 * than speed and sharing no code with the backends (not even kernels/math.h): the tests and
 * `tessera selfcheck` compare the real ops against these. Layouts and semantics are exactly those
 * documented in kernels/ops.h. Nothing here is used on a hot path.
 */
#ifndef TS_REF_H
#define TS_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C (M, N) = alpha · op(A) · op(B) + beta · C, row-major, A stored (M,K) or (K,M) if trans_a. */
void ts_ref_matmul(float *C, const float *A, int trans_a, const float *B, int trans_b, int64_t M,
                   int64_t N, int64_t K, float alpha, float beta);
/* out (R, N) = inp (R, K) · weightᵀ (weight (N, K)) + bias (N, nullable) */
void ts_ref_linear(float *out, const float *inp, const float *weight, const float *bias, int64_t R,
                   int64_t K, int64_t N);
/* out, inp (R, C); mean, rstd (R) nullable; eps 1e-6, no affine */
void ts_ref_layernorm(float *out, float *mean, float *rstd, const float *inp, int64_t R, int64_t C);
void ts_ref_gelu(float *out, const float *inp, int64_t n);
void ts_ref_silu(float *out, const float *inp, int64_t n);
void ts_ref_softmax(float *out, const float *inp, int64_t R, int64_t C);
/* out (B, T, C), att (B, H, T, T) nullable, qkv (B, T, 3C) laid out (3, H, C/H) */
void ts_ref_attention(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C,
                      int64_t H);
/* lse (B, H, T): each query row's log-sum-exp of its scaled scores (what the fused attention
 * saves for its backward). */
void ts_ref_attention_lse(float *lse, const float *qkv, int64_t B, int64_t T, int64_t C, int64_t H);
/* dqkv (B, T, 3C) = the gradient of Σ dout ⊙ attention(qkv) (overwritten); dout (B, T, C). */
void ts_ref_attention_backward(float *dqkv, const float *dout, const float *qkv, int64_t B,
                               int64_t T, int64_t C, int64_t H);
/* out (B, T, C) = x · (1 + mod[b, scale_idx]) + mod[b, shift_idx], mod (B, M·C) */
void ts_ref_modulate(float *out, const float *x, const float *mod, int64_t B, int64_t T, int64_t C,
                     int64_t M, int shift_idx, int scale_idx);
/* out (B, T, C) = res + mod[b, gate_idx] · y */
void ts_ref_gate_residual(float *out, const float *res, const float *y, const float *mod, int64_t B,
                          int64_t T, int64_t C, int64_t M, int gate_idx);
/* out (B, D), t (B) */
void ts_ref_timestep_embedding(float *out, const float *t, int64_t B, int64_t D, float scale);
/* out (grid², D) */
void ts_ref_pos_embed_2d(float *out, int64_t grid, int64_t D);
void ts_ref_embedding(float *out, const float *table, const int32_t *ids, int64_t B, int64_t D);
void ts_ref_patchify(float *out, const float *img, int64_t B, int64_t C, int64_t H, int64_t W,
                     int64_t p);
void ts_ref_unpatchify(float *img, const float *tok, int64_t B, int64_t C, int64_t H, int64_t W,
                       int64_t p);
/* out (B, Cout, Ho, Wo) = conv2d of inp (B, Cin, H, W) with w (Cout, Cin, kh, kw), bias (Cout,
 * nullable), stride s, zero padding pt/pb/pl/pr (top, bottom, left, right) */
void ts_ref_conv2d(float *out, const float *inp, const float *w, const float *bias, int64_t B,
                   int64_t Cin, int64_t H, int64_t W, int64_t Cout, int64_t kh, int64_t kw,
                   int64_t s, int64_t pt, int64_t pb, int64_t pl, int64_t pr);
/* out, inp (B, C, S); GroupNorm over G groups, then weight, bias (C, nullable); silu: SiLU after */
void ts_ref_groupnorm(float *out, const float *inp, const float *weight, const float *bias,
                      int64_t B, int64_t C, int64_t S, int64_t G, double eps, int silu);
/* out (R, 2H, 2W) = nearest ×2 of inp (R, H, W) */
void ts_ref_upsample2x(float *out, const float *inp, int64_t R, int64_t H, int64_t W);
double ts_ref_sum(const float *x, int64_t n);
double ts_ref_mse(const float *pred, const float *target, int64_t n);
/* AdamW step exactly as torch.optim.AdamW (decoupled decay), in double. */
void ts_ref_adamw(float *param, const float *grad, float *m, float *v, int64_t n, double lr,
                  double beta1, double beta2, double eps, double wd, int64_t step);

/* Comparison helpers: max |a − b|, and normalised MSE Σ(a−b)² / max(Σ b², tiny). */
double ts_ref_max_abs_diff(const float *a, const float *b, int64_t n);
double ts_ref_nmse(const float *a, const float *b, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
