/* comm.h — collectives among the TP ranks of one stage.
 *
 * A `comm` is one rank's handle in a group of `size` ranks. Every rank of the
 * group must make the same sequence of calls with the same counts (as with
 * NCCL/MPI); the calls block until the collective completes.
 *
 * Implementations:
 *  - CPU (compute/cpu/comm_shm.c): ranks are threads of one process. Each rank
 *    publishes a pointer to its buffer; rank r reduces chunk r across all the
 *    ranks' buffers and writes the sum back into every buffer (a fused
 *    reduce-scatter + all-gather), so no copy is made beyond the reduction.
 *  - NCCL (compute/cuda/comm_nccl.c): ncclAllReduce & co on device buffers,
 *    on non-blocking communicators under a deadline (never hangs the caller:
 *    on an error or timeout the communicator is aborted and `failed` set);
 *    built when CUDA is found.
 *
 * Errors: a mismatched call, a bad dtype or a bad root return -1 with err.
 * The CPU group detects a mismatch (different op, count, dtype or root, or
 * bad arguments on any rank) on every rank: all of them return -1 with an
 * error naming the offending rank, and no buffer is touched. NCCL checks only the local arguments
 * (a mismatch between ranks is undefined there, as in NCCL itself).
 * Stats: the call counters count calls that succeeded; `seconds` accumulates
 * CLOCK_MONOTONIC time inside every call, failed ones included.
 */
#ifndef STRATA_COMPUTE_COMM_H
#define STRATA_COMPUTE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

enum comm_dtype { COMM_F32 = 0, COMM_BF16 = 1 };

typedef struct comm comm;

typedef struct comm_ops {
    /* buf[count] <- sum over ranks of buf[count]. bf16 is summed in f32 and
     * rounded once (round-to-nearest-even). */
    int (*all_reduce_sum)(comm *c, void *buf, size_t count, enum comm_dtype dtype, st_err *err);
    /* recv[size * bytes] <- concatenation of every rank's send[bytes], rank order. */
    int (*all_gather)(comm *c, const void *send, void *recv, size_t bytes, st_err *err);
    /* buf[bytes] <- root's buf[bytes] on every rank. */
    int (*broadcast)(comm *c, void *buf, size_t bytes, int root, st_err *err);
    int (*barrier)(comm *c, st_err *err);
} comm_ops;

/* Counters every implementation keeps per rank (read by tests and benchmarks). */
typedef struct comm_stats {
    uint64_t all_reduce_calls;
    uint64_t all_gather_calls;
    uint64_t broadcast_calls;
    uint64_t barrier_calls;
    double seconds; /* wall time spent inside collectives on this rank */
} comm_stats;

struct comm {
    const comm_ops *ops;
    int rank, size;
    comm_stats stats;
    /* Set by the implementation when the communicator is gone for good (NCCL:
     * aborted after an error or a missed deadline, comm_nccl.h); every later
     * call fails. The stage that owns it is lost (engine/stage.h stage_failed). */
    int failed;
};

static inline int comm_all_reduce_sum(comm *c, void *buf, size_t count, enum comm_dtype dt, st_err *err) {
    return c->ops->all_reduce_sum(c, buf, count, dt, err);
}
static inline int comm_all_gather(comm *c, const void *send, void *recv, size_t bytes, st_err *err) {
    return c->ops->all_gather(c, send, recv, bytes, err);
}
static inline int comm_broadcast(comm *c, void *buf, size_t bytes, int root, st_err *err) {
    return c->ops->broadcast(c, buf, bytes, root, err);
}
static inline int comm_barrier(comm *c, st_err *err) { return c->ops->barrier(c, err); }

/* ---- CPU shared-memory group: n ranks that are threads of this process. ---- */
typedef struct comm_cpu_group comm_cpu_group;

comm_cpu_group *comm_cpu_group_new(int n_ranks, st_err *err);
/* The handle of rank r (owned by the group; valid until the group is freed). */
comm *comm_cpu_rank(comm_cpu_group *g, int rank);
void comm_cpu_group_free(comm_cpu_group *g);
/* Pause iterations a rank spins on the barrier before it yields (4 rounds of
 * sched_yield) and then sleeps (futex). The default is 20 when the ranks fit
 * the CPUs and 0 when they outnumber them. Set before the ranks start. */
void comm_cpu_group_set_spin(comm_cpu_group *g, int spin_iters);

#endif
