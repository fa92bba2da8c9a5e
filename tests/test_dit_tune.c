/*
 * test_dit_tune.c — choosing a model's attention by measuring it (model/dit_tune.c):
 *   - the rules, on made-up measurements: the faster attention by more than 3 %, else the
 *     default; never a fused attention whose output failed its check (NaN included) or that
 *     was not measured; the epilogues only within 1e-2 and faster; graphs only when
 *     bit-identical and faster than the eager forward they would replace;
 *   - ts_dit_tune on a `tiny` model at f32 (also with a learned σ) and bf16 (where the CPU
 *     runs it): both attentions
 *     timed, the fused output within its bound of the composed one's, the model left on the
 *     attention the rules pick from the times, and its forward then bit for bit a fresh model's
 *     with that attention; at f16 (no fused attention on a CPU) it measures the composed one
 *     alone and says why; refusals (a trainable model, a batch past max_batch, reps out of
 *     range);
 *   - ts_dit_choose_attention's four choices and their notes, and the names' round trip.
 * The GPU's half (graphs measured, bit for bit) is tests/test_cuda_dit.c's test_tune.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/ops.h"
#include "model/dit.h"
#include "tests/testutil.h"

static void test_pick_rules(void **state) {
    (void)state;
    ts_dit_tune_t t = {0};
    /* fused 10 % faster and within its bound: fused, whatever the default */
    t.ms[TS_ATTN_FUSED] = 0.9, t.ms[TS_ATTN_COMPOSED] = 1.0, t.fused_diff = 1e-6;
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F32, TS_ATTN_COMPOSED), TS_ATTN_FUSED);
    /* within 3 %: the default */
    t.ms[TS_ATTN_FUSED] = 0.98;
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F32, TS_ATTN_COMPOSED), TS_ATTN_COMPOSED);
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F32, TS_ATTN_FUSED), TS_ATTN_FUSED);
    /* composed faster */
    t.ms[TS_ATTN_FUSED] = 1.2;
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F32, TS_ATTN_FUSED), TS_ATTN_COMPOSED);
    /* a fast fused attention that computes something else is never taken: over f32's bound, */
    t.ms[TS_ATTN_FUSED] = 0.5, t.fused_diff = 2e-3;
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F32, TS_ATTN_FUSED), TS_ATTN_COMPOSED);
    /* (the same difference is within bf16's) */
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_BF16, TS_ATTN_COMPOSED), TS_ATTN_FUSED);
    t.fused_diff = 0.2;
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_BF16, TS_ATTN_FUSED), TS_ATTN_COMPOSED);
    t.fused_diff = NAN;
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F16, TS_ATTN_FUSED), TS_ATTN_COMPOSED);
    t.fused_diff = INFINITY;
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F32, TS_ATTN_FUSED), TS_ATTN_COMPOSED);
    /* not measured (cannot run): composed */
    t.fused_diff = 0.0, t.ms[TS_ATTN_FUSED] = 0.0;
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F32, TS_ATTN_FUSED), TS_ATTN_COMPOSED);
    /* nothing measured: the default */
    memset(&t, 0, sizeof t);
    assert_int_equal(ts_dit_tune_pick(&t, TS_PREC_F32, TS_ATTN_FUSED), TS_ATTN_FUSED);

    /* graphs: the same bits and more than 3 % faster than the attention kept */
    memset(&t, 0, sizeof t);
    t.ms[TS_ATTN_FUSED] = 1.0, t.ms[TS_ATTN_COMPOSED] = 2.0, t.ms_graphs = 0.9, t.graphs_same = 1;
    assert_true(ts_dit_tune_graphs_keep(&t, TS_ATTN_FUSED));
    assert_true(ts_dit_tune_graphs_keep(&t, TS_ATTN_COMPOSED));
    t.ms_graphs = 0.99;
    assert_false(ts_dit_tune_graphs_keep(&t, TS_ATTN_FUSED));
    t.ms_graphs = 0.5, t.graphs_same = 0;
    assert_false(ts_dit_tune_graphs_keep(&t, TS_ATTN_FUSED));
    t.ms_graphs = 0.0, t.graphs_same = 1; /* not measured */
    assert_false(ts_dit_tune_graphs_keep(&t, TS_ATTN_FUSED));
    /* with the epilogues kept, the graphs are measured against them */
    t.ms_graphs = 0.9, t.epilogues = 1, t.ms_epilogues = 0.92;
    assert_false(ts_dit_tune_graphs_keep(&t, TS_ATTN_FUSED));
    t.ms_epilogues = 0.95;
    assert_true(ts_dit_tune_graphs_keep(&t, TS_ATTN_FUSED));

    /* the epilogues: within 1e-2 of the two kernels' output and more than 3 % faster */
    memset(&t, 0, sizeof t);
    t.ms[TS_ATTN_FUSED] = 1.0, t.ms_epilogues = 0.9, t.epilogues_diff = 1e-3;
    assert_true(ts_dit_tune_epilogues_keep(&t, TS_ATTN_FUSED));
    t.ms_epilogues = 0.98;
    assert_false(ts_dit_tune_epilogues_keep(&t, TS_ATTN_FUSED));
    t.ms_epilogues = 0.5, t.epilogues_diff = 0.05; /* a bias lost or doubled */
    assert_false(ts_dit_tune_epilogues_keep(&t, TS_ATTN_FUSED));
    t.epilogues_diff = NAN;
    assert_false(ts_dit_tune_epilogues_keep(&t, TS_ATTN_FUSED));
}

