/*
 * rpc_peer.c — the pool of outgoing connections (net/rpc.h): one peer per address, created on
 * first use (ts_rpc_peer_get) and kept until shutdown. A peer connects when a call or a waiter
 * needs it; after a failed attempt it waits a jittered exponential backoff before the next, and
 * with cfg.fail_fast the calls queued for it fail at once with why. The connection handler here
 * serves every connection of the endpoint, accepted ones too (and those of ts_rpc_accept_via,
 * served as accepted): opening one starts its session and sends the peer's queued calls; closing
 * it ends the session and decides what the peer does next.
 */
#define _POSIX_C_SOURCE 200809L /* uv.h needs POSIX types (pthread_rwlock_t, addrinfo) */

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/list.h"
#include "net/rpc.h"
#include "net/rpc_internal.h"

static void peer_schedule(ts_rpc_peer_t *p, int failed);
static void fail_queue(ts_rpc_peer_t *p, const char *why);

void ts_rpc__peer_notify(ts_rpc_peer_t *p, int status, const char *message) {
    ts_rpc_peer_cb cb = p->waiter;
    if (!cb)
        return;
    p->waiter = NULL;
    cb(p, status, message, p->waiter_arg);
}

static void conn_open(ts_conn_t *c) {
    session_t *s = ts_conn_data(c);
    if (!ts_conn_is_initiator(c)) { /* accepted: the listener's data was the endpoint */
        ts_rpc_t *rpc = (ts_rpc_t *)s;
        s = rpc->closing ? NULL : ts_rpc__session_new(rpc, NULL);
        ts_conn_set_data(c, s);
        if (!s) {
            ts_conn_close(c);
            return;
        }
        s->conn = c;
    }
    ts_conn_peer_id(c, &s->peer_id);
    ts_rpc_peer_t *p = s->peer;
    if (!p)
        return;
    p->state = PEER_OPEN;
    p->info.open = 1;
    p->info.failures = 0;
    p->last_failure[0] = 0;
    p->info.has_node_id = 1;
    p->info.node_id = s->peer_id;
    p->info.handshake_ns = uv_hrtime() - p->connect_started_ns;
    ts_rpc__peer_notify(p, TS_OK, "connected");
    while (p->sess == s && !ts_list_empty(&p->queue) && ts_conn_is_open(c))
        ts_rpc__send_call(s, TS_CONTAINER_OF(p->queue.next, ts_rpc_call_t, node));
}

static void conn_closed(ts_conn_t *c, const ts_conn_close_info_t *why) {
    session_t *s = ts_conn_data(c);
    if (!s || (!ts_conn_is_initiator(c) && !why->was_open)) /* accepted, never a session */
        return;
    ts_rpc_peer_t *p = s->peer;
    ts_rpc__session_end(s, why->message);
    if (!p)
        return;
    p->conn = NULL;
    p->sess = NULL;
    p->info.open = 0;
    if (!why->was_open) {
        p->info.failures++;
        snprintf(p->last_failure, sizeof p->last_failure, "%.199s", why->message);
        ts_rpc__peer_notify(p, TS_ECLOSED, why->message);
        /* the calls waiting for this connection learn why if they time out; they stay queued,
         * unless cfg.fail_fast (once the backoff is set, so that their callbacks' new calls to
         * this peer are refused at once too) */
    }
    peer_schedule(p, !why->was_open);
    if (!why->was_open)
        fail_queue(p, p->last_failure);
}

const ts_conn_handler_t ts_rpc__handler = {conn_open, ts_rpc__conn_frame, NULL, conn_closed};

/* cfg.fail_fast: the calls waiting for p's connection fail now, with why the attempt failed. */
static void fail_queue(ts_rpc_peer_t *p, const char *why) {
    if (!p->rpc->cfg.fail_fast)
        return;
    char msg[600];
    if (strncmp(why, "cannot connect to ", 18) == 0) /* the connection's own words name it */
        snprintf(msg, sizeof msg, "%s", why);
    else
        snprintf(msg, sizeof msg, "cannot connect to %s: %s", p->addr, why);
    ts_list_t doomed; /* the calls queued now: a callback's new calls are not swept up */
    ts_list_init(&doomed);
    while (!ts_list_empty(&p->queue)) {
        ts_list_t *n = p->queue.next;
        ts_list_remove(n);
        ts_list_push(&doomed, n);
    }
    while (!ts_list_empty(&doomed))
        ts_rpc__finish_call(TS_CONTAINER_OF(doomed.next, ts_rpc_call_t, node), TS_ECLOSED, NULL, 0,
                            msg);
}

void ts_rpc__peer_connect_now(ts_rpc_peer_t *p) {
    ts_rpc_t *rpc = p->rpc;
    char err[256] = "";
    session_t *s = ts_rpc__session_new(rpc, p);
    if (!s) {
        ts_rpc__peer_notify(p, TS_ENOMEM, "out of memory");
        return;
    }
    p->state = PEER_CONNECTING;
    p->info.attempts++;
    p->connect_started_ns = uv_hrtime();
    p->sess = s;
    ts_conn_connect_opts_t o = {.expect = p->has_expect ? &p->expect : NULL};
    int rc =
        ts_conn_connect_ex(rpc->net, p->addr, &o, &ts_rpc__handler, s, &p->conn, err, sizeof err);
    if (rc) { /* no callback follows: fail as a refused attempt would */
        p->sess = NULL;
        rpc->sessions--;
        free(s);
        p->info.failures++;
        snprintf(p->last_failure, sizeof p->last_failure, "%.199s", err);
        ts_rpc__peer_notify(p, TS_ECLOSED, err);
        peer_schedule(p, 1);
        fail_queue(p, p->last_failure);
        return;
    }
    s->conn = p->conn;
}

