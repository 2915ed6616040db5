/* main.c — strata-coordinator: reads the cluster config, places the model's
 * layers on the stages, connects to the workers and assigns them their stages
 * (coordinator/serve/cluster.h), and serves the OpenAI-compatible HTTP API on one
 * libevent loop until SIGINT or SIGTERM. While the stages load, /health and
 * completions answer 503; a stage that fails to load or is not ready within
 * --ready-timeout seconds ends the process with exit status 1. SIGTERM drains
 * gracefully (coordinator/lifecycle.h, --shutdown-grace) and exits 0.
 *
 *   strata-coordinator --config FILE [--listen HOST:PORT] [--ready-timeout S]
 *                      [--api-key-file F] [--tls-cert F --tls-key F] [--insecure] ...
 *   strata-coordinator --live --config FILE [--grpc-listen H:P] [--state FILE]
 *                      [--grpc-ca F --grpc-cert F --grpc-key F] [--insecure] ...
 *
 * --live: the config has no stages; workers register over gRPC and the
 * placement is live (coordinator/control/control_service.h, docs/control-api.md).
 *
 * The HTTP API needs an API key (--api-key-file, STRATA_API_KEY) to listen
 * on a non-loopback address, unless --insecure (common/exposure.h,
 * docs/security.md); without one it exits with status 1 before starting.
 * SIGHUP re-reads the keys.
 *
 * main() reads as a table of contents: parse_opts, then run, which loads the
 * config and the model, starts the engine (the cluster, or the live control
 * service) and the HTTP API, and runs the loop. docs/architecture.md follows
 * one request through the pieces.
 */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/exposure.h"
#include "common/log.h"
#include "common/version.h"
#include "coordinator/api/http_api.h"
#include "coordinator/config/cluster_config.h"
#include "coordinator/control/control_service.h"
#include "coordinator/control/leader.h"
#include "coordinator/lifecycle.h"
#include "coordinator/serve/cluster.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"

