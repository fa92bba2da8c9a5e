/*
 * store.c — the LMDB environment behind store.h.
 *
 * Layout. One environment per data directory (data.mdb + lock.mdb), opened with MDB_NOTLS so a
 * read transaction is not tied to the thread that began it, and one named database per ts_db_t.
 * The database handles are opened once, at ts_store_open, and live as long as the environment.
 * `meta` holds "schema" → the schema version in decimal; a store written by another schema is
 * refused at open with a sentence that says both versions.
 *
 * Two locks, both per store (there is no global state):
 *
 *   - wlock, a mutex, serialises ts_store_write. LMDB would serialise writers itself, but a
 *     second writer in the same process blocking inside LMDB while holding our resize lock
 *     could deadlock; the mutex keeps the order simple: wlock, then rlock.
 *   - rlock, a read-write lock, guards the map size. Every transaction (read or write) holds it
 *     shared while it is open; changing the map size (mdb_env_set_mapsize) holds it exclusive,
 *     because LMDB allows that only when the process has no transaction open.
 *
 * Recovery paths:
 *
 *   MDB_MAP_FULL      (from a put or from the commit) the write transaction is aborted, the map
 *                     is doubled — or grown past what the transaction tried to write, when that
 *                     is more — up to map_max, and the caller's function runs again from the
 *                     start. At map_max it is TS_ENOSPC: the store cannot hold the write.
 *   MDB_MAP_RESIZED   (from mdb_txn_begin: another process grew the map) the new size is
 *                     adopted with mdb_env_set_mapsize(env, 0) and the transaction begun again.
 *   MDB_READERS_FULL  stale reader slots of dead processes are cleared (mdb_reader_check) and
 *                     the transaction begun once more; if the table is still full, TS_EBUSY.
 *   ENOSPC / EIO      (and EFBIG, EDQUOT: the file cannot grow) the transaction is aborted and
 *                     TS_ENOSPC / TS_EIO returned; LMDB's copy-on-write commit means the file
 *                     still holds the last committed state. LMDB reports a short write as EIO;
 *                     it becomes TS_ENOSPC when the file system is in fact (nearly) full.
 *
 * A write function must therefore be restartable (it may only change the store through the
 * transaction it is given), must not call ts_store_write (wlock is not recursive), and a read
 * function must not call ts_store_write either (the resize would wait for its own reader).
 */
#define _POSIX_C_SOURCE 200809L

#include "store/store.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include <lmdb.h>

#define STORE_DEFAULT_MAP ((size_t)64 << 20)
#if SIZE_MAX > 0xffffffffu
#define STORE_DEFAULT_MAX ((size_t)1 << 40)
#else
#define STORE_DEFAULT_MAX ((size_t)1 << 30)
#endif
#define STORE_MAX_RETRIES 64 /* map growths or resizes before a write gives up */

static const char *const DB_NAMES[TS_DB_COUNT] = {"manifests", "chunks", "ckpt", "peers", "meta"};

struct ts_store {
    MDB_env *env;
    MDB_dbi dbi[TS_DB_COUNT];
    pthread_mutex_t wlock;
    pthread_rwlock_t rlock;
    size_t map_max;
    int readonly;
    char *dir;
};

struct ts_store_txn {
    ts_store_t *s;
    MDB_txn *txn;
    int readonly;
    int map_full;  /* a put hit MDB_MAP_FULL: the write is retried after growing the map */
    size_t wanted; /* bytes of keys and values this transaction has tried to write */
};

/* LMDB's return codes (its own and errno values) in tessera's terms. */
static int map_rc(int rc) {
    switch (rc) {
    case MDB_SUCCESS: return TS_OK;
    case MDB_NOTFOUND: return TS_ENOTFOUND;
    case MDB_KEYEXIST: return TS_EEXIST;
    case MDB_MAP_FULL: return TS_ENOSPC;
    case ENOSPC:
    case EFBIG: /* the file cannot grow (RLIMIT_FSIZE, the file system's limit): no space */
    case EDQUOT: return TS_ENOSPC;
    case ENOMEM: return TS_ENOMEM;
    case EINVAL: return TS_EINVAL;
    case EACCES: return TS_EINVAL; /* a write in a read-only environment */
    case EAGAIN: return TS_EBUSY;
    case MDB_BAD_VALSIZE: return TS_ERANGE;
    case MDB_READERS_FULL: return TS_EBUSY;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE: return TS_ECORRUPT;
    default: return TS_EIO; /* EIO, MDB_PANIC and anything unexpected */
    }
}

