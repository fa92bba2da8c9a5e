/*
 * gossip_push_pull.c — the gossip driver's push-pull (gossip_internal.h): on the core's request,
 * a push_pull call carries our exported state over the RPC pool to the member (for a join,
 * to the seed's address); the handler decodes the peer's state, refuses one whose sender is not
 * the node the handshake proved, merges it and answers with its own, which the caller merges in
 * turn. At most MAX_PUSH_PULLS run at once; the core retries joins and anti-entropy on its own
 * timers.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "net/gossip_internal.h"
#include "net/swim_wire.h"

#define MAX_PUSH_PULLS 8 /* push-pull exchanges in flight */

/* ---- push-pull ------------------------------------------------------------------------------ */

static int id_is_zero(const uint8_t id[TS_SWIM_ID_LEN]) {
    static const uint8_t zero[TS_SWIM_ID_LEN];
    return memcmp(id, zero, TS_SWIM_ID_LEN) == 0;
}

/* Our full state, swim_wire-encoded into a malloc'd buffer. */
static uint8_t *export_state(ts_gossip_t *g, bool join, size_t *len) {
    uint32_t n = ts_swim_state_export(g->swim, g->members, g->cfg.swim.max_members);
    size_t cap = ts_swim_wire_state_size(g->members, n);
    uint8_t *buf = malloc(cap);
    if (buf && ts_swim_wire_encode_state(g->self.b, join, g->members, n, buf, cap, len) != TS_OK) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* Decodes a peer's state into g->members and checks that its sender is peer (the id the
 * handshake proved); returns the member count, or -1 with err. */
static int import_state(ts_gossip_t *g, const ProtobufCBinaryData *state, const uint8_t *peer,
                        uint32_t *n, char *err, size_t errlen) {
    uint8_t from[TS_SWIM_ID_LEN];
    bool join;
    if (state->len > g->cfg.max_state_bytes) {
        ts_set_err(err, errlen, "a push-pull state of %zu bytes, more than %u", state->len,
                   (unsigned)g->cfg.max_state_bytes);
        return -1;
    }
    int rc = ts_swim_wire_decode_state(state->data, state->len, from, &join, g->members,
                                       g->cfg.swim.max_members, n);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "the push-pull state does not decode (%s)", ts_strerror(rc));
        return -1;
    }
    if (memcmp(from, peer, TS_SWIM_ID_LEN) != 0) {
        ts_set_err(err, errlen, "the push-pull state is not the connection's peer's");
        return -1;
    }
    return 0;
}

/* env holding pp holding state[0..len) (both read only while env is sent). */
static void push_pull_envelope(Tessera__Envelope *env, Tessera__PushPull *pp, uint8_t *state,
                               size_t len) {
    tessera__push_pull__init(pp);
    pp->has_state = 1;
    pp->state.data = state;
    pp->state.len = len;
    tessera__envelope__init(env);
    env->body_case = TESSERA__ENVELOPE__BODY_PUSH_PULL;
    env->push_pull = pp;
}

static void on_push_pull_done(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    op_t *op = arg;
    ts_gossip_t *g = op->g;
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(op->peer, &info);
    uint32_t n;
    if (g->closing || res->status != TS_OK || !info.has_node_id ||
        import_state(g, &res->reply->push_pull->state, info.node_id.b, &n, NULL, 0) != 0) {
        if (!g->closing)
            g->st.pushpull_failed++;
        ts_gossip__op_free(op);
        return;
    }
    ts_gossip__op_free(op);
    g->st.pushpull_ok++;
    ts_swim_merge_state(g->swim, now_ms(g), info.node_id.b, g->members, n);
    ts_gossip__pump(g);
}

void ts_gossip__start_push_pull(ts_gossip_t *g, const ts_swim_event_t *ev) {
    op_t *op;
    if (g->n_push_pulls >= MAX_PUSH_PULLS || !(op = ts_gossip__op_new(g, OP_PUSH_PULL, ev->id))) {
        g->st.pushpull_failed++;
        return;
    }
    size_t len;
    uint8_t *state = export_state(g, id_is_zero(ev->id), &len);
    if (!state) {
        ts_gossip__op_free(op);
        g->st.pushpull_failed++;
        return;
    }
    Tessera__PushPull pp;
    Tessera__Envelope env;
    push_pull_envelope(&env, &pp, state, len);
    if (ts_gossip__op_call(op, &ev->addr, &env, g->cfg.pushpull_timeout_ms, on_push_pull_done) != 0)
        g->st.pushpull_failed++;
    free(state);
}

void ts_gossip__serve_push_pull(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_gossip_t *g = arg;
    if (!g->swim || g->closing) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE, "gossip is not running");
        return;
    }
    const ts_node_id_t *peer = ts_rpc_request_peer(req);
    char err[160];
    uint32_t n;
    if (import_state(g, &env->push_pull->state, peer->b, &n, err, sizeof err) != 0) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT, "%s", err);
        return;
    }
    ts_swim_merge_state(g->swim, now_ms(g), peer->b, g->members, n);
    ts_gossip__pump(g);
    size_t len;
    uint8_t *state = export_state(g, false, &len);
    if (!state) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    Tessera__PushPull pp;
    Tessera__Envelope out;
    push_pull_envelope(&out, &pp, state, len);
    ts_rpc_reply(req, &out);
    free(state);
    g->st.pushpull_served++;
}
