/*
 * test_image_ops.c — the image ops of kernels/ops.h (conv2d, GroupNorm, GroupNorm + SiLU, nearest
 * ×2 upsampling) on a CPU engine, against the naive loops of kernels/ref.c.
 *
 * Sizes are odd on purpose (7×5 images, 1×1 images under a 3×3 kernel, a stride-2 conv on an odd
 * height), the padding includes the downsampler's asymmetric (0, 1, 0, 1), and a scratch of one
 * output row forces the conv to tile. Tolerances are the float rounding the op may do against a
 * reference that sums in double:
 *
 *   conv2d       1e-6·K abs + 1e-5 rel (sgemm over K = Cin·kh·kw products of values in [-1, 1])
 *   GroupNorm    2e-5 abs + 1e-5 rel, also with a mean of 1000 beside a spread of 1
 *   upsample     exact
 *
 * Also: a conv's image is the same bits alone or in a batch; a NaN spreads exactly to the outputs
 * that read it (the reference computes the same NaNs); every bad argument gets its error code.
 *
 * The CUDA backend's image ops (kernels/cuda/cuda_image.cu), with no GPU: their index maps
 * (kernels/math.h) reproduce the CPU's im2col and upsampling element for element, and GroupNorm
 * with the GPU's order of summation (256 threads' strided shares, then the warp and block trees,
 * emulated step by step) gives the CPU op's bits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "kernels/ref.h"
#include "tests/testutil.h"

/* ---- conv2d ---------------------------------------------------------------------------- */

typedef struct {
    int64_t B, Cin, H, W, Cout, k;
    ts_conv2d_t g;
    int bias;
    int tiny_scratch; /* scratch of exactly ts_conv2d_scratch_min floats: one row per tile */
} conv_case_t;

static const conv_case_t conv_cases[] = {
    {2, 3, 7, 5, 4, 3, {1, 1, 1, 1, 1}, 1, 0},   /* odd sizes, "same" padding */
    {1, 4, 9, 8, 5, 3, {2, 0, 1, 0, 1}, 1, 0},   /* the downsampler: pad (0, 1, 0, 1), stride 2 */
    {2, 4, 9, 8, 5, 3, {2, 0, 1, 0, 1}, 1, 1},   /* ... tiled one output row at a time */
    {3, 6, 5, 5, 7, 1, {1, 0, 0, 0, 0}, 1, 0},   /* 1×1: no im2col */
    {1, 2, 1, 1, 3, 3, {1, 1, 1, 1, 1}, 0, 0},   /* a 1×1 image under a 3×3 kernel, no bias */
    {2, 5, 12, 10, 6, 3, {1, 1, 1, 1, 1}, 1, 1}, /* tiled, 12 tiles */
    {1, 3, 6, 7, 2, 2, {2, 0, 0, 0, 0}, 0, 0},   /* 2×2 stride 2, odd width */
    {1, 16, 16, 16, 24, 3, {1, 1, 1, 1, 1}, 1, 0},
};

/* Runs case c on random inputs (nan_at >= 0: that input element is NaN) and checks it against
 * the reference. */
static void run_conv_case(ts_engine_t *e, const conv_case_t *c, uint64_t seed, int64_t nan_at) {
    const ts_conv2d_t *g = &c->g;
    int64_t Ho = ts_conv2d_out_dim(c->H, c->k, g->stride, g->pad_top, g->pad_bottom);
    int64_t Wo = ts_conv2d_out_dim(c->W, c->k, g->stride, g->pad_left, g->pad_right);
    assert_true(Ho >= 1 && Wo >= 1);
    ts_tensor_t inp, w, b, out, scratch;
    tu_alloc_f32(&inp, 4, TS_SHAPE(c->B, c->Cin, c->H, c->W));
    tu_alloc_f32(&w, 4, TS_SHAPE(c->Cout, c->Cin, c->k, c->k));
    tu_alloc_f32(&b, 1, TS_SHAPE(c->Cout));
    tu_alloc_f32(&out, 4, TS_SHAPE(c->B, c->Cout, Ho, Wo));
    tu_rng_t r = {seed};
    tu_fill_uniform(&r, &inp, -1, 1);
    tu_fill_uniform(&r, &w, -1, 1);
    tu_fill_uniform(&r, &b, -1, 1);
    if (nan_at >= 0)
        tu_f32(&inp)[nan_at] = NAN;
    int64_t need = ts_conv2d_scratch_min(&inp, &w, g);
    assert_true(need >= 0);
    int64_t have = c->tiny_scratch ? need : need * Ho + 5;
    tu_alloc_f32(&scratch, 1, TS_SHAPE(have > 0 ? have : 1));
    TU_CHECK_OK(ts_conv2d_forward(e, &out, &inp, &w, c->bias ? &b : NULL, g, &scratch));

    float *want = tu_floats(ts_tensor_numel(&out));
    ts_ref_conv2d(want, tu_f32(&inp), tu_f32(&w), c->bias ? tu_f32(&b) : NULL, c->B, c->Cin, c->H,
                  c->W, c->Cout, c->k, c->k, g->stride, g->pad_top, g->pad_bottom, g->pad_left,
                  g->pad_right);
    int64_t K = c->Cin * c->k * c->k;
    tu_check_close(tu_f32(&out), want, ts_tensor_numel(&out), 1e-6 * (double)K, 1e-5,
                   "conv2d B=%lld Cin=%lld %lldx%lld k=%lld stride %d nan_at %lld", (long long)c->B,
                   (long long)c->Cin, (long long)c->H, (long long)c->W, (long long)c->k, g->stride,
                   (long long)nan_at);
    if (nan_at >= 0) { /* the NaN reached some outputs, and not all of them */
        int64_t nans = 0, n = ts_tensor_numel(&out);
        for (int64_t i = 0; i < n; i++)
            nans += isnan(tu_f32(&out)[i]) != 0;
        assert_true(nans > 0);
        assert_true(nans < n);
    }
    free(want);
    TU_FREE_TENSORS(&inp, &w, &b, &out, &scratch);
}

