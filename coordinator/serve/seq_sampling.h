/* seq_sampling.h — one request's sampling parameters on the wire: what the
 * pump (cluster.c) puts in each slice's SamplingParams and SeqRecord history
 * (proto/frame.proto), and the request-owned copies of the arrays behind
 * them. The formulas are model/sampler.h's; this file only decides what
 * travels:
 *   - temperature, top-k/p, min-p, the seed, top logprobs as given;
 *   - repeat_penalty != 1 (vLLM's repetition_penalty): the whole history
 *     (penalty_last_n -1) of prompt + generated tokens, the prompt marked
 *     with history_prompt so it counts for that penalty only;
 *   - presence/frequency penalties: the generated tokens;
 *   - logit_bias, plus while fewer than min_tokens tokens were generated the
 *     min_tokens mask ids at -inf (vLLM's min_tokens).
 * History and bias go only on slices that sample.
 */
#ifndef STRATA_COORDINATOR_SERVE_SEQ_SAMPLING_H
#define STRATA_COORDINATOR_SERVE_SEQ_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/serve/engine_api.h"
#include "ib/frame.h"

/* Replaces q's borrowed arrays (sampling.bias_ids/bias_values,
 * min_tokens_mask) by copies q owns; -1 + err on out of memory (q's arrays
 * are then NULL and counts 0). */
int seq_sampling_own(coord_request *q, st_err *err);
/* Frees what seq_sampling_own allocated. */
void seq_sampling_release(coord_request *q);

/* Scratch behind one slice's fields, freed after the frame is sent. */
typedef struct seq_sampling_buf {
    int32_t *history;
    int32_t *bias_ids;
    float *bias_values;
} seq_sampling_buf;

/* Fills p (initialised here) and s's sampling, history and history_prompt
 * for a slice of request q: prompt[n_prompt], generated gen[n_gen], the
 * engine's seed, sample = the slice samples. -1 + err on out of memory. */
int seq_sampling_fill(const coord_request *q, uint64_t seed, const int32_t *prompt, int n_prompt,
                      const int32_t *gen, int n_gen, bool sample, frame_sampling *p,
                      frame_seq *s, seq_sampling_buf *buf, st_err *err);
void seq_sampling_buf_free(seq_sampling_buf *buf);

#endif
