/* worker.h — strata-worker's core: one pipeline stage served over the UCX data
 * plane (ib/transport.h) on a libevent loop.
 *
 * The worker listens on its data-plane address and waits for a coordinator.
 * CONTROL frames (proto/stage.proto, `strata.v1.Control`) assign the stage
 * (StageAssign -> StageReady) and query counters (StatsRequest -> StageStats).
 * ACTIVATIONS frames are checked on the loop thread (epoch, stage, shape,
 * dtype, block ids, token ids), copied into a job and run on the compute
 * thread (daemon/compute_thread.h); the result goes on from the loop: to the
 * next hop as ACTIVATIONS (payload from a pool of registered buffers), or,
 * on the last stage, to the coordinator as TOKENS (sampled ids + logprobs),
 * CONTROL BatchDone (no sequence wanted logits) or CONTROL BatchError.
 * The protocol is in docs/protocol.md ("CONTROL messages"), the operator's
 * view in docs/worker.md.
 *
 * Threading: every call on the loop thread of `base`.
 */
#ifndef STRATA_DAEMON_WORKER_H
#define STRATA_DAEMON_WORKER_H

#include <stddef.h>

#include "common/err.h"

struct event_base;

typedef struct worker worker;

typedef struct worker_opts {
    const char *listen_host; /* data-plane address */
    int listen_port;         /* 0 = ephemeral (see worker_port) */
    const char *name;        /* for logs and StageReady; NULL = "host:port" */
    int n_threads;           /* CPU threads for a stage when StageAssign says 0; 0 = all cores */
} worker_opts;

/* Starts listening and the compute thread. NULL + err on failure (bad
 * address, port in use, UCX error). */
worker *worker_create(struct event_base *base, const worker_opts *o, st_err *err);
/* The bound data-plane port. */
int worker_port(const worker *w);
/* Stops the compute thread (finishing the running job), closes the stage,
 * the peers and the transport. Not from inside a callback of the loop's
 * transport; call after the loop returned. */
void worker_destroy(worker *w);

/* Splits "host:port" (or "[v6]:port") into host (NUL-terminated, at most
 * host_cap bytes) and port (1..65535, or 0 when allow_zero). 0 or -1 + err. */
int worker_parse_hostport(const char *s, char *host, size_t host_cap, int *port, int allow_zero,
                          st_err *err);

#endif
