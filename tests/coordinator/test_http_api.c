/* test_http_api.c — the HTTP API end to end with a real client (curl, run as
 * a child process while this process runs the server's event loop) against
 * the replaying TEST DOUBLE engine: status codes, OpenAI error bodies,
 * non-streaming shapes, SSE framing ending with [DONE], return_token_ids,
 * stop strings, logprobs, echo, UTF-8 split across tokens, 413/429/503, and
 * cancellation when the client disconnects. */
#include "coordinator/api/http_api.h"
#include "tests/coordinator/replay_engine.h"
#include "tests/testutil.h"

#include <event2/event.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static struct event_base *base;
static replay_engine eng;
static http_api *api;
static char url[128];

/* ---- running curl beside the event loop ---- */

typedef struct child_out {
    char *buf;
    size_t len, cap;
    bool eof;
} child_out;

static void on_pipe(evutil_socket_t fd, short what, void *arg) {
    child_out *o = arg;
    char tmp[65536];
    ssize_t n = read(fd, tmp, sizeof tmp);
    if (n <= 0) {
        o->eof = true;
        event_base_loopbreak(base);
        return;
    }
    if (o->len + (size_t)n + 1 > o->cap) {
        o->cap = (o->len + (size_t)n + 1) * 2;
        o->buf = realloc(o->buf, o->cap);
    }
    memcpy(o->buf + o->len, tmp, (size_t)n);
    o->len += (size_t)n;
    o->buf[o->len] = '\0';
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) { event_base_loopbreak(base); }

/* Runs the loop for s seconds (lets the server notice closes, timers fire). */
static void run_loop_for(double s) {
    struct timeval tv = {(time_t)s, (suseconds_t)((s - (time_t)s) * 1e6)};
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
}

typedef struct child {
    pid_t pid;
    int fd;
} child;

/* Starts curl with the args (NULL-terminated, without "curl"); its stdout
 * ends in a pipe. -w appends the HTTP status as the last line. */
