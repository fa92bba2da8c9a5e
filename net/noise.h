/*
 * noise.h — the Noise handshake and the transport ciphers it yields, for
 * Noise_XXpsk3_25519_ChaChaPoly_BLAKE2b (the Noise Protocol Framework, revision 34), on libsodium.
 *
 * What it is: the spec's three objects, under the spec's names, as a state machine that takes
 * bytes in and gives bytes out:
 *
 *   CipherState     ts_noise_cipher_t     k and n; InitializeKey, HasKey, SetNonce,
 *                                         EncryptWithAd, DecryptWithAd, Rekey
 *   SymmetricState  ts_noise_symmetric_t  ck and h; MixKey, MixHash, ... (private to noise.c,
 *                                         declared here only because a handshake embeds one)
 *   HandshakeState  ts_noise_handshake_t  the local keys, the remote keys, the pattern and where
 *                                         we are in it; WriteMessage, ReadMessage, Split
 *
 * The primitives are fixed: DH = X25519 (crypto_scalarmult), cipher = ChaCha20-Poly1305 in its
 * IETF form with the Noise nonce (4 zero bytes, then n as 8 bytes little-endian), hash =
 * BLAKE2b-512 (crypto_generichash with a 64-byte output), so HASHLEN = 64 and HMAC works on
 * 128-byte blocks. The patterns are NN and XX (only to run the public test vectors) and XXpsk3,
 * the one tessera speaks (net/keys.h sets it up with the prologue "tessera/1" and the network key
 * as psk; docs/protocol.md describes the handshake on the wire).
 *
 * What it is not: no sockets, no framing (the 2-byte length before each Noise message is the
 * caller's), no allocation (every state is a fixed-size struct the caller owns), and no idea of
 * node identity (the handshake payloads are opaque bytes here; net/keys.h fills them).
 *
 * A handshake, from either side:
 *
 *   ts_noise_handshake_init(&hs, &opts);
 *   while ((a = ts_noise_handshake_action(&hs)) == TS_NOISE_WRITE || a == TS_NOISE_READ)
 *       a == TS_NOISE_WRITE ? ts_noise_handshake_write_message(&hs, ...)   send what it wrote
 *                           : ts_noise_handshake_read_message(&hs, ...);   what was received
 *   if (a == TS_NOISE_SPLIT) ts_noise_handshake_split(&hs, &tr);  then ts_noise_transport_*
 *
 * Failure is final. Any error from a handshake's write, read or split (a message that fails to
 * decrypt, is too short, carries a point whose DH is zero, a buffer too small, a call out of
 * turn) wipes the handshake; its action is TS_NOISE_FAILED and every later call returns
 * TS_EINVAL. Any error from ts_noise_transport_decrypt wipes both directions of the transport the
 * same way (a failed encryption changes nothing). The caller closes the connection: there is no
 * retry inside a session, since a second try would run with a nonce the peer no longer expects.
 *
 * Error codes: TS_ECORRUPT for a message that fails authentication or is malformed, TS_ERANGE for
 * a size over the limits below or an exhausted nonce, TS_EINVAL for misuse (NULL, out of turn, a
 * state that already failed).
 *
 * Secrets (private keys, the psk, ck, k, DH outputs) are wiped with sodium_memzero as soon as they
 * are dead: temporaries on return, the whole handshake state at Split and on failure, a transport
 * by ts_noise_transport_wipe. Comparisons and choices never branch on secret bytes.
 *
 * Threading: no global state (libsodium's sodium_init is called by ts_noise_handshake_init and is
 * safe to call repeatedly); one state is used by one thread at a time.
 */
