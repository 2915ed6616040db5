/* backend.h — the compute-backend interface: one instance is one TP rank on
 * one device (like ggml's ggml_backend_i). The engine (engine/stage.c) runs the
 * Llama forward pass only through these ops, so the CPU backend
 * (compute/cpu/backend_cpu.c) and a CUDA backend are interchangeable.
 *
 * Memory: "device pointers" (float *, void *) come from ops->alloc and live on
 * the backend's device; for the CPU backend they are ordinary host memory.
 * Small per-token metadata (token ids, positions, slots, block tables) is
 * passed in HOST memory; a device backend copies it as it needs.
 * Shapes are row-major: x[T, n] is T rows (tokens) of n floats.
 * Activations are f32. Weights keep their GGUF dtype (F32, F16, BF16, Q8_0, Q4_0).
 *
 * Formulas follow llama.cpp (ggml.c, llama.cpp @ c392e50), which the golden
 * references come from:
 *   rmsnorm   y = x / sqrt(mean(x^2) + eps) * w                (Zhang & Sennrich 2019)
 *   rope      "normal" mode (GGML_ROPE_TYPE_NORM; GGUF llama Q/K rows are
 *             permuted for it): for each head, pairs (x[2i], x[2i+1]), i < n_rot/2,
 *             rotate by angle pos * base^(-2i/n_rot) / ff[i] (ff = rope_freqs
 *             factors, 1 when NULL); dims >= n_rot are unchanged. (Su et al. 2021)
 *   attention softmax(q·k^T * scale) · v, causal, softmax in f32 with the max
 *             subtracted; F32 or F16 KV cache (see kv_store);
 *             query head h uses KV head h / (n_head / n_head_kv)  (GQA, Ainslie 2023)
 *   swiglu    out = silu(gate) * up, silu(x) = x / (1 + exp(-x)) (Shazeer 2020)
 * Every op returns 0, or -1 with err (bad arguments, device failure).
 */
#ifndef STRATA_COMPUTE_BACKEND_H
#define STRATA_COMPUTE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "compute/comm.h"

typedef struct backend backend;

/* A weight matrix resident on the device: `rows` rows of `cols` elements of
 * `type` (GGUF layout: ne = [cols, rows]); nbytes = rows * ggml_row_bytes(type, cols).
 * 1-D weights (norms) have rows = 1. */
typedef struct backend_weight {
    void *data;
    uint32_t type; /* enum ggml_type */
    int64_t rows, cols;
    size_t nbytes;
} backend_weight;

/* One sequence's part of a batch, for attention. Its n_tokens query rows are
 * rows [tok0, tok0 + n_tokens) of the batch; they sit at positions
 * [pos0, pos0 + n_tokens), and attend causally to positions [0, pos0 + i],
 * whose K/V are in the cache at block_table[p / block_size], slot p % block_size.
 * block_table is host memory with at least ceil((pos0 + n_tokens) / block_size) ids. */
typedef struct backend_attn_seq {
    int32_t tok0, n_tokens, pos0;
    const int32_t *block_table;
    int32_t n_blocks;
} backend_attn_seq;

typedef struct backend_attn {
    int n_head;     /* query heads in q/out (local to this rank) */
    int n_head_kv;  /* KV heads in the cache (local) */
    int head_dim;
    int block_size; /* tokens per KV block */
    int n_cache_blocks; /* blocks in the cache (block ids must be < this) */
    uint32_t kv_type;   /* cache element type: GGML_TYPE_F32 or GGML_TYPE_F16 */
    float scale;    /* 1/sqrt(head_dim) */
    int n_seqs;
    const backend_attn_seq *seqs;
} backend_attn;

