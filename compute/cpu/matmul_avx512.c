/* matmul_avx512.c — AVX-512 (F+BW+VL, with F16C/FMA) kernels for cpu_matmul
 * (compiled with those -m flags; only called when the CPU has them).
 *
 * Matvec (decode): one weight row converted 16 lanes at a time (F16 via
 * vcvtph2ps, BF16 by a 16-bit shift, Q4_0 by integer widening with one
 * scale per 32-block; Q8_0 shares the AVX2 integer kernel), dotted with up to 4 token rows while in registers;
 * K tails use masked loads. The 16-lane partial sums of 16 rows are reduced
 * together by a shuffle transpose (reduce16: the same addition tree as
 * _mm512_reduce_add_ps, so the same bits, at a third of the shuffles).
 *
 * GEMM (prefill): the classic register-blocked outer-product kernel (as in
 * BLIS/OpenBLAS): x is packed transposed (xp[k][t], matmul.c), a tile of
 * CPU_GEMM_NB weight rows × CPU_GEMM_KC columns is converted to f32, and a
 * 6-row × 64-token micro-kernel keeps 24 zmm accumulators. Each output is a
 * plain sequential f32 FMA sum over k.
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

AI __m512 load_f32(const uint8_t *r, int64_t k) { return _mm512_loadu_ps((const float *)r + k); }
AI __m512 loadm_f32(const uint8_t *r, int64_t k, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float *)r + k);
}
AI __m512 load_f16(const uint8_t *r, int64_t k) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + 2 * k)));
}
AI __m512 loadm_f16(const uint8_t *r, int64_t k, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, r + 2 * k));
}
AI __m512 load_bf16(const uint8_t *r, int64_t k) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r + 2 * k)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
AI __m512 loadm_bf16(const uint8_t *r, int64_t k, __mmask16 m) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r + 2 * k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* Software prefetch distance in bytes ahead of the weight row being read.
 * Decode streams every weight once per token; the hardware prefetchers alone
 * leave one core well short of DRAM bandwidth (bench-1b F16, 2 threads:
 * 7.7 tok/s without, 10.3-11.3 with 2 KiB; 512 B gave 8.8, 4 KiB 11.2).
 * 6 KiB keeps more misses in flight: strata-bench-matmul F16, bench-1b
 * layer mix, best of 3 on a loaded machine: 1 thread 32.6 -> 34.5 GB/s,
 * 2 threads 26.1 -> 36.2 GB/s against 2 KiB. */
#ifndef PF_DIST
#define PF_DIST 6144
#endif
typedef float f32_elem;
typedef uint16_t f16_elem;
typedef uint16_t bf16_elem;

/* Dense types: one row × NT token rows, two accumulators per token; out[t]
 * gets the 16 partial sums of token t, which _mm512_reduce_add_ps (or
 * reduce16 below, bit for bit the same) turns into the dot product. */
#define DEF_DENSE(TY)                                                                          \
    AI void dot_##TY(const uint8_t *wr, const float *x, int64_t K, const int NT, __m512 *out) { \
        __m512 a0[4], a1[4];                                                                   \
        for (int t = 0; t < NT; t++) a0[t] = a1[t] = _mm512_setzero_ps();                     \
        int64_t k = 0;                                                                         \
        for (; k + 32 <= K; k += 32) {                                                         \
            _mm_prefetch((const char *)wr + k * (int64_t)sizeof(TY##_elem) + PF_DIST, _MM_HINT_T0); \
            __m512 w0 = load_##TY(wr, k), w1 = load_##TY(wr, k + 16);                          \
            for (int t = 0; t < NT; t++) {                                                     \
                a0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * K + k), a0[t]);            \
                a1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * K + k + 16), a1[t]);       \
            }                                                                                  \
        }                                                                                      \
        for (; k < K; k += 16) {                                                               \
            __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);   \
            __m512 w0 = loadm_##TY(wr, k, m);                                                  \
            for (int t = 0; t < NT; t++)                                                       \
                a0[t] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + t * K + k), a0[t]);   \
        }                                                                                      \
        for (int t = 0; t < NT; t++) out[t] = _mm512_add_ps(a0[t], a1[t]);                  \
    }
DEF_DENSE(f32)
DEF_DENSE(f16)
DEF_DENSE(bf16)

AI void q8_unpack(const uint8_t *q, __m512 v[2]) {
    v[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    v[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
}

/* Q4_0 block: byte i holds x[i] (low nibble) and x[i+16] (high), q - 8. */
AI void q4_unpack(const uint8_t *q, __m512 v[2]) {
    const __m512i m = _mm512_set1_epi32(0x0f), e = _mm512_set1_epi32(8);
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    v[0] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(b, m), e));
    v[1] = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(b, 4), e));
}

