/* log.h — leveled logging to stderr or, under systemd, to journald.
 *
 * The level comes from STRATA_LOG (error, warn, info, debug; default info) or
 * st_log_set_level() (the daemons' --log-level). Lines below the level are
 * dropped before formatting.
 *
 * stderr lines are logfmt: key=value pairs, values quoted ("...", with \" \\
 * \n \t \r \xNN escapes) when they hold a space, '=', '"', '\' or a control
 * byte:
 *   ts=2026-11-30T07:00:00.123Z level=info tag=strata-coordinator msg="listening"
 *   ts=... level=info tag=strata-worker node=node-b req=cmpl-42 msg="seq starts" stage=1
 * ts (UTC, ms), level, tag, node (when set), req (st_log_req / st_log_kv with
 * an id), msg, then the record's own fields (st_log_kv). Each line is written
 * with one fwrite, so threads do not interleave.
 *
 * Journald: when stderr is the journal (systemd sets $JOURNAL_STREAM to the
 * "device:inode" of that stream, see systemd.exec(5)) or STRATA_LOG_JOURNAL=1,
 * each record goes through sd_journal_sendv() with the fields
 *   MESSAGE= (the message, then st_log_kv's fields),
 *   PRIORITY= (syslog: 3 error, 4 warning, 6 info, 7 debug),
 *   SYSLOG_IDENTIFIER= (the tag), STRATA_NODE=, STRATA_STAGE= (when set),
 *   STRATA_REQUEST_ID= (st_log_req)
 * so `journalctl STRATA_REQUEST_ID=cmpl-42` follows one request across nodes.
 * STRATA_LOG_JOURNAL=0 forces stderr. When Strata is built without libsystemd,
 * journald is not running, or a journal write fails, the line goes to stderr.
 *
 * The setters are for start-up (before threads); logging itself is
 * thread-safe.
 */
#ifndef STRATA_COMMON_LOG_H
#define STRATA_COMMON_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>
#include <time.h>

enum st_log_level { ST_LOG_ERROR = 0, ST_LOG_WARN = 1, ST_LOG_INFO = 2, ST_LOG_DEBUG = 3 };

enum st_log_sink {
    ST_LOG_SINK_AUTO = 0, /* STRATA_LOG_JOURNAL, then $JOURNAL_STREAM (the default) */
    ST_LOG_SINK_STDERR,
    ST_LOG_SINK_JOURNAL,
};

void st_log_set_level(enum st_log_level level);
/* "error", "warn" (or "warning"), "info", "debug", any case -> *out; 0, or
 * -1 for anything else (NULL included). For --log-level and STRATA_LOG. */
int st_log_parse_level(const char *s, enum st_log_level *out);
enum st_log_level st_log_get_level(void);
/* True when a record at `level` would be written. */
bool st_log_enabled(enum st_log_level level);
/* Sets a short tag (process name) printed on every line and sent as
 * SYSLOG_IDENTIFIER; copied (up to 63 bytes). Default "strata". */
void st_log_set_tag(const char *tag);
/* Per-process journald fields: node name (STRATA_NODE, copied, NULL clears)
 * and stage index (STRATA_STAGE, < 0 clears). */
void st_log_set_node(const char *node);
void st_log_set_stage(int stage);
void st_log_set_sink(enum st_log_sink sink);
/* True when records go to journald: the sink resolves to JOURNAL (see
 * st_log_resolve_sink; decided on first use), Strata has libsystemd, and
 * journald's socket exists (sd_journal_send drops records silently without it). */
bool st_log_journal_active(void);

void st_log(enum st_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As st_log, tagged with a request id (NULL or "" for none). */
void st_log_req(enum st_log_level level, const char *request_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A structured record: msg (a short fixed text: "access", "finished") and
 * fields_fmt, printf-formatted into "key=value key=value" and appended as is
 * (quote free-form values with st_log_quote). request_id as st_log_req. */
void st_log_kv(enum st_log_level level, const char *request_id, const char *msg,
               const char *fields_fmt, ...) __attribute__((format(printf, 4, 5)));

/* Writes value as a logfmt value into buf (NUL-terminated, cut to fit):
 * as is when it needs no quotes, else "..." with escapes. Returns the length. */
size_t st_log_quote(char *buf, size_t size, const char *value);
/* True when value ("" and NULL included) must be quoted. */
bool st_log_needs_quotes(const char *value);

#define ST_ERROR(...) st_log(ST_LOG_ERROR, __VA_ARGS__)
#define ST_WARN(...) st_log(ST_LOG_WARN, __VA_ARGS__)
#define ST_INFO(...) st_log(ST_LOG_INFO, __VA_ARGS__)
#define ST_DEBUG(...) st_log(ST_LOG_DEBUG, __VA_ARGS__)
#define ST_REQ_ERROR(rid, ...) st_log_req(ST_LOG_ERROR, (rid), __VA_ARGS__)
#define ST_REQ_WARN(rid, ...) st_log_req(ST_LOG_WARN, (rid), __VA_ARGS__)
#define ST_REQ_INFO(rid, ...) st_log_req(ST_LOG_INFO, (rid), __VA_ARGS__)
#define ST_REQ_DEBUG(rid, ...) st_log_req(ST_LOG_DEBUG, (rid), __VA_ARGS__)

/* ---- exposed for tests -------------------------------------------------- */

/* Formats one stderr line, '\n' included, NUL-terminated; long lines are
 * cut to fit. node, request_id and fields may be NULL or "" (left out);
 * fields is appended as is. Returns the length (< size). */
size_t st_log_format_line(char *buf, size_t size, const struct timespec *ts,
                          enum st_log_level level, const char *tag, const char *node,
                          const char *request_id, const char *msg, const char *fields);

#define ST_LOG_MAX_FIELDS 6

/* The journald record for one message: iov[0..n) are "FIELD=value" strings
 * pointing into buf, ready for sd_journal_sendv(). */
typedef struct st_log_fields {
    struct iovec iov[ST_LOG_MAX_FIELDS];
    size_t n;
    char buf[4096];
} st_log_fields;

/* Fills f from the current tag, node and stage, the level, request_id
 * (optional) and msg (cut to fit buf). */
void st_log_journal_fields(st_log_fields *f, enum st_log_level level, const char *request_id,
                           const char *msg);

/* The sink for a configured one: STDERR and JOURNAL stay; AUTO becomes
 * JOURNAL when strata_log_journal (the STRATA_LOG_JOURNAL value) is set and not
 * "0", STDERR when it is "0", else JOURNAL when journal_stream ($JOURNAL_STREAM)
 * names the file open on fd (stderr). Pure: reads no environment. */
enum st_log_sink st_log_resolve_sink(enum st_log_sink configured, const char *strata_log_journal,
                                     const char *journal_stream, int fd);

/* True when journal_stream ("dev:ino", as $JOURNAL_STREAM) names the file
 * open on fd. False for NULL or malformed text. */
bool st_log_journal_stream_matches(const char *journal_stream, int fd);

#endif
