/*
 * gemm_bench.h — the GEMM benchmark, shared by `bench_gemm` and `tessera bench gemm`.
 *
 * Times every matrix product of a DiT expert of the `tiny` and `small` configs (architecture.md §9)
 * at batch 1 and 64 — forward and both backward products — through the project's own ops on a CPU
 * engine, next to the sgemm peak measured in the same run on a large square product. See
 * docs/benchmarks.md for how to read the table. It is not a model benchmark: no layer but the GEMMs
 * runs, and attention's products run on contiguous per-head buffers.
 */
#ifndef TS_GEMM_BENCH_H
#define TS_GEMM_BENCH_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_gemm_bench_opts {
    int threads;        /* CPU engine threads; 0 = one per online core */
    int json;           /* 1: one JSON document on `out` instead of the table */
    int quick;          /* 1: shorter timing windows (a smoke run, not a measurement) */
    const char *config; /* "tiny" or "small" to run only that config; NULL = both */
    int peak_size;      /* edge of the square peak product; 0 = 2048 */
    double min_time;    /* seconds of timed calls per shape; 0 = 0.2 (0.02 with quick) */
    FILE *out;          /* where the results go; NULL = stdout */
} ts_gemm_bench_opts_t;

/* Runs the benchmark. Returns 0, or a negative TS_E* code when an engine or tensor could not be
 * made or an op failed (the message has then been printed to stderr); TS_EINVAL for an unknown
 * config name. */
int ts_gemm_bench_run(const ts_gemm_bench_opts_t *opts);

/* The engine's GEMM peak as this benchmark measures it: a square size³ product (prec, a
 * ts_precision_t: fp32, or bf16 or f16 operands) of random matrices through ts_matmul (_bf16,
 * _f16) on e, the best of the timed calls
 * after a warm-up (about 5 × min_time seconds; 0 = 0.2), each ending with the device
 * synchronised; GFLOP/s in *gflops. CPU or CUDA. */
struct ts_engine;
int ts_gemm_peak(struct ts_engine *e, int size, double min_time, int prec, double *gflops);

/* Command-line front end: parses --threads N, --config NAME, --json, --quick, --help from
 * argv[1..argc) and runs. `prog` names the command in messages and the usage text ("bench_gemm",
 * "tessera bench gemm"). Returns a process exit code: 0 ok, 1 failure, 2 bad usage. */
int ts_gemm_bench_main(int argc, char **argv, const char *prog);

#ifdef __cplusplus
}
#endif

#endif
