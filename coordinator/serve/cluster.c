/* cluster.c — the serving engine over worker processes: stage links
 * (connect, StageAssign/StageReady, StatsRequest/StageStats), the pump that
 * turns scheduler micro-batches into ACTIVATIONS frames, the TOKENS path
 * back to the sinks, and the engine interface. See cluster.h. The pieces it
 * owns are leaves: the requests (request_list.h), a token to its sink
 * (token_delivery.h), the batches in flight (inflight.h), each stage's
 * StageStats (stage_stats.h), the hang detection (hang_detect.h), the
 * static recovery's state machine (static_recovery.h), the batch frame
 * (batch_frame.h) and the counters that outlive a cluster (engine_totals.h). */
#include "coordinator/serve/cluster.h"

#include <event2/event.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/hop_trace.h"
#include "common/log.h"
#include "coordinator/serve/batch_frame.h"
#include "coordinator/serve/engine_totals.h"
#include "coordinator/serve/hang_detect.h"
#include "coordinator/serve/inflight.h"
#include "coordinator/serve/request_list.h"
#include "coordinator/serve/sched.h"
#include "coordinator/serve/seq_sampling.h"
#include "coordinator/serve/stage_link.h"
#include "coordinator/serve/stage_stats.h"
#include "coordinator/serve/static_recovery.h"
#include "coordinator/serve/token_delivery.h"
#include "ib/assign_token.h"
#include "ib/cluster_key.h"
#include "ib/frame.h"
#include "ib/transport.h"
#include "proto/stage.pb-c.h"

#define RETRY_S 0.25
#define DROPS_WARN 20 /* failed connections in a row before a stage is ready that get a warning (~5 s of tries) */
#define STATS_PERIOD_S 0.1
#define RETRY_PAUSE_S 0.3 /* hold mode: no launches this long after a BatchError */
#define MAX_BATCH_FAILURES 3 /* hold mode: failed batches in a row that end a sequence */
#define ADMIT_HEADROOM_BLOCKS 4 /* free blocks kept per running sequence at admission (sched.h) */

typedef Strata__V1__ControlMessage ctl_msg;

struct cluster {
    struct event_base *base;
    uint64_t epoch;     /* placement epoch of every frame (cluster_opts.epoch) */
    bool keep_loaded;   /* StageAssign.keep_loaded (live placement changes) */
    uint64_t adopt_epoch; /* StageAssign.adopt_epoch (a recovery; cluster_opts) */
    bool paused;        /* cluster_pause: no new micro-batches */
    const coord_config *cfg;
    const tok_vocab *vocab;
    int n_ctx;
    int n_stages;
    double ready_timeout_s;
    stage_link *links;
    const stage_stats **stage_views; /* &links[i].st, for the hang detection */
    xport *x;
    cluster_key *key;   /* cfg->cluster_key_file, loaded at create; NULL = none */
    struct event *retry_ev, *deadline_ev, *pump_ev, *stats_ev;
    void (*on_fatal)(void *, const char *);
    void (*on_ready)(void *);
    void (*on_lost)(void *, int, const char *); /* hold mode (cluster.h) */
    void *ud;
    engine_totals own_totals; /* when cluster_opts.totals is NULL */
    engine_totals *totals;    /* cluster_opts.totals, else &own_totals */
    /* Static recovery (cluster_opts.recover, cluster.h): a lost stage's
     * worker is reconnected and re-assigned, then the held requests resume
     * here by re-prefilling. */
    bool recover;
    static_recovery rec;
    uint64_t n_resumed, n_recomputed; /* coord_engine_stats */
    struct event *resume_ev; /* hold mode: the pause after a BatchError ends */
    bool retry_pause;        /* hold mode: no launches until resume_ev */
    bool ready, failed, lost;
    char lost_msg[ST_ERR_MSG_MAX];
    block_manager *kv;
    sched *s;
    sched_stats kv_folded;  /* the scheduler's counters already added to totals */
    int max_inflight;
    inflight_table fly;     /* launched batches and their round trips */
    double last_tick;       /* monotonic time of the previous stats poll (hang_check) */
    creq *reqs;
    uint64_t stats_req_id;
    uint64_t seed_counter;
    token_delivery delivery;
};

/* ---- helpers -------------------------------------------------------------- */

