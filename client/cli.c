/* cli.c — what the verbs of `tessera` share beyond their options (client/cli.h). */
#define _POSIX_C_SOURCE 200809L

#include "client/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "model/latents.h"
#include "model/vae.h"

int ts_cli_engine(ts_engine_t *e, const ts_device_spec_t *device, int threads, const char *prog,
                  char *err, size_t errlen) {
    static const ts_device_spec_t cpu = {0};
    const ts_device_spec_t *d = device ? device : &cpu;
    char note[512] = "";
    int rc = ts_engine_init_spec(e, d, threads, note, sizeof note);
    if (rc != TS_OK) {
        snprintf(err, errlen, "cannot start the engine: %s", note[0] ? note : ts_strerror(rc));
        return rc;
    }
    if (e->device != TS_CPU || d->named) /* a GPU is worth a line, and what was asked for */
        fprintf(stderr, "%s: computing on %s\n", prog, note);
    return TS_OK;
}

int ts_cli_precision(ts_dit_t *models, int n, ts_precision_t p, const char *prog, char *err,
                     size_t errlen) {
    char why[256] = "";
    for (int i = 0; i < n; i++) {
        int rc = ts_dit_set_precision(&models[i], p, why, sizeof why);
        if (rc != TS_OK) {
            snprintf(err, errlen, "--precision %s: %s", ts_precision_name(p),
                     why[0] ? why : ts_strerror(rc));
            return rc;
        }
    }
    if (p != TS_PREC_F32 && n > 0 && prog) {
        int cpu = models[0].eng->device == TS_CPU;
        fprintf(stderr, "%s: %s products (%s), fp32 accumulation, LayerNorm and softmax\n", prog,
                ts_precision_name(p),
                !cpu                ? "cuBLAS"
                : p == TS_PREC_BF16 ? "oneDNN"
                                    : "emulated: slower than f32");
    }
    return TS_OK;
}

int ts_cli_attention(ts_dit_t *models, int n, const char *choice, const char *prog, char *err,
                     size_t errlen) {
    if (!choice)
        return TS_OK;
    ts_attn_choice_t c;
    if (ts_attn_choice_parse(choice, &c) != TS_OK)
        return ts_fail(err, errlen, TS_EINVAL,
                       "--attention %s: want auto, measure, fused or composed", choice);
    for (int i = 0; i < n; i++) {
        char note[448];
        int rc = ts_dit_choose_attention(&models[i], c, models[i].max_batch, note, sizeof note);
        if (rc != TS_OK)
            return ts_fail(err, errlen, rc, "--attention %s: %s", choice, note);
        if (prog && n > 1)
            fprintf(stderr, "%s: expert %d: %s\n", prog, i, note);
        else if (prog)
            fprintf(stderr, "%s: %s\n", prog, note);
    }
    return TS_OK;
}

int ts_cli_attention_ok(const char *choice, const char *prog) {
    ts_attn_choice_t c;
    if (!choice || ts_attn_choice_parse(choice, &c) == TS_OK)
        return 1;
    fprintf(stderr, "%s: --attention %s: want auto, measure, fused or composed\n", prog, choice);
    return 0;
}

int ts_cli_vae_check(const char *vae_path, const char *space, const char *who, char *err,
                     size_t errlen) {
    char hex[TS_LATENT_SPACE_HEX], a[32], b[32];
    if (!space || !*space) /* files from before latent spaces were named: the channels decide */
        return TS_OK;
    int rc = ts_latent_space_of(vae_path, hex, err, errlen);
    if (rc == TS_OK && strcmp(hex, space) != 0)
        rc = ts_fail(err, errlen, TS_EINVAL,
                     "%s makes the latent space of %s, and %s work in that of %s: not their VAE "
                     "(decode with the VAE whose latents they were trained on)",
                     vae_path, ts_latent_space_name(hex, a, sizeof a), who,
                     ts_latent_space_name(space, b, sizeof b));
    return rc;
}

int ts_cli_vae_decode(const char *vae_path, ts_engine_t *e, ts_precision_t p, const float *latents,
                      int n, int L, int h, const char *who, float **out, int *C, int *side,
                      char *err, size_t errlen) {
    ts_vae_t *vae = NULL;
    int rc = ts_vae_open(&vae, vae_path, NULL, err, errlen);
    if (rc == TS_OK && vae->cfg.latent_channels != L)
        rc = ts_fail(err, errlen, TS_EINVAL,
                     "%s makes latents of %d channels, and %s samples %d: not its expert", vae_path,
                     vae->cfg.latent_channels, who, L);
    if (rc == TS_OK)
        rc = ts_vae_set_precision(vae, e, p, err, errlen);
    int f = rc == TS_OK ? ts_vae_factor(&vae->cfg) : 1, S = h * f;
    int oc = rc == TS_OK ? vae->cfg.out_channels : 0;
    int64_t per = (int64_t)oc * S * S, lper = (int64_t)L * h * h;
    float *img = rc == TS_OK ? malloc((size_t)(n * per) * sizeof *img) : NULL;
    if (rc == TS_OK && !img)
        rc = ts_fail(err, errlen, TS_ENOMEM, "no memory for %d decoded images", n);
    for (int i = 0; rc == TS_OK && i < n; i++) {
        ts_tensor_t lat, pic;
        rc = ts_tensor_wrap(&lat, (float *)latents + i * lper, TS_F32, TS_CPU, 4,
                            TS_SHAPE(1, L, h, h));
        if (rc == TS_OK)
            rc = ts_tensor_wrap(&pic, img + i * per, TS_F32, TS_CPU, 4, TS_SHAPE(1, oc, S, S));
        if (rc == TS_OK)
            rc = ts_vae_decode(vae, e, &pic, &lat, err, errlen);
    }
    if (rc == TS_OK)
        *out = img, *C = oc, *side = S;
    else
        free(img);
    ts_vae_free(vae);
    return rc;
}

int ts_cli_split_list(char *s, const char **out, int max) {
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max)
            return -1;
        out[n++] = tok;
    }
    return n;
}
