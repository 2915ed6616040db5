/* worker_metrics.c — the worker's GET /metrics: its families, the scrape-time
 * collector over the worker's state and the evhttp listener (see
 * worker_metrics.h). */
#include "daemon/worker_metrics.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/metrics.h"
#include "common/process_metrics.h"

/* A cumulative counter of the worker exported as a Prometheus counter: adds
 * what grew since the last scrape. */
typedef struct mirrored {
    metrics_series *s;
    double last;
} mirrored;

enum {
    C_BYTES_SENT, C_BYTES_RECV, C_FRAMES_SENT, C_FRAMES_RECV, C_BAD, C_DROPPED, C_FENCED,
    C_BATCH_ERRORS, C_FORWARDS, C_TOKENS, C_BUSY, C_POLL_SPINS, C_POLL_HITS, C_POLL_SECONDS, N_COUNTERS
};

struct worker_metrics {
    worker *w;
    metrics_registry *reg;
    metrics_family *fwd, *hop, *info, *ready;
    metrics_series *kv_used, *kv_total, *kv_perc, *running;
    mirrored c[N_COUNTERS];
    struct evhttp *http;
    int port;
    bool observing; /* attached to w (worker_observe) */
};

static metrics_series *by_stage(metrics_family *f, int stage) {
    char idx[16];
    snprintf(idx, sizeof idx, "%d", stage);
    const char *v[] = {idx};
    return metrics_with(f, v, NULL);
}

/* The worker's observations (worker_observe): seconds of one forward / one hop of stage. */
static void on_forward(void *ud, int stage, double seconds) {
    worker_metrics *m = ud;
    metrics_histogram_observe(by_stage(m->fwd, stage), seconds);
}

static void on_hop(void *ud, int stage, double seconds) {
    worker_metrics *m = ud;
    metrics_histogram_observe(by_stage(m->hop, stage), seconds);
}

static void mirror(mirrored *c, double v) {
    if (v > c->last) {
        metrics_counter_add(c->s, v - c->last);
        c->last = v;
    }
}

static void collect(metrics_registry *r, void *ud) {
    (void)r;
    worker_metrics *m = ud;
    worker_figures f;
    worker_figures_get(m->w, &f);
    const xport_stats *xs = &f.xport;
    mirror(&m->c[C_BYTES_SENT], (double)xs->bytes_sent);
    mirror(&m->c[C_BYTES_RECV], (double)xs->bytes_recv);
    mirror(&m->c[C_FRAMES_SENT], (double)xs->frames_sent);
    mirror(&m->c[C_FRAMES_RECV], (double)xs->frames_recv);
    mirror(&m->c[C_BAD], (double)xs->bad_frames);
    mirror(&m->c[C_POLL_SPINS], (double)xs->poll_spins);
    mirror(&m->c[C_POLL_HITS], (double)xs->poll_hits);
    mirror(&m->c[C_POLL_SECONDS], (double)xs->poll_spin_ns * 1e-9);
    mirror(&m->c[C_DROPPED], (double)f.dropped_frames);
    mirror(&m->c[C_FENCED], (double)f.fenced_frames);
    mirror(&m->c[C_BATCH_ERRORS], (double)f.batch_errors);
    metrics_family_reset(m->info);
    metrics_family_reset(m->ready);
    for (int i = 0; i < f.n_stages; i++) {
        const worker_stage_figures *st = &f.stages[i];
        char idx[16], ep[24], fl[16], ll[16];
        snprintf(idx, sizeof idx, "%u", st->stage);
        snprintf(ep, sizeof ep, "%llu", (unsigned long long)st->epoch);
        snprintf(fl, sizeof fl, "%d", st->first_layer);
        snprintf(ll, sizeof ll, "%d", st->last_layer);
        const char *iv[] = {idx, ep, fl, ll};
        metrics_gauge_set(metrics_with(m->info, iv, NULL), 1);
        const char *rv[] = {idx};
        metrics_gauge_set(metrics_with(m->ready, rv, NULL), st->ready ? 1 : 0);
    }
    /* Forwards, tokens and busy time: every live stage's compute thread. A
     * released stage's thread is gone: its counts stop growing, and a new
     * stage's start from 0, so export the growth only (never down; what
     * released stages ran stays in the mirror's last value). */
    mirror(&m->c[C_FORWARDS], m->c[C_FORWARDS].last > f.forwards ? m->c[C_FORWARDS].last : f.forwards);
    mirror(&m->c[C_TOKENS], m->c[C_TOKENS].last > f.tokens ? m->c[C_TOKENS].last : f.tokens);
    mirror(&m->c[C_BUSY], m->c[C_BUSY].last > f.busy_seconds ? m->c[C_BUSY].last : f.busy_seconds);
    worker_load wl;
    worker_load_recent(m->w, &wl);
    metrics_gauge_set(m->kv_used, wl.kv_blocks_used);
    metrics_gauge_set(m->kv_total, wl.kv_blocks);
    metrics_gauge_set(m->kv_perc, wl.kv_blocks > 0 ? (double)wl.kv_blocks_used / wl.kv_blocks : 0);
    metrics_gauge_set(m->running, wl.running_sequences);
}

