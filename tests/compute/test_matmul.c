/* test_matmul.c — cpu_matmul against a double-precision reference computed
 * from st_dequant_row: every weight type × every SIMD level this CPU has ×
 * shapes (K not a multiple of 16/64 for the dense types, odd N, long rows, T = 1, 2, 3,
 * 7, 64, 70 covering matvec and GEMM paths, a T > 256 chunked GEMM, the
 * OpenBLAS GEMM path) × pools of 1, 2 and 3 threads; bad types and shapes.
 * Every level's output must be the scalar level's, bit for bit. */
#include <math.h>
#include <stdint.h>

#include "common/dtype.h"
#include "compute/cpu/matmul.h"
#include "compute/cpu/simd.h"
#include "model/quantize.h"
#include "tests/testutil.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* Encodes N×K random weights of `type` (ggml's reference quantizers for Q8_0/Q4_0). */
static uint8_t *make_weights(uint32_t type, int64_t K, int64_t N) {
    size_t rb = ggml_row_bytes(type, K);
    uint8_t *w = calloc((size_t)N, rb);
    float *row = malloc(sizeof(float) * (size_t)K);
    for (int64_t n = 0; n < N; n++) {
        uint8_t *d = w + (size_t)n * rb;
        for (int64_t k = 0; k < K; k++) row[k] = frand();
        if (n % 5 == 3) row[K / 2] = 0; /* a few exact zeros */
        switch (type) {
        case GGML_TYPE_F32: memcpy(d, row, (size_t)K * 4); break;
        case GGML_TYPE_F16:
            for (int64_t k = 0; k < K; k++) put16(d + 2 * k, st_f32_to_fp16(row[k]));
            break;
        case GGML_TYPE_BF16:
            for (int64_t k = 0; k < K; k++) put16(d + 2 * k, st_f32_to_bf16(row[k]));
            break;
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_0: st_quantize_row(type, row, d, K); break;
        }
    }
    free(row);
    return w;
}

static int n_cases, n_bad_cases;
static const char *levels[] = {"scalar", "avx2", "avx512"};
static int n_levels; /* levels this CPU has: levels[0 .. n_levels) */

/* Runs one case at every SIMD level the CPU has; each level's y must be the
 * same bits as the scalar level's (simd.h's canonical order; not for
 * OpenBLAS, blas = 1), and every output must be near the f64 reference:
 * |y - ref| <= 3e-6 * sum_k |x w| + 1e-7 (f32 accumulation error bound).
 * For Q8_0 weights the reference uses the Q8_0-quantized activations
 * (cpu_quantize_q8), which is what the kernels multiply (matvec and integer
 * GEMM alike). */
