/*
 * test_convert.c — F16 and BF16 conversions (kernels/math.h, ts_convert) and ts_check_finite.
 *
 * The reference here is written from the IEEE definitions, not from the bit tricks of math.h: a
 * half or bfloat16 pattern is decoded into a double from its sign, exponent and fraction fields,
 * and rounding a float is done in double arithmetic — find the quantum 2^(E − p + 1) of the
 * value's binade (or of the subnormal range), divide (exact: a power of two), round with rint()
 * (round to nearest, ties to even, the default mode), multiply back, and re-encode. Overflow is
 * decided by the midpoint above the largest finite value (65520 for F16, (2 − 2^-8)·2^127 for
 * BF16): from there on the rounding goes to infinity.
 *
 * Inputs: all 65536 patterns of each 16-bit format; every midpoint between adjacent values (the
 * ties) and the floats just either side; 2^20 random float bit patterns; and the named edge cases
 * (subnormal ties, the subnormal/normal boundary, the overflow boundary, ±0, ±Inf, quiet and
 * signalling NaNs). Every check is exact (bit for bit, or NaN-ness for NaN inputs).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "tests/testutil.h"

/* ---- the reference ------------------------------------------------------------------------ */

/* A 16-bit float format: `mant` fraction bits, `ebits` exponent bits. */
typedef struct {
    const char *name;
    int mant, ebits;
} fmt16_t;

static const fmt16_t FMT_F16 = {"F16", 10, 5};
static const fmt16_t FMT_BF16 = {"BF16", 7, 8};

static int fmt_bias(const fmt16_t *f) { return (1 << (f->ebits - 1)) - 1; }

static int is_nan16(const fmt16_t *f, uint16_t h) {
    uint32_t emax = (1u << f->ebits) - 1;
    return ((h >> f->mant) & emax) == emax && (h & ((1u << f->mant) - 1)) != 0;
}

/* The value of a pattern, from its fields. */
static double decode16(const fmt16_t *f, uint16_t h) {
    uint32_t emax = (1u << f->ebits) - 1;
    uint32_t e = (h >> f->mant) & emax, m = h & ((1u << f->mant) - 1);
    double s = (h & 0x8000u) ? -1.0 : 1.0;
    if (e == emax)
        return m ? NAN : s * INFINITY;
    if (e == 0) /* subnormal: m · 2^(1 − bias − mant) */
        return s * ldexp((double)m, 1 - fmt_bias(f) - f->mant);
    return s * ldexp((double)((1u << f->mant) + m), (int)e - fmt_bias(f) - f->mant);
}

/* The pattern of a value that the format represents exactly (or of ±Inf). */
static uint16_t encode16(const fmt16_t *f, double v) {
    uint16_t sign = signbit(v) ? 0x8000u : 0u;
    double a = fabs(v);
    uint32_t emax = (1u << f->ebits) - 1;
    if (isinf(a))
        return (uint16_t)(sign | (emax << f->mant));
    if (a == 0.0)
        return sign;
    int e2;
    frexp(a, &e2); /* a = fr · 2^e2, fr in [0.5, 1): the binade is 2^(e2 − 1) */
    int E = e2 - 1;
    if (E < 1 - fmt_bias(f)) /* subnormal */
        return (uint16_t)(sign | (uint32_t)ldexp(a, fmt_bias(f) - 1 + f->mant));
    uint32_t m = (uint32_t)(ldexp(a, f->mant - E) - ldexp(1.0, f->mant));
    return (uint16_t)(sign | ((uint32_t)(E + fmt_bias(f)) << f->mant) | m);
}

/* float → format, round to nearest even, in double arithmetic. NaN input → returns 0xffff as a
 * marker; the callers check NaN-ness rather than bits. */
static uint16_t round16(const fmt16_t *f, float x) {
    if (isnan(x))
        return 0xffffu;
    double a = fabs((double)x), s = signbit(x) ? -1.0 : 1.0;
    int bias = fmt_bias(f);
    /* largest finite value (2 − 2^-mant)·2^bias; halfway to the next binade rounds to Inf */
    double maxf = ldexp(2.0 - ldexp(1.0, -f->mant), bias);
    double overflow = maxf + ldexp(1.0, bias - f->mant - 1);
    if (a >= overflow)
        return encode16(f, s * INFINITY);
    if (a == 0.0)
        return encode16(f, s * 0.0);
    int e2;
    frexp(a, &e2);
    int E = e2 - 1;
    if (E < 1 - bias)
        E = 1 - bias; /* subnormals share the quantum of the smallest binade */
    double q = ldexp(1.0, E - f->mant);
    double v = rint(a / q) * q;
    return encode16(f, s * v);
}

