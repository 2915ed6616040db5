/* node_rpc.h — the nodes' calls of strata.v1.Control (proto/control.proto):
 * Register (the model must be the cluster's file: same name and sha256; the
 * link matrix is checked; a new node or address is stored, node_store.h),
 * Heartbeat and ListNodes. A node registers and heartbeats as itself only
 * (authz.h). Each is an rpc_handler_fn whose ud is the node_rpc.
 *
 * Heartbeat is answered on the rpc thread (node_rpc_heartbeat_now; hb_inbox.h
 * says why): the lease check under the registry's lock, the heartbeat queued
 * in the inbox, the reply at once with the serving epoch as last published;
 * it touches nothing else. The loop applies the inbox (node_rpc_apply) at
 * every tick and before every other call. With --etcd, Heartbeat runs on the
 * loop instead (node_rpc_heartbeat), behind the standby check. Everything
 * else: loop thread. */
#ifndef STRATA_COORDINATOR_CONTROL_NODE_RPC_H
#define STRATA_COORDINATOR_CONTROL_NODE_RPC_H

#include <stdatomic.h>
#include <stdbool.h>

#include "coordinator/control/epochs.h"
#include "coordinator/control/hb_inbox.h"
#include "coordinator/control/model_info.h"
#include "coordinator/control/node_store.h"
#include "coordinator/control/registry.h"
#include "rpc/grpc_server.h"

typedef struct node_rpc {
    bool tls;                 /* mutual TLS: the caller's certificate names the node */
    registry *reg;
    const model_info *model;  /* the cluster's model file and sha256 */
    node_store *store;        /* where a new node is written */
    const epochs *ep;         /* the serving epoch (replies); the tick Register wakes */
    hb_inbox *hb;             /* heartbeats answered on the rpc thread, for the loop */
    atomic_uint_least64_t hb_epoch; /* the serving epoch for those replies (node_rpc_apply) */
} node_rpc;

void node_rpc_register(rpc_call *c, const rpc_request *req, void *ud);
/* Heartbeat on the loop's thread (--etcd: a standby must refuse it). */
void node_rpc_heartbeat(rpc_call *c, const rpc_request *req, void *ud);
/* Heartbeat on the rpc thread (above). */
void node_rpc_heartbeat_now(rpc_call *c, const rpc_request *req, void *ud);
void node_rpc_list(rpc_call *c, const rpc_request *req, void *ud);
/* Loop thread: applies the queued heartbeats to the registry and publishes
 * the serving epoch for their replies. */
void node_rpc_apply(node_rpc *s);

#endif
