/*
 * flash_mma.h — the tile steps of the 16-bit flash attention on tensor cores
 * (kernels/cuda/cuda_flash.cu), bf16 or f16, shared with the CPU so that tests/test_flash_mma.c
 * runs them in the kernel's order on an emulated warp.
 *
 * The scheme is FlashAttention-2's. A warp owns 16 query rows of one head and walks the keys in
 * blocks of TS_FA_KB: S = Q·Kᵀ and O += P·V each by `mma.sync.m16n8k16` (16-bit inputs, fp32
 * accumulation; on sm_75, f16 only, as two `m16n8k8` whose fragments are the halves of the k16
 * one's), the online softmax in fp32 registers between them, and the scores' fragments reused in
 * registers as the next product's A operand (no round trip through memory). q, k, v and the
 * unnormalised weights e^(S − m) are rounded to the 16-bit type (nearest even; the argument f16
 * of the steps below: 1 f16, 0 bf16), as the CPU's bf16 fused attention
 * (kernels/cpu/cpu_attention.c) rounds them; the row sums take the fp32 weights. In f16 a value
 * past 65504 becomes ±∞, as in any f16 attention: the weights are ≤ 1, q, k and v are the
 * caller's to keep in range.
 *
 * Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16" with .bf16/.f16): lane l of the warp has
 * g = l / 4 and c = l % 4, and holds
 *   A (16×16, row-major) four 32-bit registers of two 16-bit values each: (g, 2c..2c+1),
 *                        (g+8, 2c..2c+1), (g, 2c+8..2c+9), (g+8, 2c+8..2c+9)
 *   B (16×8, by column)  two: (k = 2c..2c+1, n = g), (k = 2c+8..2c+9, n = g)
 *   C, D (16×8, fp32)    four floats: (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)
 * the lower 16 bits of a register holding the element of the lower column (A) or row (B).
 * m16n8k8 (.f16) has A's registers 0 and 1 and B's register 0 over k = 0..7: so the k16 product
 * is the k8 one on (a0, a1, b0) then on (a2, a3, b1).
 * Each lane therefore sees two query rows, g and g + 8: its running max and sum are for those
 * two, and a row's full max and sum are the four lanes of its quad reduced (shuffles by 1 and 2).
 *
 * Layout in memory as the other fused attentions (kernels/ops.h): qkv (B, T, 3C) with the last
 * axis (3, H, hd), out (B, T, C), lse (B, H, T). Head sizes up to TS_FA_DMAX in steps of 8; the
 * head is padded with zeros to a multiple of 16 (72 → 80) for the products' k-steps.
 *
 * Every function is TS_HD (kernels/math.h): the same source on the GPU and the CPU. What differs
 * is only the warp-wide part — the mma itself and the quad shuffles — which the kernel does with
 * the hardware and the test with loops over the 32 lanes; the hardware's accumulation inside one
 * mma may round differently from the emulation's sequential fp32 sum, so the test compares with
 * a tolerance, not bits.
 */
#ifndef TS_KERNELS_FLASH_MMA_H
#define TS_KERNELS_FLASH_MMA_H

#include <stdint.h>

#include "kernels/math.h"

#define TS_FA_KB 32    /* keys per block: four n-tiles of S, two k-steps of P·V */
#define TS_FA_DMAX 128 /* the widest head */
#define TS_FA_ROWS 16  /* query rows per warp */
#define TS_FA_WARPS 4  /* warps per thread block: 64 query rows */

/* One lane's registers. q: Q's A fragments, one per k-step of the head (DP / 16); s: the scores
 * of the block, one C fragment per n-tile of keys; o: the output, one C fragment per n-tile of
 * the head (DP / 8); m, l: the running max and this lane's share of the sum, rows g and g + 8. */
typedef struct ts_fa_lane {
    uint32_t q[TS_FA_DMAX / 16][4];
    float s[TS_FA_KB / 8][4];
    uint32_t p[TS_FA_KB / 16][4]; /* the block's weights as A fragments of P·V */
    float o[TS_FA_DMAX / 8][4];
    float m[2], l[2];
} ts_fa_lane_t;

/* The head padded to the products' k-steps. */
TS_HD int ts_fa_padded(int hd) { return (hd + 15) / 16 * 16; }

