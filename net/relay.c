/* relay.c — the relay's side: reservations, their sockets, and the splices (relay.h). */
#define _POSIX_C_SOURCE 200809L

#include "net/relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"
#include "base/list.h"

#define LEG_HEAD_MAX 256     /* bytes a leg may send before it is paired (Noise msg 1: 50) */
#define LEG_HIGH (1u << 20)  /* a leg's write queue over this: its partner stops reading */
#define LEG_READ (64u << 10) /* bytes per read */
#define BIND_TRIES 8         /* ports tried before a reservation is refused */

typedef struct resv resv_t;

typedef enum { ROLE_UNKNOWN, ROLE_DIALER, ROLE_BACK } role_t;

/* One accepted socket on a reservation's port: a dialer, or the node's connect-back. */
typedef struct leg {
    ts_list_t node; /* in rv->legs */
    resv_t *rv;
    uv_tcp_t tcp;
    uv_timer_t timer; /* a dialer's wait for its connect-back */
    int handles;      /* open: tcp, timer */
    role_t role;
    struct leg *peer; /* the other end of the splice, once paired */
    uint8_t head[LEG_HEAD_MAX];
    size_t head_len;
    uint8_t token[TS_FRAME_CIRCUIT_BYTES];
    size_t queued; /* bytes written to this leg and not yet sent */
    int reading, closing;
} leg_t;

struct resv {
    ts_list_t node; /* in r->resvs */
    ts_relay_t *r;
    ts_rpc_request_t *req; /* held while the reservation lives; NULL once answered */
    ts_node_id_t id;
    uv_tcp_t tcp;
    uv_udp_t udp;
    uv_timer_t pace; /* resumes the legs the byte cap paused */
    int handles;     /* open: tcp, udp, pace */
    int port;
    char addr[TS_FRAME_ADDR_MAX + 1];
    ts_list_t legs;
    uint32_t n_legs, n_spliced;
    double dgram_tokens, byte_tokens;
    uint64_t refilled_ms;
    int throttled, closing;
};

struct ts_relay {
    ts_rpc_t *rpc;
    uv_loop_t *loop;
    ts_relay_config_t cfg;
    char bind_host[64], public_host[TS_FRAME_ADDR_MAX + 1];
    ts_list_t resvs;
    uint32_t n_resvs, live_resvs; /* allocated (closing included); not closing */
    int closing;
    uint8_t rbuf[LEG_READ];
    ts_relay_stats_t st;
};

void ts_relay_config_default(ts_relay_config_t *cfg) {
    *cfg = (ts_relay_config_t){.max_reservations = 32,
                               .max_circuits = 32,
                               .datagrams_per_s = 200,
                               .bytes_per_s = 8u << 20,
                               .circuit_wait_ms = 10000,
                               .bind_host = "0.0.0.0",
                               .public_host = NULL};
}

/* ---- ending things ------------------------------------------------------------------------- */

static void resv_free_if_done(resv_t *rv) {
    if (rv->handles || rv->n_legs || !rv->closing)
        return;
    ts_relay_t *r = rv->r;
    ts_list_remove(&rv->node);
    r->n_resvs--;
    free(rv);
}

static void leg_handle_closed(uv_handle_t *h) {
    leg_t *l = h->data;
    if (--l->handles > 0)
        return;
    resv_t *rv = l->rv;
    ts_list_remove(&l->node);
    rv->n_legs--;
    free(l);
    resv_free_if_done(rv);
}

static void leg_close(leg_t *l) {
    if (l->closing)
        return;
    l->closing = 1;
    if (l->peer) {
        leg_t *p = l->peer;
        l->peer = NULL;
        p->peer = NULL;
        l->rv->n_spliced--;
        l->rv->r->st.circuits--;
        leg_close(p);
    }
    uv_close((uv_handle_t *)&l->tcp, leg_handle_closed);
    uv_close((uv_handle_t *)&l->timer, leg_handle_closed);
}

static void resv_handle_closed(uv_handle_t *h) {
    resv_t *rv = h->data;
    rv->handles--;
    resv_free_if_done(rv);
}

