/*
 * conn.h — encrypted TCP connections on libuv: the Noise handshake, then application frames in
 * both directions (architecture.md §4–§5, docs/protocol.md §2, §3 and "Connection lifecycle").
 *
 * What it is. A ts_net_t is one node's connection machinery on one uv_loop: its identity and
 * network key, its limits, its listeners and every live connection. A connection (ts_conn_t) is
 * one TCP stream, opened by connecting (this side is the Noise initiator) or accepted by a
 * listener (responder). Each runs:
 *
 *   CONNECTING ─► HANDSHAKE ─► OPEN ─► CLOSING ─► (on_close, freed)
 *
 * HANDSHAKE is Noise_XXpsk3 (net/noise.h) with prologue "tessera/1" and the network key as psk
 * (net/keys.h), its three messages carried in the 2-byte Noise-message framing of net/frame.h.
 * Each side's identity payload is checked against the static key the handshake authenticated;
 * message 1 must be empty, and each handshake message must have its one legal size (48, 193,
 * 161 bytes), so garbage is refused at its first two bytes. OPEN carries transport messages whose
 * plaintexts form a stream of 4-byte-prefixed application frames (1..max_frame bytes each,
 * reassembled across messages by ts_frame_reader_t); each complete frame goes to on_frame.
 *
 * What it is not: it does not know what a frame holds (net/rpc.h decodes Envelopes), and it has
 * no threads: everything runs on the loop's thread, and no function here may be called from
 * another thread. Like uv.h, this header needs POSIX declarations: define _POSIX_C_SOURCE
 * 200809L before the first include of a file that includes it.
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
 * What closes a connection: any protocol violation (a handshake message of the wrong size, that
 * fails to decrypt — a wrong network key shows up here — or whose identity payload does not
 * verify; a transport message that fails to decrypt — tampered, replayed, reordered; a zero
 * Noise length; an application length of 0 or over max_frame), a timeout, an end of stream or a
 * socket error, or the owner (ts_conn_close). Each close is counted by reason
 * (ts_net_stats_t.closed[reason]); the loop goes on serving every other connection. Secrets —
 * the handshake state and the transport keys — are wiped (sodium_memzero) when the connection
 * starts closing.
 *
 * Ownership and callbacks. The library allocates and frees connections. A connection's
 * callbacks come from a ts_conn_handler_t; they run on the loop, never from inside a call the
 * owner made, except on_frame, which may run anywhere during the loop's read of that socket.
 *   on_open   the handshake completed; the peer's node id is known (ts_conn_peer_id).
 *   on_frame  one whole application frame, data[0, len), valid only during the call.
 *   on_drain  (optional) the write queue fell back under half the high-water mark.
 *   on_close  called exactly once, last, for every connection the owner can have seen: every
 *             one returned by ts_conn_connect (also one whose connect failed), and every
 *             accepted one admitted by the limits; with why; the connection is freed when it
 *             returns.
 * Any callback may call ts_conn_close, after which no on_frame follows.
 *
 * Refused connections. An accepted socket over max_conns or max_conns_per_addr is closed by the
 * library on the spot and reaches no callback at all — no on_open, no on_close — so the owner
 * never learns of it except through ts_net_stats_t.refused_limit, which counts it. It is not
 * counted in accepted, live_accepted or closed[] either (only in live, until its handles have
 * closed). The same holds, without any counter, for an accepted socket whose uv_accept fails
 * or for which no memory could be had.
 */
#ifndef TS_CONN_H
#define TS_CONN_H

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

/* "eof", "handshake-timeout", ... (for logs and JSON); "unknown" outside the enum. */
const char *ts_conn_close_reason_name(ts_conn_close_reason_t r);

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

/* ---- connecting ----------------------------------------------------------------------------- */

/* Connects to addr ("host:port"; host may be a name, resolved through the loop). The connection
 * is returned at once, CONNECTING, with arg as its data; on_open or on_close follows. Returns
 * TS_EINVAL (bad address, with a sentence) or TS_ENOMEM, and then no callback follows. */
int ts_conn_connect(ts_net_t *net, const char *addr, const ts_conn_handler_t *h, void *arg,
                    ts_conn_t **out, char *err, size_t errlen);

