/*
 * test_rpc.c — requests and answers (net/rpc.h) between two endpoints on one uv loop, over real
 * loopback connections.
 *
 *   - a ping and a status request answered (the built-in ping, a registered handler);
 *   - typed errors: a handler's Error{code, message} reaches the caller as TS_EPEER with both;
 *     an unserved kind is ERROR_UNSUPPORTED; a ping for another node ERROR_INVALID_ARGUMENT;
 *   - deadlines: the deadline travels in the request (the handler sees it), the caller's
 *     callback gets TS_ETIMEDOUT when it passes, the server hears the Cancel, and the server's
 *     late ERROR_CANCELLED is ignored — the callback ran exactly once;
 *   - cancellation: TS_ECANCELED at once, a Cancel to the server, still one callback;
 *   - a connection lost under a call: TS_ECLOSED, and the server's handler is told;
 *   - busy past max_pending_in;
 *   - a request with the wrong id parity closes the connection;
 *   - reconnect with backoff: the server goes away, attempts fail with growing, jittered
 *     delays inside the documented bounds, and a queued call succeeds once it is back on the
 *     same port.
 *
 * Waits are event-driven: the loop runs until a flag is set, with a generous guard.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"
#include "tests/uvutil.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "net/frame.h"
#include "net/rpc.h"

#define WAIT_MS 60000
#define BACKOFF_BASE 20
#define BACKOFF_MAX 160

static uv_loop_t loop;
static ts_identity_t sid, cid;
static ts_netkey_t nk;
static ts_net_t *snet, *cnet;
static ts_rpc_t *srpc, *crpc;
static ts_listener_t *listener;
static int port;
static char addr[64];

/* ---- running the loop ------------------------------------------------------------------------- */

/* Runs the loop until *flag is non-zero; fails the test after WAIT_MS (tests/uvutil.h). */
static void run_until(const int *flag, const char *what) {
    tu_run_until_flag(&loop, flag, WAIT_MS, what);
}

/* ---- the endpoints ---------------------------------------------------------------------------- */

static void serve(void) {
    char err[256] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    TU_CHECK_RC_MSG(ts_rpc_listen(srpc, addr, &listener, err, sizeof err), TS_OK, err);
    port = ts_listener_port(listener);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
}

static int setup(void **state) {
    uv_loop_init(&loop);
    ts_identity_generate(&sid);
    ts_identity_generate(&cid);
    ts_netkey_generate(&nk);
    ts_rpc_config_t rc;
    ts_rpc_config_default(&rc);
    rc.backoff_base_ms = BACKOFF_BASE;
    rc.backoff_max_ms = BACKOFF_MAX;
    rc.max_pending_in = 2;
    if (ts_net_new(&snet, &loop, &sid, &nk, NULL) || ts_net_new(&cnet, &loop, &cid, &nk, NULL) ||
        ts_rpc_new(&srpc, snet, &rc) || ts_rpc_new(&crpc, cnet, &rc))
        return -1;
    port = 0;
    char err[256];
    if (ts_rpc_listen(srpc, "127.0.0.1:0", &listener, err, sizeof err))
        return -1;
    port = ts_listener_port(listener);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    return 0;
}

static int teardown(void **state) {
    ts_rpc_shutdown(crpc);
    ts_rpc_shutdown(srpc);
    uv_run(&loop, UV_RUN_DEFAULT);
    int rc = ts_rpc_free(crpc) | ts_rpc_free(srpc) | ts_net_free(cnet) | ts_net_free(snet);
    uv_loop_close(&loop);
    ts_identity_wipe(&sid);
    ts_identity_wipe(&cid);
    ts_netkey_wipe(&nk);
    return rc ? -1 : 0;
}

/* ---- calls and what came back ----------------------------------------------------------------- */

typedef struct got {
    int calls; /* callbacks run */
    int status, remote_code;
    Tessera__Envelope__BodyCase kind;
    uint32_t retry_after_ms;
    uint64_t rtt_ns;
    char message[1200];
} got_t;

