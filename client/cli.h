/*
 * cli.h — what the verbs of `tessera` share beyond their options (args.h): the engine of
 * --device, the precision of --precision, --vae's decoding of latent samples, and a comma list.
 */
#ifndef TS_CLIENT_CLI_H
#define TS_CLIENT_CLI_H

#include <stddef.h>

#include "kernels/engine.h"
#include "model/dit.h"

/* The engine of a verb's --device (a zeroed spec is the CPU, every verb's default) with threads
 * CPU workers. Anything but the plain CPU is announced on stderr ("PROG: computing on …", with
 * auto's reason when it stays on the CPU); a device that cannot start is an error with the
 * reason in err. */
int ts_cli_engine(ts_engine_t *e, const ts_device_spec_t *device, int threads, const char *prog,
                  char *err, size_t errlen);

/* Whether vae_path is the VAE of experts (who, for the message) working in latent space `space`
 * (model/latents.h; "" when their files name none — then only the channels are checked, at
 * decoding): TS_OK, or TS_EINVAL / TS_EIO with a sentence naming both spaces.  */
int ts_cli_vae_check(const char *vae_path, const char *space, const char *who, char *err,
                     size_t errlen);

/* --vae: n latents (n, L, h, h) on the CPU — a latent expert's samples — decoded by the VAE at
 * vae_path one by one on the client's engine e (a GPU's too: model/vae.h), its products in
 * precision p (the verb's --precision), into *out (n, *C, *side, *side) on the CPU, malloc'ed (the
 * caller frees it). A VAE whose latents have other than L channels is refused, naming `who` (the
 * expert). */
int ts_cli_vae_decode(const char *vae_path, ts_engine_t *e, ts_precision_t p, const float *latents,
                      int n, int L, int h, const char *who, float **out, int *C, int *side,
                      char *err, size_t errlen);

/* Sets the precision of a verb's --precision on the n models (kernels/engine.h, model/dit.h
 * ts_dit_set_precision: bf16 converts their weights once, here). f32 is the default and says
 * nothing; bf16 is announced on stderr ("PROG: bf16 products …"; prog NULL: silently). Where
 * bf16 cannot run the error is TS_ENOTSUP with the reason in err. */
int ts_cli_precision(ts_dit_t *models, int n, ts_precision_t p, const char *prog, char *err,
                     size_t errlen);
/* A verb's --attention (model/dit.h ts_dit_choose_attention) on the n models, each measured at
 * its max_batch where asked: NULL (no --attention) leaves each on its default; each model's
 * choice is said on stderr ("PROG: attention …", "PROG: expert K: …"; prog NULL: silently). An
 * unknown name is TS_EINVAL with the names in err. */
#define TS_CLI_ATTENTION_HELP                                                                      \
    "fused, composed, measure (both timed on this machine, the faster kept where the fused one "   \
    "agrees with the composed one; on a GPU also CUDA graphs and, at 16 bits, the bias "           \
    "epilogue; a near tie can go either way from run to run, so name one for reproducible bits) "  \
    "or auto (measure on a GPU, as a daemon does; the default on a CPU); default: each model's "   \
    "own, docs/architecture.md \"Choosing the attention\""
int ts_cli_attention(ts_dit_t *models, int n, const char *choice, const char *prog, char *err,
                     size_t errlen);
/* 1 where choice (a verb's --attention, NULL when not given) is a name ts_cli_attention takes;
 * else 0, after saying so on stderr ("PROG: --attention X: want …"): the verb's usage error. */
int ts_cli_attention_ok(const char *choice, const char *prog);
/* Splits the comma list s in place into at most max items (out, pointing into s); the count, or
 * −1 past max. */
int ts_cli_split_list(char *s, const char **out, int max);

#endif
