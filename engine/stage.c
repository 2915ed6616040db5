/* stage.c — a pipeline stage: loads its layers' Megatron shards on t rank
 * threads (one backend, pool and comm rank each) and runs the forward pass of
 * a micro-batch on them. The backend comes from compute/registry.h: "cpu"
 * (shared-memory comm group) or "cuda" (rank r on GPU r, NCCL comm; the
 * libstrata-cuda.so module, loaded at run time). See stage.h for the data flow and the collective
 * counts. */
#include "engine/stage.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/log.h"
#include "compute/backend.h"
#include "compute/comm.h"
#include "compute/cpu/threadpool.h"
#include "compute/registry.h"
#include "model/gguf.h"
#include "model/shard.h"

typedef struct layer_w {
    backend_weight attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down;
    void *kc, *vc; /* [kv_blocks * block_size, n_head_kv_local * head_dim] of kv_type */
} layer_w;

typedef struct rank_ctx {
    stage *s;
    int rank;
    int n_threads;
    shard_plan plan;
    backend *be;
    comm *c;
    layer_w *layers; /* last - first */
    backend_weight tok_embd, out_norm, lm_head;
    int lm_head_shared; /* lm_head aliases tok_embd (tied, first and last stage) */
    /* Activations (device), sized for cap tokens / cap_s logit rows. */
    int64_t cap, cap_s;
    bool grown_logged; /* a batch outgrew the load-time workspace (logged once) */
    float *x, *xn, *q, *k, *v, *att, *o, *g, *u, *xs, *logits;
    float *h_logits;         /* host copy [cap_s, n_vocab_local]; pinned on a device backend (logits_host_alloc) */
    unsigned char *blob_send, *blob_recv; /* all-gather buffers (host) */
    size_t blob_cap_send, blob_cap_recv;
    unsigned char *d_blob; /* backend "cuda": device all-gather buffer (send, then recv) */
    size_t d_blob_cap;
    pthread_t thread;
    int started;
    double busy;
    int rc;
    st_err err;
} rank_ctx;

/* Per-forward metadata shared (read-only) by the ranks. */
typedef struct fwd {
    const stage_batch *b;
    const float *hin;
    float *hout;
    stage_sample_out *samples;
    int32_t *pos, *slots;
    backend_attn_seq *aseqs;
    int32_t *logit_rows; /* batch row of each sampled sequence's last token */
    int32_t *logit_seq;  /* sequence index of each sampled row */
    int n_logit;
    int32_t max_cands;
    bool in_dev, out_dev; /* hin / hout are device memory on rank 0's device (stage_forward_io) */
} fwd;

#define STAGE_MAX_DEV_BUFS 64 /* stage_dev_alloc buffers, in use or kept for reuse */
#define STAGE_KEEP_DEV_BUFS 8 /* freed ones kept for reuse: no cudaMalloc/cudaFree per forward */
#define STAGE_DEV_BUF_MIN (64u << 10)

struct stage {
    stage_params p;
    llama_config cfg;
    gguf_file *f;
    int first, last, tp;
    const backend_module *bm; /* the backend (compute/registry.h) */
    backend_group *group;     /* its TP group: shared memory ("cpu"), NCCL ("cuda") */
    int cuda;                 /* buffers are device memory (bm->device_memory) */
    rank_ctx *ranks;
    float *rope_ff; /* host [n_rot/2] or NULL */
    /* rank thread control */
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t gen;
    int n_done;
    int quit;
    int phase; /* 0 = load, 1 = prepare buffers, 2 = forward */
    fwd cur;
    /* load progress */
    size_t load_total, load_done;
    int load_pct_logged;
    /* host metadata buffers */
    int64_t meta_cap;
    int32_t *pos, *slots;
    int meta_seq_cap;
    backend_attn_seq *aseqs;
    int32_t *logit_rows, *logit_seq;
    uint64_t opened_ns;
    stage_stats stats;
    /* stage_dev_alloc's buffers (released at close if still live) */
    struct stage_dev_buf {
        void *p;
        size_t cap;
        bool used;
    } dev_bufs[STAGE_MAX_DEV_BUFS];
    int n_dev_bufs;
    /* A communicator of the stage was aborted (comm.failed): the stage is lost. */
    bool failed;
    char failed_why[ST_ERR_MSG_MAX];
};

/* ---------------------------------------------------------------- loading */

/* Test-only hook (docs/worker.md): each loaded tensor takes N ms longer, so a
 * test can cancel a load that the page cache would otherwise finish at once.
 * Inert unless $STRATA_TEST_LOAD_DELAY_MS is set. */
static void test_load_delay(void) {
    const char *v = getenv("STRATA_TEST_LOAD_DELAY_MS");
    long ms = v && *v ? strtol(v, NULL, 10) : 0;
    if (ms > 0) nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L}, NULL);
}

/* Test-only hook (docs/worker.md): once the file $STRATA_TEST_STAGE_FAIL_FILE
 * exists, the stage's next forward fails for good, as when a communicator is
 * aborted (comm.failed), so a CPU test can drive the failure path from the
 * worker to the coordinator's recovery. Inert unless the variable is set. */
static bool test_fail_now(void) {
    const char *f = getenv("STRATA_TEST_STAGE_FAIL_FILE");
    return f && *f && access(f, F_OK) == 0;
}

