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
#include "client/cli.h"
#include "client/local.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "model/dit_io.h"
#include "model/latents.h"
#include "model/fmnist.h"
#include "model/png.h"
#include "model/safetensors.h"
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
                        int max_batch, char space[TS_LATENT_SPACE_HEX], char *err, size_t errlen) {
    space[0] = '\0';
    size_t n = strlen(weights);
    int hex = n >= TS_HASH_MIN_PREFIX && n < TS_HASH_HEX && access(weights, F_OK) != 0;
    for (size_t i = 0; hex && i < n; i++)
        hex = strchr("0123456789abcdefABCDEF", weights[i]) != NULL;
    if (!hex) { /* a velocity expert only: the one model's output is the velocity as it is */
        ts_st_file_t f;
        int rc = ts_st_read(weights, &f, err, errlen);
        if (rc != TS_OK)
            return rc;
        const char *obj = ts_st_meta(&f, "objective");
        if (obj && strcmp(obj, "velocity") != 0) {
            ts_set_err(err, errlen,
                       "%s is a DDPM expert (objective %s): sample it with `tessera generate "
                       "--local DIR`, which converts its answers",
                       weights, obj);
            rc = TS_EINVAL;
        }
        if (rc == TS_OK && ts_latent_space_meta(&f, space) < 0)
            rc = ts_fail(err, errlen, TS_ECORRUPT, "%s: metadata %s is not 64 hex digits", weights,
                         TS_LATENT_SPACE_KEY);
        if (rc == TS_OK)
            rc = ts_dit_open_file(m, &f, e, max_batch, 0, err, errlen);
        ts_st_free(&f);
        return rc;
    }
    ts_store_t *s = NULL;
    ts_store_opts_t so = {.dir = data_dir};
    ts_hash_t h;
    int rc = ts_store_open(&s, &so, err, errlen);
    if (rc == TS_OK && (rc = ts_weights_resolve(s, weights, &h, err, errlen)) == TS_OK)
        rc = ts_weights_open_dit(s, &h, e, max_batch, 0, m, err, errlen);
    ts_store_close(s);
    return rc;
}

/* ---- the verb: parse → validate → run → print ---------------------------------------------- */

#define PROG "tessera sample"

typedef struct {
    const char *weights, *out, *sampler, *cls, *out_tensor, *data_dir, *vae;
    int n, steps, threads, cols, json;
    ts_device_spec_t device;  /* --device (zeroed: the CPU) */
    ts_precision_t precision; /* --precision (zeroed: f32) */
    const char *attention;    /* --attention (NULL: the model's default) */
    float cfg;
    uint64_t seed;
} sample_opts_t;

/* Everything one run opens and allocates (sample_free releases it all). */
typedef struct {
    sample_opts_t o;
    ts_sampler_opts_t so;
    ts_engine_t eng;
    ts_dit_t model;
    int chunk, label;
    int64_t chw;
    float *images; /* (n, C, H, W) */
    int32_t *labels;
    uint64_t *seeds;
    int64_t evals; /* model evaluations per sample */
    double secs;
    char space[TS_LATENT_SPACE_HEX]; /* the expert file's latent space ("": pixels or unnamed) */
    char err[512];
} sample_run_t;

