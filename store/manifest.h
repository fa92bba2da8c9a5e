/*
 * manifest.h — what the two files of the weights store share (store/weights.h is the API):
 * the manifest record (parse, build, read, write, the whole set), the set of referenced chunks
 * with its orphans, and the LRU clock. store/weights.c imports, reads, stores fetched chunks and
 * verifies; store/weights_admin.c lists, resolves, pins, removes, collects garbage and evicts.
 * Internal to store/. Hashes, and a hash as text, are store/hash.h's.
 */
#ifndef TS_STORE_MANIFEST_H
#define TS_STORE_MANIFEST_H

#include <jansson.h>
#include <stdint.h>

#include "model/safetensors.h"
#include "store/store.h"
#include "store/weights.h"

#define TS_MANIFEST_LRU_KEY "weights.lru_clock"
#define TS_MANIFEST_MAX_FILE ((uint64_t)1 << 40) /* as the safetensors reader */
#define TS_MANIFEST_MAX_CHUNK                                                                      \
    ((uint64_t)1 << 26) /* a manifest's chunk_size above this is refused */

typedef struct manifest {
    json_t *root; /* the whole manifest; owned */
    ts_hash_t hash;
    uint64_t size, chunk_size, n_chunks;
    ts_hash_t *chunks; /* n_chunks, owned */
    int n_tensors;
    int pinned;
    uint64_t lru;
    int64_t last_used, imported;
} ts_manifest_t;

/* Every manifest of the store, parsed (in hash order). The first that does not parse stops the
 * walk with TS_ECORRUPT and its hash in *bad. */
typedef struct {
    ts_manifest_t *ms;
    size_t n, cap;
    ts_hash_t bad;
    char err[256];
} ts_manifest_all_t;

typedef struct ref {
    ts_hash_t h;    /* first: refs sort and search by hash */
    uint64_t count; /* references from manifests (each occurrence counts) */
    uint64_t size;  /* stored bytes (0 when missing) */
} ts_manifest_ref_t;

typedef struct {
    ts_manifest_ref_t *r;
    size_t n;
} ts_manifest_refs_t;

/* A chunk key whose count is zero, or not referenced at all, is an orphan. */
typedef struct {
    const ts_manifest_refs_t *refs;
    ts_hash_t *keys;
    size_t n, cap;
    uint64_t bytes, all_chunks, all_bytes;
} ts_manifest_orphans_t;

void ts_manifests_free(ts_manifest_t *ms, size_t n);

void ts_manifest_free(ts_manifest_t *m);

uint64_t ts_manifest_chunk_len(uint64_t size, uint64_t chunk_size, uint64_t i);

/* Parses and checks a stored manifest; key (when not NULL) is the hash it is stored under. */
int ts_manifest_parse(const void *val, size_t vlen, const ts_hash_t *key, ts_manifest_t *m,
                      char *err, size_t errlen);

/* The manifest of a validated file, without the bookkeeping fields (write_manifest adds them). */
json_t *ts_manifest_build(const ts_st_file_t *f, const ts_hash_t *whole, const ts_hash_t *chunks,
                          uint64_t n_chunks);

/* Serialises root and stores it under h. */
int ts_manifest_put(ts_store_txn_t *t, const ts_hash_t *h, json_t *root);

/* On failure *m is empty (ts_manifest_free is harmless on it). */
int ts_manifest_get(ts_store_txn_t *t, const ts_hash_t *h, ts_manifest_t *m, char *err,
                    size_t errlen);

void ts_manifest_all_reset(ts_manifest_all_t *a);

int ts_manifest_collect_all(ts_store_txn_t *t, ts_manifest_all_t *a);

int ts_manifest_refs_build(ts_manifest_refs_t *out, const ts_manifest_t *ms, size_t n);

ts_manifest_ref_t *ts_manifest_refs_find(const ts_manifest_refs_t *refs, const void *hash);

/* Finds the orphans (into o, which the caller frees with free(o->keys)) and, when del, deletes
 * them. */
int ts_manifest_orphans_sweep(ts_store_txn_t *t, const ts_manifest_refs_t *refs,
                              ts_manifest_orphans_t *o, int del);

int ts_manifest_clock_next(ts_store_txn_t *t, uint64_t *out);

/* Sets the bookkeeping fields of a manifest being written. */
int ts_manifest_bookkeeping(json_t *root, int pinned, uint64_t lru, int64_t last_used,
                            int64_t imported);

#endif
