/*
 * gemm_bench.c — GFLOP/s of a DiT expert's matrix products on the CPU engine.
 *
 * How it works. The shape list is derived from the two configs below, exactly as the model will use
 * them (architecture.md §9): for every linear layer the rows are the batch's tokens (M = B·T) —
 * except adaLN, whose input is one conditioning vector per sample (M = B) — and attention
 * multiplies per (sample, head) pair: S = Q·Kᵀ (T × T × head_dim) and O = P·V. Each shape is timed
 * three times: the forward product and the two backward products (dinp and dweight for a linear;
 * dQ/dK and dP/dV for attention), each through the public op that the model will call
 * (ts_linear_forward / ts_linear_backward, ts_matmul / ts_matmul_backward), so the argument checks
 * and the dispatch are part of what is measured.
 *
 * Timing (CLOCK_MONOTONIC): one warm-up call, then windows of calls, each about a fifth of
 * min_time (0.2 s by default), until min_time has passed and at least 3 windows (5 for the peak)
 * have run; the peak gets five times as long. The figure is 2·M·N·K·count / (seconds per call in the best window): on a shared or
 * virtual machine, interference only ever slows a window down. The JSON output also carries the
 * mean over all windows. The backward calls accumulate into their gradients (+=) as the ops do;
 * values stay finite.
 *
 * The reference is the sgemm peak of the same engine in the same run: a square product
 * (2048³ by default) through ts_matmul. Last, the same product goes straight to OpenBLAS with
 * its own threads, outside the engine, to show what the engine's way of threading costs. What is deliberately not here: any non-GEMM op, and the
 * strided Q/K/V views inside the fused qkv buffer (attention's products run on contiguous
 * per-head buffers of the same sizes).
 */
#define _POSIX_C_SOURCE 200809L

#include "kernels/gemm_bench.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/ops.h"

/* ---- the configs and the shape list ------------------------------------------------------ */

typedef struct dit_config {
    const char *name;
    int hidden, depth, heads, patch, image, channels;
} dit_config_t;

static const dit_config_t CONFIGS[] = {
    {"tiny", 128, 4, 4, 4, 28, 1},
    {"small", 256, 6, 4, 2, 28, 1},
};
static const int BATCHES[] = {1, 64};

static const dit_config_t *find_config(const char *name) {
    for (size_t c = 0; c < sizeof CONFIGS / sizeof CONFIGS[0]; c++)
        if (strcmp(CONFIGS[c].name, name) == 0)
            return &CONFIGS[c];
    return NULL;
}

typedef enum { KIND_LINEAR, KIND_QK, KIND_PV } kind_t;

/* One shape: a linear (rows × in → rows × out) or one attention product over `groups`
 * (sample, head) pairs of T tokens and head_dim d. `per_step` is how many times a training or
 * inference step runs it (depth for the block layers, 1 otherwise). */
typedef struct shape {
    const char *config;
    int batch;
    const char *layer;
    kind_t kind;
    int64_t rows, in, out; /* linear */
    int64_t groups, T, d;  /* attention */
    int per_step;
    int prec; /* the peak's precision (ts_precision_t): f32, or its bf16 or f16 twin */
} shape_t;

#define MAX_SHAPES 64

