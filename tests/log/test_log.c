/* test_log.c — common/log.h: the stderr line format, level filtering (on the
 * real stderr, redirected to a file), the journald field list, and how the
 * sink is chosen ($JOURNAL_STREAM, STRATA_LOG_JOURNAL). No journald needed. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "tests/testutil.h"

static void test_env_level(void) {
    /* Runs first: nothing has set the level yet, so STRATA_LOG decides. */
    setenv("STRATA_LOG", "warn", 1);
    CHECK_EQ_INT(st_log_get_level(), ST_LOG_WARN);
    CHECK(st_log_enabled(ST_LOG_ERROR));
    CHECK(!st_log_enabled(ST_LOG_INFO));
    st_log_set_level(ST_LOG_DEBUG);
    CHECK_EQ_INT(st_log_get_level(), ST_LOG_DEBUG);
    CHECK(st_log_enabled(ST_LOG_DEBUG));
}

static void test_format_line(void) {
    struct timespec ts = {.tv_sec = 1700000000, .tv_nsec = 123456789}; /* 2023-11-14 22:13:20 UTC */
    char buf[256];
    size_t n = st_log_format_line(buf, sizeof buf, &ts, ST_LOG_INFO, "strata-coordinator", NULL,
                                  NULL, "hello", NULL);
    CHECK_EQ_STR(buf, "ts=2023-11-14T22:13:20.123Z level=info tag=strata-coordinator msg=hello\n");
    CHECK_EQ_INT(n, strlen(buf));
    st_log_format_line(buf, sizeof buf, &ts, ST_LOG_ERROR, "strata-worker", "w1", "cmpl-42",
                       "stage 1 lost", NULL);
    CHECK_EQ_STR(buf, "ts=2023-11-14T22:13:20.123Z level=error tag=strata-worker node=w1 "
                      "req=cmpl-42 msg=\"stage 1 lost\"\n");
    st_log_format_line(buf, sizeof buf, &ts, ST_LOG_WARN, "w", "", "", "x", "");
    CHECK_EQ_STR(buf, "ts=2023-11-14T22:13:20.123Z level=warn tag=w msg=x\n");
    st_log_format_line(buf, sizeof buf, &ts, ST_LOG_DEBUG, "w", NULL, NULL, "", NULL);
    CHECK_EQ_STR(buf, "ts=2023-11-14T22:13:20.123Z level=debug tag=w msg=\"\"\n");
    /* Structured fields follow msg as given. */
    st_log_format_line(buf, sizeof buf, &ts, ST_LOG_INFO, "c", NULL, "cmpl-1", "access",
                       "method=POST status=200");
    CHECK_EQ_STR(buf, "ts=2023-11-14T22:13:20.123Z level=info tag=c req=cmpl-1 msg=access "
                      "method=POST status=200\n");
    /* Quotes, escapes and control bytes in the message stay on one line. */
    st_log_format_line(buf, sizeof buf, &ts, ST_LOG_INFO, "c", NULL, NULL,
                       "a \"b\" c\\d\ne=f\x01", NULL);
    CHECK_EQ_STR(buf, "ts=2023-11-14T22:13:20.123Z level=info tag=c "
                      "msg=\"a \\\"b\\\" c\\\\d\\ne=f\\x01\"\n");
    /* Too long: cut, still one line ending in '\n'. */
    char small[60];
    n = st_log_format_line(small, sizeof small, &ts, ST_LOG_INFO, "t", NULL, NULL,
                           "a long message here", NULL);
    CHECK_EQ_INT(n, sizeof small - 1);
    CHECK_EQ_STR(small, "ts=2023-11-14T22:13:20.123Z level=info tag=t msg=\"a long \"\n");
    /* Tiny buffers. */
    char one[1];
    CHECK_EQ_INT(st_log_format_line(one, sizeof one, &ts, ST_LOG_INFO, "t", NULL, NULL, "m", NULL), 0);
    char two[8];
    CHECK_EQ_INT(st_log_format_line(two, sizeof two, &ts, ST_LOG_INFO, "t", "n", "r", "m", "k=v"), 7);
    CHECK_EQ_INT(strlen(two), 7);
    CHECK(two[6] == '\n');
}

