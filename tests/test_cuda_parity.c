/*
 * test_cuda_parity.c — every op of kernels/ops.h on the CUDA engine against the CPU engine.
 *
 * Each op runs on both engines from the same inputs (made on the host by a splitmix64 generator
 * with fixed seeds, then copied to the GPU with ts_tensor_copy); gradient outputs start from the
 * same random values, so the += of every backward op is checked too. The CPU result is the
 * reference b and the GPU result a is accepted when the normalised error
 *     nmse = Σ (a − b)² / Σ b²
 * is at most 1e-6: the two backends share their per-element formulas (kernels/math.h) but add
 * in different orders and use different libm transcendentals and GEMM kernels. The RNG streams
 * and the dtype conversions use no transcendental and no reordered sum, so they must match bit
 * for bit (memcmp).
 *
 * The bf16 and f16 products (test_bf16, test_f16) are held against a naive reference on the
 * rounded operands instead, to 1e-9 (bf16 where the GPU has it: compute capability 8.0 or
 * newer); f16's rounding alone (a K = 1 product) matches the CPU's emulation bit for bit.
 *
 * Sizes are the realistic ones (B = 4 samples of T = 49 tokens, C = 128, 4 heads) plus odd ones
 * that catch indexing and grid-loop mistakes: n = 1000003 (prime) for the elementwise ops, row
 * widths that are not a multiple of the warp size, column sums tall enough to be split over
 * several blocks.
 *
 * The VAE's image ops (conv2d through im2col and the GEMM, GroupNorm with and without SiLU,
 * nearest ×2 upsampling) are held to the same tolerance; the upsampling, a copy, must be exact.
 *
 * Without a usable GPU (or without the CUDA backend) the test prints why and exits 77, which
 * ctest reports as skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "tests/testutil.h"

#define NMSE_TOL 1e-6
#define N_ODD 1000003 /* a prime element count for the elementwise ops */

/* B samples of T tokens of width C, with HEADS attention heads (DiT-S/2 at 112 px, reduced). */
#define B_ 4
#define T_ 49
#define C_ 128
#define HEADS 4

/* ---- fixture: one CPU and one CUDA engine ---------------------------------------------- */

typedef struct {
    ts_engine_t e[2]; /* [0] CPU, the reference; [1] CUDA */
} fixture_t;

static int group_setup(void **state) {
    fixture_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    ts_engine_opts_t cpu = {.device = TS_CPU, .threads = 0};
    ts_engine_opts_t gpu = {.device = TS_CUDA, .gpu = 0};
    int rc = ts_engine_init(&fx->e[0], &cpu);
    if (rc == TS_OK) {
        rc = ts_engine_init(&fx->e[1], &gpu);
        if (rc != TS_OK)
            ts_engine_free(&fx->e[0]);
    }
    if (rc != TS_OK) {
        fprintf(stderr, "test_cuda_parity: engine init failed: %s\n", ts_strerror(rc));
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int group_teardown(void **state) {
    fixture_t *fx = *state;
    ts_engine_free(&fx->e[1]);
    ts_engine_free(&fx->e[0]);
    free(fx);
    return 0;
}

/* Runs `call` on the CPU engine, then on the CUDA engine: inside it, E is the engine and
 * ON(p) the pair's tensor on that engine's device. */
#define BOTH(call)                                                                                 \
    for (int side = 0; side < 2; side++) {                                                         \
        ts_engine_t *E = &fx->e[side];                                                             \
        TU_CHECK_OK(call);                                                                         \
    }
#define ON(p) (&(p).t[side])

/* ---- inputs ---------------------------------------------------------------------------- */

/* The same tensor on the CPU ([0]) and on the GPU ([1]). */
typedef struct {
    ts_tensor_t t[2];
} pair_t;

/* Allocates both sides; the CPU side is zeroed by ts_tensor_alloc. */
static void pair_alloc(pair_t *p, ts_dtype_t dtype, int ndim, const int64_t *shape) {
    memset(p, 0, sizeof *p);
    TU_CHECK_OK(ts_tensor_alloc(&p->t[0], dtype, TS_CPU, ndim, shape));
    TU_CHECK_OK(ts_tensor_alloc(&p->t[1], dtype, TS_CUDA, ndim, shape));
}

/* Copies the CPU side to the GPU side. */
static void pair_upload(pair_t *p) { TU_CHECK_OK(ts_tensor_copy(&p->t[1], &p->t[0])); }

static float *host_f32(pair_t *p) { return (float *)p->t[0].data; }

/* F32 pair, uniform in [lo, hi) on both sides. */
static void pair_rand(pair_t *p, tu_rng_t *r, float lo, float hi, int ndim, const int64_t *shape) {
    pair_alloc(p, TS_F32, ndim, shape);
    int64_t n = ts_tensor_numel(&p->t[0]);
    for (int64_t i = 0; i < n; i++)
        host_f32(p)[i] = tu_rng_uniform(r, lo, hi);
    pair_upload(p);
}

/* F32 pair, zero on both sides. */
static void pair_zeros(pair_t *p, int ndim, const int64_t *shape) {
    pair_alloc(p, TS_F32, ndim, shape);
    pair_upload(p);
}

static void pair_free(pair_t *p) {
    ts_tensor_free(&p->t[0]);
    ts_tensor_free(&p->t[1]);
}

/* A host copy of the GPU side (caller frees). Synchronises the CUDA engine first, so a kernel
 * fault is reported here, by name, rather than as a failed copy. */
static void *download(fixture_t *fx, const pair_t *p) {
    TU_CHECK_OK(ts_engine_sync(&fx->e[1]));
    const ts_tensor_t *g = &p->t[1];
    void *buf = malloc(ts_tensor_nbytes(g));
    assert_non_null(buf);
    ts_tensor_t h;
    TU_CHECK_OK(ts_tensor_wrap(&h, buf, g->dtype, TS_CPU, g->ndim, g->shape));
    TU_CHECK_OK(ts_tensor_copy(&h, g));
    return buf;
}

/* Asserts nmse(GPU, CPU) ≤ NMSE_TOL for an F32 pair and prints it. */
static void expect_close(fixture_t *fx, const char *what, const pair_t *p) {
    float *a = download(fx, p);
    const float *b = (const float *)p->t[0].data;
    int64_t n = ts_tensor_numel(&p->t[0]);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    free(a);
    double nmse = den > 0.0 ? num / den : num; /* an all-zero reference must be matched exactly */
    printf("test_cuda_parity: %-40s nmse %.3e\n", what, nmse);
    if (!(nmse <= NMSE_TOL)) {
        print_error("%s: nmse %.3e exceeds %.1e\n", what, nmse, NMSE_TOL);
        fail();
    }
}

/* Asserts that the two sides hold the same bytes and prints the verdict. */
static void expect_identical(fixture_t *fx, const char *what, const pair_t *p) {
    unsigned char *a = download(fx, p);
    const unsigned char *b = p->t[0].data;
    size_t n = ts_tensor_nbytes(&p->t[0]), elem = ts_dtype_size(p->t[0].dtype);
    size_t first = n, diffs = 0;
    for (size_t i = 0; i < n; i += elem)
        if (memcmp(a + i, b + i, elem) != 0) {
            if (first == n)
                first = i / elem;
            diffs++;
        }
    free(a);
    if (diffs == 0) {
        printf("test_cuda_parity: %-40s bit-identical\n", what);
        return;
    }
    printf("test_cuda_parity: %-40s %zu elements differ (first at %zu)\n", what, diffs, first);
    print_error("%s: GPU and CPU differ in %zu elements\n", what, diffs);
    fail();
}

/* ---- elementwise and copies ------------------------------------------------------------ */

static void test_elementwise(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {1};
    pair_t y, x, a, out;
    pair_rand(&y, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));
    pair_rand(&x, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));
    pair_rand(&a, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));
    pair_zeros(&out, 1, TS_SHAPE(N_ODD));

    BOTH(ts_fill(E, ON(out), 0.375f));
    expect_close(fx, "fill", &out);
    BOTH(ts_axpy(E, ON(y), -0.7f, ON(x)));
    expect_close(fx, "axpy", &y);
    BOTH(ts_scale(E, ON(y), 1.3f));
    expect_close(fx, "scale", &y);
    BOTH(ts_affine(E, ON(y), 0.9f, -0.25f));
    expect_close(fx, "affine", &y);
    BOTH(ts_add(E, ON(out), ON(x), ON(a)));
    expect_close(fx, "add", &out);
    BOTH(ts_add(E, ON(a), ON(a), ON(x))); /* out aliases a */
    expect_close(fx, "add (in place)", &a);

    /* zero: any dtype; the F32 tensor holds data, the F16 one is filled through convert */
    BOTH(ts_zero(E, ON(y)));
    expect_identical(fx, "zero (F32)", &y);
    pair_t h;
    pair_alloc(&h, TS_F16, 1, TS_SHAPE(N_ODD));
    BOTH(ts_convert(E, ON(h), ON(x)));
    BOTH(ts_zero(E, ON(h)));
    expect_identical(fx, "zero (F16)", &h);

    pair_free(&h);
    pair_free(&y);
    pair_free(&x);
    pair_free(&a);
    pair_free(&out);
}

/* add_bcast forward and backward for x (rows, S) with b (S). */
static void bcast_case(fixture_t *fx, tu_rng_t *r, int ndim, const int64_t *xshape, int bdim,
                       const int64_t *bshape, const char *label) {
    char what[96];
    pair_t x, b, out, dx, db, dout;
    pair_rand(&x, r, -1.0f, 1.0f, ndim, xshape);
    pair_rand(&b, r, -1.0f, 1.0f, bdim, bshape);
    pair_zeros(&out, ndim, xshape);
    pair_rand(&dx, r, -1.0f, 1.0f, ndim, xshape);
    pair_rand(&db, r, -1.0f, 1.0f, bdim, bshape);
    pair_rand(&dout, r, -1.0f, 1.0f, ndim, xshape);

    BOTH(ts_add_bcast_forward(E, ON(out), ON(x), ON(b)));
    snprintf(what, sizeof what, "add_bcast_forward %s", label);
    expect_close(fx, what, &out);
    BOTH(ts_add_bcast_forward(E, ON(x), ON(x), ON(b))); /* out aliases x */
    snprintf(what, sizeof what, "add_bcast_forward %s in place", label);
    expect_close(fx, what, &x);
    BOTH(ts_add_bcast_backward(E, ON(dx), ON(db), ON(dout)));
    snprintf(what, sizeof what, "add_bcast_backward %s dx", label);
    expect_close(fx, what, &dx);
    snprintf(what, sizeof what, "add_bcast_backward %s db", label);
    expect_close(fx, what, &db);

    pair_free(&x);
    pair_free(&b);
    pair_free(&out);
    pair_free(&dx);
    pair_free(&db);
    pair_free(&dout);
}

static void test_add_bcast(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {2};
    bcast_case(fx, &r, 3, TS_SHAPE(B_, T_, C_), 1, TS_SHAPE(C_), "(B,T,C)+(C)");
    bcast_case(fx, &r, 3, TS_SHAPE(B_, T_, C_), 2, TS_SHAPE(T_, C_), "(B,T,C)+(T,C)");
    bcast_case(fx, &r, 2, TS_SHAPE(76923, 13), 1, TS_SHAPE(13), "(76923,13)+(13)");
}

/* ---- dtype conversion and finiteness --------------------------------------------------- */

/* Values across the whole range: random magnitudes from 2^-30 to 2^20, signed zeros, F16
 * subnormals and overflow, ties for both roundings, Inf and NaN. */
