/* nccl_guard_cuda.c — nccl_guard_cuda.h: the guard's calls into NCCL and CUDA. */
#include "compute/cuda/nccl_guard_cuda.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

/* "<NCCL's name for r>: <its last error on comm>" */
static void nccl_why(ncclResult_t r, ncclComm_t comm, char *why, size_t n) {
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    snprintf(why, n, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "", last && *last ? last : "");
}

static nccl_poll real_comm_state(void *comm, char *why, size_t n) {
    ncclComm_t nc = comm;
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(nc, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return NCCL_POLL_DONE;
    if (state == ncclInProgress) return NCCL_POLL_PENDING;
    nccl_why(state, nc, why, n);
    return NCCL_POLL_FAILED;
}

static void real_comm_abort(void *comm) { ncclCommAbort((ncclComm_t)comm); }

const nccl_guard_ops nccl_guard_real_ops = {real_comm_state, real_comm_abort, nccl_guard_now_s, nccl_guard_pause};

nccl_poll nccl_guard_event_poll(void *ctx, char *why, size_t n) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)ctx);
    if (e == cudaSuccess) return NCCL_POLL_DONE;
    if (e == cudaErrorNotReady) return NCCL_POLL_PENDING;
    snprintf(why, n, "CUDA: %s", cudaGetErrorString(e));
    return NCCL_POLL_FAILED;
}

nccl_poll nccl_guard_launched(ncclResult_t r, ncclComm_t comm, char *why, size_t n) {
    if (r == ncclSuccess) return NCCL_POLL_DONE;
    if (r == ncclInProgress) return NCCL_POLL_PENDING;
    nccl_why(r, comm, why, n);
    return NCCL_POLL_FAILED;
}
