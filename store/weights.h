/*
 * weights.h — expert weights in the store as content-addressed chunks (architecture.md §8).
 *
 * A safetensors file is cut into 1 MiB chunks (the last one shorter). Each chunk is stored in
 * the `chunks` database under its BLAKE2b-256 hash, so a chunk shared by two files — or present
 * twice in one — is stored once. The **weights hash**, BLAKE2b-256 of the whole file, names the
 * file: it is the key of its manifest in `manifests`, what `tessera store import` prints, and
 * what adverts carry.
 *
 * The manifest is compact JSON (readable with `mdb_dump -s manifests`), version 1:
 *
 *   {"format": "tessera-manifest/1",
 *    "hash": "<64 hex>",               the whole file's BLAKE2b-256 (equal to the key)
 *    "size": 19170904,                 file size in bytes
 *    "chunk_size": 1048576,
 *    "chunks": ["<64 hex>", ...],      ceil(size / chunk_size) chunk hashes, in file order
 *    "tensors": [{"name": "...", "dtype": "F32", "shape": [384, 128],
 *                 "data_offsets": [0, 196608]}, ...],   in data-offset order
 *    "metadata": {"hidden_size": "128", ...},           the file's __metadata__ (model config)
 *    "pinned": false,                  pinned experts are never evicted
 *    "lru": 12,                        the LRU clock at the last use (see ts_weights_touch)
 *    "last_used": 1718000000,          unix seconds of the last use
 *    "imported": 1718000000}           unix seconds of the first import
 *
 * The LRU clock is a counter in `meta` ("weights.lru_clock", 8 bytes little-endian) bumped by
 * every import and touch, so the order of uses is exact even within one second.
 *
 * Crash safety. An import validates the file (ts_st_parse) before it writes anything, then
 * writes the chunks in transactions of TS_WEIGHTS_BATCH chunks and the manifest LAST in a
 * transaction of its own, which also re-checks that every chunk it names is present (writing
 * any that a concurrent gc removed). A kill at any moment therefore leaves either the whole
 * manifest with all its chunks, or no manifest and some orphan chunks, which are harmless and
 * which ts_weights_gc deletes. Reading verifies: every chunk's bytes against its hash, and the
 * reassembled file against the weights hash.
 *
 * Every function here opens its own transactions (ts_store_read / ts_store_write); none may be
 * called from inside a store transaction. Callbacks run after the transaction has ended, so
 * they may call back into this module.
 */
#ifndef TS_WEIGHTS_H
#define TS_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/dit.h"
#include "store/hash.h"
#include "store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_HASH_MIN_PREFIX 8                   /* hex digits a prefix must have */
#define TS_WEIGHTS_CHUNK ((size_t)1 << 20)     /* bytes per chunk */
#define TS_WEIGHTS_BATCH 16                    /* chunks per import transaction */
#define TS_WEIGHTS_FORMAT "tessera-manifest/1" /* the manifest's "format" */

/* ---- import, export, load ----------------------------------------------------------------- */

