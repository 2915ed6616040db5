/* epochs.c — placement runs and epochs (epochs.h): a placement loads as a
 * new cluster under its epoch, the serving one switches to it when it is
 * ready (running sequences move over), the old one is released and retired;
 * the start-up restore or automatic placement. */
#include "coordinator/control/epochs.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "rpc/rpc_code.h"

#define RETIRE_AFTER_S 1.0   /* an old cluster lives on this long after StageRelease */
#define SWITCH_POLL_US 2000  /* waiting for the old epoch's in-flight batches */

/* ---------------------------------------------------------------- runs */

static void run_free(run *r) {
    if (!r) return;
    cluster_destroy(r->cl);
    free(r->stages);
    free(r);
}

static void retire(epochs *ep, run *r, double after_s) {
    r->retire_at = st_now_s() + after_s;
    r->next = ep->retired;
    ep->retired = r;
}

bool epochs_in_placement(const run *r, const char *node) {
    if (!r) return false;
    for (int i = 0; i < r->pl.n_stages; i++)
        if (!strcmp(r->pl.st[i].node, node)) return true;
    return false;
}

static int cmp_node(const void *a, const void *b) {
    return strcmp(((const place_node *)a)->name, ((const place_node *)b)->name);
}

int epochs_usable_nodes(const epochs *ep, place_node **outp, const char *except) {
    const registry *reg = ep->o.reg;
    int k = 0;
    *outp = NULL;
    if (reg->n == 0) return 0;
    place_node *out = malloc(sizeof *out * (size_t)reg->n);
    if (!out) return -1;
    *outp = out;
    for (int i = 0; i < reg->n; i++) {
        const reg_node *n = &reg->nodes[i];
        if (!registry_usable(n) || (except && !strcmp(n->name, except))) continue;
        /* memory and the TP rule: placement.h */
        out[k++] = place_node_make(n->name, n->device_kind, n->device_count, n->device_memory, n->host_memory,
                                   n->tp_limit, ep->o.cfg->gpu_memory_utilization);
    }
    if (k == 0) { /* nothing to free for the caller */
        free(out);
        *outp = NULL;
        return 0;
    }
    qsort(out, (size_t)k, sizeof *out, cmp_node);
    return k;
}

static void run_on_ready(void *ud);
static void run_on_fatal(void *ud, const char *msg);

static void run_on_lost(void *ud, int stage, const char *msg) {
    run *r = ud;
    epochs_hooks *h = &r->ep->o.hooks;
    h->lost(h->ud, r, stage, msg);
}

