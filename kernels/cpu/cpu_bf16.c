/*
 * cpu_bf16.c — the CPU backend's bf16 products: ts_cpu_gemm_bf16 and ts_cpu_linear_forward_bf16,
 * through oneDNN's matmul primitive (bf16 inputs, fp32 accumulation, fp32 output).
 *
 * What it is: the inference path of `--precision bf16`. A linear layer's weight arrives already
 * in bf16 (converted once, when the model's precision is set: model/dit.c); its input, and both
 * operands of a gemm, are fp32 in memory and rounded to bf16 here (round to nearest even, as
 * ts_convert), slice by slice, into per-slice scratch. What it is not: a bf16 tensor type for the
 * rest of the ops — LayerNorm, softmax, the residual stream and every elementwise op stay fp32.
 *
 * Threading. oneDNN (Debian's build) runs on OpenMP. Two ways were measured (docs/benchmarks.md):
 *   slices  (default): like the OpenBLAS path, the pool cuts the output into one slice per
 *           worker and each worker runs a single-threaded primitive on its slice; OpenMP is held
 *           to one thread in every worker, so no OpenMP thread spins beside the pool.
 *   onednn  (TESSERA_BF16_THREADS=onednn): the caller runs one primitive over the whole product
 *           on oneDNN's own OpenMP team of the engine's thread count.
 * Primitives are created on the caller before any worker runs (so the cache needs no lock) and
 * kept per shape for the engine's life; each slice has its own stream, scratch and oneDNN
 * scratchpad (user-managed), so slices never share mutable state.
 *
 * Without oneDNN (configure found no libdnnl-dev) the functions at the bottom answer
 * TS_ENOTSUP, and ts_cpu_bf16_check says why.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/pool.h"
#include "kernels/math.h"

#ifdef TESSERA_HAVE_DNNL

#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>

/* libgomp's; oneDNN's OpenMP team for a primitive is this thread's setting at creation. */
extern void omp_set_num_threads(int n);

/* A product is cut into slices only past this many multiply-adds (as GEMM_WAKE_MACS of the
 * OpenBLAS path: below it a woken thread costs more than it saves), and never into slices of
 * fewer than SLICE_MIN rows or columns. */
#define BF16_WAKE_MACS 4194304.0
#define SLICE_MIN 32

/* The shape of one primitive: C (batch, M, N), row stride ldc, batch stride sc, = alpha ·
 * A (batch, M, K) bf16 · B, B (batch, K, N) read from bf16 stored as (N, K) rows of stride
 * ldb when b_nk, else as (K, N) rows of stride ldb; + bias (N) when bias. A is dense unless lda
 * is set: then stored as (M, K) rows of stride lda, or — a_t — as (K, M) rows of stride lda (the
 * backward's doutᵀ, read in place). accum: C += the product (oneDNN's sum post-op) instead of
 * C = the product (the backward's gradients accumulate). */
typedef struct {
    int64_t batch, M, N, K, ldb, ldc, sc, lda;
    int b_nk, bias, team, a_t, accum;
    float alpha;
} prim_key_t;

typedef struct {
    prim_key_t key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src, wei, dst, bias, pad;
    size_t pad_bytes;
} prim_t;

/* One slice's private state: its stream and grow-only scratch. */
typedef struct {
    dnnl_stream_t stream;
    uint16_t *a, *b; /* bf16 copies of this slice's operands */
    size_t a_cap, b_cap;
    float *c; /* dense fp32 result when C is not written in place */
    size_t c_cap;
    void *pad; /* oneDNN's scratchpad */
    size_t pad_cap;
} slot_t;

struct ts_bf16_ctx {
    dnnl_engine_t eng;
    int team;   /* 1: oneDNN's own threads over whole products; 0: one slice per worker */
    int nslots; /* the engine's thread count */
    slot_t *slots;
    prim_t *prims;
    int nprims, cap;
    uint16_t *g16, *x16; /* the linear backward's dout and inp in bf16, shared by its slices */
    size_t g16_cap, x16_cap;
};

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2-VNNI";
    case dnnl_cpu_isa_avx512_core: return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AMX";
    default: return "no vector ISA oneDNN uses";
    }
}

/* The CPU has native bf16 dot products (AVX-512 BF16, or AMX beyond it): anything less runs
 * oneDNN's emulation, slower than fp32, so bf16 is refused there. */
