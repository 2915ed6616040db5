/* main.c — strata-worker: command line, signals and the event loop of the
 * per-node daemon (daemon/worker.h does the work; docs/worker.md).
 *
 *   strata-worker --listen HOST:PORT [--name NAME] [--threads N] [--log-level L]
 *                 [--metrics-listen HOST:PORT [--metrics-insecure]]
 *                 [--coordinator HOST:PORT --model FILE... | --model-dir DIR] [--memory BYTES]
 *                 [--grpc-ca FILE --grpc-cert FILE --grpc-key FILE]
 *                 [--cluster-key-file FILE] [--insecure]
 *
 * With --coordinator the worker registers with the coordinator's gRPC control
 * service and heartbeats (daemon/registration.h); without it, it waits for a
 * coordinator that knows its address (static cluster config).
 * Runs in the foreground. Prints "strata-worker: listening on HOST:PORT" on
 * stdout once the data plane is up (PORT is the bound one when 0 was asked).
 * SIGTERM / SIGINT stop the loop; in live mode the worker then tells the
 * coordinator it leaves (Leave: its stage is re-placed at once); the compute
 * thread finishes the forward it runs and the stage closes; exit 0.
 * systemd: READY=1 once listening, STATUS= lines, WATCHDOG=1 from the loop
 * (common/notify.h).
 * A bad flag or a listen failure: one line on stderr, exit 2 / 1.
 *
 * Security (docs/security.md): with --cluster-key-file every data-plane peer
 * must prove the cluster key and only the coordinator's signed assignments
 * are acted on; a non-loopback --listen without a key refuses to start
 * unless --insecure (common/exposure.h).
 */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <unistd.h>

#include "common/exposure.h"
#include "common/log.h"
#include "common/notify.h"
#include "common/version.h"
#include "daemon/registration.h"
#include "ib/act_transport.h"
#include "ib/fabric_env.h"
#include "daemon/worker.h"
#include "daemon/worker_metrics.h"

#define MAX_MODELS 64
#define LOAD_PERIOD_MS 500

/* What the command line asks for (models: owned copies of the paths). */
struct worker_cli {
    const char *listen, *name, *coordinator;
    const char *grpc_ca, *grpc_cert, *grpc_key; /* mutual TLS to the coordinator (docs/security.md) */
    const char *metrics_listen;  /* GET /metrics (daemon/worker_metrics.h); NULL = off */
    char metrics_host[256];
    int metrics_port;
    bool metrics_insecure;       /* a non-loopback metrics address without credentials */
    char host[256]; /* --listen split */
    int port;
    int threads;
    char *models[MAX_MODELS];
    int n_models;
    uint64_t memory;
    const char *key_file; /* --cluster-key-file */
    const char *model_dir; /* --model-dir, else the directory of the first --model (model_dir_buf) */
    char model_dir_buf[4096];
    bool insecure;
    int act_transport;           /* --activation-transport (enum act_override) */
    fabric_config fabric; /* --ib-tc, --ib-sl, --qps-per-connection, --socket-ifname */
};

static int parse_options(int argc, char **argv, struct worker_cli *o);
static int run(const struct worker_cli *o);

/* The NCCL/UCX fabric settings of this node's topology (ib/fabric_env.h) and
 * its config (cfg: the fabric QoS policy), set in this process's environment
 * before UCX (and NCCL, in a CUDA stage) initialise; a variable the operator
 * set wins, and the log says which did. The topology is read under
 * $STRATA_SYSFS_ROOT when set (a host's /sys mounted elsewhere in a
 * container; a fixture tree in tests), else "/". */
static void apply_fabric_env(const fabric_config *cfg)
{
    fabric_node *n = calloc(1, sizeof *n);
    fabric_env e;
    st_err err = {{0}};
    if (!n) return;
    const char *root = getenv("STRATA_SYSFS_ROOT");
    if (fabric_node_detect(root && *root ? root : "/", n, &err) == 0 && fabric_derive(n, cfg, &e, &err) == 0)
        fabric_env_apply(&e);
    else
        ST_WARN("fabric: NCCL/UCX settings not derived: %s", err.msg);
    free(n);
}

