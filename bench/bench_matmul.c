/* bench_matmul.c — strata-bench-matmul: speed of cpu_matmul on its own, so
 * that decode (T small: GB/s of weights streamed) and prefill (T large:
 * GFLOP/s) can be judged without a model.
 *
 *   strata-bench-matmul [--shape NxK]... [--type f16|f32|bf16|q8_0|q4_0]
 *                       [--tokens 1,64] [--threads N] [--simd LEVEL] [--blas]
 *                       [--min-time S] [--model-gb G] [--json]
 *
 * Defaults: the bench-1b shapes 2048x2048 (q/k/v/o), 8192x2048 (gate/up),
 * 2048x8192 (down), F16, T = 1 and 64, all CPUs. Weights are replicated over
 * >= 1 GiB and rotated so that every call reads them from DRAM, not L3;
 * each figure is the best call within --min-time (default 0.5 s).
 * With the default shapes it also prints the bench-1b layer mix (4 : 2 : 1)
 * and the tok/s it implies for a model of --model-gb GB (default 2.21).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/dtype.h"
#include "compute/cpu/matmul.h"

#define MAX_SHAPES 16
#define MAX_T 16

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Random weights: random bytes with each element's scale/exponent sane. */
static void fill_weights(uint32_t type, uint8_t *w, int64_t K, int64_t N) {
    size_t rb = ggml_row_bytes(type, K);
    for (int64_t n = 0; n < N; n++) {
        uint8_t *r = w + (size_t)n * rb;
        switch (type) {
        case GGML_TYPE_F32:
            for (int64_t k = 0; k < K; k++) ((float *)r)[k] = frand() * 0.05f;
            break;
        case GGML_TYPE_F16:
        case GGML_TYPE_BF16:
            for (int64_t k = 0; k < K; k++) {
                uint16_t h = type == GGML_TYPE_F16 ? st_f32_to_fp16(frand() * 0.05f) : st_f32_to_bf16(frand() * 0.05f);
                memcpy(r + 2 * k, &h, 2);
            }
            break;
        default: { /* Q8_0 / Q4_0: scale then random quants */
            size_t bb = rb / (size_t)(K / 32);
            for (int64_t b = 0; b < K / 32; b++) {
                uint8_t *blk = r + (size_t)b * bb;
                uint16_t d = st_f32_to_fp16(0.001f);
                memcpy(blk, &d, 2);
                for (size_t i = 2; i < bb; i++) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    blk[i] = (uint8_t)(rng >> 56);
                }
            }
        }
        }
    }
}

typedef struct {
    int64_t N, K, T;
    double sec, gflops, gbps;
} result;

static int parse_type(const char *s, uint32_t *t) {
    const uint32_t all[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, ggml_type_name(all[i]))) return *t = all[i], 0;
    return -1;
}

static void usage(void) {
    fprintf(stderr,
            "usage: strata-bench-matmul [--shape NxK]... [--type f16|f32|bf16|q8_0|q4_0] [--tokens 1,64]\n"
            "                           [--threads N] [--simd scalar|avx2|avx512] [--blas] [--min-time S]\n"
            "                           [--model-gb G] [--json]\n");
}