static int isa_has_bf16(dnnl_cpu_isa_t isa) {
    return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

int ts_cpu_bf16_check(ts_engine_t *e, char *why, size_t why_len) {
    (void)e;
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (isa_has_bf16(isa))
        return TS_OK;
    if (why && why_len)
        snprintf(why, why_len,
                 "bf16 needs a CPU with AVX-512 BF16 instructions; oneDNN finds %s on this one "
                 "(use --precision f32)",
                 isa_name(isa));
    return TS_ENOTSUP;
}

static void slot_free(slot_t *s) {
    if (s->stream)
        dnnl_stream_destroy(s->stream);
    free(s->a);
    free(s->b);
    free(s->c);
    free(s->pad);
}

void ts_cpu_bf16_free(ts_engine_t *e) {
    ts_bf16_ctx_t *x = e->bf16;
    if (!x)
        return;
    for (int i = 0; i < x->nprims; i++)
        dnnl_primitive_destroy(x->prims[i].prim);
    for (int i = 0; i < x->nslots; i++)
        slot_free(&x->slots[i]);
    free(x->prims);
    free(x->slots);
    free(x->g16);
    free(x->x16);
    if (x->eng)
        dnnl_engine_destroy(x->eng);
    free(x);
    e->bf16 = NULL;
}

/* The engine's oneDNN state, made on first use. */
static int ctx_get(ts_engine_t *e, ts_bf16_ctx_t **out) {
    if (e->bf16) {
        *out = e->bf16;
        return TS_OK;
    }
    TS_TRY(ts_cpu_bf16_check(e, NULL, 0));
    ts_bf16_ctx_t *x = calloc(1, sizeof *x);
    if (!x)
        return TS_ENOMEM;
    e->bf16 = x;
    const char *mode = getenv("TESSERA_BF16_THREADS");
    x->team = mode && strcmp(mode, "onednn") == 0;
    x->nslots = e->threads > 0 ? e->threads : 1;
    x->slots = calloc((size_t)x->nslots, sizeof *x->slots);
    int rc = x->slots ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK && dnnl_engine_create(&x->eng, dnnl_cpu, 0) != dnnl_success)
        rc = TS_ENOTSUP;
    for (int i = 0; i < x->nslots && rc == TS_OK; i++)
        if (dnnl_stream_create(&x->slots[i].stream, x->eng, dnnl_stream_default_flags) !=
            dnnl_success)
            rc = TS_ENOMEM;
    if (rc != TS_OK) {
        ts_cpu_bf16_free(e);
        return rc;
    }
    *out = x;
    return TS_OK;
}

/* Grows a scratch buffer to at least bytes (contents not kept). */
static int grow(void **p, size_t *cap, size_t bytes) {
    if (*cap >= bytes)
        return TS_OK;
    free(*p);
    *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    *cap = *p ? bytes : 0;
    return *p ? TS_OK : TS_ENOMEM;
}

static int md(dnnl_memory_desc_t *d, int nd, const int64_t *dims, dnnl_data_type_t dt,
              const int64_t *strides) {
    dnnl_dims_t dd = {0}, ds = {0}; /* the API takes full-size arrays */
    memcpy(dd, dims, (size_t)nd * sizeof *dims);
    memcpy(ds, strides, (size_t)nd * sizeof *strides);
    return dnnl_memory_desc_init_by_strides(d, nd, dd, dt, ds) == dnnl_success ? TS_OK : TS_ENOTSUP;
}

