/* control_service.c — the live control plane (control_service.h), the owner
 * of its parts (README.md): their lifetime and wiring, the handler table
 * behind the standby and role checks, the serving engine that forwards to
 * the cluster of the serving epoch, the periodic tick, and GetStatus. The
 * parts never call back here except through the hooks set below. */
#include "coordinator/control/control_service.h"

#include <event2/event.h>
#include <inttypes.h>
#include <protobuf-c/protobuf-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/version.h"
#include "coordinator/control/authz.h"
#include "coordinator/control/epochs.h"
#include "coordinator/control/etcd_store.h"
#include "coordinator/control/fd_room.h"
#include "coordinator/control/generate.h"
#include "coordinator/control/leave.h"
#include "coordinator/control/model_info.h"
#include "coordinator/control/node_rpc.h"
#include "coordinator/control/node_store.h"
#include "coordinator/control/placement_rpc.h"
#include "coordinator/control/recovery.h"
#include "coordinator/control/reply.h"
#include "coordinator/control/requests.h"
#include "coordinator/control/state_file.h"
#include "coordinator/serve/engine_totals.h"
#include "proto/control.pb-c.h"
#include "rpc/grpc_loop.h"

#define SVC "/strata.v1.Control/"

struct ctl_service {
    struct event_base *base;
    ctl_opts o;
    model_info model;
    registry reg;
    epochs ep;               /* the placement runs: serving, loading, switching, retired */
    recovery rec;            /* after a lost stage */
    engine_totals totals;    /* the counters of every epoch's cluster (serve/engine_totals.h) */
    ctl_requests rq;         /* the engine's requests and their clusters */
    node_store store;        /* the state file and journal, or etcd */
    etcd_store *etcd;        /* --etcd: the election and the state in etcd; else NULL */
    node_rpc nodes;          /* Register, Heartbeat, ListNodes */
    leave_ctx leave;
    gen_streams gen;         /* the open Generate streams */
    rpc_server *srv;
    rpc_loop *loop;
    bool tls;                /* mutual TLS: calls are authorized (authz.h) */
    struct ctl_guard *guards; /* the handler table's role checks */
    struct event *tick_ev;
    double t0;               /* the start, or the takeover (--etcd) */
    fd_room fds;
};

/* True while a standby (--etcd, not the leader): msg names the leader. */
static bool standby(ctl_service *s, char *msg, size_t cap, char *http, size_t http_cap) {
    return etcd_store_standby(s->etcd, msg, cap, http, http_cap);
}

/* ---------------------------------------------------------------- the parts' hooks */

static void on_serving(void *ud) {
    ctl_service *s = ud;
    node_rpc_apply(&s->nodes); /* the heartbeat replies name the new epoch */
}

static void on_save(void *ud) {
    ctl_service *s = ud;
    node_store_save(&s->store);
}

static int on_move(void *ud, run *from, run *to) {
    ctl_service *s = ud;
    return recovery_move(&s->rec, from, to);
}

static void on_lost(void *ud, run *r, int stage, const char *msg) {
    ctl_service *s = ud;
    recovery_on_lost(&s->rec, r, stage, msg);
}

static void on_elected(void *ud) {
    ctl_service *s = ud;
    s->t0 = st_now_s(); /* dead-node expiry counts from the takeover */
    event_active(s->tick_ev, 0, 0);
}

/* ---------------------------------------------------------------- the engine */

static int eng_submit(void *impl, const coord_request *req, const coord_sink *sink, void *ctx, uint64_t *id_out,
                      st_err *err) {
    ctl_service *s = impl;
    char msg[600], http[256];
    if (standby(s, msg, sizeof msg, http, sizeof http)) return st_errf(err, "%s", msg), COORD_EUNAVAIL;
    /* While recovering (docs/recovery.md), new requests are held with the others. */
    bool hold = recovery_holding(&s->rec);
    if (!hold && (!s->ep.cur || !cluster_is_ready(s->ep.cur->cl))) {
        int ready = 0;
        for (int i = 0; i < s->reg.n; i++) ready += registry_usable(&s->reg.nodes[i]);
        return st_errf(err, "no placement is serving yet (%d usable node(s) registered%s)", ready,
                       s->ep.pend ? ", a placement is loading" : ""),
               COORD_EUNAVAIL;
    }
    return requests_submit(&s->rq, s->ep.cur->cl, req, sink, ctx, id_out, err);
}

static void eng_cancel(void *impl, uint64_t id) {
    ctl_service *s = impl;
    requests_cancel(&s->rq, id);
}

