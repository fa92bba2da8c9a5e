/*
 * fwd_gemm.c — the fp32 forward products through oneDNN's sgemm (fwd_gemm.h).
 */
#include "kernels/cpu/fwd_gemm.h"
#include "kernels/cpu/vec.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TESSERA_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

/* libgomp's: oneDNN's sgemm runs on this thread's OpenMP team size. */
extern void omp_set_num_threads(int n);
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int use_onednn;
static char name[96] = "OpenBLAS";

static void decide(void) {
    const char *v = getenv("TESSERA_FWD_GEMM");
    if (!v || !*v || strcmp(v, "openblas") == 0)
        return;
    if (strcmp(v, "onednn") != 0) {
        fprintf(stderr, "TESSERA_FWD_GEMM=%s: want openblas or onednn; using OpenBLAS\n", v);
        return;
    }
#ifdef TESSERA_HAVE_DNNL
    use_onednn = 1;
    const dnnl_version_t *ver = dnnl_version();
    snprintf(name, sizeof name, "oneDNN %d.%d.%d sgemm, one call per item", ver->major,
             ver->minor, ver->patch);
#else
    fprintf(stderr, "TESSERA_FWD_GEMM=onednn: this build has no oneDNN (libdnnl-dev); using "
                    "OpenBLAS\n");
#endif
}

int ts_cpu_fwd_onednn(void) {
    pthread_once(&once, decide);
    return use_onednn;
}

const char *ts_cpu_fwd_gemm_name(void) {
    pthread_once(&once, decide);
    if (use_onednn)
        return name;
    /* the engines' loop table, as ts_cpu_engine_init picks it */
    const ts_cpu_vec_t *v = ts_cpu_vec_pick(getenv("TESSERA_CPU_ISA"));
    if (!v->lin)
        return name;
    return strcmp(v->name, "avx512") == 0 ? "register tiles, AVX-512 (kernels/cpu/lin_tile.c)"
                                          : "register tiles, AVX2 (kernels/cpu/lin_tile.c)";
}

void ts_cpu_onednn_sgemm_nt(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                            const float *B, int64_t ldb, float *C, int64_t ldc) {
#ifdef TESSERA_HAVE_DNNL
    static _Thread_local int one_thread;
    if (!one_thread) { /* the engine's workers are the threads: no OpenMP team beside them */
        omp_set_num_threads(1);
        one_thread = 1;
    }
    dnnl_sgemm('N', 'T', M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
#else
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc;
    abort(); /* unreachable: ts_cpu_fwd_onednn() is 0 without oneDNN */
#endif
}
