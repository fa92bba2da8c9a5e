/*
 * test_weights.c — expert weights as content-addressed chunks in the store (store/weights.h).
 *
 * Every test gets a fresh store whose map starts at 1 MiB, so the imports below (up to ~4 MiB)
 * also grow the map. Files are made with the public writers: a `tiny` DiT with every parameter
 * random (ts_dit_save; ~4.3 MiB, 5 chunks, no two chunks alike) and small files of U8 tensors
 * (ts_st_write) whose bytes are chosen so that chunks repeat where a test wants them to.
 *
 *   - hashes: BLAKE2b-256 test vectors, hex round trip, malformed hex refused;
 *   - round trip: import → export and load give the identical bytes, for the DiT, a file smaller
 *     than one chunk and a file with no data at all; the weights hash is BLAKE2b-256 of the file;
 *     open_dit gives bit-identical parameters and counts as a use; the manifest's info
 *     (tensors, metadata, "tiny-like h128 d4 p4") and the map's growth;
 *   - deduplication: importing twice stores nothing new; two files sharing chunks, and a file
 *     repeating a chunk, store each chunk once (du: unique against logical bytes);
 *   - damage: a byte flipped inside a stored chunk (in its LMDB value) is found by verify, load,
 *     export (which then leaves no file) and bad_chunks, which names its index and hash;
 *     put_chunk refuses wrong bytes and repairs with the right ones; a deleted chunk is reported
 *     missing and a re-import restores it;
 *   - invalid safetensors are refused at import with nothing stored;
 *   - a gc between the chunk transactions and the manifest (from the progress callback) cannot
 *     leave a manifest without its chunks;
 *   - eviction: least recently used first (touch reorders), pinned never, shared chunks kept
 *     while a manifest still needs them, the result reported; gc removes only orphans;
 *   - resolve by prefix (full, 8 digits, odd length, upper case; too short, not hex, unknown,
 *     ambiguous), and damaged manifests (reported by verify, refused by gc).
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/dit_io.h"
#include "store/weights.h"

#define MIB ((size_t)1 << 20)

/* ---- fixture: an engine, a folder for files, a fresh store --------------------------------- */

typedef struct {
    ts_engine_t e;
    char files[256];
    char sdir[256];
    ts_store_t *s;
    char err[512];
} fx_t;

