/*
 * test_ops_forward.c — every forward op of kernels/ops.h on a CPU engine, against kernels/ref.c.
 *
 * Inputs are pseudo-random (a splitmix64 generator local to this file, fixed seeds); sizes
 * include the degenerate (one row, C = 1), the odd (rows not a multiple of the 2 worker threads,
 * T = 49 tokens of a 28×28 image in 4×4 patches) and the large. The reference accumulates in
 * double and rounds once, so the tolerances below are the float rounding the op itself may do:
 *
 *   exact (0)              fill, add, scale, embedding, patchify/unpatchify, pos_embed (≤ 1 ulp)
 *   4e-6 abs + 1e-6 rel    modulate, gate_residual, axpy, ema (a few roundings of O(1) values)
 *   1e-6 abs + 1e-5 rel    gelu, silu, softmax (a few ulp of a libm transcendental)
 *   2e-5 abs + 1e-5 rel    layernorm, attention (row statistics, softmax, dot products)
 *   1e-6·K abs + 1e-5 rel  linear, matmul (sgemm over K products of values in [-1, 1])
 *   timestep embedding     2e-6 + 2e-6·|arg|: DiT evaluates the frequencies and the argument in
 *                          float32, so a phase of 1000 carries ~1e-3 of rounding by design
 *   sums                   1e-6·|ref| + 1e-8·Σ|x| (double accumulator, one final rounding)
 *   mse                    1e-5 relative
 *   adamw                  param 1e-6 abs + 1e-5 rel, m 2e-7 abs + 1e-5 rel, v 1e-5 rel, over
 *                          several steps (the float op rounds m's two terms, which may cancel)
 *
 * Not covered here: gradients (test_ops_backward.c), dtype conversion (test_convert.c), the RNG
 * (test_rng.c), argument errors (test_api_errors.c).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/ops.h"
#include "kernels/ref.h"

/* ---- helpers --------------------------------------------------------------------------- */

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != TS_OK) {                                                                        \
            print_error("%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #expr, rc_,            \
                        ts_strerror(rc_));                                                         \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

typedef struct {
    uint64_t s;
} trng_t;

static uint64_t trng_next(trng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float trng_uniform(trng_t *r, float lo, float hi) {
    double u = (double)(trng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

static float *F(const ts_tensor_t *t) { return (float *)t->data; }

static void new_f32(ts_tensor_t *t, int ndim, const int64_t *shape) {
    int rc = ts_tensor_alloc(t, TS_F32, TS_CPU, ndim, shape);
    if (rc != TS_OK) {
        print_error("ts_tensor_alloc failed: %s\n", ts_strerror(rc));
        fail();
    }
}

static void fill_uniform(trng_t *r, ts_tensor_t *t, float lo, float hi) {
    int64_t n = ts_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        F(t)[i] = trng_uniform(r, lo, hi);
}

static float *host_copy(const ts_tensor_t *t) {
    size_t bytes = ts_tensor_nbytes(t);
    float *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    memcpy(p, t->data, bytes);
    return p;
}

/* Fails the test, naming the op and the worst element, when any |got − want| > atol + rtol·|want|
 * (a NaN anywhere in got where want is a number also fails). */
static void check_close(const char *what, const float *got, const float *want, int64_t n,
                        double atol, double rtol) {
    int64_t worst = -1;
    double worst_excess = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        if (isnan(w) && isnan(g))
            continue;
        double err = fabs(g - w);
        double lim = atol + rtol * fabs(w);
        if (g == w)
            continue;
        if (isnan(err) || err > lim) {
            double excess = isnan(err) ? INFINITY : err / (lim > 0 ? lim : 1e-300);
            if (worst < 0 || excess > worst_excess) {
                worst = i;
                worst_excess = excess;
            }
        }
    }
    if (worst >= 0) {
        print_error("%s: element %lld of %lld: got %.9g, expected %.9g (|diff| %.3g > atol %.3g "
                    "+ rtol %.3g·|expected|); max |diff| %.3g\n",
                    what, (long long)worst, (long long)n, got[worst], want[worst],
                    fabs((double)got[worst] - want[worst]), atol, rtol,
                    ts_ref_max_abs_diff(got, want, n));
        fail();
    }
}

static void check_scalar(const char *what, double got, double want, double tol) {
    if (!(fabs(got - want) <= tol)) {
        print_error("%s: got %.10g, expected %.10g (|diff| %.3g > tol %.3g)\n", what, got, want,
                    fabs(got - want), tol);
        fail();
    }
}

static int setup_engine(void **state) {
    ts_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return -1;
    ts_engine_opts_t opts = {.device = TS_CPU, .threads = 2, .gpu = 0};
    if (ts_engine_init(e, &opts) != TS_OK) {
        free(e);
        return -1;
    }
    *state = e;
    return 0;
}

static int teardown_engine(void **state) {
    ts_engine_t *e = *state;
    ts_engine_free(e);
    free(e);
    return 0;
}

/* ---- linear and matmul ----------------------------------------------------------------- */

static void test_linear(void **state) {
    ts_engine_t *e = *state;
    /* (leading dims, K, N): one row, one feature; odd rows; 3-D (B, T = 49, K); larger */
    static const struct {
        int ndim;
        int64_t lead[2], K, N;
    } cases[] = {
        {2, {1, 0}, 1, 1},  {2, {7, 0}, 5, 3},     {3, {3, 49}, 32, 48},
        {3, {2, 5}, 1, 17}, {2, {64, 0}, 128, 96}, {2, {13, 0}, 257, 3},
    };
    trng_t r = {1};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t K = cases[c].K, N = cases[c].N;
        int64_t R = cases[c].lead[0] * (cases[c].ndim == 3 ? cases[c].lead[1] : 1);
        ts_tensor_t inp, out, w, b;
        if (cases[c].ndim == 3) {
            new_f32(&inp, 3, TS_SHAPE(cases[c].lead[0], cases[c].lead[1], K));
            new_f32(&out, 3, TS_SHAPE(cases[c].lead[0], cases[c].lead[1], N));
        } else {
            new_f32(&inp, 2, TS_SHAPE(R, K));
            new_f32(&out, 2, TS_SHAPE(R, N));
        }
        new_f32(&w, 2, TS_SHAPE(N, K));
        new_f32(&b, 1, TS_SHAPE(N));
        fill_uniform(&r, &inp, -1, 1);
        fill_uniform(&r, &w, -1, 1);
        fill_uniform(&r, &b, -1, 1);
        float *want = malloc((size_t)(R * N) * sizeof(float));
        assert_non_null(want);
        char what[128];
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            fill_uniform(&r, &out, 50, 60); /* overwritten, never read */
            CHECK_OK(ts_linear_forward(e, &out, &inp, &w, with_bias ? &b : NULL));
            ts_ref_linear(want, F(&inp), F(&w), with_bias ? F(&b) : NULL, R, K, N);
            snprintf(what, sizeof what, "linear R=%lld K=%lld N=%lld %s bias", (long long)R,
                     (long long)K, (long long)N, with_bias ? "with" : "without");
            check_close(what, F(&out), want, R * N, 1e-6 * (double)K, 1e-5);
        }
        free(want);
        ts_tensor_free(&inp);
        ts_tensor_free(&out);
        ts_tensor_free(&w);
        ts_tensor_free(&b);
    }
}

/* One matmul case: c (batch?, M, N) = alpha·op(a)·op(b) + beta·c, checked per batch entry. */
static void run_matmul_case(ts_engine_t *e, trng_t *r, int64_t batch, int64_t M, int64_t N,
                            int64_t K, int ta, int tb, float alpha, float beta) {
    ts_tensor_t a, b, c;
    int64_t ar = ta ? K : M, ac = ta ? M : K; /* a as stored */
    int64_t br = tb ? N : K, bc = tb ? K : N; /* b as stored */
    if (batch > 0) {
        new_f32(&a, 3, TS_SHAPE(batch, ar, ac));
        new_f32(&b, 3, TS_SHAPE(batch, br, bc));
        new_f32(&c, 3, TS_SHAPE(batch, M, N));
    } else {
        new_f32(&a, 2, TS_SHAPE(ar, ac));
        new_f32(&b, 2, TS_SHAPE(br, bc));
        new_f32(&c, 2, TS_SHAPE(M, N));
    }
    fill_uniform(r, &a, -1, 1);
    fill_uniform(r, &b, -1, 1);
    fill_uniform(r, &c, -1, 1);
    float *want = host_copy(&c);
    CHECK_OK(ts_matmul(e, &c, &a, ta, &b, tb, alpha, beta));
    int64_t nb = batch > 0 ? batch : 1;
    for (int64_t i = 0; i < nb; i++)
        ts_ref_matmul(want + i * M * N, F(&a) + i * M * K, ta, F(&b) + i * K * N, tb, M, N, K,
                      alpha, beta);
    char what[160];
    snprintf(what, sizeof what,
             "matmul batch=%lld M=%lld N=%lld K=%lld trans_a=%d trans_b=%d "
             "alpha=%g beta=%g",
             (long long)batch, (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta);
    check_close(what, F(&c), want, nb * M * N, 1e-6 * (double)K * fabs(alpha) + 1e-6, 1e-5);
    free(want);
    ts_tensor_free(&a);
    ts_tensor_free(&b);
    ts_tensor_free(&c);
}

static void test_matmul_2d(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 17, 65}, {64, 49, 16}, {2, 1, 9}};
    static const float ab[][2] = {{1.0f, 0.0f}, {0.5f, -2.0f}, {2.0f, 1.0f}};
    trng_t r = {2};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (size_t k = 0; k < sizeof ab / sizeof ab[0]; k++)
                    run_matmul_case(e, &r, 0, sizes[s][0], sizes[s][1], sizes[s][2], ta, tb,
                                    ab[k][0], ab[k][1]);
}

static void test_matmul_batched(void **state) {
    ts_engine_t *e = *state;
    trng_t r = {3};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            run_matmul_case(e, &r, 3, 7, 5, 9, ta, tb, 1.5f, 0.5f);
            run_matmul_case(e, &r, 1, 4, 4, 4, ta, tb, 1.0f, 0.0f);
            run_matmul_case(e, &r, 5, 49, 49, 8, ta, tb, 0.25f, 0.0f); /* attention-shaped */
        }
}