/* Creates the primitive of key k (oneDNN's team: the engine's threads, or one). */
static int prim_create(ts_bf16_ctx_t *x, int threads, const prim_key_t *k, prim_t *p) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    int nd = k->batch > 1 ? 3 : 2, o = 3 - nd; /* 2-D: skip the batch entry */
    int64_t lda = k->lda ? k->lda : k->K;
    int64_t sd[3] = {k->batch, k->M, k->K},
            ss[3] = {k->M * k->K, k->a_t ? 1 : lda, k->a_t ? lda : 1};
    int64_t wd[3] = {k->batch, k->K, k->N}, ws[3] = {0, 0, 0};
    int64_t dd[3] = {k->batch, k->M, k->N}, ds[3] = {k->sc, k->ldc, 1};
    int64_t bd[3] = {1, 1, k->N}, bs[3] = {k->N, k->N, 1};
    ws[0] = k->K * k->N;
    ws[1] = k->b_nk ? 1 : k->ldb;
    ws[2] = k->b_nk ? k->ldb : 1;
    TS_TRY(md(&p->src, nd, sd + o, dnnl_bf16, ss + o));
    TS_TRY(md(&p->wei, nd, wd + o, dnnl_bf16, ws + o));
    TS_TRY(md(&p->dst, nd, dd + o, dnnl_f32, ds + o));
    if (k->bias)
        TS_TRY(md(&p->bias, nd, bd + o, dnnl_f32, bs + o));
    dnnl_matmul_desc_t desc;
    if (dnnl_matmul_desc_init(&desc, &p->src, &p->wei, k->bias ? &p->bias : NULL, &p->dst) !=
        dnnl_success)
        return TS_ENOTSUP;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_post_ops_t ops = NULL;
    int rc = dnnl_primitive_attr_create(&attr) == dnnl_success ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK && k->accum && /* C += product: the sum post-op adds C as it was */
        (dnnl_post_ops_create(&ops) != dnnl_success ||
         dnnl_post_ops_append_sum(ops, 1.0f) != dnnl_success ||
         dnnl_primitive_attr_set_post_ops(attr, ops) != dnnl_success))
        rc = TS_ENOTSUP;
    if (rc == TS_OK &&
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success)
        rc = TS_ENOTSUP;
    if (rc == TS_OK && k->alpha != 1.0f &&
        dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha) != dnnl_success)
        rc = TS_ENOTSUP;
    omp_set_num_threads(threads);
    if (rc == TS_OK && dnnl_primitive_desc_create(&pd, &desc, attr, x->eng, NULL) != dnnl_success)
        rc = TS_ENOTSUP;
    if (rc == TS_OK) {
        const dnnl_memory_desc_t *pad =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        if (pad)
            p->pad = *pad;
        p->pad_bytes = pad ? dnnl_memory_desc_get_size(pad) : 0;
        if (dnnl_primitive_create(&p->prim, pd) != dnnl_success)
            rc = TS_ENOTSUP;
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return rc;
}

/* The cached primitive for key k, made when missing. Called on the caller only. */
static int prim_get(ts_bf16_ctx_t *x, int threads, const prim_key_t *k, const prim_t **out) {
    for (int i = 0; i < x->nprims; i++)
        if (memcmp(&x->prims[i].key, k, sizeof *k) == 0) {
            *out = &x->prims[i];
            return TS_OK;
        }
    if (x->nprims == x->cap) {
        int cap = x->cap ? 2 * x->cap : 32;
        prim_t *p = realloc(x->prims, (size_t)cap * sizeof *p);
        if (!p)
            return TS_ENOMEM;
        x->prims = p;
        x->cap = cap;
    }
    TS_TRY(prim_create(x, threads, k, &x->prims[x->nprims]));
    *out = &x->prims[x->nprims++];
    return TS_OK;
}

/* A zeroed key, so that memcmp sees no stray padding bytes. */
static prim_key_t key_of(int64_t batch, int64_t M, int64_t N, int64_t K, int b_nk, int64_t ldb,
                         int64_t ldc, int64_t sc, int bias, float alpha, int team) {
    prim_key_t k;
    memset(&k, 0, sizeof k);
    k.batch = batch, k.M = M, k.N = N, k.K = K, k.b_nk = b_nk, k.ldb = ldb, k.ldc = ldc;
    k.sc = sc, k.bias = bias, k.alpha = alpha, k.team = team;
    return k;
}

/* Runs p on one slot: c = a · b (+ bias). */
static int prim_exec(ts_bf16_ctx_t *x, slot_t *s, const prim_t *p, const uint16_t *a,
                     const uint16_t *b, const float *bias, float *c) {
    if (grow(&s->pad, &s->pad_cap, p->pad_bytes ? p->pad_bytes : 64))
        return TS_ENOMEM;
    dnnl_memory_t m[5] = {NULL};
    int ok = dnnl_memory_create(&m[0], &p->src, x->eng, (void *)a) == dnnl_success &&
             dnnl_memory_create(&m[1], &p->wei, x->eng, (void *)b) == dnnl_success &&
             dnnl_memory_create(&m[2], &p->dst, x->eng, c) == dnnl_success;
    int n = 3;
    dnnl_exec_arg_t args[5] = {
        {DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}};
    if (ok && p->pad_bytes) {
        ok = dnnl_memory_create(&m[3], &p->pad, x->eng, s->pad) == dnnl_success;
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[3]};
    }
    if (ok && p->key.bias) {
        ok = dnnl_memory_create(&m[4], &p->bias, x->eng, (void *)bias) == dnnl_success;
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, m[4]};
    }
    if (ok)
        ok = dnnl_primitive_execute(p->prim, s->stream, n, args) == dnnl_success &&
             dnnl_stream_wait(s->stream) == dnnl_success;
    for (int i = 0; i < 5; i++)
        if (m[i])
            dnnl_memory_destroy(m[i]);
    return ok ? TS_OK : TS_ENOTSUP;
}