/* Ends rv: answers the held request (dropped if its link is gone), closes its sockets and legs. */
static void resv_end(resv_t *rv, const char *why) {
    if (rv->closing)
        return;
    rv->closing = 1;
    rv->r->live_resvs--;
    rv->r->st.reservations--;
    if (rv->req) {
        Tessera__RelayEnded e = TESSERA__RELAY_ENDED__INIT;
        e.message = (char *)why;
        Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
        env.body_case = TESSERA__ENVELOPE__BODY_RELAY_ENDED;
        env.relay_ended = &e;
        ts_rpc_request_t *req = rv->req;
        rv->req = NULL;
        ts_rpc_reply(req, &env);
    }
    TS_LIST_FOREACH(it, &rv->legs)
    leg_close(TS_CONTAINER_OF(it, leg_t, node));
    uv_close((uv_handle_t *)&rv->tcp, resv_handle_closed);
    uv_close((uv_handle_t *)&rv->udp, resv_handle_closed);
    uv_close((uv_handle_t *)&rv->pace, resv_handle_closed);
}

/* ---- pacing ---------------------------------------------------------------------------------- */

/* Refills rv's buckets (datagrams and bytes per second, each holding one second's worth). */
static void refill(resv_t *rv) {
    const ts_relay_config_t *c = &rv->r->cfg;
    uint64_t now = uv_now(rv->r->loop);
    double dt = (double)(now - rv->refilled_ms) / 1000.0;
    rv->refilled_ms = now;
    rv->dgram_tokens += dt * c->datagrams_per_s;
    if (rv->dgram_tokens > c->datagrams_per_s)
        rv->dgram_tokens = c->datagrams_per_s;
    rv->byte_tokens += dt * (double)c->bytes_per_s;
    if (rv->byte_tokens > (double)c->bytes_per_s)
        rv->byte_tokens = (double)c->bytes_per_s;
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    leg_t *l = h->data;
    *buf = uv_buf_init((char *)l->rv->r->rbuf, LEG_READ);
}

static void leg_read(leg_t *l, int on) {
    if (l->closing || l->reading == on)
        return;
    l->reading = on;
    if (on)
        uv_read_start((uv_stream_t *)&l->tcp, alloc_cb, read_cb);
    else
        uv_read_stop((uv_stream_t *)&l->tcp);
}

/* A spliced leg stops reading while its partner's write queue is over LEG_HIGH (or the byte cap
 * is spent), and reads again once that queue is back under half of it. */
static void leg_update_reading(leg_t *l) {
    if (!l->peer) {
        leg_read(l, !l->closing);
        return;
    }
    size_t limit = l->reading ? LEG_HIGH : LEG_HIGH / 2;
    leg_read(l, !l->rv->throttled && l->peer->queued <= limit);
}

static void pace_cb(uv_timer_t *t) {
    resv_t *rv = t->data;
    refill(rv);
    if (rv->byte_tokens <= 0) {
        uv_timer_start(&rv->pace, pace_cb, 50, 0);
        return;
    }
    rv->throttled = 0;
    TS_LIST_FOREACH(it, &rv->legs)
    leg_update_reading(TS_CONTAINER_OF(it, leg_t, node));
}

/* ---- splicing --------------------------------------------------------------------------------- */

typedef struct {
    uv_write_t req;
    leg_t *to;
    size_t len;
    uint8_t data[];
} wr_t;

static void write_cb(uv_write_t *req, int status) {
    wr_t *w = TS_CONTAINER_OF(req, wr_t, req);
    leg_t *to = w->to;
    to->queued -= w->len;
    free(w);
    if (to->closing)
        return;
    if (status < 0) {
        leg_close(to);
        return;
    }
    if (to->peer)
        leg_update_reading(to->peer);
}

/* Queues a copy of data[0, len) on l; closes the splice when that fails. */
static int leg_write(leg_t *l, const uint8_t *data, size_t len) {
    if (len == 0)
        return 0;
    wr_t *w = malloc(sizeof *w + len);
    if (!w) {
        leg_close(l);
        return -1;
    }
    memcpy(w->data, data, len);
    w->to = l;
    w->len = len;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)len);
    if (uv_write(&w->req, (uv_stream_t *)&l->tcp, &b, 1, write_cb) != 0) {
        free(w);
        leg_close(l);
        return -1;
    }
    l->queued += len;
    return 0;
}

static void splice(leg_t *dialer, leg_t *back) {
    resv_t *rv = dialer->rv;
    dialer->peer = back;
    back->peer = dialer;
    rv->n_spliced++;
    rv->r->st.circuits++;
    rv->r->st.circuits_total++;
    uv_timer_stop(&dialer->timer);
    /* what the dialer sent while it waited (its handshake's first message), then whatever the
     * node sent after its preamble */
    if (leg_write(back, dialer->head, dialer->head_len) ||
        leg_write(dialer, back->head + TS_RELAY_PREAMBLE, back->head_len - TS_RELAY_PREAMBLE))
        return;
    dialer->head_len = back->head_len = 0;
    leg_update_reading(dialer);
    leg_update_reading(back);
}

