/* metrics_coord.c — the coordinator's metric families and the scrape-time
 * collector over the engine's stats. See metrics_coord.h. */
#include "coordinator/api/metrics_coord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "coordinator/api/metrics_kv.h"
#include "common/process_metrics.h"

struct coord_metrics {
    metrics_registry *reg;
    coord_engine *engine;
    metrics_family *requests, *ops_requests;
    char *model_name;
    metrics_family *conn_closed;                /* {reason} */
    metrics_series *conn_open, *accept_errors;
    metrics_series *ttft, *tpot, *prompt, *generated;
    metrics_series *queue, *running, *kv_used, *kv_free, *epoch;
    /* per request, at its end (coord_metrics_request_done) */
    metrics_series *e2e, *queue_time, *prefill, *decode, *inference, *req_tpot;
    metrics_series *req_prompt, *req_gen, *req_max_tokens;
    metrics_family *success;
    /* per stage, from the workers' StageStats */
    metrics_family *fwd, *hop_s, *hops, *load;
    uint64_t fwd_seen[COORD_STATS_MAX_STAGES][COORD_FWD_N_BOUNDS + 1];
    double fwd_sum_seen[COORD_STATS_MAX_STAGES];
    uint64_t fwd_epoch[COORD_STATS_MAX_STAGES];
    double last_hop_s[COORD_STATS_MAX_STAGES], last_hops[COORD_STATS_MAX_STAGES];
    char hop_worker[COORD_STATS_MAX_STAGES][COORD_NAME_LEN];
    metrics_series *recoveries, *resumed, *recomputed; /* live mode's recovery counters */
    metrics_series *fenced;
    metrics_series *etcd_refused, *etcd_dropped, *etcd_queued, *etcd_unwritten; /* the leader's etcd writes */
    uint64_t last_etcd_refused, last_etcd_dropped;
    metrics_kv kv; /* the KV scheduling metrics (metrics_kv.h) */
    uint64_t last_recoveries, last_resumed, last_recomputed, last_fenced;
    metrics_series *detect, *resume; /* recovery timings (histograms) */
    uint64_t last_detect, last_resume;
    metrics_family *busy, *bytes, *frames, *wstate, *wage;
    /* Counters from the workers: Prometheus counters only go up, so the
     * exported value follows the largest seen (a restarted worker resets). */
    double last_bytes[COORD_STATS_MAX_STAGES], last_frames[COORD_STATS_MAX_STAGES];
};

static const char *const static_worker_states[] = {"joining", "ready", "serving", "lost", NULL};

/* Observes the entries of ring (engine_api.h: entry k at [k % KEEP]) that
 * came after *seen, at most the KEEP newest; *seen = n. */
static void observe_new(metrics_series *h, const double *ring, uint64_t n, uint64_t *seen) {
    uint64_t k = *seen;
    if (n > k + COORD_RECOVERY_KEEP) k = n - COORD_RECOVERY_KEEP;
    for (; k < n; k++) metrics_histogram_observe(h, ring[k % COORD_RECOVERY_KEEP]);
    if (n > *seen) *seen = n;
}

/* Differences of a running total that restarts at 0 (a restarted worker):
 * what grew since *last (all of v after a restart), and *last = v. */
static double grown(double v, double *last) {
    double d = v >= *last ? v - *last : v;
    *last = v;
    return d;
}

/* Stage i's forward histogram (cumulative per placement epoch in the
 * engine: a new epoch starts from 0), hops and load time. */
static void collect_stage(coord_metrics *m, int i, const char *const *v, const coord_stage_stats *s,
                          uint64_t epoch) {
    uint64_t *seen = m->fwd_seen[i];
    bool restart = epoch != m->fwd_epoch[i];
    for (int b = 0; b <= COORD_FWD_N_BOUNDS && !restart; b++) restart = s->fwd_buckets[b] < seen[b];
    if (restart) {
        memset(seen, 0, sizeof m->fwd_seen[i]);
        m->fwd_sum_seen[i] = 0;
        m->fwd_epoch[i] = epoch;
    }
    uint64_t d[COORD_FWD_N_BOUNDS + 1];
    for (int b = 0; b <= COORD_FWD_N_BOUNDS; b++) {
        d[b] = s->fwd_buckets[b] - seen[b];
        seen[b] = s->fwd_buckets[b];
    }
    double dsum = s->fwd_sum_s - m->fwd_sum_seen[i];
    m->fwd_sum_seen[i] = s->fwd_sum_s;
    metrics_histogram_merge(metrics_with(m->fwd, v, NULL), d, COORD_FWD_N_BOUNDS + 1, dsum > 0 ? dsum : 0);
    /* The hop counters are the worker's, over its life: when another worker
     * takes the stage (a new placement), its earlier hops (of another stage,
     * perhaps) do not count here; only what it adds from now. */
    if (strcmp(m->hop_worker[i], s->worker) != 0) {
        if (m->hop_worker[i][0]) {
            m->last_hops[i] = (double)s->hops;
            m->last_hop_s[i] = s->hop_sum_s;
        }
        snprintf(m->hop_worker[i], sizeof m->hop_worker[i], "%s", s->worker);
    }
    metrics_counter_add(metrics_with(m->hops, v, NULL), grown((double)s->hops, &m->last_hops[i]));
    metrics_counter_add(metrics_with(m->hop_s, v, NULL), grown(s->hop_sum_s, &m->last_hop_s[i]));
    metrics_gauge_set(metrics_with(m->load, v, NULL), s->load_seconds);
}

