/*
 * bench_vae.c — the VAE's encode and decode timed (bench_latent.py runs it next to PyTorch).
 *
 *   bench_vae --weights VAE.safetensors [--size 256] [--threads N] [--precision f32|bf16|f16]
 *             [--device cpu|cuda|cuda:N] [--seconds S] [--json]
 *
 * One image of size×size (uniform in [−1, 1]) is encoded and one latent (normal) decoded, each
 * after a warm-up of 2 calls, call by call for at least S seconds (2) and 3 calls; the figure is
 * the median call, the device synchronised at its end (a GPU's ops are queued). The image and the
 * latent live on the engine's device, so a GPU's figure is the model's work without the copies.
 * The workspace is reserved before the first call. Prints one line per direction, or one JSON
 * object: {"encode_s", "decode_s", "work_bytes", "threads", "precision", "device"}.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "kernels/engine.h"
#include "kernels/ops.h"
#include "model/vae.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef int (*call_fn)(ts_vae_t *m, ts_engine_t *e, ts_tensor_t *a, ts_tensor_t *b, char *err,
                       size_t errlen);

static int enc(ts_vae_t *m, ts_engine_t *e, ts_tensor_t *img, ts_tensor_t *lat, char *err,
               size_t errlen) {
    return ts_vae_encode(m, e, lat, NULL, img, err, errlen);
}

static int dec(ts_vae_t *m, ts_engine_t *e, ts_tensor_t *img, ts_tensor_t *lat, char *err,
               size_t errlen) {
    return ts_vae_decode(m, e, img, lat, err, errlen);
}

/* The median seconds of fn's calls (warm-up 2, then ≥ seconds and ≥ 3 calls); < 0 on failure. */
static double time_it(call_fn fn, ts_vae_t *m, ts_engine_t *e, ts_tensor_t *img, ts_tensor_t *lat,
                      double seconds, char *err, size_t errlen) {
    for (int i = 0; i < 2; i++)
        if (fn(m, e, img, lat, err, errlen) != TS_OK)
            return -1.0;
    double calls[4096];
    int n = 0;
    double t0 = ts_now_s();
    while ((ts_now_s() - t0 < seconds || n < 3) && n < 4096) {
        double c0 = ts_now_s();
        if (fn(m, e, img, lat, err, errlen) != TS_OK || ts_engine_sync(e) != TS_OK)
            return -1.0;
        calls[n++] = ts_now_s() - c0;
    }
    qsort(calls, (size_t)n, sizeof *calls, cmp_double);
    return n % 2 ? calls[n / 2] : 0.5 * (calls[n / 2 - 1] + calls[n / 2]);
}

int main(int argc, char **argv) {
    const char *weights = NULL, *device = "cpu";
    int size = 256, threads = 0, json = 0;
    double seconds = 2.0;
    ts_precision_t prec = TS_PREC_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--weights") == 0 && v)
            weights = argv[++i];
        else if (strcmp(a, "--size") == 0 && v)
            size = atoi(argv[++i]);
        else if (strcmp(a, "--threads") == 0 && v)
            threads = atoi(argv[++i]);
        else if (strcmp(a, "--seconds") == 0 && v)
            seconds = atof(argv[++i]);
        else if (strcmp(a, "--precision") == 0 && v && ts_precision_parse(v, &prec) == TS_OK)
            i++;
        else if (strcmp(a, "--device") == 0 && v)
            device = argv[++i];
        else if (strcmp(a, "--json") == 0)
            json = 1;
        else {
            fprintf(stderr, "usage: bench_vae --weights VAE.safetensors [--size N] [--threads N] "
                            "[--precision f32|bf16|f16] [--device cpu|cuda|cuda:N] [--seconds S] "
                            "[--json]\n");
            return 2;
        }
    }
    if (!weights || size < 8 || size > 4096 || seconds < 0) {
        fprintf(stderr, "bench_vae: --weights FILE is required; --size in 8..4096\n");
        return 2;
    }
    char err[512] = "";
    ts_engine_t e = {0};
    ts_device_spec_t spec;
    ts_vae_t *m = NULL;
    ts_tensor_t img = {0}, lat = {0};
    if (ts_device_spec_parse(device, &spec) != TS_OK) {
        fprintf(stderr, "bench_vae: --device wants %s, not '%s'\n", TS_DEVICE_SPEC_HELP, device);
        return 2;
    }
    int rc = ts_engine_init_spec(&e, &spec, threads, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_vae_open(&m, weights, NULL, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_vae_set_precision(m, &e, prec, err, sizeof err);
    int f = rc == TS_OK ? ts_vae_factor(&m->cfg) : 1;
    if (rc == TS_OK && size % f != 0)
        rc = ts_fail(err, sizeof err, TS_EINVAL, "--size %d is not a multiple of %d", size, f);
    if (rc == TS_OK)
        rc =
            ts_tensor_alloc(&img, TS_F32, e.device, 4, TS_SHAPE(1, m->cfg.in_channels, size, size));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&lat, TS_F32, e.device, 4,
                             TS_SHAPE(1, m->cfg.latent_channels, size / f, size / f));
    if (rc == TS_OK) {
        rc = ts_rng_uniform(&e, &img, 1, 0);
        if (rc == TS_OK)
            rc = ts_affine(&e, &img, 2.0f, -1.0f);
        if (rc == TS_OK)
            rc = ts_rng_normal(&e, &lat, 2, 0);
    }
    if (rc == TS_OK && e.device == TS_CPU) /* a GPU's workspace is made by the first call */
        rc = ts_vae_reserve(m, size, size, err, sizeof err);
    double te = rc == TS_OK ? time_it(enc, m, &e, &img, &lat, seconds, err, sizeof err) : -1.0;
    double td = te >= 0 ? time_it(dec, m, &e, &img, &lat, seconds, err, sizeof err) : -1.0;
    if (rc == TS_OK && td < 0)
        rc = TS_EINVAL;
    if (rc != TS_OK) {
        fprintf(stderr, "bench_vae: %s%s%s\n", err, *err ? ": " : "", ts_strerror(rc));
    } else if (json) {
        printf("{\"size\": %d, \"threads\": %d, \"precision\": \"%s\", \"device\": \"%s\", "
               "\"encode_s\": %.6f, \"decode_s\": %.6f, \"work_bytes\": %zu, \"params\": %lld}\n",
               size, e.threads, ts_precision_name(prec), device, te, td,
               ts_vae_work_bytes(&m->cfg, size, size), (long long)ts_vae_numel(m));
    } else {
        printf("VAE %d×%d, %d threads, %s products: encode %.3f s, decode %.3f s (median call); "
               "workspace %.1f MiB\n",
               size, size, e.threads, ts_precision_name(prec), te, td,
               ts_vae_work_bytes(&m->cfg, size, size) / 1048576.0);
    }
    ts_tensor_free(&img);
    ts_tensor_free(&lat);
    ts_vae_free(m);
    ts_engine_free(&e);
    return rc == TS_OK ? 0 : 1;
}