static void test_conv2d_matches_reference(void **state) {
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
        run_conv_case(*state, &conv_cases[i], 100 + i, -1);
}

static void test_conv2d_nan_spreads_to_its_outputs(void **state) {
    /* the middle pixel of channel 1 of the last image: its 3×3 neighbourhood in every output
     * channel of that image becomes NaN, the rest stays finite (checked against the reference) */
    const conv_case_t *c = &conv_cases[5];
    int64_t at = ((c->B - 1) * c->Cin + 1) * c->H * c->W + (c->H / 2) * c->W + c->W / 2;
    run_conv_case(*state, c, 7, at);
    run_conv_case(*state, &conv_cases[1], 8, 2 * 9 * 8 + 4 * 8 + 3); /* through a stride 2 */
}

/* With bf16 and f16 products (ts_conv2d_t.precision): the reference on the input and weight
 * rounded to that precision (products of two such values are exact in fp32; the bias and the sums
 * stay fp32), within the fp32 bound; and not the unrounded reference, so the rounding happened.
 * A weight given in that precision (the 16-bit path: im2col_lp, gemm_lp_in) gives the same bits
 * as the fp32 weight, and is refused at fp32. bf16 only where this CPU runs it. */
static void test_conv2d_low_precision(void **state) {
    ts_engine_t *e = *state;
    for (int p = 1; p <= 2; p++) {
        ts_precision_t prec = p == 1 ? TS_PREC_BF16 : TS_PREC_F16;
        if (ts_engine_precision_check(e, prec, NULL, 0) != TS_OK) {
            ts_tensor_t i1, w1, o1;
            tu_alloc_f32(&i1, 4, TS_SHAPE(1, 1, 3, 3));
            tu_alloc_f32(&w1, 4, TS_SHAPE(1, 1, 1, 1));
            tu_alloc_f32(&o1, 4, TS_SHAPE(1, 1, 3, 3));
            ts_conv2d_t g = {1, 0, 0, 0, 0, prec};
            assert_int_equal(ts_conv2d_forward(e, &o1, &i1, &w1, NULL, &g, NULL), TS_ENOTSUP);
            TU_FREE_TENSORS(&i1, &w1, &o1);
            continue;
        }
        for (size_t ci = 0; ci < sizeof conv_cases / sizeof conv_cases[0]; ci++) {
            const conv_case_t *c = &conv_cases[ci];
            ts_conv2d_t g = c->g;
            g.precision = prec;
            int64_t Ho = ts_conv2d_out_dim(c->H, c->k, g.stride, g.pad_top, g.pad_bottom);
            int64_t Wo = ts_conv2d_out_dim(c->W, c->k, g.stride, g.pad_left, g.pad_right);
            ts_tensor_t inp, w, b, out, scratch;
            tu_alloc_f32(&inp, 4, TS_SHAPE(c->B, c->Cin, c->H, c->W));
            tu_alloc_f32(&w, 4, TS_SHAPE(c->Cout, c->Cin, c->k, c->k));
            tu_alloc_f32(&b, 1, TS_SHAPE(c->Cout));
            tu_alloc_f32(&out, 4, TS_SHAPE(c->B, c->Cout, Ho, Wo));
            tu_rng_t r = {300 + ci};
            tu_fill_uniform(&r, &inp, -1, 1);
            tu_fill_uniform(&r, &w, -1, 1);
            tu_fill_uniform(&r, &b, -1, 1);
            /* the weight already in 16 bits, as the VAE converts it once */
            ts_tensor_t wlp, out16;
            TU_CHECK_OK(ts_tensor_alloc(&wlp, ts_precision_dtype(prec), TS_CPU, 4,
                                        TS_SHAPE(c->Cout, c->Cin, c->k, c->k)));
            TU_CHECK_OK(ts_convert(e, &wlp, &w));
            tu_alloc_like(&out16, &out);
            int64_t need = ts_conv2d_scratch_min(&inp, &w, &g);
            int64_t need16 = ts_conv2d_scratch_min(&inp, &wlp, &g);
            assert_true(need16 > 0); /* 16-bit operands: even a 1×1 conv writes its col */
            tu_alloc_f32(&scratch, 1, TS_SHAPE((need > need16 ? need : need16) * Ho + 5));
            TU_CHECK_OK(ts_conv2d_forward(e, &out, &inp, &w, c->bias ? &b : NULL, &g, &scratch));
            /* ... gives the bits of the fp32 weight rounded by the product (whole-image tiles) */
            TU_CHECK_OK(
                ts_conv2d_forward(e, &out16, &inp, &wlp, c->bias ? &b : NULL, &g, &scratch));
            if (memcmp(tu_f32(&out16), tu_f32(&out), ts_tensor_nbytes(&out)) != 0)
                fail_msg("conv2d %s case %zu: the 16-bit weight's output differs from the fp32 "
                         "weight's",
                         ts_precision_name(prec), ci);
            ts_conv2d_t g32 = g; /* a 16-bit weight is refused at fp32 */
            g32.precision = TS_PREC_F32;
            assert_int_not_equal(ts_conv2d_forward(e, &out16, &inp, &wlp, NULL, &g32, &scratch),
                                 TS_OK);
            TU_FREE_TENSORS(&wlp, &out16);
            int64_t ni = ts_tensor_numel(&inp), nw = ts_tensor_numel(&w),
                    no = ts_tensor_numel(&out);
            float *ri = tu_floats(ni), *rw = tu_floats(nw), *want = tu_floats(no),
                  *exact = tu_floats(no);
            for (int64_t i = 0; i < ni + nw; i++) {
                float v = i < ni ? tu_f32(&inp)[i] : tu_f32(&w)[i - ni];
                float q = prec == TS_PREC_BF16 ? ts_bf16_to_f32(ts_f32_to_bf16(v))
                                               : ts_f16_to_f32(ts_f32_to_f16(v));
                (i < ni ? ri : rw)[i < ni ? i : i - ni] = q;
            }
            ts_ref_conv2d(want, ri, rw, c->bias ? tu_f32(&b) : NULL, c->B, c->Cin, c->H, c->W,
                          c->Cout, c->k, c->k, g.stride, g.pad_top, g.pad_bottom, g.pad_left,
                          g.pad_right);
            ts_ref_conv2d(exact, tu_f32(&inp), tu_f32(&w), c->bias ? tu_f32(&b) : NULL, c->B,
                          c->Cin, c->H, c->W, c->Cout, c->k, c->k, g.stride, g.pad_top,
                          g.pad_bottom, g.pad_left, g.pad_right);
            int64_t K = c->Cin * c->k * c->k;
            tu_check_close(tu_f32(&out), want, no, 1e-6 * (double)K, 1e-5, "conv2d %s case %zu",
                           ts_precision_name(prec), ci);
            double far = 0.0;
            for (int64_t i = 0; i < no; i++)
                far = fmax(far, fabs((double)tu_f32(&out)[i] - exact[i]));
            assert_true(far > 1e-6); /* the operands were rounded */
            free(ri), free(rw), free(want), free(exact);
            TU_FREE_TENSORS(&inp, &w, &b, &out, &scratch);
        }
    }
}

