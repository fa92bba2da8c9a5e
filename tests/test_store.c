/*
 * test_store.c — the LMDB environment (store/store.h), training checkpoints in it
 * (store/ckpt.h) and the address book (store/peers.h).
 *
 * Environment: create (parents, mode 0700), close, reopen; a schema mismatch is refused with a
 * sentence naming both versions; put/get/del/foreach/stat and their errors; a read-only store
 * refuses writes; the map grows from 1 MiB past 50 MiB of values without an error; a write
 * function that fails leaves nothing behind, and one that is restarted after MDB_MAP_FULL leaves
 * exactly one run's effect; readers on two threads concurrent with a writer always see a
 * consistent snapshot; a map grown by another process (fork) is adopted (MDB_MAP_RESIZED); a
 * full disk (a child with RLIMIT_FSIZE) is TS_ENOSPC and leaves every committed value intact.
 *
 * Checkpoints: keep the newest N of a run, latest, list (one run or all; a run whose name extends
 * another's is separate), a checkpoint at an earlier step supersedes the later ones, a 24 MB
 * checkpoint grows a 1 MiB map; a trainer's checkpoint goes through the store and back into a
 * fresh trainer that then steps identically, its bytes are those of the file checkpoint, and
 * corrupt or foreign blobs (truncated, flipped, another seed, one tensor of the wrong size) are
 * refused by ts_trainer_load_mem with the trainer untouched.
 *
 * Address book: round trip (0 and 8 addresses, a 255-byte address, IPv6), update, delete,
 * invalid entries refused at put, prune; the encoding refuses every truncation, extension and
 * out-of-range field, and survives every single-bit flip; a corrupt entry in the store is
 * TS_ECORRUPT for get and list, and prune removes it.
 *
 * Vouches (store/vouch.h): round trip, the time to live (and a clock moved back), refresh, forget
 * a node's every vouch and no other's, values refused at put; the encoding refuses every
 * truncation, an extension, another version, precision 0, a NUL in the class; an undecodable
 * value in the store reads as no vouch and is overwritten.
 *
 * Not covered here: kill -9 of a real training process (tests/test_store_kill.sh), and weights
 * (store/weights.h has its own test).
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/math.h"
#include "model/safetensors.h"
#include "model/trainer.h"
#include "store/ckpt.h"
#include "store/peers.h"
#include "store/store.h"
#include "store/vouch.h"

#define CHECK_RC(expr, want)                                                                       \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != (want)) {                                                                       \
            print_error("%s:%d: %s returned %d (%s), expected %d (%s)\n", __FILE__, __LINE__,      \
                        #expr, rc_, ts_strerror(rc_), (want), ts_strerror(want));                  \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

/* ---- helpers ---------------------------------------------------------------------------- */

typedef struct {
    char root[64]; /* a fresh temporary directory, removed at the end */
    char dir[128]; /* the store's directory: root/a/b (created by ts_store_open) */
} tmp_t;

static void tmp_make(tmp_t *t) {
    snprintf(t->root, sizeof t->root, "/tmp/tessera-test-store-XXXXXX");
    assert_non_null(mkdtemp(t->root));
    snprintf(t->dir, sizeof t->dir, "%s/a/b", t->root);
}

static void tmp_remove(tmp_t *t) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->root);
    assert_int_equal(system(cmd), 0);
}

static ts_store_t *open_store(const char *dir, size_t map_size) {
    ts_store_opts_t o = {.dir = dir, .map_size = map_size};
    ts_store_t *s = NULL;
    char err[256] = "";
    int rc = ts_store_open(&s, &o, err, sizeof err);
    if (rc != TS_OK)
        print_error("ts_store_open(%s): %s (%s)\n", dir, err, ts_strerror(rc));
    assert_int_equal(rc, TS_OK);
    assert_non_null(s);
    return s;
}

/* A write or read of one key, through a function as the API wants. */
typedef struct {
    ts_db_t db;
    const char *key;
    const void *val;
    size_t vlen;
    int del;
    void *out; /* get: copy of the value (malloc'd) */
    size_t out_len;
} kv_t;

static int kv_write(void *ctx, ts_store_txn_t *txn) {
    kv_t *kv = ctx;
    if (kv->del)
        return ts_txn_del(txn, kv->db, kv->key, strlen(kv->key));
    return ts_txn_put(txn, kv->db, kv->key, strlen(kv->key), kv->val, kv->vlen);
}

static int kv_read(void *ctx, ts_store_txn_t *txn) {
    kv_t *kv = ctx;
    const void *v;
    size_t n;
    int rc = ts_txn_get(txn, kv->db, kv->key, strlen(kv->key), &v, &n);
    if (rc)
        return rc;
    kv->out = malloc(n ? n : 1);
    if (!kv->out)
        return TS_ENOMEM;
    memcpy(kv->out, v, n);
    kv->out_len = n;
    return TS_OK;
}

static int put_str(ts_store_t *s, ts_db_t db, const char *key, const char *val) {
    kv_t kv = {.db = db, .key = key, .val = val, .vlen = strlen(val)};
    return ts_store_write(s, kv_write, &kv);
}

static int del_key(ts_store_t *s, ts_db_t db, const char *key) {
    kv_t kv = {.db = db, .key = key, .del = 1};
    return ts_store_write(s, kv_write, &kv);
}

/* Reads key as a string into buf (NUL-terminated); returns the store's code. */
static int get_str(ts_store_t *s, ts_db_t db, const char *key, char *buf, size_t len) {
    kv_t kv = {.db = db, .key = key};
    int rc = ts_store_read(s, kv_read, &kv);
    if (rc == TS_OK) {
        assert_true(kv.out_len < len);
        memcpy(buf, kv.out, kv.out_len);
        buf[kv.out_len] = '\0';
        free(kv.out);
    }
    return rc;
}

/* ---- environment ------------------------------------------------------------------------ */

