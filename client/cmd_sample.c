/*
 * cmd_sample.c — `tessera sample`: draw images from one expert and write a PNG grid.
 *
 * Sample i starts from the noise stream seed + i, so any sample can be regenerated alone and the
 * batch size never changes a result. Without --class the labels cycle through the classes (one
 * grid row per class with --n 100 and 10 classes); --class null samples unconditionally.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "client/args.h"
#include "client/commands.h"
#include "model/dit_io.h"
#include "model/png.h"
#include "model/sampler.h"
#include "store/weights.h"

#define SAMPLE_CHUNK 64 /* samples per model call (twice that with CFG) */

typedef struct {
    int tty;
    int done, total; /* steps across all chunks */
} progress_t;

static int on_step(void *ctx, int step, int steps) {
    progress_t *p = ctx;
    p->done++;
    if (p->tty)
        fprintf(stderr, "\rsampling: step %d/%d (total %d/%d)   ", step, steps, p->done, p->total);
    return 0;
}

/* --weights is a file, or else (when it is no file and looks like hex) a weights hash or a unique
 * prefix of one in the store at data_dir. */
static int open_weights(ts_dit_t *m, const char *weights, const char *data_dir, ts_engine_t *e,
                        int max_batch, char *err, size_t errlen) {
    size_t n = strlen(weights);
    int hex = n >= TS_HASH_MIN_PREFIX && n < TS_HASH_HEX && access(weights, F_OK) != 0;
    for (size_t i = 0; hex && i < n; i++)
        hex = strchr("0123456789abcdefABCDEF", weights[i]) != NULL;
    if (!hex)
        return ts_dit_open(m, weights, e, max_batch, 0, err, errlen);
    ts_store_t *s = NULL;
    ts_store_opts_t so = {.dir = data_dir};
    ts_hash_t h;
    int rc = ts_store_open(&s, &so, err, errlen);
    if (rc == TS_OK && (rc = ts_weights_resolve(s, weights, &h, err, errlen)) == TS_OK)
        rc = ts_weights_open_dit(s, &h, e, max_batch, 0, m, err, errlen);
    ts_store_close(s);
    return rc;
}