/* Each image of a batch of 3 gives the same bits as the same image convolved alone. */
static void test_conv2d_batch_invariant(void **state) {
    ts_engine_t *e = *state;
    const ts_conv2d_t g = {1, 1, 1, 1, 1};
    ts_tensor_t inp, w, b, out, one_in, one_out, scratch;
    tu_alloc_f32(&inp, 4, TS_SHAPE(3, 8, 13, 11));
    tu_alloc_f32(&w, 4, TS_SHAPE(16, 8, 3, 3));
    tu_alloc_f32(&b, 1, TS_SHAPE(16));
    tu_alloc_f32(&out, 4, TS_SHAPE(3, 16, 13, 11));
    tu_alloc_f32(&one_out, 4, TS_SHAPE(1, 16, 13, 11));
    tu_alloc_f32(&scratch, 1, TS_SHAPE(8 * 9 * 11 * 4));
    tu_rng_t r = {21};
    tu_fill_uniform(&r, &inp, -1, 1);
    tu_fill_uniform(&r, &w, -1, 1);
    tu_fill_uniform(&r, &b, -1, 1);
    TU_CHECK_OK(ts_conv2d_forward(e, &out, &inp, &w, &b, &g, &scratch));
    for (int64_t i = 0; i < 3; i++) {
        TU_CHECK_OK(ts_tensor_slice(&one_in, &inp, i, 1));
        TU_CHECK_OK(ts_conv2d_forward(e, &one_out, &one_in, &w, &b, &g, &scratch));
        assert_memory_equal(tu_f32(&one_out), tu_f32(&out) + i * 16 * 13 * 11,
                            (size_t)(16 * 13 * 11) * sizeof(float));
    }
    TU_FREE_TENSORS(&inp, &w, &b, &out, &one_out, &scratch);
}