static void on_result(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    got_t *g = arg;
    g->calls++;
    g->status = res->status;
    g->remote_code = res->remote_code;
    g->kind = res->reply ? res->reply->body_case : TESSERA__ENVELOPE__BODY__NOT_SET;
    if (res->reply && res->reply->body_case == TESSERA__ENVELOPE__BODY_BUSY)
        g->retry_after_ms = res->reply->busy->retry_after_ms;
    g->rtt_ns = res->rtt_ns;
    snprintf(g->message, sizeof g->message, "%s", res->message);
}

static ts_rpc_peer_t *peer(void) {
    ts_rpc_peer_t *p;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_rpc_peer_get(crpc, addr, &p, err, sizeof err), TS_OK, err);
    return p;
}

static ts_rpc_call_t *call_ping(const uint8_t *target, uint32_t deadline, got_t *g) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__Ping ping = TESSERA__PING__INIT;
    ping.has_target_id = 1;
    ping.target_id.data = (uint8_t *)target;
    ping.target_id.len = TS_NODE_ID_BYTES;
    env.body_case = TESSERA__ENVELOPE__BODY_PING;
    env.ping = &ping;
    ts_rpc_call_t *c = NULL;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_rpc_call(peer(), &env, deadline, on_result, g, &c, err, sizeof err), TS_OK,
                    err);
    return c;
}

static ts_rpc_call_t *call_kind(Tessera__Envelope__BodyCase kind, uint32_t deadline, got_t *g) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__StatusRequest st = TESSERA__STATUS_REQUEST__INIT;
    Tessera__ChunkRequest ch = TESSERA__CHUNK_REQUEST__INIT;
    Tessera__WeightsManifestRequest wm = TESSERA__WEIGHTS_MANIFEST_REQUEST__INIT;
    static uint8_t hash[32];
    env.body_case = kind;
    if (kind == TESSERA__ENVELOPE__BODY_STATUS_REQUEST) {
        env.status_request = &st;
    } else if (kind == TESSERA__ENVELOPE__BODY_CHUNK_REQUEST) {
        ch.has_chunk_hash = 1;
        ch.chunk_hash.data = hash;
        ch.chunk_hash.len = 32;
        env.chunk_request = &ch;
    } else {
        wm.has_weights_hash = 1;
        wm.weights_hash.data = hash;
        wm.weights_hash.len = 32;
        env.weights_manifest_request = &wm;
    }
    ts_rpc_call_t *c = NULL;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_rpc_call(peer(), &env, deadline, on_result, g, &c, err, sizeof err), TS_OK,
                    err);
    return c;
}

/* A ping answered proves that everything the server sent before it has been read. */
static void sync_ping(void) {
    got_t g = {0};
    call_ping(sid.id.b, 0, &g);
    run_until(&g.calls, "a ping answered");
    assert_int_equal(g.status, TS_OK);
}

/* ---- server handlers -------------------------------------------------------------------------- */

static void serve_status(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
    Tessera__StatusResponse st = TESSERA__STATUS_RESPONSE__INIT;
    st.has_node_id = 1;
    st.node_id.data = sid.id.b;
    st.node_id.len = TS_NODE_ID_BYTES;
    out.body_case = TESSERA__ENVELOPE__BODY_STATUS_RESPONSE;
    out.status_response = &st;
    TU_CHECK_OK(ts_rpc_reply(req, &out));
}

static void serve_not_found(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    TU_CHECK_OK(
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_NOT_FOUND, "no chunk %s here", "0000"));
}

/* Holds requests unanswered; notes cancels. */
typedef struct held {
    ts_rpc_request_t *req[8];
    int n, cancels;
    uint64_t deadline, arrived;
} held_t;
static held_t held;

static void on_cancelled(ts_rpc_request_t *req, void *arg) { held.cancels++; }

