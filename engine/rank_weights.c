/* rank_weights.c — loads one TP rank's shard of the stage's weights from the
 * GGUF mapping (column-parallel weights by rows, row-parallel ones by
 * columns), allocates its KV caches, and frees them. See rank_weights.h. */
#include "engine/rank_weights.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "common/log.h"
#include "model/gguf.h"
#include "model/llama.h"

/* What a tensor load needs besides the tensor. */
typedef struct loader {
    backend *be;
    const stage_shape *sh;
    int rank;
    rank_weights_progress progress;
    void *progress_ctx;
} loader;

/* Test-only hook (docs/worker.md): each loaded tensor takes N ms longer, so a
 * test can cancel a load that the page cache would otherwise finish at once.
 * Inert unless $STRATA_TEST_LOAD_DELAY_MS is set. */
static void test_load_delay(void) {
    const char *v = getenv("STRATA_TEST_LOAD_DELAY_MS");
    long ms = v && *v ? strtol(v, NULL, 10) : 0;
    if (ms > 0) nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L}, NULL);
}

/* Counts a loaded tensor; -1 + err when the load was cancelled. */
static int loaded(const loader *ld, size_t bytes, st_err *err) {
    test_load_delay();
    if (ld->progress(ld->progress_ctx, bytes)) return st_errf(err, "stage: load cancelled");
    return 0;
}

static const gguf_tensor *tensor(const loader *ld, const char *name, st_err *err) {
    const gguf_tensor *t = gguf_find_tensor(ld->sh->f, name);
    if (!t) st_errf(err, "%s: missing tensor %s", gguf_path(ld->sh->f), name);
    return t;
}

/* Rows [r0, r1) of a 2-D tensor, in its file type. */
static int load_rows(const loader *ld, backend_weight *w, const char *name, int64_t r0, int64_t r1,
                     st_err *err) {
    const gguf_tensor *t = tensor(ld, name, err);
    if (!t) return -1;
    if (r0 < 0 || r1 > t->ne[1] || r0 >= r1)
        return st_errf(err, "%s: rows [%lld, %lld) outside %lld", name, (long long)r0,
                       (long long)r1, (long long)t->ne[1]);
    size_t rb = ggml_row_bytes(t->type, t->ne[0]);
    if (rb == 0) return st_errf(err, "%s: unsupported type %s", name, ggml_type_name(t->type));
    if (ld->be->ops->weight_upload(ld->be, w, t->type, r1 - r0, t->ne[0],
                                   (const char *)t->data + (size_t)r0 * rb, err))
        return st_err_prefix(err, "%s", name);
    gguf_release_pages(ld->sh->f, (const char *)t->data + (size_t)r0 * rb, (size_t)(r1 - r0) * rb);
    return loaded(ld, w->nbytes, err);
}

/* Columns [c0, c1) of every row of a 2-D tensor (row-parallel weights). Kept
 * in the file type when the range is block-aligned; else dequantized to F32. */
