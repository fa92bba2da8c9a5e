/*
 * test_routing.c — routing (model/routing.h) and the local routed ensemble (model/ensemble.h).
 *
 * Routing, pure functions: every selection gives weights that sum to 1 over the selected experts
 * and are 0 elsewhere; top1 / top2 / full / threshold=p pick the right sets with the right
 * renormalised weights, ties go to the lower index; schedules choose their rule by t (strictly
 * above a threshold; t exactly at it falls through); malformed selections are rejected with the
 * bad token in the message; squared distances; policy names.
 *
 * Ensemble, with tiny random experts (hidden 32, depth 1, 8×8 images) written to a temporary
 * folder: top1 over identical experts (one file loaded K times) equals sampling the single
 * expert through ts_dit_velocity bit for bit; an ensemble of n samples equals n ensembles of one
 * sample (same seeds) for the learned, centroid and confidence policies; full with uniform
 * weights is the mean of the experts' velocities; the centroid policy with a hand-made partition
 * sends a sample to the nearer centroid with the softmax weights of −d/τ; expert evaluation
 * counts; ts_experts_open's ordering by metadata cluster and its refusals; init refusals; exact
 * mixture guidance against a naive sum of the experts' conditional and unconditional velocities;
 * the record's routing distribution and spread against the experts run one by one.
 *
 * The learned policy mostly uses a stub router (a fixed random projection of x, plus t), which
 * spreads samples over the experts on purpose; one test checks a real ts_classifier_t router
 * through ts_classifier_router_fn.
 */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/dit_io.h"
#include "model/ensemble.h"
#include "model/routing.h"
#include "model/sampler.h"

static char err[512];

/* ---- routing: weights ---------------------------------------------------------------------- */

static ts_selection_t parse_ok(const char *text) {
    ts_selection_t s;
    err[0] = '\0';
    TU_CHECK_RC_MSG(ts_selection_parse(text, &s, err, sizeof err), TS_OK, err);
    return s;
}

/* Softmax of a row in double, for the expected values. */
static void softmax_ref(double *p, const float *s, int K) {
    double mx = -INFINITY, sum = 0.0;
    for (int k = 0; k < K; k++)
        mx = s[k] > mx ? s[k] : mx;
    for (int k = 0; k < K; k++)
        sum += (p[k] = exp((double)s[k] - mx));
    for (int k = 0; k < K; k++)
        p[k] /= sum;
}

static int count_nonzero(const float *row, int K) {
    int c = 0;
    for (int k = 0; k < K; k++)
        c += row[k] != 0.0f;
    return c;
}

static void test_weights_sum_to_one(void **state) {
    (void)state;
    enum { B = 16, K = 5 };
    const char *sels[] = {
        "top1", "top2",          "top3",          "top5",        "top9",
        "full", "threshold=0.5", "threshold=0.9", "threshold=1", "t>0.5:full,t>0.2:top2,top1"};
    tu_rng_t r = {42};
    float scores[B * K], w[B * K];
    for (int i = 0; i < B * K; i++)
        scores[i] = tu_rng_uniform(&r, -3.0f, 3.0f);
    for (size_t s = 0; s < sizeof sels / sizeof sels[0]; s++) {
        ts_selection_t sel = parse_ok(sels[s]);
        for (int ti = 0; ti < 3; ti++) {
            float t = ti == 0 ? 0.9f : ti == 1 ? 0.4f : 0.1f;
            memcpy(w, scores, sizeof w);
            TU_CHECK_OK(ts_route_weights(w, B, K, &sel, t));
            const ts_select_rule_t *rule = ts_selection_rule(&sel, t);
            for (int b = 0; b < B; b++) {
                double sum = 0.0;
                for (int k = 0; k < K; k++) {
                    assert_true(w[b * K + k] >= 0.0f && w[b * K + k] <= 1.0f);
                    sum += w[b * K + k];
                }
                tu_check_scalar(sum, 1.0, 1e-6, "%s row %d sum", sels[s], b);
                int want = K;
                if (rule->kind == TS_SELECT_TOPK)
                    want = rule->k < K ? rule->k : K;
                if (rule->kind == TS_SELECT_THRESHOLD) {
                    /* the smallest prefix of the sorted probabilities reaching p */
                    double p[K], cum = 0.0;
                    softmax_ref(p, scores + b * K, K);
                    int used[K] = {0};
                    for (want = 0; want < K;) {
                        int best = -1;
                        for (int k = 0; k < K; k++)
                            if (!used[k] && (best < 0 || p[k] > p[best]))
                                best = k;
                        used[best] = 1;
                        cum += p[best];
                        want++;
                        if (cum >= rule->p - 1e-7)
                            break;
                    }
                }
                if (count_nonzero(w + b * K, K) != want) {
                    print_error("%s at t=%g, row %d: %d experts selected, want %d\n", sels[s],
                                (double)t, b, count_nonzero(w + b * K, K), want);
                    fail();
                }
                /* the selected are the largest scores: every selected ≥ every unselected */
                for (int i = 0; i < K; i++)
                    for (int j = 0; j < K; j++)
                        if (w[b * K + i] != 0.0f && w[b * K + j] == 0.0f)
                            assert_true(scores[b * K + i] >= scores[b * K + j]);
            }
        }
    }
}

static void test_selection_sets(void **state) {
    (void)state;
    enum { K = 5 };
    /* ties between experts 1 and 3 */
    const float scores[K] = {0.1f, 2.0f, 1.0f, 2.0f, -1.0f};
    double p[K];
    softmax_ref(p, scores, K);
    float w[K];
    ts_selection_t sel;

    sel = parse_ok("top1");
    memcpy(w, scores, sizeof w);
    TU_CHECK_OK(ts_route_weights(w, 1, K, &sel, 0.5f));
    float want1[K] = {0, 1, 0, 0, 0}; /* the tie goes to the lower index, exactly 1 */
    assert_memory_equal(w, want1, sizeof w);

    sel = parse_ok("top2");
    memcpy(w, scores, sizeof w);
    TU_CHECK_OK(ts_route_weights(w, 1, K, &sel, 0.5f));
    float want2[K] = {0, 0.5f, 0, 0.5f, 0};
    tu_check_close(w, want2, K, 1e-7, 0, "top2 over a tie");

    sel = parse_ok("top3");
    memcpy(w, scores, sizeof w);
    TU_CHECK_OK(ts_route_weights(w, 1, K, &sel, 0.5f));
    double z = p[1] + p[2] + p[3];
    float want3[K] = {0, (float)(p[1] / z), (float)(p[2] / z), (float)(p[3] / z), 0};
    tu_check_close(w, want3, K, 1e-7, 1e-6, "top3");

    sel = parse_ok("full");
    memcpy(w, scores, sizeof w);
    TU_CHECK_OK(ts_route_weights(w, 1, K, &sel, 0.5f));
    float wantf[K];
    for (int k = 0; k < K; k++)
        wantf[k] = (float)p[k];
    tu_check_close(w, wantf, K, 1e-7, 1e-6, "full = softmax");

    /* threshold over known probabilities 0.5, 0.3, 0.15, 0.05 (given out of order) */
    const float lp[4] = {logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f)};
    struct {
        const char *sel;
        float want[4];
    } th[] = {
        {"threshold=0.4", {0, 1, 0, 0}},
        {"threshold=0.7", {0, 0.625f, 0, 0.375f}},
        {"threshold=0.9", {0.15f / 0.95f, 0.5f / 0.95f, 0, 0.3f / 0.95f}},
        {"threshold=0.99", {0.15f, 0.5f, 0.05f, 0.3f}},
    };
    for (size_t i = 0; i < sizeof th / sizeof th[0]; i++) {
        sel = parse_ok(th[i].sel);
        memcpy(w, lp, sizeof lp);
        TU_CHECK_OK(ts_route_weights(w, 1, 4, &sel, 0.5f));
        tu_check_close(w, th[i].want, 4, 1e-6, 1e-5, "%s", th[i].sel);
    }

    /* all equal: top1 is expert 0, top2 experts 0 and 1, on every call */
    for (int rep = 0; rep < 3; rep++) {
        float eq[3] = {0.25f, 0.25f, 0.25f};
        sel = parse_ok("top2");
        TU_CHECK_OK(ts_route_weights(eq, 1, 3, &sel, 1.0f));
        float want_eq[3] = {0.5f, 0.5f, 0};
        assert_memory_equal(eq, want_eq, sizeof eq);
    }
    /* scores far apart (both probabilities round to 0 in the softmax) still rank by score */
    float far[3] = {-1000.0f, 0.0f, -900.0f};
    sel = parse_ok("top2");
    TU_CHECK_OK(ts_route_weights(far, 1, 3, &sel, 1.0f));
    assert_true(far[1] == 1.0f && far[0] == 0.0f && far[2] == 0.0f); /* selected with weight 0 */
    /* −inf is "never"; NaN and +inf are errors, and so is a row of −inf */
    float minf[3] = {-INFINITY, 1.0f, 0.0f};
    sel = parse_ok("full");
    TU_CHECK_OK(ts_route_weights(minf, 1, 3, &sel, 1.0f));
    assert_true(minf[0] == 0.0f);
    float bad[3] = {NAN, 1.0f, 0.0f};
    TU_CHECK_RC(ts_route_weights(bad, 1, 3, &sel, 1.0f), TS_ENONFINITE);
    float allinf[2] = {-INFINITY, -INFINITY};
    TU_CHECK_RC(ts_route_weights(allinf, 1, 2, &sel, 1.0f), TS_ENONFINITE);
    TU_CHECK_RC(ts_route_weights(w, 1, 0, &sel, 1.0f), TS_EINVAL);
    TU_CHECK_RC(ts_route_weights(w, 1, 3, NULL, 1.0f), TS_EINVAL);
}

/* ---- routing: parsing ------------------------------------------------------------------------ */