/* Fills s with the shapes of every config, or only of the one named `only` (NULL = all). */
static int build_shapes(shape_t *s, const char *only) {
    int n = 0;
    for (size_t c = 0; c < sizeof CONFIGS / sizeof CONFIGS[0]; c++) {
        const dit_config_t *k = &CONFIGS[c];
        if (only && strcmp(only, k->name) != 0)
            continue;
        int64_t grid = k->image / k->patch, T = grid * grid, H = k->hidden;
        int64_t pp = (int64_t)k->patch * k->patch * k->channels;
        for (size_t b = 0; b < sizeof BATCHES / sizeof BATCHES[0]; b++) {
            int B = BATCHES[b];
            const struct {
                const char *layer;
                kind_t kind;
                int64_t rows, in, out;
                int per_step;
            } lin[] = {
                {"x_embedder", KIND_LINEAR, B * T, pp, H, 1},
                {"qkv", KIND_LINEAR, B * T, H, 3 * H, k->depth},
                {"attn_proj", KIND_LINEAR, B * T, H, H, k->depth},
                {"mlp_fc1", KIND_LINEAR, B * T, H, 4 * H, k->depth},
                {"mlp_fc2", KIND_LINEAR, B * T, 4 * H, H, k->depth},
                {"final", KIND_LINEAR, B * T, H, pp, 1},
                {"adaLN", KIND_LINEAR, B, H, 6 * H, k->depth},
                {"attn_QK^T", KIND_QK, 0, 0, 0, k->depth},
                {"attn_PV", KIND_PV, 0, 0, 0, k->depth},
            };
            for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
                shape_t *x = &s[n++];
                memset(x, 0, sizeof *x);
                x->config = k->name;
                x->batch = B;
                x->layer = lin[i].layer;
                x->kind = lin[i].kind;
                x->rows = lin[i].rows;
                x->in = lin[i].in;
                x->out = lin[i].out;
                x->groups = (int64_t)B * k->heads;
                x->T = T;
                x->d = H / k->heads;
                x->per_step = lin[i].per_step;
            }
        }
    }
    return n;
}

/* ---- one shape's tensors and its three passes ---------------------------------------------- */

enum { PASS_FWD = 0, PASS_BWD_A = 1, PASS_BWD_B = 2, NPASS = 3 };

static const char *pass_name(kind_t kind, int pass) {
    static const char *names[3][NPASS] = {
        {"fwd", "dinp", "dweight"}, /* linear */
        {"fwd", "dQ", "dK"},        /* S = Q·Kᵀ */
        {"fwd", "dP", "dV"},        /* O = P·V */
    };
    return names[kind][pass];
}

/* The GEMM each pass performs, as (M, N, K) of one product, `count` products. */
static void pass_dims(const shape_t *s, int pass, int64_t dims[4]) {
    if (s->kind == KIND_LINEAR) {
        static const int order[NPASS][3] = {{0, 2, 1}, {0, 1, 2}, {2, 1, 0}};
        int64_t v[3] = {s->rows, s->in, s->out};
        /* fwd: (rows, out, in); dinp: (rows, in, out); dweight: (out, in, rows) */
        dims[0] = v[order[pass][0]];
        dims[1] = v[order[pass][1]];
        dims[2] = v[order[pass][2]];
        dims[3] = 1;
        return;
    }
    /* QKᵀ: fwd (T, T, d), dQ = dS·K and dK = dSᵀ·Q (T, d, T).
     * PV:  fwd (T, d, T), dP = dO·Vᵀ (T, T, d), dV = Pᵀ·dO (T, d, T). */
    int square = (s->kind == KIND_QK) ? (pass == PASS_FWD) : (pass == PASS_BWD_A);
    dims[0] = s->T;
    dims[1] = square ? s->T : s->d;
    dims[2] = square ? s->d : s->T;
    dims[3] = s->groups;
}

static double pass_flops(const shape_t *s, int pass) {
    int64_t m[4];
    pass_dims(s, pass, m);
    return 2.0 * (double)m[0] * (double)m[1] * (double)m[2] * (double)m[3];
}

/* Tensors of one shape. Linear: a = inp (rows, in), b = weight (out, in), c = out (rows, out),
 * bias (out), dc = dout, da = dinp, db = dweight. QKᵀ: a = Q, b = K (groups, T, d), c = S
 * (groups, T, T). PV: a = P (groups, T, T), b = V (groups, T, d), c = O (groups, T, d). */
typedef struct bench_case {
    ts_tensor_t a, b, c, bias, da, db, dc;
} bench_case_t;

static void case_free(bench_case_t *k) {
    ts_tensor_free(&k->a);
    ts_tensor_free(&k->b);
    ts_tensor_free(&k->c);
    ts_tensor_free(&k->bias);
    ts_tensor_free(&k->da);
    ts_tensor_free(&k->db);
    ts_tensor_free(&k->dc);
}