#ifndef TS_NOISE_H
#define TS_NOISE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The spec's constants for 25519 / ChaChaPoly / BLAKE2b. */
#define TS_NOISE_DHLEN 32          /* an X25519 key or shared secret */
#define TS_NOISE_HASHLEN 64        /* BLAKE2b-512 */
#define TS_NOISE_BLOCKLEN 128      /* BLAKE2b's block, for HMAC */
#define TS_NOISE_KEYLEN 32         /* a ChaChaPoly key */
#define TS_NOISE_TAGLEN 16         /* Poly1305 tag */
#define TS_NOISE_PSKLEN 32         /* a pre-shared key */
#define TS_NOISE_MAX_MESSAGE 65535 /* any Noise message, handshake or transport */
#define TS_NOISE_MAX_PLAINTEXT (TS_NOISE_MAX_MESSAGE - TS_NOISE_TAGLEN) /* per transport message */
#define TS_NOISE_NONCE_MAX UINT64_MAX /* reserved by the spec (Rekey); never sent */

typedef enum {
    TS_NOISE_NN,     /* -> e; <- e, ee                           (test vectors only) */
    TS_NOISE_XX,     /* -> e; <- e, ee, s, es; -> s, se          (test vectors only) */
    TS_NOISE_XXPSK3, /* -> e; <- e, ee, s, es; -> s, se, psk     (tessera's handshake) */
    TS_NOISE_PATTERN_COUNT
} ts_noise_pattern_t;

/* "Noise_XXpsk3_25519_ChaChaPoly_BLAKE2b" and so on; NULL for a value outside the enum. */
const char *ts_noise_protocol_name(ts_noise_pattern_t p);

/* An X25519 key pair. */
typedef struct ts_noise_keypair {
    uint8_t priv[TS_NOISE_DHLEN];
    uint8_t pub[TS_NOISE_DHLEN];
} ts_noise_keypair_t;

/* A fresh random key pair. Returns 0, or TS_EIO when libsodium cannot be initialised. */
int ts_noise_keypair_generate(ts_noise_keypair_t *kp);
/* The key pair of a given private key (pub = X25519(priv, 9)). */
void ts_noise_keypair_from_private(ts_noise_keypair_t *kp, const uint8_t priv[TS_NOISE_DHLEN]);

/* ---- CipherState ---------------------------------------------------------------------------- */

/* Fields are private; they are here so the state can live inside the caller's structs. */
typedef struct ts_noise_cipher {
    uint8_t k[TS_NOISE_KEYLEN];
    uint64_t n;
    uint8_t has_key;
    uint8_t dead; /* failed or wiped: refuses everything (an empty k would pass plaintext) */
} ts_noise_cipher_t;

/* InitializeKey(key): k = key (NULL: empty), n = 0. Also revives a dead cipher. */
void ts_noise_cipher_initialize_key(ts_noise_cipher_t *cs, const uint8_t key[TS_NOISE_KEYLEN]);
/* HasKey(): 1 when k is set (and the cipher is not dead), else 0. */
int ts_noise_cipher_has_key(const ts_noise_cipher_t *cs);
/* SetNonce(n). The transport never needs it; tests use it to reach the end of the nonce space. */
void ts_noise_cipher_set_nonce(ts_noise_cipher_t *cs, uint64_t n);

/* EncryptWithAd(ad, plaintext): with a key, writes ciphertext || tag (len + TS_NOISE_TAGLEN
 * bytes) to out and increments n; without one, copies the plaintext. *out_len is what was
 * written. out may be the same pointer as plaintext (in place) but must not otherwise overlap it.
 * TS_ERANGE when n is TS_NOISE_NONCE_MAX (the nonces are exhausted: nothing is written, and every
 * later call fails the same way), when out_cap is too small, or when the result would exceed
 * TS_NOISE_MAX_MESSAGE. TS_EINVAL for a dead cipher. */
int ts_noise_cipher_encrypt_with_ad(ts_noise_cipher_t *cs, const uint8_t *ad, size_t ad_len,
                                    const uint8_t *plaintext, size_t len, uint8_t *out,
                                    size_t out_cap, size_t *out_len);

