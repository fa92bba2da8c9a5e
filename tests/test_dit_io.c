/*
 * test_dit_io.c — DiT weights to and from safetensors (model/dit_io.h), on a CPU engine.
 *
 * A tiny DiT (image 8×8×1, patch 2, hidden 32, depth 2, 2 heads, 3 classes, MLP ratio 2,
 * freq_dim 64 — the last two off their defaults so the metadata must carry them) with every
 * parameter random (DiT's own init zeroes adaLN and the final layer, which would hide mistakes):
 *
 *   - F32: save → open gives bit-identical parameters and a bit-identical forward pass; the file
 *     holds pos_embed (1, T, h), the 4-D patch-embed weight, the config, "format" and extras;
 *   - F16, BF16: every parameter equals the F32 value rounded to the dtype (exact), and the
 *     fixed pos_embed, stored rounded, is still accepted;
 *   - another slab of the same layout (an EMA copy) saves and loads the same way;
 *   - broken files — a missing tensor, a wrong shape or dtype, a NaN or Inf, an unknown tensor,
 *     a wrong pos_embed, a missing or garbage config key, a foreign format — fail with
 *     TS_ECORRUPT and a message naming the tensor or key, and leave *m empty (ts_dit_open) or
 *     the parameters untouched (ts_dit_load, structural errors);
 *   - save refuses bad arguments, reserved metadata keys, non-finite parameters and values that
 *     overflow F16, and writes nothing then.
 *
 * Broken files are made from a good one with the public API: read it, edit the entry list, write
 * it again. Files live in a private mkdtemp directory that is removed afterwards.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "kernels/math.h"
#include "model/dit_io.h"
#include "tests/testutil.h"

#define SEED 20250611u

/* ---- fixture: an engine, a model with random weights, its F32 file ----------------------- */

typedef struct {
    ts_engine_t e;
    ts_dit_config_t cfg;
    ts_dit_t m;
    char dir[128];
    char good[160]; /* the model saved as F32 */
} fixture_t;

static void tiny_config(ts_dit_config_t *c) {
    memset(c, 0, sizeof *c);
    c->input_size = 8, c->in_channels = 1, c->patch_size = 2, c->hidden_size = 32;
    c->depth = 2, c->num_heads = 2, c->num_classes = 3, c->mlp_ratio = 2, c->freq_dim = 64;
}

static int setup(void **state) {
    fixture_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    if (tu_engine_init_cpu(&fx->e) != TS_OK)
        return -1;
    tiny_config(&fx->cfg);
    if (ts_dit_create(&fx->m, &fx->cfg, &fx->e, 4, 0) != TS_OK)
        return -1;
    /* every parameter random, O(0.1), so each one matters to the forward pass */
    if (ts_rng_normal(&fx->e, &fx->m.param_mem, SEED, 0) != TS_OK ||
        ts_scale(&fx->e, &fx->m.param_mem, 0.1f) != TS_OK)
        return -1;
    if (tu_make_temp_dir(fx->dir, sizeof fx->dir, "ts_test_dit_io") != 0)
        return -1;
    snprintf(fx->good, sizeof fx->good, "%s/good.safetensors", fx->dir);
    const char *extra[] = {"objective", "velocity", "cluster", "3"};
    char err[256];
    if (ts_dit_save(&fx->m, &fx->m.param_mem, fx->good, TS_ST_F32, extra, 2, err, sizeof err) !=
        TS_OK) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    fixture_t *fx = *state;
    tu_remove_temp_dir(fx->dir);
    ts_dit_free(&fx->m);
    ts_engine_free(&fx->e);
    free(fx);
    return 0;
}

static void path_in(const fixture_t *fx, const char *name, char *out, size_t len) {
    snprintf(out, len, "%s/%s", fx->dir, name);
}

/* The model's parameter slab on the host (the CPU engine's memory itself). */
static const float *slab_of(const ts_dit_t *m) { return (const float *)m->param_mem.data; }

/* One forward pass on fixed inputs; out receives B·C·H·W floats. */
static void forward_fixed(fixture_t *fx, ts_dit_t *m, float *out) {
    const int B = 3, S = fx->cfg.input_size, n = B * S * S;
    ts_tensor_t x, t, v;
    TU_CHECK_OK(ts_tensor_alloc(&x, TS_F32, TS_CPU, 4, TS_SHAPE(B, 1, S, S)));
    TU_CHECK_OK(ts_tensor_alloc(&t, TS_F32, TS_CPU, 1, TS_SHAPE(B)));
    TU_CHECK_OK(ts_rng_normal(&fx->e, &x, 99, 0));
    float *tv = t.data;
    tv[0] = 0.1f, tv[1] = 0.5f, tv[2] = 0.95f;
    const int32_t y[3] = {0, 2, 3}; /* 3 = the null class */
    TU_CHECK_OK(ts_dit_forward(m, &x, &t, y, B, &v));
    memcpy(out, v.data, (size_t)n * sizeof *out);
    ts_tensor_free(&x);
    ts_tensor_free(&t);
}

