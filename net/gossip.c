/*
 * gossip.c — the SWIM core (net/swim.h) driven by a libuv loop: sealed UDP datagrams, one timer,
 * push-pull and advert fetches over RPC (net/rpc.h), the address book, and the status view
 * (gossip.h says what each does; docs/architecture.md, "The gossip driver", how they fit).
 *
 * The core is a pure state machine, so this file is its plumbing. Every call into it — a tick,
 * a datagram, a join, a merge, an advert change, a leave — is followed by pump(), which drains
 * the core's two queues (packets go out sealed at once; events are acted on, then handed to the
 * owner's callback) and re-arms the one core timer for ts_swim_next_deadline(). Nothing else
 * calls the core, so "drain after every call" holds by construction.
 *
 * The datagram path. Out: ts_swim_wire_encode → seal (version, counter, nonce, XChaCha20-Poly1305
 * under a key derived from the network key; docs/protocol.md, "Sealed datagrams") →
 * uv_udp_try_send. In: size and version checks → open → the sender's replay window → decode →
 * ts_swim_on_packet. What fails a step is dropped and counted; a datagram never leads to an
 * answer of its own, only the core decides what to send.
 *
 * TCP work is asynchronous and tracked as operations (op_t: a push-pull or an advert fetch) in
 * one list, so that close can cancel what is in flight. Their results re-enter the core through
 * ts_swim_merge_state (push-pull) or only this layer's advert table (fetches).
 *
 * A second timer, the housekeeper, runs every HOUSEKEEP_MS: it writes the members heard alive
 * since the last run to the address book in one transaction, and retries advert fetches that
 * failed (the core asks for an advert once per claim; a lost fetch would otherwise never be
 * retried).
 */
#define _POSIX_C_SOURCE 200809L

#include "net/gossip.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/list.h"
#include "net/frame.h"
#include "net/swim_wire.h"
#include "store/peers.h"

/* ---- constants ------------------------------------------------------------------------------ */

#define SEAL_VERSION 1
#define SEAL_NONCE 24
#define SEAL_TAG 16
#define SEAL_HEADER (1 + 8 + SEAL_NONCE) /* version, counter, nonce */
#define SEAL_OVERHEAD (SEAL_HEADER + SEAL_TAG)
#define SEAL_AD 9 /* the associated data: version and counter */
static const char SEAL_CONTEXT[] = "tessera/gossip/seal/1";
_Static_assert(SEAL_OVERHEAD <= TS_SWIM_SEAL_RESERVE, "the seal fits the core's reserve");

#define REPLAY_WINDOW 64       /* counters below the highest that may still arrive (bits) */
#define HOUSEKEEP_MS 1000      /* book writes and advert retries */
#define BOOK_REFRESH_MS 600000 /* every member alive is rewritten this often (its last_seen) */
#define MAX_PUSH_PULLS 8       /* push-pull exchanges in flight */
#define MAX_FETCHES 32         /* advert fetches in flight */
#define MAX_UNCOVERED 65536    /* uncovered clusters listed in one status answer */
#define ADDR_STR 64            /* "[v6]:port" and a NUL */
#define RECV_BUF 2048          /* larger than any datagram we accept: a longer one is truncated */

/* ---- the state ------------------------------------------------------------------------------ */

/* One sender's replay window: the highest counter seen and which of the 64 below it were. */
typedef struct replay {
    uint8_t id[TS_SWIM_ID_LEN];
    uint64_t top, seen;
    uint64_t heard_ms; /* for eviction: the least recently heard goes first */
} replay_t;

/* An advert held: ours or one fetched and verified. */
typedef struct advert {
    uint8_t id[TS_SWIM_ID_LEN];
    uint64_t version;
    uint8_t hash[TS_SWIM_HASH_LEN];
    uint8_t *packed; /* the signed Advert, packed */
    size_t packed_len;
    Tessera__Advert *msg;      /* unpacked from packed (protobuf-c's allocator) */
    Tessera__AdvertBody *body; /* decoded from msg->body (ts_frame_free) */
} advert_t;

typedef enum { OP_PUSH_PULL, OP_FETCH } op_kind_t;

/* A TCP exchange in flight. */
typedef struct op {
    ts_list_t link;
    ts_gossip_t *g;
    op_kind_t kind;
    ts_rpc_call_t *call;
    ts_rpc_peer_t *peer;
    uint8_t id[TS_SWIM_ID_LEN]; /* the member (zero for a join's push-pull) */
} op_t;

/* A bootstrap name being resolved. */
typedef struct resolve {
    uv_getaddrinfo_t req;
    ts_gossip_t *g;
} resolve_t;

struct ts_gossip {
    uv_loop_t *loop;
    ts_rpc_t *rpc;
    char health[256];       /* StatusResponse.health ("" until set: not sent) */
    char metrics_url[128];  /* StatusResponse.metrics ("": not sent) */
    ts_gossip_config_t cfg; /* bootstrap, listen, advertise point into the copies below */
    char listen[ADDR_STR], advertise[ADDR_STR];
    char **bootstrap;
    ts_node_id_t self;
    uint8_t sign_sk[TS_SIGN_SECRET_BYTES]; /* secret: wiped by ts_gossip_free */
    uint8_t seal_key[32];                  /* secret: wiped by ts_gossip_free */
    ts_swim_t *swim;                       /* created by start, once the port is known */
    ts_swim_addr_t self_addr;

    uv_udp_t udp;
    uv_timer_t timer, housekeeper;
    int handles; /* handles initialised and not yet closed */
    int started, closing;
    uint8_t recv_buf[RECV_BUF];
    uint64_t counter; /* the next datagram's seal counter */

    replay_t *replay;
    uint32_t n_replay, max_replay;

    advert_t *adverts; /* unordered; at most max_members */
    uint32_t n_adverts;
    Tessera__AdvertBody *own_body; /* our advert before start (announced there), else NULL */
    uint64_t own_version;

    ts_list_t ops;
    uint32_t n_push_pulls, n_fetches;
    resolve_t *resolves;
    uint32_t n_resolves, pending_resolves;
    ts_swim_addr_t seeds[TS_GOSSIP_MAX_SEEDS];
    uint32_t n_seeds;

    uint8_t (*dirty)[TS_SWIM_ID_LEN]; /* members heard alive since the last book write */
    uint32_t n_dirty;
    int book_full; /* the dirty list overflowed, or a refresh is due: write every live member */
    int64_t book_refreshed_ms;

    ts_swim_member_info_t *members; /* max_members entries, scratch for export and decode */

    ts_gossip_event_fn on_event;
    void *on_event_arg;
    ts_gossip_load_fn on_load;
    void *on_load_arg;
    void (*leave_done)(ts_gossip_t *, void *);
    void *leave_arg;
    void (*closed)(ts_gossip_t *, void *);
    void *closed_arg;
    ts_gossip_stats_t st;
};

static void pump(ts_gossip_t *g);
static int64_t now_ms(const ts_gossip_t *g) { return (int64_t)uv_now(g->loop); }

/* ---- addresses ------------------------------------------------------------------------------ */

static const uint8_t V4_MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

static void addr_from_sockaddr(ts_swim_addr_t *a, const struct sockaddr *sa) {
    memset(a, 0, sizeof *a);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        memcpy(a->ip, V4_MAPPED, 12);
        memcpy(a->ip + 12, &in->sin_addr, 4);
        a->port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        memcpy(a->ip, &in6->sin6_addr, 16);
        a->port = ntohs(in6->sin6_port);
    }
}

/* A v4-mapped address becomes an AF_INET sockaddr (our socket may be IPv4 only). */
static void addr_to_sockaddr(const ts_swim_addr_t *a, struct sockaddr_storage *ss) {
    memset(ss, 0, sizeof *ss);
    if (memcmp(a->ip, V4_MAPPED, 12) == 0) {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_family = AF_INET;
        memcpy(&in->sin_addr, a->ip + 12, 4);
        in->sin_port = htons(a->port);
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        in6->sin6_family = AF_INET6;
        memcpy(&in6->sin6_addr, a->ip, 16);
        in6->sin6_port = htons(a->port);
    }
}

