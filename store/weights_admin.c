/*
 * weights_admin.c — keeping the weights store (store/weights.h): listing and describing, resolving
 * a hash prefix, removing, pinning and touching, and gc, du and evict over the set of referenced
 * chunks (store/manifest.h). How the pieces fit: store/weights.c.
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
#include "store/manifest.h"

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
static int info_of(const ts_manifest_t *m, ts_weights_info_t *info, const char ***arr) {
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
static int call_with_info(const ts_manifest_t *m, ts_weights_list_fn fn, void *ctx) {
    ts_weights_info_t info;
    const char **arr;
    int rc = info_of(m, &info, &arr);
    if (rc == TS_OK) {
        rc = fn(ctx, &info);
        free(arr);
    }
    return rc;
}

static int collect_fn(void *ctx, ts_store_txn_t *t) { return ts_manifest_collect_all(t, ctx); }

int ts_weights_list(ts_store_t *s, ts_weights_list_fn fn, void *ctx) {
    if (!s || !fn)
        return TS_EINVAL;
    ts_manifest_all_t a = {0};
    int rc = ts_store_read(s, collect_fn, &a);
    for (size_t i = 0; rc == TS_OK && i < a.n; i++)
        rc = call_with_info(&a.ms[i], fn, ctx);
    ts_manifest_all_reset(&a);
    return rc;
}

typedef struct {
    const ts_hash_t *h;
    ts_manifest_t m;
} info_job_t;

static int info_fn(void *ctx, ts_store_txn_t *t) {
    info_job_t *j = ctx;
    ts_manifest_free(&j->m);
    return ts_manifest_get(t, j->h, &j->m, NULL, 0);
}

int ts_weights_info(ts_store_t *s, const ts_hash_t *h, ts_weights_list_fn fn, void *ctx) {
    if (!s || !h || !fn)
        return TS_EINVAL;
    info_job_t j = {.h = h};
    int rc = ts_store_read(s, info_fn, &j);
    if (rc == TS_OK)
        rc = call_with_info(&j.m, fn, ctx);
    ts_manifest_free(&j.m);
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
        hex = ts_hash_digit(prefix[i]) >= 0;
    if (!hex) {
        ts_set_err(err, errlen,
                   "'%.80s' is not a weights hash: give %d to %d hex digits (tessera store ls "
                   "lists them)",
                   prefix, TS_HASH_MIN_PREFIX, 2 * TS_HASH_BYTES);
        return TS_EINVAL;
    }
    resolve_job_t j = {.nbytes = n / 2, .odd = (int)(n & 1)};
    for (size_t i = 0; i < j.nbytes; i++)
        j.bytes[i] =
            (unsigned char)(ts_hash_digit(prefix[2 * i]) << 4 | ts_hash_digit(prefix[2 * i + 1]));
    if (j.odd)
        j.nibble = ts_hash_digit(prefix[n - 1]);
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
    ts_manifest_t m;
    int rc = ts_manifest_get(t, j->h, &m, NULL, 0);
    if (rc)
        return rc;
    int pinned = j->pin >= 0 ? j->pin : m.pinned;
    uint64_t lru = m.lru;
    int64_t last_used = m.last_used;
    if (j->touch) {
        rc = ts_manifest_clock_next(t, &lru);
        last_used = (int64_t)time(NULL);
    }
    if (rc == TS_OK)
        rc = ts_manifest_bookkeeping(m.root, pinned, lru, last_used, m.imported);
    if (rc == TS_OK)
        rc = ts_manifest_put(t, j->h, m.root);
    ts_manifest_free(&m);
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

/* ---- gc, du, evict ------------------------------------------------------------------------ */

typedef struct {
    ts_manifest_all_t all;
    ts_manifest_refs_t refs;
    ts_manifest_orphans_t orphans;
    int del;
} sweep_job_t;

static void sweep_reset(sweep_job_t *j) {
    ts_manifest_all_reset(&j->all);
    free(j->refs.r);
    free(j->orphans.keys);
    j->refs = (ts_manifest_refs_t){0};
    j->orphans = (ts_manifest_orphans_t){0};
}

static int sweep_fn(void *ctx, ts_store_txn_t *t) {
    sweep_job_t *j = ctx;
    sweep_reset(j);
    int rc = ts_manifest_collect_all(t, &j->all);
    if (rc == TS_OK)
        rc = ts_manifest_refs_build(&j->refs, j->all.ms, j->all.n);
    if (rc == TS_OK)
        rc = ts_manifest_orphans_sweep(t, &j->refs, &j->orphans, j->del);
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
    return ts_hash_cmp(&x->hash, &y->hash);
}

static int evict_fn(void *ctx, ts_store_txn_t *t) {
    evict_job_t *j = ctx;
    sweep_reset(&j->sw);
    free(j->order);
    j->order = NULL, j->evicted = 0, j->unique = 0;
    int rc = ts_manifest_collect_all(t, &j->sw.all);
    if (rc == TS_OK)
        rc = ts_manifest_refs_build(&j->sw.refs, j->sw.all.ms, j->sw.all.n);
    if (rc)
        return rc;
    /* bytes of the chunks that are referenced and present */
    for (size_t i = 0; i < j->sw.refs.n; i++) {
        ts_manifest_ref_t *r = &j->sw.refs.r[i];
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
    const ts_manifest_t *ms = j->sw.all.ms;
    size_t n = j->sw.all.n, cand = 0;
    j->order = malloc((n ? n : 1) * sizeof *j->order);
    if (!j->order)
        return TS_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (!ms[i].pinned)
            j->order[cand++] = (cand_t){ms[i].lru, ms[i].imported, ms[i].hash, i};
    qsort(j->order, cand, sizeof *j->order, by_lru);
    for (size_t c = 0; c < cand && j->unique > j->budget && rc == TS_OK; c++) {
        const ts_manifest_t *m = &ms[j->order[c].idx];
        for (uint64_t k = 0; k < m->n_chunks; k++) {
            ts_manifest_ref_t *r = ts_manifest_refs_find(&j->sw.refs, m->chunks[k].b);
            if (r && r->count > 0 && --r->count == 0)
                j->unique -= r->size;
        }
        rc = ts_txn_del(t, TS_DB_MANIFESTS, m->hash.b, TS_HASH_BYTES);
        j->evicted++;
    }
    if (rc == TS_OK)
        rc = ts_manifest_orphans_sweep(t, &j->sw.refs, &j->sw.orphans, 1);
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
