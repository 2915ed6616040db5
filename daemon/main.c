/* main.c — strata-worker: command line, signals and the event loop of the
 * per-node daemon (daemon/worker.h does the work; docs/worker.md).
 *
 *   strata-worker --listen HOST:PORT [--name NAME] [--threads N] [--log-level L]
 *
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

#include "common/log.h"
#include "daemon/worker.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: strata-worker --listen HOST:PORT [--name NAME] [--threads N] [--log-level L]\n"
            "  --listen HOST:PORT  data-plane address (UCX listener); port 0 = any free port\n"
            "  --name NAME         name in logs and in StageReady (default HOST:PORT)\n"
            "  --threads N         CPU threads for a stage (default 0 = all cores)\n"
            "  --log-level L       error, warn, info (default) or debug\n");
}

static int bad(const char *fmt, const char *arg)
{
    fprintf(stderr, "strata-worker: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see --help)\n");
    return 2;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    ST_INFO("worker: signal %d, shutting down", (int)sig);
    event_base_loopbreak(arg);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"listen", required_argument, 0, 'l'},
                                         {"name", required_argument, 0, 'n'},
                                         {"threads", required_argument, 0, 't'},
                                         {"log-level", required_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *listen = NULL, *name = NULL;
    int threads = 0;
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
            if (!*optarg || *end || v < 0 || v > 4096) return bad("--threads '%s' is not an integer in [0, 4096]", optarg);
            threads = (int)v;
            break;
        }
        case 'v':
            if (!strcmp(optarg, "error")) st_log_set_level(ST_LOG_ERROR);
            else if (!strcmp(optarg, "warn")) st_log_set_level(ST_LOG_WARN);
            else if (!strcmp(optarg, "info")) st_log_set_level(ST_LOG_INFO);
            else if (!strcmp(optarg, "debug")) st_log_set_level(ST_LOG_DEBUG);
            else return bad("--log-level '%s' is not error, warn, info or debug", optarg);
            break;
        case 'h': usage(stdout); return 0;
        default:
            return bad("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return bad("unexpected argument '%s'", argv[optind]);
    if (!listen) return bad("%s", "--listen HOST:PORT is required");
    char host[256];
    int port;
    st_err err;
    if (worker_parse_hostport(listen, host, sizeof host, &port, 1, &err)) return bad("--listen: %s", err.msg);
    if (name) st_log_set_tag(name);

    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    if (!base) {
        fprintf(stderr, "strata-worker: error: cannot create the event loop\n");
        return 1;
    }
    worker_opts wo = {.listen_host = host, .listen_port = port, .name = name, .n_threads = threads};
    worker *w = worker_create(base, &wo, &err);
    if (!w) {
        fprintf(stderr, "strata-worker: error: %s\n", err.msg);
        event_base_free(base);
        return 1;
    }
    struct event *sig_term = evsignal_new(base, SIGTERM, on_signal, base);
    struct event *sig_int = evsignal_new(base, SIGINT, on_signal, base);
    if (!sig_term || !sig_int || event_add(sig_term, NULL) || event_add(sig_int, NULL)) {
        fprintf(stderr, "strata-worker: error: cannot install signal handlers\n");
        if (sig_term) event_free(sig_term);
        if (sig_int) event_free(sig_int);
        worker_destroy(w);
        event_base_free(base);
        return 1;
    }
    ST_INFO("worker: listening on %s:%d", host, worker_port(w));
    printf("strata-worker: listening on %s:%d\n", host, worker_port(w));
    fflush(stdout);

    int rc = event_base_dispatch(base) < 0 ? 1 : 0;

    event_free(sig_term);
    event_free(sig_int);
    worker_destroy(w);
    event_base_free(base);
    ST_INFO("worker: stopped");
    return rc;
}
