/* stage.h — a pipeline stage: layers [first, last) of a Llama model, run with
 * tensor parallelism t as t rank threads of this process.
 *
 * Each rank has its own backend instance (compute/backend.h), its own thread
 * pool (the stage's n_threads split between ranks, at least 1 each), its own
 * comm rank (compute/comm.h), and only its Megatron shard of the weights
 * (model/shard.h): the rows/columns it needs are copied from the GGUF mapping in
 * their file dtype. The first stage (first == 0) also holds its slice of the
 * token embedding; the last stage (last == n_layer) the final norm and its
 * slice of the LM head. Load progress (percent, bytes) is logged at info level.
 *
 * A forward per micro-batch (per rank):
 *   first stage:  x = all_reduce(embed_slice(tokens))                  1 all-reduce
 *   each layer:   x += all_reduce(O_r · attn(rope(Q_r xn), rope(K_r xn), V_r xn))
 *                 x += all_reduce(down_r · (silu(gate_r xn) * up_r xn))  2 all-reduces
 *   last stage:   for the last token of each sequence that wants logits:
 *                 logits_r = LM_r · rmsnorm(x); per-rank candidates (top-K ids
 *                 and logits, max, logsumexp) are all-gathered     1 all-gather
 *                 and merged into the sampled id and the top logprobs; full
 *                 logits never leave their rank. When only some of the
 *                 batch's rows are sampled, the last layer's FFN (and its
 *                 all-reduce) runs on those rows alone, as llama.cpp does.
 * So per forward: all_reduce_calls = 2 * (last - first) + (first == 0),
 * all_gather_calls = (last stage and some sequence wants logits) ? 1 : 0.
 * This holds for every t, t = 1 included (the comm group then has one rank).
 *
 * KV cache: each rank holds, for each of its layers, K and V caches of
 * kv_blocks * block_size slots of its local KV heads (kv_type). The caller owns the
 * block tables (model/kv.h) and sends them with every batch; the stage only
 * reads them. Block ids are the same on every stage of a pipeline.
 *
 * Threading: stage_open/stage_forward/stage_close are called from one thread;
 * stage_forward blocks until all ranks are done. Not reentrant.
 */
#ifndef STRATA_ENGINE_STAGE_H
#define STRATA_ENGINE_STAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/stage_batch.h"
#include "model/llama.h"
#include "model/sampler.h"

#define STAGE_MAX_TOP_LOGPROBS SAMPLER_MAX_TOP_LOGPROBS
#define STAGE_MAX_DEVICES 64

typedef struct stage stage;

typedef struct stage_params {
    const char *model_path; /* GGUF file */
    int first_layer;        /* first layer of the stage */
    int last_layer;         /* one past the last layer; -1 = n_layer */
    int tp;                 /* TP degree (ranks), >= 1 */
    int n_threads;          /* CPU threads for all ranks together; 0 = st_cpu_count() */
    int kv_blocks;          /* KV cache blocks (each rank, same ids); >= 1 */
    int block_size;         /* tokens per KV block; 0 = 16 */
    const char *backend;    /* "cpu" (default when NULL or "") or "cuda" (NCCL; compute/registry.h) */
    /* Device backends: rank r runs on devices[r] (n_devices == tp, distinct,
     * visible); n_devices 0 = rank r on device r. Refused for "cpu". */
    int devices[STAGE_MAX_DEVICES];
    int n_devices;
    uint32_t kv_type;       /* KV cache element type: GGML_TYPE_F32 (0, the default) or
                               GGML_TYPE_F16 (llama.cpp's default, half the memory) */
    /* With use_model_fd: the GGUF is read from this open regular file (the
     * caller keeps owning it; model_path only names it in messages). The
     * worker opens it confined to its --model-dir (daemon/model_path.h). */
    bool use_model_fd;
    int model_fd;
    /* Optional: set from another thread to abandon the load; stage_open then
     * fails soon (checked between tensors) with "load cancelled". */
    const atomic_bool *cancel;
    /* Device backends: the activation workspace is allocated at load for
     * micro-batches of up to this many tokens (and logits for up to
     * min(this, 256) sequences), so a forward allocates nothing; a larger
     * batch grows it once (logged). 0 = 512, the coordinator's default
     * max_batch_tokens. */
    int max_batch_tokens;
} stage_params;

