/*
 * weights.c — expert weights as content-addressed chunks in the store (see weights.h).
 *
 * How the pieces fit. An import reads the file whole and validates it with ts_st_parse, then
 * hashes it in one pass: each 1 MiB chunk on its own (its key) and all of them in order (the
 * weights hash). The chunks are written in transactions of TS_WEIGHTS_BATCH; a chunk already in
 * the store with the same bytes is skipped, which is the deduplication, and one with other
 * bytes under its key (damage) is overwritten. The manifest goes last, in its own transaction,
 * which first checks that every chunk it names is there: an import therefore commits either the
 * whole expert or no manifest at all, whatever moment a kill -9 or a concurrent gc strikes.
 *
 * Reading goes the other way, chunk by chunk inside one read transaction: each chunk's bytes are
 * hashed against its key and fed into a running hash of the file, which must end equal to the
 * weights hash (that also catches a manifest whose chunk list was damaged). Export streams the
 * chunks into a temporary file and renames it; load assembles them in memory.
 *
 * Bookkeeping (pin, LRU clock) lives in the manifest, so a manifest is rewritten by pin and
 * touch; the clock itself is one counter in `meta`. gc and evict work on the set of referenced
 * chunks (every manifest's chunk list, sorted, with a count of references each): gc deletes what
 * is not in it; evict removes manifests least recently used first, decrementing the counts, until
 * the bytes of chunks still referenced fit the budget, then deletes the chunks whose count fell
 * to zero — in the same transaction, so a crash leaves the store before or after, never between.
 *
 * Every store function below is a pair: a transaction function (restartable: the store reruns
 * a write function after growing the map, so each one starts by resetting what it computes) and
 * the public function that runs it and, after the transaction, calls the caller's callbacks.
 */
#define _POSIX_C_SOURCE 200809L

#include "store/weights.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "base/file.h"
#include "base/str.h"
#include "model/dit_io.h"
#include "model/safetensors.h"

#define LRU_KEY "weights.lru_clock"
#define MAX_FILE ((uint64_t)1 << 40)       /* as the safetensors reader */
#define MAX_CHUNK_SIZE ((uint64_t)1 << 26) /* a manifest's chunk_size above this is refused */

/* Puts "prefix" in front of the sentence already in err. */
static void prefix_err(char *err, size_t errlen, const char *prefix) {
    if (!err || errlen == 0)
        return;
    char *was = strdup(err);
    if (!was)
        return;
    ts_set_err(err, errlen, "%s%s", prefix, was);
    free(was);
}

static void errno_text(int errnum, char *buf, size_t len) {
    if (strerror_r(errnum, buf, len) != 0)
        snprintf(buf, len, "error %d", errnum);
}

/* ---- hashes ----------------------------------------------------------------------------- */

/* libsodium picks its fastest BLAKE2b at sodium_init; calling it again is harmless, and should
 * it fail (no entropy source), hashing still works with the portable code. */
static void crypto_ready(void) {
    int rc = sodium_init();
    (void)rc;
}

void ts_hash_compute(ts_hash_t *h, const void *data, size_t len) {
    crypto_ready();
    crypto_generichash(h->b, TS_HASH_BYTES, data, len, NULL, 0);
}

void ts_hash_hex(const ts_hash_t *h, char *out) { ts_hex(h->b, TS_HASH_BYTES, out); }

static int hex_digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int ts_hash_parse(const char *hex, ts_hash_t *h) {
    if (!hex || !h || strlen(hex) != 2 * TS_HASH_BYTES)
        return TS_EINVAL;
    ts_hash_t out;
    for (int i = 0; i < TS_HASH_BYTES; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return TS_EINVAL;
        out.b[i] = (unsigned char)(hi << 4 | lo);
    }
    *h = out;
    return TS_OK;
}

/* A hash as text, for messages. */
typedef struct {
    char s[TS_HASH_HEX];
} hex_t;

static hex_t hexof(const ts_hash_t *h) {
    hex_t out;
    ts_hash_hex(h, out.s);
    return out;
}

static int hash_cmp(const void *a, const void *b) { return memcmp(a, b, TS_HASH_BYTES); }

/* ---- manifests ---------------------------------------------------------------------------- */

typedef struct manifest {
    json_t *root; /* the whole manifest; owned */
    ts_hash_t hash;
    uint64_t size, chunk_size, n_chunks;
    ts_hash_t *chunks; /* n_chunks, owned */
    int n_tensors;
    int pinned;
    uint64_t lru;
    int64_t last_used, imported;
} manifest_t;

static void manifest_free(manifest_t *m) {
    if (!m)
        return;
    json_decref(m->root);
    free(m->chunks);
    memset(m, 0, sizeof *m);
}

static void manifests_free(manifest_t *ms, size_t n) {
    for (size_t i = 0; i < n; i++)
        manifest_free(&ms[i]);
    free(ms);
}

static uint64_t chunk_len(uint64_t size, uint64_t chunk_size, uint64_t i) {
    uint64_t off = i * chunk_size;
    return size - off < chunk_size ? size - off : chunk_size;
}

static int json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

/* Parses and checks a stored manifest; key (when not NULL) is the hash it is stored under. */
static int manifest_parse(const void *val, size_t vlen, const ts_hash_t *key, manifest_t *m,
                          char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    json_error_t je;
    m->root = json_loadb(val, vlen, JSON_REJECT_DUPLICATES, &je);
    if (!m->root || !json_is_object(m->root)) {
        ts_set_err(err, errlen, "the manifest is not a JSON object%s%s", m->root ? "" : ": ",
                   m->root ? "" : je.text);
        goto bad;
    }
    const json_t *r = m->root;
    const char *format = json_string_value(json_object_get(r, "format"));
    if (!format || strcmp(format, TS_WEIGHTS_FORMAT) != 0) {
        ts_set_err(err, errlen, "the manifest's format is '%.40s', this build reads '%s'",
                   format ? format : "(none)", TS_WEIGHTS_FORMAT);
        goto bad;
    }
    const char *hash = json_string_value(json_object_get(r, "hash"));
    if (!hash || ts_hash_parse(hash, &m->hash) != TS_OK) {
        ts_set_err(err, errlen, "the manifest's hash is missing or not 64 hex digits");
        goto bad;
    }
    if (key && memcmp(key->b, m->hash.b, TS_HASH_BYTES) != 0) {
        ts_set_err(err, errlen, "the manifest says hash %s but is stored under %s", hash,
                   hexof(key).s);
        goto bad;
    }
    if (!json_u64(json_object_get(r, "size"), &m->size) || m->size > MAX_FILE ||
        !json_u64(json_object_get(r, "chunk_size"), &m->chunk_size) || m->chunk_size == 0 ||
        m->chunk_size > MAX_CHUNK_SIZE) {
        ts_set_err(err, errlen, "the manifest's size or chunk_size is missing or out of range");
        goto bad;
    }
    const json_t *chunks = json_object_get(r, "chunks");
    m->n_chunks = (m->size + m->chunk_size - 1) / m->chunk_size;
    if (!json_is_array(chunks) || json_array_size(chunks) != m->n_chunks) {
        ts_set_err(err, errlen, "the manifest lists %zu chunks, a %llu-byte file has %llu",
                   json_is_array(chunks) ? json_array_size(chunks) : 0, (unsigned long long)m->size,
                   (unsigned long long)m->n_chunks);
        goto bad;
    }
    m->chunks = malloc((m->n_chunks ? m->n_chunks : 1) * sizeof *m->chunks);
    if (!m->chunks) {
        ts_set_err(err, errlen, "out of memory");
        manifest_free(m);
        return TS_ENOMEM;
    }
    for (uint64_t i = 0; i < m->n_chunks; i++)
        if (ts_hash_parse(json_string_value(json_array_get(chunks, i)), &m->chunks[i]) != TS_OK) {
            ts_set_err(err, errlen, "the manifest's chunk %llu is not 64 hex digits",
                       (unsigned long long)i);
            goto bad;
        }
    const json_t *tensors = json_object_get(r, "tensors"), *meta = json_object_get(r, "metadata");
    if (!json_is_array(tensors) || (meta && !json_is_object(meta))) {
        ts_set_err(err, errlen, "the manifest's tensors or metadata are malformed");
        goto bad;
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)meta, k, v) {
        if (!json_is_string(v)) {
            ts_set_err(err, errlen, "the manifest's metadata '%.60s' is not a string", k);
            goto bad;
        }
    }
    m->n_tensors = (int)json_array_size(tensors);
    uint64_t u;
    m->pinned = json_is_true(json_object_get(r, "pinned"));
    m->lru = json_u64(json_object_get(r, "lru"), &u) ? u : 0;
    m->last_used = json_u64(json_object_get(r, "last_used"), &u) ? (int64_t)u : 0;
    m->imported = json_u64(json_object_get(r, "imported"), &u) ? (int64_t)u : 0;
    return TS_OK;