static void test_open_close_reopen(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    assert_string_equal(ts_store_dir(s), t.dir);
    assert_true(ts_store_map_size(s) >= ((size_t)64 << 20));
    struct stat st;
    assert_int_equal(stat(t.dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    char parent[160];
    snprintf(parent, sizeof parent, "%s/a", t.root);
    assert_int_equal(stat(parent, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    CHECK_RC(put_str(s, TS_DB_PEERS, "k", "v1"), TS_OK);
    ts_store_close(s);

    s = open_store(t.dir, 0);
    char buf[32];
    CHECK_RC(get_str(s, TS_DB_PEERS, "k", buf, sizeof buf), TS_OK);
    assert_string_equal(buf, "v1");
    CHECK_RC(get_str(s, TS_DB_META, "schema", buf, sizeof buf), TS_OK);
    assert_string_equal(buf, "1");
    ts_store_close(s);

    /* read-only: reads work, writes are refused */
    ts_store_opts_t o = {.dir = t.dir, .readonly = 1};
    char err[256] = "";
    CHECK_RC(ts_store_open(&s, &o, err, sizeof err), TS_OK);
    CHECK_RC(get_str(s, TS_DB_PEERS, "k", buf, sizeof buf), TS_OK);
    assert_string_equal(buf, "v1");
    CHECK_RC(put_str(s, TS_DB_PEERS, "k", "v2"), TS_EINVAL);
    ts_store_close(s);

    /* read-only open of a directory that holds no store */
    snprintf(parent, sizeof parent, "%s/nothing-here", t.root);
    o.dir = parent;
    int rc = ts_store_open(&s, &o, err, sizeof err);
    assert_int_not_equal(rc, TS_OK);
    assert_null(s);
    assert_non_null(strstr(err, parent));
    ts_store_close(NULL);
    tmp_remove(&t);
}

static void test_default_dir(void **state) {
    (void)state;
    char buf[256];
    char *old_xdg = getenv("XDG_DATA_HOME") ? strdup(getenv("XDG_DATA_HOME")) : NULL;
    char *old_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    setenv("XDG_DATA_HOME", "/x/data", 1);
    CHECK_RC(ts_store_default_dir(buf, sizeof buf), TS_OK);
    assert_string_equal(buf, "/x/data/tessera");
    unsetenv("XDG_DATA_HOME");
    setenv("HOME", "/home/u", 1);
    CHECK_RC(ts_store_default_dir(buf, sizeof buf), TS_OK);
    assert_string_equal(buf, "/home/u/.local/share/tessera");
    CHECK_RC(ts_store_default_dir(buf, 4), TS_ERANGE);
    unsetenv("HOME");
    CHECK_RC(ts_store_default_dir(buf, sizeof buf), TS_EINVAL);
    if (old_xdg)
        setenv("XDG_DATA_HOME", old_xdg, 1);
    if (old_home)
        setenv("HOME", old_home, 1);
    free(old_xdg);
    free(old_home);
}

static void test_schema_mismatch_refused(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    CHECK_RC(put_str(s, TS_DB_META, "schema", "7"), TS_OK);
    ts_store_close(s);
    ts_store_opts_t o = {.dir = t.dir};
    char err[256] = "";
    s = (ts_store_t *)1;
    CHECK_RC(ts_store_open(&s, &o, err, sizeof err), TS_ENOTSUP);
    assert_null(s);
    assert_non_null(strstr(err, t.dir));
    assert_non_null(strstr(err, "schema version 7, this build reads 1"));
    tmp_remove(&t);
}

typedef struct {
    char keys[16][16];
    int n;
    int stop_after;
} seen_t;

static int collect(void *ctx, const void *key, size_t klen, const void *val, size_t vlen) {
    seen_t *sn = ctx;
    (void)val, (void)vlen;
    assert_true(klen < 16 && sn->n < 16);
    memcpy(sn->keys[sn->n], key, klen);
    sn->keys[sn->n][klen] = '\0';
    sn->n++;
    return sn->n == sn->stop_after ? TS_EEXIST : TS_OK;
}

typedef struct {
    const char *prefix;
    seen_t seen;
    uint64_t entries, bytes;
} scan_t;

static int scan(void *ctx, ts_store_txn_t *txn) {
    scan_t *sc = ctx;
    int rc = ts_txn_stat(txn, TS_DB_PEERS, &sc->entries, &sc->bytes);
    if (rc)
        return rc;
    size_t plen = sc->prefix ? strlen(sc->prefix) : 0;
    return ts_txn_foreach(txn, TS_DB_PEERS, sc->prefix, plen, collect, &sc->seen);
}

static void test_put_get_del_foreach_stat(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    const char *keys[] = {"b2", "a1", "b1", "c", "b"};
    for (int i = 0; i < 5; i++)
        CHECK_RC(put_str(s, TS_DB_PEERS, keys[i], "xyz"), TS_OK);
    CHECK_RC(put_str(s, TS_DB_PEERS, "c", "longer"), TS_OK); /* overwrite */
    char buf[32];
    CHECK_RC(get_str(s, TS_DB_PEERS, "c", buf, sizeof buf), TS_OK);
    assert_string_equal(buf, "longer");
    CHECK_RC(get_str(s, TS_DB_PEERS, "zz", buf, sizeof buf), TS_ENOTFOUND);
    CHECK_RC(get_str(s, TS_DB_CHUNKS, "c", buf, sizeof buf), TS_ENOTFOUND); /* other db */

    scan_t sc = {.prefix = NULL};
    CHECK_RC(ts_store_read(s, scan, &sc), TS_OK);
    assert_int_equal(sc.seen.n, 5);
    const char *order[] = {"a1", "b", "b1", "b2", "c"};
    for (int i = 0; i < 5; i++)
        assert_string_equal(sc.seen.keys[i], order[i]);
    assert_int_equal(sc.entries, 5);
    assert_int_equal(sc.bytes, (2 + 1 + 2 + 2 + 1) + 4 * 3 + 6);

    sc = (scan_t){.prefix = "b"};
    CHECK_RC(ts_store_read(s, scan, &sc), TS_OK);
    assert_int_equal(sc.seen.n, 3);
    assert_string_equal(sc.seen.keys[0], "b");
    assert_string_equal(sc.seen.keys[2], "b2");

    sc = (scan_t){.prefix = "b", .seen.stop_after = 2}; /* fn's code stops the walk */
    CHECK_RC(ts_store_read(s, scan, &sc), TS_EEXIST);
    assert_int_equal(sc.seen.n, 2);

    sc = (scan_t){.prefix = "d"};
    CHECK_RC(ts_store_read(s, scan, &sc), TS_OK);
    assert_int_equal(sc.seen.n, 0);

    CHECK_RC(del_key(s, TS_DB_PEERS, "b1"), TS_OK);
    CHECK_RC(del_key(s, TS_DB_PEERS, "b1"), TS_ENOTFOUND);
    CHECK_RC(get_str(s, TS_DB_PEERS, "b1", buf, sizeof buf), TS_ENOTFOUND);
    sc = (scan_t){.prefix = NULL};
    CHECK_RC(ts_store_read(s, scan, &sc), TS_OK);
    assert_int_equal(sc.entries, 4);

    /* argument errors */
    CHECK_RC(ts_store_write(s, NULL, NULL), TS_EINVAL);
    CHECK_RC(ts_store_read(NULL, scan, &sc), TS_EINVAL);
    CHECK_RC(put_str(s, TS_DB_PEERS, "", "v"), TS_EINVAL); /* LMDB has no empty keys */
    ts_store_close(s);
    tmp_remove(&t);
}

/* ---- writes: failure, restart, growth --------------------------------------------------- */

typedef struct {
    int calls;
    size_t big; /* bytes of the big value */
    int fail;   /* return this after writing */
} restart_t;

static int write_then_maybe_fail(void *ctx, ts_store_txn_t *txn) {
    restart_t *r = ctx;
    r->calls++;
    int rc = ts_txn_put(txn, TS_DB_CHUNKS, "small", 5, "s", 1);
    if (rc)
        return rc;
    void *p;
    rc = ts_txn_reserve(txn, TS_DB_CHUNKS, "big", 3, r->big, &p);
    if (rc)
        return rc;
    memset(p, 0xab, r->big);
    rc = ts_txn_put(txn, TS_DB_META, "calls", 5, &r->calls, sizeof r->calls);
    return rc ? rc : r->fail;
}

static void test_failed_write_leaves_nothing(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    restart_t r = {.big = 1000, .fail = TS_ECORRUPT};
    CHECK_RC(ts_store_write(s, write_then_maybe_fail, &r), TS_ECORRUPT);
    assert_int_equal(r.calls, 1);
    char buf[8];
    CHECK_RC(get_str(s, TS_DB_CHUNKS, "small", buf, sizeof buf), TS_ENOTFOUND);
    CHECK_RC(get_str(s, TS_DB_CHUNKS, "big", buf, sizeof buf), TS_ENOTFOUND);
    CHECK_RC(get_str(s, TS_DB_META, "calls", buf, sizeof buf), TS_ENOTFOUND);

    /* restarted after MAP_FULL: a 6 MiB value in a 1 MiB map; the result is one run's effect */
    ts_store_close(s);
    tmp_remove(&t);
    tmp_make(&t);
    s = open_store(t.dir, 1 << 20);
    r = (restart_t){.big = (size_t)6 << 20, .fail = TS_OK};
    CHECK_RC(ts_store_write(s, write_then_maybe_fail, &r), TS_OK);
    assert_true(r.calls >= 2);
    assert_true(ts_store_map_size(s) > ((size_t)6 << 20));
    kv_t kv = {.db = TS_DB_META, .key = "calls"};
    CHECK_RC(ts_store_read(s, kv_read, &kv), TS_OK);
    assert_int_equal(kv.out_len, sizeof(int));
    int stored;
    memcpy(&stored, kv.out, sizeof stored);
    assert_int_equal(stored, r.calls); /* the committed data are the last run's */
    free(kv.out);
    kv = (kv_t){.db = TS_DB_CHUNKS, .key = "big"};
    CHECK_RC(ts_store_read(s, kv_read, &kv), TS_OK);
    assert_int_equal(kv.out_len, r.big);
    assert_int_equal(((unsigned char *)kv.out)[r.big - 1], 0xab);
    free(kv.out);
    ts_store_close(s);
    tmp_remove(&t);
}

typedef struct {
    int i;
    size_t len;
} blob_t;

static int put_blob(void *ctx, ts_store_txn_t *txn) {
    blob_t *b = ctx;
    char key[16];
    snprintf(key, sizeof key, "v%04d", b->i);
    void *p;
    int rc = ts_txn_reserve(txn, TS_DB_CHUNKS, key, strlen(key), b->len, &p);
    if (rc == TS_OK)
        memset(p, b->i & 0xff, b->len);
    return rc;
}

static int count_chunks(void *ctx, ts_store_txn_t *txn) {
    uint64_t *v = ctx;
    return ts_txn_stat(txn, TS_DB_CHUNKS, &v[0], &v[1]);
}

static void test_map_grows(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 1 << 20);
    size_t initial = ts_store_map_size(s);
    assert_true(initial <= ((size_t)2 << 20));
    /* 50 MiB: 48 values of 1 MiB in their own transactions, then one of 2 MiB */
    for (int i = 0; i < 48; i++) {
        blob_t b = {i, (size_t)1 << 20};
        CHECK_RC(ts_store_write(s, put_blob, &b), TS_OK);
    }
    blob_t b = {48, (size_t)2 << 20};
    CHECK_RC(ts_store_write(s, put_blob, &b), TS_OK);
    size_t grown = ts_store_map_size(s);
    assert_true(grown >= ((size_t)50 << 20));
    uint64_t v[2];
    CHECK_RC(ts_store_read(s, count_chunks, v), TS_OK);
    assert_int_equal(v[0], 49);
    assert_int_equal(v[1], (uint64_t)50 * (1 << 20) + 49 * 5);
    ts_store_close(s);
    /* the grown size is in the file: a reopen with a smaller request keeps it */
    s = open_store(t.dir, 1 << 20);
    assert_true(ts_store_map_size(s) >= ((size_t)50 << 20));
    kv_t kv = {.db = TS_DB_CHUNKS, .key = "v0047"};
    CHECK_RC(ts_store_read(s, kv_read, &kv), TS_OK);
    assert_int_equal(kv.out_len, 1 << 20);
    assert_int_equal(((unsigned char *)kv.out)[12345], 47);
    free(kv.out);
    ts_store_close(s);

    /* a maximum the data cannot fit in: TS_ENOSPC, and the store is unchanged */
    ts_store_opts_t o = {.dir = t.dir, .map_size = 1 << 20, .map_max = (size_t)64 << 20};
    char err[256];
    CHECK_RC(ts_store_open(&s, &o, err, sizeof err), TS_OK);
    b = (blob_t){999, (size_t)100 << 20};
    CHECK_RC(ts_store_write(s, put_blob, &b), TS_ENOSPC);
    CHECK_RC(ts_store_read(s, count_chunks, v), TS_OK);
    assert_int_equal(v[0], 49);
    ts_store_close(s);
    tmp_remove(&t);
}

/* ---- concurrency ------------------------------------------------------------------------ */

/* The writer keeps keys "x" and "y" equal (and increasing) in every transaction, adding a
 * growing ballast value so the map grows under the readers; a reader must never see x ≠ y. */
typedef struct {
    ts_store_t *s;
    volatile int done;
    int reads, bad;
} conc_t;

typedef struct {
    uint32_t n;
} counter_t;

static int bump(void *ctx, ts_store_txn_t *txn) {
    counter_t *c = ctx;
    int rc = ts_txn_put(txn, TS_DB_META, "x", 1, &c->n, sizeof c->n);
    void *p;
    char key[16];
    snprintf(key, sizeof key, "ballast%u", c->n);
    if (rc == TS_OK)
        rc = ts_txn_reserve(txn, TS_DB_CHUNKS, key, strlen(key), 256 << 10, &p);
    if (rc == TS_OK)
        memset(p, 1, 256 << 10);
    if (rc == TS_OK)
        rc = ts_txn_put(txn, TS_DB_META, "y", 1, &c->n, sizeof c->n);
    return rc;
}

static int check_xy(void *ctx, ts_store_txn_t *txn) {
    conc_t *c = ctx;
    const void *x, *y;
    size_t nx, ny;
    int rx = ts_txn_get(txn, TS_DB_META, "x", 1, &x, &nx);
    int ry = ts_txn_get(txn, TS_DB_META, "y", 1, &y, &ny);
    if (rx != ry || (rx == TS_OK && (nx != ny || memcmp(x, y, nx) != 0)))
        c->bad++;
    return TS_OK;
}

static void *reader(void *arg) {
    conc_t *c = arg;
    while (!c->done) {
        if (ts_store_read(c->s, check_xy, c) != TS_OK)
            c->bad++;
        c->reads++;
    }
    return NULL;
}

static void test_readers_concurrent_with_writer(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    conc_t c[2] = {{.s = open_store(t.dir, 1 << 20)}};
    c[1].s = c[0].s;
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader, &c[i]), 0);
    for (uint32_t n = 1; n <= 100; n++) {
        counter_t k = {n};
        CHECK_RC(ts_store_write(c[0].s, bump, &k), TS_OK);
    }
    c[0].done = c[1].done = 1;
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(c[0].bad + c[1].bad, 0);
    assert_true(c[0].reads > 0 && c[1].reads > 0);
    assert_true(ts_store_map_size(c[0].s) >= ((size_t)25 << 20)); /* grew under the readers */
    ts_store_close(c[0].s);
    tmp_remove(&t);
}

/* Another process grows the map: this one adopts the size (MDB_MAP_RESIZED) and goes on. */
static void test_map_resized_by_other_process(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 1 << 20);
    CHECK_RC(put_str(s, TS_DB_PEERS, "before", "1"), TS_OK);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the child must not touch the parent's environment: it opens its own */
        ts_store_opts_t o = {.dir = t.dir, .map_size = 1 << 20};
        ts_store_t *cs = NULL;
        if (ts_store_open(&cs, &o, NULL, 0) != TS_OK)
            _exit(1);
        for (int i = 0; i < 12; i++) {
            blob_t b = {i, (size_t)1 << 20};
            if (ts_store_write(cs, put_blob, &b) != TS_OK)
                _exit(2);
        }
        _exit(0); /* no close: the parent's lock file state stays as it is */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char buf[8];
    CHECK_RC(get_str(s, TS_DB_PEERS, "before", buf, sizeof buf), TS_OK);
    uint64_t v[2];
    CHECK_RC(ts_store_read(s, count_chunks, v), TS_OK);
    assert_int_equal(v[0], 12);
    CHECK_RC(put_str(s, TS_DB_PEERS, "after", "2"), TS_OK);
    assert_true(ts_store_map_size(s) >= ((size_t)12 << 20));
    ts_store_close(s);
    tmp_remove(&t);
}