/* ---- test inputs ------------------------------------------------------------------------ */

typedef struct {
    float *v;
    size_t n, cap;
} floats_t;

static void push(floats_t *fs, float x) {
    if (fs->n == fs->cap) {
        fs->cap = fs->cap ? 2 * fs->cap : 4096;
        fs->v = realloc(fs->v, fs->cap * sizeof(float));
        assert_non_null(fs->v);
    }
    fs->v[fs->n++] = x;
}

/* All values of the format, the midpoints between neighbours and the floats either side, random
 * float patterns and the edge cases. NaNs are left out (tested separately). */
static floats_t test_floats(const fmt16_t *f) {
    floats_t fs = {0};
    for (uint32_t h = 0; h < 0x7fffu; h++) { /* positive finite values, in increasing order */
        if (is_nan16(f, (uint16_t)h) || isinf(decode16(f, (uint16_t)h)))
            continue;
        double v = decode16(f, (uint16_t)h), next = decode16(f, (uint16_t)(h + 1));
        if (isnan(next))
            continue;
        if (isinf(next)) /* past the largest finite value, the next binade starts at 2^(bias+1) */
            next = ldexp(1.0, fmt_bias(f) + 1);
        float mid = (float)((v + next) / 2); /* exact: ≤ mant + 2 significant bits */
        for (int s = 0; s < 2; s++) {
            float sg = s ? -1.0f : 1.0f;
            push(&fs, sg * (float)v);
            push(&fs, sg * mid);
            push(&fs, sg * nextafterf(mid, 0.0f));
            push(&fs, sg * nextafterf(mid, INFINITY));
        }
    }
    uint64_t st = 12345;
    for (int i = 0; i < (1 << 20); i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        float x = ts_bits_f32((uint32_t)(st >> 32));
        if (!isnan(x))
            push(&fs, x);
    }
    const float edge[] = {0.0f,
                          -0.0f,
                          INFINITY,
                          -INFINITY,
                          FLT_MAX,
                          -FLT_MAX,
                          FLT_MIN,
                          FLT_TRUE_MIN,
                          -FLT_TRUE_MIN,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          nextafterf(65520.0f, 0.0f),
                          65520.0f,
                          -65520.0f,
                          65536.0f,
                          1e10f,
                          0x1p-25f,
                          nextafterf(0x1p-25f, 1.0f),
                          nextafterf(0x1p-25f, 0.0f),
                          0x1.8p-24f,
                          0x1.4p-23f,
                          0x1p-14f - 0x1p-25f,
                          0x1p-14f,
                          0x1p-24f,
                          ts_bits_f32(0x7f7f8000u),
                          ts_bits_f32(0x7f7f7fffu),
                          ts_bits_f32(0x00008000u),
                          ts_bits_f32(0x00018000u),
                          ts_bits_f32(0x3f808000u),
                          ts_bits_f32(0x3f818000u)};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        push(&fs, edge[i]);
    return fs;
}

static const uint32_t nan_inputs[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                      0x7f80ffffu, 0x7fbfffffu, 0x7f801000u, 0x7fffffffu};

/* ---- the scalar conversions (kernels/math.h) --------------------------------------------- */

static void check_roundtrip16(const fmt16_t *f, uint16_t (*to16)(float),
                              float (*from16)(uint16_t)) {
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        double want = decode16(f, (uint16_t)h);
        float x = from16((uint16_t)h);
        if (is_nan16(f, (uint16_t)h)) {
            if (!isnan(x) || !is_nan16(f, to16(x))) {
                print_error("%s NaN %04x: decoded to %g, back to %04x (want NaN)\n", f->name, h, x,
                            to16(x));
                fail();
            }
            continue;
        }
        if ((double)x != want || !signbit(x) != !signbit(want)) {
            print_error("%s %04x → f32: got %.9g, expected %.9g\n", f->name, h, x, want);
            fail();
        }
        if (to16(x) != h) {
            print_error("%s %04x → f32 %.9g → %s gives %04x\n", f->name, h, x, f->name, to16(x));
            fail();
        }
    }
}

static void check_rounding16(const fmt16_t *f, uint16_t (*to16)(float)) {
    floats_t fs = test_floats(f);
    for (size_t i = 0; i < fs.n; i++) {
        uint16_t want = round16(f, fs.v[i]), got = to16(fs.v[i]);
        if (got != want) {
            print_error("f32 %.9g (%08x) → %s: got %04x (%.9g), expected %04x (%.9g)\n", fs.v[i],
                        ts_f32_bits(fs.v[i]), f->name, got, decode16(f, got), want,
                        decode16(f, want));
            fail();
        }
    }
    for (size_t i = 0; i < sizeof nan_inputs / sizeof nan_inputs[0]; i++) {
        float x = ts_bits_f32(nan_inputs[i]);
        uint16_t got = to16(x);
        if (!is_nan16(f, got) || (got >> 15) != (nan_inputs[i] >> 31)) {
            print_error("f32 NaN %08x → %s gave %04x, want a NaN of the same sign\n", nan_inputs[i],
                        f->name, got);
            fail();
        }
    }
    free(fs.v);
}

