/*
 * bench_dit.c — samples/s of one DiT expert on the CPU engine: forward, and a full training step.
 *
 * The C half of the side-by-side benchmark against PyTorch (bench/bench_dit.py drives both sides
 * on the same weights file and prints the ratios; docs/benchmarks.md has the results). It loads
 * a weights file (ts_dit_open) and measures:
 *   - forward at each --batch (default 1 and 64): ts_dit_forward on fixed random x, t and y
 *     (labels include the null class);
 *   - training at --train-batch (default 64): ts_trainer_step on a synthetic data set of random
 *     images — the real step of model/trainer.c: batch and noise draws, x_t, forward, MSE loss,
 *     backward, gradient-norm clipping, AdamW and the EMA update.
 * Each measurement is a warm-up (3 calls, at least 0.2 s), then calls timed one by one until
 * --seconds (default 2) have passed and at least 5 calls have run (--quick: a warm-up of 1 call
 * and 0.05 s, then 0.3 s and 3 calls — a smoke run). The figure is the median call (robust
 * against another process's bursts on a shared machine; the JSON also has the mean and the
 * fastest call). GFLOP/s counts the GEMMs of ts_dit_flops_per_sample, 3× that for training.
 *
 * --check FILE first runs one forward on the inputs stored in FILE (x, t, y; the orchestrator
 * writes them with PyTorch's output v) and compares: max|v_ours − v| / max(1, max|v|) must be at
 * most --tol (1e-4), else the program exits 3 — a benchmark of two different computations means
 * nothing.
 *
 * --precision bf16 runs the model with ts_dit_set_precision(TS_PREC_BF16) (bf16 products through
 * oneDNN, fp32 accumulation): the forward rows, and the training row in bf16 training (the
 * backward's linear products in bf16 too, fp32 masters and AdamW); a --check against an fp32
 * reference then needs a bf16-sized --tol (bench_dit.py passes 3e-2). --precision f16 is the
 * same in half precision (training with the trainer's loss scaling): cuBLAS on a GPU, emulated on
 * the CPU.
 *
 * Each row runs on a model built for what it runs: the forward rows (and --check) on a model
 * that cannot train, sized for the largest forward batch; then, that model freed, the training
 * row on a trainable one at the training batch. The memory each needs is computed from the
 * config first (ts_dit_memory) and printed with the memory the device can still give
 * (ts_engine_memory_usable); a row that cannot fit is refused before anything is allocated,
 * saying what it needs and what is usable (exit 1).
 * --memory prints those figures alone (--json: a document with "memory" and "fits").
 *
 * --ops, after each fp32 forward row, times every op call of a block alone on block 0's
 * activations (and the unfused pairs next to the fused ops), and prints each one's share of the
 * forward: where the time goes, without a profiler. Each op runs as calls back to back followed
 * by a device synchronisation, so a GPU's figure is its work, not the launches.
 *
 * What it is not: a profiler (run it under `perf record`), nor a test of speed targets (those are
 * judged by bench_dit.py against PyTorch in the same run).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "kernels/backend.h"
#include "kernels/gemm_bench.h"
#include "kernels/math.h"
#include "kernels/ops.h"
#include "model/dit.h"
#include "model/dit_io.h"
#include "model/fmnist.h"
#include "model/safetensors.h"
#include "model/trainer.h"

#define MAX_BATCHES 16
#define ERRLEN 512
#define DATA_N 1024 /* images in the synthetic training set */

typedef struct opts {
    const char *weights;
    const char *check;
    int threads;
    int batches[MAX_BATCHES];
    int n_batches;
    int train_batch; /* 0: no training measurement */
    double seconds;
    double tol;
    int json;
    int quick;
    int ops;    /* --ops: a per-op breakdown after each forward row */
    int memory; /* --memory: the memory figures only, nothing built or timed */
    int warmup_calls, min_calls;
    double warmup_seconds;
    ts_precision_t precision;
    int attn_set;        /* --attention given */
    ts_attn_impl_t attn; /* the model's attention (default: the model's own choice) */
    int attention_ops;   /* --attention-ops B: time the attention ops alone at batch B */
    const char *device;  /* --device: cpu (default), cuda or cuda:N */
    int peak;            /* --peak N: also the engine's N³ GEMM peak, fp32, bf16 (and f16) */
    int graphs;          /* --graphs: the forward rows' model runs through CUDA graphs */
    int measure;         /* --attention measure: ts_dit_tune at the forward rows' largest batch */
} opts_t;

/* What --attention measure found (the forward rows' model; printed and in the JSON), and the
 * engine's epilogue setting before it (the training row's). */
static ts_dit_tune_t measured;
static int have_measured, epilogues_before;

/* v for JSON: "%.6g", or null where it is not finite (a difference of a non-finite output). */
static const char *jnum(char buf[32], double v) {
    if (!isfinite(v))
        return "null";
    snprintf(buf, 32, "%.6g", v);
    return buf;
}

/* --peak's measurement: GFLOP/s of an N³ product on the engine (0: not measured, or failed). */
typedef struct {
    int size;
    double f32, bf16, f16; /* f16: measured for an f16 run only */
} peak_res_t;

/* Starts the engine --device names (the CPU by default, not auto: the CPU tables' commands stay
 * what they measure); 0, or the exit code after saying why. */
static int start_engine(const opts_t *o, ts_engine_t *e) {
    ts_device_spec_t spec;
    char note[256] = "";
    if (ts_device_spec_parse(o->device ? o->device : "cpu", &spec) != TS_OK) {
        fprintf(stderr, "bench_dit: --device wants %s, not '%s'\n", TS_DEVICE_SPEC_HELP, o->device);
        return 2;
    }
    int rc = ts_engine_init_spec(e, &spec, o->threads, note, sizeof note);
    if (rc != TS_OK) {
        fprintf(stderr, "bench_dit: cannot start the engine: %s (%s)\n", note, ts_strerror(rc));
        return 1;
    }
    return 0;
}

/* ---- timing ----------------------------------------------------------------------------- */

/* Seconds per call over the timed calls. */
typedef struct timing {
    long calls;
    double total, median, mean, min;
} timing_t;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* What is timed: one call of a forward or of a training step. */
typedef struct job {
    ts_dit_t *m;
    ts_trainer_t *tr; /* training when non-NULL */
    ts_tensor_t x, t; /* forward inputs (B, C, H, W), (B) */
    int32_t *y;       /* (B) host labels */
    int B;
    struct att_job *att; /* an attention op alone when non-NULL (--attention-ops) */
} job_t;

static int att_job_run(struct att_job *a);

static int job_run(job_t *j) {
    if (j->att)
        return att_job_run(j->att);
    if (j->tr)
        return ts_trainer_step(j->tr, NULL, NULL);
    ts_tensor_t v;
    int rc = ts_dit_forward(j->m, &j->x, &j->t, j->y, j->B, &v);
    return rc == TS_OK ? ts_engine_sync(j->m->eng) : rc;
}

/* Warm-up, then calls timed one by one until o->seconds and o->min_calls are both reached. */
static int time_job(job_t *j, const opts_t *o, timing_t *out) {
    int rc;
    double w0 = ts_now_s();
    for (int i = 0; i < o->warmup_calls || ts_now_s() - w0 < o->warmup_seconds; i++)
        if ((rc = job_run(j)) != TS_OK)
            return rc;
    size_t cap = 1024, n = 0;
    double *calls = malloc(cap * sizeof *calls);
    if (!calls)
        return TS_ENOMEM;
    double start = ts_now_s(), total = 0;
    while (total < o->seconds || n < (size_t)o->min_calls) {
        if (n == cap) {
            double *more = realloc(calls, 2 * cap * sizeof *calls);
            if (!more) {
                free(calls);
                return TS_ENOMEM;
            }
            calls = more;
            cap *= 2;
        }
        double c0 = ts_now_s();
        if ((rc = job_run(j)) != TS_OK) {
            free(calls);
            return rc;
        }
        double c1 = ts_now_s();
        calls[n++] = c1 - c0;
        total = c1 - start;
    }
    qsort(calls, n, sizeof *calls, cmp_double);
    out->calls = (long)n;
    out->total = total;
    out->median = n % 2 ? calls[n / 2] : 0.5 * (calls[n / 2 - 1] + calls[n / 2]);
    out->mean = total / (double)n;
    out->min = calls[0];
    free(calls);
    return TS_OK;
}