/* Adds to counter c what the engine's running total v gained since *last. */
static void follow(metrics_series *c, uint64_t v, uint64_t *last) {
    if (v <= *last) return;
    metrics_counter_add(c, (double)(v - *last));
    *last = v;
}

static void collect(metrics_registry *r, void *ud) {
    (void)r;
    coord_metrics *m = ud;
    if (!m->engine || !m->engine->ops->stats) return;
    coord_engine_stats *st = calloc(1, sizeof *st);
    if (!st) return;
    m->engine->ops->stats(m->engine->impl, st);
    metrics_gauge_set(m->queue, st->queue_depth);
    metrics_gauge_set(m->running, st->running);
    metrics_gauge_set(m->kv_used, st->kv_blocks_used);
    metrics_gauge_set(m->kv_free, st->kv_blocks_free);
    metrics_kv_collect(&m->kv, st);
    metrics_gauge_set(m->epoch, (double)st->epoch);
    follow(m->recoveries, st->recoveries, &m->last_recoveries);
    follow(m->resumed, st->sequences_resumed, &m->last_resumed);
    follow(m->recomputed, st->tokens_recomputed, &m->last_recomputed);
    follow(m->fenced, st->fenced_frames, &m->last_fenced);
    follow(m->etcd_refused, st->etcd_txns_refused, &m->last_etcd_refused);
    follow(m->etcd_dropped, st->etcd_changes_dropped, &m->last_etcd_dropped);
    metrics_gauge_set(m->etcd_queued, (double)st->etcd_queued);
    metrics_gauge_set(m->etcd_unwritten, st->etcd_unwritten_s);
    observe_new(m->detect, st->detection_s, st->n_detections, &m->last_detect);
    observe_new(m->resume, st->resume_s, st->n_resumes, &m->last_resume);
    for (int i = 0; i < st->n_stages && i < COORD_STATS_MAX_STAGES; i++) {
        char idx[16];
        snprintf(idx, sizeof idx, "%d", i);
        const char *v[] = {idx};
        const coord_stage_stats *s = &st->stages[i];
        metrics_gauge_set(metrics_with(m->busy, v, NULL), s->busy_ratio);
        double b = (double)s->bytes_sent, f = (double)s->frames_sent;
        if (b > m->last_bytes[i]) {
            metrics_counter_add(metrics_with(m->bytes, v, NULL), b - m->last_bytes[i]);
            m->last_bytes[i] = b;
        } else {
            metrics_counter_add(metrics_with(m->bytes, v, NULL), 0);
        }
        if (f > m->last_frames[i]) {
            metrics_counter_add(metrics_with(m->frames, v, NULL), f - m->last_frames[i]);
            m->last_frames[i] = f;
        } else {
            metrics_counter_add(metrics_with(m->frames, v, NULL), 0);
        }
        collect_stage(m, i, v, s, st->epoch);
    }
    /* Workers come and go: re-set the series of those that exist now. */
    metrics_family_reset(m->wstate);
    metrics_family_reset(m->wage);
    for (int i = 0; i < st->n_workers; i++) {
        const coord_worker_stats *w = &st->workers[i];
        const char *const *set = st->worker_states ? st->worker_states : static_worker_states;
        for (size_t k = 0; set[k]; k++) {
            const char *v[] = {w->name, set[k]};
            metrics_gauge_set(metrics_with(m->wstate, v, NULL),
                              w->state && strcmp(w->state, set[k]) == 0 ? 1 : 0);
        }
        if (w->heartbeat_age_s >= 0) {
            const char *v[] = {w->name};
            metrics_gauge_set(metrics_with(m->wage, v, NULL), w->heartbeat_age_s);
        }
    }
    coord_engine_stats_release(st);
    free(st);
}