static void fill_specials(float *v, int64_t n, tu_rng_t *r) {
    for (int64_t i = 0; i < n; i++)
        v[i] = tu_rng_uniform(r, -1.0f, 1.0f) * ldexpf(1.0f, (int)(tu_rng_next(r) % 51) - 30);
    const float special[] = {
        0.0f,           -0.0f,          1.0f,        -1.0f,       65504.0f, 65520.0f,
        -65520.0f,      1e6f,           6e-8f,       3e-8f,       -6.1e-5f, 1.0009765625f,
        1.00048828125f, 1.00146484375f, 1.00390625f, 1.01171875f, 3.0e38f,  -3.4e38f,
        INFINITY,       -INFINITY,      NAN,         -NAN};
    size_t k = sizeof special / sizeof special[0];
    for (size_t i = 0; i < k && (int64_t)i < n; i++)
        v[(int64_t)i * (n / (int64_t)k)] = special[i];
}

/* Asserts that ts_check_finite returns `want` on both engines. */
static void expect_finite(fixture_t *fx, const pair_t *p, int want) {
    for (int side = 0; side < 2; side++)
        assert_int_equal(ts_check_finite(&fx->e[side], &p->t[side]), want);
}

static void test_convert(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {3};
    pair_t f32, f16, bf16, back16, backbf;
    pair_alloc(&f32, TS_F32, 1, TS_SHAPE(N_ODD));
    fill_specials(host_f32(&f32), N_ODD, &r);
    pair_upload(&f32);
    pair_alloc(&f16, TS_F16, 1, TS_SHAPE(N_ODD));
    pair_alloc(&bf16, TS_BF16, 1, TS_SHAPE(N_ODD));
    pair_alloc(&back16, TS_F32, 1, TS_SHAPE(N_ODD));
    pair_alloc(&backbf, TS_F32, 1, TS_SHAPE(N_ODD));

    BOTH(ts_convert(E, ON(f16), ON(f32)));
    expect_identical(fx, "convert F32 -> F16", &f16);
    BOTH(ts_convert(E, ON(back16), ON(f16)));
    expect_identical(fx, "convert F16 -> F32", &back16);
    BOTH(ts_convert(E, ON(bf16), ON(f32)));
    expect_identical(fx, "convert F32 -> BF16", &bf16);
    BOTH(ts_convert(E, ON(backbf), ON(bf16)));
    expect_identical(fx, "convert BF16 -> F32", &backbf);
    BOTH(ts_convert(E, ON(bf16), ON(f16)));
    expect_identical(fx, "convert F16 -> BF16", &bf16);

    /* check_finite: the specials hold Inf and NaN; a clean tensor passes, in every dtype */
    expect_finite(fx, &f32, TS_ENONFINITE);
    expect_finite(fx, &f16, TS_ENONFINITE);
    expect_finite(fx, &bf16, TS_ENONFINITE);
    for (int64_t i = 0; i < N_ODD; i++)
        host_f32(&f32)[i] = tu_rng_uniform(&r, -1000.0f, 1000.0f);
    pair_upload(&f32);
    expect_finite(fx, &f32, TS_OK);
    BOTH(ts_convert(E, ON(f16), ON(f32)));
    expect_finite(fx, &f16, TS_OK);
    BOTH(ts_convert(E, ON(bf16), ON(f32)));
    expect_finite(fx, &bf16, TS_OK);
    host_f32(&f32)[N_ODD - 1] = INFINITY; /* one bad value, in the very last element */
    pair_upload(&f32);
    expect_finite(fx, &f32, TS_ENONFINITE);
    printf("test_cuda_parity: %-40s agrees\n", "check_finite (F32, F16, BF16)");

    pair_free(&f32);
    pair_free(&f16);
    pair_free(&bf16);
    pair_free(&back16);
    pair_free(&backbf);
}

/* ---- matrix products ------------------------------------------------------------------- */

static void test_linear(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {4};
    const int64_t N = 3 * C_;
    pair_t inp, w, bias, out, dout, dinp, dw, db;
    pair_rand(&inp, &r, -1.0f, 1.0f, 3, TS_SHAPE(B_, T_, C_));
    pair_rand(&w, &r, -0.1f, 0.1f, 2, TS_SHAPE(N, C_));
    pair_rand(&bias, &r, -0.1f, 0.1f, 1, TS_SHAPE(N));
    pair_zeros(&out, 3, TS_SHAPE(B_, T_, N));
    pair_rand(&dout, &r, -1.0f, 1.0f, 3, TS_SHAPE(B_, T_, N));
    pair_rand(&dinp, &r, -1.0f, 1.0f, 3, TS_SHAPE(B_, T_, C_));
    pair_rand(&dw, &r, -1.0f, 1.0f, 2, TS_SHAPE(N, C_));
    pair_rand(&db, &r, -1.0f, 1.0f, 1, TS_SHAPE(N));

    BOTH(ts_linear_forward(E, ON(out), ON(inp), ON(w), ON(bias)));
    expect_close(fx, "linear_forward", &out);
    BOTH(ts_linear_forward(E, ON(out), ON(inp), ON(w), NULL));
    expect_close(fx, "linear_forward (no bias)", &out);
    BOTH(ts_linear_backward(E, ON(dinp), ON(dw), ON(db), ON(dout), ON(inp), ON(w)));
    expect_close(fx, "linear_backward dinp", &dinp);
    expect_close(fx, "linear_backward dweight", &dw);
    expect_close(fx, "linear_backward dbias", &db);

    pair_free(&inp);
    pair_free(&w);
    pair_free(&bias);
    pair_free(&out);
    pair_free(&dout);
    pair_free(&dinp);
    pair_free(&dw);
    pair_free(&db);
}

/* c = alpha·op(a)·op(b) + beta·c and its backward, for one (batch, trans_a, trans_b). */
static void matmul_case(fixture_t *fx, tu_rng_t *r, int64_t batch, int ta, int tb) {
    const int64_t M = 37, N = 53, K = 61;
    int nd = batch > 1 ? 3 : 2;
    int64_t as[3], bs[3], cs[3];
    int64_t *dims[3] = {as, bs, cs};
    int64_t rc[3][2] = {{ta ? K : M, ta ? M : K}, {tb ? N : K, tb ? K : N}, {M, N}};
    for (int i = 0; i < 3; i++) {
        int o = 0;
        if (nd == 3)
            dims[i][o++] = batch;
        dims[i][o] = rc[i][0];
        dims[i][o + 1] = rc[i][1];
    }
    pair_t a, b, c, dc, da, db;
    pair_rand(&a, r, -1.0f, 1.0f, nd, as);
    pair_rand(&b, r, -1.0f, 1.0f, nd, bs);
    pair_rand(&c, r, -1.0f, 1.0f, nd, cs);
    pair_rand(&dc, r, -1.0f, 1.0f, nd, cs);
    pair_rand(&da, r, -1.0f, 1.0f, nd, as);
    pair_rand(&db, r, -1.0f, 1.0f, nd, bs);

    char what[96];
    BOTH(ts_matmul(E, ON(c), ON(a), ta, ON(b), tb, 1.25f, 0.5f));
    snprintf(what, sizeof what, "matmul batch %lld ta %d tb %d", (long long)batch, ta, tb);
    expect_close(fx, what, &c);
    BOTH(ts_matmul_backward(E, ON(da), ON(db), ON(dc), ON(a), ta, ON(b), tb, 1.25f));
    snprintf(what, sizeof what, "matmul_backward batch %lld ta %d tb %d da", (long long)batch, ta,
             tb);
    expect_close(fx, what, &da);
    snprintf(what, sizeof what, "matmul_backward batch %lld ta %d tb %d db", (long long)batch, ta,
             tb);
    expect_close(fx, what, &db);

    pair_free(&a);
    pair_free(&b);
    pair_free(&c);
    pair_free(&dc);
    pair_free(&da);
    pair_free(&db);
}

static void test_matmul(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {5};
    for (int batched = 0; batched < 2; batched++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                matmul_case(fx, &r, batched ? 3 : 1, ta, tb);
}

/* Pinned host memory where a GPU is: page-locked (owns 2), and a round trip through the GPU
 * gives back every byte. */
static void test_pinned(void **state) {
    (void)state;
    ts_tensor_t h, back, d;
    TU_CHECK_OK(ts_tensor_alloc_pinned(&h, TS_F32, 1, TS_SHAPE(N_ODD)));
    TU_CHECK_OK(ts_tensor_alloc_pinned(&back, TS_F32, 1, TS_SHAPE(N_ODD)));
    assert_int_equal(h.owns, 2);
    TU_CHECK_OK(ts_tensor_alloc(&d, TS_F32, TS_CUDA, 1, TS_SHAPE(N_ODD)));
    tu_rng_t r = {21};
    for (int64_t i = 0; i < N_ODD; i++)
        ((float *)h.data)[i] = tu_rng_uniform(&r, -1.0f, 1.0f);
    TU_CHECK_OK(ts_tensor_copy(&d, &h));
    TU_CHECK_OK(ts_tensor_copy(&back, &d));
    assert_memory_equal(h.data, back.data, (size_t)N_ODD * sizeof(float));
    printf("test_cuda_parity: %-40s bit-identical\n", "pinned host -> GPU -> pinned host");
    ts_tensor_free(&h);
    ts_tensor_free(&back);
    ts_tensor_free(&d);
}

/* ---- bf16 and f16 products --------------------------------------------------------------- */

/* The bf16 and f16 products on the GPU against a naive reference in double on the same operands
 * rounded to bf16 or f16 (kernels/math.h's rounding, the one both backends use): independent of
 * the CPU's bf16 path, which needs AVX-512 BF16. BF16_TOL is far below what unrounded operands
 * would give (relative errors ~2⁻⁹ per bf16 operand, 2⁻¹² per f16: nmse ~1e-6, ~1e-8) and far
 * above fp32 accumulation (~1e-13). */
#define BF16_TOL 1e-9

/* x rounded to lp (TS_BF16 or TS_F16), and a stored lp value, widened. */
static double rnd(ts_dtype_t lp, float x) {
    return lp == TS_F16 ? (double)ts_f16_to_f32(ts_f32_to_f16(x))
                        : (double)ts_bf16_to_f32(ts_f32_to_bf16(x));
}
static double wide(ts_dtype_t lp, uint16_t v) {
    return lp == TS_F16 ? (double)ts_f16_to_f32(v) : (double)ts_bf16_to_f32(v);
}

/* Asserts nmse(GPU side of p, ref) ≤ BF16_TOL. */
static void expect_ref(fixture_t *fx, const char *what, const pair_t *p, const double *ref) {
    float *a = download(fx, p);
    int64_t n = ts_tensor_numel(&p->t[0]);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    free(a);
    double e = den > 0.0 ? num / den : num;
    printf("test_cuda_parity: %-40s nmse %.3e (against rounded operands)\n", what, e);
    if (!(e <= BF16_TOL)) {
        print_error("%s: nmse %.3e exceeds %.1e\n", what, e, BF16_TOL);
        fail();
    }
}

/* c = alpha·op(a)·op(b) + beta·c for one (batch, trans_a, trans_b), M, N, K odd, in lp. */
static void matmul_lp_case(fixture_t *fx, tu_rng_t *r, ts_dtype_t lp, int64_t batch, int ta,
                           int tb) {
    const int64_t M = 37, N = 53, K = 61;
    int nd = batch > 1 ? 3 : 2, o = nd - 2;
    int64_t as[3] = {batch}, bs[3] = {batch}, cs[3] = {batch};
    as[o] = ta ? K : M, as[o + 1] = ta ? M : K;
    bs[o] = tb ? N : K, bs[o + 1] = tb ? K : N;
    cs[o] = M, cs[o + 1] = N;
    pair_t a, b, c;
    pair_rand(&a, r, -1.0f, 1.0f, nd, as);
    pair_rand(&b, r, -1.0f, 1.0f, nd, bs);
    pair_rand(&c, r, -1.0f, 1.0f, nd, cs);
    const float *A = host_f32(&a), *Bm = host_f32(&b), *C0 = host_f32(&c);
    double *ref = malloc((size_t)(batch * M * N) * sizeof *ref);
    assert_non_null(ref);
    for (int64_t q = 0; q < batch; q++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    float x = ta ? A[q * M * K + k * M + i] : A[q * M * K + i * K + k];
                    float y = tb ? Bm[q * K * N + j * K + k] : Bm[q * K * N + k * N + j];
                    acc += rnd(lp, x) * rnd(lp, y);
                }
                ref[q * M * N + i * N + j] = 1.25 * acc + 0.5 * (double)C0[q * M * N + i * N + j];
            }
    TU_CHECK_OK((lp == TS_F16 ? ts_matmul_f16 : ts_matmul_bf16)(&fx->e[1], &c.t[1], &a.t[1], ta,
                                                                &b.t[1], tb, 1.25f, 0.5f));
    char what[96];
    snprintf(what, sizeof what, "matmul_%s batch %lld ta %d tb %d", lp == TS_F16 ? "f16" : "bf16",
             (long long)batch, ta, tb);
    expect_ref(fx, what, &c, ref);
    free(ref);
    pair_free(&a);
    pair_free(&b);
    pair_free(&c);
}

