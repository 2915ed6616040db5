/* sampler.h — next-token sampling: penalties, top-k, temperature, top-p,
 * min-p, a seeded split-invariant draw, and log-probabilities; both over a
 * full logits row and vocabulary-parallel across TP ranks.
 *
 * Pipeline (fixed order, as in vLLM's sampler; llama.cpp's common chain for
 * the filters):
 *   1. bias + penalties on the raw logits (see sampler_apply_penalties):
 *                  logit_bias first (OpenAI's: l += bias, -inf masks a token:
 *                  vLLM's min_tokens), then the repetition penalty
 *                  (CTRL / Hugging Face / vLLM / llama.cpp: l > 0 ? l / rp :
 *                  l * rp for every token in the history, or in its window),
 *                  then OpenAI's presence and frequency penalties
 *   2. top-k       keep the k largest penalized logits (top_k = 0: off)
 *   3. temperature l -> l / T (T = 0: greedy argmax, steps 2..6 skipped)
 *   4. top-p       softmax over what is left; keep the shortest prefix (in
 *                  descending order) whose cumulative probability >= top_p,
 *                  the crossing token included (top_p = 1: off)
 *   5. min-p       keep tokens with p >= min_p * p_max (min_p = 0: off)
 *   6. draw        from the kept set, renormalised.
 * Ordering of candidates is total: logit descending, then id ascending.
 * Greedy (T = 0) is argmax of the penalized logits, lowest id on ties.
 *
 * The draw (Gumbel-max, Gumbel 1954 / "exponential race"): token
 *   argmax_{i in kept} ( l_i / T + g(seed, step, i) ),  g = -log(-log u),
 * u = sampler_uniform(seed, step, i), a splitmix64 counter hash of
 * (seed, step, id) -> uniform double in (0, 1). This samples exactly from the
 * renormalised softmax over the kept set, and depends only on (seed, step,
 * logits): not on the batch, the worker, the TP degree or the vocabulary
 * split. `step` is the index of the generated token within the sequence
 * (0 for the first one); the caller keeps it with the sequence.
 *
 * Log-probabilities are of the UNMODIFIED model distribution: natural-log
 * log_softmax of the raw logits (before penalties and temperature), as the
 * OpenAI API reports them.
 *
 * Logits are f32, one row of n_vocab values (ids 0..n_vocab-1). NaN or +inf
 * logits are an error; -inf is allowed (masked token), but not all of them.
 */
#ifndef STRATA_MODEL_SAMPLER_H
#define STRATA_MODEL_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define SAMPLER_MAX_TOP_LOGPROBS 20 /* OpenAI's top_logprobs limit */
#define SAMPLER_TP_CANDS 64         /* per-rank candidates when top_k = 0 */

typedef struct sampler_params {
    float temperature;       /* >= 0; 0 = greedy */
    int32_t top_k;           /* >= 0; 0 = off */
    float top_p;             /* (0, 1]; 1 = off */
    float min_p;             /* [0, 1]; 0 = off */
    float repeat_penalty;    /* > 0; 1 = off. llama.cpp/CTRL: l>0 ? l/rp : l*rp */
    int32_t repeat_last_n;   /* window of the repeat penalty in tokens; -1 = whole history, 0 = off */
    float presence_penalty;  /* OpenAI: l -= presence * [count > 0]; 0 = off; [-2, 2] */
    float frequency_penalty; /* OpenAI: l -= frequency * count; 0 = off; [-2, 2] */
    uint64_t seed;
    int32_t n_top_logprobs;  /* 0..SAMPLER_MAX_TOP_LOGPROBS */
    /* logit_bias (OpenAI): l[bias_ids[i]] += bias_values[i] before the
     * penalties; -inf masks the token (vLLM's min_tokens uses it). Borrowed
     * arrays of n_bias entries (NULL when 0); ids outside a slice are
     * skipped, so the caller checks them against the vocabulary. Values are
     * finite or -inf. */
    const int32_t *bias_ids;
    const float *bias_values;
    int32_t n_bias;
} sampler_params;

/* llama.cpp's CLI defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * repeat_penalty 1 (off), repeat_last_n 64, presence/frequency 0, seed 0,
 * n_top_logprobs 0. (An OpenAI front end sets its own: T 1, top_p 1, top_k 0,
 * min_p 0.) */
sampler_params sampler_default_params(void);

/* Greedy params (temperature 0, every filter off). */
sampler_params sampler_greedy_params(void);

/* 0 when p is valid; else -1 and a message naming the field, e.g.
 * "top_p must be in (0, 1], got 1.5". */
int sampler_params_validate(const sampler_params *p, st_err *err);