/* ---- normalisation and activations ------------------------------------------------------ */

static void test_layernorm(void **state) {
    ts_engine_t *e = *state;
    static const struct {
        int64_t lead0, lead1, C;
        float offset;
    } cases[] = {{1, 1, 1, 0},   {2, 1, 1, 3},    {7, 1, 5, 0},
                 {3, 49, 64, 0}, {13, 1, 257, 3}, {1, 1, 2, -1}};
    trng_t r = {4};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t R = cases[c].lead0 * cases[c].lead1, C = cases[c].C;
        ts_tensor_t inp, out, mean, rstd;
        new_f32(&inp, 3, TS_SHAPE(cases[c].lead0, cases[c].lead1, C));
        new_f32(&out, 3, TS_SHAPE(cases[c].lead0, cases[c].lead1, C));
        new_f32(&mean, 1, TS_SHAPE(R));
        new_f32(&rstd, 1, TS_SHAPE(R));
        fill_uniform(&r, &inp, cases[c].offset - 2, cases[c].offset + 2);
        float *want = malloc((size_t)(R * C) * sizeof(float));
        float *wmean = malloc((size_t)R * sizeof(float)),
              *wrstd = malloc((size_t)R * sizeof(float));
        assert_true(want && wmean && wrstd);
        ts_ref_layernorm(want, wmean, wrstd, F(&inp), R, C);
        char what[128];
        CHECK_OK(ts_layernorm_forward(e, &out, &mean, &rstd, &inp));
        snprintf(what, sizeof what, "layernorm out R=%lld C=%lld", (long long)R, (long long)C);
        check_close(what, F(&out), want, R * C, 2e-5, 1e-5);
        snprintf(what, sizeof what, "layernorm mean R=%lld C=%lld", (long long)R, (long long)C);
        check_close(what, F(&mean), wmean, R, 1e-6, 1e-6);
        snprintf(what, sizeof what, "layernorm rstd R=%lld C=%lld", (long long)R, (long long)C);
        check_close(what, F(&rstd), wrstd, R, 0, 1e-4);
        if (C == 1) /* zero variance: rstd = 1/sqrt(eps) exactly as torch, and out = 0 */
            check_scalar("layernorm rstd at C=1", F(&rstd)[0], 1000.0, 1e-3);
        /* mean and rstd may be NULL at inference */
        fill_uniform(&r, &out, 50, 60);
        CHECK_OK(ts_layernorm_forward(e, &out, NULL, NULL, &inp));
        snprintf(what, sizeof what, "layernorm (no stats) R=%lld C=%lld", (long long)R,
                 (long long)C);
        check_close(what, F(&out), want, R * C, 2e-5, 1e-5);
        free(want);
        free(wmean);
        free(wrstd);
        ts_tensor_free(&inp);
        ts_tensor_free(&out);
        ts_tensor_free(&mean);
        ts_tensor_free(&rstd);
    }
}

