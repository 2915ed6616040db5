/* log.c — leveled logging to stderr or journald (see log.h). */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef STRATA_HAVE_SYSTEMD
#include <systemd/sd-journal.h>
#endif

/* Process-wide logging settings: set at start-up, read by every thread. */
static int g_level = -1;
static char g_tag[64] = "strata";
static char g_node[64] = "";
static int g_stage = -1;
static int g_sink = ST_LOG_SINK_AUTO;
static int g_journal = -1; /* resolved sink: 1 journal, 0 stderr, -1 not yet */

#define MSG_MAX 2048
#define JOURNAL_SOCKET "/run/systemd/journal/socket"
#define REQ_MAX 64

static int level_from_env(void) {
    enum st_log_level l = ST_LOG_INFO;
    if (st_log_parse_level(getenv("STRATA_LOG"), &l) != 0) l = ST_LOG_INFO;
    return (int)l;
}

void st_log_set_level(enum st_log_level level) { g_level = (int)level; }

enum st_log_level st_log_get_level(void) {
    if (g_level < 0) g_level = level_from_env();
    return (enum st_log_level)g_level;
}

bool st_log_enabled(enum st_log_level level) { return (int)level <= (int)st_log_get_level(); }

void st_log_set_tag(const char *tag) { snprintf(g_tag, sizeof g_tag, "%s", tag ? tag : "strata"); }

void st_log_set_node(const char *node) { snprintf(g_node, sizeof g_node, "%s", node ? node : ""); }

void st_log_set_stage(int stage) { g_stage = stage < 0 ? -1 : stage; }

void st_log_set_sink(enum st_log_sink sink) {
    g_sink = (int)sink;
    g_journal = -1;
}

bool st_log_journal_stream_matches(const char *journal_stream, int fd) {
    if (!journal_stream) return false;
    char *end;
    unsigned long long dev = strtoull(journal_stream, &end, 10);
    if (end == journal_stream || *end != ':') return false;
    const char *p = end + 1;
    unsigned long long ino = strtoull(p, &end, 10);
    if (end == p || *end != '\0') return false;
    struct stat st;
    if (fstat(fd, &st) != 0) return false;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

enum st_log_sink st_log_resolve_sink(enum st_log_sink configured, const char *strata_log_journal,
                                     const char *journal_stream, int fd) {
    if (configured == ST_LOG_SINK_JOURNAL || configured == ST_LOG_SINK_STDERR) return configured;
    if (strata_log_journal && *strata_log_journal)
        return strcmp(strata_log_journal, "0") ? ST_LOG_SINK_JOURNAL : ST_LOG_SINK_STDERR;
    return st_log_journal_stream_matches(journal_stream, fd) ? ST_LOG_SINK_JOURNAL
                                                             : ST_LOG_SINK_STDERR;
}

bool st_log_journal_active(void) {
    if (g_journal >= 0) return g_journal == 1;
    bool want = st_log_resolve_sink((enum st_log_sink)g_sink, getenv("STRATA_LOG_JOURNAL"),
                                    getenv("JOURNAL_STREAM"), STDERR_FILENO) == ST_LOG_SINK_JOURNAL;
#ifdef STRATA_HAVE_SYSTEMD
    /* sd_journal_sendv() reports success when journald is not running (its
     * socket is missing) and drops the record: keep stderr then. */
    if (want && access(JOURNAL_SOCKET, W_OK) != 0) want = false;
#else
    want = false;
#endif
    g_journal = want ? 1 : 0;
    return want;
}

bool st_log_needs_quotes(const char *v) {
    if (!v || !*v) return true;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p <= ' ' || *p == '=' || *p == '"' || *p == '\\' || *p == 0x7f) return true;
    return false;
}

size_t st_log_quote(char *buf, size_t size, const char *value) {
    if (!size) return 0;
    const char *v = value ? value : "";
    size_t n = 0;
#define PUT(c)                              \
    do {                                    \
        if (n + 1 < size) buf[n++] = (c);   \
    } while (0)
    if (!st_log_needs_quotes(v)) {
        for (const char *p = v; *p; p++) PUT(*p);
        buf[n] = '\0';
        return n;
    }
    if (size < 3) { /* no room for "" */
        buf[0] = '\0';
        return 0;
    }
    buf[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        unsigned char c = *p;
        char enc[5];
        int len;
        if (c == '"' || c == '\\') len = snprintf(enc, sizeof enc, "\\%c", c);
        else if (c == '\n') len = snprintf(enc, sizeof enc, "\\n");
        else if (c == '\t') len = snprintf(enc, sizeof enc, "\\t");
        else if (c == '\r') len = snprintf(enc, sizeof enc, "\\r");
        else if (c < ' ' || c == 0x7f) len = snprintf(enc, sizeof enc, "\\x%02x", c);
        else len = snprintf(enc, sizeof enc, "%c", c);
        /* Keep room for the closing quote and the NUL. */
        if (n + (size_t)len + 2 > size) break;
        memcpy(buf + n, enc, (size_t)len);
        n += (size_t)len;
    }
    PUT('"');
#undef PUT
    buf[n] = '\0';
    return n;
}

int st_log_parse_level(const char *s, enum st_log_level *out) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; s && i < 4; i++) {
        if (!strcasecmp(s, names[i])) {
            *out = (enum st_log_level)i;
            return 0;
        }
    }
    if (s && !strcasecmp(s, "warning")) {
        *out = ST_LOG_WARN;
        return 0;
    }
    return -1;
}