static void test_conv2d_bad_arguments(void **state) {
    ts_engine_t *e = *state;
    const ts_conv2d_t g = {1, 1, 1, 1, 1};
    ts_tensor_t inp, w, b, out, scratch, small, w_cin, b5, out_h, inp3, ids;
    tu_alloc_f32(&inp, 4, TS_SHAPE(2, 3, 6, 5));
    tu_alloc_f32(&w, 4, TS_SHAPE(4, 3, 3, 3));
    tu_alloc_f32(&b, 1, TS_SHAPE(4));
    tu_alloc_f32(&out, 4, TS_SHAPE(2, 4, 6, 5));
    tu_alloc_f32(&scratch, 1, TS_SHAPE(3 * 9 * 5 * 6));
    tu_alloc_f32(&small, 1, TS_SHAPE(3 * 9 * 5 - 1));
    tu_alloc_f32(&w_cin, 4, TS_SHAPE(4, 2, 3, 3));
    tu_alloc_f32(&b5, 1, TS_SHAPE(5));
    tu_alloc_f32(&out_h, 4, TS_SHAPE(2, 4, 5, 5));
    tu_alloc_f32(&inp3, 3, TS_SHAPE(3, 6, 5));
    TU_CHECK_OK(ts_tensor_alloc(&ids, TS_I32, TS_CPU, 4, TS_SHAPE(2, 3, 6, 5)));

    TU_CHECK_OK(ts_conv2d_forward(e, &out, &inp, &w, &b, &g, &scratch));
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp, &w_cin, &b, &g, &scratch), TS_ESHAPE);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp, &w, &b5, &g, &scratch), TS_ESHAPE);
    TU_CHECK_RC(ts_conv2d_forward(e, &out_h, &inp, &w, &b, &g, &scratch), TS_ESHAPE);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp3, &w, &b, &g, &scratch), TS_ESHAPE);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &ids, &w, &b, &g, &scratch), TS_EDTYPE);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp, &w, &b, NULL, &scratch), TS_EINVAL);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp, &w, &b, &(ts_conv2d_t){0, 1, 1, 1, 1}, &scratch),
                TS_EINVAL);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp, &w, &b, &(ts_conv2d_t){1, -1, 1, 1, 1}, &scratch),
                TS_EINVAL);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp, &w, &b, &g, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp, &w, &b, &g, &small), TS_EINVAL);
    TU_CHECK_RC(ts_conv2d_forward(e, &out, &inp, &w, &b, &g, &out), TS_EINVAL); /* aliases out */
    TU_CHECK_RC(ts_conv2d_forward(NULL, &out, &inp, &w, &b, &g, &scratch), TS_EINVAL);
    /* a kernel larger than the padded input: 6×5 under 9×9 without padding */
    ts_tensor_t w9, out1;
    tu_alloc_f32(&w9, 4, TS_SHAPE(4, 3, 9, 9));
    tu_alloc_f32(&out1, 4, TS_SHAPE(2, 4, 1, 1));
    TU_CHECK_RC(ts_conv2d_forward(e, &out1, &inp, &w9, &b, &(ts_conv2d_t){1, 0, 0, 0, 0}, &scratch),
                TS_ESHAPE);
    /* out written over its own input */
    ts_tensor_t sq, w1;
    tu_alloc_f32(&sq, 4, TS_SHAPE(1, 4, 3, 3));
    tu_alloc_f32(&w1, 4, TS_SHAPE(4, 4, 1, 1));
    TU_CHECK_RC(ts_conv2d_forward(e, &sq, &sq, &w1, NULL, &(ts_conv2d_t){1, 0, 0, 0, 0}, NULL),
                TS_EINVAL);

    assert_int_equal(ts_conv2d_out_dim(6, 9, 1, 0, 0), 0);
    assert_int_equal(ts_conv2d_out_dim(9, 3, 2, 0, 1), 4);
    assert_int_equal(ts_conv2d_out_dim(256, 3, 2, 0, 1), 128);
    assert_int_equal(ts_conv2d_out_dim(5, 3, 0, 1, 1), 0);
    assert_int_equal(ts_conv2d_scratch_min(&inp, &w, &g), 3 * 9 * 5);
    assert_int_equal(ts_conv2d_scratch_min(&sq, &w1, &(ts_conv2d_t){1, 0, 0, 0, 0}), 0);
    assert_int_equal(ts_conv2d_scratch_min(&inp3, &w, &g), -1);
    TU_FREE_TENSORS(&inp, &w, &b, &out, &scratch, &small, &w_cin, &b5, &out_h, &inp3, &ids, &w9,
                    &out1, &sq, &w1);
}

/* ---- GroupNorm ------------------------------------------------------------------------- */

/* x (B, C, S) uniform around offset ± 1, y alike (zero), w and b (C): GroupNorm's inputs, seeded. */
static void groupnorm_inputs(ts_tensor_t *x, ts_tensor_t *y, ts_tensor_t *w, ts_tensor_t *b,
                             int64_t B, int64_t C, int64_t S, float offset, uint64_t seed) {
    tu_alloc_f32(x, 3, TS_SHAPE(B, C, S));
    tu_alloc_f32(y, 3, TS_SHAPE(B, C, S));
    tu_alloc_f32(w, 1, TS_SHAPE(C));
    tu_alloc_f32(b, 1, TS_SHAPE(C));
    tu_rng_t r = {seed};
    tu_fill_uniform(&r, x, offset - 1, offset + 1);
    tu_fill_uniform(&r, w, -2, 2);
    tu_fill_uniform(&r, b, -1, 1);
}

