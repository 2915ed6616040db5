/* metrics_coord.c — the coordinator's metric families and the scrape-time
 * collector over the engine's stats. See metrics_coord.h. */
#include "coordinator/api/metrics_coord.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "coordinator/api/metrics_kv.h"

struct coord_metrics {
    metrics_registry *reg;
    coord_engine *engine;
    metrics_family *requests, *ops_requests;
    metrics_series *ttft, *tpot, *prompt, *generated;
    metrics_series *queue, *running, *kv_used, *kv_free;
    metrics_series *recoveries, *resumed, *recomputed; /* live mode's recovery counters */
    metrics_series *fenced;
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
    if (st->recoveries > m->last_recoveries) {
        metrics_counter_add(m->recoveries, (double)(st->recoveries - m->last_recoveries));
        m->last_recoveries = st->recoveries;
    }
    if (st->sequences_resumed > m->last_resumed) {
        metrics_counter_add(m->resumed, (double)(st->sequences_resumed - m->last_resumed));
        m->last_resumed = st->sequences_resumed;
    }
    if (st->tokens_recomputed > m->last_recomputed) {
        metrics_counter_add(m->recomputed, (double)(st->tokens_recomputed - m->last_recomputed));
        m->last_recomputed = st->tokens_recomputed;
    }
    if (st->fenced_frames > m->last_fenced) {
        metrics_counter_add(m->fenced, (double)(st->fenced_frames - m->last_fenced));
        m->last_fenced = st->fenced_frames;
    }
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
    }
    /* Workers come and go: re-set the series of those that exist now. */
    metrics_family_reset(m->wstate);
    metrics_family_reset(m->wage);
    for (int i = 0; i < st->n_workers && i < COORD_STATS_MAX_STAGES; i++) {
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
    free(st);
}

coord_metrics *coord_metrics_new(coord_engine *engine, st_err *err) {
    coord_metrics *m = calloc(1, sizeof *m);
    if (!m) return (void)st_errf(err, "metrics: out of memory"), NULL;
    m->engine = engine;
    if (!(m->reg = metrics_registry_new(err))) goto fail;
    static const double ttft_b[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double tpot_b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
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
#define ONE(expr, dst)                                                                   \
    do {                                                                                 \
        if (!(f = (expr)) || !((dst) = metrics_with(f, NULL, err))) goto fail;           \
    } while (0)
    ONE(metrics_histogram(m->reg, "strata_time_to_first_token_seconds",
                          "Time from request arrival to its first generated token.", NULL, ttft_b,
                          sizeof ttft_b / sizeof *ttft_b, err),
        m->ttft);
    ONE(metrics_histogram(m->reg, "strata_time_per_output_token_seconds",
                          "Time between consecutive generated tokens of a request.", NULL, tpot_b,
                          sizeof tpot_b / sizeof *tpot_b, err),
        m->tpot);
    ONE(metrics_counter(m->reg, "strata_prompt_tokens_total", "Prompt tokens prefilled.", NULL, err),
        m->prompt);
    ONE(metrics_counter(m->reg, "strata_generation_tokens_total", "Tokens generated.", NULL, err),
        m->generated);
    ONE(metrics_gauge(m->reg, "strata_queue_depth", "Requests waiting for a scheduler slot.", NULL,
                      err),
        m->queue);
    ONE(metrics_gauge(m->reg, "strata_requests_running",
                      "Requests being prefilled or decoded.", NULL, err),
        m->running);
    ONE(metrics_gauge(m->reg, "strata_kv_blocks_used", "KV cache blocks held by sequences.", NULL,
                      err),
        m->kv_used);
    ONE(metrics_gauge(m->reg, "strata_kv_blocks_free", "KV cache blocks free.", NULL, err),
        m->kv_free);
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
    metrics_registry_set_collector(m->reg, collect, m);
    return m;
fail:
    coord_metrics_free(m);
    return NULL;
}

void coord_metrics_free(coord_metrics *m) {
    if (!m) return;
    metrics_registry_free(m->reg);
    free(m);
}

void coord_metrics_http(coord_metrics *m, const char *route, bool ops, int http_status) {
    if (!m) return;
    char s[16];
    snprintf(s, sizeof s, "%d", http_status);
    const char *v[] = {route ? route : "other", s};
    metrics_counter_add(metrics_with(ops ? m->ops_requests : m->requests, v, NULL), 1);
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

char *coord_metrics_render(coord_metrics *m, size_t *len, st_err *err) {
    return metrics_render(m->reg, len, err);
}