/* "a.b.c.d:port" or "[v6]:port". */
static void addr_str(const ts_swim_addr_t *a, char out[ADDR_STR]) {
    char ip[INET6_ADDRSTRLEN] = "?";
    if (memcmp(a->ip, V4_MAPPED, 12) == 0) {
        uv_inet_ntop(AF_INET, a->ip + 12, ip, sizeof ip);
        snprintf(out, ADDR_STR, "%s:%u", ip, (unsigned)a->port);
    } else {
        uv_inet_ntop(AF_INET6, a->ip, ip, sizeof ip);
        snprintf(out, ADDR_STR, "[%s]:%u", ip, (unsigned)a->port);
    }
}

/* A numeric "ip:port" (IPv6 in brackets) into a; port 0 allowed when allow_zero. */
static int addr_parse(const char *s, ts_swim_addr_t *a, int allow_zero, char *err, size_t errlen) {
    char host[ADDR_STR];
    int port;
    int rc = ts_net_parse_addr(s, host, sizeof host, &port, allow_zero, err, errlen);
    if (rc)
        return rc;
    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0) {
        ts_set_err(err, errlen, "\"%s\" is not a numeric ip:port address", s);
        return TS_EINVAL;
    }
    addr_from_sockaddr(a, (const struct sockaddr *)&ss);
    return TS_OK;
}

static int addr_unspecified(const ts_swim_addr_t *a) {
    static const uint8_t zero[16];
    return memcmp(a->ip, zero, 16) == 0 ||
           (memcmp(a->ip, V4_MAPPED, 12) == 0 && memcmp(a->ip + 12, zero, 4) == 0);
}

static int id_is_zero(const uint8_t id[TS_SWIM_ID_LEN]) {
    static const uint8_t zero[TS_SWIM_ID_LEN];
    return memcmp(id, zero, TS_SWIM_ID_LEN) == 0;
}

/* ---- signatures (the core's callbacks, and adverts) ----------------------------------------- */

static int sign_cb(void *ctx, const uint8_t *msg, size_t len, uint8_t sig[TS_SWIM_SIG_LEN]) {
    ts_gossip_t *g = ctx;
    return crypto_sign_detached(sig, NULL, msg, len, g->sign_sk) == 0 ? 0 : -1;
}

static int verify_cb(void *ctx, const uint8_t id[TS_SWIM_ID_LEN], const uint8_t *msg, size_t len,
                     const uint8_t sig[TS_SWIM_SIG_LEN]) {
    (void)ctx;
    return crypto_sign_verify_detached(sig, msg, len, id) == 0 ? 0 : -1;
}

/* The bytes an advert's signature covers: context ‖ 0x00 ‖ node_id ‖ body (protocol.md §9).
 * Returns a malloc'd buffer of *len bytes, or NULL. */
static uint8_t *advert_signed_bytes(const uint8_t id[TS_SWIM_ID_LEN], const uint8_t *body,
                                    size_t body_len, size_t *len) {
    size_t ctx = sizeof TS_FRAME_CONTEXT_ADVERT; /* the context and its NUL: the 0x00 byte */
    uint8_t *m = malloc(ctx + TS_SWIM_ID_LEN + body_len);
    if (!m)
        return NULL;
    memcpy(m, TS_FRAME_CONTEXT_ADVERT, ctx);
    memcpy(m + ctx, id, TS_SWIM_ID_LEN);
    memcpy(m + ctx + TS_SWIM_ID_LEN, body, body_len);
    *len = ctx + TS_SWIM_ID_LEN + body_len;
    return m;
}

/* ---- sealing -------------------------------------------------------------------------------- */

static void put_be64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* Seals plain[0..n) into out (n + SEAL_OVERHEAD bytes). */
static size_t seal(ts_gossip_t *g, const uint8_t *plain, size_t n, uint8_t *out) {
    out[0] = SEAL_VERSION;
    put_be64(out + 1, g->counter++);
    randombytes_buf(out + 9, SEAL_NONCE);
    unsigned long long clen = 0;
    crypto_aead_xchacha20poly1305_ietf_encrypt(out + SEAL_HEADER, &clen, plain, n, out, SEAL_AD,
                                               NULL, out + 9, g->seal_key);
    return SEAL_HEADER + (size_t)clen;
}

/* Opens a datagram into plain (at least len bytes); 0 and *n on success, -1 when it does not. */
static int unseal(const ts_gossip_t *g, const uint8_t *in, size_t len, uint8_t *plain, size_t *n,
                  uint64_t *counter) {
    if (len < SEAL_OVERHEAD + TS_SWIM_WIRE_HEADER || len > TS_SWIM_PACKET_MAX ||
        in[0] != SEAL_VERSION)
        return -1;
    unsigned long long plen = 0;
    if (crypto_aead_xchacha20poly1305_ietf_decrypt(plain, &plen, NULL, in + SEAL_HEADER,
                                                   len - SEAL_HEADER, in, SEAL_AD, in + 9,
                                                   g->seal_key) != 0)
        return -1;
    *n = (size_t)plen;
    *counter = get_be64(in + 1);
    return 0;
}

/* ---- replay windows ------------------------------------------------------------------------- */

/* 1 when counter is new from sender id (and records it), 0 for a replay. The table is a plain
 * array: at most twice max_members senders, scanned linearly (a few microseconds at 2048). */
static int replay_accept(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN], uint64_t counter) {
    replay_t *r = NULL;
    for (uint32_t i = 0; i < g->n_replay && !r; i++)
        if (memcmp(g->replay[i].id, id, TS_SWIM_ID_LEN) == 0)
            r = &g->replay[i];
    uint64_t now = (uint64_t)now_ms(g);
    if (!r) {
        if (g->n_replay < g->max_replay) {
            r = &g->replay[g->n_replay++];
        } else { /* full: forget the sender heard least recently */
            r = &g->replay[0];
            for (uint32_t i = 1; i < g->n_replay; i++)
                if (g->replay[i].heard_ms < r->heard_ms)
                    r = &g->replay[i];
        }
        memcpy(r->id, id, TS_SWIM_ID_LEN);
        r->top = counter;
        r->seen = 1;
        r->heard_ms = now;
        return 1;
    }
    if (counter > r->top) {
        uint64_t shift = counter - r->top;
        r->seen = shift >= REPLAY_WINDOW ? 1 : r->seen << shift | 1;
        r->top = counter;
    } else {
        uint64_t back = r->top - counter;
        if (back >= REPLAY_WINDOW || (r->seen >> back & 1))
            return 0;
        r->seen |= (uint64_t)1 << back;
    }
    r->heard_ms = now;
    return 1;
}

/* ---- the datagram path ---------------------------------------------------------------------- */

static void send_packet(ts_gossip_t *g, const ts_swim_addr_t *to, const ts_swim_msg_t *msg) {
    uint8_t plain[TS_SWIM_PLAIN_MAX], sealed[TS_SWIM_PACKET_MAX];
    size_t n;
    if (ts_swim_wire_encode(msg, plain, sizeof plain, &n) != TS_OK) {
        g->st.udp_send_failed++; /* the core built a message it cannot encode: a bug */
        return;
    }
    size_t len = seal(g, plain, n, sealed);
    struct sockaddr_storage ss;
    addr_to_sockaddr(to, &ss);
    uv_buf_t b = uv_buf_init((char *)sealed, (unsigned)len);
    int rc = uv_udp_try_send(&g->udp, &b, 1, (const struct sockaddr *)&ss);
    if (rc < 0) {
        g->st.udp_send_failed++;
        return;
    }
    g->st.udp_out++;
    g->st.udp_bytes_out += len;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    ts_gossip_t *g = h->data;
    *buf = uv_buf_init((char *)g->recv_buf, sizeof g->recv_buf);
}

static void receive(ts_gossip_t *g, const struct sockaddr *from, const uint8_t *data, size_t len,
                    int partial) {
    g->st.udp_in++;
    g->st.udp_bytes_in += (uint64_t)len;
    uint8_t plain[TS_SWIM_PACKET_MAX];
    size_t n;
    uint64_t counter;
    if (partial || unseal(g, data, len, plain, &n, &counter) != 0) {
        g->st.udp_unsealed_failed++;
        return;
    }
    /* the sender id sits at offset 2 of every plaintext (swim_wire.h); unseal checked the size */
    if (!replay_accept(g, plain + 2, counter)) {
        g->st.udp_replayed++;
        return;
    }
    ts_swim_msg_t msg;
    if (ts_swim_wire_decode(plain, n, &msg) != TS_OK) {
        g->st.udp_malformed++;
        return;
    }
    ts_swim_addr_t src;
    addr_from_sockaddr(&src, from);
    ts_swim_on_packet(g->swim, now_ms(g), &src, &msg);
    pump(g);
}

