/*
 * cpu_attention.c — fused (flash-style) self-attention on the CPU: the forward and the backward,
 * each in fp32 and in bf16 (ts_cpu_attention_fused_* of kernels/backend.h).
 *
 * What it is. The composed attention of kernels/ops.c writes the (B, heads, T, T) softmax
 * weights to memory, reads them back for the second product and keeps them for the backward.
 * Here a task takes one block of BQ queries of one head of one sample and walks the keys in
 * blocks of BK: the block's scores S = scale · Q Kᵀ (BQ × BK, in per-task scratch), an online
 * softmax (each row's running max m and sum l; when a later block raises the max, the sum and
 * the output so far are rescaled by e^(m_old − m_new)), and O += P V. At the end O is divided by
 * l and the row's log-sum-exp m + ln l is saved. No T × T matrix exists anywhere.
 *
 * The backward is FlashAttention-2's: with O and the log-sum-exp of the forward, a task (one head
 * of one sample) takes D = rowsum(dO ∘ O) per query block, then per block of keys recomputes
 * P = e^(S − lse) and accumulates dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D), dQ += scale · dS K,
 * dK += scale · dSᵀ Q. Its tasks are whole heads, not query blocks: every query block adds into
 * the same dK and dV rows, and a head per task keeps those sums in one fixed order.
 *
 * Products. fp32 forward: the block-product tiles of kernels/cpu/att_tile.c (AVX2 or AVX-512
 * registers, one FMA chain per output; a task range transposes a head's keys once for the tasks
 * that share them), or single-threaded OpenBLAS on the blocks in the base build; fp32 backward:
 * single-threaded OpenBLAS (the pool owns the cores, as in cpu_gemm.c). bf16: a kernel of AVX-512 BF16 dot products (vdpbf16ps: two bf16 products added to
 * an fp32 lane), q, k, v and the unnormalised weights e^(S − m) rounded to bf16 (nearest even, the
 * CPU's vcvtneps2bf16 as in cpu_bf16.c), fp32 accumulation, the softmax in fp32. It runs where the
 * CPU has AVX-512 BF16 (checked once, at run time) and the compiler knows the instructions;
 * elsewhere it answers TS_ENOTSUP and the caller keeps the composed bf16 path. The bf16 backward
 * is the fp32 one's algorithm with its five products so (q, k, v, dO, P and dS rounded to bf16;
 * D, the recomputed softmax, dS and the sums into dqkv in fp32); its operands are packed per head
 * and key block into the layouts that kernel reads (Pᵀ and dSᵀ transposed through fp32 scratch).
 *
 * Invariants. A task reads only its own head's q, k, v and writes only its own rows of out and
 * lse (forward) or its own head's columns of dqkv (backward); its products have shapes that
 * depend on T and the head size alone. So a row's result does not depend on the batch, on the
 * thread count or on which thread ran it, on any BLAS. Scratch is per task range (malloc'd once
 * per range, not per task); a range that cannot get it flags the job, and the op says TS_ENOMEM.
 *
 * NaN: a NaN anywhere in a head's q, k or v reaches every output row it touches (a NaN key row
 * makes every row of its head NaN), as through the composed ops: the row max skips NaN, e^NaN is
 * NaN and it spreads through the sums and products.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/row_max.h"
#include "kernels/cpu/vec.h"
#include "kernels/math.h"

/* Queries per forward task, and keys per block of scores. With the DiT presets' 49 to 256 tokens
 * a head's keys are one block (no rescaling), and the scores of a task are at most 64 KB. */
#define BQ 64
#define BK 256

typedef struct {
    float *out, *lse, *dqkv;              /* the outputs: forward (lse may be NULL), backward */
    uint16_t *out16; /* the bf16 forward's output in bf16 too (out then may be NULL), or NULL */
    const float *qkv, *dout, *o, *lse_in; /* the backward's inputs beside qkv */
    int64_t B, T, C, H, hd, nq;           /* nq: query blocks per head */
    float scale;
    const ts_cpu_vec_t *vec; /* the exponentials, at the CPU's vector width (kernels/cpu/vec.h) */
    int failed;              /* a task range found no scratch */
} att_job_t;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Runs fn over the job's tasks on the pool; all of them on the caller when the whole op is below
 * ~64k multiply-adds (work), where a woken thread costs more than it saves. */
static int att_run(ts_engine_t *e, att_job_t *j, int64_t tasks, double work, ts_pool_fn fn) {
    ts_pool_for(e->pool, tasks, work < 65536.0 ? INT64_MAX : 1, fn, j);
    return j->failed ? TS_ENOMEM : TS_OK;
}

/* ---- the online softmax, shared by both forwards ------------------------------------------- */