bad:
    manifest_free(m);
    return TS_ECORRUPT;
}

/* The manifest of a validated file, without the bookkeeping fields (write_manifest adds them). */
static json_t *manifest_build(const ts_st_file_t *f, const ts_hash_t *whole,
                              const ts_hash_t *chunks, uint64_t n_chunks) {
    json_t *root = json_object(), *list = json_array(), *tensors = json_array(),
           *meta = json_object();
    int ok = root && list && tensors && meta;
    for (uint64_t i = 0; ok && i < n_chunks; i++)
        ok = json_array_append_new(list, json_string(hexof(&chunks[i]).s)) == 0;
    for (int i = 0; ok && i < f->n_tensors; i++) {
        const ts_st_tensor_t *t = &f->tensors[i];
        json_t *shape = json_array();
        for (int d = 0; shape && d < t->ndim; d++)
            if (json_array_append_new(shape, json_integer(t->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *e = shape ? json_pack("{s:s, s:s, s:o, s:[I,I]}", "name", t->name, "dtype",
                                      ts_st_dtype_name(t->dtype), "shape", shape, "data_offsets",
                                      (json_int_t)t->begin, (json_int_t)t->end)
                          : NULL;
        ok = e && json_array_append_new(tensors, e) == 0;
    }
    for (int i = 0; ok && i < f->n_meta; i++)
        ok = json_object_set_new(meta, f->meta_keys[i], json_string(f->meta_vals[i])) == 0;
    if (ok)
        ok = json_object_set_new(root, "format", json_string(TS_WEIGHTS_FORMAT)) == 0 &&
             json_object_set_new(root, "hash", json_string(hexof(whole).s)) == 0 &&
             json_object_set_new(root, "size", json_integer((json_int_t)f->len)) == 0 &&
             json_object_set_new(root, "chunk_size", json_integer((json_int_t)TS_WEIGHTS_CHUNK)) ==
                 0 &&
             json_object_set(root, "chunks", list) == 0 &&
             json_object_set(root, "tensors", tensors) == 0 &&
             json_object_set(root, "metadata", meta) == 0;
    json_decref(list);
    json_decref(tensors);
    json_decref(meta);
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Serialises root and stores it under h. */
static int manifest_put(ts_store_txn_t *t, const ts_hash_t *h, json_t *root) {
    char *text = json_dumps(root, JSON_COMPACT);
    if (!text)
        return TS_ENOMEM;
    int rc = ts_txn_put(t, TS_DB_MANIFESTS, h->b, TS_HASH_BYTES, text, strlen(text));
    free(text);
    return rc;
}

/* On failure *m is empty (manifest_free is harmless on it). */
static int manifest_get(ts_store_txn_t *t, const ts_hash_t *h, manifest_t *m, char *err,
                        size_t errlen) {
    memset(m, 0, sizeof *m);
    const void *val;
    size_t vlen;
    int rc = ts_txn_get(t, TS_DB_MANIFESTS, h->b, TS_HASH_BYTES, &val, &vlen);
    if (rc == TS_ENOTFOUND) {
        ts_set_err(err, errlen, "no weights %s in the store", hexof(h).s);
        return rc;
    }
    if (rc) {
        ts_set_err(err, errlen, "reading the manifest of %s failed: %s", hexof(h).s,
                   ts_strerror(rc));
        return rc;
    }
    rc = manifest_parse(val, vlen, h, m, err, errlen);
    if (rc) {
        char pre[120];
        snprintf(pre, sizeof pre, "weights %.16s: ", hexof(h).s);
        prefix_err(err, errlen, pre);
    }
    return rc;
}

/* Every manifest of the store, parsed (in hash order). The first that does not parse stops the
 * walk with TS_ECORRUPT and its hash in *bad. */
typedef struct {
    manifest_t *ms;
    size_t n, cap;
    ts_hash_t bad;
    char err[256];
} all_t;

static int collect_one(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    all_t *a = ctx;
    if (klen != TS_HASH_BYTES) {
        snprintf(a->err, sizeof a->err, "a manifest key is %zu bytes, not %d", klen, TS_HASH_BYTES);
        memset(&a->bad, 0, sizeof a->bad);
        return TS_ECORRUPT;
    }
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 16;
        manifest_t *ms = realloc(a->ms, cap * sizeof *ms);
        if (!ms)
            return TS_ENOMEM;
        a->ms = ms, a->cap = cap;
    }
    memcpy(a->bad.b, key, TS_HASH_BYTES);
    int rc = manifest_parse(val, vlen, &a->bad, &a->ms[a->n], a->err, sizeof a->err);
    if (rc == TS_OK)
        a->n++;
    return rc;
}

static void all_reset(all_t *a) {
    manifests_free(a->ms, a->n);
    memset(a, 0, sizeof *a);
}

static int collect_all(ts_store_txn_t *t, all_t *a) {
    all_reset(a);
    return ts_txn_foreach(t, TS_DB_MANIFESTS, NULL, 0, collect_one, a);
}

/* ---- the set of referenced chunks --------------------------------------------------------- */

typedef struct ref {
    ts_hash_t h;    /* first: refs sort and search by hash */
    uint64_t count; /* references from manifests (each occurrence counts) */
    uint64_t size;  /* stored bytes (0 when missing) */
} ref_t;

typedef struct {
    ref_t *r;
    size_t n;
} refs_t;

static int ref_cmp(const void *a, const void *b) { return hash_cmp(a, b); }

static int refs_build(refs_t *out, const manifest_t *ms, size_t n) {
    out->r = NULL, out->n = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += ms[i].n_chunks;
    ref_t *r = malloc((total ? total : 1) * sizeof *r);
    if (!r)
        return TS_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < ms[i].n_chunks; j++)
            r[k++] = (ref_t){.h = ms[i].chunks[j], .count = 1, .size = 0};
    qsort(r, k, sizeof *r, ref_cmp);
    size_t u = 0;
    for (size_t i = 0; i < k; i++) {
        if (u > 0 && hash_cmp(&r[u - 1].h, &r[i].h) == 0)
            r[u - 1].count++;
        else
            r[u++] = r[i];
    }
    out->r = r, out->n = u;
    return TS_OK;
}

static ref_t *refs_find(const refs_t *refs, const void *hash) {
    return refs->n ? bsearch(hash, refs->r, refs->n, sizeof *refs->r, ref_cmp) : NULL;
}

/* A chunk key whose count is zero, or not referenced at all, is an orphan. */
typedef struct {
    const refs_t *refs;
    ts_hash_t *keys;
    size_t n, cap;
    uint64_t bytes, all_chunks, all_bytes;
} orphans_t;

static int orphan_one(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    (void)val;
    orphans_t *o = ctx;
    o->all_chunks++;
    o->all_bytes += vlen;
    if (klen != TS_HASH_BYTES)
        return TS_OK; /* not a chunk of ours: leave it */
    const ref_t *r = refs_find(o->refs, key);
    if (r && r->count > 0)
        return TS_OK;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        ts_hash_t *keys = realloc(o->keys, cap * sizeof *keys);
        if (!keys)
            return TS_ENOMEM;
        o->keys = keys, o->cap = cap;
    }
    memcpy(o->keys[o->n++].b, key, TS_HASH_BYTES);
    o->bytes += vlen;
    return TS_OK;
}

/* Finds the orphans (into o, which the caller frees with free(o->keys)) and, when del, deletes
 * them. */
static int orphans_sweep(ts_store_txn_t *t, const refs_t *refs, orphans_t *o, int del) {
    *o = (orphans_t){.refs = refs};
    int rc = ts_txn_foreach(t, TS_DB_CHUNKS, NULL, 0, orphan_one, o);
    for (size_t i = 0; rc == TS_OK && del && i < o->n; i++)
        rc = ts_txn_del(t, TS_DB_CHUNKS, o->keys[i].b, TS_HASH_BYTES);
    return rc;
}

/* ---- the LRU clock ------------------------------------------------------------------------ */

static int clock_next(ts_store_txn_t *t, uint64_t *out) {
    const void *val;
    size_t vlen;
    uint64_t c = 0;
    int rc = ts_txn_get(t, TS_DB_META, LRU_KEY, sizeof LRU_KEY - 1, &val, &vlen);
    if (rc == TS_OK && vlen == 8) {
        const unsigned char *p = val;
        for (int i = 7; i >= 0; i--)
            c = c << 8 | p[i];
    } else if (rc != TS_OK && rc != TS_ENOTFOUND) {
        return rc;
    }
    c++;
    unsigned char buf[8];
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(c >> (8 * i));
    rc = ts_txn_put(t, TS_DB_META, LRU_KEY, sizeof LRU_KEY - 1, buf, sizeof buf);
    if (rc == TS_OK)
        *out = c;
    return rc;
}

/* Sets the bookkeeping fields of a manifest being written. */
static int set_bookkeeping(json_t *root, int pinned, uint64_t lru, int64_t last_used,
                           int64_t imported) {
    int bad = json_object_set_new(root, "pinned", json_boolean(pinned)) != 0;
    bad |= json_object_set_new(root, "lru", json_integer((json_int_t)lru)) != 0;
    bad |= json_object_set_new(root, "last_used", json_integer((json_int_t)last_used)) != 0;
    bad |= json_object_set_new(root, "imported", json_integer((json_int_t)imported)) != 0;
    return bad ? TS_ENOMEM : TS_OK;
}

/* ---- import ------------------------------------------------------------------------------- */

typedef struct import_job {
    const unsigned char *buf;
    uint64_t len;
    const ts_hash_t *chunks;
    uint64_t n_chunks;
    uint64_t first, count; /* the batch the next write_batch stores */
    json_t *manifest;      /* for write_manifest */
    const ts_hash_t *whole;
    int64_t now;
} import_job_t;

/* Stores chunk i of the job unless the same bytes are already there. */
static int store_chunk(ts_store_txn_t *t, const import_job_t *j, uint64_t i) {
    const unsigned char *data = j->buf + i * TS_WEIGHTS_CHUNK;
    size_t len = (size_t)chunk_len(j->len, TS_WEIGHTS_CHUNK, i);
    const void *val;
    size_t vlen;
    int rc = ts_txn_get(t, TS_DB_CHUNKS, j->chunks[i].b, TS_HASH_BYTES, &val, &vlen);
    if (rc == TS_OK && vlen == len && memcmp(val, data, len) == 0)
        return TS_OK; /* deduplicated */
    if (rc != TS_OK && rc != TS_ENOTFOUND)
        return rc;
    void *dst;
    rc = ts_txn_reserve(t, TS_DB_CHUNKS, j->chunks[i].b, TS_HASH_BYTES, len, &dst);
    if (rc == TS_OK)
        memcpy(dst, data, len);
    return rc;
}

static int write_batch(void *ctx, ts_store_txn_t *t) {
    const import_job_t *j = ctx;
    int rc = TS_OK;
    for (uint64_t i = j->first; rc == TS_OK && i < j->first + j->count; i++)
        rc = store_chunk(t, j, i);
    return rc;
}

static int write_manifest(void *ctx, ts_store_txn_t *t) {
    import_job_t *j = ctx;
    /* a gc in another process may have deleted chunks written by the batches as orphans */
    for (uint64_t i = 0; i < j->n_chunks; i++) {
        const void *val;
        size_t vlen;
        int rc = ts_txn_get(t, TS_DB_CHUNKS, j->chunks[i].b, TS_HASH_BYTES, &val, &vlen);
        if (rc == TS_ENOTFOUND)
            rc = store_chunk(t, j, i);
        if (rc)
            return rc;
    }
    uint64_t lru;
    int rc = clock_next(t, &lru);
    if (rc)
        return rc;
    int pinned = 0;
    int64_t imported = j->now;
    const void *val;
    size_t vlen;
    if (ts_txn_get(t, TS_DB_MANIFESTS, j->whole->b, TS_HASH_BYTES, &val, &vlen) == TS_OK) {
        manifest_t old; /* a re-import keeps the pin and the first import time */
        if (manifest_parse(val, vlen, j->whole, &old, NULL, 0) == TS_OK) {
            pinned = old.pinned;
            imported = old.imported;
            manifest_free(&old);
        }
    }
    rc = set_bookkeeping(j->manifest, pinned, lru, j->now, imported);
    return rc ? rc : manifest_put(t, j->whole, j->manifest);
}

/* Imports a validated file f (whose buffer is the file). */
static int import_parsed(ts_store_t *s, const ts_st_file_t *f, ts_hash_t *out,
                         ts_weights_progress_fn progress, void *ctx, char *err, size_t errlen) {
    crypto_ready();
    uint64_t len = f->len, n = (len + TS_WEIGHTS_CHUNK - 1) / TS_WEIGHTS_CHUNK;
    ts_hash_t *chunks = malloc((n ? n : 1) * sizeof *chunks), whole;
    if (!chunks) {
        ts_set_err(err, errlen, "out of memory hashing %llu bytes", (unsigned long long)len);
        return TS_ENOMEM;
    }
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, TS_HASH_BYTES);
    for (uint64_t i = 0; i < n; i++) {
        const unsigned char *p = f->buf + i * TS_WEIGHTS_CHUNK;
        size_t cl = (size_t)chunk_len(len, TS_WEIGHTS_CHUNK, i);
        ts_hash_compute(&chunks[i], p, cl);
        crypto_generichash_update(&st, p, cl);
    }
    crypto_generichash_final(&st, whole.b, TS_HASH_BYTES);

    import_job_t j = {.buf = f->buf,
                      .len = len,
                      .chunks = chunks,
                      .n_chunks = n,
                      .whole = &whole,
                      .now = (int64_t)time(NULL)};
    int rc = TS_OK;
    for (uint64_t i = 0; i < n && rc == TS_OK; i += TS_WEIGHTS_BATCH) {
        j.first = i;
        j.count = n - i < TS_WEIGHTS_BATCH ? n - i : TS_WEIGHTS_BATCH;
        rc = ts_store_write(s, write_batch, &j);
        if (rc)
            ts_set_err(err, errlen, "storing chunks %llu..%llu of %llu failed: %s",
                       (unsigned long long)i, (unsigned long long)(i + j.count - 1),
                       (unsigned long long)n, ts_strerror(rc));
        else if (progress)
            progress(ctx,
                     (i + j.count) * TS_WEIGHTS_CHUNK < len ? (i + j.count) * TS_WEIGHTS_CHUNK
                                                            : len,
                     len);
    }
    if (rc == TS_OK) {
        j.manifest = manifest_build(f, &whole, chunks, n);
        rc = j.manifest ? ts_store_write(s, write_manifest, &j) : TS_ENOMEM;
        if (rc)
            ts_set_err(err, errlen, "storing the manifest failed: %s", ts_strerror(rc));
        json_decref(j.manifest);
    }
    if (rc == TS_OK && out)
        *out = whole;
    free(chunks);
    return rc;
}

