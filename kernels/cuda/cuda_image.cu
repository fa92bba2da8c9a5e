/*
 * cuda_image.cu — the image ops of kernels/backend.h (im2col, per-channel bias, GroupNorm, nearest
 * ×2 upsampling) on the CUDA backend: not written yet. Each answers TS_ENOTSUP, so the VAE
 * (model/vae.c) runs on the CPU engine only and a CUDA engine says so instead of computing.
 */
#include <cstdint>

#include "kernels/backend.h"

int ts_cuda_im2col(ts_engine_t *, float *, const float *, int64_t, int64_t, int64_t, int64_t,
                   int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {
    return TS_ENOTSUP;
}

int ts_cuda_add_channel_bias(ts_engine_t *, float *, const float *, int64_t, int64_t, int64_t) {
    return TS_ENOTSUP;
}

int ts_cuda_groupnorm_forward(ts_engine_t *, float *, const float *, const float *, const float *,
                              int64_t, int64_t, int64_t, int64_t, float, int) {
    return TS_ENOTSUP;
}

int ts_cuda_upsample_nearest2x(ts_engine_t *, float *, const float *, int64_t, int64_t, int64_t) {
    return TS_ENOTSUP;
}
