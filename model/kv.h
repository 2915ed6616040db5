/* kv.h — the paged KV-cache block allocator and per-sequence block tables.
 *
 * Source: Kwon et al., "Efficient Memory Management for LLM Serving with
 * PagedAttention" (vLLM, 2023). The cache of every stage is n_blocks blocks of
 * block_size tokens; token at position p of a sequence lives in block
 * table[p / block_size], slot p % block_size. Whoever schedules (the
 * coordinator, or engine/generate.c in one process) owns the allocator and the
 * tables and sends the tables with each batch; every stage uses the same block
 * ids, and the engine only reads them.
 *
 * Not thread-safe: one owner thread.
 */
#ifndef STRATA_MODEL_KV_H
#define STRATA_MODEL_KV_H

#include <stdint.h>

#include "common/err.h"

typedef struct kv_alloc kv_alloc;

/* n_blocks blocks of block_size tokens each (both >= 1). */
kv_alloc *kv_alloc_new(int32_t n_blocks, int32_t block_size, st_err *err);
void kv_alloc_free(kv_alloc *a);
int32_t kv_alloc_n_blocks(const kv_alloc *a);
int32_t kv_alloc_block_size(const kv_alloc *a);
int32_t kv_alloc_n_free(const kv_alloc *a);
/* Blocks needed to hold n_tokens tokens. */
int32_t kv_blocks_for(const kv_alloc *a, int64_t n_tokens);

/* Takes one free block id (lowest first); -1 with err when none is free. */
int32_t kv_block_get(kv_alloc *a, st_err *err);
/* Returns a block; -1 with err on a bad or already-free id (double free). */
int kv_block_put(kv_alloc *a, int32_t block, st_err *err);

/* A sequence's block table: blocks[i] holds positions [i*bs, (i+1)*bs). */
typedef struct kv_table {
    int32_t *blocks;
    int32_t n_blocks;
    int32_t cap;
} kv_table;

void kv_table_init(kv_table *t);
/* Grows t until it covers n_tokens positions, taking blocks from a. On
 * failure (out of blocks) t is left unchanged and -1 is returned with err. */
int kv_table_reserve(kv_alloc *a, kv_table *t, int64_t n_tokens, st_err *err);
/* Gives every block back to a and empties t (t stays usable). */
void kv_table_release(kv_alloc *a, kv_table *t);

#endif
