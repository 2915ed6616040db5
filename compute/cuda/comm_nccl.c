/* comm_nccl.c — compute/comm.h over NCCL (see comm_nccl.h): ncclAllReduce
 * (ncclFloat32 / ncclBfloat16, ncclSum), ncclAllGather, ncclBroadcast, and a
 * barrier that is a 1-element all-reduce. Each op runs on the rank's own
 * stream and synchronizes it before returning, so the semantics (blocking,
 * per-rank stats) match the CPU group. Plain C against the CUDA runtime API.
 */
#define _GNU_SOURCE
#include "compute/cuda/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

#include "common/clock.h"

typedef struct {
    comm c; /* first member: a comm* is an nccl_rank* */
    ncclComm_t nc;
    cudaStream_t stream;
    int device;
    float *scratch; /* 1 float on the device, for the barrier */
} nccl_rank;

struct comm_nccl_group {
    int n;
    nccl_rank *ranks;
};

static int cuda_fail(st_err *err, const char *what, int rank, cudaError_t e) {
    return st_errf(err, "comm nccl %s (rank %d): CUDA: %s", what, rank, cudaGetErrorString(e));
}

static int nccl_fail(st_err *err, const char *what, nccl_rank *h, ncclResult_t r) {
    const char *last = h && h->nc ? ncclGetLastError(h->nc) : NULL;
    return st_errf(err, "comm nccl %s (rank %d): %s%s%s", what, h ? h->c.rank : -1, ncclGetErrorString(r),
                   last && *last ? ": " : "", last && *last ? last : "");
}

/* Makes the device current, then waits for the op enqueued by `r`. */
static int finish(nccl_rank *h, const char *what, ncclResult_t r, st_err *err) {
    if (r != ncclSuccess) return nccl_fail(err, what, h, r);
    cudaError_t e = cudaStreamSynchronize(h->stream);
    if (e != cudaSuccess) return cuda_fail(err, what, h->c.rank, e);
    return 0;
}

static int use_device(nccl_rank *h, const char *what, st_err *err) {
    cudaError_t e = cudaSetDevice(h->device);
    return e == cudaSuccess ? 0 : cuda_fail(err, what, h->c.rank, e);
}