/* One block of scores s (n, m), row stride lds, becomes e^(s − m_new) in place, and the rows'
 * running max mx and sum l take it in. first: the row's first block. Returns, per row, in
 * alpha, the factor e^(m_old − m_new) by which the output so far must be rescaled (1 when the
 * max did not move; unused for a first block). */
static void online_softmax(const ts_cpu_vec_t *vec, float *s, int64_t n, int64_t m, int64_t lds,
                           float *mx, float *l, float *alpha, int first) {
    for (int64_t i = 0; i < n; i++) {
        float *si = s + i * lds;
        float bm = ts_row_max(si, m);
        float mn = first || bm > mx[i] ? bm : mx[i];
        float a = first ? 0.0f : ts_expf(mx[i] - mn);
        float rs = vec->exp_sum(si, m, mn);
        l[i] = first ? rs : l[i] * a + rs;
        mx[i] = mn;
        alpha[i] = a;
    }
}

/* The end of a row block: o (n, hd), row stride ldo, divided by l; lse = m + ln l (may be NULL). */
static void finish_rows(float *o, int64_t n, int64_t hd, int64_t ldo, const float *mx,
                        const float *l, float *lse) {
    for (int64_t i = 0; i < n; i++) {
        float inv = 1.0f / l[i];
        for (int64_t d = 0; d < hd; d++)
            o[i * ldo + d] *= inv;
        if (lse)
            lse[i] = mx[i] + logf(l[i]);
    }
}

/* Task t of a forward: its sample, head and first query row. */
static void task_of(const att_job_t *j, int64_t t, int64_t *b, int64_t *h, int64_t *r0) {
    *b = t / (j->H * j->nq);
    *h = t / j->nq % j->H;
    *r0 = t % j->nq * BQ;
}

/* ---- fp32 forward ---------------------------------------------------------------------------- */

/* A forward task range's scratch: the scores, and (with the block-product tiles) the keys of the
 * last head and key block transposed, kept while consecutive tasks share them. */
typedef struct {
    float *s;        /* (BQ, BK) */
    float *kt;       /* (hd, BK), or NULL without the tiles */
    int64_t kt_head; /* b·H + h of kt's keys, −1 for none */
    int64_t kt_k0;
} fwd_scratch_t;

/* Rows r0..r0+n of head h of sample b. */
static void fwd_block_f32(const att_job_t *j, fwd_scratch_t *w, int64_t b, int64_t h, int64_t r0) {
    int64_t T = j->T, C = j->C, hd = j->hd, ld = 3 * C, n = min64(BQ, T - r0);
    const float *q = j->qkv + (b * T + r0) * ld + h * hd;
    const float *k = j->qkv + b * T * ld + C + h * hd, *v = k + C;
    float *o = j->out + (b * T + r0) * C + h * hd, *s = w->s;
    const ts_cpu_att_tiles_t *tiles = w->kt ? j->vec->att : NULL;
    float mx[BQ], l[BQ], alpha[BQ];
    for (int64_t k0 = 0; k0 < T; k0 += BK) {
        int64_t m = min64(BK, T - k0), mp = tiles ? (m + 15) / 16 * 16 : m;
        /* s (n, m) = scale · Q_blk · K_blkᵀ */
        if (tiles) {
            if (w->kt_head != b * j->H + h || w->kt_k0 != k0) {
                tiles->kt(w->kt, k + k0 * ld, m, mp, hd, ld);
                w->kt_head = b * j->H + h, w->kt_k0 = k0;
            }
            tiles->qk(s, mp, q, ld, w->kt, mp, n, hd, j->scale);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)m, (int)hd, j->scale,
                        q, (int)ld, k + k0 * ld, (int)ld, 0.0f, s, (int)m);
        }
        online_softmax(j->vec, s, n, m, mp, mx, l, alpha, k0 == 0);
        if (k0 > 0)
            for (int64_t i = 0; i < n; i++)
                for (int64_t d = 0; d < hd; d++)
                    o[i * C + d] *= alpha[i];
        /* O_blk (n, hd) = (first block ? 0 : O_blk) + P · V_blk */
        if (tiles)
            tiles->pv(o, C, s, mp, v + k0 * ld, ld, n, m, hd, k0 > 0);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)hd, (int)m, 1.0f, s,
                        (int)mp, v + k0 * ld, (int)ld, k0 == 0 ? 0.0f : 1.0f, o, (int)C);
    }
    finish_rows(o, n, hd, C, mx, l, j->lse ? j->lse + (b * j->H + h) * T + r0 : NULL);
}

