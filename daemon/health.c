/*
 * health.c — is this node part of a network, and if not, why (health.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/health.h"

#include <stdio.h>
#include <string.h>

void ts_health_init(ts_health_t *h, double now, double join_timeout_s, const char *advertise) {
    memset(h, 0, sizeof *h);
    h->started = now;
    h->join_timeout_s = join_timeout_s;
    h->advertise = advertise ? advertise : "?";
    h->last_rejoin = now;
    h->window_start = now;
    snprintf(h->reason, sizeof h->reason, "ok");
}

void ts_health_explain(const char *addr, int accepted, const ts_conn_close_info_t *why, char *out,
                       size_t len) {
    const char *m = why->message ? why->message : "";
    if (accepted) {
        switch (why->reason) {
        case TS_CONN_CLOSE_HANDSHAKE:
            snprintf(out, len,
                     "refused a handshake from %s: its last message did not decrypt — it holds "
                     "another network key, or is not a tessera node",
                     addr);
            return;
        case TS_CONN_CLOSE_IDENTITY:
            snprintf(out, len, "refused a handshake from %s: its identity does not verify", addr);
            return;
        case TS_CONN_CLOSE_HANDSHAKE_TIMEOUT:
            snprintf(out, len,
                     "%s connected but did not finish a handshake in time (a scanner, a "
                     "half-open connection, or a very slow link)",
                     addr);
            return;
        case TS_CONN_CLOSE_EVICTED:
            snprintf(out, len,
                     "closed a half-open connection from %s to admit a newer one: the connection "
                     "limit was reached (many half-open connections: a scanner or a flood?)",
                     addr);
            return;
        default:
            snprintf(out, len, "a handshake from %s failed (%s): %s", addr,
                     ts_conn_close_reason_name(why->reason), m);
            return;
        }
    }
    if (why->was_open) { /* closed before a single frame: it checked the key in message 3 */
        snprintf(out, len,
                 "%s closed the connection right after the handshake, before any answer: this "
                 "node likely holds another network key than it",
                 addr);
        return;
    }
    switch (why->reason) {
    case TS_CONN_CLOSE_EOF:
        snprintf(out, len,
                 "%s closed the connection during the handshake: this node likely holds another "
                 "network key than it",
                 addr);
        return;
    case TS_CONN_CLOSE_IO:
        snprintf(out, len, "%s: is that node up, and the address right?", m);
        return;
    case TS_CONN_CLOSE_HANDSHAKE_TIMEOUT:
        snprintf(out, len,
                 "no handshake with %s in time: the address does not answer (down, filtered by "
                 "a firewall, or another host)",
                 addr);
        return;
    case TS_CONN_CLOSE_HANDSHAKE:
        snprintf(out, len,
                 "the handshake with %s failed: its messages do not decrypt — not a tessera "
                 "node, or another protocol version",
                 addr);
        return;
    case TS_CONN_CLOSE_IDENTITY:
        snprintf(out, len, "%s sent an identity that does not verify", addr);
        return;
    default:
        snprintf(out, len, "the handshake with %s failed (%s): %s", addr,
                 ts_conn_close_reason_name(why->reason), m);
        return;
    }
}

/* Whether an outgoing failure points at the network key rather than at reachability. */
static int key_like(const ts_conn_close_info_t *why) {
    return why->was_open || why->reason == TS_CONN_CLOSE_EOF ||
           why->reason == TS_CONN_CLOSE_HANDSHAKE || why->reason == TS_CONN_CLOSE_IDENTITY;
}

/* The per-address (IP, not port: a peer retries from new ports) and per-window limits: 1 when
 * addr may be logged now (and it is recorded). */
