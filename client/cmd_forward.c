/*
 * cmd_forward.c — `tessera forward`: one forward pass on tensors from a file, for parity checks
 * and debugging. Inputs: x (B, C, H, W) F32, t (B) F32 in [0, 1], y (B) I64 or I32 with the null
 * class = num_classes. Output: v (B, C, H, W) F32.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "client/args.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "model/dit_io.h"

/* Finds tensor name in f with the expected element count, or says what is wrong. */
static const ts_st_tensor_t *input(const ts_st_file_t *f, const char *name, int64_t numel,
                                   const char *path, char *err, size_t errlen) {
    const ts_st_tensor_t *t = ts_st_find(f, name);
    if (!t)
        snprintf(err, errlen, "%s: no tensor '%s'", path, name);
    else if (t->numel != numel)
        snprintf(err, errlen, "%s: tensor '%s' has %lld elements, the model needs %lld", path, name,
                 (long long)t->numel, (long long)numel);
    else
        return t;
    return NULL;
}

/* ---- the verb: parse → run → print ----------------------------------------------------------- */

#define PROG "tessera forward"

typedef struct {
    const char *weights, *inputs, *out;
    int threads, json;
    ts_precision_t precision; /* --precision (zeroed: f32) */
} fwd_opts_t;

/* Everything one run opens and allocates (fwd_free releases it all). */
typedef struct {
    fwd_opts_t o;
    ts_st_file_t in;
    ts_engine_t eng;
    ts_dit_t model;
    const ts_st_tensor_t *tx, *tt, *ty; /* in the input file */
    int B;
    int64_t chw;
    float *x, *t;
    int64_t *y64;
    int32_t *y;
    char err[512];
} fwd_run_t;

/* The options from the command line: TS_ARGS_RUN, or the exit code (ts_args_parse). */
static int parse_opts(int argc, char **argv, fwd_opts_t *o) {
    *o = (fwd_opts_t){0};
    ts_arg_t args[] = {
        {"weights", TS_ARG_STRING, &o->weights, "FILE", "expert weights (.safetensors)", 0, 0, 1},
        {"inputs", TS_ARG_STRING, &o->inputs, "FILE", "safetensors with x, t, y", 0, 0, 1},
        {"out", TS_ARG_STRING, &o->out, "FILE",
         "safetensors to write v into (and sigma, for a model with a learned σ)", 0, 0, 1},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"precision", TS_ARG_PRECISION, &o->precision, "P",
         "the products' precision: f32 (default), bf16 or f16"},
        {"json", TS_ARG_FLAG, &o->json, NULL,
         "print one JSON object (out, batch, shape of v, seconds) on stdout"},
    };
    return ts_args_parse(PROG,
                         "One forward pass of an expert on tensors from a file.\nexample: tessera "
                         "forward --weights expert-0.safetensors --inputs x.safetensors --out "
                         "v.safetensors",
                         args, (int)(sizeof args / sizeof args[0]), argc, argv);
}

/* The input file, then the engine and the model for its batch, then its tensors t and y. */
static int open_inputs(fwd_run_t *r) {
    const fwd_opts_t *o = &r->o;
    char *err = r->err;
    size_t errlen = sizeof r->err;
    int rc = ts_st_read(o->inputs, &r->in, err, errlen);
    r->tx = rc ? NULL : ts_st_find(&r->in, "x");
    if (rc == TS_OK && (!r->tx || r->tx->ndim != 4)) {
        snprintf(err, errlen, "%s: needs a 4-D tensor 'x' (B, C, H, W)", o->inputs);
        rc = TS_EINVAL;
    }
    r->B = rc ? 0 : (int)r->tx->shape[0];
    ts_engine_opts_t eo = {TS_CPU, o->threads, 0};
    if (rc == TS_OK)
        rc = ts_engine_init(&r->eng, &eo);
    if (rc == TS_OK)
        rc = ts_dit_open(&r->model, o->weights, &r->eng, r->B > 0 ? r->B : 1, 0, err, errlen);
    if (rc == TS_OK)
        rc = ts_cli_precision(&r->model, 1, o->precision, NULL, err, errlen);
    const ts_dit_config_t *c = &r->model.cfg;
    r->chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    int B = r->B;
    if (rc == TS_OK && (!input(&r->in, "x", B * r->chw, o->inputs, err, errlen) ||
                        !(r->tt = input(&r->in, "t", B, o->inputs, err, errlen)) ||
                        !(r->ty = input(&r->in, "y", B, o->inputs, err, errlen))))
        rc = TS_EINVAL;
    return rc;
}

