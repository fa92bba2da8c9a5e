/*
 * cpu_ops.c — the CPU backend (the ts_cpu_* of kernels/backend.h): the engine, and the ops of
 * conversions, embeddings, patches, reductions and losses, the optimiser and random numbers.
 * The other ops live beside it, a file per kind: cpu_elem.c (elementwise, activations),
 * cpu_rows.c (LayerNorm, softmax, adaLN), cpu_gemm.c (products and linear layers),
 * cpu_attention.c (fused attention), cpu_bf16.c and cpu_f16.c (products in bf16 and f16),
 * cpu_image.c (the VAE's image ops); cpu_internal.h holds what they share.
 *
 * GEMMs go to OpenBLAS (cblas_sgemm, cpu_gemm.c). Everything else is a loop over elements or rows
 * that calls the shared formulas of kernels/math.h, split over the engine's worker pool. The inner
 * loops are plain `for` loops over restrict-free contiguous arrays so gcc vectorises them at -O3.
 * A loop reads the job's pointers into locals first: the build has -fno-strict-aliasing, so a
 * float store could change the job struct as far as gcc knows, and a pointer read from the struct
 * inside the loop is read again every iteration, which stops vectorisation.
 *
 * Determinism: every result is independent of the thread count, except a GEMM's (cpu_gemm.c).
 * Elementwise and row ops write disjoint outputs; reductions sum fixed-size blocks (not per-thread
 * chunks) into partials that are then added in block order, in double.
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/vec.h"
#include "kernels/math.h"

/* Reductions: at most this many blocks, each at least REDUCE_MIN_BLOCK elements. */
#define REDUCE_MAX_BLOCKS 256
#define REDUCE_MIN_BLOCK 4096

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
    free(e->lin_packed);
    e->lin_packed = NULL;
    e->lin_cap = 0;
}

/* ---- helpers --------------------------------------------------------------------------- */

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
