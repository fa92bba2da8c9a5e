/*
 * noise.c — Noise_XXpsk3_25519_ChaChaPoly_BLAKE2b on libsodium (see noise.h).
 *
 * The file follows the spec (revision 34) from the bottom up, one section per object, and each
 * function is named after the operation it implements so that it can be read next to the spec:
 *
 *   §4    the crypto functions: DH (X25519), ENCRYPT (ChaChaPoly with the Noise nonce), HASH
 *         (BLAKE2b-512), HMAC-HASH (RFC 2104, 128-byte blocks) and HKDF;
 *   §5.1  CipherState;
 *   §5.2  SymmetricState;
 *   §5.3  HandshakeState, whose message patterns are the token lists of `patterns` below;
 *   §9    the psk modifier: XXpsk3 appends "psk" to the third message, and in a psk handshake
 *         every "e" token also calls MixKey(e.public_key).
 *
 * Invariants. A handshake whose `failed` is set has already been wiped (every byte zero), so there
 * is nothing left to leak and nothing to use. A cipher with `dead` set refuses every call: without
 * that flag a wiped cipher would look like one with an empty key, and the spec's EncryptWithAd
 * copies the plaintext through when there is no key. The transport functions additionally refuse
 * a cipher without a key, for the same reason.
 *
 * Nothing here allocates; every temporary holding key material is a local that is wiped before
 * the function returns.
 */
#include "net/noise.h"

#include <sodium.h>
#include <string.h>

#include "base/error.h"

/* ---- message patterns (§7) ------------------------------------------------------------------ */

typedef enum { TOK_END = 0, TOK_E, TOK_S, TOK_EE, TOK_ES, TOK_SE, TOK_SS, TOK_PSK } token_t;

#define MAX_MESSAGES 3
#define MAX_TOKENS 4

/* A handshake pattern: message i is written by the initiator when i is even, by the responder
 * when it is odd. Each token list ends with TOK_END. */
typedef struct {
    const char *protocol_name;
    int n_messages;
    int psk; /* has a psk modifier (§9): "e" tokens then also MixKey */
    uint8_t tokens[MAX_MESSAGES][MAX_TOKENS + 1];
} pattern_t;

static const pattern_t patterns[TS_NOISE_PATTERN_COUNT] = {
    [TS_NOISE_NN] = {.protocol_name = "Noise_NN_25519_ChaChaPoly_BLAKE2b",
                     .n_messages = 2,
                     .tokens = {{TOK_E}, {TOK_E, TOK_EE}}},
    [TS_NOISE_XX] = {.protocol_name = "Noise_XX_25519_ChaChaPoly_BLAKE2b",
                     .n_messages = 3,
                     .tokens = {{TOK_E}, {TOK_E, TOK_EE, TOK_S, TOK_ES}, {TOK_S, TOK_SE}}},
    [TS_NOISE_XXPSK3] = {.protocol_name = "Noise_XXpsk3_25519_ChaChaPoly_BLAKE2b",
                         .n_messages = 3,
                         .psk = 1,
                         .tokens = {{TOK_E},
                                    {TOK_E, TOK_EE, TOK_S, TOK_ES},
                                    {TOK_S, TOK_SE, TOK_PSK}}},
};

const char *ts_noise_protocol_name(ts_noise_pattern_t p) {
    return (unsigned)p < TS_NOISE_PATTERN_COUNT ? patterns[p].protocol_name : NULL;
}

/* Whether the side given sends its static key somewhere in the pattern (then it must have one). */
static int sends_static(const pattern_t *p, int initiator) {
    for (int m = initiator ? 0 : 1; m < p->n_messages; m += 2)
        for (const uint8_t *t = p->tokens[m]; *t != TOK_END; t++)
            if (*t == TOK_S)
                return 1;
    return 0;
}

/* ---- crypto functions (§4) ------------------------------------------------------------------ */

/* ChaChaPoly's nonce (§12.3): 32 bits of zeros, then n as a 64-bit little-endian integer. */
static void chachapoly_nonce(uint8_t out[crypto_aead_chacha20poly1305_ietf_NPUBBYTES], uint64_t n) {
    memset(out, 0, 4);
    for (int i = 0; i < 8; i++)
        out[4 + i] = (uint8_t)(n >> (8 * i));
}

