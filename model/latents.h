/*
 * latents.h — a latent data set: images encoded by the VAE (model/vae.h), the training data of a
 * latent expert. `tessera encode DIR` writes one; `tessera train --latents FILE` trains on it.
 *
 * The file is safetensors: "latents" F32 (N, L, h, w) — the VAE's scaled latents (mean ·
 * scaling_factor, or a seeded sample of the posterior, scaled alike) — and "labels" I32 (N), each
 * in [0, num_classes); metadata "format": "tessera-latents/1", "num_classes", and what made it:
 * "vae" (the VAE file's name), "scaling_factor", "image_height", "image_width",
 * "image_channels", "mode" ("mean" or "sample"), "seed".
 *
 * `err`/`errlen`: a failure writes one NUL-terminated sentence there.
 */
#ifndef TS_LATENTS_H
#define TS_LATENTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/fmnist.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_LATENTS_FORMAT "tessera-latents/1"

/* Writes n latents (n, L, h, w) with their labels (n values in [0, num_classes)) and the
 * key/value pairs meta (n_meta of them, besides the format and num_classes) atomically. */
int ts_latents_save(const char *path, const float *latents, const int32_t *labels, int n, int L,
                    int h, int w, int num_classes, const char *const *meta, int n_meta, char *err,
                    size_t errlen);

/* Reads a latent data set into *ds (images = the latents: channels L, height h, width w; labels;
 * num_classes), owned by the caller (ts_dataset_free). Errors: TS_ENOTFOUND, TS_EKIND (a
 * safetensors file of another kind), TS_ECORRUPT (a tensor missing, of the wrong shape or type,
 * a latent not finite, a label out of range), TS_ENOMEM. */
int ts_latents_load(const char *path, ts_dataset_t *ds, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
