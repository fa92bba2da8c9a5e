/*
 * test_api_errors.c — bad input gets an error code, never an abort, and writes nothing.
 *
 * Covers NULL engines and tensors (TS_EINVAL), shapes that do not agree (TS_ESHAPE), dtypes an
 * op does not take (TS_EDTYPE), tensors on another device than the engine (TS_EDEVICE), values
 * out of range (embedding ids, absurd sizes: TS_ERANGE), a CUDA engine on a machine without a GPU
 * (TS_ENODEV), and ts_strerror for every code. Where ops.h does not say which code a bad scalar
 * argument gets (heads = 0, a chunk index past M, p = 0), any of EINVAL / ESHAPE / ERANGE is
 * accepted; everything else must be the exact code. Outputs are prefilled with a sentinel and
 * checked unchanged after a refused call.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/ops.h"
#include "tests/testutil.h"

/* For a bad scalar argument whose code ops.h leaves open. */
#define CHECK_BAD_ARG(expr)                                                                        \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != TS_EINVAL && rc_ != TS_ESHAPE && rc_ != TS_ERANGE) {                            \
            print_error("%s:%d: %s returned %d (%s), expected EINVAL, ESHAPE or ERANGE\n",         \
                        __FILE__, __LINE__, #expr, rc_, ts_strerror(rc_));                         \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

static const float SENTINEL = 7.25f;

typedef struct {
    ts_engine_t e;
    ts_tensor_t pool[32];
    int n;
} fixture_t;

static int setup(void **state) {
    fixture_t *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    if (tu_engine_init_cpu(&f->e) != TS_OK) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture_t *f = *state;
    for (int i = 0; i < f->n; i++)
        ts_tensor_free(&f->pool[i]);
    ts_engine_free(&f->e);
    free(f);
    return 0;
}

/* A CPU tensor owned by the fixture, filled with SENTINEL (F32) or zero. */
static ts_tensor_t *T(fixture_t *f, ts_dtype_t dt, int ndim, const int64_t *shape) {
    assert_true(f->n < 32);
    ts_tensor_t *t = &f->pool[f->n++];
    TU_CHECK_OK(ts_tensor_alloc(t, dt, TS_CPU, ndim, shape));
    if (dt == TS_F32)
        for (int64_t i = 0; i < ts_tensor_numel(t); i++)
            ((float *)t->data)[i] = SENTINEL;
    return t;
}

static void assert_untouched(const char *what, const ts_tensor_t *t) {
    for (int64_t i = 0; i < ts_tensor_numel(t); i++)
        if (((const float *)t->data)[i] != SENTINEL) {
            print_error("%s: a refused call wrote element %lld (%g)\n", what, (long long)i,
                        ((const float *)t->data)[i]);
            fail();
        }
}

/* ---- NULL ------------------------------------------------------------------------------ */

static void test_null_engine_and_tensors(void **state) {
    fixture_t *f = *state;
    ts_engine_t *e = &f->e;
    ts_tensor_t *x = T(f, TS_F32, 2, TS_SHAPE(4, 6));
    ts_tensor_t *y = T(f, TS_F32, 2, TS_SHAPE(4, 6));
    ts_tensor_t *w = T(f, TS_F32, 2, TS_SHAPE(3, 6));
    ts_tensor_t *o = T(f, TS_F32, 2, TS_SHAPE(4, 3));
    ts_tensor_t *s = T(f, TS_F32, 1, TS_SHAPE(1));
    ts_tensor_t empty;
    memset(&empty, 0, sizeof empty); /* no data, no dims */
    float v;

    TU_CHECK_RC(ts_gelu_forward(NULL, y, x), TS_EINVAL);
    TU_CHECK_RC(ts_linear_forward(NULL, o, x, w, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_fill(NULL, x, 1.0f), TS_EINVAL);
    TU_CHECK_RC(ts_rng_normal(NULL, x, 1, 0), TS_EINVAL);

    TU_CHECK_RC(ts_gelu_forward(e, NULL, x), TS_EINVAL);
    TU_CHECK_RC(ts_gelu_forward(e, y, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_gelu_forward(e, y, &empty), TS_EINVAL);
    TU_CHECK_RC(ts_silu_backward(e, y, NULL, x), TS_EINVAL);
    TU_CHECK_RC(ts_linear_forward(e, o, NULL, w, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_linear_forward(e, o, x, NULL, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_linear_forward(e, NULL, x, w, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_linear_backward(e, y, NULL, NULL, NULL, x, w), TS_EINVAL);
    TU_CHECK_RC(ts_matmul(e, o, x, 0, NULL, 1, 1.0f, 0.0f), TS_EINVAL);
    TU_CHECK_RC(ts_add(e, y, x, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_axpy(e, NULL, 1.0f, x), TS_EINVAL);
    TU_CHECK_RC(ts_scale(e, NULL, 2.0f), TS_EINVAL);
    TU_CHECK_RC(ts_fill(e, &empty, 1.0f), TS_EINVAL);
    TU_CHECK_RC(ts_zero(e, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_softmax_forward(e, y, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_layernorm_forward(e, NULL, NULL, NULL, x), TS_EINVAL);
    TU_CHECK_RC(ts_layernorm_backward(e, y, x, x, NULL, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_attention_forward(e, NULL, NULL, x, 1), TS_EINVAL);
    TU_CHECK_RC(ts_modulate_forward(e, y, x, NULL, 0, 1), TS_EINVAL);
    TU_CHECK_RC(ts_gate_residual_forward(e, y, x, x, NULL, 0), TS_EINVAL);
    TU_CHECK_RC(ts_timestep_embedding_forward(e, o, NULL, 1000.0f), TS_EINVAL);
    TU_CHECK_RC(ts_pos_embed_2d(e, NULL, 2), TS_EINVAL);
    TU_CHECK_RC(ts_embedding_forward(e, o, w, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_patchify_forward(e, NULL, x, 2), TS_EINVAL);
    TU_CHECK_RC(ts_sum_forward(e, NULL, x), TS_EINVAL);
    TU_CHECK_RC(ts_mse_forward(e, s, x, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_adamw_step(e, x, y, x, y, NULL, 1, 1.0f), TS_EINVAL);
    TU_CHECK_RC(ts_ema_update(e, NULL, x, 0.9f), TS_EINVAL);
    TU_CHECK_RC(ts_convert(e, NULL, x), TS_EINVAL);
    TU_CHECK_RC(ts_check_finite(e, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_rng_uniform(e, NULL, 1, 0), TS_EINVAL);
    TU_CHECK_RC(ts_tensor_item(e, s, NULL), TS_EINVAL);
    TU_CHECK_RC(ts_tensor_item(e, NULL, &v), TS_EINVAL);
    assert_untouched("NULL arguments (y)", y);
    assert_untouched("NULL arguments (o)", o);
}

/* The last tensor argument of a backward (and AdamW's moments) is as required as the others.
 * One test each, kept after the rest, so that a crash in one still lets every other check run
 * and report (in the plain build cmocka catches the signal; under ASan the first one ends). */
#define NULL_LAST_ARG_TEST(name, call)                                                             \
    static void name(void **state) {                                                               \
        fixture_t *f = *state;                                                                     \
        ts_engine_t *e = &f->e;                                                                    \
        ts_tensor_t *x = T(f, TS_F32, 1, TS_SHAPE(6));                                             \
        ts_tensor_t *d = T(f, TS_F32, 1, TS_SHAPE(6));                                             \
        ts_adamw_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f};                                        \
        (void)hp;                                                                                  \
        TU_CHECK_RC(call, TS_EINVAL);                                                              \
        assert_untouched(#call, d);                                                                \
    }
NULL_LAST_ARG_TEST(test_null_gelu_backward_inp, ts_gelu_backward(e, d, x, NULL))
NULL_LAST_ARG_TEST(test_null_silu_backward_inp, ts_silu_backward(e, d, x, NULL))
NULL_LAST_ARG_TEST(test_null_softmax_backward_out, ts_softmax_backward(e, d, x, NULL))
NULL_LAST_ARG_TEST(test_null_mse_backward_target, ts_mse_backward(e, d, 1.0f, x, NULL))
NULL_LAST_ARG_TEST(test_null_adamw_m, ts_adamw_step(e, d, x, NULL, x, &hp, 1, 1.0f))
NULL_LAST_ARG_TEST(test_null_adamw_v, ts_adamw_step(e, d, x, x, NULL, &hp, 1, 1.0f))

/* ---- shapes ---------------------------------------------------------------------------- */

static void test_shape_mismatches(void **state) {
    fixture_t *f = *state;
    ts_engine_t *e = &f->e;
    ts_tensor_t *inp = T(f, TS_F32, 2, TS_SHAPE(4, 5));
    ts_tensor_t *w = T(f, TS_F32, 2, TS_SHAPE(3, 6)); /* K = 6, inp has K = 5 */
    ts_tensor_t *w5 = T(f, TS_F32, 2, TS_SHAPE(3, 5));
    ts_tensor_t *out = T(f, TS_F32, 2, TS_SHAPE(4, 3));
    ts_tensor_t *out_bad = T(f, TS_F32, 2, TS_SHAPE(4, 2));
    ts_tensor_t *bias_bad = T(f, TS_F32, 1, TS_SHAPE(4));

    /* linear: wrong K, wrong N in out, wrong bias length */
    TU_CHECK_RC(ts_linear_forward(e, out, inp, w, NULL), TS_ESHAPE);
    TU_CHECK_RC(ts_linear_forward(e, out_bad, inp, w5, NULL), TS_ESHAPE);
    TU_CHECK_RC(ts_linear_forward(e, out, inp, w5, bias_bad), TS_ESHAPE);
    TU_CHECK_RC(ts_linear_backward(e, inp, w, NULL, out, inp, w), TS_ESHAPE);
    assert_untouched("linear with wrong K", out);
    assert_untouched("linear with wrong N", out_bad);

    /* matmul: inner dimensions, and the output shape */
    ts_tensor_t *a = T(f, TS_F32, 2, TS_SHAPE(4, 5));
    ts_tensor_t *b = T(f, TS_F32, 2, TS_SHAPE(6, 3));
    ts_tensor_t *c = T(f, TS_F32, 2, TS_SHAPE(4, 3));
    TU_CHECK_RC(ts_matmul(e, c, a, 0, b, 0, 1.0f, 0.0f), TS_ESHAPE);  /* 5 vs 6 */
    TU_CHECK_RC(ts_matmul(e, c, a, 1, b, 0, 1.0f, 0.0f), TS_ESHAPE);  /* aᵀ is (5, 4) */
    TU_CHECK_RC(ts_matmul(e, a, a, 0, w5, 1, 1.0f, 0.0f), TS_ESHAPE); /* c should be (4, 3) */
    ts_tensor_t *a3 = T(f, TS_F32, 3, TS_SHAPE(2, 4, 5));
    ts_tensor_t *b3 = T(f, TS_F32, 3, TS_SHAPE(3, 5, 3));
    ts_tensor_t *c3 = T(f, TS_F32, 3, TS_SHAPE(2, 4, 3));
    TU_CHECK_RC(ts_matmul(e, c3, a3, 0, b3, 0, 1.0f, 0.0f), TS_ESHAPE); /* batch 2 vs 3 */
    assert_untouched("matmul with wrong inner dimension", c);
    assert_untouched("batched matmul with wrong batch", c3);

    /* attention: C = 6 not divisible by 4 heads; last axis not 3C; heads = 0 */
    ts_tensor_t *qkv = T(f, TS_F32, 3, TS_SHAPE(1, 4, 18));
    ts_tensor_t *aout = T(f, TS_F32, 3, TS_SHAPE(1, 4, 6));
    ts_tensor_t *att4 = T(f, TS_F32, 4, TS_SHAPE(1, 4, 4, 4));
    ts_tensor_t *att2 = T(f, TS_F32, 4, TS_SHAPE(1, 2, 4, 4));
    CHECK_BAD_ARG(ts_attention_forward(e, aout, att4, qkv, 4));
    CHECK_BAD_ARG(ts_attention_forward(e, aout, att2, qkv, 0));
    CHECK_BAD_ARG(ts_attention_forward(e, aout, att2, qkv, -2));
    TU_CHECK_RC(ts_attention_forward(e, aout, att2, aout, 2), TS_ESHAPE); /* 6 is not 3·6 */
    TU_CHECK_RC(ts_attention_forward(e, aout, att4, qkv, 2), TS_ESHAPE);  /* att has 4 heads */
    assert_untouched("attention with C % heads != 0", aout);
    assert_untouched("attention (att)", att4);

    /* modulate / gate: mod not a multiple of C, chunk index past M */
    ts_tensor_t *x = T(f, TS_F32, 3, TS_SHAPE(2, 3, 4));
    ts_tensor_t *mout = T(f, TS_F32, 3, TS_SHAPE(2, 3, 4));
    ts_tensor_t *mod10 = T(f, TS_F32, 2, TS_SHAPE(2, 10));
    ts_tensor_t *mod8 = T(f, TS_F32, 2, TS_SHAPE(2, 8));
    ts_tensor_t *mod_b3 = T(f, TS_F32, 2, TS_SHAPE(3, 8));
    TU_CHECK_RC(ts_modulate_forward(e, mout, x, mod10, 0, 1), TS_ESHAPE);
    TU_CHECK_RC(ts_modulate_forward(e, mout, x, mod_b3, 0, 1), TS_ESHAPE); /* batch 3 vs 2 */
    CHECK_BAD_ARG(ts_modulate_forward(e, mout, x, mod8, 0, 2));
    CHECK_BAD_ARG(ts_modulate_forward(e, mout, x, mod8, -1, 1));
    TU_CHECK_RC(ts_gate_residual_forward(e, mout, x, x, mod10, 0), TS_ESHAPE);
    CHECK_BAD_ARG(ts_gate_residual_forward(e, mout, x, x, mod8, 2));
    assert_untouched("modulate with bad mod", mout);

    /* patchify: H not a multiple of p; p = 0; wrong token shape */
    ts_tensor_t *img = T(f, TS_F32, 4, TS_SHAPE(1, 1, 5, 4));
    ts_tensor_t *tok = T(f, TS_F32, 3, TS_SHAPE(1, 4, 4));
    ts_tensor_t *img44 = T(f, TS_F32, 4, TS_SHAPE(1, 1, 4, 4));
    ts_tensor_t *tok_bad = T(f, TS_F32, 3, TS_SHAPE(1, 3, 4));
    CHECK_BAD_ARG(ts_patchify_forward(e, tok, img, 2));
    CHECK_BAD_ARG(ts_patchify_forward(e, tok, img44, 0));
    TU_CHECK_RC(ts_patchify_forward(e, tok_bad, img44, 2), TS_ESHAPE);
    CHECK_BAD_ARG(ts_unpatchify_forward(e, img, tok, 2));
    assert_untouched("patchify with H % p != 0", tok);
    assert_untouched("unpatchify with H % p != 0", img);

    /* elementwise and reductions */
    ts_tensor_t *v5 = T(f, TS_F32, 1, TS_SHAPE(5));
    ts_tensor_t *v6 = T(f, TS_F32, 1, TS_SHAPE(6));
    ts_tensor_t *two = T(f, TS_F32, 1, TS_SHAPE(2));
    TU_CHECK_RC(ts_add(e, v5, v5, v6), TS_ESHAPE);
    TU_CHECK_RC(ts_axpy(e, v5, 1.0f, v6), TS_ESHAPE);
    TU_CHECK_RC(ts_gelu_forward(e, v5, v6), TS_ESHAPE);
    TU_CHECK_RC(ts_softmax_forward(e, out, inp), TS_ESHAPE);
    ts_tensor_t *three = T(f, TS_F32, 1, TS_SHAPE(3));
    TU_CHECK_RC(ts_add_bcast_forward(e, inp, inp, three), TS_ESHAPE); /* 3 does not divide 20 */
    TU_CHECK_RC(ts_add_bcast_backward(e, inp, three, inp), TS_ESHAPE);
    TU_CHECK_RC(ts_sum_forward(e, two, v5), TS_ESHAPE);
    TU_CHECK_RC(ts_mse_forward(e, two, v5, v5), TS_ESHAPE);
    TU_CHECK_RC(ts_mse_forward(e, v5, v5, v6), TS_ESHAPE);
    TU_CHECK_RC(ts_sum_rows(e, v6, inp), TS_ESHAPE);
    TU_CHECK_RC(ts_layernorm_forward(e, inp, two, NULL, inp), TS_ESHAPE); /* mean needs 4 rows */
    TU_CHECK_RC(ts_tensor_item(e, two, &(float){0}), TS_ESHAPE);
    TU_CHECK_RC(ts_convert(e, v5, v6), TS_ESHAPE);
    TU_CHECK_RC(ts_timestep_embedding_forward(e, out, v5, 1000.0f), TS_ESHAPE); /* 5 t vs 4 rows */
    CHECK_BAD_ARG(ts_pos_embed_2d(e, out, 2)); /* (4, 3): D = 3 is not a multiple of 4 */
    CHECK_BAD_ARG(ts_pos_embed_2d(e, out, 0));
    assert_untouched("add with mismatched counts", v5);
    assert_untouched("sum into two elements", two);
    assert_untouched("softmax into another shape", out);

    /* optimiser: moments of another size; step 0 has no bias correction */
    ts_adamw_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f};
    TU_CHECK_RC(ts_adamw_step(e, v5, v5, v6, v5, &hp, 1, 1.0f), TS_ESHAPE);
    TU_CHECK_RC(ts_adamw_step(e, v5, v6, v5, v5, &hp, 1, 1.0f), TS_ESHAPE);
    CHECK_BAD_ARG(ts_adamw_step(e, v5, v5, v5, v5, &hp, 0, 1.0f));
    assert_untouched("adamw refused", v5);
    TU_CHECK_RC(ts_ema_update(e, v5, v6, 0.9f), TS_ESHAPE);
}

/* ---- dtypes and devices ---------------------------------------------------------------- */

static void test_dtype_and_device(void **state) {
    fixture_t *f = *state;
    ts_engine_t *e = &f->e;
    ts_tensor_t *h = T(f, TS_F16, 2, TS_SHAPE(4, 6));
    ts_tensor_t *bf = T(f, TS_BF16, 2, TS_SHAPE(4, 6));
    ts_tensor_t *i32 = T(f, TS_I32, 2, TS_SHAPE(4, 6));
    ts_tensor_t *x = T(f, TS_F32, 2, TS_SHAPE(4, 6));
    ts_tensor_t *y = T(f, TS_F32, 2, TS_SHAPE(4, 6));
    ts_tensor_t *w = T(f, TS_F32, 2, TS_SHAPE(3, 6));
    ts_tensor_t *o = T(f, TS_F32, 2, TS_SHAPE(4, 3));

    TU_CHECK_RC(ts_gelu_forward(e, y, h), TS_EDTYPE);
    TU_CHECK_RC(ts_gelu_forward(e, h, x), TS_EDTYPE);
    TU_CHECK_RC(ts_softmax_forward(e, y, i32), TS_EDTYPE);
    TU_CHECK_RC(ts_linear_forward(e, o, bf, w, NULL), TS_EDTYPE);
    TU_CHECK_RC(ts_add(e, y, x, h), TS_EDTYPE);
    TU_CHECK_RC(ts_layernorm_forward(e, y, NULL, NULL, bf), TS_EDTYPE);
    TU_CHECK_RC(ts_convert(e, y, i32), TS_EDTYPE);
    TU_CHECK_RC(ts_check_finite(e, i32), TS_EDTYPE);
    TU_CHECK_RC(ts_rng_uniform(e, h, 1, 0), TS_EDTYPE);
    TU_CHECK_RC(ts_fill(e, i32, 1.0f), TS_EDTYPE);
    ts_tensor_t *ids_f32 = T(f, TS_F32, 1, TS_SHAPE(4));
    TU_CHECK_RC(ts_embedding_forward(e, y, y, ids_f32), TS_EDTYPE); /* ids must be I32 */
    assert_untouched("gelu of an F16 tensor", y);

    /* a tensor tagged as CUDA memory (the bytes are host memory; nothing may touch them) */
    ts_tensor_t xc = *x;
    xc.device = TS_CUDA;
    xc.owns = 0;
    TU_CHECK_RC(ts_gelu_forward(e, y, &xc), TS_EDEVICE);
    TU_CHECK_RC(ts_gelu_forward(e, &xc, y), TS_EDEVICE);
    TU_CHECK_RC(
        ts_linear_forward(
            e, o, x,
            &(ts_tensor_t){
                .data = w->data, .dtype = TS_F32, .device = TS_CUDA, .ndim = 2, .shape = {3, 6}},
            NULL),
        TS_EDEVICE);
    TU_CHECK_RC(ts_add(e, y, x, &xc), TS_EDEVICE);
    TU_CHECK_RC(ts_rng_normal(e, &xc, 1, 0), TS_EDEVICE);
    ts_tensor_t c6 = *T(f, TS_F32, 1, TS_SHAPE(6));
    c6.device = TS_CUDA;
    c6.owns = 0;
    TU_CHECK_RC(ts_sum_rows(e, &c6, x), TS_EDEVICE);
    assert_untouched("gelu with a CUDA input", y);
    assert_untouched("gelu into a CUDA output", x);
    assert_untouched("linear with a CUDA weight", o);
}

/* ---- ranges ---------------------------------------------------------------------------- */

static void test_embedding_ids_out_of_range(void **state) {
    fixture_t *f = *state;
    ts_engine_t *e = &f->e;
    ts_tensor_t *table = T(f, TS_F32, 2, TS_SHAPE(5, 3));
    ts_tensor_t *out = T(f, TS_F32, 2, TS_SHAPE(3, 3));
    ts_tensor_t *ids = T(f, TS_I32, 1, TS_SHAPE(3));
    for (int i = 0; i < 15; i++)
        ((float *)table->data)[i] = (float)i;
    static const int32_t cases[][3] = {{0, 1, 5}, {-1, 0, 0}, {4, INT32_MIN, 2}, {INT32_MAX, 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(ids->data, cases[c], sizeof cases[c]);
        TU_CHECK_RC(ts_embedding_forward(e, out, table, ids), TS_ERANGE);
        assert_untouched("embedding with an id out of range", out);
        ts_tensor_t *dtable = table;
        float before = ((float *)dtable->data)[0];
        TU_CHECK_RC(ts_embedding_backward(e, dtable, out, ids), TS_ERANGE);
        assert_true(((float *)dtable->data)[0] == before);
    }
    /* the valid ids still work */
    static const int32_t ok[3] = {4, 0, 4};
    memcpy(ids->data, ok, sizeof ok);
    TU_CHECK_OK(ts_embedding_forward(e, out, table, ids));
    assert_true(((float *)out->data)[0] == 12.0f && ((float *)out->data)[3] == 0.0f);
}

static void test_absurd_sizes(void **state) {
    (void)state;
    ts_tensor_t t;
    TU_CHECK_RC(ts_tensor_alloc(&t, TS_F32, TS_CPU, 4,
                                TS_SHAPE(INT64_C(1) << 20, INT64_C(1) << 20, INT64_C(1) << 20,
                                         INT64_C(1) << 20)),
                TS_ERANGE);
    TU_CHECK_RC(ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, TS_SHAPE(INT64_MAX)), TS_ERANGE);
    TU_CHECK_RC(
        ts_tensor_alloc(&t, TS_F16, TS_CPU, 2, TS_SHAPE(INT64_C(1) << 30, INT64_C(1) << 30)),
        TS_ERANGE);
    ts_arena_t a;
    TU_CHECK_OK(ts_arena_init(&a, TS_CPU, 0));
    int rc = ts_arena_tensor(&a, &t, TS_F32, 2, TS_SHAPE(INT64_MAX / 2, 3));
    assert_true(rc == TS_ERANGE || rc == TS_ENOMEM);
    assert_int_equal(a.used, 0);
    ts_arena_free(&a);
}

/* ---- engines --------------------------------------------------------------------------- */

static void test_engine_init_errors(void **state) {
    (void)state;
    ts_engine_t e;
    ts_engine_opts_t cuda = {.device = TS_CUDA, .threads = 0, .gpu = 0};
    char why[256] = "";
    int count = ts_cuda_device_count(why, sizeof why);
    if (count == 0) {
        /* no GPU here (or no CUDA backend): the reason is given, and a CUDA engine is ENODEV */
        assert_true(why[0] != '\0');
        TU_CHECK_RC(ts_engine_init(&e, &cuda), TS_ENODEV);
    }
    ts_engine_opts_t bad_gpu = {.device = TS_CUDA, .threads = 0, .gpu = 1000};
    int rc = ts_engine_init(&e, &bad_gpu);
    assert_true(rc == TS_ENODEV || rc == TS_EINVAL);
    TU_CHECK_RC(ts_engine_init(NULL, &cuda), TS_EINVAL);
    ts_engine_opts_t bad_dev = {.device = (ts_device_t)7, .threads = 1, .gpu = 0};
    rc = ts_engine_init(&e, &bad_dev);
    assert_true(rc == TS_EINVAL || rc == TS_ENODEV);
    ts_engine_opts_t bad_threads = {.device = TS_CPU, .threads = -3, .gpu = 0};
    rc = ts_engine_init(&e, &bad_threads);
    if (rc == TS_OK) /* a negative count may be read as "default"; then it must be usable */
        ts_engine_free(&e);
    else
        assert_int_equal(rc, TS_EINVAL);
    if (!ts_cuda_built())
        assert_int_equal(count, 0);
}

/* Device names as users write them, and "auto" choosing what is there. */
static void test_device_specs(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int automatic;
        ts_device_t device;
        int gpu;
        const char *formatted;
    } good[] = {{NULL, 1, TS_CPU, 0, "auto"},        {"", 1, TS_CPU, 0, "auto"},
                {"auto", 1, TS_CPU, 0, "auto"},      {"cpu", 0, TS_CPU, 0, "cpu"},
                {"cuda", 0, TS_CUDA, 0, "cuda:0"},   {"cuda:0", 0, TS_CUDA, 0, "cuda:0"},
                {"cuda:3", 0, TS_CUDA, 3, "cuda:3"}, {"cuda:1023", 0, TS_CUDA, 1023, "cuda:1023"}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        ts_device_spec_t s;
        TU_CHECK_RC(ts_device_spec_parse(good[i].text, &s), TS_OK);
        assert_int_equal(s.automatic, good[i].automatic);
        if (!s.automatic) {
            assert_int_equal(s.device, good[i].device);
            assert_int_equal(s.gpu, good[i].gpu);
        }
        char buf[32];
        ts_device_spec_format(&s, buf, sizeof buf);
        assert_string_equal(buf, good[i].formatted);
    }
    static const char *bad[] = {"gpu",   "CPU",   "cuda:", "cuda:-1", "cuda:1024", "cuda:1x",
                                "cuda0", "cudax", "cpu ",  " cpu",    "cuda:+1",   "auto:0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_device_spec_t s = {.automatic = 7, .device = TS_CUDA, .gpu = 42};
        TU_CHECK_RC(ts_device_spec_parse(bad[i], &s), TS_EINVAL);
        assert_int_equal(s.automatic, 7); /* untouched */
        assert_int_equal(s.gpu, 42);
    }
    TU_CHECK_RC(ts_device_spec_parse("cpu", NULL), TS_EINVAL);

    /* auto starts an engine in every build: the GPU when there is one, else the CPU with why */
    char why[256] = "", note[512] = "";
    int count = ts_cuda_device_count(why, sizeof why);
    ts_device_spec_t automatic, cpu, far;
    TU_CHECK_RC(ts_device_spec_parse("auto", &automatic), TS_OK);
    TU_CHECK_RC(ts_device_spec_parse("cpu", &cpu), TS_OK);
    TU_CHECK_RC(ts_device_spec_parse("cuda:1000", &far), TS_OK);
    ts_engine_t e;
    TU_CHECK_RC(ts_engine_init_spec(&e, &automatic, 1, note, sizeof note), TS_OK);
    assert_int_equal(e.device, count > 0 ? TS_CUDA : TS_CPU);
    if (count == 0) { /* the note names the CPU and repeats the reason there is no GPU */
        assert_non_null(strstr(note, "cpu, 1 thread, OpenBLAS "));
        assert_non_null(strstr(note, " (auto: "));
        assert_non_null(strstr(note, why));
    }
    size_t total = 1, used = 1;
    int mrc = ts_engine_memory(&e, &total, &used);
    if (e.device == TS_CPU) {
        assert_int_equal(mrc, TS_ENODEV);
        assert_true(total == 0 && used == 0);
    } else {
        assert_int_equal(mrc, TS_OK);
        assert_true(total > 0 && used <= total);
    }
    double util = -1.0;
    int urc = ts_engine_utilization(&e, &util);
    if (e.device == TS_CPU)
        assert_int_equal(urc, TS_ENODEV);
    else /* NVML comes with the driver; a machine without it answers TS_ENOTSUP */
        assert_true(urc == TS_OK || urc == TS_ENOTSUP);
    assert_true(util >= 0.0 && util <= 1.0);
    assert_int_equal(ts_engine_utilization(NULL, &util), TS_EINVAL);
    /* marks: the device's time between two points, never negative; bad arguments refused */
    ts_engine_mark_t a = {0}, b = {0};
    double secs = -1.0;
    assert_int_equal(ts_engine_mark(&e, &a), TS_OK);
    assert_int_equal(ts_engine_mark(&e, &b), TS_OK);
    assert_int_equal(ts_engine_marks_elapsed(&e, &a, &b, &secs), TS_OK);
    assert_true(secs >= 0.0 && secs < 10.0);
    if (e.device == TS_CPU && b.t > a.t) /* the later mark first: an error, not a negative time */
        assert_int_equal(ts_engine_marks_elapsed(&e, &b, &a, &secs), TS_EINVAL);
    assert_int_equal(ts_engine_mark(NULL, &a), TS_EINVAL);
    assert_int_equal(ts_engine_mark(&e, NULL), TS_EINVAL);
    assert_int_equal(ts_engine_marks_elapsed(&e, &a, NULL, &secs), TS_EINVAL);
    ts_engine_mark_free(&a);
    ts_engine_mark_free(&b);
    ts_engine_mark_free(NULL);
    /* CUDA graphs: none on a CPU engine; a graph never captured is not launched */
    ts_engine_graph_t g = {0};
    if (e.device == TS_CPU) {
        assert_int_equal(ts_engine_capture_begin(&e), TS_ENOTSUP);
        assert_int_equal(ts_engine_capture_end(&e, &g), TS_ENOTSUP);
        assert_null(g.exec);
    }
    assert_int_equal(ts_engine_graph_launch(&e, &g), TS_EINVAL);
    assert_int_equal(ts_engine_capture_begin(NULL), TS_EINVAL);
    assert_int_equal(ts_engine_capture_end(&e, NULL), TS_EINVAL);
    ts_engine_graph_free(&g);
    ts_engine_graph_free(NULL);
    ts_engine_free(&e);
    TU_CHECK_RC(ts_engine_init_spec(&e, &cpu, 2, note, sizeof note), TS_OK);
    assert_true(strncmp(note, "cpu, 2 threads, OpenBLAS ", 25) == 0);
    char desc[64];
    ts_engine_describe(&e, desc, sizeof desc);
    assert_true(strncmp(desc, "cpu, 2 threads, OpenBLAS ", 25) == 0);
    ts_engine_free(&e);
    /* a GPU that is not there is refused, with the reason, never replaced by the CPU */
    TU_CHECK_RC(ts_engine_init_spec(&e, &far, 0, note, sizeof note), TS_ENODEV);
    assert_non_null(strstr(note, "cuda:1000: "));
    TU_CHECK_RC(ts_engine_init_spec(NULL, &cpu, 0, note, sizeof note), TS_EINVAL);
    TU_CHECK_RC(ts_engine_init_spec(&e, NULL, 0, note, sizeof note), TS_EINVAL);
}

static void test_strerror(void **state) {
    (void)state;
    static const int codes[] = {TS_OK,      TS_EINVAL,   TS_ENOMEM, TS_ESHAPE,    TS_EDTYPE,
                                TS_EDEVICE, TS_ENODEV,   TS_ECUDA,  TS_ECUBLAS,   TS_ENONFINITE,
                                TS_EIO,     TS_ECORRUPT, TS_ERANGE, TS_ENOTSUP,   TS_ENOTFOUND,
                                TS_ENOSPC,  TS_EEXIST,   TS_EBUSY,  TS_ETIMEDOUT, TS_ECANCELED,
                                TS_EPEER,   TS_ECLOSED};
    static const int unknown[] = {1, 42, -22, -1000, INT_MIN, INT_MAX};
    const char *unk = ts_strerror(-1000);
    assert_non_null(unk);
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *s = ts_strerror(unknown[i]);
        assert_non_null(s);
        assert_true(s[0] != '\0');
    }
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        const char *s = ts_strerror(codes[i]);
        assert_non_null(s);
        if (s[0] == '\0' || strcmp(s, unk) == 0) {
            print_error("ts_strerror(%d) = \"%s\": empty or the same as for an unknown code\n",
                        codes[i], s);
            fail();
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(s, ts_strerror(codes[j])) == 0) {
                print_error("ts_strerror(%d) and ts_strerror(%d) are both \"%s\"\n", codes[i],
                            codes[j], s);
                fail();
            }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_null_engine_and_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shape_mismatches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtype_and_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding_ids_out_of_range, setup, teardown),
        cmocka_unit_test(test_absurd_sizes),
        cmocka_unit_test(test_engine_init_errors),
        cmocka_unit_test(test_device_specs),
        cmocka_unit_test(test_strerror),
        cmocka_unit_test_setup_teardown(test_null_gelu_backward_inp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_silu_backward_inp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_softmax_backward_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_mse_backward_target, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_adamw_m, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_adamw_v, setup, teardown),
    };
    return cmocka_run_group_tests_name("api_errors", tests, NULL, NULL);
}
