/* node_store.c — the state's persistence (node_store.h): the snapshot
 * (state_file.h) or etcd (etcd_store.h), the registry's journal between
 * snapshots (journal.h), and the end of a node's record: RemoveNode
 * (stratactl node remove) and the expiry of dead nodes (--dead-node-expiry).
 *
 * The state file (state_file.h) is the snapshot: the placement, the epochs
 * and the known nodes. A registration of a new node (or one with a new data
 * address) and a removal append one record to STATE.journal instead of
 * rewriting the snapshot, so a registration costs O(1). Records (JSON):
 *   {"op":"node","name":"node-a","addr":"10.0.0.5:7100"}
 *   {"op":"remove","name":"node-a"}
 * Start: the snapshot, then the journal replayed over it. Compaction: a new
 * snapshot and an empty journal whenever the placement changes
 * (node_store_save) and once the journal holds more records than
 * max(JOURNAL_COMPACT_MIN, nodes): amortized O(1) per change.
 */
#include "coordinator/control/node_store.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/control/reply.h"
#include "coordinator/control/state_file.h"
#include "proto/control.pb-c.h"
#include "rpc/rpc_code.h"

#define JOURNAL_COMPACT_MIN 1024

static int replay_one(const char *payload, size_t len, void *ud, st_err *err) {
    node_store *s = ud;
    json_error_t je;
    json_t *rec = json_loadb(payload, len, 0, &je);
    const char *op = NULL, *name = NULL, *addr = "";
    if (!rec || json_unpack(rec, "{s:s,s:s,s?s}", "op", &op, "name", &name, "addr", &addr) != 0) {
        /* whole and checksummed, yet not ours: refuse rather than guess */
        json_decref(rec);
        return st_errf(err, "journal record %.*s is not a node record", (int)(len > 80 ? 80 : len), payload);
    }
    int rc = 0;
    if (!strcmp(op, "node")) {
        reg_node *n = registry_add_known(s->reg, name, addr);
        if (n && n->state == 0) snprintf(n->data_address, sizeof n->data_address, "%s", addr);
        if (!n) rc = st_errf(err, "journal: node %s: name too long or out of memory", name);
    } else if (!strcmp(op, "remove")) {
        registry_remove(s->reg, name);
    } else {
        rc = st_errf(err, "journal: unknown record op \"%s\"", op);
    }
    json_decref(rec);
    return rc;
}

int node_store_open(node_store *s, st_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s.journal", s->state_path);
    int before = s->reg->n;
    if (!(s->jr = journal_open(path, replay_one, s, err))) return -1;
    if (journal_records(s->jr))
        ST_INFO("control: journal %s: %zu record(s) replayed; %d known node(s) (%d from the snapshot)", path,
                journal_records(s->jr), s->reg->n, before);
    return 0;
}

static void append(node_store *s, json_t *rec) {
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    st_err err = {{0}};
    if (!text)
        ST_ERROR("control: journal: out of memory");
    else if (s->jr && journal_append(s->jr, text, strlen(text), &err) != 0)
        ST_ERROR("control: %s (the change is kept in memory; the next snapshot saves it)", err.msg);
    free(text);
}

void node_store_node(node_store *s, const reg_node *n) {
    if (s->etcd) {
        etcd_store_node(s->etcd, n->name, n->data_address);
        return;
    }
    append(s, json_pack("{s:s,s:s,s:s}", "op", "node", "name", n->name, "addr", n->data_address));
}

void node_store_save(node_store *s) {
    st_err err = {{0}};
    const epochs *ep = s->ep;
    const placement *p = ep->cur ? &ep->cur->pl : &ep->saved;
    if (s->etcd) {
        etcd_store_save(s->etcd, p, ep->last_epoch);
        return;
    }
    if (state_save(s->state_path, p, ep->last_epoch, s->model_sha, s->reg, &err) != 0)
        ST_ERROR("control: cannot save the state: %s", err.msg);
    else if (s->jr && journal_reset(s->jr, &err) != 0) /* the snapshot holds every node now */
        ST_ERROR("control: %s", err.msg);
}

