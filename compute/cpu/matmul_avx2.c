/* matmul_avx2.c — AVX2+FMA+F16C kernels for cpu_matmul (compiled with
 * -mavx2 -mfma -mf16c; only called when the CPU has them).
 *
 * Every kernel computes the canonical summation order of simd.h, so its
 * results are bit for bit those of the AVX-512 and scalar levels:
 *  - dense matvec: the 16 lanes of the canonical order are two 8-lane
 *    halves (lo, hi), each with the even- and odd-chunk accumulators, so 4
 *    ymm accumulators per token row, reduced by the canonical tree;
 *  - Q4_0 matvec: the same with one accumulator pair and the block scale;
 *  - Q8_0 matvec: integer dot products of the weight blocks with the
 *    Q8_0-quantized activations (maddubs + madd, as ggml's AVX2 code),
 *    8 blocks' totals at a time into the 8 block accumulators;
 *  - GEMM: a 6-row × 16-token register-blocked micro-kernel, each output a
 *    sequential FMA sum over k (as matmul_avx512.c's; matmul.c tiles).
 */
#include <immintrin.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cpu/simd.h"

#define AI static inline __attribute__((always_inline))

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

/* Partial loads for K tails: n < 8 elements from k, zeros above (as the
 * AVX-512 level's masked loads). */
typedef float f32_elem;
typedef uint16_t f16_elem;
typedef uint16_t bf16_elem;
#define DEF_LOADN(TY)                                                       \
    AI __m256 loadn_##TY(const uint8_t *r, int64_t k, int64_t n) {          \
        uint8_t tmp[8 * sizeof(TY##_elem)] = {0};                           \
        memcpy(tmp, r + k * (int64_t)sizeof(TY##_elem), (size_t)n * sizeof(TY##_elem)); \
        return load_##TY(tmp, 0);                                           \
    }
DEF_LOADN(f32)
DEF_LOADN(f16)
DEF_LOADN(bf16)
AI __m256 loadn_x(const float *x, int64_t n) {
    float tmp[8] = {0};
    memcpy(tmp, x, (size_t)n * sizeof(float));
    return _mm256_loadu_ps(tmp);
}

/* The canonical tree (simd.h) of a 16-lane vector given as halves lo
 * (lanes 0-7) and hi (lanes 8-15): l + l+8, then l + l+4, l + l+2, l + l+1. */
AI float reduce16(__m256 lo, __m256 hi) {
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}

/* Software prefetch distance in bytes ahead of the weight row being read
 * (see matmul_avx512.c). One core's share of DRAM bandwidth is bounded by
 * the misses it keeps in flight, so the prefetch runs far ahead: measured
 * with strata-bench-matmul, 1 thread, bench-1b shapes (GB/s, F16 | Q8_0):
 * 2 KiB 26 | 28, 4 KiB 33 | 33, 6 KiB 38 | 39, 8 KiB 31 | 43. */
#ifndef PF_DIST
#define PF_DIST 6144
#endif
#ifndef PF_DIST_Q8
#define PF_DIST_Q8 8192
#endif

/* Dense types: one row × NT token rows. a[t][0..1]: even chunks (lo, hi),
 * a[t][2..3]: odd chunks. Tail chunks of 16 (the last may be partial) go to
 * the even accumulators. */
#define DEF_DENSE(TY)                                                                          \
    AI void dot_##TY(const uint8_t *wr, const float *x, int64_t K, const int NT, float *out) { \
        __m256 a[4][4];                                                                        \
        for (int t = 0; t < NT; t++) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm256_setzero_ps(); \
        int64_t k = 0;                                                                         \
        for (; k + 32 <= K; k += 32) {                                                         \
            _mm_prefetch((const char *)wr + k * (int64_t)sizeof(TY##_elem) + PF_DIST, _MM_HINT_T0); \
            __m256 w0 = load_##TY(wr, k), w1 = load_##TY(wr, k + 8);                           \
            __m256 w2 = load_##TY(wr, k + 16), w3 = load_##TY(wr, k + 24);                     \
            for (int t = 0; t < NT; t++) {                                                     \
                const float *xt = x + t * K + k;                                               \
                a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a[t][0]);                   \
                a[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), a[t][1]);               \
                a[t][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), a[t][2]);              \
                a[t][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), a[t][3]);              \
            }                                                                                  \
        }                                                                                      \
        for (; k < K; k += 16) {                                                               \
            int64_t n = K - k;                                                                 \
            __m256 w0 = n >= 8 ? load_##TY(wr, k) : loadn_##TY(wr, k, n);                      \
            __m256 w1 = n >= 16 ? load_##TY(wr, k + 8)                                         \
                                : n > 8 ? loadn_##TY(wr, k + 8, n - 8) : _mm256_setzero_ps(); \
            for (int t = 0; t < NT; t++) {                                                     \
                const float *xt = x + t * K + k;                                               \
                __m256 x0 = n >= 8 ? _mm256_loadu_ps(xt) : loadn_x(xt, n);                     \
                __m256 x1 = n >= 16 ? _mm256_loadu_ps(xt + 8)                                  \
                                    : n > 8 ? loadn_x(xt + 8, n - 8) : _mm256_setzero_ps();   \
                a[t][0] = _mm256_fmadd_ps(w0, x0, a[t][0]);                                    \
                a[t][1] = _mm256_fmadd_ps(w1, x1, a[t][1]);                                    \
            }                                                                                  \
        }                                                                                      \
        for (int t = 0; t < NT; t++)                                                           \
            out[t] = reduce16(_mm256_add_ps(a[t][0], a[t][2]), _mm256_add_ps(a[t][1], a[t][3])); \
    }
