/*
 * cuda_heads.h — the head sizes the attention kernels (cuda_attention.cu, cuda_flash.cu) have
 * their own instances for: 32, 64, 72 and 128, each with its registers sized at compile time;
 * any other size takes instance 0, which reads the size at run time.
 */
#ifndef TS_KERNELS_CUDA_HEADS_H
#define TS_KERNELS_CUDA_HEADS_H

#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/backend.h"

/* Calls launch(k) with k an integral_constant naming the instance for head size hd, then
 * reports the launch: TS_OK, or TS_ECUDA when it failed. */
template <typename F> static int ts_cuda_by_head(int hd, F launch) {
    if (hd == 32)
        launch(std::integral_constant<int, 32>{});
    else if (hd == 64)
        launch(std::integral_constant<int, 64>{});
    else if (hd == 72)
        launch(std::integral_constant<int, 72>{});
    else if (hd == 128)
        launch(std::integral_constant<int, 128>{});
    else
        launch(std::integral_constant<int, 0>{});
    return cudaGetLastError() == cudaSuccess ? TS_OK : TS_ECUDA;
}

#endif