/* The disk fills up: a child process whose files may not grow past 3 MiB (RLIMIT_FSIZE: a
 * write() stops short, or fails with EFBIG, as on a full disk) writes 256 KiB values until the
 * store refuses with TS_ENOSPC or TS_EIO (LMDB reports a short write as EIO). The parent then
 * opens the store and finds every value the child saw committed, intact, and nothing else. */
static void test_disk_full_is_an_error_not_corruption(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {(rlim_t)3 << 20, (rlim_t)3 << 20};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(10);
        ts_store_opts_t o = {.dir = t.dir, .map_size = (size_t)64 << 20};
        ts_store_t *cs = NULL;
        if (ts_store_open(&cs, &o, NULL, 0) != TS_OK)
            _exit(11);
        for (int i = 0; i < 100; i++) {
            blob_t b = {i, (size_t)256 << 10};
            int rc = ts_store_write(cs, put_blob, &b);
            if (rc == TS_ENOSPC || rc == TS_EIO)
                _exit(i >= 2 && i < 20 ? 100 + i : 12); /* how many were committed */
            if (rc != TS_OK) {
                fprintf(stderr, "write %d: %s\n", i, ts_strerror(rc));
                _exit(13);
            }
        }
        _exit(14);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    int code = WEXITSTATUS(status);
    if (code < 100)
        print_error("child exit %d\n", code);
    assert_true(code >= 100);
    int committed = code - 100;
    ts_store_t *s = open_store(t.dir, 0);
    uint64_t v[2];
    CHECK_RC(ts_store_read(s, count_chunks, v), TS_OK);
    assert_int_equal(v[0], committed);
    for (int i = 0; i < committed; i++) {
        char key[16];
        snprintf(key, sizeof key, "v%04d", i);
        kv_t kv = {.db = TS_DB_CHUNKS, .key = key};
        CHECK_RC(ts_store_read(s, kv_read, &kv), TS_OK);
        assert_int_equal(kv.out_len, 256 << 10);
        const unsigned char *p = kv.out;
        for (size_t k = 0; k < kv.out_len; k += 4096)
            assert_int_equal(p[k], i);
        free(kv.out);
    }
    /* and the store takes writes again once there is room */
    blob_t b = {committed, 1000};
    CHECK_RC(ts_store_write(s, put_blob, &b), TS_OK);
    ts_store_close(s);
    tmp_remove(&t);
}

