/* http_api.c — evhttp routes, completions request lifecycle, SSE streaming
 * and cancellation on client disconnect. See http_api.h. */
#include "coordinator/api/http_api.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/log_limit.h"
#include "common/metrics.h"
#include "coordinator/api/access_log.h"
#include "coordinator/api/completions.h"
#include "coordinator/api/http_framing.h"
#include "coordinator/api/metrics_coord.h"
#include "coordinator/api/probes.h"
#include "coordinator/api/request_id.h"
#include "coordinator/api/tokenize.h"
#include "model/chat_template.h"

typedef struct call call;

/* evhttp's own limit on a request body (it answers 413 itself beyond it);
 * bodies between max_body_bytes and this get the OpenAI-shaped 413. */
#define HTTP_HARD_BODY_LIMIT ((size_t)64 << 20)

struct http_api {
    struct event_base *base;
    compl_tokenizer tokenizer;
    struct evhttp *http;
    coord_engine *engine;
    char *model_name;
    int n_ctx;
    int port;
    int chat_format;         /* enum chat_format of the model's template */
    size_t max_body;         /* 413 above this (OpenAI-shaped) */
    coord_metrics *metrics;  /* GET /metrics; NULL when it could not be created */
    http_access_log *access; /* access-log lines and request counters (access_log.h) */
    http_access *cur_access; /* the record of the request being routed (on_request) */
    uint64_t salt, seq;
    call *calls; /* completions in progress */
    int n_active;
    bool draining;     /* http_api_drain: admissions answer 503 + Retry-After */
    int retry_after_s;
    http_keys *keys;      /* NULL or empty: no authentication */
    bool protect_metrics; /* keys needed for /metrics and the probes too */
    http_tls *tls;        /* NULL: plain HTTP */
    http_conns *conns;    /* cap, deadlines, accept errors (http_conn.h) */
    http_key *cur_key;    /* the key of the request being routed (handlers are synchronous) */
};

/* One choice of a completion: its own engine request (n > 1 and batched
 * prompts give several). */
typedef struct choice {
    call *c;
    int index;           /* into c->outs */
    uint64_t engine_id;
    bool open;           /* submitted and not finished */
    const char *finish;  /* "stop" / "length" once finished */
    int n_tokens;        /* tokens of this choice */
    double t_last;       /* its latest token (TPOT is per sequence) */
} choice;

/* One completion in progress. */
struct call {
    http_api *api;
    struct evhttp_request *req;
    struct evhttp_connection *evcon;
    http_access *acc; /* its access-log record (held until call_done) */
    compl_request params;
    compl_output *outs;  /* one per choice, index order */
    choice *ch;
    int n_ch, n_open;
    compl_meta meta;
    char rid[REQUEST_ID_MAX + 1]; /* X-Request-Id, else meta.id: logs and workers (request_id.h) */
    bool stream;
    double t0, t_first, t_last; /* arrival, first and latest token (monotonic seconds) */
    double t_sched;      /* the first choice's first micro-batch went out (0: not yet) */
    int n_tokens;        /* tokens delivered */
    struct event *watch; /* EOF watch on the client socket while we compute */
    http_key *key;       /* counted in its per-key limit until freed; NULL: none */
    call *prev, *next;
};

static const char *reason_phrase(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Error";
    }
}

static void reply_typed(http_api *api, struct evhttp_request *req, int status, const char *ctype,
                        const char *body, size_t len) {
    (void)api;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", ctype);
    struct evbuffer *b = evbuffer_new();
    if (b && body) evbuffer_add(b, body, len);
    evhttp_send_reply(req, status, reason_phrase(status), b);
    if (b) evbuffer_free(b);
}

static void reply_json(http_api *api, struct evhttp_request *req, int status, const char *json) {
    (void)api;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "application/json");
    struct evbuffer *b = evbuffer_new();
    if (b && json) {
        evbuffer_add(b, json, strlen(json));
        evbuffer_add(b, "\n", 1);
    }
    evhttp_send_reply(req, status, reason_phrase(status), b);
    if (b) evbuffer_free(b);
}