/* The options from the command line: TS_ARGS_RUN, or the exit code (ts_args_parse). */
static int parse_opts(int argc, char **argv, sample_opts_t *o) {
    *o = (sample_opts_t){.sampler = "heun", .n = 64, .steps = 30, .cfg = 1.0f};
    o->device = (ts_device_spec_t){.automatic = 1}; /* as tesserad: a GPU when there is one */
    ts_arg_t args[] = {
        {"weights", TS_ARG_STRING, &o->weights, "FILE|HASH",
         "expert weights: a .safetensors file, or a weights hash (prefix) in the store", 0, 0, 1},
        {"data-dir", TS_ARG_STRING, &o->data_dir, "DIR",
         "the store for --weights HASH (default $XDG_DATA_HOME/tessera)"},
        {"n", TS_ARG_INT, &o->n, "N", "number of samples (default 64)", 1, 100000},
        {"steps", TS_ARG_INT, &o->steps, "S", "integration steps (default 30)", 1, 10000},
        {"sampler", TS_ARG_STRING, &o->sampler, "NAME",
         "euler, heun, ddim or ddpm (DDPM-schedule grids: DiT's linear beta over 1000 steps; "
         "default heun)"},
        {"cfg", TS_ARG_FLOAT, &o->cfg, "S", "classifier-free guidance scale, 1 = off (default 1)",
         0, 100},
        {"class", TS_ARG_STRING, &o->cls, "C",
         "class label or name (" TS_FMNIST_CLASS_LIST "), or 'null' (default: cycle through the "
         "classes)"},
        {"seed", TS_ARG_U64, &o->seed, "S", "sample i uses noise stream seed+i (default 0)"},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"device", TS_ARG_DEVICE, &o->device, "NAME",
         "where to compute: " TS_DEVICE_SPEC_HELP " (default auto)"},
        {"precision", TS_ARG_PRECISION, &o->precision, "P",
         "matrix products (the model's, and the VAE's) in " TS_PRECISION_HELP},
        {"attention", TS_ARG_STRING, &o->attention, "A",
         "the model's attention: " TS_CLI_ATTENTION_HELP},
        {"cols", TS_ARG_INT, &o->cols, "N", "grid columns (default: square)", 0, 10000},
        {"out", TS_ARG_STRING, &o->out, "FILE", "PNG grid to write", 0, 0, 1},
        {"out-tensor", TS_ARG_STRING, &o->out_tensor, "FILE",
         "also write the samples as safetensors 'x' (a latent expert's: the latents)"},
        {"vae", TS_ARG_STRING, &o->vae, "FILE",
         "a latent expert's VAE (`tessera encode`'s): each sample decoded into an image on the "
         "CPU, the grid in RGB"},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print a JSON summary on stdout"},
    };
    return ts_args_parse(
        PROG,
        "Generate images from one expert and write a grid.\nexample: tessera sample "
        "--weights experts/demo/expert-0.safetensors --n 16 --out grid.png",
        args, (int)(sizeof args / sizeof args[0]), argc, argv);
}

/* The sampler: 0, or 2 with the message printed. */
static int validate(sample_run_t *r) {
    r->so = (ts_sampler_opts_t){.steps = r->o.steps};
    if (ts_sampler_parse(r->o.sampler, &r->so.kind) != TS_OK)
        fprintf(stderr, PROG ": --sampler %s: must be euler, heun, ddim or ddpm\n", r->o.sampler);
    else if (r->so.kind >= TS_SAMPLER_DDIM && r->o.steps > 1000)
        fprintf(stderr, PROG ": --sampler %s takes at most 1000 steps (the schedule's)\n",
                r->o.sampler);
    else if (ts_cli_attention_ok(r->o.attention, PROG))
        return 0;
    return 2;
}

/* The engine and the model; then --class, which needs the model's classes: 0, or the exit code
 * (1, 2) with the message printed. */