/* x, t and y in host memory, the labels checked against the model's classes. */
static int load_inputs(fwd_run_t *r) {
    int B = r->B, num_classes = r->model.cfg.num_classes;
    r->x = malloc((size_t)(B * r->chw) * sizeof *r->x);
    r->t = malloc((size_t)B * sizeof *r->t);
    r->y64 = malloc((size_t)B * sizeof *r->y64);
    r->y = malloc((size_t)B * sizeof *r->y);
    int rc = (r->x && r->t && r->y64 && r->y) ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_st_to_f32(r->tx, r->x, B * r->chw);
    if (rc == TS_OK)
        rc = ts_st_to_f32(r->tt, r->t, B);
    if (rc == TS_OK)
        rc = ts_st_to_i64(r->ty, r->y64, B);
    for (int b = 0; b < B && rc == TS_OK; b++) {
        if (r->y64[b] < 0 || r->y64[b] > num_classes) {
            snprintf(r->err, sizeof r->err, "%s: y[%d] = %lld is outside 0..%d", r->o.inputs, b,
                     (long long)r->y64[b], num_classes);
            rc = TS_ERANGE;
        }
        r->y[b] = (int32_t)(rc == TS_OK ? r->y64[b] : 0);
    }
    return rc;
}

/* The forward pass on finite inputs, and v written to --out. */
static int run(fwd_run_t *r) {
    const ts_dit_config_t *c = &r->model.cfg;
    int B = r->B;
    ts_tensor_t xt = {0}, tt = {0}, v;
    int rc = ts_tensor_wrap(&xt, r->x, TS_F32, TS_CPU, 4,
                            TS_SHAPE(B, c->in_channels, c->input_size, c->input_size));
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&tt, r->t, TS_F32, TS_CPU, 1, TS_SHAPE(B));
    if (rc == TS_OK && (ts_check_finite(&r->eng, &xt) || ts_check_finite(&r->eng, &tt))) {
        snprintf(r->err, sizeof r->err, "%s: x or t holds NaN or Inf", r->o.inputs);
        rc = TS_ENONFINITE;
    }
    double t0 = ts_now_s();
    if (rc == TS_OK)
        rc = ts_dit_forward(&r->model, &xt, &tt, r->y, B, &v);
    double secs = ts_now_s() - t0;
    ts_tensor_t sigma = {0}; /* a learned-σ model's other half (model/dit.h) */
    if (rc == TS_OK && c->learn_sigma)
        rc = ts_dit_sigma(&r->model, B, &sigma);
    if (rc == TS_OK) {
        ts_st_entry_t e[2] = {{.name = "v",
                               .dtype = TS_ST_F32,
                               .ndim = 4,
                               .shape = {B, c->in_channels, c->input_size, c->input_size},
                               .data = v.data},
                              {.name = "sigma",
                               .dtype = TS_ST_F32,
                               .ndim = 4,
                               .shape = {B, c->in_channels, c->input_size, c->input_size},
                               .data = sigma.data}};
        rc = ts_st_write(r->o.out, e, c->learn_sigma ? 2 : 1, NULL, 0, r->err, sizeof r->err);
    }
    if (rc == TS_OK && r->o.json)
        ts_json_print(json_pack("{s:s, s:i, s:[i, i, i, i], s:f}", "out", r->o.out, "batch", B,
                                "shape", B, c->in_channels, c->input_size, c->input_size, "seconds",
                                secs));
    else if (rc == TS_OK)
        fprintf(stderr, "v (%d×%d×%d×%d) → %s in %.3f s\n", B, c->in_channels, c->input_size,
                c->input_size, r->o.out, secs);
    return rc;
}

static void fwd_free(fwd_run_t *r) {
    free(r->x);
    free(r->t);
    free(r->y64);
    free(r->y);
    ts_dit_free(&r->model);
    ts_engine_free(&r->eng);
    ts_st_free(&r->in);
}

int ts_cmd_forward(int argc, char **argv) {
    fwd_run_t r;
    memset(&r, 0, sizeof r);
    int pr = parse_opts(argc, argv, &r.o);
    if (pr != TS_ARGS_RUN)
        return pr;
    int rc = open_inputs(&r);
    if (rc == TS_OK)
        rc = load_inputs(&r);
    if (rc == TS_OK)
        rc = run(&r);
    if (rc != TS_OK)
        ts_args_fail(PROG, r.err, rc);
    fwd_free(&r);
    return rc == TS_OK ? 0 : 1;
}