static int setup(void **state) {
    fx_t *fx = calloc(1, sizeof *fx);
    if (!fx || tu_engine_init_cpu(&fx->e) != TS_OK ||
        tu_make_temp_dir(fx->files, sizeof fx->files, "ts_weights_files") != 0 ||
        tu_make_temp_dir(fx->sdir, sizeof fx->sdir, "ts_weights_store") != 0)
        return -1;
    ts_store_opts_t o = {.dir = fx->sdir, .map_size = MIB};
    if (ts_store_open(&fx->s, &o, fx->err, sizeof fx->err) != TS_OK) {
        print_error("cannot open the store: %s\n", fx->err);
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state) {
    fx_t *fx = *state;
    ts_store_close(fx->s);
    tu_remove_temp_dir(fx->files);
    tu_remove_temp_dir(fx->sdir);
    ts_engine_free(&fx->e);
    free(fx);
    return 0;
}

static void path_in(const fx_t *fx, char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s", fx->files, name);
}

/* A tiny DiT with every parameter uniform in [−0.5, 0.5) (seeded), saved as F32 to path. When m
 * is not NULL the model is left there (the caller frees it). */
static void make_dit_file(fx_t *fx, const char *path, uint64_t seed, ts_dit_t *keep) {
    ts_dit_config_t cfg;
    TU_CHECK_OK(ts_dit_config_preset("tiny", &cfg));
    ts_dit_t m;
    TU_CHECK_OK(ts_dit_create(&m, &cfg, &fx->e, 1, 0));
    tu_rng_t r = {seed};
    tu_fill_uniform(&r, &m.param_mem, -0.5f, 0.5f);
    const char *extra[] = {"partition_id", "3"};
    TU_CHECK_RC_MSG(
        ts_dit_save(&m, &m.param_mem, path, TS_ST_F32, extra, 1, fx->err, sizeof fx->err), TS_OK,
        fx->err);
    if (keep)
        *keep = m;
    else
        ts_dit_free(&m);
}

/* A file holding one U8 tensor "x" of n bytes (data may be NULL for n == 0). */
static void make_u8_file(const char *path, const unsigned char *data, size_t n) {
    ts_st_entry_t e = {
        .name = "x", .dtype = TS_ST_U8, .ndim = 1, .shape = {(int64_t)n}, .data = data};
    const char *meta[] = {"note", "test"};
    char err[256] = "";
    TU_CHECK_RC_MSG(ts_st_write(path, &e, 1, meta, 1, err, sizeof err), TS_OK, err);
}

static unsigned char *random_bytes(size_t n, uint64_t seed) {
    unsigned char *p = malloc(n ? n : 1);
    assert_non_null(p);
    tu_rng_t r = {seed};
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(tu_rng_next(&r) >> 56);
    return p;
}

static ts_hash_t import_path(fx_t *fx, const char *path) {
    ts_hash_t h;
    TU_CHECK_RC_MSG(ts_weights_import_file(fx->s, path, &h, NULL, NULL, fx->err, sizeof fx->err),
                    TS_OK, fx->err);
    return h;
}

static ts_weights_du_t du(fx_t *fx) {
    ts_weights_du_t d;
    TU_CHECK_OK(ts_weights_du(fx->s, &d));
    return d;
}

/* Loads h and checks the bytes equal want[0..len). */
static void check_load(fx_t *fx, const ts_hash_t *h, const unsigned char *want, size_t len) {
    unsigned char *buf = NULL;
    size_t got = 0;
    TU_CHECK_RC_MSG(ts_weights_load(fx->s, h, &buf, &got, fx->err, sizeof fx->err), TS_OK, fx->err);
    assert_int_equal(got, len);
    assert_true(len == 0 || memcmp(buf, want, len) == 0);
    free(buf);
}

/* Exports h to name and checks the file equals want[0..len). */
static void check_export(fx_t *fx, const ts_hash_t *h, const char *name, const unsigned char *want,
                         size_t len) {
    char path[512];
    path_in(fx, path, sizeof path, name);
    TU_CHECK_RC_MSG(ts_weights_export(fx->s, h, path, fx->err, sizeof fx->err), TS_OK, fx->err);
    size_t got;
    unsigned char *buf = tu_read_file(path, &got);
    assert_int_equal(got, len);
    assert_true(len == 0 || memcmp(buf, want, len) == 0);
    free(buf);
}

/* ---- hashes ------------------------------------------------------------------------------- */

static void test_hashes(void **state) {
    (void)state;
    /* BLAKE2b-256 of "" and of "abc" (RFC 7693's algorithm, 32-byte output, no key) */
    ts_hash_t h, back;
    char hex[TS_HASH_HEX];
    ts_hash_compute(&h, "", 0);
    ts_hash_hex(&h, hex);
    assert_string_equal(hex, "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");
    ts_hash_compute(&h, "abc", 3);
    ts_hash_hex(&h, hex);
    assert_string_equal(hex, "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
    TU_CHECK_OK(ts_hash_parse(hex, &back));
    assert_memory_equal(back.b, h.b, TS_HASH_BYTES);
    hex[0] = 'B', hex[1] = 'D'; /* upper case parses to the same bytes */
    TU_CHECK_OK(ts_hash_parse(hex, &back));
    assert_memory_equal(back.b, h.b, TS_HASH_BYTES);
    TU_CHECK_RC(ts_hash_parse("bddd", &back), TS_EINVAL);
    hex[5] = 'g';
    TU_CHECK_RC(ts_hash_parse(hex, &back), TS_EINVAL);
    TU_CHECK_RC(ts_hash_parse(NULL, &back), TS_EINVAL);
}

/* ---- round trips -------------------------------------------------------------------------- */

typedef struct {
    int calls;
    ts_weights_info_t info; /* copied scalars of the last call */
    char hidden[16], partition[16], desc[64];
} info_probe_t;

static int probe_info(void *ctx, const ts_weights_info_t *info) {
    info_probe_t *p = ctx;
    p->calls++;
    p->info = *info;
    p->info.meta_keys = p->info.meta_vals = NULL;
    const char *v = ts_weights_info_meta(info, "hidden_size");
    snprintf(p->hidden, sizeof p->hidden, "%s", v ? v : "");
    v = ts_weights_info_meta(info, "partition_id");
    snprintf(p->partition, sizeof p->partition, "%s", v ? v : "");
    ts_weights_describe(info, p->desc, sizeof p->desc);
    return TS_OK;
}

static void test_roundtrip_dit(void **state) {
    fx_t *fx = *state;
    char path[512];
    path_in(fx, path, sizeof path, "dit.safetensors");
    ts_dit_t orig;
    make_dit_file(fx, path, 11, &orig);
    size_t len;
    unsigned char *file = tu_read_file(path, &len);
    assert_true(len > 3 * MIB); /* several chunks, the last one partial */

    size_t map0 = ts_store_map_size(fx->s);
    ts_hash_t h = import_path(fx, path), want;
    ts_hash_compute(&want, file, len);
    assert_memory_equal(h.b, want.b, TS_HASH_BYTES);
    assert_true(ts_store_map_size(fx->s) > map0); /* 1 MiB could not hold it: the map grew */

    check_export(fx, &h, "out.safetensors", file, len);
    check_load(fx, &h, file, len);

    info_probe_t p = {0};
    TU_CHECK_OK(ts_weights_info(fx->s, &h, probe_info, &p));
    assert_int_equal(p.calls, 1);
    assert_int_equal(p.info.size, len);
    assert_int_equal(p.info.chunk_size, TS_WEIGHTS_CHUNK);
    assert_int_equal(p.info.n_chunks, (len + MIB - 1) / MIB);
    assert_int_equal(p.info.n_tensors, orig.n_params + 1); /* + pos_embed */
    assert_false(p.info.pinned);
    assert_true(p.info.imported > 0 && p.info.last_used >= p.info.imported);
    assert_string_equal(p.hidden, "128");
    assert_string_equal(p.partition, "3");
    assert_string_equal(p.desc, "tiny-like h128 d4 p4");
    uint64_t lru0 = p.info.lru;

    /* the DiT from the store: bit-identical parameters, and the open counts as a use */
    ts_dit_t m;
    TU_CHECK_RC_MSG(ts_weights_open_dit(fx->s, &h, &fx->e, 2, 0, &m, fx->err, sizeof fx->err),
                    TS_OK, fx->err);
    assert_int_equal(m.num_params, orig.num_params);
    assert_memory_equal(m.param_mem.data, orig.param_mem.data,
                        (size_t)orig.num_params * sizeof(float));
    TU_CHECK_OK(ts_weights_info(fx->s, &h, probe_info, &p));
    assert_true(p.info.lru > lru0);
    ts_dit_free(&m);
    ts_dit_free(&orig);

    /* a file that is not a DiT is refused by open_dit, with *m left empty */
    unsigned char *data = random_bytes(100, 1);
    path_in(fx, path, sizeof path, "u8.safetensors");
    make_u8_file(path, data, 100);
    ts_hash_t hu = import_path(fx, path);
    TU_CHECK_RC(ts_weights_open_dit(fx->s, &hu, &fx->e, 1, 0, &m, fx->err, sizeof fx->err),
                TS_ECORRUPT);
    TU_CHECK_CONTAINS(fx->err, "not a DiT");
    assert_null(m.info);
    free(data);
    free(file);
}

static void test_roundtrip_small_and_empty(void **state) {
    fx_t *fx = *state;
    char path[512];
    /* smaller than one chunk */
    unsigned char *data = random_bytes(5000, 2);
    path_in(fx, path, sizeof path, "small.safetensors");
    make_u8_file(path, data, 5000);
    size_t len;
    unsigned char *file = tu_read_file(path, &len);
    ts_hash_t h;
    TU_CHECK_RC_MSG(
        ts_weights_import_buf(fx->s, file, len, &h, NULL, NULL, fx->err, sizeof fx->err), TS_OK,
        fx->err);
    check_export(fx, &h, "small.out", file, len);
    check_load(fx, &h, file, len);
    info_probe_t p = {0};
    TU_CHECK_OK(ts_weights_info(fx->s, &h, probe_info, &p));
    assert_int_equal(p.info.n_chunks, 1);
    assert_string_equal(p.desc, "-");
    free(file);

    /* no data at all: a header with only metadata, and one with a zero-size tensor */
    const char *meta[] = {"k", "v"};
    path_in(fx, path, sizeof path, "empty.safetensors");
    TU_CHECK_OK(ts_st_write(path, NULL, 0, meta, 1, fx->err, sizeof fx->err));
    file = tu_read_file(path, &len);
    h = import_path(fx, path);
    check_export(fx, &h, "empty.out", file, len);
    check_load(fx, &h, file, len);
    free(file);
    path_in(fx, path, sizeof path, "zero.safetensors");
    make_u8_file(path, NULL, 0);
    file = tu_read_file(path, &len);
    h = import_path(fx, path);
    check_export(fx, &h, "zero.out", file, len);
    TU_CHECK_OK(ts_weights_info(fx->s, &h, probe_info, &p));
    assert_int_equal(p.info.n_tensors, 1);
    free(file);
    free(data);
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);
    assert_int_equal(du(fx).manifests, 3);
}

/* ---- deduplication ------------------------------------------------------------------------ */

static void test_dedup(void **state) {
    fx_t *fx = *state;
    char a[512], b[512], z[512];
    path_in(fx, a, sizeof a, "a.safetensors");
    path_in(fx, b, sizeof b, "b.safetensors");
    path_in(fx, z, sizeof z, "z.safetensors");
    size_t n = 3 * MIB + 1000;
    unsigned char *data = random_bytes(n, 3);
    make_u8_file(a, data, n);
    data[n - 10] ^= 1; /* b differs from a in its last chunk only (same header length) */
    make_u8_file(b, data, n);

    ts_hash_t ha = import_path(fx, a);
    ts_weights_du_t d = du(fx);
    assert_int_equal(d.manifests, 1);
    assert_int_equal(d.chunks, 4);
    info_probe_t p = {0};
    TU_CHECK_OK(ts_weights_info(fx->s, &ha, probe_info, &p));
    uint64_t lru0 = p.info.lru;
    int64_t imported0 = p.info.imported;

    /* the same file again: nothing new, the same hash, a new use */
    ts_hash_t again = import_path(fx, a);
    assert_memory_equal(again.b, ha.b, TS_HASH_BYTES);
    d = du(fx);
    assert_int_equal(d.manifests, 1);
    assert_int_equal(d.chunks, 4);
    TU_CHECK_OK(ts_weights_info(fx->s, &ha, probe_info, &p));
    assert_true(p.info.lru > lru0);
    assert_int_equal(p.info.imported, imported0);

    /* a file sharing its first three chunks: one chunk more */
    ts_hash_t hb = import_path(fx, b);
    assert_memory_not_equal(hb.b, ha.b, TS_HASH_BYTES);
    d = du(fx);
    assert_int_equal(d.manifests, 2);
    assert_int_equal(d.chunks, 5);
    assert_int_equal(d.logical_bytes, 2 * p.info.size);
    assert_true(d.unique_bytes < d.logical_bytes);
    assert_int_equal(d.orphan_chunks, 0);

    /* a file repeating a chunk within itself: chunks 1 and 2 are all zeros, stored once */
    unsigned char *zeros = calloc(3 * MIB, 1);
    assert_non_null(zeros);
    make_u8_file(z, zeros, 3 * MIB);
    size_t zlen;
    unsigned char *zfile = tu_read_file(z, &zlen);
    ts_hash_t hz = import_path(fx, z);
    assert_int_equal(du(fx).chunks, 5 + 3); /* 4 chunks, two of them alike */
    check_load(fx, &hz, zfile, zlen);
    size_t blen;
    unsigned char *bfile = tu_read_file(b, &blen);
    check_load(fx, &hb, bfile, blen);
    free(bfile);
    free(zfile);
    free(zeros);
    free(data);
}

/* ---- damage and repair ------------------------------------------------------------------- */

/* Flips one byte of a stored chunk inside its LMDB value, or deletes the chunk. */
typedef struct {
    ts_hash_t key;
    size_t off;
    int del;
} damage_t;

static int damage_fn(void *ctx, ts_store_txn_t *t) {
    const damage_t *d = ctx;
    if (d->del)
        return ts_txn_del(t, TS_DB_CHUNKS, d->key.b, TS_HASH_BYTES);
    const void *val;
    size_t vlen;
    int rc = ts_txn_get(t, TS_DB_CHUNKS, d->key.b, TS_HASH_BYTES, &val, &vlen);
    if (rc)
        return rc;
    unsigned char *copy = malloc(vlen);
    if (!copy)
        return TS_ENOMEM;
    memcpy(copy, val, vlen);
    copy[d->off] ^= 0x40;
    rc = ts_txn_put(t, TS_DB_CHUNKS, d->key.b, TS_HASH_BYTES, copy, vlen);
    free(copy);
    return rc;
}

typedef struct {
    int n;
    ts_weights_problem_t last;
    char what[256];
} problems_t;

static void on_problem(void *ctx, const ts_weights_problem_t *p) {
    problems_t *ps = ctx;
    ps->n++;
    ps->last = *p;
    snprintf(ps->what, sizeof ps->what, "%s", p->what);
    ps->last.what = ps->what;
}

typedef struct {
    int n;
    uint64_t index;
    ts_hash_t hash;
    ts_chunk_problem_t problem;
} bad_probe_t;

static void on_bad(void *ctx, uint64_t index, const ts_hash_t *chunk, ts_chunk_problem_t problem) {
    bad_probe_t *b = ctx;
    b->n++;
    b->index = index, b->hash = *chunk, b->problem = problem;
}

static void test_damage(void **state) {
    fx_t *fx = *state;
    char path[512], out[512];
    path_in(fx, path, sizeof path, "dit.safetensors");
    path_in(fx, out, sizeof out, "out.safetensors");
    make_dit_file(fx, path, 12, NULL);
    size_t len;
    unsigned char *file = tu_read_file(path, &len);
    ts_hash_t h = import_path(fx, path), c1, c0;
    ts_hash_compute(&c0, file, MIB);
    ts_hash_compute(&c1, file + MIB, MIB);
    char c1hex[TS_HASH_HEX], hhex[TS_HASH_HEX];
    ts_hash_hex(&c1, c1hex);
    ts_hash_hex(&h, hhex);
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);
    assert_int_equal(ts_weights_bad_chunks(fx->s, &h, NULL, NULL), 0);

    damage_t d = {.key = c1, .off = 12345};
    TU_CHECK_OK(ts_store_write(fx->s, damage_fn, &d));

    /* verify names the expert, the chunk's index and its hash */
    problems_t ps = {0};
    ts_weights_verify_stats_t st;
    assert_int_equal(ts_weights_verify(fx->s, on_problem, &ps, &st), 1);
    assert_int_equal(ps.n, 1);
    assert_memory_equal(ps.last.weights.b, h.b, TS_HASH_BYTES);
    assert_int_equal(ps.last.chunk, 1);
    assert_memory_equal(ps.last.chunk_hash.b, c1.b, TS_HASH_BYTES);
    TU_CHECK_CONTAINS(ps.what, "corrupt");
    assert_int_equal(st.manifests, 1);
    assert_int_equal(st.chunks, (len + MIB - 1) / MIB);

    /* load and export refuse, naming the chunk; export leaves no file behind */
    unsigned char *buf = NULL;
    size_t got = 0;
    TU_CHECK_RC(ts_weights_load(fx->s, &h, &buf, &got, fx->err, sizeof fx->err), TS_ECORRUPT);
    assert_null(buf);
    char where[32];
    snprintf(where, sizeof where, "chunk 1 of %zu", (len + MIB - 1) / MIB);
    TU_CHECK_CONTAINS(fx->err, where);
    TU_CHECK_CONTAINS(fx->err, c1hex);
    TU_CHECK_CONTAINS(fx->err, "corrupt");
    TU_CHECK_RC(ts_weights_export(fx->s, &h, out, fx->err, sizeof fx->err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(fx->err, c1hex);
    assert_int_equal(access(out, F_OK), -1);
    assert_int_equal(tu_count_files(fx->files), 1);
    ts_dit_t m;
    TU_CHECK_RC(ts_weights_open_dit(fx->s, &h, &fx->e, 1, 0, &m, fx->err, sizeof fx->err),
                TS_ECORRUPT);

    /* bad_chunks lists what to fetch again */
    bad_probe_t b = {0};
    assert_int_equal(ts_weights_bad_chunks(fx->s, &h, on_bad, &b), 1);
    assert_int_equal(b.n, 1);
    assert_int_equal(b.index, 1);
    assert_int_equal(b.problem, TS_CHUNK_BAD);
    assert_memory_equal(b.hash.b, c1.b, TS_HASH_BYTES);

    /* put_chunk: wrong bytes refused, oversize refused, the right bytes repair */
    unsigned char *wrong = malloc(MIB);
    assert_non_null(wrong);
    memcpy(wrong, file + MIB, MIB);
    wrong[12345] ^= 0x40;
    TU_CHECK_RC(ts_weights_put_chunk(fx->s, &c1, wrong, MIB), TS_ECORRUPT);
    TU_CHECK_RC(ts_weights_put_chunk(fx->s, &c1, file, 2 * MIB), TS_EINVAL);
    TU_CHECK_RC(ts_weights_put_chunk(fx->s, &c1, file, 0), TS_EINVAL);
    TU_CHECK_OK(ts_weights_put_chunk(fx->s, &c1, file + MIB, MIB));
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);
    check_load(fx, &h, file, len);
    free(wrong);

    /* a missing chunk: reported as missing; a re-import restores it */
    d = (damage_t){.key = c0, .del = 1};
    TU_CHECK_OK(ts_store_write(fx->s, damage_fn, &d));
    b = (bad_probe_t){0};
    assert_int_equal(ts_weights_bad_chunks(fx->s, &h, on_bad, &b), 1);
    assert_int_equal(b.index, 0);
    assert_int_equal(b.problem, TS_CHUNK_MISSING);
    ps = (problems_t){0};
    assert_int_equal(ts_weights_verify(fx->s, on_problem, &ps, NULL), 1);
    TU_CHECK_CONTAINS(ps.what, "missing");
    TU_CHECK_RC(ts_weights_load(fx->s, &h, &buf, &got, fx->err, sizeof fx->err), TS_ECORRUPT);
    TU_CHECK_CONTAINS(fx->err, "missing");
    import_path(fx, path);
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);
    check_export(fx, &h, "out.safetensors", file, len);

    /* a damaged chunk is also repaired by importing the file again */
    d = (damage_t){.key = c1, .off = 7};
    TU_CHECK_OK(ts_store_write(fx->s, damage_fn, &d));
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 1);
    import_path(fx, path);
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);

    ts_hash_t unknown = c0;
    TU_CHECK_RC(ts_weights_bad_chunks(fx->s, &unknown, NULL, NULL), TS_ENOTFOUND);
    TU_CHECK_RC(ts_weights_load(fx->s, &unknown, &buf, &got, fx->err, sizeof fx->err),
                TS_ENOTFOUND);
    free(file);
}

