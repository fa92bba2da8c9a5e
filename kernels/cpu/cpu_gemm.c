/*
 * cpu_gemm.c — the CPU backend's products: ts_cpu_gemm (a strided batch of fp32 products) and a
 * linear layer's forward (ts_cpu_linear_forward, ts_cpu_linear_gelu_forward), on OpenBLAS's
 * cblas_sgemm (or oneDNN's, where fwd_gemm.h takes the forward products). On a CPU with FMA a
 * linear layer's forward is the register tiles of kernels/cpu/lin_tile.c instead (linear_tiles
 * below): one FMA chain per output, so what follows about OpenBLAS's slices and batch invariance
 * concerns the other products and the base build.
 *
 * Determinism: a GEMM is cut into one slice per thread, and OpenBLAS may round a slice
 * differently from the whole product (seen with M = 1 products of 1280 to 2304 columns cut in
 * two); the slices depend on the thread count only. For the forward products of a linear layer
 * (A·Bᵀ, beta 0) that difference came from OpenBLAS's small-matrix kernel, which such products now
 * never reach (see "Batch invariance" at sgemm): their rows do not depend on the slicing, the
 * thread count or the other rows of the batch.
 */
#include <cblas.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "kernels/backend.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/fwd_gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/vec.h"

/* GEMMs of fewer multiply-adds than this (all products of the call together) wake no thread: the
 * caller computes every slice itself. The second thread saves less than the wake-up costs there
 * (tiny's products at batch 1, up to 3.2M multiply-adds, ran faster on one thread). */
#define GEMM_WAKE_MACS 4194304.0

/* ---- GEMM ------------------------------------------------------------------------------ */

/* The pool, not OpenBLAS, owns the cores: OpenBLAS runs single-threaded (see ts_cpu_engine_init,
 * cpu_ops.c) and each worker calls cblas_sgemm on its own slice of the output. Small batched
 * products (attention: one per sample and head) split over the batch, single products over the
 * longer of M and N. OpenBLAS's own threads would otherwise spin (sched_yield) between calls and
 * take the cores from the pool's elementwise work. A linear layer's bias is added by the worker to
 * its own slice right after the slice's sgemm, while the slice is still in cache, instead of in a
 * second pass over the whole output. */
typedef struct {
    int ta, tb;
    int64_t M, N, K, lda, ldb, ldc, sa, sb, sc;
    float alpha, beta;
    const float *A, *B;
    float *C;
    const float *bias; /* (N) added to every row of C after the product, or NULL */
    float *act;        /* when not NULL: act = gelu(C) after the bias (C's layout), or NULL */
    const ts_cpu_vec_t *vec;
    int split;  /* 0: batch, 1: rows of C, 2: columns of C */
    int onednn; /* items_range: each item's product through oneDNN (fwd_gemm.h) */
    int64_t nb, cb; /* items_range: each item's columns in nb blocks of cb (the last may be less) */
} gemm_job_t;

/* Batch invariance. OpenBLAS picks a kernel by the shape of each call, and its kernels round
 * differently. Two ways are taken, by the kernels OpenBLAS runs on this CPU (row_invariant_core):
 *
 * Where the blocked kernel's rows do not depend on their place in the call (SkylakeX and its
 * successors; this project's first reference machine, a Cooperlake), the padding below is enough.
 * Elsewhere — Haswell's kernels (run on this project's AMD EPYC machines because their
 * environment sets OPENBLAS_CORETYPE=Haswell; 0.3.21 itself picks Cooperlake there), which compute the rows of C in
 * blocks of 12 whose halves round differently, so a row's bits depend on its position modulo 12
 * (measured on an AMD EPYC: shifting the rows of a 192-row product by s changes 2s of every 12
 * rows) — a linear layer computes each item of the batch (a sample's tokens, or a sample's one
 * row) by its own sgemm call, of the same shape whatever the batch (ts_cpu_linear_forward's
 * group): the same call gives the same bits on any BLAS. The items are shared among the threads,
 * never cut, so the thread count does not matter either.
 *
 * The padding, on the first kind of machine: On this project's reference machine (0.3.21, Cooperlake, i.e. SkylakeX kernels) a
 * row-major A·Bᵀ with M·N ≤ 1200 (and K ≥ 32) goes to the "small matrix" kernel; anything larger
 * goes to the blocked kernel, whose result for one row of C does not depend on how many rows the
 * call has or where the row sits (tests/test_serve.c checks the DiT for this). A linear layer's
 * rows are tokens or samples, so without care a sample computed alone (M small: the small kernel)
 * would round differently from the same sample in a batch (M large: the blocked kernel): a
 * served answer would depend on which requests shared its batch. So such a small A·Bᵀ is padded
 * with zero rows — of A, or of B, whichever copies less — past SMALL_MN outputs, in scratch on
 * the stack, and always reaches the blocked kernel. One-row and one-column products are padded
 * too: newer OpenBLAS releases send them to gemv. The cost is a copy of at most PAD_FLOATS
 * floats, on products that are small by definition; a product whose padding would not fit runs
 * unpadded (none of the DiT presets has one). */
