/*
 * gossip_forge.c — hostile gossip datagrams for the tests (gossip_forge.h).
 */
#include "tests/gossip_forge.h"

#include <sodium.h>
#include <string.h>

#include "net/swim.h"
#include "net/swim_wire.h"

size_t ts_forge_seal(const ts_netkey_t *k, uint64_t counter, const uint8_t *plain, size_t n,
                     uint8_t *out) {
    uint8_t key[32];
    static const char ctx[] = "tessera/gossip/seal/1";
    crypto_generichash(key, 32, (const uint8_t *)ctx, sizeof ctx - 1, k->k, 32);
    out[0] = 1;
    for (int i = 0; i < 8; i++)
        out[1 + i] = (uint8_t)(counter >> (56 - 8 * i));
    randombytes_buf(out + 9, 24);
    unsigned long long clen;
    crypto_aead_xchacha20poly1305_ietf_encrypt(out + 33, &clen, plain, n, out, 9, NULL, out + 9,
                                               key);
    sodium_memzero(key, sizeof key);
    return 33 + (size_t)clen;
}

size_t ts_forge_alive(const ts_identity_t *from, const ts_identity_t *signer, uint8_t *out) {
    ts_swim_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = TS_SWIM_GOSSIP;
    memcpy(m.from, from->id.b, 32);
    m.n_updates = 1;
    ts_swim_update_t *u = &m.updates[0];
    u->type = TS_SWIM_UP_ALIVE;
    ts_swim_claim_t *c = &u->u.claim;
    memcpy(c->id, from->id.b, 32);
    c->kind = TS_SWIM_CLAIM_ALIVE;
    c->incarnation = 7;
    memset(c->addr.ip + 10, 0xff, 2);
    c->addr.ip[12] = 127, c->addr.ip[15] = 1;
    c->addr.port = 9;
    uint8_t sb[TS_SWIM_SIGNED_MAX];
    size_t sl = ts_swim_claim_signed_bytes(c, sb);
    crypto_sign_detached(c->sig, NULL, sb, sl, signer->sign_sk);
    size_t n;
    return ts_swim_wire_encode(&m, out, TS_SWIM_PLAIN_MAX, &n) == 0 ? n : 0;
}