/* Reads a whole regular file into a malloc'd buffer. */
static int read_file(const char *path, unsigned char **buf, size_t *len, char *err, size_t errlen) {
    char why[128];
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        errno_text(e, why, sizeof why);
        ts_set_err(err, errlen, "cannot open '%s': %s", path, why);
        if (fd >= 0)
            close(fd);
        return e == ENOENT ? TS_ENOTFOUND : TS_EIO;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size > MAX_FILE) {
        ts_set_err(err, errlen, "'%s' is %s", path,
                   S_ISREG(st.st_mode) ? "larger than 2^40 bytes" : "not a regular file");
        close(fd);
        return TS_EINVAL;
    }
    size_t n = (size_t)st.st_size, got = 0;
    unsigned char *b = malloc(n ? n : 1);
    if (!b) {
        ts_set_err(err, errlen, "out of memory reading '%s' (%zu bytes)", path, n);
        close(fd);
        return TS_ENOMEM;
    }
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got > (1u << 30) ? (1u << 30) : n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r < 0)
                errno_text(errno, why, sizeof why);
            else
                snprintf(why, sizeof why, "the file shrank while it was read");
            ts_set_err(err, errlen, "reading '%s' failed: %s", path, why);
            free(b);
            close(fd);
            return TS_EIO;
        }
        got += (size_t)r;
    }
    close(fd);
    *buf = b, *len = n;
    return TS_OK;
}

