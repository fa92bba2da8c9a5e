/*
 * vae.h — Stable Diffusion's image autoencoder (diffusers' AutoencoderKL), inference in fp32 on
 * the CPU engine: an image in [-1, 1] to a latent and back.
 *
 * The network, for block_out_channels (c0, c1, …, c_{n−1}) and L latent channels:
 *
 *   encode: conv_in 3×3 → n down blocks (layers_per_block ResNet blocks each, then a stride-2
 *           3×3 conv after pad (0, 1, 0, 1), except the last) → mid (ResNet, one-head
 *           self-attention over the H·W pixels, ResNet) → GroupNorm, SiLU, conv_out 3×3 to 2L
 *           channels → quant_conv 1×1 → (mean, logvar), L channels each.
 *   decode: post_quant_conv 1×1 → conv_in 3×3 → mid → n up blocks in reversed channel order
 *           (layers_per_block + 1 ResNet blocks each, then nearest ×2 and a 3×3 conv, except the
 *           last) → GroupNorm, SiLU, conv_out 3×3 to the image's channels.
 *   ResNet block: x + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))), x through a 1×1 conv_shortcut
 *           when the channel count changes. Every GroupNorm has `groups` groups and eps.
 *
 * Scaling: ts_vae_encode returns mean · scaling_factor (the latent a diffusion model works on)
 * and ts_vae_decode divides by it first, as diffusers' pipelines do. The log-variance is
 * returned as computed (diffusers clamps it to [−30, 20] only when it samples).
 *
 * Weights come from a safetensors file under diffusers' names (model/vae_io.c). Every parameter
 * lives in one F32 slab; the layers are views into it. A forward works one image at a time in a
 * workspace sized for the largest image seen (ts_vae_reserve), so a batch of B costs no more
 * memory than one image and each image's result does not depend on the batch.
 *
 * Engines: the CPU, or a GPU (CUDA): there the first forward copies the slab to the engine's
 * device and keeps the copy (ts_vae_weights_changed after writing the slab again), and the
 * workspace lives on the device; images and latents may be on the CPU (staged through the
 * workspace, one image at a time) or on the engine's device.
 *
 * What it is not: a trainer (no backward) or a sampler of the latent distribution.
 */
#ifndef TS_VAE_H
#define TS_VAE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_VAE_MAX_BLOCKS 6
#define TS_VAE_MAX_LAYERS 4 /* layers_per_block at most; the decoder has one more */

typedef struct ts_vae_config {
    int in_channels;  /* image channels into the encoder (3) */
    int out_channels; /* image channels out of the decoder (3) */
    int latent_channels;
    int n_blocks;                     /* len(block_out_channels) */
    int block_out[TS_VAE_MAX_BLOCKS]; /* block_out_channels */
    int layers_per_block;
    int groups; /* GroupNorm groups; every channel count is a multiple */
    float eps;  /* GroupNorm eps */
    float scaling_factor;
} ts_vae_config_t;

/* The sd-vae-ft-mse configuration: 3 → 4 latent channels, (128, 256, 512, 512), 2 layers per
 * block, 32 groups, eps 1e-6, scaling factor 0.18215 (a latent is 1/8 of the image's side). */
void ts_vae_config_sd(ts_vae_config_t *c);
/* TS_OK, or TS_EINVAL with a sentence naming the bad field. */
int ts_vae_config_check(const ts_vae_config_t *c, char *err, size_t errlen);
/* The image side's divisor: 2^(n_blocks − 1). */
int ts_vae_factor(const ts_vae_config_t *c);

/* One parameter: its diffusers name, shape, and place in the slab. The mid blocks' attention
 * weights are (C, C) here (Linear); model/vae_io.c also reads their older names and the
 * (C, C, 1, 1) conv form. q, k and v sit next to each other, so the model runs one 1×1 conv of
 * 3C outputs for the three. */
typedef struct ts_vae_param {
    char name[80];
    int ndim;
    int64_t shape[4];
    int64_t offset; /* floats into the slab */
    int attn;       /* 1 for an attention projection's weight or bias, 0 otherwise */
} ts_vae_param_t;

struct ts_vae_net; /* the layers' views (model/vae.c) */

