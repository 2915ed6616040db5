/* worker.c — strata-worker's frame handling and stage lifecycle, on the event
 * loop: CONTROL (StageAssign/StatsRequest), ACTIVATIONS checks and hand-off to
 * the compute thread, and sending results on (next hop, or the coordinator).
 * See worker.h and docs/worker.md; the wire protocol is in docs/protocol.md. */
#include "daemon/worker.h"

#include <event2/event.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "daemon/compute_thread.h"
#include "ib/transport.h"
#include "model/sampler.h"
#include "proto/stage.pb-c.h"

#define POOL_MAX 8               /* free registered output buffers kept */
#define POOL_MIN_BYTES (64u << 10)
#define BACKOFF_MIN_S 0.1
#define BACKOFF_MAX_S 5.0
#define FWD_RING 4096            /* forward intervals kept per stage (StageStats.forward_ns) */
#define FWD_REPLY_MAX 1024       /* intervals per StageStats at most */
#define INLINE_MAX_TOKENS 64     /* micro-batches up to this size may run on the loop thread */

typedef Strata__V1__ControlMessage ctl_msg;
typedef Strata__V1__StageAssign ctl_assign;

enum wstate { W_IDLE, W_LOADING, W_READY, W_FAILED };

typedef struct wstage wstage;

/* The current assignment (owned strings). */
struct assign {
    uint64_t epoch;
    uint32_t stage, n_stages;
    char *model_path;
    int first_layer, last_layer, tp, kv_blocks, block_size, n_threads;
    int act_dtype;  /* DTYPE_F32 or DTYPE_BF16 */
    char *next_hop; /* "" for the last stage */
    char next_host[256];
    int next_port;
};

/* A forward in flight: the compute job plus what the loop needs to send the
 * result on. cj must be first (cjob * <-> struct job *). */
struct job {
    cjob cj;
    uint64_t gen;        /* w->gen when submitted: results of older assignments are dropped */
    wstage *w;
    frame_header *hdr;   /* owned copy of the received header */
    stage_seq *seqs;
    float *in;           /* f32 input rows (non-first stage) */
    float *scratch;      /* f32 output before bf16 conversion */
    xport_mem *out_mem;  /* registered output buffer (non-last stage) */
    size_t out_bytes;
    stage_sample_out *samples;
};

struct open_job {
    cjob cj;
    uint64_t gen;
    char *model_path; /* owned; cj.params.model_path points here */
};

/* One loaded (or loading) stage, keyed by its placement epoch. A worker holds
 * one normally, two during a live placement change (StageAssign.keep_loaded):
 * each has its own compute thread, next-hop peer and coordinator peer. */
struct wstage {
    worker *front;          /* the owning worker (transport, counters) */
    struct event_base *base;
    xport *x;               /* = front->x */
    compute *cq;
    struct event *cq_ev, *reconnect_ev;
    char name[128];
    int n_threads;
    double t_start;

    enum wstate state;
    uint64_t gen;           /* incremented by every new assignment */
    struct assign cur;
    cjob_stage_info info;   /* valid in W_READY */
    xport_peer *coord;      /* the peer that sent the current assignment */
    xport_peer *next;       /* next hop (non-last stage) */
    double backoff;

    xport_mem *pool[POOL_MAX];
    int n_pool;
    int sends_inflight;     /* ACTIVATIONS to the next hop not yet completed */

    bool shutting_down;     /* released or the worker is stopping */
    wstage *link;           /* the worker's list of live / released stages */

    /* The last FWD_RING successful forwards' [start, end) CLOCK_MONOTONIC ns,
     * in completion order (disjoint: one compute thread); fwd_n recorded in
     * all, the next one goes to fwd[fwd_n % FWD_RING]. */
    uint64_t fwd[FWD_RING][2];
    uint64_t fwd_n;
};

#define MAX_STAGES 4        /* stages of different epochs held at once */
#define LOAD_MAX_SEQS 4096  /* sequences tracked for worker_load_get */

struct worker {
    struct event_base *base;
    xport *x;
    char name[128];
    int n_threads;
    double t_start;
    char **models;          /* --model paths (resolve StageAssign.model_path by file name) */
    int n_models;
    wstage *stages;         /* live stages, newest first */
    wstage *released;       /* released ones: freed after the transport (their sends may be in flight) */
    uint64_t dropped_frames, batch_errors;
    bool shutting_down;
    /* worker_load_get window: sequences seen and their block-table lengths */
    uint64_t load_seq[LOAD_MAX_SEQS];
    int load_blocks[LOAD_MAX_SEQS];
    int n_load;
    bool track_load;        /* worker_load_get was called (live mode) */
};

