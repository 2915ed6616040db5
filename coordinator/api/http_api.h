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
 *   GET  /v1/stages        the engine's per-stage counters and KV block counts
 *                          (engine_api.h stages_json; 404 when it has none)
 * Errors are OpenAI-shaped ({"error":{message,type,param,code}}): 400 invalid
 * body or parameter, 404 unknown route or model, 405 wrong method, 413 body
 * over max_body_bytes (beyond 64 MiB evhttp's own reply), 429 queue full,
 * 503 no placement, 500 engine failure (docs/api.md has the table).
 * Every answer counts in strata_requests_total{status}; request log lines
 * carry the response id (st_log_req: STRATA_REQUEST_ID).
 *
 * A client that disconnects before its completion is done (stream or not)
 * has its request cancelled through the engine (engine_api.h).
 */
#ifndef STRATA_COORDINATOR_API_HTTP_API_H
#define STRATA_COORDINATOR_API_HTTP_API_H

#include <stddef.h>

#include "common/err.h"
#include "coordinator/api/completions.h"
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
} http_api_config;

/* Binds and serves on base. The engine must outlive the server. */
http_api *http_api_create(struct event_base *base, const http_api_config *cfg,
                          coord_engine *engine, st_err *err);
/* Cancels every request in progress, closes the socket and frees. */
void http_api_destroy(http_api *api);
int http_api_port(const http_api *api);
/* Completions in progress (submitted to the engine, not yet finished). */
int http_api_active(const http_api *api);

#endif