typedef int (*unary_op_t)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *);
typedef void (*unary_ref_t)(float *, const float *, int64_t);

static void check_unary(ts_engine_t *e, const char *name, unary_op_t op, unary_ref_t ref) {
    static const int64_t sizes[] = {1, 7, 1001, 65537};
    trng_t r = {5};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t inp, out;
        new_f32(&inp, 1, TS_SHAPE(n));
        new_f32(&out, 1, TS_SHAPE(n));
        fill_uniform(&r, &inp, -6, 6);
        static const float special[] = {0.0f, -20.0f, 20.0f, 1e-4f, -3.0f};
        for (int64_t i = 0; i < n && i < 5; i++)
            F(&inp)[i] = special[i];
        float *want = malloc((size_t)n * sizeof(float));
        assert_non_null(want);
        ref(want, F(&inp), n);
        char what[96];
        CHECK_OK(op(e, &out, &inp));
        snprintf(what, sizeof what, "%s n=%lld", name, (long long)n);
        check_close(what, F(&out), want, n, 1e-6, 1e-5);
        /* in place: out aliases inp */
        CHECK_OK(op(e, &inp, &inp));
        snprintf(what, sizeof what, "%s in place n=%lld", name, (long long)n);
        check_close(what, F(&inp), want, n, 1e-6, 1e-5);
        free(want);
        ts_tensor_free(&inp);
        ts_tensor_free(&out);
    }
}

static void test_gelu(void **state) { check_unary(*state, "gelu", ts_gelu_forward, ts_ref_gelu); }

static void test_silu(void **state) { check_unary(*state, "silu", ts_silu_forward, ts_ref_silu); }

static void test_softmax(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][2] = {{1, 1}, {7, 5}, {49, 49}, {5, 1000}, {3, 17}, {2, 2}};
    trng_t r = {6};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t R = cases[c][0], C = cases[c][1];
        ts_tensor_t inp, out;
        new_f32(&inp, 2, TS_SHAPE(R, C));
        new_f32(&out, 2, TS_SHAPE(R, C));
        fill_uniform(&r, &inp, -5, 5);
        if (R >= 2 && C >= 2) { /* huge logits must not overflow: exp is taken after the max */
            F(&inp)[0] = 1000.0f;
            F(&inp)[1] = 999.0f;
            F(&inp)[C] = -1000.0f;
            F(&inp)[C + 1] = -1000.0f;
        }
        float *want = malloc((size_t)(R * C) * sizeof(float));
        assert_non_null(want);
        ts_ref_softmax(want, F(&inp), R, C);
        char what[96];
        CHECK_OK(ts_softmax_forward(e, &out, &inp));
        snprintf(what, sizeof what, "softmax R=%lld C=%lld", (long long)R, (long long)C);
        check_close(what, F(&out), want, R * C, 1e-6, 1e-5);
        for (int64_t i = 0; i < R; i++) {
            double s = 0;
            for (int64_t j = 0; j < C; j++) {
                float v = F(&out)[i * C + j];
                assert_true(isfinite(v) && v >= 0.0f && v <= 1.0f);
                s += v;
            }
            snprintf(what, sizeof what, "softmax row %lld sum, R=%lld C=%lld", (long long)i,
                     (long long)R, (long long)C);
            check_scalar(what, s, 1.0, 1e-5);
        }
        if (R >= 2 && C >= 2) /* e^-1 / (1 + e^-1 + ...) for the 1000/999 row */
            assert_true(F(&out)[0] > F(&out)[1] && F(&out)[1] > 0.2f);
        CHECK_OK(ts_softmax_forward(e, &inp, &inp)); /* in place */
        snprintf(what, sizeof what, "softmax in place R=%lld C=%lld", (long long)R, (long long)C);
        check_close(what, F(&inp), want, R * C, 1e-6, 1e-5);
        free(want);
        ts_tensor_free(&inp);
        ts_tensor_free(&out);
    }
}

/* ---- attention ------------------------------------------------------------------------- */

