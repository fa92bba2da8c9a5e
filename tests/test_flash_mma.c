/*
 * test_flash_mma.c — the 16-bit flash attention's tile steps (kernels/flash_mma.h), run on the
 * CPU in the order kernels/cuda/cuda_flash.cu runs them, on an emulated warp, in bf16 and in f16
 * (g_f16: the type every step rounds to and the emulated mma widens from):
 *
 *   - the fragment maps of mma.m16n8k16 (A, B, C) each cover their matrix exactly once over the
 *     32 lanes, and an emulated mma of fragments built by them equals the plain product; the
 *     k16 product is two m16n8k8 (PTX's .f16 tables) on its registers' halves (sm_75's f16);
 *   - the kernels' ldmatrix loads (emulated from the PTX ISA) give those B fragments, from
 *     aligned addresses, without bank conflicts;
 *   - the whole attention, warp by warp (16 query rows, blocks of 32 keys, the quad reductions
 *     as loops), matches the attention computed in double from the bf16-rounded q, k and v —
 *     within the rounding of the weights e^(S − m) to bf16 — for the head sizes we ship (32, 64,
 *     72 padded to 80, 128) and 8, sequence lengths that are not multiples of the blocks (17, 49,
 *     100, 196, 256), and its log-sum-exp to 1e-5;
 *   - a sample's output does not depend on the batch (the same sequence alone and second of
 *     two gives the same bits);
 *   - the backward's two passes (dK, dV by key warps; dQ by query warps), added into a dqkv that
 *     starts non-zero, match the gradient in double on the bf16-rounded q, k, v and dO (NMSE
 *     ≤ 2e-5 per part in bf16, 5e-7 in f16; from the roundings of P and dS).
 * What only a GPU checks is the hardware's mma, ldmatrix and shuffles and the kernels' launch: the
 * `flash` case of test_cuda_parity, in scripts/gpu-check.sh.
 */
#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/flash_mma.h"

/* The 16-bit type of every step: 0 bf16, 1 f16 (the tests run both). */
static int g_f16;

/* When not NULL, the forward writes its output here in 16 bits too, and in fp32 where its out is
 * not NULL, as the kernel (test_rows_own). */
static uint16_t *g_out16;

static float half_of(uint32_t reg, int h) {
    return ts_lp_to_f32((uint16_t)(reg >> (16 * h)), g_f16);
}

/* d (per lane 4 floats) += A·B for one warp's fragments, the sum over k in order, fp32. */
static void emu_mma(float c[32][4], const uint32_t a[32][4], const uint32_t b[32][2]) {
    float A[16][16], B[16][8], D[16][8];
    for (int l = 0; l < 32; l++) {
        for (int i = 0; i < 8; i++)
            A[ts_fa_a_row(l, i)][ts_fa_a_col(l, i)] = half_of(a[l][i / 2], i % 2);
        for (int i = 0; i < 4; i++)
            B[ts_fa_b_k(l, i)][ts_fa_b_n(l)] = half_of(b[l][i / 2], i % 2);
        for (int r = 0; r < 4; r++)
            D[ts_fa_c_row(l, r)][ts_fa_c_col(l, r)] = c[l][r];
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float s = D[i][j];
            for (int k = 0; k < 16; k++)
                s += A[i][k] * B[k][j];
            D[i][j] = s;
        }
    for (int l = 0; l < 32; l++)
        for (int r = 0; r < 4; r++)
            c[l][r] = D[ts_fa_c_row(l, r)][ts_fa_c_col(l, r)];
}

/* Each map covers its matrix once; an mma of fragments equals the product of the matrices (in
 * either 16-bit type). */
