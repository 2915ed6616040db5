/* replay_engine.c — the replaying TEST DOUBLE of coord_engine. See replay_engine.h. */
#include "tests/coordinator/replay_engine.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

struct replay_seq {
    replay_engine *r;
    uint64_t id;
    coord_request req;
    const coord_sink *sink;
    void *ctx;
    struct event *timer;
    int step; /* 0: prompt not sent yet; then tokens sent + 1 */
    int32_t *prompt_ids;
    int n_prompt;
    replay_seq *next;
};

static void seq_remove(replay_engine *r, replay_seq *s) {
    for (replay_seq **p = &r->seqs; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    event_free(s->timer);
    free(s->prompt_ids);
    free(s);
    r->active--;
}

static void tick(evutil_socket_t fd, short what, void *arg) {
    replay_seq *s = arg;
    replay_engine *r = s->r;
    uint64_t id = s->id;
    if (s->step == 0) {
        s->step = 1;
        s->sink->on_prompt(s->ctx, s->prompt_ids, s->n_prompt);
    } else {
        int i = s->step - 1;
        int limit = s->req.max_tokens < r->n_script ? s->req.max_tokens : r->n_script;
        if (r->fail_after > 0 && i >= r->fail_after) {
            r->finished++;
            s->sink->on_finish(s->ctx, COORD_FINISH_ERROR, "replay: stage lost");
            seq_remove(r, s);
            return;
        }
        if (i >= limit) {
            r->finished++;
            enum coord_finish f = s->req.max_tokens <= r->n_script ? COORD_FINISH_LENGTH
                                                                    : COORD_FINISH_STOP;
            s->sink->on_finish(s->ctx, f, NULL);
            seq_remove(r, s);
            return;
        }
        s->step++;
        const char *piece = r->script_pieces[i];
        coord_logprobs lp, *lpp = NULL;
        const char *tops[2] = {piece, "zz"};
        float topv[2] = {-0.25f * (float)(i + 1), -3.0f};
        if (s->req.logprobs) {
            lp.logprob = topv[0];
            lp.n_top = 2;
            lp.top_pieces = tops;
            lp.top_logprobs = topv;
            lpp = &lp;
        }
        s->sink->on_token(s->ctx, r->script_ids[i], piece, strlen(piece), lpp);
        /* The sink may have cancelled (and so freed) this sequence. */
        bool alive = false;
        for (replay_seq *q = r->seqs; q; q = q->next) alive |= q->id == id;
        if (!alive) return;
    }
    struct timeval tv = {(time_t)r->interval_s,
                         (suseconds_t)((r->interval_s - (double)(time_t)r->interval_s) * 1e6)};
    evtimer_add(s->timer, &tv);
}

static int rp_submit(void *impl, const coord_request *req, const coord_sink *sink, void *ctx,
                     uint64_t *id_out, st_err *err) {
    replay_engine *r = impl;
    r->submits++;
    if (r->busy) return st_errf(err, "replay: queue full"), COORD_EBUSY;
    int n_prompt = req->n_prompt;
    if (r->n_ctx > 0 && n_prompt + req->max_tokens > r->n_ctx)
        return st_errf(err, "replay: %d prompt tokens + %d > context %d", n_prompt,
                       req->max_tokens, r->n_ctx),
               COORD_ECONTEXT;
    replay_seq *s = calloc(1, sizeof *s);
    s->prompt_ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    memcpy(s->prompt_ids, req->prompt, sizeof(int32_t) * (size_t)n_prompt);
    s->n_prompt = n_prompt;
    s->r = r;
    s->id = ++r->next_id;
    s->req = *req;
    s->req.prompt = s->prompt_ids;
    s->sink = sink;
    s->ctx = ctx;
    s->timer = evtimer_new(r->base, tick, s);
    s->next = r->seqs;
    r->seqs = s;
    r->active++;
    struct timeval tv = {0, 1000};
    evtimer_add(s->timer, &tv);
    *id_out = s->id;
    return COORD_OK;
}

static void rp_cancel(void *impl, uint64_t id) {
    replay_engine *r = impl;
    for (replay_seq *s = r->seqs; s; s = s->next)
        if (s->id == id) {
            r->cancels++;
            seq_remove(r, s);
            return;
        }
}

static int rp_health(void *impl, st_err *err) {
    replay_engine *r = impl;
    if (r->unhealthy) return st_errf(err, "replay: no placement");
    return 0;
}

static const coord_engine_ops replay_ops = {rp_submit, rp_cancel, rp_health, NULL, NULL, NULL};

void replay_engine_init(replay_engine *r, struct event_base *base) {
    memset(r, 0, sizeof *r);
    r->base = base;
    r->interval_s = 0.002;
}

coord_engine replay_engine_iface(replay_engine *r) {
    coord_engine e = {&replay_ops, r};
    return e;
}

void replay_engine_free(replay_engine *r) {
    while (r->seqs) seq_remove(r, r->seqs);
}

/* BOS (1), then one id per byte (byte + 3). */
static int rp_encode(void *ctx, const char *text, size_t len, bool add_special, bool parse_special,
                     const tok_span *plain, size_t n_plain, int32_t **ids, size_t *n, st_err *err) {
    (void)ctx, (void)add_special, (void)parse_special, (void)plain, (void)n_plain;
    *ids = malloc(sizeof(int32_t) * (len + 1));
    if (!*ids) return st_errf(err, "replay: out of memory");
    (*ids)[0] = 1;
    for (size_t i = 0; i < len; i++) (*ids)[i + 1] = (unsigned char)text[i] + 3;
    *n = len + 1;
    return 0;
}

compl_tokenizer replay_tokenizer(void) {
    compl_tokenizer t = {.encode = rp_encode};
    return t;
}
