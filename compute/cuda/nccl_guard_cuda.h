/* nccl_guard_cuda.h — the real NCCL and CUDA calls behind nccl_guard.h, for
 * the module's NCCL users (comm_nccl.c: the TP collectives; p2p_nccl.c: a
 * pipeline boundary's send/recv). Only in the CUDA module. */
#ifndef STRATA_COMPUTE_CUDA_NCCL_GUARD_CUDA_H
#define STRATA_COMPUTE_CUDA_NCCL_GUARD_CUDA_H

#include <nccl.h>
#include <stddef.h>

#include "compute/cuda/nccl_guard.h"

/* ncclCommGetAsyncError / ncclCommAbort, st_now_s, nccl_guard_pause. */
extern const nccl_guard_ops nccl_guard_real_ops;

/* A nccl_work_poll over a cudaEvent_t (ctx): cudaEventQuery. */
nccl_poll nccl_guard_event_poll(void *ctx, char *why, size_t n);

/* What an NCCL call's result means to the guard (ncclSuccess: DONE,
 * ncclInProgress: PENDING, else FAILED with why, plus ncclGetLastError(comm)
 * when comm is not NULL). */
nccl_poll nccl_guard_launched(ncclResult_t r, ncclComm_t comm, char *why, size_t n);

#endif