/* Two 16-bit values in one register (f16 when f16, else bf16): lo in the lower 16 bits. Only
 * the mma reads them: on a GPU from sm_80, one cvt.rn for the pair (a NaN there is the
 * hardware's canonical one, not ts_f32_to_lp's — the same to the mma). */
TS_HD uint32_t ts_fa_pack(float lo, float hi, int f16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t u;
    if (f16) {
        __half2 h = __floats2half2_rn(lo, hi);
        memcpy(&u, &h, sizeof u);
    } else {
        __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
        memcpy(&u, &b, sizeof u);
    }
    return u;
#else
    return (uint32_t)ts_f32_to_lp(lo, f16) | (uint32_t)ts_f32_to_lp(hi, f16) << 16;
#endif
}

/* The value at (row, col) of one C fragment register r (0..3) of lane. */
TS_HD int ts_fa_c_row(int lane, int r) { return lane / 4 + (r >= 2 ? 8 : 0); }
TS_HD int ts_fa_c_col(int lane, int r) { return 2 * (lane % 4) + (r & 1); }

/* Element i (0..7) of lane's A fragment: row and column (the register is i / 2, its half i % 2). */
TS_HD int ts_fa_a_row(int lane, int i) { return lane / 4 + ((i / 2) & 1 ? 8 : 0); }
TS_HD int ts_fa_a_col(int lane, int i) { return 2 * (lane % 4) + (i & 1) + (i >= 4 ? 8 : 0); }

/* Element i (0..3) of lane's B fragment: k (row) and n (column). */
TS_HD int ts_fa_b_k(int lane, int i) { return 2 * (lane % 4) + (i & 1) + (i >= 2 ? 8 : 0); }
TS_HD int ts_fa_b_n(int lane) { return lane / 4; }

/* Clears the lane for a new row block. */
TS_HD void ts_fa_begin(ts_fa_lane_t *L) {
    TS_UNROLL
    for (int n = 0; n < TS_FA_DMAX / 8; n++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++)
            L->o[n][r] = 0.0f;
    }
    L->m[0] = L->m[1] = -INFINITY;
    L->l[0] = L->l[1] = 0.0f;
}

/* A fragments of 16 rows of a head (src: the first row's head slice, ld apart; rows of them
 * valid, ≤ 16 — the others, and the head's padding, are 0), one per k-step of the head. */
TS_HD void ts_fa_load_a(uint32_t f[][4], int lane, const float *src, int64_t ld, int rows, int hd,
                        int f16) {
    int dp = ts_fa_padded(hd);
    TS_UNROLL
    for (int ks = 0; ks < dp / 16; ks++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++) {
            float v[2];
            TS_UNROLL
            for (int h = 0; h < 2; h++) {
                int i = 2 * r + h, row = ts_fa_a_row(lane, i), col = 16 * ks + ts_fa_a_col(lane, i);
                v[h] = row < rows && col < hd ? src[(int64_t)row * ld + col] : 0.0f;
            }
            f[ks][r] = ts_fa_pack(v[0], v[1], f16);
        }
    }
}

/* Q's fragments for the warp's rows. */
TS_HD void ts_fa_load_q(ts_fa_lane_t *L, int lane, const float *q, int64_t ld, int rows, int hd,
                        int f16) {
    ts_fa_load_a(L->q, lane, q, ld, rows, hd, f16);
}

/* C fragments of a 16 × TS_FA_KB product as the A fragments of the next product (16-bit): C's
 * n-tiles 2ks and 2ks + 1 are the columns 0..7 and 8..15 of A's k-step ks. */
TS_HD void ts_fa_c_to_a(uint32_t a[][4], const float c[][4], int f16) {
    TS_UNROLL
    for (int ks = 0; ks < TS_FA_KB / 16; ks++) {
        const float *lo = c[2 * ks], *hi = c[2 * ks + 1];
        a[ks][0] = ts_fa_pack(lo[0], lo[1], f16);
        a[ks][1] = ts_fa_pack(lo[2], lo[3], f16);
        a[ks][2] = ts_fa_pack(hi[0], hi[1], f16);
        a[ks][3] = ts_fa_pack(hi[2], hi[3], f16);
    }
}

