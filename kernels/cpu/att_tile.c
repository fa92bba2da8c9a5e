/*
 * att_tile.c — the fp32 fused attention's two block products (kernels/cpu/vec.h: att_qk,
 * att_pv), in AVX-512 or AVX2 registers, compiled once per instruction set beside vec.c.
 *
 * Why not OpenBLAS. A forward task multiplies a block of at most 64 queries by at most 256 keys
 * over one head (64 × 196 × 64 for `small`), twice. Single-threaded OpenBLAS packs both operands
 * for every such call and ran these at about half the machine's sgemm rate; here the keys are
 * transposed once per head and key block (cpu_attention.c) and everything else is read where it
 * lies.
 *
 * The bits. Every output is one chain of fused multiply-adds in the order of the summed index,
 * from 0 (or from the output's value, when accumulating), then for the scores a product by the
 * scale: each lane computes what the scalar loop `acc = fmaf(a[p], b[p], acc)` computes, so the
 * AVX-512 and AVX2 builds give the same bits, and a row's result does not depend on the other
 * rows or columns of its tile. (The base build has no FMA and no table entry: OpenBLAS there.)
 * tests/test_cpu_vec.c checks each build against that scalar loop with memcmp.
 *
 * Tiles. Scores: R rows × NV vectors of columns in registers, the keys' row p (NV vectors) loaded
 * once per p and each query element broadcast. Output: the same with V's rows. Row tails take a
 * smaller R; an output's column tail under one vector runs the scalar chain (fmaf, which the
 * compiler makes the same single instruction).
 */
#include "kernels/cpu/vec.h"

#include <math.h>

#ifndef TS_VEC_ISA
#error "att_tile.c is built with -DTS_VEC_ISA=avx512|avx2 (kernels/CMakeLists.txt)"
#endif

#include "kernels/cpu/tile.h"

#if LANES == 16
#define QK_R 8 /* 8 × 2 accumulators of 32 registers */
#define QK_NV 2
#define PV_R 6 /* 6 × 4 */
#define PV_NV 4
#else
#define QK_R 6 /* 6 × 2 accumulators of 16 registers */
#define QK_NV 2
#define PV_R 4 /* 4 × 3 */
#define PV_NV 3
#endif

/* The two tiles below share their loops but not their register shapes and epilogues; one tile
 * function for both, with its accumulators sized for the larger, ran the scores at 113 GFLOP/s
 * instead of 166–189 on one core (gcc left part of the smaller tile unrolled less): kept apart. */

/* Scores of R query rows × NV vectors of key columns: s = scale · q · kt over hd. */
INLINE void qk_tile(int R, int NV, float *s, int64_t lds, const float *q, int64_t ldq,
                    const float *kt, int64_t mp, int64_t hd, float scale) {
    vf acc[QK_R][QK_NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            acc[r][c] = VZERO();
    for (int64_t p = 0; p < hd; p++) {
        vf b[QK_NV];
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            b[c] = VLOAD(kt + p * mp + c * LANES);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            vf a = VSET1(q[r * ldq + p]);
#pragma GCC unroll 4
            for (int c = 0; c < NV; c++)
                acc[r][c] = VFMA(a, b[c], acc[r][c]);
        }
    }
    vf sc = VSET1(scale);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            VSTORE(s + r * lds + c * LANES, VMUL(acc[r][c], sc));
}

/* R rows of the scores for every column (mp a multiple of LANES). */
INLINE void qk_rows(int R, float *s, int64_t lds, const float *q, int64_t ldq, const float *kt,
                    int64_t mp, int64_t hd, float scale) {
    int64_t j = 0;
    for (; j + QK_NV * LANES <= mp; j += QK_NV * LANES)
        qk_tile(R, QK_NV, s + j, lds, q, ldq, kt + j, mp, hd, scale);
    for (; j < mp; j += LANES)
        qk_tile(R, 1, s + j, lds, q, ldq, kt + j, mp, hd, scale);
}

static void att_qk(float *s, int64_t lds, const float *q, int64_t ldq, const float *kt, int64_t mp,
                   int64_t n, int64_t hd, float scale) {
    int64_t i = 0;
    for (; i + QK_R <= n; i += QK_R)
        qk_rows(QK_R, s + i * lds, lds, q + i * ldq, ldq, kt, mp, hd, scale);
    switch (n - i) { /* each tail size its own unrolled tile */
#if QK_R > 7
    case 7: qk_rows(7, s + i * lds, lds, q + i * ldq, ldq, kt, mp, hd, scale); break;
    case 6: qk_rows(6, s + i * lds, lds, q + i * ldq, ldq, kt, mp, hd, scale); break;
#endif
    case 5: qk_rows(5, s + i * lds, lds, q + i * ldq, ldq, kt, mp, hd, scale); break;
    case 4: qk_rows(4, s + i * lds, lds, q + i * ldq, ldq, kt, mp, hd, scale); break;
    case 3: qk_rows(3, s + i * lds, lds, q + i * ldq, ldq, kt, mp, hd, scale); break;
    case 2: qk_rows(2, s + i * lds, lds, q + i * ldq, ldq, kt, mp, hd, scale); break;
    case 1: qk_rows(1, s + i * lds, lds, q + i * ldq, ldq, kt, mp, hd, scale); break;
    default: break;
    }
}

