/*
 * test_ops_forward.c — every forward op of kernels/ops.h on a CPU engine, against kernels/ref.c.
 *
 * Inputs are pseudo-random (tests/testutil.h's splitmix64 generator, fixed seeds); sizes
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
 * Softmax is also checked bit for bit against its plain row loop (max, exp, the sum in element
 * order, scale): the op's blocked loop must not change a rounding.
 *
 * Not covered here: gradients (test_ops_backward.c), dtype conversion (test_convert.c), the RNG
 * (test_rng.c), argument errors (test_api_errors.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "kernels/ref.h"
#include "tests/testutil.h"

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
    tu_rng_t r = {1};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t K = cases[c].K, N = cases[c].N;
        int64_t R = cases[c].lead[0] * (cases[c].ndim == 3 ? cases[c].lead[1] : 1);
        ts_tensor_t inp, out, w, b;
        if (cases[c].ndim == 3) {
            tu_alloc_f32(&inp, 3, TS_SHAPE(cases[c].lead[0], cases[c].lead[1], K));
            tu_alloc_f32(&out, 3, TS_SHAPE(cases[c].lead[0], cases[c].lead[1], N));
        } else {
            tu_alloc_f32(&inp, 2, TS_SHAPE(R, K));
            tu_alloc_f32(&out, 2, TS_SHAPE(R, N));
        }
        tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
        tu_alloc_f32(&b, 1, TS_SHAPE(N));
        tu_fill_uniform(&r, &inp, -1, 1);
        tu_fill_uniform(&r, &w, -1, 1);
        tu_fill_uniform(&r, &b, -1, 1);
        float *want = tu_floats(R * N);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            tu_fill_uniform(&r, &out, 50, 60); /* overwritten, never read */
            TU_CHECK_OK(ts_linear_forward(e, &out, &inp, &w, with_bias ? &b : NULL));
            ts_ref_linear(want, tu_f32(&inp), tu_f32(&w), with_bias ? tu_f32(&b) : NULL, R, K, N);
            tu_check_close(tu_f32(&out), want, R * N, 1e-6 * (double)K, 1e-5,
                           "linear R=%lld K=%lld N=%lld %s bias", (long long)R, (long long)K,
                           (long long)N, with_bias ? "with" : "without");
        }
        free(want);
        TU_FREE_TENSORS(&inp, &out, &w, &b);
    }
}

/* Batch invariance of a linear layer (kernels/cpu/cpu_gemm.c): an item of the batch (a sample's T
 * tokens of a 3-D input, or one row of a 2-D one) gets the same bits alone as at any place in a
 * batch, on this machine's OpenBLAS kernels whatever they are. */
static void test_linear_batch_invariant(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][3] = {/* T (0: a 2-D input), K, N */
                                       {196, 128, 384},
                                       {49, 64, 256},
                                       {16, 32, 96},
                                       {0, 128, 768}};
    enum { B = 13 };
    tu_rng_t r = {21};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t T = cases[c][0], K = cases[c][1], N = cases[c][2], rows = T ? T : 1;
        ts_tensor_t inp, w, b, out, one_in, one_out;
        if (T) {
            tu_alloc_f32(&inp, 3, TS_SHAPE(B, T, K));
            tu_alloc_f32(&out, 3, TS_SHAPE(B, T, N));
        } else {
            tu_alloc_f32(&inp, 2, TS_SHAPE(B, K));
            tu_alloc_f32(&out, 2, TS_SHAPE(B, N));
        }
        tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
        tu_alloc_f32(&b, 1, TS_SHAPE(N));
        tu_fill_uniform(&r, &inp, -1, 1);
        tu_fill_uniform(&r, &w, -1, 1);
        tu_fill_uniform(&r, &b, -1, 1);
        TU_CHECK_OK(ts_linear_forward(e, &out, &inp, &w, &b));
        for (int i = 0; i < B; i++) {
            TU_CHECK_OK(ts_tensor_slice(&one_in, &inp, i, 1));
            TU_CHECK_OK(ts_tensor_slice(&one_out, &out, i, 1));
            ts_tensor_t alone;
            tu_alloc_like(&alone, &one_out);
            TU_CHECK_OK(ts_linear_forward(e, &alone, &one_in, &w, &b));
            if (memcmp(tu_f32(&alone), tu_f32(&one_out), (size_t)(rows * N) * sizeof(float))) {
                print_error("T=%lld K=%lld N=%lld: item %d alone differs from the batch\n",
                            (long long)T, (long long)K, (long long)N, i);
                fail();
            }
            ts_tensor_free(&alone);
        }
        TU_FREE_TENSORS(&inp, &w, &b, &out);
    }
}

/* The bias goes into the CPU's GEMM slices (added right after each slice's product): the result
 * must equal, bit for bit, the same layer's product without a bias followed by a separate
 * broadcast add (one rounding each, as on the GPU). Shapes that run on
 * one thread, split over the rows of the output, and split over its columns; and K = 1024, where
 * filling C with the bias and calling sgemm with beta = 1 would round differently (OpenBLAS adds
 * the product to C one K block at a time). */
static void test_linear_bias_bits(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][3] = {/* M, K, N */
                                       {7, 3, 5},      {1, 128, 768},    {49, 128, 384},
                                       {200, 64, 300}, {3136, 128, 512}, {196, 1024, 256},
                                       {3, 256, 128},  {3136, 256, 384}, {392, 512, 128}};
    tu_rng_t r = {11};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t M = cases[c][0], K = cases[c][1], N = cases[c][2];
        ts_tensor_t inp, w, b, out, prod, sum;
        tu_alloc_f32(&inp, 2, TS_SHAPE(M, K));
        tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
        tu_alloc_f32(&b, 1, TS_SHAPE(N));
        tu_alloc_f32(&out, 2, TS_SHAPE(M, N));
        tu_alloc_f32(&prod, 2, TS_SHAPE(M, N));
        tu_alloc_f32(&sum, 2, TS_SHAPE(M, N));
        tu_fill_uniform(&r, &inp, -1, 1);
        tu_fill_uniform(&r, &w, -1, 1);
        tu_fill_uniform(&r, &b, -1, 1);
        TU_CHECK_OK(ts_linear_forward(e, &out, &inp, &w, &b));
        TU_CHECK_OK(ts_linear_forward(e, &prod, &inp, &w, NULL));
        TU_CHECK_OK(ts_add_bcast_forward(e, &sum, &prod, &b));
        if (memcmp(tu_f32(&out), tu_f32(&sum), (size_t)(M * N) * sizeof(float)) != 0) {
            print_error("linear M=%lld K=%lld N=%lld with bias differs from linear + add_bcast\n",
                        (long long)M, (long long)K, (long long)N);
            fail();
        }
        TU_FREE_TENSORS(&inp, &w, &b, &out, &prod, &sum);
    }
}

