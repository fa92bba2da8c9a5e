/*
 * dit_io.h — DiT weights to and from safetensors files, under DiT's own names.
 *
 * The file's __metadata__ carries the config under the DiT constructor's names as decimal
 * strings: input_size, patch_size, in_channels, hidden_size, depth, num_heads, num_classes
 * (required), mlp_ratio (default 4) and freq_dim (default 256); plus anything the caller adds
 * (objective, partition_id, cluster, ...). Tensors are named as in architecture.md §9 (the PyTorch
 * state_dict of a DiT), pos_embed included as (1, T, hidden) so a PyTorch DiT loads the file
 * with strict=True. F16 and BF16 tensors are converted to F32 on load.
 */
#ifndef TS_DIT_IO_H
#define TS_DIT_IO_H

#include "model/dit.h"
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the config from f's metadata and checks it (ts_dit_config_check). */
int ts_dit_config_from_file(const ts_st_file_t *f, ts_dit_config_t *cfg, char *err, size_t errlen);

/* Copies every parameter of m from f (by name; shapes must match exactly; F16/BF16/F32 accepted)
 * into m->param_mem. A missing tensor, a wrong shape or a non-finite value is TS_ECORRUPT with
 * the tensor named in err. pos_embed, when present, must match the model's fixed table (within
 * 1e-5) and is otherwise ignored; any other unknown tensor is an error. */
int ts_dit_load(ts_dit_t *m, const ts_st_file_t *f, char *err, size_t errlen);

/* Reads path, builds *m for its config on engine e (max_batch, trainable as ts_dit_create) and
 * loads the weights. On failure *m is empty and err says why. */
int ts_dit_open(ts_dit_t *m, const char *path, ts_engine_t *e, int max_batch, int trainable,
                char *err, size_t errlen);

/* The same for a file already parsed (e.g. reassembled from the store): builds *m for f's config
 * and loads the weights; f stays the caller's. On failure *m is empty and err says why. */
int ts_dit_open_file(ts_dit_t *m, const ts_st_file_t *f, ts_engine_t *e, int max_batch,
                     int trainable, char *err, size_t errlen);

/* Writes slab (the model's param_mem, or any slab of the same layout such as the EMA copy) as a
 * safetensors file in dtype (TS_ST_F32, TS_ST_F16 or TS_ST_BF16) with the config metadata and
 * n_extra extra key/value pairs (extra[2i], extra[2i+1]). Atomic (ts_st_write). */
int ts_dit_save(const ts_dit_t *m, const ts_tensor_t *slab, const char *path, ts_st_dtype_t dtype,
                const char *const *extra, int n_extra, char *err, size_t errlen);

/* The same bytes in memory: *buf (malloc'd, the caller frees it) holds *len bytes, ready for
 * ts_weights_import_buf (store/weights.h). On failure *buf is NULL and err says why. */
int ts_dit_save_mem(const ts_dit_t *m, const ts_tensor_t *slab, ts_st_dtype_t dtype,
                    const char *const *extra, int n_extra, unsigned char **buf, size_t *len,
                    char *err, size_t errlen);

/* values (T·h floats) against m's fixed sin-cos pos_embed: |Δ| ≤ 1e-5 + rel·|ours| for each
 * (rel: half an ulp of a 16-bit source, 2^-11 for f16, 2^-8 for bf16, 0 for f32). TS_ECORRUPT
 * with the first element that differs, TS_ENOMEM. The loader's check, and `tessera import`'s. */
int ts_dit_check_pos_embed(const ts_dit_t *m, const float *values, double rel, char *err,
                           size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