/* ---- invalid files ------------------------------------------------------------------------ */

static void test_invalid_refused(void **state) {
    fx_t *fx = *state;
    char path[512];
    path_in(fx, path, sizeof path, "dit.safetensors");
    make_dit_file(fx, path, 13, NULL);
    size_t len;
    unsigned char *file = tu_read_file(path, &len);
    ts_hash_t h;
    /* truncated by one byte: the tensors no longer tile the buffer */
    TU_CHECK_RC(
        ts_weights_import_buf(fx->s, file, len - 1, &h, NULL, NULL, fx->err, sizeof fx->err),
        TS_ECORRUPT);
    TU_CHECK_CONTAINS(fx->err, "not a valid safetensors file");
    /* garbage, and a header length past the end */
    unsigned char junk[100];
    memset(junk, 'x', sizeof junk);
    TU_CHECK_RC(
        ts_weights_import_buf(fx->s, junk, sizeof junk, &h, NULL, NULL, fx->err, sizeof fx->err),
        TS_ECORRUPT);
    TU_CHECK_RC(ts_weights_import_buf(fx->s, junk, 3, &h, NULL, NULL, fx->err, sizeof fx->err),
                TS_ECORRUPT);
    /* a file on disk that is broken, one that does not exist, a directory */
    path_in(fx, path, sizeof path, "broken.safetensors");
    tu_write_file(path, file, len / 2);
    TU_CHECK_RC(ts_weights_import_file(fx->s, path, &h, NULL, NULL, fx->err, sizeof fx->err),
                TS_ECORRUPT);
    TU_CHECK_CONTAINS(fx->err, "broken.safetensors");
    path_in(fx, path, sizeof path, "nonexistent.safetensors");
    TU_CHECK_RC(ts_weights_import_file(fx->s, path, &h, NULL, NULL, fx->err, sizeof fx->err),
                TS_ENOTFOUND);
    TU_CHECK_CONTAINS(fx->err, "nonexistent.safetensors");
    TU_CHECK_RC(ts_weights_import_file(fx->s, fx->files, &h, NULL, NULL, fx->err, sizeof fx->err),
                TS_EINVAL);
    /* nothing was stored */
    ts_weights_du_t d = du(fx);
    assert_int_equal(d.manifests, 0);
    assert_int_equal(d.chunks, 0);
    assert_int_equal(d.unique_bytes, 0);
    free(file);
}