/* ---- checkpoints ----------------------------------------------------------------------- */

typedef struct {
    char runs[32][16];
    int64_t steps[32];
    size_t lens[32];
    int n;
} ckpts_t;

static int note_ckpt(void *ctx, const char *run_id, int64_t step, size_t len) {
    ckpts_t *c = ctx;
    assert_true(c->n < 32 && strlen(run_id) < 16);
    strcpy(c->runs[c->n], run_id);
    c->steps[c->n] = step;
    c->lens[c->n] = len;
    c->n++;
    return TS_OK;
}

static ckpts_t list_run(ts_store_t *s, const char *run) {
    ckpts_t c = {.n = 0};
    CHECK_RC(ts_ckpt_list(s, run, note_ckpt, &c), TS_OK);
    return c;
}

static void test_ckpt_keep_last_and_latest(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 1 << 20);
    char blob[64];
    for (int64_t step = 1; step <= 7; step++) {
        int n = snprintf(blob, sizeof blob, "run step %lld", (long long)step);
        CHECK_RC(ts_ckpt_save(s, "run", step * 100, blob, (size_t)n, 3), TS_OK);
        /* a run whose name extends "run" must not be confused with it */
        CHECK_RC(ts_ckpt_save(s, "runner", step, "x", 1, 0), TS_OK);
    }
    ckpts_t c = list_run(s, "run");
    assert_int_equal(c.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(c.runs[i], "run");
        assert_int_equal(c.steps[i], (i + 5) * 100);
    }
    assert_int_equal(list_run(s, "runner").n, 7); /* keep 0: all */
    assert_int_equal(list_run(s, NULL).n, 10);
    assert_string_equal(list_run(s, NULL).runs[0], "run"); /* "run\0…" sorts first */

    int64_t step = -1;
    unsigned char *got = NULL;
    size_t len = 0;
    CHECK_RC(ts_ckpt_latest(s, "run", &step, &got, &len), TS_OK);
    assert_int_equal(step, 700);
    assert_int_equal(len, strlen("run step 7"));
    assert_memory_equal(got, "run step 7", len);
    free(got);
    CHECK_RC(ts_ckpt_latest(s, "ru", &step, &got, &len), TS_ENOTFOUND);
    assert_null(got);

    /* a checkpoint at an earlier step supersedes the later ones (a run started over) */
    CHECK_RC(ts_ckpt_save(s, "run", 300, "again", 5, 3), TS_OK);
    c = list_run(s, "run");
    assert_int_equal(c.n, 1);
    assert_int_equal(c.steps[0], 300);
    CHECK_RC(ts_ckpt_save(s, "run", 300, "again!", 6, 3), TS_OK); /* same step: replaced */
    c = list_run(s, "run");
    assert_int_equal(c.n, 1);
    assert_int_equal(c.lens[0], 6);

    /* a big checkpoint grows the 1 MiB map in one transaction */
    size_t big = (size_t)24 << 20;
    unsigned char *b = malloc(big);
    assert_non_null(b);
    for (size_t i = 0; i < big; i++)
        b[i] = (unsigned char)(i * 7);
    CHECK_RC(ts_ckpt_save(s, "big", 5, b, big, 1), TS_OK);
    CHECK_RC(ts_ckpt_latest(s, "big", &step, &got, &len), TS_OK);
    assert_int_equal(len, big);
    assert_memory_equal(got, b, big);
    free(got);
    free(b);

    int removed = -1;
    CHECK_RC(ts_ckpt_drop(s, "runner", &removed), TS_OK);
    assert_int_equal(removed, 7);
    assert_int_equal(list_run(s, "runner").n, 0);
    assert_int_equal(list_run(s, "run").n, 1);

    /* argument checks */
    char longname[TS_CKPT_RUN_MAX + 2];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    CHECK_RC(ts_ckpt_save(s, longname, 1, "x", 1, 3), TS_EINVAL);
    CHECK_RC(ts_ckpt_save(s, "", 1, "x", 1, 3), TS_EINVAL);
    CHECK_RC(ts_ckpt_save(s, "run", -1, "x", 1, 3), TS_EINVAL);
    CHECK_RC(ts_ckpt_save(s, "run", 1, "x", 1, -1), TS_EINVAL);
    CHECK_RC(ts_ckpt_latest(s, NULL, &step, &got, &len), TS_EINVAL);
    ts_store_close(s);
    tmp_remove(&t);
}