static void test_schedule_parse(void **state) {
    (void)state;
    ts_selection_t s = parse_ok("t>0.7:full,t>0.3:top2,top1");
    assert_int_equal(s.n_rules, 3);
    assert_int_equal(s.rules[0].kind, TS_SELECT_FULL);
    assert_true(s.rules[0].t_above == 0.7f);
    assert_int_equal(s.rules[1].kind, TS_SELECT_TOPK);
    assert_int_equal(s.rules[1].k, 2);
    assert_true(s.rules[2].t_above < 0.0f);
    assert_int_equal(s.rules[2].k, 1);
    /* the rule by t: strictly above a threshold; exactly at one falls to the next */
    assert_ptr_equal(ts_selection_rule(&s, 1.0f), &s.rules[0]);
    assert_ptr_equal(ts_selection_rule(&s, 0.71f), &s.rules[0]);
    assert_ptr_equal(ts_selection_rule(&s, 0.7f), &s.rules[1]);
    assert_ptr_equal(ts_selection_rule(&s, 0.5f), &s.rules[1]);
    assert_ptr_equal(ts_selection_rule(&s, 0.3f), &s.rules[2]);
    assert_ptr_equal(ts_selection_rule(&s, 0.0f), &s.rules[2]);
    /* and the weights follow the rule */
    float w[3] = {1.0f, 2.0f, 3.0f};
    TU_CHECK_OK(ts_route_weights(w, 1, 3, &s, 0.7f));
    assert_int_equal(count_nonzero(w, 3), 2);
    float w2[3] = {1.0f, 2.0f, 3.0f};
    TU_CHECK_OK(ts_route_weights(w2, 1, 3, &s, 0.7001f));
    assert_int_equal(count_nonzero(w2, 3), 3);
    char buf[128];
    assert_string_equal(ts_selection_format(&s, buf, sizeof buf), "t>0.7:full,t>0.3:top2,top1");
    s = parse_ok(" t>0.5 : threshold=0.9 , top3 ");
    assert_string_equal(ts_selection_format(&s, buf, sizeof buf), "t>0.5:threshold=0.9,top3");
    s = parse_ok("threshold=0.8");
    assert_int_equal(s.n_rules, 1);
    assert_int_equal(s.rules[0].kind, TS_SELECT_THRESHOLD);
    assert_true(s.rules[0].t_above < 0.0f);
    s = parse_ok("t>0:top2,top1"); /* t > 0: every step but the last point */
    assert_ptr_equal(ts_selection_rule(&s, 0.0f), &s.rules[1]);
    assert_ptr_equal(ts_selection_rule(&s, 0.01f), &s.rules[0]);

    ts_policy_t p;
    const char *names[] = {"learned", "centroid", "confidence", "uniform"};
    for (int i = 0; i < 4; i++) {
        TU_CHECK_OK(ts_policy_parse(names[i], &p));
        assert_int_equal(p, i);
        assert_string_equal(ts_policy_name(p), names[i]);
    }
    TU_CHECK_RC(ts_policy_parse("Learned", &p), TS_EINVAL);
    TU_CHECK_RC(ts_policy_parse("", &p), TS_EINVAL);
}

static void test_schedule_malformed(void **state) {
    (void)state;
    struct {
        const char *text, *needle;
    } bad[] = {
        {"", "empty rule"},
        {"top0", "top0"},
        {"top", "'top'"},
        {"topx", "topx"},
        {"top1x", "top1x"},
        {"top-1", "top-1"},
        {"fll", "fll"},
        {"threshold=0", "threshold=0"},
        {"threshold=1.5", "threshold=1.5"},
        {"threshold=", "threshold="},
        {"threshold=nan", "threshold=nan"},
        {"t>0.7:full", "last rule"},
        {"top1,top2", "'top1'"},
        {"t>0.7:fll,top1", "fll"},
        {"t>0.5full,top1", "t>0.5full"},
        {"t>abc:full,top1", "t>abc"},
        {"t>1.2:full,top1", "t>1.2"},
        {"t>-0.1:full,top1", "t>-0.1"},
        {"t>0.3:top2,t>0.7:full,top1", "t>0.7"},
        {"t>0.5:top2,t>0.5:full,top1", "t>0.5"},
        {"t>0.7:full,,top1", "empty rule"},
        {"top1,", "empty rule"},
        {"t>0.9:top1,t>0.8:top1,t>0.7:top1,t>0.6:top1,t>0.5:top1,t>0.4:top1,t>0.3:top1,"
         "t>0.2:top1,top1",
         "more than 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_selection_t s;
        memset(&s, 0x5a, sizeof s);
        ts_selection_t before = s;
        err[0] = '\0';
        int rc = ts_selection_parse(bad[i].text, &s, err, sizeof err);
        if (rc != TS_EINVAL) {
            print_error("'%s' was accepted (rc %d)\n", bad[i].text, rc);
            fail();
        }
        TU_CHECK_CONTAINS(err, bad[i].needle);
        assert_memory_equal(&s, &before, sizeof s); /* untouched on failure */
    }
    TU_CHECK_RC(ts_selection_parse(NULL, NULL, err, sizeof err), TS_EINVAL);
}

static void test_sq_dist(void **state) {
    (void)state;
    const float e[2 * 3] = {0, 0, 0, 1, 2, 3};
    const float c[2 * 3] = {1, 1, 1, 1, 2, 5};
    float d[4];
    ts_route_sq_dist(d, e, c, 2, 2, 3);
    const float want[4] = {3, 30, 5, 4};
    assert_memory_equal(d, want, sizeof d);
    /* in double: a large offset does not swamp a small difference */
    const float e2[1] = {16777216.0f}, c2[1] = {16777218.0f};
    ts_route_sq_dist(d, e2, c2, 1, 1, 1);
    assert_true(d[0] == 4.0f);
}

/* ---- the ensemble: fixtures ------------------------------------------------------------------ */

#define IMG 8
#define CHW (IMG * IMG)
#define NCLS 3
#define MAXB 16

typedef struct {
    ts_engine_t e;
} fixture_t;

static int setup(void **state) {
    fixture_t *fx = calloc(1, sizeof *fx);
    if (!fx || tu_engine_init_cpu(&fx->e) != TS_OK || tu_setup_temp_dir(NULL) != 0) {
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    fixture_t *fx = *state;
    ts_engine_free(&fx->e);
    free(fx);
    return tu_teardown_temp_dir(NULL);
}

static void tiny_config(ts_dit_config_t *c) {
    *c = (ts_dit_config_t){.input_size = IMG,
                           .in_channels = 1,
                           .patch_size = 2,
                           .hidden_size = 32,
                           .depth = 1,
                           .num_heads = 2,
                           .num_classes = NCLS,
                           .mlp_ratio = 2,
                           .freq_dim = 32};
}

/* Writes a random expert to name in the temp folder: DiT init, then every parameter perturbed
 * (so the output depends on x, t and y). perturb = 0 keeps the DiT init, whose output is 0. */
static const char *write_expert_meta(ts_engine_t *e, const char *name, uint64_t seed, float perturb,
                                     const char *key, const char *value);

static const char *write_expert(ts_engine_t *e, const char *name, uint64_t seed, float perturb,
                                const char *cluster) {
    return write_expert_meta(e, name, seed, perturb, cluster ? "cluster" : NULL, cluster);
}

/* As write_expert, with one metadata pair (key NULL: none). */
static const char *write_expert_meta(ts_engine_t *e, const char *name, uint64_t seed, float perturb,
                                     const char *key, const char *value) {
    ts_dit_config_t cfg;
    tiny_config(&cfg);
    ts_dit_t m;
    TU_CHECK_OK(ts_dit_create(&m, &cfg, e, 1, 0));
    TU_CHECK_OK(ts_dit_init_weights(&m, seed));
    if (perturb > 0.0f) {
        tu_rng_t r = {seed * 7919 + 1};
        float *p = tu_f32(&m.param_mem);
        for (int64_t i = 0; i < m.num_params; i++)
            p[i] += tu_rng_uniform(&r, -perturb, perturb);
    }
    const char *extra[2] = {key, value};
    const char *path = tu_temp_path(name);
    TU_CHECK_RC_MSG(
        ts_dit_save(&m, &m.param_mem, path, TS_ST_F32, extra, key ? 1 : 0, err, sizeof err), TS_OK,
        err);
    ts_dit_free(&m);
    return path;
}

static void open_experts(ts_experts_t *x, ts_engine_t *e, const char *const *paths, int K) {
    err[0] = '\0';
    TU_CHECK_RC_MSG(ts_experts_open(x, paths, K, e, MAXB, err, sizeof err), TS_OK, err);
}

/* The stub router: logits[b, k] = 4·Σ_j x[b, j]·P[k, j] / √CHW + (k − 1)·t, P a fixed random
 * projection. Depends on each sample alone, so samples spread over the experts. */
typedef struct {
    int K;
    float proj[8 * CHW];
    int calls;
} stub_router_t;

static void stub_init(stub_router_t *r, int K) {
    tu_rng_t g = {1234};
    r->K = K;
    r->calls = 0;
    for (int i = 0; i < K * CHW; i++)
        r->proj[i] = tu_rng_uniform(&g, -1.0f, 1.0f);
}

static int stub_router(void *ctx, const ts_tensor_t *x, float t, const int32_t *labels, int B,
                       float *logits) {
    stub_router_t *r = ctx;
    (void)labels;
    const float *xs = x->data;
    r->calls++;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < r->K; k++) {
            double s = 0.0;
            for (int j = 0; j < CHW; j++)
                s += (double)xs[b * CHW + j] * r->proj[k * CHW + j];
            logits[b * r->K + k] = (float)(4.0 * s / sqrt((double)CHW)) + (float)(k - 1) * t;
        }
    return TS_OK;
}

/* A hand-made partition for 8×8 images: embedding = (mean pixel, mean of the top half), the
 * given centroids. The buffers are static: one partition at a time. */
static float part_basis[2 * CHW], part_mean[CHW], part_centroids[8 * 2];
static ts_partition_t make_partition(int K, const float *centroids) {
    for (int j = 0; j < CHW; j++) {
        part_basis[j] = 1.0f / CHW;
        part_basis[CHW + j] = j < CHW / 2 ? 2.0f / CHW : 0.0f;
        part_mean[j] = 0.0f;
    }
    memcpy(part_centroids, centroids, (size_t)K * 2 * sizeof(float));
    ts_partition_t p;
    memset(&p, 0, sizeof p);
    p.K = K;
    p.k = 2;
    p.D = CHW;
    p.basis = part_basis;
    p.mean = part_mean;
    p.centroids = part_centroids;
    return p;
}

/* Samples n images with the ensemble (sample i: noise stream seed0 + i), into out (n·CHW). */
static void sample_ensemble(ts_engine_t *e, ts_dit_t *experts, int K, ts_ensemble_opts_t o,
                            uint64_t seed0, ts_sampler_kind_t kind, int steps, float *out,
                            double *evals) {
    ts_ensemble_t ens;
    err[0] = '\0';
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, e, experts, K, &o, err, sizeof err), TS_OK, err);
    ts_tensor_t x, scratch[3];
    tu_alloc_f32(&x, 4, TS_SHAPE(o.n, 1, IMG, IMG));
    for (int i = 0; i < 3; i++)
        tu_alloc_like(&scratch[i], &x);
    uint64_t seeds[MAXB];
    for (int i = 0; i < o.n; i++)
        seeds[i] = seed0 + (uint64_t)i;
    TU_CHECK_OK(ts_sampler_noise(e, &x, seeds));
    ts_sampler_opts_t so = {.kind = kind, .steps = steps};
    TU_CHECK_OK(ts_sampler_run(e, &so, &x, scratch, ts_ensemble_velocity, &ens, NULL, NULL));
    memcpy(out, tu_f32(&x), (size_t)o.n * CHW * sizeof(float));
    if (evals)
        *evals = ts_ensemble_evals_per_sample(&ens);
    TU_FREE_TENSORS(&x, &scratch[0], &scratch[1], &scratch[2]);
    ts_ensemble_free(&ens);
}

