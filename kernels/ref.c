/*
 * ref.c — naive reference implementations of the forward ops, for checking (see kernels/ref.h).
 *
 * What it is: the formulas of kernels/ops.h written a second time, as the plainest loops that could
 * possibly be right: one output element at a time, every sum accumulated in double, every
 * transcendental evaluated in double and rounded to float once at the end. The layouts follow the
 * documentation (ops.h, architecture.md §9) and the DiT reference code they describe, not the
 * backends.
 *
 * What it is not: fast, threaded, or shared with anything. It deliberately includes neither
 * kernels/math.h nor a backend header, so a mistake in the shared per-element math cannot hide by
 * appearing on both sides of a comparison. Nothing here runs on a hot path.
 */
#include "kernels/ref.h"

#include <math.h>
#include <stdlib.h>
#include <stddef.h>

/* ---- matrix products ------------------------------------------------------------------- */

/* Element (i, k) of op(A) where op(A) is (M, K): A stored (M, K), or (K, M) when transposed. */
static double ref_op_a(const float *A, int trans_a, int64_t M, int64_t K, int64_t i, int64_t k) {
    return trans_a ? (double)A[k * M + i] : (double)A[i * K + k];
}

/* Element (k, j) of op(B) where op(B) is (K, N): B stored (K, N), or (N, K) when transposed. */
static double ref_op_b(const float *B, int trans_b, int64_t K, int64_t N, int64_t k, int64_t j) {
    return trans_b ? (double)B[j * K + k] : (double)B[k * N + j];
}

void ts_ref_matmul(float *C, const float *A, int trans_a, const float *B, int trans_b, int64_t M,
                   int64_t N, int64_t K, float alpha, float beta) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double dot = 0.0;
            for (int64_t k = 0; k < K; k++)
                dot += ref_op_a(A, trans_a, M, K, i, k) * ref_op_b(B, trans_b, K, N, k, j);
            double c = (double)alpha * dot;
            /* BLAS convention: with beta == 0, C is output only; its old contents are unread */
            if (beta != 0.0f)
                c += (double)beta * (double)C[i * N + j];
            C[i * N + j] = (float)c;
        }
    }
}

void ts_ref_linear(float *out, const float *inp, const float *weight, const float *bias, int64_t R,
                   int64_t K, int64_t N) {
    for (int64_t r = 0; r < R; r++) {
        for (int64_t n = 0; n < N; n++) {
            double acc = bias ? (double)bias[n] : 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)inp[r * K + k] * (double)weight[n * K + k];
            out[r * N + n] = (float)acc;
        }
    }
}

/* ---- normalisation and activations ------------------------------------------------------ */

void ts_ref_layernorm(float *out, float *mean, float *rstd, const float *inp, int64_t R,
                      int64_t C) {
    const double eps = 1e-6;
    for (int64_t r = 0; r < R; r++) {
        const float *x = inp + r * C;
        double mu = 0.0;
        for (int64_t c = 0; c < C; c++)
            mu += (double)x[c];
        mu /= (double)C;
        double var = 0.0; /* biased (divide by C), as torch.nn.LayerNorm */
        for (int64_t c = 0; c < C; c++)
            var += ((double)x[c] - mu) * ((double)x[c] - mu);
        var /= (double)C;
        double rs = 1.0 / sqrt(var + eps);
        for (int64_t c = 0; c < C; c++)
            out[r * C + c] = (float)(((double)x[c] - mu) * rs);
        if (mean)
            mean[r] = (float)mu;
        if (rstd)
            rstd[r] = (float)rs;
    }
}

void ts_ref_gelu(float *out, const float *inp, int64_t n) {
    const double pi = 3.14159265358979323846;
    const double k0 = sqrt(2.0 / pi);
    for (int64_t i = 0; i < n; i++) {
        double x = (double)inp[i];
        out[i] = (float)(0.5 * x * (1.0 + tanh(k0 * (x + 0.044715 * x * x * x))));
    }
}

void ts_ref_silu(float *out, const float *inp, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double x = (double)inp[i];
        out[i] = (float)(x / (1.0 + exp(-x)));
    }
}