/* ---- a gc between the chunks and the manifest ---------------------------------------------- */

typedef struct {
    fx_t *fx;
    uint64_t freed;
    int calls;
} race_t;

static void gc_on_progress(void *ctx, uint64_t done, uint64_t total) {
    race_t *r = ctx;
    assert_true(done <= total);
    ts_weights_gc_t g;
    TU_CHECK_OK(ts_weights_gc(r->fx->s, &g)); /* the chunks just written are orphans yet */
    r->freed += g.chunks;
    r->calls++;
}

static void test_gc_during_import(void **state) {
    fx_t *fx = *state;
    char path[512];
    path_in(fx, path, sizeof path, "dit.safetensors");
    make_dit_file(fx, path, 14, NULL);
    size_t len;
    unsigned char *file = tu_read_file(path, &len);
    race_t r = {fx, 0, 0};
    ts_hash_t h;
    TU_CHECK_RC_MSG(
        ts_weights_import_file(fx->s, path, &h, gc_on_progress, &r, fx->err, sizeof fx->err), TS_OK,
        fx->err);
    assert_int_equal(r.calls, 1);
    size_t n_chunks = (len + MIB - 1) / MIB;
    assert_int_equal(r.freed, n_chunks); /* gc took every chunk of the batch ... */
    assert_int_equal(du(fx).chunks,
                     n_chunks); /* ... and the manifest's transaction put them back */
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);
    check_load(fx, &h, file, len);
    free(file);
}