/* On the tests' 2 threads a one-row product is cut into two halves of its columns, and OpenBLAS
 * may round a half differently from the whole product (it does at these widths). The result must
 * be exactly that of the two halves, each one sgemm on a 1-thread engine: both when the second
 * thread is woken (the larger product) and when the product is too small to wake it and the
 * caller computes both halves. Not waking a thread must not change a bit. */
static void test_linear_slices(void **state) {
    ts_engine_t *e = *state, e1;
    ts_engine_opts_t one_thread = {.device = TS_CPU, .threads = 1};
    TU_CHECK_OK(ts_engine_init(&e1, &one_thread));
    static const int64_t cases[][2] = {/* K, N */ {256, 1536}, {2048, 2304}};
    tu_rng_t r = {12};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t K = cases[c][0], N = cases[c][1], H = N / 2;
        ts_tensor_t inp, w, b, out, w_half, b_half, out_half;
        tu_alloc_f32(&inp, 2, TS_SHAPE(1, K));
        tu_alloc_f32(&w, 2, TS_SHAPE(N, K));
        tu_alloc_f32(&b, 1, TS_SHAPE(N));
        tu_alloc_f32(&out, 2, TS_SHAPE(1, N));
        tu_alloc_f32(&out_half, 2, TS_SHAPE(1, H));
        tu_fill_uniform(&r, &inp, -1, 1);
        tu_fill_uniform(&r, &w, -1, 1);
        tu_fill_uniform(&r, &b, -1, 1);
        TU_CHECK_OK(ts_linear_forward(e, &out, &inp, &w, &b));
        for (int64_t half = 0; half < 2; half++) {
            TU_CHECK_OK(ts_tensor_slice(&w_half, &w, half * H, H));
            TU_CHECK_OK(ts_tensor_slice(&b_half, &b, half * H, H));
            TU_CHECK_OK(ts_linear_forward(&e1, &out_half, &inp, &w_half, &b_half));
            if (memcmp(tu_f32(&out) + half * H, tu_f32(&out_half), (size_t)H * sizeof(float))) {
                print_error("linear 1×%lld·%lld on 2 threads: columns [%lld, %lld) differ from "
                            "that half computed alone\n",
                            (long long)K, (long long)N, (long long)(half * H),
                            (long long)(half * H + H));
                fail();
            }
        }
        TU_FREE_TENSORS(&inp, &w, &b, &out, &out_half);
    }
    ts_engine_free(&e1);
}

/* One matmul case: c (batch?, M, N) = alpha·op(a)·op(b) + beta·c, checked per batch entry. */
static void run_matmul_case(ts_engine_t *e, tu_rng_t *r, int64_t batch, int64_t M, int64_t N,
                            int64_t K, int ta, int tb, float alpha, float beta) {
    ts_tensor_t a, b, c;
    int64_t ar = ta ? K : M, ac = ta ? M : K; /* a as stored */
    int64_t br = tb ? N : K, bc = tb ? K : N; /* b as stored */
    tu_alloc_f32_batch(&a, batch, ar, ac);
    tu_alloc_f32_batch(&b, batch, br, bc);
    tu_alloc_f32_batch(&c, batch, M, N);
    tu_fill_uniform(r, &a, -1, 1);
    tu_fill_uniform(r, &b, -1, 1);
    tu_fill_uniform(r, &c, -1, 1);
    float *want = tu_host_copy(&c);
    TU_CHECK_OK(ts_matmul(e, &c, &a, ta, &b, tb, alpha, beta));
    int64_t nb = batch > 0 ? batch : 1;
    for (int64_t i = 0; i < nb; i++)
        ts_ref_matmul(want + i * M * N, tu_f32(&a) + i * M * K, ta, tu_f32(&b) + i * K * N, tb, M,
                      N, K, alpha, beta);
    tu_check_close(tu_f32(&c), want, nb * M * N, 1e-6 * (double)K * fabs(alpha) + 1e-6, 1e-5,
                   "matmul batch=%lld M=%lld N=%lld K=%lld trans_a=%d trans_b=%d "
                   "alpha=%g beta=%g",
                   (long long)batch, (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta);
    free(want);
    TU_FREE_TENSORS(&a, &b, &c);
}

static void test_matmul_2d(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 17, 65}, {64, 49, 16}, {2, 1, 9}};
    static const float ab[][2] = {{1.0f, 0.0f}, {0.5f, -2.0f}, {2.0f, 1.0f}};
    tu_rng_t r = {2};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (size_t k = 0; k < sizeof ab / sizeof ab[0]; k++)
                    run_matmul_case(e, &r, 0, sizes[s][0], sizes[s][1], sizes[s][2], ta, tb,
                                    ab[k][0], ab[k][1]);
}

static void test_matmul_batched(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {3};
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
    tu_rng_t r = {4};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t R = cases[c].lead0 * cases[c].lead1, C = cases[c].C;
        ts_tensor_t inp, out, mean, rstd;
        tu_alloc_f32(&inp, 3, TS_SHAPE(cases[c].lead0, cases[c].lead1, C));
        tu_alloc_f32(&out, 3, TS_SHAPE(cases[c].lead0, cases[c].lead1, C));
        tu_alloc_f32(&mean, 1, TS_SHAPE(R));
        tu_alloc_f32(&rstd, 1, TS_SHAPE(R));
        tu_fill_uniform(&r, &inp, cases[c].offset - 2, cases[c].offset + 2);
        float *want = tu_floats(R * C), *wmean = tu_floats(R), *wrstd = tu_floats(R);
        ts_ref_layernorm(want, wmean, wrstd, tu_f32(&inp), R, C);
        TU_CHECK_OK(ts_layernorm_forward(e, &out, &mean, &rstd, &inp));
        tu_check_close(tu_f32(&out), want, R * C, 2e-5, 1e-5, "layernorm out R=%lld C=%lld",
                       (long long)R, (long long)C);
        tu_check_close(tu_f32(&mean), wmean, R, 1e-6, 1e-6, "layernorm mean R=%lld C=%lld",
                       (long long)R, (long long)C);
        tu_check_close(tu_f32(&rstd), wrstd, R, 0, 1e-4, "layernorm rstd R=%lld C=%lld",
                       (long long)R, (long long)C);
        if (C == 1) /* zero variance: rstd = 1/sqrt(eps) exactly as torch, and out = 0 */
            tu_check_scalar(tu_f32(&rstd)[0], 1000.0, 1e-3, "layernorm rstd at C=1");
        /* mean and rstd may be NULL at inference */
        tu_fill_uniform(&r, &out, 50, 60);
        TU_CHECK_OK(ts_layernorm_forward(e, &out, NULL, NULL, &inp));
        tu_check_close(tu_f32(&out), want, R * C, 2e-5, 1e-5, "layernorm (no stats) R=%lld C=%lld",
                       (long long)R, (long long)C);
        free(want);
        free(wmean);
        free(wrstd);
        TU_FREE_TENSORS(&inp, &out, &mean, &rstd);
    }
}

