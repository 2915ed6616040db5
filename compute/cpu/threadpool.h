/* threadpool.h — a fork/join pool for the CPU kernels.
 *
 * st_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once for each ith in
 * [0, nth) — ith 0 on the calling thread — and returns when all have finished.
 * A share ith >= 1 runs on a worker, or on the calling thread after share 0
 * when its worker had not started by then (a worker without a core never
 * stalls a run): fn must not wait for other shares of the same run.
 * One run at a time per pool; a pool is used by one caller thread (one TP rank).
 */
#ifndef STRATA_COMPUTE_CPU_THREADPOOL_H
#define STRATA_COMPUTE_CPU_THREADPOOL_H

#include "common/err.h"

typedef struct st_pool st_pool;
typedef void (*st_pool_fn)(void *ctx, int ith, int nth);

/* n_threads counts the caller; 0 means st_cpu_count(). */
st_pool *st_pool_new(int n_threads, st_err *err);
void st_pool_free(st_pool *pool);
int st_pool_size(const st_pool *pool);
void st_pool_run(st_pool *pool, st_pool_fn fn, void *ctx);

/* Online CPUs available to this process (sched_getaffinity). */
int st_cpu_count(void);

/* Splits [0, n) into nth near-equal chunks; chunk ith is [*lo, *hi). */
static inline void st_split_range(long n, int ith, int nth, long *lo, long *hi) {
    long q = n / nth, r = n % nth;
    *lo = ith * q + (ith < r ? ith : r);
    *hi = *lo + q + (ith < r ? 1 : 0);
}

#endif
