/* test_attn.c — the AVX2 / AVX-512 paged-attention kernels (attn_avx2.c,
 * attn_avx512.c) give bit-identical outputs to the scalar ones (ops.c), for
 * f32 and F16 caches, over head dims, block sizes and lengths that exercise
 * every tail (positions and dims not multiples of the vector width), shuffled
 * block tables and GQA offsets; and the dispatching entry points agree too. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cpu/ops.h"
#include "tests/testutil.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

typedef void (*attn_f32_fn)(float *, const float *, const float *, const float *, const int32_t *, int,
                            int64_t, int64_t, int, int32_t, float, float *);
typedef void (*attn_f16_fn)(float *, const float *, const uint16_t *, const uint16_t *, const int32_t *, int,
                            int64_t, int64_t, int, int32_t, float, float *);

int main(void) {
    __builtin_cpu_init();
    const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
    const bool has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    printf("avx2 %d avx512 %d\n", has_avx2, has_avx512);
    const int head_dims[] = {1, 7, 8, 16, 24, 64, 128};
    const int block_sizes[] = {1, 5, 16, 32};
    const int32_t lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 33, 100, 257};
    int n_cases = 0, n_same = 0, n_lev = 0;
    for (size_t hi = 0; hi < sizeof head_dims / sizeof *head_dims; hi++)
        for (size_t bi = 0; bi < sizeof block_sizes / sizeof *block_sizes; bi++)
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
                const int hd = head_dims[hi], bs = block_sizes[bi];
                const int32_t n_pos = lens[li];
                const int n_kv = 3, kv_stride = n_kv * hd;
                const int kv_off = 2 * hd; /* the last KV head */
                const int n_blocks = (n_pos + bs - 1) / bs, cache_blocks = n_blocks + 3;
                const size_t cache_n = (size_t)cache_blocks * bs * kv_stride;
                float *kc = malloc(cache_n * sizeof *kc), *vc = malloc(cache_n * sizeof *vc);
                uint16_t *kh = malloc(cache_n * sizeof *kh), *vh = malloc(cache_n * sizeof *vh);
                int32_t *bt = malloc(sizeof *bt * (size_t)n_blocks);
                float q[128], out[3][128], *scr = malloc(sizeof(float) * (size_t)(n_pos + hd));
                REQUIRE(kc && vc && kh && vh && bt && scr);
                for (size_t i = 0; i < cache_n; i++) {
                    kc[i] = 2.0f * frand();
                    vc[i] = frand();
                    kh[i] = st_f32_to_fp16(kc[i]);
                    vh[i] = st_f32_to_fp16(vc[i]);
                }
                for (int b = 0; b < n_blocks; b++) bt[b] = (b * 7 + 2) % cache_blocks; /* distinct, shuffled */
                for (int i = 0; i < hd; i++) q[i] = frand();
                const float scale = 1.0f / 2.8284271f;
                attn_f32_fn f32s[3] = {ops_attend_head_f32_scalar, has_avx2 ? ops_attend_head_f32_avx2 : NULL,
                                       has_avx512 ? ops_attend_head_f32_avx512 : NULL};
                attn_f16_fn f16s[3] = {ops_attend_head_f16_scalar, has_avx2 ? ops_attend_head_f16_avx2 : NULL,
                                       has_avx512 ? ops_attend_head_f16_avx512 : NULL};
                for (int kind = 0; kind < 2; kind++) {
                    for (int lv = 0; lv < 3; lv++) {
                        memset(out[lv], 0xff, sizeof out[lv]);
                        if (kind == 0 && f32s[lv])
                            f32s[lv](out[lv], q, kc, vc, bt, bs, kv_stride, kv_off, hd, n_pos, scale, scr);
                        else if (kind == 1 && f16s[lv])
                            f16s[lv](out[lv], q, kh, vh, bt, bs, kv_stride, kv_off, hd, n_pos, scale, scr);
                        else
                            continue;
                        if (lv == 0) continue;
                        n_lev++;
                        bool same = memcmp(out[0], out[lv], sizeof(float) * (size_t)hd) == 0;
                        if (!same)
                            printf("MISMATCH %s level %d hd %d bs %d n_pos %d: %.9g vs %.9g\n",
                                   kind ? "f16" : "f32", lv, hd, bs, n_pos, out[0][0], out[lv][0]);
                        n_same += same;
                    }
                    /* the dispatching entry point: the same bits again */
                    float d[128];
                    if (kind == 0)
                        ops_attend_head_f32(d, q, kc, vc, bt, bs, kv_stride, kv_off, hd, n_pos, scale, scr);
                    else
                        ops_attend_head_f16(d, q, kh, vh, bt, bs, kv_stride, kv_off, hd, n_pos, scale, scr);
                    n_lev++;
                    n_same += memcmp(out[0], d, sizeof(float) * (size_t)hd) == 0;
                    n_cases++;
                }
                free(kc), free(vc), free(kh), free(vh), free(bt), free(scr);
            }
    printf("%d cases, %d level comparisons, %d identical\n", n_cases, n_lev, n_same);
    CHECK_EQ_INT(n_cases, 7 * 4 * 11 * 2);
    CHECK_EQ_INT(n_same, n_lev);
    CHECK(n_lev >= n_cases); /* at least the dispatcher was compared each time */
    return test_summary();
}
