/*
 * cmd_selfcheck.c — `tessera selfcheck`: is the compute layer right on this machine?
 *
 * Runs the forward ops of kernels/ops.h on a CPU engine, on random inputs of DiT-like sizes, and
 * compares each output with the naive double-precision loops of kernels/ref.h; checks the
 * Philox4x32-10 generator against Random123's published known-answer vectors; and, when a CUDA
 * device is present, runs the same cases on it and compares them with the CPU's answers. It prints
 * one row per check (op, size, max abs error, normalised MSE, PASS/FAIL) and exits 1 when any
 * check fails. It is a quick end-to-end check for a user's machine, not the test suite: the
 * backward ops, conversions and error paths are covered by tests/.
 *
 * Each case is a function that builds its inputs on the host from a fixed seed, uploads them to
 * the engine it is given, runs the op, and downloads the result (`got`) — and, for the CPU run,
 * computes the reference (`want`). The same function serves the CUDA run, whose `got` is then
 * compared with the CPU's. Everything a case allocates is recorded in its sc_ctx_t and released
 * by sc_ctx_free.
 */
#define _POSIX_C_SOURCE 200809L

#include "client/commands.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/args.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/fwd_gemm.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "kernels/ref.h"

/* CUDA answers are compared with the CPU's at the parity test's bound (tests/test_cuda_parity.c). */
#define SC_CUDA_NMSE_TOL 1e-6

/* ---- a case's context -------------------------------------------------------------------- */

#define SC_MAX_TENSORS 12
#define SC_MAX_HOST 16

typedef struct sc_ctx {
    ts_engine_t *e;
    int want_ref; /* 1: also compute the reference (the CPU run) */
    ts_tensor_t tensors[SC_MAX_TENSORS];
    int ntensors;
    void *host[SC_MAX_HOST];
    int nhost;
    /* results */
    char size[64];
    float *got, *want; /* n values each; want is NULL unless want_ref */
    int64_t n;
    double nmse_tol, abs_tol;
} sc_ctx_t;

static void sc_ctx_free(sc_ctx_t *c) {
    for (int i = 0; i < c->ntensors; i++)
        ts_tensor_free(&c->tensors[i]);
    for (int i = 0; i < c->nhost; i++)
        free(c->host[i]);
    c->ntensors = c->nhost = 0;
}

/* A host buffer of n floats owned by the context (NULL when out of memory or slots). */
static float *sc_host(sc_ctx_t *c, int64_t n) {
    if (c->nhost == SC_MAX_HOST || n < 1)
        return NULL;
    float *p = calloc((size_t)n, sizeof *p);
    if (p)
        c->host[c->nhost++] = p;
    return p;
}

/* splitmix64: the selfcheck's own input generator, independent of the RNG under test. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* n values uniform in [lo, hi) from seed, in a context-owned buffer. */
static float *sc_rand(sc_ctx_t *c, int64_t n, uint64_t seed, float lo, float hi) {
    float *p = sc_host(c, n);
    if (!p)
        return NULL;
    uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(&s) >> 11) * 0x1.0p-53;
        p[i] = (float)(lo + (hi - lo) * u);
    }
    return p;
}

/* A tensor of the engine's device, owned by the context; filled from `data` (host, numel
 * floats, or int32 for I32) when data is not NULL, else zero. */