size_t st_log_format_line(char *buf, size_t size, const struct timespec *ts,
                          enum st_log_level level, const char *tag, const char *node,
                          const char *request_id, const char *msg, const char *fields) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (size < 2) {
        if (size) buf[0] = '\0';
        return 0;
    }
    struct tm tm;
    gmtime_r(&ts->tv_sec, &tm);
    size_t n = 0;
    int k = snprintf(buf, size - 1, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s tag=",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts->tv_nsec / 1000000, (unsigned)level < 4 ? names[level] : "info");
    n = k < 0 ? 0 : (size_t)k < size - 1 ? (size_t)k : size - 2;
    /* Each piece is written into what is left (keeping one byte for '\n'). */
    n += st_log_quote(buf + n, size - 1 - n, tag && *tag ? tag : "strata");
    if (node && *node && n + 7 < size - 1) {
        memcpy(buf + n, " node=", 6);
        n += 6;
        n += st_log_quote(buf + n, size - 1 - n, node);
    }
    if (request_id && *request_id && n + 6 < size - 1) {
        char rid[REQ_MAX + 1];
        snprintf(rid, sizeof rid, "%s", request_id);
        memcpy(buf + n, " req=", 5);
        n += 5;
        n += st_log_quote(buf + n, size - 1 - n, rid);
    }
    if (n + 6 < size - 1) {
        memcpy(buf + n, " msg=", 5);
        n += 5;
        n += st_log_quote(buf + n, size - 1 - n, msg ? msg : "");
    }
    if (fields && *fields && n + 2 < size - 1) {
        buf[n++] = ' ';
        k = snprintf(buf + n, size - 1 - n, "%s", fields);
        if (k > 0) n += (size_t)k < size - 1 - n ? (size_t)k : size - 2 - n;
    }
    if (n > size - 2) n = size - 2;
    buf[n++] = '\n';
    buf[n] = '\0';
    return n;
}

/* Appends "KEY=value" to f (cut to the space left in f->buf). */
static void add_field(st_log_fields *f, size_t *used, const char *key, const char *value) {
    if (f->n == ST_LOG_MAX_FIELDS || *used >= sizeof f->buf) return;
    size_t room = sizeof f->buf - *used;
    int n = snprintf(f->buf + *used, room, "%s=%s", key, value);
    if (n < 0) return;
    size_t len = (size_t)n < room ? (size_t)n : room - 1;
    f->iov[f->n].iov_base = f->buf + *used;
    f->iov[f->n].iov_len = len;
    f->n++;
    *used += len + 1;
}

void st_log_journal_fields(st_log_fields *f, enum st_log_level level, const char *request_id,
                           const char *msg) {
    static const char *prio[] = {"3", "4", "6", "7"}; /* syslog err, warning, info, debug */
    f->n = 0;
    size_t used = 0;
    char stage[16];
    /* The short fields first, so a huge message cannot crowd them out. */
    add_field(f, &used, "PRIORITY", (unsigned)level < 4 ? prio[level] : "6");
    add_field(f, &used, "SYSLOG_IDENTIFIER", g_tag);
    if (g_node[0]) add_field(f, &used, "STRATA_NODE", g_node);
    if (g_stage >= 0) {
        snprintf(stage, sizeof stage, "%d", g_stage);
        add_field(f, &used, "STRATA_STAGE", stage);
    }
    if (request_id && *request_id) {
        char rid[REQ_MAX + 1];
        snprintf(rid, sizeof rid, "%s", request_id);
        add_field(f, &used, "STRATA_REQUEST_ID", rid);
    }
    add_field(f, &used, "MESSAGE", msg);
}

static void log_v(enum st_log_level level, const char *request_id, const char *msg_fmt,
                  va_list ap, const char *fields) {
    char msg[MSG_MAX];
    vsnprintf(msg, sizeof msg, msg_fmt, ap);
#ifdef STRATA_HAVE_SYSTEMD
    if (st_log_journal_active()) {
        /* The journal keeps its own time, level and identifier: MESSAGE is
         * the message and its key=value fields. */
        char jmsg[MSG_MAX + 1024];
        if (fields && *fields)
            snprintf(jmsg, sizeof jmsg, "%s %s", msg, fields);
        st_log_fields f;
        st_log_journal_fields(&f, level, request_id, fields && *fields ? jmsg : msg);
        if (sd_journal_sendv(f.iov, (int)f.n) >= 0) return;
        /* no journald (socket missing): fall through to stderr */
    }
#endif
    char line[MSG_MAX * 2 + 1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    size_t n = st_log_format_line(line, sizeof line, &ts, level, g_tag, g_node, request_id, msg,
                                  fields);
    fwrite(line, 1, n, stderr);
}

static void log_msg(enum st_log_level level, const char *request_id, const char *fields,
                    const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_v(level, request_id, fmt, ap, fields);
    va_end(ap);
}

void st_log(enum st_log_level level, const char *fmt, ...) {
    if (!st_log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    log_v(level, NULL, fmt, ap, NULL);
    va_end(ap);
}

void st_log_req(enum st_log_level level, const char *request_id, const char *fmt, ...) {
    if (!st_log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    log_v(level, request_id, fmt, ap, NULL);
    va_end(ap);
}

void st_log_kv(enum st_log_level level, const char *request_id, const char *msg,
               const char *fields_fmt, ...) {
    if (!st_log_enabled(level)) return;
    char fields[MSG_MAX];
    va_list ap;
    va_start(ap, fields_fmt);
    vsnprintf(fields, sizeof fields, fields_fmt, ap);
    va_end(ap);
    /* msg goes through "%s" so that a '%' in it is not a conversion. */
    log_msg(level, request_id, fields, "%s", msg ? msg : "");
}