static int eng_health(void *impl, st_err *err) {
    ctl_service *s = impl;
    char msg[600], http[256];
    if (standby(s, msg, sizeof msg, http, sizeof http)) return st_errf(err, "%s", msg);
    if (!s->ep.cur) return st_errf(err, "no placement is serving yet%s", s->ep.pend ? " (loading)" : "");
    if (s->rec.lost && s->rec.lost == s->ep.cur)
        return st_errf(err, "recovering from: %s (%s)", s->rec.msg,
                       s->rec.expired ? "no capacity; waiting for a usable node"
                       : s->ep.pend   ? "a new placement is loading"
                                      : "waiting for capacity");
    coord_engine e = cluster_engine(s->ep.cur->cl);
    return e.ops->health(e.impl, err);
}

static char *eng_stages_json(void *impl) {
    ctl_service *s = impl;
    if (!s->ep.cur) return strdup("{\"ready\":false,\"stages\":[]}");
    coord_engine e = cluster_engine(s->ep.cur->cl);
    return e.ops->stages_json ? e.ops->stages_json(e.impl) : NULL;
}

static void eng_stats(void *impl, coord_engine_stats *out) {
    ctl_service *s = impl;
    node_rpc_apply(&s->nodes);
    memset(out, 0, sizeof *out);
    if (s->ep.cur) {
        coord_engine e = cluster_engine(s->ep.cur->cl);
        if (e.ops->stats) e.ops->stats(e.impl, out);
        coord_engine_stats_release(out); /* the registry's view replaces the cluster's */
    }
    /* Workers: the registry's view (state names of registry.h), "serving"
     * for a ready node that holds a stage of the serving placement. */
    static const char *const live_states[] = {"registered", "ready", "serving", "suspect", "dead", "draining", NULL};
    out->worker_states = live_states;
    out->recoveries = s->rec.recoveries;
    out->sequences_resumed = s->rec.seqs_resumed;
    out->tokens_recomputed = s->rec.tokens_recomputed;
    engine_totals_report(&s->totals, out); /* also with no placement serving */
    leader_write_stats ws;
    if (etcd_store_write_stats(s->etcd, &ws)) {
        out->etcd_txns_refused = ws.refused_batches;
        out->etcd_changes_dropped = ws.dropped_changes;
        out->etcd_queued = ws.queued;
        out->etcd_unwritten_s = ws.unwritten_s;
    }
    bool serving = s->ep.cur && cluster_is_ready(s->ep.cur->cl);
    double t = st_now_s();
    out->n_workers = 0;
    out->workers = calloc((size_t)(s->reg.n ? s->reg.n : 1), sizeof *out->workers);
    for (int i = 0; out->workers && i < s->reg.n; i++) {
        const reg_node *n = &s->reg.nodes[i];
        coord_worker_stats *w = &out->workers[out->n_workers++];
        snprintf(w->name, sizeof w->name, "%s", n->name);
        w->state = n->state == REG_READY && serving && epochs_in_placement(s->ep.cur, n->name) ? "serving"
                   : n->state ? registry_state_name(n->state)
                              : NULL; /* known from the state file only: no state is 1 */
        w->heartbeat_age_s = n->state ? t - n->last_seen : -1.0;
    }
}

/* engine_api.h: not the leader (--etcd standby), with its HTTP URL. */
static bool eng_standby(void *impl, char *leader_http, size_t cap) {
    char msg[600];
    return standby(impl, msg, sizeof msg, leader_http, cap);
}

static const coord_engine_ops ctl_ops = {eng_submit, eng_cancel, eng_health, eng_stages_json, eng_stats,
                                         eng_standby};

coord_engine ctl_engine(ctl_service *s) {
    coord_engine e = {&ctl_ops, s};
    return e;
}

const registry *ctl_registry(const ctl_service *s) { return &s->reg; }

/* ---------------------------------------------------------------- the tick */

/* Failure detection, persistence, load failures, recovery, retiring, and
 * the start-up restore or automatic placement; every heartbeat_ms / 4
 * (10..250 ms), and at once when a part wakes it. */
