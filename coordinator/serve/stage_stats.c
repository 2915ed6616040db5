/* stage_stats.c — one stage's StageStats, as the coordinator keeps them (stage_stats.h). */
#include "coordinator/serve/stage_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int stage_stats_init(stage_stats *st) {
    st->fwd = calloc(STAGE_FWD_KEEP, sizeof *st->fwd);
    return st->fwd ? 0 : -1;
}

void stage_stats_free(stage_stats *st) {
    free(st->fwd);
    st->fwd = NULL;
}

/* The busy ratio over windows of at least 1 s of the worker's uptime (a
 * worker that restarted, uptime going back, starts a new window). */
static void update_busy_window(stage_stats *st, const Strata__V1__StageStats *s) {
    if (!st->have_stats || s->uptime_seconds < st->win_uptime_s) {
        st->win_busy_s = s->busy_seconds;
        st->win_uptime_s = s->uptime_seconds;
    } else if (s->uptime_seconds - st->win_uptime_s >= 1.0) {
        st->busy_ratio = (s->busy_seconds - st->win_busy_s) / (s->uptime_seconds - st->win_uptime_s);
        if (st->busy_ratio < 0) st->busy_ratio = 0;
        if (st->busy_ratio > 1) st->busy_ratio = 1;
        st->win_busy_s = s->busy_seconds;
        st->win_uptime_s = s->uptime_seconds;
    }
}

static void add_intervals(stage_stats *st, const Strata__V1__StageStats *s) {
    static const double bounds[COORD_FWD_N_BOUNDS] = COORD_FWD_BOUNDS;
    for (size_t k = 0; st->fwd && k + 1 < s->n_forward_ns; k += 2) {
        uint64_t a = s->forward_ns[k], b = s->forward_ns[k + 1];
        if (b <= st->fwd_last_end || a > b) continue;
        st->fwd[st->fwd_n % STAGE_FWD_KEEP][0] = a;
        st->fwd[st->fwd_n % STAGE_FWD_KEEP][1] = b;
        st->fwd_n++;
        st->fwd_last_end = b;
        double d = (double)(b - a) * 1e-9;
        int i = 0;
        while (i < COORD_FWD_N_BOUNDS && !(d <= bounds[i])) i++;
        st->fwd_buckets[i]++;
        st->fwd_sum_s += d;
    }
}

void stage_stats_apply(stage_stats *st, const Strata__V1__StageStats *s, double now) {
    if (!st->have_stats) {
        st->prev_busy_s = 0;
        st->prev_uptime_s = 0;
    }
    update_busy_window(st, s);
    st->bytes_sent = s->bytes_sent;
    st->frames_sent = s->frames_sent;
    st->hops = s->hops;
    st->hop_sum_s = s->hop_seconds;
    st->dropped_frames = s->dropped_frames;
    st->fenced_frames = s->fenced_frames;
    st->stats_at = now;
    if (!st->have_stats || s->forwards != st->forwards) st->fwd_moved_at = now;
    if (s->worker_name && s->worker_name[0])
        snprintf(st->worker_name, sizeof st->worker_name, "%s", s->worker_name);
    st->have_stats = true;
    st->busy_s = s->busy_seconds;
    st->uptime_s = s->uptime_seconds;
    st->forwards = s->forwards;
    st->tokens = s->tokens;
    st->queue_depth = s->queue_depth;
    add_intervals(st, s);
}

void stage_stats_restart_clock(stage_stats *st, double t) { st->stats_at = st->fwd_moved_at = t; }

void stage_stats_json(stage_stats *st, json_t *obj) {
    double du = st->uptime_s - st->prev_uptime_s, db = st->busy_s - st->prev_busy_s;
    json_t *fwd = json_array();
    uint64_t kept = st->fwd_n < STAGE_FWD_KEEP ? st->fwd_n : STAGE_FWD_KEEP;
    for (uint64_t k = st->fwd_n - kept; fwd && st->fwd && k < st->fwd_n; k++)
        json_array_append_new(fwd, json_pack("[I,I]", (json_int_t)st->fwd[k % STAGE_FWD_KEEP][0],
                                             (json_int_t)st->fwd[k % STAGE_FWD_KEEP][1]));
    json_object_set_new(obj, "busy_seconds", json_real(st->busy_s));
    json_object_set_new(obj, "uptime_seconds", json_real(st->uptime_s));
    json_object_set_new(obj, "forwards", json_integer((json_int_t)st->forwards));
    json_object_set_new(obj, "tokens", json_integer((json_int_t)st->tokens));
    json_object_set_new(obj, "busy_fraction", json_real(du > 0 ? db / du : 0.0));
    json_object_set_new(obj, "queue_depth", json_integer((json_int_t)st->queue_depth));
    json_object_set_new(obj, "dropped_frames", json_integer((json_int_t)st->dropped_frames));
    json_object_set_new(obj, "fenced_frames", json_integer((json_int_t)st->fenced_frames));
    json_object_set_new(obj, "forward_intervals", fwd ? fwd : json_array());
    st->prev_busy_s = st->busy_s;
    st->prev_uptime_s = st->uptime_s;
}

void stage_stats_report(const stage_stats *st, coord_stage_stats *out) {
    out->busy_ratio = st->busy_ratio;
    out->bytes_sent = st->bytes_sent;
    out->frames_sent = st->frames_sent;
    memcpy(out->fwd_buckets, st->fwd_buckets, sizeof st->fwd_buckets);
    out->fwd_sum_s = st->fwd_sum_s;
    out->hops = st->hops;
    out->hop_sum_s = st->hop_sum_s;
}
