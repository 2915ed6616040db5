/* generate.c — the single-process generation loop over one all-layer stage:
 * batched (chunked) prefill, then batched decode, with the KV block tables
 * kept here. See generate.h. */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "model/kv.h"

struct gen_engine {
    gen_params p;
    stage *st;
    kv_alloc *kv;
};

gen_engine *gen_open(const gen_params *pin, st_err *err) {
    gen_engine *g = calloc(1, sizeof *g);
    if (!g) {
        st_errf(err, "gen: out of memory");
        return NULL;
    }
    g->p = *pin;
    gen_params *p = &g->p;
    if (p->tp == 0) p->tp = 1;
    if (p->max_seqs == 0) p->max_seqs = 16;
    if (p->block_size == 0) p->block_size = 16;
    if (p->max_batch_tokens == 0) p->max_batch_tokens = 512;
    if (p->max_seqs < 1 || p->block_size < 1 || p->max_batch_tokens < 1 || p->n_ctx < 0 ||
        p->kv_blocks < 0) {
        st_errf(err, "gen: max_seqs, block_size, max_batch_tokens must be >= 1");
        free(g);
        return NULL;
    }
    /* n_ctx needs the model's context: peek at the config through a first
     * open when it is not given. */
    if (p->n_ctx == 0 || p->kv_blocks == 0) {
        gguf_file *f = gguf_open(p->model_path, err);
        if (!f) {
            free(g);
            return NULL;
        }
        llama_config cfg;
        int rc = llama_config_from_gguf(f, &cfg, err);
        gguf_close(f);
        if (rc) {
            free(g);
            return NULL;
        }
        if (p->n_ctx == 0) p->n_ctx = cfg.n_ctx_train < 4096 ? cfg.n_ctx_train : 4096;
    }
    if (p->kv_blocks == 0)
        p->kv_blocks = p->max_seqs * ((p->n_ctx + p->block_size - 1) / p->block_size);
    stage_params sp = {.model_path = p->model_path,
                       .first_layer = 0,
                       .last_layer = -1,
                       .tp = p->tp,
                       .n_threads = p->n_threads,
                       .kv_blocks = p->kv_blocks,
                       .block_size = p->block_size,
                       .backend = p->backend,
                       .kv_type = p->kv_type};
    g->st = stage_open(&sp, err);
    if (!g->st) {
        free(g);
        return NULL;
    }
    g->kv = kv_alloc_new(p->kv_blocks, p->block_size, err);
    if (!g->kv) {
        gen_close(g);
        return NULL;
    }
    return g;
}

void gen_close(gen_engine *g) {
    if (!g) return;
    stage_close(g->st);
    kv_alloc_free(g->kv);
    free(g);
}

const llama_config *gen_config(const gen_engine *g) { return stage_config(g->st); }
stage *gen_stage(gen_engine *g) { return g->st; }

void gen_result_free(gen_result *r) {
    if (!r) return;
    free(r->tokens);
    free(r->top_ids);
    free(r->top_logprobs);
    free(r->logprobs);
    memset(r, 0, sizeof *r);
}

/* Per-request state. */
typedef struct seq_state {
    kv_table tab;
    int32_t *hist; /* prompt + generated */
    int32_t n_hist;
    int32_t n_prefilled; /* prompt tokens already in the KV cache */
    int active;          /* still generating */
} seq_state;

/* Records a sampled token; returns 1 when the sequence is done. */
static int take_token(gen_engine *g, const gen_request *rq, int i, seq_state *ss, gen_result *res,
                      const stage_sample_out *so, gen_token_cb cb, void *user) {
    const llama_config *c = stage_config(g->st);
    if (so->id == c->eos_id && !rq->ignore_eos) {
        res->stop = GEN_STOP_EOS;
        return 1;
    }
    int n = res->n_tokens;
    res->tokens[n] = so->id;
    res->logprobs[n] = so->logprob;
    for (int k = 0; k < res->top_k; k++) {
        res->top_ids[(size_t)n * res->top_k + k] = k < so->n_top ? so->top_ids[k] : -1;
        res->top_logprobs[(size_t)n * res->top_k + k] = k < so->n_top ? so->top_logprobs[k] : 0.0f;
    }
    res->n_tokens++;
    ss->hist[ss->n_hist++] = so->id;
    if (cb && cb(user, i, n, so->id)) {
        res->stop = GEN_STOP_CALLBACK;
        return 1;
    }
    if (res->n_tokens >= rq->max_tokens) {
        res->stop = GEN_STOP_LENGTH;
        return 1;
    }
    if (ss->n_hist >= g->p.n_ctx) {
        res->stop = GEN_STOP_CONTEXT;
        return 1;
    }
    return 0;
}