/* DecryptWithAd(ad, ciphertext): the reverse; out receives len − TS_NOISE_TAGLEN bytes (len with
 * no key). Same aliasing rule. A ciphertext that fails authentication (or is shorter than a tag)
 * is TS_ECORRUPT: out is zeroed and the cipher is wiped and dead. TS_ERANGE as above. */
int ts_noise_cipher_decrypt_with_ad(ts_noise_cipher_t *cs, const uint8_t *ad, size_t ad_len,
                                    const uint8_t *ciphertext, size_t len, uint8_t *out,
                                    size_t out_cap, size_t *out_len);

/* Rekey(): k = the first 32 bytes of ENCRYPT(k, 2^64 − 1, "", 32 zero bytes); n is unchanged.
 * Both ends must rekey at the same point of the stream. TS_EINVAL without a key. */
int ts_noise_cipher_rekey(ts_noise_cipher_t *cs);

/* Wipes k and makes the cipher dead. */
void ts_noise_cipher_wipe(ts_noise_cipher_t *cs);

/* ---- SymmetricState (private to noise.c) ------------------------------------------------------ */

typedef struct ts_noise_symmetric {
    ts_noise_cipher_t cs;
    uint8_t ck[TS_NOISE_HASHLEN]; /* chaining key */
    uint8_t h[TS_NOISE_HASHLEN];  /* handshake hash */
} ts_noise_symmetric_t;

/* ---- HandshakeState ------------------------------------------------------------------------- */

typedef struct ts_noise_handshake_opts {
    ts_noise_pattern_t pattern;
    int initiator;           /* 1: this side sends the first message */
    const uint8_t *prologue; /* may be NULL when prologue_len is 0 */
    size_t prologue_len;
    /* The local static private key (its public half is computed): required by XX and XXpsk3,
     * must be NULL for NN. Copied; the caller keeps its own copy. */
    const uint8_t *s_priv;
    /* The pre-shared key, TS_NOISE_PSKLEN bytes: required by XXpsk3, must be NULL otherwise. */
    const uint8_t *psk;
} ts_noise_handshake_opts_t;

/* What a handshake expects next. */
typedef enum {
    TS_NOISE_WRITE,  /* call ts_noise_handshake_write_message and send the result */
    TS_NOISE_READ,   /* call ts_noise_handshake_read_message with the next received message */
    TS_NOISE_SPLIT,  /* the last message is done: call ts_noise_handshake_split */
    TS_NOISE_FAILED, /* an error ended it (or it was split or wiped): close the connection */
} ts_noise_action_t;

/* Fields are private. */
typedef struct ts_noise_handshake {
    ts_noise_symmetric_t ss;
    ts_noise_keypair_t s, e;                        /* local static and ephemeral */
    uint8_t rs[TS_NOISE_DHLEN], re[TS_NOISE_DHLEN]; /* remote static and ephemeral */
    uint8_t psk[TS_NOISE_PSKLEN];
    uint8_t has_s, has_e, has_rs, has_re, has_psk;
    uint8_t initiator;
    uint8_t pattern; /* ts_noise_pattern_t */
    uint8_t next;    /* index of the next message of the pattern */
    uint8_t failed;
} ts_noise_handshake_t;

/* Initialize(): InitializeSymmetric(protocol name), MixHash(prologue) (none of the patterns has
 * pre-messages). Returns TS_EINVAL when the options do not fit the pattern (a missing or extra
 * static key or psk), TS_EIO when libsodium cannot be initialised. */
int ts_noise_handshake_init(ts_noise_handshake_t *hs, const ts_noise_handshake_opts_t *o);

/* FOR TESTS ONLY: use priv as the ephemeral private key instead of a random one, so that a run
 * reproduces the public test vectors. A fixed ephemeral key throws away forward secrecy; nothing
 * outside tests/ calls this. Only before this side has sent its "e" (TS_EINVAL otherwise). */
