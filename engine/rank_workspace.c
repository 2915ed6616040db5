/* rank_workspace.c — sizes and frees one rank's activation buffers, logits
 * and sampling buffers. See rank_workspace.h. */
#include "engine/rank_workspace.h"

#include <stdlib.h>

#include "common/log.h"
#include "model/sampler.h"

/* The host copy of the logits: pinned memory from the module when it has an
 * allocator (a device backend: the per-step download is then a DMA, not a
 * driver bounce through pageable memory), else malloc. */
static float *logits_host_alloc(const stage_shape *sh, size_t bytes) {
    if (sh->bm->host_alloc) return sh->bm->host_alloc(bytes, NULL);
    return malloc(bytes);
}

static void logits_host_free(const stage_shape *sh, float *p) {
    if (!p) return;
    if (sh->bm->host_free)
        sh->bm->host_free(p);
    else
        free(p);
}

static void free_acts(rank_workspace *ws, backend *be) {
    float **bufs[] = {&ws->x, &ws->xn, &ws->q, &ws->k, &ws->v, &ws->att, &ws->o, &ws->g, &ws->u};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        be->ops->release(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    ws->cap = 0;
}

int rank_workspace_prepare(rank_workspace *ws, backend *be, const stage_shape *sh, const shard_plan *pl,
                           int rank, int64_t T, int64_t S, int32_t max_cands, st_err *err) {
    const llama_config *c = &sh->cfg;
    const bool last = sh->last == c->n_layer;
    if (sh->device_memory && ws->cap > 0 && (T > ws->cap || (S > ws->cap_s && last)) && !ws->grown_logged) {
        ws->grown_logged = true;
        ST_WARN("stage [%d,%d) rank %d: a batch of %lld tokens (%lld sampled) outgrows the workspace allocated "
                "at load (%lld tokens, %lld sampled); it grows now, an allocation inside a forward (raise "
                "stage_params.max_batch_tokens)", sh->first, sh->last, rank, (long long)T, (long long)S,
                (long long)ws->cap, (long long)ws->cap_s);
    }
    if (T > ws->cap) {
        free_acts(ws, be);
        int64_t cap = T < 16 ? 16 : T;
        const size_t E = (size_t)c->n_embd * sizeof(float) * (size_t)cap;
        const size_t Q = (size_t)pl->n_head_local * c->head_dim * sizeof(float) * (size_t)cap;
        const size_t KV = (size_t)pl->n_head_kv_local * c->head_dim * sizeof(float) * (size_t)cap;
        const size_t F = (size_t)pl->n_ff_local * sizeof(float) * (size_t)cap;
        if (!(ws->x = be->ops->alloc(be, E, err)) || !(ws->xn = be->ops->alloc(be, E, err)) ||
            !(ws->o = be->ops->alloc(be, E, err)) || !(ws->q = be->ops->alloc(be, Q, err)) ||
            !(ws->att = be->ops->alloc(be, Q, err)) || !(ws->k = be->ops->alloc(be, KV, err)) ||
            !(ws->v = be->ops->alloc(be, KV, err)) || !(ws->g = be->ops->alloc(be, F, err)) ||
            !(ws->u = be->ops->alloc(be, F, err))) {
            free_acts(ws, be);
            return -1;
        }
        ws->cap = cap;
    }
    if (S > ws->cap_s && last) {
        int64_t cap = S < 8 ? 8 : S;
        be->ops->release(be, ws->xs);
        be->ops->release(be, ws->logits);
        logits_host_free(sh, ws->h_logits);
        ws->xs = be->ops->alloc(be, (size_t)cap * c->n_embd * sizeof(float), err);
        ws->logits = be->ops->alloc(be, (size_t)cap * pl->n_vocab_local * sizeof(float), err);
        ws->h_logits = logits_host_alloc(sh, (size_t)cap * pl->n_vocab_local * sizeof(float));
        ws->cap_s = cap;
        if (!ws->xs || !ws->logits || !ws->h_logits) {
            ws->cap_s = 0;
            return ws->h_logits ? -1 : st_errf(err, "out of memory for logits");
        }
    }
    if (S > 0) {
        size_t bb = sampler_tp_blob_bytes(max_cands);
        size_t need_send = bb * (size_t)S, need_recv = need_send * (size_t)sh->tp;
        if (need_send > ws->blob_cap_send) {
            free(ws->blob_send);
            ws->blob_send = malloc(need_send);
            ws->blob_cap_send = ws->blob_send ? need_send : 0;
        }
        if (need_recv > ws->blob_cap_recv) {
            free(ws->blob_recv);
            ws->blob_recv = malloc(need_recv);
            ws->blob_cap_recv = ws->blob_recv ? need_recv : 0;
        }
        if (!ws->blob_send || !ws->blob_recv) return st_errf(err, "out of memory for sampling");
        if (sh->device_memory && need_send + need_recv > ws->d_blob_cap) {
            be->ops->release(be, ws->d_blob);
            ws->d_blob_cap = 0;
            if (!(ws->d_blob = be->ops->alloc(be, need_send + need_recv, err))) return -1;
            ws->d_blob_cap = need_send + need_recv;
        }
    }
    return 0;
}

void rank_workspace_free(rank_workspace *ws, backend *be, const stage_shape *sh) {
    free_acts(ws, be);
    be->ops->release(be, ws->xs);
    be->ops->release(be, ws->logits);
    logits_host_free(sh, ws->h_logits);
    free(ws->blob_send);
    free(ws->blob_recv);
    be->ops->release(be, ws->d_blob);
    *ws = (rank_workspace){0};
}
