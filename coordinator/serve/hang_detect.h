/* hang_detect.h — the per-micro-batch deadline (docs/recovery.md, "What is
 * detected"). A batch in flight that has not come back within its bound,
 *   bound = max(HANG_FLOOR_S, HANG_MULT x the expected round trip),
 * makes the cluster look for a hung stage. The expected round trip is the
 * larger of the moving average of recent round trips and the moving average
 * of the time per batch token times the batch's tokens (inflight.h), so a
 * long prefill chunk after many short decode steps is not a hang. Before any
 * round trip was measured the bound is HANG_COLD_S (a first prefill of a
 * large model may take long).
 *
 * A hung stage is, in this order:
 *  1. the stage whose latest StageStats is the oldest, when it is older than
 *     the bound: it answers no poll (every 100 ms) — a stopped process
 *     (SIGSTOP), a partition that drops its packets, or a wedged event loop;
 *  2. else the first stage with work queued (StageStats.queue_depth counts
 *     the running forward) whose `forwards` counter has not moved for longer
 *     than the bound: its compute thread is wedged while its loop answers.
 * When neither holds, the late batch is logged once and waited for.
 * Threading: the loop thread only. */
#ifndef STRATA_COORDINATOR_SERVE_HANG_DETECT_H
#define STRATA_COORDINATOR_SERVE_HANG_DETECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator/serve/inflight.h"
#include "coordinator/serve/stage_stats.h"

#define HANG_FLOOR_S 2.0
#define HANG_MULT 20.0
#define HANG_COLD_S 10.0
/* No verdict at a poll that comes this long after the previous one (the
 * coordinator itself was not scheduled; the stages' replies wait unread). */
#define HANG_STALL_S 0.5

/* The bound of the batch in slot, in seconds. */
double hang_batch_bound(const inflight_table *t, int slot);
/* The hung stage's index among stages[n] for a batch overdue by `bound`
 * seconds at `now` (monotonic seconds), -1 when none is found. */
int hang_find_stage(const stage_stats *const *stages, int n, double now, double bound);
/* One poll of the deadline. *last_tick is the previous poll's time (updated).
 * Returns the hung stage's index and writes why into why[cap] ("batch B not
 * back after A s, bound X s; no stats from the stage for S s", or "...; its
 * compute made no progress for S s with Q queued"); -1 when no stage is to
 * be declared lost at this poll. */
int hang_check(inflight_table *t, const stage_stats *const *stages, int n, double *last_tick, char *why,
               size_t cap);

#endif