/* Validates buf (taking ownership of it) and imports it. */
static int import_owned(ts_store_t *s, unsigned char *buf, size_t len, ts_hash_t *out,
                        ts_weights_progress_fn progress, void *ctx, char *err, size_t errlen) {
    ts_st_file_t f;
    int rc = ts_st_parse(buf, len, &f, err, errlen);
    if (rc) {
        prefix_err(err, errlen, "not a valid safetensors file: ");
        return rc;
    }
    rc = import_parsed(s, &f, out, progress, ctx, err, errlen);
    ts_st_free(&f);
    return rc;
}

int ts_weights_import_file(ts_store_t *s, const char *path, ts_hash_t *out,
                           ts_weights_progress_fn progress, void *ctx, char *err, size_t errlen) {
    if (!s || !path) {
        ts_set_err(err, errlen, "ts_weights_import_file: invalid arguments");
        return TS_EINVAL;
    }
    unsigned char *buf;
    size_t len;
    int rc = read_file(path, &buf, &len, err, errlen);
    if (rc == TS_OK)
        rc = import_owned(s, buf, len, out, progress, ctx, err, errlen);
    if (rc && rc != TS_ENOTFOUND && rc != TS_EIO) {
        char pre[300];
        snprintf(pre, sizeof pre, "'%.256s': ", path);
        prefix_err(err, errlen, pre);
    }
    return rc;
}

int ts_weights_import_buf(ts_store_t *s, const void *data, size_t len, ts_hash_t *out,
                          ts_weights_progress_fn progress, void *ctx, char *err, size_t errlen) {
    if (!s || (!data && len)) {
        ts_set_err(err, errlen, "ts_weights_import_buf: invalid arguments");
        return TS_EINVAL;
    }
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy) {
        ts_set_err(err, errlen, "out of memory copying %zu bytes", len);
        return TS_ENOMEM;
    }
    if (len)
        memcpy(copy, data, len);
    return import_owned(s, copy, len, out, progress, ctx, err, errlen);
}

/* ---- reading: export and load ------------------------------------------------------------- */

/* Where reassembled bytes go: memory or a file descriptor. */
typedef struct {
    unsigned char *mem; /* when not NULL: copy here */
    int fd;
    uint64_t off;
} sink_t;

static int sink_write(sink_t *k, const void *data, size_t len, char *err, size_t errlen) {
    if (k->mem) {
        memcpy(k->mem + k->off, data, len);
        k->off += len;
        return TS_OK;
    }
    const unsigned char *p = data;
    while (len > 0) {
        ssize_t w = write(k->fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            int e = errno;
            char why[128];
            errno_text(e, why, sizeof why);
            ts_set_err(err, errlen, "writing the file failed: %s", why);
            return e == ENOSPC ? TS_ENOSPC : TS_EIO;
        }
        p += w, len -= (size_t)w, k->off += (uint64_t)w;
    }
    return TS_OK;
}

/* What is wrong with stored chunk i of m (0: nothing), and its bytes; *rc is set when the store
 * could not be read. */
static ts_chunk_problem_t check_chunk(ts_store_txn_t *t, const manifest_t *m, uint64_t i,
                                      const void **data, size_t *len, int *rc) {
    *rc = ts_txn_get(t, TS_DB_CHUNKS, m->chunks[i].b, TS_HASH_BYTES, data, len);
    if (*rc == TS_ENOTFOUND) {
        *rc = TS_OK;
        return TS_CHUNK_MISSING;
    }
    if (*rc)
        return 0;
    ts_hash_t got;
    if (*len != chunk_len(m->size, m->chunk_size, i))
        return TS_CHUNK_BAD;
    ts_hash_compute(&got, *data, *len);
    return memcmp(got.b, m->chunks[i].b, TS_HASH_BYTES) == 0 ? 0 : TS_CHUNK_BAD;
}

