/* p2p_nccl.c — a 2-rank NCCL communicator per pipeline boundary: ncclSend /
 * ncclRecv of device buffers between two processes (p2p_nccl.h). Plain C
 * against the CUDA runtime API. */
#define _GNU_SOURCE
#include "compute/cuda/p2p_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"

struct backend_p2p {
    ncclComm_t nc;
    cudaStream_t stream;
    int rank, device;
    bool broken; /* aborted: only close */
};

static void nap(void)
{
    struct timespec ts = {0, 200 * 1000}; /* 0.2 ms: a transfer of a decode step takes longer */
    nanosleep(&ts, NULL);
}

static int fail_abort(backend_p2p *p, st_err *err, const char *what, const char *why)
{
    if (p->nc && !p->broken) ncclCommAbort(p->nc);
    p->nc = NULL;
    p->broken = true;
    return st_errf(err, "nccl p2p (rank %d, device %d) %s: %s; communicator aborted", p->rank, p->device, what, why);
}

/* Waits until the communicator has no operation in progress (after a
 * non-blocking call) and, with `stream_too`, the stream is done. */
static int wait_done(backend_p2p *p, const char *what, bool stream_too, double deadline, st_err *err)
{
    for (;;) {
        ncclResult_t a = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(p->nc, &a);
        if (r != ncclSuccess) return fail_abort(p, err, what, ncclGetErrorString(r));
        if (a != ncclSuccess && a != ncclInProgress) return fail_abort(p, err, what, ncclGetErrorString(a));
        if (a == ncclSuccess) {
            if (!stream_too) return 0;
            cudaError_t e = cudaStreamQuery(p->stream);
            if (e == cudaSuccess) return 0;
            if (e != cudaErrorNotReady) {
                cudaGetLastError();
                return fail_abort(p, err, what, cudaGetErrorString(e));
            }
        }
        if (st_now_s() > deadline) return fail_abort(p, err, what, "timed out (peer gone or stalled)");
        nap();
    }
}

static int p2p_unique_id(uint8_t *out, st_err *err)
{
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return st_errf(err, "nccl p2p: ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(out, id.internal, NCCL_UNIQUE_ID_BYTES);
    return 0;
}

static void p2p_close(backend_p2p *p)
{
    if (!p) return;
    cudaSetDevice(p->device);
    if (p->nc) {
        /* finalize flushes what is queued; abort if that does not end */
        ncclResult_t r = ncclCommFinalize(p->nc);
        st_err e;
        if (r == ncclSuccess || r == ncclInProgress) {
            if (wait_done(p, "close", false, st_now_s() + 5.0, &e) == 0) ncclCommDestroy(p->nc);
        } else {
            ncclCommAbort(p->nc);
        }
        p->nc = NULL;
    }
    if (p->stream) cudaStreamDestroy(p->stream);
    free(p);
}

static backend_p2p *p2p_open(const uint8_t *id, int rank, int device, double timeout_s, st_err *err)
{
    if (rank != 0 && rank != 1) return st_errf(err, "nccl p2p: rank %d (want 0 or 1)", rank), NULL;
    backend_p2p *p = calloc(1, sizeof *p);
    if (!p) return st_errf(err, "nccl p2p: out of memory"), NULL;
    p->rank = rank;
    p->device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cudaGetLastError();
        st_errf(err, "nccl p2p (rank %d): device %d: %s", rank, device, cudaGetErrorString(e));
        p2p_close(p);
        return NULL;
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id, NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* the init and every call return at once; wait_done polls */
    ncclResult_t r = ncclCommInitRankConfig(&p->nc, 2, uid, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        st_errf(err, "nccl p2p (rank %d, device %d) init: %s", rank, device, ncclGetErrorString(r));
        if (p->nc) ncclCommAbort(p->nc);
        p->nc = NULL;
        p2p_close(p);
        return NULL;
    }
    if (wait_done(p, "init", false, st_now_s() + timeout_s, err)) {
        p2p_close(p);
        return NULL;
    }
    return p;
}

static int p2p_xfer(backend_p2p *p, bool send, void *dev, size_t bytes, double timeout_s, st_err *err)
{
    const char *what = send ? "send" : "recv";
    if (!p || p->broken) return st_errf(err, "nccl p2p %s: the communicator was aborted", what);
    if (bytes && !dev) return st_errf(err, "nccl p2p %s: NULL buffer", what);
    if (!bytes) return 0;
    cudaError_t e = cudaSetDevice(p->device);
    if (e != cudaSuccess) return fail_abort(p, err, what, cudaGetErrorString(e));
    const double deadline = st_now_s() + timeout_s;
    ncclResult_t r = send ? ncclSend(dev, bytes, ncclUint8, 1 - p->rank, p->nc, p->stream)
                          : ncclRecv(dev, bytes, ncclUint8, 1 - p->rank, p->nc, p->stream);
    if (r != ncclSuccess && r != ncclInProgress) return fail_abort(p, err, what, ncclGetErrorString(r));
    return wait_done(p, what, true, deadline, err);
}

static int p2p_send(backend_p2p *p, const void *dev, size_t bytes, double timeout_s, st_err *err)
{
    return p2p_xfer(p, true, (void *)dev, bytes, timeout_s, err);
}

static int p2p_recv(backend_p2p *p, void *dev, size_t bytes, double timeout_s, st_err *err)
{
    return p2p_xfer(p, false, dev, bytes, timeout_s, err);
}

const backend_p2p_ops p2p_nccl_ops = {
    .id_bytes = NCCL_UNIQUE_ID_BYTES,
    .unique_id = p2p_unique_id,
    .open = p2p_open,
    .send = p2p_send,
    .recv = p2p_recv,
    .close = p2p_close,
};