static void fwd_range_f32(void *arg, int64_t lo, int64_t hi) {
    att_job_t *j = arg;
    fwd_scratch_t w = {.s = malloc((size_t)BQ * BK * sizeof(float)), .kt_head = -1};
    if (j->vec->att)
        w.kt = malloc((size_t)j->hd * BK * sizeof(float));
    if (!w.s || (j->vec->att && !w.kt)) {
        j->failed = 1;
        free(w.s);
        free(w.kt);
        return;
    }
    for (int64_t t = lo; t < hi; t++) {
        int64_t b, h, r0;
        task_of(j, t, &b, &h, &r0);
        fwd_block_f32(j, &w, b, h, r0);
    }
    free(w.s);
    free(w.kt);
}

static att_job_t job_of(const ts_engine_t *e, int64_t B, int64_t T, int64_t C, int64_t H) {
    att_job_t j = {.B = B, .T = T, .C = C, .H = H, .hd = C / H, .nq = (T + BQ - 1) / BQ};
    j.vec = e->vec;
    j.scale = 1.0f / sqrtf((float)j.hd);
    return j;
}

int ts_cpu_attention_fused_forward(ts_engine_t *e, float *out, float *lse, const float *qkv,
                                   int64_t B, int64_t T, int64_t C, int64_t H) {
    if (3 * C > INT32_MAX || T > INT32_MAX)
        return TS_ERANGE;
    att_job_t j = job_of(e, B, T, C, H);
    j.out = out, j.lse = lse, j.qkv = qkv;
    return att_run(e, &j, B * H * j.nq, 2.0 * B * H * T * T * j.hd, fwd_range_f32);
}

/* ---- fp32 backward --------------------------------------------------------------------------- */

/* Head h of sample b; p and dp are (BQ, BK) scratch. */
static void bwd_head(const att_job_t *j, float *p, float *dp, int64_t b, int64_t h) {
    int64_t T = j->T, C = j->C, hd = j->hd, ld = 3 * C;
    float scale = j->scale;
    const float *q = j->qkv + b * T * ld + h * hd, *k = q + C, *v = q + 2 * C;
    float *dq = j->dqkv + b * T * ld + h * hd, *dk = dq + C, *dv = dq + 2 * C;
    const float *o = j->o + b * T * C + h * hd, *dout = j->dout + b * T * C + h * hd;
    const float *lse = j->lse_in + (b * j->H + h) * T;
    for (int64_t q0 = 0; q0 < T; q0 += BQ) {
        int64_t n = min64(BQ, T - q0);
        const float *qb = q + q0 * ld, *ob = o + q0 * C, *dob = dout + q0 * C;
        float D[BQ]; /* D_i = dO_i · O_i */
        for (int64_t i = 0; i < n; i++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < hd; d++)
                acc += dob[i * C + d] * ob[i * C + d];
            D[i] = acc;
        }
        for (int64_t k0 = 0; k0 < T; k0 += BK) {
            int64_t m = min64(BK, T - k0);
            const float *kb = k + k0 * ld, *vb = v + k0 * ld;
            /* P (n, m) = e^(scale · Q_blk K_blkᵀ − lse) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)m, (int)hd, scale, qb,
                        (int)ld, kb, (int)ld, 0.0f, p, (int)m);
            for (int64_t i = 0; i < n; i++)
                j->vec->exp_sub(p + i * m, m, lse[q0 + i]);
            /* dV_blk (m, hd) += Pᵀ · dO_blk */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)hd, (int)n, 1.0f, p,
                        (int)m, dob, (int)C, 1.0f, dv + k0 * ld, (int)ld);
            /* dP (n, m) = dO_blk · V_blkᵀ; then dS = P ∘ (dP − D), in dp */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)m, (int)hd, 1.0f, dob,
                        (int)C, vb, (int)ld, 0.0f, dp, (int)m);
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < m; c++)
                    dp[i * m + c] = p[i * m + c] * (dp[i * m + c] - D[i]);
            /* dQ_blk += scale · dS · K_blk; dK_blk += scale · dSᵀ · Q_blk */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)hd, (int)m, scale,
                        dp, (int)m, kb, (int)ld, 1.0f, dq + q0 * ld, (int)ld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)hd, (int)n, scale, dp,
                        (int)m, qb, (int)ld, 1.0f, dk + k0 * ld, (int)ld);
        }
    }
}

static void bwd_range(void *arg, int64_t lo, int64_t hi) {
    att_job_t *j = arg;
    float *p = malloc((size_t)2 * BQ * BK * sizeof *p);
    if (!p) {
        j->failed = 1;
        return;
    }
    for (int64_t t = lo; t < hi; t++)
        bwd_head(j, p, p + BQ * BK, t / j->H, t % j->H);
    free(p);
}

int ts_cpu_attention_fused_backward(ts_engine_t *e, float *dqkv, const float *dout,
                                    const float *qkv, const float *out, const float *lse, int64_t B,
                                    int64_t T, int64_t C, int64_t H) {
    if (3 * C > INT32_MAX || T > INT32_MAX)
        return TS_ERANGE;
    att_job_t j = job_of(e, B, T, C, H);
    j.dqkv = dqkv, j.dout = dout, j.qkv = qkv, j.o = out, j.lse_in = lse;
    return att_run(e, &j, B * H, 5.0 * B * H * T * T * j.hd, bwd_range);
}

