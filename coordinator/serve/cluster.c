/* cluster.c — the serving engine over worker processes: stage links
 * (connect, StageAssign/StageReady, StatsRequest/StageStats), the pump that
 * turns scheduler micro-batches into ACTIVATIONS frames, and the TOKENS path
 * back to the HTTP sink. See cluster.h. */
#include "coordinator/serve/cluster.h"
#include "coordinator/serve/seq_sampling.h"

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
#include "coordinator/serve/sched.h"
#include "ib/assign_token.h"
#include "ib/cluster_key.h"
#include "ib/frame.h"
#include "ib/transport.h"
#include "proto/stage.pb-c.h"

#define RETRY_S 0.25
#define DROPS_WARN 20 /* failed connections in a row before a stage is ready that get a warning (~5 s of tries) */
#define STATS_PERIOD_S 0.1
#define FWD_KEEP 1024 /* forward intervals kept per stage for GET /v1/stages */
#define BATCH_KEEP 1024 /* micro-batch round trips kept for GET /v1/stages */
#define RETRY_PAUSE_S 0.3 /* hold mode: no launches this long after a BatchError */
#define MAX_BATCH_FAILURES 3 /* hold mode: failed batches in a row that end a sequence */
#define ADMIT_HEADROOM_BLOCKS 4 /* free blocks kept per running sequence at admission (sched.h) */
/* Hang detection (docs/recovery.md, "What is detected"): a micro-batch that
 * has not come back within its bound, max(HANG_FLOOR_S, HANG_MULT x the
 * expected round trip), makes the cluster look for a hung stage (find_hung);
 * the expected round trip is the larger of the moving average of recent
 * round trips and the moving average of the time per batch token times the
 * batch's tokens (a long prefill chunk after many short decode steps is not
 * a hang). Before any round trip was measured the bound is HANG_COLD_S (a
 * first prefill of a large model may take long). RTT_EWMA_ALPHA: the weight
 * of each new round trip in the averages. */
#define HANG_FLOOR_S 2.0
#define HANG_MULT 20.0
#define HANG_COLD_S 10.0
#define RTT_EWMA_ALPHA 0.1
/* No verdict at a poll that comes this long after the previous one (the
 * coordinator itself was not scheduled; the stages' replies wait unread). */
#define HANG_STALL_S 0.5

typedef Strata__V1__ControlMessage ctl_msg;

/* Frames fenced by every cluster of this process (coord_engine_stats
 * .fenced_frames): results of another epoch, and results that arrive after
 * the cluster lost a stage (a hung stage that continues: SIGCONT, a healed
 * partition). Loop thread only. */
static uint64_t g_fenced_frames;
/* The scheduler's KV counters summed over every cluster (placement epoch) of
 * the process, so that /metrics counters never go back when an epoch ends. */
static struct {
    uint64_t preemptions, prefix_query_tokens, prefix_hit_tokens, prefill_tokens;
} g_kv;

/* Recovery timings of every cluster of this process (coord_engine_stats
 * .detection_s / .resume_s rings, filled by cluster_recovery_times). */
static uint64_t g_n_detect, g_n_resume;
static double g_detect[COORD_RECOVERY_KEEP], g_resume[COORD_RECOVERY_KEEP];

void cluster_note_resumed(double seconds) { g_resume[g_n_resume++ % COORD_RECOVERY_KEEP] = seconds; }

void cluster_recovery_times(coord_engine_stats *out) {
    out->n_detections = g_n_detect;
    out->n_resumes = g_n_resume;
    memcpy(out->detection_s, g_detect, sizeof g_detect);
    memcpy(out->resume_s, g_resume, sizeof g_resume);
}

enum link_state { LINK_DOWN, LINK_ASSIGNED, LINK_READY, LINK_LOST };

typedef struct stage_link {
    cluster *c;
    int index;
    char host[COORD_HOST_MAX];
    int port;
    int tp;
    char backend[16]; /* StageAssign.backend: "" (cpu) or "cuda" */
    place_range range;
    xport_peer *peer;
    enum link_state state;
    char last_error[160];     /* why the last connection failed (the start-up deadline's message) */
    int drops;                /* connections in a row that failed before the stage was ready */
    int kv_blocks;
    /* latest StageStats */
    bool have_stats;
    double busy_s, uptime_s;
    uint64_t forwards, tokens;
    uint32_t queue_depth;
    uint64_t bytes_sent, frames_sent; /* the worker's transport counters */
    uint64_t dropped_frames, fenced_frames; /* frames the worker dropped; of them, of an older epoch */
    char worker_name[COORD_NAME_LEN];
    double stats_at;                  /* monotonic time of the latest StageStats */
    double fwd_moved_at;              /* monotonic time `forwards` last changed (hang detection) */
    /* GET /metrics busy ratio: over windows of >= 1 s of worker uptime */
    double win_busy_s, win_uptime_s, busy_ratio;
    /* snapshot at the previous stages_json */
    double prev_busy_s, prev_uptime_s;
    /* the stage's last FWD_KEEP forward intervals (StageStats.forward_ns):
     * [start, end) CLOCK_MONOTONIC ns, fwd_n received in all, the next one
     * goes to fwd[fwd_n % FWD_KEEP]; fwd_last_end = the newest end (the next
     * StatsRequest asks for intervals ending after it) */
    uint64_t (*fwd)[2];
    uint64_t fwd_n, fwd_last_end;
    /* GET /metrics (coord_stage_stats): forward durations, hops, load time */
    uint64_t fwd_buckets[COORD_FWD_N_BOUNDS + 1];
    double fwd_sum_s;
    uint64_t hops;
    double hop_sum_s, load_seconds;
} stage_link;

/* One request (the scheduler's `user`). */
typedef struct creq {
    struct creq *prev, *next;
    uint64_t id; /* the scheduler's sequence id */
    coord_request req; /* req.prompt points to prompt */
    coord_sink sink;
    void *ctx;
    int32_t *prompt;
    int n_prompt;
    int32_t *gen; /* generated tokens (penalty history) */
    int n_gen, cap_gen;
    uint64_t seed;
    bool prompt_sent;
    bool scheduled; /* sink.on_scheduled was called (its first batch went out) */
    int n_failed; /* hold mode: its batches that failed in a row (BatchError) */
    bool in_cb;   /* a sink callback of this request is running */
    bool dead;    /* cancelled from inside a callback: free after it returns */
} creq;

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
    xport *x;
    cluster_key *key;   /* cfg->cluster_key_file, loaded at create; NULL = none */
    struct event *retry_ev, *deadline_ev, *pump_ev, *stats_ev;
    void (*on_fatal)(void *, const char *);
    void (*on_ready)(void *);
    void (*on_lost)(void *, int, const char *); /* hold mode (cluster.h) */
    void *ud;
    /* Static recovery (cluster_opts.recover, cluster.h): a lost stage's
     * worker is reconnected and re-assigned, then the held requests resume
     * here by re-prefilling. */
    bool recover;
    double recovery_timeout_s;
    bool recovering;        /* a stage was lost; waiting for it (c->lost too) */
    bool recovery_expired;  /* recovery_timeout passed: the held requests failed */
    bool reassigned;        /* every stage was sent StageAssign again after the loss */
    double lost_at;         /* monotonic time of the loss */
    struct event *recov_ev; /* recovery_timeout */
    uint64_t n_recoveries, n_resumed, n_recomputed; /* coord_engine_stats */
    struct event *resume_ev; /* hold mode: the pause after a BatchError ends */
    bool retry_pause;        /* hold mode: no launches until resume_ev */
    bool ready, failed, lost;
    char lost_msg[ST_ERR_MSG_MAX];
    block_manager *kv;
    sched *s;
    sched_stats kv_folded;  /* the scheduler's counters already added to g_kv */
    const sched_batch **inflight; /* launched batches (max_inflight slots, NULL = free) */
    int max_inflight;
    uint64_t *launched_ns;        /* per inflight slot: CLOCK_MONOTONIC ns before the send */
    int *launched_tokens;         /* per inflight slot: the batch's tokens */
    bool *overdue_warned;         /* per inflight slot: "overdue, no hung stage found" logged */
    double rtt_avg, rtt_tok_avg;  /* moving averages: round trip, round trip per batch token (s) */
    double last_tick;             /* monotonic time of the previous stats poll */
    double rtt_sum;               /* launch -> result, summed over batches */
    uint64_t rtt_n;
    /* the last BATCH_KEEP round trips [launch, result) in CLOCK_MONOTONIC
     * ns; rtt_n recorded in all, the next one goes to bat[rtt_n % BATCH_KEEP] */
    uint64_t (*bat)[2];
    creq *reqs;
    uint64_t stats_req_id;
    uint64_t seed_counter;
    char *piece_buf;
    size_t piece_cap;
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