/* ---- History of the sequence, for the penalties ----
 * Caller-owned. Counts every token added: `total` over the whole history
 * (presence/frequency penalties, OpenAI semantics) and `window` over the last
 * `window` tokens (repeat penalty, llama.cpp's repeat_last_n). Which tokens
 * to add is the caller's choice (llama.cpp adds the prompt too; OpenAI counts
 * the generated text). Prompt tokens added with sampler_history_add_prompt
 * count only for the repeat penalty (`prompt`), which is how vLLM's
 * repetition_penalty (over prompt + output) and OpenAI's presence/frequency
 * penalties (over the output) combine: repeat_last_n -1, the prompt through
 * add_prompt, the generated tokens through add. The state is rebuilt exactly from the token list
 * (sampler_history_rebuild), so a sequence moved to another node carries its
 * tokens, not this struct. */
typedef struct sampler_history_entry {
    int32_t id;     /* -1 = empty slot */
    int32_t total;  /* occurrences in the whole history */
    int32_t window; /* occurrences among the last `window` tokens */
    int32_t prompt; /* occurrences among the prompt tokens (repeat penalty only) */
} sampler_history_entry;

typedef struct sampler_history {
    int32_t window;                /* repeat_last_n it was made for (-1 = all, 0 = none) */
    int32_t *ring;                 /* last `window` tokens (window > 0) */
    int64_t n_added;               /* tokens added since init/reset */
    sampler_history_entry *table;  /* open-addressing map id -> counts */
    uint32_t cap;                  /* table slots (power of two) */
    uint32_t n_used;               /* distinct ids */
} sampler_history;

/* window = params.repeat_last_n (-1, 0 or > 0, at most 1<<20). */
int sampler_history_init(sampler_history *h, int32_t window, st_err *err);
void sampler_history_free(sampler_history *h);
void sampler_history_reset(sampler_history *h);
/* id >= 0. -1 on a negative id or out of memory. */
int sampler_history_add(sampler_history *h, int32_t id, st_err *err);
/* A prompt token: counts for the repeat penalty only (not total/window). */
int sampler_history_add_prompt(sampler_history *h, int32_t id, st_err *err);
/* reset + add every token of ids[n]. */
int sampler_history_rebuild(sampler_history *h, const int32_t *ids, size_t n, st_err *err);
/* reset + add_prompt ids[0, n_prompt) + add ids[n_prompt, n). */
int sampler_history_rebuild_prompt(sampler_history *h, const int32_t *ids, size_t n,
                                   size_t n_prompt, st_err *err);
/* Occurrences of id: in the whole history and in the window (0 when absent).
 * With window -1 the window count equals the total. */
void sampler_history_count(const sampler_history *h, int32_t id, int32_t *total, int32_t *in_window);

/* Step 1 on a slice: logits[i] holds the logit of token lo + i, i in [0, hi-lo).
 *   for each bias entry with id in [lo, hi): l += bias
 * then for each history token id in [lo, hi):
 *   if (window count > 0 or prompt count > 0) and repeat_penalty != 1:
 *       l = l > 0 ? l / rp : l * rp
 *   l -= presence * [total > 0] + frequency * total
 * h may be NULL (no history). Errors: invalid params, a history made for a
 * different repeat_last_n while the repeat penalty is on. */
int sampler_apply_penalties(const sampler_params *p, const sampler_history *h, float *logits,
                            int32_t lo, int32_t hi, st_err *err);

/* The uniform behind the draw of token id at this step: splitmix64
 * finaliser chain of (seed, step, id), top 23 bits k -> (k + 0.5) / 2^23,
 * in [2^-24, 1 - 2^-24] (exact in float; the Gumbel noise is computed in
 * float with logf, so its tails are cut at ~2^-24 probability). */
double sampler_uniform(uint64_t seed, uint64_t step, int32_t id);

/* ---- Result ---- */
typedef struct sampler_token_info {
    int32_t id;      /* the chosen token */
    float logprob;   /* log_softmax(raw logits)[id], natural log */
    int32_t n_top;   /* = min(n_top_logprobs, n_vocab) */
    int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];       /* most likely first (raw logits; ties: lower id) */
    float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
    int32_t truncated; /* TP only: 1 when the per-rank candidate cap may have cut the kept set */
} sampler_token_info;

/* Full-vocabulary sampling of one row. logits[n_vocab] is not modified
 * (penalties are applied to an internal copy). step: see above.
 * Errors: invalid params, n_vocab < 1, NaN/+inf logits, all -inf, OOM. */
int sampler_sample(const sampler_params *p, const float *logits, int32_t n_vocab,
                   const sampler_history *h, uint64_t step, sampler_token_info *out, st_err *err);