/* ---- inputs ----------------------------------------------------------------------------- */

/* Random forward inputs for B samples: x ~ N(0, 1), t ~ U(0, 1), y uniform over the classes and
 * the null class. */
static int job_inputs(job_t *j, ts_dit_t *m, int B, uint64_t seed) {
    const ts_dit_config_t *c = &m->cfg;
    ts_engine_t *e = m->eng;
    int64_t S = c->input_size;
    memset(j, 0, sizeof *j);
    j->m = m;
    j->B = B;
    int rc = ts_tensor_alloc(&j->x, TS_F32, e->device, 4, TS_SHAPE(B, c->in_channels, S, S));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&j->t, TS_F32, e->device, 1, TS_SHAPE(B));
    if (rc == TS_OK)
        rc = ts_rng_normal(e, &j->x, seed, 0);
    if (rc == TS_OK)
        rc = ts_rng_uniform(e, &j->t, seed + 1, 0);
    j->y = malloc((size_t)B * sizeof *j->y);
    if (rc == TS_OK && !j->y)
        rc = TS_ENOMEM;
    for (int i = 0; rc == TS_OK && i < B; i++) {
        int y = (int)(ts_rng_uniform_at(seed + 2, (uint64_t)i) * (float)(c->num_classes + 1));
        j->y[i] = y > c->num_classes ? c->num_classes : y;
    }
    return rc;
}

static void job_free(job_t *j) {
    ts_tensor_free(&j->x);
    ts_tensor_free(&j->t);
    free(j->y);
    memset(j, 0, sizeof *j);
}

/* A data set of DATA_N random images in [−1, 1] with random labels, shaped for m. */
static int synthetic_data(const ts_dit_config_t *c, ts_dataset_t *ds) {
    memset(ds, 0, sizeof *ds);
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    ds->n = DATA_N;
    ds->channels = c->in_channels;
    ds->height = ds->width = c->input_size;
    ds->num_classes = c->num_classes;
    ds->images = malloc((size_t)(DATA_N * chw) * sizeof(float));
    ds->labels = malloc((size_t)DATA_N * sizeof(int32_t));
    if (!ds->images || !ds->labels) {
        ts_dataset_free(ds);
        return TS_ENOMEM;
    }
    for (int64_t i = 0; i < DATA_N * chw; i++)
        ds->images[i] = 2.0f * ts_rng_uniform_at(7, (uint64_t)i) - 1.0f;
    for (int i = 0; i < DATA_N; i++)
        ds->labels[i] =
            (int32_t)(ts_rng_uniform_at(8, (uint64_t)i) * (float)c->num_classes) % c->num_classes;
    return TS_OK;
}

/* ---- the equivalence check -------------------------------------------------------------- */

typedef struct check {
    int done, batch;
    double max_abs_diff, scale, rel;
} check_t;

/* Batch size of the check file (the length of its t), or a negative error. */
static int check_batch(const ts_st_file_t *f) {
    const ts_st_tensor_t *t = ts_st_find(f, "t");
    if (!t || t->ndim != 1 || t->shape[0] < 1 || t->shape[0] > 1 << 20)
        return TS_ECORRUPT;
    return (int)t->shape[0];
}

/* One forward on the check file's x, t, y, compared with its v. */
static int run_check(ts_dit_t *m, const ts_st_file_t *f, check_t *ck, char *err, size_t errlen) {
    const ts_dit_config_t *c = &m->cfg;
    int B = check_batch(f);
    int64_t S = c->input_size, n_img = (int64_t)B * c->in_channels * S * S;
    const ts_st_tensor_t *sx = ts_st_find(f, "x"), *st = ts_st_find(f, "t");
    const ts_st_tensor_t *sy = ts_st_find(f, "y"), *sv = ts_st_find(f, "v");
    if (!sx || !sy || !sv || sx->numel != n_img || sv->numel != n_img || sy->numel != B) {
        snprintf(err, errlen, "the check file needs x and v (%d, %d, %lld, %lld), t and y (%d)", B,
                 c->in_channels, (long long)S, (long long)S, B);
        return TS_ESHAPE;
    }
    float *x = malloc((size_t)n_img * sizeof(float)), *v = malloc((size_t)n_img * sizeof(float));
    float *t = malloc((size_t)B * sizeof(float)), *out = malloc((size_t)n_img * sizeof(float));
    int64_t *y64 = malloc((size_t)B * sizeof(int64_t));
    int32_t *y = malloc((size_t)B * sizeof(int32_t));
    int rc = (x && v && t && out && y64 && y) ? TS_OK : TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_st_to_f32(sx, x, n_img);
    if (rc == TS_OK)
        rc = ts_st_to_f32(sv, v, n_img);
    if (rc == TS_OK)
        rc = ts_st_to_f32(st, t, B);
    if (rc == TS_OK)
        rc = ts_st_to_i64(sy, y64, B);
    for (int i = 0; rc == TS_OK && i < B; i++) {
        if (y64[i] < 0 || y64[i] > c->num_classes) {
            snprintf(err, errlen, "check file: label %lld outside [0, %d]", (long long)y64[i],
                     c->num_classes);
            rc = TS_ERANGE;
        }
        y[i] = (int32_t)y64[i];
    }
    ts_tensor_t hx, ht, dx = {0}, dt = {0}, dv, hout;
    ts_engine_t *e = m->eng;
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&hx, x, TS_F32, TS_CPU, 4, TS_SHAPE(B, c->in_channels, S, S));
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&ht, t, TS_F32, TS_CPU, 1, TS_SHAPE(B));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&dx, TS_F32, e->device, 4, hx.shape);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&dt, TS_F32, e->device, 1, ht.shape);
    if (rc == TS_OK)
        rc = ts_tensor_copy(&dx, &hx);
    if (rc == TS_OK)
        rc = ts_tensor_copy(&dt, &ht);
    if (rc == TS_OK)
        rc = ts_dit_forward(m, &dx, &dt, y, B, &dv);
    if (rc == TS_OK)
        rc = ts_tensor_wrap(&hout, out, TS_F32, TS_CPU, 4, hx.shape);
    if (rc == TS_OK)
        rc = ts_tensor_copy(&hout, &dv);
    if (rc == TS_OK) {
        double diff = 0, scale = 0;
        for (int64_t i = 0; i < n_img; i++) {
            double d = fabs((double)out[i] - (double)v[i]);
            diff = (d > diff || isnan(d)) ? d : diff;
            scale = fabs((double)v[i]) > scale ? fabs((double)v[i]) : scale;
        }
        ck->done = 1;
        ck->batch = B;
        ck->max_abs_diff = diff;
        ck->scale = scale;
        ck->rel = diff / (scale > 1.0 ? scale : 1.0);
    }
    ts_tensor_free(&dx);
    ts_tensor_free(&dt);
    free(x);
    free(v);
    free(t);
    free(out);
    free(y64);
    free(y);
    return rc;
}

static int fail(const char *what, int rc, const char *err) {
    fprintf(stderr, "bench_dit: %s: %s%s%s\n", what, ts_strerror(rc), err && err[0] ? ": " : "",
            err ? err : "");
    return 1;
}

/* ---- attention alone (--attention-ops) ------------------------------------------------------ */

/* One attention op on random qkv (B, T, 3C): forward, or forward then backward; composed
 * (gemm · softmax · gemm) or fused; fp32, bf16 or f16 products (lp; a 16-bit forward + backward:
 * the fused op's 16-bit backward against the composed backward a 16-bit model trains with). */
