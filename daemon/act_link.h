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
void act_link_peer_gone(worker *w, xport_peer *peer);

#endif
