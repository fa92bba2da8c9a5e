/*
 * bench_sgemm_peer.c — OpenBLAS's sgemm against oneDNN's (dnnl_sgemm), one thread each, on the
 * products the CPU engine makes for a DiT expert: is oneDNN's fp32 GEMM faster for our shapes?
 *
 * The engine runs every product as single-threaded BLAS calls on its own workers (one per core),
 * so the comparison that matters is one call on one thread, of the shapes those calls have: for
 * each linear of `tiny` and `small` the forward (out = inp · Wᵀ), the input gradient (dinp = dout ·
 * W) and the weight gradient (dW = doutᵀ · inp), with rows = the tokens of one sample (the call a
 * per-sample linear makes) and of 64 samples (a batched one), and the attention's two products per
 * head. Each shape: a warm-up, then calls until --seconds, median call; GFLOP/s of both, and
 * oneDNN / OpenBLAS. The kernel set OpenBLAS runs is printed (blas_core.h: this program too is
 * re-executed with the CPU's best when OpenBLAS chose weaker). --json for a document.
 *
 * --invariance instead asks whether each library is batch-invariant on those shapes — the
 * property every served answer rests on: for each product whose rows are samples' tokens (the
 * forward and the input gradient), C of all M rows is computed once, then rows [r, r + m) alone
 * for several (r, m) (one row, 7 rows at an odd offset, one sample's tokens, half the rows plus
 * 3; those of more than 1200 outputs: the engine pads smaller products up to that, cpu_gemm.c);
 * each must be the same bits as those rows of the whole. Prints per library and shape
 * whether every split matched, and exits 1 when OpenBLAS (what the engine uses) does not.
 */
#define _POSIX_C_SOURCE 200809L

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "kernels/cpu/blas_core.h"

#ifdef TESSERA_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#endif

typedef struct shape {
    const char *config;
    char what[32];
    int ta, tb; /* row-major C (M, N) = op(A) (M, K) · op(B) (K, N) */
    int64_t M, N, K;
} shape_t;

static shape_t mk(const char *config, const char *what, int b, int ta, int tb, int64_t M, int64_t N,
                  int64_t K) {
    shape_t s = {config, "", ta, tb, M, N, K};
    if (b > 0)
        snprintf(s.what, sizeof s.what, "b%d %s", b, what);
    else
        snprintf(s.what, sizeof s.what, "%s", what);
    return s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef void (*gemm_fn)(const shape_t *s, const float *A, const float *B, float *C);

static void run_openblas(const shape_t *s, const float *A, const float *B, float *C) {
    int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                (int)s->M, (int)s->N, (int)s->K, 1.0f, A, (int)lda, B, (int)ldb, 0.0f, C,
                (int)s->N);
}

#ifdef TESSERA_HAVE_DNNL
static void run_dnnl(const shape_t *s, const float *A, const float *B, float *C) {
    int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f,
               C, s->N);
}
#endif

