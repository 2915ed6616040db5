/* datapath.c — strata-worker's activation data path, on the event loop:
 * ACTIVATIONS checks, the forward job and its hand-off to the compute thread
 * (or an inline run when it is idle), and the result out: ACTIVATIONS to the
 * next hop from a pool of registered buffers, or TOKENS / BatchDone /
 * BatchError to the coordinator. See datapath.h, docs/worker.md ("Inside: one
 * loop, one compute thread") and docs/protocol.md. */
#include "daemon/datapath.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hop_trace.h"
#include "common/log.h"
#include "daemon/act_p2p.h"
#include "daemon/compute_thread.h"
#include "daemon/control_send.h"
#include "daemon/stage_buffers.h"
#include "ib/act_transport.h"
#include "model/sampler.h"

#define INLINE_MAX_TOKENS 64     /* micro-batches up to this size may run on the loop thread */

/* A forward in flight: the compute job plus what the loop needs to send the
 * result on. cj must be first (cjob * <-> struct job *). */
struct job {
    cjob cj;
    uint64_t gen;        /* w->gen when submitted: results of older assignments are dropped */
    wstage *w;
    frame_header *hdr;   /* owned copy of the received header */
    stage_seq *seqs;
    float *in;           /* f32 input rows (non-first stage): malloc'd, or in_buf's on a GPU stage;
                          * NULL when an inline forward reads them in place */
    float *scratch;      /* f32 output before bf16 conversion: likewise (scratch_buf) */
    stbuf in_buf, scratch_buf; /* GPU stage: the pinned homes of in and scratch */
    stbuf out;           /* registered output buffer (non-last stage) */
    struct dbuf *din, *dout; /* ucx-cuda: the device buffers the rows came in / go out in */
    cjob send_cj;        /* the boundary on NCCL: the send of cj.dev_out (act_p2p.h) */
    double t_sent;       /* monotonic seconds at xport_send to the next hop */
    size_t out_bytes;
    stage_sample_out *samples;
};

static void forward_done(wstage *w, struct job *j);

/* ---------------------------------------------------------------- helpers */

const char *datapath_dtype_name(int d)
{
    return d == STRATA__V1__DTYPE__DTYPE_F32 ? "f32" : d == STRATA__V1__DTYPE__DTYPE_BF16 ? "bf16" : "none";
}

xport_mem *datapath_sink_get(wstage *w, const frame_header *h, size_t bytes)
{
    if (h->kind != STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS || h->dtype != STRATA__V1__DTYPE__DTYPE_F32 ||
        h->payload_p2p)
        return NULL;
    if (!w || w->state != W_READY || w->shutting_down || w->act_in != ACT_XPORT_UCX_CUDA || h->stage != w->cur.stage)
        return NULL;
    st_err err;
    struct dbuf *d = stage_dbuf_get(w, bytes, DBUF_RECV, &err);
    if (!d) ST_DEBUG("worker: batch %llu: no device buffer (%s); received into host memory",
                     (unsigned long long)h->batch_id, err.msg);
    return d ? d->m : NULL;
}

bool datapath_sink_put(wstage *w, xport_mem *m)
{
    /* a delivered buffer a forward took is DBUF_JOB by now; any other goes back */
    for (int i = 0; i < DBUF_MAX; i++)
        if (w->dbufs[i].m == m) {
            if (w->dbufs[i].state == DBUF_RECV) stage_dbuf_put(w, &w->dbufs[i]);
            return true;
        }
    return false;
}

static void job_free(wstage *w, struct job *j)
{
    if (!j) return;
    stage_dbuf_put(w, j->din);
    stage_dbuf_put(w, j->dout);
    frame_header_free(j->hdr);
    free(j->seqs);
    if (j->in_buf.m) stage_buf_put(w, j->in_buf);
    else free(j->in);
    if (j->scratch_buf.m) stage_buf_put(w, j->scratch_buf);
    else free(j->scratch);
    free(j->samples);
    stage_buf_put(w, j->out);
    free(j);
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
 * penalty's window (0 = off, -1 = the whole history); presence/frequency
 * count the whole history. The logit bias points into s (the job's header
 * copy outlives the sampling). */
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
    p.n_bias = (int32_t)(s->n_bias_ids < s->n_bias_values ? s->n_bias_ids : s->n_bias_values);
    p.bias_ids = p.n_bias ? s->bias_ids : NULL;
    p.bias_values = p.n_bias ? s->bias_values : NULL;
    return p;
}