static int may_log(ts_health_t *h, double now, const char *addr_port) {
    char addr[64];
    snprintf(addr, sizeof addr, "%s", addr_port);
    char *colon = strrchr(addr, ':');
    if (colon && colon != addr)
        *colon = 0;
    if (now - h->window_start >= TS_HEALTH_LOG_WINDOW_S) {
        h->window_start = now;
        h->logged = 0;
    }
    int oldest = 0;
    for (int i = 0; i < TS_HEALTH_RECENT; i++) {
        if (strcmp(h->recent[i].addr, addr) == 0) {
            if (now - h->recent[i].at < TS_HEALTH_LOG_WINDOW_S)
                return 0;
            oldest = i;
            break;
        }
        if (h->recent[i].at < h->recent[oldest].at)
            oldest = i;
    }
    if (h->logged >= TS_HEALTH_LOG_MAX)
        return 0;
    snprintf(h->recent[oldest].addr, sizeof h->recent[oldest].addr, "%s", addr);
    h->recent[oldest].at = now;
    h->logged++;
    return 1;
}

int ts_health_handshake_failed(ts_health_t *h, double now, const char *addr, int accepted,
                               const ts_conn_close_info_t *why, char *line, size_t len,
                               ts_health_level_t *level) {
    char text[384];
    ts_health_explain(addr, accepted, why, text, sizeof text);
    if (!accepted) {
        snprintf(h->last_out, sizeof h->last_out, "%s", text);
        h->out_refusals = key_like(why) ? h->out_refusals + 1 : 0;
    }
    /* a handshake that timed out on an accepted connection is routine noise: INFO */
    *level = accepted && (why->reason == TS_CONN_CLOSE_HANDSHAKE_TIMEOUT ||
                          why->reason == TS_CONN_CLOSE_EVICTED)
                 ? TS_HEALTH_INFO
                 : TS_HEALTH_WARN;
    if (!may_log(h, now, addr)) {
        h->suppressed++;
        return 0;
    }
    snprintf(line, len, "%s", text);
    return 1;
}

int ts_health_tick(ts_health_t *h, double now, uint64_t opened, uint32_t peers, uint32_t seeds,
                   char *line, size_t len, ts_health_level_t *level, int *rejoin) {
    *rejoin = 0;
    if (opened > h->opened) { /* a handshake completed since: not refused */
        h->opened = opened;
        h->out_refusals = 0;
    }
    ts_health_state_t s = TS_HEALTH_OK;
    char reason[sizeof h->reason];
    snprintf(reason, sizeof reason, "ok");
    if (seeds > 0 && peers == 0 && now - h->started >= h->join_timeout_s) {
        s = TS_HEALTH_ALONE;
        if (h->last_out[0])
            snprintf(reason, sizeof reason, "alone: no peer after %.0f s; the last attempt: %s",
                     now - h->started, h->last_out);
        else
            snprintf(reason, sizeof reason,
                     "alone: no peer after %.0f s; the %u bootstrap address%s did not answer "
                     "(down, or another network key), or they cannot reach this node at %s",
                     now - h->started, seeds, seeds == 1 ? "" : "es", h->advertise);
        if (now - h->last_rejoin >= h->join_timeout_s) {
            h->last_rejoin = now;
            *rejoin = 1;
        }
    } else if (h->out_refusals >= TS_HEALTH_REFUSED_AFTER) {
        s = TS_HEALTH_REFUSED;
        snprintf(reason, sizeof reason, "handshakes refused (%u in a row): %s", h->out_refusals,
                 h->last_out);
    }
    int changed = s != h->state;
    ts_health_state_t was = h->state;
    h->state = s;
    snprintf(h->reason, sizeof h->reason, "%s", reason);
    if (changed) {
        *level = s == TS_HEALTH_OK ? TS_HEALTH_INFO : TS_HEALTH_WARN;
        if (s == TS_HEALTH_OK)
            snprintf(line, len, "healthy again (%s before): %u peer%s alive",
                     was == TS_HEALTH_ALONE ? "alone" : "refused", peers, peers == 1 ? "" : "s");
        else
            snprintf(line, len, "%s", h->reason);
        return 1;
    }
    if (h->suppressed && now - h->window_start >= TS_HEALTH_LOG_WINDOW_S) {
        *level = TS_HEALTH_INFO;
        snprintf(line, len, "%u more failed handshakes in the last %.0f s were not logged",
                 h->suppressed, TS_HEALTH_LOG_WINDOW_S);
        h->suppressed = 0;
        h->window_start = now;
        h->logged = 0;
        return 1;
    }
    return 0;
}