/* Every parameter of m equals the same range of slab, bit for bit (the padding between
 * tensors is not part of the file and is not compared). */
static void check_params_equal(const ts_dit_t *m, const float *slab) {
    for (int i = 0; i < m->n_params; i++) {
        const ts_dit_param_info_t *pi = &m->info[i];
        if (memcmp(slab_of(m) + pi->offset, slab + pi->offset, (size_t)pi->numel * sizeof(float)) !=
            0) {
            print_error("parameter '%s' differs\n", pi->name);
            fail();
        }
    }
}

/* ---- round trips ------------------------------------------------------------------------- */

static void test_f32_round_trip_is_exact(void **state) {
    fixture_t *fx = *state;
    char err[256] = "";
    ts_dit_t m2;
    TU_CHECK_OK(ts_dit_open(&m2, fx->good, &fx->e, 4, 0, err, sizeof err));
    assert_memory_equal(&m2.cfg, &fx->cfg, sizeof fx->cfg);
    assert_int_equal(m2.n_params, fx->m.n_params);
    check_params_equal(&m2, slab_of(&fx->m));
    float out1[3 * 64], out2[3 * 64];
    forward_fixed(fx, &fx->m, out1);
    forward_fixed(fx, &m2, out2);
    assert_memory_equal(out1, out2, sizeof out1);
    float sum = 0;
    for (int i = 0; i < 3 * 64; i++)
        sum += fabsf(out1[i]);
    assert_true(sum > 1e-3f); /* the comparison compared something */
    ts_dit_free(&m2);

    /* the file itself: names, file shapes, metadata */
    ts_st_file_t f;
    TU_CHECK_OK(ts_st_read(fx->good, &f, err, sizeof err));
    assert_int_equal(f.n_tensors, fx->m.n_params + 1);
    const ts_st_tensor_t *pe = ts_st_find(&f, "pos_embed");
    assert_non_null(pe);
    assert_int_equal(pe->ndim, 3);
    assert_int_equal(pe->shape[0], 1);
    assert_int_equal(pe->shape[1], 16);
    assert_int_equal(pe->shape[2], 32);
    const ts_st_tensor_t *xw = ts_st_find(&f, "x_embedder.proj.weight");
    assert_non_null(xw);
    assert_int_equal(xw->ndim, 4);
    assert_int_equal(xw->shape[0], 32);
    assert_int_equal(xw->shape[1], 1);
    assert_int_equal(xw->shape[2], 2);
    assert_int_equal(xw->shape[3], 2);
    assert_non_null(ts_st_find(&f, "blocks.1.adaLN_modulation.1.weight"));
    assert_non_null(ts_st_find(&f, "final_layer.adaLN_modulation.1.bias"));
    assert_non_null(ts_st_find(&f, "y_embedder.embedding_table.weight"));
    assert_string_equal(ts_st_meta(&f, "format"), "tessera-dit/1");
    assert_string_equal(ts_st_meta(&f, "hidden_size"), "32");
    assert_string_equal(ts_st_meta(&f, "mlp_ratio"), "2");
    assert_string_equal(ts_st_meta(&f, "freq_dim"), "64");
    assert_string_equal(ts_st_meta(&f, "objective"), "velocity");
    assert_string_equal(ts_st_meta(&f, "cluster"), "3");
    ts_dit_config_t c;
    TU_CHECK_OK(ts_dit_config_from_file(&f, &c, err, sizeof err));
    assert_memory_equal(&c, &fx->cfg, sizeof c);
    ts_st_free(&f);
}

/* Learned σ (DiT's published layout): the final layer makes 2C channels; the file says
 * learn_sigma and round-trips; the forward's prediction is the first C channels of each sample
 * and ts_dit_sigma the last C — checked against the same model's final layer split by hand (a
 * learned-σ model whose σ rows are removed is a plain model with the prediction's rows); such a
 * model cannot train, and a bad learn_sigma value is refused. */