typedef struct att_job {
    ts_engine_t *e;
    ts_tensor_t qkv, out, att, lse, dout, dqkv, datt;
    int heads, fused, backward;
    ts_dtype_t lp;
} att_job_t;

/* Ends with the device synchronised (a GPU's ops are queued; the CPU's are done). */
static int att_job_ops(att_job_t *a) {
    ts_engine_t *e = a->e;
    ts_tensor_t *lse = a->backward ? &a->lse : NULL;
    if (a->fused)
        TS_TRY(a->lp != TS_F32
                   ? ts_attention_fused_forward_lp(e, a->lp, &a->out, lse, &a->qkv, a->heads)
                   : ts_attention_fused_forward(e, &a->out, &a->lse, &a->qkv, a->heads));
    else if (a->lp == TS_F16)
        TS_TRY(ts_attention_forward_f16(e, &a->out, &a->att, &a->qkv, a->heads));
    else
        TS_TRY(a->lp == TS_BF16 ? ts_attention_forward_bf16(e, &a->out, &a->att, &a->qkv, a->heads)
                                : ts_attention_forward(e, &a->out, &a->att, &a->qkv, a->heads));
    if (!a->backward)
        return TS_OK;
    if (a->fused)
        return a->lp != TS_F32 ? ts_attention_fused_backward_lp(e, a->lp, &a->dqkv, NULL, &a->dout,
                                                                &a->qkv, &a->out, &a->lse, a->heads)
                               : ts_attention_fused_backward(e, &a->dqkv, &a->dout, &a->qkv,
                                                             &a->out, &a->lse, a->heads);
    return ts_attention_backward(e, &a->dqkv, &a->datt, &a->dout, &a->qkv, &a->att, a->heads);
}

static int att_job_run(att_job_t *a) {
    int rc = att_job_ops(a);
    return rc == TS_OK ? ts_engine_sync(a->e) : rc;
}

static int att_job_alloc(att_job_t *a, ts_engine_t *e, int64_t B, int64_t T, int64_t C, int H) {
    memset(a, 0, sizeof *a);
    a->e = e, a->heads = H;
    int rc = ts_tensor_alloc(&a->qkv, TS_F32, e->device, 3, TS_SHAPE(B, T, 3 * C));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&a->dqkv, TS_F32, e->device, 3, TS_SHAPE(B, T, 3 * C));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&a->out, TS_F32, e->device, 3, TS_SHAPE(B, T, C));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&a->dout, TS_F32, e->device, 3, TS_SHAPE(B, T, C));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&a->lse, TS_F32, e->device, 3, TS_SHAPE(B, H, T));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&a->att, TS_F32, e->device, 4, TS_SHAPE(B, H, T, T));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&a->datt, TS_F32, e->device, 4, TS_SHAPE(B, H, T, T));
    if (rc == TS_OK)
        rc = ts_rng_normal(e, &a->qkv, 7, 0);
    if (rc == TS_OK)
        rc = ts_rng_normal(e, &a->dout, 8, 0);
    if (rc == TS_OK)
        rc = ts_zero(e, &a->dqkv);
    return rc;
}

static void att_job_free(att_job_t *a) {
    ts_tensor_t *all[] = {&a->qkv, &a->out, &a->att, &a->lse, &a->dout, &a->dqkv, &a->datt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ts_tensor_free(all[i]);
}

/* Composed against fused, per shape and kind: the tiny and small presets' heads (4 of 32 and of
 * 64) at T = 64 and 256, forward and forward + backward, fp32, bf16 and f16 (bf16 where it runs:
 * a CPU with AVX-512 BF16, or a GPU of sm_80 or later; f16 on a GPU of sm_75 or later — the
 * flash attention on tensor cores, which a 16-bit model does not take by default yet; a row
 * whose fused op answers TS_ENOTSUP is left out). */
static int run_attention_ops(const opts_t *o) {
    static const struct {
        const char *preset;
        int64_t C;
        int H;
    } cfgs[] = {{"tiny", 128, 4}, {"small", 256, 4}};
    static const int64_t Ts[] = {64, 256};
    static const char *const kinds[] = {"forward f32",  "forward+backward f32",
                                        "forward bf16", "forward+backward bf16",
                                        "forward f16",  "forward+backward f16"};
    static const ts_dtype_t kind_lp[] = {TS_F32, TS_F32, TS_BF16, TS_BF16, TS_F16, TS_F16};
    ts_engine_t e;
    int rc = start_engine(o, &e), first = 1;
    if (rc != 0)
        return rc;
    int runs[3] = {1, /* f32, bf16, f16: the fused op runs here */
                   ts_engine_precision_check(&e, TS_PREC_BF16, NULL, 0) == TS_OK &&
                       ts_attention_fused_lp_check(&e, TS_BF16) == TS_OK,
                   ts_engine_precision_check(&e, TS_PREC_F16, NULL, 0) == TS_OK &&
                       ts_attention_fused_lp_check(&e, TS_F16) == TS_OK};
    int64_t B = o->attention_ops;
    if (o->json)
        printf("{\n  \"threads\": %d,\n  \"seconds\": %g,\n  \"batch\": %lld,\n  \"rows\": [\n",
               e.threads, o->seconds, (long long)B);
    else
        printf("attention alone: batch %lld, %d threads, %gs per measurement; median ms per call\n",
               (long long)B, e.threads, o->seconds);
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0] && rc == TS_OK; c++)
        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0] && rc == TS_OK; t++)
            for (int k = 0; k < 6 && rc == TS_OK; k++) {
                if (!runs[k / 2])
                    continue;
                timing_t tm[2];
                for (int fused = 0; fused < 2 && rc == TS_OK; fused++) {
                    att_job_t a;
                    rc = att_job_alloc(&a, &e, B, Ts[t], cfgs[c].C, cfgs[c].H);
                    a.fused = fused, a.lp = kind_lp[k], a.backward = k % 2 == 1;
                    job_t j = {.att = &a, .B = (int)B};
                    if (rc == TS_OK)
                        rc = time_job(&j, o, &tm[fused]);
                    att_job_free(&a);
                }
                if (rc == TS_ENOTSUP && k >= 2) { /* no 16-bit fused attention on this device */
                    fprintf(stderr,
                            "bench_dit: %s T=%lld %s: no fused 16-bit attention here (left out)\n",
                            cfgs[c].preset, (long long)Ts[t], kinds[k]);
                    rc = TS_OK;
                    continue;
                }
                if (rc != TS_OK)
                    break;
                double ratio = tm[0].median / tm[1].median;
                if (o->json)
                    printf("%s    {\"preset\": \"%s\", \"T\": %lld, \"C\": %lld, \"heads\": %d, "
                           "\"what\": \"%s\", \"composed_median_s\": %.6g, "
                           "\"fused_median_s\": %.6g, \"composed_min_s\": %.6g, "
                           "\"fused_min_s\": %.6g, \"composed_over_fused\": %.4g}",
                           first ? "" : ",\n", cfgs[c].preset, (long long)Ts[t],
                           (long long)cfgs[c].C, cfgs[c].H, kinds[k], tm[0].median, tm[1].median,
                           tm[0].min, tm[1].min, ratio);
                else
                    printf("%-5s T=%-3lld heads %d × %-2lld %-21s composed %8.3f  fused %8.3f  "
                           "composed/fused %.2f×\n",
                           cfgs[c].preset, (long long)Ts[t], cfgs[c].H,
                           (long long)(cfgs[c].C / cfgs[c].H), kinds[k], tm[0].median * 1e3,
                           tm[1].median * 1e3, ratio);
                first = 0;
                fflush(stdout);
            }
    if (o->json)
        printf("\n  ]\n}\n");
    ts_engine_free(&e);
    return rc == TS_OK ? 0 : fail("attention", rc, NULL);
}

