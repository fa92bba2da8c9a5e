/*
 * test_vae.c — model/vae.{h,c} and model/vae_io.c without PyTorch: the config, the parameter
 * table's names and size, the workspace's size, files in and out (and every way a file is
 * refused, each naming the tensor), and the forwards' shapes, errors and batch invariance.
 *
 * The numbers themselves are checked against an independent PyTorch model by parity_vae
 * (tests/parity/run_vae_parity.py); here a small config (8 and 16 channels, 4 groups) keeps the
 * forwards under a second even under the sanitizers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "model/safetensors.h"
#include "model/vae.h"
#include "tests/testutil.h"

#define ERRLEN 512

static void small_config(ts_vae_config_t *c) {
    ts_vae_config_sd(c);
    c->n_blocks = 2;
    c->block_out[0] = 8, c->block_out[1] = 16;
    c->layers_per_block = 1;
    c->groups = 4;
}

/* A small model with every parameter uniform in [-0.5, 0.5) (seeded). */
static ts_vae_t *small_model(uint64_t seed) {
    ts_vae_config_t c;
    small_config(&c);
    ts_vae_t *m;
    char err[ERRLEN] = "";
    TU_CHECK_RC_MSG(ts_vae_new(&m, &c, err, sizeof err), TS_OK, err);
    tu_rng_t r = {seed};
    tu_fill_uniform(&r, &m->slab, -0.5f, 0.5f);
    return m;
}

static const ts_vae_param_t *find_param(const ts_vae_t *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0)
            return &m->params[i];
    return NULL;
}

/* ---- config and table ------------------------------------------------------------------- */

