/* log_limit.h — at most one log line per interval for a recurring event
 * (an accept error at the fd limit, refused connections), with a count of
 * the occurrences left out, so that an attacker or a fault cannot flood the
 * log. Not thread-safe: one limiter per thread (per event loop).
 *
 *   static st_log_limit lim = ST_LOG_LIMIT_INIT(10.0);
 *   unsigned long dropped;
 *   if (st_log_limit_allow(&lim, st_now_s(), &dropped))
 *       ST_WARN("accept: %s (%lu more since the last message)", strerror(e), dropped);
 */
#ifndef STRATA_COMMON_LOG_LIMIT_H
#define STRATA_COMMON_LOG_LIMIT_H

#include <stdbool.h>

typedef struct st_log_limit {
    double interval_s;        /* minimum seconds between two lines */
    double last_s;            /* when the last line was allowed; < 0: never */
    unsigned long suppressed; /* occurrences since then that were not logged */
} st_log_limit;

#define ST_LOG_LIMIT_INIT(interval) {(interval), -1.0, 0}

/* Counts one occurrence at now_s (monotonic seconds, clock.h). True when it
 * may be logged; then *suppressed gets the number left out since the last
 * allowed one, and the count restarts. */
bool st_log_limit_allow(st_log_limit *l, double now_s, unsigned long *suppressed);

#endif
