/*
 * rpc.h — requests and answers over net/conn.h connections (docs/protocol.md §5–§7 and "RPC as
 * implemented"): request ids, deadlines, cancellation, typed errors, a dispatch table for the
 * requests this node serves, and a pool of outgoing connections keyed by peer address.
 *
 * The rules it keeps (so its callers need not):
 *   - Request ids: on each connection the side that opened it uses odd ids, the other even ones;
 *     ids count up. An incoming request with the wrong parity closes the connection (a protocol
 *     violation); an answer whose id matches no outstanding call (late, or for a call that timed
 *     out or was cancelled) is ignored.
 *   - Exactly one answer per request, both ways. Every call's callback runs exactly once: with
 *     the answer, or with a local outcome (deadline passed, cancelled, connection lost). Every
 *     incoming request is answered exactly once: by its handler (ts_rpc_reply*), or by this
 *     layer (ERROR_UNSUPPORTED when no handler serves the kind, ERROR_INVALID_ARGUMENT when the
 *     envelope breaks a rule, busy when over the limits, ERROR_CANCELLED on a cancel).
 *   - Deadlines travel in the request as a relative budget (deadline_ms), recomputed when a call
 *     leaves a queue so that time spent waiting for a connection counts. A call times out locally
 *     at its deadline (or after default_timeout_ms when it has none), its callback gets
 *     TS_ETIMEDOUT, and a Cancel goes to the peer.
 *   - Backpressure: an incoming request is answered busy{retry_after_ms} when its connection
 *     already has max_pending_in requests in progress or its write queue is over the high-water
 *     mark; a call on a congested connection is refused at once with TS_EBUSY.
 *
 * The pool. ts_rpc_peer_get returns the one peer entry per address; calls on it share one
 * connection, opened on first use. When an attempt to connect fails (refused, timed out, a failed
 * handshake), the next waits min(backoff_max_ms, backoff_base_ms · 2^(failures−1)) scaled by a
 * random factor in [0.5, 1]; calls queued meanwhile wait for it, each within its own deadline
 * (with cfg.fail_fast they fail at once instead, and calls during the backoff are refused).
 * A successful handshake resets the count. Calls already sent when a connection drops fail with
 * TS_ECLOSED (they are not retried: the request may have been acted on).
 *
 * Ownership. ts_rpc_call_t belongs to this layer; the pointer given back is valid until its
 * callback starts, and it is freed when the callback returns. ts_rpc_request_t is the handler's
 * from the moment it is handed over until it calls one ts_rpc_reply* (which frees it) — also
 * after the request was cancelled or its connection closed (the reply is then dropped). An
 * Envelope passed in is read during the call only.
 *
 * Threading: the loop's thread only, like net/conn.h.
 */
#ifndef TS_RPC_H
#define TS_RPC_H

#include <stdint.h>

#include "base/error.h"
#include "net/conn.h"
#include "proto/tessera.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_rpc ts_rpc_t;
typedef struct ts_rpc_call ts_rpc_call_t;
typedef struct ts_rpc_request ts_rpc_request_t;
typedef struct ts_rpc_peer ts_rpc_peer_t;

typedef struct ts_rpc_config {
    uint32_t default_timeout_ms; /* a call without a deadline, default 30000 */
    uint32_t max_pending_in;     /* requests in progress per connection before busy, default 256 */
    uint32_t busy_retry_ms;      /* the retry_after_ms of our busy answers, default 100 */
    uint32_t backoff_base_ms;    /* default 100 */
    uint32_t backoff_max_ms;     /* default 30000 */
    /* 1: a caller with somewhere else to go (the generation client's replicas). When an attempt
     * to connect fails, the calls queued for that peer fail at once with TS_ECLOSED instead of
     * waiting out their deadlines, and a call made while the peer is in backoff is refused at
     * once (TS_ECLOSED, with the last failure). The first call after the backoff tries again.
     * Default 0: queued calls wait for the reconnect within their deadlines. */
    int fail_fast;
} ts_rpc_config_t;

void ts_rpc_config_default(ts_rpc_config_t *cfg);
/* What this endpoint was asked, over its life (incoming requests only), indexed by the request's
 * Tessera__Envelope__BodyCase: every request received (answered or refused), and of them those
 * answered Busy (by this layer over its limits, or by the handler) and those answered with an
 * Error (an unsupported kind, a broken rule, the handler's own). malformed counts requests whose
 * envelope broke a rule before its kind could be trusted (answered with an Error too). */
