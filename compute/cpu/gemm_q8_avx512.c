/* gemm_q8_avx512.c — the Q8_0 GEMM of the AVX-512 level, built twice:
 * as itself (-mavx512f -mavx512bw -mavx512vl: cpu_gemm_q8_avx512) and, with
 * Q8_VNNI defined, as gemm_q8_vnni.c (plus -mavx512vnni: cpu_gemm_q8_vnni,
 * which matmul.c calls only on CPUs with AVX512-VNNI).
 *
 * Same scheme and the same bits as gemm_q8_avx2.c (simd.h's canonical Q8_0
 * order), with 16 weight rows per panel (zmm lanes) and 8-token register
 * tiles. A step (4 columns of the 16 rows, one token) is
 *  - without VNNI: |w| * sign(x, w) pairs (maddubs) and madd with ones, as
 *    the AVX2 kernel;
 *  - with VNNI: one vpdpbusd. It multiplies unsigned by signed bytes, so the
 *    activations come biased, u = x + 128 (matmul.c stores xq ^ 0x80), and
 *    each lane starts from -128 * sum_k w[r][k] over the block (kept in the
 *    panel): isum = sum (x + 128) w - 128 sum w, exact in int32
 *    (|sum| <= 32 * 255 * 128).
 */
#include <immintrin.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cpu/simd.h"

#ifdef Q8_VNNI
#define GEMM_Q8_NAME cpu_gemm_q8_vnni
#else
#define GEMM_Q8_NAME cpu_gemm_q8_avx512
#endif

#define AI static inline __attribute__((always_inline))
#define RG 16  /* weight rows per panel (lanes) */
#define TT 8   /* tokens per register tile */
#define BQ (RG * QK8_0) /* panel bytes of one block's quants */

AI float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 rows x 8 dwords -> out + s*64: dword s of rows 0-7 (32 bytes). */
AI void transpose8(const __m256i r[8], uint8_t *out) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int s = 0; s < 4; s++) {
        _mm256_store_si256((__m256i *)(out + s * 64), _mm256_permute2x128_si256(u[s], u[4 + s], 0x20));
        _mm256_store_si256((__m256i *)(out + (4 + s) * 64), _mm256_permute2x128_si256(u[s], u[4 + s], 0x31));
    }
}

/* Packs rows [0, nr) (nr <= 16; missing rows are zero blocks with scale 0)
 * into q (nb x BQ bytes, step s of block p at q + p*BQ + s*64, lane = row),
 * d (nb x 16 scales) and, for VNNI, c (nb x 16 bias corrections). Blocks
 * are stored j-major (b % 8 = 0 first, ...) but read in memory order. */
static void pack16(const uint8_t *w, size_t rb, int nr, int64_t nb, int8_t *q, float *d, int32_t *c) {
    int64_t base[8];
    for (int j = 0, acc = 0; j < 8; j++) base[j] = acc, acc += (int)((nb - j + 7) / 8);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t p = base[b % 8] + b / 8;
        for (int h = 0; h < 2; h++) {
            __m256i r[8];
            for (int i = 0; i < 8; i++) {
                const int row = 8 * h + i;
                if (row < nr) {
                    const uint8_t *blk = w + (size_t)row * rb + (size_t)b * (2 + QK8_0);
                    r[i] = _mm256_loadu_si256((const __m256i *)(blk + 2));
                    d[p * RG + row] = ld_f16(blk);
                } else {
                    r[i] = _mm256_setzero_si256();
                    d[p * RG + row] = 0.0f;
                }
            }
            transpose8(r, (uint8_t *)q + p * BQ + 32 * h);
        }
#ifdef Q8_VNNI
        __m512i s = _mm512_setzero_si512();
        for (int st = 0; st < 8; st++)
            s = _mm512_dpbusd_epi32(s, _mm512_set1_epi8(1), _mm512_load_si512((const void *)(q + p * BQ + st * 64)));
        _mm512_store_si512((void *)(c + p * RG), _mm512_mullo_epi32(s, _mm512_set1_epi32(-128)));
#else
        (void)c;
#endif
    }
}

/* One step of one token: acc + the 16 rows' sums of 4 products. Without
 * VNNI: aw = |w|, neg = the bytes where w < 0; x negated there stands for
 * vpsignb (which AVX-512 lacks; where w = 0, |w| = 0 zeroes the product). */
AI __m512i step(__m512i acc, __m512i wv, __m512i aw, __mmask64 neg, int32_t x4) {
#ifdef Q8_VNNI
    (void)aw, (void)neg;
    return _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(x4), wv);
