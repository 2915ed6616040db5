/* gemm_q8_avx2.c — the Q8_0 GEMM of the AVX2 level (compiled with -mavx2
 * -mfma -mf16c; also the AVX-512 level's where the CPU lacks AVX512-VNNI).
 *
 * Prefill with Q8_0 weights multiplies in integers, as llama.cpp does: the
 * token rows are quantized to Q8_0 once per call (matmul.c) and every block
 * is an exact int32 dot product. Its outputs are the canonical Q8_0 order of
 * simd.h, the same bits as the matvec: per output, acc[b % 8] =
 * fma((float)isum_b, d_w * d_x, acc[b % 8]) over the blocks b in order, then
 * (a0+a4)+(a2+a6) + (a1+a5)+(a3+a7).
 *
 * Layout: a group of 8 weight rows is packed once (a panel) so that one ymm
 * holds the same 4 columns of the 8 rows ("step" s of a block: bytes
 * w[r][4s..4s+3] at r*4), followed by their absolute values. A step of one token is then 4 activation bytes
 * broadcast; |w| * sign(x, w) pairs (maddubs, no saturation as |x| <= 127)
 * and madd with ones give each lane (row) the sum of those 4 products, so a
 * block's 8 steps leave every row's isum in its own lane: no horizontal sums.
 * Panel blocks are stored j-major (b % 8 = 0 first, then 1, ...), so the
 * float accumulators of one j (4 tokens x 8 rows) stay in registers.
 */
#include <immintrin.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cpu/simd.h"

#define AI static inline __attribute__((always_inline))
#define RG 8   /* weight rows per panel (lanes) */
#define TT 6   /* tokens per register tile */
#define BQ (2 * RG * QK8_0) /* panel bytes of one block: quants, then their absolute values */

AI float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Packs rows [0, nr) (nr <= 8; missing rows are zero blocks with scale 0)
 * of W into q (nb blocks of BQ bytes) and d (nb x 8 scales), j-major. The
 * 8 rows x 8 dwords of a block are transposed so that out[s] holds dword s
 * of every row. */
static void pack8(const uint8_t *w, size_t rb, int nr, int64_t nb, int8_t *q, float *d) {
    int64_t base[8]; /* panel position of block j: blocks with a smaller b % 8 come first */
    for (int j = 0, acc = 0; j < 8; j++) base[j] = acc, acc += (int)((nb - j + 7) / 8);
    for (int64_t b = 0; b < nb; b++) { /* in memory order: the rows stream sequentially */
        const int64_t p = base[b % 8] + b / 8;
        __m256i r[8];
        for (int i = 0; i < RG; i++) {
            if (i < nr) {
                const uint8_t *blk = w + (size_t)i * rb + (size_t)b * (2 + QK8_0);
                r[i] = _mm256_loadu_si256((const __m256i *)(blk + 2));
                d[p * RG + i] = ld_f16(blk);
            } else {
                r[i] = _mm256_setzero_si256();
                d[p * RG + i] = 0.0f;
            }
        }
        __m256i t[8], u[8];
        for (int i = 0; i < 4; i++) {
            t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for (int h = 0; h < 2; h++) { /* rows 0-3, then 4-7 */
            u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
            u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
            u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
            u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
        }
        __m256i *o = (__m256i *)(q + p * BQ);
        for (int s = 0; s < 4; s++) {
            o[s] = _mm256_permute2x128_si256(u[s], u[4 + s], 0x20);
            o[4 + s] = _mm256_permute2x128_si256(u[s], u[4 + s], 0x31);
        }
        for (int s = 0; s < 8; s++) o[8 + s] = _mm256_abs_epi8(o[s]);
    }
}

AI __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* NT tokens (rows of xq, K bytes apart) against one packed panel; fa[(t*8 +
 * j)*8 + r] receives accumulator j of token t, row r. */
AI __m256i step(__m256i aw, __m256i wv, const int8_t *x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(x), wv)), _mm256_set1_epi16(1));
}