/* A small trainer (as in test_trainer.c): an 8×8 DiT on a synthetic data set. */
typedef struct {
    ts_engine_t eng;
    ts_dataset_t data;
    ts_dit_t model;
    ts_trainer_t tr;
} run_t;

static void run_start(run_t *r, uint64_t seed) {
    memset(r, 0, sizeof *r);
    ts_engine_opts_t eo = {TS_CPU, 1, 0};
    assert_int_equal(ts_engine_init(&r->eng, &eo), TS_OK);
    ts_dit_config_t c = {.input_size = 8,
                         .in_channels = 1,
                         .patch_size = 2,
                         .hidden_size = 32,
                         .depth = 2,
                         .num_heads = 2,
                         .num_classes = 3,
                         .mlp_ratio = 4,
                         .freq_dim = 16};
    ts_dataset_t *d = &r->data;
    d->n = 24, d->channels = 1, d->height = 8, d->width = 8, d->num_classes = 3;
    d->images = malloc((size_t)d->n * 64 * sizeof(float));
    d->labels = malloc((size_t)d->n * sizeof(int32_t));
    assert_non_null(d->images);
    assert_non_null(d->labels);
    for (int i = 0; i < d->n; i++) {
        d->labels[i] = i % 3;
        for (int p = 0; p < 64; p++)
            d->images[i * 64 + p] = ts_rng_normal_at(7, (uint64_t)(i * 64 + p));
    }
    assert_int_equal(ts_dit_create(&r->model, &c, &r->eng, 4, 1), TS_OK);
    assert_int_equal(ts_dit_init_weights(&r->model, seed), TS_OK);
    ts_train_config_t tc;
    ts_train_config_default(&tc);
    tc.batch = 4, tc.lr = 3e-3f, tc.warmup = 2, tc.seed = seed;
    assert_int_equal(ts_trainer_init(&r->tr, &r->model, &r->data, &tc), TS_OK);
}

static void run_end(run_t *r) {
    ts_trainer_free(&r->tr);
    ts_dit_free(&r->model);
    ts_dataset_free(&r->data);
    ts_engine_free(&r->eng);
}

/* All four slabs, concatenated, as a snapshot to compare against. */
static float *snapshot(run_t *r) {
    size_t n = ts_tensor_nbytes(&r->model.param_mem);
    unsigned char *out = malloc(4 * n);
    assert_non_null(out);
    const ts_tensor_t *slabs[4] = {&r->model.param_mem, &r->tr.m_mem, &r->tr.v_mem, &r->tr.ema_mem};
    for (int i = 0; i < 4; i++)
        memcpy(out + (size_t)i * n, slabs[i]->data, n);
    return (float *)out;
}

static void assert_slabs(run_t *r, const float *snap) {
    float *now = snapshot(r);
    assert_memory_equal(now, snap, 4 * ts_tensor_nbytes(&r->model.param_mem));
    free(now);
}

