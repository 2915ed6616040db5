/* batch_plan.h — a micro-batch checked against the stage and laid out for
 * its ranks: each token's position and KV cache slot, each sequence's
 * attention range, the rows that are sampled, and where the hidden states
 * come from and go. Built on the caller's thread before a forward; the ranks
 * only read it. */
#ifndef STRATA_ENGINE_BATCH_PLAN_H
#define STRATA_ENGINE_BATCH_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "compute/backend.h"
#include "engine/stage_batch.h"
#include "engine/stage_shape.h"

/* Host arrays reused across forwards (grown, never shrunk). */
typedef struct batch_arrays {
    int64_t tok_cap;
    int32_t *pos, *slots; /* [tok_cap] */
    int seq_cap;
    backend_attn_seq *aseqs;          /* [seq_cap] */
    int32_t *logit_rows, *logit_seq;  /* [seq_cap] */
} batch_arrays;

/* One forward's batch as the ranks read it. */
typedef struct batch_plan {
    const stage_batch *b;
    const void *hin;          /* hidden states in (not on the first stage) */
    void *hout;               /* hidden states out (not on the last stage) */
    bool in_dev, out_dev;     /* hin / hout are device memory on rank 0's device (stage_forward_io) */
    stage_sample_out *samples;
    const int32_t *pos, *slots;    /* per token: position, KV cache slot */
    const backend_attn_seq *aseqs; /* per sequence */
    const int32_t *logit_rows; /* batch row of each sampled sequence's last token */
    const int32_t *logit_seq;  /* sequence index of each sampled row */
    int n_logit;
    int32_t max_cands; /* sampling candidates per rank and row (model/sampler.h) */
} batch_plan;

/* Checks b (counts, positions inside the KV cache, block tables, token ids
 * on the first stage, sampling parameters) and fills plan's layout from
 * arrays; plan's I/O fields are left to the caller. On the last stage it
 * clears samples[] and caps the candidates at vocab_local_max. -1 + err on a
 * bad batch. */
int batch_plan_make(batch_plan *plan, batch_arrays *arrays, const stage_shape *sh, const stage_batch *b,
                    stage_sample_out *samples, int32_t vocab_local_max, st_err *err);
void batch_arrays_free(batch_arrays *arrays);

#endif
