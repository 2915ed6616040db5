/* probes.c — /livez, /healthz, /readyz and /version (probes.h). */
#include "coordinator/api/probes.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/version.h"
#include "coordinator/api/api_error.h"

static void reply(struct evhttp_request *req, int status, const char *json) {
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Cache-Control", "no-store");
    struct evbuffer *b = evbuffer_new();
    if (b) evbuffer_add_printf(b, "%s\n", json);
    evhttp_send_reply(req, status, status == 200 ? "OK" : status == 405 ? "Method Not Allowed"
                                                                        : "Service Unavailable", b);
    if (b) evbuffer_free(b);
}

static void reply_error(struct evhttp_request *req, int status, const char *code, const char *msg) {
    compl_error e;
    compl_error_set(&e, status, status == 405 ? "invalid_request_error" : "server_error", NULL, code, "%s", msg);
    char *j = compl_error_json(&e);
    reply(req, status, j ? j : "{\"error\":{\"message\":\"out of memory\"}}");
    free(j);
}

static void readyz(struct evhttp_request *req, const probes_state *st) {
    st_err err = {{0}};
    const char *code = NULL;
    char msg[ST_ERR_MSG_MAX + 32];
    if (st->draining) {
        code = "shutting_down";
        snprintf(msg, sizeof msg, "the server is shutting down (draining); admissions are closed");
    } else if (st->engine->ops->health && st->engine->ops->health(st->engine->impl, &err) != 0) {
        code = "not_ready";
        snprintf(msg, sizeof msg, "not ready: %s", err.msg);
    }
    if (!code) {
        reply(req, 200, "{\"status\":\"ready\"}");
        return;
    }
    char ra[16];
    snprintf(ra, sizeof ra, "%d", st->retry_after_s > 0 ? st->retry_after_s : 1);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", ra);
    reply_error(req, 503, code, msg);
}

static void version(struct evhttp_request *req, const probes_state *st) {
    json_t *o = json_pack("{s:s,s:s,s:s,s:s}", "version", st_version(), "git_commit", st_git_commit(),
                          "build_type", st_build_type(), "model", st->model_name ? st->model_name : "");
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s)
        reply(req, 200, s);
    else
        reply_error(req, 503, NULL, "out of memory");
    free(s);
}

bool probes_handle(struct evhttp_request *req, const char *path, const probes_state *st) {
    enum { LIVE, READY, VERSION } which;
    if (!strcmp(path, "/livez") || !strcmp(path, "/healthz"))
        which = LIVE;
    else if (!strcmp(path, "/readyz"))
        which = READY;
    else if (!strcmp(path, "/version"))
        which = VERSION;
    else
        return false;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        char msg[96];
        snprintf(msg, sizeof msg, "%s only answers GET (and HEAD)", path);
        reply_error(req, 405, "method_not_allowed", msg);
        return true;
    }
    if (which == LIVE)
        reply(req, 200, "{\"status\":\"alive\"}");
    else if (which == READY)
        readyz(req, st);
    else
        version(req, st);
    return true;
}