static void reply_error(http_api *api, struct evhttp_request *req, const compl_error *e) {
    char *j = compl_error_json(e);
    reply_json(api, req, e->status, j ? j : "{\"error\":{\"message\":\"out of memory\"}}");
    free(j);
}

static void reply_simple_error(http_api *api, struct evhttp_request *req, int status,
                               const char *type, const char *code, const char *msg) {
    compl_error e;
    compl_error_set(&e, status, type, NULL, code, "%s", msg);
    reply_error(api, req, &e);
}

/* ---- completions lifecycle ----------------------------------------------------- */

static void call_unlink(call *c) {
    http_api *api = c->api;
    if (c->prev)
        c->prev->next = c->next;
    else if (api->calls == c)
        api->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
    api->n_active--;
}

static void call_free(call *c) {
    http_key_release(c->key);
    for (int i = 0; c->outs && i < c->n_ch; i++) compl_output_free(&c->outs[i]);
    free(c->outs);
    free(c->ch);
    compl_request_free(&c->params);
    free(c);
}

/* Cancels every choice still running in the engine. */
static void call_cancel_open(call *c) {
    for (int i = 0; i < c->n_ch; i++)
        if (c->ch[i].open) {
            c->ch[i].open = false;
            c->n_open--;
            c->api->engine->ops->cancel(c->api->engine->impl, c->ch[i].engine_id);
        }
}

static int call_prompt_tokens(const call *c) {
    int n = 0;
    for (int i = 0; i < c->n_ch; i++) n += c->outs[i].counts_prompt ? c->outs[i].n_prompt : 0;
    return n;
}

static int call_completion_tokens(const call *c) {
    int n = 0;
    for (int i = 0; i < c->n_ch; i++) n += c->outs[i].n_ids;
    return n;
}

/* Detaches from the connection and frees (the request is answered or gone). */
static void call_done(call *c) {
    if (c->watch) event_free(c->watch);
    c->watch = NULL;
    if (c->evcon) http_conn_set_closecb(c->evcon, NULL, NULL);
    http_access_release(c->acc); /* re-arms its own close watch while the answer is written */
    c->acc = NULL;
    call_unlink(c);
    call_free(c);
}

static void send_sse(call *c, const char *data) {
    struct evbuffer *b = evbuffer_new();
    if (!b) return;
    evbuffer_add_printf(b, "data: %s\n\n", data);
    http_access_add_bytes(c->acc, evbuffer_get_length(b));
    evhttp_send_reply_chunk(c->req, b);
    evbuffer_free(b);
}

static void call_observe(call *c, const char *finish);

/* Answers the request once every choice finished, and frees the call. */
static void call_complete(call *c) {
    double now = st_now_s();
    call_observe(c, c->ch[0].finish);
    st_log_kv(ST_LOG_INFO, c->rid, "finished",
              "finish=%s choices=%d prompt_tokens=%d completion_tokens=%d ttft_s=%.3f e2e_s=%.3f",
              c->ch[0].finish, c->n_ch, call_prompt_tokens(c), call_completion_tokens(c),
              c->n_tokens ? c->t_first - c->t0 : -1.0, now - c->t0);
    if (c->stream) {
        if (c->params.include_usage) {
            char *j = compl_output_usage_chunk(c->outs, c->n_ch, &c->meta);
            if (j) send_sse(c, j);
            free(j);
        }
        send_sse(c, "[DONE]");
        evhttp_send_reply_end(c->req);
    } else {
        const char **fin = malloc(sizeof *fin * (size_t)c->n_ch);
        for (int i = 0; fin && i < c->n_ch; i++) fin[i] = c->ch[i].finish;
        char *j = fin ? compl_output_response(c->outs, c->n_ch, &c->meta, fin) : NULL;
        free(fin);
        if (j)
            reply_json(c->api, c->req, 200, j);
        else
            reply_simple_error(c->api, c->req, 500, "server_error", NULL, "out of memory");
        free(j);
    }
    call_done(c);
}

/* One choice finished: its last chunk on a stream; the answer when it was
 * the last one open. Returns true when the call is freed. */