/* ---- memory --------------------------------------------------------------------------------- */

static double gib(uint64_t b) { return (double)b / (double)(1u << 30); }

/* The memory figures of the run: the model's (from its config) and what each row needs, against
 * what the engine's device can still give now. */
typedef struct mem_report {
    ts_dit_memory_t m;
    int fwd_batch, train_batch;
    uint64_t fwd_need, train_need; /* bytes of the forward rows' model, the training row's */
    uint64_t dev_free, dev_total;  /* usable now (ts_engine_memory_usable), whole; 0: unknown */
} mem_report_t;

static int mem_report(const opts_t *o, const ts_engine_t *e, const ts_dit_config_t *cfg,
                      int fwd_batch, mem_report_t *r) {
    memset(r, 0, sizeof *r);
    /* the composed attention's layout unless fused is asked for: the larger of the two */
    ts_attn_impl_t a = o->attn_set ? o->attn : TS_ATTN_COMPOSED;
    TS_TRY(ts_dit_memory(cfg, o->precision, a, &r->m));
    r->fwd_batch = fwd_batch;
    r->train_batch = o->train_batch;
    r->fwd_need = ts_dit_memory_total(&r->m, 0, fwd_batch);
    r->train_need = o->train_batch > 0 ? ts_dit_memory_total(&r->m, 1, o->train_batch) : 0;
    if (ts_engine_memory_usable(e, &r->dev_free, &r->dev_total) != TS_OK)
        r->dev_free = r->dev_total = 0;
    return TS_OK;
}

static void print_memory(FILE *out, const mem_report_t *r) {
    const ts_dit_memory_t *m = &r->m;
    fprintf(out,
            "memory:  parameters %.3f GiB%s; per sample %.1f MiB inference, %.1f MiB training "
            "(+ gradients, AdamW, EMA %.3f GiB)\n",
            gib(m->params + m->params_lp), m->params_lp ? " (with the 16-bit copy)" : "",
            (double)m->infer_per_sample / (1 << 20), (double)m->train_per_sample / (1 << 20),
            gib(m->grads + m->adamw + m->ema));
    fprintf(out, "         forward rows (B <= %d) %.2f GiB", r->fwd_batch, gib(r->fwd_need));
    if (r->train_batch > 0 && !r->m.can_train)
        fprintf(out, ", training: this config cannot be trained (past the bounds)");
    else if (r->train_batch > 0)
        fprintf(out, ", training row (B = %d) %.2f GiB", r->train_batch, gib(r->train_need));
    if (r->dev_total > 0)
        fprintf(out, "; device %.2f GiB usable of %.2f", gib(r->dev_free), gib(r->dev_total));
    fprintf(out, "\n");
}

static void print_memory_json(FILE *out, const mem_report_t *r) {
    const ts_dit_memory_t *m = &r->m;
    fprintf(out,
            "  \"memory\": {\"params_bytes\": %llu, \"params_lp_bytes\": %llu, "
            "\"grads_bytes\": %llu, \"adamw_bytes\": %llu, \"ema_bytes\": %llu, "
            "\"inference_fixed_bytes\": %llu, \"inference_per_sample_bytes\": %llu, "
            "\"training_fixed_bytes\": %llu, \"training_per_sample_bytes\": %llu, "
            "\"forward_batch\": %d, \"forward_bytes\": %llu, \"train_batch\": %d, "
            "\"train_bytes\": %llu, \"can_train\": %s, \"device_usable_bytes\": %llu, "
            "\"device_total_bytes\": %llu},\n",
            (unsigned long long)m->params, (unsigned long long)m->params_lp,
            (unsigned long long)m->grads, (unsigned long long)m->adamw, (unsigned long long)m->ema,
            (unsigned long long)m->infer_fixed, (unsigned long long)m->infer_per_sample,
            (unsigned long long)m->train_fixed, (unsigned long long)m->train_per_sample,
            r->fwd_batch, (unsigned long long)r->fwd_need, r->train_batch,
            (unsigned long long)(m->can_train ? r->train_need : 0), m->can_train ? "true" : "false",
            (unsigned long long)r->dev_free, (unsigned long long)r->dev_total);
}

/* Whether need bytes fit the memory the device can still give; true where that is unknown. */
static int fits(const mem_report_t *r, uint64_t need) {
    if (need == UINT64_MAX) /* a training row of a config that cannot train */
        return 0;
    return r->dev_total == 0 || need <= r->dev_free;
}

/* The reason a row could not be built: its bytes against the device's usable memory. */
static void say_short(const char *row, int B, uint64_t need, const mem_report_t *r) {
    if (need == UINT64_MAX) {
        fprintf(stderr, "bench_dit: this config cannot be trained: its training activations per "
                        "sample pass this project's bound (model/dit.h); --train-batch 0\n");
        return;
    }
    fprintf(stderr, "bench_dit: the %s row at batch %d needs %.2f GiB", row, B, gib(need));
    if (r->dev_total > 0)
        fprintf(stderr, "; the device has %.2f GiB usable of %.2f", gib(r->dev_free),
                gib(r->dev_total));
    fprintf(stderr, " (bench_dit --memory --batch B --train-batch B says what each size needs; "
                    "ask for a smaller batch)\n");
}

/* What the header and the JSON say of the model (the rows' models are built and freed in turn). */
typedef struct model_desc {
    ts_dit_config_t cfg;
    int64_t num_params;
    ts_precision_t precision;
    ts_attn_impl_t attn;
} model_desc_t;

static model_desc_t describe(const ts_dit_t *m) {
    return (model_desc_t){m->cfg, m->num_params, m->precision, m->attn};
}

/* ---- output ----------------------------------------------------------------------------- */

typedef struct result {
    const char *what; /* "forward" or "train" */
    int batch;
    timing_t t;
    double samples_per_s, gflops;
    int64_t graph_launches; /* forward calls of the row that ran as one CUDA graph */
} result_t;

