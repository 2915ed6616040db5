/* batch_plan.c — checks a micro-batch and lays it out for the ranks. See
 * batch_plan.h. */
#include "engine/batch_plan.h"

#include <stdlib.h>

#include "model/sampler.h"

static int grow(batch_arrays *a, int64_t T, int n_seqs, st_err *err) {
    if (T > a->tok_cap) {
        int64_t cap = T < 64 ? 64 : T;
        int32_t *p = realloc(a->pos, (size_t)cap * sizeof *p);
        if (p) a->pos = p;
        int32_t *q = realloc(a->slots, (size_t)cap * sizeof *q);
        if (q) a->slots = q;
        if (!p || !q) return st_errf(err, "stage: out of memory");
        a->tok_cap = cap;
    }
    if (n_seqs > a->seq_cap) {
        int cap = n_seqs < 16 ? 16 : n_seqs;
        backend_attn_seq *s = realloc(a->aseqs, (size_t)cap * sizeof *s);
        if (s) a->aseqs = s;
        int32_t *r = realloc(a->logit_rows, (size_t)cap * sizeof *r);
        if (r) a->logit_rows = r;
        int32_t *q = realloc(a->logit_seq, (size_t)cap * sizeof *q);
        if (q) a->logit_seq = q;
        if (!s || !r || !q) return st_errf(err, "stage: out of memory");
        a->seq_cap = cap;
    }
    return 0;
}

int batch_plan_make(batch_plan *plan, batch_arrays *a, const stage_shape *sh, const stage_batch *b,
                    stage_sample_out *samples, int32_t vocab_local_max, st_err *err) {
    const bool first = sh->first == 0, last = sh->last == sh->cfg.n_layer;
    if (grow(a, b->n_tokens, b->n_seqs, err)) return -1;
    const int bs = sh->block_size;
    int64_t row = 0;
    int n_logit = 0;
    int32_t max_cands = 1;
    for (int i = 0; i < b->n_seqs; i++) {
        const stage_seq *sq = &b->seqs[i];
        if (sq->n_tokens < 1 || sq->pos < 0 || row + sq->n_tokens > b->n_tokens)
            return st_errf(err, "stage: sequence %d (id %llu) has bad n_tokens %d / pos %d", i,
                           (unsigned long long)sq->seq_id, sq->n_tokens, sq->pos);
        int64_t end = (int64_t)sq->pos + sq->n_tokens;
        if (end > (int64_t)sh->kv_blocks * bs || end > INT32_MAX / 2)
            return st_errf(err, "stage: sequence %llu reaches position %lld, beyond the KV cache",
                           (unsigned long long)sq->seq_id, (long long)end);
        int64_t need = (end + bs - 1) / bs;
        if (!sq->block_table || sq->n_blocks < need)
            return st_errf(err, "stage: sequence %llu needs %lld KV blocks for %lld positions, its table has %d",
                           (unsigned long long)sq->seq_id, (long long)need, (long long)end, sq->n_blocks);
        for (int64_t k = 0; k < need; k++)
            if (sq->block_table[k] < 0 || sq->block_table[k] >= sh->kv_blocks)
                return st_errf(err, "stage: sequence %llu: block id %d outside [0, %d)",
                               (unsigned long long)sq->seq_id, sq->block_table[k], sh->kv_blocks);
        for (int32_t t = 0; t < sq->n_tokens; t++) {
            int32_t p = sq->pos + t;
            a->pos[row + t] = p;
            a->slots[row + t] = sq->block_table[p / bs] * bs + p % bs;
            if (first && (b->tokens[row + t] < 0 || b->tokens[row + t] >= sh->cfg.n_vocab))
                return st_errf(err, "stage: token id %d outside the vocabulary [0, %d)",
                               b->tokens[row + t], sh->cfg.n_vocab);
        }
        a->aseqs[i] = (backend_attn_seq){.tok0 = (int32_t)row, .n_tokens = sq->n_tokens,
                                         .pos0 = sq->pos, .block_table = sq->block_table,
                                         .n_blocks = sq->n_blocks};
        if (last) {
            samples[i].id = -1;
            samples[i].n_top = 0;
        }
        if (last && sq->want_logits) {
            if (sampler_params_validate(&sq->sampling, err))
                return st_err_prefix(err, "stage: sequence %llu", (unsigned long long)sq->seq_id);
            int32_t m = sampler_tp_max_cands(&sq->sampling);
            if (m > max_cands) max_cands = m;
            a->logit_rows[n_logit] = (int32_t)(row + sq->n_tokens - 1);
            a->logit_seq[n_logit] = i;
            n_logit++;
        }
        row += sq->n_tokens;
    }
    if (row != b->n_tokens)
        return st_errf(err, "stage: sequences hold %lld tokens, batch says %d", (long long)row, b->n_tokens);
    if (max_cands > vocab_local_max) max_cands = vocab_local_max;
    *plan = (batch_plan){.b = b, .samples = samples, .pos = a->pos, .slots = a->slots, .aseqs = a->aseqs,
                         .logit_rows = a->logit_rows, .logit_seq = a->logit_seq, .n_logit = n_logit,
                         .max_cands = max_cands};
    return 0;
}

void batch_arrays_free(batch_arrays *a) {
    free(a->pos);
    free(a->slots);
    free(a->aseqs);
    free(a->logit_rows);
    free(a->logit_seq);
    *a = (batch_arrays){0};
}