static void tick(evutil_socket_t fd, short what, void *arg) {
    ctl_service *s = arg;
    if (standby(s, NULL, 0, NULL, 0)) return; /* etcd_store.h: the election starts it */
    double t = st_now_s();
    node_rpc_apply(&s->nodes); /* before the timeouts: no node is judged on a heartbeat still queued */
    registry_tick(&s->reg, t);
    node_store_tick(&s->store, t, s->t0);
    fd_room_check(&s->fds, &s->reg);
    epochs_drop_failed(&s->ep, t, s->rec.lost != NULL);
    if (s->rec.lost) recovery_tick(&s->rec, t);
    epochs_tick(&s->ep, t, s->o.min_workers);
    if (!event_pending(s->tick_ev, EV_TIMEOUT, NULL)) {
        uint32_t ms = s->reg.heartbeat_ms / 4;
        if (ms < 10) ms = 10;
        if (ms > 250) ms = 250;
        struct timeval tv = {0, (int)ms * 1000};
        evtimer_add(s->tick_ev, &tv);
    }
}

/* ---------------------------------------------------------------- GetStatus */

static void h_status(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    Strata__V1__GetStatusReply out = STRATA__V1__GET_STATUS_REPLY__INIT;
    char version[128]; /* common/version.h: the same words as --version and GET /version */
    snprintf(version, sizeof version, "strata-coordinator %s (commit %s, %s build; live)", st_version(),
             st_git_commit(), st_build_type());
    out.version = version;
    out.model = s->model.file;
    out.n_layers = (uint32_t)s->model.pm.n_layers;
    out.placement_epoch = s->ep.cur ? s->ep.cur->pl.epoch : 0;
    out.n_stages = s->ep.cur ? (uint32_t)s->ep.cur->pl.n_stages : 0;
    out.nodes_total = (uint32_t)s->reg.n;
    for (int i = 0; i < s->reg.n; i++) {
        out.nodes_ready += s->reg.nodes[i].state == REG_READY;
        out.running_sequences += s->reg.nodes[i].running_sequences;
    }
    out.running_sequences = (uint32_t)requests_count(&s->rq);
    out.uptime_s = st_now_s() - s->t0;
    out.serving = s->ep.cur && cluster_is_ready(s->ep.cur->cl);
    Strata__V1__RecoveryStatus rec = STRATA__V1__RECOVERY_STATUS__INIT;
    char ids[8];
    if (s->rec.lost) {
        rec.state = s->rec.expired ? "expired" : s->ep.pend ? "loading" : "placing";
        rec.lost_node = s->rec.node;
        rec.lost_stage = s->rec.stage >= 0 ? (uint32_t)s->rec.stage : 0;
        rec.lost_epoch = s->rec.lost->pl.epoch;
        rec.since_s = st_now_s() - s->rec.lost_at;
        rec.held_sequences = (uint32_t)requests_held_ids(&s->rq, s->rec.lost->cl, ids, sizeof ids);
        rec.reason = s->rec.msg;
        rec.loading_epoch = s->ep.pend ? s->ep.pend->pl.epoch : 0;
        rec.timeout_s = s->rec.timeout_s;
        out.recovery = &rec;
    }
    Strata__V1__EtcdWrites ew = STRATA__V1__ETCD_WRITES__INIT;
    leader_write_stats ws;
    if (etcd_store_write_stats(s->etcd, &ws)) { /* issue 30: a write etcd refuses or that stalls is seen here */
        ew.queued = ws.queued;
        ew.unwritten_s = ws.unwritten_s;
        ew.txns_refused = ws.refused_batches;
        ew.changes_dropped = ws.dropped_changes;
        ew.last_refusal = ws.last_refusal;
        ew.last_refusal_age_s = ws.last_refusal_age_s;
        out.etcd_writes = &ew;
    }
    ctl_reply(c, &out.base);
}

/* ---------------------------------------------------------------- authorization */

/* Every call: its handler, behind the standby check (--etcd: only the
 * leader serves; UNAVAILABLE names it) and, for an operator call, the role
 * check. */
struct ctl_guard {
    ctl_service *s;
    rpc_handler_fn fn;
    void *ud;                /* the handler's context: the part it belongs to */
    bool operator_only;
};

static void h_guarded(rpc_call *c, const rpc_request *req, void *ud) {
    struct ctl_guard *g = ud;
    char msg[600], http[256];
    node_rpc_apply(&g->s->nodes); /* every handler sees the nodes as of now */
    if (standby(g->s, msg, sizeof msg, http, sizeof http)) {
        rpc_call_finish(c, RPC_UNAVAILABLE, msg);
        return;
    }
    if (!g->operator_only || ctl_authorize(g->s->tls, c, CTL_ROLE_OPERATOR, NULL)) g->fn(c, req, g->ud);
}

/* ---------------------------------------------------------------- lifetime */