/* ---------------------------------------------------------------- sending */

/* BatchError for the batch of j; stage_failed: the stage itself is lost. */
static void batch_error_ex(wstage *w, const struct job *j, const char *msg, bool stage_failed)
{
    const frame_header *h = j->hdr;
    w->counters->batch_errors++;
    /* seqs= maps the batch to its requests (their "seq starts" lines carry req=). */
    char seqs[256] = "", quoted[600];
    size_t n = 0;
    for (size_t i = 0; i < h->n_seqs && n + 24 < sizeof seqs; i++)
        n += (size_t)snprintf(seqs + n, sizeof seqs - n, "%s%llu", i ? "," : "",
                              (unsigned long long)h->seqs[i]->seq_id);
    st_log_quote(quoted, sizeof quoted, msg);
    st_log_kv(ST_LOG_WARN, NULL, "batch failed", "stage=%u batch=%llu epoch=%llu seqs=%s error=%s",
              w->cur.stage, (unsigned long long)h->batch_id, (unsigned long long)h->epoch,
              seqs[0] ? seqs : "\"\"", quoted);
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
    e.stage_failed = stage_failed;
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_ERROR;
    m.batch_error = &e;
    control_send(w->coord, &m, h->epoch, w->cur.stage, h->batch_id, "CONTROL reply");
    free(ids);
}

static void batch_error(wstage *w, const struct job *j, const char *msg) { batch_error_ex(w, j, msg, false); }

/* An ACTIVATIONS send of this stage completed d seconds after it started. */
static void note_hop(wstage *w, double d)
{
    w->counters->hops++;
    w->counters->hop_seconds += d;
    if (w->timing->hop) w->timing->hop(w->timing->ud, (int)w->cur.stage, d);
}

/* Loop thread: a forward of this stage finished (see wstage.fwd). */
static void note_forward(wstage *w, const cjob *cj)
{
    uint64_t *slot = w->fwd[w->fwd_n % FWD_RING];
    slot[0] = cj->start_ns;
    slot[1] = cj->end_ns;
    w->fwd_n++;
    if (w->timing->forward)
        w->timing->forward(w->timing->ud, (int)w->cur.stage, (double)(cj->end_ns - cj->start_ns) * 1e-9);
}

size_t datapath_forward_intervals(const wstage *w, uint64_t since_ns, uint64_t *out)
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
static bool run_here(const wstage *w, int64_t T, bool alone)
{
    return T <= INLINE_MAX_TOKENS && w->sends_inflight == 0 && alone;
}

/* The job's own f32 copy of the payload's n_el input rows (pinned: from the
 * stage's pool, for a GPU stage). 0 or -1 + err. */
static int input_copy(wstage *w, struct job *j, const frame_header *h, const void *payload, size_t n_el,
                      bool pinned, st_err *err)
{
    if (pinned) {
        if (!(j->in_buf = stage_buf_get(w, n_el * sizeof(float), err)).m) return -1;
        j->in = xport_mem_ptr(j->in_buf.m);
    } else if (!(j->in = malloc(n_el * sizeof(float)))) {
        return st_errf(err, "worker: out of memory");
    }
    if (h->dtype == STRATA__V1__DTYPE__DTYPE_F32)
        memcpy(j->in, payload, n_el * sizeof(float));
    else
        frame_bf16_to_f32(payload, j->in, n_el);
    j->cj.hidden_in = j->in;
    return 0;
}

/* Whether an ACTIVATIONS frame fits this stage (epoch, stage, token ids or
 * payload shape and dtype, block ids, history, sampling): 0, or -1 with why. */
