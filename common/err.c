/* err.c — formatting for st_err (see err.h). */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int st_errf(st_err *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int st_err_prefix(st_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[ST_ERR_MSG_MAX], old[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 3);
    strncat(err->msg, old, sizeof err->msg - n - 3);
    return -1;
}
