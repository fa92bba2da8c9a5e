/*
 * rpc.c — requests and answers on top of net/conn.h (see rpc.h for the rules and ownership).
 *
 * How the pieces fit. Every open connection carries a session: its incoming requests still
 * unanswered (ts_rpc_request_t, in `in`) and its outgoing calls awaiting an answer
 * (ts_rpc_call_t, in `out`). Outgoing calls go through a peer (the pool entry of one address),
 * which holds the calls waiting for a connection (`queue`) and the reconnect state. Every call
 * with a deadline also sits in the endpoint's `timeouts` list, sorted by deadline, under one
 * timer armed for the earliest; so a call is in exactly one of {peer queue, session out} and,
 * until it finishes, in `timeouts`.
 *
 * A call's envelope is validated and packed once, at ts_rpc_call, *without* its request id and
 * deadline. When it is sent, those two header fields are written in front of the packed body:
 * protobuf decodes a concatenation as the merge of its parts, so "header ‖ body" is the same
 * Envelope as one packed whole, and the deadline can be what is left of the budget at the moment
 * of sending, however long the call waited for a connection.
 *
 * Finishing a call (finish_call) unlinks it from everything before its callback runs, so the
 * callback may do anything — start calls, cancel others, shut down — and a late answer finds no
 * call and is ignored.
 */
#define _POSIX_C_SOURCE 200809L /* uv.h needs POSIX types (pthread_rwlock_t, addrinfo) */

#include "net/rpc.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/list.h"
#include "net/frame.h"

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

static void peer_schedule(ts_rpc_peer_t *p, int failed);
static void fail_queue(ts_rpc_peer_t *p, const char *why);
static void default_ping(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg);

/* ---- small things ----------------------------------------------------------------------------- */

void ts_rpc_config_default(ts_rpc_config_t *cfg) {
    *cfg = (ts_rpc_config_t){.default_timeout_ms = 30000,
                             .max_pending_in = 256,
                             .busy_retry_ms = 100,
                             .backoff_base_ms = 100,
                             .backoff_max_ms = 30000,
                             .fail_fast = 0};
}

const char *ts_rpc_error_name(int code) {
    switch (code) {
    case TESSERA__ERROR_CODE__ERROR_PROTOCOL: return "ERROR_PROTOCOL";
    case TESSERA__ERROR_CODE__ERROR_UNSUPPORTED: return "ERROR_UNSUPPORTED";
    case TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT: return "ERROR_INVALID_ARGUMENT";
    case TESSERA__ERROR_CODE__ERROR_NOT_FOUND: return "ERROR_NOT_FOUND";
    case TESSERA__ERROR_CODE__ERROR_DEADLINE_EXCEEDED: return "ERROR_DEADLINE_EXCEEDED";
    case TESSERA__ERROR_CODE__ERROR_CANCELLED: return "ERROR_CANCELLED";
    case TESSERA__ERROR_CODE__ERROR_UNAVAILABLE: return "ERROR_UNAVAILABLE";
    default: return "ERROR_INTERNAL";
    }
}

/* The answer a request calls for (protocol.md §5, "Pairing"); NOT_SET for non-requests. */
static Tessera__Envelope__BodyCase answer_kind(Tessera__Envelope__BodyCase k) {
    switch (k) {
    case TESSERA__ENVELOPE__BODY_PING: return TESSERA__ENVELOPE__BODY_ACK;
    case TESSERA__ENVELOPE__BODY_PUSH_PULL: return TESSERA__ENVELOPE__BODY_PUSH_PULL;
    case TESSERA__ENVELOPE__BODY_ADVERT_REQUEST: return TESSERA__ENVELOPE__BODY_ADVERT;
    case TESSERA__ENVELOPE__BODY_DENOISE_REQUEST: return TESSERA__ENVELOPE__BODY_DENOISE_RESPONSE;
    case TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST_REQUEST:
        return TESSERA__ENVELOPE__BODY_WEIGHTS_MANIFEST;
    case TESSERA__ENVELOPE__BODY_CHUNK_REQUEST: return TESSERA__ENVELOPE__BODY_CHUNK;
    case TESSERA__ENVELOPE__BODY_STATUS_REQUEST: return TESSERA__ENVELOPE__BODY_STATUS_RESPONSE;
    case TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST:
        return TESSERA__ENVELOPE__BODY_DIAL_BACK_RESPONSE;
    case TESSERA__ENVELOPE__BODY_RELAY_RESERVE: return TESSERA__ENVELOPE__BODY_RELAY_ENDED;
    default: return TESSERA__ENVELOPE__BODY__NOT_SET;
    }
}

static int is_request_kind(Tessera__Envelope__BodyCase k) {
    return answer_kind(k) != TESSERA__ENVELOPE__BODY__NOT_SET;
}

static int answers(Tessera__Envelope__BodyCase request, Tessera__Envelope__BodyCase got) {
    return got == answer_kind(request);
}

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Ids of the side that opened the connection are odd. */
static int id_is_initiators(uint64_t id) { return (id & 1) == 1; }

static void session_update_pending(session_t *s) {
    if (s->conn)
        ts_conn_set_pending(s->conn, s->n_in + s->n_out);
}

/* ---- the endpoint ----------------------------------------------------------------------------- */

