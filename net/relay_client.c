/* relay_client.c — the carried node's side of a relay: the reservation, connect-backs and the
 * datagrams forwarded to it (relay.h). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/relay.h"

/* The reservation is asked with this deadline and asked again when it passes. */
#define RESERVE_DEADLINE_MS (24u * 3600u * 1000u)

struct ts_relay_client {
    ts_rpc_t *rpc;
    ts_relay_client_cbs_t cbs;
    ts_rpc_peer_t *peer;
    ts_rpc_call_t *call;               /* the reservation, while asked for or live */
    char relay[TS_FRAME_ADDR_MAX + 1]; /* the relay as we dial it */
    char back[TS_FRAME_ADDR_MAX + 1];  /* where connect-backs go: its host, the reserved port */
    char addr[TS_FRAME_ADDR_MAX + 1];  /* the reserved address, as others dial it */
    int live, stopping;
    ts_relay_client_stats_t st;
};

static void on_ended(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    ts_relay_client_t *c = arg;
    c->call = NULL;
    c->live = 0;
    c->addr[0] = c->back[0] = '\0';
    if (c->stopping)
        return;
    char why[600];
    if (res->status == TS_OK && res->reply->relay_ended->message)
        snprintf(why, sizeof why, "the relay ended it: %s", res->reply->relay_ended->message);
    else if (res->status == TS_OK)
        snprintf(why, sizeof why, "the relay ended it");
    else
        snprintf(why, sizeof why, "%s (%s)", res->message, ts_strerror(res->status));
    if (c->cbs.on_state)
        c->cbs.on_state(c->cbs.arg, NULL, NULL, why);
}

/* The relay we reserved with, as its handshake proved it; 0 when there is none. */
static int relay_id(const ts_relay_client_t *c, ts_node_id_t *out) {
    if (!c->call || !c->peer)
        return 0;
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(c->peer, &info);
    if (!info.open || !info.has_node_id)
        return 0;
    *out = info.node_id;
    return 1;
}

static void on_event(ts_conn_t *conn, const ts_node_id_t *from, const Tessera__Envelope *env,
                     void *arg) {
    (void)conn;
    ts_relay_client_t *c = arg;
    const Tessera__RelayEvent *ev = env->relay_event;
    ts_node_id_t rid;
    if (!relay_id(c, &rid) || memcmp(rid.b, from->b, sizeof rid.b) != 0) {
        c->st.events_ignored++;
        return;
    }
    char host[256], err[256];
    int port;
    if (ev->addr) {
        if (ts_net_parse_addr(ev->addr, host, sizeof host, &port, 0, err, sizeof err) != TS_OK)
            return; /* checked by the frame layer; cannot happen */
        char rhost[256];
        int rport;
        if (ts_net_parse_addr(c->relay, rhost, sizeof rhost, &rport, 0, err, sizeof err) != TS_OK)
            return;
        snprintf(c->back, sizeof c->back, strchr(rhost, ':') ? "[%s]:%d" : "%s:%d", rhost, port);
        snprintf(c->addr, sizeof c->addr, "%s", ev->addr);
        c->live = 1;
        if (c->cbs.on_state)
            c->cbs.on_state(c->cbs.arg, c->addr, &rid, "reserved");
    } else if (ev->has_circuit) {
        if (!c->live) {
            c->st.events_ignored++;
            return;
        }
        uint8_t pre[TS_RELAY_PREAMBLE];
        memcpy(pre, TS_RELAY_MAGIC, 4);
        memcpy(pre + 4, ev->circuit.data, TS_FRAME_CIRCUIT_BYTES);
        if (ts_rpc_accept_via(c->rpc, c->back, pre, sizeof pre, err, sizeof err) == TS_OK)
            c->st.circuits++;
        else
            c->st.circuits_failed++;
    } else if (ev->has_datagram) {
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof ss);
        if (ts_net_parse_addr(ev->from, host, sizeof host, &port, 0, err, sizeof err) != TS_OK ||
            (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
             uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)) {
            c->st.events_ignored++;
            return;
        }
        c->st.datagrams++;
        if (c->cbs.on_datagram)
            c->cbs.on_datagram(c->cbs.arg, (const struct sockaddr *)&ss, ev->datagram.data,
                               ev->datagram.len);
    }
}

int ts_relay_client_new(ts_rpc_t *rpc, const ts_relay_client_cbs_t *cbs, ts_relay_client_t **out) {
    if (!rpc || !out)
        return TS_EINVAL;
    ts_relay_client_t *c = calloc(1, sizeof *c);
    if (!c)
        return TS_ENOMEM;
    c->rpc = rpc;
    if (cbs)
        c->cbs = *cbs;
    ts_rpc_handle_oneway(rpc, TESSERA__ENVELOPE__BODY_RELAY_EVENT, on_event, c);
    *out = c;
    return TS_OK;
}

void ts_relay_client_stop(ts_relay_client_t *c) {
    if (!c || !c->call)
        return;
    c->stopping = 1;
    ts_rpc_cancel(c->call); /* on_ended runs now, quietly */
    c->stopping = 0;
}

int ts_relay_client_reserve(ts_relay_client_t *c, const char *addr, const ts_node_id_t *relay_id,
                            char *err, size_t errlen) {
    if (!c || !addr) {
        ts_set_err(err, errlen, "ts_relay_client_reserve: NULL argument");
        return TS_EINVAL;
    }
    ts_relay_client_stop(c);
    ts_rpc_peer_t *p;
    int rc = ts_rpc_peer_get(c->rpc, addr, &p, err, errlen);
    if (rc)
        return rc;
    if (relay_id)
        ts_rpc_peer_expect(p, relay_id);
    Tessera__RelayReserve rr = TESSERA__RELAY_RESERVE__INIT;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_RELAY_RESERVE;
    env.relay_reserve = &rr;
    rc = ts_rpc_call(p, &env, RESERVE_DEADLINE_MS, on_ended, c, &c->call, err, errlen);
    if (rc)
        return rc;
    c->peer = p;
    snprintf(c->relay, sizeof c->relay, "%s", addr);
    return TS_OK;
}

int ts_relay_client_live(const ts_relay_client_t *c) { return c && c->live; }
int ts_relay_client_busy(const ts_relay_client_t *c) { return c && c->call; }
const char *ts_relay_client_relay(const ts_relay_client_t *c) {
    return c && c->call ? c->relay : "";
}
void ts_relay_client_stats(const ts_relay_client_t *c, ts_relay_client_stats_t *st) { *st = c->st; }

void ts_relay_client_free(ts_relay_client_t *c) {
    if (!c)
        return;
    ts_relay_client_stop(c);
    ts_rpc_handle_oneway(c->rpc, TESSERA__ENVELOPE__BODY_RELAY_EVENT, NULL, NULL);
    free(c);
}
