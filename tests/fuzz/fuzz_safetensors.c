/*
 * fuzz_safetensors.c — libFuzzer harness for the safetensors reader (model/safetensors.h), which
 * reads every expert, router and partition file another member can serve: the input is one
 * file's bytes, handed to ts_st_parse in a malloc'd copy (it takes ownership of the buffer on
 * success and on failure alike).
 *
 * Checked: a failure leaves *f empty (nothing to free; ASan's leak check sees the rest) and a
 * sentence in err. On success the file is the input bytes; the tensors, in data-offset order,
 * tile the data buffer after the header exactly, each one's data pointer and byte range lie
 * inside it, and end − begin = numel × dtype size; ts_st_find finds every tensor by its name and
 * ts_st_meta every metadata key with its value; tensors of at most 2^16 elements convert to F32
 * (and are tried as int64). The parsed file is also read as a DiT config
 * (ts_dit_config_from_file): one that is accepted passes ts_dit_config_check.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/dit_io.h"
#include "model/safetensors.h"

#define MAX_CONVERT ((int64_t)1 << 16)

static float f32[MAX_CONVERT];
static int64_t i64[MAX_CONVERT];

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void check_file(const ts_st_file_t *f, const uint8_t *data, size_t size) {
    if (!f->buf || f->len != size || (size && memcmp(f->buf, data, size) != 0))
        abort();
    if (size < 8 || f->n_tensors < 0 || f->n_meta < 0)
        abort();
    uint64_t hdr = le64(data);
    if (hdr > TS_ST_MAX_HEADER || hdr > size - 8)
        abort();
    const unsigned char *base = f->buf + 8 + hdr, *end = f->buf + f->len;
    size_t buflen = (size_t)(end - base), at = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const ts_st_tensor_t *t = &f->tensors[i];
        if (!t->name || !t->name[0] || t->ndim < 0 || t->ndim > TS_ST_MAX_DIMS || t->numel < 0)
            abort();
        size_t es = ts_st_dtype_size(t->dtype);
        if (es == 0)
            abort();
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || (t->shape[d] > 0 && numel > INT64_MAX / t->shape[d]))
                abort();
            numel *= t->shape[d];
        }
        if (numel != t->numel)
            abort();
        /* the ranges tile the buffer: each starts where the previous one ended */
        if (t->begin != at || t->end < t->begin || t->end > buflen)
            abort();
        if ((uint64_t)(t->end - t->begin) / es != (uint64_t)t->numel ||
            (uint64_t)(t->end - t->begin) % es != 0)
            abort();
        const unsigned char *p = t->data;
        if (p != base + t->begin || p + (t->end - t->begin) > end)
            abort();
        at = t->end;
        if (ts_st_find(f, t->name) != t) /* names are unique */
            abort();
        if (t->numel <= MAX_CONVERT) {
            if (ts_st_to_f32(t, f32, t->numel) != TS_OK)
                abort();
            (void)ts_st_to_i64(t, i64, t->numel); /* may refuse non-integral floats */
        }
    }
    if (at != buflen)
        abort(); /* the last tensor ends where the file ends */
    for (int i = 0; i < f->n_meta; i++) {
        if (!f->meta_keys[i] || !f->meta_vals[i])
            abort();
        const char *v = ts_st_meta(f, f->meta_keys[i]);
        if (!v || strcmp(v, f->meta_vals[i]) != 0)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    ts_st_file_t f;
    char err[512] = "";
    int rc = ts_st_parse(buf, size, &f, err, sizeof err);
    if (rc != TS_OK) {
        static const ts_st_file_t empty;
        if (memcmp(&f, &empty, sizeof f) != 0)
            abort(); /* a failure leaves nothing behind */
        if (!err[0] || memchr(err, 0, sizeof err) == NULL)
            abort(); /* and says why */
        return 0;
    }
    check_file(&f, data, size);
    ts_dit_config_t cfg;
    if (ts_dit_config_from_file(&f, &cfg, err, sizeof err) == TS_OK &&
        ts_dit_config_check(&cfg) != TS_OK)
        abort();
    ts_st_free(&f);
    return 0;
}
