/* shard.h — the Megatron-LM tensor-parallel shard plan for one rank.
 *
 * Source: Shoeybi et al., "Megatron-LM" (2019), §3; vLLM's
 * QKVParallelLinear / VocabParallelEmbedding for KV-head replication and the
 * vocabulary split.
 *
 * For TP degree t and rank r (0 <= r < t):
 *  - Column-parallel (output rows of the GGUF weight [N, K] are split):
 *    Q by query heads: heads [r*n_head/t, (r+1)*n_head/t) (n_head % t must be 0);
 *    K and V by KV heads: when t <= n_head_kv, heads [r*n_head_kv/t, ...)
 *    (n_head_kv % t must be 0); when t > n_head_kv, each rank holds ONE KV head,
 *    replicated as in vLLM: rank r uses KV head r*n_head_kv/t (t % n_head_kv must be 0).
 *    gate and up by n_ff rows.
 *  - Row-parallel (input columns of the weight are split, each followed by one
 *    all-reduce of the partial sums): O by the same query heads as Q (columns
 *    [q0*head_dim, q1*head_dim)), down by the same n_ff range as gate/up.
 *  - Vocabulary-parallel: token_embd rows and LM head rows [v0, v1).
 *  - Replicated: attn_norm, ffn_norm, output_norm.
 * Uneven sizes (n_ff, n_vocab) use st_split_range's rule: the first (n % t)
 * ranks get one more row. E.g. n_ff 172 at t=8 → 22,22,22,22,21,21,21,21;
 * n_vocab 512 at t=3 → 171,171,170.
 * Errors: t < 1, r out of range, n_head % t != 0, or an impossible KV split
 * return -1 with a message naming the numbers.
 */
#ifndef STRATA_MODEL_SHARD_H
#define STRATA_MODEL_SHARD_H

#include <stdint.h>

#include "common/err.h"
#include "model/llama.h"

typedef struct shard_range {
    int64_t lo, hi; /* [lo, hi) */
} shard_range;

typedef struct shard_plan {
    int tp, rank;
    shard_range q_heads;  /* global query heads of this rank */
    shard_range kv_heads; /* global KV heads held (length 1 when replicated) */
    int kv_replicated;    /* 1 when t > n_head_kv */
    shard_range ff;       /* rows of gate/up, columns of down */
    shard_range vocab;    /* rows of token_embd and of the LM head */
    /* Local sizes. */
    int n_head_local, n_head_kv_local, n_ff_local, n_vocab_local;
} shard_plan;

/* Splits [0, n) into t near-equal parts: part r (first n % t parts one longer). */
shard_range shard_split(int64_t n, int t, int r);

/* Plan for rank r of t. -1 with err when the model cannot be split t ways. */
int shard_plan_make(const llama_config *cfg, int tp, int rank, shard_plan *out, st_err *err);

#endif
