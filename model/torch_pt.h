/*
 * torch_pt.h — PyTorch checkpoint files (torch.save's zip format) read without PyTorch: the
 * tensors of a state dict, for `tessera import`.
 *
 * torch.save writes a zip archive with its entries stored, not compressed: ROOT/data.pkl (a
 * pickle of the object saved), ROOT/data/KEY (one per storage: raw little-endian elements),
 * ROOT/version and ROOT/byteorder. The pickle is read by a restricted interpreter that knows the
 * opcodes of protocols 2 to 5 and the few callables a state dict uses —
 * collections.OrderedDict, torch._utils._rebuild_tensor_v2 and _rebuild_parameter, the typed
 * storages (torch.FloatStorage, …) — and calls nothing: any other callable, and what it would
 * build, is an opaque value. So a .pt file from anyone cannot run code here (torch.load can,
 * unless weights_only). Tensors are found wherever dicts nest them, named by their keys joined
 * with '.' ("ema.blocks.0.attn.qkv.weight" in a training checkpoint {"model", "ema", "opt",
 * "args"}); their data stays in the mapped file until ts_pt_to_f32.
 *
 * `err`/`errlen`: a failure writes one NUL-terminated sentence there.
 */
#ifndef TS_MODEL_TORCH_PT_H
#define TS_MODEL_TORCH_PT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TS_PT_F32,
    TS_PT_F16,
    TS_PT_BF16,
    TS_PT_F64,
    TS_PT_OTHER, /* integers, booleans, complex: listed, not converted */
} ts_pt_dtype_t;

#define TS_PT_MAX_DIMS 8

typedef struct ts_pt_tensor {
    char *name;
    ts_pt_dtype_t dtype;
    const char *storage_type; /* "FloatStorage", … (for messages) */
    int ndim;
    int64_t shape[TS_PT_MAX_DIMS], stride[TS_PT_MAX_DIMS]; /* strides in elements */
    int64_t offset;                                        /* in elements, into the storage */
    const unsigned char *data;                             /* the storage's bytes (mapped) */
    int64_t storage_numel;
} ts_pt_tensor_t;

typedef struct ts_pt_file {
    void *map; /* the file's bytes: mapped, or the caller's (borrowed) */
    size_t len;
    int borrowed;
    int n;
    ts_pt_tensor_t *t; /* in the order the pickle names them */
} ts_pt_file_t;

/* Maps path and reads its tensors. Errors: TS_ENOTFOUND, TS_EIO, TS_EKIND (not a zip: e.g.
 * torch.save's legacy format, with the fix), TS_ECORRUPT (a malformed archive or pickle, a
 * compressed entry, a tensor past its storage — each naming what), TS_ENOTSUP (a big-endian
 * file), TS_ENOMEM. *f is zeroed on failure. */
int ts_pt_open(const char *path, ts_pt_file_t *f, char *err, size_t errlen);
void ts_pt_close(ts_pt_file_t *f);
/* The same for a file's bytes in memory (borrowed: they must outlive *f). */
int ts_pt_parse(const void *buf, size_t len, ts_pt_file_t *f, char *err, size_t errlen);

const ts_pt_tensor_t *ts_pt_find(const ts_pt_file_t *f, const char *name);
int64_t ts_pt_numel(const ts_pt_tensor_t *t);

/* The tensor's elements in row-major order (its strides followed) as float into out (numel
 * values): F16 and BF16 widened exactly, F64 rounded. TS_ENOTSUP for TS_PT_OTHER. */
int ts_pt_to_f32(const ts_pt_tensor_t *t, float *out);

#ifdef __cplusplus
}
#endif

#endif
