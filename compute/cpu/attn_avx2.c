/* attn_avx2.c — AVX2 (+F16C) versions of ops_attend_head_f32/_f16 (ops.h),
 * compiled with those -m flags and -ffp-contract=off; only called when the
 * CPU has them (ops.c dispatches).
 *
 * Bit-exact with the scalar kernels in ops.c: every output is the same
 * sequence of separately rounded f32 multiplies and adds, in the same order.
 *  - Scores: 8 positions at a time (within one KV block), one lane each; the
 *    lane accumulates q[i] * k[i] over i = 0.. in order (K gathered, stride
 *    kv_stride). An F16 cache is first widened (exactly) into a small f32 tile.
 *  - Softmax: expf 8 lanes at a time (vexpf_avx2.h, bit-identical to
 *    libm's), the double sum scalar and in order.
 *  - Weighted V sum: 8 head dims at a time, positions in order.
 * Tails (fewer than 8 positions or dims) run the scalar expressions.
 */
#include <immintrin.h>
#include <math.h>

#include "common/dtype.h"
#include "compute/cpu/ops.h"
#include "compute/cpu/vexpf_avx2.h"

#define AI static inline __attribute__((always_inline))

AI float hsum_max(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* s[p] = scale * q·K[p] for one block's positions [0, nb) at kb (row stride
 * kv_stride floats); returns their max folded into *mx (as the scalar loop). */
AI void scores_block(float *s, const float *q, const float *kb, int64_t kv_stride, int head_dim,
                     int32_t nb, float scale, __m256 *vmx, float *mx) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32((int)kv_stride));
    const __m256 vscale = _mm256_set1_ps(scale);
    int32_t j = 0;
    for (; j + 8 <= nb; j += 8) {
        const float *kj = kb + (int64_t)j * kv_stride;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < head_dim; i++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(q[i]),
                                                   _mm256_i32gather_ps(kj + i, idx, 4)));
        __m256 sc = _mm256_mul_ps(acc, vscale);
        _mm256_storeu_ps(s + j, sc);
        *vmx = _mm256_max_ps(sc, *vmx); /* a NaN score is never the max, as in the scalar loop */
    }
    for (; j < nb; j++) {
        const float *k = kb + (int64_t)j * kv_stride;
        float d = 0.0f;
        for (int i = 0; i < head_dim; i++) d += q[i] * k[i];
        s[j] = d * scale;
        if (s[j] > *mx) *mx = s[j];
    }
}

/* exp and normalization, as ops.c: returns 1 / sum. */
AI float softmax_exp(float *s, int32_t n_pos, float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    int32_t p = 0;
    for (; p + 8 <= n_pos; p += 8) _mm256_storeu_ps(s + p, st_vexpf8(_mm256_sub_ps(_mm256_loadu_ps(s + p), vmx)));
    for (; p < n_pos; p++) s[p] = expf(s[p] - mx);
    double sum = 0.0;
    for (p = 0; p < n_pos; p++) sum += (double)s[p];
    return (float)(1.0 / sum);
}

void ops_attend_head_f32_avx2(float *out, const float *q, const float *kcache, const float *vcache,
                              const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                              int head_dim, int32_t n_pos, float scale, float *s) {
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    float mx = -INFINITY;
    for (int32_t p0 = 0, b = 0; p0 < n_pos; p0 += bs, b++) {
        const int32_t nb = n_pos - p0 < bs ? n_pos - p0 : bs;
        const float *kb = kcache + (int64_t)block_table[b] * bs * kv_stride + kv_off;
        scores_block(s + p0, q, kb, kv_stride, head_dim, nb, scale, &vmx, &mx);
    }
    const float vm = hsum_max(vmx);
    if (vm > mx) mx = vm;
    const float inv = softmax_exp(s, n_pos, mx);
    int i0 = 0;
    for (; i0 + 8 <= head_dim; i0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int32_t p0 = 0, b = 0; p0 < n_pos; p0 += bs, b++) {
            const int32_t nb = n_pos - p0 < bs ? n_pos - p0 : bs;
            const float *vb = vcache + (int64_t)block_table[b] * bs * kv_stride + kv_off + i0;
            for (int32_t j = 0; j < nb; j++) {
                const __m256 w = _mm256_set1_ps(s[p0 + j] * inv);
                acc = _mm256_add_ps(acc, _mm256_mul_ps(w, _mm256_loadu_ps(vb + (int64_t)j * kv_stride)));
            }
        }
        _mm256_storeu_ps(out + i0, acc);
    }
    for (int i = i0; i < head_dim; i++) out[i] = 0.0f;
    if (i0 < head_dim)
        for (int32_t p = 0; p < n_pos; p++) {
            const float *v = vcache + ((int64_t)block_table[p / bs] * bs + p % bs) * kv_stride + kv_off;
            const float w = s[p] * inv;
            for (int i = i0; i < head_dim; i++) out[i] += w * v[i];
        }
}

