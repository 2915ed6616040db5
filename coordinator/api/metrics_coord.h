/* metrics_coord.h — the coordinator's Prometheus metrics (GET /metrics) on
 * the common/metrics.h registry. Names, labels and buckets are the table of
 * docs/metrics.md:
 *   strata_requests_total{route,status}      every API answer, once (access_log.h)
 *   strata_ops_requests_total{route,status}  probes, /metrics, /version
 *   strata_time_to_first_token_seconds       request arrival -> first token
 *   strata_time_per_output_token_seconds     gap between consecutive tokens
 *   strata_prompt_tokens_total, strata_generation_tokens_total
 *   strata_queue_depth, strata_requests_running, strata_kv_blocks_used,
 *   strata_kv_blocks_free                    from the engine at scrape time
 *   strata_stage_busy_ratio{stage}, strata_stage_activation_bytes_total{stage},
 *   strata_stage_frames_sent_total{stage}    from the workers' StageStats
 *   strata_worker_state{worker,state}, strata_worker_heartbeat_age_seconds{worker}
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

/* engine may be NULL (no engine gauges); it must outlive the metrics. */
coord_metrics *coord_metrics_new(coord_engine *engine, st_err *err);
void coord_metrics_free(coord_metrics *m);

/* One HTTP request answered (or abandoned: 499): route is a label of
 * access_log.h's fixed set; ops routes count apart. */
void coord_metrics_http(coord_metrics *m, const char *route, bool ops, int http_status);
void coord_metrics_ttft(coord_metrics *m, double seconds);
void coord_metrics_tpot(coord_metrics *m, double seconds);
void coord_metrics_prompt_tokens(coord_metrics *m, int n);
void coord_metrics_generated_tokens(coord_metrics *m, int n);

/* The text exposition (malloc'd; METRICS_CONTENT_TYPE), or NULL + err. */
char *coord_metrics_render(coord_metrics *m, size_t *len, st_err *err);

#endif
