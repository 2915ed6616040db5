/* leave.h — the Leave call (proto/control.proto): a worker that shuts down
 * says so; its stage of the serving placement is lost at once (recovery.h)
 * and the node turns DEAD (lease revoked) until it registers anew. A node
 * leaves as itself only (authz.h). Loop thread. */
#ifndef STRATA_COORDINATOR_CONTROL_LEAVE_H
#define STRATA_COORDINATOR_CONTROL_LEAVE_H

#include <stdbool.h>

#include "coordinator/control/epochs.h"
#include "coordinator/control/requests.h"
#include "rpc/grpc_server.h"

/* What Leave needs from the service. */
typedef struct leave_ctx {
    bool tls;                /* mutual TLS: the caller's certificate names the node */
    epochs *ep;              /* the serving run; the registry; the tick to wake */
    const ctl_requests *rq;  /* the held requests, counted in the log line */
} leave_ctx;

/* An rpc_handler_fn; ud is a leave_ctx. */
void leave_rpc(rpc_call *c, const rpc_request *req, void *ud);

#endif
