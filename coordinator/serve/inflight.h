/* inflight.h — the micro-batches a cluster has launched and not yet got
 * back: one slot per batch (at most max_inflight), with its launch time and
 * token count, and the round trips of the batches that came back (launch to
 * result: their moving averages for the hang detection, hang_detect.h, their
 * sum, and the last INFLIGHT_KEEP [launch, result) intervals for
 * GET /v1/stages). Times are CLOCK_MONOTONIC ns, averages seconds.
 * Threading: the loop thread only. */
#ifndef STRATA_COORDINATOR_SERVE_INFLIGHT_H
#define STRATA_COORDINATOR_SERVE_INFLIGHT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coordinator/serve/sched.h"

#define INFLIGHT_KEEP 1024 /* micro-batch round trips kept for GET /v1/stages */
#define RTT_EWMA_ALPHA 0.1 /* the weight of each new round trip in the averages */

typedef struct inflight_table {
    int cap;                      /* slots (max_inflight) */
    const sched_batch **batch;    /* launched batches (NULL = a free slot) */
    uint64_t *launched_ns;        /* per slot: before the send */
    int *tokens;                  /* per slot: the batch's tokens */
    bool *overdue_warned;         /* per slot: "overdue, no hung stage found" logged */
    double rtt_avg, rtt_tok_avg;  /* moving averages: round trip, round trip per batch token (s) */
    double rtt_sum;               /* round trips summed (s) */
    uint64_t rtt_n;               /* round trips recorded; the next goes to ring[rtt_n % INFLIGHT_KEEP] */
    uint64_t (*ring)[2];
} inflight_table;

/* cap slots, all free; -1 when out of memory (inflight_free then). */
int inflight_init(inflight_table *t, int cap);
void inflight_free(inflight_table *t);
/* Takes a free slot for b launched at t_launch_ns (nothing when none is free:
 * the scheduler launches at most cap). */
void inflight_put(inflight_table *t, const sched_batch *b, uint64_t t_launch_ns);
/* The slot of batch_id; -1 when it is not in flight. */
int inflight_slot(const inflight_table *t, uint64_t batch_id);
/* The batch of slot came back at t_done_ns: its round trip is recorded and
 * the slot freed. */
void inflight_complete(inflight_table *t, int slot, uint64_t t_done_ns);
/* Aborts every batch in flight in s (their sequences keep their positions)
 * and frees the slots. */
void inflight_abort_all(inflight_table *t, sched *s);
int inflight_count(const inflight_table *t);
/* The kept round trips, oldest first, as [[launch_ns, result_ns], ...]. */
json_t *inflight_intervals_json(const inflight_table *t);

#endif