/* Streams every chunk of m, verified, into k; then checks the whole hash. */
static int reassemble(ts_store_txn_t *t, const manifest_t *m, sink_t *k, char *err, size_t errlen) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, TS_HASH_BYTES);
    for (uint64_t i = 0; i < m->n_chunks; i++) {
        const void *data;
        size_t len;
        int rc;
        ts_chunk_problem_t p = check_chunk(t, m, i, &data, &len, &rc);
        if (rc) {
            ts_set_err(err, errlen, "reading chunk %llu of %llu (%s) failed: %s",
                       (unsigned long long)i, (unsigned long long)m->n_chunks,
                       hexof(&m->chunks[i]).s, ts_strerror(rc));
            return rc;
        }
        if (p) {
            ts_set_err(err, errlen,
                       "weights %s: chunk %llu of %llu (%s) is %s; fetch it again, or import the "
                       "file again",
                       hexof(&m->hash).s, (unsigned long long)i, (unsigned long long)m->n_chunks,
                       hexof(&m->chunks[i]).s,
                       p == TS_CHUNK_MISSING ? "missing from the store"
                                             : "corrupt (its bytes do not match its hash)");
            return TS_ECORRUPT;
        }
        crypto_generichash_update(&st, data, len);
        rc = sink_write(k, data, len, err, errlen);
        if (rc)
            return rc;
    }
    ts_hash_t whole;
    crypto_generichash_final(&st, whole.b, TS_HASH_BYTES);
    if (memcmp(whole.b, m->hash.b, TS_HASH_BYTES) != 0) {
        ts_set_err(err, errlen,
                   "weights %s: the chunks reassemble into a file hashing to %s: the manifest's "
                   "chunk list is damaged",
                   hexof(&m->hash).s, hexof(&whole).s);
        return TS_ECORRUPT;
    }
    return TS_OK;
}

typedef struct {
    const ts_hash_t *h;
    sink_t sink;
    int to_memory;
    unsigned char *buf; /* to_memory: the result */
    size_t len;
    char *err;
    size_t errlen;
} read_job_t;

static int read_fn(void *ctx, ts_store_txn_t *t) {
    read_job_t *j = ctx;
    manifest_t m;
    int rc = manifest_get(t, j->h, &m, j->err, j->errlen);
    if (rc)
        return rc;
    if (j->to_memory) {
        free(j->buf);
        j->buf = malloc(m.size ? (size_t)m.size : 1);
        j->len = (size_t)m.size;
        if (!j->buf) {
            ts_set_err(j->err, j->errlen, "out of memory for %llu bytes",
                       (unsigned long long)m.size);
            manifest_free(&m);
            return TS_ENOMEM;
        }
        j->sink = (sink_t){.mem = j->buf};
    } else if (ftruncate(j->sink.fd, 0) != 0 || lseek(j->sink.fd, 0, SEEK_SET) != 0) {
        ts_set_err(j->err, j->errlen, "cannot rewind the output file");
        manifest_free(&m);
        return TS_EIO;
    }
    rc = reassemble(t, &m, &j->sink, j->err, j->errlen);
    manifest_free(&m);
    return rc;
}

int ts_weights_load(ts_store_t *s, const ts_hash_t *h, unsigned char **buf, size_t *len, char *err,
                    size_t errlen) {
    if (!s || !h || !buf || !len) {
        ts_set_err(err, errlen, "ts_weights_load: invalid arguments");
        return TS_EINVAL;
    }
    crypto_ready();
    *buf = NULL, *len = 0;
    read_job_t j = {.h = h, .to_memory = 1, .err = err, .errlen = errlen};
    int rc = ts_store_read(s, read_fn, &j);
    if (rc) {
        free(j.buf);
        return rc;
    }
    *buf = j.buf, *len = j.len;
    return TS_OK;
}

int ts_weights_export(ts_store_t *s, const ts_hash_t *h, const char *path, char *err,
                      size_t errlen) {
    if (!s || !h || !path || !path[0]) {
        ts_set_err(err, errlen, "ts_weights_export: invalid arguments");
        return TS_EINVAL;
    }
    crypto_ready();
    /* written whole or not at all (base/file.h); the reassembly writes the descriptor, never the
     * FILE's buffer, so that a retried transaction can truncate it and start again */
    char why[128];
    ts_atomic_file_t a;
    int e = 0, rc = ts_atomic_open(&a, path, &e);
    if (rc != TS_OK) {
        errno_text(e ? e : EIO, why, sizeof why);
        ts_set_err(err, errlen, "cannot create a temporary file next to '%s': %s", path,
                   e ? why : ts_strerror(rc));
        return rc;
    }
    read_job_t j = {.h = h, .sink = {.fd = fileno(a.fp)}, .err = err, .errlen = errlen};
    rc = ts_store_read(s, read_fn, &j);
    e = 0;
    int committed = ts_atomic_commit(&a, rc == TS_OK, &e);
    if (rc == TS_OK && committed != TS_OK) {
        errno_text(e ? e : EIO, why, sizeof why);
        ts_set_err(err, errlen, "writing '%s' failed: %s", path, why);
        rc = committed;
    }
    return rc;
}

int ts_weights_open_dit(ts_store_t *s, const ts_hash_t *h, ts_engine_t *e, int max_batch,
                        int trainable, ts_dit_t *m, char *err, size_t errlen) {
    if (m)
        memset(m, 0, sizeof *m);
    if (!s || !h || !e || !m) {
        ts_set_err(err, errlen, "ts_weights_open_dit: invalid arguments");
        return TS_EINVAL;
    }
    unsigned char *buf;
    size_t len;
    int rc = ts_weights_load(s, h, &buf, &len, err, errlen);
    if (rc)
        return rc;
    ts_st_file_t f;
    rc = ts_st_parse(buf, len, &f, err, errlen); /* takes buf */
    if (rc == TS_OK) {
        rc = ts_dit_open_file(m, &f, e, max_batch, trainable, err, errlen);
        ts_st_free(&f);
    }
    if (rc) {
        char pre[100];
        snprintf(pre, sizeof pre, "weights %.16s: ", hexof(h).s);
        prefix_err(err, errlen, pre);
        return rc;
    }
    (void)ts_weights_touch(s, h); /* a read-only store just does not record the use */
    return TS_OK;
}

/* ---- chunks: what is bad, and storing a fetched one ----------------------------------------- */

typedef struct {
    uint64_t index;
    ts_hash_t hash;
    ts_chunk_problem_t problem;
} bad_chunk_t;

typedef struct {
    const ts_hash_t *h;
    bad_chunk_t *bad;
    size_t n, cap;
} bad_job_t;

static int push_bad(bad_job_t *j, uint64_t index, const ts_hash_t *hash, ts_chunk_problem_t p) {
    if (j->n == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 16;
        bad_chunk_t *b = realloc(j->bad, cap * sizeof *b);
        if (!b)
            return TS_ENOMEM;
        j->bad = b, j->cap = cap;
    }
    j->bad[j->n++] = (bad_chunk_t){index, *hash, p};
    return TS_OK;
}

static int bad_fn(void *ctx, ts_store_txn_t *t) {
    bad_job_t *j = ctx;
    j->n = 0;
    manifest_t m;
    int rc = manifest_get(t, j->h, &m, NULL, 0);
    for (uint64_t i = 0; rc == TS_OK && i < m.n_chunks; i++) {
        const void *data;
        size_t len;
        ts_chunk_problem_t p = check_chunk(t, &m, i, &data, &len, &rc);
        if (rc == TS_OK && p)
            rc = push_bad(j, i, &m.chunks[i], p);
    }
    manifest_free(&m);
    return rc;
}