void ts_ref_softmax(float *out, const float *inp, int64_t R, int64_t C) {
    for (int64_t r = 0; r < R; r++) {
        const float *x = inp + r * C;
        double mx = (double)x[0];
        for (int64_t c = 1; c < C; c++)
            if ((double)x[c] > mx)
                mx = (double)x[c];
        double total = 0.0;
        for (int64_t c = 0; c < C; c++)
            total += exp((double)x[c] - mx);
        for (int64_t c = 0; c < C; c++)
            out[r * C + c] = (float)(exp((double)x[c] - mx) / total);
    }
}

/* ---- attention ------------------------------------------------------------------------- */

/* The scaled score q(b, tq, h) · k(b, tk, h) / √hd, with q, k, v of token t and head h at
 * qkv[b, t, s·C + h·hd + d] for s = 0, 1, 2 (the last axis laid out (3, heads, head_dim)). */
static double ref_score(const float *qkv, int64_t b, int64_t tq, int64_t tk, int64_t h, int64_t T,
                        int64_t C, int64_t hd) {
    const float *q = qkv + (b * T + tq) * 3 * C + 0 * C + h * hd;
    const float *k = qkv + (b * T + tk) * 3 * C + 1 * C + h * hd;
    double s = 0.0;
    for (int64_t d = 0; d < hd; d++)
        s += (double)q[d] * (double)k[d];
    return s / sqrt((double)hd);
}

/* Scores are recomputed rather than stored: slower, but no scratch memory and no bookkeeping. */
void ts_ref_attention(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C,
                      int64_t H) {
    int64_t hd = C / H;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            for (int64_t tq = 0; tq < T; tq++) {
                double mx = -INFINITY;
                for (int64_t tk = 0; tk < T; tk++) {
                    double s = ref_score(qkv, b, tq, tk, h, T, C, hd);
                    if (s > mx)
                        mx = s;
                }
                double total = 0.0;
                for (int64_t tk = 0; tk < T; tk++)
                    total += exp(ref_score(qkv, b, tq, tk, h, T, C, hd) - mx);
                if (att)
                    for (int64_t tk = 0; tk < T; tk++)
                        att[((b * H + h) * T + tq) * T + tk] =
                            (float)(exp(ref_score(qkv, b, tq, tk, h, T, C, hd) - mx) / total);
                for (int64_t d = 0; d < hd; d++) {
                    double sum = 0.0;
                    for (int64_t tk = 0; tk < T; tk++) {
                        const float *v = qkv + (b * T + tk) * 3 * C + 2 * C + h * hd;
                        double p = exp(ref_score(qkv, b, tq, tk, h, T, C, hd) - mx) / total;
                        sum += p * (double)v[d];
                    }
                    out[(b * T + tq) * C + h * hd + d] = (float)sum;
                }
            }
        }
    }
}

/* The scaled scores of head h of sample b in double, s (T, T). */
static void ref_scores(double *s, const float *qkv, int64_t b, int64_t h, int64_t T, int64_t C,
                       int64_t hd) {
    for (int64_t tq = 0; tq < T; tq++)
        for (int64_t tk = 0; tk < T; tk++)
            s[tq * T + tk] = ref_score(qkv, b, tq, tk, h, T, C, hd);
}

void ts_ref_attention_lse(float *lse, const float *qkv, int64_t B, int64_t T, int64_t C,
                          int64_t H) {
    int64_t hd = C / H;
    double *s = malloc((size_t)(T * T) * sizeof *s);
    if (!s)
        abort();
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            ref_scores(s, qkv, b, h, T, C, hd);
            for (int64_t tq = 0; tq < T; tq++) {
                double mx = -INFINITY, total = 0.0;
                for (int64_t tk = 0; tk < T; tk++)
                    mx = s[tq * T + tk] > mx ? s[tq * T + tk] : mx;
                for (int64_t tk = 0; tk < T; tk++)
                    total += exp(s[tq * T + tk] - mx);
                lse[(b * H + h) * T + tq] = (float)(mx + log(total));
            }
        }
    free(s);
}

