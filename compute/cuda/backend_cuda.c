/* backend_cuda.c — the CUDA implementation of compute/backend.h (see
 * backend_cuda.h): device memory and its accounting, the pinned metadata
 * ring (meta_ring.h), cuBLAS for the linear layers and the kernels of
 * kernels.cu for the rest; the all-reduce is ordered with events on the NCCL
 * stream (comm_nccl.h), and every host wait polls under the communicator's
 * deadline. Plain C against the CUDA runtime and cuBLAS; every call is
 * checked and turned into an st_err. */
#include "compute/cuda/backend_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/log.h"
#include "compute/cuda/comm_nccl.h"
#include "compute/cuda/kernels.h"
#include "compute/cuda/meta_ring.h"

/* Weight rows dequantized per tile for the f32 prefill GEMM (elements). */
#define TILE_ELEMS ((size_t)16 << 20) /* 64 MiB of f32 */
/* The metadata ring: segments of 1 MiB (grown, once, for a larger op). */
#define RING_SEGS 4
#define RING_SEG_BYTES ((size_t)1 << 20)

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
    void *scratch; /* dequantized tiles / converted activations, sized at weight upload */
    size_t scratch_n;
    /* Op metadata: pinned host ring -> device ring, same offsets (meta_ring.h). */
    meta_ring ring;
    char *ring_host, *ring_dev;
    cudaEvent_t ring_ev[META_RING_MAX_SEGS];
    /* The last upload of each kind of metadata: the same bytes again (every
     * layer's positions, slots and block tables) re-use it, no copy. */
    struct meta_cached {
        meta_ring_ref ref;
        int n;
        size_t bytes[3];
    } mcache[5];
    int32_t *hstage; /* host staging for the attention metadata */
    size_t hstage_n;
    unsigned long long meta_copies, meta_reused;
    cudaEvent_t sync_ev; /* host waits: recorded on the stream, polled */
    comm *comm;          /* the NCCL rank of the last all_reduce: its deadline guards host waits */
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

/* The host waits for `ev`: under the NCCL rank's deadline once the backend
 * has a communicator (work on the stream may wait for a collective that
 * never ends), else plainly (nothing on the stream can wait forever). */
static int wait_event(cuda_be *c, cudaEvent_t ev, const char *what, st_err *err) {
    if (c->comm && !c->comm->failed) {
        if (comm_nccl_wait_event(c->comm, ev, what, err) == 0) return 0;
        return st_err_prefix(err, "cuda backend (device %d)", c->device);
    }
    return ck(c, cudaEventSynchronize(ev), what, err);
}

/* The host waits for everything queued on the stream so far. */
static int sync_stream(cuda_be *c, const char *what, st_err *err) {
    if (ck(c, cudaEventRecord(c->sync_ev, c->stream), what, err)) return -1;
    return wait_event(c, c->sync_ev, what, err);
}

/* After a launch: the launch error, then (STRATA_CUDA_SYNC=1) the execution error. */
static int launched(cuda_be *c, cudaError_t e, const char *what, st_err *err) {
    if (ck(c, e, what, err)) return -1;
    if (c->sync_each) return sync_stream(c, what, err);
    return 0;
}

/* ---- the metadata ring's events (meta_ring_ops) ---- */

static int ring_record(void *ctx, int seg, st_err *err) {
    cuda_be *c = ctx;
    return ck(c, cudaEventRecord(c->ring_ev[seg], c->stream), "metadata ring event", err);
}

static int ring_wait(void *ctx, int seg, st_err *err) {
    cuda_be *c = ctx;
    return wait_event(c, c->ring_ev[seg], "metadata ring wait", err);
}

static const meta_ring_ops k_ring_ops = {ring_record, ring_wait};

static void ring_free(cuda_be *c) {
    if (c->ring_host) cudaFreeHost(c->ring_host);
    if (c->ring_dev) cudaFree(c->ring_dev);
    c->ring_host = c->ring_dev = NULL;
}

