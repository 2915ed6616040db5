/* access_log.c — the access-log line and request counters of each HTTP
 * request, at its completion (see access_log.h). */
#include "coordinator/api/access_log.h"

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "coordinator/api/http_conn.h"

struct http_access {
    http_access_log *log;
    http_access *prev, *next;
    struct evhttp_request *req;
    struct evhttp_connection *evcon;
    const char *method, *route;
    bool ops;
    bool held;      /* a completion in progress owns the close callback */
    bool finished;  /* logged and counted */
    double t0;      /* monotonic seconds at the request's arrival */
    size_t bytes;   /* chunked body bytes */
    int status;     /* of a reply in progress (a stream), seen at its first chunk */
    char id[64];
};

struct http_access_log {
    coord_metrics *metrics;
    http_access *open; /* records not freed yet */
};

/* The routes this coordinator serves, or served, or that a later version (a
 * newer binary behind the same dashboards) serves: their paths are labels. */
static const struct {
    const char *path;
    bool ops;
} g_routes[] = {
    {"/v1/completions", false}, {"/v1/chat/completions", false}, {"/v1/models", false},
    {"/v1/stages", false},      {"/v1/embeddings", false},       {"/tokenize", false},
    {"/detokenize", false},     {"/health", true},               {"/healthz", true},
    {"/livez", true},           {"/readyz", true},               {"/metrics", true},
    {"/version", true},
};

const char *http_route_label(const char *path, bool *ops) {
    if (ops) *ops = false;
    for (size_t i = 0; path && i < sizeof g_routes / sizeof g_routes[0]; i++) {
        if (!strcmp(path, g_routes[i].path)) {
            if (ops) *ops = g_routes[i].ops;
            return g_routes[i].path;
        }
    }
    return "other";
}

const char *http_method_name(int m) {
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_PATCH: return "PATCH";
    case EVHTTP_REQ_TRACE: return "TRACE";
    case EVHTTP_REQ_CONNECT: return "CONNECT";
    default: return "?";
    }
}

http_access_log *http_access_log_new(coord_metrics *metrics) {
    http_access_log *l = calloc(1, sizeof *l);
    if (l) l->metrics = metrics;
    return l;
}

static void access_free(http_access *a) {
    http_access_log *l = a->log;
    if (a->prev) a->prev->next = a->next;
    else l->open = a->next;
    if (a->next) a->next->prev = a->prev;
    free(a);
}

/* Logs and counts a once. */
static void access_finish(http_access *a, int status, size_t bytes, bool aborted) {
    if (a->finished) return;
    a->finished = true;
    double ms = (st_now_s() - a->t0) * 1e3;
    st_log_kv(ST_LOG_INFO, a->id, "access",
              "method=%s route=%s status=%d bytes=%zu duration_ms=%.3f%s", a->method, a->route,
              status, bytes, ms, aborted ? " aborted=1" : "");
    coord_metrics_http(a->log->metrics, a->route, a->ops, status);
}

void http_access_log_free(http_access_log *l) {
    if (!l) return;
    while (l->open) {
        http_access *a = l->open;
        access_finish(a, 499, a->bytes, true);
        access_free(a);
    }
    free(l);
}

/* evhttp wrote the whole answer (before it frees req). */
static void on_complete(struct evhttp_request *req, void *arg) {
    http_access *a = arg;
    size_t bytes = a->bytes;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    const char *cl = h ? evhttp_find_header(h, "Content-Length") : NULL;
    if (cl) bytes = (size_t)strtoull(cl, NULL, 10);
    access_finish(a, evhttp_request_get_response_code(req), bytes, false);
    a->req = NULL;
    if (a->held) return; /* the completion frees it at http_access_release */
    if (a->evcon) http_conn_set_closecb(a->evcon, NULL, NULL);
    access_free(a);
}

/* The connection went down before the answer was complete. */
static void on_close(struct evhttp_connection *evcon, void *arg) {
    (void)evcon;
    http_access *a = arg;
    a->evcon = NULL;
    http_access_aborted(a);
}

http_access *http_access_start(http_access_log *l, struct evhttp_request *req) {
    if (!l || !req) return NULL;
    http_access *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->log = l;
    a->req = req;
    a->t0 = st_now_s();
    a->method = http_method_name(evhttp_request_get_command(req));
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    a->route = http_route_label(uri ? evhttp_uri_get_path(uri) : NULL, &a->ops);
    a->next = l->open;
    if (l->open) l->open->prev = a;
    l->open = a;
    http_conn_set_on_complete(req, on_complete, a);
    a->evcon = evhttp_request_get_connection(req);
    /* One request at a time per connection (evhttp answers in order), so
     * the close callback belongs to this record until it completes. */
    if (a->evcon) http_conn_set_closecb(a->evcon, on_close, a);
    return a;
}

void http_access_set_id(http_access *a, const char *request_id) {
    if (a) snprintf(a->id, sizeof a->id, "%s", request_id ? request_id : "");
}

void http_access_add_bytes(http_access *a, size_t n) {
    if (!a) return;
    a->bytes += n;
    /* Read now: evhttp may change the code of a request whose connection
     * fails (it answered 400 in 2.1.12). */
    if (!a->status && a->req) a->status = evhttp_request_get_response_code(a->req);
}

void http_access_aborted(http_access *a) {
    if (!a) return;
    access_finish(a, a->status > 0 ? a->status : 499, a->bytes, true);
    if (a->req) http_conn_set_on_complete(a->req, NULL, NULL);
    a->req = NULL;
    a->evcon = NULL;
    if (!a->held) access_free(a);
}

void http_access_hold(http_access *a) {
    if (a) a->held = true;
}

void http_access_release(http_access *a) {
    if (!a) return;
    a->held = false;
    if (a->finished) {
        access_free(a);
        return;
    }
    if (a->evcon) http_conn_set_closecb(a->evcon, on_close, a);
}