static int load_cols(const loader *ld, backend_weight *w, const char *name, int64_t c0, int64_t c1,
                     st_err *err) {
    const gguf_tensor *t = tensor(ld, name, err);
    if (!t) return -1;
    const int64_t K = t->ne[0], N = t->ne[1];
    if (c0 < 0 || c1 > K || c0 >= c1)
        return st_errf(err, "%s: columns [%lld, %lld) outside %lld", name, (long long)c0,
                       (long long)c1, (long long)K);
    const int bs = ggml_block_size(t->type);
    const size_t rb = ggml_row_bytes(t->type, K);
    if (rb == 0) return st_errf(err, "%s: unsupported type %s", name, ggml_type_name(t->type));
    backend *be = ld->be;
    int rcode;
    if (c0 % bs == 0 && c1 % bs == 0) {
        const size_t off = c0 ? ggml_row_bytes(t->type, c0) : 0;
        const size_t nb = ggml_row_bytes(t->type, c1 - c0);
        char *buf = malloc(nb * (size_t)N);
        if (!buf) return st_errf(err, "%s: out of memory", name);
        for (int64_t r = 0; r < N; r++)
            memcpy(buf + (size_t)r * nb, (const char *)t->data + (size_t)r * rb + off, nb);
        rcode = be->ops->weight_upload(be, w, t->type, N, c1 - c0, buf, err);
        free(buf);
    } else {
        ST_WARN("%s: columns [%lld, %lld) are not %s-block aligned; rank %d holds them as f32",
                name, (long long)c0, (long long)c1, ggml_type_name(t->type), ld->rank);
        float *row = malloc((size_t)K * sizeof(float));
        float *buf = malloc((size_t)(c1 - c0) * (size_t)N * sizeof(float));
        rcode = (!row || !buf) ? st_errf(err, "%s: out of memory", name) : 0;
        for (int64_t r = 0; r < N && rcode == 0; r++) {
            rcode = gguf_tensor_rows_f32(t, r, 1, row, err);
            if (rcode == 0) memcpy(buf + r * (c1 - c0), row + c0, (size_t)(c1 - c0) * sizeof(float));
        }
        if (rcode == 0) rcode = be->ops->weight_upload(be, w, GGML_TYPE_F32, N, c1 - c0, buf, err);
        free(row);
        free(buf);
    }
    if (rcode) return st_err_prefix(err, "%s", name);
    /* Every rank reads every row here, so only the last one done may drop them. */
    if (ld->sh->tp == 1) gguf_release_pages(ld->sh->f, t->data, t->nbytes);
    return loaded(ld, w->nbytes, err);
}

/* A 1-D norm weight, always held as F32. */
static int load_norm(const loader *ld, backend_weight *w, const char *name, st_err *err) {
    const gguf_tensor *t = tensor(ld, name, err);
    if (!t) return -1;
    float *buf = malloc((size_t)t->ne[0] * sizeof(float));
    if (!buf) return st_errf(err, "%s: out of memory", name);
    int r = gguf_tensor_rows_f32(t, 0, 1, buf, err);
    if (r == 0) r = ld->be->ops->weight_upload(ld->be, w, GGML_TYPE_F32, 1, t->ne[0], buf, err);
    free(buf);
    if (r) return st_err_prefix(err, "%s", name);
    return loaded(ld, w->nbytes, err);
}

int rank_weights_load(rank_weights *w, backend *be, const stage_shape *sh, const shard_plan *pl, int rank,
                      rank_weights_progress progress, void *progress_ctx, st_err *err) {
    const loader ld = {.be = be, .sh = sh, .rank = rank, .progress = progress, .progress_ctx = progress_ctx};
    const llama_config *c = &sh->cfg;
    const int hd = c->head_dim;
    const int nl = sh->last - sh->first;
    w->layers = calloc((size_t)(nl ? nl : 1), sizeof *w->layers);
    if (!w->layers) return st_errf(err, "out of memory");
    w->n_layers = nl;
    char name[96];
    if (sh->first == 0 && load_rows(&ld, &w->tok_embd, "token_embd.weight", pl->vocab.lo, pl->vocab.hi, err))
        return -1;
    const size_t kv_elems = (size_t)sh->kv_blocks * (size_t)sh->block_size *
                             (size_t)pl->n_head_kv_local * (size_t)hd;
    for (int i = 0; i < nl; i++) {
        const int l = sh->first + i;
        layer_w *L = &w->layers[i];
#define NM(what) llama_tensor_name(name, sizeof name, l, what)
        if (load_norm(&ld, &L->attn_norm, NM("attn_norm"), err) ||
            load_rows(&ld, &L->wq, NM("attn_q"), pl->q_heads.lo * hd, pl->q_heads.hi * hd, err) ||
            load_rows(&ld, &L->wk, NM("attn_k"), pl->kv_heads.lo * hd, pl->kv_heads.hi * hd, err) ||
            load_rows(&ld, &L->wv, NM("attn_v"), pl->kv_heads.lo * hd, pl->kv_heads.hi * hd, err) ||
            load_cols(&ld, &L->wo, NM("attn_output"), pl->q_heads.lo * hd, pl->q_heads.hi * hd, err) ||
            load_norm(&ld, &L->ffn_norm, NM("ffn_norm"), err) ||
            load_rows(&ld, &L->gate, NM("ffn_gate"), pl->ff.lo, pl->ff.hi, err) ||
            load_rows(&ld, &L->up, NM("ffn_up"), pl->ff.lo, pl->ff.hi, err) ||
            load_cols(&ld, &L->down, NM("ffn_down"), pl->ff.lo, pl->ff.hi, err))
            return -1;
#undef NM
        const size_t esz = sh->kv_type == GGML_TYPE_F16 ? 2 : 4;
        L->kc = be->ops->alloc(be, kv_elems * esz, err);
        if (!L->kc) return -1;
        L->vc = be->ops->alloc(be, kv_elems * esz, err);
        if (!L->vc) return -1;
    }
    if (sh->last == c->n_layer) {
        if (load_norm(&ld, &w->out_norm, "output_norm.weight", err)) return -1;
        if (c->tied_output && sh->first == 0) {
            w->lm_head = w->tok_embd;
            w->lm_head_shared = 1;
        } else if (load_rows(&ld, &w->lm_head, c->tied_output ? "token_embd.weight" : "output.weight",
                             pl->vocab.lo, pl->vocab.hi, err)) {
            return -1;
        }
    }
    return 0;
}