static void test_learn_sigma(void **state) {
    fixture_t *fx = *state;
    char path[256], err[256] = "";
    ts_dit_config_t c = fx->cfg; /* C = 1, patch 2 */
    c.learn_sigma = 1;
    ts_dit_t m, plain, sig, m2;
    TU_CHECK_OK(ts_dit_create(&m, &c, &fx->e, 4, 0));
    assert_int_equal(ts_dit_create(&m2, &c, &fx->e, 4, 1), TS_ENOTSUP); /* trainable */
    TU_CHECK_OK(ts_rng_normal(&fx->e, &m.param_mem, SEED + 1, 0));
    TU_CHECK_OK(ts_scale(&fx->e, &m.param_mem, 0.1f));
    /* two plain models with the same weights but the final linear's prediction or σ rows:
     * rows (py, px, c) of 2C channels — c < C the prediction, c ≥ C σ */
    TU_CHECK_OK(ts_dit_create(&plain, &fx->cfg, &fx->e, 4, 0));
    TU_CHECK_OK(ts_dit_create(&sig, &fx->cfg, &fx->e, 4, 0));
    int C = c.in_channels, pp = c.patch_size * c.patch_size, h = c.hidden_size;
    for (int i = 0; i < m.n_params; i++) {
        const ts_dit_param_info_t *src = &m.info[i];
        const ts_dit_param_info_t *dst = &plain.info[i];
        assert_string_equal(src->name, dst->name);
        float *a = (float *)plain.param_mem.data + dst->offset;
        float *b = (float *)sig.param_mem.data + dst->offset;
        const float *w = slab_of(&m) + src->offset;
        if (strncmp(src->name, "final_layer.linear.", 19) != 0) {
            memcpy(a, w, (size_t)src->numel * sizeof *a);
            memcpy(b, w, (size_t)src->numel * sizeof *b);
            continue;
        }
        int64_t width = src->ndim == 2 ? h : 1;
        assert_int_equal(src->shape[0], 2 * pp * C);
        for (int q = 0; q < pp; q++)
            for (int ch = 0; ch < C; ch++) {
                memcpy(a + ((int64_t)q * C + ch) * width, w + ((int64_t)q * 2 * C + ch) * width,
                       (size_t)width * sizeof *a);
                memcpy(b + ((int64_t)q * C + ch) * width, w + ((int64_t)q * 2 * C + C + ch) * width,
                       (size_t)width * sizeof *b);
            }
    }
    enum { B = 3 };
    const int S = c.input_size, n = B * C * S * S;
    float got[3 * 64], got_sigma[3 * 64], want[3 * 64], want_sigma[3 * 64];
    assert_true(n <= 3 * 64);
    forward_fixed(fx, &m, got);
    ts_tensor_t sv;
    TU_CHECK_OK(ts_dit_sigma(&m, B, &sv));
    memcpy(got_sigma, sv.data, (size_t)n * sizeof(float));
    forward_fixed(fx, &plain, want);
    forward_fixed(fx, &sig, want_sigma);
    assert_memory_equal(got, want, (size_t)n * sizeof(float));
    assert_memory_equal(got_sigma, want_sigma, (size_t)n * sizeof(float));
    assert_true(memcmp(got, got_sigma, (size_t)n * sizeof(float)) != 0);
    assert_int_equal(ts_dit_sigma(&plain, B, &sv), TS_EINVAL);
    /* the file */
    path_in(fx, "sigma.safetensors", path, sizeof path);
    TU_CHECK_OK(ts_dit_save(&m, &m.param_mem, path, TS_ST_F32, NULL, 0, err, sizeof err));
    ts_st_file_t f;
    TU_CHECK_OK(ts_st_read(path, &f, err, sizeof err));
    assert_string_equal(ts_st_meta(&f, "learn_sigma"), "true");
    assert_int_equal(ts_st_find(&f, "final_layer.linear.weight")->shape[0], 2 * pp * C);
    ts_st_free(&f);
    TU_CHECK_OK(ts_dit_open(&m2, path, &fx->e, 4, 0, err, sizeof err));
    assert_int_equal(m2.cfg.learn_sigma, 1);
    check_params_equal(&m2, slab_of(&m));
    ts_dit_free(&m2);
    assert_int_equal(ts_dit_open(&m2, path, &fx->e, 4, 1, err, sizeof err), TS_ENOTSUP);
    /* a plain model's file says nothing of it (its bytes unchanged by the key's existence) */
    TU_CHECK_OK(ts_st_read(fx->good, &f, err, sizeof err));
    assert_null(ts_st_meta(&f, "learn_sigma"));
    ts_st_free(&f);
    /* learn_sigma is the config's: an extra key of that name is refused */
    const char *extra[] = {"learn_sigma", "false"};
    assert_int_equal(
        ts_dit_save(&plain, &plain.param_mem, path, TS_ST_F32, extra, 1, err, sizeof err),
        TS_EINVAL);
    ts_dit_free(&m);
    ts_dit_free(&plain);
    ts_dit_free(&sig);
}