coord_metrics *coord_metrics_new(coord_engine *engine, const char *model_name, st_err *err) {
    coord_metrics *m = calloc(1, sizeof *m);
    if (!m) return (void)st_errf(err, "metrics: out of memory"), NULL;
    m->engine = engine;
    m->model_name = strdup(model_name ? model_name : "strata");
    if (!m->model_name) {
        free(m);
        return (void)st_errf(err, "metrics: out of memory"), NULL;
    }
    if (!(m->reg = metrics_registry_new(err))) goto fail;
    /* vLLM's TTFT buckets (vllm/v1/metrics/loggers.py), from 1 ms. */
    static const double ttft_b[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                    1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560};
    static const double tpot_b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                    0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80};
    /* Request phases: vLLM's, with finer steps below 0.3 s for small models. */
    static const double req_b[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10,
                                   15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680};
    /* Token counts: vLLM's 1-2-5 series. */
    static const double tok_b[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000,
                                   20000, 50000, 100000, 200000, 500000, 1000000};
    metrics_family *f;
    if (!(m->requests = metrics_counter(m->reg, "strata_requests_total",
                                        "HTTP API requests answered, by route and status code "
                                        "(probes and scrapes are not counted here).",
                                        "route,status", err)) ||
        !(m->ops_requests = metrics_counter(m->reg, "strata_ops_requests_total",
                                            "Requests to the operator routes (probes, /metrics, "
                                            "/version), by route and status code.",
                                            "route,status", err)))
        goto fail;
    if (!(m->conn_closed = metrics_counter(m->reg, "strata_http_connections_closed_total",
                                           "HTTP connections the server closed: over --max-connections "
                                           "(cap), or past a read deadline (header_timeout, body_timeout, "
                                           "idle_timeout).",
                                           "reason", err)))
        goto fail;
    for (int i = 0; i < 4; i++) { /* every reason shows, at 0 until it happens */
        const char *v[] = {(const char *[]){"cap", "header_timeout", "body_timeout", "idle_timeout"}[i]};
        if (!metrics_with(m->conn_closed, v, err)) goto fail;
    }
#define ONE(expr, dst)                                                                   \
    do {                                                                                 \
        if (!(f = (expr)) || !((dst) = metrics_with(f, NULL, err))) goto fail;           \
    } while (0)
    const char *mv[] = {m->model_name};
#define MODEL(expr, dst)                                                                 \
    do {                                                                                 \
        if (!(f = (expr)) || !((dst) = metrics_with(f, mv, err))) goto fail;             \
    } while (0)
#define HIST(name, help, b) metrics_histogram(m->reg, name, help, "model_name", b, sizeof b / sizeof *b, err)
    MODEL(HIST("strata_time_to_first_token_seconds",
               "Time from request arrival to its first generated token.", ttft_b),
          m->ttft);
    MODEL(HIST("strata_time_per_output_token_seconds",
               "Time between consecutive generated tokens of a request (inter-token latency).", tpot_b),
          m->tpot);
    MODEL(HIST("strata_e2e_request_latency_seconds",
               "Time from request arrival to its last byte, for requests that finished (stop or length).",
               req_b),
          m->e2e);
    MODEL(HIST("strata_request_queue_time_seconds",
               "Time from request arrival to its first micro-batch sent to the stages.", req_b),
          m->queue_time);
    MODEL(HIST("strata_request_prefill_time_seconds",
               "Time from the request's first micro-batch to its first token.", req_b),
          m->prefill);
    MODEL(HIST("strata_request_decode_time_seconds",
               "Time from the request's first token to its last.", req_b),
          m->decode);
    MODEL(HIST("strata_request_inference_time_seconds",
               "Time from the request's first micro-batch to its last token (prefill + decode).", req_b),
          m->inference);
    MODEL(HIST("strata_request_time_per_output_token_seconds",
               "Per request: its decode time over its generated tokens after the first.", tpot_b),
          m->req_tpot);
    MODEL(HIST("strata_request_prompt_tokens", "Prompt tokens of each finished request (usage).", tok_b),
          m->req_prompt);
    MODEL(HIST("strata_request_generation_tokens", "Generated tokens of each finished request (usage).",
               tok_b),
          m->req_gen);
    MODEL(HIST("strata_request_params_max_tokens", "The max_tokens of each finished request.", tok_b),
          m->req_max_tokens);
