/* comm_nccl.h — the NCCL implementation of compute/comm.h: one rank per GPU of
 * this process, on non-blocking communicators that never hang the caller.
 *
 * Communicators: ncclCommInitRankConfig with ncclConfig_t.blocking = 0 inside
 * one ncclGroupStart/End (one unique id). Every NCCL call is followed by a
 * poll of ncclCommGetAsyncError, and every host wait for GPU work behind a
 * collective by a poll of a CUDA event, both against a deadline
 * (compute/cuda/nccl_guard.h: STRATA_NCCL_TIMEOUT_S, default 30 s; creation
 * STRATA_NCCL_INIT_TIMEOUT_S, default 120 s). On an NCCL error, a CUDA error
 * or the deadline the rank's communicator is aborted (ncclCommAbort), the
 * call returns -1 with the reason, comm.failed is set, and every later call
 * fails at once; the other ranks of the group give up at their next poll.
 * A failed communicator is never used again: the stage that owns it is lost
 * (engine/stage.h stage_failed) and a new group must be made.
 *
 * Buffers passed to the ops are device pointers on the rank's device. Each
 * rank must be driven by its own host thread (the comm_ops block until the
 * collective completed on the rank's NCCL stream), exactly like the CPU
 * group. Every op first makes the rank's device current on the calling thread.
 *
 * Errors: local argument errors (bad dtype, bad root, NULL buffer) and every
 * CUDA/NCCL failure return -1 with err. A count mismatch between ranks is not
 * detected (undefined in NCCL; checking it would cost a collective per call).
 */
#ifndef STRATA_COMPUTE_CUDA_COMM_NCCL_H
#define STRATA_COMPUTE_CUDA_COMM_NCCL_H

#include <stdbool.h>

#include "common/err.h"
#include "compute/comm.h"

typedef struct comm_nccl_group comm_nccl_group;

/* A group over devices 0..n_devices-1. Fails when fewer devices are visible,
 * NCCL cannot initialise, or the initialisation misses its deadline. */
comm_nccl_group *comm_nccl_group_new(int n_devices, st_err *err);
/* The same over devices[0..n_devices-1] (rank r on devices[r]; distinct,
 * visible); NULL devices = 0..n_devices-1. */
comm_nccl_group *comm_nccl_group_new_on(int n_devices, const int *devices, st_err *err);
/* The handle of rank r (owned by the group), or NULL when r is out of range. */
comm *comm_nccl_rank(comm_nccl_group *g, int rank);
/* Whether c is a rank of an NCCL group (this file's comm_ops). */
bool comm_is_nccl(const comm *c);
/* The CUDA device of a rank's handle. */
int comm_nccl_device(const comm *c);
/* The rank's NCCL cudaStream_t (as void*, so that this header needs no CUDA). */
void *comm_nccl_stream(const comm *c);
/* Ends the group: an intact communicator is finalised and destroyed (under
 * the deadline; aborted when it misses it), a failed one aborted. */
void comm_nccl_group_free(comm_nccl_group *g);

/* ---- for the CUDA backend (compute/cuda/backend_cuda.c): no host waits ---- */

/* buf[count] <- the sum over the group, ordered on `stream` (a cudaStream_t
 * of the rank's device) by events: the NCCL stream waits for the work on
 * `stream` so far, and `stream` waits for the all-reduce; the host does not
 * wait for the GPU. Counted like comm_all_reduce_sum. -1 with err (and the
 * communicator aborted) when NCCL fails. */
int comm_nccl_all_reduce_on(comm *c, void *buf, size_t count, enum comm_dtype dtype, void *stream, st_err *err);
/* The host waits for the cudaEvent_t `event` (recorded on a stream of the
 * rank's device) under the rank's deadline: what the GPU runs behind a
 * collective cannot hang the caller. -1 with err ("<what>: ...") and the
 * communicator aborted on an error or the deadline. */
int comm_nccl_wait_event(comm *c, void *event, const char *what, st_err *err);

/* Test hook: the rank's deadline in seconds (e.g. to check the abort path
 * quickly on one GPU; scripts/gpu-check). */
void comm_nccl_set_timeout(comm *c, double seconds);

#endif