/* The same with one expert through ts_dit_velocity (what `tessera sample` runs). */
static void sample_single(ts_engine_t *e, ts_dit_t *m, const int32_t *labels, int n, float cfg,
                          uint64_t seed0, ts_sampler_kind_t kind, int steps, float *out) {
    ts_dit_velocity_ctx_t vc;
    TU_CHECK_OK(ts_dit_velocity_init(&vc, m, labels, n, cfg));
    ts_tensor_t x, scratch[3];
    tu_alloc_f32(&x, 4, TS_SHAPE(n, 1, IMG, IMG));
    for (int i = 0; i < 3; i++)
        tu_alloc_like(&scratch[i], &x);
    uint64_t seeds[MAXB];
    for (int i = 0; i < n; i++)
        seeds[i] = seed0 + (uint64_t)i;
    TU_CHECK_OK(ts_sampler_noise(e, &x, seeds));
    ts_sampler_opts_t so = {.kind = kind, .steps = steps};
    TU_CHECK_OK(ts_sampler_run(e, &so, &x, scratch, ts_dit_velocity, &vc, NULL, NULL));
    memcpy(out, tu_f32(&x), (size_t)n * CHW * sizeof(float));
    TU_FREE_TENSORS(&x, &scratch[0], &scratch[1], &scratch[2]);
    ts_dit_velocity_free(&vc);
}

static ts_ensemble_opts_t base_opts(const char *select, ts_policy_t policy, const int32_t *labels,
                                    int n, float cfg) {
    ts_ensemble_opts_t o;
    memset(&o, 0, sizeof o);
    o.policy = policy;
    o.select = parse_ok(select);
    o.tau = 1.0f;
    o.cfg_scale = cfg;
    o.labels = labels;
    o.n = n;
    return o;
}

/* ---- the ensemble: tests --------------------------------------------------------------------- */

/* the remote experts' hook (below, "remote experts") */
typedef struct hook {
    ts_engine_t *e;
    ts_dit_t *models;
    int fail_k, calls, jobs;
} hook_t;
static int hook(void *ctx, ts_expert_job_t *jobs, int n);

/* A flow expert and an ε-expert (the same weights, metadata objective "epsilon") in one ensemble,
 * full uniform routing: v = ½·v_flow + ½·convert(ε̂), where the ε-expert is asked at (c·x_t, its
 * step of equal SNR / 1000) and its guided answer converted (model/objective.h) — computed here
 * by hand from ts_dit_velocity and the conversion functions. Then the refusals. */
static void test_mixed_objectives(void **state) {
    fixture_t *fx = *state;
    enum { N = 3 };
    char flow[512], eps[512]; /* the temp path is one buffer: copied */
    snprintf(flow, sizeof flow, "%s",
             write_expert_meta(&fx->e, "flow.safetensors", 11, 0.05f, "objective", "velocity"));
    snprintf(eps, sizeof eps, "%s",
             write_expert_meta(&fx->e, "eps.safetensors", 11, 0.05f, "objective", "epsilon"));
    const char *paths[2] = {flow, eps};
    ts_experts_t ex;
    open_experts(&ex, &fx->e, paths, 2);
    assert_int_equal(ex.objective[0], TS_OBJ_VELOCITY);
    assert_int_equal(ex.objective[1], TS_OBJ_EPSILON);
    ts_ddpm_schedule_t sched;
    TU_CHECK_OK(ts_ddpm_linear(&sched, 1000, 1e-4, 0.02));
    const int32_t labels[N] = {0, 1, NCLS}; /* the last one unconditional */
    ts_tensor_t x, xs, v, v1, f;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_like(&xs, &x), tu_alloc_like(&v, &x), tu_alloc_like(&v1, &x), tu_alloc_like(&f, &x);
    tu_rng_t r = {99};
    for (int64_t i = 0; i < N * CHW; i++)
        tu_f32(&x)[i] = tu_rng_uniform(&r, -1.5f, 1.5f);
    const float t = 0.6f, cfgs[2] = {1.0f, 2.0f};
    for (int c = 0; c < 2; c++) {
        ts_ensemble_opts_t o = base_opts("full", TS_POLICY_UNIFORM, labels, N, cfgs[c]);
        o.objectives = ex.objective;
        ts_ensemble_t ens;
        TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, 2, &o, err, sizeof err), TS_OK,
                        err);
        TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, t, &v));
        ts_ensemble_free(&ens);
        /* by hand */
        double step, abar, scale;
        (void)ts_ddpm_from_flow(&sched, t, &step, &abar, &scale);
        ts_dit_velocity_ctx_t vc;
        TU_CHECK_OK(ts_dit_velocity_init(&vc, &ex.models[0], labels, N, cfgs[c]));
        TU_CHECK_OK(ts_dit_velocity(&vc, &x, t, &v1));
        ts_dit_velocity_free(&vc);
        for (int64_t i = 0; i < N * CHW; i++)
            tu_f32(&xs)[i] = (float)scale * tu_f32(&x)[i];
        TU_CHECK_OK(ts_dit_velocity_init(&vc, &ex.models[1], labels, N, cfgs[c]));
        TU_CHECK_OK(ts_dit_velocity(&vc, &xs, (float)(step / 1000.0), &f));
        ts_dit_velocity_free(&vc);
        float *want = tu_f32(&f);
        TU_CHECK_OK(ts_objective_to_velocity(TS_OBJ_EPSILON, t, abar, scale, tu_f32(&x), want, want,
                                             N * CHW));
        for (int64_t i = 0; i < N * CHW; i++)
            want[i] = 0.5f * tu_f32(&v1)[i] + 0.5f * want[i];
        tu_check_close(tu_f32(&v), want, N * CHW, 1e-5, 1e-5, "flow + converted epsilon");
        /* the same through the remote hook (a server computes the ε-expert's raw answer at the
         * scaled input and DDPM time; the client converts): the local bits */
        hook_t h = {.e = &fx->e, .models = ex.models, .fail_k = -1};
        o.eval = hook, o.eval_ctx = &h, o.config = &ex.models[0].cfg;
        ts_tensor_t vr;
        tu_alloc_like(&vr, &x);
        TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, NULL, 2, &o, err, sizeof err), TS_OK, err);
        TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, t, &vr));
        ts_ensemble_free(&ens);
        assert_int_equal(h.jobs, 2);
        assert_memory_equal(tu_f32(&vr), tu_f32(&v), sizeof(float) * N * CHW);
        ts_tensor_free(&vr);
        /* and it is not the ε-expert's raw answer mixed in: the conversion matters */
        double diff = 0.0;
        for (int64_t i = 0; i < N * CHW; i++)
            diff += fabs((double)tu_f32(&v)[i] - 0.5 * (tu_f32(&v1)[i] + tu_f32(&f)[i]));
        assert_true(diff > 1e-3);
    }
    /* the refusal: the confidence policy */
    ts_partition_t part = make_partition(2, (const float[4]){0, 0, 1, 1});
    ts_ensemble_opts_t o = base_opts("full", TS_POLICY_CONFIDENCE, labels, N, 1.0f);
    o.partition = &part;
    o.objectives = ex.objective;
    ts_ensemble_t ens;
    assert_int_equal(ts_ensemble_init(&ens, &fx->e, ex.models, 2, &o, err, sizeof err), TS_ENOTSUP);
    TU_CHECK_CONTAINS(err, "DDPM objective");
    /* an objective no one knows is refused when the file is opened */
    const char *bad[1] = {
        write_expert_meta(&fx->e, "bad.safetensors", 11, 0.0f, "objective", "score")};
    ts_experts_t none;
    assert_int_equal(ts_experts_open(&none, bad, 1, &fx->e, MAXB, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "objective 'score'");
    ts_tensor_free(&x), ts_tensor_free(&xs), ts_tensor_free(&v), ts_tensor_free(&v1);
    ts_tensor_free(&f);
    ts_experts_free(&ex);
}

/* top1 over K copies of one expert = that expert alone: bit for bit when every sample goes to
 * expert 0 (uniform scores, ties to the lowest index; also K = 1, `tessera sample`'s path), and
 * to 1e-6 when a router spreads the samples over the copies (other batch compositions). */
static void test_top1_identical_equals_single(void **state) {
    fixture_t *fx = *state;
    enum { N = 5, STEPS = 4 };
    const char *path = write_expert(&fx->e, "e.safetensors", 7, 0.05f, NULL);
    const char *paths[3] = {path, path, path};
    int32_t labels[N] = {0, 1, 2, NCLS, 1};
    float want[N * CHW], got[N * CHW];
    ts_experts_t one, three;
    open_experts(&one, &fx->e, paths, 1);
    open_experts(&three, &fx->e, paths, 3);
    for (int kind = 0; kind < 2; kind++) {
        sample_single(&fx->e, &one.models[0], labels, N, 2.5f, 100, kind, STEPS, want);
        ts_ensemble_opts_t o = base_opts("top1", TS_POLICY_UNIFORM, labels, N, 2.5f);
        sample_ensemble(&fx->e, one.models, 1, o, 100, kind, STEPS, got, NULL);
        assert_memory_equal(got, want, sizeof got);
        sample_ensemble(&fx->e, three.models, 3, o, 100, kind, STEPS, got, NULL);
        assert_memory_equal(got, want, sizeof got);
        stub_router_t r;
        stub_init(&r, 3);
        o.policy = TS_POLICY_LEARNED;
        o.router = stub_router;
        o.router_ctx = &r;
        sample_ensemble(&fx->e, three.models, 3, o, 100, kind, STEPS, got, NULL);
        tu_check_close(got, want, N * CHW, 1e-6, 1e-6, "learned top1 over copies, %s",
                       kind ? "heun" : "euler");
        assert_true(r.calls == STEPS * (kind ? 2 : 1));
    }
    /* and without guidance */
    sample_single(&fx->e, &one.models[0], labels, N, 1.0f, 5, TS_SAMPLER_EULER, STEPS, want);
    ts_ensemble_opts_t o = base_opts("top1", TS_POLICY_UNIFORM, labels, N, 1.0f);
    sample_ensemble(&fx->e, three.models, 3, o, 5, TS_SAMPLER_EULER, STEPS, got, NULL);
    assert_memory_equal(got, want, sizeof got);
    ts_experts_free(&one);
    ts_experts_free(&three);
}

/* ---- remote experts: the ensemble's hook ---------------------------------------------------- */

/* A hook that computes the jobs with the same experts in this process through
 * ts_expert_job_run (what a server and a client's fallback run) — in reverse order, to show that
 * the order of completion does not matter — and fails the jobs of expert `fail_k` (−1: none,
 * −2: all). */
static int hook(void *ctx, ts_expert_job_t *jobs, int n) {
    hook_t *h = ctx;
    h->calls++;
    for (int i = n - 1; i >= 0; i--) {
        h->jobs++;
        jobs[i].status = (jobs[i].k == h->fail_k || h->fail_k == -2)
                             ? TS_ETIMEDOUT
                             : ts_expert_job_run(&h->models[jobs[i].k], &jobs[i]);
    }
    return TS_OK;
}

/* The hook's answers, equal to the local ones, give the local result bit for bit; a failed
 * expert is dropped and its samples renormalised onto the others. */
