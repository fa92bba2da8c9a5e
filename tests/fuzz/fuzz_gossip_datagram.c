/*
 * fuzz_gossip_datagram.c — libFuzzer harness for the gossip wire decoders (net/swim_wire.h):
 * the input is the plaintext of one gossip datagram as net/gossip.c hands it to
 * ts_swim_wire_decode after opening it, and, read again, one push-pull full state as
 * ts_swim_wire_decode_state reads it from the secure link, and push-pull's digest and diff
 * (ts_swim_wire_decode_digest, _diff). The seal layer in front of the datagram decoder (unseal and the sender's replay window) is static in net/gossip.c; it is
 * covered by test_gossip's hostile datagrams (garbage, truncated, wrongly keyed, replayed,
 * oversized, another seal version), which go through a real socket.
 *
 * Checked for a datagram: a failure leaves the message zeroed; what decodes has a known type,
 * at most TS_SWIM_MAX_UPDATES updates and its sender id at offset 2 (where gossip.c's replay
 * window reads it before decoding); it encodes back to exactly the input bytes (the encoding is
 * canonical), of ts_swim_wire_msg_size bytes, and that decodes to the same message; every claim
 * it carries has signed bytes of the size its kind says. For a full state: a failure reports no
 * entries; what decodes re-encodes to exactly the input (ts_swim_wire_state_size bytes) and
 * every entry's claim has signed bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/swim_wire.h"

#define MAX_STATE 256

static ts_swim_member_info_t entries[MAX_STATE];
static uint8_t state_buf[TS_SWIM_WIRE_STATE_HEADER + MAX_STATE * (1 + 4 + TS_SWIM_WIRE_ALIVE)];

static void check_claim(const ts_swim_claim_t *c) {
    uint8_t signed_bytes[TS_SWIM_SIGNED_MAX];
    size_t want = c->kind == TS_SWIM_CLAIM_ALIVE   ? TS_SWIM_SIGNED_MAX
                  : c->kind == TS_SWIM_CLAIM_LEAVE ? 20 + TS_SWIM_WIRE_LEAVE - 1 - TS_SWIM_SIG_LEN
                                                   : 0;
    if (want == 0 || ts_swim_claim_signed_bytes(c, signed_bytes) != want)
        abort();
}

static void datagram(const uint8_t *data, size_t size) {
    ts_swim_msg_t m;
    memset(&m, 0xa5, sizeof m);
    int rc = ts_swim_wire_decode(data, size, &m);
    if (rc != TS_OK) {
        static const ts_swim_msg_t zero;
        if ((rc != TS_ECORRUPT && rc != TS_ENOTSUP) || memcmp(&m, &zero, sizeof m) != 0)
            abort(); /* nothing half-filled that could pass for a message */
        return;
    }
    if (m.type < TS_SWIM_PING || m.type > TS_SWIM_GOSSIP || m.n_updates > TS_SWIM_MAX_UPDATES)
        abort();
    if (size < TS_SWIM_WIRE_HEADER || memcmp(m.from, data + 2, TS_SWIM_ID_LEN) != 0)
        abort(); /* the replay window keys on the bytes at offset 2: they must be the sender */
    for (int i = 0; i < m.n_updates; i++) {
        const ts_swim_update_t *u = &m.updates[i];
        if (u->type == TS_SWIM_UP_ALIVE || u->type == TS_SWIM_UP_LEAVE) {
            if (u->u.claim.kind !=
                (u->type == TS_SWIM_UP_ALIVE ? TS_SWIM_CLAIM_ALIVE : TS_SWIM_CLAIM_LEAVE))
                abort();
            check_claim(&u->u.claim);
        } else if (u->type != TS_SWIM_UP_SUSPECT && u->type != TS_SWIM_UP_DEAD) {
            abort();
        }
    }
    if (ts_swim_wire_msg_size(&m) != size)
        abort();
    uint8_t buf[TS_SWIM_PLAIN_MAX];
    size_t len = 0;
    if (ts_swim_wire_encode(&m, buf, sizeof buf, &len) != TS_OK || len != size ||
        memcmp(buf, data, size) != 0)
        abort(); /* canonical: what decodes encodes back to the same bytes */
    ts_swim_msg_t again;
    if (ts_swim_wire_decode(buf, len, &again) != TS_OK || again.type != m.type ||
        memcmp(&again, &m, sizeof m) != 0)
        abort();
}