/* Register, Heartbeat and Leave check the node name themselves (authz.h);
 * every other call is an operator's, checked by h_guarded before its
 * handler. Heartbeat is answered on the rpc thread (node_rpc.h), so a burst
 * of Registers (a fleet's cold start) or a big ListNodes on the loop never
 * delays a live node's heartbeat into a false suspect. With --etcd it runs on
 * the loop behind the standby check, as an urgent method (rpc/grpc_loop.h:
 * before every queued ordinary call). Every other handler runs on the loop's
 * thread, which alone writes the registry, after applying the queued
 * heartbeats (h_guarded). */
static int add_methods(ctl_service *s, st_err *err) {
    const struct {
        const char *name;
        rpc_kind kind;
        rpc_handler_fn fn;
        void *ud;
        bool operator_only;
        const ProtobufCMessageDescriptor *req;
    } methods[] = {
        {SVC "Register", RPC_KIND_UNARY, node_rpc_register, &s->nodes, false,
         &strata__v1__register_request__descriptor},
        {SVC "Heartbeat", RPC_KIND_UNARY, node_rpc_heartbeat, &s->nodes, false,
         &strata__v1__heartbeat_request__descriptor},
        {SVC "Leave", RPC_KIND_UNARY, leave_rpc, &s->leave, false, &strata__v1__leave_request__descriptor},
        {SVC "GetStatus", RPC_KIND_UNARY, h_status, s, true, &strata__v1__get_status_request__descriptor},
        {SVC "ListNodes", RPC_KIND_UNARY, node_rpc_list, &s->nodes, true, &strata__v1__list_nodes_request__descriptor},
        {SVC "GetPlacement", RPC_KIND_UNARY, placement_rpc_get, &s->ep, true,
         &strata__v1__get_placement_request__descriptor},
        {SVC "SetPlacement", RPC_KIND_UNARY, placement_rpc_set, &s->ep, true,
         &strata__v1__set_placement_request__descriptor},
        {SVC "AutoPlacement", RPC_KIND_UNARY, placement_rpc_auto, &s->ep, true,
         &strata__v1__auto_placement_request__descriptor},
        {SVC "Drain", RPC_KIND_UNARY, placement_rpc_drain, &s->ep, true, &strata__v1__drain_request__descriptor},
        {SVC "Undrain", RPC_KIND_UNARY, placement_rpc_undrain, &s->ep, true, &strata__v1__drain_request__descriptor},
        {SVC "RemoveNode", RPC_KIND_UNARY, node_store_remove_rpc, &s->store, true,
         &strata__v1__remove_node_request__descriptor},
        {SVC "Generate", RPC_KIND_SERVER_STREAM, generate_rpc, &s->gen, true,
         &strata__v1__generate_request__descriptor},
    };
    size_t n_methods = sizeof methods / sizeof methods[0];
    if (!(s->guards = calloc(n_methods, sizeof *s->guards))) return st_errf(err, "control: out of memory");
    if (!(s->nodes.hb = hb_inbox_new())) return st_errf(err, "control: out of memory");
    for (size_t i = 0; i < n_methods; i++) {
        s->guards[i] = (struct ctl_guard){s, methods[i].fn, methods[i].ud, methods[i].operator_only};
        rpc_method m = {methods[i].name, methods[i].kind, h_guarded, &s->guards[i], methods[i].req};
        bool urgent = methods[i].fn == node_rpc_heartbeat;
        if (urgent && !s->etcd) {
            m.handler = node_rpc_heartbeat_now;
            m.ud = &s->nodes;
            if (rpc_server_add_method(s->srv, &m, err) != 0) return -1;
            continue;
        }
        if ((urgent ? rpc_loop_add_urgent_method : rpc_loop_add_method)(s->loop, s->srv, &m, err) != 0) return -1;
    }
    return 0;
}

/* The state file (not --etcd): the snapshot, then its journal. */
static int restore(ctl_service *s, st_err *err) {
    const ctl_opts *o = &s->o;
    placement *saved = &s->ep.saved;
    int lrc = state_load(o->state_path, saved, &s->ep.last_epoch, s->model.sha, &s->reg, err);
    if (lrc < 0) return -1;
    if (lrc == 0) {
        if (saved->epoch && saved->n_layers != s->model.pm.n_layers)
            return st_errf(err, "state %s: placement for %d layers, the model has %d", o->state_path,
                           saved->n_layers, s->model.pm.n_layers);
        ST_INFO("control: restored state %s: placement epoch %" PRIu64 " (%d stages), %d known node(s)",
                o->state_path, saved->epoch, saved->n_stages, s->reg.n);
    }
    return node_store_open(&s->store, err);
}