DEF_DENSE(f32)
DEF_DENSE(f16)
DEF_DENSE(bf16)

/* Decode (one token row) with long rows: x no longer stays in L1 while the
 * weight stream and its prefetch pass through (48 KiB L1D, x 32 KiB for
 * the FFN down projection), so every x load comes from L2, twice the bytes
 * of the weights it meets. Measured (1 thread, bench-1b's 2048x8192 F16):
 * 32.6 GB/s, 39.5 GB/s with x aliased to 8 KiB. Two rows at a time load each
 * x vector once for both, halving that traffic, and give 8 independent FMA
 * chains; each row keeps its own accumulators, so the bits are those of
 * dot_TY. With short rows the two streams cost more than they save (2048
 * columns: 34 vs 40 GB/s), hence only from DOT2_MIN_K columns on; measured
 * at 2048x8192 (best | median GB/s): 1 thread 32.8 | 23 -> 35.6 | 27,
 * 2 threads 37 | 12 -> 38 | 17 (a loaded machine: medians are noisy).
 * The prefetch follows the pair's stream: PF_DIST ahead in both rows, and
 * into the next pair once past the rows' ends. */
#define DOT2_MIN_K 4096
#define DEF_DENSE2(TY)                                                                         \
    AI void dot2_##TY(const uint8_t *w0, size_t rb, const float *x, int64_t K, float *out) {   \
        const uint8_t *w1 = w0 + rb;                                                           \
        __m256 a[2][4];                                                                        \
        for (int r = 0; r < 2; r++) a[r][0] = a[r][1] = a[r][2] = a[r][3] = _mm256_setzero_ps(); \
        const uint8_t *pb = w0 + PF_DIST / rb * 2 * rb; /* prefetch: pair base, offset */      \
        size_t po = PF_DIST % rb;                                                              \
        int64_t k = 0;                                                                         \
        for (; k + 32 <= K; k += 32) {                                                         \
            _mm_prefetch((const char *)pb + po, _MM_HINT_T0);                                  \
            _mm_prefetch((const char *)pb + rb + po, _MM_HINT_T0);                             \
            po += 32 * sizeof(TY##_elem);                                                      \
            if (po >= rb) po -= rb, pb += 2 * rb;                                              \
            for (int c = 0; c < 4; c++) {                                                      \
                __m256 xc = _mm256_loadu_ps(x + k + 8 * c);                                    \
                a[0][c] = _mm256_fmadd_ps(load_##TY(w0, k + 8 * c), xc, a[0][c]);              \
                a[1][c] = _mm256_fmadd_ps(load_##TY(w1, k + 8 * c), xc, a[1][c]);              \
            }                                                                                  \
        }                                                                                      \
        for (; k < K; k += 16) {                                                               \
            int64_t n = K - k;                                                                 \
            __m256 x0 = n >= 8 ? _mm256_loadu_ps(x + k) : loadn_x(x + k, n);                   \
            __m256 x1 = n >= 16 ? _mm256_loadu_ps(x + k + 8)                                   \
                                : n > 8 ? loadn_x(x + k + 8, n - 8) : _mm256_setzero_ps();    \
            for (int r = 0; r < 2; r++) {                                                      \
                const uint8_t *wr = r ? w1 : w0;                                               \
                __m256 v0 = n >= 8 ? load_##TY(wr, k) : loadn_##TY(wr, k, n);                 \
                __m256 v1 = n >= 16 ? load_##TY(wr, k + 8)                                     \
                                    : n > 8 ? loadn_##TY(wr, k + 8, n - 8) : _mm256_setzero_ps(); \
                a[r][0] = _mm256_fmadd_ps(v0, x0, a[r][0]);                                    \
                a[r][1] = _mm256_fmadd_ps(v1, x1, a[r][1]);                                    \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < 2; r++)                                                            \
            out[r] = reduce16(_mm256_add_ps(a[r][0], a[r][2]), _mm256_add_ps(a[r][1], a[r][3])); \
    }
DEF_DENSE2(f32)
DEF_DENSE2(f16)
DEF_DENSE2(bf16)

/* Q4_0 block: byte i holds x[i] (low nibble) and x[i+16] (high), q - 8;
 * v[0..3] are elements 0-7, 8-15, 16-23, 24-31. */
AI void q4_unpack(const uint8_t *q, __m256 v[4]) {
    const __m256i m = _mm256_set1_epi32(0x0f), e = _mm256_set1_epi32(8);
    __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)));
    v[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b0, m), e));
    v[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b1, m), e));
    v[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b0, 4), e));
    v[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b1, 4), e));
}

