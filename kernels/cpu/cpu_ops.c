/*
 * cpu_ops.c — the CPU backend: every ts_cpu_* of kernels/backend.h.
 *
 * GEMMs go to OpenBLAS (cblas_sgemm). Everything else is a loop over elements or rows that calls
 * the shared formulas of kernels/math.h, split over the engine's worker pool. The inner loops are
 * plain `for` loops over restrict-free contiguous arrays so gcc vectorises them at -O3. A loop
 * reads the job's pointers into locals first: the build has -fno-strict-aliasing, so a float
 * store could change the job struct as far as gcc knows, and a pointer read from the struct
 * inside the loop is read again every iteration, which stops vectorisation.
 *
 * Determinism: every result is independent of the thread count, except a GEMM's. Elementwise and
 * row ops write disjoint outputs; reductions sum fixed-size blocks (not per-thread chunks) into
 * partials that are then added in block order, in double. A GEMM is cut into one slice per
 * thread, and OpenBLAS may round a slice differently from the whole product (seen with M = 1
 * products of 1280 to 2304 columns cut in two); the slices depend on the thread count only.
 * For the forward products of a linear layer (A·Bᵀ, beta 0) that difference came from OpenBLAS's
 * small-matrix kernel, which such products now never reach (see "Batch invariance" at sgemm):
 * their rows do not depend on the slicing, the thread count or the other rows of the batch.
 */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/fwd_gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/row_max.h"
#include "kernels/cpu/vec.h"
#include "kernels/math.h"

/* Below this many elements per thread, an elementwise op runs on the caller alone. */
#define GRAIN_ELEMS 32768
/* The same for GELU, SiLU and softmax (an exp per element). A woken thread must get tens of µs of
 * work: waking it costs about that much (20–80 µs measured on the 2-vCPU VM under load). */
#define ACT_GRAIN (GRAIN_ELEMS / 2)
/* Reductions: at most this many blocks, each at least REDUCE_MIN_BLOCK elements. */
#define REDUCE_MAX_BLOCKS 256
#define REDUCE_MIN_BLOCK 4096
/* GEMMs of fewer multiply-adds than this (all products of the call together) wake no thread: the
 * caller computes every slice itself. The second thread saves less than the wake-up costs there
 * (tiny's products at batch 1, up to 3.2M multiply-adds, ran faster on one thread). */
#define GEMM_WAKE_MACS 4194304.0
/* Softmax: the row sums this many rows at a time. */
#define SUM_ROWS 8

/* ---- engine ---------------------------------------------------------------------------- */

/* OpenBLAS's (pthreads build) own thread pool, stopped; weak, for BLAS builds without it. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

int ts_cpu_engine_init(ts_engine_t *e, int threads) {
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    int rc = ts_pool_new(threads, &e->pool);
    if (rc)
        return rc;
    e->threads = threads;
    e->vec = ts_cpu_vec_pick(getenv("TESSERA_CPU_ISA"));
    /* The pool owns the cores; OpenBLAS runs one thread inside each pool worker (ts_cpu_gemm).
     * The threads OpenBLAS started when it was loaded would spin (sched_yield) for about 0.1 s
     * of a core whenever woken, beside the pool: they are stopped (OpenBLAS starts them again
     * itself if a multi-threaded call ever comes, as bench_gemm's peer measurement makes). */
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_)
        blas_thread_shutdown_();
    return TS_OK;
}

void ts_cpu_engine_free(ts_engine_t *e) {
    ts_pool_free(e->pool);
    e->pool = NULL;
}

/* ---- helpers --------------------------------------------------------------------------- */

/* Runs fn over [0, n) on the pool with a grain such that each thread gets >= min_per_thread. */
static void parallel(ts_engine_t *e, int64_t n, int64_t min_per_thread, ts_pool_fn fn, void *ctx) {
    ts_pool_for(e->pool, n, min_per_thread, fn, ctx);
}

typedef double (*block_fn)(const void *ctx, int64_t lo, int64_t hi);

typedef struct {
    block_fn fn;
    const void *ctx;
    int64_t n, block;
    double *partial;
} reduce_job_t;

static void reduce_range(void *arg, int64_t lo, int64_t hi) {
    reduce_job_t *j = arg;
    for (int64_t b = lo; b < hi; b++) {
        int64_t start = b * j->block;
        int64_t end = start + j->block < j->n ? start + j->block : j->n;
        j->partial[b] = j->fn(j->ctx, start, end);
    }
}

/* Σ over fixed blocks of fn(lo, hi), added in block order: independent of the thread count. */
static double reduce_blocked(ts_engine_t *e, int64_t n, block_fn fn, const void *ctx) {
    double partial[REDUCE_MAX_BLOCKS];
    int64_t block = (n + REDUCE_MAX_BLOCKS - 1) / REDUCE_MAX_BLOCKS;
    if (block < REDUCE_MIN_BLOCK)
        block = REDUCE_MIN_BLOCK;
    int64_t nblocks = (n + block - 1) / block;
    reduce_job_t job = {fn, ctx, n, block, partial};
    parallel(e, nblocks, 1, reduce_range, &job);
    double s = 0.0;
    for (int64_t b = 0; b < nblocks; b++)
        s += partial[b];
    return s;
}

/* ---- elementwise ----------------------------------------------------------------------- */

typedef struct {
    float *out;
    float *y;
    const float *a, *b, *x;
    float alpha, beta;
    int64_t S;
    const ts_cpu_vec_t *vec;
} ew_t;

int ts_cpu_memzero(ts_engine_t *e, void *p, size_t bytes) {
    memset(p, 0, bytes);
    return TS_OK;
}

