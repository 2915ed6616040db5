/* main.c — strata-worker: command line, signals and the event loop of the
 * per-node daemon (daemon/worker.h does the work; docs/worker.md).
 *
 *   strata-worker --listen HOST:PORT [--name NAME] [--threads N] [--log-level L]
 *                 [--coordinator HOST:PORT --model FILE... | --model-dir DIR] [--memory BYTES]
 *
 * With --coordinator the worker registers with the coordinator's gRPC control
 * service and heartbeats (daemon/registration.h); without it, it waits for a
 * coordinator that knows its address (static cluster config).
 * Runs in the foreground. Prints "strata-worker: listening on HOST:PORT" on
 * stdout once the data plane is up (PORT is the bound one when 0 was asked).
 * SIGTERM / SIGINT stop the loop, the compute thread and the stage; exit 0.
 * A bad flag or a listen failure: one line on stderr, exit 2 / 1.
 */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/registration.h"
#include "daemon/worker.h"
#ifdef STRATA_HAVE_SYSTEMD /* sd_notify: READY=1 / STOPPING=1 for Type=notify (systemd/strata-worker.service) */
#include <systemd/sd-daemon.h>
#else
#define sd_notify(unset_environment, state) ((void)0)
#endif

#define MAX_MODELS 64
#define LOAD_PERIOD_MS 500

static void usage(FILE *f)
{
    fprintf(f,
            "usage: strata-worker --listen HOST:PORT [--name NAME] [--threads N] [--log-level L]\n"
            "  --listen HOST:PORT  data-plane address (UCX listener); port 0 = any free port\n"
            "  --name NAME         name in logs and in StageReady (default HOST:PORT)\n"
            "  --threads N         CPU threads for a stage (default 0 = all cores)\n"
            "  --log-level L       error, warn, info (default) or debug\n"
            "  --coordinator H:P   register with the coordinator's gRPC control service (live mode)\n"
            "  --model FILE        a model file this node has (repeatable; live mode)\n"
            "  --model-dir DIR     every *.gguf file in DIR (live mode)\n"
            "  --memory BYTES      memory to advertise for placement (suffix K, M, G; default MemTotal)\n");
}

static int bad(const char *fmt, const char *arg)
{
    fprintf(stderr, "strata-worker: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see --help)\n");
    return 2;
}