static int check_activations(const wstage *w, const frame_header *h, size_t bytes, st_err *err)
{
    if (w->state != W_READY)
        return st_errf(err, "ACTIVATIONS (batch %llu) while no stage is ready", (unsigned long long)h->batch_id);
    if (h->epoch != w->cur.epoch)
        return st_errf(err, "batch %llu has epoch %llu, the assignment is epoch %llu", (unsigned long long)h->batch_id,
                       (unsigned long long)h->epoch, (unsigned long long)w->cur.epoch);
    if (h->stage != w->cur.stage)
        return st_errf(err, "batch %llu is for stage %u, this is stage %u", (unsigned long long)h->batch_id, h->stage,
                       w->cur.stage);
    const cjob_stage_info *in = &w->info;
    const int64_t T = frame_total_tokens(h);
    if (h->payload_p2p) {
        /* the rows follow on the boundary's NCCL communicator (frame_validate checked f32 and the shape) */
        if (in->is_first) return st_errf(err, "stage 0 takes token ids, not rows over NCCL");
        if (!w->p2p_in || w->p2p_in->broken)
            return st_errf(err, "batch %llu's rows come over NCCL, but boundary %u->%u has no NCCL link%s",
                           (unsigned long long)h->batch_id, w->cur.stage - 1, w->cur.stage,
                           w->p2p_in ? " (it failed)" : "");
        if (h->shape[1] != (uint32_t)in->n_embd)
            return st_errf(err, "payload rows of %u, the model's n_embd is %d", h->shape[1], in->n_embd);
    } else if (in->is_first) {
        if (bytes) return st_errf(err, "stage 0 takes token ids, not a payload");
        if ((int64_t)h->n_token_ids != T)
            return st_errf(err, "stage 0 needs %lld token ids, got %zu", (long long)T, h->n_token_ids);
        for (size_t i = 0; i < h->n_token_ids; i++)
            if (h->token_ids[i] >= in->n_vocab)
                return st_errf(err, "token id %d outside the vocabulary [0, %d)", (int)h->token_ids[i], in->n_vocab);
    } else {
        if (!bytes) return st_errf(err, "stage %u needs a hidden-state payload", w->cur.stage);
        if (h->shape[1] != (uint32_t)in->n_embd)
            return st_errf(err, "payload rows of %u, the model's n_embd is %d", h->shape[1], in->n_embd);
        if ((int)h->dtype != w->cur.act_dtype &&
            !(w->act_in == ACT_XPORT_UCX_CUDA && h->dtype == STRATA__V1__DTYPE__DTYPE_F32)) /* device rows are f32 */
            return st_errf(err, "payload dtype %s, configured %s", datapath_dtype_name(h->dtype),
                           datapath_dtype_name(w->cur.act_dtype));
    }
    for (size_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *s = h->seqs[i];
        for (size_t b = 0; b < s->n_block_table; b++)
            if (s->block_table[b] >= in->kv_blocks)
                return st_errf(err, "seq %llu: block id %d outside [0, %d)", (unsigned long long)s->seq_id,
                               (int)s->block_table[b], in->kv_blocks);
        for (size_t k = 0; k < s->n_history; k++)
            if (s->history[k] < 0 || s->history[k] >= in->n_vocab)
                return st_errf(err, "seq %llu: history token %d outside the vocabulary", (unsigned long long)s->seq_id,
                               (int)s->history[k]);
        if (s->history_prompt < 0 || (size_t)s->history_prompt > s->n_history)
            return st_errf(err, "seq %llu: history_prompt %d of %zu history tokens",
                           (unsigned long long)s->seq_id, (int)s->history_prompt, s->n_history);
        if (in->is_last && s->wants_logits) {
            if (s->sampling && s->sampling->n_bias_ids != s->sampling->n_bias_values)
                return st_errf(err, "seq %llu: %zu bias ids but %zu bias values",
                               (unsigned long long)s->seq_id, s->sampling->n_bias_ids,
                               s->sampling->n_bias_values);
            for (size_t k = 0; s->sampling && k < s->sampling->n_bias_ids; k++)
                if (s->sampling->bias_ids[k] < 0 || s->sampling->bias_ids[k] >= in->n_vocab)
                    return st_errf(err, "seq %llu: logit bias token %d outside the vocabulary",
                                   (unsigned long long)s->seq_id, (int)s->sampling->bias_ids[k]);
            sampler_params sp = sampling_from_frame(s->sampling);
            st_err why;
            if (sampler_params_validate(&sp, &why))
                return st_errf(err, "seq %llu: %s", (unsigned long long)s->seq_id, why.msg);
            for (size_t k = 0; k < i; k++)
                if (h->seqs[k]->seq_id == s->seq_id && h->seqs[k]->wants_logits)
                    return st_errf(err, "seq %llu wants logits twice in one batch", (unsigned long long)s->seq_id);
        }
    }
    return 0;
}