int ts_weights_bad_chunks(ts_store_t *s, const ts_hash_t *h, ts_weights_chunk_fn fn, void *ctx) {
    if (!s || !h)
        return TS_EINVAL;
    crypto_ready();
    bad_job_t j = {.h = h};
    int rc = ts_store_read(s, bad_fn, &j);
    for (size_t i = 0; rc == TS_OK && fn && i < j.n; i++)
        fn(ctx, j.bad[i].index, &j.bad[i].hash, j.bad[i].problem);
    free(j.bad);
    return rc ? rc : (int)(j.n > 0x7fffffff ? 0x7fffffff : j.n);
}

typedef struct {
    const ts_hash_t *h;
    const void *data;
    size_t len;
} put_job_t;

static int put_fn(void *ctx, ts_store_txn_t *t) {
    const put_job_t *j = ctx;
    void *dst;
    int rc = ts_txn_reserve(t, TS_DB_CHUNKS, j->h->b, TS_HASH_BYTES, j->len, &dst);
    if (rc == TS_OK)
        memcpy(dst, j->data, j->len);
    return rc;
}

typedef struct {
    const ts_hash_t *h;
    unsigned char *buf;
    size_t len;
} get_job_t;

static int get_fn(void *ctx, ts_store_txn_t *t) {
    get_job_t *j = ctx;
    const void *data;
    free(j->buf);
    j->buf = NULL;
    int rc = ts_txn_get(t, TS_DB_CHUNKS, j->h->b, TS_HASH_BYTES, &data, &j->len);
    if (rc)
        return rc;
    if (!(j->buf = malloc(j->len ? j->len : 1)))
        return TS_ENOMEM;
    memcpy(j->buf, data, j->len);
    return TS_OK;
}

int ts_weights_get_chunk(ts_store_t *s, const ts_hash_t *chunk, unsigned char **buf, size_t *len) {
    if (!s || !chunk || !buf || !len)
        return TS_EINVAL;
    *buf = NULL;
    *len = 0;
    get_job_t j = {.h = chunk};
    int rc = ts_store_read(s, get_fn, &j);
    if (rc == TS_OK) {
        crypto_ready();
        ts_hash_t got;
        ts_hash_compute(&got, j.buf, j.len);
        if (memcmp(got.b, chunk->b, TS_HASH_BYTES) != 0)
            rc = TS_ECORRUPT;
    }
    if (rc) {
        free(j.buf);
        return rc;
    }
    *buf = j.buf;
    *len = j.len;
    return TS_OK;
}

int ts_weights_put_chunk(ts_store_t *s, const ts_hash_t *chunk, const void *data, size_t len) {
    if (!s || !chunk || !data || len == 0 || len > TS_WEIGHTS_CHUNK)
        return TS_EINVAL;
    crypto_ready();
    ts_hash_t got;
    ts_hash_compute(&got, data, len);
    if (memcmp(got.b, chunk->b, TS_HASH_BYTES) != 0)
        return TS_ECORRUPT;
    put_job_t j = {chunk, data, len};
    return ts_store_write(s, put_fn, &j);
}

/* ---- listing ------------------------------------------------------------------------------ */

const char *ts_weights_info_meta(const ts_weights_info_t *info, const char *key) {
    if (!info || !key)
        return NULL;
    for (int i = 0; i < info->n_meta; i++)
        if (strcmp(info->meta_keys[i], key) == 0)
            return info->meta_vals[i];
    return NULL;
}

static int meta_int(const ts_weights_info_t *info, const char *key) {
    const char *v = ts_weights_info_meta(info, key);
    if (!v || !*v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < 1 || x > 1000000000L ? 0 : (int)x;
}

void ts_weights_describe(const ts_weights_info_t *info, char *buf, size_t len) {
    if (!buf || len == 0)
        return;
    int h = meta_int(info, "hidden_size"), d = meta_int(info, "depth"),
        heads = meta_int(info, "num_heads"), p = meta_int(info, "patch_size");
    if (!h || !d || !p) {
        snprintf(buf, len, "-");
        return;
    }
    static const char *const presets[] = {"tiny", "small", "S/2", "S/4", "S/8",  "B/2",  "B/4",
                                          "B/8",  "L/2",   "L/4", "L/8", "XL/2", "XL/4", "XL/8"};
    const char *like = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0] && !like; i++) {
        ts_dit_config_t c;
        if (ts_dit_config_preset(presets[i], &c) == TS_OK && c.hidden_size == h && c.depth == d &&
            c.num_heads == heads && c.patch_size == p)
            like = presets[i];
    }
    snprintf(buf, len, "%s%sh%d d%d p%d", like ? like : "", like ? "-like " : "", h, d, p);
}

/* The info view of a parsed manifest; *arr (caller frees) holds the metadata pointers. */
static int info_of(const manifest_t *m, ts_weights_info_t *info, const char ***arr) {
    const json_t *meta = json_object_get(m->root, "metadata");
    size_t n = meta ? json_object_size(meta) : 0;
    const char **a = malloc((2 * n + 1) * sizeof *a);
    if (!a)
        return TS_ENOMEM;
    size_t i = 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)meta, k, v) {
        a[i] = k;
        a[n + i] = json_string_value(v);
        i++;
    }
    *info =
        (ts_weights_info_t){.hash = m->hash,
                            .size = m->size,
                            .chunk_size = m->chunk_size,
                            .n_chunks = m->n_chunks,
                            .n_tensors = m->n_tensors,
                            .pinned = m->pinned,
                            .lru = m->lru,
                            .last_used = m->last_used,
                            .imported = m->imported,
                            .n_meta = (int)n,
                            .meta_keys = a,
                            .meta_vals = a + n,
                            .chunks = m->chunks,
                            .dtype = json_string_value(json_object_get(
                                json_array_get(json_object_get(m->root, "tensors"), 0), "dtype"))};
    *arr = a;
    return TS_OK;
}

/* Calls fn for one manifest's info. */
static int call_with_info(const manifest_t *m, ts_weights_list_fn fn, void *ctx) {
    ts_weights_info_t info;
    const char **arr;
    int rc = info_of(m, &info, &arr);
    if (rc == TS_OK) {
        rc = fn(ctx, &info);
        free(arr);
    }
    return rc;
}

static int collect_fn(void *ctx, ts_store_txn_t *t) { return collect_all(t, ctx); }

int ts_weights_list(ts_store_t *s, ts_weights_list_fn fn, void *ctx) {
    if (!s || !fn)
        return TS_EINVAL;
    all_t a = {0};
    int rc = ts_store_read(s, collect_fn, &a);
    for (size_t i = 0; rc == TS_OK && i < a.n; i++)
        rc = call_with_info(&a.ms[i], fn, ctx);
    all_reset(&a);
    return rc;
}

typedef struct {
    const ts_hash_t *h;
    manifest_t m;
} info_job_t;

static int info_fn(void *ctx, ts_store_txn_t *t) {
    info_job_t *j = ctx;
    manifest_free(&j->m);
    return manifest_get(t, j->h, &j->m, NULL, 0);
}

int ts_weights_info(ts_store_t *s, const ts_hash_t *h, ts_weights_list_fn fn, void *ctx) {
    if (!s || !h || !fn)
        return TS_EINVAL;
    info_job_t j = {.h = h};
    int rc = ts_store_read(s, info_fn, &j);
    if (rc == TS_OK)
        rc = call_with_info(&j.m, fn, ctx);
    manifest_free(&j.m);
    return rc;
}

/* ---- resolve, remove, pin, touch ---------------------------------------------------------- */

