/*
 * keys.h — a node's identity and the network key: their files, and the handshake payload that
 * binds a node's identity to its Noise static key (architecture.md §5).
 *
 * Identity. Every node has an Ed25519 key pair, and the public key is the node id
 * (ts_node_id_t), shown as a hex prefix (ts_node_id_hex). The node's Noise static key (X25519) is
 * derived from the same secret (libsodium's crypto_sign_ed25519_sk_to_curve25519), so that one
 * file holds everything secret about a node and its static key survives restarts. That derivation
 * is this implementation's choice, not part of the protocol: a peer never relies on it. What a
 * peer checks is the handshake payload, in which the Ed25519 key signs the X25519 static key the
 * handshake used. A node could switch to an independent X25519 key without changing the wire.
 *
 * Network key. 32 random bytes shared by the nodes of one network and used as the psk of
 * Noise_XXpsk3: a party without it cannot finish a handshake with any node of the network.
 *
 * Files. Both kinds are written by `tessera keygen`, created with
 * open(O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600) and then fchmod(0600) (so the umask
 * cannot change the mode), and never overwritten. Each is a 16-byte ASCII header and the key:
 *
 *   identity file, TS_IDENTITY_FILE_BYTES = 80 bytes
 *     [0, 16)   "tessera/ed25519\n"
 *     [16, 48)  the Ed25519 seed (the secret)
 *     [48, 80)  the Ed25519 public key (redundant; checked against the seed when loaded)
 *   network key file, TS_NETKEY_FILE_BYTES = 48 bytes
 *     [0, 16)   "tessera/network\n"
 *     [16, 48)  the network key
 *
 * Loading refuses (with a sentence naming the file and what to do): a missing file
 * (TS_ENOTFOUND), anything but a regular file, a file that group or others have any permission on
 * (TS_EINVAL; "run chmod 600 FILE"), a file of the wrong size or with the wrong header
 * (TS_ECORRUPT), and an identity file whose public key does not match its seed (TS_ECORRUPT).
 * Symbolic links are followed when loading; the checks apply to the file they lead to.
 *
 * Handshake payload, TS_IDENTITY_PAYLOAD_BYTES = 97 bytes, sent by each side in the handshake
 * message that carries its static key (the responder's message 2, the initiator's message 3):
 *
 *   [0, 1)    version, 1
 *   [1, 33)   the sender's Ed25519 public key (its node id)
 *   [33, 97)  Ed25519 signature over TS_IDENTITY_SIG_CONTEXT (26 ASCII bytes, no NUL) followed by
 *             the sender's X25519 static public key (32 bytes)
 *
 * The receiver checks it against the remote static key the handshake has just authenticated
 * (ts_noise_handshake_remote_static). The handshake proves the peer holds that static key's
 * private half; the signature proves the node id's owner vouches for that static key. Replaying
 * someone else's payload therefore gets nowhere without their static private key.
 *
 * Secrets live only in ts_identity_t and ts_netkey_t (and the file buffers, wiped before
 * returning); the *_wipe functions erase them with sodium_memzero, and nothing here prints them.
 */
#ifndef TS_KEYS_H
#define TS_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "net/noise.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_PROLOGUE "tessera/1" /* the Noise prologue of every tessera handshake */

#define TS_NODE_ID_BYTES 32                       /* an Ed25519 public key */
#define TS_NODE_ID_HEX (2 * TS_NODE_ID_BYTES + 1) /* all its hex digits, and the NUL */
#define TS_NODE_ID_SHORT 16                       /* hex digits shown by default */
#define TS_SIGN_SECRET_BYTES 64                   /* libsodium's Ed25519 secret key: seed || pk */
#define TS_SIGNATURE_BYTES 64
#define TS_NETKEY_BYTES TS_NOISE_PSKLEN

