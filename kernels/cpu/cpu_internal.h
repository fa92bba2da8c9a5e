/*
 * cpu_internal.h — internal to the CPU backend (kernels/cpu/cpu_*.c): the grains below which an
 * op runs on the caller alone, and the pool call every op makes.
 */
#ifndef TS_KERNELS_CPU_CPU_INTERNAL_H
#define TS_KERNELS_CPU_CPU_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "kernels/cpu/pool.h"

/* Below this many elements per thread, an elementwise op runs on the caller alone. */
#define GRAIN_ELEMS 32768
/* The same for GELU, SiLU and softmax (an exp per element). A woken thread must get tens of µs of
 * work: waking it costs about that much (20–80 µs measured on the 2-vCPU VM under load). */
#define ACT_GRAIN (GRAIN_ELEMS / 2)

/* Runs fn over [0, n) on the pool with a grain such that each thread gets >= min_per_thread. */
static inline void parallel(ts_engine_t *e, int64_t n, int64_t min_per_thread, ts_pool_fn fn,
                            void *ctx) {
    ts_pool_for(e->pool, n, min_per_thread, fn, ctx);
}

/* *buf (of *cap floats, 64-byte aligned) made to hold n floats: grows by a quarter more, never
 * shrinks, contents not kept. TS_ENOMEM leaves it as it was. */
static inline int ts_cpu_room(float **buf, size_t *cap, int64_t n, float **out) {
    if ((size_t)n > *cap) {
        size_t want = (size_t)n + (size_t)n / 4, bytes = (want * sizeof(float) + 63) & ~(size_t)63;
        float *p = aligned_alloc(64, bytes);
        if (!p)
            return TS_ENOMEM;
        free(*buf);
        *buf = p;
        *cap = want;
    }
    *out = *buf;
    return TS_OK;
}

#endif