/* A failed commit in tessera's terms. LMDB reports a short write as EIO ("filesystem full?"),
 * which is what a full disk usually looks like: when the file system has less room left than
 * the transaction wanted, say so. */
static int commit_rc(const ts_store_t *s, int mrc, size_t wanted) {
    struct statvfs v;
    if (mrc == EIO && statvfs(s->dir, &v) == 0 &&
        (uint64_t)v.f_bavail * v.f_frsize < (uint64_t)wanted + ((uint64_t)1 << 20))
        return TS_ENOSPC;
    return map_rc(mrc);
}

/* ---- the data directory ----------------------------------------------------------------- */

int ts_store_default_dir(char *buf, size_t len) {
    if (!buf || len == 0)
        return TS_EINVAL;
    const char *xdg = getenv("XDG_DATA_HOME");
    const char *home = getenv("HOME");
    int n;
    /* the XDG spec ignores a relative XDG_DATA_HOME */
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, len, "%s/tessera", xdg);
    else if (home && home[0])
        n = snprintf(buf, len, "%s/.local/share/tessera", home);
    else
        return TS_EINVAL;
    return n < 0 || (size_t)n >= len ? TS_ERANGE : TS_OK;
}

/* mkdir -p with mode 0700 for every directory it creates. */
static int make_dirs(const char *dir, char *why, size_t whylen) {
    size_t n = strlen(dir);
    char *p = malloc(n + 1);
    if (!p)
        return ENOMEM;
    memcpy(p, dir, n + 1);
    int rc = 0;
    for (size_t i = 1; i <= n && rc == 0; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            rc = errno;
        p[i] = c;
    }
    struct stat st;
    if (rc == 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        rc = errno ? errno : ENOTDIR;
    if (rc)
        snprintf(why, whylen, "%s", strerror(rc));
    free(p);
    return rc;
}

/* ---- locks and transactions ------------------------------------------------------------- */

/* Adopts a map grown by another process (size 0) or grows it to size; no transaction of this
 * process may be open, which rlock taken exclusive guarantees. */
static int set_map_size(ts_store_t *s, size_t size) {
    pthread_rwlock_wrlock(&s->rlock);
    int rc = mdb_env_set_mapsize(s->env, size);
    pthread_rwlock_unlock(&s->rlock);
    return rc;
}

/* Begins a transaction holding rlock shared; handles MDB_MAP_RESIZED and MDB_READERS_FULL. On
 * success rlock stays held until end_txn. */
static int begin_txn(ts_store_t *s, unsigned flags, MDB_txn **txn) {
    int cleared = 0;
    for (int attempt = 0; attempt < STORE_MAX_RETRIES; attempt++) {
        pthread_rwlock_rdlock(&s->rlock);
        int rc = mdb_txn_begin(s->env, NULL, flags, txn);
        if (rc == MDB_SUCCESS)
            return TS_OK;
        pthread_rwlock_unlock(&s->rlock);
        if (rc == MDB_MAP_RESIZED) {
            rc = set_map_size(s, 0);
            if (rc != MDB_SUCCESS)
                return map_rc(rc);
        } else if (rc == MDB_READERS_FULL && !cleared) {
            int dead = 0;
            mdb_reader_check(s->env, &dead);
            cleared = 1;
        } else {
            return map_rc(rc);
        }
    }
    return TS_EBUSY;
}

static void end_txn(ts_store_t *s, MDB_txn *txn, int commit, int *rc) {
    if (commit)
        *rc = mdb_txn_commit(txn);
    else
        mdb_txn_abort(txn);
    pthread_rwlock_unlock(&s->rlock);
}

/* ---- open and close --------------------------------------------------------------------- */

/* Opens the named databases and checks (or, on a fresh store, writes) the schema version. */
static int open_dbs(ts_store_t *s, char *err, size_t errlen) {
    MDB_txn *txn;
    int rc = begin_txn(s, s->readonly ? MDB_RDONLY : 0, &txn);
    if (rc) {
        ts_set_err(err, errlen, "store %s: cannot begin a transaction: %s", s->dir, ts_strerror(rc));
        return rc;
    }
    int mrc = MDB_SUCCESS;
    for (int i = 0; i < TS_DB_COUNT && mrc == MDB_SUCCESS; i++) {
        mrc = mdb_dbi_open(txn, DB_NAMES[i], s->readonly ? 0 : MDB_CREATE, &s->dbi[i]);
        if (mrc == MDB_NOTFOUND)
            ts_set_err(err, errlen, "store %s: no '%s' database: not a tessera store", s->dir,
                    DB_NAMES[i]);
        else if (mrc != MDB_SUCCESS)
            ts_set_err(err, errlen, "store %s: cannot open the '%s' database: %s", s->dir, DB_NAMES[i],
                    mdb_strerror(mrc));
    }
    if (mrc != MDB_SUCCESS) {
        end_txn(s, txn, 0, NULL);
        return mrc == MDB_NOTFOUND ? TS_ECORRUPT : map_rc(mrc);
    }
    static const char key[] = "schema";
    MDB_val k = {sizeof key - 1, (void *)key}, v;
    mrc = mdb_get(txn, s->dbi[TS_DB_META], &k, &v);
    if (mrc == MDB_SUCCESS) {
        char buf[24];
        long long version = -1;
        if (v.mv_size > 0 && v.mv_size < sizeof buf) {
            memcpy(buf, v.mv_data, v.mv_size);
            buf[v.mv_size] = '\0';
            char *end;
            errno = 0;
            version = strtoll(buf, &end, 10);
            if (errno || *end || end == buf)
                version = -1;
        }
        if (version != TS_STORE_SCHEMA) {
            if (version < 0)
                ts_set_err(err, errlen, "store %s: the schema version in 'meta' is unreadable",
                        s->dir);
            else
                ts_set_err(err, errlen,
                        "store %s: schema version %lld, this build reads %d (use a tessera "
                        "that matches, or another --data-dir)",
                        s->dir, version, TS_STORE_SCHEMA);
            end_txn(s, txn, 0, NULL);
            return version < 0 ? TS_ECORRUPT : TS_ENOTSUP;
        }
    } else if (mrc == MDB_NOTFOUND && !s->readonly) {
        char buf[24];
        int n = snprintf(buf, sizeof buf, "%d", TS_STORE_SCHEMA);
        v = (MDB_val){(size_t)n, buf};
        mrc = mdb_put(txn, s->dbi[TS_DB_META], &k, &v, 0);
    } else if (mrc == MDB_NOTFOUND) {
        ts_set_err(err, errlen, "store %s: no schema version: not a tessera store", s->dir);
        end_txn(s, txn, 0, NULL);
        return TS_ECORRUPT;
    }
    if (mrc != MDB_SUCCESS) {
        ts_set_err(err, errlen, "store %s: cannot write the schema version: %s", s->dir,
                mdb_strerror(mrc));
        end_txn(s, txn, 0, NULL);
        return map_rc(mrc);
    }
    /* committing (also a read-only transaction) keeps the database handles */
    end_txn(s, txn, 1, &mrc);
    if (mrc != MDB_SUCCESS) {
        ts_set_err(err, errlen, "store %s: cannot commit: %s", s->dir, mdb_strerror(mrc));
        return map_rc(mrc);
    }
    return TS_OK;
}

int ts_store_open(ts_store_t **out, const ts_store_opts_t *opts, char *err, size_t errlen) {
    if (!out)
        return TS_EINVAL;
    *out = NULL;
    ts_store_opts_t o = opts ? *opts : (ts_store_opts_t){0};
    char defdir[4096];
    if (!o.dir || !o.dir[0]) {
        if (ts_store_default_dir(defdir, sizeof defdir) != TS_OK) {
            ts_set_err(err, errlen, "no data directory: set XDG_DATA_HOME or HOME, or pass one");
            return TS_EINVAL;
        }
        o.dir = defdir;
    }
    if (o.map_size == 0)
        o.map_size = STORE_DEFAULT_MAP;
    if (o.map_max == 0)
        o.map_max = STORE_DEFAULT_MAX;
    if (o.map_max < o.map_size)
        o.map_max = o.map_size;

    ts_store_t *s = calloc(1, sizeof *s);
    if (!s || !(s->dir = strdup(o.dir))) {
        free(s);
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    s->map_max = o.map_max;
    s->readonly = o.readonly;
    pthread_mutex_init(&s->wlock, NULL);
    pthread_rwlock_init(&s->rlock, NULL);

    char why[256] = "";
    int rc = TS_OK;
    if (!o.readonly && make_dirs(s->dir, why, sizeof why) != 0) {
        ts_set_err(err, errlen, "store %s: cannot create the directory: %s", s->dir, why);
        rc = TS_EIO;
    }
    int mrc = MDB_SUCCESS;
    if (rc == TS_OK && (mrc = mdb_env_create(&s->env)) != MDB_SUCCESS)
        s->env = NULL;
    if (rc == TS_OK && mrc == MDB_SUCCESS)
        mrc = mdb_env_set_maxdbs(s->env, TS_DB_COUNT);
    if (rc == TS_OK && mrc == MDB_SUCCESS)
        mrc = mdb_env_set_mapsize(s->env, o.map_size);
    if (rc == TS_OK && mrc == MDB_SUCCESS)
        mrc = mdb_env_open(s->env, s->dir, MDB_NOTLS | (o.readonly ? MDB_RDONLY : 0), 0600);
    if (rc == TS_OK && mrc != MDB_SUCCESS) {
        rc = map_rc(mrc);
        if (mrc == ENOENT)
            rc = TS_ENOTFOUND;
        ts_set_err(err, errlen, "store %s: cannot open the LMDB environment: %s", s->dir,
                mdb_strerror(mrc));
    }
    if (rc == TS_OK)
        rc = open_dbs(s, err, errlen);
    if (rc != TS_OK) {
        ts_store_close(s);
        return rc;
    }
    *out = s;
    return TS_OK;
}

void ts_store_close(ts_store_t *s) {
    if (!s)
        return;
    if (s->env)
        mdb_env_close(s->env); /* also closes the database handles */
    pthread_rwlock_destroy(&s->rlock);
    pthread_mutex_destroy(&s->wlock);
    free(s->dir);
    free(s);
}

const char *ts_store_dir(const ts_store_t *s) { return s ? s->dir : NULL; }

size_t ts_store_map_size(const ts_store_t *s) {
    if (!s)
        return 0;
    MDB_envinfo info;
    if (mdb_env_info(s->env, &info) != MDB_SUCCESS)
        return 0;
    return info.me_mapsize;
}

/* ---- transactions ----------------------------------------------------------------------- */

/* The next map size after a MDB_MAP_FULL: double, or more when one transaction wants more;
 * 0 when already at the maximum. */
static size_t grown_size(const ts_store_t *s, size_t cur, size_t wanted) {
    if (cur >= s->map_max)
        return 0;
    size_t next = cur > s->map_max / 2 ? s->map_max : cur * 2;
    /* a write of `wanted` bytes needs about that much free space, plus B-tree pages */
    if (wanted > (s->map_max - cur) / 2)
        return s->map_max;
    if (next < cur + 2 * wanted)
        next = cur + 2 * wanted;
    return next;
}

int ts_store_write(ts_store_t *s, ts_store_fn fn, void *ctx) {
    if (!s || !fn)
        return TS_EINVAL;
    if (s->readonly)
        return TS_EINVAL;
    pthread_mutex_lock(&s->wlock);
    int rc = TS_OK;
    for (int attempt = 0;; attempt++) {
        ts_store_txn_t t = {.s = s, .readonly = 0};
        rc = begin_txn(s, 0, &t.txn);
        if (rc)
            break;
        rc = fn(ctx, &t);
        int mrc = MDB_SUCCESS;
        if (rc == TS_OK && !t.map_full) {
            end_txn(s, t.txn, 1, &mrc);
            if (mrc == MDB_MAP_FULL)
                t.map_full = 1;
            else
                rc = commit_rc(s, mrc, t.wanted);
        } else {
            end_txn(s, t.txn, 0, NULL);
        }
        if (!t.map_full)
            break;
        /* the map is full: grow it and run fn again from the start */
        size_t cur = ts_store_map_size(s);
        size_t next = grown_size(s, cur, t.wanted);
        if (next == 0 || attempt + 1 >= STORE_MAX_RETRIES) {
            rc = TS_ENOSPC;
            break;
        }
        mrc = set_map_size(s, next);
        if (mrc != MDB_SUCCESS) {
            rc = map_rc(mrc);
            break;
        }
    }
    pthread_mutex_unlock(&s->wlock);
    return rc;
}

int ts_store_read(ts_store_t *s, ts_store_fn fn, void *ctx) {
    if (!s || !fn)
        return TS_EINVAL;
    ts_store_txn_t t = {.s = s, .readonly = 1};
    int rc = begin_txn(s, MDB_RDONLY, &t.txn);
    if (rc)
        return rc;
    rc = fn(ctx, &t);
    end_txn(s, t.txn, 0, NULL);
    return rc;
}

static int bad_db(ts_db_t db) { return (int)db < 0 || (int)db >= TS_DB_COUNT; }

int ts_txn_get(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen, const void **val,
               size_t *vlen) {
    if (!t || bad_db(db) || !key || klen == 0 || !val || !vlen)
        return TS_EINVAL;
    MDB_val k = {klen, (void *)key}, v;
    int rc = mdb_get(t->txn, t->s->dbi[db], &k, &v);
    if (rc != MDB_SUCCESS)
        return map_rc(rc);
    *val = v.mv_data;
    *vlen = v.mv_size;
    return TS_OK;
}

/* A put that records MDB_MAP_FULL so ts_store_write grows the map and retries. */
static int put(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen, MDB_val *v,
               unsigned flags) {
    if (t->readonly)
        return TS_EINVAL;
    if (t->map_full)
        return TS_ENOSPC; /* the transaction is dead; the write will be retried */
    MDB_val k = {klen, (void *)key};
    t->wanted += klen + v->mv_size;
    int rc = mdb_put(t->txn, t->s->dbi[db], &k, v, flags);
    if (rc == MDB_MAP_FULL)
        t->map_full = 1;
    return map_rc(rc);
}

int ts_txn_put(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen, const void *val,
               size_t vlen) {
    if (!t || bad_db(db) || !key || klen == 0 || (!val && vlen))
        return TS_EINVAL;
    MDB_val v = {vlen, (void *)val};
    return put(t, db, key, klen, &v, 0);
}

int ts_txn_reserve(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen, size_t vlen,
                   void **val) {
    if (!t || bad_db(db) || !key || klen == 0 || !val)
        return TS_EINVAL;
    MDB_val v = {vlen, NULL};
    int rc = put(t, db, key, klen, &v, MDB_RESERVE);
    *val = rc == TS_OK ? v.mv_data : NULL;
    return rc;
}

int ts_txn_del(ts_store_txn_t *t, ts_db_t db, const void *key, size_t klen) {
    if (!t || bad_db(db) || !key || klen == 0)
        return TS_EINVAL;
    if (t->readonly)
        return TS_EINVAL;
    if (t->map_full)
        return TS_ENOSPC;
    MDB_val k = {klen, (void *)key};
    int rc = mdb_del(t->txn, t->s->dbi[db], &k, NULL);
    if (rc == MDB_MAP_FULL) /* a delete can need fresh pages too (copy-on-write) */
        t->map_full = 1;
    return map_rc(rc);
}

int ts_txn_foreach(ts_store_txn_t *t, ts_db_t db, const void *prefix, size_t plen,
                   ts_txn_each_fn fn, void *ctx) {
    if (!t || bad_db(db) || (!prefix && plen) || !fn)
        return TS_EINVAL;
    MDB_cursor *cur;
    int mrc = mdb_cursor_open(t->txn, t->s->dbi[db], &cur);
    if (mrc != MDB_SUCCESS)
        return map_rc(mrc);
    MDB_val k = {plen, (void *)prefix}, v;
    mrc =
        plen ? mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE) : mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    int rc = TS_OK;
    while (mrc == MDB_SUCCESS) {
        if (plen && (k.mv_size < plen || memcmp(k.mv_data, prefix, plen) != 0))
            break;
        rc = fn(ctx, k.mv_data, k.mv_size, v.mv_data, v.mv_size);
        if (rc != TS_OK)
            break;
        mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cur);
    if (rc != TS_OK)
        return rc;
    return mrc == MDB_SUCCESS || mrc == MDB_NOTFOUND ? TS_OK : map_rc(mrc);
}

int ts_txn_stat(ts_store_txn_t *t, ts_db_t db, uint64_t *entries, uint64_t *bytes) {
    if (!t || bad_db(db))
        return TS_EINVAL;
    MDB_stat st;
    int mrc = mdb_stat(t->txn, t->s->dbi[db], &st);
    if (mrc != MDB_SUCCESS)
        return map_rc(mrc);
    if (entries)
        *entries = st.ms_entries;
    if (!bytes)
        return TS_OK;
    /* LMDB keeps no byte count: walk the keys (a value's size is in its node, so this reads
     * the leaf pages only, not the values themselves) */
    MDB_cursor *cur;
    if ((mrc = mdb_cursor_open(t->txn, t->s->dbi[db], &cur)) != MDB_SUCCESS)
        return map_rc(mrc);
    uint64_t sum = 0;
    MDB_val k, v;
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == MDB_SUCCESS;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
        sum += k.mv_size + v.mv_size;
    mdb_cursor_close(cur);
    if (mrc != MDB_NOTFOUND)
        return map_rc(mrc);
    *bytes = sum;
    return TS_OK;
}