/* Start-up failed (cluster.h): leave the loop with exit status 1. */
struct run_state {
    struct event_base *base;
    int failed;
};
static void on_fatal(void *ud, const char *message) {
    struct run_state *rs = ud;
    fprintf(stderr, "strata-coordinator: %s\n", message);
    rs->failed = 1;
    event_base_loopbreak(rs->base);
}
static void on_ready(void *ud) {
    printf("strata-coordinator: all stages ready\n");
    fflush(stdout);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: strata-coordinator --config FILE [--listen HOST:PORT] [--ready-timeout S]\n"
            "  --config FILE       cluster config (INI; see docs/cluster-config.md)\n"
            "  --listen HOST:PORT  HTTP API address (overrides [cluster] listen)\n"
            "  --ready-timeout S   seconds for every worker to be reachable and loaded (60)\n"
            "  --shutdown-grace S  on SIGTERM, completions in progress get this long to finish (30;\n"
            "                      keep it below the unit's TimeoutStopSec=; docs/deployment.md)\n"
            "  --version           print the version, git commit and build type\n"
            "  --log-level L       error, warn, info (default; or $STRATA_LOG) or debug\n"
            "  --no-prefix-caching do not reuse the KV blocks of shared prompt prefixes\n"
            "                      (overrides [cluster] prefix_caching; docs/cluster-config.md)\n"
            "  --insecure          allow listening on a non-loopback address without credentials\n"
            "                      (HTTP API, gRPC control API; a warning at every start)\n"
            "HTTP API security (docs/security.md; each overrides its [cluster] key):\n"
            "  --api-key-file FILE API keys, one per line (NAME:KEY or KEY; '#' comments); clients\n"
            "                      send 'Authorization: Bearer KEY'. STRATA_API_KEY adds one key\n"
            "  --protect-metrics   /metrics and the probes need a key too (default: open)\n"
            "  --tls-cert FILE     serve HTTPS with this PEM certificate chain ...\n"
            "  --tls-key FILE      ... and this PEM private key\n"
            "  --max-connections N open connections; more are closed at once (1024)\n"
            "  --header-timeout S  seconds for a request's headers (10)\n"
            "  --body-timeout S    seconds for a request's body (60)\n"
            "  --idle-timeout S    seconds a keep-alive connection may wait between requests (60)\n"
            "  --max-requests-per-key N  completions queued + running per key; 0 = no limit (128)\n"
            "  --cluster-key-file FILE  data-plane key shared with the workers (overrides [cluster]\n"
            "                      cluster_key_file; default $STRATA_CLUSTER_KEY_FILE; owner-only\n"
            "                      file; docs/security.md)\n"
            "live mode (workers register; docs/control-api.md):\n"
            "  --live              the config lists no stages; placement is automatic / via gRPC\n"
            "  --grpc-listen H:P   gRPC control API address (127.0.0.1:7070)\n"
            "  --grpc-ca FILE      cluster CA: clients need a certificate it issued (mutual TLS;\n"
            "                      overrides [cluster] grpc_ca; docs/security.md)\n"
            "  --grpc-cert FILE    the coordinator's certificate (overrides [cluster] grpc_cert)\n"
            "  --grpc-key FILE     its private key (overrides [cluster] grpc_key)\n"
            "  --state FILE        cluster state file (./strata-state.json)\n"
            "  --heartbeat-ms N    worker heartbeat interval (1000)\n"
            "  --dead-after-ms N   no heartbeat this long: the node is dead (10000)\n"
            "  --min-workers N     first automatic placement once N workers registered (1)\n"
            "  --dead-node-expiry S  remove a dead node's record after S seconds (0: never; 0)\n"
            "  --recovery-timeout S  after a lost stage, hold requests this long for a new placement\n"
            "                      (static mode too: for the stage's worker to come back)\n"
            "                      (60; overrides [cluster] recovery_timeout; docs/recovery.md)\n"
            "high availability (two or more coordinators on etcd; docs/recovery.md):\n"
            "  --etcd URL[,URL...] keep the state in etcd (instead of --state) and elect a leader;\n"
            "                      standbys answer 503 / UNAVAILABLE naming it (http://127.0.0.1:2379)\n"
            "  --etcd-prefix P     the cluster's keys in etcd (/strata/default)\n"
            "  --leader-ttl S      the leader's lease: a standby takes over within S seconds (3)\n"
            "  --advertise-http U  the leader record's HTTP URL (http://LISTEN-HOST:PORT)\n"
            "  --advertise-grpc H:P  the leader record's gRPC address (--grpc-listen)\n"
            "  --etcd-cacert F     CA of etcd's certificate (https:// endpoints)\n"
            "  --etcd-cert F --etcd-key F  client certificate for etcd\n");
}

/* The command line. */
typedef struct coord_opts {
    const char *config_path, *listen;
    const char *cluster_key_file; /* overrides [cluster] cluster_key_file */
    double ready_timeout;
    double recovery_timeout; /* 0: the config's, else 60 */
    double shutdown_grace;
    bool live;
    bool no_prefix_caching; /* --no-prefix-caching */
    const char *grpc_listen, *state_path;
    const char *grpc_ca, *grpc_cert, *grpc_key; /* NULL: the config's */
    bool insecure;
    long heartbeat_ms, dead_after_ms, min_workers;
    double dead_node_expiry; /* s; 0 = never */
    const char *etcd, *etcd_prefix, *advertise_http, *advertise_grpc; /* --etcd: high availability */
    const char *etcd_cacert, *etcd_cert, *etcd_key;
    double leader_ttl;
    /* HTTP API security: NULL / < 0 = the config's */
    const char *api_key_file, *tls_cert, *tls_key;
    bool protect_metrics;
    long max_connections, max_requests_per_key;
    double header_timeout, body_timeout, idle_timeout;
} coord_opts;

/* Long options without a short form. */
enum {
    OPT_API_KEY_FILE = 256,
    OPT_PROTECT_METRICS,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_MAX_CONNECTIONS,
    OPT_HEADER_TIMEOUT,
    OPT_BODY_TIMEOUT,
    OPT_IDLE_TIMEOUT,
    OPT_MAX_REQUESTS_PER_KEY,
    OPT_DEAD_NODE_EXPIRY,
    OPT_ETCD,
    OPT_ETCD_PREFIX,
    OPT_LEADER_TTL,
    OPT_ADVERTISE_HTTP,
    OPT_ADVERTISE_GRPC,
    OPT_ETCD_CACERT,
    OPT_ETCD_CERT,
    OPT_ETCD_KEY,
};

