/*
 * net.h — a node's connection machinery on one uv_loop (ts_net_t): its identity and network key,
 * its limits, its listeners and every live connection, with counters over its life. What happens
 * on one connection — the Noise handshake, the frames, its callbacks — is net/conn.h's; this
 * header holds what all connections of a node share: the configuration, why a connection closed,
 * the handler its owner gives, the counters, creation and teardown, and listening (architecture.md
 * §4–§5). Everything runs on the loop's thread. Like uv.h, this header needs POSIX declarations:
 * define _POSIX_C_SOURCE 200809L before the first include of a file that includes it.
 *
 * Limits and timers (ts_net_config_t):
 *   - handshake_timeout_ms from the start of a connection (TCP connect included) to OPEN;
 *   - idle_timeout_ms: an OPEN connection with no frame received or sent for that long, and
 *     nothing pending (ts_conn_set_pending), is closed;
 *   - TCP keepalive (keepalive_s) finds dead peers of long-lived connections; there is no
 *     application-level ping at this layer;
 *   - write_high_water: when more bytes than this wait in a connection's write queue, the
 *     connection stops reading from the peer (so a peer that sends requests and never reads the
 *     answers cannot grow our memory) and ts_conn_congested() says so; reading resumes, and
 *     on_drain is called, once the queue is back under half the mark;
 *   - max_conns and max_conns_per_addr bound the accepted connections in total and per remote
 *     IP address; an extra one is closed at once, before any handshake work, and is never the
 *     owner's: see "Refused connections" below.
 *
 * Refused connections. An accepted socket over max_conns or max_conns_per_addr is closed by the
 * library on the spot and reaches no callback at all — no on_open, no on_close — so the owner
 * never learns of it except through ts_net_stats_t.refused_limit, which counts it. It is not
 * counted in accepted, live_accepted or closed[] either (only in live, until its handles have
 * closed). The same holds, without any counter, for an accepted socket whose uv_accept fails
 * or for which no memory could be had.
 */
#ifndef TS_NET_H
#define TS_NET_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "net/keys.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_net ts_net_t;
typedef struct ts_conn ts_conn_t;
typedef struct ts_listener ts_listener_t;

typedef struct ts_net_config {
    uint32_t handshake_timeout_ms; /* default 10000 */
    uint32_t idle_timeout_ms;      /* default 120000; 0: never */
    uint32_t keepalive_s;          /* TCP keepalive delay, default 30; 0: off */
    uint32_t max_frame;            /* default TS_FRAME_MAX_DEFAULT (64 MiB) */
    size_t write_high_water;       /* bytes queued before reading stops; default 4 MiB */
    uint32_t max_conns;            /* accepted connections at once, default 1024 */
    uint32_t max_conns_per_addr;   /* of them from one IP address, default 32 */
    size_t max_partial_bytes;      /* buffer memory of partly received frames, all connections
                                    * together; default 1 GiB; 0: no limit */
    int so_sndbuf;                 /* SO_SNDBUF of each connection; 0: the kernel's default */
} ts_net_config_t;

/* The defaults above. */
void ts_net_config_default(ts_net_config_t *cfg);

/* Why a connection closed (ts_net_stats_t.closed is indexed by this). */
typedef enum {
    TS_CONN_CLOSE_LOCAL,             /* the owner closed it (ts_conn_close, shutdown) */
    TS_CONN_CLOSE_EOF,               /* the peer closed it */
    TS_CONN_CLOSE_IO,                /* a socket error (reset, connect refused, unreachable) */
    TS_CONN_CLOSE_HANDSHAKE_TIMEOUT, /* not OPEN within handshake_timeout_ms */
    TS_CONN_CLOSE_IDLE_TIMEOUT,      /* nothing sent or received for idle_timeout_ms */
    TS_CONN_CLOSE_HANDSHAKE,         /* a handshake message of a wrong size or failing to decrypt */
    TS_CONN_CLOSE_IDENTITY,          /* the peer's identity payload did not verify */
    TS_CONN_CLOSE_DECRYPT,  /* a transport message failed (tampered, replayed, reordered) */
    TS_CONN_CLOSE_FRAMING,  /* a zero Noise length, an app length of 0 or over max_frame */
    TS_CONN_CLOSE_PROTOCOL, /* the owner found a protocol violation in a frame */
    TS_CONN_CLOSE_NOMEM,    /* we ran out of memory */
    TS_CONN_CLOSE_EVICTED,  /* a half-open accepted connection, closed to admit a newer one */
    TS_CONN_CLOSE_BUDGET,   /* its partial frame would take max_partial_bytes over */
    TS_CONN_CLOSE_REASONS
} ts_conn_close_reason_t;

typedef struct ts_conn_close_info {
    ts_conn_close_reason_t reason;
    int code;            /* the TS_E* code behind it (TS_ECLOSED for EOF, TS_ETIMEDOUT, ...) */
    const char *message; /* a sentence for people, naming the peer's address */
    int was_open;        /* the handshake had completed */
    uint64_t frames_in;  /* frames received on this connection */
} ts_conn_close_info_t;