/* Per head: P = softmax(S) in double, then dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − Σ_k P dP) (the
 * softmax's own Jacobian, not the D = dO·O of the fused kernels), dQ = dS K / √hd, dK = dSᵀ Q / √hd. */
void ts_ref_attention_backward(float *dqkv, const float *dout, const float *qkv, int64_t B,
                               int64_t T, int64_t C, int64_t H) {
    int64_t hd = C / H, ld = 3 * C;
    double inv = 1.0 / sqrt((double)hd);
    double *p = malloc((size_t)(T * T) * sizeof *p), *ds = malloc((size_t)(T * T) * sizeof *ds);
    if (!p || !ds)
        abort();
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *q = qkv + b * T * ld + h * hd, *k = q + C, *v = q + 2 * C;
            const float *dy = dout + b * T * C + h * hd;
            float *dq = dqkv + b * T * ld + h * hd, *dk = dq + C, *dv = dq + 2 * C;
            ref_scores(p, qkv, b, h, T, C, hd);
            for (int64_t i = 0; i < T; i++) {
                double mx = -INFINITY, total = 0.0, dot = 0.0;
                for (int64_t j = 0; j < T; j++)
                    mx = p[i * T + j] > mx ? p[i * T + j] : mx;
                for (int64_t j = 0; j < T; j++)
                    total += (p[i * T + j] = exp(p[i * T + j] - mx));
                for (int64_t j = 0; j < T; j++) {
                    p[i * T + j] /= total;
                    double dp = 0.0; /* dP_ij = dO_i · V_j */
                    for (int64_t d = 0; d < hd; d++)
                        dp += (double)dy[i * C + d] * (double)v[j * ld + d];
                    ds[i * T + j] = dp;
                    dot += p[i * T + j] * dp;
                }
                for (int64_t j = 0; j < T; j++)
                    ds[i * T + j] = p[i * T + j] * (ds[i * T + j] - dot);
            }
            for (int64_t j = 0; j < T; j++)
                for (int64_t d = 0; d < hd; d++) {
                    double sq = 0.0, sk = 0.0, sv = 0.0;
                    for (int64_t i = 0; i < T; i++) {
                        sq += ds[j * T + i] * (double)k[i * ld + d]; /* row j of dS · K */
                        sk += ds[i * T + j] * (double)q[i * ld + d]; /* row j of dSᵀ · Q */
                        sv += p[i * T + j] * (double)dy[i * C + d];  /* row j of Pᵀ · dO */
                    }
                    dq[j * ld + d] = (float)(sq * inv);
                    dk[j * ld + d] = (float)(sk * inv);
                    dv[j * ld + d] = (float)sv;
                }
        }
    free(p);
    free(ds);
}

/* ---- adaLN-Zero pieces ----------------------------------------------------------------- */

void ts_ref_modulate(float *out, const float *x, const float *mod, int64_t B, int64_t T, int64_t C,
                     int64_t M, int shift_idx, int scale_idx) {
    for (int64_t b = 0; b < B; b++) {
        const float *shift = mod + b * M * C + (int64_t)shift_idx * C;
        const float *scale = mod + b * M * C + (int64_t)scale_idx * C;
        for (int64_t t = 0; t < T; t++) {
            for (int64_t c = 0; c < C; c++) {
                int64_t i = (b * T + t) * C + c;
                out[i] = (float)((double)x[i] * (1.0 + (double)scale[c]) + (double)shift[c]);
            }
        }
    }
}

void ts_ref_gate_residual(float *out, const float *res, const float *y, const float *mod, int64_t B,
                          int64_t T, int64_t C, int64_t M, int gate_idx) {
    for (int64_t b = 0; b < B; b++) {
        const float *gate = mod + b * M * C + (int64_t)gate_idx * C;
        for (int64_t t = 0; t < T; t++) {
            for (int64_t c = 0; c < C; c++) {
                int64_t i = (b * T + t) * C + c;
                out[i] = (float)((double)res[i] + (double)gate[c] * (double)y[i]);
            }
        }
    }
}