ctl_service *ctl_create(struct event_base *base, const ctl_opts *o, st_err *err) {
    ctl_service *s = calloc(1, sizeof *s);
    if (!s) return st_errf(err, "control: out of memory"), NULL;
    s->base = base;
    s->o = *o;
    if (!s->o.min_workers) s->o.min_workers = 1;
    if (!(s->o.ready_timeout_s > 0)) s->o.ready_timeout_s = 120;
    if (!(s->o.recovery_timeout_s > 0)) s->o.recovery_timeout_s = RECOVERY_TIMEOUT_S;
    s->t0 = st_now_s();
    fd_room_init(&s->fds); /* after the coordinator raised the limit (main.c) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    registry_init(&s->reg, o->heartbeat_ms, o->suspect_missed, o->dead_after_ms,
                  (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32));
    if (model_info_read(o->cfg, &s->model, err) != 0) goto fail;
    s->store = (node_store){.reg = &s->reg,
                            .ep = &s->ep,
                            .state_path = o->state_path,
                            .model_sha = s->model.sha,
                            .expiry_s = o->dead_node_expiry_s};
    if (!o->ha && restore(s, err) != 0) goto fail; /* --etcd: the state is in etcd (etcd_store.h) */
    s->tick_ev = event_new(base, -1, 0, tick, s);
    epochs_opts eo = {.base = base,
                      .cfg = o->cfg,
                      .model_file = s->model.file,
                      .pm = &s->model.pm,
                      .vocab = o->vocab,
                      .n_ctx = o->n_ctx,
                      .ready_timeout_s = s->o.ready_timeout_s,
                      .reg = &s->reg,
                      .tick = s->tick_ev,
                      .totals = &s->totals,
                      .hooks = {s, on_serving, on_save, on_move, on_lost}};
    if (!s->tick_ev) {
        st_errf(err, "control: cannot create events");
        goto fail;
    }
    if (epochs_init(&s->ep, &eo, err) != 0) goto fail;
    recovery_init(&s->rec, &s->ep, &s->rq, &s->totals, s->o.recovery_timeout_s);
    if (o->ha) {
        etcd_store_opts es = {.ha = o->ha,
                              .base = base,
                              .reg = &s->reg,
                              .saved = &s->ep.saved,
                              .last_epoch = &s->ep.last_epoch,
                              .model_sha = s->model.sha,
                              .n_layers = s->model.pm.n_layers,
                              .elected = on_elected,
                              .ud = s};
        if (!(s->etcd = etcd_store_open(&es, err))) goto fail;
        s->store.etcd = s->etcd;
        s->o.ha = NULL; /* the caller's; the leader keeps copies */
    }
    rpc_tls tls = {o->grpc_ca, o->grpc_cert, o->grpc_key};
    int tls_given = rpc_tls_given(&tls, "--grpc-", err);
    if (tls_given < 0) goto fail;
    s->tls = tls_given == 1;
    if (!(s->srv = rpc_server_create(o->grpc_listen, s->tls ? &tls : NULL, err)) ||
        !(s->loop = rpc_loop_create(base, err)))
        goto fail;
    s->nodes = (node_rpc){.tls = s->tls, .reg = &s->reg, .model = &s->model, .store = &s->store, .ep = &s->ep};
    s->leave = (leave_ctx){.tls = s->tls, .ep = &s->ep, .rq = &s->rq};
    s->gen = (gen_streams){.eng = ctl_engine(s), .vocab = o->vocab};
    if (add_methods(s, err) != 0) goto fail;
    if (rpc_server_start(s->srv, err) != 0) goto fail;
    event_active(s->tick_ev, 0, 0);
    return s;
fail:
    ctl_destroy(s);
    return NULL;
}

int ctl_grpc_port(const ctl_service *s) { return rpc_server_port(s->srv); }

void ctl_destroy(ctl_service *s) {
    if (!s) return;
    etcd_store_close(s->etcd); /* resign first: a standby takes over while we stop */
    s->etcd = s->store.etcd = NULL;
    if (s->loop) rpc_loop_close(s->loop);
    generate_close_all(&s->gen);
    rpc_server_destroy(s->srv);
    rpc_loop_destroy(s->loop);
    hb_inbox_free(s->nodes.hb); /* after the rpc thread: it fills the inbox */
    requests_free(&s->rq);
    epochs_free(&s->ep);
    if (s->tick_ev) event_free(s->tick_ev);
    node_store_close(&s->store);
    registry_free(&s->reg);
    free(s->guards);
    free(s);
}
