/* placement_rpc.c — the placement calls of strata.v1.Control
 * (placement_rpc.h). */
#include "coordinator/control/placement_rpc.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/control/reply.h"
#include "proto/control.pb-c.h"

/* ---------------------------------------------------------------- placement */

typedef struct pl_msg {
    Strata__V1__Placement p;
    Strata__V1__Stage st[PLACE_STAGE_MAX];
    Strata__V1__Stage *sp[PLACE_STAGE_MAX];
} pl_msg;

static void fill_placement(pl_msg *m, const placement *pl) {
    strata__v1__placement__init(&m->p);
    m->p.epoch = pl->epoch;
    m->p.n_layers = (uint32_t)pl->n_layers;
    for (int i = 0; i < pl->n_stages; i++) {
        strata__v1__stage__init(&m->st[i]);
        m->st[i].node = (char *)pl->st[i].node;
        m->st[i].first_layer = (uint32_t)pl->st[i].first;
        m->st[i].last_layer = (uint32_t)pl->st[i].last;
        m->st[i].tp = (uint32_t)pl->st[i].tp;
        m->sp[i] = &m->st[i];
    }
    m->p.stages = m->sp;
    m->p.n_stages = (size_t)pl->n_stages;
}

/* current, and pending = the loading placement or `dry` (a dry run). */
static void reply_placement(epochs *ep, rpc_call *c, const placement *dry, bool unchanged) {
    pl_msg *two = calloc(2, sizeof *two);
    if (!two) {
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    pl_msg *cur = &two[0], *pend = &two[1];
    Strata__V1__NodeLoad loads[PLACE_STAGE_MAX], *lp[PLACE_STAGE_MAX];
    Strata__V1__PlacementReply out = STRATA__V1__PLACEMENT_REPLY__INIT;
    placement none = {0};
    none.n_layers = ep->o.pm->n_layers;
    fill_placement(cur, ep->cur ? &ep->cur->pl : &none);
    out.current = &cur->p;
    out.unchanged = unchanged;
    const placement *pp = dry ? dry : ep->pend ? &ep->pend->pl : NULL;
    if (pp) {
        fill_placement(pend, pp);
        out.pending = &pend->p;
        if (!dry && ep->pend) {
            for (int i = 0; i < pp->n_stages; i++) {
                strata__v1__node_load__init(&loads[i]);
                loads[i].node = (char *)pp->st[i].node;
                loads[i].bytes_total = place_stage_bytes(ep->o.pm, pp->st[i].first, pp->st[i].last, pp->n_layers);
                loads[i].bytes_loaded = cluster_stage_ready(ep->pend->cl, i) ? loads[i].bytes_total : 0;
                lp[i] = &loads[i];
            }
            out.loading = lp;
            out.n_loading = (size_t)pp->n_stages;
        }
    }
    ctl_reply(c, &out.base);
    free(two);
}

void placement_rpc_get(rpc_call *c, const rpc_request *req, void *ud) { reply_placement(ud, c, NULL, false); }

/* pl has the current placement's stages (node, layers, TP), no change is in
 * progress, and no node of it registered again since the current epoch was
 * assigned: then a change would only reload the same stages. A node that
 * registered again (restarted, or back from dead: registry.h's
 * registrations) holds none of the current epoch's stages, so the same
 * stages are a change: a new epoch loads them onto it (issue 12: a
 * restarted worker re-placed with the old split was refused as unchanged). */
static bool same_as_current(epochs *ep, const placement *pl) {
    if (!ep->cur || ep->pend || ep->from) return false;
    const placement *c = &ep->cur->pl;
    if (c->n_stages != pl->n_stages || c->n_layers != pl->n_layers) return false;
    for (int i = 0; i < pl->n_stages; i++)
        if (strcmp(c->st[i].node, pl->st[i].node) || c->st[i].first != pl->st[i].first ||
            c->st[i].last != pl->st[i].last || c->st[i].tp != pl->st[i].tp)
            return false;
    for (int i = 0; i < c->n_stages; i++) {
        const reg_node *n = registry_find(ep->o.reg, c->st[i].node);
        if (n && n->registrations != ep->cur->node_reg[i]) {
            ST_INFO("control: %s registered again since placement epoch %" PRIu64 " was assigned (stage %d): "
                    "the same stages are a change (a new epoch loads them)",
                    n->name, c->epoch, i);
            return false;
        }
    }
    return true;
}

/* The placement asked for is the current one: answer it, unchanged. */
static void reply_unchanged(epochs *ep, rpc_call *c, const char *what) {
    ST_INFO("control: %s: the placement is unchanged (epoch %" PRIu64 "); nothing to reload", what,
            ep->cur->pl.epoch);
    reply_placement(ep, c, NULL, true);
}

/* Why a registered node is not usable: "is draining", "is dead"... Names
 * the state; "is not registered" for nodes known from the state file only. */
static const char *unusable_why(const reg_node *n) {
    switch (n->state) {
    case REG_DRAINING: return "is draining (stratactl undrain brings it back)";
    case REG_SUSPECT: return "is suspect (missing heartbeats)";
    case REG_DEAD: return "is dead (no heartbeat; its lease was revoked)";
    default: return "is not registered (known from the state file only)";
    }
}

void placement_rpc_set(rpc_call *c, const rpc_request *req, void *ud) {
    epochs *ep = ud;
    const Strata__V1__SetPlacementRequest *r = (const void *)req->msg;
    if (r->n_stages == 0 || r->n_stages > PLACE_STAGE_MAX) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "SetPlacement: %zu stages (want 1..%d)", r->n_stages,
                         PLACE_STAGE_MAX);
        return;
    }
    place_stage st[PLACE_STAGE_MAX];
    for (size_t i = 0; i < r->n_stages; i++) {
        if (strlen(r->stages[i]->node) >= sizeof st[i].node) {
            rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "SetPlacement: stage %zu: node name too long", i);
            return;
        }
        snprintf(st[i].node, sizeof st[i].node, "%s", r->stages[i]->node);
        st[i].first = r->stages[i]->first_layer > 100000 ? 100000 : (int)r->stages[i]->first_layer;
        st[i].last = r->stages[i]->last_layer > 100000 ? 100000 : (int)r->stages[i]->last_layer;
        st[i].tp = r->stages[i]->tp > 64 ? 64 : (int)r->stages[i]->tp;
        const reg_node *rn = registry_find(ep->o.reg, st[i].node);
        if (rn && !registry_usable(rn)) {
            rpc_call_finishf(c, RPC_FAILED_PRECONDITION, "SetPlacement: node \"%s\" (stage %zu) %s", rn->name, i,
                             unusable_why(rn));
            return;
        }
    }
    place_node *nodes;
    int n = epochs_usable_nodes(ep, &nodes, NULL);
    placement pl;
    int code = RPC_INVALID_ARGUMENT;
    st_err err = {{0}};
    int rc = n < 0 ? st_errf(&err, "out of memory") : place_check_explicit(ep->o.pm, nodes, n, st, (int)r->n_stages, &pl, &code, &err);
    free(nodes);
    if (rc != 0) {
        rpc_call_finishf(c, code, "SetPlacement: %s", err.msg);
        return;
    }
    if (same_as_current(ep, &pl)) {
        reply_unchanged(ep, c, "SetPlacement");
        return;
    }
    if (epochs_change(ep, &pl, &code, &err) != 0) {
        rpc_call_finishf(c, code, "SetPlacement: %s", err.msg);
        return;
    }
    reply_placement(ep, c, NULL, false);
}

