/*
 * gossip_advert.c — the gossip driver's adverts (gossip_internal.h). Ours is checked, signed
 * (tessera/advert/1), hashed and announced through the core, whose alive claim carries its
 * (version, hash); a member's newer one, which the core reports, is fetched from it over RPC
 * and kept only when its signature, node id, hash and version agree with the member's signed
 * claim. The housekeeper retries the fetches that failed (ts_gossip__reconcile_adverts), and
 * the advert_request handler serves every advert held.
 */
#define _POSIX_C_SOURCE 200809L

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "net/frame.h"
#include "net/gossip_internal.h"

#define MAX_FETCHES 32 /* advert fetches in flight */

/* ---- signatures ----------------------------------------------------------------------------- */

/* The bytes an advert's signature covers: context ‖ 0x00 ‖ node_id ‖ body (protocol.md §9).
 * Returns a malloc'd buffer of *len bytes, or NULL. */
static uint8_t *advert_signed_bytes(const uint8_t id[TS_SWIM_ID_LEN], const uint8_t *body,
                                    size_t body_len, size_t *len) {
    size_t ctx = sizeof TS_FRAME_CONTEXT_ADVERT; /* the context and its NUL: the 0x00 byte */
    uint8_t *m = malloc(ctx + TS_SWIM_ID_LEN + body_len);
    if (!m)
        return NULL;
    memcpy(m, TS_FRAME_CONTEXT_ADVERT, ctx);
    memcpy(m + ctx, id, TS_SWIM_ID_LEN);
    memcpy(m + ctx + TS_SWIM_ID_LEN, body, body_len);
    *len = ctx + TS_SWIM_ID_LEN + body_len;
    return m;
}

/* ---- adverts -------------------------------------------------------------------------------- */

advert_t *ts_gossip__advert_find(const ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    for (uint32_t i = 0; i < g->n_adverts; i++)
        if (memcmp(g->adverts[i].id, id, TS_SWIM_ID_LEN) == 0)
            return &g->adverts[i];
    return NULL;
}

void ts_gossip__advert_clear(advert_t *a) {
    free(a->packed);
    if (a->msg)
        tessera__advert__free_unpacked(a->msg, NULL);
    ts_frame_free(a->body);
    memset(a, 0, sizeof *a);
}

void ts_gossip__advert_drop(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    advert_t *a = ts_gossip__advert_find(g, id);
    if (!a)
        return;
    ts_gossip__advert_clear(a);
    *a = g->adverts[--g->n_adverts];
}

/* Keeps the signed advert msg (already verified) as id's, replacing what was held. TS_ENOMEM,
 * TS_ERANGE when the table is full. */
static int advert_keep(ts_gossip_t *g, const Tessera__Advert *msg, uint64_t version,
                       const uint8_t hash[TS_SWIM_HASH_LEN]) {
    advert_t fresh = {0};
    memcpy(fresh.id, msg->node_id.data, TS_SWIM_ID_LEN);
    fresh.version = version;
    memcpy(fresh.hash, hash, TS_SWIM_HASH_LEN);
    fresh.packed_len = protobuf_c_message_get_packed_size(&msg->base);
    if (!(fresh.packed = malloc(fresh.packed_len)))
        return TS_ENOMEM;
    protobuf_c_message_pack(&msg->base, fresh.packed);
    fresh.msg = tessera__advert__unpack(NULL, fresh.packed_len, fresh.packed);
    if (!fresh.msg ||
        ts_frame_decode_advert_body(&fresh.msg->body, 0, &fresh.body, NULL, 0) != TS_OK) {
        ts_gossip__advert_clear(&fresh);
        return TS_ENOMEM;
    }
    advert_t *a = ts_gossip__advert_find(g, fresh.id);
    if (!a) {
        if (g->n_adverts >= g->cfg.swim.max_members) {
            ts_gossip__advert_clear(&fresh);
            return TS_ERANGE;
        }
        a = &g->adverts[g->n_adverts++];
    } else {
        ts_gossip__advert_clear(a);
    }
    *a = fresh;
    return TS_OK;
}

/* Checks a fetched advert against what id's signed claim announced; TS_OK when it may be kept
 * (version and hash are then the claim's). */
static int advert_verify(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN],
                         const Tessera__Advert *a) {
    ts_swim_member_info_t m;
    if (ts_swim_member_get(g->swim, id, &m) != TS_OK || m.claim.kind != TS_SWIM_CLAIM_ALIVE ||
        m.claim.advert_version == 0)
        return TS_ENOTFOUND; /* reaped, left, or no longer announcing one */
    if (memcmp(a->node_id.data, id, TS_SWIM_ID_LEN) != 0)
        return TS_ECORRUPT;
    int bad = ts_gossip_advert_check(a) != TS_OK;
    uint8_t hash[TS_SWIM_HASH_LEN];
    crypto_generichash(hash, sizeof hash, a->body.data, a->body.len, NULL, 0);
    if (bad || memcmp(hash, m.claim.advert_hash, TS_SWIM_HASH_LEN) != 0)
        return TS_ECORRUPT;
    Tessera__AdvertBody *body;
    if (ts_frame_decode_advert_body(&a->body, TS_FRAME_CHECK_FINITE, &body, NULL, 0) != TS_OK)
        return TS_ECORRUPT;
    int stale = body->version != m.claim.advert_version;
    ts_frame_free(body);
    if (stale)
        return TS_ECORRUPT;
    return advert_keep(g, a, m.claim.advert_version, m.claim.advert_hash);
}