static void check_rounded_round_trip(fixture_t *fx, ts_st_dtype_t dtype, const char *name) {
    char path[256], err[256] = "";
    path_in(fx, name, path, sizeof path);
    TU_CHECK_OK(ts_dit_save(&fx->m, &fx->m.param_mem, path, dtype, NULL, 0, err, sizeof err));
    ts_dit_t m2;
    TU_CHECK_OK(ts_dit_open(&m2, path, &fx->e, 2, 1, err, sizeof err));
    assert_int_equal(m2.trainable, 1);
    for (int i = 0; i < fx->m.n_params; i++) {
        const ts_dit_param_info_t *pi = &fx->m.info[i];
        for (int64_t j = 0; j < pi->numel; j++) {
            float a = slab_of(&fx->m)[pi->offset + j], b = slab_of(&m2)[pi->offset + j];
            float want = dtype == TS_ST_F16 ? ts_f16_to_f32(ts_f32_to_f16(a))
                                            : ts_bf16_to_f32(ts_f32_to_bf16(a));
            if (b != want) {
                print_error("%s[%lld]: %g loaded, %g expected (from %g)\n", pi->name, (long long)j,
                            (double)b, (double)want, (double)a);
                fail();
            }
            /* and within the dtype's precision of the original */
            assert_true(fabsf(b - a) <=
                        fabsf(a) * (dtype == TS_ST_F16 ? 0x1p-11f : 0x1p-8f) + 0x1p-24f);
        }
    }
    ts_dit_free(&m2);
    /* the file is half the size of the F32 one, give or take the header */
    ts_st_file_t f16, f32;
    TU_CHECK_OK(ts_st_read(path, &f16, err, sizeof err));
    TU_CHECK_OK(ts_st_read(fx->good, &f32, err, sizeof err));
    assert_int_equal(ts_st_find(&f16, "blocks.0.mlp.fc1.weight")->dtype, dtype);
    assert_true(f16.len < f32.len * 6 / 10);
    ts_st_free(&f16);
    ts_st_free(&f32);
}

static void test_f16_round_trip(void **state) {
    check_rounded_round_trip(*state, TS_ST_F16, "half.safetensors");
}

static void test_bf16_round_trip(void **state) {
    check_rounded_round_trip(*state, TS_ST_BF16, "bf16.safetensors");
}

static void test_other_slab(void **state) {
    fixture_t *fx = *state;
    ts_tensor_t ema;
    TU_CHECK_OK(ts_tensor_alloc(&ema, TS_F32, TS_CPU, 1, TS_SHAPE(fx->m.num_params)));
    TU_CHECK_OK(ts_rng_uniform(&fx->e, &ema, SEED + 1, 0));
    char path[256], err[256] = "";
    path_in(fx, "ema.safetensors", path, sizeof path);
    TU_CHECK_OK(ts_dit_save(&fx->m, &ema, path, TS_ST_F32, NULL, 0, err, sizeof err));
    ts_dit_t m2;
    TU_CHECK_OK(ts_dit_open(&m2, path, &fx->e, 1, 0, err, sizeof err));
    check_params_equal(&m2, ema.data);
    ts_dit_free(&m2);
    /* in memory: the bytes of the file */
    const char *extra[] = {"objective", "velocity"};
    unsigned char *buf = NULL, *file;
    size_t len = 0, flen = 0;
    TU_CHECK_OK(ts_dit_save(&fx->m, &ema, path, TS_ST_F32, extra, 1, err, sizeof err));
    TU_CHECK_OK(ts_dit_save_mem(&fx->m, &ema, TS_ST_F32, extra, 1, &buf, &len, err, sizeof err));
    assert_non_null(file = tu_read_file(path, &flen));
    assert_int_equal(len, flen);
    assert_memory_equal(buf, file, len);
    free(file);
    free(buf);
    TU_CHECK_RC(ts_dit_save_mem(&fx->m, &ema, TS_ST_F32, NULL, 0, NULL, &len, err, sizeof err),
                TS_EINVAL);
    ts_tensor_free(&ema);
}

/* ---- broken files ------------------------------------------------------------------------ */

/* A copy of the good file with its entries and metadata editable before it is written. */
typedef struct {
    ts_st_file_t f;
    ts_st_entry_t *e; /* room for one more */
    int n;
    const char **meta; /* room for one more pair */
    int n_meta;
    void *owned[4]; /* replacement data, freed by edit_done */
    int n_owned;
} edit_t;

static void edit_begin(fixture_t *fx, edit_t *ed) {
    memset(ed, 0, sizeof *ed);
    char err[256];
    TU_CHECK_OK(ts_st_read(fx->good, &ed->f, err, sizeof err));
    ed->e = calloc((size_t)ed->f.n_tensors + 1, sizeof *ed->e);
    ed->meta = calloc(2 * ((size_t)ed->f.n_meta + 1), sizeof *ed->meta);
    assert_non_null(ed->e);
    assert_non_null(ed->meta);
    for (int i = 0; i < ed->f.n_tensors; i++) {
        const ts_st_tensor_t *t = &ed->f.tensors[i];
        ts_st_entry_t *e = &ed->e[ed->n++];
        e->name = t->name;
        e->dtype = t->dtype;
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof e->shape);
        e->data = t->data;
    }
    for (int i = 0; i < ed->f.n_meta; i++) {
        ed->meta[2 * ed->n_meta] = ed->f.meta_keys[i];
        ed->meta[2 * ed->n_meta + 1] = ed->f.meta_vals[i];
        ed->n_meta++;
    }
}