typedef struct backend_ops {
    const char *name; /* "cpu", "cuda" */
    void (*destroy)(backend *b);

    /* Device memory for activations and the KV cache (counted in buf_bytes). */
    void *(*alloc)(backend *b, size_t bytes, st_err *err);
    void (*release)(backend *b, void *p);
    int (*upload)(backend *b, void *dst, const void *src_host, size_t bytes, st_err *err);
    int (*download)(backend *b, void *dst_host, const void *src, size_t bytes, st_err *err);
    /* dst[bytes] <- src[bytes], both device memory. */
    int (*copy)(backend *b, void *dst, const void *src, size_t bytes, st_err *err);

    /* Weights: allocates w->data, copies rows*row_bytes from host `src`, and adds
     * nbytes to the backend's resident weight bytes. weight_free undoes it. */
    int (*weight_upload)(backend *b, backend_weight *w, uint32_t type, int64_t rows, int64_t cols,
                         const void *src_host, st_err *err);
    void (*weight_free)(backend *b, backend_weight *w);
    size_t (*weight_bytes)(const backend *b); /* resident weight bytes */
    size_t (*buf_bytes)(const backend *b);    /* live alloc() bytes */

    /* y[T, w.rows] = x[T, w.cols] · W^T. */
    int (*matmul)(backend *b, float *y, const float *x, const backend_weight *w, int64_t T,
                  st_err *err);
    /* y[T, n] = rmsnorm(x[T, n]) * w[n] (w F32, or F16/BF16); y may equal x. */
    int (*rmsnorm)(backend *b, float *y, const float *x, const backend_weight *w, int64_t T,
                   int64_t n, float eps, st_err *err);
    /* In place on x[T, n_head * head_dim]; pos[T] host; freq_factors[n_rot/2] host or NULL. */
    int (*rope)(backend *b, float *x, int64_t T, int n_head, int head_dim, int n_rot,
                const int32_t *pos, float base, const float *freq_factors, st_err *err);
    /* KV cache: kcache/vcache are [n_slots, kv_dim] elements of kv_type, F32 or
     * F16 (IEEE half; llama.cpp's default cache type, half the memory).
     * kv_store writes k[T, kv_dim], v[T, kv_dim] (f32; rounded for F16) into
     * row slots[t] (host; slot = block * block_size + offset). */
    int (*kv_store)(backend *b, void *kcache, void *vcache, uint32_t kv_type, const float *k,
                    const float *v, int64_t T, int64_t kv_dim, const int32_t *slots,
                    int64_t n_slots, st_err *err);
    /* out[T, n_head * head_dim] = attention of q[T, n_head * head_dim] over the
     * cache (a->kv_type). With F16, as ggml's non-flash path, q and the
     * softmax weights are rounded to f16 before their products with K and V. */
    int (*attention)(backend *b, float *out, const float *q, const void *kcache,
                     const void *vcache, const backend_attn *a, st_err *err);
    /* out[n] = silu(gate[n]) * up[n]; out may alias gate. */
    int (*swiglu)(backend *b, float *out, const float *gate, const float *up, int64_t n,
                  st_err *err);
    /* y[n] += x[n]. */
    int (*add)(backend *b, float *y, const float *x, int64_t n, st_err *err);
    /* Vocabulary-parallel lookup: out[T, cols] row t = dequantized row
     * (ids[t] - row0) of table when row0 <= ids[t] < row0 + table.rows, else 0.
     * ids host. Ids outside [0, n_vocab) must be rejected by the caller. */
    int (*embed)(backend *b, float *out, const backend_weight *table, const int32_t *ids,
                 int64_t T, int64_t row0, st_err *err);
    /* dst[n_rows, n] row i = src row rows[i] (rows host). */
    int (*get_rows)(backend *b, float *dst, const float *src, const int32_t *rows, int64_t n_rows,
                    int64_t n, st_err *err);
    /* buf[count] (device) <- sum over the TP group through c. */
    int (*all_reduce)(backend *b, comm *c, float *buf, size_t count, st_err *err);
} backend_ops;

struct backend {
    const backend_ops *ops;
    void *impl;
};

/* Convenience wrappers. */
static inline size_t backend_weight_bytes(const backend *b) { return b->ops->weight_bytes(b); }
static inline void backend_free(backend *b) {
    if (b) b->ops->destroy(b);
}

/* ---- CPU backend (compute/cpu/backend_cpu.c): cpu_matmul + compute/cpu/ops.c
 * kernels on its own st_pool of n_threads threads (counting the caller: the
 * rank thread). ---- */
backend *backend_cpu_new(int n_threads, st_err *err);

#endif