/* ENCRYPT(k, n, ad, plaintext): len + TS_NOISE_TAGLEN bytes into out (out may equal in). */
static void chachapoly_encrypt(const uint8_t k[TS_NOISE_KEYLEN], uint64_t n, const uint8_t *ad,
                               size_t ad_len, const uint8_t *in, size_t len, uint8_t *out) {
    uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
    chachapoly_nonce(nonce, n);
    crypto_aead_chacha20poly1305_ietf_encrypt(out, NULL, in, len, ad, ad_len, NULL, nonce, k);
}

/* DECRYPT(k, n, ad, ciphertext): len − TS_NOISE_TAGLEN bytes into out (out may equal in); 0, or
 * −1 when authentication fails (then out is zeroed). len ≥ TS_NOISE_TAGLEN. */
static int chachapoly_decrypt(const uint8_t k[TS_NOISE_KEYLEN], uint64_t n, const uint8_t *ad,
                              size_t ad_len, const uint8_t *in, size_t len, uint8_t *out) {
    uint8_t nonce[crypto_aead_chacha20poly1305_ietf_NPUBBYTES];
    chachapoly_nonce(nonce, n);
    if (crypto_aead_chacha20poly1305_ietf_decrypt(out, NULL, NULL, in, len, ad, ad_len, nonce, k) ==
        0)
        return 0;
    sodium_memzero(out, len - TS_NOISE_TAGLEN);
    return -1;
}

/* DH(key_pair, public_key): X25519. libsodium refuses a public key of small order (the result
 * would be all zeros, independent of our key); the handshake then fails with TS_ECORRUPT. */
static int dh(uint8_t out[TS_NOISE_DHLEN], const uint8_t priv[TS_NOISE_DHLEN],
              const uint8_t pub[TS_NOISE_DHLEN]) {
    return crypto_scalarmult(out, priv, pub) == 0 ? TS_OK : TS_ECORRUPT;
}

/* HMAC-HASH(key, d1 || d2), RFC 2104 with BLAKE2b-512 and BLOCKLEN 128 (§4.3). The key is always
 * HASHLEN bytes here (a chaining key, or HKDF's temp_key), shorter than a block, so it is padded
 * with zeros and never hashed first. Taking the data in two pieces spares HKDF a concatenation. */
static void hmac_hash(uint8_t out[TS_NOISE_HASHLEN], const uint8_t key[TS_NOISE_HASHLEN],
                      const uint8_t *d1, size_t n1, const uint8_t *d2, size_t n2) {
    uint8_t pad[TS_NOISE_BLOCKLEN], inner[TS_NOISE_HASHLEN];
    crypto_generichash_state st;

    memset(pad, 0x36, sizeof pad); /* ipad */
    for (int i = 0; i < TS_NOISE_HASHLEN; i++)
        pad[i] ^= key[i];
    crypto_generichash_init(&st, NULL, 0, TS_NOISE_HASHLEN);
    crypto_generichash_update(&st, pad, sizeof pad);
    if (n1)
        crypto_generichash_update(&st, d1, n1);
    if (n2)
        crypto_generichash_update(&st, d2, n2);
    crypto_generichash_final(&st, inner, sizeof inner);

    memset(pad, 0x5c, sizeof pad); /* opad */
    for (int i = 0; i < TS_NOISE_HASHLEN; i++)
        pad[i] ^= key[i];
    crypto_generichash_init(&st, NULL, 0, TS_NOISE_HASHLEN);
    crypto_generichash_update(&st, pad, sizeof pad);
    crypto_generichash_update(&st, inner, sizeof inner);
    crypto_generichash_final(&st, out, TS_NOISE_HASHLEN);

    sodium_memzero(pad, sizeof pad);
    sodium_memzero(inner, sizeof inner);
    sodium_memzero(&st, sizeof st);
}

/* HKDF(chaining_key, input_key_material, num_outputs) (§4.3), with 2 outputs, or 3 when out3 is
 * not NULL. The outputs must not alias ck. */
static void hkdf(uint8_t out1[TS_NOISE_HASHLEN], uint8_t out2[TS_NOISE_HASHLEN], uint8_t *out3,
                 const uint8_t ck[TS_NOISE_HASHLEN], const uint8_t *ikm, size_t ikm_len) {
    static const uint8_t one = 0x01, two = 0x02, three = 0x03;
    uint8_t temp_key[TS_NOISE_HASHLEN];
    hmac_hash(temp_key, ck, ikm, ikm_len, NULL, 0);
    hmac_hash(out1, temp_key, &one, 1, NULL, 0);
    hmac_hash(out2, temp_key, out1, TS_NOISE_HASHLEN, &two, 1);
    if (out3)
        hmac_hash(out3, temp_key, out2, TS_NOISE_HASHLEN, &three, 1);
    sodium_memzero(temp_key, sizeof temp_key);
}

