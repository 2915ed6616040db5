/* engine_api.h — the narrow interface between the front ends (the HTTP API,
 * the gRPC Generate call) and whatever generates tokens (the scheduler
 * driving workers over UCX; in tests, a replaying test double). The front
 * ends know nothing of stages or batches, and the engine nothing of OpenAI
 * bodies: a request is token ids, sampling parameters and limits.
 *
 * Contract (all calls and callbacks on the coordinator's event-loop thread):
 * - submit() validates against the model (checks the context and the
 *   queue) and returns COORD_OK with a request id, or an error
 *   status (mapped to HTTP: EINVAL/ECONTEXT 400, EBUSY 429, EUNAVAIL 503,
 *   EINTERNAL 500) with a message in err. It must not call the sink from
 *   inside submit().
 * - Later, from the event loop: on_prompt once (the prompt's token ids), then
 *   on_token for each generated token (its text piece as raw bytes, possibly
 *   an incomplete UTF-8 sequence; lp non-NULL when req->logprobs), then
 *   exactly one on_finish: STOP (EOS), LENGTH (max_tokens or the context) or
 *   ERROR (the message says why). The EOS token itself is not passed to
 *   on_token. on_scheduled (optional, NULL = not wanted) is called when the
 *   request's first micro-batch has been sent to the stages (its prefill
 *   starts; again after a recovery re-prefills it): it only observes and
 *   must not call the engine.
 * - cancel(id) may be called at any time, also from inside a sink callback of
 *   that request; after it returns no callback for that id is ever made, and
 *   the engine frees the sequence (and its KV blocks) as soon as it can.
 *   Cancelling an id that already finished is a no-op.
 */
#ifndef STRATA_COORDINATOR_SERVE_ENGINE_API_H
#define STRATA_COORDINATOR_SERVE_ENGINE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/err.h"
#include "model/sampler.h"

enum coord_finish { COORD_FINISH_STOP = 0, COORD_FINISH_LENGTH = 1, COORD_FINISH_ERROR = 2 };

enum coord_status {
    COORD_OK = 0,
    COORD_EINVAL = -1,    /* 400 invalid_request_error */
    COORD_ECONTEXT = -2,  /* 400 context_length_exceeded */
    COORD_EBUSY = -3,     /* 429: the queue is full */
    COORD_EUNAVAIL = -4,  /* 503: no placement is serving */
    COORD_EINTERNAL = -5, /* 500 */
};

/* A generation request in the engine's terms. The front end tokenizes. */
typedef struct coord_request {
    const int32_t *prompt;   /* n_prompt >= 1 token ids, BOS included; submit copies them */
    int n_prompt;
    int max_tokens;          /* >= 1 */
    bool max_tokens_auto;    /* max_tokens was not given: clamp it to the context */
    sampler_params sampling; /* temperature, top-k/p, min-p, penalties, seed,
                                n_top_logprobs (alternatives reported with logprobs),
                                logit bias (arrays borrowed; submit copies them).
                                repeat_penalty != 1 is vLLM's repetition_penalty:
                                over the prompt and the generated tokens
                                (coordinator/serve/seq_sampling.h) */
    int min_tokens;          /* before this many generated tokens ... */
    const int32_t *min_tokens_mask; /* ... these ids cannot be sampled (EOG and stop
                                        ids; borrowed, submit copies them) */
    int n_min_tokens_mask;
    bool has_seed;           /* false: the engine picks sampling.seed */
    bool ignore_eos;         /* generate past EOS up to max_tokens */
    bool logprobs;           /* report each token's logprob (on_token's lp) */
    char request_id[64];     /* for logs and the workers; "" = none */
} coord_request;

/* Logprobs of one generated token, as the engine reports them. */
typedef struct coord_logprobs {
    float logprob;                 /* of the sampled token */
    int n_top;
    const char *const *top_pieces; /* n_top texts (NUL-terminated raw bytes) */
    const float *top_logprobs;     /* n_top, descending */
} coord_logprobs;

typedef struct coord_sink {
    void (*on_prompt)(void *ctx, const int32_t *ids, int n);
    void (*on_token)(void *ctx, int32_t id, const char *piece, size_t len,
                     const coord_logprobs *lp);
    void (*on_finish)(void *ctx, enum coord_finish reason, const char *message);
    void (*on_scheduled)(void *ctx); /* optional; see the contract above */
} coord_sink;

/* Engine state for GET /metrics (coordinator/api/metrics_coord.h). */
/* = PLACE_MAX_STAGES (config/partition.h): a stage holds at least one layer. */
#define COORD_STATS_MAX_STAGES 256
#define COORD_NAME_LEN 64
/* Forward-time histogram bounds (seconds) of coord_stage_stats.fwd_buckets. */
#define COORD_FWD_BOUNDS                                                                     \
    {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, \
     5, 10}
#define COORD_FWD_N_BOUNDS 16

