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
#include "store/manifest.h"

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
    size_t len = (size_t)ts_manifest_chunk_len(j->len, TS_WEIGHTS_CHUNK, i);
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
    int rc = ts_manifest_clock_next(t, &lru);
    if (rc)
        return rc;
    int pinned = 0;
    int64_t imported = j->now;
    const void *val;
    size_t vlen;
    if (ts_txn_get(t, TS_DB_MANIFESTS, j->whole->b, TS_HASH_BYTES, &val, &vlen) == TS_OK) {
        ts_manifest_t old; /* a re-import keeps the pin and the first import time */
        if (ts_manifest_parse(val, vlen, j->whole, &old, NULL, 0) == TS_OK) {
            pinned = old.pinned;
            imported = old.imported;
            ts_manifest_free(&old);
        }
    }
    rc = ts_manifest_bookkeeping(j->manifest, pinned, lru, j->now, imported);
    return rc ? rc : ts_manifest_put(t, j->whole, j->manifest);
}

/* Imports a validated file f (whose buffer is the file). */
static int import_parsed(ts_store_t *s, const ts_st_file_t *f, ts_hash_t *out,
                         ts_weights_progress_fn progress, void *ctx, char *err, size_t errlen) {
    ts_hash_ready();
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
        size_t cl = (size_t)ts_manifest_chunk_len(len, TS_WEIGHTS_CHUNK, i);
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
        j.manifest = ts_manifest_build(f, &whole, chunks, n);
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
        ts_errno_text(e, why, sizeof why);
        ts_set_err(err, errlen, "cannot open '%s': %s", path, why);
        if (fd >= 0)
            close(fd);
        return e == ENOENT ? TS_ENOTFOUND : TS_EIO;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size > TS_MANIFEST_MAX_FILE) {
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
                ts_errno_text(errno, why, sizeof why);
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
        ts_err_prefix(err, errlen, "not a valid safetensors file: ");
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
        ts_err_prefix(err, errlen, pre);
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
            ts_errno_text(e, why, sizeof why);
            ts_set_err(err, errlen, "writing the file failed: %s", why);
            return e == ENOSPC ? TS_ENOSPC : TS_EIO;
        }
        p += w, len -= (size_t)w, k->off += (uint64_t)w;
    }
    return TS_OK;
}

/* What is wrong with stored chunk i of m (0: nothing), and its bytes; *rc is set when the store
 * could not be read. */
static ts_chunk_problem_t check_chunk(ts_store_txn_t *t, const ts_manifest_t *m, uint64_t i,
                                      const void **data, size_t *len, int *rc) {
    *rc = ts_txn_get(t, TS_DB_CHUNKS, m->chunks[i].b, TS_HASH_BYTES, data, len);
    if (*rc == TS_ENOTFOUND) {
        *rc = TS_OK;
        return TS_CHUNK_MISSING;
    }
    if (*rc)
        return 0;
    ts_hash_t got;
    if (*len != ts_manifest_chunk_len(m->size, m->chunk_size, i))
        return TS_CHUNK_BAD;
    ts_hash_compute(&got, *data, *len);
    return memcmp(got.b, m->chunks[i].b, TS_HASH_BYTES) == 0 ? 0 : TS_CHUNK_BAD;
}

