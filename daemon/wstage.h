/* wstage.h — one stage a worker holds, as plain data: its assignment and
 * state, its compute thread, its coordinator and next-hop peers, the
 * activation transport of its two boundaries and its data-path buffers.
 *
 * A worker holds one stage normally, two during a live placement change
 * (StageAssign.keep_loaded), keyed by placement epoch. Who writes what:
 *   daemon/assignment.c  the lifecycle (state, assignment, peers, loading);
 *   daemon/act_link.c    the boundaries' transports (act_*, p2p_*);
 *   daemon/datapath.c    the forwards and their buffers (pool, dbufs, fwd);
 *   daemon/worker.c      the list (link) and the counters it points to.
 * No functions; every field is touched on the loop thread only.
 */
#ifndef STRATA_DAEMON_WSTAGE_H
#define STRATA_DAEMON_WSTAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/compute_thread.h"
#include "ib/transport.h"

#define DBUF_MAX 16              /* ucx-cuda device buffers per stage */
#define POOL_MAX 8               /* free registered output buffers kept per stage */
#define FWD_RING 4096            /* forward intervals kept per stage (StageStats.forward_ns) */
#define BACKOFF_MIN_S 0.1        /* next-hop reconnect delay, doubling up to BACKOFF_MAX_S */
#define BACKOFF_MAX_S 5.0

enum wstate { W_IDLE, W_LOADING, W_READY, W_FAILED };

struct backend_module;
struct act_local;
struct act_p2p;
struct open_job;

/* The worker's counters, which its stages add to (StageStats, GET /metrics). */
typedef struct wcounters {
    uint64_t refused_assigns; /* StageAssign / StageRelease refused: not from the coordinator, bad token, stale */
    uint64_t dropped_frames, batch_errors;
    uint64_t fenced_frames;   /* of dropped_frames: ACTIVATIONS of an epoch older than the newest stage held */
    uint64_t hops;            /* ACTIVATIONS sends to a next hop completed (StageStats.hops) */
    double hop_seconds;       /* their send -> completion times, summed */
} wcounters;

/* Where a stage reports the time of each forward and of each hop (send ->
 * completion) of its output: GET /metrics. A NULL function: nowhere. */
typedef struct stage_timing {
    void (*forward)(void *ud, int stage, double seconds);
    void (*hop)(void *ud, int stage, double seconds);
    void *ud;
} stage_timing;

/* A registered host buffer of the data path (ucp_mem_map'd): pageable
 * (xport_mem_alloc) on a CPU stage; on a GPU stage pinned by its backend
 * (host_alloc: cudaHostAlloc) so the device copies are direct DMA. pin: the
 * module that frees it, NULL for pageable. */
typedef struct stbuf {
    xport_mem *m;
    const struct backend_module *pin;
} stbuf;

/* The current assignment (owned strings). */
struct assign {
    uint64_t epoch;
    uint32_t stage, n_stages;
    char *model_path;
    int first_layer, last_layer, tp, kv_blocks, block_size, n_threads;
    int act_dtype;  /* DTYPE_F32 or DTYPE_BF16 */
    char *next_hop; /* "" for the last stage */
    char next_host[256];
    int next_port;
    char backend[16];              /* "" (cpu), "cpu" or "cuda" (compute/registry.h) */
    int devices[STAGE_MAX_DEVICES]; /* device backends: rank r on devices[r] */
    int n_devices;                 /* 0 = rank r on device r */
};

/* The ucx-cuda boundaries' device buffers (module dev_alloc, registered
 * with UCX as device memory), made once per size and reused: FREE, lent
 * to the transport for a receive (RECV), or a forward's (JOB). */
struct dbuf {
    void *p;
    xport_mem *m;
    size_t cap;
    enum { DBUF_FREE, DBUF_RECV, DBUF_JOB } state;
};

/* One loaded (or loading) stage, keyed by its placement epoch. */
typedef struct wstage wstage;
struct wstage {
    /* from the worker that holds it (stage_new) */
    struct event_base *base;
    xport *x;
    char name[128];
    int n_threads;
    double t_start;
    wcounters *counters;        /* the worker's */
    const stage_timing *timing; /* the worker's */
    struct act_local *act;      /* the worker's side of every boundary (daemon/act_link.h) */
    bool dev_host_mem;          /* test hook (act_link.h): device buffers are host memory, registered as such */

    compute *cq;
    struct event *cq_ev, *reconnect_ev;

    /* assignment.c */
    enum wstate state;
    uint64_t gen;           /* incremented by every new assignment */
    struct assign cur;
    cjob_stage_info info;   /* valid in W_READY */
    xport_peer *coord;      /* the peer that sent the current assignment */
    xport_peer *next;       /* next hop (non-last stage) */
    double backoff;
    struct open_job *loading; /* the newest load submitted and not done (cancelled by a newer one) */

    /* act_link.c: the activation transport (enum act_xport, ib/act_transport.h)
     * of the boundary out of this stage (-1 until the next hop answered: UCX)
     * and into it (-1 until an offer came), and the NCCL id received. */
    int act_out, act_in;
    uint8_t act_id[128];        /* the NCCL id this stage offered its next hop */
    bool has_act_id;
    struct act_p2p *p2p_out, *p2p_in; /* NCCL links of the two boundaries (daemon/act_p2p.h) */

    /* datapath.c */
    stbuf pool[POOL_MAX];   /* free buffers, of either kind */
    int n_pool;
    struct dbuf dbufs[DBUF_MAX];
    int n_dbufs;
    int sends_inflight;     /* ACTIVATIONS to the next hop not yet completed */
    /* The last FWD_RING successful forwards' [start, end) CLOCK_MONOTONIC ns,
     * in completion order (disjoint: one compute thread); fwd_n recorded in
     * all, the next one goes to fwd[fwd_n % FWD_RING]. */
    uint64_t fwd[FWD_RING][2];
    uint64_t fwd_n;

    bool shutting_down;     /* released or the worker is stopping */
    wstage *link;           /* worker.c: its list of live / released stages */
};

#endif
