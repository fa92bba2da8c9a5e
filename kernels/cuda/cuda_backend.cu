/*
 * cuda_backend.cu — the CUDA engine: its context, device memory, and the GEMMs on cuBLAS (fp32,
 * and bf16 or f16 with fp32 accumulation).
 *
 * An engine owns one ts_cuda_ctx: the device ordinal, one CUDA stream, a cuBLAS handle bound to
 * that stream, and a small device scratch buffer the reductions in cuda_ops.cu use for their
 * per-block partial results. Every op is queued on the stream and returns without waiting;
 * ts_cuda_engine_sync waits.
 *
 * Why the stream is a *blocking* stream (cudaStreamDefault, not cudaStreamNonBlocking):
 * ts_tensor_copy moves data with ts_cuda_memcpy, which knows no engine and runs on the legacy
 * default stream. A blocking stream synchronises with the legacy stream, so a copy to the host
 * sees every kernel queued before it, and a kernel queued after a host-to-device copy sees the
 * copied data, without the tensor layer having to know which engine wrote what.
 *
 * cuBLAS is not linked: it is opened (dlopen) when the first CUDA engine starts. Loading
 * libcublas, and the cublasLt it brings, runs ~0.4 s of static initialisation in every process
 * that links it, GPU or not, so every tessera command and tesserad start paid that on a CUDA
 * build; now only a process that makes a CUDA engine does. ts_cuda_blas_load says what failed.
 *
 * What this file is not: the per-op kernels (cuda_ops.cu) and argument checking (kernels/ops.c;
 * everything arriving here is already validated). Errors never abort: a CUDA runtime failure is
 * TS_ECUDA, a cuBLAS failure TS_ECUBLAS.
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <dlfcn.h>
#include <pthread.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "kernels/backend.h"

#ifndef TS_CUBLAS_SONAME
#error "TS_CUBLAS_SONAME (the cuBLAS library's file name, e.g. libcublas.so.13) must be defined"
#endif

/* ---- cuBLAS, opened on first use ---------------------------------------------------------- */

/* cublasGemmEx and cublasGemmStridedBatchedEx have C++ overloads (cudaDataType compute types):
 * the pointer types name the library's own entry points, checked against the header below. */
typedef cublasStatus_t (*gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                     int, const void *, const void *, cudaDataType, int,
                                     const void *, cudaDataType, int, const void *, void *,
                                     cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
typedef cublasStatus_t (*gemm_sb_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                        int, int, const void *, const void *, cudaDataType, int,
                                        long long, const void *, cudaDataType, int, long long,
                                        const void *, void *, cudaDataType, int, long long, int,
                                        cublasComputeType_t, cublasGemmAlgo_t);
static_assert(sizeof(static_cast<gemm_ex_fn>(cublasGemmEx)) > 0, "cublasGemmEx's signature");
static_assert(sizeof(static_cast<gemm_sb_ex_fn>(cublasGemmStridedBatchedEx)) > 0,
              "cublasGemmStridedBatchedEx's signature");

/* The functions used, by the names the library exports (cublas_v2.h maps cublasCreate and the
 * others to their _v2 entry points). decltype and the casts above are unevaluated: nothing here
 * makes the linker want libcublas. */
static struct {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSetAtomicsMode) set_atomics_mode;
    decltype(&cublasSgemm_v2) sgemm;
    decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
    gemm_ex_fn gemm_ex;
    gemm_sb_ex_fn gemm_strided_batched_ex;
    decltype(&cublasSetWorkspace_v2) set_workspace; /* NULL where the library lacks it */
} g_blas;
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static int g_blas_rc = TS_ECUBLAS;
static char g_blas_err[512];

/* Resolves name in h into *fn; 0 when it is missing (the sentence says which). */
static int blas_sym(void *h, const char *name, void **fn) {
    *fn = dlsym(h, name);
    if (!*fn)
        snprintf(g_blas_err, sizeof g_blas_err,
                 "%s has no %s (a cuBLAS older than the toolkit "
                 "tessera was built with?)",
                 TS_CUBLAS_SONAME, name);
    return *fn != NULL;
}

static void blas_open(void) {
    /* the loader's own search first (LD_LIBRARY_PATH, the binary's run path, ld.so.cache), then
     * the folder the build found cuBLAS in */
    void *h = dlopen(TS_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef TS_CUBLAS_DIR
    if (!h)
        h = dlopen(TS_CUBLAS_DIR "/" TS_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h) {
        const char *why = dlerror();
        snprintf(g_blas_err, sizeof g_blas_err,
                 "cannot open %s (%s): install the CUDA toolkit's cuBLAS, or put its folder on "
                 "LD_LIBRARY_PATH",
                 TS_CUBLAS_SONAME, why ? why : "not found");
        return;
    }
    if (blas_sym(h, "cublasCreate_v2", (void **)&g_blas.create) &&
        blas_sym(h, "cublasDestroy_v2", (void **)&g_blas.destroy) &&
        blas_sym(h, "cublasSetStream_v2", (void **)&g_blas.set_stream) &&
        blas_sym(h, "cublasSetMathMode", (void **)&g_blas.set_math_mode) &&
        blas_sym(h, "cublasSetAtomicsMode", (void **)&g_blas.set_atomics_mode) &&
        blas_sym(h, "cublasSgemm_v2", (void **)&g_blas.sgemm) &&
        blas_sym(h, "cublasSgemmStridedBatched", (void **)&g_blas.sgemm_strided_batched) &&
        blas_sym(h, "cublasGemmEx", (void **)&g_blas.gemm_ex) &&
        blas_sym(h, "cublasGemmStridedBatchedEx", (void **)&g_blas.gemm_strided_batched_ex)) {
        g_blas_rc = TS_OK; /* h stays open for the life of the process */
        g_blas.set_workspace = (decltype(g_blas.set_workspace))dlsym(h, "cublasSetWorkspace_v2");
    } else
        dlclose(h);
}

int ts_cuda_blas_load(char *err, size_t errlen) {
    pthread_once(&g_blas_once, blas_open);
    if (g_blas_rc != TS_OK && err && errlen)
        snprintf(err, errlen, "%s", g_blas_err);
    return g_blas_rc;
}

/* ---- cuBLASLt, opened on first use (the 16-bit linears' bias and bias+GELU epilogues) ------- */

static struct {
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtMatmul) matmul;
} g_lt;
static pthread_once_t g_lt_once = PTHREAD_ONCE_INIT;
static int g_lt_ok;

static void lt_open(void) {
#ifdef TS_CUBLASLT_SONAME
    void *h = dlopen(TS_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef TS_CUBLAS_DIR
    if (!h)
        h = dlopen(TS_CUBLAS_DIR "/" TS_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h)
        return;
    struct {
        const char *name;
        void **fn;
    } syms[] = {{"cublasLtCreate", (void **)&g_lt.create},
                {"cublasLtDestroy", (void **)&g_lt.destroy},
                {"cublasLtMatmulDescCreate", (void **)&g_lt.desc_create},
                {"cublasLtMatmulDescDestroy", (void **)&g_lt.desc_destroy},
                {"cublasLtMatmulDescSetAttribute", (void **)&g_lt.desc_set},
                {"cublasLtMatrixLayoutCreate", (void **)&g_lt.layout_create},
                {"cublasLtMatrixLayoutDestroy", (void **)&g_lt.layout_destroy},
                {"cublasLtMatmulPreferenceCreate", (void **)&g_lt.pref_create},
                {"cublasLtMatmulPreferenceDestroy", (void **)&g_lt.pref_destroy},
                {"cublasLtMatmulPreferenceSetAttribute", (void **)&g_lt.pref_set},
                {"cublasLtMatmulAlgoGetHeuristic", (void **)&g_lt.heuristic},
                {"cublasLtMatmul", (void **)&g_lt.matmul}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].fn = dlsym(h, syms[i].name))) {
            dlclose(h);
            return;
        }
    g_lt_ok = 1; /* h stays open for the life of the process */
#endif
}

/* What a cuBLASLt product's epilogue does: the bias into an fp32 output (a linear's), or the
 * bias, GELU and the rounding into a 16-bit output (fc1's, when nothing reads its input again). */
typedef enum { LT_BIAS, LT_GELU } lt_kind_t;

