/* worker_metrics.h — strata-worker's own GET /metrics (Prometheus text
 * 0.0.4, common/metrics.h), served by libevent's evhttp on the worker's loop
 * when --metrics-listen is given (off by default; docs/metrics.md):
 *
 *   strata_worker_forward_seconds{stage}      histogram  each forward of the stage
 *   strata_worker_hop_seconds{stage}          histogram  each hand-off of its output to
 *                                                        the next hop (send -> completion)
 *   strata_worker_kv_blocks_used, strata_worker_kv_blocks,
 *   strata_worker_kv_cache_usage_perc         gauges     KV of the newest ready stage (the
 *                                                        block tables of the sequences seen
 *                                                        in the latest window, <= 1 s)
 *   strata_worker_running_sequences           gauge      sequences in that window
 *   strata_worker_stage_info{stage,epoch,first_layer,last_layer}  gauge 1 per stage held
 *   strata_worker_stage_ready{stage}          gauge      1 when loaded and serving
 *   strata_worker_{bytes,frames}_{sent,received}_total, strata_worker_bad_frames_total,
 *   strata_worker_dropped_frames_total, strata_worker_fenced_frames_total,
 *   strata_worker_batch_errors_total, strata_worker_forwards_total,
 *   strata_worker_tokens_total, strata_worker_busy_seconds_total   counters
 *   process_*, strata_build_info              common/process_metrics.h
 * Every series carries no worker label: Prometheus adds instance= per target.
 *
 * Threads: the worker's loop thread (scrapes run there; the observe calls
 * come from its transport and compute-completion callbacks).
 */
#ifndef STRATA_DAEMON_WORKER_METRICS_H
#define STRATA_DAEMON_WORKER_METRICS_H

#include "common/err.h"
#include "daemon/worker.h"

struct event_base;
typedef struct worker_metrics worker_metrics;

/* Binds host:port (port 0 = any free one) and serves GET /metrics for w on
 * base; attaches itself to w (its forward and hop observations,
 * worker_observe). NULL + err when the address cannot be bound. */
worker_metrics *worker_metrics_start(struct event_base *base, worker *w, const char *host, int port,
                                     st_err *err);
int worker_metrics_port(const worker_metrics *m);
/* Detaches from the worker, closes the listener and frees. NULL is a no-op. */
void worker_metrics_stop(worker_metrics *m);

#endif