typedef struct ts_conn_handler {
    void (*on_open)(ts_conn_t *c);
    void (*on_frame)(ts_conn_t *c, const uint8_t *data, size_t len);
    void (*on_drain)(ts_conn_t *c);
    void (*on_close)(ts_conn_t *c, const ts_conn_close_info_t *why);
} ts_conn_handler_t;

/* Counters over the life of a ts_net_t. */
typedef struct ts_net_stats {
    uint64_t accepted;      /* connections accepted (and admitted by the limits) */
    uint64_t refused_limit; /* accepted sockets closed at once by max_conns(_per_addr): every
                             * connection at the limit had completed its handshake; they reach
                             * no callback and no other counter but live */
    uint64_t evicted;       /* half-open connections closed to admit a new one at a limit */
    size_t partial_bytes;   /* buffer memory of partly received frames now (max_partial_bytes) */
    uint64_t connects;      /* outgoing connections started */
    uint64_t opened;        /* handshakes completed, either side */
    uint64_t closed[TS_CONN_CLOSE_REASONS]; /* by reason, of the connections on_close saw */
    uint64_t frames_in, frames_out;
    uint64_t bytes_in, bytes_out; /* TCP bytes read and handed to the socket, handshakes included */
    uint64_t read_pauses;         /* times a connection stopped reading over write_high_water */
    size_t write_queue_peak;      /* the most bytes ever queued on one connection */
    uint32_t live;                /* connections not yet freed, either side */
    uint32_t live_accepted;       /* of them accepted ones (what the limits count) */
} ts_net_stats_t;

/* ---- the context ---------------------------------------------------------------------------- */

/* Creates the context on loop, with copies of id and nk (wiped by ts_net_free) and cfg (NULL:
 * defaults). TS_EINVAL for a bad config (max_frame outside 1..TS_FRAME_MAX_LIMIT, a zero
 * handshake timeout or limit), TS_ENOMEM. */
int ts_net_new(ts_net_t **out, uv_loop_t *loop, const ts_identity_t *id, const ts_netkey_t *nk,
               const ts_net_config_t *cfg);
/* Closes every listener and connection (each connection's on_close follows, from the loop).
 * Run the loop afterwards until they are gone, then ts_net_free. */
void ts_net_shutdown(ts_net_t *net);
/* Frees the context and wipes its keys. TS_EBUSY (and nothing is freed) while listeners or
 * connections are still alive: shut down and run the loop first. NULL-safe. */
int ts_net_free(ts_net_t *net);

/* An observer of failed handshakes, for logs and health: called on the loop for every
 * connection, either side, that closes before its handshake completed for any reason but this
 * side's own close — a refused or failed connect, a handshake timeout, a handshake message that
 * does not decrypt (another network key), an identity that does not verify, the peer closing
 * mid-handshake — and for an outgoing connection the peer closed before sending a single frame
 * (why->was_open set): the initiator's handshake completes when it sends message 3, before the
 * responder has checked the network key in it, so that is how another key looks from here.
 * addr is the peer's "ip:port"; accepted says which side we were. The connection's owner still
 * gets its on_close. fn NULL removes it. */
typedef void (*ts_net_handshake_fail_fn)(void *arg, const char *addr, int accepted,
                                         const ts_conn_close_info_t *why);
void ts_net_on_handshake_failure(ts_net_t *net, ts_net_handshake_fail_fn fn, void *arg);

uv_loop_t *ts_net_loop(const ts_net_t *net);
const ts_node_id_t *ts_net_node_id(const ts_net_t *net);
const ts_net_config_t *ts_net_config(const ts_net_t *net);
void ts_net_stats(const ts_net_t *net, ts_net_stats_t *out);

/* Splits "host:port" (IPv6 hosts in brackets) into host and port. TS_EINVAL with a sentence
 * for anything else (no port, port 0 when !allow_zero, over 65535, host too long). */
int ts_net_parse_addr(const char *addr, char *host, size_t host_len, int *port, int allow_zero,
                      char *err, size_t errlen);

/* ---- listening ------------------------------------------------------------------------------ */

/* Listens on addr ("127.0.0.1:7946", "[::1]:0"; a numeric address, port 0 picks a free one).
 * Accepted connections use handler h, with arg as their data (ts_conn_data). *out is owned by
 * net until ts_listener_close (or ts_net_shutdown). TS_EIO with a sentence when the address
 * cannot be bound. */
int ts_net_listen(ts_net_t *net, const char *addr, const ts_conn_handler_t *h, void *arg,
                  ts_listener_t **out, char *err, size_t errlen);
/* The port it is bound to (the one picked, for port 0). */
int ts_listener_port(const ts_listener_t *l);
/* Stops listening; with close_conns, also closes the connections it accepted. The listener is
 * freed by the loop later: do not use l afterwards. */
void ts_listener_close(ts_listener_t *l, int close_conns);

#ifdef __cplusplus
}
#endif

#endif