static child curl_start(const char **args) {
    const char *argv[64];
    int n = 0;
    argv[n++] = "curl";
    argv[n++] = "-s";
    argv[n++] = "-N";
    argv[n++] = "-w";
    argv[n++] = "\n%{http_code}";
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    int p[2];
    REQUIRE(pipe(p) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    child c;
    REQUIRE(posix_spawnp(&c.pid, "curl", &fa, NULL, (char *const *)argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    c.fd = p[0];
    return c;
}

/* Runs the event loop until curl's output ends; returns the HTTP status and
 * the body in *body (malloc'd). */
static int curl_wait(child ch, char **body) {
    child_out o = {0};
    o.buf = calloc(1, 1);
    struct event *ev = event_new(base, ch.fd, EV_READ | EV_PERSIST, on_pipe, &o);
    struct event *dl = evtimer_new(base, on_deadline, NULL);
    struct timeval tv = {20, 0};
    event_add(ev, NULL);
    evtimer_add(dl, &tv);
    while (!o.eof) {
        event_base_dispatch(base);
        if (!evtimer_pending(dl, NULL)) break;
    }
    REQUIRE_MSG(o.eof, "curl did not finish in 20 s");
    event_free(ev);
    event_free(dl);
    close(ch.fd);
    int st;
    waitpid(ch.pid, &st, 0);
    char *nl = strrchr(o.buf, '\n');
    int status = nl ? atoi(nl + 1) : 0;
    if (nl) *nl = '\0';
    *body = o.buf;
    return status;
}

static int curl(const char **args, char **body) { return curl_wait(curl_start(args), body); }

static int post(const char *path, const char *json, char **body) {
    char u[256];
    snprintf(u, sizeof u, "%s%s", url, path);
    const char *a[] = {"-X", "POST", "-H", "Content-Type: application/json", "--data-binary", json,
                       u, NULL};
    return curl(a, body);
}

static int get(const char *path, char **body) {
    char u[256];
    snprintf(u, sizeof u, "%s%s", url, path);
    const char *a[] = {u, NULL};
    return curl(a, body);
}

static json_t *parse(const char *s) {
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    CHECK_MSG(j != NULL, "not JSON: %s (%s)", s, e.text);
    return j;
}

static const char *jget_str(json_t *o, const char *path1, const char *path2) {
    json_t *v = json_object_get(o, path1);
    if (path2) v = json_object_get(v, path2);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Checks an OpenAI error body: status, type and param (NULL = JSON null). */
static void expect_error(const char *json, int want_status, const char *want_param) {
    char *body;
    int st = post("/v1/completions", json, &body);
    CHECK_MSG(st == want_status, "%s -> %d (want %d): %s", json, st, want_status, body);
    json_t *j = parse(body);
    if (j) {
        json_t *err = json_object_get(j, "error");
        CHECK_MSG(json_is_object(err), "no error object: %s", body);
        CHECK(json_is_string(json_object_get(err, "message")));
        CHECK_EQ_STR(jget_str(err, "type", NULL), "invalid_request_error");
        CHECK(json_object_get(err, "code") != NULL);
        json_t *p = json_object_get(err, "param");
        if (want_param)
            CHECK_MSG(json_is_string(p) && !strcmp(json_string_value(p), want_param),
                      "param for %s: %s", json, body);
        else
            CHECK_MSG(json_is_null(p), "param should be null: %s", body);
        json_decref(j);
    }
    free(body);
}

/* Splits an SSE body into its data payloads; checks the framing. */
static int sse_events(char *body, char **events, int max) {
    int n = 0;
    char *p = body;
    while (*p) {
        CHECK_MSG(strncmp(p, "data: ", 6) == 0, "bad SSE framing at: %.40s", p);
        char *end = strstr(p, "\n\n");
        REQUIRE_MSG(end != NULL, "event without blank line: %.40s", p);
        *end = '\0';
        REQUIRE(n < max);
        events[n++] = p + 6;
        p = end + 2;
    }
    return n;
}

static const int32_t script_ids[] = {10, 11, 12, 13, 14, 15, 16};
static const char *const script_pieces[] = {"Once", " upon", " a", " time", "\xC3", "\xA9", "."};

static void test_routes(void) {
    char *body;
    CHECK_EQ_INT(get("/health", &body), 200);
    CHECK(strstr(body, "\"status\":\"ok\"") != NULL);
    free(body);
    eng.unhealthy = 1;
    CHECK_EQ_INT(get("/health", &body), 503);
    CHECK(strstr(body, "replay: no placement") != NULL);
    free(body);
    eng.unhealthy = 0;
    CHECK_EQ_INT(get("/v1/models", &body), 200);
    json_t *j = parse(body);
    CHECK_EQ_STR(jget_str(json_array_get(json_object_get(j, "data"), 0), "id", NULL), "tiny");
    json_decref(j);
    free(body);
    CHECK_EQ_INT(get("/nope", &body), 404);
    j = parse(body);
    CHECK_EQ_STR(jget_str(j, "error", "code"), "not_found");
    CHECK_EQ_STR(jget_str(j, "error", "type"), "invalid_request_error");
    json_decref(j);
    free(body);
    CHECK_EQ_INT(get("/v1/completions", &body), 405);
    CHECK(strstr(body, "\"error\"") != NULL);
    free(body);
}

static void test_bad_requests(void) {
    int before = eng.submits;
    expect_error("{\"prompt\": \"hi\"", 400, NULL);  /* malformed JSON */
    expect_error("", 400, NULL);
    expect_error("[1,2]", 400, NULL);
    expect_error("{\"max_tokens\": 5}", 400, "prompt");
    expect_error("{\"prompt\": 5}", 400, "prompt");
    expect_error("{\"prompt\": [1, -2]}", 400, "prompt");        /* a negative token id */
    expect_error("{\"prompt\": [1, 2.5]}", 400, "prompt");       /* not an integer */
    expect_error("{\"prompt\": [[1, 2], \"a\"]}", 400, "prompt"); /* mixed batch */
    expect_error("{\"prompt\": []}", 400, "prompt");
    expect_error("{\"prompt\": [[]]}", 400, "prompt");
    expect_error("{\"prompt\": \"a\", \"max_tokens\": 0}", 400, "max_tokens");
    expect_error("{\"prompt\": \"a\", \"max_tokens\": -3}", 400, "max_tokens");
    expect_error("{\"prompt\": \"a\", \"max_tokens\": \"5\"}", 400, "max_tokens");
    expect_error("{\"prompt\": \"a\", \"max_tokens\": 2.5}", 400, "max_tokens");
    expect_error("{\"prompt\": \"a\", \"max_tokens\": 100000}", 400, "max_tokens"); /* > n_ctx */
    expect_error("{\"prompt\": \"a\", \"n\": 0}", 400, "n");
    expect_error("{\"prompt\": \"a\", \"n\": 200}", 400, "n");
    expect_error("{\"prompt\": \"a\", \"n\": 2, \"best_of\": 3}", 400, "best_of");
    expect_error("{\"prompt\": \"a\", \"bogus_param\": 1}", 400, "bogus_param");
    expect_error("{\"prompt\": \"a\", \"stream\": true, \"stream_options\": {\"continuous_usage_stats\": true}}",
                 400, "stream_options");
    expect_error("{\"prompt\": \"a\", \"logit_bias\": {\"x\": 1}}", 400, "logit_bias");
    expect_error("{\"prompt\": \"a\", \"logit_bias\": {\"5\": 101}}", 400, "logit_bias");
    expect_error("{\"prompt\": \"a\", \"repetition_penalty\": 0}", 400, "repetition_penalty");
    expect_error("{\"prompt\": \"a\", \"min_tokens\": 99, \"max_tokens\": 4}", 400, "min_tokens");
    expect_error("{\"prompt\": \"a\", \"stop_token_ids\": [-1]}", 400, "stop_token_ids");
    expect_error("{\"prompt\": \"a\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop");
    expect_error("{\"prompt\": \"a\", \"stop\": 5}", 400, "stop");
    expect_error("{\"prompt\": \"a\", \"stop\": [\"\"]}", 400, "stop");
    expect_error("{\"prompt\": \"a\", \"stream\": \"yes\"}", 400, "stream");
    expect_error("{\"prompt\": \"a\", \"temperature\": 3}", 400, "temperature");
    expect_error("{\"prompt\": \"a\", \"temperature\": \"hot\"}", 400, "temperature");
    expect_error("{\"prompt\": \"a\", \"top_p\": -0.1}", 400, "top_p");
    expect_error("{\"prompt\": \"a\", \"top_k\": -2}", 400, "top_k");
    expect_error("{\"prompt\": \"a\", \"min_p\": 1.5}", 400, "min_p");
    expect_error("{\"prompt\": \"a\", \"seed\": \"x\"}", 400, "seed");
    expect_error("{\"prompt\": \"a\", \"logprobs\": 6}", 400, "logprobs");
    expect_error("{\"prompt\": \"a\", \"presence_penalty\": 2.5}", 400, "presence_penalty");
    expect_error("{\"prompt\": \"a\", \"frequency_penalty\": -9}", 400, "frequency_penalty");
    expect_error("{\"prompt\": \"a\", \"return_token_ids\": 1}", 400, "return_token_ids");
    expect_error("{\"prompt\": \"a\", \"user\": 7}", 400, "user");
    expect_error("{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": true}}", 400,
                 "stream_options");
    expect_error("{\"prompt\": \"\xff\xfe\"}", 400, NULL); /* invalid UTF-8 */
    CHECK_EQ_INT(eng.submits, before); /* none reached the engine */

    /* Unknown model: 404 model_not_found. */
    char *body;
    CHECK_EQ_INT(post("/v1/completions", "{\"prompt\":\"a\",\"model\":\"gpt-4\"}", &body), 404);
    CHECK(strstr(body, "model_not_found") != NULL);
    free(body);

    /* The engine's verdicts: context (400), busy (429). */
    char big[400];
    memset(big, 'x', sizeof big);
    snprintf(big, sizeof big, "{\"prompt\":\"%0300d\",\"max_tokens\":10}", 0);
    CHECK_EQ_INT(post("/v1/completions", big, &body), 400);
    CHECK(strstr(body, "context_length_exceeded") != NULL);
    free(body);
    eng.busy = 1;
    CHECK_EQ_INT(post("/v1/completions", "{\"prompt\":\"a\"}", &body), 429);
    CHECK(strstr(body, "\"type\":\"rate_limit_error\"") != NULL);
    free(body);
    eng.busy = 0;

    /* Body over the limit: 413. */
    char path[] = "/tmp/strata-big-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    size_t n = 2u << 20;
    char *huge = malloc(n);
    memset(huge, ' ', n);
    memcpy(huge, "{\"prompt\":\"", 11);
    memcpy(huge + n - 2, "\"}", 2);
    REQUIRE(write(fd, huge, n) == (ssize_t)n);
    close(fd);
    free(huge);
    char at[64], u[256];
    snprintf(at, sizeof at, "@%s", path);
    snprintf(u, sizeof u, "%s/v1/completions", url);
    const char *a[] = {"-X", "POST", "--data-binary", at, u, NULL};
    CHECK_EQ_INT(curl(a, &body), 413);
    free(body);
    unlink(path);
    CHECK_EQ_INT(http_api_active(api), 0);
}

static void test_non_streaming(void) {
    char *body;
    int st = post("/v1/completions",
                  "{\"model\":\"tiny\",\"prompt\":\"Hi\",\"max_tokens\":3,\"return_token_ids\":true,"
                  "\"temperature\":0,\"seed\":7,\"user\":\"u1\"}",
                  &body);
    CHECK_EQ_INT(st, 200);
    json_t *j = parse(body);
    REQUIRE(j);
    CHECK(strncmp(jget_str(j, "id", NULL), "cmpl-", 5) == 0);
    CHECK_EQ_STR(jget_str(j, "object", NULL), "text_completion");
    CHECK_EQ_STR(jget_str(j, "model", NULL), "tiny");
    CHECK(json_integer_value(json_object_get(j, "created")) > 1600000000);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "choices")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(c, "index")), 0);
    CHECK_EQ_STR(jget_str(c, "text", NULL), "Once upon a");
    CHECK_EQ_STR(jget_str(c, "finish_reason", NULL), "length");
    CHECK(json_is_null(json_object_get(c, "logprobs")));
    json_t *ids = json_object_get(c, "token_ids");
    CHECK_EQ_INT(json_array_size(ids), 3);
    CHECK_EQ_INT(json_integer_value(json_array_get(ids, 0)), 10);
    CHECK_EQ_INT(json_integer_value(json_array_get(ids, 2)), 12);
    json_t *pids = json_object_get(c, "prompt_token_ids");
    CHECK_EQ_INT(json_array_size(pids), 3); /* BOS + 'H' + 'i' */
    CHECK_EQ_INT(json_integer_value(json_array_get(pids, 1)), 'H' + 3);
    json_t *u = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")), 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")), 6);
    json_decref(j);
    free(body);

    /* The whole script: finish "stop", é joined from two tokens, no token_ids. */
    CHECK_EQ_INT(post("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":50}", &body), 200);
    j = parse(body);
    c = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_EQ_STR(jget_str(c, "text", NULL), "Once upon a time\xC3\xA9.");
    CHECK_EQ_STR(jget_str(c, "finish_reason", NULL), "stop");
    CHECK(json_object_get(c, "token_ids") == NULL);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 7);
    json_decref(j);
    free(body);

    /* A stop string ends it early and cancels the sequence. */
    int cancels = eng.cancels;
    CHECK_EQ_INT(post("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":50,\"stop\":[\"zz\",\" a\"]}", &body), 200);
    j = parse(body);
    c = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_EQ_STR(jget_str(c, "text", NULL), "Once upon");
    CHECK_EQ_STR(jget_str(c, "finish_reason", NULL), "stop");
    CHECK_EQ_INT(eng.cancels, cancels + 1);
    json_decref(j);
    free(body);

    /* echo and logprobs. */
    CHECK_EQ_INT(post("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":2,\"echo\":true}", &body), 200);
    j = parse(body);
    CHECK_EQ_STR(jget_str(json_array_get(json_object_get(j, "choices"), 0), "text", NULL), "HiOnce upon");
    json_decref(j);
    free(body);
    CHECK_EQ_INT(post("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":2,\"logprobs\":1}", &body), 200);
    j = parse(body);
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    CHECK_EQ_INT(json_array_size(json_object_get(lp, "tokens")), 2);
    CHECK_EQ_STR(json_string_value(json_array_get(json_object_get(lp, "tokens"), 1)), " upon");
    CHECK_NEAR(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 1)), -0.5, 1e-6);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 1)), 4);
    json_t *top = json_array_get(json_object_get(lp, "top_logprobs"), 0);
    CHECK_EQ_INT(json_object_size(top), 1); /* logprobs: 1 -> one alternative */
    CHECK_NEAR(json_real_value(json_object_get(top, "Once")), -0.25, 1e-6);
    json_decref(j);
    free(body);

    /* An engine failure mid-way: 500, OpenAI-shaped. */
    eng.fail_after = 2;
    CHECK_EQ_INT(post("/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":5}", &body), 500);
    CHECK(strstr(body, "replay: stage lost") != NULL);
    free(body);
    eng.fail_after = 0;
    CHECK_EQ_INT(http_api_active(api), 0);
    CHECK_EQ_INT(eng.active, 0);
}