static int send_control(cluster *c, stage_link *l, const ctl_msg *m) {
    size_t n = strata__v1__control_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return -1;
    strata__v1__control_message__pack(m, buf);
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    h.epoch = c->epoch;
    h.stage = (uint32_t)l->index;
    h.control.data = buf;
    h.control.len = n;
    st_err err = {{0}};
    int rc = l->peer ? xport_send(l->peer, &h, NULL, 0, NULL, NULL, NULL, &err) : -1;
    free(buf);
    if (rc) ST_WARN("cluster: CONTROL to stage %d (%s:%d) failed: %s", l->index, l->host, l->port,
                    err.msg[0] ? err.msg : "not connected");
    return rc;
}

/* ---- requests ------------------------------------------------------------- */

static void creq_free(creq *r) {
    if (!r) return;
    seq_sampling_release(&r->req);
    free(r->prompt);
    free(r->gen);
    free(r);
}

static void creq_unlink(cluster *c, creq *r) {
    if (r->prev)
        r->prev->next = r->next;
    else if (c->reqs == r)
        c->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

static creq *creq_find(cluster *c, uint64_t id) {
    for (creq *r = c->reqs; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

/* Ends a request: unlinked, on_finish, freed. The scheduler must already be
 * done with it (finished, or cancelled by the caller). */
static void creq_finish(cluster *c, creq *r, enum coord_finish why, const char *msg) {
    creq_unlink(c, r);
    r->in_cb = true;
    r->sink.on_finish(r->ctx, why, msg);
    creq_free(r);
}

/* Every live request fails (a stage was lost). */
static void fail_all(cluster *c, const char *msg) {
    while (c->reqs) {
        creq *r = c->reqs;
        if (c->s) sched_cancel(c->s, r->id);
        creq_finish(c, r, COORD_FINISH_ERROR, msg);
    }
}

/* ---- the data path: micro-batches out, tokens back ----------------------- */

/* Adds what the scheduler counted since the last call to g_kv. */
static void fold_kv_counters(cluster *c) {
    if (!c->s) return;
    sched_stats st;
    sched_stats_get(c->s, &st);
    g_kv.preemptions += st.preemptions - c->kv_folded.preemptions;
    g_kv.prefix_query_tokens += st.prefix_query_tokens - c->kv_folded.prefix_query_tokens;
    g_kv.prefix_hit_tokens += st.prefix_hit_tokens - c->kv_folded.prefix_hit_tokens;
    g_kv.prefill_tokens += st.prefill_tokens - c->kv_folded.prefill_tokens;
    c->kv_folded = st;
}

/* The most tokens r may generate here: max_tokens, or when it was not given
 * (max_tokens_auto), up to the context and to what the whole KV pool holds
 * (blocks are taken as the sequence grows; nothing is reserved ahead). */
static int max_new_of(const cluster *c, const coord_request *q, int n_prompt) {
    int max_new = q->max_tokens;
    if (!q->max_tokens_auto) return max_new;
    if ((int64_t)n_prompt + max_new > c->n_ctx) max_new = c->n_ctx - n_prompt;
    int64_t cap = c->s ? sched_kv_capacity_tokens(c->s) : c->n_ctx;
    if ((int64_t)n_prompt + max_new > cap) max_new = (int)(cap - n_prompt);
    return max_new;
}

static void pump_launch(cluster *c);

static void pump(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    cluster *c = arg;
    pump_launch(c);
    fold_kv_counters(c);
}

static void pump_launch(cluster *c) {
    if (!c->ready || c->lost || !c->s || c->paused || c->retry_pause) return;
    stage_link *first = &c->links[0];
    const sched_batch *b;
    while ((b = sched_next_microbatch(c->s)) != NULL) {
        frame_seq *seqs = calloc((size_t)b->n_seqs, sizeof *seqs);
        frame_seq **seqp = calloc((size_t)b->n_seqs, sizeof *seqp);
        frame_sampling *samp = calloc((size_t)b->n_seqs, sizeof *samp);
        seq_sampling_buf *sbuf = calloc((size_t)b->n_seqs, sizeof *sbuf);
        st_err err = {{0}};
        int rc = -1;
        uint64_t t_launch = 0;
        bool filled = true;
        if (seqs && seqp && samp && sbuf) {
            for (int i = 0; i < b->n_seqs; i++) {
                const sched_slice *x = &b->seqs[i];
                const creq *r = x->user;
                const coord_request *q = &r->req;
                frame_seq *s = &seqs[i];
                strata__v1__seq_record__init(s);
                if (seq_sampling_fill(q, r->seed, r->prompt, r->n_prompt, r->gen, r->n_gen, x->sample,
                                      &samp[i], s, &sbuf[i], &err) != 0)
                    filled = false;
                s->seq_id = x->seq_id;
                s->pos = x->pos;
                s->n_tokens = x->n_tokens;
                s->block_table = (int32_t *)x->block_table;
                s->n_block_table = (size_t)x->n_blocks;
                s->wants_logits = x->sample;
                s->step = (uint64_t)r->n_gen;
                if (x->pos == 0 && q->request_id[0]) s->request_id = (char *)q->request_id;
                seqp[i] = s;
            }
            frame_header h = STRATA__V1__FRAME_HEADER__INIT;
            h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS;
            h.batch_id = b->id;
            h.epoch = c->epoch;
            h.stage = 0;
            h.seqs = seqp;
            h.n_seqs = (size_t)b->n_seqs;
            h.token_ids = (int32_t *)b->tokens;
            h.n_token_ids = (size_t)b->n_tokens;
            t_launch = st_now_ns();
            if (filled)
                rc = first->peer ? xport_send(first->peer, &h, NULL, 0, NULL, NULL, NULL, &err) : -1;
        } else {
            st_errf(&err, "out of memory");
        }
        for (int i = 0; sbuf && i < b->n_seqs; i++) seq_sampling_buf_free(&sbuf[i]);
        free(sbuf);
        free(seqs);
        free(seqp);
        free(samp);
        if (rc != 0) {
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
        for (int i = 0; i < c->max_inflight; i++)
            if (!c->inflight[i]) {
                c->inflight[i] = b;
                c->launched_ns[i] = t_launch;
                c->launched_tokens[i] = b->n_tokens;
                c->overdue_warned[i] = false;
                break;
            }
    }
}

/* The piece of token id into c->piece_buf; its length. */
static size_t piece_of(cluster *c, int32_t id) {
    int n = tok_piece(c->vocab, id, c->piece_buf, c->piece_cap);
    if (n < 0 || (size_t)n > c->piece_cap) return 0;
    c->piece_buf[n] = '\0';
    return (size_t)n;
}

/* A sampled token for request r (its event ev). */
static void deliver(cluster *c, creq *r, const sched_event *ev, const frame_result *res) {
    if (ev->finish == SCHED_FINISH_ERROR || ev->token < 0) {
        creq_finish(c, r, COORD_FINISH_ERROR, "the last stage returned no token for the sequence");
        return;
    }
    if (r->n_gen == r->cap_gen) {
        int cap = r->cap_gen ? r->cap_gen * 2 : 64;
        int32_t *g = realloc(r->gen, sizeof *g * (size_t)cap);
        if (!g) {
            if (ev->finish == SCHED_NOT_FINISHED) sched_cancel(c->s, r->id);
            creq_finish(c, r, COORD_FINISH_ERROR, "out of memory");
            return;
        }
        r->gen = g;
        r->cap_gen = cap;
    }
    r->gen[r->n_gen++] = ev->token;
    r->n_failed = 0;
    r->in_cb = true;
    if (!r->prompt_sent) {
        r->prompt_sent = true;
        r->sink.on_prompt(r->ctx, r->prompt, r->n_prompt);
        if (r->dead) goto dead;
    }
    if (tok_is_eog(c->vocab, ev->token) && !r->req.ignore_eos) {
        if (ev->finish == SCHED_NOT_FINISHED) sched_cancel(c->s, r->id);
        creq_finish(c, r, COORD_FINISH_STOP, NULL);
        return;
    }
    size_t n = piece_of(c, ev->token);
    if (r->req.logprobs) {
        int nt = res && res->n_top < SAMPLER_MAX_TOP_LOGPROBS ? (int)res->n_top : SAMPLER_MAX_TOP_LOGPROBS;
        if (!res) nt = 0;
        char *pieces[SAMPLER_MAX_TOP_LOGPROBS] = {0};
        const char *cpieces[SAMPLER_MAX_TOP_LOGPROBS];
        float lps[SAMPLER_MAX_TOP_LOGPROBS];
        for (int i = 0; i < nt; i++) {
            int m = tok_piece(c->vocab, res->top[i]->token, NULL, 0);
            pieces[i] = malloc(m > 0 ? (size_t)m + 1 : 1);
            if (pieces[i]) {
                if (m > 0) tok_piece(c->vocab, res->top[i]->token, pieces[i], (size_t)m);
                pieces[i][m > 0 ? m : 0] = '\0';
            }
            cpieces[i] = pieces[i] ? pieces[i] : "";
            lps[i] = res->top[i]->logprob;
        }
        coord_logprobs lp = {res ? res->logprob : 0.0f, nt, cpieces, lps};
        r->sink.on_token(r->ctx, ev->token, c->piece_buf, n, &lp);
        for (int i = 0; i < nt; i++) free(pieces[i]);
    } else {
        r->sink.on_token(r->ctx, ev->token, c->piece_buf, n, NULL);
    }
    if (r->dead) goto dead;
    r->in_cb = false;
    if (ev->finish == SCHED_FINISH_LENGTH || ev->finish == SCHED_FINISH_STOP)
        creq_finish(c, r, ev->finish == SCHED_FINISH_STOP ? COORD_FINISH_STOP : COORD_FINISH_LENGTH,
                    NULL);
    return;
dead:
    /* cancel() ran inside the callback: the scheduler already dropped it. */
    creq_free(r);
}

static void on_resume(evutil_socket_t fd, short what, void *arg) {
    cluster *c = arg;
    c->retry_pause = false;
    pump_soon(c);
}

/* Hold mode: batch_id failed at a stage (fail). Its sequences go back to
 * their positions; after RETRY_PAUSE_S they are sent again, unless a stage is
 * lost meanwhile (the usual cause: the next hop of the stage that reported
 * died) or they failed MAX_BATCH_FAILURES times in a row. */
static void hold_failed_batch(cluster *c, uint64_t batch_id, const char *fail) {
    int slot = -1;
    for (int i = 0; i < c->max_inflight; i++)
        if (c->inflight[i] && c->inflight[i]->id == batch_id) slot = i;
    if (slot < 0) return; /* aborted already (a stage was lost) */
    const sched_batch *b = c->inflight[slot];
    int n = b->n_seqs;
    uint64_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    for (int i = 0; ids && i < n; i++) ids[i] = b->seqs[i].seq_id;
    st_err err = {{0}};
    sched_abort_batch(c->s, batch_id, &err);
    c->inflight[slot] = NULL;
    for (int i = 0; ids && i < n; i++) {
        creq *r = creq_find(c, ids[i]);
        if (!r || ++r->n_failed < MAX_BATCH_FAILURES) continue;
        sched_cancel(c->s, r->id);
        creq_finish(c, r, COORD_FINISH_ERROR, fail);
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
    int slot = -1;
    for (int i = 0; i < c->max_inflight; i++)
        if (c->inflight[i] && c->inflight[i]->id == batch_id) slot = i;
    if (slot < 0) {
        if (c->lost) g_fenced_frames++;
        ST_WARN("cluster: result for batch %llu, which is not in flight%s; dropped",
                (unsigned long long)batch_id, c->lost ? " (epoch lost: fenced)" : "");
        return;
    }
    const sched_batch *b = c->inflight[slot];
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
    c->inflight[slot] = NULL;
    uint64_t t_done = st_now_ns();
    double rtt = (double)(t_done - c->launched_ns[slot]) * 1e-9;
    double rtt_tok = rtt / (c->launched_tokens[slot] > 0 ? c->launched_tokens[slot] : 1);
    c->rtt_avg = c->rtt_n ? c->rtt_avg + RTT_EWMA_ALPHA * (rtt - c->rtt_avg) : rtt;
    c->rtt_tok_avg = c->rtt_n ? c->rtt_tok_avg + RTT_EWMA_ALPHA * (rtt_tok - c->rtt_tok_avg) : rtt_tok;
    c->rtt_sum += rtt;
    if (c->bat) {
        c->bat[c->rtt_n % BATCH_KEEP][0] = c->launched_ns[slot];
        c->bat[c->rtt_n % BATCH_KEEP][1] = t_done;
    }
    c->rtt_n++;
    if (sched_on_tokens(c->s, batch_id, sampled, n, &ev, &n_ev, &err) != 0) {
        ST_ERROR("cluster: %s", err.msg);
        n_ev = 0;
    }
    /* b is gone now; ids[] and match[] keep what is needed. */
    for (int e = 0; e < n_ev; e++) {
        creq *r = creq_find(c, ev[e].seq_id);
        if (!r) continue;
        const frame_result *fr = NULL;
        for (int i = 0; i < n; i++)
            if (ids[i] == ev[e].seq_id) fr = match[i];
        deliver(c, r, &ev[e], fr);
    }
    if (fail) {
        /* Non-sampling slices (prefill chunks) of a failed batch: end them too. */
        for (int i = 0; i < n; i++) {
            creq *r = creq_find(c, ids[i]);
            if (!r) continue;
            sched_cancel(c->s, r->id);
            creq_finish(c, r, COORD_FINISH_ERROR, fail);
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
    Strata__V1__StageAssign a = STRATA__V1__STAGE_ASSIGN__INIT;
    char next[COORD_HOST_MAX + 16] = "";
    if (l->index + 1 < c->n_stages) {
        const stage_link *nx = &c->links[l->index + 1];
        if (strchr(nx->host, ':'))
            snprintf(next, sizeof next, "[%s]:%d", nx->host, nx->port);
        else
            snprintf(next, sizeof next, "%s:%d", nx->host, nx->port);
    }
    a.epoch = c->epoch;
    a.keep_loaded = c->keep_loaded;
    a.adopt_epoch = c->adopt_epoch;
    a.stage = (uint32_t)l->index;
    a.n_stages = (uint32_t)c->n_stages;
    a.model_path = (char *)cluster_worker_model(c->cfg);
    a.first_layer = l->range.first;
    a.last_layer = l->range.last;
    a.tp = l->tp;
    a.kv_blocks = c->cfg->kv_blocks;
    a.block_size = c->cfg->kv_block_size;
    a.act_dtype = c->cfg->act_dtype == COORD_ACT_BF16 ? STRATA__V1__DTYPE__DTYPE_BF16
                                                      : STRATA__V1__DTYPE__DTYPE_F32;
    a.next_hop = next;
    /* A GPU stage runs rank r on GPU r of its node (the node's TP rule counts
     * from GPU 0: coordinator/control, ib/gpu_links.h). */
    int32_t devices[64];
    a.backend = l->backend;
    if (!strcmp(l->backend, "cuda")) {
        for (int r = 0; r < l->tp && r < 64; r++) devices[r] = r;
        a.devices = devices;
        a.n_devices = (size_t)(l->tp < 64 ? l->tp : 64);
    }
    uint8_t token[CLUSTER_MAC_LEN];
    if (c->key) {
        if (assign_token_make(c->key, &a, token)) {
            ST_ERROR("cluster: cannot sign the assignment of stage %d (libcrypto)", l->index);
            return;
        }
        a.token.data = token;
        a.token.len = sizeof token;
    }
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ASSIGN;
    m.assign = &a;
    ST_INFO("cluster: assigning stage %d (layers [%d, %d), TP %d, %s) to %s:%d, next hop %s", l->index,
            l->range.first, l->range.last, l->tp, l->backend[0] ? l->backend : "cpu", l->host, l->port,
            next[0] ? next : "(coordinator)");
    if (send_control(c, l, &m) == 0) l->state = LINK_ASSIGNED;
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
    c->inflight = calloc((size_t)c->max_inflight, sizeof *c->inflight);
    c->launched_ns = calloc((size_t)c->max_inflight, sizeof *c->launched_ns);
    c->launched_tokens = calloc((size_t)c->max_inflight, sizeof *c->launched_tokens);
    c->overdue_warned = calloc((size_t)c->max_inflight, sizeof *c->overdue_warned);
    if (!c->bat) c->bat = calloc(BATCH_KEEP, sizeof *c->bat);
    if (c->kv) c->s = sched_create(&sc, c->kv, &err);
    if (!c->kv || !c->s || !c->inflight || !c->launched_ns || !c->launched_tokens ||
        !c->overdue_warned || !c->bat) {
        fatal(c, "cannot start the scheduler: %s", err.msg[0] ? err.msg : "out of memory");
        return;
    }
    c->ready = true;
    double t_ready = st_now_s();
    c->last_tick = t_ready;
    for (int i = 0; i < c->n_stages; i++) {
        if (!c->links[i].have_stats) c->links[i].stats_at = t_ready;
        c->links[i].fwd_moved_at = t_ready;
    }
    if (c->deadline_ev) event_del(c->deadline_ev);
    struct timeval tv = {0, (int)(STATS_PERIOD_S * 1e6)};
    event_add(c->stats_ev, &tv);
    ST_INFO("cluster: all %d stages ready (epoch %d); KV cache %d blocks of %d tokens, prefix "
            "caching %s", c->n_stages, (int)c->epoch, (int)blocks, c->cfg->kv_block_size,
            c->cfg->prefix_caching ? "on" : "off");
    if (c->on_ready) c->on_ready(c->ud);
}

/* ---- static recovery (cluster_opts.recover, docs/recovery.md) ----------- */

static void on_stats_timer(evutil_socket_t fd, short what, void *arg);

/* "[cmpl-a, cmpl-b, ...]": the held requests' ids (#seq without one) into buf. */
static const char *held_ids(const cluster *c, char *buf, size_t cap) {
    size_t n = 0;
    int k = 0;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (const creq *r = c->reqs; r && n + 1 < cap; r = r->next, k++) {
        if (k == 8) {
            n += (size_t)snprintf(buf + n, cap - n, ", ...");
            break;
        }
        if (r->req.request_id[0])
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", k ? ", " : "", r->req.request_id);
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s#%llu", k ? ", " : "",
                                  (unsigned long long)r->id);
    }
    if (n + 1 < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* Closes l's connection (if any) and reconnects it from connect_missing. */
static void relink(cluster *c, stage_link *l) {
    if (l->peer) {
        xport_peer *p = l->peer;
        l->peer = NULL; /* its on_disconnect is then ignored */
        xport_peer_close(p);
    }
    l->state = LINK_LOST;
    c->reassigned = false;
    struct timeval tv = {0, (int)(RETRY_S * 1e6)};
    event_add(c->retry_ev, &tv);
}

/* Stage l was lost (stage_lost aborted the batches in flight): hold every
 * request, reconnect l's worker (a hung one's connection is closed first),
 * and fail the held requests if it is not back within recovery_timeout. */
static void recovery_start(cluster *c, stage_link *l) {
    char ids[512];
    c->recovering = true;
    c->recovery_expired = false;
    c->lost_at = st_now_s();
    c->n_recoveries++;
    ST_ERROR("cluster: recovery: %s; holding %d request(s) %s; reconnecting to %s:%d (requests "
             "wait up to %.0f s, recovery_timeout)",
             c->lost_msg, cluster_n_requests(c), held_ids(c, ids, sizeof ids), l->host, l->port,
             c->recovery_timeout_s);
    relink(c, l);
    double t = c->recovery_timeout_s;
    struct timeval tv = {(time_t)t, (int)((t - (double)(time_t)t) * 1e6)};
    event_add(c->recov_ev, &tv);
}

static void on_recovery_timeout(evutil_socket_t fd, short what, void *arg) {
    cluster *c = arg;
    if (!c->recovering || c->recovery_expired) return;
    c->recovery_expired = true;
    char ids[512], msg[ST_ERR_MSG_MAX + 128];
    snprintf(msg, sizeof msg, "the cluster could not recover within %.0f s (recovery_timeout) from: %s",
             c->recovery_timeout_s, c->lost_msg);
    ST_ERROR("cluster: recovery: %s; failing %d request(s) %s; still waiting for the stage "
             "(/health stays 503)", msg, cluster_n_requests(c), held_ids(c, ids, sizeof ids));
    fail_all(c, msg);
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
static void recovery_resume(cluster *c) {
    double t = st_now_s();
    creq *held = c->reqs;
    c->reqs = NULL;
    for (creq *r = held; r; r = r->next) sched_cancel(c->s, r->id);
    sched_reset_prefix_cache(c->s); /* the restarted stage's KV cache is empty */
    int n_ok = 0;
    int64_t n_tok = 0;
    while (held) {
        creq *r = held;
        held = r->next;
        r->prev = r->next = NULL;
        int max_new = max_new_of(c, &r->req, r->n_prompt);
        int n = r->n_prompt + r->n_gen, left = max_new - r->n_gen;
        int32_t *all = malloc(sizeof *all * (size_t)(n ? n : 1));
        st_err err = {{0}};
        int rc = -1;
        if (all && left >= 1) {
            memcpy(all, r->prompt, sizeof *all * (size_t)r->n_prompt);
            if (r->n_gen) memcpy(all + r->n_prompt, r->gen, sizeof *all * (size_t)r->n_gen);
            rc = sched_add(c->s, all, n, left, r, &r->id, &err);
        }
        free(all);
        if (rc != 0) {
            r->in_cb = true;
            r->sink.on_finish(r->ctx, COORD_FINISH_ERROR,
                              err.msg[0] ? err.msg : "cannot resume the sequence after recovery");
            creq_free(r);
            continue;
        }
        r->n_failed = 0;
        r->next = c->reqs;
        if (c->reqs) c->reqs->prev = r;
        c->reqs = r;
        n_ok++;
        n_tok += n;
    }
    c->n_resumed += (uint64_t)n_ok;
    c->n_recomputed += (uint64_t)n_tok;
    cluster_note_resumed(t - c->lost_at);
    char ids[512];
    ST_INFO("cluster: recovery: every stage is ready again %.2f s after the loss (%s); resumed %d "
            "request(s) %s by re-prefilling %lld token(s)",
            t - c->lost_at, c->lost_msg, n_ok, held_ids(c, ids, sizeof ids), (long long)n_tok);
    event_del(c->recov_ev);
    c->recovering = c->recovery_expired = c->reassigned = false;
    c->lost = false;
    c->lost_msg[0] = '\0';
    c->retry_pause = false;
    event_del(c->resume_ev);
    /* The hang detection starts afresh: no stage is stale now. */
    c->last_tick = t;
    for (int i = 0; i < c->n_stages; i++) c->links[i].stats_at = c->links[i].fwd_moved_at = t;
    struct timeval tv = {0, (int)(STATS_PERIOD_S * 1e6)};
    event_add(c->stats_ev, &tv);
    pump_soon(c);
}

/* During a recovery every stage is READY: the first time, the returned
 * stage(s) are loaded, and every stage is sent its StageAssign again (the
 * survivors answer at once, "already loaded", and their next hop is
 * reconnected now rather than after its back-off); the second time, resume. */
static void recovery_step(cluster *c) {
    if (c->reassigned) {
        recovery_resume(c);
        return;
    }
    c->reassigned = true;
    for (int i = 0; i < c->n_stages; i++) {
        stage_link *l = &c->links[i];
        if (!l->peer) continue;
        send_assign(c, l);
    }
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
        if (!r->ok && c->recovering) {
            /* Static recovery: the returning worker could not load; try again. */
            ST_WARN("cluster: stage %d at %s:%d failed to load while recovering: %s; retrying",
                    l->index, l->host, l->port, r->error && r->error[0] ? r->error : "(no reason)");
            relink(c, l);
            break;
        }
        if (!r->ok) {
            fatal(c, "stage %d at %s:%d failed to load: %s", l->index, l->host, l->port,
                  r->error && r->error[0] ? r->error : "(no reason given)");
            break;
        }
        if (l->state == LINK_READY) break;
        l->state = LINK_READY;
        l->drops = 0;
        l->kv_blocks = r->kv_blocks;
        l->load_seconds = r->load_seconds;
        ST_INFO("cluster: stage %d at %s:%d ready: %llu weight bytes, %d KV blocks, loaded in %.2f s",
                l->index, l->host, l->port, (unsigned long long)r->weight_bytes, r->kv_blocks,
                r->load_seconds);
        int n_ready = 0;
        for (int i = 0; i < c->n_stages; i++) n_ready += c->links[i].state == LINK_READY;
        if (n_ready == c->n_stages && !c->ready && !c->failed) all_ready(c);
        else if (n_ready == c->n_stages && c->recovering) recovery_step(c);
        break;
    }
    case STRATA__V1__CONTROL_MESSAGE__MSG_STATS: {
        const Strata__V1__StageStats *s = m->stats;
        if (!l->have_stats) {
            l->prev_busy_s = 0;
            l->prev_uptime_s = 0;
        }
        if (!l->have_stats || s->uptime_seconds < l->win_uptime_s) {
            l->win_busy_s = s->busy_seconds;
            l->win_uptime_s = s->uptime_seconds;
        } else if (s->uptime_seconds - l->win_uptime_s >= 1.0) {
            l->busy_ratio = (s->busy_seconds - l->win_busy_s) / (s->uptime_seconds - l->win_uptime_s);
            if (l->busy_ratio < 0) l->busy_ratio = 0;
            if (l->busy_ratio > 1) l->busy_ratio = 1;
            l->win_busy_s = s->busy_seconds;
            l->win_uptime_s = s->uptime_seconds;
        }
        l->bytes_sent = s->bytes_sent;
        l->frames_sent = s->frames_sent;
        l->hops = s->hops;
        l->hop_sum_s = s->hop_seconds;
        l->dropped_frames = s->dropped_frames;
        l->fenced_frames = s->fenced_frames;
        l->stats_at = st_now_s();
        if (!l->have_stats || s->forwards != l->forwards) l->fwd_moved_at = l->stats_at;
        if (s->worker_name && s->worker_name[0])
            snprintf(l->worker_name, sizeof l->worker_name, "%s", s->worker_name);
        l->have_stats = true;
        l->busy_s = s->busy_seconds;
        l->uptime_s = s->uptime_seconds;
        l->forwards = s->forwards;
        l->tokens = s->tokens;
        l->queue_depth = s->queue_depth;
        /* Replies may overlap (a poll every 100 ms): keep only newer ones. */
        for (size_t k = 0; l->fwd && k + 1 < s->n_forward_ns; k += 2) {
            uint64_t a = s->forward_ns[k], b = s->forward_ns[k + 1];
            if (b <= l->fwd_last_end || a > b) continue;
            l->fwd[l->fwd_n % FWD_KEEP][0] = a;
            l->fwd[l->fwd_n % FWD_KEEP][1] = b;
            l->fwd_n++;
            l->fwd_last_end = b;
            static const double bounds[COORD_FWD_N_BOUNDS] = COORD_FWD_BOUNDS;
            double d = (double)(b - a) * 1e-9;
            int k = 0;
            while (k < COORD_FWD_N_BOUNDS && !(d <= bounds[k])) k++;
            l->fwd_buckets[k]++;
            l->fwd_sum_s += d;
        }
        break;
    }
    case STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_DONE:
        if (l->index == c->n_stages - 1 && m->batch_done->epoch == c->epoch)
            on_batch_result(c, m->batch_done->batch_id, NULL, 0, NULL);
        else if (m->batch_done->epoch != c->epoch)
            g_fenced_frames++;
        break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_ERROR: {
        char msg[ST_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "stage %u failed the batch: %s", m->batch_error->stage,
                 m->batch_error->error ? m->batch_error->error : "");
        ST_WARN("cluster: batch %llu: %s", (unsigned long long)m->batch_error->batch_id, msg);
        if (m->batch_error->epoch != c->epoch || c->lost) {
            g_fenced_frames++;
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
    if (l->state == LINK_DOWN || (c->recovering && l->state == LINK_LOST)) {
        if (c->recovering)
            ST_INFO("cluster: stage %d's worker %s:%d is reachable again; re-assigning its stage",
                    l->index, l->host, l->port);
        send_assign(c, l);
    }
}

/* Stage l of the ready cluster is lost (its connection dropped, or it hung:
 * check_overdue): the batches in flight are aborted, then hold mode calls
 * on_lost, the static mode fails every request. */
static void stage_lost(cluster *c, stage_link *l, const char *msg) {
    double since = st_now_s() - l->stats_at; /* its last sign of life */
    g_detect[g_n_detect++ % COORD_RECOVERY_KEEP] = since > 0 ? since : 0;
    c->lost = true;
    snprintf(c->lost_msg, sizeof c->lost_msg, "%s", msg);
    if (c->on_lost)
        ST_ERROR("cluster: %s (epoch %d); %d request(s) held for recovery", c->lost_msg,
                 (int)c->epoch, cluster_n_requests(c));
    else if (!c->recover)
        ST_ERROR("cluster: %s; serving stops (restart the coordinator)", c->lost_msg);
    l->state = LINK_LOST;
    for (int i = 0; i < c->max_inflight; i++) {
        if (!c->inflight[i]) continue;
        st_err err = {{0}};
        sched_abort_batch(c->s, c->inflight[i]->id, &err);
        c->inflight[i] = NULL;
    }
    if (c->on_lost)
        c->on_lost(c->ud, l->index, c->lost_msg);
    else if (c->recover)
        recovery_start(c, l);
    else
        fail_all(c, c->lost_msg);
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
    if (c->recovering) { /* a reconnect attempt failed, or another stage dropped meanwhile */
        ST_DEBUG("cluster: stage %d at %s:%d not reachable (%s); retrying", l->index, l->host,
                 l->port, reason ? reason : "?");
        if (l->state != LINK_LOST) c->reassigned = false;
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
            if (h->epoch != c->epoch) g_fenced_frames++;
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
    if (c->failed || (c->ready && !c->recovering)) return;
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

/* The bound of the batch in inflight slot i (HANG_* above), in seconds. */
static double batch_bound(const cluster *c, int i) {
    if (c->rtt_n == 0) return HANG_COLD_S > HANG_FLOOR_S ? HANG_COLD_S : HANG_FLOOR_S;
    double expect = c->rtt_tok_avg * (double)c->launched_tokens[i];
    if (c->rtt_avg > expect) expect = c->rtt_avg;
    return HANG_MULT * expect > HANG_FLOOR_S ? HANG_MULT * expect : HANG_FLOOR_S;
}

/* Which stage holds up a batch overdue by `bound` seconds (now = now):
 *  1. the stage whose latest StageStats is the oldest, when it is older than
 *     the bound: it answers no poll (every 100 ms) — a stopped process
 *     (SIGSTOP), a partition that drops its packets, or a wedged event loop
 *     (a forward run inline on the loop thread that does not end);
 *  2. else the first stage with work queued (StageStats.queue_depth counts
 *     the forward running too) whose `forwards` counter has not moved for
 *     longer than the bound: its compute thread is wedged while its loop (and
 *     heartbeat thread) still answer.
 * NULL when neither holds (the batch is late for another reason: it is only
 * logged). */
static stage_link *find_hung(cluster *c, double now, double bound) {
    stage_link *stale = NULL;
    for (int i = 0; i < c->n_stages; i++) {
        stage_link *l = &c->links[i];
        if (now - l->stats_at > bound && (!stale || l->stats_at < stale->stats_at)) stale = l;
    }
    if (stale) return stale;
    for (int i = 0; i < c->n_stages; i++) {
        stage_link *l = &c->links[i];
        if (l->have_stats && l->queue_depth > 0 && now - l->fwd_moved_at > bound) return l;
    }
    return NULL;
}

/* The per-micro-batch deadline: the oldest batch in flight past its bound
 * (batch_bound) with a hung stage found (find_hung) loses that stage, like a
 * dropped connection (stage_lost: hold mode recovers, the static mode fails
 * the requests with the message). Returns whether a stage was lost. */
static bool check_overdue(cluster *c) {
    uint64_t now_ns = st_now_ns();
    double now = st_now_s(), gap = now - c->last_tick;
    c->last_tick = now;
    /* This process was held up itself (no poll for a while): the replies
     * that arrived meanwhile are not read yet; judge at the next poll. */
    if (gap > HANG_STALL_S) return false;
    int worst = -1;
    double worst_over = 0;
    for (int i = 0; i < c->max_inflight; i++) {
        if (!c->inflight[i]) continue;
        double age = (double)(now_ns - c->launched_ns[i]) * 1e-9;
        double over = age / batch_bound(c, i);
        if (over > 1.0 && over > worst_over) worst = i, worst_over = over;
    }
    if (worst < 0) return false;
    double age = (double)(now_ns - c->launched_ns[worst]) * 1e-9, bound = batch_bound(c, worst);
    stage_link *l = find_hung(c, now, bound);
    if (!l) {
        if (!c->overdue_warned[worst])
            ST_WARN("cluster: batch %llu has not come back after %.1f s (bound %.1f s), but every "
                    "stage answers and computes; waiting",
                    (unsigned long long)c->inflight[worst]->id, age, bound);
        c->overdue_warned[worst] = true;
        return false;
    }
    char msg[ST_ERR_MSG_MAX];
    if (now - l->stats_at > bound)
        snprintf(msg, sizeof msg,
                 "stage %d at %s:%d hung (batch %llu not back after %.1f s, bound %.1f s; no "
                 "stats from the stage for %.1f s)",
                 l->index, l->host, l->port, (unsigned long long)c->inflight[worst]->id, age, bound,
                 now - l->stats_at);
    else
        snprintf(msg, sizeof msg,
                 "stage %d at %s:%d hung (batch %llu not back after %.1f s, bound %.1f s; its "
                 "compute made no progress for %.1f s with %u queued)",
                 l->index, l->host, l->port, (unsigned long long)c->inflight[worst]->id, age, bound,
                 now - l->fwd_moved_at, l->queue_depth);
    /* The connection stays open until the cluster is destroyed (a stopped
     * peer's late frames carry this epoch: the next one fences them). */
    stage_lost(c, l, msg);
    return true;
}

static void on_stats_timer(evutil_socket_t fd, short what, void *arg) {
    cluster *c = arg;
    if (!c->ready || c->lost) return;
    if (check_overdue(c)) return;
    for (int i = 0; i < c->n_stages; i++) {
        Strata__V1__StatsRequest q = STRATA__V1__STATS_REQUEST__INIT;
        q.request_id = ++c->stats_req_id;
        q.forward_intervals = c->links[i].fwd != NULL;
        q.forward_since_ns = c->links[i].fwd_last_end;
        ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
        m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST;
        m.stats_request = &q;
        send_control(c, &c->links[i], &m);
    }
    struct timeval tv = {0, (int)(STATS_PERIOD_S * 1e6)};
    event_add(c->stats_ev, &tv);
}

/* ---- the engine interface ------------------------------------------------- */

static int eng_submit(void *impl, const coord_request *req, const coord_sink *sink, void *ctx,
                      uint64_t *id_out, st_err *err) {
    cluster *c = impl;
    if (c->lost && !c->on_lost && !(c->recovering && !c->recovery_expired))
        return st_errf(err, "%s", c->lost_msg), COORD_EUNAVAIL;
    if (!c->ready) return st_errf(err, "the cluster is not ready (stages are loading)"), COORD_EUNAVAIL;
    if (!req->prompt || req->n_prompt < 1) return st_errf(err, "the prompt has no tokens"), COORD_EINVAL;
    creq *r = calloc(1, sizeof *r);
    if (!r || !(r->prompt = malloc(sizeof(int32_t) * (size_t)req->n_prompt))) {
        creq_free(r);
        return st_errf(err, "out of memory"), COORD_EINTERNAL;
    }
    memcpy(r->prompt, req->prompt, sizeof(int32_t) * (size_t)req->n_prompt);
    r->n_prompt = req->n_prompt;
    const size_t n = (size_t)req->n_prompt;
    int max_new = max_new_of(c, req, (int)n);
    if (req->max_tokens_auto && max_new < 1 && (int64_t)n < c->n_ctx) {
        st_errf(err, "the prompt has %zu tokens but the KV cache holds at most %lld", n,
                (long long)sched_kv_capacity_tokens(c->s));
        creq_free(r);
        return COORD_EINVAL;
    }
    if (max_new < 1 || (int64_t)n + max_new > c->n_ctx) {
        st_errf(err,
                "This model's maximum context length is %d tokens. However, you requested %lld "
                "tokens (%zu in the prompt, %d for the completion).",
                c->n_ctx, (long long)n + (max_new < 1 ? 1 : max_new), n, max_new < 1 ? 1 : max_new);
        creq_free(r);
        return COORD_ECONTEXT;
    }
    r->req = *req;
    r->req.prompt = r->prompt;
    if (seq_sampling_own(&r->req, err) != 0) {
        creq_free(r);
        return COORD_EINTERNAL;
    }
    r->sink = *sink;
    r->ctx = ctx;
    r->seed = req->has_seed ? req->sampling.seed
                            : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + ++c->seed_counter;
    int rc = sched_add(c->s, r->prompt, r->n_prompt, max_new, r, &r->id, err);
    if (rc != 0) {
        creq_free(r);
        return rc == SCHED_EFULL ? COORD_EBUSY : COORD_EINVAL;
    }
    r->next = c->reqs;
    if (c->reqs) c->reqs->prev = r;
    c->reqs = r;
    *id_out = r->id;
    pump_soon(c);
    return COORD_OK;
}

static void eng_cancel(void *impl, uint64_t id) {
    cluster *c = impl;
    creq *r = creq_find(c, id);
    if (!r) return;
    if (c->s) sched_cancel(c->s, id);
    creq_unlink(c, r);
    if (r->in_cb)
        r->dead = true;
    else
        creq_free(r);
    pump_soon(c);
}

static int eng_health(void *impl, st_err *err) {
    cluster *c = impl;
    if (c->recovering && !c->recovery_expired)
        return st_errf(err, "recovering from: %s (requests are held until recovery_timeout)",
                       c->lost_msg);
    if (c->lost) return st_errf(err, "%s", c->lost_msg);
    if (c->failed) return st_errf(err, "the cluster failed to start");
    if (!c->ready) {
        int n = 0;
        for (int i = 0; i < c->n_stages; i++) n += c->links[i].state == LINK_READY;
        return st_errf(err, "%d of %d stages ready", n, c->n_stages);
    }
    return 0;
}

static char *eng_stages_json(void *impl) {
    cluster *c = impl;
    sched_stats st = {0};
    if (c->s) sched_stats_get(c->s, &st);
    json_t *stages = json_array();
    for (int i = 0; i < c->n_stages; i++) {
        stage_link *l = &c->links[i];
        double du = l->uptime_s - l->prev_uptime_s, db = l->busy_s - l->prev_busy_s;
        double frac = du > 0 ? db / du : 0.0;
        char addr[COORD_HOST_MAX + 16];
        snprintf(addr, sizeof addr, "%s:%d", l->host, l->port);
        json_t *fwd = json_array();
        uint64_t kept = l->fwd_n < FWD_KEEP ? l->fwd_n : FWD_KEEP;
        for (uint64_t k = l->fwd_n - kept; fwd && k < l->fwd_n; k++)
            json_array_append_new(fwd, json_pack("[I,I]", (json_int_t)l->fwd[k % FWD_KEEP][0],
                                                 (json_int_t)l->fwd[k % FWD_KEEP][1]));
        json_array_append_new(
            stages, json_pack("{s:i,s:s,s:i,s:i,s:i,s:b,s:f,s:f,s:I,s:I,s:f,s:i,s:I,s:I,s:o}", "stage", i,
                              "address", addr, "first_layer", l->range.first, "last_layer",
                              l->range.last, "tp", l->tp, "ready", l->state == LINK_READY,
                              "busy_seconds", l->busy_s, "uptime_seconds", l->uptime_s,
                              "forwards", (json_int_t)l->forwards, "tokens",
                              (json_int_t)l->tokens, "busy_fraction", frac, "queue_depth",
                              (int)l->queue_depth, "dropped_frames", (json_int_t)l->dropped_frames,
                              "fenced_frames", (json_int_t)l->fenced_frames, "forward_intervals", fwd));
        l->prev_busy_s = l->busy_s;
        l->prev_uptime_s = l->uptime_s;
    }
    json_t *bat = json_array();
    uint64_t bkept = c->rtt_n < BATCH_KEEP ? c->rtt_n : BATCH_KEEP;
    for (uint64_t k = c->rtt_n - bkept; bat && c->bat && k < c->rtt_n; k++)
        json_array_append_new(bat, json_pack("[I,I]", (json_int_t)c->bat[k % BATCH_KEEP][0],
                                             (json_int_t)c->bat[k % BATCH_KEEP][1]));
    json_t *root = json_pack(
        "{s:b,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:I,s:I,s:f,s:o,s:o}", "ready", c->ready && !c->lost, "epoch",
        (int)c->epoch, "n_ctx", c->n_ctx, "kv_block_size", c->cfg->kv_block_size, "kv_blocks_total", (int)st.n_blocks,
        "kv_blocks_free", (int)st.blocks_free, "requests_waiting", st.n_waiting,
        "requests_running", st.n_running, "batches_in_flight", st.n_inflight,
        "batches_launched", (json_int_t)st.batches_launched, "tokens_launched",
        (json_int_t)st.tokens_launched, "batch_round_trip_ms",
        c->rtt_n ? 1e3 * c->rtt_sum / (double)c->rtt_n : 0.0, "batch_intervals", bat, "stages",
        stages);
    fold_kv_counters(c);
    json_t *kv = json_pack("{s:b,s:i,s:f,s:i,s:I,s:I,s:I,s:I,s:I}", "prefix_caching",
                           c->cfg->prefix_caching, "blocks_cached", (int)st.blocks_cached,
                           "usage", st.n_blocks ? (double)st.blocks_used / st.n_blocks : 0.0,
                           "preempted_waiting", st.n_preempted_waiting, "preemptions",
                           (json_int_t)g_kv.preemptions, "prefix_cache_query_tokens",
                           (json_int_t)g_kv.prefix_query_tokens, "prefix_cache_hit_tokens",
                           (json_int_t)g_kv.prefix_hit_tokens, "prefill_tokens",
                           (json_int_t)g_kv.prefill_tokens, "evictions", (json_int_t)st.evictions);
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
    out->preemptions = g_kv.preemptions;
    out->prefix_cache_queries = g_kv.prefix_query_tokens;
    out->prefix_cache_hits = g_kv.prefix_hit_tokens;
    out->prefill_tokens = g_kv.prefill_tokens;
    out->fenced_frames = g_fenced_frames;
    out->epoch = c->ready ? c->epoch : 0;
    cluster_recovery_times(out);
    out->recoveries = c->n_recoveries;
    out->sequences_resumed = c->n_resumed;
    out->tokens_recomputed = c->n_recomputed;
    double now = st_now_s();
    out->workers = calloc((size_t)(c->n_stages ? c->n_stages : 1), sizeof *out->workers);
    for (int i = 0; i < c->n_stages && i < COORD_STATS_MAX_STAGES; i++) {
        const stage_link *l = &c->links[i];
        out->stages[i].busy_ratio = l->busy_ratio;
        out->stages[i].bytes_sent = l->bytes_sent;
        out->stages[i].frames_sent = l->frames_sent;
        memcpy(out->stages[i].fwd_buckets, l->fwd_buckets, sizeof l->fwd_buckets);
        out->stages[i].fwd_sum_s = l->fwd_sum_s;
        out->stages[i].hops = l->hops;
        out->stages[i].hop_sum_s = l->hop_sum_s;
        out->stages[i].load_seconds = l->state == LINK_READY ? l->load_seconds : 0;
        snprintf(out->stages[i].worker, sizeof out->stages[i].worker, "%s", l->worker_name);
        out->n_stages = i + 1;
        if (!out->workers) continue;
        coord_worker_stats *w = &out->workers[i];
        snprintf(w->name, sizeof w->name, "%s",
                 l->worker_name[0] ? l->worker_name : c->cfg->stages[i].name);
        w->state = l->state == LINK_LOST   ? "lost"
                   : l->state == LINK_READY ? (c->ready && !c->lost ? "serving" : "ready")
                                            : "joining";
        w->heartbeat_age_s = l->have_stats ? now - l->stats_at : -1.0;
        out->n_workers = i + 1;
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
    c->recovery_timeout_s = o->recovery_timeout_s > 0 ? o->recovery_timeout_s : 60.0;
    c->epoch = o->epoch ? o->epoch : 1;
    c->keep_loaded = o->keep_loaded;
    c->adopt_epoch = o->adopt_epoch;
    c->ud = o->ud;
    c->piece_cap = tok_max_piece_len(o->vocab) + 1;
    c->piece_buf = malloc(c->piece_cap + 1);
    c->links = calloc((size_t)c->n_stages, sizeof *c->links);
    if (!c->piece_buf || !c->links) {
        st_errf(err, "cluster: out of memory");
        goto fail;
    }
    for (int i = 0; i < c->n_stages; i++) {
        stage_link *l = &c->links[i];
        l->c = c;
        l->index = i;
        snprintf(l->host, sizeof l->host, "%s", o->cfg->stages[i].host);
        l->port = o->cfg->stages[i].port;
        l->tp = o->cfg->stages[i].tp;
        snprintf(l->backend, sizeof l->backend, "%s", o->cfg->stages[i].backend);
        l->range = o->ranges[i];
        if (!(l->fwd = calloc(FWD_KEEP, sizeof *l->fwd))) {
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
    c->recov_ev = evtimer_new(base, on_recovery_timeout, c);
    if (!c->retry_ev || !c->deadline_ev || !c->pump_ev || !c->stats_ev || !c->resume_ev ||
        !c->recov_ev) {
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
        creq_unlink(c, r);
        creq_free(r);
    }
    if (c->x) xport_destroy(c->x);
    cluster_key_free(c->key);
    if (c->retry_ev) event_free(c->retry_ev);
    if (c->deadline_ev) event_free(c->deadline_ev);
    if (c->pump_ev) event_free(c->pump_ev);
    if (c->stats_ev) event_free(c->stats_ev);
    if (c->resume_ev) event_free(c->resume_ev);
    if (c->recov_ev) event_free(c->recov_ev);
    fold_kv_counters(c);
    sched_destroy(c->s);
    bm_free(c->kv);
    free(c->inflight);
    free(c->launched_ns);
    free(c->launched_tokens);
    free(c->overdue_warned);
    free(c->bat);
    for (int i = 0; c->links && i < c->n_stages; i++) free(c->links[i].fwd);
    free(c->links);
    free(c->piece_buf);
    free(c);
}

/* ---- live placement changes (coordinator/control/control_service.c) --------------- */

void cluster_pause(cluster *c) { c->paused = true; }

int cluster_inflight(const cluster *c) {
    int n = 0;
    for (int i = 0; c->inflight && i < c->max_inflight; i++) n += c->inflight[i] != NULL;
    return n;
}

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

int cluster_n_requests(const cluster *c) {
    int n = 0;
    for (const creq *r = c->reqs; r; r = r->next) n++;
    return n;
}

void cluster_release_workers(cluster *c) {
    for (int i = 0; i < c->n_stages; i++) {
        Strata__V1__StageRelease rel = STRATA__V1__STAGE_RELEASE__INIT;
        rel.epoch = c->epoch;
        ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
        m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_RELEASE;
        m.release = &rel;
        if (c->links[i].peer) send_control(c, &c->links[i], &m);
    }
}

int cluster_move_requests(cluster *from, cluster *to,
                          void (*on_moved)(void *ud, uint64_t old_id, uint64_t new_id), void *ud) {
    int moved = 0;
    while (from->reqs) {
        creq *r = from->reqs;
        creq_unlink(from, r);
        if (from->s) sched_cancel(from->s, r->id);
        uint64_t old_id = r->id;
        /* Re-prefill: the prompt and every token generated so far; the KV
         * cache of the sequence stays behind on the old stages. */
        int n = r->n_prompt + r->n_gen, left = max_new_of(to, &r->req, r->n_prompt) - r->n_gen;
        int32_t *all = malloc(sizeof *all * (size_t)(n ? n : 1));
        st_err err = {{0}};
        int rc = -1;
        if (all && left >= 1 && to->s) {
            memcpy(all, r->prompt, sizeof *all * (size_t)r->n_prompt);
            if (r->n_gen) memcpy(all + r->n_prompt, r->gen, sizeof *all * (size_t)r->n_gen);
            rc = sched_add(to->s, all, n, left, r, &r->id, &err);
        }
        free(all);
        if (rc != 0) {
            r->next = NULL;
            if (on_moved) on_moved(ud, old_id, 0);
            r->in_cb = true;
            r->sink.on_finish(r->ctx, COORD_FINISH_ERROR,
                              err.msg[0] ? err.msg : "cannot move the sequence to the new placement");
            creq_free(r);
            continue;
        }
        r->next = to->reqs;
        if (to->reqs) to->reqs->prev = r;
        to->reqs = r;
        if (on_moved) on_moved(ud, old_id, r->id);
        moved++;
    }
    pump_soon(to);
    return moved;
}

/* ---- recovery (hold mode) ------------------------------------------------- */

bool cluster_is_lost(const cluster *c) { return c->lost; }

int cluster_request_ids(const cluster *c, uint64_t *ids, int cap, int64_t *tokens) {
    int n = 0;
    int64_t t = 0;
    for (const creq *r = c->reqs; r; r = r->next) {
        if (n < cap && ids) ids[n] = r->id;
        n++;
        t += r->n_prompt + r->n_gen;
    }
    if (tokens) *tokens = t;
    return n;
}

void cluster_fail_requests(cluster *c, const char *message) { fail_all(c, message); }

void cluster_stage_leaving(cluster *c, int i, const char *message) {
    if (!c->ready || c->lost || i < 0 || i >= c->n_stages) return;
    stage_lost(c, &c->links[i], message);
}
