/*
 * tile.h — internal: what the register-tile files of the AVX2 and AVX-512 builds of
 * kernels/cpu/vec.h share (kernels/cpu/att_tile.c, kernels/cpu/lin_tile.c): the build's vector
 * type and operations, and an 8 × 8 transpose in AVX registers.
 *
 * Every tile computes each output as one chain of fused multiply-adds in the order of the summed
 * index, so the two builds give the same bits; included only by files built with TS_VEC_ISA
 * avx2 or avx512 (each with -mfma).
 */
#ifndef TS_CPU_TILE_H
#define TS_CPU_TILE_H

#include <immintrin.h>
#include <stdint.h>

#define VEC_CAT2(a, b) a##b
#define VEC_CAT(a, b) VEC_CAT2(a, b)

#if defined(__AVX512F__)
typedef __m512 vf;
#define LANES 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps
#define VFMA _mm512_fmadd_ps
#define VMUL _mm512_mul_ps
#define VADD _mm512_add_ps
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vf;
#define LANES 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps
#define VFMA _mm256_fmadd_ps
#define VMUL _mm256_mul_ps
#define VADD _mm256_add_ps
#else
#error "the register tiles need AVX-512 F or AVX2 with FMA"
#endif

#define INLINE static inline __attribute__((always_inline))

/* 8 rows of 8 floats (row stride lds) into 8 rows of 8 (row stride ldd), transposed in AVX
 * registers (both builds have AVX). */
INLINE void transpose8(float *dst, int64_t ldd, const float *src, int64_t lds) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

#endif
