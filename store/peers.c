/*
 * peers.c — the address book in the `peers` database (see peers.h).
 *
 * Encoding of an entry (the key is the 32-byte node id), all integers big-endian:
 *
 *   offset  size  field
 *   0       1     version, 1
 *   1       4     flags
 *   5       8     last_seen, two's complement
 *   13      1     n, the number of addresses, 0..8
 *   14      …     n × (1-byte length L in 1..255, then L bytes of "host:port")
 *
 * and the value ends exactly after the last address. Decoding checks every length against what
 * is left before reading, and each address with the same rule the encoder applies, so anything
 * stored by another version or damaged on disk is TS_ECORRUPT, not a crash. A later version may
 * append fields; it bumps the version byte, and this one refuses what it does not know.
 */
#define _POSIX_C_SOURCE 200809L

#include "store/peers.h"

#include <stdlib.h>
#include <string.h>

#define PEER_VERSION 1
#define PEER_HEADER 14

int ts_addr_valid(const char *a, size_t len, int allow_port0) {
    if (len < 3 || len > TS_PEER_ADDR_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (a[i] <= ' ' || a[i] >= 0x7f)
            return 0;
    const char *colon = NULL;
    for (size_t i = len; i-- > 0;)
        if (a[i] == ':') {
            colon = a + i;
            break;
        }
    if (!colon || colon == a)
        return 0;
    size_t hlen = (size_t)(colon - a), plen = len - hlen - 1;
    if (a[0] == '[') {
        if (hlen < 3 || a[hlen - 1] != ']' || memchr(a + 1, ']', hlen - 2))
            return 0;
    } else if (memchr(a, ':', hlen) || memchr(a, '[', hlen) || memchr(a, ']', hlen)) {
        return 0;
    }
    if (plen < 1 || plen > 5)
        return 0;
    unsigned port = 0;
    for (size_t i = 0; i < plen; i++) {
        char c = colon[1 + i];
        if (c < '0' || c > '9')
            return 0;
        port = port * 10 + (unsigned)(c - '0');
    }
    return port >= (allow_port0 ? 0u : 1u) && port <= 65535;
}

int ts_peer_encode(const ts_peer_t *p, unsigned char *buf, size_t *len) {
    if (!p || !buf || !len || p->n_addrs < 0 || p->n_addrs > TS_PEER_MAX_ADDRS)
        return TS_EINVAL;
    buf[0] = PEER_VERSION;
    for (int i = 0; i < 4; i++)
        buf[1 + i] = (unsigned char)(p->flags >> (24 - 8 * i));
    uint64_t seen = (uint64_t)p->last_seen;
    for (int i = 0; i < 8; i++)
        buf[5 + i] = (unsigned char)(seen >> (56 - 8 * i));
    buf[13] = (unsigned char)p->n_addrs;
    size_t at = PEER_HEADER;
    for (int i = 0; i < p->n_addrs; i++) {
        size_t n = strnlen(p->addrs[i], TS_PEER_ADDR_MAX + 1);
        if (!ts_addr_valid(p->addrs[i], n, 0))
            return TS_EINVAL;
        buf[at++] = (unsigned char)n;
        memcpy(buf + at, p->addrs[i], n);
        at += n;
    }
    *len = at;
    return TS_OK;
}

int ts_peer_decode(const uint8_t id[TS_PEER_ID_LEN], const unsigned char *buf, size_t len,
                   ts_peer_t *p) {
    if (!id || (!buf && len) || !p)
        return TS_EINVAL;
    if (len < PEER_HEADER || buf[0] != PEER_VERSION || buf[13] > TS_PEER_MAX_ADDRS)
        return TS_ECORRUPT;
    ts_peer_t out;
    memset(&out, 0, sizeof out);
    memcpy(out.id, id, TS_PEER_ID_LEN);
    for (int i = 0; i < 4; i++)
        out.flags = (out.flags << 8) | buf[1 + i];
    uint64_t seen = 0;
    for (int i = 0; i < 8; i++)
        seen = (seen << 8) | buf[5 + i];
    memcpy(&out.last_seen, &seen, sizeof seen); /* two's complement, without overflow */
    out.n_addrs = buf[13];
    size_t at = PEER_HEADER;
    for (int i = 0; i < out.n_addrs; i++) {
        if (at >= len)
            return TS_ECORRUPT;
        size_t n = buf[at++];
        if (n > len - at || !ts_addr_valid((const char *)buf + at, n, 0))
            return TS_ECORRUPT;
        memcpy(out.addrs[i], buf + at, n);
        out.addrs[i][n] = '\0';
        at += n;
    }
    if (at != len)
        return TS_ECORRUPT;
    *p = out;
    return TS_OK;
}

/* ---- the book --------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *id;
    const unsigned char *val;
    size_t len;
    ts_peer_t *out;
} peer_op_t;

static int put_fn(void *ctx, ts_store_txn_t *txn) {
    peer_op_t *op = ctx;
    return ts_txn_put(txn, TS_DB_PEERS, op->id, TS_PEER_ID_LEN, op->val, op->len);
}

int ts_peers_put(ts_store_t *s, const ts_peer_t *p) {
    if (!s || !p)
        return TS_EINVAL;
    unsigned char buf[TS_PEER_ENCODED_MAX];
    size_t len;
    int rc = ts_peer_encode(p, buf, &len);
    if (rc)
        return rc;
    peer_op_t op = {.id = p->id, .val = buf, .len = len};
    return ts_store_write(s, put_fn, &op);
}

static int get_fn(void *ctx, ts_store_txn_t *txn) {
    peer_op_t *op = ctx;
    const void *v;
    size_t n;
    int rc = ts_txn_get(txn, TS_DB_PEERS, op->id, TS_PEER_ID_LEN, &v, &n);
    return rc ? rc : ts_peer_decode(op->id, v, n, op->out);
}

int ts_peers_get(ts_store_t *s, const uint8_t id[TS_PEER_ID_LEN], ts_peer_t *p) {
    if (!s || !id || !p)
        return TS_EINVAL;
    peer_op_t op = {.id = id, .out = p};
    return ts_store_read(s, get_fn, &op);
}

static int del_fn(void *ctx, ts_store_txn_t *txn) {
    peer_op_t *op = ctx;
    return ts_txn_del(txn, TS_DB_PEERS, op->id, TS_PEER_ID_LEN);
}

int ts_peers_del(ts_store_t *s, const uint8_t id[TS_PEER_ID_LEN]) {
    if (!s || !id)
        return TS_EINVAL;
    peer_op_t op = {.id = id};
    return ts_store_write(s, del_fn, &op);
}

typedef struct {
    ts_peers_each_fn fn;
    void *ctx;
    ts_peer_t p; /* one decoded entry at a time (2 KiB: kept off the stack of the walk) */
} list_t;