/* Staging a block of keys (or values, queries, dO) into the staged block (TS_FA_KB rows of dp
 * 16-bit values) four columns at a time: group e (0 .. TS_FA_KB · dp / 4 − 1) is key e / (dp / 4),
 * columns 4(e % (dp / 4)) .. + 3, into *key and *col. 1 when the group is read from the source
 * (key < n, the block's valid ones, and col < hd: hd is a multiple of 8, so a group is all in or
 * all out), 0 when it is zeros (the padding, the keys past n). The kernel's threads take the
 * groups in turn, each one load of four floats and two ts_fa_pack; the test takes them all. */
TS_HD int ts_fa_stage4_at(int e, int dp, int n, int hd, int *key, int *col) {
    *key = e / (dp / 4);
    *col = 4 * (e % (dp / 4));
    return *key < n && *col < hd;
}

/* The B fragments come from the staged block by `ldmatrix.x4` (PTX ISA, "Warp-level matrix load
 * instruction: ldmatrix"; sm_75 on), four 8×8 matrices of 16-bit values in one instruction: lanes
 * 8i .. 8i+7 give the addresses of matrix i's eight rows (16 bytes each, 16-byte aligned), and
 * lane l receives in its register i matrix i's elements (l/4, 2(l%4)) and (l/4, 2(l%4) + 1) —
 * with .trans, (2(l%4), l/4) and (2(l%4) + 1, l/4) — the first in the lower 16 bits. That is
 * mma.m16n8k16's B fragment (above) of an 8-column half of B stored by its n rows (Kᵀ: K's rows)
 * or, with .trans, by its k rows (V's rows). One load gives two n-tiles: registers 0, 1 are
 * n-tile 2np's b[0], b[1] (k = 0..7, 8..15 of the k-step), registers 2, 3 n-tile 2np + 1's.
 * The functions give the element of the staged block whose address lane gives. With the rows
 * TS_FA_LDK apart (68 four-byte banks: 4 mod 32), each matrix's eight rows fall in eight distinct
 * groups of four banks: no conflict (tests/test_flash_mma.c checks both). */
#define TS_FA_LDK (TS_FA_DMAX + 8) /* the kernels' staged row stride, in 16-bit elements */

/* Kᵀ at k-step ks of the head, n-tiles 2np and 2np + 1 of the keys: B[k][n] = K[8nt + n][16ks
 * + k], from the staged block (TS_FA_KB rows, ldk apart). */
TS_HD int ts_fa_k_ldm(int ldk, int lane, int ks, int np) {
    int i = lane / 8;
    return (16 * np + 8 * (i / 2) + lane % 8) * ldk + 16 * ks + 8 * (i % 2);
}

/* V (.trans) at k-step ks of the keys, n-tiles 2np and 2np + 1 of the head: B[k][n] =
 * V[16ks + k][8nt + n], from the staged block (TS_FA_KB rows, ldv apart). */
TS_HD int ts_fa_v_ldm(int ldv, int lane, int ks, int np) {
    int i = lane / 8;
    return (16 * ks + 8 * (i % 2) + lane % 8) * ldv + 16 * np + 8 * (i / 2);
}

/* After S = Q·Kᵀ: the scores scaled, the keys past n (the block's valid ones) at −∞, and into
 * mx this lane's max of rows g and g + 8. */
TS_HD void ts_fa_scores(ts_fa_lane_t *L, int lane, int n, float scale, float mx[2]) {
    mx[0] = mx[1] = -INFINITY;
    TS_UNROLL
    for (int nt = 0; nt < TS_FA_KB / 8; nt++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++) {
            int key = 8 * nt + ts_fa_c_col(lane, r);
            float v = key < n ? L->s[nt][r] * scale : -INFINITY;
            L->s[nt][r] = v;
            mx[r / 2] = v > mx[r / 2] ? v : mx[r / 2];
        }
    }
}

/* The online softmax for one block, given the rows' block max bm (the quad's): the new running
 * max, the output and the sum rescaled by e^(m_old − m_new), the weights e^(s − m) into this
 * lane's sum (fp32) and, rounded to 16 bits, into the A fragments of P·V. */
