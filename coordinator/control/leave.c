/* leave.c — the Leave call (proto/control.proto): a worker that shuts down
 * says so, and its stage of the serving placement is lost at once, through
 * the recovery path (recovery.c: hold, re-place without it, resume), instead
 * of when its connection drops or its heartbeats time out. The node turns
 * DEAD (lease revoked) so that no placement picks it again before it
 * registers anew. */
#include "coordinator/control/leave.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/control/authz.h"
#include "coordinator/control/reply.h"
#include "proto/control.pb-c.h"

/* The stage of run r on node, or -1. */
static int stage_of(const run *r, const char *node) {
    for (int i = 0; r && i < r->pl.n_stages; i++)
        if (!strcmp(r->pl.st[i].node, node)) return i;
    return -1;
}

void leave_rpc(rpc_call *c, const rpc_request *req, void *ud) {
    const leave_ctx *x = ud;
    epochs *ep = x->ep;
    const Strata__V1__LeaveRequest *r = (const void *)req->msg;
    if (!ctl_authorize(x->tls, c, CTL_ROLE_NODE, r->node)) return; /* a node leaves as itself only */
    const reg_node *n = registry_find(ep->o.reg, r->node);
    if (!n || !n->state || !r->lease_id || n->lease != r->lease_id) {
        rpc_call_finishf(c, RPC_NOT_FOUND, "Leave: unknown node \"%s\" or lease", r->node);
        return;
    }
    const char *why = r->reason && r->reason[0] ? r->reason : "no reason given";
    Strata__V1__LeaveReply out = STRATA__V1__LEAVE_REPLY__INIT;
    out.placement_epoch = ep->cur ? ep->cur->pl.epoch : 0;
    int stage = ep->cur ? stage_of(ep->cur, r->node) : -1;
    char ids[1024];
    int held = ep->cur ? requests_held_ids(x->rq, ep->cur->cl, ids, sizeof ids) : 0;
    if (stage >= 0 && ep->cur->cl && cluster_is_ready(ep->cur->cl) && !cluster_is_lost(ep->cur->cl)) {
        char msg[ST_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "stage %d on node %s left the cluster (%s)", stage, r->node, why);
        ST_WARN("control: node %s is leaving (%s): epoch %" PRIu64 " loses stage %d now; its %d request(s) "
                "are held and re-placed (no heartbeat timeout)",
                r->node, why, ep->cur->pl.epoch, stage, held);
        /* on_lost (recovery.c) records the node's lease to leave it out: before the lease goes. */
        cluster_stage_leaving(ep->cur->cl, stage, msg);
        out.stages_lost = 1;
    } else {
        ST_INFO("control: node %s is leaving (%s); it holds no stage of the serving placement", r->node, why);
    }
    st_err err = {{0}};
    registry_leave(ep->o.reg, r->node, r->lease_id, &err);
    ST_INFO("registry: %s left (lease revoked; it joins again by registering)", r->node);
    ctl_reply(c, &out.base);
    event_active(ep->o.tick, 0, 0);
}
