/*
 * safetensors.h — reading and writing the safetensors format, strictly.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON (an object: tensor name →
 * {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" object of
 * string → string), then the data buffer. Offsets are relative to the buffer start.
 *
 * The reader trusts nothing: the header length is bounded (TS_ST_MAX_HEADER) and must fit the
 * file; the JSON is parsed by a real parser (jansson) with duplicate keys rejected; every dtype
 * must be known; shape × dtype size must equal end − begin; the tensors' ranges, sorted, must
 * tile the buffer exactly (no gaps, no overlaps) and the file must end where the buffer ends.
 * Any violation is TS_ECORRUPT with a sentence in `err` naming the tensor and the problem.
 *
 * What it is not: a model loader (model/dit_io.h maps names onto a DiT) or a streaming reader —
 * files are read whole into memory (experts are megabytes to a few GB).
 */
#ifndef TS_SAFETENSORS_H
#define TS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_ST_MAX_HEADER (100u << 20) /* 100 MiB of JSON, as the reference implementation */
#define TS_ST_MAX_DIMS 8

typedef enum {
    TS_ST_F32 = 0,
    TS_ST_F16,
    TS_ST_BF16,
    TS_ST_F64,
    TS_ST_I64,
    TS_ST_I32,
    TS_ST_I16,
    TS_ST_I8,
    TS_ST_U8,
    TS_ST_BOOL,
} ts_st_dtype_t;

typedef struct ts_st_tensor {
    char *name;
    ts_st_dtype_t dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[TS_ST_MAX_DIMS];
    int64_t numel;
    size_t begin, end; /* byte range in the data buffer */
    const void *data;  /* points into the file's buffer; little-endian, maybe unaligned */
} ts_st_tensor_t;

typedef struct ts_st_file {
    unsigned char *buf; /* the whole file */
    size_t len;
    int n_tensors;
    ts_st_tensor_t *tensors; /* in data-offset order */
    int n_meta;
    char **meta_keys, **meta_vals;
} ts_st_file_t;

/* Reads and validates a file. On error *f is left empty and err (if non-NULL) holds a sentence.
 * Free with ts_st_free. */
int ts_st_read(const char *path, ts_st_file_t *f, char *err, size_t errlen);
/* Validates a file already in memory; takes ownership of buf (malloc'd) on success AND on
 * failure (it is freed then). */
int ts_st_parse(unsigned char *buf, size_t len, ts_st_file_t *f, char *err, size_t errlen);
void ts_st_free(ts_st_file_t *f);

const ts_st_tensor_t *ts_st_find(const ts_st_file_t *f, const char *name);
/* The metadata value for key, or NULL. */
const char *ts_st_meta(const ts_st_file_t *f, const char *key);

size_t ts_st_dtype_size(ts_st_dtype_t dtype);
const char *ts_st_dtype_name(ts_st_dtype_t dtype); /* "F32", "BF16", "I64", ... */

/* Converts a tensor's values to F32 on the host (F32, F16, BF16, F64, integer types).
 * n must equal t->numel. */
int ts_st_to_f32(const ts_st_tensor_t *t, float *out, int64_t n);
/* Converts integer (or float with integral values) tensors to int64. n must equal t->numel. */
int ts_st_to_i64(const ts_st_tensor_t *t, int64_t *out, int64_t n);

/* One tensor to write: data is host memory of numel × dtype size bytes, little-endian. */
typedef struct ts_st_entry {
    const char *name;
    ts_st_dtype_t dtype;
    int ndim;
    int64_t shape[TS_ST_MAX_DIMS];
    const void *data;
} ts_st_entry_t;

/* Builds the bytes of a safetensors file in memory — exactly what ts_st_write puts in the file
 * (both use one encoder): header padded with spaces to a multiple of 8 bytes, then the tensors in
 * the given order. On success *buf (malloc'd, the caller frees it) holds *len bytes; on error
 * *buf is NULL and err holds a sentence. */
int ts_st_serialize(const ts_st_entry_t *entries, int n, const char *const *meta, int n_meta,
                    unsigned char **buf, size_t *len, char *err, size_t errlen);

/* Writes a file atomically (temporary file in the same directory, fsync, rename), tensors in the
 * given order, header padded with spaces to a multiple of 8 bytes. meta is n_meta key/value
 * pairs (meta[2i] = key, meta[2i+1] = value), written under "__metadata__". */
int ts_st_write(const char *path, const ts_st_entry_t *entries, int n, const char *const *meta,
                int n_meta, char *err, size_t errlen);

/* The BLAKE2b-256 of a file's bytes as 64 lowercase hex digits in hex[65]: a partition's id
 * (model/partition.h), a latent space (model/latents.h). TS_EINVAL, TS_EIO (with a sentence). */
int ts_file_blake2b(const char *path, char hex[65], char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
