/*
 * test_safetensors.c — the strict safetensors reader and the atomic writer (model/safetensors.h).
 *
 * Covers: a write → read round trip of every dtype, scalars (ndim 0) and zero-size tensors,
 * unaligned data, metadata; the byte layout the writer produces (header padded with spaces to a
 * multiple of 8, no temporary file left behind); the host conversions (ts_st_to_f32,
 * ts_st_to_i64); the writer's argument checks; and a battery of corrupt files that must each be
 * refused with TS_ECORRUPT and a sentence naming the problem — every truncation of a valid file,
 * bad header lengths, bad JSON, bad entries, bad tilings — plus a deterministic fuzz loop that
 * flips bytes of a valid file and asserts only that the reader never misbehaves: it returns
 * TS_OK or TS_ECORRUPT, and with TS_OK every range lies inside the buffer.
 *
 * Not covered here: mapping files onto a DiT (tests/test_dit_io.c).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/math.h"
#include "model/safetensors.h"
#include "tests/testutil.h"

/* ---- fixtures: a private temporary directory --------------------------------------------- */

typedef struct {
    char dir[128];
} fixture_t;

static int setup_dir(void **state) {
    fixture_t *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    if (tu_make_temp_dir(fx->dir, sizeof fx->dir, "ts_test_st") != 0) {
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown_dir(void **state) {
    fixture_t *fx = *state;
    tu_remove_temp_dir(fx->dir);
    free(fx);
    return 0;
}

static void path_in(const fixture_t *fx, const char *name, char *out, size_t len) {
    snprintf(out, len, "%s/%s", fx->dir, name);
}

/* ---- building raw files ------------------------------------------------------------------ */

/* A file image: 8-byte LE header length n (given explicitly), the header text, data_len bytes of
 * data (0x5a). */
static unsigned char *raw_file_n(uint64_t n, const char *header, size_t data_len, size_t *len) {
    size_t hl = strlen(header);
    *len = 8 + hl + data_len;
    unsigned char *buf = malloc(*len ? *len : 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, 0x5a, data_len);
    return buf;
}

static unsigned char *raw_file(const char *header, size_t data_len, size_t *len) {
    return raw_file_n(strlen(header), header, data_len, len);
}

/* Parses a copy of buf (ts_st_parse takes ownership of what it is given). */
static int parse_copy(const unsigned char *buf, size_t len, ts_st_file_t *f, char *err,
                      size_t errlen) {
    unsigned char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    if (len)
        memcpy(copy, buf, len);
    return ts_st_parse(copy, len, f, err, errlen);
}

/* The header must be refused as TS_ECORRUPT with a sentence containing `mention`. */
static void expect_corrupt_n(uint64_t n, const char *header, size_t data_len, const char *mention) {
    size_t len;
    unsigned char *buf = raw_file_n(n, header, data_len, &len);
    ts_st_file_t f;
    char err[512] = "";
    int rc = ts_st_parse(buf, len, &f, err, sizeof err);
    if (rc != TS_ECORRUPT) {
        print_error("header %.200s: rc %d (%s), expected TS_ECORRUPT\n", header, rc,
                    ts_strerror(rc));
        if (rc == TS_OK)
            ts_st_free(&f);
        fail();
    }
    assert_true(strlen(err) > 10);
    if (mention)
        TU_CHECK_CONTAINS(err, mention);
    /* on failure the file is left empty */
    assert_null(f.buf);
    assert_null(f.tensors);
    assert_int_equal(f.n_tensors, 0);
    assert_int_equal(f.n_meta, 0);
}

static void expect_corrupt(const char *header, size_t data_len, const char *mention) {
    expect_corrupt_n(strlen(header), header, data_len, mention);
}

/* ---- round trip -------------------------------------------------------------------------- */

/* Every dtype, a scalar, zero-size tensors, and an odd-sized tensor first so that the F32 data
 * after it is unaligned. */
typedef struct {
    ts_st_entry_t e[12];
    int n;
    unsigned char data[12][64];
} sample_t;

static void sample_entries(sample_t *s) {
    static const struct {
        const char *name;
        ts_st_dtype_t dtype;
        int ndim;
        int64_t shape[3];
    } spec[] = {
        {"odd.i8", TS_ST_I8, 1, {3}},           {"w.f32", TS_ST_F32, 2, {2, 3}},
        {"h.f16", TS_ST_F16, 1, {4}},           {"b.bf16", TS_ST_BF16, 2, {2, 2}},
        {"d.f64", TS_ST_F64, 1, {3}},           {"i.i64", TS_ST_I64, 1, {2}},
        {"scalar.i32", TS_ST_I32, 0, {0}},      {"s.i16", TS_ST_I16, 1, {5}},
        {"empty.u8", TS_ST_U8, 1, {0}},         {"mask.bool", TS_ST_BOOL, 2, {2, 3}},
        {"empty.f32", TS_ST_F32, 3, {2, 0, 3}}, {"u.u8", TS_ST_U8, 1, {7}},
    };
    memset(s, 0, sizeof *s);
    s->n = (int)(sizeof spec / sizeof spec[0]);
    for (int i = 0; i < s->n; i++) {
        ts_st_entry_t *e = &s->e[i];
        e->name = spec[i].name;
        e->dtype = spec[i].dtype;
        e->ndim = spec[i].ndim;
        for (int d = 0; d < 3; d++)
            e->shape[d] = spec[i].shape[d];
        for (int b = 0; b < 64; b++) /* bool needs 0/1; others get a recognisable pattern */
            s->data[i][b] = e->dtype == TS_ST_BOOL ? (unsigned char)(b & 1)
                                                   : (unsigned char)(17 * i + 3 * b + 1);
        e->data = s->data[i];
    }
}

static int64_t entry_numel(const ts_st_entry_t *e) {
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= e->shape[d];
    return n;
}

static void test_round_trip_every_dtype(void **state) {
    fixture_t *fx = *state;
    sample_t s;
    sample_entries(&s);
    const char *meta[] = {"objective", "velocity", "note", "ünïcode ✓", "empty", ""};
    char path[256], err[256] = "";
    path_in(fx, "round.safetensors", path, sizeof path);
    TU_CHECK_OK(ts_st_write(path, s.e, s.n, meta, 3, err, sizeof err));
    assert_int_equal(tu_count_files(fx->dir), 1); /* the temporary file is gone */

    ts_st_file_t f;
    TU_CHECK_OK(ts_st_read(path, &f, err, sizeof err));
    assert_int_equal(f.n_tensors, s.n);
    /* the layout: header length a multiple of 8, padded with spaces, data right after */
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)f.buf[i] << (8 * i);
    assert_int_equal(n % 8, 0);
    assert_int_equal(f.buf[8], '{');
    size_t data_len = 0;
    for (int i = 0; i < s.n; i++) {
        const ts_st_entry_t *e = &s.e[i];
        const ts_st_tensor_t *t = ts_st_find(&f, e->name);
        assert_non_null(t);
        assert_string_equal(t->name, e->name);
        assert_int_equal(t->dtype, e->dtype);
        assert_int_equal(t->ndim, e->ndim);
        for (int d = 0; d < e->ndim; d++)
            assert_int_equal(t->shape[d], e->shape[d]);
        int64_t numel = entry_numel(e);
        size_t bytes = (size_t)numel * ts_st_dtype_size(e->dtype);
        assert_int_equal(t->numel, numel);
        assert_int_equal(t->end - t->begin, bytes);
        assert_true(t->end <= f.len - 8 - n);
        assert_ptr_equal(t->data, f.buf + 8 + n + t->begin);
        if (bytes)
            assert_memory_equal(t->data, e->data, bytes);
        data_len += bytes;
    }
    assert_int_equal(f.len, 8 + n + data_len);
    /* the tensors come in data-offset order, and the writer kept the caller's order */
    for (int i = 0; i + 1 < f.n_tensors; i++)
        assert_true(f.tensors[i].begin <= f.tensors[i + 1].begin);
    assert_non_null(ts_st_find(&f, "w.f32"));
    assert_int_equal(ts_st_find(&f, "w.f32")->begin, 3); /* after the 3-byte odd.i8: unaligned */
    assert_null(ts_st_find(&f, "nope"));
    assert_null(ts_st_find(&f, NULL));
    /* metadata */
    assert_int_equal(f.n_meta, 3);
    assert_string_equal(ts_st_meta(&f, "objective"), "velocity");
    assert_string_equal(ts_st_meta(&f, "note"), "ünïcode ✓");
    assert_string_equal(ts_st_meta(&f, "empty"), "");
    assert_null(ts_st_meta(&f, "missing"));
    /* "__metadata__" is written first */
    assert_memory_equal(f.buf + 8, "{\"__metadata__\":", 16);
    ts_st_free(&f);
    assert_null(f.buf);
    ts_st_free(&f); /* idempotent */
    ts_st_free(NULL);

    /* overwriting an existing file replaces it atomically */
    TU_CHECK_OK(ts_st_write(path, s.e, 2, NULL, 0, err, sizeof err));
    TU_CHECK_OK(ts_st_read(path, &f, err, sizeof err));
    assert_int_equal(f.n_tensors, 2);
    assert_int_equal(f.n_meta, 0);
    ts_st_free(&f);
    assert_int_equal(tu_count_files(fx->dir), 1);
}

static void test_empty_file_and_metadata_only(void **state) {
    fixture_t *fx = *state;
    char path[256], err[256] = "";
    path_in(fx, "empty.safetensors", path, sizeof path);
    ts_st_file_t f;
    TU_CHECK_OK(ts_st_write(path, NULL, 0, NULL, 0, err, sizeof err));
    TU_CHECK_OK(ts_st_read(path, &f, err, sizeof err));
    assert_int_equal(f.n_tensors, 0);
    assert_int_equal(f.len, 16); /* "{}" padded to 8 */
    ts_st_free(&f);
    const char *meta[] = {"k", "v"};
    TU_CHECK_OK(ts_st_write(path, NULL, 0, meta, 1, err, sizeof err));
    TU_CHECK_OK(ts_st_read(path, &f, err, sizeof err));
    assert_string_equal(ts_st_meta(&f, "k"), "v");
    ts_st_free(&f);
    /* hand-made headers the reference accepts: padding spaces, only zero-size tensors */
    size_t len;
    unsigned char *buf = raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                                  "\"b\":{\"dtype\":\"I8\",\"shape\":[2,0],\"data_offsets\":[0,0]}}"
                                  "      ",
                                  0, &len);
    TU_CHECK_OK(ts_st_parse(buf, len, &f, err, sizeof err));
    assert_int_equal(f.n_tensors, 2);
    assert_int_equal(f.tensors[0].numel, 0);
    ts_st_free(&f);
}

