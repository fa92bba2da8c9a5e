/*
 * vae_parity.c — the C half of the PyTorch parity test of the VAE (model/vae.c).
 *
 * A small tool that run_vae_parity.py drives:
 *
 *   vae_parity run WEIGHTS INPUTS OUT
 *       Loads WEIGHTS (ts_vae_open, config from the file), reads image (B, C, H, W) and latent
 *       (B, L, h, w), both F32, from INPUTS, and writes to OUT: mean (ts_vae_encode's latent,
 *       scaled), logvar, and decoded (ts_vae_decode of INPUTS' latent). Prints one JSON line:
 *       the attention naming the loader found, the parameter count, the workspace bytes and the
 *       seconds of each forward.
 *
 * It uses a CPU engine of TESSERA_THREADS threads (2 when unset). What it is not: a user tool
 * (that is `tessera vae`); any failure prints the error and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "kernels/ops.h"
#include "model/safetensors.h"
#include "model/vae.h"

#define ERRLEN 512

static char g_err[ERRLEN];

static void fail(const char *what, int rc) {
    fprintf(stderr, "vae_parity: %s: %s%s%s\n", what, ts_strerror(rc), g_err[0] ? ": " : "", g_err);
    exit(1);
}

#define CHECK(what, expr)                                                                          \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != TS_OK)                                                                          \
            fail(what, rc_);                                                                       \
    } while (0)

/* A named 4-D tensor of f as an owning F32 CPU tensor. */
static void read_4d(const ts_st_file_t *f, const char *name, ts_tensor_t *out) {
    const ts_st_tensor_t *st = ts_st_find(f, name);
    if (!st || st->ndim != 4) {
        snprintf(g_err, sizeof g_err, "no 4-D tensor \"%s\"", name);
        fail("reading inputs", TS_ECORRUPT);
    }
    CHECK("allocating an input", ts_tensor_alloc(out, TS_F32, TS_CPU, 4, st->shape));
    CHECK("converting an input", ts_st_to_f32(st, (float *)out->data, st->numel));
}

static ts_st_entry_t entry(const char *name, const ts_tensor_t *t) {
    ts_st_entry_t en = {.name = name, .dtype = TS_ST_F32, .ndim = 4, .data = t->data};
    for (int i = 0; i < 4; i++)
        en.shape[i] = t->shape[i];
    return en;
}

int main(int argc, char **argv) {
    ts_precision_t prec = TS_PREC_F32;
    if ((argc != 5 && argc != 6) || strcmp(argv[1], "run") != 0 ||
        (argc == 6 && ts_precision_parse(argv[5], &prec) != TS_OK)) {
        fprintf(stderr, "usage: vae_parity run WEIGHTS INPUTS OUT [f32|bf16|f16]\n");
        return 2;
    }
    const char *threads_env = getenv("TESSERA_THREADS");
    int threads = threads_env ? atoi(threads_env) : 2;
    ts_engine_t e;
    ts_engine_opts_t opts = {.device = TS_CPU, .threads = threads > 0 ? threads : 2};
    CHECK("engine", ts_engine_init(&e, &opts));
    ts_vae_t *m;
    double t0 = ts_now_s();
    CHECK("loading the VAE", ts_vae_open(&m, argv[2], NULL, g_err, sizeof g_err));
    CHECK("precision", ts_vae_set_precision(m, &e, prec, g_err, sizeof g_err));
    double t_load = ts_now_s() - t0;

    ts_st_file_t f;
    CHECK(argv[3], ts_st_read(argv[3], &f, g_err, sizeof g_err));
    ts_tensor_t image, latent, mean, logvar, decoded;
    read_4d(&f, "image", &image);
    read_4d(&f, "latent", &latent);
    ts_st_free(&f);
    const int64_t fct = ts_vae_factor(&m->cfg), B = image.shape[0];
    const int64_t L = m->cfg.latent_channels;
    CHECK("alloc", ts_tensor_alloc(&mean, TS_F32, TS_CPU, 4,
                                   TS_SHAPE(B, L, image.shape[2] / fct, image.shape[3] / fct)));
    CHECK("alloc", ts_tensor_alloc(&logvar, TS_F32, TS_CPU, 4, mean.shape));
    CHECK("alloc", ts_tensor_alloc(&decoded, TS_F32, TS_CPU, 4,
                                   TS_SHAPE(latent.shape[0], m->cfg.out_channels,
                                            latent.shape[2] * fct, latent.shape[3] * fct)));
    CHECK("reserve",
          ts_vae_reserve(m, image.shape[2] > decoded.shape[2] ? image.shape[2] : decoded.shape[2],
                         image.shape[3] > decoded.shape[3] ? image.shape[3] : decoded.shape[3],
                         g_err, sizeof g_err));
    t0 = ts_now_s();
    CHECK("encode", ts_vae_encode(m, &e, &mean, &logvar, &image, g_err, sizeof g_err));
    double t_enc = ts_now_s() - t0;
    t0 = ts_now_s();
    CHECK("decode", ts_vae_decode(m, &e, &decoded, &latent, g_err, sizeof g_err));
    double t_dec = ts_now_s() - t0;

    ts_st_entry_t en[3] = {entry("mean", &mean), entry("logvar", &logvar),
                           entry("decoded", &decoded)};
    CHECK(argv[4], ts_st_write(argv[4], en, 3, NULL, 0, g_err, sizeof g_err));
    printf("{\"attn_naming\": \"%s\", \"params\": %lld, \"work_bytes\": %zu, \"threads\": %d, "
           "\"load_s\": %.3f, \"encode_s\": %.3f, \"decode_s\": %.3f}\n",
           m->attn_naming, (long long)ts_vae_numel(m),
           ts_vae_work_bytes(&m->cfg, m->work_h, m->work_w), e.threads, t_load, t_enc, t_dec);
    ts_tensor_free(&image);
    ts_tensor_free(&latent);
    ts_tensor_free(&mean);
    ts_tensor_free(&logvar);
    ts_tensor_free(&decoded);
    ts_vae_free(m);
    ts_engine_free(&e);
    return 0;
}
