/* p2p_nccl.h — NCCL point-to-point between two processes, for the
 * activations of one pipeline boundary (compute/registry.h backend_p2p_ops,
 * exported by libstrata-cuda.so's table). Non-blocking communicators; every
 * wait goes through nccl_guard.h (ncclCommGetAsyncError and the transfer's
 * CUDA event polled against the caller's deadline, ncclCommAbort on an error
 * or a timeout), so a lost peer never hangs the worker. */
#ifndef STRATA_COMPUTE_CUDA_P2P_NCCL_H
#define STRATA_COMPUTE_CUDA_P2P_NCCL_H

#include "compute/registry.h"

extern const backend_p2p_ops p2p_nccl_ops;

#endif
