/*
 * test_pool.c — the CPU engine's worker pool (kernels/cpu/pool.h): every item of every job runs
 * exactly once, whether the workers are still watching for the next job (jobs back to back) or
 * asleep (jobs far apart); ts_pool_for_inline cuts the same chunks; a pool stops cleanly in
 * either state.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/pool.h"
#include "tests/testutil.h"

#define MAX_N 4096
#define MAX_CHUNKS 64

typedef struct {
    int hits[MAX_N]; /* each written by the one chunk that holds the item */
    int64_t lo[MAX_CHUNKS], hi[MAX_CHUNKS];
    int chunks; /* chunks recorded (atomically) */
} job_t;

static void count(void *arg, int64_t lo, int64_t hi) {
    job_t *j = arg;
    for (int64_t i = lo; i < hi; i++)
        j->hits[i]++;
    int c = __atomic_fetch_add(&j->chunks, 1, __ATOMIC_ACQ_REL);
    if (c < MAX_CHUNKS) {
        j->lo[c] = lo;
        j->hi[c] = hi;
    }
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Sorts a job's recorded chunks by their start, for comparing two cuttings. */
static void sort_chunks(job_t *j) {
    for (int a = 1; a < j->chunks; a++)
        for (int b = a; b > 0 && j->lo[b - 1] > j->lo[b]; b--) {
            int64_t l = j->lo[b], h = j->hi[b];
            j->lo[b] = j->lo[b - 1], j->hi[b] = j->hi[b - 1];
            j->lo[b - 1] = l, j->hi[b - 1] = h;
        }
}

/* One job of n items, grain g: every item once, the chunks contiguous and at most one per thread,
 * and the same chunks as ts_pool_for_inline's. */
static void one_job(ts_pool_t *p, int64_t n, int64_t g) {
    static job_t j, k;
    memset(&j, 0, sizeof j);
    memset(&k, 0, sizeof k);
    ts_pool_for(p, n, g, count, &j);
    for (int64_t i = 0; i < n; i++)
        if (j.hits[i] != 1)
            fail_msg("n %lld grain %lld: item %lld ran %d times", (long long)n, (long long)g,
                     (long long)i, j.hits[i]);
    if (n > 0 && (j.chunks < 1 || j.chunks > ts_pool_threads(p)))
        fail_msg("n %lld grain %lld: %d chunks on %d threads", (long long)n, (long long)g,
                 j.chunks, ts_pool_threads(p));
    ts_pool_for_inline(p, n, g, count, &k);
    sort_chunks(&j);
    sort_chunks(&k);
    assert_int_equal(j.chunks, k.chunks);
    for (int c = 0; c < j.chunks; c++) {
        assert_int_equal(j.lo[c], k.lo[c]);
        assert_int_equal(j.hi[c], k.hi[c]);
        assert_int_equal(j.lo[c], c == 0 ? 0 : j.hi[c - 1]);
    }
}

/* Jobs back to back (the workers catch each while still watching), then with pauses longer than
 * the watch (the workers asleep), then mixed, on 1, 2, 3 and 8 threads. */
static void test_every_item_once(void **state) {
    (void)state;
    tu_rng_t r = {5};
    const int threads[] = {1, 2, 3, 8};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        ts_pool_t *p = NULL;
        TU_CHECK_OK(ts_pool_new(threads[t], &p));
        for (int i = 0; i < 3000; i++)
            one_job(p, 1 + (int64_t)(tu_rng_uniform(&r, 0.0f, 1.0f) * (MAX_N - 1)), 1 + i % 7);
        for (int i = 0; i < 20; i++) {
            sleep_us(300); /* past the workers' watch: they sleep */
            one_job(p, 1 + (int64_t)(tu_rng_uniform(&r, 0.0f, 1.0f) * (MAX_N - 1)), 1);
        }
        for (int i = 0; i < 300; i++) {
            if (tu_rng_uniform(&r, 0.0f, 1.0f) < 0.3)
                sleep_us((long)(tu_rng_uniform(&r, 0.0f, 1.0f) * 150));
            one_job(p, (int64_t)(tu_rng_uniform(&r, 0.0f, 1.0f) * MAX_N), 1 + i % 3);
        }
        ts_pool_free(p);
    }
}

/* A pool freed right after a job (workers watching) and after a pause (workers asleep), and
 * freed without ever running a job. */
static void test_stop(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++) {
        ts_pool_t *p = NULL;
        TU_CHECK_OK(ts_pool_new(4, &p));
        if (k < 2)
            one_job(p, 1000, 1);
        if (k == 1)
            sleep_us(2000);
        ts_pool_free(p);
    }
    ts_pool_t *p = NULL;
    assert_int_not_equal(ts_pool_new(0, &p), 0);
    assert_int_not_equal(ts_pool_new(2, NULL), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once),
        cmocka_unit_test(test_stop),
    };
    return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
