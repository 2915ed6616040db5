/* fixture.h — builds FrameHeaders for the ib tests (storage owned by the
 * fixture; fx_free releases it). */
#ifndef STRATA_TESTS_IB_FIXTURE_H
#define STRATA_TESTS_IB_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "ib/frame.h"

#define FX_MAX_SEQS 8

typedef struct fx {
    frame_header h;
    frame_seq seq[FX_MAX_SEQS];
    frame_seq *seqp[FX_MAX_SEQS];
    frame_sampling samp[FX_MAX_SEQS];
    int32_t blocks[FX_MAX_SEQS][4];
    int32_t *tokens;
    uint32_t shape[2];
    frame_result res[FX_MAX_SEQS];
    frame_result *resp[FX_MAX_SEQS];
    frame_top_logprob top[FX_MAX_SEQS][3];
    frame_top_logprob *topp[FX_MAX_SEQS][3];
} fx;

/* An ACTIVATIONS header for n_seqs sequences splitting n_tokens rows of
 * n_embd (dtype f32 or bf16); with_tokens adds token ids. */
static inline void fx_activations(fx *f, uint64_t batch, int n_seqs, int n_tokens, int n_embd, int dtype,
                                  int with_tokens)
{
    memset(f, 0, sizeof *f);
    strata__v1__frame_header__init(&f->h);
    f->h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS;
    f->h.batch_id = batch;
    f->h.epoch = 7;
    f->h.stage = 1;
    int left = n_tokens;
    for (int i = 0; i < n_seqs; i++) {
        frame_seq *s = &f->seq[i];
        strata__v1__seq_record__init(s);
        strata__v1__sampling_params__init(&f->samp[i]);
        f->samp[i].temperature = 0.5f * i;
        f->samp[i].top_k = 40;
        f->samp[i].top_p = 0.9f;
        f->samp[i].min_p = 0.05f;
        f->samp[i].seed = 1234 + i;
        f->samp[i].repeat_penalty = 1.1f;
        f->samp[i].n_top_logprobs = i % 3;
        s->sampling = &f->samp[i];
        s->seq_id = 100 + i;
        s->pos = 3 * i;
        s->n_tokens = i == n_seqs - 1 ? left : n_tokens / n_seqs;
        left -= s->n_tokens;
        for (int b = 0; b < 4; b++) f->blocks[i][b] = 10 * i + b;
        s->block_table = f->blocks[i];
        s->n_block_table = 1 + i % 4;
        s->wants_logits = i % 2 == 0;
        f->seqp[i] = s;
    }
    f->h.seqs = f->seqp;
    f->h.n_seqs = n_seqs;
    if (with_tokens) {
        f->tokens = malloc(sizeof(int32_t) * n_tokens);
        for (int i = 0; i < n_tokens; i++) f->tokens[i] = (int32_t)((batch * 31 + i * 7) % 512);
        f->h.token_ids = f->tokens;
        f->h.n_token_ids = n_tokens;
    }
    if (n_embd > 0) {
        f->h.dtype = dtype;
        f->shape[0] = n_tokens;
        f->shape[1] = n_embd;
        f->h.shape = f->shape;
        f->h.n_shape = 2;
    }
}

/* A TOKENS header with n results (n <= FX_MAX_SEQS), 2 top logprobs each. */
static inline void fx_tokens(fx *f, uint64_t batch, int n)
{
    memset(f, 0, sizeof *f);
    strata__v1__frame_header__init(&f->h);
    f->h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS;
    f->h.batch_id = batch;
    f->h.epoch = 7;
    f->h.stage = 3;
    for (int i = 0; i < n; i++) {
        frame_result *r = &f->res[i];
        strata__v1__seq_result__init(r);
        r->seq_id = 200 + i;
        r->token = 42 + i;
        r->logprob = -0.25f * i;
        for (int k = 0; k < 2; k++) {
            strata__v1__top_logprob__init(&f->top[i][k]);
            f->top[i][k].token = 42 + i + k;
            f->top[i][k].logprob = -0.25f * i - k;
            f->topp[i][k] = &f->top[i][k];
        }
        r->top = f->topp[i];
        r->n_top = 2;
        f->resp[i] = r;
    }
    f->h.results = f->resp;
    f->h.n_results = n;
}

static inline void fx_free(fx *f)
{
    free(f->tokens);
    f->tokens = NULL;
}

#endif