/* Whether the ACTIVATIONS header forward_done makes from h fits the UCX AM
 * header, as a device payload needs (xport_mem_register_device): it carries
 * the same sequences, and a 2-entry shape where h may carry token ids. A
 * larger one (long sampling histories) takes the host-staged path. */
static bool out_header_inline(const wstage *w, const frame_header *h)
{
    return strata__v1__frame_header__get_packed_size(h) + 32 <= xport_max_inline_header(w->x);
}

int datapath_activations(wstage *w, const frame_header *h, const void *payload, size_t bytes, bool alone,
                         st_err *refused)
{
    st_err err;
    if (check_activations(w, h, bytes, refused)) return -1;
    const cjob_stage_info *in = &w->info;
    const int64_t T = frame_total_tokens(h);

    /* The job: a private copy of the header and the input rows. */
    struct job *j = calloc(1, sizeof *j);
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
                                 .n_history = (int32_t)s->n_history,
                                 .n_history_prompt = s->history_prompt};
    }
    j->cj.batch = (stage_batch){.n_seqs = (int)c->n_seqs, .seqs = j->seqs, .n_tokens = (int32_t)T,
                                .tokens = in->is_first ? c->token_ids : NULL};
    const size_t n_el = (size_t)T * (size_t)in->n_embd;
    const bool pinned = stage_buf_pinned(w); /* a GPU stage: its host side of the copies is pinned */
    /* A forward run here, before this callback returns, on a CPU stage reads
     * f32 rows in place from the transport's buffer (no copy); one handed to
     * the compute thread gets its own copy below. */
    const bool here = run_here(w, T, alone);
    struct dbuf *din = in->is_first || h->payload_p2p ? NULL : stage_dbuf_at(w, payload);
    if (din && din->state == DBUF_RECV && h->dtype == STRATA__V1__DTYPE__DTYPE_F32) {
        din->state = DBUF_JOB; /* ucx-cuda: the rows landed in device memory; the forward reads them there */
        j->din = din;
        j->cj.dev_in = payload;
    } else if (h->payload_p2p) {
        j->cj.p2p_in = w->p2p_in; /* the compute thread receives the rows into device memory */
    } else if (!in->is_first) {
        if (here && !pinned && h->dtype == STRATA__V1__DTYPE__DTYPE_F32 &&
            (uintptr_t)payload % _Alignof(float) == 0)
            j->cj.hidden_in = payload;
        else if (input_copy(w, j, h, payload, n_el, pinned, &err))
            goto fail;
    }
    if (!in->is_last && w->p2p_out && w->p2p_out->ready && !w->p2p_out->broken) {
        j->cj.p2p_out = w->p2p_out; /* the rows stay on the device and go over NCCL (forward_p2p) */
    } else if (!in->is_last && w->act_out == ACT_XPORT_UCX_CUDA && out_header_inline(w, h) &&
               (j->dout = stage_dbuf_get(w, n_el * sizeof(float), DBUF_JOB, &err))) {
        /* ucx-cuda: the forward writes f32 rows into a registered device buffer; UCX sends from it */
        j->out_bytes = n_el * sizeof(float);
        j->cj.dev_rows_out = j->dout->p;
    } else if (!in->is_last) {
        j->out_bytes = n_el * frame_dtype_size(w->cur.act_dtype);
        if (!(j->out = stage_buf_get(w, j->out_bytes, &err)).m) goto fail;
        if (w->cur.act_dtype == STRATA__V1__DTYPE__DTYPE_F32) {
            j->cj.hidden_out = xport_mem_ptr(j->out.m);
        } else {
            if (pinned) {
                if (!(j->scratch_buf = stage_buf_get(w, n_el * sizeof(float), &err)).m) goto fail;
                j->scratch = xport_mem_ptr(j->scratch_buf.m);
            } else if (!(j->scratch = malloc(n_el * sizeof(float)))) {
                goto oom;
            }
            j->cj.hidden_out = j->scratch;
            j->cj.out_bf16 = xport_mem_ptr(j->out.m);
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
            st_log_kv(ST_LOG_INFO, h->seqs[i]->request_id, "seq starts", "stage=%u seq=%llu batch=%llu tokens=%d",
                      h->stage, (unsigned long long)h->seqs[i]->seq_id, (unsigned long long)h->batch_id,
                      (int)h->seqs[i]->n_tokens);
    if (st_log_enabled(ST_LOG_DEBUG)) {
        /* The batch's sequences: each maps to a request id by its "seq starts" line. */
        char seqs[256] = "";
        size_t n = 0;
        for (size_t i = 0; i < h->n_seqs && n + 24 < sizeof seqs; i++)
            n += (size_t)snprintf(seqs + n, sizeof seqs - n, "%s%llu", i ? "," : "",
                                  (unsigned long long)h->seqs[i]->seq_id);
        st_log_kv(ST_LOG_DEBUG, NULL, "batch queued", "stage=%u batch=%llu seqs=%s tokens=%lld", h->stage,
                  (unsigned long long)h->batch_id, seqs[0] ? seqs : "\"\"", (long long)T);
    }
    if (here && compute_run_inline(w->cq, &j->cj)) {
        datapath_forward_finished(w, &j->cj);
        return 0;
    }
    if (!in->is_first && !h->payload_p2p && !j->din && !j->in && input_copy(w, j, h, payload, n_el, pinned, &err)) goto fail;
    compute_submit(w->cq, &j->cj);
    return 0;
oom:
    st_errf(&err, "worker: out of memory");
fail:
    if (j && j->hdr) {
        batch_error(w, j, err.msg);
    } else {
        ST_ERROR("worker: batch %llu dropped: %s", (unsigned long long)h->batch_id, err.msg);
    }
    job_free(w, j);
    return 0;
}

/* ---------------------------------------------------------------- results */

static void fwd_sent(xport_peer *peer, int status, void *arg)
{
    struct job *j = arg;
    wstage *w = j->w;
    w->sends_inflight--;
    if (status != 0) {
        batch_error(w, j, "sending to the next hop failed (peer lost)");
    } else {
        w->backoff = BACKOFF_MIN_S;
        double d = st_now_s() - j->t_sent;
        note_hop(w, d);
    }
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
        control_send(w->coord, &m, c->epoch, w->cur.stage, c->batch_id, "CONTROL reply");
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

/* Hands the job's device rows to the compute thread: sent to the next stage
 * over NCCL (send), or only freed; the job ends in datapath_p2p_sent. */
static void p2p_finish(wstage *w, struct job *j, bool send)
{
    cjob *s = &j->send_cj;
    memset(s, 0, sizeof *s);
    s->kind = CJOB_P2P_SEND;
    s->user = j;
    s->p2p = send ? j->cj.p2p_out : NULL;
    s->dev_out = j->cj.dev_out;
    s->dev_bytes = send ? j->cj.dev_bytes : 0;
    s->dev_gen = j->cj.dev_gen;
    j->cj.dev_out = NULL;
    if (!w->cq) {
        job_free(w, j); /* stopped: the stage took its buffers with it */
        return;
    }
    compute_submit(w->cq, s);
}

/* A forward whose rows are in a device buffer, for the next stage over NCCL:
 * the header goes over UCX first (FrameHeader.payload_p2p), then the rows,
 * as a job of their own, so a send waiting for its receiver never holds the
 * next forward (act_p2p.h). */
static void forward_done_p2p(wstage *w, struct job *j)
{
    if (j->gen != w->gen || w->state != W_READY || w->shutting_down) {
        p2p_finish(w, j, false);
        return;
    }
    if (j->cj.p2p_out != w->p2p_out || w->p2p_out->broken || !w->next) {
        char msg[320];
        snprintf(msg, sizeof msg, "%s", w->next ? "the NCCL link to the next hop closed" : "the next hop is not connected");
        batch_error(w, j, msg);
        p2p_finish(w, j, false);
        return;
    }
    frame_header h = *j->hdr;
    uint32_t shape[2] = {(uint32_t)j->cj.batch.n_tokens, (uint32_t)w->info.n_embd};
    h.stage = w->cur.stage + 1;
    h.token_ids = NULL;
    h.n_token_ids = 0;
    h.dtype = STRATA__V1__DTYPE__DTYPE_F32;
    h.shape = shape;
    h.n_shape = 2;
    h.n_results = 0;
    h.results = NULL;
    h.control.len = 0;
    h.control.data = NULL;
    h.payload_p2p = true;
    st_err err;
    j->t_sent = st_now_s();
    if (xport_send(w->next, &h, NULL, 0, NULL, NULL, NULL, &err)) {
        batch_error(w, j, err.msg);
        p2p_finish(w, j, false);
        return;
    }
    p2p_finish(w, j, true);
}

void datapath_p2p_sent(wstage *w, cjob *cj)
{
    struct job *j = cj->user;
    if (cj->dev_bytes && cj->status) {
        if (cj->p2p && cj->p2p == w->p2p_out && !w->p2p_out->broken) {
            w->p2p_out->broken = true;
            ST_WARN("worker: boundary %u->%u: nccl failed: %s; the next batches go over UCX", w->cur.stage,
                    w->cur.stage + 1, cj->err.msg);
        }
        if (j->gen == w->gen && !w->shutting_down) batch_error(w, j, cj->err.msg);
    } else if (cj->dev_bytes) {
        double d = st_now_s() - j->t_sent;
        note_hop(w, d);
    }
    job_free(w, j);
}

static void forward_done(wstage *w, struct job *j)
{
    if (j->cj.p2p_out && j->cj.dev_out) {
        forward_done_p2p(w, j);
        return;
    }
    if (j->cj.status && j->cj.p2p_in && j->cj.p2p_in == w->p2p_in && !w->p2p_in->broken) {
        w->p2p_in->broken = true; /* its communicator was aborted: later rows over NCCL are refused */
        ST_WARN("worker: boundary %u->%u: nccl failed: %s", w->cur.stage - 1, w->cur.stage, j->cj.err.msg);
    }
    if (j->gen != w->gen || w->state != W_READY || w->shutting_down) {
        ST_DEBUG("worker: batch %llu of an older assignment finished; dropped", (unsigned long long)j->hdr->batch_id);
        job_free(w, j);
        return;
    }
    if (j->cj.status && j->cj.stage_failed) {
        /* Its communicator was aborted: the stage never runs again. Say so
         * once; the coordinator re-places it (its batches in flight are
         * aborted there, and the results of those still queued here are
         * dropped: the state is no longer W_READY). */
        ST_ERROR("worker: epoch %llu stage %u failed for good: %s; reporting it lost",
                 (unsigned long long)w->cur.epoch, w->cur.stage, j->cj.err.msg);
        w->state = W_FAILED;
        batch_error_ex(w, j, j->cj.err.msg, true);
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
    h.dtype = j->dout ? STRATA__V1__DTYPE__DTYPE_F32 : w->cur.act_dtype;
    h.shape = shape;
    h.n_shape = 2;
    h.n_results = 0;
    h.results = NULL;
    h.control.len = 0;
    h.control.data = NULL;
    st_err err;
    j->t_sent = st_now_s();
    xport_mem *om = j->dout ? j->dout->m : j->out.m;
    if (xport_send(w->next, &h, xport_mem_ptr(om), j->out_bytes, om, fwd_sent, j, &err)) {
        batch_error(w, j, err.msg);
        job_free(w, j);
        return;
    }
    w->sends_inflight++;
}


void datapath_forward_finished(wstage *w, cjob *cj)
{
    if (cj->status == 0) note_forward(w, cj);
    if (st_hop_trace_on()) {
        st_hop_mark("fwd_start", ((struct job *)cj->user)->hdr->batch_id, cj->start_ns);
        st_hop_mark("fwd_end", ((struct job *)cj->user)->hdr->batch_id, cj->end_ns);
    }
    forward_done(w, cj->user);
}

void datapath_job_discard(wstage *w, cjob *cj) { job_free(w, cj->user); }
