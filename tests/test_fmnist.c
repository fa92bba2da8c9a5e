/*
 * test_fmnist.c — the Fashion-MNIST reader and the IDX writer (model/fmnist.h), and dataset
 * subsets (model/dataset.h). Shard files are test_shard.c's.
 *
 * Covers: the real Debian files when installed (counts, shapes, the value range, the documented
 * 6000/1000 images per class, the first label of each split); small synthetic IDX files written
 * to a fresh temporary folder, gzip'ed and uncompressed, including every way the reader must
 * refuse a file (wrong magic, truncated header or pixels, a header that claims far more data than
 * the file holds, count mismatch, trailing bytes, label out of range, dimensions out of range,
 * corrupt gzip, missing file); ts_dataset_subset; ts_fmnist_write read back.
 *
 * The real-data tests skip when dataset-fashion-mnist is not installed.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>

#include "model/fmnist.h"
#include "tests/testutil.h"

/* The checks print err, the sentence the call under test wrote. */
#define CHECK_RC(expr, want) TU_CHECK_RC_MSG(expr, want, err)
#define CHECK_OK(expr) CHECK_RC(expr, TS_OK)

/* ---- a temporary folder per test ----------------------------------------------------------- */

static char err[512]; /* the error sentence of the last call, printed by CHECK_RC */

/* Each test gets a fresh temporary folder (tu_temp_dir) and an empty err. */
static int setup_dir(void **state) {
    err[0] = '\0';
    return tu_setup_temp_dir(state);
}

static void write_file(const char *name, const void *data, size_t len, int gz) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s%s", tu_temp_dir(), name, gz ? ".gz" : "");
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        if (len > 0)
            assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        tu_write_file(path, data, len);
    }
}

/* ---- synthetic IDX files --------------------------------------------------------------- */

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* A synthetic pair: n images of h×w with pixel (i, y, x) = (7i + 3y + x) % 256 plus extra bytes,
 * and labels (2i + 1) % 10. */
typedef struct synth {
    unsigned char img[4096];
    size_t img_len;
    unsigned char lab[256];
    size_t lab_len;
} synth_t;

static uint8_t synth_pixel(int i, int y, int x) { return (uint8_t)((7 * i + 3 * y + x) % 256); }

static void synth_make(synth_t *s, uint32_t n, uint32_t h, uint32_t w) {
    put_be32(s->img, TS_FMNIST_MAGIC_IMAGES);
    put_be32(s->img + 4, n);
    put_be32(s->img + 8, h);
    put_be32(s->img + 12, w);
    s->img_len = 16;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t y = 0; y < h; y++)
            for (uint32_t x = 0; x < w; x++)
                s->img[s->img_len++] = synth_pixel((int)i, (int)y, (int)x);
    put_be32(s->lab, TS_FMNIST_MAGIC_LABELS);
    put_be32(s->lab + 4, n);
    s->lab_len = 8;
    for (uint32_t i = 0; i < n; i++)
        s->lab[s->lab_len++] = (unsigned char)((2 * i + 1) % 10);
}

static void synth_write(const synth_t *s, const char *prefix, int gz) {
    char name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    write_file(name, s->img, s->img_len, gz);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    write_file(name, s->lab, s->lab_len, gz);
}

/* Loads the "train" split of the test's folder and expects rc; on an error, also a message with
 * needle. */
static void expect_load_error(int want, const char *needle) {
    ts_dataset_t ds;
    memset(&ds, 0xab, sizeof ds);
    err[0] = '\0';
    CHECK_RC(ts_fmnist_load(tu_temp_dir(), "train", &ds, err, sizeof err), want);
    TU_CHECK_CONTAINS(err, needle);
    /* a failed load leaves nothing behind */
    assert_null(ds.images);
    assert_null(ds.labels);
    assert_int_equal(ds.n, 0);
}

static void check_synth_dataset(const ts_dataset_t *ds, int n, int h, int w) {
    assert_int_equal(ds->n, n);
    assert_int_equal(ds->channels, 1);
    assert_int_equal(ds->height, h);
    assert_int_equal(ds->width, w);
    assert_int_equal(ds->num_classes, 10);
    for (int i = 0; i < n; i++) {
        assert_int_equal(ds->labels[i], (2 * i + 1) % 10);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                float got = ds->images[((size_t)i * h + y) * w + x];
                float want = (float)synth_pixel(i, y, x) / 127.5f - 1.0f;
                assert_true(got == want);
            }
    }
}

/* ---- the real dataset ------------------------------------------------------------------ */