/* One shape's cuBLASLt product with an epilogue: its descriptors and the algorithm the
 * heuristic chose, for the operands' alignment. */
#define LT_PLANS 64
typedef struct lt_plan {
    int used; /* 0 free, 1 a plan, 2 a shape cuBLASLt has no algorithm for (nothing held) */
    ts_dtype_t lp;
    lt_kind_t kind;
    int bias_lp; /* the bias vector in lp (else fp32) */
    int64_t M, N, K;
    unsigned align;      /* the bytes every matrix's address (A, B, C) is a multiple of, ≤ 16 */
    unsigned bias_align; /* the bias's (the heuristic reads its pointer: keyed apart) */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan_t;

#define LT_WORKSPACE_BYTES ((size_t)32 << 20)

struct ts_cuda_ctx {
    int device;            /* CUDA device ordinal */
    cudaStream_t stream;   /* every op of the engine is queued here */
    cublasHandle_t blas;   /* bound to stream; fp32 products, pedantic math */
    cublasHandle_t blas16; /* bound to stream; bf16 and f16 products, default math (tensor cores) */
    /* both handles' workspace (cublasSetWorkspace, set again after every cublasSetStream, which
     * drops it): without one, cuBLAS allocates its own inside every captured graph; NULL where
     * it could not be made (cuBLAS then uses its default pool) */
    void *blas_ws;
    size_t blas_ws_bytes;
    void *scratch; /* device memory one op at a time (stream order): reduction partials
                            * and the non-finite counter (cuda_ops.cu), GroupNorm's split
                            * statistics (cuda_image.cu) */
    size_t scratch_bytes;
    uint16_t *lp16; /* the bf16 and f16 products' rounded operands; grows on demand */
    size_t lp16_elems;
    int cc_major, cc_minor; /* compute capability */
    int zero_lp_out; /* TESSERA_CUDA_INITCHECK=1: gemm_ex zeroes C before a beta = 0 product */
    /* the 16-bit linears' bias in cuBLASLt's epilogue (ts_cuda_set_epilogues; the environment's
     * TESSERA_CUDA_EPILOGUES=1 at the engine's start): 1 on, 0 off, −1 off because cuBLASLt
     * could not be opened or started */
    int epilogues;
    cublasLtHandle_t lt;
    void *lt_ws; /* LT_WORKSPACE_BYTES, made with the handle */
    lt_plan_t plans[LT_PLANS];
    int lt_next;       /* the plan slot the next new shape takes */
    int64_t lt_calls;  /* products that ran with the epilogue */
    /* CUDA graphs: a capture runs on cap, a non-blocking stream of the engine's own (a blocking
     * stream under capture would fail every other thread's legacy-stream copy), with the
     * engine's stream kept in home until the capture ends */
    cudaStream_t cap, home;
};

/* Room for 1024 double partial sums and a 64-bit counter, with slack; or GroupNorm's two
 * statistics' TS_GN_MAX_PARTIALS partials each (the whole buffer). Nothing in it outlives its op. */
#define TS_CUDA_SCRATCH_BYTES ((size_t)16384)

/* Shared with cuda_ops.cu, which declares it too (the backend has no private header): makes the
 * engine's device current on the calling thread (an engine may be driven from a thread other
 * than the one that created it) and returns its stream and scratch buffer. */
int ts_cuda_ctx_enter(ts_engine_t *e, cudaStream_t *stream, void **scratch, size_t *scratch_bytes);
/* The engine's device's compute capability (shared with cuda_flash.cu, which needs sm_80). */
int ts_cuda_compute_capability(ts_engine_t *e, int *major, int *minor);
/* db (N) += dout's column sums and dout16 = dout rounded to lp, in one pass (cuda_ops.cu). */
int ts_cuda_bias_grad_lp(ts_engine_t *e, float *db, uint16_t *dout16, ts_dtype_t lp,
                         const float *dout, int64_t rows, int64_t N);
/* softmax_forward of inp (rows, C) into out, and out16 = out rounded to lp as it is written, in
 * one kernel (cuda_ops.cu). */
int ts_cuda_softmax_forward_lp_copy(ts_engine_t *e, float *out, uint16_t *out16, ts_dtype_t lp,
                                    const float *inp, int64_t rows, int64_t C);

int ts_cuda_compute_capability(ts_engine_t *e, int *major, int *minor) {
    if (!e || !e->cuda || !major || !minor)
        return TS_EINVAL;
    *major = e->cuda->cc_major;
    *minor = e->cuda->cc_minor;
    return TS_OK;
}

int ts_cuda_ctx_enter(ts_engine_t *e, cudaStream_t *stream, void **scratch, size_t *scratch_bytes) {
    if (!e || !e->cuda)
        return TS_EINVAL;
    ts_cuda_ctx_t *ctx = e->cuda;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess)
        return TS_ECUDA;
    if (current != ctx->device && cudaSetDevice(ctx->device) != cudaSuccess)
        return TS_ECUDA;
    *stream = ctx->stream;
    if (scratch)
        *scratch = ctx->scratch;
    if (scratch_bytes)
        *scratch_bytes = ctx->scratch_bytes;
    return TS_OK;
}

/* ---- engine ---------------------------------------------------------------------------- */

static void lt_plan_free(lt_plan_t *p) {
    if (p->used != 1) {
        p->used = 0;
        return;
    }
    g_lt.layout_destroy(p->a);
    g_lt.layout_destroy(p->b);
    g_lt.layout_destroy(p->c);
    g_lt.desc_destroy(p->desc);
    p->used = 0;
}

static void ctx_destroy(ts_cuda_ctx_t *ctx) {
    if (!ctx)
        return;
    cudaSetDevice(ctx->device);
    if (ctx->stream)
        cudaStreamSynchronize(ctx->stream);
    for (int i = 0; i < LT_PLANS; i++)
        lt_plan_free(&ctx->plans[i]);
    if (ctx->lt)
        g_lt.destroy(ctx->lt);
    if (ctx->lt_ws)
        cudaFree(ctx->lt_ws);
    if (ctx->cap)
        cudaStreamDestroy(ctx->cap);
    if (ctx->scratch)
        cudaFree(ctx->scratch);
    if (ctx->lp16)
        cudaFree(ctx->lp16);
    if (ctx->blas)
        g_blas.destroy(ctx->blas);
    if (ctx->blas16)
        g_blas.destroy(ctx->blas16);
    if (ctx->blas_ws)
        cudaFree(ctx->blas_ws);
    if (ctx->stream)
        cudaStreamDestroy(ctx->stream);
    free(ctx);
}

static int blas_onto(ts_cuda_ctx_t *ctx, cudaStream_t s);

