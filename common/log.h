/* log.h — leveled logging to stderr.
 *
 * The level comes from STRATA_LOG (error, warn, info, debug; default info) or
 * st_log_set_level(). Lines look like "2026-11-30T07:00:00.123Z I [tag] message".
 * Thread-safe: each line is written with one fwrite.
 */
#ifndef STRATA_COMMON_LOG_H
#define STRATA_COMMON_LOG_H

enum st_log_level { ST_LOG_ERROR = 0, ST_LOG_WARN = 1, ST_LOG_INFO = 2, ST_LOG_DEBUG = 3 };

void st_log_set_level(enum st_log_level level);
enum st_log_level st_log_get_level(void);
/* Sets a short tag (node or process name) printed on every line; copied. */
void st_log_set_tag(const char *tag);
void st_log(enum st_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ST_ERROR(...) st_log(ST_LOG_ERROR, __VA_ARGS__)
#define ST_WARN(...) st_log(ST_LOG_WARN, __VA_ARGS__)
#define ST_INFO(...) st_log(ST_LOG_INFO, __VA_ARGS__)
#define ST_DEBUG(...) st_log(ST_LOG_DEBUG, __VA_ARGS__)

#endif