size_t rank_weights_bytes(const stage_shape *sh, const shard_plan *pl) {
    const llama_config *c = &sh->cfg;
    const int hd = c->head_dim;
    size_t total = 0;
    char name[96];
    const gguf_tensor *t;
#define ROWS(nm, n) ((t = gguf_find_tensor(sh->f, nm)) ? ggml_row_bytes(t->type, t->ne[0]) * (size_t)(n) : 0)
#define COLS(nm, n) ((t = gguf_find_tensor(sh->f, nm)) ? ggml_row_bytes(t->type, n) * (size_t)t->ne[1] : 0)
    if (sh->first == 0) total += ROWS("token_embd.weight", pl->n_vocab_local);
    for (int l = sh->first; l < sh->last; l++) {
        total += 2 * (size_t)c->n_embd * sizeof(float);
        total += ROWS(llama_tensor_name(name, sizeof name, l, "attn_q"), pl->n_head_local * hd);
        total += 2 * ROWS(llama_tensor_name(name, sizeof name, l, "attn_k"), pl->n_head_kv_local * hd);
        total += COLS(llama_tensor_name(name, sizeof name, l, "attn_output"), pl->n_head_local * hd);
        total += 2 * ROWS(llama_tensor_name(name, sizeof name, l, "ffn_gate"), pl->n_ff_local);
        total += COLS(llama_tensor_name(name, sizeof name, l, "ffn_down"), pl->n_ff_local);
    }
    if (sh->last == c->n_layer) {
        total += (size_t)c->n_embd * sizeof(float);
        if (!(c->tied_output && sh->first == 0))
            total += ROWS(c->tied_output ? "token_embd.weight" : "output.weight", pl->n_vocab_local);
    }
#undef ROWS
#undef COLS
    return total;
}

void rank_weights_free(rank_weights *w, backend *be) {
    const backend_ops *o = be->ops;
    if (w->layers) {
        for (int i = 0; i < w->n_layers; i++) {
            layer_w *L = &w->layers[i];
            backend_weight *ws[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
                                    &L->ffn_norm, &L->gate, &L->up, &L->down};
            for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) o->weight_free(be, ws[k]);
            o->release(be, L->kc);
            o->release(be, L->vc);
        }
        free(w->layers);
        w->layers = NULL;
    }
    o->weight_free(be, &w->tok_embd);
    o->weight_free(be, &w->out_norm);
    if (!w->lm_head_shared) o->weight_free(be, &w->lm_head);
}
