/* epochs.c — placement runs and epochs (control_service.h): a placement
 * loads as a new cluster under its epoch, the serving one switches to it
 * when it is ready (running sequences move over), the old one is released
 * and retired; and the periodic tick (failure detection, load failures,
 * retiring, start-up restore or auto placement). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "coordinator/control/control_internal.h"

/* ---------------------------------------------------------------- runs */

void ctl_run_free(run *r) {
    if (!r) return;
    cluster_destroy(r->cl);
    free(r->stages);
    free(r);
}

static void retire(ctl_service *s, run *r, double after_s) {
    r->retire_at = st_now_s() + after_s;
    r->next = s->retired;
    s->retired = r;
}

bool ctl_in_placement(const run *r, const char *node) {
    if (!r) return false;
    for (int i = 0; i < r->pl.n_stages; i++)
        if (!strcmp(r->pl.st[i].node, node)) return true;
    return false;
}

static void run_on_ready(void *ud);
static void run_on_fatal(void *ud, const char *msg);

/* Starts loading placement pl (its epoch set) as a new cluster. */
static run *start_run(ctl_service *s, const placement *pl, st_err *err) {
    run *r = calloc(1, sizeof *r);
    if (r) r->stages = calloc((size_t)pl->n_stages, sizeof *r->stages);
    if (!r || !r->stages) {
        ctl_run_free(r);
        return st_errf(err, "out of memory"), NULL;
    }
    r->s = s;
    r->pl = *pl;
    place_range ranges[PLACE_STAGE_MAX];
    for (int i = 0; i < pl->n_stages; i++) {
        const place_stage *ps = &pl->st[i];
        reg_node *n = registry_find(&s->reg, ps->node);
        coord_stage_cfg *cs = &r->stages[i];
        snprintf(cs->name, sizeof cs->name, "%s", ps->node);
        cs->tp = ps->tp > 0 ? ps->tp : 1;
        /* The node's registered device kind picks the backend (compute/registry.h). */
        snprintf(cs->backend, sizeof cs->backend, "%s", n && !strcmp(n->device_kind, "cuda") ? "cuda" : "");
        if (!n || coord_parse_hostport(n->data_address, cs->host, sizeof cs->host, &cs->port, 0, err) != 0) {
            if (!n) st_errf(err, "node %s is not registered", ps->node);
            ctl_run_free(r);
            return NULL;
        }
        r->node_reg[i] = n->registrations;
        ranges[i].first = ps->first;
        ranges[i].last = ps->last + 1;
    }
    r->cfg = *s->o.cfg;
    r->cfg.model = s->model_file; /* the workers resolve the file name */
    r->cfg.worker_model = NULL;   /* ... among their registered files */
    r->cfg.stages = r->stages;
    r->cfg.n_stages = pl->n_stages;
    r->cfg.n_partition = 0;
    if (r->cfg.max_inflight && r->cfg.max_inflight < pl->n_stages) r->cfg.max_inflight = 0;
    cluster_opts co = {.cfg = &r->cfg,
                       .ranges = ranges,
                       .n_ctx = s->o.n_ctx,
                       .vocab = s->o.vocab,
                       .ready_timeout_s = s->o.ready_timeout_s,
                       .on_fatal = run_on_fatal,
                       .on_ready = run_on_ready,
                       .ud = r,
                       .epoch = pl->epoch,
                       .keep_loaded = true,
                       /* a recovery: survivors keep an unchanged stage of the lost epoch */
                       .adopt_epoch = s->lost ? s->lost->pl.epoch : 0,
                       .on_lost = ctl_run_on_lost,
                       .totals = &s->totals};
    r->cl = cluster_create(s->base, &co, err);
    if (!r->cl) {
        ctl_run_free(r);
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

/* Every request whose cluster is `from` now lives in `to` under new_id. */
static void on_moved(void *ud, uint64_t old_id, uint64_t new_id) {
    ctl_service *s = ud;
    for (lreq *q = s->reqs; q; q = q->next)
        if (q->r == s->from && q->cid == old_id) {
            if (new_id) {
                q->r = s->cur;
                q->cid = new_id;
            }
            return;
        }
}

/* The old epoch has no batch in flight any more: move its sequences over. */
void ctl_try_finish_switch(evutil_socket_t fd, short what, void *arg) {
    ctl_service *s = arg;
    run *from = s->from;
    if (!from) return;
    if (cluster_inflight(from->cl) > 0) {
        struct timeval tv = {0, SWITCH_POLL_US};
        evtimer_add(s->switch_ev, &tv);
        return;
    }
    bool recovery = from == s->lost;
    char ids[1024];
    int64_t tokens = 0;
    if (recovery) {
        ctl_held_ids(s, from, ids, sizeof ids);
        cluster_request_ids(from->cl, NULL, 0, &tokens);
    }
    int n = cluster_move_requests(from->cl, s->cur->cl, on_moved, s);
    if (recovery) {
        s->seqs_resumed += (uint64_t)n;
        s->tokens_recomputed += (uint64_t)tokens;
        engine_totals_note_resume(&s->totals, st_now_s() - s->lost_at);
        ST_INFO("control: recovery: epoch %" PRIu64 " serves %.2f s after the loss in epoch %" PRIu64
                "; resumed %d request(s) [%s] by re-prefilling %" PRId64 " token(s)",
                s->cur->pl.epoch, st_now_s() - s->lost_at, from->pl.epoch, n, ids, tokens);
        s->lost = NULL;
        s->n_excl = 0;
    }
    cluster_release_workers(from->cl);
    ST_INFO("control: switched from epoch %" PRIu64 " to %" PRIu64 "; %d running sequence(s) moved "
            "(re-prefilled on the new stages)",
            from->pl.epoch, s->cur->pl.epoch, n);
    s->from = NULL;
    retire(s, from, RETIRE_AFTER_S);
}

static void run_on_ready(void *ud) {
    run *r = ud;
    ctl_service *s = r->s;
    r->ready = true;
    if (r != s->pend) return;
    s->pend = NULL;
    if (!s->cur) {
        s->cur = r;
        ctl_heartbeats_apply(s); /* the heartbeat replies name the new epoch */
        memset(&s->saved, 0, sizeof s->saved);
        ST_INFO("control: serving placement epoch %" PRIu64 " (%d stages)", r->pl.epoch, r->pl.n_stages);
        printf("strata-coordinator: serving placement epoch %" PRIu64 "\n", r->pl.epoch);
        fflush(stdout);
        ctl_save_state(s);
        return;
    }
    /* Atomic switch between steps: the old epoch launches nothing more; new
     * requests go to the new one; running sequences follow once the old
     * epoch's in-flight batches are back. */
    s->from = s->cur;
    cluster_pause(s->from->cl);
    s->cur = r;
    ctl_heartbeats_apply(s);
    ctl_save_state(s);
    ctl_try_finish_switch(-1, 0, s);
}

static void run_on_fatal(void *ud, const char *msg) {
    run *r = ud;
    r->failed = true;
    snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg);
    event_active(r->s->tick_ev, 0, 0); /* dropped from the tick, outside the cluster's callback */
}

/* A change to pl (epoch assigned here). */
int ctl_change_placement(ctl_service *s, placement *pl, int *code, st_err *err) {
    if (s->pend || s->from) {
        *code = RPC_FAILED_PRECONDITION;
        return st_errf(err, "placement epoch %" PRIu64 " is still %s; try again when it serves",
                       s->pend ? s->pend->pl.epoch : s->cur->pl.epoch, s->pend ? "loading" : "switching");
    }
    pl->epoch = s->last_epoch + 1;
    run *r = start_run(s, pl, err);
    if (!r) {
        *code = RPC_INTERNAL;
        return -1;
    }
    s->last_epoch = pl->epoch;
    s->pend = r;
    ctl_save_state(s);
    return 0;
}

/* ---------------------------------------------------------------- the tick */

void ctl_tick(evutil_socket_t fd, short what, void *arg) {
    ctl_service *s = arg;
    if (s->standby) return; /* etcd_store.c: the election starts it */
    double t = st_now_s();
    ctl_heartbeats_apply(s); /* before the timeouts: no node is judged on a heartbeat still queued */
    registry_tick(&s->reg, t);
    ctl_store_tick(s, t);
    ctl_check_fd_room(s);
    if (s->pend && s->pend->failed) {
        ST_ERROR("control: placement epoch %" PRIu64 " failed to load: %s%s", s->pend->pl.epoch,
                 s->pend->fail_msg,
                 s->lost ? "; recovery tries again" : s->cur ? "; the current placement keeps serving" : "; retrying");
        retire(s, s->pend, 0);
        s->pend = NULL;
        s->retry_at = t + RETRY_START_S;
    }
    if (s->lost) ctl_recovery_tick(s, t);
    for (run **pp = &s->retired; *pp;) {
        run *r = *pp;
        if (t >= r->retire_at) {
            *pp = r->next;
            ctl_run_free(r);
        } else {
            pp = &r->next;
        }
    }
    if (!s->cur && !s->pend && t >= s->retry_at) {
        st_err err = {{0}};
        int code = 0;
        if (s->saved.epoch) {
            bool all = true;
            for (int i = 0; i < s->saved.n_stages && all; i++) {
                reg_node *n = registry_find(&s->reg, s->saved.st[i].node);
                all = n && registry_usable(n);
            }
            if (all) {
                s->pend = start_run(s, &s->saved, &err);
                if (!s->pend) {
                    ST_ERROR("control: cannot restore placement epoch %" PRIu64 ": %s", s->saved.epoch, err.msg);
                    s->retry_at = t + RETRY_START_S;
                }
            }
        } else {
            place_node *nodes;
            int n = ctl_usable_nodes(s, &nodes, NULL);
            if (n >= s->o.min_workers) {
                placement pl;
                if (place_auto(&s->pm, nodes, n, &pl, &code, &err) != 0 ||
                    ctl_change_placement(s, &pl, &code, &err) != 0) {
                    ST_ERROR("control: automatic placement: %s", err.msg);
                    s->retry_at = t + RETRY_START_S;
                }
            }
            free(nodes);
        }
    }
    if (!event_pending(s->tick_ev, EV_TIMEOUT, NULL)) {
        uint32_t ms = s->reg.heartbeat_ms / 4;
        if (ms < 10) ms = 10;
        if (ms > 250) ms = 250;
        struct timeval tv = {0, (int)ms * 1000};
        evtimer_add(s->tick_ev, &tv);
    }
}