/* Median seconds of one call, over at least `seconds` and 5 calls after a warm-up. */
static double time_gemm(gemm_fn f, const shape_t *s, const float *A, const float *B, float *C,
                        double seconds) {
    static double t[100000];
    for (int i = 0; i < 3; i++)
        f(s, A, B, C);
    int n = 0;
    for (double start = ts_now_s(); n < 100000 && (n < 5 || ts_now_s() - start < seconds); n++) {
        double t0 = ts_now_s();
        f(s, A, B, C);
        t[n] = ts_now_s() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return t[n / 2];
}

#define MAX_SHAPES 128

/* Whether rows [r, r + m) of op(A)·op(B), computed alone, are the bits of those rows of full. */
static int rows_match(gemm_fn f, const shape_t *s, const float *A, const float *B,
                      const float *full, float *C, int64_t r, int64_t m) {
    shape_t sub = *s;
    sub.M = m;
    /* A row-major (M, K), lda = K: the rows start r·K in; B is shared. */
    f(&sub, A + r * s->K, B, C);
    return memcmp(C, full + r * s->N, (size_t)(m * s->N) * sizeof(float)) == 0;
}

/* For each product with rows of tokens: does every split give the bits of the whole? Returns the
 * number of shapes where OpenBLAS did not. */
static int invariance(const shape_t *sh, int n, const float *A, const float *B, float *C,
                      float *full, int json) {
    static const char *const libs[] = {"OpenBLAS", "oneDNN"};
    gemm_fn fns[2] = {run_openblas, NULL};
#ifdef TESSERA_HAVE_DNNL
    fns[1] = run_dnnl;
#endif
    int bad_openblas = 0, first = 1;
    if (json)
        printf("{\n  \"rows\": [\n");
    else
        printf("%-6s %-18s %6s %6s %6s %9s %9s\n", "config", "product", "M", "N", "K", libs[0],
               libs[1]);
    for (int i = 0; i < n; i++) {
        const shape_t *s = &sh[i];
        if (s->ta || s->M < 8) /* rows that are not tokens (weight gradients), or one head */
            continue;
        int64_t T = strstr(s->what, "b64") ? s->M / 64 : s->M;
        int64_t splits[][2] = {{0, 1}, {s->M - 1, 1}, {3, 7}, {T, T < s->M ? T : s->M - T},
                               {s->M / 2 - 3, s->M / 2 + 3}};
        int ok[2] = {1, 1};
        for (int l = 0; l < 2; l++) {
            if (!fns[l]) {
                ok[l] = -1;
                continue;
            }
            fns[l](s, A, B, full);
            for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++)
                /* products of at most 1200 outputs the engine pads past that (cpu_gemm.c) */
                if (splits[k][1] > 0 && splits[k][0] >= 0 && splits[k][0] + splits[k][1] <= s->M &&
                    splits[k][1] * s->N > 1200)
                    ok[l] &= rows_match(fns[l], s, A, B, full, C, splits[k][0], splits[k][1]);
        }
        bad_openblas += ok[0] != 1;
        if (json)
            printf("%s    {\"config\": \"%s\", \"product\": \"%s\", \"m\": %lld, \"n\": %lld, "
                   "\"k\": %lld, \"openblas_invariant\": %s, \"onednn_invariant\": %s}",
                   first ? "" : ",\n", s->config, s->what, (long long)s->M, (long long)s->N,
                   (long long)s->K, ok[0] ? "true" : "false",
                   ok[1] < 0 ? "null" : ok[1] ? "true" : "false");
        else
            printf("%-6s %-18s %6lld %6lld %6lld %9s %9s\n", s->config, s->what, (long long)s->M,
                   (long long)s->N, (long long)s->K, ok[0] ? "yes" : "NO",
                   ok[1] < 0 ? "-" : ok[1] ? "yes" : "NO");
        first = 0;
    }
    if (json)
        printf("\n  ]\n}\n");
    return bad_openblas;
}

static int build(shape_t *sh) {
    static const struct {
        const char *name;
        int64_t hidden, heads, patch;
    } cfgs[] = {{"tiny", 128, 4, 4}, {"small", 256, 4, 2}};
    static const int batches[] = {1, 64};
    int n = 0;
    for (size_t c = 0; c < 2; c++) {
        int64_t g = 28 / cfgs[c].patch, T = g * g, h = cfgs[c].hidden, d = h / cfgs[c].heads;
        for (size_t b = 0; b < 2; b++) {
            int64_t R = batches[b] * T;
            static const char *const lin_names[] = {"qkv", "proj", "fc1", "fc2"};
            int64_t ins[] = {h, h, h, 4 * h}, outs[] = {3 * h, h, 4 * h, h};
            for (int l = 0; l < 4; l++) {
                char w[24];
                snprintf(w, sizeof w, "%s fwd", lin_names[l]);
                sh[n++] = mk(cfgs[c].name, w, batches[b], 0, 1, R, outs[l], ins[l]);
                snprintf(w, sizeof w, "%s dinp", lin_names[l]);
                sh[n++] = mk(cfgs[c].name, w, batches[b], 0, 0, R, ins[l], outs[l]);
                snprintf(w, sizeof w, "%s dweight", lin_names[l]);
                sh[n++] = mk(cfgs[c].name, w, batches[b], 1, 0, outs[l], ins[l], R);
            }
            if (b == 0) { /* attention, one head: q·kᵀ (T, T, d) and p·v (T, d, T) */
                sh[n++] = mk(cfgs[c].name, "head q.kT", 0, 0, 1, T, T, d);
                sh[n++] = mk(cfgs[c].name, "head p.v", 0, 0, 0, T, d, T);
            }
        }
    }
    return n;
}