struct load_tick {
    worker *w;
    reg_client *reg;
    struct event *ev;
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
    reg_set_load(t->reg, &rl);
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

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    ST_INFO("worker: signal %d, shutting down", (int)sig);
    sd_notify(0, "STOPPING=1");
    event_base_loopbreak(arg);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"listen", required_argument, 0, 'l'},
                                         {"name", required_argument, 0, 'n'},
                                         {"threads", required_argument, 0, 't'},
                                         {"log-level", required_argument, 0, 'v'},
                                         {"coordinator", required_argument, 0, 'C'},
                                         {"model", required_argument, 0, 'm'},
                                         {"model-dir", required_argument, 0, 'D'},
                                         {"memory", required_argument, 0, 'M'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *listen = NULL, *name = NULL, *coordinator = NULL;
    int threads = 0;
    char *models[MAX_MODELS];
    int n_models = 0;
    uint64_t memory = 0;
    int rc = 2;
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, "", opts, NULL);
        if (c == -1) break;
        char *end;
        switch (c) {
        case 'l': listen = optarg; break;
        case 'n': name = optarg; break;
        case 't': {
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 0 || v > 4096) {
                rc = bad("--threads '%s' is not an integer in [0, 4096]", optarg);
                goto out_models;
            }
            threads = (int)v;
            break;
        }
        case 'v':
            if (!strcmp(optarg, "error")) st_log_set_level(ST_LOG_ERROR);
            else if (!strcmp(optarg, "warn")) st_log_set_level(ST_LOG_WARN);
            else if (!strcmp(optarg, "info")) st_log_set_level(ST_LOG_INFO);
            else if (!strcmp(optarg, "debug")) st_log_set_level(ST_LOG_DEBUG);
            else {
                rc = bad("--log-level '%s' is not error, warn, info or debug", optarg);
                goto out_models;
            }
            break;
        case 'C': coordinator = optarg; break;
        case 'm':
            if (n_models == MAX_MODELS) goto too_many;
            if (access(optarg, R_OK) != 0) {
                rc = bad("--model: cannot read '%s'", optarg);
                goto out_models;
            }
            models[n_models++] = strdup(optarg);
            break;
        case 'D': {
            DIR *d = opendir(optarg);
            if (!d) {
                rc = bad("--model-dir: cannot open '%s'", optarg);
                goto out_models;
            }
            struct dirent *e;
            while ((e = readdir(d))) {
                size_t l = strlen(e->d_name);
                if (l < 6 || strcmp(e->d_name + l - 5, ".gguf")) continue;
                if (n_models == MAX_MODELS) {
                    closedir(d);
                    goto too_many;
                }
                char *p = malloc(strlen(optarg) + l + 2);
                if (p) sprintf(p, "%s/%s", optarg, e->d_name);
                if (p) models[n_models++] = p;
            }
            closedir(d);
            break;
        }
        case 'M':
            if (parse_bytes(optarg, &memory)) {
                rc = bad("--memory '%s' is not a byte count (e.g. 8G)", optarg);
                goto out_models;
            }
            break;
        case 'h': usage(stdout); rc = 0; goto out_models;
        default:
            rc = bad("unknown or incomplete option '%s'", argv[optind - 1]);
            goto out_models;
        }
    }
    if (optind < argc) {
        rc = bad("unexpected argument '%s'", argv[optind]);
        goto out_models;
    }
    if (!listen) {
        rc = bad("%s", "--listen HOST:PORT is required");
        goto out_models;
    }
    if ((n_models || memory) && !coordinator) {
        rc = bad("%s", "--model, --model-dir and --memory need --coordinator");
        goto out_models;
    }
    if (coordinator && !name) {
        rc = bad("%s", "--coordinator needs --name (the node name it registers)");
        goto out_models;
    }
    char host[256];
    int port;
    st_err err;
    if (worker_parse_hostport(listen, host, sizeof host, &port, 1, &err)) {
        rc = bad("--listen: %s", err.msg);
        goto out_models;
    }
    rc = 1;
    if (name) st_log_set_tag(name);
    st_log_set_node(name ? name : listen); /* STRATA_NODE (docs/logging.md) */

    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    if (!base) {
        fprintf(stderr, "strata-worker: error: cannot create the event loop\n");
        goto out_models;
    }
    worker_opts wo = {.listen_host = host, .listen_port = port, .name = name, .n_threads = threads,
                      .models = (const char *const *)models, .n_models = n_models};
    worker *w = worker_create(base, &wo, &err);
    if (!w) {
        fprintf(stderr, "strata-worker: error: %s\n", err.msg);
        event_base_free(base);
        goto out_models;
    }
    struct event *sig_term = evsignal_new(base, SIGTERM, on_signal, base);
    struct event *sig_int = evsignal_new(base, SIGINT, on_signal, base);
    struct load_tick tick = {w, NULL, NULL};
    if (!sig_term || !sig_int || event_add(sig_term, NULL) || event_add(sig_int, NULL)) {
        fprintf(stderr, "strata-worker: error: cannot install signal handlers\n");
        goto out_loop;
    }
    ST_INFO("worker: listening on %s:%d", host, worker_port(w));
    if (coordinator) {
        char data_addr[300], hn[256];
        const char *adv = host;
        if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::")) {
            if (gethostname(hn, sizeof hn) == 0) adv = hn;
        }
        snprintf(data_addr, sizeof data_addr, strchr(adv, ':') ? "[%s]:%d" : "%s:%d", adv, worker_port(w));
        reg_opts ro = {.coordinator = coordinator, .node = name, .data_address = data_addr,
                       .models = (const char *const *)models, .n_models = n_models, .memory_bytes = memory};
        tick.reg = reg_start(&ro, &err);
        tick.ev = tick.reg ? event_new(base, -1, EV_PERSIST, on_load_tick, &tick) : NULL;
        struct timeval tv = {0, LOAD_PERIOD_MS * 1000};
        if (!tick.reg || !tick.ev || event_add(tick.ev, &tv)) {
            fprintf(stderr, "strata-worker: error: %s\n", tick.reg ? "cannot create the load timer" : err.msg);
            goto out_loop;
        }
    }
    printf("strata-worker: listening on %s:%d\n", host, worker_port(w));
    fflush(stdout);
    sd_notify(0, "READY=1");

    rc = event_base_dispatch(base) < 0 ? 1 : 0;
out_loop:
    reg_stop(tick.reg);
    if (tick.ev) event_free(tick.ev);
    if (sig_term) event_free(sig_term);
    if (sig_int) event_free(sig_int);
    worker_destroy(w);
    event_base_free(base);
    ST_INFO("worker: stopped");
out_models:
    for (int i = 0; i < n_models; i++) free(models[i]);
    return rc;
too_many:
    rc = bad("more than %s model files", "64");
    goto out_models;
}
