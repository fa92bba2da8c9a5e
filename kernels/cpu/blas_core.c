/* blas_core.c — OpenBLAS's kernel set against the CPU's, and the re-execution that fixes a weak
 * choice before main (see blas_core.h). */
#define _GNU_SOURCE /* setenv, execv of /proc/self/exe */
#include "kernels/cpu/blas_core.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TS_X86 1
#endif

/* The environment variable that marks a re-execution: it holds the core OpenBLAS chose first. */
#define FROM_ENV "TESSERA_BLAS_FROM"
/* Tests only: OPENBLAS_CORETYPE is taken as what OpenBLAS detected, not as the user's choice. */
#define TEST_ENV "TESSERA_BLAS_TEST_AS_DETECTED"

void ts_cpu_isa_read(ts_cpu_isa_t *out) {
    memset(out, 0, sizeof *out);
#ifdef TS_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    out->sse3 = (c >> 0) & 1;
    out->fma = (c >> 12) & 1;
    out->avx = (c >> 28) & 1;
    int osxsave = (c >> 27) & 1;
    if (osxsave) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        out->os_ymm = (lo & 0x6u) == 0x6u;
        out->os_zmm = out->os_ymm && (lo & 0xe0u) == 0xe0u;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        out->avx2 = (b >> 5) & 1;
        out->avx512f = (b >> 16) & 1;
        out->avx512dq = (b >> 17) & 1;
        out->avx512cd = (b >> 28) & 1;
        out->avx512bw = (b >> 30) & 1;
        out->avx512vl = (b >> 31) & 1;
        unsigned max_sub = a;
        if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
            out->avx512bf16 = (a >> 5) & 1;
    }
#endif
}

const char *ts_blas_core_for(const ts_cpu_isa_t *isa) {
    if (!isa)
        return NULL;
    int avx = isa->avx && isa->os_ymm;
    int avx512 = avx && isa->os_zmm && isa->avx512f && isa->avx512cd && isa->avx512bw &&
                 isa->avx512dq && isa->avx512vl;
    if (avx512 && isa->avx512bf16)
        return "Cooperlake";
    if (avx512)
        return "SkylakeX";
    if (avx && isa->avx2 && isa->fma)
        return "Haswell";
    if (avx)
        return "Sandybridge";
    if (isa->sse3)
        return "Prescott";
    return NULL;
}

int ts_blas_core_tier(const char *name) {
    static const struct {
        const char *name;
        int tier;
    } cores[] = {
        {"cooperlake", 4}, {"skylakex", 4},    {"sapphirerapids", 4}, {"haswell", 3},
        {"zen", 3},        {"excavator", 3},   {"sandybridge", 2},    {"bulldozer", 2},
        {"piledriver", 2}, {"steamroller", 2}, {"prescott", 1},       {"core2", 1},
        {"penryn", 1},     {"dunnington", 1},  {"nehalem", 1},        {"atom", 1},
        {"barcelona", 1},  {"opteron", 1},     {"opteron(sse3)", 1},  {"bobcat", 1},
        {"nano", 1},       {"athlon", 1},      {"katmai", 1},         {"coppermine", 1},
        {"northwood", 1},  {"banias", 1},      {"yonah", 1},
    };
    for (size_t i = 0; name && i < sizeof cores / sizeof cores[0]; i++)
        if (strcasecmp(name, cores[i].name) == 0)
            return cores[i].tier;
    return -1;
}

ts_blas_action_t ts_blas_decide(const char *core, const ts_cpu_isa_t *isa,
                                const char *user_coretype, const char *reexec, const char **want) {
    const char *best = ts_blas_core_for(isa);
    if (want)
        *want = best;
    int have = ts_blas_core_tier(core), could = ts_blas_core_tier(best);
    if (have < 0 || could < 0)
        return TS_BLAS_UNKNOWN;
    if (have >= could)
        return TS_BLAS_KEEP;
    if ((user_coretype && *user_coretype) || (reexec && strcmp(reexec, "0") == 0))
        return TS_BLAS_WEAKER;
    return TS_BLAS_REEXEC;
}