static void on_fetch_done(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    op_t *op = arg;
    ts_gossip_t *g = op->g;
    if (!g->closing && res->status == TS_OK) {
        if (advert_verify(g, op->id, res->reply->advert) == TS_OK)
            g->st.adverts_fetched++;
        else
            g->st.adverts_rejected++;
    }
    ts_gossip__op_free(op);
}

static int fetch_in_flight(const ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]) {
    TS_LIST_FOREACH(it, &g->ops) {
        const op_t *op = TS_CONTAINER_OF(it, op_t, link);
        if (op->kind == OP_FETCH && memcmp(op->id, id, TS_SWIM_ID_LEN) == 0)
            return 1;
    }
    return 0;
}

/* Asks member id, at addr, for its advert of at least version. */
void ts_gossip__start_fetch(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN],
                            const ts_swim_addr_t *addr, uint64_t version) {
    if (g->n_fetches >= MAX_FETCHES || fetch_in_flight(g, id))
        return; /* the housekeeper retries what is still missing */
    op_t *op = ts_gossip__op_new(g, OP_FETCH, id);
    if (!op)
        return;
    Tessera__AdvertRequest ar = TESSERA__ADVERT_REQUEST__INIT;
    ar.has_node_id = 1;
    ar.node_id.data = op->id;
    ar.node_id.len = TS_SWIM_ID_LEN;
    ar.has_min_version = 1;
    ar.min_version = version;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_ADVERT_REQUEST;
    env.advert_request = &ar;
    ts_gossip__op_call(op, addr, &env, g->cfg.advert_timeout_ms, on_fetch_done);
}

/* Fetches the adverts of live members whose claim announces one we do not hold. */
void ts_gossip__reconcile_adverts(ts_gossip_t *g) {
    uint32_t n = ts_swim_state_export(g->swim, g->members, g->cfg.swim.max_members);
    for (uint32_t i = 1; i < n; i++) { /* [0] is ourselves */
        const ts_swim_member_info_t *m = &g->members[i];
        if (m->state != TS_SWIM_ALIVE || m->claim.kind != TS_SWIM_CLAIM_ALIVE ||
            m->claim.advert_version == 0)
            continue;
        const advert_t *a = ts_gossip__advert_find(g, m->claim.id);
        if (!a || a->version != m->claim.advert_version ||
            memcmp(a->hash, m->claim.advert_hash, TS_SWIM_HASH_LEN) != 0)
            ts_gossip__start_fetch(g, m->claim.id, &m->claim.addr, m->claim.advert_version);
    }
}

void ts_gossip__serve_advert(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_gossip_t *g = arg;
    const Tessera__AdvertRequest *ar = env->advert_request;
    const advert_t *a = ts_gossip__advert_find(g, ar->node_id.data);
    if (a && ts_gossip_banned(g, ar->node_id.data)) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_NOT_FOUND,
                           "that node is banned here for a wrong answer");
        return;
    }
    if (!a || (ar->has_min_version && a->version < ar->min_version)) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_NOT_FOUND,
                           a ? "the advert held is older than asked for" : "no advert held");
        return;
    }
    Tessera__Envelope out = TESSERA__ENVELOPE__INIT;
    out.body_case = TESSERA__ENVELOPE__BODY_ADVERT;
    out.advert = a->msg;
    ts_rpc_reply(req, &out);
    g->st.adverts_served++;
}

/* Signs body (version set) as our advert, keeps it and announces it to the core. */
int ts_gossip__announce_own(ts_gossip_t *g, Tessera__AdvertBody *body, char *err, size_t errlen) {
    int rc = ts_frame_check_advert_body(body, TS_FRAME_CHECK_FINITE, err, errlen);
    if (rc)
        return rc;
    size_t blen = protobuf_c_message_get_packed_size(&body->base), slen;
    uint8_t *bytes = malloc(blen ? blen : 1);
    if (!bytes)
        return TS_ENOMEM;
    protobuf_c_message_pack(&body->base, bytes);
    uint8_t sig[TS_SIGNATURE_BYTES], hash[TS_SWIM_HASH_LEN];
    uint8_t *signed_bytes = advert_signed_bytes(g->self.b, bytes, blen, &slen);
    if (!signed_bytes) {
        free(bytes);
        return TS_ENOMEM;
    }
    crypto_sign_detached(sig, NULL, signed_bytes, slen, g->sign_sk);
    free(signed_bytes);
    crypto_generichash(hash, sizeof hash, bytes, blen, NULL, 0);
    Tessera__Advert a = TESSERA__ADVERT__INIT;
    a.has_node_id = a.has_body = a.has_signature = 1;
    a.node_id.data = g->self.b;
    a.node_id.len = TS_SWIM_ID_LEN;
    a.body.data = bytes;
    a.body.len = blen;
    a.signature.data = sig;
    a.signature.len = sizeof sig;
    rc = advert_keep(g, &a, body->version, hash);
    free(bytes);
    if (rc) {
        ts_set_err(err, errlen, "could not keep our advert (%s)", ts_strerror(rc));
        return rc;
    }
    rc = ts_swim_set_advert(g->swim, now_ms(g), body->version, hash);
    ts_gossip__pump(g);
    if (rc)
        ts_set_err(err, errlen, "the gossip core refused the advert (%s)", ts_strerror(rc));
    return rc;
}

