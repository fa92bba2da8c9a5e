/*
 * safetensors.c — the strict safetensors reader and the atomic writer (see safetensors.h).
 *
 * Reading. The file is read whole (fstat for the size, refused above 2^40 bytes), then
 * ts_st_parse checks it in one pass over the JSON header and one over the sorted ranges:
 *
 *   1. 8-byte little-endian header length N: N ≤ TS_ST_MAX_HEADER and 8 + N ≤ file length.
 *   2. The N header bytes parse (jansson, duplicate keys rejected, no NUL in strings, valid
 *      UTF-8, nesting depth bounded by jansson) to a JSON object.
 *   3. "__metadata__", if present, is an object of string → string.
 *   4. Every other key is a non-empty tensor name whose value is an object with exactly
 *      "dtype" (a known name), "shape" (≤ TS_ST_MAX_DIMS non-negative integers, each and their
 *      product ≤ 2^40) and "data_offsets" (two non-negative integers, begin ≤ end ≤ buffer
 *      length), and end − begin = numel × dtype size.
 *   5. Sorted by (begin, end), the ranges tile [0, buffer length) exactly: each starts where
 *      the previous one ended (a zero-size tensor sits at that point), and the last ends at the
 *      end of the file.
 *
 * All arithmetic on sizes read from the file is done in uint64_t against bounds checked
 * first, so no input can overflow it; the tensors' data pointers point into the file buffer and
 * are only formed after the checks. Every failure says which tensor and what was wrong; names
 * from the file are quoted with control characters masked and long names cut.
 *
 * Writing. The header is built with jansson in the caller's order ("__metadata__" first),
 * padded with spaces to a multiple of 8 bytes by encode_header, the one encoder of the framing:
 * ts_st_serialize appends the tensors to it in memory, ts_st_write streams them after it. The
 * file goes to `<path>.tmp.<pid>` in the same directory, is flushed and fsync'd, then renamed
 * over path (and the directory fsync'd, best effort). On any error the temporary file is
 * removed and path is untouched.
 *
 * What it is not: a memory-mapping or streaming reader, or a converter between dtypes beyond the
 * two host helpers ts_st_to_f32 / ts_st_to_i64.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "base/file.h"
#include "base/str.h"
#include "kernels/math.h"

#define ST_MAX_FILE ((uint64_t)1 << 40) /* bytes; files larger than this are refused */
#define ST_MAX_NUMEL ((int64_t)1 << 40) /* elements per tensor, and per dimension */
#define ST_NAME_SHOWN 96                /* characters of a name quoted in a message */
#define ST_SHAPE_TEXT (TS_ST_MAX_DIMS * 22 + 3)

/* ---- messages --------------------------------------------------------------------------- */

/* A name from the file, fit for a message: control characters masked, long names cut. */
typedef struct {
    char s[ST_NAME_SHOWN + 4];
} shown_t;

static shown_t show(const char *name) {
    shown_t out;
    size_t i = 0;
    for (; name && name[i] && i < ST_NAME_SHOWN; i++) {
        unsigned char c = (unsigned char)name[i];
        out.s[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (name && name[i]) {
        memcpy(out.s + i, "...", 3);
        i += 3;
    }
    out.s[i] = '\0';
    return out;
}

/* "[384,128]", or "[]" for a scalar. */
typedef struct {
    char s[ST_SHAPE_TEXT];
} shape_text_t;

static shape_text_t shape_text(int ndim, const int64_t *shape) {
    shape_text_t out;
    size_t pos = 0;
    out.s[pos++] = '[';
    for (int i = 0; i < ndim; i++) {
        int w =
            snprintf(out.s + pos, sizeof out.s - pos, "%s%lld", i ? "," : "", (long long)shape[i]);
        if (w < 0 || (size_t)w >= sizeof out.s - pos)
            break; /* cannot happen at TS_ST_MAX_DIMS 20-digit entries; stay safe anyway */
        pos += (size_t)w;
    }
    if (pos + 2 <= sizeof out.s) {
        out.s[pos++] = ']';
        out.s[pos] = '\0';
    } else {
        out.s[sizeof out.s - 1] = '\0';
    }
    return out;
}

/* ---- dtypes ----------------------------------------------------------------------------- */

static const char *const dtype_names[] = {"F32", "F16", "BF16", "F64", "I64",
                                          "I32", "I16", "I8",   "U8",  "BOOL"};
static const size_t dtype_sizes[] = {4, 2, 2, 8, 8, 4, 2, 1, 1, 1};
#define ST_N_DTYPES ((int)(sizeof dtype_sizes / sizeof dtype_sizes[0]))

static int dtype_known(ts_st_dtype_t d) { return (int)d >= 0 && (int)d < ST_N_DTYPES; }

size_t ts_st_dtype_size(ts_st_dtype_t dtype) { return dtype_known(dtype) ? dtype_sizes[dtype] : 0; }

const char *ts_st_dtype_name(ts_st_dtype_t dtype) {
    return dtype_known(dtype) ? dtype_names[dtype] : "?";
}

static int dtype_from_name(const char *s, ts_st_dtype_t *out) {
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (strcmp(s, dtype_names[i]) == 0) {
            *out = (ts_st_dtype_t)i;
            return 1;
        }
    return 0;
}

/* Element count of a shape whose dimensions are each in [0, ST_MAX_NUMEL]: 0 when any is 0,
 * else the product, or −1 when the product exceeds ST_MAX_NUMEL. */
static int64_t bounded_numel(int ndim, const int64_t *shape) {
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0)
            return 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (n > ST_MAX_NUMEL / shape[i])
            return -1;
        n *= shape[i];
    }
    return n;
}