static void fill_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    float *out = j->out, v = j->alpha;
    for (int64_t i = lo; i < hi; i++)
        out[i] = v;
}

int ts_cpu_fill(ts_engine_t *e, float *t, int64_t n, float v) {
    ew_t j = {.out = t, .alpha = v};
    parallel(e, n, GRAIN_ELEMS, fill_range, &j);
    return TS_OK;
}

static void axpy_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    j->vec->axpy(j->y + lo, j->alpha, j->x + lo, hi - lo);
}

int ts_cpu_axpy(ts_engine_t *e, float *y, float alpha, const float *x, int64_t n) {
    ew_t j = {.y = y, .x = x, .alpha = alpha, .vec = e->vec};
    parallel(e, n, GRAIN_ELEMS, axpy_range, &j);
    return TS_OK;
}

static void scale_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    float *y = j->y, alpha = j->alpha;
    for (int64_t i = lo; i < hi; i++)
        y[i] *= alpha;
}

int ts_cpu_scale(ts_engine_t *e, float *t, float alpha, int64_t n) {
    ew_t j = {.y = t, .alpha = alpha};
    parallel(e, n, GRAIN_ELEMS, scale_range, &j);
    return TS_OK;
}

static void affine_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    float *y = j->y, alpha = j->alpha, beta = j->beta;
    for (int64_t i = lo; i < hi; i++)
        y[i] = alpha * y[i] + beta;
}

int ts_cpu_affine(ts_engine_t *e, float *t, float alpha, float beta, int64_t n) {
    ew_t j = {.y = t, .alpha = alpha, .beta = beta};
    parallel(e, n, GRAIN_ELEMS, affine_range, &j);
    return TS_OK;
}

static void add_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    float *out = j->out;
    const float *a = j->a, *b = j->b;
    for (int64_t i = lo; i < hi; i++)
        out[i] = a[i] + b[i];
}

int ts_cpu_add(ts_engine_t *e, float *out, const float *a, const float *b, int64_t n) {
    ew_t j = {.out = out, .a = a, .b = b};
    parallel(e, n, GRAIN_ELEMS, add_range, &j);
    return TS_OK;
}

static void add_bcast_range(void *arg, int64_t lo, int64_t hi) {
    ew_t *j = arg;
    int64_t S = j->S;
    const float *b = j->b;
    for (int64_t r = lo; r < hi; r++) {
        float *o = j->out + r * S;
        const float *x = j->x + r * S;
        for (int64_t i = 0; i < S; i++)
            o[i] = x[i] + b[i];
    }
}

int ts_cpu_add_bcast_forward(ts_engine_t *e, float *out, const float *x, const float *b,
                             int64_t rows, int64_t S) {
    ew_t j = {.out = out, .x = x, .b = b, .S = S};
    parallel(e, rows, 1 + GRAIN_ELEMS / S, add_bcast_range, &j);
    return TS_OK;
}

typedef struct {
    float *out;
    const float *inp;
    int64_t rows, C;
} colsum_t;

/* out[c] (+)= Σ_r inp[r, c] for the columns [lo, hi); rows in order, so deterministic. */
static void colsum_range(void *arg, int64_t lo, int64_t hi) {
    colsum_t *j = arg;
    float *out = j->out;
    int64_t rows = j->rows, C = j->C;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = j->inp + r * C;
        for (int64_t c = lo; c < hi; c++)
            out[c] += row[c];
    }
}

int ts_cpu_add_bcast_backward(ts_engine_t *e, float *dx, float *db, const float *dout, int64_t rows,
                              int64_t S) {
    if (dx)
        ts_cpu_axpy(e, dx, 1.0f, dout, rows * S);
    if (db) {
        colsum_t j = {db, dout, rows, S};
        parallel(e, S, 1 + GRAIN_ELEMS / (rows + 1), colsum_range, &j);
    }
    return TS_OK;
}

int ts_cpu_sum_rows(ts_engine_t *e, float *out, const float *inp, int64_t rows, int64_t C) {
    memset(out, 0, (size_t)C * sizeof *out);
    colsum_t j = {out, inp, rows, C};
    parallel(e, C, 1 + GRAIN_ELEMS / (rows + 1), colsum_range, &j);
    return TS_OK;
}

/* ---- conversions and checks ------------------------------------------------------------ */

typedef struct {
    void *dst;
    const void *src;
    ts_dtype_t dt, st;
} conv_t;