static void check_fragments(void) {
    int a[16][16] = {{0}}, b[16][8] = {{0}}, c[16][8] = {{0}};
    for (int l = 0; l < 32; l++) {
        for (int i = 0; i < 8; i++)
            a[ts_fa_a_row(l, i)][ts_fa_a_col(l, i)]++;
        for (int i = 0; i < 4; i++)
            b[ts_fa_b_k(l, i)][ts_fa_b_n(l)]++;
        for (int r = 0; r < 4; r++)
            c[ts_fa_c_row(l, r)][ts_fa_c_col(l, r)]++;
    }
    /* a few entries of the PTX ISA's tables for m16n8k16 (.bf16), lane 5 (groupID 1, thread in
     * group 1) and lane 30 (7, 2): A a0 (1, 2), a3 (9, 3), a4 (1, 10), a7 (9, 11); B b0 k 2,
     * b3 k 11, n 1; C c1 (1, 3), c2 (9, 2) — so a permutation consistent with itself fails */
    assert_true(ts_fa_a_row(5, 0) == 1 && ts_fa_a_col(5, 0) == 2);
    assert_true(ts_fa_a_row(5, 3) == 9 && ts_fa_a_col(5, 3) == 3);
    assert_true(ts_fa_a_row(5, 4) == 1 && ts_fa_a_col(5, 4) == 10);
    assert_true(ts_fa_a_row(5, 7) == 9 && ts_fa_a_col(5, 7) == 11);
    assert_true(ts_fa_a_row(30, 6) == 15 && ts_fa_a_col(30, 6) == 12);
    assert_true(ts_fa_b_k(5, 0) == 2 && ts_fa_b_k(5, 3) == 11 && ts_fa_b_n(5) == 1);
    assert_true(ts_fa_b_k(30, 1) == 5 && ts_fa_b_n(30) == 7);
    assert_true(ts_fa_c_row(5, 1) == 1 && ts_fa_c_col(5, 1) == 3);
    assert_true(ts_fa_c_row(5, 2) == 9 && ts_fa_c_col(5, 2) == 2);
    assert_true(ts_fa_c_row(30, 3) == 15 && ts_fa_c_col(30, 3) == 5);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            assert_int_equal(a[i][j], 1);
            if (j < 8) {
                assert_int_equal(b[i][j], 1);
                assert_int_equal(c[i][j], 1);
            }
        }
    /* small integers: every product and sum exact in bf16 and fp32 */
    float A[16][16], B[16][8];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            A[i][j] = (float)((i * 7 + j * 3) % 11 - 5);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++)
            B[i][j] = (float)((i * 5 + j) % 9 - 4);
    uint32_t fa[32][4], fb[32][2];
    float fc[32][4];
    for (int l = 0; l < 32; l++) {
        for (int r = 0; r < 4; r++) {
            fa[l][r] = ts_fa_pack(A[ts_fa_a_row(l, 2 * r)][ts_fa_a_col(l, 2 * r)],
                                  A[ts_fa_a_row(l, 2 * r + 1)][ts_fa_a_col(l, 2 * r + 1)], g_f16);
            fc[l][r] = 1.0f;
        }
        for (int r = 0; r < 2; r++)
            fb[l][r] = ts_fa_pack(B[ts_fa_b_k(l, 2 * r)][ts_fa_b_n(l)],
                                  B[ts_fa_b_k(l, 2 * r + 1)][ts_fa_b_n(l)], g_f16);
    }
    emu_mma(fc, fa, fb);
    for (int l = 0; l < 32; l++)
        for (int r = 0; r < 4; r++) {
            int i = ts_fa_c_row(l, r), j = ts_fa_c_col(l, r);
            float want = 1.0f;
            for (int k = 0; k < 16; k++)
                want += A[i][k] * B[k][j];
            assert_true(fc[l][r] == want);
        }
}

static void test_fragments(void **state) {
    (void)state;
    for (g_f16 = 0; g_f16 < 2; g_f16++)
        check_fragments();
    g_f16 = 0;
}

/* sm_75's f16 product. PTX ISA, "Matrix fragments for mma.m16n8k8" (.f16): lane l (g = l / 4,
 * c = l % 4) holds A (16×8) in two registers, (g, 2c..2c+1) and (g+8, 2c..2c+1), and B (8×8) in
 * one, (k = 2c..2c+1, n = g). Fragments built that way from columns 0..7 and from 8..15 are, register
 * for register, the k16 fragments' registers 0, 1 (B: 0) and 2, 3 (B: 1): so cuda_flash.cu's two
 * k8 products on those halves, the second on the first's sums, are the k16 product. */
static void test_k8_halves(void **state) {
    (void)state;
    g_f16 = 1;
    float A[16][16], B[16][8];
    tu_rng_t rng = {21};
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            A[i][j] = tu_rng_uniform(&rng, -2.0f, 2.0f);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++)
            B[i][j] = tu_rng_uniform(&rng, -2.0f, 2.0f);
    for (int l = 0; l < 32; l++) {
        int g = l / 4, c = l % 4;
        for (int h = 0; h < 2; h++) { /* the k8 product on columns 8h..8h+7 */
            uint32_t a8[2], b8 = ts_fa_pack(B[8 * h + 2 * c][g], B[8 * h + 2 * c + 1][g], 1);
            for (int r = 0; r < 2; r++)
                a8[r] = ts_fa_pack(A[g + 8 * r][8 * h + 2 * c], A[g + 8 * r][8 * h + 2 * c + 1], 1);
            for (int r = 0; r < 2; r++) { /* the k16 register 2h + r, by flash_mma.h's maps */
                int i = 2 * (2 * h + r);
                uint32_t a16 = ts_fa_pack(A[ts_fa_a_row(l, i)][ts_fa_a_col(l, i)],
                                          A[ts_fa_a_row(l, i + 1)][ts_fa_a_col(l, i + 1)], 1);
                assert_true(a16 == a8[r]);
            }
            uint32_t b16 = ts_fa_pack(B[ts_fa_b_k(l, 2 * h)][ts_fa_b_n(l)],
                                      B[ts_fa_b_k(l, 2 * h + 1)][ts_fa_b_n(l)], 1);
            assert_true(b16 == b8);
        }
    }
    g_f16 = 0;
}

/* The B fragments' definition, element by element from the mma maps (ts_fa_b_k, ts_fa_b_n):
 * Kᵀ's for k-step ks of the head and n-tile nt of the keys, B[k][n] = K[8nt + n][16ks + k], and
 * V's for k-step ks of the keys and n-tile nt of the head, B[k][n] = V[16ks + k][8nt + n], from
 * a staged block (rows ld apart). What the kernels' ldmatrix loads are checked against. */
