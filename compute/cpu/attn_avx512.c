/* attn_avx512.c — AVX-512 (F, with F16C) versions of ops_attend_head_f32/_f16
 * (ops.h), compiled with those -m flags and -ffp-contract=off; only called
 * when the CPU has them (ops.c dispatches).
 *
 * Bit-exact with the scalar kernels in ops.c, as attn_avx2.c (same scheme,
 * 16 lanes): scores 16 positions of a block at a time (one lane each, K
 * gathered, q[i] * k[i] summed over i in order); expf 16 lanes at a time
 * (vexpf_avx512.h, bit-identical to libm's), the double sum scalar; the
 * weighted V sum 16 head dims at a time (masked tails). Also SwiGLU with the
 * same expf (ops_swiglu_avx512).
 */
#include <immintrin.h>
#include <math.h>

#include "common/dtype.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/vexpf_avx512.h"

#define AI static inline __attribute__((always_inline))

AI __mmask16 tail_mask(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* s[p] = expf(s[p] - mx), 16 at a time (st_vexpf16 is bit-identical to
 * libm's expf); the double sum stays sequential, in order. */
AI float softmax_exp(float *s, int32_t n_pos, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx);
    for (int32_t p = 0; p < n_pos; p += 16) {
        const __mmask16 m = tail_mask(n_pos - p);
        _mm512_mask_storeu_ps(s + p, m, st_vexpf16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + p), vmx)));
    }
    double sum = 0.0;
    for (int32_t p = 0; p < n_pos; p++) sum += (double)s[p];
    return (float)(1.0 / sum);
}

void ops_attend_head_f32_avx512(float *out, const float *q, const float *kcache, const float *vcache,
                                const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                                int head_dim, int32_t n_pos, float scale, float *s) {
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)kv_stride));
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int32_t p0 = 0, b = 0; p0 < n_pos; p0 += bs, b++) {
        const int32_t nb = n_pos - p0 < bs ? n_pos - p0 : bs;
        const float *kb = kcache + (int64_t)block_table[b] * bs * kv_stride + kv_off;
        for (int32_t j = 0; j < nb; j += 16) {
            const __mmask16 m = tail_mask(nb - j);
            const float *kj = kb + (int64_t)j * kv_stride;
            __m512 acc = _mm512_setzero_ps();
            for (int i = 0; i < head_dim; i++)
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(q[i]),
                                                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx,
                                                                                kj + i, 4)));
            const __m512 sc = _mm512_mul_ps(acc, vscale);
            _mm512_mask_storeu_ps(s + p0 + j, m, sc);
            vmx = _mm512_mask_max_ps(vmx, m, sc, vmx); /* a NaN score is never the max */
        }
    }
    const float mx = _mm512_reduce_max_ps(vmx);
    const float inv = softmax_exp(s, n_pos, mx);
    for (int i0 = 0; i0 < head_dim; i0 += 16) {
        const __mmask16 m = tail_mask(head_dim - i0);
        __m512 acc = _mm512_setzero_ps();
        for (int32_t p0 = 0, b = 0; p0 < n_pos; p0 += bs, b++) {
            const int32_t nb = n_pos - p0 < bs ? n_pos - p0 : bs;
            const float *vb = vcache + (int64_t)block_table[b] * bs * kv_stride + kv_off + i0;
            for (int32_t j = 0; j < nb; j++) {
                const __m512 w = _mm512_set1_ps(s[p0 + j] * inv);
                acc = _mm512_add_ps(acc, _mm512_mul_ps(w, _mm512_maskz_loadu_ps(m, vb + (int64_t)j * kv_stride)));
            }
        }
        _mm512_mask_storeu_ps(out + i0, m, acc);
    }
}

void ops_attend_head_f16_avx512(float *out, const float *q, const uint16_t *kcache, const uint16_t *vcache,
                                const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                                int head_dim, int32_t n_pos, float scale, float *s) {
    float *qh = s + n_pos; /* q rounded to f16 (see ops.c) */
    for (int i = 0; i < head_dim; i++) qh[i] = st_fp16_to_f32(st_f32_to_fp16(q[i]));
    float tile[16 * OPS_ATTN_SIMD_MAX_HEAD_DIM]; /* 16 positions' K, widened to f32 */
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(head_dim));
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int32_t p0 = 0, b = 0; p0 < n_pos; p0 += bs, b++) {
        const int32_t nb = n_pos - p0 < bs ? n_pos - p0 : bs;
        const uint16_t *kb = kcache + (int64_t)block_table[b] * bs * kv_stride + kv_off;
        for (int32_t j = 0; j < nb; j += 16) {
            const int n = nb - j < 16 ? nb - j : 16;
            const __mmask16 m = tail_mask(n);
            for (int l = 0; l < n; l++) {
                const uint16_t *k = kb + (int64_t)(j + l) * kv_stride;
                for (int i = 0; i < head_dim; i += 16) {
                    const __mmask16 mi = tail_mask(head_dim - i);
                    _mm512_mask_storeu_ps(tile + l * head_dim + i, mi,
                                          _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mi, k + i)));
                }
            }
            __m512 acc = _mm512_setzero_ps();
            for (int i = 0; i < head_dim; i++)
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(qh[i]),
                                                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx,
                                                                                tile + i, 4)));
            const __m512 sc = _mm512_mul_ps(acc, vscale);
            _mm512_mask_storeu_ps(s + p0 + j, m, sc);
            vmx = _mm512_mask_max_ps(vmx, m, sc, vmx);
        }
    }
    const float mx = _mm512_reduce_max_ps(vmx);
    const float inv = softmax_exp(s, n_pos, mx);
    /* the softmax weights rounded to f16, as ops.c (s is free to reuse) */
    for (int32_t p = 0; p < n_pos; p++) s[p] = st_fp16_to_f32(st_f32_to_fp16(s[p] * inv));
    for (int i0 = 0; i0 < head_dim; i0 += 16) {
        const __mmask16 m = tail_mask(head_dim - i0);
        __m512 acc = _mm512_setzero_ps();
        for (int32_t p0 = 0, b = 0; p0 < n_pos; p0 += bs, b++) {
            const int32_t nb = n_pos - p0 < bs ? n_pos - p0 : bs;
            const uint16_t *vb = vcache + (int64_t)block_table[b] * bs * kv_stride + kv_off + i0;
            for (int32_t j = 0; j < nb; j++) {
                const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, vb + (int64_t)j * kv_stride));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(s[p0 + j]), v));
            }
        }
        _mm512_mask_storeu_ps(out + i0, m, acc);
    }
}

/* out[i] = (g / (1 + expf(-g))) * up[i], as ops_swiglu (same roundings). */
void ops_swiglu_avx512(float *out, const float *gate, const float *up, int64_t i0, int64_t i1) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = i0; i < i1; i += 16) {
        const __mmask16 m = tail_mask(i1 - i < 16 ? (int)(i1 - i) : 16);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        const __m512 ng = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN)));
        const __m512 e = st_vexpf16(ng);
        const __m512 y = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, up + i));
        _mm512_mask_storeu_ps(out + i, m, y);
    }
}

/* y[i] = expf(x[i]) (bit-identical to libm's; for tests and benches). */
void ops_expf_avx512(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i < 16 ? (int)(n - i) : 16);
        _mm512_mask_storeu_ps(y + i, m, st_vexpf16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}
