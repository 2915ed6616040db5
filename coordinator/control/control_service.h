/* control_service.h — the coordinator's live control plane (strata-coordinator
 * --live): the gRPC service strata.v1.Control (proto/control.proto) on the
 * coordinator's libevent loop, the node registry (registry.h), placements
 * with epochs (placement.h), placement changes while serving, drain, and the
 * state file (state_file.h). It is also the serving engine the HTTP API talks
 * to (coord_engine), forwarding to the cluster (cluster.h) of the serving
 * epoch.
 *
 * Placement changes: the new placement runs as a second cluster under epoch
 * E+1 (workers load it beside the old stages: StageAssign.keep_loaded). When
 * every new stage is ready, the old cluster stops launching micro-batches;
 * once its in-flight batches are back, its running sequences move to the new
 * cluster (re-prefill of prompt + generated tokens, cluster_move_requests),
 * new requests already go to the new one, the old workers get StageRelease,
 * and the state file is written. A new placement that fails to load is
 * dropped; the old one keeps serving.
 *
 * Recovery (docs/recovery.md): when a stage of the serving placement is lost
 * (its worker's transport connection drops), the serving cluster holds every
 * request (cluster.h, hold mode; new ones too), the lost node is left out
 * (until it registers again), and an automatic placement over the other
 * usable nodes is loaded as above; when it serves, the held requests move to
 * it (re-prefill). With no placement possible, the requests fail after
 * recovery_timeout_s; serving resumes whenever a placement becomes possible.
 *
 * Who may call what (mutual TLS): authz.h.
 *
 * Start-up: with a state file holding a placement, the coordinator waits for
 * that placement's nodes to register and serves it under the same epoch;
 * without one, it places automatically once min_workers usable nodes have
 * registered. Everything on the loop thread.
 */
#ifndef STRATA_COORDINATOR_CONTROL_SERVICE_H
#define STRATA_COORDINATOR_CONTROL_SERVICE_H

#include <stdint.h>

#include "common/err.h"
#include "coordinator/config/cluster_config.h"
#include "coordinator/serve/engine_api.h"
#include "coordinator/control/registry.h"
#include "model/tokenizer.h"

struct event_base;
typedef struct ctl_service ctl_service;

typedef struct ctl_opts {
    const coord_config *cfg;    /* live config (no stages): model, KV geometry, limits; must outlive */
    const tok_vocab *vocab;     /* must outlive */
    int n_ctx;
    const char *grpc_listen;    /* "127.0.0.1:7070" */
    /* Mutual TLS on the gRPC listener (docs/security.md): the cluster CA, the
     * coordinator's certificate and key (PEM paths). All three or none (NULL:
     * plaintext, which only loopback or --insecure allow: common/exposure.h,
     * checked by the caller). */
    const char *grpc_ca, *grpc_cert, *grpc_key;
    const char *state_path;     /* state file */
    uint32_t heartbeat_ms;      /* default 1000 */
    uint32_t suspect_missed;    /* default 3 */
    uint32_t dead_after_ms;     /* default 10000 */
    int min_workers;            /* auto placement at start (no saved placement); default 1 */
    double ready_timeout_s;     /* a new placement's stages must be ready within this; default 120 */
    double recovery_timeout_s;  /* requests held after a lost stage at most this long; default 60 */
    double dead_node_expiry_s;  /* a dead node's record is removed after this long; 0 = never */
    /* High availability (--etcd): the state lives in etcd instead of
     * state_path, and this coordinator serves only while it is the elected
     * leader (leader.h). NULL: the state file, always serving. */
    const struct leader_opts *ha;
} ctl_opts;

/* Reads the model (layer sizes, sha256), restores the state file, starts the
 * gRPC server. NULL + err on failure (bad model, corrupt state, address in use). */
ctl_service *ctl_create(struct event_base *base, const ctl_opts *o, st_err *err);
int ctl_grpc_port(const ctl_service *s);
/* The serving engine for the HTTP API (impl = s). */
coord_engine ctl_engine(ctl_service *s);
const registry *ctl_registry(const ctl_service *s);
/* Stops the gRPC service (open Generate streams end with UNAVAILABLE), every
 * cluster, and frees. After the loop returned. NULL ok. */
void ctl_destroy(ctl_service *s);

#endif
