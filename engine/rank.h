/* rank.h — one TP rank of a stage: its backend instance, its comm rank, its
 * shard of the weights with its KV caches (rank_weights.h) and its workspace
 * (rank_workspace.h); it loads, and runs its part of a forward. The stage
 * (stage.c) runs every rank on a thread of its own; the ranks meet in the
 * collectives (see stage.h for the data flow and the collective counts). */
#ifndef STRATA_ENGINE_RANK_H
#define STRATA_ENGINE_RANK_H

#include "common/err.h"
#include "compute/backend.h"
#include "compute/comm.h"
#include "engine/batch_plan.h"
#include "engine/rank_weights.h"
#include "engine/rank_workspace.h"
#include "engine/stage_shape.h"
#include "model/shard.h"

typedef struct rank_ctx {
    const stage_shape *sh;
    int rank;
    int n_threads; /* the backend's CPU threads */
    shard_plan plan;
    backend *be;
    comm *c;
    rank_weights w;
    rank_workspace ws;
    double busy; /* seconds inside forwards */
} rank_ctx;

/* Makes the rank's backend on `device` and loads its shard (progress as in
 * rank_weights_load). A device backend also gets its workspace for batches
 * of up to max_batch_tokens tokens (0 = 512), so a forward allocates nothing.
 * -1 + err; rank_release frees what was made. */
int rank_open(rank_ctx *rc, int device, int max_batch_tokens, rank_weights_progress progress,
              void *progress_ctx, st_err *err);
/* Sizes the workspace for plan's batch. */
int rank_prepare(rank_ctx *rc, const batch_plan *plan, st_err *err);
/* The rank's part of the forward of plan's batch. Once an op fails, the rank
 * stops computing but still makes every collective call (on its valid
 * buffers), so that the other ranks never wait forever; -1 + err then. */
int rank_forward(rank_ctx *rc, const batch_plan *plan, st_err *err);
void rank_release(rank_ctx *rc);

#endif
