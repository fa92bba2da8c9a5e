/*
 * lp_convert_hw.cu — kernels/math.h's 16-bit conversions against NVIDIA's own, for
 * tests/test_lp_convert_hw.sh. On a GPU ts_f32_to_f16 and ts_f32_to_bf16 are the hardware's
 * cvt.rn (one instruction) and on the CPU the bit arithmetic of math.h; the CPU's results are
 * what every parity test holds a GPU kernel's rounding to. This program compares, for every one
 * of the 2^32 float bit patterns, math.h's host conversion with cuda_fp16.h's and cuda_bf16.h's
 * __float2half_rn and __float2bfloat16_rn (their host implementations, which NVIDIA keeps equal
 * to the instruction): equal bits for every number and infinity, and for a NaN a NaN — math.h's
 * device path makes a NaN's bits itself, as the CPU does. The kernel below exists for its PTX
 * (the script checks that the device path is the instruction).
 */
#include <cstdio>

#include "kernels/math.h"

__global__ void lp_convert_hw_kernel(uint16_t *h, uint16_t *b, const float *x) {
    h[threadIdx.x] = ts_f32_to_f16(x[threadIdx.x]);
    b[threadIdx.x] = ts_f32_to_bf16(x[threadIdx.x]);
}

static int is_nan16(uint16_t v, int f16) {
    return f16 ? (v & 0x7c00u) == 0x7c00u && (v & 0x3ffu) : (v & 0x7f80u) == 0x7f80u && (v & 0x7fu);
}

int main(void) {
    unsigned long long bad[2] = {0, 0}, nans = 0;
    for (uint64_t u = 0; u <= 0xffffffffull; u++) {
        float f = ts_bits_f32((uint32_t)u);
        uint16_t ours[2] = {ts_f32_to_bf16(f), ts_f32_to_f16(f)};
        uint16_t theirs[2] = {__bfloat16_as_ushort(__float2bfloat16_rn(f)),
                              __half_as_ushort(__float2half_rn(f))};
        for (int t = 0; t < 2; t++) {
            int ok = f != f ? is_nan16(ours[t], t) && is_nan16(theirs[t], t) : ours[t] == theirs[t];
            if (!ok && bad[t]++ < 5)
                printf("%s of 0x%08x: ours 0x%04x, NVIDIA's 0x%04x\n", t ? "f16" : "bf16",
                       (unsigned)u, ours[t], theirs[t]);
        }
        nans += f != f;
    }
    printf("lp_convert_hw: 2^32 inputs (%llu NaN): bf16 %llu differ, f16 %llu differ\n", nans,
           bad[0], bad[1]);
    return bad[0] || bad[1] ? 1 : 0;
}