static ts_st_entry_t *edit_entry(edit_t *ed, const char *name) {
    for (int i = 0; i < ed->n; i++)
        if (strcmp(ed->e[i].name, name) == 0)
            return &ed->e[i];
    fail_msg("no entry '%s'", name);
    return NULL;
}

static void edit_remove(edit_t *ed, const char *name) {
    ts_st_entry_t *e = edit_entry(ed, name);
    *e = ed->e[--ed->n];
}

/* A writable copy of an entry's data. */
static float *edit_own_f32(edit_t *ed, ts_st_entry_t *e, int64_t numel) {
    assert_int_equal(e->dtype, TS_ST_F32);
    float *copy = malloc((size_t)numel * sizeof *copy);
    assert_non_null(copy);
    memcpy(copy, e->data, (size_t)numel * sizeof *copy);
    e->data = copy;
    assert_true(ed->n_owned < 4);
    ed->owned[ed->n_owned++] = copy;
    return copy;
}

static void edit_set_meta(edit_t *ed, const char *key, const char *val) {
    for (int i = 0; i < ed->n_meta; i++)
        if (strcmp(ed->meta[2 * i], key) == 0) {
            if (val) {
                ed->meta[2 * i + 1] = val;
            } else { /* remove */
                ed->meta[2 * i] = ed->meta[2 * (ed->n_meta - 1)];
                ed->meta[2 * i + 1] = ed->meta[2 * (ed->n_meta - 1) + 1];
                ed->n_meta--;
            }
            return;
        }
    assert_non_null(val);
    ed->meta[2 * ed->n_meta] = key;
    ed->meta[2 * ed->n_meta + 1] = val;
    ed->n_meta++;
}

/* Writes the edited file to dir/bad.safetensors and frees the edit. */
static void edit_done(fixture_t *fx, edit_t *ed, char *path, size_t len) {
    char err[256];
    path_in(fx, "bad.safetensors", path, len);
    TU_CHECK_OK(ts_st_write(path, ed->e, ed->n, ed->meta, ed->n_meta, err, sizeof err));
    for (int i = 0; i < ed->n_owned; i++)
        free(ed->owned[i]);
    free(ed->e);
    free(ed->meta);
    ts_st_free(&ed->f);
}

/* ts_dit_open of path must fail with TS_ECORRUPT, name `mention`, and leave the model empty. */
static void expect_open_fails(fixture_t *fx, const char *path, const char *mention) {
    ts_dit_t m2;
    memset(&m2, 0x5a, sizeof m2);
    char err[512] = "";
    TU_CHECK_RC(ts_dit_open(&m2, path, &fx->e, 2, 0, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, mention);
    TU_CHECK_CONTAINS(err, "bad.safetensors"); /* and the file */
    assert_null(m2.info);
    assert_null(m2.param_mem.data);
    ts_dit_free(&m2); /* harmless on the empty model */
}

/* Also loads the broken file into the fixture's model with ts_dit_load: must fail with the same
 * mention and, for a structural error, leave every parameter as it was. */
static void expect_load_fails(fixture_t *fx, const char *path, const char *mention, int untouched) {
    size_t bytes = (size_t)fx->m.num_params * sizeof(float);
    float *before = malloc(bytes);
    assert_non_null(before);
    memcpy(before, slab_of(&fx->m), bytes);
    ts_st_file_t f;
    char err[512] = "";
    TU_CHECK_OK(ts_st_read(path, &f, err, sizeof err));
    TU_CHECK_RC(ts_dit_load(&fx->m, &f, err, sizeof err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(err, mention);
    if (untouched)
        assert_memory_equal(before, slab_of(&fx->m), bytes);
    memcpy(fx->m.param_mem.data, before, bytes); /* restore for the next test */
    ts_st_free(&f);
    free(before);
}

static void test_missing_tensor(void **state) {
    fixture_t *fx = *state;
    edit_t ed;
    char path[256];
    edit_begin(fx, &ed);
    edit_remove(&ed, "blocks.1.mlp.fc2.bias");
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "missing tensor 'blocks.1.mlp.fc2.bias'");
    expect_load_fails(fx, path, "blocks.1.mlp.fc2.bias", 1);
}

static void test_wrong_shape(void **state) {
    fixture_t *fx = *state;
    edit_t ed;
    char path[256];
    /* same element count, other shape: (96) → (2, 48) */
    edit_begin(fx, &ed);
    ts_st_entry_t *e = edit_entry(&ed, "blocks.0.attn.qkv.bias");
    e->ndim = 2, e->shape[0] = 2, e->shape[1] = 48;
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path,
                      "tensor 'blocks.0.attn.qkv.bias': shape [2,48] in the file, "
                      "the model needs [96]");
    expect_load_fails(fx, path, "blocks.0.attn.qkv.bias", 1);
    /* the patch-embed weight must be 4-D, not the model's 2-D view */
    edit_begin(fx, &ed);
    e = edit_entry(&ed, "x_embedder.proj.weight");
    e->ndim = 2, e->shape[1] = 4;
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "x_embedder.proj.weight");
}

