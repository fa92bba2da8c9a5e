/*
 * net.c — a node's connection machinery, ts_net_t (net.h): its configuration, address parsing,
 * creation and teardown, and listening: ts_net_listen, the listeners (ts_listener_*) and the
 * accept path, which enforces the connection limits before any handshake work. What happens on
 * a connection once it exists is conn.c's; conn_internal.h holds the structs both share.
 */
#define _POSIX_C_SOURCE 200809L /* uv.h needs POSIX types (pthread_rwlock_t, addrinfo) */

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "net/net.h"

#include "net/conn_internal.h"

/* ---- config --------------------------------------------------------------------------------- */

void ts_net_config_default(ts_net_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->handshake_timeout_ms = 10000;
    cfg->idle_timeout_ms = 120000;
    cfg->keepalive_s = 30;
    cfg->max_frame = TS_FRAME_MAX_DEFAULT;
    cfg->write_high_water = (size_t)4 << 20;
    cfg->max_conns = 1024;
    cfg->max_conns_per_addr = 32;
    cfg->max_partial_bytes = (size_t)1 << 30;
}

int ts_net_parse_addr(const char *addr, char *host, size_t host_len, int *port, int allow_zero,
                      char *err, size_t errlen) {
    if (!addr || !host || !port) {
        ts_set_err(err, errlen, "ts_net_parse_addr: NULL argument");
        return TS_EINVAL;
    }
    const char *colon = strrchr(addr, ':'), *h = addr;
    size_t hl;
    if (!colon || colon == addr) {
        ts_set_err(err, errlen, "'%s' is not an address: want HOST:PORT", addr);
        return TS_EINVAL;
    }
    hl = (size_t)(colon - addr);
    if (addr[0] == '[') { /* [v6]:port */
        if (hl < 3 || addr[hl - 1] != ']') {
            ts_set_err(err, errlen, "'%s' is not an address: want [IPv6]:PORT", addr);
            return TS_EINVAL;
        }
        h = addr + 1;
        hl -= 2;
    } else if (memchr(addr, ':', hl)) {
        ts_set_err(err, errlen, "'%s': put an IPv6 address in brackets, [::1]:PORT", addr);
        return TS_EINVAL;
    }
    if (hl == 0 || hl >= host_len) {
        ts_set_err(err, errlen, "'%s': the host is empty or too long", addr);
        return TS_EINVAL;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || p < (allow_zero ? 0 : 1) || p > 65535) {
        ts_set_err(err, errlen, "'%s': the port must be a number in %d..65535", addr,
                   allow_zero ? 0 : 1);
        return TS_EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return TS_OK;
}

/* ---- the context ---------------------------------------------------------------------------- */

int ts_net_new(ts_net_t **out, uv_loop_t *loop, const ts_identity_t *id, const ts_netkey_t *nk,
               const ts_net_config_t *cfg) {
    if (!out || !loop || !id || !nk)
        return TS_EINVAL;
    *out = NULL;
    ts_net_config_t c;
    if (cfg)
        c = *cfg;
    else
        ts_net_config_default(&c);
    if (c.max_frame < 1 || c.max_frame > TS_FRAME_MAX_LIMIT || c.handshake_timeout_ms == 0 ||
        c.max_conns == 0 || c.max_conns_per_addr == 0 || c.write_high_water == 0)
        return TS_EINVAL;
    if (sodium_init() < 0)
        return TS_EIO;
    ts_net_t *net = calloc(1, sizeof *net);
    if (!net)
        return TS_ENOMEM;
    net->loop = loop;
    net->id = *id;
    net->nk = *nk;
    net->cfg = c;
    ts_list_init(&net->conns);
    ts_list_init(&net->listeners);
    *out = net;
    return TS_OK;
}

uv_loop_t *ts_net_loop(const ts_net_t *net) { return net->loop; }
const ts_node_id_t *ts_net_node_id(const ts_net_t *net) { return &net->id.id; }
const ts_net_config_t *ts_net_config(const ts_net_t *net) { return &net->cfg; }
void ts_net_stats(const ts_net_t *net, ts_net_stats_t *out) { *out = net->st; }

void ts_net_shutdown(ts_net_t *net) {
    if (!net)
        return;
    while (!ts_list_empty(&net->listeners)) /* ts_listener_close unlinks it */
        ts_listener_close(TS_CONTAINER_OF(net->listeners.next, ts_listener_t, node), 0);
    TS_LIST_FOREACH(it, &net->conns) { ts_conn_close(TS_CONTAINER_OF(it, ts_conn_t, node)); }
}

int ts_net_free(ts_net_t *net) {
    if (!net)
        return TS_OK;
    if (!ts_list_empty(&net->conns) || net->st.live || !ts_list_empty(&net->listeners))
        return TS_EBUSY;
    ts_identity_wipe(&net->id);
    ts_netkey_wipe(&net->nk);
    sodium_memzero(net->pbuf, sizeof net->pbuf);
    sodium_memzero(net->rbuf, sizeof net->rbuf);
    free(net);
    return TS_OK;
}

void ts_net_on_handshake_failure(ts_net_t *net, ts_net_handshake_fail_fn fn, void *arg) {
    if (!net)
        return;
    net->hs_fail = fn;
    net->hs_fail_arg = arg;
}

/* ---- accepting connections ------------------------------------------------------------------ */

static void sockaddr_text(const struct sockaddr_storage *ss, char *ip, size_t iplen, char *addr,
                          size_t addrlen) {
    int port = 0;
    ip[0] = '\0';
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        uv_ip4_name(a, ip, iplen);
        port = ntohs(a->sin_port);
        snprintf(addr, addrlen, "%s:%d", ip, port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        uv_ip6_name(a, ip, iplen);
        port = ntohs(a->sin6_port);
        snprintf(addr, addrlen, "[%s]:%d", ip, port);
    } else {
        snprintf(addr, addrlen, "(unknown address)");
    }
}

static void on_connection(uv_stream_t *server, int status);

static void listener_free_if_done(ts_listener_t *l) {
    if (--l->handles == 0)
        free(l);
}

static void spare_closed(uv_handle_t *h) {
    ts_listener_t *l = h->data;
    l->spare_busy = 0;
    int retry = l->stalled && !l->closing;
    l->stalled = 0;
    listener_free_if_done(l);
    if (retry) /* the connection libuv kept for us: serve it now, or drop it */
        on_connection((uv_stream_t *)&l->tcp, 0);
}

/* No memory to serve a connection: accept it into the listener's spare handle and close it, so
 * the peer sees a close instead of hanging. While the spare is closing, libuv keeps the next
 * connection pending (it stops polling the listener until uv_accept), and spare_closed offers
 * it again. */
static void drop_connection(ts_listener_t *l) {
    if (l->spare_busy) {
        l->stalled = 1;
        return;
    }
    uv_tcp_init(l->net->loop, &l->spare);
    l->spare.data = l;
    l->spare_busy = 1;
    l->handles++;
    uv_accept((uv_stream_t *)&l->tcp, (uv_stream_t *)&l->spare);
    uv_close((uv_handle_t *)&l->spare, spare_closed);
}

/* 1 when c's socket has bytes the loop has not read yet (a client whose message 1 arrived in
 * this same loop iteration is not silent). */
static int bytes_waiting(ts_conn_t *c) {
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return 0;
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

static void on_connection(uv_stream_t *server, int status) {
    ts_listener_t *l = server->data;
    ts_net_t *net = l->net;
    if (status < 0 || l->closing)
        return;
    ts_conn_t *c = ts_conn__new(net, &l->h, l->arg);
    if (!c) {
        drop_connection(l);
        return;
    }
    c->accepted = 1;
    c->listener = l;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        c->refused = 1;
        ts_conn__fail(c, TS_CONN_CLOSE_IO, TS_EIO, "accept failed");
        return;
    }
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    memset(&ss, 0, sizeof ss);
    uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl);
    sockaddr_text(&ss, c->ip, sizeof c->ip, c->addr, sizeof c->addr);

    /* The limits, counted over the accepted connections alive now and not closing (this one
     * excluded). At a limit, the oldest half-open connection in its scope (the same address for
     * the per-address limit, any for the total) makes room: a peer without the network key can
     * hold connections only as long as nobody newer comes, so it cannot keep honest clients
     * out. Only when every connection in the scope has completed its handshake is the new one
     * refused. */
    uint32_t same = 0, all = 0;
    TS_LIST_FOREACH(it, &net->conns) {
        ts_conn_t *o = TS_CONTAINER_OF(it, ts_conn_t, node);
        if (o == c || !o->accepted || o->refused || o->state == ST_CLOSING)
            continue;
        all++;
        same += strcmp(o->ip, c->ip) == 0;
    }
    int over_addr = same >= net->cfg.max_conns_per_addr, over_all = all >= net->cfg.max_conns;
    if (over_addr || over_all) {
        /* in the limit's scope, oldest first: the first silent one (not a byte received, none
         * waiting in its socket: an honest client sends message 1 as soon as it is connected),
         * else the oldest still in its handshake */
        ts_conn_t *victim = NULL, *spoke = NULL;
        TS_LIST_FOREACH(it, &net->conns) {
            ts_conn_t *o = TS_CONTAINER_OF(it, ts_conn_t, node);
            if (o == c || !o->accepted || o->refused || o->state == ST_CLOSING ||
                o->state == ST_OPEN || (over_addr && strcmp(o->ip, c->ip) != 0))
                continue;
            if (o->bytes_in == 0 && !bytes_waiting(o)) {
                victim = o;
                break;
            }
            if (!spoke)
                spoke = o;
        }
        if (!victim)
            victim = spoke;
        if (!victim) {
            c->refused = 1;
            net->st.refused_limit++;
            ts_conn__fail(c, TS_CONN_CLOSE_LOCAL, TS_EBUSY, "connection limit");
            return;
        }
        net->st.evicted++;
        ts_conn__fail(victim, TS_CONN_CLOSE_EVICTED, TS_EBUSY,
                      "a half-open connection from %s was closed to admit a newer one (%s limit)",
                      victim->addr, over_addr ? "per-address" : "connection");
    }
    net->st.accepted++;
    net->st.live_accepted++;
    uv_timer_start(&c->timer, ts_conn__handshake_timeout_cb, net->cfg.handshake_timeout_ms, 0);
    ts_conn__start(c);
}

