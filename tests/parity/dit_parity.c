/*
 * dit_parity.c — the C half of the PyTorch parity test of the DiT expert.
 *
 * A small command-line tool that run_parity.py drives: it loads a safetensors file written by
 * the PyTorch reference (tests/parity/dit_torch.py), runs the C model (model/dit.c) on tensors
 * from a second file, and writes what it computed to a third, so the orchestrator can compare
 * them tensor by tensor. It always uses a CPU engine with 2 threads.
 *
 *   dit_parity forward WEIGHTS INPUTS OUT
 *       INPUTS: x (B, C, H, W; F32), t (B; F32), y (B; I64 or I32) → OUT: v (B, C, H, W; F32)
 *   dit_parity grads WEIGHTS BATCH OUT
 *       BATCH: x0, eps (B, C, H, W), t (B), y (B). Flow-matching loss at x_t = (1−t)·x0 + t·ε,
 *       target ε − x0 → OUT: loss (1) and every parameter gradient under its DiT name and shape.
 *   dit_parity adamw WEIGHTS BATCH STEPS LR WD OUT
 *       STEPS AdamW steps (β = (0.9, 0.999), eps 1e-8, decoupled weight decay WD) on the fixed
 *       batch → OUT: the final parameters (ts_dit_save, F32), and OUT.losses.safetensors:
 *       losses (STEPS), the loss before each update.
 *   dit_parity init PRESET SEED OUT [key=value ...]
 *       A model from a preset (overridden by config keys such as input_size=16), DiT's
 *       initialisation with SEED, plus 0.05·N(0, 1) noise on every parameter so that the
 *       zero-initialised adaLN and final-layer tensors are exercised → OUT (F32).
 *
 * What it is not: a user tool (that is `tessera forward`) — it exists only for the test, and any
 * failure prints the error and exits 1.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"
#include "model/dit.h"
#include "model/dit_io.h"
#include "model/safetensors.h"

#define THREADS 2
#define ERRLEN 512

static char g_err[ERRLEN]; /* the sentence of the last failure, printed by fail() */

/* Prints "dit_parity: what: strerror(rc): detail" and exits 1. */
static void fail(const char *what, int rc) {
    fprintf(stderr, "dit_parity: %s: %s%s%s\n", what, ts_strerror(rc), g_err[0] ? ": " : "", g_err);
    exit(1);
}

#define CHECK(what, expr)                                                                          \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != TS_OK)                                                                          \
            fail(what, rc_);                                                                       \
    } while (0)

/* ---- reading the input files ----------------------------------------------------------- */

/* A named F32 tensor of f, converted to float and copied into *out (owning, on the CPU).
 * want_ndim > 0 also checks the rank. */
static void read_f32(const ts_st_file_t *f, const char *path, const char *name, int want_ndim,
                     ts_tensor_t *out) {
    const ts_st_tensor_t *st = ts_st_find(f, name);
    if (!st) {
        snprintf(g_err, sizeof g_err, "'%s' has no tensor \"%s\"", path, name);
        fail("reading inputs", TS_ECORRUPT);
    }
    if ((want_ndim > 0 && st->ndim != want_ndim) || st->ndim < 1 || st->ndim > TS_MAX_DIMS) {
        snprintf(g_err, sizeof g_err, "'%s': tensor \"%s\" has %d dimensions, expected %d", path,
                 name, st->ndim, want_ndim);
        fail("reading inputs", TS_ESHAPE);
    }
    CHECK("allocating an input", ts_tensor_alloc(out, TS_F32, TS_CPU, st->ndim, st->shape));
    CHECK("converting an input", ts_st_to_f32(st, (float *)out->data, st->numel));
}

/* The labels y (B; any integer dtype) as int32, malloc'd. */
static int32_t *read_labels(const ts_st_file_t *f, const char *path, int64_t B) {
    const ts_st_tensor_t *st = ts_st_find(f, "y");
    if (!st || st->ndim != 1 || st->numel != B) {
        snprintf(g_err, sizeof g_err, "'%s' needs a tensor y of shape (%lld)", path, (long long)B);
        fail("reading inputs", TS_ECORRUPT);
    }
    int64_t *wide = malloc((size_t)B * sizeof *wide);
    int32_t *y = malloc((size_t)B * sizeof *y);
    if (!wide || !y)
        fail("allocating labels", TS_ENOMEM);
    CHECK("converting y", ts_st_to_i64(st, wide, B));
    for (int64_t b = 0; b < B; b++) {
        if (wide[b] < 0 || wide[b] > INT32_MAX)
            fail("label out of range", TS_ERANGE);
        y[b] = (int32_t)wide[b];
    }
    free(wide);
    return y;
}

