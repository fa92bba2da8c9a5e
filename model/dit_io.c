/*
 * dit_io.c — a DiT's weights to and from safetensors files, under PyTorch's state_dict names.
 *
 * The mapping is the model's own parameter table (ts_dit_param_table, in m->info): each entry
 * gives the file name, the file shape (x_embedder.proj.weight is the 4-D conv weight
 * (h, C, p, p) even though the model computes with its 2-D view) and the offset in the flat
 * slab. Loading therefore needs no per-tensor code: it walks the table.
 *
 * Loading runs in two phases so that most bad files change nothing:
 *   1. structure — every tensor in the file is a parameter or pos_embed, every parameter is
 *      present with a float dtype (F32, F16, BF16) and exactly the table's shape, and pos_embed
 *      (if present) is (1, T, h) and equal to the model's fixed sin-cos table;
 *   2. values — each parameter is converted to F32 on the host, checked finite, and copied into
 *      the slab with ts_tensor_copy (so a CUDA model loads the same way).
 * A non-finite value found in phase 2 leaves the parameters before it already overwritten; the
 * caller discards the model then (ts_dit_open does).
 *
 * pos_embed tolerance: 1e-5 for F32, plus half an ulp of the file's dtype for F16 / BF16 files
 * (|Δ| ≤ 1e-5 + |v|·2^-11 resp. 2^-8), since a table computed in float64 by PyTorch and rounded
 * to 16 bits may land one rounding away from ours.
 *
 * Saving converts in place: the host copy of the slab is rewritten, element by element in
 * increasing order, as little-endian bytes of the target dtype at offset·size. An element of
 * size 2 or 4 is written at or below the 4-byte float it came from, never over a float not yet
 * read, so one host buffer is enough even for multi-GB experts.
 */
#include "model/dit_io.h"

#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/math.h"
#include "model/partition.h"

#define DIT_FORMAT "tessera-dit/1"
#define DIT_POS_TOL 1e-5

/* Puts "'path': " in front of the sentence already in err. */
static void prefix_path(char *err, size_t errlen, const char *path) {
    if (!err || errlen == 0)
        return;
    char *was = malloc(strlen(err) + 1);
    if (!was)
        return;
    strcpy(was, err);
    ts_set_err(err, errlen, "'%s': %s", path, was);
    free(was);
}

/* A name from a file, fit for a message: control characters masked, cut at 96 characters. */
static void shown_name(char *out, size_t len, const char *name) {
    size_t i = 0;
    for (; name[i] && i + 1 < len && i < 96; i++)
        out[i] = ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) ? '?' : name[i];
    out[i] = '\0';
}

/* "[384,128]" */
static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t pos = 0;
    int w = snprintf(buf, len, "[");
    for (int i = 0; i < ndim && w >= 0 && (pos += (size_t)w) < len; i++)
        w = snprintf(buf + pos, len - pos, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (w >= 0 && (pos += (size_t)w) < len)
        snprintf(buf + pos, len - pos, "]");
}

/* ---- config ----------------------------------------------------------------------------- */

/* The config keys, in the order they are written. */
static const struct {
    const char *key;
    size_t field; /* offsetof in ts_dit_config_t */
    int fallback; /* 0: required */
} config_keys[] = {
    {"input_size", offsetof(ts_dit_config_t, input_size), 0},
    {"patch_size", offsetof(ts_dit_config_t, patch_size), 0},
    {"in_channels", offsetof(ts_dit_config_t, in_channels), 0},
    {"hidden_size", offsetof(ts_dit_config_t, hidden_size), 0},
    {"depth", offsetof(ts_dit_config_t, depth), 0},
    {"num_heads", offsetof(ts_dit_config_t, num_heads), 0},
    {"num_classes", offsetof(ts_dit_config_t, num_classes), 0},
    {"mlp_ratio", offsetof(ts_dit_config_t, mlp_ratio), 4},
    {"freq_dim", offsetof(ts_dit_config_t, freq_dim), 256},
};
#define N_CONFIG_KEYS ((int)(sizeof config_keys / sizeof config_keys[0]))

static int *config_field(ts_dit_config_t *cfg, int i) {
    return (int *)((char *)cfg + config_keys[i].field);
}