/* d[0..n) = bf16 of s[0..n) by the CPU's own conversion (vcvtneps2bf16: nearest even, NaN stays
 * NaN, and — unlike ts_f32_to_bf16 — a subnormal input becomes 0). The path only runs where
 * ts_cpu_bf16_check found AVX-512 BF16, so the instruction is there. The scalar conversion was a
 * fifth of a bf16 forward's time; this is 16 lanes per instruction. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
row_to_bf16(uint16_t *d, const float *s, int64_t n) {
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        _mm256_storeu_si256((__m256i *)(d + c),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + c)));
    if (c < n) { /* the tail, masked: the same instruction rounds it */
        __mmask16 m = (__mmask16)((1u << (n - c)) - 1u);
        __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + c));
        _mm256_mask_storeu_epi16(d + c, m, (__m256i)v);
    }
}

/* dst (rows, cols) dense = bf16 of src, element (r, c) at src[r·rs + c·cs]. */
static void to_bf16(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t rs,
                    int64_t cs) {
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * rs;
        uint16_t *d = dst + r * cols;
        if (cs == 1)
            row_to_bf16(d, s, cols);
        else /* a transposed operand (not on the forward's path): gathered one by one */
            for (int64_t c = 0; c < cols; c++)
                d[c] = ts_f32_to_bf16(s[c * cs]);
    }
}

/* ---- linear ---------------------------------------------------------------------------- */

/* A linear layer cut into slices of rows (split 1) or of output columns (split 2). */
typedef struct {
    ts_bf16_ctx_t *x;
    float *out;
    const float *inp, *bias;
    const uint16_t *weight, *a_all; /* a_all: the whole input in bf16 (column split) */
    int64_t M, N, K, step, nslices;
    const prim_t *full, *last; /* the primitive of a full slice and of the last one */
    int split, rc;
} lin_job_t;

static void lin_slices(void *arg, int64_t lo, int64_t hi) {
    lin_job_t *j = arg;
    omp_set_num_threads(1);
    for (int64_t i = lo; i < hi; i++) {
        slot_t *s = &j->x->slots[i];
        const prim_t *p = i == j->nslices - 1 ? j->last : j->full;
        int64_t at = i * j->step, K = j->K, N = j->N;
        int rc;
        if (j->split == 1) { /* rows at.. of the input and the output */
            int64_t rows = p->key.M;
            rc = grow((void **)&s->a, &s->a_cap, (size_t)(rows * K) * 2);
            if (rc == TS_OK) {
                to_bf16(s->a, j->inp + at * K, rows, K, K, 1);
                rc = prim_exec(j->x, s, p, s->a, j->weight, j->bias, j->out + at * N);
            }
        } else { /* output columns at.., weight rows at.. */
            rc = prim_exec(j->x, s, p, j->a_all, j->weight + at * K, j->bias ? j->bias + at : NULL,
                           j->out + at);
        }
        if (rc != TS_OK)
            j->rc = rc;
    }
}

int ts_cpu_linear_forward_bf16(ts_engine_t *e, float *out, const float *inp, const uint16_t *weight,
                               const float *bias, int64_t M, int64_t N, int64_t K, int64_t group) {
    /* No per-item calls: a row's bits from oneDNN's matmul do not depend on how many rows share
     * its call here (test_bf16 checks a sample alone against its batch, test_serve the server's
     * answers against the local forward); a CPU where they did would fail those tests. */
    (void)group;
    ts_bf16_ctx_t *x;
    TS_TRY(ctx_get(e, &x));
    int T = x->nslots;
    double macs = (double)M * (double)N * (double)K;
    int64_t nsl = x->team || macs < BF16_WAKE_MACS ? 1 : T;
    int split = M >= nsl * SLICE_MIN ? 1 : N >= nsl * SLICE_MIN ? 2 : 1;
    if (split == 1 && M < nsl * SLICE_MIN)
        nsl = 1;
    int64_t len = split == 1 ? M : N;
    int64_t step = (len + nsl - 1) / nsl;
    nsl = (len + step - 1) / step;
    int64_t tail = len - (nsl - 1) * step;
    int threads = x->team ? T : 1;
    lin_job_t j = {x, out, inp, bias, weight, NULL, M, N, K, step, nsl, NULL, NULL, split, TS_OK};
    prim_key_t kf = split == 1 ? key_of(1, step, N, K, 1, K, N, 0, bias != NULL, 1.0f, x->team)
                               : key_of(1, M, step, K, 1, K, N, 0, bias != NULL, 1.0f, x->team);
    prim_key_t kl = kf;
    if (split == 1)
        kl.M = tail;
    else
        kl.N = tail;
    TS_TRY(prim_get(x, threads, &kf, &j.full));
    TS_TRY(prim_get(x, threads, &kl, &j.last));
    if (split == 2) { /* every slice reads the whole input: round it once */
        slot_t *s0 = &x->slots[0];
        TS_TRY(grow((void **)&s0->b, &s0->b_cap, (size_t)(M * K) * 2));
        to_bf16(s0->b, inp, M, K, K, 1);
        j.a_all = s0->b;
    }
    omp_set_num_threads(threads);
    if (nsl > 1)
        ts_pool_for(e->pool, nsl, 1, lin_slices, &j);
    else if (x->team) { /* the caller, on oneDNN's team */
        slot_t *s = &x->slots[0];
        TS_TRY(grow((void **)&s->a, &s->a_cap, (size_t)(M * K) * 2));
        to_bf16(s->a, inp, M, K, K, 1);
        j.rc = prim_exec(x, s, j.full, s->a, weight, bias, out);
    } else
        lin_slices(&j, 0, 1);
    return j.rc;
}

