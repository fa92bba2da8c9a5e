/*
 * latents.h — a latent data set: images encoded by the VAE (model/vae.h), the training data of a
 * latent expert. `tessera encode DIR` writes one; `tessera train --latents FILE` trains on it.
 *
 * The file is safetensors: "latents" F32 (N, L, h, w) — the VAE's scaled latents (mean ·
 * scaling_factor, or a seeded sample of the posterior, scaled alike) — and "labels" I32 (N), each
 * in [0, num_classes); metadata "format": "tessera-latents/1", "num_classes", and what made it:
 * "vae" (the VAE file's name), "scaling_factor", "image_height", "image_width",
 * "image_channels", "mode" ("mean" or "sample"), "seed", and "latent_space".
 *
 * A latent space is named by the VAE that makes it: the BLAKE2b-256 of the VAE's file, 64
 * lowercase hex digits, under the metadata key "latent_space" — in a latent data set, in the
 * experts trained on it (`tessera train --latents`), in a partition of it (`tessera partition
 * --latents`), and in a node's advert (AdvertBody.latent_space). Two experts mix only in one latent
 * space (pixels: no key), and only that VAE decodes their samples.
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
#define TS_LATENT_SPACE_KEY "latent_space"
#define TS_LATENT_SPACE_HEX 65 /* 64 hex digits and the NUL */

struct ts_st_file;

/* The latent space a VAE file makes: the BLAKE2b-256 of its bytes as hex. TS_EIO with a
 * sentence when it cannot be read. */
int ts_latent_space_of(const char *vae_path, char hex[TS_LATENT_SPACE_HEX], char *err,
                       size_t errlen);

/* The latent space a file's metadata names: 1 (and hex) when it names one, 0 when it names none
 * (pixels: hex is ""), TS_ECORRUPT when the value is not 64 hex digits. */
int ts_latent_space_meta(const struct ts_st_file *f, char hex[TS_LATENT_SPACE_HEX]);

/* "pixels", or the space's first 16 hex digits and "…" (for messages), in out (≥ 24 bytes). */
const char *ts_latent_space_name(const char *hex, char *out, size_t len);

/* Writes n latents (n, L, h, w) with their labels (n values in [0, num_classes)) and the
 * key/value pairs meta (n_meta of them, besides the format and num_classes) atomically. */
int ts_latents_save(const char *path, const float *latents, const int32_t *labels, int n, int L,
                    int h, int w, int num_classes, const char *const *meta, int n_meta, char *err,
                    size_t errlen);

/* Reads a latent data set into *ds (images = the latents: channels L, height h, width w; labels;
 * num_classes), owned by the caller (ts_dataset_free); space (may be NULL) receives its latent
 * space ("" when the file names none: one written before the key existed). Errors: TS_ENOTFOUND, TS_EKIND (a
 * safetensors file of another kind), TS_ECORRUPT (a tensor missing, of the wrong shape or type,
 * a latent not finite, a label out of range), TS_ENOMEM. */
int ts_latents_load(const char *path, ts_dataset_t *ds, char space[TS_LATENT_SPACE_HEX], char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
