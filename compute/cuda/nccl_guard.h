/* nccl_guard.h — NCCL that never hangs its caller: the deadline, poll and
 * abort logic around every NCCL call of a non-blocking communicator
 * (ncclConfig_t.blocking = 0), kept apart from NCCL and CUDA so that a CPU
 * unit test drives it with a fake (tests/comm/test_nccl_guard.c).
 *
 * With a non-blocking communicator an NCCL call may return ncclInProgress;
 * the caller then polls ncclCommGetAsyncError until it is no longer
 * ncclInProgress. A collective that NCCL enqueued can still hang on the GPU
 * (a peer died or stopped, a link went down): the host sees it as a CUDA
 * event that never completes. nccl_guard_wait polls both against a deadline
 * and, on an NCCL error, a CUDA error or the deadline, calls ncclCommAbort
 * once (which also makes NCCL's kernels stuck on the GPU return), so the
 * caller gets an error instead of blocking forever. After that the guard is
 * "aborted": every later wait fails at once with the first reason, and the
 * communicator must not be used or destroyed (abort freed it).
 *
 * The ranks of one group in one process may share a flag (group_failed):
 * when one rank aborts, the others abort at their next poll instead of
 * waiting for their own deadline.
 *
 * Deadline: STRATA_NCCL_TIMEOUT_S (seconds, > 0; default 30) for the
 * collectives and the waits for GPU work behind them; STRATA_NCCL_INIT_TIMEOUT_S
 * (default 120) for creating a communicator (connection set-up). An invalid
 * value is logged and the default used.
 *
 * Threading: one guard belongs to one rank and is used from one thread at a
 * time; group_failed is the only state shared between threads.
 */
#ifndef STRATA_COMPUTE_CUDA_NCCL_GUARD_H
#define STRATA_COMPUTE_CUDA_NCCL_GUARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define NCCL_GUARD_TIMEOUT_S 30.0
#define NCCL_GUARD_INIT_TIMEOUT_S 120.0

/* The state of something polled: NCCL's async error (ncclSuccess = DONE,
 * ncclInProgress = PENDING, anything else FAILED) or a CUDA event
 * (cudaSuccess = DONE, cudaErrorNotReady = PENDING, else FAILED). */
typedef enum nccl_poll { NCCL_POLL_DONE = 0, NCCL_POLL_PENDING = 1, NCCL_POLL_FAILED = 2 } nccl_poll;

/* The NCCL calls the guard makes (comm_nccl.c maps them to NCCL; tests fake them). */
typedef struct nccl_guard_ops {
    /* ncclCommGetAsyncError(comm); on FAILED writes why (NUL-terminated, <= n). */
    nccl_poll (*comm_state)(void *comm, char *why, size_t n);
    /* ncclCommAbort(comm). The guard calls it at most once. */
    void (*comm_abort)(void *comm);
    /* Monotonic seconds. */
    double (*now_s)(void);
    /* Between two polls; `polls` made so far in this wait (to back off). */
    void (*pause)(unsigned polls);
} nccl_guard_ops;

typedef struct nccl_guard {
    const nccl_guard_ops *ops;
    void *comm;
    double timeout_s;           /* of one wait */
    atomic_int *group_failed;   /* optional, shared by the group's ranks */
    char name[48];              /* for messages: "rank 1 (device 1)" */
    const char *deadline_var;   /* the setting named in a timeout's message
                                   (default "STRATA_NCCL_TIMEOUT_S") */
    bool aborted;
    char why[256];              /* why it was aborted */
    unsigned long long aborts;  /* comm_abort calls (0 or 1) */
} nccl_guard;

/* Something the wait also waits for (the CUDA event after a collective); on
 * FAILED writes why. */
typedef nccl_poll (*nccl_work_poll)(void *ctx, char *why, size_t n);

/* The ops that call NCCL for real are comm_nccl.c's; these are the clock and
 * pause most users want (st_now_s; yield for the first polls, then 20-200 us sleeps). */
double nccl_guard_now_s(void);
void nccl_guard_pause(unsigned polls);
/* nccl_guard_pause's sleep after `polls` polls, in microseconds (0: it only
 * yields): 0 for the first 2000 polls, then 20 us growing by 1 us per 8
 * polls up to 200 us. */
unsigned nccl_guard_pause_us(unsigned polls);

void nccl_guard_init(nccl_guard *g, const nccl_guard_ops *ops, void *comm, double timeout_s,
                     atomic_int *group_failed, const char *name);

/* After an NCCL call on the guard's communicator whose result was `launched`
 * (FAILED: launch_why says why): waits until ncclCommGetAsyncError is no
 * longer in progress and, when work is not NULL, until work(ctx) is DONE.
 * 0 when both are done. -1 with err ("comm nccl <what> (<name>): ...") and
 * the communicator aborted when the call failed, NCCL reports an error, work
 * failed, another rank of the group aborted, or timeout_s passed; -1 at once
 * when the guard was aborted before. */
int nccl_guard_wait(nccl_guard *g, const char *what, nccl_poll launched, const char *launch_why,
                    nccl_work_poll work, void *ctx, st_err *err);

/* Aborts the communicator now (once; later calls only keep the first reason)
 * and marks the group failed. */
void nccl_guard_abort(nccl_guard *g, const char *why);

/* The deadline in seconds from the environment variable `name` (a positive
 * number), else dflt (an invalid value is logged). */
double nccl_guard_timeout_env(const char *name, double dflt);

#endif