static void test_quote_and_levels(void) {
    char b[64];
    CHECK_EQ_INT(st_log_quote(b, sizeof b, "plain-value_1.2"), 15);
    CHECK_EQ_STR(b, "plain-value_1.2");
    st_log_quote(b, sizeof b, "");
    CHECK_EQ_STR(b, "\"\"");
    st_log_quote(b, sizeof b, NULL);
    CHECK_EQ_STR(b, "\"\"");
    st_log_quote(b, sizeof b, "a=b");
    CHECK_EQ_STR(b, "\"a=b\"");
    st_log_quote(b, sizeof b, "tab\there");
    CHECK_EQ_STR(b, "\"tab\\there\"");
    /* Cut to fit, still closed. */
    char s[8];
    st_log_quote(s, sizeof s, "x y z w v u");
    CHECK(strlen(s) < sizeof s && s[0] == '"' && s[strlen(s) - 1] == '"');
    enum st_log_level l = ST_LOG_INFO;
    CHECK_EQ_INT(st_log_parse_level("debug", &l), 0);
    CHECK_EQ_INT(l, ST_LOG_DEBUG);
    CHECK_EQ_INT(st_log_parse_level("WARNING", &l), 0);
    CHECK_EQ_INT(l, ST_LOG_WARN);
    CHECK_EQ_INT(st_log_parse_level("Error", &l), 0);
    CHECK_EQ_INT(l, ST_LOG_ERROR);
    CHECK_EQ_INT(st_log_parse_level("verbose", &l), -1);
    CHECK_EQ_INT(st_log_parse_level("", &l), -1);
    CHECK_EQ_INT(st_log_parse_level(NULL, &l), -1);
    CHECK_EQ_INT(l, ST_LOG_ERROR);
}

/* Redirects fd 2 to a temp file, runs the logging calls, returns the text. */
static char *capture_stderr(void (*fn)(void)) {
    char path[] = "/tmp/strata-log-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    REQUIRE(saved >= 0 && dup2(fd, 2) == 2);
    fn();
    fflush(stderr);
    REQUIRE(dup2(saved, 2) == 2);
    close(saved);
    close(fd);
    char *text = test_read_file(path, NULL);
    unlink(path);
    return text;
}

static void log_some(void) {
    st_log_set_sink(ST_LOG_SINK_STDERR);
    st_log_set_tag("tlog");
    st_log_set_level(ST_LOG_WARN);
    ST_DEBUG("debug %d", 1);
    ST_INFO("info %d", 2);
    ST_WARN("warn %d", 3);
    ST_ERROR("error %s", "four");
    ST_REQ_INFO("cmpl-7", "req info");
    ST_REQ_WARN("cmpl-7", "req warn %d", 5);
    st_log_set_level(ST_LOG_DEBUG);
    ST_DEBUG("debug %d", 6);
    st_log_set_level(ST_LOG_ERROR);
    ST_WARN("warn %d", 7);
    ST_REQ_ERROR("cmpl-8", "req error");
    st_log_kv(ST_LOG_ERROR, "cmpl-9", "access", "status=%d route=%s", 500, "/v1/completions");
    st_log_kv(ST_LOG_WARN, NULL, "dropped", "n=%d", 1);
    st_log_kv(ST_LOG_ERROR, NULL, "100% sure", "%s", "");
}

static void test_filtering(void) {
    char *text = capture_stderr(log_some);
    /* Strip the "ts=2023-11-14T22:13:20.123Z " prefixes line by line. */
    char got[1024] = "";
    size_t lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        lines++;
        CHECK(strlen(line) > 28 && !strncmp(line, "ts=", 3) && line[7] == '-' && line[13] == 'T' &&
              line[26] == 'Z' && line[27] == ' ');
        if (strlen(line) > 28) {
            strncat(got, line + 28, sizeof got - strlen(got) - 2);
            strcat(got, "\n");
        }
    }
    CHECK_EQ_INT(lines, 7);
    CHECK_EQ_STR(got,
                 "level=warn tag=tlog msg=\"warn 3\"\n"
                 "level=error tag=tlog msg=\"error four\"\n"
                 "level=warn tag=tlog req=cmpl-7 msg=\"req warn 5\"\n"
                 "level=debug tag=tlog msg=\"debug 6\"\n"
                 "level=error tag=tlog req=cmpl-8 msg=\"req error\"\n"
                 "level=error tag=tlog req=cmpl-9 msg=access status=500 route=/v1/completions\n"
                 "level=error tag=tlog msg=\"100% sure\"\n");
    free(text);
}

static void check_fields(const st_log_fields *f, const char *const *want, size_t n_want) {
    CHECK_EQ_INT(f->n, n_want);
    for (size_t i = 0; i < f->n && i < n_want; i++) {
        char field[5000];
        size_t len = f->iov[i].iov_len < sizeof field - 1 ? f->iov[i].iov_len : sizeof field - 1;
        memcpy(field, f->iov[i].iov_base, len);
        field[len] = '\0';
        CHECK_EQ_STR(field, want[i]);
        /* every field lies inside the buffer */
        CHECK((const char *)f->iov[i].iov_base >= f->buf &&
              (const char *)f->iov[i].iov_base + f->iov[i].iov_len <= f->buf + sizeof f->buf);
    }
}

