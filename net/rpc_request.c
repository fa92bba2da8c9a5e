/*
 * rpc_request.c — the requests this side receives (net/rpc.h): each is dispatched to the handler
 * of its kind, or refused at once (busy over cfg.max_pending_in or on a congested connection,
 * unsupported without a handler); it stays in its session's `in` list until it is answered
 * exactly once (ts_rpc_reply, _error, _busy), cancelled by the requester, or detached when the
 * connection closes — an answer to a detached request frees it and sends nothing.
 */
#define _POSIX_C_SOURCE 200809L /* uv.h needs POSIX types (pthread_rwlock_t, addrinfo) */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/list.h"
#include "net/frame.h"
#include "net/rpc.h"
#include "net/rpc_internal.h"

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

int ts_rpc__send_error(session_t *s, uint64_t id, Tessera__ErrorCode code, const char *message) {
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

void ts_rpc__on_request(session_t *s, const Tessera__Envelope *env) {
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
        ts_rpc__send_error(s, id, TESSERA__ERROR_CODE__ERROR_UNSUPPORTED, msg);
        return;
    }
    ts_rpc_request_t *r = calloc(1, sizeof *r);
    if (!r) {
        rpc->st.errors[k]++;
        ts_rpc__send_error(s, id, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
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

void ts_rpc__on_cancel(session_t *s, uint64_t id) {
    TS_LIST_FOREACH(it, &s->in) {
        ts_rpc_request_t *r = TS_CONTAINER_OF(it, ts_rpc_request_t, node);
        if (r->id != id)
            continue;
        ts_list_remove(&r->node);
        s->n_in--;
        session_update_pending(s);
        r->sess = NULL;
        r->cancelled = 1;
        ts_rpc__send_error(s, id, TESSERA__ERROR_CODE__ERROR_CANCELLED,
                           "cancelled by the requester");
        if (r->on_cancel)
            r->on_cancel(r, r->cancel_arg);
        return;
    }
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
        ts_rpc__send_error(s, req->id, TESSERA__ERROR_CODE__ERROR_INTERNAL, msg);
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
    int rc = ts_rpc__send_error(req->sess, req->id, code, msg);
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
