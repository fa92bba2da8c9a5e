/*
 * keys.c — node identity, the network key, their files and the handshake payload (see keys.h).
 *
 * Both file kinds go through the same two functions, write_key_file and read_key_file, which
 * hold every rule about key files (creation mode, no overwrite, permission, size and header
 * checks), so the two kinds cannot drift apart. Every buffer that held key bytes is wiped before
 * it goes out of scope.
 */
#define _POSIX_C_SOURCE 200809L

#include "net/keys.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/str.h"

_Static_assert(TS_SIGN_SECRET_BYTES == crypto_sign_SECRETKEYBYTES, "Ed25519 secret key size");
_Static_assert(TS_NODE_ID_BYTES == crypto_sign_PUBLICKEYBYTES, "Ed25519 public key size");
_Static_assert(TS_SIGNATURE_BYTES == crypto_sign_BYTES, "Ed25519 signature size");
_Static_assert(sizeof TS_IDENTITY_FILE_MAGIC - 1 == TS_KEY_FILE_MAGIC_BYTES, "identity header");
_Static_assert(sizeof TS_NETKEY_FILE_MAGIC - 1 == TS_KEY_FILE_MAGIC_BYTES, "network key header");

#define SIG_CONTEXT_BYTES (sizeof TS_IDENTITY_SIG_CONTEXT - 1)
#define MAX_FILE_BYTES TS_IDENTITY_FILE_BYTES

/* ---- key files ------------------------------------------------------------------------------ */

static int write_all(int fd, const uint8_t *p, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads up to len bytes; returns how many (short only at the end of the file), or -1. */
static ssize_t read_full(int fd, uint8_t *p, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, p + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/* Creates path holding magic || body, mode 0600; never replaces an existing file. */
static int write_key_file(const char *path, const char *what, const char *magic,
                          const uint8_t *body, size_t body_len, char *err, size_t errlen) {
    uint8_t buf[MAX_FILE_BYTES];
    size_t len = TS_KEY_FILE_MAGIC_BYTES + body_len;
    memcpy(buf, magic, TS_KEY_FILE_MAGIC_BYTES);
    memcpy(buf + TS_KEY_FILE_MAGIC_BYTES, body, body_len);

    int rc = TS_OK;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST) {
            ts_set_err(err, errlen, "'%s' already exists; refusing to overwrite a key file", path);
            rc = TS_EEXIST;
        } else {
            ts_set_err(err, errlen, "cannot create %s file '%s': %s", what, path, strerror(errno));
            rc = TS_EIO;
        }
        sodium_memzero(buf, sizeof buf);
        return rc;
    }
    if (fchmod(fd, 0600) != 0 || write_all(fd, buf, len) != 0 || fsync(fd) != 0) {
        rc = errno == ENOSPC ? TS_ENOSPC : TS_EIO;
        ts_set_err(err, errlen, "cannot write %s file '%s': %s", what, path, strerror(errno));
    }
    if (close(fd) != 0 && rc == TS_OK) {
        rc = TS_EIO;
        ts_set_err(err, errlen, "cannot write %s file '%s': %s", what, path, strerror(errno));
    }
    if (rc != TS_OK)
        unlink(path);
    sodium_memzero(buf, sizeof buf);
    return rc;
}

