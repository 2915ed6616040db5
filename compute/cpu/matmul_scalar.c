/* matmul_scalar.c — portable C kernels for cpu_matmul: the fallback level
 * for CPUs without AVX2, and the plainest statement of the canonical
 * summation order of simd.h (the SIMD levels give the same bits). Weights
 * are dequantized a row at a time with st_dequant_row (exact), products and
 * sums use fmaf (one rounding, as the SIMD FMAs; glibc's fmaf is the
 * hardware instruction where the CPU has one). */
#include <math.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cpu/matmul.h"
#include "compute/cpu/simd.h"

/* The canonical tree over 16 lanes: [i] + [i+8], [i] + [i+4], [i] + [i+2], [0] + [1]. */
static float reduce16(float s[16]) {
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) s[i] = s[i] + s[i + w];
    return s[0];
}

static float dot_dense(const float *w, const float *x, int64_t K) {
    float acc[2][16] = {{0}};
    const int64_t paired = K / 32 * 2; /* chunks that alternate between E and O */
    for (int64_t c = 0; 16 * c < K; c++) {
        float *a = acc[c < paired ? c % 2 : 0];
        for (int i = 0; i < 16 && 16 * c + i < K; i++) a[i] = fmaf(w[16 * c + i], x[16 * c + i], a[i]);
    }
    float s[16];
    for (int i = 0; i < 16; i++) s[i] = acc[0][i] + acc[1][i];
    return reduce16(s);
}

static float dot_q4_0(const uint8_t *wr, const float *x, int64_t K) {
    float acc[16] = {0};
    for (int64_t k = 0; k < K; k += QK4_0, wr += 2 + QK4_0 / 2) {
        uint16_t dh;
        memcpy(&dh, wr, 2);
        const float d = st_fp16_to_f32(dh);
        for (int i = 0; i < 16; i++) {
            const float q0 = (float)((wr[2 + i] & 15) - 8), q1 = (float)((wr[2 + i] >> 4) - 8);
            acc[i] = fmaf(fmaf(q1, x[k + 16 + i], q0 * x[k + i]), d, acc[i]);
        }
    }
    return reduce16(acc);
}

static void sc_matvec(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, const float *x,
                      int64_t T, int64_t K, float *y, int64_t ldy, float *row) {
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *wr = w + (size_t)r * rb;
        if (wtype != GGML_TYPE_Q4_0) st_dequant_row(wtype, wr, row, K);
        for (int64_t t = 0; t < T; t++)
            y[t * ldy + r] = wtype == GGML_TYPE_Q4_0 ? dot_q4_0(wr, x + t * K, K) : dot_dense(row, x + t * K, K);
    }
}

static void sc_matvec_q8(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd,
                         int64_t T, int64_t K, float *y, int64_t ldy) {
    const int64_t nb = K / QK8_0;
    for (int64_t r = 0; r < nrows; r++) {
        for (int64_t t = 0; t < T; t++) {
            const uint8_t *b = w + (size_t)r * rb;
            const int8_t *xt = xq + t * K;
            float acc[8] = {0};
            for (int64_t i = 0; i < nb; i++, b += 2 + QK8_0) {
                int32_t isum = 0;
                for (int j = 0; j < QK8_0; j++) isum += (int32_t)(int8_t)b[2 + j] * xt[i * QK8_0 + j];
                uint16_t dh;
                memcpy(&dh, b, 2);
                acc[i % 8] = fmaf((float)isum, st_fp16_to_f32(dh) * xd[t * nb + i], acc[i % 8]);
            }
            float s[4];
            for (int j = 0; j < 4; j++) s[j] = acc[j] + acc[j + 4];
            y[t * ldy + r] = (s[0] + s[2]) + (s[1] + s[3]);
        }
    }
}

static void sc_to_f32(uint32_t wtype, const uint8_t *w, size_t rb, int64_t nrows, int64_t k0,
                      int64_t kc, float *dst, int64_t ldd) {
    size_t off = ggml_row_bytes(wtype, k0); /* k0 is a multiple of the block size */
    for (int64_t r = 0; r < nrows; r++) st_dequant_row(wtype, w + (size_t)r * rb + off, dst + r * ldd, kc);
}

/* The canonical GEMM micro-kernel: sequential fmaf over k per output. */
static void sc_micro(int64_t kc, const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc,
                     int first, int nt) {
    for (int i = 0; i < CPU_GEMM_MR; i++)
        for (int t = 0; t < nt; t++) {
            float s = first ? 0.0f : C[i * ldc + t];
            for (int64_t k = 0; k < kc; k++) s = fmaf(A[i * lda + k], B[k * ldb + t], s);
            C[i * ldc + t] = s;
        }
}

const cpu_kernels cpu_kernels_scalar = {"scalar", sc_matvec, sc_matvec_q8, sc_to_f32, sc_micro, 16, NULL, cpu_quantize_q8};