/* ---- little-endian loads (unaligned-safe, host-endianness-independent) ------------------ */

static uint16_t ld16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t ld32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t ld64(const unsigned char *p) {
    return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

static void st64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static double ld_f64(const unsigned char *p) {
    uint64_t u = ld64(p);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static int64_t ld_i64(const unsigned char *p) {
    uint64_t u = ld64(p);
    int64_t i;
    memcpy(&i, &u, sizeof i);
    return i;
}

/* ---- parsing ---------------------------------------------------------------------------- */

void ts_st_free(ts_st_file_t *f) {
    if (!f)
        return;
    for (int i = 0; f->tensors && i < f->n_tensors; i++)
        free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys ? f->meta_keys[i] : NULL);
        free(f->meta_vals ? f->meta_vals[i] : NULL);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->buf);
    memset(f, 0, sizeof *f);
}

/* A JSON integer in [0, max], into *out. */
static int json_uint(const json_t *v, int64_t max, int64_t *out) {
    if (!json_is_integer(v))
        return 0;
    json_int_t i = json_integer_value(v);
    if (i < 0 || i > max)
        return 0;
    *out = (int64_t)i;
    return 1;
}

static int parse_metadata(ts_st_file_t *f, const json_t *obj, char *err, size_t errlen) {
    if (!json_is_object(obj)) {
        ts_set_err(err, errlen, "__metadata__ is not a JSON object of string values");
        return TS_ECORRUPT;
    }
    size_t n = json_object_size(obj);
    if (n > (size_t)INT32_MAX) {
        ts_set_err(err, errlen, "__metadata__ has too many entries (%zu)", n);
        return TS_ECORRUPT;
    }
    f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
    f->meta_vals = calloc(n ? n : 1, sizeof *f->meta_vals);
    if (!f->meta_keys || !f->meta_vals) {
        ts_set_err(err, errlen, "out of memory reading __metadata__ (%zu entries)", n);
        return TS_ENOMEM;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val) {
        if (!json_is_string(val)) {
            ts_set_err(err, errlen, "__metadata__ '%s': the value is not a string", show(key).s);
            return TS_ECORRUPT;
        }
        int i = f->n_meta;
        f->meta_keys[i] = strdup(key);
        f->meta_vals[i] = strdup(json_string_value(val));
        f->n_meta++; /* counted now so ts_st_free releases whichever strdup succeeded */
        if (!f->meta_keys[i] || !f->meta_vals[i]) {
            ts_set_err(err, errlen, "out of memory reading __metadata__");
            return TS_ENOMEM;
        }
    }
    return TS_OK;
}

/* Checks one tensor entry of the header against a buffer of buflen bytes and fills *t (name
 * excluded; data is set later). */