static int have_real_data(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", TS_FMNIST_DEFAULT_DIR);
    return access(path, R_OK) == 0;
}

/* Counts, shape, exact range and the per-class histogram of one real split. */
static void check_real_split(const char *split, int n, int per_class, int first_label) {
    if (!have_real_data()) {
        print_message("skipping: %s not installed (apt-get install dataset-fashion-mnist)\n",
                      TS_FMNIST_DEFAULT_DIR);
        skip();
    }
    ts_dataset_t ds;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(ts_fmnist_load(NULL, split, &ds, err, sizeof err));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    print_message("loaded %s (%d images) in %.3f s\n", split, ds.n,
                  (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    assert_int_equal(ds.n, n);
    assert_int_equal(ds.channels, 1);
    assert_int_equal(ds.height, 28);
    assert_int_equal(ds.width, 28);
    assert_int_equal(ds.num_classes, 10);

    float lo = 2.0f, hi = -2.0f;
    size_t npix = (size_t)n * 28 * 28;
    for (size_t i = 0; i < npix; i++) {
        float v = ds.images[i];
        assert_true(v >= -1.0f && v <= 1.0f);
        /* every value is exactly p / 127.5 − 1 for a byte p */
        int p = (int)((v + 1.0f) * 127.5f + 0.5f);
        assert_true(v == (float)p / 127.5f - 1.0f);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    assert_true(lo == -1.0f);
    assert_true(hi == 1.0f);

    int hist[10] = {0};
    for (int i = 0; i < n; i++) {
        assert_in_range(ds.labels[i], 0, 9);
        hist[ds.labels[i]]++;
    }
    for (int c = 0; c < 10; c++)
        assert_int_equal(hist[c], per_class);
    /* Fashion-MNIST documents the first item of both splits as class 9, "Ankle boot" */
    assert_int_equal(ds.labels[0], first_label);
    /* the labels alone (what the class prior reads): the same labels */
    int32_t *labels = NULL;
    int nl = 0;
    CHECK_OK(ts_fmnist_load_labels(NULL, split, &labels, &nl, err, sizeof err));
    assert_int_equal(nl, n);
    assert_memory_equal(labels, ds.labels, (size_t)n * sizeof *labels);
    free(labels);
    ts_dataset_free(&ds);
    assert_null(ds.images);
}

static void test_real_train(void **state) {
    (void)state;
    check_real_split("train", 60000, 6000, 9);
}

static void test_real_test(void **state) {
    (void)state;
    check_real_split("test", 10000, 1000, 9);
}

/* ---- synthetic files: accepted --------------------------------------------------------- */

static void test_synthetic_gz(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 5, 4, 6);
    s.img[16] = 0;   /* item 0 pixel (0, 0): the extremes map to −1 and 1 exactly */
    s.img[17] = 255; /* item 0 pixel (0, 1) */
    synth_write(&s, "train", 1);
    ts_dataset_t ds;
    CHECK_OK(ts_fmnist_load(tu_temp_dir(), "train", &ds, err, sizeof err));
    assert_true(ds.images[0] == -1.0f);
    assert_true(ds.images[1] == 1.0f);
    s.img[16] = synth_pixel(0, 0, 0); /* compare the rest against the pattern */
    s.img[17] = synth_pixel(0, 0, 1);
    ds.images[0] = (float)s.img[16] / 127.5f - 1.0f;
    ds.images[1] = (float)s.img[17] / 127.5f - 1.0f;
    check_synth_dataset(&ds, 5, 4, 6);
    ts_dataset_free(&ds);
    ts_dataset_free(&ds); /* twice is harmless */
    ts_dataset_free(NULL);
}

static void test_synthetic_uncompressed(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 3, 2, 5);
    synth_write(&s, "t10k", 0);
    ts_dataset_t ds;
    CHECK_OK(ts_fmnist_load(tu_temp_dir(), "test", &ds, err, sizeof err));
    check_synth_dataset(&ds, 3, 2, 5);
    ts_dataset_free(&ds);
    CHECK_OK(ts_fmnist_load(tu_temp_dir(), "t10k", &ds, err,
                            sizeof err)); /* the file prefix works too */
    assert_int_equal(ds.n, 3);
    ts_dataset_free(&ds);
}

static void test_gz_preferred_over_uncompressed(void **state) {
    (void)state;
    synth_t a, b;
    synth_make(&a, 2, 3, 3);
    synth_make(&b, 4, 3, 3);
    synth_write(&a, "train", 1);
    synth_write(&b, "train", 0);
    ts_dataset_t ds;
    CHECK_OK(ts_fmnist_load(tu_temp_dir(), "train", &ds, err, sizeof err));
    assert_int_equal(ds.n, 2);
    ts_dataset_free(&ds);
}

/* ---- synthetic files: refused ---------------------------------------------------------- */

static void test_missing_files(void **state) {
    (void)state;
    expect_load_error(TS_EIO, "apt-get install dataset-fashion-mnist");
    expect_load_error(TS_EIO, "train-images-idx3-ubyte.gz");
    /* images present, labels missing: the message names the labels file */
    synth_t s;
    synth_make(&s, 2, 2, 2);
    write_file("train-images-idx3-ubyte", s.img, s.img_len, 1);
    expect_load_error(TS_EIO, "train-labels-idx1-ubyte");
}

static void test_bad_arguments(void **state) {
    (void)state;
    ts_dataset_t ds;
    CHECK_RC(ts_fmnist_load(tu_temp_dir(), "../validation", &ds, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "../validation");
    CHECK_RC(ts_fmnist_load(tu_temp_dir(), "a/b", &ds, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_fmnist_load(tu_temp_dir(), "", &ds, err, sizeof err), TS_EINVAL);
    /* any other file prefix is looked for, and its absence named */
    CHECK_RC(ts_fmnist_load(tu_temp_dir(), "validation", &ds, err, sizeof err), TS_EIO);
    TU_CHECK_CONTAINS(err, "validation");
    CHECK_RC(ts_fmnist_load(tu_temp_dir(), NULL, &ds, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_fmnist_load(tu_temp_dir(), "train", NULL, err, sizeof err), TS_EINVAL);
    /* no err buffer: still a code, no crash */
    assert_int_equal(ts_fmnist_load(tu_temp_dir(), "train", &ds, NULL, 0), TS_EIO);
}

static void test_wrong_magic(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 2, 2, 2);
    put_be32(s.img, TS_FMNIST_MAGIC_LABELS); /* a label magic on the image file */
    synth_write(&s, "train", 1);
    expect_load_error(TS_ECORRUPT, "magic number is 0x00000801, expected 0x00000803");

    synth_make(&s, 2, 2, 2);
    put_be32(s.lab, 0x00000802);
    synth_write(&s, "train", 1);
    expect_load_error(TS_ECORRUPT, "labels-idx1-ubyte.gz: not an IDX label file");
}

static void test_truncated_header(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 2, 2, 2);
    write_file("train-images-idx3-ubyte", s.img, 10, 1);
    write_file("train-labels-idx1-ubyte", s.lab, s.lab_len, 1);
    expect_load_error(TS_ECORRUPT, "truncated: expected a 16-byte IDX header, got 10 bytes");
    write_file("train-images-idx3-ubyte", s.img, 0, 1); /* empty file */
    expect_load_error(TS_ECORRUPT, "got 0 bytes");
}

static void test_truncated_pixels(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 3, 4, 5); /* 60 bytes of pixels declared */
    write_file("train-images-idx3-ubyte", s.img, s.img_len - 10, 1);
    write_file("train-labels-idx1-ubyte", s.lab, s.lab_len, 1);
    expect_load_error(TS_ECORRUPT, "truncated: expected 60 bytes of pixels, got 50");
    write_file("train-images-idx3-ubyte", s.img, s.img_len - 10, 0); /* also uncompressed */
    unlink(tu_temp_path("train-images-idx3-ubyte.gz"));
    expect_load_error(TS_ECORRUPT, "truncated: expected 60 bytes of pixels, got 50");
}

static void test_truncated_labels(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 3, 4, 5);
    write_file("train-images-idx3-ubyte", s.img, s.img_len, 1);
    write_file("train-labels-idx1-ubyte", s.lab, s.lab_len - 1, 1);
    expect_load_error(TS_ECORRUPT, "truncated: expected 3 bytes of labels, got 2");
}

