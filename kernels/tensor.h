/*
 * tensor.h — the tensor type and the activation arena.
 *
 * A tensor is a dense, contiguous, row-major block of up to 4 dimensions with a dtype (F32, F16,
 * BF16) and a device (CPU or CUDA). It either owns its memory (ts_tensor_alloc, freed by
 * ts_tensor_free) or is a view into memory someone else owns (ts_tensor_wrap, slices, reshapes,
 * arena tensors). It is deliberately not a strided tensor library: views are contiguous, so a
 * slice is along the first dimension only and a reshape keeps the element count.
 *
 * The arena hands out tensors from one preallocated block with a bump pointer, so a training or
 * inference step allocates nothing. It has a measuring mode (capacity 0, no memory) so a model
 * can run its allocation plan once to learn the size it needs.
 */
#ifndef TS_TENSOR_H
#define TS_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_MAX_DIMS 4
#define TS_ALIGN 64 /* bytes; every allocation and arena tensor starts on this boundary */

/* I32 holds indices (class labels for the embedding lookup); the math ops take F32. */
typedef enum { TS_F32 = 0, TS_F16 = 1, TS_BF16 = 2, TS_I32 = 3 } ts_dtype_t;
typedef enum { TS_CPU = 0, TS_CUDA = 1 } ts_device_t;

typedef struct ts_tensor {
    void *data; /* NULL only for an empty tensor or a measuring-arena tensor */
    ts_dtype_t dtype;
    ts_device_t device;
    int ndim; /* 1..TS_MAX_DIMS */
    int64_t shape[TS_MAX_DIMS];
    int owns; /* 1: ts_tensor_free releases data; 2: data is page-locked host memory (CUDA) */
} ts_tensor_t;

/* A shape literal: ts_tensor_alloc(&t, TS_F32, TS_CPU, 2, TS_SHAPE(B, C)). */
#define TS_SHAPE(...) ((const int64_t[]){__VA_ARGS__})

size_t ts_dtype_size(ts_dtype_t dtype);         /* bytes per element; 0 for an unknown dtype */
const char *ts_dtype_name(ts_dtype_t dtype);    /* "F32", "F16", "BF16", "I32", "?" */
const char *ts_device_name(ts_device_t device); /* "cpu", "cuda", "?" */

int64_t ts_tensor_numel(const ts_tensor_t *t);
size_t ts_tensor_nbytes(const ts_tensor_t *t);
/* Product of all dimensions but the last (rows) and the last dimension (cols). */
int64_t ts_tensor_rows(const ts_tensor_t *t);
int64_t ts_tensor_cols(const ts_tensor_t *t);
/* 1 when a and b have the same ndim and shape. */
int ts_tensor_same_shape(const ts_tensor_t *a, const ts_tensor_t *b);
/* Checks that t is non-NULL, has data, a known dtype and 1..4 positive dims. */
int ts_tensor_check(const ts_tensor_t *t);
/* Writes "F32[2,3,4]@cpu" into buf (always NUL-terminated); returns buf. */
char *ts_tensor_describe(const ts_tensor_t *t, char *buf, size_t len);

/* Allocates an owning tensor. Its contents are unspecified: zero on the CPU, whatever the device
 * last held on a GPU (cudaMalloc), so every caller writes what it reads, padding included
 * (TESSERA_POISON_ALLOC, below, checks that on the CPU). Free with ts_tensor_free. Returns
 * TS_ERANGE when the byte size overflows or exceeds 2^40. */
int ts_tensor_alloc(ts_tensor_t *t, ts_dtype_t dtype, ts_device_t device, int ndim,
                    const int64_t *shape);
/* As ts_tensor_alloc on the CPU, in page-locked ("pinned") memory where the CUDA backend is
 * built and a driver can give it: copies between it and a GPU run at the bus's full speed (a GPU
 * engine's staging buffers). Elsewhere ordinary CPU memory, the same to every caller; t->owns says
 * which (2 pinned, 1 not). Zeroed either way. */
int ts_tensor_alloc_pinned(ts_tensor_t *t, ts_dtype_t dtype, int ndim, const int64_t *shape);
/* Releases an owning tensor's data (a view's data is left alone) and clears *t. NULL-safe. */
void ts_tensor_free(ts_tensor_t *t);
/* Makes a non-owning view of memory the caller owns and keeps alive. */
int ts_tensor_wrap(ts_tensor_t *t, void *data, ts_dtype_t dtype, ts_device_t device, int ndim,
                   const int64_t *shape);
/* out = rows [start, start+len) of src along dimension 0; a view sharing src's memory. */
int ts_tensor_slice(ts_tensor_t *out, const ts_tensor_t *src, int64_t start, int64_t len);
/* out = src with a new shape of the same element count; a view. */
int ts_tensor_reshape(ts_tensor_t *out, const ts_tensor_t *src, int ndim, const int64_t *shape);

/* Device memory, used by tensors and arenas. CPU memory is TS_ALIGN-aligned and zeroed, or, when
 * the environment sets TESSERA_POISON_ALLOC (to anything but 0), filled with 0xff bytes — NaN in
 * f32, bf16 and f16, −1 in i32 — so that a test run on the CPU reads what a GPU's uninitialised
 * memory may hold wherever code forgets to write before it reads. Pinned memory stays zeroed. */
int ts_alloc_poisoned(void);
int ts_device_alloc(ts_device_t device, size_t bytes, void **out);
void ts_device_free(ts_device_t device, void *p);
/* Copies between any two devices; both tensors must have the same dtype and element count. */
int ts_tensor_copy(ts_tensor_t *dst, const ts_tensor_t *src);

typedef struct ts_arena {
    ts_device_t device;
    unsigned char *base; /* NULL in measuring mode */
    size_t cap;          /* bytes available; 0 in measuring mode */
    size_t used;         /* bytes handed out since the last reset */
    size_t peak;         /* high-water mark of used */
} ts_arena_t;

/* cap > 0: allocates cap bytes on device. cap == 0: measuring mode (hands out tensors with
 * data = NULL and only counts bytes). Free with ts_arena_free. */
int ts_arena_init(ts_arena_t *a, ts_device_t device, size_t cap);
void ts_arena_free(ts_arena_t *a);
/* Hands out a tensor view from the arena (aligned to TS_ALIGN). TS_ENOMEM when it does not fit;
 * the arena is unchanged then. */
int ts_arena_tensor(ts_arena_t *a, ts_tensor_t *t, ts_dtype_t dtype, int ndim,
                    const int64_t *shape);
/* A mark is the current fill; resetting to a mark releases everything handed out after it. */
size_t ts_arena_mark(const ts_arena_t *a);
void ts_arena_reset(ts_arena_t *a, size_t mark);

#ifdef __cplusplus
}
#endif

#endif
