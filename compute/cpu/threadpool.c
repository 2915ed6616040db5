/* threadpool.c — fork/join pool (see threadpool.h).
 *
 * A run publishes (fn, ctx) and bumps an atomic generation counter. Workers
 * wait for it spin-then-block: they poll the counter for a short while
 * (SPIN_NS, yielding the CPU between polls after YIELD_AFTER_NS so that more
 * threads than cores never starve the thread doing the work), then sleep on a
 * condition variable. The caller waits for the workers' countdown the same way.
 * Back-to-back runs (a decode step's matmuls) thus cost no syscalls, and an
 * idle or oversubscribed pool sleeps instead of burning CPU.
 *
 * Each share ith >= 1 of a run is claimed once, by its worker or by the
 * caller: slot[ith] holds the last generation whose share ith was claimed,
 * and the claim is a CAS from an older generation to the run's. The caller,
 * done with share 0, claims the shares whose workers have not started yet and
 * runs them itself, then waits only for the workers that did start. On a
 * machine with more runnable threads than cores a descheduled worker thus
 * never stalls a run (a decode step has ~160 of them: each used to wait a
 * time slice whenever the worker had lost its core); on a quiet machine the
 * workers claim their shares first and nothing changes. A late worker sees
 * its slot already at (or past) the generation it woke for and goes back to
 * waiting without touching that run's fn or ctx.
 */
#define _GNU_SOURCE
#include "compute/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/clock.h"

#define SPIN_NS 60000L        /* poll this long before sleeping */
#define YIELD_AFTER_NS 15000L /* after this, sched_yield() between polls */

struct st_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    atomic_ulong generation;
    atomic_int pending;
    atomic_int stop;
    atomic_ulong *slot; /* [n]: the last generation whose share ith was claimed */
    int sleepers;    /* workers blocked on start_cv (under mu) */
    int caller_wait; /* caller blocked on done_cv (under mu) */
    st_pool_fn fn;
    void *ctx;
};

typedef struct {
    st_pool *pool;
    int ith;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claims share ith of run gen for the calling thread: 1 if it is ours to run. */
static int claim_share(st_pool *pool, int ith, unsigned long gen) {
    unsigned long old = atomic_load_explicit(&pool->slot[ith], memory_order_acquire);
    while (old < gen)
        if (atomic_compare_exchange_weak_explicit(&pool->slot[ith], &old, gen, memory_order_acq_rel,
                                                  memory_order_acquire))
            return 1;
    return 0;
}

/* Runs share ith and counts it done; wakes the caller if it was the last. */
static void run_share(st_pool *pool, int ith) {
    pool->fn(pool->ctx, ith, pool->n);
    if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&pool->mu);
        if (pool->caller_wait) pthread_cond_signal(&pool->done_cv);
        pthread_mutex_unlock(&pool->mu);
    }
}

/* Polls until pred(pool, arg) holds or the spin budget is spent; returns
 * whether it holds. */
static int spin_until(st_pool *pool, int (*pred)(st_pool *, unsigned long), unsigned long arg) {
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (pred(pool, arg)) return 1;
        if ((i & 31) == 31) {
            uint64_t t = st_now_ns();
            if (t0 == 0) t0 = t;
            uint64_t el = t - t0;
            if (el > SPIN_NS) return pred(pool, arg);
            if (el > YIELD_AFTER_NS) sched_yield();
        }
        cpu_relax();
    }
}

static int has_work(st_pool *p, unsigned long seen) {
    return atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
           atomic_load_explicit(&p->stop, memory_order_acquire);
}

static int all_done(st_pool *p, unsigned long unused) {
    (void)unused;
    return atomic_load_explicit(&p->pending, memory_order_acquire) == 0;
}

static void *worker_main(void *p) {
    worker_arg *a = p;
    st_pool *pool = a->pool;
    int ith = a->ith;
    free(a);
    unsigned long seen = 0;
    for (;;) {
        if (!spin_until(pool, has_work, seen)) {
            pthread_mutex_lock(&pool->mu);
            pool->sleepers++;
            while (!has_work(pool, seen)) pthread_cond_wait(&pool->start_cv, &pool->mu);
            pool->sleepers--;
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) return NULL;
        seen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        /* fn and ctx are seen's as long as our share of it is unclaimed: the
         * caller cannot finish that run before the share is done. */
        if (claim_share(pool, ith, seen)) run_share(pool, ith);
    }
}

int st_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

st_pool *st_pool_new(int n_threads, st_err *err) {
    if (n_threads <= 0) n_threads = st_cpu_count();
    if (n_threads > 1024) return st_errf(err, "thread pool: %d threads is too many", n_threads), NULL;
    st_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return st_errf(err, "thread pool: out of memory"), NULL;
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->start_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->stop, 0);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    pool->slot = calloc((size_t)n_threads, sizeof *pool->slot);
    if (!pool->threads || !pool->slot) {
        pool->n = 1;
        st_pool_free(pool);
        return st_errf(err, "thread pool: out of memory"), NULL;
    }
    for (int i = 0; i < n_threads; i++) atomic_init(&pool->slot[i], 0);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a) {
            a->pool = pool;
            a->ith = i;
        }
        if (!a || pthread_create(&pool->threads[i], NULL, worker_main, a) != 0) {
            free(a);
            pool->n = i;
            st_pool_free(pool);
            return st_errf(err, "thread pool: cannot start thread %d of %d", i, n_threads), NULL;
        }
    }
    return pool;
}

void st_pool_free(st_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store_explicit(&pool->stop, 1, memory_order_release);
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->start_cv);
    pthread_cond_destroy(&pool->done_cv);
    free(pool->threads);
    free(pool->slot);
    free(pool);
}

int st_pool_size(const st_pool *pool) { return pool ? pool->n : 1; }

void st_pool_run(st_pool *pool, st_pool_fn fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    /* The release publishes fn, ctx and pending to workers that see the new generation. */
    unsigned long gen = atomic_fetch_add_explicit(&pool->generation, 1, memory_order_acq_rel) + 1;
    pthread_mutex_lock(&pool->mu);
    if (pool->sleepers) pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->mu);

    fn(ctx, 0, pool->n);
    for (int i = 1; i < pool->n; i++) /* shares whose workers have not started */
        if (claim_share(pool, i, gen)) run_share(pool, i);

    if (!spin_until(pool, all_done, 0)) {
        pthread_mutex_lock(&pool->mu);
        pool->caller_wait = 1;
        while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0)
            pthread_cond_wait(&pool->done_cv, &pool->mu);
        pool->caller_wait = 0;
        pthread_mutex_unlock(&pool->mu);
    }
}