static int open_model(sample_run_t *r) {
    const sample_opts_t *o = &r->o;
    r->chunk = o->n < SAMPLE_CHUNK ? o->n : SAMPLE_CHUNK;
    int rc = ts_cli_engine(&r->eng, &o->device, o->threads, PROG, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc =
            open_weights(&r->model, o->weights, o->data_dir, &r->eng,
                         o->cfg != 1.0f ? 2 * r->chunk : r->chunk, r->space, r->err, sizeof r->err);
    if (rc == TS_OK && o->vae) /* before sampling: a VAE of another space is refused now */
        rc = ts_cli_vae_check(o->vae, r->space, o->weights, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_cli_precision(&r->model, 1, o->precision, PROG, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_cli_attention(&r->model, 1, o->attention, PROG, r->err, sizeof r->err);
    if (rc != TS_OK)
        return ts_args_fail(PROG, r->err, rc);
    const ts_dit_config_t *c = &r->model.cfg;
    if (ts_local_parse_class(o->cls, c->num_classes, &r->label, r->err, sizeof r->err) != TS_OK) {
        fprintf(stderr, PROG ": %s\n", r->err);
        return 2;
    }
    r->chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    return 0;
}

/* Samples [start, start + m) into r->images. */
static int sample_chunk(sample_run_t *r, int start, int m, progress_t *prog) {
    const ts_dit_config_t *c = &r->model.cfg;
    ts_tensor_t x, scratch[3] = {0};
    ts_dit_velocity_ctx_t vc;
    int rc = ts_tensor_alloc(&x, TS_F32, r->eng.device, 4,
                             TS_SHAPE(m, c->in_channels, c->input_size, c->input_size));
    for (int i = 0; i < 3 && rc == TS_OK; i++)
        rc = ts_tensor_alloc(&scratch[i], TS_F32, r->eng.device, 4, x.shape);
    if (rc == TS_OK)
        rc = ts_sampler_noise(&r->eng, &x, r->seeds + start);
    if (rc == TS_OK &&
        (rc = ts_dit_velocity_init(&vc, &r->model, r->labels + start, m, r->o.cfg)) == TS_OK) {
        ts_sampler_opts_t so = r->so;
        so.seeds = r->seeds + start; /* DDPM's draws: each sample's own stream */
        rc = ts_sampler_run(&r->eng, &so, &x, scratch, ts_dit_velocity, &vc, on_step, prog);
        r->evals = vc.evals; /* per sample: the same for every chunk */
        ts_dit_velocity_free(&vc);
    }
    if (rc == TS_OK) {
        ts_tensor_t host;
        rc = ts_tensor_wrap(&host, r->images + start * r->chw, TS_F32, TS_CPU, 4, x.shape);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&host, &x);
    }
    for (int i = 0; i < 3; i++)
        ts_tensor_free(&scratch[i]);
    ts_tensor_free(&x);
    return rc;
}

/* The samples' labels and seeds, the samples chunk by chunk, then the grid and --out-tensor. */
static int run(sample_run_t *r) {
    const sample_opts_t *o = &r->o;
    const ts_dit_config_t *c = &r->model.cfg;
    int n = o->n, rc = TS_OK;
    r->images = malloc((size_t)(n * r->chw) * sizeof(float));
    r->labels = malloc((size_t)n * sizeof(int32_t));
    r->seeds = malloc((size_t)n * sizeof(uint64_t));
    if (!r->images || !r->labels || !r->seeds)
        rc = TS_ENOMEM;
    for (int i = 0; i < n && rc == TS_OK; i++) {
        r->labels[i] = r->label >= 0 ? r->label : i % c->num_classes;
        r->seeds[i] = o->seed + (uint64_t)i;
    }
    progress_t prog = {isatty(STDERR_FILENO), 0, o->steps * ((n + r->chunk - 1) / r->chunk)};
    double t0 = ts_now_s();
    for (int start = 0; start < n && rc == TS_OK; start += r->chunk)
        rc = sample_chunk(r, start, n - start < r->chunk ? n - start : r->chunk, &prog);
    if (rc == TS_ENONFINITE)
        snprintf(r->err, sizeof r->err,
                 "the samples are not finite (NaN or Inf): the model's forward overflowed%s",
                 r->model.precision == TS_PREC_F16
                     ? " at f16 (an activation past ±65504): use --precision bf16 or f32"
                     : "");
    r->secs = ts_now_s() - t0;
    if (prog.tty)
        fprintf(stderr, "\n");
    float *decoded = NULL;
    int C = c->in_channels, side = c->input_size;
    if (rc == TS_OK && o->vae)
        rc = ts_cli_vae_decode(o->vae, &r->eng, o->precision, r->images, n, c->in_channels,
                               c->input_size, o->weights, &decoded, &C, &side, r->err,
                               sizeof r->err);
    if (rc == TS_OK)
        rc = ts_png_write_grid(o->out, decoded ? decoded : r->images, n, C, side, side, o->cols, 2,
                               r->err, sizeof r->err);
    free(decoded);
    if (rc == TS_OK && o->out_tensor) {
        ts_st_entry_t e = {.name = "x",
                           .dtype = TS_ST_F32,
                           .ndim = 4,
                           .shape = {n, c->in_channels, c->input_size, c->input_size},
                           .data = r->images};
        rc = ts_st_write(o->out_tensor, &e, 1, NULL, 0, r->err, sizeof r->err);
    }
    return rc;
}

/* The summary on stderr, and with --json as one JSON object on stdout. */
static void print_summary(const sample_run_t *r) {
    const sample_opts_t *o = &r->o;
    fprintf(stderr,
            "%d samples, %d %s steps, cfg %g, %.2f s (%.1f samples/s, %.0f model "
            "evaluations per sample) → %s\n",
            o->n, o->steps, o->sampler, o->cfg, r->secs, o->n / r->secs, (double)r->evals, o->out);
    if (o->json)
        ts_json_print(json_pack("{s:i, s:i, s:s, s:f, s:f, s:f, s:s}", "n", o->n, "steps", o->steps,
                                "sampler", o->sampler, "cfg", (double)o->cfg, "seconds", r->secs,
                                "evals_per_sample", (double)r->evals, "out", o->out));
}

static void sample_free(sample_run_t *r) {
    free(r->images);
    free(r->labels);
    free(r->seeds);
    ts_dit_free(&r->model);
    ts_engine_free(&r->eng);
}

int ts_cmd_sample(int argc, char **argv) {
    sample_run_t r;
    memset(&r, 0, sizeof r);
    int pr = parse_opts(argc, argv, &r.o);
    if (pr != TS_ARGS_RUN)
        return pr;
    int code = validate(&r);
    if (code == 0)
        code = open_model(&r);
    if (code == 0) {
        int rc = run(&r);
        if (rc != TS_OK)
            code = ts_args_fail(PROG, r.err, rc);
        else
            print_summary(&r);
    }
    sample_free(&r);
    return code;
}