static void test_attention(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][4] = {/* B, T, C, heads */
                                       {1, 1, 4, 1},  {2, 5, 8, 2},   {2, 49, 32, 4},
                                       {1, 7, 12, 3}, {3, 16, 48, 1}, {1, 3, 6, 6}};
    trng_t r = {7};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t B = cases[c][0], T = cases[c][1], C = cases[c][2], H = cases[c][3];
        ts_tensor_t qkv, out, att;
        new_f32(&qkv, 3, TS_SHAPE(B, T, 3 * C));
        new_f32(&out, 3, TS_SHAPE(B, T, C));
        new_f32(&att, 4, TS_SHAPE(B, H, T, T));
        fill_uniform(&r, &qkv, -2, 2);
        float *want = malloc((size_t)(B * T * C) * sizeof(float));
        float *watt = malloc((size_t)(B * H * T * T) * sizeof(float));
        assert_true(want && watt);
        ts_ref_attention(want, watt, F(&qkv), B, T, C, H);
        CHECK_OK(ts_attention_forward(e, &out, &att, &qkv, (int)H));
        char what[128];
        snprintf(what, sizeof what, "attention out B=%lld T=%lld C=%lld heads=%lld", (long long)B,
                 (long long)T, (long long)C, (long long)H);
        check_close(what, F(&out), want, B * T * C, 2e-5, 1e-5);
        snprintf(what, sizeof what, "attention att B=%lld T=%lld C=%lld heads=%lld", (long long)B,
                 (long long)T, (long long)C, (long long)H);
        check_close(what, F(&att), watt, B * H * T * T, 2e-6, 1e-5);
        free(want);
        free(watt);
        ts_tensor_free(&qkv);
        ts_tensor_free(&out);
        ts_tensor_free(&att);
    }
}

/* ---- adaLN pieces ---------------------------------------------------------------------- */

static const int64_t mod_cases[][4] = {/* B, T, C, M */
                                       {1, 1, 1, 2},
                                       {2, 49, 8, 6},
                                       {3, 7, 5, 2},
                                       {2, 16, 64, 6}};
static const int mod_idx[][3] = {
    /* shift, scale, gate */ {0, 1, 1}, {3, 4, 5}, {1, 0, 0}, {0, 1, 2}};

static void test_modulate(void **state) {
    ts_engine_t *e = *state;
    trng_t r = {8};
    for (size_t c = 0; c < sizeof mod_cases / sizeof mod_cases[0]; c++) {
        int64_t B = mod_cases[c][0], T = mod_cases[c][1], C = mod_cases[c][2], M = mod_cases[c][3];
        int sh = mod_idx[c][0], sc = mod_idx[c][1];
        ts_tensor_t x, mod, out;
        new_f32(&x, 3, TS_SHAPE(B, T, C));
        new_f32(&out, 3, TS_SHAPE(B, T, C));
        new_f32(&mod, 2, TS_SHAPE(B, M * C));
        fill_uniform(&r, &x, -2, 2);
        fill_uniform(&r, &mod, -1, 1);
        float *want = malloc((size_t)(B * T * C) * sizeof(float));
        assert_non_null(want);
        ts_ref_modulate(want, F(&x), F(&mod), B, T, C, M, sh, sc);
        char what[128];
        CHECK_OK(ts_modulate_forward(e, &out, &x, &mod, sh, sc));
        snprintf(what, sizeof what, "modulate B=%lld T=%lld C=%lld M=%lld shift=%d scale=%d",
                 (long long)B, (long long)T, (long long)C, (long long)M, sh, sc);
        check_close(what, F(&out), want, B * T * C, 4e-6, 1e-6);
        CHECK_OK(ts_modulate_forward(e, &x, &x, &mod, sh, sc)); /* in place */
        check_close("modulate in place", F(&x), want, B * T * C, 4e-6, 1e-6);
        free(want);
        ts_tensor_free(&x);
        ts_tensor_free(&out);
        ts_tensor_free(&mod);
    }
}

static void test_gate_residual(void **state) {
    ts_engine_t *e = *state;
    trng_t r = {9};
    for (size_t c = 0; c < sizeof mod_cases / sizeof mod_cases[0]; c++) {
        int64_t B = mod_cases[c][0], T = mod_cases[c][1], C = mod_cases[c][2], M = mod_cases[c][3];
        int g = mod_idx[c][2];
        ts_tensor_t res, y, mod, out;
        new_f32(&res, 3, TS_SHAPE(B, T, C));
        new_f32(&y, 3, TS_SHAPE(B, T, C));
        new_f32(&out, 3, TS_SHAPE(B, T, C));
        new_f32(&mod, 2, TS_SHAPE(B, M * C));
        fill_uniform(&r, &res, -2, 2);
        fill_uniform(&r, &y, -2, 2);
        fill_uniform(&r, &mod, -1, 1);
        float *want = malloc((size_t)(B * T * C) * sizeof(float));
        assert_non_null(want);
        ts_ref_gate_residual(want, F(&res), F(&y), F(&mod), B, T, C, M, g);
        char what[128];
        CHECK_OK(ts_gate_residual_forward(e, &out, &res, &y, &mod, g));
        snprintf(what, sizeof what, "gate_residual B=%lld T=%lld C=%lld M=%lld gate=%d",
                 (long long)B, (long long)T, (long long)C, (long long)M, g);
        check_close(what, F(&out), want, B * T * C, 4e-6, 1e-6);
        CHECK_OK(ts_gate_residual_forward(e, &res, &res, &y, &mod, g)); /* in place */
        check_close("gate_residual in place", F(&res), want, B * T * C, 4e-6, 1e-6);
        free(want);
        ts_tensor_free(&res);
        ts_tensor_free(&y);
        ts_tensor_free(&out);
        ts_tensor_free(&mod);
    }
}

/* ---- elementwise ----------------------------------------------------------------------- */