void placement_rpc_auto(rpc_call *c, const rpc_request *req, void *ud) {
    epochs *ep = ud;
    const Strata__V1__AutoPlacementRequest *r = (const void *)req->msg;
    place_node *nodes;
    int n = epochs_usable_nodes(ep, &nodes, NULL);
    placement pl;
    int code = RPC_INTERNAL;
    st_err err = {{0}};
    int rc = n < 0 ? st_errf(&err, "out of memory") : place_auto(ep->o.pm, nodes, n, &pl, &code, &err);
    free(nodes);
    if (rc != 0) {
        rpc_call_finishf(c, code, "AutoPlacement: %s", err.msg);
        return;
    }
    if (same_as_current(ep, &pl)) { /* a dry run too: no pending change to show */
        reply_unchanged(ep, c, r->dry_run ? "AutoPlacement (dry run)" : "AutoPlacement");
        return;
    }
    if (r->dry_run) {
        pl.epoch = ep->last_epoch + 1;
        reply_placement(ep, c, &pl, false);
        return;
    }
    if (epochs_change(ep, &pl, &code, &err) != 0) {
        rpc_call_finishf(c, code, "AutoPlacement: %s", err.msg);
        return;
    }
    reply_placement(ep, c, NULL, false);
}

static int cmp_reg_name(const void *a, const void *b) {
    return strcmp((*(const reg_node *const *)a)->name, (*(const reg_node *const *)b)->name);
}

/* The other nodes' states, grouped, names sorted: "node-b, node-c are
 * draining; node-d is dead" (or "no other node is registered"), into buf. */
