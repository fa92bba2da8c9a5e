/*
 * uvutil.c — the tests' libuv helpers (uvutil.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/uvutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static void guard_cb(uv_timer_t *t) { *(int *)t->data = 1; }

void tu_run_until(uv_loop_t *loop, int (*pred)(void *), void *arg, int wait_ms, const char *what) {
    uv_timer_t guard;
    int fired = 0, ok;
    uv_timer_init(loop, &guard);
    guard.data = &fired;
    uv_timer_start(&guard, guard_cb, (uint64_t)wait_ms, 0);
    while (!(ok = pred(arg)) && !fired)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&guard, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    if (!ok) {
        print_error("waited %d ms for: %s\n", wait_ms, what);
        fail();
    }
}

static int flag_set(void *arg) { return *(const int *)arg != 0; }

void tu_run_until_flag(uv_loop_t *loop, const int *flag, int wait_ms, const char *what) {
    tu_run_until(loop, flag_set, (void *)flag, wait_ms, what);
}