/* A linear layer with a 16-bit weight (lp: BF16 or F16), forward and backward (the += of every
 * gradient too). */
static void linear_lp_case(fixture_t *fx, tu_rng_t *r, ts_dtype_t lp) {
    const int64_t M = B_ * T_, K = C_, N = 3 * C_ + 5;
    pair_t inp, w, w16, bias, out, dout, dinp, dw, db;
    pair_rand(&inp, r, -1.0f, 1.0f, 2, TS_SHAPE(M, K));
    pair_rand(&w, r, -0.1f, 0.1f, 2, TS_SHAPE(N, K));
    pair_alloc(&w16, lp, 2, TS_SHAPE(N, K));
    TU_CHECK_OK(ts_convert(&fx->e[0], &w16.t[0], &w.t[0]));
    pair_upload(&w16);
    pair_rand(&bias, r, -0.1f, 0.1f, 1, TS_SHAPE(N));
    pair_zeros(&out, 2, TS_SHAPE(M, N));
    pair_rand(&dout, r, -1.0f, 1.0f, 2, TS_SHAPE(M, N));
    pair_rand(&dinp, r, -1.0f, 1.0f, 2, TS_SHAPE(M, K));
    pair_rand(&dw, r, -1.0f, 1.0f, 2, TS_SHAPE(N, K));
    pair_rand(&db, r, -1.0f, 1.0f, 1, TS_SHAPE(N));
    const float *X = host_f32(&inp), *D = host_f32(&dout);
    const uint16_t *W = w16.t[0].data;
    double *ref = malloc((size_t)(M * N + M * K + N * K + N) * sizeof *ref);
    assert_non_null(ref);
    double *r_out = ref, *r_dinp = r_out + M * N, *r_dw = r_dinp + M * K, *r_db = r_dw + N * K;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += rnd(lp, X[i * K + k]) * wide(lp, W[j * K + k]);
            r_out[i * N + j] = (double)(float)acc + (double)host_f32(&bias)[j];
        }
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) {
            double acc = 0.0;
            for (int64_t j = 0; j < N; j++)
                acc += rnd(lp, D[i * N + j]) * wide(lp, W[j * K + k]);
            r_dinp[i * K + k] = (double)host_f32(&dinp)[i * K + k] + acc;
        }
    for (int64_t j = 0; j < N; j++) {
        for (int64_t k = 0; k < K; k++) {
            double acc = 0.0;
            for (int64_t i = 0; i < M; i++)
                acc += rnd(lp, D[i * N + j]) * rnd(lp, X[i * K + k]);
            r_dw[j * K + k] = (double)host_f32(&dw)[j * K + k] + acc;
        }
        double acc = 0.0;
        for (int64_t i = 0; i < M; i++)
            acc += (double)D[i * N + j];
        r_db[j] = (double)host_f32(&db)[j] + acc;
    }
    ts_engine_t *G = &fx->e[1];
    TU_CHECK_OK(ts_linear_forward(G, &out.t[1], &inp.t[1], &w16.t[1], &bias.t[1]));
    expect_ref(fx, lp == TS_F16 ? "linear_forward f16 weight" : "linear_forward bf16 weight", &out,
               r_out);
    /* the bias in cuBLASLt's epilogue (ts_cuda_set_epilogues): the same product, the bias added
     * to the fp32 sums before they are written */
    if (ts_cuda_set_epilogues(G, 1) == TS_OK) {
        int64_t before = ts_cuda_epilogue_calls(G);
        TU_CHECK_OK(ts_zero(G, &out.t[1]));
        TU_CHECK_OK(ts_linear_forward(G, &out.t[1], &inp.t[1], &w16.t[1], &bias.t[1]));
        TU_CHECK_OK(ts_engine_sync(G));
        if (ts_cuda_epilogue_calls(G) != before + 1)
            fail_msg("the epilogue was on but the product did not run through cuBLASLt");
        expect_ref(fx,
                   lp == TS_F16 ? "linear_forward f16 weight, cuBLASLt bias epilogue"
                                : "linear_forward bf16 weight, cuBLASLt bias epilogue",
                   &out, r_out);
        TU_CHECK_OK(ts_cuda_set_epilogues(G, 0));
    } else {
        printf("test_cuda_parity: the cuBLASLt bias epilogue not checked: cuBLASLt not here\n");
    }
    TU_CHECK_OK(
        ts_linear_backward(G, &dinp.t[1], &dw.t[1], &db.t[1], &dout.t[1], &inp.t[1], &w16.t[1]));
    expect_ref(fx, lp == TS_F16 ? "linear_backward f16 dinp" : "linear_backward bf16 dinp", &dinp,
               r_dinp);
    expect_ref(fx, lp == TS_F16 ? "linear_backward f16 dweight" : "linear_backward bf16 dweight",
               &dw, r_dw);
    expect_ref(fx, lp == TS_F16 ? "linear_backward f16 dbias" : "linear_backward bf16 dbias", &db,
               r_db);
    free(ref);
    pair_free(&inp);
    pair_free(&w);
    pair_free(&w16);
    pair_free(&bias);
    pair_free(&out);
    pair_free(&dout);
    pair_free(&dinp);
    pair_free(&dw);
    pair_free(&db);
}

/* nmse of the widened lp values of the GPU side of p against ref. */
static double nmse_lp(fixture_t *fx, ts_dtype_t lp, const pair_t *p, const double *ref) {
    uint16_t *a = download(fx, p);
    int64_t n = ts_tensor_numel(&p->t[0]);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = wide(lp, a[i]) - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    free(a);
    return den > 0.0 ? num / den : num;
}

/* fc1 with 16-bit activations (ts_linear_gelu_forward_lp): act against GELU (tanh form, in
 * double) of the naive product on the rounded operands plus the bias, to the rounding of act
 * itself (nmse ≤ 1e-5 at bf16, 1e-6 at f16: a uniform relative error of half an ulp gives
 * ~1.3e-6 and ~2e-8), through the two kernels (pre kept, and to BF16_TOL) and, with the
 * epilogues on and pre not kept, through cuBLASLt's bias+GELU epilogue in one product — which
 * must run (pre left as it was, one more cuBLASLt product). */
static void linear_gelu_lp_case(fixture_t *fx, tu_rng_t *r, ts_dtype_t lp) {
    const int64_t M = B_ * T_, K = C_, N = 4 * C_;
    const double tol = lp == TS_F16 ? 1e-6 : 1e-5;
    const char *name = lp == TS_F16 ? "f16" : "bf16";
    ts_engine_t *G = &fx->e[1];
    pair_t x, w, x16, w16, bias, pre, act;
    pair_rand(&x, r, -1.0f, 1.0f, 2, TS_SHAPE(M, K));
    pair_rand(&w, r, -0.2f, 0.2f, 2, TS_SHAPE(N, K));
    pair_rand(&bias, r, -0.5f, 0.5f, 1, TS_SHAPE(N));
    pair_alloc(&x16, lp, 2, TS_SHAPE(M, K));
    pair_alloc(&w16, lp, 2, TS_SHAPE(N, K));
    TU_CHECK_OK(ts_convert(&fx->e[0], &x16.t[0], &x.t[0]));
    TU_CHECK_OK(ts_convert(&fx->e[0], &w16.t[0], &w.t[0]));
    pair_upload(&x16);
    pair_upload(&w16);
    pair_zeros(&pre, 2, TS_SHAPE(M, N));
    pair_alloc(&act, lp, 2, TS_SHAPE(M, N));
    const uint16_t *X = x16.t[0].data, *W = w16.t[0].data;
    double *r_pre = malloc((size_t)(2 * M * N) * sizeof *r_pre), *r_act = r_pre + M * N;
    assert_non_null(r_pre);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += wide(lp, X[i * K + k]) * wide(lp, W[j * K + k]);
            double s = (double)(float)acc + (double)host_f32(&bias)[j];
            r_pre[i * N + j] = s;
            r_act[i * N + j] =
                0.5 * s * (1.0 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
        }
    char what[96];
    TU_CHECK_OK(
        ts_linear_gelu_forward_lp(G, &pre.t[1], &act.t[1], &x16.t[1], &w16.t[1], &bias.t[1], 1));
    snprintf(what, sizeof what, "linear_gelu_forward_lp %s pre", name);
    expect_ref(fx, what, &pre, r_pre);
    double e = nmse_lp(fx, lp, &act, r_act);
    printf("test_cuda_parity: linear_gelu_forward_lp %-17s nmse %.3e (two kernels)\n", name, e);
    if (!(e <= tol))
        fail_msg("linear_gelu_forward_lp %s (two kernels): nmse %.3e exceeds %.1e", name, e, tol);
    if (ts_cuda_set_epilogues(G, 1) == TS_OK) {
        TU_CHECK_OK(ts_fill(G, &pre.t[1], 7.0f));
        int64_t before = ts_cuda_epilogue_calls(G);
        TU_CHECK_OK(ts_linear_gelu_forward_lp(G, &pre.t[1], &act.t[1], &x16.t[1], &w16.t[1],
                                              &bias.t[1], 0));
        float *P = download(fx, &pre);
        int untouched = 1;
        for (int64_t i = 0; i < M * N && untouched; i++)
            untouched = P[i] == 7.0f;
        free(P);
        if (!untouched || ts_cuda_epilogue_calls(G) != before + 1)
            fail_msg("linear_gelu_forward_lp %s: the epilogues were on but cuBLASLt's bias+GELU "
                     "epilogue did not run (pre %s, %lld cuBLASLt products)",
                     name, untouched ? "untouched" : "written",
                     (long long)(ts_cuda_epilogue_calls(G) - before));
        e = nmse_lp(fx, lp, &act, r_act);
        printf("test_cuda_parity: linear_gelu_forward_lp %-17s nmse %.3e (cuBLASLt bias+GELU)\n",
               name, e);
        if (!(e <= tol))
            fail_msg("linear_gelu_forward_lp %s (cuBLASLt): nmse %.3e exceeds %.1e", name, e, tol);
        TU_CHECK_OK(ts_cuda_set_epilogues(G, 0));
    } else {
        printf(
            "test_cuda_parity: the cuBLASLt bias+GELU epilogue not checked: cuBLASLt not here\n");
    }
    free(r_pre);
    pair_free(&x);
    pair_free(&w);
    pair_free(&x16);
    pair_free(&w16);
    pair_free(&bias);
    pair_free(&pre);
    pair_free(&act);
}

/* Asserts that the GPU side of p16 (lp) is the GPU side of p (fp32) rounded, bit for bit. */
static void expect_rounded(fixture_t *fx, const char *what, ts_dtype_t lp, const pair_t *p16,
                           const pair_t *p) {
    uint16_t *a = download(fx, p16);
    float *f = download(fx, p);
    int64_t n = ts_tensor_numel(&p->t[0]), bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += a[i] != ts_f32_to_lp(f[i], lp == TS_F16);
    free(a), free(f);
    printf("test_cuda_parity: %-40s %s\n", what,
           bad ? "NOT its fp32 result rounded" : "its fp32 result rounded");
    if (bad)
        fail_msg("%s: %lld elements are not the fp32 result rounded", what, (long long)bad);
}