int ts_cuda_engine_init(ts_engine_t *e, int gpu) {
    if (!e)
        return TS_EINVAL;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
        cudaGetLastError(); /* clear the error so later calls do not report it */
        return TS_ENODEV;
    }
    if (gpu < 0 || gpu >= count)
        return TS_ENODEV;

    ts_cuda_ctx_t *ctx = (ts_cuda_ctx_t *)calloc(1, sizeof *ctx);
    if (!ctx)
        return TS_ENOMEM;
    ctx->device = gpu;
    int err = TS_ECUDA;
    if (cudaSetDevice(gpu) != cudaSuccess)
        goto fail;
    if (cudaStreamCreateWithFlags(&ctx->stream, cudaStreamDefault) != cudaSuccess)
        goto fail; /* blocking stream: see the comment at the top */
    if (cudaMalloc(&ctx->scratch, TS_CUDA_SCRATCH_BYTES) != cudaSuccess) {
        ctx->scratch = NULL;
        err = TS_ENOMEM;
        goto fail;
    }
    ctx->scratch_bytes = TS_CUDA_SCRATCH_BYTES;

    err = TS_ECUBLAS;
    if (ts_cuda_blas_load(NULL, 0) != TS_OK || g_blas.create(&ctx->blas) != CUBLAS_STATUS_SUCCESS) {
        ctx->blas = NULL;
        goto fail;
    }
    if (g_blas.set_stream(ctx->blas, ctx->stream) != CUBLAS_STATUS_SUCCESS)
        goto fail;
    /* F32 stays F32: the CPU backend computes every product in binary32 and the parity test
     * holds the two backends to a normalised error of 1e-6, which TF32 tensor cores (10-bit
     * mantissa) would not meet. Pedantic math asks cuBLAS for the prescribed precision in every
     * phase of the GEMM (no TF32, no emulation, no reduced-precision reductions), where
     * CUBLAS_DEFAULT_MATH only promises "at least" F32. DEFAULT would also avoid TF32 and may
     * be a little faster: switch to it here if GEMM speed ever matters more than parity. */
    if (g_blas.set_math_mode(ctx->blas, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS)
        goto fail;
    /* Deterministic GEMMs: no atomics-based algorithms (this is cuBLAS's default; stated here). */
    if (g_blas.set_atomics_mode(ctx->blas, CUBLAS_ATOMICS_NOT_ALLOWED) != CUBLAS_STATUS_SUCCESS)
        goto fail;
    /* The bf16 and f16 products have their own handle on the same stream: default math lets
     * cuBLAS take the tensor cores for 16-bit inputs with fp32 accumulation (CUBLAS_COMPUTE_32F),
     * which the pedantic mode of the fp32 handle would forbid. */
    if (g_blas.create(&ctx->blas16) != CUBLAS_STATUS_SUCCESS) {
        ctx->blas16 = NULL;
        goto fail;
    }
    if (g_blas.set_stream(ctx->blas16, ctx->stream) != CUBLAS_STATUS_SUCCESS ||
        g_blas.set_math_mode(ctx->blas16, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
        g_blas.set_atomics_mode(ctx->blas16, CUBLAS_ATOMICS_NOT_ALLOWED) != CUBLAS_STATUS_SUCCESS)
        goto fail;
    err = TS_ECUDA;
    if (cudaDeviceGetAttribute(&ctx->cc_major, cudaDevAttrComputeCapabilityMajor, gpu) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&ctx->cc_minor, cudaDevAttrComputeCapabilityMinor, gpu) !=
            cudaSuccess)
        goto fail;
    /* cuBLAS's own workspace for both handles, of the size cuBLAS's documentation recommends
     * (cublasSetWorkspace: 32 MiB on Hopper, 4 MiB before); without it the library would
     * allocate inside each captured graph. Where it cannot be had, the handles keep cuBLAS's
     * default pool: nothing else changes. */
    ctx->blas_ws_bytes = (size_t)(ctx->cc_major >= 9 ? 32 : 4) << 20;
    if (g_blas.set_workspace && cudaMalloc(&ctx->blas_ws, ctx->blas_ws_bytes) != cudaSuccess) {
        cudaGetLastError();
        ctx->blas_ws = NULL;
    }
    if (ctx->blas_ws && blas_onto(ctx, ctx->stream) != TS_OK) {
        cudaFree(ctx->blas_ws);
        ctx->blas_ws = NULL;
        if (blas_onto(ctx, ctx->stream) != TS_OK) { /* (back to cuBLAS's own pool) */
            err = TS_ECUBLAS;
            goto fail;
        }
    }

    {
        /* compute-sanitizer's initcheck does not see what cuBLAS's bf16 products write (a
         * product into fresh memory, then a kernel reading it, is reported as a read of memory
         * nobody wrote; its fp32 products are seen). Under initcheck, scripts/gpu-check.sh sets
         * this so that those outputs are first written by a memset the tool does see, and any
         * other unwritten read still shows. It costs one memset per 16-bit product. */
        const char *v = getenv("TESSERA_CUDA_INITCHECK");
        ctx->zero_lp_out = v && v[0] == '1' && v[1] == '\0';
        v = getenv("TESSERA_CUDA_EPILOGUES");
        ctx->epilogues = v && v[0] == '1' && v[1] == '\0';
    }
    e->cuda = ctx;
    e->gpu = gpu;
    return TS_OK;

fail:
    ctx_destroy(ctx);
    cudaGetLastError();
    return err;
}

void ts_cuda_engine_free(ts_engine_t *e) {
    if (!e || !e->cuda)
        return;
    ctx_destroy(e->cuda);
    e->cuda = NULL;
}

int ts_cuda_engine_sync(ts_engine_t *e) {
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    return cudaStreamSynchronize(stream) == cudaSuccess ? TS_OK : TS_ECUDA;
}

/* ---- memory ---------------------------------------------------------------------------- */

int ts_cuda_malloc(void **p, size_t bytes) {
    if (!p)
        return TS_EINVAL;
    *p = NULL;
    if (bytes == 0)
        return TS_OK;
    cudaError_t rc = cudaMalloc(p, bytes);
    if (rc != cudaSuccess) {
        *p = NULL;
        cudaGetLastError();
        return rc == cudaErrorMemoryAllocation ? TS_ENOMEM : TS_ECUDA;
    }
    return TS_OK;
}

void ts_cuda_free(void *p) {
    if (p)
        cudaFree(p); /* synchronises the device, so no queued kernel still uses p */
}

int ts_cuda_memcpy(void *dst, ts_device_t dst_dev, const void *src, ts_device_t src_dev,
                   size_t bytes) {
    if (bytes == 0)
        return TS_OK;
    if (!dst || !src)
        return TS_EINVAL;
    cudaMemcpyKind kind;
    if (dst_dev == TS_CUDA && src_dev == TS_CUDA)
        kind = cudaMemcpyDeviceToDevice;
    else if (dst_dev == TS_CUDA)
        kind = cudaMemcpyHostToDevice;
    else if (src_dev == TS_CUDA)
        kind = cudaMemcpyDeviceToHost;
    else
        kind = cudaMemcpyHostToHost;
    /* cudaMemcpy runs on the legacy default stream, ordered after every blocking stream's
     * queued work (the engines' streams are blocking). */
    if (cudaMemcpy(dst, src, bytes, kind) != cudaSuccess)
        return TS_ECUDA;
    /* A device-to-device cudaMemcpy may return before it is done; the contract is "blocks". */
    if (kind == cudaMemcpyDeviceToDevice && cudaStreamSynchronize(0) != cudaSuccess)
        return TS_ECUDA;
    return TS_OK;
}

int ts_cuda_host_alloc(void **p, size_t bytes) {
    if (!p)
        return TS_EINVAL;
    *p = NULL;
    if (bytes == 0)
        return TS_ERANGE;
    /* without a device the driver gives none: the caller falls back to ordinary memory */
    if (cudaHostAlloc(p, bytes, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        return TS_ENODEV;
    }
    return TS_OK;
}

void ts_cuda_host_free(void *p) {
    if (p)
        cudaFreeHost(p);
}

int ts_cuda_built(void) { return 1; }

/* ---- events: spans on the device's timeline -------------------------------------------------- */

int ts_cuda_event_record(ts_engine_t *e, void **ev) {
    if (!ev)
        return TS_EINVAL;
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    if (!*ev) {
        cudaEvent_t made; /* a waiting thread sleeps rather than spins (ts_engine_mark_wait) */
        if (cudaEventCreateWithFlags(&made, cudaEventBlockingSync) != cudaSuccess) {
            cudaGetLastError();
            return TS_ECUDA;
        }
        *ev = (void *)made;
    }
    return cudaEventRecord((cudaEvent_t)*ev, stream) == cudaSuccess ? TS_OK : TS_ECUDA;
}

int ts_cuda_event_elapsed(ts_engine_t *e, void *a, void *b, double *seconds) {
    if (!a || !b || !seconds)
        return TS_EINVAL;
    *seconds = 0.0;
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    float ms = 0.0f;
    if (cudaEventSynchronize((cudaEvent_t)b) != cudaSuccess ||
        cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b) != cudaSuccess) {
        cudaGetLastError();
        return TS_ECUDA;
    }
    *seconds = ms / 1e3;
    return TS_OK;
}

int ts_cuda_event_wait(ts_engine_t *e, void *ev) {
    if (!ev)
        return TS_EINVAL;
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL); /* this thread on the event's device */
    if (err)
        return err;
    if (cudaEventSynchronize((cudaEvent_t)ev) != cudaSuccess) {
        cudaGetLastError();
        return TS_ECUDA;
    }
    return TS_OK;
}