/* ---- bf16 forward ---------------------------------------------------------------------------- */

#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 10))

#include <immintrin.h>

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* One task range's scratch for head size hd; hp = hd rounded up to even (whole bf16 pairs), hv =
 * hd rounded up to 16 (whole vectors of output lanes). Pairs are read as uint32 (the build has
 * -fno-strict-aliasing). */
typedef struct {
    int64_t hp, hv;
    uint16_t *q;   /* (BQ, hp) the query block */
    uint16_t *k;   /* (hp/2, BK, 2) the key block: the pair (k_j[2p], k_j[2p+1]) at [p][j] */
    uint16_t *v;   /* (BK/2, hv, 2) the value block: the pair (v_2p[d], v_2p+1[d]) at [p][d] */
    uint16_t *p;   /* (BQ, BK) the weights e^(S − m) */
    uint16_t *tmp; /* (BK, max(hp, hv)) rows rounded before they are interleaved */
    float *s;      /* (BQ, BK) the scores, then the weights in fp32 */
    float *o;      /* (BQ, hv) the output block */
    void *mem;
} bf16_scratch_t;

static int scratch_new(bf16_scratch_t *w, int64_t hd) {
    int64_t hp = round_up(hd, 2), hv = round_up(hd, 16), wide = hp > hv ? hp : hv;
    /* every piece a multiple of 64 bytes: BQ, BK, hv are multiples of 16 */
    size_t u16 = (size_t)(BQ * round_up(hp, 32) + hp * BK + BK * hv + BQ * BK + BK * wide);
    size_t f32 = (size_t)(BQ * BK + BQ * hv);
    char *mem = aligned_alloc(64, round_up((int64_t)(u16 * 2 + f32 * 4), 64));
    if (!mem)
        return TS_ENOMEM;
    w->hp = hp, w->hv = hv, w->mem = mem;
    w->s = (float *)mem;
    w->o = w->s + BQ * BK;
    w->q = (uint16_t *)(w->o + BQ * hv);
    w->k = w->q + BQ * round_up(hp, 32);
    w->v = w->k + hp * BK;
    w->p = w->v + BK * hv;
    w->tmp = w->p + BQ * BK;
    return TS_OK;
}

/* d[0..n) = s[0..n) rounded to bf16 (nearest even), d[n..npad) = 0. */
BF16_TARGET static void round_row(uint16_t *d, const float *s, int64_t n, int64_t npad) {
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        _mm256_storeu_si256((__m256i *)(d + c),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + c)));
    if (c < n) {
        __mmask16 m = (__mmask16)((1u << (n - c)) - 1u);
        _mm256_mask_storeu_epi16(d + c, m,
                                 (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + c)));
    }
    for (c = n; c < npad; c++)
        d[c] = 0;
}

/* The m rows k (stride ld, hd wide) into dst16 as B of a product over the head dimension
 * ([pair of dimensions][row][2]), for m16 = m rounded up to 16 (zero rows past m); tmp holds
 * the rounded rows (m, hp). */
BF16_TARGET static void pack_keys_to(uint16_t *dst16, uint16_t *tmp, int64_t hp, const float *k,
                                     int64_t ld, int64_t m, int64_t m16, int64_t hd) {
    int64_t np = hp / 2;
    for (int64_t j = 0; j < m; j++)
        round_row(tmp + j * hp, k + j * ld, hd, hp);
    const uint32_t *rows = (const uint32_t *)tmp;
    uint32_t *dst = (uint32_t *)dst16;
    for (int64_t p = 0; p < np; p++)
        for (int64_t j = 0; j < m16; j++)
            dst[p * m16 + j] = j < m ? rows[j * np + p] : 0u;
}

/* The m keys k into w->k (pack_keys_to). */
BF16_TARGET static void pack_keys(bf16_scratch_t *w, const float *k, int64_t ld, int64_t m,
                                  int64_t m16, int64_t hd) {
    pack_keys_to(w->k, w->tmp, w->hp, k, ld, m, m16, hd);
}

/* The m rows x (stride ld, hd wide), rounded, into dst as B of a product over those rows:
 * ([pair of rows][column][2]), hv columns, m2 = m rounded up to even (a zero row past m). */
