/* assignment.c — strata-worker's assignment lifecycle, on the event loop:
 * CONTROL from the coordinator (StageAssign -> load on the compute thread ->
 * StageReady; StageRelease; StatsRequest -> StageStats), the stages held by
 * epoch and their states, and each ready stage's next-hop connection. See
 * assignment.h, docs/worker.md ("Lifecycle") and docs/protocol.md. */
#include "daemon/assignment.h"

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/act_link.h"
#include "daemon/act_p2p.h"
#include "daemon/datapath.h"
#include "daemon/model_path.h"
#include "ib/assign_token.h"

typedef Strata__V1__StageAssign ctl_assign;

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

int stage_send_control(wstage *w, xport_peer *peer, const ctl_msg *m, uint64_t epoch, uint64_t batch_id)
{
    if (!peer) return -1;
    size_t n = strata__v1__control_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        ST_ERROR("worker: out of memory for a CONTROL reply");
        return -1;
    }
    strata__v1__control_message__pack(m, buf);
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    h.batch_id = batch_id;
    h.epoch = epoch;
    h.stage = w->cur.stage;
    h.control.data = buf;
    h.control.len = n;
    st_err err;
    int rc = xport_send(peer, &h, NULL, 0, NULL, NULL, NULL, &err);
    free(buf);
    if (rc) ST_WARN("worker: CONTROL reply to %s failed: %s", xport_peer_name(peer), err.msg);
    return rc;
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
    stage_send_control(w, peer, &m, epoch, 0);
}

static void send_stats(wstage *w, xport_peer *peer, const Strata__V1__StatsRequest *req)
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
    s.dropped_frames = w->front->dropped_frames;
    s.fenced_frames = w->front->fenced_frames;
    s.unauth_frames = xs.unauth_frames;
    s.auth_failures = xs.auth_failures;
    s.refused_assigns = w->front->refused_assigns;
    s.hops = w->front->hops;
    s.hop_seconds = w->front->hop_seconds;
    s.batch_errors = w->front->batch_errors;
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
    stage_send_control(w, peer, &m, w->cur.epoch, 0);
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

/* Opens StageAssign.model_path confined to the worker's model directory
 * (daemon/model_path.h): a bare file name that one of the --model files has
 * is that file (in its own directory); anything else is looked up under
 * --model-dir. The descriptor, or -1 + err. */
static int model_resolve(worker *w, const char *name, st_err *err)
{
    if (model_name_check(name, err)) return -1;
    if (!strchr(name, '/'))
        for (int i = 0; i < w->n_models; i++) {
            const char *slash = strrchr(w->models[i], '/');
            const char *base = slash ? slash + 1 : w->models[i];
            if (strcmp(base, name)) continue;
            char dir[4096];
            if (slash)
                snprintf(dir, sizeof dir, "%.*s", (int)(slash - w->models[i]) ? (int)(slash - w->models[i]) : 1,
                         w->models[i]);
            else
                snprintf(dir, sizeof dir, ".");
            int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd < 0) return st_errf(err, "model path '%s': cannot open the directory of --model %s", name, w->models[i]);
            int fd = model_path_open(dfd, name, err);
            close(dfd);
            return fd;
        }
    return model_path_open(w->model_dirfd, name, err);
}

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
    if (!last && worker_parse_hostport(nh, out->next_host, sizeof out->next_host, &out->next_port, 0, err))
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

