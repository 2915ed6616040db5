/* comm_nccl.h — the NCCL implementation of compute/comm.h: one rank per GPU of
 * this process, built with ncclCommInitAll.
 *
 * Buffers passed to the ops are device pointers on the rank's device. Each
 * rank must be driven by its own host thread (the ops block: they enqueue the
 * NCCL call on the rank's stream and synchronize it), exactly like the CPU
 * group. Every op first makes the rank's device current on the calling thread.
 *
 * Errors: local argument errors (bad dtype, bad root, NULL buffer) and every
 * CUDA/NCCL failure return -1 with err. A count mismatch between ranks is not
 * detected (undefined in NCCL; checking it would cost a collective per call).
 */
#ifndef STRATA_COMPUTE_CUDA_COMM_NCCL_H
#define STRATA_COMPUTE_CUDA_COMM_NCCL_H

#include "common/err.h"
#include "compute/comm.h"

typedef struct comm_nccl_group comm_nccl_group;

/* A group over devices 0..n_devices-1 (ncclCommInitAll with devlist NULL).
 * Fails when fewer devices are visible or NCCL cannot initialise. */
comm_nccl_group *comm_nccl_group_new(int n_devices, st_err *err);
/* The same over devices[0..n_devices-1] (rank r on devices[r]; distinct,
 * visible); NULL devices = 0..n_devices-1. */
comm_nccl_group *comm_nccl_group_new_on(int n_devices, const int *devices, st_err *err);
/* The handle of rank r (owned by the group), or NULL when r is out of range. */
comm *comm_nccl_rank(comm_nccl_group *g, int rank);
/* The CUDA device of a rank's handle. */
int comm_nccl_device(const comm *c);
/* The rank's cudaStream_t (as void*, so that this header needs no CUDA). */
void *comm_nccl_stream(const comm *c);
void comm_nccl_group_free(comm_nccl_group *g);

#endif