#define SMALL_MN 1200
#define PAD_FLOATS 16384

static void sgemm_raw(const gemm_job_t *j, int64_t M, int64_t N, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans, j->tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)j->K, j->alpha, A, (int)lda, B, (int)ldb, j->beta, C,
                (int)ldc);
}

/* rows (n, K) with row stride ld into dst (pad, K), the rows past n zero */
static void copy_rows_padded(float *dst, const float *src, int64_t n, int64_t pad, int64_t K,
                             int64_t ld) {
    for (int64_t r = 0; r < n; r++)
        memcpy(dst + r * K, src + r * ld, (size_t)K * sizeof *dst);
    memset(dst + n * K, 0, (size_t)((pad - n) * K) * sizeof *dst);
}

/* C (M, N) = alpha · A (M, K) · Bᵀ, with A or B padded by zero rows to Mp·N (or M·Np) outputs
 * > SMALL_MN; 0 when the padding does not fit in PAD_FLOATS (the caller then runs it as is). */
static int sgemm_padded(const gemm_job_t *j, int64_t M, int64_t N, const float *A, const float *B,
                        float *C) {
    float scratch[PAD_FLOATS];
    int64_t K = j->K;
    int64_t Mp = SMALL_MN / N + 1, Np = SMALL_MN / M + 1;
    Mp = Mp < 2 ? 2 : Mp;
    Np = Np < 2 ? 2 : Np;
    int64_t cost_rows = Mp * (K + N), cost_cols = Np * (K + M);
    if (cost_rows <= cost_cols && cost_rows <= PAD_FLOATS) {
        float *a = scratch, *c = scratch + Mp * K; /* a (Mp, K), c (Mp, N) */
        copy_rows_padded(a, A, M, Mp, K, j->lda);
        sgemm_raw(j, Mp, N, a, K, B, j->ldb, c, N);
        for (int64_t r = 0; r < M; r++)
            memcpy(C + r * j->ldc, c + r * N, (size_t)N * sizeof *C);
        return 1;
    }
    if (cost_cols <= PAD_FLOATS) {
        float *b = scratch, *c = scratch + Np * K; /* b (Np, K), c (M, Np) */
        copy_rows_padded(b, B, N, Np, K, j->ldb);
        sgemm_raw(j, M, Np, A, j->lda, b, K, c, Np);
        for (int64_t r = 0; r < M; r++)
            memcpy(C + r * j->ldc, c + r * Np, (size_t)N * sizeof *C);
        return 1;
    }
    return 0;
}

static void sgemm(const gemm_job_t *j, int64_t M, int64_t N, const float *A, const float *B,
                  float *C) {
    int small = M * N <= SMALL_MN || M == 1 || N == 1;
    if (small && !j->ta && j->tb && j->beta == 0.0f && sgemm_padded(j, M, N, A, B, C))
        return;
    sgemm_raw(j, M, N, A, j->lda, B, j->ldb, C, j->ldc);
}

/* The output pass of a slice C (M, N) at column col of the whole product: C += bias (N) on
 * every row, C + b rounded once as add_bcast does; then act = gelu(C) for a linear + GELU. Run by
 * the worker that computed the slice, right after its sgemm, while the slice is in cache. */
static void slice_epilogue(const gemm_job_t *j, float *C, int64_t M, int64_t N, int64_t col) {
    if (!j->bias && !j->act)
        return;
    float *act = j->act ? j->act + (C - j->C) : NULL; /* same offset as C's slice */
    j->vec->bias_act(C, act, j->bias ? j->bias + col : NULL, M, N, j->ldc);
}

