/*
 * uvutil.h — the libuv helpers of the tests that run a loop (kept out of testutil.c, which every
 * test links, so that the tests without libuv need none).
 */
#ifndef TS_TESTS_UVUTIL_H
#define TS_TESTS_UVUTIL_H

#include <uv.h>

/* Runs loop until pred(arg) is non-zero, one iteration at a time; fails the test (naming what it
 * waited for) after wait_ms. */
void tu_run_until(uv_loop_t *loop, int (*pred)(void *), void *arg, int wait_ms, const char *what);

/* tu_run_until on *flag becoming non-zero. */
void tu_run_until_flag(uv_loop_t *loop, const int *flag, int wait_ms, const char *what);

#endif