typedef int (*unary_op_t)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *);
typedef void (*unary_ref_t)(float *, const float *, int64_t);

static void check_unary(ts_engine_t *e, const char *name, unary_op_t op, unary_ref_t ref) {
    static const int64_t sizes[] = {1, 7, 1001, 65537};
    tu_rng_t r = {5};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t inp, out;
        tu_alloc_f32(&inp, 1, TS_SHAPE(n));
        tu_alloc_f32(&out, 1, TS_SHAPE(n));
        tu_fill_uniform(&r, &inp, -6, 6);
        static const float special[] = {0.0f, -20.0f, 20.0f, 1e-4f, -3.0f};
        for (int64_t i = 0; i < n && i < 5; i++)
            tu_f32(&inp)[i] = special[i];
        float *want = tu_floats(n);
        ref(want, tu_f32(&inp), n);
        TU_CHECK_OK(op(e, &out, &inp));
        tu_check_close(tu_f32(&out), want, n, 1e-6, 1e-5, "%s n=%lld", name, (long long)n);
        /* in place: out aliases inp */
        TU_CHECK_OK(op(e, &inp, &inp));
        tu_check_close(tu_f32(&inp), want, n, 1e-6, 1e-5, "%s in place n=%lld", name, (long long)n);
        free(want);
        TU_FREE_TENSORS(&inp, &out);
    }
}

static void test_gelu(void **state) { check_unary(*state, "gelu", ts_gelu_forward, ts_ref_gelu); }

static void test_silu(void **state) { check_unary(*state, "silu", ts_silu_forward, ts_ref_silu); }

static void test_softmax(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][2] = {{1, 1}, {7, 5}, {49, 49}, {5, 1000}, {3, 17}, {2, 2}};
    tu_rng_t r = {6};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t R = cases[c][0], C = cases[c][1];
        ts_tensor_t inp, out;
        tu_alloc_f32(&inp, 2, TS_SHAPE(R, C));
        tu_alloc_f32(&out, 2, TS_SHAPE(R, C));
        tu_fill_uniform(&r, &inp, -5, 5);
        if (R >= 2 && C >= 2) { /* huge logits must not overflow: exp is taken after the max */
            tu_f32(&inp)[0] = 1000.0f;
            tu_f32(&inp)[1] = 999.0f;
            tu_f32(&inp)[C] = -1000.0f;
            tu_f32(&inp)[C + 1] = -1000.0f;
        }
        float *want = tu_floats(R * C);
        ts_ref_softmax(want, tu_f32(&inp), R, C);
        TU_CHECK_OK(ts_softmax_forward(e, &out, &inp));
        tu_check_close(tu_f32(&out), want, R * C, 1e-6, 1e-5, "softmax R=%lld C=%lld", (long long)R,
                       (long long)C);
        for (int64_t i = 0; i < R; i++) {
            double s = 0;
            for (int64_t j = 0; j < C; j++) {
                float v = tu_f32(&out)[i * C + j];
                assert_true(isfinite(v) && v >= 0.0f && v <= 1.0f);
                s += v;
            }
            tu_check_scalar(s, 1.0, 1e-5, "softmax row %lld sum, R=%lld C=%lld", (long long)i,
                            (long long)R, (long long)C);
        }
        if (R >= 2 && C >= 2) /* e^-1 / (1 + e^-1 + ...) for the 1000/999 row */
            assert_true(tu_f32(&out)[0] > tu_f32(&out)[1] && tu_f32(&out)[1] > 0.2f);
        TU_CHECK_OK(ts_softmax_forward(e, &inp, &inp)); /* in place */
        tu_check_close(tu_f32(&inp), want, R * C, 1e-6, 1e-5, "softmax in place R=%lld C=%lld",
                       (long long)R, (long long)C);
        free(want);
        TU_FREE_TENSORS(&inp, &out);
    }
}

/* One row of softmax as the CPU loop was first written: a running max, e^(x − max) with
 * math.h's exp, the sum in element order, × 1/sum. */
static void plain_softmax_row(float *o, const float *x, int64_t C) {
    float mx = x[0];
    for (int64_t i = 1; i < C; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < C; i++)
        o[i] = ts_expf(x[i] - mx);
    float s = 0.0f;
    for (int64_t i = 0; i < C; i++)
        s += o[i];
    float inv = 1.0f / s;
    for (int64_t i = 0; i < C; i++)
        o[i] *= inv;
}

/* The op's blocked, vectorised loop computes every row bit for bit as the plain loop does (any
 * NaN matching any NaN): row counts around its block of rows and the thread split, widths around
 * its lanes, and rows whose max is ±0, +Inf, −Inf or comes with a NaN. */
static void test_softmax_bits(void **state) {
    ts_engine_t *e = *state;
    static const int64_t rows[] = {1, 7, 8, 9, 17, 64, 197};
    static const int64_t cols[] = {1, 5, 8, 9, 49, 196};
    tu_rng_t r = {16};
    for (size_t a = 0; a < sizeof rows / sizeof rows[0]; a++)
        for (size_t b = 0; b < sizeof cols / sizeof cols[0]; b++) {
            int64_t R = rows[a], C = cols[b];
            ts_tensor_t inp, out;
            tu_alloc_f32(&inp, 2, TS_SHAPE(R, C));
            tu_alloc_f32(&out, 2, TS_SHAPE(R, C));
            tu_fill_uniform(&r, &inp, -30, 30);
            float *x = tu_f32(&inp);
            if (R >= 6 && C >= 3) {
                x[0 * C + 0] = -0.0f, x[0 * C + 1] = 0.0f, x[0 * C + 2] = -0.0f; /* max ±0 */
                for (int64_t i = 3; i < C; i++)
                    x[0 * C + i] = -1.0f;
                x[1 * C + C / 2] = INFINITY;
                for (int64_t i = 0; i < C; i++)
                    x[2 * C + i] = -INFINITY;
                x[3 * C + 0] = NAN;
                x[4 * C + C - 1] = NAN;
                x[5 * C + 1] = -INFINITY;
            }
            float *want = tu_floats(R * C);
            for (int64_t i = 0; i < R; i++)
                plain_softmax_row(want + i * C, x + i * C, C);
            TU_CHECK_OK(ts_softmax_forward(e, &out, &inp));
            for (int64_t i = 0; i < R * C; i++) {
                float got = tu_f32(&out)[i];
                if (memcmp(&got, &want[i], sizeof got) != 0 && !(isnan(got) && isnan(want[i]))) {
                    print_error("softmax R=%lld C=%lld element (%lld, %lld) = %.9g, the plain loop "
                                "gives %.9g\n",
                                (long long)R, (long long)C, (long long)(i / C), (long long)(i % C),
                                got, want[i]);
                    fail();
                }
            }
            free(want);
            TU_FREE_TENSORS(&inp, &out);
        }
}