int ts_cuda_memcpy_async(ts_engine_t *e, void *dst, ts_device_t dst_dev, const void *src,
                         ts_device_t src_dev, size_t bytes) {
    if (bytes == 0)
        return TS_OK;
    if (!dst || !src)
        return TS_EINVAL;
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    cudaMemcpyKind kind = dst_dev == TS_CUDA && src_dev == TS_CUDA ? cudaMemcpyDeviceToDevice
                          : dst_dev == TS_CUDA                     ? cudaMemcpyHostToDevice
                          : src_dev == TS_CUDA                     ? cudaMemcpyDeviceToHost
                                                                   : cudaMemcpyHostToHost;
    if (cudaMemcpyAsync(dst, src, bytes, kind, stream) != cudaSuccess) {
        cudaGetLastError();
        return TS_ECUDA;
    }
    return TS_OK;
}

void ts_cuda_event_free(void *ev) {
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
}

/* ---- CUDA graphs: a stream's work captured once, launched as one ----------------------------- */

/* Both cuBLAS handles onto stream s, with the engine's workspace (cublasSetStream drops it). One
 * buffer serves both: their products are ordered on the one stream (a graph captured on the
 * capture stream is launched on the engine's). */
static int blas_onto(ts_cuda_ctx_t *ctx, cudaStream_t s) {
    cublasHandle_t hs[2] = {ctx->blas, ctx->blas16};
    for (int i = 0; i < 2; i++) {
        if (g_blas.set_stream(hs[i], s) != CUBLAS_STATUS_SUCCESS)
            return TS_ECUBLAS;
        if (ctx->blas_ws &&
            g_blas.set_workspace(hs[i], ctx->blas_ws, ctx->blas_ws_bytes) != CUBLAS_STATUS_SUCCESS)
            return TS_ECUBLAS;
    }
    return TS_OK;
}

/* The ops queued from here until capture_end go to the capture stream (ts_cuda_ctx_enter gives
 * it, the cuBLAS handles are bound to it) and are recorded, not run. */
int ts_cuda_capture_begin(ts_engine_t *e) {
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    ts_cuda_ctx_t *ctx = e->cuda;
    if (ctx->home)
        return TS_EINVAL; /* a capture is already under way */
    if (!ctx->cap && cudaStreamCreateWithFlags(&ctx->cap, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        ctx->cap = NULL;
        return TS_ECUDA;
    }
    if ((err = blas_onto(ctx, ctx->cap)) != TS_OK) {
        blas_onto(ctx, ctx->stream);
        return err;
    }
    if (cudaStreamBeginCapture(ctx->cap, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        blas_onto(ctx, ctx->stream);
        return TS_ECUDA;
    }
    ctx->home = ctx->stream;
    ctx->stream = ctx->cap;
    return TS_OK;
}

int ts_cuda_capture_end(ts_engine_t *e, void **exec) {
    if (!exec)
        return TS_EINVAL;
    *exec = NULL;
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    ts_cuda_ctx_t *ctx = e->cuda;
    if (!ctx->home)
        return TS_EINVAL; /* no capture under way */
    cudaGraph_t graph = NULL;
    /* ends the capture whatever happened during it (an invalidated capture ends with an error
     * and no graph), then the engine's stream is its own again */
    cudaError_t rc = cudaStreamEndCapture(ctx->cap, &graph);
    ctx->stream = ctx->home;
    ctx->home = NULL;
    if ((err = blas_onto(ctx, ctx->stream)) != TS_OK) {
        if (graph)
            cudaGraphDestroy(graph);
        return err;
    }
    if (rc != cudaSuccess || !graph) {
        cudaGetLastError();
        if (graph)
            cudaGraphDestroy(graph);
        return TS_ECUDA;
    }
    cudaGraphExec_t made = NULL;
    rc = cudaGraphInstantiate(&made, graph, 0);
    cudaGraphDestroy(graph); /* the executable graph keeps what it needs */
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return TS_ECUDA;
    }
    *exec = (void *)made;
    return TS_OK;
}

int ts_cuda_graph_launch(ts_engine_t *e, void *exec) {
    if (!exec)
        return TS_EINVAL;
    cudaStream_t stream;
    int err = ts_cuda_ctx_enter(e, &stream, NULL, NULL);
    if (err)
        return err;
    if (cudaGraphLaunch((cudaGraphExec_t)exec, stream) != cudaSuccess) {
        cudaGetLastError();
        return TS_ECUDA;
    }
    return TS_OK;
}

void ts_cuda_graph_free(void *exec) {
    if (exec)
        cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

/* ---- utilisation (NVML, opened at run time) ----------------------------------------------- */

/* NVML comes with the driver (libnvidia-ml.so.1), not with the toolkit: it is opened when first
 * asked for, so a build or a machine without it loses only this reading. The few entry points
 * used are declared here with NVML's documented signatures (nvml.h is not needed to build). */
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_pci_fn)(const char *, void **);
typedef int (*nvml_util_fn)(void *, unsigned int *);

static struct {
    pthread_once_t once;
    int ok;
    nvml_by_pci_fn by_pci;
    nvml_util_fn util;
} g_nvml = {PTHREAD_ONCE_INIT, 0, NULL, NULL};

static void nvml_open(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    nvml_init_fn init = (nvml_init_fn)dlsym(h, "nvmlInit_v2");
    g_nvml.by_pci = (nvml_by_pci_fn)dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    /* nvmlUtilization_t is {unsigned gpu, memory}: read into two unsigned ints */
    g_nvml.util = (nvml_util_fn)dlsym(h, "nvmlDeviceGetUtilizationRates");
    g_nvml.ok = init && g_nvml.by_pci && g_nvml.util && init() == 0; /* NVML_SUCCESS */
}

int ts_cuda_utilization(int gpu, double *ratio) {
    if (!ratio)
        return TS_EINVAL;
    *ratio = 0.0;
    pthread_once(&g_nvml.once, nvml_open);
    if (!g_nvml.ok)
        return TS_ENOTSUP;
    /* NVML numbers devices its own way: find this CUDA ordinal by its PCI bus id */
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, gpu) != cudaSuccess) {
        cudaGetLastError();
        return TS_ENODEV;
    }
    void *dev = NULL;
    unsigned int rates[2] = {0, 0};
    int rc = g_nvml.by_pci(bus, &dev);
    if (rc == 0)
        rc = g_nvml.util(dev, rates);
    if (rc == 3 || rc == 4) /* NVML_ERROR_NOT_SUPPORTED (MIG, some boards), _NO_PERMISSION */
        return TS_ENOTSUP;
    if (rc != 0)
        return TS_ECUDA;
    *ratio = rates[0] / 100.0; /* percent of the last sample period a kernel ran */
    return TS_OK;
}

int ts_cuda_count(char *why, size_t why_len) {
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        if (why && why_len > 0)
            snprintf(why, why_len, "%s", cudaGetErrorString(rc));
        cudaGetLastError(); /* not sticky: clear it so the next call starts clean */
        return 0;
    }
    if (count <= 0) {
        if (why && why_len > 0)
            snprintf(why, why_len, "no CUDA-capable device is present");
        return 0;
    }
    return count;
}

/* Device gpu's memory, total and free, from the cheap call (the current device is restored). */
static int mem_info(int gpu, size_t *total, size_t *free_now) {
    int current = -1;
    size_t f = 0, t = 0;
    if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(gpu) != cudaSuccess)
        return TS_ECUDA;
    cudaError_t rc = cudaMemGetInfo(&f, &t);
    cudaSetDevice(current);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return TS_ECUDA;
    }
    *total = t, *free_now = f;
    return TS_OK;
}

int ts_cuda_info(int gpu, char *name, size_t name_len, size_t *total, size_t *free_now) {
    if (name && name_len > 0)
        name[0] = '\0';
    size_t t = 0, f = 0;
    if (total)
        *total = 0;
    if (free_now)
        *free_now = 0;
    if (gpu < 0 || gpu >= ts_cuda_count(NULL, 0))
        return TS_ENODEV;
    /* the name needs the device's properties (slow); the memory, called every second for
     * /metrics, only cudaMemGetInfo */
    if (name && name_len > 0) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, gpu) != cudaSuccess) {
            cudaGetLastError();
            return TS_ECUDA;
        }
        snprintf(name, name_len, "%s", prop.name);
    }
    if (!total && !free_now)
        return TS_OK;
    int rc = mem_info(gpu, &t, &f);
    if (rc == TS_OK && total)
        *total = t;
    if (rc == TS_OK && free_now)
        *free_now = f;
    return rc;
}