/* A decimal string of digits only (no sign, space or exponent) with value in [1, 2^31 − 1]. */
static int parse_positive(const char *s, int *out) {
    if (!s || !*s)
        return 0;
    long long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        v = v * 10 + (*p - '0');
        if (v > 2147483647LL)
            return 0;
    }
    if (v < 1)
        return 0;
    *out = (int)v;
    return 1;
}

int ts_dit_config_from_file(const ts_st_file_t *f, ts_dit_config_t *cfg, char *err, size_t errlen) {
    if (!f || !cfg) {
        ts_set_err(err, errlen, "ts_dit_config_from_file: invalid arguments");
        return TS_EINVAL;
    }
    const char *format = ts_st_meta(f, "format");
    if (format && strcmp(format, TS_PARTITION_FORMAT) == 0) {
        ts_set_err(err, errlen,
                   "this is a partition (`tessera partition`'s partition.safetensors), "
                   "not an expert's weights (expert-<k>.safetensors)");
        return TS_EKIND;
    }
    if (format && strncmp(format, "tessera-classifier/", 19) == 0) {
        ts_set_err(err, errlen,
                   "this is a classifier or a router (`tessera train-classifier`, "
                   "`train-router`), not an expert's weights");
        return TS_EKIND;
    }
    if (format && strcmp(format, DIT_FORMAT) != 0) {
        char shown[100];
        shown_name(shown, 64, format);
        ts_set_err(err, errlen, "metadata 'format' is '%s', expected '%s'", shown, DIT_FORMAT);
        return TS_ECORRUPT;
    }
    ts_dit_config_t c;
    memset(&c, 0, sizeof c);
    for (int i = 0; i < N_CONFIG_KEYS; i++) {
        const char *key = config_keys[i].key, *val = ts_st_meta(f, key);
        if (!val) {
            if (!config_keys[i].fallback) {
                ts_set_err(err, errlen,
                           "metadata has no '%s': not a DiT file, or an incomplete one", key);
                return TS_ECORRUPT;
            }
            *config_field(&c, i) = config_keys[i].fallback;
        } else if (!parse_positive(val, config_field(&c, i))) {
            char shown[100];
            shown_name(shown, 40, val);
            ts_set_err(err, errlen,
                       "metadata '%s' is '%s', expected a decimal integer in [1, 2147483647] "
                       "(digits only)",
                       key, shown);
            return TS_ECORRUPT;
        }
    }
    const char *ls = ts_st_meta(f, "learn_sigma"); /* absent: false */
    if (ls && strcmp(ls, "true") != 0 && strcmp(ls, "false") != 0) {
        char shown[100];
        shown_name(shown, 40, ls);
        ts_set_err(err, errlen, "metadata 'learn_sigma' is '%s', expected true or false", shown);
        return TS_ECORRUPT;
    }
    c.learn_sigma = ls && strcmp(ls, "true") == 0;
    int rc = ts_dit_config_check(&c);
    if (rc != TS_OK) {
        ts_set_err(err, errlen,
                   "the config in the metadata is not a valid DiT (input_size %d, patch_size %d, "
                   "in_channels %d, hidden_size %d, depth %d, num_heads %d, num_classes %d, "
                   "mlp_ratio %d, freq_dim %d): %s",
                   c.input_size, c.patch_size, c.in_channels, c.hidden_size, c.depth, c.num_heads,
                   c.num_classes, c.mlp_ratio, c.freq_dim, ts_strerror(rc));
        return TS_ECORRUPT;
    }
    *cfg = c;
    return TS_OK;
}

/* ---- load ------------------------------------------------------------------------------- */

static int is_float_dtype(ts_st_dtype_t d) {
    return d == TS_ST_F32 || d == TS_ST_F16 || d == TS_ST_BF16;
}

static int same_shape(const ts_st_tensor_t *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i])
            return 0;
    return 1;
}

/* A tensor of the file against the dtype and shape the model needs. */
static int check_tensor(const ts_st_tensor_t *t, int ndim, const int64_t *shape, char *err,
                        size_t errlen) {
    if (!is_float_dtype(t->dtype)) {
        ts_set_err(err, errlen, "tensor '%s': dtype %s, expected F32, F16 or BF16", t->name,
                   ts_st_dtype_name(t->dtype));
        return TS_ECORRUPT;
    }
    if (!same_shape(t, ndim, shape)) {
        char have[200], want[200];
        shape_str(have, sizeof have, t->ndim, t->shape);
        shape_str(want, sizeof want, ndim, shape);
        ts_set_err(err, errlen, "tensor '%s': shape %s in the file, the model needs %s", t->name,
                   have, want);
        return TS_ECORRUPT;
    }
    return TS_OK;
}