/* ---- embeddings ------------------------------------------------------------------------ */

void ts_ref_timestep_embedding(float *out, const float *t, int64_t B, int64_t D, float scale) {
    const double ln_max_period = log(10000.0);
    int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < half; i++) {
            double freq = exp(-ln_max_period * (double)i / (double)half);
            double arg = (double)scale * (double)t[b] * freq;
            out[b * D + i] = (float)cos(arg);
            out[b * D + half + i] = (float)sin(arg);
        }
        if (D % 2)
            out[b * D + D - 1] = 0.0f;
    }
}

void ts_ref_pos_embed_2d(float *out, int64_t grid, int64_t D) {
    int64_t quarter = D / 4;                 /* each of the 4 blocks holds D/4 frequencies */
    for (int64_t i = 0; i < grid; i++) {     /* row */
        for (int64_t j = 0; j < grid; j++) { /* column */
            float *o = out + (i * grid + j) * D;
            for (int64_t k = 0; k < quarter; k++) {
                double omega = 1.0 / pow(10000.0, (double)k / (double)quarter);
                o[k] = (float)sin((double)j * omega);
                o[quarter + k] = (float)cos((double)j * omega);
                o[2 * quarter + k] = (float)sin((double)i * omega);
                o[3 * quarter + k] = (float)cos((double)i * omega);
            }
        }
    }
}

void ts_ref_embedding(float *out, const float *table, const int32_t *ids, int64_t B, int64_t D) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t d = 0; d < D; d++)
            out[b * D + d] = table[(int64_t)ids[b] * D + d];
}

/* ---- patches --------------------------------------------------------------------------- */

void ts_ref_patchify(float *out, const float *img, int64_t B, int64_t C, int64_t H, int64_t W,
                     int64_t p) {
    int64_t gh = H / p, gw = W / p, F = C * p * p;
    for (int64_t b = 0; b < B; b++)
        for (int64_t gy = 0; gy < gh; gy++)
            for (int64_t gx = 0; gx < gw; gx++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t py = 0; py < p; py++)
                        for (int64_t px = 0; px < p; px++) {
                            int64_t tok = gy * gw + gx;
                            int64_t f = (c * p + py) * p + px; /* (c, py, px) */
                            int64_t y = gy * p + py, x = gx * p + px;
                            out[(b * gh * gw + tok) * F + f] = img[((b * C + c) * H + y) * W + x];
                        }
}

void ts_ref_unpatchify(float *img, const float *tok, int64_t B, int64_t C, int64_t H, int64_t W,
                       int64_t p) {
    int64_t gh = H / p, gw = W / p, F = C * p * p;
    for (int64_t b = 0; b < B; b++)
        for (int64_t gy = 0; gy < gh; gy++)
            for (int64_t gx = 0; gx < gw; gx++)
                for (int64_t py = 0; py < p; py++)
                    for (int64_t px = 0; px < p; px++)
                        for (int64_t c = 0; c < C; c++) {
                            int64_t t = gy * gw + gx;
                            int64_t f = (py * p + px) * C + c; /* (py, px, c) */
                            int64_t y = gy * p + py, x = gx * p + px;
                            img[((b * C + c) * H + y) * W + x] = tok[(b * gh * gw + t) * F + f];
                        }
}

/* ---- reductions, loss, optimiser ------------------------------------------------------- */

void ts_ref_conv2d(float *out, const float *inp, const float *w, const float *bias, int64_t B,
                   int64_t Cin, int64_t H, int64_t W, int64_t Cout, int64_t kh, int64_t kw,
                   int64_t s, int64_t pt, int64_t pb, int64_t pl, int64_t pr) {
    int64_t Ho = (H + pt + pb - kh) / s + 1, Wo = (W + pl + pr - kw) / s + 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t co = 0; co < Cout; co++)
            for (int64_t oy = 0; oy < Ho; oy++)
                for (int64_t ox = 0; ox < Wo; ox++) {
                    double acc = bias ? (double)bias[co] : 0.0;
                    for (int64_t ci = 0; ci < Cin; ci++)
                        for (int64_t ky = 0; ky < kh; ky++)
                            for (int64_t kx = 0; kx < kw; kx++) {
                                int64_t iy = oy * s + ky - pt, ix = ox * s + kx - pl;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                                    continue;
                                acc += (double)inp[((b * Cin + ci) * H + iy) * W + ix] *
                                       (double)w[((co * Cin + ci) * kh + ky) * kw + kx];
                            }
                    out[((b * Cout + co) * Ho + oy) * Wo + ox] = (float)acc;
                }
}

