/*
 * test_rng.c — the counter-based random streams (Philox4x32-10, kernels/math.h, and
 * ts_rng_uniform / ts_rng_normal in kernels/ops.h).
 *
 * What is checked, and against what:
 *   - the block function against the Random123 known-answer vectors (tests/kat_vectors of
 *     github.com/DEShawResearch/random123, the three "philox4x32 10" lines: counter, key, output);
 *   - the stream layout: element n is lane n mod 4 of block n / 4, block counter (lo, hi, 0, 0),
 *     key (seed lo, seed hi), words mapped to floats by their top 24 bits;
 *   - the engine ops: equal to the *_at element functions bit for bit at any offset (odd ones,
 *     ones past 2^32 blocks) and for any split of the work;
 *   - the normal stream against Box-Muller evaluated in double with libm from the same Philox
 *     words (independent of math.h's polynomial log and sincos), within 1e-5;
 *   - moments of 10^6 samples (|mean| < 0.005, |var − 1| < 0.01 for the normals: about five
 *     and seven standard errors; uniform mean within 0.002 of 1/2 and variance of 1/12);
 *   - ts_rng_log (relative error < 2e-7) and ts_rng_sincos_2pi (absolute error < 3e-7) against
 *     libm in double over dense sweeps.
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

static const double TWO_PI = 6.283185307179586476925286766559;

/* The four words of block `block` of stream `seed`, built here from the documented layout. */
static ts_u32x4_t words_of(uint64_t seed, uint64_t block) {
    ts_u32x4_t ctr = {{(uint32_t)block, (uint32_t)(block >> 32), 0u, 0u}};
    return ts_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
}

static uint32_t word_at(uint64_t seed, uint64_t n) { return words_of(seed, n >> 2).v[n & 3]; }

/* ---- the block function ---------------------------------------------------------------- */

static void test_philox_known_answers(void **state) {
    (void)state;
    /* Random123 tests/kat_vectors: "philox4x32 10 <ctr0..3> <key0..1>   <out0..3>" */
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
         {0x00000000, 0x00000000},
         {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        ts_u32x4_t ctr = {{kat[i].ctr[0], kat[i].ctr[1], kat[i].ctr[2], kat[i].ctr[3]}};
        ts_u32x4_t got = ts_philox4x32_10(ctr, kat[i].key[0], kat[i].key[1]);
        for (int w = 0; w < 4; w++)
            if (got.v[w] != kat[i].out[w]) {
                print_error("philox4x32-10 KAT %zu word %d: got %08x, expected %08x\n", i, w,
                            got.v[w], kat[i].out[w]);
                fail();
            }
    }
}

static void test_stream_layout(void **state) {
    (void)state;
    static const uint64_t seeds[] = {0, 1, 42, 0x123456789abcdef0ull, UINT64_MAX};
    static const uint64_t blocks[] = {0, 1, 7, 0xffffffffull, 0x100000000ull, 0x1234567890ull};
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
            ts_u32x4_t want = words_of(seeds[s], blocks[b]);
            ts_u32x4_t got = ts_rng_block(seeds[s], blocks[b]);
            assert_memory_equal(got.v, want.v, sizeof want.v);
            for (int lane = 0; lane < 4; lane++) {
                uint64_t n = blocks[b] * 4 + (uint64_t)lane;
                double u = (double)(want.v[lane] >> 8) / 16777216.0; /* top 24 bits / 2^24 */
                float got_u = ts_rng_uniform_at(seeds[s], n);
                if ((double)got_u != u) {
                    print_error("uniform_at(seed %llx, n %llu) = %.9g, expected %.9g from word "
                                "%08x\n",
                                (unsigned long long)seeds[s], (unsigned long long)n, got_u, u,
                                want.v[lane]);
                    fail();
                }
            }
        }
    }
    /* the key takes all 64 bits of the seed, the counter all 64 bits of the block */
    assert_true(ts_rng_block(1, 0).v[0] != ts_rng_block(1 + (1ull << 32), 0).v[0]);
    assert_true(ts_rng_block(1, 5).v[0] != ts_rng_block(1, 5 + (1ull << 32)).v[0]);
    /* the extremes of the word → float maps */
    assert_true(ts_u32_to_uniform(0u) == 0.0f);
    assert_true(ts_u32_to_uniform(0xffffffffu) < 1.0f);
    assert_true(ts_u32_to_uniform_pos(0u) > 0.0f);
    assert_true(ts_u32_to_uniform_pos(0xffffffffu) == 1.0f);
}

/* ---- the engine ops -------------------------------------------------------------------- */

static const uint64_t offsets[] = {0, 1, 2, 3, 5, 4097, (4ull << 32) + 3, (1ull << 34) - 1};