static int parse_entry(const char *name, const json_t *v, uint64_t buflen, ts_st_tensor_t *t,
                       char *err, size_t errlen) {
    shown_t shown = show(name);
    if (!json_is_object(v)) {
        ts_set_err(err, errlen, "tensor '%s': the entry is not a JSON object", shown.s);
        return TS_ECORRUPT;
    }
    const char *key;
    json_t *field;
    json_object_foreach((json_t *)v, key, field) {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0) {
            ts_set_err(err, errlen, "tensor '%s': unexpected field '%s'", shown.s, show(key).s);
            return TS_ECORRUPT;
        }
    }
    const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape");
    const json_t *jo = json_object_get(v, "data_offsets");
    if (!jd || !js || !jo) {
        ts_set_err(err, errlen, "tensor '%s': missing field '%s'", shown.s,
                   !jd   ? "dtype"
                   : !js ? "shape"
                         : "data_offsets");
        return TS_ECORRUPT;
    }
    /* dtype */
    if (!json_is_string(jd)) {
        ts_set_err(err, errlen, "tensor '%s': dtype is not a string", shown.s);
        return TS_ECORRUPT;
    }
    if (!dtype_from_name(json_string_value(jd), &t->dtype)) {
        ts_set_err(err, errlen, "tensor '%s': unknown dtype '%s'", shown.s,
                   show(json_string_value(jd)).s);
        return TS_ECORRUPT;
    }
    /* shape */
    if (!json_is_array(js)) {
        ts_set_err(err, errlen, "tensor '%s': shape is not an array", shown.s);
        return TS_ECORRUPT;
    }
    size_t nd = json_array_size(js);
    if (nd > TS_ST_MAX_DIMS) {
        ts_set_err(err, errlen, "tensor '%s': shape has %zu dimensions, at most %d are supported",
                   shown.s, nd, TS_ST_MAX_DIMS);
        return TS_ECORRUPT;
    }
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        if (!json_uint(json_array_get(js, i), ST_MAX_NUMEL, &t->shape[i])) {
            ts_set_err(err, errlen, "tensor '%s': shape entry %zu is not an integer in [0, 2^40]",
                       shown.s, i);
            return TS_ECORRUPT;
        }
    }
    t->numel = bounded_numel(t->ndim, t->shape);
    if (t->numel < 0) {
        ts_set_err(err, errlen, "tensor '%s': shape %s has more than 2^40 elements", shown.s,
                   shape_text(t->ndim, t->shape).s);
        return TS_ECORRUPT;
    }
    /* data_offsets */
    int64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_uint(json_array_get(jo, 0), INT64_MAX, &begin) ||
        !json_uint(json_array_get(jo, 1), INT64_MAX, &end)) {
        ts_set_err(err, errlen, "tensor '%s': data_offsets is not two non-negative integers",
                   shown.s);
        return TS_ECORRUPT;
    }
    if (begin > end) {
        ts_set_err(err, errlen, "tensor '%s': data_offsets [%lld,%lld] begin after they end",
                   shown.s, (long long)begin, (long long)end);
        return TS_ECORRUPT;
    }
    if ((uint64_t)end > buflen) {
        ts_set_err(err, errlen,
                   "tensor '%s': data_offsets [%lld,%lld] run past the data buffer of %llu bytes",
                   shown.s, (long long)begin, (long long)end, (unsigned long long)buflen);
        return TS_ECORRUPT;
    }
    /* numel ≤ 2^40 and size ≤ 8: the product fits */
    uint64_t need = (uint64_t)t->numel * ts_st_dtype_size(t->dtype);
    if (need != (uint64_t)(end - begin)) {
        ts_set_err(err, errlen,
                   "tensor '%s': shape %s × %s needs %llu bytes but data_offsets span %llu",
                   shown.s, shape_text(t->ndim, t->shape).s, ts_st_dtype_name(t->dtype),
                   (unsigned long long)need, (unsigned long long)(end - begin));
        return TS_ECORRUPT;
    }
    t->begin = (size_t)begin;
    t->end = (size_t)end;
    return TS_OK;
}