/* ---- Vocabulary-parallel sampling (TP) ----
 * Rank r holds the logits of ids [lo_r, hi_r) (slices partition [0, n_vocab),
 * possibly uneven or empty). Each rank calls sampler_local_candidates on its
 * slice, the ranks all-gather the POD results (bytes), and every rank calls
 * sampler_merge_pick on the gathered data: it is a pure function of those
 * bytes, so all ranks choose the same token. sampler_tp_* helpers pack one
 * rank's result as a single blob of fixed size for a single all-gather.
 *
 * Each rank sends its top candidates by penalized logit: 1 for greedy,
 * min(top_k, max_cands) when top_k > 0, else max_cands (none for pure
 * temperature, which sends only the slice's Gumbel winner). Size max_cands
 * with sampler_tp_max_cands(p) (top_k, or SAMPLER_TP_CANDS). Exactness:
 *  - greedy, top-k (k <= max_cands), and top-k combined with top-p/min-p: exact —
 *    the same token, bit-for-bit, as sampler_sample on the whole row;
 *  - top_k = 0 and top_p = 1 and min_p = 0 (pure temperature): exact, each
 *    rank sends the Gumbel winner of its slice;
 *  - top_k = 0 with top_p < 1 or min_p > 0: exact whenever the kept set has
 *    fewer than max_cands tokens from each rank (peaked distributions: the
 *    usual case). Otherwise the kept set
 *    is cut to the union of candidates and out->truncated = 1. (The softmax
 *    normaliser always covers the whole vocabulary, via the stats; it is
 *    summed per rank, so a top-p boundary can differ from the single-row
 *    path in the last ulp.)
 *  - logprobs and top logprobs: exact (to rounding) for any split.
 */
typedef struct sampler_cand {
    int32_t id;
    float logit; /* after penalties, before temperature */
    float raw;   /* the model's logit */
} sampler_cand;

typedef struct sampler_local_stats {
    int32_t lo, hi;       /* the slice */
    int32_t n_cands;      /* valid candidates sent by this rank (<= max_cands) */
    int32_t n_top;        /* valid entries of top_raw */
    double raw_max;       /* max raw logit of the slice (-inf if none) */
    double raw_sum;       /* sum exp(raw - raw_max) over the slice (0 if none) */
    double pen_max;       /* max penalized logit */
    double pen_sum;       /* sum exp((pen - pen_max) / T) over the slice (T > 0) */
    sampler_cand gumbel;  /* pure temperature only: slice winner of l/T + g(seed, step, id) */
    int32_t gumbel_valid;
    int32_t pad_;
    sampler_cand top_raw[SAMPLER_MAX_TOP_LOGPROBS]; /* top n_top by raw logit */
} sampler_local_stats;

/* Recommended max_cands: 1 for greedy, top_k when top_k > 0, else
 * SAMPLER_TP_CANDS. The engine may clamp it to its largest slice. */
int32_t sampler_tp_max_cands(const sampler_params *p);

/* One rank: logits_slice[hi - lo] (ids [lo, hi)), not modified. Writes up to
 * max_cands candidates to cands_out (sorted: logit desc, id asc) and fills
 * *stats (every byte, padding included, so it can be hashed or compared).
 * 0 <= lo <= hi. Errors as sampler_sample, and max_cands < 1. */
int sampler_local_candidates(const sampler_params *p, const float *logits_slice, int32_t lo,
                             int32_t hi, const sampler_history *h, uint64_t step,
                             sampler_cand *cands_out, int32_t max_cands,
                             sampler_local_stats *stats, st_err *err);

/* Every rank: all_cands is [n_ranks][max_cands] (rank r's cands at
 * r * max_cands, its count in all_stats[r].n_cands), all_stats[n_ranks].
 * The slices must partition [0, n_vocab) (checked). */
int sampler_merge_pick(const sampler_params *p, const sampler_cand *all_cands, int32_t max_cands,
                       const sampler_local_stats *all_stats, int n_ranks, uint64_t step,
                       sampler_token_info *out, st_err *err);

/* Blob form: [sampler_local_stats][sampler_cand x max_cands], padded to 8 bytes. */
size_t sampler_tp_blob_bytes(int32_t max_cands);
int sampler_tp_local_blob(const sampler_params *p, const float *logits_slice, int32_t lo,
                          int32_t hi, const sampler_history *h, uint64_t step, int32_t max_cands,
                          void *blob, st_err *err);
/* blobs: n_ranks blobs of sampler_tp_blob_bytes(max_cands), rank order (the
 * all-gather's output). */
int sampler_tp_merge_blobs(const sampler_params *p, const void *blobs, int n_ranks,
                           int32_t max_cands, uint64_t step, sampler_token_info *out, st_err *err);

#endif
