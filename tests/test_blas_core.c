/*
 * test_blas_core.c — which OpenBLAS kernels a CPU should run (kernels/cpu/blas_core.h), and what
 * this process runs.
 *
 * Made-up CPUs: the feature bits of real processors (a cloud Xeon with AVX-512 but no BF16, a
 * Cooper Lake, an AMD Zen 4, a Haswell, a Sandy Bridge, an old SSE3-only part, an AVX-512 CPU
 * whose OS does not save the zmm state) map to the kernel sets OpenBLAS has for them; the decision
 * re-executes only when the kernels are weaker and nobody chose them; a name the table does not
 * know changes nothing. Then this machine: the process's kernels are not weaker than its CPU
 * allows — the re-execution took (skipped with the reason where OpenBLAS cannot be told: the
 * user chose, or the library lacks the CPU's kernel set).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/blas_core.h"

static ts_cpu_isa_t sse3_only(void) { return (ts_cpu_isa_t){.sse3 = 1}; }

static ts_cpu_isa_t sandybridge(void) {
    ts_cpu_isa_t c = sse3_only();
    c.avx = c.os_ymm = 1;
    return c;
}

static ts_cpu_isa_t haswell(void) {
    ts_cpu_isa_t c = sandybridge();
    c.avx2 = c.fma = 1;
    return c;
}

/* "Intel(R) Xeon(R) Processor" on a cloud VM that OpenBLAS 0.3.21 does not recognise: AVX-512
 * F/CD/BW/DQ/VL, no BF16 */
static ts_cpu_isa_t cloud_xeon(void) {
    ts_cpu_isa_t c = haswell();
    c.os_zmm = c.avx512f = c.avx512cd = c.avx512bw = c.avx512dq = c.avx512vl = 1;
    return c;
}

/* Cooper Lake, and AMD Zen 4 (AVX-512 with BF16): the same bits for OpenBLAS */
static ts_cpu_isa_t cooperlake(void) {
    ts_cpu_isa_t c = cloud_xeon();
    c.avx512bf16 = 1;
    return c;
}

static void test_core_for(void **state) {
    (void)state;
    ts_cpu_isa_t none = {0}, c;
    assert_null(ts_blas_core_for(&none));
    assert_null(ts_blas_core_for(NULL));
    c = sse3_only();
    assert_string_equal(ts_blas_core_for(&c), "Prescott");
    c = sandybridge();
    assert_string_equal(ts_blas_core_for(&c), "Sandybridge");
    c = haswell();
    assert_string_equal(ts_blas_core_for(&c), "Haswell");
    c = cloud_xeon();
    assert_string_equal(ts_blas_core_for(&c), "SkylakeX");
    c = cooperlake();
    assert_string_equal(ts_blas_core_for(&c), "Cooperlake");
    /* the OS does not save the zmm state: AVX-512 would fault, AVX2 it is */
    c = cooperlake();
    c.os_zmm = 0;
    assert_string_equal(ts_blas_core_for(&c), "Haswell");
    /* nor the ymm state: SSE only */
    c = haswell();
    c.os_ymm = 0;
    assert_string_equal(ts_blas_core_for(&c), "Prescott");
    /* AVX-512 F alone (Knights Landing has no BW/VL): not SkylakeX's kernels */
    c = haswell();
    c.os_zmm = c.avx512f = c.avx512cd = 1;
    assert_string_equal(ts_blas_core_for(&c), "Haswell");
    /* AVX2 without FMA: not Haswell's */
    c = haswell();
    c.fma = 0;
    assert_string_equal(ts_blas_core_for(&c), "Sandybridge");
}

static void test_tiers(void **state) {
    (void)state;
    assert_int_equal(ts_blas_core_tier("Prescott"), 1);
    assert_int_equal(ts_blas_core_tier("Sandybridge"), 2);
    assert_int_equal(ts_blas_core_tier("Haswell"), 3);
    assert_int_equal(ts_blas_core_tier("Zen"), 3);
    assert_int_equal(ts_blas_core_tier("SKYLAKEX"), 4);
    assert_int_equal(ts_blas_core_tier("Cooperlake"), 4);
    assert_int_equal(ts_blas_core_tier("Neoverse N1"), -1);
    assert_int_equal(ts_blas_core_tier(""), -1);
    assert_int_equal(ts_blas_core_tier(NULL), -1);
}

