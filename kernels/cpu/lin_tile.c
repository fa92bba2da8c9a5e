/*
 * lin_tile.c — a linear layer's forward product, out = inp · weightᵀ + bias (then GELU), in
 * AVX-512 or AVX2 register tiles (kernels/cpu/vec.h: lin), compiled once per instruction set
 * beside vec.c.
 *
 * Why not OpenBLAS. OpenBLAS packs both operands of every call (the activations once per call,
 * 7 % of `small`'s forward at batch 64) and clears C before its product for beta 0 (4 %), and the
 * bias and GELU then take another pass over C. Here the weight is packed once per call into
 * panels of PANEL columns (cpu_gemm.c shares the panels among the threads; a product of a few rows
 * packs nothing, lin_direct below), the activations are read where they lie, and the bias and
 * GELU are applied to each tile right after its product, while it is in registers and L1. On 2
 * threads `small`'s linears at batch 64 ran at 103–108 % of the 2048³ sgemm peak against
 * OpenBLAS's 87–99 % (`bench_gemm --config small`, docs/benchmarks.md).
 *
 * The bits. Every output is one chain of fused multiply-adds over k in order from 0, then the
 * bias added (one rounding, as ts_add_bcast_forward), then GELU as kernels/math.h's ts_gelu: what
 * the scalar loop `acc = fmaf(a[k], w[k], acc)` computes. So both builds give the same bits, and a
 * row's result does not depend on the other rows of the call, the batch, the threads or how the
 * work is cut: the forward is batch invariant on any CPU with FMA. (The base build has no FMA and
 * no table entry: OpenBLAS there.) tests/test_cpu_vec.c checks each build against the scalar chain
 * with memcmp.
 *
 * Tiles: k in passes of LIN_KC (below); R rows × 2 vectors of columns in registers (AVX-512:
 * 8 × 32 columns, 16 accumulators; AVX2: 6 × 16, 12); per k the panel's row (2 vectors,
 * contiguous) is loaded once and each row's element broadcast. Row tails take a smaller R; the last panel's columns past the weight's rows
 * are zero in the packing and are computed into a scratch tile, of which only the real columns
 * are written.
 */
#include "kernels/cpu/vec.h"

#include "kernels/math.h"

#ifndef TS_VEC_ISA
#error "lin_tile.c is built with -DTS_VEC_ISA=avx512|avx2 (kernels/CMakeLists.txt)"
#endif

#include "kernels/cpu/tile.h"

#if LANES == 16
#define LIN_R 8
#else
#define LIN_R 6
#endif
#define LIN_NV 2
#define PANEL (LIN_NV * LANES)
/* k per pass: a tile's rows of a (R × LIN_KC) and its panel rows (LIN_KC × PANEL) stay in L1/L2
 * for any K; a longer chain goes on in the next pass from the partial sums left in c, stored and
 * reloaded as floats, so the pass boundary changes no bit. */
#define LIN_KC 512

/* Panels lo..hi of w (n, K): panel p holds w's rows [p·PANEL, p·PANEL + PANEL) as K rows of PANEL
 * floats (row k: those rows' element k), at packed + p·PANEL·K; rows past n give zeros. */
static void lin_pack(float *packed, const float *w, int64_t n, int64_t K, int64_t lo, int64_t hi) {
    int64_t K8 = K / 8 * 8;
    for (int64_t p = lo; p < hi; p++) {
        float *pp = packed + p * PANEL * K;
        int64_t c0 = p * PANEL, width = n - c0 < PANEL ? n - c0 : PANEL;
        int64_t c = 0;
        for (; c + 8 <= width; c += 8)
            for (int64_t k = 0; k < K8; k += 8)
                transpose8(pp + k * PANEL + c, PANEL, w + (c0 + c) * K + k, K);
        for (int64_t cc = 0; cc < PANEL; cc++) /* what the 8 × 8 blocks left, and the zeros */
            for (int64_t k = cc < c ? K8 : 0; k < K; k++)
                pp[k * PANEL + cc] = cc < width ? w[(c0 + cc) * K + k] : 0.0f;
    }
}