static void test_add_axpy_scale_fill(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[] = {1, 7, 1000, 100003};
    trng_t r = {10};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t a, b, out;
        new_f32(&a, 1, TS_SHAPE(n));
        new_f32(&b, 1, TS_SHAPE(n));
        new_f32(&out, 1, TS_SHAPE(n));
        fill_uniform(&r, &a, -3, 3);
        fill_uniform(&r, &b, -3, 3);
        float *want = malloc((size_t)n * sizeof(float));
        float *a0 = host_copy(&a), *b0 = host_copy(&b);
        assert_non_null(want);
        char what[96];

        /* add: one IEEE addition, so exactly the double sum rounded once */
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)((double)a0[i] + (double)b0[i]);
        CHECK_OK(ts_add(e, &out, &a, &b));
        snprintf(what, sizeof what, "add n=%lld", (long long)n);
        check_close(what, F(&out), want, n, 0, 0);
        CHECK_OK(ts_add(e, &a, &a, &b)); /* out aliases a */
        check_close("add out==a", F(&a), want, n, 0, 0);
        memcpy(a.data, a0, (size_t)n * sizeof(float));
        CHECK_OK(ts_add(e, &b, &a, &b)); /* out aliases b */
        check_close("add out==b", F(&b), want, n, 0, 0);
        memcpy(b.data, b0, (size_t)n * sizeof(float));

        /* axpy */
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)((double)b0[i] + (double)-0.75f * (double)a0[i]);
        CHECK_OK(ts_axpy(e, &b, -0.75f, &a));
        snprintf(what, sizeof what, "axpy n=%lld", (long long)n);
        check_close(what, F(&b), want, n, 4e-7, 1e-6);

        /* scale: one multiplication, exact */
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)((double)a0[i] * 1.3f);
        CHECK_OK(ts_scale(e, &a, 1.3f));
        snprintf(what, sizeof what, "scale n=%lld", (long long)n);
        check_close(what, F(&a), want, n, 0, 0);

        /* fill and zero */
        CHECK_OK(ts_fill(e, &out, -2.5f));
        for (int64_t i = 0; i < n; i++)
            want[i] = -2.5f;
        check_close("fill", F(&out), want, n, 0, 0);
        CHECK_OK(ts_zero(e, &out));
        for (int64_t i = 0; i < n; i++)
            if (F(&out)[i] != 0.0f || signbit(F(&out)[i])) {
                print_error("zero n=%lld: element %lld is %g\n", (long long)n, (long long)i,
                            F(&out)[i]);
                fail();
            }
        free(want);
        free(a0);
        free(b0);
        ts_tensor_free(&a);
        ts_tensor_free(&b);
        ts_tensor_free(&out);
    }
    /* ts_zero works on any dtype */
    ts_tensor_t h;
    assert_int_equal(ts_tensor_alloc(&h, TS_F16, TS_CPU, 2, TS_SHAPE(3, 5)), TS_OK);
    memset(h.data, 0x3c, ts_tensor_nbytes(&h));
    CHECK_OK(ts_zero(e, &h));
    for (size_t i = 0; i < ts_tensor_nbytes(&h); i++)
        assert_int_equal(((unsigned char *)h.data)[i], 0);
    ts_tensor_free(&h);
}

static void test_add_bcast(void **state) {
    ts_engine_t *e = *state;
    /* x shape, b shape: bias over rows; pos_embed (T·C) over the batch; a scalar; 2-D b */
    static const struct {
        int xnd, bnd;
        int64_t xs[3], bs[2];
    } cases[] = {
        {2, 1, {7, 5, 0}, {5, 0}},  {3, 2, {3, 49, 16}, {49, 16}}, {2, 1, {4, 3, 0}, {1, 0}},
        {3, 1, {2, 3, 4}, {12, 0}}, {2, 1, {1, 1, 0}, {1, 0}},     {2, 1, {1000, 33, 0}, {33, 0}},
    };
    trng_t r = {11};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ts_tensor_t x, b, out;
        new_f32(&x, cases[c].xnd, cases[c].xs);
        new_f32(&out, cases[c].xnd, cases[c].xs);
        new_f32(&b, cases[c].bnd, cases[c].bs);
        fill_uniform(&r, &x, -3, 3);
        fill_uniform(&r, &b, -3, 3);
        int64_t n = ts_tensor_numel(&x), S = ts_tensor_numel(&b);
        float *want = malloc((size_t)n * sizeof(float));
        assert_non_null(want);
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)((double)F(&x)[i] + (double)F(&b)[i % S]);
        char what[96];
        CHECK_OK(ts_add_bcast_forward(e, &out, &x, &b));
        snprintf(what, sizeof what, "add_bcast n=%lld S=%lld", (long long)n, (long long)S);
        check_close(what, F(&out), want, n, 0, 0);
        CHECK_OK(ts_add_bcast_forward(e, &x, &x, &b)); /* in place */
        snprintf(what, sizeof what, "add_bcast in place n=%lld S=%lld", (long long)n, (long long)S);
        check_close(what, F(&x), want, n, 0, 0);
        free(want);
        ts_tensor_free(&x);
        ts_tensor_free(&b);
        ts_tensor_free(&out);
    }
}

/* ---- embeddings ------------------------------------------------------------------------ */

