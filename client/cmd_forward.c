/*
 * cmd_forward.c — `tessera forward`: one forward pass on tensors from a file, for parity checks
 * and debugging. Inputs: x (B, C, H, W) F32, t (B) F32 in [0, 1], y (B) I64 or I32 with the null
 * class = num_classes. Output: v (B, C, H, W) F32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/args.h"
#include "client/commands.h"
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

int ts_cmd_forward(int argc, char **argv) {
    const char *weights = NULL, *inputs = NULL, *out = NULL;
    int threads = 0;
    ts_arg_t args[] = {
        {"weights", TS_ARG_STRING, &weights, "FILE", "expert weights (.safetensors)", 0, 0, 1},
        {"inputs", TS_ARG_STRING, &inputs, "FILE", "safetensors with x, t, y", 0, 0, 1},
        {"out", TS_ARG_STRING, &out, "FILE", "safetensors to write v into", 0, 0, 1},
        {"threads", TS_ARG_INT, &threads, "N", "compute threads (default: all cores)", 0, 1024},
    };
    int pr =
        ts_args_parse("tessera forward", "One forward pass of an expert on tensors from a file.",
                      args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr)
        return pr == 1 ? 0 : 2;
    char err[512] = "";
    ts_st_file_t in = {0};
    ts_engine_t eng = {0};
    ts_dit_t model = {0};
    float *x = NULL, *t = NULL;
    int64_t *y64 = NULL;
    int32_t *y = NULL;
    ts_tensor_t xt = {0}, tt = {0};
    int rc = ts_st_read(inputs, &in, err, sizeof err);
    const ts_st_tensor_t *tx = rc ? NULL : ts_st_find(&in, "x");
    if (rc == TS_OK && (!tx || tx->ndim != 4)) {
        snprintf(err, sizeof err, "%s: needs a 4-D tensor 'x' (B, C, H, W)", inputs);
        rc = TS_EINVAL;
    }
    int B = rc ? 0 : (int)tx->shape[0];
    ts_engine_opts_t eo = {TS_CPU, threads, 0};
    if (rc == TS_OK)
        rc = ts_engine_init(&eng, &eo);
    if (rc == TS_OK)
        rc = ts_dit_open(&model, weights, &eng, B > 0 ? B : 1, 0, err, sizeof err);
    const ts_dit_config_t *c = &model.cfg;
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    const ts_st_tensor_t *ttt = NULL, *ty = NULL;
    if (rc == TS_OK && (!input(&in, "x", B * chw, inputs, err, sizeof err) ||
                        !(ttt = input(&in, "t", B, inputs, err, sizeof err)) ||
                        !(ty = input(&in, "y", B, inputs, err, sizeof err))))
        rc = TS_EINVAL;
    if (rc == TS_OK) {
        x = malloc((size_t)(B * chw) * sizeof *x);
        t = malloc((size_t)B * sizeof *t);
        y64 = malloc((size_t)B * sizeof *y64);
        y = malloc((size_t)B * sizeof *y);
        rc = (x && t && y64 && y) ? TS_OK : TS_ENOMEM;
    }
    if (rc == TS_OK)
        rc = ts_st_to_f32(tx, x, B * chw);
    if (rc == TS_OK)
        rc = ts_st_to_f32(ttt, t, B);
    if (rc == TS_OK)
        rc = ts_st_to_i64(ty, y64, B);
    for (int b = 0; b < B && rc == TS_OK; b++) {
        if (y64[b] < 0 || y64[b] > c->num_classes) {
            snprintf(err, sizeof err, "%s: y[%d] = %lld is outside 0..%d", inputs, b,
                     (long long)y64[b], c->num_classes);
            rc = TS_ERANGE;
        }
        y[b] = (int32_t)(rc == TS_OK ? y64[b] : 0);
    }
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&xt, x, TS_F32, TS_CPU, 4,
                            TS_SHAPE(B, c->in_channels, c->input_size, c->input_size));
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&tt, t, TS_F32, TS_CPU, 1, TS_SHAPE(B));
    if (rc == TS_OK && (ts_check_finite(&eng, &xt) || ts_check_finite(&eng, &tt))) {
        snprintf(err, sizeof err, "%s: x or t holds NaN or Inf", inputs);
        rc = TS_ENONFINITE;
    }
    ts_tensor_t v;
    if (rc == TS_OK)
        rc = ts_dit_forward(&model, &xt, &tt, y, B, &v);
    if (rc == TS_OK) {
        ts_st_entry_t e = {.name = "v",
                           .dtype = TS_ST_F32,
                           .ndim = 4,
                           .shape = {B, c->in_channels, c->input_size, c->input_size},
                           .data = v.data};
        rc = ts_st_write(out, &e, 1, NULL, 0, err, sizeof err);
    }
    if (rc != TS_OK)
        fprintf(stderr, "tessera forward: %s%s%s\n", err, *err ? ": " : "", ts_strerror(rc));
    free(x);
    free(t);
    free(y64);
    free(y);
    ts_dit_free(&model);
    ts_engine_free(&eng);
    ts_st_free(&in);
    return rc == TS_OK ? 0 : 1;
}