static int by_range(const void *a, const void *b) {
    const ts_st_tensor_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Sorted by range, the tensors must tile [0, buflen) with no gap and no overlap. */
static int check_tiling(const ts_st_file_t *f, uint64_t buflen, char *err, size_t errlen) {
    uint64_t cursor = 0;
    const ts_st_tensor_t *prev = NULL;
    for (int i = 0; i < f->n_tensors; i++) {
        const ts_st_tensor_t *t = &f->tensors[i];
        if ((uint64_t)t->begin > cursor) {
            ts_set_err(err, errlen,
                       "tensor '%s': gap of %llu bytes before its data_offsets [%zu,%zu] (the "
                       "previous tensor ends at %llu)",
                       show(t->name).s, (unsigned long long)(t->begin - cursor), t->begin, t->end,
                       (unsigned long long)cursor);
            return TS_ECORRUPT;
        }
        if ((uint64_t)t->begin < cursor) {
            ts_set_err(
                err, errlen,
                "tensor '%s': data_offsets [%zu,%zu] overlap tensor '%s', which ends at %llu",
                show(t->name).s, t->begin, t->end, prev ? show(prev->name).s : "?",
                (unsigned long long)cursor);
            return TS_ECORRUPT;
        }
        cursor = t->end;
        prev = t;
    }
    if (cursor != buflen) {
        ts_set_err(err, errlen,
                   "the data buffer is %llu bytes but the tensors end at %llu: %llu trailing bytes",
                   (unsigned long long)buflen, (unsigned long long)cursor,
                   (unsigned long long)(buflen - cursor));
        return TS_ECORRUPT;
    }
    return TS_OK;
}

static int parse_header(ts_st_file_t *f, const json_t *root, uint64_t hdr_end, char *err,
                        size_t errlen) {
    uint64_t buflen = f->len - hdr_end;
    size_t n = json_object_size(root);
    if (n > (size_t)INT32_MAX) {
        ts_set_err(err, errlen, "the header lists too many tensors (%zu)", n);
        return TS_ECORRUPT;
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        ts_set_err(err, errlen, "out of memory for %zu tensor entries", n);
        return TS_ENOMEM;
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)root, key, val) {
        int rc;
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(f, val, err, errlen);
            if (rc)
                return rc;
            continue;
        }
        if (key[0] == '\0') {
            ts_set_err(err, errlen, "a tensor has an empty name");
            return TS_ECORRUPT;
        }
        ts_st_tensor_t *t = &f->tensors[f->n_tensors];
        rc = parse_entry(key, val, buflen, t, err, errlen);
        if (rc)
            return rc;
        t->name = strdup(key);
        if (!t->name) {
            ts_set_err(err, errlen, "out of memory");
            return TS_ENOMEM;
        }
        f->n_tensors++;
    }
    if (f->n_tensors > 1)
        qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, by_range);
    int rc = check_tiling(f, buflen, err, errlen);
    if (rc)
        return rc;
    for (int i = 0; i < f->n_tensors; i++)
        f->tensors[i].data = f->buf + hdr_end + f->tensors[i].begin;
    return TS_OK;
}

int ts_st_parse(unsigned char *buf, size_t len, ts_st_file_t *f, char *err, size_t errlen) {
    if (!f || (!buf && len > 0)) {
        free(buf);
        ts_set_err(err, errlen, "ts_st_parse: invalid arguments");
        return TS_EINVAL;
    }
    memset(f, 0, sizeof *f);
    f->buf = buf; /* owned from here: ts_st_free releases it on failure */
    f->len = len;
    int rc = TS_ECORRUPT;
    json_t *root = NULL;
    if ((uint64_t)len > ST_MAX_FILE) {
        ts_set_err(err, errlen, "the file is %zu bytes, more than the 2^40-byte limit", len);
        rc = TS_ERANGE;
        goto done;
    }
    if (len < 8) {
        ts_set_err(err, errlen, "the file is %zu bytes, too short for the 8-byte header length",
                   len);
        goto done;
    }
    uint64_t n = ld64(buf);
    if (n > TS_ST_MAX_HEADER) {
        ts_set_err(err, errlen, "header length %llu exceeds the %u-byte limit",
                   (unsigned long long)n, (unsigned)TS_ST_MAX_HEADER);
        goto done;
    }
    if (n > (uint64_t)len - 8) {
        ts_set_err(err, errlen, "header length %llu runs past the end of the %zu-byte file",
                   (unsigned long long)n, len);
        goto done;
    }
    json_error_t jerr;
    root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        ts_set_err(err, errlen, "the header is not valid JSON: %s (at byte %d)", show(jerr.text).s,
                   jerr.position);
        goto done;
    }
    if (!json_is_object(root)) {
        ts_set_err(err, errlen, "the header is a JSON %s, not an object",
                   json_is_array(root) ? "array" : "value");
        goto done;
    }
    rc = parse_header(f, root, 8 + n, err, errlen);
done:
    json_decref(root);
    if (rc != TS_OK)
        ts_st_free(f);
    return rc;
}

