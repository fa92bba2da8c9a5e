/*
 * fwd_gemm.h — which library computes the fp32 forward products of linear layers on the CPU:
 * OpenBLAS (the default), or oneDNN's sgemm (TESSERA_FWD_GEMM=onednn; kernels/cpu/fwd_gemm.c).
 *
 * Why it is a choice. On one thread and hot caches, oneDNN's sgemm beat OpenBLAS's on the DiT's
 * forward products (bench_sgemm_peer). But its result for a row of C depends on the other rows
 * of the call (`bench_sgemm_peer --invariance`), and a served answer must not depend on which
 * requests shared its batch. Two calls of the same shape on the same values give the same bits
 * at any address, so through oneDNN a linear layer computes each item of the batch (a sample's
 * tokens, or a sample's one row) by its own call — as cpu_gemm.c does with OpenBLAS on kernels
 * whose rows depend on their place — and cuts an item's columns in two blocks from 512 columns
 * on (a cut that depends on N alone), so one sample still runs on two threads. Measured in the
 * whole DiT on 2 cores (docs/benchmarks.md, "oneDNN's forward products"): `tiny` at batch 1
 * 1.8× faster, at batch 64 0.93×; `small` 0.95× and 1.0×. The default stays OpenBLAS (batch 64
 * is what training and a loaded server run); a node serving a small model one request at a time
 * may set TESSERA_FWD_GEMM=onednn. Any other value than openblas or onednn is refused with a
 * message at the first product, and OpenBLAS is used; so is onednn in a build without oneDNN.
 */
#ifndef TS_KERNELS_CPU_FWD_GEMM_H
#define TS_KERNELS_CPU_FWD_GEMM_H

#include <stdint.h>

/* 1 when the forward products go through oneDNN (decided once per process). */
int ts_cpu_fwd_onednn(void);

/* What computes the fp32 forward products of linear layers, for logs and selfcheck: "oneDNN 2.6.3
 * sgemm, one call per item" (TESSERA_FWD_GEMM=onednn), "register tiles, AVX-512
 * (kernels/cpu/lin_tile.c)" or "…, AVX2 (…)" (a CPU with FMA, the build TESSERA_CPU_ISA allows),
 * else "OpenBLAS". */
const char *ts_cpu_fwd_gemm_name(void);

/* C (M, N) = A (M, K) · Bᵀ (B stored (N, K)), row strides lda, ldb, ldc; on the calling thread
 * alone. Only when ts_cpu_fwd_onednn(). */
void ts_cpu_onednn_sgemm_nt(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                            const float *B, int64_t ldb, float *C, int64_t ldc);

#endif
