/* sched.h — the coordinator's scheduler core: pure logic, no I/O.
 *
 * It owns the request queue, the sequence states and the KV block tables
 * (model/kv.h; the allocator is the caller's and sized to the minimum of the
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
 * -> DECODE (one token per step) -> finished (removed, blocks freed).
 *
 * Policy
 * - Continuous batching: waiting requests are admitted between steps, FIFO,
 *   while running < max_seqs and the KV cache can hold their worst case.
 * - KV admission control: admission reserves ceil((n_prompt + max_new) /
 *   block_size) blocks; blocks are taken from the allocator lazily as the
 *   sequence grows (its block table covers exactly the positions sent so far)
 *   and the unused reservation is never handed to another sequence. So a
 *   running sequence never runs out of KV and nothing is ever preempted.
 * - Chunked prefill: a prompt is sent in chunks of at most prefill_chunk
 *   tokens; only the chunk that ends the prompt asks for a sample.
 * - Pipelining: up to max_inflight (default n_stages) micro-batches are in
 *   flight. A sequence is in at most one of them, so its tokens stay in order.
 *   Each launch takes ceil(idle / free_slots) idle sequences, but at most
 *   ceil(active / max_inflight) (active = in flight or wanting tokens), decode
 *   first, then prefill chunks, in admission order, within max_batch_tokens.
 *   So e.g. 8 decoding sequences on 2 stages form 2 micro-batches of 4 and no
 *   stage idles (GPipe / vLLM virtual-engine style), and groups that formed
 *   unevenly (1 request alone, then 7 more) even out within two launches.
 * - Blocks are freed when a sequence finishes and when it is cancelled; a
 *   sequence cancelled while in flight keeps its blocks until that batch comes
 *   back or is aborted, because stages may still be writing them.
 *
 * Not thread-safe: one owner thread (the coordinator's event loop).
 */
#ifndef STRATA_COORDINATOR_SCHED_H
#define STRATA_COORDINATOR_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "model/kv.h"

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
} sched_config;

enum sched_state { SCHED_WAITING = 0, SCHED_PREFILL = 1, SCHED_DECODE = 2 };
enum sched_finish { SCHED_NOT_FINISHED = 0, SCHED_FINISH_STOP = 1, SCHED_FINISH_LENGTH = 2,
                    SCHED_FINISH_ERROR = 3 };

/* sched_add results. */
#define SCHED_EINVAL (-1) /* bad request: empty prompt, beyond n_ctx or the KV capacity */
#define SCHED_EFULL (-2)  /* the queue is full: retry later (HTTP 429) */

/* One sequence's part of a micro-batch: tokens at positions [pos, pos+n_tokens);
 * [0, pos) are already in the stages' KV caches. block_table covers
 * pos + n_tokens positions. sample: the last stage samples after the last
 * token (end of prefill, and every decode step). */
typedef struct sched_slice {
    uint64_t seq_id;
    void *user;            /* as given to sched_add */
    int32_t pos;
    int32_t n_tokens;
    const int32_t *tokens; /* n_tokens ids (into the batch's tokens) */
    const int32_t *block_table;
    int32_t n_blocks;
    bool sample;
    bool prefill;          /* part of the prompt (else a decode step) */
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
    int32_t blocks_free, blocks_used, n_blocks;
    uint64_t batches_launched, tokens_launched;
} sched_stats;

typedef struct sched_seq_info {
    enum sched_state state;
    int n_prompt, n_computed, n_generated;
    int32_t n_blocks;      /* block table length */
    bool in_flight, cancelled;
} sched_seq_info;

/* kv: the caller's allocator (it must outlive the scheduler). NULL + err on a bad config. */
sched *sched_create(const sched_config *cfg, kv_alloc *kv, st_err *err);
/* Frees every sequence's blocks and the scheduler. */
void sched_destroy(sched *s);

/* Queues a request: prompt[n_prompt] (copied; BOS included when wanted),
 * max_new >= 1 tokens to generate. *id_out gets the sequence id.
 * Returns 0, SCHED_EINVAL or SCHED_EFULL (with err). */
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
/* -1 when the id is unknown. */
int sched_seq_info_get(const sched *s, uint64_t seq_id, sched_seq_info *out);

#endif