static void on_datagram(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf,
                        const struct sockaddr *from, unsigned flags) {
    ts_gossip_t *g = h->data;
    if (nread <= 0 || !from || g->closing || !g->swim)
        return; /* nothing more to read, or a socket error: the socket stays open */
    receive(g, from, (const uint8_t *)buf->base, (size_t)nread, (flags & UV_UDP_PARTIAL) != 0);
}

void ts_gossip_receive_datagram(ts_gossip_t *g, const struct sockaddr *from, const uint8_t *data,
                                size_t len) {
    if (g && from && data && !g->closing && g->swim)
        receive(g, from, data, len, 0);
}

/* ---- operations in flight ------------------------------------------------------------------- */

static op_t *op_new(ts_gossip_t *g, op_kind_t kind, const uint8_t id[TS_SWIM_ID_LEN]) {
    op_t *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    op->g = g;
    op->kind = kind;
    memcpy(op->id, id, TS_SWIM_ID_LEN);
    ts_list_push(&g->ops, &op->link);
    if (kind == OP_PUSH_PULL)
        g->n_push_pulls++;
    else
        g->n_fetches++;
    return op;
}

static void op_free(op_t *op) {
    ts_gossip_t *g = op->g;
    ts_list_remove(&op->link);
    if (op->kind == OP_PUSH_PULL)
        g->n_push_pulls--;
    else
        g->n_fetches--;
    free(op);
}

/* Sends env to addr as op's call; on failure the op is freed and the failure counted. */
static int op_call(op_t *op, const ts_swim_addr_t *addr, const Tessera__Envelope *env,
                   uint32_t timeout_ms, ts_rpc_cb cb) {
    ts_gossip_t *g = op->g;
    char a[ADDR_STR];
    addr_str(addr, a);
    if (ts_rpc_peer_get(g->rpc, a, &op->peer, NULL, 0) != TS_OK ||
        ts_rpc_call(op->peer, env, timeout_ms, cb, op, &op->call, NULL, 0) != TS_OK) {
        op_free(op);
        return -1;
    }
    return 0;
}

/* ---- push-pull ------------------------------------------------------------------------------ */

/* Our full state, swim_wire-encoded into a malloc'd buffer. */
static uint8_t *export_state(ts_gossip_t *g, bool join, size_t *len) {
    uint32_t n = ts_swim_state_export(g->swim, g->members, g->cfg.swim.max_members);
    size_t cap = ts_swim_wire_state_size(g->members, n);
    uint8_t *buf = malloc(cap);
    if (buf && ts_swim_wire_encode_state(g->self.b, join, g->members, n, buf, cap, len) != TS_OK) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* Decodes a peer's state into g->members and checks that its sender is peer (the id the
 * handshake proved); returns the member count, or -1 with err. */
static int import_state(ts_gossip_t *g, const ProtobufCBinaryData *state, const uint8_t *peer,
                        uint32_t *n, char *err, size_t errlen) {
    uint8_t from[TS_SWIM_ID_LEN];
    bool join;
    if (state->len > g->cfg.max_state_bytes) {
        ts_set_err(err, errlen, "a push-pull state of %zu bytes, more than %u", state->len,
                   (unsigned)g->cfg.max_state_bytes);
        return -1;
    }
    int rc = ts_swim_wire_decode_state(state->data, state->len, from, &join, g->members,
                                       g->cfg.swim.max_members, n);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "the push-pull state does not decode (%s)", ts_strerror(rc));
        return -1;
    }
    if (memcmp(from, peer, TS_SWIM_ID_LEN) != 0) {
        ts_set_err(err, errlen, "the push-pull state is not the connection's peer's");
        return -1;
    }
    return 0;
}

/* env holding pp holding state[0..len) (both read only while env is sent). */
static void push_pull_envelope(Tessera__Envelope *env, Tessera__PushPull *pp, uint8_t *state,
                               size_t len) {
    tessera__push_pull__init(pp);
    pp->has_state = 1;
    pp->state.data = state;
    pp->state.len = len;
    tessera__envelope__init(env);
    env->body_case = TESSERA__ENVELOPE__BODY_PUSH_PULL;
    env->push_pull = pp;
}

static void on_push_pull_done(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    op_t *op = arg;
    ts_gossip_t *g = op->g;
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(op->peer, &info);
    uint32_t n;
    if (g->closing || res->status != TS_OK || !info.has_node_id ||
        import_state(g, &res->reply->push_pull->state, info.node_id.b, &n, NULL, 0) != 0) {
        if (!g->closing)
            g->st.pushpull_failed++;
        op_free(op);
        return;
    }
    op_free(op);
    g->st.pushpull_ok++;
    ts_swim_merge_state(g->swim, now_ms(g), info.node_id.b, g->members, n);
    pump(g);
}

static void start_push_pull(ts_gossip_t *g, const ts_swim_event_t *ev) {
    op_t *op;
    if (g->n_push_pulls >= MAX_PUSH_PULLS || !(op = op_new(g, OP_PUSH_PULL, ev->id))) {
        g->st.pushpull_failed++;
        return;
    }
    size_t len;
    uint8_t *state = export_state(g, id_is_zero(ev->id), &len);
    if (!state) {
        op_free(op);
        g->st.pushpull_failed++;
        return;
    }
    Tessera__PushPull pp;
    Tessera__Envelope env;
    push_pull_envelope(&env, &pp, state, len);
    if (op_call(op, &ev->addr, &env, g->cfg.pushpull_timeout_ms, on_push_pull_done) != 0)
        g->st.pushpull_failed++;
    free(state);
}

static void serve_push_pull(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_gossip_t *g = arg;
    if (!g->swim || g->closing) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE, "gossip is not running");
        return;
    }
    const ts_node_id_t *peer = ts_rpc_request_peer(req);
    char err[160];
    uint32_t n;
    if (import_state(g, &env->push_pull->state, peer->b, &n, err, sizeof err) != 0) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT, "%s", err);
        return;
    }
    ts_swim_merge_state(g->swim, now_ms(g), peer->b, g->members, n);
    pump(g);
    size_t len;
    uint8_t *state = export_state(g, false, &len);
    if (!state) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    Tessera__PushPull pp;
    Tessera__Envelope out;
    push_pull_envelope(&out, &pp, state, len);
    ts_rpc_reply(req, &out);
    free(state);
    g->st.pushpull_served++;
}

/* ---- adverts -------------------------------------------------------------------------------- */

static advert_t *advert_find(const ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    for (uint32_t i = 0; i < g->n_adverts; i++)
        if (memcmp(g->adverts[i].id, id, TS_SWIM_ID_LEN) == 0)
            return &g->adverts[i];
    return NULL;
}

static void advert_clear(advert_t *a) {
    free(a->packed);
    if (a->msg)
        tessera__advert__free_unpacked(a->msg, NULL);
    ts_frame_free(a->body);
    memset(a, 0, sizeof *a);
}

static void advert_drop(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    advert_t *a = advert_find(g, id);
    if (!a)
        return;
    advert_clear(a);
    *a = g->adverts[--g->n_adverts];
}

/* Keeps the signed advert msg (already verified) as id's, replacing what was held. TS_ENOMEM,
 * TS_ERANGE when the table is full. */
static int advert_keep(ts_gossip_t *g, const Tessera__Advert *msg, uint64_t version,
                       const uint8_t hash[TS_SWIM_HASH_LEN]) {
    advert_t fresh = {0};
    memcpy(fresh.id, msg->node_id.data, TS_SWIM_ID_LEN);
    fresh.version = version;
    memcpy(fresh.hash, hash, TS_SWIM_HASH_LEN);
    fresh.packed_len = protobuf_c_message_get_packed_size(&msg->base);
    if (!(fresh.packed = malloc(fresh.packed_len)))
        return TS_ENOMEM;
    protobuf_c_message_pack(&msg->base, fresh.packed);
    fresh.msg = tessera__advert__unpack(NULL, fresh.packed_len, fresh.packed);
    if (!fresh.msg ||
        ts_frame_decode_advert_body(&fresh.msg->body, 0, &fresh.body, NULL, 0) != TS_OK) {
        advert_clear(&fresh);
        return TS_ENOMEM;
    }
    advert_t *a = advert_find(g, fresh.id);
    if (!a) {
        if (g->n_adverts >= g->cfg.swim.max_members) {
            advert_clear(&fresh);
            return TS_ERANGE;
        }
        a = &g->adverts[g->n_adverts++];
    } else {
        advert_clear(a);
    }
    *a = fresh;
    return TS_OK;
}

