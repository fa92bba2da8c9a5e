/*
 * pool.h — internal: the CPU engine's worker pool.
 *
 * A fixed set of threads that split one range [0, n) among themselves and the caller, then
 * wait. One job at a time: ts_pool_for is called from the engine's compute thread only, and
 * returns when every chunk is done. Small ranges (below `grain` items per thread) run inline on
 * the caller, so tiny ops pay no synchronisation.
 */
#ifndef TS_CPU_POOL_H
#define TS_CPU_POOL_H

#include <stdint.h>

typedef struct ts_pool ts_pool_t;

/* fn processes items [lo, hi) */
typedef void (*ts_pool_fn)(void *ctx, int64_t lo, int64_t hi);

/* Starts threads-1 workers (the caller is the last one). *out owned by the caller: free with
 * ts_pool_free. */
int ts_pool_new(int threads, ts_pool_t **out);
void ts_pool_free(ts_pool_t *p);
int ts_pool_threads(const ts_pool_t *p);
/* Runs fn over [0, n) split into contiguous chunks, at least `grain` items each. */
void ts_pool_for(ts_pool_t *p, int64_t n, int64_t grain, ts_pool_fn fn, void *ctx);
/* The chunks ts_pool_for would make, run one after another on the caller, waking no thread: for
 * work too small to pay for a wake-up, when where the chunks are cut may change the result. */
void ts_pool_for_inline(ts_pool_t *p, int64_t n, int64_t grain, ts_pool_fn fn, void *ctx);

#endif
