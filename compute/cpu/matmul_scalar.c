/* matmul_scalar.c — portable C kernels for cpu_matmul: the fallback level
 * for CPUs without AVX2, and the plainest statement of the canonical
 * summation order of simd.h (the SIMD levels give the same bits). Weights
 * are dequantized a row at a time with st_dequant_row (exact), products and
 * sums use fmaf (one rounding, as the SIMD FMAs; glibc's fmaf is the
 * hardware instruction where the CPU has one). */
#include <math.h>
#include <string.h>

#include "common/dtype.h"
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

/* The canonical GEMM: sequential fmaf over k per output. Tiles of
 * CPU_GEMM_NB rows × CPU_GEMM_KC columns are converted to f32 (wc) and the
 * partial sums kept in cbuf between tiles, as the SIMD levels do. */
static void sc_gemm(const cpu_gemm_args *a, int64_t n_lo, int64_t n_hi, float *wc, float *cbuf) {
    const int64_t K = a->K, Tp = a->Tp;
    for (int64_t nb0 = n_lo; nb0 < n_hi; nb0 += CPU_GEMM_NB) {
        const int64_t nb = n_hi - nb0 < CPU_GEMM_NB ? n_hi - nb0 : CPU_GEMM_NB;
        for (int64_t k0 = 0; k0 < K; k0 += CPU_GEMM_KC) {
            const int64_t kc = K - k0 < CPU_GEMM_KC ? K - k0 : CPU_GEMM_KC;
            sc_to_f32(a->wtype, a->w + (size_t)nb0 * a->rb, a->rb, nb, k0, kc, wc, kc);
            for (int64_t n = 0; n < nb; n++)
                for (int64_t t = 0; t < a->T; t++) {
                    float s = k0 == 0 ? 0.0f : cbuf[n * Tp + t];
                    for (int64_t k = 0; k < kc; k++) s = fmaf(wc[n * kc + k], a->xp[(k0 + k) * Tp + t], s);
                    cbuf[n * Tp + t] = s;
                }
        }
        for (int64_t t = 0; t < a->T; t++)
            for (int64_t n = 0; n < nb; n++) a->y[t * a->N + nb0 + n] = cbuf[n * Tp + t];
    }
}

const cpu_kernels cpu_kernels_scalar = {"scalar", sc_matvec, sc_matvec_q8, sc_to_f32, sc_gemm};
