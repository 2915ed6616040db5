// kernels.cu — the device kernels of the CUDA backend (compute/cuda/kernels.h):
// dequantizing matvec and dequantize-to-f32 for the linear layers, RMSNorm,
// RoPE, KV store, paged attention, SwiGLU, add, embedding lookup, get_rows.
// Written to be simple and obviously correct rather than fast: grid-stride
// loops, one block per row or per (token, head), f32 accumulation. Formulas
// and their sources: compute/backend.h; the order of operations follows the
// CPU kernels (compute/cpu/ops.c) so that results agree closely.
#include "compute/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

// enum ggml_type ids (common/dtype.h).
#define T_F32 0u
#define T_F16 1u
#define T_Q4_0 2u
#define T_Q8_0 8u
#define T_BF16 30u
#define QK 32 // Q8_0 / Q4_0 block size

namespace {

const int kThreads = 256;

// Blocks for a grid-stride loop over n items.
unsigned grid_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > 65536) b = 65536;
    return (unsigned)b;
}

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float round_f16(float f) { return __half2float(__float2half_rn(f)); }
__device__ __forceinline__ uint16_t rd16(const uint8_t *p) {
    return (uint16_t)(p[0] | ((uint16_t)p[1] << 8));
}

// Element j of a row of `type` (GGUF layouts, common/dtype.c st_dequant_row):
// Q8_0 block = f16 d + 32 int8, x = d*q; Q4_0 block = f16 d + 16 bytes,
// low nibbles x[0..15], high x[16..31], x = d*(q-8).
__device__ __forceinline__ float load_elem(const uint8_t *row, uint32_t type, int64_t j) {
    switch (type) {
    case T_F32: return ((const float *)row)[j];
    case T_F16: return h2f(((const uint16_t *)row)[j]);
    case T_BF16: return bf2f(((const uint16_t *)row)[j]);
    case T_Q8_0: {
        const uint8_t *b = row + (j / QK) * (2 + QK);
        return h2f(rd16(b)) * (float)(int8_t)b[2 + j % QK];
    }
    case T_Q4_0: {
        const uint8_t *b = row + (j / QK) * (2 + QK / 2);
        const int i = (int)(j % QK);
        const uint8_t q = b[2 + (i & (QK / 2 - 1))];
        const int v = i < QK / 2 ? (q & 0x0f) : (q >> 4);
        return h2f(rd16(b)) * (float)(v - 8);
    }
    default: return 0.0f;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- linear layers ----

// One warp per weight row n; lanes stride over K; T <= CUK_MATVEC_MAX_T.
__global__ void k_matvec(float *y, const float *x, const uint8_t *w, uint32_t wtype, size_t rb,
                         int T, int64_t K, int64_t N) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return; // whole warp leaves together
    const uint8_t *row = w + (size_t)n * rb;
    float acc[CUK_MATVEC_MAX_T];
    for (int t = 0; t < CUK_MATVEC_MAX_T; t++) acc[t] = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
        const float wk = load_elem(row, wtype, k);
        for (int t = 0; t < T; t++) acc[t] += wk * x[(int64_t)t * K + k];
    }
    for (int t = 0; t < T; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0) y[(int64_t)t * N + n] = s;
    }
}

__global__ void k_dequant_rows(float *dst, const uint8_t *w, uint32_t wtype, size_t rb,
                               int64_t rows, int64_t K) {
    const int64_t total = rows * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / K, k = i % K;
        dst[i] = load_elem(w + (size_t)r * rb, wtype, k);
    }
}

__global__ void k_f32_to_half(uint16_t *dst, const float *x, int64_t n, int to_bf16) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = to_bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x[i]))
                         : __half_as_ushort(__float2half_rn(x[i]));
}

// ---- elementwise and row ops ----

// One block per row; the sum of squares in double, as ggml's CPU code.
__global__ void k_rmsnorm(float *y, const float *x, const uint8_t *w, uint32_t wtype, int64_t n,
                          float eps) {
    __shared__ double part[kThreads];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)(xr[i] * xr[i]);
    part[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    const float mean = (float)(part[0] / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    // y may equal x: every read of the sum precedes the __syncthreads above,
    // and below each element is read and written by the same thread.
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] * scale) * load_elem(w, wtype, i);
}

// One thread per (token, head, pair).
__global__ void k_rope(float *x, int64_t T, int n_head, int head_dim, int n_rot, const int32_t *pos,
                       float theta_scale, const float *ff) {
    const int half = n_rot / 2;
    const int64_t total = T * n_head * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        const int64_t th = idx / half; // token * n_head + head
        const int64_t t = th / n_head;
        // theta_i = p * theta_scale^i by repeated multiplication, as ops_rope_rows.
        float theta = (float)pos[t];
        for (int j = 0; j < i; j++) theta *= theta_scale;
        if (ff) theta = theta / ff[i];
        const float c = cosf(theta), s = sinf(theta);
        float *xh = x + th * head_dim;
        const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
        xh[2 * i] = x0 * c - x1 * s;
        xh[2 * i + 1] = x0 * s + x1 * c;
    }
}

