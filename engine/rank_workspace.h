/* rank_workspace.h — one TP rank's activation buffers (backend memory), the
 * host copy of its logits slice and the sampling all-gather buffers. A device
 * backend sizes them at load (stage_params.max_batch_tokens), so a forward
 * allocates nothing; a batch that outgrows them grows them (logged once). */
#ifndef STRATA_ENGINE_RANK_WORKSPACE_H
#define STRATA_ENGINE_RANK_WORKSPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "compute/backend.h"
#include "engine/stage_shape.h"
#include "model/shard.h"

typedef struct rank_workspace {
    /* Activations (backend memory), sized for cap tokens / cap_s logit rows. */
    int64_t cap, cap_s;
    bool grown_logged; /* a batch outgrew the load-time workspace (logged once) */
    float *x, *xn, *q, *k, *v, *att, *o, *g, *u, *xs, *logits;
    float *h_logits; /* host copy [cap_s, n_vocab_local]; pinned on a device backend */
    unsigned char *blob_send, *blob_recv; /* all-gather buffers (host) */
    size_t blob_cap_send, blob_cap_recv;
    unsigned char *d_blob; /* device backends: the all-gather buffer (send, then recv) */
    size_t d_blob_cap;
} rank_workspace;

/* Room for T tokens, S sampled rows (last stage) and max_cands sampling
 * candidates per row; grows what is too small. -1 + err out of memory. */
int rank_workspace_prepare(rank_workspace *ws, backend *be, const stage_shape *sh, const shard_plan *pl,
                           int rank, int64_t T, int64_t S, int32_t max_cands, st_err *err);
void rank_workspace_free(rank_workspace *ws, backend *be, const stage_shape *sh);

#endif