int ts_dit_check_pos_embed(const ts_dit_t *m, const float *values, double rel, char *err,
                           size_t errlen) {
    int64_t n = (int64_t)ts_dit_tokens(&m->cfg) * m->cfg.hidden_size;
    float *ours = malloc((size_t)n * sizeof *ours);
    ts_tensor_t host;
    int rc = !ours ? TS_ENOMEM : ts_tensor_wrap(&host, ours, TS_F32, TS_CPU, 1, TS_SHAPE(n));
    if (rc == TS_OK)
        rc = ts_tensor_copy(&host, &m->pos_embed);
    if (rc != TS_OK)
        ts_set_err(err, errlen, "pos_embed: cannot compare it with the model's table: %s",
                   ts_strerror(rc));
    for (int64_t i = 0; rc == TS_OK && i < n; i++) {
        double d = fabs((double)values[i] - (double)ours[i]);
        double tol = DIT_POS_TOL + rel * fabs((double)ours[i]);
        if (!(d <= tol)) { /* NaN fails too */
            ts_set_err(err, errlen,
                       "pos_embed differs from the model's fixed sin-cos table at element %lld: "
                       "%g in the file, %g expected (tolerance %g)",
                       (long long)i, (double)values[i], (double)ours[i], tol);
            rc = TS_ECORRUPT;
        }
    }
    free(ours);
    return rc;
}

/* pos_embed of the file against the model's fixed table. */
static int check_pos_embed(const ts_dit_t *m, const ts_st_tensor_t *t, char *err, size_t errlen) {
    int64_t T = ts_dit_tokens(&m->cfg), h = m->cfg.hidden_size;
    int rc = check_tensor(t, 3, (const int64_t[]){1, T, h}, err, errlen);
    if (rc)
        return rc;
    float *file = malloc((size_t)(T * h) * sizeof *file);
    rc = !file ? TS_ENOMEM : ts_st_to_f32(t, file, T * h);
    if (rc != TS_OK)
        ts_set_err(err, errlen, "pos_embed: cannot read it: %s", ts_strerror(rc));
    else
        rc = ts_dit_check_pos_embed(m, file,
                                    t->dtype == TS_ST_F16    ? 0x1p-11
                                    : t->dtype == TS_ST_BF16 ? 0x1p-8
                                                             : 0.0,
                                    err, errlen);
    free(file);
    return rc;
}

/* Phase 1: names, dtypes, shapes and pos_embed; nothing is written. *max_numel receives the
 * largest parameter's element count. */
static int load_check_structure(const ts_dit_t *m, const ts_st_file_t *f, int64_t *max_numel,
                                char *err, size_t errlen) {
    /* unknown names first: names are unique, so this stops within n_params + 2 tensors */
    for (int i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name;
        if (strcmp(name, "pos_embed") != 0 && !ts_dit_param_find(m, name)) {
            char shown[100];
            shown_name(shown, sizeof shown, name);
            ts_set_err(err, errlen, "unknown tensor '%s': not a parameter of this DiT", shown);
            return TS_ECORRUPT;
        }
    }
    *max_numel = 0;
    for (int i = 0; i < m->n_params; i++) {
        const ts_dit_param_info_t *pi = &m->info[i];
        const ts_st_tensor_t *t = ts_st_find(f, pi->name);
        if (!t) {
            ts_set_err(err, errlen, "missing tensor '%s'", pi->name);
            return TS_ECORRUPT;
        }
        int rc = check_tensor(t, pi->ndim, pi->shape, err, errlen);
        if (rc)
            return rc;
        if (pi->numel > *max_numel)
            *max_numel = pi->numel;
    }
    const ts_st_tensor_t *pe = ts_st_find(f, "pos_embed");
    return pe ? check_pos_embed(m, pe, err, errlen) : TS_OK;
}

