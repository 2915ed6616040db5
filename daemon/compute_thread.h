/* compute_thread.h — the worker's compute thread: owns the stage (engine/stage.h)
 * and runs jobs (open a stage, forward a micro-batch) strictly in submission
 * order, so the event loop keeps progressing UCX while a forward runs.
 *
 * Hand-off: the loop thread submits jobs (compute_submit); the compute thread
 * runs them and appends them to a done list, then writes the eventfd
 * (compute_fd). The loop thread, on that fd, takes the finished jobs
 * (compute_take_done) in the order they were submitted. A job is owned by the
 * compute thread from submit until it is taken back; the loop thread never
 * touches the stage.
 *
 * Stats: after every job the compute thread snapshots the counters under a
 * mutex (compute_get_stats), because stage_stats_get / stage_rank_stats_get
 * are not safe to call while a forward runs.
 */
#ifndef STRATA_DAEMON_COMPUTE_THREAD_H
#define STRATA_DAEMON_COMPUTE_THREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/stage.h"

#define COMPUTE_MAX_RANKS 64

enum cjob_kind {
    CJOB_OPEN,    /* close the current stage (if any), then stage_open(params) */
    CJOB_FORWARD, /* stage_forward(batch) on the current stage */
    /* A pipeline boundary on NCCL (daemon/act_p2p.h), on the stage's device: */
    CJOB_P2P_OPEN,  /* join the boundary's communicator (p2p) */
    CJOB_P2P_SEND,  /* send dev_out (dev_bytes) to the next stage, then free it */
    CJOB_P2P_CLOSE, /* close the communicator and free p2p */
};

struct act_p2p;

/* What an OPEN job reports (filled on success). */
typedef struct cjob_stage_info {
    int n_embd, n_vocab, n_layer;
    int kv_blocks, block_size;
    bool is_first, is_last;
    uint64_t weight_bytes, buf_bytes; /* all ranks */
    double load_seconds;
} cjob_stage_info;

typedef struct cjob {
    struct cjob *next;
    enum cjob_kind kind;
    void *user; /* the loop side's per-job state; not read by the compute thread */

    /* OPEN input */
    stage_params params; /* params.model_path must stay valid until the job is taken back */
    /* OPEN output */
    cjob_stage_info info;

    /* FORWARD input: see stage_forward. out_bf16 (optional): after the
     * forward, hidden_out ([n_tokens, n_embd] f32) is converted into it. */
    stage_batch batch;
    const float *hidden_in;
    float *hidden_out;
    uint16_t *out_bf16;
    size_t n_out;               /* elements of hidden_out (for out_bf16) */
    /* A boundary on NCCL: p2p_in: first receive the input rows from it
     * (hidden_in unused); p2p_out: forward into a device buffer of the stage
     * (hidden_out unused), left in dev_out (dev_bytes) for a CJOB_P2P_SEND.
     * P2P_* jobs: p2p, and dev_out / dev_bytes for SEND. */
    struct act_p2p *p2p_in, *p2p_out, *p2p;
    void *dev_out;
    size_t dev_bytes;
    uint64_t dev_gen;           /* the stage dev_out belongs to (act_p2p.c); P2P_OPEN: the link's serial */
    stage_sample_out *samples;  /* last stage: batch.n_seqs entries */
    /* A boundary on ucx-cuda: the input rows already in device memory
     * (dev_in, f32; hidden_in unused) and / or the output rows into device
     * memory (dev_rows_out, f32; hidden_out unused): stage_forward_io. */
    const void *dev_in;
    void *dev_rows_out;
    /* FORWARD output */
    double seconds;             /* wall time of stage_forward */
    uint64_t start_ns, end_ns;  /* CLOCK_MONOTONIC ns around stage_forward */

    /* Both: 0 or -1 with err. A FORWARD without a loaded stage fails. */
    int status;
    st_err err;
    /* FORWARD: the stage failed for good (engine/stage.h stage_failed): every
     * later forward fails too; the stage is lost. */
    bool stage_failed;
} cjob;

typedef struct compute_stats {
    bool loaded;
    uint64_t forwards, tokens; /* cumulative over every stage this thread ran */
    double busy_seconds;       /* cumulative wall time inside stage_forward */
    int n_ranks;               /* of the current stage */
    stage_rank_stats ranks[COMPUTE_MAX_RANKS];
    int queued;                /* jobs submitted and not yet finished */
} compute_stats;

typedef struct compute compute;

/* Starts the thread (no stage loaded). NULL + err on failure. */
compute *compute_create(st_err *err);
/* Finishes the running job, drops the queued ones (they stay owned by the
 * thread: they are moved to the done list, with status -1 "shutting down",
 * and handed back by compute_take_done), closes the stage and joins. After
 * this only compute_take_done and compute_free may be called. */
void compute_stop(compute *c);
/* Frees the object (after compute_stop and after taking every job back). */
void compute_free(compute *c);

/* The eventfd that becomes readable when jobs finished (EV_READ). */
int compute_fd(const compute *c);
void compute_submit(compute *c, cjob *job);
/* Returns the finished jobs as a list in submission order (NULL if none) and
 * clears the fd's readiness. */
cjob *compute_take_done(compute *c);
/* Runs a FORWARD job on the caller's thread, now, when the compute thread is
 * idle (nothing queued, running or finished and not yet taken; a stage
 * loaded), and returns true: the job is finished (status, outputs, times as
 * if the thread had run it, counted in the stats) and stays the caller's; it
 * does not go to the done list. Otherwise returns false and the job is
 * untouched (submit it). Saves the two thread hand-offs of a forward (wake the
 * thread, wake the caller's loop) when nothing else is in flight. */
bool compute_run_inline(compute *c, cjob *job);
void compute_get_stats(compute *c, compute_stats *out);

#endif
