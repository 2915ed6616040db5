/* ops.h — the CPU kernels behind the CPU backend (compute/cpu/backend_cpu.c),
 * other than matmul: each works on a range of rows so that the backend can
 * split it over its thread pool. Formulas and sources: compute/backend.h.
 * Internal to compute/cpu. */
#ifndef STRATA_COMPUTE_CPU_OPS_H
#define STRATA_COMPUTE_CPU_OPS_H

#include <stdint.h>

/* Rows [r0, r1) of y[., n] = x / sqrt(mean(x^2) + eps) * w[n] (sum in double, as ggml). */
void ops_rmsnorm_rows(float *y, const float *x, const float *w, int64_t n, float eps, int64_t r0,
                      int64_t r1);

/* RoPE normal mode on rows [r0, r1) of x[., n_head * head_dim], row t at
 * position pos[t]; n_rot <= OPS_ROPE_MAX_DIM. */
#define OPS_ROPE_MAX_DIM 1024
void ops_rope_rows(float *x, int n_head, int head_dim, int n_rot, const int32_t *pos, float base,
                   const float *freq_factors, int64_t r0, int64_t r1);

/* One query head of one token: out[head_dim] = softmax(q·K^T * scale) V over
 * positions [0, n_pos) of a paged cache. K row of position p:
 * kcache + (block_table[p / bs] * bs + p % bs) * kv_stride + kv_off (elements).
 * _f32: an f32 cache. _f16: an F16 cache, as ggml's non-flash path computes
 * it (q and the softmax weights rounded to f16 before the products).
 * scratch holds n_pos + head_dim floats. */
void ops_attend_head_f32(float *out, const float *q, const float *kcache, const float *vcache,
                         const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                         int head_dim, int32_t n_pos, float scale, float *scratch);
void ops_attend_head_f16(float *out, const float *q, const uint16_t *kcache, const uint16_t *vcache,
                         const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                         int head_dim, int32_t n_pos, float scale, float *scratch);

/* The same kernels at one SIMD level each. ops_attend_head_f32/_f16 above
 * pick one at run time (the level cpu_simd_level() reports; scalar when
 * head_dim > OPS_ATTN_SIMD_MAX_HEAD_DIM or kv_stride > 2^24). All levels give
 * bit-identical results: the SIMD ones vectorize across positions (scores)
 * and head dims (V sum) but keep each output's f32 multiply/add sequence and
 * libm's expf. _avx2 needs AVX2+FMA+F16C, _avx512 AVX-512 F+BW+VL; call them
 * only on such a CPU. */
#define OPS_ATTN_SIMD_MAX_HEAD_DIM 256
#define OPS_ATTN_DECL(name, T)                                                                    \
    void name(float *out, const float *q, const T *kcache, const T *vcache,                       \
              const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off, int head_dim, \
              int32_t n_pos, float scale, float *scratch)
OPS_ATTN_DECL(ops_attend_head_f32_scalar, float);
OPS_ATTN_DECL(ops_attend_head_f32_avx2, float);
OPS_ATTN_DECL(ops_attend_head_f32_avx512, float);
OPS_ATTN_DECL(ops_attend_head_f16_scalar, uint16_t);
OPS_ATTN_DECL(ops_attend_head_f16_avx2, uint16_t);
OPS_ATTN_DECL(ops_attend_head_f16_avx512, uint16_t);

/* out[i] = silu(gate[i]) * up[i] for i in [i0, i1). Dispatches at run time
 * to ops_swiglu_avx2 / _avx512 (bit-identical: same roundings, libm-exact
 * expf). */
void ops_swiglu(float *out, const float *gate, const float *up, int64_t i0, int64_t i1);
void ops_swiglu_scalar(float *out, const float *gate, const float *up, int64_t i0, int64_t i1);
void ops_swiglu_avx2(float *out, const float *gate, const float *up, int64_t i0, int64_t i1);
void ops_swiglu_avx512(float *out, const float *gate, const float *up, int64_t i0, int64_t i1);
/* y[i] = expf(x[i]) for i < n, 8 or 16 lanes at a time, bit-identical to
 * glibc's expf (vexpf_avx2.h, vexpf_avx512.h). AVX2+FMA / AVX-512 F+BW+VL
 * only. */
void ops_expf_avx2(float *y, const float *x, int64_t n);
void ops_expf_avx512(float *y, const float *x, int64_t n);

/* y[i] += x[i] for i in [i0, i1). */
void ops_add(float *y, const float *x, int64_t i0, int64_t i1);

#endif