static void print_json(FILE *out, const opts_t *o, const model_desc_t *m, const ts_engine_t *e,
                       double flops, const check_t *ck, const result_t *r, int nr,
                       const peak_res_t *pk, const mem_report_t *mr) {
    const ts_dit_config_t *c = &m->cfg;
    fprintf(out, "{\n  \"weights\": \"");
    for (const char *s = o->weights; *s; s++) { /* a path: escape what JSON requires */
        if (*s == '"' || *s == '\\')
            fputc('\\', out);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, out);
    }
    char dev[160];
    ts_engine_describe(e, dev, sizeof dev);
    fprintf(out,
            "\",\n  \"device\": \"%s\",\n  \"threads\": %d,\n  \"seconds\": %g,\n  "
            "\"precision\": \"%s\",\n  \"attention\": \"%s\",\n",
            dev, e->threads, o->seconds, ts_precision_name(m->precision),
            m->attn == TS_ATTN_FUSED ? "fused" : "composed");
    fprintf(out,
            "  \"config\": {\"input_size\": %d, \"in_channels\": %d, \"patch_size\": %d, "
            "\"hidden_size\": %d, \"depth\": %d, \"num_heads\": %d, \"num_classes\": %d, "
            "\"mlp_ratio\": %d, \"freq_dim\": %d},\n",
            c->input_size, c->in_channels, c->patch_size, c->hidden_size, c->depth, c->num_heads,
            c->num_classes, c->mlp_ratio, c->freq_dim);
    fprintf(out, "  \"num_params\": %lld,\n  \"flops_per_sample\": %.6g,\n",
            (long long)m->num_params, flops);
    print_memory_json(out, mr);
    char b1[32], b2[32], b3[32];
    if (have_measured)
        fprintf(out,
                "  \"measured\": {\"batch\": %d, \"attention\": \"%s\", \"ms_fused\": %.6g, "
                "\"ms_composed\": %.6g, \"fused_diff\": %s, \"epilogues_measured\": %s, "
                "\"epilogues\": %s, \"ms_epilogues\": %.6g, \"epilogues_diff\": %s, "
                "\"graphs_measured\": %s, \"graphs_same\": %s, \"graphs\": %s, "
                "\"ms_graphs\": %.6g, \"note\": \"%s\"},\n",
                measured.batch, ts_attn_name(measured.attn), measured.ms[TS_ATTN_FUSED],
                measured.ms[TS_ATTN_COMPOSED], jnum(b1, measured.fused_diff),
                measured.epilogues_measured ? "true" : "false",
                measured.epilogues ? "true" : "false", measured.ms_epilogues,
                jnum(b2, measured.epilogues_diff), measured.graphs_measured ? "true" : "false",
                measured.graphs_same ? "true" : "false", measured.graphs ? "true" : "false",
                measured.ms_graphs, measured.note);
    if (ck->done)
        fprintf(out,
                "  \"check\": {\"batch\": %d, \"max_abs_diff\": %s, \"scale\": %.6g, "
                "\"rel\": %s, \"tol\": %g, \"ok\": %s},\n",
                ck->batch, jnum(b1, ck->max_abs_diff), ck->scale, jnum(b3, ck->rel), o->tol,
                ck->rel <= o->tol ? "true" : "false");
    if (pk->size > 0)
        fprintf(out,
                "  \"peak\": {\"size\": %d, \"f32_gflops\": %.6g, \"bf16_gflops\": %.6g, "
                "\"f16_gflops\": %.6g},\n",
                pk->size, pk->f32, pk->bf16, pk->f16);
    fprintf(out, "  \"results\": [\n");
    for (int i = 0; i < nr; i++)
        fprintf(out,
                "    {\"what\": \"%s\", \"batch\": %d, \"calls\": %ld, \"seconds\": %.6g, "
                "\"median_s\": %.6g, \"mean_s\": %.6g, \"min_s\": %.6g, "
                "\"samples_per_s\": %.6g, \"gflops\": %.6g, \"graph_launches\": %lld}%s\n",
                r[i].what, r[i].batch, r[i].t.calls, r[i].t.total, r[i].t.median, r[i].t.mean,
                r[i].t.min, r[i].samples_per_s, r[i].gflops, (long long)r[i].graph_launches,
                i + 1 < nr ? "," : "");
    fprintf(out, "  ]\n}\n");
}

static void print_header(FILE *out, const opts_t *o, const model_desc_t *m, const ts_engine_t *e,
                         double flops) {
    const ts_dit_config_t *c = &m->cfg;
    fprintf(out,
            "bench_dit: %s — DiT %dx%dx%d, patch %d, hidden %d, depth %d, heads %d, "
            "%lld parameters\n",
            o->weights, c->input_size, c->input_size, c->in_channels, c->patch_size, c->hidden_size,
            c->depth, c->num_heads, (long long)m->num_params);
    char dev[160];
    ts_engine_describe(e, dev, sizeof dev);
    fprintf(out,
            "engine: %s, %s, %s attention; %.3f MFLOP per sample forward (GEMMs), "
            "%gs per measurement\n",
            dev, ts_precision_name(m->precision), m->attn == TS_ATTN_FUSED ? "fused" : "composed",
            flops / 1e6, o->seconds);
}

static void print_check(FILE *out, const opts_t *o, const check_t *ck) {
    fprintf(out,
            "check: batch %d, max|v_ours - v_ref| = %.3e, max|v_ref| = %.3f, relative %.3e "
            "(tolerance %.0e): %s\n",
            ck->batch, ck->max_abs_diff, ck->scale, ck->rel, o->tol,
            ck->rel <= o->tol ? "same computation" : "MISMATCH");
}

static void print_result(FILE *out, const result_t *r) {
    fprintf(out,
            "%-8s B=%-3d %10.1f samples/s  %8.2f GFLOP/s  median %9.3f ms  mean %9.3f ms  "
            "(%ld calls%s)\n",
            r->what, r->batch, r->samples_per_s, r->gflops, r->t.median * 1e3, r->t.mean * 1e3,
            r->t.calls, r->graph_launches > 0 ? ", CUDA graphs" : "");
    fflush(out);
}

/* ---- per-op breakdown (--ops) ------------------------------------------------------------ */

/* The op calls of one block's forward (model/dit.c, block_forward, fp32), each timed alone on
 * block 0's activations; the unfused pairs are timed too, to show what a fusion saves. */
enum {
    OP_ADA,
    OP_LN_MOD,
    OP_LN,
    OP_MOD,
    OP_QKV,
    OP_ATTN,
    OP_PROJ,
    OP_GATE,
    OP_FC1_GELU,
    OP_FC1,
    OP_GELU,
    OP_FC2,
    OP_COUNT
};
static const char *const op_names[OP_COUNT] = {
    "adaLN linear",    "layernorm+modulate", "  (layernorm alone)", "  (modulate alone)",
    "qkv linear",      "attention",          "proj linear",         "gate residual",
    "fc1+gelu linear", "  (fc1 alone)",      "  (gelu alone)",      "fc2 linear"};
/* how many times a block calls it (the unfused ones: 0, they are not in the forward) */
static const int op_calls[OP_COUNT] = {1, 2, 0, 0, 1, 1, 1, 2, 1, 0, 0, 1};

static ts_tensor_t first_rows(const ts_tensor_t *t, int64_t n) {
    ts_tensor_t v;
    if (ts_tensor_slice(&v, t, 0, n) != TS_OK)
        memset(&v, 0, sizeof v);
    return v;
}

static int block_op(ts_dit_t *m, int op, int B) {
    ts_engine_t *e = m->eng;
    const ts_dit_block_params_t *P = &m->params.blocks[0];
    const ts_dit_block_acts_t *A = &m->acts.blocks[0];
    int64_t T = ts_dit_tokens(&m->cfg);
    ts_tensor_t c_silu = first_rows(&m->acts.c_silu, B), mod = first_rows(&A->mod, B);
    ts_tensor_t x_in = first_rows(&A->x_in, B), ln1 = first_rows(&A->ln1, B);
    ts_tensor_t mod1 = first_rows(&A->mod1, B), qkv = first_rows(&A->qkv, B);
    ts_tensor_t m1 = first_rows(&A->ln1_mean, B * T), r1 = first_rows(&A->ln1_rstd, B * T);
    ts_tensor_t att = first_rows(&A->att, B), atty = first_rows(&A->atty, B);
    ts_tensor_t proj = first_rows(&A->proj, B), x_mid = first_rows(&A->x_mid, B);
    ts_tensor_t fc1 = first_rows(&A->fc1, B), gelu = first_rows(&A->gelu, B);
    ts_tensor_t fc2 = first_rows(&A->fc2, B), mod2 = first_rows(&A->mod2, B);
    switch (op) {
    case OP_ADA: return ts_linear_forward(e, &mod, &c_silu, &P->ada_w, &P->ada_b);
    case OP_LN_MOD:
        return ts_layernorm_modulate_forward(e, &ln1, &m1, &r1, &mod1, &x_in, &mod, 0, 1);
    case OP_LN: return ts_layernorm_forward(e, &ln1, &m1, &r1, &x_in);
    case OP_MOD: return ts_modulate_forward(e, &mod1, &ln1, &mod, 0, 1);
    case OP_QKV: return ts_linear_forward(e, &qkv, &mod1, &P->qkv_w, &P->qkv_b);
    case OP_ATTN: /* the model's own attention */
        return m->attn == TS_ATTN_FUSED
                   ? ts_attention_fused_forward(e, &atty, NULL, &qkv, m->cfg.num_heads)
                   : ts_attention_forward(e, &atty, &att, &qkv, m->cfg.num_heads);
    case OP_PROJ: return ts_linear_forward(e, &proj, &atty, &P->proj_w, &P->proj_b);
    case OP_GATE: return ts_gate_residual_forward(e, &x_mid, &x_in, &proj, &mod, 2);
    case OP_FC1_GELU: return ts_linear_gelu_forward(e, &fc1, &gelu, &mod2, &P->fc1_w, &P->fc1_b);
    case OP_FC1: return ts_linear_forward(e, &fc1, &mod2, &P->fc1_w, &P->fc1_b);
    case OP_GELU: return ts_gelu_forward(e, &gelu, &fc1);
    default: return ts_linear_forward(e, &fc2, &gelu, &P->fc2_w, &P->fc2_b);
    }
}