typedef struct {
    unsigned char bytes[TS_HASH_BYTES];
    size_t nbytes;
    int odd, nibble; /* odd digit count: the high nibble of bytes[nbytes] must be `nibble` */
    int matches;
    ts_hash_t first;
} resolve_job_t;

static int resolve_one(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    (void)val, (void)vlen;
    resolve_job_t *j = ctx;
    if (klen != TS_HASH_BYTES)
        return TS_OK;
    const unsigned char *k = key;
    if (j->odd && (k[j->nbytes] >> 4) != j->nibble)
        return TS_OK;
    if (j->matches++ == 0)
        memcpy(j->first.b, key, TS_HASH_BYTES);
    return TS_OK;
}

static int resolve_fn(void *ctx, ts_store_txn_t *t) {
    resolve_job_t *j = ctx;
    j->matches = 0;
    return ts_txn_foreach(t, TS_DB_MANIFESTS, j->bytes, j->nbytes, resolve_one, j);
}

int ts_weights_resolve(ts_store_t *s, const char *prefix, ts_hash_t *out, char *err,
                       size_t errlen) {
    if (!s || !prefix || !out) {
        ts_set_err(err, errlen, "ts_weights_resolve: invalid arguments");
        return TS_EINVAL;
    }
    size_t n = strlen(prefix);
    int hex = n >= TS_HASH_MIN_PREFIX && n <= 2 * TS_HASH_BYTES;
    for (size_t i = 0; hex && i < n; i++)
        hex = hex_digit(prefix[i]) >= 0;
    if (!hex) {
        ts_set_err(err, errlen,
                   "'%.80s' is not a weights hash: give %d to %d hex digits (tessera store ls "
                   "lists them)",
                   prefix, TS_HASH_MIN_PREFIX, 2 * TS_HASH_BYTES);
        return TS_EINVAL;
    }
    resolve_job_t j = {.nbytes = n / 2, .odd = (int)(n & 1)};
    for (size_t i = 0; i < j.nbytes; i++)
        j.bytes[i] = (unsigned char)(hex_digit(prefix[2 * i]) << 4 | hex_digit(prefix[2 * i + 1]));
    if (j.odd)
        j.nibble = hex_digit(prefix[n - 1]);
    int rc = ts_store_read(s, resolve_fn, &j);
    if (rc) {
        ts_set_err(err, errlen, "reading the manifests failed: %s", ts_strerror(rc));
        return rc;
    }
    if (j.matches == 0) {
        ts_set_err(err, errlen, "no weights in the store match '%s' (tessera store ls lists them)",
                   prefix);
        return TS_ENOTFOUND;
    }
    if (j.matches > 1) {
        ts_set_err(err, errlen,
                   "'%s' is ambiguous: %d weights in the store start with it; give more "
                   "digits",
                   prefix, j.matches);
        return TS_EINVAL;
    }
    *out = j.first;
    return TS_OK;
}

static int remove_fn(void *ctx, ts_store_txn_t *t) {
    const ts_hash_t *h = ctx;
    return ts_txn_del(t, TS_DB_MANIFESTS, h->b, TS_HASH_BYTES);
}

int ts_weights_remove(ts_store_t *s, const ts_hash_t *h) {
    if (!s || !h)
        return TS_EINVAL;
    return ts_store_write(s, remove_fn, (void *)h);
}

typedef struct {
    const ts_hash_t *h;
    int pin; /* -1: leave the pin alone */
    int touch;
} update_job_t;

static int update_fn(void *ctx, ts_store_txn_t *t) {
    const update_job_t *j = ctx;
    manifest_t m;
    int rc = manifest_get(t, j->h, &m, NULL, 0);
    if (rc)
        return rc;
    int pinned = j->pin >= 0 ? j->pin : m.pinned;
    uint64_t lru = m.lru;
    int64_t last_used = m.last_used;
    if (j->touch) {
        rc = clock_next(t, &lru);
        last_used = (int64_t)time(NULL);
    }
    if (rc == TS_OK)
        rc = set_bookkeeping(m.root, pinned, lru, last_used, m.imported);
    if (rc == TS_OK)
        rc = manifest_put(t, j->h, m.root);
    manifest_free(&m);
    return rc;
}

int ts_weights_pin(ts_store_t *s, const ts_hash_t *h, int on) {
    if (!s || !h)
        return TS_EINVAL;
    update_job_t j = {h, on ? 1 : 0, 0};
    return ts_store_write(s, update_fn, &j);
}

int ts_weights_touch(ts_store_t *s, const ts_hash_t *h) {
    if (!s || !h)
        return TS_EINVAL;
    update_job_t j = {h, -1, 1};
    return ts_store_write(s, update_fn, &j);
}

/* ---- verify ------------------------------------------------------------------------------- */

typedef struct {
    ts_weights_problem_t p;
    char *what; /* owned */
} problem_t;

typedef struct {
    problem_t *ps;
    size_t n, cap;
    ts_weights_verify_stats_t stats;
    ts_store_txn_t *t;
    int rc; /* first error other than a problem */
} verify_job_t;

static void verify_reset(verify_job_t *j) {
    for (size_t i = 0; i < j->n; i++)
        free(j->ps[i].what);
    free(j->ps);
    j->ps = NULL, j->n = j->cap = 0;
    memset(&j->stats, 0, sizeof j->stats);
}

static int add_problem(verify_job_t *j, const void *weights, int64_t chunk, const ts_hash_t *ch,
                       const char *what) {
    if (j->n == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 16;
        problem_t *ps = realloc(j->ps, cap * sizeof *ps);
        if (!ps)
            return TS_ENOMEM;
        j->ps = ps, j->cap = cap;
    }
    problem_t *p = &j->ps[j->n];
    memset(p, 0, sizeof *p);
    memcpy(p->p.weights.b, weights, TS_HASH_BYTES);
    p->p.chunk = chunk;
    if (ch)
        p->p.chunk_hash = *ch;
    if (!(p->what = strdup(what)))
        return TS_ENOMEM;
    j->n++;
    return TS_OK;
}

static int verify_one(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    verify_job_t *j = ctx;
    unsigned char zero[TS_HASH_BYTES] = {0};
    char why[300];
    if (klen != TS_HASH_BYTES) {
        snprintf(why, sizeof why, "a manifest is stored under a %zu-byte key, not %d", klen,
                 TS_HASH_BYTES);
        return add_problem(j, zero, -1, NULL, why);
    }
    ts_hash_t h;
    memcpy(h.b, key, TS_HASH_BYTES);
    manifest_t m;
    j->stats.manifests++;
    if (manifest_parse(val, vlen, &h, &m, why, sizeof why) != TS_OK)
        return add_problem(j, key, -1, NULL, why);
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, TS_HASH_BYTES);
    int rc = TS_OK, bad = 0;
    for (uint64_t i = 0; rc == TS_OK && i < m.n_chunks; i++) {
        const void *data;
        size_t len;
        ts_chunk_problem_t p = check_chunk(j->t, &m, i, &data, &len, &rc);
        j->stats.chunks++;
        if (rc)
            break;
        if (p) {
            bad++;
            snprintf(why, sizeof why, "chunk %llu of %llu is %s", (unsigned long long)i,
                     (unsigned long long)m.n_chunks,
                     p == TS_CHUNK_MISSING ? "missing"
                                           : "corrupt (its bytes do not match its hash)");
            rc = add_problem(j, key, (int64_t)i, &m.chunks[i], why);
        } else {
            crypto_generichash_update(&st, data, len);
            j->stats.bytes += len;
        }
    }
    ts_hash_t whole;
    crypto_generichash_final(&st, whole.b, TS_HASH_BYTES);
    if (rc == TS_OK && !bad && memcmp(whole.b, h.b, TS_HASH_BYTES) != 0) {
        snprintf(why, sizeof why,
                 "the chunks reassemble into a file hashing to %s: the chunk list is damaged",
                 hexof(&whole).s);
        rc = add_problem(j, key, -1, NULL, why);
    }
    manifest_free(&m);
    return rc;
}

