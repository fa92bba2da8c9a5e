/*
 * clock.h — the one clock of the code base: seconds on a monotonic clock (CLOCK_MONOTONIC), for
 * durations, rates and deadlines. Not the time of day, and not comparable across processes.
 */
#ifndef TS_BASE_CLOCK_H
#define TS_BASE_CLOCK_H

#ifdef __cplusplus
extern "C" {
#endif

double ts_now_s(void);

#ifdef __cplusplus
}
#endif

#endif