static void handle_assign(wstage *w, xport_peer *peer, const ctl_assign *a)
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
    int fd = model_resolve(w->front, na.model_path, &err);
    if (fd < 0) {
        ST_WARN("worker: refusing assignment epoch %llu stage %u from %s: %s", (unsigned long long)na.epoch, na.stage,
                xport_peer_name(peer), err.msg);
        w->front->refused_assigns++;
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
        if (na.epoch > w->front->max_epoch) w->front->max_epoch = na.epoch;
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
    if (na.epoch > w->front->max_epoch) w->front->max_epoch = na.epoch;
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
            na.tp, na.kv_blocks, worker_dtype_name(na.act_dtype), *na.next_hop ? na.next_hop : "(coordinator)",
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

wstage *stage_new(worker *w, st_err *err)
{
    wstage *st = calloc(1, sizeof *st);
    if (!st) return st_errf(err, "worker: out of memory"), NULL;
    st->front = w;
    st->base = w->base;
    st->x = w->x;
    snprintf(st->name, sizeof st->name, "%s", w->name);
    st->n_threads = w->n_threads;
    st->t_start = w->t_start;
    st->backoff = BACKOFF_MIN_S;
    st->act_out = st->act_in = -1;
    st->cq = compute_create(err);
    if (!st->cq) {
        free(st);
        return NULL;
    }
    st->cq_ev = event_new(w->base, compute_fd(st->cq), EV_READ | EV_PERSIST, on_compute, st);
    st->reconnect_ev = evtimer_new(w->base, on_reconnect, st);
    if (!st->cq_ev || !st->reconnect_ev || event_add(st->cq_ev, NULL)) {
        st_errf(err, "worker: cannot create events");
        if (st->cq_ev) event_free(st->cq_ev);
        if (st->reconnect_ev) event_free(st->reconnect_ev);
        compute_stop(st->cq);
        compute_free(st->cq);
        free(st);
        return NULL;
    }
    st->link = w->stages;
    w->stages = st;
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
    datapath_pool_drain(st);
    assign_clear(&st->cur);
    free(st);
}

/* Moves st from the live list to the released one (stopped). */
static void stage_release(worker *w, wstage *st)
{
    for (wstage **pp = &w->stages; *pp; pp = &(*pp)->link)
        if (*pp == st) {
            *pp = st->link;
            break;
        }
    drop_next(st);
    act_link_reset(st);
    stage_stop(st);
    datapath_pool_drain(st);
    st->link = w->released;
    w->released = st;
}

wstage *stage_by_epoch(worker *w, uint64_t epoch)
{
    for (wstage *st = w->stages; st; st = st->link)
        if (st->state != W_IDLE && st->cur.epoch == epoch) return st;
    return NULL;
}

/* Answers a refused StageAssign with StageReady{ok = false, error = why}:
 * nothing of the worker's state was touched. */
static void refuse_assign(worker *w, xport_peer *peer, const ctl_assign *a, const char *why)
{
    w->refused_assigns++;
    ST_WARN("worker: refusing the assignment (epoch %llu, stage %u) from %s: %s", (unsigned long long)a->epoch,
            a->stage, xport_peer_name(peer), why);
    Strata__V1__StageReady r = STRATA__V1__STAGE_READY__INIT;
    r.epoch = a->epoch;
    r.stage = a->stage;
    r.error = (char *)why;
    r.worker_name = w->name;
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_READY;
    m.ready = &r;
    size_t n = strata__v1__control_message__get_packed_size(&m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return;
    strata__v1__control_message__pack(&m, buf);
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    h.epoch = a->epoch;
    h.stage = a->stage;
    h.control.data = buf;
    h.control.len = n;
    st_err err;
    if (xport_send(peer, &h, NULL, 0, NULL, NULL, NULL, &err))
        ST_WARN("worker: StageReady to %s failed: %s", xport_peer_name(peer), err.msg);
    free(buf);
}

/* With a cluster key: the assignment carries the coordinator's token and is
 * not older than the newest one accepted. (The sender was checked to be the
 * authenticated coordinator by the caller.) */
static bool assign_allowed(worker *w, xport_peer *peer, const ctl_assign *a)
{
    if (!w->key) return true;
    char why[200];
    if (!assign_token_ok(w->key, a)) {
        refuse_assign(w, peer, a, "StageAssign: the token does not verify under this worker's cluster key");
        return false;
    }
    if (a->epoch < w->max_epoch) {
        snprintf(why, sizeof why, "StageAssign: epoch %llu is older than epoch %llu, already accepted (stale)",
                 (unsigned long long)a->epoch, (unsigned long long)w->max_epoch);
        refuse_assign(w, peer, a, why);
        return false;
    }
    return true;
}

static void handle_assign_front(worker *w, xport_peer *peer, const ctl_assign *a)
{
    if (!assign_allowed(w, peer, a)) return;
    wstage *st = stage_by_epoch(w, a->epoch);
    st_err err;
    if (!st && a->adopt_epoch) { /* a recovery: handle_assign re-uses that stage when it is the same */
        wstage *x = stage_by_epoch(w, a->adopt_epoch);
        struct assign na;
        if (x && x->state == W_READY && !check_assign(a, &na, &err)) {
            if (same_stage(&x->cur, &na)) st = x; /* model_path as assigned: a name under --model-dir */
            assign_clear(&na);
        }
    }
    if (!st && a->keep_loaded)
        for (wstage *x = w->stages; x && !st; x = x->link)
            if (x->state == W_IDLE || x->state == W_FAILED) st = x; /* nothing loaded there: reuse */
    if (!st && a->keep_loaded) {
        int n = 0;
        for (wstage *x = w->stages; x; x = x->link) n++;
        while (n >= MAX_STAGES) { /* drop the oldest */
            wstage *old = w->stages;
            while (old->link) old = old->link;
            ST_WARN("worker: %d stages held; dropping epoch %llu", n, (unsigned long long)old->cur.epoch);
            stage_release(w, old);
            n--;
        }
        st = stage_new(w, &err);
    } else if (!st) {
        /* static mode: the new assignment replaces everything (one stage) */
        while (w->stages && w->stages->link) {
            wstage *old = w->stages;
            while (old->link) old = old->link;
            stage_release(w, old);
        }
        st = w->stages ? w->stages : stage_new(w, &err);
    }
    if (!st) {
        ST_ERROR("worker: cannot take the assignment of epoch %llu: %s", (unsigned long long)a->epoch, err.msg);
        return;
    }
    handle_assign(st, peer, a);
}

static void handle_release(worker *w, uint64_t epoch)
{
    wstage *st = stage_by_epoch(w, epoch);
    if (!st) {
        ST_INFO("worker: StageRelease for epoch %llu, which is not loaded; ignored", (unsigned long long)epoch);
        return;
    }
    ST_INFO("worker: releasing the stage of epoch %llu (stage %u, layers [%d, %d))", (unsigned long long)epoch,
            st->cur.stage, st->cur.first_layer, st->cur.last_layer);
    stage_release(w, st);
}

int worker_release_stale(worker *w, uint64_t serving_epoch)
{
    int n = 0;
    wstage *next;
    for (wstage *st = w->stages; st; st = next) {
        next = st->link;
        /* Only a stage nothing can reach any more: an older epoch, and no
         * coordinator connection (a recovery or a placement change adopts
         * loaded weights only through a new StageAssign over a live
         * connection, before its epoch serves; a re-attaching coordinator
         * serves the same epoch, not a newer one). */
        if (st->state == W_IDLE || !st->cur.epoch || st->cur.epoch >= serving_epoch || st->coord) continue;
        ST_INFO("worker: releasing the stage of epoch %llu (stage %u, layers [%d, %d)): the coordinator serves "
                "epoch %llu and the stage's connection is gone",
                (unsigned long long)st->cur.epoch, st->cur.stage, st->cur.first_layer, st->cur.last_layer,
                (unsigned long long)serving_epoch);
        stage_release(w, st);
        n++;
    }
    return n;
}

/* The stage that answers StatsRequest from peer: the one it assigned, else the newest. */
static wstage *stage_for_peer(worker *w, xport_peer *peer)
{
    for (wstage *st = w->stages; st; st = st->link)
        if (st->coord == peer) return st;
    return w->stages;
}

void assignment_handle_control(worker *w, xport_peer *peer, const frame_header *h)
{
    ctl_msg *m = strata__v1__control_message__unpack(NULL, h->control.len, h->control.data);
    if (!m) {
        worker_drop_frame(w, peer, "undecodable CONTROL message (%zu bytes)", h->control.len);
        return;
    }
    /* Neighbouring stages negotiate their boundary's transport (act_link.h):
     * with a key, only from a peer that proved the stage role. */
    const bool act = m->msg_case == STRATA__V1__CONTROL_MESSAGE__MSG_ACT_OFFER ||
                     m->msg_case == STRATA__V1__CONTROL_MESSAGE__MSG_ACT_ANSWER;
    if (w->key && act && xport_peer_role(peer) != XPORT_ROLE_STAGE) {
        w->dropped_frames++;
        ST_WARN("worker: refusing CONTROL message %d from %s: it is a %s, not a stage", (int)m->msg_case,
                xport_peer_name(peer), xport_role_name(xport_peer_role(peer)));
        strata__v1__control_message__free_unpacked(m, NULL);
        return;
    }
    if (w->key && !act && xport_peer_role(peer) != XPORT_ROLE_COORDINATOR &&
        m->msg_case != STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST) {
        /* Only the authenticated coordinator steers the worker; a stage peer's
         * CONTROL is refused and changes nothing. */
        w->refused_assigns++;
        w->dropped_frames++;
        ST_WARN("worker: refusing CONTROL message %d from %s: it is a %s, not the coordinator", (int)m->msg_case,
                xport_peer_name(peer), xport_role_name(xport_peer_role(peer)));
        strata__v1__control_message__free_unpacked(m, NULL);
        return;
    }
    switch (m->msg_case) {
    case STRATA__V1__CONTROL_MESSAGE__MSG_ASSIGN: handle_assign_front(w, peer, m->assign); break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_RELEASE: handle_release(w, m->release->epoch); break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_ACT_OFFER: act_link_on_offer(w, peer, m->act_offer); break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_ACT_ANSWER: act_link_on_answer(w, peer, m->act_answer); break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST: {
        wstage *st = stage_for_peer(w, peer);
        if (!st) st = stage_new(w, &(st_err){{0}});
        if (st) send_stats(st, peer, m->stats_request);
        break;
    }
    default: worker_drop_frame(w, peer, "CONTROL message %d is not for a worker", (int)m->msg_case); break;
    }
    strata__v1__control_message__free_unpacked(m, NULL);
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