static void test_timestep_embedding(void **state) {
    ts_engine_t *e = *state;
    static const int64_t dims[] = {2, 3, 7, 64, 129, 256};
    static const struct {
        float scale, lo, hi;
    } regimes[] = {{1000.0f, 0.0f, 1.0f}, {1.0f, -3.0f, 3.0f}};
    trng_t r = {12};
    for (size_t g = 0; g < sizeof regimes / sizeof regimes[0]; g++) {
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            int64_t B = 5, D = dims[d], half = D / 2;
            float scale = regimes[g].scale;
            ts_tensor_t t, out;
            new_f32(&t, 1, TS_SHAPE(B));
            new_f32(&out, 2, TS_SHAPE(B, D));
            fill_uniform(&r, &t, regimes[g].lo, regimes[g].hi);
            F(&t)[0] = 0.0f; /* cos 0 = 1, sin 0 = 0 in every column */
            if (scale == 1000.0f)
                F(&t)[B - 1] = 1.0f;
            fill_uniform(&r, &out, 50, 60);
            float *want = malloc((size_t)(B * D) * sizeof(float));
            assert_non_null(want);
            ts_ref_timestep_embedding(want, F(&t), B, D, scale);
            CHECK_OK(ts_timestep_embedding_forward(e, &out, &t, scale));
            for (int64_t b = 0; b < B; b++) {
                for (int64_t i = 0; i < D; i++) {
                    /* tolerance grows with the phase: DiT computes it in float32 */
                    double freq = i < 2 * half ? exp(-log(10000.0) * (double)(i % half) / half) : 0;
                    double arg = fabs((double)scale * F(&t)[b] * freq);
                    double got = F(&out)[b * D + i], w = want[b * D + i];
                    if (!(fabs(got - w) <= 2e-6 + 2e-6 * arg)) {
                        print_error("timestep_embedding D=%lld scale=%g: t=%.9g column %lld: got "
                                    "%.9g, expected %.9g (phase %.6g)\n",
                                    (long long)D, scale, F(&t)[b], (long long)i, got, w, arg);
                        fail();
                    }
                }
                if (D % 2 == 1 && F(&out)[b * D + D - 1] != 0.0f) {
                    print_error("timestep_embedding D=%lld: pad column is %g, expected 0\n",
                                (long long)D, F(&out)[b * D + D - 1]);
                    fail();
                }
            }
            for (int64_t i = 0; i < half; i++) { /* t = 0: [cos, sin] = [1, 0] exactly */
                assert_true(F(&out)[i] == 1.0f);
                assert_true(F(&out)[half + i] == 0.0f);
            }
            free(want);
            ts_tensor_free(&t);
            ts_tensor_free(&out);
        }
    }
}

static void test_pos_embed_2d(void **state) {
    ts_engine_t *e = *state;
    static const int64_t grids[] = {1, 2, 7, 14};
    static const int64_t dims[] = {4, 8, 64, 128};
    for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            int64_t G = grids[g], D = dims[d], q = D / 4;
            ts_tensor_t out;
            new_f32(&out, 2, TS_SHAPE(G * G, D));
            float *want = malloc((size_t)(G * G * D) * sizeof(float));
            assert_non_null(want);
            ts_ref_pos_embed_2d(want, G, D);
            CHECK_OK(ts_pos_embed_2d(e, &out, (int)G));
            char what[96];
            snprintf(what, sizeof what, "pos_embed_2d grid=%lld D=%lld", (long long)G,
                     (long long)D);
            check_close(what, F(&out), want, G * G * D, 1.2e-7, 0); /* ≤ 1 ulp of |x| ≤ 1 */
            /* frequency 0 (ω = 1) spelled out: token m = i·grid + j holds sin j, cos j, sin i,
             * cos i — the column coordinate first, as DiT's meshgrid(w, h) does */
            for (int64_t i = 0; i < G; i++)
                for (int64_t j = 0; j < G; j++) {
                    const float *row = F(&out) + (i * G + j) * D;
                    if (fabs(row[0] - sin((double)j)) > 1.2e-7 ||
                        fabs(row[q] - cos((double)j)) > 1.2e-7 ||
                        fabs(row[2 * q] - sin((double)i)) > 1.2e-7 ||
                        fabs(row[3 * q] - cos((double)i)) > 1.2e-7) {
                        print_error("pos_embed_2d grid=%lld D=%lld token (row %lld, col %lld): "
                                    "[%g %g %g %g], expected [sin %lld, cos %lld, sin %lld, cos "
                                    "%lld]\n",
                                    (long long)G, (long long)D, (long long)i, (long long)j, row[0],
                                    row[q], row[2 * q], row[3 * q], (long long)j, (long long)j,
                                    (long long)i, (long long)i);
                        fail();
                    }
                }
            free(want);
            ts_tensor_free(&out);
        }
    }
}

static void test_embedding(void **state) {
    ts_engine_t *e = *state;
    static const int32_t ids_v[] = {3, 0, 10, 3, 7, 0};
    trng_t r = {13};
    int64_t V = 11, D = 7, B = 6;
    ts_tensor_t table, ids, out;
    new_f32(&table, 2, TS_SHAPE(V, D));
    new_f32(&out, 2, TS_SHAPE(B, D));
    assert_int_equal(ts_tensor_alloc(&ids, TS_I32, TS_CPU, 1, TS_SHAPE(B)), TS_OK);
    memcpy(ids.data, ids_v, sizeof ids_v);
    fill_uniform(&r, &table, -1, 1);
    float want[6 * 7];
    ts_ref_embedding(want, F(&table), ids_v, B, D);
    CHECK_OK(ts_embedding_forward(e, &out, &table, &ids));
    check_close("embedding V=11 D=7 B=6", F(&out), want, B * D, 0, 0);
    ts_tensor_free(&table);
    ts_tensor_free(&ids);
    ts_tensor_free(&out);
}

/* ---- patches --------------------------------------------------------------------------- */

static const int64_t patch_cases[][5] = {/* B, C, H, W, p */
                                         {1, 1, 4, 4, 2},
                                         {2, 3, 8, 12, 4},
                                         {2, 1, 28, 28, 4},
                                         {1, 2, 3, 5, 1},
                                         {3, 4, 6, 6, 2}};

