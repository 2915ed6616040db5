/* test_nccl_guard.c — compute/cuda/nccl_guard.h on the CPU, with a fake NCCL
 * and a fake clock: a call in progress forever times out and aborts the
 * communicator once; an async error aborts at once; a CUDA event that never
 * completes times out; a failed launch aborts; success never aborts; a
 * guard aborted once fails every later wait without calling NCCL; a rank
 * whose group peer aborted gives up at its next poll; the environment's
 * deadline is parsed and bad values refused.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cuda/nccl_guard.h"
#include "tests/testutil.h"

/* The fake communicator: its async state for the next polls. */
typedef struct fake_comm {
    int pending_polls;   /* comm_state says PENDING this many times, then final */
    nccl_poll final;     /* then this (DONE or FAILED); -1: PENDING forever */
    int forever;
    int fail_at;         /* from this comm_state call on (1-based): FAILED; 0 = never */
    int state_calls, aborts;
    double now;          /* the fake clock, advanced by pause */
    double step;         /* seconds each pause takes */
    unsigned pauses;
} fake_comm;

static fake_comm *g_fake; /* now_s/pause have no context argument */

static nccl_poll fake_state(void *comm, char *why, size_t n) {
    fake_comm *f = comm;
    f->state_calls++;
    if (f->fail_at && f->state_calls >= f->fail_at) {
        snprintf(why, n, "remote process exited or there was a network error");
        return NCCL_POLL_FAILED;
    }
    if (f->forever) return NCCL_POLL_PENDING;
    if (f->pending_polls > 0) {
        f->pending_polls--;
        return NCCL_POLL_PENDING;
    }
    if (f->final == NCCL_POLL_FAILED) snprintf(why, n, "remote process exited or there was a network error");
    return f->final;
}
static void fake_abort(void *comm) { ((fake_comm *)comm)->aborts++; }
static double fake_now(void) { return g_fake->now; }
static void fake_pause(unsigned polls) {
    (void)polls;
    g_fake->pauses++;
    g_fake->now += g_fake->step;
}

static const nccl_guard_ops fake_ops = {fake_state, fake_abort, fake_now, fake_pause};

/* The fake CUDA event: PENDING for `left` polls, then `final`; or forever. */
typedef struct fake_work {
    int left, forever, calls;
    nccl_poll final;
} fake_work;

static nccl_poll work_poll(void *ctx, char *why, size_t n) {
    fake_work *w = ctx;
    w->calls++;
    if (w->forever) return NCCL_POLL_PENDING;
    if (w->left > 0) {
        w->left--;
        return NCCL_POLL_PENDING;
    }
    if (w->final == NCCL_POLL_FAILED) snprintf(why, n, "an illegal memory access was encountered");
    return w->final;
}

static void setup(fake_comm *f, nccl_guard *g, double timeout, atomic_int *group) {
    memset(f, 0, sizeof *f);
    f->step = 0.01;
    g_fake = f;
    nccl_guard_init(g, &fake_ops, f, timeout, group, "rank 0 (device 0)");
}

static void test_success(void) {
    fake_comm f;
    nccl_guard g;
    setup(&f, &g, 5.0, NULL);
    f.pending_polls = 3; /* ncclInProgress three times, then ncclSuccess */
    f.final = NCCL_POLL_DONE;
    st_err err = {{0}};
    CHECK_EQ_INT(nccl_guard_wait(&g, "all_reduce", NCCL_POLL_PENDING, NULL, NULL, NULL, &err), 0);
    CHECK_EQ_INT(f.state_calls, 4);
    CHECK_EQ_INT(f.pauses, 3);
    CHECK_EQ_INT(f.aborts, 0);
    CHECK(!g.aborted);
    /* With GPU work: it completes after 5 polls; no abort either. */
    fake_work w = {.left = 5, .final = NCCL_POLL_DONE};
    CHECK_EQ_INT(nccl_guard_wait(&g, "all_reduce", NCCL_POLL_DONE, NULL, work_poll, &w, &err), 0);
    CHECK_EQ_INT(w.calls, 6);
    CHECK_EQ_INT(f.aborts, 0);
    CHECK_EQ_INT((int)g.aborts, 0);
}