static void test_wrong_dtype(void **state) {
    fixture_t *fx = *state;
    edit_t ed;
    char path[256];
    edit_begin(fx, &ed);
    ts_st_entry_t *e = edit_entry(&ed, "t_embedder.mlp.2.bias"); /* 32 F32 = 16 I64 */
    e->dtype = TS_ST_I64, e->shape[0] = 16;
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "tensor 't_embedder.mlp.2.bias': dtype I64");
}

static void test_non_finite_weight(void **state) {
    fixture_t *fx = *state;
    edit_t ed;
    char path[256];
    edit_begin(fx, &ed);
    float *w = edit_own_f32(&ed, edit_entry(&ed, "final_layer.linear.weight"), 4 * 32);
    w[5] = NAN;
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "tensor 'final_layer.linear.weight' holds a non-finite value");
    expect_load_fails(fx, path, "element 5", 0);

    edit_begin(fx, &ed);
    w = edit_own_f32(&ed, edit_entry(&ed, "blocks.0.mlp.fc1.bias"), 64);
    w[63] = -INFINITY;
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "blocks.0.mlp.fc1.bias");
}

static void test_unknown_tensor(void **state) {
    fixture_t *fx = *state;
    edit_t ed;
    char path[256];
    edit_begin(fx, &ed);
    ts_st_entry_t extra = *edit_entry(&ed, "blocks.1.attn.qkv.bias");
    extra.name = "blocks.2.attn.qkv.bias"; /* depth is 2 */
    ed.e[ed.n++] = extra;
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "unknown tensor 'blocks.2.attn.qkv.bias'");
    expect_load_fails(fx, path, "unknown tensor", 1);
}

static void test_pos_embed(void **state) {
    fixture_t *fx = *state;
    edit_t ed;
    char path[256], err[256];
    /* off by 1e-3 in one place */
    edit_begin(fx, &ed);
    float *pe = edit_own_f32(&ed, edit_entry(&ed, "pos_embed"), 16 * 32);
    pe[37] += 1e-3f;
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "pos_embed");
    expect_load_fails(fx, path, "element 37", 1);
    /* a different shape */
    edit_begin(fx, &ed);
    ts_st_entry_t *e = edit_entry(&ed, "pos_embed");
    e->ndim = 2, e->shape[0] = 16, e->shape[1] = 32;
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "pos_embed");
    /* within 1e-5: accepted */
    edit_begin(fx, &ed);
    pe = edit_own_f32(&ed, edit_entry(&ed, "pos_embed"), 16 * 32);
    pe[3] += 5e-6f;
    edit_done(fx, &ed, path, sizeof path);
    ts_dit_t m2;
    TU_CHECK_OK(ts_dit_open(&m2, path, &fx->e, 1, 0, err, sizeof err));
    ts_dit_free(&m2);
    /* absent: accepted (it is fixed, not trained) */
    edit_begin(fx, &ed);
    edit_remove(&ed, "pos_embed");
    edit_done(fx, &ed, path, sizeof path);
    TU_CHECK_OK(ts_dit_open(&m2, path, &fx->e, 1, 0, err, sizeof err));
    check_params_equal(&m2, slab_of(&fx->m));
    ts_dit_free(&m2);
}

