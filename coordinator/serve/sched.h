/* sched.h — the coordinator's scheduler core: pure logic, no I/O.
 *
 * It owns the request queue, the sequence states and the KV block tables
 * (block_manager.h: the pool is the caller's and sized to the minimum of the
 * stages' kv_blocks, since every stage uses the same block ids), and it forms
 * the micro-batches that the coordinator sends down the pipeline.
 *
 *   sched_add          queue a request (bounded: full -> SCHED_EFULL, HTTP 429)
 *   sched_next_microbatch  the next micro-batch to launch, or NULL
 *   sched_on_tokens    the last stage's sampled ids for a launched batch
 *   sched_cancel       drop a sequence (client gone, stop string matched)
 *   sched_abort_batch  a launched batch was lost: its sequences go back, unadvanced
 *
 * Sequence states: WAITING (queued) -> PREFILL (admitted; prompt chunks run)
 * -> DECODE (one token per step) -> finished (removed, blocks released);
 * PREFILL or DECODE -> WAITING again when preempted.
 *
 * Policy (vLLM's block manager and scheduler)
 * - Continuous batching: waiting requests are admitted between steps, FIFO
 *   (no overtaking, so nobody starves), while running < max_seqs and the
 *   free blocks (block_manager.h: free + cached) cover the blocks of every
 *   token the sequence has (its prompt, plus what it generated before a
 *   preemption) that the prefix cache does not hold, plus a watermark of 1%
 *   of the pool and headroom_blocks per running sequence (none when nothing
 *   runs). Those blocks are taken at admission. Nothing is admitted in a
 *   step that had to preempt. The headroom is the growth room SGLang keeps
 *   for running requests (its new_token_ratio, fixed here): without it every
 *   block a finished sequence frees goes to a new prompt, the running ones
 *   then preempt it and its prefill is wasted (with 32 clients of 50..500 +
 *   200..1000 tokens on 512 blocks, 4 blocks of headroom cut preemptions
 *   from 129 to 31 and the recomputed tokens by two thirds, at the same
 *   mean batch; docs/kv-cache.md).
 * - KV blocks on demand: a decode step that crosses a block boundary takes
 *   one more block. When none is free, the newest running sequence (by
 *   arrival: a resumed sequence keeps its place, as vLLM's FCFS priority)
 *   that is not in flight is preempted (recompute): its blocks are released
 *   and it goes back to the front of the waiting queue, keeping its prompt
 *   and generated tokens; re-admitted, it prefills them all again (the
 *   prefix cache usually still holds most of them) and samples its next
 *   token as if nothing happened. A sequence older than every idle one waits
 *   for the batches in flight instead; with none in flight it preempts
 *   itself. A sequence alone always fits: sched_add refuses one whose prompt
 *   + max_new exceeds the whole pool.
 * - Prefix caching (when the pool has it on): each full block whose KV every
 *   stage computed is published under its chain hash; admission maps the
 *   longest run of cached blocks at the start of the sequence's tokens
 *   (refcounted, never written again) and prefills only the rest, at least
 *   the last token (so the last block it maps ends before it).
 * - Chunked prefill: a prompt is sent in chunks of at most prefill_chunk
 *   tokens; only the chunk that ends the known tokens asks for a sample.
 * - Pipelining: up to max_inflight (default n_stages) micro-batches are in
 *   flight. A sequence is in at most one of them, so its tokens stay in order.
 *   Each launch takes ceil(idle / free_slots) idle sequences, but at most
 *   ceil(active / max_inflight) (active = in flight or wanting tokens), decode
 *   first, then prefill chunks, in arrival order, within max_batch_tokens.
 *   So e.g. 8 decoding sequences on 2 stages form 2 micro-batches of 4 and no
 *   stage idles (GPipe / vLLM virtual-engine style), and groups that formed
 *   unevenly (1 request alone, then 7 more) even out within two launches.
 * - Blocks are released when a sequence finishes, is cancelled or is
 *   preempted; a sequence is never preempted while in flight, and one
 *   cancelled while in flight keeps its blocks until that batch comes back or
 *   is aborted, because stages may still be writing them.
 * - Debug and Asan builds (no NDEBUG) run sched_verify after every call that
 *   changes the tables and abort with its message when it fails.
 *
 * Not thread-safe: one owner thread (the coordinator's event loop).
 */
#ifndef STRATA_COORDINATOR_SCHED_H
#define STRATA_COORDINATOR_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/serve/block_manager.h"

typedef struct sched sched;

typedef struct sched_config {
    int n_stages;         /* pipeline stages, >= 1 */
    int max_inflight;     /* micro-batches in flight; 0 = n_stages; else >= n_stages */
    int max_queue;        /* waiting requests; >= 1 */
    int max_seqs;         /* running (admitted) sequences; >= 1 */
    int prefill_chunk;    /* max prompt tokens of one sequence per micro-batch; >= 1 */
    int max_batch_tokens; /* max tokens per micro-batch; >= 1 */
    int n_ctx;            /* max tokens (prompt + generated) per sequence; >= 2 */
    int32_t eos_id;       /* end-of-sequence id (finish "stop"); -1 = none */
    int headroom_blocks;  /* admission keeps this many free blocks per running sequence for
                             their growth (0..1024; 0 = vLLM's admission; policy below) */
} sched_config;

enum sched_state { SCHED_WAITING = 0, SCHED_PREFILL = 1, SCHED_DECODE = 2 };
enum sched_finish { SCHED_NOT_FINISHED = 0, SCHED_FINISH_STOP = 1, SCHED_FINISH_LENGTH = 2,
                    SCHED_FINISH_ERROR = 3 };