static float load_elem(const void *p, ts_dtype_t dt, int64_t i) {
    switch (dt) {
    case TS_F16: return ts_f16_to_f32(((const uint16_t *)p)[i]);
    case TS_BF16: return ts_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void conv_range(void *arg, int64_t lo, int64_t hi) {
    conv_t *j = arg;
    if (j->dt == TS_F32) {
        float *d = j->dst;
        for (int64_t i = lo; i < hi; i++)
            d[i] = load_elem(j->src, j->st, i);
    } else if (j->dt == TS_F16) {
        uint16_t *d = j->dst;
        for (int64_t i = lo; i < hi; i++)
            d[i] = ts_f32_to_f16(load_elem(j->src, j->st, i));
    } else {
        uint16_t *d = j->dst;
        for (int64_t i = lo; i < hi; i++)
            d[i] = ts_f32_to_bf16(load_elem(j->src, j->st, i));
    }
}

int ts_cpu_convert(ts_engine_t *e, void *dst, ts_dtype_t dst_dtype, const void *src,
                   ts_dtype_t src_dtype, int64_t n) {
    conv_t j = {dst, src, dst_dtype, src_dtype};
    parallel(e, n, GRAIN_ELEMS, conv_range, &j);
    return TS_OK;
}

typedef struct {
    const void *t;
    ts_dtype_t dt;
} nonfinite_t;

static double nonfinite_block(const void *arg, int64_t lo, int64_t hi) {
    const nonfinite_t *j = arg;
    int64_t count = 0;
    for (int64_t i = lo; i < hi; i++)
        count += !ts_isfinite_f32(load_elem(j->t, j->dt, i));
    return (double)count;
}

int ts_cpu_count_nonfinite(ts_engine_t *e, const void *t, ts_dtype_t dtype, int64_t n,
                           int64_t *count) {
    nonfinite_t j = {t, dtype};
    *count = (int64_t)reduce_blocked(e, n, nonfinite_block, &j);
    return TS_OK;
}

/* ---- GEMM ------------------------------------------------------------------------------ */

/* The pool, not OpenBLAS, owns the cores: OpenBLAS runs single-threaded (see engine init) and
 * each worker calls cblas_sgemm on its own slice of the output. Small batched products
 * (attention: one per sample and head) split over the batch, single products over the longer of
 * M and N. OpenBLAS's own threads would otherwise spin (sched_yield) between calls and take
 * the cores from the pool's elementwise work. A linear layer's bias is added by the worker to its
 * own slice right after the slice's sgemm, while the slice is still in cache, instead of in a
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

/* out (M, N) = inp (M, K) · weightᵀ + bias, then act = gelu(out) when act is not NULL. */
static int linear_forward(ts_engine_t *e, float *out, float *act, const float *inp,
                          const float *weight, const float *bias, int64_t M, int64_t N, int64_t K,
                          int64_t group) {
    if (!gemm_dims_fit(M, N, K, K, K, N))
        return TS_ERANGE;
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

/* ---- row ops: LayerNorm, softmax ------------------------------------------------------- */

typedef struct {
    float *out, *mean, *rstd, *dinp;
    const float *inp, *dout, *y, *cmean, *crstd;
    int64_t C;
    float scale;
    int accumulate;
    /* LayerNorm + modulate: mod_out (B, T, C) from the chunks shift_idx, scale_idx of mod */
    float *mod_out;
    const float *mod;
    int64_t T, M;
    int shift_idx, scale_idx;
    const ts_cpu_vec_t *vec;
} row_t;

/* Rows lo..hi: per row the sum in element order, the mean, the sum of squared deviations in
 * element order, rstd, then (x − mean)·rstd — several rows' sums side by side (vec.c). With
 * mod_out, each row is modulated by its sample's shift and scale in the same pass. */
static void layernorm_fwd_range(void *arg, int64_t lo, int64_t hi) {
    row_t *j = arg;
    int64_t C = j->C;
    for (int64_t r = lo; r < hi;) {
        int64_t end = hi; /* rows of one sample: one shift and scale */
        const float *shift = NULL, *scale = NULL;
        if (j->mod_out) {
            int64_t b = r / j->T;
            end = (b + 1) * j->T < hi ? (b + 1) * j->T : hi;
            shift = j->mod + b * j->M * C + j->shift_idx * C;
            scale = j->mod + b * j->M * C + j->scale_idx * C;
        }
        j->vec->layernorm(j->out ? j->out + r * C : NULL, j->mean ? j->mean + r : NULL,
                          j->rstd ? j->rstd + r : NULL, j->mod_out ? j->mod_out + r * C : NULL,
                          j->inp + r * C, shift, scale, end - r, C);
        r = end;
    }
}

int ts_cpu_layernorm_forward(ts_engine_t *e, float *out, float *mean, float *rstd, const float *inp,
                             int64_t rows, int64_t C) {
    row_t j = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .C = C, .vec = e->vec};
    parallel(e, rows, 1 + GRAIN_ELEMS / (4 * C), layernorm_fwd_range, &j);
    return TS_OK;
}

int ts_cpu_layernorm_modulate_forward(ts_engine_t *e, float *ln, float *mean, float *rstd,
                                      float *out, const float *inp, const float *mod, int64_t B,
                                      int64_t T, int64_t C, int64_t M, int shift_idx,
                                      int scale_idx) {
    row_t j = {.out = ln,
               .mean = mean,
               .rstd = rstd,
               .inp = inp,
               .C = C,
               .mod_out = out,
               .mod = mod,
               .T = T,
               .M = M,
               .shift_idx = shift_idx,
               .scale_idx = scale_idx,
               .vec = e->vec};
    parallel(e, B * T, 1 + GRAIN_ELEMS / (4 * C), layernorm_fwd_range, &j);
    return TS_OK;
}

static void layernorm_bwd_range(void *arg, int64_t lo, int64_t hi) {
    row_t *j = arg;
    int64_t C = j->C;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->inp + r * C;
        const float *dy = j->dout + r * C;
        float *dx = j->dinp + r * C;
        float m = j->cmean[r], rs = j->crstd[r];
        float sdy = 0.0f, sdyx = 0.0f;
        for (int64_t i = 0; i < C; i++) {
            float xhat = (x[i] - m) * rs;
            sdy += dy[i];
            sdyx += dy[i] * xhat;
        }
        float mdy = sdy / (float)C, mdyx = sdyx / (float)C;
        for (int64_t i = 0; i < C; i++)
            dx[i] += ts_ln_grad(dy[i], (x[i] - m) * rs, rs, mdy, mdyx);
    }
}

int ts_cpu_layernorm_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                              const float *mean, const float *rstd, int64_t rows, int64_t C) {
    row_t j = {.dinp = dinp, .dout = dout, .inp = inp, .cmean = mean, .crstd = rstd, .C = C};
    parallel(e, rows, 1 + GRAIN_ELEMS / (4 * C), layernorm_bwd_range, &j);
    return TS_OK;
}