int ts_noise_keypair_generate(ts_noise_keypair_t *kp) {
    if (!kp)
        return TS_EINVAL;
    if (sodium_init() < 0)
        return TS_EIO;
    randombytes_buf(kp->priv, sizeof kp->priv);
    crypto_scalarmult_base(kp->pub, kp->priv);
    return TS_OK;
}

void ts_noise_keypair_from_private(ts_noise_keypair_t *kp, const uint8_t priv[TS_NOISE_DHLEN]) {
    memmove(kp->priv, priv, TS_NOISE_DHLEN);
    /* Cannot fail: X25519 clamps the scalar, so the product with the base point is never zero. */
    crypto_scalarmult_base(kp->pub, kp->priv);
}

/* ---- CipherState (§5.1) --------------------------------------------------------------------- */

void ts_noise_cipher_initialize_key(ts_noise_cipher_t *cs, const uint8_t key[TS_NOISE_KEYLEN]) {
    if (key)
        memcpy(cs->k, key, TS_NOISE_KEYLEN);
    else
        sodium_memzero(cs->k, sizeof cs->k);
    cs->has_key = key != NULL;
    cs->n = 0;
    cs->dead = 0;
}

int ts_noise_cipher_has_key(const ts_noise_cipher_t *cs) { return cs && cs->has_key && !cs->dead; }

void ts_noise_cipher_set_nonce(ts_noise_cipher_t *cs, uint64_t n) {
    if (cs)
        cs->n = n;
}

void ts_noise_cipher_wipe(ts_noise_cipher_t *cs) {
    if (!cs)
        return;
    sodium_memzero(cs, sizeof *cs);
    cs->dead = 1;
}

int ts_noise_cipher_encrypt_with_ad(ts_noise_cipher_t *cs, const uint8_t *ad, size_t ad_len,
                                    const uint8_t *plaintext, size_t len, uint8_t *out,
                                    size_t out_cap, size_t *out_len) {
    if (!cs || cs->dead || (!ad && ad_len) || (!plaintext && len) || !out || !out_len)
        return TS_EINVAL;
    if (len > TS_NOISE_MAX_MESSAGE)
        return TS_ERANGE;
    size_t need = len + (cs->has_key ? TS_NOISE_TAGLEN : 0);
    if (need > TS_NOISE_MAX_MESSAGE || need > out_cap)
        return TS_ERANGE;
    if (!cs->has_key) {
        if (len)
            memmove(out, plaintext, len);
        *out_len = len;
        return TS_OK;
    }
    if (cs->n == TS_NOISE_NONCE_MAX)
        return TS_ERANGE;
    chachapoly_encrypt(cs->k, cs->n, ad, ad_len, plaintext, len, out);
    cs->n++;
    *out_len = need;
    return TS_OK;
}

int ts_noise_cipher_decrypt_with_ad(ts_noise_cipher_t *cs, const uint8_t *ad, size_t ad_len,
                                    const uint8_t *ciphertext, size_t len, uint8_t *out,
                                    size_t out_cap, size_t *out_len) {
    if (!cs || cs->dead || (!ad && ad_len) || (!ciphertext && len) || !out || !out_len)
        return TS_EINVAL;
    if (len > TS_NOISE_MAX_MESSAGE)
        return TS_ERANGE;
    if (!cs->has_key) {
        if (len > out_cap)
            return TS_ERANGE;
        if (len)
            memmove(out, ciphertext, len);
        *out_len = len;
        return TS_OK;
    }
    if (cs->n == TS_NOISE_NONCE_MAX)
        return TS_ERANGE;
    if (len < TS_NOISE_TAGLEN) {
        ts_noise_cipher_wipe(cs);
        return TS_ECORRUPT;
    }
    if (len - TS_NOISE_TAGLEN > out_cap)
        return TS_ERANGE;
    if (chachapoly_decrypt(cs->k, cs->n, ad, ad_len, ciphertext, len, out) != 0) {
        ts_noise_cipher_wipe(cs);
        return TS_ECORRUPT;
    }
    cs->n++;
    *out_len = len - TS_NOISE_TAGLEN;
    return TS_OK;
}