/* Checks a fetched advert against what id's signed claim announced; TS_OK when it may be kept
 * (version and hash are then the claim's). */
static int advert_verify(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN],
                         const Tessera__Advert *a) {
    ts_swim_member_info_t m;
    if (ts_swim_member_get(g->swim, id, &m) != TS_OK || m.claim.kind != TS_SWIM_CLAIM_ALIVE ||
        m.claim.advert_version == 0)
        return TS_ENOTFOUND; /* reaped, left, or no longer announcing one */
    if (memcmp(a->node_id.data, id, TS_SWIM_ID_LEN) != 0)
        return TS_ECORRUPT;
    int bad = ts_gossip_advert_check(a) != TS_OK;
    uint8_t hash[TS_SWIM_HASH_LEN];
    crypto_generichash(hash, sizeof hash, a->body.data, a->body.len, NULL, 0);
    if (bad || memcmp(hash, m.claim.advert_hash, TS_SWIM_HASH_LEN) != 0)
        return TS_ECORRUPT;
    Tessera__AdvertBody *body;
    if (ts_frame_decode_advert_body(&a->body, TS_FRAME_CHECK_FINITE, &body, NULL, 0) != TS_OK)
        return TS_ECORRUPT;
    int stale = body->version != m.claim.advert_version;
    ts_frame_free(body);
    if (stale)
        return TS_ECORRUPT;
    return advert_keep(g, a, m.claim.advert_version, m.claim.advert_hash);
}

static void on_fetch_done(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    op_t *op = arg;
    ts_gossip_t *g = op->g;
    if (!g->closing && res->status == TS_OK) {
        if (advert_verify(g, op->id, res->reply->advert) == TS_OK)
            g->st.adverts_fetched++;
        else
            g->st.adverts_rejected++;
    }
    op_free(op);
}

static int fetch_in_flight(const ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    TS_LIST_FOREACH(it, &g->ops) {
        const op_t *op = TS_CONTAINER_OF(it, op_t, link);
        if (op->kind == OP_FETCH && memcmp(op->id, id, TS_SWIM_ID_LEN) == 0)
            return 1;
    }
    return 0;
}

/* Asks member id, at addr, for its advert of at least version. */
static void start_fetch(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN],
                        const ts_swim_addr_t *addr, uint64_t version) {
    if (g->n_fetches >= MAX_FETCHES || fetch_in_flight(g, id))
        return; /* the housekeeper retries what is still missing */
    op_t *op = op_new(g, OP_FETCH, id);
    if (!op)
        return;
    Tessera__AdvertRequest ar = TESSERA__ADVERT_REQUEST__INIT;
    ar.has_node_id = 1;
    ar.node_id.data = op->id;
    ar.node_id.len = TS_SWIM_ID_LEN;
    ar.has_min_version = 1;
    ar.min_version = version;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_ADVERT_REQUEST;
    env.advert_request = &ar;
    op_call(op, addr, &env, g->cfg.advert_timeout_ms, on_fetch_done);
}

/* Fetches the adverts of live members whose claim announces one we do not hold. */
static void reconcile_adverts(ts_gossip_t *g) {
    uint32_t n = ts_swim_state_export(g->swim, g->members, g->cfg.swim.max_members);
    for (uint32_t i = 1; i < n; i++) { /* [0] is ourselves */
        const ts_swim_member_info_t *m = &g->members[i];
        if (m->state != TS_SWIM_ALIVE || m->claim.kind != TS_SWIM_CLAIM_ALIVE ||
            m->claim.advert_version == 0)
            continue;
        const advert_t *a = advert_find(g, m->claim.id);
        if (!a || a->version != m->claim.advert_version ||
            memcmp(a->hash, m->claim.advert_hash, TS_SWIM_HASH_LEN) != 0)
            start_fetch(g, m->claim.id, &m->claim.addr, m->claim.advert_version);
    }
}

static void serve_advert(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_gossip_t *g = arg;
    const Tessera__AdvertRequest *ar = env->advert_request;
    const advert_t *a = advert_find(g, ar->node_id.data);
    if (!a || (ar->has_min_version && a->version < ar->min_version)) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_NOT_FOUND,
                           a ? "the advert held is older than asked for" : "no advert held");
        return;
    }
    Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
    out.body_case = TESSERA__ENVELOPE__BODY_ADVERT;
    out.advert = a->msg;
    ts_rpc_reply(req, &out);
    g->st.adverts_served++;
}

/* Signs body (version set) as our advert, keeps it and announces it to the core. */
static int announce_own(ts_gossip_t *g, Tessera__AdvertBody *body, char *err, size_t errlen) {
    int rc = ts_frame_check_advert_body(body, TS_FRAME_CHECK_FINITE, err, errlen);
    if (rc)
        return rc;
    size_t blen = protobuf_c_message_get_packed_size(&body->base), slen;
    uint8_t *bytes = malloc(blen ? blen : 1);
    if (!bytes)
        return TS_ENOMEM;
    protobuf_c_message_pack(&body->base, bytes);
    uint8_t sig[TS_SIGNATURE_BYTES], hash[TS_SWIM_HASH_LEN];
    uint8_t *signed_bytes = advert_signed_bytes(g->self.b, bytes, blen, &slen);
    if (!signed_bytes) {
        free(bytes);
        return TS_ENOMEM;
    }
    crypto_sign_detached(sig, NULL, signed_bytes, slen, g->sign_sk);
    free(signed_bytes);
    crypto_generichash(hash, sizeof hash, bytes, blen, NULL, 0);
    Tessera__Advert a = TESSERA__ADVERT__INIT;
    a.has_node_id = a.has_body = a.has_signature = 1;
    a.node_id.data = g->self.b;
    a.node_id.len = TS_SWIM_ID_LEN;
    a.body.data = bytes;
    a.body.len = blen;
    a.signature.data = sig;
    a.signature.len = sizeof sig;
    rc = advert_keep(g, &a, body->version, hash);
    free(bytes);
    if (rc) {
        ts_set_err(err, errlen, "could not keep our advert (%s)", ts_strerror(rc));
        return rc;
    }
    rc = ts_swim_set_advert(g->swim, now_ms(g), body->version, hash);
    pump(g);
    if (rc)
        ts_set_err(err, errlen, "the gossip core refused the advert (%s)", ts_strerror(rc));
    return rc;
}

int ts_gossip_set_advert(ts_gossip_t *g, const Tessera__AdvertBody *body, char *err,
                         size_t errlen) {
    if (!g || !body || g->closing) {
        ts_set_err(err, errlen, "ts_gossip_set_advert: NULL argument, or closing");
        return TS_EINVAL;
    }
    /* a copy that owns nothing: only the version changes */
    Tessera__AdvertBody copy = *body;
    copy.has_version = 1;
    copy.version = g->own_version + 1;
    if (!g->swim) { /* before start: checked now, signed and announced by start */
        int rc = ts_frame_check_advert_body(&copy, TS_FRAME_CHECK_FINITE, err, errlen);
        if (rc)
            return rc;
        size_t n = protobuf_c_message_get_packed_size(&copy.base);
        uint8_t *bytes = malloc(n ? n : 1);
        if (!bytes)
            return TS_ENOMEM;
        protobuf_c_message_pack(&copy.base, bytes);
        ProtobufCBinaryData b = {n, bytes};
        Tessera__AdvertBody *owned;
        rc = ts_frame_decode_advert_body(&b, TS_FRAME_CHECK_FINITE, &owned, err, errlen);
        free(bytes);
        if (rc)
            return rc;
        ts_frame_free(g->own_body);
        g->own_body = owned;
        g->own_version = copy.version;
        return TS_OK;
    }
    int rc = announce_own(g, &copy, err, errlen);
    if (rc == TS_OK)
        g->own_version = copy.version;
    return rc;
}