int main(int argc, char **argv)
{
    struct worker_cli o = {.fabric = FABRIC_CONFIG_DEFAULT};
    int rc = parse_options(argc, argv, &o);
    if (rc < 0) rc = run(&o);
    for (int i = 0; i < o.n_models; i++) free(o.models[i]);
    return rc;
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: strata-worker --listen HOST:PORT [--name NAME] [--threads N] [--log-level L]\n"
            "  --listen HOST:PORT  data-plane address (UCX listener); port 0 = any free port\n"
            "  --name NAME         name in logs and in StageReady (default HOST:PORT)\n"
            "  --threads N         CPU threads for a stage (default 0 = all cores)\n"
            "  --log-level L       error, warn, info (default) or debug\n"
            "  --metrics-listen H:P  serve Prometheus GET /metrics there (off by default; docs/metrics.md)\n"
            "  --metrics-insecure  allow a non-loopback --metrics-listen (metrics are read-only; no credentials)\n"
            "  --coordinator H:P[,H:P...]  register with the coordinator's gRPC control service (live\n"
            "                      mode); several: a leader and its standbys, tried in turn\n"
            "  --model FILE        a model file this node has (repeatable; registered in live mode)\n"
            "  --model-dir DIR     the directory StageAssign model paths are confined to (default: the\n"
            "                      first --model's; live mode registers every *.gguf in it)\n"
            "  --memory BYTES      memory to advertise for placement (suffix K, M, G; default MemTotal)\n"
            "  --grpc-ca FILE      cluster CA: mutual TLS to the coordinator (default $STRATA_CA)\n"
            "  --grpc-cert FILE    this node's certificate, CN node:NAME (default $STRATA_CERT)\n"
            "  --grpc-key FILE     its private key (default $STRATA_KEY); docs/security.md\n"
            "  --version           print the version, git commit and build type\n"
            "  --cluster-key-file FILE  data-plane key (owner-only file; default $STRATA_CLUSTER_KEY_FILE;\n"
            "                      empty: none; docs/security.md)\n"
            "  --insecure          allow a non-loopback --listen without a cluster key (logs a warning)\n"
            "  --activation-transport auto|ucx|nccl  how activations cross this worker's pipeline\n"
            "                      boundaries (default auto; docs/cuda-backend.md)\n"
            "  --ib-tc N, --ib-sl N, --qps-per-connection N, --socket-ifname IF\n"
            "                      the fabric policy behind NCCL_IB_TC/UCX_IB_TRAFFIC_CLASS (0-255), NCCL_IB_SL\n"
            "                      (0-15), NCCL_IB_QPS_PER_CONNECTION (1-128) and NCCL_SOCKET_IFNAME; the rest\n"
            "                      of the NCCL/UCX settings come from the topology (docs/worker.md)\n");
}

static int bad(const char *fmt, const char *arg)
{
    fprintf(stderr, "strata-worker: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see --help)\n");
    return 2;
}

static int parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return -1;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end || v == 0) return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

/* Adds every *.gguf file in dir to o->models. 0, or the exit code (message printed). */
static int add_model_dir(struct worker_cli *o, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return bad("--model-dir: cannot open '%s'", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".gguf")) continue;
        if (o->n_models == MAX_MODELS) {
            closedir(d);
            return bad("more than %s model files", "64");
        }
        char *p = malloc(strlen(dir) + l + 2);
        if (p) sprintf(p, "%s/%s", dir, e->d_name);
        if (p) o->models[o->n_models++] = p;
    }
    closedir(d);
    return 0;
}

/* Fills *o from argv (flags in docs/worker.md). Returns -1 to go on and run,
 * else the exit code: 0 after --help, 2 after a bad flag (one line printed). */