/* act = gelu(c) over one tile row of `width` columns; act == c in place */
INLINE void gelu_row(float *act, const float *c, int64_t width) {
    for (int64_t i = 0; i < width; i++)
        act[i] = ts_gelu(c[i]);
}

/* R rows × one panel, k over one pass of kn: acc = (first ? 0 : c) + a (R, kn; row stride lda) ·
 * panel, then c (row stride ldc) = acc + bias when last (and act as lin_forward), else the partial
 * acc; `width` of the panel's columns are written (PANEL but in the last panel). */
INLINE void lin_tile(int R, float *c, float *act, int64_t ldc, const float *a, int64_t lda,
                     const float *panel, const float *bias, int64_t kn, int64_t width, int first,
                     int last) {
    vf acc[LIN_R][LIN_NV];
    float t[LIN_R * PANEL]; /* the last panel's tile, when it is narrower */
    if (!first && width < PANEL)
        for (int r = 0; r < R; r++)
            for (int64_t i = 0; i < PANEL; i++)
                t[r * PANEL + i] = i < width ? c[r * ldc + i] : 0.0f;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < LIN_NV; v++)
            acc[r][v] = first            ? VZERO()
                        : width == PANEL ? VLOAD(c + r * ldc + v * LANES)
                                         : VLOAD(t + r * PANEL + v * LANES);
    for (int64_t k = 0; k < kn; k++) {
        vf b[LIN_NV];
#pragma GCC unroll 2
        for (int v = 0; v < LIN_NV; v++)
            b[v] = VLOAD(panel + k * PANEL + v * LANES);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            vf x = VSET1(a[r * lda + k]);
#pragma GCC unroll 2
            for (int v = 0; v < LIN_NV; v++)
                acc[r][v] = VFMA(x, b[v], acc[r][v]);
        }
    }
    if (!last)
        bias = NULL;
    if (width == PANEL) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 2
            for (int v = 0; v < LIN_NV; v++)
                VSTORE(c + r * ldc + v * LANES,
                       bias ? VADD(acc[r][v], VLOAD(bias + v * LANES)) : acc[r][v]);
    } else { /* the last panel: through scratch, its real columns only */
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 2
            for (int v = 0; v < LIN_NV; v++)
                VSTORE(t + r * PANEL + v * LANES, acc[r][v]);
        for (int r = 0; r < R; r++)
            for (int64_t i = 0; i < width; i++)
                c[r * ldc + i] = bias ? t[r * PANEL + i] + bias[i] : t[r * PANEL + i];
    }
    if (act && last)
        for (int r = 0; r < R; r++)
            gelu_row(act + r * ldc, c + r * ldc, width);
}

/* One pass (k from k0, kn of them) of R rows × panel p (the panel stays in cache while the rows
 * pass over it; the rows, a block the caller keeps small, in L2). */
typedef struct {
    float *c, *act;
    int64_t ldc, lda, n, K, k0, kn;
    const float *a, *packed, *bias;
    int first, last;
} lin_pass_t;

INLINE void lin_rows(int R, const lin_pass_t *s, int64_t i, int64_t p) {
    int64_t c0 = p * PANEL, width = s->n - c0 < PANEL ? s->n - c0 : PANEL;
    lin_tile(R, s->c + i * s->ldc + c0, s->act ? s->act + i * s->ldc + c0 : NULL, s->ldc,
             s->a + i * s->lda + s->k0, s->lda, s->packed + p * PANEL * s->K + s->k0 * PANEL,
             s->bias ? s->bias + c0 : NULL, s->kn, width, s->first, s->last);
}