static void gemm_range(void *arg, int64_t lo, int64_t hi) {
    const gemm_job_t *j = arg;
    if (j->split == 0) {
        for (int64_t b = lo; b < hi; b++) {
            float *C = j->C + b * j->sc;
            sgemm(j, j->M, j->N, j->A + b * j->sa, j->B + b * j->sb, C);
            slice_epilogue(j, C, j->M, j->N, 0);
        }
    } else if (j->split == 1) { /* rows lo..hi of C: rows of op(A) */
        const float *A = j->ta ? j->A + lo : j->A + lo * j->lda;
        sgemm(j, hi - lo, j->N, A, j->B, j->C + lo * j->ldc);
        slice_epilogue(j, j->C + lo * j->ldc, hi - lo, j->N, 0);
    } else { /* columns lo..hi of C: columns of op(B) */
        const float *B = j->tb ? j->B + lo * j->ldb : j->B + lo;
        sgemm(j, j->M, hi - lo, j->A, B, j->C + lo);
        slice_epilogue(j, j->C + lo, j->M, hi - lo, lo);
    }
}

/* gemm_range over [0, n) in chunks of at least grain, on the pool or, when !wake, all on the
 * caller (the same chunks: the slices decide the rounding). */
static void gemm_for(ts_engine_t *e, int wake, int64_t n, int64_t grain, gemm_job_t *j) {
    if (wake)
        ts_pool_for(e->pool, n, grain, gemm_range, j);
    else
        ts_pool_for_inline(e->pool, n, grain, gemm_range, j);
}

/* Runs the products of j (batch of them, strides in j). The slices depend on the thread count
 * only, never on GEMM_WAKE_MACS: OpenBLAS may round a slice differently from the whole product
 * (see Determinism at the top), so waking the threads or not must not re-cut them. */
static void gemm_run(ts_engine_t *e, gemm_job_t *j, int64_t batch) {
    double work = (double)j->M * (double)j->N * (double)j->K; /* multiply-adds per product */
    int wake = work * (double)batch >= GEMM_WAKE_MACS;
    int threads = ts_pool_threads(e->pool);
    if (batch >= threads && batch > 1) {
        j->split = 0;
        gemm_for(e, wake, batch, 1 + (int64_t)(65536.0 / (work + 1.0)), j);
        return;
    }
    /* below ~64k multiply-adds a product is not worth splitting, nor into slices of < 64
     * rows or columns (a 49-token image at batch 1 runs faster on one thread) */
    int64_t grain = work * (double)batch < 65536.0 ? INT64_MAX : 64;
    const float *A = j->A, *B = j->B;
    float *C = j->C;
    j->split = j->M >= j->N ? 1 : 2;
    for (int64_t b = 0; b < batch; b++) {
        j->A = A + b * j->sa, j->B = B + b * j->sb, j->C = C + b * j->sc;
        gemm_for(e, wake, j->split == 1 ? j->M : j->N, grain, j);
    }
}

static int gemm_dims_fit(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
    return M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
           ldc <= INT_MAX;
}

int ts_cpu_gemm(ts_engine_t *e, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                float alpha, const float *A, int64_t lda, int64_t stride_a, const float *B,
                int64_t ldb, int64_t stride_b, float beta, float *C, int64_t ldc, int64_t stride_c,
                int64_t batch) {
    if (!gemm_dims_fit(M, N, K, lda, ldb, ldc))
        return TS_ERANGE;
    gemm_job_t j = {trans_a,  trans_b, M,    N, K, lda, ldb,  ldc,  stride_a, stride_b,
                    stride_c, alpha,   beta, A, B, C,   NULL, NULL, e->vec};
    gemm_run(e, &j, batch);
    return TS_OK;
}

/* Whether OpenBLAS's blocked sgemm kernel on this CPU gives a row of C the same bits wherever the
 * row sits in the call (see "Batch invariance"): the SkylakeX family's kernels. Decided once. */
static int row_invariant_core(void) {
    static int known = -1;
    if (known < 0) {
        ts_blas_status_t b; /* the kernels OpenBLAS runs (also what ties blas_core.o in) */
        ts_blas_status(&b);
        const char *name = b.core;
        static const char *const fine[] = {"skylakex", "cooperlake", "sapphirerapids"};
        int ok = 0;
        for (size_t i = 0; name && i < sizeof fine / sizeof fine[0]; i++)
            ok |= strcasecmp(name, fine[i]) == 0;
        known = ok;
    }
    return known;
}