static int parse_options(int argc, char **argv, struct worker_cli *o)
{
    static const struct option opts[] = {{"listen", required_argument, 0, 'l'},
                                         {"name", required_argument, 0, 'n'},
                                         {"threads", required_argument, 0, 't'},
                                         {"log-level", required_argument, 0, 'v'},
                                         {"coordinator", required_argument, 0, 'C'},
                                         {"grpc-ca", required_argument, 0, 'A'},
                                         {"grpc-cert", required_argument, 0, 'E'},
                                         {"grpc-key", required_argument, 0, 'K'},
                                         {"model", required_argument, 0, 'm'},
                                         {"model-dir", required_argument, 0, 'D'},
                                         {"memory", required_argument, 0, 'M'},
                                         {"metrics-listen", required_argument, 0, 'P'},
                                         {"metrics-insecure", no_argument, 0, 'I'},
                                         {"cluster-key-file", required_argument, 0, 1001},
                                         {"insecure", no_argument, 0, 1002},
                                         {"activation-transport", required_argument, 0, 1003},
                                         {"ib-tc", required_argument, 0, 1004},
                                         {"ib-sl", required_argument, 0, 1005},
                                         {"qps-per-connection", required_argument, 0, 1006},
                                         {"socket-ifname", required_argument, 0, 1007},
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    int rc;
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, "", opts, NULL);
        if (c == -1) break;
        char *end;
        switch (c) {
        case 'l': o->listen = optarg; break;
        case 'n': o->name = optarg; break;
        case 't': {
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 0 || v > 4096)
                return bad("--threads '%s' is not an integer in [0, 4096]", optarg);
            o->threads = (int)v;
            break;
        }
        case 'v': {
            enum st_log_level level;
            if (st_log_parse_level(optarg, &level)) return bad("--log-level '%s' is not error, warn, info or debug", optarg);
            st_log_set_level(level);
            break;
        }
        case 'C': o->coordinator = optarg; break;
        case 'P': o->metrics_listen = optarg; break;
        case 'I': o->metrics_insecure = true; break;
        case 'A': o->grpc_ca = optarg; break;
        case 'E': o->grpc_cert = optarg; break;
        case 'K': o->grpc_key = optarg; break;
        case 'm':
            if (o->n_models == MAX_MODELS) return bad("more than %s model files", "64");
            if (access(optarg, R_OK) != 0) return bad("--model: cannot read '%s'", optarg);
            o->models[o->n_models++] = strdup(optarg);
            break;
        case 'D':
            if (o->model_dir) return bad("%s", "--model-dir given twice");
            if ((rc = add_model_dir(o, optarg))) return rc;
            o->model_dir = optarg;
            break;
        case 'M':
            if (parse_bytes(optarg, &o->memory)) return bad("--memory '%s' is not a byte count (e.g. 8G)", optarg);
            break;
        case 1001: o->key_file = optarg; break;
        case 1002: o->insecure = true; break;
        case 1003: {
            enum act_override v;
            if (act_override_parse(optarg, &v)) return bad("--activation-transport '%s' is not auto, ucx or nccl", optarg);
            o->act_transport = (int)v;
            break;
        }
        case 1004:
        case 1005:
        case 1006:
        case 1007: {
            static const char *const flag[] = {"--ib-tc", "--ib-sl", "--qps-per-connection", "--socket-ifname"};
            st_err ferr;
            if (fabric_config_option(&o->fabric, flag[c - 1004], optarg, &ferr) != 0) return bad("%s", ferr.msg);
            break;
        }
        case 'h': usage(stdout); return 0;
        case 'V': st_version_print(stdout, "strata-worker"); return 0;
        default: return bad("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return bad("unexpected argument '%s'", argv[optind]);
    if (!o->listen) return bad("%s", "--listen HOST:PORT is required");
    if (o->memory && !o->coordinator) return bad("%s", "--memory needs --coordinator");
    if (!o->model_dir && o->n_models) { /* default model directory: the first --model's */
        const char *slash = strrchr(o->models[0], '/');
        if (!slash)
            snprintf(o->model_dir_buf, sizeof o->model_dir_buf, ".");
        else
            snprintf(o->model_dir_buf, sizeof o->model_dir_buf, "%.*s", slash == o->models[0] ? 1 : (int)(slash - o->models[0]),
                     o->models[0]);
        o->model_dir = o->model_dir_buf;
    }
    if (o->coordinator && !o->name) return bad("%s", "--coordinator needs --name (the node name it registers)");
    if (o->metrics_listen) {
        st_err merr;
        if (worker_parse_hostport(o->metrics_listen, o->metrics_host, sizeof o->metrics_host, &o->metrics_port, 1,
                                  &merr))
            return bad("--metrics-listen: %s", merr.msg);
        /* Metrics carry no request data and accept no commands, but a
         * non-loopback listener is still an explicit choice (docs/security.md). */
        char why[300];
        if (st_exposure_check("worker metrics", o->metrics_listen, false, o->metrics_insecure, why, sizeof why))
            return bad("%s (or --metrics-insecure: metrics are read-only)", why);
    } else if (o->metrics_insecure) {
        return bad("%s", "--metrics-insecure needs --metrics-listen");
    }
    if ((o->grpc_ca || o->grpc_cert || o->grpc_key) && !o->coordinator)
        return bad("%s", "--grpc-ca, --grpc-cert and --grpc-key need --coordinator");
    if (o->coordinator) { /* the environment fills in what the flags leave out (docs/security.md) */
        if (!o->grpc_ca) o->grpc_ca = getenv("STRATA_CA");
        if (!o->grpc_cert) o->grpc_cert = getenv("STRATA_CERT");
        if (!o->grpc_key) o->grpc_key = getenv("STRATA_KEY");
    }
    st_err err;
    if (worker_parse_hostport(o->listen, o->host, sizeof o->host, &o->port, 1, &err))
        return bad("--listen: %s", err.msg);
    return -1;
}

/* ---------------------------------------------------------------- running */

struct load_tick {
    worker *w;
    reg_client *reg; /* live mode; NULL in static mode */
    struct event *ev;
    const char *stop_signal; /* set by on_signal: "SIGTERM" / "SIGINT" */
    struct event_base *base;
};

static void on_load_tick(evutil_socket_t fd, short what, void *arg)
{
    struct load_tick *t = arg;
    worker_load wl;
    worker_load_get(t->w, &wl);
    reg_load rl = {.running_sequences = wl.running_sequences,
                   .kv_blocks_used = wl.kv_blocks_used,
                   .kv_blocks_free = wl.kv_blocks > (int)wl.kv_blocks_used ? (uint32_t)wl.kv_blocks - wl.kv_blocks_used : 0,
                   .busy_seconds = wl.busy_seconds,
                   .uptime_seconds = wl.uptime_seconds,
                   .bytes_sent = wl.bytes_sent};
    if (t->reg) {
        reg_set_load(t->reg, &rl);
        worker_release_stale(t->w, reg_serving_epoch(t->reg));
    }
    if (wl.n_stages)
        st_notify_status("serving %d stage(s): %u sequence(s), %u/%d KV blocks used%s", wl.n_stages,
                         wl.running_sequences, wl.kv_blocks_used, wl.kv_blocks,
                         t->reg && !reg_registered(t->reg) ? "; not registered" : "");
    else
        st_notify_status(t->reg ? (reg_registered(t->reg) ? "registered; no stage assigned" : "registering")
                                : "waiting for a coordinator to assign a stage");
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct load_tick *t = arg;
    t->stop_signal = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    ST_INFO("worker: %s, shutting down%s", t->stop_signal, t->reg ? "; leaving the cluster" : "");
    st_notify_stopping();
    st_notify_status("stopping (%s)", t->stop_signal);
    event_base_loopbreak(t->base);
}

/* Live mode: registers with the coordinator (daemon/registration.h) and
 * starts the timer that hands it the load. 0, or -1 (one line printed). */
static int start_live(const struct worker_cli *o, struct event_base *base, struct load_tick *tick)
{
    char data_addr[300], hn[256];
    const char *adv = o->host;
    if (!strcmp(o->host, "0.0.0.0") || !strcmp(o->host, "::")) {
        if (gethostname(hn, sizeof hn) == 0) adv = hn;
    }
    snprintf(data_addr, sizeof data_addr, strchr(adv, ':') ? "[%s]:%d" : "%s:%d", adv, worker_port(tick->w));
    reg_opts ro = {.coordinator = o->coordinator,
                   .node = o->name,
                   .data_address = data_addr,
                   .models = (const char *const *)o->models,
                   .n_models = o->n_models,
                   .memory_bytes = o->memory,
                   .ca = o->grpc_ca,
                   .cert = o->grpc_cert,
                   .key = o->grpc_key};
    st_err err;
    tick->reg = reg_start(&ro, &err);
    if (!tick->reg) {
        fprintf(stderr, "strata-worker: error: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Starts the worker, serves until SIGTERM / SIGINT and stops. The exit code:
 * 0, or 1 when it could not start (one line printed). */
static int run(const struct worker_cli *o)
{
    /* SYSLOG_IDENTIFIER is the program; the node name goes in STRATA_NODE
     * (and node= on stderr lines), docs/logging.md. */
    st_log_set_tag("strata-worker");
    st_log_set_node(o->name ? o->name : o->listen);

    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    if (!base) {
        fprintf(stderr, "strata-worker: error: cannot create the event loop\n");
        return 1;
    }
    st_err err;
    cluster_key *key = NULL;
    const char *key_file = o->key_file ? o->key_file : getenv("STRATA_CLUSTER_KEY_FILE"); /* "": none */
    if (key_file && *key_file && !(key = cluster_key_load(key_file, &err))) {
        fprintf(stderr, "strata-worker: error: --cluster-key-file: %s\n", err.msg);
        event_base_free(base);
        return 1;
    }
    char why[400];
    if (st_exposure_check("data plane", o->listen, key != NULL, o->insecure, why, sizeof why)) {
        fprintf(stderr, "strata-worker: error: %s (--cluster-key-file)\n", why);
        cluster_key_free(key);
        event_base_free(base);
        return 1;
    }
    if (o->coordinator && reg_check_tls(o->grpc_ca, o->grpc_cert, o->grpc_key, &err) != 0) {
        fprintf(stderr, "strata-worker: error: %s\n", err.msg);
        cluster_key_free(key);
        event_base_free(base);
        return 1;
    }
    apply_fabric_env(&o->fabric);
    worker_opts wo = {.listen_host = o->host, .listen_port = o->port, .name = o->name, .n_threads = o->threads,
                      .models = (const char *const *)o->models, .n_models = o->n_models, .key = key,
                      .model_dir = o->model_dir, .activation_transport = o->act_transport};
    worker *w = worker_create(base, &wo, &err);
    if (!w) {
        fprintf(stderr, "strata-worker: error: %s\n", err.msg);
        cluster_key_free(key);
        event_base_free(base);
        return 1;
    }
    if (key) ST_INFO("worker: data plane authenticated with the cluster key from %s", key_file);
    int rc = 1;
    struct load_tick tick = {w, NULL, NULL, NULL, base};
    struct event *sig_term = evsignal_new(base, SIGTERM, on_signal, &tick);
    struct event *sig_int = evsignal_new(base, SIGINT, on_signal, &tick);
    st_watchdog *wd = NULL;
    worker_metrics *metrics = NULL;
    if (!sig_term || !sig_int || event_add(sig_term, NULL) || event_add(sig_int, NULL)) {
        fprintf(stderr, "strata-worker: error: cannot install signal handlers\n");
        goto out;
    }
    ST_INFO("worker: listening on %s:%d", o->host, worker_port(w));
    if (o->metrics_listen) {
        if (!(metrics = worker_metrics_start(base, w, o->metrics_host, o->metrics_port, &err))) {
            fprintf(stderr, "strata-worker: error: %s\n", err.msg);
            goto out;
        }
        ST_INFO("worker: metrics on http://%s:%d/metrics", o->metrics_host, worker_metrics_port(metrics));
        printf("strata-worker: metrics on %s:%d\n", o->metrics_host, worker_metrics_port(metrics));
    }
    if (o->coordinator && start_live(o, base, &tick)) goto out;
    /* Load for the heartbeats (live mode) and the STATUS= line. */
    tick.ev = event_new(base, -1, EV_PERSIST, on_load_tick, &tick);
    struct timeval tv = {0, LOAD_PERIOD_MS * 1000};
    if (!tick.ev || event_add(tick.ev, &tv)) {
        fprintf(stderr, "strata-worker: error: cannot create the load timer\n");
        goto out;
    }
    printf("strata-worker: listening on %s:%d\n", o->host, worker_port(w));
    fflush(stdout);
    wd = st_watchdog_start(base);
    st_notify_ready();
    on_load_tick(-1, 0, &tick);

    rc = event_base_dispatch(base) < 0 ? 1 : 0;
    /* A signal: leave the cluster first (the coordinator stops sending and
     * re-places the stage), then worker_destroy lets the compute thread
     * finish the forward it is running. */
    if (tick.stop_signal && tick.reg) {
        reg_leave(tick.reg, tick.stop_signal);
        tick.reg = NULL;
    }
out:
    st_watchdog_free(wd);
    worker_metrics_stop(metrics);
    reg_stop(tick.reg);
    if (tick.ev) event_free(tick.ev);
    if (sig_term) event_free(sig_term);
    if (sig_int) event_free(sig_int);
    worker_destroy(w);
    cluster_key_free(key);
    event_base_free(base);
    ST_INFO("worker: stopped");
    return rc;
}
