/* nccl_guard.c — the deadline, poll and abort of nccl_guard.h. Plain C, no
 * NCCL or CUDA: the calls come through nccl_guard_ops. */
#define _GNU_SOURCE
#include "compute/cuda/nccl_guard.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"

/* Polls that only yield before the pauses become sleeps: a decode step's
 * wait is tens of microseconds, so the first polls must not sleep. */
#define SPIN_POLLS 2000u

double nccl_guard_now_s(void) { return st_now_s(); }

unsigned nccl_guard_pause_us(unsigned polls) {
    if (polls < SPIN_POLLS) return 0;
    /* 20 us, growing to 200 us: a long wait costs no CPU to speak of. */
    unsigned us = 20u + (polls - SPIN_POLLS) / 8u;
    return us > 200u ? 200u : us;
}

void nccl_guard_pause(unsigned polls) {
    unsigned us = nccl_guard_pause_us(polls);
    if (us == 0) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, (long)us * 1000L};
    nanosleep(&ts, NULL);
}

void nccl_guard_init(nccl_guard *g, const nccl_guard_ops *ops, void *comm, double timeout_s,
                     atomic_int *group_failed, const char *name) {
    memset(g, 0, sizeof *g);
    g->ops = ops;
    g->comm = comm;
    g->timeout_s = timeout_s > 0 ? timeout_s : NCCL_GUARD_TIMEOUT_S;
    g->group_failed = group_failed;
    snprintf(g->name, sizeof g->name, "%s", name ? name : "?");
    g->deadline_var = "STRATA_NCCL_TIMEOUT_S";
}

void nccl_guard_abort(nccl_guard *g, const char *why) {
    if (g->aborted) return;
    g->aborted = true;
    snprintf(g->why, sizeof g->why, "%s", why && *why ? why : "aborted");
    if (g->group_failed) atomic_store(g->group_failed, 1);
    ST_ERROR("comm nccl (%s): aborting the communicator: %s", g->name, g->why);
    if (g->comm) {
        g->ops->comm_abort(g->comm);
        g->aborts++;
    }
    g->comm = NULL;
}

static int fail(nccl_guard *g, const char *what, const char *why, st_err *err) {
    nccl_guard_abort(g, why);
    return st_errf(err, "comm nccl %s (%s): %s; communicator aborted", what, g->name, why);
}

int nccl_guard_wait(nccl_guard *g, const char *what, nccl_poll launched, const char *launch_why,
                    nccl_work_poll work, void *ctx, st_err *err) {
    if (g->aborted)
        return st_errf(err, "comm nccl %s (%s): the communicator was aborted earlier (%s)", what, g->name, g->why);
    char why[200], msg[256];
    if (launched == NCCL_POLL_FAILED) {
        snprintf(msg, sizeof msg, "%s", launch_why && *launch_why ? launch_why : "the call failed");
        return fail(g, what, msg, err);
    }
    const double t0 = g->ops->now_s();
    bool enqueued = false; /* ncclCommGetAsyncError said ncclSuccess once */
    for (unsigned polls = 0;; polls++) {
        if (g->group_failed && atomic_load(g->group_failed))
            return fail(g, what, "another rank of the group aborted its communicator", err);
        if (!enqueued) {
            why[0] = 0;
            nccl_poll st = g->ops->comm_state(g->comm, why, sizeof why);
            if (st == NCCL_POLL_FAILED) {
                snprintf(msg, sizeof msg, "NCCL reports %s", why[0] ? why : "an error");
                return fail(g, what, msg, err);
            }
            enqueued = st == NCCL_POLL_DONE;
        }
        if (enqueued) {
            if (!work) return 0;
            why[0] = 0;
            nccl_poll w = work(ctx, why, sizeof why);
            if (w == NCCL_POLL_DONE) return 0;
            if (w == NCCL_POLL_FAILED) {
                snprintf(msg, sizeof msg, "the GPU work failed: %s", why[0] ? why : "?");
                return fail(g, what, msg, err);
            }
            /* The collective runs: an error a peer causes shows up here. */
            why[0] = 0;
            if (g->ops->comm_state(g->comm, why, sizeof why) == NCCL_POLL_FAILED) {
                snprintf(msg, sizeof msg, "NCCL reports %s", why[0] ? why : "an error");
                return fail(g, what, msg, err);
            }
        }
        double waited = g->ops->now_s() - t0;
        if (waited > g->timeout_s) {
            snprintf(msg, sizeof msg, "timed out after %.1f s (%s; deadline %s = %g s)", waited,
                     enqueued ? "the GPU work behind it never finished" : "NCCL still in progress",
                     g->deadline_var ? g->deadline_var : "?", g->timeout_s);
            return fail(g, what, msg, err);
        }
        g->ops->pause(polls);
    }
}

double nccl_guard_timeout_env(const char *name, double dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = NULL;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d) || d <= 0) {
        ST_WARN("comm nccl: %s=\"%s\" is not a positive number of seconds; using %.0f", name, v, dflt);
        return dflt;
    }
    return d;
}
