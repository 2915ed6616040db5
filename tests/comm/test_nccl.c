/* test_nccl.c — the NCCL collectives (compute/cuda/comm_nccl.c) on every
 * visible GPU, one host thread per rank, against host references; then the
 * deadline on a real GPU: a collective queued behind work that never ends
 * (a host function on the NCCL stream that blocks) times out, the
 * communicator is aborted once, comm.failed is set and every later call
 * fails at once; the CUDA backend's download behind such work fails the same
 * way under the comm's deadline. With no CUDA device it says so and exits 77
 * (ctest skip).
 *
 * Inputs are small integers, so the sums are exact whatever order NCCL adds
 * them in (f32 and bf16: |sum| <= 8 * 16 = 128 fits bf16's 8-bit mantissa).
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/dtype.h"
#include "compute/cuda/backend_cuda.h"
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

/* ---- the deadline: work that never ends ---- */

static atomic_int g_release;

/* Runs on the stream and blocks it until released (at most 30 s, so the
 * test cannot hang whatever happens). */
static void CUDART_CB block_stream(void *arg) {
    (void)arg;
    double t0 = st_now_s();
    while (!atomic_load(&g_release) && st_now_s() - t0 < 30) nanosleep(&(struct timespec){0, 1000000}, NULL);
}

static void test_deadline(void) {
    st_err err;
    /* The comm: an all-reduce behind a blocked NCCL stream. */
    comm_nccl_group *g = comm_nccl_group_new(1, &err);
    REQUIRE_MSG(g != NULL, "%s", err.msg);
    comm *c = comm_nccl_rank(g, 0);
    comm_nccl_set_timeout(c, 2.0);
    void *d = NULL;
    REQUIRE(cudaMalloc(&d, 4096) == cudaSuccess);
    atomic_store(&g_release, 0);
    REQUIRE(cudaLaunchHostFunc((cudaStream_t)comm_nccl_stream(c), block_stream, NULL) == cudaSuccess);
    double t0 = st_now_s();
    int rc = comm_all_reduce_sum(c, d, 1024, COMM_F32, &err);
    double dt = st_now_s() - t0;
    atomic_store(&g_release, 1);
    CHECK_EQ_INT(rc, -1);
    CHECK_MSG(strstr(err.msg, "timed out after") && strstr(err.msg, "communicator aborted"), "%s", err.msg);
    CHECK_MSG(dt >= 1.9 && dt < 10, "gave up after %.2f s (deadline 2 s)", dt);
    printf("test_nccl: deadline: an all_reduce behind a blocked stream was aborted after %.2f s (deadline 2 s)\n", dt);
    CHECK_EQ_INT(c->failed, 1);
    CHECK_EQ_INT(comm_barrier(c, &err), -1);
    CHECK_MSG(strstr(err.msg, "aborted earlier") != NULL, "%s", err.msg);
    CHECK_EQ_INT(c->stats.all_reduce_calls, 0);
    comm_nccl_group_free(g);

    /* The backend: a download behind an all-reduce behind a blocked stream. */
    g = comm_nccl_group_new(1, &err);
    REQUIRE_MSG(g != NULL, "%s", err.msg);
    c = comm_nccl_rank(g, 0);
    comm_nccl_set_timeout(c, 2.0);
    backend *be = backend_cuda_new(0, &err);
    REQUIRE_MSG(be != NULL, "%s", err.msg);
    float *buf = be->ops->alloc(be, 1024 * sizeof(float), &err);
    float host[1024];
    for (int i = 0; i < 1024; i++) host[i] = (float)i;
    REQUIRE(buf && be->ops->upload(be, buf, host, sizeof host, &err) == 0);
    /* A healthy all-reduce first (one rank: the sum is the input); no host wait in it. */
    CHECK_EQ_INT(be->ops->all_reduce(be, c, buf, 1024, &err), 0);
    CHECK_EQ_INT(be->ops->download(be, host, buf, sizeof host, &err), 0);
    CHECK(host[1023] == 1023.0f);
    atomic_store(&g_release, 0);
    REQUIRE(cudaLaunchHostFunc((cudaStream_t)comm_nccl_stream(c), block_stream, NULL) == cudaSuccess);
    CHECK_EQ_INT(be->ops->all_reduce(be, c, buf, 1024, &err), 0); /* enqueued: returns at once */
    t0 = st_now_s();
    rc = be->ops->download(be, host, buf, sizeof host, &err);
    dt = st_now_s() - t0;
    atomic_store(&g_release, 1);
    CHECK_EQ_INT(rc, -1);
    CHECK_MSG(strstr(err.msg, "cuda backend (device 0)") && strstr(err.msg, "timed out"), "%s", err.msg);
    CHECK_MSG(dt >= 1.9 && dt < 10, "download gave up after %.2f s (deadline 2 s)", dt);
    printf("test_nccl: deadline: the cuda backend's download behind it failed after %.2f s: %s\n", dt, err.msg);
    CHECK_EQ_INT(c->failed, 1);
    be->ops->release(be, buf);
    backend_free(be);
    comm_nccl_group_free(g);
    cudaFree(d);
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
    test_deadline();
    return test_summary();
}