static uint16_t f16_from(float x) { return ts_f32_to_f16(x); }
static float f16_to(uint16_t h) { return ts_f16_to_f32(h); }
static uint16_t bf16_from(float x) { return ts_f32_to_bf16(x); }
static float bf16_to(uint16_t h) { return ts_bf16_to_f32(h); }

static void test_f16_all_patterns_roundtrip(void **state) {
    (void)state;
    check_roundtrip16(&FMT_F16, f16_from, f16_to);
}

static void test_f16_rounding(void **state) {
    (void)state;
    /* spot checks of the reference itself, from the IEEE tables */
    assert_int_equal(round16(&FMT_F16, 65504.0f), 0x7bff);
    assert_int_equal(round16(&FMT_F16, nextafterf(65520.0f, 0.0f)), 0x7bff);
    assert_int_equal(round16(&FMT_F16, 65520.0f), 0x7c00);
    assert_int_equal(round16(&FMT_F16, -0.0f), 0x8000);
    assert_int_equal(round16(&FMT_F16, 0x1p-25f), 0x0000);   /* tie between 0 and 2^-24 → 0 */
    assert_int_equal(round16(&FMT_F16, 0x1.8p-24f), 0x0002); /* tie between 1 and 2 → 2 */
    assert_int_equal(round16(&FMT_F16, 1.0f + 0x1p-11f), 0x3c00);     /* tie → even */
    assert_int_equal(round16(&FMT_F16, 1.0f + 3 * 0x1p-11f), 0x3c02); /* tie → even */
    assert_int_equal(round16(&FMT_F16, 0x1p-14f - 0x1p-25f), 0x0400); /* into the normals */
    check_rounding16(&FMT_F16, f16_from);
}

static void test_bf16_all_patterns_roundtrip(void **state) {
    (void)state;
    check_roundtrip16(&FMT_BF16, bf16_from, bf16_to);
}