/* ---- linear backward --------------------------------------------------------------------- */

/* One product c (+)= a · b of a primitive key, cut into slices along its rows or its columns;
 * slice i's operands start at a + i·step·a_adv, b + i·step·b_adv, c + i·step·c_adv. */
typedef struct {
    ts_bf16_ctx_t *x;
    const uint16_t *a, *b;
    float *c;
    int64_t a_adv, b_adv, c_adv, step, nslices;
    const prim_t *full, *last;
    int rc;
} mm_job_t;

static void mm_slices(void *arg, int64_t lo, int64_t hi) {
    mm_job_t *j = arg;
    omp_set_num_threads(j->x->team ? j->x->nslots : 1);
    for (int64_t i = lo; i < hi; i++) {
        const prim_t *p = i == j->nslices - 1 ? j->last : j->full;
        int64_t at = i * j->step;
        int rc = prim_exec(j->x, &j->x->slots[i], p, j->a + at * j->a_adv, j->b + at * j->b_adv,
                           NULL, j->c + at * j->c_adv);
        if (rc != TS_OK)
            j->rc = rc;
    }
}

/* Runs the product of key k (whole) in one slice per worker — along its rows (by_n 0) or its
 * columns (by_n 1) — where it pays as in the forward (BF16_WAKE_MACS, SLICE_MIN), else in one.
 * a_adv, b_adv, c_adv: how far a slice's operands move per row (column) of the split. */
static int mm_sliced(ts_engine_t *e, ts_bf16_ctx_t *x, prim_key_t k, int by_n, const uint16_t *a,
                     int64_t a_adv, const uint16_t *b, int64_t b_adv, float *c, int64_t c_adv) {
    int T = x->nslots;
    double macs = (double)k.M * (double)k.N * (double)k.K;
    int64_t len = by_n ? k.N : k.M;
    int64_t nsl = x->team || macs < BF16_WAKE_MACS || len < (int64_t)T * SLICE_MIN ? 1 : T;
    int64_t step = (len + nsl - 1) / nsl;
    nsl = (len + step - 1) / step;
    int64_t tail = len - (nsl - 1) * step;
    prim_key_t kf = k, kl = k;
    if (by_n)
        kf.N = step, kl.N = tail;
    else
        kf.M = step, kl.M = tail;
    int threads = x->team ? T : 1;
    mm_job_t j = {x, a, b, c, a_adv, b_adv, c_adv, step, nsl, NULL, NULL, TS_OK};
    TS_TRY(prim_get(x, threads, &kf, &j.full));
    TS_TRY(prim_get(x, threads, &kl, &j.last));
    omp_set_num_threads(threads);
    if (nsl > 1)
        ts_pool_for(e->pool, nsl, 1, mm_slices, &j);
    else
        mm_slices(&j, 0, 1);
    return j.rc;
}

typedef struct {
    uint16_t *dst;
    const float *src;
    int64_t cols;
} round_job_t;

static void round_rows(void *arg, int64_t lo, int64_t hi) {
    const round_job_t *j = arg;
    to_bf16(j->dst + lo * j->cols, j->src + lo * j->cols, hi - lo, j->cols, j->cols, 1);
}