static int verify_fn(void *ctx, ts_store_txn_t *t) {
    verify_job_t *j = ctx;
    verify_reset(j);
    j->t = t;
    return ts_txn_foreach(t, TS_DB_MANIFESTS, NULL, 0, verify_one, j);
}

int ts_weights_verify(ts_store_t *s, ts_weights_verify_fn fn, void *ctx,
                      ts_weights_verify_stats_t *stats) {
    if (!s)
        return TS_EINVAL;
    crypto_ready();
    verify_job_t j = {0};
    int rc = ts_store_read(s, verify_fn, &j);
    for (size_t i = 0; rc == TS_OK && fn && i < j.n; i++) {
        j.ps[i].p.what = j.ps[i].what;
        fn(ctx, &j.ps[i].p);
    }
    if (stats)
        *stats = j.stats;
    size_t n = j.n;
    verify_reset(&j);
    return rc ? rc : (int)(n > 0x7fffffff ? 0x7fffffff : n);
}

/* ---- gc, du, evict ------------------------------------------------------------------------ */

typedef struct {
    all_t all;
    refs_t refs;
    orphans_t orphans;
    int del;
} sweep_job_t;

static void sweep_reset(sweep_job_t *j) {
    all_reset(&j->all);
    free(j->refs.r);
    free(j->orphans.keys);
    j->refs = (refs_t){0};
    j->orphans = (orphans_t){0};
}

static int sweep_fn(void *ctx, ts_store_txn_t *t) {
    sweep_job_t *j = ctx;
    sweep_reset(j);
    int rc = collect_all(t, &j->all);
    if (rc == TS_OK)
        rc = refs_build(&j->refs, j->all.ms, j->all.n);
    if (rc == TS_OK)
        rc = orphans_sweep(t, &j->refs, &j->orphans, j->del);
    return rc;
}

int ts_weights_gc(ts_store_t *s, ts_weights_gc_t *out) {
    if (!s)
        return TS_EINVAL;
    sweep_job_t j = {.del = 1};
    int rc = ts_store_write(s, sweep_fn, &j);
    if (rc == TS_OK && out)
        *out = (ts_weights_gc_t){j.orphans.n, j.orphans.bytes};
    sweep_reset(&j);
    return rc;
}

int ts_weights_du(ts_store_t *s, ts_weights_du_t *out) {
    if (!s || !out)
        return TS_EINVAL;
    sweep_job_t j = {.del = 0};
    int rc = ts_store_read(s, sweep_fn, &j);
    if (rc == TS_OK) {
        memset(out, 0, sizeof *out);
        out->manifests = j.all.n;
        for (size_t i = 0; i < j.all.n; i++) {
            out->pinned += j.all.ms[i].pinned != 0;
            out->logical_bytes += j.all.ms[i].size;
        }
        out->chunks = j.orphans.all_chunks;
        out->unique_bytes = j.orphans.all_bytes;
        out->orphan_chunks = j.orphans.n;
        out->orphan_bytes = j.orphans.bytes;
        out->map_size = ts_store_map_size(s);
    }
    sweep_reset(&j);
    return rc;
}

/* An eviction candidate: the sort key and where the manifest is. */
typedef struct {
    uint64_t lru;
    int64_t imported;
    ts_hash_t hash;
    size_t idx; /* into sw.all.ms */
} cand_t;

typedef struct {
    uint64_t budget;
    sweep_job_t sw;
    cand_t *order; /* unpinned manifests, least recently used first; the first `evicted` go */
    int evicted;
    uint64_t unique;
} evict_job_t;

static int by_lru(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->lru != y->lru)
        return x->lru < y->lru ? -1 : 1;
    if (x->imported != y->imported)
        return x->imported < y->imported ? -1 : 1;
    return hash_cmp(&x->hash, &y->hash);
}

static int evict_fn(void *ctx, ts_store_txn_t *t) {
    evict_job_t *j = ctx;
    sweep_reset(&j->sw);
    free(j->order);
    j->order = NULL, j->evicted = 0, j->unique = 0;
    int rc = collect_all(t, &j->sw.all);
    if (rc == TS_OK)
        rc = refs_build(&j->sw.refs, j->sw.all.ms, j->sw.all.n);
    if (rc)
        return rc;
    /* bytes of the chunks that are referenced and present */
    for (size_t i = 0; i < j->sw.refs.n; i++) {
        ref_t *r = &j->sw.refs.r[i];
        const void *val;
        size_t vlen;
        rc = ts_txn_get(t, TS_DB_CHUNKS, r->h.b, TS_HASH_BYTES, &val, &vlen);
        if (rc == TS_ENOTFOUND)
            rc = TS_OK, vlen = 0;
        if (rc)
            return rc;
        r->size = vlen;
        j->unique += vlen;
    }
    const manifest_t *ms = j->sw.all.ms;
    size_t n = j->sw.all.n, cand = 0;
    j->order = malloc((n ? n : 1) * sizeof *j->order);
    if (!j->order)
        return TS_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (!ms[i].pinned)
            j->order[cand++] = (cand_t){ms[i].lru, ms[i].imported, ms[i].hash, i};
    qsort(j->order, cand, sizeof *j->order, by_lru);
    for (size_t c = 0; c < cand && j->unique > j->budget && rc == TS_OK; c++) {
        const manifest_t *m = &ms[j->order[c].idx];
        for (uint64_t k = 0; k < m->n_chunks; k++) {
            ref_t *r = refs_find(&j->sw.refs, m->chunks[k].b);
            if (r && r->count > 0 && --r->count == 0)
                j->unique -= r->size;
        }
        rc = ts_txn_del(t, TS_DB_MANIFESTS, m->hash.b, TS_HASH_BYTES);
        j->evicted++;
    }
    if (rc == TS_OK)
        rc = orphans_sweep(t, &j->sw.refs, &j->sw.orphans, 1);
    return rc;
}

int ts_weights_evict(ts_store_t *s, uint64_t budget, ts_weights_evict_fn fn, void *ctx,
                     ts_weights_evict_t *out) {
    if (!s)
        return TS_EINVAL;
    evict_job_t j = {.budget = budget};
    int rc = ts_store_write(s, evict_fn, &j);
    for (int i = 0; rc == TS_OK && fn && i < j.evicted; i++) {
        ts_weights_info_t info;
        const char **arr;
        if (info_of(&j.sw.all.ms[j.order[i].idx], &info, &arr) == TS_OK) {
            fn(ctx, &info);
            free(arr);
        }
    }
    if (rc == TS_OK && out)
        *out = (ts_weights_evict_t){j.evicted, j.sw.orphans.n, j.sw.orphans.bytes, j.unique};
    sweep_reset(&j.sw);
    free(j.order);
    return rc;
}
