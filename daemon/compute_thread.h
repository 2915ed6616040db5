/* compute_thread.h — the worker's compute thread: owns the stage (engine/stage.h)
 * and runs jobs (open a stage, forward a micro-batch) strictly in submission
 * order, so the event loop keeps progressing UCX while a forward runs.
 *
 * Hand-off: the loop thread submits jobs (compute_submit); the compute thread
 * runs them and appends them to a done list, then writes the eventfd
 * (compute_fd). The loop thread, on that fd, takes the finished jobs
 * (compute_take_done) in the order they were submitted. A job is owned by the
 * compute thread from submit until it is taken back; the loop thread never
 * touches the stage.
 *
 * Stats: after every job the compute thread snapshots the counters under a
 * mutex (compute_get_stats), because stage_stats_get / stage_rank_stats_get
 * are not safe to call while a forward runs.
 */
#ifndef STRATA_DAEMON_COMPUTE_THREAD_H
#define STRATA_DAEMON_COMPUTE_THREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "daemon/cjob.h"
#include "engine/stage.h"

#define COMPUTE_MAX_RANKS 64

typedef struct compute_stats {
    bool loaded;
    uint64_t forwards, tokens; /* cumulative over every stage this thread ran */
    double busy_seconds;       /* cumulative wall time inside stage_forward */
    int n_ranks;               /* of the current stage */
    stage_rank_stats ranks[COMPUTE_MAX_RANKS];
    int queued;                /* jobs submitted and not yet finished */
} compute_stats;

typedef struct compute compute;

/* Starts the thread (no stage loaded). NULL + err on failure. */
compute *compute_create(st_err *err);
/* Finishes the running job, drops the queued ones (they stay owned by the
 * thread: they are moved to the done list, with status -1 "shutting down",
 * and handed back by compute_take_done), closes the stage and joins. After
 * this only compute_take_done and compute_free may be called. */
void compute_stop(compute *c);
/* Frees the object (after compute_stop and after taking every job back). */
void compute_free(compute *c);

/* The eventfd that becomes readable when jobs finished (EV_READ). */
int compute_fd(const compute *c);
void compute_submit(compute *c, cjob *job);
/* Returns the finished jobs as a list in submission order (NULL if none) and
 * clears the fd's readiness. */
cjob *compute_take_done(compute *c);
/* Runs a FORWARD job on the caller's thread, now, when the compute thread is
 * idle (nothing queued, running or finished and not yet taken; a stage
 * loaded), and returns true: the job is finished (status, outputs, times as
 * if the thread had run it, counted in the stats) and stays the caller's; it
 * does not go to the done list. Otherwise returns false and the job is
 * untouched (submit it). Saves the two thread hand-offs of a forward (wake the
 * thread, wake the caller's loop) when nothing else is in flight. */
bool compute_run_inline(compute *c, cjob *job);
void compute_get_stats(compute *c, compute_stats *out);

#endif
