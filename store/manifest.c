/*
 * manifest.c — the records of the weights store (store/manifest.h): manifests, the set of
 * referenced chunks and the LRU clock. How the pieces fit: store/weights.c.
 */
#define _POSIX_C_SOURCE 200809L

#include "store/manifest.h"

#include <stdlib.h>
#include <string.h>

#include "base/str.h"

/* ---- manifests ---------------------------------------------------------------------------- */

void ts_manifest_free(ts_manifest_t *m) {
    if (!m)
        return;
    json_decref(m->root);
    free(m->chunks);
    memset(m, 0, sizeof *m);
}

void ts_manifests_free(ts_manifest_t *ms, size_t n) {
    for (size_t i = 0; i < n; i++)
        ts_manifest_free(&ms[i]);
    free(ms);
}

uint64_t ts_manifest_chunk_len(uint64_t size, uint64_t chunk_size, uint64_t i) {
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
int ts_manifest_parse(const void *val, size_t vlen, const ts_hash_t *key, ts_manifest_t *m,
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
                   ts_hash_text(key).s);
        goto bad;
    }
    if (!json_u64(json_object_get(r, "size"), &m->size) || m->size > TS_MANIFEST_MAX_FILE ||
        !json_u64(json_object_get(r, "chunk_size"), &m->chunk_size) || m->chunk_size == 0 ||
        m->chunk_size > TS_MANIFEST_MAX_CHUNK) {
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
        ts_manifest_free(m);
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
    ts_manifest_free(m);
    return TS_ECORRUPT;
}

/* The manifest of a validated file, without the bookkeeping fields (write_manifest adds them). */
json_t *ts_manifest_build(const ts_st_file_t *f, const ts_hash_t *whole, const ts_hash_t *chunks,
                          uint64_t n_chunks) {
    json_t *root = json_object(), *list = json_array(), *tensors = json_array(),
           *meta = json_object();
    int ok = root && list && tensors && meta;
    for (uint64_t i = 0; ok && i < n_chunks; i++)
        ok = json_array_append_new(list, json_string(ts_hash_text(&chunks[i]).s)) == 0;
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
             json_object_set_new(root, "hash", json_string(ts_hash_text(whole).s)) == 0 &&
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
int ts_manifest_put(ts_store_txn_t *t, const ts_hash_t *h, json_t *root) {
    char *text = json_dumps(root, JSON_COMPACT);
    if (!text)
        return TS_ENOMEM;
    int rc = ts_txn_put(t, TS_DB_MANIFESTS, h->b, TS_HASH_BYTES, text, strlen(text));
    free(text);
    return rc;
}

/* On failure *m is empty (ts_manifest_free is harmless on it). */
int ts_manifest_get(ts_store_txn_t *t, const ts_hash_t *h, ts_manifest_t *m, char *err,
                    size_t errlen) {
    memset(m, 0, sizeof *m);
    const void *val;
    size_t vlen;
    int rc = ts_txn_get(t, TS_DB_MANIFESTS, h->b, TS_HASH_BYTES, &val, &vlen);
    if (rc == TS_ENOTFOUND) {
        ts_set_err(err, errlen, "no weights %s in the store", ts_hash_text(h).s);
        return rc;
    }
    if (rc) {
        ts_set_err(err, errlen, "reading the manifest of %s failed: %s", ts_hash_text(h).s,
                   ts_strerror(rc));
        return rc;
    }
    rc = ts_manifest_parse(val, vlen, h, m, err, errlen);
    if (rc) {
        char pre[120];
        snprintf(pre, sizeof pre, "weights %.16s: ", ts_hash_text(h).s);
        ts_err_prefix(err, errlen, pre);
    }
    return rc;
}

static int collect_one(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    ts_manifest_all_t *a = ctx;
    if (klen != TS_HASH_BYTES) {
        snprintf(a->err, sizeof a->err, "a manifest key is %zu bytes, not %d", klen, TS_HASH_BYTES);
        memset(&a->bad, 0, sizeof a->bad);
        return TS_ECORRUPT;
    }
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 16;
        ts_manifest_t *ms = realloc(a->ms, cap * sizeof *ms);
        if (!ms)
            return TS_ENOMEM;
        a->ms = ms, a->cap = cap;
    }
    memcpy(a->bad.b, key, TS_HASH_BYTES);
    int rc = ts_manifest_parse(val, vlen, &a->bad, &a->ms[a->n], a->err, sizeof a->err);
    if (rc == TS_OK)
        a->n++;
    return rc;
}

