/* cjob.h — one job of a stage's compute thread (daemon/compute_thread.h), as
 * plain data: what the loop thread hands over (open a stage, forward a
 * micro-batch, a pipeline boundary's NCCL step) and what comes back. The
 * compute thread runs it; daemon/act_p2p.h runs the NCCL kinds. No functions.
 */
#ifndef STRATA_DAEMON_CJOB_H
#define STRATA_DAEMON_CJOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/stage.h"

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

#endif