TS_HD void ts_fa_softmax(ts_fa_lane_t *L, const float bm[2], int dp, int f16) {
    float alpha[2];
    TS_UNROLL
    for (int h = 0; h < 2; h++) {
        float mn = bm[h] > L->m[h] ? bm[h] : L->m[h];
        alpha[h] = L->m[h] == -INFINITY ? 0.0f : ts_expf(L->m[h] - mn);
        L->m[h] = mn;
        L->l[h] *= alpha[h];
    }
    TS_UNROLL
    for (int n = 0; n < dp / 8; n++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++)
            L->o[n][r] *= alpha[r / 2];
    }
    TS_UNROLL
    for (int nt = 0; nt < TS_FA_KB / 8; nt++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++) {
            float s = L->s[nt][r];
            float p = s == -INFINITY ? 0.0f : ts_expf(s - L->m[r / 2]);
            L->s[nt][r] = p;
            L->l[r / 2] += p;
        }
    }
    ts_fa_c_to_a(L->p, L->s, f16);
}

/* The end of the row block, given the rows' full sums (the quad's): o / l into out (the warp's
 * first row's head slice, rows ld apart; rows of them valid, hd columns; NULL: not written) and,
 * when out16 is not NULL, rounded to the 16-bit type into out16 (the same layout) — either or
 * both; and each row's log-sum-exp into lse (NULL: none; lse[row]) — written by the quad's first
 * lane. */
TS_HD void ts_fa_finish(const ts_fa_lane_t *L, int lane, const float sum[2], float *out,
                        uint16_t *out16, int64_t ld, int rows, int hd, float *lse, int f16) {
    TS_UNROLL
    for (int n = 0; n < ts_fa_padded(hd) / 8; n++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++) {
            int row = ts_fa_c_row(lane, r), col = 8 * n + ts_fa_c_col(lane, r);
            if (row < rows && col < hd) {
                float v = L->o[n][r] / sum[r / 2];
                if (out16)
                    out16[(int64_t)row * ld + col] = ts_f32_to_lp(v, f16);
                if (out)
                    out[(int64_t)row * ld + col] = v;
            }
        }
    }
    if (lse && lane % 4 == 0) {
        TS_UNROLL
        for (int h = 0; h < 2; h++) {
            int row = lane / 4 + 8 * h;
            if (row < rows)
                lse[row] = L->m[h] + logf(sum[h]);
        }
    }
}

/* ---- the backward (FlashAttention-2): two passes, no atomics -------------------------------
 *
 * dK, dV pass: a warp owns 16 keys (k, v as A fragments) and walks the queries in blocks of
 * TS_FA_KB: Sᵀ = K·Qᵀ, Pᵀ = e^(scale·Sᵀ − lse) per query column, dV += Pᵀ·dO, dPᵀ = V·dOᵀ,
 * dSᵀ = Pᵀ ∘ (dPᵀ − D) with D = rowsum(dO ∘ O) per query, dK += dSᵀ·Q; at the end dK · scale.
 * dQ pass: a warp owns 16 queries (q, dO as A fragments; lse and D per row) and walks the keys:
 * S = Q·Kᵀ, P = e^(scale·S − lse), dP = dO·Vᵀ, dS = P ∘ (dP − D), dQ += dS·K; at the end
 * dQ · scale. q, k, v, dO, P and dS are rounded to the 16-bit type for the products, as the
 * CPU's bf16 backward rounds them (in f16, dO and dS below 2⁻¹⁴ lose bits as subnormals: what a
 * loss scale is for); D, P, dS and the sums into dqkv are fp32. Each gradient element has one
 * writer, which adds into dqkv (the backward accumulates). D is computed once per row and head
 * before both passes (ts_fa_delta: a pass of its own, as FlashAttention-2's preprocessing), not
 * again in every block that reads it. */

/* D = dO · O over one row's head (fp32, in order). */
TS_HD float ts_fa_row_dot(const float *dout, const float *o, int hd) {
    float d = 0.0f;
    for (int x = 0; x < hd; x++)
        d += dout[x] * o[x];
    return d;
}

/* One lane's registers in the backward: a, b the A fragments of the warp's 16 rows (dK, dV pass:
 * k and v; dQ pass: q and dO); s, dp the block's products; acc0, acc1 the gradients (dK and dV;
 * dQ and unused); ra, rb the rows' lse and D (dQ pass). */
typedef struct ts_fa_grad_lane {
    uint32_t a[TS_FA_DMAX / 16][4], b[TS_FA_DMAX / 16][4];
    float s[TS_FA_KB / 8][4], dp[TS_FA_KB / 8][4];
    uint32_t pa[TS_FA_KB / 16][4];
    float acc0[TS_FA_DMAX / 8][4], acc1[TS_FA_DMAX / 8][4];
    float ra[2], rb[2];
} ts_fa_grad_lane_t;