static void open_file(const char *path, ts_st_file_t *f) {
    CHECK(path, ts_st_read(path, f, g_err, sizeof g_err));
}

/* ---- writing results ------------------------------------------------------------------- */

static ts_st_entry_t f32_entry(const char *name, const ts_tensor_t *t) {
    ts_st_entry_t en = {.name = name, .dtype = TS_ST_F32, .ndim = t->ndim, .data = t->data};
    for (int i = 0; i < t->ndim; i++)
        en.shape[i] = t->shape[i];
    return en;
}

static void write_one(const char *path, const char *name, const ts_tensor_t *t) {
    ts_st_entry_t en = f32_entry(name, t);
    CHECK(path, ts_st_write(path, &en, 1, NULL, 0, g_err, sizeof g_err));
}

/* ---- the shared training step ---------------------------------------------------------- */

/* A fixed flow-matching batch and the buffers one loss evaluation needs. */
typedef struct {
    int B;
    ts_tensor_t x0, eps, t, xt, target, dv, loss;
    int32_t *y;
} batch_t;

static void batch_open(const char *path, batch_t *bt) {
    ts_st_file_t f;
    open_file(path, &f);
    read_f32(&f, path, "x0", 4, &bt->x0);
    read_f32(&f, path, "eps", 4, &bt->eps);
    read_f32(&f, path, "t", 1, &bt->t);
    if (!ts_tensor_same_shape(&bt->x0, &bt->eps) || bt->t.shape[0] != bt->x0.shape[0]) {
        snprintf(g_err, sizeof g_err, "x0, eps (B, C, H, W) and t (B) disagree");
        fail(path, TS_ESHAPE);
    }
    bt->B = (int)bt->x0.shape[0];
    bt->y = read_labels(&f, path, bt->B);
    ts_st_free(&f);
    CHECK("alloc", ts_tensor_alloc(&bt->xt, TS_F32, TS_CPU, 4, bt->x0.shape));
    CHECK("alloc", ts_tensor_alloc(&bt->target, TS_F32, TS_CPU, 4, bt->x0.shape));
    CHECK("alloc", ts_tensor_alloc(&bt->dv, TS_F32, TS_CPU, 4, bt->x0.shape));
    CHECK("alloc", ts_tensor_alloc(&bt->loss, TS_F32, TS_CPU, 1, TS_SHAPE(1)));
}

static void batch_free(batch_t *bt) {
    ts_tensor_t *all[] = {&bt->x0, &bt->eps, &bt->t, &bt->xt, &bt->target, &bt->dv, &bt->loss};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ts_tensor_free(all[i]);
    free(bt->y);
}

/* zero_grad → forward at x_t → loss → backward (dL/dv = 2(v − target)/N). Returns the loss. */
static float loss_and_grads(ts_dit_t *m, batch_t *bt) {
    ts_engine_t *e = m->eng;
    ts_tensor_t v;
    float loss;
    CHECK("zero_grad", ts_dit_zero_grad(m));
    CHECK("flow_interp", ts_flow_interp(e, &bt->xt, &bt->target, &bt->x0, &bt->eps, &bt->t));
    CHECK("forward", ts_dit_forward(m, &bt->xt, &bt->t, bt->y, bt->B, &v));
    CHECK("mse", ts_mse_forward(e, &bt->loss, &v, &bt->target));
    CHECK("loss", ts_tensor_item(e, &bt->loss, &loss));
    CHECK("zero dv", ts_zero(e, &bt->dv));
    CHECK("mse backward", ts_mse_backward(e, &bt->dv, 1.0f, &v, &bt->target));
    CHECK("backward", ts_dit_backward(m, &bt->dv, bt->B));
    return loss;
}

/* ---- commands -------------------------------------------------------------------------- */