static bool choice_finish(choice *h, const char *finish) {
    call *c = h->c;
    if (h->open) {
        h->open = false;
        c->n_open--;
    }
    h->finish = finish;
    if (c->stream) {
        bool none;
        char *j = compl_output_chunk(&c->outs[h->index], &c->meta, finish, &none);
        if (j) send_sse(c, j);
        free(j);
    }
    if (c->n_open > 0) return false;
    call_complete(c);
    return true;
}

/* Ends a call with an error: an SSE error event and [DONE] on a stream,
 * else the error reply. */
static void call_error(call *c, const compl_error *e) {
    call_cancel_open(c);
    if (c->stream) {
        char *j = compl_error_json(e);
        if (j) send_sse(c, j);
        free(j);
        send_sse(c, "[DONE]");
        evhttp_send_reply_end(c->req);
    } else {
        reply_error(c->api, c->req, e);
    }
    call_done(c);
}

static void call_fail(call *c, const char *message) {
    ST_REQ_WARN(c->rid, "http: failed: %s", message ? message : "unknown error");
    compl_error e;
    compl_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                    message ? message : "unknown error");
    call_error(c, &e);
}

static void sink_prompt(void *ctx, const int32_t *ids, int n) {
    choice *h = ctx;
    call *c = h->c;
    if (c->outs[h->index].counts_prompt)
        coord_metrics_prompt_tokens(c->api->metrics, n);
    if (compl_output_prompt(&c->outs[h->index], ids, n) != 0) call_fail(c, "out of memory");
}

static void sink_token(void *ctx, int32_t id, const char *piece, size_t len,
                       const coord_logprobs *lp) {
    choice *h = ctx;
    call *c = h->c;
    double now = st_now_s();
    if (c->n_tokens++ == 0) {
        c->t_first = now;
        coord_metrics_ttft(c->api->metrics, now - c->t0);
    }
    if (h->n_tokens++ > 0) coord_metrics_tpot(c->api->metrics, now - h->t_last);
    h->t_last = now;
    c->t_last = now;
    coord_metrics_generated_tokens(c->api->metrics, 1);
    /* skip_special_tokens false: a control token shows its text (vLLM). */
    const compl_tokenizer *tok = &c->api->tokenizer;
    if (!c->params.skip_special_tokens && tok->special_text) {
        size_t sl = 0;
        const char *st = tok->special_text(tok->ctx, id, &sl);
        if (st) piece = st, len = sl;
    }
    compl_output *o = &c->outs[h->index];
    int r = compl_output_token(o, id, piece, len, lp);
    if (r < 0) {
        call_fail(c, "out of memory");
        return;
    }
    if (r == 1) { /* a stop string or stop token matched */
        h->open = false;
        c->n_open--;
        c->api->engine->ops->cancel(c->api->engine->impl, h->engine_id);
        choice_finish(h, "stop");
        return;
    }
    if (c->stream) {
        bool none;
        char *j = compl_output_chunk(o, &c->meta, NULL, &none);
        if (j) send_sse(c, j);
        free(j);
    }
}

static void sink_finish(void *ctx, enum coord_finish reason, const char *message) {
    choice *h = ctx;
    if (reason == COORD_FINISH_ERROR) {
        h->open = false; /* the engine is done with it */
        h->c->n_open--;
        call_fail(h->c, message);
    } else {
        choice_finish(h, reason == COORD_FINISH_STOP ? "stop" : "length");
    }
}

static void sink_scheduled(void *ctx) {
    choice *h = ctx;
    if (h->c->t_sched == 0) h->c->t_sched = st_now_s();
}

static const coord_sink http_sink = {sink_prompt, sink_token, sink_finish, sink_scheduled};

/* The request's timings and usage for /metrics (finish: "stop", "length",
 * "abort", or NULL when it failed). */
static void call_observe(call *c, const char *finish) {
    coord_request_times t = {.arrival = c->t0,
                             .scheduled = c->t_sched,
                             .first_token = c->n_tokens ? c->t_first : 0,
                             .last_token = c->n_tokens ? c->t_last : 0,
                             .end = st_now_s(),
                             .prompt_tokens = call_prompt_tokens(c),
                             .generation_tokens = call_completion_tokens(c),
                             .max_tokens = c->params.max_tokens,
                             .finished_reason = finish};
    coord_metrics_request_done(c->api->metrics, &t);
}