static void test_conversions(void **state) {
    (void)state;
    /* F32 1.5, -2 at an unaligned address; F16 and BF16 of the same; integers; bool */
    unsigned char raw[64];
    ts_st_tensor_t t;
    float out[8];
    int64_t iv[8];
    memset(&t, 0, sizeof t);

    uint32_t a = ts_f32_bits(1.5f), b = ts_f32_bits(-2.0f);
    for (int k = 0; k < 4; k++) {
        raw[1 + k] = (unsigned char)(a >> (8 * k));
        raw[5 + k] = (unsigned char)(b >> (8 * k));
    }
    t.dtype = TS_ST_F32, t.ndim = 1, t.shape[0] = 2, t.numel = 2, t.data = raw + 1;
    TU_CHECK_OK(ts_st_to_f32(&t, out, 2));
    assert_true(out[0] == 1.5f && out[1] == -2.0f);
    TU_CHECK_RC(ts_st_to_i64(&t, iv, 2), TS_ERANGE);  /* 1.5 is not integral */
    TU_CHECK_RC(ts_st_to_f32(&t, out, 3), TS_EINVAL); /* n must equal numel */
    TU_CHECK_RC(ts_st_to_f32(NULL, out, 2), TS_EINVAL);

    uint16_t h = ts_f32_to_f16(-3.0f), bf = ts_f32_to_bf16(0.15625f);
    raw[1] = (unsigned char)h, raw[2] = (unsigned char)(h >> 8);
    raw[3] = (unsigned char)bf, raw[4] = (unsigned char)(bf >> 8);
    t.dtype = TS_ST_F16, t.numel = 1, t.data = raw + 1;
    TU_CHECK_OK(ts_st_to_f32(&t, out, 1));
    assert_true(out[0] == -3.0f);
    TU_CHECK_OK(ts_st_to_i64(&t, iv, 1));
    assert_int_equal(iv[0], -3);
    t.dtype = TS_ST_BF16, t.data = raw + 3;
    TU_CHECK_OK(ts_st_to_f32(&t, out, 1));
    assert_true(out[0] == 0.15625f);

    double dv = -1e300;
    uint64_t du;
    memcpy(&du, &dv, 8);
    for (int k = 0; k < 8; k++)
        raw[3 + k] = (unsigned char)(du >> (8 * k));
    t.dtype = TS_ST_F64, t.data = raw + 3;
    TU_CHECK_OK(ts_st_to_f32(&t, out, 1));
    assert_true(isinf(out[0]) && out[0] < 0); /* overflows F32 */
    TU_CHECK_RC(ts_st_to_i64(&t, iv, 1), TS_ERANGE);

    int64_t big = -1234567890123LL;
    uint64_t bu;
    memcpy(&bu, &big, 8);
    for (int k = 0; k < 8; k++)
        raw[1 + k] = (unsigned char)(bu >> (8 * k));
    t.dtype = TS_ST_I64, t.data = raw + 1;
    TU_CHECK_OK(ts_st_to_i64(&t, iv, 1));
    assert_int_equal(iv[0], big);

    unsigned char ints[] = {0xff, 0xff, 0xff, 0xff, 0xfe, 0xff, 0x80, 0x7f};
    t.dtype = TS_ST_I32, t.data = ints;
    TU_CHECK_OK(ts_st_to_i64(&t, iv, 1));
    assert_int_equal(iv[0], -1);
    t.dtype = TS_ST_I16, t.numel = 1, t.data = ints + 4;
    TU_CHECK_OK(ts_st_to_f32(&t, out, 1));
    assert_true(out[0] == -2.0f);
    t.dtype = TS_ST_I8, t.numel = 2, t.data = ints + 6;
    TU_CHECK_OK(ts_st_to_i64(&t, iv, 2));
    assert_int_equal(iv[0], -128);
    assert_int_equal(iv[1], 127);
    t.dtype = TS_ST_U8;
    TU_CHECK_OK(ts_st_to_f32(&t, out, 2));
    assert_true(out[0] == 128.0f && out[1] == 127.0f);

    unsigned char bools[] = {0, 1, 2};
    t.dtype = TS_ST_BOOL, t.numel = 2, t.data = bools;
    TU_CHECK_OK(ts_st_to_i64(&t, iv, 2));
    assert_int_equal(iv[1], 1);
    t.numel = 3;
    TU_CHECK_RC(ts_st_to_f32(&t, out, 3), TS_ECORRUPT); /* a bool byte of 2 */

    t.numel = 0, t.data = NULL; /* zero-size: nothing to read */
    TU_CHECK_OK(ts_st_to_f32(&t, NULL, 0));

    assert_int_equal(ts_st_dtype_size(TS_ST_BF16), 2);
    assert_int_equal(ts_st_dtype_size(TS_ST_F64), 8);
    assert_int_equal(ts_st_dtype_size((ts_st_dtype_t)99), 0);
    assert_string_equal(ts_st_dtype_name(TS_ST_BOOL), "BOOL");
    assert_string_equal(ts_st_dtype_name((ts_st_dtype_t)-1), "?");
}

