/*
 * vouch.c — vouches kept between client runs (see vouch.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "store/vouch.h"

#include <string.h>

#define VOUCH_VERSION 1
#define PREFIX "vouch/"
#define PREFIX_LEN 6
#define KEY_LEN (PREFIX_LEN + 2 * TS_VOUCH_ID_BYTES)

static void make_key(uint8_t key[KEY_LEN], const uint8_t *node, const uint8_t *weights) {
    memcpy(key, PREFIX, PREFIX_LEN);
    memcpy(key + PREFIX_LEN, node, TS_VOUCH_ID_BYTES);
    if (weights)
        memcpy(key + PREFIX_LEN + TS_VOUCH_ID_BYTES, weights, TS_VOUCH_ID_BYTES);
}

int ts_vouch_encode(const ts_vouch_t *v, uint8_t *out) {
    size_t n = strnlen(v->device_class, TS_VOUCH_CLASS_MAX + 1);
    if (n < 1 || n > TS_VOUCH_CLASS_MAX || v->precision == 0)
        return -1;
    out[0] = VOUCH_VERSION;
    out[1] = v->precision;
    uint64_t w = (uint64_t)v->when;
    for (int i = 0; i < 8; i++)
        out[2 + i] = (uint8_t)(w >> (56 - 8 * i));
    out[10] = (uint8_t)n;
    memcpy(out + 11, v->device_class, n);
    return (int)(11 + n);
}

int ts_vouch_decode(const uint8_t *val, size_t len, ts_vouch_t *v) {
    if (len < 12 || val[0] != VOUCH_VERSION || val[1] == 0)
        return TS_ECORRUPT;
    size_t n = val[10];
    if (n < 1 || n > TS_VOUCH_CLASS_MAX || len != 11 + n || memchr(val + 11, '\0', n))
        return TS_ECORRUPT;
    uint64_t w = 0;
    for (int i = 0; i < 8; i++)
        w = w << 8 | val[2 + i];
    v->precision = val[1];
    v->when = (int64_t)w;
    memcpy(v->device_class, val + 11, n);
    v->device_class[n] = '\0';
    return TS_OK;
}

typedef struct {
    const ts_vouch_t *in;
    ts_vouch_t *out;
    const uint8_t *node, *weights;
    int forgotten;
} op_t;

static int put_fn(void *ctx, ts_store_txn_t *txn) {
    op_t *op = ctx;
    uint8_t key[KEY_LEN], val[TS_VOUCH_VALUE_MAX];
    make_key(key, op->in->node, op->in->weights);
    int n = ts_vouch_encode(op->in, val);
    return ts_txn_put(txn, TS_DB_META, key, sizeof key, val, (size_t)n);
}

int ts_vouch_put(ts_store_t *s, const ts_vouch_t *v) {
    uint8_t probe[TS_VOUCH_VALUE_MAX];
    if (!s || !v || ts_vouch_encode(v, probe) < 0)
        return TS_EINVAL;
    op_t op = {.in = v};
    return ts_store_write(s, put_fn, &op);
}

static int get_fn(void *ctx, ts_store_txn_t *txn) {
    op_t *op = ctx;
    uint8_t key[KEY_LEN];
    make_key(key, op->node, op->weights);
    const void *val;
    size_t len;
    int rc = ts_txn_get(txn, TS_DB_META, key, sizeof key, &val, &len);
    if (rc != TS_OK)
        return rc;
    return ts_vouch_decode(val, len, op->out) == TS_OK ? TS_OK : TS_ENOTFOUND;
}

int ts_vouch_get(ts_store_t *s, const uint8_t node[TS_VOUCH_ID_BYTES],
                 const uint8_t weights[TS_VOUCH_ID_BYTES], int64_t ttl_s, int64_t now,
                 ts_vouch_t *v) {
    if (!s || !node || !weights || !v || ttl_s <= 0)
        return TS_ENOTFOUND;
    op_t op = {.out = v, .node = node, .weights = weights};
    int rc = ts_store_read(s, get_fn, &op);
    if (rc != TS_OK)
        return rc == TS_ENOTFOUND || rc == TS_ECORRUPT ? TS_ENOTFOUND : rc;
    if (v->when > now + 60 || now - v->when > ttl_s)
        return TS_ENOTFOUND;
    memcpy(v->node, node, TS_VOUCH_ID_BYTES);
    memcpy(v->weights, weights, TS_VOUCH_ID_BYTES);
    return TS_OK;
}

/* The keys of one node are collected first (fn must not write while it iterates), then
 * deleted: a node vouched for on at most this many experts is forgotten in one pass. */
#define FORGET_BATCH 64

typedef struct {
    uint8_t keys[FORGET_BATCH][KEY_LEN];
    int n;
} forget_t;

static int forget_each(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    (void)val;
    (void)vlen;
    forget_t *f = ctx;
    if (klen != KEY_LEN || f->n == FORGET_BATCH)
        return TS_OK;
    memcpy(f->keys[f->n++], key, KEY_LEN);
    return TS_OK;
}

static int forget_fn(void *ctx, ts_store_txn_t *txn) {
    op_t *op = ctx;
    uint8_t prefix[KEY_LEN];
    make_key(prefix, op->node, NULL);
    op->forgotten = 0;
    for (;;) {
        forget_t f = {.n = 0};
        int rc = ts_txn_foreach(txn, TS_DB_META, prefix, PREFIX_LEN + TS_VOUCH_ID_BYTES,
                                forget_each, &f);
        for (int i = 0; rc == TS_OK && i < f.n; i++)
            rc = ts_txn_del(txn, TS_DB_META, f.keys[i], KEY_LEN);
        if (rc != TS_OK)
            return rc;
        op->forgotten += f.n;
        if (f.n < FORGET_BATCH)
            return TS_OK;
    }
}

int ts_vouch_forget(ts_store_t *s, const uint8_t node[TS_VOUCH_ID_BYTES], int *n) {
    if (!s || !node)
        return TS_EINVAL;
    op_t op = {.node = node};
    int rc = ts_store_write(s, forget_fn, &op);
    if (n)
        *n = rc == TS_OK ? op.forgotten : 0;
    return rc;
}
