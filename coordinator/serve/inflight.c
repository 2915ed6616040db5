/* inflight.c — micro-batches in flight and their round trips (inflight.h). */
#include "coordinator/serve/inflight.h"

#include <stdlib.h>

int inflight_init(inflight_table *t, int cap) {
    t->cap = cap;
    t->batch = calloc((size_t)cap, sizeof *t->batch);
    t->launched_ns = calloc((size_t)cap, sizeof *t->launched_ns);
    t->tokens = calloc((size_t)cap, sizeof *t->tokens);
    t->overdue_warned = calloc((size_t)cap, sizeof *t->overdue_warned);
    if (!t->ring) t->ring = calloc(INFLIGHT_KEEP, sizeof *t->ring);
    return t->batch && t->launched_ns && t->tokens && t->overdue_warned && t->ring ? 0 : -1;
}

void inflight_free(inflight_table *t) {
    free(t->batch);
    free(t->launched_ns);
    free(t->tokens);
    free(t->overdue_warned);
    free(t->ring);
    t->batch = NULL;
    t->launched_ns = NULL;
    t->tokens = NULL;
    t->overdue_warned = NULL;
    t->ring = NULL;
    t->cap = 0;
}

void inflight_put(inflight_table *t, const sched_batch *b, uint64_t t_launch_ns) {
    for (int i = 0; i < t->cap; i++)
        if (!t->batch[i]) {
            t->batch[i] = b;
            t->launched_ns[i] = t_launch_ns;
            t->tokens[i] = b->n_tokens;
            t->overdue_warned[i] = false;
            return;
        }
}

int inflight_slot(const inflight_table *t, uint64_t batch_id) {
    int slot = -1;
    for (int i = 0; i < t->cap; i++)
        if (t->batch[i] && t->batch[i]->id == batch_id) slot = i;
    return slot;
}

void inflight_complete(inflight_table *t, int slot, uint64_t t_done_ns) {
    t->batch[slot] = NULL;
    double rtt = (double)(t_done_ns - t->launched_ns[slot]) * 1e-9;
    double rtt_tok = rtt / (t->tokens[slot] > 0 ? t->tokens[slot] : 1);
    t->rtt_avg = t->rtt_n ? t->rtt_avg + RTT_EWMA_ALPHA * (rtt - t->rtt_avg) : rtt;
    t->rtt_tok_avg = t->rtt_n ? t->rtt_tok_avg + RTT_EWMA_ALPHA * (rtt_tok - t->rtt_tok_avg) : rtt_tok;
    t->rtt_sum += rtt;
    if (t->ring) {
        t->ring[t->rtt_n % INFLIGHT_KEEP][0] = t->launched_ns[slot];
        t->ring[t->rtt_n % INFLIGHT_KEEP][1] = t_done_ns;
    }
    t->rtt_n++;
}

void inflight_abort_all(inflight_table *t, sched *s) {
    for (int i = 0; i < t->cap; i++) {
        if (!t->batch[i]) continue;
        st_err err = {{0}};
        sched_abort_batch(s, t->batch[i]->id, &err);
        t->batch[i] = NULL;
    }
}

int inflight_count(const inflight_table *t) {
    int n = 0;
    for (int i = 0; t->batch && i < t->cap; i++) n += t->batch[i] != NULL;
    return n;
}

json_t *inflight_intervals_json(const inflight_table *t) {
    json_t *a = json_array();
    uint64_t kept = t->rtt_n < INFLIGHT_KEEP ? t->rtt_n : INFLIGHT_KEEP;
    for (uint64_t k = t->rtt_n - kept; a && t->ring && k < t->rtt_n; k++)
        json_array_append_new(a, json_pack("[I,I]", (json_int_t)t->ring[k % INFLIGHT_KEEP][0],
                                           (json_int_t)t->ring[k % INFLIGHT_KEEP][1]));
    return a;
}
