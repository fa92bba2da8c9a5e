/*
 * gossip.c — the SWIM core (net/swim.h) driven by a libuv loop: sealed UDP datagrams, one timer,
 * push-pull and advert fetches over RPC (net/rpc.h), the address book, and the status view
 * (gossip.h says what each does; docs/architecture.md, "The gossip driver", how they fit).
 *
 * The core is a pure state machine, so this file is its plumbing. Every call into it — a tick,
 * a datagram, a join, a merge, an advert change, a leave — is followed by the pump
 * (ts_gossip__pump), which drains the core's two queues (packets go out sealed at once; events
 * are acted on, then handed to the owner's callback) and re-arms the one core timer for
 * ts_swim_next_deadline(). Nothing else calls the core, so "drain after every call" holds by
 * construction.
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
 *
 * This file holds the core's plumbing and the life cycle; push-pull is in gossip_push_pull.c,
 * adverts in gossip_advert.c, the address book in gossip_book.c and the status view in
 * gossip_status.c; gossip_internal.h holds the state they share.
 */
#define _POSIX_C_SOURCE 200809L

#include "net/gossip.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/frame.h"
#include "net/gossip_internal.h"
#include "net/swim_wire.h"

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
void ts_gossip__addr_str(const ts_swim_addr_t *a, char out[ADDR_STR]) {
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
int ts_gossip__addr_parse(const char *s, ts_swim_addr_t *a, int allow_zero, char *err,
                          size_t errlen) {
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

/* ---- signatures (the core's callbacks) ------------------------------------------------------ */

static int sign_cb(void *ctx, const uint8_t *msg, size_t len, uint8_t sig[TS_SWIM_SIG_LEN]) {
    ts_gossip_t *g = ctx;
    return crypto_sign_detached(sig, NULL, msg, len, g->sign_sk) == 0 ? 0 : -1;
}

static int verify_cb(void *ctx, const uint8_t id[TS_SWIM_ID_LEN], const uint8_t *msg, size_t len,
                     const uint8_t sig[TS_SWIM_SIG_LEN]) {
    ts_gossip_t *g = ctx;
    if (g->n_bans && ts_gossip__expelled(g, id))
        return -1; /* an expelled node's claims are not taken, from anyone */
    return crypto_sign_verify_detached(sig, msg, len, id) == 0 ? 0 : -1;
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
    if (g->n_bans && ts_gossip__expelled(g, plain + 2)) {
        g->st.udp_expelled++;
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
    ts_gossip__pump(g);
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

op_t *ts_gossip__op_new(ts_gossip_t *g, op_kind_t kind, const uint8_t id[TS_SWIM_ID_LEN]) {
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

void ts_gossip__op_free(op_t *op) {
    ts_gossip_t *g = op->g;
    ts_list_remove(&op->link);
    if (op->kind == OP_PUSH_PULL)
        g->n_push_pulls--;
    else
        g->n_fetches--;
    free(op);
}

/* Sends env to addr as op's call; on failure the op is freed and the failure counted. */
int ts_gossip__op_call(op_t *op, const ts_swim_addr_t *addr, const Tessera__Envelope *env,
                       uint32_t timeout_ms, ts_rpc_cb cb) {
    ts_gossip_t *g = op->g;
    char a[ADDR_STR];
    ts_gossip__addr_str(addr, a);
    static const uint8_t zero[TS_SWIM_ID_LEN];
    if (ts_rpc_peer_get(g->rpc, a, &op->peer, NULL, 0) != TS_OK) {
        ts_gossip__op_free(op);
        return -1;
    }
    /* a member's address may be its relay's, or another node's since: only the member itself
     * may answer (a join's seed is known by address alone) */
    if (memcmp(op->id, zero, sizeof zero) != 0) {
        ts_node_id_t want;
        memcpy(want.b, op->id, sizeof want.b);
        ts_rpc_peer_expect(op->peer, &want);
    }
    if (ts_rpc_call(op->peer, env, timeout_ms, cb, op, &op->call, NULL, 0) != TS_OK) {
        ts_gossip__op_free(op);
        return -1;
    }
    return 0;
}

/* ---- events and the pump -------------------------------------------------------------------- */

static void handle_event(ts_gossip_t *g, const ts_swim_event_t *ev) {
    switch (ev->type) {
    case TS_SWIM_EV_PUSH_PULL: ts_gossip__start_push_pull(g, ev); break;
    case TS_SWIM_EV_ADVERT_NEEDED:
        ts_gossip__start_fetch(g, ev->id, &ev->addr, ev->advert_version);
        break;
    case TS_SWIM_EV_REAPED: ts_gossip__advert_drop(g, ev->id); break;
    case TS_SWIM_EV_JOINED:
    case TS_SWIM_EV_ALIVE_AGAIN:
    case TS_SWIM_EV_ADDR_CHANGED: ts_gossip__book_mark(g, ev->id); break;
    default: break;
    }
    if (g->on_event)
        g->on_event(g->on_event_arg, ev);
}

static void on_timer(uv_timer_t *t);

void ts_gossip__pump(ts_gossip_t *g) {
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
    ts_gossip__pump(g);
}

static void on_housekeep(uv_timer_t *t) {
    ts_gossip_t *g = t->data;
    if (now_ms(g) - g->book_refreshed_ms >= BOOK_REFRESH_MS) {
        g->book_full = 1;
        g->book_refreshed_ms = now_ms(g);
    }
    ts_gossip__book_flush(g);
    ts_gossip__reconcile_adverts(g);
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
    /* digests cost the same at any size: the period need not grow with n */
    c.push_pull_fixed = !g->cfg.full_push_pull;
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
    int rc = ts_gossip__addr_parse(cfg->listen, &la, 1, err, errlen);
    if (rc)
        return rc;
    const char *adv = cfg->advertise && cfg->advertise[0] ? cfg->advertise : cfg->listen;
    if ((rc = ts_gossip__addr_parse(adv, &aa, 1, err, errlen)))
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
    const ts_rpc_handler_fn fns[3] = {ts_gossip__serve_push_pull, ts_gossip__serve_advert,
                                      ts_gossip__serve_status};
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
    ts_gossip__pump(g);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
    resolve_t *r = TS_CONTAINER_OF(req, resolve_t, req);
    ts_gossip_t *g = r->g;
    if (status == 0 && res && !g->closing) {
        ts_swim_addr_t a;
        addr_from_sockaddr(&a, res->ai_addr);
        ts_gossip__seed_add(g, &a);
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
    ts_gossip__addr_parse(g->listen, &la, 1, NULL, 0);
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
        rc = ts_gossip__announce_own(g, body, err, errlen);
        ts_frame_free(body);
        if (rc)
            return rc;
    }
    ts_gossip__book_load(g);
    resolve_bootstrap(g);
    if (g->pending_resolves == 0)
        join_seeds(g);
    ts_gossip__pump(g);
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

void ts_gossip_set_training(ts_gossip_t *g, const ts_gossip_training_t *t) {
    if (!g)
        return;
    if (t)
        g->training = *t;
    else
        memset(&g->training, 0, sizeof g->training);
}

int ts_advert_trained(const Tessera__AdvertBody *b) {
    return b && (!b->training || b->training->step >= b->training->steps);
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
    ts_gossip__pump(g);
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
    ts_gossip__book_flush(g); /* before closing is set: the members are still ours to read */
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
        ts_gossip__advert_clear(&g->adverts[i]);
    ts_frame_free(g->own_body);
    if (g->bootstrap)
        for (size_t i = 0; i < g->cfg.n_bootstrap; i++)
            free(g->bootstrap[i]);
    free(g->bootstrap);
    free(g->replay);
    free(g->adverts);
    free(g->bans);
    free(g->dirty);
    free(g->members);
    free(g->resolves);
    sodium_memzero(g->sign_sk, sizeof g->sign_sk);
    sodium_memzero(g->seal_key, sizeof g->seal_key);
    free(g);
}
