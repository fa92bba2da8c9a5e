/*
 * fuzz_handshake.c — libFuzzer harness for the responder's side of tessera's handshake
 * (net/noise.h + net/keys.h), following the steps net/conn.c takes: read message 1 (its payload
 * must be empty), write message 2 with our identity, read message 3, verify the identity
 * payload against the static key it came with, split.
 *
 * The first input byte picks what the fuzzer controls:
 *   0  every message from the "initiator": the rest of the input, cut into messages by 2-byte
 *      lengths (as on the wire, through the Noise-message reader);
 *   1  an honest initiator with fixed keys, whose message-3 payload is the rest of the input
 *      (arbitrary identity payloads reach the verification, authenticated by the handshake);
 *   2  the same, with the rest of the input as message 1's payload (which must be refused).
 * Keys and ephemerals are fixed so that runs are reproducible. Invariants: a failure is final
 * (every later call fails), a handshake only completes with a payload that verifies, and
 * completion implies both sides derived the same handshake hash (modes 1 and 2).
 */
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/frame.h"
#include "net/keys.h"

static ts_identity_t resp_id, init_id;
static ts_netkey_t nk;
static int ready;

/* A deterministic identity from a seed byte. */
static void fixed_identity(ts_identity_t *id, uint8_t seed) {
    uint8_t s[32];
    memset(s, seed, sizeof s);
    crypto_sign_seed_keypair(id->id.b, id->sign_sk, s);
    uint8_t x[32];
    crypto_sign_ed25519_sk_to_curve25519(x, id->sign_sk);
    ts_noise_keypair_from_private(&id->noise, x);
}

static void setup(void) {
    if (ready)
        return;
    if (sodium_init() < 0)
        abort();
    fixed_identity(&resp_id, 1);
    fixed_identity(&init_id, 2);
    memset(nk.k, 7, sizeof nk.k);
    ready = 1;
}

/* The responder's handling of one message; returns 1 when the handshake completed, 0 to go on,
 * -1 on a refusal. */
static int respond(ts_noise_handshake_t *hs, int *step, const uint8_t *msg, size_t len,
                   uint8_t *out2, size_t *out2_len, ts_noise_transport_t *tr) {
    static const size_t want[2] = {48, 161};
    if (*step > 1 || len != want[*step])
        return -1;
    uint8_t payload[TS_NOISE_MAX_MESSAGE];
    size_t plen = 0;
    if (ts_noise_handshake_read_message(hs, msg, len, payload, sizeof payload, &plen)) {
        if (ts_noise_handshake_action(hs) != TS_NOISE_FAILED)
            abort(); /* failure is final */
        return -1;
    }
    if ((*step)++ == 0) {
        if (plen != 0)
            return -1;
        uint8_t mine[TS_IDENTITY_PAYLOAD_BYTES];
        ts_identity_payload(&resp_id, mine);
        if (ts_noise_handshake_write_message(hs, mine, sizeof mine, out2, 193, out2_len))
            abort();
        return 0;
    }
    uint8_t rs[TS_NOISE_DHLEN];
    ts_node_id_t peer;
    if (ts_noise_handshake_remote_static(hs, rs))
        abort();
    if (ts_identity_payload_verify(payload, plen, rs, &peer, NULL, 0))
        return -1;
    if (ts_noise_handshake_split(hs, tr))
        abort();
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    if (size < 1)
        return 0;
    int mode = data[0] % 3;
    data++, size--;
    ts_noise_handshake_t r, i;
    ts_noise_transport_t rt, it;
    uint8_t e_r[32], e_i[32], msg2[193];
    size_t msg2_len = 0;
    int step = 0, rc = 0;
    memset(e_r, 3, sizeof e_r);
    memset(e_i, 4, sizeof e_i);
    if (ts_identity_handshake_init(&r, &resp_id, &nk, 0) ||
        ts_noise_handshake_set_ephemeral_for_test(&r, e_r))
        abort();

    if (mode == 0) {
        ts_frame_reader_t rd;
        ts_frame_reader_init_noise(&rd);
        size_t pos = 0;
        while (pos < size && rc == 0) {
            const uint8_t *m;
            size_t used = 0, ml = 0;
            if (ts_frame_reader_feed(&rd, data + pos, size - pos, &used, &m, &ml, NULL, 0))
                break;
            pos += used;
            if (!m)
                break;
            rc = respond(&r, &step, m, ml, msg2, &msg2_len, &rt);
        }
        ts_frame_reader_free(&rd);
        if (rc == 1) /* only a valid initiator can get here; the fuzzer cannot forge message 3 */
            abort();
    } else {
        uint8_t m[TS_NOISE_MAX_MESSAGE], got[TS_NOISE_MAX_MESSAGE];
        size_t ml = 0, gl = 0;
        if (size > 4096)
            size = 4096;
        if (ts_identity_handshake_init(&i, &init_id, &nk, 1) ||
            ts_noise_handshake_set_ephemeral_for_test(&i, e_i))
            abort();
        if (ts_noise_handshake_write_message(&i, mode == 2 ? data : NULL, mode == 2 ? size : 0, m,
                                             sizeof m, &ml))
            abort();
        rc = respond(&r, &step, m, ml, msg2, &msg2_len, &rt);
        if (mode == 2 && size > 0 && rc != -1)
            abort(); /* a payload in message 1 is refused */
        if (rc == 0) {
            if (ts_noise_handshake_read_message(&i, msg2, msg2_len, got, sizeof got, &gl))
                abort();
            if (ts_noise_handshake_write_message(&i, mode == 1 ? data : NULL, mode == 1 ? size : 0,
                                                 m, sizeof m, &ml))
                abort();
            rc = respond(&r, &step, m, ml, msg2, &msg2_len, &rt);
            if (rc == 1) {
                /* the payload verified: it must be the initiator's own, the only one that can */
                uint8_t own[TS_IDENTITY_PAYLOAD_BYTES];
                ts_identity_payload(&init_id, own);
                if (size != sizeof own || memcmp(data, own, sizeof own) != 0)
                    abort();
                if (ts_noise_handshake_split(&i, &it) ||
                    memcmp(it.handshake_hash, rt.handshake_hash, TS_NOISE_HASHLEN) != 0)
                    abort();
                ts_noise_transport_wipe(&it);
            }
        }
        ts_noise_handshake_wipe(&i);
    }
    if (rc == 1)
        ts_noise_transport_wipe(&rt);
    ts_noise_handshake_wipe(&r);
    return 0;
}