/* Canonical Q4_0 order: lane i of a block is fma(q[16+i], x[16+i],
 * q[i] * x[i]), times the scale into lane i's accumulator. */
AI void dot_q4_0(const uint8_t *wr, const float *x, int64_t K, const int NT, float *out) {
    __m256 lo[4], hi[4];
    for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += QK4_0, wr += 2 + QK4_0 / 2) {
        _mm_prefetch((const char *)wr + PF_DIST, _MM_HINT_T0);
        __m256 d = _mm256_set1_ps(ld_f16(wr)), v[4];
        q4_unpack(wr + 2, v);
        for (int t = 0; t < NT; t++) {
            const float *xt = x + t * K + k;
            __m256 s0 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xt + 16), _mm256_mul_ps(v[0], _mm256_loadu_ps(xt)));
            __m256 s1 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xt + 24), _mm256_mul_ps(v[1], _mm256_loadu_ps(xt + 8)));
            lo[t] = _mm256_fmadd_ps(s0, d, lo[t]);
            hi[t] = _mm256_fmadd_ps(s1, d, hi[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = reduce16(lo[t], hi[t]);
}

/* Rows × token chunks of 4; NT is a constant in each call so the
 * accumulators stay in registers. */
#define DEF_MATVEC(TY, PAIRS)                                                                   \
    static void mv_##TY(const uint8_t *w, size_t rb, int64_t nrows, const float *x, int64_t T, \
                        int64_t K, float *y, int64_t ldy) {                                     \
        float o[4];                                                                             \
        int64_t r = 0;                                                                          \
        if (PAIRS && T == 1 && K >= DOT2_MIN_K)                                                 \
            for (; r + 2 <= nrows; r += 2) dot2_##TY(w + (size_t)r * rb, rb, x, K, y + r);      \
        for (; r < nrows; r++) {                                                                \
            const uint8_t *wr = w + (size_t)r * rb;                                             \
            for (int64_t t0 = 0; t0 < T; t0 += 3) {                                             \
                int64_t nt = T - t0 < 3 ? T - t0 : 3;                                           \
                const float *xt = x + t0 * K;                                                   \
                switch (nt) {                                                                   \
                case 3: dot_##TY(wr, xt, K, 3, o); break;                                       \
                case 2: dot_##TY(wr, xt, K, 2, o); break;                                       \
                default: dot_##TY(wr, xt, K, 1, o); break;                                      \
                }                                                                               \
                for (int64_t t = 0; t < nt; t++) y[(t0 + t) * ldy + r] = o[t];                  \
            }                                                                                   \
        }                                                                                       \
    }