static void test_trainer_checkpoint_in_store(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    run_t a, b;
    run_start(&a, 9);
    float loss;
    for (int i = 0; i < 5; i++)
        CHECK_RC(ts_trainer_step(&a.tr, &loss, NULL), TS_OK);
    char err[512] = "";
    unsigned char *blob = NULL;
    size_t len = 0;
    CHECK_RC(ts_trainer_save_mem(&a.tr, &blob, &len, err, sizeof err), TS_OK);

    /* the bytes are those of the file checkpoint (one encoder) */
    char path[160];
    snprintf(path, sizeof path, "%s/a.ckpt", t.root);
    CHECK_RC(ts_trainer_save(&a.tr, path, err, sizeof err), TS_OK);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    unsigned char *file = malloc(len + 1);
    assert_non_null(file);
    assert_int_equal(fread(file, 1, len + 1, fp), len);
    fclose(fp);
    assert_memory_equal(file, blob, len);
    free(file);

    /* through the store and back into a fresh trainer: the same state, the same next steps */
    CHECK_RC(ts_ckpt_save(s, "unit", a.tr.step, blob, len, 2), TS_OK);
    free(blob);
    int64_t step;
    CHECK_RC(ts_ckpt_latest(s, "unit", &step, &blob, &len), TS_OK);
    assert_int_equal(step, 5);
    run_start(&b, 9);
    CHECK_RC(ts_trainer_load_mem(&b.tr, blob, len, err, sizeof err), TS_OK);
    assert_int_equal(b.tr.step, 5);
    float *sa = snapshot(&a);
    assert_slabs(&b, sa);
    free(sa);
    float la, lb;
    CHECK_RC(ts_trainer_step(&a.tr, &la, NULL), TS_OK);
    CHECK_RC(ts_trainer_step(&b.tr, &lb, NULL), TS_OK);
    assert_memory_equal(&la, &lb, sizeof la);

    /* corrupt blobs are refused, and the trainer is untouched */
    float *sb = snapshot(&b);
    int64_t bstep = b.tr.step;
    unsigned char *bad = malloc(len);
    assert_non_null(bad);
    size_t cuts[] = {0, 7, 8, 100, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        err[0] = '\0';
        assert_int_not_equal(ts_trainer_load_mem(&b.tr, blob, cuts[i], err, sizeof err), TS_OK);
        assert_true(err[0] != '\0');
    }
    memcpy(bad, blob, len);
    bad[10] ^= 0x5a; /* inside the JSON header */
    assert_int_not_equal(ts_trainer_load_mem(&b.tr, bad, len, err, sizeof err), TS_OK);
    assert_slabs(&b, sb);
    assert_int_equal(b.tr.step, bstep);

    /* a well-formed checkpoint of another run (seed) names the key that differs */
    run_t c;
    run_start(&c, 10);
    unsigned char *other;
    size_t olen;
    CHECK_RC(ts_trainer_save_mem(&c.tr, &other, &olen, err, sizeof err), TS_OK);
    CHECK_RC(ts_trainer_load_mem(&b.tr, other, olen, err, sizeof err), TS_EINVAL);
    assert_non_null(strstr(err, "seed is 10 but this run has 9"));
    free(other);
    run_end(&c);

    /* params, adam_m, adam_v fine but ema of the wrong size: nothing may have been loaded */
    int64_t n = a.model.num_params;
    float *zeros = calloc((size_t)n, sizeof(float));
    assert_non_null(zeros);
    ts_st_entry_t e[4] = {
        {.name = "params", .dtype = TS_ST_F32, .ndim = 1, .shape = {n}, .data = zeros},
        {.name = "adam_m", .dtype = TS_ST_F32, .ndim = 1, .shape = {n}, .data = zeros},
        {.name = "adam_v", .dtype = TS_ST_F32, .ndim = 1, .shape = {n}, .data = zeros},
        {.name = "ema", .dtype = TS_ST_F32, .ndim = 1, .shape = {n - 1}, .data = zeros},
    };
    char model[64];
    const ts_dit_config_t *mc = &b.model.cfg;
    snprintf(model, sizeof model, "%d/%d/%d/%d/%d/%d/%d/%d/%d", mc->input_size, mc->in_channels,
             mc->patch_size, mc->hidden_size, mc->depth, mc->num_heads, mc->num_classes,
             mc->mlp_ratio, mc->freq_dim);
    const char *meta[] = {"step", "3",         "seed", "9",     "batch",
                          "4",    "data_size", "24",   "model", model};
    unsigned char *hand;
    size_t hlen;
    CHECK_RC(ts_st_serialize(e, 4, meta, 5, &hand, &hlen, err, sizeof err), TS_OK);
    CHECK_RC(ts_trainer_load_mem(&b.tr, hand, hlen, err, sizeof err), TS_ECORRUPT);
    assert_non_null(strstr(err, "ema"));
    assert_slabs(&b, sb);
    assert_int_equal(b.tr.step, bstep);
    /* the same with every tensor right loads (the check above was the size, nothing else) */
    e[3].shape[0] = n;
    free(hand);
    CHECK_RC(ts_st_serialize(e, 4, meta, 5, &hand, &hlen, err, sizeof err), TS_OK);
    CHECK_RC(ts_trainer_load_mem(&b.tr, hand, hlen, err, sizeof err), TS_OK);
    assert_int_equal(b.tr.step, 3);
    free(hand);
    free(zeros);
    free(bad);
    free(sb);
    free(blob);
    run_end(&a);
    run_end(&b);
    ts_store_close(s);
    tmp_remove(&t);
}

/* ---- the address book ------------------------------------------------------------------- */

static ts_peer_t make_peer(uint8_t tag, int n_addrs, int64_t seen) {
    ts_peer_t p;
    memset(&p, 0, sizeof p);
    memset(p.id, tag, sizeof p.id);
    p.id[31] = (uint8_t)(tag + 1);
    p.n_addrs = n_addrs;
    for (int i = 0; i < n_addrs; i++)
        snprintf(p.addrs[i], sizeof p.addrs[i], i % 2 ? "[2001:db8::%d]:%d" : "10.0.0.%d:%d", i + 1,
                 7000 + tag);
    p.last_seen = seen;
    p.flags = 0x80000001u | tag;
    return p;
}

static int count_peers(void *ctx, const ts_peer_t *p) {
    (void)p;
    (*(int *)ctx)++;
    return TS_OK;
}

