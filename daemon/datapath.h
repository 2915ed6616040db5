/* datapath.h — strata-worker's activation data path (datapath.c): an
 * ACTIVATIONS frame is checked on the loop thread (epoch, stage, shape, dtype,
 * block ids, token ids), copied into a forward job and handed to the stage's
 * compute thread (or run inline when it is idle); the result goes on to the
 * next hop as ACTIVATIONS (from a pool of registered buffers) or, on the last
 * stage, to the coordinator as TOKENS, BatchDone or BatchError. Loop thread;
 * the structs are in daemon/worker_internal.h.
 */
#ifndef STRATA_DAEMON_DATAPATH_H
#define STRATA_DAEMON_DATAPATH_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/worker_internal.h"

#define FWD_REPLY_MAX 1024 /* forward intervals per StageStats at most */

/* An ACTIVATIONS frame for st: checked, then submitted as a forward; a bad
 * one drops the frame and disconnects peer. */
void datapath_activations(wstage *st, xport_peer *peer, const frame_header *h, const void *payload,
                          size_t bytes);
/* A FORWARD job of st finished (taken back from the compute thread): records
 * its interval and sends its result on. The job is freed. */
void datapath_forward_finished(wstage *st, cjob *cj);
/* A CJOB_P2P_SEND of st came back (the rows of a forward went to the next
 * stage over NCCL, or failed): accounts it like a UCX send, frees the job. */
void datapath_p2p_sent(wstage *st, cjob *cj);
/* Frees a FORWARD (or P2P_SEND) job that will not be finished (the stage is stopping). */
void datapath_job_discard(wstage *st, cjob *cj);
/* Unregisters st's free output buffers. */
void datapath_pool_drain(wstage *st);
/* The transport's rx sink (xport_set_rx_sink, arg = the worker): an
 * ACTIVATIONS payload for a stage whose incoming boundary is ucx-cuda lands
 * in one of its device buffers; put gives one back that no forward took. */
xport_mem *datapath_sink_get(xport_peer *peer, const frame_header *h, size_t bytes, void *arg);
void datapath_sink_put(xport_mem *m, bool delivered, void *arg);

/* Fills out[] (2 * FWD_REPLY_MAX entries) with st's kept forward intervals
 * ([start, end) CLOCK_MONOTONIC ns) ending after since_ns, oldest first, at
 * most FWD_REPLY_MAX; returns the count of uint64s written. */
size_t datapath_forward_intervals(const wstage *st, uint64_t since_ns, uint64_t *out);

#endif