static void test_patchify_unpatchify(void **state) {
    ts_engine_t *e = *state;
    trng_t r = {14};
    for (size_t c = 0; c < sizeof patch_cases / sizeof patch_cases[0]; c++) {
        int64_t B = patch_cases[c][0], C = patch_cases[c][1], H = patch_cases[c][2],
                W = patch_cases[c][3], p = patch_cases[c][4];
        int64_t T = (H / p) * (W / p), Fd = C * p * p, n = B * C * H * W;
        ts_tensor_t img, tok, img2, tokt;
        new_f32(&img, 4, TS_SHAPE(B, C, H, W));
        new_f32(&img2, 4, TS_SHAPE(B, C, H, W));
        new_f32(&tok, 3, TS_SHAPE(B, T, Fd));
        new_f32(&tokt, 3, TS_SHAPE(B, T, Fd));
        fill_uniform(&r, &img, -1, 1);
        float *want = malloc((size_t)n * sizeof(float));
        assert_non_null(want);
        char what[128];
        snprintf(what, sizeof what, "patchify B=%lld C=%lld H=%lld W=%lld p=%lld", (long long)B,
                 (long long)C, (long long)H, (long long)W, (long long)p);
        CHECK_OK(ts_patchify_forward(e, &tok, &img, (int)p));
        ts_ref_patchify(want, F(&img), B, C, H, W, p);
        check_close(what, F(&tok), want, n, 0, 0);

        /* unpatchify of random tokens */
        fill_uniform(&r, &tokt, -1, 1);
        CHECK_OK(ts_unpatchify_forward(e, &img2, &tokt, (int)p));
        ts_ref_unpatchify(want, F(&tokt), B, C, H, W, p);
        snprintf(what, sizeof what, "unpatchify B=%lld C=%lld H=%lld W=%lld p=%lld", (long long)B,
                 (long long)C, (long long)H, (long long)W, (long long)p);
        check_close(what, F(&img2), want, n, 0, 0);

        /* round trip: patchify's (c, py, px) features reordered to (py, px, c) and unpatchified
         * give the image back */
        for (int64_t bt = 0; bt < B * T; bt++)
            for (int64_t ch = 0; ch < C; ch++)
                for (int64_t pq = 0; pq < p * p; pq++)
                    F(&tokt)[bt * Fd + pq * C + ch] = F(&tok)[bt * Fd + ch * p * p + pq];
        CHECK_OK(ts_unpatchify_forward(e, &img2, &tokt, (int)p));
        snprintf(what, sizeof what,
                 "patchify/unpatchify round trip B=%lld C=%lld H=%lld W=%lld "
                 "p=%lld",
                 (long long)B, (long long)C, (long long)H, (long long)W, (long long)p);
        check_close(what, F(&img2), F(&img), n, 0, 0);
        free(want);
        ts_tensor_free(&img);
        ts_tensor_free(&img2);
        ts_tensor_free(&tok);
        ts_tensor_free(&tokt);
    }
}

/* ---- reductions and losses ------------------------------------------------------------- */

static double sum_abs(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += fabs((double)x[i]);
    return s;
}

static void test_sum_mean_sumsq(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[] = {1, 7, 1000, 100003};
    trng_t r = {15};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t x, out;
        new_f32(&x, 2, TS_SHAPE(1, n));
        new_f32(&out, 1, TS_SHAPE(1));
        fill_uniform(&r, &x, -1, 2);
        double ref = ts_ref_sum(F(&x), n), sa = sum_abs(F(&x), n);
        char what[96];
        float v;
        CHECK_OK(ts_sum_forward(e, &out, &x));
        CHECK_OK(ts_tensor_item(e, &out, &v));
        assert_true(v == F(&out)[0]);
        snprintf(what, sizeof what, "sum n=%lld", (long long)n);
        check_scalar(what, v, ref, 1e-6 * fabs(ref) + 1e-8 * sa);
        CHECK_OK(ts_mean_forward(e, &out, &x));
        snprintf(what, sizeof what, "mean n=%lld", (long long)n);
        check_scalar(what, F(&out)[0], ref / (double)n, (1e-6 * fabs(ref) + 1e-8 * sa) / (double)n);
        double sq = 0;
        for (int64_t i = 0; i < n; i++)
            sq += (double)F(&x)[i] * (double)F(&x)[i];
        CHECK_OK(ts_sumsq(e, &out, &x));
        snprintf(what, sizeof what, "sumsq n=%lld", (long long)n);
        check_scalar(what, F(&out)[0], sq, 1e-6 * sq);
        ts_tensor_free(&x);
        ts_tensor_free(&out);
    }
}

static void test_sum_rows(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][3] = {{1, 1, 1}, {7, 1, 5}, {3, 49, 16}, {1000, 1, 3}, {2, 2, 1}};
    trng_t r = {16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t R = cases[c][0] * cases[c][1], C = cases[c][2];
        ts_tensor_t x, out;
        new_f32(&x, 3, TS_SHAPE(cases[c][0], cases[c][1], C));
        new_f32(&out, 1, TS_SHAPE(C));
        fill_uniform(&r, &x, -1, 1);
        fill_uniform(&r, &out, 50, 60); /* overwritten */
        float *want = malloc((size_t)C * sizeof(float));
        assert_non_null(want);
        double maxabs = 0;
        for (int64_t j = 0; j < C; j++) {
            double s = 0, a = 0;
            for (int64_t i = 0; i < R; i++) {
                s += F(&x)[i * C + j];
                a += fabs((double)F(&x)[i * C + j]);
            }
            want[j] = (float)s;
            if (a > maxabs)
                maxabs = a;
        }
        CHECK_OK(ts_sum_rows(e, &out, &x));
        char what[96];
        snprintf(what, sizeof what, "sum_rows R=%lld C=%lld", (long long)R, (long long)C);
        check_close(what, F(&out), want, C, 1e-6 * maxabs + 1e-7, 1e-6);
        free(want);
        ts_tensor_free(&x);
        ts_tensor_free(&out);
    }
}

static void test_mse(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[] = {1, 7, 4097};
    trng_t r = {17};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t pred, target, loss;
        new_f32(&pred, 2, TS_SHAPE(n, 1));
        new_f32(&target, 2, TS_SHAPE(n, 1));
        new_f32(&loss, 1, TS_SHAPE(1));
        fill_uniform(&r, &pred, -2, 2);
        fill_uniform(&r, &target, -2, 2);
        CHECK_OK(ts_mse_forward(e, &loss, &pred, &target));
        double ref = ts_ref_mse(F(&pred), F(&target), n);
        char what[64];
        snprintf(what, sizeof what, "mse n=%lld", (long long)n);
        check_scalar(what, F(&loss)[0], ref, 1e-5 * ref + 1e-12);
        CHECK_OK(ts_mse_forward(e, &loss, &pred, &pred)); /* identical: exactly 0 */
        assert_true(F(&loss)[0] == 0.0f);
        ts_tensor_free(&pred);
        ts_tensor_free(&target);
        ts_tensor_free(&loss);
    }
}

