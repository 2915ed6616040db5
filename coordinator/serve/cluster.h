/* cluster.h — the coordinator's serving engine (coordinator/serve/engine_api.h)
 * over real worker processes: it drives the stages (strata-worker, daemon/)
 * over the UCX data plane (ib/transport.h) with the scheduler (sched.h).
 *
 * Start-up: one xport on the caller's event loop; for each stage it connects
 * to the worker's data-plane address (retrying every 0.25 s while refused),
 * sends CONTROL StageAssign (proto/stage.proto: epoch 1, the stage's layer
 * range, TP degree, kv_blocks, act dtype, next hop = the next stage's
 * address; the last stage answers to this coordinator) and waits for every
 * StageReady. A StageReady with ok = false, or no StageReady from every stage
 * within ready_timeout_s, is fatal: on_fatal is called once with a message
 * naming the stage and its address (strata-coordinator then exits 1). When
 * all are ready, the KV capacity is the minimum of the stages' kv_blocks and
 * the scheduler starts.
 *
 * Serving: submit() tokenizes the prompt (BOS as the vocabulary says),
 * checks the context and queues it in the scheduler (KV blocks on demand,
 * preemption and the prefix cache: sched.h, docs/kv-cache.md; a request
 * without max_tokens generates up to the context or the whole pool,
 * whichever is smaller). A pump (a deferred loop
 * event after every change) launches micro-batches while fewer than
 * max_inflight (default n_stages) are out, as ACTIVATIONS frames of token ids
 * to stage 0. The last stage's TOKENS frame (sampled id + logprobs per
 * sequence; a CONTROL BatchDone when none sampled) goes through
 * sched_on_tokens; each token's piece (tok_piece: raw bytes, the HTTP layer
 * reassembles UTF-8 and matches stop strings, completions.h) goes to the
 * sink. A sequence ends on an end-of-generation token (unless the request
 * has ignore_eos), at max_tokens or at the context (finish LENGTH), or with
 * ERROR when its batch failed at a stage (CONTROL BatchError) or a stage was
 * lost (then /health answers 503 and new requests 503 until restart), unless
 * hold mode (the live control plane re-places) or static recovery
 * (cluster_opts.recover: the same workers come back) holds them.
 *
 * Lost stages: its data-plane connection dropped, or it hung: the
 * per-micro-batch deadline (at every stats poll, a batch in flight past
 * max(2 s, 20 x its expected round trip) makes the cluster look for the
 * stage that answers no StatsRequest, or whose compute makes no progress
 * with work queued; docs/recovery.md). A hung stage is lost the same way.
 * Results that arrive after their epoch lost a stage, or of another epoch,
 * are dropped and counted (coord_engine_stats.fenced_frames).
 *
 * Hold mode (cluster_opts.on_lost set; the live control plane,
 * docs/recovery.md): a lost stage fails no request. The batches in flight
 * are aborted (their sequences keep their positions), on_lost(ud, stage,
 * message) is called once, and every request stays held in the cluster,
 * new ones too (submit accepts them while lost), until the caller moves them
 * to a new placement (cluster_move_requests) or gives up
 * (cluster_fail_requests). A BatchError does not end its sequences either:
 * the batch is aborted, nothing is launched for RETRY_PAUSE (a stage loss
 * usually follows), and the sequences are sent again; a sequence whose
 * batches failed MAX_BATCH_FAILURES times in a row ends with ERROR.
 *
 * Sampling: temperature, top_p, top_k, min_p, seed (a per-request seed from
 * a counter when the request has none), presence and frequency penalties
 * (OpenAI semantics: over the generated tokens, which then travel as the
 * SeqRecord's history) and the logprobs count map to SeqRecord.sampling.
 *
 * stages_json (GET /v1/stages): the coordinator polls every stage with a
 * StatsRequest every 100 ms and answers from the latest StageStats:
 *   {"ready":bool,"epoch":1,"n_ctx":n,"kv_block_size":n,"kv_blocks_total":n,
 *    "kv_blocks_free":n,"requests_waiting":n,"requests_running":n,
 *    "batches_in_flight":n,"batches_launched":n,"tokens_launched":n,
 *    "batch_round_trip_ms":mean launch-to-result time of the batches so far,
 *    "kv":{"prefix_caching":bool,"blocks_cached":n,"usage":owned/total,
 *          "preempted_waiting":n,"preemptions":n,"prefix_cache_query_tokens":n,
 *          "prefix_cache_hit_tokens":n,"prefill_tokens":n,"evictions":n}
 *         (docs/kv-cache.md; the counters over the process, evictions over this cluster),
 *    "stages":[{"stage":i,"address":"h:p","first_layer":a,"last_layer":b,
 *               "tp":t,"ready":bool,"busy_seconds":s,"uptime_seconds":s,
 *               "forwards":n,"tokens":n,"busy_fraction":f,"queue_depth":n,
 *               "forward_intervals":[[start_ns,end_ns],...]}]}
 * busy_seconds / uptime_seconds are the worker's cumulative counters;
 * busy_fraction = delta(busy_seconds) / delta(uptime_seconds) since the
 * previous GET /v1/stages (since the worker started on the first).
 * forward_intervals: the stage's last 1024 forwards (stage_forward calls),
 * oldest first, as [start, end) CLOCK_MONOTONIC nanoseconds of the worker's
 * machine (the same clock for every process on it, so the stages' intervals
 * can be intersected when they share one); the poll asks each worker for the
 * intervals that ended after the newest it has (StatsRequest.forward_since_ns).
 *
 * Threading: everything on the loop thread of `base`.
 */
#ifndef STRATA_COORDINATOR_CLUSTER_H
#define STRATA_COORDINATOR_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/config/cluster_config.h"
#include "coordinator/serve/engine_api.h"
#include "coordinator/config/partition.h"
#include "model/tokenizer.h"