static void test_remote_hook(void **state) {
    fixture_t *fx = *state;
    enum { N = 6, K = 3, STEPS = 3 };
    char p[K][512];
    for (int k = 0; k < K; k++) {
        char name[32];
        snprintf(name, sizeof name, "r%d.safetensors", k);
        snprintf(p[k], sizeof p[k], "%s",
                 write_expert(&fx->e, name, 11 + (uint64_t)k, 0.08f, NULL));
    }
    const char *paths[K] = {p[0], p[1], p[2]};
    ts_experts_t ex;
    open_experts(&ex, &fx->e, paths, K);
    int32_t labels[N] = {0, 1, 2, 0, NCLS, 2};
    stub_router_t r;
    stub_init(&r, K);
    float want[N * CHW], got[N * CHW];
    for (int c = 0; c < 2; c++) {
        float cfg = c ? 1.0f : 1.5f;
        ts_ensemble_opts_t o = base_opts("t>0.5:top2,top1", TS_POLICY_LEARNED, labels, N, cfg);
        o.router = stub_router;
        o.router_ctx = &r;
        sample_ensemble(&fx->e, ex.models, K, o, 60, TS_SAMPLER_HEUN, STEPS, want, NULL);
        hook_t h = {.e = &fx->e, .models = ex.models, .fail_k = -1};
        o.eval = hook;
        o.eval_ctx = &h;
        o.config = &ex.models[0].cfg;
        sample_ensemble(&fx->e, NULL, K, o, 60, TS_SAMPLER_HEUN, STEPS, got, NULL);
        assert_memory_equal(got, want, sizeof got);
        assert_int_equal(h.calls, 2 * STEPS); /* Heun: two evaluations per step */
        assert_true(h.jobs >= h.calls);
    }
    /* Two copies of one expert, uniform full: dropping one leaves the other at weight 1, which
     * is that expert alone, exactly. */
    const char *two[2] = {p[0], p[0]};
    ts_experts_t pair;
    open_experts(&pair, &fx->e, two, 2);
    sample_single(&fx->e, &pair.models[0], labels, N, 1.5f, 70, TS_SAMPLER_EULER, STEPS, want);
    hook_t h = {.e = &fx->e, .models = pair.models, .fail_k = 1};
    ts_ensemble_opts_t o = base_opts("full", TS_POLICY_UNIFORM, labels, N, 1.5f);
    o.eval = hook;
    o.eval_ctx = &h;
    o.config = &pair.models[0].cfg;
    ts_ensemble_t ens;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, NULL, 2, &o, err, sizeof err), TS_OK, err);
    ts_tensor_t x, scratch[3];
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    for (int i = 0; i < 3; i++)
        tu_alloc_like(&scratch[i], &x);
    uint64_t seeds[N];
    for (int i = 0; i < N; i++)
        seeds[i] = 70 + (uint64_t)i;
    TU_CHECK_OK(ts_sampler_noise(&fx->e, &x, seeds));
    ts_sampler_opts_t so = {.kind = TS_SAMPLER_EULER, .steps = STEPS};
    TU_CHECK_OK(ts_sampler_run(&fx->e, &so, &x, scratch, ts_ensemble_velocity, &ens, NULL, NULL));
    assert_memory_equal(tu_f32(&x), want, sizeof want);
    assert_int_equal(ens.dropped, STEPS);
    assert_int_equal(ens.renormalised, (int64_t)N * STEPS);
    /* top1, its expert failing: the samples move to the next best, the other copy, exactly */
    h.fail_k = 0;
    ts_ensemble_opts_t o1 = base_opts("top1", TS_POLICY_UNIFORM, labels, N, 1.5f);
    o1.eval = hook;
    o1.eval_ctx = &h;
    o1.config = &pair.models[0].cfg;
    ts_ensemble_t e1;
    TU_CHECK_RC_MSG(ts_ensemble_init(&e1, &fx->e, NULL, 2, &o1, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_sampler_noise(&fx->e, &x, seeds));
    TU_CHECK_OK(ts_sampler_run(&fx->e, &so, &x, scratch, ts_ensemble_velocity, &e1, NULL, NULL));
    assert_memory_equal(tu_f32(&x), want, sizeof want);
    assert_int_equal(e1.expert_forwards[0], 0);
    assert_int_equal(e1.expert_forwards[1], 2 * N * STEPS);
    /* every expert failing leaves the samples with nothing: the step fails, it is not faked */
    h.fail_k = -2;
    assert_int_equal(ts_ensemble_velocity(&e1, &x, 1.0f, &scratch[0]), TS_EPEER);
    /* the confidence policy is refused with remote experts */
    ts_partition_t part = make_partition(2, (const float[4]){0, 0, 1, 1});
    o1.policy = TS_POLICY_CONFIDENCE;
    o1.partition = &part;
    ts_ensemble_t e2;
    assert_int_equal(ts_ensemble_init(&e2, &fx->e, NULL, 2, &o1, err, sizeof err), TS_ENOTSUP);
    ts_ensemble_free(&e1);
    ts_ensemble_free(&ens);
    TU_FREE_TENSORS(&x, &scratch[0], &scratch[1], &scratch[2]);
    ts_experts_free(&pair);
    ts_experts_free(&ex);
}

/* An ensemble over n samples = n ensembles over one sample each, for the policies that route
 * per sample. The routing must actually spread the samples (checked through the counters). */
