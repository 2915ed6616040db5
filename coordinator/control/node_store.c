/* node_store.c — the registry's persistence between state snapshots (the
 * journal, journal.h) and the end of a node's record: RemoveNode (stratactl
 * node remove) and the expiry of dead nodes (--dead-node-expiry).
 *
 * The state file (state_file.h) is the snapshot: the placement, the epochs
 * and the known nodes. A registration of a new node (or one with a new data
 * address) and a removal append one record to STATE.journal instead of
 * rewriting the snapshot, so a registration costs O(1). Records (JSON):
 *   {"op":"node","name":"node-a","addr":"10.0.0.5:7100"}
 *   {"op":"remove","name":"node-a"}
 * Start: the snapshot, then the journal replayed over it. Compaction: a new
 * snapshot and an empty journal whenever the placement changes
 * (ctl_save_state) and once the journal holds more records than
 * max(JOURNAL_COMPACT_MIN, nodes): amortized O(1) per change.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/control/control_internal.h"
#include "coordinator/control/journal.h"
#include "proto/control.pb-c.h"
#include "rpc/rpc_code.h"

#define JOURNAL_COMPACT_MIN 1024

static int replay_one(const char *payload, size_t len, void *ud, st_err *err) {
    ctl_service *s = ud;
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
        reg_node *n = registry_add_known(&s->reg, name, addr);
        if (n && n->state == 0) snprintf(n->data_address, sizeof n->data_address, "%s", addr);
        if (!n) rc = st_errf(err, "journal: node %s: name too long or out of memory", name);
    } else if (!strcmp(op, "remove")) {
        registry_remove(&s->reg, name);
    } else {
        rc = st_errf(err, "journal: unknown record op \"%s\"", op);
    }
    json_decref(rec);
    return rc;
}

int ctl_store_open(ctl_service *s, st_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s.journal", s->o.state_path);
    int before = s->reg.n;
    if (!(s->jr = journal_open(path, replay_one, s, err))) return -1;
    if (journal_records(s->jr))
        ST_INFO("control: journal %s: %zu record(s) replayed; %d known node(s) (%d from the snapshot)", path,
                journal_records(s->jr), s->reg.n, before);
    return 0;
}

static void append(ctl_service *s, json_t *rec) {
    char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    st_err err = {{0}};
    if (!text)
        ST_ERROR("control: journal: out of memory");
    else if (s->jr && journal_append(s->jr, text, strlen(text), &err) != 0)
        ST_ERROR("control: %s (the change is kept in memory; the next snapshot saves it)", err.msg);
    free(text);
}

void ctl_store_node(ctl_service *s, const reg_node *n) {
    if (s->ha) {
        ctl_etcd_node(s, n->name, n->data_address);
        return;
    }
    append(s, json_pack("{s:s,s:s,s:s}", "op", "node", "name", n->name, "addr", n->data_address));
}

void ctl_store_reset(ctl_service *s) {
    st_err err = {{0}};
    if (s->jr && journal_reset(s->jr, &err) != 0) ST_ERROR("control: %s", err.msg);
}

/* Holds a stage of the serving, loading or saved (not yet restored) placement. */
static bool in_any_placement(const ctl_service *s, const char *name, uint64_t *epoch) {
    const run *runs[] = {s->cur, s->pend, s->from};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++)
        if (ctl_in_placement(runs[i], name)) return *epoch = runs[i]->pl.epoch, true;
    if (!s->cur)
        for (int i = 0; i < s->saved.n_stages; i++)
            if (!strcmp(s->saved.st[i].node, name)) return *epoch = s->saved.epoch, true;
    return false;
}

static void remove_node(ctl_service *s, const char *name) {
    if (s->ha)
        ctl_etcd_node(s, name, NULL);
    else
        append(s, json_pack("{s:s,s:s}", "op", "remove", "name", name));
    registry_remove(&s->reg, name);
}

void ctl_store_tick(ctl_service *s, double now) {
    st_err err = {{0}};
    if (s->jr && journal_sync(s->jr, &err) != 0) ST_ERROR("control: %s", err.msg);
    if (s->o.dead_node_expiry_s > 0) {
        for (int i = 0; i < s->reg.n; i++) {
            reg_node *n = &s->reg.nodes[i];
            /* dead: since it turned dead; known from the snapshot only: since our start */
            double since = n->state == REG_DEAD ? n->dead_since : n->state == 0 ? s->t0 : -1;
            uint64_t epoch;
            if (since < 0 || now - since < s->o.dead_node_expiry_s || in_any_placement(s, n->name, &epoch)) continue;
            ST_INFO("control: %s expired: %s for %.0f s (--dead-node-expiry %.0f s); its record is removed", n->name,
                    n->state ? "dead" : "not registered since the restart", now - since, s->o.dead_node_expiry_s);
            remove_node(s, n->name);
            i--; /* the last node moved into this place */
        }
    }
    size_t limit = (size_t)s->reg.n > JOURNAL_COMPACT_MIN ? (size_t)s->reg.n : JOURNAL_COMPACT_MIN;
    if (s->jr && journal_records(s->jr) > limit) ctl_save_state(s); /* snapshot + empty journal */
}

void ctl_h_remove_node(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__RemoveNodeRequest *r = (const void *)req->msg;
    reg_node *n = registry_find(&s->reg, r->node);
    if (!n) {
        rpc_call_finishf(c, RPC_NOT_FOUND, "RemoveNode: unknown node \"%s\"", r->node);
        return;
    }
    uint64_t epoch = 0;
    if (in_any_placement(s, n->name, &epoch)) {
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
