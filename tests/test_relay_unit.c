/*
 * test_relay_unit.c — relays (net/relay.h) between three RPC endpoints on one uv loop, over real
 * loopback sockets: a relay R, a node N carried by it, a dialer D.
 *
 *   - N reserves at R and is told its address (R's host, a port of R's);
 *   - D pings N at that address: the Noise session runs end to end through R (the ping's answer
 *     proves N's identity, not R's), and R counts one spliced connection and its bytes;
 *   - D expecting R's identity at N's relayed address is refused before anything is sent
 *     (TS_CONN_CLOSE_IDENTITY), as a relay answering in N's place would be;
 *   - a UDP datagram sent to the relayed address reaches N, with its sender's address;
 *   - a connect-back with a token nobody waits for, and a dialer that sends more than a
 *     handshake's first message before pairing, are closed; R goes on serving;
 *   - a second reservation of the same node replaces the first; N's stop ends it at R;
 *   - a node that asks a peer not serving relays is told ERROR_UNSUPPORTED.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"
#include "tests/uvutil.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/error.h"
#include "net/relay.h"

#define WAIT_MS 20000

static uv_loop_t loop;
static ts_identity_t rid, nid, did;
static ts_netkey_t nk;
static ts_net_t *rnet, *nnet, *dnet;
static ts_rpc_t *rrpc, *nrpc, *drpc;
static ts_relay_t *relay;
static ts_relay_client_t *client;
static char raddr[64];

/* Runs the loop until *flag is non-zero; fails the test after WAIT_MS (tests/uvutil.h). */
static void run_until(const int *flag, const char *what) {
    tu_run_until_flag(&loop, flag, WAIT_MS, what);
}

/* ---- the carried node's callbacks ------------------------------------------------------------ */

static struct {
    int states, live, datagrams;
    char addr[128], from[128], msg[512];
    uint8_t data[64];
    size_t len;
} got;

static void on_state(void *arg, const char *addr, const ts_node_id_t *relay_id,
                     const char *message) {
    (void)arg;
    got.states++;
    got.live = addr != NULL;
    snprintf(got.addr, sizeof got.addr, "%s", addr ? addr : "");
    snprintf(got.msg, sizeof got.msg, "%s", message ? message : "");
    if (addr)
        assert_memory_equal(relay_id->b, rid.id.b, sizeof relay_id->b);
}

static void on_datagram(void *arg, const struct sockaddr *from, const uint8_t *data, size_t len) {
    (void)arg;
    const struct sockaddr_in *a = (const struct sockaddr_in *)from;
    char ip[64];
    uv_ip4_name(a, ip, sizeof ip);
    snprintf(got.from, sizeof got.from, "%s:%d", ip, ntohs(a->sin_port));
    got.len = len < sizeof got.data ? len : sizeof got.data;
    memcpy(got.data, data, got.len);
    got.datagrams++;
}