int ts_st_read(const char *path, ts_st_file_t *f, char *err, size_t errlen) {
    if (f)
        memset(f, 0, sizeof *f);
    if (!path || !f) {
        ts_set_err(err, errlen, "ts_st_read: invalid arguments");
        return TS_EINVAL;
    }
    char why[128];
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int e = errno;
        ts_errno_text(e, why, sizeof why);
        ts_set_err(err, errlen, "cannot open '%s': %s", show(path).s, why);
        return e == ENOENT || e == ENOTDIR ? TS_ENOTFOUND : TS_EIO;
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        ts_errno_text(errno, why, sizeof why);
        ts_set_err(err, errlen, "cannot stat '%s': %s", show(path).s, why);
        fclose(fp);
        return TS_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        ts_set_err(err, errlen, "'%s' is not a regular file", show(path).s);
        fclose(fp);
        return TS_EIO;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > ST_MAX_FILE) {
        ts_set_err(err, errlen, "'%s' is %lld bytes, more than the 2^40-byte limit", show(path).s,
                   (long long)st.st_size);
        fclose(fp);
        return TS_ERANGE;
    }
    size_t len = (size_t)st.st_size;
    unsigned char *buf = malloc(len ? len : 1);
    if (!buf) {
        ts_set_err(err, errlen, "out of memory reading '%s' (%zu bytes)", show(path).s, len);
        fclose(fp);
        return TS_ENOMEM;
    }
    size_t got = fread(buf, 1, len, fp);
    int bad = ferror(fp);
    int grew = (got == len && fgetc(fp) != EOF);
    fclose(fp);
    if (got != len || bad || grew) {
        ts_set_err(err, errlen, "reading '%s' failed: %s", show(path).s,
                   bad    ? "read error"
                   : grew ? "the file grew while it was read"
                          : "the file shrank while it was read");
        free(buf);
        return TS_EIO;
    }
    int rc = ts_st_parse(buf, len, f, err, errlen);
    if (rc != TS_OK && err && errlen > 0) {
        /* name the file in front of the parser's sentence */
        char *why_parse = strdup(err);
        if (why_parse) {
            ts_set_err(err, errlen, "'%s': %s", show(path).s, why_parse);
            free(why_parse);
        }
    }
    return rc;
}

/* ---- lookups and conversions ------------------------------------------------------------ */

const ts_st_tensor_t *ts_st_find(const ts_st_file_t *f, const char *name) {
    if (!f || !name)
        return NULL;
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *ts_st_meta(const ts_st_file_t *f, const char *key) {
    if (!f || !key)
        return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0)
            return f->meta_vals[i];
    return NULL;
}

static int check_conversion_args(const ts_st_tensor_t *t, const void *out, int64_t n) {
    if (!t || !dtype_known(t->dtype) || n != t->numel || n < 0)
        return TS_EINVAL;
    if (n > 0 && (!out || !t->data))
        return TS_EINVAL;
    return TS_OK;
}

int ts_st_to_f32(const ts_st_tensor_t *t, float *out, int64_t n) {
    int rc = check_conversion_args(t, out, n);
    if (rc)
        return rc;
    const unsigned char *p = t->data;
    size_t es = ts_st_dtype_size(t->dtype);
    for (int64_t i = 0; i < n; i++, p += es) {
        switch (t->dtype) {
        case TS_ST_F32: out[i] = ts_bits_f32(ld32(p)); break;
        case TS_ST_F16: out[i] = ts_f16_to_f32(ld16(p)); break;
        case TS_ST_BF16: out[i] = ts_bf16_to_f32(ld16(p)); break;
        case TS_ST_F64: out[i] = (float)ld_f64(p); break;
        case TS_ST_I64: out[i] = (float)ld_i64(p); break;
        case TS_ST_I32: out[i] = (float)(int32_t)ld32(p); break;
        case TS_ST_I16: out[i] = (float)(int16_t)ld16(p); break;
        case TS_ST_I8: out[i] = (float)(int8_t)p[0]; break;
        case TS_ST_U8: out[i] = (float)p[0]; break;
        case TS_ST_BOOL:
            if (p[0] > 1)
                return TS_ECORRUPT; /* a bool byte is 0 or 1 */
            out[i] = (float)p[0];
            break;
        }
    }
    return TS_OK;
}

