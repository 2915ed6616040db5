/* cluster_config.h — the coordinator's static cluster config (INI, libinih):
 * the model, the activation dtype, the KV cache geometry, the HTTP listen
 * address, the scheduler limits and the stages (worker data-plane address, TP
 * degree, optional layer count). The format is documented in
 * docs/cluster-config.md; deploy/cluster-pp2-tp2.ini is an example.
 *
 * Errors name the file and line: "cluster.ini:7: [stage.1]: unknown key 'tpp'".
 * Unknown sections and keys, duplicate keys, bad values, missing required keys
 * and missing sections are all errors (a typo must never be silently ignored).
 */
#ifndef STRATA_COORDINATOR_CLUSTER_CONFIG_H
#define STRATA_COORDINATOR_CLUSTER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/config/partition.h"

#define COORD_HOST_MAX 256
#define COORD_NAME_MAX 64

/* Activation dtype on the data plane. */
enum coord_act_dtype { COORD_ACT_F32 = 0, COORD_ACT_BF16 = 1 };

typedef struct coord_stage_cfg {
    char name[COORD_NAME_MAX]; /* "stage.N", or NAME of [worker NAME] */
    char host[COORD_HOST_MAX]; /* worker data-plane host (name, IPv4, or IPv6 without []) */
    int port;                  /* 1..65535 */
    int tp;                    /* TP degree, >= 1 (default 1) */
    char backend[16];          /* `backend`: "cpu" (default, "") or "cuda" (GPUs 0..tp-1) */
    int n_layers;              /* layer count from `layers`, 0 = not given */
    int line;                  /* line of the section header (for messages) */
} coord_stage_cfg;

typedef struct coord_config {
    char *path;          /* the file read (for messages) */
    char *model;         /* GGUF path (required) */
    char *model_name;    /* name served in the API; default: model file name without .gguf */
    /* StageAssign.model_path: the model relative to each worker's --model-dir
     * (docs/security.md, "Model files"); default: the file name of `model` */
    char *worker_model;
    char *cluster_key_file; /* the data plane's cluster key (ib/cluster_key.h); NULL = none */
    enum coord_act_dtype act_dtype; /* default f32 */
    int kv_block_size;   /* tokens per KV block; default 16 */
    int kv_blocks;       /* KV blocks per stage (the same ids on every stage); default 1024 */
    bool prefix_caching; /* `prefix_caching = true|false`: reuse cached prompt blocks
                            (coordinator/serve/block_manager.h); default true */
    int n_ctx;           /* max tokens per sequence; 0 = the model's context */
    char http_host[COORD_HOST_MAX]; /* `listen`; default 127.0.0.1:8000 */
    int http_port;
    int max_queue;       /* waiting requests before HTTP 429; default 256 */
    int max_seqs;        /* running sequences; default 64 */
    int prefill_chunk;   /* prompt tokens per sequence per micro-batch; default 256 */
    int max_batch_tokens; /* tokens per micro-batch; default 512 */
    int max_inflight;    /* micro-batches in flight; 0 = the number of stages */
    /* live mode: the share of each GPU's memory a stage may fill (weights, KV,
     * activations; coordinator/control/placement.h), as vLLM's; default 0.90 */
    double gpu_memory_utilization;
    size_t max_body_bytes; /* HTTP request body limit (413 beyond); default 1 MiB */
    int recovery_timeout_s; /* live mode: requests held after a lost stage (docs/recovery.md); 0 = 60 */
    char *grpc_ca, *grpc_cert, *grpc_key; /* live mode: mutual TLS of the gRPC control API (PEM paths;
                                           * docs/security.md); NULL = not given */
    /* HTTP API security (docs/security.md, "HTTP API"); the command line overrides each. */
    char *api_key_file;      /* `api_key_file`: API keys, one per line; NULL = none */
    char *http_tls_cert;     /* `http_tls_cert` / `http_tls_key`: PEM files; NULL = plain HTTP */
    char *http_tls_key;
    int protect_metrics;     /* `protect_metrics = true`: /metrics and the probes need the key too */
    int max_connections;     /* `max_connections`: open HTTP connections; default 1024 */
    int header_timeout_s;    /* `header_timeout`: seconds for a request's headers; default 10 */
    int body_timeout_s;      /* `body_timeout`: seconds for its body; default 60 */
    int idle_timeout_s;      /* `idle_timeout`: keep-alive connection between requests; default 60 */
    int max_requests_per_key; /* `max_requests_per_key`: queued + running per API key; default 128, 0 = no limit */
    int partition[PLACE_MAX_STAGES]; /* `partition = 3,2` */
    int n_partition;     /* 0 = not given */
    coord_stage_cfg *stages; /* in pipeline order */
    int n_stages;
} coord_config;

/* Reads and validates the file. On failure *cfg is left empty (nothing to free). */
int coord_config_load(const char *path, coord_config *cfg, st_err *err);
/* Live mode (strata-coordinator --live, docs/control-api.md): the same file
 * without stage sections (workers register over gRPC); a file that has
 * stage sections is refused. cfg->n_stages is 0. */
int coord_config_load_live(const char *path, coord_config *cfg, st_err *err);
/* Same, from text; `name` is used in messages in place of the file name. */
int coord_config_parse(const char *text, const char *name, coord_config *cfg, st_err *err);
void coord_config_free(coord_config *cfg);

/* Layer counts per stage for a model with n_layers layers: `partition`, else
 * the per-stage `layers`, else the even split (partition.h). ranges has
 * cfg->n_stages entries. -1 + err when they do not cover the model exactly. */
int coord_config_placement(const coord_config *cfg, int n_layers, place_range *ranges,
                           st_err *err);

/* Parses "host:port" or "[v6addr]:port" (port 1..65535; port 0 too when
 * allow_port0, for tests). host gets the name without brackets. */
int coord_parse_hostport(const char *s, char *host, size_t host_cap, int *port, int allow_port0,
                         st_err *err);

#endif