BF16_TARGET static void pack_rows_as_b(uint16_t *dst16, uint16_t *tmp, const float *x, int64_t ld,
                                       int64_t m, int64_t m2, int64_t hd, int64_t hv) {
    for (int64_t j = 0; j < m; j++)
        round_row(tmp + j * hv, x + j * ld, hd, hv);
    if (m2 > m)
        memset(tmp + m * hv, 0, (size_t)hv * sizeof *tmp);
    uint32_t *dst = (uint32_t *)dst16;
    for (int64_t p = 0; p < m2 / 2; p++)
        for (int64_t d = 0; d < hv; d++)
            dst[p * hv + d] = (uint32_t)tmp[2 * p * hv + d] | (uint32_t)tmp[(2 * p + 1) * hv + d]
                                                                  << 16;
}

/* The m value rows v into w->v as B of P · V (pack_rows_as_b). */
BF16_TARGET static void pack_values(bf16_scratch_t *w, const float *v, int64_t ld, int64_t m,
                                    int64_t m2, int64_t hd) {
    pack_rows_as_b(w->v, w->tmp, v, ld, m, m2, hd, w->hv);
}

/* A tile of R ≤ 4 rows × nv ≤ 4 vectors of 16 lanes: out[r][0..16·nv) (row stride ldo) =
 * (accumulate ? out : 0) + scale · Σ_p a_r[p] · b_p, where a_r[p] is row r's p-th bf16 pair (rows
 * of lda pairs), broadcast to every lane, and b_p the nv·16 lanes' pairs at b + p·bstride (bf16
 * units). Inlined with R and nv constants, so the R·nv accumulators (independent chains: one
 * vdpbf16ps has a latency of several cycles) stay in registers. */
BF16_TARGET static inline __attribute__((always_inline)) void
dot_tile(float *out, int64_t ldo, const uint32_t *a, int64_t lda, int64_t np, const uint16_t *b,
         int64_t bstride, int R, int nv, int accumulate, float scale) {
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < nv; i++)
            acc[r][i] = accumulate ? _mm512_loadu_ps(out + r * ldo + 16 * i) : _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        const uint16_t *bp = b + p * bstride;
        __m512bh y[4];
        for (int i = 0; i < nv; i++)
            y[i] = (__m512bh)_mm512_loadu_si512(bp + 32 * i);
        for (int r = 0; r < R; r++) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r * lda + p]);
            for (int i = 0; i < nv; i++)
                acc[r][i] = _mm512_dpbf16_ps(acc[r][i], x, y[i]);
        }
    }
    __m512 k = _mm512_set1_ps(scale);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < nv; i++)
            _mm512_storeu_ps(out + r * ldo + 16 * i, _mm512_mul_ps(acc[r][i], k));
}

/* The R rows' columns [0, width) (width a multiple of 16), in tiles of 4, 2 or 1 vectors. */
BF16_TARGET static inline __attribute__((always_inline)) void
dot_rows(float *out, int64_t ldo, const uint32_t *a, int64_t lda, int64_t np, const uint16_t *b,
         int64_t bstride, int64_t width, int R, int accumulate, float scale) {
    int64_t c = 0;
    for (; c + 64 <= width; c += 64)
        dot_tile(out + c, ldo, a, lda, np, b + 2 * c, bstride, R, 4, accumulate, scale);
    for (; c + 32 <= width; c += 32)
        dot_tile(out + c, ldo, a, lda, np, b + 2 * c, bstride, R, 2, accumulate, scale);
    for (; c < width; c += 16)
        dot_tile(out + c, ldo, a, lda, np, b + 2 * c, bstride, R, 1, accumulate, scale);
}

/* out (n, width), row stride ldo, = (accumulate ? out : 0) + scale · A · B: A (n, np pairs) bf16
 * rows of lda pairs, B in pairs ([p][column][2], bstride bf16 per p). Four rows at a time. */
BF16_TARGET static void product_bf16(float *out, int64_t ldo, const uint16_t *A, int64_t lda,
                                     int64_t n, int64_t np, const uint16_t *B, int64_t bstride,
                                     int64_t width, int accumulate, float scale) {
    const uint32_t *a = (const uint32_t *)A;
    int64_t r = 0;
    for (; r + 4 <= n; r += 4)
        dot_rows(out + r * ldo, ldo, a + r * lda, lda, np, B, bstride, width, 4, accumulate, scale);
    for (; r < n; r++)
        dot_rows(out + r * ldo, ldo, a + r * lda, lda, np, B, bstride, width, 1, accumulate, scale);
}

