/* stage_link.h — the coordinator's connection to one stage's worker: its
 * address and layer range, the connection (ib/transport.h), where it stands
 * (down, assigned, ready, lost), and the CONTROL messages the cluster sends
 * it (proto/stage.proto: StageAssign signed with the cluster key,
 * StageRelease, StatsRequest). What the worker reports back in StageStats
 * is kept in `st` (stage_stats.h). The cluster (cluster.c) owns the links
 * and decides what each event means; this file only talks to one worker.
 * Threading: the loop thread only. */
#ifndef STRATA_COORDINATOR_SERVE_STAGE_LINK_H
#define STRATA_COORDINATOR_SERVE_STAGE_LINK_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "coordinator/config/cluster_config.h"
#include "coordinator/config/partition.h"
#include "coordinator/serve/engine_api.h"
#include "coordinator/serve/stage_stats.h"
#include "ib/cluster_key.h"
#include "ib/transport.h"
#include "proto/stage.pb-c.h"

enum link_state { LINK_DOWN, LINK_ASSIGNED, LINK_READY, LINK_LOST };

typedef struct stage_link {
    int index;
    char host[COORD_HOST_MAX];
    int port;
    int tp;
    char backend[16]; /* StageAssign.backend: "" (cpu) or "cuda" */
    place_range range;
    xport_peer *peer;     /* NULL while not connected */
    enum link_state state;
    char last_error[160]; /* why the last connection failed (the start-up deadline's message) */
    int drops;            /* connections in a row that failed before the stage was ready */
    int kv_blocks;        /* StageReady.kv_blocks */
    double load_seconds;  /* StageReady.load_seconds */
    stage_stats st;       /* from its StageStats replies */
} stage_link;

/* What every StageAssign of one cluster carries besides the link's own
 * fields (its index, layer range, TP, backend). */
typedef struct stage_assign_args {
    uint64_t epoch;
    bool keep_loaded;
    uint64_t adopt_epoch;
    int n_stages;
    const char *model_path;   /* relative to the workers' --model-dir */
    int kv_blocks, block_size;
    bool act_bf16;            /* activations between stages in bf16 (else f32) */
    const stage_link *next;   /* the next stage; NULL for the last (it answers the coordinator) */
    const cluster_key *key;   /* signs the assignment (ib/assign_token.h); NULL = none */
} stage_assign_args;

/* Sends CONTROL message m (of epoch) to the link's worker; -1 (logged) when
 * it is not connected or the send fails. */
int stage_link_send_control(stage_link *l, uint64_t epoch, const Strata__V1__ControlMessage *m);
/* Sends the link its StageAssign; the link is then ASSIGNED. -1 (logged)
 * when it cannot be signed or sent. */
int stage_link_assign(stage_link *l, const stage_assign_args *a);
void stage_link_release(stage_link *l, uint64_t epoch);
/* A StatsRequest asking for the forward intervals after the newest kept. */
void stage_link_request_stats(stage_link *l, uint64_t epoch, uint64_t request_id);
/* Closes the connection (its on_disconnect is then ignored); the link is LOST. */
void stage_link_close(stage_link *l);
/* Takes a StageReady with ok set: READY, its KV blocks and load time. */
void stage_link_ready(stage_link *l, const Strata__V1__StageReady *r);
/* The link's GET /v1/stages object (cluster.h), NULL when out of memory. */
json_t *stage_link_json(stage_link *l);
/* The link's /metrics figures: its stage row, and its worker's row (name:
 * the one in its StageStats, else config_name; state "lost", "serving"
 * while `serving` and ready, "ready", or "joining"). now: monotonic s. */
void stage_link_report(const stage_link *l, const char *config_name, bool serving, double now,
                       coord_stage_stats *stage, coord_worker_stats *worker);

#endif