/* Items lo..hi of a per-item linear layer (j->M = the rows of one item). */
static void items_range(void *arg, int64_t lo, int64_t hi) {
    const gemm_job_t *j = arg;
    for (int64_t u = lo; u < hi; u++) { /* unit u: item u / nb, its column block u % nb */
        int64_t i = u / j->nb, c0 = u % j->nb * j->cb;
        int64_t n = j->N - c0 < j->cb ? j->N - c0 : j->cb;
        const float *A = j->A + i * j->M * j->lda;
        float *C = j->C + i * j->M * j->ldc + c0;
        if (j->onednn)
            ts_cpu_onednn_sgemm_nt(j->M, n, j->K, A, j->lda, j->B + c0 * j->ldb, j->ldb, C,
                                   j->ldc);
        else
            sgemm(j, j->M, n, A, j->B + c0 * j->ldb, C);
        slice_epilogue(j, C, j->M, n, c0);
    }
}

/* ---- the linear layers' forward in register tiles (kernels/cpu/lin_tile.c) -------------- */

/* Rows of the activations per unit of work, at most: a block of them (LIN_ROWS × K floats) stays
 * in L2 while every panel of the weight passes over it. The blocks of a call are of equal size
 * (within a row), and as many for every thread. */
#define LIN_ROWS 128

/* A panel's state: not packed, being packed by one thread, ready. */
enum { PANEL_NONE, PANEL_PACKING, PANEL_READY };

typedef struct {
    const ts_cpu_lin_tiles_t *t;
    float *out, *act;
    const float *inp, *weight, *bias;
    float *packed;
    int *state; /* (panels) PANEL_* */
    int64_t M, N, K, panels;
    int64_t blocks; /* row blocks: block b is rows [M·b / blocks, M·(b + 1) / blocks) */
    int64_t groups; /* column groups: unit u is row block u / groups, panels of group u % groups */
} lin_job_t;

/* Panel p packed, by this thread if no other has begun it (then still in this core's cache for
 * the rows that follow), else waited for: a panel is a few µs of copying. */
