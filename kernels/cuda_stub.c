/*
 * cuda_stub.c — the CUDA backend in a build without CUDA.
 *
 * Every ts_cuda_* entry point of kernels/backend.h exists so kernels/ops*.c link the same way
 * in every build; here each one reports TS_ENODEV (the void ones do nothing), ts_cuda_built
 * says 0 and ts_cuda_count explains how to get the real backend. The op stubs are generated
 * from backend.h's TS_BACKEND_OPS list, so they cannot fall out of step with the declarations.
 */
#include <stdio.h>

#include "kernels/backend.h"

/* The stubs ignore their arguments by design; C11 definitions must still name them. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif

/* One stub per entry of the op list in backend.h, with the parameters declared there. */
#define TS_CUDA_STUB(name, ...)                                                                    \
    int ts_cuda_##name(ts_engine_t *e, __VA_ARGS__) { return TS_ENODEV; }
TS_BACKEND_OPS(TS_CUDA_STUB)
#undef TS_CUDA_STUB

/* ---- engine and memory hooks ---- */

int ts_cuda_engine_init(ts_engine_t *e, int gpu) { return TS_ENODEV; }
int ts_cuda_flash_ok(ts_engine_t *e, ts_dtype_t lp) { return TS_ENODEV; }
int ts_cuda_attention_forward_lp(ts_engine_t *e, ts_dtype_t lp, float *out, uint16_t *out16,
                                 float *att, const float *qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t H, int64_t group_bytes) {
    return TS_ENODEV;
}
int ts_cuda_blas_load(char *err, size_t errlen) {
    if (err && errlen)
        snprintf(err, errlen, "this build has no CUDA backend");
    return TS_ENODEV;
}
void ts_cuda_engine_free(ts_engine_t *e) {}
int ts_cuda_engine_sync(ts_engine_t *e) { return TS_ENODEV; }

int ts_cuda_malloc(void **p, size_t bytes) {
    if (p)
        *p = NULL;
    return TS_ENODEV;
}
void ts_cuda_free(void *p) {}
int ts_cuda_memcpy(void *dst, ts_device_t dst_dev, const void *src, ts_device_t src_dev,
                   size_t bytes) {
    return TS_ENODEV;
}

int ts_cuda_host_alloc(void **p, size_t bytes) {
    if (p)
        *p = NULL;
    return TS_ENODEV;
}
void ts_cuda_host_free(void *p) {}

int ts_cuda_built(void) { return 0; }

int ts_cuda_count(char *why, size_t why_len) {
    if (why && why_len > 0)
        snprintf(why, why_len, "%s",
                 "CUDA backend not built (configure with -DTESSERA_CUDA=ON on a machine with nvcc "
                 "and cuBLAS)");
    return 0;
}

int ts_cuda_info(int gpu, char *name, size_t name_len, size_t *total, size_t *free_now) {
    if (name && name_len > 0)
        name[0] = '\0';
    if (total)
        *total = 0;
    if (free_now)
        *free_now = 0;
    return TS_ENODEV;
}

int ts_cuda_bf16_check(ts_engine_t *e, char *why, size_t why_len) {
    if (why && why_len > 0)
        snprintf(why, why_len, "%s", "CUDA backend not built");
    return TS_ENODEV;
}

int ts_cuda_utilization(int gpu, double *ratio) {
    if (ratio)
        *ratio = 0.0;
    return TS_ENODEV;
}

int ts_cuda_event_record(ts_engine_t *e, void **ev) { return TS_ENODEV; }
int ts_cuda_event_elapsed(ts_engine_t *e, void *a, void *b, double *seconds) {
    if (seconds)
        *seconds = 0.0;
    return TS_ENODEV;
}
void ts_cuda_event_free(void *ev) {}
int ts_cuda_event_wait(ts_engine_t *e, void *ev) { return TS_ENODEV; }
int ts_cuda_set_epilogues(ts_engine_t *e, int on) { return TS_ENODEV; }
int64_t ts_cuda_epilogue_calls(ts_engine_t *e) { return 0; }
int ts_cuda_epilogues(ts_engine_t *e) { return 0; }
int ts_cuda_capture_begin(ts_engine_t *e) { return TS_ENODEV; }
int ts_cuda_capture_end(ts_engine_t *e, void **exec) {
    if (exec)
        *exec = NULL;
    return TS_ENODEV;
}
int ts_cuda_graph_launch(ts_engine_t *e, void *exec) { return TS_ENODEV; }
void ts_cuda_graph_free(void *exec) {}
int ts_cuda_memcpy_async(ts_engine_t *e, void *dst, ts_device_t dst_dev, const void *src,
                         ts_device_t src_dev, size_t bytes) {
    return TS_ENODEV;
}