static void ref_k_frag(uint32_t b[2], const uint16_t *sk, int ld, int lane, int ks, int nt) {
    int key = 8 * nt + ts_fa_b_n(lane);
    for (int r = 0; r < 2; r++) {
        int k0 = 16 * ks + ts_fa_b_k(lane, 2 * r);
        b[r] = (uint32_t)sk[key * ld + k0] | (uint32_t)sk[key * ld + k0 + 1] << 16;
    }
}
static void ref_v_frag(uint32_t b[2], const uint16_t *sv, int ld, int lane, int ks, int nt) {
    int col = 8 * nt + ts_fa_b_n(lane);
    for (int r = 0; r < 2; r++) {
        int k0 = 16 * ks + ts_fa_b_k(lane, 2 * r);
        b[r] = (uint32_t)sv[k0 * ld + col] | (uint32_t)sv[(k0 + 1) * ld + col] << 16;
    }
}

/* ldmatrix.x4 (.trans when trans) on the emulated warp, from the PTX ISA's description: lanes
 * 8i .. 8i+7 give (off: element offsets into s) the rows of matrix i; lane l receives in register
 * i the matrix's (l/4, 2(l%4)) and (l/4, 2(l%4)+1), or transposed (2(l%4), l/4) and
 * (2(l%4)+1, l/4), the first in the lower half. */
static void emu_ldsm4(uint32_t r[32][4], const uint16_t *s, const int off[32], int trans) {
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            int g = l / 4, c = l % 4;
            const uint16_t *lo = s + off[8 * i + (trans ? 2 * c : g)];
            const uint16_t *hi = s + off[8 * i + (trans ? 2 * c + 1 : g)];
            uint16_t a = trans ? lo[g] : lo[2 * c], b = trans ? hi[g] : lo[2 * c + 1];
            r[l][i] = (uint32_t)a | (uint32_t)b << 16;
        }
}

/* The ldmatrix loads give the fragments' definition: for every head the kernels take (dp 16 ..
 * 128), every k-step and pair of n-tiles, each lane's registers equal ref_k_frag's and
 * ref_v_frag's for n-tiles 2np and 2np + 1; every row address is in the block and 16-byte
 * aligned; and each matrix's eight rows (one phase of the load) fall on 32 distinct banks at the
 * kernels' stride TS_FA_LDK. The emulated ldmatrix itself is held to the PTX ISA's layout (lane
 * 5 is row 1, columns 2 and 3; transposed, rows 2 and 3 of column 1). */
static void test_ldmatrix(void **state) {
    (void)state;
    static uint16_t sb[TS_FA_KB * TS_FA_LDK];
    for (int i = 0; i < TS_FA_KB * TS_FA_LDK; i++)
        sb[i] = (uint16_t)(i * 2654435761u >> 7);
    int off[32];
    uint32_t r[32][4];
    uint16_t m[64];
    for (int i = 0; i < 64; i++)
        m[i] = (uint16_t)i; /* an 8×8 matrix, (row, col) = 8 row + col */
    for (int l = 0; l < 32; l++)
        off[l] = 8 * (l % 8); /* all four matrices the same */
    emu_ldsm4(r, m, off, 0);
    assert_true(r[5][0] == (10u | 11u << 16) && r[5][3] == r[5][0]);
    emu_ldsm4(r, m, off, 1);
    assert_true(r[5][0] == (17u | 25u << 16));
    for (int dp = 16; dp <= TS_FA_DMAX; dp += 16)
        for (int kind = 0; kind < 2; kind++) { /* 0: Kᵀ (scores), 1: V (P·V) */
            int kss = kind ? TS_FA_KB / 16 : dp / 16, nps = kind ? dp / 16 : TS_FA_KB / 16;
            for (int ks = 0; ks < kss; ks++)
                for (int np = 0; np < nps; np++) {
                    for (int l = 0; l < 32; l++) {
                        off[l] = kind ? ts_fa_v_ldm(TS_FA_LDK, l, ks, np)
                                      : ts_fa_k_ldm(TS_FA_LDK, l, ks, np);
                        assert_true(off[l] >= 0 && off[l] + 8 <= TS_FA_KB * TS_FA_LDK);
                        assert_true(off[l] % 8 == 0); /* 16 bytes */
                    }
                    for (int i = 0; i < 4; i++) { /* one phase: 8 rows × 4 banks, all distinct */
                        int bank[32] = {0};
                        for (int j = 0; j < 8; j++)
                            for (int w = 0; w < 4; w++)
                                bank[(off[8 * i + j] / 2 + w) % 32]++;
                        for (int k = 0; k < 32; k++)
                            assert_int_equal(bank[k], 1);
                    }
                    emu_ldsm4(r, sb, off, kind);
                    for (int l = 0; l < 32; l++)
                        for (int t = 0; t < 2; t++) {
                            uint32_t want[2];
                            if (kind)
                                ref_v_frag(want, sb, TS_FA_LDK, l, ks, 2 * np + t);
                            else
                                ref_k_frag(want, sb, TS_FA_LDK, l, ks, 2 * np + t);
                            assert_true(r[l][2 * t] == want[0] && r[l][2 * t + 1] == want[1]);
                        }
                }
        }
}

/* The kernels' staging of a block (cuda_flash.cu's stage): groups of four columns by
 * ts_fa_stage4_at, each rounded by two ts_fa_pack and stored as the kernel's 8-byte store. */