static void dialer_timeout_cb(uv_timer_t *t) {
    leg_t *l = t->data;
    l->rv->r->st.circuits_failed++;
    leg_close(l);
}

/* A new leg's first bytes say what it is: the node's connect-back ("TSR1" ‖ token) or a
 * dialer (anything else: its Noise message 1), whose bytes wait for the connect-back. */
static void classify(leg_t *l) {
    resv_t *rv = l->rv;
    ts_relay_t *r = rv->r;
    if (l->role == ROLE_UNKNOWN) {
        if (l->head_len < 4)
            return;
        l->role = memcmp(l->head, TS_RELAY_MAGIC, 4) == 0 ? ROLE_BACK : ROLE_DIALER;
        if (l->role == ROLE_DIALER) {
            if (rv->n_spliced >= r->cfg.max_circuits || !rv->req) {
                r->st.circuits_failed++;
                leg_close(l);
                return;
            }
            randombytes_buf(l->token, sizeof l->token);
            Tessera__RelayEvent ev = TESSERA__RELAY_EVENT__INIT;
            ev.has_circuit = 1;
            ev.circuit.data = l->token;
            ev.circuit.len = sizeof l->token;
            Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
            env.body_case = TESSERA__ENVELOPE__BODY_RELAY_EVENT;
            env.relay_event = &ev;
            if (ts_rpc_request_send(rv->req, &env, NULL, 0) != TS_OK) {
                r->st.circuits_failed++;
                leg_close(l);
                return;
            }
            uv_timer_start(&l->timer, dialer_timeout_cb, r->cfg.circuit_wait_ms, 0);
        }
    }
    if (l->role != ROLE_BACK || l->head_len < TS_RELAY_PREAMBLE)
        return;
    TS_LIST_FOREACH(it, &rv->legs) {
        leg_t *d = TS_CONTAINER_OF(it, leg_t, node);
        if (d->role == ROLE_DIALER && !d->peer && !d->closing &&
            sodium_memcmp(d->token, l->head + 4, sizeof d->token) == 0) {
            splice(d, l);
            return;
        }
    }
    leg_close(l); /* a token nobody waits for (expired, or not ours) */
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    leg_t *l = s->data;
    if (l->closing)
        return;
    if (nread < 0) {
        leg_close(l);
        return;
    }
    if (nread == 0)
        return;
    const uint8_t *data = (const uint8_t *)buf->base;
    resv_t *rv = l->rv;
    if (l->peer) {
        rv->r->st.bytes += (uint64_t)nread;
        if (rv->r->cfg.bytes_per_s) {
            refill(rv);
            rv->byte_tokens -= (double)nread;
            if (rv->byte_tokens < 0 && !rv->throttled) {
                rv->throttled = 1;
                uv_timer_start(&rv->pace, pace_cb, 50, 0);
            }
        }
        leg_t *p = l->peer;
        if (leg_write(p, data, (size_t)nread) == 0)
            leg_update_reading(l);
        return;
    }
    if (l->head_len + (size_t)nread > sizeof l->head) { /* more than a handshake's first part */
        leg_close(l);
        return;
    }
    memcpy(l->head + l->head_len, data, (size_t)nread);
    l->head_len += (size_t)nread;
    classify(l);
}

static void on_leg(uv_stream_t *server, int status) {
    resv_t *rv = server->data;
    if (status < 0 || rv->closing)
        return;
    leg_t *l = calloc(1, sizeof *l);
    if (!l) /* not accepted: the socket waits in the backlog until memory returns */
        return;
    l->rv = rv;
    uv_tcp_init(rv->r->loop, &l->tcp);
    uv_timer_init(rv->r->loop, &l->timer);
    l->tcp.data = l->timer.data = l;
    l->handles = 2;
    ts_list_push(&rv->legs, &l->node);
    rv->n_legs++;
    if (uv_accept(server, (uv_stream_t *)&l->tcp) != 0 ||
        rv->n_legs > 2 * rv->r->cfg.max_circuits + 2) {
        rv->r->st.circuits_failed++;
        leg_close(l);
        return;
    }
    uv_tcp_nodelay(&l->tcp, 1);
    leg_update_reading(l);
}

/* ---- datagrams -------------------------------------------------------------------------------- */

static void udp_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    resv_t *rv = h->data;
    *buf = uv_buf_init((char *)rv->r->rbuf, TS_FRAME_DATAGRAM_MAX + 1);
}