int ts_noise_handshake_set_ephemeral_for_test(ts_noise_handshake_t *hs,
                                              const uint8_t priv[TS_NOISE_DHLEN]);

ts_noise_action_t ts_noise_handshake_action(const ts_noise_handshake_t *hs);

/* WriteMessage(payload): runs this side's next message pattern and writes the message, ending
 * with the payload (encrypted once a key exists), to msg[0..*msg_len). The message must fit in
 * msg_cap and in TS_NOISE_MAX_MESSAGE (TS_ERANGE otherwise). msg must not overlap payload.
 * TS_ECORRUPT when one of its DHs meets a remote key of small order (received earlier). */
int ts_noise_handshake_write_message(ts_noise_handshake_t *hs, const uint8_t *payload,
                                     size_t payload_len, uint8_t *msg, size_t msg_cap,
                                     size_t *msg_len);

/* ReadMessage(message): processes the peer's next message and writes its payload to
 * payload[0..*payload_len). payload_cap of msg_len always suffices; payload must not overlap msg.
 * TS_ECORRUPT when the message is short or fails to decrypt (a wrong psk shows up here, on the
 * responder's last read), or when one of its DHs meets a remote key of small order. */
int ts_noise_handshake_read_message(ts_noise_handshake_t *hs, const uint8_t *msg, size_t msg_len,
                                    uint8_t *payload, size_t payload_cap, size_t *payload_len);

/* The remote static public key, once a message carrying it has been read (for XX and XXpsk3: the
 * initiator learns it from message 2, the responder from message 3). TS_ENOTFOUND before that. */
int ts_noise_handshake_remote_static(const ts_noise_handshake_t *hs, uint8_t out[TS_NOISE_DHLEN]);

/* Abandons a handshake: wipes every secret; its action becomes TS_NOISE_FAILED. */
void ts_noise_handshake_wipe(ts_noise_handshake_t *hs);

/* ---- after the handshake -------------------------------------------------------------------- */

/* The two CipherStates of Split, oriented for this side, and what the handshake established. */
typedef struct ts_noise_transport {
    ts_noise_cipher_t send, recv;
    uint8_t handshake_hash[TS_NOISE_HASHLEN]; /* h at the end: identifies the session */
    uint8_t remote_static[TS_NOISE_DHLEN];    /* all zero when the pattern sends none (NN) */
    uint8_t has_remote_static;
} ts_noise_transport_t;

/* Split(): fills tr (the initiator sends with the first CipherState, the responder with the
 * second) and wipes the whole handshake. TS_EINVAL unless the action is TS_NOISE_SPLIT. */
int ts_noise_handshake_split(ts_noise_handshake_t *hs, ts_noise_transport_t *tr);

/* One transport message: EncryptWithAd with an empty ad on the send cipher, so len may be at
 * most TS_NOISE_MAX_PLAINTEXT and out receives len + TS_NOISE_TAGLEN bytes. In place allowed. */
int ts_noise_transport_encrypt(ts_noise_transport_t *tr, const uint8_t *plaintext, size_t len,
                               uint8_t *out, size_t out_cap, size_t *out_len);

/* The next received transport message (messages must arrive in order, each exactly once). Any
 * error wipes both directions, and everything after it returns TS_EINVAL: TS_ECORRUPT for a
 * message that fails to decrypt (tampered, replayed, reordered, or under another key), TS_ERANGE
 * for one over TS_NOISE_MAX_MESSAGE, an out_cap too small, or an exhausted nonce. Encrypting, by
 * contrast, changes nothing when it fails, since nothing has been consumed. */
int ts_noise_transport_decrypt(ts_noise_transport_t *tr, const uint8_t *msg, size_t len,
                               uint8_t *out, size_t out_cap, size_t *out_len);

/* Wipes both directions. */
void ts_noise_transport_wipe(ts_noise_transport_t *tr);

#ifdef __cplusplus
}
#endif

#endif
