/* metrics_coord.h — the coordinator's Prometheus metrics (GET /metrics) on
 * the common/metrics.h registry; docs/metrics.md has the table. vLLM's set
 * (vllm:* -> strata_*, the same meanings), with a model_name label:
 *   strata_time_to_first_token_seconds, strata_time_per_output_token_seconds,
 *   strata_e2e_request_latency_seconds, strata_request_{queue,prefill,decode,
 *   inference}_time_seconds, strata_request_time_per_output_token_seconds,
 *   strata_request_{prompt,generation}_tokens, strata_request_params_max_tokens
 *                                            histograms (coord_metrics_request_done)
 *   strata_request_success_total{finished_reason}
 *   strata_prompt_tokens_total, strata_generation_tokens_total
 *   strata_num_requests_running, strata_num_requests_waiting
 *                                            from the engine at scrape time
 *   (strata_kv_cache_usage_perc and the prefix-cache set: metrics_kv.h)
 * and Strata's own:
 *   strata_requests_total{route,status}      every API answer, once (access_log.h)
 *   strata_ops_requests_total{route,status}  probes, /metrics, /version
 *   strata_kv_blocks_used, strata_kv_blocks_free, strata_placement_epoch
 *   strata_http_connections_open, strata_http_connections_closed_total{reason},
 *   strata_http_accept_errors_total          the HTTP server's connections (http_conn.h)
 *   strata_stage_busy_ratio{stage}, strata_stage_activation_bytes_total{stage},
 *   strata_stage_frames_sent_total{stage}, strata_stage_forward_seconds{stage},
 *   strata_stage_hops_total{stage}, strata_stage_hop_seconds_total{stage},
 *   strata_stage_load_seconds{stage}         from the workers' StageStats
 *   strata_worker_state{worker,state}, strata_worker_heartbeat_age_seconds{worker}
 *   strata_recoveries_total, ... (recovery), process_*, strata_build_info
 * Engine values come from coord_engine_ops.stats (engine_api.h) through the
 * registry's collector, so they are current at every scrape.
 * Threads: the event-loop thread (the registry itself is thread-safe).
 */
#ifndef STRATA_COORDINATOR_METRICS_COORD_H
#define STRATA_COORDINATOR_METRICS_COORD_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "coordinator/serve/engine_api.h"

typedef struct coord_metrics coord_metrics;

/* engine may be NULL (no engine gauges); it must outlive the metrics.
 * model_name is the model_name label of the per-request families (copied). */
coord_metrics *coord_metrics_new(coord_engine *engine, const char *model_name, st_err *err);
void coord_metrics_free(coord_metrics *m);

/* One HTTP request answered (or abandoned: 499): route is a label of
 * access_log.h's fixed set; ops routes count apart. */
void coord_metrics_http(coord_metrics *m, const char *route, bool ops, int http_status);
/* The HTTP server's connections (http_conn.h): how many are open now; one
 * closed by the server, reason "cap", "header_timeout", "body_timeout" or
 * "idle_timeout"; one failed accept() (EMFILE, ENFILE, ...). */
void coord_metrics_http_open(coord_metrics *m, int open);
void coord_metrics_http_closed(coord_metrics *m, const char *reason);
void coord_metrics_http_accept_error(coord_metrics *m);
void coord_metrics_ttft(coord_metrics *m, double seconds);
void coord_metrics_tpot(coord_metrics *m, double seconds);
void coord_metrics_prompt_tokens(coord_metrics *m, int n);
void coord_metrics_generated_tokens(coord_metrics *m, int n);

/* One request's life, in monotonic seconds (0 = did not happen). */
typedef struct coord_request_times {
    double arrival;      /* the HTTP request was read */
    double scheduled;    /* its first micro-batch went to the stages (coord_sink.on_scheduled) */
    double first_token, last_token;
    double end;          /* its answer was written (the last chunk of a stream) */
    int prompt_tokens, generation_tokens; /* the usage returned to the client */
    int max_tokens;
    /* "stop", "length", "abort" (the client left), or NULL: it failed (an
     * error answer), counted nowhere here. */
    const char *finished_reason;
} coord_request_times;

/* A request ended: strata_request_success_total{finished_reason}, and for
 * stop and length the per-request histograms (e2e, queue, prefill, decode,
 * inference, time per output token, prompt and generation tokens, max_tokens). */
void coord_metrics_request_done(coord_metrics *m, const coord_request_times *t);

/* The text exposition (malloc'd; METRICS_CONTENT_TYPE), or NULL + err. */
char *coord_metrics_render(coord_metrics *m, size_t *len, st_err *err);

#endif
