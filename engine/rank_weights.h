/* rank_weights.h — what one TP rank keeps resident for its layers: its
 * Megatron shard of every weight (model/shard.h), copied from the GGUF
 * mapping in the file's dtype, and each layer's K and V caches. The first
 * stage also holds its slice of the token embedding; the last stage the final
 * norm and its slice of the LM head. */
#ifndef STRATA_ENGINE_RANK_WEIGHTS_H
#define STRATA_ENGINE_RANK_WEIGHTS_H

#include <stddef.h>

#include "common/err.h"
#include "compute/backend.h"
#include "engine/stage_shape.h"
#include "model/shard.h"

typedef struct layer_w {
    backend_weight attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down;
    void *kc, *vc; /* [kv_blocks * block_size, n_head_kv_local * head_dim] of kv_type */
} layer_w;

typedef struct rank_weights {
    layer_w *layers; /* n_layers = last - first */
    int n_layers;
    backend_weight tok_embd, out_norm, lm_head;
    int lm_head_shared; /* lm_head aliases tok_embd (tied, first and last stage) */
} rank_weights;

/* Called after each tensor is loaded with its resident bytes; returns -1 to
 * abandon the load (stage_params.cancel). */
typedef int (*rank_weights_progress)(void *ctx, size_t bytes);

/* Loads rank `rank`'s shard (plan pl) onto be and allocates its KV caches.
 * -1 + err on a missing tensor, out of memory or a cancelled load; what was
 * loaded stays in w for rank_weights_free. */
int rank_weights_load(rank_weights *w, backend *be, const stage_shape *sh, const shard_plan *pl, int rank,
                      rank_weights_progress progress, void *progress_ctx, st_err *err);
/* The bytes a rank with plan pl will load (for the progress percentage). */
size_t rank_weights_bytes(const stage_shape *sh, const shard_plan *pl);
void rank_weights_free(rank_weights *w, backend *be);

#endif
