/* simd.h — internal to compute/cpu: the per-SIMD-level kernel tables behind
 * cpu_matmul (matmul.c picks one at run time).
 *
 * Each level lives in its own file compiled with its own target flags:
 * matmul_scalar.c (portable C), matmul_avx2.c and gemm_q8_avx2.c
 * (AVX2+FMA+F16C), matmul_avx512.c and gemm_q8_avx512.c (AVX-512 F+BW+VL),
 * and gemm_q8_vnni.c (the avx512 level's Q8_0 GEMM where the CPU has
 * AVX512-VNNI). Shapes follow matmul.h: W is rows of K
 * elements of `wtype`, `rb` bytes a row; x and y are row-major f32.
 *
 * The canonical summation order. Every level computes every output with the
 * same sequence of IEEE f32 operations, so results are bit-identical across
 * levels (a model gives the same tokens and logprobs on any x86-64 CPU;
 * tests/compute/test_matmul checks the bits). fma() is one rounding.
 *  - Dense matvec (F32/F16/BF16), one weight row w and token row x:
 *    16 lanes, two accumulators E (even) and O (odd). Chunk c = elements
 *    [16c, 16c+16); for c < 2*floor(K/32) lane i does
 *    acc_c%2[i] = fma(w[16c+i], x[16c+i], acc[i]); the remaining chunks (at
 *    most two, the last one partial, missing elements count as 0*0) all go to
 *    E. Then s = E + O lane-wise, and the tree s[i] + s[i+8] (i < 8), then
 *    [i] + [i+4], [i] + [i+2], [0] + [1] (GCC's _mm512_reduce_add_ps).
 *  - Q4_0 matvec: 16 lanes, one accumulator; for each block with scale d,
 *    lane i: acc[i] = fma(fma(q[16+i], x[16+i], q[i] * x[i]), d, acc[i]);
 *    then the same tree.
 *  - Q8_0 matvec (as llama.cpp: integer dot products against activations
 *    quantized to Q8_0, cpu_quantize_q8 in matmul.c): for block b,
 *    isum = sum of q_w * q_x (exact int32), and
 *    acc[b % 8] = fma((float)isum, d_w * d_x, acc[b % 8]) over 8 lanes,
 *    reduced as (a0+a4)+(a2+a6) + (a1+a5)+(a3+a7).
 *    The Q8_0 GEMM (T >= the matvec threshold) computes the same order, so
 *    a Q8_0 output does not depend on T: gemm_q8_avx2.c and gemm_q8_avx512.c
 *    keep each row's isum in a lane of its own (rows x 4 columns per
 *    register) and the 8 accumulators apart, reduced by the same tree.
 *  - GEMM (T >= the matvec threshold, other types): weights converted
 *    exactly to f32, each output a sequential sum y = fma(w[k], x[k], y)
 *    over k = 0..K-1.
 */
#ifndef STRATA_COMPUTE_CPU_SIMD_H
#define STRATA_COMPUTE_CPU_SIMD_H

#include <stddef.h>
#include <stdint.h>

enum cpu_simd { CPU_SIMD_SCALAR = 0, CPU_SIMD_AVX2 = 1, CPU_SIMD_AVX512 = 2 };

/* Own GEMM blocking: MR weight rows × up to 64 tokens (AVX-512) or 16
 * tokens (AVX2) per micro-kernel, NB weight rows and KC columns of K per converted W tile. */
#define CPU_GEMM_MR 6
#define CPU_GEMM_NB 96 /* multiple of CPU_GEMM_MR */
#define CPU_GEMM_KC 128 /* multiple of 32 (the Q8_0/Q4_0 block) */
#define CPU_GEMM_TC 256 /* tokens per packed chunk of x */

/* Arguments of the own GEMM (matmul.c) for one chunk of tokens: y[t*N + n] =
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
    /* Q8_0 weights: y[t*ldy + r] = dot of row r with activation row t, given
     * as Q8_0 blocks: xq[t*K + k] the int8 values, xd[t*(K/32) + b] the
     * block scales (f16-rounded, as f32). */
    void (*matvec_q8)(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd,
                      int64_t T, int64_t K, float *y, int64_t ldy);
    /* dst[r*ldd + i] = W[r][k0 + i] for i < kc, r < nrows; k0 and kc are
     * multiples of the type's block size (kc may end at K). */
    void (*to_f32)(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, int64_t k0,
                   int64_t kc, float *dst, int64_t ldd);
    /* The GEMM micro-kernel (matmul.c's gemm_rows drives it over tiles):
     * C[i*ldc + t] = (first ? 0 : C[i*ldc + t]) + sum_{k < kc} A[i*lda + k] * B[k*ldb + t]
     * for i < CPU_GEMM_MR, t < nt, as sequential FMAs over k. nt is a
     * multiple of 16 up to gemm_tokens; B and C rows are 64-byte aligned. */
    void (*micro)(int64_t kc, const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc,
                  int first, int nt);
    int gemm_tokens;
    /* Q8_0 weights, T >= the matvec threshold: the same outputs as
     * matvec_q8 (the same bits) from a register-tiled integer GEMM
     * (gemm_q8_avx2.c, gemm_q8_avx512.c). panel: CPU_Q8_PANEL_BYTES(K) bytes,
     * 64-byte aligned, per thread. NULL: matmul.c runs matvec_q8. */
    void (*gemm_q8)(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd, int64_t T,
                    int64_t K, float *y, int64_t ldy, void *panel);
    /* cpu_quantize_q8 (matmul.h), the same bits. */
    void (*quantize_q8)(const float *x, int64_t n, int8_t *q, float *d);
} cpu_kernels;

extern const cpu_kernels cpu_kernels_scalar;
extern const cpu_kernels cpu_kernels_avx2;
extern const cpu_kernels cpu_kernels_avx512;

/* Packed weight panel of the Q8_0 GEMMs: per block of 32 columns, 16 rows'
 * quants (512 bytes), scales (64) and bias corrections (64). Rows are split
 * over threads in multiples of CPU_Q8_ROWS. */
#define CPU_Q8_PANEL_BYTES(K) ((size_t)((K) / 32) * 640)
#define CPU_Q8_ROWS 16

void cpu_gemm_q8_avx2(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd, int64_t T,
                      int64_t K, float *y, int64_t ldy, void *panel);
void cpu_quantize_q8_avx2(const float *x, int64_t n, int8_t *q, float *d);
void cpu_gemm_q8_avx512(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd, int64_t T,
                        int64_t K, float *y, int64_t ldy, void *panel);
/* AVX512-VNNI: xq holds the activations biased by 128 (xq ^ 0x80, as u8). */
void cpu_gemm_q8_vnni(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd, int64_t T,
                      int64_t K, float *y, int64_t ldy, void *panel);

/* The AVX2 Q8_0 matvec, which the AVX-512 level shares. */
void cpu_matvec_q8_avx2(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd,
                        int64_t T, int64_t K, float *y, int64_t ldy);

#endif
