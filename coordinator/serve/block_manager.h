/* block_manager.h — the coordinator's KV block pool: reference-counted
 * blocks, allocated as sequences grow, with automatic prefix caching.
 *
 * Sources: Kwon et al., "Efficient Memory Management for LLM Serving with
 * PagedAttention" (vLLM, 2023) for the paged blocks; vLLM's automatic prefix
 * caching (docs.vllm.ai, "Automatic Prefix Caching") for the content
 * addresses and the eviction order.
 *
 * Every stage has n_blocks KV blocks of block_size tokens and uses the same
 * block ids, so this one pool (the scheduler's, sched.h) decides for all of
 * them. A block is in exactly one of three places:
 *   - free:      refcount 0, no content address; taken first by bm_alloc;
 *   - cached:    refcount 0, has a content address (bm_publish); still
 *                findable (bm_find) and reusable until evicted, least
 *                recently released first, when no free block is left;
 *   - owned:     refcount >= 1 (the number of sequences whose block table
 *                holds it); a block owned by more than one sequence is always
 *                a published prefix block (full, read-only).
 *
 * Content address of a full block i of a sequence (the chain hash):
 *   h_i = SHA-256(h_{i-1} || tokens[i*bs .. (i+1)*bs) as int32 little-endian),
 *   h_-1 = the empty prefix (nothing hashed before the tokens),
 * so it names the block's tokens and every token before them: equal
 * addresses mean equal KV. bm_find compares the whole 32-byte digest and the
 * block's tokens, so a hash collision can never map a wrong block.
 *
 * With prefix caching off (bm_new's flag), bm_publish does nothing and no
 * block is ever shared or cached.
 *
 * Not thread-safe: one owner thread (the coordinator's event loop).
 */
#ifndef STRATA_COORDINATOR_SERVE_BLOCK_MANAGER_H
#define STRATA_COORDINATOR_SERVE_BLOCK_MANAGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct block_manager block_manager;

/* A chain hash (above). */
typedef struct bm_hash {
    unsigned char b[32];
} bm_hash;

/* n_blocks blocks of block_size tokens (both >= 1). NULL + err otherwise or
 * on out of memory. */
block_manager *bm_new(int32_t n_blocks, int32_t block_size, bool prefix_caching, st_err *err);
void bm_free(block_manager *m);

int32_t bm_n_blocks(const block_manager *m);
int32_t bm_block_size(const block_manager *m);
bool bm_prefix_caching(const block_manager *m);
/* Blocks bm_alloc can hand out now: free + cached (evictable). */
int32_t bm_n_free(const block_manager *m);
/* Of those, the cached ones (refcount 0 with a content address). */
int32_t bm_n_evictable(const block_manager *m);
/* Blocks needed for n_tokens positions (0 for n_tokens <= 0). */
int32_t bm_blocks_for(const block_manager *m, int64_t n_tokens);
int32_t bm_refcount(const block_manager *m, int32_t block);
/* Cached blocks evicted so far (their content address dropped for reuse). */
uint64_t bm_evictions(const block_manager *m);

/* A block for a sequence to write (refcount 1, no content address): a free
 * one (lowest id first), else the least recently released cached one, whose
 * address is dropped. -1 when every block is owned. */
int32_t bm_alloc(block_manager *m);
/* One owner lets go. At refcount 0 a published block becomes cached (most
 * recently used end of the eviction order), any other one free. Release a
 * sequence's blocks last first, so its tail is evicted before its prefix. */
void bm_release(block_manager *m, int32_t block);
/* One more owner of a block found by bm_find (taken off the eviction order
 * when it was cached). */
void bm_ref(block_manager *m, int32_t block);

/* The chain hash of a full block: parent = the previous block's (NULL for
 * the first block), tokens = block_size ids. 0, or -1 on a libcrypto
 * failure. */
int bm_chain_hash(const block_manager *m, const bm_hash *parent, const int32_t *tokens, bm_hash *out);
/* The published block with address h and these block_size tokens, or -1.
 * Takes no reference (bm_ref does). Always -1 with caching off. */
int32_t bm_find(const block_manager *m, const bm_hash *h, const int32_t *tokens);
/* Makes an owned, full block whose KV every stage has computed findable
 * under h (tokens: its block_size ids). Nothing happens when caching is off,
 * when the block is published already, or when another block holds that
 * address (the first one stays). */
void bm_publish(block_manager *m, int32_t block, const bm_hash *h, const int32_t *tokens);
/* Forgets every content address (the stages' KV caches are gone, e.g. a
 * restarted worker): cached blocks become free; owned ones stay owned but are
 * no longer findable. */
void bm_reset_cache(block_manager *m);

/* The invariant check (sched.c runs it after every scheduling step in Debug
 * and Asan builds). owners[b] = how many live block tables hold block b,
 * counted by the caller. Checks: refcount == owners for every block; a block
 * with owners > 1 is a published prefix block; a refcount-0 block is either
 * free or cached, exactly once; the free and cached counts match the lists.
 * 0, or -1 with the first violation in msg. */
int bm_verify(const block_manager *m, const int32_t *owners, char *msg, size_t cap);

#endif