static void fatal(cluster *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fatal(cluster *c, const char *fmt, ...) {
    if (c->failed) return;
    c->failed = true;
    char msg[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ST_ERROR("cluster: %s", msg);
    if (c->on_fatal) c->on_fatal(c->ud, msg);
}

static void pump_soon(cluster *c) {
    if (c->pump_ev && c->ready && !c->lost && !c->paused && !c->retry_pause)
        event_active(c->pump_ev, 0, 0);
}

/* ---- the data path: micro-batches out, tokens back ----------------------- */

/* Adds what the scheduler counted since the last call to the totals. */
static void fold_kv_counters(cluster *c) {
    if (!c->s) return;
    sched_stats st;
    sched_stats_get(c->s, &st);
    engine_totals *t = c->totals;
    t->preemptions += st.preemptions - c->kv_folded.preemptions;
    t->prefix_query_tokens += st.prefix_query_tokens - c->kv_folded.prefix_query_tokens;
    t->prefix_hit_tokens += st.prefix_hit_tokens - c->kv_folded.prefix_hit_tokens;
    t->prefill_tokens += st.prefill_tokens - c->kv_folded.prefill_tokens;
    c->kv_folded = st;
}

static void pump_launch(cluster *c) {
    if (!c->ready || c->lost || !c->s || c->paused || c->retry_pause) return;
    const sched_batch *b;
    while ((b = sched_next_microbatch(c->s)) != NULL) {
        st_err err = {{0}};
        uint64_t t_launch = 0;
        if (batch_frame_send(c->links[0].peer, c->epoch, b, &t_launch, &err) != 0) {
            ST_WARN("cluster: sending batch %llu to stage 0 failed: %s",
                    (unsigned long long)b->id, err.msg[0] ? err.msg : "stage 0 not connected");
            sched_abort_batch(c->s, b->id, &err);
            return; /* the link's on_disconnect (or a later change) decides what next */
        }
        /* Prefill starts: tell the front ends that time (engine_api.h). */
        for (int i = 0; i < b->n_seqs; i++) {
            creq *r = b->seqs[i].user;
            if (b->seqs[i].pos == 0 && !r->scheduled) {
                r->scheduled = true;
                if (r->sink.on_scheduled) r->sink.on_scheduled(r->ctx);
            }
        }
        inflight_put(&c->fly, b, t_launch);
    }
}

static void pump(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    cluster *c = arg;
    pump_launch(c);
    fold_kv_counters(c);
}

static void on_resume(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    cluster *c = arg;
    c->retry_pause = false;
    pump_soon(c);
}

/* Hold mode: batch_id failed at a stage (fail). Its sequences go back to
 * their positions; after RETRY_PAUSE_S they are sent again, unless a stage is
 * lost meanwhile (the usual cause: the next hop of the stage that reported
 * died) or they failed MAX_BATCH_FAILURES times in a row. */
static void hold_failed_batch(cluster *c, uint64_t batch_id, const char *fail) {
    int slot = inflight_slot(&c->fly, batch_id);
    if (slot < 0) return; /* aborted already (a stage was lost) */
    const sched_batch *b = c->fly.batch[slot];
    int n = b->n_seqs;
    uint64_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    for (int i = 0; ids && i < n; i++) ids[i] = b->seqs[i].seq_id;
    st_err err = {{0}};
    sched_abort_batch(c->s, batch_id, &err);
    c->fly.batch[slot] = NULL;
    for (int i = 0; ids && i < n; i++) {
        creq *r = creq_find(c->reqs, ids[i]);
        if (!r || ++r->n_failed < MAX_BATCH_FAILURES) continue;
        sched_cancel(c->s, r->id);
        creq_finish(&c->reqs, r, COORD_FINISH_ERROR, fail);
    }
    free(ids);
    ST_WARN("cluster: batch %llu failed (%s); its sequences are sent again in %.1f s",
            (unsigned long long)batch_id, fail, RETRY_PAUSE_S);
    c->retry_pause = true;
    struct timeval tv = {0, (int)(RETRY_PAUSE_S * 1e6)};
    event_add(c->resume_ev, &tv);
}

/* Results of batch_id: res[n_res] (TOKENS), none (BatchDone), or fail
 * (BatchError: every sequence of the batch ends with ERROR). */
static void on_batch_result(cluster *c, uint64_t batch_id, frame_result **res, size_t n_res,
                            const char *fail) {
    st_hop_mark("result", batch_id, st_now_ns());
    if (!c->s) return;
    int slot = inflight_slot(&c->fly, batch_id);
    if (slot < 0) {
        if (c->lost) c->totals->fenced_frames++;
        ST_WARN("cluster: result for batch %llu, which is not in flight%s; dropped",
                (unsigned long long)batch_id, c->lost ? " (epoch lost: fenced)" : "");
        return;
    }
    const sched_batch *b = c->fly.batch[slot];
    int n = b->n_seqs;
    int32_t *sampled = malloc(sizeof *sampled * (size_t)n);
    const frame_result **match = calloc((size_t)n, sizeof *match);
    uint64_t *ids = malloc(sizeof *ids * (size_t)n);
    if (!sampled || !match || !ids) {
        free(sampled), free(match), free(ids);
        ST_ERROR("cluster: out of memory for batch %llu", (unsigned long long)batch_id);
        return;
    }
    for (int i = 0; i < n; i++) {
        sampled[i] = -1;
        ids[i] = b->seqs[i].seq_id;
        if (fail || !b->seqs[i].sample) continue;
        for (size_t k = 0; k < n_res; k++)
            if (res[k]->seq_id == b->seqs[i].seq_id) {
                sampled[i] = res[k]->token;
                match[i] = res[k];
                break;
            }
        if (!match[i])
            ST_WARN("cluster: batch %llu: no result for seq %llu", (unsigned long long)batch_id,
                    (unsigned long long)b->seqs[i].seq_id);
    }
    const sched_event *ev = NULL;
    int n_ev = 0;
    st_err err = {{0}};
    inflight_complete(&c->fly, slot, st_now_ns());
    if (sched_on_tokens(c->s, batch_id, sampled, n, &ev, &n_ev, &err) != 0) {
        ST_ERROR("cluster: %s", err.msg);
        n_ev = 0;
    }
    /* b is gone now; ids[] and match[] keep what is needed. */
    for (int e = 0; e < n_ev; e++) {
        creq *r = creq_find(c->reqs, ev[e].seq_id);
        if (!r) continue;
        const frame_result *fr = NULL;
        for (int i = 0; i < n; i++)
            if (ids[i] == ev[e].seq_id) fr = match[i];
        token_deliver(&c->delivery, r, &ev[e], fr);
    }
    if (fail) {
        /* Non-sampling slices (prefill chunks) of a failed batch: end them too. */
        for (int i = 0; i < n; i++) {
            creq *r = creq_find(c->reqs, ids[i]);
            if (!r) continue;
            sched_cancel(c->s, r->id);
            creq_finish(&c->reqs, r, COORD_FINISH_ERROR, fail);
        }
    }
    free(sampled);
    free(match);
    free(ids);
    /* The next micro-batch goes out now, from this callback, rather than in
     * another pass of the loop: the token writes to the HTTP clients queued
     * above then happen after it (the woken client would otherwise compete
     * with the next hop for the CPU). */
    pump(-1, 0, c);
}

/* ---- stage links ----------------------------------------------------------- */

static void send_assign(cluster *c, stage_link *l) {
    stage_assign_args a = {.epoch = c->epoch,
                           .keep_loaded = c->keep_loaded,
                           .adopt_epoch = c->adopt_epoch,
                           .n_stages = c->n_stages,
                           .model_path = cluster_worker_model(c->cfg),
                           .kv_blocks = c->cfg->kv_blocks,
                           .block_size = c->cfg->kv_block_size,
                           .act_bf16 = c->cfg->act_dtype == COORD_ACT_BF16,
                           .next = l->index + 1 < c->n_stages ? &c->links[l->index + 1] : NULL,
                           .key = c->key};
    stage_link_assign(l, &a);
}

static void all_ready(cluster *c) {
    int32_t blocks = c->cfg->kv_blocks;
    for (int i = 0; i < c->n_stages; i++)
        if (c->links[i].kv_blocks > 0 && c->links[i].kv_blocks < blocks) blocks = c->links[i].kv_blocks;
    st_err err = {{0}};
    c->kv = bm_new(blocks, c->cfg->kv_block_size, c->cfg->prefix_caching, &err);
    c->max_inflight = c->cfg->max_inflight > 0 ? c->cfg->max_inflight : c->n_stages;
    sched_config sc = {.n_stages = c->n_stages,
                       .max_inflight = c->max_inflight,
                       .max_queue = c->cfg->max_queue,
                       .max_seqs = c->cfg->max_seqs,
                       .prefill_chunk = c->cfg->prefill_chunk,
                       .max_batch_tokens = c->cfg->max_batch_tokens,
                       .n_ctx = c->n_ctx,
                       .eos_id = -1, /* end of generation is decided here (tok_is_eog, ignore_eos) */
                       .headroom_blocks = ADMIT_HEADROOM_BLOCKS};
    int fly_ok = inflight_init(&c->fly, c->max_inflight);
    if (c->kv) c->s = sched_create(&sc, c->kv, &err);
    if (!c->kv || !c->s || fly_ok != 0) {
        fatal(c, "cannot start the scheduler: %s", err.msg[0] ? err.msg : "out of memory");
        return;
    }
    c->delivery.s = c->s;
    c->ready = true;
    double t_ready = st_now_s();
    c->last_tick = t_ready;
    for (int i = 0; i < c->n_stages; i++) {
        stage_stats *st = &c->links[i].st;
        if (!st->have_stats) st->stats_at = t_ready;
        st->fwd_moved_at = t_ready;
    }
    if (c->deadline_ev) event_del(c->deadline_ev);
    struct timeval tv = {0, (int)(STATS_PERIOD_S * 1e6)};
    event_add(c->stats_ev, &tv);
    ST_INFO("cluster: all %d stages ready (epoch %d); KV cache %d blocks of %d tokens, prefix "
            "caching %s", c->n_stages, (int)c->epoch, (int)blocks, c->cfg->kv_block_size,
            c->cfg->prefix_caching ? "on" : "off");
    if (c->on_ready) c->on_ready(c->ud);
}


/* ---- static recovery: the actions of static_recovery.h ------------------ */

/* Closes stage's connection (if any) and reconnects it from connect_missing. */
static void rec_relink(void *ud, int stage) {
    cluster *c = ud;
    stage_link_close(&c->links[stage]);
    struct timeval tv = {0, (int)(RETRY_S * 1e6)};
    event_add(c->retry_ev, &tv);
}

/* The returned stage(s) are loaded: every stage is sent its StageAssign
 * again (the survivors answer at once, "already loaded", and reconnect their
 * next hop now rather than after its back-off). */
static void rec_reassign_all(void *ud) {
    cluster *c = ud;
    for (int i = 0; i < c->n_stages; i++)
        if (c->links[i].peer) send_assign(c, &c->links[i]);
}

static void rec_expire(void *ud, double timeout_s) {
    cluster *c = ud;
    char ids[512], msg[ST_ERR_MSG_MAX + 128];
    snprintf(msg, sizeof msg, "the cluster could not recover within %.0f s (recovery_timeout) from: %s",
             timeout_s, c->lost_msg);
    ST_ERROR("cluster: recovery: %s; failing %d request(s) %s; still waiting for the stage "
             "(/health stays 503)", msg, cluster_n_requests(c), creq_ids_text(c->reqs, ids, sizeof ids));
    creq_fail_all(&c->reqs, c->s, msg);
    size_t n = strlen(msg) < sizeof c->lost_msg - 1 ? strlen(msg) : sizeof c->lost_msg - 1;
    memcpy(c->lost_msg, msg, n);
    c->lost_msg[n] = '\0';
}

/* Every stage is ready again: resume. The KV cache of the held sequences is
 * given up everywhere: each is cancelled in the scheduler (its blocks go back
 * to the pool; the workers keep no per-sequence state, the block table
 * travels with every batch, so blocks reused later are simply overwritten)
 * and added again with its prompt plus the tokens generated so far, with the
 * same sink, seed and step (greedy and seeded output are unchanged). */
static void rec_resume(void *ud, double since_loss_s) {
    cluster *c = ud;
    double t = st_now_s();
    creq *held = c->reqs;
    c->reqs = NULL;
    for (creq *r = held; r; r = r->next) sched_cancel(c->s, r->id);
    sched_reset_prefix_cache(c->s); /* the restarted stage's KV cache is empty */
    int64_t n_tok = 0;
    int n_ok = creq_requeue_all(&held, NULL, &c->reqs, c->s, c->n_ctx, "cannot resume the sequence after recovery",
                                NULL, NULL, &n_tok);
    c->n_resumed += (uint64_t)n_ok;
    c->n_recomputed += (uint64_t)n_tok;
    engine_totals_note_resume(c->totals, since_loss_s);
    char ids[512];
    ST_INFO("cluster: recovery: every stage is ready again %.2f s after the loss (%s); resumed %d "
            "request(s) %s by re-prefilling %lld token(s)",
            since_loss_s, c->lost_msg, n_ok, creq_ids_text(c->reqs, ids, sizeof ids), (long long)n_tok);
    c->lost = false;
    c->lost_msg[0] = '\0';
    c->retry_pause = false;
    event_del(c->resume_ev);
    /* The hang detection starts afresh: no stage is stale now. */
    c->last_tick = t;
    for (int i = 0; i < c->n_stages; i++) stage_stats_restart_clock(&c->links[i].st, t);
    struct timeval tv = {0, (int)(STATS_PERIOD_S * 1e6)};
    event_add(c->stats_ev, &tv);
    pump_soon(c);
}

static void stage_lost(cluster *c, stage_link *l, const char *msg);

static void on_control(cluster *c, stage_link *l, const frame_header *h) {
    ctl_msg *m = strata__v1__control_message__unpack(NULL, h->control.len, h->control.data);
    if (!m) {
        ST_WARN("cluster: undecodable CONTROL from stage %d (%s:%d); dropped", l->index, l->host,
                l->port);
        return;
    }
    switch (m->msg_case) {
    case STRATA__V1__CONTROL_MESSAGE__MSG_READY: {
        const Strata__V1__StageReady *r = m->ready;
        if (r->epoch != c->epoch || r->stage != (uint32_t)l->index) {
            ST_WARN("cluster: StageReady for epoch %llu stage %u from %s:%d; dropped",
                    (unsigned long long)r->epoch, r->stage, l->host, l->port);
            break;
        }
        if (!r->ok && static_recovery_active(&c->rec)) {
            /* Static recovery: the returning worker could not load; try again. */
            ST_WARN("cluster: stage %d at %s:%d failed to load while recovering: %s; retrying",
                    l->index, l->host, l->port, r->error && r->error[0] ? r->error : "(no reason)");
            static_recovery_load_failed(&c->rec, l->index);
            break;
        }
        if (!r->ok) {
            fatal(c, "stage %d at %s:%d failed to load: %s", l->index, l->host, l->port,
                  r->error && r->error[0] ? r->error : "(no reason given)");
            break;
        }
        if (l->state == LINK_READY) break;
        stage_link_ready(l, r);
        int n_ready = cluster_ready_stages(c);
        if (n_ready == c->n_stages && !c->ready && !c->failed) all_ready(c);
        else if (n_ready == c->n_stages && static_recovery_active(&c->rec)) static_recovery_all_ready(&c->rec);
        break;
    }
    case STRATA__V1__CONTROL_MESSAGE__MSG_STATS:
        stage_stats_apply(&l->st, m->stats, st_now_s());
        break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_DONE:
        if (l->index == c->n_stages - 1 && m->batch_done->epoch == c->epoch)
            on_batch_result(c, m->batch_done->batch_id, NULL, 0, NULL);
        else if (m->batch_done->epoch != c->epoch)
            c->totals->fenced_frames++;
        break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_ERROR: {
        char msg[ST_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "stage %u failed the batch: %s", m->batch_error->stage,
                 m->batch_error->error ? m->batch_error->error : "");
        ST_WARN("cluster: batch %llu: %s", (unsigned long long)m->batch_error->batch_id, msg);
        if (m->batch_error->epoch != c->epoch || c->lost) {
            c->totals->fenced_frames++;
            break;
        }
        if (m->batch_error->stage_failed && c->ready) {
            /* Not this batch only: the stage is gone (an aborted communicator). */
            char lost[ST_ERR_MSG_MAX + 64];
            snprintf(lost, sizeof lost, "stage %d at %s:%d failed (%s)", l->index, l->host, l->port,
                     m->batch_error->error ? m->batch_error->error : "");
            stage_lost(c, l, lost);
            break;
        }
        if ((c->on_lost || c->recover) && c->s)
            hold_failed_batch(c, m->batch_error->batch_id, msg);
        else
            on_batch_result(c, m->batch_error->batch_id, NULL, 0, msg);
        break;
    }
    default:
        ST_WARN("cluster: unexpected CONTROL message %d from stage %d; dropped", (int)m->msg_case,
                l->index);
    }
    strata__v1__control_message__free_unpacked(m, NULL);
}

static void x_on_connect(xport_peer *peer, bool inbound, void *ud) {
    cluster *c = ud;
    stage_link *l = xport_peer_user(peer);
    if (inbound || !l) {
        ST_WARN("cluster: unexpected inbound peer %s; closing", xport_peer_name(peer));
        xport_peer_close(peer);
        return;
    }
    bool recovering = static_recovery_active(&c->rec);
    if (l->state == LINK_DOWN || (recovering && l->state == LINK_LOST)) {
        if (recovering)
            ST_INFO("cluster: stage %d's worker %s:%d is reachable again; re-assigning its stage",
                    l->index, l->host, l->port);
        send_assign(c, l);
    }
}

/* Stage l of the ready cluster is lost (its connection dropped, or it hung:
 * hang_check): the batches in flight are aborted, then hold mode calls
 * on_lost, the static mode fails every request. */
static void stage_lost(cluster *c, stage_link *l, const char *msg) {
    engine_totals_note_detection(c->totals, st_now_s() - l->st.stats_at); /* since its last sign of life */
    c->lost = true;
    snprintf(c->lost_msg, sizeof c->lost_msg, "%s", msg);
    if (c->on_lost)
        ST_ERROR("cluster: %s (epoch %d); %d request(s) held for recovery", c->lost_msg,
                 (int)c->epoch, cluster_n_requests(c));
    else if (!c->recover)
        ST_ERROR("cluster: %s; serving stops (restart the coordinator)", c->lost_msg);
    l->state = LINK_LOST;
    inflight_abort_all(&c->fly, c->s);
    if (c->on_lost) {
        c->on_lost(c->ud, l->index, c->lost_msg);
    } else if (c->recover) {
        char ids[512];
        ST_ERROR("cluster: recovery: %s; holding %d request(s) %s; reconnecting to %s:%d (requests "
                 "wait up to %.0f s, recovery_timeout)",
                 c->lost_msg, cluster_n_requests(c), creq_ids_text(c->reqs, ids, sizeof ids), l->host, l->port,
                 c->rec.timeout_s);
        static_recovery_lost(&c->rec, l->index);
    } else {
        creq_fail_all(&c->reqs, c->s, c->lost_msg);
    }
}

static void x_on_disconnect(xport_peer *peer, const char *reason, void *ud) {
    cluster *c = ud;
    stage_link *l = xport_peer_user(peer);
    if (!l || l->peer != peer) return;
    l->peer = NULL;
    snprintf(l->last_error, sizeof l->last_error, "%s", reason ? reason : "?");
    if (l->state != LINK_READY && ++l->drops == DROPS_WARN)
        /* Said once: a worker whose connections keep dying while it is
         * otherwise alive (docs/recovery.md, "What is not recovered (yet)"). */
        ST_WARN("cluster: stage %d at %s:%d: %d connections in a row failed before the stage was ready "
                "(last: %s); still retrying every %.2f s. If the node's heartbeats arrive, its data plane "
                "(UCX) is what fails, not the node", l->index, l->host, l->port, l->drops, l->last_error, RETRY_S);
    if (c->ready && !c->lost) {
        char msg[ST_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "stage %d at %s:%d was lost (%s)", l->index, l->host, l->port,
                 reason ? reason : "?");
        stage_lost(c, l, msg);
        return;
    }
    if (static_recovery_active(&c->rec)) { /* a reconnect attempt failed, or another stage dropped meanwhile */
        ST_DEBUG("cluster: stage %d at %s:%d not reachable (%s); retrying", l->index, l->host,
                 l->port, reason ? reason : "?");
        if (l->state != LINK_LOST) static_recovery_stage_dropped(&c->rec);
        l->state = LINK_LOST;
        struct timeval tv = {0, (int)(RETRY_S * 1e6)};
        event_add(c->retry_ev, &tv);
        return;
    }
    if (c->failed || c->ready) return;
    ST_DEBUG("cluster: stage %d at %s:%d not reachable yet (%s); retrying", l->index, l->host,
             l->port, reason ? reason : "?");
    l->state = LINK_DOWN;
    struct timeval tv = {0, (int)(RETRY_S * 1e6)};
    event_add(c->retry_ev, &tv);
}

static void x_on_frame(xport_peer *peer, const frame_header *h, const void *payload,
                       size_t payload_bytes, void *ud) {
    cluster *c = ud;
    stage_link *l = xport_peer_user(peer);
    if (!l) return;
    switch (h->kind) {
    case STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL: on_control(c, l, h); break;
    case STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS:
        if (l->index != c->n_stages - 1 || h->epoch != c->epoch) {
            if (h->epoch != c->epoch) c->totals->fenced_frames++;
            ST_WARN("cluster: TOKENS from stage %d (epoch %llu); dropped", l->index,
                    (unsigned long long)h->epoch);
            break;
        }
        on_batch_result(c, h->batch_id, h->results, h->n_results, NULL);
        break;
    default:
        ST_WARN("cluster: unexpected frame kind %d from stage %d; dropped", (int)h->kind, l->index);
    }
}

static void connect_missing(evutil_socket_t fd, short what, void *arg) {
    cluster *c = arg;
    if (c->failed || (c->ready && !static_recovery_active(&c->rec))) return;
    for (int i = 0; i < c->n_stages; i++) {
        stage_link *l = &c->links[i];
        if (l->peer) continue;
        st_err err = {{0}};
        l->peer = xport_connect(c->x, l->host, l->port, &err);
        if (!l->peer) {
            ST_DEBUG("cluster: connect to %s:%d: %s", l->host, l->port, err.msg);
            struct timeval tv = {0, (int)(RETRY_S * 1e6)};
            event_add(c->retry_ev, &tv);
            continue;
        }
        xport_peer_set_user(l->peer, l);
    }
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
    cluster *c = arg;
    if (c->ready || c->failed) return;
    for (int i = 0; i < c->n_stages; i++) {
        stage_link *l = &c->links[i];
        if (l->state == LINK_READY) continue;
        fatal(c, "stage %d at %s:%d is %s after %.0f s (%d connection(s) failed%s%s)", i, l->host, l->port,
              l->state == LINK_ASSIGNED ? "connected but not ready" : "unreachable", c->ready_timeout_s, l->drops,
              l->last_error[0] ? "; last: " : "", l->last_error);
        return;
    }
}

static void on_stats_timer(evutil_socket_t fd, short what, void *arg) {
    cluster *c = arg;
    if (!c->ready || c->lost) return;
    char why[256];
    int hung = hang_check(&c->fly, c->stage_views, c->n_stages, &c->last_tick, why, sizeof why);
    if (hung >= 0) {
        stage_link *l = &c->links[hung];
        char msg[ST_ERR_MSG_MAX + 96];
        snprintf(msg, sizeof msg, "stage %d at %s:%d hung (%s)", l->index, l->host, l->port, why);
        /* The connection stays open until the cluster is destroyed (a stopped
         * peer's late frames carry this epoch: the next one fences them). */
        stage_lost(c, l, msg);
        return;
    }
    for (int i = 0; i < c->n_stages; i++) stage_link_request_stats(&c->links[i], c->epoch, ++c->stats_req_id);
    struct timeval tv = {0, (int)(STATS_PERIOD_S * 1e6)};
    event_add(c->stats_ev, &tv);
}

/* ---- the engine interface ------------------------------------------------- */

static int eng_submit(void *impl, const coord_request *req, const coord_sink *sink, void *ctx,
                      uint64_t *id_out, st_err *err) {
    cluster *c = impl;
    if (c->lost && !c->on_lost && !static_recovery_holding(&c->rec))
        return st_errf(err, "%s", c->lost_msg), COORD_EUNAVAIL;
    if (!c->ready) return st_errf(err, "the cluster is not ready (stages are loading)"), COORD_EUNAVAIL;
    creq *r = NULL;
    int max_new = 0;
    uint64_t seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + ++c->seed_counter;
    int code = creq_create(req, sink, ctx, seed, c->n_ctx, c->s, &r, &max_new, err);
    if (code != COORD_OK) return code;
    int rc = sched_add(c->s, r->prompt, r->n_prompt, max_new, r, &r->id, err);
    if (rc != 0) {
        creq_free(r);
        return rc == SCHED_EFULL ? COORD_EBUSY : COORD_EINVAL;
    }
    creq_push(&c->reqs, r);
    *id_out = r->id;
    pump_soon(c);
    return COORD_OK;
}

static void eng_cancel(void *impl, uint64_t id) {
    cluster *c = impl;
    creq *r = creq_find(c->reqs, id);
    if (!r) return;
    if (c->s) sched_cancel(c->s, id);
    creq_unlink(&c->reqs, r);
    if (r->in_cb)
        r->dead = true;
    else
        creq_free(r);
    pump_soon(c);
}

static int eng_health(void *impl, st_err *err) {
    cluster *c = impl;
    if (static_recovery_holding(&c->rec))
        return st_errf(err, "recovering from: %s (requests are held until recovery_timeout)",
                       c->lost_msg);
    if (c->lost) return st_errf(err, "%s", c->lost_msg);
    if (c->failed) return st_errf(err, "the cluster failed to start");
    if (!c->ready) return st_errf(err, "%d of %d stages ready", cluster_ready_stages(c), c->n_stages);
    return 0;
}

static char *eng_stages_json(void *impl) {
    cluster *c = impl;
    sched_stats st = {0};
    if (c->s) sched_stats_get(c->s, &st);
    json_t *stages = json_array();
    for (int i = 0; i < c->n_stages; i++) json_array_append_new(stages, stage_link_json(&c->links[i]));
    json_t *root = json_pack(
        "{s:b,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:I,s:I,s:f,s:o,s:o}", "ready", c->ready && !c->lost, "epoch",
        (int)c->epoch, "n_ctx", c->n_ctx, "kv_block_size", c->cfg->kv_block_size, "kv_blocks_total", (int)st.n_blocks,
        "kv_blocks_free", (int)st.blocks_free, "requests_waiting", st.n_waiting,
        "requests_running", st.n_running, "batches_in_flight", st.n_inflight,
        "batches_launched", (json_int_t)st.batches_launched, "tokens_launched",
        (json_int_t)st.tokens_launched, "batch_round_trip_ms",
        c->fly.rtt_n ? 1e3 * c->fly.rtt_sum / (double)c->fly.rtt_n : 0.0, "batch_intervals",
        inflight_intervals_json(&c->fly), "stages", stages);
    fold_kv_counters(c);
    const engine_totals *t = c->totals;
    json_t *kv = json_pack("{s:b,s:i,s:f,s:i,s:I,s:I,s:I,s:I,s:I}", "prefix_caching",
                           c->cfg->prefix_caching, "blocks_cached", (int)st.blocks_cached,
                           "usage", st.n_blocks ? (double)st.blocks_used / st.n_blocks : 0.0,
                           "preempted_waiting", st.n_preempted_waiting, "preemptions",
                           (json_int_t)t->preemptions, "prefix_cache_query_tokens",
                           (json_int_t)t->prefix_query_tokens, "prefix_cache_hit_tokens",
                           (json_int_t)t->prefix_hit_tokens, "prefill_tokens",
                           (json_int_t)t->prefill_tokens, "evictions", (json_int_t)st.evictions);
    if (root && kv) json_object_set_new(root, "kv", kv);
    else json_decref(kv);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

/* GET /metrics (engine_api.h). Workers: the configured stages' workers
 * (named by their StageStats, else the config), "serving" while their stage
 * is ready, heartbeat age = time since their latest StageStats. Hook: when
 * the registry tracks workers, it reports their own states and heartbeats. */
static void eng_stats(void *impl, coord_engine_stats *out) {
    cluster *c = impl;
    memset(out, 0, sizeof *out);
    sched_stats st = {0};
    if (c->s) sched_stats_get(c->s, &st);
    out->queue_depth = st.n_waiting;
    out->running = st.n_running;
    out->kv_blocks_used = (int)st.blocks_used;
    out->kv_blocks_free = (int)st.blocks_free;
    out->kv_blocks_total = (int)st.n_blocks;
    out->kv_blocks_cached = (int)st.blocks_cached;
    fold_kv_counters(c);
    engine_totals_report(c->totals, out);
    out->epoch = c->ready ? c->epoch : 0;
    out->recoveries = c->rec.n_recoveries;
    out->sequences_resumed = c->n_resumed;
    out->tokens_recomputed = c->n_recomputed;
    double now = st_now_s();
    out->workers = calloc((size_t)(c->n_stages ? c->n_stages : 1), sizeof *out->workers);
    for (int i = 0; i < c->n_stages && i < COORD_STATS_MAX_STAGES; i++) {
        stage_link_report(&c->links[i], c->cfg->stages[i].name, c->ready && !c->lost, now, &out->stages[i],
                          out->workers ? &out->workers[i] : NULL);
        out->n_stages = i + 1;
        if (out->workers) out->n_workers = i + 1;
    }
}

static const coord_engine_ops cluster_ops = {eng_submit, eng_cancel, eng_health, eng_stages_json,
                                             eng_stats, NULL};

coord_engine cluster_engine(cluster *c) {
    coord_engine e = {&cluster_ops, c};
    return e;
}

/* ---- lifetime ------------------------------------------------------------- */

const char *cluster_worker_model(const coord_config *cfg) {
    if (cfg->worker_model) return cfg->worker_model;
    const char *slash = strrchr(cfg->model, '/');
    return slash ? slash + 1 : cfg->model;
}

int cluster_check_key(const coord_config *cfg, st_err *err) {
    if (!cfg->cluster_key_file) return 0;
    cluster_key *k = cluster_key_load(cfg->cluster_key_file, err);
    cluster_key_free(k);
    return k ? 0 : -1;
}

cluster *cluster_create(struct event_base *base, const cluster_opts *o, st_err *err) {
    if (!base || !o || !o->cfg || !o->ranges || !o->vocab || o->cfg->n_stages < 1 || o->n_ctx < 2)
        return (void)st_errf(err, "cluster: bad options"), NULL;
    cluster *c = calloc(1, sizeof *c);
    if (!c) return (void)st_errf(err, "cluster: out of memory"), NULL;
    c->base = base;
    c->cfg = o->cfg;
    c->vocab = o->vocab;
    c->n_ctx = o->n_ctx;
    c->n_stages = o->cfg->n_stages;
    c->on_fatal = o->on_fatal;
    c->on_ready = o->on_ready;
    c->on_lost = o->on_lost;
    c->recover = o->recover && !o->on_lost;
    c->totals = o->totals ? o->totals : &c->own_totals;
    c->epoch = o->epoch ? o->epoch : 1;
    c->keep_loaded = o->keep_loaded;
    c->adopt_epoch = o->adopt_epoch;
    c->ud = o->ud;
    c->delivery.vocab = o->vocab;
    c->delivery.reqs = &c->reqs;
    c->delivery.piece_cap = tok_max_piece_len(o->vocab) + 1;
    c->delivery.piece_buf = malloc(c->delivery.piece_cap + 1);
    c->links = calloc((size_t)c->n_stages, sizeof *c->links);
    c->stage_views = calloc((size_t)c->n_stages, sizeof *c->stage_views);
    if (!c->delivery.piece_buf || !c->links || !c->stage_views) {
        st_errf(err, "cluster: out of memory");
        goto fail;
    }
    for (int i = 0; i < c->n_stages; i++) {
        stage_link *l = &c->links[i];
        l->index = i;
        snprintf(l->host, sizeof l->host, "%s", o->cfg->stages[i].host);
        l->port = o->cfg->stages[i].port;
        l->tp = o->cfg->stages[i].tp;
        snprintf(l->backend, sizeof l->backend, "%s", o->cfg->stages[i].backend);
        l->range = o->ranges[i];
        c->stage_views[i] = &l->st;
        if (stage_stats_init(&l->st) != 0) {
            st_errf(err, "cluster: out of memory");
            goto fail;
        }
    }
    if (o->cfg->cluster_key_file && !(c->key = cluster_key_load(o->cfg->cluster_key_file, err))) goto fail;
    xport_callbacks cb = {x_on_connect, x_on_disconnect, x_on_frame, c};
    c->x = xport_create(base, NULL, 0, &cb, err);
    if (!c->x) goto fail;
    if (c->key) xport_require_auth(c->x, c->key, XPORT_ROLE_COORDINATOR, 0);
    c->retry_ev = evtimer_new(base, connect_missing, c);
    c->deadline_ev = evtimer_new(base, on_deadline, c);
    c->pump_ev = event_new(base, -1, 0, pump, c);
    c->stats_ev = evtimer_new(base, on_stats_timer, c);
    c->resume_ev = evtimer_new(base, on_resume, c);
    static_recovery_ops rec_ops = {rec_relink, rec_reassign_all, rec_resume, rec_expire, c};
    int rec_rc = static_recovery_init(&c->rec, base, o->recovery_timeout_s, &rec_ops);
    if (!c->retry_ev || !c->deadline_ev || !c->pump_ev || !c->stats_ev || !c->resume_ev || rec_rc != 0) {
        st_errf(err, "cluster: cannot create events");
        goto fail;
    }
    double t = o->ready_timeout_s > 0 ? o->ready_timeout_s : 60.0;
    c->ready_timeout_s = t;
    struct timeval dl = {(time_t)t, (int)((t - (double)(time_t)t) * 1e6)};
    event_add(c->deadline_ev, &dl);
    struct timeval now = {0, 0};
    event_add(c->retry_ev, &now);
    return c;
fail:
    cluster_destroy(c);
    return NULL;
}

void cluster_destroy(cluster *c) {
    if (!c) return;
    while (c->reqs) {
        creq *r = c->reqs;
        creq_unlink(&c->reqs, r);
        creq_free(r);
    }
    if (c->x) xport_destroy(c->x);
    cluster_key_free(c->key);
    if (c->retry_ev) event_free(c->retry_ev);
    if (c->deadline_ev) event_free(c->deadline_ev);
    if (c->pump_ev) event_free(c->pump_ev);
    if (c->stats_ev) event_free(c->stats_ev);
    if (c->resume_ev) event_free(c->resume_ev);
    static_recovery_free(&c->rec);
    fold_kv_counters(c);
    sched_destroy(c->s);
    bm_free(c->kv);
    inflight_free(&c->fly);
    for (int i = 0; c->links && i < c->n_stages; i++) stage_stats_free(&c->links[i].st);
    free(c->links);
    free(c->stage_views);
    free(c->delivery.piece_buf);
    free(c);
}

/* ---- live placement changes (coordinator/control/epochs.c) ---------------------- */

void cluster_pause(cluster *c) { c->paused = true; }

int cluster_inflight(const cluster *c) { return inflight_count(&c->fly); }

bool cluster_is_ready(const cluster *c) { return c->ready && !c->lost && !c->failed; }

uint64_t cluster_epoch(const cluster *c) { return c->epoch; }

int cluster_ready_stages(const cluster *c) {
    int n = 0;
    for (int i = 0; i < c->n_stages; i++) n += c->links[i].state == LINK_READY;
    return n;
}

bool cluster_stage_ready(const cluster *c, int i) {
    return i >= 0 && i < c->n_stages && c->links[i].state == LINK_READY;
}

int cluster_n_requests(const cluster *c) { return creq_count(c->reqs, NULL, 0, NULL); }

void cluster_release_workers(cluster *c) {
    for (int i = 0; i < c->n_stages; i++) stage_link_release(&c->links[i], c->epoch);
}

int cluster_move_requests(cluster *from, cluster *to,
                          void (*on_moved)(void *ud, uint64_t old_id, uint64_t new_id), void *ud) {
    /* Re-prefill: the prompt and every token generated so far; the KV cache
     * of each sequence stays behind on the old stages. */
    int moved = creq_requeue_all(&from->reqs, from->s, &to->reqs, to->s, to->n_ctx,
                                 "cannot move the sequence to the new placement", on_moved, ud, NULL);
    pump_soon(to);
    return moved;
}

/* ---- recovery (hold mode) ------------------------------------------------- */

bool cluster_is_lost(const cluster *c) { return c->lost; }

int cluster_request_ids(const cluster *c, uint64_t *ids, int cap, int64_t *tokens) {
    return creq_count(c->reqs, ids, cap, tokens);
}

void cluster_fail_requests(cluster *c, const char *message) { creq_fail_all(&c->reqs, c->s, message); }

void cluster_stage_leaving(cluster *c, int i, const char *message) {
    if (!c->ready || c->lost || i < 0 || i >= c->n_stages) return;
    stage_lost(c, &c->links[i], message);
}