static void test_streaming(void) {
    char *body;
    int st = post("/v1/completions",
                  "{\"prompt\":\"Hi\",\"max_tokens\":6,\"stream\":true,\"return_token_ids\":true,"
                  "\"stream_options\":{\"include_usage\":true}}",
                  &body);
    CHECK_EQ_INT(st, 200);
    char *ev[64];
    int n = sse_events(body, ev, 64);
    /* 4 word tokens, the 2 halves of é in one chunk, the final chunk, usage, [DONE]. */
    CHECK_EQ_INT(n, 8);
    CHECK_EQ_STR(ev[n - 1], "[DONE]");
    char text[256] = "";
    int n_ids = 0;
    const char *id0 = NULL;
    json_t *first = NULL;
    for (int i = 0; i < n - 1; i++) {
        json_t *j = parse(ev[i]);
        if (!j) continue;
        CHECK_EQ_STR(jget_str(j, "object", NULL), "text_completion");
        if (!id0) {
            first = j;
            id0 = jget_str(j, "id", NULL);
        } else {
            CHECK_EQ_STR(jget_str(j, "id", NULL), id0); /* one id for the stream */
        }
        json_t *choices = json_object_get(j, "choices");
        if (i == n - 2) { /* the usage chunk */
            CHECK_EQ_INT(json_array_size(choices), 0);
            json_t *u = json_object_get(j, "usage");
            CHECK_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")), 3);
            CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), 6);
        } else {
            json_t *c = json_array_get(choices, 0);
            strcat(text, jget_str(c, "text", NULL));
            json_t *ids = json_object_get(c, "token_ids");
            CHECK(json_is_array(ids));
            n_ids += (int)json_array_size(ids);
            CHECK(json_is_null(json_object_get(j, "usage")));
            CHECK_EQ_INT(json_object_get(c, "prompt_token_ids") != NULL, i == 0);
            if (i == n - 3)
                CHECK_EQ_STR(jget_str(c, "finish_reason", NULL), "length");
            else
                CHECK(json_is_null(json_object_get(c, "finish_reason")));
            if (i == 4) { /* the é chunk carries both of its ids */
                CHECK_EQ_STR(jget_str(c, "text", NULL), "\xC3\xA9");
                CHECK_EQ_INT(json_array_size(ids), 2);
            }
        }
        if (j != first) json_decref(j);
    }
    json_decref(first);
    CHECK_EQ_STR(text, "Once upon a time\xC3\xA9");
    CHECK_EQ_INT(n_ids, 6);
    free(body);

    /* A stop string split across tokens is held back, then cut. */
    CHECK_EQ_INT(post("/v1/completions",
                      "{\"prompt\":\"Hi\",\"max_tokens\":9,\"stream\":true,\"stop\":\"n a t\"}",
                      &body),
                 200);
    n = sse_events(body, ev, 64);
    text[0] = '\0';
    for (int i = 0; i < n - 1; i++) {
        json_t *j = parse(ev[i]);
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        strcat(text, jget_str(c, "text", NULL));
        if (i == n - 2) CHECK_EQ_STR(jget_str(c, "finish_reason", NULL), "stop");
        json_decref(j);
    }
    CHECK_EQ_STR(text, "Once upo");
    CHECK_EQ_STR(ev[n - 1], "[DONE]");
    free(body);
    CHECK_EQ_INT(http_api_active(api), 0);
}

