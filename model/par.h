/*
 * par.h — a parallel loop over blocks fixed by the problem size, never by the thread count (the
 * threading of PCA and k-means, model/pca.h and model/kmeans.h): each block writes its own
 * outputs or its own partial sum, combined by the caller in block order, so results are
 * bit-identical for any number of threads.
 */
#ifndef TS_PAR_H
#define TS_PAR_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* fn handles block b on worker tid (0 ≤ tid < the threads actually used). */
typedef void (*ts_block_fn)(void *ctx, int64_t b, int tid);

/* Worker count for a loop of nblocks blocks: threads (0 = one per online core, at most 1 024),
 * at most one per block. */
int ts_par_threads(int threads, int64_t nblocks);

/* Runs fn over blocks [0, nblocks): worker t takes blocks t, t + T, t + 2T, ... (T =
 * ts_par_threads). Which worker runs a block never changes what the block computes. A worker
 * that cannot be started has its stripe run by the caller. */
void ts_par_blocks(int threads, int64_t nblocks, ts_block_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif

#endif