int ts_gossip_advert_check(const Tessera__Advert *a) {
    if (!a || !a->has_node_id || a->node_id.len != TS_SWIM_ID_LEN || !a->has_signature ||
        a->signature.len != crypto_sign_BYTES || !a->has_body)
        return TS_ECORRUPT;
    size_t len;
    uint8_t *signed_bytes = advert_signed_bytes(a->node_id.data, a->body.data, a->body.len, &len);
    if (!signed_bytes)
        return TS_ENOMEM;
    int bad = crypto_sign_verify_detached(a->signature.data, signed_bytes, len, a->node_id.data);
    free(signed_bytes);
    return bad ? TS_ECORRUPT : TS_OK;
}

int ts_gossip_advert_get(const ts_gossip_t *g, const uint8_t id[TS_NODE_ID_BYTES],
                         const uint8_t **packed, size_t *len) {
    const advert_t *a = g && id ? advert_find(g, id) : NULL;
    if (!a)
        return TS_ENOTFOUND;
    *packed = a->packed;
    *len = a->packed_len;
    return TS_OK;
}

/* ---- the address book ----------------------------------------------------------------------- */

static void book_mark(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    if (!g->cfg.store || memcmp(id, g->self.b, TS_SWIM_ID_LEN) == 0)
        return;
    for (uint32_t i = 0; i < g->n_dirty; i++)
        if (memcmp(g->dirty[i], id, TS_SWIM_ID_LEN) == 0)
            return;
    if (g->n_dirty < g->cfg.swim.max_members)
        memcpy(g->dirty[g->n_dirty++], id, TS_SWIM_ID_LEN);
    else
        g->book_full = 1;
}

typedef struct {
    ts_gossip_t *g;
    uint32_t n; /* entries of g->members to write */
} book_batch_t;

static int book_write_txn(void *ctx, ts_store_txn_t *txn) {
    book_batch_t *b = ctx;
    int64_t now = (int64_t)time(NULL);
    for (uint32_t i = 0; i < b->n; i++) {
        const ts_swim_member_info_t *m = &b->g->members[i];
        ts_peer_t p;
        memset(&p, 0, sizeof p);
        memcpy(p.id, m->claim.id, TS_PEER_ID_LEN);
        p.n_addrs = 1;
        addr_str(&m->claim.addr, p.addrs[0]);
        p.last_seen = now;
        unsigned char buf[TS_PEER_ENCODED_MAX];
        size_t len;
        if (ts_peer_encode(&p, buf, &len) != TS_OK)
            continue;
        int rc = ts_txn_put(txn, TS_DB_PEERS, p.id, TS_PEER_ID_LEN, buf, len);
        if (rc)
            return rc;
    }
    return TS_OK;
}

/* Writes the members marked since the last write (or, for a refresh, every live member) that
 * are alive now, in one transaction. */
static void book_flush(ts_gossip_t *g) {
    if (!g->cfg.store || !g->swim || (g->n_dirty == 0 && !g->book_full))
        return;
    uint32_t n = ts_swim_state_export(g->swim, g->members, g->cfg.swim.max_members), kept = 0;
    for (uint32_t i = 1; i < n; i++) {
        const ts_swim_member_info_t *m = &g->members[i];
        if (m->state != TS_SWIM_ALIVE || m->claim.kind != TS_SWIM_CLAIM_ALIVE)
            continue;
        int wanted = g->book_full;
        for (uint32_t k = 0; k < g->n_dirty && !wanted; k++)
            wanted = memcmp(g->dirty[k], m->claim.id, TS_SWIM_ID_LEN) == 0;
        if (wanted)
            g->members[kept++] = *m;
    }
    g->n_dirty = 0;
    g->book_full = 0;
    book_batch_t b = {g, kept};
    if (kept > 0 && ts_store_write(g->cfg.store, book_write_txn, &b) == TS_OK)
        g->st.book_writes += kept;
}

typedef struct {
    ts_peer_t *entries;
    uint32_t n, cap;
} book_list_t;

static int book_collect(void *ctx, const ts_peer_t *p) {
    book_list_t *l = ctx;
    if (l->n < l->cap)
        l->entries[l->n++] = *p;
    else { /* keep the most recent: replace the oldest held */
        uint32_t oldest = 0;
        for (uint32_t i = 1; i < l->n; i++)
            if (l->entries[i].last_seen < l->entries[oldest].last_seen)
                oldest = i;
        if (p->last_seen > l->entries[oldest].last_seen)
            l->entries[oldest] = *p;
    }
    return TS_OK;
}

static int seed_add(ts_gossip_t *g, const ts_swim_addr_t *a) {
    if (g->n_seeds >= TS_GOSSIP_MAX_SEEDS ||
        memcmp(a, &g->self_addr, sizeof *a) == 0) /* ourselves */
        return 0;
    for (uint32_t i = 0; i < g->n_seeds; i++)
        if (memcmp(&g->seeds[i], a, sizeof *a) == 0)
            return 0;
    g->seeds[g->n_seeds++] = *a;
    return 1;
}

/* Prunes the book and adds its most recently seen entries to the seeds, leaving room for half
 * the bootstrap list (so that neither a stale book nor a long bootstrap list crowds out the
 * other). */
static void book_load(ts_gossip_t *g) {
    if (!g->cfg.store)
        return;
    ts_peers_prune(g->cfg.store, (int64_t)time(NULL) - (int64_t)g->cfg.book_max_age_s, NULL);
    size_t room = TS_GOSSIP_MAX_SEEDS - (g->cfg.n_bootstrap < TS_GOSSIP_MAX_SEEDS / 2
                                             ? g->cfg.n_bootstrap
                                             : TS_GOSSIP_MAX_SEEDS / 2);
    ts_peer_t entries[TS_GOSSIP_MAX_SEEDS + 1];
    book_list_t l = {entries, 0, (uint32_t)room + 1}; /* one more: we may be in it */
    if (ts_peers_list(g->cfg.store, book_collect, &l) != TS_OK)
        return; /* an entry that does not decode: the book is skipped, bootstrap still works */
    for (uint32_t k = 0; k < l.n; k++) { /* most recent first */
        uint32_t best = k;
        for (uint32_t i = k + 1; i < l.n; i++)
            if (entries[i].last_seen > entries[best].last_seen)
                best = i;
        ts_peer_t t = entries[k];
        entries[k] = entries[best];
        entries[best] = t;
        ts_swim_addr_t a;
        if (memcmp(entries[k].id, g->self.b, TS_PEER_ID_LEN) != 0 && entries[k].n_addrs > 0 &&
            g->n_seeds < room && addr_parse(entries[k].addrs[0], &a, 0, NULL, 0) == TS_OK)
            seed_add(g, &a);
    }
}

/* ---- events and the pump -------------------------------------------------------------------- */

static void handle_event(ts_gossip_t *g, const ts_swim_event_t *ev) {
    switch (ev->type) {
    case TS_SWIM_EV_PUSH_PULL: start_push_pull(g, ev); break;
    case TS_SWIM_EV_ADVERT_NEEDED: start_fetch(g, ev->id, &ev->addr, ev->advert_version); break;
    case TS_SWIM_EV_REAPED: advert_drop(g, ev->id); break;
    case TS_SWIM_EV_JOINED:
    case TS_SWIM_EV_ALIVE_AGAIN:
    case TS_SWIM_EV_ADDR_CHANGED: book_mark(g, ev->id); break;
    default: break;
    }
    if (g->on_event)
        g->on_event(g->on_event_arg, ev);
}

static void on_timer(uv_timer_t *t);

static void pump(ts_gossip_t *g) {
    ts_swim_addr_t to;
    ts_swim_msg_t msg;
    ts_swim_event_t ev;
    for (int more = 1; more && !g->closing;) {
        more = 0;
        while (ts_swim_next_packet(g->swim, &to, &msg))
            send_packet(g, &to, &msg), more = 1;
        while (!g->closing && ts_swim_next_event(g->swim, &ev))
            handle_event(g, &ev), more = 1;
    }
    if (g->closing)
        return;
    if (g->leave_done && ts_swim_leave_done(g->swim, now_ms(g))) {
        void (*done)(ts_gossip_t *, void *) = g->leave_done;
        g->leave_done = NULL;
        done(g, g->leave_arg);
        if (g->closing)
            return;
    }
    int64_t delay = ts_swim_next_deadline(g->swim) - now_ms(g);
    uv_timer_start(&g->timer, on_timer, delay > 0 ? (uint64_t)delay : 0, 0);
}

