/* worker.c — strata-worker's front, on the event loop: the transport's
 * callbacks; the stages held, by epoch (which one takes a StageAssign,
 * StageRelease, a stale stage's release); each frame routed by kind (CONTROL
 * checked against the sender's role, then to a stage's assignment
 * lifecycle, assignment.c, or to the boundary negotiation, act_link.c;
 * ACTIVATIONS by epoch to a stage's data path, datapath.c); the counters,
 * the load window for the heartbeat and what GET /metrics reads;
 * create/destroy. The leaves take a stage (daemon/wstage.h) or what they
 * need; none calls back here. See worker.h and docs/worker.md; the wire
 * protocol is in docs/protocol.md. */
#include "daemon/worker.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/act_link.h"
#include "daemon/assignment.h"
#include "daemon/control_send.h"
#include "daemon/datapath.h"
#include "daemon/hostport.h"
#include "daemon/stage_buffers.h"
#include "daemon/model_path.h"
#include "daemon/wstage.h"
#include "ib/assign_token.h"

#define MAX_STAGES 4             /* stages of different epochs held at once */
#define LOAD_MAX_SEQS 4096       /* sequences tracked for worker_load_get */

struct worker {
    struct event_base *base;
    xport *x;
    char name[128];
    int n_threads;
    double t_start;
    model_files models;     /* --model paths (by file name) and --model-dir (dirfd -1: none) */
    wstage *stages;         /* live stages, newest first */
    wstage *released;       /* released ones: freed after the transport (their sends may be in flight) */
    const cluster_key *key; /* worker_opts.key */
    uint64_t max_epoch;     /* the newest epoch of an accepted StageAssign (older ones are stale) */
    wcounters counters;     /* the stages add to them */
    stage_timing timing;    /* worker_observe */
    act_local act;          /* this worker's side of every boundary (act_link.h) */
    /* worker_load_get window: sequences seen and their block-table lengths */
    uint64_t load_seq[LOAD_MAX_SEQS];
    int load_blocks[LOAD_MAX_SEQS];
    int n_load;
    bool track_load;        /* worker_load_get was called (live mode), or GET /metrics observes */
    worker_load last_load;  /* the latest window worker_load_get closed */
    double last_load_at;    /* when (monotonic seconds; 0 = never) */
};

/* ---------------------------------------------------------------- helpers */

int worker_parse_hostport(const char *s, char *host, size_t host_cap, int *port, int allow_zero, st_err *err)
{
    return hostport_parse(s, host, host_cap, port, allow_zero, err);
}

/* A frame we do not accept: counts it, logs "dropping a frame from PEER:
 * WHY; disconnecting it" (WHY from fmt, at most 299 bytes) and closes the
 * peer. */
__attribute__((format(printf, 3, 4))) static void drop_frame(worker *w, xport_peer *peer, const char *fmt, ...)
{
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    w->counters.dropped_frames++;
    ST_WARN("worker: dropping a frame from %s: %s; disconnecting it", xport_peer_name(peer), why);
    xport_peer_close(peer);
}

/* ---------------------------------------------------------------- stages by epoch */

/* A new idle stage, first in w->stages. NULL + err. */
static wstage *new_stage(worker *w, st_err *err)
{
    wstage_env env = {.base = w->base,
                      .x = w->x,
                      .name = w->name,
                      .n_threads = w->n_threads,
                      .t_start = w->t_start,
                      .counters = &w->counters,
                      .timing = &w->timing,
                      .act = &w->act};
    wstage *st = stage_new(&env, err);
    if (!st) return NULL;
    st->link = w->stages;
    w->stages = st;
    return st;
}

/* Moves st from the live list to the released one (stopped). */
static void stage_release(worker *w, wstage *st)
{
    for (wstage **pp = &w->stages; *pp; pp = &(*pp)->link)
        if (*pp == st) {
            *pp = st->link;
            break;
        }
    stage_retire(st);
    st->link = w->released;
    w->released = st;
}