/* A number in (lo, hi] from optarg, or -1 after a message. */
static int opt_number(const char *name, const char *arg, double lo, double hi, double *out) {
    char *end;
    double v = strtod(arg, &end);
    if (!*arg || *end || !(v > lo) || !(v <= hi)) {
        fprintf(stderr, "strata-coordinator: --%s: not a number in (%g, %g]: %s\n", name, lo, hi, arg);
        return -1;
    }
    *out = v;
    return 0;
}

/* Parses argv into *o. Returns -1 to go on, else the exit status (0 for
 * --help, 2 for a bad command line). */
static int parse_opts(int argc, char **argv, coord_opts *o) {
    *o = (coord_opts){.ready_timeout = 60.0,
                      .shutdown_grace = SHUTDOWN_GRACE_S,
                      .grpc_listen = "127.0.0.1:7070",
                      .state_path = "strata-state.json",
                      .heartbeat_ms = 1000,
                      .dead_after_ms = 10000,
                      .min_workers = 1,
                      .max_connections = -1,
                      .max_requests_per_key = -1};
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                          {"live", no_argument, NULL, 'L'},
                                          {"grpc-listen", required_argument, NULL, 'g'},
                                          {"grpc-ca", required_argument, NULL, 'A'},
                                          {"grpc-cert", required_argument, NULL, 'E'},
                                          {"grpc-key", required_argument, NULL, 'K'},
                                          {"insecure", no_argument, NULL, 'I'},
                                          {"state", required_argument, NULL, 's'},
                                          {"heartbeat-ms", required_argument, NULL, 'H'},
                                          {"dead-after-ms", required_argument, NULL, 'D'},
                                          {"min-workers", required_argument, NULL, 'm'},
                                          {"dead-node-expiry", required_argument, NULL, OPT_DEAD_NODE_EXPIRY},
                                          {"listen", required_argument, NULL, 'l'},
                                          {"ready-timeout", required_argument, NULL, 't'},
                                          {"recovery-timeout", required_argument, NULL, 'R'},
                                          {"shutdown-grace", required_argument, NULL, 'G'},
                                          {"version", no_argument, NULL, 'V'},
                                          {"log-level", required_argument, NULL, 'Y'},
                                          {"no-prefix-caching", no_argument, NULL, 'P'},
                                          {"api-key-file", required_argument, NULL, OPT_API_KEY_FILE},
                                          {"protect-metrics", no_argument, NULL, OPT_PROTECT_METRICS},
                                          {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
                                          {"tls-key", required_argument, NULL, OPT_TLS_KEY},
                                          {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
                                          {"header-timeout", required_argument, NULL, OPT_HEADER_TIMEOUT},
                                          {"body-timeout", required_argument, NULL, OPT_BODY_TIMEOUT},
                                          {"idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT},
                                          {"max-requests-per-key", required_argument, NULL,
                                           OPT_MAX_REQUESTS_PER_KEY},
                                          {"cluster-key-file", required_argument, NULL, 1001},
                                          {"etcd", required_argument, NULL, OPT_ETCD},
                                          {"etcd-prefix", required_argument, NULL, OPT_ETCD_PREFIX},
                                          {"leader-ttl", required_argument, NULL, OPT_LEADER_TTL},
                                          {"advertise-http", required_argument, NULL, OPT_ADVERTISE_HTTP},
                                          {"advertise-grpc", required_argument, NULL, OPT_ADVERTISE_GRPC},
                                          {"etcd-cacert", required_argument, NULL, OPT_ETCD_CACERT},
                                          {"etcd-cert", required_argument, NULL, OPT_ETCD_CERT},
                                          {"etcd-key", required_argument, NULL, OPT_ETCD_KEY},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "c:l:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': o->config_path = optarg; break;
        case 1001: o->cluster_key_file = optarg; break;
        case 'l': o->listen = optarg; break;
        case 't': {
            char *end;
            o->ready_timeout = strtod(optarg, &end);
            if (*end || !(o->ready_timeout > 0)) {
                fprintf(stderr, "strata-coordinator: --ready-timeout: not a positive number: %s\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'R': {
            char *end;
            o->recovery_timeout = strtod(optarg, &end);
            if (*end || !(o->recovery_timeout > 0)) {
                fprintf(stderr, "strata-coordinator: --recovery-timeout: not a positive number: %s\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'G': {
            char *end;
            o->shutdown_grace = strtod(optarg, &end);
            if (!*optarg || *end || !(o->shutdown_grace >= 0 && o->shutdown_grace <= 3600)) {
                fprintf(stderr, "strata-coordinator: --shutdown-grace: not a number of seconds in [0, 3600]: %s\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'V': st_version_print(stdout, "strata-coordinator"); return 0;
        case 'Y': {
            enum st_log_level level;
            if (st_log_parse_level(optarg, &level) != 0) {
                fprintf(stderr,
                        "strata-coordinator: --log-level: '%s' is not error, warn, info or debug\n",
                        optarg);
                return 2;
            }
            st_log_set_level(level);
            break;
        }
        case 'L': o->live = true; break;
        case 'P': o->no_prefix_caching = true; break;
        case 'g': o->grpc_listen = optarg; break;
        case 'A': o->grpc_ca = optarg; break;
        case 'E': o->grpc_cert = optarg; break;
        case 'K': o->grpc_key = optarg; break;
        case 'I': o->insecure = true; break;
        case 's': o->state_path = optarg; break;
        case 'H':
        case 'D':
        case 'm': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 1 || v > 3600000) {
                fprintf(stderr, "strata-coordinator: --%s: not an integer in [1, 3600000]: %s\n",
                        c == 'H' ? "heartbeat-ms" : c == 'D' ? "dead-after-ms" : "min-workers", optarg);
                return 2;
            }
            *(c == 'H' ? &o->heartbeat_ms : c == 'D' ? &o->dead_after_ms : &o->min_workers) = v;
            break;
        }
        case OPT_API_KEY_FILE: o->api_key_file = optarg; break;
        case OPT_PROTECT_METRICS: o->protect_metrics = true; break;
        case OPT_TLS_CERT: o->tls_cert = optarg; break;
        case OPT_TLS_KEY: o->tls_key = optarg; break;
        case OPT_HEADER_TIMEOUT:
            if (opt_number("header-timeout", optarg, 0, 3600, &o->header_timeout) != 0) return 2;
            break;
        case OPT_BODY_TIMEOUT:
            if (opt_number("body-timeout", optarg, 0, 3600, &o->body_timeout) != 0) return 2;
            break;
        case OPT_IDLE_TIMEOUT:
            if (opt_number("idle-timeout", optarg, 0, 86400, &o->idle_timeout) != 0) return 2;
            break;
        case OPT_ETCD: o->etcd = optarg; break;
        case OPT_ETCD_PREFIX: o->etcd_prefix = optarg; break;
        case OPT_ADVERTISE_HTTP: o->advertise_http = optarg; break;
        case OPT_ADVERTISE_GRPC: o->advertise_grpc = optarg; break;
        case OPT_ETCD_CACERT: o->etcd_cacert = optarg; break;
        case OPT_ETCD_CERT: o->etcd_cert = optarg; break;
        case OPT_ETCD_KEY: o->etcd_key = optarg; break;
        case OPT_LEADER_TTL:
            if (opt_number("leader-ttl", optarg, 0.999, 3600, &o->leader_ttl) != 0) return 2;
            break;
        case OPT_DEAD_NODE_EXPIRY:
            if (opt_number("dead-node-expiry", optarg, -1, 365 * 86400.0, &o->dead_node_expiry) != 0) return 2;
            break;
        case OPT_MAX_CONNECTIONS:
        case OPT_MAX_REQUESTS_PER_KEY: {
            double v;
            bool conns = c == OPT_MAX_CONNECTIONS;
            if (opt_number(conns ? "max-connections" : "max-requests-per-key", optarg, conns ? 0 : -1,
                           1 << 20, &v) != 0)
                return 2;
            if (v != (double)(long)v) {
                fprintf(stderr, "strata-coordinator: --%s: not an integer: %s\n",
                        conns ? "max-connections" : "max-requests-per-key", optarg);
                return 2;
            }
            *(conns ? &o->max_connections : &o->max_requests_per_key) = (long)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o->config_path || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (!o->live && o->etcd) {
        fprintf(stderr, "strata-coordinator: --etcd needs --live (high availability of the live control plane)\n");
        return 2;
    }
    if (!o->live && (o->grpc_ca || o->grpc_cert || o->grpc_key)) {
        fprintf(stderr, "strata-coordinator: --grpc-ca, --grpc-cert and --grpc-key need --live (the gRPC control API)\n");
        return 2;
    }
    return -1;
}

/* What the coordinator needs of the model file: its shape, vocabulary,
 * chat template and context length. */
typedef struct coord_model {
    llama_config mc;
    tok_vocab *vocab;
    char *chat_template; /* NULL: the plain chat format */
    int n_ctx;
} coord_model;

static int load_model(const coord_config *cfg, const char *config_path, coord_model *m, st_err *err) {
    gguf_file *gf = gguf_open(cfg->model, err);
    if (!gf) {
        fprintf(stderr, "strata-coordinator: %s: model: %s\n", config_path, err->msg);
        return -1;
    }
    /* The chat template (POST /v1/chat/completions); absent = the plain format. */
    if (gguf_find_key(gf, "tokenizer.chat_template") >= 0) {
        st_err terr = {{0}};
        if (gguf_get_str(gf, "tokenizer.chat_template", &m->chat_template, &terr) != 0)
            ST_WARN("coordinator: tokenizer.chat_template: %s; using the plain chat format", terr.msg);
    }
    int mrc = llama_config_from_gguf(gf, &m->mc, err);
    if (mrc == 0 && !(m->vocab = tok_vocab_load(gf, err))) mrc = -1;
    gguf_close(gf);
    if (mrc != 0) {
        fprintf(stderr, "strata-coordinator: %s: %s\n", cfg->model, err->msg);
        return -1;
    }
    m->n_ctx = cfg->n_ctx > 0 ? cfg->n_ctx : m->mc.n_ctx_train;
    return 0;
}

/* The engine behind the HTTP API: the live control service (workers
 * register, placement is automatic or by gRPC), or the static cluster of the
 * config's stages. */
typedef struct coord_engine_owner {
    cluster *cl;
    ctl_service *ctl;
} coord_engine_owner;

static int start_engine(struct event_base *base, const coord_opts *o, coord_config *cfg, const coord_model *m,
                        struct run_state *rs, coord_engine_owner *own, coord_engine *engine, st_err *err) {
    if (o->live) {
        /* Mutual TLS of the gRPC control API: the flags, else the config's
         * keys; without it only loopback, unless --insecure (exposure.h). */
        const char *ca = o->grpc_ca ? o->grpc_ca : cfg->grpc_ca, *cert = o->grpc_cert ? o->grpc_cert : cfg->grpc_cert,
                   *key = o->grpc_key ? o->grpc_key : cfg->grpc_key;
        /* Any of the three counts: ctl_create names the missing ones. */
        bool tls = (ca && *ca) || (cert && *cert) || (key && *key);
        char why[512];
        if (st_exposure_check("gRPC control", o->grpc_listen, tls, o->insecure, why, sizeof why) != 0) {
            fprintf(stderr, "strata-coordinator: %s\n", why);
            return -1;
        }
        ctl_opts lo = {.cfg = cfg,
                       .grpc_ca = ca,
                       .grpc_cert = cert,
                       .grpc_key = key,
                       .vocab = m->vocab,
                       .n_ctx = m->n_ctx,
                       .grpc_listen = o->grpc_listen,
                       .state_path = o->state_path,
                       .heartbeat_ms = (uint32_t)o->heartbeat_ms,
                       .suspect_missed = 3,
                       .dead_after_ms = (uint32_t)o->dead_after_ms,
                       .min_workers = (int)o->min_workers,
                       .dead_node_expiry_s = o->dead_node_expiry,
                       .ready_timeout_s = o->ready_timeout,
                       .recovery_timeout_s = o->recovery_timeout > 0 ? o->recovery_timeout
                                                                     : cfg->recovery_timeout_s};
        /* High availability: the leader record names where clients and
         * workers find this coordinator once it leads. */
        char adv_http[COORD_HOST_MAX + 40];
        snprintf(adv_http, sizeof adv_http, strchr(cfg->http_host, ':') ? "%s://[%s]:%d" : "%s://%s:%d",
                 (o->tls_cert || cfg->http_tls_cert) ? "https" : "http", cfg->http_host, cfg->http_port);
        const char *adv_grpc = o->advertise_grpc ? o->advertise_grpc : o->grpc_listen;
        leader_opts ha = {.etcd = o->etcd,
                          .cacert = o->etcd_cacert,
                          .cert = o->etcd_cert,
                          .key = o->etcd_key,
                          .insecure = o->insecure,
                          .prefix = o->etcd_prefix ? o->etcd_prefix : "/strata/default",
                          .ttl_s = o->leader_ttl > 0 ? o->leader_ttl : 3.0,
                          .name = adv_grpc,
                          .http = o->advertise_http ? o->advertise_http : adv_http,
                          .grpc = adv_grpc};
        if (o->etcd) lo.ha = &ha;
        own->ctl = ctl_create(base, &lo, err);
        if (!own->ctl) {
            fprintf(stderr, "strata-coordinator: %s\n", err->msg);
            return -1;
        }
        *engine = ctl_engine(own->ctl);
        printf("strata-coordinator: gRPC control API on %s (port %d, %s)\n", o->grpc_listen, ctl_grpc_port(own->ctl),
               tls ? "mutual TLS" : "plaintext");
        fflush(stdout);
        return 0;
    }
    place_range ranges[PLACE_MAX_STAGES];
    if (coord_config_placement(cfg, m->mc.n_layer, ranges, err) != 0) {
        fprintf(stderr, "strata-coordinator: %s\n", err->msg);
        return -1;
    }
    for (int i = 0; i < cfg->n_stages; i++)
        ST_INFO("coordinator: stage %d (%s): layers [%d, %d) TP %d at %s:%d%s%s", i,
                cfg->stages[i].name, ranges[i].first, ranges[i].last, cfg->stages[i].tp,
                cfg->stages[i].host, cfg->stages[i].port, i == 0 ? " +embedding" : "",
                i == cfg->n_stages - 1 ? " +lm_head" : "");
    cluster_opts co = {.cfg = cfg,
                       .ranges = ranges,
                       .n_ctx = m->n_ctx,
                       .vocab = m->vocab,
                       .ready_timeout_s = o->ready_timeout,
                       .on_fatal = on_fatal,
                       .on_ready = on_ready,
                       .ud = rs,
                       .recover = true, /* wait for a lost stage's worker (docs/recovery.md) */
                       .recovery_timeout_s = o->recovery_timeout > 0 ? o->recovery_timeout
                                                                     : cfg->recovery_timeout_s};
    own->cl = cluster_create(base, &co, err);
    if (!own->cl) {
        fprintf(stderr, "strata-coordinator: %s\n", err->msg);
        return -1;
    }
    *engine = cluster_engine(own->cl);
    return 0;
}

/* The HTTP API's keys (--api-key-file, else [cluster] api_key_file, and
 * STRATA_API_KEY), then exposure.h's rule for its listen address. NULL after
 * a message on stderr. */
static const char *key_file(const coord_opts *o, const coord_config *cfg) {
    return o->api_key_file ? o->api_key_file : cfg->api_key_file;
}
static int per_key_limit(const coord_opts *o, const coord_config *cfg) {
    return o->max_requests_per_key >= 0 ? (int)o->max_requests_per_key : cfg->max_requests_per_key;
}

static http_keys *load_http_keys(const coord_opts *o, const coord_config *cfg, st_err *err) {
    http_keys *keys = http_keys_load(key_file(o, cfg), getenv("STRATA_API_KEY"), per_key_limit(o, cfg), err);
    if (!keys) {
        fprintf(stderr, "strata-coordinator: %s\n", err->msg);
        return NULL;
    }
    char addr[COORD_HOST_MAX + 16], why[600];
    snprintf(addr, sizeof addr, strchr(cfg->http_host, ':') ? "[%s]:%d" : "%s:%d", cfg->http_host, cfg->http_port);
    if (st_exposure_check("HTTP API", addr, http_keys_count(keys) > 0, o->insecure, why, sizeof why) != 0) {
        fprintf(stderr, "strata-coordinator: %s\n", why);
        http_keys_free(keys);
        return NULL;
    }
    return keys;
}

/* SIGHUP re-reads the HTTP API's keys (docs/security.md, "Rotating a key");
 * a file that does not load leaves the current keys in place. */
typedef struct key_reload {
    const coord_opts *o;
    const coord_config *cfg;
    http_api *api;
    http_keys **keys;
} key_reload;

static void on_sighup(evutil_socket_t sig, short what, void *arg) {
    (void)sig, (void)what;
    key_reload *r = arg;
    const char *file = key_file(r->o, r->cfg);
    if (!file && http_keys_count(*r->keys) == 0) {
        ST_INFO("coordinator: SIGHUP: no API keys are configured; nothing to reload");
        return;
    }
    st_err err = {{0}};
    http_keys *k = http_keys_load(file, getenv("STRATA_API_KEY"), per_key_limit(r->o, r->cfg), &err);
    if (!k) {
        ST_ERROR("coordinator: SIGHUP: keeping the current API keys: %s", err.msg);
        return;
    }
    http_api_set_keys(r->api, k);
    http_keys_free(*r->keys); /* freed once its last request ends */
    *r->keys = k;
    ST_INFO("coordinator: SIGHUP: %d API keys loaded%s%s", http_keys_count(k), file ? " from " : "",
            file ? file : "");
}

/* Everything after the command line; returns the exit status. */
/* One gRPC connection per worker: a fleet needs more descriptors than the
 * usual soft limit of 1024. The unit raises it (LimitNOFILE); a manual start
 * gets the hard limit here. */
static void raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
            ST_INFO("coordinator: open-file limit raised from %llu to %llu", (unsigned long long)was,
                    (unsigned long long)rl.rlim_max);
        else if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
            return;
    }
    /* The one real limit on the fleet's size: a worker holds one descriptor
     * (its gRPC connection), the HTTP clients and the state files need the
     * rest. Said at start, where the operator can still raise it. */
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 16384)
        ST_WARN("coordinator: the open-file limit is %llu (hard limit %llu): about %llu workers and HTTP clients "
                "can connect at once; raise the hard limit (LimitNOFILE= in the unit, ulimit -Hn) for a bigger "
                "fleet",
                (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                (unsigned long long)(rl.rlim_cur > 64 ? rl.rlim_cur - 64 : 0));
}

static int run(const coord_opts *o) {
    st_log_set_tag("strata-coordinator"); /* SYSLOG_IDENTIFIER (docs/logging.md) */
    raise_fd_limit();
    char node[256] = "";
    if (gethostname(node, sizeof node - 1) == 0) st_log_set_node(node); /* STRATA_NODE */
    st_err err = {{0}};
    coord_config cfg;
    if ((o->live ? coord_config_load_live : coord_config_load)(o->config_path, &cfg, &err) != 0) {
        fprintf(stderr, "strata-coordinator: %s\n", err.msg);
        return 1;
    }
    if (o->no_prefix_caching) cfg.prefix_caching = false;
    const char *key_file = o->cluster_key_file ? o->cluster_key_file : getenv("STRATA_CLUSTER_KEY_FILE");
    if (key_file) { /* the flag, else the environment, overrides the config; "" = none */
        free(cfg.cluster_key_file);
        cfg.cluster_key_file = *key_file ? strdup(key_file) : NULL;
    }
    if (cluster_check_key(&cfg, &err) != 0) {
        fprintf(stderr, "strata-coordinator: cluster key: %s\n", err.msg);
        coord_config_free(&cfg);
        return 1;
    }
    int rc = 1;
    struct event_base *base = NULL;
    lifecycle *life = NULL;
    http_api *api = NULL;
    http_keys *keys = NULL;
    struct event *sighup = NULL;
    coord_engine_owner own = {0};
    coord_model m = {0};
    struct run_state rs = {0};
    if (o->listen && coord_parse_hostport(o->listen, cfg.http_host, sizeof cfg.http_host, &cfg.http_port,
                                          1, &err) != 0) {
        fprintf(stderr, "strata-coordinator: --listen: %s\n", err.msg);
        goto out;
    }
    /* The HTTP API's keys, and whether its address may listen without them:
     * decided before anything starts. */
    if (!(keys = load_http_keys(o, &cfg, &err))) goto out;
    /* The model's shape decides the placement and the context. */
    if (load_model(&cfg, o->config_path, &m, &err) != 0) goto out;
    ST_INFO("coordinator: model %s (%s): %d layers, context %d, PP %d", cfg.model_name, cfg.model,
            m.mc.n_layer, m.n_ctx, cfg.n_stages);
    base = event_base_new();
    if (!base) {
        fprintf(stderr, "strata-coordinator: cannot create the event loop\n");
        goto out;
    }
    rs.base = base;
    coord_engine engine;
    if (start_engine(base, o, &cfg, &m, &rs, &own, &engine, &err) != 0) goto out;
    http_api_config hc = {
        .host = cfg.http_host,
        .port = cfg.http_port,
        .max_body_bytes = cfg.max_body_bytes,
        .model_name = cfg.model_name,
        .n_ctx = m.n_ctx,
        .chat_template = m.chat_template,
        .tokenizer = compl_tokenizer_vocab(m.vocab),
        .keys = keys,
        .protect_metrics = o->protect_metrics || cfg.protect_metrics,
        .tls_cert = o->tls_cert ? o->tls_cert : cfg.http_tls_cert,
        .tls_key = o->tls_key ? o->tls_key : cfg.http_tls_key};
    hc.conn = (http_conn_limits){
        .max_connections = o->max_connections > 0 ? (int)o->max_connections : cfg.max_connections,
        .header_timeout_s = o->header_timeout > 0 ? o->header_timeout : cfg.header_timeout_s,
        .body_timeout_s = o->body_timeout > 0 ? o->body_timeout : cfg.body_timeout_s,
        .idle_timeout_s = o->idle_timeout > 0 ? o->idle_timeout : cfg.idle_timeout_s};
    api = http_api_create(base, &hc, &engine, &err);
    if (!api) {
        fprintf(stderr, "strata-coordinator: %s\n", err.msg);
        goto out;
    }
    printf("strata-coordinator: listening on %s://%s:%d\n", hc.tls_cert ? "https" : "http", cfg.http_host,
           http_api_port(api));
    fflush(stdout);
    /* Signals, graceful shutdown, READY=1 (HTTP and gRPC listen), STATUS=, watchdog. */
    lifecycle_opts lo = {base, api, &engine, o->shutdown_grace};
    if (!(life = lifecycle_start(&lo, &err))) {
        fprintf(stderr, "strata-coordinator: %s\n", err.msg);
        goto out;
    }
    key_reload kr = {o, &cfg, api, &keys};
    if (!(sighup = evsignal_new(base, SIGHUP, on_sighup, &kr)) || event_add(sighup, NULL) != 0) {
        fprintf(stderr, "strata-coordinator: cannot handle SIGHUP\n");
        goto out;
    }
    event_base_dispatch(base);
    rc = rs.failed ? 1 : 0;
out:
    if (sighup) event_free(sighup);
    lifecycle_free(life);
    http_api_destroy(api);
    http_keys_free(keys);
    ctl_destroy(own.ctl);
    cluster_destroy(own.cl);
    tok_vocab_free(m.vocab);
    free(m.chat_template);
    if (base) event_base_free(base);
    coord_config_free(&cfg);
    return rc;
}

int main(int argc, char **argv) {
    coord_opts o;
    int rc = parse_opts(argc, argv, &o);
    return rc >= 0 ? rc : run(&o);
}
