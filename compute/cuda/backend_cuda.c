/* backend_cuda.c — the CUDA implementation of compute/backend.h (see
 * backend_cuda.h): device memory and its accounting, host-metadata staging,
 * cuBLAS for the linear layers and the kernels of kernels.cu for the rest.
 * Plain C against the CUDA runtime and cuBLAS; every call is checked and
 * turned into an st_err. */
#include "compute/cuda/backend_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cuda/kernels.h"

/* Weight rows dequantized per tile for the f32 prefill GEMM (elements). */
#define TILE_ELEMS ((size_t)16 << 20) /* 64 MiB of f32 */
#define META_ALIGN 256

typedef struct dev_buf {
    void *p;
    size_t bytes;
} dev_buf;

typedef struct cuda_be {
    backend base;
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    size_t weight_bytes, buf_bytes;
    dev_buf *bufs; /* live alloc() blocks, for release() accounting */
    size_t n_bufs, cap_bufs;
    void *scratch; /* dequantized tiles / converted activations */
    size_t scratch_n;
    void *meta; /* op metadata copied from the host */
    size_t meta_n;
    int32_t *hmeta; /* host staging for the attention metadata */
    size_t hmeta_n;
    int half_gemm;
    int sync_each; /* STRATA_CUDA_SYNC=1 */
} cuda_be;

static const backend_ops cuda_ops;

static cuda_be *CB(backend *b) { return (cuda_be *)b->impl; }

static int ck(const cuda_be *c, cudaError_t e, const char *what, st_err *err) {
    if (e == cudaSuccess) return 0;
    return st_errf(err, "cuda backend (device %d): %s: %s", c->device, what, cudaGetErrorString(e));
}

static int ckb(const cuda_be *c, cublasStatus_t s, const char *what, st_err *err) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    return st_errf(err, "cuda backend (device %d): %s: %s", c->device, what, cublasGetStatusString(s));
}

static int use(const cuda_be *c, st_err *err) {
    return ck(c, cudaSetDevice(c->device), "cudaSetDevice", err);
}

/* After a launch: the launch error, then (STRATA_CUDA_SYNC=1) the execution error. */
static int launched(const cuda_be *c, cudaError_t e, const char *what, st_err *err) {
    if (ck(c, e, what, err)) return -1;
    if (c->sync_each) return ck(c, cudaStreamSynchronize(c->stream), what, err);
    return 0;
}

/* Grows a device buffer to at least `need` bytes (contents not kept). */
static int grow(cuda_be *c, void **p, size_t *n, size_t need, const char *what, st_err *err) {
    if (need <= *n) return 0;
    if (*p) {
        /* Kernels queued on the stream may still read the old buffer. */
        if (ck(c, cudaStreamSynchronize(c->stream), what, err)) return -1;
        cudaFree(*p);
        *p = NULL;
        *n = 0;
    }
    if (ck(c, cudaMalloc(p, need), what, err)) {
        *p = NULL;
        return -1;
    }
    *n = need;
    return 0;
}

/* Copies n host arrays into the metadata buffer (one stream-ordered copy each,
 * so the host arrays may be reused once this returns) and sets *dst[i]. */
typedef struct meta_part {
    const void *src;
    size_t bytes;
    void **dst;
} meta_part;

static int meta_upload(cuda_be *c, meta_part *parts, int n, st_err *err) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (parts[i].bytes + META_ALIGN - 1) / META_ALIGN * META_ALIGN;
    if (total == 0) total = META_ALIGN;
    if (grow(c, &c->meta, &c->meta_n, total < 4096 ? 4096 : total, "metadata buffer", err)) return -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        char *d = (char *)c->meta + off;
        *parts[i].dst = NULL;
        if (parts[i].bytes == 0 || !parts[i].src) continue;
        if (ck(c, cudaMemcpyAsync(d, parts[i].src, parts[i].bytes, cudaMemcpyHostToDevice, c->stream),
               "metadata upload", err))
            return -1;
        *parts[i].dst = d;
        off += (parts[i].bytes + META_ALIGN - 1) / META_ALIGN * META_ALIGN;
    }
    return 0;
}

/* ---------------------------------------------------------------- memory */