/* s[k] = Σ_i rows[k·C + i] for k < n ≤ SUM_ROWS, each sum in its row's element order (the order
 * is the result's rounding). One row's sum is a chain of dependent additions; a full block runs
 * SUM_ROWS chains side by side. */
static void row_sums(float *s, const float *rows, int64_t n, int64_t C) {
    for (int64_t k = 0; k < n; k++)
        s[k] = 0.0f;
    if (n == SUM_ROWS) {
        for (int64_t i = 0; i < C; i++)
            for (int k = 0; k < SUM_ROWS; k++)
                s[k] += rows[k * C + i];
    } else {
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < C; i++)
                s[k] += rows[k * C + i];
    }
}

/* Blocks of SUM_ROWS rows: each row's max and e^(x − max), then the block's row sums, then each
 * row scaled by 1 / its sum. Per row the arithmetic is that of the plain loop: max, e^(x − max),
 * the sum in element order, × 1/sum. */
static void softmax_fwd_range(void *arg, int64_t lo, int64_t hi) {
    row_t *j = arg;
    int64_t C = j->C;
    for (int64_t r0 = lo; r0 < hi; r0 += SUM_ROWS) {
        int64_t n = hi - r0 < SUM_ROWS ? hi - r0 : SUM_ROWS;
        float *o = j->out + r0 * C;
        for (int64_t k = 0; k < n; k++) {
            const float *x = j->inp + (r0 + k) * C;
            float *ok = o + k * C;
            float mx = ts_row_max(x, C);
            for (int64_t i = 0; i < C; i++)
                ok[i] = ts_expf(x[i] - mx);
        }
        float s[SUM_ROWS];
        row_sums(s, o, n, C);
        for (int64_t k = 0; k < n; k++) {
            float *ok = o + k * C;
            float inv = 1.0f / s[k];
            for (int64_t i = 0; i < C; i++)
                ok[i] *= inv;
        }
    }
}

int ts_cpu_softmax_forward(ts_engine_t *e, float *out, const float *inp, int64_t rows, int64_t C) {
    row_t j = {.out = out, .inp = inp, .C = C};
    parallel(e, rows, 1 + ACT_GRAIN / C, softmax_fwd_range, &j);
    return TS_OK;
}

static void softmax_bwd_range(void *arg, int64_t lo, int64_t hi) {
    row_t *j = arg;
    int64_t C = j->C;
    for (int64_t r = lo; r < hi; r++) {
        const float *y = j->y + r * C;
        const float *dy = j->dout + r * C;
        float *dx = j->dinp + r * C;
        float dot = 0.0f;
        for (int64_t i = 0; i < C; i++)
            dot += dy[i] * y[i];
        if (j->accumulate)
            for (int64_t i = 0; i < C; i++)
                dx[i] += j->scale * ts_softmax_grad(y[i], dy[i], dot);
        else
            for (int64_t i = 0; i < C; i++)
                dx[i] = j->scale * ts_softmax_grad(y[i], dy[i], dot);
    }
}

int ts_cpu_softmax_backward(ts_engine_t *e, float *dinp, const float *dout, const float *out,
                            int64_t rows, int64_t C, float scale, int accumulate) {
    row_t j = {
        .dinp = dinp, .dout = dout, .y = out, .C = C, .scale = scale, .accumulate = accumulate};
    parallel(e, rows, 1 + GRAIN_ELEMS / (4 * C), softmax_bwd_range, &j);
    return TS_OK;
}

/* ---- activations ----------------------------------------------------------------------- */

typedef struct {
    float *out; /* the output; dinp in a backward */
    const float *inp, *dout;
    const ts_cpu_vec_t *vec;
} act_t;

static void gelu_fwd_range(void *arg, int64_t lo, int64_t hi) {
    act_t *j = arg;
    j->vec->gelu(j->out + lo, j->inp + lo, hi - lo);
}

static void gelu_bwd_range(void *arg, int64_t lo, int64_t hi) {
    act_t *j = arg;
    j->vec->gelu_backward(j->out + lo, j->dout + lo, j->inp + lo, hi - lo);
}

static void silu_fwd_range(void *arg, int64_t lo, int64_t hi) {
    act_t *j = arg;
    float *out = j->out;
    const float *inp = j->inp;
    for (int64_t i = lo; i < hi; i++)
        out[i] = ts_silu(inp[i]);
}

static void silu_bwd_range(void *arg, int64_t lo, int64_t hi) {
    act_t *j = arg;
    float *dinp = j->out;
    const float *dout = j->dout, *inp = j->inp;
    for (int64_t i = lo; i < hi; i++)
        dinp[i] += dout[i] * ts_silu_grad(inp[i]);
}

/* Vectorised, GELU and SiLU still cost several times a plain load/store per element: a smaller
 * grain (ACT_GRAIN). */
int ts_cpu_gelu_forward(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    act_t j = {out, inp, NULL, e->vec};
    parallel(e, n, ACT_GRAIN, gelu_fwd_range, &j);
    return TS_OK;
}

int ts_cpu_gelu_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                         int64_t n) {
    act_t j = {dinp, inp, dout, e->vec};
    parallel(e, n, ACT_GRAIN, gelu_bwd_range, &j);
    return TS_OK;
}

