/*
 * conn.h — encrypted TCP connections on libuv: the Noise handshake, then application frames in
 * both directions (architecture.md §4–§5, docs/protocol.md §2, §3 and "Connection lifecycle").
 *
 * What it is. A connection (ts_conn_t) of a node's connection machinery (ts_net_t, net/net.h) is
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
 * Its limits and timers, and the connections refused at a limit, are net/net.h's.
 */
#ifndef TS_CONN_H
#define TS_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "net/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "eof", "handshake-timeout", ... (for logs and JSON); "unknown" outside the enum. */
const char *ts_conn_close_reason_name(ts_conn_close_reason_t r);

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
