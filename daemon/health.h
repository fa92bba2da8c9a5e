/*
 * health.h — whether this node is part of a network, and when not, why: the state behind
 * /healthz, the `health` of status answers, and the warnings that name the likely cause.
 *
 * A pure state machine on the caller's clock (seconds), fed from the loop:
 *   - every handshake that failed (net/net.h's observer): the peer's address, which side we
 *     were, the close reason. Each gets a sentence with its likely cause; the lines to log are
 *     rate-limited (an address at most once per TS_HEALTH_LOG_WINDOW_S, at most
 *     TS_HEALTH_LOG_MAX lines in a window, the rest counted and reported once);
 *   - once a second: the handshakes completed so far, the peers alive (not counting ourselves),
 *     the seeds a join goes to.
 * States:
 *   ok        a peer is alive, or this node has no seeds (it started a network of its own);
 *   alone     seeds, no peer alive, join_timeout_s after start: "alone: …" with the last
 *             outgoing handshake failure (an unreachable bootstrap, another network key) or,
 *             with none, that the seeds do not answer or cannot reach this node;
 *   refused   TS_HEALTH_REFUSED_AFTER outgoing handshakes in a row failed in a way that points
 *             at the key (the peer closed mid-handshake, a message that does not decrypt, an
 *             identity that does not verify) with none completed since: "handshakes refused: …".
 * A change of state is one log line (WARN into alone/refused, INFO back to ok).
 */
#ifndef TS_DAEMON_HEALTH_H
#define TS_DAEMON_HEALTH_H

#include <stddef.h>
#include <stdint.h>

#include "net/conn.h"

#define TS_HEALTH_LOG_WINDOW_S 60.0
#define TS_HEALTH_LOG_MAX 10
#define TS_HEALTH_REFUSED_AFTER 2
#define TS_HEALTH_RECENT 16 /* addresses remembered for the per-address limit */

typedef enum { TS_HEALTH_OK = 0, TS_HEALTH_ALONE, TS_HEALTH_REFUSED } ts_health_state_t;

typedef enum { TS_HEALTH_INFO = 0, TS_HEALTH_WARN } ts_health_level_t;

typedef struct ts_health {
    double started, join_timeout_s;
    const char *advertise; /* ours, for the alone sentence (borrowed) */
    ts_health_state_t state;
    char reason[512]; /* "ok", or the sentence */
    /* outgoing handshakes */
    uint32_t out_refusals; /* key-like failures in a row, none completed since */
    char last_out[384];    /* the last outgoing failure's sentence ("" none) */
    uint64_t opened;       /* handshakes completed, at the last tick */
    double last_rejoin;
    /* the log's rate limit */
    struct {
        char addr[64];
        double at;
    } recent[TS_HEALTH_RECENT];
    double window_start;
    uint32_t logged, suppressed;
} ts_health_t;

void ts_health_init(ts_health_t *h, double now, double join_timeout_s, const char *advertise);

/* The likely cause of one failed handshake, as a sentence naming addr. */
void ts_health_explain(const char *addr, int accepted, const ts_conn_close_info_t *why, char *out,
                       size_t len);

/* A failed handshake. Returns 1 with the line to log in line (and its level) when it is to be
 * logged, 0 when the rate limit keeps it out (it is counted). */
int ts_health_handshake_failed(ts_health_t *h, double now, const char *addr, int accepted,
                               const ts_conn_close_info_t *why, char *line, size_t len,
                               ts_health_level_t *level);

/* Once a second. opened: handshakes completed so far (ts_net_stats_t.opened); peers: members
 * alive but us; seeds: ts_gossip_n_seeds. Returns 1 with a line to log when the state changed
 * or suppressed handshake lines are to be reported; *rejoin is set when an alone node should
 * join again (every join_timeout_s). */
int ts_health_tick(ts_health_t *h, double now, uint64_t opened, uint32_t peers, uint32_t seeds,
                   char *line, size_t len, ts_health_level_t *level, int *rejoin);

#endif