/* sched_add results. */
#define SCHED_EINVAL (-1) /* bad request: empty prompt, beyond n_ctx or the whole KV pool */
#define SCHED_EFULL (-2)  /* the queue is full: retry later (HTTP 429) */

/* One sequence's part of a micro-batch: tokens at positions [pos, pos+n_tokens);
 * [0, pos) are already in the stages' KV caches (computed by this sequence,
 * or mapped from the prefix cache). block_table covers at least pos +
 * n_tokens positions. sample: the last stage samples after the last token
 * (end of prefill, and every decode step). */
typedef struct sched_slice {
    uint64_t seq_id;
    void *user;            /* as given to sched_add */
    int32_t pos;
    int32_t n_tokens;
    const int32_t *tokens; /* n_tokens ids (into the batch's tokens) */
    const int32_t *block_table;
    int32_t n_blocks;
    bool sample;
    bool prefill;          /* part of a (re-)prefill (else a decode step) */
} sched_slice;

/* A micro-batch. Owned by the scheduler; valid until sched_on_tokens or
 * sched_abort_batch for its id. tokens: the n_tokens ids of all slices back to
 * back, in slice order. */
typedef struct sched_batch {
    uint64_t id;
    int n_seqs;
    const sched_slice *seqs;
    int32_t n_tokens;
    const int32_t *tokens;
} sched_batch;

/* What happened to a sequence when its batch came back. token >= 0 when one
 * was sampled (it is appended, and is reported even when it finishes the
 * sequence, e.g. the EOS id). When finish != SCHED_NOT_FINISHED the sequence
 * is gone and its blocks are free. */
typedef struct sched_event {
    uint64_t seq_id;
    void *user;
    int32_t token;
    int n_generated;       /* tokens generated so far, this one included */
    enum sched_finish finish;
} sched_event;

typedef struct sched_stats {
    int n_waiting, n_running, n_inflight; /* requests queued, admitted; batches in flight */
    int n_preempted_waiting;              /* of n_waiting: preempted, waiting to resume */
    int32_t blocks_free;   /* allocatable: free + cached (block_manager.h) */
    int32_t blocks_cached; /* of blocks_free: cached prefix blocks (evictable) */
    int32_t blocks_used, n_blocks;
    uint64_t batches_launched, tokens_launched;
    uint64_t prefill_tokens;      /* tokens launched in (re-)prefill slices */
    uint64_t preemptions;         /* sequences preempted (blocks released, re-queued) */
    uint64_t prefix_query_tokens; /* tokens of the sequences admitted (prompt + generated) */
    uint64_t prefix_hit_tokens;   /* of those, mapped from the prefix cache */
    uint64_t evictions;           /* cached blocks evicted for reuse */
} sched_stats;

typedef struct sched_seq_info {
    enum sched_state state;
    int n_prompt, n_computed, n_generated;
    int32_t n_blocks;      /* block table length */
    bool in_flight, cancelled;
} sched_seq_info;

/* kv: the caller's block pool (it must outlive the scheduler; the scheduler
 * is its only user). NULL + err on a bad config. */
sched *sched_create(const sched_config *cfg, block_manager *kv, st_err *err);
/* Frees every sequence's blocks and the scheduler. */
void sched_destroy(sched *s);

/* Queues a request: prompt[n_prompt] (copied; BOS included when wanted),
 * max_new >= 1 tokens to generate. *id_out gets the sequence id.
 * Returns 0, SCHED_EINVAL (beyond n_ctx, or prompt + max_new needs more
 * blocks than the whole pool: it could never run even alone) or SCHED_EFULL
 * (max_queue new requests wait already; preempted ones do not count), with
 * err. */
int sched_add(sched *s, const int32_t *prompt, int n_prompt, int max_new, void *user,
              uint64_t *id_out, st_err *err);

/* Admits waiting requests, then forms the next micro-batch. NULL when
 * max_inflight batches are out or no sequence is ready. */
const sched_batch *sched_next_microbatch(sched *s);

/* The last stage's result for batch `batch_id`: sampled[i] for seqs[i]
 * (entries where !sample are ignored), n_sampled == n_seqs. *events (owned by
 * the scheduler, valid until the next call) gets one entry per slice that was
 * sampled or finished, except cancelled sequences. A negative sampled id
 * finishes that sequence with SCHED_FINISH_ERROR. -1 + err (nothing changed)
 * on an unknown batch id or a count mismatch. */
int sched_on_tokens(sched *s, uint64_t batch_id, const int32_t *sampled, int n_sampled,
                    const sched_event **events, int *n_events, st_err *err);

/* The batch was lost (stage failure): its sequences become idle again at the
 * same positions (re-sent later, overwriting the same KV slots). */
int sched_abort_batch(sched *s, uint64_t batch_id, st_err *err);

/* Drops a sequence, whatever its state (see the policy above for in-flight
 * ones). -1 when the id is unknown (already finished or never added). */
int sched_cancel(sched *s, uint64_t seq_id);

void sched_stats_get(const sched *s, sched_stats *out);
/* Tokens the whole pool holds (n_blocks x block_size): the most one sequence
 * can ever have. */
int64_t sched_kv_capacity_tokens(const sched *s);
/* The stages' KV caches were lost (a restarted worker): forget the prefix
 * cache (block_manager.h: bm_reset_cache). */
void sched_reset_prefix_cache(sched *s);
/* The invariant check: every block's refcount equals the number of live
 * block tables holding it, a block held twice is a shared prefix block,
 * refcount-0 blocks are free or cached; each table covers the positions its
 * sequence computed. 0, or -1 with the first violation in msg. */
int sched_verify(const sched *s, char *msg, size_t cap);
/* -1 when the id is unknown. */
int sched_seq_info_get(const sched *s, uint64_t seq_id, sched_seq_info *out);

#endif