/* ---- optimiser ------------------------------------------------------------------------- */

static void test_adamw(void **state) {
    ts_engine_t *e = *state;
    static const ts_adamw_t hps[] = {
        {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f},
        {5e-2f, 0.8f, 0.99f, 1e-6f, 0.1f}, /* large lr·wd: the decoupled decay is visible */
    };
    static const int64_t sizes[] = {1, 1001};
    trng_t r = {18};
    for (size_t h = 0; h < sizeof hps / sizeof hps[0]; h++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            int64_t n = sizes[s];
            const ts_adamw_t *hp = &hps[h];
            ts_tensor_t p, g, m, v;
            new_f32(&p, 1, TS_SHAPE(n));
            new_f32(&g, 1, TS_SHAPE(n));
            new_f32(&m, 1, TS_SHAPE(n));
            new_f32(&v, 1, TS_SHAPE(n));
            fill_uniform(&r, &p, -1, 1);
            float *rp = host_copy(&p), *rm = host_copy(&m), *rv = host_copy(&v);
            float *gs = malloc((size_t)n * sizeof(float));
            assert_non_null(gs);
            /* steps 1..5, then a jump to step 1000 (bias corrections near 1) */
            static const int64_t steps[] = {1, 2, 3, 4, 5, 1000};
            for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
                float grad_scale = (k == 2) ? 0.5f : 1.0f;
                fill_uniform(&r, &g, -1, 1);
                for (int64_t i = 0; i < n; i++)
                    gs[i] = F(&g)[i] * grad_scale;
                CHECK_OK(ts_adamw_step(e, &p, &g, &m, &v, hp, steps[k], grad_scale));
                ts_ref_adamw(rp, gs, rm, rv, n, hp->lr, hp->beta1, hp->beta2, hp->eps,
                             hp->weight_decay, steps[k]);
                char what[128];
                snprintf(what, sizeof what, "adamw n=%lld lr=%g wd=%g step=%lld param",
                         (long long)n, hp->lr, hp->weight_decay, (long long)steps[k]);
                check_close(what, F(&p), rp, n, 1e-6, 1e-5);
                snprintf(what, sizeof what, "adamw n=%lld step=%lld m", (long long)n,
                         (long long)steps[k]);
                check_close(what, F(&m), rm, n, 2e-7, 1e-5); /* β1·m and (1−β1)·g may cancel */
                snprintf(what, sizeof what, "adamw n=%lld step=%lld v", (long long)n,
                         (long long)steps[k]);
                check_close(what, F(&v), rv, n, 1e-12, 1e-5);
            }
            free(rp);
            free(rm);
            free(rv);
            free(gs);
            ts_tensor_free(&p);
            ts_tensor_free(&g);
            ts_tensor_free(&m);
            ts_tensor_free(&v);
        }
    }
}

/* With a zero gradient and zero moments, AdamW only decays: p ← p·(1 − lr·wd). */
static void test_adamw_decay_only(void **state) {
    ts_engine_t *e = *state;
    ts_adamw_t hp = {0.1f, 0.9f, 0.999f, 1e-8f, 0.5f};
    ts_tensor_t p, g, m, v;
    new_f32(&p, 1, TS_SHAPE(3));
    new_f32(&g, 1, TS_SHAPE(3));
    new_f32(&m, 1, TS_SHAPE(3));
    new_f32(&v, 1, TS_SHAPE(3));
    F(&p)[0] = 1.0f;
    F(&p)[1] = -2.0f;
    F(&p)[2] = 0.25f;
    CHECK_OK(ts_adamw_step(e, &p, &g, &m, &v, &hp, 1, 1.0f));
    float want[3] = {0.95f, -1.9f, 0.2375f};
    check_close("adamw decay only (g = 0)", F(&p), want, 3, 1e-7, 1e-6);
    ts_tensor_free(&p);
    ts_tensor_free(&g);
    ts_tensor_free(&m);
    ts_tensor_free(&v);
}

static void test_ema(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[] = {1, 7, 10001};
    trng_t r = {19};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t ema, p;
        new_f32(&ema, 1, TS_SHAPE(n));
        new_f32(&p, 1, TS_SHAPE(n));
        fill_uniform(&r, &ema, -1, 1);
        fill_uniform(&r, &p, -1, 1);
        float *want = malloc((size_t)n * sizeof(float));
        assert_non_null(want);
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)(0.999 * F(&ema)[i] + (1.0 - 0.999) * F(&p)[i]);
        CHECK_OK(ts_ema_update(e, &ema, &p, 0.999f));
        char what[64];
        snprintf(what, sizeof what, "ema n=%lld decay=0.999", (long long)n);
        check_close(what, F(&ema), want, n, 4e-7, 1e-6);
        CHECK_OK(ts_ema_update(e, &ema, &p, 0.0f)); /* decay 0 copies the parameters */
        check_close("ema decay=0", F(&ema), F(&p), n, 0, 0);
        free(want);
        ts_tensor_free(&ema);
        ts_tensor_free(&p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_matmul_2d),
        cmocka_unit_test(test_matmul_batched),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_modulate),
        cmocka_unit_test(test_gate_residual),
        cmocka_unit_test(test_add_axpy_scale_fill),
        cmocka_unit_test(test_add_bcast),
        cmocka_unit_test(test_timestep_embedding),
        cmocka_unit_test(test_pos_embed_2d),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_patchify_unpatchify),
        cmocka_unit_test(test_sum_mean_sumsq),
        cmocka_unit_test(test_sum_rows),
        cmocka_unit_test(test_mse),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adamw_decay_only),
        cmocka_unit_test(test_ema),
    };
    return cmocka_run_group_tests_name("ops_forward", tests, setup_engine, teardown_engine);
}