static void check_groupnorm(ts_engine_t *e, int64_t B, int64_t C, int64_t S, int G, int affine,
                            int silu, float offset, int in_place, uint64_t seed) {
    ts_tensor_t x, y, w, b;
    groupnorm_inputs(&x, &y, &w, &b, B, C, S, offset, seed);
    float *want = tu_floats(B * C * S);
    ts_ref_groupnorm(want, tu_f32(&x), affine ? tu_f32(&w) : NULL, affine ? tu_f32(&b) : NULL, B, C,
                     S, G, 1e-6, silu);
    ts_tensor_t *out = in_place ? &x : &y;
    int (*op)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *, const ts_tensor_t *,
              const ts_tensor_t *, int, float) =
        silu ? ts_groupnorm_silu_forward : ts_groupnorm_forward;
    TU_CHECK_OK(op(e, out, &x, affine ? &w : NULL, affine ? &b : NULL, G, 1e-6f));
    tu_check_close(tu_f32(out), want, B * C * S, 2e-5, 1e-5,
                   "groupnorm B=%lld C=%lld S=%lld G=%d affine %d silu %d offset %g in place %d",
                   (long long)B, (long long)C, (long long)S, G, affine, silu, (double)offset,
                   in_place);
    free(want);
    TU_FREE_TENSORS(&x, &y, &w, &b);
}

static void test_groupnorm_matches_reference(void **state) {
    ts_engine_t *e = *state;
    check_groupnorm(e, 2, 8, 49, 4, 1, 0, 0, 0, 1);
    check_groupnorm(e, 1, 6, 1, 3, 1, 0, 0, 0, 2);         /* two values a group */
    check_groupnorm(e, 3, 32, 17, 32, 1, 0, 0, 0, 3);      /* one channel a group */
    check_groupnorm(e, 1, 4, 5, 1, 0, 0, 0, 0, 4);         /* one group, no affine */
    check_groupnorm(e, 2, 64, 64, 32, 1, 1, 0, 0, 5);      /* + SiLU */
    check_groupnorm(e, 2, 16, 33, 8, 1, 1, 0, 1, 6);       /* + SiLU, in place */
    check_groupnorm(e, 1, 8, 100, 2, 1, 0, 1000.0f, 0, 7); /* mean 1000, spread 1 */
}

static void test_groupnorm_nan_stays_in_its_group(void **state) {
    ts_engine_t *e = *state;
    ts_tensor_t x, y;
    tu_alloc_f32(&x, 4, TS_SHAPE(2, 8, 3, 3));
    tu_alloc_f32(&y, 4, TS_SHAPE(2, 8, 3, 3));
    tu_rng_t r = {9};
    tu_fill_uniform(&r, &x, -1, 1);
    tu_f32(&x)[(1 * 8 + 5) * 9 + 4] = NAN; /* sample 1, channel 5: group 2 of 4 */
    TU_CHECK_OK(ts_groupnorm_forward(e, &y, &x, NULL, NULL, 4, 1e-6f));
    for (int64_t i = 0; i < 2 * 8 * 9; i++) {
        int64_t s = i / 72, g = i % 72 / 18;
        if (s == 1 && g == 2)
            assert_true(isnan(tu_f32(&y)[i]));
        else
            assert_true(isfinite(tu_f32(&y)[i]));
    }
    TU_FREE_TENSORS(&x, &y);
}

static void test_groupnorm_bad_arguments(void **state) {
    ts_engine_t *e = *state;
    ts_tensor_t x, y, w, b, w3, y2, v;
    tu_alloc_f32(&x, 4, TS_SHAPE(2, 6, 4, 4));
    tu_alloc_f32(&y, 4, TS_SHAPE(2, 6, 4, 4));
    tu_alloc_f32(&w, 1, TS_SHAPE(6));
    tu_alloc_f32(&b, 1, TS_SHAPE(6));
    tu_alloc_f32(&w3, 1, TS_SHAPE(3));
    tu_alloc_f32(&y2, 4, TS_SHAPE(2, 6, 4, 3));
    tu_alloc_f32(&v, 1, TS_SHAPE(6));
    TU_CHECK_OK(ts_groupnorm_forward(e, &y, &x, &w, &b, 3, 1e-6f));
    TU_CHECK_RC(ts_groupnorm_forward(e, &y, &x, &w, &b, 4, 1e-6f), TS_ESHAPE);
    TU_CHECK_RC(ts_groupnorm_forward(e, &y, &x, &w, &b, 0, 1e-6f), TS_EINVAL);
    TU_CHECK_RC(ts_groupnorm_forward(e, &y, &x, &w, &b, 3, -1.0f), TS_EINVAL);
    TU_CHECK_RC(ts_groupnorm_forward(e, &y, &x, &w, &b, 3, NAN), TS_EINVAL);
    TU_CHECK_RC(ts_groupnorm_forward(e, &y, &x, &w, NULL, 3, 1e-6f), TS_EINVAL);
    TU_CHECK_RC(ts_groupnorm_forward(e, &y, &x, &w3, &b, 3, 1e-6f), TS_ESHAPE);
    TU_CHECK_RC(ts_groupnorm_silu_forward(e, &y2, &x, &w, &b, 3, 1e-6f), TS_ESHAPE);
    TU_CHECK_RC(ts_groupnorm_forward(e, &v, &v, NULL, NULL, 1, 1e-6f), TS_ESHAPE); /* 1-D */
    TU_FREE_TENSORS(&x, &y, &w, &b, &w3, &y2, &v);
}