static void on_timer(uv_timer_t *t) {
    ts_gossip_t *g = t->data;
    ts_swim_tick(g->swim, now_ms(g));
    pump(g);
}

static void on_housekeep(uv_timer_t *t) {
    ts_gossip_t *g = t->data;
    if (now_ms(g) - g->book_refreshed_ms >= BOOK_REFRESH_MS) {
        g->book_full = 1;
        g->book_refreshed_ms = now_ms(g);
    }
    book_flush(g);
    reconcile_adverts(g);
}

/* ---- status --------------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *partition;
    uint32_t cluster, count;
} cluster_count_t;

/* The pieces a status answer points into; freed together by status_scratch_free. */
typedef struct {
    Tessera__StatusResponse resp;
    Tessera__Aggregates agg;
    Tessera__Load load;
    Tessera__MemberState *members, **member_ptrs;
    char (*addrs)[ADDR_STR];
    Tessera__Advert **adverts;
    cluster_count_t *counts;
    Tessera__ClusterExperts *clusters, **cluster_ptrs;
    Tessera__ClusterRef *refs, **ref_ptrs;
} status_scratch_t;

static void status_scratch_free(status_scratch_t *s) {
    free(s->members);
    free(s->member_ptrs);
    free(s->addrs);
    free(s->adverts);
    free(s->counts);
    free(s->clusters);
    free(s->cluster_ptrs);
    free(s->refs);
    free(s->ref_ptrs);
}

static Tessera__MemberStatus member_status(int state) {
    switch (state) {
    case TS_SWIM_ALIVE: return TESSERA__MEMBER_STATUS__MEMBER_ALIVE;
    case TS_SWIM_SUSPECT: return TESSERA__MEMBER_STATUS__MEMBER_SUSPECT;
    case TS_SWIM_DEAD: return TESSERA__MEMBER_STATUS__MEMBER_DEAD;
    default: return TESSERA__MEMBER_STATUS__MEMBER_LEFT;
    }
}

static void status_members(ts_gossip_t *g, status_scratch_t *s, uint32_t n) {
    int64_t now = now_ms(g);
    for (uint32_t i = 0; i < n; i++) {
        const ts_swim_member_info_t *m = &g->members[i];
        Tessera__MemberState *ms = &s->members[i];
        tessera__member_state__init(ms);
        ms->has_node_id = 1;
        ms->node_id.data = (uint8_t *)m->claim.id;
        ms->node_id.len = TS_SWIM_ID_LEN;
        ms->has_status = 1;
        ms->status = member_status(m->state);
        ms->has_incarnation = 1;
        ms->incarnation = m->incarnation;
        ms->has_last_change_age_ms = 1;
        ms->last_change_age_ms = now > m->change_ms ? (uint64_t)(now - m->change_ms) : 0;
        if (m->claim.kind == TS_SWIM_CLAIM_ALIVE) {
            addr_str(&m->claim.addr, s->addrs[i]);
            ms->addr = s->addrs[i];
            ms->has_advert_version = 1;
            ms->advert_version = m->claim.advert_version;
        }
        s->member_ptrs[i] = ms;
    }
    s->resp.n_members = n;
    s->resp.members = s->member_ptrs;
}

/* The index in s->counts[0..n) of cluster c of partition, n when it is not there. */
static uint32_t count_index(const status_scratch_t *s, uint32_t n, const uint8_t *partition,
                            uint32_t c) {
    uint32_t k = 0;
    while (k < n && !(s->counts[k].cluster == c &&
                      memcmp(s->counts[k].partition, partition, TS_FRAME_ID_BYTES) == 0))
        k++;
    return k;
}

/* Whether some live expert of s->counts[0..n) covers cluster c of partition. */
static int covered(const status_scratch_t *s, uint32_t n, const uint8_t *partition, uint32_t c) {
    return count_index(s, n, partition, c) < n;
}

/* Calls fn(s, partition, cluster) for each cluster of each partition named by an advert held
 * (a dead expert's too: its cluster is then uncovered) that no live expert covers, at most
 * MAX_UNCOVERED times in all; returns how many. */
static uint32_t each_uncovered(const ts_gossip_t *g, status_scratch_t *s, uint32_t n_counts,
                               void (*fn)(status_scratch_t *, uint32_t, const ProtobufCBinaryData *,
                                          uint32_t)) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < g->n_adverts; i++) {
        const Tessera__AdvertBody *b = g->adverts[i].body;
        int seen = 0; /* each partition once */
        for (uint32_t j = 0; j < i && !seen; j++)
            seen = memcmp(g->adverts[j].body->partition_id.data, b->partition_id.data,
                          TS_FRAME_ID_BYTES) == 0;
        for (uint32_t c = 0; !seen && c < b->num_clusters && n < MAX_UNCOVERED; c++)
            if (!covered(s, n_counts, b->partition_id.data, c)) {
                if (fn)
                    fn(s, n, &b->partition_id, c);
                n++;
            }
    }
    return n;
}

static void put_uncovered(status_scratch_t *s, uint32_t i, const ProtobufCBinaryData *partition,
                          uint32_t cluster) {
    Tessera__ClusterRef *r = &s->refs[i];
    tessera__cluster_ref__init(r);
    r->has_partition_id = r->has_cluster = 1;
    r->partition_id = *partition;
    r->cluster = cluster;
    s->ref_ptrs[i] = r;
}

/* Experts per (partition, cluster) among ALIVE members, the clusters of every known partition
 * that none covers, capacity and request rate. */
static int status_aggregates(ts_gossip_t *g, status_scratch_t *s, uint32_t n) {
    uint32_t n_counts = 0, live = 0;
    float capacity = 0, rate = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (g->members[i].state != TS_SWIM_ALIVE)
            continue;
        live++;
        const advert_t *a = advert_find(g, g->members[i].claim.id);
        if (!a)
            continue;
        capacity += a->body->capacity->items_per_s;
        if (i == 0 && s->resp.load && s->resp.load->has_requests_per_s)
            rate += s->resp.load->requests_per_s; /* ours, fresher than our signed advert's */
        else if (a->body->load->has_requests_per_s)
            rate += a->body->load->requests_per_s;
        uint32_t k = count_index(s, n_counts, a->body->partition_id.data, a->body->cluster);
        if (k == n_counts)
            s->counts[n_counts++] =
                (cluster_count_t){a->body->partition_id.data, a->body->cluster, 0};
        s->counts[k].count++;
    }
    for (uint32_t k = 0; k < n_counts; k++) {
        Tessera__ClusterExperts *c = &s->clusters[k];
        tessera__cluster_experts__init(c);
        c->has_partition_id = c->has_cluster = c->has_live_experts = 1;
        c->partition_id.data = (uint8_t *)s->counts[k].partition;
        c->partition_id.len = TS_FRAME_ID_BYTES;
        c->cluster = s->counts[k].cluster;
        c->live_experts = s->counts[k].count;
        s->cluster_ptrs[k] = c;
    }
    uint32_t n_refs = each_uncovered(g, s, n_counts, NULL);
    s->refs = calloc(n_refs + 1, sizeof *s->refs);
    s->ref_ptrs = calloc(n_refs + 1, sizeof *s->ref_ptrs);
    if (!s->refs || !s->ref_ptrs)
        return TS_ENOMEM;
    each_uncovered(g, s, n_counts, put_uncovered);
    Tessera__Aggregates *agg = &s->agg;
    tessera__aggregates__init(agg);
    agg->n_clusters = n_counts;
    agg->clusters = s->cluster_ptrs;
    agg->n_uncovered = n_refs;
    agg->uncovered = s->ref_ptrs;
    agg->has_total_capacity = agg->has_request_rate = agg->has_live_members = 1;
    agg->total_capacity = capacity;
    agg->request_rate = rate;
    agg->live_members = live;
    s->resp.aggregates = agg;
    return TS_OK;
}

