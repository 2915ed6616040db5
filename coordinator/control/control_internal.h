/* control_internal.h — what the files of the live control plane
 * (control_service.h) share: the service's struct, the placement runs, the
 * engine's requests, and the functions one file calls in another.
 *   control_service.c  lifetime, the handler table, the serving engine,
 *                      Register / Heartbeat / GetStatus / ListNodes
 *   epochs.c           placement runs and epochs: start, switch, release;
 *                      the periodic tick
 *   recovery.c         recovery from a lost stage (docs/recovery.md)
 *   placement_rpc.c    GetPlacement / SetPlacement / AutoPlacement, Drain /
 *                      Undrain
 *   generate.c         the Generate stream
 *   authz.c            who may call what (authz.h)
 *   node_store.c       the registry's journal (journal.h), RemoveNode, the
 *                      expiry of dead nodes
 *   etcd_store.c       the state in etcd and the standby mode (--etcd,
 *                      leader.h)
 * Not for use outside coordinator/control/. */
#ifndef STRATA_COORDINATOR_CONTROL_INTERNAL_H
#define STRATA_COORDINATOR_CONTROL_INTERNAL_H

#include <event2/event.h>
#include <protobuf-c/protobuf-c.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/control/control_service.h"
#include "coordinator/control/placement.h"
#include "coordinator/serve/cluster.h"
#include "coordinator/serve/engine_totals.h"
#include "rpc/grpc_loop.h"
#include "rpc/grpc_server.h"

#define RETIRE_AFTER_S 1.0   /* an old cluster lives on this long after StageRelease */
#define SWITCH_POLL_US 2000  /* waiting for the old epoch's in-flight batches */
#define RETRY_START_S 2.0
#define RECOVERY_TIMEOUT_S 60.0 /* default ctl_opts.recovery_timeout_s */

/* A node whose stage was lost: left out of recovery placements while it
 * holds the same lease (registering again gives it a new one). */
typedef struct lost_node {
    char name[REG_NAME_MAX];
    uint64_t lease;
} lost_node;

/* One placement epoch being loaded or served: its cluster and its config. */
typedef struct run {
    ctl_service *s;
    placement pl;
    coord_config cfg;        /* shallow copy of the live config; stages below */
    coord_stage_cfg *stages;
    cluster *cl;
    uint64_t node_reg[PLACE_STAGE_MAX]; /* each stage's node's registrations when assigned */
    bool ready, failed;
    char fail_msg[ST_ERR_MSG_MAX];
    double retire_at;
    struct run *next;        /* the retired list */
} run;

/* A request through the engine: which cluster holds it now. */
typedef struct lreq {
    struct lreq *prev, *next;
    ctl_service *s;
    uint64_t id;             /* the id the HTTP layer / Generate knows */
    run *r;
    uint64_t cid;            /* the id in r->cl */
    coord_sink sink;
    void *ctx;
    char request_id[64];     /* coord_request.request_id (the logs' req=), for recovery's log lines */
} lreq;

typedef struct gen_stream gen_stream; /* generate.c */

struct ctl_service {
    struct event_base *base;
    ctl_opts o;
    char model_file[256];    /* the model's file name: workers resolve it */
    char model_sha[65];
    place_model pm;
    registry reg;
    struct hb_inbox *hb;     /* heartbeats answered on the rpc thread, for the loop (hb_inbox.h) */
    atomic_uint_least64_t hb_epoch; /* the serving epoch, for those replies (ctl_heartbeats_apply) */
    placement saved;         /* restored from the state file, not yet serving */
    uint64_t last_epoch;
    run *cur, *pend, *from;  /* serving, loading, being switched away from */
    run *retired;
    lreq *reqs;
    uint64_t next_id;
    gen_stream *streams;
    rpc_server *srv;
    rpc_loop *loop;
    bool tls;                /* mutual TLS: calls are authorized (authz.h) */
    struct ctl_guard *guards; /* the handler table's role checks */
    struct event *tick_ev, *switch_ev;
    double t0, retry_at;
    /* Recovery (docs/recovery.md): `lost` is the serving run that lost a
     * stage; it holds its requests until a new placement serves them. */
    run *lost;
    double lost_at;
    bool recovery_expired;   /* recovery_timeout passed: the held requests failed */
    bool recovery_stuck_logged;
    char lost_msg[ST_ERR_MSG_MAX];
    char lost_name[REG_NAME_MAX]; /* the node and stage of the loss (GetStatus) */
    int lost_stage;
    lost_node excl[PLACE_STAGE_MAX];
    int n_excl;
    uint64_t recoveries, seqs_resumed, tokens_recomputed;
    engine_totals totals;    /* counters of every epoch's cluster (engine_totals.h) */
    struct journal *jr;      /* the registry's changes since the snapshot (node_store.c) */
    struct leader *ha;       /* --etcd: the state in etcd, leader election (etcd_store.c) */
    bool standby;            /* --etcd and not (yet) the leader: nothing is served */
    uint64_t fd_limit;       /* RLIMIT_NOFILE when the service started; 0 = unlimited */
    int fd_alarm;            /* ctl_check_fd_room: 0, 1 = near the limit logged, 2 = at it logged */
};