static void test_grouping_equals_one_by_one(void **state) {
    fixture_t *fx = *state;
    enum { N = 6, K = 3, STEPS = 3 };
    const char *paths[K] = {write_expert(&fx->e, "a.safetensors", 1, 0.08f, NULL), NULL, NULL};
    char p0[512];
    snprintf(p0, sizeof p0, "%s", paths[0]);
    paths[0] = p0;
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s", write_expert(&fx->e, "b.safetensors", 2, 0.08f, NULL));
    snprintf(p2, sizeof p2, "%s", write_expert(&fx->e, "c.safetensors", 3, 0.08f, NULL));
    paths[1] = p1;
    paths[2] = p2;
    ts_experts_t ex;
    open_experts(&ex, &fx->e, paths, K);
    int32_t labels[N] = {0, 1, 2, 0, NCLS, 2};
    const float cents[K * 2] = {-0.4f, -0.4f, 0.0f, 0.3f, 0.4f, -0.1f};
    ts_partition_t part = make_partition(K, cents);
    stub_router_t r;
    stub_init(&r, K);
    struct {
        ts_policy_t policy;
        const char *select;
    } cases[] = {
        {TS_POLICY_LEARNED, "t>0.5:top2,top1"},
        {TS_POLICY_CENTROID, "top1"},
        {TS_POLICY_CENTROID, "threshold=0.8"},
        {TS_POLICY_CONFIDENCE, "top2"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ts_ensemble_opts_t o = base_opts(cases[c].select, cases[c].policy, labels, N, 1.5f);
        o.router = stub_router;
        o.router_ctx = &r;
        o.partition = &part;
        o.tau = 0.05f;
        float all[N * CHW], one[CHW];
        ts_ensemble_t probe;
        TU_CHECK_RC_MSG(ts_ensemble_init(&probe, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK,
                        err);
        /* the batch run, keeping the ensemble to read its counters */
        ts_tensor_t x, scratch[3];
        tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
        for (int i = 0; i < 3; i++)
            tu_alloc_like(&scratch[i], &x);
        uint64_t seeds[N];
        for (int i = 0; i < N; i++)
            seeds[i] = 40 + (uint64_t)i;
        TU_CHECK_OK(ts_sampler_noise(&fx->e, &x, seeds));
        ts_sampler_opts_t so = {.kind = TS_SAMPLER_HEUN, .steps = STEPS};
        TU_CHECK_OK(
            ts_sampler_run(&fx->e, &so, &x, scratch, ts_ensemble_velocity, &probe, NULL, NULL));
        memcpy(all, tu_f32(&x), sizeof all);
        int used = 0;
        for (int k = 0; k < K; k++)
            used += probe.expert_forwards[k] > 0;
        if (cases[c].policy != TS_POLICY_CONFIDENCE && used < 2) {
            print_error("case %zu: the routing sent every sample to one expert; the test proves "
                        "nothing\n",
                        c);
            fail();
        }
        TU_FREE_TENSORS(&x, &scratch[0], &scratch[1], &scratch[2]);
        ts_ensemble_free(&probe);
        for (int i = 0; i < N; i++) {
            ts_ensemble_opts_t o1 = o;
            o1.labels = labels + i;
            o1.n = 1;
            sample_ensemble(&fx->e, ex.models, K, o1, 40 + (uint64_t)i, TS_SAMPLER_HEUN, STEPS, one,
                            NULL);
            tu_check_close(one, all + i * CHW, CHW, 1e-5, 1e-5, "case %zu (%s, %s), sample %d", c,
                           ts_policy_name(o.policy), cases[c].select, i);
        }
    }
    ts_experts_free(&ex);
}

/* K experts written as PREFIX<k>.safetensors from seeds seed0 + k, opened into ex. */
static void open_written_experts(fixture_t *fx, ts_experts_t *ex, const char *prefix,
                                 uint64_t seed0, int K) {
    char p[8][512];
    const char *paths[8];
    assert_true(K <= 8);
    for (int k = 0; k < K; k++) {
        char name[32];
        snprintf(name, sizeof name, "%s%d.safetensors", prefix, k);
        snprintf(p[k], sizeof p[k], "%s",
                 write_expert(&fx->e, name, seed0 + (uint64_t)k, 0.05f, NULL));
        paths[k] = p[k];
    }
    open_experts(ex, &fx->e, paths, K);
}

/* mean += (1/div) · expert k's guided velocity at (x, t), for each k with use[k]. */
static void add_mean(ts_experts_t *ex, const int *use, const int32_t *labels, int n,
                     const ts_tensor_t *x, float t, ts_tensor_t *vk, float *mean, int div) {
    for (int k = 0; k < ex->K; k++) {
        if (!use[k])
            continue;
        ts_dit_velocity_ctx_t vc;
        TU_CHECK_OK(ts_dit_velocity_init(&vc, &ex->models[k], labels, n, 3.0f));
        TU_CHECK_OK(ts_dit_velocity(&vc, x, t, vk));
        for (int64_t i = 0; i < ts_tensor_numel(x); i++)
            mean[i] += tu_f32(vk)[i] / div;
        ts_dit_velocity_free(&vc);
    }
}

/* full + uniform = the plain mean of the experts' guided velocities. */
static void test_full_uniform_is_mean(void **state) {
    fixture_t *fx = *state;
    enum { N = 4, K = 3 };
    ts_experts_t ex;
    open_written_experts(fx, &ex, "m", 20, K);
    int32_t labels[N] = {2, 0, NCLS, 1};
    ts_tensor_t x, v, vk;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_like(&v, &x);
    tu_alloc_like(&vk, &x);
    tu_rng_t r = {9};
    tu_fill_uniform(&r, &x, -2.0f, 2.0f);
    float mean[N * CHW] = {0};
    const int all[K] = {1, 1, 1};
    add_mean(&ex, all, labels, N, &x, 0.6f, &vk, mean, K);
    ts_ensemble_opts_t o = base_opts("full", TS_POLICY_UNIFORM, labels, N, 3.0f);
    o.record = 1;
    ts_ensemble_t ens;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.6f, &v));
    tu_check_close(tu_f32(&v), mean, N * CHW, 1e-6, 1e-5, "full uniform vs the mean");
    assert_int_equal(ens.n_steps, 1);
    assert_true(ens.steps[0].t == 0.6f);
    for (int i = 0; i < N * K; i++)
        tu_check_scalar(ens.steps[0].w[i], 1.0 / 3.0, 1e-7, "weight %d", i);
    /* the same through the per-expert sum of the centroid-free confidence path is not defined
     * without a partition: init refuses it */
    ts_ensemble_t bad;
    o.policy = TS_POLICY_CONFIDENCE;
    TU_CHECK_RC(ts_ensemble_init(&bad, &fx->e, ex.models, K, &o, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "partition");
    TU_FREE_TENSORS(&x, &v, &vk);
    ts_ensemble_free(&ens);
    ts_experts_free(&ex);
}

/* DiT's learned variance through the ensemble: an expert with learn_sigma beside one without,
 * full uniform routing with guidance — the ensemble's variance output is ½·v_σ(cond rows of the
 * learned one's forward) + ½·(−1) (the one without stands for β̃), as computed here from the
 * expert alone; an ensemble without a learned σ, or with exact guidance, has none. */
static void test_learned_variance(void **state) {
    fixture_t *fx = *state;
    enum { N = 4 };
    ts_dit_config_t c;
    tiny_config(&c);
    ts_dit_t m[2];
    c.learn_sigma = 1;
    TU_CHECK_OK(ts_dit_create(&m[0], &c, &fx->e, 2 * N, 0));
    c.learn_sigma = 0;
    TU_CHECK_OK(ts_dit_create(&m[1], &c, &fx->e, 2 * N, 0));
    for (int k = 0; k < 2; k++) {
        TU_CHECK_OK(ts_rng_normal(&fx->e, &m[k].param_mem, 31 + (uint64_t)k, 0));
        TU_CHECK_OK(ts_scale(&fx->e, &m[k].param_mem, 0.1f));
    }
    int32_t labels[N] = {2, 0, NCLS, 1}, yy[2 * N];
    ts_tensor_t x, v, sig, xx, tt, out, alone;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_like(&v, &x);
    tu_alloc_like(&sig, &x);
    tu_alloc_f32(&xx, 4, TS_SHAPE(2 * N, 1, IMG, IMG));
    tu_alloc_f32(&tt, 1, TS_SHAPE(2 * N));
    tu_rng_t r = {19};
    tu_fill_uniform(&r, &x, -2.0f, 2.0f);
    ts_ensemble_opts_t o = base_opts("full", TS_POLICY_UNIFORM, labels, N, 3.0f);
    ts_ensemble_t ens;
    /* not asked for (a DDIM run): none kept */
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, m, 2, &o, err, sizeof err), TS_OK, err);
    assert_false(ts_ensemble_has_variance(&ens));
    ts_ensemble_free(&ens);
    o.variance = 1;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, m, 2, &o, err, sizeof err), TS_OK, err);
    assert_true(ts_ensemble_has_variance(&ens));
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.6f, &v));
    TU_CHECK_OK(ts_ensemble_variance(&ens, &sig));
    /* the learned expert alone on [x; x] with labels [y; ∅] */
    memcpy(tu_f32(&xx), tu_f32(&x), N * CHW * sizeof(float));
    memcpy(tu_f32(&xx) + N * CHW, tu_f32(&x), N * CHW * sizeof(float));
    for (int i = 0; i < N; i++)
        yy[i] = labels[i], yy[N + i] = NCLS;
    TU_CHECK_OK(ts_fill(&fx->e, &tt, 0.6f));
    TU_CHECK_OK(ts_dit_forward(&m[0], &xx, &tt, yy, 2 * N, &out));
    TU_CHECK_OK(ts_dit_sigma(&m[0], 2 * N, &alone));
    float want[N * CHW], sig0[N * CHW]; /* sig0: the conditional rows, kept (alone is a view) */
    memcpy(sig0, tu_f32(&alone), sizeof sig0);
    double spread = 0.0;
    for (int i = 0; i < N * CHW; i++) {
        want[i] = 0.0f + 0.5f * tu_f32(&alone)[i]; /* the rows 0..N−1: the conditional pass */
        want[i] -= 0.5f;
        spread = fmax(spread, fabs((double)tu_f32(&alone)[i]));
    }
    assert_true(spread > 1e-3); /* the variance output is not trivially 0 */
    tu_check_close(tu_f32(&sig), want, N * CHW, 1e-6, 1e-6, "combined variance output");
    ts_ensemble_free(&ens);
    /* The confidence policy runs every expert on all the samples before it weights them: the
     * variance is then w_0·v_σ − w_1 with the weights it chose (recorded), from that forward. */
    ts_partition_t part = make_partition(2, (const float[4]){0, 0, 1, 1});
    ts_ensemble_opts_t oc = o;
    oc.policy = TS_POLICY_CONFIDENCE;
    oc.partition = &part;
    oc.record = 1;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, m, 2, &oc, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.6f, &v));
    TU_CHECK_OK(ts_ensemble_variance(&ens, &sig));
    assert_int_equal(ens.n_steps, 1);
    const float *w = ens.steps[0].w;
    int uneven = 0;
    for (int i = 0; i < N; i++) {
        uneven |= fabsf(w[2 * i] - 0.5f) > 1e-3f;
        for (int j = 0; j < CHW; j++)
            want[i * CHW + j] = w[2 * i] * sig0[i * CHW + j] - w[2 * i + 1];
    }
    assert_true(uneven); /* the weights are the policy's, not ½ each */
    tu_check_close(tu_f32(&sig), want, N * CHW, 1e-6, 1e-6, "confidence-weighted variance");
    ts_ensemble_free(&ens);
    /* The same through the remote hook (what the network client does): the jobs of the learned
     * expert ask for its variance (with_sigma, told by opts.learn_sigma as adverts tell it), the
     * other's do not, and velocity and variance equal the local ones bit for bit. */
    float v_local[N * CHW], sig_local[N * CHW];
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, m, 2, &o, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.6f, &v));
    TU_CHECK_OK(ts_ensemble_variance(&ens, &sig));
    memcpy(v_local, tu_f32(&v), sizeof v_local);
    memcpy(sig_local, tu_f32(&sig), sizeof sig_local);
    ts_ensemble_free(&ens);
    const uint8_t learned[2] = {1, 0};
    hook_t h = {.e = &fx->e, .models = m, .fail_k = -1};
    ts_ensemble_opts_t ro = o;
    ro.eval = hook;
    ro.eval_ctx = &h;
    ro.config = &m[1].cfg;
    ro.learn_sigma = learned;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, NULL, 2, &ro, err, sizeof err), TS_OK, err);
    assert_true(ts_ensemble_has_variance(&ens));
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.6f, &v));
    TU_CHECK_OK(ts_ensemble_variance(&ens, &sig));
    assert_memory_equal(tu_f32(&v), v_local, sizeof v_local);
    assert_memory_equal(tu_f32(&sig), sig_local, sizeof sig_local);
    assert_int_equal(h.jobs, 2);
    ts_ensemble_free(&ens);
    ro.learn_sigma = NULL; /* no advert says so: no variance asked */
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, NULL, 2, &ro, err, sizeof err), TS_OK, err);
    assert_false(ts_ensemble_has_variance(&ens));
    ts_ensemble_free(&ens);
    /* one job with its variance: each row the guided answer, then the conditional variance */
    float both[N * 2 * CHW], plain[N * CHW];
    ts_expert_job_t j = {
        .m = N, .x = tu_f32(&x), .labels = labels, .t = 0.6f, .cfg_scale = 3.0f, .v = plain};
    TU_CHECK_OK(ts_expert_job_run(&m[0], &j));
    j.with_sigma = 1;
    j.v = both;
    TU_CHECK_OK(ts_expert_job_run(&m[0], &j));
    for (int i = 0; i < N; i++) {
        assert_memory_equal(both + (size_t)2 * i * CHW, plain + (size_t)i * CHW,
                            CHW * sizeof(float));
        assert_memory_equal(both + (size_t)(2 * i + 1) * CHW, sig0 + (size_t)i * CHW,
                            CHW * sizeof(float));
    }
    TU_CHECK_RC(ts_expert_job_run(&m[1], &j), TS_EINVAL); /* no learned σ to give */
    /* no learned σ: none to give */
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, m + 1, 1, &o, err, sizeof err), TS_OK, err);
    assert_false(ts_ensemble_has_variance(&ens));
    TU_CHECK_RC(ts_ensemble_variance(&ens, &sig), TS_EINVAL);
    ts_ensemble_free(&ens);
    /* exact guidance: not combined */
    o.exact_guidance = 1;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, m, 2, &o, err, sizeof err), TS_OK, err);
    assert_false(ts_ensemble_has_variance(&ens));
    ts_ensemble_free(&ens);
    TU_FREE_TENSORS(&x, &v, &sig, &xx, &tt);
    ts_dit_free(&m[0]);
    ts_dit_free(&m[1]);
}

/* opts.absent: an absent expert is scored −∞ from the first evaluation — full + uniform over 3
 * experts with expert 1 absent is the mean of experts 0 and 2 (weights 1/2), expert 1 is never
 * run, and its routing mass (1/3 per sample per evaluation) is summed; top1 moves to the next
 * expert; all experts absent is refused. */
static void test_absent_routed_around(void **state) {
    fixture_t *fx = *state;
    enum { N = 4, K = 3 };
    ts_experts_t ex;
    open_written_experts(fx, &ex, "a", 40, K);
    int32_t labels[N] = {2, 0, NCLS, 1};
    ts_tensor_t x, v, vk;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_like(&v, &x);
    tu_alloc_like(&vk, &x);
    tu_rng_t r = {11};
    tu_fill_uniform(&r, &x, -2.0f, 2.0f);
    float mean[N * CHW] = {0};
    const int present[K] = {1, 0, 1};
    add_mean(&ex, present, labels, N, &x, 0.6f, &vk, mean, 2);
    const uint8_t absent[K] = {0, 1, 0};
    ts_ensemble_opts_t o = base_opts("full", TS_POLICY_UNIFORM, labels, N, 3.0f);
    o.record = 1;
    o.absent = absent;
    ts_ensemble_t ens;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.6f, &v));
    tu_check_close(tu_f32(&v), mean, N * CHW, 1e-6, 1e-5, "expert 1 absent vs the mean of 0, 2");
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.3f, &v));
    for (int i = 0; i < N; i++)
        for (int k = 0; k < K; k++)
            tu_check_scalar(ens.steps[1].w[i * K + k], k == 1 ? 0.0 : 0.5, 1e-7, "w[%d,%d]", i, k);
    assert_int_equal(ens.expert_forwards[1], 0);
    tu_check_scalar(ens.absent_mass[1], 2.0 * N / 3.0, 1e-5, "absent mass");
    assert_int_equal(ens.absent_routed, 2 * N);
    assert_true(ens.absent_mass[0] == 0.0 && ens.absent_mass[2] == 0.0);
    ts_ensemble_free(&ens);
    /* top1 with uniform scores takes expert 0 when present; with 0 absent, the next (1) */
    const uint8_t first_absent[K] = {1, 0, 0};
    o = base_opts("top1", TS_POLICY_UNIFORM, labels, N, 3.0f);
    o.record = 1;
    o.absent = first_absent;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.6f, &v));
    for (int i = 0; i < N; i++)
        tu_check_scalar(ens.steps[0].w[i * K + 1], 1.0, 0.0, "top1 moves to expert 1 (%d)", i);
    tu_check_scalar(ens.absent_mass[0], (double)N, 0.0, "top1's whole mass was expert 0's");
    ts_ensemble_free(&ens);
    const uint8_t none[K] = {1, 1, 1};
    o.absent = none;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "absent");
    TU_FREE_TENSORS(&x, &v, &vk);
    ts_experts_free(&ex);
}