/* dot2 for the dense types (PAIRS 1); Q4_0 rows are a quarter the bytes. */
#define dot2_q4_0(w, rb, x, K, y) ((void)0)
DEF_MATVEC(f32, 1)
DEF_MATVEC(f16, 1)
DEF_MATVEC(bf16, 1)
DEF_MATVEC(q4_0, 0)

static void av2_matvec(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, const float *x,
                       int64_t T, int64_t K, float *y, int64_t ldy, float *scratch) {
    (void)scratch;
    switch (wtype) {
    case GGML_TYPE_F32: mv_f32(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_F16: mv_f16(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_BF16: mv_bf16(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_Q4_0: mv_q4_0(w, rb, nrows, x, T, K, y, ldy); break;
    default: break; /* Q8_0 goes to matvec_q8; others are rejected by cpu_matmul */
    }
}

/* ---- Q8_0 × Q8_0 (integer dot products) ---- */

/* 8 int32 lanes of partial sums of one block: ggml's mul_sum_i8_pairs
 * (|w| as u8 times x with w's sign, pairs to i16 by maddubs, which cannot
 * saturate as |x| <= 127, then pairs to i32). */
AI __m256i block_dot(__m256i wabs, __m256i wq, __m256i xq) {
    __m256i sx = _mm256_sign_epi8(xq, wq);
    __m256i p16 = _mm256_maddubs_epi16(wabs, sx);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* Exact totals of 8 blocks' partial-sum vectors: lane j = sum of p[j]. */
AI __m256i totals8(const __m256i p[8]) {
    __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

/* 8 weight-block scales (f16 at a 34-byte stride) as f32. */
AI __m256 scales8(const uint8_t *b) {
    __m128i h = _mm_setzero_si128();
    uint16_t v;
#define ST_SCALE(j) memcpy(&v, b + (j) * (2 + QK8_0), 2), h = _mm_insert_epi16(h, v, j)
    ST_SCALE(0); ST_SCALE(1); ST_SCALE(2); ST_SCALE(3);
    ST_SCALE(4); ST_SCALE(5); ST_SCALE(6); ST_SCALE(7);
#undef ST_SCALE
    return _mm256_cvtph_ps(h);
}

/* One weight row · one token row; acc lane j collects blocks b with
 * b % 8 == j. Full groups of 8 blocks run unrolled; a last partial group
 * pads with zero blocks (isum 0, scale 0: the lane is unchanged). */
AI float dot_q8(const uint8_t *wr, const int8_t *xq, const float *xd, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    int64_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8, wr += 8 * (2 + QK8_0)) {
        _mm_prefetch((const char *)wr + PF_DIST_Q8, _MM_HINT_T0);
        _mm_prefetch((const char *)wr + PF_DIST_Q8 + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)wr + PF_DIST_Q8 + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)wr + PF_DIST_Q8 + 192, _MM_HINT_T0);
        _mm_prefetch((const char *)wr + PF_DIST_Q8 + 256, _MM_HINT_T0);
        __m256i p[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            __m256i wq = _mm256_loadu_si256((const __m256i *)(wr + j * (2 + QK8_0) + 2));
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (b0 + j) * QK8_0));
            p[j] = block_dot(_mm256_sign_epi8(wq, wq), wq, xv);
        }
        __m256 dd = _mm256_mul_ps(scales8(wr), _mm256_loadu_ps(xd + b0));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals8(p)), dd, acc);
    }
    if (b0 < nb) {
        const int ng = (int)(nb - b0);
        __m256i p[8];
        uint8_t wpad[8 * (2 + QK8_0)] = {0};
        float xs[8] = {0};
        memcpy(wpad, wr, (size_t)ng * (2 + QK8_0));
        memcpy(xs, xd + b0, sizeof(float) * (size_t)ng);
        for (int j = 0; j < 8; j++) {
            if (j < ng) {
                __m256i wq = _mm256_loadu_si256((const __m256i *)(wpad + j * (2 + QK8_0) + 2));
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (b0 + j) * QK8_0));
                p[j] = block_dot(_mm256_sign_epi8(wq, wq), wq, xv);
            } else {
                p[j] = _mm256_setzero_si256();
            }
        }
        __m256 dd = _mm256_mul_ps(scales8(wpad), _mm256_loadu_ps(xs));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(totals8(p)), dd, acc);
    }
    return reduce16(acc, _mm256_setzero_ps());
}