static void test_peers_round_trip(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    ts_peer_t a = make_peer(1, 2, 1700000000), b = make_peer(2, 0, -5), c = make_peer(3, 8, 99);
    /* a full-length address */
    memset(c.addrs[7], 'h', TS_PEER_ADDR_MAX - 6);
    memcpy(c.addrs[7] + TS_PEER_ADDR_MAX - 6, ":65535", 7);
    assert_int_equal(strlen(c.addrs[7]), TS_PEER_ADDR_MAX);
    CHECK_RC(ts_peers_put(s, &a), TS_OK);
    CHECK_RC(ts_peers_put(s, &b), TS_OK);
    CHECK_RC(ts_peers_put(s, &c), TS_OK);
    ts_peer_t got;
    CHECK_RC(ts_peers_get(s, c.id, &got), TS_OK);
    assert_memory_equal(&got, &c, sizeof got);
    CHECK_RC(ts_peers_get(s, b.id, &got), TS_OK);
    assert_int_equal(got.last_seen, -5);
    assert_int_equal(got.n_addrs, 0);
    CHECK_RC(ts_peers_get(s, a.id, &got), TS_OK);
    assert_string_equal(got.addrs[1], "[2001:db8::2]:7001");
    assert_int_equal(got.flags, 0x80000001u);
    int n = 0;
    CHECK_RC(ts_peers_list(s, count_peers, &n), TS_OK);
    assert_int_equal(n, 3);

    /* update, delete */
    a.last_seen = 1800000000;
    CHECK_RC(ts_peers_put(s, &a), TS_OK);
    CHECK_RC(ts_peers_get(s, a.id, &got), TS_OK);
    assert_int_equal(got.last_seen, 1800000000);
    CHECK_RC(ts_peers_del(s, b.id), TS_OK);
    CHECK_RC(ts_peers_del(s, b.id), TS_ENOTFOUND);
    CHECK_RC(ts_peers_get(s, b.id, &got), TS_ENOTFOUND);

    /* entries that cannot be encoded */
    ts_peer_t bad = make_peer(4, 1, 0);
    const char *bad_addrs[] = {"",      "host", "host:",  ":80",     "host:0",     "host:65536",
                               "a b:1", "h:1x", "::1:80", "[::1:80", "host:123456"};
    for (size_t i = 0; i < sizeof bad_addrs / sizeof bad_addrs[0]; i++) {
        snprintf(bad.addrs[0], sizeof bad.addrs[0], "%s", bad_addrs[i]);
        CHECK_RC(ts_peers_put(s, &bad), TS_EINVAL);
    }
    bad.n_addrs = TS_PEER_MAX_ADDRS + 1;
    CHECK_RC(ts_peers_put(s, &bad), TS_EINVAL);
    memset(bad.addrs[0], 'x', sizeof bad.addrs[0]); /* not terminated within 255 bytes */
    bad.n_addrs = 1;
    CHECK_RC(ts_peers_put(s, &bad), TS_EINVAL);

    /* prune: entries last seen before the cut go */
    int removed = -1;
    CHECK_RC(ts_peers_prune(s, 1000, &removed), TS_OK);
    assert_int_equal(removed, 1); /* c, seen at 99 */
    CHECK_RC(ts_peers_get(s, c.id, &got), TS_ENOTFOUND);
    CHECK_RC(ts_peers_get(s, a.id, &got), TS_OK);
    ts_store_close(s);
    tmp_remove(&t);
}

typedef struct {
    const uint8_t *id;
    const void *val;
    size_t len;
} raw_t;

static int put_raw(void *ctx, ts_store_txn_t *txn) {
    raw_t *r = ctx;
    return ts_txn_put(txn, TS_DB_PEERS, r->id, TS_PEER_ID_LEN, r->val, r->len);
}

static void test_peers_corrupt_entry(void **state) {
    (void)state;
    ts_peer_t p = make_peer(5, 3, 123456789);
    unsigned char buf[TS_PEER_ENCODED_MAX], copy[TS_PEER_ENCODED_MAX];
    size_t len;
    CHECK_RC(ts_peer_encode(&p, buf, &len), TS_OK);
    ts_peer_t got;
    CHECK_RC(ts_peer_decode(p.id, buf, len, &got), TS_OK);
    assert_memory_equal(&got, &p, sizeof got);
    /* every truncation and every extension is refused */
    for (size_t cut = 0; cut < len; cut++)
        CHECK_RC(ts_peer_decode(p.id, buf, cut, &got), TS_ECORRUPT);
    memcpy(copy, buf, len);
    copy[len] = 0;
    CHECK_RC(ts_peer_decode(p.id, copy, len + 1, &got), TS_ECORRUPT);
    /* a version, a count and a length out of range */
    memcpy(copy, buf, len);
    copy[0] = 2;
    CHECK_RC(ts_peer_decode(p.id, copy, len, &got), TS_ECORRUPT);
    memcpy(copy, buf, len);
    copy[13] = 9;
    CHECK_RC(ts_peer_decode(p.id, copy, len, &got), TS_ECORRUPT);
    memcpy(copy, buf, len);
    copy[14] = 0xff;
    CHECK_RC(ts_peer_decode(p.id, copy, len, &got), TS_ECORRUPT);
    /* every single-byte change decodes to a valid entry or is refused: never a crash */
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(copy, buf, len);
            copy[i] ^= (unsigned char)(1 << bit);
            int rc = ts_peer_decode(p.id, copy, len, &got);
            assert_true(rc == TS_OK || rc == TS_ECORRUPT);
            if (rc == TS_OK)
                for (int k = 0; k < got.n_addrs; k++)
                    assert_true(strlen(got.addrs[k]) <= TS_PEER_ADDR_MAX);
        }

    /* in the store: get and list report it, prune removes it */
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    ts_peer_t ok = make_peer(6, 1, 5000);
    CHECK_RC(ts_peers_put(s, &ok), TS_OK);
    raw_t r = {p.id, buf, len - 3};
    CHECK_RC(ts_store_write(s, put_raw, &r), TS_OK);
    CHECK_RC(ts_peers_get(s, p.id, &got), TS_ECORRUPT);
    int n = 0;
    CHECK_RC(ts_peers_list(s, count_peers, &n), TS_ECORRUPT);
    int removed = 0;
    CHECK_RC(ts_peers_prune(s, 0, &removed), TS_OK);
    assert_int_equal(removed, 1);
    n = 0;
    CHECK_RC(ts_peers_list(s, count_peers, &n), TS_OK);
    assert_int_equal(n, 1);
    ts_store_close(s);
    tmp_remove(&t);
}

/* ---- vouches ---------------------------------------------------------------------------- */

static ts_vouch_t vouch_of(uint8_t node, uint8_t weights, const char *cls, uint8_t prec,
                           int64_t when) {
    ts_vouch_t v = {.precision = prec, .when = when};
    memset(v.node, node, sizeof v.node);
    memset(v.weights, weights, sizeof v.weights);
    snprintf(v.device_class, sizeof v.device_class, "%s", cls);
    return v;
}

/* Put, get within and past the time to live, a clock that moved back, refresh, forget one node
 * (every expert of it, no other node's), and the values refused at put. */