/* Progress of an import: done of total bytes written (called after each chunk transaction). */
typedef void (*ts_weights_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Imports a safetensors file: reads it whole, validates it (an invalid file is TS_ECORRUPT and
 * nothing is stored), stores the chunks not already present and then the manifest, and writes
 * the weights hash into *out. Importing a file already present is cheap and idempotent (it
 * repairs missing or damaged chunks, keeps the pin, and counts as a use). progress may be NULL. */
int ts_weights_import_file(ts_store_t *s, const char *path, ts_hash_t *out,
                           ts_weights_progress_fn progress, void *ctx, char *err, size_t errlen);
/* The same for a file already in memory (data is copied; the caller keeps it). */
int ts_weights_import_buf(ts_store_t *s, const void *data, size_t len, ts_hash_t *out,
                          ts_weights_progress_fn progress, void *ctx, char *err, size_t errlen);

/* Writes the file named by h to path, byte-identical to the imported one, atomically (a
 * temporary file in the same directory, fsync, rename). Chunks are verified as they are written;
 * a missing or bad chunk is TS_ECORRUPT naming its index and hash, and path is untouched. */
int ts_weights_export(ts_store_t *s, const ts_hash_t *h, const char *path, char *err,
                      size_t errlen);

/* Reassembles the file named by h into *buf (malloc'd, caller frees; *len bytes), verifying
 * every chunk and the whole hash. A missing or bad chunk is TS_ECORRUPT with its index and hash
 * in err (ts_weights_bad_chunks lists them all); no manifest is TS_ENOTFOUND. */
int ts_weights_load(ts_store_t *s, const ts_hash_t *h, unsigned char **buf, size_t *len, char *err,
                    size_t errlen);

/* Loads the file named by h and builds *m from it on engine e (max_batch, trainable as
 * ts_dit_create); counts as a use (ts_weights_touch, skipped on a read-only store). On failure
 * *m is empty and err says why. */
int ts_weights_open_dit(ts_store_t *s, const ts_hash_t *h, ts_engine_t *e, int max_batch,
                        int trainable, ts_dit_t *m, char *err, size_t errlen);

/* ---- chunks: what to re-fetch, and storing a fetched one ---------------------------------- */

typedef enum {
    TS_CHUNK_MISSING = 1, /* not in the store */
    TS_CHUNK_BAD = 2,     /* present, but its bytes do not hash to its key (or wrong length) */
} ts_chunk_problem_t;

/* Called once per bad chunk of a manifest, in file order. */
typedef void (*ts_weights_chunk_fn)(void *ctx, uint64_t index, const ts_hash_t *chunk,
                                    ts_chunk_problem_t problem);
/* Checks every chunk of the manifest h; returns how many are missing or bad (0: all good), or a
 * negative error (TS_ENOTFOUND: no such manifest). fn may be NULL. */
int ts_weights_bad_chunks(ts_store_t *s, const ts_hash_t *h, ts_weights_chunk_fn fn, void *ctx);
/* Reads the chunk whose BLAKE2b-256 is *chunk, whatever file it belongs to, into *buf
 * (malloc'd, caller frees; *len bytes), after checking that its bytes hash to *chunk.
 * TS_ENOTFOUND when absent, TS_ECORRUPT when damaged (re-fetch it), TS_ENOMEM. */
int ts_weights_get_chunk(ts_store_t *s, const ts_hash_t *chunk, unsigned char **buf, size_t *len);
/* Stores one chunk after checking that data hashes to *chunk (TS_ECORRUPT otherwise) and that
 * len ≤ TS_WEIGHTS_CHUNK; replaces a damaged copy. */
int ts_weights_put_chunk(ts_store_t *s, const ts_hash_t *chunk, const void *data, size_t len);

/* ---- listing and bookkeeping -------------------------------------------------------------- */

/* One manifest, as listed. Strings point into memory valid only during the callback. */
typedef struct ts_weights_info {
    ts_hash_t hash;
    uint64_t size; /* file bytes */
    uint64_t chunk_size;
    uint64_t n_chunks;
    int n_tensors;
    int pinned;
    uint64_t lru;      /* LRU clock value of the last use */
    int64_t last_used; /* unix seconds */
    int64_t imported;  /* unix seconds */
    int n_meta;        /* the file's __metadata__ */
    const char *const *meta_keys;
    const char *const *meta_vals;
    const ts_hash_t *chunks; /* n_chunks chunk hashes, in file order */
    const char *dtype;       /* the first tensor's dtype ("F32", "F16", "BF16", ...), or NULL */
} ts_weights_info_t;

/* The value of a metadata key, or NULL. */
const char *ts_weights_info_meta(const ts_weights_info_t *info, const char *key);
/* A one-line config summary: "tiny-like h128 d4 p4" (the preset with the same hidden size,
 * depth, heads and patch), "h200 d3 p2" when no preset matches, "-" when not a DiT. */
void ts_weights_describe(const ts_weights_info_t *info, char *buf, size_t len);

/* Calls fn for every manifest in hash order; stops early and returns fn's value when it is not
 * TS_OK. A manifest that does not parse is TS_ECORRUPT (ts_weights_verify names it). */
typedef int (*ts_weights_list_fn)(void *ctx, const ts_weights_info_t *info);
int ts_weights_list(ts_store_t *s, ts_weights_list_fn fn, void *ctx);

/* Calls fn once with the info of the manifest h (TS_ENOTFOUND when absent) and returns its
 * value. */
int ts_weights_info(ts_store_t *s, const ts_hash_t *h, ts_weights_list_fn fn, void *ctx);

/* Finds the manifest whose hash starts with prefix: at least TS_HASH_MIN_PREFIX hex digits (a
 * full hash is a prefix too). TS_ENOTFOUND when none matches, TS_EINVAL for a malformed or an
 * ambiguous prefix; err says which. */
int ts_weights_resolve(ts_store_t *s, const char *prefix, ts_hash_t *out, char *err, size_t errlen);

/* Deletes the manifest (TS_ENOTFOUND if absent); its chunks become orphans for ts_weights_gc. */
int ts_weights_remove(ts_store_t *s, const ts_hash_t *h);
/* Sets or clears the pin (TS_ENOTFOUND if absent). */
int ts_weights_pin(ts_store_t *s, const ts_hash_t *h, int on);
/* Records a use: bumps the LRU clock into the manifest and sets last_used to now. */
int ts_weights_touch(ts_store_t *s, const ts_hash_t *h);

/* ---- checking and reclaiming space -------------------------------------------------------- */

typedef struct ts_weights_problem {
    ts_hash_t weights;    /* the manifest's hash */
    int64_t chunk;        /* the chunk's index, or −1 for the manifest or the whole file */
    ts_hash_t chunk_hash; /* zero when chunk is −1 */
    const char *what;     /* a sentence */
} ts_weights_problem_t;
typedef void (*ts_weights_verify_fn)(void *ctx, const ts_weights_problem_t *p);

typedef struct ts_weights_verify_stats {
    uint64_t manifests, chunks, bytes; /* checked: manifests, chunk references, file bytes */
} ts_weights_verify_stats_t;

/* Checks every manifest: it parses, every chunk is present and hashes to its key, and the
 * chunks in order hash to the weights hash. Calls fn for each problem (fn and stats may be
 * NULL) and returns the number of problems (0: all good), or a negative error. */
int ts_weights_verify(ts_store_t *s, ts_weights_verify_fn fn, void *ctx,
                      ts_weights_verify_stats_t *stats);

typedef struct ts_weights_gc {
    uint64_t chunks, bytes; /* deleted */
} ts_weights_gc_t;
/* Deletes every chunk no manifest references, in one transaction. Refuses (TS_ECORRUPT) while
 * a manifest does not parse, since its chunks cannot be told apart from orphans. out may be
 * NULL. */
int ts_weights_gc(ts_store_t *s, ts_weights_gc_t *out);

typedef struct ts_weights_du {
    uint64_t manifests, pinned;
    uint64_t chunks;                      /* stored chunks */
    uint64_t unique_bytes;                /* bytes of the stored chunks: what the weights occupy */
    uint64_t logical_bytes;               /* sum of the manifests' file sizes */
    uint64_t orphan_chunks, orphan_bytes; /* stored chunks no manifest references */
    uint64_t map_size;                    /* the LMDB map size now */
} ts_weights_du_t;
int ts_weights_du(ts_store_t *s, ts_weights_du_t *out);

/* The client cache budget: evicts whole unpinned experts, least recently used first, until the
 * bytes of the chunks still referenced are ≤ budget, then deletes the chunks no manifest
 * references any more (gc) — all in one transaction. Pinned experts are never evicted, so the
 * result can stay above the budget (out->unique_bytes says). fn, called for each evicted expert
 * after the commit, and out may be NULL. */
typedef void (*ts_weights_evict_fn)(void *ctx, const ts_weights_info_t *evicted);
typedef struct ts_weights_evict {
    int evicted;
    uint64_t freed_chunks, freed_bytes; /* deleted chunks, orphans included */
    uint64_t unique_bytes;              /* stored chunk bytes afterwards */
} ts_weights_evict_t;
int ts_weights_evict(ts_store_t *s, uint64_t budget, ts_weights_evict_fn fn, void *ctx,
                     ts_weights_evict_t *out);

#ifdef __cplusplus
}
#endif

#endif