static void test_disconnect(void) {
    /* A slow stream; curl gives up after 0.3 s. */
    eng.interval_s = 0.1;
    static int32_t ids[100];
    static const char *pieces[100];
    for (int i = 0; i < 100; i++) {
        ids[i] = 100 + i;
        pieces[i] = " tok";
    }
    eng.script_ids = ids;
    eng.script_pieces = pieces;
    eng.n_script = 100;
    int cancels = eng.cancels;
    char u[256];
    snprintf(u, sizeof u, "%s/v1/completions", url);
    const char *a[] = {"--max-time", "0.3", "-X", "POST", "--data-binary",
                       "{\"prompt\":\"Hi\",\"max_tokens\":100,\"stream\":true}", u, NULL};
    char *body;
    curl(a, &body);
    CHECK(strstr(body, "data: {") != NULL); /* it had started streaming */
    CHECK(strstr(body, "[DONE]") == NULL);
    free(body);
    run_loop_for(0.3);
    CHECK_EQ_INT(eng.cancels, cancels + 1);
    CHECK_EQ_INT(eng.active, 0);
    CHECK_EQ_INT(http_api_active(api), 0);

    /* The same for a non-streaming request. */
    const char *b[] = {"--max-time", "0.3", "-X", "POST", "--data-binary",
                       "{\"prompt\":\"Hi\",\"max_tokens\":100}", u, NULL};
    curl(b, &body);
    free(body);
    run_loop_for(0.3);
    CHECK_EQ_INT(eng.cancels, cancels + 2);
    CHECK_EQ_INT(eng.active, 0);
    CHECK_EQ_INT(http_api_active(api), 0);

    /* The server keeps serving. */
    eng.interval_s = 0.001;
    CHECK_EQ_INT(get("/health", &body), 200);
    free(body);
}

