/* p2p_nccl.c — a 2-rank NCCL communicator per pipeline boundary: ncclSend /
 * ncclRecv of device buffers between two processes (p2p_nccl.h). Every wait
 * goes through nccl_guard (deadline, poll, abort), as the TP collectives of
 * comm_nccl.c do. Plain C against the CUDA runtime API. */
#define _GNU_SOURCE
#include "compute/cuda/p2p_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/cuda/nccl_guard_cuda.h"

struct backend_p2p {
    ncclComm_t nc;
    cudaStream_t stream;
    cudaEvent_t done_ev; /* recorded after each transfer: the guard waits for it */
    int rank, device;
    nccl_guard guard;
};

/* After a guarded wait: an aborted communicator is gone (abort freed it). */
static int settle(backend_p2p *p, int rc)
{
    if (p->guard.aborted) p->nc = NULL;
    return rc;
}

/* ---- the table ---- */

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
        /* finalize flushes what is queued; the guard aborts it past the deadline */
        char why[200] = "";
        nccl_poll l = nccl_guard_launched(ncclCommFinalize(p->nc), p->nc, why, sizeof why);
        st_err e;
        if (settle(p, nccl_guard_wait(&p->guard, "finalize", l, why, NULL, NULL, &e)) == 0 && p->nc)
            ncclCommDestroy(p->nc);
        p->nc = NULL;
    }
    if (p->done_ev) cudaEventDestroy(p->done_ev);
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
    char name[48];
    snprintf(name, sizeof name, "p2p rank %d (device %d)", rank, device);
    nccl_guard_init(&p->guard, &nccl_guard_real_ops, NULL, timeout_s, NULL, name);
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->done_ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cudaGetLastError();
        st_errf(err, "nccl p2p (rank %d): device %d: %s", rank, device, cudaGetErrorString(e));
        p2p_close(p);
        return NULL;
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id, NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* the init and every call return at once; the guard polls */
    char why[200] = "";
    nccl_poll l = nccl_guard_launched(ncclCommInitRankConfig(&p->nc, 2, uid, rank, &cfg), NULL, why, sizeof why);
    if (!p->nc && l != NCCL_POLL_FAILED) {
        l = NCCL_POLL_FAILED;
        snprintf(why, sizeof why, "ncclCommInitRankConfig gave no communicator");
    }
    p->guard.comm = p->nc;
    if (settle(p, nccl_guard_wait(&p->guard, "init", l, why, NULL, NULL, err))) {
        p2p_close(p);
        return NULL;
    }
    return p;
}

static int p2p_xfer(backend_p2p *p, bool send, void *dev, size_t bytes, double timeout_s, st_err *err)
{
    const char *what = send ? "send" : "recv";
    if (!p) return st_errf(err, "nccl p2p %s: no communicator", what);
    if (p->guard.aborted)
        return st_errf(err, "nccl p2p %s (%s): the communicator was aborted earlier (%s)", what, p->guard.name,
                       p->guard.why);
    if (bytes && !dev) return st_errf(err, "nccl p2p %s: NULL buffer", what);
    if (!bytes) return 0;
    char why[200] = "";
    cudaError_t e = cudaSetDevice(p->device);
    ncclResult_t r = ncclSuccess;
    if (e == cudaSuccess)
        r = send ? ncclSend(dev, bytes, ncclUint8, 1 - p->rank, p->nc, p->stream)
                 : ncclRecv(dev, bytes, ncclUint8, 1 - p->rank, p->nc, p->stream);
    nccl_poll l = e != cudaSuccess ? NCCL_POLL_FAILED : nccl_guard_launched(r, p->nc, why, sizeof why);
    if (e != cudaSuccess) snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(e));
    if (l != NCCL_POLL_FAILED && (e = cudaEventRecord(p->done_ev, p->stream)) != cudaSuccess) {
        l = NCCL_POLL_FAILED;
        snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(e));
    }
    if (e != cudaSuccess) cudaGetLastError();
    p->guard.timeout_s = timeout_s;
    return settle(p, nccl_guard_wait(&p->guard, what, l, why, nccl_guard_event_poll, p->done_ev, err));
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
