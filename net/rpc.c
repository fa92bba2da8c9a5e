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
 * Finishing a call (ts_rpc__finish_call) unlinks it from everything before its callback runs, so the
 * callback may do anything — start calls, cancel others, shut down — and a late answer finds no
 * call and is ignored.
 *
 * The code is in three files sharing rpc_internal.h: this one (the endpoint, calls and their
 * deadlines, sessions, the frames a connection receives, shutdown), rpc_peer.c (the pool: a peer
 * per address, its connection, the backoff between attempts) and rpc_request.c (the requests this
 * side receives and their answers).
 */
#define _POSIX_C_SOURCE 200809L /* uv.h needs POSIX types (pthread_rwlock_t, addrinfo) */

#include "net/rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/list.h"
#include "net/frame.h"
#include "net/rpc_internal.h"

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
    case TESSERA__ENVELOPE__BODY_ACCUSATION: return TESSERA__ENVELOPE__BODY_ACCUSATION_VERDICT;
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

int ts_rpc__is_request_kind(Tessera__Envelope__BodyCase k) {
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

/* ---- the endpoint ----------------------------------------------------------------------------- */

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
    if (!rpc || !ts_rpc__is_request_kind(kind))
        return TS_EINVAL;
    rpc->handlers[kind].fn = fn;
    rpc->handlers[kind].arg = arg;
    return TS_OK;
}

int ts_rpc_handle_oneway(ts_rpc_t *rpc, Tessera__Envelope__BodyCase kind, ts_rpc_oneway_fn fn,
                         void *arg) {
    if (!rpc || !is_oneway_kind(kind))
        return TS_EINVAL;
    rpc->oneway[kind].fn = fn;
    rpc->oneway[kind].arg = arg;
    return TS_OK;
}

ts_net_t *ts_rpc_net(const ts_rpc_t *rpc) { return rpc->net; }

void ts_rpc_set_fail_fast(ts_rpc_t *rpc, int on) {
    if (rpc)
        rpc->cfg.fail_fast = on != 0;
}

void ts_rpc_stats(const ts_rpc_t *rpc, ts_rpc_stats_t *out) {
    if (rpc && out)
        *out = rpc->st;
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

void ts_rpc__timeouts_insert(ts_rpc_t *rpc, ts_rpc_call_t *call) {
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
void ts_rpc__finish_call(ts_rpc_call_t *call, int status, const Tessera__Envelope *reply,
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
        ts_rpc__finish_call(call, TS_ETIMEDOUT, NULL, 0, msg);
    }
    rearm(rpc);
}

void ts_rpc_cancel(ts_rpc_call_t *call) {
    if (!call)
        return;
    if (call->sess)
        send_cancel(call->sess, call->id);
    ts_rpc__finish_call(call, TS_ECANCELED, NULL, 0, "cancelled by this side");
}

/* ---- sending calls ---------------------------------------------------------------------------- */

/* Writes the call on the session's connection: header (id, what is left of the deadline) in
 * front of the packed body. */
void ts_rpc__send_call(session_t *s, ts_rpc_call_t *call) {
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
        ts_rpc__finish_call(call, rc == TS_ECLOSED ? TS_ECLOSED : rc, NULL, 0,
                            "the connection failed while sending the request");
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
    if (!ts_rpc__is_request_kind(req->body_case)) {
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
    /* the loop's clock as of now: a caller may have computed for seconds since the loop last
     * looked, and a deadline from that stale time would pass at the loop's next turn */
    uv_update_time(ts_net_loop(rpc->net));
    call->deadline_at =
        uv_now(ts_net_loop(rpc->net)) + (deadline_ms ? deadline_ms : rpc->cfg.default_timeout_ms);
    ts_list_init(&call->node);
    if (p->state == PEER_IDLE)       /* before the call is queued: a connect that fails at once */
        ts_rpc__peer_connect_now(p); /* (out of memory) must not run this call's callback */
    if (p->state == PEER_BACKOFF && rpc->cfg.fail_fast) {
        if (strncmp(p->last_failure, "cannot connect to ", 18) == 0)
            ts_set_err(err, errlen, "%s", p->last_failure);
        else
            ts_set_err(err, errlen, "cannot connect to %s: %s", p->addr, p->last_failure);
        free(call);
        return TS_ECLOSED;
    }
    ts_list_push(&p->queue, &call->node);
    ts_rpc__timeouts_insert(rpc, call);
    if (out)
        *out = call;
    if (p->state == PEER_OPEN)
        ts_rpc__send_call(p->sess, call);
    return TS_OK;
}

/* ---- sessions --------------------------------------------------------------------------------- */

session_t *ts_rpc__session_new(ts_rpc_t *rpc, ts_rpc_peer_t *peer) {
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
void ts_rpc__session_end(session_t *s, const char *why) {
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
        ts_rpc__finish_call(TS_CONTAINER_OF(s->out.next, ts_rpc_call_t, node), TS_ECLOSED, NULL, 0,
                            why);
    rpc->sessions--;
    free(s);
}

/* ---- incoming frames -------------------------------------------------------------------------- */

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
        ts_rpc__finish_call(call, TS_EPEER, env, code, msg);
        return;
    }
    case TESSERA__ENVELOPE__BODY_BUSY:
        snprintf(msg, sizeof msg, "%s is busy (retry after %u ms)", call->peer->addr,
                 (unsigned)env->busy->retry_after_ms);
        ts_rpc__finish_call(call, TS_EBUSY, env, 0, msg);
        return;
    default:
        if (!answers(call->kind, env->body_case)) {
            snprintf(msg, sizeof msg, "%s answered %s with %s", call->peer->addr,
                     ts_frame_body_name(call->kind), ts_frame_body_name(env->body_case));
            ts_rpc__finish_call(call, TS_ECORRUPT, NULL, 0, msg);
            return;
        }
        ts_rpc__finish_call(call, TS_OK, env, 0, "ok");
    }
}

