/* metrics_kv.c — the KV scheduling metrics (metrics_kv.h). */
#include "coordinator/api/metrics_kv.h"

static metrics_series *one(metrics_family *f, st_err *err) { return f ? metrics_with(f, NULL, err) : NULL; }

int metrics_kv_register(metrics_registry *r, metrics_kv *k, st_err *err) {
    k->preemptions = one(metrics_counter(r, "strata_preemptions_total",
                                         "Sequences preempted for KV blocks (resumed later by "
                                         "re-prefilling).", NULL, err), err);
    if (!k->preemptions) return -1;
    k->queries = one(metrics_counter(r, "strata_prefix_cache_queries_total",
                                     "Tokens looked up in the prefix cache at admission.", NULL, err),
                     err);
    if (!k->queries) return -1;
    k->hits = one(metrics_counter(r, "strata_prefix_cache_hits_total",
                                  "Of the tokens looked up, those found in the prefix cache.", NULL,
                                  err),
                  err);
    if (!k->hits) return -1;
    k->prefill = one(metrics_counter(r, "strata_prefill_tokens_computed_total",
                                     "Prompt (and resumed) tokens the stages prefilled.", NULL, err),
                     err);
    if (!k->prefill) return -1;
    k->usage = one(metrics_gauge(r, "strata_kv_cache_usage_perc",
                                 "KV cache usage: blocks owned by sequences / all blocks (0..1).",
                                 NULL, err),
                   err);
    if (!k->usage) return -1;
    k->cached = one(metrics_gauge(r, "strata_kv_blocks_cached",
                                  "Free KV blocks that still hold a cached prefix (evictable).", NULL,
                                  err),
                    err);
    return k->cached ? 0 : -1;
}

/* Prometheus counters only go up: add what grew since the last scrape. */
static void follow(metrics_series *s, uint64_t now, uint64_t *last) {
    metrics_counter_add(s, now > *last ? (double)(now - *last) : 0.0);
    if (now > *last) *last = now;
}

void metrics_kv_collect(metrics_kv *k, const coord_engine_stats *st) {
    follow(k->preemptions, st->preemptions, &k->last_preemptions);
    follow(k->queries, st->prefix_cache_queries, &k->last_queries);
    follow(k->hits, st->prefix_cache_hits, &k->last_hits);
    follow(k->prefill, st->prefill_tokens, &k->last_prefill);
    metrics_gauge_set(k->usage, st->kv_blocks_total > 0
                                    ? (double)st->kv_blocks_used / st->kv_blocks_total
                                    : 0.0);
    metrics_gauge_set(k->cached, st->kv_blocks_cached);
}