int ts_cpu_silu_forward(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    act_t j = {out, inp, NULL};
    parallel(e, n, ACT_GRAIN, silu_fwd_range, &j);
    return TS_OK;
}

int ts_cpu_silu_backward(ts_engine_t *e, float *dinp, const float *dout, const float *inp,
                         int64_t n) {
    act_t j = {dinp, inp, dout};
    parallel(e, n, ACT_GRAIN, silu_bwd_range, &j);
    return TS_OK;
}

/* ---- adaLN: modulate and gated residual ------------------------------------------------ */

typedef struct {
    float *out, *dx, *dmod, *dres, *dy;
    const float *x, *mod, *dout, *res, *y;
    int64_t T, C, M;
    int i0, i1; /* chunk indices: shift/scale, or gate */
    const ts_cpu_vec_t *vec;
} ada_t;

/* The rows [r, end) of (B·T, C) that belong to r's sample, end ≤ hi; *b = that sample. */
static int64_t sample_end(const ada_t *j, int64_t r, int64_t hi, int64_t *b) {
    *b = r / j->T;
    return (*b + 1) * j->T < hi ? (*b + 1) * j->T : hi;
}

static void modulate_fwd_range(void *arg, int64_t lo, int64_t hi) {
    ada_t *j = arg;
    int64_t C = j->C, b;
    for (int64_t r = lo, end; r < hi; r = end) {
        end = sample_end(j, r, hi, &b);
        const float *shift = j->mod + b * j->M * C + j->i0 * C;
        const float *scale = j->mod + b * j->M * C + j->i1 * C;
        j->vec->modulate(j->out + r * C, j->x + r * C, shift, scale, end - r, C);
    }
}

int ts_cpu_modulate_forward(ts_engine_t *e, float *out, const float *x, const float *mod, int64_t B,
                            int64_t T, int64_t C, int64_t M, int shift_idx, int scale_idx) {
    ada_t j = {.out = out,
               .x = x,
               .mod = mod,
               .T = T,
               .C = C,
               .M = M,
               .i0 = shift_idx,
               .i1 = scale_idx,
               .vec = e->vec};
    parallel(e, B * T, 1 + GRAIN_ELEMS / C, modulate_fwd_range, &j);
    return TS_OK;
}

/* One sample per item: the dmod rows of a sample are written by one thread only. */
static void modulate_bwd_range(void *arg, int64_t lo, int64_t hi) {
    ada_t *j = arg;
    int64_t T = j->T, C = j->C;
    for (int64_t b = lo; b < hi; b++) {
        const float *scale = j->mod + b * j->M * C + j->i1 * C;
        float *dshift = j->dmod ? j->dmod + b * j->M * C + j->i0 * C : NULL;
        float *dscale = j->dmod ? j->dmod + b * j->M * C + j->i1 * C : NULL;
        for (int64_t t = 0; t < T; t++) {
            const float *dy = j->dout + (b * T + t) * C;
            const float *x = j->x + (b * T + t) * C;
            if (j->dx) {
                float *dx = j->dx + (b * T + t) * C;
                for (int64_t c = 0; c < C; c++)
                    dx[c] += dy[c] * (1.0f + scale[c]);
            }
            if (dshift)
                for (int64_t c = 0; c < C; c++) {
                    dshift[c] += dy[c];
                    dscale[c] += dy[c] * x[c];
                }
        }
    }
}

int ts_cpu_modulate_backward(ts_engine_t *e, float *dx, float *dmod, const float *dout,
                             const float *x, const float *mod, int64_t B, int64_t T, int64_t C,
                             int64_t M, int shift_idx, int scale_idx) {
    ada_t j = {.dx = dx,
               .dmod = dmod,
               .dout = dout,
               .x = x,
               .mod = mod,
               .T = T,
               .C = C,
               .M = M,
               .i0 = shift_idx,
               .i1 = scale_idx};
    parallel(e, B, 1, modulate_bwd_range, &j);
    return TS_OK;
}

static void gate_fwd_range(void *arg, int64_t lo, int64_t hi) {
    ada_t *j = arg;
    int64_t C = j->C, b;
    for (int64_t r = lo, end; r < hi; r = end) {
        end = sample_end(j, r, hi, &b);
        const float *gate = j->mod + b * j->M * C + j->i0 * C;
        j->vec->gate_residual(j->out + r * C, j->res + r * C, j->y + r * C, gate, end - r, C);
    }
}

int ts_cpu_gate_residual_forward(ts_engine_t *e, float *out, const float *res, const float *y,
                                 const float *mod, int64_t B, int64_t T, int64_t C, int64_t M,
                                 int gate_idx) {
    ada_t j = {.out = out,
               .res = res,
               .y = y,
               .mod = mod,
               .T = T,
               .C = C,
               .M = M,
               .i0 = gate_idx,
               .vec = e->vec};
    parallel(e, B * T, 1 + GRAIN_ELEMS / C, gate_fwd_range, &j);
    return TS_OK;
}

static void gate_bwd_range(void *arg, int64_t lo, int64_t hi) {
    ada_t *j = arg;
    int64_t T = j->T, C = j->C;
    for (int64_t b = lo; b < hi; b++) {
        const float *gate = j->mod + b * j->M * C + j->i0 * C;
        float *dgate = j->dmod ? j->dmod + b * j->M * C + j->i0 * C : NULL;
        for (int64_t t = 0; t < T; t++) {
            int64_t off = (b * T + t) * C;
            const float *dout = j->dout + off, *y = j->y + off;
            float *dres = j->dres ? j->dres + off : NULL, *dy = j->dy ? j->dy + off : NULL;
            if (dres)
                for (int64_t c = 0; c < C; c++)
                    dres[c] += dout[c];
            if (dy)
                for (int64_t c = 0; c < C; c++)
                    dy[c] += gate[c] * dout[c];
            if (dgate)
                for (int64_t c = 0; c < C; c++)
                    dgate[c] += dout[c] * y[c];
        }
    }
}