/* *dst (grown to rows·cols) = bf16 of src (rows, cols) dense, rows shared by the pool. */
static int round_all(ts_engine_t *e, uint16_t **dst, size_t *cap, const float *src, int64_t rows,
                     int64_t cols) {
    TS_TRY(grow((void **)dst, cap, (size_t)(rows * cols) * 2));
    round_job_t j = {*dst, src, cols};
    ts_pool_for(e->pool, rows, 32768 / (cols > 0 ? cols : 1) + 1, round_rows, &j);
    return TS_OK;
}

int ts_cpu_linear_backward_bf16(ts_engine_t *e, float *dinp, float *dweight, const float *dout,
                                const float *inp, const uint16_t *weight, int64_t M, int64_t N,
                                int64_t K) {
    ts_bf16_ctx_t *x;
    TS_TRY(ctx_get(e, &x));
    if (!dinp && !dweight)
        return TS_OK;
    int64_t split = (int64_t)x->nslots * SLICE_MIN;
    /* dout (M, N) rounded once: both products read it */
    TS_TRY(round_all(e, &x->g16, &x->g16_cap, dout, M, N));
    if (dinp) { /* dinp (M, K) += dout (M, N) · weight (N, K), weight as stored */
        prim_key_t k = key_of(1, M, K, N, 0, K, K, 0, 0, 1.0f, x->team);
        k.accum = 1;
        int by_n = M < split;
        TS_TRY(mm_sliced(e, x, k, by_n, x->g16, by_n ? 0 : N, weight, by_n ? 1 : 0, dinp,
                         by_n ? 1 : K));
    }
    if (dweight) { /* dweight (N, K) += doutᵀ (N, M) · inp (M, K), doutᵀ read in place */
        TS_TRY(round_all(e, &x->x16, &x->x16_cap, inp, M, K));
        prim_key_t k = key_of(1, N, K, M, 0, K, K, 0, 0, 1.0f, x->team);
        k.a_t = 1, k.lda = N, k.accum = 1;
        int by_n = N < split;
        TS_TRY(mm_sliced(e, x, k, by_n, x->g16, by_n ? 0 : 1, x->x16, by_n ? 1 : 0, dweight,
                         by_n ? 1 : K));
    }
    return TS_OK;
}

/* ---- gemm ------------------------------------------------------------------------------ */

/* A strided-batched gemm cut into slices: of whole products of the batch (by_rows 0), or, for a
 * batch too small to give every worker a product, of the rows of one product at a time (by_rows
 * 1: op(B) rounded once by the caller, into b16). Each slice rounds its operands into its
 * scratch, runs one primitive into a dense result, then writes C = result + beta · C. */
typedef struct {
    ts_bf16_ctx_t *x;
    int ta, tb, by_rows;
    int64_t M, N, K, lda, ldb, ldc, sa, sb, sc, step, nslices;
    float beta;
    const float *A, *B;
    float *C;
    const uint16_t *b16; /* by_rows: the product's op(B) in bf16, as stored */
    const prim_t *full, *last;
    int rc;
} gemm_job_t;

/* B (K, N) of one product into dst in bf16, kept as stored: (N, K) rows when tb, else (K, N). */
static void b_to_bf16(const gemm_job_t *j, uint16_t *dst, const float *B) {
    if (j->tb)
        to_bf16(dst, B, j->N, j->K, j->ldb, 1);
    else
        to_bf16(dst, B, j->K, j->N, j->ldb, 1);
}

/* C (rows, N), row stride ldc, = r (rows, N) dense + beta · C. */
static void write_c(float *C, const float *r, int64_t rows, int64_t N, int64_t ldc, float beta) {
    for (int64_t m = 0; m < rows; m++) {
        float *c = C + m * ldc;
        const float *d = r + m * N;
        if (beta == 0.0f)
            memcpy(c, d, (size_t)N * sizeof *c);
        else
            for (int64_t n = 0; n < N; n++)
                c[n] = d[n] + beta * c[n];
    }
}

