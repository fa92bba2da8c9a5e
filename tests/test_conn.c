/*
 * test_conn.c — the connection layer (net/conn.h, with net/rpc.h answering) against hostile
 * peers, over real sockets on loopback.
 *
 * The server is one ts_net_t + ts_rpc_t on its own uv loop, on a thread of this process, for the
 * whole run: every attack meets the same server, which must keep serving. The tests talk to it
 * through blocking sockets and a second, independent implementation of the client side written
 * here from net/noise.h and net/keys.h (raw_*), which can do everything right or break any rule
 * on purpose. The server's counters (ts_net_stats) are copied under a mutex by a timer on the
 * server's loop; the tests wait for them with a condition variable and generous deadlines — no
 * sleeps that assume a speed.
 *
 * Besides the attacks, two ts_net_t endpoints on the test's loop echo frames of sizes around
 * the Noise message boundaries byte for byte (the sealing and decrypting paths of net/conn.c).
 *
 * Each attack asserts what the server did (the close reason it counted, that nothing was
 * delivered or answered), and is followed by a well-behaved client that must complete a
 * handshake and get its pings answered:
 *   wrong network key, flipped ciphertext bytes (body and tag), a replayed and a reordered
 *   transport message, oversize and zero lengths (with the largest allocation measured by
 *   wrapping malloc), a silent and a slow peer (handshake timeout), an identity payload that
 *   signs another static key (from an initiator, and from a responder: there the client side,
 *   a ts_net_t on the test's own loop, must refuse the session before message 3), garbage before the handshake, the connection limits (per address
 *   and in total), and the write queue's high-water mark (a peer that sends 20000 requests and
 *   reads nothing: the server stops reading, its queue stays bounded, and every request is
 *   answered exactly once when the peer finally reads).
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"
#include "tests/uvutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "net/frame.h"
#include "net/rpc.h"

#define HS_TIMEOUT_MS 400
#define MAX_FRAME (1u << 20)
#define HIGH_WATER (16u << 10)
#define PER_ADDR 3
#define TOTAL 6
#define PARTIAL_BUDGET (2 * MAX_FRAME) /* bytes of partly received frames, all connections */
#define WAIT_S 60 /* the most any wait may take: a loaded machine is slow, never this slow */

/* ---- counting allocations (the link wraps malloc, calloc and realloc) ------------------------ */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
static atomic_size_t largest_alloc;
/* > 0: that many of the server thread's next callocs fail (test_out_of_memory_at_accept) */
static atomic_int server_callocs_to_fail;
static pthread_t server_thread;

static void note_alloc(size_t n) {
    size_t cur = atomic_load(&largest_alloc);
    while (n > cur && !atomic_compare_exchange_weak(&largest_alloc, &cur, n))
        ;
}
void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n) {
    note_alloc(n);
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_calloc(size_t n, size_t m) {
    note_alloc(n * m);
    if (atomic_load(&server_callocs_to_fail) > 0 && pthread_equal(pthread_self(), server_thread) &&
        atomic_fetch_sub(&server_callocs_to_fail, 1) > 0)
        return NULL;
    return __real_calloc(n, m);
}
void *__wrap_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n) {
    note_alloc(n);
    return __real_realloc(p, n);
}

/* ---- the server, on its own thread ------------------------------------------------------------ */

typedef struct srv {
    pthread_t th;
    uv_loop_t loop;
    uv_timer_t snap;
    uv_async_t stop;
    ts_net_t *net;
    ts_rpc_t *rpc;
    ts_identity_t id;
    ts_netkey_t nk;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ts_net_stats_t st; /* the latest copy, under mu */
    int ready;
} srv_t;

static srv_t S;
static ts_identity_t client_id;

static void snap_cb(uv_timer_t *t) {
    pthread_mutex_lock(&S.mu);
    ts_net_stats(S.net, &S.st);
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

static void stop_cb(uv_async_t *a) {
    uv_close((uv_handle_t *)&S.snap, NULL);
    uv_close((uv_handle_t *)&S.stop, NULL);
    ts_rpc_shutdown(S.rpc);
}

static void *server_main(void *arg) {
    ts_net_config_t cfg;
    ts_net_config_default(&cfg);
    cfg.handshake_timeout_ms = HS_TIMEOUT_MS;
    cfg.idle_timeout_ms = 600000;
    cfg.max_frame = MAX_FRAME;
    cfg.write_high_water = HIGH_WATER;
    cfg.so_sndbuf = 16 << 10;
    cfg.max_conns = TOTAL;
    cfg.max_conns_per_addr = PER_ADDR;
    cfg.max_partial_bytes = PARTIAL_BUDGET;
    ts_listener_t *l = NULL;
    char err[256] = "";
    uv_loop_init(&S.loop);
    int rc = ts_net_new(&S.net, &S.loop, &S.id, &S.nk, &cfg);
    if (rc == TS_OK)
        rc = ts_rpc_new(&S.rpc, S.net, NULL);
    if (rc == TS_OK)
        rc = ts_rpc_listen(S.rpc, "127.0.0.1:0", &l, err, sizeof err);
    if (rc) {
        fprintf(stderr, "test server: %s (%s)\n", err, ts_strerror(rc));
        exit(1);
    }
    uv_timer_init(&S.loop, &S.snap);
    uv_timer_start(&S.snap, snap_cb, 0, 2);
    uv_async_init(&S.loop, &S.stop, stop_cb);
    pthread_mutex_lock(&S.mu);
    S.port = ts_listener_port(l);
    S.ready = 1;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    if (ts_rpc_free(S.rpc) || ts_net_free(S.net)) {
        fprintf(stderr, "test server: handles left after shutdown\n");
        exit(1);
    }
    uv_loop_close(&S.loop);
    return NULL;
}

static int group_setup(void **state) {
    ts_netkey_generate(&S.nk);
    ts_identity_generate(&S.id);
    ts_identity_generate(&client_id);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    if (pthread_create(&S.th, NULL, server_main, NULL))
        return -1;
    server_thread = S.th; /* read only once a test sets server_callocs_to_fail (an atomic) */
    pthread_mutex_lock(&S.mu);
    while (!S.ready)
        pthread_cond_wait(&S.cv, &S.mu);
    pthread_mutex_unlock(&S.mu);
    return 0;
}

static int group_teardown(void **state) {
    uv_async_send(&S.stop);
    pthread_join(S.th, NULL);
    ts_identity_wipe(&S.id);
    ts_identity_wipe(&client_id);
    ts_netkey_wipe(&S.nk);
    return 0;
}

static ts_net_stats_t stats(void) {
    pthread_mutex_lock(&S.mu);
    ts_net_stats_t st = S.st;
    pthread_mutex_unlock(&S.mu);
    return st;
}

/* Waits until pred holds for the server's counters; fails the test after WAIT_S seconds. */
typedef int (*pred_fn)(const ts_net_stats_t *st, uint64_t want);
static void wait_for(pred_fn pred, uint64_t want, const char *what) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_S;
    pthread_mutex_lock(&S.mu);
    int ok;
    while (!(ok = pred(&S.st, want)))
        if (pthread_cond_timedwait(&S.cv, &S.mu, &until) == ETIMEDOUT) {
            ok = pred(&S.st, want);
            break;
        }
    pthread_mutex_unlock(&S.mu);
    if (!ok) {
        print_error("the server never reached: %s (want %llu)\n", what, (unsigned long long)want);
        fail();
    }
}