/* Row by row; a row (K/32 blocks) stays in L1 while the T token rows pass. */
void cpu_matvec_q8_avx2(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd,
                        int64_t T, int64_t K, float *y, int64_t ldy) {
    const int64_t nb = K / QK8_0;
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        for (int64_t t = 0; t < T; t++) y[t * ldy + r] = dot_q8(wr, xq + t * K, xd + t * nb, nb);
    }
}

/* ---- conversion to f32 (the GEMM's weight tiles) ---- */

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
            if (i < kc) {
                float tmp[8];
                _mm256_storeu_ps(tmp, loadn_f16(wr, k0 + i, kc - i));
                memcpy(d + i, tmp, sizeof(float) * (size_t)(kc - i));
            }
            break;
        case GGML_TYPE_BF16:
            for (; i + 8 <= kc; i += 8) _mm256_storeu_ps(d + i, load_bf16(wr, k0 + i));
            if (i < kc) {
                float tmp[8];
                _mm256_storeu_ps(tmp, loadn_bf16(wr, k0 + i, kc - i));
                memcpy(d + i, tmp, sizeof(float) * (size_t)(kc - i));
            }
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

/* ---- GEMM ---- */

/* C[i][t] (+)= sum_k A[i][k] * B[k][t] for i < MR, t < 16: 12 ymm
 * accumulators, sequential FMAs over k. */
static void micro16(int64_t kc, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                    int64_t ldc, int first, int nt) {
    (void)nt; /* always 16 (gemm_tokens) */
    __m256 c[CPU_GEMM_MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < CPU_GEMM_MR; i++)
        for (int v = 0; v < 2; v++)
            c[i][v] = first ? _mm256_setzero_ps() : _mm256_load_ps(C + i * ldc + 8 * v);
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(B + k * ldb), b1 = _mm256_load_ps(B + k * ldb + 8);
#pragma GCC unroll 6
        for (int i = 0; i < CPU_GEMM_MR; i++) {
            __m256 a = _mm256_broadcast_ss(A + i * lda + k);
            c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < CPU_GEMM_MR; i++)
        for (int v = 0; v < 2; v++) _mm256_store_ps(C + i * ldc + 8 * v, c[i][v]);
}

const cpu_kernels cpu_kernels_avx2 = {"avx2", av2_matvec, cpu_matvec_q8_avx2, av2_to_f32, micro16, 16,
                                      cpu_gemm_q8_avx2, cpu_quantize_q8_avx2};
