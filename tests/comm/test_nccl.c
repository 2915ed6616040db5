/* test_nccl.c — the NCCL collectives (compute/cuda/comm_nccl.c) on every
 * visible GPU, one host thread per rank, against host references. Not in
 * ctest: run it by hand on a GPU machine (build/tests/comm/test_nccl). With
 * no CUDA device it says so and exits 0.
 *
 * Inputs are small integers, so the sums are exact whatever order NCCL adds
 * them in (f32 and bf16: |sum| <= 8 * 16 = 128 fits bf16's 8-bit mantissa).
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"
#include "compute/cuda/comm_nccl.h"
#include "tests/testutil.h"

#define MAX_DEV 8

static const size_t sizes[] = {1, 17, 65537, (size_t)4 << 20};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

static float value(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 13) % 33) - 16); }

typedef struct {
    comm *c;
    int fails;
    char msg[ST_ERR_MSG_MAX];
} rank_arg;

#define FAIL(a, ...)                                              \
    do {                                                          \
        snprintf((a)->msg, sizeof (a)->msg, __VA_ARGS__);         \
        (a)->fails++;                                             \
        goto out;                                                 \
    } while (0)

static void *rank_main(void *p) {
    rank_arg *a = p;
    comm *c = a->c;
    int n = c->size, r = c->rank;
    st_err err;
    size_t max = sizes[N_SIZES - 1];
    float *h = malloc(max * sizeof(float) * (size_t)n);
    uint16_t *hb = malloc(max * sizeof(uint16_t));
    void *d = NULL, *d2 = NULL;
    if (!h || !hb) FAIL(a, "out of memory");
    if (cudaSetDevice(comm_nccl_device(c)) != cudaSuccess) FAIL(a, "cudaSetDevice");
    if (cudaMalloc(&d, max * sizeof(float) * (size_t)n) != cudaSuccess) FAIL(a, "cudaMalloc");
    if (cudaMalloc(&d2, max * sizeof(float)) != cudaSuccess) FAIL(a, "cudaMalloc");
    for (size_t s = 0; s < N_SIZES; s++) {
        size_t count = sizes[s];
        /* f32 */
        for (size_t i = 0; i < count; i++) h[i] = value(r, i);
        cudaMemcpy(d, h, count * 4, cudaMemcpyHostToDevice);
        if (comm_all_reduce_sum(c, d, count, COMM_F32, &err) != 0) FAIL(a, "%s", err.msg);
        cudaMemcpy(h, d, count * 4, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int k = 0; k < n; k++) want += value(k, i);
            if (h[i] != want) FAIL(a, "f32 all_reduce count %zu: element %zu is %g, want %g", count, i, h[i], want);
        }
        /* bf16 */
        for (size_t i = 0; i < count; i++) hb[i] = st_f32_to_bf16(value(r, i));
        cudaMemcpy(d, hb, count * 2, cudaMemcpyHostToDevice);
        if (comm_all_reduce_sum(c, d, count, COMM_BF16, &err) != 0) FAIL(a, "%s", err.msg);
        cudaMemcpy(hb, d, count * 2, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int k = 0; k < n; k++) want += value(k, i);
            if (hb[i] != st_f32_to_bf16(want)) FAIL(a, "bf16 all_reduce count %zu: element %zu wrong", count, i);
        }
        /* all-gather of count floats */
        for (size_t i = 0; i < count; i++) h[i] = value(r, i);
        cudaMemcpy(d2, h, count * 4, cudaMemcpyHostToDevice);
        if (comm_all_gather(c, d2, d, count * 4, &err) != 0) FAIL(a, "%s", err.msg);
        cudaMemcpy(h, d, count * 4 * (size_t)n, cudaMemcpyDeviceToHost);
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < count; i++)
                if (h[(size_t)k * count + i] != value(k, i)) FAIL(a, "all_gather count %zu: rank %d part wrong", count, k);
        /* broadcast from the last rank */
        for (size_t i = 0; i < count; i++) h[i] = value(r, i);
        cudaMemcpy(d, h, count * 4, cudaMemcpyHostToDevice);
        if (comm_broadcast(c, d, count * 4, n - 1, &err) != 0) FAIL(a, "%s", err.msg);
        cudaMemcpy(h, d, count * 4, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < count; i++)
            if (h[i] != value(n - 1, i)) FAIL(a, "broadcast count %zu: element %zu wrong", count, i);
    }
    if (comm_barrier(c, &err) != 0) FAIL(a, "%s", err.msg);
    if (comm_broadcast(c, d, 4, n, &err) != -1) FAIL(a, "broadcast with root %d did not fail", n);
out:
    if (d) cudaFree(d);
    if (d2) cudaFree(d2);
    free(h);
    free(hb);
    return NULL;
}

int main(void) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        printf("SKIP: test_nccl: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 77;
    }
    int n = count < MAX_DEV ? count : MAX_DEV;
    printf("test_nccl: %d device(s), %d rank(s)\n", count, n);
    st_err err;
    comm_nccl_group *g = comm_nccl_group_new(n, &err);
    REQUIRE_MSG(g != NULL, "%s", err.msg);
    CHECK(comm_nccl_group_new(count + 1, &err) == NULL);
    CHECK(comm_nccl_rank(g, n) == NULL);
    pthread_t th[MAX_DEV];
    rank_arg args[MAX_DEV];
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg){.c = comm_nccl_rank(g, r)};
        REQUIRE(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        CHECK_MSG(args[r].fails == 0, "rank %d: %s", r, args[r].msg);
        comm *c = comm_nccl_rank(g, r);
        if (args[r].fails == 0) {
            CHECK_EQ_INT(c->stats.all_reduce_calls, 2 * N_SIZES);
            CHECK_EQ_INT(c->stats.all_gather_calls, N_SIZES);
            CHECK_EQ_INT(c->stats.broadcast_calls, N_SIZES);
            CHECK_EQ_INT(c->stats.barrier_calls, 1);
            CHECK(c->stats.seconds > 0);
        }
    }
    comm_nccl_group_free(g);
    return test_summary();
}