static void serve_hold(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    held.deadline = ts_rpc_request_deadline(req);
    held.arrived = uv_now(&loop);
    ts_rpc_request_on_cancel(req, on_cancelled, NULL);
    held.req[held.n++] = req;
}

/* Answers every held request (each answer is dropped or sent; the request is freed). */
static void release_held(int expect) {
    for (int i = 0; i < held.n; i++) {
        Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
        Tessera__StatusResponse st = TESSERA__STATUS_RESPONSE__INIT;
        st.has_node_id = 1;
        st.node_id.data = sid.id.b;
        st.node_id.len = TS_NODE_ID_BYTES;
        out.body_case = TESSERA__ENVELOPE__BODY_STATUS_RESPONSE;
        out.status_response = &st;
        TU_CHECK_RC(ts_rpc_reply(held.req[i], &out), expect);
    }
    memset(&held, 0, sizeof held);
}

/* ---- the tests -------------------------------------------------------------------------------- */

static void test_ping_and_status(void **state) {
    got_t g = {0};
    call_ping(sid.id.b, 5000, &g);
    run_until(&g.calls, "the ping's answer");
    assert_int_equal(g.status, TS_OK);
    assert_int_equal(g.kind, TESSERA__ENVELOPE__BODY_ACK);
    assert_true(g.rtt_ns > 0);
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(peer(), &info);
    assert_true(info.open && info.has_node_id);
    assert_memory_equal(info.node_id.b, sid.id.b, TS_NODE_ID_BYTES);

    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_status, NULL));
    memset(&g, 0, sizeof g);
    call_kind(TESSERA__ENVELOPE__BODY_STATUS_REQUEST, 0, &g);
    run_until(&g.calls, "the status answer");
    assert_int_equal(g.status, TS_OK);
    assert_int_equal(g.kind, TESSERA__ENVELOPE__BODY_STATUS_RESPONSE);
    /* one connection served both */
    assert_int_equal(info.attempts, 1);
    ts_rpc_peer_info(peer(), &info);
    assert_int_equal(info.attempts, 1);
}

static void test_typed_errors(void **state) {
    got_t g = {0};
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_CHUNK_REQUEST, serve_not_found, NULL));
    call_kind(TESSERA__ENVELOPE__BODY_CHUNK_REQUEST, 0, &g);
    run_until(&g.calls, "the error answer");
    assert_int_equal(g.status, TS_EPEER);
    assert_int_equal(g.remote_code, TESSERA__ERROR_CODE__ERROR_NOT_FOUND);
    TU_CHECK_CONTAINS(g.message, "no chunk 0000 here");
    TU_CHECK_CONTAINS(g.message, "ERROR_NOT_FOUND");

    memset(&g, 0, sizeof g); /* nobody serves weights manifests */
    call_kind(TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST, 0, &g);
    run_until(&g.calls, "the unsupported answer");
    assert_int_equal(g.status, TS_EPEER);
    assert_int_equal(g.remote_code, TESSERA__ERROR_CODE__ERROR_UNSUPPORTED);

    memset(&g, 0, sizeof g); /* a ping meant for another node */
    call_ping(cid.id.b, 0, &g);
    run_until(&g.calls, "the misdirected ping's answer");
    assert_int_equal(g.status, TS_EPEER);
    assert_int_equal(g.remote_code, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT);

    /* A request this side refuses to send: not a request kind, or a rule broken. */
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__Ack ack = TESSERA__ACK__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_ACK;
    env.ack = &ack;
    char err[256] = "";
    TU_CHECK_RC(ts_rpc_call(peer(), &env, 0, on_result, &g, NULL, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "not a request");
}