/* Counts a loaded tensor; -1 when the load was cancelled (stage_params.cancel). */
static int progress(stage *s, size_t bytes) {
    test_load_delay();
    if (s->p.cancel && atomic_load(s->p.cancel)) return -1;
    pthread_mutex_lock(&s->mu);
    s->load_done += bytes;
    int pct = s->load_total ? (int)(100.0 * (double)s->load_done / (double)s->load_total) : 100;
    /* Every 10% for models of 64 MiB and more; small ones only log the end. */
    int step = s->load_total >= (64u << 20) ? 10 : 100;
    if (pct / step > s->load_pct_logged / step) {
        s->load_pct_logged = pct;
        ST_INFO("stage [%d,%d) tp %d: loaded %d%% (%.1f / %.1f MiB)", s->first, s->last, s->tp,
                pct, (double)s->load_done / 1048576.0, (double)s->load_total / 1048576.0);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static const gguf_tensor *tensor(stage *s, const char *name, st_err *err) {
    const gguf_tensor *t = gguf_find_tensor(s->f, name);
    if (!t) st_errf(err, "%s: missing tensor %s", gguf_path(s->f), name);
    return t;
}

/* Rows [r0, r1) of a 2-D tensor, in its file type. */
static int load_rows(rank_ctx *rc, backend_weight *w, const char *name, int64_t r0, int64_t r1,
                     st_err *err) {
    const gguf_tensor *t = tensor(rc->s, name, err);
    if (!t) return -1;
    if (r0 < 0 || r1 > t->ne[1] || r0 >= r1)
        return st_errf(err, "%s: rows [%lld, %lld) outside %lld", name, (long long)r0,
                       (long long)r1, (long long)t->ne[1]);
    size_t rb = ggml_row_bytes(t->type, t->ne[0]);
    if (rb == 0) return st_errf(err, "%s: unsupported type %s", name, ggml_type_name(t->type));
    if (rc->be->ops->weight_upload(rc->be, w, t->type, r1 - r0, t->ne[0],
                                   (const char *)t->data + (size_t)r0 * rb, err))
        return st_err_prefix(err, "%s", name);
    gguf_release_pages(rc->s->f, (const char *)t->data + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
    if (progress(rc->s, w->nbytes)) return st_errf(err, "stage: load cancelled");
    return 0;
}

/* Columns [c0, c1) of every row of a 2-D tensor (row-parallel weights). Kept
 * in the file type when the range is block-aligned; else dequantized to F32. */
static int load_cols(rank_ctx *rc, backend_weight *w, const char *name, int64_t c0, int64_t c1,
                     st_err *err) {
    const gguf_tensor *t = tensor(rc->s, name, err);
    if (!t) return -1;
    const int64_t K = t->ne[0], N = t->ne[1];
    if (c0 < 0 || c1 > K || c0 >= c1)
        return st_errf(err, "%s: columns [%lld, %lld) outside %lld", name, (long long)c0,
                       (long long)c1, (long long)K);
    const int bs = ggml_block_size(t->type);
    const size_t rb = ggml_row_bytes(t->type, K);
    if (rb == 0) return st_errf(err, "%s: unsupported type %s", name, ggml_type_name(t->type));
    int rcode;
    if (c0 % bs == 0 && c1 % bs == 0) {
        const size_t off = c0 ? ggml_row_bytes(t->type, c0) : 0;
        const size_t nb = ggml_row_bytes(t->type, c1 - c0);
        char *buf = malloc(nb * (size_t)N);
        if (!buf) return st_errf(err, "%s: out of memory", name);
        for (int64_t r = 0; r < N; r++)
            memcpy(buf + (size_t)r * nb, (const char *)t->data + (size_t)r * rb + off, nb);
        rcode = rc->be->ops->weight_upload(rc->be, w, t->type, N, c1 - c0, buf, err);
        free(buf);
    } else {
        ST_WARN("%s: columns [%lld, %lld) are not %s-block aligned; rank %d holds them as f32",
                name, (long long)c0, (long long)c1, ggml_type_name(t->type), rc->rank);
        float *row = malloc((size_t)K * sizeof(float));
        float *buf = malloc((size_t)(c1 - c0) * (size_t)N * sizeof(float));
        rcode = (!row || !buf) ? st_errf(err, "%s: out of memory", name) : 0;
        for (int64_t r = 0; r < N && rcode == 0; r++) {
            rcode = gguf_tensor_rows_f32(t, r, 1, row, err);
            if (rcode == 0) memcpy(buf + r * (c1 - c0), row + c0, (size_t)(c1 - c0) * sizeof(float));
        }
        if (rcode == 0)
            rcode = rc->be->ops->weight_upload(rc->be, w, GGML_TYPE_F32, N, c1 - c0, buf, err);
        free(row);
        free(buf);
    }
    if (rcode) return st_err_prefix(err, "%s", name);
    /* Every rank reads every row here, so only the last one done may drop them. */
    if (rc->s->tp == 1) gguf_release_pages(rc->s->f, t->data, t->nbytes);
    if (progress(rc->s, w->nbytes)) return st_errf(err, "stage: load cancelled");
    return 0;
}

/* A 1-D norm weight, always held as F32. */
static int load_norm(rank_ctx *rc, backend_weight *w, const char *name, st_err *err) {
    const gguf_tensor *t = tensor(rc->s, name, err);
    if (!t) return -1;
    float *buf = malloc((size_t)t->ne[0] * sizeof(float));
    if (!buf) return st_errf(err, "%s: out of memory", name);
    int r = gguf_tensor_rows_f32(t, 0, 1, buf, err);
    if (r == 0) r = rc->be->ops->weight_upload(rc->be, w, GGML_TYPE_F32, 1, t->ne[0], buf, err);
    free(buf);
    if (r) return st_err_prefix(err, "%s", name);
    if (progress(rc->s, w->nbytes)) return st_errf(err, "stage: load cancelled");
    return 0;
}

static int rank_load(rank_ctx *rc, st_err *err) {
    stage *s = rc->s;
    const llama_config *c = &s->cfg;
    const shard_plan *pl = &rc->plan;
    const int hd = c->head_dim;
    const int nl = s->last - s->first;
    rc->layers = calloc((size_t)(nl ? nl : 1), sizeof *rc->layers);
    if (!rc->layers) return st_errf(err, "out of memory");
    char name[96];
    if (s->first == 0 && load_rows(rc, &rc->tok_embd, "token_embd.weight", pl->vocab.lo, pl->vocab.hi, err))
        return -1;
    const size_t kv_elems = (size_t)s->p.kv_blocks * (size_t)s->p.block_size *
                             (size_t)pl->n_head_kv_local * (size_t)hd;
    for (int i = 0; i < nl; i++) {
        const int l = s->first + i;
        layer_w *L = &rc->layers[i];
#define NM(what) llama_tensor_name(name, sizeof name, l, what)
        if (load_norm(rc, &L->attn_norm, NM("attn_norm"), err) ||
            load_rows(rc, &L->wq, NM("attn_q"), pl->q_heads.lo * hd, pl->q_heads.hi * hd, err) ||
            load_rows(rc, &L->wk, NM("attn_k"), pl->kv_heads.lo * hd, pl->kv_heads.hi * hd, err) ||
            load_rows(rc, &L->wv, NM("attn_v"), pl->kv_heads.lo * hd, pl->kv_heads.hi * hd, err) ||
            load_cols(rc, &L->wo, NM("attn_output"), pl->q_heads.lo * hd, pl->q_heads.hi * hd, err) ||
            load_norm(rc, &L->ffn_norm, NM("ffn_norm"), err) ||
            load_rows(rc, &L->gate, NM("ffn_gate"), pl->ff.lo, pl->ff.hi, err) ||
            load_rows(rc, &L->up, NM("ffn_up"), pl->ff.lo, pl->ff.hi, err) ||
            load_cols(rc, &L->down, NM("ffn_down"), pl->ff.lo, pl->ff.hi, err))
            return -1;
#undef NM
        const size_t esz = s->p.kv_type == GGML_TYPE_F16 ? 2 : 4;
        L->kc = rc->be->ops->alloc(rc->be, kv_elems * esz, err);
        if (!L->kc) return -1;
        L->vc = rc->be->ops->alloc(rc->be, kv_elems * esz, err);
        if (!L->vc) return -1;
    }
    if (s->last == c->n_layer) {
        if (load_norm(rc, &rc->out_norm, "output_norm.weight", err)) return -1;
        if (c->tied_output && s->first == 0) {
            rc->lm_head = rc->tok_embd;
            rc->lm_head_shared = 1;
        } else if (load_rows(rc, &rc->lm_head, c->tied_output ? "token_embd.weight" : "output.weight",
                             pl->vocab.lo, pl->vocab.hi, err)) {
            return -1;
        }
    }
    return 0;
}

/* Bytes a rank will load (for the progress percentage). */
static size_t plan_bytes(stage *s, const shard_plan *pl) {
    const llama_config *c = &s->cfg;
    const int hd = c->head_dim;
    size_t total = 0;
    char name[96];
    const gguf_tensor *t;
#define ROWS(nm, n) ((t = gguf_find_tensor(s->f, nm)) ? ggml_row_bytes(t->type, t->ne[0]) * (size_t)(n) : 0)
#define COLS(nm, n) ((t = gguf_find_tensor(s->f, nm)) ? ggml_row_bytes(t->type, n) * (size_t)t->ne[1] : 0)
    if (s->first == 0) total += ROWS("token_embd.weight", pl->n_vocab_local);
    for (int l = s->first; l < s->last; l++) {
        total += 2 * (size_t)c->n_embd * sizeof(float);
        total += ROWS(llama_tensor_name(name, sizeof name, l, "attn_q"), pl->n_head_local * hd);
        total += 2 * ROWS(llama_tensor_name(name, sizeof name, l, "attn_k"), pl->n_head_kv_local * hd);
        total += COLS(llama_tensor_name(name, sizeof name, l, "attn_output"), pl->n_head_local * hd);
        total += 2 * ROWS(llama_tensor_name(name, sizeof name, l, "ffn_gate"), pl->n_ff_local);
        total += COLS(llama_tensor_name(name, sizeof name, l, "ffn_down"), pl->n_ff_local);
    }
    if (s->last == c->n_layer) {
        total += (size_t)c->n_embd * sizeof(float);
        if (!(c->tied_output && s->first == 0))
            total += ROWS(c->tied_output ? "token_embd.weight" : "output.weight", pl->n_vocab_local);
    }
#undef ROWS
#undef COLS
    return total;
}

/* ------------------------------------------------------- activation buffers */

/* The host copy of the logits: pinned memory from the module when it has an
 * allocator (a device backend: the per-step download is then a DMA, not a
 * driver bounce through pageable memory), else malloc. */
static float *logits_host_alloc(const stage *s, size_t bytes) {
    if (s->bm->host_alloc) return s->bm->host_alloc(bytes, NULL);
    return malloc(bytes);
}

static void logits_host_free(const stage *s, float *p) {
    if (!p) return;
    if (s->bm->host_free)
        s->bm->host_free(p);
    else
        free(p);
}

static void rank_free_acts(rank_ctx *rc) {
    backend *be = rc->be;
    float **bufs[] = {&rc->x, &rc->xn, &rc->q, &rc->k, &rc->v, &rc->att, &rc->o, &rc->g, &rc->u};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        be->ops->release(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    rc->cap = 0;
}

static int rank_prepare(rank_ctx *rc, int64_t T, int64_t S, st_err *err) {
    stage *s = rc->s;
    backend *be = rc->be;
    const llama_config *c = &s->cfg;
    const shard_plan *pl = &rc->plan;
    if (s->cuda && rc->cap > 0 && (T > rc->cap || (S > rc->cap_s && s->last == c->n_layer)) &&
        !rc->grown_logged) {
        rc->grown_logged = true;
        ST_WARN("stage [%d,%d) rank %d: a batch of %lld tokens (%lld sampled) outgrows the workspace allocated "
                "at load (%lld tokens, %lld sampled); it grows now, an allocation inside a forward (raise "
                "stage_params.max_batch_tokens)", s->first, s->last, rc->rank, (long long)T, (long long)S,
                (long long)rc->cap, (long long)rc->cap_s);
    }
    if (T > rc->cap) {
        rank_free_acts(rc);
        int64_t cap = T < 16 ? 16 : T;
        const size_t E = (size_t)c->n_embd * sizeof(float) * (size_t)cap;
        const size_t Q = (size_t)pl->n_head_local * c->head_dim * sizeof(float) * (size_t)cap;
        const size_t KV = (size_t)pl->n_head_kv_local * c->head_dim * sizeof(float) * (size_t)cap;
        const size_t F = (size_t)pl->n_ff_local * sizeof(float) * (size_t)cap;
        if (!(rc->x = be->ops->alloc(be, E, err)) || !(rc->xn = be->ops->alloc(be, E, err)) ||
            !(rc->o = be->ops->alloc(be, E, err)) || !(rc->q = be->ops->alloc(be, Q, err)) ||
            !(rc->att = be->ops->alloc(be, Q, err)) || !(rc->k = be->ops->alloc(be, KV, err)) ||
            !(rc->v = be->ops->alloc(be, KV, err)) || !(rc->g = be->ops->alloc(be, F, err)) ||
            !(rc->u = be->ops->alloc(be, F, err))) {
            rank_free_acts(rc);
            return -1;
        }
        rc->cap = cap;
    }
    if (S > rc->cap_s && s->last == c->n_layer) {
        int64_t cap = S < 8 ? 8 : S;
        be->ops->release(be, rc->xs);
        be->ops->release(be, rc->logits);
        logits_host_free(s, rc->h_logits);
        rc->xs = be->ops->alloc(be, (size_t)cap * c->n_embd * sizeof(float), err);
        rc->logits = be->ops->alloc(be, (size_t)cap * pl->n_vocab_local * sizeof(float), err);
        rc->h_logits = logits_host_alloc(s, (size_t)cap * pl->n_vocab_local * sizeof(float));
        rc->cap_s = cap;
        if (!rc->xs || !rc->logits || !rc->h_logits) {
            rc->cap_s = 0;
            return rc->h_logits ? -1 : st_errf(err, "out of memory for logits");
        }
    }
    if (S > 0) {
        size_t bb = sampler_tp_blob_bytes(s->cur.max_cands);
        size_t need_send = bb * (size_t)S, need_recv = need_send * (size_t)s->tp;
        if (need_send > rc->blob_cap_send) {
            free(rc->blob_send);
            rc->blob_send = malloc(need_send);
            rc->blob_cap_send = rc->blob_send ? need_send : 0;
        }
        if (need_recv > rc->blob_cap_recv) {
            free(rc->blob_recv);
            rc->blob_recv = malloc(need_recv);
            rc->blob_cap_recv = rc->blob_recv ? need_recv : 0;
        }
        if (!rc->blob_send || !rc->blob_recv) return st_errf(err, "out of memory for sampling");
        if (s->cuda && need_send + need_recv > rc->d_blob_cap) {
            be->ops->release(be, rc->d_blob);
            rc->d_blob_cap = 0;
            if (!(rc->d_blob = be->ops->alloc(be, need_send + need_recv, err))) return -1;
            rc->d_blob_cap = need_send + need_recv;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- forward */

static bool penalties_on(const sampler_params *p) {
    return (p->repeat_penalty != 1.0f && p->repeat_last_n != 0) || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

/* The sampling all-gather of `bytes` per rank: host blobs on the CPU backend;
 * NCCL wants device memory, so the cuda backend goes through rc->d_blob. The
 * collective is made even when the upload failed (see rank_forward). */
static int rank_all_gather(rank_ctx *rc, size_t bytes, st_err *err) {
    if (!rc->s->cuda) return comm_all_gather(rc->c, rc->blob_send, rc->blob_recv, bytes, err);
    backend *be = rc->be;
    st_err e2;
    int up = be->ops->upload(be, rc->d_blob, rc->blob_send, bytes, err);
    int ag = comm_all_gather(rc->c, rc->d_blob, rc->d_blob + bytes, bytes, up ? &e2 : err);
    if (up || ag) return -1;
    return be->ops->download(be, rc->blob_recv, rc->d_blob + bytes, bytes * (size_t)rc->s->tp, err);
}

/* The forward of one rank. Once an op fails, the rank stops computing but
 * still makes every collective call (on its valid buffers), so that the other
 * ranks never wait forever; the error is reported after the batch. */
static void rank_forward(rank_ctx *rc) {
    stage *s = rc->s;
    const fwd *fw = &s->cur;
    const stage_batch *b = fw->b;
    const llama_config *c = &s->cfg;
    const shard_plan *pl = &rc->plan;
    backend *be = rc->be;
    const backend_ops *o = be->ops;
    st_err *err = &rc->err;
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

    if (s->first == 0) {
        OP(o->embed(be, rc->x, &rc->tok_embd, b->tokens, T, pl->vocab.lo, err));
        COLL(o->all_reduce(be, rc->c, rc->x, (size_t)(T * E), &_e));
    } else {
        if (fw->in_dev) /* rank 0's device buffer: every rank copies it (a peer copy on another GPU) */
            OP(o->copy(be, rc->x, fw->hin, (size_t)(T * E) * sizeof(float), err));
        else
            OP(o->upload(be, rc->x, fw->hin, (size_t)(T * E) * sizeof(float), err));
    }
    backend_attn at = {
        .n_head = pl->n_head_local,
        .n_head_kv = pl->n_head_kv_local,
        .head_dim = (int)hd,
        .block_size = s->p.block_size,
        .n_cache_blocks = s->p.kv_blocks,
        .kv_type = s->p.kv_type,
        .scale = 1.0f / sqrtf((float)hd),
        .n_seqs = b->n_seqs,
        .seqs = fw->aseqs,
    };
    const int64_t n_slots = (int64_t)s->p.kv_blocks * s->p.block_size;
    /* On the last stage only the sampled rows (one per sequence that wants
     * logits) are read after the last layer, so its FFN runs on those rows
     * alone (gathered into xs), as llama.cpp does: a 64-token prompt skips
     * 63/64 of one layer's FFN. The K/V of every row are still stored. (A
     * chunk that wants no logits keeps its FFN, so that the collective counts
     * of stage.h hold.) A row's values do not depend on which rows share its
     * matmul, except for the float types' matvec or GEMM summation order. */
    const bool prune = s->last == c->n_layer && fw->n_logit > 0 && fw->n_logit < T;
    const int n_layers = s->last - s->first;
    for (int i = 0; i < n_layers; i++) {
        layer_w *L = &rc->layers[i];
        OP(o->rmsnorm(be, rc->xn, rc->x, &L->attn_norm, T, E, c->rms_eps, err));
        OP(o->matmul(be, rc->q, rc->xn, &L->wq, T, err));
        OP(o->matmul(be, rc->k, rc->xn, &L->wk, T, err));
        OP(o->matmul(be, rc->v, rc->xn, &L->wv, T, err));
        OP(o->rope(be, rc->q, T, pl->n_head_local, (int)hd, c->n_rot, fw->pos, c->rope_base, s->rope_ff, err));
        OP(o->rope(be, rc->k, T, pl->n_head_kv_local, (int)hd, c->n_rot, fw->pos, c->rope_base, s->rope_ff, err));
        OP(o->kv_store(be, L->kc, L->vc, s->p.kv_type, rc->k, rc->v, T, pl->n_head_kv_local * hd, fw->slots, n_slots, err));
        OP(o->attention(be, rc->att, rc->q, L->kc, L->vc, &at, err));
        OP(o->matmul(be, rc->o, rc->att, &L->wo, T, err));
        COLL(o->all_reduce(be, rc->c, rc->o, (size_t)(T * E), &_e));
        OP(o->add(be, rc->x, rc->o, T * E, err));
        float *xf = rc->x; /* the FFN's rows: all T, or the sampled ones in the last layer */
        int64_t Tf = T;
        if (prune && i == n_layers - 1) {
            Tf = fw->n_logit;
            OP(o->get_rows(be, rc->xs, rc->x, fw->logit_rows, Tf, E, err));
            xf = rc->xs;
        }
        OP(o->rmsnorm(be, rc->xn, xf, &L->ffn_norm, Tf, E, c->rms_eps, err));
        OP(o->matmul(be, rc->g, rc->xn, &L->gate, Tf, err));
        OP(o->matmul(be, rc->u, rc->xn, &L->up, Tf, err));
        OP(o->swiglu(be, rc->g, rc->g, rc->u, Tf * pl->n_ff_local, err));
        OP(o->matmul(be, rc->o, rc->g, &L->down, Tf, err));
        COLL(o->all_reduce(be, rc->c, rc->o, (size_t)(Tf * E), &_e));
        OP(o->add(be, xf, rc->o, Tf * E, err));
    }
    if (s->last != c->n_layer) {
        if (rc->rank == 0 && fw->out_dev) {
            OP(o->copy(be, fw->hout, rc->x, (size_t)(T * E) * sizeof(float), err));
            /* a synchronising read: the copy is done before another stream (NCCL) reads hout */
            float probe;
            OP(o->download(be, &probe, fw->hout, sizeof probe, err));
        } else if (rc->rank == 0) {
            OP(o->download(be, fw->hout, rc->x, (size_t)(T * E) * sizeof(float), err));
        }
    } else if (fw->n_logit > 0) {
        const int S = fw->n_logit;
        const int64_t Vl = pl->n_vocab_local;
        if (!prune) OP(o->get_rows(be, rc->xs, rc->x, fw->logit_rows, S, E, err)); /* pruned: xs has them */
        OP(o->rmsnorm(be, rc->xs, rc->xs, &rc->out_norm, S, E, c->rms_eps, err));
        OP(o->matmul(be, rc->logits, rc->xs, &rc->lm_head, S, err));
        OP(o->download(be, rc->h_logits, rc->logits, (size_t)(S * Vl) * sizeof(float), err));
        const size_t bb = sampler_tp_blob_bytes(fw->max_cands);
        memset(rc->blob_send, 0, bb * (size_t)S);
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
            OP(sampler_tp_local_blob(&sq->sampling, rc->h_logits + j * Vl, (int32_t)pl->vocab.lo,
                                     (int32_t)pl->vocab.hi, hp, sq->step, fw->max_cands,
                                     rc->blob_send + (size_t)j * bb, err));
            if (hp) sampler_history_free(hp);
        }
        COLL(rank_all_gather(rc, bb * (size_t)S, &_e));
        if (rc->rank == 0 && rc_ == 0) {
            /* recv is [rank][seq] blobs; the merge wants one seq's blobs in rank order. */
            unsigned char *tmp = malloc(bb * (size_t)s->tp);
            if (!tmp) rc_ = st_errf(err, "out of memory merging samples");
            for (int j = 0; j < S && rc_ == 0; j++) {
                const stage_seq *sq = &b->seqs[fw->logit_seq[j]];
                for (int r = 0; r < s->tp; r++)
                    memcpy(tmp + (size_t)r * bb, rc->blob_recv + ((size_t)r * S + j) * bb, bb);
                OP(sampler_tp_merge_blobs(&sq->sampling, tmp, s->tp, fw->max_cands, sq->step,
                                          &fw->samples[fw->logit_seq[j]], err));
            }
            free(tmp);
        }
    }
#undef OP
#undef COLL
    rc->rc = rc_;
}

/* The rank's backend: a CUDA backend on its NCCL rank's GPU, or the CPU one. */
static backend *rank_backend(rank_ctx *rc, st_err *err) {
    const stage *s = rc->s;
    return s->bm->backend_new(s->p.n_devices ? s->p.devices[rc->rank] : rc->rank, rc->n_threads, err);
}

static void *rank_main(void *arg) {
    rank_ctx *rc = arg;
    stage *s = rc->s;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->gen == seen && !s->quit) pthread_cond_wait(&s->cv_go, &s->mu);
        if (s->quit) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        seen = s->gen;
        int phase = s->phase;
        pthread_mutex_unlock(&s->mu);

        double t0 = st_now_s();
        rc->rc = 0;
        if (phase == 0) {
            st_err e;
            rc->be = rank_backend(rc, &e);
            if (!rc->be) {
                rc->err = e;
                rc->rc = -1;
            } else {
                rc->rc = rank_load(rc, &rc->err);
                /* A device backend gets its workspace now, not in a forward. */
                if (rc->rc == 0 && s->cuda) {
                    const int64_t T0 = s->p.max_batch_tokens > 0 ? s->p.max_batch_tokens : 512;
                    const int64_t S0 = s->last == s->cfg.n_layer ? (T0 < 256 ? T0 : 256) : 0;
                    rc->rc = rank_prepare(rc, T0, S0, &rc->err); /* s->cur.max_cands: stage_open */
                }
            }
        } else if (phase == 1) {
            rc->rc = rank_prepare(rc, s->cur.b->n_tokens, s->cur.n_logit, &rc->err);
        } else {
            rank_forward(rc);
            rc->busy += st_now_s() - t0;
        }

        pthread_mutex_lock(&s->mu);
        s->n_done++;
        if (s->n_done == s->tp) pthread_cond_signal(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* Runs one phase on every rank and waits. Returns the first rank's error.
 * A single CPU rank (TP 1) runs the per-forward phases inline on the caller's
 * thread: the rank thread then only loads (phase 0), and a forward costs no
 * thread hand-offs. (The CPU backend keeps no thread-affine state; a CUDA
 * rank stays on its thread, which owns the device context.) */
static int run_phase(stage *s, int phase, st_err *err) {
    if (s->tp == 1 && !s->cuda && phase != 0) {
        rank_ctx *rc = &s->ranks[0];
        double t0 = st_now_s();
        rc->rc = 0;
        if (phase == 1) {
            rc->rc = rank_prepare(rc, s->cur.b->n_tokens, s->cur.n_logit, &rc->err);
        } else {
            rank_forward(rc);
            rc->busy += st_now_s() - t0;
        }
        if (rc->rc != 0) {
            if (err) *err = rc->err;
            return st_err_prefix(err, "stage rank %d", 0);
        }
        return 0;
    }
    pthread_mutex_lock(&s->mu);
    s->phase = phase;
    s->n_done = 0;
    s->gen++;
    pthread_cond_broadcast(&s->cv_go);
    while (s->n_done < s->tp) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    for (int r = 0; r < s->tp; r++) {
        if (s->ranks[r].rc != 0) {
            if (err) *err = s->ranks[r].err;
            return st_err_prefix(err, "stage rank %d", r);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- open/close */

static void rank_release(rank_ctx *rc) {
    backend *be = rc->be;
    if (!be) return;
    const backend_ops *o = be->ops;
    if (rc->layers) {
        for (int i = 0; i < rc->s->last - rc->s->first; i++) {
            layer_w *L = &rc->layers[i];
            backend_weight *ws[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
                                    &L->ffn_norm, &L->gate, &L->up, &L->down};
            for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) o->weight_free(be, ws[k]);
            o->release(be, L->kc);
            o->release(be, L->vc);
        }
        free(rc->layers);
    }
    o->weight_free(be, &rc->tok_embd);
    o->weight_free(be, &rc->out_norm);
    if (!rc->lm_head_shared) o->weight_free(be, &rc->lm_head);
    rank_free_acts(rc);
    o->release(be, rc->xs);
    o->release(be, rc->logits);
    logits_host_free(rc->s, rc->h_logits);
    free(rc->blob_send);
    free(rc->blob_recv);
    o->release(be, rc->d_blob);
    backend_free(be);
    rc->be = NULL;
}

void stage_close(stage *s) {
    if (!s) return;
    if (s->ranks) {
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_broadcast(&s->cv_go);
        pthread_mutex_unlock(&s->mu);
        for (int r = 0; r < s->tp; r++)
            if (s->ranks[r].started) pthread_join(s->ranks[r].thread, NULL);
        for (int i = 0; i < s->n_dev_bufs; i++) s->ranks[0].be->ops->release(s->ranks[0].be, s->dev_bufs[i].p);
        s->n_dev_bufs = 0;
        for (int r = 0; r < s->tp; r++) rank_release(&s->ranks[r]);
        free(s->ranks);
    }
    if (s->group) s->bm->group_free(s->group);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_go);
    pthread_cond_destroy(&s->cv_done);
    free(s->rope_ff);
    free(s->pos);
    free(s->slots);
    free(s->aseqs);
    free(s->logit_rows);
    free(s->logit_seq);
    gguf_close(s->f);
    free(s);
}

stage *stage_open(const stage_params *pin, st_err *err) {
    if (!pin || !pin->model_path) {
        st_errf(err, "stage: no model path");
        return NULL;
    }
    st_err be_err;
    const backend_module *bm = backend_registry_get(pin->backend && *pin->backend ? pin->backend : NULL, &be_err);
    if (!bm) {
        st_errf(err, "stage: %s", be_err.msg);
        return NULL;
    }
    if (bm->device_memory) {
        int n_dev = bm->device_count();
        if (n_dev == 0) {
            st_errf(err, "stage: backend %s: no CUDA device", bm->name);
            return NULL;
        }
        if (pin->tp > n_dev) {
            st_errf(err, "stage: backend %s: TP %d needs one device per rank, %d visible", bm->name, pin->tp, n_dev);
            return NULL;
        }
    }
    if (pin->n_devices) {
        if (!bm->device_memory) {
            st_errf(err, "stage: backend %s takes no device list", bm->name);
            return NULL;
        }
        if (pin->n_devices != pin->tp || pin->n_devices > STAGE_MAX_DEVICES) {
            st_errf(err, "stage: %d devices listed for TP %d (one per rank)", pin->n_devices, pin->tp);
            return NULL;
        }
        for (int i = 0; i < pin->n_devices; i++) {
            bool dup = false;
            for (int j = 0; j < i; j++) dup |= pin->devices[j] == pin->devices[i];
            if (pin->devices[i] < 0 || pin->devices[i] >= bm->device_count() || dup) {
                st_errf(err, "stage: device %d is %s", pin->devices[i], dup ? "listed twice" : "not visible");
                return NULL;
            }
        }
    }
    stage *s = calloc(1, sizeof *s);
    if (!s) {
        st_errf(err, "stage: out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_go, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    s->p = *pin;
    s->bm = bm;
    s->cuda = bm->device_memory;
    if (s->p.block_size == 0) s->p.block_size = 16;
    if (s->p.kv_type != GGML_TYPE_F32 && s->p.kv_type != GGML_TYPE_F16) {
        st_errf(err, "stage: KV cache type %s is not supported (f32 or f16)", ggml_type_name(s->p.kv_type));
        goto fail;
    }
    s->tp = s->p.tp;
    if (s->tp < 1 || s->tp > 64) {
        st_errf(err, "stage: TP degree %d must be in [1, 64]", s->tp);
        goto fail;
    }
    if (s->p.kv_blocks < 1 || s->p.block_size < 1) {
        st_errf(err, "stage: kv_blocks (%d) and block_size (%d) must be >= 1", s->p.kv_blocks,
                s->p.block_size);
        goto fail;
    }
    if (s->p.cancel && atomic_load(s->p.cancel)) {
        st_errf(err, "stage: load cancelled");
        goto fail;
    }
    s->f = s->p.use_model_fd ? gguf_open_fd(s->p.model_fd, s->p.model_path, err) : gguf_open(s->p.model_path, err);
    if (!s->f) goto fail;
    if (llama_config_from_gguf(s->f, &s->cfg, err)) goto fail;
    s->first = s->p.first_layer;
    s->last = s->p.last_layer < 0 ? s->cfg.n_layer : s->p.last_layer;
    if (s->first < 0 || s->last > s->cfg.n_layer || s->first >= s->last) {
        st_errf(err, "stage: layer range [%d, %d) is not inside the model's %d layers",
                s->first, s->last, s->cfg.n_layer);
        goto fail;
    }
    if (s->cfg.has_rope_freqs && s->first < s->last) {
        const gguf_tensor *t = gguf_find_tensor(s->f, "rope_freqs.weight");
        s->rope_ff = malloc((size_t)t->ne[0] * sizeof(float));
        if (!s->rope_ff || gguf_tensor_rows_f32(t, 0, 1, s->rope_ff, err)) {
            if (!s->rope_ff) st_errf(err, "stage: out of memory");
            goto fail;
        }
    }
    s->ranks = calloc((size_t)s->tp, sizeof *s->ranks);
    if (!s->ranks) {
        st_errf(err, "stage: out of memory");
        goto fail;
    }
    int n_threads = s->p.n_threads > 0 ? s->p.n_threads : st_cpu_count();
    for (int r = 0; r < s->tp; r++) {
        rank_ctx *rc = &s->ranks[r];
        rc->s = s;
        rc->rank = r;
        if (shard_plan_make(&s->cfg, s->tp, r, &rc->plan, err)) goto fail;
        rc->n_threads = n_threads / s->tp + (r < n_threads % s->tp ? 1 : 0);
        if (rc->n_threads < 1) rc->n_threads = 1;
        s->load_total += plan_bytes(s, &rc->plan);
    }
    s->group = bm->group_new(s->tp, s->p.n_devices ? s->p.devices : NULL, err);
    if (!s->group) goto fail;
    for (int r = 0; r < s->tp; r++) s->ranks[r].c = bm->group_rank(s->group, r);
    for (int r = 0; r < s->tp; r++) {
        if (pthread_create(&s->ranks[r].thread, NULL, rank_main, &s->ranks[r]) != 0) {
            st_errf(err, "stage: cannot start rank thread %d", r);
            goto fail;
        }
        s->ranks[r].started = 1;
    }
    ST_INFO("stage [%d,%d) of %d layers, tp %d, %d threads: loading %s (%.1f MiB)", s->first,
            s->last, s->cfg.n_layer, s->tp, n_threads, s->p.model_path,
            (double)s->load_total / 1048576.0);
    /* The sampling blobs of the load-time workspace (rank_prepare): room for
     * the candidates of any sampling without top_k (top_k above it grows them). */
    s->cur.max_cands = SAMPLER_TP_CANDS;
    if (run_phase(s, 0, err)) goto fail;
    /* The ranks hold their copies now; drop what is left of the mapping from RSS. */
    for (int64_t i = 0; i < gguf_n_tensors(s->f); i++) {
        const gguf_tensor *t = gguf_tensor_at(s->f, i);
        gguf_release_pages(s->f, t->data, t->nbytes);
    }
    s->opened_ns = st_now_ns();
    return s;
fail:
    stage_close(s);
    return NULL;
}

/* ---------------------------------------------------------------- accessors */

const llama_config *stage_config(const stage *s) { return &s->cfg; }
int stage_first_layer(const stage *s) { return s->first; }
int stage_last_layer(const stage *s) { return s->last; }
bool stage_failed(const stage *s, st_err *why) {
    if (s->failed && why) snprintf(why->msg, sizeof why->msg, "%s", s->failed_why);
    return s->failed;
}

bool stage_is_first(const stage *s) { return s->first == 0; }
bool stage_is_last(const stage *s) { return s->last == s->cfg.n_layer; }
int stage_tp(const stage *s) { return s->tp; }
int stage_kv_blocks(const stage *s) { return s->p.kv_blocks; }
int stage_block_size(const stage *s) { return s->p.block_size; }

int stage_rank_stats_get(const stage *s, int rank, stage_rank_stats *out) {
    if (rank < 0 || rank >= s->tp) return -1;
    const rank_ctx *rc = &s->ranks[rank];
    memset(out, 0, sizeof *out);
    out->weight_bytes = backend_weight_bytes(rc->be);
    out->buf_bytes = rc->be->ops->buf_bytes(rc->be);
    out->all_reduce_calls = rc->c->stats.all_reduce_calls;
    out->all_gather_calls = rc->c->stats.all_gather_calls;
    out->comm_seconds = rc->c->stats.seconds;
    out->busy_seconds = rc->busy;
    return 0;
}

void stage_stats_get(const stage *s, stage_stats *out) {
    *out = s->stats;
    out->open_seconds = (double)(st_now_ns() - s->opened_ns) * 1e-9;
}

/* ---------------------------------------------------------------- forward */

static int grow_meta(stage *s, int64_t T, int n_seqs, st_err *err) {
    if (T > s->meta_cap) {
        int64_t cap = T < 64 ? 64 : T;
        int32_t *p = realloc(s->pos, (size_t)cap * sizeof *p);
        if (p) s->pos = p;
        int32_t *q = realloc(s->slots, (size_t)cap * sizeof *q);
        if (q) s->slots = q;
        if (!p || !q) return st_errf(err, "stage: out of memory");
        s->meta_cap = cap;
    }
    if (n_seqs > s->meta_seq_cap) {
        int cap = n_seqs < 16 ? 16 : n_seqs;
        backend_attn_seq *a = realloc(s->aseqs, (size_t)cap * sizeof *a);
        if (a) s->aseqs = a;
        int32_t *r = realloc(s->logit_rows, (size_t)cap * sizeof *r);
        if (r) s->logit_rows = r;
        int32_t *q = realloc(s->logit_seq, (size_t)cap * sizeof *q);
        if (q) s->logit_seq = q;
        if (!a || !r || !q) return st_errf(err, "stage: out of memory");
        s->meta_seq_cap = cap;
    }
    return 0;
}

void *stage_dev_alloc(stage *s, size_t bytes, st_err *err) {
    if (!s->cuda) return st_errf(err, "stage: backend %s has no device memory", s->bm->name), NULL;
    int best = -1; /* the smallest free buffer that fits */
    for (int i = 0; i < s->n_dev_bufs; i++)
        if (!s->dev_bufs[i].used && s->dev_bufs[i].cap >= bytes &&
            (best < 0 || s->dev_bufs[i].cap < s->dev_bufs[best].cap))
            best = i;
    if (best >= 0) {
        s->dev_bufs[best].used = true;
        return s->dev_bufs[best].p;
    }
    if (s->n_dev_bufs == STAGE_MAX_DEV_BUFS)
        return st_errf(err, "stage: %d hand-off buffers live already", STAGE_MAX_DEV_BUFS), NULL;
    size_t cap = STAGE_DEV_BUF_MIN;
    while (cap < bytes) cap *= 2;
    backend *be = s->ranks[0].be;
    void *p = be->ops->alloc(be, cap, err);
    if (p) s->dev_bufs[s->n_dev_bufs++] = (struct stage_dev_buf){.p = p, .cap = cap, .used = true};
    return p;
}

void stage_dev_free(stage *s, void *p) {
    int i = 0;
    while (p && i < s->n_dev_bufs && s->dev_bufs[i].p != p) i++;
    if (!p || i == s->n_dev_bufs) return;
    s->dev_bufs[i].used = false;
    int kept = 0;
    for (int k = 0; k < s->n_dev_bufs; k++) kept += !s->dev_bufs[k].used;
    if (kept <= STAGE_KEEP_DEV_BUFS) return;
    /* too many kept: release the smallest free one */
    int small = -1;
    for (int k = 0; k < s->n_dev_bufs; k++)
        if (!s->dev_bufs[k].used && (small < 0 || s->dev_bufs[k].cap < s->dev_bufs[small].cap)) small = k;
    s->ranks[0].be->ops->release(s->ranks[0].be, s->dev_bufs[small].p);
    s->dev_bufs[small] = s->dev_bufs[--s->n_dev_bufs];
}

int stage_device(const stage *s) { return s->p.n_devices ? s->p.devices[0] : 0; }

static int forward_impl(stage *s, const stage_batch *b, const void *hidden_in, bool in_dev, void *hidden_out,
                        bool out_dev, stage_sample_out *samples, st_err *err);

int stage_forward(stage *s, const stage_batch *b, const float *hidden_in, float *hidden_out,
                  stage_sample_out *samples, st_err *err) {
    return forward_impl(s, b, hidden_in, false, hidden_out, false, samples, err);
}

int stage_forward_io(stage *s, const stage_batch *b, const void *in, bool in_dev, void *out, bool out_dev,
                     stage_sample_out *samples, st_err *err) {
    if ((in_dev || out_dev) && !s->cuda)
        return st_errf(err, "stage: backend %s has no device memory for a device hand-off", s->bm->name);
    return forward_impl(s, b, in, in_dev, out, out_dev, samples, err);
}

static int forward_impl(stage *s, const stage_batch *b, const void *hidden_in, bool in_dev, void *hidden_out,
                        bool out_dev, stage_sample_out *samples, st_err *err) {
    const double t0 = st_now_s();
    const llama_config *c = &s->cfg;
    const bool first = stage_is_first(s), last = stage_is_last(s);
    if (s->failed) return st_errf(err, "stage: failed earlier, it cannot run again (%s)", s->failed_why);
    if (test_fail_now()) {
        s->failed = true;
        snprintf(s->failed_why, sizeof s->failed_why,
                 "comm nccl all_reduce (rank 0): communicator aborted (test: STRATA_TEST_STAGE_FAIL_FILE)");
        return st_errf(err, "stage: %s", s->failed_why);
    }
    if (!b || b->n_seqs < 1 || !b->seqs || b->n_tokens < 1)
        return st_errf(err, "stage: empty batch");
    if (first && !b->tokens) return st_errf(err, "stage: the first stage needs token ids");
    if (!first && !hidden_in) return st_errf(err, "stage: hidden_in is required after the first stage");
    if (!last && !hidden_out) return st_errf(err, "stage: hidden_out is required before the last stage");
    if (last && !samples) return st_errf(err, "stage: samples is required on the last stage");
    if (grow_meta(s, b->n_tokens, b->n_seqs, err)) return -1;
    const int bs = s->p.block_size;
    int64_t row = 0;
    int n_logit = 0;
    int32_t max_cands = 1;
    for (int i = 0; i < b->n_seqs; i++) {
        const stage_seq *sq = &b->seqs[i];
        if (sq->n_tokens < 1 || sq->pos < 0 || row + sq->n_tokens > b->n_tokens)
            return st_errf(err, "stage: sequence %d (id %llu) has bad n_tokens %d / pos %d", i,
                           (unsigned long long)sq->seq_id, sq->n_tokens, sq->pos);
        int64_t end = (int64_t)sq->pos + sq->n_tokens;
        if (end > (int64_t)s->p.kv_blocks * bs || end > INT32_MAX / 2)
            return st_errf(err, "stage: sequence %llu reaches position %lld, beyond the KV cache",
                           (unsigned long long)sq->seq_id, (long long)end);
        int64_t need = (end + bs - 1) / bs;
        if (!sq->block_table || sq->n_blocks < need)
            return st_errf(err, "stage: sequence %llu needs %lld KV blocks for %lld positions, its table has %d",
                           (unsigned long long)sq->seq_id, (long long)need, (long long)end, sq->n_blocks);
        for (int64_t k = 0; k < need; k++)
            if (sq->block_table[k] < 0 || sq->block_table[k] >= s->p.kv_blocks)
                return st_errf(err, "stage: sequence %llu: block id %d outside [0, %d)",
                               (unsigned long long)sq->seq_id, sq->block_table[k], s->p.kv_blocks);
        for (int32_t t = 0; t < sq->n_tokens; t++) {
            int32_t p = sq->pos + t;
            s->pos[row + t] = p;
            s->slots[row + t] = sq->block_table[p / bs] * bs + p % bs;
            if (first && (b->tokens[row + t] < 0 || b->tokens[row + t] >= c->n_vocab))
                return st_errf(err, "stage: token id %d outside the vocabulary [0, %d)",
                               b->tokens[row + t], c->n_vocab);
        }
        s->aseqs[i] = (backend_attn_seq){.tok0 = (int32_t)row, .n_tokens = sq->n_tokens,
                                         .pos0 = sq->pos, .block_table = sq->block_table,
                                         .n_blocks = sq->n_blocks};
        if (last) {
            samples[i].id = -1;
            samples[i].n_top = 0;
        }
        if (last && sq->want_logits) {
            if (sampler_params_validate(&sq->sampling, err))
                return st_err_prefix(err, "stage: sequence %llu", (unsigned long long)sq->seq_id);
            int32_t m = sampler_tp_max_cands(&sq->sampling);
            if (m > max_cands) max_cands = m;
            s->logit_rows[n_logit] = (int32_t)(row + sq->n_tokens - 1);
            s->logit_seq[n_logit] = i;
            n_logit++;
        }
        row += sq->n_tokens;
    }
    if (row != b->n_tokens)
        return st_errf(err, "stage: sequences hold %lld tokens, batch says %d", (long long)row, b->n_tokens);
    int32_t vmax = (int32_t)s->ranks[0].plan.n_vocab_local; /* rank 0 has the largest slice */
    if (max_cands > vmax) max_cands = vmax;
    s->cur = (fwd){.b = b, .hin = hidden_in, .hout = hidden_out, .samples = samples, .in_dev = in_dev,
                   .out_dev = out_dev,
                   .pos = s->pos, .slots = s->slots, .aseqs = s->aseqs,
                   .logit_rows = s->logit_rows, .logit_seq = s->logit_seq, .n_logit = n_logit,
                   .max_cands = max_cands};
    if (run_phase(s, 1, err) || run_phase(s, 2, err)) {
        /* A rank whose communicator was aborted (an NCCL error or a missed
         * deadline) leaves the stage unusable: say so for good. */
        for (int r = 0; r < s->tp; r++)
            if (s->ranks[r].c && s->ranks[r].c->failed && !s->failed) {
                s->failed = true;
                snprintf(s->failed_why, sizeof s->failed_why, "%s", err ? err->msg : "communicator aborted");
                ST_ERROR("stage [%d,%d) tp %d failed: rank %d's communicator was aborted: %s", s->first, s->last,
                         s->tp, r, s->failed_why);
            }
        return -1;
    }
    s->stats.forwards++;
    s->stats.tokens += (uint64_t)b->n_tokens;
    s->stats.busy_seconds += st_now_s() - t0;
    return 0;
}