/* reps calls of op, then the device synchronised (a GPU's calls are queued: the time is the
 * device's, not the launches'); seconds per call, or < 0 on an error. */
static double op_calls_s(ts_dit_t *m, int op, int B, int reps) {
    double t0 = ts_now_s();
    for (int i = 0; i < reps; i++)
        if (block_op(m, op, B) != TS_OK)
            return -1.0;
    if (ts_engine_sync(m->eng) != TS_OK)
        return -1.0;
    return (ts_now_s() - t0) / reps;
}

/* Median seconds of one call of op over at least 0.3 s (or o->seconds / 4) and 5 measurements,
 * each of enough calls back to back (then a synchronisation) to last about a millisecond, so a
 * GPU's synchronisation does not count in a short op's time. */
static double time_op(ts_dit_t *m, int op, int B, const opts_t *o) {
    double budget = o->seconds / 4 > 0.3 ? o->seconds / 4 : 0.3, t[4096];
    int n = 0;
    double one = op_calls_s(m, op, B, 2); /* warm-up, and the size of a call */
    if (one < 0)
        return -1.0;
    int reps = one > 0 && one < 1e-3 ? (int)(1e-3 / one) + 1 : 1;
    reps = reps > 1000 ? 1000 : reps;
    for (double start = ts_now_s(); n < 4096 && (n < 5 || ts_now_s() - start < budget); n++)
        if ((t[n] = op_calls_s(m, op, B, reps)) < 0)
            return -1.0;
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return t[n / 2];
}

/* One forward at B (to fill the activations), then each op of a block timed alone: ms per call,
 * ms per forward (× calls per block × depth) and its share of the forward's median time. */
static int ops_breakdown(FILE *out, ts_dit_t *m, int B, double forward_s, const opts_t *o) {
    job_t j;
    int rc = job_inputs(&j, m, B, 99);
    if (rc == TS_OK)
        rc = job_run(&j);
    job_free(&j);
    if (rc != TS_OK)
        return rc;
    int depth = m->cfg.depth;
    fprintf(out, "ops at B=%d (block 0, each alone; per forward = x calls per block x %d blocks)\n",
            B, depth);
    double sum = 0.0;
    for (int op = 0; op < OP_COUNT; op++) {
        double s = time_op(m, op, B, o);
        if (s < 0)
            return TS_EINVAL;
        double per_fwd = s * op_calls[op] * depth;
        sum += per_fwd;
        fprintf(out, "  %-22s %9.3f ms/call  %9.3f ms/forward  %5.1f %%\n", op_names[op], s * 1e3,
                per_fwd * 1e3, 100.0 * per_fwd / forward_s);
    }
    fprintf(out,
            "  %-22s %9s            %9.3f ms/forward  %5.1f %%  (embeddings, final layer, "
            "calls' overhead)\n",
            "rest", "", (forward_s - sum) * 1e3, 100.0 * (forward_s - sum) / forward_s);
    return TS_OK;
}

/* ---- the run ---------------------------------------------------------------------------- */

/* Builds the model of the file for max_batch samples (trainable or not) with the run's precision
 * and attention; 0, or the exit status after saying why. */
static int open_model(const opts_t *o, const ts_st_file_t *f, ts_engine_t *e, int max_batch,
                      int trainable, const mem_report_t *mr, ts_dit_t *m) {
    char err[ERRLEN] = "";
    int rc = ts_dit_open_file(m, f, e, max_batch, trainable, err, sizeof err);
    if (rc == TS_OK && o->precision != TS_PREC_F32 &&
        (rc = ts_dit_set_precision(m, o->precision, err, sizeof err)) != TS_OK) {
        ts_dit_free(m);
        return fail("--precision", rc, err);
    }
    if (rc == TS_OK && o->attn_set && (rc = ts_dit_set_attention(m, o->attn)) != TS_OK) {
        int nomem = rc == TS_ENOMEM;
        ts_dit_free(m);
        if (!nomem)
            return fail("--attention", rc,
                        rc != TS_ENOTSUP               ? NULL
                        : o->precision == TS_PREC_F16  ? "no fused f16 attention on this engine "
                                                         "(a GPU of sm_75 or later has one)"
                        : o->precision == TS_PREC_BF16 ? "no fused bf16 attention on this engine"
                        : e->device == TS_CUDA         ? "the GPU's fused kernel takes heads of up "
                                                         "to 128 and batches of up to 65535"
                                                       : NULL);
    }
    if (rc == TS_OK && o->graphs && !trainable)
        ts_dit_set_graphs(m, 1);
    if (rc == TS_OK && have_measured && trainable && epilogues_before != -1)
        (void)ts_cuda_set_epilogues(e, epilogues_before); /* the training row as before */
    if (rc == TS_OK && o->measure && !trainable) { /* after --graphs: the tune decides them */
        int tb = 0;                                /* the largest row's batch (not the check's) */
        for (int i = 0; i < o->n_batches; i++)
            tb = o->batches[i] > tb ? o->batches[i] : tb;
        tb = tb > 0 && tb <= max_batch ? tb : max_batch;
        epilogues_before = ts_cuda_epilogues(e);
        rc = ts_dit_tune(m, tb, 5, &measured);
        if (rc == TS_OK) {
            have_measured = 1;
            fprintf(stderr, "bench_dit: measured at batch %d: %s\n", tb, measured.note);
        } else {
            ts_dit_free(m);
            return fail("--attention measure", rc,
                        rc == TS_ENOMEM ? "no memory for the measurement's inputs and layouts"
                                        : NULL);
        }
    }
    if (rc == TS_ENOMEM) {
        say_short(trainable ? "training" : "forward", max_batch,
                  trainable ? mr->train_need : mr->fwd_need, mr);
        return 1;
    }
    return rc == TS_OK ? 0 : fail(o->weights, rc, err);
}

