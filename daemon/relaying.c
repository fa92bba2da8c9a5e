/* relaying.c — tesserad's relays: serving, and being carried (relaying.h). */
#define _POSIX_C_SOURCE 200809L

#include "daemon/relaying.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "net/relay.h"

#define TICK_MS 5000          /* how often the carried side looks at its state */
#define RESERVE_WAIT_MS 15000 /* a reservation not live by then: the next candidate */
#define TRIES_PER_TICK 64     /* members asked at most per tick (most answer at once) */

struct ts_relaying {
    uv_loop_t *loop;
    const ts_daemon_config_t *cfg;
    ts_rpc_t *rpc;
    ts_gossip_t *gossip;
    uint8_t self[32];
    ts_relay_t *relay;         /* serving: NULL unless [relay] serve */
    ts_relay_client_t *client; /* being carried */
    uv_timer_t tick;
    int tick_open, closing;
    int leaving;             /* the node is leaving: a lost reservation is not replaced */
    int reachable;           /* the last check: 1, 0, −1 */
    int relayed;             /* our claims carry a relay's address */
    uint64_t asked_at;       /* when the reservation in progress was asked (loop ms) */
    uint32_t next_candidate; /* rotates through the live members */
    uint32_t tries;          /* candidates asked since the last tick */
    char asked[TS_CONFIG_ADDR_MAX];
};

/* Back to the node's own address in its claims. */
static void unrelay(ts_relaying_t *r) {
    char err[512] = "";
    if (!r->relayed)
        return;
    r->relayed = 0;
    if (ts_gossip_set_relay(r->gossip, NULL, NULL, err, sizeof err) != TS_OK && !r->leaving)
        ts_log_error("relay", "cannot go back to the node's own address: %s", err);
}

static void ask_next(ts_relaying_t *r);

static void on_state(void *arg, const char *addr, const ts_node_id_t *relay, const char *message) {
    ts_relaying_t *r = arg;
    char err[512] = "";
    if (addr) {
        char id[TS_NODE_ID_HEX];
        ts_node_id_hex(relay, TS_NODE_ID_SHORT, id);
        ts_log_info("relay",
                    "reached through relay %s (%s) at %s: other nodes and clients dial that "
                    "address, end-to-end encrypted",
                    id, r->asked, addr);
        if (ts_gossip_set_relay(r->gossip, addr, relay, err, sizeof err) != TS_OK)
            ts_log_error("relay", "cannot advertise the relayed address %s: %s", addr, err);
        else
            r->relayed = 1;
        return;
    }
    unrelay(r);
    if (r->leaving) { /* the relay may be leaving too: the end of a reservation is expected */
        ts_log_debug("relay", "no relay at %s while leaving: %s", r->asked, message);
        return;
    }
    /* a member that does not serve relays says so at once: ask the next one now, each live
     * member at most once per tick */
    int quick = uv_now(r->loop) - r->asked_at < 2000 && !r->cfg->relay_via[0] && !r->closing;
    if (quick && r->tries < TRIES_PER_TICK) {
        ts_log_debug("relay", "no relay at %s: %s", r->asked, message);
        ask_next(r);
    } else {
        ts_log_warn("relay", "no relay at %s: %s", r->asked, message);
    }
}

static void on_datagram(void *arg, const struct sockaddr *from, const uint8_t *data, size_t len) {
    ts_relaying_t *r = arg;
    ts_gossip_receive_datagram(r->gossip, from, data, len);
}

static int wants_relay(const ts_relaying_t *r) {
    return r->cfg->relay_via[0] || (r->cfg->relay_use && r->reachable == 0);
}

/* Asks the next candidate: the configured relay, else the next live member. */
static void ask_next(ts_relaying_t *r) {
    char err[512] = "";
    if (r->cfg->relay_via[0]) {
        snprintf(r->asked, sizeof r->asked, "%s", r->cfg->relay_via);
        if (ts_relay_client_reserve(r->client, r->asked, NULL, err, sizeof err) != TS_OK)
            ts_log_warn("relay", "cannot ask %s: %s", r->asked, err);
        r->asked_at = uv_now(r->loop);
        return;
    }
    Tessera__StatusResponse *st = NULL;
    if (ts_gossip_status(r->gossip, NULL, &st) != TS_OK)
        return;
    size_t n = st->n_members;
    for (size_t k = 0; k < n; k++) {
        const Tessera__MemberState *m = st->members[(r->next_candidate + k) % n];
        if (m->status != TESSERA__MEMBER_STATUS__MEMBER_ALIVE || !m->addr || m->node_id.len != 32 ||
            memcmp(m->node_id.data, r->self, 32) == 0)
            continue;
        r->next_candidate = (uint32_t)((r->next_candidate + k + 1) % n);
        r->tries++;
        ts_node_id_t id;
        memcpy(id.b, m->node_id.data, sizeof id.b);
        snprintf(r->asked, sizeof r->asked, "%s", m->addr);
        if (ts_relay_client_reserve(r->client, r->asked, &id, err, sizeof err) == TS_OK) {
            ts_log_info("relay", "asking %s for a relayed address", r->asked);
            r->asked_at = uv_now(r->loop);
            break;
        }
    }
    ts_gossip_status_free(st);
}

static void on_tick(uv_timer_t *t) {
    ts_relaying_t *r = t->data;
    if (r->closing || r->leaving)
        return;
    int busy = ts_relay_client_busy(r->client), live = ts_relay_client_live(r->client);
    if (!wants_relay(r)) {
        if (busy) {
            ts_log_info("relay", "reachable at the node's own address again: releasing %s",
                        ts_relay_client_relay(r->client));
            ts_relay_client_stop(r->client);
            unrelay(r);
        }
        return;
    }
    if (busy && !live && uv_now(r->loop) - r->asked_at > RESERVE_WAIT_MS) {
        ts_log_warn("relay", "%s did not grant an address within %d s: trying another", r->asked,
                    RESERVE_WAIT_MS / 1000);
        ts_relay_client_stop(r->client);
        busy = 0;
    }
    r->tries = 0;
    if (!busy)
        ask_next(r);
}