/* A float that must hold an integer value representable as int64. */
static int integral(double v, int64_t *out) {
    /* 2^63 is exactly representable; every double below it converts without overflow */
    if (!isfinite(v) || v != floor(v) || v < -9223372036854775808.0 || v >= 9223372036854775808.0)
        return 0;
    *out = (int64_t)v;
    return 1;
}

int ts_st_to_i64(const ts_st_tensor_t *t, int64_t *out, int64_t n) {
    int rc = check_conversion_args(t, out, n);
    if (rc)
        return rc;
    const unsigned char *p = t->data;
    size_t es = ts_st_dtype_size(t->dtype);
    for (int64_t i = 0; i < n; i++, p += es) {
        int ok = 1;
        switch (t->dtype) {
        case TS_ST_F32: ok = integral(ts_bits_f32(ld32(p)), &out[i]); break;
        case TS_ST_F16: ok = integral(ts_f16_to_f32(ld16(p)), &out[i]); break;
        case TS_ST_BF16: ok = integral(ts_bf16_to_f32(ld16(p)), &out[i]); break;
        case TS_ST_F64: ok = integral(ld_f64(p), &out[i]); break;
        case TS_ST_I64: out[i] = ld_i64(p); break;
        case TS_ST_I32: out[i] = (int32_t)ld32(p); break;
        case TS_ST_I16: out[i] = (int16_t)ld16(p); break;
        case TS_ST_I8: out[i] = (int8_t)p[0]; break;
        case TS_ST_U8: out[i] = p[0]; break;
        case TS_ST_BOOL:
            if (p[0] > 1)
                return TS_ECORRUPT;
            out[i] = p[0];
            break;
        }
        if (!ok)
            return TS_ERANGE; /* a fraction, NaN/Inf, or beyond int64 */
    }
    return TS_OK;
}

/* ---- writing ---------------------------------------------------------------------------- */

/* 1 when s is valid UTF-8 (jansson refuses keys that are not). */
static int utf8_ok(const char *s) {
    json_t *probe = json_string(s);
    int ok = probe != NULL;
    json_decref(probe);
    return ok;
}

/* Builds the header object: "__metadata__" first, then the entries in order, back to back. */
static int build_header(const ts_st_entry_t *entries, int n, const char *const *meta, int n_meta,
                        json_t **out, char *err, size_t errlen) {
    json_t *root = json_object();
    if (!root)
        goto oom;
    if (n_meta > 0) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0)
            goto oom;
        for (int i = 0; i < n_meta; i++) {
            const char *k = meta[2 * i], *v = meta[2 * i + 1];
            if (!k || !v) {
                ts_set_err(err, errlen, "metadata entry %d has a NULL key or value", i);
                goto inval;
            }
            if (!utf8_ok(k)) {
                ts_set_err(err, errlen, "metadata key '%s' is not valid UTF-8", show(k).s);
                goto inval;
            }
            if (json_object_get(m, k)) {
                ts_set_err(err, errlen, "metadata key '%s' appears twice", show(k).s);
                goto inval;
            }
            json_t *s = json_string(v);
            if (!s) {
                ts_set_err(err, errlen, "metadata '%s': the value is not valid UTF-8", show(k).s);
                goto inval;
            }
            if (json_object_set_new(m, k, s) != 0)
                goto oom;
        }
    }
    uint64_t cursor = 0;
    for (int i = 0; i < n; i++) {
        const ts_st_entry_t *e = &entries[i];
        if (!e->name || !e->name[0]) {
            ts_set_err(err, errlen, "entry %d has no name", i);
            goto inval;
        }
        shown_t shown = show(e->name);
        if (strcmp(e->name, "__metadata__") == 0 || json_object_get(root, e->name)) {
            ts_set_err(err, errlen, "tensor '%s': the name is %s", shown.s,
                       strcmp(e->name, "__metadata__") == 0 ? "reserved" : "used twice");
            goto inval;
        }
        if (!dtype_known(e->dtype)) {
            ts_set_err(err, errlen, "tensor '%s': unknown dtype %d", shown.s, (int)e->dtype);
            goto inval;
        }
        if (e->ndim < 0 || e->ndim > TS_ST_MAX_DIMS) {
            ts_set_err(err, errlen, "tensor '%s': %d dimensions, expected 0..%d", shown.s, e->ndim,
                       TS_ST_MAX_DIMS);
            goto inval;
        }
        for (int d = 0; d < e->ndim; d++)
            if (e->shape[d] < 0 || e->shape[d] > ST_MAX_NUMEL) {
                ts_set_err(err, errlen, "tensor '%s': dimension %d is %lld, expected 0..2^40",
                           shown.s, d, (long long)e->shape[d]);
                goto inval;
            }
        int64_t numel = bounded_numel(e->ndim, e->shape);
        if (numel < 0) {
            ts_set_err(err, errlen, "tensor '%s': shape %s has more than 2^40 elements", shown.s,
                       shape_text(e->ndim, e->shape).s);
            goto range;
        }
        uint64_t bytes = (uint64_t)numel * ts_st_dtype_size(e->dtype);
        if (bytes > 0 && !e->data) {
            ts_set_err(err, errlen, "tensor '%s': data is NULL", shown.s);
            goto inval;
        }
        if (bytes > ST_MAX_FILE - cursor) {
            ts_set_err(err, errlen, "tensor '%s': the file would exceed 2^40 bytes", shown.s);
            goto range;
        }
        if (!utf8_ok(e->name)) {
            ts_set_err(err, errlen, "tensor '%s': the name is not valid UTF-8", shown.s);
            goto inval;
        }
        /* json_object_set_new takes the value even when it fails, so nothing leaks below */
        json_t *obj = json_object(), *shape = NULL, *offs = NULL;
        if (json_object_set_new(root, e->name, obj) ||
            json_object_set_new(obj, "dtype", json_string(dtype_names[e->dtype])) ||
            json_object_set_new(obj, "shape", shape = json_array()) ||
            json_object_set_new(obj, "data_offsets", offs = json_array()))
            goto oom;
        for (int d = 0; d < e->ndim; d++)
            if (json_array_append_new(shape, json_integer((json_int_t)e->shape[d])))
                goto oom;
        if (json_array_append_new(offs, json_integer((json_int_t)cursor)) ||
            json_array_append_new(offs, json_integer((json_int_t)(cursor + bytes))))
            goto oom;
        cursor += bytes;
    }
    *out = root;
    return TS_OK;
