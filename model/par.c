/*
 * par.c — the fixed-block parallel loop of model/par.h.
 */
#define _POSIX_C_SOURCE 200809L

#include "model/par.h"

#include <pthread.h>
#include <unistd.h>

typedef struct {
    ts_block_fn fn;
    void *ctx;
    int64_t nblocks;
    int tid, stride;
} stripe_t;

static void run_stripe(const stripe_t *s) {
    for (int64_t b = s->tid; b < s->nblocks; b += s->stride)
        s->fn(s->ctx, b, s->tid);
}

static void *stripe_main(void *arg) {
    run_stripe(arg);
    return NULL;
}

static int resolve_threads(int threads) {
    if (threads > 0)
        return threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n < 1024 ? n : 1024) : 1;
}

/* Worker count for a loop of nblocks blocks: at most one per block. */
int ts_par_threads(int threads, int64_t nblocks) {
    int t = resolve_threads(threads);
    if (t > 1024)
        t = 1024; /* par_blocks' bound */
    return nblocks < t ? (int)(nblocks > 0 ? nblocks : 1) : t;
}

/* Runs fn over blocks [0, nblocks): worker t takes blocks t, t + T, t + 2T, ... (T = the
 * threads used). Which worker runs a block never changes what the block computes. A worker that
 * cannot be started has its stripe run by the caller. */
void ts_par_blocks(int threads, int64_t nblocks, ts_block_fn fn, void *ctx) {
    enum { MAX_T = 1024 };
    int T = ts_par_threads(threads, nblocks);
    stripe_t stripes[MAX_T];
    pthread_t tids[MAX_T];
    int started[MAX_T];
    for (int t = 0; t < T; t++) {
        stripes[t] = (stripe_t){fn, ctx, nblocks, t, T};
        started[t] = t > 0 && pthread_create(&tids[t], NULL, stripe_main, &stripes[t]) == 0;
    }
    for (int t = 0; t < T; t++)
        if (!started[t])
            run_stripe(&stripes[t]);
    for (int t = 1; t < T; t++)
        if (started[t])
            pthread_join(tids[t], NULL);
}