/* Streams every chunk of m, verified, into k; then checks the whole hash. */
static int reassemble(ts_store_txn_t *t, const ts_manifest_t *m, sink_t *k, char *err,
                      size_t errlen) {
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
                       ts_hash_text(&m->chunks[i]).s, ts_strerror(rc));
            return rc;
        }
        if (p) {
            ts_set_err(err, errlen,
                       "weights %s: chunk %llu of %llu (%s) is %s; fetch it again, or import the "
                       "file again",
                       ts_hash_text(&m->hash).s, (unsigned long long)i,
                       (unsigned long long)m->n_chunks, ts_hash_text(&m->chunks[i]).s,
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
                   ts_hash_text(&m->hash).s, ts_hash_text(&whole).s);
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
    ts_manifest_t m;
    int rc = ts_manifest_get(t, j->h, &m, j->err, j->errlen);
    if (rc)
        return rc;
    if (j->to_memory) {
        free(j->buf);
        j->buf = malloc(m.size ? (size_t)m.size : 1);
        j->len = (size_t)m.size;
        if (!j->buf) {
            ts_set_err(j->err, j->errlen, "out of memory for %llu bytes",
                       (unsigned long long)m.size);
            ts_manifest_free(&m);
            return TS_ENOMEM;
        }
        j->sink = (sink_t){.mem = j->buf};
    } else if (ftruncate(j->sink.fd, 0) != 0 || lseek(j->sink.fd, 0, SEEK_SET) != 0) {
        ts_set_err(j->err, j->errlen, "cannot rewind the output file");
        ts_manifest_free(&m);
        return TS_EIO;
    }
    rc = reassemble(t, &m, &j->sink, j->err, j->errlen);
    ts_manifest_free(&m);
    return rc;
}

int ts_weights_load(ts_store_t *s, const ts_hash_t *h, unsigned char **buf, size_t *len, char *err,
                    size_t errlen) {
    if (!s || !h || !buf || !len) {
        ts_set_err(err, errlen, "ts_weights_load: invalid arguments");
        return TS_EINVAL;
    }
    ts_hash_ready();
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
    ts_hash_ready();
    /* written whole or not at all (base/file.h); the reassembly writes the descriptor, never the
     * FILE's buffer, so that a retried transaction can truncate it and start again */
    char why[128];
    ts_atomic_file_t a;
    int e = 0, rc = ts_atomic_open(&a, path, &e);
    if (rc != TS_OK) {
        ts_errno_text(e ? e : EIO, why, sizeof why);
        ts_set_err(err, errlen, "cannot create a temporary file next to '%s': %s", path,
                   e ? why : ts_strerror(rc));
        return rc;
    }
    read_job_t j = {.h = h, .sink = {.fd = fileno(a.fp)}, .err = err, .errlen = errlen};
    rc = ts_store_read(s, read_fn, &j);
    e = 0;
    int committed = ts_atomic_commit(&a, rc == TS_OK, &e);
    if (rc == TS_OK && committed != TS_OK) {
        ts_errno_text(e ? e : EIO, why, sizeof why);
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
        snprintf(pre, sizeof pre, "weights %.16s: ", ts_hash_text(h).s);
        ts_err_prefix(err, errlen, pre);
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
    ts_manifest_t m;
    int rc = ts_manifest_get(t, j->h, &m, NULL, 0);
    for (uint64_t i = 0; rc == TS_OK && i < m.n_chunks; i++) {
        const void *data;
        size_t len;
        ts_chunk_problem_t p = check_chunk(t, &m, i, &data, &len, &rc);
        if (rc == TS_OK && p)
            rc = push_bad(j, i, &m.chunks[i], p);
    }
    ts_manifest_free(&m);
    return rc;
}

int ts_weights_bad_chunks(ts_store_t *s, const ts_hash_t *h, ts_weights_chunk_fn fn, void *ctx) {
    if (!s || !h)
        return TS_EINVAL;
    ts_hash_ready();
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
        ts_hash_ready();
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
    ts_hash_ready();
    ts_hash_t got;
    ts_hash_compute(&got, data, len);
    if (memcmp(got.b, chunk->b, TS_HASH_BYTES) != 0)
        return TS_ECORRUPT;
    put_job_t j = {chunk, data, len};
    return ts_store_write(s, put_fn, &j);
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
    ts_manifest_t m;
    j->stats.manifests++;
    if (ts_manifest_parse(val, vlen, &h, &m, why, sizeof why) != TS_OK)
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
                 ts_hash_text(&whole).s);
        rc = add_problem(j, key, -1, NULL, why);
    }
    ts_manifest_free(&m);
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
    ts_hash_ready();
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