#define TS_RPC_KINDS (TESSERA__ENVELOPE__BODY_CANCEL + 1)
typedef struct ts_rpc_stats {
    uint64_t requests[TS_RPC_KINDS], busy[TS_RPC_KINDS], errors[TS_RPC_KINDS];
    uint64_t malformed;
    uint64_t oneway[TS_RPC_KINDS]; /* one-way envelopes received (relay_event), handled or not */
} ts_rpc_stats_t;
void ts_rpc_stats(const ts_rpc_t *rpc, ts_rpc_stats_t *out);

/* The connection context the endpoint runs on. */
ts_net_t *ts_rpc_net(const ts_rpc_t *rpc);

/* Sets cfg.fail_fast of a running endpoint (see above). */
void ts_rpc_set_fail_fast(ts_rpc_t *rpc, int on);

/* The outcome of a call, valid during its callback. */
typedef struct ts_rpc_result {
    /* TS_OK      reply is the answer (of the kind the request calls for);
     * TS_EBUSY   reply is the peer's busy (retry_after_ms in it);
     * TS_EPEER   the peer answered Error: remote_code and message are its;
     * TS_ETIMEDOUT the deadline passed; TS_ECANCELED ts_rpc_cancel; TS_ECLOSED the connection
     *            failed or closed first (message says how); TS_ECORRUPT an answer of the wrong
     *            kind. */
    int status;
    const Tessera__Envelope *reply;
    int remote_code;     /* Tessera__ErrorCode, for TS_EPEER; unknown codes read as INTERNAL */
    const char *message; /* never NULL */
    uint64_t rtt_ns;     /* from sending the request to receiving the answer (0 if none) */
} ts_rpc_result_t;

typedef void (*ts_rpc_cb)(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg);

/* A handler for one kind of incoming request; it must answer req exactly once, now or later. */
typedef void (*ts_rpc_handler_fn)(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg);

/* ---- the endpoint --------------------------------------------------------------------------- */

/* An RPC endpoint on net (which must outlive it). It serves ping itself (answering ack to a ping
 * whose target_id is this node) until a handler replaces it. TS_ENOMEM. */
int ts_rpc_new(ts_rpc_t **out, ts_net_t *net, const ts_rpc_config_t *cfg);
/* Fails every queued call (TS_ECLOSED), stops the pool's timers and closes every connection of
 * net (ts_net_shutdown). Run the loop until it has nothing left, then ts_rpc_free and
 * ts_net_free. */
void ts_rpc_shutdown(ts_rpc_t *rpc);
/* TS_EBUSY while connections or timers are still closing. NULL-safe. */
int ts_rpc_free(ts_rpc_t *rpc);

/* Listens on addr (net/conn.h ts_net_listen) and serves the handlers on what it accepts. */
int ts_rpc_listen(ts_rpc_t *rpc, const char *addr, ts_listener_t **out, char *err, size_t errlen);

/* Serves requests of kind with fn (NULL: stop serving it; such requests get ERROR_UNSUPPORTED).
 * TS_EINVAL unless kind is a request kind. */
int ts_rpc_handle(ts_rpc_t *rpc, Tessera__Envelope__BodyCase kind, ts_rpc_handler_fn fn, void *arg);

/* One-way envelopes (no request id, no answer; today only relay_event): fn gets each one of kind
 * that arrives on any connection, with the connection and the node id its handshake proved;
 * env is valid during the call. A kind with no handler is dropped (and counted). TS_EINVAL
 * unless kind is a one-way kind. */
typedef void (*ts_rpc_oneway_fn)(ts_conn_t *c, const ts_node_id_t *from,
                                 const Tessera__Envelope *env, void *arg);
int ts_rpc_handle_oneway(ts_rpc_t *rpc, Tessera__Envelope__BodyCase kind, ts_rpc_oneway_fn fn,
                         void *arg);
/* Sends the one-way env on the connection of a request still held (not yet answered): how a
 * long-lived request (relay_reserve) streams events to its requester. TS_ECLOSED once the
 * request is detached, TS_EBUSY when the connection is congested (nothing sent: the caller
 * drops or retries), TS_EINVAL for a kind that is not one-way or does not encode. */
int ts_rpc_request_send(ts_rpc_request_t *req, const Tessera__Envelope *env, char *err,
                        size_t errlen);

/* ---- answering (server side) ------------------------------------------------------------------ */

/* Sends resp (any answer kind; request_id and deadline are set here) and frees req. An answer
 * that breaks the protocol's rules is replaced by ERROR_INTERNAL, and TS_EINVAL is returned.
 * TS_ECANCELED / TS_ECLOSED when the request was cancelled or its connection closed (nothing is
 * sent; req is freed all the same). */
int ts_rpc_reply(ts_rpc_request_t *req, Tessera__Envelope *resp);
int ts_rpc_reply_error(ts_rpc_request_t *req, Tessera__ErrorCode code, const char *fmt, ...)
    TS_PRINTF(3, 4);