int ts_cpu_gate_residual_backward(ts_engine_t *e, float *dres, float *dy, float *dmod,
                                  const float *dout, const float *y, const float *mod, int64_t B,
                                  int64_t T, int64_t C, int64_t M, int gate_idx) {
    ada_t j = {.dres = dres,
               .dy = dy,
               .dmod = dmod,
               .dout = dout,
               .y = y,
               .mod = mod,
               .T = T,
               .C = C,
               .M = M,
               .i0 = gate_idx};
    parallel(e, B, 1, gate_bwd_range, &j);
    return TS_OK;
}

/* ---- embeddings ------------------------------------------------------------------------ */

int ts_cpu_timestep_embedding_forward(ts_engine_t *e, float *out, const float *t, int64_t B,
                                      int64_t D, float scale) {
    int half = (int)(D / 2);
    for (int64_t b = 0; b < B; b++) {
        float tt = scale * t[b];
        float *o = out + b * D;
        for (int i = 0; i < half; i++) {
            float arg = tt * ts_timestep_freq(i, half);
            o[i] = cosf(arg);
            o[half + i] = sinf(arg);
        }
        if (D & 1)
            o[D - 1] = 0.0f;
    }
    return TS_OK;
}

int ts_cpu_timestep_embedding_backward(ts_engine_t *e, float *dt, const float *dout, const float *t,
                                       int64_t B, int64_t D, float scale) {
    int half = (int)(D / 2);
    for (int64_t b = 0; b < B; b++) {
        float tt = scale * t[b];
        const float *g = dout + b * D;
        float acc = 0.0f;
        for (int i = 0; i < half; i++) {
            float f = ts_timestep_freq(i, half);
            float arg = tt * f;
            acc += (-g[i] * sinf(arg) + g[half + i] * cosf(arg)) * f;
        }
        dt[b] += acc * scale;
    }
    return TS_OK;
}

int ts_cpu_embedding_forward(ts_engine_t *e, float *out, const float *table, const int32_t *ids,
                             int64_t B, int64_t D) {
    for (int64_t b = 0; b < B; b++)
        memcpy(out + b * D, table + (int64_t)ids[b] * D, (size_t)D * sizeof *out);
    return TS_OK;
}

int ts_cpu_embedding_backward(ts_engine_t *e, float *dtable, const float *dout, const int32_t *ids,
                              int64_t B, int64_t D) {
    for (int64_t b = 0; b < B; b++) {
        float *row = dtable + (int64_t)ids[b] * D;
        for (int64_t i = 0; i < D; i++)
            row[i] += dout[b * D + i];
    }
    return TS_OK;
}

/* ---- patches --------------------------------------------------------------------------- */

typedef struct {
    float *dst;
    const float *src;
    int64_t C, H, W, p;
    int accumulate;
} patch_t;

/* Item = one token (b, gy, gx). Both directions visit the same (pixel, feature) pairs, so one
 * loop serves four ops: `to_tokens` picks the direction, `cfirst` the feature order. */
static void patch_move(patch_t *j, int64_t lo, int64_t hi, int to_tokens, int cfirst) {
    int64_t C = j->C, H = j->H, W = j->W, p = j->p;
    int64_t gw = W / p, T = (H / p) * gw, F = C * p * p;
    for (int64_t bt = lo; bt < hi; bt++) {
        int64_t b = bt / T, t = bt % T, gy = t / gw, gx = t % gw;
        for (int64_t c = 0; c < C; c++)
            for (int64_t py = 0; py < p; py++)
                for (int64_t px = 0; px < p; px++) {
                    int64_t f = cfirst ? (c * p + py) * p + px : (py * p + px) * C + c;
                    int64_t tok = bt * F + f;
                    int64_t pix = ((b * C + c) * H + gy * p + py) * W + gx * p + px;
                    int64_t d = to_tokens ? tok : pix, s = to_tokens ? pix : tok;
                    if (j->accumulate)
                        j->dst[d] += j->src[s];
                    else
                        j->dst[d] = j->src[s];
                }
    }
}

static void patchify_range(void *arg, int64_t lo, int64_t hi) { patch_move(arg, lo, hi, 1, 1); }
static void patchify_bwd_range(void *arg, int64_t lo, int64_t hi) { patch_move(arg, lo, hi, 0, 1); }
static void unpatchify_range(void *arg, int64_t lo, int64_t hi) { patch_move(arg, lo, hi, 0, 0); }
static void unpatchify_bwd_range(void *arg, int64_t lo, int64_t hi) {
    patch_move(arg, lo, hi, 1, 0);
}

static int64_t n_tokens(int64_t B, int64_t H, int64_t W, int64_t p) {
    return B * (H / p) * (W / p);
}

int ts_cpu_patchify_forward(ts_engine_t *e, float *out, const float *img, int64_t B, int64_t C,
                            int64_t H, int64_t W, int64_t p) {
    patch_t j = {out, img, C, H, W, p, 0};
    parallel(e, n_tokens(B, H, W, p), 1 + GRAIN_ELEMS / (C * p * p), patchify_range, &j);
    return TS_OK;
}