/* A header claiming 10^8 images of 4096×4096 must fail as truncated, not by asking for
 * petabytes. */
static void test_lying_header(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 2, 2, 2);
    put_be32(s.img + 4, TS_FMNIST_MAX_N);
    put_be32(s.img + 8, TS_FMNIST_MAX_DIM);
    put_be32(s.img + 12, TS_FMNIST_MAX_DIM);
    put_be32(s.lab + 4, TS_FMNIST_MAX_N);
    synth_write(&s, "train", 1);
    expect_load_error(TS_ECORRUPT, "truncated: expected 100000000 bytes of labels, got 2");
}

static void test_count_mismatch(void **state) {
    (void)state;
    synth_t s, t;
    synth_make(&s, 3, 2, 2);
    synth_make(&t, 2, 2, 2);
    write_file("train-images-idx3-ubyte", s.img, s.img_len, 1);
    write_file("train-labels-idx1-ubyte", t.lab, t.lab_len, 1);
    expect_load_error(TS_ECORRUPT, "holds 3 images but");
    expect_load_error(TS_ECORRUPT, "holds 2 labels");
}

static void test_trailing_bytes(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 2, 3, 3);
    memset(s.img + s.img_len, 0x55, 7);
    write_file("train-images-idx3-ubyte", s.img, s.img_len + 7, 1);
    write_file("train-labels-idx1-ubyte", s.lab, s.lab_len, 1);
    expect_load_error(TS_ECORRUPT, "7 trailing bytes after the declared 18 bytes of pixels");

    synth_make(&s, 2, 3, 3);
    s.lab[s.lab_len] = 1;
    write_file("train-images-idx3-ubyte", s.img, s.img_len, 0);
    write_file("train-labels-idx1-ubyte", s.lab, s.lab_len + 1, 0);
    unlink(tu_temp_path("train-images-idx3-ubyte.gz"));
    unlink(tu_temp_path("train-labels-idx1-ubyte.gz"));
    expect_load_error(TS_ECORRUPT, "1 trailing bytes after the declared 2 bytes of labels");
}

