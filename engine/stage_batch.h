/* stage_batch.h — plain data: a micro-batch as stage_forward takes it (its
 * sequences back to back) and what the last stage returns per sequence. Kept
 * apart from stage.h (which includes it) so that the files that run a forward
 * read the batch without including the stage's own interface. */
#ifndef STRATA_ENGINE_STAGE_BATCH_H
#define STRATA_ENGINE_STAGE_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "model/sampler.h"

/* One sequence in a micro-batch. Its n_tokens tokens are at positions
 * [pos, pos + n_tokens); positions [0, pos) are already in this stage's KV
 * cache. block_table (host, n_blocks ids) covers at least pos + n_tokens
 * positions. Prefill is one entry with the whole prompt (or a chunk of it);
 * decode is n_tokens = 1. */
typedef struct stage_seq {
    uint64_t seq_id;
    int32_t pos;
    int32_t n_tokens;
    const int32_t *block_table;
    int32_t n_blocks;
    bool want_logits;    /* last stage: sample after this chunk's last token */
    /* Last stage, when want_logits (model/sampler.h semantics):
     * sampling.n_top_logprobs = top (id, logprob) pairs wanted;
     * step = index of the token being sampled among the generated ones (0 for
     * the first; it feeds the seeded draw); history = tokens the penalties
     * count (may be NULL/0; only read when a penalty is on), the first
     * n_history_prompt of them the prompt (repeat penalty only:
     * sampler_history_rebuild_prompt). */
    sampler_params sampling;
    uint64_t step;
    const int32_t *history;
    int32_t n_history;
    int32_t n_history_prompt;
} stage_seq;

/* A micro-batch: sequences back to back; n_tokens = sum of seqs[i].n_tokens.
 * tokens (first stage only): the n_tokens token ids in the same order. */
typedef struct stage_batch {
    int n_seqs;
    const stage_seq *seqs;
    int32_t n_tokens;
    const int32_t *tokens;
} stage_batch;

/* Last stage result for one sequence (entry i for seqs[i]; filled only where
 * want_logits): the sampled id, its logprob, and n_top = n_top_logprobs pairs.
 * Logprobs are natural logs of the full-vocabulary softmax of the raw logits
 * (before penalties and temperature), as llama.cpp/OpenAI report them. */
typedef sampler_token_info stage_sample_out;

#endif