/* (Re)makes the ring with segments of seg_bytes: pinned host + device memory.
 * At creation, and only again for an op whose metadata exceeds a segment. */
static int ring_make(cuda_be *c, size_t seg_bytes, st_err *err) {
    if (c->ring_host && sync_stream(c, "metadata ring", err)) return -1;
    ring_free(c);
    const size_t total = seg_bytes * RING_SEGS;
    if (ck(c, cudaHostAlloc((void **)&c->ring_host, total, cudaHostAllocPortable), "pinned metadata ring", err) ||
        ck(c, cudaMalloc((void **)&c->ring_dev, total), "device metadata ring", err)) {
        cudaGetLastError();
        ring_free(c);
        return -1;
    }
    for (size_t i = 0; i < sizeof c->mcache / sizeof c->mcache[0]; i++) c->mcache[i] = (struct meta_cached){.ref.at = -1};
    return meta_ring_init(&c->ring, seg_bytes, RING_SEGS, &k_ring_ops, c, err);
}

/* `total` bytes of the ring for one op: *host to fill, *dev for the kernel,
 * *at their offset; then ring_send copies them. */
static int ring_take(cuda_be *c, size_t total, char **host, char **dev, int64_t *at_out, st_err *err) {
    if (meta_ring_aligned(total) > c->ring.seg_bytes) {
        size_t seg = meta_ring_seg_bytes_for(2 * total);
        ST_WARN("cuda backend (device %d): op metadata of %zu bytes exceeds the %zu-byte ring segments; "
                "growing the ring to %d x %zu bytes (a one-time allocation inside a forward)",
                c->device, total, c->ring.seg_bytes, RING_SEGS, seg);
        if (ring_make(c, seg, err)) return -1;
    }
    int64_t at = meta_ring_take(&c->ring, total, err);
    if (at < 0) return -1;
    *host = c->ring_host + at;
    *dev = c->ring_dev + at;
    *at_out = at;
    return 0;
}

static int ring_send(cuda_be *c, char *dev, const char *host, size_t bytes, st_err *err) {
    return ck(c, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, c->stream), "metadata upload", err);
}

/* Copies n (<= 3) host arrays through the ring (one pinned, stream-ordered
 * copy for all, so the host arrays may be reused once this returns) and sets
 * *dst[i] (NULL for an empty part). When they equal, byte for byte, the last
 * upload of the same kind and that is still in the ring (meta_ring_still_has),
 * its device bytes are used again and nothing is copied. */
enum meta_kind { MK_ROPE, MK_SLOTS, MK_ATTN, MK_IDS, MK_ROWS };

typedef struct meta_part {
    const void *src;
    size_t bytes;
    void **dst;
} meta_part;

static size_t part_bytes(const meta_part *p) { return p->src ? p->bytes : 0; }

static int meta_upload(cuda_be *c, enum meta_kind kind, meta_part *parts, int n, st_err *err) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += part_bytes(&parts[i]) ? meta_ring_aligned(parts[i].bytes) : 0;
    struct meta_cached *mc = &c->mcache[kind];
    if (total && mc->n == n && mc->ref.bytes == total && meta_ring_still_has(&c->ring, &mc->ref)) {
        bool same = true;
        size_t off = 0;
        for (int i = 0; i < n && same; i++) {
            const size_t b = part_bytes(&parts[i]);
            same = mc->bytes[i] == b && (!b || memcmp(c->ring_host + mc->ref.at + off, parts[i].src, b) == 0);
            off += b ? meta_ring_aligned(b) : 0;
        }
        if (same) {
            off = 0;
            for (int i = 0; i < n; i++) {
                const size_t b = part_bytes(&parts[i]);
                *parts[i].dst = b ? c->ring_dev + mc->ref.at + off : NULL;
                off += b ? meta_ring_aligned(b) : 0;
            }
            c->meta_reused++;
            return 0;
        }
    }
    char *h, *d;
    int64_t at;
    if (ring_take(c, total, &h, &d, &at, err)) return -1;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const size_t b = part_bytes(&parts[i]);
        *parts[i].dst = NULL;
        mc->bytes[i] = b;
        if (!b) continue;
        memcpy(h + off, parts[i].src, b);
        *parts[i].dst = d + off;
        off += meta_ring_aligned(b);
    }
    mc->n = n;
    mc->ref = meta_ring_ref_of(&c->ring, at, total);
    c->meta_copies++;
    return off ? ring_send(c, d, h, off, err) : 0;
}