/* Rows r0..r0+n of head h of sample b, as fwd_block_f32 with the products in bf16. */
BF16_TARGET static void fwd_block_bf16(const att_job_t *j, bf16_scratch_t *w, int64_t b, int64_t h,
                                       int64_t r0) {
    int64_t T = j->T, C = j->C, hd = j->hd, ld = 3 * C, n = min64(BQ, T - r0);
    int64_t hp = w->hp, hv = w->hv;
    const float *q = j->qkv + (b * T + r0) * ld + h * hd;
    const float *k = j->qkv + b * T * ld + C + h * hd, *v = k + C;
    float mx[BQ], l[BQ], alpha[BQ];
    for (int64_t i = 0; i < n; i++)
        round_row(w->q + i * hp, q + i * ld, hd, hp);
    for (int64_t k0 = 0; k0 < T; k0 += BK) {
        int64_t m = min64(BK, T - k0), m16 = round_up(m, 16), m2 = round_up(m, 2);
        pack_keys(w, k + k0 * ld, ld, m, m16, hd);
        pack_values(w, v + k0 * ld, ld, m, m2, hd);
        /* s (n, m16) = scale · Q_blk · K_blkᵀ */
        product_bf16(w->s, BK, w->q, hp / 2, n, hp / 2, w->k, 2 * m16, m16, 0, j->scale);
        online_softmax(j->vec, w->s, n, m, BK, mx, l, alpha, k0 == 0);
        /* O_blk (n, hv) = (first block ? 0 : alpha · O_blk) + P · V_blk */
        for (int64_t i = 0; i < n; i++) {
            float *oi = w->o + i * hv;
            for (int64_t d = 0; d < hv; d++)
                oi[d] = k0 == 0 ? 0.0f : oi[d] * alpha[i];
            round_row(w->p + i * BK, w->s + i * BK, m, m2);
        }
        product_bf16(w->o, hv, w->p, BK / 2, n, m2 / 2, w->v, 2 * hv, hv, 1, 1.0f);
    }
    finish_rows(w->o, n, hd, hv, mx, l, j->lse ? j->lse + (b * j->H + h) * T + r0 : NULL);
    for (int64_t i = 0; i < n; i++) {
        int64_t at = (b * T + r0 + i) * C + h * hd;
        if (j->out16) /* rounded as written: what proj would round */
            for (int64_t d = 0; d < hd; d++)
                j->out16[at + d] = ts_f32_to_bf16(w->o[i * hv + d]);
        if (j->out)
            memcpy(j->out + at, w->o + i * hv, (size_t)hd * sizeof(float));
    }
}

static void fwd_range_bf16(void *arg, int64_t lo, int64_t hi) {
    att_job_t *j = arg;
    bf16_scratch_t w;
    if (scratch_new(&w, j->hd) != TS_OK) {
        j->failed = 1;
        return;
    }
    for (int64_t t = lo; t < hi; t++) {
        int64_t b, h, r0;
        task_of(j, t, &b, &h, &r0);
        fwd_block_bf16(j, &w, b, h, r0);
    }
    free(w.mem);
}

/* ---- bf16 backward --------------------------------------------------------------------------- */

/* The backward's scratch for one task range (a head at a time), head size hd: the fp32 blocks
 * P and dS and an output block, the bf16 operands of the five products in the layouts
 * product_bf16 reads (rows of pairs for A; [pair][column][2] for B). */
typedef struct {
    int64_t hp, hv;
    float *p, *ds; /* (BQ, BK) P = e^(S − lse), then dP and dS */
    float *acc;    /* (max(BQ, BK), hv) one product's result before it is added to dqkv */
    uint16_t *q;   /* (BQ, hp) rows: the query block (for S) */
    uint16_t *dor; /* (BQ, hp) rows: the dO block (for dP) */
    uint16_t *kk;  /* (hp/2, BK, 2): keys as B of S = Q Kᵀ */
    uint16_t *vk;  /* (hp/2, BK, 2): values as B of dP = dO Vᵀ */
    uint16_t *kv;  /* (BK/2, hv, 2): keys as B of dQ = dS K */
    uint16_t *dov; /* (BQ/2, hv, 2): dO as B of dV = Pᵀ dO */
    uint16_t *qv;  /* (BQ/2, hv, 2): queries as B of dK = dSᵀ Q */
    uint16_t *pt;  /* (BK, BQ) rows: Pᵀ */
    uint16_t *dsr; /* (BQ, BK) rows: dS */
    uint16_t *dst; /* (BK, BQ) rows: dSᵀ */
    uint16_t *tmp; /* (max(BQ, BK), max(hp, hv)) rows rounded before they are interleaved */
    float *tr;     /* (BK, BQ) a transposed fp32 block before rounding */
    void *mem;
} bf16_bwd_t;