/* Builds the status answer into s (pointing into g's tables: use it before anything changes). */
static int status_build(ts_gossip_t *g, const Tessera__StatusRequest *req, status_scratch_t *s) {
    memset(s, 0, sizeof *s);
    uint32_t n = g->swim ? ts_swim_state_export(g->swim, g->members, g->cfg.swim.max_members) : 0;
    s->members = calloc(n + 1, sizeof *s->members);
    s->member_ptrs = calloc(n + 1, sizeof *s->member_ptrs);
    s->addrs = calloc(n + 1, sizeof *s->addrs);
    s->adverts = calloc(g->n_adverts + 1, sizeof *s->adverts);
    s->counts = calloc(n + 1, sizeof *s->counts);
    s->clusters = calloc(n + 1, sizeof *s->clusters);
    s->cluster_ptrs = calloc(n + 1, sizeof *s->cluster_ptrs);
    if (!s->members || !s->member_ptrs || !s->addrs || !s->adverts || !s->counts || !s->clusters ||
        !s->cluster_ptrs) {
        status_scratch_free(s);
        return TS_ENOMEM;
    }
    tessera__status_response__init(&s->resp);
    s->resp.has_node_id = 1;
    s->resp.node_id.data = g->self.b;
    s->resp.node_id.len = TS_NODE_ID_BYTES;
    if (g->on_load) {
        tessera__load__init(&s->load);
        g->on_load(g->on_load_arg, &s->load);
        s->resp.load = &s->load;
    }
    if (!req || req->include_members)
        status_members(g, s, n);
    if (!req || req->include_adverts) {
        for (uint32_t i = 0; i < g->n_adverts; i++)
            s->adverts[i] = g->adverts[i].msg;
        s->resp.n_adverts = g->n_adverts;
        s->resp.adverts = s->adverts;
    }
    if (g->health[0])
        s->resp.health = g->health;
    if (g->metrics_url[0])
        s->resp.metrics = g->metrics_url;
    int rc = status_aggregates(g, s, n);
    if (rc)
        status_scratch_free(s);
    return rc;
}

int ts_gossip_status(ts_gossip_t *g, const Tessera__StatusRequest *req,
                     Tessera__StatusResponse **out) {
    if (!g || !out)
        return TS_EINVAL;
    *out = NULL;
    status_scratch_t s;
    int rc = status_build(g, req, &s);
    if (rc)
        return rc;
    /* packed and unpacked again, the answer owns all its memory and frees in one call */
    size_t n = protobuf_c_message_get_packed_size(&s.resp.base);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf) {
        protobuf_c_message_pack(&s.resp.base, buf);
        *out = tessera__status_response__unpack(NULL, n, buf);
    }
    free(buf);
    status_scratch_free(&s);
    return *out ? TS_OK : TS_ENOMEM;
}

void ts_gossip_status_free(Tessera__StatusResponse *resp) {
    if (resp)
        tessera__status_response__free_unpacked(resp, NULL);
}

static void serve_status(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_gossip_t *g = arg;
    status_scratch_t s;
    if (status_build(g, env->status_request, &s) != TS_OK) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
    out.body_case = TESSERA__ENVELOPE__BODY_STATUS_RESPONSE;
    out.status_response = &s.resp;
    ts_rpc_reply(req, &out);
    status_scratch_free(&s);
}

/* ---- life cycle ----------------------------------------------------------------------------- */

/* The requests this layer serves (installed by new, removed by close). */
static const Tessera__Envelope__BodyCase SERVED[3] = {
    TESSERA__ENVELOPE__BODY_PUSH_PULL,
    TESSERA__ENVELOPE__BODY_ADVERT_REQUEST,
    TESSERA__ENVELOPE__BODY_STATUS_REQUEST,
};

void ts_gossip_config_default(ts_gossip_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    ts_swim_config_default(&cfg->swim);
    cfg->book_max_age_s = 7 * 24 * 3600;
    cfg->pushpull_timeout_ms = 5000;
    cfg->advert_timeout_ms = 5000;
    cfg->max_state_bytes = 16u << 20;
}

/* The core's configuration as this layer completes it. */
static ts_swim_config_t swim_config(ts_gossip_t *g) {
    ts_swim_config_t c = g->cfg.swim;
    c.sign = sign_cb;
    c.verify = verify_cb;
    c.crypto_ctx = g;
    c.claims = NULL;
    return c;
}

int ts_gossip_new(uv_loop_t *loop, ts_rpc_t *rpc, const ts_identity_t *id, const ts_netkey_t *nk,
                  const ts_gossip_config_t *cfg, ts_gossip_t **out, char *err, size_t errlen) {
    if (!loop || !rpc || !id || !nk || !cfg || !out || !cfg->listen) {
        ts_set_err(err, errlen, "ts_gossip_new: NULL argument (a listen address is required)");
        return TS_EINVAL;
    }
    *out = NULL;
    if (sodium_init() < 0) {
        ts_set_err(err, errlen, "libsodium could not be initialised");
        return TS_EIO;
    }
    ts_swim_addr_t la, aa;
    int rc = addr_parse(cfg->listen, &la, 1, err, errlen);
    if (rc)
        return rc;
    const char *adv = cfg->advertise && cfg->advertise[0] ? cfg->advertise : cfg->listen;
    if ((rc = addr_parse(adv, &aa, 1, err, errlen)))
        return rc;
    if (addr_unspecified(&aa)) {
        ts_set_err(err, errlen,
                   "gossip advertises \"%s\", which no peer can reach: set an advertise address",
                   adv);
        return TS_EINVAL;
    }
    if (strlen(cfg->listen) >= ADDR_STR || strlen(adv) >= ADDR_STR) {
        ts_set_err(err, errlen, "a gossip address is too long");
        return TS_EINVAL;
    }
    ts_gossip_t *g = calloc(1, sizeof *g);
    if (!g)
        return TS_ENOMEM;
    g->loop = loop;
    g->rpc = rpc;
    g->cfg = *cfg;
    snprintf(g->listen, sizeof g->listen, "%s", cfg->listen);
    snprintf(g->advertise, sizeof g->advertise, "%s", adv);
    g->cfg.listen = g->listen;
    g->cfg.advertise = g->advertise;
    g->self = id->id;
    g->self_addr = aa;
    memcpy(g->sign_sk, id->sign_sk, sizeof g->sign_sk);
    crypto_generichash(g->seal_key, sizeof g->seal_key, (const uint8_t *)SEAL_CONTEXT,
                       sizeof SEAL_CONTEXT - 1, nk->k, TS_NETKEY_BYTES);
    ts_list_init(&g->ops);
    *out = g;

    /* the core is made at start (its claim needs the bound port); a throwaway one now checks
     * the configuration, so a bad one is refused here with the core's own rules */
    uint32_t max = cfg->swim.max_members;
    ts_swim_config_t sc = swim_config(g);
    ts_swim_t *probe = NULL;
    rc = ts_swim_create(&sc, g->self.b, &aa, 1, 0, &probe);
    ts_swim_free(probe);
    if (rc == TS_OK && cfg->n_bootstrap > 0 && !cfg->bootstrap)
        rc = TS_EINVAL;
    if (rc) {
        ts_set_err(err, errlen, "the gossip configuration is invalid (%s)", ts_strerror(rc));
        goto fail;
    }
    g->max_replay = 2 * max;
    g->cfg.bootstrap = NULL;
    g->bootstrap = calloc(cfg->n_bootstrap + 1, sizeof *g->bootstrap);
    g->replay = calloc(g->max_replay, sizeof *g->replay);
    g->adverts = calloc(max, sizeof *g->adverts);
    g->dirty = calloc(max, sizeof *g->dirty);
    g->members = calloc(max, sizeof *g->members);
    g->resolves = calloc(cfg->n_bootstrap + 1, sizeof *g->resolves);
    rc = TS_ENOMEM;
    if (!g->bootstrap || !g->replay || !g->adverts || !g->dirty || !g->members || !g->resolves)
        goto fail;
    for (size_t i = 0; i < cfg->n_bootstrap; i++)
        if (!(g->bootstrap[i] = strdup(cfg->bootstrap[i])))
            goto fail;
    g->cfg.bootstrap = (const char *const *)g->bootstrap;
    const ts_rpc_handler_fn fns[3] = {serve_push_pull, serve_advert, serve_status};
    for (int k = 0; k < 3; k++)
        if ((rc = ts_rpc_handle(rpc, SERVED[k], fns[k], g)))
            goto fail;
    return TS_OK;
fail:
    ts_gossip_free(g);
    *out = NULL;
    return rc;
}

