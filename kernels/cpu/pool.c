/*
 * pool.c — the CPU worker pool (see pool.h).
 *
 * Workers wait for each job, identified by a generation counter; each takes the chunk matching
 * its index, and the last to finish signals the caller. Chunks are static (equal sizes): the ops
 * are uniform, so stealing would buy nothing.
 *
 * Waiting: a worker that finished a job first watches the generation for SPIN_S, then sleeps
 * on a condition variable; the caller likewise watches for the workers' end before it sleeps.
 * The ops of a forward pass come tens of µs apart, and waking a sleeping thread costs about that
 * much (20–80 µs on the 2-vCPU VM: a futex wake and, for an idle vCPU, the hypervisor's
 * wake-up), so a pool that always slept paid a wake-up per op — more than a small op's work
 * (tiny at batch 3 ran slower on 2 threads than on 1). A spin is bounded: an idle pool costs
 * SPIN_S of a core per job, then nothing.
 */
#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#include "base/clock.h"
#include "base/error.h"

struct ts_pool {
    int threads;
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t done;
    uint64_t generation; /* bumped for each job (under mu; read atomically while spinning) */
    int pending;         /* workers still running the current job (likewise) */
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

/* How long a thread watches for its next event before it sleeps. */
#define SPIN_S 60e-6

/* One pause of a spin that began at t0, at iteration i; 1 when the spin is over. The first
 * SPIN_PAUSES iterations only pause the core; after them each yields it (sched_yield), so that
 * a thread of another process sharing the cores (four daemons on two, in bench_netgen) runs
 * instead of waiting on a spinner. */
#define SPIN_PAUSES 256
static int relax(int i, double t0) {
    if (i < SPIN_PAUSES) {
        CPU_RELAX();
        return 0;
    }
    sched_yield();
    return ts_now_s() - t0 > SPIN_S;
}

/* Watches up to SPIN_S while *v == unchanged and *stop is 0 (the caller then re-checks under
 * the mutex and sleeps if nothing came). */
static void spin_while_u64(const uint64_t *v, uint64_t unchanged, const int *stop) {
    double t0 = ts_now_s();
    for (int i = 1; __atomic_load_n(v, __ATOMIC_ACQUIRE) == unchanged &&
                    !__atomic_load_n(stop, __ATOMIC_ACQUIRE) && !relax(i, t0);
         i++)
        ;
}

/* Watches up to SPIN_S while *v is not 0 (likewise). */
static void spin_while_nonzero(const int *v) {
    double t0 = ts_now_s();
    for (int i = 1; __atomic_load_n(v, __ATOMIC_ACQUIRE) != 0 && !relax(i, t0); i++)
        ;
}

static void *worker_main(void *arg) {
    worker_arg_t wa = *(worker_arg_t *)arg;
    free(arg);
    ts_pool_t *p = wa.pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (!p->stop && p->generation == seen) { /* watch a while before sleeping */
            pthread_mutex_unlock(&p->mu);
            spin_while_u64(&p->generation, seen, &p->stop);
            pthread_mutex_lock(&p->mu);
        }
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
        if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_ACQ_REL) == 0)
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
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
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
    __atomic_store_n(&p->pending, p->threads - 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&p->generation, 1, __ATOMIC_ACQ_REL);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    int64_t lo, hi;
    chunk_range(n, chunks, 0, &lo, &hi);
    fn(ctx, lo, hi);

    spin_while_nonzero(&p->pending);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