static int alloc_rand(ts_engine_t *e, ts_tensor_t *t, int ndim, const int64_t *shape,
                      uint64_t seed) {
    int rc = ts_tensor_alloc(t, TS_F32, e->device, ndim, shape);
    if (rc == TS_OK)
        rc = ts_rng_normal(e, t, seed, 0);
    return rc;
}

static int case_init(ts_engine_t *e, bench_case_t *k, const shape_t *s) {
    memset(k, 0, sizeof *k);
    int rc;
    if (s->kind == KIND_LINEAR) {
        /* (cblas.h pulls in <complex.h>, whose macro I rules out the short names) */
        int64_t nr = s->rows, ni = s->in, no = s->out;
        if ((rc = alloc_rand(e, &k->a, 2, TS_SHAPE(nr, ni), 1)) ||
            (rc = alloc_rand(e, &k->b, 2, TS_SHAPE(no, ni), 2)) ||
            (rc = alloc_rand(e, &k->bias, 1, TS_SHAPE(no), 3)) ||
            (rc = alloc_rand(e, &k->dc, 2, TS_SHAPE(nr, no), 4)) ||
            (rc = ts_tensor_alloc(&k->c, TS_F32, e->device, 2, TS_SHAPE(nr, no))) ||
            (rc = ts_tensor_alloc(&k->da, TS_F32, e->device, 2, TS_SHAPE(nr, ni))) ||
            (rc = ts_tensor_alloc(&k->db, TS_F32, e->device, 2, TS_SHAPE(no, ni))))
            return rc;
        return TS_OK;
    }
    int64_t G = s->groups, T = s->T, d = s->d;
    int qk = s->kind == KIND_QK;
    const int64_t *a_shape = qk ? TS_SHAPE(G, T, d) : TS_SHAPE(G, T, T);
    const int64_t *c_shape = qk ? TS_SHAPE(G, T, T) : TS_SHAPE(G, T, d);
    if ((rc = alloc_rand(e, &k->a, 3, a_shape, 1)) ||
        (rc = alloc_rand(e, &k->b, 3, TS_SHAPE(G, T, d), 2)) ||
        (rc = alloc_rand(e, &k->dc, 3, c_shape, 4)) ||
        (rc = ts_tensor_alloc(&k->c, TS_F32, e->device, 3, c_shape)) ||
        (rc = ts_tensor_alloc(&k->da, TS_F32, e->device, 3, a_shape)) ||
        (rc = ts_tensor_alloc(&k->db, TS_F32, e->device, 3, TS_SHAPE(G, T, d))))
        return rc;
    return TS_OK;
}

static int case_run(ts_engine_t *e, bench_case_t *k, const shape_t *s, int pass) {
    if (s->kind == KIND_LINEAR) {
        switch (pass) {
        case PASS_FWD: return ts_linear_forward(e, &k->c, &k->a, &k->b, &k->bias);
        case PASS_BWD_A: return ts_linear_backward(e, &k->da, NULL, NULL, &k->dc, &k->a, &k->b);
        default: return ts_linear_backward(e, NULL, &k->db, NULL, &k->dc, &k->a, &k->b);
        }
    }
    int trans_b = s->kind == KIND_QK; /* S = Q·Kᵀ; O = P·V */
    float alpha = trans_b ? 1.0f / sqrtf((float)s->d) : 1.0f;
    switch (pass) {
    case PASS_FWD:
        if (s->prec == TS_PREC_BF16)
            return ts_matmul_bf16(e, &k->c, &k->a, 0, &k->b, trans_b, alpha, 0.0f);
        if (s->prec == TS_PREC_F16)
            return ts_matmul_f16(e, &k->c, &k->a, 0, &k->b, trans_b, alpha, 0.0f);
        return ts_matmul(e, &k->c, &k->a, 0, &k->b, trans_b, alpha, 0.0f);
    case PASS_BWD_A:
        return ts_matmul_backward(e, &k->da, NULL, &k->dc, &k->a, 0, &k->b, trans_b, alpha);
    default: return ts_matmul_backward(e, NULL, &k->db, &k->dc, &k->a, 0, &k->b, trans_b, alpha);
    }
}

/* ---- timing --------------------------------------------------------------------------------- */

/* Timing of one pass: the best window's and the overall mean seconds per call. */
typedef struct timing {
    double best, mean;
    long calls;
} timing_t;

