/* rank.c — one TP rank: its backend, its load, and its part of the forward
 * (embedding, each layer's attention and SwiGLU MLP with their all-reduces,
 * the LM head and the TP sampling on the last stage). See rank.h. */
#include "engine/rank.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"

int rank_open(rank_ctx *rc, int device, int max_batch_tokens, rank_weights_progress progress,
              void *progress_ctx, st_err *err) {
    const stage_shape *sh = rc->sh;
    st_err e;
    rc->be = sh->bm->backend_new(device, rc->n_threads, &e);
    if (!rc->be) {
        if (err) *err = e;
        return -1;
    }
    if (rank_weights_load(&rc->w, rc->be, sh, &rc->plan, rc->rank, progress, progress_ctx, err)) return -1;
    if (!sh->device_memory) return 0;
    /* A device backend gets its workspace now, not in a forward; its sampling
     * blobs hold the candidates of any sampling without top_k (top_k above
     * that grows them). */
    const int64_t T0 = max_batch_tokens > 0 ? max_batch_tokens : 512;
    const int64_t S0 = sh->last == sh->cfg.n_layer ? (T0 < 256 ? T0 : 256) : 0;
    return rank_workspace_prepare(&rc->ws, rc->be, sh, &rc->plan, rc->rank, T0, S0, SAMPLER_TP_CANDS, err);
}

int rank_prepare(rank_ctx *rc, const batch_plan *plan, st_err *err) {
    return rank_workspace_prepare(&rc->ws, rc->be, rc->sh, &rc->plan, rc->rank, plan->b->n_tokens,
                                  plan->n_logit, plan->max_cands, err);
}

void rank_release(rank_ctx *rc) {
    backend *be = rc->be;
    if (!be) return;
    rank_weights_free(&rc->w, be);
    rank_workspace_free(&rc->ws, be, rc->sh);
    backend_free(be);
    rc->be = NULL;
}

/* ---------------------------------------------------------------- forward */