#define REASON_PRED(name, r)                                                                       \
    static int name(const ts_net_stats_t *st, uint64_t want) { return st->closed[r] >= want; }
REASON_PRED(closed_handshake, TS_CONN_CLOSE_HANDSHAKE)
REASON_PRED(closed_identity, TS_CONN_CLOSE_IDENTITY)
REASON_PRED(closed_decrypt, TS_CONN_CLOSE_DECRYPT)
REASON_PRED(closed_framing, TS_CONN_CLOSE_FRAMING)
REASON_PRED(closed_hs_timeout, TS_CONN_CLOSE_HANDSHAKE_TIMEOUT)
static int live_accepted_is(const ts_net_stats_t *st, uint64_t want) {
    return st->live_accepted == want;
}
static int refused_at_least(const ts_net_stats_t *st, uint64_t want) {
    return st->refused_limit >= want;
}
static int pauses_at_least(const ts_net_stats_t *st, uint64_t want) {
    return st->read_pauses >= want;
}

/* The counters once every earlier connection is gone: a copy that includes all they did. */
static ts_net_stats_t settled(void) {
    wait_for(live_accepted_is, 0, "no connections left from before");
    return stats();
}

/* ---- a client written from the primitives ------------------------------------------------------ */

typedef struct raw {
    int fd;
    ts_noise_transport_t tr;
    ts_frame_reader_t ard;
    uint8_t pt[TS_NOISE_MAX_MESSAGE];
    size_t pt_len, pt_pos;
    uint64_t next_id;
    ts_node_id_t peer;
} raw_t;