int ts_noise_cipher_rekey(ts_noise_cipher_t *cs) {
    if (!ts_noise_cipher_has_key(cs))
        return TS_EINVAL;
    /* REKEY(k) (§4.2): the first 32 bytes of ENCRYPT(k, maxnonce, zerolen, zeros). */
    static const uint8_t zeros[TS_NOISE_KEYLEN];
    uint8_t out[TS_NOISE_KEYLEN + TS_NOISE_TAGLEN];
    chachapoly_encrypt(cs->k, TS_NOISE_NONCE_MAX, NULL, 0, zeros, sizeof zeros, out);
    memcpy(cs->k, out, TS_NOISE_KEYLEN);
    sodium_memzero(out, sizeof out);
    return TS_OK;
}

/* ---- SymmetricState (§5.2) ------------------------------------------------------------------ */

static void initialize_symmetric(ts_noise_symmetric_t *ss, const char *protocol_name) {
    size_t n = strlen(protocol_name);
    if (n <= TS_NOISE_HASHLEN) {
        memset(ss->h, 0, sizeof ss->h);
        memcpy(ss->h, protocol_name, n);
    } else {
        crypto_generichash(ss->h, sizeof ss->h, (const uint8_t *)protocol_name, n, NULL, 0);
    }
    memcpy(ss->ck, ss->h, sizeof ss->ck);
    ts_noise_cipher_initialize_key(&ss->cs, NULL);
}

/* HKDF's outputs are HASHLEN = 64 bytes; a cipher key is their first 32 (§5.2, "truncate"). */
static void mix_key(ts_noise_symmetric_t *ss, const uint8_t *ikm, size_t len) {
    uint8_t ck[TS_NOISE_HASHLEN], temp_k[TS_NOISE_HASHLEN];
    hkdf(ck, temp_k, NULL, ss->ck, ikm, len);
    memcpy(ss->ck, ck, sizeof ss->ck);
    ts_noise_cipher_initialize_key(&ss->cs, temp_k);
    sodium_memzero(ck, sizeof ck);
    sodium_memzero(temp_k, sizeof temp_k);
}

/* HASH(h || data) into out, which may be h itself. */
static void hash_with(uint8_t out[TS_NOISE_HASHLEN], const uint8_t h[TS_NOISE_HASHLEN],
                      const uint8_t *data, size_t len) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, TS_NOISE_HASHLEN);
    crypto_generichash_update(&st, h, TS_NOISE_HASHLEN);
    if (len)
        crypto_generichash_update(&st, data, len);
    crypto_generichash_final(&st, out, TS_NOISE_HASHLEN);
}

static void mix_hash(ts_noise_symmetric_t *ss, const uint8_t *data, size_t len) {
    hash_with(ss->h, ss->h, data, len);
}

static void mix_key_and_hash(ts_noise_symmetric_t *ss, const uint8_t *ikm, size_t len) {
    uint8_t ck[TS_NOISE_HASHLEN], temp_h[TS_NOISE_HASHLEN], temp_k[TS_NOISE_HASHLEN];
    hkdf(ck, temp_h, temp_k, ss->ck, ikm, len);
    memcpy(ss->ck, ck, sizeof ss->ck);
    mix_hash(ss, temp_h, sizeof temp_h);
    ts_noise_cipher_initialize_key(&ss->cs, temp_k);
    sodium_memzero(ck, sizeof ck);
    sodium_memzero(temp_h, sizeof temp_h);
    sodium_memzero(temp_k, sizeof temp_k);
}

static int encrypt_and_hash(ts_noise_symmetric_t *ss, const uint8_t *plaintext, size_t len,
                            uint8_t *out, size_t out_cap, size_t *out_len) {
    int rc = ts_noise_cipher_encrypt_with_ad(&ss->cs, ss->h, sizeof ss->h, plaintext, len, out,
                                             out_cap, out_len);
    if (rc == TS_OK)
        mix_hash(ss, out, *out_len);
    return rc;
}

/* The spec hashes the ciphertext after decrypting it; the hash is taken first here, into a
 * temporary, so that out may be the ciphertext's own buffer. */