static void test_engine_equals_elementwise(void **state) {
    ts_engine_t *e = *state;
    static const int64_t sizes[] = {1, 3, 1001, 4099};
    static const uint64_t seed = 0x5eed5eed12345ull;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++) {
            int64_t n = sizes[s];
            uint64_t off = offsets[o];
            ts_tensor_t u, g;
            tu_alloc_f32(&u, 1, TS_SHAPE(n));
            tu_alloc_f32(&g, 1, TS_SHAPE(n));
            TU_CHECK_OK(ts_rng_uniform(e, &u, seed, off));
            TU_CHECK_OK(ts_rng_normal(e, &g, seed, off));
            for (int64_t j = 0; j < n; j++) {
                float wu = ts_rng_uniform_at(seed, off + (uint64_t)j);
                float wg = ts_rng_normal_at(seed, off + (uint64_t)j);
                if (tu_f32(&u)[j] != wu || tu_f32(&g)[j] != wg) {
                    print_error("rng n=%lld offset=%llu element %lld: uniform %.9g vs %.9g, "
                                "normal %.9g vs %.9g\n",
                                (long long)n, (unsigned long long)off, (long long)j, tu_f32(&u)[j],
                                wu, tu_f32(&g)[j], wg);
                    fail();
                }
            }
            ts_tensor_free(&u);
            ts_tensor_free(&g);
        }
    }
}

static void test_engine_any_split(void **state) {
    ts_engine_t *e = *state;
    const int64_t N = 1003;
    static const int64_t splits[] = {1, 2, 3, 7, 500, 1002};
    static const uint64_t seed = 7;
    for (int normal = 0; normal < 2; normal++) {
        int (*gen)(ts_engine_t *, ts_tensor_t *, uint64_t, uint64_t) =
            normal ? ts_rng_normal : ts_rng_uniform;
        for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++) {
            uint64_t off = offsets[o];
            ts_tensor_t whole;
            tu_alloc_f32(&whole, 1, TS_SHAPE(N));
            TU_CHECK_OK(gen(e, &whole, seed, off));
            for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
                int64_t k = splits[s];
                ts_tensor_t a, b;
                tu_alloc_f32(&a, 1, TS_SHAPE(k));
                tu_alloc_f32(&b, 1, TS_SHAPE(N - k));
                TU_CHECK_OK(gen(e, &a, seed, off));
                TU_CHECK_OK(gen(e, &b, seed, off + (uint64_t)k));
                if (memcmp(a.data, whole.data, (size_t)k * 4) != 0 ||
                    memcmp(b.data, tu_f32(&whole) + k, (size_t)(N - k) * 4) != 0) {
                    print_error("rng_%s offset %llu: [0,%lld) + [%lld,%lld) differs from "
                                "[0,%lld) in one call\n",
                                normal ? "normal" : "uniform", (unsigned long long)off,
                                (long long)k, (long long)k, (long long)N, (long long)N);
                    fail();
                }
                ts_tensor_free(&a);
                ts_tensor_free(&b);
            }
            ts_tensor_free(&whole);
        }
    }
}

/* Box-Muller in double with libm, from the stream words: pair j uses words 2j (u1 in (0, 1])
 * and 2j + 1 (u2 in [0, 1)); even elements take the cosine, odd ones the sine. */
static double box_muller_ref(uint64_t seed, uint64_t n) {
    uint64_t first = n & ~1ull;
    double u1 = (double)((word_at(seed, first) >> 8) + 1u) / 16777216.0;
    double u2 = (double)(word_at(seed, first + 1) >> 8) / 16777216.0;
    double r = sqrt(-2.0 * log(u1));
    return (n & 1) ? r * sin(TWO_PI * u2) : r * cos(TWO_PI * u2);
}

static void test_normal_equals_box_muller(void **state) {
    ts_engine_t *e = *state;
    static const uint64_t seeds[] = {0, 42, 0xdeadbeefcafef00dull};
    static const uint64_t offs[] = {0, 1, (1ull << 33) + 1};
    const int64_t n = 4096;
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++) {
            ts_tensor_t g;
            tu_alloc_f32(&g, 1, TS_SHAPE(n));
            TU_CHECK_OK(ts_rng_normal(e, &g, seeds[s], offs[o]));
            for (int64_t j = 0; j < n; j++) {
                double want = box_muller_ref(seeds[s], offs[o] + (uint64_t)j);
                if (!(fabs(tu_f32(&g)[j] - want) <= 1e-5)) {
                    print_error("rng_normal seed %llx element %llu: got %.9g, Box-Muller in "
                                "double gives %.9g\n",
                                (unsigned long long)seeds[s],
                                (unsigned long long)(offs[o] + (uint64_t)j), tu_f32(&g)[j], want);
                    fail();
                }
            }
            ts_tensor_free(&g);
        }
    }
}