static void emu_stage(uint16_t *dst, const float *src, int64_t ld, int n, int hd) {
    int dp = ts_fa_padded(hd);
    for (int e = 0; e < TS_FA_KB * dp / 4; e++) {
        int key, col;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (ts_fa_stage4_at(e, dp, n, hd, &key, &col))
            for (int x = 0; x < 4; x++)
                v[x] = src[(int64_t)key * ld + col + x];
        for (int x = 0; x < 2; x++) {
            uint32_t w = ts_fa_pack(v[2 * x], v[2 * x + 1], g_f16);
            dst[key * TS_FA_LDK + col + 2 * x] = (uint16_t)w;
            dst[key * TS_FA_LDK + col + 2 * x + 1] = (uint16_t)(w >> 16);
        }
    }
}

/* acc[lane] += a · B for every lane, B's fragments two n-tiles a load from the staged block sb:
 * cuda_flash.cu's mma_staged. trans 0: B = sbᵀ (ts_fa_k_ldm; 16 × TS_FA_KB from dp / 16
 * k-steps); 1: B = sb (ts_fa_v_ldm, transposed; 16 × dp from TS_FA_KB / 16 k-steps). */
static void emu_mma_staged(float (*const acc[32])[4], uint32_t (*const a[32])[4],
                           const uint16_t *sb, int dp, int trans) {
    uint32_t fa[32][4], r[32][4], fb[32][2];
    for (int ks = 0; ks < (trans ? TS_FA_KB : dp) / 16; ks++)
        for (int np = 0; np < (trans ? dp : TS_FA_KB) / 16; np++) {
            int off[32];
            for (int l = 0; l < 32; l++) {
                off[l] =
                    trans ? ts_fa_v_ldm(TS_FA_LDK, l, ks, np) : ts_fa_k_ldm(TS_FA_LDK, l, ks, np);
                memcpy(fa[l], a[l][ks], sizeof fa[l]);
            }
            emu_ldsm4(r, sb, off, trans);
            for (int t = 0; t < 2; t++) {
                float fc[32][4];
                for (int l = 0; l < 32; l++) {
                    fb[l][0] = r[l][2 * t], fb[l][1] = r[l][2 * t + 1];
                    memcpy(fc[l], acc[l][2 * np + t], sizeof fc[l]);
                }
                emu_mma(fc, fa, fb);
                for (int l = 0; l < 32; l++)
                    memcpy(acc[l][2 * np + t], fc[l], sizeof fc[l]);
            }
        }
}

/* out[lane] (16 × TS_FA_KB over n-tiles) = a (16 × dp, k-steps) · Bᵀ from sb: the scores. */
static void emu_scores(float out[32][TS_FA_KB / 8][4], uint32_t (*const a[32])[4],
                       const uint16_t *sb, int dp) {
    float(*acc[32])[4];
    memset(out, 0, sizeof(float[32][TS_FA_KB / 8][4]));
    for (int l = 0; l < 32; l++)
        acc[l] = out[l];
    emu_mma_staged(acc, a, sb, dp, 0);
}

/* acc[lane] (16 × dp over n-tiles) += pa (16 × TS_FA_KB, k-steps) · B from sb: P·V. */
static void emu_accumulate(float (*const acc[32])[4], uint32_t (*const pa[32])[4],
                           const uint16_t *sb, int dp) {
    emu_mma_staged(acc, pa, sb, dp, 1);
}

/* One warp's 16 rows from row0 of head h of sample b, as the kernel runs them. */
static void emu_warp(const float *qkv, float *out, float *lse, int T, int C, int H, int hd, int b,
                     int h, int row0) {
    static ts_fa_lane_t L[32];
    static uint16_t sk[TS_FA_KB * TS_FA_LDK], sv[TS_FA_KB * TS_FA_LDK];
    int64_t ld = 3 * (int64_t)C;
    int dp = ts_fa_padded(hd), rows = T - row0 < 16 ? T - row0 : 16;
    float scale = 1.0f / sqrtf((float)hd);
    const float *base = qkv + (int64_t)b * T * ld;
    static float sc[32][TS_FA_KB / 8][4];
    uint32_t(*q[32])[4], (*p[32])[4];
    float(*o[32])[4];
    for (int l = 0; l < 32; l++) {
        ts_fa_begin(&L[l]);
        ts_fa_load_q(&L[l], l, base + row0 * ld + h * hd, ld, rows, hd, g_f16);
        q[l] = L[l].q, p[l] = L[l].p, o[l] = L[l].o;
    }
    for (int k0 = 0; k0 < T; k0 += TS_FA_KB) {
        int n = T - k0 < TS_FA_KB ? T - k0 : TS_FA_KB;
        emu_stage(sk, base + k0 * ld + C + h * hd, ld, n, hd);
        emu_stage(sv, base + k0 * ld + 2 * C + h * hd, ld, n, hd);
        emu_scores(sc, q, sk, dp); /* S = Q·Kᵀ */
        for (int l = 0; l < 32; l++)
            memcpy(L[l].s, sc[l], sizeof sc[l]);
        float mx[32][2];
        for (int l = 0; l < 32; l++)
            ts_fa_scores(&L[l], l, n, scale, mx[l]);
        for (int l = 0; l < 32; l++) { /* the quad's max (shuffles by 1 and 2) */
            float bm[2];
            for (int hh = 0; hh < 2; hh++) {
                bm[hh] = mx[l & ~3][hh];
                for (int w = 1; w < 4; w++)
                    bm[hh] = fmaxf(bm[hh], mx[(l & ~3) + w][hh]);
            }
            ts_fa_softmax(&L[l], bm, dp, g_f16);
        }
        emu_accumulate(o, p, sv, dp); /* O += P·V */
    }
    for (int l = 0; l < 32; l++) { /* the quad's sums: (x + x^1) then + its ^2 partner's */
        float sum[2];
        for (int hh = 0; hh < 2; hh++) {
            int q0 = l & ~3;
            float s01 = L[q0].l[hh] + L[q0 + 1].l[hh], s23 = L[q0 + 2].l[hh] + L[q0 + 3].l[hh];
            sum[hh] = (l & 2) ? s23 + s01 : s01 + s23;
        }
        int64_t at = ((int64_t)b * T + row0) * C + h * hd;
        ts_fa_finish(&L[l], l, sum, out ? out + at : NULL, g_out16 ? g_out16 + at : NULL, C, rows,
                     hd, lse ? lse + ((int64_t)b * H + h) * T + row0 : NULL, g_f16);
    }
}