/* ---- upsampling ------------------------------------------------------------------------ */

static void test_upsample_nearest2x(void **state) {
    ts_engine_t *e = *state;
    ts_tensor_t x, y, bad;
    tu_alloc_f32(&x, 4, TS_SHAPE(2, 3, 3, 5));
    tu_alloc_f32(&y, 4, TS_SHAPE(2, 3, 6, 10));
    tu_alloc_f32(&bad, 4, TS_SHAPE(2, 3, 6, 9));
    tu_rng_t r = {11};
    tu_fill_uniform(&r, &x, -1, 1);
    tu_f32(&x)[7] = NAN;
    TU_CHECK_OK(ts_upsample_nearest2x_forward(e, &y, &x));
    float *want = tu_floats(2 * 3 * 6 * 10);
    ts_ref_upsample2x(want, tu_f32(&x), 6, 3, 5);
    tu_check_close(tu_f32(&y), want, 2 * 3 * 6 * 10, 0, 0, "upsample 3x5");
    assert_true(isnan(tu_f32(&y)[2 * 10 + 4])); /* x[0,0,1,2] → rows 2-3, columns 4-5 */
    assert_true(isnan(tu_f32(&y)[3 * 10 + 5]));
    TU_CHECK_RC(ts_upsample_nearest2x_forward(e, &bad, &x), TS_ESHAPE);
    TU_CHECK_RC(ts_upsample_nearest2x_forward(e, &x, &y), TS_ESHAPE);
    free(want);
    TU_FREE_TENSORS(&x, &y, &bad);
}

/* ---- the CUDA backend's arithmetic, on the CPU --------------------------------------------- */

/* Float bits, so that NaN compares equal to itself. */
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void check_im2col_map(ts_engine_t *e, int64_t C, int64_t H, int64_t W, int64_t kh,
                             int64_t kw, int64_t stride, int64_t pt, int64_t pb, int64_t pl,
                             int64_t pr, int64_t oy0, int64_t rows) {
    const int64_t Wo = ts_conv2d_out_dim(W, kw, (int)stride, (int)pl, (int)pr);
    const int64_t n = C * kh * kw * rows * Wo;
    ts_tensor_t img;
    tu_alloc_f32(&img, 3, TS_SHAPE(C, H, W));
    tu_rng_t r = {(uint64_t)(C * 131 + H * 17 + W + stride)};
    tu_fill_uniform(&r, &img, -1, 1);
    tu_f32(&img)[H * W / 2] = NAN;
    float *col = tu_floats(n);
    TU_CHECK_OK(
        ts_cpu_im2col(e, col, tu_f32(&img), C, H, W, kh, kw, stride, pt, pl, Wo, oy0, rows));
    for (int64_t i = 0; i < n; i++) { /* k_im2col's element i */
        int64_t ox = i % Wo, t = i / Wo % rows, row = i / (Wo * rows);
        int64_t src = ts_im2col_src(row, t, ox, H, W, kh, kw, stride, pt, pl, oy0);
        float want = src < 0 ? 0.0f : tu_f32(&img)[src];
        if (bits(col[i]) != bits(want))
            fail_msg("im2col %lldx%lldx%lld k %lldx%lld s %lld: col[%lld] = %g, the map says %g",
                     (long long)C, (long long)H, (long long)W, (long long)kh, (long long)kw,
                     (long long)stride, (long long)i, (double)col[i], (double)want);
    }
    free(col);
    TU_FREE_TENSORS(&img);
}

static void test_cuda_index_maps(void **state) {
    ts_engine_t *e = *state;
    check_im2col_map(e, 3, 7, 5, 3, 3, 1, 1, 1, 1, 1, 0, 7); /* SAME, whole image */
    check_im2col_map(e, 2, 9, 6, 3, 3, 2, 0, 1, 0, 1, 1, 2); /* the downsampler, a tile */
    check_im2col_map(e, 4, 1, 1, 3, 3, 1, 1, 1, 1, 1, 0, 1); /* 1×1 image under 3×3 */
    check_im2col_map(e, 5, 4, 4, 1, 1, 1, 0, 0, 0, 0, 0, 4); /* 1×1 kernel */
    ts_tensor_t x, y;
    tu_alloc_f32(&x, 4, TS_SHAPE(2, 3, 3, 5));
    tu_alloc_f32(&y, 4, TS_SHAPE(2, 3, 6, 10));
    tu_rng_t r = {12};
    tu_fill_uniform(&r, &x, -1, 1);
    TU_CHECK_OK(ts_upsample_nearest2x_forward(e, &y, &x));
    for (int64_t o = 0; o < 2 * 3 * 6 * 10; o++) /* k_upsample2x's element o */
        assert_int_equal(bits(tu_f32(&y)[o]), bits(tu_f32(&x)[ts_upsample2x_src(o, 3, 5)]));
    /* k_channel_bias's element i: the CPU's channel bias, bit for bit, through the same map */
    float bias[3] = {0.5f, -1.25f, 3.0f}, *xb = tu_floats(2 * 3 * 15);
    memcpy(xb, tu_f32(&x), 2 * 3 * 15 * sizeof *xb);
    TU_CHECK_OK(ts_cpu_add_channel_bias(e, xb, bias, 2, 3, 15));
    for (int64_t i = 0; i < 2 * 3 * 15; i++)
        assert_int_equal(bits(xb[i]), bits(tu_f32(&x)[i] + bias[ts_channel_of(i, 3, 15)]));
    free(xb);
    TU_FREE_TENSORS(&x, &y);
}

