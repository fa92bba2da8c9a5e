/*
 * tensor.c — tensors, device memory and the arena (see tensor.h).
 *
 * Byte sizes are computed with overflow checks and capped at TS_MAX_BYTES, so an absurd shape
 * (from a corrupt file or a hostile peer) is an error before anything is allocated.
 */
#include "kernels/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

#define TS_MAX_BYTES ((size_t)1 << 40)

size_t ts_dtype_size(ts_dtype_t dtype) {
    switch (dtype) {
    case TS_F32: return 4;
    case TS_F16: return 2;
    case TS_BF16: return 2;
    case TS_I32: return 4;
    default: return 0;
    }
}

const char *ts_dtype_name(ts_dtype_t dtype) {
    switch (dtype) {
    case TS_F32: return "F32";
    case TS_F16: return "F16";
    case TS_BF16: return "BF16";
    case TS_I32: return "I32";
    default: return "?";
    }
}

const char *ts_device_name(ts_device_t device) {
    switch (device) {
    case TS_CPU: return "cpu";
    case TS_CUDA: return "cuda";
    default: return "?";
    }
}

int64_t ts_tensor_numel(const ts_tensor_t *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t ts_tensor_nbytes(const ts_tensor_t *t) {
    return (size_t)ts_tensor_numel(t) * ts_dtype_size(t->dtype);
}

int64_t ts_tensor_rows(const ts_tensor_t *t) {
    int64_t n = 1;
    for (int i = 0; i + 1 < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

int64_t ts_tensor_cols(const ts_tensor_t *t) { return t->ndim > 0 ? t->shape[t->ndim - 1] : 0; }

int ts_tensor_same_shape(const ts_tensor_t *a, const ts_tensor_t *b) {
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

/* Validates dtype, device and shape, and computes the byte size with overflow checks. */
static int shape_bytes(ts_dtype_t dtype, ts_device_t device, int ndim, const int64_t *shape,
                       size_t *bytes) {
    size_t es = ts_dtype_size(dtype);
    if (es == 0)
        return TS_EDTYPE;
    if (device != TS_CPU && device != TS_CUDA)
        return TS_EINVAL;
    if (ndim < 1 || ndim > TS_MAX_DIMS || !shape)
        return TS_EINVAL;
    size_t n = es;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return TS_ESHAPE;
        if ((uint64_t)shape[i] > TS_MAX_BYTES || n > TS_MAX_BYTES / (size_t)shape[i])
            return TS_ERANGE;
        n *= (size_t)shape[i];
    }
    if (n > TS_MAX_BYTES)
        return TS_ERANGE;
    *bytes = n;
    return TS_OK;
}

int ts_tensor_check(const ts_tensor_t *t) {
    if (!t || !t->data)
        return TS_EINVAL;
    size_t bytes;
    return shape_bytes(t->dtype, t->device, t->ndim, t->shape, &bytes);
}

char *ts_tensor_describe(const ts_tensor_t *t, char *buf, size_t len) {
    if (!buf || len == 0)
        return buf;
    if (!t) {
        snprintf(buf, len, "(null)");
        return buf;
    }
    size_t off = (size_t)snprintf(buf, len, "%s[", ts_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && i < TS_MAX_DIMS && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (off < len)
        snprintf(buf + off, len - off, "]@%s", ts_device_name(t->device));
    return buf;
}

static void set_meta(ts_tensor_t *t, void *data, ts_dtype_t dtype, ts_device_t device, int ndim,
                     const int64_t *shape, int owns) {
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->device = device;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->owns = owns;
}

int ts_alloc_poisoned(void) {
    const char *v = getenv("TESSERA_POISON_ALLOC");
    return v && *v && strcmp(v, "0") != 0;
}

int ts_device_alloc(ts_device_t device, size_t bytes, void **out) {
    if (!out)
        return TS_EINVAL;
    *out = NULL;
    if (bytes == 0 || bytes > TS_MAX_BYTES)
        return TS_ERANGE;
    if (device == TS_CUDA)
        return ts_cuda_malloc(out, bytes);
    if (device != TS_CPU)
        return TS_EINVAL;
    size_t rounded = (bytes + TS_ALIGN - 1) / TS_ALIGN * TS_ALIGN;
    void *p = aligned_alloc(TS_ALIGN, rounded);
    if (!p)
        return TS_ENOMEM;
    memset(p, ts_alloc_poisoned() ? 0xff : 0, rounded);
    *out = p;
    return TS_OK;
}

void ts_device_free(ts_device_t device, void *p) {
    if (!p)
        return;
    if (device == TS_CUDA)
        ts_cuda_free(p);
    else
        free(p);
}

int ts_tensor_alloc(ts_tensor_t *t, ts_dtype_t dtype, ts_device_t device, int ndim,
                    const int64_t *shape) {
    if (!t)
        return TS_EINVAL;
    memset(t, 0, sizeof *t);
    size_t bytes;
    int rc = shape_bytes(dtype, device, ndim, shape, &bytes);
    if (rc)
        return rc;
    void *p;
    rc = ts_device_alloc(device, bytes, &p);
    if (rc)
        return rc;
    set_meta(t, p, dtype, device, ndim, shape, 1);
    return TS_OK;
}

int ts_tensor_alloc_pinned(ts_tensor_t *t, ts_dtype_t dtype, int ndim, const int64_t *shape) {
    if (!t)
        return TS_EINVAL;
    memset(t, 0, sizeof *t);
    size_t bytes;
    int rc = shape_bytes(dtype, TS_CPU, ndim, shape, &bytes);
    if (rc)
        return rc;
    void *p = NULL;
    if (ts_cuda_host_alloc(&p, bytes) == TS_OK) {
        memset(p, 0, bytes);
        set_meta(t, p, dtype, TS_CPU, ndim, shape, 2);
        return TS_OK;
    }
    /* no CUDA here: ordinary memory, zeroed as pinned memory is even when poisoning */
    rc = ts_tensor_alloc(t, dtype, TS_CPU, ndim, shape);
    if (rc == TS_OK)
        memset(t->data, 0, bytes);
    return rc;
}

void ts_tensor_free(ts_tensor_t *t) {
    if (!t)
        return;
    if (t->owns == 2)
        ts_cuda_host_free(t->data);
    else if (t->owns)
        ts_device_free(t->device, t->data);
    memset(t, 0, sizeof *t);
}

int ts_tensor_wrap(ts_tensor_t *t, void *data, ts_dtype_t dtype, ts_device_t device, int ndim,
                   const int64_t *shape) {
    if (!t || !data)
        return TS_EINVAL;
    size_t bytes;
    int rc = shape_bytes(dtype, device, ndim, shape, &bytes);
    if (rc)
        return rc;
    set_meta(t, data, dtype, device, ndim, shape, 0);
    return TS_OK;
}

int ts_tensor_slice(ts_tensor_t *out, const ts_tensor_t *src, int64_t start, int64_t len) {
    if (!out || ts_tensor_check(src))
        return TS_EINVAL;
    if (start < 0 || len <= 0 || start > src->shape[0] || len > src->shape[0] - start)
        return TS_ERANGE;
    size_t row_bytes = ts_tensor_nbytes(src) / (size_t)src->shape[0];
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[0] = len;
    ts_tensor_t view;
    set_meta(&view, (unsigned char *)src->data + (size_t)start * row_bytes, src->dtype, src->device,
             src->ndim, shape, 0);
    *out = view;
    return TS_OK;
}

int ts_tensor_reshape(ts_tensor_t *out, const ts_tensor_t *src, int ndim, const int64_t *shape) {
    if (!out || ts_tensor_check(src))
        return TS_EINVAL;
    size_t bytes;
    int rc = shape_bytes(src->dtype, src->device, ndim, shape, &bytes);
    if (rc)
        return rc;
    if (bytes != ts_tensor_nbytes(src))
        return TS_ESHAPE;
    ts_tensor_t view;
    set_meta(&view, src->data, src->dtype, src->device, ndim, shape, 0);
    *out = view;
    return TS_OK;
}

int ts_tensor_copy(ts_tensor_t *dst, const ts_tensor_t *src) {
    if (ts_tensor_check(dst) || ts_tensor_check(src))
        return TS_EINVAL;
    if (dst->dtype != src->dtype)
        return TS_EDTYPE;
    if (ts_tensor_numel(dst) != ts_tensor_numel(src))
        return TS_ESHAPE;
    size_t bytes = ts_tensor_nbytes(src);
    if (dst->device == TS_CPU && src->device == TS_CPU) {
        memmove(dst->data, src->data, bytes);
        return TS_OK;
    }
    return ts_cuda_memcpy(dst->data, dst->device, src->data, src->device, bytes);
}

/* ---- arena ---------------------------------------------------------------------------- */

int ts_arena_init(ts_arena_t *a, ts_device_t device, size_t cap) {
    if (!a || (device != TS_CPU && device != TS_CUDA))
        return TS_EINVAL;
    memset(a, 0, sizeof *a);
    a->device = device;
    if (cap == 0)
        return TS_OK; /* measuring mode */
    cap = (cap + TS_ALIGN - 1) / TS_ALIGN * TS_ALIGN;
    void *p;
    int rc = ts_device_alloc(device, cap, &p);
    if (rc)
        return rc;
    a->base = p;
    a->cap = cap;
    return TS_OK;
}

void ts_arena_free(ts_arena_t *a) {
    if (!a)
        return;
    ts_device_free(a->device, a->base);
    memset(a, 0, sizeof *a);
}

int ts_arena_tensor(ts_arena_t *a, ts_tensor_t *t, ts_dtype_t dtype, int ndim,
                    const int64_t *shape) {
    if (!a || !t)
        return TS_EINVAL;
    size_t bytes;
    int rc = shape_bytes(dtype, a->device, ndim, shape, &bytes);
    if (rc)
        return rc;
    size_t rounded = (bytes + TS_ALIGN - 1) / TS_ALIGN * TS_ALIGN;
    int measuring = a->base == NULL;
    if (!measuring && rounded > a->cap - a->used)
        return TS_ENOMEM;
    void *data = measuring ? NULL : a->base + a->used;
    set_meta(t, data, dtype, a->device, ndim, shape, 0);
    a->used += rounded;
    if (a->used > a->peak)
        a->peak = a->used;
    return TS_OK;
}

size_t ts_arena_mark(const ts_arena_t *a) { return a ? a->used : 0; }

void ts_arena_reset(ts_arena_t *a, size_t mark) {
    if (a && mark <= a->used)
        a->used = mark;
}
