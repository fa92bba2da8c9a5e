/*
 * vae_io.c — the VAE's weights from and to safetensors files, under diffusers' parameter names.
 *
 * The mapping is the model's own parameter table (ts_vae_t.params, built by model/vae.c): each
 * entry has the diffusers name, the shape and the offset in the slab, so loading walks the table.
 *
 * The mid blocks' attention exists in files under two namings, and the loader takes either:
 *   to_q, to_k, to_v, to_out.0      (diffusers since 0.14: Linear weights, (C, C))
 *   query, key, value, proj_attn    (the older AttentionBlock: (C, C), or (C, C, 1, 1) as
 *                                    1×1 convs in files converted from the original code)
 * The naming is decided once per file (whichever to_q or query the first attention has) and
 * reported in m->attn_naming; a file mixing the two is missing tensors under the chosen one.
 *
 * Loading is strict, as model/dit_io.c: every parameter present with its exact shape and a float
 * dtype (F32, F16, BF16), every value finite, and no tensor the model does not have. A CompVis
 * checkpoint (encoder.down.0.block.0…) is recognised and named as such, since its names differ
 * throughout.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"
#include "model/vae.h"

#define NAMING_NEW "to_q/to_k/to_v/to_out.0"
#define NAMING_OLD "query/key/value/proj_attn"

/* ---- names --------------------------------------------------------------------------------- */

/* The older name of an attention parameter: ".to_q." → ".query." and so on; 0 when name is not
 * one. */
static int legacy_name(char *out, size_t len, const char *name) {
    static const char *const from[4] = {".to_q.", ".to_k.", ".to_v.", ".to_out.0."};
    static const char *const to[4] = {".query.", ".key.", ".value.", ".proj_attn."};
    for (int i = 0; i < 4; i++) {
        const char *at = strstr(name, from[i]);
        if (at) {
            snprintf(out, len, "%.*s%s%s", (int)(at - name), name, to[i], at + strlen(from[i]));
            return 1;
        }
    }
    return 0;
}

/* "[384,128]" */
static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t pos = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && pos < len; i++)
        pos += (size_t)snprintf(buf + pos, len - pos, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (pos < len)
        snprintf(buf + pos, len - pos, "]");
}

/* The tensor's shape equals p's, or, for an attention weight (C, C), is (C, C, 1, 1). */
static int shape_ok(const ts_vae_param_t *p, const ts_st_tensor_t *t) {
    int ndim = t->ndim;
    if (p->attn && p->ndim == 2 && ndim == 4 && t->shape[2] == 1 && t->shape[3] == 1)
        ndim = 2; /* a 1×1 conv's weight: its first two dimensions are the Linear's */
    if (ndim != p->ndim)
        return 0;
    for (int i = 0; i < p->ndim; i++)
        if (t->shape[i] != p->shape[i])
            return 0;
    return 1;
}

/* ---- config from a file --------------------------------------------------------------------- */

/* encoder.down_blocks.<block>.resnets.<layer>.conv1.weight, or NULL */
static const ts_st_tensor_t *down_conv1(const ts_st_file_t *f, int block, int layer) {
    char name[96];
    snprintf(name, sizeof name, "encoder.down_blocks.%d.resnets.%d.conv1.weight", block, layer);
    return ts_st_find(f, name);
}

static int is_compvis(const ts_st_file_t *f) {
    return ts_st_find(f, "encoder.down.0.block.0.norm1.weight") != NULL;
}

int ts_vae_config_from_file(const ts_st_file_t *f, ts_vae_config_t *cfg, char *err, size_t errlen) {
    ts_vae_config_t c;
    ts_vae_config_sd(&c);
    if (is_compvis(f))
        return ts_fail(err, errlen, TS_EKIND,
                       "this is a CompVis (original Stable Diffusion) checkpoint "
                       "(encoder.down.0.block.0...); convert it to diffusers' names first");
    const ts_st_tensor_t *in = ts_st_find(f, "encoder.conv_in.weight");
    const ts_st_tensor_t *out = ts_st_find(f, "decoder.conv_out.weight");
    const ts_st_tensor_t *pq = ts_st_find(f, "post_quant_conv.weight");
    if (!in || !out || !pq || in->ndim != 4 || out->ndim != 4 || pq->ndim < 2)
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "not a diffusers AutoencoderKL file: encoder.conv_in.weight, "
                       "decoder.conv_out.weight or post_quant_conv.weight missing or misshaped");
    c.in_channels = (int)in->shape[1];
    c.out_channels = (int)out->shape[0];
    c.latent_channels = (int)pq->shape[0];
    c.n_blocks = 0;
    for (int i = 0; i < TS_VAE_MAX_BLOCKS + 1; i++) {
        const ts_st_tensor_t *t = down_conv1(f, i, 0);
        if (!t)
            break;
        if (i == TS_VAE_MAX_BLOCKS || t->ndim != 4)
            return ts_fail(err, errlen, TS_ENOTSUP,
                           "more than %d down blocks, or a misshaped "
                           "encoder.down_blocks.%d.resnets.0.conv1.weight",
                           TS_VAE_MAX_BLOCKS, i);
        c.block_out[i] = (int)t->shape[0];
        c.n_blocks = i + 1;
    }
    c.layers_per_block = 0;
    while (c.layers_per_block <= TS_VAE_MAX_LAYERS && down_conv1(f, 0, c.layers_per_block))
        c.layers_per_block++;
    const char *g = ts_st_meta(f, "norm_num_groups"), *s = ts_st_meta(f, "scaling_factor");
    if (g)
        c.groups = atoi(g);
    if (s)
        c.scaling_factor = strtof(s, NULL);
    int rc = ts_vae_config_check(&c, err, errlen);
    if (rc == TS_OK)
        *cfg = c;
    return rc;
}