typedef struct ts_vae {
    ts_vae_config_t cfg;
    ts_tensor_t slab; /* every parameter, F32 on the CPU */
    int n_params;
    ts_vae_param_t *params;
    struct ts_vae_net *net;
    /* set by the loader: "to_q/to_k/to_v/to_out.0" or "query/key/value/proj_attn" */
    const char *attn_naming;
    /* workspace, for images up to work_h × work_w (ts_vae_reserve) */
    ts_tensor_t work;
    int64_t work_h, work_w;
    ts_precision_t precision; /* the convolutions' and attention's products (zeroed: f32) */
    /* a GPU engine's copy of the slab and the views into it, made by its first forward */
    ts_tensor_t dslab;
    struct ts_vae_net *dnet;
    int dslab_gpu, dslab_stale; /* the copy's device ordinal; the slab changed since the copy */
    int work_gpu;               /* the workspace's ordinal when it is on a GPU */
    /* At bf16 or f16: the slab (and the GPU copy) converted once to that precision, made by the
     * first such forward; the convolutions read their weights from it, so no product rounds a
     * weight again (kernels/ops.h ts_conv2d_forward). Remade when the weights change. */
    ts_tensor_t lslab, dlslab;
    int lslab_stale, dlslab_stale;
    /* The CPU too (0 by default): the CPU has no 16-bit product to feed, so there the converted
     * weights save no rounding and cost widening passes and scratch; tests turn it on to run the
     * GPU's route on the CPU (the same bits). */
    int cpu_lp_weights;
} ts_vae_t;

/* The slab was written after a forward (the loader's writes come before any): the next forward
 * copies it to the GPU again and converts it to 16 bits again (a forward at bf16 or f16 keeps a
 * converted copy). */
void ts_vae_weights_changed(ts_vae_t *m);

/* The products of every convolution and of the attention in precision p: f32 (the default), bf16
 * or f16 — operands rounded, fp32 accumulation; GroupNorm, SiLU, the softmax, the residual
 * adds and every activation stay fp32. On a GPU (and on the CPU with cpu_lp_weights) the
 * convolutions' weights are converted to p once, at the first forward in p (and again after
 * ts_vae_weights_changed), and their patches written in p: no product rounds an operand per
 * call. TS_ENOTSUP with the reason when e cannot run p (bf16
 * needs AVX-512 BF16 and oneDNN; e may be NULL: checked at the forward). */
int ts_vae_set_precision(ts_vae_t *m, ts_engine_t *e, ts_precision_t p, char *err, size_t errlen);

/* A model with every parameter zero. *out owned by the caller: ts_vae_free. */
int ts_vae_new(ts_vae_t **out, const ts_vae_config_t *cfg, char *err, size_t errlen);
void ts_vae_free(ts_vae_t *m);
/* Total parameters (floats in the slab). */
int64_t ts_vae_numel(const ts_vae_t *m);
/* Bytes of workspace a forward on images of height × width takes. 0 for sizes that are not
 * positive multiples of ts_vae_factor. */
size_t ts_vae_work_bytes(const ts_vae_config_t *c, int64_t height, int64_t width);
/* Makes the workspace fit images of height × width (a no-op when it already does). The forwards
 * call it themselves; calling it first keeps allocation out of them. */
int ts_vae_reserve(ts_vae_t *m, int64_t height, int64_t width, char *err, size_t errlen);

/* latent (B, L, H/f, W/f) = mean · scaling_factor, and logvar (same shape; NULL for none), of
 * image (B, in_channels, H, W) in [-1, 1]; f = ts_vae_factor. F32 tensors, each on the CPU or on
 * e's device. */
int ts_vae_encode(ts_vae_t *m, ts_engine_t *e, ts_tensor_t *latent, ts_tensor_t *logvar,
                  const ts_tensor_t *image, char *err, size_t errlen);
/* image (B, out_channels, h·f, w·f), about [-1, 1], of latent (B, L, h, w) (scaled, as
 * ts_vae_encode returns it). */
int ts_vae_decode(ts_vae_t *m, ts_engine_t *e, ts_tensor_t *image, const ts_tensor_t *latent,
                  char *err, size_t errlen);

/* ---- files (model/vae_io.c) ------------------------------------------------------------- */

/* The config a file's tensor shapes imply: channels and block count from the convs' shapes,
 * layers_per_block from the first down block; groups from the metadata key "norm_num_groups"
 * (else 32), scaling_factor from "scaling_factor" (else 0.18215), eps 1e-6. */
struct ts_st_file;
int ts_vae_config_from_file(const struct ts_st_file *f, ts_vae_config_t *cfg, char *err,
                            size_t errlen);
/* Loads a safetensors file (F32, F16 or BF16 tensors) into a new model; cfg NULL: from the file
 * (ts_vae_config_from_file). Every parameter must be present with its exact shape and finite;
 * no other tensor may be. The error names the tensor and what is wrong. *out: ts_vae_free. */
int ts_vae_open(ts_vae_t **out, const char *path, const ts_vae_config_t *cfg, char *err,
                size_t errlen);
/* Writes every parameter, F32, under its diffusers name (to_q/…/to_out.0, 2-D), with the
 * metadata norm_num_groups and scaling_factor. */
int ts_vae_save(const ts_vae_t *m, const char *path, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