int ts_dit_load(ts_dit_t *m, const ts_st_file_t *f, char *err, size_t errlen) {
    if (!m || !f || !m->info || ts_tensor_check(&m->param_mem) || m->param_mem.dtype != TS_F32 ||
        ts_tensor_numel(&m->param_mem) < m->num_params) {
        ts_set_err(err, errlen, "ts_dit_load: invalid arguments (no model, or no file)");
        return TS_EINVAL;
    }
    int64_t max_numel;
    int rc = load_check_structure(m, f, &max_numel, err, errlen);
    if (rc)
        return rc;
    float *host = malloc((size_t)(max_numel > 0 ? max_numel : 1) * sizeof *host);
    if (!host) {
        ts_set_err(err, errlen, "out of memory loading the weights");
        return TS_ENOMEM;
    }
    for (int i = 0; i < m->n_params && rc == TS_OK; i++) {
        const ts_dit_param_info_t *pi = &m->info[i];
        const ts_st_tensor_t *t = ts_st_find(f, pi->name);
        rc = ts_st_to_f32(t, host, pi->numel);
        if (rc) {
            ts_set_err(err, errlen, "tensor '%s': cannot convert it: %s", pi->name,
                       ts_strerror(rc));
            break;
        }
        for (int64_t j = 0; j < pi->numel; j++)
            if (!ts_isfinite_f32(host[j])) {
                ts_set_err(err, errlen, "tensor '%s' holds a non-finite value (%g) at element %lld",
                           pi->name, (double)host[j], (long long)j);
                rc = TS_ECORRUPT;
                break;
            }
        ts_tensor_t src, dst;
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&src, host, TS_F32, TS_CPU, 1, TS_SHAPE(pi->numel));
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&dst, (float *)m->param_mem.data + pi->offset, TS_F32,
                                m->param_mem.device, 1, TS_SHAPE(pi->numel));
        if (rc == TS_OK)
            rc = ts_tensor_copy(&dst, &src);
        if (rc != TS_OK && rc != TS_ECORRUPT)
            ts_set_err(err, errlen, "tensor '%s': copying it into the model failed: %s", pi->name,
                       ts_strerror(rc));
    }
    free(host);
    return rc;
}

int ts_dit_open(ts_dit_t *m, const char *path, ts_engine_t *e, int max_batch, int trainable,
                char *err, size_t errlen) {
    if (!m || !path || !e) {
        if (m)
            memset(m, 0, sizeof *m);
        ts_set_err(err, errlen, "ts_dit_open: invalid arguments");
        return TS_EINVAL;
    }
    memset(m, 0, sizeof *m);
    ts_st_file_t f;
    int rc = ts_st_read(path, &f, err, errlen); /* its messages already name the file */
    if (rc)
        return rc;
    ts_dit_config_t cfg;
    rc = ts_dit_config_from_file(&f, &cfg, err, errlen);
    if (rc == TS_OK) {
        rc = ts_dit_create(m, &cfg, e, max_batch, trainable);
        if (rc)
            ts_set_err(err, errlen, "cannot build a DiT for this file's config: %s",
                       ts_strerror(rc));
        else if ((rc = ts_dit_load(m, &f, err, errlen)) != TS_OK)
            ts_dit_free(m);
    }
    if (rc)
        prefix_path(err, errlen, path);
    ts_st_free(&f);
    return rc;
}

int ts_dit_open_file(ts_dit_t *m, const ts_st_file_t *f, ts_engine_t *e, int max_batch,
                     int trainable, char *err, size_t errlen) {
    if (m)
        memset(m, 0, sizeof *m);
    if (!m || !f || !e) {
        ts_set_err(err, errlen, "ts_dit_open_file: invalid arguments");
        return TS_EINVAL;
    }
    ts_dit_config_t cfg;
    int rc = ts_dit_config_from_file(f, &cfg, err, errlen);
    if (rc)
        return rc;
    rc = ts_dit_create(m, &cfg, e, max_batch, trainable);
    if (rc) {
        ts_set_err(err, errlen, "cannot build a DiT for this file's config: %s", ts_strerror(rc));
        return rc;
    }
    if ((rc = ts_dit_load(m, f, err, errlen)) != TS_OK)
        ts_dit_free(m); /* leaves *m empty */
    return rc;
}

/* ---- save ------------------------------------------------------------------------------- */