void ts_ref_groupnorm(float *out, const float *inp, const float *weight, const float *bias,
                      int64_t B, int64_t C, int64_t S, int64_t G, double eps, int silu) {
    int64_t cg = C / G;
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < G; g++) {
            const float *x = inp + (b * C + g * cg) * S;
            double mean = 0.0, var = 0.0;
            for (int64_t i = 0; i < cg * S; i++)
                mean += x[i];
            mean /= (double)(cg * S);
            for (int64_t i = 0; i < cg * S; i++)
                var += ((double)x[i] - mean) * ((double)x[i] - mean);
            var /= (double)(cg * S);
            for (int64_t i = 0; i < cg * S; i++) {
                int64_t c = g * cg + i / S;
                double y = ((double)x[i] - mean) / sqrt(var + eps);
                y = y * (weight ? (double)weight[c] : 1.0) + (bias ? (double)bias[c] : 0.0);
                out[(b * C + g * cg) * S + i] = (float)(silu ? y / (1.0 + exp(-y)) : y);
            }
        }
}

void ts_ref_upsample2x(float *out, const float *inp, int64_t R, int64_t H, int64_t W) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t y = 0; y < 2 * H; y++)
            for (int64_t x = 0; x < 2 * W; x++)
                out[(r * 2 * H + y) * 2 * W + x] = inp[(r * H + y / 2) * W + x / 2];
}

double ts_ref_sum(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i];
    return s;
}

double ts_ref_mse(const float *pred, const float *target, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)pred[i] - (double)target[i];
        s += d * d;
    }
    return n > 0 ? s / (double)n : 0.0;
}

/* torch.optim.AdamW, one step, per element:
 *   p ← p·(1 − lr·wd)
 *   m ← β1·m + (1 − β1)·g
 *   v ← β2·v + (1 − β2)·g²
 *   p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + eps) */
void ts_ref_adamw(float *param, const float *grad, float *m, float *v, int64_t n, double lr,
                  double beta1, double beta2, double eps, double wd, int64_t step) {
    double bias1 = 1.0 - pow(beta1, (double)step);
    double bias2 = 1.0 - pow(beta2, (double)step);
    for (int64_t i = 0; i < n; i++) {
        double g = (double)grad[i];
        double p = (double)param[i] * (1.0 - lr * wd);
        double mm = beta1 * (double)m[i] + (1.0 - beta1) * g;
        double vv = beta2 * (double)v[i] + (1.0 - beta2) * g * g;
        p -= (lr / bias1) * mm / (sqrt(vv) / sqrt(bias2) + eps);
        param[i] = (float)p;
        m[i] = (float)mm;
        v[i] = (float)vv;
    }
}

/* ---- comparison helpers ---------------------------------------------------------------- */

/* Equal values (including equal infinities) and NaN against NaN count as 0; NaN against a
 * number, or Inf against anything else, counts as +Inf so that no comparison can hide it. */
static double ref_abs_diff(float a, float b) {
    if (a == b || (isnan(a) && isnan(b)))
        return 0.0;
    double d = fabs((double)a - (double)b);
    return isnan(d) ? INFINITY : d;
}

double ts_ref_max_abs_diff(const float *a, const float *b, int64_t n) {
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = ref_abs_diff(a[i], b[i]);
        if (d > mx)
            mx = d;
    }
    return mx;
}

double ts_ref_nmse(const float *a, const float *b, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = ref_abs_diff(a[i], b[i]);
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    const double tiny = 1e-30;
    return num / (den > tiny ? den : tiny);
}