int ts_cmd_sample(int argc, char **argv) {
    const char *weights = NULL, *out = NULL, *sampler = "heun", *cls = NULL, *out_tensor = NULL;
    const char *data_dir = NULL;
    int n = 64, steps = 30, threads = 0, cols = 0, json = 0;
    float cfg = 1.0f;
    uint64_t seed = 0;
    ts_arg_t args[] = {
        {"weights", TS_ARG_STRING, &weights, "FILE|HASH",
         "expert weights: a .safetensors file, or a weights hash (prefix) in the store", 0, 0, 1},
        {"data-dir", TS_ARG_STRING, &data_dir, "DIR",
         "the store for --weights HASH (default $XDG_DATA_HOME/tessera)"},
        {"n", TS_ARG_INT, &n, "N", "number of samples (default 64)", 1, 100000},
        {"steps", TS_ARG_INT, &steps, "S", "integration steps (default 30)", 1, 10000},
        {"sampler", TS_ARG_STRING, &sampler, "NAME", "euler or heun (default heun)"},
        {"cfg", TS_ARG_FLOAT, &cfg, "S", "classifier-free guidance scale, 1 = off (default 1)", 0,
         100},
        {"class", TS_ARG_STRING, &cls, "C",
         "class label, or 'null' (default: cycle through classes)"},
        {"seed", TS_ARG_U64, &seed, "S", "sample i uses noise stream seed+i (default 0)"},
        {"threads", TS_ARG_INT, &threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"cols", TS_ARG_INT, &cols, "N", "grid columns (default: square)", 0, 10000},
        {"out", TS_ARG_STRING, &out, "FILE", "PNG grid to write", 0, 0, 1},
        {"out-tensor", TS_ARG_STRING, &out_tensor, "FILE",
         "also write the samples as safetensors 'x'"},
        {"json", TS_ARG_FLAG, &json, NULL, "print a JSON summary on stdout"},
    };
    int pr = ts_args_parse("tessera sample", "Generate images from one expert and write a grid.",
                           args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr)
        return pr == 1 ? 0 : 2;
    ts_sampler_opts_t so = {.steps = steps};
    if (ts_sampler_parse(sampler, &so.kind) != TS_OK) {
        fprintf(stderr, "tessera sample: --sampler %s: must be euler or heun\n", sampler);
        return 2;
    }
    char err[512] = "";
    ts_engine_t eng = {0};
    ts_dit_t model = {0};
    ts_engine_opts_t eo = {TS_CPU, threads, 0};
    int chunk = n < SAMPLE_CHUNK ? n : SAMPLE_CHUNK;
    int rc = ts_engine_init(&eng, &eo);
    if (rc == TS_OK)
        rc = open_weights(&model, weights, data_dir, &eng, cfg != 1.0f ? 2 * chunk : chunk, err,
                          sizeof err);
    if (rc != TS_OK) {
        fprintf(stderr, "tessera sample: %s%s%s\n", err, *err ? ": " : "", ts_strerror(rc));
        ts_engine_free(&eng);
        return 1;
    }
    const ts_dit_config_t *c = &model.cfg;
    int label = -1;
    if (cls && strcmp(cls, "null") == 0) {
        label = c->num_classes;
    } else if (cls) {
        char *end;
        long v = strtol(cls, &end, 10);
        if (*end || v < 0 || v >= c->num_classes) {
            fprintf(stderr, "tessera sample: --class %s: must be 0..%d or 'null'\n", cls,
                    c->num_classes - 1);
            ts_dit_free(&model);
            ts_engine_free(&eng);
            return 2;
        }
        label = (int)v;
    }
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    float *images = malloc((size_t)(n * chw) * sizeof(float));
    int32_t *labels = malloc((size_t)n * sizeof(int32_t));
    uint64_t *seeds = malloc((size_t)n * sizeof(uint64_t));
    if (!images || !labels || !seeds)
        rc = TS_ENOMEM;
    for (int i = 0; i < n && rc == TS_OK; i++) {
        labels[i] = label >= 0 ? label : i % c->num_classes;
        seeds[i] = seed + (uint64_t)i;
    }
    progress_t prog = {isatty(STDERR_FILENO), 0, steps * ((n + chunk - 1) / chunk)};
    double t0 = ts_now_s();
    int64_t evals = 0;
    for (int start = 0; start < n && rc == TS_OK; start += chunk) {
        int m = n - start < chunk ? n - start : chunk;
        ts_tensor_t x, scratch[3] = {0};
        ts_dit_velocity_ctx_t vc;
        rc = ts_tensor_alloc(&x, TS_F32, eng.device, 4,
                             TS_SHAPE(m, c->in_channels, c->input_size, c->input_size));
        for (int i = 0; i < 3 && rc == TS_OK; i++)
            rc = ts_tensor_alloc(&scratch[i], TS_F32, eng.device, 4, x.shape);
        if (rc == TS_OK)
            rc = ts_sampler_noise(&eng, &x, seeds + start);
        if (rc == TS_OK &&
            (rc = ts_dit_velocity_init(&vc, &model, labels + start, m, cfg)) == TS_OK) {
            rc = ts_sampler_run(&eng, &so, &x, scratch, ts_dit_velocity, &vc, on_step, &prog);
            evals = vc.evals; /* per sample: the same for every chunk */
            ts_dit_velocity_free(&vc);
        }
        if (rc == TS_OK) {
            ts_tensor_t host;
            rc = ts_tensor_wrap(&host, images + start * chw, TS_F32, TS_CPU, 4, x.shape);
            if (rc == TS_OK)
                rc = ts_tensor_copy(&host, &x);
        }
        for (int i = 0; i < 3; i++)
            ts_tensor_free(&scratch[i]);
        ts_tensor_free(&x);
    }
    double secs = ts_now_s() - t0;
    if (prog.tty)
        fprintf(stderr, "\n");
    if (rc == TS_OK)
        rc = ts_png_write_grid(out, images, n, c->in_channels, c->input_size, c->input_size, cols,
                               2, err, sizeof err);
    if (rc == TS_OK && out_tensor) {
        ts_st_entry_t e = {.name = "x",
                           .dtype = TS_ST_F32,
                           .ndim = 4,
                           .shape = {n, c->in_channels, c->input_size, c->input_size},
                           .data = images};
        rc = ts_st_write(out_tensor, &e, 1, NULL, 0, err, sizeof err);
    }
    if (rc != TS_OK) {
        fprintf(stderr, "tessera sample: %s%s%s\n", err, *err ? ": " : "", ts_strerror(rc));
    } else {
        fprintf(stderr,
                "%d samples, %d %s steps, cfg %g, %.2f s (%.1f samples/s, %.0f model "
                "evaluations per sample) → %s\n",
                n, steps, sampler, cfg, secs, n / secs, (double)evals, out);
        if (json) {
            json_t *j = json_pack("{s:i, s:i, s:s, s:f, s:f, s:f, s:s}", "n", n, "steps", steps,
                                  "sampler", sampler, "cfg", (double)cfg, "seconds", secs,
                                  "evals_per_sample", (double)evals, "out", out);
            if (j) {
                json_dumpf(j, stdout, JSON_COMPACT);
                printf("\n");
                json_decref(j);
            }
        }
    }
    free(images);
    free(labels);
    free(seeds);
    ts_dit_free(&model);
    ts_engine_free(&eng);
    return rc == TS_OK ? 0 : 1;
}
