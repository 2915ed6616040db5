/* hb_inbox.c — the rpc thread -> loop hand-off of heartbeats (hb_inbox.h):
 * two growable arrays, swapped under one lock. */
#include "coordinator/control/hb_inbox.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hb_entry {
    char name[REG_NAME_MAX];
    uint64_t lease;
    bool has_load;
    reg_load load;
    double at;
} hb_entry;

typedef struct hb_buf {
    hb_entry *e;
    size_t n, cap;
} hb_buf;

struct hb_inbox {
    pthread_mutex_t mu; /* in, queued */
    hb_buf in;          /* filled by hb_inbox_put */
    hb_buf out;         /* applied by hb_inbox_apply (its thread only) */
    uint64_t queued, applied;
};

hb_inbox *hb_inbox_new(void) {
    hb_inbox *q = calloc(1, sizeof *q);
    if (q) pthread_mutex_init(&q->mu, NULL);
    return q;
}

void hb_inbox_free(hb_inbox *q) {
    if (!q) return;
    free(q->in.e);
    free(q->out.e);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

int hb_inbox_put(hb_inbox *q, const char *name, uint64_t lease, const reg_load *l, double now) {
    pthread_mutex_lock(&q->mu);
    if (q->in.n == q->in.cap) {
        size_t cap = q->in.cap ? q->in.cap * 2 : 256;
        hb_entry *e = realloc(q->in.e, cap * sizeof *e);
        if (!e) {
            pthread_mutex_unlock(&q->mu);
            return -1;
        }
        q->in.e = e;
        q->in.cap = cap;
    }
    hb_entry *e = &q->in.e[q->in.n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->lease = lease;
    e->has_load = l != NULL;
    if (l) e->load = *l;
    e->at = now;
    q->queued++;
    pthread_mutex_unlock(&q->mu);
    return 0;
}

size_t hb_inbox_apply(hb_inbox *q, registry *r) {
    pthread_mutex_lock(&q->mu);
    hb_buf t = q->in; /* swap: the rpc thread goes on filling the other buffer */
    q->in = q->out;
    q->in.n = 0;
    pthread_mutex_unlock(&q->mu);
    q->out = t;
    for (size_t i = 0; i < t.n; i++) {
        const hb_entry *e = &t.e[i];
        registry_heartbeat(r, e->name, e->lease, e->has_load ? &e->load : NULL, e->at);
    }
    q->out.n = 0;
    pthread_mutex_lock(&q->mu);
    q->applied += t.n;
    pthread_mutex_unlock(&q->mu);
    return t.n;
}

void hb_inbox_counts(hb_inbox *q, uint64_t *queued, uint64_t *applied) {
    pthread_mutex_lock(&q->mu);
    *queued = q->queued;
    *applied = q->applied;
    pthread_mutex_unlock(&q->mu);
}
