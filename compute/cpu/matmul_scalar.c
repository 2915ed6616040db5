/* matmul_scalar.c — portable C kernels for cpu_matmul (the fallback level and
 * the reference the SIMD levels are tested against): dequantize a row with
 * st_dequant_row, then plain f32 dot products. */
#include <string.h>

#include "common/dtype.h"
#include "compute/cpu/simd.h"

static void sc_matvec(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, const float *x,
                      int64_t T, int64_t K, float *y, int64_t ldy, float *row) {
    for (int64_t r = 0; r < nrows; r++) {
        st_dequant_row(wtype, w + (size_t)r * rb, row, K);
        for (int64_t t = 0; t < T; t++) {
            const float *xt = x + t * K;
            float s = 0;
            for (int64_t k = 0; k < K; k++) s += xt[k] * row[k];
            y[t * ldy + r] = s;
        }
    }
}

static void sc_to_f32(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, int64_t k0,
                      int64_t kc, float *dst, int64_t ldd) {
    size_t off = ggml_row_bytes(wtype, k0); /* k0 is a multiple of the block size */
    for (int64_t r = 0; r < nrows; r++) st_dequant_row(wtype, w + (size_t)r * rb + off, dst + r * ldd, kc);
}

const cpu_kernels cpu_kernels_scalar = {"scalar", sc_matvec, sc_to_f32, NULL};
