/* dtype.c — type table, fp16/bf16 conversions and row dequantizers (see dtype.h). */
#include "common/dtype.h"

#include <math.h>
#include <string.h>

const char *ggml_type_name(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return "f32";
    case GGML_TYPE_F16: return "f16";
    case GGML_TYPE_Q4_0: return "q4_0";
    case GGML_TYPE_Q4_1: return "q4_1";
    case GGML_TYPE_Q5_0: return "q5_0";
    case GGML_TYPE_Q5_1: return "q5_1";
    case GGML_TYPE_Q8_0: return "q8_0";
    case GGML_TYPE_Q8_1: return "q8_1";
    case GGML_TYPE_Q2_K: return "q2_K";
    case GGML_TYPE_Q3_K: return "q3_K";
    case GGML_TYPE_Q4_K: return "q4_K";
    case GGML_TYPE_Q5_K: return "q5_K";
    case GGML_TYPE_Q6_K: return "q6_K";
    case GGML_TYPE_Q8_K: return "q8_K";
    case GGML_TYPE_IQ2_XXS: return "iq2_xxs";
    case GGML_TYPE_IQ2_XS: return "iq2_xs";
    case GGML_TYPE_IQ3_XXS: return "iq3_xxs";
    case GGML_TYPE_IQ1_S: return "iq1_s";
    case GGML_TYPE_IQ4_NL: return "iq4_nl";
    case GGML_TYPE_IQ3_S: return "iq3_s";
    case GGML_TYPE_IQ2_S: return "iq2_s";
    case GGML_TYPE_IQ4_XS: return "iq4_xs";
    case GGML_TYPE_I8: return "i8";
    case GGML_TYPE_I16: return "i16";
    case GGML_TYPE_I32: return "i32";
    case GGML_TYPE_I64: return "i64";
    case GGML_TYPE_F64: return "f64";
    case GGML_TYPE_IQ1_M: return "iq1_m";
    case GGML_TYPE_BF16: return "bf16";
    default: return "unknown";
    }
}

bool ggml_type_supported(uint32_t type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 ||
           type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0;
}

int ggml_block_size(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q8_0: return QK8_0;
    case GGML_TYPE_Q4_0: return QK4_0;
    default: return 1;
    }
}

size_t ggml_row_bytes(uint32_t type, int64_t n) {
    if (n < 0) return 0;
    switch (type) {
    case GGML_TYPE_F32: return (size_t)n * 4;
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16: return (size_t)n * 2;
    case GGML_TYPE_Q8_0: return n % QK8_0 ? 0 : (size_t)(n / QK8_0) * (2 + QK8_0);
    case GGML_TYPE_Q4_0: return n % QK4_0 ? 0 : (size_t)(n / QK4_0) * (2 + QK4_0 / 2);
    default: return 0;
    }
}

/* IEEE half -> single, exact for all inputs (normals, subnormals, inf, NaN). */
float st_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* single -> half with round-to-nearest-even (as F16C's vcvtps2ph with imm 0). */
uint16_t st_f32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow -> inf */
    if (absx < 0x38800000u) { /* result is subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absx >> 23, m = (absx & 0x7fffff) | 0x800000;
        int shift = 126 - (int)e; /* 14..24 */
        uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = absx + 0xfff + ((absx >> 13) & 1); /* round to nearest even */
    r -= 0x38000000u;                                /* rebias 127 -> 15 */
    return (uint16_t)(sign | (r >> 13));
}

float st_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t st_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

int st_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(dst, s, (size_t)n * 4);
        return 0;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = st_fp16_to_f32(rd16(s + 2 * i));
        return 0;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = st_bf16_to_f32(rd16(s + 2 * i));
        return 0;
    case GGML_TYPE_Q8_0: /* block: f16 d, int8 qs[32]; x = d * q */
        if (n % QK8_0) return -1;
        for (int64_t b = 0; b < n / QK8_0; b++, s += 2 + QK8_0) {
            float d = st_fp16_to_f32(rd16(s));
            for (int i = 0; i < QK8_0; i++) dst[b * QK8_0 + i] = d * (float)(int8_t)s[2 + i];
        }
        return 0;
    case GGML_TYPE_Q4_0: /* block: f16 d, qs[16]; low nibbles are x[0..15], high x[16..31]; x = d*(q-8) */
        if (n % QK4_0) return -1;
        for (int64_t b = 0; b < n / QK4_0; b++, s += 2 + QK4_0 / 2) {
            float d = st_fp16_to_f32(rd16(s));
            for (int i = 0; i < QK4_0 / 2; i++) {
                dst[b * QK4_0 + i] = d * (float)((s[2 + i] & 0x0f) - 8);
                dst[b * QK4_0 + i + QK4_0 / 2] = d * (float)((s[2 + i] >> 4) - 8);
            }
        }
        return 0;
    default:
        return -1;
    }
}