oom:
    json_decref(root);
    ts_set_err(err, errlen, "out of memory building the safetensors header");
    return TS_ENOMEM;
inval:
    json_decref(root);
    return TS_EINVAL;
range:
    json_decref(root);
    return TS_ERANGE;
}

static int write_all(FILE *fp, const void *p, size_t n) {
    return n == 0 || fwrite(p, 1, n, fp) == n;
}

/* The one encoder of the format's framing, shared by ts_st_serialize and ts_st_write: checks
 * the entries, and returns the 8-byte length and the padded header (hdr_out: 8 + padded bytes,
 * malloc'd) and the size of the data buffer that follows (the tensors back to back, in order). */
static int encode_header(const ts_st_entry_t *entries, int n, const char *const *meta, int n_meta,
                         unsigned char **hdr_out, size_t *hdr_len, uint64_t *data_len, char *err,
                         size_t errlen) {
    json_t *root = NULL;
    int rc = build_header(entries, n, meta, n_meta, &root, err, errlen);
    if (rc)
        return rc;
    char *json = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!json) {
        ts_set_err(err, errlen, "out of memory serialising the safetensors header");
        return TS_ENOMEM;
    }
    size_t jlen = strlen(json), padded = (jlen + 7) / 8 * 8;
    if (padded > TS_ST_MAX_HEADER) {
        ts_set_err(err, errlen, "the header would be %zu bytes, more than the %u-byte limit",
                   padded, (unsigned)TS_ST_MAX_HEADER);
        free(json);
        return TS_ERANGE;
    }
    unsigned char *h = malloc(8 + padded);
    if (!h) {
        free(json);
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    st64(h, padded);
    memcpy(h + 8, json, jlen);
    memset(h + 8 + jlen, ' ', padded - jlen);
    free(json);
    uint64_t total = 0; /* build_header bounded it by ST_MAX_FILE */
    for (int i = 0; i < n; i++)
        total += (uint64_t)bounded_numel(entries[i].ndim, entries[i].shape) *
                 ts_st_dtype_size(entries[i].dtype);
    *hdr_out = h;
    *hdr_len = 8 + padded;
    *data_len = total;
    return TS_OK;
}

static size_t entry_bytes(const ts_st_entry_t *e) {
    return (size_t)bounded_numel(e->ndim, e->shape) * ts_st_dtype_size(e->dtype);
}

