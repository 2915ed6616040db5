/* api_error.h — an OpenAI API error: the HTTP status and the error object
 *   {"error":{"message":…,"type":…,"param":…|null,"code":…|null}}
 * Used by request validation (completions.h, chat.h) and the HTTP server. */
#ifndef STRATA_COORDINATOR_API_API_ERROR_H
#define STRATA_COORDINATOR_API_API_ERROR_H

#include "common/err.h"

/* An API error: HTTP status and the OpenAI error object. */
typedef struct compl_error {
    int status;
    char message[ST_ERR_MSG_MAX];
    const char *type;       /* "invalid_request_error", "server_error", ... */
    char param[64];         /* "" = null */
    const char *code;       /* NULL = null */
} compl_error;

void compl_error_set(compl_error *e, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{...}} as a malloc'd string (NULL on out of memory). */
char *compl_error_json(const compl_error *e);

#endif