/* ---- attention ------------------------------------------------------------------------- */

static void test_attention(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][4] = {/* B, T, C, heads */
                                       {1, 1, 4, 1},  {2, 5, 8, 2},   {2, 49, 32, 4},
                                       {1, 7, 12, 3}, {3, 16, 48, 1}, {1, 3, 6, 6}};
    tu_rng_t r = {7};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t B = cases[c][0], T = cases[c][1], C = cases[c][2], H = cases[c][3];
        ts_tensor_t qkv, out, att;
        tu_alloc_f32(&qkv, 3, TS_SHAPE(B, T, 3 * C));
        tu_alloc_f32(&out, 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&att, 4, TS_SHAPE(B, H, T, T));
        tu_fill_uniform(&r, &qkv, -2, 2);
        float *want = tu_floats(B * T * C), *watt = tu_floats(B * H * T * T);
        ts_ref_attention(want, watt, tu_f32(&qkv), B, T, C, H);
        TU_CHECK_OK(ts_attention_forward(e, &out, &att, &qkv, (int)H));
        tu_check_close(tu_f32(&out), want, B * T * C, 2e-5, 1e-5,
                       "attention out B=%lld T=%lld C=%lld heads=%lld", (long long)B, (long long)T,
                       (long long)C, (long long)H);
        tu_check_close(tu_f32(&att), watt, B * H * T * T, 2e-6, 1e-5,
                       "attention att B=%lld T=%lld C=%lld heads=%lld", (long long)B, (long long)T,
                       (long long)C, (long long)H);
        free(want);
        free(watt);
        TU_FREE_TENSORS(&qkv, &out, &att);
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
    tu_rng_t r = {8};
    for (size_t c = 0; c < sizeof mod_cases / sizeof mod_cases[0]; c++) {
        int64_t B = mod_cases[c][0], T = mod_cases[c][1], C = mod_cases[c][2], M = mod_cases[c][3];
        int sh = mod_idx[c][0], sc = mod_idx[c][1];
        ts_tensor_t x, mod, out;
        tu_alloc_f32(&x, 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&out, 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&mod, 2, TS_SHAPE(B, M * C));
        tu_fill_uniform(&r, &x, -2, 2);
        tu_fill_uniform(&r, &mod, -1, 1);
        float *want = tu_floats(B * T * C);
        ts_ref_modulate(want, tu_f32(&x), tu_f32(&mod), B, T, C, M, sh, sc);
        TU_CHECK_OK(ts_modulate_forward(e, &out, &x, &mod, sh, sc));
        tu_check_close(tu_f32(&out), want, B * T * C, 4e-6, 1e-6,
                       "modulate B=%lld T=%lld C=%lld M=%lld shift=%d scale=%d", (long long)B,
                       (long long)T, (long long)C, (long long)M, sh, sc);
        TU_CHECK_OK(ts_modulate_forward(e, &x, &x, &mod, sh, sc)); /* in place */
        tu_check_close(tu_f32(&x), want, B * T * C, 4e-6, 1e-6, "modulate in place");
        free(want);
        TU_FREE_TENSORS(&x, &out, &mod);
    }
}

static void test_gate_residual(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {9};
    for (size_t c = 0; c < sizeof mod_cases / sizeof mod_cases[0]; c++) {
        int64_t B = mod_cases[c][0], T = mod_cases[c][1], C = mod_cases[c][2], M = mod_cases[c][3];
        int g = mod_idx[c][2];
        ts_tensor_t res, y, mod, out;
        tu_alloc_f32(&res, 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&y, 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&out, 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&mod, 2, TS_SHAPE(B, M * C));
        tu_fill_uniform(&r, &res, -2, 2);
        tu_fill_uniform(&r, &y, -2, 2);
        tu_fill_uniform(&r, &mod, -1, 1);
        float *want = tu_floats(B * T * C);
        ts_ref_gate_residual(want, tu_f32(&res), tu_f32(&y), tu_f32(&mod), B, T, C, M, g);
        TU_CHECK_OK(ts_gate_residual_forward(e, &out, &res, &y, &mod, g));
        tu_check_close(tu_f32(&out), want, B * T * C, 4e-6, 1e-6,
                       "gate_residual B=%lld T=%lld C=%lld M=%lld gate=%d", (long long)B,
                       (long long)T, (long long)C, (long long)M, g);
        TU_CHECK_OK(ts_gate_residual_forward(e, &res, &res, &y, &mod, g)); /* in place */
        tu_check_close(tu_f32(&res), want, B * T * C, 4e-6, 1e-6, "gate_residual in place");
        free(want);
        TU_FREE_TENSORS(&res, &y, &out, &mod);
    }
}

/* ---- elementwise ----------------------------------------------------------------------- */

