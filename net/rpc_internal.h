/*
 * rpc_internal.h — what the files of the RPC layer share (rpc.c, rpc_peer.c, rpc_request.c; rpc.c's
 * top comment says how the pieces fit): the endpoint, a peer, a session (one connection's
 * requests and calls), a call and a request, and the functions one file calls in another.
 */
#ifndef TS_NET_RPC_INTERNAL_H
#define TS_NET_RPC_INTERNAL_H

#include "base/list.h"
#include "net/rpc.h"

typedef struct session session_t;

struct ts_rpc {
    ts_net_t *net;
    ts_rpc_config_t cfg;
    struct {
        ts_rpc_handler_fn fn;
        void *arg;
    } handlers[TESSERA__ENVELOPE__BODY_CANCEL + 1];
    struct {
        ts_rpc_oneway_fn fn;
        void *arg;
    } oneway[TESSERA__ENVELOPE__BODY_CANCEL + 1];
    ts_list_t peers;
    ts_list_t timeouts; /* calls by deadline_at, earliest first */
    uv_timer_t timer;
    int timer_open;
    int closing;
    int shutting; /* in ts_rpc_shutdown: a call's callback that shuts down again returns */
    unsigned sessions, peer_timers; /* still alive: ts_rpc_free waits for them */
    ts_rpc_stats_t st;
};

typedef enum { PEER_IDLE, PEER_CONNECTING, PEER_OPEN, PEER_BACKOFF } peer_state_t;

struct ts_rpc_peer {
    ts_list_t node; /* in rpc->peers */
    ts_rpc_t *rpc;
    char addr[272];
    peer_state_t state;
    ts_conn_t *conn;
    session_t *sess;
    ts_list_t queue; /* calls waiting for a connection */
    uint64_t next_id;
    uv_timer_t timer; /* the backoff */
    uint64_t connect_started_ns;
    ts_rpc_peer_info_t info;
    ts_rpc_peer_cb waiter;
    void *waiter_arg;
    int has_expect; /* ts_rpc_peer_expect: the node id its connections must prove */
    ts_node_id_t expect;
    char last_failure[200]; /* why the last connection attempt failed ("" after a success) */
};

struct session {
    ts_rpc_t *rpc;
    ts_conn_t *conn;
    ts_rpc_peer_t *peer; /* NULL on accepted connections */
    ts_list_t in, out;
    size_t n_in, n_out;
    ts_node_id_t peer_id;
};

struct ts_rpc_call {
    ts_list_t node;  /* in peer->queue or sess->out */
    ts_list_t tnode; /* in rpc->timeouts */
    ts_rpc_t *rpc;
    ts_rpc_peer_t *peer;
    session_t *sess; /* once sent */
    uint64_t id;
    Tessera__Envelope__BodyCase kind;
    uint64_t deadline_at; /* uv_now ms */
    uint32_t deadline_ms; /* sent on the wire; 0: none */
    uint64_t sent_ns;
    ts_rpc_cb cb;
    void *arg;
    size_t body_len;
    uint8_t body[]; /* the packed envelope without request_id and deadline_ms */
};

struct ts_rpc_request {
    ts_list_t node;  /* in sess->in while pending */
    session_t *sess; /* NULL once detached (cancelled, or the connection closed) */
    uint64_t id;
    Tessera__Envelope__BodyCase kind;
    uint64_t deadline_at;
    int cancelled;
    ts_node_id_t peer_id;
    void (*on_cancel)(ts_rpc_request_t *, void *);
    void *cancel_arg;
};

/* Tells the connection how many requests and calls are pending on it (its idle timeout waits). */
static inline void session_update_pending(session_t *s) {
    if (s->conn)
        ts_conn_set_pending(s->conn, s->n_in + s->n_out);
}

/* One-way kinds a handler may take: every body kind that is neither a request, an answer, an
 * error, nor the cancel this layer handles itself. */
static inline int is_oneway_kind(Tessera__Envelope__BodyCase k) {
    return k == TESSERA__ENVELOPE__BODY_RELAY_EVENT;
}

/* ---- rpc.c ---- */

int ts_rpc__is_request_kind(Tessera__Envelope__BodyCase k);
session_t *ts_rpc__session_new(ts_rpc_t *rpc, ts_rpc_peer_t *peer);
/* The connection under s is gone: detach the requests, fail the calls, free s. */
void ts_rpc__session_end(session_t *s, const char *why);
/* Writes the call on the session's connection (moves it to the session's `out`). */
void ts_rpc__send_call(session_t *s, ts_rpc_call_t *call);
/* Unlinks call from everything, runs its callback, frees it. */
void ts_rpc__finish_call(ts_rpc_call_t *call, int status, const Tessera__Envelope *reply,
                         int remote_code, const char *message);
void ts_rpc__timeouts_insert(ts_rpc_t *rpc, ts_rpc_call_t *call);
/* The connection handler's frame callback: an envelope in, dispatched by kind. */
void ts_rpc__conn_frame(ts_conn_t *c, const uint8_t *data, size_t len);

/* ---- rpc_peer.c ---- */

/* The handler of every connection of the endpoint (its data: the session, or the endpoint until
 * an accepted connection opens). */
extern const ts_conn_handler_t ts_rpc__handler;
/* Runs and clears p's connect waiter (ts_rpc_peer_connect), if any. */
void ts_rpc__peer_notify(ts_rpc_peer_t *p, int status, const char *message);
/* Starts a connection attempt to p's address now. */
void ts_rpc__peer_connect_now(ts_rpc_peer_t *p);

/* ---- rpc_request.c ---- */

int ts_rpc__send_error(session_t *s, uint64_t id, Tessera__ErrorCode code, const char *message);
/* A request env received on s: dispatched to its handler, or refused (busy, unsupported). */
void ts_rpc__on_request(session_t *s, const Tessera__Envelope *env);
/* The requester cancelled request id on s: detached, answered CANCELLED, on_cancel run. */
void ts_rpc__on_cancel(session_t *s, uint64_t id);

#endif