static int run(const opts_t *o) {
    char err[ERRLEN] = "";
    ts_st_file_t f;
    memset(&f, 0, sizeof f);
    ts_st_file_t cf;
    memset(&cf, 0, sizeof cf);
    int fwd_batch = 0, rc, status = 0;
    for (int i = 0; i < o->n_batches; i++)
        fwd_batch = o->batches[i] > fwd_batch ? o->batches[i] : fwd_batch;
    if (o->check) {
        if ((rc = ts_st_read(o->check, &cf, err, sizeof err)) != TS_OK)
            return fail(o->check, rc, err);
        int b = check_batch(&cf);
        if (b < 0) {
            ts_st_free(&cf);
            return fail(o->check, b, "needs a 1-D tensor t");
        }
        fwd_batch = b > fwd_batch ? b : fwd_batch;
    }
    ts_dit_config_t cfg;
    if ((rc = ts_st_read(o->weights, &f, err, sizeof err)) != TS_OK ||
        (rc = ts_dit_config_from_file(&f, &cfg, err, sizeof err)) != TS_OK) {
        ts_st_free(&f);
        ts_st_free(&cf);
        return fail(o->weights, rc, err);
    }
    ts_engine_t e;
    if ((rc = start_engine(o, &e)) != 0) {
        ts_st_free(&f);
        ts_st_free(&cf);
        return rc;
    }
    mem_report_t mr;
    if ((rc = mem_report(o, &e, &cfg, fwd_batch, &mr)) != TS_OK) {
        status = fail(o->weights, rc, "the model's memory");
        goto done;
    }
    FILE *out = stdout;
    if (o->memory) { /* the figures alone: nothing built, nothing timed */
        if (o->json) {
            fprintf(out, "{\n  \"precision\": \"%s\",\n  \"attention\": \"%s\",\n",
                    ts_precision_name(o->precision),
                    o->attn_set && o->attn == TS_ATTN_FUSED ? "fused" : "composed");
            print_memory_json(out, &mr);
            /* each row on its own: a bench_dit run builds one model per row kind */
            fprintf(out, "  \"rows\": [");
            for (int i = 0; i < o->n_batches; i++) {
                uint64_t n = ts_dit_memory_total(&mr.m, 0, o->batches[i]);
                fprintf(out,
                        "%s\n    {\"what\": \"forward\", \"batch\": %d, \"bytes\": %llu, "
                        "\"fits\": %s}",
                        i ? "," : "", o->batches[i], (unsigned long long)n,
                        fits(&mr, n) ? "true" : "false");
            }
            if (o->train_batch > 0) { /* bytes null: a config that cannot be trained */
                char bytes[32] = "null";
                if (mr.m.can_train)
                    snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)mr.train_need);
                fprintf(out,
                        "%s\n    {\"what\": \"train\", \"batch\": %d, \"bytes\": %s, "
                        "\"fits\": %s}",
                        o->n_batches ? "," : "", o->train_batch, bytes,
                        fits(&mr, mr.train_need) ? "true" : "false");
            }
            fprintf(out, "\n  ]\n}\n");
        } else {
            print_memory(out, &mr);
        }
        goto done;
    }

    double flops = ts_dit_flops_per_sample(&cfg);
    model_desc_t md = {0};
    check_t ck = {0};
    result_t res[MAX_BATCHES + 1];
    memset(res, 0, sizeof res);
    int nr = 0;
    /* the forward rows (and the check) on a model that cannot train, sized for the largest; a row
     * that cannot fit is refused before anything is allocated */
    ts_dit_t m;
    if (!fits(&mr, mr.fwd_need)) {
        say_short("forward", fwd_batch, mr.fwd_need, &mr);
        status = 1;
        goto done;
    }
    if ((status = open_model(o, &f, &e, fwd_batch, 0, &mr, &m)) != 0)
        goto done;
    md = describe(&m);
    if (!o->json) {
        print_header(out, o, &md, &e, flops);
        print_memory(out, &mr);
    }
    if (o->check) {
        rc = run_check(&m, &cf, &ck, err, sizeof err);
        if (rc != TS_OK) {
            ts_dit_free(&m);
            status = fail(o->check, rc, err);
            goto done;
        }
        if (!o->json)
            print_check(out, o, &ck);
        if (!(ck.rel <= o->tol)) {
            fprintf(stderr,
                    "bench_dit: the forward output differs from %s by %.3e (relative; "
                    "tolerance %.0e): not the same computation, nothing timed\n",
                    o->check, ck.rel, o->tol);
            ts_dit_free(&m);
            status = 3;
            goto done;
        }
    }
    for (int i = 0; i < o->n_batches; i++) {
        job_t j;
        result_t *r = &res[nr];
        int64_t launches = m.graphs.launches;
        rc = job_inputs(&j, &m, o->batches[i], 100 + (uint64_t)i);
        if (rc == TS_OK)
            rc = time_job(&j, o, &r->t);
        job_free(&j);
        r->graph_launches = m.graphs.launches - launches;
        if (rc == TS_OK && o->graphs && m.graphs.on != 1 && !have_measured)
            fprintf(stderr, "bench_dit: --graphs: %s; batch %d ran eagerly\n",
                    e.device != TS_CUDA ? "a CPU engine has no CUDA graphs"
                                        : "a capture failed, graphs are off for this model",
                    o->batches[i]);
        if (rc != TS_OK) {
            ts_dit_free(&m);
            snprintf(err, sizeof err, "batch %d", o->batches[i]);
            status = fail("forward", rc, err);
            goto done;
        }
        r->what = "forward";
        r->batch = o->batches[i];
        r->samples_per_s = r->batch / r->t.median;
        r->gflops = flops * r->samples_per_s / 1e9;
        if (!o->json)
            print_result(out, r);
        if (o->ops && !o->json && m.precision == TS_PREC_F32 &&
            (rc = ops_breakdown(out, &m, r->batch, r->t.median, o)) != TS_OK) {
            ts_dit_free(&m);
            status = fail("--ops", rc, NULL);
            goto done;
        }
        nr++;
    }
    ts_dit_free(&m); /* before the training row's model: each row's memory alone */

    if (o->train_batch > 0) {
        /* a trainable model for the training batch, from the file's parameters */
        if (!fits(&mr, mr.train_need)) {
            say_short("training", o->train_batch, mr.train_need, &mr);
            status = 1;
            goto done;
        }
        if ((status = open_model(o, &f, &e, o->train_batch, 1, &mr, &m)) != 0)
            goto done;
        ts_dataset_t ds;
        ts_train_config_t tc;
        ts_trainer_t tr;
        ts_train_config_default(&tc);
        tc.batch = o->train_batch;
        tc.graphs = o->graphs;
        rc = synthetic_data(&m.cfg, &ds);
        if (rc == TS_OK && (rc = ts_trainer_init(&tr, &m, &ds, &tc)) == TS_OK) {
            job_t j = {.m = &m, .tr = &tr, .B = o->train_batch};
            rc = time_job(&j, o, &res[nr].t);
            res[nr].graph_launches = tr.graphs.launches;
            if (rc == TS_OK && o->graphs && (e.device != TS_CUDA || tr.graphs.on != 1))
                fprintf(stderr, "bench_dit: --graphs: %s; the training row ran eagerly\n",
                        e.device != TS_CUDA ? "a CPU engine has no CUDA graphs"
                                            : "the step's capture failed");
            ts_trainer_free(&tr);
        }
        ts_dataset_free(&ds);
        ts_dit_free(&m);
        if (rc == TS_ENOMEM) {
            say_short("training", o->train_batch, mr.train_need, &mr);
            status = 1;
            goto done;
        }
        if (rc != TS_OK) {
            snprintf(err, sizeof err, "batch %d", o->train_batch);
            status = fail("training step", rc, err);
            goto done;
        }
        result_t *r = &res[nr++];
        r->what = "train";
        r->batch = o->train_batch;
        r->samples_per_s = r->batch / r->t.median;
        r->gflops = 3.0 * flops * r->samples_per_s / 1e9;
        if (!o->json)
            print_result(out, r);
    }
    peak_res_t pk = {0};
    if (o->peak > 0) { /* after the rows, so that they run on a device that has not worked yet */
        pk.size = o->peak;
        double min_time = o->quick ? 0.02 : 0.2;
        if ((rc = ts_gemm_peak(&e, o->peak, min_time, 0, &pk.f32)) != TS_OK) {
            status = fail("--peak", rc, "fp32");
            goto done;
        }
        if (ts_engine_precision_check(&e, TS_PREC_BF16, NULL, 0) == TS_OK &&
            ts_gemm_peak(&e, o->peak, min_time, 1, &pk.bf16) != TS_OK)
            pk.bf16 = 0.0; /* bf16 said it could run but did not: no bf16 peak */
        if (md.precision == TS_PREC_F16 &&
            (rc = ts_gemm_peak(&e, o->peak, min_time, TS_PREC_F16, &pk.f16)) != TS_OK) {
            status = fail("--peak", rc, "f16");
            goto done;
        }
        if (!o->json) {
            fprintf(out, "peak:    %d³ GEMM on this engine: fp32 %.1f GFLOP/s", pk.size, pk.f32);
            if (pk.bf16 > 0)
                fprintf(out, ", bf16 %.1f GFLOP/s", pk.bf16);
            if (pk.f16 > 0)
                fprintf(out, ", f16 %.1f GFLOP/s", pk.f16);
            fprintf(out, "\n");
            /* each row against the peak of its own precision, where it was measured */
            double own = md.precision == TS_PREC_BF16  ? pk.bf16
                         : md.precision == TS_PREC_F16 ? pk.f16
                                                       : pk.f32;
            const char *of = own > 0 ? ts_precision_name(md.precision) : "f32";
            for (int i = 0; i < nr; i++)
                fprintf(out, "  %-8s B=%-3d %5.1f %% of the %s peak\n", res[i].what, res[i].batch,
                        100.0 * res[i].gflops / (own > 0 ? own : pk.f32), of);
        }
    }
    if (o->json)
        print_json(out, o, &md, &e, flops, &ck, res, nr, &pk, &mr);
