/* simd.h — internal to compute/cpu: the per-SIMD-level kernel tables behind
 * cpu_matmul (matmul.c picks one at run time).
 *
 * Each level lives in its own file compiled with its own target flags:
 * matmul_scalar.c (portable C), matmul_avx2.c (AVX2+FMA+F16C) and
 * matmul_avx512.c (AVX-512 F+BW+VL). Shapes follow matmul.h: W is rows of K
 * elements of `wtype`, `rb` bytes a row; x and y are row-major f32.
 */
#ifndef STRATA_COMPUTE_CPU_SIMD_H
#define STRATA_COMPUTE_CPU_SIMD_H

#include <stddef.h>
#include <stdint.h>

enum cpu_simd { CPU_SIMD_SCALAR = 0, CPU_SIMD_AVX2 = 1, CPU_SIMD_AVX512 = 2 };

/* Own GEMM blocking (matmul_avx512.c): MR weight rows × up to 64 tokens per
 * micro-kernel, NB weight rows and KC columns of K per converted W tile. */
#define CPU_GEMM_MR 6
#define CPU_GEMM_NB 96 /* multiple of CPU_GEMM_MR */
#define CPU_GEMM_KC 128 /* multiple of 32 (the Q8_0/Q4_0 block) */
#define CPU_GEMM_TC 256 /* tokens per packed chunk of x */

/* Arguments of the own GEMM for one chunk of tokens: y[t*N + n] =
 * sum_k xp[k*Tp + t] * W[n][k] for t < T; xp holds x transposed, its token
 * dimension padded with zeros to Tp (a multiple of 16). */
typedef struct {
    const uint8_t *w;
    size_t rb;
    uint32_t wtype;
    int64_t K, N;
    const float *xp;
    int64_t T, Tp;
    float *y;
} cpu_gemm_args;

typedef struct {
    const char *name;
    /* y[t*ldy + r] = sum_k x[t*K + k] * W[r][k] for r < nrows, t < T.
     * scratch holds K floats (used by the scalar level). */
    void (*matvec)(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, const float *x,
                   int64_t T, int64_t K, float *y, int64_t ldy, float *scratch);
    /* dst[r*ldd + i] = W[r][k0 + i] for i < kc, r < nrows; k0 and kc are
     * multiples of the type's block size (kc may end at K). */
    void (*to_f32)(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, int64_t k0,
                   int64_t kc, float *dst, int64_t ldd);
    /* Own GEMM over weight rows [n_lo, n_hi), or NULL (use OpenBLAS).
     * wc: CPU_GEMM_NB*CPU_GEMM_KC floats, cbuf: CPU_GEMM_NB*Tp floats, both
     * 64-byte aligned, private to the calling thread. */
    void (*gemm)(const cpu_gemm_args *a, int64_t n_lo, int64_t n_hi, float *wc, float *cbuf);
} cpu_kernels;

extern const cpu_kernels cpu_kernels_scalar;
extern const cpu_kernels cpu_kernels_avx2;
extern const cpu_kernels cpu_kernels_avx512;

#endif