static void check_case(st_pool *pool, uint32_t type, int64_t T, int64_t K, int64_t N, int blas) {
    size_t rb = ggml_row_bytes(type, K);
    REQUIRE(rb > 0);
    uint8_t *w = make_weights(type, K, N);
    float *x = malloc(sizeof(float) * (size_t)(T * K));
    for (int64_t i = 0; i < T * K; i++) x[i] = frand();
    float *xr = malloc(sizeof(float) * (size_t)(T * K)); /* what the kernels multiply */
    memcpy(xr, x, sizeof(float) * (size_t)(T * K));
    if (type == GGML_TYPE_Q8_0) {
        int8_t *q = malloc((size_t)(T * K));
        float *d = malloc(sizeof(float) * (size_t)(T * K / 32));
        cpu_quantize_q8(x, T * K, q, d);
        for (int64_t i = 0; i < T * K; i++) xr[i] = (float)q[i] * d[i / 32];
        free(q);
        free(d);
    }
    const int64_t guard = 16;
    float *y0 = NULL; /* the scalar level's result */
    float *deq = malloc(sizeof(float) * (size_t)K);
    int bad = 0;
    st_err err = {{0}};
    for (int li = 0; li < n_levels; li++) {
        REQUIRE(cpu_matmul_set_level(levels[li], &err) == 0);
        float *y = malloc(sizeof(float) * (size_t)(T * N + guard));
        for (int64_t i = 0; i < T * N + guard; i++) y[i] = 12345.0f;
        int rc = cpu_matmul(pool, y, x, w, type, T, K, N, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        for (int64_t n = 0; n < N && !bad; n++) {
            REQUIRE(st_dequant_row(type, w + (size_t)n * rb, deq, K) == 0);
            for (int64_t t = 0; t < T; t++) {
                double s = 0, a = 0;
                for (int64_t k = 0; k < K; k++) {
                    s += (double)xr[t * K + k] * deq[k];
                    a += fabs((double)xr[t * K + k] * deq[k]);
                }
                double got = y[t * N + n], tol = 3e-6 * a + 1e-7;
                if (!(fabs(got - s) <= tol)) {
                    fprintf(stderr, "level %s type %s T=%lld K=%lld N=%lld pool %d: y[%lld,%lld] = %.9g, ref %.9g (tol %.3g)\n",
                            levels[li], ggml_type_name(type), (long long)T, (long long)K, (long long)N,
                            st_pool_size(pool), (long long)t, (long long)n, got, s, tol);
                    bad = 1;
                    break;
                }
            }
        }
        for (int64_t i = T * N; i < T * N + guard; i++)
            if (y[i] != 12345.0f) bad = 1;
        if (li == 0) {
            y0 = y;
        } else {
            if (!blas && memcmp(y, y0, sizeof(float) * (size_t)(T * N)) != 0) {
                int64_t i = 0;
                while (y[i] == y0[i]) i++;
                fprintf(stderr, "level %s differs from scalar: type %s T=%lld K=%lld N=%lld y[%lld] = %.9g vs %.9g\n",
                        levels[li], ggml_type_name(type), (long long)T, (long long)K, (long long)N,
                        (long long)i, y[i], y0[i]);
                bad = 1;
            }
            free(y);
        }
    }
    CHECK_MSG(!bad, "mismatch (see above) or write past y: %s T=%lld K=%lld N=%lld", ggml_type_name(type),
              (long long)T, (long long)K, (long long)N);
    n_cases++;
    n_bad_cases += bad;
    free(y0);
    free(deq);
    free(xr);
    free(x);
    free(w);
}

/* cpu_quantize_q8 on hand-made blocks: ggml's rounding (half to even), the
 * f16 scale, an all-zero block. */
static void check_quantize_q8(void) {
    float x[64] = {0}, d[2];
    int8_t q[64];
    x[0] = 127.0f;  /* amax 127: id = 1, scale 1 */
    x[1] = 2.5f;    /* ties go to even: 2 */
    x[2] = -3.5f;   /* -4 */
    x[3] = 0.49f;   /* 0 */
    x[4] = -127.0f; /* -127 */
    cpu_quantize_q8(x, 64, q, d);
    CHECK_EQ_INT(q[0], 127);
    CHECK_EQ_INT(q[1], 2);
    CHECK_EQ_INT(q[2], -4);
    CHECK_EQ_INT(q[3], 0);
    CHECK_EQ_INT(q[4], -127);
    CHECK_NEAR(d[0], 1.0, 0);
    CHECK_NEAR(d[1], 0.0, 0); /* all-zero block */
    for (int i = 32; i < 64; i++) CHECK_EQ_INT(q[i], 0);
    x[32] = 0.1f; /* scale 0.1/127 rounds to f16 */
    cpu_quantize_q8(x, 64, q, d);
    CHECK_EQ_INT(q[32], 127);
    CHECK_NEAR(d[1], st_fp16_to_f32(st_f32_to_fp16(0.1f / 127.0f)), 0);
    /* The AVX2 quantizer (the avx2 and avx512 levels) gives the same bytes and
     * scales on awkward blocks: NaN (ignored by amax, quantized to 0), inf,
     * ties at every position, scales that are f16 subnormals, negative zero. */
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) return;
    enum { NB = 8 };
    float xs[NB * 32], ds[NB], dv[NB];
    int8_t qs[NB * 32], qv[NB * 32];
    for (int i = 0; i < NB * 32; i++) xs[i] = frand() * 3.0f;
    xs[5] = NAN;
    xs[32 + 7] = INFINITY;
    for (int i = 64; i < 96; i++) xs[i] = (float)(i - 80) * 0.5f; /* amax 8: ties */
    xs[66] = 127.0f / 16.0f * 0.5f;
    for (int i = 96; i < 128; i++) xs[i] = frand() * 1e-6f; /* scale below f16's normal range */
    for (int i = 128; i < 160; i++) xs[i] = -0.0f;
    xs[160] = -NAN;
    cpu_quantize_q8(xs, NB * 32, qs, ds);
    cpu_quantize_q8_avx2(xs, NB * 32, qv, dv);
    CHECK(memcmp(qs, qv, sizeof qs) == 0);
    CHECK(memcmp(ds, dv, sizeof ds) == 0);
    CHECK_EQ_INT(qs[5], 0);
    CHECK_EQ_INT(qs[160], 0);
}