static void cmd_forward(ts_engine_t *e, const char *weights, const char *inputs, const char *out) {
    ts_st_file_t f;
    ts_tensor_t x, t, v;
    open_file(inputs, &f);
    read_f32(&f, inputs, "x", 4, &x);
    read_f32(&f, inputs, "t", 1, &t);
    int B = (int)x.shape[0];
    int32_t *y = read_labels(&f, inputs, B);
    ts_st_free(&f);

    ts_dit_t m;
    CHECK(weights, ts_dit_open(&m, weights, e, B, 0, g_err, sizeof g_err));
    CHECK("forward (labels must be in [0, num_classes], t of shape (B))",
          ts_dit_forward(&m, &x, &t, y, B, &v));
    if (m.cfg.learn_sigma) { /* the prediction and the variance, each (B, C, H, W) */
        ts_tensor_t sigma;
        CHECK("sigma", ts_dit_sigma(&m, B, &sigma));
        ts_st_entry_t en[2] = {f32_entry("v", &v), f32_entry("sigma", &sigma)};
        CHECK(out, ts_st_write(out, en, 2, NULL, 0, g_err, sizeof g_err));
    } else {
        write_one(out, "v", &v);
    }
    ts_dit_free(&m);
    free(y);
    ts_tensor_free(&x);
    ts_tensor_free(&t);
}

static void cmd_grads(ts_engine_t *e, const char *weights, const char *batch, const char *out) {
    batch_t bt = {0};
    batch_open(batch, &bt);
    ts_dit_t m;
    CHECK(weights, ts_dit_open(&m, weights, e, bt.B, 1, g_err, sizeof g_err));
    loss_and_grads(&m, &bt);

    /* the loss first, then every gradient under its parameter's name and file shape */
    ts_st_entry_t *en = calloc((size_t)m.n_params + 1, sizeof *en);
    if (!en)
        fail("allocating the output table", TS_ENOMEM);
    en[0] = f32_entry("loss", &bt.loss);
    for (int i = 0; i < m.n_params; i++) {
        const ts_dit_param_info_t *pi = &m.info[i];
        en[i + 1].name = pi->name;
        en[i + 1].dtype = TS_ST_F32;
        en[i + 1].ndim = pi->ndim;
        for (int d = 0; d < pi->ndim; d++)
            en[i + 1].shape[d] = pi->shape[d];
        en[i + 1].data = (const float *)m.grad_mem.data + pi->offset;
    }
    CHECK(out, ts_st_write(out, en, m.n_params + 1, NULL, 0, g_err, sizeof g_err));
    free(en);
    ts_dit_free(&m);
    batch_free(&bt);
}

static double parse_num(const char *s, const char *what) {
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (errno || end == s || *end) {
        snprintf(g_err, sizeof g_err, "%s must be a number, got \"%s\"", what, s);
        fail("arguments", TS_EINVAL);
    }
    return d;
}

static void cmd_adamw(ts_engine_t *e, const char *weights, const char *batch, int steps, float lr,
                      float wd, const char *out) {
    batch_t bt = {0};
    batch_open(batch, &bt);
    ts_dit_t m;
    CHECK(weights, ts_dit_open(&m, weights, e, bt.B, 1, g_err, sizeof g_err));
    /* the moments are slabs of the parameter layout, zero at the start */
    ts_tensor_t mom1, mom2, losses;
    CHECK("alloc", ts_tensor_alloc(&mom1, TS_F32, TS_CPU, 1, TS_SHAPE(m.num_params)));
    CHECK("alloc", ts_tensor_alloc(&mom2, TS_F32, TS_CPU, 1, TS_SHAPE(m.num_params)));
    CHECK("zero", ts_zero(e, &mom1));
    CHECK("zero", ts_zero(e, &mom2));
    CHECK("alloc", ts_tensor_alloc(&losses, TS_F32, TS_CPU, 1, TS_SHAPE(steps)));
    ts_adamw_t hp = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = wd};
    for (int s = 1; s <= steps; s++) {
        ((float *)losses.data)[s - 1] = loss_and_grads(&m, &bt);
        CHECK("adamw", ts_adamw_step(e, &m.param_mem, &m.grad_mem, &mom1, &mom2, &hp, s, 1.0f));
    }
    CHECK(out, ts_dit_save(&m, &m.param_mem, out, TS_ST_F32, NULL, 0, g_err, sizeof g_err));
    char path[4096];
    snprintf(path, sizeof path, "%s.losses.safetensors", out);
    write_one(path, "losses", &losses);
    ts_tensor_free(&losses);
    ts_tensor_free(&mom2);
    ts_tensor_free(&mom1);
    ts_dit_free(&m);
    batch_free(&bt);
}

