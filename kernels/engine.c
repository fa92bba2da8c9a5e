/* engine.c — starting and stopping compute engines (see engine.h). */
#include "kernels/engine.h"

#include <string.h>

#include "kernels/backend.h"

int ts_engine_init(ts_engine_t *e, const ts_engine_opts_t *opts) {
    if (!e || !opts)
        return TS_EINVAL;
    memset(e, 0, sizeof *e);
    e->device = opts->device;
    switch (opts->device) {
    case TS_CPU:
        if (opts->threads < 0)
            return TS_EINVAL;
        return ts_cpu_engine_init(e, opts->threads);
    case TS_CUDA:
        if (opts->gpu < 0)
            return TS_EINVAL;
        return ts_cuda_engine_init(e, opts->gpu);
    default: return TS_EINVAL;
    }
}

void ts_engine_free(ts_engine_t *e) {
    if (!e)
        return;
    if (e->device == TS_CPU)
        ts_cpu_engine_free(e);
    else if (e->device == TS_CUDA)
        ts_cuda_engine_free(e);
    memset(e, 0, sizeof *e);
}

int ts_engine_sync(ts_engine_t *e) {
    if (!e)
        return TS_EINVAL;
    return e->device == TS_CUDA ? ts_cuda_engine_sync(e) : TS_OK;
}

int ts_cuda_built(void) { return ts_cuda_is_built(); }

int ts_cuda_device_count(char *why, size_t why_len) { return ts_cuda_count(why, why_len); }
