/* metrics_kv.h — the KV scheduling metrics of GET /metrics (docs/metrics.md),
 * a part of coordinator/api/metrics_coord.c's registry, after vLLM's:
 *   strata_preemptions_total              sequences preempted (vllm:num_preemptions)
 *   strata_prefix_cache_queries_total     tokens looked up in the prefix cache
 *   strata_prefix_cache_hits_total        of those, found (hit rate = hits / queries)
 *   strata_prefill_tokens_computed_total  tokens the stages (re-)prefilled
 *   strata_kv_cache_usage_perc            owned blocks / pool (0..1; vllm:kv_cache_usage_perc)
 *   strata_kv_blocks_cached               free blocks that still hold a cached prefix
 * The counters come from coord_engine_stats (engine_api.h), cumulative over
 * the coordinator process.
 */
#ifndef STRATA_COORDINATOR_METRICS_KV_H
#define STRATA_COORDINATOR_METRICS_KV_H

#include <stdint.h>

#include "common/err.h"
#include "common/metrics.h"
#include "coordinator/serve/engine_api.h"

typedef struct metrics_kv {
    metrics_series *preemptions, *queries, *hits, *prefill, *usage, *cached;
    uint64_t last_preemptions, last_queries, last_hits, last_prefill;
} metrics_kv;

/* Registers the families in r. 0, or -1 with err. */
int metrics_kv_register(metrics_registry *r, metrics_kv *k, st_err *err);
/* Sets them from the engine's stats (the registry's collector calls this). */
void metrics_kv_collect(metrics_kv *k, const coord_engine_stats *st);

#endif
