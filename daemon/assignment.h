/* assignment.h — strata-worker's assignment lifecycle (assignment.c): the
 * coordinator-facing CONTROL messages (StageAssign -> load on the compute
 * thread -> StageReady, StageRelease, StatsRequest -> StageStats), the
 * stages held by epoch and their states (idle, loading, ready, failed), and
 * each ready stage's connection to its next hop. Loop thread; the structs are
 * in daemon/worker_internal.h, the protocol in docs/protocol.md.
 */
#ifndef STRATA_DAEMON_ASSIGNMENT_H
#define STRATA_DAEMON_ASSIGNMENT_H

#include <stdint.h>

#include "daemon/worker_internal.h"

/* A CONTROL frame from peer: StageAssign, StageRelease or StatsRequest;
 * anything else drops the frame and disconnects peer. */
void assignment_handle_control(worker *w, xport_peer *peer, const frame_header *h);

/* A new idle stage (its compute thread started), first in w->stages. NULL + err. */
wstage *stage_new(worker *w, st_err *err);
/* Stops a stage's compute thread (the running job finishes; queued ones are
 * dropped) and closes its stage. Its memory stays until stage_free: sends of
 * its jobs may still be in flight on the transport. */
void stage_stop(wstage *st);
void stage_free(wstage *st);
/* The live stage assigned epoch (not idle), or NULL. */
wstage *stage_by_epoch(worker *w, uint64_t epoch);
/* peer is gone: forget it as st's coordinator; as its next hop, reconnect
 * after the back-off. */
void stage_on_disconnect(wstage *st, xport_peer *peer, const char *reason);

/* Sends a CONTROL frame carrying m to peer, tagged with st's stage. 0 or -1
 * (logged; -1 without a peer). */
int stage_send_control(wstage *st, xport_peer *peer, const ctl_msg *m, uint64_t epoch,
                       uint64_t batch_id);

#endif