static void cuda_destroy(backend *b) {
    cuda_be *c = CB(b);
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    for (size_t i = 0; i < c->n_bufs; i++) cudaFree(c->bufs[i].p);
    if (c->scratch) cudaFree(c->scratch);
    if (c->meta) cudaFree(c->meta);
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->bufs);
    free(c->hmeta);
    free(c);
}

static void *cuda_alloc(backend *b, size_t bytes, st_err *err) {
    cuda_be *c = CB(b);
    if (use(c, err)) return NULL;
    if (c->n_bufs == c->cap_bufs) {
        size_t cap = c->cap_bufs ? 2 * c->cap_bufs : 64;
        dev_buf *nb = realloc(c->bufs, cap * sizeof *nb);
        if (!nb) {
            st_errf(err, "cuda backend (device %d): out of host memory", c->device);
            return NULL;
        }
        c->bufs = nb;
        c->cap_bufs = cap;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        st_errf(err, "cuda backend (device %d): cudaMalloc of %zu bytes: %s", c->device, bytes,
                cudaGetErrorString(e));
        return NULL;
    }
    c->bufs[c->n_bufs++] = (dev_buf){p, bytes};
    c->buf_bytes += bytes;
    return p;
}

static void cuda_release(backend *b, void *p) {
    if (!p) return;
    cuda_be *c = CB(b);
    cudaSetDevice(c->device);
    for (size_t i = 0; i < c->n_bufs; i++) {
        if (c->bufs[i].p == p) {
            c->buf_bytes -= c->bufs[i].bytes;
            c->bufs[i] = c->bufs[--c->n_bufs];
            cudaFree(p); /* waits for the work that may still use it */
            return;
        }
    }
}

static int cuda_upload(backend *b, void *dst, const void *src, size_t bytes, st_err *err) {
    cuda_be *c = CB(b);
    if (!bytes) return 0;
    if (!dst || !src) return st_errf(err, "cuda backend: upload with a NULL buffer");
    if (use(c, err) ||
        ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload", err) ||
        ck(c, cudaStreamSynchronize(c->stream), "upload", err))
        return -1;
    return 0;
}

static int cuda_download(backend *b, void *dst, const void *src, size_t bytes, st_err *err) {
    cuda_be *c = CB(b);
    if (!bytes) return 0;
    if (!dst || !src) return st_errf(err, "cuda backend: download with a NULL buffer");
    if (use(c, err) ||
        ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download", err) ||
        ck(c, cudaStreamSynchronize(c->stream), "download", err))
        return -1;
    return 0;
}

static int cuda_copy(backend *b, void *dst, const void *src, size_t bytes, st_err *err) {
    cuda_be *c = CB(b);
    if (!bytes || dst == src) return 0;
    if (!dst || !src) return st_errf(err, "cuda backend: copy with a NULL buffer");
    if ((const char *)dst < (const char *)src + bytes && (const char *)src < (const char *)dst + bytes)
        return st_errf(err, "cuda backend: copy between overlapping buffers");
    if (use(c, err)) return -1;
    return launched(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy", err);
}

static int cuda_weight_upload(backend *b, backend_weight *w, uint32_t type, int64_t rows,
                              int64_t cols, const void *src, st_err *err) {
    cuda_be *c = CB(b);
    size_t rb = ggml_row_bytes(type, cols);
    if (rows <= 0 || rb == 0)
        return st_errf(err, "cuda backend: cannot hold a %lld x %lld %s weight", (long long)rows,
                       (long long)cols, ggml_type_name(type));
    if (!src) return st_errf(err, "cuda backend: weight upload from NULL");
    size_t n = rb * (size_t)rows;
    void *p = NULL;
    if (use(c, err)) return -1;
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess)
        return st_errf(err, "cuda backend (device %d): cudaMalloc of a %zu-byte weight: %s", c->device,
                       n, cudaGetErrorString(e));
    if (ck(c, cudaMemcpyAsync(p, src, n, cudaMemcpyHostToDevice, c->stream), "weight upload", err) ||
        ck(c, cudaStreamSynchronize(c->stream), "weight upload", err)) {
        cudaFree(p);
        return -1;
    }
    w->data = p;
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->nbytes = n;
    c->weight_bytes += n;
    return 0;
}