/* The live stage assigned epoch (not idle), or NULL. */
static wstage *stage_by_epoch(worker *w, uint64_t epoch)
{
    for (wstage *st = w->stages; st; st = st->link)
        if (st->state != W_IDLE && st->cur.epoch == epoch) return st;
    return NULL;
}

/* Whether epoch is older than the newest stage this worker holds: a frame of
 * it comes from a placement that was replaced (a peer that missed the change:
 * declared lost, then back after SIGCONT or a healed partition). Fenced:
 * dropped, counted in fenced_frames (StageStats) as well as dropped_frames. */
static bool old_epoch(const worker *w, uint64_t epoch)
{
    uint64_t newest = 0;
    for (const wstage *st = w->stages; st; st = st->link)
        if (st->cur.epoch > newest) newest = st->cur.epoch;
    return epoch < newest;
}

/* Whether epoch is newer than every stage this worker holds (its assignment may still come). */
static bool future_epoch(const worker *w, uint64_t epoch)
{
    for (const wstage *x = w->stages; x; x = x->link)
        if (x->state != W_IDLE && x->cur.epoch >= epoch) return false;
    return epoch > w->max_epoch || w->max_epoch == 0;
}

/* The stage that answers StatsRequest from peer: the one it assigned, else the newest. */
static wstage *stage_for_peer(worker *w, xport_peer *peer)
{
    for (wstage *st = w->stages; st; st = st->link)
        if (st->coord == peer) return st;
    return w->stages;
}

/* ---------------------------------------------------------------- StageAssign, StageRelease */

/* Answers a refused StageAssign with StageReady{ok = false, error = why}:
 * nothing of the worker's state was touched. */
