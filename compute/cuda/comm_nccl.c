/* comm_nccl.c — compute/comm.h over NCCL (see comm_nccl.h): ncclAllReduce
 * (ncclFloat32 / ncclBfloat16, ncclSum), ncclAllGather, ncclBroadcast, and a
 * barrier that is a 1-element all-reduce, on non-blocking communicators
 * whose every call goes through the rank's nccl_guard (deadline, poll,
 * abort). Each comm_ops call runs on the rank's own stream and waits for it
 * (polling an event), so the semantics (blocking, per-rank stats) match the
 * CPU group; the backend's all-reduce (comm_nccl_all_reduce_on) is ordered
 * with events instead. Plain C against the CUDA runtime API.
 */
#define _GNU_SOURCE
#include "compute/cuda/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"
#include "compute/cuda/nccl_guard_cuda.h"

typedef struct {
    comm c; /* first member: a comm* is an nccl_rank* */
    ncclComm_t nc;
    cudaStream_t stream;
    cudaEvent_t in_ev;   /* the caller's stream, before a collective */
    cudaEvent_t done_ev; /* the NCCL stream, after a collective */
    int device;
    float *scratch; /* 1 float on the device, for the barrier */
    nccl_guard guard;
} nccl_rank;

struct comm_nccl_group {
    int n;
    nccl_rank *ranks;
    atomic_int failed; /* one rank aborted: the others give up at their next poll */
};

static const comm_ops nccl_ops;

/* The rank's state after a guarded call: a failed guard marks the comm failed. */
static int settle(nccl_rank *h, int rc) {
    if (h->guard.aborted) {
        h->c.failed = 1;
        h->nc = NULL; /* ncclCommAbort freed it */
    }
    return rc;
}

static int cuda_fail(nccl_rank *h, st_err *err, const char *what, cudaError_t e) {
    /* A CUDA error around a collective leaves the peers waiting: abort. */
    char why[200];
    snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(e));
    cudaGetLastError();
    nccl_guard_abort(&h->guard, why);
    settle(h, -1);
    return st_errf(err, "comm nccl %s (%s): %s; communicator aborted", what, h->guard.name, why);
}

/* Makes the device current; fails at once on a failed communicator. */
static int begin(nccl_rank *h, const char *what, st_err *err) {
    if (h->guard.aborted)
        return st_errf(err, "comm nccl %s (%s): the communicator was aborted earlier (%s)", what, h->guard.name,
                       h->guard.why);
    cudaError_t e = cudaSetDevice(h->device);
    return e == cudaSuccess ? 0 : cuda_fail(h, err, what, e);
}

/* After enqueueing a collective on the rank's stream (NCCL said r): waits,
 * under the deadline, for NCCL to take it and for the stream to run it. */
static int finish(nccl_rank *h, const char *what, ncclResult_t r, st_err *err) {
    char why[200] = "";
    nccl_poll l = nccl_guard_launched(r, h->nc, why, sizeof why);
    if (l != NCCL_POLL_FAILED) {
        cudaError_t e = cudaEventRecord(h->done_ev, h->stream);
        if (e != cudaSuccess) return cuda_fail(h, err, what, e);
    }
    return settle(h, nccl_guard_wait(&h->guard, what, l, why, nccl_guard_event_poll, h->done_ev, err));
}

