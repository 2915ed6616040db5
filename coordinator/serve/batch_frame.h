/* batch_frame.h — one scheduler micro-batch (sched.h) as the ACTIVATIONS
 * frame stage 0 receives (proto/stage.proto): the batch's token ids and one
 * SeqRecord per slice (sequence id, position, tokens, block table, whether
 * it samples, its step, the request id on its first chunk, and its sampling
 * parameters with the penalties' history, seq_sampling.h).
 * Threading: the loop thread only. */
#ifndef STRATA_COORDINATOR_SERVE_BATCH_FRAME_H
#define STRATA_COORDINATOR_SERVE_BATCH_FRAME_H

#include <stdint.h>

#include "common/err.h"
#include "coordinator/serve/sched.h"
#include "ib/transport.h"

/* Sends batch b of placement epoch `epoch` to stage0 (NULL: not connected).
 * Each slice's `user` is its request's record (request_list.h). *t_launch_ns
 * gets the CLOCK_MONOTONIC time just before the send. Returns 0, or -1 with
 * err set (out of memory, a sampling parameter that cannot be carried, the
 * send failed) or left empty (stage0 is NULL). */
int batch_frame_send(xport_peer *stage0, uint64_t epoch, const sched_batch *b, uint64_t *t_launch_ns,
                     st_err *err);

#endif