__global__ void k_kv_store(void *kc, void *vc, int f16, const float *k, const float *v, int64_t T,
                           int64_t kv_dim, const int32_t *slots) {
    const int64_t total = T * kv_dim;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / kv_dim, i = idx % kv_dim;
        const int64_t d = (int64_t)slots[t] * kv_dim + i;
        if (f16) {
            ((__half *)kc)[d] = __float2half_rn(k[idx]);
            ((__half *)vc)[d] = __float2half_rn(v[idx]);
        } else {
            ((float *)kc)[d] = k[idx];
            ((float *)vc)[d] = v[idx];
        }
    }
}

// ---- paged attention ----

const int kAttWarps = 4;

template <bool F16>
__device__ __forceinline__ float kv_at(const void *c, int64_t i) {
    if (F16) return __half2float(((const __half *)c)[i]);
    return ((const float *)c)[i];
}

// Block (row, head): two passes over the positions, each warp taking every
// kAttWarps-th one. Pass 1: max and sum of exp (online). Pass 2: recompute the
// scores, w = exp(s - max) / sum (rounded to f16 for an F16 cache, as ggml),
// out += w * v. No score buffer, so any context length works.
template <bool F16>
__global__ void k_attention(float *out, const float *q, const void *kc, const void *vc,
                            const int32_t *row_npos, const int32_t *row_btoff, const int32_t *bt,
                            int n_head, int group, int head_dim, int bs, int64_t kv_stride,
                            float scale) {
    __shared__ float sq[CUK_ATT_MAX_HD];
    __shared__ float sm[kAttWarps], sl[kAttWarps];
    __shared__ float sacc[kAttWarps][CUK_ATT_MAX_HD];
    const int64_t row = blockIdx.x;
    const int h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int64_t qdim = (int64_t)n_head * head_dim;
    const float *qh = q + row * qdim + (int64_t)h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) sq[d] = F16 ? round_f16(qh[d]) : qh[d];
    __syncthreads();
    const int32_t n_pos = row_npos[row];
    const int32_t *btab = bt + row_btoff[row];
    const int64_t off = (int64_t)(h / group) * head_dim;

    float m = -INFINITY, l = 0.0f;
    for (int32_t p = warp; p < n_pos; p += kAttWarps) {
        const int64_t base = ((int64_t)btab[p / bs] * bs + p % bs) * kv_stride + off;
        float d = 0.0f;
        for (int i = lane; i < head_dim; i += 32) d += sq[i] * kv_at<F16>(kc, base + i);
        const float s = warp_sum(d) * scale;
        if (s > m) {
            l = l * expf(m - s) + 1.0f;
            m = s;
        } else {
            l += expf(s - m);
        }
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
    float M = sm[0];
    for (int w = 1; w < kAttWarps; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f;
    for (int w = 0; w < kAttWarps; w++)
        if (sl[w] > 0.0f) L += sl[w] * expf(sm[w] - M);
    const float inv = 1.0f / L; // n_pos >= 1, so L >= 1

    float acc[CUK_ATT_MAX_HD / 32];
    for (int j = 0; j < CUK_ATT_MAX_HD / 32; j++) acc[j] = 0.0f;
    for (int32_t p = warp; p < n_pos; p += kAttWarps) {
        const int64_t base = ((int64_t)btab[p / bs] * bs + p % bs) * kv_stride + off;
        float d = 0.0f;
        for (int i = lane; i < head_dim; i += 32) d += sq[i] * kv_at<F16>(kc, base + i);
        const float s = warp_sum(d) * scale;
        float w = expf(s - M) * inv;
        if (F16) w = round_f16(w);
        for (int j = 0; j < CUK_ATT_MAX_HD / 32; j++) {
            const int i = lane + 32 * j;
            if (i < head_dim) acc[j] += w * kv_at<F16>(vc, base + i);
        }
    }
    for (int j = 0; j < CUK_ATT_MAX_HD / 32; j++) {
        const int i = lane + 32 * j;
        if (i < head_dim) sacc[warp][i] = acc[j];
    }
    __syncthreads();
    float *oh = out + row * qdim + (int64_t)h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < kAttWarps; w++) s += sacc[w][d];
        oh[d] = s;
    }
}

__global__ void k_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

