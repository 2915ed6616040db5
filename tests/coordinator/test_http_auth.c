/* test_http_auth.c — API key files (http_auth.h), the Bearer check, per-key
 * limits, and the request framing rules (http_framing.h). */
#include <sys/queue.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/api/http_auth.h"
#include "coordinator/api/http_framing.h"
#include "tests/testutil.h"

static char dir[] = "/tmp/strata-auth-XXXXXX";

static const char *write_file(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void expect_load_error(const char *text, const char *want) {
    st_err e = {{0}};
    http_keys *k = http_keys_load(write_file("bad", text), NULL, 0, &e);
    CHECK_MSG(k == NULL && strstr(e.msg, want), "want '%s', got '%s'", want, e.msg);
    CHECK_MSG(!strstr(e.msg, "sk-"), "the message shows no key: %s", e.msg);
    http_keys_free(k);
}

static int framing(const char *const *kv) {
    struct evkeyvalq h;
    TAILQ_INIT(&h);
    for (int i = 0; kv[i]; i += 2) evhttp_add_header(&h, kv[i], kv[i + 1]);
    char msg[200];
    int rc = http_check_framing(&h, msg, sizeof msg);
    evhttp_clear_headers(&h);
    return rc;
}

int main(void) {
    REQUIRE(mkdtemp(dir));
    st_err e = {{0}};

    /* Named and unnamed keys, comments, blank lines, white space, the env key. */
    const char *path = write_file("keys", "# keys\n\nalice:sk-alice-123456\n  sk-plain-987654  \n"
                                          "team.b_2: sk-team-b-000000\n");
    http_keys *k = http_keys_load(path, "sk-from-env-555", 2, &e);
    REQUIRE_MSG(k, "%s", e.msg);
    CHECK_EQ_INT(http_keys_count(k), 4);
    http_key *key = NULL;
    CHECK(http_keys_check(k, "Bearer sk-alice-123456", &key) == HTTP_AUTH_OK);
    CHECK_EQ_STR(http_key_name(key), "alice");
    CHECK(http_keys_check(k, "bearer   sk-plain-987654 ", &key) == HTTP_AUTH_OK);
    CHECK_EQ_STR(http_key_name(key), "key-4");
    CHECK(http_keys_check(k, "Bearer sk-team-b-000000", &key) == HTTP_AUTH_OK);
    CHECK_EQ_STR(http_key_name(key), "team.b_2");
    CHECK(http_keys_check(k, "Bearer sk-from-env-555", &key) == HTTP_AUTH_OK);
    CHECK_EQ_STR(http_key_name(key), "env");
    CHECK(http_keys_check(k, NULL, &key) == HTTP_AUTH_MISSING && key == NULL);
    CHECK(http_keys_check(k, "", &key) == HTTP_AUTH_MISSING);
    CHECK(http_keys_check(k, "Bearer", &key) == HTTP_AUTH_MISSING);
    CHECK(http_keys_check(k, "Bearer   ", &key) == HTTP_AUTH_MISSING);
    CHECK(http_keys_check(k, "Basic sk-alice-123456", &key) == HTTP_AUTH_MISSING);
    CHECK(http_keys_check(k, "Bearersk-alice-123456", &key) == HTTP_AUTH_MISSING);
    CHECK(http_keys_check(k, "Bearer sk-alice-12345", &key) == HTTP_AUTH_WRONG && key == NULL);
    CHECK(http_keys_check(k, "Bearer sk-alice-1234567", &key) == HTTP_AUTH_WRONG);
    CHECK(http_keys_check(k, "Bearer alice:sk-alice-123456", &key) == HTTP_AUTH_WRONG);

    /* Per-key limit 2: the third is refused until one is released. */
    REQUIRE(http_keys_check(k, "Bearer sk-alice-123456", &key) == HTTP_AUTH_OK);
    CHECK(http_key_acquire(key));
    CHECK(http_key_acquire(key));
    CHECK(!http_key_acquire(key));
    CHECK_EQ_INT(http_key_in_flight(key), 2);
    http_key *other = NULL;
    REQUIRE(http_keys_check(k, "Bearer sk-team-b-000000", &other) == HTTP_AUTH_OK);
    CHECK(http_key_acquire(other)); /* another key is not affected */
    http_key_release(key);
    CHECK(http_key_acquire(key));
    for (int i = 0; i < 2; i++) http_key_release(key); /* every acquire is released, as calls do */
    http_key_release(other);
    CHECK_EQ_INT(http_key_in_flight(key), 0);
    http_keys_free(k);

    /* A reload retires a table: it stays valid while a key acquired from it
     * is held, and is freed at its release (ASan checks both). */
    k = http_keys_load(path, NULL, 2, &e);
    REQUIRE(k && http_keys_check(k, "Bearer sk-alice-123456", &key) == HTTP_AUTH_OK);
    CHECK(http_key_acquire(key));
    http_keys *k2 = http_keys_load(path, NULL, 2, &e);
    REQUIRE(k2);
    http_keys_free(k); /* retired, one key held */
    CHECK_EQ_STR(http_key_name(key), "alice");
    CHECK_EQ_INT(http_key_in_flight(key), 1);
    REQUIRE(http_keys_check(k2, "Bearer sk-alice-123456", &other) == HTTP_AUTH_OK);
    CHECK(other != key);
    CHECK_EQ_INT(http_key_in_flight(other), 0); /* the new table counts afresh */
    http_key_release(key);                      /* frees the old table */
    http_keys_free(k2);

    /* 0 = no limit. */
    k = http_keys_load(NULL, "sk-from-env-555", 0, &e);
    REQUIRE(k && http_keys_check(k, "Bearer sk-from-env-555", &key) == HTTP_AUTH_OK);
    for (int i = 0; i < 1000; i++) CHECK(http_key_acquire(key));
    for (int i = 0; i < 1000; i++) http_key_release(key);
    http_keys_free(k);

    /* No source: no keys (authentication off). */
    k = http_keys_load(NULL, NULL, 0, &e);
    REQUIRE(k);
    CHECK_EQ_INT(http_keys_count(k), 0);
    http_keys_free(k);

    /* Errors: named by file and line, never showing the key. */
    expect_load_error("", "no key in the file");
    expect_load_error("# only a comment\n", "no key in the file");
    expect_load_error("sk-short\nsk-x\n", ":2: not a key");
    expect_load_error("alice:sk-has space-1\n", ":1: not a key");
    expect_load_error("a:sk-same-key-0000\nb:sk-same-key-0000\n", ":2: the same key as 'a'");
    expect_load_error("a:sk-key-one-0000\na:sk-key-two-0000\n", ":2: the key name 'a' is used twice");
    CHECK(http_keys_load("/nonexistent/keys", NULL, 0, &e) == NULL && strstr(e.msg, "/nonexistent/keys"));
    CHECK(http_keys_load(NULL, "short", 0, &e) == NULL && strstr(e.msg, "STRATA_API_KEY"));

    /* Framing. */
    CHECK(framing((const char *[]){"Host", "x", NULL}) == 0);
    CHECK(framing((const char *[]){"Content-Length", "15", NULL}) == 0);
    CHECK(framing((const char *[]){"Content-Length", "15", "content-length", "15", NULL}) == 0);
    CHECK(framing((const char *[]){"Content-Length", "15", "Content-Length", "20", NULL}) == -1);
    CHECK(framing((const char *[]){"Content-Length", "1x", NULL}) == -1);
    CHECK(framing((const char *[]){"Content-Length", "-1", NULL}) == -1);
    CHECK(framing((const char *[]){"Content-Length", "", NULL}) == -1);
    CHECK(framing((const char *[]){"Content-Length", "99999999999999999999", NULL}) == -1);
    CHECK(framing((const char *[]){"Transfer-Encoding", "chunked", NULL}) == 0);
    CHECK(framing((const char *[]){"Transfer-Encoding", "Chunked", NULL}) == 0);
    CHECK(framing((const char *[]){"Transfer-Encoding", "chunked", "Content-Length", "3", NULL}) == -1);
    CHECK(framing((const char *[]){"Transfer-Encoding", "gzip, chunked", NULL}) == -1);
    CHECK(framing((const char *[]){"Transfer-Encoding", "chunked", "Transfer-Encoding", "chunked", NULL}) == -1);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return test_summary();
}