/* Rewrites floats [off, off + n) of buf in place as little-endian dtype bytes at off·size (see
 * the top of the file for why in place is safe). TS_ENONFINITE for a non-finite value, TS_ERANGE
 * for a finite one that overflows F16. *bad receives the element index. */
static int encode_in_place(float *buf, int64_t off, int64_t n, ts_st_dtype_t dtype, int64_t *bad) {
    unsigned char *bytes = (unsigned char *)buf;
    size_t es = ts_st_dtype_size(dtype);
    for (int64_t j = 0; j < n; j++) {
        float v = buf[off + j]; /* read before anything is written at or above it */
        if (!ts_isfinite_f32(v)) {
            *bad = j;
            return TS_ENONFINITE;
        }
        unsigned char *p = bytes + (size_t)(off + j) * es;
        if (dtype == TS_ST_F32) {
            uint32_t u = ts_f32_bits(v);
            for (int k = 0; k < 4; k++)
                p[k] = (unsigned char)(u >> (8 * k));
        } else {
            uint16_t u = dtype == TS_ST_F16 ? ts_f32_to_f16(v) : ts_f32_to_bf16(v);
            if ((u & 0x7fffu) == (dtype == TS_ST_F16 ? 0x7c00u : 0x7f80u)) {
                *bad = j; /* finite in F32, infinite in 16 bits */
                return TS_ERANGE;
            }
            p[0] = (unsigned char)u;
            p[1] = (unsigned char)(u >> 8);
        }
    }
    return TS_OK;
}

static int is_reserved_key(const char *key) {
    if (strcmp(key, "format") == 0 || strcmp(key, "learn_sigma") == 0)
        return 1;
    for (int i = 0; i < N_CONFIG_KEYS; i++)
        if (strcmp(key, config_keys[i].key) == 0)
            return 1;
    return 0;
}

/* Copies count floats of a device tensor (the first count elements of src) to host memory. */
static int to_host(float *host, const ts_tensor_t *src, int64_t count) {
    ts_tensor_t flat, part, dst;
    int rc = ts_tensor_reshape(&flat, src, 1, TS_SHAPE(ts_tensor_numel(src)));
    if (rc == TS_OK)
        rc = ts_tensor_slice(&part, &flat, 0, count);
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&dst, host, TS_F32, TS_CPU, 1, TS_SHAPE(count));
    if (rc == TS_OK)
        rc = ts_tensor_copy(&dst, &part);
    return rc;
}

/* The one encoder of ts_dit_save and ts_dit_save_mem: the bytes go to path when it is not NULL,
 * else into *buf / *len. */
