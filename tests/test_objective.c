/*
 * test_objective.c — DDPM experts (ε-, v- and x0-prediction) converted to flow velocity
 * (model/objective.h), checked exactly where every optimal predictor is closed form: Gaussian
 * data, x0 ~ N(μ, σ²) in each dimension.
 *
 * With x_t = (1 − t)·x0 + t·ε and V = (1 − t)²σ² + t², the optimal flow velocity is
 *     v*(x_t, t) = E[ε | x_t] − E[x0 | x_t] = (t − (1 − t)σ²)·(x_t − (1 − t)μ) / V − μ.
 * With x_s = a·x0 + b·ε (a = √ᾱ, b = √(1 − ᾱ)) and V' = a²σ² + b², the optimal DDPM predictors are
 *     E[ε | x_s] = b·(x_s − aμ)/V',  E[x0 | x_s] = μ + aσ²·(x_s − aμ)/V',  v = a·E[ε] − b·E[x0].
 * Each analytic DDPM expert, asked where ts_ddpm_from_flow says (scale·x_t at ᾱ(t)), converts to
 * v* at every t the schedule covers; the schedule's inverse finds the step whose ᾱ is ᾱ(t); the
 * ends clamp and say so; an ensemble mixing a flow expert with converted DDPM experts is v*.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "model/objective.h"
#include "tests/testutil.h"

#define D 64

typedef struct {
    double mu[D], sigma[D];
    float x[D]; /* an x_t */
} gauss_t;

static void gauss_init(gauss_t *g, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < D; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0;
        g->mu[i] = 2.0 * u - 1.0;
        g->sigma[i] = 0.2 + u;
        g->x[i] = (float)(3.0 * u - 1.5 + 0.1 * i / D);
    }
}

static double flow_velocity(const gauss_t *g, int i, double t, double x) {
    double m = g->mu[i], s2 = g->sigma[i] * g->sigma[i];
    double V = (1 - t) * (1 - t) * s2 + t * t;
    return (t - (1 - t) * s2) * (x - (1 - t) * m) / V - m;
}

/* The optimal DDPM expert of objective o at x_s for ᾱ. */
static double ddpm_expert(const gauss_t *g, int i, ts_objective_t o, double abar, double xs) {
    double m = g->mu[i], s2 = g->sigma[i] * g->sigma[i], a = sqrt(abar), b = sqrt(1 - abar);
    double V = a * a * s2 + b * b;
    double eps = b * (xs - a * m) / V, x0 = m + a * s2 * (xs - a * m) / V;
    return o == TS_OBJ_EPSILON ? eps : o == TS_OBJ_V_PRED ? a * eps - b * x0 : x0;
}

static void test_names(void **state) {
    (void)state;
    for (int o = TS_OBJ_VELOCITY; o <= TS_OBJ_X0; o++) {
        ts_objective_t back;
        assert_int_equal(ts_objective_parse(ts_objective_name((ts_objective_t)o), &back), TS_OK);
        assert_int_equal((int)back, o);
    }
    ts_objective_t x;
    assert_int_equal(ts_objective_parse("eps", &x), TS_EINVAL);
    assert_int_equal(ts_objective_parse(NULL, &x), TS_EINVAL);
}

static void test_schedule(void **state) {
    (void)state;
    static ts_ddpm_schedule_t s;
    assert_int_equal(ts_ddpm_linear(&s, 1000, 1e-4, 0.02), TS_OK);
    /* ᾱ against a product in long double, step by step */
    long double p = 1.0L;
    for (int i = 0; i < 1000; i++) {
        p *= 1.0L - (1e-4L + (0.02L - 1e-4L) * i / 999.0L);
        assert_true(fabs((double)p - s.abar[i]) <= 1e-12 * (double)p + 1e-300);
    }
    assert_true(s.abar[999] > 3e-5 && s.abar[999] < 5e-5); /* the well-known ~4.0e-5 at T */
    /* interpolation hits the steps and stays between them */
    assert_true(fabs(ts_ddpm_abar(&s, 10.0) - s.abar[10]) < 1e-15);
    double mid = ts_ddpm_abar(&s, 10.5);
    assert_true(mid < s.abar[10] && mid > s.abar[11]);
    assert_int_equal(ts_ddpm_linear(&s, 1, 1e-4, 0.02), TS_EINVAL);
    assert_int_equal(ts_ddpm_linear(&s, 1000, 0.0, 0.02), TS_EINVAL);
    assert_int_equal(ts_ddpm_linear(&s, 1000, 0.03, 0.02), TS_EINVAL);
    assert_int_equal(ts_ddpm_linear(&s, 1000, 1e-4, 1.0), TS_EINVAL);
}