static void on_compute(evutil_socket_t fd, short what, void *arg);
static void forward_done(wstage *w, struct job *j);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

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

static xport_mem *pool_get(wstage *w, size_t bytes, st_err *err)
{
    int best = -1;
    for (int i = 0; i < w->n_pool; i++)
        if (xport_mem_len(w->pool[i]) >= bytes &&
            (best < 0 || xport_mem_len(w->pool[i]) < xport_mem_len(w->pool[best])))
            best = i;
    if (best >= 0) {
        xport_mem *m = w->pool[best];
        w->pool[best] = w->pool[--w->n_pool];
        return m;
    }
    size_t cap = POOL_MIN_BYTES;
    while (cap < bytes) cap *= 2;
    return xport_mem_alloc(w->x, cap, err);
}

static void pool_put(wstage *w, xport_mem *m)
{
    if (!m) return;
    if (w->shutting_down) {
        xport_mem_unregister(w->x, m);
        return;
    }
    if (w->n_pool == POOL_MAX) { /* keep the larger buffers */
        int small = 0;
        for (int i = 1; i < w->n_pool; i++)
            if (xport_mem_len(w->pool[i]) < xport_mem_len(w->pool[small])) small = i;
        if (xport_mem_len(w->pool[small]) >= xport_mem_len(m)) {
            xport_mem_unregister(w->x, m);
            return;
        }
        xport_mem_unregister(w->x, w->pool[small]);
        w->pool[small] = m;
        return;
    }
    w->pool[w->n_pool++] = m;
}

static void job_free(wstage *w, struct job *j)
{
    if (!j) return;
    frame_header_free(j->hdr);
    free(j->seqs);
    free(j->in);
    free(j->scratch);
    free(j->samples);
    pool_put(w, j->out_mem);
    free(j);
}

static void assign_clear(struct assign *a)
{
    free(a->model_path);
    free(a->next_hop);
    memset(a, 0, sizeof *a);
}

/* Copies a decoded header (pack + unpack): the callback's one dies with it. */
static frame_header *header_copy(const frame_header *h, st_err *err)
{
    size_t n;
    uint8_t *buf = frame_header_pack(h, &n, err);
    if (!buf) return NULL;
    frame_header *c = frame_header_unpack(buf, n, err);
    free(buf);
    return c;
}

/* FrameHeader sampling -> sampler params. proto3 zeros mean "unset": top_p 0
 * is 1 (off), repeat_penalty 0 is 1 (off). penalty_last_n is the repeat
 * penalty's window (0 = off); presence/frequency count the whole history. */
static sampler_params sampling_from_frame(const frame_sampling *s)
{
    sampler_params p = sampler_greedy_params();
    if (!s) return p;
    p.temperature = s->temperature;
    p.top_k = s->top_k;
    p.top_p = s->top_p > 0.0f ? s->top_p : 1.0f;
    p.min_p = s->min_p;
    p.repeat_penalty = s->repeat_penalty > 0.0f ? s->repeat_penalty : 1.0f;
    p.repeat_last_n = s->penalty_last_n;
    p.presence_penalty = s->presence_penalty;
    p.frequency_penalty = s->frequency_penalty;
    p.seed = s->seed;
    p.n_top_logprobs = s->n_top_logprobs;
    return p;
}

static const char *dtype_name(int d)
{
    return d == STRATA__V1__DTYPE__DTYPE_F32 ? "f32" : d == STRATA__V1__DTYPE__DTYPE_BF16 ? "bf16" : "none";
}

/* ---------------------------------------------------------------- sending */

/* Sends a CONTROL frame carrying m. 0 or -1 (logged). */
static int send_control(wstage *w, xport_peer *peer, const ctl_msg *m, uint64_t epoch, uint64_t batch_id)
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
    send_control(w, peer, &m, epoch, 0);
}

static void batch_error(wstage *w, const struct job *j, const char *msg)
{
    const frame_header *h = j->hdr;
    w->front->batch_errors++;
    ST_WARN("worker: batch %llu (epoch %llu) failed: %s", (unsigned long long)h->batch_id,
            (unsigned long long)h->epoch, msg);
    if (w->shutting_down) return;
    if (!w->coord) {
        ST_WARN("worker: no coordinator connected; BatchError for batch %llu not sent",
                (unsigned long long)h->batch_id);
        return;
    }
    uint64_t *ids = calloc(h->n_seqs ? h->n_seqs : 1, sizeof *ids);
    if (!ids) return;
    for (size_t i = 0; i < h->n_seqs; i++) ids[i] = h->seqs[i]->seq_id;
    Strata__V1__BatchError e = STRATA__V1__BATCH_ERROR__INIT;
    e.epoch = h->epoch;
    e.stage = w->cur.stage;
    e.batch_id = h->batch_id;
    e.seq_ids = ids;
    e.n_seq_ids = h->n_seqs;
    e.error = (char *)msg;
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_ERROR;
    m.batch_error = &e;
    send_control(w, w->coord, &m, h->epoch, h->batch_id);
    free(ids);
}