/* The centroid policy with 2 hand-made clusters: experts that output 0 (DiT init) make
 * x̂0 = x, so the second evaluation routes each sample by the embedding of x itself. */
static void test_centroid_nearer(void **state) {
    fixture_t *fx = *state;
    enum { N = 3, K = 2 };
    char p0[512], p1[512];
    snprintf(p0, sizeof p0, "%s", write_expert(&fx->e, "z0.safetensors", 1, 0.0f, "0"));
    snprintf(p1, sizeof p1, "%s", write_expert(&fx->e, "z1.safetensors", 2, 0.0f, "1"));
    const char *paths[K] = {p1, p0}; /* out of order: the cluster metadata orders them */
    ts_experts_t ex;
    open_experts(&ex, &fx->e, paths, K);
    assert_string_equal(ex.paths[0], p0);
    assert_int_equal(ex.cluster[1], 1);
    const float cents[K * 2] = {-1.0f, -1.0f, 1.0f, 1.0f};
    ts_partition_t part = make_partition(K, cents);
    int32_t labels[N] = {0, 1, 2};
    ts_tensor_t x, v;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_like(&v, &x);
    const float level[N] = {-0.8f, 0.6f, 0.1f}; /* embeddings (l, l) */
    for (int b = 0; b < N; b++)
        for (int j = 0; j < CHW; j++)
            tu_f32(&x)[b * CHW + j] = level[b];
    for (int full = 0; full < 2; full++) {
        ts_ensemble_opts_t o =
            base_opts(full ? "full" : "top1", TS_POLICY_CENTROID, labels, N, 2.0f);
        o.partition = &part;
        o.tau = 2.0f;
        o.record = 1;
        ts_ensemble_t ens;
        TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK,
                        err);
        TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 1.0f, &v)); /* no x̂0 yet: uniform */
        TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.5f, &v));
        assert_int_equal(ens.n_steps, 2);
        assert_int_equal(ens.steps[0].policy, TS_POLICY_UNIFORM);
        assert_int_equal(ens.steps[1].policy, TS_POLICY_CENTROID);
        assert_int_equal(ens.fallbacks, 1);
        for (int b = 0; b < N; b++) {
            const float *w0 = ens.steps[0].w + b * K, *w1 = ens.steps[1].w + b * K;
            double l = level[b];
            double d0 = 2 * (l + 1) * (l + 1), d1 = 2 * (l - 1) * (l - 1);
            int nearer = d1 < d0;
            if (!full) {
                assert_true(w0[0] == 1.0f && w0[1] == 0.0f); /* the tie: expert 0 */
                assert_true(w1[nearer] == 1.0f && w1[1 - nearer] == 0.0f);
            } else {
                tu_check_scalar(w0[0], 0.5, 1e-7, "uniform first step");
                double want1 = 1.0 / (1.0 + exp(-(d0 - d1) / 2.0));
                tu_check_scalar(w1[1], want1, 1e-6, "sample %d weight of cluster 1", b);
                tu_check_scalar(w1[0] + w1[1], 1.0, 1e-6, "sample %d sum", b);
            }
        }
        /* a new run (t = 1) forgets x̂0 */
        TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 1.0f, &v));
        assert_int_equal(ens.steps[2].policy, TS_POLICY_UNIFORM);
        ts_ensemble_free(&ens);
    }
    /* with a router the first step is the learned policy's */
    stub_router_t r;
    stub_init(&r, K);
    ts_ensemble_opts_t o = base_opts("top1", TS_POLICY_CENTROID, labels, N, 1.0f);
    o.partition = &part;
    o.router = stub_router;
    o.router_ctx = &r;
    o.record = 1;
    ts_ensemble_t ens;
    TU_CHECK_OK(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err));
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 1.0f, &v));
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.9f, &v));
    assert_int_equal(ens.steps[0].policy, TS_POLICY_LEARNED);
    assert_int_equal(r.calls, 1);
    assert_int_equal(ens.router_calls, 1);
    ts_ensemble_free(&ens);
    TU_FREE_TENSORS(&x, &v);
    ts_experts_free(&ex);
}

/* Expert evaluations per sample: top1 with CFG = 2 per evaluation; full = 2K; confidence = 2K
 * whatever the selection; no CFG halves them. */
static void test_evaluation_counts(void **state) {
    fixture_t *fx = *state;
    enum { N = 4, K = 3, STEPS = 3 };
    char p[K][512];
    const char *paths[K];
    for (int k = 0; k < K; k++) {
        char name[32], cl[16];
        snprintf(name, sizeof name, "n%d.safetensors", k);
        snprintf(cl, sizeof cl, "%d", k);
        snprintf(p[k], sizeof p[k], "%s", write_expert(&fx->e, name, 50 + (uint64_t)k, 0.05f, cl));
        paths[k] = p[k];
    }
    ts_experts_t ex;
    open_experts(&ex, &fx->e, paths, K);
    const float cents[K * 2] = {-0.5f, 0, 0, 0, 0.5f, 0};
    ts_partition_t part = make_partition(K, cents);
    stub_router_t r;
    stub_init(&r, K);
    int32_t labels[N] = {0, 1, 2, 0};
    struct {
        ts_policy_t policy;
        const char *select;
        float cfg;
        int kind;
        double want;
    } cases[] = {
        {TS_POLICY_LEARNED, "top1", 2.0f, TS_SAMPLER_EULER, 2.0 * STEPS},
        {TS_POLICY_LEARNED, "top1", 2.0f, TS_SAMPLER_HEUN, 2.0 * 2 * STEPS},
        {TS_POLICY_UNIFORM, "full", 2.0f, TS_SAMPLER_EULER, 2.0 * K * STEPS},
        {TS_POLICY_UNIFORM, "top2", 1.0f, TS_SAMPLER_EULER, 2.0 * STEPS},
        {TS_POLICY_CENTROID, "top1", 2.0f, TS_SAMPLER_EULER, 2.0 * STEPS},
        {TS_POLICY_CONFIDENCE, "top1", 2.0f, TS_SAMPLER_EULER, 2.0 * K * STEPS},
        {TS_POLICY_CONFIDENCE, "full", 1.0f, TS_SAMPLER_EULER, 1.0 * K * STEPS},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ts_ensemble_opts_t o = base_opts(cases[c].select, cases[c].policy, labels, N, cases[c].cfg);
        o.router = stub_router;
        o.router_ctx = &r;
        o.partition = &part;
        float out[N * CHW];
        double evals;
        sample_ensemble(&fx->e, ex.models, K, o, 1, cases[c].kind, STEPS, out, &evals);
        tu_check_scalar(evals, cases[c].want, 0, "case %zu: %s %s evaluations per sample", c,
                        ts_policy_name(cases[c].policy), cases[c].select);
    }
    ts_experts_free(&ex);
}

/* A router that knows only t: at t = 1 the logits are first[k] for every sample, later ones
 * strongly prefer the last expert. */
typedef struct {
    int K, calls;
    float first[8];
} t_router_t;

static int t_router(void *ctx, const ts_tensor_t *x, float t, const int32_t *labels, int B,
                    float *logits) {
    (void)x;
    (void)labels;
    t_router_t *r = ctx;
    r->calls++;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < r->K; k++)
            logits[b * r->K + k] = t >= 1.0f ? r->first[k] : (k == r->K - 1 ? 10.0f : 0.0f);
    return TS_OK;
}

/* Runs one sampling of N samples (seeds seed0 + i) with recording on; returns the ensemble for
 * inspection (the caller frees it). */
static void run_recorded(ts_engine_t *e, ts_dit_t *experts, int K, ts_ensemble_opts_t *o,
                         const uint64_t *seeds, int steps, ts_ensemble_t *ens) {
    o->record = 1;
    o->seeds = seeds;
    TU_CHECK_RC_MSG(ts_ensemble_init(ens, e, experts, K, o, err, sizeof err), TS_OK, err);
    ts_tensor_t x, scratch[3];
    tu_alloc_f32(&x, 4, TS_SHAPE(o->n, 1, IMG, IMG));
    for (int i = 0; i < 3; i++)
        tu_alloc_like(&scratch[i], &x);
    TU_CHECK_OK(ts_sampler_noise(e, &x, seeds));
    ts_sampler_opts_t so = {.kind = TS_SAMPLER_EULER, .steps = steps};
    TU_CHECK_OK(ts_sampler_run(e, &so, &x, scratch, ts_ensemble_velocity, ens, NULL, NULL));
    TU_FREE_TENSORS(&x, &scratch[0], &scratch[1], &scratch[2]);
}

/* Per-trajectory routing: hold keeps the first evaluation's weights (the router runs once per
 * run), draw picks one expert per sample from them, in proportion to the weights, as a function
 * of the sample's seed alone (not of its batch), and keeps it; without either, later
 * evaluations follow the router. */