static void test_in_progress_forever(void) {
    fake_comm f;
    nccl_guard g;
    setup(&f, &g, 2.0, NULL);
    f.forever = 1;
    st_err err = {{0}};
    CHECK_EQ_INT(nccl_guard_wait(&g, "all_reduce", NCCL_POLL_PENDING, NULL, NULL, NULL, &err), -1);
    CHECK_EQ_INT(f.aborts, 1);
    CHECK(g.aborted);
    CHECK_MSG(strstr(err.msg, "comm nccl all_reduce (rank 0 (device 0)): timed out after 2.0") != NULL, "%s", err.msg);
    CHECK_MSG(strstr(err.msg, "NCCL still in progress; deadline STRATA_NCCL_TIMEOUT_S = 2 s)") &&
                  strstr(err.msg, "communicator aborted"),
              "%s", err.msg);
    /* It gave up at the deadline, not before and not much later: 2.0 s in 0.01 s steps. */
    CHECK_MSG(f.now >= 2.0 && f.now < 2.05, "clock %.3f", f.now);
    CHECK(f.pauses >= 200 && f.pauses <= 202);
    /* Every later call fails at once, never touching NCCL again. */
    int calls = f.state_calls;
    CHECK_EQ_INT(nccl_guard_wait(&g, "barrier", NCCL_POLL_DONE, NULL, NULL, NULL, &err), -1);
    CHECK_MSG(strstr(err.msg, "comm nccl barrier (rank 0 (device 0)): the communicator was aborted earlier (timed out") != NULL,
              "%s", err.msg);
    CHECK_EQ_INT(f.state_calls, calls);
    CHECK_EQ_INT(f.aborts, 1);
    nccl_guard_abort(&g, "again");
    CHECK_EQ_INT(f.aborts, 1);
}

static void test_work_never_done(void) {
    fake_comm f;
    nccl_guard g;
    setup(&f, &g, 1.0, NULL);
    f.final = NCCL_POLL_DONE;
    fake_work w = {.forever = 1};
    st_err err = {{0}};
    CHECK_EQ_INT(nccl_guard_wait(&g, "all_gather", NCCL_POLL_DONE, NULL, work_poll, &w, &err), -1);
    CHECK_EQ_INT(f.aborts, 1);
    CHECK_MSG(strstr(err.msg, "the GPU work behind it never finished") != NULL, "%s", err.msg);
    CHECK(w.calls >= 100);
}

static void test_async_error(void) {
    fake_comm f;
    nccl_guard g;
    setup(&f, &g, 30.0, NULL);
    f.pending_polls = 2;
    f.final = NCCL_POLL_FAILED;
    st_err err = {{0}};
    CHECK_EQ_INT(nccl_guard_wait(&g, "all_reduce", NCCL_POLL_PENDING, NULL, NULL, NULL, &err), -1);
    CHECK_EQ_INT(f.aborts, 1);
    CHECK_EQ_INT(f.state_calls, 3);
    CHECK_MSG(strstr(err.msg, "NCCL reports remote process exited or there was a network error") != NULL, "%s", err.msg);
    CHECK(f.now < 0.1); /* at once, not at the deadline */

    /* An error while the GPU work runs (a peer died mid-collective). */
    setup(&f, &g, 30.0, NULL);
    f.pending_polls = 0;
    f.final = NCCL_POLL_DONE;
    fake_work w = {.forever = 1};
    /* comm_state: DONE (enqueued), DONE while the work runs, then FAILED. */
    f.fail_at = 3;
    CHECK_EQ_INT(nccl_guard_wait(&g, "all_reduce", NCCL_POLL_DONE, NULL, work_poll, &w, &err), -1);
    CHECK_EQ_INT(f.aborts, 1);
    CHECK_EQ_INT(f.state_calls, 3);
    CHECK_EQ_INT(w.calls, 2);
    CHECK_MSG(strstr(err.msg, "NCCL reports remote process") != NULL, "%s", err.msg);

    /* A CUDA error on the stream aborts too. */
    setup(&f, &g, 30.0, NULL);
    f.final = NCCL_POLL_DONE;
    fake_work bad = {.left = 1, .final = NCCL_POLL_FAILED};
    CHECK_EQ_INT(nccl_guard_wait(&g, "all_reduce", NCCL_POLL_DONE, NULL, work_poll, &bad, &err), -1);
    CHECK_EQ_INT(f.aborts, 1);
    CHECK_MSG(strstr(err.msg, "the GPU work failed: an illegal memory access was encountered") != NULL, "%s", err.msg);
}