static void test_sd_config_and_table(void **state) {
    (void)state;
    ts_vae_config_t c;
    char err[ERRLEN] = "";
    ts_vae_config_sd(&c);
    TU_CHECK_RC_MSG(ts_vae_config_check(&c, err, sizeof err), TS_OK, err);
    assert_int_equal(ts_vae_factor(&c), 8);
    ts_vae_t *m;
    TU_CHECK_RC_MSG(ts_vae_new(&m, &c, err, sizeof err), TS_OK, err);
    /* diffusers' AutoencoderKL at this config has 83,653,863 parameters */
    assert_int_equal(ts_vae_numel(m), 83653863);
    static const struct {
        const char *name;
        int ndim;
        int64_t shape[4];
    } want[] = {
        {"encoder.conv_in.weight", 4, {128, 3, 3, 3}},
        {"encoder.down_blocks.0.resnets.0.norm1.weight", 1, {128}},
        {"encoder.down_blocks.1.resnets.0.conv_shortcut.weight", 4, {256, 128, 1, 1}},
        {"encoder.down_blocks.0.downsamplers.0.conv.weight", 4, {128, 128, 3, 3}},
        {"encoder.mid_block.attentions.0.group_norm.weight", 1, {512}},
        {"encoder.mid_block.attentions.0.to_q.weight", 2, {512, 512}},
        {"encoder.mid_block.attentions.0.to_out.0.bias", 1, {512}},
        {"encoder.conv_out.weight", 4, {8, 512, 3, 3}},
        {"quant_conv.weight", 4, {8, 8, 1, 1}},
        {"post_quant_conv.weight", 4, {4, 4, 1, 1}},
        {"decoder.conv_in.weight", 4, {512, 4, 3, 3}},
        {"decoder.up_blocks.0.upsamplers.0.conv.weight", 4, {512, 512, 3, 3}},
        {"decoder.up_blocks.2.resnets.0.conv_shortcut.weight", 4, {256, 512, 1, 1}},
        {"decoder.up_blocks.3.resnets.2.conv2.weight", 4, {128, 128, 3, 3}},
        {"decoder.conv_out.weight", 4, {3, 128, 3, 3}},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const ts_vae_param_t *p = find_param(m, want[i].name);
        if (!p)
            fail_msg("no parameter %s", want[i].name);
        assert_int_equal(p->ndim, want[i].ndim);
        assert_memory_equal(p->shape, want[i].shape, (size_t)p->ndim * sizeof(int64_t));
    }
    assert_null(find_param(m, "decoder.up_blocks.3.upsamplers.0.conv.weight")); /* last: none */
    assert_null(find_param(m, "encoder.down_blocks.3.downsamplers.0.conv.weight"));
    assert_null(find_param(m, "encoder.down_blocks.3.resnets.0.conv_shortcut.weight"));

    /* workspace at 256×256: four activations of 256 channels × 256² (the decoder's widest), the
     * attention's (3·512, 1024) and (1024, 1024), and at most 16 MiB of im2col */
    size_t act = (size_t)256 * 256 * 256 * 4;
    size_t bytes = ts_vae_work_bytes(&c, 256, 256);
    assert_true(bytes >= 4 * act + (3 * 512 * 1024 + 1024 * 1024) * 4);
    assert_true(bytes <= 4 * act + (3 * 512 * 1024 + 1024 * 1024) * 4 + (16u << 20) + 4096);
    assert_int_equal(ts_vae_work_bytes(&c, 255, 256), 0);
    assert_int_equal(ts_vae_work_bytes(&c, 0, 256), 0);
    ts_vae_free(m);

    c.groups = 48; /* does not divide 128 */
    TU_CHECK_RC(ts_vae_config_check(&c, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "block_out_channels[0]");
    ts_vae_config_sd(&c);
    c.n_blocks = 0;
    TU_CHECK_RC(ts_vae_config_check(&c, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_vae_new(&m, &c, err, sizeof err), TS_EINVAL);
    assert_null(m);
}

/* ---- files ------------------------------------------------------------------------------- */

/* Writes m's parameters to path, with parameter `drop` left out (−1: none), parameter `reshape`
 * given one more column (−1: none), an extra tensor named extra (NULL: none) and, when old,
 * the attention under its older names as (C, C, 1, 1). */
static void write_variant(const ts_vae_t *m, const char *path, int drop, int reshape,
                          const char *extra, int old) {
    ts_st_entry_t *en = calloc((size_t)m->n_params + 1, sizeof *en);
    char(*names)[96] = calloc((size_t)m->n_params, sizeof *names);
    float *big = calloc(1 << 16, sizeof *big);
    assert_non_null(en);
    assert_non_null(names);
    assert_non_null(big);
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const ts_vae_param_t *p = &m->params[i];
        if (i == drop)
            continue;
        ts_st_entry_t *e = &en[n++];
        snprintf(names[i], sizeof names[i], "%s", p->name);
        e->ndim = p->ndim;
        memcpy(e->shape, p->shape, sizeof p->shape);
        if (old && p->attn) {
            static const char *const from[4] = {".to_q.", ".to_k.", ".to_v.", ".to_out.0."};
            static const char *const to[4] = {".query.", ".key.", ".value.", ".proj_attn."};
            for (int k = 0; k < 4; k++) {
                char *at = strstr(p->name, from[k]) ? strstr(names[i], from[k]) : NULL;
                if (at) {
                    char tail[96];
                    snprintf(tail, sizeof tail, "%s", at + strlen(from[k]));
                    snprintf(at, sizeof names[i] - (size_t)(at - names[i]), "%s%s", to[k], tail);
                }
            }
            if (p->ndim == 2)
                e->ndim = 4, e->shape[2] = e->shape[3] = 1;
        }
        e->name = names[i];
        e->dtype = TS_ST_F32;
        e->data = (const float *)m->slab.data + p->offset;
        if (i == reshape) {
            e->shape[e->ndim - 1] += 1; /* the data must hold the larger shape */
            e->data = big;
        }
    }
    if (extra)
        en[n++] = (ts_st_entry_t){
            .name = extra, .dtype = TS_ST_F32, .ndim = 1, .shape = {3}, .data = big};
    char err[ERRLEN] = "";
    TU_CHECK_RC_MSG(ts_st_write(path, en, n, NULL, 0, err, sizeof err), TS_OK, err);
    free(en);
    free(names);
    free(big);
}

static void test_save_open_round_trip_and_both_namings(void **state) {
    (void)state;
    ts_vae_t *m = small_model(1), *back;
    char err[ERRLEN] = "";
    const char *path = tu_temp_path("vae.safetensors");
    TU_CHECK_RC_MSG(ts_vae_save(m, path, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_open(&back, path, NULL, err, sizeof err), TS_OK, err);
    assert_int_equal(back->cfg.groups, 4); /* from the metadata */
    assert_int_equal(back->cfg.n_blocks, 2);
    assert_int_equal(back->cfg.block_out[1], 16);
    assert_int_equal(back->cfg.layers_per_block, 1);
    assert_string_equal(back->attn_naming, "to_q/to_k/to_v/to_out.0");
    assert_memory_equal(back->slab.data, m->slab.data, ts_tensor_nbytes(&m->slab));
    ts_vae_free(back);

    const char *old = tu_temp_path("old.safetensors");
    write_variant(m, old, -1, -1, NULL, 1);
    TU_CHECK_RC_MSG(ts_vae_open(&back, old, &m->cfg, err, sizeof err), TS_OK, err);
    assert_string_equal(back->attn_naming, "query/key/value/proj_attn");
    assert_memory_equal(back->slab.data, m->slab.data, ts_tensor_nbytes(&m->slab));
    ts_vae_free(back);
    ts_vae_free(m);
}

static void test_open_refuses_bad_files(void **state) {
    (void)state;
    ts_vae_t *m = small_model(2), *back = NULL;
    char err[ERRLEN] = "";
    const char *path = tu_temp_path("bad.safetensors");
    int conv1 = -1, q = -1;
    for (int i = 0; i < m->n_params; i++) {
        if (strcmp(m->params[i].name, "decoder.up_blocks.1.resnets.1.conv1.weight") == 0)
            conv1 = i;
        if (strcmp(m->params[i].name, "encoder.mid_block.attentions.0.to_k.weight") == 0)
            q = i;
    }
    assert_true(conv1 >= 0 && q >= 0);

    write_variant(m, path, conv1, -1, NULL, 0);
    TU_CHECK_RC(ts_vae_open(&back, path, &m->cfg, err, sizeof err), TS_ENOTFOUND);
    TU_CHECK_CONTAINS(err, "decoder.up_blocks.1.resnets.1.conv1.weight");
    TU_CHECK_CONTAINS(err, "missing");
    assert_null(back);

    write_variant(m, path, -1, q, NULL, 0);
    TU_CHECK_RC(ts_vae_open(&back, path, &m->cfg, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "encoder.mid_block.attentions.0.to_k.weight");
    TU_CHECK_CONTAINS(err, "[16,17]");

    write_variant(m, path, -1, -1, "decoder.surprise", 0);
    TU_CHECK_RC(ts_vae_open(&back, path, &m->cfg, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, "decoder.surprise");

    write_variant(m, path, -1, -1, "encoder.down.0.block.0.norm1.weight", 0);
    TU_CHECK_RC(ts_vae_open(&back, path, &m->cfg, err, sizeof err), TS_EKIND);
    TU_CHECK_CONTAINS(err, "CompVis");

    tu_f32(&m->slab)[m->params[conv1].offset + 5] = NAN;
    TU_CHECK_RC(ts_vae_save(m, path, err, sizeof err), TS_OK);
    TU_CHECK_RC(ts_vae_open(&back, path, NULL, err, sizeof err), TS_ENONFINITE);
    TU_CHECK_CONTAINS(err, "decoder.up_blocks.1.resnets.1.conv1.weight");

    TU_CHECK_RC(ts_vae_open(&back, tu_temp_path("absent.safetensors"), NULL, err, sizeof err),
                TS_ENOTFOUND);
    assert_null(back);
    ts_vae_free(m);
}

/* ---- forwards ---------------------------------------------------------------------------- */

static void test_forwards_batch_invariant(void **state) {
    ts_engine_t *e = *state;
    ts_vae_t *m = small_model(3);
    char err[ERRLEN] = "";
    ts_tensor_t img, lat, lv, dec, one_img, one_lat, one_lv, one_dec, view;
    tu_alloc_f32(&img, 4, TS_SHAPE(3, 3, 8, 12));
    tu_alloc_f32(&lat, 4, TS_SHAPE(3, 4, 4, 6));
    tu_alloc_f32(&lv, 4, TS_SHAPE(3, 4, 4, 6));
    tu_alloc_f32(&dec, 4, TS_SHAPE(3, 3, 8, 12));
    tu_alloc_f32(&one_lat, 4, TS_SHAPE(1, 4, 4, 6));
    tu_alloc_f32(&one_lv, 4, TS_SHAPE(1, 4, 4, 6));
    tu_alloc_f32(&one_dec, 4, TS_SHAPE(1, 3, 8, 12));
    tu_rng_t r = {4};
    tu_fill_uniform(&r, &img, -1, 1);
    tu_f32(&img)[2 * 3 * 96 + 40] = NAN; /* image 2 only */
    TU_CHECK_RC_MSG(ts_vae_encode(m, e, &lat, &lv, &img, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_decode(m, e, &dec, &lat, err, sizeof err), TS_OK, err);
    for (int64_t b = 0; b < 3; b++) {
        TU_CHECK_OK(ts_tensor_slice(&one_img, &img, b, 1));
        TU_CHECK_RC_MSG(ts_vae_encode(m, e, &one_lat, &one_lv, &one_img, err, sizeof err), TS_OK,
                        err);
        TU_CHECK_OK(ts_tensor_slice(&view, &lat, b, 1));
        tu_check_close(tu_f32(&one_lat), tu_f32(&view), 96, 0, 0, "latent of image %lld",
                       (long long)b);
        TU_CHECK_OK(ts_tensor_slice(&view, &lv, b, 1));
        tu_check_close(tu_f32(&one_lv), tu_f32(&view), 96, 0, 0, "logvar of image %lld",
                       (long long)b);
        TU_CHECK_RC_MSG(ts_vae_decode(m, e, &one_dec, &one_lat, err, sizeof err), TS_OK, err);
        TU_CHECK_OK(ts_tensor_slice(&view, &dec, b, 1));
        tu_check_close(tu_f32(&one_dec), tu_f32(&view), 288, 0, 0, "decoded %lld", (long long)b);
        /* the NaN of image 2 reaches its own latent (through the attention, all of it) only */
        for (int64_t i = 0; i < 96; i++)
            assert_int_equal(isnan(tu_f32(&lat)[b * 96 + i]) != 0, b == 2);
    }
    TU_FREE_TENSORS(&img, &lat, &lv, &dec, &one_lat, &one_lv, &one_dec);
    ts_vae_free(m);
}

/* At f16 with 16-bit weights (the GPU's route, turned on here for the CPU) the convolutions read
 * the weights converted once: the decode after changing the weights (ts_vae_weights_changed)
 * equals a fresh model's with those weights, bit for bit, and differs from the decode before;
 * f16 → f32 → f16 gives the first bits again, and f32 differs. */
static void test_lp_weights_follow_changes(void **state) {
    ts_engine_t *e = *state;
    ts_vae_t *m = small_model(5), *fresh = small_model(5);
    m->cpu_lp_weights = fresh->cpu_lp_weights = 1;
    char err[ERRLEN] = "";
    ts_tensor_t lat, d1, d2, d3, d32;
    tu_alloc_f32(&lat, 4, TS_SHAPE(1, 4, 4, 6));
    tu_alloc_f32(&d1, 4, TS_SHAPE(1, 3, 8, 12));
    tu_alloc_like(&d2, &d1), tu_alloc_like(&d3, &d1), tu_alloc_like(&d32, &d1);
    tu_rng_t r = {6};
    tu_fill_uniform(&r, &lat, -1, 1);
    TU_CHECK_RC_MSG(ts_vae_set_precision(m, e, TS_PREC_F16, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_decode(m, e, &d1, &lat, err, sizeof err), TS_OK, err);
    float *w = tu_f32(&m->slab), *wf = tu_f32(&fresh->slab);
    for (int64_t i = 0; i < ts_vae_numel(m); i++)
        w[i] = wf[i] = w[i] * 0.75f;
    ts_vae_weights_changed(m);
    TU_CHECK_RC_MSG(ts_vae_decode(m, e, &d2, &lat, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_set_precision(fresh, e, TS_PREC_F16, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_decode(fresh, e, &d3, &lat, err, sizeof err), TS_OK, err);
    assert_memory_equal(tu_f32(&d2), tu_f32(&d3), ts_tensor_nbytes(&d2));
    assert_memory_not_equal(tu_f32(&d1), tu_f32(&d2), ts_tensor_nbytes(&d1));
    TU_CHECK_RC_MSG(ts_vae_set_precision(m, e, TS_PREC_F32, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_decode(m, e, &d32, &lat, err, sizeof err), TS_OK, err);
    assert_memory_not_equal(tu_f32(&d32), tu_f32(&d2), ts_tensor_nbytes(&d2));
    TU_CHECK_RC_MSG(ts_vae_set_precision(m, e, TS_PREC_F16, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_decode(m, e, &d1, &lat, err, sizeof err), TS_OK, err);
    assert_memory_equal(tu_f32(&d1), tu_f32(&d2), ts_tensor_nbytes(&d2));
    TU_FREE_TENSORS(&lat, &d1, &d2, &d3, &d32);
    ts_vae_free(m);
    ts_vae_free(fresh);
}

static void test_forwards_refuse_bad_shapes(void **state) {
    ts_engine_t *e = *state;
    ts_vae_t *m = small_model(5);
    char err[ERRLEN] = "";
    ts_tensor_t img, odd, lat, lat_wrong, img1, dec_wrong;
    tu_alloc_f32(&img, 4, TS_SHAPE(1, 3, 8, 8));
    tu_alloc_f32(&odd, 4, TS_SHAPE(1, 3, 7, 8));
    tu_alloc_f32(&lat, 4, TS_SHAPE(1, 4, 4, 4));
    tu_alloc_f32(&lat_wrong, 4, TS_SHAPE(1, 4, 3, 4));
    tu_alloc_f32(&img1, 4, TS_SHAPE(1, 1, 8, 8));
    tu_alloc_f32(&dec_wrong, 4, TS_SHAPE(2, 3, 8, 8));
    TU_CHECK_RC_MSG(ts_vae_encode(m, e, &lat, NULL, &img, err, sizeof err), TS_OK, err);
    TU_CHECK_RC(ts_vae_encode(m, e, &lat, NULL, &odd, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "multiples of 2");
    TU_CHECK_RC(ts_vae_encode(m, e, &lat_wrong, NULL, &img, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "latent");
    TU_CHECK_RC(ts_vae_encode(m, e, &lat, NULL, &img1, err, sizeof err), TS_ESHAPE);
    TU_CHECK_CONTAINS(err, "image");
    TU_CHECK_RC(ts_vae_encode(m, e, &lat, &lat_wrong, &img, err, sizeof err), TS_ESHAPE);
    TU_CHECK_RC(ts_vae_decode(m, e, &dec_wrong, &lat, err, sizeof err), TS_ESHAPE);
    TU_CHECK_RC(ts_vae_decode(m, NULL, &img, &lat, err, sizeof err), TS_EINVAL);
    /* the workspace grows for a larger image and the result does not change */
    ts_tensor_t big, big_lat, lat2;
    tu_alloc_f32(&big, 4, TS_SHAPE(1, 3, 16, 8));
    tu_alloc_f32(&big_lat, 4, TS_SHAPE(1, 4, 8, 4));
    tu_alloc_f32(&lat2, 4, TS_SHAPE(1, 4, 4, 4));
    tu_rng_t r = {6};
    tu_fill_uniform(&r, &img, -1, 1);
    TU_CHECK_RC_MSG(ts_vae_encode(m, e, &lat, NULL, &img, err, sizeof err), TS_OK, err);
    TU_CHECK_RC_MSG(ts_vae_encode(m, e, &big_lat, NULL, &big, err, sizeof err), TS_OK, err);
    assert_int_equal(m->work_h, 16);
    TU_CHECK_RC_MSG(ts_vae_encode(m, e, &lat2, NULL, &img, err, sizeof err), TS_OK, err);
    tu_check_close(tu_f32(&lat2), tu_f32(&lat), 64, 0, 0, "after the workspace grew");
    TU_FREE_TENSORS(&img, &odd, &lat, &lat_wrong, &img1, &dec_wrong, &big, &big_lat, &lat2);
    ts_vae_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sd_config_and_table),
        cmocka_unit_test_setup_teardown(test_save_open_round_trip_and_both_namings,
                                        tu_setup_temp_dir, tu_teardown_temp_dir),
        cmocka_unit_test_setup_teardown(test_open_refuses_bad_files, tu_setup_temp_dir,
                                        tu_teardown_temp_dir),
        cmocka_unit_test(test_forwards_batch_invariant),
        cmocka_unit_test(test_forwards_refuse_bad_shapes),
        cmocka_unit_test(test_lp_weights_follow_changes),
    };
    return cmocka_run_group_tests(tests, tu_setup_cpu_engine, tu_teardown_cpu_engine);
}
