/* api_error.c — OpenAI error objects (api_error.h). */
#include "coordinator/api/api_error.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"

void compl_error_set(compl_error *e, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) {
    if (!e) return;
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *compl_error_json(const compl_error *e) {
    size_t n;
    char *msg = utf8_sanitize(e->message, strlen(e->message), &n);
    if (!msg) return NULL;
    json_t *err = json_pack("{s:s%,s:s,s:o,s:o}", "message", msg, n, "type",
                            e->type ? e->type : "invalid_request_error", "param",
                            e->param[0] ? json_string(e->param) : json_null(), "code",
                            e->code ? json_string(e->code) : json_null());
    free(msg);
    if (!err) return NULL;
    json_t *root = json_pack("{s:o}", "error", err);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}