/* ---- the writer's checks ----------------------------------------------------------------- */

static void test_write_rejects_bad_entries(void **state) {
    fixture_t *fx = *state;
    char path[256], err[256];
    path_in(fx, "bad.safetensors", path, sizeof path);
    float data[4] = {1, 2, 3, 4};
    ts_st_entry_t good = {.name = "a", .dtype = TS_ST_F32, .ndim = 1, .shape = {4}, .data = data};
    ts_st_entry_t e[2] = {good, good};

    e[1].name = "a";
    err[0] = '\0';
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "'a'");
    e[1] = good, e[1].name = NULL;
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    e[1] = good, e[1].name = "";
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    e[1] = good, e[1].name = "__metadata__";
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    e[1] = good, e[1].name = "b", e[1].shape[0] = -4;
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "'b'");
    e[1] = good, e[1].name = "b", e[1].dtype = (ts_st_dtype_t)42;
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    e[1] = good, e[1].name = "b", e[1].ndim = TS_ST_MAX_DIMS + 1;
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    e[1] = good, e[1].name = "b", e[1].data = NULL;
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    e[1] = good, e[1].name = "b\xff"; /* not UTF-8 */
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_EINVAL);
    e[1] = good, e[1].name = "b", e[1].ndim = 2, e[1].shape[0] = e[1].shape[1] = (int64_t)1 << 40;
    TU_CHECK_RC(ts_st_write(path, e, 2, NULL, 0, err, sizeof err), TS_ERANGE);

    const char *dup_meta[] = {"k", "1", "k", "2"};
    TU_CHECK_RC(ts_st_write(path, &good, 1, dup_meta, 2, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "'k'");
    const char *null_meta[] = {"k", NULL};
    TU_CHECK_RC(ts_st_write(path, &good, 1, null_meta, 1, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_st_write(path, NULL, 1, NULL, 0, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_st_write(NULL, &good, 1, NULL, 0, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_st_write(path, &good, -1, NULL, 0, err, sizeof err), TS_EINVAL);
    assert_int_equal(tu_count_files(fx->dir), 0); /* nothing was written */

    /* an unwritable place: TS_EIO, and no temporary file left anywhere */
    char bad_dir[300];
    path_in(fx, "no/such/dir/x.safetensors", bad_dir, sizeof bad_dir);
    TU_CHECK_RC(ts_st_write(bad_dir, &good, 1, NULL, 0, err, sizeof err), TS_EIO);
    assert_int_equal(tu_count_files(fx->dir), 0);
}

static void test_read_errors(void **state) {
    fixture_t *fx = *state;
    char path[256], err[256] = "";
    ts_st_file_t f;
    path_in(fx, "absent.safetensors", path, sizeof path);
    TU_CHECK_RC(ts_st_read(path, &f, err, sizeof err), TS_ENOTFOUND); /* missing: not an I/O error */
    TU_CHECK_CONTAINS(err, "absent.safetensors");
    TU_CHECK_RC(ts_st_read(fx->dir, &f, err, sizeof err), TS_EIO); /* a directory */
    TU_CHECK_RC(ts_st_read(NULL, &f, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_st_read(path, NULL, err, sizeof err), TS_EINVAL);
    TU_CHECK_RC(ts_st_parse(NULL, 0, NULL, err, sizeof err), TS_EINVAL);
}

/* ---- corrupt files ----------------------------------------------------------------------- */

/* A small valid file, as bytes. */
static unsigned char *small_valid_file(const fixture_t *fx, size_t *len) {
    char path[256], err[256];
    path_in(fx, "small.safetensors", path, sizeof path);
    float w[4] = {1, -2, 3.5f, 0};
    uint16_t hb[3] = {0x3c00, 0xc000, 0x0001};
    int8_t s = -7;
    ts_st_entry_t e[3] = {
        {.name = "w", .dtype = TS_ST_F32, .ndim = 2, .shape = {2, 2}, .data = w},
        {.name = "b", .dtype = TS_ST_F16, .ndim = 1, .shape = {3}, .data = hb},
        {.name = "s", .dtype = TS_ST_I8, .ndim = 0, .data = &s},
    };
    const char *meta[] = {"a", "b"};
    TU_CHECK_OK(ts_st_write(path, e, 3, meta, 1, err, sizeof err));
    unsigned char *buf = tu_read_file(path, len);
    unlink(path);
    return buf;
}

static void test_every_truncation(void **state) {
    fixture_t *fx = *state;
    size_t len;
    unsigned char *buf = small_valid_file(fx, &len);
    char err[512], path[256];
    ts_st_file_t f;
    TU_CHECK_OK(parse_copy(buf, len, &f, err, sizeof err));
    ts_st_free(&f);
    path_in(fx, "prefix.safetensors", path, sizeof path);
    for (size_t n = 0; n < len; n++) {
        err[0] = '\0';
        int rc = parse_copy(buf, n, &f, err, sizeof err);
        if (rc != TS_ECORRUPT) {
            print_error("prefix of %zu of %zu bytes: rc %d\n", n, len, rc);
            fail();
        }
        assert_true(strlen(err) > 10);
        /* and through the file reader */
        tu_write_file(path, buf, n);
        TU_CHECK_RC(ts_st_read(path, &f, err, sizeof err), TS_ECORRUPT);
        TU_CHECK_CONTAINS(err, "prefix.safetensors");
    }
    unlink(path);
    free(buf);
}

static void test_bad_header_lengths(void **state) {
    (void)state;
    const char *hdr = "{}";
    expect_corrupt_n(3, hdr, 0, "header length 3"); /* one past the file */
    expect_corrupt_n(1000, hdr, 0, "runs past");
    expect_corrupt_n((uint64_t)1 << 63, hdr, 0, "exceeds"); /* 2^63 */
    expect_corrupt_n(UINT64_MAX, hdr, 0, "exceeds");
    expect_corrupt_n((uint64_t)TS_ST_MAX_HEADER + 1, hdr, 0, "exceeds");
    expect_corrupt_n(0, "", 0, "JSON");   /* empty header */
    expect_corrupt_n(1, "{}", 1, "JSON"); /* header cut inside */
}

static void test_bad_json(void **state) {
    (void)state;
    expect_corrupt("{not json", 0, "JSON");
    expect_corrupt("[1,2,3]", 0, "array");
    expect_corrupt("\"just a string\"", 0, NULL);
    expect_corrupt("42", 0, NULL);
    expect_corrupt("{} trailing", 0, "JSON");
    expect_corrupt("{\"a\":\"\xff\xfe\"}", 0, "JSON"); /* invalid UTF-8 */
    expect_corrupt("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
                   "JSON"); /* NUL inside a key */
    expect_corrupt("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                   "\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
                   0, "JSON"); /* duplicate tensor names */
    expect_corrupt("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[0],"
                   "\"data_offsets\":[0,0]}}",
                   0, "JSON"); /* duplicate field */
    /* deep nesting must not exhaust the stack */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 16);
    assert_non_null(deep);
    strcpy(deep, "{\"a\":");
    size_t pos = strlen(deep);
    memset(deep + pos, '[', depth);
    memset(deep + pos + depth, ']', depth);
    strcpy(deep + pos + 2 * depth, "}");
    expect_corrupt(deep, 0, NULL);
    free(deep);
}

static void test_bad_entries(void **state) {
    (void)state;
#define ENTRY(dt, shape, offs) "{\"dtype\":" dt ",\"shape\":" shape ",\"data_offsets\":" offs "}"
    expect_corrupt("{\"t\":" ENTRY("\"F8\"", "[1]", "[0,1]") "}", 1, "unknown dtype 'F8'");
    expect_corrupt("{\"t\":" ENTRY("\"f32\"", "[1]", "[0,4]") "}", 4, "unknown dtype");
    expect_corrupt("{\"t\":" ENTRY("7", "[1]", "[0,4]") "}", 4, "'t'");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[-1]", "[0,4]") "}", 4, "shape entry 0");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[2.0]", "[0,8]") "}", 8, "shape entry 0");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1,\"2\"]", "[0,8]") "}", 8, "shape entry 1");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "2", "[0,8]") "}", 8, "not an array");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4,
                   "9 dimensions");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1099511627776,1099511627776]", "[0,4]") "}", 4,
                   "more than 2^40 elements"); /* [2^40, 2^40] */
    expect_corrupt("{\"t\":" ENTRY("\"U8\"", "[4611686018427387904]", "[0,4]") "}", 4,
                   "shape entry 0"); /* 2^62 */
    expect_corrupt("{\"t\":" ENTRY("\"U8\"", "[99999999999999999999999]", "[0,4]") "}", 4,
                   "JSON"); /* beyond int64: jansson refuses it */
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1]", "[4,0]") "}", 4, "begin after");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1]", "[-4,0]") "}", 4, "data_offsets");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1]", "[0]") "}", 4, "data_offsets");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1]", "[0,4,8]") "}", 8, "data_offsets");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1]", "[0.0,4]") "}", 4, "data_offsets");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1]", "[0,8]") "}", 4, "run past");
    expect_corrupt("{\"t\":" ENTRY("\"F32\"", "[1]", "[0,9223372036854775807]") "}", 4, "run past");
    /* numel × size mismatch, with the message the header promises */
    expect_corrupt("{\"blocks.0.attn.qkv.weight\":" ENTRY("\"F32\"", "[384,128]", "[0,196604]") "}",
                   196604,
                   "tensor 'blocks.0.attn.qkv.weight': shape [384,128] × F32 needs "
                   "196608 bytes but data_offsets span 196604");
    /* fields: missing, extra, entry not an object, empty name */
    expect_corrupt("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "missing field 'data_offsets'");
    expect_corrupt("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "missing field 'dtype'");
    expect_corrupt("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
                   "unexpected field 'x'");
    expect_corrupt("{\"t\":[1,2]}", 0, "not a JSON object");
    expect_corrupt("{\"\":" ENTRY("\"F32\"", "[1]", "[0,4]") "}", 4, "empty name");
    /* names with control characters are masked in the message */
    expect_corrupt("{\"a\\u001b[31m\":" ENTRY("\"F8\"", "[1]", "[0,1]") "}", 1, "'a?[31m'");
    /* metadata */
    expect_corrupt("{\"__metadata__\":{\"k\":1}}", 0, "'k'");
    expect_corrupt("{\"__metadata__\":{\"k\":null}}", 0, "not a string");
    expect_corrupt("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, "not a string");
    expect_corrupt("{\"__metadata__\":[\"k\",\"v\"]}", 0, "__metadata__");
    expect_corrupt("{\"__metadata__\":\"v\"}", 0, "__metadata__");
}

static void test_bad_tilings(void **state) {
    (void)state;
    /* overlapping ranges */
    expect_corrupt(
        "{\"a\":" ENTRY("\"F32\"", "[2]", "[0,8]") ",\"b\":" ENTRY("\"F32\"", "[1]", "[4,8]") "}",
        8, "overlap");
    /* the same range twice */
    expect_corrupt(
        "{\"a\":" ENTRY("\"F32\"", "[1]", "[0,4]") ",\"b\":" ENTRY("\"F32\"", "[1]", "[0,4]") "}",
        4, "overlap");
    /* a zero-size tensor inside another's range */
    expect_corrupt(
        "{\"a\":" ENTRY("\"F32\"", "[2]", "[0,8]") ",\"z\":" ENTRY("\"F32\"", "[0]", "[4,4]") "}",
        8, "overlap");
    /* a gap between tensors */
    expect_corrupt(
        "{\"a\":" ENTRY("\"F32\"", "[1]", "[0,4]") ",\"b\":" ENTRY("\"F32\"", "[1]", "[8,12]") "}",
        12, "gap of 4 bytes");
    /* a gap at the start */
    expect_corrupt("{\"b\":" ENTRY("\"F32\"", "[1]", "[4,8]") "}", 8, "gap");
    /* the buffer goes on after the last tensor */
    expect_corrupt("{\"a\":" ENTRY("\"F32\"", "[1]", "[0,4]") "}", 5, "trailing");
    expect_corrupt("{}", 1, "trailing");
    expect_corrupt("{\"z\":" ENTRY("\"F32\"", "[0]", "[0,0]") "}", 3, "trailing");
#undef ENTRY
}

/* ---- fuzzing ----------------------------------------------------------------------------- */

static uint64_t xorshift64(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void test_fuzz_byte_flips(void **state) {
    fixture_t *fx = *state;
    size_t len;
    unsigned char *valid = small_valid_file(fx, &len);
    uint64_t hdr_len = 0;
    for (int i = 0; i < 8; i++)
        hdr_len |= (uint64_t)valid[i] << (8 * i);
    static const char syntax[] = "{}[]\",:-.0123456789eE \\u";
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int accepted = 0;
    unsigned char *buf = malloc(len);
    assert_non_null(buf);
    for (int iter = 0; iter < 2000; iter++) {
        memcpy(buf, valid, len);
        size_t n = len;
        int flips = 1 + (int)(xorshift64(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            /* mostly inside the header, where the parser's decisions are */
            uint64_t r = xorshift64(&rng);
            size_t pos = (r % 4 != 0) ? (size_t)(8 + (r >> 8) % hdr_len) : (size_t)((r >> 8) % n);
            uint64_t v = xorshift64(&rng);
            buf[pos] = (v % 2) ? (unsigned char)syntax[(v >> 8) % (sizeof syntax - 1)]
                               : (unsigned char)(v >> 16);
        }
        if (xorshift64(&rng) % 8 == 0) /* sometimes also cut the file */
            n = (size_t)(xorshift64(&rng) % (len + 1));
        ts_st_file_t f;
        char err[256];
        int rc = parse_copy(buf, n, &f, err, sizeof err);
        if (rc != TS_OK && rc != TS_ECORRUPT) {
            print_error("iteration %d: rc %d (%s)\n", iter, rc, ts_strerror(rc));
            fail();
        }
        if (rc != TS_OK)
            continue;
        accepted++;
        uint64_t h = 0;
        for (int i = 0; i < 8; i++)
            h |= (uint64_t)f.buf[i] << (8 * i);
        size_t buflen = f.len - 8 - (size_t)h;
        for (int i = 0; i < f.n_tensors; i++) {
            const ts_st_tensor_t *t = &f.tensors[i];
            assert_true(t->begin <= t->end && t->end <= buflen);
            assert_int_equal(t->end - t->begin, (size_t)t->numel * ts_st_dtype_size(t->dtype));
            assert_ptr_equal(t->data, f.buf + 8 + h + t->begin);
            float *tmp = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *tmp);
            assert_non_null(tmp);
            int crc = ts_st_to_f32(t, tmp, t->numel);
            assert_true(crc == TS_OK || crc == TS_ECORRUPT);
            free(tmp);
        }
        ts_st_free(&f);
    }
    /* flips in the data and in insignificant header bytes keep the file valid */
    assert_true(accepted > 0);
    free(buf);
    free(valid);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_every_dtype, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_empty_file_and_metadata_only, setup_dir, teardown_dir),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test_setup_teardown(test_write_rejects_bad_entries, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_read_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_every_truncation, setup_dir, teardown_dir),
        cmocka_unit_test(test_bad_header_lengths),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_bad_tilings),
        cmocka_unit_test_setup_teardown(test_fuzz_byte_flips, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