#undef HIST
    if (!(m->success = metrics_counter(m->reg, "strata_request_success_total",
                                       "Requests that finished, by why: stop (EOS, a stop string or "
                                       "token), length (max_tokens or the context), abort (the client "
                                       "left).",
                                       "model_name,finished_reason", err)))
        goto fail;
    MODEL(metrics_counter(m->reg, "strata_prompt_tokens_total", "Prompt tokens prefilled.", "model_name",
                          err),
          m->prompt);
    MODEL(metrics_counter(m->reg, "strata_generation_tokens_total", "Tokens generated.", "model_name", err),
          m->generated);
    MODEL(metrics_gauge(m->reg, "strata_num_requests_waiting", "Requests waiting for a scheduler slot.",
                        "model_name", err),
          m->queue);
    MODEL(metrics_gauge(m->reg, "strata_num_requests_running", "Requests being prefilled or decoded.",
                        "model_name", err),
          m->running);
#undef MODEL
    ONE(metrics_gauge(m->reg, "strata_http_connections_open", "HTTP connections open.", NULL, err),
        m->conn_open);
    ONE(metrics_counter(m->reg, "strata_http_accept_errors_total",
                        "Failed accept() calls of the HTTP listener (EMFILE, ENFILE, ...); each pauses "
                        "accepting for 0.1-1 s.",
                        NULL, err),
        m->accept_errors);
    ONE(metrics_gauge(m->reg, "strata_kv_blocks_used", "KV cache blocks held by sequences.", NULL,
                      err),
        m->kv_used);
    ONE(metrics_gauge(m->reg, "strata_kv_blocks_free", "KV cache blocks free.", NULL, err),
        m->kv_free);
    ONE(metrics_gauge(m->reg, "strata_placement_epoch",
                      "Epoch of the serving placement (0: none serves; static mode: 1).", NULL, err),
        m->epoch);
    ONE(metrics_counter(m->reg, "strata_recoveries_total",
                        "Stage losses the coordinator recovered from (or is recovering from).",
                        NULL, err),
        m->recoveries);
    ONE(metrics_counter(m->reg, "strata_sequences_resumed_total",
                        "Requests resumed after a stage loss.", NULL, err),
        m->resumed);
    ONE(metrics_counter(m->reg, "strata_tokens_recomputed_total",
                        "Prompt and generated tokens re-prefilled to resume requests after a stage loss.",
                        NULL, err),
        m->recomputed);
    ONE(metrics_counter(m->reg, "strata_fenced_frames_total",
                        "Data-plane frames the coordinator dropped as fenced (an older epoch, or after "
                        "their epoch lost a stage).",
                        NULL, err),
        m->fenced);
    ONE(metrics_counter(m->reg, "strata_etcd_txns_refused_total",
                        "Transactions etcd refused from this leader (--etcd; not its passing states such as "
                        "'not leader'); each is then written one key per transaction.",
                        NULL, err),
        m->etcd_refused);
    ONE(metrics_counter(m->reg, "strata_etcd_changes_dropped_total",
                        "Changes etcd refused on their own (--etcd): dropped, logged; the leader steps down when "
                        "one stays missing from etcd for longer than the lease TTL.",
                        NULL, err),
        m->etcd_dropped);
    ONE(metrics_gauge(m->reg, "strata_etcd_queued_changes", "Leader changes queued for etcd, not written yet.",
                      NULL, err),
        m->etcd_queued);
    ONE(metrics_gauge(m->reg, "strata_etcd_unwritten_seconds",
                      "Age of the oldest change etcd misses (0: etcd has the leader's state).", NULL, err),
        m->etcd_unwritten);
    static const double rec_b[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 3, 5, 10, 30, 60};
    ONE(metrics_histogram(m->reg, "strata_recovery_detection_seconds",
                          "Time from a lost stage's last sign of life (its latest stats reply) to the "
                          "coordinator declaring it lost (disconnect or micro-batch deadline).",
                          NULL, rec_b, sizeof rec_b / sizeof *rec_b, err),
        m->detect);
    ONE(metrics_histogram(m->reg, "strata_recovery_resume_seconds",
                          "Time from a stage loss to serving again (a new placement, or the stage's "
                          "worker back) with the held requests resumed.",
                          NULL, rec_b, sizeof rec_b / sizeof *rec_b, err),
        m->resume);
