/* http_api.h — the coordinator's OpenAI-compatible HTTP server (libevent
 * evhttp + jansson) on the caller's event loop.
 *
 * Routes
 *   POST /v1/completions   completions.h; "stream": true answers with
 *                          server-sent events over a chunked reply:
 *                          "data: {chunk}\n\n" ... "data: [DONE]\n\n"
 *   POST /v1/chat/completions  the same for "messages" (chat.h), in
 *                          chat.completion(.chunk) shapes
 *   GET  /metrics          Prometheus text (metrics_coord.h, docs/metrics.md)
 *   GET  /v1/models        {"object":"list","data":[{"id":model,...}]}
 *   GET  /health           200 {"status":"ok"} when the engine serves, else 503
 *   GET  /livez /healthz /readyz /version  probes.h (liveness, readiness, build)
 *   GET  /v1/stages        the engine's per-stage counters and KV block counts
 *                          (engine_api.h stages_json; 404 when it has none)
 *   POST /tokenize /detokenize  vLLM's tokenizer routes (tokenize.h)
 * A completion with several choices (n > 1, a list of prompts) submits one
 * engine request per choice and answers when the last one finishes.
 * Errors are OpenAI-shaped ({"error":{message,type,param,code}}): 400 invalid
 * body or parameter, 404 unknown route or model, 405 wrong method, 413 body
 * over max_body_bytes (beyond 64 MiB evhttp's own reply), 429 queue full,
 * 503 no placement, 500 engine failure (docs/api.md has the table).
 * Every request gets one access-log line and one count in
 * strata_requests_total{route,status} (probes and scrapes in
 * strata_ops_requests_total) when its answer is complete (access_log.h);
 * request log lines carry the request id (st_log_req: STRATA_REQUEST_ID): the
 * client's X-Request-Id when valid, else the response id (request_id.h);
 * every completion answer has the X-Request-Id header.
 *
 * A client that disconnects before its completion is done (stream or not)
 * has its requests (every choice) cancelled through the engine (engine_api.h).
 *
 * Security (docs/security.md, "HTTP API"): with API keys (http_auth.h)
 * every route needs "Authorization: Bearer KEY" (401 with an OpenAI error
 * body and WWW-Authenticate: Bearer otherwise) except the probes (/health,
 * /healthz, /livez, /readyz) and /metrics, unless protect_metrics; each key
 * has at most max_requests_per_key completions queued or running (429 with
 * Retry-After beyond). Requests with ambiguous framing get 400
 * (http_framing.h). TLS, the connection cap, the read deadlines and the
 * accept-error pauses are http_conn.h's.
 */
#ifndef STRATA_COORDINATOR_API_HTTP_API_H
#define STRATA_COORDINATOR_API_HTTP_API_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "coordinator/api/completions.h"
#include "coordinator/api/http_auth.h"
#include "coordinator/api/http_conn.h"
#include "coordinator/serve/engine_api.h"

struct event_base;
typedef struct http_api http_api;

typedef struct http_api_config {
    const char *host;       /* listen address, e.g. "127.0.0.1" or "0.0.0.0" */
    int port;               /* 0 = any free port (http_api_port tells which) */
    size_t max_body_bytes;  /* 0 = 1 MiB */
    const char *model_name; /* the "model" of responses and /v1/models */
    int n_ctx;              /* context length for max_tokens validation; 0 = no check */
    const char *chat_template; /* the GGUF's tokenizer.chat_template; NULL = none (plain) */
    compl_tokenizer tokenizer; /* prompts to token ids for the engine (compl_tokenizer_vocab) */
    /* Security (docs/security.md). */
    http_keys *keys;           /* API keys (http_auth.h); NULL or none = no authentication */
    bool protect_metrics;      /* the key is needed for /metrics and the probes too */
    const char *tls_cert, *tls_key; /* PEM files; NULL = plain HTTP */
    http_conn_limits conn;     /* connection cap and read deadlines (http_conn.h) */
} http_api_config;

/* Binds and serves on base. The engine and cfg->keys must outlive the server. */
http_api *http_api_create(struct event_base *base, const http_api_config *cfg,
                          coord_engine *engine, st_err *err);
/* Cancels every request in progress, closes the socket and frees. */
void http_api_destroy(http_api *api);
int http_api_port(const http_api *api);
/* Serves new requests with keys (http_auth.h) from now on; requests in
 * progress keep theirs. The caller keeps ownership of both tables. */
void http_api_set_keys(http_api *api, http_keys *keys);
/* Completions in progress (submitted to the engine, not yet finished). */
int http_api_active(const http_api *api);

/* Graceful shutdown (coordinator/shutdown.h). Closes admissions: from now
 * on a completion gets 503 "shutting_down" with Retry-After: retry_after_s,
 * and /readyz answers 503; requests in progress go on. */
void http_api_drain(http_api *api, int retry_after_s);
bool http_api_draining(const http_api *api);
/* Ends every completion in progress: a stream gets an SSE error event
 * (503, "shutting_down", message) and "data: [DONE]", a non-streaming request
 * the 503 error body; each is cancelled in the engine. Returns how many.
 * The replies are queued on their connections: run the loop a little longer
 * to send them. */
int http_api_end_all(http_api *api, const char *message);

#endif