int gen_run(gen_engine *g, const gen_request *reqs, int n_reqs, gen_result *results,
            gen_timing *timing, gen_token_cb cb, void *user, st_err *err) {
    const llama_config *c = stage_config(g->st);
    if (n_reqs < 1 || n_reqs > g->p.max_seqs)
        return st_errf(err, "gen: %d requests, expected 1..%d", n_reqs, g->p.max_seqs);
    for (int i = 0; i < n_reqs; i++) {
        const gen_request *r = &reqs[i];
        if (!r->prompt || r->n_prompt < 1) return st_errf(err, "gen: request %d has an empty prompt", i);
        if (r->max_tokens < 1) return st_errf(err, "gen: request %d: max_tokens %d must be >= 1", i, r->max_tokens);
        if (r->n_prompt >= g->p.n_ctx)
            return st_errf(err, "gen: request %d: prompt of %d tokens does not fit the context of %d",
                           i, r->n_prompt, g->p.n_ctx);
        for (int k = 0; k < r->n_prompt; k++)
            if (r->prompt[k] < 0 || r->prompt[k] >= c->n_vocab)
                return st_errf(err, "gen: request %d: token id %d outside the vocabulary [0, %d)", i,
                               r->prompt[k], c->n_vocab);
        if (sampler_params_validate(&r->sampling, err)) return st_err_prefix(err, "gen: request %d", i);
    }
    int rc = -1;
    seq_state *ss = calloc((size_t)n_reqs, sizeof *ss);
    stage_seq *seqs = calloc((size_t)n_reqs, sizeof *seqs);
    stage_sample_out *outs = calloc((size_t)n_reqs, sizeof *outs);
    int *seq_req = calloc((size_t)n_reqs, sizeof *seq_req);
    int32_t *tokens = malloc((size_t)(g->p.max_batch_tokens > n_reqs ? g->p.max_batch_tokens : n_reqs) * sizeof *tokens);
    memset(results, 0, (size_t)n_reqs * sizeof *results);
    if (!ss || !seqs || !outs || !seq_req || !tokens) {
        st_errf(err, "gen: out of memory");
        goto done;
    }
    for (int i = 0; i < n_reqs; i++) {
        const gen_request *r = &reqs[i];
        gen_result *res = &results[i];
        kv_table_init(&ss[i].tab);
        int cap = r->n_prompt + r->max_tokens;
        ss[i].hist = malloc((size_t)cap * sizeof(int32_t));
        res->tokens = malloc((size_t)r->max_tokens * sizeof(int32_t));
        res->logprobs = malloc((size_t)r->max_tokens * sizeof(float));
        res->top_k = r->sampling.n_top_logprobs;
        if (res->top_k > 0) {
            res->top_ids = malloc((size_t)r->max_tokens * res->top_k * sizeof(int32_t));
            res->top_logprobs = malloc((size_t)r->max_tokens * res->top_k * sizeof(float));
        }
        if (!ss[i].hist || !res->tokens || !res->logprobs ||
            (res->top_k > 0 && (!res->top_ids || !res->top_logprobs))) {
            st_errf(err, "gen: out of memory");
            goto done;
        }
        memcpy(ss[i].hist, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
        ss[i].n_hist = r->n_prompt;
        ss[i].active = 1;
    }

    const double t0 = st_now_s();
    int64_t prefill_tokens = 0, decode_tokens = 0;
    int decode_steps = 0;
    /* Prefill: batches of whole prompts or chunks of them, max_batch_tokens each. */
    int next = 0;
    while (next < n_reqs) {
        int ns = 0, nt = 0;
        while (next < n_reqs && nt < g->p.max_batch_tokens) {
            const gen_request *r = &reqs[next];
            seq_state *s = &ss[next];
            int32_t left = r->n_prompt - s->n_prefilled;
            int32_t take = left < g->p.max_batch_tokens - nt ? left : g->p.max_batch_tokens - nt;
            if (kv_table_reserve(g->kv, &s->tab, s->n_prefilled + take, err)) goto done;
            memcpy(tokens + nt, r->prompt + s->n_prefilled, (size_t)take * sizeof(int32_t));
            seqs[ns] = (stage_seq){.seq_id = (uint64_t)next,
                                   .pos = s->n_prefilled,
                                   .n_tokens = take,
                                   .block_table = s->tab.blocks,
                                   .n_blocks = s->tab.n_blocks,
                                   .want_logits = s->n_prefilled + take == r->n_prompt,
                                   .sampling = r->sampling,
                                   .step = 0,
                                   .history = s->hist,
                                   .n_history = s->n_hist};
            seq_req[ns++] = next;
            s->n_prefilled += take;
            nt += take;
            if (s->n_prefilled == r->n_prompt) next++;
        }
        stage_batch b = {.n_seqs = ns, .seqs = seqs, .n_tokens = nt, .tokens = tokens};
        if (stage_forward(g->st, &b, NULL, NULL, outs, err)) goto done;
        prefill_tokens += nt;
        for (int k = 0; k < ns; k++) {
            if (!seqs[k].want_logits) continue;
            int i = seq_req[k];
            if (take_token(g, &reqs[i], i, &ss[i], &results[i], &outs[k], cb, user)) {
                ss[i].active = 0;
                kv_table_release(g->kv, &ss[i].tab);
            }
        }
    }
    const double t1 = st_now_s();
    /* Decode: one token per active sequence per step. */
    for (;;) {
        int ns = 0;
        for (int i = 0; i < n_reqs; i++) {
            if (!ss[i].active) continue;
            int32_t pos = ss[i].n_hist - 1; /* the last sampled token is not in the cache yet */
            if (kv_table_reserve(g->kv, &ss[i].tab, pos + 1, err)) goto done;
            tokens[ns] = ss[i].hist[pos];
            seqs[ns] = (stage_seq){.seq_id = (uint64_t)i,
                                   .pos = pos,
                                   .n_tokens = 1,
                                   .block_table = ss[i].tab.blocks,
                                   .n_blocks = ss[i].tab.n_blocks,
                                   .want_logits = true,
                                   .sampling = reqs[i].sampling,
                                   .step = (uint64_t)results[i].n_tokens,
                                   .history = ss[i].hist,
                                   .n_history = ss[i].n_hist};
            seq_req[ns++] = i;
        }
        if (ns == 0) break;
        stage_batch b = {.n_seqs = ns, .seqs = seqs, .n_tokens = ns, .tokens = tokens};
        if (stage_forward(g->st, &b, NULL, NULL, outs, err)) goto done;
        decode_tokens += ns;
        decode_steps++;
        for (int k = 0; k < ns; k++) {
            int i = seq_req[k];
            if (take_token(g, &reqs[i], i, &ss[i], &results[i], &outs[k], cb, user)) {
                ss[i].active = 0;
                kv_table_release(g->kv, &ss[i].tab);
            }
        }
    }
    const double t2 = st_now_s();
    if (timing) {
        memset(timing, 0, sizeof *timing);
        timing->ttft_s = t1 - t0;
        timing->prefill_s = t1 - t0;
        timing->decode_s = t2 - t1;
        timing->prefill_tokens = prefill_tokens;
        timing->decode_tokens = decode_tokens;
        timing->prefill_tok_s = t1 > t0 ? (double)prefill_tokens / (t1 - t0) : 0.0;
        timing->decode_tok_s = t2 > t1 ? (double)decode_tokens / (t2 - t1) : 0.0;
        timing->decode_steps = decode_steps;
    }
    rc = 0;
done:
    if (ss) {
        for (int i = 0; i < n_reqs; i++) {
            kv_table_release(g->kv, &ss[i].tab);
            free(ss[i].hist);
        }
    }
    if (rc != 0 && results)
        for (int i = 0; i < n_reqs; i++) gen_result_free(&results[i]);
    free(ss);
    free(seqs);
    free(outs);
    free(seq_req);
    free(tokens);
    return rc;
}
