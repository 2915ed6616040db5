/* hang_detect.c — the per-micro-batch deadline (hang_detect.h). */
#include "coordinator/serve/hang_detect.h"

#include <stdio.h>

#include "common/clock.h"
#include "common/log.h"

double hang_batch_bound(const inflight_table *t, int slot) {
    if (t->rtt_n == 0) return HANG_COLD_S > HANG_FLOOR_S ? HANG_COLD_S : HANG_FLOOR_S;
    double expect = t->rtt_tok_avg * (double)t->tokens[slot];
    if (t->rtt_avg > expect) expect = t->rtt_avg;
    return HANG_MULT * expect > HANG_FLOOR_S ? HANG_MULT * expect : HANG_FLOOR_S;
}

int hang_find_stage(const stage_stats *const *stages, int n, double now, double bound) {
    int stale = -1;
    for (int i = 0; i < n; i++)
        if (now - stages[i]->stats_at > bound && (stale < 0 || stages[i]->stats_at < stages[stale]->stats_at))
            stale = i;
    if (stale >= 0) return stale;
    for (int i = 0; i < n; i++) {
        const stage_stats *st = stages[i];
        if (st->have_stats && st->queue_depth > 0 && now - st->fwd_moved_at > bound) return i;
    }
    return -1;
}

int hang_check(inflight_table *t, const stage_stats *const *stages, int n, double *last_tick, char *why,
               size_t cap) {
    uint64_t now_ns = st_now_ns();
    double now = st_now_s(), gap = now - *last_tick;
    *last_tick = now;
    /* This process was held up itself (no poll for a while): the replies
     * that arrived meanwhile are not read yet; judge at the next poll. */
    if (gap > HANG_STALL_S) return -1;
    int worst = -1;
    double worst_over = 0;
    for (int i = 0; i < t->cap; i++) {
        if (!t->batch[i]) continue;
        double over = (double)(now_ns - t->launched_ns[i]) * 1e-9 / hang_batch_bound(t, i);
        if (over > 1.0 && over > worst_over) worst = i, worst_over = over;
    }
    if (worst < 0) return -1;
    double age = (double)(now_ns - t->launched_ns[worst]) * 1e-9, bound = hang_batch_bound(t, worst);
    unsigned long long id = (unsigned long long)t->batch[worst]->id;
    int hung = hang_find_stage(stages, n, now, bound);
    if (hung < 0) {
        if (!t->overdue_warned[worst])
            ST_WARN("cluster: batch %llu has not come back after %.1f s (bound %.1f s), but every "
                    "stage answers and computes; waiting", id, age, bound);
        t->overdue_warned[worst] = true;
        return -1;
    }
    const stage_stats *st = stages[hung];
    if (now - st->stats_at > bound)
        snprintf(why, cap, "batch %llu not back after %.1f s, bound %.1f s; no stats from the stage for %.1f s",
                 id, age, bound, now - st->stats_at);
    else
        snprintf(why, cap,
                 "batch %llu not back after %.1f s, bound %.1f s; its compute made no progress for %.1f s "
                 "with %u queued",
                 id, age, bound, now - st->fwd_moved_at, st->queue_depth);
    return hung;
}