/* The client went away. */
static void on_conn_close(struct evhttp_connection *evcon, void *arg) {
    call *c = arg;
    ST_REQ_INFO(c->rid, "http: client closed the connection; cancelling %s", c->meta.id);
    http_access_aborted(c->acc); /* before the request can be freed */
    call_observe(c, "abort");
    call_cancel_open(c);
    /* On a failed write or read, evhttp detaches a request that is still
     * being answered from the connection and leaves it to us (libevent 2.1
     * evhttp_connection_incoming_fail); otherwise it frees it after this. */
    if (c->req && evhttp_request_get_connection(c->req) == NULL) evhttp_request_free(c->req);
    c->req = NULL;
    c->evcon = NULL;
    call_done(c);
}

/* evhttp does not read from a connection while its request is being
 * handled, so a client that closes before anything is written goes unnoticed.
 * This watch peeks at the socket: EOF or an error means the client is gone,
 * and freeing the connection makes evhttp call on_conn_close. Bytes (a
 * pipelined request) are left to evhttp and the watch stops. */
static void on_client_readable(evutil_socket_t fd, short what, void *arg) {
    call *c = arg;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) {
        if (n > 0) {
            event_free(c->watch);
            c->watch = NULL;
        }
        return;
    }
    struct evhttp_connection *evcon = c->evcon;
    if (evcon) evhttp_connection_free(evcon); /* calls on_conn_close, which frees c */
}