__global__ void k_add(float *y, const float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

__global__ void k_embed(float *out, const uint8_t *table, uint32_t ttype, size_t rb, int64_t n_rows,
                        int64_t cols, const int32_t *ids, int64_t T, int64_t row0) {
    const int64_t total = T * cols;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = idx / cols, j = idx % cols;
        const int64_t r = (int64_t)ids[t] - row0;
        out[idx] = (r >= 0 && r < n_rows) ? load_elem(table + (size_t)r * rb, ttype, j) : 0.0f;
    }
}

__global__ void k_get_rows(float *dst, const float *src, const int32_t *rows, int64_t n_rows,
                           int64_t n) {
    const int64_t total = n_rows * n;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = idx / n, j = idx % n;
        dst[idx] = src[(int64_t)rows[i] * n + j];
    }
}

} // namespace

// ---- launchers ----

extern "C" cudaError_t cuk_matvec(float *y, const float *x, const void *w, uint32_t wtype, size_t rb,
                                  int64_t T, int64_t K, int64_t N, cudaStream_t st) {
    const int rows_per_block = kThreads / 32;
    const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
    k_matvec<<<(unsigned)blocks, kThreads, 0, st>>>(y, x, (const uint8_t *)w, wtype, rb, (int)T, K, N);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_dequant_rows(float *dst, const void *w, uint32_t wtype, size_t rb,
                                        int64_t rows, int64_t K, cudaStream_t st) {
    k_dequant_rows<<<grid_for(rows * K), kThreads, 0, st>>>(dst, (const uint8_t *)w, wtype, rb, rows, K);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_f32_to_half(uint16_t *dst, const float *x, int64_t n, int to_bf16,
                                       cudaStream_t st) {
    k_f32_to_half<<<grid_for(n), kThreads, 0, st>>>(dst, x, n, to_bf16);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_rmsnorm(float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                                   int64_t n, float eps, cudaStream_t st) {
    k_rmsnorm<<<(unsigned)T, kThreads, 0, st>>>(y, x, (const uint8_t *)w, wtype, n, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_rope(float *x, int64_t T, int n_head, int head_dim, int n_rot,
                                const int32_t *pos, float theta_scale, const float *ff,
                                cudaStream_t st) {
    k_rope<<<grid_for(T * n_head * (n_rot / 2)), kThreads, 0, st>>>(x, T, n_head, head_dim, n_rot, pos,
                                                                    theta_scale, ff);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_kv_store(void *kc, void *vc, int f16, const float *k, const float *v,
                                    int64_t T, int64_t kv_dim, const int32_t *slots, cudaStream_t st) {
    k_kv_store<<<grid_for(T * kv_dim), kThreads, 0, st>>>(kc, vc, f16, k, v, T, kv_dim, slots);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_attention(float *out, const float *q, const void *kc, const void *vc, int f16,
                                     const int32_t *row_npos, const int32_t *row_btoff,
                                     const int32_t *bt, int64_t n_rows, int n_head, int n_head_kv,
                                     int head_dim, int bs, float scale, cudaStream_t st) {
    const dim3 grid((unsigned)n_rows, (unsigned)n_head);
    const int group = n_head / n_head_kv;
    const int64_t kv_stride = (int64_t)n_head_kv * head_dim;
    if (f16)
        k_attention<true><<<grid, kAttWarps * 32, 0, st>>>(out, q, kc, vc, row_npos, row_btoff, bt, n_head,
                                                           group, head_dim, bs, kv_stride, scale);
    else
        k_attention<false><<<grid, kAttWarps * 32, 0, st>>>(out, q, kc, vc, row_npos, row_btoff, bt, n_head,
                                                            group, head_dim, bs, kv_stride, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_swiglu(float *out, const float *gate, const float *up, int64_t n,
                                  cudaStream_t st) {
    k_swiglu<<<grid_for(n), kThreads, 0, st>>>(out, gate, up, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_add(float *y, const float *x, int64_t n, cudaStream_t st) {
    k_add<<<grid_for(n), kThreads, 0, st>>>(y, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_embed(float *out, const void *table, uint32_t ttype, size_t rb, int64_t n_rows,
                                 int64_t cols, const int32_t *ids, int64_t T, int64_t row0,
                                 cudaStream_t st) {
    k_embed<<<grid_for(T * cols), kThreads, 0, st>>>(out, (const uint8_t *)table, ttype, rb, n_rows, cols,
                                                    ids, T, row0);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_get_rows(float *dst, const float *src, const int32_t *rows, int64_t n_rows,
                                    int64_t n, cudaStream_t st) {
    k_get_rows<<<grid_for(n_rows * n), kThreads, 0, st>>>(dst, src, rows, n_rows, n);
    return cudaGetLastError();
}