/* Times one pass: a warm-up call (which also sizes the windows), then windows of w calls, each
 * about min_time / 5 long, until min_time has passed and at least min_windows windows have run.
 * The figure reported is the best window's mean: on a shared or virtual machine another
 * process's burst slows some windows, never speeds one up. */
static int time_pass(ts_engine_t *e, bench_case_t *k, const shape_t *s, int pass, double min_time,
                     int min_windows, timing_t *t) {
    double t0 = ts_now_s();
    int rc = case_run(e, k, s, pass);
    if (rc == TS_OK)
        rc = ts_engine_sync(e);
    if (rc != TS_OK)
        return rc;
    double first = ts_now_s() - t0;
    long w = (long)(min_time / 5.0 / (first > 1e-9 ? first : 1e-9));
    w = w < 1 ? 1 : w;
    long calls = 0;
    int windows = 0;
    double best = 0, start = ts_now_s(), elapsed;
    do {
        double w0 = ts_now_s();
        for (long i = 0; i < w; i++) {
            if ((rc = case_run(e, k, s, pass)) != TS_OK || (rc = ts_engine_sync(e)) != TS_OK)
                return rc;
        }
        double per_call = (ts_now_s() - w0) / (double)w;
        if (windows == 0 || per_call < best)
            best = per_call;
        windows++;
        calls += w;
        elapsed = ts_now_s() - start;
    } while (elapsed < min_time || windows < min_windows);
    t->best = best;
    t->mean = elapsed / (double)calls;
    t->calls = calls;
    return TS_OK;
}

typedef struct peak {
    int size;
    double gflops;
    timing_t t;
} peak_t;

/* The reference: one square product c = a·b through ts_matmul (timed as an O = P·V pass), over
 * five times the shapes' window so that its best window is a steady one. At bf16 (f16), the
 * same product through ts_matmul_bf16 (ts_matmul_f16), both operands rounded on each call, as the
 * 16-bit path's inputs are: the peak a bf16 (f16) forward is read against. */
static int measure_peak(ts_engine_t *e, int size, double min_time, int prec, peak_t *p) {
    shape_t s = {.layer = "peak", .kind = KIND_PV, .groups = 1, .T = size, .d = size, .prec = prec};
    bench_case_t k;
    memset(&k, 0, sizeof k);
    int64_t n = size;
    int rc;
    if ((rc = alloc_rand(e, &k.a, 2, TS_SHAPE(n, n), 11)) == TS_OK &&
        (rc = alloc_rand(e, &k.b, 2, TS_SHAPE(n, n), 12)) == TS_OK &&
        (rc = ts_tensor_alloc(&k.c, TS_F32, e->device, 2, TS_SHAPE(n, n))) == TS_OK)
        rc = time_pass(e, &k, &s, PASS_FWD, 5 * min_time, 5, &p->t);
    p->size = size;
    p->gflops = rc == TS_OK ? 2.0 * (double)n * (double)n * (double)n / p->t.best / 1e9 : 0;
    case_free(&k);
    return rc;
}

int ts_gemm_peak(ts_engine_t *e, int size, double min_time, int prec, double *gflops) {
    if (!e || size < 1 || size > 65536 || !gflops)
        return TS_EINVAL;
    peak_t p;
    if (prec != TS_PREC_F32 && prec != TS_PREC_BF16 && prec != TS_PREC_F16)
        return TS_EINVAL;
    int rc = measure_peak(e, size, min_time > 0 ? min_time : 0.2, prec, &p);
    *gflops = rc == TS_OK ? p.gflops : 0.0;
    return rc;
}

/* OpenBLAS on its own, for comparison with the engine's path: the same square product straight
 * to cblas_sgemm, with OpenBLAS's own threads (as many as the engine has) instead of the
 * engine's pool. OpenBLAS's thread count is process-wide, so it is restored afterwards; this runs
 * after every engine measurement, since OpenBLAS's threads keep spinning a while after a call. */