static void full_state(const uint8_t *data, size_t size) {
    uint8_t from[TS_SWIM_ID_LEN];
    bool join = false;
    uint32_t n = 12345;
    int rc = ts_swim_wire_decode_state(data, size, from, &join, entries, MAX_STATE, &n);
    if (rc != TS_OK) {
        if (n != 0)
            abort();
        return;
    }
    if (n > MAX_STATE || memcmp(from, data + 2, TS_SWIM_ID_LEN) != 0)
        abort();
    for (uint32_t i = 0; i < n; i++) {
        const ts_swim_member_info_t *e = &entries[i];
        if (e->state < TS_SWIM_ALIVE || e->state > TS_SWIM_LEFT || e->change_ms != 0 ||
            e->incarnation < e->claim.incarnation ||
            (e->state == TS_SWIM_LEFT) != (e->claim.kind == TS_SWIM_CLAIM_LEAVE))
            abort();
        check_claim(&e->claim);
    }
    if (ts_swim_wire_state_size(entries, n) != size)
        abort();
    size_t len = 0;
    if (ts_swim_wire_encode_state(from, join, entries, n, state_buf, sizeof state_buf, &len) !=
            TS_OK ||
        len != size || memcmp(state_buf, data, size) != 0)
        abort(); /* canonical too */
}

/* A push-pull digest: a failure leaves it and the sender zeroed; what decodes re-encodes to
 * exactly the input. */
static void digest(const uint8_t *data, size_t size) {
    uint8_t from[TS_SWIM_ID_LEN], buf[TS_SWIM_WIRE_DIGEST];
    ts_swim_digest_t d;
    int rc = ts_swim_wire_decode_digest(data, size, from, &d);
    if (rc != TS_OK) {
        static const ts_swim_digest_t zero;
        if ((rc != TS_ECORRUPT && rc != TS_ENOTSUP) || memcmp(&d, &zero, sizeof d) != 0)
            abort();
        return;
    }
    size_t len = 0;
    if (size != TS_SWIM_WIRE_DIGEST || ts_swim_wire_tcp_type(data, size) != 7 ||
        ts_swim_wire_encode_digest(from, &d, buf, sizeof buf, &len) != TS_OK || len != size ||
        memcmp(buf, data, size) != 0)
        abort();
}

/* A push-pull diff: a failure reports no entries and an empty mask; what decodes has every
 * entry in a masked bucket and re-encodes to exactly the input. */
static void diff(const uint8_t *data, size_t size) {
    uint8_t from[TS_SWIM_ID_LEN], mask[TS_SWIM_DIGEST_MASK_BYTES];
    uint32_t n = 12345;
    int rc = ts_swim_wire_decode_diff(data, size, from, mask, entries, MAX_STATE, &n);
    if (rc != TS_OK) {
        static const uint8_t zero[TS_SWIM_DIGEST_MASK_BYTES];
        if (n != 0 || memcmp(mask, zero, sizeof zero) != 0)
            abort();
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = ts_swim_digest_bucket(entries[i].claim.id);
        if (!(mask[b / 8] & (1u << (b % 8))))
            abort();
        check_claim(&entries[i].claim);
    }
    size_t len = 0;
    if (ts_swim_wire_diff_size(entries, n) != size ||
        ts_swim_wire_encode_diff(from, mask, entries, n, state_buf, sizeof state_buf, &len) !=
            TS_OK ||
        len != size || memcmp(state_buf, data, size) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    datagram(data, size);
    full_state(data, size);
    digest(data, size);
    diff(data, size);
    return 0;
}
