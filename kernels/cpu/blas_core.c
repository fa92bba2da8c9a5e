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

/* The environment variable that marks a re-execution: "FROM:TO", the core OpenBLAS chose first and
 * the one tessera set. */
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

/* The marker of a re-execution, "FROM:TO" (what OpenBLAS chose, what tessera set), is this
 * process's (or an ancestor's: children inherit the environment) when OPENBLAS_CORETYPE still
 * holds TO; *from (32 bytes) gets FROM. Anything else — no marker, or an OPENBLAS_CORETYPE
 * changed since — is not. */
static int marked(const char *coretype, char *from) {
    const char *m = getenv(FROM_ENV), *colon = m ? strchr(m, ':') : NULL;
    if (!colon || !coretype || strcasecmp(colon + 1, coretype) != 0)
        return 0;
    size_t n = (size_t)(colon - m) < 31 ? (size_t)(colon - m) : 31;
    memcpy(from, m, n);
    from[n] = '\0';
    return 1;
}

void ts_blas_status(ts_blas_status_t *out) {
    memset(out, 0, sizeof *out);
    ts_cpu_isa_t isa;
    ts_cpu_isa_read(&isa);
    copy(out->core, sizeof out->core, openblas_get_corename());
    copy(out->cpu_best, sizeof out->cpu_best, ts_blas_core_for(&isa));
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *as_detected = getenv(TEST_ENV);
    char from[32] = "";
    int ours = marked(user, from);
    if (as_detected && strcmp(as_detected, "1") == 0 && !ours)
        user = NULL; /* a test's stand-in for OpenBLAS's own choice */
    if (ours)
        snprintf(out->chosen_by, sizeof out->chosen_by, "tessera (OpenBLAS chose %s on this CPU)",
                 from);
    else if (user && *user)
        snprintf(out->chosen_by, sizeof out->chosen_by, "OPENBLAS_CORETYPE=%s, set by the user",
                 user);
    else
        copy(out->chosen_by, sizeof out->chosen_by, "OpenBLAS");
    int have = ts_blas_core_tier(out->core), could = ts_blas_core_tier(out->cpu_best);
    out->weaker = have >= 0 && could >= 0 && have < could;
    /* asked for and not given: this OpenBLAS build lacks the set (or ignores the variable) */
    out->missing = out->weaker && ours;
}

void ts_blas_describe(const ts_blas_status_t *s, char *buf, size_t len) {
    if (s->missing)
        snprintf(buf, len,
                 "OpenBLAS %s kernels, weaker than this CPU's %s: tessera asked this OpenBLAS for "
                 "%s and it does not provide them (a build without DYNAMIC_ARCH or without that "
                 "set): install Debian's libopenblas0-pthread",
                 s->core, s->cpu_best, s->cpu_best);
    else if (s->weaker)
        snprintf(buf, len,
                 "OpenBLAS %s kernels (chosen by %s), weaker than this CPU's %s: run with "
                 "OPENBLAS_CORETYPE=%s, or unset OPENBLAS_CORETYPE and TESSERA_BLAS_REEXEC so "
                 "that tessera sets it",
                 s->core, s->chosen_by, s->cpu_best, s->cpu_best);
    else
        snprintf(buf, len, "OpenBLAS %s kernels (chosen by %s%s%s)", s->core, s->chosen_by,
                 s->cpu_best[0] ? "; the CPU's best: " : "", s->cpu_best);
}

/* Whether re-executing would escape a tool watching this process: a debugger or tracer (TracerPid
 * in /proc/self/status), or valgrind, under which /proc/self/exe is valgrind's own tool. */
static int watched(void) {
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return 1; /* no way back to this program */
    exe[n] = '\0';
    if (strstr(exe, "valgrind") || strstr(exe, "-linux") == exe + n - 6)
        return 1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[128];
    int pid = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "TracerPid: %d", &pid) == 1)
            break;
    fclose(f);
    return pid != 0;
}

/* Before main: when OpenBLAS (already loaded: it is a dependency, so its constructor ran first)
 * chose weaker kernels than the CPU runs, execute this program again, same arguments, same PID,
 * with OPENBLAS_CORETYPE set and the marker FROM:TO. Once: the new process (and its children,
 * which inherit both) finds its OPENBLAS_CORETYPE marked and keeps whatever it got. Not under a
 * debugger, a tracer or valgrind (the new image would escape them). glibc passes main's arguments
 * to constructors. A failed exec puts the environment back: the process goes on with the weaker
 * kernels, and ts_blas_status says so. */
#if defined(__linux__) && defined(__GLIBC__)
__attribute__((constructor)) static void blas_reexec(int argc, char **argv, char **envp) {
    (void)envp;
    char from[32];
    const char *user = getenv("OPENBLAS_CORETYPE");
    if (argc < 1 || !argv || !argv[0] || marked(user, from)) /* the second run, or its child */
        return;
    ts_cpu_isa_t isa;
    ts_cpu_isa_read(&isa);
    const char *want = NULL;
    /* TESSERA_BLAS_TEST_AS_DETECTED=1 (tests only): take OPENBLAS_CORETYPE as OpenBLAS's own
     * choice, so that a test can load a weak set and watch the re-execution replace it */
    const char *as_detected = getenv(TEST_ENV);
    if (as_detected && strcmp(as_detected, "1") == 0)
        user = NULL;
    ts_blas_action_t a =
        ts_blas_decide(openblas_get_corename(), &isa, user, getenv("TESSERA_BLAS_REEXEC"), &want);
    if (a != TS_BLAS_REEXEC || !want || watched())
        return;
    char prev[64], mark[80];
    const char *had = getenv("OPENBLAS_CORETYPE");
    int had_prev = had != NULL;
    copy(prev, sizeof prev, had);
    snprintf(mark, sizeof mark, "%.31s:%.31s", openblas_get_corename(), want);
    if (setenv("OPENBLAS_CORETYPE", want, 1) != 0 || setenv(FROM_ENV, mark, 1) != 0)
        return;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    if (had_prev)
        setenv("OPENBLAS_CORETYPE", prev, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
    unsetenv(FROM_ENV);
}
#endif