static void test_launch_failed(void) {
    fake_comm f;
    nccl_guard g;
    setup(&f, &g, 30.0, NULL);
    st_err err = {{0}};
    CHECK_EQ_INT(nccl_guard_wait(&g, "broadcast", NCCL_POLL_FAILED, "ncclBroadcast: invalid usage", NULL, NULL, &err),
                 -1);
    CHECK_EQ_INT(f.aborts, 1);
    CHECK_EQ_INT(f.state_calls, 0);
    CHECK_MSG(strstr(err.msg, "comm nccl broadcast (rank 0 (device 0)): ncclBroadcast: invalid usage; communicator aborted") !=
                  NULL,
              "%s", err.msg);
}

static void test_group_peer_failed(void) {
    atomic_int group = 0;
    fake_comm f0, f1;
    nccl_guard g0, g1;
    setup(&f1, &g1, 30.0, &group);
    setup(&f0, &g0, 30.0, &group);
    /* Rank 0 sees an async error and aborts: the group is marked failed. */
    f0.final = NCCL_POLL_FAILED;
    st_err err = {{0}};
    CHECK_EQ_INT(nccl_guard_wait(&g0, "all_reduce", NCCL_POLL_PENDING, NULL, NULL, NULL, &err), -1);
    CHECK_EQ_INT(atomic_load(&group), 1);
    /* Rank 1, stuck in its collective, gives up at its next poll. */
    g_fake = &f1;
    f1.forever = 1;
    CHECK_EQ_INT(nccl_guard_wait(&g1, "all_reduce", NCCL_POLL_PENDING, NULL, NULL, NULL, &err), -1);
    CHECK_EQ_INT(f1.aborts, 1);
    CHECK(f1.now < 0.1);
    CHECK_MSG(strstr(err.msg, "another rank of the group aborted its communicator") != NULL, "%s", err.msg);
}

static void test_timeout_env(void) {
    unsetenv("STRATA_NCCL_TEST_T");
    CHECK_NEAR(nccl_guard_timeout_env("STRATA_NCCL_TEST_T", 30.0), 30.0, 0);
    setenv("STRATA_NCCL_TEST_T", "2.5", 1);
    CHECK_NEAR(nccl_guard_timeout_env("STRATA_NCCL_TEST_T", 30.0), 2.5, 0);
    const char *bad[] = {"0", "-1", "abc", "5s", "nan", "inf", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("STRATA_NCCL_TEST_T", bad[i], 1);
        CHECK_MSG(nccl_guard_timeout_env("STRATA_NCCL_TEST_T", 30.0) == 30.0, "'%s' accepted", bad[i]);
    }
    unsetenv("STRATA_NCCL_TEST_T");
}

/* The real pause yields first, then backs off to short sleeps (its
 * schedule, not wall time: a loaded machine stretches any sleep). */
static void test_real_pause(void) {
    CHECK(nccl_guard_pause_us(0) == 0);
    CHECK(nccl_guard_pause_us(1999) == 0);
    CHECK(nccl_guard_pause_us(2000) == 20);
    CHECK(nccl_guard_pause_us(2008) == 21);
    CHECK(nccl_guard_pause_us(2000 + 8 * 180) == 200);
    CHECK(nccl_guard_pause_us(1000000) == 200);
    CHECK(nccl_guard_pause_us(~0u) == 200);
    for (unsigned i = 0; i < 100; i++) nccl_guard_pause(i); /* yields only: returns */
    nccl_guard_pause(1000000);
}

int main(void) {
    test_success();
    test_in_progress_forever();
    test_work_never_done();
    test_async_error();
    test_launch_failed();
    test_group_peer_failed();
    test_timeout_env();
    test_real_pause();
    return test_summary();
}