int ts_rpc_new(ts_rpc_t **out, ts_net_t *net, const ts_rpc_config_t *cfg) {
    if (!out || !net)
        return TS_EINVAL;
    ts_rpc_t *rpc = calloc(1, sizeof *rpc);
    if (!rpc)
        return TS_ENOMEM;
    rpc->net = net;
    if (cfg)
        rpc->cfg = *cfg;
    else
        ts_rpc_config_default(&rpc->cfg);
    if (rpc->cfg.default_timeout_ms == 0 || rpc->cfg.max_pending_in == 0 ||
        rpc->cfg.backoff_base_ms == 0 || rpc->cfg.backoff_max_ms < rpc->cfg.backoff_base_ms) {
        free(rpc);
        return TS_EINVAL;
    }
    ts_list_init(&rpc->peers);
    ts_list_init(&rpc->timeouts);
    uv_timer_init(ts_net_loop(net), &rpc->timer);
    rpc->timer.data = rpc;
    rpc->timer_open = 1;
    rpc->handlers[TESSERA__ENVELOPE__BODY_PING].fn = default_ping;
    *out = rpc;
    return TS_OK;
}

int ts_rpc_handle(ts_rpc_t *rpc, Tessera__Envelope__BodyCase kind, ts_rpc_handler_fn fn,
                  void *arg) {
    if (!rpc || !is_request_kind(kind))
        return TS_EINVAL;
    rpc->handlers[kind].fn = fn;
    rpc->handlers[kind].arg = arg;
    return TS_OK;
}

/* One-way kinds a handler may take: every body kind that is neither a request, an answer, an
 * error, nor the cancel this layer handles itself. */
static int is_oneway_kind(Tessera__Envelope__BodyCase k) {
    return k == TESSERA__ENVELOPE__BODY_RELAY_EVENT;
}

int ts_rpc_handle_oneway(ts_rpc_t *rpc, Tessera__Envelope__BodyCase kind, ts_rpc_oneway_fn fn,
                         void *arg) {
    if (!rpc || !is_oneway_kind(kind))
        return TS_EINVAL;
    rpc->oneway[kind].fn = fn;
    rpc->oneway[kind].arg = arg;
    return TS_OK;
}

/* ---- timeouts --------------------------------------------------------------------------------- */

static void timer_cb(uv_timer_t *t);

static void rearm(ts_rpc_t *rpc) {
    if (rpc->closing)
        return;
    if (ts_list_empty(&rpc->timeouts)) {
        uv_timer_stop(&rpc->timer);
        return;
    }
    ts_rpc_call_t *first = TS_CONTAINER_OF(rpc->timeouts.next, ts_rpc_call_t, tnode);
    uint64_t now = uv_now(ts_net_loop(rpc->net));
    uv_timer_start(&rpc->timer, timer_cb, first->deadline_at > now ? first->deadline_at - now : 0,
                   0);
}

static void timeouts_insert(ts_rpc_t *rpc, ts_rpc_call_t *call) {
    ts_list_t *at = &rpc->timeouts;
    TS_LIST_FOREACH(it, &rpc->timeouts) {
        if (TS_CONTAINER_OF(it, ts_rpc_call_t, tnode)->deadline_at > call->deadline_at) {
            at = it;
            break;
        }
    }
    ts_list_insert_before(at, &call->tnode);
    rearm(rpc);
}

/* ---- finishing calls -------------------------------------------------------------------------- */

/* Sends a Cancel for a call that was sent; best effort. */
static void send_cancel(session_t *s, uint64_t id) {
    if (!s || !s->conn)
        return;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__Cancel cancel = TESSERA__CANCEL__INIT;
    cancel.has_request_id = 1;
    cancel.request_id = id;
    env.body_case = TESSERA__ENVELOPE__BODY_CANCEL;
    env.cancel = &cancel;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (ts_frame_encode_envelope(&env, 0, ts_net_config(s->rpc->net)->max_frame, &buf, &len, NULL,
                                 0) == TS_OK)
        ts_conn_send(s->conn, buf + TS_FRAME_APP_HEADER, len - TS_FRAME_APP_HEADER);
    free(buf);
}

/* Unlinks call from everything, runs its callback, frees it. */
static void finish_call(ts_rpc_call_t *call, int status, const Tessera__Envelope *reply,
                        int remote_code, const char *message) {
    ts_rpc_t *rpc = call->rpc;
    ts_list_remove(&call->node);
    ts_list_remove(&call->tnode);
    if (call->sess) {
        call->sess->n_out--;
        session_update_pending(call->sess);
    }
    ts_rpc_result_t res = {status, reply, remote_code, message ? message : ts_strerror(status),
                           call->sent_ns && reply ? uv_hrtime() - call->sent_ns : 0};
    call->cb(call, &res, call->arg);
    free(call);
    rearm(rpc);
}

