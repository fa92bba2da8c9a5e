/*
 * test_base.c — the ground floor (base/): atomic file writes (the bytes and mode of a written
 * file, no temporary left behind by a success or by a dropped or failed write, the old file kept
 * when a write is dropped, a missing folder refused with its errno), the file question, the
 * clock, the string helpers and the error words.
 */
#define _POSIX_C_SOURCE 200809L

#include "tests/testutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/file.h"
#include "base/str.h"

static void check_content(const char *path, const char *want) {
    size_t len = 0;
    unsigned char *got = tu_read_file(path, &len);
    assert_non_null(got);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(got, want, len);
    free(got);
}

static void test_atomic_write(void **state) {
    (void)state;
    const char *path = tu_temp_path("a.txt");
    int e = -1;
    TU_CHECK_OK(ts_atomic_write(path, "first\n", 6, &e));
    assert_int_equal(e, 0);
    check_content(path, "first\n");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal(tu_count_files(tu_temp_dir()), 1); /* no temporary left */

    /* written through the FILE, then dropped: the old file stays, the temporary goes */
    ts_atomic_file_t a;
    TU_CHECK_OK(ts_atomic_open(&a, path, &e));
    assert_int_equal(tu_count_files(tu_temp_dir()), 2);
    fputs("second\n", a.fp);
    TU_CHECK_RC(ts_atomic_commit(&a, 0, &e), TS_EIO);
    check_content(path, "first\n");
    assert_int_equal(tu_count_files(tu_temp_dir()), 1);
    TU_CHECK_OK(ts_atomic_open(&a, path, &e));
    fputs("third\n", a.fp);
    ts_atomic_abort(&a);
    check_content(path, "first\n");
    assert_int_equal(tu_count_files(tu_temp_dir()), 1);
    TU_CHECK_OK(ts_atomic_open(&a, path, &e));
    fputs("fourth\n", a.fp);
    TU_CHECK_OK(ts_atomic_commit(&a, 1, &e));
    check_content(path, "fourth\n");
    assert_null(a.fp);
    assert_int_equal(tu_count_files(tu_temp_dir()), 1);

    /* a folder that does not exist: TS_EIO with ENOENT, nothing created; bad arguments */
    TU_CHECK_RC(ts_atomic_write(tu_temp_path("missing/b.txt"), "x", 1, &e), TS_EIO);
    assert_int_equal(e, ENOENT);
    TU_CHECK_RC(ts_atomic_write("", "x", 1, &e), TS_EINVAL);
    TU_CHECK_RC(ts_atomic_open(&a, NULL, &e), TS_EINVAL);
    assert_int_equal(tu_count_files(tu_temp_dir()), 1);
}

static void test_file_exists(void **state) {
    (void)state;
    const char *path = tu_temp_path("f");
    assert_false(ts_file_exists(path));
    TU_CHECK_OK(ts_atomic_write(path, "", 0, NULL));
    assert_true(ts_file_exists(path));
    assert_false(ts_file_exists(tu_temp_dir())); /* a folder is not a file */
    assert_false(ts_file_exists(NULL));
}

static void test_clock_and_strings(void **state) {
    (void)state;
    double a = ts_now_s(), b = ts_now_s();
    assert_true(a > 0.0 && b >= a);
    char *d = ts_dup_str("tessera");
    assert_non_null(d);
    assert_string_equal(d, "tessera");
    free(d);
    const unsigned char bytes[4] = {0x00, 0x0f, 0xa0, 0xff};
    char hex[9];
    ts_hex(bytes, 4, hex);
    assert_string_equal(hex, "000fa0ff");
    ts_hex(bytes, 0, hex);
    assert_string_equal(hex, "");
    assert_string_equal(ts_strerror(TS_OK), "success");
    assert_non_null(strstr(ts_strerror(TS_EIO), "I/O"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_atomic_write, tu_setup_temp_dir, tu_teardown_temp_dir),
        cmocka_unit_test_setup_teardown(test_file_exists, tu_setup_temp_dir, tu_teardown_temp_dir),
        cmocka_unit_test(test_clock_and_strings),
    };
    return cmocka_run_group_tests_name("base", tests, NULL, NULL);
}