typedef struct coord_stage_stats {
    double busy_ratio;       /* fraction of the last >= 1 s window the stage computed (0..1) */
    uint64_t bytes_sent;     /* the worker's transport counters (cumulative) */
    uint64_t frames_sent;
    /* The stage's forwards (its StageStats forward intervals), cumulative for
     * this placement epoch: per-bucket counts over COORD_FWD_BOUNDS (the last
     * is +Inf) and the sum of their durations in seconds. */
    uint64_t fwd_buckets[COORD_FWD_N_BOUNDS + 1];
    double fwd_sum_s;
    /* Hand-offs of the stage's output to its next hop (StageStats hops,
     * hop_seconds: the worker's send until the transport completed it),
     * cumulative over the worker's life. */
    uint64_t hops;
    double hop_sum_s;
    double load_seconds;     /* how long the stage's latest load took (StageReady); 0 = not loaded */
    char worker[COORD_NAME_LEN]; /* the worker whose StageStats these are ("" = none yet) */
} coord_stage_stats;

typedef struct coord_worker_stats {
    char name[COORD_NAME_LEN];
    const char *state;       /* one of the engine's worker_states (below) */
    double heartbeat_age_s;  /* seconds since it last reported; < 0 = never */
} coord_worker_stats;

#define COORD_RECOVERY_KEEP 64

typedef struct coord_engine_stats {
    int queue_depth;         /* requests waiting for a scheduler slot */
    int running;             /* requests being prefilled or decoded */
    int kv_blocks_used, kv_blocks_free; /* free = allocatable: free + cached */
    int kv_blocks_total, kv_blocks_cached; /* the pool; cached prefix blocks (evictable) */
    /* KV scheduling (coordinator/serve/sched.h), cumulative over the process: */
    uint64_t preemptions;          /* sequences preempted (re-prefilled later) */
    uint64_t prefix_cache_queries; /* tokens looked up in the prefix cache at admission */
    uint64_t prefix_cache_hits;    /* of those, found (their prefill skipped) */
    uint64_t prefill_tokens;       /* tokens (re-)prefilled by the stages */
    int n_stages;            /* <= COORD_STATS_MAX_STAGES */
    uint64_t epoch;          /* the serving placement's epoch (0: none; static mode: 1) */
    coord_stage_stats stages[COORD_STATS_MAX_STAGES];
    /* Every worker the engine knows (no cap: the live registry's whole fleet).
     * malloc'd by the engine's stats(); coord_engine_stats_release frees it. */
    int n_workers;
    coord_worker_stats *workers;
    /* The state set of the workers (NULL-terminated; one strata_worker_state
     * series per member). NULL: the static cluster's "joining", "ready",
     * "serving", "lost". The live control plane's: "registered", "ready",
     * "serving", "suspect", "dead", "draining". */
    const char *const *worker_states;
    /* Recovery (live and static modes, docs/recovery.md): cumulative counts. */
    uint64_t recoveries;        /* stage losses recovered from, or being recovered from */
    uint64_t sequences_resumed; /* requests moved to a new placement after a loss */
    uint64_t tokens_recomputed; /* prompt + generated tokens re-prefilled for them */
    /* Data-plane frames the coordinator dropped as fenced: results of an
     * older epoch, or arriving after their epoch lost a stage (cluster.c). */
    uint64_t fenced_frames;
    /* The leader's writes to etcd (live mode with --etcd; 0 otherwise):
     * txns etcd refused, changes it refused on their own (dropped), changes
     * queued, and the age of the oldest change etcd misses. */
    uint64_t etcd_txns_refused, etcd_changes_dropped, etcd_queued;
    double etcd_unwritten_s;
    /* Recovery timings in seconds, the latest COORD_RECOVERY_KEEP of each:
     * entry k (counting from 0 since the start) is at [k % COORD_RECOVERY_KEEP];
     * n_* count every one ever. detection: from the lost stage's last sign of
     * life (its latest StageStats reply; they are polled every 100 ms) to the
     * coordinator's verdict (disconnect or deadline). resume: from the verdict
     * to serving again (the new placement, or the stage's worker back). */
    uint64_t n_detections, n_resumes;
    double detection_s[COORD_RECOVERY_KEEP];
    double resume_s[COORD_RECOVERY_KEEP];
} coord_engine_stats;

typedef struct coord_engine_ops {
    /* req is copied (its prompt too). */
    int (*submit)(void *impl, const coord_request *req, const coord_sink *sink, void *ctx,
                  uint64_t *id_out, st_err *err);
    void (*cancel)(void *impl, uint64_t id);
    /* 0 when a placement serves; -1 + err otherwise (GET /health answers 503). */
    int (*health)(void *impl, st_err *err);
    /* Optional (NULL: GET /v1/stages answers 404): the engine's state as a
     * malloc'd JSON object (per-stage counters, KV blocks; see
     * coordinator/serve/cluster.h), or NULL on out of memory. */
    char *(*stages_json)(void *impl);
    /* Optional (NULL: /metrics has no engine gauges): fills *out. */
    void (*stats)(void *impl, coord_engine_stats *out);
    /* Optional (NULL: always serving): true while this coordinator is a
     * standby of a high-availability pair (--etcd, docs/recovery.md); the
     * leader's advertised HTTP base URL goes to leader_http ("" when an
     * election is under way). The HTTP API then answers 503 + Retry-After
     * and X-Strata-Leader instead of serving. */
    bool (*standby)(void *impl, char *leader_http, size_t cap);
} coord_engine_ops;

typedef struct coord_engine {
    const coord_engine_ops *ops;
    void *impl;
} coord_engine;

/* Frees what stats() allocated in *st (not st itself). */
static inline void coord_engine_stats_release(coord_engine_stats *st) {
    free(st->workers);
    st->workers = NULL;
    st->n_workers = 0;
}

#endif