static void test_decide(void **state) {
    (void)state;
    const char *want = NULL;
    ts_cpu_isa_t c = cloud_xeon();
    /* that VM: OpenBLAS fell back to Prescott on an AVX-512 CPU */
    assert_int_equal(ts_blas_decide("Prescott", &c, NULL, NULL, &want), TS_BLAS_REEXEC);
    assert_string_equal(want, "SkylakeX");
    /* the user chose, or forbade the re-execution, or it already happened: said, not changed */
    assert_int_equal(ts_blas_decide("Prescott", &c, "Prescott", NULL, &want), TS_BLAS_WEAKER);
    assert_int_equal(ts_blas_decide("Prescott", &c, NULL, "0", &want), TS_BLAS_WEAKER);
    assert_int_equal(ts_blas_decide("Prescott", &c, NULL, "1", &want), TS_BLAS_REEXEC);
    /* an empty OPENBLAS_CORETYPE is no choice */
    assert_int_equal(ts_blas_decide("Prescott", &c, "", NULL, &want), TS_BLAS_REEXEC);
    /* AMD Zen 4 under 0.3.21: Haswell (its "Zen" set) where Cooperlake runs */
    c = cooperlake();
    assert_int_equal(ts_blas_decide("Haswell", &c, NULL, NULL, &want), TS_BLAS_REEXEC);
    assert_string_equal(want, "Cooperlake");
    assert_int_equal(ts_blas_decide("Zen", &c, NULL, NULL, &want), TS_BLAS_REEXEC);
    /* as strong, or stronger (SkylakeX on a Cooper Lake: the same sgemm): kept */
    assert_int_equal(ts_blas_decide("Cooperlake", &c, NULL, NULL, &want), TS_BLAS_KEEP);
    assert_int_equal(ts_blas_decide("SkylakeX", &c, NULL, NULL, &want), TS_BLAS_KEEP);
    c = haswell();
    assert_int_equal(ts_blas_decide("Haswell", &c, NULL, NULL, &want), TS_BLAS_KEEP);
    assert_int_equal(ts_blas_decide("Zen", &c, NULL, NULL, &want), TS_BLAS_KEEP);
    /* names or CPUs the table cannot judge: nothing done */
    assert_int_equal(ts_blas_decide("NeoverseV1", &c, NULL, NULL, &want), TS_BLAS_UNKNOWN);
    ts_cpu_isa_t none = {0};
    assert_int_equal(ts_blas_decide("Prescott", &none, NULL, NULL, &want), TS_BLAS_UNKNOWN);
    assert_null(want);
}

/* This process: its kernels are not weaker than the CPU allows, or the reason it cannot be so. */
static void test_this_process(void **state) {
    (void)state;
    ts_blas_status_t s;
    ts_blas_status(&s);
    char line[512];
    ts_blas_describe(&s, line, sizeof line);
    print_message("  %s\n", line);
    assert_true(s.core[0] != '\0');
    assert_non_null(strstr(line, s.core));
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *no = getenv("TESSERA_BLAS_REEXEC");
    if (no && strcmp(no, "0") == 0) { /* forbidden: OpenBLAS's own choice, said as such */
        assert_null(getenv("TESSERA_BLAS_FROM"));
        if (!(user && *user))
            assert_string_equal(s.chosen_by, "OpenBLAS");
        if (s.weaker)
            assert_non_null(strstr(line, "OPENBLAS_CORETYPE="));
        return;
    }
    const char *as_detected = getenv("TESSERA_BLAS_TEST_AS_DETECTED");
    const char *mark = getenv("TESSERA_BLAS_FROM"); /* "FROM:TO" after a re-execution */
    char from_buf[32] = "";
    const char *from = NULL;
    if (mark) {
        const char *colon = strchr(mark, ':');
        assert_non_null(colon);
        assert_string_equal(colon + 1, user ? user : "");
        snprintf(from_buf, sizeof from_buf, "%.*s", (int)(colon - mark), mark);
        from = from_buf;
    }
    if (as_detected && strcmp(as_detected, "1") == 0 && s.cpu_best[0]) {
        /* a weak set loaded on purpose (OPENBLAS_CORETYPE below the CPU's best): the process
         * must be the second run, started with the CPU's set, and say so */
        if (!from)
            assert_true(ts_blas_core_tier(user) >= ts_blas_core_tier(s.cpu_best));
        else {
            print_message("  re-executed: OpenBLAS had %s, now %s\n", from, s.core);
            assert_true(ts_blas_core_tier(from) < ts_blas_core_tier(s.cpu_best));
            assert_string_equal(user, s.cpu_best);
            assert_non_null(strstr(s.chosen_by, "tessera"));
            assert_non_null(strstr(s.chosen_by, from));
        }
    }
    if (!s.weaker)
        return;
    if ((user && *user && !from) || (no && strcmp(no, "0") == 0)) {
        print_message("  skipped: the kernels were chosen by the environment (%s)\n", s.chosen_by);
        skip();
    }
    if (from) {
        assert_true(s.missing);
        assert_non_null(strstr(line, "does not provide"));
        print_message("  skipped: tessera asked OpenBLAS for %s and got %s: this build of OpenBLAS "
                      "lacks the CPU's kernel set\n",
                      s.cpu_best, s.core);
        skip();
    }
    fail_msg("the kernels are weaker than the CPU allows and nothing re-executed: %s", line);
}