/* Loop thread: a forward of this stage finished (see wstage.fwd). */
static void note_forward(wstage *w, const cjob *cj)
{
    uint64_t *slot = w->fwd[w->fwd_n % FWD_RING];
    slot[0] = cj->start_ns;
    slot[1] = cj->end_ns;
    w->fwd_n++;
}

/* Fills out[] (2 * FWD_REPLY_MAX entries) with the kept intervals ending
 * after since_ns, oldest first, at most FWD_REPLY_MAX; returns the count of
 * uint64s written. */
static size_t forward_intervals(const wstage *w, uint64_t since_ns, uint64_t *out)
{
    uint64_t kept = w->fwd_n < FWD_RING ? w->fwd_n : FWD_RING;
    uint64_t i = w->fwd_n - kept;
    while (i < w->fwd_n && w->fwd[i % FWD_RING][1] <= since_ns) i++;
    size_t n = 0;
    for (; i < w->fwd_n && n < 2 * FWD_REPLY_MAX; i++) {
        out[n++] = w->fwd[i % FWD_RING][0];
        out[n++] = w->fwd[i % FWD_RING][1];
    }
    return n;
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
    s.uptime_seconds = now_s() - w->t_start;
    s.forwards = cs.forwards;
    s.tokens = cs.tokens;
    s.frames_sent = xs.frames_sent;
    s.frames_recv = xs.frames_recv;
    s.bytes_sent = xs.bytes_sent;
    s.bytes_recv = xs.bytes_recv;
    s.bad_frames = xs.bad_frames;
    s.dropped_frames = w->front->dropped_frames;
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
            s.n_forward_ns = forward_intervals(w, req->forward_since_ns, fwd);
        } else {
            ST_WARN("worker: out of memory for the forward intervals; StageStats without them");
        }
    }
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_STATS;
    m.stats = &s;
    send_control(w, peer, &m, w->cur.epoch, 0);
    free(fwd);
}