static void lin_forward(float *c, float *act, int64_t ldc, const float *a, int64_t lda,
                        const float *packed, const float *bias, int64_t m, int64_t n, int64_t K,
                        int64_t lo, int64_t hi) {
    lin_pass_t s = {.c = c,
                    .act = act,
                    .ldc = ldc,
                    .lda = lda,
                    .n = n,
                    .K = K,
                    .a = a,
                    .packed = packed,
                    .bias = bias};
    for (s.k0 = 0;; s.k0 += LIN_KC) { /* at least one pass: K = 0 gives the bias */
        s.kn = K - s.k0 < LIN_KC ? K - s.k0 : LIN_KC;
        s.first = s.k0 == 0;
        s.last = s.k0 + s.kn >= K;
        for (int64_t p = lo; p < hi; p++) {
            int64_t i = 0;
            for (; i + LIN_R <= m; i += LIN_R)
                lin_rows(LIN_R, &s, i, p);
            switch (m - i) { /* each tail size its own unrolled tile */
#if LIN_R > 7
            case 7: lin_rows(7, &s, i, p); break;
            case 6: lin_rows(6, &s, i, p); break;
#endif
            case 5: lin_rows(5, &s, i, p); break;
            case 4: lin_rows(4, &s, i, p); break;
            case 3: lin_rows(3, &s, i, p); break;
            case 2: lin_rows(2, &s, i, p); break;
            case 1: lin_rows(1, &s, i, p); break;
            default: break;
            }
        }
        if (s.last)
            break;
    }
}

/* ---- a few rows: the weight read where it lies -------------------------------------------- */

/* Rows 0..m (m ≤ LIN_DIRECT_ROWS) and columns [j0, j1) of c, as lin_forward but without the
 * packing: each block of 8 of w's rows is transposed 8 × 8 at a time into L1 scratch as it is
 * used (256-bit vectors, both builds), so the weight is read once and written nowhere — with a
 * row or two (a small batch's adaLN), the packing's extra passes over the weight were most of the
 * product. The same chains, so the same bits as lin_forward. */
static void lin_direct(float *c, float *act, int64_t ldc, const float *a, int64_t lda,
                       const float *w, const float *bias, int64_t m, int64_t K, int64_t j0,
                       int64_t j1) {
    int64_t K8 = K / 8 * 8;
    float t[64];
    for (int64_t n0 = j0; n0 < j1; n0 += 8) {
        int64_t width = j1 - n0 < 8 ? j1 - n0 : 8;
        __m256 acc[LIN_DIRECT_ROWS];
        for (int64_t i = 0; i < m; i++)
            acc[i] = _mm256_setzero_ps();
        for (int64_t k0 = 0; k0 < K; k0 += 8) {
            int64_t kn = k0 < K8 ? 8 : K - k0;
            if (width == 8 && kn == 8)
                transpose8(t, 8, w + n0 * K + k0, K);
            else /* a block at the edge: zeros past the weight's rows */
                for (int64_t kk = 0; kk < kn; kk++)
                    for (int64_t nn = 0; nn < 8; nn++)
                        t[kk * 8 + nn] = nn < width ? w[(n0 + nn) * K + k0 + kk] : 0.0f;
            for (int64_t kk = 0; kk < kn; kk++) {
                __m256 b = _mm256_loadu_ps(t + kk * 8);
                for (int64_t i = 0; i < m; i++)
                    acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(a[i * lda + k0 + kk]), b, acc[i]);
            }
        }
        for (int64_t i = 0; i < m; i++) {
            float r[8], *ci = c + i * ldc + n0;
            _mm256_storeu_ps(r, acc[i]);
            for (int64_t nn = 0; nn < width; nn++)
                ci[nn] = bias ? r[nn] + bias[n0 + nn] : r[nn];
            if (act)
                gelu_row(act + i * ldc + n0, ci, width);
        }
    }
}

extern const ts_cpu_lin_tiles_t VEC_CAT(ts_cpu_lin_tiles_, TS_VEC_ISA);
const ts_cpu_lin_tiles_t VEC_CAT(ts_cpu_lin_tiles_, TS_VEC_ISA) = {
    .panel = PANEL, .pack = lin_pack, .forward = lin_forward, .direct = lin_direct};