static void emu_attention(const float *qkv, float *out, float *lse, int B, int T, int C, int H) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int r0 = 0; r0 < T; r0 += TS_FA_ROWS)
                emu_warp(qkv, out, lse, T, C, H, C / H, b, h, r0);
}

/* x rounded to the 16-bit type of the steps. */
static float bf(float x) { return ts_lp_to_f32(ts_f32_to_lp(x, g_f16), g_f16); }

/* The emulated warps against the attention in double on 16-bit-rounded q, k, v. */
static void check_shape(int B, int T, int H, int hd, uint64_t seed) {
    int C = H * hd;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * H * T;
    float *qkv = malloc(nq * sizeof *qkv), *out = malloc(no * sizeof *out);
    float *lse = malloc(nl * sizeof *lse);
    double *s = malloc((size_t)T * sizeof *s);
    assert_non_null(qkv && out && lse && s);
    tu_rng_t r = {seed};
    for (size_t i = 0; i < nq; i++)
        qkv[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; i < no; i++)
        out[i] = NAN;
    emu_attention(qkv, out, lse, B, T, C, H);
    double scale = (double)(1.0f / sqrtf((float)hd)); /* the kernel's fp32 scale */
    double worst = 0.0, worst_lse = 0.0;
    int64_t ld = 3 * (int64_t)C;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((int64_t)b * T + i) * ld + h * hd;
                double m = -INFINITY, l = 0.0;
                for (int j = 0; j < T; j++) {
                    const float *k = qkv + ((int64_t)b * T + j) * ld + C + h * hd;
                    double d = 0.0;
                    for (int x = 0; x < hd; x++)
                        d += (double)bf(q[x]) * bf(k[x]);
                    s[j] = d * scale;
                    m = s[j] > m ? s[j] : m;
                }
                for (int j = 0; j < T; j++)
                    l += exp(s[j] - m);
                for (int x = 0; x < hd; x++) {
                    double o = 0.0;
                    for (int j = 0; j < T; j++)
                        o += exp(s[j] - m) / l *
                             bf(qkv[((int64_t)b * T + j) * ld + 2 * C + h * hd + x]);
                    double got = out[((int64_t)b * T + i) * C + h * hd + x];
                    double d = fabs(got - o);
                    worst = isnan(d) ? INFINITY : (d > worst ? d : worst);
                }
                double dl = fabs((double)lse[((int64_t)b * H + h) * T + i] - (m + log(l)));
                worst_lse = isnan(dl) ? INFINITY : (dl > worst_lse ? dl : worst_lse);
            }
    /* the weights rounded to bf16: 2⁻⁹ relative each, |v| ≤ 1; to f16: 2⁻¹² (seen: 7e-5) */
    double bound = g_f16 ? 2e-4 : 4e-3;
    if (worst > bound || worst_lse > 1e-4)
        fail_msg("%s B %d T %d H %d hd %d: worst |out − ref| %.3g (≤ %.0e), |lse − ref| %.3g (≤ "
                 "1e-4)",
                 g_f16 ? "f16" : "bf16", B, T, H, hd, worst, bound, worst_lse);
    if (getenv("TS_TEST_VERBOSE"))
        printf("%s B %d T %d H %d hd %d: worst %.3g lse %.3g\n", g_f16 ? "f16" : "bf16", B, T, H,
               hd, worst, worst_lse);
    free(qkv), free(out), free(lse), free(s);
}

static void test_attention(void **state) {
    (void)state;
    for (g_f16 = 0; g_f16 < 2; g_f16++) {
        check_shape(2, 196, 2, 64, 1); /* `small`: 196 tokens, 6 blocks of 32 and 4 left */
        check_shape(2, 49, 2, 32, 2);
        check_shape(1, 100, 2, 72, 3); /* DiT-XL's head, padded to 80 */
        check_shape(1, 256, 2, 128, 4);
        check_shape(3, 17, 1, 8, 5);
    }
    g_f16 = 0;
}

/* A sample's output is its own: the same 40-token sequence alone and as the second sample of a
 * batch of two gives the same bits (out and lse). */