static void cuda_weight_free(backend *b, backend_weight *w) {
    if (!w->data) return;
    cuda_be *c = CB(b);
    cudaSetDevice(c->device);
    c->weight_bytes -= w->nbytes;
    cudaFree(w->data);
    memset(w, 0, sizeof *w);
}

static size_t cuda_weight_bytes(const backend *b) { return ((const cuda_be *)b->impl)->weight_bytes; }
static size_t cuda_buf_bytes(const backend *b) { return ((const cuda_be *)b->impl)->buf_bytes; }

/* ---------------------------------------------------------------- matmul */

/* y[T, N] (col-major C = [N, T], ldc ldy) = A^T B with A = W rows as col-major
 * [K, m] (lda K) and B = x as col-major [K, T] (ldb K). */
static int sgemm(cuda_be *c, float *y, int64_t ldy, const float *wrows, int64_t m, const float *x,
                 int64_t T, int64_t K, st_err *err) {
    const float one = 1.0f, zero = 0.0f;
    return ckb(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)T, (int)K, &one, wrows,
                              (int)K, x, (int)K, &zero, y, (int)ldy),
               "cublasSgemm", err);
}

static int cuda_matmul(backend *b, float *y, const float *x, const backend_weight *w, int64_t T,
                       st_err *err) {
    cuda_be *c = CB(b);
    const int64_t K = w->cols, N = w->rows;
    if (T < 0 || !w->data || K <= 0 || N <= 0)
        return st_errf(err, "cuda backend: matmul with an empty weight or T %lld", (long long)T);
    if (T == 0) return 0;
    if (!x || !y) return st_errf(err, "cuda backend: matmul with a NULL buffer");
    if (T > INT_MAX || K > INT_MAX || N > INT_MAX)
        return st_errf(err, "cuda backend: matmul %lld x %lld x %lld exceeds cuBLAS int sizes",
                       (long long)T, (long long)K, (long long)N);
    const size_t rb = ggml_row_bytes(w->type, K);
    if (rb == 0)
        return st_errf(err, "cuda backend: matmul weight type %s is not supported", ggml_type_name(w->type));
    if (use(c, err)) return -1;
    if (w->type == GGML_TYPE_F32)
        return sgemm(c, y, N, w->data, N, x, T, K, err) ? -1 : launched(c, cudaSuccess, "sgemm", err);
    if (T <= CUK_MATVEC_MAX_T)
        return launched(c, cuk_matvec(y, x, w->data, w->type, rb, T, K, N, c->stream), "matvec kernel", err);
    if (c->half_gemm && (w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16)) {
        const int bf = w->type == GGML_TYPE_BF16;
        if (grow(c, &c->scratch, &c->scratch_n, (size_t)T * (size_t)K * 2, "gemm scratch", err) ||
            launched(c, cuk_f32_to_half(c->scratch, x, T * K, bf, c->stream), "convert kernel", err))
            return -1;
        const float one = 1.0f, zero = 0.0f;
        const cudaDataType_t ht = bf ? CUDA_R_16BF : CUDA_R_16F;
        if (ckb(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one, w->data, ht,
                                (int)K, c->scratch, ht, (int)K, &zero, y, CUDA_R_32F, (int)N,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx", err))
            return -1;
        return launched(c, cudaSuccess, "gemmex", err);
    }
    /* Dequantize tiles of weight rows to f32, one SGEMM per tile. */
    int64_t chunk = (int64_t)(TILE_ELEMS / (size_t)K);
    if (chunk < 1) chunk = 1;
    if (chunk > N) chunk = N;
    if (grow(c, &c->scratch, &c->scratch_n, (size_t)chunk * (size_t)K * sizeof(float), "gemm scratch", err))
        return -1;
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
        const int64_t m = N - n0 < chunk ? N - n0 : chunk;
        if (launched(c, cuk_dequant_rows(c->scratch, (const char *)w->data + (size_t)n0 * rb, w->type, rb, m,
                                         K, c->stream),
                     "dequantize kernel", err) ||
            sgemm(c, y + n0, N, c->scratch, m, x, T, K, err))
            return -1;
    }
    return launched(c, cudaSuccess, "sgemm", err);
}

/* ---------------------------------------------------------------- other ops */

static int cuda_rmsnorm(backend *b, float *y, const float *x, const backend_weight *w, int64_t T,
                        int64_t n, float eps, st_err *err) {
    cuda_be *c = CB(b);
    if (w->cols != n || w->rows != 1 || n <= 0)
        return st_errf(err, "cuda backend: rmsnorm weight is %lld x %lld, expected %lld",
                       (long long)w->rows, (long long)w->cols, (long long)n);
    if (w->type != GGML_TYPE_F32 && w->type != GGML_TYPE_F16 && w->type != GGML_TYPE_BF16)
        return st_errf(err, "cuda backend: rmsnorm weight must be f32, f16 or bf16 (got %s)",
                       ggml_type_name(w->type));
    if (T < 0 || T > INT_MAX) return st_errf(err, "cuda backend: rmsnorm with T %lld", (long long)T);
    if (T == 0) return 0;
    if (use(c, err)) return -1;
    return launched(c, cuk_rmsnorm(y, x, w->data, w->type, T, n, eps, c->stream), "rmsnorm kernel", err);
}

static int cuda_rope(backend *b, float *x, int64_t T, int n_head, int head_dim, int n_rot,
                     const int32_t *pos, float base, const float *ff, st_err *err) {
    cuda_be *c = CB(b);
    if (n_rot <= 0 || n_rot > head_dim || n_rot % 2 || n_head <= 0)
        return st_errf(err, "cuda backend: rope n_rot %d invalid for head_dim %d", n_rot, head_dim);
    if (T < 0) return st_errf(err, "cuda backend: rope with T %lld", (long long)T);
    if (T == 0) return 0;
    if (!pos) return st_errf(err, "cuda backend: rope without positions");
    if (use(c, err)) return -1;
    void *dpos, *dff;
    meta_part parts[] = {{pos, (size_t)T * sizeof(int32_t), &dpos},
                         {ff, ff ? (size_t)(n_rot / 2) * sizeof(float) : 0, &dff}};
    if (meta_upload(c, parts, 2, err)) return -1;
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    return launched(c, cuk_rope(x, T, n_head, head_dim, n_rot, dpos, theta_scale, dff, c->stream),
                    "rope kernel", err);
}

static int cuda_kv_store(backend *b, void *kc, void *vc, uint32_t kv_type, const float *k,
                         const float *v, int64_t T, int64_t kv_dim, const int32_t *slots,
                         int64_t n_slots, st_err *err) {
    cuda_be *c = CB(b);
    if (kv_type != GGML_TYPE_F32 && kv_type != GGML_TYPE_F16)
        return st_errf(err, "cuda backend: KV cache type %s is not supported", ggml_type_name(kv_type));
    if (T < 0 || kv_dim <= 0) return st_errf(err, "cuda backend: kv_store with T %lld, kv_dim %lld",
                                             (long long)T, (long long)kv_dim);
    if (T == 0) return 0;
    for (int64_t t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= n_slots)
            return st_errf(err, "cuda backend: KV slot %d outside [0, %lld)", (int)slots[t],
                           (long long)n_slots);
    if (use(c, err)) return -1;
    void *dslots;
    meta_part parts[] = {{slots, (size_t)T * sizeof(int32_t), &dslots}};
    if (meta_upload(c, parts, 1, err)) return -1;
    return launched(c, cuk_kv_store(kc, vc, kv_type == GGML_TYPE_F16, k, v, T, kv_dim, dslots, c->stream),
                    "kv_store kernel", err);
}

static int cuda_attention(backend *b, float *out, const float *q, const void *kc, const void *vc,
                          const backend_attn *a, st_err *err) {
    cuda_be *c = CB(b);
    if (a->kv_type != GGML_TYPE_F32 && a->kv_type != GGML_TYPE_F16)
        return st_errf(err, "cuda backend: KV cache type %s is not supported", ggml_type_name(a->kv_type));
    if (a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv || a->block_size <= 0 ||
        a->n_seqs < 0 || a->n_head > 65535)
        return st_errf(err, "cuda backend: bad attention shape (heads %d / kv %d, block %d)", a->n_head,
                       a->n_head_kv, a->block_size);
    if (a->head_dim <= 0 || a->head_dim > CUK_ATT_MAX_HD)
        return st_errf(err, "cuda backend: attention head_dim %d outside [1, %d]", a->head_dim,
                       CUK_ATT_MAX_HD);
    int64_t n_rows = 0, n_bt = 0;
    for (int i = 0; i < a->n_seqs; i++) {
        const backend_attn_seq *s = &a->seqs[i];
        if (s->tok0 != n_rows || s->n_tokens < 0 || s->pos0 < 0)
            return st_errf(err, "cuda backend: attention sequence %d has bad rows/positions", i);
        int32_t end = s->pos0 + s->n_tokens;
        int32_t need = (end + a->block_size - 1) / a->block_size;
        if (s->n_blocks < need)
            return st_errf(err, "cuda backend: block table of sequence %d has %d blocks, %d needed", i,
                           (int)s->n_blocks, (int)need);
        for (int32_t k = 0; k < need; k++)
            if (s->block_table[k] < 0 || s->block_table[k] >= a->n_cache_blocks)
                return st_errf(err, "cuda backend: block id %d outside the cache [0, %d)",
                               (int)s->block_table[k], a->n_cache_blocks);
        n_rows += s->n_tokens;
        n_bt += need;
    }
    if (n_rows == 0) return 0;
    if (n_rows > INT_MAX) return st_errf(err, "cuda backend: attention over %lld rows", (long long)n_rows);
    /* Host staging: row_npos[n_rows], row_btoff[n_rows], bt[n_bt]. */
    size_t need = (size_t)(2 * n_rows + n_bt);
    if (need > c->hmeta_n) {
        int32_t *h = realloc(c->hmeta, need * sizeof *h);
        if (!h) return st_errf(err, "cuda backend: out of host memory");
        c->hmeta = h;
        c->hmeta_n = need;
    }
    int32_t *npos = c->hmeta, *btoff = c->hmeta + n_rows, *bt = c->hmeta + 2 * n_rows;
    int64_t o = 0;
    for (int i = 0; i < a->n_seqs; i++) {
        const backend_attn_seq *s = &a->seqs[i];
        int32_t nb = (s->pos0 + s->n_tokens + a->block_size - 1) / a->block_size;
        memcpy(bt + o, s->block_table, (size_t)nb * sizeof(int32_t));
        for (int32_t t = 0; t < s->n_tokens; t++) {
            npos[s->tok0 + t] = s->pos0 + t + 1; /* causal */
            btoff[s->tok0 + t] = (int32_t)o;
        }
        o += nb;
    }
    if (use(c, err)) return -1;
    void *dnpos, *dbtoff, *dbt;
    meta_part parts[] = {{npos, (size_t)n_rows * sizeof(int32_t), &dnpos},
                         {btoff, (size_t)n_rows * sizeof(int32_t), &dbtoff},
                         {bt, (size_t)n_bt * sizeof(int32_t), &dbt}};
    if (meta_upload(c, parts, 3, err)) return -1;
    return launched(c, cuk_attention(out, q, kc, vc, a->kv_type == GGML_TYPE_F16, dnpos, dbtoff, dbt, n_rows,
                                     a->n_head, a->n_head_kv, a->head_dim, a->block_size, a->scale,
                                     c->stream),
                    "attention kernel", err);
}

static int cuda_swiglu(backend *b, float *out, const float *gate, const float *up, int64_t n,
                       st_err *err) {
    cuda_be *c = CB(b);
    if (n <= 0) return n < 0 ? st_errf(err, "cuda backend: swiglu of %lld elements", (long long)n) : 0;
    if (use(c, err)) return -1;
    return launched(c, cuk_swiglu(out, gate, up, n, c->stream), "swiglu kernel", err);
}

static int cuda_add(backend *b, float *y, const float *x, int64_t n, st_err *err) {
    cuda_be *c = CB(b);
    if (n <= 0) return n < 0 ? st_errf(err, "cuda backend: add of %lld elements", (long long)n) : 0;
    if (use(c, err)) return -1;
    return launched(c, cuk_add(y, x, n, c->stream), "add kernel", err);
}

static int cuda_embed(backend *b, float *out, const backend_weight *tab, const int32_t *ids, int64_t T,
                      int64_t row0, st_err *err) {
    cuda_be *c = CB(b);
    const size_t rb = ggml_row_bytes(tab->type, tab->cols);
    if (rb == 0 || !tab->data)
        return st_errf(err, "cuda backend: cannot look up embeddings of type %s", ggml_type_name(tab->type));
    if (T < 0) return st_errf(err, "cuda backend: embed with T %lld", (long long)T);
    if (T == 0) return 0;
    if (use(c, err)) return -1;
    void *dids;
    meta_part parts[] = {{ids, (size_t)T * sizeof(int32_t), &dids}};
    if (meta_upload(c, parts, 1, err)) return -1;
    return launched(c, cuk_embed(out, tab->data, tab->type, rb, tab->rows, tab->cols, dids, T, row0, c->stream),
                    "embed kernel", err);
}

static int cuda_get_rows(backend *b, float *dst, const float *src, const int32_t *rows, int64_t n_rows,
                         int64_t n, st_err *err) {
    cuda_be *c = CB(b);
    if (n_rows < 0 || n < 0) return st_errf(err, "cuda backend: get_rows of %lld x %lld", (long long)n_rows,
                                            (long long)n);
    if (n_rows == 0 || n == 0) return 0;
    for (int64_t i = 0; i < n_rows; i++)
        if (rows[i] < 0) return st_errf(err, "cuda backend: get_rows row %d is negative", (int)rows[i]);
    if (use(c, err)) return -1;
    void *drows;
    meta_part parts[] = {{rows, (size_t)n_rows * sizeof(int32_t), &drows}};
    if (meta_upload(c, parts, 1, err)) return -1;
    return launched(c, cuk_get_rows(dst, src, drows, n_rows, n, c->stream), "get_rows kernel", err);
}

static int cuda_all_reduce(backend *b, comm *cm, float *buf, size_t count, st_err *err) {
    cuda_be *c = CB(b);
    if (!cm) return st_errf(err, "cuda backend: all_reduce without a comm");
    /* The comm runs on its own stream: finish what produced buf first. */
    if (use(c, err) || ck(c, cudaStreamSynchronize(c->stream), "all_reduce", err)) return -1;
    return comm_all_reduce_sum(cm, buf, count, COMM_F32, err);
}

static const backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .weight_upload = cuda_weight_upload,
    .weight_free = cuda_weight_free,
    .weight_bytes = cuda_weight_bytes,
    .buf_bytes = cuda_buf_bytes,
    .matmul = cuda_matmul,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .swiglu = cuda_swiglu,
    .add = cuda_add,
    .embed = cuda_embed,
    .get_rows = cuda_get_rows,
    .all_reduce = cuda_all_reduce,
};