static int bwd_scratch_new(bf16_bwd_t *w, int64_t hd) {
    int64_t hp = round_up(hd, 2), hv = round_up(hd, 16), wide = hp > hv ? hp : hv;
    int64_t rows = BQ > BK ? BQ : BK;
    size_t f32 = (size_t)(2 * BQ * BK + rows * hv + BK * BQ);
    size_t u16 = (size_t)(2 * BQ * round_up(hp, 32) + 2 * hp * BK + BK * hv + 2 * BQ * hv +
                          3 * BQ * BK + rows * wide);
    char *mem = aligned_alloc(64, round_up((int64_t)(f32 * 4 + u16 * 2), 64));
    if (!mem)
        return TS_ENOMEM;
    w->hp = hp, w->hv = hv, w->mem = mem;
    w->p = (float *)mem;
    w->ds = w->p + BQ * BK;
    w->acc = w->ds + BQ * BK;
    w->tr = w->acc + rows * hv;
    w->q = (uint16_t *)(w->tr + BK * BQ);
    w->dor = w->q + BQ * round_up(hp, 32);
    w->kk = w->dor + BQ * round_up(hp, 32);
    w->vk = w->kk + hp * BK;
    w->kv = w->vk + hp * BK;
    w->dov = w->kv + BK * hv;
    w->qv = w->dov + BQ * hv;
    w->pt = w->qv + BQ * hv;
    w->dsr = w->pt + BK * BQ;
    w->dst = w->dsr + BQ * BK;
    w->tmp = w->dst + BK * BQ;
    return TS_OK;
}

/* x (n, m), row stride ldx, transposed into w->tr (m, n) and rounded into dst (m rows of n2
 * bf16, n2 = n rounded up to even, zero past n). */
BF16_TARGET static void round_transposed(uint16_t *dst, float *tr, const float *x, int64_t ldx,
                                         int64_t n, int64_t m, int64_t n2) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < m; c++)
            tr[c * n + i] = x[i * ldx + c];
    for (int64_t c = 0; c < m; c++)
        round_row(dst + c * n2, tr + c * n, n, n2);
}

/* dst rows (n, hd) at stride ld += acc (n, hv), the first hd columns. */
static void add_rows(float *dst, int64_t ld, const float *acc, int64_t n, int64_t hd, int64_t hv) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < hd; d++)
            dst[i * ld + d] += acc[i * hv + d];
}

/* Head h of sample b, as bwd_head with the five products in bf16 (fp32 accumulation; the
 * recomputed softmax, D, dS and every sum into dqkv in fp32). */
BF16_TARGET static void bwd_head_bf16(const att_job_t *j, bf16_bwd_t *w, int64_t b, int64_t h) {
    int64_t T = j->T, C = j->C, hd = j->hd, ld = 3 * C, hp = w->hp, hv = w->hv;
    float scale = j->scale;
    const float *q = j->qkv + b * T * ld + h * hd, *k = q + C, *v = q + 2 * C;
    float *dq = j->dqkv + b * T * ld + h * hd, *dk = dq + C, *dv = dq + 2 * C;
    const float *o = j->o + b * T * C + h * hd, *dout = j->dout + b * T * C + h * hd;
    const float *lse = j->lse_in + (b * j->H + h) * T;
    for (int64_t q0 = 0; q0 < T; q0 += BQ) {
        int64_t n = min64(BQ, T - q0), n2 = round_up(n, 2);
        const float *qb = q + q0 * ld, *ob = o + q0 * C, *dob = dout + q0 * C;
        float D[BQ]; /* D_i = dO_i · O_i, fp32 */
        for (int64_t i = 0; i < n; i++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < hd; d++)
                acc += dob[i * C + d] * ob[i * C + d];
            D[i] = acc;
        }
        for (int64_t i = 0; i < n; i++) {
            round_row(w->q + i * hp, qb + i * ld, hd, hp);
            round_row(w->dor + i * hp, dob + i * C, hd, hp);
        }
        pack_rows_as_b(w->dov, w->tmp, dob, C, n, n2, hd, hv);
        pack_rows_as_b(w->qv, w->tmp, qb, ld, n, n2, hd, hv);
        for (int64_t k0 = 0; k0 < T; k0 += BK) {
            int64_t m = min64(BK, T - k0), m16 = round_up(m, 16), m2 = round_up(m, 2);
            const float *kb = k + k0 * ld, *vb = v + k0 * ld;
            pack_keys_to(w->kk, w->tmp, hp, kb, ld, m, m16, hd);
            pack_keys_to(w->vk, w->tmp, hp, vb, ld, m, m16, hd);
            pack_rows_as_b(w->kv, w->tmp, kb, ld, m, m2, hd, hv);
            /* P (n, m) = e^(scale · Q Kᵀ − lse) */
            product_bf16(w->p, BK, w->q, hp / 2, n, hp / 2, w->kk, 2 * m16, m16, 0, scale);
            for (int64_t i = 0; i < n; i++)
                j->vec->exp_sub(w->p + i * BK, m, lse[q0 + i]);
            /* dV_blk (m, hd) += Pᵀ · dO_blk */
            round_transposed(w->pt, w->tr, w->p, BK, n, m, n2);
            product_bf16(w->acc, hv, w->pt, n2 / 2, m, n2 / 2, w->dov, 2 * hv, hv, 0, 1.0f);
            add_rows(dv + k0 * ld, ld, w->acc, m, hd, hv);
            /* dP (n, m) = dO · Vᵀ; dS = P ∘ (dP − D) */
            product_bf16(w->ds, BK, w->dor, hp / 2, n, hp / 2, w->vk, 2 * m16, m16, 0, 1.0f);
            for (int64_t i = 0; i < n; i++)
                for (int64_t c = 0; c < m; c++)
                    w->ds[i * BK + c] = w->p[i * BK + c] * (w->ds[i * BK + c] - D[i]);
            /* dQ_blk (n, hd) += scale · dS · K_blk */
            for (int64_t i = 0; i < n; i++)
                round_row(w->dsr + i * BK, w->ds + i * BK, m, m2);
            product_bf16(w->acc, hv, w->dsr, BK / 2, n, m2 / 2, w->kv, 2 * hv, hv, 0, scale);
            add_rows(dq + q0 * ld, ld, w->acc, n, hd, hv);
            /* dK_blk (m, hd) += scale · dSᵀ · Q_blk */
            round_transposed(w->dst, w->tr, w->ds, BK, n, m, n2);
            product_bf16(w->acc, hv, w->dst, n2 / 2, m, n2 / 2, w->qv, 2 * hv, hv, 0, scale);
            add_rows(dk + k0 * ld, ld, w->acc, m, hd, hv);
        }
    }
}

