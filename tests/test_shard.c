/*
 * test_shard.c — shard files (model/shard.h): round trip, comments, blank lines and CRLF,
 * duplicates, out of range and garbage lines reported with their line number, atomic writes.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/shard.h"
#include "tests/testutil.h"

#define CHECK_RC(expr, want) TU_CHECK_RC_MSG(expr, want, err)
#define CHECK_OK(expr) CHECK_RC(expr, TS_OK)

static char err[512]; /* the error sentence of the last call, printed by CHECK_RC */

/* Each test gets a fresh temporary folder (tu_temp_dir) and an empty err. */
static int setup_dir(void **state) {
    err[0] = '\0';
    return tu_setup_temp_dir(state);
}

static void write_text(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tu_temp_dir(), name);
    tu_write_file(path, text, strlen(text));
}

static int count_temp_files(void) {
    DIR *d = opendir(tu_temp_dir());
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static void test_shard_round_trip(void **state) {
    (void)state;
    const int32_t idx[] = {17, 0, 5, 59999, 3};
    const char *path = tu_temp_path("shard0.txt");
    CHECK_OK(ts_shard_write(path, idx, 5, err, sizeof err));
    int32_t *got;
    int n;
    CHECK_OK(ts_shard_read(path, &got, &n, 60000, err, sizeof err));
    assert_int_equal(n, 5);
    assert_memory_equal(got, idx, sizeof idx); /* file order is kept */
    free(got);

    /* overwriting replaces the file whole and leaves no temporary behind */
    const int32_t idx2[] = {1, 2};
    CHECK_OK(ts_shard_write(path, idx2, 2, err, sizeof err));
    CHECK_OK(ts_shard_read(path, &got, &n, 3, err, sizeof err));
    assert_int_equal(n, 2);
    assert_memory_equal(got, idx2, sizeof idx2);
    free(got);
    assert_int_equal(count_temp_files(), 0);

    /* the limit applies on reading: 59999 is out of range of a 10000-item split */
    CHECK_OK(ts_shard_write(path, idx, 5, err, sizeof err));
    CHECK_RC(ts_shard_read(path, &got, &n, 10000, err, sizeof err), TS_ERANGE);
    TU_CHECK_CONTAINS(err, "index 59999 is out of range");

    /* empty shard */
    CHECK_OK(ts_shard_write(path, NULL, 0, err, sizeof err));
    CHECK_OK(ts_shard_read(path, &got, &n, 10, err, sizeof err));
    assert_int_equal(n, 0);
    assert_null(got);
}

static void test_shard_write_refuses(void **state) {
    (void)state;
    const char *path = tu_temp_path("bad.txt");
    const int32_t dup[] = {3, 1, 3};
    const int32_t neg[] = {3, -1};
    CHECK_RC(ts_shard_write(path, dup, 3, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "index 3 appears twice");
    CHECK_RC(ts_shard_write(path, neg, 2, err, sizeof err), TS_EINVAL);
    TU_CHECK_CONTAINS(err, "negative");
    CHECK_RC(ts_shard_write(path, NULL, 1, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_shard_write(NULL, dup, 1, err, sizeof err), TS_EINVAL);
    assert_int_equal(access(path, F_OK), -1); /* nothing was written */
    CHECK_RC(ts_shard_write(tu_temp_path("no/such/folder.txt"), dup, 1, err, sizeof err), TS_EIO);
    assert_int_equal(count_temp_files(), 0);
}

static void test_shard_comments_and_blanks(void **state) {
    (void)state;
    write_text("s.txt", "# shard 0 of 8\n\n  3  \n4 # four\r\n\t\n# 99\n7");
    int32_t *got;
    int n;
    CHECK_OK(ts_shard_read(tu_temp_path("s.txt"), &got, &n, 8, err, sizeof err));
    assert_int_equal(n, 3);
    assert_int_equal(got[0], 3);
    assert_int_equal(got[1], 4);
    assert_int_equal(got[2], 7);
    free(got);
}

/* Each bad text must fail with code want and a message naming line `line`. */
static void expect_shard_error(const char *text, int limit, int want, const char *needle) {
    write_text("s.txt", text);
    static int32_t sentinel;
    int32_t *got = &sentinel; /* must be reset to NULL */
    int n = 42;
    err[0] = '\0';
    CHECK_RC(ts_shard_read(tu_temp_path("s.txt"), &got, &n, limit, err, sizeof err), want);
    TU_CHECK_CONTAINS(err, needle);
    assert_null(got);
    assert_int_equal(n, 0);
}

static void test_shard_errors(void **state) {
    (void)state;
    expect_shard_error("1\n2\n\n1\n", 10, TS_ECORRUPT,
                       "s.txt:4: index 1 appears twice (first on line 1)");
    expect_shard_error("5\n0\n5\n0\n", 10, TS_ECORRUPT, ":3: index 5 appears twice");
    expect_shard_error("1\n20\n", 20, TS_ERANGE, "s.txt:2: index 20 is out of range");
    expect_shard_error("99999999999999999999999999\n", 20, TS_ERANGE,
                       ":1: index 99999999999999999999999999 is out of range");
    expect_shard_error("0\n", 0, TS_ERANGE, ":1: index 0 is out of range");
    expect_shard_error("1\n2\nabc\n", 10, TS_ECORRUPT,
                       "s.txt:3: expected one non-negative decimal index, got \"abc\"");
    expect_shard_error("-1\n", 10, TS_ECORRUPT, ":1: expected");
    expect_shard_error("+1\n", 10, TS_ECORRUPT, ":1: expected");
    expect_shard_error("3x\n", 10, TS_ECORRUPT, ":1: expected");
    expect_shard_error("1\n0x10\n", 100, TS_ECORRUPT, ":2: expected");
    expect_shard_error("1 2\n", 10, TS_ECORRUPT, ":1: expected");
    expect_shard_error("1.5\n", 10, TS_ECORRUPT, ":1: expected");

    int32_t *got;
    int n;
    CHECK_RC(ts_shard_read(tu_temp_path("absent.txt"), &got, &n, 10, err, sizeof err), TS_EIO);
    TU_CHECK_CONTAINS(err, "absent.txt");
    CHECK_RC(ts_shard_read(tu_temp_path("s.txt"), &got, &n, -1, err, sizeof err), TS_EINVAL);
    CHECK_RC(ts_shard_read(tu_temp_path("s.txt"), NULL, &n, 10, err, sizeof err), TS_EINVAL);
}

/* A long file of one repeated index is rejected quickly (the duplicate check is not
 * quadratic) and names the second line. */
static void test_shard_many_duplicates(void **state) {
    (void)state;
    const int lines = 200000;
    char *text = malloc((size_t)lines * 2 + 1);
    assert_non_null(text);
    for (int i = 0; i < lines; i++) {
        text[2 * i] = '0';
        text[2 * i + 1] = '\n';
    }
    text[2 * lines] = '\0';
    expect_shard_error(text, 1000000, TS_ECORRUPT, ":2: index 0 appears twice (first on line 1)");
    free(text);
}

#define DIR_TEST(f) cmocka_unit_test_setup_teardown(f, setup_dir, tu_teardown_temp_dir)

int main(void) {
    const struct CMUnitTest tests[] = {
        DIR_TEST(test_shard_round_trip),          DIR_TEST(test_shard_write_refuses),
        DIR_TEST(test_shard_comments_and_blanks), DIR_TEST(test_shard_errors),
        DIR_TEST(test_shard_many_duplicates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
