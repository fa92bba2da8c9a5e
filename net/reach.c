/* reach.c — dialling a node back at the address it advertises (reach.h). */
#define _POSIX_C_SOURCE 200809L

#include "net/reach.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/str.h"
#include "net/frame.h"

/* ---- the dialling side ---------------------------------------------------------------------- */

typedef struct {
    ts_rpc_request_t *req;
    ts_node_id_t asker;
} dial_t;

static void answer(ts_rpc_request_t *req, int reachable, const char *message) {
    Tessera__DialBackResponse r = TESSERA__DIAL_BACK_RESPONSE__INIT;
    r.has_reachable = 1;
    r.reachable = reachable != 0;
    r.message = (char *)message;
    Tessera__Envelope e = TESSERA__ENVELOPE__INIT;
    e.body_case = TESSERA__ENVELOPE__BODY_DIAL_BACK_RESPONSE;
    e.dial_back_response = &r;
    ts_rpc_reply(req, &e);
}

static void on_dialled(ts_rpc_peer_t *p, int status, const char *message, void *arg) {
    dial_t *d = arg;
    char text[512];
    if (status != TS_OK) {
        snprintf(text, sizeof text, "the connection failed: %s",
                 message && *message ? message : ts_strerror(status));
        answer(d->req, 0, text);
    } else {
        ts_rpc_peer_info_t info;
        ts_rpc_peer_info(p, &info);
        if (info.has_node_id && memcmp(info.node_id.b, d->asker.b, sizeof d->asker.b) == 0) {
            answer(d->req, 1, "reached, and the handshake proved the same node");
        } else {
            char who[17] = "?";
            if (info.has_node_id)
                ts_hex(info.node_id.b, 8, who);
            snprintf(text, sizeof text, "another node answers at that address (%s)", who);
            answer(d->req, 0, text);
        }
    }
    free(d);
}

static void on_request(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_rpc_t *rpc = arg;
    const char *addr = env->dial_back_request->addr;
    ts_rpc_peer_t *p = NULL;
    char err[256] = "";
    dial_t *d = calloc(1, sizeof *d);
    if (!d) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE, "out of memory");
        return;
    }
    d->req = req;
    memcpy(&d->asker, ts_rpc_request_peer(req), sizeof d->asker);
    if (ts_rpc_peer_get(rpc, addr, &p, err, sizeof err) != TS_OK) {
        answer(req, 0, err[0] ? err : "not an address this node can dial");
        free(d);
        return;
    }
    if (ts_rpc_peer_connect(p, on_dialled, d) != TS_OK) {
        answer(req, 0, "this node cannot open a connection now");
        free(d);
    }
}

int ts_reach_serve(ts_rpc_t *rpc) {
    return ts_rpc_handle(rpc, TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST, on_request, rpc);
}

/* ---- the asking side ------------------------------------------------------------------------ */

typedef struct {
    ts_reach_cb cb;
    void *arg;
} ask_t;

static void on_answer(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    ask_t *a = arg;
    if (res->status == TS_OK && res->reply &&
        res->reply->body_case == TESSERA__ENVELOPE__BODY_DIAL_BACK_RESPONSE) {
        const Tessera__DialBackResponse *r = res->reply->dial_back_response;
        a->cb(a->arg, r->reachable ? 1 : 0, r->message ? r->message : "");
    } else {
        char why[512];
        snprintf(why, sizeof why, "the checker could not be asked: %s",
                 res->message && *res->message ? res->message : ts_strerror(res->status));
        a->cb(a->arg, -1, why);
    }
    free(a);
}

int ts_reach_check(ts_rpc_t *rpc, const char *checker, const char *self, uint32_t timeout_ms,
                   ts_reach_cb cb, void *arg, char *err, size_t errlen) {
    if (!rpc || !checker || !self || !cb)
        return TS_EINVAL;
    ts_rpc_peer_t *p = NULL;
    int rc = ts_rpc_peer_get(rpc, checker, &p, err, errlen);
    if (rc != TS_OK)
        return rc;
    ask_t *a = calloc(1, sizeof *a);
    if (!a)
        return TS_ENOMEM;
    a->cb = cb, a->arg = arg;
    Tessera__DialBackRequest q = TESSERA__DIAL_BACK_REQUEST__INIT;
    q.addr = (char *)self;
    Tessera__Envelope e = TESSERA__ENVELOPE__INIT;
    e.body_case = TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST;
    e.dial_back_request = &q;
    rc = ts_rpc_call(p, &e, timeout_ms, on_answer, a, NULL, err, errlen);
    if (rc != TS_OK)
        free(a);
    return rc;
}
