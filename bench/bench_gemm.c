/*
 * bench_gemm.c — the GEMM benchmark as a standalone program (also `tessera bench gemm`).
 *
 * All of the work is in gemm_bench.c; see docs/benchmarks.md for the results and how to read
 * them. Usage: bench_gemm [--threads N] [--json] [--quick] [--help].
 */
#include "kernels/gemm_bench.h"

int main(int argc, char **argv) { return ts_gemm_bench_main(argc, argv, "bench_gemm"); }