static void test_label_out_of_range(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 4, 2, 2);
    s.lab[8 + 2] = 10;
    synth_write(&s, "train", 1);
    expect_load_error(TS_ECORRUPT, "label 10 of item 2 is out of range (classes are 0..9)");
    int32_t *labels = (int32_t *)1;
    int n = 7;
    CHECK_RC(ts_fmnist_load_labels(tu_temp_dir(), "train", &labels, &n, err, sizeof err),
             TS_ECORRUPT);
    assert_null(labels);
    assert_int_equal(n, 0);
}

static void test_dims_out_of_range(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 2, 2, 2);
    put_be32(s.img + 8, 0);
    synth_write(&s, "train", 1);
    expect_load_error(TS_ECORRUPT, "image size 0×2 is out of range");

    synth_make(&s, 2, 2, 2);
    put_be32(s.img + 12, TS_FMNIST_MAX_DIM + 1);
    synth_write(&s, "train", 1);
    expect_load_error(TS_ECORRUPT, "image size 2×4097 is out of range");

    synth_make(&s, 2, 2, 2);
    put_be32(s.img + 4, 0);
    put_be32(s.lab + 4, 0);
    synth_write(&s, "train", 1);
    expect_load_error(TS_ECORRUPT, "item count 0 is out of range");

    put_be32(s.img + 4, TS_FMNIST_MAX_N + 1);
    put_be32(s.lab + 4, TS_FMNIST_MAX_N + 1);
    synth_write(&s, "train", 1);
    expect_load_error(TS_ECORRUPT, "item count 100000001 is out of range");
}

static void test_corrupt_gzip(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 20, 8, 8);
    synth_write(&s, "train", 1);
    size_t len;
    unsigned char *gz = tu_read_file(tu_temp_path("train-images-idx3-ubyte.gz"), &len);
    assert_true(len > 40);

    /* the gzip stream cut short: its end (and CRC) never arrive */
    write_file("train-images-idx3-ubyte.gz", gz, len / 2, 0);
    expect_load_error(TS_ECORRUPT, "train-images-idx3-ubyte.gz");

    /* a flipped bit in the CRC trailer: all pixels arrive, the stream's check fails */
    gz[len - 6] ^= 0x01;
    write_file("train-images-idx3-ubyte.gz", gz, len, 0);
    expect_load_error(TS_ECORRUPT, "corrupt gzip data");
    free(gz);
}

/* ---- subsets --------------------------------------------------------------------------- */