/* The Q8_0 integer GEMM gives the matvec's bits (simd.h's canonical Q8_0
 * order) for T = 1..17 tokens (the register tiles of 4 and 8 tokens and
 * their tails), K of 1..17 blocks (not multiples of the 8 accumulators) and
 * N around the 8- and 16-row panels, at every level (avx512: with and
 * without AVX512-VNNI where the CPU has it); and the
 * dequantized-float path (cpu_matmul_set_q8_float) stays within the f32
 * bound of the unquantized product. */
static void check_q8_gemm(st_pool *pool) {
    /* The last shape: 200 rows of 2176 bytes, which the 2 threads claim in
     * chunks of 64, 48, 32, 32 and 24 rows (matmul.c's claim_rows). */
    const int64_t kn[][2] = {{32, 1}, {96, 17}, {160, 9}, {288, 33}, {544, 23}, {256, 16}, {2048, 200}};
    const int n_kn = (int)(sizeof kn / sizeof kn[0]);
    st_err err = {{0}};
    const int max_t = cpu_matmul_matvec_max_t();
    const int vnni = cpu_matmul_vnni(); /* at the best level */
    fprintf(stderr, "q8_0 GEMM: AVX512-VNNI %s\n", vnni ? "used (and checked without)" : "not used");
    int bad = 0, n = 0;
    for (int s = 0; s < n_kn; s++) {
        const int64_t K = kn[s][0], N = kn[s][1];
        uint8_t *w = make_weights(GGML_TYPE_Q8_0, K, N);
        for (int64_t T = 1; T <= 17; T++) {
            float *x = malloc(sizeof(float) * (size_t)(T * K));
            for (int64_t i = 0; i < T * K; i++) x[i] = frand() * (i % 7 == 0 ? 40.0f : 1.0f);
            float *ym = malloc(sizeof(float) * (size_t)(T * N)), *yg = malloc(sizeof(float) * (size_t)(T * N));
            for (int li = 0; li < n_levels + vnni; li++) {
                /* The last pass: avx512 without VNNI (the one before used it). */
                REQUIRE(cpu_matmul_set_level(levels[li < n_levels ? li : n_levels - 1], &err) == 0);
                if (li == n_levels) REQUIRE(cpu_matmul_set_vnni(0, &err) == 0);
                cpu_matmul_set_matvec_max_t(1000);
                REQUIRE(cpu_matmul(pool, ym, x, w, GGML_TYPE_Q8_0, T, K, N, &err) == 0);
                cpu_matmul_set_matvec_max_t(1);
                for (int64_t i = 0; i < T * N; i++) yg[i] = -1.0f;
                REQUIRE(cpu_matmul(pool, yg, x, w, GGML_TYPE_Q8_0, T, K, N, &err) == 0);
                if (memcmp(ym, yg, sizeof(float) * (size_t)(T * N)) != 0) {
                    int64_t i = 0;
                    while (ym[i] == yg[i]) i++;
                    fprintf(stderr, "q8_0 GEMM != matvec: level %s%s T=%lld K=%lld N=%lld y[%lld] = %.9g vs %.9g\n",
                            levels[li < n_levels ? li : n_levels - 1], li == n_levels ? " (no VNNI)" : "", (long long)T, (long long)K, (long long)N, (long long)i, yg[i], ym[i]);
                    bad++;
                }
                n++;
                if (li == n_levels) REQUIRE(cpu_matmul_set_vnni(1, &err) == 0);
            }
            free(x);
            free(ym);
            free(yg);
        }
        free(w);
    }
    cpu_matmul_set_matvec_max_t(max_t);
    REQUIRE(cpu_matmul_set_level(levels[n_levels - 1], &err) == 0);
    fprintf(stderr, "q8_0 integer GEMM vs matvec: %d cases, %d differ\n", n, bad);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(n, n_kn * 17 * (n_levels + vnni));
    /* The dequantized-float reference: unquantized activations, so within
     * 3e-6 sum |x w| of the f64 product, where the integer path is not. */
    const int64_t T = 3, K = 96, N = 5; /* T < the matvec threshold: the float path is the GEMM's anyway */
    uint8_t *w = make_weights(GGML_TYPE_Q8_0, K, N);
    float x[3 * 96], y[3 * 5], deq[96];
    for (int64_t i = 0; i < T * K; i++) x[i] = frand();
    cpu_matmul_set_q8_float(1);
    REQUIRE(cpu_matmul(pool, y, x, w, GGML_TYPE_Q8_0, T, K, N, &err) == 0);
    cpu_matmul_set_q8_float(0);
    double worst = 0;
    for (int64_t r = 0; r < N; r++) {
        REQUIRE(st_dequant_row(GGML_TYPE_Q8_0, w + (size_t)r * ggml_row_bytes(GGML_TYPE_Q8_0, K), deq, K) == 0);
        for (int64_t t = 0; t < T; t++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; k++) s += (double)x[t * K + k] * deq[k], a += fabs((double)x[t * K + k] * deq[k]);
            double e = fabs(y[t * N + r] - s) / (3e-6 * a + 1e-7);
            if (e > worst) worst = e;
        }
    }
    CHECK(worst <= 1.0);
    free(w);
}