static int decrypt_and_hash(ts_noise_symmetric_t *ss, const uint8_t *ciphertext, size_t len,
                            uint8_t *out, size_t out_cap, size_t *out_len) {
    uint8_t next_h[TS_NOISE_HASHLEN];
    hash_with(next_h, ss->h, ciphertext, len);
    int rc = ts_noise_cipher_decrypt_with_ad(&ss->cs, ss->h, sizeof ss->h, ciphertext, len, out,
                                             out_cap, out_len);
    if (rc == TS_OK)
        memcpy(ss->h, next_h, sizeof ss->h);
    return rc;
}

static void split(ts_noise_symmetric_t *ss, ts_noise_cipher_t *c1, ts_noise_cipher_t *c2) {
    uint8_t temp_k1[TS_NOISE_HASHLEN], temp_k2[TS_NOISE_HASHLEN];
    hkdf(temp_k1, temp_k2, NULL, ss->ck, NULL, 0);
    ts_noise_cipher_initialize_key(c1, temp_k1);
    ts_noise_cipher_initialize_key(c2, temp_k2);
    sodium_memzero(temp_k1, sizeof temp_k1);
    sodium_memzero(temp_k2, sizeof temp_k2);
}

/* ---- HandshakeState (§5.3) ------------------------------------------------------------------ */

void ts_noise_handshake_wipe(ts_noise_handshake_t *hs) {
    if (!hs)
        return;
    sodium_memzero(hs, sizeof *hs);
    hs->failed = 1;
}

/* Ends the handshake on an error: every secret is wiped before the error goes back. */
static int fail(ts_noise_handshake_t *hs, int rc) {
    ts_noise_handshake_wipe(hs);
    return rc;
}

int ts_noise_handshake_init(ts_noise_handshake_t *hs, const ts_noise_handshake_opts_t *o) {
    if (!hs)
        return TS_EINVAL;
    ts_noise_handshake_wipe(hs); /* failed until the end of this function */
    if (!o || (unsigned)o->pattern >= TS_NOISE_PATTERN_COUNT || (!o->prologue && o->prologue_len))
        return TS_EINVAL;
    const pattern_t *p = &patterns[o->pattern];
    int initiator = o->initiator != 0;
    if (sends_static(p, initiator) != (o->s_priv != NULL) || p->psk != (o->psk != NULL))
        return TS_EINVAL;
    if (sodium_init() < 0)
        return TS_EIO;

    hs->pattern = (uint8_t)o->pattern;
    hs->initiator = (uint8_t)initiator;
    if (o->s_priv) {
        ts_noise_keypair_from_private(&hs->s, o->s_priv);
        hs->has_s = 1;
    }
    if (o->psk) {
        memcpy(hs->psk, o->psk, TS_NOISE_PSKLEN);
        hs->has_psk = 1;
    }
    initialize_symmetric(&hs->ss, p->protocol_name);
    mix_hash(&hs->ss, o->prologue, o->prologue_len);
    /* No pre-message public keys: none of the patterns has a pre-message. */
    hs->failed = 0;
    return TS_OK;
}

int ts_noise_handshake_set_ephemeral_for_test(ts_noise_handshake_t *hs,
                                              const uint8_t priv[TS_NOISE_DHLEN]) {
    if (!hs || hs->failed || hs->has_e || !priv)
        return TS_EINVAL;
    ts_noise_keypair_from_private(&hs->e, priv);
    hs->has_e = 1;
    return TS_OK;
}

ts_noise_action_t ts_noise_handshake_action(const ts_noise_handshake_t *hs) {
    if (!hs || hs->failed)
        return TS_NOISE_FAILED;
    if (hs->next >= patterns[hs->pattern].n_messages)
        return TS_NOISE_SPLIT;
    int initiator_writes = hs->next % 2 == 0;
    return initiator_writes == hs->initiator ? TS_NOISE_WRITE : TS_NOISE_READ;
}

/* "ee", "es", "se", "ss": MixKey(DH(...)) between the local and remote keys the token names. The
 * first letter is the initiator's key, the second the responder's, so the responder reads "es"
 * as (its static, their ephemeral). */
