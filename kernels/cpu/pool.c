/*
 * pool.c — the CPU worker pool (see pool.h).
 *
 * Workers sleep on a condition variable and wake for each job, identified by a generation
 * counter; each takes the chunk matching its index, and the last to finish signals the caller.
 * Chunks are static (equal sizes): the ops are uniform, so stealing would buy nothing.
 */
#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "base/error.h"

struct ts_pool {
    int threads;
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t done;
    uint64_t generation; /* bumped for each job */
    int pending;         /* workers still running the current job */
    int stop;
    /* the current job */
    ts_pool_fn fn;
    void *ctx;
    int64_t n;
    int chunks;
};

typedef struct {
    ts_pool_t *pool;
    int index; /* 1..threads-1; the caller takes chunk 0 */
} worker_arg_t;

static void chunk_range(int64_t n, int chunks, int i, int64_t *lo, int64_t *hi) {
    *lo = n * i / chunks;
    *hi = n * (i + 1) / chunks;
}

static void *worker_main(void *arg) {
    worker_arg_t wa = *(worker_arg_t *)arg;
    free(arg);
    ts_pool_t *p = wa.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        ts_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        int64_t n = p->n;
        int chunks = p->chunks;
        pthread_mutex_unlock(&p->mu);
        if (wa.index < chunks) {
            int64_t lo, hi;
            chunk_range(n, chunks, wa.index, &lo, &hi);
            fn(ctx, lo, hi);
        }
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ts_pool_new(int threads, ts_pool_t **out) {
    if (!out || threads < 1 || threads > 1024)
        return TS_EINVAL;
    ts_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return TS_ENOMEM;
    p->threads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (threads > 1) {
        p->workers = calloc((size_t)threads - 1, sizeof *p->workers);
        if (!p->workers) {
            ts_pool_free(p);
            return TS_ENOMEM;
        }
    }
    for (int i = 1; i < threads; i++) {
        worker_arg_t *wa = malloc(sizeof *wa);
        if (wa) {
            wa->pool = p;
            wa->index = i;
        }
        if (!wa || pthread_create(&p->workers[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->threads = i; /* only workers 1..i-1 exist */
            ts_pool_free(p);
            return TS_ENOMEM;
        }
    }
    *out = p;
    return TS_OK;
}

void ts_pool_free(ts_pool_t *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->threads; i++)
        pthread_join(p->workers[i - 1], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int ts_pool_threads(const ts_pool_t *p) { return p ? p->threads : 1; }

/* How many chunks n items make with at least grain each: at most one per thread. */
static int chunk_count(const ts_pool_t *p, int64_t n, int64_t grain) {
    if (grain < 1)
        grain = 1;
    int64_t want = n / grain;
    return (!p || want < 2) ? 1 : (int)(want < p->threads ? want : p->threads);
}

void ts_pool_for_inline(ts_pool_t *p, int64_t n, int64_t grain, ts_pool_fn fn, void *ctx) {
    if (n <= 0)
        return;
    int chunks = chunk_count(p, n, grain);
    for (int i = 0; i < chunks; i++) {
        int64_t lo, hi;
        chunk_range(n, chunks, i, &lo, &hi);
        fn(ctx, lo, hi);
    }
}

void ts_pool_for(ts_pool_t *p, int64_t n, int64_t grain, ts_pool_fn fn, void *ctx) {
    if (n <= 0)
        return;
    int chunks = chunk_count(p, n, grain);
    if (chunks == 1) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunks = chunks;
    p->pending = p->threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    int64_t lo, hi;
    chunk_range(n, chunks, 0, &lo, &hi);
    fn(ctx, lo, hi);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