static void test_add_axpy_scale_fill(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[] = {1, 7, 1000, 100003};
    tu_rng_t r = {10};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t a, b, out;
        tu_alloc_f32(&a, 1, TS_SHAPE(n));
        tu_alloc_f32(&b, 1, TS_SHAPE(n));
        tu_alloc_f32(&out, 1, TS_SHAPE(n));
        tu_fill_uniform(&r, &a, -3, 3);
        tu_fill_uniform(&r, &b, -3, 3);
        float *want = tu_floats(n), *a0 = tu_host_copy(&a), *b0 = tu_host_copy(&b);

        /* add: one IEEE addition, so exactly the double sum rounded once */
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)((double)a0[i] + (double)b0[i]);
        TU_CHECK_OK(ts_add(e, &out, &a, &b));
        tu_check_close(tu_f32(&out), want, n, 0, 0, "add n=%lld", (long long)n);
        TU_CHECK_OK(ts_add(e, &a, &a, &b)); /* out aliases a */
        tu_check_close(tu_f32(&a), want, n, 0, 0, "add out==a");
        memcpy(a.data, a0, (size_t)n * sizeof(float));
        TU_CHECK_OK(ts_add(e, &b, &a, &b)); /* out aliases b */
        tu_check_close(tu_f32(&b), want, n, 0, 0, "add out==b");
        memcpy(b.data, b0, (size_t)n * sizeof(float));

        /* axpy */
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)((double)b0[i] + (double)-0.75f * (double)a0[i]);
        TU_CHECK_OK(ts_axpy(e, &b, -0.75f, &a));
        tu_check_close(tu_f32(&b), want, n, 4e-7, 1e-6, "axpy n=%lld", (long long)n);

        /* scale: one multiplication, exact */
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)((double)a0[i] * 1.3f);
        TU_CHECK_OK(ts_scale(e, &a, 1.3f));
        tu_check_close(tu_f32(&a), want, n, 0, 0, "scale n=%lld", (long long)n);

        /* fill and zero */
        TU_CHECK_OK(ts_fill(e, &out, -2.5f));
        for (int64_t i = 0; i < n; i++)
            want[i] = -2.5f;
        tu_check_close(tu_f32(&out), want, n, 0, 0, "fill");
        TU_CHECK_OK(ts_zero(e, &out));
        for (int64_t i = 0; i < n; i++)
            if (tu_f32(&out)[i] != 0.0f || signbit(tu_f32(&out)[i])) {
                print_error("zero n=%lld: element %lld is %g\n", (long long)n, (long long)i,
                            tu_f32(&out)[i]);
                fail();
            }
        free(want);
        free(a0);
        free(b0);
        TU_FREE_TENSORS(&a, &b, &out);
    }
    /* ts_zero works on any dtype */
    ts_tensor_t h;
    assert_int_equal(ts_tensor_alloc(&h, TS_F16, TS_CPU, 2, TS_SHAPE(3, 5)), TS_OK);
    memset(h.data, 0x3c, ts_tensor_nbytes(&h));
    TU_CHECK_OK(ts_zero(e, &h));
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
    tu_rng_t r = {11};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ts_tensor_t x, b, out;
        tu_alloc_f32(&x, cases[c].xnd, cases[c].xs);
        tu_alloc_f32(&out, cases[c].xnd, cases[c].xs);
        tu_alloc_f32(&b, cases[c].bnd, cases[c].bs);
        tu_fill_uniform(&r, &x, -3, 3);
        tu_fill_uniform(&r, &b, -3, 3);
        int64_t n = ts_tensor_numel(&x), S = ts_tensor_numel(&b);
        float *want = tu_floats(n);
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)((double)tu_f32(&x)[i] + (double)tu_f32(&b)[i % S]);
        TU_CHECK_OK(ts_add_bcast_forward(e, &out, &x, &b));
        tu_check_close(tu_f32(&out), want, n, 0, 0, "add_bcast n=%lld S=%lld", (long long)n,
                       (long long)S);
        TU_CHECK_OK(ts_add_bcast_forward(e, &x, &x, &b)); /* in place */
        tu_check_close(tu_f32(&x), want, n, 0, 0, "add_bcast in place n=%lld S=%lld", (long long)n,
                       (long long)S);
        free(want);
        TU_FREE_TENSORS(&x, &b, &out);
    }
}

/* ---- embeddings ------------------------------------------------------------------------ */