/* ---------------------------------------------------------------- memory */

static void cuda_destroy(backend *b) {
    cuda_be *c = CB(b);
    cudaSetDevice(c->device);
    /* Not under the comm's deadline: the group may be gone already. A
     * collective that was aborted has returned, so this does not hang. */
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (size_t i = 0; i < c->n_bufs; i++) cudaFree(c->bufs[i].p);
    if (c->scratch) cudaFree(c->scratch);
    ring_free(c);
    for (int i = 0; i < META_RING_MAX_SEGS; i++)
        if (c->ring_ev[i]) cudaEventDestroy(c->ring_ev[i]);
    if (c->sync_ev) cudaEventDestroy(c->sync_ev);
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    cudaGetLastError();
    free(c->bufs);
    free(c->hstage);
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
        sync_stream(c, "upload", err))
        return -1;
    return 0;
}

static int cuda_download(backend *b, void *dst, const void *src, size_t bytes, st_err *err) {
    cuda_be *c = CB(b);
    if (!bytes) return 0;
    if (!dst || !src) return st_errf(err, "cuda backend: download with a NULL buffer");
    if (use(c, err) ||
        ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download", err) ||
        sync_stream(c, "download", err))
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
        sync_stream(c, "weight upload", err)) {
        cudaFree(p);
        return -1;
    }
    /* The prefill GEMM's tile of dequantized rows for this weight: sized now,
     * at load, so that no forward allocates (see cuda_matmul). */
    if (type != GGML_TYPE_F32) {
        int64_t chunk = (int64_t)(TILE_ELEMS / (size_t)cols);
        if (chunk < 1) chunk = 1;
        if (chunk > rows) chunk = rows;
        size_t need = (size_t)chunk * (size_t)cols * sizeof(float);
        if (need > c->scratch_n) {
            void *ns = NULL;
            if (ck(c, cudaMalloc(&ns, need), "gemm scratch", err)) {
                cudaFree(p);
                return -1;
            }
            if (c->scratch) cudaFree(c->scratch); /* load time: nothing queued reads it */
            c->scratch = ns;
            c->scratch_n = need;
        }
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
    /* The scratch was sized when a weight of this width was uploaded: a
     * forward never allocates. */
    if (c->scratch_n < (size_t)K * sizeof(float))
        return st_errf(err, "cuda backend (device %d): no GEMM scratch for a %lld-wide weight (not uploaded "
                       "through this backend?)", c->device, (long long)K);
    if (c->half_gemm && (w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16)) {
        const int bf = w->type == GGML_TYPE_BF16;
        const float one = 1.0f, zero = 0.0f;
        const cudaDataType_t ht = bf ? CUDA_R_16BF : CUDA_R_16F;
        /* Activation rows converted to half in chunks that fit the scratch. */
        int64_t tc = (int64_t)(c->scratch_n / ((size_t)K * 2));
        for (int64_t t0 = 0; t0 < T; t0 += tc) {
            const int64_t nt = T - t0 < tc ? T - t0 : tc;
            if (launched(c, cuk_f32_to_half(c->scratch, x + t0 * K, nt * K, bf, c->stream), "convert kernel", err) ||
                ckb(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)nt, (int)K, &one, w->data, ht,
                                    (int)K, c->scratch, ht, (int)K, &zero, y + t0 * N, CUDA_R_32F, (int)N,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx", err))
                return -1;
        }
        return launched(c, cudaSuccess, "gemmex", err);
    }
    /* Dequantize tiles of weight rows to f32, one SGEMM per tile. */
    int64_t chunk = (int64_t)(c->scratch_n / ((size_t)K * sizeof(float)));
    if (chunk > N) chunk = N;
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
    if (meta_upload(c, MK_ROPE, parts, 2, err)) return -1;
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
    if (meta_upload(c, MK_SLOTS, parts, 1, err)) return -1;
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
    if (use(c, err)) return -1;
    /* Host staging (the same every layer of a forward: uploaded once, then
     * re-used by meta_upload): row_npos[n_rows], row_btoff[n_rows], bt[n_bt]. */
    const size_t need = (size_t)(2 * n_rows + n_bt);
    if (need > c->hstage_n) {
        int32_t *h = realloc(c->hstage, need * sizeof *h);
        if (!h) return st_errf(err, "cuda backend: out of host memory");
        c->hstage = h;
        c->hstage_n = need;
    }
    int32_t *npos = c->hstage, *btoff = npos + n_rows, *bt = npos + 2 * n_rows;
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
    void *dmeta;
    meta_part parts[] = {{npos, need * sizeof(int32_t), &dmeta}};
    if (meta_upload(c, MK_ATTN, parts, 1, err)) return -1;
    const int32_t *dnpos = dmeta, *dbtoff = dnpos + n_rows, *dbt = dnpos + 2 * n_rows;
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
    if (meta_upload(c, MK_IDS, parts, 1, err)) return -1;
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
    if (meta_upload(c, MK_ROWS, parts, 1, err)) return -1;
    return launched(c, cuk_get_rows(dst, src, drows, n_rows, n, c->stream), "get_rows kernel", err);
}

static int cuda_all_reduce(backend *b, comm *cm, float *buf, size_t count, st_err *err) {
    cuda_be *c = CB(b);
    if (!cm) return st_errf(err, "cuda backend: all_reduce without a comm");
    if (!comm_is_nccl(cm) || comm_nccl_device(cm) != c->device)
        return st_errf(err, "cuda backend (device %d): all_reduce needs an NCCL comm on this device", c->device);
    if (use(c, err)) return -1;
    /* No host wait: the NCCL stream waits for what produced buf, and this
     * stream for the all-reduce (events). The comm's deadline then guards
     * every host wait of this backend. */
    c->comm = cm;
    if (comm_nccl_all_reduce_on(cm, buf, count, COMM_F32, c->stream, err))
        return st_err_prefix(err, "cuda backend (device %d)", c->device);
    return c->sync_each ? sync_stream(c, "all_reduce", err) : 0;
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
        ckb(c, cublasSetStream(c->blas, c->stream), "cublasSetStream", err) ||
        ck(c, cudaEventCreateWithFlags(&c->sync_ev, cudaEventDisableTiming), "cudaEventCreate", err)) {
        cuda_destroy(&c->base);
        return NULL;
    }
    for (int i = 0; i < RING_SEGS; i++)
        if (ck(c, cudaEventCreateWithFlags(&c->ring_ev[i], cudaEventDisableTiming), "cudaEventCreate", err)) {
            cuda_destroy(&c->base);
            return NULL;
        }
    if (ring_make(c, RING_SEG_BYTES, err)) {
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

int backend_cuda_meta_stats(const backend *b, unsigned long long *copies, unsigned long long *reused) {
    if (!b || b->ops != &cuda_ops) return -1;
    const cuda_be *c = b->impl;
    if (copies) *copies = c->meta_copies;
    if (reused) *reused = c->meta_reused;
    return 0;
}

size_t backend_cuda_scratch_bytes(const backend *b) {
    if (!b || b->ops != &cuda_ops) return 0;
    const cuda_be *c = b->impl;
    return c->scratch_n + (c->ring_dev ? c->ring.seg_bytes * RING_SEGS : 0);
}