static int measure_openblas_direct(int size, int threads, double min_time, peak_t *p) {
    size_t n = (size_t)size, bytes = n * n * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return TS_ENOMEM;
    }
    for (size_t i = 0; i < n * n; i++) {
        a[i] = (float)(i % 17) * 0.125f - 1.0f;
        b[i] = (float)(i % 13) * 0.125f - 0.75f;
        c[i] = 0.0f;
    }
    int prev = openblas_get_num_threads();
    openblas_set_num_threads(threads);
    double best = 0, start = 0, elapsed;
    long calls = 0;
    for (int i = -1;; i++) { /* i == -1: the warm-up call */
        double t0 = ts_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, a, size, b,
                    size, 0.0f, c, size);
        double t = ts_now_s() - t0;
        if (i < 0) {
            start = ts_now_s();
            continue;
        }
        best = (i == 0 || t < best) ? t : best;
        calls++;
        elapsed = ts_now_s() - start;
        if (elapsed >= 5 * min_time && calls >= 5)
            break;
    }
    openblas_set_num_threads(prev);
    p->size = size;
    p->t.best = best;
    p->t.mean = elapsed / (double)calls;
    p->t.calls = calls;
    p->gflops = 2.0 * (double)n * (double)n * (double)n / best / 1e9;
    free(a);
    free(b);
    free(c);
    return TS_OK;
}

/* ---- output --------------------------------------------------------------------------------- */

/* The "model name" line of /proc/cpuinfo, or "unknown". */
static void cpu_model(char *buf, size_t len) {
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            if (v) {
                v++;
                while (*v == ' ' || *v == '\t')
                    v++;
                snprintf(buf, len, "%s", v);
                buf[strcspn(buf, "\n")] = '\0';
            }
            break;
        }
    }
    fclose(f);
}

static void json_string(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(out, "\\u%04x", ch);
        else
            fputc(ch, out);
    }
    fputc('"', out);
}

typedef struct result {
    const shape_t *shape;
    int pass;
    timing_t t;
    double gflops; /* from the best window */
} result_t;

static void trim(char *s) {
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\n'))
        s[--n] = '\0';
}

/* Per (config, batch): the time of one step's GEMMs, each shape weighted by how many times a
 * step runs it. Inference = forward passes; training = forward + backward, less x_embedder's
 * dinp (nothing needs the image gradient). */
static void step_estimate(const result_t *r, int nr, const char *config, int batch, int train,
                          double *ms, double *gflops) {
    double sec = 0, flops = 0;
    for (int i = 0; i < nr; i++) {
        const shape_t *s = r[i].shape;
        if (strcmp(s->config, config) != 0 || s->batch != batch)
            continue;
        if (!train && r[i].pass != PASS_FWD)
            continue;
        if (strcmp(s->layer, "x_embedder") == 0 && r[i].pass == PASS_BWD_A)
            continue;
        sec += r[i].t.best * s->per_step;
        flops += pass_flops(s, r[i].pass) * s->per_step;
    }
    *ms = sec * 1e3;
    *gflops = sec > 0 ? flops / sec / 1e9 : 0;
}

static void print_table(FILE *out, const result_t *r, int nr, const peak_t *pk, const char *only) {
    fprintf(out, "%-6s %3s  %-10s %-7s %6s %5s %6s %5s %9s %8s\n", "config", "B", "layer", "pass",
            "M", "N", "K", "count", "GFLOP/s", "of peak");
    for (int i = 0; i < nr; i++) {
        const shape_t *s = r[i].shape;
        int64_t m[4];
        pass_dims(s, r[i].pass, m);
        if (i > 0 &&
            (r[i - 1].shape->batch != s->batch || strcmp(r[i - 1].shape->config, s->config) != 0))
            fputc('\n', out);
        fprintf(out, "%-6s %3d  %-10s %-7s %6lld %5lld %6lld %5lld %9.2f %7.1f%%\n", s->config,
                s->batch, s->layer, pass_name(s->kind, r[i].pass), (long long)m[0], (long long)m[1],
                (long long)m[2], (long long)m[3], r[i].gflops, 100.0 * r[i].gflops / pk->gflops);
    }
    fprintf(out, "\nOne step's GEMMs (each layer times depth; the other ops excluded):\n");
    fprintf(out, "%-6s %3s  %-22s %-22s\n", "config", "B", "inference (fwd)", "training (fwd+bwd)");
    for (size_t c = 0; c < sizeof CONFIGS / sizeof CONFIGS[0]; c++)
        for (size_t b = 0; b < sizeof BATCHES / sizeof BATCHES[0]; b++) {
            if (only && strcmp(only, CONFIGS[c].name) != 0)
                continue;
            double ims, igf, tms, tgf;
            step_estimate(r, nr, CONFIGS[c].name, BATCHES[b], 0, &ims, &igf);
            step_estimate(r, nr, CONFIGS[c].name, BATCHES[b], 1, &tms, &tgf);
            char inf[64], trn[64];
            snprintf(inf, sizeof inf, "%.3f ms, %.1f GFLOP/s", ims, igf);
            snprintf(trn, sizeof trn, "%.3f ms, %.1f GFLOP/s", tms, tgf);
            fprintf(out, "%-6s %3d  %-22s %-22s\n", CONFIGS[c].name, BATCHES[b], inf, trn);
        }
}