static int nccl_all_reduce_sum(comm *c, void *buf, size_t count, enum comm_dtype dtype, st_err *err) {
    if (!c) return st_errf(err, "comm nccl all_reduce: NULL comm");
    nccl_rank *h = (nccl_rank *)c;
    if (dtype != COMM_F32 && dtype != COMM_BF16)
        return st_errf(err, "comm nccl all_reduce (rank %d): unknown dtype %d", c->rank, (int)dtype);
    if (!buf && count) return st_errf(err, "comm nccl all_reduce (rank %d): NULL buffer", c->rank);
    double t0 = st_now_s();
    int rc = use_device(h, "all_reduce", err);
    if (rc == 0)
        rc = finish(h, "all_reduce",
                    ncclAllReduce(buf, buf, count, dtype == COMM_F32 ? ncclFloat32 : ncclBfloat16, ncclSum, h->nc,
                                  h->stream),
                    err);
    if (rc == 0) c->stats.all_reduce_calls++;
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static int nccl_all_gather(comm *c, const void *send, void *recv, size_t bytes, st_err *err) {
    if (!c) return st_errf(err, "comm nccl all_gather: NULL comm");
    nccl_rank *h = (nccl_rank *)c;
    if (bytes && (!send || !recv)) return st_errf(err, "comm nccl all_gather (rank %d): NULL buffer", c->rank);
    double t0 = st_now_s();
    int rc = use_device(h, "all_gather", err);
    if (rc == 0) rc = finish(h, "all_gather", ncclAllGather(send, recv, bytes, ncclUint8, h->nc, h->stream), err);
    if (rc == 0) c->stats.all_gather_calls++;
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static int nccl_broadcast(comm *c, void *buf, size_t bytes, int root, st_err *err) {
    if (!c) return st_errf(err, "comm nccl broadcast: NULL comm");
    nccl_rank *h = (nccl_rank *)c;
    if (root < 0 || root >= c->size)
        return st_errf(err, "comm nccl broadcast (rank %d): root %d out of range (size %d)", c->rank, root, c->size);
    if (bytes && !buf) return st_errf(err, "comm nccl broadcast (rank %d): NULL buffer", c->rank);
    double t0 = st_now_s();
    int rc = use_device(h, "broadcast", err);
    if (rc == 0) rc = finish(h, "broadcast", ncclBroadcast(buf, buf, bytes, ncclUint8, root, h->nc, h->stream), err);
    if (rc == 0) c->stats.broadcast_calls++;
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static int nccl_barrier(comm *c, st_err *err) {
    if (!c) return st_errf(err, "comm nccl barrier: NULL comm");
    nccl_rank *h = (nccl_rank *)c;
    double t0 = st_now_s();
    int rc = use_device(h, "barrier", err);
    if (rc == 0)
        rc = finish(h, "barrier", ncclAllReduce(h->scratch, h->scratch, 1, ncclFloat32, ncclSum, h->nc, h->stream),
                    err);
    if (rc == 0) c->stats.barrier_calls++;
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static const comm_ops nccl_ops = {
    .all_reduce_sum = nccl_all_reduce_sum,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
};

comm_nccl_group *comm_nccl_group_new(int n_devices, st_err *err) { return comm_nccl_group_new_on(n_devices, NULL, err); }

comm_nccl_group *comm_nccl_group_new_on(int n_devices, const int *devices, st_err *err) {
    int avail = 0;
    cudaError_t e = cudaGetDeviceCount(&avail);
    if (e != cudaSuccess) return st_errf(err, "comm_nccl_group_new: no CUDA device: %s", cudaGetErrorString(e)), NULL;
    if (n_devices < 1 || n_devices > avail)
        return st_errf(err, "comm_nccl_group_new: %d devices asked, %d visible", n_devices, avail), NULL;
    for (int i = 0; devices && i < n_devices; i++) {
        if (devices[i] < 0 || devices[i] >= avail)
            return st_errf(err, "comm_nccl_group_new: device %d does not exist (%d visible)", devices[i], avail), NULL;
        for (int j = 0; j < i; j++)
            if (devices[j] == devices[i])
                return st_errf(err, "comm_nccl_group_new: device %d listed twice", devices[i]), NULL;
    }
    comm_nccl_group *g = calloc(1, sizeof *g);
    ncclComm_t *ncs = calloc((size_t)n_devices, sizeof *ncs);
    if (!g || !ncs || !(g->ranks = calloc((size_t)n_devices, sizeof *g->ranks))) {
        free(ncs);
        if (g) free(g->ranks);
        free(g);
        return st_errf(err, "comm_nccl_group_new: out of memory"), NULL;
    }
    ncclResult_t r = ncclCommInitAll(ncs, n_devices, devices);
    if (r != ncclSuccess) {
        st_errf(err, "comm_nccl_group_new: ncclCommInitAll(%d): %s", n_devices, ncclGetErrorString(r));
        free(ncs);
        free(g->ranks);
        free(g);
        return NULL;
    }
    g->n = n_devices;
    for (int i = 0; i < n_devices; i++) {
        nccl_rank *h = &g->ranks[i];
        h->c.ops = &nccl_ops;
        h->c.rank = i;
        h->c.size = n_devices;
        h->nc = ncs[i];
        h->device = devices ? devices[i] : i;
    }
    free(ncs);
    for (int i = 0; i < n_devices; i++) {
        nccl_rank *h = &g->ranks[i];
        if ((e = cudaSetDevice(h->device)) != cudaSuccess ||
            (e = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking)) != cudaSuccess ||
            (e = cudaMalloc((void **)&h->scratch, sizeof(float))) != cudaSuccess ||
            (e = cudaMemset(h->scratch, 0, sizeof(float))) != cudaSuccess) {
            cuda_fail(err, "group_new", h->device, e);
            comm_nccl_group_free(g);
            return NULL;
        }
    }
    return g;
}

comm *comm_nccl_rank(comm_nccl_group *g, int rank) {
    if (!g || rank < 0 || rank >= g->n) return NULL;
    return &g->ranks[rank].c;
}

int comm_nccl_device(const comm *c) { return c ? ((const nccl_rank *)c)->device : -1; }

void *comm_nccl_stream(const comm *c) { return c ? (void *)((const nccl_rank *)c)->stream : NULL; }

void comm_nccl_group_free(comm_nccl_group *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        nccl_rank *h = &g->ranks[i];
        cudaSetDevice(h->device);
        if (h->nc) ncclCommDestroy(h->nc);
        if (h->stream) cudaStreamDestroy(h->stream);
        if (h->scratch) cudaFree(h->scratch);
    }
    free(g->ranks);
    free(g);
}
