/* worker_internal.h — the state strata-worker's three loop-side files share
 * (not a public interface; daemon/worker.h is):
 *   worker.c      the front: transport callbacks, frame routing by kind and
 *                 epoch, create/destroy, the load window for heartbeats;
 *   assignment.c  the assignment lifecycle (daemon/assignment.h);
 *   datapath.c    the activation data path (daemon/datapath.h).
 * A worker holds one stage normally, two during a live placement change
 * (StageAssign.keep_loaded); each stage (wstage) has its own compute thread,
 * next-hop peer and coordinator peer. Every function here runs on the loop
 * thread.
 */
#ifndef STRATA_DAEMON_WORKER_INTERNAL_H
#define STRATA_DAEMON_WORKER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/compute_thread.h"
#include "daemon/worker.h"
#include "ib/transport.h"
#include "proto/stage.pb-c.h"

#define DBUF_MAX 16              /* ucx-cuda device buffers per stage */
#define POOL_MAX 8               /* free registered output buffers kept per stage */
#define FWD_RING 4096            /* forward intervals kept per stage (StageStats.forward_ns) */
#define BACKOFF_MIN_S 0.1        /* next-hop reconnect delay, doubling up to BACKOFF_MAX_S */
#define BACKOFF_MAX_S 5.0
#define MAX_STAGES 4             /* stages of different epochs held at once */
#define LOAD_MAX_SEQS 4096       /* sequences tracked for worker_load_get */
#define ACT_PENDING_MAX 8        /* ActivationOffers kept until their epoch's StageAssign */

typedef Strata__V1__ControlMessage ctl_msg;

enum wstate { W_IDLE, W_LOADING, W_READY, W_FAILED };

typedef struct wstage wstage;
struct backend_module;

/* An ActivationOffer that came before the StageAssign of its epoch (the
 * previous stage loaded first): packed, answered when the assignment comes. */
struct act_pending {
    xport_peer *peer;
    uint64_t epoch;
    uint8_t *buf;
    size_t len;
};

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

/* One loaded (or loading) stage, keyed by its placement epoch. */
struct wstage {
    worker *front;          /* the owning worker (transport, counters) */
    struct event_base *base;
    xport *x;               /* = front->x */
    compute *cq;
    struct event *cq_ev, *reconnect_ev;
    char name[128];
    int n_threads;
    double t_start;

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
    /* The ucx-cuda boundaries' device buffers (module dev_alloc, registered
     * with UCX as device memory), made once per size and reused: FREE, lent
     * to the transport for a receive (RECV), or a forward's (JOB). */
    struct dbuf {
        void *p;
        xport_mem *m;
        size_t cap;
        enum { DBUF_FREE, DBUF_RECV, DBUF_JOB } state;
    } dbufs[DBUF_MAX];
    int n_dbufs;
    int sends_inflight;     /* ACTIVATIONS to the next hop not yet completed */
    /* The last FWD_RING successful forwards' [start, end) CLOCK_MONOTONIC ns,
     * in completion order (disjoint: one compute thread); fwd_n recorded in
     * all, the next one goes to fwd[fwd_n % FWD_RING]. */
    uint64_t fwd[FWD_RING][2];
    uint64_t fwd_n;

    bool shutting_down;     /* released or the worker is stopping */
    wstage *link;           /* the worker's list of live / released stages */
};

struct worker {
    struct event_base *base;
    xport *x;
    char name[128];
    int n_threads;
    double t_start;
    char **models;          /* --model paths (resolve StageAssign.model_path by file name) */
    int model_dirfd;        /* worker_opts.model_dir, opened; -1: none (every model path refused) */
    int n_models;
    wstage *stages;         /* live stages, newest first */
    wstage *released;       /* released ones: freed after the transport (their sends may be in flight) */
    const cluster_key *key; /* worker_opts.key */
    uint64_t max_epoch;     /* the newest epoch of an accepted StageAssign (older ones are stale) */
    uint64_t refused_assigns; /* StageAssign / StageRelease refused: not from the coordinator, bad token, stale */
    uint64_t dropped_frames, batch_errors;
    uint64_t fenced_frames; /* of dropped_frames: ACTIVATIONS of an epoch older than the newest stage held */
    uint64_t hops;          /* ACTIVATIONS sends to a next hop completed (StageStats.hops) */
    double hop_seconds;     /* their send -> completion times, summed */
    struct worker_metrics *metrics; /* GET /metrics (daemon/worker_metrics.h); NULL when off */
    bool shutting_down;
    /* act_link.c */
    int act_override;       /* enum act_override: --activation-transport */
    char machine_id[64];    /* /etc/machine-id (the host name without one) */
    bool ucx_cuda;          /* xport_memory_cuda */
    bool act_test_nccl;     /* STRATA_TEST_ACT_TRANSPORT=nccl */
    bool act_test_host_dev; /* STRATA_TEST_ACT_TRANSPORT=ucx-cuda-host: the module's "device" memory is host
                             * memory, registered as such, and this side claims UCX CUDA memory */
    struct act_pending act_pending[ACT_PENDING_MAX];
    int n_act_pending;
    /* worker_load_get window: sequences seen and their block-table lengths */
    uint64_t load_seq[LOAD_MAX_SEQS];
    int load_blocks[LOAD_MAX_SEQS];
    int n_load;
    bool track_load;        /* worker_load_get was called (live mode, or GET /metrics) */
    worker_load last_load;  /* the latest window worker_load_get closed */
    double last_load_at;    /* when (monotonic seconds; 0 = never) */
};

/* worker.c: a frame we do not accept: counts it, logs "dropping a frame from
 * PEER: WHY; disconnecting it" (WHY from fmt, at most 299 bytes) and closes
 * the peer. */
void worker_drop_frame(worker *w, xport_peer *peer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A frame dtype for log lines: "f32", "bf16" or "none". */
static inline const char *worker_dtype_name(int d)
{
    return d == STRATA__V1__DTYPE__DTYPE_F32 ? "f32" : d == STRATA__V1__DTYPE__DTYPE_BF16 ? "bf16" : "none";
}

#endif