#define DEF_QUANT(TY, QK, BYTES)                                                               \
    AI void dot_##TY(const uint8_t *wr, const float *x, int64_t K, const int NT, __m512 *out) { \
        __m512 acc[4];                                                                         \
        for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();                            \
        for (int64_t k = 0; k < K; k += QK, wr += BYTES) {                                     \
            _mm_prefetch((const char *)wr + PF_DIST, _MM_HINT_T0);                             \
            __m512 d = _mm512_set1_ps(ld_f16(wr)), v[2];                                       \
            TY##_unpack_(wr + 2, v);                                                           \
            for (int t = 0; t < NT; t++) {                                                     \
                const float *xt = x + t * K + k;                                               \
                __m512 s = _mm512_mul_ps(v[0], _mm512_loadu_ps(xt));                           \
                s = _mm512_fmadd_ps(v[1], _mm512_loadu_ps(xt + 16), s);                        \
                acc[t] = _mm512_fmadd_ps(s, d, acc[t]);                                        \
            }                                                                                  \
        }                                                                                      \
        for (int t = 0; t < NT; t++) out[t] = acc[t];                                          \
    }
#define q4_0_unpack_ q4_unpack
DEF_QUANT(q4_0, QK4_0, 2 + QK4_0 / 2)

/* Lane i of the result is _mm512_reduce_add_ps(v[slot(i)]), bit for bit:
 * the same tree as GCC's __MM512_REDUCE_OP (lane l + lane l+8, then the
 * 128-bit halves of that, then l + l^2, then l + l^1), done for 16 vectors at
 * once by transposing shuffles instead of 16 horizontal reductions. The
 * shuffles leave row 4c+m's sum in lane 4m+c, so callers put row i's vector
 * in slot(i) = 4*(i%4) + i/4 and get row i in lane i. */