static void test_hold_and_draw(void **state) {
    fixture_t *fx = *state;
    enum { N = MAXB, K = 3, STEPS = 4 };
    char p[K][512];
    const char *paths[K];
    for (int k = 0; k < K; k++) {
        char name[32], cl[16];
        snprintf(name, sizeof name, "h%d.safetensors", k);
        snprintf(cl, sizeof cl, "%d", k);
        snprintf(p[k], sizeof p[k], "%s", write_expert(&fx->e, name, 70 + (uint64_t)k, 0.05f, cl));
        paths[k] = p[k];
    }
    ts_experts_t ex;
    open_experts(&ex, &fx->e, paths, K);
    int32_t labels[N];
    uint64_t seeds[N];
    for (int i = 0; i < N; i++)
        labels[i] = i % NCLS, seeds[i] = 100 + (uint64_t)i;
    t_router_t r = {.K = K, .first = {10.0f, 0.0f, 0.0f}};
    for (int hold = TS_HOLD_NONE; hold <= TS_HOLD_FIRST; hold++) {
        ts_ensemble_opts_t o = base_opts("top1", TS_POLICY_LEARNED, labels, N, 1.0f);
        o.router = t_router;
        o.router_ctx = &r;
        o.hold = hold;
        r.calls = 0;
        ts_ensemble_t ens;
        run_recorded(&fx->e, ex.models, K, &o, seeds, STEPS, &ens);
        assert_int_equal(ens.n_steps, STEPS);
        assert_int_equal(r.calls, hold ? 1 : STEPS);
        for (int st = 0; st < STEPS; st++)
            for (int i = 0; i < N; i++) {
                int want = st == 0 || hold ? 0 : K - 1;
                for (int k = 0; k < K; k++)
                    assert_float_equal(ens.steps[st].w[i * K + k], k == want ? 1.0f : 0.0f, 0);
            }
        ts_ensemble_free(&ens);
    }
    /* until t <= 0.6: routed at t = 1, 0.75 and 0.5 (kept), not at 0.25 */
    {
        ts_ensemble_opts_t o = base_opts("top1", TS_POLICY_LEARNED, labels, N, 1.0f);
        o.router = t_router;
        o.router_ctx = &r;
        o.hold = TS_HOLD_BELOW;
        o.hold_t = 0.6f;
        r.calls = 0;
        ts_ensemble_t ens;
        run_recorded(&fx->e, ex.models, K, &o, seeds, STEPS, &ens);
        assert_int_equal(r.calls, 3);
        for (int st = 0; st < STEPS; st++)
            for (int i = 0; i < N; i++)
                for (int k = 0; k < K; k++)
                    assert_float_equal(ens.steps[st].w[i * K + k],
                                       k == (st == 0 ? 0 : K - 1) ? 1.0f : 0.0f, 0);
        ts_ensemble_free(&ens);
        o.hold_t = 1.0f; /* out of range */
        o.record = 0;
        TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_EINVAL);
    }
    /* draw from (0.2, 0.3, 0.5) at t = 1 under full, four batches of N */
    r.first[0] = logf(0.2f), r.first[1] = logf(0.3f), r.first[2] = logf(0.5f);
    int picks[4 * N], count[K] = {0};
    for (int b = 0; b < 4; b++) {
        uint64_t sd[N];
        for (int i = 0; i < N; i++)
            sd[i] = 1000 + (uint64_t)(b * N + i);
        ts_ensemble_opts_t o = base_opts("full", TS_POLICY_LEARNED, labels, N, 1.0f);
        o.router = t_router;
        o.router_ctx = &r;
        o.hold = TS_HOLD_DRAW;
        ts_ensemble_t ens;
        run_recorded(&fx->e, ex.models, K, &o, sd, STEPS, &ens);
        tu_check_scalar(ts_ensemble_evals_per_sample(&ens), STEPS, 0, "one expert per step");
        for (int i = 0; i < N; i++) {
            int pick = -1;
            for (int k = 0; k < K; k++)
                if (ens.steps[0].w[i * K + k] == 1.0f)
                    pick = k;
            assert_true(pick >= 0);
            for (int st = 1; st < STEPS; st++)
                assert_memory_equal(ens.steps[st].w + i * K, ens.steps[0].w + i * K,
                                    K * sizeof(float));
            picks[b * N + i] = pick;
            count[pick]++;
        }
        ts_ensemble_free(&ens);
    }
    /* 64 draws: each share within ±0.2 of its probability, all three experts drawn */
    assert_true(count[0] >= 1 && count[1] >= 1 && count[2] >= 1);
    assert_true(abs(count[0] - 13) <= 13 && abs(count[2] - 32) <= 13);
    /* the same seeds in another batch (reversed order) draw the same experts */
    uint64_t rev[N];
    for (int i = 0; i < N; i++)
        rev[i] = 1000 + (uint64_t)(N - 1 - i);
    ts_ensemble_opts_t o = base_opts("full", TS_POLICY_LEARNED, labels, N, 1.0f);
    o.router = t_router;
    o.router_ctx = &r;
    o.hold = TS_HOLD_DRAW;
    ts_ensemble_t ens;
    run_recorded(&fx->e, ex.models, K, &o, rev, STEPS, &ens);
    for (int i = 0; i < N; i++)
        assert_float_equal(ens.steps[0].w[i * K + picks[N - 1 - i]], 1.0f, 0);
    ts_ensemble_free(&ens);
    /* refusals: draw without seeds, hold with the confidence policy */
    o.seeds = NULL;
    o.record = 0;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_EINVAL);
    o.hold = TS_HOLD_FIRST;
    o.policy = TS_POLICY_CONFIDENCE;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_EINVAL);
    ts_experts_free(&ex);
}

/* The experts' residual Gram matrices (ts_expert_residuals_fn, what train-router's expert
 * objectives learn from) against a direct computation: each expert's forward, its residual
 * against the target, the mean over pixels of every product, in double (the function forms the
 * residual in float: a relative 1e-6). */
static void test_expert_residuals(void **state) {
    fixture_t *fx = *state;
    enum { N = 6, K = 3 };
    char p[K][512];
    const char *paths[K];
    for (int k = 0; k < K; k++) {
        char name[32], cl[16];
        snprintf(name, sizeof name, "r%d.safetensors", k);
        snprintf(cl, sizeof cl, "%d", k);
        snprintf(p[k], sizeof p[k], "%s", write_expert(&fx->e, name, 90 + (uint64_t)k, 0.05f, cl));
        paths[k] = p[k];
    }
    ts_experts_t ex;
    open_experts(&ex, &fx->e, paths, K);
    ts_tensor_t xt, t, vel;
    tu_alloc_f32(&xt, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_f32(&vel, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_f32(&t, 1, TS_SHAPE(N));
    tu_rng_t r = {5};
    tu_fill_uniform(&r, &xt, -1, 1);
    tu_fill_uniform(&r, &vel, -1, 1);
    tu_fill_uniform(&r, &t, 0, 1);
    int32_t labels[N] = {0, 1, 2, 3, NCLS, 1};
    ts_expert_residuals_t res;
    TU_CHECK_OK(ts_expert_residuals_init(&res, ex.models, K, N));
    double G[N * K * K];
    TU_CHECK_OK(ts_expert_residuals_fn(&res, &xt, &t, &vel, labels, N, G));
    float v[K][N * CHW];
    for (int k = 0; k < K; k++) {
        ts_tensor_t out;
        TU_CHECK_OK(ts_dit_forward(&ex.models[k], &xt, &t, labels, N, &out));
        memcpy(v[k], out.data, sizeof v[k]);
    }
    const float *g = tu_f32(&vel);
    for (int b = 0; b < N; b++)
        for (int j = 0; j < K; j++)
            for (int k = 0; k < K; k++) {
                double want = 0.0;
                for (int q = 0; q < CHW; q++)
                    want += ((double)v[j][b * CHW + q] - g[b * CHW + q]) *
                            ((double)v[k][b * CHW + q] - g[b * CHW + q]);
                want /= CHW;
                tu_check_scalar(G[(b * K + j) * K + k], want, 1e-9 + 1e-6 * fabs(want),
                                "G[%d][%d][%d]", b, j, k);
            }
    TU_CHECK_RC(ts_expert_residuals_fn(&res, &xt, &t, &vel, labels, N + 1, G), TS_EINVAL);
    ts_expert_residuals_free(&res);
    TU_FREE_TENSORS(&xt, &vel, &t);
    ts_experts_free(&ex);
}

/* A real ts_classifier_t as the learned policy's router: the adapter gives the classifier's own
 * logits at (x, t), and top1 sends each sample to its arg-max cluster. */
static void test_classifier_router(void **state) {
    fixture_t *fx = *state;
    enum { N = 6, K = 3 };
    ts_dit_config_t cfg;
    tiny_config(&cfg);
    ts_classifier_t *cl = NULL;
    TU_CHECK_OK(ts_classifier_create(&cl, &cfg, K, 1, &fx->e, MAXB, 0));
    TU_CHECK_OK(ts_classifier_init_weights(cl, 77));
    ts_classifier_router_t rr;
    TU_CHECK_OK(ts_classifier_router_init(&rr, cl, &fx->e, N));
    ts_tensor_t x, v, tt;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_like(&v, &x);
    tu_alloc_f32(&tt, 1, TS_SHAPE(N));
    tu_rng_t r = {3};
    tu_fill_uniform(&r, &x, -2.0f, 2.0f);
    for (int i = 0; i < N; i++)
        tu_f32(&tt)[i] = 0.4f;
    float want[N * K], got[N * K];
    TU_CHECK_OK(ts_classifier_run(cl, &x, &tt, N, NULL, want));
    TU_CHECK_OK(ts_classifier_router_fn(&rr, &x, 0.4f, NULL, N, got));
    assert_memory_equal(got, want, sizeof got);
    TU_CHECK_RC(ts_classifier_router_fn(&rr, &x, 0.4f, NULL, N + 1, got), TS_EINVAL);

    const char *path = write_expert(&fx->e, "cr.safetensors", 4, 0.05f, NULL);
    const char *paths[K] = {path, path, path};
    ts_experts_t ex;
    open_experts(&ex, &fx->e, paths, K);
    int32_t labels[N] = {0, 1, 2, 0, 1, 2};
    ts_ensemble_opts_t o = base_opts("top1", TS_POLICY_LEARNED, labels, N, 2.0f);
    o.router = ts_classifier_router_fn;
    o.router_ctx = &rr;
    o.record = 1;
    ts_ensemble_t ens;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, 0.4f, &v));
    for (int b = 0; b < N; b++) {
        int best = 0;
        for (int k = 1; k < K; k++)
            if (want[b * K + k] > want[b * K + best])
                best = k;
        assert_true(ens.steps[0].w[b * K + best] == 1.0f);
    }
    ts_ensemble_free(&ens);
    ts_experts_free(&ex);
    TU_FREE_TENSORS(&x, &v, &tt);
    ts_classifier_router_free(&rr);
    ts_classifier_free(cl);
}

/* v_k(x, y) of every expert through ts_dit_velocity at guidance scale cfg (1: one unguided
 * forward with the given labels), into out (K, n·CHW): the reference for the guidance and record
 * tests. */
static void expert_velocities(ts_experts_t *ex, const int32_t *labels, int n, const ts_tensor_t *x,
                              float t, float cfg, ts_tensor_t *vk, float *out) {
    for (int k = 0; k < ex->K; k++) {
        ts_dit_velocity_ctx_t vc;
        TU_CHECK_OK(ts_dit_velocity_init(&vc, &ex->models[k], labels, n, cfg));
        TU_CHECK_OK(ts_dit_velocity(&vc, x, t, vk));
        memcpy(out + (size_t)k * n * CHW, tu_f32(vk), (size_t)n * CHW * sizeof(float));
        ts_dit_velocity_free(&vc);
    }
}

/* Exact mixture guidance against a naive sum: v = s·Σ_k w^c_k v_k(x, y) + (1 − s)·Σ_k w^u_k
 * v_k(x, ∅), with w^c from the class-aware scores (uniform + prior) and w^u from the prior's null
 * row, under full and top1 (ties to expert 0); one forward per sample and half under top1; two
 * copies of one expert = that expert's own guided velocity; without a prior it equals the plain
 * ensemble; refused with hold and the confidence policy. */