int main(int argc, char **argv) {
    int64_t shapes[MAX_SHAPES][2];
    int nshapes = 0, nt = 0, threads = st_cpu_count(), json = 0, user_shapes = 0;
    int64_t Ts[MAX_T];
    uint32_t type = GGML_TYPE_F16;
    double min_time = 0.5, model_gb = 2.21;
    st_err err = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--blas")) {
            cpu_matmul_set_blas_gemm(1);
        } else if (!strcmp(a, "--shape") && v) {
            long long n, k;
            if (nshapes == MAX_SHAPES || sscanf(v, "%lldx%lld", &n, &k) != 2 || n < 1 || k < 1) {
                fprintf(stderr, "strata-bench-matmul: bad --shape '%s' (NxK, up to %d)\n", v, MAX_SHAPES);
                return 2;
            }
            shapes[nshapes][0] = n, shapes[nshapes][1] = k, nshapes++, user_shapes = 1, i++;
        } else if (!strcmp(a, "--type") && v) {
            if (parse_type(v, &type) != 0) {
                fprintf(stderr, "strata-bench-matmul: bad --type '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--tokens") && v) {
            char *s = (char *)v, *e;
            while (*s && nt < MAX_T) {
                long t = strtol(s, &e, 10);
                if (e == s || t < 1 || t > 65536) {
                    fprintf(stderr, "strata-bench-matmul: bad --tokens '%s'\n", v);
                    return 2;
                }
                Ts[nt++] = t;
                s = *e == ',' ? e + 1 : e;
                if (*e && *e != ',') break;
            }
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            threads = atoi(v), i++;
        } else if (!strcmp(a, "--simd") && v) {
            if (cpu_matmul_set_level(v, &err) != 0) {
                fprintf(stderr, "strata-bench-matmul: %s\n", err.msg);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--min-time") && v) {
            min_time = atof(v), i++;
        } else if (!strcmp(a, "--model-gb") && v) {
            model_gb = atof(v), i++;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "strata-bench-matmul: bad argument '%s'\n", a);
            usage();
            return 2;
        }
    }
    if (!nshapes) {
        const int64_t def[3][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
        for (int i = 0; i < 3; i++) shapes[i][0] = def[i][0], shapes[i][1] = def[i][1];
        nshapes = 3;
    }
    if (!nt) Ts[0] = 1, Ts[1] = 64, nt = 2;
    if (threads < 1 || threads > 1024 || min_time <= 0 || model_gb <= 0) {
        fprintf(stderr, "strata-bench-matmul: bad --threads, --min-time or --model-gb\n");
        return 2;
    }
    st_pool *pool = st_pool_new(threads, &err);
    if (!pool) {
        fprintf(stderr, "strata-bench-matmul: %s\n", err.msg);
        return 1;
    }
    result res[MAX_SHAPES][MAX_T];
    int rc = 0;
    for (int s = 0; s < nshapes && !rc; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        size_t rb = ggml_row_bytes(type, K);
        if (!rb) {
            fprintf(stderr, "strata-bench-matmul: K=%lld is not a multiple of the %s block\n", (long long)K, ggml_type_name(type));
            rc = 2;
            break;
        }
        size_t wbytes = rb * (size_t)N;
        int copies = (int)((1ull << 30) / wbytes) + 1;
        if (copies > 64) copies = 64;
        uint8_t *w = malloc(wbytes * (size_t)copies);
        int64_t tmax = 0;
        for (int i = 0; i < nt; i++) tmax = Ts[i] > tmax ? Ts[i] : tmax;
        float *x = malloc(sizeof(float) * (size_t)(tmax * K)), *y = malloc(sizeof(float) * (size_t)(tmax * N));
        if (!w || !x || !y) {
            fprintf(stderr, "strata-bench-matmul: out of memory\n");
            free(w), free(x), free(y);
            rc = 1;
            break;
        }
        fill_weights(type, w, K, N);
        for (int c = 1; c < copies; c++) memcpy(w + (size_t)c * wbytes, w, wbytes);
        for (int64_t i = 0; i < tmax * K; i++) x[i] = frand();
        for (int ti = 0; ti < nt; ti++) {
            int64_t T = Ts[ti];
            if (cpu_matmul(pool, y, x, w, type, T, K, N, &err) != 0) { /* warm-up */
                fprintf(stderr, "strata-bench-matmul: %s\n", err.msg);
                rc = 1;
                break;
            }
            /* Best call of those in min_time (robust to other load on the machine). */
            int reps = 0;
            double t0 = st_now_s(), el = 0, sec = 1e30;
            while (el < min_time || reps < 3) {
                double c0 = st_now_s();
                cpu_matmul(pool, y, x, w + (size_t)(reps % copies) * wbytes, type, T, K, N, &err);
                double c1 = st_now_s();
                if (c1 - c0 < sec) sec = c1 - c0;
                reps++;
                el = c1 - t0;
            }
            res[s][ti] = (result){N, K, T, sec, 2.0 * (double)T * (double)N * (double)K / sec / 1e9, (double)wbytes / sec / 1e9};
        }
        free(w), free(x), free(y);
    }
    if (rc) {
        st_pool_free(pool);
        return rc;
    }
    /* bench-1b layer mix: 4 × 2048x2048 + 2 × 8192x2048 + 1 × 2048x8192. */
    int mix = !user_shapes;
    double mix_gbps[MAX_T], mix_gflops[MAX_T];
    for (int ti = 0; ti < nt && mix; ti++) {
        const double wt[3] = {4, 2, 1};
        double sec = 0, bytes = 0, flops = 0;
        for (int s = 0; s < 3; s++) {
            sec += wt[s] * res[s][ti].sec;
            bytes += wt[s] * (double)ggml_row_bytes(type, res[s][ti].K) * (double)res[s][ti].N;
            flops += wt[s] * 2.0 * (double)res[s][ti].T * (double)res[s][ti].N * (double)res[s][ti].K;
        }
        mix_gbps[ti] = bytes / sec / 1e9;
        mix_gflops[ti] = flops / sec / 1e9;
    }
    if (json) {
        printf("{\"type\": \"%s\", \"threads\": %d, \"simd\": \"%s\", \"results\": [", ggml_type_name(type), threads, cpu_simd_level());
        for (int s = 0; s < nshapes; s++)
            for (int ti = 0; ti < nt; ti++) {
                result *r = &res[s][ti];
                printf("%s{\"N\": %lld, \"K\": %lld, \"T\": %lld, \"ms\": %.4f, \"gflops\": %.2f, \"weight_gbps\": %.2f}",
                       s || ti ? ", " : "", (long long)r->N, (long long)r->K, (long long)r->T, r->sec * 1e3, r->gflops, r->gbps);
            }
        printf("]");
        if (mix) {
            printf(", \"bench1b_mix\": [");
            for (int ti = 0; ti < nt; ti++)
                printf("%s{\"T\": %lld, \"weight_gbps\": %.2f, \"gflops\": %.2f, \"est_tok_s\": %.2f}", ti ? ", " : "",
                       (long long)Ts[ti], mix_gbps[ti], mix_gflops[ti], mix_gbps[ti] / model_gb * (double)Ts[ti]);
            printf("]");
        }
        printf("}\n");
    } else {
        printf("cpu_matmul: type %s, %d threads, SIMD %s\n", ggml_type_name(type), threads, cpu_simd_level());
        printf("%8s %8s %6s %10s %10s %12s\n", "N", "K", "T", "ms", "GFLOP/s", "weight GB/s");
        for (int s = 0; s < nshapes; s++)
            for (int ti = 0; ti < nt; ti++) {
                result *r = &res[s][ti];
                printf("%8lld %8lld %6lld %10.3f %10.2f %12.2f\n", (long long)r->N, (long long)r->K, (long long)r->T,
                       r->sec * 1e3, r->gflops, r->gbps);
            }
        if (mix) {
            printf("bench-1b layer mix (4x 2048x2048, 2x 8192x2048, 1x 2048x8192), model %.2f GB:\n", model_gb);
            for (int ti = 0; ti < nt; ti++)
                printf("  T=%-5lld %8.2f GB/s %9.2f GFLOP/s  => ~%.1f tok/s (matmuls only)\n", (long long)Ts[ti],
                       mix_gbps[ti], mix_gflops[ti], mix_gbps[ti] / model_gb * (double)Ts[ti]);
        }
    }
    st_pool_free(pool);
    return 0;
}