/* A linear backward's gradients from two calls on the GPU (d[0], d[1]: dinp, dweight, dbias):
 * dinp and dweight the same bits (cuBLAS's products are deterministic), dbias to nmse 1e-12 (its
 * column sums add their chunks with atomics, in no fixed order). */
static void expect_same_grads(fixture_t *fx, const char *what, pair_t di[2], pair_t dw[2],
                              pair_t db[2]) {
    const pair_t *g[3] = {di, dw, db};
    for (int k = 0; k < 3; k++) {
        float *a = download(fx, &g[k][0]), *b = download(fx, &g[k][1]);
        int64_t n = ts_tensor_numel(&g[k][0].t[1]);
        double num = 0.0, den = 0.0;
        for (int64_t i = 0; i < n; i++)
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)a[i] * a[i];
        int same = k < 2 ? memcmp(a, b, (size_t)n * sizeof *a) == 0 : num <= 1e-12 * den;
        free(a), free(b);
        if (!same)
            fail_msg("%s: %s differs", what, k == 0 ? "dinp" : k == 1 ? "dweight" : "dbias");
    }
}

/* A linear's dout rounded by its producer (16-bit activations in training): GELU's and
 * gate_residual's backwards against the CPU's (fp32, as expect_close) with their 16-bit copy the
 * GPU's own fp32 result rounded; the linear's backward reading it gives the bits of the one that
 * rounds dout itself, and reads it (a dout16 of 2·dout doubles dinp and dweight, not dbias). */
static void lp_dout_case(fixture_t *fx, tu_rng_t *r, ts_dtype_t lp) {
    const int64_t Bn = B_, T = T_, C = C_, N = 2 * C_ + 3;
    const char *name = lp == TS_F16 ? "f16" : "bf16";
    char what[96];
    ts_engine_t *G = &fx->e[1];
    pair_t g, dout, inp, y, mod, dres, dmod, g16;
    pair_rand(&g, r, -1.0f, 1.0f, 3, TS_SHAPE(Bn, T, C));
    pair_rand(&dout, r, -1.0f, 1.0f, 3, TS_SHAPE(Bn, T, C));
    pair_rand(&inp, r, -3.0f, 3.0f, 3, TS_SHAPE(Bn, T, C));
    pair_rand(&y, r, -1.0f, 1.0f, 3, TS_SHAPE(Bn, T, C));
    pair_rand(&mod, r, -1.0f, 1.0f, 2, TS_SHAPE(Bn, 6 * C));
    pair_rand(&dres, r, -1.0f, 1.0f, 3, TS_SHAPE(Bn, T, C));
    pair_rand(&dmod, r, -1.0f, 1.0f, 2, TS_SHAPE(Bn, 6 * C));
    pair_alloc(&g16, lp, 3, TS_SHAPE(Bn, T, C));
    BOTH(ts_gelu_backward_lp(E, ON(g), ON(g16), ON(dout), ON(inp)));
    snprintf(what, sizeof what, "gelu_backward_lp %s dinp", name);
    expect_close(fx, what, &g);
    snprintf(what, sizeof what, "gelu_backward_lp %s dinp16", name);
    expect_rounded(fx, what, lp, &g16, &g);
    BOTH(ts_gate_residual_backward_lp(E, ON(dres), ON(g), ON(g16), ON(dmod), ON(dout), ON(y),
                                      ON(mod), 5));
    snprintf(what, sizeof what, "gate_residual_backward_lp %s dy", name);
    expect_close(fx, what, &g);
    snprintf(what, sizeof what, "gate_residual_backward_lp %s dres", name);
    expect_close(fx, what, &dres);
    snprintf(what, sizeof what, "gate_residual_backward_lp %s dmod", name);
    expect_close(fx, what, &dmod);
    snprintf(what, sizeof what, "gate_residual_backward_lp %s dy16", name);
    expect_rounded(fx, what, lp, &g16, &g);
    /* a linear C → N of a 16-bit input, on the GPU alone: with dout16 against without */
    pair_t w, x16, w16, lo, lo2, lo16, di[2], dw[2], db[2];
    pair_rand(&w, r, -0.2f, 0.2f, 2, TS_SHAPE(N, C));
    pair_rand(&lo, r, -1.0f, 1.0f, 3, TS_SHAPE(Bn, T, N));
    pair_zeros(&lo2, 3, TS_SHAPE(Bn, T, N));
    pair_alloc(&x16, lp, 3, TS_SHAPE(Bn, T, C));
    pair_alloc(&w16, lp, 2, TS_SHAPE(N, C));
    pair_alloc(&lo16, lp, 3, TS_SHAPE(Bn, T, N));
    TU_CHECK_OK(ts_convert(G, &x16.t[1], &inp.t[1]));
    TU_CHECK_OK(ts_convert(G, &w16.t[1], &w.t[1]));
    TU_CHECK_OK(ts_convert(G, &lo16.t[1], &lo.t[1]));
    for (int k = 0; k < 2; k++) {
        pair_zeros(&di[k], 3, TS_SHAPE(Bn, T, C));
        pair_zeros(&dw[k], 2, TS_SHAPE(N, C));
        pair_zeros(&db[k], 1, TS_SHAPE(N));
    }
    TU_CHECK_OK(ts_linear_backward(G, &di[0].t[1], &dw[0].t[1], &db[0].t[1], &lo.t[1], &x16.t[1],
                                   &w16.t[1]));
    TU_CHECK_OK(ts_linear_backward_lp(G, &di[1].t[1], &dw[1].t[1], &db[1].t[1], &lo.t[1],
                                      &lo16.t[1], &x16.t[1], &w16.t[1]));
    snprintf(what, sizeof what, "linear_backward_lp %s against the one that rounds dout", name);
    expect_same_grads(fx, what, di, dw, db);
    /* dout16 = lp(2·dout): dinp and dweight those of 2·dout (exactly), dbias that of dout */
    TU_CHECK_OK(ts_axpy(G, &lo2.t[1], 2.0f, &lo.t[1]));
    TU_CHECK_OK(ts_convert(G, &lo16.t[1], &lo2.t[1]));
    for (int k = 0; k < 2; k++) {
        TU_CHECK_OK(ts_zero(G, &di[k].t[1]));
        TU_CHECK_OK(ts_zero(G, &dw[k].t[1]));
    }
    TU_CHECK_OK(ts_zero(G, &db[1].t[1]));
    TU_CHECK_OK(
        ts_linear_backward(G, &di[0].t[1], &dw[0].t[1], NULL, &lo2.t[1], &x16.t[1], &w16.t[1]));
    TU_CHECK_OK(ts_linear_backward_lp(G, &di[1].t[1], &dw[1].t[1], &db[1].t[1], &lo.t[1],
                                      &lo16.t[1], &x16.t[1], &w16.t[1]));
    snprintf(what, sizeof what, "linear_backward_lp %s, dout16 of 2·dout (dbias of dout)", name);
    expect_same_grads(fx, what, di, dw, db);
    printf("test_cuda_parity: linear_backward_lp %-21s reads dout16: the bits of rounding dout\n",
           name);
    pair_t *all[] = {&g,   &dout, &inp, &y,    &mod,   &dres,  &dmod,  &g16,   &w,     &x16,
                     &w16, &lo,   &lo2, &lo16, &di[0], &di[1], &dw[0], &dw[1], &db[0], &db[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pair_free(all[i]);
}

/* The composed attention's forward with its products in lp (ts_attention_forward_bf16 / _f16:
 * on a GPU its operands rounded once per group of samples, ts_cuda_attention_forward_lp) against
 * tu_attention_lp_ref: the weights and the output (the latter from the rounded weights the GPU
 * wrote), to BF16_TOL. */
static void attention_lp_case(fixture_t *fx, tu_rng_t *r, ts_dtype_t lp) {
    const int64_t Bn = B_, T = T_, C = C_, H = HEADS;
    pair_t qkv, out, att;
    pair_rand(&qkv, r, -1.0f, 1.0f, 3, TS_SHAPE(Bn, T, 3 * C));
    pair_zeros(&out, 3, TS_SHAPE(Bn, T, C));
    pair_zeros(&att, 4, TS_SHAPE(Bn, H, T, T));
    TU_CHECK_OK((lp == TS_F16 ? ts_attention_forward_f16 : ts_attention_forward_bf16)(
        &fx->e[1], &out.t[1], &att.t[1], &qkv.t[1], (int)H));
    float *A = download(fx, &att);
    double *ra = malloc((size_t)(Bn * H * T * T) * sizeof *ra);
    double *ro = malloc((size_t)(Bn * T * C) * sizeof *ro);
    assert_non_null(ra);
    assert_non_null(ro);
    tu_attention_lp_ref(lp, host_f32(&qkv), A, Bn, T, C, H, ra, ro);
    char what[64];
    snprintf(what, sizeof what, "attention_forward_%s att", lp == TS_F16 ? "f16" : "bf16");
    expect_ref(fx, what, &att, ra);
    snprintf(what, sizeof what, "attention_forward_%s out", lp == TS_F16 ? "f16" : "bf16");
    expect_ref(fx, what, &out, ro);
    /* in groups of 1 and of 3 samples (4 = 3 + 1): the same bits as in one group */
    float *O = download(fx, &out);
    for (int g = 1; g <= 3; g += 2) {
        int64_t per = ((T * 3 * C + 63) / 64 * 64 + H * T * T) * 2; /* bytes per sample */
        TU_CHECK_OK(ts_cuda_attention_forward_lp(&fx->e[1], lp, out.t[1].data, NULL, att.t[1].data,
                                                 qkv.t[1].data, Bn, T, C, H, g * per));
        float *A2 = download(fx, &att), *O2 = download(fx, &out);
        if (memcmp(A2, A, (size_t)(Bn * H * T * T) * sizeof *A) != 0 ||
            memcmp(O2, O, (size_t)(Bn * T * C) * sizeof *O) != 0) {
            print_error("attention_forward_lp in groups of %d: not the bits of one group\n", g);
            fail();
        }
        printf("test_cuda_parity: attention_forward_lp in groups of %d: the same bits\n", g);
        free(A2), free(O2);
    }
    /* the output written in lp by the last product (proj's 16-bit input): the fp32 output
     * rounded, to within one unit in the last place where cuBLAS's product for a 16-bit output
     * summed in another order */
    pair_t o16;
    pair_alloc(&o16, lp, 3, TS_SHAPE(Bn, T, C));
    TU_CHECK_OK((lp == TS_F16 ? ts_attention_forward_f16 : ts_attention_forward_bf16)(
        &fx->e[1], &o16.t[1], &att.t[1], &qkv.t[1], (int)H));
    uint16_t *P = download(fx, &o16);
    int64_t same = 0, n = Bn * T * C;
    for (int64_t i = 0; i < n; i++) {
        uint16_t want = ts_f32_to_lp(O[i], lp == TS_F16);
        int d = (int)P[i] - (int)want;
        if ((P[i] ^ want) & 0x8000u || d < -1 || d > 1) {
            print_error("attention_forward_%s out16[%lld] 0x%04x, the fp32 output rounded 0x%04x\n",
                        lp == TS_F16 ? "f16" : "bf16", (long long)i, P[i], want);
            fail();
        }
        same += d == 0;
    }
    printf("test_cuda_parity: attention_forward_%s out16: %.4f of it the fp32 output's bits "
           "rounded, the rest one ulp off\n",
           lp == TS_F16 ? "f16" : "bf16", (double)same / (double)n);
    /* a product that truncated, or rounded the other way, would be off in about half */
    assert_true((double)same >= 0.99 * (double)n);
    free(P);
    pair_free(&o16);
    free(O);
    free(A);
    free(ra);
    free(ro);
    pair_free(&qkv);
    pair_free(&out);
    pair_free(&att);
}

static void test_bf16(void **state) {
    fixture_t *fx = *state;
    char why[256] = "";
    if (ts_engine_precision_check(&fx->e[1], TS_PREC_BF16, why, sizeof why) != TS_OK) {
        printf("test_cuda_parity: bf16 products not checked: %s\n", why);
        skip();
    }
    tu_rng_t r = {15};
    for (int batched = 0; batched < 2; batched++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                matmul_lp_case(fx, &r, TS_BF16, batched ? 3 : 1, ta, tb);
    linear_lp_case(fx, &r, TS_BF16);
    linear_gelu_lp_case(fx, &r, TS_BF16);
    lp_dout_case(fx, &r, TS_BF16);
    attention_lp_case(fx, &r, TS_BF16);
    /* the GELU of the bf16 forward: on the GPU, the fp32 one */
    pair_t x, y;
    pair_rand(&x, &r, -6.0f, 6.0f, 1, TS_SHAPE(N_ODD));
    pair_zeros(&y, 1, TS_SHAPE(N_ODD));
    BOTH(ts_gelu_forward(E, ON(y), ON(x)));
    TU_CHECK_OK(ts_gelu_forward_bf16(&fx->e[1], &y.t[1], &x.t[1]));
    expect_identical(fx, "gelu_forward_bf16 (= gelu_forward)", &y);
    pair_free(&x);
    pair_free(&y);
}

/* f16 runs on every GPU this backend is built for: the same products in half precision against
 * the same reference, then the GPU's f16 matmul against the CPU's emulation (the same rounded
 * operands, fp32 accumulation in two orders), and the rounding at f16's edges. */
static void test_f16(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {16};
    for (int batched = 0; batched < 2; batched++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                matmul_lp_case(fx, &r, TS_F16, batched ? 3 : 1, ta, tb);
    linear_lp_case(fx, &r, TS_F16);
    linear_gelu_lp_case(fx, &r, TS_F16);
    lp_dout_case(fx, &r, TS_F16);
    attention_lp_case(fx, &r, TS_F16);
    /* GPU against the CPU's emulation, operands past ±65504 and in the subnormals included */
    pair_t a, b, c;
    pair_rand(&a, &r, -2.0f, 2.0f, 2, TS_SHAPE(67, 1));
    pair_rand(&b, &r, -2.0f, 2.0f, 2, TS_SHAPE(1, 1));
    pair_zeros(&c, 2, TS_SHAPE(67, 1));
    float *A = a.t[0].data;
    static const float edge[] = {65504.0f, 65520.0f,      -70000.0f,  6.0e-5f, 5.9604645e-8f,
                                 1e-8f,    2.9802326e-8f, 1.0004883f, 2049.0f, 2051.0f};
    memcpy(A, edge, sizeof edge);
    ((float *)b.t[0].data)[0] = 1.0f;
    pair_upload(&a);
    pair_upload(&b);
    BOTH(ts_matmul_f16(E, ON(c), ON(a), 0, ON(b), 0, 1.0f, 0.0f));
    expect_identical(fx, "matmul_f16 (K = 1: the rounding alone)", &c);
    pair_free(&a);
    pair_free(&b);
    pair_free(&c);
}

/* ---- normalisation and activations ------------------------------------------------------ */

static void layernorm_case(fixture_t *fx, tu_rng_t *r, int64_t rows, int64_t C) {
    char what[96];
    pair_t inp, out, mean, rstd, dout, dinp;
    pair_rand(&inp, r, -2.0f, 2.0f, 2, TS_SHAPE(rows, C));
    for (int64_t i = 0; i < rows * C; i++) /* a row offset, so the mean matters */
        host_f32(&inp)[i] += (float)(i / C % 7) - 3.0f;
    pair_upload(&inp);
    pair_zeros(&out, 2, TS_SHAPE(rows, C));
    pair_zeros(&mean, 1, TS_SHAPE(rows));
    pair_zeros(&rstd, 1, TS_SHAPE(rows));
    pair_rand(&dout, r, -1.0f, 1.0f, 2, TS_SHAPE(rows, C));
    pair_rand(&dinp, r, -1.0f, 1.0f, 2, TS_SHAPE(rows, C));

    BOTH(ts_layernorm_forward(E, ON(out), ON(mean), ON(rstd), ON(inp)));
    snprintf(what, sizeof what, "layernorm_forward (%lld,%lld) out", (long long)rows, (long long)C);
    expect_close(fx, what, &out);
    snprintf(what, sizeof what, "layernorm_forward (%lld,%lld) mean", (long long)rows,
             (long long)C);
    expect_close(fx, what, &mean);
    snprintf(what, sizeof what, "layernorm_forward (%lld,%lld) rstd", (long long)rows,
             (long long)C);
    expect_close(fx, what, &rstd);
    BOTH(ts_layernorm_backward(E, ON(dinp), ON(dout), ON(inp), ON(mean), ON(rstd)));
    snprintf(what, sizeof what, "layernorm_backward (%lld,%lld)", (long long)rows, (long long)C);
    expect_close(fx, what, &dinp);

    pair_free(&inp);
    pair_free(&out);
    pair_free(&mean);
    pair_free(&rstd);
    pair_free(&dout);
    pair_free(&dinp);
}

/* LayerNorm and modulate in one op (one kernel on the GPU), every output. */
static void layernorm_modulate_case(fixture_t *fx, tu_rng_t *r, int64_t B, int64_t T, int64_t C) {
    char what[96];
    pair_t x, mod, ln, out, mean, rstd;
    pair_rand(&x, r, -2.0f, 2.0f, 3, TS_SHAPE(B, T, C));
    pair_rand(&mod, r, -1.0f, 1.0f, 2, TS_SHAPE(B, 6 * C));
    pair_zeros(&ln, 3, TS_SHAPE(B, T, C));
    pair_zeros(&out, 3, TS_SHAPE(B, T, C));
    pair_zeros(&mean, 1, TS_SHAPE(B * T));
    pair_zeros(&rstd, 1, TS_SHAPE(B * T));
    BOTH(ts_layernorm_modulate_forward(E, ON(ln), ON(mean), ON(rstd), ON(out), ON(x), ON(mod), 3,
                                       4));
    const char *names[] = {"ln", "out", "mean", "rstd"};
    const pair_t *got[] = {&ln, &out, &mean, &rstd};
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "layernorm_modulate (%lld,%lld,%lld) %s", (long long)B,
                 (long long)T, (long long)C, names[i]);
        expect_close(fx, what, got[i]);
    }
    pair_free(&x);
    pair_free(&mod);
    pair_free(&ln);
    pair_free(&out);
    pair_free(&mean);
    pair_free(&rstd);
}

static void test_layernorm(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {6};
    layernorm_case(fx, &r, B_ * T_, C_);
    layernorm_case(fx, &r, 37, 1000); /* wider than a block, not a multiple of 32 */
    layernorm_case(fx, &r, 5, 3);     /* narrower than a warp */
    layernorm_modulate_case(fx, &r, B_, T_, C_);
    layernorm_modulate_case(fx, &r, 3, 5, 1000);
}

static void test_activations(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {7};
    pair_t inp, out, dout, dinp;
    pair_rand(&inp, &r, -6.0f, 6.0f, 1, TS_SHAPE(N_ODD));
    pair_zeros(&out, 1, TS_SHAPE(N_ODD));
    pair_rand(&dout, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));
    pair_rand(&dinp, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));

    BOTH(ts_gelu_forward(E, ON(out), ON(inp)));
    expect_close(fx, "gelu_forward", &out);
    BOTH(ts_gelu_backward(E, ON(dinp), ON(dout), ON(inp)));
    expect_close(fx, "gelu_backward", &dinp);
    BOTH(ts_silu_forward(E, ON(out), ON(inp)));
    expect_close(fx, "silu_forward", &out);
    BOTH(ts_silu_backward(E, ON(dinp), ON(dout), ON(inp)));
    expect_close(fx, "silu_backward", &dinp);
    BOTH(ts_gelu_forward(E, ON(dout), ON(dout))); /* out aliases inp */
    expect_close(fx, "gelu_forward (in place)", &dout);

    pair_free(&inp);
    pair_free(&out);
    pair_free(&dout);
    pair_free(&dinp);
}