/* Destroying the server with requests in flight cancels them. */
static void test_destroy_in_flight(void) {
    eng.interval_s = 0.2;
    int cancels = eng.cancels;
    char u[256];
    snprintf(u, sizeof u, "%s/v1/completions", url);
    const char *a[] = {"--max-time", "5", "-X", "POST", "--data-binary",
                       "{\"prompt\":\"Hi\",\"max_tokens\":100,\"stream\":true}", u, NULL};
    const char *b[] = {"--max-time", "5", "-X", "POST", "--data-binary",
                       "{\"prompt\":\"Hi\",\"max_tokens\":100}", u, NULL};
    child c1 = curl_start(a), c2 = curl_start(b);
    for (int i = 0; i < 50 && http_api_active(api) < 2; i++) run_loop_for(0.05);
    CHECK_EQ_INT(http_api_active(api), 2);
    http_api_destroy(api);
    api = NULL;
    CHECK_EQ_INT(eng.cancels, cancels + 2);
    CHECK_EQ_INT(eng.active, 0);
    char *body;
    curl_wait(c1, &body);
    free(body);
    curl_wait(c2, &body);
    free(body);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    REQUIRE(base);
    replay_engine_init(&eng, base);
    eng.script_ids = script_ids;
    eng.script_pieces = script_pieces;
    eng.n_script = 7;
    eng.n_ctx = 256;
    coord_engine ce = replay_engine_iface(&eng);
    http_api_config cfg = {.host = "127.0.0.1", .max_body_bytes = 1u << 20, .model_name = "tiny", .n_ctx = 256,
                           .tokenizer = replay_tokenizer()};
    st_err err;
    api = http_api_create(base, &cfg, &ce, &err);
    REQUIRE_MSG(api, "%s", err.msg);
    REQUIRE(http_api_port(api) > 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", http_api_port(api));

    /* A second server on the same port is refused with a message. */
    http_api_config dup = cfg;
    dup.port = http_api_port(api);
    CHECK(http_api_create(base, &dup, &ce, &err) == NULL);
    CHECK(strstr(err.msg, "cannot listen") != NULL);

    test_routes();
    test_bad_requests();
    test_non_streaming();
    test_streaming();
    test_disconnect();
    test_destroy_in_flight();

    replay_engine_free(&eng);
    event_base_free(base);
    return test_summary();
}
