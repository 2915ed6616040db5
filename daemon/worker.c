/* worker.c — strata-worker's front, on the event loop: the transport's
 * callbacks, routing each frame by kind (CONTROL to the assignment lifecycle,
 * assignment.c; ACTIVATIONS by epoch to a stage's data path, datapath.c),
 * create/destroy and the load window for the heartbeat. See worker.h,
 * worker_internal.h and docs/worker.md; the wire protocol is in
 * docs/protocol.md. */
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
#include "daemon/datapath.h"
#include "daemon/worker_internal.h"

/* ---------------------------------------------------------------- helpers */

int worker_parse_hostport(const char *s, char *host, size_t host_cap, int *port, int allow_zero, st_err *err)
{
    if (!s || !*s) return st_errf(err, "empty address (want HOST:PORT)");
    const char *colon = strrchr(s, ':');
    if (!colon) return st_errf(err, "address '%s' has no port (want HOST:PORT)", s);
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0) return st_errf(err, "address '%s' has no host", s);
    if (hl >= host_cap) return st_errf(err, "address '%s': host too long", s);
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (colon[1] == 0 || *end || p < (allow_zero ? 0 : 1) || p > 65535)
        return st_errf(err, "address '%s': bad port '%s'", s, colon + 1);
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (int)p;
    return 0;
}

void worker_drop_frame(worker *w, xport_peer *peer, const char *fmt, ...)
{
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    w->dropped_frames++;
    ST_WARN("worker: dropping a frame from %s: %s; disconnecting it", xport_peer_name(peer), why);
    xport_peer_close(peer);
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
    act_link_peer_gone(w, peer);
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

static void on_frame(xport_peer *peer, const frame_header *h, const void *payload, size_t bytes, void *ud)
{
    worker *w = ud;
    xport_peer_set_user(peer, w);
    switch (h->kind) {
    case STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL: assignment_handle_control(w, peer, h); break;
    case STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS: {
        wstage *st = stage_by_epoch(w, h->epoch);
        if (!st && old_epoch(w, h->epoch)) w->fenced_frames++; /* dropped below (epoch check) */
        if (!st) st = w->stages;
        if (!st) {
            worker_drop_frame(w, peer, "ACTIVATIONS (batch %llu) while no stage is ready",
                              (unsigned long long)h->batch_id);
            break;
        }
        if (w->track_load) note_load(w, h);
        datapath_activations(st, peer, h, payload, bytes);
        break;
    }
    default: worker_drop_frame(w, peer, "frame kind %d is not for a worker", (int)h->kind); break;
    }
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
    w->model_dirfd = -1;
    w->t_start = st_now_s();
    w->n_threads = o->n_threads;
    xport_callbacks cb = {.on_connect = on_connect, .on_disconnect = on_disconnect, .on_frame = on_frame, .ud = w};
    w->x = xport_create(base, o->listen_host, o->listen_port, &cb, err);
    if (!w->x) goto fail;
    xport_set_rx_sink(w->x, &(xport_rx_sink){.get = datapath_sink_get, .put = datapath_sink_put, .arg = w});
    w->key = o->key;
    if (o->model_dir && (w->model_dirfd = open(o->model_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        st_errf(err, "worker: model directory %s: %s", o->model_dir, strerror(errno));
        goto fail;
    }
    if (o->key) xport_require_auth(w->x, o->key, XPORT_ROLE_STAGE, 0);
    w->act_override = o->activation_transport;
    act_link_init(w);
    if (o->name && *o->name)
        snprintf(w->name, sizeof w->name, "%s", o->name);
    else
        snprintf(w->name, sizeof w->name, "%s:%d", o->listen_host, xport_port(w->x));
    if (o->n_models > 0) {
        w->models = calloc((size_t)o->n_models, sizeof *w->models);
        if (!w->models) {
            st_errf(err, "worker: out of memory");
            goto fail;
        }
        for (int i = 0; i < o->n_models; i++)
            if (!(w->models[w->n_models++] = strdup(o->models[i]))) {
                st_errf(err, "worker: out of memory");
                goto fail;
            }
    }
    /* One idle stage from the start: StatsRequest before any assignment works as before. */
    if (!stage_new(w, err)) goto fail;
    return w;
fail:
    worker_destroy(w);
    return NULL;
}

int worker_port(const worker *w) { return xport_port(w->x); }

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

void worker_destroy(worker *w)
{
    if (!w) return;
    w->shutting_down = true;
    for (wstage *st = w->stages; st; st = st->link) stage_stop(st);
    for (wstage *st = w->stages; st; st = st->link) datapath_pool_drain(st);
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
    act_link_peer_gone(w, NULL);
    for (int i = 0; i < w->n_models; i++) free(w->models[i]);
    free(w->models);
    if (w->model_dirfd >= 0) close(w->model_dirfd);
    free(w);
}