static void softmax_case(fixture_t *fx, tu_rng_t *r, int64_t rows, int64_t C) {
    char what[96];
    pair_t inp, out, dout, dinp;
    pair_rand(&inp, r, -4.0f, 4.0f, 2, TS_SHAPE(rows, C));
    pair_zeros(&out, 2, TS_SHAPE(rows, C));
    pair_rand(&dout, r, -1.0f, 1.0f, 2, TS_SHAPE(rows, C));
    pair_rand(&dinp, r, -1.0f, 1.0f, 2, TS_SHAPE(rows, C));

    BOTH(ts_softmax_forward(E, ON(out), ON(inp)));
    snprintf(what, sizeof what, "softmax_forward (%lld,%lld)", (long long)rows, (long long)C);
    expect_close(fx, what, &out);
    BOTH(ts_softmax_backward(E, ON(dinp), ON(dout), ON(out)));
    snprintf(what, sizeof what, "softmax_backward (%lld,%lld)", (long long)rows, (long long)C);
    expect_close(fx, what, &dinp);
    BOTH(ts_softmax_forward(E, ON(inp), ON(inp))); /* out aliases inp */
    snprintf(what, sizeof what, "softmax_forward (%lld,%lld) in place", (long long)rows,
             (long long)C);
    expect_close(fx, what, &inp);

    pair_free(&inp);
    pair_free(&out);
    pair_free(&dout);
    pair_free(&dinp);
}

static void test_softmax(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {8};
    softmax_case(fx, &r, B_ * HEADS * T_, T_); /* attention rows */
    softmax_case(fx, &r, 37, 1000);
}

/* ---- attention ------------------------------------------------------------------------- */

static void test_attention(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {9};
    pair_t qkv, out, att, dout, dqkv, datt;
    pair_rand(&qkv, &r, -1.0f, 1.0f, 3, TS_SHAPE(B_, T_, 3 * C_));
    pair_zeros(&out, 3, TS_SHAPE(B_, T_, C_));
    pair_zeros(&att, 4, TS_SHAPE(B_, HEADS, T_, T_));
    pair_rand(&dout, &r, -1.0f, 1.0f, 3, TS_SHAPE(B_, T_, C_));
    pair_rand(&dqkv, &r, -1.0f, 1.0f, 3, TS_SHAPE(B_, T_, 3 * C_));
    pair_zeros(&datt, 4, TS_SHAPE(B_, HEADS, T_, T_));

    BOTH(ts_attention_forward(E, ON(out), ON(att), ON(qkv), HEADS));
    expect_close(fx, "attention_forward out", &out);
    expect_close(fx, "attention_forward att", &att);
    BOTH(ts_attention_backward(E, ON(dqkv), ON(datt), ON(dout), ON(qkv), ON(att), HEADS));
    expect_close(fx, "attention_backward dqkv", &dqkv);

    pair_free(&qkv);
    pair_free(&out);
    pair_free(&att);
    pair_free(&dout);
    pair_free(&dqkv);
    pair_free(&datt);
}

/* The fused attention (kernels/cuda/cuda_attention.cu) against the CPU's fused one, forward with
 * its lse and backward (+= into dqkv), for one (B, T, C, H): head sizes with their own kernel
 * instance (32, 64, 72, 128) and one of the run-time instance (48), T below, at and across tiles of 32
 * keys. */
