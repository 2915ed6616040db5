/* datapath.h — strata-worker's activation data path (datapath.c): an
 * ACTIVATIONS frame is checked on the loop thread (epoch, stage, shape, dtype,
 * block ids, token ids), copied into a forward job and handed to the stage's
 * compute thread (or run inline when it is idle); the result goes on to the
 * next hop as ACTIVATIONS (from a pool of registered buffers) or, on the last
 * stage, to the coordinator as TOKENS, BatchDone or BatchError. It works on
 * one stage (daemon/wstage.h); the worker routes the frames. Loop thread.
 */
#ifndef STRATA_DAEMON_DATAPATH_H
#define STRATA_DAEMON_DATAPATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/cjob.h"
#include "daemon/wstage.h"

#define FWD_REPLY_MAX 1024 /* forward intervals per StageStats at most */

/* An ACTIVATIONS frame for st: checked, then submitted as a forward (or run
 * here when st is alone, the worker's only stage, and the batch small). 0;
 * -1 + refused when the frame does not fit st: the caller drops the frame
 * and disconnects its peer. */
int datapath_activations(wstage *st, const frame_header *h, const void *payload, size_t bytes, bool alone,
                         st_err *refused);
/* A FORWARD job of st finished (taken back from the compute thread): records
 * its interval and sends its result on. The job is freed. */
void datapath_forward_finished(wstage *st, cjob *cj);
/* A CJOB_P2P_SEND of st came back (the rows of a forward went to the next
 * stage over NCCL, or failed): accounts it like a UCX send, frees the job. */
void datapath_p2p_sent(wstage *st, cjob *cj);
/* Frees a FORWARD (or P2P_SEND) job that will not be finished (the stage is stopping). */
void datapath_job_discard(wstage *st, cjob *cj);
/* The transport's rx sink (xport_set_rx_sink), for st, the stage of the
 * frame's epoch (NULL: none): an ACTIVATIONS payload for a stage whose
 * incoming boundary is ucx-cuda lands in one of its device buffers (NULL:
 * host memory). */
xport_mem *datapath_sink_get(wstage *st, const frame_header *h, size_t bytes);
/* A buffer of the sink that no forward took comes back: false when it is
 * not one of st's. */
bool datapath_sink_put(wstage *st, xport_mem *m);

/* Fills out[] (2 * FWD_REPLY_MAX entries) with st's kept forward intervals
 * ([start, end) CLOCK_MONOTONIC ns) ending after since_ns, oldest first, at
 * most FWD_REPLY_MAX; returns the count of uint64s written. */
size_t datapath_forward_intervals(const wstage *st, uint64_t since_ns, uint64_t *out);

/* A frame dtype for log lines: "f32", "bf16" or "none". */
const char *datapath_dtype_name(int dtype);

#endif
