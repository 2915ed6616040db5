/* ops.c — readable CPU kernels for RMSNorm, RoPE, paged attention (with its
 * softmax), SwiGLU and the residual add. They follow ggml's CPU code
 * (ggml-cpu.c @ llama.cpp c392e50) in their order of operations so that
 * results match llama.cpp closely. The attention kernels here are the scalar
 * reference; ops_attend_head_* dispatch at run time to bit-identical AVX2 /
 * AVX-512 versions (attn_avx2.c, attn_avx512.c). */
#include "compute/cpu/ops.h"

#include <math.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cpu/matmul.h"

void ops_rmsnorm_rows(float *y, const float *x, const float *w, int64_t n, float eps, int64_t r0,
                      int64_t r1) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / (double)n);
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int64_t i = 0; i < n; i++) yr[i] = (xr[i] * scale) * w[i];
    }
}

void ops_rope_rows(float *x, int n_head, int head_dim, int n_rot, const int32_t *pos, float base,
                   const float *ff, int64_t r0, int64_t r1) {
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    float cs[OPS_ROPE_MAX_DIM / 2], sn[OPS_ROPE_MAX_DIM / 2];
    for (int64_t r = r0; r < r1; r++) {
        /* Angles as ggml computes them: theta_i = p * theta_scale^i by repeated
         * multiplication in float, divided by the frequency factor. */
        float theta = (float)pos[r];
        for (int i = 0; i < n_rot / 2; i++) {
            float t = ff ? theta / ff[i] : theta;
            cs[i] = cosf(t);
            sn[i] = sinf(t);
            theta *= theta_scale;
        }
        float *xr = x + r * (int64_t)n_head * head_dim;
        for (int h = 0; h < n_head; h++) {
            float *xh = xr + (int64_t)h * head_dim;
            for (int i = 0; i < n_rot / 2; i++) {
                float x0 = xh[2 * i], x1 = xh[2 * i + 1];
                xh[2 * i] = x0 * cs[i] - x1 * sn[i];
                xh[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

static inline float h2f(uint16_t h) { return st_fp16_to_f32(h); }
static inline float round_f16(float f) { return st_fp16_to_f32(st_f32_to_fp16(f)); }

void ops_attend_head_f32_scalar(float *out, const float *q, const float *kcache, const float *vcache,
                                const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                                int head_dim, int32_t n_pos, float scale, float *s) {
    float mx = -INFINITY;
    for (int32_t p = 0; p < n_pos; p++) {
        const float *k = kcache + ((int64_t)block_table[p / bs] * bs + p % bs) * kv_stride + kv_off;
        float d = 0.0f;
        for (int i = 0; i < head_dim; i++) d += q[i] * k[i];
        s[p] = d * scale;
        if (s[p] > mx) mx = s[p];
    }
    double sum = 0.0;
    for (int32_t p = 0; p < n_pos; p++) {
        s[p] = expf(s[p] - mx);
        sum += (double)s[p];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int32_t p = 0; p < n_pos; p++) {
        const float *v = vcache + ((int64_t)block_table[p / bs] * bs + p % bs) * kv_stride + kv_off;
        const float w = s[p] * inv;
        for (int i = 0; i < head_dim; i++) out[i] += w * v[i];
    }
}

void ops_attend_head_f16_scalar(float *out, const float *q, const uint16_t *kcache, const uint16_t *vcache,
                                const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                                int head_dim, int32_t n_pos, float scale, float *s) {
    float *qh = s + n_pos; /* q rounded to f16: ggml converts src1 to F16, the vec_dot type */
    for (int i = 0; i < head_dim; i++) qh[i] = round_f16(q[i]);
    float mx = -INFINITY;
    for (int32_t p = 0; p < n_pos; p++) {
        const uint16_t *k = kcache + ((int64_t)block_table[p / bs] * bs + p % bs) * kv_stride + kv_off;
        float d = 0.0f;
        for (int i = 0; i < head_dim; i++) d += qh[i] * h2f(k[i]);
        s[p] = d * scale;
        if (s[p] > mx) mx = s[p];
    }
    double sum = 0.0;
    for (int32_t p = 0; p < n_pos; p++) {
        s[p] = expf(s[p] - mx);
        sum += (double)s[p];
    }
    const float inv = (float)(1.0 / sum);
    for (int i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int32_t p = 0; p < n_pos; p++) {
        const uint16_t *v = vcache + ((int64_t)block_table[p / bs] * bs + p % bs) * kv_stride + kv_off;
        const float w = round_f16(s[p] * inv); /* the softmax weights are rounded as well */
        for (int i = 0; i < head_dim; i++) out[i] += w * h2f(v[i]);
    }
}

/* The attention SIMD level: matmul's run-time choice (cpu_simd_level, which
 * honours STRATA_SIMD), when the shape fits the SIMD kernels' 32-bit gather
 * offsets and their widened-K tile. 0 scalar, 1 AVX2, 2 AVX-512. */
static int attn_level(int64_t kv_stride, int head_dim) {
    if (head_dim < 1 || head_dim > OPS_ATTN_SIMD_MAX_HEAD_DIM || kv_stride < 1 || kv_stride > (1 << 24))
        return 0;
    const char *lv = cpu_simd_level();
    if (strcmp(lv, "avx512") == 0) return 2;
    if (strcmp(lv, "avx2") == 0) return 1;
    return 0;
}

void ops_attend_head_f32(float *out, const float *q, const float *kcache, const float *vcache,
                         const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                         int head_dim, int32_t n_pos, float scale, float *s) {
    switch (attn_level(kv_stride, head_dim)) {
    case 2:
        ops_attend_head_f32_avx512(out, q, kcache, vcache, block_table, bs, kv_stride, kv_off, head_dim,
                                   n_pos, scale, s);
        break;
    case 1:
        ops_attend_head_f32_avx2(out, q, kcache, vcache, block_table, bs, kv_stride, kv_off, head_dim,
                                 n_pos, scale, s);
        break;
    default:
        ops_attend_head_f32_scalar(out, q, kcache, vcache, block_table, bs, kv_stride, kv_off, head_dim,
                                   n_pos, scale, s);
    }
}

void ops_attend_head_f16(float *out, const float *q, const uint16_t *kcache, const uint16_t *vcache,
                         const int32_t *block_table, int bs, int64_t kv_stride, int64_t kv_off,
                         int head_dim, int32_t n_pos, float scale, float *s) {
    switch (attn_level(kv_stride, head_dim)) {
    case 2:
        ops_attend_head_f16_avx512(out, q, kcache, vcache, block_table, bs, kv_stride, kv_off, head_dim,
                                   n_pos, scale, s);
        break;
    case 1:
        ops_attend_head_f16_avx2(out, q, kcache, vcache, block_table, bs, kv_stride, kv_off, head_dim,
                                 n_pos, scale, s);
        break;
    default:
        ops_attend_head_f16_scalar(out, q, kcache, vcache, block_table, bs, kv_stride, kv_off, head_dim,
                                   n_pos, scale, s);
    }
}

void ops_swiglu_scalar(float *out, const float *gate, const float *up, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) {
        float g = gate[i];
        out[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

void ops_swiglu(float *out, const float *gate, const float *up, int64_t i0, int64_t i1) {
    const char *lv = cpu_simd_level();
    if (strcmp(lv, "avx512") == 0)
        ops_swiglu_avx512(out, gate, up, i0, i1);
    else if (strcmp(lv, "avx2") == 0)
        ops_swiglu_avx2(out, gate, up, i0, i1);
    else
        ops_swiglu_scalar(out, gate, up, i0, i1);
}

void ops_add(float *y, const float *x, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) y[i] += x[i];
}