static void test_timestep_embedding(void **state) {
    ts_engine_t *e = *state;
    static const int64_t dims[] = {2, 3, 7, 64, 129, 256};
    static const struct {
        float scale, lo, hi;
    } regimes[] = {{1000.0f, 0.0f, 1.0f}, {1.0f, -3.0f, 3.0f}};
    tu_rng_t r = {12};
    for (size_t g = 0; g < sizeof regimes / sizeof regimes[0]; g++) {
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            int64_t B = 5, D = dims[d], half = D / 2;
            float scale = regimes[g].scale;
            ts_tensor_t t, out;
            tu_alloc_f32(&t, 1, TS_SHAPE(B));
            tu_alloc_f32(&out, 2, TS_SHAPE(B, D));
            tu_fill_uniform(&r, &t, regimes[g].lo, regimes[g].hi);
            tu_f32(&t)[0] = 0.0f; /* cos 0 = 1, sin 0 = 0 in every column */
            if (scale == 1000.0f)
                tu_f32(&t)[B - 1] = 1.0f;
            tu_fill_uniform(&r, &out, 50, 60);
            float *want = tu_floats(B * D);
            ts_ref_timestep_embedding(want, tu_f32(&t), B, D, scale);
            TU_CHECK_OK(ts_timestep_embedding_forward(e, &out, &t, scale));
            for (int64_t b = 0; b < B; b++) {
                for (int64_t i = 0; i < D; i++) {
                    /* tolerance grows with the phase: DiT computes it in float32 */
                    double freq = i < 2 * half ? exp(-log(10000.0) * (double)(i % half) / half) : 0;
                    double arg = fabs((double)scale * tu_f32(&t)[b] * freq);
                    double got = tu_f32(&out)[b * D + i], w = want[b * D + i];
                    if (!(fabs(got - w) <= 2e-6 + 2e-6 * arg)) {
                        print_error("timestep_embedding D=%lld scale=%g: t=%.9g column %lld: got "
                                    "%.9g, expected %.9g (phase %.6g)\n",
                                    (long long)D, scale, tu_f32(&t)[b], (long long)i, got, w, arg);
                        fail();
                    }
                }
                if (D % 2 == 1 && tu_f32(&out)[b * D + D - 1] != 0.0f) {
                    print_error("timestep_embedding D=%lld: pad column is %g, expected 0\n",
                                (long long)D, tu_f32(&out)[b * D + D - 1]);
                    fail();
                }
            }
            for (int64_t i = 0; i < half; i++) { /* t = 0: [cos, sin] = [1, 0] exactly */
                assert_true(tu_f32(&out)[i] == 1.0f);
                assert_true(tu_f32(&out)[half + i] == 0.0f);
            }
            free(want);
            TU_FREE_TENSORS(&t, &out);
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
            tu_alloc_f32(&out, 2, TS_SHAPE(G * G, D));
            float *want = tu_floats(G * G * D);
            ts_ref_pos_embed_2d(want, G, D);
            TU_CHECK_OK(ts_pos_embed_2d(e, &out, (int)G));
            tu_check_close(tu_f32(&out), want, G * G * D, 1.2e-7, 0,
                           "pos_embed_2d grid=%lld D=%lld", (long long)G,
                           (long long)D); /* ≤ 1 ulp of |x| ≤ 1 */
            /* frequency 0 (ω = 1) spelled out: token m = i·grid + j holds sin j, cos j, sin i,
             * cos i — the column coordinate first, as DiT's meshgrid(w, h) does */
            for (int64_t i = 0; i < G; i++)
                for (int64_t j = 0; j < G; j++) {
                    const float *row = tu_f32(&out) + (i * G + j) * D;
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
    tu_rng_t r = {13};
    int64_t V = 11, D = 7, B = 6;
    ts_tensor_t table, ids, out;
    tu_alloc_f32(&table, 2, TS_SHAPE(V, D));
    tu_alloc_f32(&out, 2, TS_SHAPE(B, D));
    assert_int_equal(ts_tensor_alloc(&ids, TS_I32, TS_CPU, 1, TS_SHAPE(B)), TS_OK);
    memcpy(ids.data, ids_v, sizeof ids_v);
    tu_fill_uniform(&r, &table, -1, 1);
    float want[6 * 7];
    ts_ref_embedding(want, tu_f32(&table), ids_v, B, D);
    TU_CHECK_OK(ts_embedding_forward(e, &out, &table, &ids));
    tu_check_close(tu_f32(&out), want, B * D, 0, 0, "embedding V=11 D=7 B=6");
    /* ids checked by the caller: the same rows; their dtype is still checked, their values not */
    TU_CHECK_OK(ts_zero(e, &out));
    TU_CHECK_OK(ts_embedding_forward_prechecked(e, &out, &table, &ids));
    tu_check_close(tu_f32(&out), want, B * D, 0, 0, "embedding prechecked V=11 D=7 B=6");
    ts_tensor_t f;
    tu_alloc_f32(&f, 1, TS_SHAPE(B));
    assert_int_not_equal(ts_embedding_forward_prechecked(e, &out, &table, &f), TS_OK);
    ((int32_t *)ids.data)[2] = 11; /* out of range: the checked op refuses it */
    assert_int_equal(ts_embedding_forward(e, &out, &table, &ids), TS_ERANGE);
    TU_FREE_TENSORS(&table, &ids, &out, &f);
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
    tu_rng_t r = {14};
    for (size_t c = 0; c < sizeof patch_cases / sizeof patch_cases[0]; c++) {
        int64_t B = patch_cases[c][0], C = patch_cases[c][1], H = patch_cases[c][2],
                W = patch_cases[c][3], p = patch_cases[c][4];
        int64_t T = (H / p) * (W / p), Fd = C * p * p, n = B * C * H * W;
        ts_tensor_t img, tok, img2, tokt;
        tu_alloc_f32(&img, 4, TS_SHAPE(B, C, H, W));
        tu_alloc_f32(&img2, 4, TS_SHAPE(B, C, H, W));
        tu_alloc_f32(&tok, 3, TS_SHAPE(B, T, Fd));
        tu_alloc_f32(&tokt, 3, TS_SHAPE(B, T, Fd));
        tu_fill_uniform(&r, &img, -1, 1);
        float *want = tu_floats(n);
        TU_CHECK_OK(ts_patchify_forward(e, &tok, &img, (int)p));
        ts_ref_patchify(want, tu_f32(&img), B, C, H, W, p);
        tu_check_close(tu_f32(&tok), want, n, 0, 0, "patchify B=%lld C=%lld H=%lld W=%lld p=%lld",
                       (long long)B, (long long)C, (long long)H, (long long)W, (long long)p);

        /* unpatchify of random tokens */
        tu_fill_uniform(&r, &tokt, -1, 1);
        TU_CHECK_OK(ts_unpatchify_forward(e, &img2, &tokt, (int)p));
        ts_ref_unpatchify(want, tu_f32(&tokt), B, C, H, W, p);
        tu_check_close(tu_f32(&img2), want, n, 0, 0,
                       "unpatchify B=%lld C=%lld H=%lld W=%lld p=%lld", (long long)B, (long long)C,
                       (long long)H, (long long)W, (long long)p);

        /* round trip: patchify's (c, py, px) features reordered to (py, px, c) and unpatchified
         * give the image back */
        for (int64_t bt = 0; bt < B * T; bt++)
            for (int64_t ch = 0; ch < C; ch++)
                for (int64_t pq = 0; pq < p * p; pq++)
                    tu_f32(&tokt)[bt * Fd + pq * C + ch] = tu_f32(&tok)[bt * Fd + ch * p * p + pq];
        TU_CHECK_OK(ts_unpatchify_forward(e, &img2, &tokt, (int)p));
        tu_check_close(tu_f32(&img2), tu_f32(&img), n, 0, 0,
                       "patchify/unpatchify round trip B=%lld C=%lld H=%lld W=%lld "
                       "p=%lld",
                       (long long)B, (long long)C, (long long)H, (long long)W, (long long)p);
        free(want);
        TU_FREE_TENSORS(&img, &img2, &tok, &tokt);
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
    tu_rng_t r = {15};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t x, out;
        tu_alloc_f32(&x, 2, TS_SHAPE(1, n));
        tu_alloc_f32(&out, 1, TS_SHAPE(1));
        tu_fill_uniform(&r, &x, -1, 2);
        double ref = ts_ref_sum(tu_f32(&x), n), sa = sum_abs(tu_f32(&x), n);
        float v;
        TU_CHECK_OK(ts_sum_forward(e, &out, &x));
        TU_CHECK_OK(ts_tensor_item(e, &out, &v));
        assert_true(v == tu_f32(&out)[0]);
        tu_check_scalar(v, ref, 1e-6 * fabs(ref) + 1e-8 * sa, "sum n=%lld", (long long)n);
        TU_CHECK_OK(ts_mean_forward(e, &out, &x));
        tu_check_scalar(tu_f32(&out)[0], ref / (double)n,
                        (1e-6 * fabs(ref) + 1e-8 * sa) / (double)n, "mean n=%lld", (long long)n);
        double sq = 0;
        for (int64_t i = 0; i < n; i++)
            sq += (double)tu_f32(&x)[i] * (double)tu_f32(&x)[i];
        TU_CHECK_OK(ts_sumsq(e, &out, &x));
        tu_check_scalar(tu_f32(&out)[0], sq, 1e-6 * sq, "sumsq n=%lld", (long long)n);
        TU_FREE_TENSORS(&x, &out);
    }
}

static void test_sum_rows(void **state) {
    ts_engine_t *e = *state;
    static const int64_t cases[][3] = {{1, 1, 1}, {7, 1, 5}, {3, 49, 16}, {1000, 1, 3}, {2, 2, 1}};
    tu_rng_t r = {16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t R = cases[c][0] * cases[c][1], C = cases[c][2];
        ts_tensor_t x, out;
        tu_alloc_f32(&x, 3, TS_SHAPE(cases[c][0], cases[c][1], C));
        tu_alloc_f32(&out, 1, TS_SHAPE(C));
        tu_fill_uniform(&r, &x, -1, 1);
        tu_fill_uniform(&r, &out, 50, 60); /* overwritten */
        float *want = tu_floats(C);
        double maxabs = 0;
        for (int64_t j = 0; j < C; j++) {
            double s = 0, a = 0;
            for (int64_t i = 0; i < R; i++) {
                s += tu_f32(&x)[i * C + j];
                a += fabs((double)tu_f32(&x)[i * C + j]);
            }
            want[j] = (float)s;
            if (a > maxabs)
                maxabs = a;
        }
        TU_CHECK_OK(ts_sum_rows(e, &out, &x));
        tu_check_close(tu_f32(&out), want, C, 1e-6 * maxabs + 1e-7, 1e-6, "sum_rows R=%lld C=%lld",
                       (long long)R, (long long)C);
        free(want);
        TU_FREE_TENSORS(&x, &out);
    }
}

static void test_mse(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[] = {1, 7, 4097};
    tu_rng_t r = {17};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t pred, target, loss;
        tu_alloc_f32(&pred, 2, TS_SHAPE(n, 1));
        tu_alloc_f32(&target, 2, TS_SHAPE(n, 1));
        tu_alloc_f32(&loss, 1, TS_SHAPE(1));
        tu_fill_uniform(&r, &pred, -2, 2);
        tu_fill_uniform(&r, &target, -2, 2);
        TU_CHECK_OK(ts_mse_forward(e, &loss, &pred, &target));
        double ref = ts_ref_mse(tu_f32(&pred), tu_f32(&target), n);
        tu_check_scalar(tu_f32(&loss)[0], ref, 1e-5 * ref + 1e-12, "mse n=%lld", (long long)n);
        TU_CHECK_OK(ts_mse_forward(e, &loss, &pred, &pred)); /* identical: exactly 0 */
        assert_true(tu_f32(&loss)[0] == 0.0f);
        TU_FREE_TENSORS(&pred, &target, &loss);
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
    tu_rng_t r = {18};
    for (size_t h = 0; h < sizeof hps / sizeof hps[0]; h++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            int64_t n = sizes[s];
            const ts_adamw_t *hp = &hps[h];
            ts_tensor_t p, g, m, v;
            tu_alloc_f32(&p, 1, TS_SHAPE(n));
            tu_alloc_f32(&g, 1, TS_SHAPE(n));
            tu_alloc_f32(&m, 1, TS_SHAPE(n));
            tu_alloc_f32(&v, 1, TS_SHAPE(n));
            tu_fill_uniform(&r, &p, -1, 1);
            float *rp = tu_host_copy(&p), *rm = tu_host_copy(&m), *rv = tu_host_copy(&v);
            float *gs = tu_floats(n);
            /* steps 1..5, then a jump to step 1000 (bias corrections near 1) */
            static const int64_t steps[] = {1, 2, 3, 4, 5, 1000};
            for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
                float grad_scale = (k == 2) ? 0.5f : 1.0f;
                tu_fill_uniform(&r, &g, -1, 1);
                for (int64_t i = 0; i < n; i++)
                    gs[i] = tu_f32(&g)[i] * grad_scale;
                TU_CHECK_OK(ts_adamw_step(e, &p, &g, &m, &v, hp, steps[k], grad_scale));
                ts_ref_adamw(rp, gs, rm, rv, n, hp->lr, hp->beta1, hp->beta2, hp->eps,
                             hp->weight_decay, steps[k]);
                tu_check_close(tu_f32(&p), rp, n, 1e-6, 1e-5,
                               "adamw n=%lld lr=%g wd=%g step=%lld param", (long long)n, hp->lr,
                               hp->weight_decay, (long long)steps[k]);
                tu_check_close(tu_f32(&m), rm, n, 2e-7, 1e-5, "adamw n=%lld step=%lld m",
                               (long long)n,
                               (long long)steps[k]); /* β1·m and (1−β1)·g may cancel */
                tu_check_close(tu_f32(&v), rv, n, 1e-12, 1e-5, "adamw n=%lld step=%lld v",
                               (long long)n, (long long)steps[k]);
            }
            free(rp);
            free(rm);
            free(rv);
            free(gs);
            TU_FREE_TENSORS(&p, &g, &m, &v);
        }
    }
}