static void fused_case(fixture_t *fx, tu_rng_t *r, int64_t B, int64_t T, int64_t C, int64_t H) {
    char what[96], size[48];
    snprintf(size, sizeof size, "(%lld,%lld,%lld,%lld)", (long long)B, (long long)T, (long long)C,
             (long long)H);
    pair_t qkv, out, lse, dout, dqkv;
    pair_rand(&qkv, r, -1.5f, 1.5f, 3, TS_SHAPE(B, T, 3 * C));
    pair_zeros(&out, 3, TS_SHAPE(B, T, C));
    pair_zeros(&lse, 3, TS_SHAPE(B, H, T));
    pair_rand(&dout, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, C));
    pair_rand(&dqkv, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, 3 * C));
    BOTH(ts_attention_fused_forward(E, ON(out), ON(lse), ON(qkv), (int)H));
    snprintf(what, sizeof what, "attention_fused_forward %s out", size);
    expect_close(fx, what, &out);
    snprintf(what, sizeof what, "attention_fused_forward %s lse", size);
    expect_close(fx, what, &lse);
    BOTH(ts_attention_fused_backward(E, ON(dqkv), ON(dout), ON(qkv), ON(out), ON(lse), (int)H));
    snprintf(what, sizeof what, "attention_fused_backward %s dqkv", size);
    expect_close(fx, what, &dqkv);
    pair_free(&qkv);
    pair_free(&out);
    pair_free(&lse);
    pair_free(&dout);
    pair_free(&dqkv);
}

static void test_attention_fused(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {16};
    fused_case(fx, &r, B_, T_, C_, HEADS); /* tiny: hd 32, T = 49 (a tile and a part) */
    fused_case(fx, &r, 2, 256, 128, 2);    /* hd 64, 8 whole tiles */
    fused_case(fx, &r, 2, 64, 144, 2);     /* hd 72: DiT-XL/2's and L's heads are 72 and 64 */
    fused_case(fx, &r, 3, 17, 96, 2);      /* hd 48: the run-time instance; T under a tile */
    fused_case(fx, &r, 1, 80, 256, 2);     /* hd 128: its own instance (cuda_heads.h) */
    /* a head over 128 wide: the composed attention's job */
    ts_tensor_t qkv, out;
    TU_CHECK_OK(ts_tensor_alloc(&qkv, TS_F32, TS_CUDA, 3, TS_SHAPE(1, 4, 3 * 256)));
    TU_CHECK_OK(ts_tensor_alloc(&out, TS_F32, TS_CUDA, 3, TS_SHAPE(1, 4, 256)));
    TU_CHECK_RC(ts_attention_fused_forward(&fx->e[1], &out, NULL, &qkv, 1), TS_ENOTSUP);
    ts_tensor_free(&qkv);
    ts_tensor_free(&out);
}

/* The 16-bit flash attention on tensor cores (kernels/cuda/cuda_flash.cu; bf16 on sm_80 and
 * later, f16 on sm_75 and later) against the CPU's fp32 fused attention, forward and backward:
 * the products' inputs and weights rounded to bf16 give a normalised error near 1e-5, so out and
 * dqkv within 1e-4 and lse within 1e-5 (NMSE); in f16 (8× finer) within 2e-6 and 1e-6. Head
 * sizes with their own instance (32, 64, 72, 128) and one of the run-time instance (48); T below,
 * across and at blocks of 32 keys and 64 queries. Its tile steps are tests/test_flash_mma.c's on
 * the CPU, in both types. */
static double nmse_of(fixture_t *fx, const pair_t *p) {
    float *a = download(fx, p);
    const float *b = (const float *)p->t[0].data;
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < ts_tensor_numel(&p->t[0]); i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    free(a);
    return den > 0.0 ? num / den : num;
}

static void flash_case(fixture_t *fx, tu_rng_t *r, ts_dtype_t lp, int64_t B, int64_t T, int64_t C,
                       int64_t H) {
    const char *name = lp == TS_F16 ? "f16" : "bf16";
    double bound = lp == TS_F16 ? 2e-6 : 1e-4, bound_lse = lp == TS_F16 ? 1e-6 : 1e-5;
    pair_t qkv, out, lse, dout, dqkv;
    pair_rand(&qkv, r, -1.5f, 1.5f, 3, TS_SHAPE(B, T, 3 * C));
    pair_zeros(&out, 3, TS_SHAPE(B, T, C));
    pair_zeros(&lse, 3, TS_SHAPE(B, H, T));
    pair_rand(&dout, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, C));
    pair_zeros(&dqkv, 3, TS_SHAPE(B, T, 3 * C));
    TU_CHECK_OK(ts_attention_fused_forward(&fx->e[0], &out.t[0], &lse.t[0], &qkv.t[0], (int)H));
    TU_CHECK_OK(
        ts_attention_fused_forward_lp(&fx->e[1], lp, &out.t[1], &lse.t[1], &qkv.t[1], (int)H));
    double eo = nmse_of(fx, &out), el = nmse_of(fx, &lse);
    { /* the output written twice (training's proj input): the same fp32 bits, and rounded */
        pair_t out2, out16;
        pair_zeros(&out2, 3, TS_SHAPE(B, T, C));
        pair_alloc(&out16, lp, 3, TS_SHAPE(B, T, C));
        TU_CHECK_OK(ts_attention_fused_forward_lp_both(&fx->e[1], lp, &out2.t[1], &out16.t[1], NULL,
                                                       &qkv.t[1], (int)H));
        float *o1 = download(fx, &out), *o2 = download(fx, &out2);
        if (memcmp(o1, o2, ts_tensor_nbytes(&out.t[1])) != 0)
            fail_msg("flash %s: the forward writing both outputs is not the fp32 one's bits", name);
        free(o1), free(o2);
        expect_rounded(fx, "flash forward, both outputs: out16", lp, &out16, &out2);
        pair_free(&out2);
        pair_free(&out16);
    }
    /* the backward from each side's own forward (the GPU's out and lse are its 16-bit ones) */
    TU_CHECK_OK(ts_attention_fused_backward(&fx->e[0], &dqkv.t[0], &dout.t[0], &qkv.t[0], &out.t[0],
                                            &lse.t[0], (int)H));
    pair_t dqkv16; /* the copy the qkv linear's backward reads: dqkv as it ends, rounded */
    pair_alloc(&dqkv16, lp, 3, TS_SHAPE(B, T, 3 * C));
    TU_CHECK_OK(ts_attention_fused_backward_lp(&fx->e[1], lp, &dqkv.t[1], &dqkv16.t[1], &dout.t[1],
                                               &qkv.t[1], &out.t[1], &lse.t[1], (int)H));
    double eg = nmse_of(fx, &dqkv);
    expect_rounded(fx, "flash backward dqkv16", lp, &dqkv16, &dqkv);
    pair_free(&dqkv16);
    printf("test_cuda_parity: flash %s (%lld,%lld,%lld,%lld) out nmse %.3e, lse %.3e, dqkv "
           "%.3e\n",
           name, (long long)B, (long long)T, (long long)C, (long long)H, eo, el, eg);
    if (!(eo <= bound && el <= bound_lse && eg <= bound)) {
        print_error("flash %s (%lld,%lld,%lld,%lld): out nmse %.3e (≤ %.0e), lse %.3e (≤ %.0e), "
                    "dqkv %.3e (≤ %.0e)\n",
                    name, (long long)B, (long long)T, (long long)C, (long long)H, eo, bound, el,
                    bound_lse, eg, bound);
        fail();
    }
    pair_free(&qkv);
    pair_free(&out);
    pair_free(&lse);
    pair_free(&dout);
    pair_free(&dqkv);
}

static void test_attention_flash(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {17};
    const ts_dtype_t types[2] = {TS_BF16, TS_F16};
    for (int i = 0; i < 2; i++) {
        ts_dtype_t lp = types[i];
        if (ts_attention_fused_lp_check(&fx->e[1], lp) !=
            TS_OK) { /* no launch on unwritten memory */
            printf("test_cuda_parity: flash %s: not on this GPU (%s or later), not checked\n",
                   lp == TS_F16 ? "f16" : "bf16", lp == TS_F16 ? "sm_75" : "sm_80");
            continue;
        }
        flash_case(fx, &r, lp, 2, 196, 256, 4);    /* `small`: hd 64, T = 196 */
        flash_case(fx, &r, lp, B_, T_, C_, HEADS); /* tiny: hd 32, T = 49 */
        flash_case(fx, &r, lp, 2, 100, 144, 2);    /* hd 72, padded to 80 */
        flash_case(fx, &r, lp, 1, 256, 256, 2);    /* hd 128: the widest head */
        flash_case(fx, &r, lp, 3, 17, 96, 2);      /* hd 48: the run-time instance */
    }
}

/* ---- adaLN-Zero pieces ----------------------------------------------------------------- */

/* modulate and gate_residual, forward and backward, for x (B, T, C), mod (B, 6C). */
static void adaln_case(fixture_t *fx, tu_rng_t *r, int64_t B, int64_t T, int64_t C) {
    char what[96], size[48];
    snprintf(size, sizeof size, "(%lld,%lld,%lld)", (long long)B, (long long)T, (long long)C);
    pair_t x, mod, out, dout, dx, dmod, res, y, dres, dy;
    pair_rand(&x, r, -2.0f, 2.0f, 3, TS_SHAPE(B, T, C));
    pair_rand(&mod, r, -1.0f, 1.0f, 2, TS_SHAPE(B, 6 * C));
    pair_zeros(&out, 3, TS_SHAPE(B, T, C));
    pair_rand(&dout, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, C));
    pair_rand(&dx, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, C));
    pair_rand(&dmod, r, -1.0f, 1.0f, 2, TS_SHAPE(B, 6 * C));
    pair_rand(&res, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, C));
    pair_rand(&y, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, C));
    pair_rand(&dres, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, C));
    pair_rand(&dy, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, C));

    BOTH(ts_modulate_forward(E, ON(out), ON(x), ON(mod), 0, 1));
    snprintf(what, sizeof what, "modulate_forward %s", size);
    expect_close(fx, what, &out);
    BOTH(ts_modulate_backward(E, ON(dx), ON(dmod), ON(dout), ON(x), ON(mod), 3, 4));
    snprintf(what, sizeof what, "modulate_backward %s dx", size);
    expect_close(fx, what, &dx);
    snprintf(what, sizeof what, "modulate_backward %s dmod", size);
    expect_close(fx, what, &dmod);
    BOTH(ts_gate_residual_forward(E, ON(out), ON(res), ON(y), ON(mod), 2));
    snprintf(what, sizeof what, "gate_residual_forward %s", size);
    expect_close(fx, what, &out);
    BOTH(ts_gate_residual_backward(E, ON(dres), ON(dy), ON(dmod), ON(dout), ON(y), ON(mod), 5));
    snprintf(what, sizeof what, "gate_residual_backward %s dres", size);
    expect_close(fx, what, &dres);
    snprintf(what, sizeof what, "gate_residual_backward %s dy", size);
    expect_close(fx, what, &dy);
    snprintf(what, sizeof what, "gate_residual_backward %s dmod", size);
    expect_close(fx, what, &dmod);

    pair_free(&x);
    pair_free(&mod);
    pair_free(&out);
    pair_free(&dout);
    pair_free(&dx);
    pair_free(&dmod);
    pair_free(&res);
    pair_free(&y);
    pair_free(&dres);
    pair_free(&dy);
}

static void test_adaln(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {10};
    adaln_case(fx, &r, B_, T_, C_);
    adaln_case(fx, &r, 2, 4096, 40); /* many tokens: Σ_T split across blocks; C % 32 != 0 */
}

/* ---- embeddings ------------------------------------------------------------------------ */

