/*
 * test_cuda_blas.c — cuBLAS is opened on first use, not at start-up (kernels/backend.h,
 * ts_cuda_blas_load): in a CUDA build a process has no libcublas mapped until the call, then has
 * it, every function resolved, and a second call answers the same; in a build without CUDA the
 * call says so. No GPU is needed: opening the library does not touch a device.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "kernels/engine.h"

/* Whether /proc/self/maps maps a file whose name contains name. */
static int mapped(const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, name) != NULL;
    fclose(f);
    return found;
}

static void test_opened_on_first_use(void **state) {
    (void)state;
    char err[512] = "";
    if (!ts_cuda_built()) {
        assert_int_equal(ts_cuda_blas_load(err, sizeof err), TS_ENODEV);
        TU_CHECK_CONTAINS(err, "no CUDA backend");
        return;
    }
    assert_false(mapped("libcublas")); /* not at start-up */
    TU_CHECK_RC_MSG(ts_cuda_blas_load(err, sizeof err), TS_OK, err);
    assert_true(mapped("libcublas.so"));
    assert_true(mapped("libcublasLt.so")); /* what made start-up slow */
    TU_CHECK_RC_MSG(ts_cuda_blas_load(err, sizeof err), TS_OK, err);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_opened_on_first_use)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
