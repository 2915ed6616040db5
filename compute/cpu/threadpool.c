/* threadpool.c — fork/join pool (see threadpool.h). Workers wait on a condition
 * variable between runs; a run bumps a generation counter and wakes them. */
#define _GNU_SOURCE
#include "compute/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

struct st_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    unsigned long generation;
    int pending;
    int stop;
    st_pool_fn fn;
    void *ctx;
};

typedef struct {
    st_pool *pool;
    int ith;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg *a = p;
    st_pool *pool = a->pool;
    int ith = a->ith;
    free(a);
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mu);
        while (!pool->stop && pool->generation == seen) pthread_cond_wait(&pool->start_cv, &pool->mu);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->mu);
            return NULL;
        }
        seen = pool->generation;
        st_pool_fn fn = pool->fn;
        void *ctx = pool->ctx;
        pthread_mutex_unlock(&pool->mu);

        fn(ctx, ith, pool->n);

        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done_cv);
        pthread_mutex_unlock(&pool->mu);
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
    st_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return st_errf(err, "thread pool: out of memory"), NULL;
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->start_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        a->pool = pool;
        a->ith = i;
        if (pthread_create(&pool->threads[i], NULL, worker_main, a) != 0) {
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
    pool->stop = 1;
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->start_cv);
    pthread_cond_destroy(&pool->done_cv);
    free(pool->threads);
    free(pool);
}

int st_pool_size(const st_pool *pool) { return pool ? pool->n : 1; }

void st_pool_run(st_pool *pool, st_pool_fn fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->ctx = ctx;
    pool->pending = pool->n - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->mu);

    fn(ctx, 0, pool->n);

    pthread_mutex_lock(&pool->mu);
    while (pool->pending > 0) pthread_cond_wait(&pool->done_cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}