struct event_base;
typedef struct cluster cluster;

typedef struct cluster_opts {
    const coord_config *cfg;   /* stages, model path, KV geometry, limits (must outlive) */
    const place_range *ranges; /* cfg->n_stages layer ranges (copied) */
    int n_ctx;                 /* max tokens per sequence (prompt + generated) */
    const tok_vocab *vocab;    /* the model's vocabulary (must outlive) */
    double ready_timeout_s;    /* every stage ready within this; <= 0: 60 s */
    /* Called once (from the loop) when start-up fails; may be NULL. */
    void (*on_fatal)(void *ud, const char *message);
    /* Called once when every stage is ready; may be NULL. */
    void (*on_ready)(void *ud);
    void *ud;
    uint64_t epoch;            /* placement epoch carried by every frame; 0 = 1 */
    bool keep_loaded;          /* StageAssign.keep_loaded: workers load beside older epochs */
    uint64_t adopt_epoch;      /* StageAssign.adopt_epoch: this epoch lost a stage; a worker re-uses
                                * its identical stage of it instead of loading (0: none) */
    /* Hold mode (above): called once (from the loop, inside a transport
     * callback: do not destroy the cluster there) when a stage of the ready
     * cluster is lost. NULL: the requests fail (the static coordinator). */
    void (*on_lost)(void *ud, int stage, const char *message);
    /* Static recovery (the static coordinator; ignored with on_lost): a lost
     * stage's requests are held (as in hold mode), its worker address is
     * reconnected every 0.25 s, and once it answers, its StageAssign is sent
     * again (then every stage's, so the survivors reconnect their next hop);
     * when all are ready, every held request resumes in this cluster by
     * re-prefilling prompt + generated tokens (the old KV blocks are freed).
     * After recovery_timeout_s (<= 0: 60 s) the held requests end with ERROR
     * ("the cluster could not recover within N s (recovery_timeout) from:
     * ..."), new ones get 503, and serving resumes when the stage is back.
     * /health answers 503 until then. docs/recovery.md. */
    bool recover;
    double recovery_timeout_s;
    /* Where the counters that must outlive this cluster go (engine_totals.h:
     * fenced frames, KV counters, recovery timings). A live coordinator
     * passes one for all its epochs; NULL: the cluster keeps its own. */
    struct engine_totals *totals;
} cluster_opts;

/* Security (docs/security.md, "Data plane (UCX)"): with cfg->cluster_key_file
 * the key is read at create, every worker connection must pass the
 * handshake (xport_require_auth, role coordinator) and each StageAssign
 * carries its token (ib/assign_token.h). StageAssign.model_path is
 * cluster_worker_model(cfg): the model relative to the workers' --model-dir. */
const char *cluster_worker_model(const coord_config *cfg);
/* Reads cfg->cluster_key_file (when set) to report a bad one at start-up:
 * unreadable, readable by others, malformed. 0 or -1 + err. */
int cluster_check_key(const coord_config *cfg, st_err *err);

/* Creates the transport and starts connecting. NULL + err when the
 * transport cannot be created, an address cannot be parsed or the cluster
 * key cannot be read. */
cluster *cluster_create(struct event_base *base, const cluster_opts *o, st_err *err);
/* Cancels everything (no callbacks), closes the peers and frees. After the
 * loop returned. */
void cluster_destroy(cluster *c);
/* The engine interface (impl = c). */
coord_engine cluster_engine(cluster *c);

/* ---- live placement changes (coordinator/control/epochs.c) ----
 * A placement change runs a second cluster (the new epoch) beside the serving
 * one. When it is ready: cluster_pause(old) (no new micro-batches), wait until
 * cluster_inflight(old) == 0, then cluster_move_requests(old, new): every
 * running sequence continues on the new placement by re-prefilling its
 * prompt and the tokens generated so far (the KV cache stays with the old
 * stages), with the same sink, seed and step, so greedy output is unchanged.
 * on_moved(ud, old_id, new_id) reports each move (new_id 0: it could not be
 * moved and finished with ERROR). No batch ever mixes the two epochs: each
 * cluster sends only its own. cluster_release_workers(old) then sends
 * StageRelease{epoch} to its stages; destroy it a little later (the frames
 * must leave first). */
void cluster_pause(cluster *c);
int cluster_inflight(const cluster *c);
bool cluster_is_ready(const cluster *c);
uint64_t cluster_epoch(const cluster *c);
int cluster_ready_stages(const cluster *c);
int cluster_n_requests(const cluster *c);
bool cluster_stage_ready(const cluster *c, int i);

int cluster_move_requests(cluster *from, cluster *to,
                          void (*on_moved)(void *ud, uint64_t old_id, uint64_t new_id), void *ud);
void cluster_release_workers(cluster *c);

/* ---- recovery (hold mode, docs/recovery.md) ---- */
/* A stage was lost (serving stopped for good in this cluster). */
bool cluster_is_lost(const cluster *c);
/* The requests held: their ids (up to cap into ids; the count is returned)
 * and the tokens a move would re-prefill (prompt + generated, summed). */
int cluster_request_ids(const cluster *c, uint64_t *ids, int cap, int64_t *tokens);
/* The worker of stage i announced that it is leaving (live mode: the Leave
 * call, coordinator/control/leave.c): the stage is lost now, exactly as when
 * its connection drops (hold mode: on_lost), without waiting for the drop.
 * No-op unless the cluster is ready and not lost yet. */
void cluster_stage_leaving(cluster *c, int i, const char *message);
/* Every request ends with ERROR and `message`. */
void cluster_fail_requests(cluster *c, const char *message);

#endif
