/* assignment.c — one stage's assignment lifecycle, on the event loop:
 * StageAssign checked and loaded on the compute thread -> StageReady, the
 * stage's states, its StageStats, its next-hop connection and its end. The
 * worker (worker.c) picks the stage and routes the CONTROL messages. See
 * assignment.h, docs/worker.md ("Lifecycle") and docs/protocol.md. */
#include "daemon/assignment.h"

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/act_link.h"
#include "daemon/act_p2p.h"
#include "daemon/datapath.h"
#include "daemon/control_send.h"
#include "daemon/hostport.h"
#include "daemon/stage_buffers.h"

struct open_job {
    cjob cj;
    uint64_t gen;
    char *model_path; /* owned; cj.params.model_path points here */
    int fd;           /* the model file (cj.params.model_fd), owned */
    atomic_bool cancel; /* cj.params.cancel: a newer assignment or shutdown */
};

static void open_job_free(struct open_job *oj)
{
    if (!oj) return;
    if (oj->fd >= 0) close(oj->fd);
    free(oj->model_path);
    free(oj);
}

static void assign_clear(struct assign *a)
{
    free(a->model_path);
    free(a->next_hop);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------- replies */

/* A CONTROL message to peer, tagged with st's stage. */
static int send_ctl(wstage *w, xport_peer *peer, const ctl_msg *m, uint64_t epoch)
{
    return control_send(peer, m, epoch, w->cur.stage, 0, "CONTROL reply");
}

static void reply_ready(wstage *w, xport_peer *peer, uint64_t epoch, uint32_t stage, const char *error)
{
    Strata__V1__StageReady r = STRATA__V1__STAGE_READY__INIT;
    r.epoch = epoch;
    r.stage = stage;
    r.ok = error == NULL;
    r.error = (char *)(error ? error : "");
    r.worker_name = w->name;
    if (!error) {
        r.kv_blocks = w->info.kv_blocks;
        r.block_size = w->info.block_size;
        r.weight_bytes = w->info.weight_bytes;
        r.buf_bytes = w->info.buf_bytes;
        r.n_embd = w->info.n_embd;
        r.n_vocab = w->info.n_vocab;
        r.n_layer = w->info.n_layer;
        r.load_seconds = w->info.load_seconds;
    }
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_READY;
    m.ready = &r;
    if (!peer) {
        ST_WARN("worker: no coordinator connected for StageReady (epoch %llu)", (unsigned long long)epoch);
        return;
    }
    send_ctl(w, peer, &m, epoch);
}

void assignment_send_stats(wstage *w, xport_peer *peer, const Strata__V1__StatsRequest *req)
{
    uint64_t request_id = req->request_id;
    compute_stats cs;
    compute_get_stats(w->cq, &cs);
    xport_stats xs;
    xport_get_stats(w->x, &xs);
    Strata__V1__StageStats s = STRATA__V1__STAGE_STATS__INIT;
    Strata__V1__RankStats rs[COMPUTE_MAX_RANKS], *rp[COMPUTE_MAX_RANKS];
    s.request_id = request_id;
    s.epoch = w->cur.epoch;
    s.stage = w->cur.stage;
    s.loaded = w->state == W_READY;
    s.busy_seconds = cs.busy_seconds;
    s.uptime_seconds = st_now_s() - w->t_start;
    s.forwards = cs.forwards;
    s.tokens = cs.tokens;
    s.frames_sent = xs.frames_sent;
    s.frames_recv = xs.frames_recv;
    s.bytes_sent = xs.bytes_sent;
    s.bytes_recv = xs.bytes_recv;
    s.bad_frames = xs.bad_frames;
    s.dropped_frames = w->counters->dropped_frames;
    s.fenced_frames = w->counters->fenced_frames;
    s.unauth_frames = xs.unauth_frames;
    s.auth_failures = xs.auth_failures;
    s.refused_assigns = w->counters->refused_assigns;
    s.hops = w->counters->hops;
    s.hop_seconds = w->counters->hop_seconds;
    s.batch_errors = w->counters->batch_errors;
    s.queue_depth = cs.queued > 0 ? (uint32_t)cs.queued : 0;
    s.worker_name = w->name;
    for (int r = 0; r < cs.n_ranks; r++) {
        strata__v1__rank_stats__init(&rs[r]);
        rs[r].all_reduce_calls = cs.ranks[r].all_reduce_calls;
        rs[r].all_gather_calls = cs.ranks[r].all_gather_calls;
        rs[r].comm_seconds = cs.ranks[r].comm_seconds;
        rs[r].busy_seconds = cs.ranks[r].busy_seconds;
        rs[r].weight_bytes = cs.ranks[r].weight_bytes;
        rs[r].buf_bytes = cs.ranks[r].buf_bytes;
        rp[r] = &rs[r];
    }
    s.ranks = rp;
    s.n_ranks = (size_t)cs.n_ranks;
    uint64_t *fwd = NULL;
    if (req->forward_intervals) {
        fwd = malloc(2 * FWD_REPLY_MAX * sizeof *fwd);
        if (fwd) {
            s.forward_ns = fwd;
            s.n_forward_ns = datapath_forward_intervals(w, req->forward_since_ns, fwd);
        } else {
            ST_WARN("worker: out of memory for the forward intervals; StageStats without them");
        }
    }
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_STATS;
    m.stats = &s;
    send_ctl(w, peer, &m, w->cur.epoch);
    free(fwd);
}

/* ---------------------------------------------------------------- next hop */

/* Arms the reconnect timer after the back-off, and doubles it. */
static void retry_next_later(wstage *w)
{
    struct timeval tv = {(time_t)w->backoff, (suseconds_t)((w->backoff - (time_t)w->backoff) * 1e6)};
    evtimer_add(w->reconnect_ev, &tv);
    w->backoff = w->backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : w->backoff * 2;
}

static void connect_next(wstage *w)
{
    if (w->next || w->state != W_READY || !w->cur.next_hop || !*w->cur.next_hop || w->shutting_down) return;
    st_err err;
    w->next = xport_connect(w->x, w->cur.next_host, w->cur.next_port, &err);
    if (!w->next) {
        ST_WARN("worker: next hop %s: %s; retrying in %.1f s", w->cur.next_hop, err.msg, w->backoff);
        retry_next_later(w);
        return;
    }
    xport_peer_set_user(w->next, w);
    ST_INFO("worker: connecting to next hop %s (stage %u)", w->cur.next_hop, w->cur.stage + 1);
    act_link_offer(w); /* the boundary's transport (queued behind the handshake) */
}

static void on_reconnect(evutil_socket_t fd, short what, void *arg)
{
    connect_next(arg);
}

static void drop_next(wstage *w)
{
    evtimer_del(w->reconnect_ev);
    w->backoff = BACKOFF_MIN_S;
    if (w->next) {
        xport_peer *p = w->next;
        w->next = NULL;
        xport_peer_close(p);
    }
}

/* ---------------------------------------------------------------- CONTROL */

static int check_assign(const ctl_assign *a, struct assign *out, st_err *err)
{
    memset(out, 0, sizeof *out);
    if (a->n_stages < 1) return st_errf(err, "StageAssign: n_stages must be >= 1");
    if (a->stage >= a->n_stages) return st_errf(err, "StageAssign: stage %u not in [0, %u)", a->stage, a->n_stages);
    if (!a->model_path || !*a->model_path) return st_errf(err, "StageAssign: no model path");
    if (a->first_layer < 0 || a->last_layer <= a->first_layer)
        return st_errf(err, "StageAssign: bad layer range [%d, %d)", a->first_layer, a->last_layer);
    if ((a->stage == 0) != (a->first_layer == 0))
        return st_errf(err, "StageAssign: stage %u with first layer %d (stage 0, and only it, starts at layer 0)",
                       a->stage, a->first_layer);
    if (a->tp < 1 || a->tp > COMPUTE_MAX_RANKS) return st_errf(err, "StageAssign: tp %d not in [1, %d]", a->tp, COMPUTE_MAX_RANKS);
    if (a->kv_blocks < 1) return st_errf(err, "StageAssign: kv_blocks must be >= 1");
    if (a->block_size < 0) return st_errf(err, "StageAssign: block_size must be >= 0");
    if (a->n_threads < 0) return st_errf(err, "StageAssign: n_threads must be >= 0");
    int dt = a->act_dtype == STRATA__V1__DTYPE__DTYPE_UNSPECIFIED ? STRATA__V1__DTYPE__DTYPE_F32 : (int)a->act_dtype;
    if (dt != STRATA__V1__DTYPE__DTYPE_F32 && dt != STRATA__V1__DTYPE__DTYPE_BF16)
        return st_errf(err, "StageAssign: act_dtype %d is not f32 or bf16", (int)a->act_dtype);
    const char *be = a->backend ? a->backend : "";
    if (*be && strcmp(be, "cpu") && strcmp(be, "cuda"))
        return st_errf(err, "StageAssign: backend '%.32s' is not cpu or cuda", be);
    if (a->n_devices && (!strcmp(be, "cpu") || !*be))
        return st_errf(err, "StageAssign: backend cpu takes no device list");
    if (a->n_devices && a->n_devices != (size_t)a->tp)
        return st_errf(err, "StageAssign: %zu devices for tp %d (one per rank)", a->n_devices, a->tp);
    for (size_t i = 0; i < a->n_devices; i++) {
        if (a->devices[i] < 0 || a->devices[i] >= 1024)
            return st_errf(err, "StageAssign: device %d out of range", a->devices[i]);
        out->devices[i] = a->devices[i];
    }
    out->n_devices = (int)a->n_devices;
    snprintf(out->backend, sizeof out->backend, "%s", be);
    bool last = a->stage == a->n_stages - 1;
    const char *nh = a->next_hop ? a->next_hop : "";
    if (last && *nh) return st_errf(err, "StageAssign: the last stage has no next hop (got '%s')", nh);
    if (!last && !*nh) return st_errf(err, "StageAssign: stage %u of %u needs a next hop", a->stage, a->n_stages);
    if (!last && hostport_parse(nh, out->next_host, sizeof out->next_host, &out->next_port, 0, err))
        return st_err_prefix(err, "StageAssign: next_hop");
    out->epoch = a->epoch;
    out->stage = a->stage;
    out->n_stages = a->n_stages;
    out->first_layer = a->first_layer;
    out->last_layer = a->last_layer;
    out->tp = a->tp;
    out->kv_blocks = a->kv_blocks;
    out->block_size = a->block_size;
    out->n_threads = a->n_threads;
    out->act_dtype = dt;
    out->model_path = strdup(a->model_path);
    out->next_hop = strdup(nh);
    if (!out->model_path || !out->next_hop) {
        assign_clear(out);
        return st_errf(err, "StageAssign: out of memory");
    }
    return 0;
}

/* The same backend on the same devices ("" and "cpu" are one). */
static bool same_devices(const struct assign *a, const struct assign *b)
{
    const char *ba = *a->backend ? a->backend : "cpu", *bb = *b->backend ? b->backend : "cpu";
    return !strcmp(ba, bb) && a->n_devices == b->n_devices &&
           !memcmp(a->devices, b->devices, (size_t)a->n_devices * sizeof a->devices[0]);
}

static bool same_assign(const struct assign *a, const struct assign *b)
{
    return a->epoch == b->epoch && a->stage == b->stage && a->n_stages == b->n_stages &&
           a->first_layer == b->first_layer && a->last_layer == b->last_layer && a->tp == b->tp &&
           a->kv_blocks == b->kv_blocks && a->block_size == b->block_size && a->n_threads == b->n_threads &&
           a->act_dtype == b->act_dtype && !strcmp(a->model_path, b->model_path) && !strcmp(a->next_hop, b->next_hop) &&
           same_devices(a, b);
}

/* Whether stage a, loaded, serves assignment b as is (all but the epoch, the
 * stage index, the next hop and the activation type are the same). */
static bool same_stage(const struct assign *a, const struct assign *b)
{
    return a->first_layer == b->first_layer && a->last_layer == b->last_layer && a->tp == b->tp &&
           a->kv_blocks == b->kv_blocks && a->block_size == b->block_size && a->n_threads == b->n_threads &&
           (a->stage == a->n_stages - 1) == (b->stage == b->n_stages - 1) && !strcmp(a->model_path, b->model_path) &&
           same_devices(a, b);
}

bool assignment_adoptable(const wstage *x, const ctl_assign *a)
{
    struct assign na;
    st_err err;
    if (!x || x->state != W_READY || check_assign(a, &na, &err)) return false;
    bool same = same_stage(&x->cur, &na); /* model_path as assigned: a name under --model-dir */
    assign_clear(&na);
    return same;
}

void assignment_take(wstage *w, xport_peer *peer, const ctl_assign *a, const model_files *mf, uint64_t *max_epoch)
{
    struct assign na;
    st_err err;
    if (check_assign(a, &na, &err)) {
        ST_WARN("worker: refusing assignment from %s: %s", xport_peer_name(peer), err.msg);
        reply_ready(w, peer, a->epoch, a->stage, err.msg);
        return;
    }
    if (w->state == W_LOADING && same_assign(&w->cur, &na)) { /* repeated while loading: answer when done */
        ST_INFO("worker: assignment epoch %llu stage %u repeated by %s while loading it", (unsigned long long)na.epoch,
                na.stage, xport_peer_name(peer));
        assign_clear(&na);
        w->coord = peer;
        return;
    }
    /* The model file is opened (confined to the model directory) before
     * anything changes: a refused path leaves the stage as it was. */
    int fd = model_files_open(mf, na.model_path, &err);
    if (fd < 0) {
        ST_WARN("worker: refusing assignment epoch %llu stage %u from %s: %s", (unsigned long long)na.epoch, na.stage,
                xport_peer_name(peer), err.msg);
        w->counters->refused_assigns++;
        reply_ready(w, peer, na.epoch, na.stage, err.msg);
        assign_clear(&na);
        return;
    }
    if (a->adopt_epoch && w->state == W_READY && w->cur.epoch == a->adopt_epoch && same_stage(&w->cur, &na)) {
        /* A recovery: the lost epoch's stage serves the new one as it is.
         * Its batches still queued run first (one compute queue) with their
         * old epoch; their results are fenced wherever they arrive. */
        ST_INFO("worker: epoch %llu stage %u/%u adopts the loaded stage of lost epoch %llu (layers [%d, %d)); "
                "nothing loads; next %s",
                (unsigned long long)na.epoch, na.stage, na.n_stages, (unsigned long long)w->cur.epoch,
                na.first_layer, na.last_layer, *na.next_hop ? na.next_hop : "(coordinator)");
        close(fd);
        if (na.epoch > *max_epoch) *max_epoch = na.epoch;
        drop_next(w);
        assign_clear(&w->cur);
        w->cur = na;
        w->coord = peer;
        st_log_set_stage((int)na.stage);
        connect_next(w);
        act_link_assigned(w);
        reply_ready(w, peer, w->cur.epoch, w->cur.stage, NULL);
        return;
    }
    if (na.epoch > *max_epoch) *max_epoch = na.epoch;
    if (w->state == W_READY && same_assign(&w->cur, &na)) { /* idempotent: a (re)connected coordinator */
        close(fd);
        ST_INFO("worker: assignment epoch %llu stage %u repeated by %s; already loaded",
                (unsigned long long)na.epoch, na.stage, xport_peer_name(peer));
        assign_clear(&na);
        w->coord = peer;
        if (!w->next) {
            evtimer_del(w->reconnect_ev);
            connect_next(w);
        }
        reply_ready(w, peer, w->cur.epoch, w->cur.stage, NULL);
        return;
    }
    struct open_job *oj = calloc(1, sizeof *oj);
    char *path = oj ? strdup(na.model_path) : NULL;
    if (!oj || !path) {
        free(oj);
        close(fd);
        reply_ready(w, peer, na.epoch, na.stage, "worker: out of memory");
        assign_clear(&na);
        return;
    }
    if (w->loading) { /* a newer assignment replaces the one still loading: abandon that load */
        ST_INFO("worker: cancelling the load of epoch %llu stage %u for the new assignment",
                (unsigned long long)w->cur.epoch, w->cur.stage);
        atomic_store(&w->loading->cancel, true);
    }
    drop_next(w);
    act_link_reset(w); /* the old stage's NCCL links close before the new stage opens */
    assign_clear(&w->cur);
    w->cur = na;
    w->coord = peer;
    w->state = W_LOADING;
    w->gen++;
    memset(&w->info, 0, sizeof w->info);
    oj->gen = w->gen;
    oj->model_path = path;
    oj->fd = fd;
    atomic_init(&oj->cancel, false);
    w->loading = oj;
    oj->cj.kind = CJOB_OPEN;
    oj->cj.user = oj;
    oj->cj.params = (stage_params){.model_path = path,
                                   .first_layer = na.first_layer,
                                   .last_layer = na.last_layer,
                                   .tp = na.tp,
                                   .n_threads = na.n_threads ? na.n_threads : w->n_threads,
                                   .kv_blocks = na.kv_blocks,
                                   .block_size = na.block_size,
                                   .backend = !strcmp(na.backend, "cuda") ? "cuda" : NULL, /* a literal: outlives w->cur */
                                   .n_devices = na.n_devices,
                                   .use_model_fd = true,
                                   .model_fd = fd,
                                   .cancel = &oj->cancel};
    memcpy(oj->cj.params.devices, na.devices, (size_t)na.n_devices * sizeof na.devices[0]);
    st_log_set_stage((int)na.stage); /* STRATA_STAGE on this worker's journald records */
    ST_INFO("worker: assigned epoch %llu stage %u/%u: %s layers [%d, %d) tp %d kv_blocks %d act %s next %s backend %s",
            (unsigned long long)na.epoch, na.stage, na.n_stages, na.model_path, na.first_layer, na.last_layer,
            na.tp, na.kv_blocks, datapath_dtype_name(na.act_dtype), *na.next_hop ? na.next_hop : "(coordinator)",
            *na.backend ? na.backend : "cpu");
    compute_submit(w->cq, &oj->cj);
    act_link_assigned(w); /* an offer that came before this assignment */
}

static void open_done(wstage *w, struct open_job *oj)
{
    if (w->loading == oj) w->loading = NULL;
    if (oj->gen != w->gen || w->shutting_down) {
        if (oj->cj.status) ST_INFO("worker: superseded load of %s ended: %s", oj->model_path, oj->cj.err.msg);
        goto out;
    }
    if (oj->cj.status) {
        w->state = W_FAILED;
        ST_ERROR("worker: loading stage %u (epoch %llu) failed: %s", w->cur.stage,
                 (unsigned long long)w->cur.epoch, oj->cj.err.msg);
        reply_ready(w, w->coord, w->cur.epoch, w->cur.stage, oj->cj.err.msg);
        goto out;
    }
    const cjob_stage_info *in = &oj->cj.info;
    bool want_last = w->cur.stage == w->cur.n_stages - 1;
    if (in->is_last != want_last) {
        char msg[200];
        snprintf(msg, sizeof msg, "stage %u of %u ends at layer %d but the model has %d layers", w->cur.stage,
                 w->cur.n_stages, w->cur.last_layer, in->n_layer);
        w->state = W_FAILED;
        ST_ERROR("worker: %s", msg);
        reply_ready(w, w->coord, w->cur.epoch, w->cur.stage, msg);
        goto out;
    }
    w->info = *in;
    w->state = W_READY;
    w->backoff = BACKOFF_MIN_S;
    ST_INFO("worker: stage %u ready in %.2f s: %llu weight bytes, %d KV blocks of %d, n_embd %d",
            w->cur.stage, in->load_seconds, (unsigned long long)in->weight_bytes, in->kv_blocks,
            in->block_size, in->n_embd);
    connect_next(w);
    reply_ready(w, w->coord, w->cur.epoch, w->cur.stage, NULL);
out:
    open_job_free(oj);
}

/* ---------------------------------------------------------------- stages by epoch */

/* A stage's compute thread finished jobs: a load (OPEN) or a forward. */
static void on_compute(evutil_socket_t fd, short what, void *arg)
{
    wstage *w = arg;
    cjob *list = compute_take_done(w->cq);
    while (list) {
        cjob *cj = list;
        list = cj->next;
        if (cj->kind == CJOB_OPEN)
            open_done(w, cj->user);
        else if (cj->kind == CJOB_FORWARD)
            datapath_forward_finished(w, cj);
        else if (cj->kind == CJOB_P2P_SEND)
            datapath_p2p_sent(w, cj);
        else
            act_link_job_done(w, cj);
    }
}

wstage *stage_new(const wstage_env *env, st_err *err)
{
    wstage *st = calloc(1, sizeof *st);
    if (!st) return st_errf(err, "worker: out of memory"), NULL;
    st->base = env->base;
    st->x = env->x;
    snprintf(st->name, sizeof st->name, "%s", env->name);
    st->n_threads = env->n_threads;
    st->t_start = env->t_start;
    st->counters = env->counters;
    st->timing = env->timing;
    st->act = env->act;
    st->dev_host_mem = env->act->test_host_dev;
    st->backoff = BACKOFF_MIN_S;
    st->act_out = st->act_in = -1;
    st->cq = compute_create(err);
    if (!st->cq) {
        free(st);
        return NULL;
    }
    st->cq_ev = event_new(env->base, compute_fd(st->cq), EV_READ | EV_PERSIST, on_compute, st);
    st->reconnect_ev = evtimer_new(env->base, on_reconnect, st);
    if (!st->cq_ev || !st->reconnect_ev || event_add(st->cq_ev, NULL)) {
        st_errf(err, "worker: cannot create events");
        if (st->cq_ev) event_free(st->cq_ev);
        if (st->reconnect_ev) event_free(st->reconnect_ev);
        compute_stop(st->cq);
        compute_free(st->cq);
        free(st);
        return NULL;
    }
    return st;
}

void stage_stop(wstage *st)
{
    st->shutting_down = true;
    if (st->loading) atomic_store(&st->loading->cancel, true); /* a load in progress ends at its next tensor */
    st->loading = NULL;
    if (!st->cq) return;
    compute_stop(st->cq);
    cjob *list = compute_take_done(st->cq);
    while (list) {
        cjob *cj = list;
        list = cj->next;
        if (cj->kind == CJOB_OPEN) {
            open_job_free(cj->user);
        } else if (cj->kind == CJOB_P2P_OPEN || cj->kind == CJOB_P2P_CLOSE) {
            act_p2p_discard(cj); /* a CLOSE that never ran closes its link here (an OPEN owns none) */
            free(cj);
        } else {
            datapath_job_discard(st, cj); /* FORWARD and P2P_SEND: the datapath's job */
        }
    }
    compute_free(st->cq);
    st->cq = NULL;
    if (st->cq_ev) event_free(st->cq_ev);
    if (st->reconnect_ev) event_free(st->reconnect_ev);
    st->cq_ev = st->reconnect_ev = NULL;
}

void stage_free(wstage *st)
{
    act_link_free(st);
    stage_buffers_drain(st);
    assign_clear(&st->cur);
    free(st);
}

/* Ends st's service: the next hop dropped, the boundaries' links closed,
 * the compute thread stopped and the free buffers unregistered. */
void stage_retire(wstage *st)
{
    drop_next(st);
    act_link_reset(st);
    stage_stop(st);
    stage_buffers_drain(st);
}

/* ---------------------------------------------------------------- next hop lost */

void stage_on_disconnect(wstage *w, xport_peer *peer, const char *reason)
{
    if (peer == w->coord) {
        w->coord = NULL;
        ST_WARN("worker: coordinator %s disconnected (%s); keeping the stage", xport_peer_name(peer), reason);
    }
    if (peer == w->next) {
        w->next = NULL;
        act_link_next_lost(w);
        if (w->shutting_down) return;
        ST_WARN("worker: next hop %s lost (%s); reconnecting in %.1f s", xport_peer_name(peer), reason, w->backoff);
        retry_next_later(w);
    }
}