AI int red_slot(int i) { return 4 * (i & 3) + (i >> 2); }
AI __m512 reduce16(const __m512 *v) {
    __m512 p[8], q[4], r[2];
    for (int i = 0; i < 8; i++) /* [a0-7 + a8-15 | b0-7 + b8-15] */
        p[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)));
    for (int j = 0; j < 4; j++) /* per 128-bit block: one vector's upper 4 + lower 4 of the 8 */
        q[j] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * j], p[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                             _mm512_shuffle_f32x4(p[2 * j], p[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)));
    for (int k = 0; k < 2; k++) /* l + l^2 */
        r[k] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * k], q[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(q[2 * k], q[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* l + l^1 */
    return _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Small K (a multiple of 16, at most 64: e.g. a tiny model's n_embd): the NT
 * token rows stay in registers (NK = K/16 vectors each) across 16 weight
 * rows. Chunk c goes to accumulator c % 2, as in dot_* (whose 32-wide loop
 * plus 16-wide tail does the same for K % 16 == 0), so the bits are equal. */
#define DEF_SMALLK(TY)                                                                          \
    AI void mvs_##TY(const int NT, const int NK, const uint8_t *w, size_t rb, int nr,            \
                     const float *x, int64_t K, __m512 (*v)[16]) {                              \
        __m512 xr[4][4];                                                                        \
        for (int t = 0; t < NT; t++)                                                            \
            for (int c = 0; c < NK; c++) xr[t][c] = _mm512_loadu_ps(x + t * K + 16 * c);        \
        for (int i = 0; i < nr; i++) {                                                          \
            const uint8_t *wr = w + (size_t)i * rb;                                             \
            __m512 wv[4];                                                                       \
            for (int c = 0; c < NK; c++) wv[c] = load_##TY(wr, 16 * c);                         \
            for (int t = 0; t < NT; t++) {                                                      \
                __m512 a0 = _mm512_fmadd_ps(wv[0], xr[t][0], _mm512_setzero_ps());              \
                __m512 a1 = _mm512_setzero_ps();                                                \
                if (NK > 1) a1 = _mm512_fmadd_ps(wv[1], xr[t][1], a1);                          \
                if (NK > 2) a0 = _mm512_fmadd_ps(wv[2], xr[t][2], a0);                          \
                if (NK > 3) a1 = _mm512_fmadd_ps(wv[3], xr[t][3], a1);                          \
                v[t][red_slot(i)] = _mm512_add_ps(a0, a1);                                      \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    static void mvs_nk_##TY(int nt, int nk, const uint8_t *w, size_t rb, int nr, const float *x, \
                            int64_t K, __m512 (*v)[16]) {                                       \
        switch (nt * 4 + nk) {                                                                  \
        case 4 + 1: mvs_##TY(1, 1, w, rb, nr, x, K, v); break;                                  \
        case 4 + 2: mvs_##TY(1, 2, w, rb, nr, x, K, v); break;                                  \
        case 4 + 3: mvs_##TY(1, 3, w, rb, nr, x, K, v); break;                                  \
        case 4 + 4: mvs_##TY(1, 4, w, rb, nr, x, K, v); break;                                  \
        case 8 + 1: mvs_##TY(2, 1, w, rb, nr, x, K, v); break;                                  \
        case 8 + 2: mvs_##TY(2, 2, w, rb, nr, x, K, v); break;                                  \
        case 8 + 3: mvs_##TY(2, 3, w, rb, nr, x, K, v); break;                                  \
        case 8 + 4: mvs_##TY(2, 4, w, rb, nr, x, K, v); break;                                  \
        case 12 + 1: mvs_##TY(3, 1, w, rb, nr, x, K, v); break;                                 \
        case 12 + 2: mvs_##TY(3, 2, w, rb, nr, x, K, v); break;                                 \
        case 12 + 3: mvs_##TY(3, 3, w, rb, nr, x, K, v); break;                                 \
        case 12 + 4: mvs_##TY(3, 4, w, rb, nr, x, K, v); break;                                 \
        case 16 + 1: mvs_##TY(4, 1, w, rb, nr, x, K, v); break;                                 \
        case 16 + 2: mvs_##TY(4, 2, w, rb, nr, x, K, v); break;                                 \
        case 16 + 3: mvs_##TY(4, 3, w, rb, nr, x, K, v); break;                                 \
        default: mvs_##TY(4, 4, w, rb, nr, x, K, v); break;                                     \
        }                                                                                       \
    }
DEF_SMALLK(f32)
DEF_SMALLK(f16)
DEF_SMALLK(bf16)
#define HAS_SMALLK_f32 1
#define HAS_SMALLK_f16 1
#define HAS_SMALLK_bf16 1
#define HAS_SMALLK_q4_0 0
/* Q4_0: never called (HAS_SMALLK_q4_0 is 0) */
static void mvs_nk_q4_0(int nt, int nk, const uint8_t *w, size_t rb, int nr, const float *x, int64_t K,
                        __m512 (*v)[16]) {
    (void)nt, (void)nk, (void)w, (void)rb, (void)nr, (void)x, (void)K, (void)v;
}

/* 16 rows × token chunks of 4 (NT is a constant in each dot call so the
 * accumulators stay in registers); the 16 rows' partial-sum vectors of each
 * token are reduced together and stored as 16 consecutive outputs. */
#define DEF_MATVEC(TY)                                                                          \
    static void mv_##TY(const uint8_t *w, size_t rb, int64_t nrows, const float *x, int64_t T, \
                        int64_t K, float *y, int64_t ldy) {                                     \
        __m512 v[4][16], o[4];                                                                  \
        const int smallk = HAS_SMALLK_##TY && K % 16 == 0 && K <= 64;                           \
        for (int64_t r0 = 0; r0 < nrows; r0 += 16) {                                            \
            const int nr = nrows - r0 < 16 ? (int)(nrows - r0) : 16;                            \
            const __mmask16 m = nr == 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);     \
            for (int64_t t0 = 0; t0 < T; t0 += 4) {                                             \
                const int nt = T - t0 < 4 ? (int)(T - t0) : 4;                                  \
                const float *xt = x + t0 * K;                                                   \
                if (smallk) {                                                                   \
                    mvs_nk_##TY(nt, (int)(K / 16), w + (size_t)r0 * rb, rb, nr, xt, K, v);      \
                } else {                                                                        \
                    for (int i = 0; i < nr; i++) {                                              \
                        const uint8_t *wr = w + (size_t)(r0 + i) * rb;                          \
                        switch (nt) {                                                           \
                        case 4: dot_##TY(wr, xt, K, 4, o); break;                               \
                        case 3: dot_##TY(wr, xt, K, 3, o); break;                               \
                        case 2: dot_##TY(wr, xt, K, 2, o); break;                               \
                        default: dot_##TY(wr, xt, K, 1, o); break;                              \
                        }                                                                       \
                        for (int t = 0; t < nt; t++) v[t][red_slot(i)] = o[t];                  \
                    }                                                                           \
                }                                                                               \
                for (int i = nr; i < 16; i++)                                                   \
                    for (int t = 0; t < nt; t++) v[t][red_slot(i)] = _mm512_setzero_ps();       \
                for (int t = 0; t < nt; t++)                                                    \
                    _mm512_mask_storeu_ps(y + (t0 + t) * ldy + r0, m, reduce16(v[t]));          \
            }                                                                                   \
        }                                                                                       \
    }
DEF_MATVEC(f32)
DEF_MATVEC(f16)
DEF_MATVEC(bf16)
DEF_MATVEC(q4_0)

static void av5_matvec(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, const float *x,
                       int64_t T, int64_t K, float *y, int64_t ldy, float *scratch) {
    switch (wtype) {
    case GGML_TYPE_F32: mv_f32(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_F16: mv_f16(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_BF16: mv_bf16(w, rb, nrows, x, T, K, y, ldy); break;
    case GGML_TYPE_Q4_0: mv_q4_0(w, rb, nrows, x, T, K, y, ldy); break;
    default: break; /* Q8_0 goes to matvec_q8; others are rejected by cpu_matmul */
    }
}

#define DEF_CONV_DENSE(TY)                                                                 \
    static void conv_##TY(const uint8_t *wr, int64_t k0, int64_t kc, float *d) {          \
        int64_t i = 0;                                                                     \
        for (; i + 16 <= kc; i += 16) _mm512_storeu_ps(d + i, load_##TY(wr, k0 + i));     \
        if (i < kc) {                                                                      \
            __mmask16 m = (__mmask16)((1u << (kc - i)) - 1);                               \
            _mm512_mask_storeu_ps(d + i, m, loadm_##TY(wr, k0 + i, m));                    \
        }                                                                                  \
    }
DEF_CONV_DENSE(f32)
DEF_CONV_DENSE(f16)
DEF_CONV_DENSE(bf16)

static void av5_to_f32(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, int64_t k0,
                       int64_t kc, float *dst, int64_t ldd) {
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        float *d = dst + r * ldd;
        switch (wtype) {
        case GGML_TYPE_F32: conv_f32(wr, k0, kc, d); break;
        case GGML_TYPE_F16: conv_f16(wr, k0, kc, d); break;
        case GGML_TYPE_BF16: conv_bf16(wr, k0, kc, d); break;
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_0: {
            int q8 = wtype == GGML_TYPE_Q8_0;
            size_t bb = q8 ? 2 + QK8_0 : 2 + QK4_0 / 2;
            const uint8_t *b = wr + (size_t)(k0 / 32) * bb;
            for (int64_t i = 0; i < kc; i += 32, b += bb) {
                __m512 dd = _mm512_set1_ps(ld_f16(b)), v[2];
                if (q8)
                    q8_unpack(b + 2, v);
                else
                    q4_unpack(b + 2, v);
                _mm512_storeu_ps(d + i, _mm512_mul_ps(dd, v[0]));
                _mm512_storeu_ps(d + i + 16, _mm512_mul_ps(dd, v[1]));
            }
            break;
        }
        default: break;
        }
    }
}

/* C[i][t] (+)= sum_k A[i][k] * B[k][t] for i < MR, t < 16*NV.
 * A: converted weight rows (lda), B: packed x (ldb = Tp), C: cbuf (ldc = Tp). */
AI void micro(const int NV, int64_t kc, const float *A, int64_t lda, const float *B, int64_t ldb,
              float *C, int64_t ldc, int first) {
    __m512 c[CPU_GEMM_MR][4];
#pragma GCC unroll 6
    for (int i = 0; i < CPU_GEMM_MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            c[i][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(C + i * ldc + 16 * v);
    for (int64_t k = 0; k < kc; k++) {
        __m512 b[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = _mm512_load_ps(B + k * ldb + 16 * v);
#pragma GCC unroll 6
        for (int i = 0; i < CPU_GEMM_MR; i++) {
            __m512 a = _mm512_set1_ps(A[i * lda + k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[i][v] = _mm512_fmadd_ps(a, b[v], c[i][v]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < CPU_GEMM_MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_store_ps(C + i * ldc + 16 * v, c[i][v]);
}

static void av5_micro(int64_t kc, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                      int64_t ldc, int first, int nt) {
    switch (nt / 16) {
    case 4: micro(4, kc, A, lda, B, ldb, C, ldc, first); break;
    case 3: micro(3, kc, A, lda, B, ldb, C, ldc, first); break;
    case 2: micro(2, kc, A, lda, B, ldb, C, ldc, first); break;
    default: micro(1, kc, A, lda, B, ldb, C, ldc, first); break;
    }
}

const cpu_kernels cpu_kernels_avx512 = {"avx512", av5_matvec, cpu_matvec_q8_avx2, av5_to_f32, av5_micro, 64,
                                      cpu_gemm_q8_avx512 /* cpu_gemm_q8_vnni where the CPU has VNNI (matmul.c) */,
                                      cpu_quantize_q8_avx2};