static void copy(char *dst, size_t len, const char *src) {
    snprintf(dst, len, "%s", src ? src : "");
}

void ts_blas_status(ts_blas_status_t *out) {
    memset(out, 0, sizeof *out);
    ts_cpu_isa_t isa;
    ts_cpu_isa_read(&isa);
    copy(out->core, sizeof out->core, openblas_get_corename());
    copy(out->cpu_best, sizeof out->cpu_best, ts_blas_core_for(&isa));
    const char *user = getenv("OPENBLAS_CORETYPE"), *from = getenv(FROM_ENV);
    const char *as_detected = getenv(TEST_ENV);
    if (as_detected && strcmp(as_detected, "1") == 0 && !(from && *from))
        user = NULL; /* a test's stand-in for OpenBLAS's own choice */
    if (user && *user && from && *from)
        snprintf(out->chosen_by, sizeof out->chosen_by, "tessera (OpenBLAS chose %s on this CPU)",
                 from);
    else if (user && *user)
        snprintf(out->chosen_by, sizeof out->chosen_by, "OPENBLAS_CORETYPE=%s, set by the user",
                 user);
    else
        copy(out->chosen_by, sizeof out->chosen_by, "OpenBLAS");
    int have = ts_blas_core_tier(out->core), could = ts_blas_core_tier(out->cpu_best);
    out->weaker = have >= 0 && could >= 0 && have < could;
}

void ts_blas_describe(const ts_blas_status_t *s, char *buf, size_t len) {
    if (s->weaker)
        snprintf(buf, len,
                 "OpenBLAS %s kernels (chosen by %s), weaker than this CPU's %s: run with "
                 "OPENBLAS_CORETYPE=%s, or unset OPENBLAS_CORETYPE and TESSERA_BLAS_REEXEC so "
                 "that tessera sets it",
                 s->core, s->chosen_by, s->cpu_best, s->cpu_best);
    else
        snprintf(buf, len, "OpenBLAS %s kernels (chosen by %s%s%s)", s->core, s->chosen_by,
                 s->cpu_best[0] ? "; the CPU's best: " : "", s->cpu_best);
}

/* Before main: when OpenBLAS (already loaded: it is a dependency, so its constructor ran first)
 * chose weaker kernels than the CPU runs, execute this program again, same arguments and
 * environment plus OPENBLAS_CORETYPE. Once: the new process finds OPENBLAS_CORETYPE set and keeps
 * whatever it got. glibc passes main's arguments to constructors. A failed exec changes nothing
 * but the environment, which is put back: the process goes on with the weaker kernels, and
 * ts_blas_status says so. */
#if defined(__linux__) && defined(__GLIBC__)
__attribute__((constructor)) static void blas_reexec(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc < 1 || !argv || !argv[0] || getenv(FROM_ENV)) /* once: this is the second run */
        return;
    ts_cpu_isa_t isa;
    ts_cpu_isa_read(&isa);
    const char *want = NULL;
    /* TESSERA_BLAS_TEST_AS_DETECTED=1 (tests only): take OPENBLAS_CORETYPE as OpenBLAS's own
     * choice, so that a test can load a weak set and watch the re-execution replace it */
    const char *user = getenv("OPENBLAS_CORETYPE"), *as_detected = getenv(TEST_ENV);
    if (as_detected && strcmp(as_detected, "1") == 0)
        user = NULL;
    ts_blas_action_t a =
        ts_blas_decide(openblas_get_corename(), &isa, user, getenv("TESSERA_BLAS_REEXEC"), &want);
    if (a != TS_BLAS_REEXEC || !want)
        return;
    char from[32];
    copy(from, sizeof from, openblas_get_corename());
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0 || setenv(FROM_ENV, from, 1) != 0)
        return;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(FROM_ENV);
}
#endif
