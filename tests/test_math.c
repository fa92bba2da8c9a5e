/*
 * test_math.c — exp, tanh and the activations built on them (kernels/math.h), bit for bit.
 *
 * ts_expf and ts_tanhf were first written with ternaries: two chained clamps, |x|, the choice
 * between the series and the quotient, the sign. gcc did not vectorise the loops calling them
 * ("control flow in loop"), so they were rewritten branch-free. The results must not change: the
 * CUDA kernels run the same formulas, and a training run must reproduce its logged losses bit for
 * bit. The formulas as first written are frozen below (ref_*), and every function is compared with
 * them bit for bit (and GELU against the tanh form in double, test_gelu_accuracy):
 *   - ts_expf, ts_tanhf and ts_sigmoid called directly;
 *   - GELU and SiLU, forward and backward, through the CPU engine's ops, so the vectorised loops
 *     of kernels/cpu/ are what is checked.
 * Any NaN matches any NaN (NaN in gives NaN out; the payload is whatever the hardware
 * propagates). The frozen formulas are never called on a NaN: their float-to-int conversion
 * would be undefined there.
 *
 * Inputs: special values (±0, ±Inf, NaNs, subnormals, the extremes), every float within 4096
 * units in the last place of each place where a formula switches (the clamps at −87 and 88, the
 * series below 1/16, the clamp reached through −2|x| in tanh), and every 1021st bit pattern of all
 * 2³² (1021 is prime, so every exponent and many mantissas are hit). `test_math --exhaustive`
 * checks every one of the 2³² floats instead (minutes; run it by hand after changing any of these
 * formulas).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "tests/testutil.h"

#define CHUNK 65536    /* inputs per batch of op calls */
#define STRIDE 1021u   /* the default sweep: every STRIDE-th bit pattern */
#define EDGE_ULPS 4096 /* floats checked on each side of a switch point */

static int g_exhaustive; /* set by --exhaustive */

/* ---- the formulas as first written (frozen; do not edit — GELU's were re-frozen when it became
 * x / (1 + e^(−2u)), numerics revision 4) ---------------------------------------------------- */