/* ---- setup -------------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    uv_loop_init(&loop);
    ts_identity_generate(&rid);
    ts_identity_generate(&nid);
    ts_identity_generate(&did);
    ts_netkey_generate(&nk);
    char err[256];
    ts_listener_t *l;
    if (ts_net_new(&rnet, &loop, &rid, &nk, NULL) || ts_net_new(&nnet, &loop, &nid, &nk, NULL) ||
        ts_net_new(&dnet, &loop, &did, &nk, NULL) || ts_rpc_new(&rrpc, rnet, NULL) ||
        ts_rpc_new(&nrpc, nnet, NULL) || ts_rpc_new(&drpc, dnet, NULL) ||
        ts_rpc_listen(rrpc, "127.0.0.1:0", &l, err, sizeof err))
        return -1;
    snprintf(raddr, sizeof raddr, "127.0.0.1:%d", ts_listener_port(l));
    ts_relay_config_t rc;
    ts_relay_config_default(&rc);
    rc.public_host = "127.0.0.1";
    rc.bind_host = "127.0.0.1";
    rc.circuit_wait_ms = 500;
    if (ts_relay_serve(rrpc, &rc, &relay, err, sizeof err))
        return -1;
    ts_relay_client_cbs_t cbs = {on_state, on_datagram, NULL};
    if (ts_relay_client_new(nrpc, &cbs, &client))
        return -1;
    memset(&got, 0, sizeof got);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ts_relay_client_free(client);
    ts_relay_close(relay);
    ts_rpc_shutdown(drpc);
    ts_rpc_shutdown(nrpc);
    ts_rpc_shutdown(rrpc);
    uv_run(&loop, UV_RUN_DEFAULT);
    int rc = ts_relay_free(relay) | ts_rpc_free(drpc) | ts_rpc_free(nrpc) | ts_rpc_free(rrpc) |
             ts_net_free(dnet) | ts_net_free(nnet) | ts_net_free(rnet);
    uv_loop_close(&loop);
    ts_identity_wipe(&rid);
    ts_identity_wipe(&nid);
    ts_identity_wipe(&did);
    ts_netkey_wipe(&nk);
    return rc ? -1 : 0;
}

static void reserve(void) {
    char err[256] = "";
    int before = got.states;
    TU_CHECK_RC_MSG(ts_relay_client_reserve(client, raddr, &rid.id, err, sizeof err), TS_OK, err);
    int done = 0;
    while (!done) {
        run_until(&got.states, "the reservation's first event");
        done = got.states > before;
    }
    assert_true(got.live);
    assert_true(ts_relay_client_live(client));
    assert_int_equal(strncmp(got.addr, "127.0.0.1:", 10), 0);
    assert_string_not_equal(got.addr, raddr);
}

/* ---- a ping through the relay ------------------------------------------------------------------ */

typedef struct {
    int done, status;
    ts_node_id_t proved;
} ping_t;

static void on_ping(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    ping_t *p = arg;
    p->status = res->status;
    p->done = 1;
}

static ping_t ping(const char *addr, const ts_node_id_t *expect, const ts_node_id_t *target) {
    ts_rpc_peer_t *p;
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_rpc_peer_get(drpc, addr, &p, err, sizeof err), TS_OK, err);
    ts_rpc_peer_expect(p, expect);
    Tessera__Ping pg = TESSERA__PING__INIT;
    pg.has_target_id = 1;
    pg.target_id.data = (uint8_t *)target->b;
    pg.target_id.len = sizeof target->b;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_PING;
    env.ping = &pg;
    ping_t r = {0};
    TU_CHECK_RC_MSG(ts_rpc_call(p, &env, 5000, on_ping, &r, NULL, err, sizeof err), TS_OK, err);
    run_until(&r.done, "the ping's answer");
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(p, &info);
    if (info.has_node_id)
        r.proved = info.node_id;
    return r;
}

static void test_end_to_end(void **state) {
    (void)state;
    reserve();
    ping_t r = ping(got.addr, &nid.id, &nid.id);
    assert_int_equal(r.status, TS_OK);
    assert_memory_equal(r.proved.b, nid.id.b, sizeof nid.id.b); /* N answered, not R */
    ts_relay_stats_t st;
    ts_relay_stats(relay, &st);
    assert_int_equal(st.reservations, 1);
    assert_int_equal(st.circuits_total, 1);
    assert_true(st.bytes > 300); /* three handshake messages, a ping and its ack */
    ts_relay_client_stats_t cs;
    ts_relay_client_stats(client, &cs);
    assert_int_equal(cs.circuits, 1);

    /* expecting the relay's identity behind N's address: refused before any frame */
    ts_net_stats_t before, after;
    ts_net_stats(dnet, &before);
    /* a new peer entry for the same address: another spelling of it */
    char other[160];
    snprintf(other, sizeof other, "localhost:%s", strrchr(got.addr, ':') + 1);
    r = ping(other, &rid.id, &rid.id);
    assert_int_not_equal(r.status, TS_OK);
    ts_net_stats(dnet, &after);
    assert_true(after.closed[TS_CONN_CLOSE_IDENTITY] > before.closed[TS_CONN_CLOSE_IDENTITY]);
    assert_int_equal(after.frames_out, before.frames_out); /* nothing was sent on it */
}