/* ---- eviction and gc ---------------------------------------------------------------------- */

typedef struct {
    int n;
    ts_hash_t order[8];
} evicted_t;

static void on_evicted(void *ctx, const ts_weights_info_t *info) {
    evicted_t *e = ctx;
    if (e->n < 8)
        e->order[e->n] = info->hash;
    e->n++;
}

/* A file of one random U8 tensor of n bytes; returns its hash after importing it. */
static ts_hash_t import_random(fx_t *fx, const char *name, size_t n, uint64_t seed) {
    char path[512];
    path_in(fx, path, sizeof path, name);
    unsigned char *data = random_bytes(n, seed);
    make_u8_file(path, data, n);
    free(data);
    return import_path(fx, path);
}

static int count_manifests(void *ctx, const ts_weights_info_t *info) {
    (void)info;
    (*(int *)ctx)++;
    return TS_OK;
}

static int list_count(fx_t *fx) {
    int n = 0;
    TU_CHECK_OK(ts_weights_list(fx->s, count_manifests, &n));
    return n;
}

static void test_evict_lru_and_pins(void **state) {
    fx_t *fx = *state;
    size_t n = MIB + MIB / 2; /* 2 chunks each */
    ts_hash_t a = import_random(fx, "a", n, 21), b = import_random(fx, "b", n, 22),
              c = import_random(fx, "c", n, 23);
    ts_weights_du_t d = du(fx);
    assert_int_equal(d.chunks, 6);
    uint64_t all = d.unique_bytes, one = all / 3;
    assert_int_equal(all, 3 * one);

    TU_CHECK_OK(ts_weights_touch(fx->s, &a)); /* use order now: b, c, a */
    TU_CHECK_OK(ts_weights_pin(fx->s, &b, 1));

    /* a budget the store fits: nothing to do */
    evicted_t e = {0};
    ts_weights_evict_t r;
    TU_CHECK_OK(ts_weights_evict(fx->s, all, on_evicted, &e, &r));
    assert_int_equal(r.evicted, 0);
    assert_int_equal(e.n, 0);
    assert_int_equal(r.unique_bytes, all);

    /* one byte less: the least recently used unpinned expert goes — c (b is pinned) */
    TU_CHECK_OK(ts_weights_evict(fx->s, all - 1, on_evicted, &e, &r));
    assert_int_equal(r.evicted, 1);
    assert_int_equal(e.n, 1);
    assert_memory_equal(e.order[0].b, c.b, TS_HASH_BYTES);
    assert_int_equal(r.freed_chunks, 2);
    assert_int_equal(r.freed_bytes, one);
    assert_int_equal(r.unique_bytes, 2 * one);
    assert_int_equal(list_count(fx), 2);
    assert_int_equal(du(fx).chunks, 4);

    /* budget 0: a goes, the pinned b stays (and the store stays above the budget) */
    e = (evicted_t){0};
    TU_CHECK_OK(ts_weights_evict(fx->s, 0, on_evicted, &e, &r));
    assert_int_equal(r.evicted, 1);
    assert_memory_equal(e.order[0].b, a.b, TS_HASH_BYTES);
    assert_int_equal(r.unique_bytes, one);
    TU_CHECK_RC(ts_weights_info(fx->s, &a, count_manifests, &(int){0}), TS_ENOTFOUND);
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);

    /* unpinned, b goes too */
    TU_CHECK_OK(ts_weights_pin(fx->s, &b, 0));
    TU_CHECK_OK(ts_weights_evict(fx->s, 0, NULL, NULL, &r));
    assert_int_equal(r.evicted, 1);
    d = du(fx);
    assert_int_equal(d.manifests, 0);
    assert_int_equal(d.chunks, 0);

    /* shared chunks stay while a manifest still needs them */
    char p1[512], p2[512];
    path_in(fx, p1, sizeof p1, "d");
    path_in(fx, p2, sizeof p2, "e");
    size_t m = 3 * MIB + 100;
    unsigned char *data = random_bytes(m, 24);
    make_u8_file(p1, data, m);
    data[m - 1] ^= 1;
    make_u8_file(p2, data, m);
    size_t elen;
    unsigned char *efile = tu_read_file(p2, &elen);
    ts_hash_t hd = import_path(fx, p1), he = import_path(fx, p2);
    assert_int_equal(du(fx).chunks, 5);
    e = (evicted_t){0};
    TU_CHECK_OK(ts_weights_evict(fx->s, du(fx).unique_bytes - 1, on_evicted, &e, &r));
    assert_int_equal(r.evicted, 1);
    assert_memory_equal(e.order[0].b, hd.b, TS_HASH_BYTES);
    assert_int_equal(r.freed_chunks, 1); /* only d's own last chunk */
    check_load(fx, &he, efile, elen);
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);

    /* bookkeeping on a hash the store does not hold */
    TU_CHECK_RC(ts_weights_pin(fx->s, &a, 1), TS_ENOTFOUND);
    TU_CHECK_RC(ts_weights_touch(fx->s, &a), TS_ENOTFOUND);
    free(efile);
    free(data);
}