/* Output of R rows × NV vectors of head columns: o (+)= p · v over m keys. */
INLINE void pv_tile(int R, int NV, float *o, int64_t ldo, const float *p, int64_t ldp,
                    const float *v, int64_t ldv, int64_t m, int accumulate) {
    vf acc[PV_R][PV_NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            acc[r][c] = accumulate ? VLOAD(o + r * ldo + c * LANES) : VZERO();
    for (int64_t k = 0; k < m; k++) {
        vf b[PV_NV];
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            b[c] = VLOAD(v + k * ldv + c * LANES);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            vf a = VSET1(p[r * ldp + k]);
#pragma GCC unroll 4
            for (int c = 0; c < NV; c++)
                acc[r][c] = VFMA(a, b[c], acc[r][c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            VSTORE(o + r * ldo + c * LANES, acc[r][c]);
}

/* R rows of the output, every head column. */
INLINE void pv_rows(int R, float *o, int64_t ldo, const float *p, int64_t ldp, const float *v,
                    int64_t ldv, int64_t m, int64_t hd, int accumulate) {
    int64_t d = 0;
    for (; d + PV_NV * LANES <= hd; d += PV_NV * LANES)
        pv_tile(R, PV_NV, o + d, ldo, p, ldp, v + d, ldv, m, accumulate);
    for (; d + LANES <= hd; d += LANES)
        pv_tile(R, 1, o + d, ldo, p, ldp, v + d, ldv, m, accumulate);
    for (; d < hd; d++) /* under one vector: the scalar chain */
        for (int r = 0; r < R; r++) {
            float acc = accumulate ? o[r * ldo + d] : 0.0f;
            for (int64_t k = 0; k < m; k++)
                acc = fmaf(p[r * ldp + k], v[k * ldv + d], acc);
            o[r * ldo + d] = acc;
        }
}

static void att_pv(float *o, int64_t ldo, const float *p, int64_t ldp, const float *v, int64_t ldv,
                   int64_t n, int64_t m, int64_t hd, int accumulate) {
    int64_t i = 0;
    for (; i + PV_R <= n; i += PV_R)
        pv_rows(PV_R, o + i * ldo, ldo, p + i * ldp, ldp, v, ldv, m, hd, accumulate);
    switch (n - i) {
#if PV_R > 5
    case 5: pv_rows(5, o + i * ldo, ldo, p + i * ldp, ldp, v, ldv, m, hd, accumulate); break;
    case 4: pv_rows(4, o + i * ldo, ldo, p + i * ldp, ldp, v, ldv, m, hd, accumulate); break;
#endif
    case 3: pv_rows(3, o + i * ldo, ldo, p + i * ldp, ldp, v, ldv, m, hd, accumulate); break;
    case 2: pv_rows(2, o + i * ldo, ldo, p + i * ldp, ldp, v, ldv, m, hd, accumulate); break;
    case 1: pv_rows(1, o + i * ldo, ldo, p + i * ldp, ldp, v, ldv, m, hd, accumulate); break;
    default: break;
    }
}

/* ---- the keys, transposed ---------------------------------------------------------------- */

static void att_kt(float *kt, const float *k, int64_t m, int64_t mp, int64_t hd, int64_t ld) {
    int64_t c = 0, h8 = hd / 8 * 8;
    for (; c + 8 <= m; c += 8)
        for (int64_t p = 0; p < h8; p += 8)
            transpose8(kt + p * mp + c, mp, k + c * ld + p, ld);
    for (int64_t p = 0; p < hd; p++) { /* the rows and columns the 8 × 8 blocks left */
        float *row = kt + p * mp;
        for (int64_t cc = p < h8 ? c : 0; cc < m; cc++)
            row[cc] = k[cc * ld + p];
        for (int64_t cc = m; cc < mp; cc++)
            row[cc] = 0.0f;
    }
}

extern const ts_cpu_att_tiles_t VEC_CAT(ts_cpu_att_tiles_, TS_VEC_ISA);
const ts_cpu_att_tiles_t VEC_CAT(ts_cpu_att_tiles_,
                                 TS_VEC_ISA) = {.kt = att_kt, .qk = att_qk, .pv = att_pv};