static const char *others_why(const registry *reg, const char *except, char *buf, size_t cap) {
    static const int order[] = {REG_DRAINING, REG_SUSPECT, REG_DEAD, 0};
    const reg_node **by_name = malloc(sizeof *by_name * (size_t)(reg->n ? reg->n : 1));
    int nn = 0;
    if (!by_name) return snprintf(buf, cap, "(out of memory)"), buf;
    for (int i = 0; i < reg->n; i++) by_name[nn++] = &reg->nodes[i];
    qsort(by_name, (size_t)nn, sizeof *by_name, cmp_reg_name);
    size_t off = 0;
    buf[0] = 0;
    for (size_t k = 0; k < sizeof order / sizeof *order; k++) {
        int cnt = 0;
        size_t start = off;
        for (int i = 0; i < nn && off < cap; i++) {
            const reg_node *o = by_name[i];
            if (o->state != order[k] || !strcmp(o->name, except)) continue;
            off += (size_t)snprintf(buf + off, cap - off, "%s%s", cnt ? ", " : start ? "; " : "", o->name);
            cnt++;
        }
        if (cnt && off < cap)
            off += (size_t)snprintf(buf + off, cap - off, " %s %s", cnt > 1 ? "are" : "is",
                                    order[k] ? registry_state_name(order[k]) : "not registered");
    }
    if (off >= cap) off = cap - 1;
    if (!off) snprintf(buf, cap, "no other node is registered");
    free(by_name);
    return buf;
}

void placement_rpc_drain(rpc_call *c, const rpc_request *req, void *ud) {
    epochs *ep = ud;
    const Strata__V1__DrainRequest *r = (const void *)req->msg;
    reg_node *n = registry_find(ep->o.reg, r->node);
    if (!n || !n->state) {
        rpc_call_finishf(c, RPC_NOT_FOUND, "Drain: unknown node \"%s\"", r->node);
        return;
    }
    if (ep->pend || ep->from) {
        rpc_call_finish(c, RPC_FAILED_PRECONDITION, "Drain: a placement change is in progress; try again when it serves");
        return;
    }
    uint64_t epoch = ep->cur ? ep->cur->pl.epoch : 0;
    if (epochs_in_placement(ep->cur, n->name)) {
        place_node *nodes;
        int k = epochs_usable_nodes(ep, &nodes, n->name);
        placement pl;
        int code = RPC_INTERNAL;
        st_err err = {{0}};
        if (k < 0) {
            rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "Drain: out of memory");
            return;
        }
        if (k == 0) {
            rpc_call_finishf(c, RPC_FAILED_PRECONDITION,
                             "Drain: cannot move %s's stages away: no other usable node would be left (%s)",
                             n->name, others_why(ep->o.reg, n->name, err.msg, sizeof err.msg));
            return;
        }
        int rc = place_auto(ep->o.pm, nodes, k, &pl, &code, &err);
        free(nodes);
        if (rc != 0 || epochs_change(ep, &pl, &code, &err) != 0) {
            rpc_call_finishf(c, code, "Drain: cannot move %s's stages away: %s", n->name, err.msg);
            return;
        }
        epoch = pl.epoch;
    }
    if (n->state != REG_DEAD) n->state = REG_DRAINING;
    ST_INFO("control: draining %s (placement epoch %" PRIu64 ")", n->name, epoch);
    Strata__V1__DrainReply out = STRATA__V1__DRAIN_REPLY__INIT;
    out.node = n->name;
    out.state = (Strata__V1__NodeState)n->state;
    out.placement_epoch = epoch;
    ctl_reply(c, &out.base);
}

void placement_rpc_undrain(rpc_call *c, const rpc_request *req, void *ud) {
    epochs *ep = ud;
    const Strata__V1__DrainRequest *r = (const void *)req->msg;
    st_err err = {{0}};
    if (registry_undrain(ep->o.reg, r->node, &err) != 0) {
        reg_node *n = registry_find(ep->o.reg, r->node);
        rpc_call_finishf(c, n && n->state ? RPC_FAILED_PRECONDITION : RPC_NOT_FOUND, "Undrain: %s", err.msg);
        return;
    }
    reg_node *n = registry_find(ep->o.reg, r->node);
    uint64_t epoch = ep->cur ? ep->cur->pl.epoch : 0;
    ST_INFO("control: undrained %s: ready for the next placement change (placement epoch %" PRIu64
            " unchanged)", n->name, epoch);
    Strata__V1__DrainReply out = STRATA__V1__DRAIN_REPLY__INIT;
    out.node = n->name;
    out.state = (Strata__V1__NodeState)n->state;
    out.placement_epoch = epoch;
    ctl_reply(c, &out.base);
    event_active(ep->o.tick, 0, 0); /* with no placement yet, the tick may place now */
}