void ts_gossip_on_event(ts_gossip_t *g, ts_gossip_event_fn fn, void *arg) {
    g->on_event = fn;
    g->on_event_arg = arg;
}

void ts_gossip_on_load(ts_gossip_t *g, ts_gossip_load_fn fn, void *arg) {
    g->on_load = fn;
    g->on_load_arg = arg;
}

static void join_seeds(ts_gossip_t *g) {
    if (g->n_seeds == 0 || g->closing)
        return; /* a network of our own, until someone joins us */
    ts_swim_join(g->swim, now_ms(g), g->seeds, g->n_seeds);
    pump(g);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
    resolve_t *r = TS_CONTAINER_OF(req, resolve_t, req);
    ts_gossip_t *g = r->g;
    if (status == 0 && res && !g->closing) {
        ts_swim_addr_t a;
        addr_from_sockaddr(&a, res->ai_addr);
        seed_add(g, &a);
    }
    uv_freeaddrinfo(res);
    if (--g->pending_resolves > 0)
        return;
    if (g->closing) {
        if (g->handles == 0 && g->closed)
            g->closed(g, g->closed_arg);
        return;
    }
    join_seeds(g);
}

static void resolve_bootstrap(ts_gossip_t *g) {
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_family = memcmp(g->self_addr.ip, V4_MAPPED, 12) == 0 ? AF_INET : AF_UNSPEC;
    for (size_t i = 0; i < g->cfg.n_bootstrap; i++) {
        char host[ADDR_STR], port[8];
        int p;
        if (ts_net_parse_addr(g->bootstrap[i], host, sizeof host, &p, 0, NULL, 0) != TS_OK)
            continue; /* a bad entry does not stop the others */
        snprintf(port, sizeof port, "%d", p);
        resolve_t *r = &g->resolves[g->n_resolves];
        r->g = g;
        if (uv_getaddrinfo(g->loop, &r->req, on_resolved, host, port, &hints) == 0) {
            g->n_resolves++;
            g->pending_resolves++;
        }
    }
}

int ts_gossip_start(ts_gossip_t *g, char *err, size_t errlen) {
    if (!g || g->started || g->closing) {
        ts_set_err(err, errlen, "ts_gossip_start: started already, or closing");
        return TS_EINVAL;
    }
    ts_swim_addr_t la;
    addr_parse(g->listen, &la, 1, NULL, 0);
    struct sockaddr_storage ss;
    addr_to_sockaddr(&la, &ss);
    uv_udp_init(g->loop, &g->udp);
    g->udp.data = g;
    g->handles++;
    int rc = uv_udp_bind(&g->udp, (const struct sockaddr *)&ss, 0);
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    if (rc == 0)
        rc = uv_udp_getsockname(&g->udp, (struct sockaddr *)&bound, &blen);
    if (rc != 0) {
        ts_set_err(err, errlen, "gossip cannot bind UDP %s: %s", g->listen, uv_strerror(rc));
        return TS_EIO;
    }
    g->started = 1;
    ts_swim_addr_t b;
    addr_from_sockaddr(&b, (const struct sockaddr *)&bound);
    if (g->self_addr.port == 0)
        g->self_addr.port = b.port;

    /* the seal counter starts at the realtime clock in microseconds: above any earlier run's */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g->counter = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;

    uint64_t seed;
    randombytes_buf(&seed, sizeof seed);
    ts_swim_config_t sc = swim_config(g);
    if ((rc = ts_swim_create(&sc, g->self.b, &g->self_addr, seed, now_ms(g), &g->swim))) {
        ts_set_err(err, errlen, "the gossip core could not start (%s)", ts_strerror(rc));
        return rc;
    }
    uv_timer_init(g->loop, &g->timer);
    uv_timer_init(g->loop, &g->housekeeper);
    g->timer.data = g->housekeeper.data = g;
    g->handles += 2;
    uv_udp_recv_start(&g->udp, on_alloc, on_datagram);
    uv_timer_start(&g->housekeeper, on_housekeep, HOUSEKEEP_MS, HOUSEKEEP_MS);
    g->book_refreshed_ms = now_ms(g);

    if (g->own_body) { /* an advert set before start */
        Tessera__AdvertBody *body = g->own_body;
        g->own_body = NULL;
        rc = announce_own(g, body, err, errlen);
        ts_frame_free(body);
        if (rc)
            return rc;
    }
    book_load(g);
    resolve_bootstrap(g);
    if (g->pending_resolves == 0)
        join_seeds(g);
    pump(g);
    return TS_OK;
}

uint32_t ts_gossip_n_seeds(const ts_gossip_t *g) { return g ? (uint32_t)g->n_seeds : 0; }

void ts_gossip_rejoin(ts_gossip_t *g) {
    if (g && g->started)
        join_seeds(g);
}

void ts_gossip_set_health(ts_gossip_t *g, const char *health) {
    if (g)
        snprintf(g->health, sizeof g->health, "%s", health ? health : "");
}

void ts_gossip_set_metrics_url(ts_gossip_t *g, const char *url) {
    if (g)
        snprintf(g->metrics_url, sizeof g->metrics_url, "%s", url ? url : "");
}

int ts_gossip_port(const ts_gossip_t *g) { return g && g->started ? g->self_addr.port : 0; }

const ts_swim_t *ts_gossip_swim(const ts_gossip_t *g) { return g ? g->swim : NULL; }

void ts_gossip_get_stats(const ts_gossip_t *g, ts_gossip_stats_t *st) { *st = g->st; }

int ts_gossip_leave(ts_gossip_t *g, void (*done)(ts_gossip_t *g, void *arg), void *arg) {
    if (!g || !g->swim || g->closing)
        return TS_EINVAL;
    g->leave_done = done;
    g->leave_arg = arg;
    int rc = ts_swim_leave(g->swim, now_ms(g));
    pump(g);
    return rc;
}

static void on_handle_closed(uv_handle_t *h) {
    ts_gossip_t *g = h->data;
    if (--g->handles == 0 && g->pending_resolves == 0 && g->closed)
        g->closed(g, g->closed_arg);
}

void ts_gossip_close(ts_gossip_t *g, void (*closed)(ts_gossip_t *g, void *arg), void *arg) {
    if (!g || g->closing)
        return;
    book_flush(g); /* before closing is set: the members are still ours to read */
    g->closing = 1;
    g->closed = closed;
    g->closed_arg = arg;
    for (int k = 0; k < 3; k++)
        ts_rpc_handle(g->rpc, SERVED[k], NULL, NULL);
    while (!ts_list_empty(&g->ops)) /* each callback runs now and frees its op */
        ts_rpc_cancel(TS_CONTAINER_OF(g->ops.next, op_t, link)->call);
    for (uint32_t i = 0; i < g->n_resolves; i++)
        uv_cancel((uv_req_t *)&g->resolves[i].req); /* their callbacks still come */
    if (g->started) {
        uv_close((uv_handle_t *)&g->udp, on_handle_closed);
        if (g->swim) {
            uv_close((uv_handle_t *)&g->timer, on_handle_closed);
            uv_close((uv_handle_t *)&g->housekeeper, on_handle_closed);
        }
    } else if (g->handles > 0) { /* a start that failed to bind */
        uv_close((uv_handle_t *)&g->udp, on_handle_closed);
    }
    if (g->handles == 0 && g->pending_resolves == 0 && closed)
        closed(g, arg); /* nothing was ever started: done at once */
}

void ts_gossip_free(ts_gossip_t *g) {
    if (!g)
        return;
    if (!g->closing && g->rpc) /* never closed: the rpc endpoint must not call us any more */
        for (int k = 0; k < 3; k++)
            ts_rpc_handle(g->rpc, SERVED[k], NULL, NULL);
    ts_swim_free(g->swim);
    for (uint32_t i = 0; i < g->n_adverts; i++)
        advert_clear(&g->adverts[i]);
    ts_frame_free(g->own_body);
    if (g->bootstrap)
        for (size_t i = 0; i < g->cfg.n_bootstrap; i++)
            free(g->bootstrap[i]);
    free(g->bootstrap);
    free(g->replay);
    free(g->adverts);
    free(g->dirty);
    free(g->members);
    free(g->resolves);
    sodium_memzero(g->sign_sk, sizeof g->sign_sk);
    sodium_memzero(g->seal_key, sizeof g->seal_key);
    free(g);
}