/* ---- GEMM ------------------------------------------------------------------------------ */

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* Both GEMMs' start: every size fits cuBLAS's int, and e's device is current (its handles are
 * bound to its stream). */
static int gemm_enter(ts_engine_t *e, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                      int64_t ldc, int64_t batch) {
    if (!fits_int(M) || !fits_int(N) || !fits_int(K) || !fits_int(lda) || !fits_int(ldb) ||
        !fits_int(ldc) || !fits_int(batch))
        return TS_ERANGE;
    cudaStream_t stream;
    return ts_cuda_ctx_enter(e, &stream, NULL, NULL);
}

/*
 * Row-major C = alpha·op(A)·op(B) + beta·C on column-major cuBLAS. A row-major (R, S) matrix
 * with row stride ld is, read column-major, its transpose (S, R) with leading dimension ld. So
 * row-major C (M, N) is column-major Cᵀ (N, M), and
 *     Cᵀ = op(B)ᵀ · op(A)ᵀ,
 * a column-major product of the buffers of B and A, in that order, each with its own transpose
 * flag unchanged: m = N, n = M, k = K, leading dimensions ldb, lda, ldc as given.
 */
int ts_cuda_gemm(ts_engine_t *e, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                 float alpha, const float *A, int64_t lda, int64_t stride_a, const float *B,
                 int64_t ldb, int64_t stride_b, float beta, float *C, int64_t ldc, int64_t stride_c,
                 int64_t batch) {
    if (M <= 0 || N <= 0 || batch <= 0)
        return TS_OK; /* nothing to write */
    /* K == 0 makes C = beta·C; cuBLAS reads neither A nor B then but still wants ld ≥ 1. */
    if (lda < 1)
        lda = 1;
    if (ldb < 1)
        ldb = 1;
    int err = gemm_enter(e, M, N, K, lda, ldb, ldc, batch);
    if (err)
        return err;
    cublasHandle_t h = e->cuda->blas;
    cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st;
    if (batch == 1)
        st = g_blas.sgemm(h, op_b, op_a, (int)N, (int)M, (int)K, &alpha, B, (int)ldb, A, (int)lda,
                          &beta, C, (int)ldc);
    else
        st = g_blas.sgemm_strided_batched(
            h, op_b, op_a, (int)N, (int)M, (int)K, &alpha, B, (int)ldb, (long long)stride_b, A,
            (int)lda, (long long)stride_a, &beta, C, (int)ldc, (long long)stride_c, (int)batch);
    return st == CUBLAS_STATUS_SUCCESS ? TS_OK : TS_ECUBLAS;
}

/* out = inp · weightᵀ, then the bias in a second kernel: the same two roundings as the CPU. */
int ts_cuda_linear_forward(ts_engine_t *e, float *out, const float *inp, const float *weight,
                           const float *bias, int64_t M, int64_t N, int64_t K, int64_t group) {
    (void)group; /* not used here: batch invariance on the GPU is not established yet */
    int err = ts_cuda_gemm(e, 0, 1, M, N, K, 1.0f, inp, K, 0, weight, K, 0, 0.0f, out, N, 0, 1);
    if (err || !bias)
        return err;
    return ts_cuda_add_bcast_forward(e, out, out, bias, M, N);
}

/* Two kernels here; the CPU applies GELU in the bias's pass. The same bits either way. */
int ts_cuda_linear_gelu_forward(ts_engine_t *e, float *pre, float *act, const float *inp,
                                const float *weight, const float *bias, int64_t M, int64_t N,
                                int64_t K, int64_t group) {
    int err = ts_cuda_linear_forward(e, pre, inp, weight, bias, M, N, K, group);
    return err ? err : ts_cuda_gelu_forward(e, act, pre, M * N);
}

/* ---- bf16 and f16 products --------------------------------------------------------------- */

int ts_cuda_bf16_check(ts_engine_t *e, char *why, size_t why_len) {
    if (!e || !e->cuda)
        return TS_EINVAL;
    if (e->cuda->cc_major >= 8)
        return TS_OK;
    if (why && why_len > 0)
        snprintf(why, why_len,
                 "bf16 needs a GPU of compute capability 8.0 or newer (this one is %d.%d); use "
                 "--precision f32",
                 e->cuda->cc_major, e->cuda->cc_minor);
    return TS_ENOTSUP;
}

/* Room for n 16-bit elements of rounded operands (bf16 or f16), at *out. The buffer grows
 * (never shrinks) by freeing and reallocating: cudaFree waits for the device, so no queued kernel
 * still reads the old one. Every bf16 and f16 op of the engine uses it in turn, ordered by the
 * engine's one stream. */
static int lp_room(ts_engine_t *e, int64_t n, uint16_t **out) {
    ts_cuda_ctx_t *ctx = e->cuda;
    if ((size_t)n > ctx->lp16_elems) {
        /* graphs captured with the old buffer are stale from here, whatever follows */
        e->scratch_epoch++;
        if (cudaSetDevice(ctx->device) != cudaSuccess) { /* on the engine's GPU, whichever
                                                          * thread drives it */
            cudaGetLastError();
            return TS_ECUDA;
        }
        if (ctx->lp16 && cudaFree(ctx->lp16) != cudaSuccess) {
            cudaGetLastError(); /* (during a capture: the buffer is kept, the capture fails) */
            return TS_ECUDA;
        }
        ctx->lp16 = NULL;
        ctx->lp16_elems = 0;
        size_t want = (size_t)n + (size_t)n / 4; /* some slack: sizes creep up by batch */
        if (cudaMalloc((void **)&ctx->lp16, want * sizeof(uint16_t)) != cudaSuccess) {
            cudaGetLastError();
            ctx->lp16 = NULL;
            return TS_ENOMEM;
        }
        ctx->lp16_elems = want;
    }
    *out = ctx->lp16;
    return TS_OK;
}

/* lp_room for cuda_flash.cu (the backward's D per row, fp32, in the operand buffer's room): the
 * same buffer, grown the same way. */
int ts_cuda_lp_room(ts_engine_t *e, int64_t n, uint16_t **out);
int ts_cuda_lp_room(ts_engine_t *e, int64_t n, uint16_t **out) { return lp_room(e, n, out); }

/* n 16-bit elements rounded up to a 128-byte boundary. */
static int64_t aligned_elems(int64_t n) { return (n + 63) / 64 * 64; }

/* Elements spanned by a strided batch of (rows, cols) matrices with row stride ld. */
static int64_t span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
    return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/* cuBLAS's name for a 16-bit dtype. */
static cudaDataType_t cuda_type(ts_dtype_t lp) { return lp == TS_F16 ? CUDA_R_16F : CUDA_R_16BF; }

/* As ts_cuda_gemm with A and B already in lp (bf16 or f16) and fp32 accumulation into C, on the
 * 16-bit handle: C fp32, or in lp when c_lp (the accumulator rounded as it is written). The same
 * row-major mapping as ts_cuda_gemm. */