static void panel_ready(const lin_job_t *j, int64_t p) {
    int *st = &j->state[p];
    if (__atomic_load_n(st, __ATOMIC_ACQUIRE) == PANEL_READY)
        return;
    int expect = PANEL_NONE;
    if (__atomic_compare_exchange_n(st, &expect, PANEL_PACKING, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        j->t->pack(j->packed, j->weight, j->N, j->K, p, p + 1);
        __atomic_store_n(st, PANEL_READY, __ATOMIC_RELEASE);
        return;
    }
    while (__atomic_load_n(st, __ATOMIC_ACQUIRE) != PANEL_READY)
        sched_yield();
}

/* Units of row block b take the groups, and the panels in a group, in an order rotated by b, so
 * that threads starting on different blocks pack different panels at once instead of one
 * waiting for the other's. */
static void lin_range(void *arg, int64_t lo, int64_t hi) {
    const lin_job_t *j = arg;
    for (int64_t u = lo; u < hi; u++) {
        int64_t b = u / j->groups, g = (u + b) % j->groups;
        int64_t r0 = j->M * b / j->blocks, rows = j->M * (b + 1) / j->blocks - r0;
        int64_t p0 = j->panels * g / j->groups, n = j->panels * (g + 1) / j->groups - p0;
        for (int64_t i = 0, s = n * b / j->blocks; i < n; i++) {
            int64_t p = p0 + (s + i) % n;
            panel_ready(j, p);
            j->t->forward(j->out + r0 * j->N, j->act ? j->act + r0 * j->N : NULL, j->N,
                          j->inp + r0 * j->K, j->K, j->packed, j->bias, rows, j->N, j->K, p, p + 1);
        }
    }
}

/* Columns [8·lo, 8·hi) of a product of at most LIN_DIRECT_ROWS rows (lin's direct). */
static void lin_direct_range(void *arg, int64_t lo, int64_t hi) {
    const lin_job_t *j = arg;
    int64_t j1 = 8 * hi < j->N ? 8 * hi : j->N;
    j->t->direct(j->out, j->act, j->N, j->inp, j->K, j->weight, j->bias, j->M, j->K, 8 * lo, j1);
}

/* A product of at most LIN_DIRECT_ROWS rows reads the weight where it lies (lin's direct), its
 * columns cut among the threads in blocks of 8; the threads are woken from a weight of 2^18
 * floats (1 MiB) on, a threshold chosen, not measured. Otherwise: the output in units of a row
 * block by a group of the weight's panels: whole row blocks when there are enough for every
 * thread, else each block's panels cut in groups too. Each panel is
 * packed once, by the first unit to need it, and the threads share it. Every output's bits are
 * the same whichever unit computes it, so neither the cut nor the thread count nor GEMM_WAKE_MACS
 * changes one. */
static int linear_tiles(ts_engine_t *e, float *out, float *act, const float *inp,
                        const float *weight, const float *bias, int64_t M, int64_t N, int64_t K) {
    lin_job_t j = {.t = e->vec->lin,
                   .out = out,
                   .act = act,
                   .inp = inp,
                   .weight = weight,
                   .bias = bias,
                   .M = M,
                   .N = N,
                   .K = K};
    if (M <= LIN_DIRECT_ROWS) {
        int wake = (double)N * (double)K >= 262144.0 ||
                   (double)M * (double)N * (double)K >= GEMM_WAKE_MACS;
        if (wake)
            ts_pool_for(e->pool, (N + 7) / 8, 1, lin_direct_range, &j);
        else
            lin_direct_range(&j, 0, (N + 7) / 8);
        return TS_OK;
    }
    j.panels = (N + j.t->panel - 1) / j.t->panel;
    TS_TRY(ts_cpu_room(&e->lin_packed, &e->lin_cap, j.panels * j.t->panel * K, &j.packed));
    j.state = calloc((size_t)j.panels, sizeof *j.state);
    if (!j.state)
        return TS_ENOMEM;
    int threads = ts_pool_threads(e->pool);
    j.blocks = (M + LIN_ROWS - 1) / LIN_ROWS;
    if (j.blocks >= 2 * threads) /* as many blocks for every thread */
        j.blocks = (j.blocks + threads - 1) / threads * threads;
    j.groups = j.blocks >= 2 * threads ? 1 : (2 * threads + j.blocks - 1) / j.blocks;
    j.groups = j.groups > j.panels ? j.panels : j.groups;
    if ((double)M * (double)N * (double)K >= GEMM_WAKE_MACS)
        ts_pool_for(e->pool, j.blocks * j.groups, 1, lin_range, &j);
    else
        lin_range(&j, 0, j.blocks * j.groups);
    free(j.state);
    return TS_OK;
}

/* out (M, N) = inp (M, K) · weightᵀ + bias, then act = gelu(out) when act is not NULL. */
static int linear_forward(ts_engine_t *e, float *out, float *act, const float *inp,
                          const float *weight, const float *bias, int64_t M, int64_t N, int64_t K,
                          int64_t group) {
    if (!gemm_dims_fit(M, N, K, K, K, N))
        return TS_ERANGE;
    if (e->vec->lin && !ts_cpu_fwd_onednn())
        return linear_tiles(e, out, act, inp, weight, bias, M, N, K);
    /* out (M, N) = inp (M, K) · weightᵀ (K, N) + bias: lda = ldb = K, ldc = N, alpha 1, beta 0 */
    gemm_job_t j = {0, 1,    M,    N,   K,      K,   K,    N,   0,     0,
                    0, 1.0f, 0.0f, inp, weight, out, bias, act, e->vec};
    /* oneDNN (fwd_gemm.h), or OpenBLAS kernels whose rows depend on their place: one call per
     * item, the same whatever the batch */
    j.onednn = ts_cpu_fwd_onednn();
    if ((j.onednn || !row_invariant_core()) && group >= 1 && M % group == 0) {
        int64_t items = M / group;
        j.M = group;
        /* Through oneDNN an item's columns are cut in two blocks from 512 on (each a multiple of
         * 64), a cut that depends on N alone: one sample's product then still runs on two
         * threads, and its bits are the same whatever the batch. OpenBLAS: whole items. */
        j.cb = j.onednn && N >= 512 ? (N / 2 + 63) / 64 * 64 : N;
        j.nb = (N + j.cb - 1) / j.cb;
        double work = (double)M * (double)N * (double)K;
        ts_pool_for(e->pool, items * j.nb, work < 65536.0 ? INT64_MAX : 1, items_range, &j);
        return TS_OK;
    }
    gemm_run(e, &j, 1);
    return TS_OK;
}

int ts_cpu_linear_forward(ts_engine_t *e, float *out, const float *inp, const float *weight,
                          const float *bias, int64_t M, int64_t N, int64_t K, int64_t group) {
    return linear_forward(e, out, NULL, inp, weight, bias, M, N, K, group);
}

int ts_cpu_linear_gelu_forward(ts_engine_t *e, float *pre, float *act, const float *inp,
                               const float *weight, const float *bias, int64_t M, int64_t N,
                               int64_t K, int64_t group) {
    return linear_forward(e, pre, act, inp, weight, bias, M, N, K, group);
}