static int families(worker_metrics *m, st_err *err) {
    /* Forward times span a decode step of a small stage (100 us) to a long
     * prefill chunk (seconds); a hop is a local hand-off to a network send. */
    static const double fwd_b[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                   0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    static const double hop_b[] = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                   0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
    if (!(m->fwd = metrics_histogram(m->reg, "strata_worker_forward_seconds",
                                     "Time of each forward (micro-batch) of the stage.", "stage",
                                     fwd_b, sizeof fwd_b / sizeof *fwd_b, err)) ||
        !(m->hop = metrics_histogram(m->reg, "strata_worker_hop_seconds",
                                     "Time to hand each stage output to the next hop: from the send "
                                     "to the transport's completion.",
                                     "stage", hop_b, sizeof hop_b / sizeof *hop_b, err)) ||
        !(m->info = metrics_gauge(m->reg, "strata_worker_stage_info",
                                  "1 per stage this worker holds (loading or ready), by its placement.",
                                  "stage,epoch,first_layer,last_layer", err)) ||
        !(m->ready = metrics_gauge(m->reg, "strata_worker_stage_ready",
                                   "1 when the stage is loaded and serving, 0 while it loads or failed.",
                                   "stage", err)))
        return -1;
    metrics_family *f;
#define ONE(expr, dst)                                                          \
    do {                                                                        \
        if (!(f = (expr)) || !((dst) = metrics_with(f, NULL, err))) return -1;  \
    } while (0)
    ONE(metrics_gauge(m->reg, "strata_worker_kv_blocks_used",
                      "KV blocks in the block tables of the sequences of the latest window (<= 1 s).",
                      NULL, err),
        m->kv_used);
    ONE(metrics_gauge(m->reg, "strata_worker_kv_blocks", "KV blocks of the newest ready stage.", NULL, err),
        m->kv_total);
    ONE(metrics_gauge(m->reg, "strata_worker_kv_cache_usage_perc",
                      "Fraction (0..1) of the KV blocks in use (strata_worker_kv_blocks_used / "
                      "strata_worker_kv_blocks).",
                      NULL, err),
        m->kv_perc);
    ONE(metrics_gauge(m->reg, "strata_worker_running_sequences",
                      "Sequences the stage ran in the latest window (<= 1 s).", NULL, err),
        m->running);
    static const struct {
        const char *name, *help;
    } counters[N_COUNTERS] = {
        {"strata_worker_bytes_sent_total", "Data-plane payload bytes sent (activations)."},
        {"strata_worker_bytes_received_total", "Data-plane payload bytes received (activations)."},
        {"strata_worker_frames_sent_total", "Data-plane frames sent."},
        {"strata_worker_frames_received_total", "Data-plane frames received."},
        {"strata_worker_bad_frames_total", "Malformed frames the transport dropped."},
        {"strata_worker_dropped_frames_total",
         "Frames the worker dropped (wrong epoch, stage, shape...; the peer is disconnected)."},
        {"strata_worker_fenced_frames_total",
         "Of the dropped frames: activations of an epoch older than the newest stage held."},
        {"strata_worker_batch_errors_total", "Micro-batches that failed (BatchError sent)."},
        {"strata_worker_forwards_total", "Forwards (micro-batches) run."},
        {"strata_worker_tokens_total", "Tokens run through the stage."},
        {"strata_worker_busy_seconds_total", "Wall time spent inside the stage's forwards."},
        {"strata_worker_xport_poll_spins_total",
         "Adaptive polling: spins for an expected frame (STRATA_XPORT_POLL_US; docs/protocol.md)."},
        {"strata_worker_xport_poll_hits_total", "Of the spins: those that took their frame without a wake-up."},
        {"strata_worker_xport_poll_cpu_seconds_total", "CPU time the spins took (what the polling costs)."},
    };
    for (int i = 0; i < N_COUNTERS; i++)
        ONE(metrics_counter(m->reg, counters[i].name, counters[i].help, NULL, err), m->c[i].s);
#undef ONE
    return process_metrics_register(m->reg, err);
}

static void on_request(struct evhttp_request *req, void *arg) {
    worker_metrics *m = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    int status = 200;
    const char *reason = "OK";
    if (!path || strcmp(path, "/metrics") != 0) {
        status = 404, reason = "Not Found";
        evhttp_add_header(h, "Content-Type", "text/plain; charset=utf-8");
        evbuffer_add_printf(b, "not found: this is strata-worker's metrics endpoint; GET /metrics\n");
    } else if (evhttp_request_get_command(req) != EVHTTP_REQ_GET &&
               evhttp_request_get_command(req) != EVHTTP_REQ_HEAD) {
        status = 405, reason = "Method Not Allowed";
        evhttp_add_header(h, "Allow", "GET");
        evhttp_add_header(h, "Content-Type", "text/plain; charset=utf-8");
        evbuffer_add_printf(b, "use GET /metrics\n");
    } else {
        size_t n = 0;
        st_err err = {{0}};
        char *text = metrics_render(m->reg, &n, &err);
        if (text) {
            evhttp_add_header(h, "Content-Type", METRICS_CONTENT_TYPE);
            evbuffer_add(b, text, n);
            free(text);
        } else {
            status = 500, reason = "Internal Server Error";
            evbuffer_add_printf(b, "%s\n", err.msg);
        }
    }
    evhttp_send_reply(req, status, reason, b);
    evbuffer_free(b);
}

worker_metrics *worker_metrics_start(struct event_base *base, worker *w, const char *host, int port,
                                     st_err *err) {
    worker_metrics *m = calloc(1, sizeof *m);
    if (!m) return (void)st_errf(err, "metrics: out of memory"), NULL;
    m->w = w;
    if (!(m->reg = metrics_registry_new(err)) || families(m, err) != 0) {
        worker_metrics_stop(m);
        return NULL;
    }
    metrics_registry_set_collector(m->reg, collect, m);
    m->http = evhttp_new(base);
    if (!m->http) {
        worker_metrics_stop(m);
        return (void)st_errf(err, "metrics: out of memory"), NULL;
    }
    evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE);
    evhttp_set_max_body_size(m->http, 4096);
    evhttp_set_max_headers_size(m->http, 16384);
    evhttp_set_timeout(m->http, 30);
    evhttp_set_gencb(m->http, on_request, m);
    struct evhttp_bound_socket *sock = evhttp_bind_socket_with_handle(m->http, host, (ev_uint16_t)port);
    if (!sock) {
        worker_metrics_stop(m);
        return (void)st_errf(err, "metrics: cannot listen on %s:%d (in use, or a bad address)", host, port),
               NULL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    m->port = port;
    if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &sl) == 0)
        m->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    worker_observe(w, on_forward, on_hop, m);
    m->observing = true;
    return m;
}

int worker_metrics_port(const worker_metrics *m) { return m->port; }

void worker_metrics_stop(worker_metrics *m) {
    if (!m) return;
    if (m->observing) worker_observe(m->w, NULL, NULL, NULL);
    if (m->http) evhttp_free(m->http);
    metrics_registry_free(m->reg);
    free(m);
}
