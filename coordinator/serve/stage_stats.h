/* stage_stats.h — what the coordinator knows of one stage's worker from its
 * StageStats replies (proto/stage.proto; the cluster polls every stage with
 * a StatsRequest every 100 ms): cumulative busy/uptime seconds, forwards and
 * tokens, queue depth, transport counters, the forward intervals
 * ([start, end) CLOCK_MONOTONIC ns of the worker's machine, the last
 * STAGE_FWD_KEEP kept) with their duration histogram (COORD_FWD_BOUNDS),
 * and when the stage last showed life (the hang detection's inputs).
 * Threading: the loop thread only. */
#ifndef STRATA_COORDINATOR_SERVE_STAGE_STATS_H
#define STRATA_COORDINATOR_SERVE_STAGE_STATS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coordinator/serve/engine_api.h"
#include "proto/stage.pb-c.h"

#define STAGE_FWD_KEEP 1024 /* forward intervals kept per stage for GET /v1/stages */

typedef struct stage_stats {
    bool have_stats;
    double busy_s, uptime_s;
    uint64_t forwards, tokens;
    uint32_t queue_depth;                   /* forwards queued, the running one included */
    uint64_t bytes_sent, frames_sent;       /* the worker's transport counters */
    uint64_t dropped_frames, fenced_frames; /* frames the worker dropped; of them, of an older epoch */
    char worker_name[COORD_NAME_LEN];
    double stats_at;     /* monotonic seconds of the latest StageStats (its last sign of life) */
    double fwd_moved_at; /* monotonic seconds `forwards` last changed */
    /* GET /metrics busy ratio: over windows of >= 1 s of worker uptime */
    double win_busy_s, win_uptime_s, busy_ratio;
    /* snapshot at the previous GET /v1/stages (busy_fraction) */
    double prev_busy_s, prev_uptime_s;
    /* fwd_n intervals received in all; the next goes to fwd[fwd_n % STAGE_FWD_KEEP];
     * fwd_last_end = the newest end (the next StatsRequest asks for later ones) */
    uint64_t (*fwd)[2];
    uint64_t fwd_n, fwd_last_end;
    uint64_t fwd_buckets[COORD_FWD_N_BOUNDS + 1];
    double fwd_sum_s;
    uint64_t hops;    /* hand-offs to the next hop and their summed seconds */
    double hop_sum_s;
} stage_stats;

/* Allocates the interval ring; -1 when out of memory. */
int stage_stats_init(stage_stats *st);
void stage_stats_free(stage_stats *st);
/* Takes one StageStats reply received at `now` (monotonic seconds). Replies
 * may overlap: only intervals that end after the newest kept are added. */
void stage_stats_apply(stage_stats *st, const Strata__V1__StageStats *s, double now);
/* Both the life signs restart at t (the cluster became ready or resumed). */
void stage_stats_restart_clock(stage_stats *st, double t);
/* The stage's GET /v1/stages fields into obj (busy_seconds, uptime_seconds,
 * forwards, tokens, busy_fraction since the previous call, queue_depth,
 * dropped_frames, fenced_frames, forward_intervals, oldest first); starts
 * the next busy_fraction window. */
void stage_stats_json(stage_stats *st, json_t *obj);
/* The /metrics fields of out (busy ratio, transport counters, forward
 * histogram, hops); load_seconds and worker are the caller's. */
void stage_stats_report(const stage_stats *st, coord_stage_stats *out);

#endif
