/* matmul_avx2.c — AVX2+FMA+F16C kernels for cpu_matmul (compiled with
 * -mavx2 -mfma -mf16c; only called when the CPU has them). Matvec: each weight
 * row is converted 8 lanes at a time (F16 via vcvtph2ps, BF16 by a 16-bit
 * shift, Q8_0/Q4_0 by integer widening and one scale per 32-block) and dotted
 * with up to 4 token rows while it is in registers. Prefill uses OpenBLAS on
 * tiles converted by av2_to_f32 (see matmul.c). */
#include <immintrin.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cpu/simd.h"

#define AI static inline __attribute__((always_inline))

AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AI __m256 load_f32(const uint8_t *r, int64_t k) { return _mm256_loadu_ps((const float *)r + k); }
AI __m256 load_f16(const uint8_t *r, int64_t k) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 2 * k)));
}
AI __m256 load_bf16(const uint8_t *r, int64_t k) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(r + 2 * k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
AI float sc_f32(const uint8_t *r, int64_t k) {
    float f;
    memcpy(&f, r + 4 * k, 4);
    return f;
}
AI float sc_f16(const uint8_t *r, int64_t k) { return ld_f16(r + 2 * k); }
AI float sc_bf16(const uint8_t *r, int64_t k) {
    uint16_t h;
    memcpy(&h, r + 2 * k, 2);
    return st_bf16_to_f32(h);
}

/* Software prefetch distance (see matmul_avx512.c). */
#define PF_DIST 2048
typedef float f32_elem;
typedef uint16_t f16_elem;
typedef uint16_t bf16_elem;

/* Dense types: one row × NT token rows, two accumulators per token. */
#define DEF_DENSE(TY)                                                                          \
    AI void dot_##TY(const uint8_t *wr, const float *x, int64_t K, const int NT, float *out) { \
        __m256 a0[4], a1[4];                                                                   \
        for (int t = 0; t < NT; t++) a0[t] = a1[t] = _mm256_setzero_ps();                     \
        int64_t k = 0;                                                                         \
        for (; k + 16 <= K; k += 16) {                                                         \
            _mm_prefetch((const char *)wr + k * (int64_t)sizeof(TY##_elem) + PF_DIST, _MM_HINT_T0); \
            __m256 w0 = load_##TY(wr, k), w1 = load_##TY(wr, k + 8);                           \
            for (int t = 0; t < NT; t++) {                                                     \
                a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * K + k), a0[t]);            \
                a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * K + k + 8), a1[t]);        \
            }                                                                                  \
        }                                                                                      \
        for (; k + 8 <= K; k += 8) {                                                           \
            __m256 w0 = load_##TY(wr, k);                                                      \
            for (int t = 0; t < NT; t++)                                                       \
                a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * K + k), a0[t]);            \
        }                                                                                      \
        for (int t = 0; t < NT; t++) {                                                         \
            float s = hsum8(_mm256_add_ps(a0[t], a1[t]));                                      \
            for (int64_t j = k; j < K; j++) s += sc_##TY(wr, j) * x[t * K + j];                \
            out[t] = s;                                                                        \
        }                                                                                      \
    }
DEF_DENSE(f32)
DEF_DENSE(f16)
DEF_DENSE(bf16)

AI void dot_q8_0(const uint8_t *wr, const float *x, int64_t K, const int NT, float *out) {
    __m256 acc[4];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += QK8_0, wr += 2 + QK8_0) {
        __m256 d = _mm256_set1_ps(ld_f16(wr));
        const uint8_t *q = wr + 2;
        __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
        __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8))));
        __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 16))));
        __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 24))));
        for (int t = 0; t < NT; t++) {
            const float *xt = x + t * K + k;
            __m256 s = _mm256_mul_ps(q0, _mm256_loadu_ps(xt));
            s = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xt + 8), s);
            s = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xt + 16), s);
            s = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xt + 24), s);
            acc[t] = _mm256_fmadd_ps(s, d, acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum8(acc[t]);
}

/* Q4_0 block: byte i holds x[i] (low nibble) and x[i+16] (high), q - 8. */
AI void q4_unpack(const uint8_t *q, __m256 v[4]) {
    const __m256i m = _mm256_set1_epi32(0x0f), e = _mm256_set1_epi32(8);
    __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)));
    v[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b0, m), e));
    v[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b1, m), e));
    v[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b0, 4), e));
    v[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b1, 4), e));
}