static void test_deadline(void **state) {
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_hold, NULL));
    sync_ping(); /* connected, so the deadline measures the request alone */
    got_t g = {0};
    uint64_t t0 = uv_now(&loop);
    call_kind(TESSERA__ENVELOPE__BODY_STATUS_REQUEST, 150, &g);
    run_until(&g.calls, "the deadline");
    uint64_t waited = uv_now(&loop) - t0;
    assert_int_equal(g.status, TS_ETIMEDOUT);
    assert_true(waited >= 150 - 2); /* never before the deadline (loop-time granularity) */
    /* The deadline travelled: the server saw a budget of at most 150 ms from arrival. */
    assert_int_equal(held.n, 1);
    assert_true(held.deadline > held.arrived && held.deadline <= held.arrived + 150);
    /* The server hears the Cancel... */
    run_until(&held.cancels, "the server told of the cancel");
    /* ...its answer is dropped, and its ERROR_CANCELLED never makes a second callback. */
    release_held(TS_ECANCELED);
    sync_ping();
    assert_int_equal(g.calls, 1);
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_status, NULL));
}

/* A call made after the loop sat still for longer than the call's deadline (a caller that
 * computed between two runs of the loop): the deadline runs from the call, not from the loop's
 * last look at the clock, so the answer arrives — it was answered "timed out" at once before. */
static void test_deadline_after_a_still_loop(void **state) {
    sync_ping();
    struct timespec still = {1, 500 * 1000000L};
    nanosleep(&still, NULL); /* the loop does not run: its cached time falls 1.5 s behind */
    got_t g = {0};
    call_kind(TESSERA__ENVELOPE__BODY_STATUS_REQUEST, 1000, &g);
    run_until(&g.calls, "the status answer after a still loop");
    assert_int_equal(g.status, TS_OK);
    assert_int_equal(g.kind, TESSERA__ENVELOPE__BODY_STATUS_RESPONSE);
}

static void test_cancel(void **state) {
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_hold, NULL));
    got_t g = {0};
    ts_rpc_call_t *c = call_kind(TESSERA__ENVELOPE__BODY_STATUS_REQUEST, 0, &g);
    run_until(&held.n, "the server holding the call");
    ts_rpc_cancel(c);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.status, TS_ECANCELED);
    run_until(&held.cancels, "the server told of the cancel");
    release_held(TS_ECANCELED);
    sync_ping();
    assert_int_equal(g.calls, 1);

    /* A call cancelled before it was ever sent: no connection needed. */
    memset(&g, 0, sizeof g);
    ts_rpc_peer_t *p;
    TU_CHECK_OK(ts_rpc_peer_get(crpc, "127.0.0.1:1", &p, NULL, 0));
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__StatusRequest st = TESSERA__STATUS_REQUEST__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &st;
    TU_CHECK_OK(ts_rpc_call(p, &env, 0, on_result, &g, &c, NULL, 0));
    ts_rpc_cancel(c);
    assert_int_equal(g.calls, 1);
    assert_int_equal(g.status, TS_ECANCELED);
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_status, NULL));
}

static void test_busy(void **state) {
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_hold, NULL));
    got_t g[3] = {{0}};
    for (int i = 0; i < 3; i++)
        call_kind(TESSERA__ENVELOPE__BODY_STATUS_REQUEST, 0, &g[i]);
    run_until(&g[2].calls, "the third call's answer");
    assert_int_equal(g[2].status, TS_EBUSY); /* max_pending_in is 2 */
    assert_int_equal(g[2].retry_after_ms, 100);
    assert_int_equal(g[0].calls + g[1].calls, 0);
    release_held(TS_OK);
    run_until(&g[1].calls, "the held calls answered");
    assert_int_equal(g[0].status, TS_OK);
    assert_int_equal(g[1].status, TS_OK);
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_status, NULL));
}

