/* metrics.h — a small thread-safe Prometheus metrics registry.
 *
 * Families are counters, gauges or histograms, each with a fixed list of label
 * names (0..METRICS_MAX_LABELS). A family holds one series per distinct tuple
 * of label values. metrics_render() writes the Prometheus text exposition
 * format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/):
 *
 *   # HELP strata_requests_total Requests answered, by HTTP status.
 *   # TYPE strata_requests_total counter
 *   strata_requests_total{status="200"} 3
 *
 * Histograms render cumulative `_bucket{le="..."}` lines (the "+Inf" bucket is
 * added for you), then `_sum` and `_count`. Families render in creation
 * order, series in first-use order. Label values escape `\`, `"` and newline;
 * help text escapes `\` and newline. Numbers use the shortest text that reads
 * back to the same double ("0.25", "1e+06", "+Inf", "NaN").
 *
 * Naming (checked at creation, as `promtool check metrics` would lint it):
 * metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
 * [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__"; counter names end in
 * "_total"; histogram names do not end in _bucket/_sum/_count/_total and have
 * no "le" label. Use base units: _seconds, _bytes.
 *
 * Updates on a series of another type are ignored.
 *
 * Threads: every call may come from any thread. Structure changes and scrapes
 * take the registry lock; updates take their family's lock. Series pointers
 * stay valid until metrics_family_reset() on their family or
 * metrics_registry_free().
 */
#ifndef STRATA_COMMON_METRICS_H
#define STRATA_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define METRICS_MAX_LABELS 4
#define METRICS_MAX_BUCKETS 32
#define METRICS_MAX_COLLECTORS 8
/* The Content-Type for GET /metrics. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

typedef struct metrics_registry metrics_registry;
typedef struct metrics_family metrics_family;
typedef struct metrics_series metrics_series;

enum metrics_type { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM };

/* Called at the start of every metrics_render(), before any lock is taken, so
 * that scrape-time gauges (queue depth, heartbeat age) can be refreshed. */
typedef void (*metrics_collect_fn)(metrics_registry *r, void *ud);

metrics_registry *metrics_registry_new(st_err *err);
void metrics_registry_free(metrics_registry *r);
/* The registry's main collector (replaces the previous one; NULL: none). */
void metrics_registry_set_collector(metrics_registry *r, metrics_collect_fn fn, void *ud);
/* One more collector (process metrics, a subsystem's own), run after the main
 * one in the order added; up to METRICS_MAX_COLLECTORS - 1. 0, or -1 + err. */
int metrics_registry_add_collector(metrics_registry *r, metrics_collect_fn fn, void *ud,
                                   st_err *err);

/* Creates a family. `labels` is a comma-separated list of label names
 * ("status", "stage,worker") or NULL/"" for none. Names must be unique in the
 * registry. Returns a family owned by the registry, or NULL with err. */
metrics_family *metrics_counter(metrics_registry *r, const char *name, const char *help,
                                const char *labels, st_err *err);
metrics_family *metrics_gauge(metrics_registry *r, const char *name, const char *help,
                              const char *labels, st_err *err);
/* bounds: n upper bounds, finite and strictly increasing (1 <= n <=
 * METRICS_MAX_BUCKETS); "+Inf" is implicit. */
metrics_family *metrics_histogram(metrics_registry *r, const char *name, const char *help,
                                  const char *labels, const double *bounds, size_t n,
                                  st_err *err);

/* The series for one tuple of label values (values[i] pairs with the i-th
 * label name; NULL when the family has no labels), created on first use.
 * Values are any UTF-8 text, copied. Returns NULL with err when a value is
 * NULL or out of memory. Look the pointer up once and keep it on hot paths. */
metrics_series *metrics_with(metrics_family *f, const char *const *values, st_err *err);

/* Updates. Calls with s == NULL are ignored, so the result of a failed
 * metrics_with() may be passed straight on. A counter ignores negative or
 * NaN increments (counters never go down). */
void metrics_counter_add(metrics_series *s, double v);
void metrics_gauge_set(metrics_series *s, double v);
void metrics_gauge_add(metrics_series *s, double v);
void metrics_histogram_observe(metrics_series *s, double v);

/* Adds observations counted elsewhere (a worker's cumulative histogram, as
 * deltas): counts[b] observations in bucket b (not cumulative; n must be the
 * family's bounds + 1, the last one +Inf) whose values sum to sum. Ignored on
 * another type or another n. */
void metrics_histogram_merge(metrics_series *s, const uint64_t *counts, size_t n, double sum);

/* Current value (counter or gauge), or the histogram's count; 0 for NULL. */
double metrics_value(metrics_series *s);
/* Histogram sum; 0 for NULL or other types. */
double metrics_histogram_sum(metrics_series *s);

/* Drops every series of f (e.g. the per-worker gauges before a collector
 * re-sets them for the workers that still exist). Invalidates f's series
 * pointers: use it only on families updated from the collector. */
void metrics_family_reset(metrics_family *f);

/* Renders the registry in the text format 0.0.4. Returns a malloc'd
 * NUL-terminated string (caller frees; *len_out gets its length when non-NULL),
 * or NULL with err on out of memory. */
char *metrics_render(metrics_registry *r, size_t *len_out, st_err *err);

/* Writes v as Prometheus prints a float64 (Go's FormatFloat 'g', -1):
 * shortest round-trip text, "+Inf", "-Inf", "NaN". Returns the length. */
int metrics_format_double(char *buf, size_t size, double v);

#endif