void ts_manifest_all_reset(ts_manifest_all_t *a) {
    ts_manifests_free(a->ms, a->n);
    memset(a, 0, sizeof *a);
}

int ts_manifest_collect_all(ts_store_txn_t *t, ts_manifest_all_t *a) {
    ts_manifest_all_reset(a);
    return ts_txn_foreach(t, TS_DB_MANIFESTS, NULL, 0, collect_one, a);
}

/* ---- the set of referenced chunks --------------------------------------------------------- */

static int ref_cmp(const void *a, const void *b) { return ts_hash_cmp(a, b); }

int ts_manifest_refs_build(ts_manifest_refs_t *out, const ts_manifest_t *ms, size_t n) {
    out->r = NULL, out->n = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += ms[i].n_chunks;
    ts_manifest_ref_t *r = malloc((total ? total : 1) * sizeof *r);
    if (!r)
        return TS_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < ms[i].n_chunks; j++)
            r[k++] = (ts_manifest_ref_t){.h = ms[i].chunks[j], .count = 1, .size = 0};
    qsort(r, k, sizeof *r, ref_cmp);
    size_t u = 0;
    for (size_t i = 0; i < k; i++) {
        if (u > 0 && ts_hash_cmp(&r[u - 1].h, &r[i].h) == 0)
            r[u - 1].count++;
        else
            r[u++] = r[i];
    }
    out->r = r, out->n = u;
    return TS_OK;
}

ts_manifest_ref_t *ts_manifest_refs_find(const ts_manifest_refs_t *refs, const void *hash) {
    return refs->n ? bsearch(hash, refs->r, refs->n, sizeof *refs->r, ref_cmp) : NULL;
}

static int orphan_one(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    (void)val;
    ts_manifest_orphans_t *o = ctx;
    o->all_chunks++;
    o->all_bytes += vlen;
    if (klen != TS_HASH_BYTES)
        return TS_OK; /* not a chunk of ours: leave it */
    const ts_manifest_ref_t *r = ts_manifest_refs_find(o->refs, key);
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
int ts_manifest_orphans_sweep(ts_store_txn_t *t, const ts_manifest_refs_t *refs,
                              ts_manifest_orphans_t *o, int del) {
    *o = (ts_manifest_orphans_t){.refs = refs};
    int rc = ts_txn_foreach(t, TS_DB_CHUNKS, NULL, 0, orphan_one, o);
    for (size_t i = 0; rc == TS_OK && del && i < o->n; i++)
        rc = ts_txn_del(t, TS_DB_CHUNKS, o->keys[i].b, TS_HASH_BYTES);
    return rc;
}

/* ---- the LRU clock ------------------------------------------------------------------------ */

int ts_manifest_clock_next(ts_store_txn_t *t, uint64_t *out) {
    const void *val;
    size_t vlen;
    uint64_t c = 0;
    int rc =
        ts_txn_get(t, TS_DB_META, TS_MANIFEST_LRU_KEY, sizeof TS_MANIFEST_LRU_KEY - 1, &val, &vlen);
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
    rc = ts_txn_put(t, TS_DB_META, TS_MANIFEST_LRU_KEY, sizeof TS_MANIFEST_LRU_KEY - 1, buf,
                    sizeof buf);
    if (rc == TS_OK)
        *out = c;
    return rc;
}

/* Sets the bookkeeping fields of a manifest being written. */
int ts_manifest_bookkeeping(json_t *root, int pinned, uint64_t lru, int64_t last_used,
                            int64_t imported) {
    int bad = json_object_set_new(root, "pinned", json_boolean(pinned)) != 0;
    bad |= json_object_set_new(root, "lru", json_integer((json_int_t)lru)) != 0;
    bad |= json_object_set_new(root, "last_used", json_integer((json_int_t)last_used)) != 0;
    bad |= json_object_set_new(root, "imported", json_integer((json_int_t)imported)) != 0;
    return bad ? TS_ENOMEM : TS_OK;
}