static void test_moments(void **state) {
    ts_engine_t *e = *state;
    const int64_t n = 1000000;
    ts_tensor_t x;
    tu_alloc_f32(&x, 1, TS_SHAPE(n));

    TU_CHECK_OK(ts_rng_normal(e, &x, 2024, 0));
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = tu_f32(&x)[i];
        if (!isfinite(v)) {
            print_error("rng_normal element %lld is not finite (%g)\n", (long long)i, v);
            fail();
        }
        s += v;
        s2 += v * v;
    }
    double mean = s / (double)n, var = s2 / (double)n - mean * mean;
    if (!(fabs(mean) < 0.005 && fabs(var - 1.0) < 0.01)) {
        print_error("10^6 normals: mean %.5f (want |mean| < 0.005), variance %.5f (want within "
                    "0.01 of 1)\n",
                    mean, var);
        fail();
    }

    TU_CHECK_OK(ts_rng_uniform(e, &x, 2024, 12345));
    s = s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = tu_f32(&x)[i];
        if (!(v >= 0.0 && v < 1.0)) {
            print_error("rng_uniform element %lld = %.9g is outside [0, 1)\n", (long long)i, v);
            fail();
        }
        s += v;
        s2 += v * v;
    }
    mean = s / (double)n;
    var = s2 / (double)n - mean * mean;
    if (!(fabs(mean - 0.5) < 0.002 && fabs(var - 1.0 / 12.0) < 0.002)) {
        print_error("10^6 uniforms: mean %.5f (want 0.5 ± 0.002), variance %.5f (want 1/12 ± "
                    "0.002)\n",
                    mean, var);
        fail();
    }
    ts_tensor_free(&x);
}

/* ---- the libm-free helpers -------------------------------------------------------------- */

static void check_log(float x, double *worst, float *worst_x) {
    double want = log((double)x);
    double got = ts_rng_log(x);
    double rel = fabs(got - want) / fmax(fabs(want), 1e-300);
    if (want == 0.0)
        rel = fabs(got);
    if (rel > *worst || isnan(rel)) {
        *worst = isnan(rel) ? INFINITY : rel;
        *worst_x = x;
    }
}

static void test_rng_log(void **state) {
    (void)state;
    double worst = 0.0;
    float worst_x = 0.0f;
    /* every 7th of the 2^24 values the uniform (0, 1] map produces, and both ends */
    for (uint32_t k = 1; k <= (1u << 24); k += 7)
        check_log((float)k / 16777216.0f, &worst, &worst_x);
    check_log(1.0f, &worst, &worst_x);
    check_log(1.0f / 16777216.0f, &worst, &worst_x);
    check_log(nextafterf(1.0f, 0.0f), &worst, &worst_x);
    check_log(nextafterf(1.0f, 2.0f), &worst, &worst_x);
    /* the whole range of normal floats, geometrically */
    for (double x = FLT_MIN; x < FLT_MAX / 1.0001; x *= 1.0001)
        check_log((float)x, &worst, &worst_x);
    if (!(worst < 2e-7)) {
        print_error("ts_rng_log: worst relative error %.3g at x = %.9g (log %.12g, got %.9g); "
                    "want < 2e-7\n",
                    worst, worst_x, log((double)worst_x), ts_rng_log(worst_x));
        fail();
    }
}

static void test_rng_sincos(void **state) {
    (void)state;
    double worst_s = 0.0, worst_c = 0.0;
    float ws = 0.0f, wc = 0.0f;
    for (uint32_t k = 0; k < (1u << 24); k += 5) {
        float u = (float)k / 16777216.0f;
        float s, c;
        ts_rng_sincos_2pi(u, &s, &c);
        double es = fabs((double)s - sin(TWO_PI * u)), ec = fabs((double)c - cos(TWO_PI * u));
        if (!(es <= worst_s)) {
            worst_s = isnan(es) ? INFINITY : es;
            ws = u;
        }
        if (!(ec <= worst_c)) {
            worst_c = isnan(ec) ? INFINITY : ec;
            wc = u;
        }
    }
    /* the quarter turns and the last uniform value */
    static const float special[] = {0.0f, 0.25f, 0.5f, 0.75f, 0.125f, 1.0f - 1.0f / 16777216.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        float s, c;
        ts_rng_sincos_2pi(special[i], &s, &c);
        assert_true(fabs((double)s - sin(TWO_PI * special[i])) < 3e-7);
        assert_true(fabs((double)c - cos(TWO_PI * special[i])) < 3e-7);
    }
    if (!(worst_s < 3e-7 && worst_c < 3e-7)) {
        print_error("ts_rng_sincos_2pi: worst sin error %.3g at u = %.9g, worst cos error %.3g "
                    "at u = %.9g; want < 3e-7\n",
                    worst_s, ws, worst_c, wc);
        fail();
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_stream_layout),
        cmocka_unit_test(test_engine_equals_elementwise),
        cmocka_unit_test(test_engine_any_split),
        cmocka_unit_test(test_normal_equals_box_muller),
        cmocka_unit_test(test_moments),
        cmocka_unit_test(test_rng_log),
        cmocka_unit_test(test_rng_sincos),
    };
    return cmocka_run_group_tests_name("rng", tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
