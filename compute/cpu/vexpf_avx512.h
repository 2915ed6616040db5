/* vexpf_avx512.h — expf on 16 floats at once with AVX-512F, bit-identical to
 * glibc's expf (the FMA variant, __expf_fma, that glibc >= 2.27 selects on
 * CPUs with FMA). Include only from files compiled with -mavx512f and
 * -ffp-contract=off (the products and sums below must stay as written).
 *
 * glibc's algorithm (sysdeps/ieee754/flt-32/e_expf.c, Szabolcs Nagy, ARM):
 * in double, z = x * 32/ln2 = k + r with k rounded to an integer (by adding
 * 0x1.8p52), 2^(k/32) = tab[k % 32] + (k << 47) as bits, and
 * exp(x) ~= 2^(k/32) * (C0 r^3 + C1 r^2 + C2 r + 1), rounded to float once.
 * The operations and their FMA contractions are those of libm's
 * __expf_fma (disassembled): z = fma(InvLn2N, x, SHIFT); kd = z - SHIFT;
 * r = fma(InvLn2N, x, -kd); p = fma(r, C0, C1); q = fma(r, C2, 1);
 * y = fma(p, r*r, q) * s. The constants are glibc's __exp2f_data.
 * Lanes with |x| >= 88 (or inf/NaN) take glibc's special-case path, so they
 * call expf itself. tests/compute/test_vexpf checks the identity with libm
 * over (a stride of) every float below 88 in magnitude. */
#ifndef STRATA_COMPUTE_CPU_VEXPF_AVX512_H
#define STRATA_COMPUTE_CPU_VEXPF_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "compute/cpu/vexpf_table.h"

static inline __attribute__((always_inline)) __m512d st_vexpf_bits(uint64_t b) {
    return _mm512_castsi512_pd(_mm512_set1_epi64((long long)b));
}

/* 8 lanes, x already widened to double; valid for |x| < 88. */
static inline __attribute__((always_inline)) __m256 st_vexpf_core8(__m512d xd) {
    const __m512d invln2n = st_vexpf_bits(0x40471547652b82feull); /* 32/ln2 */
    const __m512d shift = st_vexpf_bits(0x4338000000000000ull);   /* 0x1.8p52 */
    const __m512d c0 = st_vexpf_bits(0x3ebc6af84b912394ull);
    const __m512d c1 = st_vexpf_bits(0x3f2ebfce50fac4f3ull);
    const __m512d c2 = st_vexpf_bits(0x3f962e42ff0c52d6ull);
    const __m512d one = _mm512_set1_pd(1.0);
    __m512d z = _mm512_fmadd_pd(invln2n, xd, shift);
    __m512i ki = _mm512_castpd_si512(z);
    __m512d kd = _mm512_sub_pd(z, shift);
    __m512d r = _mm512_fmsub_pd(invln2n, xd, kd);
    const __m512i *tb = (const __m512i *)st_vexpf_tab;
    __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    __m512i lo = _mm512_permutex2var_epi64(_mm512_load_si512(tb), idx, _mm512_load_si512(tb + 1));
    __m512i hi = _mm512_permutex2var_epi64(_mm512_load_si512(tb + 2), idx, _mm512_load_si512(tb + 3));
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), lo, hi);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    __m512d s = _mm512_castsi512_pd(t);
    __m512d p = _mm512_fmadd_pd(r, c0, c1);
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d q = _mm512_fmadd_pd(r, c2, one);
    __m512d y = _mm512_mul_pd(_mm512_fmadd_pd(p, r2, q), s);
    return _mm512_cvtpd_ps(y);
}

/* expf of 16 lanes, bit-identical to glibc's expf. */
static inline __attribute__((always_inline)) __m512 st_vexpf16(__m512 x) {
    __m256 lo = st_vexpf_core8(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    __m256 hi = st_vexpf_core8(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
    __m512 y = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
    /* glibc's special cases: top 12 bits of |x| >= those of 88.0f */
    __m512i abstop = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7ff));
    __mmask16 sp = _mm512_cmpgt_epi32_mask(abstop, _mm512_set1_epi32(0x42a));
    if (__builtin_expect(sp != 0, 0)) {
        float xs[16], ys[16];
        _mm512_storeu_ps(xs, x);
        _mm512_storeu_ps(ys, y);
        for (int i = 0; i < 16; i++)
            if (sp & (1u << i)) ys[i] = expf(xs[i]);
        y = _mm512_loadu_ps(ys);
    }
    return y;
}

#endif
