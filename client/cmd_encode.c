/*
 * cmd_encode.c — `tessera encode DIR --vae FILE --out LATENTS`: a folder of PNG images through the
 * VAE's encoder (model/vae.h) into a latent data set (model/latents.h), the training data of a
 * latent expert (`tessera train --latents`).
 *
 * The images are DIR's *.png in name order, all of one size (a multiple of the VAE's factor),
 * read as RGB (or grey, for a VAE of one input channel) and mapped to [−1, 1] as p / 127.5 − 1.
 * Their classes come from DIR/labels.txt when it exists — one line "NAME LABEL" per image — and
 * are all 0 otherwise. Each latent is the posterior's mean (scaled by the VAE's scaling factor),
 * or with --sample a draw mean + σ·ε, ε from the normal stream seed, element i of image k at
 * position k·(L·h·w) + i: the same file whatever the order of work.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/str.h"
#include "client/args.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "client/local.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "model/latents.h"
#include "model/png.h"
#include "model/vae.h"

#define PROG "tessera encode"
#define MAX_IMAGES 1000000

typedef struct {
    const char *dir, *vae, *out;
    int sample, threads, json, quiet;
    uint64_t seed;
    ts_device_spec_t device;
    ts_precision_t precision; /* zeroed: f32 */
} encode_opts_t;

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The *.png names of dir, sorted (*names malloc'ed, each too). */
static int list_pngs(const char *dir, char ***names, int *n, char *err, size_t errlen) {
    *names = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return ts_fail(err, errlen, TS_ENOTFOUND, "cannot open the folder %s", dir);
    int cap = 0, rc = TS_OK;
    for (struct dirent *e; rc == TS_OK && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".png") != 0)
            continue;
        if (*n == MAX_IMAGES) {
            rc = ts_fail(err, errlen, TS_ERANGE, "%s holds more than %d images", dir, MAX_IMAGES);
            break;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 256;
            char **g = realloc(*names, (size_t)cap * sizeof *g);
            if (!g) {
                rc = TS_ENOMEM;
                break;
            }
            *names = g;
        }
        if (!((*names)[*n] = ts_dup_str(e->d_name)))
            rc = TS_ENOMEM;
        else
            (*n)++;
    }
    closedir(d);
    if (rc == TS_OK && *n == 0)
        rc = ts_fail(err, errlen, TS_ENOTFOUND, "%s holds no .png image", dir);
    if (rc == TS_OK)
        qsort(*names, (size_t)*n, sizeof **names, by_name);
    return rc;
}

/* labels[i] for names[i] from dir/labels.txt ("NAME LABEL" lines); all 0 when there is none. */
static int read_labels(const char *dir, char **names, int n, int32_t *labels, int *classes,
                       char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/labels.txt", dir);
    for (int i = 0; i < n; i++)
        labels[i] = -1;
    *classes = 1;
    FILE *f = fopen(path, "r");
    if (!f) {
        for (int i = 0; i < n; i++)
            labels[i] = 0;
        return TS_OK;
    }
    char line[1024], name[512];
    int lineno = 0, rc = TS_OK;
    long v;
    while (rc == TS_OK && fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '#' || line[strspn(line, " \t\r\n")] == '\0')
            continue;
        if (sscanf(line, "%511s %ld", name, &v) != 2 || v < 0 || v > 100000) {
            rc = ts_fail(err, errlen, TS_ECORRUPT,
                         "%s:%d: want \"NAME LABEL\" with LABEL in "
                         "0..100000",
                         path, lineno);
            break;
        }
        char *const key = name;
        char **hit = bsearch(&key, names, (size_t)n, sizeof *names, by_name);
        if (!hit) {
            rc = ts_fail(err, errlen, TS_ECORRUPT, "%s:%d: no image %s in %s", path, lineno, name,
                         dir);
            break;
        }
        labels[hit - names] = (int32_t)v;
        if (v + 1 > *classes)
            *classes = (int)v + 1;
    }
    fclose(f);
    for (int i = 0; rc == TS_OK && i < n; i++)
        if (labels[i] < 0)
            rc = ts_fail(err, errlen, TS_ECORRUPT, "%s names no label for %s", path, names[i]);
    return rc;
}

/* image i's pixels (h, w, 3 or 1) into x (C, H, W) in [−1, 1] */
static void to_chw(const uint8_t *px, int C, int H, int W, float *x) {
    for (int c = 0; c < C; c++)
        for (int p = 0; p < H * W; p++)
            x[(size_t)c * H * W + p] = (float)px[(size_t)p * C + c] / 127.5f - 1.0f;
}