int main(int argc, char **argv) {
    double seconds = 0.2;
    int json = 0, inv = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--invariance") == 0)
            inv = 1;
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: bench_sgemm_peer [--seconds S] [--invariance] [--json]\n"
                    "OpenBLAS sgemm against oneDNN's dnnl_sgemm, one thread each, on the DiT\n"
                    "engine's product shapes (tiny and small; 1 and 64 samples per call).\n"
                    "--invariance: is a row's result the same bits whatever rows it is computed\n"
                    "with (batch invariance), for each library and shape?\n");
            return strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0 ? 0 : 2;
        }
    }
    openblas_set_num_threads(1);
#ifdef TESSERA_HAVE_DNNL
    omp_set_num_threads(1);
#endif
    ts_blas_status_t bs;
    ts_blas_status(&bs);
    char line[512];
    ts_blas_describe(&bs, line, sizeof line);
    shape_t sh[MAX_SHAPES];
    int n = build(sh);
    int64_t big = 0;
    for (int i = 0; i < n; i++) {
        int64_t m = sh[i].M * sh[i].K > sh[i].K * sh[i].N ? sh[i].M * sh[i].K : sh[i].K * sh[i].N;
        m = m > sh[i].M * sh[i].N ? m : sh[i].M * sh[i].N;
        big = m > big ? m : big;
    }
    float *A = malloc((size_t)big * 4), *B = malloc((size_t)big * 4), *C = malloc((size_t)big * 4);
    if (!A || !B || !C)
        return 1;
    for (int64_t i = 0; i < big; i++)
        A[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f,
        B[i] = (float)((i * 104729) % 997) / 997.0f - 0.5f;
    if (inv) {
        float *full = malloc((size_t)big * 4);
        if (!full)
            return 1;
        if (!json)
            printf("%s\nbatch invariance, one thread each: rows computed alone == the same rows "
                   "of the whole call\n",
                   line);
        int bad = invariance(sh, n, A, B, C, full, json);
        free(full), free(A), free(B), free(C);
        return bad ? 1 : 0;
    }
    if (json)
        printf("{\n  \"blas\": \"%s\",\n  \"openblas_core\": \"%s\",\n  \"seconds\": %g,\n  "
               "\"rows\": [\n",
               line, bs.core, seconds);
    else
        printf("%s\none thread each, median call, GFLOP/s\n%-6s %-18s %6s %6s %6s %9s %9s %7s\n",
               line, "config", "product", "M", "N", "K", "OpenBLAS", "oneDNN", "ratio");
    double lsum = 0, lden = 0; /* geometric mean of the ratios */
    for (int i = 0; i < n; i++) {
        const shape_t *s = &sh[i];
        double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K;
        double to = time_gemm(run_openblas, s, A, B, C, seconds);
        double td = NAN;
#ifdef TESSERA_HAVE_DNNL
        td = time_gemm(run_dnnl, s, A, B, C, seconds);
#endif
        double go = flop / to / 1e9, gd = flop / td / 1e9, r = gd / go;
        if (isfinite(r))
            lsum += log(r), lden += 1;
        if (json)
            printf("    {\"config\": \"%s\", \"product\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": "
                   "%lld, "
                   "\"openblas_gflops\": %.4g, \"onednn_gflops\": %.4g, \"onednn_over_openblas\": "
                   "%.4g}%s\n",
                   s->config, s->what, (long long)s->M, (long long)s->N, (long long)s->K, go,
                   isfinite(gd) ? gd : 0.0, isfinite(r) ? r : 0.0, i + 1 < n ? "," : "");
        else
            printf("%-6s %-18s %6lld %6lld %6lld %9.1f %9.1f %7.2f\n", s->config, s->what,
                   (long long)s->M, (long long)s->N, (long long)s->K, go, gd, r);
        fflush(stdout);
    }
    double gm = lden > 0 ? exp(lsum / lden) : NAN;
    if (json)
        printf("  ],\n  \"geomean_onednn_over_openblas\": %.4g\n}\n", isfinite(gm) ? gm : 0.0);
    else
        printf("geometric mean of oneDNN / OpenBLAS: %.3f\n", gm);
    free(A);
    free(B);
    free(C);
    return 0;
}