static void print_json(FILE *out, const result_t *r, int nr, const peak_t *pk, const peak_t *pk16,
                       const peak_t *direct, int threads, const char *blas_config, const char *cpu,
                       double min_time) {
    fprintf(out, "{\n  \"engine\": \"cpu\",\n  \"threads\": %d,\n  \"openblas_threads\": %d,\n",
            threads, openblas_get_num_threads());
    fprintf(out, "  \"min_time_s\": %g,\n", min_time);
    fprintf(out, "  \"openblas_config\": ");
    json_string(out, blas_config);
    ts_blas_status_t bs;
    char line[512];
    ts_blas_status(&bs);
    ts_blas_describe(&bs, line, sizeof line);
    fprintf(out, ",\n  \"blas\": {\"core\": ");
    json_string(out, bs.core);
    fprintf(out, ", \"cpu_best\": ");
    json_string(out, bs.cpu_best);
    fprintf(out, ", \"chosen_by\": ");
    json_string(out, bs.chosen_by);
    fprintf(out, ", \"weaker\": %s, \"line\": ", bs.weaker ? "true" : "false");
    json_string(out, line);
    fprintf(out, "}");
    fprintf(out, ",\n  \"cpu_model\": ");
    json_string(out, cpu);
    fprintf(out, ",\n  \"online_cores\": %ld,\n", sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(out,
            "  \"peak\": {\"m\": %d, \"n\": %d, \"k\": %d, \"gflops\": %.3f, "
            "\"seconds_per_call\": %.6g, \"mean_seconds_per_call\": %.6g, \"calls\": %ld},\n",
            pk->size, pk->size, pk->size, pk->gflops, pk->t.best, pk->t.mean, pk->t.calls);
    if (pk16->size)
        fprintf(out,
                "  \"peak_bf16\": {\"m\": %d, \"n\": %d, \"k\": %d, \"gflops\": %.3f, "
                "\"seconds_per_call\": %.6g, \"mean_seconds_per_call\": %.6g, \"calls\": %ld},\n",
                pk16->size, pk16->size, pk16->size, pk16->gflops, pk16->t.best, pk16->t.mean,
                pk16->t.calls);
    else
        fprintf(out, "  \"peak_bf16\": null,\n");
    fprintf(out,
            "  \"openblas_direct\": {\"m\": %d, \"n\": %d, \"k\": %d, \"threads\": %d, "
            "\"gflops\": %.3f, \"seconds_per_call\": %.6g, \"calls\": %ld},\n",
            direct->size, direct->size, direct->size, threads, direct->gflops, direct->t.best,
            direct->t.calls);
    fprintf(out, "  \"results\": [\n");
    for (int i = 0; i < nr; i++) {
        const shape_t *s = r[i].shape;
        int64_t m[4];
        pass_dims(s, r[i].pass, m);
        fprintf(out,
                "    {\"config\": \"%s\", \"batch\": %d, \"layer\": \"%s\", \"pass\": \"%s\", "
                "\"m\": %lld, \"n\": %lld, \"k\": %lld, \"count\": %lld, \"per_step\": %d, "
                "\"calls\": %ld, \"seconds_per_call\": %.6g, \"mean_seconds_per_call\": %.6g, "
                "\"gflops\": %.3f, \"ratio_to_peak\": %.4f}%s\n",
                s->config, s->batch, s->layer, pass_name(s->kind, r[i].pass), (long long)m[0],
                (long long)m[1], (long long)m[2], (long long)m[3], s->per_step, r[i].t.calls,
                r[i].t.best, r[i].t.mean, r[i].gflops, r[i].gflops / pk->gflops,
                i + 1 < nr ? "," : "");
    }
    fprintf(out, "  ]\n}\n");
}

/* ---- the run ---------------------------------------------------------------------------- */

int ts_gemm_bench_run(const ts_gemm_bench_opts_t *opts) {
    FILE *out = opts->out ? opts->out : stdout;
    double min_time = opts->min_time > 0 ? opts->min_time : (opts->quick ? 0.02 : 0.2);
    int peak_size = opts->peak_size > 0 ? opts->peak_size : (opts->quick ? 1024 : 2048);

    if (opts->config && !find_config(opts->config)) {
        fprintf(stderr, "bench gemm: unknown config '%s' (tiny or small)\n", opts->config);
        return TS_EINVAL;
    }

    ts_engine_t e;
    ts_engine_opts_t eo = {.device = TS_CPU, .threads = opts->threads};
    int rc = ts_engine_init(&e, &eo);
    if (rc != TS_OK) {
        fprintf(stderr, "bench gemm: cannot start the CPU engine: %s\n", ts_strerror(rc));
        return rc;
    }

    char blas_config[256], cpu[256];
    snprintf(blas_config, sizeof blas_config, "%s", openblas_get_config());
    trim(blas_config);
    cpu_model(cpu, sizeof cpu);

    if (!opts->json) {
        fprintf(out, "tessera GEMM benchmark: DiT %s, batch 1 and 64, CPU engine%s\n",
                opts->config ? opts->config : "tiny and small",
                opts->quick ? " (--quick: a smoke run, not a measurement)" : "");
        fprintf(out, "machine:  %s, %ld online cores\n", cpu, sysconf(_SC_NPROCESSORS_ONLN));
        fprintf(out, "engine:   %d thread%s; OpenBLAS's own threads: %d\n", e.threads,
                e.threads == 1 ? "" : "s", openblas_get_num_threads());
        fprintf(out, "OpenBLAS: %s\n", blas_config);
        ts_blas_status_t bs;
        char line[512];
        ts_blas_status(&bs);
        ts_blas_describe(&bs, line, sizeof line);
        fprintf(out, "GEMM:     %s\n", line);
        fflush(out);
    }

    peak_t pk;
    rc = measure_peak(&e, peak_size, min_time, 0, &pk);
    if (rc != TS_OK) {
        fprintf(stderr, "bench gemm: peak sgemm %d^3 failed: %s\n", peak_size, ts_strerror(rc));
        ts_engine_free(&e);
        return rc;
    }
    /* the bf16 peak where bf16 runs (peak_bf16.size 0 otherwise, with the reason) */
    peak_t pk16 = {0};
    char why16[256] = "";
    if (ts_engine_precision_check(&e, TS_PREC_BF16, why16, sizeof why16) == TS_OK &&
        (rc = measure_peak(&e, peak_size, min_time, 1, &pk16)) != TS_OK) {
        fprintf(stderr, "bench gemm: peak bf16 %d^3 failed: %s\n", peak_size, ts_strerror(rc));
        ts_engine_free(&e);
        return rc;
    }
    if (!opts->json) {
        fprintf(out, "peak:     sgemm %dx%dx%d via ts_matmul: %.2f GFLOP/s (%.1f ms per call)\n",
                peak_size, peak_size, peak_size, pk.gflops, pk.t.best * 1e3);
        if (pk16.size)
            fprintf(out,
                    "          bf16 %dx%dx%d via ts_matmul_bf16 (oneDNN): %.2f GFLOP/s (%.1f ms "
                    "per call)\n\n",
                    peak_size, peak_size, peak_size, pk16.gflops, pk16.t.best * 1e3);
        else
            fprintf(out, "          bf16: not measured (%s)\n\n", why16);
        fflush(out);
    }

    shape_t shapes[MAX_SHAPES];
    int ns = build_shapes(shapes, opts->config);
    result_t results[MAX_SHAPES * NPASS];
    int nr = 0;
    for (int i = 0; i < ns && rc == TS_OK; i++) {
        bench_case_t k;
        rc = case_init(&e, &k, &shapes[i]);
        for (int p = 0; p < NPASS && rc == TS_OK; p++) {
            result_t *r = &results[nr];
            r->shape = &shapes[i];
            r->pass = p;
            rc = time_pass(&e, &k, &shapes[i], p, min_time, 3, &r->t);
            if (rc == TS_OK) {
                r->gflops = pass_flops(&shapes[i], p) / r->t.best / 1e9;
                nr++;
            }
        }
        if (rc != TS_OK)
            fprintf(stderr, "bench gemm: %s B=%d %s failed: %s\n", shapes[i].config,
                    shapes[i].batch, shapes[i].layer, ts_strerror(rc));
        case_free(&k);
    }

    peak_t direct = {0};
    if (rc == TS_OK)
        rc = measure_openblas_direct(peak_size, e.threads, min_time, &direct);
    if (rc == TS_OK) {
        if (opts->json) {
            print_json(out, results, nr, &pk, &pk16, &direct, e.threads, blas_config, cpu,
                       min_time);
        } else {
            print_table(out, results, nr, &pk, opts->config);
            fprintf(out,
                    "\nOpenBLAS alone: cblas_sgemm %dx%dx%d on %d OpenBLAS thread%s, outside the "
                    "engine:\n%.2f GFLOP/s (%.1f ms per call); the engine's peak above is %.0f%% "
                    "of it.\n",
                    peak_size, peak_size, peak_size, e.threads, e.threads == 1 ? "" : "s",
                    direct.gflops, direct.t.best * 1e3, 100.0 * pk.gflops / direct.gflops);
        }
    }
    ts_engine_free(&e);
    return rc;
}

/* ---- command line ----------------------------------------------------------------------- */

static void usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s [--threads N] [--config tiny|small] [--json] [--quick]\n"
            "\n"
            "Times every matrix product of the tiny and small DiT configs (batch 1 and 64;\n"
            "forward, dinp and dweight) through the CPU engine's ops and prints GFLOP/s next to\n"
            "the sgemm peak measured in the same run (a 2048^3 product).\n"
            "\n"
            "  --threads N   engine and OpenBLAS threads (default: one per online core)\n"
            "  --config C    only the shapes of config C, tiny or small (default: both)\n"
            "  --json        print one JSON document instead of the table\n"
            "  --quick       short timing windows and a 1024^3 peak: a smoke run, not a\n"
            "                measurement\n"
            "  -h, --help    show this text\n",
            prog);
}

static int parse_threads(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < 1 || v > 1024)
        return -1;
    *out = (int)v;
    return 0;
}

int ts_gemm_bench_main(int argc, char **argv, const char *prog) {
    ts_gemm_bench_opts_t o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout, prog);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            o.json = 1;
        } else if (strcmp(a, "--quick") == 0) {
            o.quick = 1;
        } else if (strcmp(a, "--config") == 0 || strncmp(a, "--config=", 9) == 0) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !find_config(v)) {
                fprintf(stderr, "%s: --config needs tiny or small (got '%s')\n", prog, v ? v : "");
                return 2;
            }
            o.config = v;
        } else if (strcmp(a, "--threads") == 0 || strncmp(a, "--threads=", 10) == 0) {
            const char *v = a[9] == '=' ? a + 10 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || parse_threads(v, &o.threads) != 0) {
                fprintf(stderr, "%s: --threads needs a whole number from 1 to 1024 (got '%s')\n",
                        prog, v ? v : "");
                return 2;
            }
        } else {
            fprintf(stderr, "%s: unknown option '%s' (see %s --help)\n", prog, a, prog);
            return 2;
        }
    }
    return ts_gemm_bench_run(&o) == 0 ? 0 : 1;
}