static int nccl_all_reduce_sum(comm *c, void *buf, size_t count, enum comm_dtype dtype, st_err *err) {
    if (!c) return st_errf(err, "comm nccl all_reduce: NULL comm");
    nccl_rank *h = (nccl_rank *)c;
    if (dtype != COMM_F32 && dtype != COMM_BF16)
        return st_errf(err, "comm nccl all_reduce (rank %d): unknown dtype %d", c->rank, (int)dtype);
    if (!buf && count) return st_errf(err, "comm nccl all_reduce (rank %d): NULL buffer", c->rank);
    double t0 = st_now_s();
    int rc = begin(h, "all_reduce", err);
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
    int rc = begin(h, "all_gather", err);
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
    int rc = begin(h, "broadcast", err);
    if (rc == 0) rc = finish(h, "broadcast", ncclBroadcast(buf, buf, bytes, ncclUint8, root, h->nc, h->stream), err);
    if (rc == 0) c->stats.broadcast_calls++;
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

static int nccl_barrier(comm *c, st_err *err) {
    if (!c) return st_errf(err, "comm nccl barrier: NULL comm");
    nccl_rank *h = (nccl_rank *)c;
    double t0 = st_now_s();
    int rc = begin(h, "barrier", err);
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

bool comm_is_nccl(const comm *c) { return c && c->ops == &nccl_ops; }

/* ---- the backend's event-ordered all-reduce ---- */

int comm_nccl_all_reduce_on(comm *c, void *buf, size_t count, enum comm_dtype dtype, void *stream, st_err *err) {
    if (!comm_is_nccl(c)) return st_errf(err, "comm nccl all_reduce: not an NCCL comm");
    nccl_rank *h = (nccl_rank *)c;
    if (dtype != COMM_F32 && dtype != COMM_BF16)
        return st_errf(err, "comm nccl all_reduce (rank %d): unknown dtype %d", c->rank, (int)dtype);
    if ((!buf && count) || !stream) return st_errf(err, "comm nccl all_reduce (rank %d): NULL buffer or stream", c->rank);
    double t0 = st_now_s();
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    int rc = begin(h, "all_reduce", err);
    if (rc == 0 && ((e = cudaEventRecord(h->in_ev, st)) != cudaSuccess ||
                    (e = cudaStreamWaitEvent(h->stream, h->in_ev, 0)) != cudaSuccess))
        rc = cuda_fail(h, err, "all_reduce", e);
    if (rc == 0) {
        ncclResult_t r = ncclAllReduce(buf, buf, count, dtype == COMM_F32 ? ncclFloat32 : ncclBfloat16, ncclSum,
                                       h->nc, h->stream);
        char why[200] = "";
        nccl_poll l = nccl_guard_launched(r, h->nc, why, sizeof why);
        /* Enqueued (ncclSuccess): nothing to wait for on the host. In
         * progress or failed: the guard waits for NCCL or aborts. */
        if (l != NCCL_POLL_DONE) rc = settle(h, nccl_guard_wait(&h->guard, "all_reduce", l, why, NULL, NULL, err));
    }
    if (rc == 0 && ((e = cudaEventRecord(h->done_ev, h->stream)) != cudaSuccess ||
                    (e = cudaStreamWaitEvent(st, h->done_ev, 0)) != cudaSuccess))
        rc = cuda_fail(h, err, "all_reduce", e);
    if (rc == 0) c->stats.all_reduce_calls++;
    c->stats.seconds += st_now_s() - t0;
    return rc;
}

int comm_nccl_wait_event(comm *c, void *event, const char *what, st_err *err) {
    if (!comm_is_nccl(c)) return st_errf(err, "%s: not an NCCL comm", what);
    nccl_rank *h = (nccl_rank *)c;
    /* Fast path: already done (the usual case for a decode step's download
     * once the host has prepared the next batch). */
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaSuccess && !h->guard.aborted) return 0;
    if (e != cudaSuccess && e != cudaErrorNotReady) return cuda_fail(h, err, what, e);
    return settle(h, nccl_guard_wait(&h->guard, what, NCCL_POLL_DONE, NULL, nccl_guard_event_poll, event, err));
}

void comm_nccl_set_timeout(comm *c, double seconds) {
    if (comm_is_nccl(c) && seconds > 0) ((nccl_rank *)c)->guard.timeout_s = seconds;
}

/* ---- the group ---- */

comm_nccl_group *comm_nccl_group_new(int n_devices, st_err *err) { return comm_nccl_group_new_on(n_devices, NULL, err); }

comm_nccl_group *comm_nccl_group_new_on(int n_devices, const int *devices, st_err *err) {
    int avail = 0;
    cudaError_t e = cudaGetDeviceCount(&avail);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return st_errf(err, "comm_nccl_group_new: no CUDA device: %s", cudaGetErrorString(e)), NULL;
    }
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
    if (!g || !(g->ranks = calloc((size_t)n_devices, sizeof *g->ranks))) {
        free(g);
        return st_errf(err, "comm_nccl_group_new: out of memory"), NULL;
    }
    atomic_init(&g->failed, 0);
    g->n = n_devices;
    const double timeout = nccl_guard_timeout_env("STRATA_NCCL_TIMEOUT_S", NCCL_GUARD_TIMEOUT_S);
    const double init_timeout = nccl_guard_timeout_env("STRATA_NCCL_INIT_TIMEOUT_S", NCCL_GUARD_INIT_TIMEOUT_S);
    for (int i = 0; i < n_devices; i++) {
        nccl_rank *h = &g->ranks[i];
        h->c.ops = &nccl_ops;
        h->c.rank = i;
        h->c.size = n_devices;
        h->device = devices ? devices[i] : i;
        char name[48];
        snprintf(name, sizeof name, "rank %d of %d, device %d", i, n_devices, h->device);
        nccl_guard_init(&h->guard, &nccl_guard_real_ops, NULL, init_timeout, &g->failed, name);
        h->guard.deadline_var = "STRATA_NCCL_INIT_TIMEOUT_S";
    }
    /* Streams, events and the barrier's scratch first: nothing of NCCL yet. */
    for (int i = 0; i < n_devices; i++) {
        nccl_rank *h = &g->ranks[i];
        if ((e = cudaSetDevice(h->device)) != cudaSuccess ||
            (e = cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&h->in_ev, cudaEventDisableTiming)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&h->done_ev, cudaEventDisableTiming)) != cudaSuccess ||
            (e = cudaMalloc((void **)&h->scratch, sizeof(float))) != cudaSuccess ||
            (e = cudaMemset(h->scratch, 0, sizeof(float))) != cudaSuccess) {
            cudaGetLastError();
            st_errf(err, "comm_nccl_group_new: device %d: CUDA: %s", h->device, cudaGetErrorString(e));
            comm_nccl_group_free(g);
            return NULL;
        }
    }
    /* Non-blocking communicators, one unique id, created as one NCCL group. */
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        st_errf(err, "comm_nccl_group_new: ncclGetUniqueId: %s", ncclGetErrorString(r));
        comm_nccl_group_free(g);
        return NULL;
    }
    ncclResult_t *rs = calloc((size_t)n_devices, sizeof *rs);
    if (!rs) {
        st_errf(err, "comm_nccl_group_new: out of memory");
        comm_nccl_group_free(g);
        return NULL;
    }
    ncclGroupStart();
    for (int i = 0; i < n_devices; i++) {
        nccl_rank *h = &g->ranks[i];
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        cudaSetDevice(h->device);
        rs[i] = ncclCommInitRankConfig(&h->nc, n_devices, id, i, &cfg);
    }
    ncclResult_t rg = ncclGroupEnd();
    int rc = 0;
    for (int i = 0; i < n_devices; i++) {
        nccl_rank *h = &g->ranks[i];
        h->guard.comm = h->nc;
        char why[200] = "";
        ncclResult_t ri = rs[i] != ncclSuccess ? rs[i] : rg;
        nccl_poll l = nccl_guard_launched(ri, NULL, why, sizeof why);
        if (!h->nc && l != NCCL_POLL_FAILED) {
            l = NCCL_POLL_FAILED;
            snprintf(why, sizeof why, "ncclCommInitRankConfig gave no communicator");
        }
        st_err e2;
        if (settle(h, nccl_guard_wait(&h->guard, "init", l, why, NULL, NULL, rc ? &e2 : err)) && rc == 0) rc = -1;
        h->guard.timeout_s = timeout;
        h->guard.deadline_var = "STRATA_NCCL_TIMEOUT_S";
    }
    free(rs);
    if (rc) {
        comm_nccl_group_free(g);
        return NULL;
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
    const bool failed = atomic_load(&g->failed) != 0;
    /* Finalise every intact communicator (it flushes what is queued), then
     * destroy it; a failed group is aborted instead: a finalise could wait
     * for a peer that is gone. */
    for (int i = 0; i < g->n; i++) {
        nccl_rank *h = &g->ranks[i];
        if (!h->nc) continue;
        cudaSetDevice(h->device);
        if (failed) {
            nccl_guard_abort(&h->guard, "the group failed");
            settle(h, -1);
            continue;
        }
        char why[200] = "";
        nccl_poll l = nccl_guard_launched(ncclCommFinalize(h->nc), h->nc, why, sizeof why);
        st_err e2;
        if (settle(h, nccl_guard_wait(&h->guard, "finalize", l, why, NULL, NULL, &e2)))
            ST_WARN("%s", e2.msg);
    }
    for (int i = 0; i < g->n; i++) {
        nccl_rank *h = &g->ranks[i];
        cudaSetDevice(h->device);
        if (h->nc) ncclCommDestroy(h->nc);
        if (h->stream) cudaStreamSynchronize(h->stream);
        if (h->in_ev) cudaEventDestroy(h->in_ev);
        if (h->done_ev) cudaEventDestroy(h->done_ev);
        if (h->stream) cudaStreamDestroy(h->stream);
        if (h->scratch) cudaFree(h->scratch);
    }
    cudaGetLastError();
    free(g->ranks);
    free(g);
}