static int mix_dh(ts_noise_handshake_t *hs, token_t tok) {
    int initiators_e = tok == TOK_EE || tok == TOK_ES;
    int responders_e = tok == TOK_EE || tok == TOK_SE;
    int local_e = hs->initiator ? initiators_e : responders_e;
    int remote_e = hs->initiator ? responders_e : initiators_e;
    const ts_noise_keypair_t *local = local_e ? &hs->e : &hs->s;
    const uint8_t *remote = remote_e ? hs->re : hs->rs;
    if (!(local_e ? hs->has_e : hs->has_s) || !(remote_e ? hs->has_re : hs->has_rs))
        return TS_EINVAL; /* a pattern that uses a key before it is known */
    uint8_t shared[TS_NOISE_DHLEN];
    int rc = dh(shared, local->priv, remote);
    if (rc == TS_OK)
        mix_key(&hs->ss, shared, sizeof shared);
    sodium_memzero(shared, sizeof shared);
    return rc;
}

/* "e" on the writing side: a fresh ephemeral key (unless a test set one), sent in the clear. */
static int write_e(ts_noise_handshake_t *hs, uint8_t *msg, size_t cap, size_t *off) {
    if (cap - *off < TS_NOISE_DHLEN)
        return TS_ERANGE;
    if (!hs->has_e) {
        int rc = ts_noise_keypair_generate(&hs->e);
        if (rc != TS_OK)
            return rc;
        hs->has_e = 1;
    }
    memcpy(msg + *off, hs->e.pub, TS_NOISE_DHLEN);
    *off += TS_NOISE_DHLEN;
    mix_hash(&hs->ss, hs->e.pub, TS_NOISE_DHLEN);
    if (patterns[hs->pattern].psk)
        mix_key(&hs->ss, hs->e.pub, TS_NOISE_DHLEN);
    return TS_OK;
}

static int read_e(ts_noise_handshake_t *hs, const uint8_t *msg, size_t len, size_t *off) {
    if (len - *off < TS_NOISE_DHLEN)
        return TS_ECORRUPT;
    if (hs->has_re)
        return TS_EINVAL;
    memcpy(hs->re, msg + *off, TS_NOISE_DHLEN);
    hs->has_re = 1;
    *off += TS_NOISE_DHLEN;
    mix_hash(&hs->ss, hs->re, TS_NOISE_DHLEN);
    if (patterns[hs->pattern].psk)
        mix_key(&hs->ss, hs->re, TS_NOISE_DHLEN);
    return TS_OK;
}

/* "s": the static public key, encrypted once a key exists (always, in XX). */
static int write_s(ts_noise_handshake_t *hs, uint8_t *msg, size_t cap, size_t *off) {
    size_t n = 0;
    int rc = encrypt_and_hash(&hs->ss, hs->s.pub, TS_NOISE_DHLEN, msg + *off, cap - *off, &n);
    *off += n;
    return rc;
}

static int read_s(ts_noise_handshake_t *hs, const uint8_t *msg, size_t len, size_t *off) {
    size_t n = TS_NOISE_DHLEN + (ts_noise_cipher_has_key(&hs->ss.cs) ? TS_NOISE_TAGLEN : 0), got;
    if (len - *off < n)
        return TS_ECORRUPT;
    if (hs->has_rs)
        return TS_EINVAL;
    int rc = decrypt_and_hash(&hs->ss, msg + *off, n, hs->rs, sizeof hs->rs, &got);
    if (rc != TS_OK)
        return rc;
    hs->has_rs = 1;
    *off += n;
    return TS_OK;
}

int ts_noise_handshake_write_message(ts_noise_handshake_t *hs, const uint8_t *payload,
                                     size_t payload_len, uint8_t *msg, size_t msg_cap,
                                     size_t *msg_len) {
    if (!hs)
        return TS_EINVAL;
    if ((!payload && payload_len) || !msg || !msg_len ||
        ts_noise_handshake_action(hs) != TS_NOISE_WRITE)
        return fail(hs, TS_EINVAL);
    size_t cap = msg_cap < TS_NOISE_MAX_MESSAGE ? msg_cap : TS_NOISE_MAX_MESSAGE, off = 0, n = 0;
    int rc = TS_OK;
    for (const uint8_t *t = patterns[hs->pattern].tokens[hs->next]; *t && rc == TS_OK; t++) {
        switch (*t) {
        case TOK_E: rc = write_e(hs, msg, cap, &off); break;
        case TOK_S: rc = write_s(hs, msg, cap, &off); break;
        case TOK_PSK: mix_key_and_hash(&hs->ss, hs->psk, TS_NOISE_PSKLEN); break;
        default: rc = mix_dh(hs, (token_t)*t); break;
        }
    }
    if (rc == TS_OK)
        rc = encrypt_and_hash(&hs->ss, payload, payload_len, msg + off, cap - off, &n);
    if (rc != TS_OK)
        return fail(hs, rc);
    *msg_len = off + n;
    hs->next++;
    return TS_OK;
}

