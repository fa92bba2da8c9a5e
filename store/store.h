/*
 * store.h — the LMDB environment that holds all durable state of a node or a client
 * (architecture.md §8).
 *
 * One environment per data directory (default $XDG_DATA_HOME/tessera, else
 * ~/.local/share/tessera), with the named databases below and a schema version in `meta`
 * checked at open. Everything above this module talks to LMDB only through these functions:
 *
 *   - Writes run a caller's function inside one write transaction (ts_store_write). When LMDB
 *     reports MDB_MAP_FULL the transaction is aborted, the map is grown (doubled, up to the
 *     configured maximum) and the function is run again from the start — so a write function
 *     must be restartable: it may only change the store through the transaction it is given.
 *     Writes are serialised by a mutex (LMDB allows one writer; architecture.md §4 wants one
 *     writing thread, and the mutex makes a second one wait rather than corrupt anything).
 *   - Reads run inside a read-only transaction (ts_store_read). The environment is opened with
 *     MDB_NOTLS so readers are not tied to threads; MDB_MAP_RESIZED (another process grew the
 *     map) is handled by adopting the new size and retrying; MDB_READERS_FULL by clearing stale
 *     reader slots (mdb_reader_check) and retrying once.
 *   - A full disk (ENOSPC) or any I/O error aborts the transaction and is returned as TS_ENOSPC
 *     / TS_EIO: LMDB's copy-on-write commit means the store on disk is the last committed state.
 *
 * Values returned by ts_txn_get point into the map and are valid only until the transaction
 * ends; copy what must outlive it.
 */
#ifndef TS_STORE_H
#define TS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_STORE_SCHEMA 1

typedef enum {
    TS_DB_MANIFESTS = 0, /* weights hash (32 bytes) → manifest */
    TS_DB_CHUNKS,        /* chunk hash (32 bytes) → chunk bytes (≤ 1 MiB) */
    TS_DB_CKPT,          /* run id + step → training checkpoint */
    TS_DB_PEERS,         /* node id → address book entry */
    TS_DB_META,          /* "schema", cache bookkeeping, ... */
    TS_DB_COUNT
} ts_db_t;

typedef struct ts_store ts_store_t;
typedef struct ts_store_txn ts_store_txn_t;

typedef struct ts_store_opts {
    const char *dir; /* NULL: the default data directory (created if missing, mode 0700) */
    size_t map_size; /* initial map size in bytes; 0: 64 MiB */
    size_t map_max;  /* the map never grows past this; 0: 1 TiB */
    int readonly;    /* open without write access (ts_store_write fails) */
} ts_store_opts_t;

/* Writes the default data directory into buf: $XDG_DATA_HOME/tessera, else
 * $HOME/.local/share/tessera. TS_EINVAL when neither variable is set. */
int ts_store_default_dir(char *buf, size_t len);

/* Opens (creating when needed) the environment; checks or writes the schema version. On error
 * *out is NULL and err holds a sentence (e.g. "store /x: schema version 7, this build reads 1").
 * Close with ts_store_close. */
int ts_store_open(ts_store_t **out, const ts_store_opts_t *opts, char *err, size_t errlen);
void ts_store_close(ts_store_t *s);
const char *ts_store_dir(const ts_store_t *s);
/* Current map size in bytes. */
size_t ts_store_map_size(const ts_store_t *s);

typedef int (*ts_store_fn)(void *ctx, ts_store_txn_t *txn);
/* Runs fn in a write transaction and commits when it returns TS_OK (aborts otherwise, and
 * returns its code). Retries after growing the map on MDB_MAP_FULL. */
int ts_store_write(ts_store_t *s, ts_store_fn fn, void *ctx);
/* Runs fn in a read-only transaction. */
int ts_store_read(ts_store_t *s, ts_store_fn fn, void *ctx);

/* TS_ENOTFOUND when the key is absent. */
int ts_txn_get(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen, const void **val,
               size_t *vlen);
int ts_txn_put(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen, const void *val,
               size_t vlen);
/* Reserves vlen bytes for the value and returns where to write them (MDB_RESERVE): saves a
 * copy for large values such as chunks. */
int ts_txn_reserve(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen, size_t vlen,
                   void **val);
/* TS_ENOTFOUND when the key is absent. */
int ts_txn_del(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen);

/* Calls fn for every key starting with prefix (all keys when plen == 0), in key order; stops
 * early and returns fn's value when it is not TS_OK. fn must not write to db. */
typedef int (*ts_txn_each_fn)(void *ctx, const void *key, size_t klen, const void *val,
                              size_t vlen);
int ts_txn_foreach(ts_store_txn_t *t, ts_db_t db, const void *prefix, size_t plen,
                   ts_txn_each_fn fn, void *ctx);

/* Entries and bytes (keys + values) in a database. */
int ts_txn_stat(ts_store_txn_t *t, ts_db_t db, uint64_t *entries, uint64_t *bytes);

#ifdef __cplusplus
}
#endif

#endif