static void timer_cb(uv_timer_t *t) {
    ts_rpc_t *rpc = t->data;
    uint64_t now = uv_now(ts_net_loop(rpc->net));
    while (!ts_list_empty(&rpc->timeouts)) {
        ts_rpc_call_t *call = TS_CONTAINER_OF(rpc->timeouts.next, ts_rpc_call_t, tnode);
        if (call->deadline_at > now)
            break;
        char msg[600];
        const ts_rpc_peer_t *p = call->peer;
        int n = snprintf(msg, sizeof msg, "no answer from %s within %llu ms", p->addr,
                         (unsigned long long)(call->deadline_ms ? call->deadline_ms
                                                                : rpc->cfg.default_timeout_ms));
        if (!call->sess && p->last_failure[0] && n > 0 && (size_t)n < sizeof msg)
            snprintf(msg + n, sizeof msg - (size_t)n, " (never connected: %s; %llu attempts)",
                     p->last_failure, (unsigned long long)p->info.attempts);
        if (call->sess)
            send_cancel(call->sess, call->id);
        finish_call(call, TS_ETIMEDOUT, NULL, 0, msg);
    }
    rearm(rpc);
}

void ts_rpc_cancel(ts_rpc_call_t *call) {
    if (!call)
        return;
    if (call->sess)
        send_cancel(call->sess, call->id);
    finish_call(call, TS_ECANCELED, NULL, 0, "cancelled by this side");
}

/* ---- sending calls ---------------------------------------------------------------------------- */

/* Writes the call on the session's connection: header (id, what is left of the deadline) in
 * front of the packed body. */
static void send_call(session_t *s, ts_rpc_call_t *call) {
    uint8_t hdr[2 + 10 + 1 + 5];
    size_t n = 0;
    hdr[n++] = 0x08; /* field 1, varint: request_id */
    n += put_varint(hdr + n, call->id);
    if (call->deadline_ms) {
        uint64_t now = uv_now(ts_net_loop(s->rpc->net));
        uint64_t left = call->deadline_at > now ? call->deadline_at - now : 1;
        hdr[n++] = 0x10; /* field 2, varint: deadline_ms */
        n += put_varint(hdr + n, left);
    }
    ts_conn_part_t parts[2] = {{hdr, n}, {call->body, call->body_len}};
    ts_list_remove(&call->node);
    call->sess = s;
    ts_list_push(&s->out, &call->node);
    s->n_out++;
    session_update_pending(s);
    call->sent_ns = uv_hrtime();
    int rc = ts_conn_sendv(s->conn, parts, 2);
    if (rc)
        finish_call(call, rc == TS_ECLOSED ? TS_ECLOSED : rc, NULL, 0,
                    "the connection failed while sending the request");
}

/* ---- sessions --------------------------------------------------------------------------------- */

static session_t *session_new(ts_rpc_t *rpc, ts_rpc_peer_t *peer) {
    session_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->rpc = rpc;
    s->peer = peer;
    ts_list_init(&s->in);
    ts_list_init(&s->out);
    rpc->sessions++;
    return s;
}

/* The connection under s is gone: detach the requests, fail the calls, free s. */
static void session_end(session_t *s, const char *why) {
    ts_rpc_t *rpc = s->rpc;
    s->conn = NULL;
    while (!ts_list_empty(&s->in)) {
        ts_rpc_request_t *r = TS_CONTAINER_OF(s->in.next, ts_rpc_request_t, node);
        ts_list_remove(&r->node);
        r->sess = NULL;
        if (r->on_cancel)
            r->on_cancel(r, r->cancel_arg);
    }
    while (!ts_list_empty(&s->out))
        finish_call(TS_CONTAINER_OF(s->out.next, ts_rpc_call_t, node), TS_ECLOSED, NULL, 0, why);
    rpc->sessions--;
    free(s);
}

static int send_envelope(session_t *s, const Tessera__Envelope *env, char *err, size_t errlen) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = ts_frame_encode_envelope(env, 0, ts_net_config(s->rpc->net)->max_frame, &buf, &len,
                                      err, errlen);
    if (rc == TS_OK)
        rc = ts_conn_send(s->conn, buf + TS_FRAME_APP_HEADER, len - TS_FRAME_APP_HEADER);
    free(buf);
    return rc;
}

static int send_error(session_t *s, uint64_t id, Tessera__ErrorCode code, const char *message) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__Error e = TESSERA__ERROR__INIT;
    char msg[TS_FRAME_MESSAGE_MAX + 1];
    snprintf(msg, sizeof msg, "%s", message ? message : "");
    /* the cut may split a UTF-8 sequence: drop a partial one at the end */
    size_t n = strlen(msg), k = n;
    while (k > 0 && ((unsigned char)msg[k - 1] & 0xC0) == 0x80)
        k--;
    if (k > 0 && ((unsigned char)msg[k - 1] & 0x80)) {
        unsigned char lead = (unsigned char)msg[k - 1];
        size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
        if (n - (k - 1) < need)
            msg[k - 1] = '\0';
    }
    e.has_code = 1;
    e.code = code;
    e.message = msg;
    env.has_request_id = id != 0;
    env.request_id = id;
    env.body_case = TESSERA__ENVELOPE__BODY_ERROR;
    env.error = &e;
    return send_envelope(s, &env, NULL, 0);
}

static int send_busy(session_t *s, uint64_t id, uint32_t retry_ms) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__Busy b = TESSERA__BUSY__INIT;
    b.has_retry_after_ms = 1;
    b.retry_after_ms = retry_ms;
    env.has_request_id = 1;
    env.request_id = id;
    env.body_case = TESSERA__ENVELOPE__BODY_BUSY;
    env.busy = &b;
    return send_envelope(s, &env, NULL, 0);
}