AI void tile(const int NT, const int8_t *q, const float *d, int64_t nb, const int8_t *xq, const float *xd,
             int64_t K, float *fa) {
    for (int i = 0; i < NT * 8; i++) _mm256_store_ps(fa + i * RG, _mm256_setzero_ps());
    int64_t p = 0;
    for (int j = 0; j < 8; j++) {
        for (int64_t b = j; b < nb; b += 8, p++) {
            const __m256i *qp = (const __m256i *)(q + p * BQ);
            const int8_t *xb = xq + b * QK8_0;
            __m256i acc[TT];
            {
                const __m256i wv = _mm256_load_si256(qp), aw = _mm256_load_si256(qp + 8);
                for (int t = 0; t < NT; t++) acc[t] = step(aw, wv, xb + t * K);
            }
            for (int s = 1; s < 8; s++) {
                const __m256i wv = _mm256_load_si256(qp + s), aw = _mm256_load_si256(qp + 8 + s);
                for (int t = 0; t < NT; t++) {
                    acc[t] = _mm256_add_epi32(acc[t], step(aw, wv, xb + t * K + 4 * s));
                    /* A running sum: without this barrier GCC reassociates
                     * the adds, keeps all 48 products of a block alive and
                     * spills them to the stack (~6% of the kernel's speed). */
                    __asm__("" : "+x"(acc[t]));
                }
            }
            const __m256 dv = _mm256_load_ps(d + p * RG);
            for (int t = 0; t < NT; t++) {
                float *f = fa + (t * 8 + j) * RG;
                _mm256_store_ps(f, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t]),
                                                   _mm256_mul_ps(dv, _mm256_set1_ps(xd[t * (K / QK8_0) + b])),
                                                   _mm256_load_ps(f)));
            }
        }
    }
}

void cpu_gemm_q8_avx2(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd, int64_t T,
                      int64_t K, float *y, int64_t ldy, void *panel) {
    const int64_t nb = K / QK8_0;
    int8_t *q = panel;
    float *d = (float *)(q + nb * BQ);
    _Alignas(32) float fa[TT * 8 * RG];
    for (int64_t r0 = 0; r0 < nrows; r0 += RG) {
        const int nr = nrows - r0 < RG ? (int)(nrows - r0) : RG;
        pack8(w + (size_t)r0 * rb, rb, nr, nb, q, d);
        /* The next panel's rows come from DRAM: prefetch a slice of them per
         * token tile (into L2), so that packing it does not wait on memory
         * (8 rows of short pieces are too many streams for the hardware
         * prefetcher to start on time). */
        const int64_t nn = nrows - (r0 + RG) < RG ? nrows - (r0 + RG) : RG;
        const char *pw = (const char *)w + (size_t)(r0 + RG) * rb;
        const size_t plen = nn > 0 ? (size_t)nn * rb : 0, ntiles = (size_t)((T + TT - 1) / TT);
        const size_t pstep = (plen / ntiles + 63) & ~(size_t)63;
        size_t pdone = 0;
        for (int64_t t0 = 0; t0 < T; t0 += TT) {
            const int nt = T - t0 < TT ? (int)(T - t0) : TT;
            for (const size_t e = pdone + pstep; pdone < plen && pdone < e; pdone += 64)
                __builtin_prefetch(pw + pdone, 0, 2); /* the rows are contiguous, rb apart */
            const int8_t *xt = xq + t0 * K;
            const float *dt = xd + t0 * nb;
            switch (nt) {
            case 6: tile(6, q, d, nb, xt, dt, K, fa); break;
            case 5: tile(5, q, d, nb, xt, dt, K, fa); break;
            case 4: tile(4, q, d, nb, xt, dt, K, fa); break;
            case 3: tile(3, q, d, nb, xt, dt, K, fa); break;
            case 2: tile(2, q, d, nb, xt, dt, K, fa); break;
            default: tile(1, q, d, nb, xt, dt, K, fa); break;
            }
            for (int t = 0; t < nt; t++) {
                const float *a = fa + t * 8 * RG;
#define A(j) _mm256_load_ps(a + (j) * RG)
                __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A(0), A(4)), _mm256_add_ps(A(2), A(6))),
                                         _mm256_add_ps(_mm256_add_ps(A(1), A(5)), _mm256_add_ps(A(3), A(7))));
#undef A
                float *yt = y + (t0 + t) * ldy + r0;
                if (nr == RG) {
                    _mm256_storeu_ps(yt, s);
                } else {
                    float tmp[RG];
                    _mm256_storeu_ps(tmp, s);
                    memcpy(yt, tmp, sizeof(float) * (size_t)nr);
                }
            }
        }
    }
}

/* cpu_quantize_q8 (matmul.c) in AVX2, the same bits: amax ignores NaN
 * (max_ps returns its second operand when the first is NaN, as fmaxf), the
 * scale is amax/127 rounded to f16 (F16C, round to nearest even),
 * _mm256_round_ps rounds half to even as nearbyintf, and NaN becomes 0. */
void cpu_quantize_q8_avx2(const float *x, int64_t n, int8_t *q, float *d) {
    const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const float *xb = x + b * QK8_0;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        d[b] = _cvtsh_ss(_cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT));
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        __m256i iv[4];
        for (int i = 0; i < 4; i++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256 ord = _mm256_cmp_ps(r, r, _CMP_ORD_Q);
            r = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(r, lo), hi), ord);
            iv[i] = _mm256_cvtps_epi32(r);
        }
        /* packs work per 128-bit lane: restore the element order after. */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + b * QK8_0), p);
    }
}