/* With a zero gradient and zero moments, AdamW only decays: p ← p·(1 − lr·wd). */
static void test_adamw_decay_only(void **state) {
    ts_engine_t *e = *state;
    ts_adamw_t hp = {0.1f, 0.9f, 0.999f, 1e-8f, 0.5f};
    ts_tensor_t p, g, m, v;
    tu_alloc_f32(&p, 1, TS_SHAPE(3));
    tu_alloc_f32(&g, 1, TS_SHAPE(3));
    tu_alloc_f32(&m, 1, TS_SHAPE(3));
    tu_alloc_f32(&v, 1, TS_SHAPE(3));
    for (int i = 0; i < 3; i++) /* written, not assumed: a poisoned allocation holds NaN */
        tu_f32(&g)[i] = tu_f32(&m)[i] = tu_f32(&v)[i] = 0.0f;
    tu_f32(&p)[0] = 1.0f;
    tu_f32(&p)[1] = -2.0f;
    tu_f32(&p)[2] = 0.25f;
    TU_CHECK_OK(ts_adamw_step(e, &p, &g, &m, &v, &hp, 1, 1.0f));
    float want[3] = {0.95f, -1.9f, 0.2375f};
    tu_check_close(tu_f32(&p), want, 3, 1e-7, 1e-6, "adamw decay only (g = 0)");
    TU_FREE_TENSORS(&p, &g, &m, &v);
}

static void test_ema(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[] = {1, 7, 10001};
    tu_rng_t r = {19};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ts_tensor_t ema, p;
        tu_alloc_f32(&ema, 1, TS_SHAPE(n));
        tu_alloc_f32(&p, 1, TS_SHAPE(n));
        tu_fill_uniform(&r, &ema, -1, 1);
        tu_fill_uniform(&r, &p, -1, 1);
        float *want = tu_floats(n);
        for (int64_t i = 0; i < n; i++)
            want[i] = (float)(0.999 * tu_f32(&ema)[i] + (1.0 - 0.999) * tu_f32(&p)[i]);
        TU_CHECK_OK(ts_ema_update(e, &ema, &p, 0.999f));
        tu_check_close(tu_f32(&ema), want, n, 4e-7, 1e-6, "ema n=%lld decay=0.999", (long long)n);
        TU_CHECK_OK(ts_ema_update(e, &ema, &p, 0.0f)); /* decay 0 copies the parameters */
        tu_check_close(tu_f32(&ema), tu_f32(&p), n, 0, 0, "ema decay=0");
        free(want);
        TU_FREE_TENSORS(&ema, &p);
    }
}

/* ---- row gather / scatter ------------------------------------------------------------ */