static void handle_generate(http_api *api, struct evhttp_request *req, bool chat) {
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    compl_error e;
    if (api->draining) { /* graceful shutdown (coordinator/lifecycle.h) */
        char ra[16];
        snprintf(ra, sizeof ra, "%d", api->retry_after_s);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", ra);
        reply_simple_error(api, req, 503, "server_error", "shutting_down",
                           "the server is shutting down; retry on another replica or after it restarts");
        return;
    }
    if (len > api->max_body) {
        compl_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                        "the request body has %zu bytes; the limit is %zu", len, api->max_body);
        reply_error(api, req, &e);
        return;
    }
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    call *c = calloc(1, sizeof *c);
    if (!c) {
        reply_simple_error(api, req, 500, "server_error", NULL, "out of memory");
        return;
    }
    c->api = api;
    c->req = req;
    c->t0 = st_now_s();
    snprintf(c->meta.id, sizeof c->meta.id, "%s-%016llx%08llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)api->salt, (unsigned long long)++api->seq);
    const char *xrid = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Request-Id");
    snprintf(c->rid, sizeof c->rid, "%s", request_id_valid(xrid) ? xrid : c->meta.id);
    if (!request_id_valid(xrid))
        evhttp_add_header(evhttp_request_get_output_headers(req), "X-Request-Id", c->rid);
    c->acc = api->cur_access;
    http_access_set_id(c->acc, c->rid);
    compl_limits lim = {api->n_ctx, api->model_name, api->chat_format, &api->tokenizer};
    int prc = chat ? compl_parse_chat(body ? body : "", len, &lim, &c->params, &e)
                   : compl_parse(body ? body : "", len, &lim, &c->params, &e);
    if (prc != 0) {
        ST_REQ_INFO(c->rid, "http: %s refused (%d): %s", chat ? "chat" : "completion",
                    e.status, e.message);
        reply_error(api, req, &e);
        free(c);
        return;
    }
    c->n_ch = compl_n_choices(&c->params);
    c->outs = calloc((size_t)c->n_ch, sizeof *c->outs);
    c->ch = calloc((size_t)c->n_ch, sizeof *c->ch);
    bool ok = c->outs && c->ch;
    for (int i = 0; ok && i < c->n_ch; i++) {
        c->ch[i] = (choice){.c = c, .index = i};
        ok = compl_output_init_choice(&c->outs[i], &c->params, i) == 0;
    }
    if (!ok) {
        reply_simple_error(api, req, 500, "server_error", NULL, "out of memory");
        call_free(c);
        return;
    }
    c->stream = c->params.stream;
    snprintf(c->params.request_id, sizeof c->params.request_id, "%s", c->rid);
    c->meta.created = (int64_t)time(NULL);
    c->meta.model = api->model_name;
    if (api->cur_key) {
        if (!http_key_acquire(api->cur_key)) {
            ST_REQ_INFO(c->rid, "http: refused (429): key '%s' has %d requests queued or running",
                        http_key_name(api->cur_key), http_key_in_flight(api->cur_key));
            compl_error_set(&e, 429, "rate_limit_error", NULL, "rate_limit_exceeded",
                            "this API key already has %d requests queued or running (the per-key limit); "
                            "retry after one finishes", http_key_in_flight(api->cur_key));
            evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
            reply_error(api, req, &e);
            call_free(c);
            return;
        }
        c->key = api->cur_key;
    }
    /* Every choice is its own engine request; the first refusal refuses
     * the whole call and cancels what was already submitted. */
    int rc = COORD_OK;
    st_err err = {{0}};
    for (int i = 0; i < c->n_ch && rc == COORD_OK; i++) {
        coord_request ereq;
        int32_t *ids = NULL;
        if (compl_engine_request(&c->params, i, &api->tokenizer, &ereq, &ids, &e) != 0) {
            rc = 1;
            break;
        }
        rc = api->engine->ops->submit(api->engine->impl, &ereq, &http_sink, &c->ch[i],
                                      &c->ch[i].engine_id, &err);
        free(ids);
        if (rc == COORD_OK) {
            c->ch[i].open = true;
            c->n_open++;
        }
    }
    if (rc != COORD_OK) {
        call_cancel_open(c);
        switch (rc) {
        case 1: break; /* e is set */
        case COORD_EINVAL:
            compl_error_set(&e, 400, "invalid_request_error", NULL, NULL, "%s", err.msg);
            break;
        case COORD_ECONTEXT:
            compl_error_set(&e, 400, "invalid_request_error", "prompt", "context_length_exceeded",
                            "%s", err.msg);
            break;
        case COORD_EBUSY:
            compl_error_set(&e, 429, "rate_limit_error", NULL, "queue_full", "%s", err.msg);
            break;
        case COORD_EUNAVAIL:
            compl_error_set(&e, 503, "server_error", NULL, "unavailable", "%s", err.msg);
            break;
        default:
            compl_error_set(&e, 500, "server_error", NULL, NULL, "%s", err.msg);
        }
        ST_REQ_INFO(c->rid, "http: refused (%d): %s", e.status, e.message);
        reply_error(api, req, &e);
        call_free(c);
        return;
    }
    http_access_hold(c->acc);
    c->next = api->calls;
    if (api->calls) api->calls->prev = c;
    api->calls = c;
    api->n_active++;
    c->evcon = evhttp_request_get_connection(req);
    if (c->evcon) {
        http_conn_set_closecb(c->evcon, on_conn_close, c);
        struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
        evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
        if (fd >= 0) {
            c->watch = event_new(api->base, fd, EV_READ | EV_PERSIST, on_client_readable, c);
            if (c->watch) event_add(c->watch, NULL);
        }
    }
    char user[160] = "";
    if (c->params.user) st_log_quote(user, sizeof user, c->params.user);
    st_log_kv(ST_LOG_INFO, c->rid, "accepted",
              "kind=%s choices=%d prompt_bytes=%zu max_tokens=%d stream=%d%s%s",
              chat ? "chat" : "completion", c->n_ch, c->params.prompts[0].len,
              c->params.max_tokens, c->stream ? 1 : 0, c->params.user ? " user=" : "", user);
    if (c->stream) {
        struct evkeyvalq *h = evhttp_request_get_output_headers(req);
        evhttp_add_header(h, "Content-Type", "text/event-stream");
        evhttp_add_header(h, "Cache-Control", "no-cache");
        evhttp_send_reply_start(req, 200, "OK");
        for (int i = 0; chat && i < c->n_ch; i++) {
            char *j = compl_output_role_chunk(&c->outs[i], &c->meta);
            if (j) send_sse(c, j);
            free(j);
        }
    }
}

static void handle_completions(http_api *api, struct evhttp_request *req) {
    handle_generate(api, req, false);
}

static void handle_chat(http_api *api, struct evhttp_request *req) {
    handle_generate(api, req, true);
}