#else
    (void)wv;
    const __m512i x = _mm512_set1_epi32(x4);
    const __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), _mm512_set1_epi16(1)));
#endif
}

/* NT tokens (rows of xq, biased for VNNI, K bytes apart) against one panel;
 * fa[(t*8 + j)*16 + r] receives accumulator j of token t, row r. */
AI void tile(const int NT, const int8_t *q, const float *d, const int32_t *c, int64_t nb, const uint8_t *xu,
             const float *xd, int64_t K, float *fa) {
    int64_t p = 0;
    for (int j = 0; j < 8; j++) {
        __m512 f[TT];
        for (int t = 0; t < NT; t++) f[t] = _mm512_setzero_ps();
        for (int64_t b = j; b < nb; b += 8, p++) {
            const int8_t *qp = q + p * BQ;
            const uint8_t *xb = xu + b * QK8_0;
#ifdef Q8_VNNI
            const __m512i c0 = _mm512_load_si512((const void *)(c + p * RG));
#else
            const __m512i c0 = _mm512_setzero_si512();
#endif
            __m512i acc[TT];
            for (int t = 0; t < NT; t++) acc[t] = c0;
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                const __m512i wv = _mm512_load_si512((const void *)(qp + s * 64));
#ifdef Q8_VNNI
                const __m512i aw = wv;
                const __mmask64 neg = 0;
#else
                const __m512i aw = _mm512_abs_epi8(wv);
                const __mmask64 neg = _mm512_movepi8_mask(wv);
#endif
                for (int t = 0; t < NT; t++) {
                    int32_t v;
                    memcpy(&v, xb + t * K + 4 * s, 4);
                    acc[t] = step(acc[t], wv, aw, neg, v);
                    __asm__("" : "+v"(acc[t])); /* a running sum: see gemm_q8_avx2.c */
                }
            }
            const __m512 dv = _mm512_load_ps(d + p * RG);
            for (int t = 0; t < NT; t++)
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]),
                                       _mm512_mul_ps(dv, _mm512_set1_ps(xd[t * (K / QK8_0) + b])), f[t]);
        }
        for (int t = 0; t < NT; t++) _mm512_store_ps(fa + (t * 8 + j) * RG, f[t]);
    }
}

void GEMM_Q8_NAME(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd, int64_t T,
                  int64_t K, float *y, int64_t ldy, void *panel) {
    const int64_t nb = K / QK8_0;
    const uint8_t *xu = (const uint8_t *)xq;
    int8_t *q = panel;
    float *d = (float *)(q + nb * BQ);
    int32_t *c = (int32_t *)(d + nb * RG);
    _Alignas(64) float fa[TT * 8 * RG];
    for (int64_t r0 = 0; r0 < nrows; r0 += RG) {
        const int nr = nrows - r0 < RG ? (int)(nrows - r0) : RG;
        pack16(w + (size_t)r0 * rb, rb, nr, nb, q, d, c);
        for (int64_t t0 = 0; t0 < T; t0 += TT) {
            const int nt = T - t0 < TT ? (int)(T - t0) : TT;
            const uint8_t *xt = xu + t0 * K;
            const float *dt = xd + t0 * nb;
            switch (nt) {
            case 8: tile(8, q, d, c, nb, xt, dt, K, fa); break;
            case 7: tile(7, q, d, c, nb, xt, dt, K, fa); break;
            case 6: tile(6, q, d, c, nb, xt, dt, K, fa); break;
            case 5: tile(5, q, d, c, nb, xt, dt, K, fa); break;
            case 4: tile(4, q, d, c, nb, xt, dt, K, fa); break;
            case 3: tile(3, q, d, c, nb, xt, dt, K, fa); break;
            case 2: tile(2, q, d, c, nb, xt, dt, K, fa); break;
            default: tile(1, q, d, c, nb, xt, dt, K, fa); break;
            }
            const __mmask16 m = (__mmask16)((1u << nr) - 1);
            for (int t = 0; t < nt; t++) {
                const float *a = fa + t * 8 * RG;
#define A(j) _mm512_load_ps(a + (j) * RG)
                __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(A(0), A(4)), _mm512_add_ps(A(2), A(6))),
                                         _mm512_add_ps(_mm512_add_ps(A(1), A(5)), _mm512_add_ps(A(3), A(7))));
#undef A
                _mm512_mask_storeu_ps(y + (t0 + t) * ldy + r0, m, s);
            }
        }
    }
}
