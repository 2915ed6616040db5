/* act_p2p.h — a pipeline boundary whose activations travel on NCCL
 * (ib/act_transport.h "nccl"; negotiated by daemon/act_link.h): the 2-rank
 * communicator of the CUDA module's point-to-point (compute/registry.h
 * backend_p2p_ops), driven from the stage's compute thread, which owns the
 * device:
 *   CJOB_P2P_OPEN   joins the communicator (rank 0 = stage k, rank 1 = k+1);
 *   FORWARD p2p_in  receives the rows into the link's device buffer, then
 *                   runs the stage from it (stage_forward_io);
 *   FORWARD p2p_out runs the stage into a fresh device buffer (dev_out);
 *   CJOB_P2P_SEND   sends dev_out after the loop sent the frame's header
 *                   (FrameHeader.payload_p2p) over UCX, then frees it;
 *   CJOB_P2P_CLOSE  closes the communicator and frees the link.
 * The jobs of one compute thread run in order, and the loop sends headers in
 * the order the forwards finish, so sends and receives pair up in frame
 * order. A send never holds the next forward: it is a job of its own after
 * the header went out, and the receiver posts its receive when that header
 * reaches its own compute thread. Every wait has a deadline
 * (STRATA_NCCL_INIT_TIMEOUT_S for the join, default 120 s;
 * STRATA_NCCL_TIMEOUT_S for a transfer, default 30 s) and a failure aborts
 * the communicator (nccl_guard): the link is then broken and the boundary
 * goes back to UCX.
 */
#ifndef STRATA_DAEMON_ACT_P2P_H
#define STRATA_DAEMON_ACT_P2P_H

#include <stdbool.h>
#include <stdint.h>

#include "compute/registry.h"
#include "daemon/cjob.h"

typedef struct act_p2p {
    const backend_p2p_ops *ops;
    uint8_t id[128];
    int rank;          /* 0: this stage sends (stage k); 1: it receives (stage k+1) */
    unsigned boundary; /* k */
    /* compute thread */
    backend_p2p *comm;
    void *dev_in;      /* the receiver's device buffer for the rows */
    size_t dev_in_cap;
    uint64_t dev_in_gen; /* the stage (compute thread's st_gen) it came from */
    /* loop thread */
    uint64_t serial;   /* unique per link: an OPEN's result is taken only by its own link */
    bool ready;        /* OPEN succeeded */
    bool broken;       /* OPEN or a transfer failed: the boundary is back on UCX */
} act_p2p;

/* A link (not joined yet); NULL when out of memory. id: ops->id_bytes bytes. */
act_p2p *act_p2p_new(const backend_p2p_ops *ops, const uint8_t *id, int rank, unsigned boundary);

/* Compute thread: runs a P2P_* job on stage st (gen: its st_gen); status/err set. */
void act_p2p_run(stage *st, uint64_t gen, cjob *j);
/* Compute thread: a FORWARD with p2p_in / p2p_out. 0, or -1 with j->err. */
int act_p2p_forward(stage *st, uint64_t gen, cjob *j);
/* Loop thread, after compute_stop: a P2P_CLOSE that never ran closes and
 * frees its link here (the compute thread is gone). */
void act_p2p_discard(cjob *j);

#endif