AI void dot_q4_0(const uint8_t *wr, const float *x, int64_t K, const int NT, float *out) {
    __m256 acc[4];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += QK4_0, wr += 2 + QK4_0 / 2) {
        __m256 d = _mm256_set1_ps(ld_f16(wr)), v[4];
        q4_unpack(wr + 2, v);
        for (int t = 0; t < NT; t++) {
            const float *xt = x + t * K + k;
            __m256 s = _mm256_mul_ps(v[0], _mm256_loadu_ps(xt));
            s = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xt + 8), s);
            s = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xt + 16), s);
            s = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xt + 24), s);
            acc[t] = _mm256_fmadd_ps(s, d, acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum8(acc[t]);
}

/* Rows × token chunks of 4; NT is a constant in each call so the
 * accumulators stay in registers. */
#define DEF_MATVEC(TY)                                                                          \
    static void mv_##TY(const uint8_t *w, size_t rb, int64_t nrows, const float *x, int64_t T, \
                        int64_t K, float *y, int64_t ldy) {                                     \
        float o[4];                                                                             \
        for (int64_t r = 0; r < nrows; r++) {                                                   \
            const uint8_t *wr = w + (size_t)r * rb;                                             \
            for (int64_t t0 = 0; t0 < T; t0 += 4) {                                             \
                int64_t nt = T - t0 < 4 ? T - t0 : 4;                                           \
                const float *xt = x + t0 * K;                                                   \
                switch (nt) {                                                                   \
                case 4: dot_##TY(wr, xt, K, 4, o); break;                                       \
                case 3: dot_##TY(wr, xt, K, 3, o); break;                                       \
                case 2: dot_##TY(wr, xt, K, 2, o); break;                                       \
                default: dot_##TY(wr, xt, K, 1, o); break;                                      \
                }                                                                               \
                for (int64_t t = 0; t < nt; t++) y[(t0 + t) * ldy + r] = o[t];                  \
            }                                                                                   \
        }                                                                                       \
    }
DEF_MATVEC(f32)
DEF_MATVEC(f16)
DEF_MATVEC(bf16)
DEF_MATVEC(q8_0)
DEF_MATVEC(q4_0)

static void av2_matvec(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, const float *x,
                       int64_t T, int64_t K, float *y, int64_t ldy, float *scratch) {
    switch (wtype) {
    case GGML_TYPE_F32: mv_f32(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_F16: mv_f16(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_BF16: mv_bf16(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_Q8_0: mv_q8_0(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_Q4_0: mv_q4_0(w, rb, nrows, x, T, K, y, ldy); break;
    default: break; /* rejected by cpu_matmul */
    }
}

static void av2_to_f32(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, int64_t k0,
                       int64_t kc, float *dst, int64_t ldd) {
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *d = dst + r * ldd;
        int64_t i = 0;
        switch (wtype) {
        case GGML_TYPE_F32: memcpy(d, wr + 4 * k0, (size_t)kc * 4); break;
        case GGML_TYPE_F16:
            for (; i + 8 <= kc; i += 8) _mm256_storeu_ps(d + i, load_f16(wr, k0 + i));
            for (; i < kc; i++) d[i] = sc_f16(wr, k0 + i);
            break;
        case GGML_TYPE_BF16:
            for (; i + 8 <= kc; i += 8) _mm256_storeu_ps(d + i, load_bf16(wr, k0 + i));
            for (; i < kc; i++) d[i] = sc_bf16(wr, k0 + i);
            break;
        case GGML_TYPE_Q8_0:
            for (const uint8_t *b = wr + (k0 / QK8_0) * (2 + QK8_0); i < kc; i += QK8_0, b += 2 + QK8_0) {
                __m256 dd = _mm256_set1_ps(ld_f16(b));
                for (int j = 0; j < 4; j++) {
                    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * j)));
                    _mm256_storeu_ps(d + i + 8 * j, _mm256_mul_ps(dd, _mm256_cvtepi32_ps(q)));
                }
            }
            break;
        case GGML_TYPE_Q4_0:
            for (const uint8_t *b = wr + (k0 / QK4_0) * (2 + QK4_0 / 2); i < kc; i += QK4_0, b += 2 + QK4_0 / 2) {
                __m256 dd = _mm256_set1_ps(ld_f16(b)), v[4];
                q4_unpack(b + 2, v);
                for (int j = 0; j < 4; j++) _mm256_storeu_ps(d + i + 8 * j, _mm256_mul_ps(dd, v[j]));
            }
            break;
        default: break;
        }
    }
}

const cpu_kernels cpu_kernels_avx2 = {"avx2", av2_matvec, av2_to_f32, NULL};