static int dit_encode(const ts_dit_t *m, const ts_tensor_t *slab, const char *path,
                      unsigned char **buf, size_t *len, ts_st_dtype_t dtype,
                      const char *const *extra, int n_extra, char *err, size_t errlen) {
    if (!m || !m->info || !slab || (!path && (!buf || !len)) || n_extra < 0 ||
        (n_extra > 0 && !extra)) {
        ts_set_err(err, errlen, "ts_dit_save: invalid arguments");
        return TS_EINVAL;
    }
    if (dtype != TS_ST_F32 && dtype != TS_ST_F16 && dtype != TS_ST_BF16) {
        ts_set_err(err, errlen, "ts_dit_save: dtype %s, expected F32, F16 or BF16",
                   ts_st_dtype_name(dtype));
        return TS_EINVAL;
    }
    if (ts_tensor_check(slab) || slab->dtype != TS_F32 || ts_tensor_numel(slab) < m->num_params) {
        ts_set_err(err, errlen,
                   "ts_dit_save: the slab is not an F32 tensor of at least %lld "
                   "elements (the model's layout)",
                   (long long)m->num_params);
        return TS_EINVAL;
    }
    for (int i = 0; i < n_extra; i++)
        if (extra[2 * i] && is_reserved_key(extra[2 * i])) {
            ts_set_err(err, errlen, "extra metadata key '%s' is reserved for the config",
                       extra[2 * i]);
            return TS_EINVAL;
        }

    int64_t T = ts_dit_tokens(&m->cfg), h = m->cfg.hidden_size;
    int ls = m->cfg.learn_sigma; /* written only when set: other files keep their bytes */
    int n = m->n_params + 1, n_meta = N_CONFIG_KEYS + 1 + ls + n_extra;
    float *params = malloc((size_t)m->num_params * sizeof *params);
    float *pos = malloc((size_t)(T * h) * sizeof *pos);
    ts_st_entry_t *entries = calloc((size_t)n, sizeof *entries);
    const char **meta = calloc((size_t)n_meta * 2, sizeof *meta);
    char values[N_CONFIG_KEYS][16];
    int rc = (!params || !pos || !entries || !meta) ? TS_ENOMEM : TS_OK;
    if (rc)
        ts_set_err(err, errlen, "out of memory saving the weights");
    if (rc == TS_OK && ((rc = to_host(params, slab, m->num_params)) != TS_OK ||
                        (rc = to_host(pos, &m->pos_embed, T * h)) != TS_OK))
        ts_set_err(err, errlen, "copying the weights to the host failed: %s", ts_strerror(rc));

    size_t es = ts_st_dtype_size(dtype);
    for (int i = 0; i < m->n_params && rc == TS_OK; i++) {
        const ts_dit_param_info_t *pi = &m->info[i];
        int64_t bad = 0;
        rc = encode_in_place(params, pi->offset, pi->numel, dtype, &bad);
        if (rc)
            ts_set_err(err, errlen, "tensor '%s': element %lld %s", pi->name, (long long)bad,
                       rc == TS_ENONFINITE ? "is not finite (NaN or Inf); refusing to save it"
                                           : "is too large for F16");
        ts_st_entry_t *e = &entries[i];
        e->name = pi->name;
        e->dtype = dtype;
        e->ndim = pi->ndim;
        for (int d = 0; d < pi->ndim; d++)
            e->shape[d] = pi->shape[d];
        e->data = (unsigned char *)params + (size_t)pi->offset * es;
    }
    if (rc == TS_OK) {
        int64_t bad = 0;
        rc = encode_in_place(pos, 0, T * h, dtype, &bad); /* values in [−1, 1]: cannot fail */
        if (rc)
            ts_set_err(err, errlen, "pos_embed: element %lld cannot be saved", (long long)bad);
        entries[n - 1] = (ts_st_entry_t){
            .name = "pos_embed", .dtype = dtype, .ndim = 3, .shape = {1, T, h}, .data = pos};
    }
    if (rc == TS_OK) {
        for (int i = 0; i < N_CONFIG_KEYS; i++) {
            ts_dit_config_t c = m->cfg;
            snprintf(values[i], sizeof values[i], "%d", *config_field(&c, i));
            meta[2 * i] = config_keys[i].key;
            meta[2 * i + 1] = values[i];
        }
        meta[2 * N_CONFIG_KEYS] = "format";
        meta[2 * N_CONFIG_KEYS + 1] = DIT_FORMAT;
        if (ls) {
            meta[2 * (N_CONFIG_KEYS + 1)] = "learn_sigma";
            meta[2 * (N_CONFIG_KEYS + 1) + 1] = "true";
        }
        for (int i = 0; i < 2 * n_extra; i++)
            meta[2 * (N_CONFIG_KEYS + 1 + ls) + i] = extra[i];
        rc = path ? ts_st_write(path, entries, n, meta, n_meta, err, errlen)
                  : ts_st_serialize(entries, n, meta, n_meta, buf, len, err, errlen);
    }
    free(meta);
    free(entries);
    free(pos);
    free(params);
    return rc;
}

int ts_dit_save(const ts_dit_t *m, const ts_tensor_t *slab, const char *path, ts_st_dtype_t dtype,
                const char *const *extra, int n_extra, char *err, size_t errlen) {
    if (!path) {
        ts_set_err(err, errlen, "ts_dit_save: invalid arguments");
        return TS_EINVAL;
    }
    return dit_encode(m, slab, path, NULL, NULL, dtype, extra, n_extra, err, errlen);
}

int ts_dit_save_mem(const ts_dit_t *m, const ts_tensor_t *slab, ts_st_dtype_t dtype,
                    const char *const *extra, int n_extra, unsigned char **buf, size_t *len,
                    char *err, size_t errlen) {
    if (buf)
        *buf = NULL;
    if (len)
        *len = 0;
    return dit_encode(m, slab, NULL, buf, len, dtype, extra, n_extra, err, errlen);
}