static int sc_tensor(sc_ctx_t *c, ts_tensor_t **out, ts_dtype_t dtype, const void *data, int ndim,
                     const int64_t *shape) {
    if (c->ntensors == SC_MAX_TENSORS)
        return TS_ENOMEM;
    ts_tensor_t *t = &c->tensors[c->ntensors];
    int rc = ts_tensor_alloc(t, dtype, c->e->device, ndim, shape);
    if (rc != TS_OK)
        return rc;
    c->ntensors++;
    if (data) {
        ts_tensor_t h;
        rc = ts_tensor_wrap(&h, (void *)data, dtype, TS_CPU, ndim, shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(t, &h);
    } else {
        rc = ts_zero(c->e, t);
    }
    *out = t;
    return rc;
}

/* Copies t (F32) into host[0 .. numel) after the engine's work is done. */
static int sc_download(sc_ctx_t *c, const ts_tensor_t *t, float *host) {
    int rc = ts_engine_sync(c->e);
    if (rc != TS_OK)
        return rc;
    ts_tensor_t h;
    rc = ts_tensor_wrap(&h, host, TS_F32, TS_CPU, t->ndim, t->shape);
    if (rc == TS_OK)
        rc = ts_tensor_copy(&h, t);
    return rc;
}

/* Allocates got (and want, for the reference run) of n values. */
static int sc_outputs(sc_ctx_t *c, int64_t n) {
    c->n = n;
    c->got = sc_host(c, n);
    c->want = c->want_ref ? sc_host(c, n) : NULL;
    return c->got && (c->want || !c->want_ref) ? TS_OK : TS_ENOMEM;
}

#define NEED(p) TS_TRY((p) ? TS_OK : TS_ENOMEM)

/* ---- the cases ---------------------------------------------------------------------------- */

static int case_linear(sc_ctx_t *c) {
    enum { B = 2, T = 49, K = 128, N = 384 };
    float *x = sc_rand(c, B * T * K, 1, -1, 1), *w = sc_rand(c, N * K, 2, -0.2f, 0.2f);
    float *b = sc_rand(c, N, 3, -1, 1);
    NEED(x && w && b);
    ts_tensor_t *tx, *tw, *tb, *ty;
    TS_TRY(sc_tensor(c, &tx, TS_F32, x, 3, TS_SHAPE(B, T, K)));
    TS_TRY(sc_tensor(c, &tw, TS_F32, w, 2, TS_SHAPE(N, K)));
    TS_TRY(sc_tensor(c, &tb, TS_F32, b, 1, TS_SHAPE(N)));
    TS_TRY(sc_tensor(c, &ty, TS_F32, NULL, 3, TS_SHAPE(B, T, N)));
    TS_TRY(ts_linear_forward(c->e, ty, tx, tw, tb));
    TS_TRY(sc_outputs(c, B * T * N));
    TS_TRY(sc_download(c, ty, c->got));
    if (c->want)
        ts_ref_linear(c->want, x, w, b, B * T, K, N);
    snprintf(c->size, sizeof c->size, "(%d,%d,%d)x(%d,%d)^T+b", B, T, K, N, K);
    return TS_OK;
}

/* c = alpha · op(a) · op(b) + beta · c0, batch products of (M, N, K). */
static int matmul_case(sc_ctx_t *c, int64_t batch, int64_t M, int64_t N, int64_t K, int ta, int tb,
                       float alpha, float beta) {
    int64_t na = M * K, nb = K * N, nc = M * N;
    float *a = sc_rand(c, batch * na, 4, -1, 1), *b = sc_rand(c, batch * nb, 5, -1, 1);
    float *c0 = sc_rand(c, batch * nc, 6, -1, 1);
    NEED(a && b && c0);
    int nd = batch > 1 ? 3 : 2;
    const int64_t *sa = ta ? TS_SHAPE(batch, K, M) : TS_SHAPE(batch, M, K);
    const int64_t *sb = tb ? TS_SHAPE(batch, N, K) : TS_SHAPE(batch, K, N);
    ts_tensor_t *xa, *xb, *xc;
    TS_TRY(sc_tensor(c, &xa, TS_F32, a, nd, sa + (3 - nd)));
    TS_TRY(sc_tensor(c, &xb, TS_F32, b, nd, sb + (3 - nd)));
    TS_TRY(sc_tensor(c, &xc, TS_F32, c0, nd, TS_SHAPE(batch, M, N) + (3 - nd)));
    TS_TRY(ts_matmul(c->e, xc, xa, ta, xb, tb, alpha, beta));
    TS_TRY(sc_outputs(c, batch * nc));
    TS_TRY(sc_download(c, xc, c->got));
    if (c->want) {
        memcpy(c->want, c0, (size_t)(batch * nc) * sizeof(float));
        for (int64_t i = 0; i < batch; i++)
            ts_ref_matmul(c->want + i * nc, a + i * na, ta, b + i * nb, tb, M, N, K, alpha, beta);
    }
    char prefix[24] = "";
    if (batch > 1)
        snprintf(prefix, sizeof prefix, "%lld x ", (long long)batch);
    snprintf(c->size, sizeof c->size, "%s%lldx%lldx%lld %s%s a=%g b=%g", prefix, (long long)M,
             (long long)N, (long long)K, ta ? "T" : "N", tb ? "T" : "N", alpha, beta);
    return TS_OK;
}

static int case_matmul_nn(sc_ctx_t *c) { return matmul_case(c, 1, 64, 48, 80, 0, 0, 1.0f, 0.0f); }
static int case_matmul_tt(sc_ctx_t *c) { return matmul_case(c, 1, 40, 56, 72, 1, 1, 0.5f, 1.0f); }
static int case_matmul_batched(sc_ctx_t *c) {
    return matmul_case(c, 8, 49, 49, 32, 0, 1, 0.17677669f, 0.0f); /* QK^T, 1/sqrt(32) */
}

static int case_layernorm(sc_ctx_t *c) {
    enum { R = 98, C = 128 };
    float *x = sc_rand(c, R * C, 7, -2, 4);
    NEED(x);
    ts_tensor_t *tx, *ty, *tm, *ts;
    TS_TRY(sc_tensor(c, &tx, TS_F32, x, 3, TS_SHAPE(2, 49, C)));
    TS_TRY(sc_tensor(c, &ty, TS_F32, NULL, 3, TS_SHAPE(2, 49, C)));
    TS_TRY(sc_tensor(c, &tm, TS_F32, NULL, 1, TS_SHAPE(R)));
    TS_TRY(sc_tensor(c, &ts, TS_F32, NULL, 1, TS_SHAPE(R)));
    TS_TRY(ts_layernorm_forward(c->e, ty, tm, ts, tx));
    /* got = out | mean | rstd */
    TS_TRY(sc_outputs(c, R * C + 2 * R));
    TS_TRY(sc_download(c, ty, c->got));
    TS_TRY(sc_download(c, tm, c->got + R * C));
    TS_TRY(sc_download(c, ts, c->got + R * C + R));
    if (c->want)
        ts_ref_layernorm(c->want, c->want + R * C, c->want + R * C + R, x, R, C);
    snprintf(c->size, sizeof c->size, "(2,49,%d) +mean,rstd", C);
    return TS_OK;
}

static int unary_case(sc_ctx_t *c, int which) {
    enum { N = 4096 };
    float *x = sc_rand(c, N, 8, -6, 6);
    NEED(x);
    ts_tensor_t *tx, *ty;
    TS_TRY(sc_tensor(c, &tx, TS_F32, x, 1, TS_SHAPE(N)));
    TS_TRY(sc_tensor(c, &ty, TS_F32, NULL, 1, TS_SHAPE(N)));
    TS_TRY(which ? ts_silu_forward(c->e, ty, tx) : ts_gelu_forward(c->e, ty, tx));
    TS_TRY(sc_outputs(c, N));
    TS_TRY(sc_download(c, ty, c->got));
    if (c->want)
        (which ? ts_ref_silu : ts_ref_gelu)(c->want, x, N);
    snprintf(c->size, sizeof c->size, "(%d) in [-6,6)", N);
    return TS_OK;
}

static int case_gelu(sc_ctx_t *c) { return unary_case(c, 0); }
static int case_silu(sc_ctx_t *c) { return unary_case(c, 1); }

static int case_softmax(sc_ctx_t *c) {
    enum { R = 392, C = 49 };
    float *x = sc_rand(c, R * C, 9, -8, 8);
    NEED(x);
    ts_tensor_t *tx, *ty;
    TS_TRY(sc_tensor(c, &tx, TS_F32, x, 2, TS_SHAPE(R, C)));
    TS_TRY(sc_tensor(c, &ty, TS_F32, NULL, 2, TS_SHAPE(R, C)));
    TS_TRY(ts_softmax_forward(c->e, ty, tx));
    TS_TRY(sc_outputs(c, R * C));
    TS_TRY(sc_download(c, ty, c->got));
    if (c->want)
        ts_ref_softmax(c->want, x, R, C);
    snprintf(c->size, sizeof c->size, "(%d,%d)", R, C);
    return TS_OK;
}

static int case_attention(sc_ctx_t *c) {
    enum { B = 2, T = 49, C = 128, H = 4 };
    float *qkv = sc_rand(c, B * T * 3 * C, 10, -1, 1);
    NEED(qkv);
    ts_tensor_t *tq, *to, *ta;
    TS_TRY(sc_tensor(c, &tq, TS_F32, qkv, 3, TS_SHAPE(B, T, 3 * C)));
    TS_TRY(sc_tensor(c, &to, TS_F32, NULL, 3, TS_SHAPE(B, T, C)));
    TS_TRY(sc_tensor(c, &ta, TS_F32, NULL, 4, TS_SHAPE(B, H, T, T)));
    TS_TRY(ts_attention_forward(c->e, to, ta, tq, H));
    /* got = out | att */
    TS_TRY(sc_outputs(c, B * T * C + B * H * T * T));
    TS_TRY(sc_download(c, to, c->got));
    TS_TRY(sc_download(c, ta, c->got + B * T * C));
    if (c->want)
        ts_ref_attention(c->want, c->want + B * T * C, qkv, B, T, C, H);
    snprintf(c->size, sizeof c->size, "qkv (%d,%d,%d) heads %d +att", B, T, 3 * C, H);
    return TS_OK;
}

/* modulate (gate = 0) or gate_residual (gate = 1) with a 6-chunk adaLN output, as in a block */
static int ada_case(sc_ctx_t *c, int gate) {
    enum { B = 2, T = 49, C = 128, M = 6 };
    float *x = sc_rand(c, B * T * C, 11, -2, 2), *y = sc_rand(c, B * T * C, 12, -2, 2);
    float *mod = sc_rand(c, B * M * C, 13, -1, 1);
    NEED(x && y && mod);
    ts_tensor_t *tx, *ty, *tm, *to;
    TS_TRY(sc_tensor(c, &tx, TS_F32, x, 3, TS_SHAPE(B, T, C)));
    TS_TRY(sc_tensor(c, &ty, TS_F32, y, 3, TS_SHAPE(B, T, C)));
    TS_TRY(sc_tensor(c, &tm, TS_F32, mod, 2, TS_SHAPE(B, M * C)));
    TS_TRY(sc_tensor(c, &to, TS_F32, NULL, 3, TS_SHAPE(B, T, C)));
    if (gate)
        TS_TRY(ts_gate_residual_forward(c->e, to, tx, ty, tm, 5));
    else
        TS_TRY(ts_modulate_forward(c->e, to, tx, tm, 3, 4));
    TS_TRY(sc_outputs(c, B * T * C));
    TS_TRY(sc_download(c, to, c->got));
    if (c->want && gate)
        ts_ref_gate_residual(c->want, x, y, mod, B, T, C, M, 5);
    else if (c->want)
        ts_ref_modulate(c->want, x, mod, B, T, C, M, 3, 4);
    snprintf(c->size, sizeof c->size, "(%d,%d,%d), %s", B, T, C,
             gate ? "gate chunk 5/6" : "chunks 3,4/6");
    return TS_OK;
}

static int case_modulate(sc_ctx_t *c) { return ada_case(c, 0); }
static int case_gate_residual(sc_ctx_t *c) { return ada_case(c, 1); }

static int case_timestep(sc_ctx_t *c) {
    enum { B = 16, D = 256 };
    float *t = sc_rand(c, B, 14, 0, 1);
    NEED(t);
    t[0] = 0.0f;
    t[1] = 1.0f; /* both ends of the flow-matching time */
    ts_tensor_t *tt, *to;
    TS_TRY(sc_tensor(c, &tt, TS_F32, t, 1, TS_SHAPE(B)));
    TS_TRY(sc_tensor(c, &to, TS_F32, NULL, 2, TS_SHAPE(B, D)));
    TS_TRY(ts_timestep_embedding_forward(c->e, to, tt, 1000.0f));
    TS_TRY(sc_outputs(c, B * D));
    TS_TRY(sc_download(c, to, c->got));
    if (c->want)
        ts_ref_timestep_embedding(c->want, t, B, D, 1000.0f);
    snprintf(c->size, sizeof c->size, "(%d,%d) t in [0,1], x1000", B, D);
    /* arguments reach 1000 rad, where float rounding of the argument alone is ~1e-4 */
    c->abs_tol = 2e-3;
    c->nmse_tol = 1e-6;
    return TS_OK;
}

static int case_pos_embed(sc_ctx_t *c) {
    enum { G = 7, D = 128 };
    ts_tensor_t *to;
    TS_TRY(sc_tensor(c, &to, TS_F32, NULL, 2, TS_SHAPE(G * G, D)));
    TS_TRY(ts_pos_embed_2d(c->e, to, G));
    TS_TRY(sc_outputs(c, G * G * D));
    TS_TRY(sc_download(c, to, c->got));
    if (c->want)
        ts_ref_pos_embed_2d(c->want, G, D);
    snprintf(c->size, sizeof c->size, "grid %d, D %d", G, D);
    return TS_OK;
}

static int case_embedding(sc_ctx_t *c) {
    enum { V = 11, D = 64, B = 6 };
    static const int32_t ids[B] = {0, 10, 3, 3, 7, 1};
    float *table = sc_rand(c, V * D, 15, -1, 1);
    NEED(table);
    ts_tensor_t *tt, *ti, *to;
    TS_TRY(sc_tensor(c, &tt, TS_F32, table, 2, TS_SHAPE(V, D)));
    TS_TRY(sc_tensor(c, &ti, TS_I32, ids, 1, TS_SHAPE(B)));
    TS_TRY(sc_tensor(c, &to, TS_F32, NULL, 2, TS_SHAPE(B, D)));
    TS_TRY(ts_embedding_forward(c->e, to, tt, ti));
    TS_TRY(sc_outputs(c, B * D));
    TS_TRY(sc_download(c, to, c->got));
    if (c->want)
        ts_ref_embedding(c->want, table, ids, B, D);
    snprintf(c->size, sizeof c->size, "table (%d,%d), %d ids", V, D, B);
    return TS_OK;
}

/* patchify (un = 0) or unpatchify (un = 1): 3 channels so the feature orders are exercised */
static int patch_case(sc_ctx_t *c, int un) {
    enum { B = 2, C = 3, HW = 28, P = 4, T = (HW / P) * (HW / P), F = C * P * P };
    int64_t n = B * C * HW * HW;
    float *x = sc_rand(c, n, 16, -1, 1);
    NEED(x);
    ts_tensor_t *ti, *tt;
    if (!un) {
        TS_TRY(sc_tensor(c, &ti, TS_F32, x, 4, TS_SHAPE(B, C, HW, HW)));
        TS_TRY(sc_tensor(c, &tt, TS_F32, NULL, 3, TS_SHAPE(B, T, F)));
        TS_TRY(ts_patchify_forward(c->e, tt, ti, P));
    } else {
        TS_TRY(sc_tensor(c, &tt, TS_F32, x, 3, TS_SHAPE(B, T, F)));
        TS_TRY(sc_tensor(c, &ti, TS_F32, NULL, 4, TS_SHAPE(B, C, HW, HW)));
        TS_TRY(ts_unpatchify_forward(c->e, ti, tt, P));
    }
    TS_TRY(sc_outputs(c, n));
    TS_TRY(sc_download(c, un ? ti : tt, c->got));
    if (c->want && !un)
        ts_ref_patchify(c->want, x, B, C, HW, HW, P);
    else if (c->want)
        ts_ref_unpatchify(c->want, x, B, C, HW, HW, P);
    snprintf(c->size, sizeof c->size, "(%d,%d,%d,%d) <-> (%d,%d,%d) p %d", B, C, HW, HW, B, T, F,
             P);
    return TS_OK;
}

static int case_patchify(sc_ctx_t *c) { return patch_case(c, 0); }
static int case_unpatchify(sc_ctx_t *c) { return patch_case(c, 1); }

/* a scalar op: mse (which = 0) or sum (which = 1) */
static int scalar_case(sc_ctx_t *c, int which) {
    enum { N = 2 * 28 * 28 };
    float *a = sc_rand(c, N, 17, -1, 1), *b = sc_rand(c, N, 18, -1, 1);
    NEED(a && b);
    ts_tensor_t *ta, *tb, *to;
    TS_TRY(sc_tensor(c, &ta, TS_F32, a, 4, TS_SHAPE(2, 1, 28, 28)));
    TS_TRY(sc_tensor(c, &tb, TS_F32, b, 4, TS_SHAPE(2, 1, 28, 28)));
    TS_TRY(sc_tensor(c, &to, TS_F32, NULL, 1, TS_SHAPE(1)));
    TS_TRY(which ? ts_sum_forward(c->e, to, ta) : ts_mse_forward(c->e, to, ta, tb));
    TS_TRY(sc_outputs(c, 1));
    TS_TRY(sc_download(c, to, c->got));
    if (c->want)
        c->want[0] = (float)(which ? ts_ref_sum(a, N) : ts_ref_mse(a, b, N));
    snprintf(c->size, sizeof c->size, "(2,1,28,28) -> 1");
    return TS_OK;
}

static int case_mse(sc_ctx_t *c) { return scalar_case(c, 0); }
static int case_sum(sc_ctx_t *c) { return scalar_case(c, 1); }

static int case_adamw(sc_ctx_t *c) {
    enum { N = 4096 };
    const ts_adamw_t hp = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    const int64_t step = 5;
    float *p = sc_rand(c, N, 19, -1, 1), *g = sc_rand(c, N, 20, -1, 1);
    float *m = sc_rand(c, N, 21, -0.1f, 0.1f), *v = sc_rand(c, N, 22, 0, 0.01f);
    NEED(p && g && m && v);
    ts_tensor_t *tp, *tg, *tm, *tv;
    TS_TRY(sc_tensor(c, &tp, TS_F32, p, 1, TS_SHAPE(N)));
    TS_TRY(sc_tensor(c, &tg, TS_F32, g, 1, TS_SHAPE(N)));
    TS_TRY(sc_tensor(c, &tm, TS_F32, m, 1, TS_SHAPE(N)));
    TS_TRY(sc_tensor(c, &tv, TS_F32, v, 1, TS_SHAPE(N)));
    TS_TRY(ts_adamw_step(c->e, tp, tg, tm, tv, &hp, step, 1.0f));
    /* got = param | m | v after the step */
    TS_TRY(sc_outputs(c, 3 * N));
    TS_TRY(sc_download(c, tp, c->got));
    TS_TRY(sc_download(c, tm, c->got + N));
    TS_TRY(sc_download(c, tv, c->got + 2 * N));
    if (c->want) {
        memcpy(c->want, p, N * sizeof(float));
        memcpy(c->want + N, m, N * sizeof(float));
        memcpy(c->want + 2 * N, v, N * sizeof(float));
        ts_ref_adamw(c->want, g, c->want + N, c->want + 2 * N, N, hp.lr, hp.beta1, hp.beta2, hp.eps,
                     hp.weight_decay, step);
    }
    snprintf(c->size, sizeof c->size, "(%d) step %lld, +m,v", N, (long long)step);
    return TS_OK;
}

/* Random123's tests/kat_vectors, "philox4x32 10": counter, key, result. */
/* clang-format off */
static const uint32_t PHILOX_KAT[3][10] = {
    {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
     0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
    {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
     0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
    {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
     0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
};
/* clang-format on */

/* The first stream block through the op: seed 0 is key 0, elements 0..3 are counter 0's four
 * words, and their uniforms are the KAT words' top 24 bits · 2⁻²⁴ (ops.h: "24-bit resolution").
 * The full 32-bit words are checked on the host by check_philox_kat. */
static int case_rng_kat(sc_ctx_t *c) {
    ts_tensor_t *to;
    TS_TRY(sc_tensor(c, &to, TS_F32, NULL, 1, TS_SHAPE(4)));
    TS_TRY(ts_rng_uniform(c->e, to, 0, 0));
    TS_TRY(sc_outputs(c, 4));
    TS_TRY(sc_download(c, to, c->got));
    if (c->want)
        for (int i = 0; i < 4; i++)
            c->want[i] = (float)(PHILOX_KAT[0][6 + i] >> 8) / 16777216.0f;
    snprintf(c->size, sizeof c->size, "ctr 0, key 0 -> uniform");
    c->abs_tol = 0;
    c->nmse_tol = 0;
    return TS_OK;
}

/* The normal stream at an offset that starts mid-block, against math.h's element formula. */
static int case_rng_normal(sc_ctx_t *c) {
    enum { N = 4099 };
    const uint64_t seed = 0x5eed, offset = 7;
    ts_tensor_t *to;
    TS_TRY(sc_tensor(c, &to, TS_F32, NULL, 1, TS_SHAPE(N)));
    TS_TRY(ts_rng_normal(c->e, to, seed, offset));
    TS_TRY(sc_outputs(c, N));
    TS_TRY(sc_download(c, to, c->got));
    if (c->want)
        for (int64_t i = 0; i < N; i++)
            c->want[i] = ts_rng_normal_at(seed, offset + (uint64_t)i);
    snprintf(c->size, sizeof c->size, "(%d) seed 0x5eed offset 7", N);
    c->abs_tol = 0;
    c->nmse_tol = 0;
    return TS_OK;
}

typedef struct sc_case {
    const char *op;
    int (*run)(sc_ctx_t *c);
} sc_case_t;

static const sc_case_t CASES[] = {
    {"linear", case_linear},
    {"matmul", case_matmul_nn},
    {"matmul", case_matmul_tt},
    {"matmul batched", case_matmul_batched},
    {"layernorm", case_layernorm},
    {"gelu", case_gelu},
    {"silu", case_silu},
    {"softmax", case_softmax},
    {"attention", case_attention},
    {"modulate", case_modulate},
    {"gate_residual", case_gate_residual},
    {"timestep_embedding", case_timestep},
    {"pos_embed_2d", case_pos_embed},
    {"embedding", case_embedding},
    {"patchify", case_patchify},
    {"unpatchify", case_unpatchify},
    {"mse", case_mse},
    {"sum", case_sum},
    {"adamw", case_adamw},
    {"rng_uniform KAT", case_rng_kat},
    {"rng_normal", case_rng_normal},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

/* ---- results and output --------------------------------------------------------------------- */

typedef struct sc_row {
    const char *backend; /* "cpu" or "cuda" */
    const char *against; /* "ref", "kat", "cpu" */
    const char *op;
    char size[64];
    double max_abs, nmse;
    int pass;
    int err; /* TS_OK, or the op's error code (the row then fails) */
} sc_row_t;

typedef struct sc_report {
    sc_row_t rows[2 * NCASES + 2];
    int nrows, failed;
} sc_report_t;

static void add_row(sc_report_t *r, const sc_row_t *row) {
    r->rows[r->nrows++] = *row;
    if (!row->pass)
        r->failed++;
}

/* Philox4x32-10 itself, on the host (the function both backends call), against all three KATs.
 * Words are split into 16-bit halves so the comparison is exact in floats. */
static void check_philox_kat(sc_report_t *r) {
    sc_row_t row = {.backend = "host", .against = "kat", .op = "philox4x32-10 KAT"};
    float got[24], want[24];
    for (int v = 0; v < 3; v++) {
        const uint32_t *k = PHILOX_KAT[v];
        ts_u32x4_t ctr = {{k[0], k[1], k[2], k[3]}};
        ts_u32x4_t out = ts_philox4x32_10(ctr, k[4], k[5]);
        for (int i = 0; i < 4; i++) {
            got[v * 8 + 2 * i] = (float)(out.v[i] >> 16);
            got[v * 8 + 2 * i + 1] = (float)(out.v[i] & 0xffffu);
            want[v * 8 + 2 * i] = (float)(k[6 + i] >> 16);
            want[v * 8 + 2 * i + 1] = (float)(k[6 + i] & 0xffffu);
        }
    }
    snprintf(row.size, sizeof row.size, "3 vectors (ctr 0/key 0, ...)");
    row.max_abs = ts_ref_max_abs_diff(got, want, 24);
    row.nmse = ts_ref_nmse(got, want, 24);
    row.pass = row.max_abs == 0.0;
    add_row(r, &row);
}

/* The GEMM kernels (kernels/cpu/blas_core.h): a row that fails when OpenBLAS runs a weaker set
 * than the CPU allows — unless the user chose that set (OPENBLAS_CORETYPE): then it passes, and
 * the line above the table still says so and names the fix. */
static void check_blas(sc_report_t *r, char *line, size_t len) {
    ts_blas_status_t b;
    ts_blas_status(&b);
    ts_blas_describe(&b, line, len);
    size_t used = strlen(line);
    if (used < len)
        snprintf(line + used, len - used, "; linear forward products: %s", ts_cpu_fwd_gemm_name());
    sc_row_t row = {.backend = "host", .against = "cpu", .op = "gemm kernels"};
    snprintf(row.size, sizeof row.size, "%.20s (CPU: %.20s)", b.core,
             b.cpu_best[0] ? b.cpu_best : "unknown");
    int user_chose = strstr(b.chosen_by, "set by the user") != NULL;
    row.pass = !b.weaker || user_chose;
    add_row(r, &row);
}

/* Runs case k on engine e. cpu_got (NULL for the CPU run) is the CPU's answer to compare with;
 * the CPU run's answer is handed back in *keep (caller frees) for the CUDA run. */
static void run_case(sc_report_t *r, int k, ts_engine_t *e, const float *cpu_got, int64_t cpu_n,
                     float **keep, int64_t *keep_n) {
    sc_ctx_t c;
    memset(&c, 0, sizeof c);
    c.e = e;
    c.want_ref = cpu_got == NULL;
    c.nmse_tol = 1e-9;
    c.abs_tol = 1e-3;
    sc_row_t row = {.backend = e->device == TS_CPU ? "cpu" : "cuda",
                    .against = cpu_got ? "cpu" : "ref",
                    .op = CASES[k].op};
    if (CASES[k].run == case_rng_kat && !cpu_got)
        row.against = "kat";
    row.err = CASES[k].run(&c);
    snprintf(row.size, sizeof row.size, "%s", c.size);
    if (row.err == TS_OK && cpu_got && cpu_n != c.n)
        row.err = TS_ESHAPE;
    if (row.err == TS_OK) {
        const float *want = cpu_got ? cpu_got : c.want;
        row.max_abs = ts_ref_max_abs_diff(c.got, want, c.n);
        row.nmse = ts_ref_nmse(c.got, want, c.n);
        /* written as !(x > tol) would let NaN pass; these fail on NaN */
        if (cpu_got)
            row.pass = row.nmse <= SC_CUDA_NMSE_TOL;
        else
            row.pass = row.nmse <= c.nmse_tol && row.max_abs <= c.abs_tol;
        if (keep && (*keep = malloc((size_t)c.n * sizeof(float))) != NULL) {
            memcpy(*keep, c.got, (size_t)c.n * sizeof(float));
            *keep_n = c.n;
        }
    }
    add_row(r, &row);
    sc_ctx_free(&c);
}

static void print_rows(const sc_report_t *r, const char *backend) {
    printf("%-20s %-30s %12s %12s  %s\n", "op", "size", "max abs err", "nmse", "result");
    for (int i = 0; i < r->nrows; i++) {
        const sc_row_t *w = &r->rows[i];
        if (strcmp(w->backend, backend) != 0 &&
            !(strcmp(backend, "cpu") == 0 && strcmp(w->backend, "host") == 0))
            continue;
        if (w->err != TS_OK)
            printf("%-20s %-30s %12s %12s  FAIL (%s)\n", w->op, w->size, "-", "-",
                   ts_strerror(w->err));
        else
            printf("%-20s %-30s %12.3g %12.3g  %s\n", w->op, w->size, w->max_abs, w->nmse,
                   w->pass ? "PASS" : "FAIL");
    }
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static void json_num(double x) {
    if (isfinite(x))
        printf("%.6g", x);
    else
        printf("null");
}

static void print_json(const sc_report_t *r, int threads, int built, int devices, const char *why,
                       int cuda_ran, const char *blas) {
    printf("{\n  \"cpu_threads\": %d,\n  \"gemm\": ", threads);
    json_str(blas);
    printf(",\n  \"cuda\": {\"built\": %s, \"devices\": %d, \"checked\": %s, \"reason\": ",
           built ? "true" : "false", devices, cuda_ran ? "true" : "false");
    json_str(why);
    printf("},\n  \"results\": [\n");
    for (int i = 0; i < r->nrows; i++) {
        const sc_row_t *w = &r->rows[i];
        printf("    {\"backend\": \"%s\", \"against\": \"%s\", \"op\": ", w->backend, w->against);
        json_str(w->op);
        printf(", \"size\": ");
        json_str(w->size);
        printf(", \"max_abs_err\": ");
        json_num(w->err == TS_OK ? w->max_abs : NAN);
        printf(", \"nmse\": ");
        json_num(w->err == TS_OK ? w->nmse : NAN);
        printf(", \"pass\": %s, \"error\": ", w->pass ? "true" : "false");
        json_str(w->err == TS_OK ? "" : ts_strerror(w->err));
        printf("}%s\n", i + 1 < r->nrows ? "," : "");
    }
    printf("  ],\n  \"passed\": %d,\n  \"failed\": %d\n}\n", r->nrows - r->failed, r->failed);
}

/* ---- the verb ------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: tessera selfcheck [--threads N] [--cpu-only] [--json]\n"
               "\n"
               "Runs the forward ops on a CPU engine against naive double-precision references,\n"
               "checks the Philox4x32-10 generator against Random123's known-answer vectors, and,\n"
               "when a CUDA device is present, runs the same ops on it against the CPU's answers.\n"
               "Exits 1 when any check fails.\n"
               "\n"
               "  --threads N   CPU engine threads (default: one per online core)\n"
               "  --cpu-only    do not use a CUDA device even when one is present\n"
               "  --json        print one JSON document instead of the table\n"
               "  -h, --help    show this text\n");
}

typedef struct {
    int json, cpu_only, threads;
} sc_opts_t;

/* Everything one self-check opens, and its report (sc_free releases the engines). */
typedef struct {
    sc_opts_t o;
    ts_engine_t cpu, gpu;
    int have_gpu;  /* the CUDA engine runs the cases too */
    int built;     /* the CUDA backend is built in */
    int devices;   /* CUDA devices found */
    char why[256]; /* why CUDA is not checked */
    sc_report_t report;
    char blas_line[512]; /* the GEMM kernels, said (check_blas) */
} sc_run_t;

/* --threads' value: a whole number from 1 to 1024. 0, or 2 with the message printed. */
static int parse_threads(const char *v, int *threads) {
    char *end = NULL;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || n < 1 || n > 1024) {
        fprintf(stderr,
                "tessera selfcheck: --threads needs a whole number from 1 to "
                "1024 (got '%s')\n",
                v ? v : "");
        return 2;
    }
    *threads = (int)n;
    return 0;
}

/* The options from the command line: TS_ARGS_RUN, or the exit code as ts_args_parse's (0 after
 * --help, 2 after a usage error). */
static int parse_opts(int argc, char **argv, sc_opts_t *o) {
    *o = (sc_opts_t){0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--cpu-only") == 0) {
            o->cpu_only = 1;
        } else if (strcmp(a, "--threads") == 0 || strncmp(a, "--threads=", 10) == 0) {
            const char *v = a[9] == '=' ? a + 10 : (i + 1 < argc ? argv[++i] : NULL);
            if (parse_threads(v, &o->threads))
                return 2;
        } else {
            fprintf(stderr,
                    "tessera selfcheck: unknown option '%s' (see tessera selfcheck --help)\n", a);
            return 2;
        }
    }
    return TS_ARGS_RUN;
}

/* The CPU engine, and the CUDA engine on device 0 when there is one (and no --cpu-only); why
 * says why CUDA is not checked. 0, or 1 with the message printed. */
static int open_engines(sc_run_t *r) {
    ts_engine_opts_t co = {.device = TS_CPU, .threads = r->o.threads};
    int rc = ts_engine_init(&r->cpu, &co);
    if (rc != TS_OK) {
        fprintf(stderr, "tessera selfcheck: cannot start the CPU engine: %s\n", ts_strerror(rc));
        return 1;
    }
    r->built = ts_cuda_built();
    r->devices = ts_cuda_device_count(r->why, sizeof r->why);
    if (r->devices > 0 && !r->o.cpu_only) {
        ts_engine_opts_t go = {.device = TS_CUDA, .gpu = 0};
        rc = ts_engine_init(&r->gpu, &go);
        if (rc == TS_OK)
            r->have_gpu = 1;
        else
            snprintf(r->why, sizeof r->why, "CUDA engine on device 0 failed: %s", ts_strerror(rc));
    } else if (r->devices > 0) {
        snprintf(r->why, sizeof r->why, "--cpu-only");
    }
    return 0;
}

/* The Philox KATs, then every case on the CPU and, with a CUDA engine, on it against the CPU. */
static void run_checks(sc_run_t *r) {
    check_blas(&r->report, r->blas_line, sizeof r->blas_line);
    check_philox_kat(&r->report);
    for (int k = 0; k < NCASES; k++) {
        float *cpu_got = NULL;
        int64_t cpu_n = 0;
        run_case(&r->report, k, &r->cpu, NULL, 0, r->have_gpu ? &cpu_got : NULL, &cpu_n);
        if (r->have_gpu) {
            if (cpu_got) {
                run_case(&r->report, k, &r->gpu, cpu_got, cpu_n, NULL, NULL);
            } else { /* the CPU run failed: nothing to compare the CUDA answer with */
                sc_row_t row = {
                    .backend = "cuda", .against = "cpu", .op = CASES[k].op, .err = TS_EINVAL};
                snprintf(row.size, sizeof row.size, "(CPU run failed)");
                add_row(&r->report, &row);
            }
        }
        free(cpu_got);
    }
}

/* The rows of each backend under a heading, and the count. */
static void print_table(const sc_run_t *r) {
    const sc_report_t *report = &r->report;
    printf("tessera selfcheck: CPU engine (%d threads) against the naive references of "
           "kernels/ref.c\nGEMM: %s\n\n",
           r->cpu.threads, r->blas_line);
    print_rows(report, "cpu");
    printf("\n");
    if (r->have_gpu) {
        printf("CUDA: %d device(s); device 0 against the CPU engine (pass: nmse <= %g)\n\n",
               r->devices, SC_CUDA_NMSE_TOL);
        print_rows(report, "cuda");
        printf("\n");
    } else if (!r->built) {
        printf("CUDA: not checked: %s\n\n", r->why);
    } else {
        printf("CUDA: backend built, not checked: %s\n\n",
               r->devices > 0 ? r->why : (r->why[0] ? r->why : "no CUDA device"));
    }
    printf("selfcheck: %d passed, %d failed\n", report->nrows - report->failed, report->failed);
}

static void sc_free(sc_run_t *r) {
    if (r->have_gpu)
        ts_engine_free(&r->gpu);
    ts_engine_free(&r->cpu);
}

int ts_cmd_selfcheck(int argc, char **argv) {
    sc_run_t r;
    memset(&r, 0, sizeof r);
    int pr = parse_opts(argc, argv, &r.o);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (open_engines(&r))
        return 1;
    run_checks(&r);
    if (r.o.json)
        print_json(&r.report, r.cpu.threads, r.built, r.devices, r.why, r.have_gpu, r.blas_line);
    else
        print_table(&r);
    sc_free(&r);
    return r.report.failed ? 1 : 0;
}