int ts_gossip_set_advert(ts_gossip_t *g, const Tessera__AdvertBody *body, char *err,
                         size_t errlen) {
    if (!g || !body || g->closing) {
        ts_set_err(err, errlen, "ts_gossip_set_advert: NULL argument, or closing");
        return TS_EINVAL;
    }
    /* a copy that owns nothing: only the version (and the relay) changes */
    Tessera__AdvertBody copy = *body;
    copy.has_version = 1;
    copy.version = g->own_version + 1;
    copy.has_relay_id = g->has_relay;
    copy.relay_id.data = g->relay_id.b;
    copy.relay_id.len = g->has_relay ? sizeof g->relay_id.b : 0;
    if (!g->swim) { /* before start: checked now, signed and announced by start */
        int rc = ts_frame_check_advert_body(&copy, TS_FRAME_CHECK_FINITE, err, errlen);
        if (rc)
            return rc;
        size_t n = protobuf_c_message_get_packed_size(&copy.base);
        uint8_t *bytes = malloc(n ? n : 1);
        if (!bytes)
            return TS_ENOMEM;
        protobuf_c_message_pack(&copy.base, bytes);
        ProtobufCBinaryData b = {n, bytes};
        Tessera__AdvertBody *owned;
        rc = ts_frame_decode_advert_body(&b, TS_FRAME_CHECK_FINITE, &owned, err, errlen);
        free(bytes);
        if (rc)
            return rc;
        ts_frame_free(g->own_body);
        g->own_body = owned;
        g->own_version = copy.version;
        return TS_OK;
    }
    int rc = ts_gossip__announce_own(g, &copy, err, errlen);
    if (rc == TS_OK)
        g->own_version = copy.version;
    return rc;
}

int ts_gossip_advert_check(const Tessera__Advert *a) {
    if (!a || !a->has_node_id || a->node_id.len != TS_SWIM_ID_LEN || !a->has_signature ||
        a->signature.len != crypto_sign_BYTES || !a->has_body)
        return TS_ECORRUPT;
    size_t len;
    uint8_t *signed_bytes = advert_signed_bytes(a->node_id.data, a->body.data, a->body.len, &len);
    if (!signed_bytes)
        return TS_ENOMEM;
    int bad = crypto_sign_verify_detached(a->signature.data, signed_bytes, len, a->node_id.data);
    free(signed_bytes);
    return bad ? TS_ECORRUPT : TS_OK;
}

int ts_gossip_advert_get(const ts_gossip_t *g, const uint8_t id[TS_NODE_ID_BYTES],
                         const uint8_t **packed, size_t *len) {
    const advert_t *a = g && id ? ts_gossip__advert_find(g, id) : NULL;
    if (!a)
        return TS_ENOTFOUND;
    *packed = a->packed;
    *len = a->packed_len;
    return TS_OK;
}

int ts_gossip_set_relay(ts_gossip_t *g, const char *addr, const ts_node_id_t *relay, char *err,
                        size_t errlen) {
    if (!g || !g->swim || g->closing || (addr && !relay)) {
        ts_set_err(err, errlen, "ts_gossip_set_relay: not started, closing, or no relay id");
        return TS_EINVAL;
    }
    ts_swim_addr_t a = g->self_addr;
    int rc;
    if (addr && (rc = ts_gossip__addr_parse(addr, &a, 0, err, errlen)) != TS_OK)
        return rc;
    if ((rc = ts_swim_set_addr(g->swim, now_ms(g), &a)) != TS_OK) {
        ts_set_err(err, errlen, "the gossip core refused the address (%s)", ts_strerror(rc));
        return rc;
    }
    g->has_relay = addr != NULL;
    if (relay && addr)
        g->relay_id = *relay;
    ts_gossip__pump(g);
    /* our advert, if we have one, names the relay (or no longer does) */
    const advert_t *own = ts_gossip__advert_find(g, g->self.b);
    if (own && own->body)
        return ts_gossip_set_advert(g, own->body, err, errlen);
    return TS_OK;
}
