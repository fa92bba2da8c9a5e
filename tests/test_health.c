/*
 * test_health.c — daemon/health.h: the alone and refused states on a fake clock, the likely
 * causes named for each kind of failed handshake, the log's rate limits (per IP, per window, the
 * suppressed count reported), and the rejoin cadence of an alone node.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/health.h"

static ts_conn_close_info_t why(ts_conn_close_reason_t r, int was_open, const char *msg) {
    return (ts_conn_close_info_t){.reason = r, .code = 0, .message = msg, .was_open = was_open};
}

static void tick(ts_health_t *h, double now, uint64_t opened, uint32_t peers, uint32_t seeds,
                 int *logged, int *rejoin) {
    char line[640] = "";
    ts_health_level_t level;
    *logged = ts_health_tick(h, now, opened, peers, seeds, line, sizeof line, &level, rejoin);
}

/* A seed (no bootstrap) is never alone; a node with seeds is alone only after the timeout, and
 * joins again every timeout; a peer makes it ok again, said once. */
static void test_alone(void **state) {
    (void)state;
    ts_health_t h;
    ts_health_init(&h, 100.0, 5.0, "10.0.0.1:7420");
    int logged, rejoin;
    tick(&h, 200.0, 0, 0, 0, &logged, &rejoin);
    assert_int_equal(h.state, TS_HEALTH_OK);
    assert_string_equal(h.reason, "ok");
    ts_health_init(&h, 100.0, 5.0, "10.0.0.1:7420");
    tick(&h, 104.0, 0, 0, 1, &logged, &rejoin);
    assert_int_equal(h.state, TS_HEALTH_OK);
    assert_false(logged);
    tick(&h, 105.0, 0, 0, 1, &logged, &rejoin);
    assert_int_equal(h.state, TS_HEALTH_ALONE);
    assert_true(logged);
    assert_true(rejoin);
    assert_non_null(strstr(h.reason, "alone: no peer after 5 s"));
    assert_non_null(strstr(h.reason, "10.0.0.1:7420")); /* no failure seen: maybe unreachable */
    tick(&h, 106.0, 0, 0, 1, &logged, &rejoin);
    assert_false(logged); /* said once */
    assert_false(rejoin); /* next at 110 */
    tick(&h, 110.0, 0, 0, 1, &logged, &rejoin);
    assert_true(rejoin);
    tick(&h, 111.0, 1, 2, 1, &logged, &rejoin);
    assert_int_equal(h.state, TS_HEALTH_OK);
    assert_true(logged);
    assert_string_equal(h.reason, "ok");
}

/* The last outgoing failure becomes the alone reason; key-like failures in a row make "refused",
 * a completed handshake clears it; an unreachable address does not count as refused. */
static void test_refused(void **state) {
    (void)state;
    ts_health_t h;
    ts_health_init(&h, 0.0, 5.0, "a");
    char line[512];
    ts_health_level_t level;
    int logged, rejoin;
    ts_conn_close_info_t eof_after_open = why(TS_CONN_CLOSE_EOF, 1, "eof");
    ts_health_handshake_failed(&h, 1.0, "10.0.0.2:7420", 0, &eof_after_open, line, sizeof line,
                               &level);
    assert_int_equal(level, TS_HEALTH_WARN);
    assert_non_null(strstr(line, "another network key"));
    tick(&h, 1.5, 0, 1, 1, &logged, &rejoin); /* a peer, one failure: ok */
    assert_int_equal(h.state, TS_HEALTH_OK);
    ts_health_handshake_failed(&h, 2.0, "10.0.0.2:7421", 0, &eof_after_open, line, sizeof line,
                               &level);
    tick(&h, 2.5, 0, 1, 1, &logged, &rejoin);
    assert_int_equal(h.state, TS_HEALTH_REFUSED);
    assert_non_null(strstr(h.reason, "handshakes refused (2 in a row)"));
    tick(&h, 3.0, 5, 1, 1, &logged, &rejoin); /* a handshake completed */
    assert_int_equal(h.state, TS_HEALTH_OK);
    ts_conn_close_info_t refused =
        why(TS_CONN_CLOSE_IO, 0, "cannot connect to 10.0.0.9:1: connection refused");
    for (int i = 0; i < 3; i++)
        ts_health_handshake_failed(&h, 4.0 + i, "10.0.0.9:1", 0, &refused, line, sizeof line,
                                   &level);
    tick(&h, 8.0, 5, 0, 1, &logged, &rejoin);
    assert_int_equal(h.state, TS_HEALTH_ALONE);
    assert_non_null(strstr(h.reason, "the last attempt: cannot connect to 10.0.0.9:1"));
}

