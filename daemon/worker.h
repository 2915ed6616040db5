/* worker.h — strata-worker's core: one pipeline stage served over the UCX data
 * plane (ib/transport.h) on a libevent loop.
 *
 * The worker listens on its data-plane address and waits for a coordinator.
 * It may hold stages of several placement epochs at once (a live placement
 * change loads the new one beside the old: StageAssign.keep_loaded, then
 * StageRelease drops the old); frames are routed to a stage by their epoch.
 * CONTROL frames (proto/stage.proto, `strata.v1.Control`) assign the stage
 * (StageAssign -> StageReady) and query counters (StatsRequest -> StageStats;
 * with StatsRequest.forward_intervals also the [start, end) CLOCK_MONOTONIC
 * times of the stage's last forwards, kept in a ring of 4096 per stage).
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "ib/cluster_key.h"
#include "ib/transport.h"

struct event_base;

typedef struct worker worker;

typedef struct worker_opts {
    const char *listen_host; /* data-plane address */
    int listen_port;         /* 0 = ephemeral (see worker_port) */
    const char *name;        /* for logs and StageReady; NULL = "host:port" */
    int n_threads;           /* CPU threads for a stage when StageAssign says 0; 0 = all cores */
    /* Model files this node has (live mode): a StageAssign whose model_path is
     * a bare file name loads the listed file of that name. May be NULL. */
    const char *const *models;
    int n_models;
    /* The directory a StageAssign's model_path is confined to (a relative
     * path under it; daemon/model_path.h, docs/security.md). NULL: only the
     * file names of `models` are accepted. */
    const char *model_dir;
    /* The cluster key (ib/cluster_key.h; must outlive the worker), or NULL.
     * With it every data-plane peer must pass the handshake
     * (xport_require_auth), and a StageAssign or StageRelease is acted on
     * only from the authenticated coordinator, with a valid token
     * (ib/assign_token.h) and an epoch not older than the newest accepted.
     * docs/security.md. */
    const cluster_key *key;
    /* --activation-transport (enum act_override, ib/act_transport.h): auto
     * (0), ucx or nccl; applied per boundary by daemon/act_link.h. */
    int activation_transport;
} worker_opts;

/* Load figures for the control plane's heartbeat (daemon/registration.h).
 * running_sequences and kv_blocks_used are counted from the ACTIVATIONS
 * frames seen since the previous call (distinct sequence ids; the sum of
 * their block-table lengths, capped at kv_blocks), so call it once per
 * heartbeat interval. */
typedef struct worker_load {
    uint32_t running_sequences;
    uint32_t kv_blocks_used;
    int kv_blocks;            /* KV blocks of the newest ready stage (0: none) */
    int n_stages;             /* stages loaded (2 during a live placement change) */
    double busy_seconds;      /* cumulative, all stages */
    double uptime_seconds;
    uint64_t bytes_sent;      /* data plane, cumulative */
} worker_load;

/* Fills *out (see worker_load) and starts a new window. Loop thread. */
void worker_load_get(worker *w, worker_load *out);
/* The same for a reader that must not cut the live-mode windows short
 * (GET /metrics): the window closed within the last second if there is one
 * (with current cumulative values), else worker_load_get. Loop thread. */
void worker_load_recent(worker *w, worker_load *out);

/* For GET /metrics (daemon/worker_metrics.h): where the time of each
 * forward and of each hop (an output's send -> completion) of every stage
 * goes (stage: its index), on the loop thread; NULL functions: nowhere.
 * Observing also starts the load window (worker_load_recent). */
void worker_observe(worker *w, void (*forward)(void *ud, int stage, double seconds),
                    void (*hop)(void *ud, int stage, double seconds), void *ud);

#define WORKER_FIGURES_STAGES 8
/* One stage held (loading, ready or failed; not idle). */
typedef struct worker_stage_figures {
    uint32_t stage;
    uint64_t epoch;
    int first_layer, last_layer;
    bool ready;               /* loaded and serving */
} worker_stage_figures;

/* The worker's cumulative counters and the stages it holds, for GET /metrics. */
typedef struct worker_figures {
    xport_stats xport;        /* the data plane */
    uint64_t dropped_frames, fenced_frames, batch_errors;
    double forwards, tokens, busy_seconds; /* the live stages' compute threads (a released one's stop counting) */
    int n_stages;
    worker_stage_figures stages[WORKER_FIGURES_STAGES];
} worker_figures;

/* Fills *out. Loop thread. */
void worker_figures_get(worker *w, worker_figures *out);

/* Releases every stage of an epoch older than serving_epoch (the
 * coordinator's, daemon/registration.h reg_serving_epoch) whose coordinator
 * connection is gone: its StageRelease can never arrive (it went over that
 * connection, e.g. cut by a partition). A stage whose connection is alive
 * waits for its StageRelease. Returns how many it released. Loop thread. */
int worker_release_stale(worker *w, uint64_t serving_epoch);
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