/* ---- incoming --------------------------------------------------------------------------------- */

static void request_free(ts_rpc_request_t *r) {
    if (r->sess) {
        ts_list_remove(&r->node);
        r->sess->n_in--;
        session_update_pending(r->sess);
    }
    free(r);
}

static void on_request(session_t *s, const Tessera__Envelope *env) {
    ts_rpc_t *rpc = s->rpc;
    uint64_t id = env->request_id;
    int k = env->body_case; /* a request kind: below TS_RPC_KINDS */
    rpc->st.requests[k]++;
    if (s->n_in >= rpc->cfg.max_pending_in || ts_conn_congested(s->conn)) {
        rpc->st.busy[k]++;
        send_busy(s, id, rpc->cfg.busy_retry_ms);
        return;
    }
    ts_rpc_handler_fn fn = rpc->handlers[env->body_case].fn;
    if (!fn) {
        char msg[128];
        snprintf(msg, sizeof msg, "this node does not serve %s",
                 ts_frame_body_name(env->body_case));
        rpc->st.errors[k]++;
        send_error(s, id, TESSERA__ERROR_CODE__ERROR_UNSUPPORTED, msg);
        return;
    }
    ts_rpc_request_t *r = calloc(1, sizeof *r);
    if (!r) {
        rpc->st.errors[k]++;
        send_error(s, id, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    r->sess = s;
    r->id = id;
    r->kind = env->body_case;
    r->peer_id = s->peer_id;
    if (env->has_deadline_ms && env->deadline_ms)
        r->deadline_at = uv_now(ts_net_loop(rpc->net)) + env->deadline_ms;
    ts_list_push(&s->in, &r->node);
    s->n_in++;
    session_update_pending(s);
    fn(r, env, rpc->handlers[env->body_case].arg);
}

static void on_cancel_msg(session_t *s, uint64_t id) {
    TS_LIST_FOREACH(it, &s->in) {
        ts_rpc_request_t *r = TS_CONTAINER_OF(it, ts_rpc_request_t, node);
        if (r->id != id)
            continue;
        ts_list_remove(&r->node);
        s->n_in--;
        session_update_pending(s);
        r->sess = NULL;
        r->cancelled = 1;
        send_error(s, id, TESSERA__ERROR_CODE__ERROR_CANCELLED, "cancelled by the requester");
        if (r->on_cancel)
            r->on_cancel(r, r->cancel_arg);
        return;
    }
}

static void on_answer(session_t *s, const Tessera__Envelope *env) {
    ts_rpc_call_t *call = NULL;
    TS_LIST_FOREACH(it, &s->out) {
        ts_rpc_call_t *c = TS_CONTAINER_OF(it, ts_rpc_call_t, node);
        if (c->id == env->request_id) {
            call = c;
            break;
        }
    }
    if (!call) /* late, or never ours */
        return;
    char msg[TS_FRAME_MESSAGE_MAX + 128];
    switch (env->body_case) {
    case TESSERA__ENVELOPE__BODY_ERROR: {
        int code = env->error->code;
        if (!strcmp(ts_rpc_error_name(code), "ERROR_INTERNAL"))
            code = TESSERA__ERROR_CODE__ERROR_INTERNAL;
        snprintf(msg, sizeof msg, "%s answered %s: %s", call->peer->addr, ts_rpc_error_name(code),
                 env->error->message ? env->error->message : "");
        finish_call(call, TS_EPEER, env, code, msg);
        return;
    }
    case TESSERA__ENVELOPE__BODY_BUSY:
        snprintf(msg, sizeof msg, "%s is busy (retry after %u ms)", call->peer->addr,
                 (unsigned)env->busy->retry_after_ms);
        finish_call(call, TS_EBUSY, env, 0, msg);
        return;
    default:
        if (!answers(call->kind, env->body_case)) {
            snprintf(msg, sizeof msg, "%s answered %s with %s", call->peer->addr,
                     ts_frame_body_name(call->kind), ts_frame_body_name(env->body_case));
            finish_call(call, TS_ECORRUPT, NULL, 0, msg);
            return;
        }
        finish_call(call, TS_OK, env, 0, "ok");
    }
}

static void conn_frame(ts_conn_t *c, const uint8_t *data, size_t len) {
    session_t *s = ts_conn_data(c);
    if (!s)
        return;
    char err[256] = "";
    Tessera__Envelope *env = NULL;
    int rc = ts_frame_unpack_envelope(data, len, &env, err, sizeof err);
    if (rc) { /* not an Envelope, or over the decode budget: the stream is not to be trusted */
        ts_conn_close_protocol(c, err);
        return;
    }
    int initiator = ts_conn_is_initiator(c);
    uint64_t id = env->has_request_id ? env->request_id : 0;
    /* Whose id it is: a request must carry the peer's parity, an answer ours. */
    int peers_id = id != 0 && id_is_initiators(id) != initiator;
    rc = ts_frame_check_envelope(env, 0, err, sizeof err);
    if (rc) {
        /* Answer only what reads as a request: the peer's parity and a request body (or a body
         * of a kind we do not know). */
        int request = peers_id && (is_request_kind(env->body_case) ||
                                   env->body_case == TESSERA__ENVELOPE__BODY__NOT_SET);
        if (request && env->body_case > 0 && env->body_case < TS_RPC_KINDS) {
            s->rpc->st.requests[env->body_case]++;
            s->rpc->st.errors[env->body_case]++;
        } else if (request) {
            s->rpc->st.malformed++;
        }
        if (request)
            send_error(s, id,
                       rc == TS_ENOTSUP ? TESSERA__ERROR_CODE__ERROR_UNSUPPORTED
                                        : TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT,
                       err);
        ts_frame_free(env);
        return;
    }
    Tessera__Envelope__BodyCase k = env->body_case;
    if (k == TESSERA__ENVELOPE__BODY_CANCEL) {
        on_cancel_msg(s, env->cancel->request_id);
    } else if (is_oneway_kind(k)) {
        s->rpc->st.oneway[k]++;
        if (s->rpc->oneway[k].fn)
            s->rpc->oneway[k].fn(c, &s->peer_id, env, s->rpc->oneway[k].arg);
    } else if (is_request_kind(k) && (k != TESSERA__ENVELOPE__BODY_PUSH_PULL || peers_id)) {
        if (!peers_id) {
            snprintf(err, sizeof err, "request %llu has the wrong parity for its sender",
                     (unsigned long long)id);
            ts_frame_free(env);
            ts_conn_close_protocol(c, err);
            return;
        }
        on_request(s, env);
    } else if (id != 0) {
        on_answer(s, env);
    }
    ts_frame_free(env);
}

/* ---- the pool --------------------------------------------------------------------------------- */

static void peer_notify(ts_rpc_peer_t *p, int status, const char *message) {
    ts_rpc_peer_cb cb = p->waiter;
    if (!cb)
        return;
    p->waiter = NULL;
    cb(p, status, message, p->waiter_arg);
}

static void conn_open(ts_conn_t *c) {
    session_t *s = ts_conn_data(c);
    if (!ts_conn_is_initiator(c)) { /* accepted: the listener's data was the endpoint */
        ts_rpc_t *rpc = (ts_rpc_t *)s;
        s = rpc->closing ? NULL : session_new(rpc, NULL);
        ts_conn_set_data(c, s);
        if (!s) {
            ts_conn_close(c);
            return;
        }
        s->conn = c;
    }
    ts_conn_peer_id(c, &s->peer_id);
    ts_rpc_peer_t *p = s->peer;
    if (!p)
        return;
    p->state = PEER_OPEN;
    p->info.open = 1;
    p->info.failures = 0;
    p->last_failure[0] = 0;
    p->info.has_node_id = 1;
    p->info.node_id = s->peer_id;
    p->info.handshake_ns = uv_hrtime() - p->connect_started_ns;
    peer_notify(p, TS_OK, "connected");
    while (p->sess == s && !ts_list_empty(&p->queue) && ts_conn_is_open(c))
        send_call(s, TS_CONTAINER_OF(p->queue.next, ts_rpc_call_t, node));
}

static void conn_closed(ts_conn_t *c, const ts_conn_close_info_t *why) {
    session_t *s = ts_conn_data(c);
    if (!s || (!ts_conn_is_initiator(c) && !why->was_open)) /* accepted, never a session */
        return;
    ts_rpc_peer_t *p = s->peer;
    session_end(s, why->message);
    if (!p)
        return;
    p->conn = NULL;
    p->sess = NULL;
    p->info.open = 0;
    if (!why->was_open) {
        p->info.failures++;
        snprintf(p->last_failure, sizeof p->last_failure, "%.199s", why->message);
        peer_notify(p, TS_ECLOSED, why->message);
        /* the calls waiting for this connection learn why if they time out; they stay queued,
         * unless cfg.fail_fast (once the backoff is set, so that their callbacks' new calls to
         * this peer are refused at once too) */
    }
    peer_schedule(p, !why->was_open);
    if (!why->was_open)
        fail_queue(p, p->last_failure);
}

static const ts_conn_handler_t rpc_handler = {conn_open, conn_frame, NULL, conn_closed};

ts_net_t *ts_rpc_net(const ts_rpc_t *rpc) { return rpc->net; }

void ts_rpc_set_fail_fast(ts_rpc_t *rpc, int on) {
    if (rpc)
        rpc->cfg.fail_fast = on != 0;
}

/* cfg.fail_fast: the calls waiting for p's connection fail now, with why the attempt failed. */
static void fail_queue(ts_rpc_peer_t *p, const char *why) {
    if (!p->rpc->cfg.fail_fast)
        return;
    char msg[600];
    if (strncmp(why, "cannot connect to ", 18) == 0) /* the connection's own words name it */
        snprintf(msg, sizeof msg, "%s", why);
    else
        snprintf(msg, sizeof msg, "cannot connect to %s: %s", p->addr, why);
    ts_list_t doomed; /* the calls queued now: a callback's new calls are not swept up */
    ts_list_init(&doomed);
    while (!ts_list_empty(&p->queue)) {
        ts_list_t *n = p->queue.next;
        ts_list_remove(n);
        ts_list_push(&doomed, n);
    }
    while (!ts_list_empty(&doomed))
        finish_call(TS_CONTAINER_OF(doomed.next, ts_rpc_call_t, node), TS_ECLOSED, NULL, 0, msg);
}

static void peer_connect_now(ts_rpc_peer_t *p) {
    ts_rpc_t *rpc = p->rpc;
    char err[256] = "";
    session_t *s = session_new(rpc, p);
    if (!s) {
        peer_notify(p, TS_ENOMEM, "out of memory");
        return;
    }
    p->state = PEER_CONNECTING;
    p->info.attempts++;
    p->connect_started_ns = uv_hrtime();
    p->sess = s;
    ts_conn_connect_opts_t o = {.expect = p->has_expect ? &p->expect : NULL};
    int rc = ts_conn_connect_ex(rpc->net, p->addr, &o, &rpc_handler, s, &p->conn, err, sizeof err);
    if (rc) { /* no callback follows: fail as a refused attempt would */
        p->sess = NULL;
        rpc->sessions--;
        free(s);
        p->info.failures++;
        snprintf(p->last_failure, sizeof p->last_failure, "%.199s", err);
        peer_notify(p, TS_ECLOSED, err);
        peer_schedule(p, 1);
        fail_queue(p, p->last_failure);
        return;
    }
    s->conn = p->conn;
}

static void backoff_cb(uv_timer_t *t) {
    ts_rpc_peer_t *p = t->data;
    p->state = PEER_IDLE;
    if (!ts_list_empty(&p->queue) || p->waiter)
        peer_connect_now(p);
}

/* Decides what a peer without a connection does next: retry after a backoff when the last
 * attempt failed, reconnect at once when calls wait and it had simply closed, else rest. */
static void peer_schedule(ts_rpc_peer_t *p, int failed) {
    ts_rpc_t *rpc = p->rpc;
    p->state = PEER_IDLE;
    if (rpc->closing)
        return;
    if (failed) {
        uint32_t f = p->info.failures > 0 ? p->info.failures - 1 : 0;
        uint64_t d = (uint64_t)rpc->cfg.backoff_base_ms << (f < 20 ? f : 20);
        if (d > rpc->cfg.backoff_max_ms)
            d = rpc->cfg.backoff_max_ms;
        d = d / 2 + (d / 2) * randombytes_uniform(1001) / 1000; /* jitter: [d/2, d] */
        p->info.last_backoff_ms = (uint32_t)d;
        p->state = PEER_BACKOFF;
        uv_timer_start(&p->timer, backoff_cb, d, 0);
    } else if (!ts_list_empty(&p->queue) || p->waiter) {
        peer_connect_now(p);
    }
}

int ts_rpc_peer_get(ts_rpc_t *rpc, const char *addr, ts_rpc_peer_t **out, char *err,
                    size_t errlen) {
    if (!rpc || !addr || !out) {
        ts_set_err(err, errlen, "ts_rpc_peer_get: NULL argument");
        return TS_EINVAL;
    }
    *out = NULL;
    if (rpc->closing) {
        ts_set_err(err, errlen, "the RPC endpoint is shutting down");
        return TS_ECLOSED;
    }
    TS_LIST_FOREACH(it, &rpc->peers) {
        ts_rpc_peer_t *p = TS_CONTAINER_OF(it, ts_rpc_peer_t, node);
        if (strcmp(p->addr, addr) == 0) {
            *out = p;
            return TS_OK;
        }
    }
    char host[256];
    int port;
    int rc = ts_net_parse_addr(addr, host, sizeof host, &port, 0, err, errlen);
    if (rc)
        return rc;
    ts_rpc_peer_t *p = calloc(1, sizeof *p);
    if (!p)
        return TS_ENOMEM;
    p->rpc = rpc;
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    ts_list_init(&p->queue);
    p->next_id = 1; /* we open this connection: odd ids */
    uv_timer_init(ts_net_loop(rpc->net), &p->timer);
    p->timer.data = p;
    rpc->peer_timers++;
    ts_list_push(&rpc->peers, &p->node);
    *out = p;
    return TS_OK;
}

int ts_rpc_peer_connect(ts_rpc_peer_t *p, ts_rpc_peer_cb cb, void *arg) {
    if (!p)
        return TS_EINVAL;
    if (p->rpc->closing)
        return TS_ECLOSED;
    p->waiter = cb;
    p->waiter_arg = arg;
    if (p->state == PEER_OPEN)
        peer_notify(p, TS_OK, "connected");
    else if (p->state == PEER_IDLE)
        peer_connect_now(p);
    return TS_OK;
}

void ts_rpc_peer_info(const ts_rpc_peer_t *p, ts_rpc_peer_info_t *out) { *out = p->info; }

void ts_rpc_peer_expect(ts_rpc_peer_t *p, const ts_node_id_t *id) {
    if (!p)
        return;
    if (!id) {
        p->has_expect = 0;
        return;
    }
    int changed = !p->has_expect || memcmp(p->expect.b, id->b, sizeof id->b) != 0;
    p->has_expect = 1;
    p->expect = *id;
    /* an open connection to another node serves nobody who now expects this one */
    if (changed && p->state == PEER_OPEN && p->sess &&
        memcmp(p->sess->peer_id.b, id->b, sizeof id->b) != 0)
        ts_conn_close(p->conn);
}

int ts_rpc_accept_via(ts_rpc_t *rpc, const char *addr, const uint8_t *preamble, size_t preamble_len,
                      char *err, size_t errlen) {
    if (!rpc || !addr) {
        ts_set_err(err, errlen, "ts_rpc_accept_via: NULL argument");
        return TS_EINVAL;
    }
    if (rpc->closing) {
        ts_set_err(err, errlen, "the RPC endpoint is shutting down");
        return TS_ECLOSED;
    }
    ts_conn_connect_opts_t o = {.preamble = preamble, .preamble_len = preamble_len, .responder = 1};
    ts_conn_t *c;
    /* served as an accepted connection: its data is the endpoint until conn_open */
    return ts_conn_connect_ex(rpc->net, addr, &o, &rpc_handler, rpc, &c, err, errlen);
}

int ts_rpc_call(ts_rpc_peer_t *p, const Tessera__Envelope *req, uint32_t deadline_ms, ts_rpc_cb cb,
                void *arg, ts_rpc_call_t **out, char *err, size_t errlen) {
    if (out)
        *out = NULL;
    if (!p || !req || !cb) {
        ts_set_err(err, errlen, "ts_rpc_call: NULL argument");
        return TS_EINVAL;
    }
    ts_rpc_t *rpc = p->rpc;
    if (rpc->closing) {
        ts_set_err(err, errlen, "the RPC endpoint is shutting down");
        return TS_ECLOSED;
    }
    if (!is_request_kind(req->body_case)) {
        ts_set_err(err, errlen, "%s is not a request", ts_frame_body_name(req->body_case));
        return TS_EINVAL;
    }
    if (p->state == PEER_OPEN && ts_conn_congested(p->conn)) {
        ts_set_err(err, errlen, "the connection to %s is congested", p->addr);
        return TS_EBUSY;
    }
    if (p->state == PEER_BACKOFF && rpc->cfg.fail_fast) {
        ts_set_err(err, errlen, "%s is unreachable (%llu failed attempts, the last: %s)", p->addr,
                   (unsigned long long)p->info.failures, p->last_failure);
        return TS_ECLOSED;
    }
    /* Check it as it will be sent, then pack it without the two header fields. */
    Tessera__Envelope e = *req;
    e.has_request_id = 1;
    e.request_id = p->next_id;
    e.has_deadline_ms = deadline_ms != 0;
    e.deadline_ms = deadline_ms;
    int rc = ts_frame_check_envelope(&e, 0, err, errlen);
    if (rc)
        return TS_EINVAL;
    e.has_request_id = 0;
    e.has_deadline_ms = 0;
    size_t n = protobuf_c_message_get_packed_size(&e.base);
    if (n + 32 > ts_net_config(rpc->net)->max_frame) {
        ts_set_err(err, errlen, "the request is %zu bytes, over max_frame", n);
        return TS_EINVAL;
    }
    ts_rpc_call_t *call = malloc(sizeof *call + n);
    if (!call)
        return TS_ENOMEM;
    memset(call, 0, sizeof *call);
    call->body_len = protobuf_c_message_pack(&e.base, call->body);
    call->rpc = rpc;
    call->peer = p;
    call->id = p->next_id;
    p->next_id += 2;
    call->kind = req->body_case;
    call->cb = cb;
    call->arg = arg;
    call->deadline_ms = deadline_ms;
    call->deadline_at =
        uv_now(ts_net_loop(rpc->net)) + (deadline_ms ? deadline_ms : rpc->cfg.default_timeout_ms);
    ts_list_init(&call->node);
    if (p->state == PEER_IDLE) /* before the call is queued: a connect that fails at once */
        peer_connect_now(p);   /* (out of memory) must not run this call's callback */
    if (p->state == PEER_BACKOFF && rpc->cfg.fail_fast) {
        if (strncmp(p->last_failure, "cannot connect to ", 18) == 0)
            ts_set_err(err, errlen, "%s", p->last_failure);
        else
            ts_set_err(err, errlen, "cannot connect to %s: %s", p->addr, p->last_failure);
        free(call);
        return TS_ECLOSED;
    }
    ts_list_push(&p->queue, &call->node);
    timeouts_insert(rpc, call);
    if (out)
        *out = call;
    if (p->state == PEER_OPEN)
        send_call(p->sess, call);
    return TS_OK;
}

/* ---- answering -------------------------------------------------------------------------------- */

static int request_detached(ts_rpc_request_t *req) {
    int rc = req->cancelled ? TS_ECANCELED : TS_ECLOSED;
    free(req);
    return rc;
}

int ts_rpc_reply(ts_rpc_request_t *req, Tessera__Envelope *resp) {
    if (!req || !resp)
        return TS_EINVAL;
    if (!req->sess)
        return request_detached(req);
    session_t *s = req->sess;
    resp->has_request_id = 1;
    resp->request_id = req->id;
    resp->has_deadline_ms = 0;
    resp->deadline_ms = 0;
    char err[256] = "";
    int rc = send_envelope(s, resp, err, sizeof err);
    if (rc && rc != TS_ECLOSED && rc != TS_ENOMEM) { /* the handler built a bad answer */
        char msg[320];
        snprintf(msg, sizeof msg, "the server built an invalid answer: %s", err);
        send_error(s, req->id, TESSERA__ERROR_CODE__ERROR_INTERNAL, msg);
        s->rpc->st.errors[req->kind]++;
        rc = TS_EINVAL;
    }
    request_free(req);
    return rc;
}

int ts_rpc_reply_error(ts_rpc_request_t *req, Tessera__ErrorCode code, const char *fmt, ...) {
    if (!req)
        return TS_EINVAL;
    if (!req->sess)
        return request_detached(req);
    char msg[TS_FRAME_MESSAGE_MAX + 1] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    req->sess->rpc->st.errors[req->kind]++;
    int rc = send_error(req->sess, req->id, code, msg);
    request_free(req);
    return rc;
}

int ts_rpc_reply_busy(ts_rpc_request_t *req, uint32_t retry_after_ms) {
    if (!req)
        return TS_EINVAL;
    if (!req->sess)
        return request_detached(req);
    req->sess->rpc->st.busy[req->kind]++;
    int rc = send_busy(req->sess, req->id, retry_after_ms);
    request_free(req);
    return rc;
}

int ts_rpc_request_send(ts_rpc_request_t *req, const Tessera__Envelope *env, char *err,
                        size_t errlen) {
    if (!req || !env || !is_oneway_kind(env->body_case)) {
        ts_set_err(err, errlen, "ts_rpc_request_send: NULL argument, or not a one-way kind");
        return TS_EINVAL;
    }
    if (!req->sess) {
        ts_set_err(err, errlen, "the request's connection is gone");
        return TS_ECLOSED;
    }
    if (ts_conn_congested(req->sess->conn)) {
        ts_set_err(err, errlen, "the request's connection is congested");
        return TS_EBUSY;
    }
    return send_envelope(req->sess, env, err, errlen);
}

void ts_rpc_stats(const ts_rpc_t *rpc, ts_rpc_stats_t *out) {
    if (rpc && out)
        *out = rpc->st;
}

void ts_rpc_request_on_cancel(ts_rpc_request_t *req, void (*fn)(ts_rpc_request_t *, void *),
                              void *arg) {
    if (!req)
        return;
    req->on_cancel = fn;
    req->cancel_arg = arg;
}

uint64_t ts_rpc_request_deadline(const ts_rpc_request_t *req) { return req->deadline_at; }

int ts_rpc_request_expired(const ts_rpc_request_t *req) {
    return req->deadline_at && req->sess &&
           uv_now(ts_net_loop(req->sess->rpc->net)) >= req->deadline_at;
}

const ts_node_id_t *ts_rpc_request_peer(const ts_rpc_request_t *req) { return &req->peer_id; }
uint64_t ts_rpc_request_id(const ts_rpc_request_t *req) { return req->id; }

/* The built-in liveness answer: ack a ping meant for this node. */
static void default_ping(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    const ts_node_id_t *self = ts_net_node_id(req->sess->rpc->net);
    if (memcmp(env->ping->target_id.data, self->b, TS_NODE_ID_BYTES) != 0) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT,
                           "this ping is meant for another node");
        return;
    }
    Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
    Tessera__Ack ack = TESSERA__ACK__INIT;
    out.body_case = TESSERA__ENVELOPE__BODY_ACK;
    out.ack = &ack;
    ts_rpc_reply(req, &out);
}