static void test_journal_fields(void) {
    st_log_fields f;
    st_log_set_tag("strata-coordinator");
    st_log_set_node(NULL);
    st_log_set_stage(-1);
    st_log_journal_fields(&f, ST_LOG_INFO, NULL, "hello");
    check_fields(&f, (const char *const[]){"PRIORITY=6", "SYSLOG_IDENTIFIER=strata-coordinator",
                                          "MESSAGE=hello"},
                 3);

    st_log_set_tag("strata-worker");
    st_log_set_node("node-a");
    st_log_set_stage(1);
    st_log_journal_fields(&f, ST_LOG_ERROR, "cmpl-42", "stage lost\nsecond line");
    check_fields(&f,
                 (const char *const[]){"PRIORITY=3", "SYSLOG_IDENTIFIER=strata-worker",
                                       "STRATA_NODE=node-a", "STRATA_STAGE=1",
                                       "STRATA_REQUEST_ID=cmpl-42",
                                       "MESSAGE=stage lost\nsecond line"},
                 6);
    st_log_journal_fields(&f, ST_LOG_WARN, "", "w");
    check_fields(&f, (const char *const[]){"PRIORITY=4", "SYSLOG_IDENTIFIER=strata-worker",
                                          "STRATA_NODE=node-a", "STRATA_STAGE=1", "MESSAGE=w"},
                 5);
    st_log_set_stage(0);
    st_log_journal_fields(&f, ST_LOG_DEBUG, NULL, "d");
    check_fields(&f, (const char *const[]){"PRIORITY=7", "SYSLOG_IDENTIFIER=strata-worker",
                                          "STRATA_NODE=node-a", "STRATA_STAGE=0", "MESSAGE=d"},
                 5);

    /* A huge message is cut to the buffer; the short fields all survive, and
     * a long request id is cut to 64 bytes. */
    char big[6000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char rid[100];
    memset(rid, 'r', sizeof rid - 1);
    rid[sizeof rid - 1] = '\0';
    st_log_journal_fields(&f, ST_LOG_INFO, rid, big);
    CHECK_EQ_INT(f.n, 6);
    CHECK_EQ_INT(f.iov[4].iov_len, strlen("STRATA_REQUEST_ID=") + 64);
    size_t total = 0;
    for (size_t i = 0; i < f.n; i++) total += f.iov[i].iov_len + 1;
    CHECK_EQ_INT(total, sizeof f.buf);
    CHECK(!memcmp(f.iov[5].iov_base, "MESSAGE=xxxx", 12));
    st_log_set_node(NULL);
    st_log_set_stage(-1);
}

static void test_journal_stream(void) {
    char path[] = "/tmp/strata-log-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    char js[64];
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    CHECK(st_log_journal_stream_matches(js, fd));
    char other[64];
    snprintf(other, sizeof other, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + 1);
    CHECK(!st_log_journal_stream_matches(other, fd));
    CHECK(!st_log_journal_stream_matches(NULL, fd));
    CHECK(!st_log_journal_stream_matches("", fd));
    CHECK(!st_log_journal_stream_matches("abc", fd));
    char trailing[80];
    snprintf(trailing, sizeof trailing, "%s ", js);
    CHECK(!st_log_journal_stream_matches(trailing, fd));
    CHECK(!st_log_journal_stream_matches(":12", fd));

    /* The sink decision (pure: environment values passed in). */
    CHECK_EQ_INT(st_log_resolve_sink(ST_LOG_SINK_AUTO, NULL, js, fd), ST_LOG_SINK_JOURNAL);
    CHECK_EQ_INT(st_log_resolve_sink(ST_LOG_SINK_AUTO, "", js, fd), ST_LOG_SINK_JOURNAL);
    CHECK_EQ_INT(st_log_resolve_sink(ST_LOG_SINK_AUTO, NULL, other, fd), ST_LOG_SINK_STDERR);
    CHECK_EQ_INT(st_log_resolve_sink(ST_LOG_SINK_AUTO, NULL, NULL, fd), ST_LOG_SINK_STDERR);
    CHECK_EQ_INT(st_log_resolve_sink(ST_LOG_SINK_AUTO, "0", js, fd), ST_LOG_SINK_STDERR);
    CHECK_EQ_INT(st_log_resolve_sink(ST_LOG_SINK_AUTO, "1", NULL, fd), ST_LOG_SINK_JOURNAL);
    CHECK_EQ_INT(st_log_resolve_sink(ST_LOG_SINK_STDERR, "1", js, fd), ST_LOG_SINK_STDERR);
    CHECK_EQ_INT(st_log_resolve_sink(ST_LOG_SINK_JOURNAL, "0", NULL, fd), ST_LOG_SINK_JOURNAL);
    close(fd);
    unlink(path);

    /* The live choice: STDERR always means stderr; JOURNAL means the journal
     * only with libsystemd and a running journald. */
    st_log_set_sink(ST_LOG_SINK_STDERR);
    CHECK(!st_log_journal_active());
    st_log_set_sink(ST_LOG_SINK_JOURNAL);
#ifdef STRATA_HAVE_SYSTEMD
    CHECK_EQ_INT(st_log_journal_active(), access("/run/systemd/journal/socket", W_OK) == 0);
#else
    CHECK(!st_log_journal_active());
#endif
    st_log_set_sink(ST_LOG_SINK_STDERR);
}

int main(void) {
    test_env_level();
    test_format_line();
    test_quote_and_levels();
    test_filtering();
    test_journal_fields();
    test_journal_stream();
    return test_summary();
}