/* POST /tokenize, /detokenize: tokenize.h does the work. */
static void handle_tok_route(http_api *api, struct evhttp_request *req, bool detok) {
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    compl_error e;
    char *out = NULL;
    if (len > api->max_body) {
        compl_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                        "the request body has %zu bytes; the limit is %zu", len, api->max_body);
    } else {
        const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
        compl_limits lim = {api->n_ctx, api->model_name, api->chat_format, &api->tokenizer};
        out = detok ? api_detokenize(body, len, &lim, &e) : api_tokenize(body, len, &lim, &e);
    }
    if (out)
        reply_json(api, req, 200, out);
    else
        reply_error(api, req, &e);
    free(out);
}

static void handle_tokenize(http_api *api, struct evhttp_request *req) {
    handle_tok_route(api, req, false);
}

static void handle_detokenize(http_api *api, struct evhttp_request *req) {
    handle_tok_route(api, req, true);
}

static void handle_metrics(http_api *api, struct evhttp_request *req) {
    size_t n = 0;
    st_err err = {{0}};
    char *s = api->metrics ? coord_metrics_render(api->metrics, &n, &err) : NULL;
    if (!s) {
        reply_simple_error(api, req, 500, "server_error", NULL,
                           api->metrics ? err.msg : "metrics are not available");
        return;
    }
    reply_typed(api, req, 200, METRICS_CONTENT_TYPE, s, n);
    free(s);
}

static void handle_health(http_api *api, struct evhttp_request *req) {
    st_err err = {{0}};
    if (api->engine->ops->health && api->engine->ops->health(api->engine->impl, &err) != 0) {
        reply_simple_error(api, req, 503, "server_error", "unavailable", err.msg);
        return;
    }
    reply_json(api, req, 200, "{\"status\":\"ok\"}");
}

static void handle_stages(http_api *api, struct evhttp_request *req) {
    if (!api->engine->ops->stages_json) {
        reply_simple_error(api, req, 404, "invalid_request_error", NULL, "this engine has no stages");
        return;
    }
    char *s = api->engine->ops->stages_json(api->engine->impl);
    if (s)
        reply_json(api, req, 200, s);
    else
        reply_simple_error(api, req, 500, "server_error", NULL, "out of memory");
    free(s);
}

static void handle_models(http_api *api, struct evhttp_request *req) {
    json_t *root = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id",
                             api->model_name, "object", "model", "created", (json_int_t)0,
                             "owned_by", "strata");
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (s)
        reply_json(api, req, 200, s);
    else
        reply_simple_error(api, req, 500, "server_error", NULL, "out of memory");
    free(s);
}

/* Probes and /metrics: open unless --protect-metrics (docs/security.md). */
static bool open_route(const http_api *api, const char *path) {
    if (api->protect_metrics) return false;
    return !strcmp(path, "/health") || !strcmp(path, "/healthz") || !strcmp(path, "/livez") ||
           !strcmp(path, "/readyz") || !strcmp(path, "/metrics");
}

/* What every request passes before its route: framing, then the API key.
 * False when it has been answered. Sets api->cur_key. */