/* Holds a stage of the serving, loading or saved (not yet restored) placement. */
static bool in_any_placement(const epochs *ep, const char *name, uint64_t *epoch) {
    const run *runs[] = {ep->cur, ep->pend, ep->from};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++)
        if (epochs_in_placement(runs[i], name)) return *epoch = runs[i]->pl.epoch, true;
    if (!ep->cur)
        for (int i = 0; i < ep->saved.n_stages; i++)
            if (!strcmp(ep->saved.st[i].node, name)) return *epoch = ep->saved.epoch, true;
    return false;
}

static void remove_node(node_store *s, const char *name) {
    if (s->etcd)
        etcd_store_node(s->etcd, name, NULL);
    else
        append(s, json_pack("{s:s,s:s}", "op", "remove", "name", name));
    registry_remove(s->reg, name);
}

void node_store_tick(node_store *s, double now, double t0) {
    st_err err = {{0}};
    if (s->jr && journal_sync(s->jr, &err) != 0) ST_ERROR("control: %s", err.msg);
    if (s->expiry_s > 0) {
        for (int i = 0; i < s->reg->n; i++) {
            reg_node *n = &s->reg->nodes[i];
            /* dead: since it turned dead; known from the snapshot only: since our start */
            double since = n->state == REG_DEAD ? n->dead_since : n->state == 0 ? t0 : -1;
            uint64_t epoch;
            if (since < 0 || now - since < s->expiry_s || in_any_placement(s->ep, n->name, &epoch)) continue;
            ST_INFO("control: %s expired: %s for %.0f s (--dead-node-expiry %.0f s); its record is removed", n->name,
                    n->state ? "dead" : "not registered since the restart", now - since, s->expiry_s);
            remove_node(s, n->name);
            i--; /* the last node moved into this place */
        }
    }
    size_t limit = (size_t)s->reg->n > JOURNAL_COMPACT_MIN ? (size_t)s->reg->n : JOURNAL_COMPACT_MIN;
    if (s->jr && journal_records(s->jr) > limit) node_store_save(s); /* snapshot + empty journal */
}

void node_store_remove_rpc(rpc_call *c, const rpc_request *req, void *ud) {
    node_store *s = ud;
    const Strata__V1__RemoveNodeRequest *r = (const void *)req->msg;
    reg_node *n = registry_find(s->reg, r->node);
    if (!n) {
        rpc_call_finishf(c, RPC_NOT_FOUND, "RemoveNode: unknown node \"%s\"", r->node);
        return;
    }
    uint64_t epoch = 0;
    if (in_any_placement(s->ep, n->name, &epoch)) {
        rpc_call_finishf(c, RPC_FAILED_PRECONDITION,
                         "RemoveNode: %s holds a stage of placement epoch %" PRIu64
                         "; drain it first (stratactl drain %s)",
                         n->name, epoch, n->name);
        return;
    }
    Strata__V1__RemoveNodeReply out = STRATA__V1__REMOVE_NODE_REPLY__INIT;
    char name[REG_NAME_MAX];
    snprintf(name, sizeof name, "%s", n->name);
    out.node = name;
    out.was = n->state ? (Strata__V1__NodeState)n->state : STRATA__V1__NODE_STATE__NODE_STATE_UNSPECIFIED;
    ST_INFO("control: node %s removed by the operator (it was %s)%s", name,
            n->state ? registry_state_name(n->state) : "not registered since the restart",
            registry_usable(n) ? "; if it is still running it registers again as a new node" : "");
    remove_node(s, name);
    ctl_reply(c, &out.base);
}

void node_store_close(node_store *s) {
    if (!s->jr) return;
    st_err err = {{0}};
    if (journal_sync(s->jr, &err) != 0) ST_ERROR("control: %s", err.msg);
    journal_close(s->jr);
    s->jr = NULL;
}
