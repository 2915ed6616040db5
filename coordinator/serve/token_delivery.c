/* token_delivery.c — a sampled token to its request's sink (token_delivery.h). */
#include "coordinator/serve/token_delivery.h"

#include <stdlib.h>

#include "model/sampler.h"

/* The piece of token id into d->piece_buf; its length. */
static size_t piece_of(const token_delivery *d, int32_t id) {
    int n = tok_piece(d->vocab, id, d->piece_buf, d->piece_cap);
    if (n < 0 || (size_t)n > d->piece_cap) return 0;
    d->piece_buf[n] = '\0';
    return (size_t)n;
}

static void send_token(const token_delivery *d, creq *r, int32_t token, size_t n, const frame_result *res) {
    if (!r->req.logprobs) {
        r->sink.on_token(r->ctx, token, d->piece_buf, n, NULL);
        return;
    }
    int nt = res && res->n_top < SAMPLER_MAX_TOP_LOGPROBS ? (int)res->n_top : SAMPLER_MAX_TOP_LOGPROBS;
    if (!res) nt = 0;
    char *pieces[SAMPLER_MAX_TOP_LOGPROBS] = {0};
    const char *cpieces[SAMPLER_MAX_TOP_LOGPROBS];
    float lps[SAMPLER_MAX_TOP_LOGPROBS];
    for (int i = 0; i < nt; i++) {
        int m = tok_piece(d->vocab, res->top[i]->token, NULL, 0);
        pieces[i] = malloc(m > 0 ? (size_t)m + 1 : 1);
        if (pieces[i]) {
            if (m > 0) tok_piece(d->vocab, res->top[i]->token, pieces[i], (size_t)m);
            pieces[i][m > 0 ? m : 0] = '\0';
        }
        cpieces[i] = pieces[i] ? pieces[i] : "";
        lps[i] = res->top[i]->logprob;
    }
    coord_logprobs lp = {res ? res->logprob : 0.0f, nt, cpieces, lps};
    r->sink.on_token(r->ctx, token, d->piece_buf, n, &lp);
    for (int i = 0; i < nt; i++) free(pieces[i]);
}

void token_deliver(const token_delivery *d, creq *r, const sched_event *ev, const frame_result *res) {
    if (ev->finish == SCHED_FINISH_ERROR || ev->token < 0) {
        creq_finish(d->reqs, r, COORD_FINISH_ERROR, "the last stage returned no token for the sequence");
        return;
    }
    if (creq_add_generated(r, ev->token) != 0) {
        if (ev->finish == SCHED_NOT_FINISHED) sched_cancel(d->s, r->id);
        creq_finish(d->reqs, r, COORD_FINISH_ERROR, "out of memory");
        return;
    }
    r->n_failed = 0;
    r->in_cb = true;
    if (!r->prompt_sent) {
        r->prompt_sent = true;
        r->sink.on_prompt(r->ctx, r->prompt, r->n_prompt);
        if (r->dead) goto dead;
    }
    if (tok_is_eog(d->vocab, ev->token) && !r->req.ignore_eos) {
        if (ev->finish == SCHED_NOT_FINISHED) sched_cancel(d->s, r->id);
        creq_finish(d->reqs, r, COORD_FINISH_STOP, NULL);
        return;
    }
    send_token(d, r, ev->token, piece_of(d, ev->token), res);
    if (r->dead) goto dead;
    r->in_cb = false;
    if (ev->finish == SCHED_FINISH_LENGTH || ev->finish == SCHED_FINISH_STOP)
        creq_finish(d->reqs, r, ev->finish == SCHED_FINISH_STOP ? COORD_FINISH_STOP : COORD_FINISH_LENGTH,
                    NULL);
    return;
dead:
    /* cancel() ran inside the callback: the scheduler already dropped it. */
    creq_free(r);
}