static int list_each(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    list_t *ls = ctx;
    if (klen != TS_PEER_ID_LEN || ts_peer_decode(key, val, vlen, &ls->p) != TS_OK)
        return TS_ECORRUPT;
    return ls->fn(ls->ctx, &ls->p);
}

static int list_fn(void *ctx, ts_store_txn_t *txn) {
    return ts_txn_foreach(txn, TS_DB_PEERS, NULL, 0, list_each, ctx);
}

int ts_peers_list(ts_store_t *s, ts_peers_each_fn fn, void *ctx) {
    if (!s || !fn)
        return TS_EINVAL;
    list_t *ls = malloc(sizeof *ls);
    if (!ls)
        return TS_ENOMEM;
    ls->fn = fn;
    ls->ctx = ctx;
    int rc = ts_store_read(s, list_fn, ls);
    free(ls);
    return rc;
}

/* ---- prune ------------------------------------------------------------------------------ */

typedef struct {
    int64_t older_than;
    unsigned char *keys; /* the keys to delete, back to back, each klen[i] bytes */
    size_t *klens;
    size_t n, cap, bytes, bytes_cap;
    ts_peer_t p;
} prune_t;

static int prune_mark(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    prune_t *pr = ctx;
    if (klen == TS_PEER_ID_LEN && ts_peer_decode(key, val, vlen, &pr->p) == TS_OK &&
        pr->p.last_seen >= pr->older_than)
        return TS_OK;
    /* stale or undecodable: remember the key (deleting inside the walk is not allowed) */
    if (pr->n == pr->cap) {
        size_t cap = pr->cap ? 2 * pr->cap : 16;
        size_t *k = realloc(pr->klens, cap * sizeof *k);
        if (!k)
            return TS_ENOMEM;
        pr->klens = k;
        pr->cap = cap;
    }
    if (pr->bytes + klen > pr->bytes_cap) {
        size_t cap = 2 * (pr->bytes_cap + klen);
        unsigned char *b = realloc(pr->keys, cap);
        if (!b)
            return TS_ENOMEM;
        pr->keys = b;
        pr->bytes_cap = cap;
    }
    memcpy(pr->keys + pr->bytes, key, klen);
    pr->bytes += klen;
    pr->klens[pr->n++] = klen;
    return TS_OK;
}

static int prune_fn(void *ctx, ts_store_txn_t *txn) {
    prune_t *pr = ctx;
    pr->n = pr->bytes = 0;
    int rc = ts_txn_foreach(txn, TS_DB_PEERS, NULL, 0, prune_mark, pr);
    size_t at = 0;
    for (size_t i = 0; i < pr->n && rc == TS_OK; i++) {
        rc = ts_txn_del(txn, TS_DB_PEERS, pr->keys + at, pr->klens[i]);
        at += pr->klens[i];
    }
    return rc;
}

int ts_peers_prune(ts_store_t *s, int64_t older_than, int *removed) {
    if (removed)
        *removed = 0;
    if (!s)
        return TS_EINVAL;
    prune_t *pr = calloc(1, sizeof *pr);
    if (!pr)
        return TS_ENOMEM;
    pr->older_than = older_than;
    int rc = ts_store_write(s, prune_fn, pr);
    if (rc == TS_OK && removed)
        *removed = (int)pr->n;
    free(pr->keys);
    free(pr->klens);
    free(pr);
    return rc;
}