static float ref_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float kf = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = (x - kf * 0.693145752f) - kf * 1.42860677e-6f;
    float p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f +
                                            r * (4.1666668e-2f +
                                                 r * (8.3333338e-3f +
                                                      r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    int32_t k = (int32_t)kf;
    return p * ts_bits_f32((uint32_t)(k + 127) << 23);
}

static float ref_tanhf(float x) {
    float ax = x < 0.0f ? -x : x;
    float e = ref_expf(-2.0f * ax);
    float big = (1.0f - e) / (1.0f + e);
    float x2 = ax * ax;
    float small = ax * (1.0f - x2 * (0.33333333f - x2 * (0.13333333f - x2 * 0.053968254f)));
    float t = ax < 0.0625f ? small : big;
    return x < 0.0f ? -t : t;
}

/* GELU as x / (1 + e^(−2u)) since numerics revision 4 (the tanh form before). */
static float ref_gelu(float x) {
    float u = TS_GELU_K0 * (x + TS_GELU_K1 * x * x * x);
    return x / (1.0f + ref_expf(-2.0f * u));
}

static float ref_gelu_grad(float x) {
    float u = TS_GELU_K0 * (x + TS_GELU_K1 * x * x * x);
    float e = ref_expf(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    float du = TS_GELU_K0 * (1.0f + 3.0f * TS_GELU_K1 * x * x);
    return s + 2.0f * x * s * (e * s) * du;
}

static float ref_sigmoid(float x) { return 1.0f / (1.0f + ref_expf(-x)); }

static float ref_silu(float x) { return x * ref_sigmoid(x); }

static float ref_silu_grad(float x) {
    float s = ref_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/* ---- what is compared ------------------------------------------------------------------ */

/* A backward op writes dinp = 0 + 1·grad (dinp zeroed, dout = 1); the reference does the same. */
static float ref_gelu_bwd(float x) { return 0.0f + 1.0f * ref_gelu_grad(x); }
static float ref_silu_bwd(float x) { return 0.0f + 1.0f * ref_silu_grad(x); }

enum { F_EXP, F_TANH, F_SIGMOID, F_GELU, F_GELU_BWD, F_SILU, F_SILU_BWD, F_COUNT };

static const struct {
    const char *name;
    float (*ref)(float);
} FUNCS[F_COUNT] = {
    {"ts_expf", ref_expf},
    {"ts_tanhf", ref_tanhf},
    {"ts_sigmoid", ref_sigmoid},
    {"ts_gelu_forward", ref_gelu},
    {"ts_gelu_backward", ref_gelu_bwd},
    {"ts_silu_forward", ref_silu},
    {"ts_silu_backward", ref_silu_bwd},
};

/* Mismatches of one function over the whole sweep, and the first one seen. */
typedef struct {
    uint64_t checked, mismatches;
    float x, got, want;
} tally_t;

typedef struct {
    ts_engine_t *e;
    ts_tensor_t x, out, ones;
    float *got[F_COUNT];
    tally_t tally[F_COUNT];
    int64_t n; /* inputs waiting in x */
} sweep_t;

static void sweep_init(sweep_t *s, ts_engine_t *e) {
    memset(s, 0, sizeof *s);
    s->e = e;
    tu_alloc_f32(&s->x, 1, TS_SHAPE(CHUNK));
    tu_alloc_f32(&s->out, 1, TS_SHAPE(CHUNK));
    tu_alloc_f32(&s->ones, 1, TS_SHAPE(CHUNK));
    TU_CHECK_OK(ts_fill(e, &s->ones, 1.0f));
    for (int f = 0; f < F_COUNT; f++)
        s->got[f] = tu_floats(CHUNK);
}

static void sweep_free(sweep_t *s) {
    TU_FREE_TENSORS(&s->x, &s->out, &s->ones);
    for (int f = 0; f < F_COUNT; f++)
        free(s->got[f]);
}

static int same_result(float got, float want) {
    return ts_f32_bits(got) == ts_f32_bits(want) || (isnan(got) && isnan(want));
}

/* Runs one engine op over the waiting inputs into got (a forward when bwd is NULL). */
static void run_op(sweep_t *s, int (*fwd)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *),
                   int (*bwd)(ts_engine_t *, ts_tensor_t *, const ts_tensor_t *,
                              const ts_tensor_t *),
                   float *got) {
    ts_tensor_t x, out, ones;
    TU_CHECK_OK(ts_tensor_slice(&x, &s->x, 0, s->n));
    TU_CHECK_OK(ts_tensor_slice(&out, &s->out, 0, s->n));
    TU_CHECK_OK(ts_tensor_slice(&ones, &s->ones, 0, s->n));
    if (bwd) {
        TU_CHECK_OK(ts_zero(s->e, &out));
        TU_CHECK_OK(bwd(s->e, &out, &ones, &x));
    } else {
        TU_CHECK_OK(fwd(s->e, &out, &x));
    }
    memcpy(got, tu_f32(&out), (size_t)s->n * sizeof *got);
}

/* Evaluates every function on the waiting inputs and tallies the differences. */
static void sweep_flush(sweep_t *s) {
    const float *x = tu_f32(&s->x);
    int64_t n = s->n;
    for (int64_t i = 0; i < n; i++)
        s->got[F_EXP][i] = ts_expf(x[i]);
    for (int64_t i = 0; i < n; i++)
        s->got[F_TANH][i] = ts_tanhf(x[i]);
    for (int64_t i = 0; i < n; i++)
        s->got[F_SIGMOID][i] = ts_sigmoid(x[i]);
    run_op(s, ts_gelu_forward, NULL, s->got[F_GELU]);
    run_op(s, NULL, ts_gelu_backward, s->got[F_GELU_BWD]);
    run_op(s, ts_silu_forward, NULL, s->got[F_SILU]);
    run_op(s, NULL, ts_silu_backward, s->got[F_SILU_BWD]);
    for (int f = 0; f < F_COUNT; f++) {
        tally_t *t = &s->tally[f];
        for (int64_t i = 0; i < n; i++) {
            float want = isnan(x[i]) ? x[i] : FUNCS[f].ref(x[i]);
            if (!same_result(s->got[f][i], want) && t->mismatches++ == 0) {
                t->x = x[i];
                t->got = s->got[f][i];
                t->want = want;
            }
        }
        t->checked += (uint64_t)n;
    }
    s->n = 0;
}

static void sweep_add(sweep_t *s, float x) {
    tu_f32(&s->x)[s->n++] = x;
    if (s->n == CHUNK)
        sweep_flush(s);
}

/* Fails the test, naming every function that differs and its first differing input. */
static void sweep_report(sweep_t *s) {
    if (s->n)
        sweep_flush(s);
    int bad = 0;
    for (int f = 0; f < F_COUNT; f++) {
        const tally_t *t = &s->tally[f];
        if (t->mismatches) {
            print_error("%s: %llu of %llu inputs differ from the formula as first written; first: "
                        "x = %.9g (0x%08x) gives %.9g (0x%08x), want %.9g (0x%08x)\n",
                        FUNCS[f].name, (unsigned long long)t->mismatches,
                        (unsigned long long)t->checked, t->x, ts_f32_bits(t->x), t->got,
                        ts_f32_bits(t->got), t->want, ts_f32_bits(t->want));
            bad = 1;
        }
    }
    if (bad)
        fail();
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_special_values(void **state) {
    static const uint32_t bits[] = {
        0x00000000u, 0x80000000u,                           /* ±0 */
        0x7f800000u, 0xff800000u,                           /* ±Inf */
        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffbfffffu, /* quiet and signalling NaNs */
        0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, /* subnormals */
        0x00800000u, 0x80800000u, 0x7f7fffffu, 0xff7fffffu, /* FLT_MIN, FLT_MAX */
        0x3f800000u, 0xbf800000u,                           /* ±1 */
    };
    sweep_t s;
    sweep_init(&s, *state);
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        sweep_add(&s, ts_bits_f32(bits[i]));
    sweep_report(&s);
    sweep_free(&s);
}

static void test_switch_points(void **state) {
    /* exp's clamps; tanh's series below |x| = 1/16; tanh's e^(−2|x|) reaching the clamp at −87
     * (|x| = 43.5); sigmoid's e^(−x) reaching the clamps (x = 87 and −88); each with both signs */
    static const float points[] = {-87.0f, 88.0f, 0.0625f, 43.5f, 87.0f, -88.0f};
    sweep_t s;
    sweep_init(&s, *state);
    for (size_t p = 0; p < sizeof points / sizeof points[0]; p++)
        for (int sign = 0; sign < 2; sign++) {
            uint32_t b = ts_f32_bits(sign ? -points[p] : points[p]);
            for (uint32_t d = 0; d <= 2 * EDGE_ULPS; d++)
                sweep_add(&s, ts_bits_f32(b - EDGE_ULPS + d));
        }
    sweep_report(&s);
    sweep_free(&s);
}

static void test_all_floats(void **state) {
    sweep_t s;
    sweep_init(&s, *state);
    uint32_t step = g_exhaustive ? 1u : STRIDE;
    uint64_t b = 0;
    for (; b <= UINT32_MAX; b += step)
        sweep_add(&s, ts_bits_f32((uint32_t)b));
    sweep_report(&s);
    if (g_exhaustive)
        printf("every one of the 2^32 floats: %llu inputs per function, all equal\n",
               (unsigned long long)s.tally[0].checked);
    sweep_free(&s);
}

/* GELU and its derivative against the tanh form evaluated in double, on 2²¹ + 1 points spread
 * over [−12, 12] and through the engine's vectorised loops: the value within 4·2⁻²⁴·max(|x|, 1)
 * (measured: 2.03), the derivative within 8·2⁻²⁴ (3.58). Computing u in float bounds what is
 * possible: e^(−2u) carries u's rounding times |2u|. The tanh form used before (numerics revision
 * 3) measured 2.17 and 17.4 — its 1 − tanh² u cancelled where tanh u nears 1. */
static void test_gelu_accuracy(void **state) {
    ts_engine_t *e = *state;
    const int64_t n = (1 << 21) + 1;
    ts_tensor_t x, y, dy, ones;
    tu_alloc_f32(&x, 1, TS_SHAPE(n));
    tu_alloc_f32(&y, 1, TS_SHAPE(n));
    tu_alloc_f32(&dy, 1, TS_SHAPE(n));
    tu_alloc_f32(&ones, 1, TS_SHAPE(n));
    float *xv = tu_f32(&x);
    for (int64_t i = 0; i < n; i++) {
        xv[i] = (float)(-12.0 + 24.0 * (double)i / (double)(n - 1));
        tu_f32(&ones)[i] = 1.0f;
    }
    TU_CHECK_OK(ts_gelu_forward(e, &y, &x));
    TU_CHECK_OK(ts_zero(e, &dy));
    TU_CHECK_OK(ts_gelu_backward(e, &dy, &ones, &x));
    double worst = 0.0, worst_grad = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = xv[i], u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
        double th = tanh(u), du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
        double want = 0.5 * v * (1.0 + th),
               want_grad = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * du;
        if (v < 0.0) /* the same function, without 1 + tanh u's cancellation */
            want = v / (1.0 + exp(-2.0 * u));
        double err = fabs(tu_f32(&y)[i] - want) / (fmax(fabs(v), 1.0) * 0x1p-24);
        double err_grad = fabs(tu_f32(&dy)[i] - want_grad) / 0x1p-24;
        worst = fmax(worst, err);
        worst_grad = fmax(worst_grad, err_grad);
    }
    printf("gelu: worst %.2f x 2^-24 max(|x|,1); its derivative: worst %.2f x 2^-24\n", worst,
           worst_grad);
    assert_true(worst <= 4.0);
    assert_true(worst_grad <= 8.0);
    TU_FREE_TENSORS(&x, &y, &dy, &ones);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--exhaustive") == 0) {
            g_exhaustive = 1;
        } else {
            fprintf(stderr, "usage: %s [--exhaustive]\n", argv[0]);
            return 2;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_special_values),
        cmocka_unit_test(test_switch_points),
        cmocka_unit_test(test_all_floats),
        cmocka_unit_test(test_gelu_accuracy),
    };
    return cmocka_run_group_tests_name("math", tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