static void test_vouch_round_trip(void **state) {
    (void)state;
    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    const int64_t now = 1800000000;
    ts_vouch_t a = vouch_of(1, 7, "cpu-avx512", 1, now - 100), b = vouch_of(1, 8, "cpu", 9, now),
               c = vouch_of(2, 7, "cuda-sm90", 9, now), got;
    CHECK_RC(ts_vouch_put(s, &a), TS_OK);
    CHECK_RC(ts_vouch_put(s, &b), TS_OK);
    CHECK_RC(ts_vouch_put(s, &c), TS_OK);
    CHECK_RC(ts_vouch_get(s, a.node, a.weights, 3600, now, &got), TS_OK);
    assert_string_equal(got.device_class, "cpu-avx512");
    assert_int_equal(got.precision, 1);
    assert_int_equal(got.when, now - 100);
    assert_memory_equal(got.node, a.node, sizeof a.node);
    assert_memory_equal(got.weights, a.weights, sizeof a.weights);
    /* past its time to live, a ttl of 0, unknown weights, from the future */
    CHECK_RC(ts_vouch_get(s, a.node, a.weights, 99, now, &got), TS_ENOTFOUND);
    CHECK_RC(ts_vouch_get(s, a.node, a.weights, 0, now, &got), TS_ENOTFOUND);
    uint8_t other[32];
    memset(other, 9, sizeof other);
    CHECK_RC(ts_vouch_get(s, a.node, other, 3600, now, &got), TS_ENOTFOUND);
    CHECK_RC(ts_vouch_get(s, a.node, a.weights, 3600, now - 1000, &got), TS_ENOTFOUND);
    /* a refresh moves the time */
    a.when = now;
    CHECK_RC(ts_vouch_put(s, &a), TS_OK);
    CHECK_RC(ts_vouch_get(s, a.node, a.weights, 99, now, &got), TS_OK);
    /* node 1 caught lying: both of its vouches go, node 2's stays */
    int n = -1;
    CHECK_RC(ts_vouch_forget(s, a.node, &n), TS_OK);
    assert_int_equal(n, 2);
    CHECK_RC(ts_vouch_get(s, a.node, a.weights, 3600, now, &got), TS_ENOTFOUND);
    CHECK_RC(ts_vouch_get(s, b.node, b.weights, 3600, now, &got), TS_ENOTFOUND);
    CHECK_RC(ts_vouch_get(s, c.node, c.weights, 3600, now, &got), TS_OK);
    CHECK_RC(ts_vouch_forget(s, a.node, &n), TS_OK);
    assert_int_equal(n, 0);
    /* refused: no class, a class too long, precision 0 */
    ts_vouch_t bad = vouch_of(3, 3, "", 1, now);
    CHECK_RC(ts_vouch_put(s, &bad), TS_EINVAL);
    bad = vouch_of(3, 3, "x", 0, now);
    CHECK_RC(ts_vouch_put(s, &bad), TS_EINVAL);
    memset(bad.device_class, 'a', sizeof bad.device_class);
    bad.precision = 1;
    CHECK_RC(ts_vouch_put(s, &bad), TS_EINVAL);
    ts_store_close(s);
    tmp_remove(&t);
}

static int put_meta_raw(void *ctx, ts_store_txn_t *txn) {
    raw_t *r = ctx;
    return ts_txn_put(txn, TS_DB_META, r->id, 6 + 64, r->val, r->len);
}

/* The encoding: round trip, every truncation and extension refused, and a value that does not
 * decode in the store reads as no vouch (the next put overwrites it). */
static void test_vouch_encoding(void **state) {
    (void)state;
    ts_vouch_t v = vouch_of(4, 5, "cuda-sm80", 10, -5), w;
    uint8_t buf[TS_VOUCH_VALUE_MAX + 1];
    int n = ts_vouch_encode(&v, buf);
    assert_int_equal(n, 11 + 9);
    CHECK_RC(ts_vouch_decode(buf, (size_t)n, &w), TS_OK);
    assert_string_equal(w.device_class, "cuda-sm80");
    assert_int_equal(w.when, -5);
    assert_int_equal(w.precision, 10);
    for (int len = 0; len < n; len++)
        CHECK_RC(ts_vouch_decode(buf, (size_t)len, &w), TS_ECORRUPT);
    buf[n] = 'x';
    CHECK_RC(ts_vouch_decode(buf, (size_t)n + 1, &w), TS_ECORRUPT);
    uint8_t bad[32];
    memcpy(bad, buf, (size_t)n);
    bad[0] = 2; /* another version */
    CHECK_RC(ts_vouch_decode(bad, (size_t)n, &w), TS_ECORRUPT);
    memcpy(bad, buf, (size_t)n);
    bad[1] = 0; /* no precision */
    CHECK_RC(ts_vouch_decode(bad, (size_t)n, &w), TS_ECORRUPT);
    memcpy(bad, buf, (size_t)n);
    bad[13] = '\0'; /* a NUL inside the class */
    CHECK_RC(ts_vouch_decode(bad, (size_t)n, &w), TS_ECORRUPT);

    tmp_t t;
    tmp_make(&t);
    ts_store_t *s = open_store(t.dir, 0);
    uint8_t key[6 + 64];
    memcpy(key, "vouch/", 6);
    memcpy(key + 6, v.node, 32);
    memcpy(key + 38, v.weights, 32);
    raw_t raw = {key, bad, (size_t)n}; /* the key: "vouch/" + node + weights */
    CHECK_RC(ts_store_write(s, put_meta_raw, &raw), TS_OK);
    v.when = 1800000000;
    CHECK_RC(ts_vouch_get(s, v.node, v.weights, 3600, v.when, &w), TS_ENOTFOUND);
    CHECK_RC(ts_vouch_put(s, &v), TS_OK);
    CHECK_RC(ts_vouch_get(s, v.node, v.weights, 3600, v.when, &w), TS_OK);
    ts_store_close(s);
    tmp_remove(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_close_reopen),
        cmocka_unit_test(test_default_dir),
        cmocka_unit_test(test_schema_mismatch_refused),
        cmocka_unit_test(test_put_get_del_foreach_stat),
        cmocka_unit_test(test_failed_write_leaves_nothing),
        cmocka_unit_test(test_map_grows),
        cmocka_unit_test(test_readers_concurrent_with_writer),
        cmocka_unit_test(test_map_resized_by_other_process),
        cmocka_unit_test(test_disk_full_is_an_error_not_corruption),
        cmocka_unit_test(test_ckpt_keep_last_and_latest),
        cmocka_unit_test(test_trainer_checkpoint_in_store),
        cmocka_unit_test(test_peers_round_trip),
        cmocka_unit_test(test_peers_corrupt_entry),
        cmocka_unit_test(test_vouch_round_trip),
        cmocka_unit_test(test_vouch_encoding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