static void backoff_cb(uv_timer_t *t) {
    ts_rpc_peer_t *p = t->data;
    p->state = PEER_IDLE;
    if (!ts_list_empty(&p->queue) || p->waiter)
        ts_rpc__peer_connect_now(p);
}

/* Decides what a peer without a connection does next: retry after a backoff when the last
 * attempt failed, reconnect at once when calls wait and it had simply closed, else rest. */
static void peer_schedule(ts_rpc_peer_t *p, int failed) {
    ts_rpc_t *rpc = p->rpc;
    p->state = PEER_IDLE;
    if (rpc->closing)
        return;
    if (failed) {
        uint32_t f = p->info.failures > 0 ? p->info.failures - 1 : 0;
        uint64_t d = (uint64_t)rpc->cfg.backoff_base_ms << (f < 20 ? f : 20);
        if (d > rpc->cfg.backoff_max_ms)
            d = rpc->cfg.backoff_max_ms;
        d = d / 2 + (d / 2) * randombytes_uniform(1001) / 1000; /* jitter: [d/2, d] */
        p->info.last_backoff_ms = (uint32_t)d;
        p->state = PEER_BACKOFF;
        uv_timer_start(&p->timer, backoff_cb, d, 0);
    } else if (!ts_list_empty(&p->queue) || p->waiter) {
        ts_rpc__peer_connect_now(p);
    }
}

int ts_rpc_peer_get(ts_rpc_t *rpc, const char *addr, ts_rpc_peer_t **out, char *err,
                    size_t errlen) {
    if (!rpc || !addr || !out) {
        ts_set_err(err, errlen, "ts_rpc_peer_get: NULL argument");
        return TS_EINVAL;
    }
    *out = NULL;
    if (rpc->closing) {
        ts_set_err(err, errlen, "the RPC endpoint is shutting down");
        return TS_ECLOSED;
    }
    TS_LIST_FOREACH(it, &rpc->peers) {
        ts_rpc_peer_t *p = TS_CONTAINER_OF(it, ts_rpc_peer_t, node);
        if (strcmp(p->addr, addr) == 0) {
            *out = p;
            return TS_OK;
        }
    }
    char host[256];
    int port;
    int rc = ts_net_parse_addr(addr, host, sizeof host, &port, 0, err, errlen);
    if (rc)
        return rc;
    ts_rpc_peer_t *p = calloc(1, sizeof *p);
    if (!p)
        return TS_ENOMEM;
    p->rpc = rpc;
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    ts_list_init(&p->queue);
    p->next_id = 1; /* we open this connection: odd ids */
    uv_timer_init(ts_net_loop(rpc->net), &p->timer);
    p->timer.data = p;
    rpc->peer_timers++;
    ts_list_push(&rpc->peers, &p->node);
    *out = p;
    return TS_OK;
}

int ts_rpc_peer_connect(ts_rpc_peer_t *p, ts_rpc_peer_cb cb, void *arg) {
    if (!p)
        return TS_EINVAL;
    if (p->rpc->closing)
        return TS_ECLOSED;
    p->waiter = cb;
    p->waiter_arg = arg;
    if (p->state == PEER_OPEN)
        ts_rpc__peer_notify(p, TS_OK, "connected");
    else if (p->state == PEER_IDLE)
        ts_rpc__peer_connect_now(p);
    return TS_OK;
}

void ts_rpc_peer_info(const ts_rpc_peer_t *p, ts_rpc_peer_info_t *out) { *out = p->info; }

void ts_rpc_peer_expect(ts_rpc_peer_t *p, const ts_node_id_t *id) {
    if (!p)
        return;
    if (!id) {
        p->has_expect = 0;
        return;
    }
    int changed = !p->has_expect || memcmp(p->expect.b, id->b, sizeof id->b) != 0;
    p->has_expect = 1;
    p->expect = *id;
    /* an open connection to another node serves nobody who now expects this one */
    if (changed && p->state == PEER_OPEN && p->sess &&
        memcmp(p->sess->peer_id.b, id->b, sizeof id->b) != 0)
        ts_conn_close(p->conn);
}

int ts_rpc_accept_via(ts_rpc_t *rpc, const char *addr, const uint8_t *preamble, size_t preamble_len,
                      char *err, size_t errlen) {
    if (!rpc || !addr) {
        ts_set_err(err, errlen, "ts_rpc_accept_via: NULL argument");
        return TS_EINVAL;
    }
    if (rpc->closing) {
        ts_set_err(err, errlen, "the RPC endpoint is shutting down");
        return TS_ECLOSED;
    }
    ts_conn_connect_opts_t o = {.preamble = preamble, .preamble_len = preamble_len, .responder = 1};
    ts_conn_t *c;
    /* served as an accepted connection: its data is the endpoint until conn_open */
    return ts_conn_connect_ex(rpc->net, addr, &o, &ts_rpc__handler, rpc, &c, err, errlen);
}
