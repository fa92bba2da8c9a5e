/*
 * row_max.h — internal: the largest element of a row, shared by the CPU's softmax (cpu_rows.c) and
 * the fused attention's online softmax (cpu_attention.c).
 */
#ifndef TS_CPU_ROW_MAX_H
#define TS_CPU_ROW_MAX_H

#include <stdint.h>

#define MAX_LANES 8

/* The largest element of x[0..C), C ≥ 1, in MAX_LANES independent lanes: that many chains of
 * comparisons run side by side instead of one. (gcc will not vectorise a float max reduction
 * without -ffinite-math-only and -fno-signed-zeros, so the lanes stay scalar.) The order does not
 * matter to softmax: without a NaN the maximum is the same number whatever the order (at most the
 * sign of a zero differs, and x − (+0) and x − (−0) have the same exponential); a row with a NaN
 * comes out all NaN whatever this returns. */
static inline float ts_row_max(const float *x, int64_t C) {
    float m[MAX_LANES];
    for (int k = 0; k < MAX_LANES; k++)
        m[k] = x[0];
    int64_t i = 0;
    for (; i + MAX_LANES <= C; i += MAX_LANES)
        for (int k = 0; k < MAX_LANES; k++)
            m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    for (; i < C; i++)
        m[0] = x[i] > m[0] ? x[i] : m[0];
    float mx = m[0];
    for (int k = 1; k < MAX_LANES; k++)
        mx = m[k] > mx ? m[k] : mx;
    return mx;
}

#endif
