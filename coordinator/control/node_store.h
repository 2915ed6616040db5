/* node_store.h — the live state's persistence: the snapshot (state_file.h:
 * the placement, the epochs, the known nodes) with the registry's journal
 * between snapshots (journal.h; the comment at the top of node_store.c), or
 * etcd (--etcd, etcd_store.h); and the end of a node's record: RemoveNode
 * and the expiry of dead nodes (--dead-node-expiry). Loop thread. */
#ifndef STRATA_COORDINATOR_CONTROL_NODE_STORE_H
#define STRATA_COORDINATOR_CONTROL_NODE_STORE_H

#include "common/err.h"
#include "coordinator/control/epochs.h"
#include "coordinator/control/etcd_store.h"
#include "coordinator/control/journal.h"
#include "coordinator/control/registry.h"
#include "rpc/grpc_server.h"

typedef struct node_store {
    registry *reg;            /* the nodes; must outlive */
    const epochs *ep;         /* the placement a snapshot saves; who holds a stage */
    const char *state_path;   /* the snapshot; its journal is state_path + ".journal" */
    const char *model_sha;    /* the model's sha256, in the snapshot */
    double expiry_s;          /* a dead node's record is removed after this long; 0 = never */
    etcd_store *etcd;         /* --etcd: the state goes there instead (no journal); else NULL */
    journal *jr;              /* node_store_open's */
} node_store;

/* The file store: opens the journal and replays it over the registry. */
int node_store_open(node_store *s, st_err *err);
/* Syncs and closes the journal (none: a no-op). */
void node_store_close(node_store *s);
/* Writes the placement (the serving one, else the saved one) and the epochs:
 * a snapshot (and an empty journal), or etcd. */
void node_store_save(node_store *s);
/* A new node (or a new address): one journal record or etcd key, O(1). */
void node_store_node(node_store *s, const reg_node *n);
/* Every tick: fsync, expiry (a node known from the snapshot only counts from
 * t0, the start or the takeover), compaction. */
void node_store_tick(node_store *s, double now, double t0);
/* RemoveNode, an rpc_handler_fn; ud is the node_store. Refused while the
 * node holds a stage of a placement. */
void node_store_remove_rpc(rpc_call *c, const rpc_request *req, void *ud);

#endif