static void udp_recv(uv_udp_t *u, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *from,
                     unsigned flags) {
    resv_t *rv = u->data;
    ts_relay_t *r = rv->r;
    if (nread <= 0 || !from || rv->closing || !rv->req)
        return;
    refill(rv);
    if ((flags & UV_UDP_PARTIAL) || nread > TS_FRAME_DATAGRAM_MAX || rv->dgram_tokens < 1) {
        r->st.datagrams_dropped++;
        return;
    }
    rv->dgram_tokens -= 1;
    char ip[64], addr[96];
    int port = 0;
    if (from->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)from;
        uv_ip4_name(a, ip, sizeof ip);
        port = ntohs(a->sin_port);
        snprintf(addr, sizeof addr, "%s:%d", ip, port);
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)from;
        uv_ip6_name(a, ip, sizeof ip);
        port = ntohs(a->sin6_port);
        snprintf(addr, sizeof addr, "[%s]:%d", ip, port);
    }
    Tessera__RelayEvent ev = TESSERA__RELAY_EVENT__INIT;
    ev.has_datagram = 1;
    ev.datagram.data = (uint8_t *)buf->base;
    ev.datagram.len = (size_t)nread;
    ev.from = addr;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_RELAY_EVENT;
    env.relay_event = &ev;
    if (ts_rpc_request_send(rv->req, &env, NULL, 0) == TS_OK)
        r->st.datagrams++;
    else
        r->st.datagrams_dropped++;
}

/* ---- reservations ----------------------------------------------------------------------------- */

/* A TCP listener and a UDP socket on one free port of bind_host: the TCP port is picked, and the
 * UDP socket must get the same one (tried BIND_TRIES times). */
static int bind_pair(const ts_relay_t *r, int *tcp_fd, int *udp_fd, int *port) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    int fam;
    if (uv_ip4_addr(r->bind_host, 0, (struct sockaddr_in *)&ss) == 0) {
        fam = AF_INET;
        sl = sizeof(struct sockaddr_in);
    } else if (uv_ip6_addr(r->bind_host, 0, (struct sockaddr_in6 *)&ss) == 0) {
        fam = AF_INET6;
        sl = sizeof(struct sockaddr_in6);
    } else {
        return TS_EINVAL;
    }
    for (int i = 0; i < BIND_TRIES; i++) {
        int t = socket(fam, SOCK_STREAM, 0), u = socket(fam, SOCK_DGRAM, 0);
        if (t < 0 || u < 0) {
            if (t >= 0)
                close(t);
            if (u >= 0)
                close(u);
            return TS_EIO;
        }
        int one = 1;
        setsockopt(t, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_storage b = ss;
        if (fam == AF_INET)
            ((struct sockaddr_in *)&b)->sin_port = 0;
        else
            ((struct sockaddr_in6 *)&b)->sin6_port = 0;
        if (bind(t, (struct sockaddr *)&b, sl) == 0 && listen(t, 64) == 0) {
            socklen_t bl = sl;
            getsockname(t, (struct sockaddr *)&b, &bl);
            if (bind(u, (struct sockaddr *)&b, sl) == 0) {
                *tcp_fd = t;
                *udp_fd = u;
                *port = ntohs(fam == AF_INET ? ((struct sockaddr_in *)&b)->sin_port
                                             : ((struct sockaddr_in6 *)&b)->sin6_port);
                return TS_OK;
            }
        }
        close(t);
        close(u);
    }
    return TS_EIO;
}

static void reservation_cancelled(ts_rpc_request_t *req, void *arg) {
    (void)req;
    resv_t *rv = arg;
    resv_end(rv, "the node's link closed");
}