static bool penalties_on(const sampler_params *p) {
    return (p->repeat_penalty != 1.0f && p->repeat_last_n != 0) || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

/* The sampling all-gather of `bytes` per rank: host blobs on the CPU backend;
 * NCCL wants device memory, so a device backend goes through ws->d_blob. The
 * collective is made even when the upload failed (see rank_forward). */
static int rank_all_gather(rank_ctx *rc, size_t bytes, st_err *err) {
    rank_workspace *ws = &rc->ws;
    if (!rc->sh->device_memory) return comm_all_gather(rc->c, ws->blob_send, ws->blob_recv, bytes, err);
    backend *be = rc->be;
    st_err e2;
    int up = be->ops->upload(be, ws->d_blob, ws->blob_send, bytes, err);
    int ag = comm_all_gather(rc->c, ws->d_blob, ws->d_blob + bytes, bytes, up ? &e2 : err);
    if (up || ag) return -1;
    return be->ops->download(be, ws->blob_recv, ws->d_blob + bytes, bytes * (size_t)rc->sh->tp, err);
}

int rank_forward(rank_ctx *rc, const batch_plan *fw, st_err *err) {
    const stage_shape *sh = rc->sh;
    const stage_batch *b = fw->b;
    const llama_config *c = &sh->cfg;
    const shard_plan *pl = &rc->plan;
    rank_weights *w = &rc->w;
    rank_workspace *ws = &rc->ws;
    backend *be = rc->be;
    const backend_ops *o = be->ops;
    const int64_t T = b->n_tokens, E = c->n_embd, hd = c->head_dim;
    int rc_ = 0;
#define OP(expr)                     \
    do {                             \
        if (rc_ == 0) rc_ = (expr);  \
    } while (0)
#define COLL(expr)                                    \
    do {                                              \
        st_err _e;                                    \
        if ((expr) != 0 && rc_ == 0) {                \
            *err = _e;                                \
            rc_ = -1;                                 \
        }                                             \
    } while (0)

    if (sh->first == 0) {
        OP(o->embed(be, ws->x, &w->tok_embd, b->tokens, T, pl->vocab.lo, err));
        COLL(o->all_reduce(be, rc->c, ws->x, (size_t)(T * E), &_e));
    } else {
        if (fw->in_dev) /* rank 0's device buffer: every rank copies it (a peer copy on another GPU) */
            OP(o->copy(be, ws->x, fw->hin, (size_t)(T * E) * sizeof(float), err));
        else
            OP(o->upload(be, ws->x, fw->hin, (size_t)(T * E) * sizeof(float), err));
    }
    backend_attn at = {
        .n_head = pl->n_head_local,
        .n_head_kv = pl->n_head_kv_local,
        .head_dim = (int)hd,
        .block_size = sh->block_size,
        .n_cache_blocks = sh->kv_blocks,
        .kv_type = sh->kv_type,
        .scale = 1.0f / sqrtf((float)hd),
        .n_seqs = b->n_seqs,
        .seqs = fw->aseqs,
    };
    const int64_t n_slots = (int64_t)sh->kv_blocks * sh->block_size;
    /* On the last stage only the sampled rows (one per sequence that wants
     * logits) are read after the last layer, so its FFN runs on those rows
     * alone (gathered into xs), as llama.cpp does: a 64-token prompt skips
     * 63/64 of one layer's FFN. The K/V of every row are still stored. (A
     * chunk that wants no logits keeps its FFN, so that the collective counts
     * of stage.h hold.) A row's values do not depend on which rows share its
     * matmul, except for the float types' matvec or GEMM summation order. */
    const bool prune = sh->last == c->n_layer && fw->n_logit > 0 && fw->n_logit < T;
    const int n_layers = sh->last - sh->first;
    for (int i = 0; i < n_layers; i++) {
        layer_w *L = &w->layers[i];
        OP(o->rmsnorm(be, ws->xn, ws->x, &L->attn_norm, T, E, c->rms_eps, err));
        OP(o->matmul(be, ws->q, ws->xn, &L->wq, T, err));
        OP(o->matmul(be, ws->k, ws->xn, &L->wk, T, err));
        OP(o->matmul(be, ws->v, ws->xn, &L->wv, T, err));
        OP(o->rope(be, ws->q, T, pl->n_head_local, (int)hd, c->n_rot, fw->pos, c->rope_base, sh->rope_ff, err));
        OP(o->rope(be, ws->k, T, pl->n_head_kv_local, (int)hd, c->n_rot, fw->pos, c->rope_base, sh->rope_ff, err));
        OP(o->kv_store(be, L->kc, L->vc, sh->kv_type, ws->k, ws->v, T, pl->n_head_kv_local * hd, fw->slots, n_slots, err));
        OP(o->attention(be, ws->att, ws->q, L->kc, L->vc, &at, err));
        OP(o->matmul(be, ws->o, ws->att, &L->wo, T, err));
        COLL(o->all_reduce(be, rc->c, ws->o, (size_t)(T * E), &_e));
        OP(o->add(be, ws->x, ws->o, T * E, err));
        float *xf = ws->x; /* the FFN's rows: all T, or the sampled ones in the last layer */
        int64_t Tf = T;
        if (prune && i == n_layers - 1) {
            Tf = fw->n_logit;
            OP(o->get_rows(be, ws->xs, ws->x, fw->logit_rows, Tf, E, err));
            xf = ws->xs;
        }
        OP(o->rmsnorm(be, ws->xn, xf, &L->ffn_norm, Tf, E, c->rms_eps, err));
        OP(o->matmul(be, ws->g, ws->xn, &L->gate, Tf, err));
        OP(o->matmul(be, ws->u, ws->xn, &L->up, Tf, err));
        OP(o->swiglu(be, ws->g, ws->g, ws->u, Tf * pl->n_ff_local, err));
        OP(o->matmul(be, ws->o, ws->g, &L->down, Tf, err));
        COLL(o->all_reduce(be, rc->c, ws->o, (size_t)(Tf * E), &_e));
        OP(o->add(be, xf, ws->o, Tf * E, err));
    }
    if (sh->last != c->n_layer) {
        if (rc->rank == 0 && fw->out_dev) {
            OP(o->copy(be, fw->hout, ws->x, (size_t)(T * E) * sizeof(float), err));
            /* a synchronising read: the copy is done before another stream (NCCL) reads hout */
            float probe;
            OP(o->download(be, &probe, fw->hout, sizeof probe, err));
        } else if (rc->rank == 0) {
            OP(o->download(be, fw->hout, ws->x, (size_t)(T * E) * sizeof(float), err));
        }
    } else if (fw->n_logit > 0) {
        const int S = fw->n_logit;
        const int64_t Vl = pl->n_vocab_local;
        if (!prune) OP(o->get_rows(be, ws->xs, ws->x, fw->logit_rows, S, E, err)); /* pruned: xs has them */
        OP(o->rmsnorm(be, ws->xs, ws->xs, &w->out_norm, S, E, c->rms_eps, err));
        OP(o->matmul(be, ws->logits, ws->xs, &w->lm_head, S, err));
        OP(o->download(be, ws->h_logits, ws->logits, (size_t)(S * Vl) * sizeof(float), err));
        const size_t bb = sampler_tp_blob_bytes(fw->max_cands);
        memset(ws->blob_send, 0, bb * (size_t)S);
        for (int j = 0; j < S && rc_ == 0; j++) {
            const stage_seq *sq = &b->seqs[fw->logit_seq[j]];
            sampler_history h, *hp = NULL;
            if (penalties_on(&sq->sampling) && sq->n_history > 0) {
                OP(sampler_history_init(&h, sq->sampling.repeat_last_n, err));
                if (rc_ == 0) {
                    hp = &h;
                    OP(sampler_history_rebuild_prompt(&h, sq->history, (size_t)sq->n_history,
                                                      (size_t)sq->n_history_prompt, err));
                }
            }
            OP(sampler_tp_local_blob(&sq->sampling, ws->h_logits + j * Vl, (int32_t)pl->vocab.lo,
                                     (int32_t)pl->vocab.hi, hp, sq->step, fw->max_cands,
                                     ws->blob_send + (size_t)j * bb, err));
            if (hp) sampler_history_free(hp);
        }
        COLL(rank_all_gather(rc, bb * (size_t)S, &_e));
        if (rc->rank == 0 && rc_ == 0) {
            /* recv is [rank][seq] blobs; the merge wants one seq's blobs in rank order. */
            unsigned char *tmp = malloc(bb * (size_t)sh->tp);
            if (!tmp) rc_ = st_errf(err, "out of memory merging samples");
            for (int j = 0; j < S && rc_ == 0; j++) {
                const stage_seq *sq = &b->seqs[fw->logit_seq[j]];
                for (int r = 0; r < sh->tp; r++)
                    memcpy(tmp + (size_t)r * bb, ws->blob_recv + ((size_t)r * S + j) * bb, bb);
                OP(sampler_tp_merge_blobs(&sq->sampling, tmp, sh->tp, fw->max_cands, sq->step,
                                          &fw->samples[fw->logit_seq[j]], err));
            }
            free(tmp);
        }
    }
#undef OP
#undef COLL
    return rc_;
}
