/* test_threadpool.c — the fork/join pool: every ith runs exactly once per run
 * (ith 0 on the caller), many back-to-back runs, runs separated by idle gaps
 * longer than the spin budget (workers and caller must sleep and wake), and
 * more threads than cores (8-thread pools, several pools at once), and a
 * share whose worker has not started when the caller is done with share 0
 * (the caller runs it, once, after its own). */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "compute/cpu/threadpool.h"
#include "tests/testutil.h"

#define MAXN 16

typedef struct {
    atomic_int count[MAXN];
    atomic_int bad_nth;
    atomic_int caller_mismatch;
    pthread_t caller;
    int nth;
    int sleep_us; /* worker 1 sleeps this long (forces the caller to block) */
} ctr;

static void count_fn(void *p, int ith, int nth) {
    ctr *c = p;
    if (nth != c->nth || ith < 0 || ith >= nth) atomic_fetch_add(&c->bad_nth, 1);
    else atomic_fetch_add(&c->count[ith], 1);
    if (ith == 0 && !pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->caller_mismatch, 1);
    if (ith == 1 && c->sleep_us) {
        struct timespec ts = {0, c->sleep_us * 1000L};
        nanosleep(&ts, NULL);
    }
}

static void run_many(int n, int runs, int sleep_us, int gap_us) {
    st_err err = {0};
    st_pool *pool = st_pool_new(n, &err);
    REQUIRE(pool);
    CHECK_EQ_INT(st_pool_size(pool), n);
    ctr c = {.caller = pthread_self(), .nth = n, .sleep_us = sleep_us};
    for (int r = 0; r < runs; r++) {
        st_pool_run(pool, count_fn, &c);
        /* After each run every thread has finished: the counts are exact. */
        for (int i = 0; i < n; i++) CHECK_EQ_INT(atomic_load(&c.count[i]), r + 1);
        if (gap_us) {
            struct timespec ts = {0, gap_us * 1000L};
            nanosleep(&ts, NULL);
        }
    }
    CHECK_EQ_INT(atomic_load(&c.bad_nth), 0);
    CHECK_EQ_INT(atomic_load(&c.caller_mismatch), 0);
    st_pool_free(pool);
}

/* Records who ran share 1 and whether share 0 had finished by then. */
typedef struct {
    pthread_t caller;
    atomic_int share0_done, share1_runs, share1_on_caller, share1_before_0;
} helper_rec;

static void helper_fn(void *p, int ith, int nth) {
    helper_rec *h = p;
    (void)nth;
    if (ith == 0) {
        atomic_store(&h->share0_done, 1);
    } else {
        atomic_fetch_add(&h->share1_runs, 1);
        if (pthread_equal(pthread_self(), h->caller)) {
            atomic_fetch_add(&h->share1_on_caller, 1);
            if (!atomic_load(&h->share0_done)) atomic_fetch_add(&h->share1_before_0, 1);
        }
    }
}

/* Runs separated by gaps past the spin budget, so the worker is asleep on
 * its condition variable when a run starts: waking it takes a futex wake-up,
 * while the caller finishes its (empty) share 0 at once and claims share 1. */
static void caller_takes_late_shares(void) {
    st_err err = {0};
    st_pool *pool = st_pool_new(2, &err);
    REQUIRE(pool);
    int on_caller = 0;
    for (int r = 0; r < 50; r++) {
        helper_rec h = {.caller = pthread_self()};
        st_pool_run(pool, helper_fn, &h);
        CHECK_EQ_INT(atomic_load(&h.share1_runs), 1);
        CHECK_EQ_INT(atomic_load(&h.share1_before_0), 0);
        on_caller += atomic_load(&h.share1_on_caller);
        struct timespec ts = {0, 2000 * 1000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "share 1 ran on the caller in %d of 50 runs\n", on_caller);
    CHECK(on_caller >= 1);
    st_pool_free(pool);
}

static void *pool_thread(void *p) {
    (void)p;
    run_many(8, 300, 0, 0);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
    CHECK(st_cpu_count() >= 1);
    /* st_split_range covers [0, n) in order with chunks differing by at most 1. */
    for (long n = 0; n < 40; n++)
        for (int nth = 1; nth <= 9; nth++) {
            long prev = 0;
            for (int i = 0; i < nth; i++) {
                long lo, hi;
                st_split_range(n, i, nth, &lo, &hi);
                CHECK_EQ_INT(lo, prev);
                CHECK(hi - lo == n / nth || hi - lo == n / nth + 1);
                prev = hi;
            }
            CHECK_EQ_INT(prev, n);
        }

    /* NULL pool runs inline as one thread. */
    ctr c1 = {.caller = pthread_self(), .nth = 1};
    st_pool_run(NULL, count_fn, &c1);
    CHECK_EQ_INT(atomic_load(&c1.count[0]), 1);
    CHECK_EQ_INT(st_pool_size(NULL), 1);

    for (int n = 1; n <= 3; n++) run_many(n, 3000, 0, 0);
    double t0 = now_s();
    run_many(8, 2000, 0, 0); /* 8 threads on (typically) 2 cores */
    double dt = now_s() - t0;
    fprintf(stderr, "pool of 8: 2000 runs in %.3f s\n", dt);
    CHECK(dt < 60.0);
    run_many(3, 20, 2000, 0);  /* caller waits past the spin budget */
    run_many(3, 20, 0, 1000); /* workers go to sleep between runs */
    run_many(4, 5, 100000, 0); /* a slow worker */
    caller_takes_late_shares();

    /* Four 8-thread pools at once (TP ranks × pools on few cores). */
    pthread_t th[4];
    t0 = now_s();
    for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&th[i], NULL, pool_thread, NULL) == 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    dt = now_s() - t0;
    fprintf(stderr, "4 pools of 8: 300 runs each in %.3f s\n", dt);
    CHECK(dt < 60.0);

    /* Creating and freeing pools repeatedly does not leak or hang. */
    for (int i = 0; i < 50; i++) {
        st_err err = {0};
        st_pool *p = st_pool_new(3, &err);
        REQUIRE(p);
        st_pool_free(p);
    }
    st_err err = {0};
    CHECK(st_pool_new(100000, &err) == NULL);
    return test_summary();
}
