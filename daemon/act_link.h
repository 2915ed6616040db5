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
 * What runs in this build: ucx (CPU stages) and ucx-pinned (a GPU stage
 * stages its rows through pinned, UCX-registered host buffers; datapath.c).
 * The device hand-offs (ucx-cuda, nccl) are negotiated but not yet carried
 * by the data path: a side reports nccl = ucx_cuda = false, and a receiver
 * that is offered them anyway (test hook) falls back to ucx / ucx-pinned and
 * says why. docs/cuda-backend.md, "Activations between stages".
 *
 * Test hook: STRATA_TEST_ACT_TRANSPORT=nccl makes this worker's side claim a
 * GPU stage with NCCL, so the exchange runs on a CPU machine: the sender
 * puts 128 random bytes in nccl_id and logs them in hex, the receiver logs
 * the bytes it got in hex, then falls back (its stage is not on a GPU).
 *
 * Loop thread; the structs are in daemon/worker_internal.h.
 */
#ifndef STRATA_DAEMON_ACT_LINK_H
#define STRATA_DAEMON_ACT_LINK_H

#include "daemon/worker_internal.h"

#define ACT_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

/* Worker start: the machine id, UCX's CUDA memory support and the test
 * hook; logs what this worker can offer. */
void act_link_init(worker *w);
/* Stage st just connected to its next hop: sends the offer. */
void act_link_offer(wstage *st);
/* An ActivationOffer / ActivationAnswer from peer (the receiver / sender
 * side). An offer for an epoch newer than every stage held (the sender's
 * stage loaded before this worker got its assignment) is kept (at most
 * ACT_PENDING_MAX, the oldest dropped) and answered by act_link_assigned. */
void act_link_on_offer(worker *w, xport_peer *peer, const Strata__V1__ActivationOffer *o);
void act_link_on_answer(worker *w, xport_peer *peer, const Strata__V1__ActivationAnswer *a);
/* st took a StageAssign: answers the offers kept for its epoch. */
void act_link_assigned(wstage *st);
/* peer is gone: forgets its kept offers. At worker_destroy: peer NULL, all. */
void act_link_peer_gone(worker *w, xport_peer *peer);

#endif