static void test_datagram(void **state) {
    (void)state;
    reserve();
    int port = atoi(strrchr(got.addr, ':') + 1);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_port = 0};
    inet_pton(AF_INET, "127.0.0.1", &me.sin_addr);
    assert_int_equal(bind(s, (struct sockaddr *)&me, sizeof me), 0);
    socklen_t ml = sizeof me;
    getsockname(s, (struct sockaddr *)&me, &ml);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    const char msg[] = "a sealed gossip datagram";
    assert_int_equal(sendto(s, msg, sizeof msg, 0, (struct sockaddr *)&to, sizeof to),
                     (ssize_t)sizeof msg);
    run_until(&got.datagrams, "the datagram at N");
    close(s);
    assert_int_equal(got.len, sizeof msg);
    assert_memory_equal(got.data, msg, sizeof msg);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%d", ntohs(me.sin_port));
    assert_string_equal(got.from, want);
}

/* Connects to addr, writes data, and waits for the relay to close the socket. */
static void expect_closed(const char *addr, const void *data, size_t len) {
    int port = atoi(strrchr(addr, ':') + 1);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    assert_int_equal(connect(s, (struct sockaddr *)&to, sizeof to), 0);
    assert_int_equal(write(s, data, len), (ssize_t)len);
    /* the loop must run for the relay to act; read in small steps until EOF */
    struct timeval tv = {0, 20000};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[16];
    int closed = 0;
    for (int i = 0; i < 500 && !closed; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        ssize_t n = read(s, b, sizeof b);
        closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    close(s);
    assert_true(closed);
}

static void test_hostile_legs(void **state) {
    (void)state;
    reserve();
    uint8_t back[TS_RELAY_PREAMBLE];
    memcpy(back, TS_RELAY_MAGIC, 4);
    memset(back + 4, 0xAB, TS_FRAME_CIRCUIT_BYTES); /* a token nobody waits for */
    expect_closed(got.addr, back, sizeof back);
    uint8_t flood[1024];
    memset(flood, 0x11, sizeof flood); /* no pairing, more than a handshake's first part */
    expect_closed(got.addr, flood, sizeof flood);
    ping_t r = ping(got.addr, &nid.id, &nid.id); /* and it still carries N */
    assert_int_equal(r.status, TS_OK);
}

/* Whether the relay holds *(uint32_t *)arg reservations now. */
static int reservations_are(void *arg) {
    ts_relay_stats_t st;
    ts_relay_stats(relay, &st);
    return st.reservations == *(const uint32_t *)arg;
}

static void test_replace_and_stop(void **state) {
    (void)state;
    reserve();
    char first[128];
    snprintf(first, sizeof first, "%s", got.addr);
    reserve(); /* the same node again: the relay replaces the first */
    uint32_t want = 1;
    tu_run_until(&loop, reservations_are, &want, WAIT_MS, "the first reservation replaced");
    ts_relay_stats_t st;
    ts_relay_stats(relay, &st);
    assert_int_equal(st.reservations, 1);
    assert_int_equal(st.reservations_total, 2);
    ts_relay_client_stop(client);
    want = 0;
    tu_run_until(&loop, reservations_are, &want, WAIT_MS, "the reservation given up");
    ts_relay_stats(relay, &st);
    assert_int_equal(st.reservations, 0);
    assert_false(ts_relay_client_live(client));
}

static void test_not_a_relay(void **state) {
    (void)state;
    /* D serves no relays: N asks it and hears why */
    char err[256] = "", daddr[64];
    ts_listener_t *l;
    TU_CHECK_RC_MSG(ts_rpc_listen(drpc, "127.0.0.1:0", &l, err, sizeof err), TS_OK, err);
    snprintf(daddr, sizeof daddr, "127.0.0.1:%d", ts_listener_port(l));
    TU_CHECK_RC_MSG(ts_relay_client_reserve(client, daddr, NULL, err, sizeof err), TS_OK, err);
    run_until(&got.states, "the refusal");
    assert_false(got.live);
    assert_non_null(strstr(got.msg, "ERROR_UNSUPPORTED"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_end_to_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_datagram, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostile_legs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_and_stop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_a_relay, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