done:
    ts_st_free(&f);
    ts_st_free(&cf);
    ts_engine_free(&e);
    return status;
}

/* ---- command line ----------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: bench_dit --weights FILE [--threads N] [--batch B ...] [--train-batch B]\n"
        "                 [--seconds S] [--quick] [--check FILE] [--tol X] [--json]\n"
        "                 [--precision f32|bf16|f16] [--attention fused|composed|measure] [--ops]\n"
        "                 [--device cpu|cuda[:N]] [--peak N] [--memory] [--graphs]\n"
        "       bench_dit --attention-ops B [--threads N] [--seconds S] [--quick] [--json]\n"
        "\n"
        "Forward samples/s of the DiT in FILE at each batch, and training samples/s (a full\n"
        "ts_trainer_step on random images) at the training batch, on the CPU engine or a\n"
        "CUDA GPU (--device).\n"
        "\n"
        "  --weights FILE     a DiT safetensors file (config in its __metadata__)\n"
        "  --threads N        engine threads (default: one per online core)\n"
        "  --batch B          a forward batch size; repeat for several (default: 1 and 64)\n"
        "  --train-batch B    training batch size; 0 = no training measurement (default 64)\n"
        "  --seconds S        timed seconds per measurement, after a warm-up (default 2)\n"
        "  --quick            a smoke run: short warm-up, 0.3 s unless --seconds, 3 calls\n"
        "  --ops              after each f32 forward row, each op of a block timed alone\n"
        "                     (calls back to back, then the device synchronised)\n"
        "  --memory           only the memory figures (from the config: parameters, per\n"
        "                     sample for inference and training, each row's total) against the\n"
        "                     device's usable memory; nothing is built or timed (with --json: a\n"
        "                     document with \"memory\")\n"
        "  --check FILE       first compare one forward on FILE's x, t, y with its v; exit 3\n"
        "                     when they differ by more than the tolerance\n"
        "  --tol X            tolerance of --check, relative to max(1, max|v|) (default 1e-4)\n"
        "  --json             print one JSON document instead of the table\n"
        "  --precision P      f32 (default), bf16 or f16: the products, forward and training\n"
        "                     (fp32 masters and optimiser; f16 training scales the loss;\n"
        "                     the CPU emulates f16)\n"
        "  --attention A      fused or composed: the model's attention (default: the model's\n"
        "                     own choice, see ts_dit_set_attention; a GPU: composed, fused in "
        "fp32);\n"
        "                     measure: ts_dit_tune at the largest --batch chooses it (and, on\n"
        "                     a GPU, the cuBLASLt epilogues and graphs) for the forward rows,\n"
        "                     the training row keeps the default; JSON: \"measured\"\n"
        "  --device D         cpu (default), cuda or cuda:N: the engine; each timed call ends\n"
        "                     with the device synchronised\n"
        "  --graphs           the rows through CUDA graphs: a forward row's forward\n"
        "                     (ts_dit_set_graphs) and the training row's forward and\n"
        "                     backward (ts_train_config_t graphs), each captured on its second\n"
        "                     call, then one launch; JSON: each row's \"graph_launches\");\n"
        "                     a CPU engine ignores it\n"
        "  --peak N           after the rows, the engine's N³ GEMM peak (fp32; bf16 where it\n"
        "                     runs; f16 in an f16 run) and each row as a fraction of its\n"
        "                     precision's peak (JSON: \"peak\")\n"
        "  --attention-ops B  no model: time the attention ops alone, composed against fused,\n"
        "                     at batch B (tiny's and small's heads, T = 64 and 256; forward\n"
        "                     f32, forward+backward f32, forward bf16 where it runs)\n"
        "  -h, --help         show this text\n");
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || errno || end == s || *end != '\0' || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    opts_t o = {.train_batch = 64,
                .seconds = -1,
                .tol = 1e-4,
                .warmup_calls = 3,
                .warmup_seconds = 0.2,
                .min_calls = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            o.json = 1;
            continue;
        } else if (strcmp(a, "--ops") == 0) {
            o.ops = 1;
            continue;
        } else if (strcmp(a, "--memory") == 0) {
            o.memory = 1;
            continue;
        } else if (strcmp(a, "--graphs") == 0) {
            o.graphs = 1;
            continue;
        } else if (strcmp(a, "--quick") == 0) {
            o.quick = 1;
            o.warmup_calls = 1;
            o.warmup_seconds = 0.05;
            o.min_calls = 3;
            continue;
        } else if (strcmp(a, "--weights") == 0) {
            bad = !v;
            o.weights = v;
        } else if (strcmp(a, "--check") == 0) {
            bad = !v;
            o.check = v;
        } else if (strcmp(a, "--threads") == 0) {
            bad = parse_int(v, 1, 1024, &o.threads);
        } else if (strcmp(a, "--batch") == 0) {
            bad = o.n_batches == MAX_BATCHES || parse_int(v, 1, 65536, &o.batches[o.n_batches]);
            o.n_batches += !bad;
        } else if (strcmp(a, "--train-batch") == 0) {
            bad = parse_int(v, 0, 65536, &o.train_batch);
        } else if (strcmp(a, "--seconds") == 0) {
            bad = parse_double(v, 0.0, 3600.0, &o.seconds);
        } else if (strcmp(a, "--precision") == 0) {
            bad = ts_precision_parse(v, &o.precision) != TS_OK || !v;
        } else if (strcmp(a, "--attention") == 0) {
            bad = !v || (strcmp(v, "fused") != 0 && strcmp(v, "composed") != 0 &&
                         strcmp(v, "measure") != 0);
            o.measure = v && strcmp(v, "measure") == 0;
            o.attn_set = !o.measure;
            o.attn = v && strcmp(v, "composed") == 0 ? TS_ATTN_COMPOSED : TS_ATTN_FUSED;
        } else if (strcmp(a, "--peak") == 0) {
            bad = parse_int(v, 1, 16384, &o.peak);
        } else if (strcmp(a, "--device") == 0) {
            bad = !v;
            o.device = v;
        } else if (strcmp(a, "--attention-ops") == 0) {
            bad = parse_int(v, 1, 4096, &o.attention_ops);
        } else if (strcmp(a, "--tol") == 0) {
            bad = parse_double(v, 0.0, 1.0, &o.tol);
        } else {
            fprintf(stderr, "bench_dit: unknown option '%s' (see bench_dit --help)\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "bench_dit: %s needs a valid value (got '%s'; see bench_dit --help)\n",
                    a, v ? v : "");
            return 2;
        }
        i++;
    }
    if (o.seconds < 0 && o.attention_ops)
        o.seconds = o.quick ? 0.3 : 2.0;
    if (o.attention_ops)
        return run_attention_ops(&o);
    if (!o.weights) {
        fprintf(stderr, "bench_dit: --weights FILE is required (see bench_dit --help)\n");
        return 2;
    }
    if (o.seconds < 0)
        o.seconds = o.quick ? 0.3 : 2.0;
    if (o.n_batches == 0) {
        o.batches[0] = 1;
        o.batches[1] = 64;
        o.n_batches = 2;
    }
    return run(&o);
}
