/* matmul.c — portable reference matmul (scalar). Fast SIMD paths replace it. */
#include "compute/cpu/matmul.h"

#include <stdlib.h>

#include "common/dtype.h"

typedef struct {
    float *y;
    const float *x;
    const uint8_t *w;
    uint32_t wtype;
    int64_t T, K, N;
    size_t row_bytes;
} mm_job;

static void mm_rows(void *p, int ith, int nth) {
    mm_job *j = p;
    long lo, hi;
    st_split_range((long)j->N, ith, nth, &lo, &hi);
    float *row = malloc(sizeof(float) * (size_t)j->K);
    for (long n = lo; n < hi; n++) {
        st_dequant_row(j->wtype, j->w + (size_t)n * j->row_bytes, row, j->K);
        for (int64_t i = 0; i < j->T; i++) {
            const float *xi = j->x + i * j->K;
            float s = 0;
            for (int64_t k = 0; k < j->K; k++) s += xi[k] * row[k];
            j->y[i * j->N + n] = s;
        }
    }
    free(row);
}

int cpu_matmul(st_pool *pool, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
               int64_t K, int64_t N, st_err *err) {
    size_t rb = ggml_row_bytes(wtype, K);
    if (rb == 0) return st_errf(err, "matmul: unsupported weight type %s for K=%lld", ggml_type_name(wtype), (long long)K);
    mm_job j = {y, x, w, wtype, T, K, N, rb};
    st_pool_run(pool, mm_rows, &j);
    return 0;
}

const char *cpu_simd_level(void) { return "scalar"; }
