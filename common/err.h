/* err.h — the error convention shared by every module.
 *
 * A function that can fail returns 0 on success and -1 on failure, and on
 * failure fills a caller-owned st_err with a one-line, human-readable message
 * the caller can print as is. Functions that return a pointer return NULL on
 * failure and fill the st_err the same way. `err` may be NULL: the message is
 * then dropped.
 */
#ifndef STRATA_COMMON_ERR_H
#define STRATA_COMMON_ERR_H

#include <stddef.h>

#define ST_ERR_MSG_MAX 512

typedef struct st_err {
    char msg[ST_ERR_MSG_MAX];
} st_err;

/* Formats the message into err (when non-NULL). Always returns -1 so callers
 * can write `return st_errf(err, "...", ...);`. */
int st_errf(st_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (to add context on the way up). */
int st_err_prefix(st_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
