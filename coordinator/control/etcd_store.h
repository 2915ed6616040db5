/* etcd_store.h — the live control plane's state in etcd and the standby mode
 * (strata-coordinator --etcd; leader.h has the keys and the election; the
 * comment at the top of etcd_store.c tells the whole story). Loop thread;
 * the election's callback runs on the loop too (leader.h). */
#ifndef STRATA_COORDINATOR_CONTROL_ETCD_STORE_H
#define STRATA_COORDINATOR_CONTROL_ETCD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/control/leader.h"
#include "coordinator/control/placement.h"
#include "coordinator/control/registry.h"

struct event_base;
struct leader_opts;

typedef struct etcd_store_opts {
    const struct leader_opts *ha; /* the caller's; copied by the leader */
    struct event_base *base;
    /* Where an election puts the state read from etcd (must outlive): */
    registry *reg;            /* the known nodes */
    placement *saved;         /* the placement to restore */
    uint64_t *last_epoch;
    const char *model_sha;    /* the model's sha256: the state must be for it */
    int n_layers;             /* the model's layers: the placement must cover them */
    /* Elected: the state is in place and this coordinator serves now. */
    void (*elected)(void *ud);
    void *ud;
} etcd_store_opts;

typedef struct etcd_store etcd_store;

/* Starts the election; a standby until elected. NULL + err on failure. */
etcd_store *etcd_store_open(const etcd_store_opts *o, st_err *err);
/* Resigns (a standby takes over) and frees. NULL ok. */
void etcd_store_close(etcd_store *s);
/* Writes the placement and the highest epoch (PREFIX/state), fenced. */
void etcd_store_save(etcd_store *s, const placement *p, uint64_t last_epoch);
/* A new node or a new address (PREFIX/nodes/NAME); addr NULL: removed. */
void etcd_store_node(etcd_store *s, const char *name, const char *addr);
/* True while a standby (s NULL: never): msg (may be NULL) says so and names
 * the leader, http gets the leader's advertised HTTP URL ("" when unknown). */
/* The leader's write path (leader.h): false when s is NULL (no --etcd). */
bool etcd_store_write_stats(etcd_store *s, leader_write_stats *out);
bool etcd_store_standby(etcd_store *s, char *msg, size_t cap, char *http, size_t http_cap);

#endif