/* block_sum of k_groupnorm (IMG_THREADS = 256): each warp's butterfly (xor 16, 8, 4, 2, 1), its
 * lane 0 into sh, then one butterfly over sh (lanes past the 8 warps add 0). */
static double gpu_block_sum(const double *part) {
    double sh[8], v[32];
    for (int w = 0; w < 8; w++) {
        memcpy(v, part + 32 * w, sizeof v);
        for (int off = 16; off > 0; off >>= 1) {
            double nv[32];
            for (int l = 0; l < 32; l++)
                nv[l] = v[l] + v[l ^ off];
            memcpy(v, nv, sizeof v);
        }
        sh[w] = v[0];
    }
    for (int l = 0; l < 32; l++)
        v[l] = l < 8 ? sh[l] : 0.0;
    for (int off = 16; off > 0; off >>= 1) {
        double nv[32];
        for (int l = 0; l < 32; l++)
            nv[l] = v[l] + v[l ^ off];
        memcpy(v, nv, sizeof v);
    }
    return v[0];
}

/* One block's share of a chunk [lo, hi) of x (IMG_THREADS = 256 threads, each a strided share
 * from lo), then block_sum: f(x[i]) summed as the kernel sums it. */
static double gpu_chunk_sum(const float *x, int64_t lo, int64_t hi, double mean, int squares) {
    double part[256] = {0};
    for (int t = 0; t < 256; t++)
        for (int64_t i = lo + t; i < hi; i += 256) {
            double d = (double)x[i] - mean;
            part[t] += squares ? d * d : (double)x[i];
        }
    return gpu_block_sum(part);
}

/* The CUDA engine's GroupNorm on one group of n values (cg channels of S, from channel c0),
 * emulated: with splits 1 k_groupnorm (one block: the sums, the squared deviations, the
 * elements); else k_groupnorm_chunk_sums<0> and <1> and k_groupnorm_split_apply, block k on
 * chunk k (the partials gathered in chunk order). y is written only where a block writes. */
static void gpu_groupnorm_group(float *y, const float *x, const float *w, const float *b,
                                int64_t c0, int64_t cg, int64_t S, float eps, int silu,
                                int64_t splits) {
    const int64_t n = cg * S;
    double *sums = calloc((size_t)splits, sizeof *sums),
           *devs = calloc((size_t)splits, sizeof *devs);
    assert_non_null(sums);
    assert_non_null(devs);
    int64_t lo, hi;
    for (int64_t k = 0; k < splits; k++) {
        ts_groupnorm_chunk(n, splits, k, &lo, &hi);
        sums[k] = gpu_chunk_sum(x, lo, hi, 0.0, 0);
    }
    const double mean = ts_groupnorm_gather(sums, splits) / (double)n;
    for (int64_t k = 0; k < splits; k++) {
        ts_groupnorm_chunk(n, splits, k, &lo, &hi);
        devs[k] = gpu_chunk_sum(x, lo, hi, mean, 1);
    }
    const double rstd = ts_groupnorm_rstd(ts_groupnorm_gather(devs, splits), n, eps);
    for (int64_t k = 0; k < splits; k++) {
        ts_groupnorm_chunk(n, splits, k, &lo, &hi);
        for (int t = 0; t < 256; t++) /* each thread's elements */
            ts_groupnorm_apply(y, x, w, b, c0, cg, S, lo, hi, mean, rstd, silu, t, 256);
    }
    free(sums), free(devs);
}

/* The GPU's GroupNorm, emulated, against the CPU's, bit for bit; with the splits the CUDA engine
 * picks (ts_groupnorm_splits), and over one block a group too when it would split. */