/* Slice i of a batch split: products b0 .. b0 + nb. */
static int gemm_slice_batch(gemm_job_t *j, slot_t *s, const prim_t *p, int64_t i) {
    int64_t M = j->M, N = j->N, K = j->K, b0 = i * j->step, nb = p->key.batch;
    int rc = grow((void **)&s->a, &s->a_cap, (size_t)(nb * M * K) * 2);
    if (rc == TS_OK)
        rc = grow((void **)&s->b, &s->b_cap, (size_t)(nb * K * N) * 2);
    if (rc == TS_OK)
        rc = grow((void **)&s->c, &s->c_cap, (size_t)(nb * M * N) * 4);
    for (int64_t b = 0; b < nb && rc == TS_OK; b++) { /* op(A) (M, K) dense */
        const float *A = j->A + (b0 + b) * j->sa;
        to_bf16(s->a + b * M * K, A, M, K, j->ta ? 1 : j->lda, j->ta ? j->lda : 1);
        b_to_bf16(j, s->b + b * K * N, j->B + (b0 + b) * j->sb);
    }
    if (rc == TS_OK)
        rc = prim_exec(j->x, s, p, s->a, s->b, NULL, s->c);
    for (int64_t b = 0; b < nb && rc == TS_OK; b++)
        write_c(j->C + (b0 + b) * j->sc, s->c + b * M * N, M, N, j->ldc, j->beta);
    return rc;
}

/* Slice i of a row split of the one product at j->A, j->C: rows m0 .. m0 + rows of op(A). */
static int gemm_slice_rows(gemm_job_t *j, slot_t *s, const prim_t *p, int64_t i) {
    int64_t N = j->N, K = j->K, m0 = i * j->step, rows = p->key.M;
    int rc = grow((void **)&s->a, &s->a_cap, (size_t)(rows * K) * 2);
    if (rc == TS_OK)
        rc = grow((void **)&s->c, &s->c_cap, (size_t)(rows * N) * 4);
    if (rc == TS_OK) {
        const float *A = j->ta ? j->A + m0 : j->A + m0 * j->lda;
        to_bf16(s->a, A, rows, K, j->ta ? 1 : j->lda, j->ta ? j->lda : 1);
        rc = prim_exec(j->x, s, p, s->a, j->b16, NULL, s->c);
    }
    if (rc == TS_OK)
        write_c(j->C + m0 * j->ldc, s->c, rows, N, j->ldc, j->beta);
    return rc;
}

static void gemm_slices(void *arg, int64_t lo, int64_t hi) {
    gemm_job_t *j = arg;
    omp_set_num_threads(j->x->team ? j->x->nslots : 1);
    for (int64_t i = lo; i < hi; i++) {
        slot_t *s = &j->x->slots[i];
        const prim_t *p = i == j->nslices - 1 ? j->last : j->full;
        int rc = j->by_rows ? gemm_slice_rows(j, s, p, i) : gemm_slice_batch(j, s, p, i);
        if (rc != TS_OK)
            j->rc = rc;
    }
}

int ts_cpu_gemm_bf16(ts_engine_t *e, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                     float alpha, const float *A, int64_t lda, int64_t stride_a, const float *B,
                     int64_t ldb, int64_t stride_b, float beta, float *C, int64_t ldc,
                     int64_t stride_c, int64_t batch) {
    ts_bf16_ctx_t *x;
    TS_TRY(ctx_get(e, &x));
    int T = x->nslots;
    double macs = (double)M * (double)N * (double)K * (double)batch;
    int wake = !x->team && macs >= BF16_WAKE_MACS;
    /* a batch of fewer products than workers is cut by rows instead, one product at a time */
    int by_rows = wake && batch < T && M >= (int64_t)T * SLICE_MIN;
    int64_t len = by_rows ? M : batch;
    int64_t nsl = !wake ? 1 : by_rows ? T : (batch < T ? batch : T);
    int64_t step = (len + nsl - 1) / nsl;
    nsl = (len + step - 1) / step;
    int64_t tail = len - (nsl - 1) * step;
    int threads = x->team ? T : 1;
    /* B from the bf16 copy: (N, K) rows when trans_b, else (K, N) rows */
    prim_key_t kf = key_of(by_rows ? 1 : step, by_rows ? step : M, N, K, trans_b, trans_b ? K : N,
                           N, M * N, 0, alpha, x->team);
    prim_key_t kl = kf;
    if (by_rows)
        kl.M = tail;
    else
        kl.batch = tail;
    gemm_job_t j = {x,   trans_a, trans_b,  by_rows,  M,        N,    K,    lda,
                    ldb, ldc,     stride_a, stride_b, stride_c, step, nsl,  beta,
                    A,   B,       C,        NULL,     NULL,     NULL, TS_OK};
    TS_TRY(prim_get(x, threads, &kf, &j.full));
    TS_TRY(prim_get(x, threads, &kl, &j.last));
    if (!by_rows) {
        if (nsl > 1)
            ts_pool_for(e->pool, nsl, 1, gemm_slices, &j);
        else
            gemm_slices(&j, 0, 1);
        return j.rc;
    }
    slot_t *s0 = &x->slots[0]; /* its b is free in a row split: the shared op(B) */
    TS_TRY(grow((void **)&s0->b, &s0->b_cap, (size_t)(K * N) * 2));
    for (int64_t b = 0; b < batch && j.rc == TS_OK; b++) {
        j.A = A + b * stride_a, j.C = C + b * stride_c;
        b_to_bf16(&j, s0->b, B + b * stride_b);
        j.b16 = s0->b;
        ts_pool_for(e->pool, nsl, 1, gemm_slices, &j);
    }
    return j.rc;
}