/* ---- listening and shutting down -------------------------------------------------------------- */

int ts_rpc_listen(ts_rpc_t *rpc, const char *addr, ts_listener_t **out, char *err, size_t errlen) {
    if (!rpc) {
        ts_set_err(err, errlen, "ts_rpc_listen: NULL argument");
        return TS_EINVAL;
    }
    return ts_net_listen(rpc->net, addr, &rpc_handler, rpc, out, err, errlen);
}

static void peer_timer_closed(uv_handle_t *h) {
    ts_rpc_peer_t *p = h->data;
    p->rpc->peer_timers--;
    free(p);
}

static void rpc_timer_closed(uv_handle_t *h) {
    ts_rpc_t *rpc = h->data;
    rpc->timer_open = 0;
}

void ts_rpc_shutdown(ts_rpc_t *rpc) {
    if (!rpc || rpc->closing)
        return;
    /* Queued calls first, while the endpoint still works for their callbacks. */
    TS_LIST_FOREACH(it, &rpc->peers) {
        ts_rpc_peer_t *p = TS_CONTAINER_OF(it, ts_rpc_peer_t, node);
        while (!ts_list_empty(&p->queue))
            finish_call(TS_CONTAINER_OF(p->queue.next, ts_rpc_call_t, node), TS_ECLOSED, NULL, 0,
                        "the RPC endpoint is shutting down");
        peer_notify(p, TS_ECLOSED, "the RPC endpoint is shutting down");
    }
    rpc->closing = 1;
    uv_close((uv_handle_t *)&rpc->timer, rpc_timer_closed);
    while (!ts_list_empty(&rpc->peers)) {
        ts_rpc_peer_t *p = TS_CONTAINER_OF(rpc->peers.next, ts_rpc_peer_t, node);
        ts_list_remove(&p->node);
        if (p->sess)
            p->sess->peer = NULL; /* its session ends with the connection, later */
        uv_close((uv_handle_t *)&p->timer, peer_timer_closed);
    }
    ts_net_shutdown(rpc->net);
}

int ts_rpc_free(ts_rpc_t *rpc) {
    if (!rpc)
        return TS_OK;
    if (rpc->sessions || rpc->peer_timers || rpc->timer_open)
        return TS_EBUSY;
    free(rpc);
    return TS_OK;
}