/* Reads a file written by write_key_file into body[0..body_len), refusing anything else. */
static int read_key_file(const char *path, const char *what, const char *magic, uint8_t *body,
                         size_t body_len, char *err, size_t errlen) {
    uint8_t buf[MAX_FILE_BYTES + 1]; /* one more, to see a file that grew since fstat */
    size_t len = TS_KEY_FILE_MAGIC_BYTES + body_len;
    /* O_NONBLOCK: a FIFO put in the key's place must not hang the open (it is refused below). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            ts_set_err(err, errlen, "no %s file at '%s'", what, path);
            return TS_ENOTFOUND;
        }
        ts_set_err(err, errlen, "cannot open %s file '%s': %s", what, path, strerror(errno));
        return TS_EIO;
    }
    int rc = TS_OK;
    struct stat st;
    ssize_t got = 0;
    if (fstat(fd, &st) != 0) {
        ts_set_err(err, errlen, "cannot stat %s file '%s': %s", what, path, strerror(errno));
        rc = TS_EIO;
    } else if (!S_ISREG(st.st_mode)) {
        ts_set_err(err, errlen, "%s file '%s' is not a regular file", what, path);
        rc = TS_EINVAL;
    } else if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        ts_set_err(err, errlen,
                   "%s file '%s' is accessible by group or others (mode %04o); a key file must be "
                   "private to its owner: run chmod 600 '%s'",
                   what, path, (unsigned)(st.st_mode & 07777), path);
        rc = TS_EINVAL;
    } else if (st.st_size != (off_t)len) {
        ts_set_err(err, errlen,
                   "%s file '%s' is %lld bytes, expected %zu: truncated, or not a tessera %s file",
                   what, path, (long long)st.st_size, len, what);
        rc = TS_ECORRUPT;
    } else if ((got = read_full(fd, buf, len + 1)) != (ssize_t)len) {
        if (got < 0)
            ts_set_err(err, errlen, "cannot read %s file '%s': %s", what, path, strerror(errno));
        else
            ts_set_err(err, errlen, "%s file '%s' changed size while being read", what, path);
        rc = got < 0 ? TS_EIO : TS_ECORRUPT;
    } else if (memcmp(buf, magic, TS_KEY_FILE_MAGIC_BYTES) != 0) {
        ts_set_err(err, errlen, "'%s' is not a tessera %s file (wrong header)", path, what);
        rc = TS_ECORRUPT;
    } else {
        memcpy(body, buf + TS_KEY_FILE_MAGIC_BYTES, body_len);
    }
    close(fd);
    sodium_memzero(buf, sizeof buf);
    return rc;
}

/* ---- identity ------------------------------------------------------------------------------- */

/* The X25519 static key of an Ed25519 secret key (see keys.h for why it is derived). */
static void derive_noise_key(ts_identity_t *id) {
    uint8_t x_priv[TS_NOISE_DHLEN];
    crypto_sign_ed25519_sk_to_curve25519(x_priv, id->sign_sk);
    ts_noise_keypair_from_private(&id->noise, x_priv);
    sodium_memzero(x_priv, sizeof x_priv);
}

int ts_identity_generate(ts_identity_t *id) {
    if (!id)
        return TS_EINVAL;
    if (sodium_init() < 0)
        return TS_EIO;
    crypto_sign_keypair(id->id.b, id->sign_sk);
    derive_noise_key(id);
    return TS_OK;
}

int ts_identity_save(const ts_identity_t *id, const char *path, char *err, size_t errlen) {
    if (!id || !path)
        return TS_EINVAL;
    return write_key_file(path, "identity", TS_IDENTITY_FILE_MAGIC, id->sign_sk, sizeof id->sign_sk,
                          err, errlen);
}

int ts_identity_load(ts_identity_t *id, const char *path, char *err, size_t errlen) {
    if (!id || !path)
        return TS_EINVAL;
    if (sodium_init() < 0)
        return TS_EIO;
    uint8_t stored[TS_SIGN_SECRET_BYTES];
    int rc =
        read_key_file(path, "identity", TS_IDENTITY_FILE_MAGIC, stored, sizeof stored, err, errlen);
    if (rc == TS_OK) {
        /* libsodium's secret key is seed || public key: rebuild both from the seed, and refuse a
         * file whose stored public key disagrees (a damaged file would otherwise sign with one
         * key and announce another). */
        crypto_sign_seed_keypair(id->id.b, id->sign_sk, stored);
        if (memcmp(id->id.b, stored + crypto_sign_SEEDBYTES, TS_NODE_ID_BYTES) != 0) {
            ts_set_err(err, errlen,
                       "identity file '%s' is damaged: its public key does not match its secret "
                       "key",
                       path);
            rc = TS_ECORRUPT;
        }
    }
    sodium_memzero(stored, sizeof stored);
    if (rc != TS_OK) {
        ts_identity_wipe(id);
        return rc;
    }
    derive_noise_key(id);
    return TS_OK;
}

void ts_identity_wipe(ts_identity_t *id) {
    if (id)
        sodium_memzero(id, sizeof *id);
}

void ts_node_id_hex(const ts_node_id_t *id, size_t digits, char *out) {
    char full[2 * TS_NODE_ID_BYTES + 1];
    ts_hex(id->b, TS_NODE_ID_BYTES, full);
    if (digits > 2 * TS_NODE_ID_BYTES)
        digits = 2 * TS_NODE_ID_BYTES;
    memcpy(out, full, digits);
    out[digits] = '\0';
}

/* ---- network key ---------------------------------------------------------------------------- */

int ts_netkey_generate(ts_netkey_t *nk) {
    if (!nk)
        return TS_EINVAL;
    if (sodium_init() < 0)
        return TS_EIO;
    randombytes_buf(nk->k, sizeof nk->k);
    return TS_OK;
}

int ts_netkey_save(const ts_netkey_t *nk, const char *path, char *err, size_t errlen) {
    if (!nk || !path)
        return TS_EINVAL;
    return write_key_file(path, "network key", TS_NETKEY_FILE_MAGIC, nk->k, sizeof nk->k, err,
                          errlen);
}

int ts_netkey_load(ts_netkey_t *nk, const char *path, char *err, size_t errlen) {
    if (!nk || !path)
        return TS_EINVAL;
    int rc =
        read_key_file(path, "network key", TS_NETKEY_FILE_MAGIC, nk->k, sizeof nk->k, err, errlen);
    if (rc != TS_OK)
        ts_netkey_wipe(nk);
    return rc;
}

void ts_netkey_wipe(ts_netkey_t *nk) {
    if (nk)
        sodium_memzero(nk, sizeof *nk);
}

/* ---- the handshake -------------------------------------------------------------------------- */

int ts_identity_handshake_init(ts_noise_handshake_t *hs, const ts_identity_t *id,
                               const ts_netkey_t *nk, int initiator) {
    if (!hs || !id || !nk)
        return TS_EINVAL;
    ts_noise_handshake_opts_t o = {
        .pattern = TS_NOISE_XXPSK3,
        .initiator = initiator,
        .prologue = (const uint8_t *)TS_PROLOGUE,
        .prologue_len = sizeof TS_PROLOGUE - 1,
        .s_priv = id->noise.priv,
        .psk = nk->k,
    };
    return ts_noise_handshake_init(hs, &o);
}

/* What the payload's signature covers: the context string, then the static public key. */
static void signed_message(uint8_t out[SIG_CONTEXT_BYTES + TS_NOISE_DHLEN],
                           const uint8_t static_pub[TS_NOISE_DHLEN]) {
    memcpy(out, TS_IDENTITY_SIG_CONTEXT, SIG_CONTEXT_BYTES);
    memcpy(out + SIG_CONTEXT_BYTES, static_pub, TS_NOISE_DHLEN);
}

void ts_identity_payload(const ts_identity_t *id, uint8_t out[TS_IDENTITY_PAYLOAD_BYTES]) {
    uint8_t msg[SIG_CONTEXT_BYTES + TS_NOISE_DHLEN];
    signed_message(msg, id->noise.pub);
    out[0] = TS_IDENTITY_PAYLOAD_VERSION;
    memcpy(out + 1, id->id.b, TS_NODE_ID_BYTES);
    crypto_sign_detached(out + 1 + TS_NODE_ID_BYTES, NULL, msg, sizeof msg, id->sign_sk);
}

int ts_identity_payload_verify(const uint8_t *payload, size_t len,
                               const uint8_t remote_static[TS_NOISE_DHLEN], ts_node_id_t *peer,
                               char *err, size_t errlen) {
    if ((!payload && len) || !remote_static || !peer)
        return TS_EINVAL;
    if (len != TS_IDENTITY_PAYLOAD_BYTES) {
        ts_set_err(err, errlen, "the peer's handshake payload is %zu bytes, expected %d", len,
                   TS_IDENTITY_PAYLOAD_BYTES);
        return TS_ECORRUPT;
    }
    if (payload[0] != TS_IDENTITY_PAYLOAD_VERSION) {
        ts_set_err(err, errlen, "the peer's handshake payload has version %u; this node speaks %d",
                   payload[0], TS_IDENTITY_PAYLOAD_VERSION);
        return TS_ENOTSUP;
    }
    uint8_t msg[SIG_CONTEXT_BYTES + TS_NOISE_DHLEN];
    signed_message(msg, remote_static);
    const uint8_t *pk = payload + 1, *sig = payload + 1 + TS_NODE_ID_BYTES;
    if (crypto_sign_verify_detached(sig, msg, sizeof msg, pk) != 0) {
        ts_set_err(err, errlen,
                   "the peer's identity signature does not cover the Noise static key it used");
        return TS_ECORRUPT;
    }
    memcpy(peer->b, pk, TS_NODE_ID_BYTES);
    return TS_OK;
}