#undef ONE
    if (!(m->busy = metrics_gauge(m->reg, "strata_stage_busy_ratio",
                                  "Fraction (0..1) of the last interval the stage computed.",
                                  "stage", err)) ||
        !(m->bytes = metrics_counter(m->reg, "strata_stage_activation_bytes_total",
                                     "Bytes the stage's worker sent on the data plane.", "stage",
                                     err)) ||
        !(m->frames = metrics_counter(m->reg, "strata_stage_frames_sent_total",
                                      "Data-plane frames the stage's worker sent.", "stage",
                                      err)) ||
        !(m->wstate = metrics_gauge(m->reg, "strata_worker_state",
                                    "1 for the worker's current state, 0 for its others.",
                                    "worker,state", err)) ||
        !(m->wage = metrics_gauge(m->reg, "strata_worker_heartbeat_age_seconds",
                                  "Seconds since the worker last reported.", "worker", err)))
        goto fail;
    if (metrics_kv_register(m->reg, &m->kv, err) != 0) goto fail;
    static const double fwd_b[COORD_FWD_N_BOUNDS] = COORD_FWD_BOUNDS;
    if (!(m->fwd = metrics_histogram(m->reg, "strata_stage_forward_seconds",
                                     "Time of each forward (micro-batch) of the stage, from its "
                                     "worker's forward intervals.",
                                     "stage", fwd_b, COORD_FWD_N_BOUNDS, err)) ||
        !(m->hops = metrics_counter(m->reg, "strata_stage_hops_total",
                                    "Outputs the stage's worker handed to its next hop.", "stage", err)) ||
        !(m->hop_s = metrics_counter(m->reg, "strata_stage_hop_seconds_total",
                                     "Summed time of those hand-offs, send to transport completion "
                                     "(divide by strata_stage_hops_total for the mean hop latency).",
                                     "stage", err)) ||
        !(m->load = metrics_gauge(m->reg, "strata_stage_load_seconds",
                                  "How long the stage's current load took (0 while not loaded).",
                                  "stage", err)))
        goto fail;
    if (process_metrics_register(m->reg, err) != 0) goto fail;
    metrics_registry_set_collector(m->reg, collect, m);
    return m;
fail:
    coord_metrics_free(m);
    return NULL;
}

void coord_metrics_free(coord_metrics *m) {
    if (!m) return;
    metrics_registry_free(m->reg);
    free(m->model_name);
    free(m);
}

void coord_metrics_http(coord_metrics *m, const char *route, bool ops, int http_status) {
    if (!m) return;
    char s[16];
    snprintf(s, sizeof s, "%d", http_status);
    const char *v[] = {route ? route : "other", s};
    metrics_counter_add(metrics_with(ops ? m->ops_requests : m->requests, v, NULL), 1);
}

void coord_metrics_http_open(coord_metrics *m, int open) {
    if (m) metrics_gauge_set(m->conn_open, open);
}
void coord_metrics_http_closed(coord_metrics *m, const char *reason) {
    if (!m) return;
    const char *v[] = {reason};
    metrics_counter_add(metrics_with(m->conn_closed, v, NULL), 1);
}
void coord_metrics_http_accept_error(coord_metrics *m) {
    if (m) metrics_counter_add(m->accept_errors, 1);
}
void coord_metrics_ttft(coord_metrics *m, double s) {
    if (m) metrics_histogram_observe(m->ttft, s);
}
void coord_metrics_tpot(coord_metrics *m, double s) {
    if (m) metrics_histogram_observe(m->tpot, s);
}
void coord_metrics_prompt_tokens(coord_metrics *m, int n) {
    if (m) metrics_counter_add(m->prompt, n);
}
void coord_metrics_generated_tokens(coord_metrics *m, int n) {
    if (m) metrics_counter_add(m->generated, n);
}

void coord_metrics_request_done(coord_metrics *m, const coord_request_times *t) {
    if (!m || !t->finished_reason) return;
    const char *v[] = {m->model_name, t->finished_reason};
    metrics_counter_add(metrics_with(m->success, v, NULL), 1);
    if (!strcmp(t->finished_reason, "abort")) return;
    metrics_histogram_observe(m->e2e, t->end - t->arrival);
    if (t->scheduled > 0) metrics_histogram_observe(m->queue_time, t->scheduled - t->arrival);
    if (t->scheduled > 0 && t->first_token > 0) {
        metrics_histogram_observe(m->prefill, t->first_token - t->scheduled);
        metrics_histogram_observe(m->decode, t->last_token - t->first_token);
        metrics_histogram_observe(m->inference, t->last_token - t->scheduled);
    }
    if (t->generation_tokens > 1 && t->first_token > 0)
        metrics_histogram_observe(m->req_tpot,
                                  (t->last_token - t->first_token) / (t->generation_tokens - 1));
    metrics_histogram_observe(m->req_prompt, t->prompt_tokens);
    metrics_histogram_observe(m->req_gen, t->generation_tokens);
    metrics_histogram_observe(m->req_max_tokens, t->max_tokens);
}

char *coord_metrics_render(coord_metrics *m, size_t *len, st_err *err) {
    return metrics_render(m->reg, len, err);
}