/* ---------------------------------------------------------------- creation */

int backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the error state */
        return 0;
    }
    return n;
}

static int env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

backend *backend_cuda_new(int device, st_err *err) {
    int n = backend_cuda_device_count();
    if (device < 0 || device >= n) {
        st_errf(err, "cuda backend: device %d does not exist (%d visible)", device, n);
        return NULL;
    }
    cuda_be *c = calloc(1, sizeof *c);
    if (!c) {
        st_errf(err, "cuda backend: out of memory");
        return NULL;
    }
    c->device = device;
    c->base.ops = &cuda_ops;
    c->base.impl = c;
    c->half_gemm = env_on("STRATA_CUDA_HALF_GEMM");
    c->sync_each = env_on("STRATA_CUDA_SYNC");
    if (use(c, err) ||
        ck(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate", err) ||
        ckb(c, cublasCreate(&c->blas), "cublasCreate", err) ||
        ckb(c, cublasSetStream(c->blas, c->stream), "cublasSetStream", err)) {
        cuda_destroy(&c->base);
        return NULL;
    }
    return &c->base;
}

int backend_cuda_set_half_gemm(backend *b, int on, st_err *err) {
    if (!b || b->ops != &cuda_ops) return st_errf(err, "backend_cuda_set_half_gemm: not a CUDA backend");
    CB(b)->half_gemm = on != 0;
    return 0;
}

size_t backend_cuda_scratch_bytes(const backend *b) {
    if (!b || b->ops != &cuda_ops) return 0;
    const cuda_be *c = b->impl;
    return c->scratch_n + c->meta_n;
}