static void test_gc_only_orphans(void **state) {
    fx_t *fx = *state;
    ts_hash_t a = import_random(fx, "a", 2 * MIB + 5, 31);
    unsigned char *junk = random_bytes(1000, 32);
    ts_hash_t orphan;
    ts_hash_compute(&orphan, junk, 1000);
    TU_CHECK_OK(ts_weights_put_chunk(fx->s, &orphan, junk, 1000));
    ts_weights_du_t d = du(fx);
    assert_int_equal(d.chunks, 4);
    assert_int_equal(d.orphan_chunks, 1);
    assert_int_equal(d.orphan_bytes, 1000);

    ts_weights_gc_t g;
    TU_CHECK_OK(ts_weights_gc(fx->s, &g));
    assert_int_equal(g.chunks, 1);
    assert_int_equal(g.bytes, 1000);
    assert_int_equal(du(fx).chunks, 3);
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);
    TU_CHECK_OK(ts_weights_gc(fx->s, &g));
    assert_int_equal(g.chunks, 0);

    /* removing the manifest orphans its chunks */
    TU_CHECK_OK(ts_weights_remove(fx->s, &a));
    TU_CHECK_RC(ts_weights_remove(fx->s, &a), TS_ENOTFOUND);
    d = du(fx);
    assert_int_equal(d.manifests, 0);
    assert_int_equal(d.orphan_chunks, 3);
    TU_CHECK_OK(ts_weights_gc(fx->s, &g));
    assert_int_equal(g.chunks, 3);
    assert_int_equal(g.bytes, d.unique_bytes);
    assert_int_equal(du(fx).chunks, 0);
    free(junk);
}