static void test_config_keys(void **state) {
    fixture_t *fx = *state;
    edit_t ed;
    char path[256];
    static const char *required[] = {"input_size", "patch_size", "in_channels", "hidden_size",
                                     "depth",      "num_heads",  "num_classes"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        edit_begin(fx, &ed);
        edit_set_meta(&ed, required[i], NULL);
        edit_done(fx, &ed, path, sizeof path);
        char want[64];
        snprintf(want, sizeof want, "no '%s'", required[i]);
        expect_open_fails(fx, path, want);
    }
    static const char *garbage[] = {"",  "2x",  "+2",  " 2",          "2 ", "-2",
                                    "0", "2.0", "0x2", "99999999999", "２"};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        edit_begin(fx, &ed);
        edit_set_meta(&ed, "depth", garbage[i]);
        edit_done(fx, &ed, path, sizeof path);
        expect_open_fails(fx, path, "'depth'");
    }
    /* parsed but inconsistent: 32 is not divisible by 3 heads */
    edit_begin(fx, &ed);
    edit_set_meta(&ed, "num_heads", "3");
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "num_heads 3");
    /* a config that parses but does not match the tensors: the mismatch names a tensor */
    edit_begin(fx, &ed);
    edit_set_meta(&ed, "freq_dim", NULL); /* falls back to 256; the file has 64 */
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "t_embedder.mlp.0.weight");
    /* learn_sigma: true or false only; true on a plain model's tensors names the final layer */
    edit_begin(fx, &ed);
    edit_set_meta(&ed, "learn_sigma", "yes");
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "'learn_sigma'");
    edit_begin(fx, &ed);
    edit_set_meta(&ed, "learn_sigma", "true");
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "final_layer.linear.weight");
    /* another format */
    edit_begin(fx, &ed);
    edit_set_meta(&ed, "format", "tessera-dit/2");
    edit_done(fx, &ed, path, sizeof path);
    expect_open_fails(fx, path, "format");
}