/* Starts loading placement pl (its epoch set) as a new cluster. */
static run *start_run(epochs *ep, const placement *pl, st_err *err) {
    run *r = calloc(1, sizeof *r);
    if (r) r->stages = calloc((size_t)pl->n_stages, sizeof *r->stages);
    if (!r || !r->stages) {
        run_free(r);
        return st_errf(err, "out of memory"), NULL;
    }
    r->ep = ep;
    r->pl = *pl;
    place_range ranges[PLACE_STAGE_MAX];
    for (int i = 0; i < pl->n_stages; i++) {
        const place_stage *ps = &pl->st[i];
        reg_node *n = registry_find(ep->o.reg, ps->node);
        coord_stage_cfg *cs = &r->stages[i];
        snprintf(cs->name, sizeof cs->name, "%s", ps->node);
        cs->tp = ps->tp > 0 ? ps->tp : 1;
        /* The node's registered device kind picks the backend (compute/registry.h). */
        snprintf(cs->backend, sizeof cs->backend, "%s", n && !strcmp(n->device_kind, "cuda") ? "cuda" : "");
        if (!n || coord_parse_hostport(n->data_address, cs->host, sizeof cs->host, &cs->port, 0, err) != 0) {
            if (!n) st_errf(err, "node %s is not registered", ps->node);
            run_free(r);
            return NULL;
        }
        r->node_reg[i] = n->registrations;
        ranges[i].first = ps->first;
        ranges[i].last = ps->last + 1;
    }
    r->cfg = *ep->o.cfg;
    r->cfg.model = ep->o.model_file; /* the workers resolve the file name */
    r->cfg.worker_model = NULL;      /* ... among their registered files */
    r->cfg.stages = r->stages;
    r->cfg.n_stages = pl->n_stages;
    r->cfg.n_partition = 0;
    if (r->cfg.max_inflight && r->cfg.max_inflight < pl->n_stages) r->cfg.max_inflight = 0;
    cluster_opts co = {.cfg = &r->cfg,
                       .ranges = ranges,
                       .n_ctx = ep->o.n_ctx,
                       .vocab = ep->o.vocab,
                       .ready_timeout_s = ep->o.ready_timeout_s,
                       .on_fatal = run_on_fatal,
                       .on_ready = run_on_ready,
                       .ud = r,
                       .epoch = pl->epoch,
                       .keep_loaded = true,
                       /* a recovery: survivors keep an unchanged stage of the lost epoch */
                       .adopt_epoch = ep->adopt_epoch,
                       .on_lost = run_on_lost,
                       .totals = ep->o.totals};
    r->cl = cluster_create(ep->o.base, &co, err);
    if (!r->cl) {
        run_free(r);
        return NULL;
    }
    char line[1024] = "";
    size_t off = 0;
    for (int i = 0; i < pl->n_stages && off < sizeof line - 80; i++)
        off += (size_t)snprintf(line + off, sizeof line - off, "%s%s:%d-%d", i ? "," : "", pl->st[i].node,
                                pl->st[i].first, pl->st[i].last);
    ST_INFO("control: loading placement epoch %" PRIu64 ": %s", pl->epoch, line);
    return r;
}

/* The old epoch has no batch in flight any more: move its sequences over. */
static void try_finish_switch(evutil_socket_t fd, short what, void *arg) {
    epochs *ep = arg;
    run *from = ep->from;
    if (!from) return;
    if (cluster_inflight(from->cl) > 0) {
        struct timeval tv = {0, SWITCH_POLL_US};
        evtimer_add(ep->switch_ev, &tv);
        return;
    }
    int n = ep->o.hooks.move(ep->o.hooks.ud, from, ep->cur);
    cluster_release_workers(from->cl);
    ST_INFO("control: switched from epoch %" PRIu64 " to %" PRIu64 "; %d running sequence(s) moved "
            "(re-prefilled on the new stages)",
            from->pl.epoch, ep->cur->pl.epoch, n);
    ep->from = NULL;
    retire(ep, from, RETIRE_AFTER_S);
}

static void run_on_ready(void *ud) {
    run *r = ud;
    epochs *ep = r->ep;
    const epochs_hooks *h = &ep->o.hooks;
    r->ready = true;
    if (r != ep->pend) return;
    ep->pend = NULL;
    if (!ep->cur) {
        ep->cur = r;
        h->serving(h->ud); /* the heartbeat replies name the new epoch */
        memset(&ep->saved, 0, sizeof ep->saved);
        ST_INFO("control: serving placement epoch %" PRIu64 " (%d stages)", r->pl.epoch, r->pl.n_stages);
        printf("strata-coordinator: serving placement epoch %" PRIu64 "\n", r->pl.epoch);
        fflush(stdout);
        h->save(h->ud);
        return;
    }
    /* Atomic switch between steps: the old epoch launches nothing more; new
     * requests go to the new one; running sequences follow once the old
     * epoch's in-flight batches are back. */
    ep->from = ep->cur;
    cluster_pause(ep->from->cl);
    ep->cur = r;
    h->serving(h->ud);
    h->save(h->ud);
    try_finish_switch(-1, 0, ep);
}