static void timestep_case(fixture_t *fx, tu_rng_t *r, int64_t B, int64_t D) {
    char what[96];
    pair_t t, out, dout, dt;
    pair_rand(&t, r, 0.0f, 1.0f, 1, TS_SHAPE(B));
    pair_zeros(&out, 2, TS_SHAPE(B, D));
    pair_rand(&dout, r, -1.0f, 1.0f, 2, TS_SHAPE(B, D));
    pair_rand(&dt, r, -1.0f, 1.0f, 1, TS_SHAPE(B));

    BOTH(ts_timestep_embedding_forward(E, ON(out), ON(t), 1000.0f));
    snprintf(what, sizeof what, "timestep_embedding_forward D=%lld", (long long)D);
    expect_close(fx, what, &out);
    for (int k = 0; k < 2; k++) { /* written in 16 bits: the GPU's fp32 values rounded */
        ts_dtype_t lp = k ? TS_F16 : TS_BF16;
        pair_t o16;
        pair_alloc(&o16, lp, 2, TS_SHAPE(B, D));
        BOTH(ts_timestep_embedding_forward(E, ON(o16), ON(t), 1000.0f));
        snprintf(what, sizeof what, "timestep_embedding_forward %s D=%lld", k ? "f16" : "bf16",
                 (long long)D);
        expect_rounded(fx, what, lp, &o16, &out);
        pair_free(&o16);
    }
    BOTH(ts_timestep_embedding_backward(E, ON(dt), ON(dout), ON(t), 1000.0f));
    snprintf(what, sizeof what, "timestep_embedding_backward D=%lld", (long long)D);
    expect_close(fx, what, &dt);

    pair_free(&t);
    pair_free(&out);
    pair_free(&dout);
    pair_free(&dt);
}

static void test_embeddings(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {11};
    timestep_case(fx, &r, 64, 256);
    timestep_case(fx, &r, 5, 257); /* odd D: a trailing zero column */

    pair_t pos;
    pair_zeros(&pos, 2, TS_SHAPE(16 * 16, C_));
    BOTH(ts_pos_embed_2d(E, ON(pos), 16));
    expect_close(fx, "pos_embed_2d grid 16", &pos);
    pair_free(&pos);

    /* class embedding: 64 ids out of 1001 rows, with repeats (the scatter must add them all) */
    const int64_t V = 1001, NB = 64;
    pair_t table, ids, out, dout, dtable;
    pair_rand(&table, &r, -1.0f, 1.0f, 2, TS_SHAPE(V, C_));
    pair_alloc(&ids, TS_I32, 1, TS_SHAPE(NB));
    int32_t *id = ids.t[0].data;
    for (int64_t b = 0; b < NB; b++)
        id[b] = b % 4 == 0 ? 7 : (int32_t)(tu_rng_next(&r) % (uint64_t)V);
    id[NB - 1] = (int32_t)V - 1;
    pair_upload(&ids);
    pair_zeros(&out, 2, TS_SHAPE(NB, C_));
    pair_rand(&dout, &r, -1.0f, 1.0f, 2, TS_SHAPE(NB, C_));
    pair_rand(&dtable, &r, -1.0f, 1.0f, 2, TS_SHAPE(V, C_));

    BOTH(ts_embedding_forward(E, ON(out), ON(table), ON(ids)));
    expect_identical(fx, "embedding_forward", &out);
    BOTH(ts_embedding_backward(E, ON(dtable), ON(dout), ON(ids)));
    expect_close(fx, "embedding_backward", &dtable);

    pair_free(&table);
    pair_free(&ids);
    pair_free(&out);
    pair_free(&dout);
    pair_free(&dtable);

    /* row gather and weighted scatter (distinct rows), the ensemble's grouping per expert */
    pair_t src, rows, acc, rix, rw;
    pair_rand(&src, &r, -1.0f, 1.0f, 3, TS_SHAPE(40, 7, C_));
    pair_zeros(&rows, 3, TS_SHAPE(16, 7, C_));
    pair_rand(&acc, &r, -1.0f, 1.0f, 3, TS_SHAPE(40, 7, C_));
    pair_rand(&rw, &r, 0.0f, 1.0f, 1, TS_SHAPE(16));
    pair_alloc(&rix, TS_I32, 1, TS_SHAPE(16));
    for (int32_t i = 0; i < 16; i++)
        ((int32_t *)rix.t[0].data)[i] = (i * 7 + 3) % 40; /* distinct: 7 is prime to 40 */
    pair_upload(&rix);
    BOTH(ts_gather_rows(E, ON(rows), ON(src), ON(rix)));
    expect_identical(fx, "gather_rows", &rows);
    BOTH(ts_scatter_axpy_rows(E, ON(acc), ON(rows), ON(rix), ON(rw)));
    expect_close(fx, "scatter_axpy_rows", &acc);
    pair_free(&src);
    pair_free(&rows);
    pair_free(&acc);
    pair_free(&rix);
    pair_free(&rw);
}

/* ---- patches --------------------------------------------------------------------------- */

static void patch_case(fixture_t *fx, tu_rng_t *r, int64_t B, int64_t C, int64_t H, int64_t W,
                       int p) {
    char what[96], size[64];
    snprintf(size, sizeof size, "(%lld,%lld,%lld,%lld) p=%d", (long long)B, (long long)C,
             (long long)H, (long long)W, p);
    int64_t T = (H / p) * (W / p), F = C * p * p;
    pair_t img, tok, dimg, dtok;
    pair_rand(&img, r, -1.0f, 1.0f, 4, TS_SHAPE(B, C, H, W));
    pair_zeros(&tok, 3, TS_SHAPE(B, T, F));
    pair_rand(&dimg, r, -1.0f, 1.0f, 4, TS_SHAPE(B, C, H, W));
    pair_rand(&dtok, r, -1.0f, 1.0f, 3, TS_SHAPE(B, T, F));

    BOTH(ts_patchify_forward(E, ON(tok), ON(img), p));
    snprintf(what, sizeof what, "patchify_forward %s", size);
    expect_identical(fx, what, &tok);
    for (int k = 0; k < 2; k++) { /* written in 16 bits: the fp32 patches rounded */
        ts_dtype_t lp = k ? TS_F16 : TS_BF16;
        pair_t t16;
        pair_alloc(&t16, lp, 3, TS_SHAPE(B, T, F));
        BOTH(ts_patchify_forward(E, ON(t16), ON(img), p));
        snprintf(what, sizeof what, "patchify_forward %s %s", k ? "f16" : "bf16", size);
        expect_rounded(fx, what, lp, &t16, &tok);
        pair_free(&t16);
    }
    BOTH(ts_patchify_backward(E, ON(dimg), ON(dtok), p));
    snprintf(what, sizeof what, "patchify_backward %s", size);
    expect_close(fx, what, &dimg);
    BOTH(ts_unpatchify_forward(E, ON(img), ON(tok), p));
    snprintf(what, sizeof what, "unpatchify_forward %s", size);
    expect_identical(fx, what, &img);
    BOTH(ts_unpatchify_backward(E, ON(dtok), ON(dimg), p));
    snprintf(what, sizeof what, "unpatchify_backward %s", size);
    expect_close(fx, what, &dtok);

    pair_free(&img);
    pair_free(&tok);
    pair_free(&dimg);
    pair_free(&dtok);
}

static void test_patches(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {12};
    patch_case(fx, &r, B_, 4, 28, 28, 4); /* T = 49 tokens */
    patch_case(fx, &r, 2, 3, 32, 16, 2);  /* non-square image */
}

/* ---- reductions and losses ------------------------------------------------------------- */

static void test_reductions(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {13};
    pair_t x, x2, s, dx;
    pair_rand(&x, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));
    pair_rand(&x2, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));
    pair_rand(&s, &r, -1.0f, 1.0f, 1, TS_SHAPE(1));
    pair_rand(&dx, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));
    for (int64_t i = 0; i < N_ODD; i++) /* a non-zero mean, so the sum is not pure noise */
        host_f32(&x)[i] += 0.25f;
    pair_upload(&x);

    BOTH(ts_sum_forward(E, ON(s), ON(x)));
    expect_close(fx, "sum_forward", &s);
    BOTH(ts_sum_backward(E, ON(dx), ON(s)));
    expect_close(fx, "sum_backward", &dx);
    BOTH(ts_mean_forward(E, ON(s), ON(x)));
    expect_close(fx, "mean_forward", &s);
    BOTH(ts_mean_backward(E, ON(dx), ON(s)));
    expect_close(fx, "mean_backward", &dx);
    BOTH(ts_sumsq(E, ON(s), ON(x)));
    expect_close(fx, "sumsq", &s);
    float item[2];
    BOTH(ts_tensor_item(E, ON(s), &item[side]));
    printf("test_cuda_parity: %-40s %.9g vs %.9g\n", "tensor_item (sumsq)", (double)item[1],
           (double)item[0]);
    assert_true(fabs((double)item[1] - (double)item[0]) <= 1e-6 * fabs((double)item[0]));
    BOTH(ts_mse_forward(E, ON(s), ON(x), ON(x2)));
    expect_close(fx, "mse_forward", &s);
    BOTH(ts_mse_backward(E, ON(dx), 0.8f, ON(x), ON(x2)));
    expect_close(fx, "mse_backward", &dx);

    /* sum_rows overwrites out: start from garbage */
    const int64_t shapes[3][2] = {{B_ * T_, C_}, {4096, 40}, {7919, 13}};
    for (int i = 0; i < 3; i++) {
        char what[96];
        int64_t rows = shapes[i][0], C = shapes[i][1];
        pair_t inp, out;
        pair_rand(&inp, &r, -1.0f, 1.0f, 2, TS_SHAPE(rows, C));
        pair_rand(&out, &r, -100.0f, 100.0f, 1, TS_SHAPE(C));
        BOTH(ts_sum_rows(E, ON(out), ON(inp)));
        snprintf(what, sizeof what, "sum_rows (%lld,%lld)", (long long)rows, (long long)C);
        expect_close(fx, what, &out);
        pair_free(&inp);
        pair_free(&out);
    }

    pair_free(&x);
    pair_free(&x2);
    pair_free(&s);
    pair_free(&dx);
}

static void test_flow_interp(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {14};
    pair_t x0, eps, t, xt, target;
    pair_rand(&x0, &r, -1.0f, 1.0f, 4, TS_SHAPE(B_, 3, 32, 32));
    pair_rand(&eps, &r, -3.0f, 3.0f, 4, TS_SHAPE(B_, 3, 32, 32));
    pair_rand(&t, &r, 0.0f, 1.0f, 1, TS_SHAPE(B_));
    pair_zeros(&xt, 4, TS_SHAPE(B_, 3, 32, 32));
    pair_zeros(&target, 4, TS_SHAPE(B_, 3, 32, 32));

    BOTH(ts_flow_interp(E, ON(xt), ON(target), ON(x0), ON(eps), ON(t)));
    expect_close(fx, "flow_interp xt", &xt);
    expect_close(fx, "flow_interp target", &target);

    pair_free(&x0);
    pair_free(&eps);
    pair_free(&t);
    pair_free(&xt);
    pair_free(&target);
}

/* ---- optimiser ------------------------------------------------------------------------- */

static void test_optimiser(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {15};
    pair_t param, grad, m, v, ema;
    pair_rand(&param, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));
    pair_rand(&grad, &r, -0.01f, 0.01f, 1, TS_SHAPE(N_ODD));
    pair_zeros(&m, 1, TS_SHAPE(N_ODD));
    pair_zeros(&v, 1, TS_SHAPE(N_ODD));
    pair_rand(&ema, &r, -1.0f, 1.0f, 1, TS_SHAPE(N_ODD));

    ts_adamw_t hp = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    for (int64_t step = 1; step <= 3; step++)
        BOTH(ts_adamw_step(E, ON(param), ON(grad), ON(m), ON(v), &hp, step, 0.5f));
    expect_close(fx, "adamw_step x3 param", &param);
    expect_close(fx, "adamw_step x3 m", &m);
    expect_close(fx, "adamw_step x3 v", &v);
    BOTH(ts_ema_update(E, ON(ema), ON(param), 0.9999f));
    expect_close(fx, "ema_update", &ema);

    pair_free(&param);
    pair_free(&grad);
    pair_free(&m);
    pair_free(&v);
    pair_free(&ema);
}

/* ---- random numbers -------------------------------------------------------------------- */