static void test_open_errors(void **state) {
    fixture_t *fx = *state;
    ts_dit_t m2;
    char path[256], err[256] = "";
    path_in(fx, "absent.safetensors", path, sizeof path);
    TU_CHECK_RC(ts_dit_open(&m2, path, &fx->e, 1, 0, err, sizeof err), TS_ENOTFOUND);
    TU_CHECK_CONTAINS(err, "absent.safetensors");
    assert_null(m2.info);
    /* a valid file of another kind says what it is, with its own code */
    static const char *const kinds[][2] = {{"tessera-partition/1", "this is a partition"},
                                           {"tessera-classifier/1", "a classifier or a router"}};
    for (int i = 0; i < 2; i++) {
        const char *meta[] = {"format", kinds[i][0]};
        float one = 1.0f;
        ts_st_entry_t e = {.name = "x", .dtype = TS_ST_F32, .ndim = 1, .shape = {1}, .data = &one};
        path_in(fx, "other.safetensors", path, sizeof path);
        TU_CHECK_OK(ts_st_write(path, &e, 1, meta, 1, err, sizeof err));
        TU_CHECK_RC(ts_dit_open(&m2, path, &fx->e, 1, 0, err, sizeof err), TS_EKIND);
        TU_CHECK_CONTAINS(err, kinds[i][1]);
        assert_null(m2.info);
    }
    TU_CHECK_RC(ts_dit_open(&m2, NULL, &fx->e, 1, 0, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_dit_open(&m2, fx->good, NULL, 1, 0, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_dit_open(&m2, fx->good, &fx->e, 0, 0, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "good.safetensors");
    assert_null(m2.info);
    TU_CHECK_RC(ts_dit_load(NULL, NULL, err, sizeof err), TS_EINVAL);
}

/* A file of metadata only whose config asks for a 256×256 image in 1×1 patches (65 536 tokens):
 * its attention alone would take ~17 GB for 4 samples. It is refused before anything that size
 * is allocated (found by tests/fuzz/fuzz_partition); a file that lies about its size must not
 * take the machine's memory. */
static void test_absurd_config_refused(void **state) {
    fixture_t *fx = *state;
    static const char json[] =
        "{\"__metadata__\":{\"input_size\":\"256\",\"patch_size\":\"1\",\"in_channels\":"
        "\"1\",\"hidden_size\":\"4\",\"depth\":\"1\",\"num_heads\":\"1\",\"num_classes\":"
        "\"10\",\"mlp_ratio\":\"1\",\"freq_dim\":\"2\"}}";
    unsigned char *buf = malloc(sizeof json + 8); /* ts_st_parse takes it */
    assert_non_null(buf);
    uint64_t n = sizeof json - 1;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, json, n);
    ts_st_file_t f;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_st_parse(buf, 8 + n, &f, err, sizeof err), TS_OK, err);
    ts_dit_t m2;
    TU_CHECK_RC(ts_dit_open_file(&m2, &f, &fx->e, 4, 0, err, sizeof err), TS_ERANGE);
    assert_null(m2.info);
    ts_st_free(&f);
    ts_dit_config_t big = fx->cfg;
    big.input_size = 256;
    big.patch_size = 1;
    TU_CHECK_RC(ts_dit_create(&m2, &big, &fx->e, 4, 0), TS_ERANGE);
}

/* A model that cannot train shares one block's activations among its blocks (the residual
 * stream alternating between two buffers) and applies an fp32 MLP's GELU in place: its forward
 * gives the bits of a trainable model (which keeps every block's) on the same weights, for an odd and an even depth, and its arena does not
 * grow with the depth. */
static void test_inference_shares_block_buffers(void **state) {
    fixture_t *fx = *state;
    const int n = 3 * fx->cfg.input_size * fx->cfg.input_size;
    size_t arena_cap[2] = {0, 0};
    for (int d = 0; d < 2; d++) {
        ts_dit_config_t c = fx->cfg;
        c.depth = d ? 6 : 3;
        ts_dit_t inf, tr;
        TU_CHECK_OK(ts_dit_create(&inf, &c, &fx->e, 4, 0));
        TU_CHECK_OK(ts_dit_create(&tr, &c, &fx->e, 4, 1));
        TU_CHECK_OK(ts_rng_normal(&fx->e, &inf.param_mem, SEED + (uint64_t)d, 0));
        TU_CHECK_OK(ts_scale(&fx->e, &inf.param_mem, 0.1f));
        TU_CHECK_OK(ts_tensor_copy(&tr.param_mem, &inf.param_mem));
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        assert_non_null(a);
        assert_non_null(b);
        forward_fixed(fx, &inf, a);
        forward_fixed(fx, &tr, b);
        assert_memory_equal(a, b, (size_t)n * sizeof *a);
        /* twice: the shared buffers hold nothing from the last call that the next one reads */
        forward_fixed(fx, &inf, b);
        assert_memory_equal(a, b, (size_t)n * sizeof *a);
        assert_true(inf.arena.cap < tr.arena.cap);
        arena_cap[d] = inf.arena.cap;
        free(a);
        free(b);
        ts_dit_free(&inf);
        ts_dit_free(&tr);
    }
    assert_int_equal(arena_cap[0], arena_cap[1]);
}

/* ---- save errors ------------------------------------------------------------------------- */

static void test_save_errors(void **state) {
    fixture_t *fx = *state;
    char path[256], err[256] = "";
    path_in(fx, "save.safetensors", path, sizeof path);
    ts_dit_t *m = &fx->m;
    TU_CHECK_RC(ts_dit_save(m, &m->param_mem, path, TS_ST_I32, NULL, 0, err, sizeof err),
                TS_EINVAL);
    TU_CHECK_RC(ts_dit_save(m, NULL, path, TS_ST_F32, NULL, 0, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_dit_save(NULL, &m->param_mem, path, TS_ST_F32, NULL, 0, err, sizeof err),
                TS_EINVAL);
    TU_CHECK_RC(ts_dit_save(m, &m->param_mem, path, TS_ST_F32, NULL, 1, err, sizeof err),
                TS_EINVAL);
    const char *reserved[] = {"depth", "7"};
    TU_CHECK_RC(ts_dit_save(m, &m->param_mem, path, TS_ST_F32, reserved, 1, err, sizeof err),
                TS_EINVAL);
    TU_CHECK_CONTAINS(err, "'depth'");
    const char *fmt[] = {"format", "x"};
    TU_CHECK_RC(ts_dit_save(m, &m->param_mem, path, TS_ST_F32, fmt, 1, err, sizeof err), TS_EINVAL);
    ts_tensor_t small;
    TU_CHECK_OK(ts_tensor_alloc(&small, TS_F32, TS_CPU, 1, TS_SHAPE(16)));
    TU_CHECK_RC(ts_dit_save(m, &small, path, TS_ST_F32, NULL, 0, err, sizeof err), TS_EINVAL);
    ts_tensor_free(&small);

    /* non-finite parameters are refused, naming the tensor */
    ts_tensor_t bad;
    TU_CHECK_OK(ts_tensor_alloc(&bad, TS_F32, TS_CPU, 1, TS_SHAPE(m->num_params)));
    memcpy(bad.data, slab_of(m), (size_t)m->num_params * sizeof(float));
    const ts_dit_param_info_t *pi = &m->info[9];
    ((float *)bad.data)[pi->offset + 2] = NAN;
    TU_CHECK_RC(ts_dit_save(m, &bad, path, TS_ST_BF16, NULL, 0, err, sizeof err), TS_ENONFINITE);
    TU_CHECK_CONTAINS(err, pi->name);
    /* a value too large for F16 is refused for F16 only */
    ((float *)bad.data)[pi->offset + 2] = 1e6f;
    TU_CHECK_RC(ts_dit_save(m, &bad, path, TS_ST_F16, NULL, 0, err, sizeof err), TS_ERANGE);
    TU_CHECK_CONTAINS(err, pi->name);
    assert_false(ts_file_exists(path)); /* nothing written by any failure */
    TU_CHECK_OK(ts_dit_save(m, &bad, path, TS_ST_BF16, NULL, 0, err, sizeof err));
    assert_true(ts_file_exists(path));
    ts_tensor_free(&bad);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_f32_round_trip_is_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_learn_sigma, setup, teardown),
        cmocka_unit_test_setup_teardown(test_f16_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bf16_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_slab, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_finite_weight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_absurd_config_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inference_shares_block_buffers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pos_embed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