static void write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) /* the server may close first: that is for the caller's read to see */
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* 0 with n bytes, -1 on end of stream or error (a reset, or the receive timeout). */
static int read_exact(int fd, uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void raw_connect(raw_t *r, const char *src_ip, int rcvbuf) {
    memset(r, 0, sizeof *r);
    r->next_id = 1;
    ts_frame_reader_init_app(&r->ard, TS_FRAME_MAX_DEFAULT);
    r->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(r->fd >= 0);
    struct timeval tv = {WAIT_S, 0};
    setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(r->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (rcvbuf)
        setsockopt(r->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    if (src_ip) {
        inet_pton(AF_INET, src_ip, &a.sin_addr);
        assert_int_equal(bind(r->fd, (struct sockaddr *)&a, sizeof a), 0);
    }
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    a.sin_port = htons((uint16_t)S.port);
    assert_int_equal(connect(r->fd, (struct sockaddr *)&a, sizeof a), 0);
}

static void raw_close(raw_t *r) {
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    ts_noise_transport_wipe(&r->tr);
    ts_frame_reader_free(&r->ard);
}

static void send_noise(raw_t *r, const uint8_t *msg, size_t len) {
    uint8_t hdr[2];
    assert_int_equal(ts_frame_put_noise_len(hdr, len), TS_OK);
    write_all(r->fd, hdr, 2);
    write_all(r->fd, msg, len);
}

/* One Noise message from the server (0), or -1 when the stream ended. */
static int recv_noise(raw_t *r, uint8_t *msg, size_t *len) {
    uint8_t hdr[2];
    if (read_exact(r->fd, hdr, 2))
        return -1;
    *len = (size_t)hdr[0] << 8 | hdr[1];
    return read_exact(r->fd, msg, *len);
}

/* The initiator's handshake with identity id (its static key) and network key nk; payload3, when
 * given, replaces the identity payload of message 3. Returns 0 once this side has split (the
 * server may still refuse message 3), -1 when the server broke off earlier. */
static int raw_handshake(raw_t *r, const ts_identity_t *id, const ts_netkey_t *nk,
                         const uint8_t *payload3) {
    ts_noise_handshake_t hs;
    uint8_t msg[TS_NOISE_MAX_MESSAGE], pay[TS_NOISE_MAX_MESSAGE], own[TS_IDENTITY_PAYLOAD_BYTES];
    size_t len = 0, plen = 0;
    TU_CHECK_OK(ts_identity_handshake_init(&hs, id, nk, 1));
    TU_CHECK_OK(ts_noise_handshake_write_message(&hs, NULL, 0, msg, sizeof msg, &len));
    send_noise(r, msg, len);
    if (recv_noise(r, msg, &len)) {
        ts_noise_handshake_wipe(&hs);
        return -1;
    }
    TU_CHECK_OK(ts_noise_handshake_read_message(&hs, msg, len, pay, sizeof pay, &plen));
    uint8_t rs[TS_NOISE_DHLEN];
    TU_CHECK_OK(ts_noise_handshake_remote_static(&hs, rs));
    TU_CHECK_OK(ts_identity_payload_verify(pay, plen, rs, &r->peer, NULL, 0));
    ts_identity_payload(id, own);
    TU_CHECK_OK(ts_noise_handshake_write_message(&hs, payload3 ? payload3 : own, sizeof own, msg,
                                                 sizeof msg, &len));
    send_noise(r, msg, len);
    TU_CHECK_OK(ts_noise_handshake_split(&hs, &r->tr));
    return 0;
}

/* Seals plaintext into one transport message, len16 ‖ ciphertext, into out; returns its size. */
static size_t seal(raw_t *r, const uint8_t *pt, size_t n, uint8_t *out) {
    size_t ct = 0;
    TU_CHECK_OK(ts_noise_transport_encrypt(&r->tr, pt, n, out + 2, TS_NOISE_MAX_MESSAGE, &ct));
    ts_frame_put_noise_len(out, ct);
    return 2 + ct;
}

/* The application frame (prefix included) of a ping with the given id, for the server. */
static size_t ping_frame(uint64_t id, uint8_t *out, size_t cap) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__Ping ping = TESSERA__PING__INIT;
    ping.has_target_id = 1;
    ping.target_id.data = S.id.id.b;
    ping.target_id.len = TS_NODE_ID_BYTES;
    env.has_request_id = 1;
    env.request_id = id;
    env.body_case = TESSERA__ENVELOPE__BODY_PING;
    env.ping = &ping;
    uint8_t *buf;
    size_t len;
    TU_CHECK_OK(ts_frame_encode_envelope(&env, 0, MAX_FRAME, &buf, &len, NULL, 0));
    assert_true(len <= cap);
    memcpy(out, buf, len);
    free(buf);
    return len;
}

/* The next whole frame from the server, decoded (free with ts_frame_free), or NULL when the
 * stream ended first. */
static Tessera__Envelope *raw_recv(raw_t *r) {
    for (;;) {
        while (r->pt_pos < r->pt_len) {
            const uint8_t *f;
            size_t used = 0, flen = 0;
            TU_CHECK_OK(ts_frame_reader_feed(&r->ard, r->pt + r->pt_pos, r->pt_len - r->pt_pos,
                                             &used, &f, &flen, NULL, 0));
            r->pt_pos += used;
            if (f) {
                Tessera__Envelope *env = NULL;
                TU_CHECK_OK(ts_frame_decode_envelope(f, flen, 0, &env, NULL, 0));
                return env;
            }
        }
        uint8_t msg[TS_NOISE_MAX_MESSAGE];
        size_t len;
        if (recv_noise(r, msg, &len))
            return NULL;
        TU_CHECK_OK(ts_noise_transport_decrypt(&r->tr, msg, len, r->pt, sizeof r->pt, &r->pt_len));
        r->pt_pos = 0;
    }
}

/* Pings the server n times on r, each answered by an ack with its id. */
static void raw_ping(raw_t *r, int n) {
    for (int i = 0; i < n; i++) {
        uint8_t frame[256], msg[300];
        uint64_t id = r->next_id;
        r->next_id += 2;
        size_t fl = ping_frame(id, frame, sizeof frame);
        size_t ml = seal(r, frame, fl, msg);
        write_all(r->fd, msg, ml);
        Tessera__Envelope *env = raw_recv(r);
        assert_non_null(env);
        assert_int_equal(env->body_case, TESSERA__ENVELOPE__BODY_ACK);
        assert_int_equal(env->request_id, id);
        ts_frame_free(env);
    }
}

/* 1 when the server closed r's connection (end of stream or reset), reading away what comes
 * first; 0 when it stayed open for WAIT_S. Counts the bytes that came before the close. */
static int wait_closed(raw_t *r, size_t *bytes_before) {
    uint8_t buf[4096];
    size_t total = 0;
    for (;;) {
        ssize_t n = recv(r->fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        if (bytes_before)
            *bytes_before = total;
        if (n == 0 || errno == ECONNRESET)
            return 1;
        return 0; /* EAGAIN: the receive timeout passed with the connection open */
    }
}

/* A client that does everything right: handshake, three pings answered. */
static void good_client(void) {
    raw_t r;
    raw_connect(&r, NULL, 0);
    assert_int_equal(raw_handshake(&r, &client_id, &S.nk, NULL), 0);
    assert_memory_equal(r.peer.b, S.id.id.b, TS_NODE_ID_BYTES);
    raw_ping(&r, 3);
    raw_close(&r);
}

/* ---- the tests ------------------------------------------------------------------------------- */

static void test_good_client(void **state) {
    ts_net_stats_t before = settled();
    good_client();
    wait_for(live_accepted_is, 0, "the good client's connection gone");
    assert_true(stats().opened >= before.opened + 1);
    assert_true(stats().frames_in >= before.frames_in + 3);
}

static void test_wrong_network_key(void **state) {
    ts_netkey_t other;
    ts_netkey_generate(&other);
    ts_net_stats_t before = settled();
    raw_t r;
    raw_connect(&r, NULL, 0);
    /* The initiator finishes its side (the psk is only checked by the responder's read of
     * message 3) and sends a request at once: the server must decrypt none of it. */
    assert_int_equal(raw_handshake(&r, &client_id, &other, NULL), 0);
    uint8_t frame[256], msg[300];
    size_t ml = seal(&r, frame, ping_frame(1, frame, sizeof frame), msg);
    write_all(r.fd, msg, ml);
    size_t got = 1;
    assert_true(wait_closed(&r, &got));
    assert_int_equal(got, 0); /* no answer, not a byte */
    raw_close(&r);
    wait_for(closed_handshake, before.closed[TS_CONN_CLOSE_HANDSHAKE] + 1, "a handshake failure");
    wait_for(live_accepted_is, 0, "the connection gone");
    ts_net_stats_t after = stats();
    assert_int_equal(after.opened, before.opened);
    assert_int_equal(after.frames_in, before.frames_in);
    ts_netkey_wipe(&other);
    good_client();
}

static void test_flipped_byte(void **state) {
    /* In the first byte of ciphertext, in the middle, and in the tag. */
    const size_t where[] = {2, 20, 0 /* the last byte: set below */};
    for (int k = 0; k < 3; k++) {
        ts_net_stats_t before = settled();
        raw_t r;
        raw_connect(&r, NULL, 0);
        assert_int_equal(raw_handshake(&r, &client_id, &S.nk, NULL), 0);
        raw_ping(&r, 1); /* the session works... */
        uint8_t frame[256], msg[300];
        size_t ml = seal(&r, frame, ping_frame(r.next_id, frame, sizeof frame), msg);
        msg[k < 2 ? where[k] : ml - 1] ^= 0x01; /* ...until one bit changes */
        write_all(r.fd, msg, ml);
        size_t got = 1;
        assert_true(wait_closed(&r, &got));
        assert_int_equal(got, 0);
        raw_close(&r);
        wait_for(closed_decrypt, before.closed[TS_CONN_CLOSE_DECRYPT] + 1, "a decrypt failure");
        assert_int_equal(stats().frames_in, before.frames_in + 1); /* only the good ping */
    }
    good_client();
}

static void test_replay_and_reorder(void **state) {
    /* Replay: a message the server accepted, sent again. */
    ts_net_stats_t before = settled();
    raw_t r;
    raw_connect(&r, NULL, 0);
    assert_int_equal(raw_handshake(&r, &client_id, &S.nk, NULL), 0);
    uint8_t frame[256], m1[300], m2[300];
    size_t l1 = seal(&r, frame, ping_frame(1, frame, sizeof frame), m1);
    write_all(r.fd, m1, l1);
    Tessera__Envelope *env = raw_recv(&r);
    assert_non_null(env);
    assert_int_equal(env->request_id, 1);
    ts_frame_free(env);
    write_all(r.fd, m1, l1);
    size_t got = 1;
    assert_true(wait_closed(&r, &got));
    assert_int_equal(got, 0);
    raw_close(&r);
    wait_for(closed_decrypt, before.closed[TS_CONN_CLOSE_DECRYPT] + 1, "the replay refused");

    /* Reorder: two messages, the second sent first. */
    before = settled();
    raw_connect(&r, NULL, 0);
    assert_int_equal(raw_handshake(&r, &client_id, &S.nk, NULL), 0);
    l1 = seal(&r, frame, ping_frame(1, frame, sizeof frame), m1);
    size_t l2 = seal(&r, frame, ping_frame(3, frame, sizeof frame), m2);
    write_all(r.fd, m2, l2);
    write_all(r.fd, m1, l1);
    assert_true(wait_closed(&r, &got));
    assert_int_equal(got, 0);
    raw_close(&r);
    wait_for(closed_decrypt, before.closed[TS_CONN_CLOSE_DECRYPT] + 1, "the reorder refused");
    assert_int_equal(stats().frames_in, before.frames_in);
    good_client();
}

/* Sends one transport message holding pt, then expects the close. */
static void framing_attack(const uint8_t *pt, size_t n, int zero_noise_len) {
    ts_net_stats_t before = settled();
    raw_t r;
    raw_connect(&r, NULL, 0);
    assert_int_equal(raw_handshake(&r, &client_id, &S.nk, NULL), 0);
    raw_ping(&r, 1);
    atomic_store(&largest_alloc, 0);
    if (zero_noise_len) {
        uint8_t z[2] = {0, 0};
        write_all(r.fd, z, 2);
    } else {
        uint8_t msg[300];
        write_all(r.fd, msg, seal(&r, pt, n, msg));
    }
    size_t got = 1;
    assert_true(wait_closed(&r, &got));
    assert_int_equal(got, 0);
    raw_close(&r);
    wait_for(closed_framing, before.closed[TS_CONN_CLOSE_FRAMING] + 1, "a framing error");
    /* Nothing anywhere in the process allocated anything near the announced size. */
    size_t largest = atomic_load(&largest_alloc);
    if (largest >= 256u << 10) {
        print_error("largest allocation during the attack: %zu bytes\n", largest);
        fail();
    }
}

static void test_oversize_and_zero_lengths(void **state) {
    const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
    framing_attack(huge, 4, 0);
    uint8_t over[4];
    ts_frame_put_app_len(over, 1, 2); /* then overwrite with max_frame + 1 */
    uint32_t v = MAX_FRAME + 1;
    over[0] = (uint8_t)(v >> 24), over[1] = (uint8_t)(v >> 16), over[2] = (uint8_t)(v >> 8),
    over[3] = (uint8_t)v;
    framing_attack(over, 4, 0);
    const uint8_t zero[4] = {0, 0, 0, 0};
    framing_attack(zero, 4, 0);
    framing_attack(NULL, 0, 1); /* a Noise length of 0 */
    good_client();
}

static void test_silent_and_slow_peers(void **state) {
    for (int slow = 0; slow < 2; slow++) {
        ts_net_stats_t before = settled();
        raw_t r;
        raw_connect(&r, NULL, 0);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (slow) { /* message 1, one byte at a time, each 50 ms apart (loosely) */
            struct timeval tv = {0, 50000};
            setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            /* the legal prefix 0x0030, then the 48 bytes, which never all arrive in time */
            for (int i = 0;; i++) {
                uint8_t b = i == 1 ? 48 : 0;
                write_all(r.fd, &b, 1);
                uint8_t x;
                ssize_t n = recv(r.fd, &x, 1, 0);
                if (n == 0 || (n < 0 && errno == ECONNRESET))
                    break;
                clock_gettime(CLOCK_MONOTONIC, &t1);
                assert_true(t1.tv_sec - t0.tv_sec < WAIT_S);
                assert_true(i < 48); /* 48 × 50 ms: the timeout must have struck long before */
            }
        } else {
            assert_true(wait_closed(&r, NULL));
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        raw_close(&r);
        wait_for(closed_hs_timeout, before.closed[TS_CONN_CLOSE_HANDSHAKE_TIMEOUT] + 1,
                 "a handshake timeout");
        /* Dropped by the timeout, not before it (the loop's cached clock may run up to one loop
         * iteration behind, hence the margin). */
        assert_true(ms >= HS_TIMEOUT_MS * 0.5);
    }
    good_client();
}

static void test_identity_for_another_static_key(void **state) {
    /* The attacker holds client_id's signing key but runs the handshake with another static
     * key, and presents client_id's genuine payload (which signs client_id's static key). */
    ts_identity_t fake = client_id;
    TU_CHECK_OK(ts_noise_keypair_generate(&fake.noise));
    uint8_t payload[TS_IDENTITY_PAYLOAD_BYTES];
    ts_identity_payload(&client_id, payload);
    ts_net_stats_t before = settled();
    raw_t r;
    raw_connect(&r, NULL, 0);
    assert_int_equal(raw_handshake(&r, &fake, &S.nk, payload), 0);
    size_t got = 1;
    assert_true(wait_closed(&r, &got));
    assert_int_equal(got, 0);
    raw_close(&r);
    wait_for(closed_identity, before.closed[TS_CONN_CLOSE_IDENTITY] + 1, "an identity refusal");
    assert_int_equal(stats().opened, before.opened);
    ts_identity_wipe(&fake);
    good_client();
}

/* ---- a malicious responder ------------------------------------------------------------------
 *
 * The mirror of the test above: this side (a ts_net_t on the test's own loop) connects to a
 * responder written from the primitives, on a thread of its own, that holds the server's
 * signing key but runs the handshake with another static key, and presents the server's genuine
 * payload (which signs the server's static key). The client must refuse the session before it
 * sends message 3. The same responder with the genuine static key is the control: there the
 * session opens and message 3 arrives, so the refusal is the signature's doing. */

typedef struct evil_responder {
    int listen_fd;
    ts_identity_t as; /* whose handshake it runs: S.id's signing key, some static key */
    uint8_t payload[TS_IDENTITY_PAYLOAD_BYTES];
    int msg1_ok, msg2_sent;
    int closed;   /* the client closed the connection (1), or it stayed open for WAIT_S (0) */
    size_t after; /* bytes the client sent after message 2 */
} evil_responder_t;

/* Runs on its own thread, so it records what happened and leaves asserting to the test. */
static void *evil_responder_main(void *arg) {
    evil_responder_t *e = arg;
    raw_t r; /* for wait_closed */
    memset(&r, 0, sizeof r);
    r.fd = accept(e->listen_fd, NULL, NULL);
    if (r.fd < 0)
        return NULL;
    struct timeval tv = {WAIT_S, 0};
    setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ts_noise_handshake_t hs;
    uint8_t msg[2 + 256], pay[64];
    size_t len = 0, plen = 0;
    if (ts_identity_handshake_init(&hs, &e->as, &S.nk, 0) == TS_OK &&
        read_exact(r.fd, msg, 2) == 0 && (len = (size_t)msg[0] << 8 | msg[1]) == 48 &&
        read_exact(r.fd, msg, len) == 0 &&
        ts_noise_handshake_read_message(&hs, msg, len, pay, sizeof pay, &plen) == TS_OK &&
        plen == 0) {
        e->msg1_ok = 1;
        if (ts_noise_handshake_write_message(&hs, e->payload, sizeof e->payload, msg + 2,
                                             sizeof msg - 2, &len) == TS_OK) {
            ts_frame_put_noise_len(msg, len);
            write_all(r.fd, msg, 2 + len);
            e->msg2_sent = 1;
        }
    }
    ts_noise_handshake_wipe(&hs);
    e->closed = wait_closed(&r, &e->after);
    close(r.fd);
    return NULL;
}

static struct {
    int opened, closed;
    ts_conn_close_reason_t reason;
    int was_open;
    char message[320];
} evil_seen;

static void evil_on_open(ts_conn_t *c) {
    evil_seen.opened++;
    ts_conn_close(c);
}
static void evil_on_close(ts_conn_t *c, const ts_conn_close_info_t *why) {
    (void)c;
    evil_seen.closed++;
    evil_seen.reason = why->reason;
    evil_seen.was_open = why->was_open;
    snprintf(evil_seen.message, sizeof evil_seen.message, "%s", why->message);
}

/* Connects a fresh ts_net_t (identity client_id) to an evil responder running as `as` with the
 * server's genuine payload; returns when the connection is gone, with *st its net's counters. */
static void connect_to_evil_responder(evil_responder_t *e, ts_net_stats_t *st) {
    memset(&evil_seen, 0, sizeof evil_seen);
    ts_identity_payload(&S.id, e->payload);
    e->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(e->listen_fd >= 0);
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(bind(e->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(e->listen_fd, 1), 0);
    assert_int_equal(getsockname(e->listen_fd, (struct sockaddr *)&a, &alen), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, evil_responder_main, e), 0);

    uv_loop_t loop;
    uv_loop_init(&loop);
    ts_net_t *net;
    TU_CHECK_OK(ts_net_new(&net, &loop, &client_id, &S.nk, NULL));
    const ts_conn_handler_t h = {evil_on_open, NULL, NULL, evil_on_close};
    char addr[64], err[256] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    ts_conn_t *c;
    TU_CHECK_RC_MSG(ts_conn_connect(net, addr, &h, NULL, &c, err, sizeof err), TS_OK, err);
    /* the handshake timeout (10 s) ends it at the latest */
    tu_run_until_flag(&loop, &evil_seen.closed, WAIT_S * 1000,
                      "the evil responder's connection closed");
    ts_net_stats(net, st);
    ts_net_shutdown(net);
    uv_run(&loop, UV_RUN_DEFAULT);
    TU_CHECK_OK(ts_net_free(net));
    assert_int_equal(uv_loop_close(&loop), 0);
    pthread_join(th, NULL);
    close(e->listen_fd);
    assert_true(e->msg1_ok && e->msg2_sent);
    assert_true(e->closed);
    assert_int_equal(evil_seen.closed, 1);
}

static void test_responder_identity_for_another_static_key(void **state) {
    evil_responder_t e;
    ts_net_stats_t st;

    /* the control: the server's own keys, so the session opens and message 3 (2 + 161 bytes)
     * reaches the responder before the client closes */
    memset(&e, 0, sizeof e);
    e.as = S.id;
    connect_to_evil_responder(&e, &st);
    assert_int_equal(evil_seen.opened, 1);
    assert_int_equal(evil_seen.reason, TS_CONN_CLOSE_LOCAL);
    assert_int_equal(e.after, 2 + 161);
    assert_int_equal(st.opened, 1);

    /* the attack: another static key under the server's genuine payload */
    memset(&e, 0, sizeof e);
    e.as = S.id;
    TU_CHECK_OK(ts_noise_keypair_generate(&e.as.noise));
    connect_to_evil_responder(&e, &st);
    assert_int_equal(evil_seen.opened, 0);
    assert_int_equal(evil_seen.reason, TS_CONN_CLOSE_IDENTITY);
    assert_false(evil_seen.was_open);
    TU_CHECK_CONTAINS(evil_seen.message, "sent an identity that does not match its handshake key");
    assert_int_equal(e.after, 0); /* refused before message 3: the client sent nothing more */
    assert_int_equal(st.opened, 0);
    assert_int_equal(st.closed[TS_CONN_CLOSE_IDENTITY], 1);
    ts_identity_wipe(&e.as);
}

/* ---- frames of every size across Noise messages, byte for byte ------------------------------
 *
 * Two ts_net_t on the test's own loop: the accepting side echoes each frame back, sent as three
 * parts split at odd places; the connecting side sends frames whose sizes straddle the Noise
 * message boundaries (65519 plaintext bytes, the first message holding the 4-byte prefix), each
 * as two parts, and checks every echo byte for byte. This covers, both ways, sealing from the
 * caller's parts and from the gathered slot, and decrypting into the scratch buffer and
 * straight into the frame being reassembled. */

static const size_t echo_sizes[] = {1,      65515,  65516,  65519,  65520,   131034,
                                    131035, 131040, 200000, 999999, 1u << 20};
#define ECHO_N (sizeof echo_sizes / sizeof echo_sizes[0])
static struct {
    ts_conn_t *client;
    uint8_t *frame;
    size_t next, bad;
    int done, server_closed, client_closed;
} echo;

static void echo_send_next(void) {
    size_t n = echo_sizes[echo.next], cut = n / 3;
    for (size_t i = 0; i < n; i++)
        echo.frame[i] = (uint8_t)(i * 7 + echo.next);
    ts_conn_part_t parts[2] = {{echo.frame, cut}, {echo.frame + cut, n - cut}};
    TU_CHECK_OK(ts_conn_sendv(echo.client, parts, 2));
}
static void echo_client_open(ts_conn_t *c) {
    echo.client = c;
    echo_send_next();
}
static void echo_client_frame(ts_conn_t *c, const uint8_t *d, size_t n) {
    if (n != echo_sizes[echo.next] || memcmp(d, echo.frame, n) != 0) {
        print_error("the echo of frame %zu (%zu bytes) came back as %zu different bytes\n",
                    echo.next, echo_sizes[echo.next], n);
        echo.bad++;
    }
    if (++echo.next == ECHO_N) {
        echo.done = 1;
        ts_conn_close(c);
        return;
    }
    echo_send_next();
}
static void echo_server_frame(ts_conn_t *c, const uint8_t *d, size_t n) {
    size_t a = n / 2, b = a + (n - a) / 3;
    ts_conn_part_t parts[3] = {{d, a}, {d + a, b - a}, {d + b, n - b}};
    TU_CHECK_OK(ts_conn_sendv(c, parts, 3));
}
static void echo_client_close(ts_conn_t *c, const ts_conn_close_info_t *why) {
    (void)c, (void)why;
    echo.client_closed = 1;
}
static void echo_server_close(ts_conn_t *c, const ts_conn_close_info_t *why) {
    (void)c, (void)why;
    echo.server_closed = 1;
}

static void test_frames_across_messages(void **state) {
    memset(&echo, 0, sizeof echo);
    echo.frame = malloc(1u << 20);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ts_net_t *net;
    TU_CHECK_OK(ts_net_new(&net, &loop, &client_id, &S.nk, NULL));
    const ts_conn_handler_t server = {NULL, echo_server_frame, NULL, echo_server_close};
    const ts_conn_handler_t client = {echo_client_open, echo_client_frame, NULL, echo_client_close};
    ts_listener_t *l;
    char addr[64], err[256] = "";
    TU_CHECK_RC_MSG(ts_net_listen(net, "127.0.0.1:0", &server, NULL, &l, err, sizeof err), TS_OK,
                    err);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ts_listener_port(l));
    ts_conn_t *c;
    TU_CHECK_RC_MSG(ts_conn_connect(net, addr, &client, NULL, &c, err, sizeof err), TS_OK, err);
    tu_run_until_flag(&loop, &echo.client_closed, WAIT_S * 1000, "the echo client closed");
    assert_int_equal(echo.next, ECHO_N);
    assert_int_equal(echo.bad, 0);
    ts_net_stats_t st;
    ts_net_stats(net, &st);
    assert_int_equal(st.frames_in, 2 * ECHO_N);
    assert_int_equal(st.closed[TS_CONN_CLOSE_DECRYPT] + st.closed[TS_CONN_CLOSE_FRAMING], 0);
    ts_net_shutdown(net);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_true(echo.server_closed);
    TU_CHECK_OK(ts_net_free(net));
    assert_int_equal(uv_loop_close(&loop), 0);
    free(echo.frame);
}

static void test_garbage_before_handshake(void **state) {
    static const char http[] = "GET / HTTP/1.1\r\nHost: tessera\r\n\r\n";
    uint8_t msg1[2 + 48];
    msg1[0] = 0, msg1[1] = 48; /* the right size, random content: the tag fails */
    randombytes_buf(msg1 + 2, 48);
    const struct {
        const uint8_t *p;
        size_t n;
    } cases[] = {{(const uint8_t *)http, sizeof http - 1}, {msg1, sizeof msg1}};
    for (int k = 0; k < 2; k++) {
        ts_net_stats_t before = settled();
        raw_t r;
        raw_connect(&r, NULL, 0);
        write_all(r.fd, cases[k].p, cases[k].n);
        size_t got = 1;
        assert_true(wait_closed(&r, &got));
        assert_int_equal(got, 0);
        raw_close(&r);
        /* refused at once for what it is, not by the timeout */
        wait_for(closed_handshake, before.closed[TS_CONN_CLOSE_HANDSHAKE] + 1, "garbage refused");
        assert_int_equal(stats().closed[TS_CONN_CLOSE_HANDSHAKE_TIMEOUT],
                         before.closed[TS_CONN_CLOSE_HANDSHAKE_TIMEOUT]);
    }
    good_client();
}

/* No memory for a connection's state when it is accepted: the socket is accepted and closed at
 * once (the peer sees a close, not a hang until a timeout), no connection is counted, and the
 * listener goes on serving. */
/* One connection with the server thread's next calloc armed to fail: 1 when it was dropped at
 * accept (closed with nothing sent, never counted as accepted, no handshake timeout), 0 when
 * the armed failure went to another of the server thread's callocs and the connection was
 * accepted as usual (it then ends by the handshake timeout). */
static int dropped_at_accept(void) {
    ts_net_stats_t before = settled();
    atomic_store(&server_callocs_to_fail, 1);
    raw_t r;
    raw_connect(&r, NULL, 0);
    size_t got = 1;
    assert_true(wait_closed(&r, &got));
    assert_int_equal(got, 0);
    raw_close(&r);
    assert_int_equal(atomic_load(&server_callocs_to_fail), 0); /* the failure was taken */
    ts_net_stats_t after = settled();
    uint64_t timeouts = after.closed[TS_CONN_CLOSE_HANDSHAKE_TIMEOUT] -
                        before.closed[TS_CONN_CLOSE_HANDSHAKE_TIMEOUT];
    if (after.accepted == before.accepted) {
        assert_int_equal(timeouts, 0);
        return 1;
    }
    assert_int_equal(after.accepted, before.accepted + 1); /* the usual path, and nothing else */
    assert_int_equal(timeouts, 1);
    return 0;
}

/* Out of memory for a new connection: it is dropped, the server stays up and serves the next
 * one. Twice, each within three tries (CI once saw the armed failure taken by another calloc of
 * the server thread, and the connection accepted as usual). */
static void test_out_of_memory_at_accept(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        int tries = 0;
        while (!dropped_at_accept())
            if (++tries >= 3)
                fail_msg("three connections in a row were accepted despite the failed calloc");
    }
    good_client();
}

static void test_connection_limits(void **state) {
    raw_t held[TOTAL];
    int n = 0;
    ts_net_stats_t before = settled();
    /* PER_ADDR from 127.0.0.2, all open... */
    for (int i = 0; i < PER_ADDR; i++, n++) {
        raw_connect(&held[n], "127.0.0.2", 0);
        assert_int_equal(raw_handshake(&held[n], &client_id, &S.nk, NULL), 0);
        raw_ping(&held[n], 1);
    }
    /* ...so one more from there is refused at once, before any handshake byte. */
    raw_t extra;
    raw_connect(&extra, "127.0.0.2", 0);
    assert_int_equal(raw_handshake(&extra, &client_id, &S.nk, NULL), -1);
    raw_close(&extra);
    wait_for(refused_at_least, before.refused_limit + 1, "the per-address refusal");
    /* Others fill the total... */
    for (int i = 0; n < TOTAL; i++, n++) {
        raw_connect(&held[n], "127.0.0.3", 0);
        assert_int_equal(raw_handshake(&held[n], &client_id, &S.nk, NULL), 0);
        raw_ping(&held[n], 1);
    }
    raw_connect(&extra, "127.0.0.4", 0);
    assert_int_equal(raw_handshake(&extra, &client_id, &S.nk, NULL), -1);
    raw_close(&extra);
    wait_for(refused_at_least, before.refused_limit + 2, "the total refusal");
    /* The admitted ones still work. */
    for (int i = 0; i < n; i++)
        raw_ping(&held[i], 1);
    for (int i = 0; i < n; i++)
        raw_close(&held[i]);
    wait_for(live_accepted_is, 0, "the held connections gone");
    good_client();
}

/* Sends the start of one application frame on r: a prefix announcing len bytes, then body bytes
 * of it (body < len), in transport messages of at most 60000 bytes. */
static void raw_partial_frame(raw_t *r, uint32_t len, size_t body) {
    static uint8_t pt[60000], msg[60100];
    size_t sent = 0;
    int first = 1;
    while (first || sent < body) {
        size_t n = 0;
        if (first) {
            assert_int_equal(ts_frame_put_app_len(pt, len, MAX_FRAME), TS_OK);
            n = TS_FRAME_APP_HEADER;
            first = 0;
        }
        size_t take = body - sent < sizeof pt - n ? body - sent : sizeof pt - n;
        memset(pt + n, 0x5a, take);
        n += take;
        sent += take;
        size_t ml = seal(r, pt, n, msg);
        write_all(r->fd, msg, ml);
    }
}

static int closed_budget(const ts_net_stats_t *st, uint64_t want) {
    return st->closed[TS_CONN_CLOSE_BUDGET] >= want;
}
static int partial_at_least(const ts_net_stats_t *st, uint64_t want) {
    return st->partial_bytes >= want;
}

/* A node-wide budget for partly received frames: key holders that each start a large frame and
 * never finish it pin at most PARTIAL_BUDGET (plus one frame's growth) between them; the one
 * whose frame takes the account over is closed ("budget"), the others keep working, and the
 * memory comes back when they close. */
static void test_partial_frame_budget(void **state) {
    (void)state;
    ts_net_stats_t before = settled();
    raw_t c[3];
    static const char *const src[3] = {"127.0.0.9", "127.0.0.10", "127.0.0.11"};
    for (int i = 0; i < 3; i++) {
        raw_connect(&c[i], src[i], 0);
        assert_int_equal(raw_handshake(&c[i], &client_id, &S.nk, NULL), 0);
    }
    /* two frames of MAX_FRAME, 70 % sent: each reader holds about MAX_FRAME, the budget's half */
    for (int i = 0; i < 2; i++) {
        raw_partial_frame(&c[i], MAX_FRAME, MAX_FRAME * 7 / 10);
        wait_for(partial_at_least, (uint64_t)(i + 1) * MAX_FRAME * 7 / 10,
                 "the partial frames held");
    }
    raw_partial_frame(&c[2], MAX_FRAME, MAX_FRAME * 7 / 10);
    wait_for(closed_budget, before.closed[TS_CONN_CLOSE_BUDGET] + 1, "the refusal over budget");
    size_t got = 0;
    assert_true(wait_closed(&c[2], &got));
    ts_net_stats_t mid = stats();
    assert_true(mid.partial_bytes <= PARTIAL_BUDGET);
    raw_close(&c[2]);
    for (int i = 0; i < 2; i++)
        raw_close(&c[i]);
    wait_for(live_accepted_is, 0, "the connections gone");
    assert_int_equal(stats().partial_bytes, 0);
    good_client();
}

static void test_backpressure(void **state) {
    enum { N = 20000 };
    ts_net_stats_t before = settled();
    raw_t r;
    raw_connect(&r, NULL, 4096); /* a small receive buffer: the server's answers back up fast */
    assert_int_equal(raw_handshake(&r, &client_id, &S.nk, NULL), 0);

    /* N pings, as many per transport message as fit, all encrypted up front. */
    size_t cap = (size_t)N * 64 + 65536, len = 0;
    uint8_t *wire = malloc(cap), *pt = malloc(TS_NOISE_MAX_PLAINTEXT);
    assert_non_null(wire);
    assert_non_null(pt);
    size_t pl = 0;
    for (int i = 0; i < N; i++) {
        uint8_t f[128];
        size_t fl = ping_frame(2 * (uint64_t)i + 1, f, sizeof f);
        if (pl + fl > TS_NOISE_MAX_PLAINTEXT) {
            len += seal(&r, pt, pl, wire + len);
            pl = 0;
        }
        memcpy(pt + pl, f, fl);
        pl += fl;
    }
    len += seal(&r, pt, pl, wire + len);

    /* Send without reading until the socket refuses more or all is sent. */
    size_t sent = 0;
    while (sent < len) {
        ssize_t w = send(r.fd, wire + sent, len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            break;
        sent += (size_t)w;
    }
    /* The server must stop reading rather than queue every answer. */
    wait_for(pauses_at_least, before.read_pauses + 1, "reading paused over the high-water mark");

    /* Now read everything (sending the rest as the socket takes it): every request is answered
     * exactly once, by an ack or a busy. */
    uint8_t *answered = calloc(N, 1);
    int acks = 0, busy = 0;
    while (acks + busy < N) {
        while (sent < len) {
            ssize_t w = send(r.fd, wire + sent, len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w <= 0)
                break;
            sent += (size_t)w;
        }
        Tessera__Envelope *env = raw_recv(&r);
        assert_non_null(env);
        uint64_t id = env->request_id;
        assert_true(id % 2 == 1 && id < 2 * (uint64_t)N);
        assert_int_equal(answered[id / 2], 0);
        answered[id / 2] = 1;
        if (env->body_case == TESSERA__ENVELOPE__BODY_ACK)
            acks++;
        else if (env->body_case == TESSERA__ENVELOPE__BODY_BUSY)
            busy++;
        else
            fail_msg("unexpected answer %s", ts_frame_body_name(env->body_case));
        ts_frame_free(env);
    }
    assert_int_equal(sent, len);
    raw_close(&r);
    ts_net_stats_t after = stats();
    /* Bounded: the mark plus what one read of requests (64 KiB) can produce, far below the
     * ~700 KiB that queueing every answer would take. */
    if (after.write_queue_peak > HIGH_WATER + (256u << 10)) {
        print_error("write queue peaked at %zu bytes (high-water %u)\n", after.write_queue_peak,
                    HIGH_WATER);
        fail();
    }
    print_message("backpressure: %d acks, %d busy, %llu pauses, queue peak %zu bytes\n", acks, busy,
                  (unsigned long long)(after.read_pauses - before.read_pauses),
                  after.write_queue_peak);
    free(answered);
    free(wire);
    free(pt);
    good_client();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_client),
        cmocka_unit_test(test_wrong_network_key),
        cmocka_unit_test(test_flipped_byte),
        cmocka_unit_test(test_replay_and_reorder),
        cmocka_unit_test(test_oversize_and_zero_lengths),
        cmocka_unit_test(test_silent_and_slow_peers),
        cmocka_unit_test(test_identity_for_another_static_key),
        cmocka_unit_test(test_responder_identity_for_another_static_key),
        cmocka_unit_test(test_frames_across_messages),
        cmocka_unit_test(test_garbage_before_handshake),
        cmocka_unit_test(test_out_of_memory_at_accept),
        cmocka_unit_test(test_connection_limits),
        cmocka_unit_test(test_partial_frame_budget),
        cmocka_unit_test(test_backpressure),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