static int gemm_ex_to(ts_engine_t *e, ts_dtype_t lp, int trans_a, int trans_b, int64_t M, int64_t N,
                      int64_t K, float alpha, const uint16_t *A, int64_t lda, int64_t stride_a,
                      const uint16_t *B, int64_t ldb, int64_t stride_b, float beta, void *C,
                      int c_lp, int64_t ldc, int64_t stride_c, int64_t batch) {
    int err = gemm_enter(e, M, N, K, lda, ldb, ldc, batch);
    if (err)
        return err;
    cublasHandle_t h = e->cuda->blas16;
    size_t es = c_lp ? sizeof(uint16_t) : sizeof(float);
    if (e->cuda->zero_lp_out && beta == 0.0f) {
        /* C's M rows of N, ldc apart, in each of the batch's products */
        for (int64_t b = 0; b < batch; b++)
            if (cudaMemset2DAsync((char *)C + (size_t)(b * stride_c) * es, (size_t)ldc * es, 0,
                                  (size_t)N * es, (size_t)M, e->cuda->stream) != cudaSuccess)
                return TS_ECUDA;
    }
    cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t t = cuda_type(lp), ct = c_lp ? t : CUDA_R_32F;
    cublasStatus_t st;
    if (batch == 1)
        st = g_blas.gemm_ex(h, op_b, op_a, (int)N, (int)M, (int)K, &alpha, B, t, (int)ldb, A, t,
                            (int)lda, &beta, C, ct, (int)ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT);
    else
        st = g_blas.gemm_strided_batched_ex(
            h, op_b, op_a, (int)N, (int)M, (int)K, &alpha, B, t, (int)ldb, (long long)stride_b, A,
            t, (int)lda, (long long)stride_a, &beta, C, ct, (int)ldc, (long long)stride_c,
            (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? TS_OK : TS_ECUBLAS;
}

/* gemm_ex_to into an fp32 C. */
static int gemm_ex(ts_engine_t *e, ts_dtype_t lp, int trans_a, int trans_b, int64_t M, int64_t N,
                   int64_t K, float alpha, const uint16_t *A, int64_t lda, int64_t stride_a,
                   const uint16_t *B, int64_t ldb, int64_t stride_b, float beta, float *C,
                   int64_t ldc, int64_t stride_c, int64_t batch) {
    return gemm_ex_to(e, lp, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b,
                      beta, C, 0, ldc, stride_c, batch);
}

/* op(A) and op(B) rounded to lp (nearest even, kernels/math.h's rounding, as the CPU's) into the
 * engine's operand buffer, in their own layout (the whole span a strided batch covers, so ld and
 * strides carry over), then one cuBLAS product with fp32 accumulation. */
static int gemm_lp(ts_engine_t *e, ts_dtype_t lp, int trans_a, int trans_b, int64_t M, int64_t N,
                   int64_t K, float alpha, const float *A, int64_t lda, int64_t stride_a,
                   const float *B, int64_t ldb, int64_t stride_b, float beta, float *C, int64_t ldc,
                   int64_t stride_c, int64_t batch) {
    if (M <= 0 || N <= 0 || batch <= 0)
        return TS_OK;
    if (K <= 0) /* C = beta·C: no operand to round */
        return ts_cuda_gemm(e, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b,
                            beta, C, ldc, stride_c, batch);
    int64_t sa = batch > 1 ? stride_a : 0, sb = batch > 1 ? stride_b : 0;
    int64_t na = span(trans_a ? K : M, trans_a ? M : K, lda, sa, batch);
    int64_t nb = span(trans_b ? N : K, trans_b ? K : N, ldb, sb, batch);
    int64_t ob = aligned_elems(na); /* B's operand starts 128-byte aligned, as cuBLAS prefers */
    uint16_t *buf;
    int err = lp_room(e, ob + nb, &buf);
    if (!err)
        err = ts_cuda_convert(e, buf, lp, A, TS_F32, na);
    if (!err)
        err = ts_cuda_convert(e, buf + ob, lp, B, TS_F32, nb);
    if (err)
        return err;
    return gemm_ex(e, lp, trans_a, trans_b, M, N, K, alpha, buf, lda, sa, buf + ob, ldb, sb, beta,
                   C, ldc, stride_c, batch);
}

int ts_cuda_gemm_bf16(ts_engine_t *e, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                      float alpha, const float *A, int64_t lda, int64_t stride_a, const float *B,
                      int64_t ldb, int64_t stride_b, float beta, float *C, int64_t ldc,
                      int64_t stride_c, int64_t batch) {
    return gemm_lp(e, TS_BF16, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b,
                   beta, C, ldc, stride_c, batch);
}

int ts_cuda_gemm_f16(ts_engine_t *e, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                     float alpha, const float *A, int64_t lda, int64_t stride_a, const float *B,
                     int64_t ldb, int64_t stride_b, float beta, float *C, int64_t ldc,
                     int64_t stride_c, int64_t batch) {
    return gemm_lp(e, TS_F16, trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b,
                   beta, C, ldc, stride_c, batch);
}

/* C = A · B with both operands in lp already (a conv's weight and its im2col_lp): one cuBLAS
 * product, no rounding kernel. */
int ts_cuda_gemm_lp_in(ts_engine_t *e, ts_dtype_t lp, int64_t M, int64_t N, int64_t K,
                       const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C,
                       int64_t ldc) {
    if (M <= 0 || N <= 0)
        return TS_OK;
    if (K <= 0) /* C = 0: nothing to multiply (the leading dimensions cuBLAS accepts for K = 0) */
        return ts_cuda_gemm(e, 0, 0, M, N, K, 1.0f, NULL, 1, 0, NULL, N, 0, 0.0f, C, ldc, 0, 1);
    return gemm_ex(e, lp, 0, 0, M, N, K, 1.0f, A, lda, 0, B, ldb, 0, 0.0f, C, ldc, 0, 1);
}

/* The composed attention's 16-bit scratch per group of samples, by default: the group's qkv and
 * softmax weights, rounded (at most this many bytes, or one sample's where that is more). */
#define ATT_LP_GROUP_BYTES ((int64_t)64 << 20)

/* Per group of samples: qkv rounded to lp once, QKᵀ (scaled) per sample with the heads a
 * strided batch, the fp32 softmax over the group's rows in place, the weights rounded once,
 * then att·V per sample — the roundings gemm_lp would make per product (the same values rounded
 * the same way), in two conversion kernels per group instead of four per sample. */
int ts_cuda_attention_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *out, uint16_t *out16,
                                 float *att, const float *qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t H, int64_t group_bytes) {
    if (B <= 0 || T <= 0 || C <= 0 || H <= 0)
        return TS_OK;
    int64_t hd = C / H, ld = 3 * C, tt = T * T;
    int64_t per = aligned_elems(T * ld) + H * tt; /* 16-bit elements per sample */
    int64_t group = (group_bytes > 0 ? group_bytes : ATT_LP_GROUP_BYTES) /
                    (per * (int64_t)sizeof(uint16_t));
    group = group < 1 ? 1 : group > B ? B : group;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t b0 = 0; b0 < B; b0 += group) {
        int64_t nb = B - b0 < group ? B - b0 : group;
        int64_t oa = aligned_elems(nb * T * ld); /* the weights after the group's qkv */
        uint16_t *buf;
        int err = lp_room(e, oa + nb * H * tt, &buf);
        if (!err)
            err = ts_cuda_convert(e, buf, lp, qkv + b0 * T * ld, TS_F32, nb * T * ld);
        for (int64_t b = 0; b < nb && !err; b++) {
            const uint16_t *q = buf + b * T * ld;
            /* att[b, h] (T, T) = scale · Q_h · K_hᵀ, the heads hd apart */
            err = gemm_ex(e, lp, 0, 1, T, T, hd, scale, q, ld, hd, q + C, ld, hd, 0.0f,
                          att + (b0 + b) * H * tt, T, tt, H);
        }
        if (!err) /* the weights (fp32: the backward reads them) and their 16-bit copy at once */
            err = ts_cuda_softmax_forward_lp_copy(e, att + b0 * H * tt, buf + oa, lp,
                                                  att + b0 * H * tt, nb * H * T, T);
        for (int64_t b = 0; b < nb && !err; b++)
            /* out[b, :, h·hd:(h+1)·hd] (T, hd) = att[b, h] (T, T) · V_h (T, hd) */
            err = gemm_ex_to(e, lp, 0, 0, T, hd, T, 1.0f, buf + oa + b * H * tt, T, tt,
                             buf + b * T * ld + 2 * C, ld, hd, 0.0f,
                             out ? (void *)(out + (b0 + b) * T * C)
                                 : (void *)(out16 + (b0 + b) * T * C),
                             out == NULL, C, hd, H);
        if (err)
            return err;
    }
    return TS_OK;
}

/* The largest power of two ≤ 16 that divides p's address. */
static unsigned alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 16;
    while (al > 1 && a % al != 0)
        al /= 2;
    return al;
}

/* cuBLASLt's handle and workspace, made on the first epilogue product (before any capture: a
 * forward runs eagerly before it is captured). TS_ENOTSUP, and epilogues off, when cuBLASLt
 * cannot be opened or started. */
