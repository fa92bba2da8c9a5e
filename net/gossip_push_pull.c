/*
 * gossip_push_pull.c — the gossip driver's push-pull (gossip_internal.h), over the RPC pool.
 *
 * A join (to a seed's address: we know nobody yet) exchanges full states: the push_pull call
 * carries ours, the handler merges it and answers with its own, which the caller merges.
 * Anti-entropy with a member exchanges digests (swim.h, "Push-pull by digests"): the call carries
 * our digest (2 KiB); the handler answers with a diff — the mask of the buckets whose hashes
 * differ and its members in them; the caller merges those and, when the mask is not empty, sends
 * its own members in the same buckets as a second push_pull (a diff), which the handler merges
 * and answers with an empty diff. Two nodes that agree exchange 2 KiB and an empty diff, whatever
 * the network's size. Every state, digest and diff is refused unless its sender is the node the
 * handshake proved. At most MAX_PUSH_PULLS run at once; the core retries joins and anti-entropy
 * on its own timers.
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

/* A diff of our members in mask's buckets, swim_wire-encoded into a malloc'd buffer. */
static uint8_t *export_diff(ts_gossip_t *g, const uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES],
                            size_t *len) {
    uint32_t n = ts_swim_state_export_buckets(g->swim, mask, g->members, g->cfg.swim.max_members);
    size_t cap = ts_swim_wire_diff_size(g->members, n);
    uint8_t *buf = malloc(cap);
    if (buf && ts_swim_wire_encode_diff(g->self.b, mask, g->members, n, buf, cap, len) != TS_OK) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* Decodes a peer's diff into g->members and mask, checking its sender as import_state does. */
static int import_diff(ts_gossip_t *g, const ProtobufCBinaryData *state, const uint8_t *peer,
                       uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES], uint32_t *n, char *err,
                       size_t errlen) {
    uint8_t from[TS_SWIM_ID_LEN];
    if (state->len > g->cfg.max_state_bytes) {
        ts_set_err(err, errlen, "a push-pull diff of %zu bytes, more than %u", state->len,
                   (unsigned)g->cfg.max_state_bytes);
        return -1;
    }
    int rc = ts_swim_wire_decode_diff(state->data, state->len, from, mask, g->members,
                                      g->cfg.swim.max_members, n);
    if (rc != TS_OK || memcmp(from, peer, TS_SWIM_ID_LEN) != 0) {
        ts_set_err(err, errlen, "the push-pull diff %s",
                   rc != TS_OK ? "does not decode" : "is not the connection's peer's");
        return -1;
    }
    return 0;
}

static int mask_empty(const uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES]) {
    for (int i = 0; i < TS_SWIM_DIGEST_MASK_BYTES; i++)
        if (mask[i])
            return 0;
    return 1;
}

/* The answer to our diff (the exchange's second leg): an empty diff, which says nothing. */
static void on_diff_sent(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    op_t *op = arg;
    ts_gossip_t *g = op->g;
    if (!g->closing && res->status != TS_OK)
        g->st.pushpull_failed++;
    ts_gossip__op_free(op);
}

/* The answer to our digest: the peer's members where we differ; merged, then ours sent back. */
static void digest_answered(ts_gossip_t *g, op_t *op, const ts_rpc_peer_info_t *info,
                            const ProtobufCBinaryData *state) {
    uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES];
    uint32_t n;
    if (import_diff(g, state, info->node_id.b, mask, &n, NULL, 0) != 0) {
        g->st.pushpull_failed++;
        ts_gossip__op_free(op);
        return;
    }
    g->st.pushpull_ok++;
    ts_swim_merge_state(g->swim, now_ms(g), info->node_id.b, g->members, n);
    ts_gossip__pump(g);
    size_t len;
    uint8_t *diff = mask_empty(mask) ? NULL : export_diff(g, mask, &len);
    if (!diff) {
        ts_gossip__op_free(op);
        return;
    }
    Tessera__PushPull pp;
    Tessera__Envelope env;
    push_pull_envelope(&env, &pp, diff, len);
    op->call = NULL;
    if (ts_rpc_call(op->peer, &env, g->cfg.pushpull_timeout_ms, on_diff_sent, op, &op->call, NULL,
                    0) != TS_OK) {
        g->st.pushpull_failed++;
        ts_gossip__op_free(op);
    }
    free(diff);
}

static void on_push_pull_done(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    op_t *op = arg;
    ts_gossip_t *g = op->g;
    ts_rpc_peer_info_t info;
    ts_rpc_peer_info(op->peer, &info);
    uint32_t n;
    if (!g->closing && res->status == TS_OK && info.has_node_id &&
        ts_swim_wire_tcp_type(res->reply->push_pull->state.data,
                              res->reply->push_pull->state.len) == 8) {
        digest_answered(g, op, &info, &res->reply->push_pull->state);
        return;
    }
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
    uint8_t *state;
    if (id_is_zero(ev->id) || g->cfg.full_push_pull) { /* a join: we know nobody yet */
        state = export_state(g, id_is_zero(ev->id), &len);
    } else {
        ts_swim_digest_t d;
        ts_swim_state_digest(g->swim, &d);
        state = malloc(TS_SWIM_WIRE_DIGEST);
        if (state &&
            ts_swim_wire_encode_digest(g->self.b, &d, state, TS_SWIM_WIRE_DIGEST, &len) != TS_OK) {
            free(state);
            state = NULL;
        }
        g->st.pushpull_digests++;
    }
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

/* A digest: answered with our members where the digests differ. A diff (the second leg):
 * merged, answered with an empty diff. */
static void serve_digest_or_diff(ts_gossip_t *g, ts_rpc_request_t *req, const ts_node_id_t *peer,
                                 const ProtobufCBinaryData *in, int type, char *err,
                                 size_t errlen) {
    uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES];
    if (type == 7) {
        ts_swim_digest_t theirs, ours;
        uint8_t from[TS_SWIM_ID_LEN];
        if (ts_swim_wire_decode_digest(in->data, in->len, from, &theirs) != TS_OK ||
            memcmp(from, peer->b, TS_SWIM_ID_LEN) != 0) {
            ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT,
                               "the push-pull digest does not decode, or is not the peer's");
            return;
        }
        ts_swim_state_digest(g->swim, &ours);
        g->st.pushpull_buckets += ts_swim_digest_diff(&theirs, &ours, mask);
    } else {
        uint32_t n;
        if (import_diff(g, in, peer->b, mask, &n, err, errlen) != 0) {
            ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INVALID_ARGUMENT, "%s", err);
            return;
        }
        ts_swim_merge_state(g->swim, now_ms(g), peer->b, g->members, n);
        ts_gossip__pump(g);
        memset(mask, 0, sizeof mask);
    }
    size_t len;
    uint8_t *diff = export_diff(g, mask, &len);
    if (!diff) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    Tessera__PushPull pp;
    Tessera__Envelope out;
    push_pull_envelope(&out, &pp, diff, len);
    ts_rpc_reply(req, &out);
    free(diff);
    g->st.pushpull_served++;
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
    const ProtobufCBinaryData *in = &env->push_pull->state;
    int type = ts_swim_wire_tcp_type(in->data, in->len);
    if (type == 7 || type == 8) {
        serve_digest_or_diff(g, req, peer, in, type, err, sizeof err);
        return;
    }
    if (import_state(g, in, peer->b, &n, err, sizeof err) != 0) {
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