/* ---- loading ------------------------------------------------------------------------------- */

/* Fills m's slab from f, walking the table; f's naming of the attention decided first. */
static int load_params(ts_vae_t *m, const ts_st_file_t *f, char *err, size_t errlen) {
    int old = ts_st_find(f, "encoder.mid_block.attentions.0.query.weight") != NULL &&
              ts_st_find(f, "encoder.mid_block.attentions.0.to_q.weight") == NULL;
    m->attn_naming = old ? NAMING_OLD : NAMING_NEW;
    char *used = calloc((size_t)f->n_tensors, 1); /* which file tensors a parameter took */
    if (!used)
        return ts_fail(err, errlen, TS_ENOMEM, "out of memory");
    int rc = TS_OK;
    for (int i = 0; i < m->n_params && rc == TS_OK; i++) {
        const ts_vae_param_t *p = &m->params[i];
        char alt[96], want[64], got[64];
        const char *name = p->name;
        if (old && legacy_name(alt, sizeof alt, p->name))
            name = alt;
        const ts_st_tensor_t *t = ts_st_find(f, name);
        shape_str(want, sizeof want, p->ndim, p->shape);
        if (!t) {
            rc =
                ts_fail(err, errlen, TS_ENOTFOUND, "tensor '%s' %s is missing (attention named %s)",
                        name, want, m->attn_naming);
            break;
        }
        used[t - f->tensors] = 1;
        if (t->dtype != TS_ST_F32 && t->dtype != TS_ST_F16 && t->dtype != TS_ST_BF16) {
            rc = ts_fail(err, errlen, TS_EDTYPE, "tensor '%s' is %s; want F32, F16 or BF16", name,
                         ts_st_dtype_name(t->dtype));
            break;
        }
        if (!shape_ok(p, t)) {
            shape_str(got, sizeof got, t->ndim, t->shape);
            rc = ts_fail(err, errlen, TS_ESHAPE, "tensor '%s' has shape %s; this VAE wants %s",
                         name, got, want);
            break;
        }
        float *dst = (float *)m->slab.data + p->offset;
        rc = ts_st_to_f32(t, dst, t->numel);
        for (int64_t j = 0; rc == TS_OK && j < t->numel; j++)
            if (!isfinite(dst[j]))
                rc = ts_fail(err, errlen, TS_ENONFINITE, "tensor '%s' holds %g at element %lld",
                             name, (double)dst[j], (long long)j);
    }
    for (int i = 0; i < f->n_tensors && rc == TS_OK; i++)
        if (!used[i])
            rc = ts_fail(err, errlen, TS_ECORRUPT,
                         "tensor '%.96s' is not a parameter of this VAE (attention named %s)",
                         f->tensors[i].name, m->attn_naming);
    free(used);
    return rc;
}

int ts_vae_open(ts_vae_t **out, const char *path, const ts_vae_config_t *cfg, char *err,
                size_t errlen) {
    if (!out || !path)
        return ts_fail(err, errlen, TS_EINVAL, "ts_vae_open: no path or output");
    *out = NULL;
    ts_st_file_t f;
    TS_TRY(ts_st_read(path, &f, err, errlen));
    ts_vae_config_t c;
    int rc = cfg ? (c = *cfg, TS_OK) : ts_vae_config_from_file(&f, &c, err, errlen);
    ts_vae_t *m = NULL;
    if (rc == TS_OK && cfg && is_compvis(&f))
        rc = ts_vae_config_from_file(&f, &c, err, errlen); /* says what the file is */
    if (rc == TS_OK)
        rc = ts_vae_new(&m, &c, err, errlen);
    if (rc == TS_OK)
        rc = load_params(m, &f, err, errlen);
    ts_st_free(&f);
    if (rc != TS_OK) {
        ts_vae_free(m);
        char was[512];
        snprintf(was, sizeof was, "%s", err ? err : "");
        return ts_fail(err, errlen, rc, "'%s': %s", path, was);
    }
    *out = m;
    return TS_OK;
}

/* ---- saving -------------------------------------------------------------------------------- */

int ts_vae_save(const ts_vae_t *m, const char *path, char *err, size_t errlen) {
    ts_st_entry_t *en = calloc((size_t)m->n_params, sizeof *en);
    if (!en)
        return ts_fail(err, errlen, TS_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_params; i++) {
        const ts_vae_param_t *p = &m->params[i];
        en[i].name = p->name;
        en[i].dtype = TS_ST_F32;
        en[i].ndim = p->ndim;
        memcpy(en[i].shape, p->shape, sizeof p->shape);
        en[i].data = (const float *)m->slab.data + p->offset;
    }
    char groups[16], scale[32];
    snprintf(groups, sizeof groups, "%d", m->cfg.groups);
    snprintf(scale, sizeof scale, "%.9g", (double)m->cfg.scaling_factor);
    const char *meta[] = {"format", "tessera-vae/1",  "norm_num_groups",
                          groups,   "scaling_factor", scale};
    int rc = ts_st_write(path, en, m->n_params, meta, 3, err, errlen);
    free(en);
    return rc;
}