int ts_cpu_patchify_backward(ts_engine_t *e, float *dimg, const float *dout, int64_t B, int64_t C,
                             int64_t H, int64_t W, int64_t p) {
    patch_t j = {dimg, dout, C, H, W, p, 1};
    parallel(e, n_tokens(B, H, W, p), 1 + GRAIN_ELEMS / (C * p * p), patchify_bwd_range, &j);
    return TS_OK;
}

int ts_cpu_unpatchify_forward(ts_engine_t *e, float *img, const float *tok, int64_t B, int64_t C,
                              int64_t H, int64_t W, int64_t p) {
    patch_t j = {img, tok, C, H, W, p, 0};
    parallel(e, n_tokens(B, H, W, p), 1 + GRAIN_ELEMS / (C * p * p), unpatchify_range, &j);
    return TS_OK;
}

int ts_cpu_unpatchify_backward(ts_engine_t *e, float *dtok, const float *dimg, int64_t B, int64_t C,
                               int64_t H, int64_t W, int64_t p) {
    patch_t j = {dtok, dimg, C, H, W, p, 1};
    parallel(e, n_tokens(B, H, W, p), 1 + GRAIN_ELEMS / (C * p * p), unpatchify_bwd_range, &j);
    return TS_OK;
}

/* ---- reductions and losses ------------------------------------------------------------- */

typedef struct {
    const float *a, *b;
} pair_t;

static double sum_block(const void *arg, int64_t lo, int64_t hi) {
    const pair_t *j = arg;
    double s = 0.0;
    for (int64_t i = lo; i < hi; i++)
        s += j->a[i];
    return s;
}

static double sumsq_block(const void *arg, int64_t lo, int64_t hi) {
    const pair_t *j = arg;
    double s = 0.0;
    for (int64_t i = lo; i < hi; i++)
        s += (double)j->a[i] * j->a[i];
    return s;
}

static double sqdiff_block(const void *arg, int64_t lo, int64_t hi) {
    const pair_t *j = arg;
    double s = 0.0;
    for (int64_t i = lo; i < hi; i++) {
        double d = (double)j->a[i] - j->b[i];
        s += d * d;
    }
    return s;
}

int ts_cpu_sum(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    pair_t j = {inp, NULL};
    out[0] = (float)reduce_blocked(e, n, sum_block, &j);
    return TS_OK;
}

int ts_cpu_sumsq(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    pair_t j = {inp, NULL};
    out[0] = (float)reduce_blocked(e, n, sumsq_block, &j);
    return TS_OK;
}

int ts_cpu_add_scaled_scalar(ts_engine_t *e, float *dinp, const float *scalar, float mult,
                             int64_t n) {
    float add = scalar[0] * mult;
    for (int64_t i = 0; i < n; i++)
        dinp[i] += add;
    return TS_OK;
}

int ts_cpu_mse_forward(ts_engine_t *e, float *loss, const float *pred, const float *target,
                       int64_t n) {
    pair_t j = {pred, target};
    loss[0] = (float)(reduce_blocked(e, n, sqdiff_block, &j) / (double)n);
    return TS_OK;
}

typedef struct {
    float *d;
    const float *p, *t;
    float k;
} mse_t;

static void mse_bwd_range(void *arg, int64_t lo, int64_t hi) {
    mse_t *j = arg;
    float *d = j->d, k = j->k;
    const float *p = j->p, *t = j->t;
    for (int64_t i = lo; i < hi; i++)
        d[i] += k * (p[i] - t[i]);
}

int ts_cpu_mse_backward(ts_engine_t *e, float *dpred, float dloss, const float *pred,
                        const float *target, int64_t n) {
    mse_t j = {dpred, pred, target, (float)(2.0 * dloss / (double)n)};
    parallel(e, n, GRAIN_ELEMS, mse_bwd_range, &j);
    return TS_OK;
}

/* ---- classification -------------------------------------------------------------------- */

typedef struct {
    float *d;
    const float *z;
    const int32_t *labels;
    int64_t K, T, C;
    float scale;
} xent_t;

static double xent_block(const void *arg, int64_t lo, int64_t hi) {
    const xent_t *j = arg;
    double s = 0.0;
    for (int64_t b = lo; b < hi; b++)
        s += ts_xent_row(j->z + b * j->K, j->K, j->labels[b]);
    return s;
}

int ts_cpu_cross_entropy_forward(ts_engine_t *e, float *loss, const float *logits,
                                 const int32_t *labels, int64_t B, int64_t K) {
    xent_t j = {.z = logits, .labels = labels, .K = K};
    loss[0] = (float)(reduce_blocked(e, B, xent_block, &j) / (double)B);
    return TS_OK;
}

static void xent_bwd_range(void *arg, int64_t lo, int64_t hi) {
    xent_t *j = arg;
    for (int64_t b = lo; b < hi; b++)
        ts_xent_grad_row(j->d + b * j->K, j->z + b * j->K, j->K, j->labels[b], j->scale);
}

int ts_cpu_cross_entropy_backward(ts_engine_t *e, float *dlogits, float scale, const float *logits,
                                  const int32_t *labels, int64_t B, int64_t K) {
    xent_t j = {.d = dlogits, .z = logits, .labels = labels, .K = K, .scale = scale};
    parallel(e, B, 1 + GRAIN_ELEMS / (4 * K), xent_bwd_range, &j);
    return TS_OK;
}

/* rows are samples: out (B, C) from x (B, T, C) */
static void mean_tokens_range(void *arg, int64_t lo, int64_t hi) {
    xent_t *j = arg;
    for (int64_t b = lo; b < hi; b++)
        for (int64_t c = 0; c < j->C; c++)
            j->d[b * j->C + c] = ts_mean_tokens_elem(j->z + b * j->T * j->C + c, j->T, j->C);
}