static void test_subset(void **state) {
    (void)state;
    synth_t s;
    synth_make(&s, 6, 3, 2);
    synth_write(&s, "train", 1);
    ts_dataset_t ds, sub;
    CHECK_OK(ts_fmnist_load(tu_temp_dir(), "train", &ds, err, sizeof err));

    const int32_t idx[] = {4, 0, 4, 5};
    CHECK_OK(ts_dataset_subset(&ds, idx, 4, &sub));
    assert_int_equal(sub.n, 4);
    assert_int_equal(sub.channels, 1);
    assert_int_equal(sub.height, 3);
    assert_int_equal(sub.width, 2);
    assert_int_equal(sub.num_classes, 10);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(sub.labels[i], ds.labels[idx[i]]);
        assert_memory_equal(sub.images + i * 6, ds.images + idx[i] * 6, 6 * sizeof(float));
    }
    assert_true(sub.images != ds.images); /* a copy */
    ts_dataset_free(&sub);

    CHECK_OK(ts_dataset_subset(&ds, NULL, 0, &sub)); /* empty */
    assert_int_equal(sub.n, 0);
    assert_null(sub.images);
    assert_null(sub.labels);

    const int32_t bad_hi[] = {0, 6};
    const int32_t bad_lo[] = {-1};
    memset(&sub, 0xab, sizeof sub);
    CHECK_RC(ts_dataset_subset(&ds, bad_hi, 2, &sub), TS_ERANGE);
    assert_null(sub.images);
    CHECK_RC(ts_dataset_subset(&ds, bad_lo, 1, &sub), TS_ERANGE);
    CHECK_RC(ts_dataset_subset(&ds, idx, -1, &sub), TS_EINVAL);
    CHECK_RC(ts_dataset_subset(&ds, NULL, 2, &sub), TS_EINVAL);
    CHECK_RC(ts_dataset_subset(NULL, idx, 1, &sub), TS_EINVAL);
    CHECK_RC(ts_dataset_subset(&ds, idx, 1, NULL), TS_EINVAL);
    CHECK_RC(ts_dataset_subset(&ds, idx, 1, &ds), TS_EINVAL);
    assert_int_equal(ds.n, 6); /* untouched by the aliasing attempt */
    ts_dataset_free(&ds);
}

/* ts_fmnist_write then ts_fmnist_load: the PNG quantisation of the images, the labels, the shape. */
static void test_idx_write_round_trip(void **state) {
    (void)state;
    enum { N = 37, H = 5, W = 3 };
    float img[N * H * W];
    int32_t lab[N];
    for (int i = 0; i < N * H * W; i++)
        img[i] = -1.2f + 2.4f * (float)((i * 7919) % 1000) / 999.0f; /* also outside [−1, 1] */
    img[4] = NAN;
    for (int i = 0; i < N; i++)
        lab[i] = (i * 3) % 10;
    CHECK_OK(
        ts_fmnist_write(tu_temp_dir(), "learned+prior_top1", img, lab, N, H, W, err, sizeof err));
    ts_dataset_t ds;
    CHECK_OK(ts_fmnist_load(tu_temp_dir(), "learned+prior_top1", &ds, err, sizeof err));
    assert_int_equal(ds.n, N);
    assert_int_equal(ds.height, H);
    assert_int_equal(ds.width, W);
    for (int i = 0; i < N; i++)
        assert_int_equal(ds.labels[i], lab[i]);
    for (int i = 0; i < N * H * W; i++) {
        float v = isnan(img[i]) ? -1.0f : img[i] < -1.0f ? -1.0f : img[i] > 1.0f ? 1.0f : img[i];
        int byte = (int)floorf((v + 1.0f) * 127.5f + 0.5f);
        assert_float_equal(ds.images[i], (float)byte / 127.5f - 1.0f, 0.0f);
    }
    ts_dataset_free(&ds);
    /* refusals: a prefix with a slash, a label that is not a byte */
    CHECK_RC(ts_fmnist_write(tu_temp_dir(), "../x", img, lab, N, H, W, err, sizeof err), TS_EINVAL);
    lab[3] = 300;
    CHECK_RC(ts_fmnist_write(tu_temp_dir(), "x", img, lab, N, H, W, err, sizeof err), TS_EINVAL);
    CHECK_RC(
        ts_fmnist_write("/nonexistent-dir", "x", img, (int32_t[N]){0}, N, H, W, err, sizeof err),
        TS_EIO);
}

#define DIR_TEST(f) cmocka_unit_test_setup_teardown(f, setup_dir, tu_teardown_temp_dir)

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_train),
        cmocka_unit_test(test_real_test),
        DIR_TEST(test_synthetic_gz),
        DIR_TEST(test_synthetic_uncompressed),
        DIR_TEST(test_gz_preferred_over_uncompressed),
        DIR_TEST(test_missing_files),
        DIR_TEST(test_bad_arguments),
        DIR_TEST(test_wrong_magic),
        DIR_TEST(test_truncated_header),
        DIR_TEST(test_truncated_pixels),
        DIR_TEST(test_truncated_labels),
        DIR_TEST(test_lying_header),
        DIR_TEST(test_count_mismatch),
        DIR_TEST(test_trailing_bytes),
        DIR_TEST(test_label_out_of_range),
        DIR_TEST(test_dims_out_of_range),
        DIR_TEST(test_corrupt_gzip),
        DIR_TEST(test_subset),
        DIR_TEST(test_idx_write_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