int main(void) {
    const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    const int64_t Ts[] = {1, 2, 3, 7, 17, 64, 70};
    /* (K, N): dense types get K that are not multiples of 16 or 64; K >= 4096
     * takes the AVX2 decode kernel that dots two rows at once (odd N: a
     * single last row; K % 32 = 4: a partial tail chunk). */
    const int64_t dense_kn[][2] = {{5, 3}, {37, 17}, {300, 201}, {64, 1}, {48, 5}, {24, 4}, {4100, 7}, {4096, 6}};
    const int64_t quant_kn[][2] = {{32, 5}, {96, 17}, {320, 201}, {544, 3}};
    const char *best = cpu_simd_level();
    fprintf(stderr, "best SIMD level: %s\n", best);
    st_err err = {{0}};
    for (n_levels = 0; n_levels < 3; n_levels++)
        if (cpu_matmul_set_level(levels[n_levels], &err) != 0) break;
    fprintf(stderr, "levels compared bit for bit: %d (scalar .. %s)\n", n_levels, levels[n_levels - 1]);
    CHECK_EQ_STR(levels[n_levels - 1], best);
    check_quantize_q8();
    {
        st_pool *pool = st_pool_new(2, &err);
        REQUIRE(pool);
        check_q8_gemm(pool);
        st_pool_free(pool);
    }

    for (int np = 1; np <= 3; np++) {
        st_pool *pool = st_pool_new(np, &err);
        REQUIRE(pool);
        for (int ti = 0; ti < 5; ti++) {
            uint32_t type = types[ti];
            int dense = ggml_block_size(type) == 1;
            int nkn = dense ? 8 : 4;
            for (int s = 0; s < nkn; s++) {
                int64_t K = dense ? dense_kn[s][0] : quant_kn[s][0];
                int64_t N = dense ? dense_kn[s][1] : quant_kn[s][1];
                for (int i = 0; i < 7; i++) {
                    /* The biggest shape only on the 2-thread pool (time under ASan). */
                    if (K * N > 20000 && np != 2 && Ts[i] > 3) continue;
                    check_case(pool, type, Ts[i], K, N, 0);
                }
            }
        }
        /* T > 256: the own GEMM packs x in chunks of 256 tokens. */
        if (np == 2) {
            check_case(pool, GGML_TYPE_F16, 260, 40, 9, 0);
            /* ... over several CPU_GEMM_NB-row chunks claimed anew in each token chunk. */
            check_case(pool, GGML_TYPE_F16, 260, 40, 200, 0);
            check_case(pool, GGML_TYPE_Q8_0, 300, 64, 7, 0);
            /* Token tiles of 16, 32 and 48 in the own GEMM's micro-kernel. */
            check_case(pool, GGML_TYPE_F16, 9, 130, 50, 0);
            check_case(pool, GGML_TYPE_F32, 20, 33, 13, 0);
            check_case(pool, GGML_TYPE_BF16, 33, 64, 101, 0);
            /* Decode over many weight rows: the matvec's rows go out in
             * several chunks of decreasing size (matmul.c claim_rows). */
            check_case(pool, GGML_TYPE_F16, 1, 256, 1500, 0);
            check_case(pool, GGML_TYPE_Q8_0, 1, 256, 1500, 0);
            /* K past one CPU_GEMM_KC tile and N past one CPU_GEMM_NB tile. */
            check_case(pool, GGML_TYPE_Q4_0, 17, 288, 200, 0);
            /* The OpenBLAS GEMM path (STRATA_GEMM=blas). */
            cpu_matmul_set_blas_gemm(1);
            check_case(pool, GGML_TYPE_F32, 70, 37, 17, 1);
            check_case(pool, GGML_TYPE_BF16, 64, 300, 130, 1);
            check_case(pool, GGML_TYPE_Q4_0, 19, 96, 70, 1);
            cpu_matmul_set_blas_gemm(0);
        }
        st_pool_free(pool);
    }
    fprintf(stderr, "%d cases on %d SIMD levels, %d bad\n", n_cases, n_levels, n_bad_cases);
    CHECK(n_levels >= 1);
    CHECK(cpu_matmul_set_level("avx9000", &err) == -1);
    CHECK(strstr(err.msg, "avx9000") != NULL);
    REQUIRE(cpu_matmul_set_level(best, &err) == 0);

    /* Errors: unsupported types, K not a multiple of the block, bad shapes. */
    float x[64] = {0}, y[64] = {0};
    uint8_t w[256] = {0};
    err.msg[0] = 0;
    CHECK_EQ_INT(cpu_matmul(NULL, y, x, w, GGML_TYPE_Q4_K, 1, 256, 1, &err), -1);
    CHECK(strstr(err.msg, "q4_K") != NULL);
    err.msg[0] = 0;
    CHECK_EQ_INT(cpu_matmul(NULL, y, x, w, GGML_TYPE_Q8_0, 1, 40, 1, &err), -1);
    CHECK(strstr(err.msg, "40") != NULL);
    CHECK_EQ_INT(cpu_matmul(NULL, y, x, w, 999, 1, 32, 1, &err), -1);
    CHECK_EQ_INT(cpu_matmul(NULL, y, x, w, GGML_TYPE_F32, 1, 0, 1, &err), -1);
    CHECK_EQ_INT(cpu_matmul(NULL, y, x, w, GGML_TYPE_F32, -1, 4, 1, &err), -1);
    CHECK_EQ_INT(cpu_matmul(NULL, NULL, x, w, GGML_TYPE_F32, 1, 4, 1, &err), -1);
    CHECK_EQ_INT(cpu_matmul(NULL, y, x, w, GGML_TYPE_F32, 0, 4, 1, &err), 0); /* empty: nothing to do */
    /* NULL pool = one thread. */
    float w4[4] = {1, 2, 3, 4}, x4[4] = {1, 1, 1, 0.5f}, y1 = 0;
    CHECK_EQ_INT(cpu_matmul(NULL, &y1, x4, w4, GGML_TYPE_F32, 1, 4, 1, &err), 0);
    CHECK_NEAR(y1, 8.0, 0);
    return test_summary();
}