/* The marker of a re-execution counts only while OPENBLAS_CORETYPE still holds what tessera set:
 * a child whose OPENBLAS_CORETYPE the user changed is the user's choice. (The process's own
 * kernels are not touched: OpenBLAS read its variable long ago.) */
static void test_marker(void **state) {
    (void)state;
    char *keep_type = getenv("OPENBLAS_CORETYPE") ? strdup(getenv("OPENBLAS_CORETYPE")) : NULL;
    char *keep_mark = getenv("TESSERA_BLAS_FROM") ? strdup(getenv("TESSERA_BLAS_FROM")) : NULL;
    char *keep_test = getenv("TESSERA_BLAS_TEST_AS_DETECTED")
                          ? strdup(getenv("TESSERA_BLAS_TEST_AS_DETECTED"))
                          : NULL;
    unsetenv("TESSERA_BLAS_TEST_AS_DETECTED");
    ts_blas_status_t s;
    setenv("OPENBLAS_CORETYPE", "Cooperlake", 1);
    setenv("TESSERA_BLAS_FROM", "Prescott:Cooperlake", 1);
    ts_blas_status(&s);
    assert_string_equal(s.chosen_by, "tessera (OpenBLAS chose Prescott on this CPU)");
    setenv("OPENBLAS_CORETYPE", "Haswell", 1); /* changed since: the user's */
    ts_blas_status(&s);
    assert_string_equal(s.chosen_by, "OPENBLAS_CORETYPE=Haswell, set by the user");
    setenv("TESSERA_BLAS_FROM", "garbage", 1); /* no TO: not a marker */
    ts_blas_status(&s);
    assert_string_equal(s.chosen_by, "OPENBLAS_CORETYPE=Haswell, set by the user");
    if (keep_type)
        setenv("OPENBLAS_CORETYPE", keep_type, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
    if (keep_mark)
        setenv("TESSERA_BLAS_FROM", keep_mark, 1);
    else
        unsetenv("TESSERA_BLAS_FROM");
    if (keep_test)
        setenv("TESSERA_BLAS_TEST_AS_DETECTED", keep_test, 1);
    free(keep_type);
    free(keep_mark);
    free(keep_test);
}

/* The description names the fix when the kernels are weaker. */
static void test_describe(void **state) {
    (void)state;
    ts_blas_status_t s = {
        .core = "Prescott", .cpu_best = "SkylakeX", .chosen_by = "OpenBLAS", .weaker = 1};
    char line[512];
    ts_blas_describe(&s, line, sizeof line);
    assert_non_null(strstr(line, "OPENBLAS_CORETYPE=SkylakeX"));
    assert_non_null(strstr(line, "weaker"));
    s.missing = 1; /* asked for and not given: the fix is another OpenBLAS build */
    ts_blas_describe(&s, line, sizeof line);
    assert_non_null(strstr(line, "does not provide"));
    assert_null(strstr(line, "run with OPENBLAS_CORETYPE"));
    s.missing = 0;
    s.weaker = 0;
    snprintf(s.core, sizeof s.core, "SkylakeX");
    ts_blas_describe(&s, line, sizeof line);
    assert_null(strstr(line, "weaker"));
    assert_non_null(strstr(line, "OpenBLAS SkylakeX kernels"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_core_for), cmocka_unit_test(test_tiers),
        cmocka_unit_test(test_decide),   cmocka_unit_test(test_describe),
        cmocka_unit_test(test_marker),   cmocka_unit_test(test_this_process),
    };
    return cmocka_run_group_tests_name("blas_core", tests, NULL, NULL);
}
