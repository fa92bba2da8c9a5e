/*
 * latents.c — latent data set files (model/latents.h).
 */
#include "model/latents.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/partition.h"
#include "model/safetensors.h"

#define MAX_META 16

int ts_latents_save(const char *path, const float *latents, const int32_t *labels, int n, int L,
                    int h, int w, int num_classes, const char *const *meta, int n_meta, char *err,
                    size_t errlen) {
    if (!path || !latents || !labels || n < 1 || L < 1 || h < 1 || w < 1 || num_classes < 1 ||
        n_meta < 0 || n_meta > MAX_META || (n_meta && !meta))
        return ts_fail(err, errlen, TS_EINVAL, "latents: nothing to write, or a bad shape");
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= num_classes)
            return ts_fail(err, errlen, TS_EINVAL, "latents: label %d of item %d is not in [0, %d)",
                           labels[i], i, num_classes);
    char classes[16];
    snprintf(classes, sizeof classes, "%d", num_classes);
    const char *all[2 * (MAX_META + 2)] = {"format", TS_LATENTS_FORMAT, "num_classes", classes};
    for (int i = 0; i < 2 * n_meta; i++)
        all[4 + i] = meta[i];
    ts_st_entry_t ent[2] = {
        {.name = "latents", .dtype = TS_ST_F32, .ndim = 4, .shape = {n, L, h, w}, .data = latents},
        {.name = "labels", .dtype = TS_ST_I32, .ndim = 1, .shape = {n}, .data = labels}};
    return ts_st_write(path, ent, 2, all, n_meta + 2, err, errlen);
}

int ts_latent_space_of(const char *vae_path, char hex[TS_LATENT_SPACE_HEX], char *err,
                       size_t errlen) {
    return ts_file_blake2b(vae_path, hex, err, errlen);
}

int ts_latent_space_meta(const ts_st_file_t *f, char hex[TS_LATENT_SPACE_HEX]) {
    hex[0] = '\0';
    const char *v = ts_st_meta(f, TS_LATENT_SPACE_KEY);
    if (!v)
        return 0;
    if (strlen(v) != TS_LATENT_SPACE_HEX - 1 || strspn(v, "0123456789abcdef") != strlen(v))
        return TS_ECORRUPT;
    memcpy(hex, v, TS_LATENT_SPACE_HEX);
    return 1;
}

const char *ts_latent_space_name(const char *hex, char *out, size_t len) {
    if (!hex || !*hex)
        snprintf(out, len, "pixels");
    else
        snprintf(out, len, "VAE %.16s…", hex);
    return out;
}

int ts_latents_load(const char *path, ts_dataset_t *ds, char space[TS_LATENT_SPACE_HEX], char *err,
                    size_t errlen) {
    if (!path || !ds)
        return ts_fail(err, errlen, TS_EINVAL, "latents: NULL argument");
    memset(ds, 0, sizeof *ds);
    if (space)
        space[0] = '\0';
    ts_st_file_t f;
    int rc = ts_st_read(path, &f, err, errlen);
    if (rc != TS_OK)
        return rc;
    const char *format = ts_st_meta(&f, "format"), *nc = ts_st_meta(&f, "num_classes");
    const ts_st_tensor_t *lt = ts_st_find(&f, "latents"), *lb = ts_st_find(&f, "labels");
    char *end = NULL;
    long classes = nc ? strtol(nc, &end, 10) : 0;
    char hex[TS_LATENT_SPACE_HEX];
    if (!format || strcmp(format, TS_LATENTS_FORMAT) != 0) {
        rc = ts_fail(err, errlen, TS_EKIND,
                     "%s is not a latent data set (format \"%s\"; `tessera "
                     "encode` makes one)",
                     path, format ? format : "");
    } else if (!nc || end == nc || *end || classes < 1 || classes > 100000) {
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: num_classes is missing or not in 1..100000",
                     path);
    } else if (!lt || lt->dtype != TS_ST_F32 || lt->ndim != 4 || lt->shape[0] < 1 ||
               lt->shape[0] > INT32_MAX || lt->shape[1] < 1 || lt->shape[1] > 1024 ||
               lt->shape[2] < 1 || lt->shape[2] > 4096 || lt->shape[3] < 1 || lt->shape[3] > 4096) {
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: no F32 tensor \"latents\" (N, L, h, w)", path);
    } else if (!lb || lb->dtype != TS_ST_I32 || lb->ndim != 1 || lb->shape[0] != lt->shape[0]) {
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: no I32 tensor \"labels\" of %lld values", path,
                     (long long)lt->shape[0]);
    } else if (ts_latent_space_meta(&f, hex) < 0) {
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: its %s is not 64 hex digits", path,
                     TS_LATENT_SPACE_KEY);
    } else if (space) {
        memcpy(space, hex, TS_LATENT_SPACE_HEX);
    }
    if (rc == TS_OK) {
        ds->n = (int)lt->shape[0], ds->channels = (int)lt->shape[1];
        ds->height = (int)lt->shape[2], ds->width = (int)lt->shape[3];
        ds->num_classes = (int)classes;
        ds->images = malloc((size_t)lt->numel * sizeof *ds->images);
        ds->labels = malloc((size_t)ds->n * sizeof *ds->labels);
        if (!ds->images || !ds->labels)
            rc = ts_fail(err, errlen, TS_ENOMEM, "%s: no memory for %lld latents", path,
                         (long long)lt->numel);
    }
    if (rc == TS_OK && ts_st_to_f32(lt, ds->images, lt->numel) != TS_OK)
        rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: the latents cannot be read", path);
    for (int64_t i = 0; rc == TS_OK && i < lt->numel; i++)
        if (!isfinite(ds->images[i]))
            rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: latent value %lld is not finite", path,
                         (long long)i);
    for (int i = 0; rc == TS_OK && i < ds->n; i++) {
        const unsigned char *p = (const unsigned char *)lb->data + 4 * (size_t)i;
        int32_t v = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24);
        if (v < 0 || v >= classes)
            rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: label %d of item %d is not in [0, %ld)",
                         path, v, i, classes);
        ds->labels[i] = v;
    }
    ts_st_free(&f);
    if (rc != TS_OK)
        ts_dataset_free(ds);
    return rc;
}
