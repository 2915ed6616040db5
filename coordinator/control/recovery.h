/* recovery.h — recovery from a lost stage (control_service.h "Recovery",
 * docs/recovery.md): the serving run's cluster holds its requests, the lost
 * node is left out (until it registers again), an automatic placement over
 * the other usable nodes is loaded (epochs.h switches to it and the held
 * requests move: recovery_move), and the held requests fail after the
 * timeout if none can be. Loop thread only; the owner reads the fields
 * (GetStatus, health, the engine's stats). */
#ifndef STRATA_COORDINATOR_CONTROL_RECOVERY_H
#define STRATA_COORDINATOR_CONTROL_RECOVERY_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/control/epochs.h"
#include "coordinator/control/registry.h"
#include "coordinator/control/requests.h"
#include "coordinator/serve/engine_totals.h"

#define RECOVERY_TIMEOUT_S 60.0 /* default ctl_opts.recovery_timeout_s */

/* A node whose stage was lost: left out of recovery placements while it
 * holds the same lease (registering again gives it a new one). */
typedef struct lost_node {
    char name[REG_NAME_MAX];
    uint64_t lease;
} lost_node;

typedef struct recovery {
    epochs *ep;              /* the runs; new placements start through it */
    ctl_requests *rq;        /* the requests: moved on a switch, their ids in the logs */
    engine_totals *totals;   /* the resume times go here */
    double timeout_s;        /* held requests fail after this */
    /* `lost` is the serving run that lost a stage; it holds its requests
     * until a new placement serves them. NULL: not recovering. */
    run *lost;
    double lost_at;
    bool expired;            /* timeout_s passed: the held requests failed */
    bool stuck_logged;
    char msg[ST_ERR_MSG_MAX];
    char node[REG_NAME_MAX]; /* the node and stage of the loss (GetStatus) */
    int stage;
    lost_node excl[PLACE_STAGE_MAX];
    int n_excl;
    uint64_t recoveries, seqs_resumed, tokens_recomputed;
} recovery;

void recovery_init(recovery *rec, epochs *ep, ctl_requests *rq, engine_totals *totals, double timeout_s);
/* New requests are held with the others (the serving run is the lost one
 * and the timeout has not passed). */
bool recovery_holding(const recovery *rec);
/* epochs_hooks.lost: a stage of ready run r was lost. */
void recovery_on_lost(recovery *rec, run *r, int stage, const char *msg);
/* epochs_hooks.move, through the owner: moves from's requests to `to`
 * (requests_move); when `from` is the lost run, counts and logs the resume
 * and ends the recovery. Returns how many moved. */
int recovery_move(recovery *rec, run *from, run *to);
/* From the tick while recovering: the held requests fail after the timeout;
 * meanwhile (and after) an automatic placement over the usable nodes, less
 * the lost ones, is loaded as soon as there is one. */
void recovery_tick(recovery *rec, double t);

#endif
