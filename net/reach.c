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

/* At most this many dials at once, and one per address (the RPC layer keeps one connect waiter
 * per peer): a request over either is answered ERROR_UNAVAILABLE, which the asker retries. */
#define REACH_MAX_DIALS 8

struct ts_reach {
    ts_rpc_t *rpc;
    int n;
    char addr[REACH_MAX_DIALS][TS_FRAME_ADDR_MAX + 1];
};

typedef struct {
    ts_reach_t *r;
    int slot;
    ts_rpc_request_t *req;
    ts_node_id_t asker;
} dial_t;

static void release_slot(ts_reach_t *r, int slot) {
    r->addr[slot][0] = '\0';
    r->n--;
}

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
    release_slot(d->r, d->slot);
    if (status == TS_ENOMEM ||
        (status == TS_ECLOSED && message && strstr(message, "shutting down"))) {
        /* this node's own trouble, not the asker's reachability */
        ts_rpc_reply_error(d->req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE, "%s",
                           message && *message ? message : ts_strerror(status));
    } else if (status != TS_OK) {
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
    ts_reach_t *r = arg;
    const char *addr = env->dial_back_request->addr;
    int slot = -1;
    for (int i = 0; i < REACH_MAX_DIALS; i++) {
        if (strcmp(r->addr[i], addr) == 0) {
            ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                               "%s is being dialled already; ask again", addr);
            return;
        }
        if (slot < 0 && !r->addr[i][0])
            slot = i;
    }
    dial_t *d = slot >= 0 ? calloc(1, sizeof *d) : NULL;
    if (!d) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           slot < 0 ? "too many dial-backs at once; ask again" : "out of memory");
        return;
    }
    ts_rpc_peer_t *p = NULL;
    char err[256] = "";
    if (ts_rpc_peer_get(r->rpc, addr, &p, err, sizeof err) != TS_OK) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE, "%s",
                           err[0] ? err : "this node cannot dial now");
        free(d);
        return;
    }
    snprintf(r->addr[slot], sizeof r->addr[slot], "%s", addr);
    r->n++;
    *d = (dial_t){.r = r, .slot = slot, .req = req};
    memcpy(&d->asker, ts_rpc_request_peer(req), sizeof d->asker);
    if (ts_rpc_peer_connect(p, on_dialled, d) != TS_OK) {
        release_slot(r, slot);
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE,
                           "this node cannot open a connection now");
        free(d);
    }
}

int ts_reach_serve(ts_rpc_t *rpc, ts_reach_t **out) {
    if (!rpc || !out)
        return TS_EINVAL;
    ts_reach_t *r = calloc(1, sizeof *r);
    if (!r)
        return TS_ENOMEM;
    r->rpc = rpc;
    int rc = ts_rpc_handle(rpc, TESSERA__ENVELOPE__BODY_DIAL_BACK_REQUEST, on_request, r);
    if (rc != TS_OK) {
        free(r);
        return rc;
    }
    *out = r;
    return TS_OK;
}

void ts_reach_free(ts_reach_t *r) { free(r); }

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