int ts_cmd_encode(int argc, char **argv) {
    encode_opts_t o = {.device = {.device = TS_CPU}};
    /* clang-format off */
    ts_arg_t args[] = {
        {"vae", TS_ARG_STRING, &o.vae, "FILE", "the VAE (a diffusers AutoencoderKL safetensors file, e.g. sd-vae-ft-mse)", 0, 0, 1},
        {"out", TS_ARG_STRING, &o.out, "FILE", "the latent data set to write (safetensors)", 0, 0, 1},
        {"sample", TS_ARG_FLAG, &o.sample, NULL, "a seeded draw from each image's posterior instead of its mean"},
        {"seed", TS_ARG_U64, &o.seed, "S", "the noise stream of --sample (default 0)"},
        {"threads", TS_ARG_INT, &o.threads, "N", "CPU threads (default: every core)", 0, 1024},
        {"device", TS_ARG_DEVICE, &o.device, "NAME", "where the VAE runs: " TS_DEVICE_SPEC_HELP " (default cpu)"},
        {"precision", TS_ARG_PRECISION, &o.precision, "P", "the VAE's matrix products in " TS_PRECISION_HELP},
        {"quiet", TS_ARG_FLAG, &o.quiet, NULL, "no progress lines"},
        {"json", TS_ARG_FLAG, &o.json, NULL, "print a summary as one JSON object on stdout"},
    };
    /* clang-format on */
    if (argc >= 2 && argv[1][0] != '-') { /* the folder comes first */
        o.dir = argv[1];
        argv[1] = argv[0];
        argc--, argv++;
    }
    int pr =
        ts_args_parse(PROG " DIR",
                      "Encode a folder of PNG images (all of one size) with the VAE into a "
                      "latent data set for `tessera train --latents`; labels from "
                      "DIR/labels.txt (\"NAME LABEL\" lines) when it exists.\nexample: tessera "
                      "encode images/ --vae sd-vae-ft-mse.safetensors --out latents.safetensors",
                      args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    if (!o.dir) {
        fprintf(stderr, PROG ": which folder? usage: " PROG " DIR --vae FILE --out FILE\n");
        return 2;
    }
    char err[1024] = "";
    char **names = NULL;
    int n = 0, classes = 1, have_eng = 0, C = 0, H = 0, W = 0, L = 0, h = 0, w = 0;
    ts_vae_t *vae = NULL;
    ts_engine_t eng = {0};
    int32_t *labels = NULL;
    float *lat = NULL, *x = NULL;
    uint8_t *px = NULL;
    ts_tensor_t timg = {0}, tlat = {0}, tvar = {0};
    int rc = list_pngs(o.dir, &names, &n, err, sizeof err);
    if (rc == TS_OK && !(labels = malloc((size_t)n * sizeof *labels)))
        rc = TS_ENOMEM;
    if (rc == TS_OK)
        rc = read_labels(o.dir, names, n, labels, &classes, err, sizeof err);
    if (rc == TS_OK)
        rc = ts_vae_open(&vae, o.vae, NULL, err, sizeof err);
    if (rc == TS_OK &&
        (rc = ts_cli_engine(&eng, &o.device, o.threads, PROG, err, sizeof err)) == TS_OK)
        have_eng = 1;
    if (rc == TS_OK)
        rc = ts_vae_set_precision(vae, &eng, o.precision, err, sizeof err);
    double t0 = ts_now_s();
    for (int i = 0; rc == TS_OK && i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", o.dir, names[i]);
        int iw, ih;
        C = vae->cfg.in_channels;
        rc = C == 3 ? ts_png_read_rgb(path, &px, &iw, &ih, err, sizeof err)
             : C == 1
                 ? ts_png_read_gray(path, &px, &iw, &ih, err, sizeof err)
                 : ts_fail(err, sizeof err, TS_ENOTSUP,
                           "%s takes images of %d channels: only 1 or 3 come from a PNG", o.vae, C);
        if (rc != TS_OK)
            break;
        if (i == 0) {
            int f = ts_vae_factor(&vae->cfg);
            H = ih, W = iw, L = vae->cfg.latent_channels, h = H / f, w = W / f;
            if (H % f || W % f || h != w) {
                rc = ts_fail(err, sizeof err, TS_EINVAL,
                             "%s is %d×%d: the images must be square with a side that is a "
                             "multiple of %d (the VAE's factor)",
                             path, W, H, f);
                break;
            }
            size_t per = (size_t)L * h * w;
            lat = malloc((size_t)n * per * sizeof *lat);
            x = malloc((size_t)C * H * W * sizeof *x);
            if (!lat || !x ||
                ts_tensor_wrap(&timg, x, TS_F32, TS_CPU, 4, TS_SHAPE(1, C, H, W)) != TS_OK ||
                ts_tensor_alloc(&tvar, TS_F32, TS_CPU, 4, TS_SHAPE(1, L, h, w)) != TS_OK) {
                rc = ts_fail(err, sizeof err, TS_ENOMEM, "no memory for %d latents", n);
                break;
            }
        } else if (ih != H || iw != W) {
            rc = ts_fail(err, sizeof err, TS_EINVAL, "%s is %d×%d, the first image %d×%d", path, iw,
                         ih, W, H);
            break;
        }
        size_t per = (size_t)L * h * w;
        to_chw(px, C, H, W, x);
        free(px), px = NULL;
        rc = ts_tensor_wrap(&tlat, lat + (size_t)i * per, TS_F32, TS_CPU, 4, TS_SHAPE(1, L, h, w));
        if (rc == TS_OK)
            rc = ts_vae_encode(vae, &eng, &tlat, o.sample ? &tvar : NULL, &timg, err, sizeof err);
        if (rc == TS_OK && o.sample) { /* z = (mean + e^(logvar/2)·ε) · scaling_factor */
            const float *lv = tvar.data;
            float *z = lat + (size_t)i * per, sf = vae->cfg.scaling_factor;
            for (size_t k = 0; k < per; k++)
                z[k] += sf * expf(0.5f * lv[k]) *
                        ts_rng_normal_at(o.seed, (uint64_t)i * per + (uint64_t)k);
        }
        for (size_t k = 0; rc == TS_OK && k < per; k++)
            if (!isfinite(lat[(size_t)i * per + k]))
                rc = ts_fail(err, sizeof err, TS_ENONFINITE, "%s: its latent is not finite", path);
        if (rc == TS_OK && !o.quiet && (i + 1 == n || (i + 1) % 10 == 0))
            fprintf(stderr, PROG ": %d/%d images, %.1f s\n", i + 1, n, ts_now_s() - t0);
    }
    if (rc == TS_OK) {
        char sf[32], hs[16], ws[16], cs[16], seed[32];
        snprintf(sf, sizeof sf, "%.9g", (double)vae->cfg.scaling_factor);
        snprintf(hs, sizeof hs, "%d", H), snprintf(ws, sizeof ws, "%d", W);
        snprintf(cs, sizeof cs, "%d", C);
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)o.seed);
        const char *base = strrchr(o.vae, '/') ? strrchr(o.vae, '/') + 1 : o.vae;
        char space[TS_LATENT_SPACE_HEX];
        const char *meta[] = {"vae",
                              base,
                              "scaling_factor",
                              sf,
                              "image_height",
                              hs,
                              "image_width",
                              ws,
                              "image_channels",
                              cs,
                              "mode",
                              o.sample ? "sample" : "mean",
                              "seed",
                              seed,
                              "vae_precision",
                              ts_precision_name(o.precision),
                              TS_LATENT_SPACE_KEY,
                              space};
        rc = ts_latent_space_of(o.vae, space, err, sizeof err);
        if (rc == TS_OK)
            rc = ts_latents_save(o.out, lat, labels, n, L, h, w, classes, meta, 9, err, sizeof err);
    }
    if (rc == TS_OK) {
        fprintf(stderr, PROG ": %d images of %d×%d → latents (%d, %d, %d), %d class%s, %s → %s\n",
                n, W, H, L, h, w, classes, classes == 1 ? "" : "es", o.sample ? "sampled" : "means",
                o.out);
        if (o.json)
            ts_json_print(json_pack("{s:b, s:i, s:[i,i,i], s:[i,i,i], s:i, s:s, s:f, s:s}", "done",
                                    1, "images", n, "image_shape", C, H, W, "latent_shape", L, h, w,
                                    "num_classes", classes, "mode", o.sample ? "sample" : "mean",
                                    "seconds", ts_now_s() - t0, "out", o.out));
    } else {
        ts_args_fail(PROG, err, rc);
    }
    ts_tensor_free(&tvar);
    free(px), free(x), free(lat), free(labels);
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    ts_vae_free(vae);
    if (have_eng)
        ts_engine_free(&eng);
    return rc == TS_OK ? 0 : 1;
}