static void test_connection_lost(void **state) {
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_hold, NULL));
    got_t g = {0};
    call_kind(TESSERA__ENVELOPE__BODY_STATUS_REQUEST, 0, &g);
    run_until(&held.n, "the server holding the call");
    ts_listener_close(listener, 1); /* the server drops its connections */
    run_until(&g.calls, "the lost call's callback");
    assert_int_equal(g.status, TS_ECLOSED);
    run_until(&held.cancels, "the handler told");
    release_held(TS_ECLOSED);
    serve(); /* back on the same port for the next tests */
    TU_CHECK_OK(ts_rpc_handle(srpc, TESSERA__ENVELOPE__BODY_STATUS_REQUEST, serve_status, NULL));
}

/* A raw connection that sends a request with the initiator's id parity turned around. */
static int parity_closed;
static void parity_open(ts_conn_t *c) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__StatusRequest st = TESSERA__STATUS_REQUEST__INIT;
    env.has_request_id = 1;
    env.request_id = 2; /* even: the accepting side's */
    env.body_case = TESSERA__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &st;
    uint8_t *buf;
    size_t len;
    TU_CHECK_OK(ts_frame_encode_envelope(&env, 0, TS_FRAME_MAX_DEFAULT, &buf, &len, NULL, 0));
    TU_CHECK_OK(ts_conn_send(c, buf + 4, len - 4));
    free(buf);
}
static void parity_frame(ts_conn_t *c, const uint8_t *d, size_t n) {
    fail_msg("the server answered a request of the wrong parity");
}
static void parity_close(ts_conn_t *c, const ts_conn_close_info_t *why) { parity_closed = 1; }

static void test_wrong_parity(void **state) {
    ts_net_stats_t before;
    ts_net_stats(snet, &before);
    static const ts_conn_handler_t h = {parity_open, parity_frame, NULL, parity_close};
    ts_conn_t *c;
    TU_CHECK_OK(ts_conn_connect(cnet, addr, &h, NULL, &c, NULL, 0));
    run_until(&parity_closed, "the server closing the connection");
    ts_net_stats_t after;
    ts_net_stats(snet, &after);
    assert_int_equal(after.closed[TS_CONN_CLOSE_PROTOCOL],
                     before.closed[TS_CONN_CLOSE_PROTOCOL] + 1);
    sync_ping(); /* the pool's connection is untouched */
}

/* Watches a peer while the loop runs: the backoff chosen after each new failure lies within
 * its documented bounds, [d/2, d] with d = min(max, base · 2^(failures−1)). */
typedef struct watch {
    ts_rpc_peer_t *p;
    uv_timer_t t;
    uint32_t failures, checked;
    int bad;
} watch_t;

static void watch_cb(uv_timer_t *t) {
    watch_t *w = t->data;
    ts_rpc_peer_info_t i;
    ts_rpc_peer_info(w->p, &i);
    if (i.failures > w->failures) {
        uint64_t d = (uint64_t)BACKOFF_BASE << (i.failures - 1);
        if (d > BACKOFF_MAX)
            d = BACKOFF_MAX;
        if (i.last_backoff_ms < d / 2 || i.last_backoff_ms > d) {
            print_error("failure %u: backoff %u ms outside [%llu, %llu]\n", i.failures,
                        i.last_backoff_ms, (unsigned long long)d / 2, (unsigned long long)d);
            w->bad = 1;
        }
        w->checked++;
    }
    w->failures = i.failures;
}

static int restart_now;
static void restart_cb(uv_timer_t *t) {
    watch_t *w = t->data;
    ts_rpc_peer_info_t i;
    ts_rpc_peer_info(w->p, &i);
    if (i.failures >= 4) {
        serve();
        restart_now = 1;
        uv_timer_stop(t);
    }
}

static int peer_closed(void *arg) {
    (void)arg;
    ts_rpc_peer_info_t i;
    ts_rpc_peer_info(peer(), &i);
    return !i.open;
}