/* Widens up to 8 positions' K rows (head_dim F16 values each, row stride
 * kv_stride) into tile[l * head_dim + i] (exact). */
AI void widen_rows(float *tile, const uint16_t *kj, int64_t kv_stride, int head_dim, int n) {
    for (int l = 0; l < n; l++) {
        const uint16_t *k = kj + (int64_t)l * kv_stride;
        float *t = tile + l * head_dim;
        int i = 0;
        for (; i + 8 <= head_dim; i += 8)
            _mm256_storeu_ps(t + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))));
        for (; i < head_dim; i++) t[i] = st_fp16_to_f32(k[i]);
    }
}

void ops_attend_head_f16_avx2(float *out, const float *q, const uint16_t *kcache, const uint16_t *vcache,
                              const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                              int head_dim, int32_t n_pos, float scale, float *s) {
    float *qh = s + n_pos; /* q rounded to f16 (see ops.c) */
    for (int i = 0; i < head_dim; i++) qh[i] = st_fp16_to_f32(st_f32_to_fp16(q[i]));
    float tile[8 * OPS_ATTN_SIMD_MAX_HEAD_DIM];
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32(head_dim));
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 vmx = _mm256_set1_ps(-INFINITY);
    float mx = -INFINITY;
    for (int32_t p0 = 0, b = 0; p0 < n_pos; p0 += bs, b++) {
        const int32_t nb = n_pos - p0 < bs ? n_pos - p0 : bs;
        const uint16_t *kb = kcache + (int64_t)block_table[b] * bs * kv_stride + kv_off;
        for (int32_t j = 0; j < nb; j += 8) {
            const int n = nb - j < 8 ? nb - j : 8;
            widen_rows(tile, kb + (int64_t)j * kv_stride, kv_stride, head_dim, n);
            float *sj = s + p0 + j;
            if (n == 8) {
                __m256 acc = _mm256_setzero_ps();
                for (int i = 0; i < head_dim; i++)
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(qh[i]),
                                                           _mm256_i32gather_ps(tile + i, idx, 4)));
                __m256 sc = _mm256_mul_ps(acc, vscale);
                _mm256_storeu_ps(sj, sc);
                vmx = _mm256_max_ps(sc, vmx);
            } else {
                for (int l = 0; l < n; l++) {
                    float d = 0.0f;
                    for (int i = 0; i < head_dim; i++) d += qh[i] * tile[l * head_dim + i];
                    sj[l] = d * scale;
                    if (sj[l] > mx) mx = sj[l];
                }
            }
        }
    }
    const float vm = hsum_max(vmx);
    if (vm > mx) mx = vm;
    const float inv = softmax_exp(s, n_pos, mx);
    /* the softmax weights rounded to f16, as ops.c (s is free to reuse) */
    for (int32_t p = 0; p < n_pos; p++) s[p] = st_fp16_to_f32(st_f32_to_fp16(s[p] * inv));
    int i0 = 0;
    for (; i0 + 8 <= head_dim; i0 += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int32_t p0 = 0, b = 0; p0 < n_pos; p0 += bs, b++) {
            const int32_t nb = n_pos - p0 < bs ? n_pos - p0 : bs;
            const uint16_t *vb = vcache + (int64_t)block_table[b] * bs * kv_stride + kv_off + i0;
            for (int32_t j = 0; j < nb; j++) {
                const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vb + (int64_t)j * kv_stride)));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(s[p0 + j]), v));
            }
        }
        _mm256_storeu_ps(out + i0, acc);
    }
    for (int i = i0; i < head_dim; i++) out[i] = 0.0f;
    if (i0 < head_dim)
        for (int32_t p = 0; p < n_pos; p++) {
            const uint16_t *v = vcache + ((int64_t)block_table[p / bs] * bs + p % bs) * kv_stride + kv_off;
            for (int i = i0; i < head_dim; i++) out[i] += s[p] * st_fp16_to_f32(v[i]);
        }
}

/* out[i] = (g / (1 + expf(-g))) * up[i], as ops_swiglu_scalar (same roundings). */
void ops_swiglu_avx2(float *out, const float *gate, const float *up, int64_t i0, int64_t i1) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = st_vexpf8(_mm256_xor_ps(g, sign));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    if (i < i1) ops_swiglu_scalar(out, gate, up, i, i1);
}

/* y[i] = expf(x[i]) (bit-identical to libm's; for tests and benches). */
void ops_expf_avx2(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, st_vexpf8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = expf(x[i]);
}