static void bwd_range_bf16(void *arg, int64_t lo, int64_t hi) {
    att_job_t *j = arg;
    bf16_bwd_t w;
    if (bwd_scratch_new(&w, j->hd) != TS_OK) {
        j->failed = 1;
        return;
    }
    for (int64_t t = lo; t < hi; t++)
        bwd_head_bf16(j, &w, t / j->H, t % j->H);
    free(w.mem);
}

int ts_cpu_attention_fused_bf16_ok(void) { return __builtin_cpu_supports("avx512bf16") != 0; }

/* dqkv16: rounded after the whole backward (the GPU's kernels round each element as they
 * write it, once: the same bits). */
int ts_cpu_attention_fused_backward_lp(ts_engine_t *e, ts_dtype_t lp, float *dqkv, uint16_t *dqkv16,
                                       const float *dout, const float *qkv, const float *out,
                                       const float *lse, int64_t B, int64_t T, int64_t C,
                                       int64_t H) {
    if (lp != TS_BF16 || !ts_cpu_attention_fused_bf16_ok()) /* no f16 one on the CPU */
        return TS_ENOTSUP;
    if (3 * C > INT32_MAX || T > INT32_MAX)
        return TS_ERANGE;
    att_job_t j = job_of(e, B, T, C, H);
    j.dqkv = dqkv, j.dout = dout, j.qkv = qkv, j.o = out, j.lse_in = lse;
    TS_TRY(att_run(e, &j, B * H, 5.0 * B * H * T * T * j.hd, bwd_range_bf16));
    for (int64_t i = 0; dqkv16 && i < B * T * 3 * C; i++)
        dqkv16[i] = ts_f32_to_bf16(dqkv[i]);
    return TS_OK;
}

int ts_cpu_attention_fused_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *out, uint16_t *out16,
                                      float *lse, const float *qkv, int64_t B, int64_t T, int64_t C,
                                      int64_t H) {
    if (lp != TS_BF16 || !ts_cpu_attention_fused_bf16_ok())
        return TS_ENOTSUP;
    att_job_t j = job_of(e, B, T, C, H);
    j.out = out, j.out16 = out16, j.lse = lse, j.qkv = qkv;
    return att_run(e, &j, B * H * j.nq, 2.0 * B * H * T * T * j.hd, fwd_range_bf16);
}

#else /* no AVX-512 BF16 in this compiler or on this architecture */

int ts_cpu_attention_fused_bf16_ok(void) { return 0; }

int ts_cpu_attention_fused_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *out, uint16_t *out16,
                                      float *lse, const float *qkv, int64_t B, int64_t T, int64_t C,
                                      int64_t H) {
    (void)e, (void)lp, (void)out, (void)out16, (void)lse, (void)qkv, (void)B, (void)T, (void)C;
    (void)H;
    return TS_ENOTSUP;
}

int ts_cpu_attention_fused_backward_lp(ts_engine_t *e, ts_dtype_t lp, float *dqkv, uint16_t *dqkv16,
                                       const float *dout, const float *qkv, const float *out,
                                       const float *lse, int64_t B, int64_t T, int64_t C,
                                       int64_t H) {
    (void)e, (void)lp, (void)dqkv, (void)dqkv16, (void)dout, (void)qkv, (void)out, (void)lse;
    (void)B, (void)T, (void)C, (void)H;
    return TS_ENOTSUP;
}

#endif