static void test_rng(void **state) {
    fixture_t *fx = *state;
    pair_t out;
    pair_zeros(&out, 1, TS_SHAPE(N_ODD));
    const uint64_t seed = 0x5EED0123456789ABull;
    /* an offset that is not a multiple of 4, and one whose block index crosses 2^32 */
    const uint64_t offsets[2] = {7, (1ull << 34) - 5};
    for (int i = 0; i < 2; i++) {
        char what[96];
        uint64_t off = offsets[i];
        BOTH(ts_rng_uniform(E, ON(out), seed, off));
        snprintf(what, sizeof what, "rng_uniform offset %llu", (unsigned long long)off);
        expect_identical(fx, what, &out);
        BOTH(ts_rng_normal(E, ON(out), seed, off));
        snprintf(what, sizeof what, "rng_normal offset %llu", (unsigned long long)off);
        expect_identical(fx, what, &out);
    }
    pair_free(&out);
}

/* ---- classification -------------------------------------------------------------------- */

static void xent_case(fixture_t *fx, tu_rng_t *r, int64_t B, int64_t K, float range) {
    char what[96];
    pair_t z, y, loss, dz;
    pair_rand(&z, r, -range, range, 2, TS_SHAPE(B, K));
    pair_rand(&dz, r, -1.0f, 1.0f, 2, TS_SHAPE(B, K));
    pair_zeros(&loss, 1, TS_SHAPE(1));
    pair_alloc(&y, TS_I32, 1, TS_SHAPE(B));
    for (int64_t b = 0; b < B; b++)
        ((int32_t *)y.t[0].data)[b] = (int32_t)(tu_rng_next(r) % (uint64_t)K);
    pair_upload(&y);
    BOTH(ts_cross_entropy_forward(E, ON(loss), ON(z), ON(y)));
    snprintf(what, sizeof what, "cross_entropy_forward (%lld,%lld)", (long long)B, (long long)K);
    expect_close(fx, what, &loss);
    BOTH(ts_cross_entropy_backward(E, ON(dz), 0.7f, ON(z), ON(y)));
    snprintf(what, sizeof what, "cross_entropy_backward (%lld,%lld)", (long long)B, (long long)K);
    expect_close(fx, what, &dz);
    pair_free(&z);
    pair_free(&y);
    pair_free(&loss);
    pair_free(&dz);
}

static void test_classification(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {16};
    xent_case(fx, &r, 64, 10, 5.0f);
    xent_case(fx, &r, 4099, 8, 500.0f); /* more rows than a block; huge logits */
    xent_case(fx, &r, 3, 1001, 2.0f);

    pair_t x, out, dout, dx;
    pair_rand(&x, &r, -1.0f, 1.0f, 3, TS_SHAPE(B_, T_, C_));
    pair_zeros(&out, 2, TS_SHAPE(B_, C_));
    pair_rand(&dout, &r, -1.0f, 1.0f, 2, TS_SHAPE(B_, C_));
    pair_rand(&dx, &r, -1.0f, 1.0f, 3, TS_SHAPE(B_, T_, C_));
    BOTH(ts_mean_tokens_forward(E, ON(out), ON(x)));
    expect_close(fx, "mean_tokens_forward", &out);
    BOTH(ts_mean_tokens_backward(E, ON(dx), ON(dout)));
    expect_close(fx, "mean_tokens_backward", &dx);
    pair_free(&x);
    pair_free(&out);
    pair_free(&dout);
    pair_free(&dx);
}

/* ---- image ops (the VAE's) ------------------------------------------------------------- */

static void conv_case(fixture_t *fx, tu_rng_t *r, int64_t B, int64_t Cin, int64_t H, int64_t W,
                      int64_t Cout, int64_t k, ts_conv2d_t g, int64_t scratch_floats,
                      const char *what) {
    pair_t x, w, b, y, sc;
    int64_t Ho = ts_conv2d_out_dim(H, k, g.stride, g.pad_top, g.pad_bottom);
    int64_t Wo = ts_conv2d_out_dim(W, k, g.stride, g.pad_left, g.pad_right);
    pair_rand(&x, r, -1, 1, 4, TS_SHAPE(B, Cin, H, W));
    pair_rand(&w, r, -0.2f, 0.2f, 4, TS_SHAPE(Cout, Cin, k, k));
    pair_rand(&b, r, -1, 1, 1, TS_SHAPE(Cout));
    pair_zeros(&y, 4, TS_SHAPE(B, Cout, Ho, Wo));
    pair_zeros(&sc, 1, TS_SHAPE(scratch_floats));
    BOTH(ts_conv2d_forward(E, ON(y), ON(x), ON(w), ON(b), &g, ON(sc)));
    expect_close(fx, what, &y);
    pair_free(&x), pair_free(&w), pair_free(&b), pair_free(&y), pair_free(&sc);
}

/* A conv at 16 bits with the weight converted once (the VAE's path: im2col_lp, gemm_lp_in): the
 * GPU's output close to the CPU's, and bit for bit the GPU's own with the fp32 weight (the same
 * rounded operands, the same tile, the same cuBLAS product). */
static void conv_lp_case(fixture_t *fx, tu_rng_t *r, ts_precision_t prec, ts_conv2d_t g, int64_t k,
                         const char *what) {
    if (ts_engine_precision_check(&fx->e[0], prec, NULL, 0) != TS_OK ||
        ts_engine_precision_check(&fx->e[1], prec, NULL, 0) != TS_OK) {
        printf("test_cuda_parity: %-40s skipped: %s not on both engines\n", what,
               ts_precision_name(prec));
        return;
    }
    const int64_t B = 2, Cin = 32, H = 17, W = 15, Cout = 48;
    int64_t Ho = ts_conv2d_out_dim(H, k, g.stride, g.pad_top, g.pad_bottom);
    int64_t Wo = ts_conv2d_out_dim(W, k, g.stride, g.pad_left, g.pad_right);
    g.precision = prec;
    pair_t x, w, wl, b, y, y32, sc;
    pair_rand(&x, r, -1, 1, 4, TS_SHAPE(B, Cin, H, W));
    pair_rand(&w, r, -0.2f, 0.2f, 4, TS_SHAPE(Cout, Cin, k, k));
    pair_alloc(&wl, ts_precision_dtype(prec), 4, TS_SHAPE(Cout, Cin, k, k));
    pair_rand(&b, r, -1, 1, 1, TS_SHAPE(Cout));
    pair_zeros(&y, 4, TS_SHAPE(B, Cout, Ho, Wo));
    pair_zeros(&y32, 4, TS_SHAPE(B, Cout, Ho, Wo));
    pair_zeros(&sc, 1, TS_SHAPE(Cin * k * k * Wo * Ho)); /* whole images, either route */
    BOTH(ts_convert(E, ON(wl), ON(w)));
    BOTH(ts_conv2d_forward(E, ON(y), ON(x), ON(wl), ON(b), &g, ON(sc)));
    expect_close(fx, what, &y);
    TU_CHECK_OK(ts_conv2d_forward(&fx->e[1], &y32.t[1], &x.t[1], &w.t[1], &b.t[1], &g, &sc.t[1]));
    float *a = download(fx, &y), *c = download(fx, &y32);
    if (memcmp(a, c, ts_tensor_nbytes(&y.t[0])) != 0)
        fail_msg("%s: the 16-bit weight's output differs from the fp32 weight's on the GPU", what);
    free(a), free(c);
    pair_free(&x), pair_free(&w), pair_free(&wl), pair_free(&b), pair_free(&y), pair_free(&y32);
    pair_free(&sc);
}

/* in_place: the output written over x */
static void groupnorm_case(fixture_t *fx, tu_rng_t *r, int64_t B, int64_t C, int64_t S, int G,
                           int silu, float offset, int in_place, const char *what) {
    pair_t x, w, b, y;
    pair_rand(&x, r, offset - 1, offset + 1, 3, TS_SHAPE(B, C, S));
    pair_rand(&w, r, -2, 2, 1, TS_SHAPE(C));
    pair_rand(&b, r, -1, 1, 1, TS_SHAPE(C));
    pair_zeros(&y, 3, TS_SHAPE(B, C, S));
    int (*op)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *, const ts_tensor_t *,
              const ts_tensor_t *, int, float) =
        silu ? ts_groupnorm_silu_forward : ts_groupnorm_forward;
    pair_t *out = in_place ? &x : &y;
    BOTH(op(E, ON(*out), ON(x), ON(w), ON(b), G, 1e-6f));
    expect_close(fx, what, out);
    pair_free(&x), pair_free(&w), pair_free(&b), pair_free(&y);
}

static void test_image(void **state) {
    fixture_t *fx = *state;
    tu_rng_t r = {31};
    const ts_conv2d_t same = {1, 1, 1, 1, 1}, down = {2, 0, 1, 0, 1}, point = {1, 0, 0, 0, 0};
    conv_case(fx, &r, 2, 32, 33, 31, 64, 3, same, 1 << 20, "conv2d 3x3 same");
    conv_case(fx, &r, 2, 32, 33, 31, 64, 3, same, 32 * 9 * 31 * 2, "conv2d 3x3 tiled");
    conv_case(fx, &r, 1, 16, 17, 16, 16, 3, down, 1 << 20, "conv2d 3x3 stride 2 (0,1,0,1)");
    conv_case(fx, &r, 3, 24, 9, 7, 40, 1, point, 1, "conv2d 1x1");
    conv_lp_case(fx, &r, TS_PREC_BF16, same, 3, "conv2d 3x3 bf16, 16-bit weight");
    conv_lp_case(fx, &r, TS_PREC_F16, down, 3, "conv2d 3x3 stride 2 f16, 16-bit weight");
    conv_lp_case(fx, &r, TS_PREC_BF16, point, 1, "conv2d 1x1 bf16, 16-bit weight");
    groupnorm_case(fx, &r, 2, 128, 1024, 32, 0, 0, 0, "groupnorm");
    groupnorm_case(fx, &r, 2, 64, 33, 32, 1, 0, 0, "groupnorm + silu");
    groupnorm_case(fx, &r, 1, 8, 1000, 2, 0, 1000, 0, "groupnorm mean 1000");
    /* few large groups: the statistics split over several blocks a group (ts_groupnorm_splits) */
    groupnorm_case(fx, &r, 2, 96, 2501, 32, 1, 0, 0, "groupnorm + silu, 2 blocks a group");
    groupnorm_case(fx, &r, 1, 128, 65536, 32, 1, 0, 0,
                   "groupnorm + silu at 256², 32 blocks a group");
    groupnorm_case(fx, &r, 1, 128, 65536, 32, 0, 0, 1,
                   "groupnorm at 256² in place, 32 blocks a group");
    groupnorm_case(fx, &r, 1, 32, 5000, 32, 0, 0, 0, "groupnorm, one channel a group, split");
    groupnorm_case(fx, &r, 1, 8192, 1, 1, 1, 0, 0, "groupnorm + silu, one value a channel, split");
    pair_t x, y;
    pair_rand(&x, &r, -1, 1, 4, TS_SHAPE(3, 5, 7, 9));
    pair_zeros(&y, 4, TS_SHAPE(3, 5, 14, 18));
    BOTH(ts_upsample_nearest2x_forward(E, ON(y), ON(x)));
    expect_identical(fx, "upsample nearest 2x", &y);
    pair_free(&x), pair_free(&y);
}

int main(void) {
    char why[256] = "";
    if (ts_cuda_device_count(why, sizeof why) == 0) {
        printf("test_cuda_parity: SKIPPED: %s\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_add_bcast),
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_adaln),
        cmocka_unit_test(test_embeddings),
        cmocka_unit_test(test_patches),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_flow_interp),
        cmocka_unit_test(test_optimiser),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_classification),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_attention_fused),
        cmocka_unit_test(test_attention_flash),
        cmocka_unit_test(test_pinned),
        cmocka_unit_test(test_image),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