/* A `tiny` DiT with every parameter N(0, 0.05) (DiT's own init zeroes the adaLN and final
 * layers: an output of 0 would hide any difference). */
static void make_model(ts_engine_t *e, ts_dit_t *m, int max_batch, int trainable, int learn_sigma) {
    ts_dit_config_t cfg;
    TU_CHECK_OK(ts_dit_config_preset("tiny", &cfg));
    cfg.learn_sigma = learn_sigma;
    TU_CHECK_OK(ts_dit_create(m, &cfg, e, max_batch, trainable));
    TU_CHECK_OK(ts_rng_normal(e, &m->param_mem, 7, 0));
    TU_CHECK_OK(ts_scale(e, &m->param_mem, 0.05f));
}

/* The velocity of B samples (fixed noise, t, labels) at m's settings, on the host. */
static float *velocity(ts_dit_t *m, int B) {
    const ts_dit_config_t *c = &m->cfg;
    ts_tensor_t x, t, v;
    tu_alloc_f32(&x, 4, TS_SHAPE(B, c->in_channels, c->input_size, c->input_size));
    tu_alloc_f32(&t, 1, TS_SHAPE(B));
    TU_CHECK_OK(ts_rng_normal(m->eng, &x, 3, 0));
    int32_t y[16];
    for (int b = 0; b < B; b++) {
        tu_f32(&t)[b] = (float)(b + 1) / (float)(B + 1);
        y[b] = b % (c->num_classes + 1);
    }
    TU_CHECK_OK(ts_dit_forward(m, &x, &t, y, B, &v));
    float *out = tu_host_copy(&v);
    TU_FREE_TENSORS(&x, &t);
    return out;
}

/* ts_dit_tune at precision p: what it measured, what it left the model on, and that the model
 * then computes what a fresh one with that attention does. */
static void tune_at(ts_engine_t *e, ts_precision_t p, double bound, int learn_sigma) {
    const int B = 6;
    ts_dit_t m, fresh;
    make_model(e, &m, B, 0, learn_sigma);
    make_model(e, &fresh, B, 0, learn_sigma);
    TU_CHECK_OK(ts_dit_set_precision(&m, p, NULL, 0));
    TU_CHECK_OK(ts_dit_set_precision(&fresh, p, NULL, 0));
    ts_attn_impl_t def = ts_dit_default_attention(&m);
    ts_dit_tune_t t;
    TU_CHECK_OK(ts_dit_tune(&m, B, 3, &t));
    printf("  %s: composed %.3f ms, fused %.3f ms (output %.2e off the composed one's), "
           "kept %s: %s\n",
           ts_precision_name(p), t.ms[TS_ATTN_COMPOSED], t.ms[TS_ATTN_FUSED], t.fused_diff,
           ts_attn_name(t.attn), t.note);
    assert_int_equal(t.batch, B);
    assert_true(t.ms[TS_ATTN_COMPOSED] > 0.0);
    assert_int_equal(t.attn, m.attn);
    assert_int_equal(t.attn, ts_dit_tune_pick(&t, p, def));
    assert_false(t.graphs_measured); /* a CPU has none */
    assert_false(t.graphs);
    TU_CHECK_CONTAINS(t.note, ts_attn_name(t.attn));
    if (p == TS_PREC_F16) { /* a CPU has no f16 fused attention */
        assert_true(t.ms[TS_ATTN_FUSED] == 0.0);
        assert_int_equal(t.attn, TS_ATTN_COMPOSED);
        TU_CHECK_CONTAINS(t.note, "cannot run here");
    } else {
        assert_true(t.ms[TS_ATTN_FUSED] > 0.0);
        assert_true(t.fused_diff >= 0.0 && t.fused_diff <= bound);
    }
    /* left consistent: its forward is a fresh model's with the attention it kept */
    TU_CHECK_OK(ts_dit_set_attention(&fresh, t.attn));
    float *a = velocity(&m, B), *b = velocity(&fresh, B);
    int64_t n = (int64_t)B * m.cfg.in_channels * m.cfg.input_size * m.cfg.input_size;
    assert_memory_equal(a, b, (size_t)n * sizeof *a);
    free(a), free(b);
    ts_dit_free(&m);
    ts_dit_free(&fresh);
}

static void test_tune_f32(void **state) { tune_at(*state, TS_PREC_F32, 1e-4, 0); }