static void test_bf16_rounding(void **state) {
    (void)state;
    assert_int_equal(round16(&FMT_BF16, 1.0f), 0x3f80);
    assert_int_equal(round16(&FMT_BF16, ts_bits_f32(0x3f808000u)), 0x3f80); /* tie → even */
    assert_int_equal(round16(&FMT_BF16, ts_bits_f32(0x3f818000u)), 0x3f82); /* tie → even */
    assert_int_equal(round16(&FMT_BF16, ts_bits_f32(0x7f7f8000u)), 0x7f80); /* → Inf */
    assert_int_equal(round16(&FMT_BF16, ts_bits_f32(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(round16(&FMT_BF16, FLT_MAX), 0x7f80);
    check_rounding16(&FMT_BF16, bf16_from);
}

/* ---- ts_convert on tensors --------------------------------------------------------------- */

static const ts_dtype_t DTYPES[3] = {TS_F32, TS_F16, TS_BF16};

static void store(ts_dtype_t dt, void *p, size_t i, float x) {
    if (dt == TS_F32)
        ((float *)p)[i] = x;
    else {
        uint16_t h = dt == TS_F16 ? round16(&FMT_F16, x) : round16(&FMT_BF16, x);
        if (isnan(x))
            h = dt == TS_F16 ? 0x7e00u : 0x7fc0u;
        ((uint16_t *)p)[i] = h;
    }
}

static double load(ts_dtype_t dt, const void *p, size_t i) {
    if (dt == TS_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return decode16(dt == TS_F16 ? &FMT_F16 : &FMT_BF16, h);
}

static void test_convert_every_pair(void **state) {
    ts_engine_t *e = *state;
    /* source values: the F16 and BF16 test floats (ties included) and NaNs for an F32 source,
     * every pattern for a 16-bit source */
    floats_t fs = test_floats(&FMT_F16), fb = test_floats(&FMT_BF16);
    for (size_t i = 0; i < fb.n; i++)
        push(&fs, fb.v[i]);
    free(fb.v);
    for (size_t i = 0; i < sizeof nan_inputs / sizeof nan_inputs[0]; i++)
        push(&fs, ts_bits_f32(nan_inputs[i]));
    for (int s = 0; s < 3; s++) {
        for (int d = 0; d < 3; d++) {
            ts_dtype_t sd = DTYPES[s], dd = DTYPES[d];
            int64_t n = sd == TS_F32 ? (int64_t)fs.n : 65536;
            ts_tensor_t src, dst;
            assert_int_equal(ts_tensor_alloc(&src, sd, TS_CPU, 2, TS_SHAPE(1, n)), TS_OK);
            assert_int_equal(ts_tensor_alloc(&dst, dd, TS_CPU, 1, TS_SHAPE(n)), TS_OK);
            for (int64_t i = 0; i < n; i++) {
                if (sd == TS_F32)
                    ((float *)src.data)[i] = fs.v[i];
                else
                    ((uint16_t *)src.data)[i] = (uint16_t)i;
            }
            TU_CHECK_OK(ts_convert(e, &dst, &src));
            for (int64_t i = 0; i < n; i++) {
                double v = load(sd, src.data, (size_t)i); /* exact */
                double got = load(dd, dst.data, (size_t)i);
                int ok;
                if (isnan(v)) {
                    ok = isnan(got);
                } else {
                    float vf = (float)v; /* exact: every source value is a float */
                    double want;
                    if (dd == TS_F32)
                        want = vf;
                    else
                        want = decode16(dd == TS_F16 ? &FMT_F16 : &FMT_BF16,
                                        round16(dd == TS_F16 ? &FMT_F16 : &FMT_BF16, vf));
                    ok = got == want && !signbit(got) == !signbit(want);
                    if (!ok) {
                        print_error("ts_convert %s → %s element %lld: %.9g became %.9g, expected "
                                    "%.9g\n",
                                    ts_dtype_name(sd), ts_dtype_name(dd), (long long)i, v, got,
                                    want);
                        fail();
                    }
                }
                if (!ok) {
                    print_error("ts_convert %s → %s element %lld: NaN became %.9g\n",
                                ts_dtype_name(sd), ts_dtype_name(dd), (long long)i, got);
                    fail();
                }
            }
            ts_tensor_free(&src);
            ts_tensor_free(&dst);
        }
    }
    free(fs.v);
}

/* ---- ts_check_finite --------------------------------------------------------------------- */

static void test_check_finite(void **state) {
    ts_engine_t *e = *state;
    const int64_t n = 1001;
    static const int64_t where[] = {0, 500, 1000};
    for (int d = 0; d < 3; d++) {
        ts_dtype_t dt = DTYPES[d];
        ts_tensor_t t;
        assert_int_equal(ts_tensor_alloc(&t, dt, TS_CPU, 2, TS_SHAPE(7, 143)), TS_OK);
        /* finite values, including the largest finite ones of each format */
        for (int64_t i = 0; i < n; i++)
            store(dt, t.data, (size_t)i, (float)(i % 19) - 9.5f);
        store(dt, t.data, 3, dt == TS_F32 ? FLT_MAX : dt == TS_F16 ? 65504.0f : -3.3895e38f);
        store(dt, t.data, 4, dt == TS_F32 ? -FLT_MAX : dt == TS_F16 ? -65504.0f : 3.3895e38f);
        store(dt, t.data, 5, -0.0f);
        assert_false(isinf(load(dt, t.data, 3)) || isinf(load(dt, t.data, 4)));
        int rc = ts_check_finite(e, &t);
        if (rc != TS_OK) {
            print_error("ts_check_finite %s: finite tensor gave %d (%s)\n", ts_dtype_name(dt), rc,
                        ts_strerror(rc));
            fail();
        }
        static const float bad[] = {NAN, INFINITY, -INFINITY};
        for (size_t b = 0; b < 3; b++) {
            for (size_t w = 0; w < 3; w++) {
                float saved = (float)load(dt, t.data, (size_t)where[w]);
                store(dt, t.data, (size_t)where[w], bad[b]);
                rc = ts_check_finite(e, &t);
                if (rc != TS_ENONFINITE) {
                    print_error("ts_check_finite %s with %g at %lld: got %d (%s), expected "
                                "TS_ENONFINITE\n",
                                ts_dtype_name(dt), bad[b], (long long)where[w], rc,
                                ts_strerror(rc));
                    fail();
                }
                store(dt, t.data, (size_t)where[w], saved);
            }
        }
        assert_int_equal(ts_check_finite(e, &t), TS_OK);
        ts_tensor_free(&t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_all_patterns_roundtrip),  cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_bf16_all_patterns_roundtrip), cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_convert_every_pair),          cmocka_unit_test(test_check_finite),
    };
    return cmocka_run_group_tests_name("convert", tests, tu_setup_cpu_engine,
                                       tu_teardown_cpu_engine);
}
