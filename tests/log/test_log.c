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
    size_t n = st_log_format_line(buf, sizeof buf, &ts, ST_LOG_INFO, "coordinator", NULL, "hello");
    CHECK_EQ_STR(buf, "2023-11-14T22:13:20.123Z I [coordinator] hello\n");
    CHECK_EQ_INT(n, strlen(buf));
    st_log_format_line(buf, sizeof buf, &ts, ST_LOG_ERROR, "w1", "cmpl-42", "stage 1 lost");
    CHECK_EQ_STR(buf, "2023-11-14T22:13:20.123Z E [w1] req=cmpl-42 stage 1 lost\n");
    st_log_format_line(buf, sizeof buf, &ts, ST_LOG_WARN, "w1", "", "x");
    CHECK_EQ_STR(buf, "2023-11-14T22:13:20.123Z W [w1] x\n");
    st_log_format_line(buf, sizeof buf, &ts, ST_LOG_DEBUG, "w1", NULL, "");
    CHECK_EQ_STR(buf, "2023-11-14T22:13:20.123Z D [w1] \n");
    /* Too long: cut, still one line ending in '\n'. */
    char small[40];
    n = st_log_format_line(small, sizeof small, &ts, ST_LOG_INFO, "t", NULL, "a long message here");
    CHECK_EQ_INT(n, sizeof small - 1);
    CHECK_EQ_STR(small, "2023-11-14T22:13:20.123Z I [t] a long \n");
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
}

static void test_filtering(void) {
    char *text = capture_stderr(log_some);
    /* Strip the 25-byte timestamps ("2023-11-14T22:13:20.123Z ") line by line. */
    char got[1024] = "";
    size_t lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        lines++;
        CHECK(strlen(line) > 25 && line[4] == '-' && line[10] == 'T' && line[23] == 'Z' &&
              line[24] == ' ');
        if (strlen(line) > 25) {
            strncat(got, line + 25, sizeof got - strlen(got) - 2);
            strcat(got, "\n");
        }
    }
    CHECK_EQ_INT(lines, 5);
    CHECK_EQ_STR(got,
                 "W [tlog] warn 3\n"
                 "E [tlog] error four\n"
                 "W [tlog] req=cmpl-7 req warn 5\n"
                 "D [tlog] debug 6\n"
                 "E [tlog] req=cmpl-8 req error\n");
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
    test_filtering();
    test_journal_fields();
    test_journal_stream();
    return test_summary();
}
