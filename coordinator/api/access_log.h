/* access_log.h — one access-log line and one request count per HTTP request
 * of the coordinator's API, when its answer is complete.
 *
 * http_access_start() (from the evhttp callback, before routing) opens a
 * record: method, route label, start time. When evhttp has written the whole
 * answer (evhttp_request_set_on_complete_cb, streams included) or the client
 * went away first, the record
 * - logs one line (common/log.h st_log_kv, level info, msg=access):
 *     ... req=cmpl-1f2e msg=access method=POST route=/v1/completions status=200
 *         bytes=1234 duration_ms=52.310 [aborted=1]
 *   bytes = response body bytes (Content-Length, or the chunks of a stream);
 *   duration_ms = from the request's arrival (its body read) to the last byte
 *   written (or to the disconnect); status 499 = the client closed before any
 *   answer (nginx's convention), aborted=1 on every disconnect;
 * - counts it in /metrics (metrics_coord.h): API routes in
 *   strata_requests_total{route,status}, the operator routes (probes,
 *   /metrics, /version) in strata_ops_requests_total{route,status}, so that
 *   scrapes and probes never count as traffic.
 *
 * Route labels are a fixed set (http_route_label), never the raw path: an
 * unknown path is "other", so a scanner cannot create series.
 *
 * Threads: the event-loop thread only.
 */
#ifndef STRATA_COORDINATOR_API_ACCESS_LOG_H
#define STRATA_COORDINATOR_API_ACCESS_LOG_H

#include <stdbool.h>
#include <stddef.h>

#include "coordinator/api/metrics_coord.h"

struct evhttp_request;
typedef struct http_access_log http_access_log;
typedef struct http_access http_access;

/* The label for path: the path itself when it is one of the routes this
 * server (or a version of it) serves, else "other". *ops (optional) is set
 * for the operator routes: /health, /healthz, /livez, /readyz, /metrics,
 * /version. The result is a static string. */
const char *http_route_label(const char *path, bool *ops);

/* metrics may be NULL (no counting). Returns NULL on out of memory. */
http_access_log *http_access_log_new(coord_metrics *metrics);
/* Frees the records still open (requests evhttp is still answering are
 * answered by http_api_destroy first; what remains is logged as aborted). */
void http_access_log_free(http_access_log *l);

/* Opens the record of req (the path before any query string) and hooks its
 * completion. NULL on out of memory (the request is then served unlogged). */
http_access *http_access_start(http_access_log *l, struct evhttp_request *req);
/* The request id for the line (copied; cut to 63 bytes). */
void http_access_set_id(http_access *a, const char *request_id);
/* Body bytes written as chunks (streams); plain replies are measured from
 * their Content-Length. */
void http_access_add_bytes(http_access *a, size_t n);
/* The client went away before the answer was complete: logs and counts the
 * record now (aborted=1) and frees it. a may be NULL. */
void http_access_aborted(http_access *a);
/* A completion in progress keeps a: it takes the connection's close
 * callback for itself (and calls http_access_aborted from it), and the
 * record is not freed before http_access_release, which re-arms the
 * record's own disconnect watch when the answer is still being written. */
void http_access_hold(http_access *a);
void http_access_release(http_access *a);

/* "GET", "POST", ... for an evhttp_cmd_type; "?" for others. */
const char *http_method_name(int evhttp_cmd);

#endif