int ts_noise_handshake_read_message(ts_noise_handshake_t *hs, const uint8_t *msg, size_t msg_len,
                                    uint8_t *payload, size_t payload_cap, size_t *payload_len) {
    if (!hs)
        return TS_EINVAL;
    if ((!msg && msg_len) || !payload || !payload_len ||
        ts_noise_handshake_action(hs) != TS_NOISE_READ)
        return fail(hs, TS_EINVAL);
    if (msg_len > TS_NOISE_MAX_MESSAGE)
        return fail(hs, TS_ERANGE);
    size_t off = 0;
    int rc = TS_OK;
    for (const uint8_t *t = patterns[hs->pattern].tokens[hs->next]; *t && rc == TS_OK; t++) {
        switch (*t) {
        case TOK_E: rc = read_e(hs, msg, msg_len, &off); break;
        case TOK_S: rc = read_s(hs, msg, msg_len, &off); break;
        case TOK_PSK: mix_key_and_hash(&hs->ss, hs->psk, TS_NOISE_PSKLEN); break;
        default: rc = mix_dh(hs, (token_t)*t); break;
        }
    }
    if (rc == TS_OK)
        rc = decrypt_and_hash(&hs->ss, msg + off, msg_len - off, payload, payload_cap, payload_len);
    if (rc != TS_OK)
        return fail(hs, rc);
    hs->next++;
    return TS_OK;
}

int ts_noise_handshake_remote_static(const ts_noise_handshake_t *hs, uint8_t out[TS_NOISE_DHLEN]) {
    if (!hs || !out || hs->failed)
        return TS_EINVAL;
    if (!hs->has_rs)
        return TS_ENOTFOUND;
    memcpy(out, hs->rs, TS_NOISE_DHLEN);
    return TS_OK;
}

int ts_noise_handshake_split(ts_noise_handshake_t *hs, ts_noise_transport_t *tr) {
    if (!hs || !tr)
        return hs ? fail(hs, TS_EINVAL) : TS_EINVAL;
    if (ts_noise_handshake_action(hs) != TS_NOISE_SPLIT)
        return fail(hs, TS_EINVAL);
    ts_noise_cipher_t c1, c2;
    split(&hs->ss, &c1, &c2);
    sodium_memzero(tr, sizeof *tr);
    tr->send = hs->initiator ? c1 : c2;
    tr->recv = hs->initiator ? c2 : c1;
    memcpy(tr->handshake_hash, hs->ss.h, sizeof tr->handshake_hash);
    if (hs->has_rs) {
        memcpy(tr->remote_static, hs->rs, sizeof tr->remote_static);
        tr->has_remote_static = 1;
    }
    sodium_memzero(&c1, sizeof c1);
    sodium_memzero(&c2, sizeof c2);
    ts_noise_handshake_wipe(hs);
    return TS_OK;
}

/* ---- transport ------------------------------------------------------------------------------ */

int ts_noise_transport_encrypt(ts_noise_transport_t *tr, const uint8_t *plaintext, size_t len,
                               uint8_t *out, size_t out_cap, size_t *out_len) {
    if (!tr || !ts_noise_cipher_has_key(&tr->send))
        return TS_EINVAL; /* never the spec's keyless pass-through on a link */
    return ts_noise_cipher_encrypt_with_ad(&tr->send, NULL, 0, plaintext, len, out, out_cap,
                                           out_len);
}

int ts_noise_transport_decrypt(ts_noise_transport_t *tr, const uint8_t *msg, size_t len,
                               uint8_t *out, size_t out_cap, size_t *out_len) {
    if (!tr || !ts_noise_cipher_has_key(&tr->recv))
        return TS_EINVAL;
    int rc = ts_noise_cipher_decrypt_with_ad(&tr->recv, NULL, 0, msg, len, out, out_cap, out_len);
    if (rc != TS_OK)
        ts_noise_transport_wipe(tr);
    return rc;
}

void ts_noise_transport_wipe(ts_noise_transport_t *tr) {
    if (!tr)
        return;
    ts_noise_cipher_wipe(&tr->send);
    ts_noise_cipher_wipe(&tr->recv);
}