int ts_cpu_mean_tokens_forward(ts_engine_t *e, float *out, const float *x, int64_t B, int64_t T,
                               int64_t C) {
    xent_t j = {.d = out, .z = x, .T = T, .C = C};
    parallel(e, B, 1 + GRAIN_ELEMS / (T * C), mean_tokens_range, &j);
    return TS_OK;
}

/* rows are (sample, token) pairs: dx (B·T, C) += dout (B, C) / T */
static void mean_tokens_bwd_range(void *arg, int64_t lo, int64_t hi) {
    xent_t *j = arg;
    int64_t T = j->T, C = j->C;
    for (int64_t r = lo; r < hi; r++) {
        const float *g = j->z + (r / T) * C;
        float *d = j->d + r * C;
        for (int64_t c = 0; c < C; c++)
            d[c] += g[c] / (float)T;
    }
}

int ts_cpu_mean_tokens_backward(ts_engine_t *e, float *dx, const float *dout, int64_t B, int64_t T,
                                int64_t C) {
    xent_t j = {.d = dx, .z = dout, .T = T, .C = C};
    parallel(e, B * T, 1 + GRAIN_ELEMS / C, mean_tokens_bwd_range, &j);
    return TS_OK;
}

/* ---- row gather / scatter ------------------------------------------------------------- */

int ts_cpu_gather_rows(ts_engine_t *e, float *out, const float *inp, const int32_t *idx, int64_t m,
                       int64_t S) {
    for (int64_t i = 0; i < m; i++)
        memcpy(out + i * S, inp + (int64_t)idx[i] * S, (size_t)S * sizeof *out);
    return TS_OK;
}

int ts_cpu_scatter_axpy_rows(ts_engine_t *e, float *out, const float *inp, const int32_t *idx,
                             const float *w, int64_t m, int64_t S) {
    for (int64_t i = 0; i < m; i++) {
        float *o = out + (int64_t)idx[i] * S;
        const float *x = inp + i * S;
        for (int64_t c = 0; c < S; c++)
            o[c] += w[i] * x[c];
    }
    return TS_OK;
}

/* ---- flow matching ------------------------------------------------------------------- */

int ts_cpu_flow_interp(ts_engine_t *e, float *xt, float *target, const float *x0, const float *eps,
                       const float *t, int64_t B, int64_t S) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = b * S; i < (b + 1) * S; i++) {
            xt[i] = ts_flow_xt(x0[i], eps[i], t[b]);
            target[i] = eps[i] - x0[i];
        }
    return TS_OK;
}

/* ---- optimiser ------------------------------------------------------------------------- */

typedef struct {
    float *param, *m, *v;
    const float *grad;
    float lr, beta1, beta2, eps, wd, bc1, sqrt_bc2, grad_scale;
    const ts_cpu_vec_t *vec;
} adamw_t;

static void adamw_range(void *arg, int64_t lo, int64_t hi) {
    adamw_t *j = arg;
    j->vec->adamw(j->param + lo, j->grad + lo, j->m + lo, j->v + lo, hi - lo, j->lr, j->beta1,
                  j->beta2, j->eps, j->wd, j->bc1, j->sqrt_bc2, j->grad_scale);
}

int ts_cpu_adamw(ts_engine_t *e, float *param, const float *grad, float *m, float *v, int64_t n,
                 float lr, float beta1, float beta2, float eps, float wd, float bc1, float sqrt_bc2,
                 float grad_scale) {
    adamw_t j = {param, m, v, grad, lr, beta1, beta2, eps, wd, bc1, sqrt_bc2, grad_scale, e->vec};
    parallel(e, n, GRAIN_ELEMS / 4, adamw_range, &j);
    return TS_OK;
}

typedef struct {
    float *ema;
    const float *param;
    float decay;
    const ts_cpu_vec_t *vec;
} ema_t;

static void ema_range(void *arg, int64_t lo, int64_t hi) {
    ema_t *j = arg;
    j->vec->ema(j->ema + lo, j->param + lo, hi - lo, j->decay);
}

int ts_cpu_ema(ts_engine_t *e, float *ema, const float *param, int64_t n, float decay) {
    ema_t j = {ema, param, decay, e->vec};
    parallel(e, n, GRAIN_ELEMS, ema_range, &j);
    return TS_OK;
}

/* ---- random numbers -------------------------------------------------------------------- */

typedef struct {
    float *out;
    uint64_t seed, offset;
} rng_t;

static void uniform_range(void *arg, int64_t lo, int64_t hi) {
    rng_t *j = arg;
    for (int64_t i = lo; i < hi; i++)
        j->out[i] = ts_rng_uniform_at(j->seed, j->offset + (uint64_t)i);
}

static void normal_range(void *arg, int64_t lo, int64_t hi) {
    rng_t *j = arg;
    for (int64_t i = lo; i < hi; i++)
        j->out[i] = ts_rng_normal_at(j->seed, j->offset + (uint64_t)i);
}

int ts_cpu_rng_uniform(ts_engine_t *e, float *out, int64_t n, uint64_t seed, uint64_t offset) {
    rng_t j = {out, seed, offset};
    parallel(e, n, GRAIN_ELEMS / 16, uniform_range, &j);
    return TS_OK;
}

int ts_cpu_rng_normal(ts_engine_t *e, float *out, int64_t n, uint64_t seed, uint64_t offset) {
    rng_t j = {out, seed, offset};
    parallel(e, n, GRAIN_ELEMS / 16, normal_range, &j);
    return TS_OK;
}