void ts_rpc__conn_frame(ts_conn_t *c, const uint8_t *data, size_t len) {
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
        int request = peers_id && (ts_rpc__is_request_kind(env->body_case) ||
                                   env->body_case == TESSERA__ENVELOPE__BODY__NOT_SET);
        if (request && env->body_case > 0 && env->body_case < TS_RPC_KINDS) {
            s->rpc->st.requests[env->body_case]++;
            s->rpc->st.errors[env->body_case]++;
        } else if (request) {
            s->rpc->st.malformed++;
        }
        if (request)
            ts_rpc__send_error(s, id,
                               rc == TS_ENOTSUP ? TESSERA__ERROR_CODE__ERROR_UNSUPPORTED
                                                : TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT,
                               err);
        ts_frame_free(env);
        return;
    }
    Tessera__Envelope__BodyCase k = env->body_case;
    if (k == TESSERA__ENVELOPE__BODY_CANCEL) {
        ts_rpc__on_cancel(s, env->cancel->request_id);
    } else if (is_oneway_kind(k)) {
        s->rpc->st.oneway[k]++;
        if (s->rpc->oneway[k].fn)
            s->rpc->oneway[k].fn(c, &s->peer_id, env, s->rpc->oneway[k].arg);
    } else if (ts_rpc__is_request_kind(k) && (k != TESSERA__ENVELOPE__BODY_PUSH_PULL || peers_id)) {
        if (!peers_id) {
            snprintf(err, sizeof err, "request %llu has the wrong parity for its sender",
                     (unsigned long long)id);
            ts_frame_free(env);
            ts_conn_close_protocol(c, err);
            return;
        }
        ts_rpc__on_request(s, env);
    } else if (id != 0) {
        on_answer(s, env);
    }
    ts_frame_free(env);
}

/* ---- listening and shutting down -------------------------------------------------------------- */

int ts_rpc_listen(ts_rpc_t *rpc, const char *addr, ts_listener_t **out, char *err, size_t errlen) {
    if (!rpc) {
        ts_set_err(err, errlen, "ts_rpc_listen: NULL argument");
        return TS_EINVAL;
    }
    return ts_net_listen(rpc->net, addr, &ts_rpc__handler, rpc, out, err, errlen);
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
    if (!rpc || rpc->closing || rpc->shutting)
        return;
    /* a finished call's callback may shut down too (a client stopping on its error): that
     * nested call must not walk the peers this one is walking */
    rpc->shutting = 1;
    /* Queued calls first, while the endpoint still works for their callbacks. */
    TS_LIST_FOREACH(it, &rpc->peers) {
        ts_rpc_peer_t *p = TS_CONTAINER_OF(it, ts_rpc_peer_t, node);
        while (!ts_list_empty(&p->queue))
            ts_rpc__finish_call(TS_CONTAINER_OF(p->queue.next, ts_rpc_call_t, node), TS_ECLOSED,
                                NULL, 0, "the RPC endpoint is shutting down");
        ts_rpc__peer_notify(p, TS_ECLOSED, "the RPC endpoint is shutting down");
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