/* What ts_conn_connect_ex does beyond ts_conn_connect. */
#define TS_CONN_PREAMBLE_MAX 64
typedef struct ts_conn_connect_opts {
    /* Raw bytes sent once the TCP connection is made, before the handshake (at most
     * TS_CONN_PREAMBLE_MAX): what a relay reads to pair a connect-back with its dialer. */
    const uint8_t *preamble;
    size_t preamble_len;
    /* 1: this side answers the handshake (the Noise responder) although it dialled: a reserved
     * node's connect-back to its relay, behind which a dialer is the initiator. The connection
     * then reports ts_conn_is_initiator() == 0, and its request ids are the responder's. */
    int responder;
    /* Non-NULL: the node id the peer must prove. A handshake that proves another closes the
     * connection as TS_CONN_CLOSE_IDENTITY before a single frame is sent — so a relay, or
     * whoever holds a stale address, cannot answer for the node the caller meant. */
    const ts_node_id_t *expect;
} ts_conn_connect_opts_t;

/* ts_conn_connect with opts (NULL: as ts_conn_connect). TS_EINVAL also for a preamble over
 * TS_CONN_PREAMBLE_MAX bytes. */
int ts_conn_connect_ex(ts_net_t *net, const char *addr, const ts_conn_connect_opts_t *opts,
                       const ts_conn_handler_t *h, void *arg, ts_conn_t **out, char *err,
                       size_t errlen);

/* ---- a connection ----------------------------------------------------------------------- */

/* Queues one application frame, the bytes of parts[0..n) concatenated (the 4-byte prefix is
 * added here), encrypted into as many transport messages as it needs. The bytes are copied;
 * the caller keeps its buffers. The frame is queued even over the high-water mark (check
 * ts_conn_congested first when the frame is optional). TS_ECLOSED unless OPEN, TS_ERANGE for a
 * frame of 0 or over max_frame bytes, TS_ENOMEM. */
typedef struct ts_conn_part {
    const uint8_t *data;
    size_t len;
} ts_conn_part_t;
int ts_conn_sendv(ts_conn_t *c, const ts_conn_part_t *parts, size_t n);
static inline int ts_conn_send(ts_conn_t *c, const uint8_t *data, size_t len) {
    ts_conn_part_t p = {data, len};
    return ts_conn_sendv(c, &p, 1);
}

/* Starts closing c as TS_CONN_CLOSE_LOCAL (queued writes are dropped); on_close follows from
 * the loop. Harmless on a connection already closing. */
void ts_conn_close(ts_conn_t *c);
/* Starts closing c for a protocol violation the owner found in a frame (counted as
 * TS_CONN_CLOSE_PROTOCOL); message is copied into the close info. */
void ts_conn_close_protocol(ts_conn_t *c, const char *message);

/* 1 when more than write_high_water bytes wait to be written (c is not reading meanwhile). */
int ts_conn_congested(const ts_conn_t *c);
size_t ts_conn_write_queued(const ts_conn_t *c);
/* The owner's count of things in progress on c (requests either way): while it is non-zero the
 * idle timeout does not close c. */
void ts_conn_set_pending(ts_conn_t *c, size_t pending);

int ts_conn_is_open(const ts_conn_t *c);
int ts_conn_is_initiator(const ts_conn_t *c);
/* The peer's node id (from its verified handshake payload); TS_ENOTFOUND before OPEN. */
int ts_conn_peer_id(const ts_conn_t *c, ts_node_id_t *out);
/* The peer's address as "ip:port" (the address given to ts_conn_connect before the connection
 * is made). */
const char *ts_conn_peer_addr(const ts_conn_t *c);
/* The session's handshake hash (64 bytes); TS_ENOTFOUND before OPEN. */
int ts_conn_handshake_hash(const ts_conn_t *c, uint8_t out[TS_NOISE_HASHLEN]);
ts_net_t *ts_conn_net(const ts_conn_t *c);
void *ts_conn_data(const ts_conn_t *c);
void ts_conn_set_data(ts_conn_t *c, void *data);

#ifdef __cplusplus
}
#endif

#endif