int ts_st_serialize(const ts_st_entry_t *entries, int n, const char *const *meta, int n_meta,
                    unsigned char **buf, size_t *len, char *err, size_t errlen) {
    if (buf)
        *buf = NULL;
    if (len)
        *len = 0;
    if (!buf || !len || n < 0 || (n > 0 && !entries) || n_meta < 0 || (n_meta > 0 && !meta)) {
        ts_set_err(err, errlen, "ts_st_serialize: invalid arguments");
        return TS_EINVAL;
    }
    unsigned char *hdr = NULL;
    size_t hlen = 0;
    uint64_t dlen = 0;
    int rc = encode_header(entries, n, meta, n_meta, &hdr, &hlen, &dlen, err, errlen);
    if (rc)
        return rc;
    if (dlen > (uint64_t)(SIZE_MAX - hlen)) {
        ts_set_err(err, errlen, "the serialised tensors would not fit in memory");
        free(hdr);
        return TS_ERANGE;
    }
    unsigned char *out = malloc(hlen + (size_t)dlen);
    if (!out) {
        ts_set_err(err, errlen, "out of memory serialising %llu bytes of tensors",
                   (unsigned long long)dlen);
        free(hdr);
        return TS_ENOMEM;
    }
    memcpy(out, hdr, hlen);
    free(hdr);
    size_t at = hlen;
    for (int i = 0; i < n; i++) {
        size_t bytes = entry_bytes(&entries[i]);
        if (bytes)
            memcpy(out + at, entries[i].data, bytes);
        at += bytes;
    }
    *buf = out;
    *len = at;
    return TS_OK;
}

int ts_st_write(const char *path, const ts_st_entry_t *entries, int n, const char *const *meta,
                int n_meta, char *err, size_t errlen) {
    if (!path || !path[0] || n < 0 || (n > 0 && !entries) || n_meta < 0 || (n_meta > 0 && !meta)) {
        ts_set_err(err, errlen, "ts_st_write: invalid arguments");
        return TS_EINVAL;
    }
    unsigned char *hdr = NULL;
    size_t hlen = 0;
    uint64_t dlen = 0;
    int rc = encode_header(entries, n, meta, n_meta, &hdr, &hlen, &dlen, err, errlen);
    if (rc)
        return rc;

    /* written whole or not at all (base/file.h): a temporary, fsync, rename, fsync of the folder */
    char why[128] = "";
    ts_atomic_file_t a;
    int e = 0;
    rc = ts_atomic_open(&a, path, &e);
    if (rc != TS_OK) {
        ts_errno_text(e ? e : EIO, why, sizeof why);
        ts_set_err(err, errlen, "cannot create a temporary file next to '%s': %s", show(path).s,
                   e ? why : ts_strerror(rc));
        free(hdr);
        return rc;
    }
    /* the same bytes as ts_st_serialize, streamed: no second copy of the tensors */
    int ok = write_all(a.fp, hdr, hlen);
    for (int i = 0; ok && i < n; i++)
        ok = write_all(a.fp, entries[i].data, entry_bytes(&entries[i]));
    e = ok ? 0 : errno;
    rc = ts_atomic_commit(&a, ok, &e);
    if (rc != TS_OK) {
        ts_errno_text(e ? e : EIO, why, sizeof why);
        ts_set_err(err, errlen, "writing '%s' failed: %s", show(path).s, why);
    }
    free(hdr);
    return rc;
}

int ts_file_blake2b(const char *path, char hex[65], char *err, size_t errlen) {
    if (!path || !hex)
        return TS_EINVAL;
    hex[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) {
        ts_set_err(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return TS_EIO;
    }
    unsigned char h[32];
    crypto_generichash_state st;
    unsigned char buf[1 << 16];
    int rc = sodium_init() < 0 ? TS_EIO : TS_OK;
    if (rc == TS_OK)
        crypto_generichash_init(&st, NULL, 0, sizeof h);
    size_t got;
    while (rc == TS_OK && (got = fread(buf, 1, sizeof buf, f)) > 0)
        crypto_generichash_update(&st, buf, got);
    if (rc == TS_OK && ferror(f)) {
        ts_set_err(err, errlen, "cannot read '%s'", path);
        rc = TS_EIO;
    }
    fclose(f);
    if (rc == TS_OK) {
        crypto_generichash_final(&st, h, sizeof h);
        ts_hex(h, sizeof h, hex);
    }
    return rc;
}