/* control_service.c */
void ctl_save_state(ctl_service *s);
/* Logs (once per crossing) when the live nodes, one gRPC connection each,
 * come near (90%) or up to the open-file limit less 64 descriptors for the
 * rest: past it new workers' connections fail with EMFILE. Every tick. */
void ctl_check_fd_room(ctl_service *s);
/* The usable nodes (registered or ready, not draining), sorted by name, `except`
 * left out: *out is malloc'd (the caller frees it; NULL when none). Returns
 * their count, -1 when out of memory. */
int ctl_usable_nodes(ctl_service *s, place_node **out, const char *except);
int ctl_eng_submit(void *impl, const coord_request *req, const coord_sink *sink, void *ctx,
                   uint64_t *id_out, st_err *err);
void ctl_eng_cancel(void *impl, uint64_t id);
void ctl_reply(rpc_call *c, const ProtobufCMessage *m);
/* Applies the heartbeats queued on the rpc thread (hb_inbox.h) to the
 * registry and publishes the serving epoch for their replies. Loop thread;
 * at every tick and before every handler. */
void ctl_heartbeats_apply(ctl_service *s);

/* epochs.c */
void ctl_run_free(run *r);
bool ctl_in_placement(const run *r, const char *node);
int ctl_change_placement(ctl_service *s, placement *pl, int *code, st_err *err);
void ctl_try_finish_switch(evutil_socket_t fd, short what, void *arg);
void ctl_tick(evutil_socket_t fd, short what, void *arg);

/* recovery.c */
int ctl_held_ids(const ctl_service *s, const run *r, char *buf, size_t cap);
void ctl_run_on_lost(void *ud, int stage, const char *msg);
void ctl_recovery_tick(ctl_service *s, double t);

/* node_store.c */
int ctl_store_open(ctl_service *s, st_err *err);       /* replays STATE.journal */
void ctl_store_node(ctl_service *s, const reg_node *n); /* a new node (or a new address) */
void ctl_store_reset(ctl_service *s);                   /* after a snapshot */
void ctl_store_tick(ctl_service *s, double now);        /* fsync, expiry, compaction */
void ctl_h_remove_node(rpc_call *c, const rpc_request *req, void *ud);

/* etcd_store.c (s->ha set: --etcd) */
int ctl_etcd_open(ctl_service *s, st_err *err);  /* standby until elected */
void ctl_etcd_close(ctl_service *s);             /* resigns */
void ctl_etcd_save(ctl_service *s, const placement *p);
void ctl_etcd_node(ctl_service *s, const char *name, const char *addr); /* addr NULL: removed */
/* True while a standby: msg says so and names the leader, http gets the
 * leader's advertised HTTP URL ("" when unknown). */
bool ctl_standby(ctl_service *s, char *msg, size_t cap, char *http, size_t http_cap);

/* leave.c */
void ctl_h_leave(rpc_call *c, const rpc_request *req, void *ud);

/* placement_rpc.c */
void ctl_h_get_placement(rpc_call *c, const rpc_request *req, void *ud);
void ctl_h_set_placement(rpc_call *c, const rpc_request *req, void *ud);
void ctl_h_auto_placement(rpc_call *c, const rpc_request *req, void *ud);
void ctl_h_drain(rpc_call *c, const rpc_request *req, void *ud);
void ctl_h_undrain(rpc_call *c, const rpc_request *req, void *ud);

/* generate.c */
void ctl_h_generate(rpc_call *c, const rpc_request *req, void *ud);
/* Ends every open Generate stream (UNAVAILABLE) and cancels its request. */
void ctl_generate_close_all(ctl_service *s);

#endif