static void run_on_fatal(void *ud, const char *msg) {
    run *r = ud;
    r->failed = true;
    snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg);
    event_active(r->ep->o.tick, 0, 0); /* dropped from the tick, outside the cluster's callback */
}

int epochs_change(epochs *ep, placement *pl, int *code, st_err *err) {
    if (ep->pend || ep->from) {
        *code = RPC_FAILED_PRECONDITION;
        return st_errf(err, "placement epoch %" PRIu64 " is still %s; try again when it serves",
                       ep->pend ? ep->pend->pl.epoch : ep->cur->pl.epoch, ep->pend ? "loading" : "switching");
    }
    pl->epoch = ep->last_epoch + 1;
    run *r = start_run(ep, pl, err);
    if (!r) {
        *code = RPC_INTERNAL;
        return -1;
    }
    ep->last_epoch = pl->epoch;
    ep->pend = r;
    ep->o.hooks.save(ep->o.hooks.ud);
    return 0;
}

/* ---------------------------------------------------------------- lifetime */

int epochs_init(epochs *ep, const epochs_opts *o, st_err *err) {
    ep->o = *o;
    if (!(ep->switch_ev = evtimer_new(o->base, try_finish_switch, ep)))
        return st_errf(err, "control: cannot create events");
    return 0;
}

void epochs_free(epochs *ep) {
    run_free(ep->cur);
    run_free(ep->pend);
    run_free(ep->from);
    while (ep->retired) {
        run *r = ep->retired;
        ep->retired = r->next;
        run_free(r);
    }
    if (ep->switch_ev) event_free(ep->switch_ev);
    ep->cur = ep->pend = ep->from = NULL;
    ep->switch_ev = NULL;
}

/* ---------------------------------------------------------------- the tick */

void epochs_drop_failed(epochs *ep, double t, bool recovering) {
    if (!ep->pend || !ep->pend->failed) return;
    ST_ERROR("control: placement epoch %" PRIu64 " failed to load: %s%s", ep->pend->pl.epoch, ep->pend->fail_msg,
             recovering ? "; recovery tries again" : ep->cur ? "; the current placement keeps serving" : "; retrying");
    retire(ep, ep->pend, 0);
    ep->pend = NULL;
    ep->retry_at = t + EPOCHS_RETRY_S;
}

/* With nothing serving or loading: the saved placement once every node of it
 * is usable, else an automatic one over min_workers usable nodes. */
static void start_up(epochs *ep, double t, int min_workers) {
    st_err err = {{0}};
    int code = 0;
    if (ep->saved.epoch) {
        bool all = true;
        for (int i = 0; i < ep->saved.n_stages && all; i++) {
            reg_node *n = registry_find(ep->o.reg, ep->saved.st[i].node);
            all = n && registry_usable(n);
        }
        if (all) {
            ep->pend = start_run(ep, &ep->saved, &err);
            if (!ep->pend) {
                ST_ERROR("control: cannot restore placement epoch %" PRIu64 ": %s", ep->saved.epoch, err.msg);
                ep->retry_at = t + EPOCHS_RETRY_S;
            }
        }
    } else {
        place_node *nodes;
        int n = epochs_usable_nodes(ep, &nodes, NULL);
        if (n >= min_workers) {
            placement pl;
            if (place_auto(ep->o.pm, nodes, n, &pl, &code, &err) != 0 || epochs_change(ep, &pl, &code, &err) != 0) {
                ST_ERROR("control: automatic placement: %s", err.msg);
                ep->retry_at = t + EPOCHS_RETRY_S;
            }
        }
        free(nodes);
    }
}

void epochs_tick(epochs *ep, double t, int min_workers) {
    for (run **pp = &ep->retired; *pp;) {
        run *r = *pp;
        if (t >= r->retire_at) {
            *pp = r->next;
            run_free(r);
        } else {
            pp = &r->next;
        }
    }
    if (!ep->cur && !ep->pend && t >= ep->retry_at) start_up(ep, t, min_workers);
}
