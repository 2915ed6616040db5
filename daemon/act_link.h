/* act_link.h — the activation transport of each pipeline boundary this
 * worker sits on (ib/act_transport.h), negotiated over the data plane:
 *
 *   stage k (sender), when it connects to its next hop:
 *       ActivationOffer{epoch, boundary k, backend, machine id, NCCL?, UCX
 *       CUDA?, --activation-transport, NCCL unique id when it can run NCCL}
 *   stage k+1 (receiver): checks the offer against the stage it holds,
 *       chooses with act_transport_choose, sets the transport up (or falls
 *       back to UCX, saying why) and answers
 *       ActivationAnswer{transport, reason | error}
 *
 * Why the worker<->worker frame and not the coordinator: the id is made by
 * the sender for the one connection it has to its receiver, so a new id goes
 * with every (re)connection without a round trip through the coordinator,
 * the StageAssign token and the placement code stay as they are, and the
 * coordinator needs to know nothing of NCCL. Both sides log
 * "boundary K->K+1: TRANSPORT (REASON)".
 *
 * What runs: ucx (CPU stages), ucx-pinned (a GPU stage stages its rows
 * through pinned, UCX-registered host buffers; datapath.c) and nccl (the
 * CUDA module's point-to-point between GPU stages, daemon/act_p2p.h; a side
 * offers it when its stage runs on "cuda" and the module has it; not when
 * both stages share one GPU). Device buffers to UCX (ucx-cuda) are not
 * built: a side never claims it, and a receiver offered it falls back to
 * ucx-pinned and says why. docs/cuda-backend.md, "Activations between
 * stages".
 *
 * Test hook: STRATA_TEST_ACT_TRANSPORT=nccl makes this worker's side claim a
 * GPU stage with NCCL, so the exchange runs on a CPU machine: the sender
 * puts 128 random bytes in nccl_id and logs them in hex, the receiver logs
 * the bytes it got in hex, then falls back (its stage is not on a GPU).
 *
 * The worker owns one act_local (what its side offers, the offers kept for
 * a later assignment) and gives each stage a pointer to it (wstage.act);
 * the per-boundary state lives in the stage (daemon/wstage.h). Loop thread.
 */
#ifndef STRATA_DAEMON_ACT_LINK_H
#define STRATA_DAEMON_ACT_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/cjob.h"
#include "daemon/wstage.h"
#include "ib/transport.h"
#include "proto/stage.pb-c.h"

#define ACT_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
#define ACT_PENDING_MAX 8     /* ActivationOffers kept until their epoch's StageAssign */

/* An ActivationOffer that came before the StageAssign of its epoch (the
 * previous stage loaded first): packed, answered when the assignment comes. */
struct act_pending {
    xport_peer *peer;
    uint64_t epoch;
    uint8_t *buf;
    size_t len;
};

/* This worker's side of every boundary. */
typedef struct act_local {
    int override;           /* enum act_override: --activation-transport */
    char machine_id[64];    /* /etc/machine-id (the host name without one) */
    bool ucx_cuda;          /* xport_memory_cuda */
    bool test_nccl;         /* STRATA_TEST_ACT_TRANSPORT=nccl */
    bool test_host_dev;     /* STRATA_TEST_ACT_TRANSPORT=ucx-cuda-host: the module's "device" memory is host
                             * memory, registered as such, and this side claims UCX CUDA memory */
    wcounters *counters;    /* the worker's: refused offers and ignored answers count as dropped frames */
    struct act_pending pending[ACT_PENDING_MAX];
    int n_pending;
} act_local;

/* Worker start: the machine id, UCX's CUDA memory support (of x) and the
 * test hook; logs what this worker can offer. */
void act_link_init(act_local *l, xport *x, int override, wcounters *counters);
/* Stage st just connected to its next hop: sends the offer. */
void act_link_offer(wstage *st);
/* An ActivationOffer from peer (the receiver side), for st, the stage of
 * the offer's epoch (NULL: none held). Without st, an offer whose epoch is
 * future (newer than every stage held: the sender's stage loaded before
 * this worker got its assignment) is kept (at most ACT_PENDING_MAX, the
 * oldest dropped) and answered by act_link_assigned; any other is refused,
 * the refusal tagged with reply_stage's number (NULL: not answered). */
void act_link_on_offer(act_local *l, wstage *st, bool future, const wstage *reply_stage, xport_peer *peer,
                       const Strata__V1__ActivationOffer *o);
/* An ActivationAnswer from peer (the sender side), for st, the stage of its
 * epoch (NULL: none held; ignored and counted). */
void act_link_on_answer(act_local *l, wstage *st, xport_peer *peer, const Strata__V1__ActivationAnswer *a);
/* st's boundaries are gone (a new assignment, the next hop dropped): their
 * NCCL links are closed on the compute thread, after the jobs queued. */
void act_link_reset(wstage *st);
/* The next hop is gone: its NCCL link closes (a reconnection offers anew). */
void act_link_next_lost(wstage *st);
/* After compute_stop (stage_free): closes the links here. */
void act_link_free(wstage *st);
/* A CJOB_P2P_OPEN / SEND (not datapath's) / CLOSE job came back: records an
 * OPEN's outcome on the link (ready, or broken and logged); frees the job. */
void act_link_job_done(wstage *st, cjob *j);
/* st took a StageAssign: answers the offers kept for its epoch. */
void act_link_assigned(wstage *st);
/* peer is gone: forgets its kept offers. At worker_destroy: peer NULL, all. */
void act_link_peer_gone(act_local *l, xport_peer *peer);

#endif