int ts_rpc_reply_busy(ts_rpc_request_t *req, uint32_t retry_after_ms);

/* Asks to be told (once) when the requester cancels req or its connection closes; req stays the
 * handler's to answer (the answer is then dropped). */
void ts_rpc_request_on_cancel(ts_rpc_request_t *req, void (*fn)(ts_rpc_request_t *, void *),
                              void *arg);
/* The request's deadline in loop time (uv_now), 0 when it carries none. */
uint64_t ts_rpc_request_deadline(const ts_rpc_request_t *req);
/* 1 when its deadline has passed (then answer ERROR_DEADLINE_EXCEEDED before starting work). */
int ts_rpc_request_expired(const ts_rpc_request_t *req);
/* The requester's node id, as its handshake proved. */
const ts_node_id_t *ts_rpc_request_peer(const ts_rpc_request_t *req);
uint64_t ts_rpc_request_id(const ts_rpc_request_t *req);

/* ---- calling (client side) -------------------------------------------------------------------- */

/* The pool entry for addr ("host:port"), made on first use. Owned by rpc. TS_EINVAL (bad
 * address, with a sentence), TS_ENOMEM, TS_ECLOSED after shutdown. */
int ts_rpc_peer_get(ts_rpc_t *rpc, const char *addr, ts_rpc_peer_t **out, char *err, size_t errlen);

/* Opens the peer's connection now if it has none (after the backoff, if one is running) and
 * calls cb once it is open (status TS_OK) or the attempt failed (TS_ECLOSED, with why). Called
 * at once when already open. One waiter per peer: a second call replaces the first's cb. */
typedef void (*ts_rpc_peer_cb)(ts_rpc_peer_t *p, int status, const char *message, void *arg);
int ts_rpc_peer_connect(ts_rpc_peer_t *p, ts_rpc_peer_cb cb, void *arg);

typedef struct ts_rpc_peer_info {
    int open;                 /* a connection is open now */
    int has_node_id;          /* node_id is known (a handshake has completed once) */
    ts_node_id_t node_id;     /* the last one the handshake proved */
    uint32_t failures;        /* consecutive failed attempts */
    uint64_t attempts;        /* connection attempts started */
    uint32_t last_backoff_ms; /* the last delay chosen before a retry (0: none yet) */
    uint64_t handshake_ns;    /* connect + handshake time of the last connection opened */
} ts_rpc_peer_info_t;
void ts_rpc_peer_info(const ts_rpc_peer_t *p, ts_rpc_peer_info_t *out);

/* The node id p's connections must prove from now on (NULL: any): a handshake proving another
 * closes the connection before anything is sent on it (net/conn.h ts_conn_connect_ex), and the
 * calls waiting fail as for a failed attempt. An open connection that proved another id is
 * closed now. What the pool needs where an address is not the node it means — a relayed node's
 * address is its relay's — and where an address may have changed hands. */
void ts_rpc_peer_expect(ts_rpc_peer_t *p, const ts_node_id_t *id);

/* Answers a handshake on a connection this side opens: connects to addr, sends the preamble in
 * clear, then serves what arrives as on an accepted connection (this side the Noise responder).
 * A reserved node's connect-back to its relay, for a dialer waiting there (net/relay.h). No
 * callback: the session appears like an accepted one. TS_EINVAL (bad address or preamble),
 * TS_ECLOSED after shutdown, TS_ENOMEM. */
int ts_rpc_accept_via(ts_rpc_t *rpc, const char *addr, const uint8_t *preamble, size_t preamble_len,
                      char *err, size_t errlen);

/* Sends the request req (a request kind; its request_id and deadline_ms are ignored: the id is
 * chosen here and deadline_ms given apart, 0 for none) to p, connecting if need be. cb runs
 * exactly once. *out (may be NULL) identifies the call for ts_rpc_cancel. Fails at once, with no
 * callback: TS_EINVAL for an envelope that is not a valid request (err says why), TS_EBUSY when
 * p's connection is congested, TS_ECLOSED after shutdown, TS_ENOMEM. */
int ts_rpc_call(ts_rpc_peer_t *p, const Tessera__Envelope *req, uint32_t deadline_ms, ts_rpc_cb cb,
                void *arg, ts_rpc_call_t **out, char *err, size_t errlen);

/* Gives up on call: its callback runs now with TS_ECANCELED, and if the request was sent, a
 * Cancel follows it. */
void ts_rpc_cancel(ts_rpc_call_t *call);

/* "ERROR_NOT_FOUND" etc., for messages; "ERROR_INTERNAL" for unknown codes. */
const char *ts_rpc_error_name(int code);

#ifdef __cplusplus
}
#endif

#endif
