/* epochs.h — placement runs and epochs (control_service.h "Placement
 * changes"): a placement loads as a new cluster under its epoch (a run); the
 * serving run switches to it when it is ready (the owner moves the running
 * sequences over: epochs_hooks.move), the old one is released and retired,
 * and a run that fails to load is dropped. Also the start-up: restore the
 * saved placement once its nodes are usable, or place automatically.
 *
 * It knows the registry, the placement rules and the clusters, not the
 * service: what it needs from its owner comes as epochs_hooks. Loop thread
 * only. The owner reads the fields (cur, pend, from...); only this module
 * writes them, but for recovery.h (adopt_epoch, retry_at) and the state's
 * readers before the first tick (saved, last_epoch: the state file or
 * etcd_store.h). */
#ifndef STRATA_COORDINATOR_CONTROL_EPOCHS_H
#define STRATA_COORDINATOR_CONTROL_EPOCHS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/config/cluster_config.h"
#include "coordinator/control/placement.h"
#include "coordinator/control/registry.h"
#include "coordinator/serve/cluster.h"
#include "model/tokenizer.h"

#define EPOCHS_RETRY_S 2.0 /* a start that failed is tried again after this */

struct event;
struct event_base;

/* One placement epoch being loaded or served: its cluster and its config. */
typedef struct run {
    struct epochs *ep;
    placement pl;
    coord_config cfg;        /* shallow copy of the live config; stages below */
    coord_stage_cfg *stages;
    cluster *cl;
    uint64_t node_reg[PLACE_STAGE_MAX]; /* each stage's node's registrations when assigned */
    bool ready, failed;
    char fail_msg[ST_ERR_MSG_MAX];
    double retire_at;
    struct run *next;        /* the retired list */
} run;

/* What a run needs from the owner (ud). */
typedef struct epochs_hooks {
    void *ud;
    /* The serving run changed: the heartbeat replies name its epoch. */
    void (*serving)(void *ud);
    /* Persist the placement (cur, else saved) and last_epoch. */
    void (*save)(void *ud);
    /* Move the running sequences of `from` (paused, nothing in flight) to
     * `to`, the requests following; returns how many moved. */
    int (*move)(void *ud, run *from, run *to);
    /* A stage of a ready run was lost (its cluster holds the requests);
     * inside a transport callback: do not free the run there. */
    void (*lost)(void *ud, run *r, int stage, const char *msg);
} epochs_hooks;

typedef struct epochs_opts {
    struct event_base *base;
    const coord_config *cfg;  /* the live config (no stages); must outlive */
    char *model_file;         /* the name the workers resolve (coord_config.model); must outlive */
    const place_model *pm;    /* must outlive */
    const tok_vocab *vocab;   /* must outlive */
    int n_ctx;
    double ready_timeout_s;
    registry *reg;            /* the nodes the stages go to; must outlive */
    struct event *tick;       /* the owner's tick: woken to act now (a run failed to load) */
    struct engine_totals *totals; /* every run's cluster counts here (serve/engine_totals.h); must outlive */
    epochs_hooks hooks;
} epochs_opts;

typedef struct epochs {
    epochs_opts o;
    /* The owner fills these two from the state (file or etcd) before the
     * first tick; epochs_init leaves them as they are. */
    placement saved;          /* restored from the state, not yet serving */
    uint64_t last_epoch;
    run *cur, *pend, *from;   /* serving, loading, being switched away from */
    run *retired;
    double retry_at;          /* no automatic start (restore, auto, recovery) before this */
    uint64_t adopt_epoch;     /* a recovery's lost epoch: survivors keep an unchanged stage (0: none) */
    struct event *switch_ev;
} epochs;

/* Sets the options (ep zeroed by the caller, but for saved and last_epoch).
 * -1 + err when the switch's timer cannot be created. */
int epochs_init(epochs *ep, const epochs_opts *o, st_err *err);
/* Frees every run (their clusters stop). */
void epochs_free(epochs *ep);

bool epochs_in_placement(const run *r, const char *node);
/* The nodes a new placement may use (registered or ready, not draining),
 * sorted by name, `except` left out: *out is malloc'd (the caller frees it;
 * NULL when none). Returns their count, -1 when out of memory. */
int epochs_usable_nodes(const epochs *ep, place_node **out, const char *except);
/* A change to pl (its epoch assigned here): loads it as the pending run.
 * -1, *code (rpc_code.h) and err when a change is in progress or it cannot start. */
int epochs_change(epochs *ep, placement *pl, int *code, st_err *err);

/* From the owner's tick, in this order around recovery's: drops a pending
 * run that failed to load (`recovering`: for the log line) ... */
void epochs_drop_failed(epochs *ep, double t, bool recovering);
/* ... frees the retired runs whose time has come, and with nothing serving
 * or loading, restores the saved placement once its nodes are usable, else
 * places automatically over min_workers usable nodes. */
void epochs_tick(epochs *ep, double t, int min_workers);

#endif