/* The dQ pass's row values, lse and D (the block's rows from lse_rows and d_rows), for the lane's
 * rows g and g + 8 (0 past rows). */
TS_HD void ts_fa_row_stats(ts_fa_grad_lane_t *G, int lane, const float *lse_rows,
                           const float *d_rows, int rows) {
    TS_UNROLL
    for (int h = 0; h < 2; h++) {
        int row = lane / 4 + 8 * h;
        G->ra[h] = row < rows ? lse_rows[row] : 0.0f;
        G->rb[h] = row < rows ? d_rows[row] : 0.0f;
    }
}

/* Element i of the D pass, which both passes read: D (B, H, T) of row (b, t) and head h, from
 * dout and out (B, T, C); i runs over (b, t, h) with h fastest (the heads of one row side by
 * side). */
TS_HD void ts_fa_delta(float *d, const float *dout, const float *out, int64_t T, int64_t C,
                       int64_t H, int hd, int64_t i) {
    int64_t h = i % H, bt = i / H, b = bt / T, t = bt % T;
    d[(b * H + h) * T + t] = ts_fa_row_dot(dout + bt * C + h * hd, out + bt * C + h * hd, hd);
}

TS_HD void ts_fa_grad_begin(ts_fa_grad_lane_t *G) {
    TS_UNROLL
    for (int n = 0; n < TS_FA_DMAX / 8; n++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++)
            G->acc0[n][r] = G->acc1[n][r] = 0.0f;
    }
}

/* P from the scores s (in place, fp32), the columns past n (the block's valid ones) 0: by row
 * (lse the lane's rows g and g + 8: the dQ pass) or by column (lse_col[column]: the dK, dV pass,
 * where the columns are queries). Then the 16-bit A fragments of P into pa. */
TS_HD void ts_fa_probs(ts_fa_grad_lane_t *G, int lane, int n, float scale, const float lse_row[2],
                       const float *lse_col, int f16) {
    TS_UNROLL
    for (int nt = 0; nt < TS_FA_KB / 8; nt++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++) {
            int col = 8 * nt + ts_fa_c_col(lane, r);
            float m = lse_col ? (col < n ? lse_col[col] : 0.0f) : lse_row[r / 2];
            G->s[nt][r] = col < n ? ts_expf(G->s[nt][r] * scale - m) : 0.0f;
        }
    }
    ts_fa_c_to_a(G->pa, G->s, f16);
}

/* dS = P ∘ (dP − D) into s (fp32), by row (D the rows': dQ pass) or by column (d_col[column]),
 * then its 16-bit A fragments into pa. */
TS_HD void ts_fa_dscores(ts_fa_grad_lane_t *G, int lane, int n, const float d_row[2],
                         const float *d_col, int f16) {
    TS_UNROLL
    for (int nt = 0; nt < TS_FA_KB / 8; nt++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++) {
            int col = 8 * nt + ts_fa_c_col(lane, r);
            float d = d_col ? (col < n ? d_col[col] : 0.0f) : d_row[r / 2];
            G->s[nt][r] = G->s[nt][r] * (G->dp[nt][r] - d);
        }
    }
    ts_fa_c_to_a(G->pa, G->s, f16);
}

/* dst (16 rows of a head, ld apart; rows of them valid) += scale · acc, each element once; and
 * when dst16 is not NULL, dst16 (laid out as dst) = the sum rounded to bf16 (f16 when f16). */
TS_HD void ts_fa_add_rows(const float acc[][4], int lane, float *dst, uint16_t *dst16, int64_t ld,
                          int rows, int hd, float scale, int f16) {
    TS_UNROLL
    for (int n = 0; n < ts_fa_padded(hd) / 8; n++) {
        TS_UNROLL
        for (int r = 0; r < 4; r++) {
            int row = ts_fa_c_row(lane, r), col = 8 * n + ts_fa_c_col(lane, r);
            if (row < rows && col < hd) {
                int64_t i = (int64_t)row * ld + col;
                dst[i] += acc[n][r] * scale;
                if (dst16) /* the element's only writer: its final value, rounded */
                    dst16[i] = ts_f32_to_lp(dst[i], f16);
            }
        }
    }
}

#endif
