/* log.c — leveled stderr logging (see log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static int g_level = -1;
static char g_tag[64] = "strata";

static int level_from_env(void) {
    const char *s = getenv("STRATA_LOG");
    if (!s) return ST_LOG_INFO;
    if (!strcasecmp(s, "error")) return ST_LOG_ERROR;
    if (!strcasecmp(s, "warn")) return ST_LOG_WARN;
    if (!strcasecmp(s, "debug")) return ST_LOG_DEBUG;
    return ST_LOG_INFO;
}

void st_log_set_level(enum st_log_level level) { g_level = (int)level; }

enum st_log_level st_log_get_level(void) {
    if (g_level < 0) g_level = level_from_env();
    return (enum st_log_level)g_level;
}

void st_log_set_tag(const char *tag) { snprintf(g_tag, sizeof g_tag, "%s", tag); }

void st_log(enum st_log_level level, const char *fmt, ...) {
    if ((int)level > (int)st_log_get_level()) return;
    static const char letters[] = "EWID";
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c [%s] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, letters[level], g_tag);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    fwrite(line, 1, (size_t)n, stderr);
}