/* ---- listening ------------------------------------------------------------------------------ */

static void listener_closed(uv_handle_t *h) { listener_free_if_done(h->data); }

int ts_net_listen(ts_net_t *net, const char *addr, const ts_conn_handler_t *h, void *arg,
                  ts_listener_t **out, char *err, size_t errlen) {
    if (!net || !addr || !out) {
        ts_set_err(err, errlen, "ts_net_listen: NULL argument");
        return TS_EINVAL;
    }
    *out = NULL;
    char host[256];
    int port, rc = ts_net_parse_addr(addr, host, sizeof host, &port, 1, err, errlen);
    if (rc)
        return rc;
    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0) {
        ts_set_err(err, errlen, "cannot listen on '%s': the host must be a numeric address", addr);
        return TS_EINVAL;
    }
    ts_listener_t *l = calloc(1, sizeof *l);
    if (!l)
        return TS_ENOMEM;
    l->net = net;
    if (h)
        l->h = *h;
    l->arg = arg;
    uv_tcp_init(net->loop, &l->tcp);
    l->tcp.data = l;
    l->handles = 1;
    ts_list_push(&net->listeners, &l->node);
    if ((rc = uv_tcp_bind(&l->tcp, (struct sockaddr *)&ss, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&l->tcp, 128, on_connection)) != 0) {
        ts_set_err(err, errlen, "cannot listen on %s: %s", addr, uv_strerror(rc));
        ts_listener_close(l, 0);
        return TS_EIO;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    memset(&bound, 0, sizeof bound);
    uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&bound, &bl);
    l->port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                          : ntohs(((struct sockaddr_in *)&bound)->sin_port);
    *out = l;
    return TS_OK;
}

int ts_listener_port(const ts_listener_t *l) { return l ? l->port : 0; }

void ts_listener_close(ts_listener_t *l, int close_conns) {
    if (!l)
        return;
    ts_net_t *net = l->net;
    l->closing = 1;
    ts_list_remove(&l->node);
    TS_LIST_FOREACH(it, &net->conns) {
        ts_conn_t *c = TS_CONTAINER_OF(it, ts_conn_t, node);
        if (c->listener == l) {
            c->listener = NULL;
            if (close_conns)
                ts_conn_close(c);
        }
    }
    uv_close((uv_handle_t *)&l->tcp, listener_closed);
}
