/*
 * blas_core.h — which GEMM kernels OpenBLAS runs, against which the CPU could run.
 *
 * Debian's OpenBLAS is built with DYNAMIC_ARCH: when it loads, it reads the CPU's identity and
 * picks one of its kernel sets ("cores": Prescott, Sandybridge, Haswell, SkylakeX, Cooperlake …).
 * A CPU it does not recognise — a cloud VM that names itself "Intel(R) Xeon(R) Processor", an
 * AMD Zen 4 that 0.3.21 maps to its AVX2 kernels — gets a weaker set than its instructions allow,
 * at a quarter of the speed on the worst of them, and nothing says so. OpenBLAS reads
 * OPENBLAS_CORETYPE only as it loads, so a process that finds its kernels weaker than its CPU
 * allows executes itself again, once, with OPENBLAS_CORETYPE set to the set that matches the CPU
 * (a constructor in blas_core.c, before main) — unless the user set OPENBLAS_CORETYPE, or set
 * TESSERA_BLAS_REEXEC=0. Every binary that links the CPU engine does this, daemons and tests alike.
 * TESSERA_BLAS_FROM, set for the second run, holds "FROM:TO" — what OpenBLAS chose first, what
 * tessera set — and stops a third run while OPENBLAS_CORETYPE still holds TO (children inherit it);
 * TESSERA_BLAS_TEST_AS_DETECTED=1, for tests only, takes OPENBLAS_CORETYPE as OpenBLAS's own
 * detection rather than the user's choice, so that a test can load a weak set on purpose.
 *
 * The pieces are pure functions of their inputs, so that the decision is tested with made-up CPUs
 * (tests/test_blas_core.c); ts_blas_status reads this machine.
 */
#ifndef TS_KERNELS_CPU_BLAS_CORE_H
#define TS_KERNELS_CPU_BLAS_CORE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the CPU can run, as far as OpenBLAS's kernel sets care: cpuid's feature bits, and whether
 * the operating system saves the wider registers (XGETBV), without which the instructions fault. */
typedef struct ts_cpu_isa {
    int sse3, avx, fma, avx2;
    int avx512f, avx512cd, avx512bw, avx512dq, avx512vl, avx512bf16;
    int os_ymm, os_zmm; /* XCR0: the OS saves the ymm (AVX) and the zmm/opmask (AVX-512) state */
} ts_cpu_isa_t;

/* This CPU's features (cpuid and XGETBV; all zero off x86-64). */
void ts_cpu_isa_read(ts_cpu_isa_t *out);

/* The strongest OpenBLAS kernel set isa runs: "Cooperlake" (AVX-512 with BF16), "SkylakeX"
 * (AVX-512 F, CD, BW, DQ and VL), "Haswell" (AVX2 and FMA), "Sandybridge" (AVX), "Prescott"
 * (SSE3), or NULL (not even SSE3: leave OpenBLAS's choice alone). */
const char *ts_blas_core_for(const ts_cpu_isa_t *isa);

/* How strong an OpenBLAS kernel set is: 4 AVX-512, 3 AVX2 + FMA (Haswell, Zen, Excavator),
 * 2 AVX (Sandybridge, Bulldozer, Piledriver, Steamroller), 1 SSE (Prescott, Core2, Nehalem,
 * Barcelona, Atom, …); -1 for a name this table does not know (case is ignored). */
int ts_blas_core_tier(const char *name);

/* What to do at start-up. */
typedef enum {
    TS_BLAS_KEEP = 0,    /* OpenBLAS's choice is as strong as the CPU allows */
    TS_BLAS_REEXEC = 1,  /* weaker: run again with OPENBLAS_CORETYPE = *want */
    TS_BLAS_WEAKER = 2,  /* weaker, but the user chose (OPENBLAS_CORETYPE or TESSERA_BLAS_REEXEC=0)
                          * or a re-execution already happened: say so, change nothing */
    TS_BLAS_UNKNOWN = 3, /* a core name or a CPU this table cannot judge */
} ts_blas_action_t;

/* The decision for a process whose OpenBLAS chose core, on a CPU with isa. user_coretype: the
 * environment's OPENBLAS_CORETYPE (NULL when unset); reexec: TESSERA_BLAS_REEXEC (NULL when
 * unset; "0" forbids). *want (may be NULL) gets the kernel set the CPU allows. */
ts_blas_action_t ts_blas_decide(const char *core, const ts_cpu_isa_t *isa,
                                const char *user_coretype, const char *reexec, const char **want);

/* This process's kernels, for logs, selfcheck, status and metrics. */
typedef struct ts_blas_status {
    char core[32];       /* what OpenBLAS runs now (openblas_get_corename) */
    char cpu_best[32];   /* what the CPU allows (ts_blas_core_for), "" when unknown */
    char chosen_by[128]; /* "OpenBLAS", "OPENBLAS_CORETYPE=X, set by the user", or "tessera
                          * (OpenBLAS chose Haswell on this CPU)" after a re-execution */
    int weaker;          /* 1 when core is weaker than cpu_best */
    int missing;         /* 1 when tessera asked OpenBLAS for cpu_best and did not get it */
} ts_blas_status_t;

void ts_blas_status(ts_blas_status_t *out);

/* One line for a log or selfcheck: "OpenBLAS Cooperlake kernels (tessera chose them: OpenBLAS
 * picked Haswell on this CPU)", or with the fix when they are weaker than the CPU allows. */
void ts_blas_describe(const ts_blas_status_t *s, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