/* host of "host:port" (brackets of IPv6 removed) */
static int host_of(const char *addr, char *host, size_t len, char *err, size_t errlen) {
    int port;
    return ts_net_parse_addr(addr, host, len, &port, 1, err, errlen);
}

int ts_relaying_start(ts_relaying_t **out, uv_loop_t *loop, const ts_daemon_config_t *cfg,
                      ts_rpc_t *rpc, ts_gossip_t *gossip, const char *listen, const char *advertise,
                      const uint8_t self_id[32], char *err, size_t errlen) {
    ts_relaying_t *r = calloc(1, sizeof *r);
    if (!r)
        return TS_ENOMEM;
    r->loop = loop;
    r->cfg = cfg;
    r->rpc = rpc;
    r->gossip = gossip;
    r->reachable = -1;
    memcpy(r->self, self_id, 32);
    int rc = TS_OK;
    if (cfg->relay_serve) {
        char pub[256], bind[256];
        ts_relay_config_t rc_cfg;
        ts_relay_config_default(&rc_cfg);
        rc_cfg.max_reservations = (uint32_t)cfg->relay_max_nodes;
        rc_cfg.max_circuits = (uint32_t)cfg->relay_max_circuits;
        rc_cfg.bytes_per_s = (uint64_t)cfg->relay_bandwidth_mib_s << 20;
        if ((rc = host_of(advertise, pub, sizeof pub, err, errlen)) == TS_OK &&
            (rc = host_of(listen, bind, sizeof bind, err, errlen)) == TS_OK) {
            rc_cfg.public_host = pub;
            rc_cfg.bind_host = bind;
            rc = ts_relay_serve(rpc, &rc_cfg, &r->relay, err, errlen);
        }
        if (rc == TS_OK)
            ts_log_info("relay",
                        "serving as a relay: up to %d nodes, %d connections and %d MiB/s each, "
                        "on ports of %s",
                        cfg->relay_max_nodes, cfg->relay_max_circuits, cfg->relay_bandwidth_mib_s,
                        pub);
    }
    if (rc == TS_OK && (cfg->relay_use || cfg->relay_via[0])) {
        ts_relay_client_cbs_t cbs = {.on_state = on_state, .on_datagram = on_datagram, .arg = r};
        rc = ts_relay_client_new(rpc, &cbs, &r->client);
    }
    if (rc == TS_OK && r->client) {
        uv_timer_init(loop, &r->tick);
        r->tick.data = r;
        r->tick_open = 1;
        /* the configured relay at once; otherwise when the reachability check has answered */
        uv_timer_start(&r->tick, on_tick, cfg->relay_via[0] ? 0 : TICK_MS, TICK_MS);
    }
    if (rc != TS_OK) {
        ts_relay_client_free(r->client);
        if (r->relay) {
            ts_relay_close(r->relay);
            ts_relay_free(r->relay); /* nothing was reserved: nothing is closing */
        }
        free(r);
        return rc;
    }
    *out = r;
    return TS_OK;
}

void ts_relaying_reachable(ts_relaying_t *r, int reachable) {
    if (!r)
        return;
    int was = r->reachable;
    r->reachable = reachable;
    if (r->tick_open && reachable == 0 && was != 0 && r->cfg->relay_use && !r->closing) {
        ts_log_info("relay", "this node cannot be dialled: looking for a relay to carry it");
        uv_timer_start(&r->tick, on_tick, 0, TICK_MS);
    }
}

void ts_relaying_metrics(ts_relaying_t *r, ts_metrics_t *m) {
    if (!r)
        return;
    ts_metrics_gauge_set(m, TS_M_RELAYED, NULL, ts_relay_client_live(r->client) ? 1 : 0);
    ts_relay_stats_t s = {0};
    if (r->relay)
        ts_relay_stats(r->relay, &s);
    ts_metrics_gauge_set(m, TS_M_RELAY_NODES, NULL, s.reservations);
    ts_metrics_gauge_set(m, TS_M_RELAY_CIRCUITS, NULL, s.circuits);
    ts_metrics_counter_set(m, TS_M_RELAY_CIRCUITS_TOTAL, "spliced", s.circuits_total);
    ts_metrics_counter_set(m, TS_M_RELAY_CIRCUITS_TOTAL, "failed", s.circuits_failed);
    ts_metrics_counter_set(m, TS_M_RELAY_BYTES, NULL, s.bytes);
    ts_metrics_counter_set(m, TS_M_RELAY_DATAGRAMS, "forwarded", s.datagrams);
    ts_metrics_counter_set(m, TS_M_RELAY_DATAGRAMS, "dropped", s.datagrams_dropped);
}

void ts_relaying_leaving(ts_relaying_t *r) {
    if (r)
        r->leaving = 1;
}

void ts_relaying_close(ts_relaying_t *r) {
    if (!r || r->closing)
        return;
    r->closing = 1;
    ts_relay_client_stop(r->client);
    ts_relay_close(r->relay);
    if (r->tick_open)
        uv_close((uv_handle_t *)&r->tick, NULL);
}

void ts_relaying_free(ts_relaying_t *r) {
    if (!r)
        return;
    ts_relay_client_free(r->client);
    if (ts_relay_free(r->relay) != TS_OK)
        ts_log_error("relay", "the relay's sockets were still closing at exit");
    free(r);
}