static void test_reconnect_with_backoff(void **state) {
    sync_ping();
    ts_rpc_peer_info_t i0, i;
    ts_rpc_peer_info(peer(), &i0);
    ts_listener_close(listener, 1); /* the server goes away, and the client notices */
    tu_run_until(&loop, peer_closed, NULL, WAIT_MS, "the client noticing the server gone");
    watch_t w = {.p = peer()};
    uv_timer_init(&loop, &w.t);
    w.t.data = &w;
    uv_timer_start(&w.t, watch_cb, 0, 1);
    uv_timer_t restart;
    uv_timer_init(&loop, &restart);
    restart.data = &w;
    restart_now = 0;
    uv_timer_start(&restart, restart_cb, 1, 1);
    got_t g = {0};
    uint64_t t0 = uv_now(&loop);
    call_kind(TESSERA__ENVELOPE__BODY_STATUS_REQUEST, 30000, &g);
    run_until(&g.calls, "the call across the restart");
    uint64_t took = uv_now(&loop) - t0;
    uv_close((uv_handle_t *)&w.t, NULL);
    uv_close((uv_handle_t *)&restart, NULL);
    uv_run(&loop, UV_RUN_NOWAIT); /* they live on this stack frame: let the loop finish them */
    assert_int_equal(g.status, TS_OK);
    assert_true(restart_now);
    assert_false(w.bad);
    assert_true(w.checked >= 1);
    ts_rpc_peer_info(peer(), &i);
    assert_int_equal(i.failures, 0);            /* reset by the successful handshake */
    assert_true(i.attempts - i0.attempts >= 5); /* 4+ refused, then the one that worked */
    /* Four failures waited at least 10 + 20 + 40 + 80 ms (each backoff's lower bound). */
    assert_true(took + 2 >= (BACKOFF_BASE / 2) * (1 + 2 + 4 + 8));
}

/* fail_fast: with the server gone, a queued call fails as soon as the connect is refused (well
 * before its 30 s deadline, TS_ECLOSED with the reason), and a call during the backoff that
 * follows is refused at once; the default keeps waiting (test_reconnect_with_backoff). */
static void test_fail_fast(void **state) {
    sync_ping();
    ts_listener_close(listener, 1);
    tu_run_until(&loop, peer_closed, NULL, WAIT_MS, "the client noticing the server gone");
    ts_rpc_set_fail_fast(crpc, 1);
    got_t g = {0};
    uint64_t t0 = uv_now(&loop);
    call_kind(TESSERA__ENVELOPE__BODY_STATUS_REQUEST, 30000, &g);
    run_until(&g.calls, "the call to a refusing peer");
    uint64_t took = uv_now(&loop) - t0;
    assert_int_equal(g.status, TS_ECLOSED);
    assert_true(took < 10000); /* not its deadline (30 s): a refused connect */
    ts_rpc_peer_info_t i;
    ts_rpc_peer_info(peer(), &i);
    assert_true(i.failures >= 1);
    /* in the backoff: refused synchronously, with the last failure */
    Tessera__StatusRequest sr = TESSERA__STATUS_REQUEST__INIT;
    Tessera__Envelope req = TESSERA__ENVELOPE__INIT;
    req.body_case = TESSERA__ENVELOPE__BODY_STATUS_REQUEST;
    req.status_request = &sr;
    char err[512] = "";
    got_t g2 = {0};
    int rc = ts_rpc_call(peer(), &req, 30000, on_result, &g2, NULL, err, sizeof err);
    assert_int_equal(rc, TS_ECLOSED);
    assert_non_null(strstr(err, "unreachable"));
    assert_int_equal(g2.calls, 0);
    ts_rpc_set_fail_fast(crpc, 0);
    serve(); /* the server back, for the tests after this one */
    (void)state;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping_and_status),
        cmocka_unit_test(test_typed_errors),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_deadline_after_a_still_loop),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_busy),
        cmocka_unit_test(test_connection_lost),
        cmocka_unit_test(test_wrong_parity),
        cmocka_unit_test(test_reconnect_with_backoff),
        cmocka_unit_test(test_fail_fast),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