static void test_exact_guidance(void **state) {
    fixture_t *fx = *state;
    enum { N = 4, K = 2 };
    const float G = 3.0f, T = 0.55f;
    ts_experts_t ex;
    open_written_experts(fx, &ex, "x", 60, K);
    int32_t labels[N] = {0, 1, NCLS, 2};
    int32_t nulls[N] = {NCLS, NCLS, NCLS, NCLS};
    float prior[(NCLS + 1) * K] = {0};
    prior[0 * K + 0] = logf(0.9f), prior[0 * K + 1] = logf(0.1f);
    prior[1 * K + 0] = logf(0.2f), prior[1 * K + 1] = logf(0.8f);
    ts_tensor_t x, v, vk;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_like(&v, &x);
    tu_alloc_like(&vk, &x);
    tu_rng_t r = {21};
    tu_fill_uniform(&r, &x, -2.0f, 2.0f);
    static float vc[K * N * CHW], vu[K * N * CHW];
    expert_velocities(&ex, labels, N, &x, T, 1.0f, &vk, vc);
    expert_velocities(&ex, nulls, N, &x, T, 1.0f, &vk, vu);
    const char *sels[2] = {"full", "top1"};
    for (int c = 0; c < 2; c++) {
        float want[N * CHW];
        for (int b = 0; b < N; b++) {
            double wc[K], wu[K] = {0.5, 0.5};
            softmax_ref(wc, prior + (size_t)labels[b] * K, K);
            if (c == 1) { /* top1: argmax, ties to expert 0 */
                int best = wc[1] > wc[0];
                wc[0] = best == 0, wc[1] = best == 1, wu[0] = 1.0, wu[1] = 0.0;
            }
            for (int j = 0; j < CHW; j++) {
                double acc = 0.0;
                for (int k = 0; k < K; k++)
                    acc += G * wc[k] * vc[((size_t)k * N + b) * CHW + j] +
                           (1.0 - G) * wu[k] * vu[((size_t)k * N + b) * CHW + j];
                want[b * CHW + j] = (float)acc;
            }
        }
        ts_ensemble_opts_t o = base_opts(sels[c], TS_POLICY_UNIFORM, labels, N, G);
        o.log_prior = prior;
        o.exact_guidance = 1;
        ts_ensemble_t ens;
        TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK,
                        err);
        TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, T, &v));
        tu_check_close(tu_f32(&v), want, N * CHW, 1e-5, 1e-5, "exact guidance, %s", sels[c]);
        /* full: every expert on both halves; top1: one forward per sample and half */
        assert_int_equal(ens.forwards, c == 0 ? 2 * K * N : 2 * N);
        ts_ensemble_free(&ens);
    }

    /* two copies of one expert: the mixture is that expert's own guided velocity */
    const char *same[K] = {ex.paths[0], ex.paths[0]};
    ts_experts_t twin;
    open_experts(&twin, &fx->e, same, K);
    ts_dit_velocity_ctx_t one;
    TU_CHECK_OK(ts_dit_velocity_init(&one, &twin.models[0], labels, N, G));
    TU_CHECK_OK(ts_dit_velocity(&one, &x, T, &vk));
    ts_dit_velocity_free(&one);
    ts_ensemble_opts_t o = base_opts("full", TS_POLICY_UNIFORM, labels, N, G);
    o.log_prior = prior;
    o.exact_guidance = 1;
    ts_ensemble_t ens;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, twin.models, K, &o, err, sizeof err), TS_OK,
                    err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, T, &v));
    tu_check_close(tu_f32(&v), tu_f32(&vk), N * CHW, 1e-5, 1e-5, "two copies of one expert");
    ts_ensemble_free(&ens);
    ts_experts_free(&twin);

    /* no prior: the scores do not depend on the label, exact = the plain ensemble */
    stub_router_t sr;
    stub_init(&sr, K);
    float plain[N * CHW];
    for (int exact = 0; exact < 2; exact++) {
        o = base_opts("top1", TS_POLICY_LEARNED, labels, N, G);
        o.router = stub_router;
        o.router_ctx = &sr;
        o.exact_guidance = exact;
        TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK,
                        err);
        TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, T, &v));
        if (!exact)
            memcpy(plain, tu_f32(&v), sizeof plain);
        else
            tu_check_close(tu_f32(&v), plain, N * CHW, 1e-5, 1e-5, "exact without a prior");
        ts_ensemble_free(&ens);
    }
    o.hold = TS_HOLD_FIRST;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_ENOTSUP);
    TU_CHECK_CONTAINS(err, "exact mixture guidance");
    o.hold = TS_HOLD_NONE;
    o.policy = TS_POLICY_CONFIDENCE;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_ENOTSUP);
    TU_FREE_TENSORS(&x, &v, &vk);
    ts_experts_free(&ex);
}

/* The record's routing distribution and spread: full + uniform over 3 experts records p = 1/3
 * and spread = Σ_k ⅓‖v_k − v̄‖² / CHW from the experts' guided velocities computed one by one;
 * top1 with the stub router records p = the softmax of its logits and spread 0; a router's
 * temperature divides its logits. */
static void test_record_distribution(void **state) {
    fixture_t *fx = *state;
    enum { N = 4, K = 3 };
    const float T = 0.45f;
    ts_experts_t ex;
    open_written_experts(fx, &ex, "d", 80, K);
    int32_t labels[N] = {1, 0, NCLS, 2};
    ts_tensor_t x, v, vk;
    tu_alloc_f32(&x, 4, TS_SHAPE(N, 1, IMG, IMG));
    tu_alloc_like(&v, &x);
    tu_alloc_like(&vk, &x);
    tu_rng_t r = {31};
    tu_fill_uniform(&r, &x, -2.0f, 2.0f);
    static float each[K * N * CHW];
    expert_velocities(&ex, labels, N, &x, T, 2.0f, &vk, each);
    ts_ensemble_opts_t o = base_opts("full", TS_POLICY_UNIFORM, labels, N, 2.0f);
    o.record = 1;
    ts_ensemble_t ens;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, T, &v));
    assert_int_equal(ens.n_steps, 1);
    for (int b = 0; b < N; b++) {
        double spread = 0.0;
        for (int j = 0; j < CHW; j++) {
            double mean = 0.0;
            for (int k = 0; k < K; k++)
                mean += each[((size_t)k * N + b) * CHW + j] / K;
            for (int k = 0; k < K; k++) {
                double d = each[((size_t)k * N + b) * CHW + j] - mean;
                spread += d * d / K;
            }
        }
        tu_check_scalar(ens.steps[0].spread[b], spread / CHW, 1e-5 + 1e-4 * spread / CHW,
                        "spread of sample %d", b);
        assert_true(spread > 1e-6); /* the experts differ: the check can fail */
        for (int k = 0; k < K; k++)
            tu_check_scalar(ens.steps[0].p[b * K + k], 1.0 / 3.0, 1e-7, "p[%d, %d]", b, k);
    }
    ts_ensemble_free(&ens);

    stub_router_t sr;
    stub_init(&sr, K);
    float logits[N * K];
    TU_CHECK_OK(stub_router(&sr, &x, T, NULL, N, logits));
    o = base_opts("top1", TS_POLICY_LEARNED, labels, N, 2.0f);
    o.router = stub_router;
    o.router_ctx = &sr;
    o.record = 1;
    TU_CHECK_RC_MSG(ts_ensemble_init(&ens, &fx->e, ex.models, K, &o, err, sizeof err), TS_OK, err);
    TU_CHECK_OK(ts_ensemble_velocity(&ens, &x, T, &v));
    for (int b = 0; b < N; b++) {
        double p[K];
        softmax_ref(p, logits + b * K, K);
        for (int k = 0; k < K; k++)
            tu_check_scalar(ens.steps[0].p[b * K + k], p[k], 1e-6, "p[%d, %d]", b, k);
        tu_check_scalar(ens.steps[0].spread[b], 0.0, 1e-6, "top1 spread %d", b);
    }
    ts_ensemble_free(&ens);

    /* the classifier router's temperature */
    ts_dit_config_t cfg;
    tiny_config(&cfg);
    ts_classifier_t *cl = NULL;
    TU_CHECK_OK(ts_classifier_create(&cl, &cfg, K, 1, &fx->e, MAXB, 0));
    TU_CHECK_OK(ts_classifier_init_weights(cl, 5));
    ts_classifier_router_t rr;
    TU_CHECK_OK(ts_classifier_router_init(&rr, cl, &fx->e, N));
    assert_true(rr.temperature == 1.0f);
    float raw[N * K], hot[N * K];
    TU_CHECK_OK(ts_classifier_router_fn(&rr, &x, T, NULL, N, raw));
    rr.temperature = 2.5f;
    TU_CHECK_OK(ts_classifier_router_fn(&rr, &x, T, NULL, N, hot));
    for (int i = 0; i < N * K; i++)
        tu_check_scalar(hot[i], raw[i] / 2.5, 1e-6, "logit %d at temperature 2.5", i);
    ts_classifier_router_free(&rr);
    ts_classifier_free(cl);
    TU_FREE_TENSORS(&x, &v, &vk);
    ts_experts_free(&ex);
}

/* ts_experts_open and ts_ensemble_init refuse what does not belong together. */
static void test_refusals(void **state) {
    fixture_t *fx = *state;
    char a[512], b[512], c[512], d[512];
    snprintf(a, sizeof a, "%s", write_expert(&fx->e, "r0.safetensors", 1, 0.0f, "0"));
    snprintf(b, sizeof b, "%s", write_expert(&fx->e, "r1.safetensors", 2, 0.0f, "0"));
    snprintf(c, sizeof c, "%s", write_expert(&fx->e, "rn.safetensors", 3, 0.0f, NULL));
    snprintf(d, sizeof d, "%s", write_expert(&fx->e, "r5.safetensors", 3, 0.0f, "5"));
    ts_experts_t ex;
    const char *dup[2] = {a, b};
    TU_CHECK_RC(ts_experts_open(&ex, dup, 2, &fx->e, MAXB, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "cluster 0");
    assert_null(ex.models);
    const char *mix[2] = {a, c};
    TU_CHECK_RC(ts_experts_open(&ex, mix, 2, &fx->e, MAXB, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "metadata cluster");
    const char *range[2] = {a, d};
    TU_CHECK_RC(ts_experts_open(&ex, range, 2, &fx->e, MAXB, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "cluster 5");
    const char *missing[1] = {tu_temp_path("nope.safetensors")};
    assert_int_not_equal(ts_experts_open(&ex, missing, 1, &fx->e, MAXB, err, sizeof err), TS_OK);
    TU_CHECK_CONTAINS(err, "nope.safetensors");

    const char *ok2[2] = {c, c};
    open_experts(&ex, &fx->e, ok2, 2);
    int32_t labels[4] = {0, 1, 2, 3};
    ts_ensemble_t ens;
    ts_ensemble_opts_t o = base_opts("top1", TS_POLICY_LEARNED, labels, 4, 2.0f);
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, 2, &o, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "router");
    o.policy = TS_POLICY_CENTROID;
    const float cents[3 * 2] = {0};
    ts_partition_t part3 = make_partition(3, cents);
    o.partition = &part3;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, 2, &o, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "3 clusters but 2 experts");
    ts_partition_t part2 = make_partition(2, cents);
    o.partition = &part2;
    o.tau = 0.0f;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, 2, &o, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "tau");
    o.tau = 1.0f;
    o.n = MAXB; /* 2·16 samples with guidance do not fit max_batch 16 */
    int32_t many[MAXB] = {0};
    o.labels = many;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, 2, &o, err, sizeof err), TS_ERANGE);
    TU_CHECK_CONTAINS(err, "room for 16");
    o.n = 4;
    o.labels = labels;
    labels[3] = NCLS + 1;
    TU_CHECK_RC(ts_ensemble_init(&ens, &fx->e, ex.models, 2, &o, err, sizeof err), TS_ERANGE);
    TU_CHECK_CONTAINS(err, "sample 3");
    ts_experts_free(&ex);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weights_sum_to_one),
        cmocka_unit_test(test_selection_sets),
        cmocka_unit_test(test_schedule_parse),
        cmocka_unit_test(test_schedule_malformed),
        cmocka_unit_test(test_sq_dist),
        cmocka_unit_test_setup_teardown(test_top1_identical_equals_single, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed_objectives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_learned_variance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grouping_equals_one_by_one, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_uniform_is_mean, setup, teardown),
        cmocka_unit_test_setup_teardown(test_centroid_nearer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_evaluation_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hold_and_draw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_absent_routed_around, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expert_residuals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_classifier_router, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exact_guidance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_distribution, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_hook, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
