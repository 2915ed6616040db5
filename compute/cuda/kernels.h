/* kernels.h — internal to compute/cuda: C launchers for the device kernels of
 * kernels.cu, called by backend_cuda.c. Each enqueues one kernel on `st` and
 * returns cudaGetLastError() (launch errors only; execution errors surface at
 * the next synchronizing call). All pointers are device pointers. Shapes and
 * formulas are those of compute/backend.h; the host side validates arguments
 * before calling (sizes > 0, types supported, ids in range).
 */
#ifndef STRATA_COMPUTE_CUDA_KERNELS_H
#define STRATA_COMPUTE_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim the attention kernel takes. */
#define CUK_ATT_MAX_HD 256
/* Largest T the dequantizing matvec takes (per weight read). */
#define CUK_MATVEC_MAX_T 8

/* y[T, N] = x[T, K] · W^T for a non-F32 weight (F16, BF16, Q8_0, Q4_0) of
 * row stride rb bytes, T <= CUK_MATVEC_MAX_T: one warp per weight row. */
cudaError_t cuk_matvec(float *y, const float *x, const void *w, uint32_t wtype, size_t rb,
                       int64_t T, int64_t K, int64_t N, cudaStream_t st);
/* dst[rows, K] (f32) = rows [0, rows) of W (any loadable type) starting at w. */
cudaError_t cuk_dequant_rows(float *dst, const void *w, uint32_t wtype, size_t rb, int64_t rows,
                             int64_t K, cudaStream_t st);
/* dst[n] = x[n] rounded to f16 (to_bf16 = 0) or bf16 (to_bf16 = 1), as uint16 bits. */
cudaError_t cuk_f32_to_half(uint16_t *dst, const float *x, int64_t n, int to_bf16, cudaStream_t st);

/* y[T, n] = x / sqrt(mean(x^2) + eps) * w; w of wtype F32, F16 or BF16. */
cudaError_t cuk_rmsnorm(float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                        int64_t n, float eps, cudaStream_t st);
/* RoPE normal mode in place; pos[T]; ff[n_rot/2] or NULL; theta_scale = base^(-2/n_rot). */
cudaError_t cuk_rope(float *x, int64_t T, int n_head, int head_dim, int n_rot, const int32_t *pos,
                     float theta_scale, const float *ff, cudaStream_t st);
/* Cache rows slots[t] <- k[t], v[t] (f32, or rounded to f16 when f16). */
cudaError_t cuk_kv_store(void *kc, void *vc, int f16, const float *k, const float *v, int64_t T,
                         int64_t kv_dim, const int32_t *slots, cudaStream_t st);
/* Paged attention, one block per (row, head). Row r attends to positions
 * [0, row_npos[r]) whose blocks are bt[row_btoff[r] + p / bs]. */
cudaError_t cuk_attention(float *out, const float *q, const void *kc, const void *vc, int f16,
                          const int32_t *row_npos, const int32_t *row_btoff, const int32_t *bt,
                          int64_t n_rows, int n_head, int n_head_kv, int head_dim, int bs,
                          float scale, cudaStream_t st);
/* out[n] = silu(gate) * up (out may alias gate). */
cudaError_t cuk_swiglu(float *out, const float *gate, const float *up, int64_t n, cudaStream_t st);
/* y[n] += x[n]. */
cudaError_t cuk_add(float *y, const float *x, int64_t n, cudaStream_t st);
/* out[T, cols] row t = row (ids[t] - row0) of the table, or zeros. */
cudaError_t cuk_embed(float *out, const void *table, uint32_t ttype, size_t rb, int64_t n_rows,
                      int64_t cols, const int32_t *ids, int64_t T, int64_t row0, cudaStream_t st);
/* dst[n_rows, n] row i = src row rows[i] (dst and src must not overlap). */
cudaError_t cuk_get_rows(float *dst, const float *src, const int32_t *rows, int64_t n_rows,
                         int64_t n, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