static void check_gpu_groupnorm(ts_engine_t *e, int64_t B, int64_t C, int64_t S, int G, int silu,
                                float offset, uint64_t seed) {
    ts_tensor_t x, y, w, b;
    groupnorm_inputs(&x, &y, &w, &b, B, C, S, offset, seed);
    int (*op)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *, const ts_tensor_t *,
              const ts_tensor_t *, int, float) =
        silu ? ts_groupnorm_silu_forward : ts_groupnorm_forward;
    TU_CHECK_OK(op(e, &y, &x, &w, &b, G, 1e-6f));
    const int64_t cg = C / G, n = cg * S;
    const int64_t splits = ts_groupnorm_splits(n, B * G, TS_GN_MAX_PARTIALS);
    assert_true(splits >= 1 && B * G * splits <= (splits > 1 ? TS_GN_MAX_PARTIALS : B * G));
    float *gpu = tu_floats(B * C * S);
    for (int pass = 0; pass < (splits > 1 ? 2 : 1); pass++) {
        for (int64_t i = 0; i < B * C * S; i++)
            gpu[i] = NAN; /* an element no block writes stays NaN */
        for (int64_t q = 0; q < B * G; q++)
            gpu_groupnorm_group(gpu + q * n, tu_f32(&x) + q * n, tu_f32(&w), tu_f32(&b), q % G * cg,
                                cg, S, 1e-6f, silu, pass ? 1 : splits);
        for (int64_t i = 0; i < B * C * S; i++)
            if (bits(gpu[i]) != bits(tu_f32(&y)[i]))
                fail_msg("groupnorm B=%lld C=%lld S=%lld G=%d offset %g, %lld blocks a group: the "
                         "GPU's order gives %.9g at %lld, the CPU %.9g",
                         (long long)B, (long long)C, (long long)S, G, (double)offset,
                         (long long)(pass ? 1 : splits), (double)gpu[i], (long long)i,
                         (double)tu_f32(&y)[i]);
    }
    free(gpu);
    TU_FREE_TENSORS(&x, &y, &w, &b);
}

/* ts_groupnorm_splits: ⌈n / TS_GN_CHUNK⌉ blocks a group, the partials within the cap. */
static void test_groupnorm_splits(void **state) {
    (void)state;
    assert_int_equal(ts_groupnorm_splits(4096, 32, 1024), 1);
    assert_int_equal(ts_groupnorm_splits(4097, 32, 1024), 2);
    assert_int_equal(ts_groupnorm_splits(4 * 65536, 32, 1024), 32);  /* the decoder at 256² */
    assert_int_equal(ts_groupnorm_splits(4 * 65536, 2048, 1024), 1); /* more groups than room */
    assert_int_equal(ts_groupnorm_splits(0, 0, 1024), 1);
    for (int64_t n = 1; n < 40; n++)
        for (int64_t s = 1; s <= n + 2; s++) { /* the chunks tile 0..n in order */
            int64_t lo, hi, end = 0;
            for (int64_t k = 0; k < s; k++) {
                ts_groupnorm_chunk(n, s, k, &lo, &hi);
                assert_int_equal(lo, end);
                assert_true(hi >= lo);
                end = hi;
            }
            assert_int_equal(end, n);
        }
}

static void test_cuda_groupnorm_order(void **state) {
    ts_engine_t *e = *state;
    check_gpu_groupnorm(e, 2, 64, 64, 32, 1, 0, 21);    /* 128 values a group, + SiLU */
    check_gpu_groupnorm(e, 1, 128, 1024, 32, 0, 0, 22); /* 4096 a group: every thread sums 16 */
    check_gpu_groupnorm(e, 1, 8, 1000, 2, 0, 1000, 23); /* mean 1000, spread 1 */
    check_gpu_groupnorm(e, 3, 32, 17, 32, 1, 0, 24);    /* one channel a group, odd S */
    check_gpu_groupnorm(e, 1, 128, 4097, 32, 0, 0, 25); /* split: 5 blocks a group, 4 channels */
    check_gpu_groupnorm(e, 2, 96, 2501, 32, 1, 0, 26);  /* split: chunks end inside a channel */
    check_gpu_groupnorm(e, 1, 8, 5000, 2, 0, 1000, 27); /* split, mean 1000 */
    check_gpu_groupnorm(e, 1, 128, 16384, 32, 1, 0, 28); /* 128 channels at 128²: 16 a group */
    check_gpu_groupnorm(e, 1, 32, 5000, 32, 0, 0, 29);   /* split, one channel a group */
    check_gpu_groupnorm(e, 1, 8192, 1, 1, 1, 0, 30);     /* split, one value a channel */
    check_gpu_groupnorm(e, 2, 4096, 3, 2, 0, 0, 31);     /* split, channels shorter than a block */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_matches_reference),
        cmocka_unit_test(test_conv2d_nan_spreads_to_its_outputs),
        cmocka_unit_test(test_conv2d_batch_invariant),
        cmocka_unit_test(test_conv2d_low_precision),
        cmocka_unit_test(test_conv2d_bad_arguments),
        cmocka_unit_test(test_groupnorm_matches_reference),
        cmocka_unit_test(test_groupnorm_nan_stays_in_its_group),
        cmocka_unit_test(test_groupnorm_bad_arguments),
        cmocka_unit_test(test_upsample_nearest2x),
        cmocka_unit_test(test_cuda_index_maps),
        cmocka_unit_test(test_cuda_groupnorm_order),
        cmocka_unit_test(test_groupnorm_splits),
    };
    return cmocka_run_group_tests(tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
