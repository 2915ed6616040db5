/* dtype.h — tensor element types (ggml's on-disk ids), their sizes, and the
 * scalar conversions and row dequantizers for the loadable types.
 * Source for the layouts: ggml's ggml-common.h (block_q8_0, block_q4_0) and
 * ggml.c (fp16/bf16 conversion, round-to-nearest-even).
 * No model knowledge lives here; model/ and compute/ both build on it.
 */
#ifndef STRATA_COMMON_DTYPE_H
#define STRATA_COMMON_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Tensor element types (ggml's enum ggml_type; values are on-disk ids). Only
 * F32, F16, BF16, Q8_0 and Q4_0 can be loaded; the others are recognised by
 * name so that refusing them gives a clear message. */
enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_COUNT = 40
};

/* Block sizes of the loadable quantized types (ggml-common.h). */
#define QK8_0 32 /* block_q8_0: f16 scale + 32 x int8  = 34 bytes */
#define QK4_0 32 /* block_q4_0: f16 scale + 16 bytes of nibbles = 18 bytes */

/* Name of a ggml type ("f32", "q4_K", ...) or "unknown". */
const char *ggml_type_name(uint32_t type);
/* True for the types this reader can load and dequantize. */
bool ggml_type_supported(uint32_t type);
/* Bytes of a row of n elements of `type`; 0 when n is not a multiple of the
 * block size or the type is unsupported. */
size_t ggml_row_bytes(uint32_t type, int64_t n);
/* Elements per block (1 for F32/F16/BF16, 32 for Q8_0/Q4_0). */
int ggml_block_size(uint32_t type);

/* Scalar conversions used by the dequantizers (exact, IEEE round-to-nearest-even). */
float st_fp16_to_f32(uint16_t h);
uint16_t st_f32_to_fp16(float f);
float st_bf16_to_f32(uint16_t h);
uint16_t st_f32_to_bf16(float f);

/* Dequantizes one row of n elements of `type` at src into dst (n floats).
 * Returns 0, or -1 when the type is unsupported or n is not a multiple of the
 * block size. */
int st_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

#endif
