/* backend_cpu.c — the CPU implementation of compute/backend.h: host memory,
 * cpu_matmul for the linear layers, compute/cpu/ops.c for the rest, each op
 * split over this rank's own st_pool. */
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/backend.h"
#include "compute/cpu/matmul.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/threadpool.h"

typedef struct cpu_be {
    backend base;
    st_pool *pool;
    size_t weight_bytes, buf_bytes;
    float *scratch; /* attention scores: nth * scratch_per */
    size_t scratch_n;
} cpu_be;

/* alloc() blocks carry their size in a header so release() can account them. */
typedef struct buf_hdr {
    size_t bytes;
    size_t pad; /* keeps the payload 16-byte aligned */
} buf_hdr;

static cpu_be *CB(backend *b) { return (cpu_be *)b->impl; }

static void cpu_destroy(backend *b) {
    cpu_be *c = CB(b);
    st_pool_free(c->pool);
    free(c->scratch);
    free(c);
}

static void *cpu_alloc(backend *b, size_t bytes, st_err *err) {
    buf_hdr *h = malloc(sizeof(buf_hdr) + (bytes ? bytes : 1));
    if (!h) {
        st_errf(err, "cpu backend: out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    h->bytes = bytes;
    CB(b)->buf_bytes += bytes;
    return h + 1;
}

static void cpu_release(backend *b, void *p) {
    if (!p) return;
    buf_hdr *h = (buf_hdr *)p - 1;
    CB(b)->buf_bytes -= h->bytes;
    free(h);
}

static int cpu_memcpy(backend *b, void *dst, const void *src, size_t bytes, st_err *err) {
    if (bytes && (!dst || !src)) return st_errf(err, "cpu backend: copy with a NULL buffer");
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

/* Large weights go on 2 MiB-aligned memory with transparent huge pages asked
 * for: decode streams every weight once per token, and 4 KiB pages cost a TLB
 * miss every 4 KiB of that stream. */
#define WEIGHT_HUGE_ALIGN ((size_t)2 << 20)
static void *weight_alloc(size_t n) {
    if (n < WEIGHT_HUGE_ALIGN) return malloc(n);
    size_t rounded = (n + WEIGHT_HUGE_ALIGN - 1) & ~(WEIGHT_HUGE_ALIGN - 1);
    void *p = aligned_alloc(WEIGHT_HUGE_ALIGN, rounded);
    if (p) madvise(p, rounded, MADV_HUGEPAGE);
    return p;
}

static int cpu_weight_upload(backend *b, backend_weight *w, uint32_t type, int64_t rows,
                             int64_t cols, const void *src, st_err *err) {
    size_t rb = ggml_row_bytes(type, cols);
    if (rows <= 0 || rb == 0)
        return st_errf(err, "cpu backend: cannot hold a %lld x %lld %s weight", (long long)rows,
                       (long long)cols, ggml_type_name(type));
    size_t n = rb * (size_t)rows;
    void *p = weight_alloc(n);
    if (!p) return st_errf(err, "cpu backend: out of memory for a %zu-byte weight", n);
    memcpy(p, src, n);
    w->data = p;
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->nbytes = n;
    CB(b)->weight_bytes += n;
    return 0;
}

static void cpu_weight_free(backend *b, backend_weight *w) {
    if (!w->data) return;
    CB(b)->weight_bytes -= w->nbytes;
    free(w->data);
    memset(w, 0, sizeof *w);
}

static size_t cpu_weight_bytes(const backend *b) { return ((cpu_be *)b->impl)->weight_bytes; }
static size_t cpu_buf_bytes(const backend *b) { return ((cpu_be *)b->impl)->buf_bytes; }

static int cpu_matmul_op(backend *b, float *y, const float *x, const backend_weight *w, int64_t T,
                         st_err *err) {
    return cpu_matmul(CB(b)->pool, y, x, w->data, w->type, T, w->cols, w->rows, err);
}

/* ---- row-parallel helpers ---- */

typedef struct rows_job {
    float *y;
    const float *x, *x2, *w;
    int64_t n, rows;
    float eps;
    /* rope */
    int n_head, head_dim, n_rot;
    const int32_t *pos;
    float base;
    const float *ff;
} rows_job;

static void job_rmsnorm(void *ctx, int ith, int nth) {
    rows_job *j = ctx;
    long lo, hi;
    st_split_range(j->rows, ith, nth, &lo, &hi);
    ops_rmsnorm_rows(j->y, j->x, j->w, j->n, j->eps, lo, hi);
}

static void job_rope(void *ctx, int ith, int nth) {
    rows_job *j = ctx;
    long lo, hi;
    st_split_range(j->rows, ith, nth, &lo, &hi);
    ops_rope_rows(j->y, j->n_head, j->head_dim, j->n_rot, j->pos, j->base, j->ff, lo, hi);
}

static void job_swiglu(void *ctx, int ith, int nth) {
    rows_job *j = ctx;
    long lo, hi;
    st_split_range(j->n, ith, nth, &lo, &hi);
    ops_swiglu(j->y, j->x, j->x2, lo, hi);
}

static void job_add(void *ctx, int ith, int nth) {
    rows_job *j = ctx;
    long lo, hi;
    st_split_range(j->n, ith, nth, &lo, &hi);
    ops_add(j->y, j->x, lo, hi);
}

/* Runs fn over the pool when the work is big enough to pay for the fork. */
static void run(cpu_be *c, st_pool_fn fn, void *ctx, int64_t work) {
    if (work < 16384 || st_pool_size(c->pool) == 1)
        fn(ctx, 0, 1);
    else
        st_pool_run(c->pool, fn, ctx);
}

static int cpu_rmsnorm(backend *b, float *y, const float *x, const backend_weight *w, int64_t T,
                       int64_t n, float eps, st_err *err) {
    if (w->cols != n || w->rows != 1)
        return st_errf(err, "cpu backend: rmsnorm weight is %lld x %lld, expected %lld",
                       (long long)w->rows, (long long)w->cols, (long long)n);
    if (w->type != GGML_TYPE_F32) return st_errf(err, "cpu backend: rmsnorm weight must be f32 (got %s)", ggml_type_name(w->type));
    rows_job j = {.y = y, .x = x, .w = w->data, .n = n, .rows = T, .eps = eps};
    run(CB(b), job_rmsnorm, &j, T * n);
    return 0;
}

static int cpu_rope(backend *b, float *x, int64_t T, int n_head, int head_dim, int n_rot,
                    const int32_t *pos, float base, const float *ff, st_err *err) {
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 || n_rot > OPS_ROPE_MAX_DIM)
        return st_errf(err, "cpu backend: rope n_rot %d invalid for head_dim %d", n_rot, head_dim);
    rows_job j = {.y = x, .rows = T, .n_head = n_head, .head_dim = head_dim, .n_rot = n_rot,
                  .pos = pos, .base = base, .ff = ff};
    run(CB(b), job_rope, &j, T * n_head * head_dim * 8);
    return 0;
}

static int cpu_kv_store(backend *b, void *kcv, void *vcv, uint32_t kv_type, const float *k,
                        const float *v,
                        int64_t T, int64_t kv_dim, const int32_t *slots, int64_t n_slots,
                        st_err *err) {
    for (int64_t t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= n_slots)
            return st_errf(err, "cpu backend: KV slot %d outside [0, %lld)", (int)slots[t],
                           (long long)n_slots);
    if (kv_type == GGML_TYPE_F32) {
        float *kc = kcv, *vc = vcv;
        for (int64_t t = 0; t < T; t++) {
            memcpy(kc + (int64_t)slots[t] * kv_dim, k + t * kv_dim, (size_t)kv_dim * sizeof(float));
            memcpy(vc + (int64_t)slots[t] * kv_dim, v + t * kv_dim, (size_t)kv_dim * sizeof(float));
        }
        return 0;
    }
    if (kv_type != GGML_TYPE_F16)
        return st_errf(err, "cpu backend: KV cache type %s is not supported", ggml_type_name(kv_type));
    uint16_t *kc = kcv, *vc = vcv;
    for (int64_t t = 0; t < T; t++) {
        uint16_t *kd = kc + (int64_t)slots[t] * kv_dim, *vd = vc + (int64_t)slots[t] * kv_dim;
        const float *ks = k + t * kv_dim, *vs = v + t * kv_dim;
        for (int64_t i = 0; i < kv_dim; i++) {
            kd[i] = st_f32_to_fp16(ks[i]);
            vd[i] = st_f32_to_fp16(vs[i]);
        }
    }
    return 0;
}

typedef struct attn_job {
    float *out;
    const float *q;
    const void *kc, *vc;
    const backend_attn *a;
    const int32_t *row_seq; /* batch row -> seq index */
    int64_t n_rows;
    float *scratch;
    size_t scratch_per;
} attn_job;

static void job_attn(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    const backend_attn *a = j->a;
    const int group = a->n_head / a->n_head_kv;
    const int64_t qdim = (int64_t)a->n_head * a->head_dim;
    const int64_t kvdim = (int64_t)a->n_head_kv * a->head_dim;
    long lo, hi;
    st_split_range(j->n_rows * a->n_head, ith, nth, &lo, &hi);
    float *s = j->scratch + (size_t)ith * j->scratch_per;
    for (long w = lo; w < hi; w++) {
        int64_t row = w / a->n_head;
        int h = (int)(w % a->n_head);
        const backend_attn_seq *sq = &a->seqs[j->row_seq[row]];
        int32_t n_pos = sq->pos0 + (int32_t)(row - sq->tok0) + 1; /* causal */
        float *o = j->out + row * qdim + (int64_t)h * a->head_dim;
        const float *q = j->q + row * qdim + (int64_t)h * a->head_dim;
        const int64_t off = (int64_t)(h / group) * a->head_dim;
        if (a->kv_type == GGML_TYPE_F16)
            ops_attend_head_f16(o, q, j->kc, j->vc, sq->block_table, a->block_size, kvdim, off,
                                a->head_dim, n_pos, a->scale, s);
        else
            ops_attend_head_f32(o, q, j->kc, j->vc, sq->block_table, a->block_size, kvdim, off,
                                a->head_dim, n_pos, a->scale, s);
    }
}

static int cpu_attention(backend *b, float *out, const float *q, const void *kc, const void *vc,
                         const backend_attn *a, st_err *err) {
    cpu_be *c = CB(b);
    if (a->kv_type != GGML_TYPE_F32 && a->kv_type != GGML_TYPE_F16)
        return st_errf(err, "cpu backend: KV cache type %s is not supported", ggml_type_name(a->kv_type));
    if (a->n_head_kv <= 0 || a->n_head % a->n_head_kv || a->block_size <= 0 || a->n_seqs < 0)
        return st_errf(err, "cpu backend: bad attention shape (heads %d / kv %d, block %d)",
                       a->n_head, a->n_head_kv, a->block_size);
    int64_t n_rows = 0;
    int32_t max_pos = 1;
    for (int i = 0; i < a->n_seqs; i++) {
        const backend_attn_seq *s = &a->seqs[i];
        if (s->tok0 != n_rows || s->n_tokens < 0 || s->pos0 < 0)
            return st_errf(err, "cpu backend: attention sequence %d has bad rows/positions", i);
        int32_t end = s->pos0 + s->n_tokens;
        int32_t need = (end + a->block_size - 1) / a->block_size;
        if (s->n_blocks < need)
            return st_errf(err, "cpu backend: block table of sequence %d has %d blocks, %d needed",
                           i, (int)s->n_blocks, (int)need);
        for (int32_t k = 0; k < need; k++)
            if (s->block_table[k] < 0 || s->block_table[k] >= a->n_cache_blocks)
                return st_errf(err, "cpu backend: block id %d outside the cache [0, %d)",
                               (int)s->block_table[k], a->n_cache_blocks);
        n_rows += s->n_tokens;
        if (end > max_pos) max_pos = end;
    }
    int nth = st_pool_size(c->pool);
    const size_t per = (size_t)max_pos + (size_t)a->head_dim;
    size_t need = (size_t)nth * per;
    if (need > c->scratch_n) {
        float *ns = realloc(c->scratch, need * sizeof(float));
        if (!ns) return st_errf(err, "cpu backend: out of memory for attention scratch");
        c->scratch = ns;
        c->scratch_n = need;
    }
    int32_t *row_seq = malloc((size_t)(n_rows ? n_rows : 1) * sizeof *row_seq);
    if (!row_seq) return st_errf(err, "cpu backend: out of memory");
    for (int i = 0; i < a->n_seqs; i++)
        for (int32_t t = 0; t < a->seqs[i].n_tokens; t++) row_seq[a->seqs[i].tok0 + t] = i;
    attn_job j = {.out = out, .q = q, .kc = kc, .vc = vc, .a = a, .row_seq = row_seq,
                  .n_rows = n_rows, .scratch = c->scratch, .scratch_per = per};
    if (n_rows * a->n_head * (int64_t)max_pos * a->head_dim < 16384 || nth == 1)
        job_attn(&j, 0, 1);
    else
        st_pool_run(c->pool, job_attn, &j);
    free(row_seq);
    return 0;
}

static int cpu_swiglu(backend *b, float *out, const float *gate, const float *up, int64_t n,
                      st_err *err) {
    rows_job j = {.y = out, .x = gate, .x2 = up, .n = n};
    run(CB(b), job_swiglu, &j, n * 4);
    return 0;
}

static int cpu_add(backend *b, float *y, const float *x, int64_t n, st_err *err) {
    rows_job j = {.y = y, .x = x, .n = n};
    run(CB(b), job_add, &j, n);
    return 0;
}

static int cpu_embed(backend *b, float *out, const backend_weight *tab, const int32_t *ids,
                     int64_t T, int64_t row0, st_err *err) {
    const size_t rb = ggml_row_bytes(tab->type, tab->cols);
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * tab->cols;
        int64_t r = (int64_t)ids[t] - row0;
        if (r < 0 || r >= tab->rows) {
            memset(o, 0, (size_t)tab->cols * sizeof(float));
            continue;
        }
        if (st_dequant_row(tab->type, (const char *)tab->data + (size_t)r * rb, o, tab->cols))
            return st_errf(err, "cpu backend: cannot dequantize an embedding row of type %s",
                           ggml_type_name(tab->type));
    }
    return 0;
}

static int cpu_get_rows(backend *b, float *dst, const float *src, const int32_t *rows,
                        int64_t n_rows, int64_t n, st_err *err) {
    for (int64_t i = 0; i < n_rows; i++)
        memmove(dst + i * n, src + (int64_t)rows[i] * n, (size_t)n * sizeof(float));
    return 0;
}

static int cpu_all_reduce(backend *b, comm *c, float *buf, size_t count, st_err *err) {
    return comm_all_reduce_sum(c, buf, count, COMM_F32, err);
}

static const backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .weight_upload = cpu_weight_upload,
    .weight_free = cpu_weight_free,
    .weight_bytes = cpu_weight_bytes,
    .buf_bytes = cpu_buf_bytes,
    .matmul = cpu_matmul_op,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .embed = cpu_embed,
    .get_rows = cpu_get_rows,
    .all_reduce = cpu_all_reduce,
};

backend *backend_cpu_new(int n_threads, st_err *err) {
    cpu_be *c = calloc(1, sizeof *c);
    if (!c) {
        st_errf(err, "cpu backend: out of memory");
        return NULL;
    }
    c->pool = st_pool_new(n_threads < 1 ? 1 : n_threads, err);
    if (!c->pool) {
        free(c);
        return NULL;
    }
    c->base.ops = &cpu_ops;
    c->base.impl = c;
    return &c->base;
}