static bool admit(http_api *api, struct evhttp_request *req, const char *path) {
    api->cur_key = NULL;
    http_conns_request_read(api->conns, req);
    char msg[200];
    if (http_check_framing(evhttp_request_get_input_headers(req), msg, sizeof msg) != 0) {
        /* The body boundary is unknown: nothing after it on this connection can be trusted. */
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        reply_simple_error(api, req, 400, "invalid_request_error", "bad_framing", msg);
        return false;
    }
    if (http_keys_count(api->keys) == 0 || open_route(api, path)) return true;
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    enum http_auth_result r = http_keys_check(api->keys, auth, &api->cur_key);
    if (r == HTTP_AUTH_OK) return true;
    static st_log_limit lim = ST_LOG_LIMIT_INIT(10.0);
    unsigned long dropped = 0;
    if (st_log_limit_allow(&lim, st_now_s(), &dropped)) {
        char *peer = NULL;
        ev_uint16_t port = 0;
        struct evhttp_connection *evcon = evhttp_request_get_connection(req);
        if (evcon) evhttp_connection_get_peer(evcon, &peer, &port);
        ST_INFO("http: 401 for %s from %s:%u: %s API key (%lu more refusals since the last message)", path,
                peer ? peer : "?", (unsigned)port, r == HTTP_AUTH_MISSING ? "no" : "a wrong", dropped);
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
    reply_simple_error(api, req, 401, "invalid_request_error", "invalid_api_key",
                       r == HTTP_AUTH_MISSING
                           ? "You didn't provide an API key. Send it in an Authorization header: "
                             "'Authorization: Bearer YOUR_KEY'."
                           : "Incorrect API key provided.");
    return false;
}

static void on_request(struct evhttp_request *req, void *arg) {
    http_api *api = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    if (!path) path = "";
    /* Logged and counted when the answer is complete (access_log.h). */
    api->cur_access = http_access_start(api->access, req);
    const char *xrid = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Request-Id");
    if (request_id_valid(xrid)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "X-Request-Id", xrid);
        http_access_set_id(api->cur_access, xrid);
    }
    if (!admit(api, req, path)) {
        api->cur_access = NULL;
        return;
    }
    /* A standby coordinator (--etcd) names the leader and serves only the
     * probes (/livez 200, /readyz 503) and /metrics: clients retry, or go to
     * the leader; it does not proxy (docs/recovery.md). */
    char leader[256] = "";
    bool standby = api->engine->ops->standby && api->engine->ops->standby(api->engine->impl, leader, sizeof leader);
    if (standby && *leader) evhttp_add_header(evhttp_request_get_output_headers(req), "X-Strata-Leader", leader);
    probes_state ps = {api->engine, api->model_name, api->draining, api->retry_after_s};
    if (probes_handle(req, path, &ps)) {
        api->cur_access = NULL;
        return;
    }
    if (standby && strcmp(path, "/metrics") != 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "this coordinator is a standby; %s%s", *leader ? "the leader is " : "",
                 *leader ? leader : "a leader election is under way; retry shortly");
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        reply_simple_error(api, req, 503, "server_error", "not_leader", msg);
        api->cur_access = NULL;
        return;
    }
    struct route {
        const char *path;
        enum evhttp_cmd_type method;
        void (*fn)(http_api *, struct evhttp_request *);
    } routes[] = {
        {"/v1/completions", EVHTTP_REQ_POST, handle_completions},
        {"/v1/chat/completions", EVHTTP_REQ_POST, handle_chat},
        {"/metrics", EVHTTP_REQ_GET, handle_metrics},
        {"/health", EVHTTP_REQ_GET, handle_health},
        {"/v1/models", EVHTTP_REQ_GET, handle_models},
        {"/v1/stages", EVHTTP_REQ_GET, handle_stages},
        {"/tokenize", EVHTTP_REQ_POST, handle_tokenize},
        {"/detokenize", EVHTTP_REQ_POST, handle_detokenize},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(path, routes[i].path) != 0) continue;
        if (m != routes[i].method) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s %s is not allowed; use %s", http_method_name(m), path,
                     http_method_name(routes[i].method));
            evhttp_add_header(evhttp_request_get_output_headers(req), "Allow",
                              http_method_name(routes[i].method));
            reply_simple_error(api, req, 405, "invalid_request_error", "method_not_allowed", msg);
            api->cur_access = NULL;
            return;
        }
        routes[i].fn(api, req);
        api->cur_access = NULL;
        return;
    }
    char msg[300];
    snprintf(msg, sizeof msg, "Unknown route: %s %.200s", http_method_name(m), path);
    reply_simple_error(api, req, 404, "invalid_request_error", "not_found", msg);
    api->cur_access = NULL;
}

