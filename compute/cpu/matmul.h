/* matmul.h — the CPU matrix multiply every linear layer goes through.
 *
 *   y[T, N] = x[T, K] · W[N, K]^T
 *
 * x and y are row-major f32. W is N rows of K elements in `wtype` (enum
 * ggml_type: F32, F16, BF16, Q8_0 or Q4_0), laid out as in GGUF (ne = [K, N]).
 * T = 1 is decode (a matvec that must stream W at memory bandwidth); T > 1 is
 * prefill. Work is split over the pool's threads by rows of W.
 * Returns 0, or -1 with err for an unsupported wtype or a K that is not a
 * multiple of the block size.
 */
#ifndef STRATA_COMPUTE_CPU_MATMUL_H
#define STRATA_COMPUTE_CPU_MATMUL_H

#include <stdint.h>

#include "common/err.h"
#include "compute/cpu/threadpool.h"

int cpu_matmul(st_pool *pool, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
               int64_t K, int64_t N, st_err *err);

/* The SIMD level chosen at run time: "avx512", "avx2", or "scalar" — the
 * best the CPU has, or a lower one forced by STRATA_SIMD=scalar|avx2|avx512. */
const char *cpu_simd_level(void);

/* Forces the SIMD level for the whole process (tests and benchmarks; not
 * thread-safe against concurrent cpu_matmul calls). Returns -1 with err for an
 * unknown name or a level this CPU lacks. */
int cpu_matmul_set_level(const char *level, st_err *err);

/* T below this takes the matvec path (CPU_MATVEC_MAX_T, or
 * STRATA_MATVEC_MAX_T), else the GEMM. */
int cpu_matmul_matvec_max_t(void);

/* Sets that threshold for the whole process (tests and benchmarks, like
 * cpu_matmul_set_level). 1 sends every call to the GEMM (for Q8_0 weights
 * the integer GEMM, which gives the matvec's bits). */
void cpu_matmul_set_matvec_max_t(int t);

/* 1: Q8_0 weights are widened to f32 and multiplied by the unquantized
 * activations through the float GEMM at every T (the dequantized-float
 * reference of the tests; process-wide like cpu_matmul_set_level). 0 (the
 * default): integer dot products against Q8_0-quantized activations. */
void cpu_matmul_set_q8_float(int on);

/* 1 when Q8_0 prefill uses the AVX512-VNNI kernel: the avx512 level on a
 * CPU with AVX512-VNNI (a sub-feature of that level, not a level of its
 * own: the results are the same bits either way). */
int cpu_matmul_vnni(void);

/* Turns that use of AVX512-VNNI off (0) or back on (1: -1 with err where the
 * CPU lacks it); tests and benchmarks, process-wide like cpu_matmul_set_level. */
int cpu_matmul_set_vnni(int on, st_err *err);

/* Quantizes n floats (a multiple of 32) to Q8_0 blocks as ggml's AVX2
 * quantize_row_q8_0 does: per block of 32, amax = max |x|, scale
 * d[b] = f16(amax / 127) (stored widened to f32), q = round-half-even(x * 127 / amax)
 * (0 for an all-zero block; NaN becomes 0). q: n int8 values, d: n/32 scales. */
void cpu_quantize_q8(const float *x, int64_t n, int8_t *q, float *d);

/* Prefill through OpenBLAS sgemm instead of the own GEMM (benchmarks; also
 * STRATA_GEMM=blas). Its summation order is OpenBLAS's, not simd.h's. */
void cpu_matmul_set_blas_gemm(int on);

#endif