/* A learned-σ model: the velocity compared is the first half of the output channels, all of it
 * written by each forward (a probe of the whole 2C would compare memory no forward wrote). */
static void test_tune_learned_sigma(void **state) { tune_at(*state, TS_PREC_F32, 1e-4, 1); }

static void test_tune_bf16(void **state) {
    char why[256] = "";
    if (ts_engine_precision_check(*state, TS_PREC_BF16, why, sizeof why) != TS_OK) {
        print_message("test_tune_bf16: skipped: %s\n", why);
        skip();
    }
    tune_at(*state, TS_PREC_BF16, 0.1, 0);
}

static void test_tune_f16(void **state) { tune_at(*state, TS_PREC_F16, 0.0, 0); }

static void test_tune_refusals(void **state) {
    ts_engine_t *e = *state;
    ts_dit_t m;
    ts_dit_tune_t t;
    make_model(e, &m, 4, 1, 0);
    assert_int_equal(ts_dit_tune(&m, 4, 3, &t), TS_EINVAL); /* trainable */
    ts_dit_free(&m);
    make_model(e, &m, 4, 0, 0);
    assert_int_equal(ts_dit_tune(&m, 5, 3, &t), TS_EINVAL);
    assert_int_equal(ts_dit_tune(&m, 0, 3, &t), TS_EINVAL);
    assert_int_equal(ts_dit_tune(&m, 4, 0, &t), TS_EINVAL);
    assert_int_equal(ts_dit_tune(&m, 4, TS_DIT_TUNE_MAX_REPS + 1, &t), TS_EINVAL);
    assert_int_equal(ts_dit_tune(&m, 4, 3, NULL), TS_EINVAL);
    ts_dit_free(&m);
}

static void test_choose(void **state) {
    ts_engine_t *e = *state;
    for (int c = TS_ATTN_CHOOSE_AUTO; c <= TS_ATTN_CHOOSE_COMPOSED; c++) {
        ts_attn_choice_t back;
        TU_CHECK_OK(ts_attn_choice_parse(ts_attn_choice_name((ts_attn_choice_t)c), &back));
        assert_int_equal(back, c);
    }
    ts_attn_choice_t x;
    assert_int_equal(ts_attn_choice_parse("flash", &x), TS_EINVAL);
    assert_int_equal(ts_attn_choice_parse(NULL, &x), TS_EINVAL);

    ts_dit_t m;
    char note[512];
    make_model(e, &m, 4, 0, 0);
    ts_attn_impl_t def = ts_dit_default_attention(&m);
    /* auto on a CPU: the default, nothing measured */
    TU_CHECK_OK(ts_dit_choose_attention(&m, TS_ATTN_CHOOSE_AUTO, 4, note, sizeof note));
    assert_int_equal(m.attn, def);
    TU_CHECK_CONTAINS(note, "(the default)");
    /* asked for */
    TU_CHECK_OK(ts_dit_choose_attention(&m, TS_ATTN_CHOOSE_COMPOSED, 4, note, sizeof note));
    assert_int_equal(m.attn, TS_ATTN_COMPOSED);
    assert_string_equal(note, "attention composed");
    TU_CHECK_OK(ts_dit_choose_attention(&m, TS_ATTN_CHOOSE_FUSED, 4, note, sizeof note));
    assert_int_equal(m.attn, TS_ATTN_FUSED);
    /* measured */
    TU_CHECK_OK(ts_dit_choose_attention(&m, TS_ATTN_CHOOSE_MEASURE, 4, note, sizeof note));
    TU_CHECK_CONTAINS(note, "attention measured: ");
    TU_CHECK_CONTAINS(note, ts_attn_name(m.attn));
    assert_int_equal(ts_dit_choose_attention(&m, TS_ATTN_CHOOSE_MEASURE, 5, note, sizeof note),
                     TS_EINVAL); /* past max_batch */
    /* fused where the model cannot take it (f16 on a CPU): it keeps the default, and says so */
    TU_CHECK_OK(ts_dit_set_precision(&m, TS_PREC_F16, NULL, 0));
    TU_CHECK_OK(ts_dit_choose_attention(&m, TS_ATTN_CHOOSE_FUSED, 4, note, sizeof note));
    assert_int_equal(m.attn, TS_ATTN_COMPOSED);
    TU_CHECK_CONTAINS(note, "fused cannot run here");
    assert_int_equal(ts_dit_choose_attention(&m, (ts_attn_choice_t)9, 4, note, sizeof note),
                     TS_EINVAL);
    ts_dit_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick_rules),
        cmocka_unit_test(test_tune_f32),
        cmocka_unit_test(test_tune_learned_sigma),
        cmocka_unit_test(test_tune_bf16),
        cmocka_unit_test(test_tune_f16),
        cmocka_unit_test(test_tune_refusals),
        cmocka_unit_test(test_choose),
    };
    return cmocka_run_group_tests(tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
