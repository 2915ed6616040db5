/* test_vexpf.c — the AVX2 and AVX-512 expf (compute/cpu/vexpf_avx2.h and
 * vexpf_avx512.h, through ops_expf_avx2/_avx512) are bit-identical to libm's
 * expf over a stride of every float bit pattern (NaNs only as NaN), and the
 * SwiGLU kernels that use them equal the scalar one bit for bit (tails
 * included), at each level this CPU has. The dispatching ops_swiglu must
 * equal the scalar kernel at any level. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cpu/ops.h"
#include "tests/testutil.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rand32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static int same(float a, float b) { return memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b)); }

typedef void (*expf_fn)(float *y, const float *x, int64_t n);
typedef void (*swiglu_fn)(float *out, const float *gate, const float *up, int64_t i0, int64_t i1);

enum { N = 4099 };

static void check_level(const char *name, expf_fn vexp, swiglu_fn swiglu, float *x, float *y, float *up,
                        float *o1, float *o2) {
    /* expf: every 251st bit pattern (all signs, exponents, NaN/inf), in
     * chunks of N (a 3-lane tail each) */
    long n = 0, bad = 0;
    for (uint64_t b0 = 0; b0 < (1ull << 32); b0 += (uint64_t)N * 251) {
        int m = 0;
        for (; m < N && b0 + (uint64_t)m * 251 < (1ull << 32); m++) x[m] = from_bits((uint32_t)(b0 + (uint64_t)m * 251));
        vexp(y, x, m);
        for (int i = 0; i < m; i++, n++)
            if (!same(y[i], expf(x[i]))) {
                if (bad++ < 5) printf("%s expf(%a): %a, libm %a\n", name, x[i], y[i], expf(x[i]));
            }
    }
    /* the softmax range: random x <= 0, and around the special-case edges */
    const float edges[] = {-88.0f, -87.99f, -103.28f, -103.97f, -104.0f, 88.0f, 88.72f, 89.0f, -0.0f, 0.0f,
                           -INFINITY, INFINITY, NAN};
    for (int it = 0; it < 200; it++) {
        for (int i = 0; i < N; i++)
            x[i] = (i % 17 == 0) ? edges[(i / 17 + it) % 13] : -(float)(rand32() >> 8) / 16777216.0f * 120.0f;
        vexp(y, x, N - it % 16);
        for (int i = 0; i < N - it % 16; i++, n++)
            if (!same(y[i], expf(x[i]))) {
                if (bad++ < 10) printf("%s expf(%a): %a, libm %a\n", name, x[i], y[i], expf(x[i]));
            }
    }
    printf("%s expf: %ld values, %ld differ\n", name, n, bad);
    CHECK_EQ_INT(bad, 0);
    CHECK(n > 16000000);

    /* SwiGLU: random gates over a wide range, and bit patterns */
    long ns = 0, sbad = 0;
    for (int it = 0; it < 300; it++) {
        for (int i = 0; i < N; i++) {
            x[i] = it % 3 == 0 ? from_bits(rand32()) : ((float)(rand32() >> 8) / 8388608.0f - 1.0f) * (float)(1 + it % 40);
            up[i] = (float)(rand32() >> 8) / 8388608.0f - 1.0f;
        }
        int64_t i0 = it % 5, i1 = N - it % 17;
        memset(o1, 0, N * sizeof *o1);
        memset(o2, 0, N * sizeof *o2);
        swiglu(o1, x, up, i0, i1);
        ops_swiglu_scalar(o2, x, up, i0, i1);
        for (int i = 0; i < N; i++, ns++)
            if (!same(o1[i], o2[i])) {
                if (sbad++ < 5) printf("%s swiglu(%a, %a): %a, scalar %a\n", name, x[i], up[i], o1[i], o2[i]);
            }
    }
    printf("%s swiglu: %ld values, %ld differ\n", name, ns, sbad);
    CHECK_EQ_INT(sbad, 0);
}

int main(void) {
    __builtin_cpu_init();
    const int has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const int has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl");
    printf("avx2 %d, avx512 %d\n", has_avx2, has_avx512);
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *up = malloc(N * sizeof *up);
    float *o1 = malloc(N * sizeof *o1), *o2 = malloc(N * sizeof *o2);
    REQUIRE(x && y && up && o1 && o2);
    if (has_avx2) check_level("avx2", ops_expf_avx2, ops_swiglu_avx2, x, y, up, o1, o2);
    if (has_avx512) check_level("avx512", ops_expf_avx512, ops_swiglu_avx512, x, y, up, o1, o2);

    /* the dispatcher agrees with the scalar kernel at any level */
    for (int i = 0; i < N; i++) {
        x[i] = ((float)(rand32() >> 8) / 8388608.0f - 1.0f) * 20.0f;
        up[i] = (float)(rand32() >> 8) / 8388608.0f;
    }
    ops_swiglu(o1, x, up, 0, N);
    ops_swiglu_scalar(o2, x, up, 0, N);
    CHECK(memcmp(o1, o2, N * sizeof *o1) == 0);
    /* silu(0) * 1 = 0, silu(large) * 1 = large, silu(-large) * 1 = -0 */
    x[0] = 0.0f, x[1] = 50.0f, x[2] = -200.0f, up[0] = up[1] = up[2] = 1.0f;
    ops_swiglu(o1, x, up, 0, 3);
    CHECK_NEAR(o1[0], 0.0, 0);
    CHECK_NEAR(o1[1], 50.0, 0);
    CHECK_NEAR(o1[2], 0.0, 0);
    free(x);
    free(y);
    free(up);
    free(o1);
    free(o2);
    return test_summary();
}
