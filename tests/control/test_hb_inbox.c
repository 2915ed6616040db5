/* test_hb_inbox.c — heartbeats answered on another thread (the coordinator's
 * rpc thread) and applied on the registry's (coordinator/control/hb_inbox.h,
 * registry_lease_is): every heartbeat queued is applied once, in order, with
 * its own arrival time; a stale lease is ignored; lease checks run while the
 * registry grows, moves nodes and revokes leases. Counts, not times. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/control/hb_inbox.h"
#include "coordinator/control/registry.h"
#include "tests/testutil.h"

static uint64_t reg(registry *r, const char *name, double now) {
    reg_info in = {.name = name, .device_kind = "cpu", .device_count = 1, .data_address = "127.0.0.1:1"};
    uint64_t lease = 0;
    st_err err = {{0}};
    CHECK(registry_register(r, &in, now, &lease, &err) == 0);
    return lease;
}

static void test_apply_order_and_stale(void) {
    registry r;
    registry_init(&r, 1000, 3, 10000, 42);
    hb_inbox *q = hb_inbox_new();
    REQUIRE(q != NULL);
    uint64_t la = reg(&r, "a", 0.0), lb = reg(&r, "b", 0.0);
    CHECK(registry_lease_is(&r, "a", la));
    CHECK(!registry_lease_is(&r, "a", lb));
    CHECK(!registry_lease_is(&r, "a", 0));
    CHECK(!registry_lease_is(&r, "nobody", la));
    reg_load l1 = {1, 2, 3, 0.5, 7}, l2 = {4, 5, 6, 0.25, 9};
    CHECK(hb_inbox_put(q, "a", la, &l1, 1.0) == 0);
    CHECK(hb_inbox_put(q, "a", la, &l2, 2.0) == 0);
    CHECK(hb_inbox_put(q, "b", lb + 1, &l1, 2.0) == 0); /* a stale lease: ignored when applied */
    /* queued, not yet applied: the registry is untouched */
    CHECK_EQ_INT(registry_find(&r, "a")->state, REG_REGISTERED);
    CHECK_EQ_INT(hb_inbox_apply(q, &r), 3);
    const reg_node *a = registry_find(&r, "a"), *b = registry_find(&r, "b");
    CHECK_EQ_INT(a->state, REG_READY);
    CHECK_EQ_INT(a->heartbeats, 2);
    CHECK(a->last_seen == 2.0);            /* the arrival time, not the time of applying */
    CHECK_EQ_INT(a->running_sequences, 4); /* the later heartbeat's load */
    CHECK_EQ_INT(a->bytes_sent, 9);
    CHECK_EQ_INT(b->state, REG_REGISTERED);
    CHECK_EQ_INT(b->heartbeats, 0);
    /* a heartbeat queued before the node was declared dead does not revive it */
    CHECK(hb_inbox_put(q, "b", lb, NULL, 3.0) == 0);
    CHECK_EQ_INT(registry_tick(&r, 20.0), 2); /* both dead: 18 s past their last heartbeat */
    CHECK(!registry_lease_is(&r, "b", lb));
    CHECK_EQ_INT(hb_inbox_apply(q, &r), 1);
    CHECK_EQ_INT(registry_find(&r, "b")->state, REG_DEAD);
    CHECK_EQ_INT(hb_inbox_apply(q, &r), 0);
    uint64_t queued = 0, applied = 0;
    hb_inbox_counts(q, &queued, &applied);
    CHECK_EQ_INT(queued, 4);
    CHECK_EQ_INT(applied, 4);
    hb_inbox_free(q);
    registry_free(&r);
}

/* The rpc thread's side: lease checks and puts for NODES nodes, ROUNDS each,
 * while the main thread adds and removes other nodes (growing the arrays,
 * moving nodes into freed places) and applies the inbox. */
#define NODES 200
#define ROUNDS 50

typedef struct shared {
    registry *r;
    hb_inbox *q;
    uint64_t lease[NODES];
    atomic_int done;
    int refused;
} shared;

static void *rpc_side(void *arg) {
    shared *sh = arg;
    char name[32];
    for (int k = 0; k < ROUNDS; k++)
        for (int i = 0; i < NODES; i++) {
            snprintf(name, sizeof name, "n-%04d", i);
            if (!registry_lease_is(sh->r, name, sh->lease[i])) {
                sh->refused++;
                continue;
            }
            reg_load l = {(uint32_t)k, 0, 0, 0, 0};
            if (hb_inbox_put(sh->q, name, sh->lease[i], &l, 1.0 + k * 0.01) != 0) sh->refused++;
        }
    atomic_store(&sh->done, 1);
    return NULL;
}

static void test_concurrent(void) {
    registry r;
    registry_init(&r, 1000, 3, 10000, 7);
    shared sh = {.r = &r, .q = hb_inbox_new()};
    REQUIRE(sh.q != NULL);
    char name[32];
    for (int i = 0; i < NODES; i++) {
        snprintf(name, sizeof name, "n-%04d", i);
        sh.lease[i] = reg(&r, name, 0.0);
    }
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, rpc_side, &sh) == 0);
    size_t applied = 0;
    int churn = 0;
    while (!atomic_load(&sh.done)) {
        snprintf(name, sizeof name, "x-%05d", churn);
        reg(&r, name, 0.0);                    /* grows nodes and the index now and then */
        if (churn % 3 == 2) {
            snprintf(name, sizeof name, "x-%05d", churn - 2);
            CHECK_EQ_INT(registry_remove(&r, name), 0); /* moves the last node into the hole */
        }
        churn++;
        applied += hb_inbox_apply(sh.q, &r);
    }
    pthread_join(t, NULL);
    applied += hb_inbox_apply(sh.q, &r);
    CHECK_EQ_INT(sh.refused, 0);
    CHECK_EQ_INT(applied, NODES * ROUNDS);
    uint64_t total = 0;
    int ready = 0;
    for (int i = 0; i < NODES; i++) {
        snprintf(name, sizeof name, "n-%04d", i);
        const reg_node *n = registry_find(&r, name);
        REQUIRE(n != NULL);
        total += n->heartbeats;
        ready += n->state == REG_READY;
        CHECK_EQ_INT(n->running_sequences, ROUNDS - 1); /* applied in order: the last one wins */
    }
    CHECK_EQ_INT(total, NODES * ROUNDS);
    CHECK_EQ_INT(ready, NODES);
    printf("test_hb_inbox: %d heartbeats applied while %d nodes were added (%d removed)\n", NODES * ROUNDS, churn,
           churn / 3);
    hb_inbox_free(sh.q);
    registry_free(&r);
}

int main(void) {
    test_apply_order_and_stale();
    test_concurrent();
    return test_summary();
}