http_api *http_api_create(struct event_base *base, const http_api_config *cfg,
                          coord_engine *engine, st_err *err) {
    if (!base || !engine || !engine->ops || !engine->ops->submit || !engine->ops->cancel ||
        !cfg->tokenizer.encode)
        return (void)st_errf(err, "http: no event base, engine or tokenizer"), NULL;
    http_api *api = calloc(1, sizeof *api);
    if (!api) return (void)st_errf(err, "http: out of memory"), NULL;
    api->base = base;
    api->engine = engine;
    api->n_ctx = cfg->n_ctx;
    api->tokenizer = cfg->tokenizer;
    api->model_name = strdup(cfg->model_name ? cfg->model_name : "strata");
    api->chat_format = (int)chat_select(cfg->chat_template);
    ST_INFO("http: chat completions use the %s chat format",
            chat_format_name((enum chat_format)api->chat_format));
    api->metrics = coord_metrics_new(engine, cfg->model_name ? cfg->model_name : "strata", err);
    if (!api->metrics) ST_WARN("http: no /metrics: %s", err->msg);
    api->access = http_access_log_new(api->metrics);
    api->http = evhttp_new(base);
    if (!api->model_name || !api->http || !api->access) {
        http_api_destroy(api);
        return (void)st_errf(err, "http: out of memory"), NULL;
    }
    api->keys = cfg->keys;
    api->protect_metrics = cfg->protect_metrics;
    if ((cfg->tls_cert || cfg->tls_key) && !(api->tls = http_tls_new(cfg->tls_cert, cfg->tls_key, err))) {
        http_api_destroy(api);
        return NULL;
    }
    if (!(api->conns = http_conns_new(base, api->http, &cfg->conn, api->tls, api->metrics, err))) {
        http_api_destroy(api);
        return NULL;
    }
    if (getrandom(&api->salt, sizeof api->salt, 0) != (ssize_t)sizeof api->salt)
        api->salt = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
    /* Bodies up to max_body get an OpenAI-shaped 413 from handle_generate;
     * evhttp itself stops reading at the hard limit (its own HTML 413). */
    api->max_body = cfg->max_body_bytes ? cfg->max_body_bytes : (1u << 20);
    size_t hard = api->max_body < HTTP_HARD_BODY_LIMIT ? HTTP_HARD_BODY_LIMIT : api->max_body;
    evhttp_set_max_body_size(api->http, (ev_ssize_t)hard);
    evhttp_set_max_headers_size(api->http, 64 * 1024);
    evhttp_set_allowed_methods(api->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                              EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                              EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_gencb(api->http, on_request, api);
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    struct evhttp_bound_socket *sock =
        evhttp_bind_socket_with_handle(api->http, host, (ev_uint16_t)cfg->port);
    if (!sock) {
        http_api_destroy(api);
        return (void)st_errf(err, "http: cannot listen on %s:%d (in use, or a bad address)", host,
                             cfg->port),
               NULL;
    }
    http_conns_watch_listener(api->conns, sock);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            api->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            api->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    ST_INFO("http: serving %s on %s://%s:%d (%d API keys%s)", api->model_name, api->tls ? "https" : "http",
            host, api->port, http_keys_count(api->keys),
            http_keys_count(api->keys) && !api->protect_metrics ? "; /metrics and probes open" : "");
    return api;
}

void http_api_drain(http_api *api, int retry_after_s) {
    api->draining = true;
    api->retry_after_s = retry_after_s > 0 ? retry_after_s : 1;
}

bool http_api_draining(const http_api *api) { return api->draining; }

int http_api_end_all(http_api *api, const char *message) {
    int n = 0;
    while (api->calls) {
        call *c = api->calls;
        ST_REQ_WARN(c->rid, "http: ended after %d token(s): %s", c->n_tokens, message);
        compl_error e;
        compl_error_set(&e, 503, "server_error", NULL, "shutting_down", "%s", message);
        call_error(c, &e); /* cancels its open choices in the engine */
        n++;
    }
    return n;
}

void http_api_destroy(http_api *api) {
    if (!api) return;
    /* Answer what is in progress (so evhttp completes and frees it). */
    http_api_end_all(api, "the server is shutting down");
    if (api->http) evhttp_free(api->http); /* disconnects: their access lines */
    http_access_log_free(api->access);
    http_conns_free(api->conns); /* after evhttp_free, which closes the connections through it */
    http_tls_free(api->tls);
    coord_metrics_free(api->metrics);
    free(api->model_name);
    free(api);
}

int http_api_port(const http_api *api) { return api->port; }
void http_api_set_keys(http_api *api, http_keys *keys) { api->keys = keys; }
int http_api_active(const http_api *api) { return api->n_active; }