/* ---- resolve, and damaged manifests ------------------------------------------------------ */

typedef struct {
    unsigned char key[TS_HASH_BYTES];
    int del;
} fake_t;

static int fake_manifest_fn(void *ctx, ts_store_txn_t *t) {
    const fake_t *f = ctx;
    if (f->del)
        return ts_txn_del(t, TS_DB_MANIFESTS, f->key, TS_HASH_BYTES);
    return ts_txn_put(t, TS_DB_MANIFESTS, f->key, TS_HASH_BYTES, "{}", 2);
}

static void test_resolve_and_damaged_manifests(void **state) {
    fx_t *fx = *state;
    ts_hash_t a = import_random(fx, "a", 1000, 41), b = import_random(fx, "b", 2000, 42), got;
    char hex[TS_HASH_HEX], text[TS_HASH_HEX];
    ts_hash_hex(&a, hex);
    assert_int_equal(list_count(fx), 2);

    TU_CHECK_OK(ts_weights_resolve(fx->s, hex, &got, fx->err, sizeof fx->err));
    assert_memory_equal(got.b, a.b, TS_HASH_BYTES);
    for (int digits = 8; digits <= 9; digits++) { /* even and odd lengths */
        snprintf(text, sizeof text, "%.*s", digits, hex);
        TU_CHECK_OK(ts_weights_resolve(fx->s, text, &got, fx->err, sizeof fx->err));
        assert_memory_equal(got.b, a.b, TS_HASH_BYTES);
    }
    snprintf(text, sizeof text, "%.12s", hex);
    for (char *p = text; *p; p++)
        if (*p >= 'a' && *p <= 'f')
            *p = (char)(*p - 'a' + 'A');
    TU_CHECK_OK(ts_weights_resolve(fx->s, text, &got, fx->err, sizeof fx->err));
    assert_memory_equal(got.b, a.b, TS_HASH_BYTES);

    TU_CHECK_RC(ts_weights_resolve(fx->s, "abcdef0", &got, fx->err, sizeof fx->err), TS_EINVAL);
    TU_CHECK_CONTAINS(fx->err, "8");
    TU_CHECK_RC(ts_weights_resolve(fx->s, "abcdefgh", &got, fx->err, sizeof fx->err), TS_EINVAL);
    snprintf(text, sizeof text, "%.16s", hex);
    text[0] = text[0] == '0' ? '1' : '0';
    ts_hash_hex(&b, hex);
    if (strncmp(text, hex, 16) != 0) {
        TU_CHECK_RC(ts_weights_resolve(fx->s, text, &got, fx->err, sizeof fx->err), TS_ENOTFOUND);
        TU_CHECK_CONTAINS(fx->err, "no weights");
    }

    /* two manifests sharing 9 hex digits: ab cd ef 01 23 … and ab cd ef 01 2f … */
    fake_t f1 = {{0xab, 0xcd, 0xef, 0x01, 0x23}}, f2 = {{0xab, 0xcd, 0xef, 0x01, 0x2f}};
    TU_CHECK_OK(ts_store_write(fx->s, fake_manifest_fn, &f1));
    TU_CHECK_OK(ts_store_write(fx->s, fake_manifest_fn, &f2));
    TU_CHECK_RC(ts_weights_resolve(fx->s, "abcdef01", &got, fx->err, sizeof fx->err), TS_EINVAL);
    TU_CHECK_CONTAINS(fx->err, "ambiguous");
    TU_CHECK_RC(ts_weights_resolve(fx->s, "ABCDEF012", &got, fx->err, sizeof fx->err), TS_EINVAL);
    TU_CHECK_OK(ts_weights_resolve(fx->s, "abcdef0123", &got, fx->err, sizeof fx->err));
    assert_memory_equal(got.b, f1.key, TS_HASH_BYTES);
    TU_CHECK_OK(ts_weights_resolve(fx->s, "abcdef012f", &got, fx->err, sizeof fx->err));
    assert_memory_equal(got.b, f2.key, TS_HASH_BYTES);
    TU_CHECK_RC(ts_weights_resolve(fx->s, "abcdef013", &got, fx->err, sizeof fx->err),
                TS_ENOTFOUND);

    /* those two do not parse: verify names them, gc and list refuse rather than guess */
    problems_t ps = {0};
    assert_int_equal(ts_weights_verify(fx->s, on_problem, &ps, NULL), 2);
    assert_int_equal(ps.last.chunk, -1);
    TU_CHECK_CONTAINS(ps.what, "format");
    ts_weights_gc_t g;
    TU_CHECK_RC(ts_weights_gc(fx->s, &g), TS_ECORRUPT);
    TU_CHECK_RC(ts_weights_evict(fx->s, 0, NULL, NULL, NULL), TS_ECORRUPT);
    int n = 0;
    TU_CHECK_RC(ts_weights_list(fx->s, count_manifests, &n), TS_ECORRUPT);
    ts_hash_t k1;
    memcpy(k1.b, f1.key, TS_HASH_BYTES);
    TU_CHECK_OK(ts_weights_remove(fx->s, &k1));
    f2.del = 1;
    TU_CHECK_OK(ts_store_write(fx->s, fake_manifest_fn, &f2));
    assert_int_equal(list_count(fx), 2);
    assert_int_equal(ts_weights_verify(fx->s, NULL, NULL, NULL), 0);
    TU_CHECK_OK(ts_weights_gc(fx->s, &g));
    assert_int_equal(g.chunks, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hashes),
        cmocka_unit_test_setup_teardown(test_roundtrip_dit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_small_and_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dedup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_during_import, setup, teardown),
        cmocka_unit_test_setup_teardown(test_evict_lru_and_pins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_only_orphans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resolve_and_damaged_manifests, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
