/* vexpf_avx2.h — expf on 8 floats at once with AVX2+FMA, bit-identical to
 * glibc's expf: the algorithm, constants and FMA contractions of
 * vexpf_avx512.h (which derives them from glibc's __expf_fma), on 4 double
 * lanes per ymm, with the 32-entry 2^(k/32) table read by a 64-bit gather.
 * Include only from files compiled with -mavx2 -mfma and -ffp-contract=off.
 * Lanes with |x| >= 88 (or inf/NaN) call expf itself, as there. */
#ifndef STRATA_COMPUTE_CPU_VEXPF_AVX2_H
#define STRATA_COMPUTE_CPU_VEXPF_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "compute/cpu/vexpf_table.h"

static inline __attribute__((always_inline)) __m256d st_vexpf2_bits(uint64_t b) {
    return _mm256_castsi256_pd(_mm256_set1_epi64x((long long)b));
}

/* 4 lanes, x already widened to double; valid for |x| < 88. */
static inline __attribute__((always_inline)) __m128 st_vexpf_core4(__m256d xd) {
    const __m256d invln2n = st_vexpf2_bits(0x40471547652b82feull); /* 32/ln2 */
    const __m256d shift = st_vexpf2_bits(0x4338000000000000ull);   /* 0x1.8p52 */
    const __m256d c0 = st_vexpf2_bits(0x3ebc6af84b912394ull);
    const __m256d c1 = st_vexpf2_bits(0x3f2ebfce50fac4f3ull);
    const __m256d c2 = st_vexpf2_bits(0x3f962e42ff0c52d6ull);
    const __m256d one = _mm256_set1_pd(1.0);
    __m256d z = _mm256_fmadd_pd(invln2n, xd, shift);
    __m256i ki = _mm256_castpd_si256(z);
    __m256d kd = _mm256_sub_pd(z, shift);
    __m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
    __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    __m256i t = _mm256_i64gather_epi64((const long long *)st_vexpf_tab, idx, 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    __m256d s = _mm256_castsi256_pd(t);
    __m256d p = _mm256_fmadd_pd(r, c0, c1);
    __m256d r2 = _mm256_mul_pd(r, r);
    __m256d q = _mm256_fmadd_pd(r, c2, one);
    __m256d y = _mm256_mul_pd(_mm256_fmadd_pd(p, r2, q), s);
    return _mm256_cvtpd_ps(y);
}

/* expf of 8 lanes, bit-identical to glibc's expf. */
static inline __attribute__((always_inline)) __m256 st_vexpf8(__m256 x) {
    __m128 lo = st_vexpf_core4(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    __m128 hi = st_vexpf_core4(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
    __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
    /* glibc's special cases: top 12 bits of |x| >= those of 88.0f */
    __m256i abstop = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
    int sp = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(abstop, _mm256_set1_epi32(0x42a))));
    if (__builtin_expect(sp != 0, 0)) {
        float xs[8], ys[8];
        _mm256_storeu_ps(xs, x);
        _mm256_storeu_ps(ys, y);
        for (int i = 0; i < 8; i++)
            if (sp & (1 << i)) ys[i] = expf(xs[i]);
        y = _mm256_loadu_ps(ys);
    }
    return y;
}

#endif
