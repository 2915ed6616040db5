/* clock.h — the monotonic clock (CLOCK_MONOTONIC), for durations, deadlines
 * and the time stamps that cross processes on one machine (StageStats'
 * forward intervals): every process there reads the same clock. Never a
 * calendar time. Header-only; safe from any thread.
 */
#ifndef STRATA_COMMON_CLOCK_H
#define STRATA_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Now, in nanoseconds since an arbitrary fixed point (boot, on Linux). */
static inline uint64_t st_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Now, in seconds (same clock as st_now_ns); subtract two for a duration. */
static inline double st_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