#define TS_KEY_FILE_MAGIC_BYTES 16
#define TS_IDENTITY_FILE_MAGIC "tessera/ed25519\n"
#define TS_IDENTITY_FILE_BYTES (TS_KEY_FILE_MAGIC_BYTES + TS_SIGN_SECRET_BYTES)
#define TS_NETKEY_FILE_MAGIC "tessera/network\n"
#define TS_NETKEY_FILE_BYTES (TS_KEY_FILE_MAGIC_BYTES + TS_NETKEY_BYTES)

#define TS_IDENTITY_PAYLOAD_VERSION 1
#define TS_IDENTITY_PAYLOAD_BYTES (1 + TS_NODE_ID_BYTES + TS_SIGNATURE_BYTES)
#define TS_IDENTITY_SIG_CONTEXT "tessera/1 noise static key"

/* A node id: the node's Ed25519 public key. Public. */
typedef struct ts_node_id {
    uint8_t b[TS_NODE_ID_BYTES];
} ts_node_id_t;

/* A node's identity. Secret: wipe it with ts_identity_wipe. */
typedef struct ts_identity {
    ts_node_id_t id;                       /* the Ed25519 public key */
    uint8_t sign_sk[TS_SIGN_SECRET_BYTES]; /* the Ed25519 secret key (libsodium's layout) */
    ts_noise_keypair_t noise;              /* the X25519 static key derived from it */
} ts_identity_t;

/* The network key. Secret: wipe it with ts_netkey_wipe. */
typedef struct ts_netkey {
    uint8_t k[TS_NETKEY_BYTES];
} ts_netkey_t;

/* ---- identity ------------------------------------------------------------------------------- */

/* A fresh random identity. TS_EIO when libsodium cannot be initialised. */
int ts_identity_generate(ts_identity_t *id);

/* Writes id to a new file at path (see the format above). TS_EEXIST when path exists (also as a
 * dangling symbolic link): a key file is never overwritten. TS_EIO / TS_ENOSPC when writing
 * fails, and then no file is left behind. err receives a sentence naming the file. */
int ts_identity_save(const ts_identity_t *id, const char *path, char *err, size_t errlen);

/* Reads an identity file written by ts_identity_save, with the checks listed above. On failure
 * *id is wiped. */
int ts_identity_load(ts_identity_t *id, const char *path, char *err, size_t errlen);

void ts_identity_wipe(ts_identity_t *id);

/* The first `digits` lowercase hex digits of the node id (at most 2 * TS_NODE_ID_BYTES) and a
 * NUL, into out, which holds digits + 1 bytes. */
void ts_node_id_hex(const ts_node_id_t *id, size_t digits, char *out);

/* ---- network key ---------------------------------------------------------------------------- */

int ts_netkey_generate(ts_netkey_t *nk);
/* Same rules as ts_identity_save and ts_identity_load. */
int ts_netkey_save(const ts_netkey_t *nk, const char *path, char *err, size_t errlen);
int ts_netkey_load(ts_netkey_t *nk, const char *path, char *err, size_t errlen);
void ts_netkey_wipe(ts_netkey_t *nk);

/* ---- the handshake -------------------------------------------------------------------------- */

/* Starts tessera's handshake: Noise_XXpsk3 with the prologue TS_PROLOGUE, id's X25519 static key
 * and the network key as psk. The handshake keeps its own copies; wipe id and nk when done. */
int ts_identity_handshake_init(ts_noise_handshake_t *hs, const ts_identity_t *id,
                               const ts_netkey_t *nk, int initiator);

/* This node's handshake payload (the format above), signing id's own static key. */
void ts_identity_payload(const ts_identity_t *id, uint8_t out[TS_IDENTITY_PAYLOAD_BYTES]);

/* Checks a peer's handshake payload against remote_static, the X25519 static key the handshake
 * authenticated for that peer, and on success writes the peer's node id to *peer. TS_ECORRUPT
 * for a payload of the wrong size or a signature that does not verify (tampered, or made for
 * another static key), TS_ENOTSUP for an unknown version; err says which. */
int ts_identity_payload_verify(const uint8_t *payload, size_t len,
                               const uint8_t remote_static[TS_NOISE_DHLEN], ts_node_id_t *peer,
                               char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