static void serve_reserve(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    (void)env;
    ts_relay_t *r = arg;
    if (r->closing) {
        r->st.refused++;
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE, "the relay is closing");
        return;
    }
    const ts_node_id_t *who = ts_rpc_request_peer(req);
    TS_LIST_FOREACH(it, &r->resvs) { /* a node reconnecting: its new link replaces the old */
        resv_t *old = TS_CONTAINER_OF(it, resv_t, node);
        if (!old->closing && memcmp(old->id.b, who->b, sizeof who->b) == 0) {
            resv_end(old, "replaced by a newer reservation of the same node");
            break;
        }
    }
    if (r->live_resvs >= r->cfg.max_reservations) {
        r->st.refused++;
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           "the relay is full (%u nodes carried)", r->cfg.max_reservations);
        return;
    }
    int tfd, ufd, port;
    if (bind_pair(r, &tfd, &ufd, &port) != TS_OK) {
        r->st.refused++;
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           "the relay found no free port on %s", r->bind_host);
        return;
    }
    resv_t *rv = calloc(1, sizeof *rv);
    if (!rv) {
        close(tfd);
        close(ufd);
        r->st.refused++;
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    rv->r = r;
    rv->id = *who;
    rv->port = port;
    rv->req = req;
    ts_list_init(&rv->legs);
    uv_tcp_init(r->loop, &rv->tcp);
    uv_udp_init(r->loop, &rv->udp);
    uv_timer_init(r->loop, &rv->pace);
    rv->tcp.data = rv->udp.data = rv->pace.data = rv;
    rv->handles = 3;
    rv->refilled_ms = uv_now(r->loop);
    rv->dgram_tokens = r->cfg.datagrams_per_s;
    rv->byte_tokens = (double)r->cfg.bytes_per_s;
    ts_list_push(&r->resvs, &rv->node);
    r->n_resvs++;
    r->live_resvs++;
    r->st.reservations++;
    r->st.reservations_total++;
    snprintf(rv->addr, sizeof rv->addr, strchr(r->public_host, ':') ? "[%s]:%d" : "%s:%d",
             r->public_host, port);
    int rc = uv_tcp_open(&rv->tcp, tfd);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&rv->tcp, 64, on_leg);
    else
        close(tfd);
    int urc = uv_udp_open(&rv->udp, ufd);
    if (urc == 0)
        urc = uv_udp_recv_start(&rv->udp, udp_alloc, udp_recv);
    else
        close(ufd);
    ts_rpc_request_on_cancel(req, reservation_cancelled, rv);
    Tessera__RelayEvent ev = TESSERA__RELAY_EVENT__INIT;
    ev.addr = rv->addr;
    Tessera__Envelope e = TESSERA__ENVELOPE__INIT;
    e.body_case = TESSERA__ENVELOPE__BODY_RELAY_EVENT;
    e.relay_event = &ev;
    if (rc || urc || ts_rpc_request_send(req, &e, NULL, 0) != TS_OK)
        resv_end(rv, "the relay could not open the reservation's sockets");
}

/* ---- the relay -------------------------------------------------------------------------------- */

int ts_relay_serve(ts_rpc_t *rpc, const ts_relay_config_t *cfg, ts_relay_t **out, char *err,
                   size_t errlen) {
    if (!rpc || !cfg || !out || !cfg->public_host || !cfg->public_host[0] ||
        strlen(cfg->public_host) > TS_FRAME_ADDR_MAX - 8 || cfg->max_reservations == 0 ||
        cfg->max_circuits == 0 || cfg->circuit_wait_ms == 0) {
        ts_set_err(err, errlen,
                   "ts_relay_serve: a public host, and non-zero reservations, circuits and wait "
                   "are needed");
        return TS_EINVAL;
    }
    ts_relay_t *r = calloc(1, sizeof *r);
    if (!r)
        return TS_ENOMEM;
    r->rpc = rpc;
    r->loop = ts_net_loop(ts_rpc_net(rpc));
    r->cfg = *cfg;
    snprintf(r->bind_host, sizeof r->bind_host, "%s",
             cfg->bind_host && cfg->bind_host[0] ? cfg->bind_host : "0.0.0.0");
    snprintf(r->public_host, sizeof r->public_host, "%s", cfg->public_host);
    r->cfg.bind_host = r->bind_host;
    r->cfg.public_host = r->public_host;
    ts_list_init(&r->resvs);
    ts_rpc_handle(rpc, TESSERA__ENVELOPE__BODY_RELAY_RESERVE, serve_reserve, r);
    *out = r;
    return TS_OK;
}

void ts_relay_stats(const ts_relay_t *r, ts_relay_stats_t *st) { *st = r->st; }

void ts_relay_close(ts_relay_t *r) {
    if (!r || r->closing)
        return;
    r->closing = 1;
    ts_rpc_handle(r->rpc, TESSERA__ENVELOPE__BODY_RELAY_RESERVE, NULL, NULL);
    TS_LIST_FOREACH(it, &r->resvs)
    resv_end(TS_CONTAINER_OF(it, resv_t, node), "the relay is shutting down");
}

int ts_relay_free(ts_relay_t *r) {
    if (!r)
        return TS_OK;
    if (r->n_resvs)
        return TS_EBUSY;
    free(r);
    return TS_OK;
}
