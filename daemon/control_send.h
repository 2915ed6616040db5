/* control_send.h — one CONTROL frame (proto/stage.proto, strata.v1.Control)
 * packed and sent to a data-plane peer: the replies of the assignment
 * lifecycle, the data path's BatchDone / BatchError and the boundary
 * negotiation of act_link. Loop thread.
 */
#ifndef STRATA_DAEMON_CONTROL_SEND_H
#define STRATA_DAEMON_CONTROL_SEND_H

#include <stdint.h>

#include "ib/transport.h"
#include "proto/stage.pb-c.h"

typedef Strata__V1__ControlMessage ctl_msg;

/* Sends a CONTROL frame carrying m to peer, its header tagged with epoch,
 * stage and batch_id. 0, or -1 (logged, "what to PEER failed"; -1 without a
 * peer, not logged). */
int control_send(xport_peer *peer, const ctl_msg *m, uint64_t epoch, uint32_t stage, uint64_t batch_id,
                 const char *what);

#endif