static void test_time_map(void **state) {
    (void)state;
    static ts_ddpm_schedule_t s;
    assert_int_equal(ts_ddpm_linear(&s, 1000, 1e-4, 0.02), TS_OK);
    int inside = 0;
    for (int k = 1; k < 200; k++) {
        double t = k / 200.0, step, abar, scale;
        int clamped = ts_ddpm_from_flow(&s, t, &step, &abar, &scale);
        double want = (1 - t) * (1 - t) / ((1 - t) * (1 - t) + t * t);
        assert_true(fabs(scale - 1.0 / sqrt((1 - t) * (1 - t) + t * t)) < 1e-15);
        if (clamped) { /* only at the ends, and then at the schedule's end */
            assert_true(want > s.abar[0] || want < s.abar[999]);
            assert_true(step == 0.0 || step == 999.0);
            continue;
        }
        inside++;
        assert_true(step >= 0.0 && step <= 999.0);
        assert_true(fabs(abar - want) <= 1e-15);
        /* the step found gives that ᾱ back through the schedule */
        assert_true(fabs(ts_ddpm_abar(&s, step) - want) <= 1e-9 * want);
    }
    assert_true(inside > 150);
    double step, abar, scale;
    assert_int_equal(ts_ddpm_from_flow(&s, 1e-4, &step, &abar, &scale), 1); /* ᾱ above ᾱ_0 */
    assert_true(step == 0.0 && abar == s.abar[0]);
    assert_int_equal(ts_ddpm_from_flow(&s, 0.9999, &step, &abar, &scale), 1);
    assert_true(step == 999.0 && abar == s.abar[999]);
}

static void test_conversions_are_exact(void **state) {
    (void)state;
    static ts_ddpm_schedule_t s;
    assert_int_equal(ts_ddpm_linear(&s, 1000, 1e-4, 0.02), TS_OK);
    gauss_t g;
    gauss_init(&g, 3);
    float f[D], v[D];
    double worst = 0.0;
    for (int k = 1; k < 100; k++) {
        double t = k / 100.0, step, abar, scale;
        if (ts_ddpm_from_flow(&s, t, &step, &abar, &scale))
            continue;
        for (int o = TS_OBJ_EPSILON; o <= TS_OBJ_X0; o++) {
            for (int i = 0; i < D; i++)
                f[i] = (float)ddpm_expert(&g, i, (ts_objective_t)o, ts_ddpm_abar(&s, step),
                                          scale * g.x[i]);
            assert_int_equal(ts_objective_to_velocity((ts_objective_t)o, t, abar, scale, g.x, f,
                                                      v, D),
                             TS_OK);
            for (int i = 0; i < D; i++) {
                double want = flow_velocity(&g, i, t, g.x[i]);
                /* float answers, divided by (1 − t) or t for ε and x0: relative to that */
                double amp = 1.0 + fabs(want) + fabs(g.x[i]) / (1 - t) + fabs(g.x[i]) / t;
                double err = fabs(v[i] - want) / amp;
                worst = err > worst ? err : worst;
                assert_true(err < 5e-6);
            }
        }
    }
    print_message("  worst relative error of a converted analytic expert: %.2e\n", worst);
}

static void test_mixed_ensemble(void **state) {
    (void)state;
    static ts_ddpm_schedule_t s;
    assert_int_equal(ts_ddpm_linear(&s, 1000, 1e-4, 0.02), TS_OK);
    gauss_t g;
    gauss_init(&g, 11);
    double t = 0.37, step, abar, scale;
    assert_int_equal(ts_ddpm_from_flow(&s, t, &step, &abar, &scale), 0);
    float flow[D], eps[D], x0[D];
    for (int i = 0; i < D; i++) {
        flow[i] = (float)flow_velocity(&g, i, t, g.x[i]);
        eps[i] = (float)ddpm_expert(&g, i, TS_OBJ_EPSILON, abar, scale * g.x[i]);
        x0[i] = (float)ddpm_expert(&g, i, TS_OBJ_X0, abar, scale * g.x[i]);
    }
    assert_int_equal(ts_objective_to_velocity(TS_OBJ_VELOCITY, t, 0, 0, g.x, flow, flow, D), TS_OK);
    assert_int_equal(ts_objective_to_velocity(TS_OBJ_EPSILON, t, abar, scale, g.x, eps, eps, D),
                     TS_OK); /* in place */
    assert_int_equal(ts_objective_to_velocity(TS_OBJ_X0, t, abar, scale, g.x, x0, x0, D), TS_OK);
    for (int i = 0; i < D; i++) { /* weights 0.5 / 0.3 / 0.2: the mix is the analytic velocity */
        double mix = 0.5 * flow[i] + 0.3 * eps[i] + 0.2 * x0[i];
        double want = flow_velocity(&g, i, t, g.x[i]);
        assert_true(fabs(mix - want) < 1e-5 * (1.0 + fabs(want)));
    }
}

static void test_bad_arguments(void **state) {
    (void)state;
    float x = 1.0f, f = 1.0f, v;
    assert_int_equal(ts_objective_to_velocity(TS_OBJ_EPSILON, 0.0, 0.5, 1.0, &x, &f, &v, 1),
                     TS_EINVAL);
    assert_int_equal(ts_objective_to_velocity(TS_OBJ_EPSILON, 1.0, 0.5, 1.0, &x, &f, &v, 1),
                     TS_EINVAL);
    assert_int_equal(ts_objective_to_velocity(TS_OBJ_EPSILON, 0.5, 0.0, 1.0, &x, &f, &v, 1),
                     TS_EINVAL);
    assert_int_equal(ts_objective_to_velocity((ts_objective_t)9, 0.5, 0.5, 1.0, &x, &f, &v, 1),
                     TS_EINVAL);
    assert_int_equal(ts_objective_to_velocity(TS_OBJ_VELOCITY, 0.5, 0, 0, &x, &f, &v, 1), TS_OK);
    assert_true(v == 1.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_time_map),
        cmocka_unit_test(test_conversions_are_exact),
        cmocka_unit_test(test_mixed_ensemble),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