/* ---- GELU for a bf16 consumer -------------------------------------------------------- */

/* exp(x) for x in [−88, 88] (clamped): 2^n · 2^f, n = round(x·log2 e), f in [−½, ½], 2^f by its
 * Taylor polynomial to degree 6 (error ~1e-7), scaled back by vscalefps. */
__attribute__((target("avx512f"))) static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-88.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.69314718056f)); /* f·ln 2 */
    static const float c[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    __m512 p = _mm512_set1_ps(c[0]);
    for (int i = 1; i < 7; i++)
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[i]));
    return _mm512_scalef_ps(p, n);
}

/* gelu(x) = ½x(1 + tanh u) = x / (1 + exp(−2u)), u = K0 (x + K1 x³): 16 lanes at a time, the
 * tail masked. */
typedef struct {
    const float *inp;
    float *out;
} gelu_job_t;

__attribute__((target("avx512f"))) static void gelu_fast_range(void *arg, int64_t lo, int64_t hi) {
    const gelu_job_t *j = arg;
    const __m512 k0m2 = _mm512_set1_ps(-2.0f * TS_GELU_K0), k1 = _mm512_set1_ps(TS_GELU_K1);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = lo; i < hi; i += 16) {
        __mmask16 m = hi - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hi - i)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(m, j->inp + i);
        __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        __m512 u = _mm512_add_ps(x, _mm512_mul_ps(k1, x3)); /* u / K0 */
        __m512 d = _mm512_add_ps(one, exp16(_mm512_mul_ps(k0m2, u)));
        _mm512_mask_storeu_ps(j->out + i, m, _mm512_div_ps(x, d));
    }
}

int ts_cpu_gelu_forward_bf16(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    ts_bf16_ctx_t *x;
    TS_TRY(ctx_get(e, &x)); /* the CPU has AVX-512 */
    gelu_job_t j = {inp, out};
    ts_pool_for(e->pool, n, 16384, gelu_fast_range, &j);
    return TS_OK;
}

#else /* no oneDNN in this build */

int ts_cpu_bf16_check(ts_engine_t *e, char *why, size_t why_len) {
    (void)e;
    if (why && why_len)
        snprintf(why, why_len,
                 "this build has no bf16 path: oneDNN was not found when it was configured "
                 "(apt-get install libdnnl-dev, then re-run cmake; or use --precision f32)");
    return TS_ENOTSUP;
}

void ts_cpu_bf16_free(ts_engine_t *e) { (void)e; }

int ts_cpu_gelu_forward_bf16(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    (void)e, (void)out, (void)inp, (void)n;
    return TS_ENOTSUP;
}

int ts_cpu_linear_forward_bf16(ts_engine_t *e, float *out, const float *inp, const uint16_t *weight,
                               const float *bias, int64_t M, int64_t N, int64_t K, int64_t group) {
    (void)e, (void)out, (void)inp, (void)weight, (void)bias, (void)M, (void)N, (void)K, (void)group;
    return TS_ENOTSUP;
}

int ts_cpu_linear_backward_bf16(ts_engine_t *e, float *dinp, float *dweight, const float *dout,
                                const float *inp, const uint16_t *weight, int64_t M, int64_t N,
                                int64_t K) {
    (void)e, (void)dinp, (void)dweight, (void)dout, (void)inp, (void)weight, (void)M, (void)N;
    (void)K;
    return TS_ENOTSUP;
}

int ts_cpu_gemm_bf16(ts_engine_t *e, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                     float alpha, const float *A, int64_t lda, int64_t stride_a, const float *B,
                     int64_t ldb, int64_t stride_b, float beta, float *C, int64_t ldc,
                     int64_t stride_c, int64_t batch) {
    (void)e, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A;
    (void)lda, (void)stride_a, (void)B, (void)ldb, (void)stride_b, (void)beta, (void)C, (void)ldc;
    (void)stride_c, (void)batch;
    return TS_ENOTSUP;
}

#endif