static int lt_start(ts_cuda_ctx_t *ctx) {
    if (ctx->lt)
        return TS_OK;
    if (cudaSetDevice(ctx->device) != cudaSuccess) { /* the workspace on the engine's GPU */
        cudaGetLastError();
        return TS_ECUDA;
    }
    pthread_once(&g_lt_once, lt_open);
    if (!g_lt_ok || g_lt.create(&ctx->lt) != CUBLAS_STATUS_SUCCESS) {
        ctx->lt = NULL;
        ctx->epilogues = -1;
        return TS_ENOTSUP;
    }
    if (cudaMalloc(&ctx->lt_ws, LT_WORKSPACE_BYTES) != cudaSuccess) {
        cudaGetLastError();
        ctx->lt_ws = NULL;
        g_lt.destroy(ctx->lt);
        ctx->lt = NULL;
        ctx->epilogues = -1;
        return TS_ENOTSUP;
    }
    return TS_OK;
}

/* The plan of out (M, N) = in (M, K) · weightᵀ + bias in lp (LT_BIAS, out fp32), or of out =
 * lp(gelu(in · weightᵀ + bias)) (LT_GELU, out in lp), found or made. The row-major product is
 * column-major outᵀ (N, M) = W · inᵀ: A the weight (K × N as stored, transposed), B the input
 * (K × M), C and D the output (N × M), and the epilogue's bias one value per row of D — per
 * output feature — in fp32, or in lp when bias_lp. TS_ENOTSUP when cuBLASLt has no algorithm
 * for it (remembered in a slot, like a plan) or the descriptors could not be made (not
 * remembered). */
static int lt_plan(ts_cuda_ctx_t *ctx, ts_dtype_t lp, lt_kind_t kind, int bias_lp, int64_t M,
                   int64_t N, int64_t K, unsigned align, const void *bias, lt_plan_t **out) {
    unsigned bias_align = alignment(bias);
    for (int i = 0; i < LT_PLANS; i++) {
        lt_plan_t *p = &ctx->plans[i];
        if (p->used && p->lp == lp && p->kind == kind && p->bias_lp == bias_lp && p->M == M &&
            p->N == N && p->K == K && p->align == align && p->bias_align == bias_align) {
            *out = p;
            return p->used == 1 ? TS_OK : TS_ENOTSUP; /* a refusal is remembered too */
        }
    }
    lt_plan_t *p = &ctx->plans[ctx->lt_next];
    lt_plan_free(p);
    cudaDataType_t t = lp == TS_F16 ? CUDA_R_16F : CUDA_R_16BF;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = kind == LT_GELU ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t bias_t = bias_lp ? t : CUDA_R_32F, out_t = kind == LT_GELU ? t : CUDA_R_32F;
    uint64_t ws = LT_WORKSPACE_BYTES;
    uint32_t al = align;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0, made = 0;
    bool ok = g_lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    made = ok;
    ok = ok &&
         g_lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
             CUBLAS_STATUS_SUCCESS &&
         g_lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
             CUBLAS_STATUS_SUCCESS &&
         g_lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ==
             CUBLAS_STATUS_SUCCESS &&
         g_lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof bias_t) ==
             CUBLAS_STATUS_SUCCESS &&
         /* the heuristic reads the pointer's alignment; every call sets its own */
         g_lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) ==
             CUBLAS_STATUS_SUCCESS;
    ok = ok && g_lt.layout_create(&p->a, t, (uint64_t)K, (uint64_t)N, K) == CUBLAS_STATUS_SUCCESS;
    made += ok;
    ok = ok && g_lt.layout_create(&p->b, t, (uint64_t)K, (uint64_t)M, K) == CUBLAS_STATUS_SUCCESS;
    made += ok;
    ok = ok &&
         g_lt.layout_create(&p->c, out_t, (uint64_t)N, (uint64_t)M, N) == CUBLAS_STATUS_SUCCESS;
    made += ok;
    ok = ok && g_lt.pref_create(&pref) == CUBLAS_STATUS_SUCCESS;
    ok = ok &&
         g_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
             CUBLAS_STATUS_SUCCESS &&
         g_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al) ==
             CUBLAS_STATUS_SUCCESS &&
         g_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al) ==
             CUBLAS_STATUS_SUCCESS &&
         g_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al) ==
             CUBLAS_STATUS_SUCCESS &&
         g_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al) ==
             CUBLAS_STATUS_SUCCESS;
    /* none: the heuristic answered, with no algorithm for the shape (not a failure to ask) */
    int none = 0;
    if (ok) {
        cublasStatus_t hs =
            g_lt.heuristic(ctx->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
        none = (hs == CUBLAS_STATUS_SUCCESS && found == 0) || hs == CUBLAS_STATUS_NOT_SUPPORTED;
        ok = hs == CUBLAS_STATUS_SUCCESS && found > 0;
    }
    if (pref)
        g_lt.pref_destroy(pref);
    if (!ok) { /* undo what was made, in order */
        if (made >= 4)
            g_lt.layout_destroy(p->c);
        if (made >= 3)
            g_lt.layout_destroy(p->b);
        if (made >= 2)
            g_lt.layout_destroy(p->a);
        if (made >= 1)
            g_lt.desc_destroy(p->desc);
        /* no algorithm is remembered, so that the shape's next products go to the two kernels
         * without asking again; a failure to make the descriptors (memory) is not */
        if (none) {
            p->lp = lp, p->kind = kind, p->bias_lp = bias_lp;
            p->M = M, p->N = N, p->K = K, p->align = align, p->bias_align = bias_align;
            p->used = 2;
            ctx->lt_next = (ctx->lt_next + 1) % LT_PLANS;
        }
        return TS_ENOTSUP;
    }
    p->algo = res.algo;
    p->lp = lp, p->kind = kind, p->bias_lp = bias_lp;
    p->M = M, p->N = N, p->K = K, p->align = align, p->bias_align = bias_align, p->used = 1;
    ctx->lt_next = (ctx->lt_next + 1) % LT_PLANS;
    *out = p;
    return TS_OK;
}

/* One cuBLASLt product with its epilogue: out = in16 · weightᵀ + bias (LT_BIAS, out fp32: the
 * bias added to the fp32 accumulator before it is written, one rounding less than the product
 * then the bias kernel), or out = lp(gelu(in16 · weightᵀ + bias)) (LT_GELU, out in lp). The
 * bias in fp32, or, where cuBLASLt has no algorithm for that beside a 16-bit output, a copy of
 * it in lp. TS_ENOTSUP when it cannot run here (the caller then runs its kernels); another
 * error when it ran and failed. */
static int lt_product(ts_engine_t *e, ts_dtype_t lp, lt_kind_t kind, void *out,
                      const uint16_t *in16, const uint16_t *weight, const float *bias, int64_t M,
                      int64_t N, int64_t K) {
    ts_cuda_ctx_t *ctx = e->cuda;
    if (ctx->epilogues != 1 || lt_start(ctx) != TS_OK)
        return TS_ENOTSUP;
    int err = gemm_enter(e, M, N, K, K, K, N, 1);
    if (err)
        return err;
    unsigned al = alignment(out), x = alignment(in16), w = alignment(weight);
    al = x < al ? x : al, al = w < al ? w : al;
    const void *bias_ptr = bias;
    lt_plan_t *p;
    if (lt_plan(ctx, lp, kind, 0, M, N, K, al, bias, &p) != TS_OK) {
        uint16_t *b16;
        if (kind != LT_GELU || lp_room(e, N, &b16) != TS_OK)
            return TS_ENOTSUP;
        if (lt_plan(ctx, lp, kind, 1, M, N, K, al, b16, &p) != TS_OK)
            return TS_ENOTSUP;
        if ((err = ts_cuda_convert(e, b16, lp, bias, TS_F32, N)) != TS_OK)
            return err;
        bias_ptr = b16;
    }
    if (g_lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr) !=
        CUBLAS_STATUS_SUCCESS)
        return TS_ECUBLAS;
    size_t out_bytes = (size_t)(M * N) * (kind == LT_GELU ? sizeof(uint16_t) : sizeof(float));
    if (ctx->zero_lp_out && cudaMemsetAsync(out, 0, out_bytes, ctx->stream) != cudaSuccess)
        return TS_ECUDA;
    const float one = 1.0f, zero = 0.0f;
    if (g_lt.matmul(ctx->lt, p->desc, &one, weight, p->a, in16, p->b, &zero, out, p->c, out, p->c,
                    &p->algo, ctx->lt_ws, LT_WORKSPACE_BYTES, ctx->stream) != CUBLAS_STATUS_SUCCESS)
        return TS_ECUBLAS;
    ctx->lt_calls++;
    return TS_OK;
}