/* The causes: each side, each reason. */
static void test_explain(void **state) {
    (void)state;
    char out[512];
    struct {
        int accepted;
        ts_conn_close_info_t w;
        const char *want;
    } cases[] = {
        {1, why(TS_CONN_CLOSE_HANDSHAKE, 0, ""), "another network key"},
        {1, why(TS_CONN_CLOSE_IDENTITY, 0, ""), "identity does not verify"},
        {1, why(TS_CONN_CLOSE_HANDSHAKE_TIMEOUT, 0, ""), "did not finish a handshake"},
        {0, why(TS_CONN_CLOSE_EOF, 0, ""), "during the handshake"},
        {0, why(TS_CONN_CLOSE_EOF, 1, ""), "right after the handshake"},
        {0, why(TS_CONN_CLOSE_IO, 0, "cannot connect to x: refused"), "address right"},
        {0, why(TS_CONN_CLOSE_HANDSHAKE_TIMEOUT, 0, ""), "does not answer"},
        {0, why(TS_CONN_CLOSE_HANDSHAKE, 0, ""), "not a tessera node"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_health_explain("10.1.2.3:4", cases[i].accepted, &cases[i].w, out, sizeof out);
        if (!strstr(out, cases[i].want))
            fail_msg("case %zu: '%s' lacks '%s'", i, out, cases[i].want);
    }
}

/* One line per IP (any port) per window, at most TS_HEALTH_LOG_MAX lines per window, the rest
 * counted and reported once when the window ends. */
static void test_rate_limit(void **state) {
    (void)state;
    ts_health_t h;
    ts_health_init(&h, 0.0, 5.0, "a");
    char line[512];
    ts_health_level_t level;
    ts_conn_close_info_t w = why(TS_CONN_CLOSE_HANDSHAKE, 0, "");
    assert_true(
        ts_health_handshake_failed(&h, 1.0, "10.0.0.1:5000", 1, &w, line, sizeof line, &level));
    assert_non_null(strstr(line, "10.0.0.1:5000"));
    assert_false(
        ts_health_handshake_failed(&h, 2.0, "10.0.0.1:5001", 1, &w, line, sizeof line, &level));
    int shown = 1;
    for (int i = 2; i < 40; i++) {
        char a[32];
        snprintf(a, sizeof a, "10.0.0.%d:5000", i);
        shown += ts_health_handshake_failed(&h, 3.0, a, 1, &w, line, sizeof line, &level);
    }
    assert_int_equal(shown, TS_HEALTH_LOG_MAX);
    assert_int_equal(h.suppressed, 40 - TS_HEALTH_LOG_MAX);
    int logged, rejoin;
    char tl[640];
    logged = ts_health_tick(&h, 30.0, 0, 1, 1, tl, sizeof tl, &level, &rejoin);
    assert_false(logged); /* the window is not over */
    logged = ts_health_tick(&h, 61.0, 0, 1, 1, tl, sizeof tl, &level, &rejoin);
    assert_true(logged);
    assert_non_null(strstr(tl, "30 more failed handshakes"));
    assert_int_equal(h.suppressed, 0);
    /* a new window: the first address may be logged again */
    assert_true(
        ts_health_handshake_failed(&h, 62.0, "10.0.0.1:6000", 1, &w, line, sizeof line, &level));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_explain),
        cmocka_unit_test(test_rate_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