/* Per-rank accounting. */
typedef struct stage_rank_stats {
    size_t weight_bytes;       /* resident weights (the backend's own accounting) */
    size_t buf_bytes;          /* KV cache + activations */
    uint64_t all_reduce_calls; /* cumulative, from comm_stats */
    uint64_t all_gather_calls;
    double comm_seconds;       /* time inside collectives */
    double busy_seconds;       /* time inside forwards */
} stage_rank_stats;

typedef struct stage_stats {
    uint64_t forwards;    /* stage_forward calls */
    uint64_t tokens;      /* tokens processed */
    double busy_seconds;  /* wall time inside stage_forward */
    double open_seconds;  /* since stage_open returned */
} stage_stats;

/* Loads the stage. NULL + err on a bad model, bad layer range, a TP degree the
 * model cannot be split into (model/shard.h), or out of memory. */
stage *stage_open(const stage_params *p, st_err *err);
void stage_close(stage *s);

const llama_config *stage_config(const stage *s);
int stage_first_layer(const stage *s);
int stage_last_layer(const stage *s);
bool stage_is_first(const stage *s);
bool stage_is_last(const stage *s);
int stage_tp(const stage *s);
int stage_kv_blocks(const stage *s);
int stage_block_size(const stage *s);

/* Runs one micro-batch.
 *  hidden_in:  first stage: ignored (NULL; b->tokens is used);
 *              else [b->n_tokens, n_embd] f32 from the previous stage.
 *  hidden_out: non-last stage: [b->n_tokens, n_embd] f32 to send on; last: ignored (NULL).
 *  samples:    last stage: b->n_seqs entries; else ignored (NULL).
 * Errors (-1 + err, the KV cache of other sequences untouched): a token id
 * outside the vocabulary, inconsistent counts, a block table too short or with
 * an id >= kv_blocks, missing input/output buffers. */
int stage_forward(stage *s, const stage_batch *b, const float *hidden_in, float *hidden_out,
                  stage_sample_out *samples, st_err *err);

/* Whether the stage failed for good: a rank's communicator was aborted (an
 * NCCL error or a missed deadline, compute/cuda/comm_nccl.h), so every later
 * stage_forward fails at once. The owner reports the stage lost (the worker:
 * BatchError.stage_failed) and closes it; why (optional) gets the reason. */
bool stage_failed(const stage *s, st_err *why);

/* The device hand-off of activations (a pipeline boundary on NCCL,
 * daemon/act_p2p.h): as stage_forward, but `in` (when in_dev) and `out`
 * (when out_dev) are device memory on rank 0's device, from stage_dev_alloc.
 * Every rank copies its input rows from there (a peer copy on another GPU);
 * rank 0 copies the output there and the call returns once it is written.
 * -1 + err on a host backend. */
int stage_forward_io(stage *s, const stage_batch *b, const void *in, bool in_dev, void *out, bool out_dev,
                     stage_sample_out *samples, st_err *err);
/* Device memory on rank 0's device for the hand-off, at least `bytes`. Freed
 * buffers are kept (up to 8) and handed out again, so a forward does not
 * allocate device memory once the sizes have been seen; at most 64 in all,
 * released by stage_close. NULL + err on a host backend. */
void *stage_dev_alloc(stage *s, size_t bytes, st_err *err);
void stage_dev_free(stage *s, void *p);
/* Rank 0's device (StageAssign.devices[0], else 0). */
int stage_device(const stage *s);

int stage_rank_stats_get(const stage *s, int rank, stage_rank_stats *out);
void stage_stats_get(const stage *s, stage_stats *out);

#endif
