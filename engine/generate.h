/* generate.h — single-process generation on one stage that spans every layer
 * (what strata-run and strata-bench use).
 *
 * gen_run takes several prompts (token ids, BOS already included), prefills them
 * together (each prompt one sequence of one batch, chunked at max_batch_tokens),
 * then decodes all unfinished sequences together, one token each per step,
 * until each hits EOS (unless ignore_eos), its max_tokens, the context, or the
 * callback asks it to stop. It owns the KV block allocator (model/kv.h) and
 * the block tables; blocks are freed when a sequence finishes.
 *
 * Timing (seconds, tokens/s, wall clock):
 *   ttft_s        start of gen_run → first token of every sequence sampled
 *                 (= the prefill phase)
 *   prefill_tok_s prompt tokens / prefill seconds
 *   decode_tok_s  tokens generated after the first ones / decode seconds
 *                 (aggregate over the batch)
 */
#ifndef STRATA_ENGINE_GENERATE_H
#define STRATA_ENGINE_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/stage.h"
#include "model/llama.h"

typedef struct gen_engine gen_engine;

typedef struct gen_params {
    const char *model_path;
    int tp;              /* TP degree; 0 = 1 */
    int n_threads;       /* CPU threads in all; 0 = st_cpu_count() */
    int n_ctx;           /* max tokens per sequence; 0 = min(model context, 4096) */
    int max_seqs;        /* sequences one gen_run may hold; 0 = 16 */
    int block_size;      /* KV block tokens; 0 = 16 */
    int kv_blocks;       /* 0 = enough for max_seqs sequences of n_ctx tokens */
    int max_batch_tokens; /* prefill chunk; 0 = 512 */
    const char *backend; /* NULL = "cpu" */
    uint32_t kv_type;    /* GGML_TYPE_F32 (0, default) or GGML_TYPE_F16; see stage_params */
} gen_params;

enum gen_stop { GEN_STOP_LENGTH = 0, GEN_STOP_EOS = 1, GEN_STOP_CALLBACK = 2, GEN_STOP_CONTEXT = 3 };

typedef struct gen_request {
    const int32_t *prompt; /* token ids, BOS included when wanted */
    int n_prompt;          /* >= 1 */
    int max_tokens;        /* >= 1 */
    bool ignore_eos;
    sampler_params sampling; /* n_top_logprobs: top pairs per generated token;
                                penalties count the prompt and the output */
} gen_request;

typedef struct gen_result {
    int32_t *tokens;   /* n_tokens generated ids (malloc'd; gen_result_free) */
    int n_tokens;
    int top_k;         /* = request's sampling.n_top_logprobs */
    int32_t *top_ids;  /* [n_tokens, top_k] or NULL */
    float *top_logprobs; /* [n_tokens, top_k] natural-log probabilities */
    float *logprobs;   /* [n_tokens] logprob of each generated id */
    enum gen_stop stop;
} gen_result;

typedef struct gen_timing {
    double ttft_s;
    double prefill_s, decode_s;
    int64_t prefill_tokens, decode_tokens;
    double prefill_tok_s, decode_tok_s;
    int decode_steps;
} gen_timing;

/* Called after each sampled token of request `req`; `index` counts from 0.
 * Return non-zero to stop that sequence (e.g. a stop string matched). */
typedef int (*gen_token_cb)(void *user, int req, int index, int32_t token);

gen_engine *gen_open(const gen_params *p, st_err *err);
void gen_close(gen_engine *g);
const llama_config *gen_config(const gen_engine *g);
stage *gen_stage(gen_engine *g); /* for per-rank stats */

/* Runs n_reqs requests together (n_reqs <= max_seqs); results[n_reqs] are
 * filled (free each with gen_result_free); timing may be NULL, cb may be NULL.
 * -1 + err on a bad request (empty prompt, id out of range, too long for
 * n_ctx), or a failed forward. */
int gen_run(gen_engine *g, const gen_request *reqs, int n_reqs, gen_result *results,
            gen_timing *timing, gen_token_cb cb, void *user, st_err *err);
void gen_result_free(gen_result *r);

#endif