static void refuse_assign(worker *w, xport_peer *peer, const ctl_assign *a, const char *why)
{
    w->counters.refused_assigns++;
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
    control_send(peer, &m, a->epoch, a->stage, 0, "StageReady");
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

/* Picks the stage that takes a StageAssign: the one of its epoch; in a
 * recovery the loaded stage it adopts; with keep_loaded an idle or failed
 * one, else a new one (the oldest dropped beyond MAX_STAGES); in static
 * mode the one stage, everything else released. */
static void handle_assign(worker *w, xport_peer *peer, const ctl_assign *a)
{
    if (!assign_allowed(w, peer, a)) return;
    wstage *st = stage_by_epoch(w, a->epoch);
    st_err err;
    if (!st && a->adopt_epoch) { /* a recovery: assignment_take re-uses that stage when it is the same */
        wstage *x = stage_by_epoch(w, a->adopt_epoch);
        if (assignment_adoptable(x, a)) st = x;
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
        st = new_stage(w, &err);
    } else if (!st) {
        /* static mode: the new assignment replaces everything (one stage) */
        while (w->stages && w->stages->link) {
            wstage *old = w->stages;
            while (old->link) old = old->link;
            stage_release(w, old);
        }
        st = w->stages ? w->stages : new_stage(w, &err);
    }
    if (!st) {
        ST_ERROR("worker: cannot take the assignment of epoch %llu: %s", (unsigned long long)a->epoch, err.msg);
        return;
    }
    assignment_take(st, peer, a, &w->models, &w->max_epoch);
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

/* ---------------------------------------------------------------- CONTROL */

static void handle_control(worker *w, xport_peer *peer, const frame_header *h)
{
    ctl_msg *m = strata__v1__control_message__unpack(NULL, h->control.len, h->control.data);
    if (!m) {
        drop_frame(w, peer, "undecodable CONTROL message (%zu bytes)", h->control.len);
        return;
    }
    /* Neighbouring stages negotiate their boundary's transport (act_link.h):
     * with a key, only from a peer that proved the stage role. */
    const bool act = m->msg_case == STRATA__V1__CONTROL_MESSAGE__MSG_ACT_OFFER ||
                     m->msg_case == STRATA__V1__CONTROL_MESSAGE__MSG_ACT_ANSWER;
    if (w->key && act && xport_peer_role(peer) != XPORT_ROLE_STAGE) {
        w->counters.dropped_frames++;
        ST_WARN("worker: refusing CONTROL message %d from %s: it is a %s, not a stage", (int)m->msg_case,
                xport_peer_name(peer), xport_role_name(xport_peer_role(peer)));
        strata__v1__control_message__free_unpacked(m, NULL);
        return;
    }
    if (w->key && !act && xport_peer_role(peer) != XPORT_ROLE_COORDINATOR &&
        m->msg_case != STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST) {
        /* Only the authenticated coordinator steers the worker; a stage peer's
         * CONTROL is refused and changes nothing. */
        w->counters.refused_assigns++;
        w->counters.dropped_frames++;
        ST_WARN("worker: refusing CONTROL message %d from %s: it is a %s, not the coordinator", (int)m->msg_case,
                xport_peer_name(peer), xport_role_name(xport_peer_role(peer)));
        strata__v1__control_message__free_unpacked(m, NULL);
        return;
    }
    switch (m->msg_case) {
    case STRATA__V1__CONTROL_MESSAGE__MSG_ASSIGN: handle_assign(w, peer, m->assign); break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_RELEASE: handle_release(w, m->release->epoch); break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_ACT_OFFER: {
        const Strata__V1__ActivationOffer *o = m->act_offer;
        wstage *st = stage_by_epoch(w, o->epoch);
        /* a refusal without a stage of that epoch: any stage's envelope will do */
        act_link_on_offer(&w->act, st, !st && future_epoch(w, o->epoch), w->stages, peer, o);
        break;
    }
    case STRATA__V1__CONTROL_MESSAGE__MSG_ACT_ANSWER:
        act_link_on_answer(&w->act, stage_by_epoch(w, m->act_answer->epoch), peer, m->act_answer);
        break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST: {
        wstage *st = stage_for_peer(w, peer);
        if (!st) st = new_stage(w, &(st_err){{0}});
        if (st) assignment_send_stats(st, peer, m->stats_request);
        break;
    }
    default: drop_frame(w, peer, "CONTROL message %d is not for a worker", (int)m->msg_case); break;
    }
    strata__v1__control_message__free_unpacked(m, NULL);
}

/* ---------------------------------------------------------------- transport callbacks */

static void on_connect(xport_peer *peer, bool inbound, void *ud)
{
    worker *w = ud;
    xport_peer_set_user(peer, w);
    ST_DEBUG("worker: %s peer %s", inbound ? "inbound" : "outbound", xport_peer_name(peer));
}

static void on_disconnect(xport_peer *peer, const char *reason, void *ud)
{
    worker *w = ud;
    for (wstage *st = w->stages; st; st = st->link) stage_on_disconnect(st, peer, reason);
    act_link_peer_gone(&w->act, peer);
    for (wstage *st = w->released; st; st = st->link) {
        if (st->coord == peer) st->coord = NULL;
        if (st->next == peer) st->next = NULL;
    }
    ST_DEBUG("worker: peer %s gone (%s)", xport_peer_name(peer), reason);
}

/* Remembers the sequences of an ACTIVATIONS frame for worker_load_get. */
static void note_load(worker *w, const frame_header *h)
{
    for (size_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *q = h->seqs[i];
        int k = 0;
        while (k < w->n_load && w->load_seq[k] != q->seq_id) k++;
        if (k == w->n_load) {
            if (w->n_load == LOAD_MAX_SEQS) continue;
            w->n_load++;
            w->load_seq[k] = q->seq_id;
        }
        w->load_blocks[k] = (int)q->n_block_table;
    }
}

static void on_frame(xport_peer *peer, const frame_header *h, const void *payload, size_t bytes, void *ud)
{
    worker *w = ud;
    xport_peer_set_user(peer, w);
    switch (h->kind) {
    case STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL: handle_control(w, peer, h); break;
    case STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS: {
        wstage *st = stage_by_epoch(w, h->epoch);
        if (!st && old_epoch(w, h->epoch)) w->counters.fenced_frames++; /* dropped below (epoch check) */
        if (!st) st = w->stages;
        if (!st) {
            drop_frame(w, peer, "ACTIVATIONS (batch %llu) while no stage is ready", (unsigned long long)h->batch_id);
            break;
        }
        if (w->track_load) note_load(w, h);
        st_err err;
        if (datapath_activations(st, h, payload, bytes, w->stages == st && !st->link, &err))
            drop_frame(w, peer, "%s", err.msg);
        break;
    }
    default: drop_frame(w, peer, "frame kind %d is not for a worker", (int)h->kind); break;
    }
}

/* The transport's rx sink: a payload for a stage whose incoming boundary is
 * ucx-cuda lands in one of its device buffers (datapath_sink_get). */
static xport_mem *sink_get(xport_peer *peer, const frame_header *h, size_t bytes, void *arg)
{
    (void)peer;
    worker *w = arg;
    return datapath_sink_get(stage_by_epoch(w, h->epoch), h, bytes);
}

static void sink_put(xport_mem *m, bool delivered, void *arg)
{
    (void)delivered;
    worker *w = arg;
    wstage *lists[2] = {w->stages, w->released};
    for (int l = 0; l < 2; l++)
        for (wstage *st = lists[l]; st; st = st->link)
            if (datapath_sink_put(st, m)) return;
}

/* ---------------------------------------------------------------- lifecycle */

worker *worker_create(struct event_base *base, const worker_opts *o, st_err *err)
{
    worker *w = calloc(1, sizeof *w);
    if (!w) {
        st_errf(err, "worker: out of memory");
        return NULL;
    }
    w->base = base;
    w->models.dirfd = -1;
    w->t_start = st_now_s();
    w->n_threads = o->n_threads;
    xport_callbacks cb = {.on_connect = on_connect, .on_disconnect = on_disconnect, .on_frame = on_frame, .ud = w};
    w->x = xport_create(base, o->listen_host, o->listen_port, &cb, err);
    if (!w->x) goto fail;
    xport_set_rx_sink(w->x, &(xport_rx_sink){.get = sink_get, .put = sink_put, .arg = w});
    w->key = o->key;
    if (o->model_dir && (w->models.dirfd = open(o->model_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        st_errf(err, "worker: model directory %s: %s", o->model_dir, strerror(errno));
        goto fail;
    }
    if (o->key) xport_require_auth(w->x, o->key, XPORT_ROLE_STAGE, 0);
    act_link_init(&w->act, w->x, o->activation_transport, &w->counters);
    if (o->name && *o->name)
        snprintf(w->name, sizeof w->name, "%s", o->name);
    else
        snprintf(w->name, sizeof w->name, "%s:%d", o->listen_host, xport_port(w->x));
    if (o->n_models > 0) {
        w->models.models = calloc((size_t)o->n_models, sizeof *w->models.models);
        if (!w->models.models) {
            st_errf(err, "worker: out of memory");
            goto fail;
        }
        for (int i = 0; i < o->n_models; i++)
            if (!(w->models.models[w->models.n_models++] = strdup(o->models[i]))) {
                st_errf(err, "worker: out of memory");
                goto fail;
            }
    }
    /* One idle stage from the start: StatsRequest before any assignment works as before. */
    if (!new_stage(w, err)) goto fail;
    return w;
fail:
    worker_destroy(w);
    return NULL;
}

int worker_port(const worker *w) { return xport_port(w->x); }

void worker_destroy(worker *w)
{
    if (!w) return;
    for (wstage *st = w->stages; st; st = st->link) stage_stop(st);
    for (wstage *st = w->stages; st; st = st->link) stage_buffers_drain(st);
    if (w->x) xport_destroy(w->x); /* in-flight sends complete here: fwd_sent unregisters their buffers */
    while (w->stages) {
        wstage *st = w->stages;
        w->stages = st->link;
        stage_free(st);
    }
    while (w->released) {
        wstage *st = w->released;
        w->released = st->link;
        stage_free(st);
    }
    act_link_peer_gone(&w->act, NULL);
    for (int i = 0; i < w->models.n_models; i++) free(w->models.models[i]);
    free(w->models.models);
    if (w->models.dirfd >= 0) close(w->models.dirfd);
    free(w);
}

/* ---------------------------------------------------------------- load and figures */

/* The cumulative and current values of *out (not the window's). */
static void load_now(worker *w, worker_load *out)
{
    xport_stats xs;
    xport_get_stats(w->x, &xs);
    out->bytes_sent = xs.bytes_sent;
    out->uptime_seconds = st_now_s() - w->t_start;
    out->busy_seconds = 0;
    out->kv_blocks = 0;
    out->n_stages = 0;
    for (wstage *st = w->stages; st; st = st->link) {
        compute_stats cs;
        compute_get_stats(st->cq, &cs);
        out->busy_seconds += cs.busy_seconds;
        if (st->state == W_READY && st->info.kv_blocks > out->kv_blocks) out->kv_blocks = st->info.kv_blocks;
        if (st->state == W_READY) out->n_stages++;
    }
}

void worker_load_get(worker *w, worker_load *out)
{
    memset(out, 0, sizeof *out);
    w->track_load = true;
    load_now(w, out);
    out->running_sequences = (uint32_t)w->n_load;
    for (int i = 0; i < w->n_load; i++) out->kv_blocks_used += (uint32_t)w->load_blocks[i];
    if (out->kv_blocks_used > (uint32_t)out->kv_blocks) out->kv_blocks_used = (uint32_t)out->kv_blocks;
    w->n_load = 0;
    w->last_load = *out;
    w->last_load_at = st_now_s();
}

void worker_load_recent(worker *w, worker_load *out)
{
    /* A window closed within the last second (the live-mode load tick closes
     * one every 500 ms): report it with the values of now. Else close one
     * here: the sequences seen since the previous call. */
    if (w->last_load_at > 0 && st_now_s() - w->last_load_at < 1.0) {
        *out = w->last_load;
        load_now(w, out);
        if (out->kv_blocks_used > (uint32_t)out->kv_blocks) out->kv_blocks_used = (uint32_t)out->kv_blocks;
        return;
    }
    worker_load_get(w, out);
}

void worker_observe(worker *w, void (*forward)(void *ud, int stage, double seconds),
                    void (*hop)(void *ud, int stage, double seconds), void *ud)
{
    w->timing = (stage_timing){.forward = forward, .hop = hop, .ud = ud};
    if (forward || hop) w->track_load = true;
}

void worker_figures_get(worker *w, worker_figures *out)
{
    memset(out, 0, sizeof *out);
    xport_get_stats(w->x, &out->xport);
    out->dropped_frames = w->counters.dropped_frames;
    out->fenced_frames = w->counters.fenced_frames;
    out->batch_errors = w->counters.batch_errors;
    for (wstage *st = w->stages; st; st = st->link) {
        compute_stats cs;
        compute_get_stats(st->cq, &cs);
        out->forwards += (double)cs.forwards;
        out->tokens += (double)cs.tokens;
        out->busy_seconds += cs.busy_seconds;
        if (st->state == W_IDLE || out->n_stages == WORKER_FIGURES_STAGES) continue;
        out->stages[out->n_stages++] = (worker_stage_figures){.stage = st->cur.stage,
                                                              .epoch = st->cur.epoch,
                                                              .first_layer = st->cur.first_layer,
                                                              .last_layer = st->cur.last_layer,
                                                              .ready = st->state == W_READY};
    }
}