int ts_cuda_set_epilogues(ts_engine_t *e, int on) {
    if (!e || !e->cuda)
        return TS_EINVAL;
    /* cuBLASLt opened and started now, not at the first product (which may be in a capture):
     * TS_ENOTSUP at once where it cannot be */
    if (on && e->cuda->epilogues == -1)
        return TS_ENOTSUP;
    int rc = on ? lt_start(e->cuda) : TS_OK; /* TS_ENOTSUP, or TS_ECUDA: the device */
    if (rc != TS_OK)
        return rc;
    if (e->cuda->epilogues != (on != 0))
        e->scratch_epoch++; /* graphs recorded with the other kernels are not launched again */
    e->cuda->epilogues = on != 0;
    return TS_OK;
}

int64_t ts_cuda_epilogue_calls(ts_engine_t *e) { return e && e->cuda ? e->cuda->lt_calls : 0; }

int ts_cuda_epilogues(ts_engine_t *e) { return e && e->cuda ? e->cuda->epilogues : 0; }

/* out = in16 · weightᵀ in fp32, both in lp, then the bias: in cuBLASLt's epilogue when the
 * engine has it on, else in a second kernel, as the fp32 path. */
static int linear_lp_product(ts_engine_t *e, ts_dtype_t lp, float *out, const uint16_t *in16,
                             const uint16_t *weight, const float *bias, int64_t M, int64_t N,
                             int64_t K) {
    if (bias) {
        int rc = lt_product(e, lp, LT_BIAS, out, in16, weight, bias, M, N, K);
        if (rc != TS_ENOTSUP)
            return rc;
    }
    int err = gemm_ex(e, lp, 0, 1, M, N, K, 1.0f, in16, K, 0, weight, K, 0, 0.0f, out, N, 0, 1);
    if (err || !bias)
        return err;
    return ts_cuda_add_bcast_forward(e, out, out, bias, M, N);
}

/* out = lp(inp) · weightᵀ in fp32 (weight already in lp): inp rounded into the operand buffer. */
static int linear_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *out, const float *inp,
                             const uint16_t *weight, const float *bias, int64_t M, int64_t N,
                             int64_t K) {
    if (M <= 0 || N <= 0)
        return TS_OK;
    uint16_t *in16;
    int err = lp_room(e, M * K, &in16);
    if (!err)
        err = ts_cuda_convert(e, in16, lp, inp, TS_F32, M * K);
    return err ? err : linear_lp_product(e, lp, out, in16, weight, bias, M, N, K);
}

/* The input already in lp (a 16-bit activation): no rounding kernel. */
int ts_cuda_linear_forward_lp_in(ts_engine_t *e, ts_dtype_t lp, float *out, const uint16_t *inp,
                                 const uint16_t *weight, const float *bias, int64_t M, int64_t N,
                                 int64_t K, int64_t group) {
    (void)group;
    if (M <= 0 || N <= 0)
        return TS_OK;
    return linear_lp_product(e, lp, out, inp, weight, bias, M, N, K);
}

/* fc1 of a forward whose backward does not read pre: one cuBLASLt product with the bias and
 * GELU in its epilogue where the engine has the epilogues on; else the product (its bias maybe
 * in the epilogue) into pre and the GELU kernel that rounds. */
int ts_cuda_linear_gelu_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *pre, uint16_t *act,
                                   const uint16_t *inp, const uint16_t *weight, const float *bias,
                                   int64_t M, int64_t N, int64_t K, int64_t group, int keep_pre) {
    (void)group;
    if (M <= 0 || N <= 0)
        return TS_OK;
    if (!keep_pre && bias) {
        int rc = lt_product(e, lp, LT_GELU, act, inp, weight, bias, M, N, K);
        if (rc != TS_ENOTSUP)
            return rc;
    }
    int err = linear_lp_product(e, lp, pre, inp, weight, bias, M, N, K);
    return err ? err : ts_cuda_gelu_forward_lp(e, act, lp, pre, M * N);
}

int ts_cuda_linear_forward_bf16(ts_engine_t *e, float *out, const float *inp,
                                const uint16_t *weight, const float *bias, int64_t M, int64_t N,
                                int64_t K, int64_t group) {
    (void)group;
    return linear_forward_lp(e, TS_BF16, out, inp, weight, bias, M, N, K);
}

int ts_cuda_linear_forward_f16(ts_engine_t *e, float *out, const float *inp, const uint16_t *weight,
                               const float *bias, int64_t M, int64_t N, int64_t K, int64_t group) {
    (void)group;
    return linear_forward_lp(e, TS_F16, out, inp, weight, bias, M, N, K);
}

/* dinp (M, K) += lp(dout) (M, N) · weight (N, K); dweight (N, K) += lp(dout)ᵀ · lp(inp), or
 * · inp16 when the input is already in lp, and with dout16 for lp(dout) when its producer wrote
 * it so (no rounding kernel for either). */
static int linear_backward_lp(ts_engine_t *e, ts_dtype_t lp, float *dinp, float *dweight,
                              float *dbias, const float *dout, const uint16_t *dout16,
                              const float *inp, const uint16_t *inp16, const uint16_t *weight,
                              int64_t M, int64_t N, int64_t K) {
    if (M <= 0 || N <= 0)
        return TS_OK;
    const int products = K > 0 && (dinp || dweight);
    /* dout rounded here: with the bias's sums, in their one pass over it */
    const int fused = products && dbias && !dout16;
    int err = TS_OK;
    if (products) {
        uint16_t *buf = NULL;
        int64_t oi = dout16 ? 0 : aligned_elems(M * N), xi = dweight && !inp16 ? M * K : 0;
        err = oi + xi > 0 ? lp_room(e, oi + xi, &buf) : TS_OK;
        if (!err && !dout16)
            err = fused ? ts_cuda_bias_grad_lp(e, dbias, buf, lp, dout, M, N)
                        : ts_cuda_convert(e, buf, lp, dout, TS_F32, M * N);
        const uint16_t *g16 = dout16 ? dout16 : buf;
        if (!err && dinp)
            err = gemm_ex(e, lp, 0, 0, M, K, N, 1.0f, g16, N, 0, weight, K, 0, 1.0f, dinp, K, 0, 1);
        if (!err && dweight) {
            const uint16_t *in16 = inp16;
            if (!in16) {
                err = ts_cuda_convert(e, buf + oi, lp, inp, TS_F32, M * K);
                in16 = buf + oi;
            }
            if (!err)
                err = gemm_ex(e, lp, 1, 0, N, K, M, 1.0f, g16, N, 0, in16, K, 0, 1.0f, dweight, K,
                              0, 1);
        }
    }
    if (!err && dbias && !fused) /* the bias's sums on their own, after the products */
        err = ts_cuda_add_bcast_backward(e, NULL, dbias, dout, M, N);
    return err;
}

int ts_cuda_linear_backward_bf16(ts_engine_t *e, float *dinp, float *dweight, const float *dout,
                                 const float *inp, const uint16_t *weight, int64_t M, int64_t N,
                                 int64_t K) {
    return linear_backward_lp(e, TS_BF16, dinp, dweight, NULL, dout, NULL, inp, NULL, weight, M, N,
                              K);
}

int ts_cuda_linear_backward_f16(ts_engine_t *e, float *dinp, float *dweight, const float *dout,
                                const float *inp, const uint16_t *weight, int64_t M, int64_t N,
                                int64_t K) {
    return linear_backward_lp(e, TS_F16, dinp, dweight, NULL, dout, NULL, inp, NULL, weight, M, N,
                              K);
}

int ts_cuda_linear_backward_lp_in(ts_engine_t *e, ts_dtype_t lp, float *dinp, float *dweight,
                                  float *dbias, const float *dout, const uint16_t *dout16,
                                  const uint16_t *inp, const uint16_t *weight, int64_t M, int64_t N,
                                  int64_t K) {
    return linear_backward_lp(e, lp, dinp, dweight, dbias, dout, dout16, NULL, inp, weight, M, N,
                              K);
}

/* The GPU's GELU is already fast: the bf16 forward's is the fp32 one (within 0 of it). */
int ts_cuda_gelu_forward_bf16(ts_engine_t *e, float *out, const float *inp, int64_t n) {
    return ts_cuda_gelu_forward(e, out, inp, n);
}