static void test_rows_own(void **state) {
    (void)state;
    enum { T = 40, H = 2, HD = 64, C = H * HD };
    static float qkv[2 * T * 3 * C], out1[T * C], out2[2 * T * C], lse1[H * T], lse2[2 * H * T];
    tu_rng_t r = {9};
    for (size_t i = 0; i < sizeof qkv / sizeof *qkv; i++)
        qkv[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
    emu_attention(qkv + T * 3 * C, out1, lse1, 1, T, C, H);
    emu_attention(qkv, out2, lse2, 2, T, C, H);
    assert_memory_equal(out1, out2 + T * C, sizeof out1);
    assert_memory_equal(lse1, lse2 + H * T, sizeof lse1);
    /* written in 16 bits (proj's input), each type: the fp32 output rounded, element for element */
    static uint16_t o16[2 * T * C], both16[2 * T * C];
    static float both[2 * T * C];
    for (g_f16 = 0; g_f16 < 2; g_f16++) {
        emu_attention(qkv, out2, lse2, 2, T, C, H);
        g_out16 = o16;
        emu_attention(qkv, NULL, lse2, 2, T, C, H);
        g_out16 = both16; /* both outputs at once (training): the same two */
        emu_attention(qkv, both, lse2, 2, T, C, H);
        g_out16 = NULL;
        for (int i = 0; i < 2 * T * C; i++)
            if (o16[i] != ts_f32_to_lp(out2[i], g_f16))
                fail_msg("%s out16[%d] 0x%04x, the fp32 output rounded 0x%04x",
                         g_f16 ? "f16" : "bf16", i, o16[i], ts_f32_to_lp(out2[i], g_f16));
        assert_memory_equal(both, out2, sizeof both);
        assert_memory_equal(both16, o16, sizeof both16);
    }
    g_f16 = 0;
}

/* ---- the backward ------------------------------------------------------------------------ */

typedef struct {
    const float *qkv, *lse, *dout;
    const float *d; /* D (B, H, T): the D pass's, ts_fa_delta */
    float *dqkv;
    uint16_t *dqkv16; /* the kernels' 16-bit copy of dqkv as it ends */
    int T, C, H, hd;
} grad_job_t;

/* The dK, dV pass for the warp's 16 keys from key0 of head h of sample b. */
static void emu_kv_warp(const grad_job_t *j, int b, int h, int key0) {
    static ts_fa_grad_lane_t G[32];
    static uint16_t sq[TS_FA_KB * TS_FA_LDK], sd[TS_FA_KB * TS_FA_LDK];
    static float s[32][TS_FA_KB / 8][4];
    float lse_col[TS_FA_KB], d_col[TS_FA_KB];
    int T = j->T, C = j->C, hd = j->hd, dp = ts_fa_padded(hd);
    int64_t ld = 3 * (int64_t)C;
    int rows = T - key0 < 16 ? T - key0 : 16;
    float scale = 1.0f / sqrtf((float)hd);
    const float *base = j->qkv + (int64_t)b * T * ld;
    const float *dob = j->dout + (int64_t)b * T * C;
    uint32_t(*a[32])[4], (*v[32])[4], (*pa[32])[4];
    float(*dk[32])[4], (*dv[32])[4];
    for (int l = 0; l < 32; l++) {
        ts_fa_grad_begin(&G[l]);
        ts_fa_load_a(G[l].a, l, base + key0 * ld + C + h * hd, ld, rows, hd, g_f16);
        ts_fa_load_a(G[l].b, l, base + key0 * ld + 2 * C + h * hd, ld, rows, hd, g_f16);
        a[l] = G[l].a, v[l] = G[l].b, pa[l] = G[l].pa, dk[l] = G[l].acc0, dv[l] = G[l].acc1;
    }
    for (int q0 = 0; q0 < T; q0 += TS_FA_KB) {
        int n = T - q0 < TS_FA_KB ? T - q0 : TS_FA_KB;
        emu_stage(sq, base + q0 * ld + h * hd, ld, n, hd);
        emu_stage(sd, dob + q0 * C + h * hd, C, n, hd);
        for (int i = 0; i < n; i++) {
            lse_col[i] = j->lse[((int64_t)b * j->H + h) * T + q0 + i];
            d_col[i] = j->d[((int64_t)b * j->H + h) * T + q0 + i];
        }
        emu_scores(s, a, sq, dp); /* Sᵀ = K·Qᵀ */
        for (int l = 0; l < 32; l++) {
            memcpy(G[l].s, s[l], sizeof s[l]);
            ts_fa_probs(&G[l], l, n, scale, NULL, lse_col, g_f16);
        }
        emu_accumulate(dv, pa, sd, dp); /* dV += Pᵀ·dO */
        emu_scores(s, v, sd, dp);       /* dPᵀ = V·dOᵀ */
        for (int l = 0; l < 32; l++) {
            memcpy(G[l].dp, s[l], sizeof s[l]);
            ts_fa_dscores(&G[l], l, n, NULL, d_col, g_f16);
        }
        emu_accumulate(dk, pa, sq, dp); /* dK += dSᵀ·Q */
    }
    int64_t at = ((int64_t)b * T + key0) * ld + h * hd;
    float *dst = j->dqkv + at;
    uint16_t *d16 = j->dqkv16 + at;
    for (int l = 0; l < 32; l++) {
        ts_fa_add_rows(G[l].acc0, l, dst + C, d16 + C, ld, rows, hd, scale, g_f16);
        ts_fa_add_rows(G[l].acc1, l, dst + 2 * C, d16 + 2 * C, ld, rows, hd, 1.0f, g_f16);
    }
}

/* The dQ pass for the warp's 16 queries from row0 of head h of sample b. */
static void emu_q_warp(const grad_job_t *j, int b, int h, int row0) {
    static ts_fa_grad_lane_t G[32];
    static uint16_t sk[TS_FA_KB * TS_FA_LDK], sv[TS_FA_KB * TS_FA_LDK];
    static float s[32][TS_FA_KB / 8][4];
    int T = j->T, C = j->C, hd = j->hd, dp = ts_fa_padded(hd);
    int64_t ld = 3 * (int64_t)C;
    int rows = T - row0 < 16 ? T - row0 : 16;
    float scale = 1.0f / sqrtf((float)hd);
    const float *base = j->qkv + (int64_t)b * T * ld;
    const float *dob = j->dout + ((int64_t)b * T + row0) * C + h * hd;
    int64_t rows_at = ((int64_t)b * j->H + h) * T + row0;
    uint32_t(*q[32])[4], (*dov[32])[4], (*pa[32])[4];
    float(*dq[32])[4];
    for (int l = 0; l < 32; l++) {
        ts_fa_grad_begin(&G[l]);
        ts_fa_load_a(G[l].a, l, base + row0 * ld + h * hd, ld, rows, hd, g_f16);
        ts_fa_load_a(G[l].b, l, dob, C, rows, hd, g_f16);
        ts_fa_row_stats(&G[l], l, j->lse + rows_at, j->d + rows_at, rows);
        q[l] = G[l].a, dov[l] = G[l].b, pa[l] = G[l].pa, dq[l] = G[l].acc0;
    }
    for (int k0 = 0; k0 < T; k0 += TS_FA_KB) {
        int n = T - k0 < TS_FA_KB ? T - k0 : TS_FA_KB;
        emu_stage(sk, base + k0 * ld + C + h * hd, ld, n, hd);
        emu_stage(sv, base + k0 * ld + 2 * C + h * hd, ld, n, hd);
        emu_scores(s, q, sk, dp); /* S = Q·Kᵀ */
        for (int l = 0; l < 32; l++) {
            memcpy(G[l].s, s[l], sizeof s[l]);
            ts_fa_probs(&G[l], l, n, scale, G[l].ra, NULL, g_f16);
        }
        emu_scores(s, dov, sv, dp); /* dP = dO·Vᵀ */
        for (int l = 0; l < 32; l++) {
            memcpy(G[l].dp, s[l], sizeof s[l]);
            ts_fa_dscores(&G[l], l, n, G[l].rb, NULL, g_f16);
        }
        emu_accumulate(dq, pa, sk, dp); /* dQ += dS·K */
    }
    int64_t at = ((int64_t)b * T + row0) * ld + h * hd;
    for (int l = 0; l < 32; l++)
        ts_fa_add_rows(G[l].acc0, l, j->dqkv + at, j->dqkv16 + at, ld, rows, hd, scale, g_f16);
}

/* The backward on an emulated GPU against the gradient in double on the 16-bit-rounded q, k, v and
 * dO (from the double forward's out, lse and D), added into a dqkv that starts non-zero. */
static void check_backward(int B, int T, int H, int hd, uint64_t seed) {
    int C = H * hd;
    int64_t ld = 3 * (int64_t)C;
    size_t nq = (size_t)B * T * ld, no = (size_t)B * T * C, nl = (size_t)B * H * T;
    float *qkv = malloc(nq * sizeof *qkv), *out = malloc(no * sizeof *out);
    float *lse = malloc(nl * sizeof *lse), *dout = malloc(no * sizeof *dout);
    float *dqkv = malloc(nq * sizeof *dqkv), *start = malloc(nq * sizeof *start);
    double *P = malloc((size_t)T * T * sizeof *P), *dS = malloc((size_t)T * T * sizeof *dS);
    double *want = malloc(nq * sizeof *want);
    uint16_t *dqkv16 = malloc(nq * sizeof *dqkv16);
    assert_non_null(qkv && out && lse && dout && dqkv && start && P && dS && want && dqkv16);
    memset(dqkv16, 0xff, nq * sizeof *dqkv16); /* (NaN: every element must be written) */
    tu_rng_t r = {seed};
    for (size_t i = 0; i < nq; i++) {
        qkv[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
        start[i] = dqkv[i] = tu_rng_uniform(&r, -0.5f, 0.5f);
        want[i] = start[i];
    }
    for (size_t i = 0; i < no; i++)
        dout[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
    double scale = (double)(1.0f / sqrtf((float)hd));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
#define Q_(i, x) ((double)bf(qkv[((int64_t)b * T + (i)) * ld + h * hd + (x)]))
#define K_(i, x) ((double)bf(qkv[((int64_t)b * T + (i)) * ld + C + h * hd + (x)]))
#define V_(i, x) ((double)bf(qkv[((int64_t)b * T + (i)) * ld + 2 * C + h * hd + (x)]))
#define DO_(i, x) ((double)bf(dout[((int64_t)b * T + (i)) * C + h * hd + (x)]))
            for (int i = 0; i < T; i++) { /* the forward in double: P, out and lse */
                double m = -INFINITY, l = 0.0;
                for (int k = 0; k < T; k++) {
                    double d = 0.0;
                    for (int x = 0; x < hd; x++)
                        d += Q_(i, x) * K_(k, x);
                    P[i * T + k] = d * scale;
                    m = P[i * T + k] > m ? P[i * T + k] : m;
                }
                for (int k = 0; k < T; k++)
                    l += exp(P[i * T + k] - m);
                for (int k = 0; k < T; k++)
                    P[i * T + k] = exp(P[i * T + k] - m) / l;
                lse[((int64_t)b * H + h) * T + i] = (float)(m + log(l));
                for (int x = 0; x < hd; x++) {
                    double o = 0.0;
                    for (int k = 0; k < T; k++)
                        o += P[i * T + k] * V_(k, x);
                    out[((int64_t)b * T + i) * C + h * hd + x] = (float)o;
                }
            }
            for (int i = 0; i < T; i++) { /* dS = P ∘ (dO·Vᵀ − D) */
                double D = 0.0;
                for (int x = 0; x < hd; x++)
                    D += (double)dout[((int64_t)b * T + i) * C + h * hd + x] *
                         out[((int64_t)b * T + i) * C + h * hd + x];
                for (int k = 0; k < T; k++) {
                    double dp = 0.0;
                    for (int x = 0; x < hd; x++)
                        dp += DO_(i, x) * V_(k, x);
                    dS[i * T + k] = P[i * T + k] * (dp - D);
                }
            }
            for (int i = 0; i < T; i++)
                for (int x = 0; x < hd; x++) {
                    double dq = 0.0, dk = 0.0, dv = 0.0;
                    for (int k = 0; k < T; k++) {
                        dq += dS[i * T + k] * K_(k, x);
                        dk += dS[k * T + i] * Q_(k, x);
                        dv += P[k * T + i] * DO_(k, x);
                    }
                    int64_t at = ((int64_t)b * T + i) * ld + h * hd + x;
                    want[at] += dq * scale;
                    want[at + C] += dk * scale;
                    want[at + 2 * C] += dv;
                }
#undef Q_
#undef K_
#undef V_
#undef DO_
        }
    /* the D pass first (its elements independent: the order the kernel's threads take them in
     * does not matter), then both passes read it */
    float *d = malloc(nl * sizeof *d);
    assert_non_null(d);
    for (int64_t i = 0; i < (int64_t)nl; i++)
        ts_fa_delta(d, dout, out, T, C, H, hd, i);
    grad_job_t j = {qkv, lse, dout, d, dqkv, dqkv16, T, C, H, hd};
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int r0 = 0; r0 < T; r0 += TS_FA_ROWS) {
                emu_kv_warp(&j, b, h, r0);
                emu_q_warp(&j, b, h, r0);
            }
    /* per part (q, k, v): the NMSE of the gradient (dqkv − its start) against the double one */
    for (int part = 0; part < 3; part++) {
        double num = 0.0, den = 0.0;
        for (size_t i = 0; i < nq; i++) {
            if ((int64_t)(i % (size_t)ld) / C != part)
                continue;
            double g = (double)dqkv[i] - start[i], w = want[i] - start[i];
            num += (g - w) * (g - w);
            den += w * w;
        }
        double nmse = num / den;
        /* ~3e-6 from the bf16 roundings of P and dS (f16: ~5e-8); a D 10 % off gives 2e-4 */
        double bound = g_f16 ? 5e-7 : 2e-5;
        if (!(nmse <= bound))
            fail_msg("%s backward B %d T %d H %d hd %d: d%c nmse %.3g (≤ %.0e)",
                     g_f16 ? "f16" : "bf16", B, T, H, hd, "qkv"[part], nmse, bound);
        if (getenv("TS_TEST_VERBOSE"))
            printf("%s backward B %d T %d H %d hd %d: d%c nmse %.3g\n", g_f16 ? "f16" : "bf16", B,
                   T, H, hd, "qkv"[part], nmse);
    }
    /* the 16-bit copy: every element of dqkv as it ended, rounded */
    for (size_t i = 0; i < nq; i++)
        if (dqkv16[i] != ts_f32_to_lp(dqkv[i], g_f16))
            fail_msg("%s backward: dqkv16[%zu] 0x%04x is not dqkv %.9g rounded (0x%04x)",
                     g_f16 ? "f16" : "bf16", i, dqkv16[i], dqkv[i], ts_f32_to_lp(dqkv[i], g_f16));
    free(qkv), free(out), free(lse), free(dout), free(dqkv), free(start), free(P), free(dS);
    free(want), free(dqkv16), free(d);
}

static void test_backward(void **state) {
    (void)state;
    for (g_f16 = 0; g_f16 < 2; g_f16++) {
        check_backward(2, 49, 2, 32, 11);
        check_backward(1, 100, 2, 64, 12);
        check_backward(1, 70, 2, 72, 13);
        check_backward(1, 40, 1, 128, 14);
        check_backward(2, 17, 1, 8, 15);
    }
    g_f16 = 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fragments), cmocka_unit_test(test_k8_halves),
        cmocka_unit_test(test_ldmatrix),  cmocka_unit_test(test_attention),
        cmocka_unit_test(test_rows_own),  cmocka_unit_test(test_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