/* A frame we do not accept: log, drop, disconnect its sender. */
static void unexpected(wstage *w, xport_peer *peer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void unexpected(wstage *w, xport_peer *peer, const char *fmt, ...)
{
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    w->front->dropped_frames++;
    ST_WARN("worker: dropping a frame from %s: %s; disconnecting it", xport_peer_name(peer), msg);
    xport_peer_close(peer);
}

/* ---------------------------------------------------------------- next hop */

static void connect_next(wstage *w)
{
    if (w->next || w->state != W_READY || !w->cur.next_hop || !*w->cur.next_hop || w->shutting_down) return;
    st_err err;
    w->next = xport_connect(w->x, w->cur.next_host, w->cur.next_port, &err);
    if (!w->next) {
        ST_WARN("worker: next hop %s: %s; retrying in %.1f s", w->cur.next_hop, err.msg, w->backoff);
        struct timeval tv = {(time_t)w->backoff, (suseconds_t)((w->backoff - (time_t)w->backoff) * 1e6)};
        evtimer_add(w->reconnect_ev, &tv);
        w->backoff = w->backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : w->backoff * 2;
        return;
    }
    xport_peer_set_user(w->next, w);
    ST_INFO("worker: connecting to next hop %s (stage %u)", w->cur.next_hop, w->cur.stage + 1);
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

static bool same_assign(const struct assign *a, const struct assign *b)
{
    return a->epoch == b->epoch && a->stage == b->stage && a->n_stages == b->n_stages &&
           a->first_layer == b->first_layer && a->last_layer == b->last_layer && a->tp == b->tp &&
           a->kv_blocks == b->kv_blocks && a->block_size == b->block_size && a->n_threads == b->n_threads &&
           a->act_dtype == b->act_dtype && !strcmp(a->model_path, b->model_path) && !strcmp(a->next_hop, b->next_hop);
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
    if (!strchr(na.model_path, '/')) /* a file name (live mode): one of --model / --model-dir's files */
        for (int i = 0; i < w->front->n_models; i++) {
            const char *base = strrchr(w->front->models[i], '/');
            base = base ? base + 1 : w->front->models[i];
            if (!strcmp(base, na.model_path)) {
                char *full = strdup(w->front->models[i]);
                if (full) {
                    free(na.model_path);
                    na.model_path = full;
                }
                break;
            }
        }
    if (w->state == W_LOADING) {
        snprintf(err.msg, sizeof err.msg, "busy: still loading epoch %llu; retry after its StageReady",
                 (unsigned long long)w->cur.epoch);
        reply_ready(w, peer, na.epoch, na.stage, err.msg);
        assign_clear(&na);
        return;
    }
    if (w->state == W_READY && same_assign(&w->cur, &na)) { /* idempotent: a (re)connected coordinator */
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
        reply_ready(w, peer, na.epoch, na.stage, "worker: out of memory");
        assign_clear(&na);
        return;
    }
    drop_next(w);
    assign_clear(&w->cur);
    w->cur = na;
    w->coord = peer;
    w->state = W_LOADING;
    w->gen++;
    memset(&w->info, 0, sizeof w->info);
    oj->gen = w->gen;
    oj->model_path = path;
    oj->cj.kind = CJOB_OPEN;
    oj->cj.user = oj;
    oj->cj.params = (stage_params){.model_path = path,
                                   .first_layer = na.first_layer,
                                   .last_layer = na.last_layer,
                                   .tp = na.tp,
                                   .n_threads = na.n_threads ? na.n_threads : w->n_threads,
                                   .kv_blocks = na.kv_blocks,
                                   .block_size = na.block_size};
    st_log_set_stage((int)na.stage); /* STRATA_STAGE on this worker's journald records */
    ST_INFO("worker: assigned epoch %llu stage %u/%u: %s layers [%d, %d) tp %d kv_blocks %d act %s next %s",
            (unsigned long long)na.epoch, na.stage, na.n_stages, na.model_path, na.first_layer, na.last_layer,
            na.tp, na.kv_blocks, dtype_name(na.act_dtype), *na.next_hop ? na.next_hop : "(coordinator)");
    compute_submit(w->cq, &oj->cj);
}

static void open_done(wstage *w, struct open_job *oj)
{
    if (oj->gen != w->gen || w->shutting_down) goto out;
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
    free(oj->model_path);
    free(oj);
}

/* ---------------------------------------------------------------- stages by epoch */

static wstage *stage_new(worker *w, st_err *err)
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

/* Stops a stage's compute thread (the running job finishes; queued ones are
 * dropped) and closes its stage. Its memory stays until stage_free: sends of
 * its jobs may still be in flight on the transport. */
static void stage_stop(wstage *st)
{
    st->shutting_down = true;
    if (!st->cq) return;
    compute_stop(st->cq);
    cjob *list = compute_take_done(st->cq);
    while (list) {
        cjob *cj = list;
        list = cj->next;
        if (cj->kind == CJOB_OPEN) {
            struct open_job *oj = cj->user;
            free(oj->model_path);
            free(oj);
        } else {
            job_free(st, cj->user);
        }
    }
    compute_free(st->cq);
    st->cq = NULL;
    if (st->cq_ev) event_free(st->cq_ev);
    if (st->reconnect_ev) event_free(st->reconnect_ev);
    st->cq_ev = st->reconnect_ev = NULL;
}

static void stage_free(wstage *st)
{
    for (int i = 0; i < st->n_pool; i++) xport_mem_unregister(st->x, st->pool[i]);
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
    stage_stop(st);
    for (int i = 0; i < st->n_pool; i++) xport_mem_unregister(st->x, st->pool[i]);
    st->n_pool = 0;
    st->link = w->released;
    w->released = st;
}

static wstage *stage_by_epoch(worker *w, uint64_t epoch)
{
    for (wstage *st = w->stages; st; st = st->link)
        if (st->state != W_IDLE && st->cur.epoch == epoch) return st;
    return NULL;
}

static void handle_assign_front(worker *w, xport_peer *peer, const ctl_assign *a)
{
    wstage *st = stage_by_epoch(w, a->epoch);
    st_err err;
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

/* The stage that answers StatsRequest from peer: the one it assigned, else the newest. */
static wstage *stage_for_peer(worker *w, xport_peer *peer)
{
    for (wstage *st = w->stages; st; st = st->link)
        if (st->coord == peer) return st;
    return w->stages;
}

static void front_unexpected(worker *w, xport_peer *peer, const char *what)
{
    w->dropped_frames++;
    ST_WARN("worker: dropping a frame from %s: %s; disconnecting it", xport_peer_name(peer), what);
    xport_peer_close(peer);
}

static void handle_control(worker *w, xport_peer *peer, const frame_header *h)
{
    ctl_msg *m = strata__v1__control_message__unpack(NULL, h->control.len, h->control.data);
    if (!m) {
        char msg[96];
        snprintf(msg, sizeof msg, "undecodable CONTROL message (%zu bytes)", h->control.len);
        front_unexpected(w, peer, msg);
        return;
    }
    switch (m->msg_case) {
    case STRATA__V1__CONTROL_MESSAGE__MSG_ASSIGN: handle_assign_front(w, peer, m->assign); break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_RELEASE: handle_release(w, m->release->epoch); break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST: {
        wstage *st = stage_for_peer(w, peer);
        if (!st) st = stage_new(w, &(st_err){{0}});
        if (st) send_stats(st, peer, m->stats_request);
        break;
    }
    default: {
        char msg[96];
        snprintf(msg, sizeof msg, "CONTROL message %d is not for a worker", (int)m->msg_case);
        front_unexpected(w, peer, msg);
        break;
    }
    }
    strata__v1__control_message__free_unpacked(m, NULL);
}

/* ---------------------------------------------------------------- ACTIVATIONS */

/* Whether a micro-batch of T tokens may run on the loop thread (when the
 * compute thread is idle, compute_run_inline): that saves the two thread
 * hand-offs of a hop (wake the compute thread, wake the loop for the result;
 * each a cross-CPU wake-up, tens of us on a VM), but the loop makes no
 * progress while the forward runs. So only a small batch (a decode step's
 * forward is short), only while this worker holds one stage (another epoch's
 * frames would wait), and only with no ACTIVATIONS send of ours in flight
 * (a rendezvous send needs our progress to finish). Frames that arrive
 * meanwhile wait in the socket; they could not start before this forward
 * ends anyway. */
static bool run_here(const wstage *w, int64_t T)
{
    return T <= INLINE_MAX_TOKENS && w->sends_inflight == 0 && w->front->stages == w && !w->link;
}

static void handle_activations(wstage *w, xport_peer *peer, const frame_header *h, const void *payload,
                               size_t bytes)
{
    if (w->state != W_READY) {
        unexpected(w, peer, "ACTIVATIONS (batch %llu) while no stage is ready", (unsigned long long)h->batch_id);
        return;
    }
    if (h->epoch != w->cur.epoch) {
        unexpected(w, peer, "batch %llu has epoch %llu, the assignment is epoch %llu",
                   (unsigned long long)h->batch_id, (unsigned long long)h->epoch, (unsigned long long)w->cur.epoch);
        return;
    }
    if (h->stage != w->cur.stage) {
        unexpected(w, peer, "batch %llu is for stage %u, this is stage %u", (unsigned long long)h->batch_id,
                   h->stage, w->cur.stage);
        return;
    }
    const cjob_stage_info *in = &w->info;
    const int64_t T = frame_total_tokens(h);
    if (in->is_first) {
        if (bytes) {
            unexpected(w, peer, "stage 0 takes token ids, not a payload");
            return;
        }
        if ((int64_t)h->n_token_ids != T) {
            unexpected(w, peer, "stage 0 needs %lld token ids, got %zu", (long long)T, h->n_token_ids);
            return;
        }
        for (size_t i = 0; i < h->n_token_ids; i++)
            if (h->token_ids[i] >= in->n_vocab) {
                unexpected(w, peer, "token id %d outside the vocabulary [0, %d)", (int)h->token_ids[i], in->n_vocab);
                return;
            }
    } else {
        if (!bytes) {
            unexpected(w, peer, "stage %u needs a hidden-state payload", w->cur.stage);
            return;
        }
        if (h->shape[1] != (uint32_t)in->n_embd) {
            unexpected(w, peer, "payload rows of %u, the model's n_embd is %d", h->shape[1], in->n_embd);
            return;
        }
        if ((int)h->dtype != w->cur.act_dtype) {
            unexpected(w, peer, "payload dtype %s, configured %s", dtype_name(h->dtype), dtype_name(w->cur.act_dtype));
            return;
        }
    }
    for (size_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *s = h->seqs[i];
        for (size_t b = 0; b < s->n_block_table; b++)
            if (s->block_table[b] >= in->kv_blocks) {
                unexpected(w, peer, "seq %llu: block id %d outside [0, %d)", (unsigned long long)s->seq_id,
                           (int)s->block_table[b], in->kv_blocks);
                return;
            }
        for (size_t k = 0; k < s->n_history; k++)
            if (s->history[k] < 0 || s->history[k] >= in->n_vocab) {
                unexpected(w, peer, "seq %llu: history token %d outside the vocabulary", (unsigned long long)s->seq_id,
                           (int)s->history[k]);
                return;
            }
        if (in->is_last && s->wants_logits) {
            sampler_params sp = sampling_from_frame(s->sampling);
            st_err err;
            if (sampler_params_validate(&sp, &err)) {
                unexpected(w, peer, "seq %llu: %s", (unsigned long long)s->seq_id, err.msg);
                return;
            }
            for (size_t k = 0; k < i; k++)
                if (h->seqs[k]->seq_id == s->seq_id && h->seqs[k]->wants_logits) {
                    unexpected(w, peer, "seq %llu wants logits twice in one batch", (unsigned long long)s->seq_id);
                    return;
                }
        }
    }

    /* The job: a private copy of the header and the input rows. */
    struct job *j = calloc(1, sizeof *j);
    st_err err;
    if (!j) goto oom;
    j->gen = w->gen;
    j->w = w;
    j->cj.kind = CJOB_FORWARD;
    j->cj.user = j;
    if (!(j->hdr = header_copy(h, &err))) goto fail;
    const frame_header *c = j->hdr;
    if (!(j->seqs = calloc(c->n_seqs, sizeof *j->seqs))) goto oom;
    for (size_t i = 0; i < c->n_seqs; i++) {
        const frame_seq *s = c->seqs[i];
        j->seqs[i] = (stage_seq){.seq_id = s->seq_id,
                                 .pos = s->pos,
                                 .n_tokens = s->n_tokens,
                                 .block_table = s->block_table,
                                 .n_blocks = (int32_t)s->n_block_table,
                                 .want_logits = s->wants_logits,
                                 .sampling = sampling_from_frame(s->sampling),
                                 .step = s->step,
                                 .history = s->n_history ? s->history : NULL,
                                 .n_history = (int32_t)s->n_history};
    }
    j->cj.batch = (stage_batch){.n_seqs = (int)c->n_seqs, .seqs = j->seqs, .n_tokens = (int32_t)T,
                                .tokens = in->is_first ? c->token_ids : NULL};
    const size_t n_el = (size_t)T * (size_t)in->n_embd;
    if (!in->is_first) {
        if (!(j->in = malloc(n_el * sizeof(float)))) goto oom;
        if (h->dtype == STRATA__V1__DTYPE__DTYPE_F32)
            memcpy(j->in, payload, n_el * sizeof(float));
        else
            frame_bf16_to_f32(payload, j->in, n_el);
        j->cj.hidden_in = j->in;
    }
    if (!in->is_last) {
        j->out_bytes = n_el * frame_dtype_size(w->cur.act_dtype);
        if (!(j->out_mem = pool_get(w, j->out_bytes, &err))) goto fail;
        if (w->cur.act_dtype == STRATA__V1__DTYPE__DTYPE_F32) {
            j->cj.hidden_out = xport_mem_ptr(j->out_mem);
        } else {
            if (!(j->scratch = malloc(n_el * sizeof(float)))) goto oom;
            j->cj.hidden_out = j->scratch;
            j->cj.out_bf16 = xport_mem_ptr(j->out_mem);
            j->cj.n_out = n_el;
        }
    } else {
        if (!(j->samples = calloc(c->n_seqs, sizeof *j->samples))) goto oom;
        j->cj.samples = j->samples;
    }
    /* A sequence's first slice carries its request id: one log line per
     * request and stage, so `journalctl STRATA_REQUEST_ID=...` follows it. */
    for (size_t i = 0; i < h->n_seqs; i++)
        if (h->seqs[i]->request_id && h->seqs[i]->request_id[0])
            ST_REQ_INFO(h->seqs[i]->request_id, "worker: stage %u: seq %llu starts (batch %llu, %d prompt tokens in this slice)",
                        h->stage, (unsigned long long)h->seqs[i]->seq_id, (unsigned long long)h->batch_id,
                        (int)h->seqs[i]->n_tokens);
    ST_DEBUG("worker: batch %llu: %zu seqs, %lld tokens queued", (unsigned long long)h->batch_id, h->n_seqs,
             (long long)T);
    if (run_here(w, T) && compute_run_inline(w->cq, &j->cj)) {
        if (j->cj.status == 0) note_forward(w, &j->cj);
        forward_done(w, j);
        return;
    }
    compute_submit(w->cq, &j->cj);
    return;
oom:
    st_errf(&err, "worker: out of memory");
fail:
    if (j && j->hdr) {
        batch_error(w, j, err.msg);
    } else {
        ST_ERROR("worker: batch %llu dropped: %s", (unsigned long long)h->batch_id, err.msg);
    }
    job_free(w, j);
}

/* ---------------------------------------------------------------- results */

static void fwd_sent(xport_peer *peer, int status, void *arg)
{
    struct job *j = arg;
    wstage *w = j->w;
    w->sends_inflight--;
    if (status != 0)
        batch_error(w, j, "sending to the next hop failed (peer lost)");
    else
        w->backoff = BACKOFF_MIN_S;
    job_free(w, j);
}

static void send_tokens(wstage *w, struct job *j)
{
    const frame_header *c = j->hdr;
    size_t n = 0;
    for (size_t i = 0; i < c->n_seqs; i++) n += c->seqs[i]->wants_logits;
    if (!w->coord) {
        ST_WARN("worker: no coordinator connected; results of batch %llu dropped", (unsigned long long)c->batch_id);
        return;
    }
    if (n == 0) {
        Strata__V1__BatchDone d = STRATA__V1__BATCH_DONE__INIT;
        d.epoch = c->epoch;
        d.stage = w->cur.stage;
        d.batch_id = c->batch_id;
        d.n_tokens = j->cj.batch.n_tokens;
        ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
        m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_DONE;
        m.batch_done = &d;
        send_control(w, w->coord, &m, c->epoch, c->batch_id);
        return;
    }
    frame_result *res = calloc(n, sizeof *res);
    frame_result **resp = calloc(n, sizeof *resp);
    frame_top_logprob *top = calloc(n * SAMPLER_MAX_TOP_LOGPROBS, sizeof *top);
    frame_top_logprob **topp = calloc(n * SAMPLER_MAX_TOP_LOGPROBS, sizeof *topp);
    if (!res || !resp || !top || !topp) {
        batch_error(w, j, "worker: out of memory for results");
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < c->n_seqs; i++) {
        if (!c->seqs[i]->wants_logits) continue;
        const stage_sample_out *so = &j->samples[i];
        frame_result *r = &res[k];
        strata__v1__seq_result__init(r);
        r->seq_id = c->seqs[i]->seq_id;
        r->token = so->id;
        r->logprob = so->logprob;
        int nt = so->n_top < 0 ? 0 : so->n_top > SAMPLER_MAX_TOP_LOGPROBS ? SAMPLER_MAX_TOP_LOGPROBS : so->n_top;
        for (int t = 0; t < nt; t++) {
            frame_top_logprob *tp = &top[k * SAMPLER_MAX_TOP_LOGPROBS + t];
            strata__v1__top_logprob__init(tp);
            tp->token = so->top_ids[t];
            tp->logprob = so->top_logprobs[t];
            topp[k * SAMPLER_MAX_TOP_LOGPROBS + t] = tp;
        }
        r->top = &topp[k * SAMPLER_MAX_TOP_LOGPROBS];
        r->n_top = (size_t)nt;
        resp[k++] = r;
    }
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS;
    h.batch_id = c->batch_id;
    h.epoch = c->epoch;
    h.stage = w->cur.stage;
    h.results = resp;
    h.n_results = n;
    st_err err;
    if (xport_send(w->coord, &h, NULL, 0, NULL, NULL, NULL, &err)) batch_error(w, j, err.msg);
out:
    free(res);
    free(resp);
    free(top);
    free(topp);
}

static void forward_done(wstage *w, struct job *j)
{
    if (j->gen != w->gen || w->state != W_READY || w->shutting_down) {
        ST_DEBUG("worker: batch %llu of an older assignment finished; dropped", (unsigned long long)j->hdr->batch_id);
        job_free(w, j);
        return;
    }
    if (j->cj.status) {
        batch_error(w, j, j->cj.err.msg);
        job_free(w, j);
        return;
    }
    if (w->info.is_last) {
        send_tokens(w, j);
        job_free(w, j);
        return;
    }
    if (!w->next) {
        char msg[320];
        snprintf(msg, sizeof msg, "next hop %s is not connected", w->cur.next_hop);
        batch_error(w, j, msg);
        job_free(w, j);
        return;
    }
    frame_header h = *j->hdr; /* shallow: seqs (with sampling, step, history) go on unchanged */
    uint32_t shape[2] = {(uint32_t)j->cj.batch.n_tokens, (uint32_t)w->info.n_embd};
    h.stage = w->cur.stage + 1;
    h.token_ids = NULL;
    h.n_token_ids = 0;
    h.dtype = w->cur.act_dtype;
    h.shape = shape;
    h.n_shape = 2;
    h.n_results = 0;
    h.results = NULL;
    h.control.len = 0;
    h.control.data = NULL;
    st_err err;
    if (xport_send(w->next, &h, xport_mem_ptr(j->out_mem), j->out_bytes, j->out_mem, fwd_sent, j, &err)) {
        batch_error(w, j, err.msg);
        job_free(w, j);
        return;
    }
    w->sends_inflight++;
}

static void on_compute(evutil_socket_t fd, short what, void *arg)
{
    wstage *w = arg;
    cjob *list = compute_take_done(w->cq);
    while (list) {
        cjob *cj = list;
        list = cj->next;
        if (cj->kind == CJOB_OPEN) {
            open_done(w, cj->user);
        } else {
            if (cj->status == 0) note_forward(w, cj);
            forward_done(w, cj->user);
        }
    }
}

/* ---------------------------------------------------------------- transport callbacks */

static void on_connect(xport_peer *peer, bool inbound, void *ud)
{
    worker *w = ud;
    xport_peer_set_user(peer, w);
    ST_DEBUG("worker: %s peer %s", inbound ? "inbound" : "outbound", xport_peer_name(peer));
}

static void stage_on_disconnect(wstage *w, xport_peer *peer, const char *reason)
{
    if (peer == w->coord) {
        w->coord = NULL;
        ST_WARN("worker: coordinator %s disconnected (%s); keeping the stage", xport_peer_name(peer), reason);
    }
    if (peer == w->next) {
        w->next = NULL;
        if (w->shutting_down) return;
        ST_WARN("worker: next hop %s lost (%s); reconnecting in %.1f s", xport_peer_name(peer), reason, w->backoff);
        struct timeval tv = {(time_t)w->backoff, (suseconds_t)((w->backoff - (time_t)w->backoff) * 1e6)};
        evtimer_add(w->reconnect_ev, &tv);
        w->backoff = w->backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : w->backoff * 2;
    }
}

static void on_disconnect(xport_peer *peer, const char *reason, void *ud)
{
    worker *w = ud;
    for (wstage *st = w->stages; st; st = st->link) stage_on_disconnect(st, peer, reason);
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
        if (!st) st = w->stages;
        if (!st) {
            char msg[96];
            snprintf(msg, sizeof msg, "ACTIVATIONS (batch %llu) while no stage is ready", (unsigned long long)h->batch_id);
            front_unexpected(w, peer, msg);
            break;
        }
        if (w->track_load) note_load(w, h);
        handle_activations(st, peer, h, payload, bytes);
        break;
    }
    default: {
        char msg[64];
        snprintf(msg, sizeof msg, "frame kind %d is not for a worker", (int)h->kind);
        front_unexpected(w, peer, msg);
        break;
    }
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
    w->t_start = now_s();
    w->n_threads = o->n_threads;
    xport_callbacks cb = {.on_connect = on_connect, .on_disconnect = on_disconnect, .on_frame = on_frame, .ud = w};
    w->x = xport_create(base, o->listen_host, o->listen_port, &cb, err);
    if (!w->x) goto fail;
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

void worker_load_get(worker *w, worker_load *out)
{
    memset(out, 0, sizeof *out);
    w->track_load = true;
    xport_stats xs;
    xport_get_stats(w->x, &xs);
    out->bytes_sent = xs.bytes_sent;
    out->uptime_seconds = now_s() - w->t_start;
    for (wstage *st = w->stages; st; st = st->link) {
        compute_stats cs;
        compute_get_stats(st->cq, &cs);
        out->busy_seconds += cs.busy_seconds;
        if (st->state == W_READY && st->info.kv_blocks > out->kv_blocks) out->kv_blocks = st->info.kv_blocks;
        if (st->state == W_READY) out->n_stages++;
    }
    out->running_sequences = (uint32_t)w->n_load;
    for (int i = 0; i < w->n_load; i++) out->kv_blocks_used += (uint32_t)w->load_blocks[i];
    if (out->kv_blocks_used > (uint32_t)out->kv_blocks) out->kv_blocks_used = (uint32_t)out->kv_blocks;
    w->n_load = 0;
}

void worker_destroy(worker *w)
{
    if (!w) return;
    w->shutting_down = true;
    for (wstage *st = w->stages; st; st = st->link) stage_stop(st);
    for (wstage *st = w->stages; st; st = st->link) {
        for (int i = 0; i < st->n_pool; i++) xport_mem_unregister(st->x, st->pool[i]);
        st->n_pool = 0;
    }
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
    for (int i = 0; i < w->n_models; i++) free(w->models[i]);
    free(w->models);
    free(w);
}
