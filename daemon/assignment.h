/* assignment.h — one stage's assignment lifecycle (assignment.c): a
 * StageAssign checked, its model file opened and loaded on the stage's
 * compute thread -> StageReady; the stage's states (idle, loading, ready,
 * failed), its StageStats, its connection to its next hop, and its end.
 * Which stage takes which message is the worker's choice (worker.c); the
 * stage is daemon/wstage.h. Loop thread; the protocol is in docs/protocol.md.
 */
#ifndef STRATA_DAEMON_ASSIGNMENT_H
#define STRATA_DAEMON_ASSIGNMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/act_link.h"
#include "daemon/model_path.h"
#include "daemon/wstage.h"
#include "ib/transport.h"
#include "proto/stage.pb-c.h"

typedef Strata__V1__StageAssign ctl_assign;

/* What a new stage takes from its worker (copied, or pointed to: those must
 * outlive the stage). */
typedef struct wstage_env {
    struct event_base *base;
    xport *x;
    const char *name;           /* for StageReady and StageStats */
    int n_threads;              /* when StageAssign says 0 */
    double t_start;             /* the worker's start (uptime) */
    wcounters *counters;
    const stage_timing *timing;
    act_local *act;
} wstage_env;

/* A new idle stage with its compute thread started; the caller links it
 * into its list. NULL + err. */
wstage *stage_new(const wstage_env *env, st_err *err);
/* Stops a stage's compute thread (the running job finishes; queued ones are
 * dropped) and closes its stage. Its memory stays until stage_free: sends of
 * its jobs may still be in flight on the transport. */
void stage_stop(wstage *st);
/* A released stage: drops its next hop, closes its boundaries' links,
 * stage_stop, and unregisters its free buffers. */
void stage_retire(wstage *st);
void stage_free(wstage *st);

/* A StageAssign from peer (the coordinator, checked by the caller) for st:
 * refused (StageReady with the error), repeated (answered as it stands), an
 * adoption of st's loaded stage (a recovery: nothing loads), or a load of
 * the model file found through mf on the compute thread (StageReady when it
 * is done). *max_epoch rises to an accepted assignment's epoch. */
void assignment_take(wstage *st, xport_peer *peer, const ctl_assign *a, const model_files *mf,
                     uint64_t *max_epoch);
/* Whether st, loaded and ready, serves a as it is (a recovery adopts it:
 * StageAssign.adopt_epoch). */
bool assignment_adoptable(const wstage *st, const ctl_assign *a);
/* A StatsRequest from peer: st's StageStats. */
void assignment_send_stats(wstage *st, xport_peer *peer, const Strata__V1__StatsRequest *req);
/* peer is gone: forget it as st's coordinator; as its next hop, reconnect
 * after the back-off. */
void stage_on_disconnect(wstage *st, xport_peer *peer, const char *reason);

#endif
