/* test_matmul.c — cpu_matmul against a double-precision reference computed
 * from st_dequant_row: every weight type × every SIMD level this CPU has ×
 * shapes (K not a multiple of 16/64 for the dense types, odd N, T = 1, 2, 3,
 * 7, 64, 70 covering matvec and GEMM paths, a T > 256 chunked GEMM, the
 * OpenBLAS GEMM path) × pools of 1, 2 and 3 threads; bad types and shapes. */
#include <math.h>
#include <stdint.h>

#include "common/dtype.h"
#include "compute/cpu/matmul.h"
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

/* Encodes N×K random weights of `type` (ggml's quantizers for Q8_0/Q4_0). */
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
            for (int64_t b = 0; b < K / 32; b++, d += 34) {
                float amax = 0;
                for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(row[b * 32 + i]));
                float s = amax / 127.0f, id = s ? 1.0f / s : 0;
                put16(d, st_f32_to_fp16(s));
                for (int i = 0; i < 32; i++) d[2 + i] = (uint8_t)(int8_t)roundf(row[b * 32 + i] * id);
            }
            break;
        case GGML_TYPE_Q4_0:
            for (int64_t b = 0; b < K / 32; b++, d += 18) {
                float amax = 0, mx = 0;
                for (int i = 0; i < 32; i++)
                    if (fabsf(row[b * 32 + i]) > amax) amax = fabsf(row[b * 32 + i]), mx = row[b * 32 + i];
                float s = mx / -8.0f, id = s ? 1.0f / s : 0;
                put16(d, st_f32_to_fp16(s));
                for (int i = 0; i < 16; i++) {
                    int q0 = (int)(row[b * 32 + i] * id + 8.5f), q1 = (int)(row[b * 32 + 16 + i] * id + 8.5f);
                    q0 = q0 > 15 ? 15 : q0 < 0 ? 0 : q0;
                    q1 = q1 > 15 ? 15 : q1 < 0 ? 0 : q1;
                    d[2 + i] = (uint8_t)(q0 | (q1 << 4));
                }
            }
            break;
        }
    }
    free(row);
    return w;
}

static int n_cases, n_bad_cases;

/* Runs one case and compares every output with the f64 reference:
 * |y - ref| <= 3e-6 * sum_k |x w| + 1e-7 (f32 accumulation error bound). */
static void check_case(st_pool *pool, const char *lv, uint32_t type, int64_t T, int64_t K, int64_t N) {
    size_t rb = ggml_row_bytes(type, K);
    REQUIRE(rb > 0);
    uint8_t *w = make_weights(type, K, N);
    float *x = malloc(sizeof(float) * (size_t)(T * K));
    for (int64_t i = 0; i < T * K; i++) x[i] = frand();
    const int64_t guard = 16;
    float *y = malloc(sizeof(float) * (size_t)(T * N + guard));
    for (int64_t i = 0; i < T * N + guard; i++) y[i] = 12345.0f;
    st_err err = {{0}};
    int rc = cpu_matmul(pool, y, x, w, type, T, K, N, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    float *deq = malloc(sizeof(float) * (size_t)K);
    int bad = 0;
    for (int64_t n = 0; n < N && !bad; n++) {
        REQUIRE(st_dequant_row(type, w + (size_t)n * rb, deq, K) == 0);
        for (int64_t t = 0; t < T; t++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; k++) {
                s += (double)x[t * K + k] * deq[k];
                a += fabs((double)x[t * K + k] * deq[k]);
            }
            double got = y[t * N + n], tol = 3e-6 * a + 1e-7;
            if (!(fabs(got - s) <= tol)) {
                fprintf(stderr, "level %s type %s T=%lld K=%lld N=%lld pool %d: y[%lld,%lld] = %.9g, ref %.9g (tol %.3g)\n",
                        lv, ggml_type_name(type), (long long)T, (long long)K, (long long)N, st_pool_size(pool),
                        (long long)t, (long long)n, got, s, tol);
                bad = 1;
                break;
            }
        }
    }
    for (int64_t i = T * N; i < T * N + guard; i++)
        if (y[i] != 12345.0f) bad = 1;
    CHECK_MSG(!bad, "mismatch (see above) or write past y: %s %s T=%lld K=%lld N=%lld", lv,
              ggml_type_name(type), (long long)T, (long long)K, (long long)N);
    n_cases++;
    n_bad_cases += bad;
    free(deq);
    free(y);
    free(x);
    free(w);
}

int main(void) {
    const char *levels[] = {"scalar", "avx2", "avx512"};
    const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    const int64_t Ts[] = {1, 2, 3, 7, 64, 70};
    /* (K, N): dense types get K that are not multiples of 16 or 64. */
    const int64_t dense_kn[][2] = {{5, 3}, {37, 17}, {300, 201}, {64, 1}};
    const int64_t quant_kn[][2] = {{32, 5}, {96, 17}, {320, 201}};
    const char *best = cpu_simd_level();
    fprintf(stderr, "best SIMD level: %s\n", best);
    int n_levels = 0;

    st_err err = {{0}};
    for (int li = 0; li < 3; li++) {
        if (cpu_matmul_set_level(levels[li], &err) != 0) {
            fprintf(stderr, "level %s not available here: %s\n", levels[li], err.msg);
            continue;
        }
        n_levels++;
        CHECK_EQ_STR(cpu_simd_level(), levels[li]);
        for (int np = 1; np <= 3; np++) {
            st_pool *pool = st_pool_new(np, &err);
            REQUIRE(pool);
            for (int ti = 0; ti < 5; ti++) {
                uint32_t type = types[ti];
                int dense = ggml_block_size(type) == 1;
                int nkn = dense ? 4 : 3;
                for (int s = 0; s < nkn; s++) {
                    int64_t K = dense ? dense_kn[s][0] : quant_kn[s][0];
                    int64_t N = dense ? dense_kn[s][1] : quant_kn[s][1];
                    for (int i = 0; i < 6; i++) {
                        /* The biggest shape only on the 2-thread pool (time under ASan). */
                        if (K * N > 20000 && np != 2 && Ts[i] > 3) continue;
                        check_case(pool, levels[li], type, Ts[i], K, N);
                    }
                }
            }
            /* T > 256: the own GEMM packs x in chunks of 256 tokens. */
            if (np == 2) {
                check_case(pool, levels[li], GGML_TYPE_F16, 260, 40, 9);
                check_case(pool, levels[li], GGML_TYPE_Q8_0, 300, 64, 7);
                /* Token tiles of 16, 32 and 48 in the own GEMM's micro-kernel. */
                check_case(pool, levels[li], GGML_TYPE_F16, 9, 130, 50);
                check_case(pool, levels[li], GGML_TYPE_F32, 20, 33, 13);
                check_case(pool, levels[li], GGML_TYPE_BF16, 33, 64, 101);
                /* The OpenBLAS GEMM path (the default below AVX-512). */
                cpu_matmul_set_blas_gemm(1);
                check_case(pool, levels[li], GGML_TYPE_F32, 70, 37, 17);
                check_case(pool, levels[li], GGML_TYPE_BF16, 64, 300, 130);
                check_case(pool, levels[li], GGML_TYPE_Q4_0, 9, 96, 70);
                cpu_matmul_set_blas_gemm(0);
            }
            st_pool_free(pool);
        }
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