/* Applies one "key=value" override to cfg. */
static void config_override(ts_dit_config_t *cfg, const char *kv) {
    struct {
        const char *key;
        int *field;
    } keys[] = {{"input_size", &cfg->input_size},
                {"in_channels", &cfg->in_channels},
                {"patch_size", &cfg->patch_size},
                {"hidden_size", &cfg->hidden_size},
                {"depth", &cfg->depth},
                {"num_heads", &cfg->num_heads},
                {"num_classes", &cfg->num_classes},
                {"mlp_ratio", &cfg->mlp_ratio},
                {"freq_dim", &cfg->freq_dim}};
    const char *eq = strchr(kv, '=');
    for (size_t i = 0; eq && i < sizeof keys / sizeof keys[0]; i++) {
        if (strlen(keys[i].key) == (size_t)(eq - kv) && strncmp(kv, keys[i].key, eq - kv) == 0) {
            *keys[i].field = (int)parse_num(eq + 1, keys[i].key);
            return;
        }
    }
    snprintf(g_err, sizeof g_err, "\"%s\" is not key=value with a DiT config key", kv);
    fail("arguments", TS_EINVAL);
}

static void cmd_init(ts_engine_t *e, const char *preset, uint64_t seed, const char *out, int n_over,
                     char **over) {
    ts_dit_config_t cfg;
    if (ts_dit_config_preset(preset, &cfg) != TS_OK) {
        snprintf(g_err, sizeof g_err, "unknown preset \"%s\"", preset);
        fail("arguments", TS_EINVAL);
    }
    for (int i = 0; i < n_over; i++)
        config_override(&cfg, over[i]);
    ts_dit_t m;
    CHECK("config", ts_dit_create(&m, &cfg, e, 1, 0));
    CHECK("init", ts_dit_init_weights(&m, seed));
    /* DiT zero-initialises adaLN and the final layer; a test with those at zero would not see
     * them, so add 0.05·N(0, 1) everywhere (another stream of the same seed) */
    ts_tensor_t noise;
    CHECK("alloc", ts_tensor_alloc(&noise, TS_F32, TS_CPU, 1, TS_SHAPE(m.num_params)));
    CHECK("rng", ts_rng_normal(e, &noise, seed ^ 0x9e3779b97f4a7c15ull, 0));
    CHECK("axpy", ts_axpy(e, &m.param_mem, 0.05f, &noise));
    CHECK(out, ts_dit_save(&m, &m.param_mem, out, TS_ST_F32, NULL, 0, g_err, sizeof g_err));
    ts_tensor_free(&noise);
    ts_dit_free(&m);
}

static void usage(void) {
    fprintf(stderr, "usage: dit_parity forward WEIGHTS INPUTS OUT\n"
                    "       dit_parity grads WEIGHTS BATCH OUT\n"
                    "       dit_parity adamw WEIGHTS BATCH STEPS LR WD OUT\n"
                    "       dit_parity init PRESET SEED OUT [key=value ...]\n");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 2)
        usage();
    const char *cmd = argv[1];
    ts_engine_t eng;
    ts_engine_opts_t opts = {.device = TS_CPU, .threads = THREADS};
    CHECK("engine", ts_engine_init(&eng, &opts));
    if (strcmp(cmd, "forward") == 0 && argc == 5) {
        cmd_forward(&eng, argv[2], argv[3], argv[4]);
    } else if (strcmp(cmd, "grads") == 0 && argc == 5) {
        cmd_grads(&eng, argv[2], argv[3], argv[4]);
    } else if (strcmp(cmd, "adamw") == 0 && argc == 8) {
        double steps = parse_num(argv[4], "STEPS");
        if (steps < 1 || steps > 100000 || steps != (int)steps) {
            snprintf(g_err, sizeof g_err, "STEPS must be an integer in [1, 100000]");
            fail("arguments", TS_EINVAL);
        }
        cmd_adamw(&eng, argv[2], argv[3], (int)steps, (float)parse_num(argv[5], "LR"),
                  (float)parse_num(argv[6], "WD"), argv[7]);
    } else if (strcmp(cmd, "init") == 0 && argc >= 5) {
        double seed = parse_num(argv[3], "SEED");
        if (seed < 0 || seed > 9007199254740992.0 || seed != (double)(uint64_t)seed) {
            snprintf(g_err, sizeof g_err, "SEED must be a non-negative integer");
            fail("arguments", TS_EINVAL);
        }
        cmd_init(&eng, argv[2], (uint64_t)seed, argv[4], argc - 5, argv + 5);
    } else {
        ts_engine_free(&eng);
        usage();
    }
    ts_engine_free(&eng);
    return 0;
}