/* gather then weighted scatter against plain loops; duplicate or out-of-range indices refused */
static void test_gather_scatter_rows(void **state) {
    ts_engine_t *e = *state;
    tu_rng_t r = {41};
    ts_tensor_t inp, got, acc, idx, w;
    tu_alloc_f32(&inp, 3, TS_SHAPE(6, 4, 5));
    tu_alloc_f32(&got, 3, TS_SHAPE(3, 4, 5));
    tu_alloc_f32(&acc, 3, TS_SHAPE(6, 4, 5));
    tu_alloc_f32(&w, 1, TS_SHAPE(3));
    assert_int_equal(ts_tensor_alloc(&idx, TS_I32, TS_CPU, 1, TS_SHAPE(3)), TS_OK);
    tu_fill_uniform(&r, &inp, -1, 1);
    tu_fill_uniform(&r, &acc, -1, 1);
    tu_fill_uniform(&r, &w, 0, 1);
    int32_t *ix = idx.data;
    ix[0] = 4, ix[1] = 0, ix[2] = 5;
    assert_int_equal(ts_gather_rows(e, &got, &inp, &idx), TS_OK);
    float want[6 * 20];
    for (int i = 0; i < 3; i++)
        memcpy(want + i * 20, tu_f32(&inp) + ix[i] * 20, 20 * sizeof(float));
    tu_check_close(tu_f32(&got), want, 60, 0, 0, "gather_rows");
    memcpy(want, tu_f32(&acc), sizeof want);
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < 20; c++)
            want[ix[i] * 20 + c] += tu_f32(&w)[i] * tu_f32(&got)[i * 20 + c];
    assert_int_equal(ts_scatter_axpy_rows(e, &acc, &got, &idx, &w), TS_OK);
    tu_check_close(tu_f32(&acc), want, 120, 1e-6, 1e-6, "scatter_axpy_rows");
    ix[2] = 4; /* duplicate: a scatter would race on a GPU, so it is refused */
    assert_int_equal(ts_scatter_axpy_rows(e, &acc, &got, &idx, &w), TS_EINVAL);
    tu_check_close(tu_f32(&acc), want, 120, 0, 0, "scatter refused, output untouched");
    ix[2] = 6; /* out of range */
    assert_int_equal(ts_gather_rows(e, &got, &inp, &idx), TS_ERANGE);
    assert_int_equal(ts_scatter_axpy_rows(e, &acc, &got, &idx, &w), TS_ERANGE);
    TU_FREE_TENSORS(&inp, &got, &acc, &w, &idx);
}

/* ---- classification: cross-entropy and the mean over tokens ----------------------------- */

/* −log softmax(z)[y] per row, in double, averaged over the rows. */
static double naive_cross_entropy(const float *z, const int32_t *y, int64_t B, int64_t K) {
    double total = 0.0;
    for (int64_t b = 0; b < B; b++) {
        double mx = z[b * K];
        for (int64_t k = 1; k < K; k++)
            mx = fmax(mx, (double)z[b * K + k]);
        double s = 0.0;
        for (int64_t k = 0; k < K; k++)
            s += exp((double)z[b * K + k] - mx);
        total += log(s) + mx - (double)z[b * K + y[b]];
    }
    return total / (double)B;
}

static void test_cross_entropy_mean_tokens(void **state) {
    ts_engine_t *e = *state;
    /* (B, K, logit range): one class, the 10 labels, few classes with huge logits (stability) */
    static const struct {
        int64_t B, K;
        float range;
    } cases[] = {{1, 1, 1}, {7, 10, 4}, {33, 3, 1000}, {64, 8, 20}};
    tu_rng_t r = {43};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t B = cases[c].B, K = cases[c].K;
        ts_tensor_t z, y, loss;
        tu_alloc_f32(&z, 2, TS_SHAPE(B, K));
        tu_alloc_f32(&loss, 1, TS_SHAPE(1));
        assert_int_equal(ts_tensor_alloc(&y, TS_I32, TS_CPU, 1, TS_SHAPE(B)), TS_OK);
        tu_fill_uniform(&r, &z, -cases[c].range, cases[c].range);
        for (int64_t b = 0; b < B; b++)
            ((int32_t *)y.data)[b] = (int32_t)(tu_rng_next(&r) % (uint64_t)K);
        TU_CHECK_OK(ts_cross_entropy_forward(e, &loss, &z, &y));
        double ref = naive_cross_entropy(tu_f32(&z), y.data, B, K);
        tu_check_scalar(tu_f32(&loss)[0], ref, 1e-5 * fabs(ref) + 2e-6,
                        "cross_entropy B=%lld K=%lld range %g", (long long)B, (long long)K,
                        (double)cases[c].range);
        assert_true(isfinite(tu_f32(&loss)[0]) && tu_f32(&loss)[0] >= 0.0f);
        /* a label out of range is refused before anything is written */
        tu_f32(&loss)[0] = 42.0f;
        ((int32_t *)y.data)[B - 1] = (int32_t)K;
        assert_int_equal(ts_cross_entropy_forward(e, &loss, &z, &y), TS_ERANGE);
        ((int32_t *)y.data)[B - 1] = -1;
        assert_int_equal(ts_cross_entropy_forward(e, &loss, &z, &y), TS_ERANGE);
        assert_true(tu_f32(&loss)[0] == 42.0f);
        TU_FREE_TENSORS(&z, &y, &loss);
    }
    /* a confident right answer costs ~0, a confident wrong one ~the logit gap */
    ts_tensor_t z, y, loss;
    tu_alloc_f32(&z, 2, TS_SHAPE(2, 3));
    tu_alloc_f32(&loss, 1, TS_SHAPE(1));
    assert_int_equal(ts_tensor_alloc(&y, TS_I32, TS_CPU, 1, TS_SHAPE(2)), TS_OK);
    float zv[6] = {50, 0, 0, 0, 50, 0};
    memcpy(z.data, zv, sizeof zv);
    ((int32_t *)y.data)[0] = 0, ((int32_t *)y.data)[1] = 0;
    TU_CHECK_OK(ts_cross_entropy_forward(e, &loss, &z, &y));
    tu_check_scalar(tu_f32(&loss)[0], 25.0, 1e-4, "cross_entropy (right + wrong by 50) / 2");
    TU_FREE_TENSORS(&z, &y, &loss);

    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 49, 16}, {2, 5, 7}, {5, 16, 128}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int64_t B = shapes[c][0], T = shapes[c][1], C = shapes[c][2];
        ts_tensor_t x, out;
        tu_alloc_f32(&x, 3, TS_SHAPE(B, T, C));
        tu_alloc_f32(&out, 2, TS_SHAPE(B, C));
        tu_fill_uniform(&r, &x, -1, 1);
        TU_CHECK_OK(ts_mean_tokens_forward(e, &out, &x));
        float *want = tu_floats(B * C);
        for (int64_t b = 0; b < B; b++)
            for (int64_t ch = 0; ch < C; ch++) {
                double s = 0.0;
                for (int64_t t = 0; t < T; t++)
                    s += tu_f32(&x)[(b * T + t) * C + ch];
                want[b * C + ch] = (float)(s / (double)T);
            }
        tu_check_close(tu_f32(&out), want, B * C, 1e-6, 1e-6, "mean_tokens B=%lld T=%lld C=%lld",
                       (long long)B, (long long)T, (long long)C);
        free(want);
        TU_FREE_TENSORS(&x, &out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_bias_bits),
        cmocka_unit_test(test_linear_batch_invariant),
        cmocka_unit_test(test_linear_slices),
        cmocka_unit_test(test_matmul_2d),
        cmocka_unit_test(test_matmul_batched),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_softmax_bits),
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
        cmocka_unit_test(test_gather_scatter_rows),
        cmocka_unit_test(test_cross_entropy_mean_tokens),
    };
    return cmocka_run_group_tests_name("ops_forward", tests, tu_setup_cpu_engine,
                                       tu_teardown_cpu_engine);
}
