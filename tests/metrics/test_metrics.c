/* test_metrics.c — the Prometheus registry (common/metrics.h): exact text of a
 * small registry, number formatting, name checks, exact totals under
 * concurrent updates, and `promtool check metrics` on a registry shaped like
 * the coordinator's (issue 7). promtool comes from Debian's prometheus
 * package (scripts/bootstrap); the test fails when it is missing. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/metrics.h"
#include "common/process_metrics.h"
#include "tests/testutil.h"

static void check_fmt(double v, const char *want) {
    char buf[64];
    int n = metrics_format_double(buf, sizeof buf, v);
    CHECK_EQ_STR(buf, want);
    CHECK_EQ_INT(n, strlen(want));
}

static void test_format_double(void) {
    check_fmt(0, "0");
    check_fmt(1, "1");
    check_fmt(-1, "-1");
    check_fmt(42, "42");
    check_fmt(0.1, "0.1");
    check_fmt(0.005, "0.005");
    check_fmt(2.5, "2.5");
    check_fmt(100, "100");
    check_fmt(123456, "123456");
    check_fmt(1e6, "1e+06");
    check_fmt(1234567, "1.234567e+06");
    check_fmt(0.0001, "0.0001");
    check_fmt(0.00001, "1e-05");
    check_fmt(1.5e-7, "1.5e-07");
    check_fmt(1.0 / 3.0, "0.3333333333333333");
    check_fmt(-2.75, "-2.75");
    check_fmt(NAN, "NaN");
    check_fmt(INFINITY, "+Inf");
    check_fmt(-INFINITY, "-Inf");
}

static void test_exact_render(void) {
    st_err err = {{0}};
    metrics_registry *r = metrics_registry_new(&err);
    REQUIRE(r);
    metrics_family *req = metrics_counter(r, "t_requests_total", "Requests, by status.", "status", &err);
    metrics_family *depth = metrics_gauge(r, "t_queue_depth", "Waiting \\ queued\nrequests.", NULL, &err);
    static const double bounds[] = {0.25, 1, 2.5};
    metrics_family *lat = metrics_histogram(r, "t_latency_seconds", "Latency.", "stage, worker",
                                            bounds, 3, &err);
    metrics_family *empty = metrics_gauge(r, "t_worker_up", "Unused.", "worker", &err);
    REQUIRE_MSG(req && depth && lat && empty, "%s", err.msg);

    metrics_series *ok = metrics_with(req, (const char *[]){"200"}, &err);
    metrics_counter_add(ok, 1);
    metrics_counter_add(ok, 2);
    metrics_counter_add(metrics_with(req, (const char *[]){"500"}, &err), 1);
    metrics_counter_add(metrics_with(req, (const char *[]){"a\"b\\c\nd"}, &err), 0.5);
    metrics_counter_add(ok, -5);  /* ignored: counters never go down */
    metrics_counter_add(ok, NAN); /* ignored */
    CHECK(metrics_with(req, (const char *[]){"200"}, &err) == ok);
    metrics_gauge_set(metrics_with(depth, NULL, &err), 4);
    metrics_gauge_add(metrics_with(depth, NULL, &err), -1.5);
    metrics_series *l0 = metrics_with(lat, (const char *[]){"0", "w1"}, &err);
    const double obs[] = {0.25, 0.5, 0.5, 2, 3};
    for (size_t i = 0; i < 5; i++) metrics_histogram_observe(l0, obs[i]);
    metrics_series *l1 = metrics_with(lat, (const char *[]){"1", "w2"}, &err);
    metrics_histogram_observe(l1, 0.125);
    metrics_gauge_set(ok, 99); /* wrong type: ignored */
    CHECK_EQ_INT(metrics_value(ok), 3);
    CHECK_EQ_INT(metrics_value(l0), 5);
    CHECK_NEAR(metrics_histogram_sum(l0), 6.25, 0);

    size_t len = 0;
    char *text = metrics_render(r, &len, &err);
    REQUIRE(text);
    const char *want =
        "# HELP t_requests_total Requests, by status.\n"
        "# TYPE t_requests_total counter\n"
        "t_requests_total{status=\"200\"} 3\n"
        "t_requests_total{status=\"500\"} 1\n"
        "t_requests_total{status=\"a\\\"b\\\\c\\nd\"} 0.5\n"
        "# HELP t_queue_depth Waiting \\\\ queued\\nrequests.\n"
        "# TYPE t_queue_depth gauge\n"
        "t_queue_depth 2.5\n"
        "# HELP t_latency_seconds Latency.\n"
        "# TYPE t_latency_seconds histogram\n"
        "t_latency_seconds_bucket{stage=\"0\",worker=\"w1\",le=\"0.25\"} 1\n"
        "t_latency_seconds_bucket{stage=\"0\",worker=\"w1\",le=\"1\"} 3\n"
        "t_latency_seconds_bucket{stage=\"0\",worker=\"w1\",le=\"2.5\"} 4\n"
        "t_latency_seconds_bucket{stage=\"0\",worker=\"w1\",le=\"+Inf\"} 5\n"
        "t_latency_seconds_sum{stage=\"0\",worker=\"w1\"} 6.25\n"
        "t_latency_seconds_count{stage=\"0\",worker=\"w1\"} 5\n"
        "t_latency_seconds_bucket{stage=\"1\",worker=\"w2\",le=\"0.25\"} 1\n"
        "t_latency_seconds_bucket{stage=\"1\",worker=\"w2\",le=\"1\"} 1\n"
        "t_latency_seconds_bucket{stage=\"1\",worker=\"w2\",le=\"2.5\"} 1\n"
        "t_latency_seconds_bucket{stage=\"1\",worker=\"w2\",le=\"+Inf\"} 1\n"
        "t_latency_seconds_sum{stage=\"1\",worker=\"w2\"} 0.125\n"
        "t_latency_seconds_count{stage=\"1\",worker=\"w2\"} 1\n"
        "# HELP t_worker_up Unused.\n"
        "# TYPE t_worker_up gauge\n";
    CHECK_EQ_STR(text, want);
    CHECK_EQ_INT(len, strlen(want));
    free(text);

    /* Reset drops the series; an unlabeled family keeps exporting 0. */
    metrics_family_reset(lat);
    metrics_family_reset(depth);
    text = metrics_render(r, NULL, &err);
    REQUIRE(text);
    CHECK(strstr(text, "t_latency_seconds_bucket") == NULL);
    CHECK(strstr(text, "\nt_queue_depth 0\n") != NULL);
    free(text);
    metrics_registry_free(r);
}

static void test_errors(void) {
    st_err err = {{0}};
    metrics_registry *r = metrics_registry_new(&err);
    REQUIRE(r);
    static const double b[] = {1, 2};
    static const double bad_b[] = {2, 1};
    CHECK(metrics_counter(r, "t_requests", "x", NULL, &err) == NULL);
    CHECK_EQ_STR(err.msg, "counter t_requests: name must end in _total");
    CHECK(metrics_gauge(r, "9lives", "x", NULL, &err) == NULL);
    CHECK_EQ_STR(err.msg, "invalid metric name '9lives'");
    CHECK(metrics_gauge(r, "t-dash", "x", NULL, &err) == NULL);
    CHECK(metrics_gauge(r, NULL, "x", NULL, &err) == NULL);
    CHECK(metrics_gauge(r, "t_g", "x", "__reserved", &err) == NULL);
    CHECK_EQ_STR(err.msg, "metric t_g: invalid label name '__reserved'");
    CHECK(metrics_gauge(r, "t_g", "x", "a,a", &err) == NULL);
    CHECK_EQ_STR(err.msg, "metric t_g: duplicate label 'a'");
    CHECK(metrics_gauge(r, "t_g", "x", "a,", &err) == NULL);
    CHECK(metrics_gauge(r, "t_g", "x", "a,b,c,d,e", &err) == NULL);
    CHECK(metrics_gauge(r, "t_g", "x", "bad label", &err) == NULL);
    CHECK(metrics_histogram(r, "t_h", "x", "le", b, 2, &err) == NULL);
    CHECK_EQ_STR(err.msg, "metric t_h: histograms cannot have an 'le' label");
    CHECK(metrics_histogram(r, "t_h", "x", NULL, bad_b, 2, &err) == NULL);
    CHECK_EQ_STR(err.msg, "histogram t_h: bounds must be finite and strictly increasing");
    CHECK(metrics_histogram(r, "t_h", "x", NULL, b, 0, &err) == NULL);
    CHECK(metrics_histogram(r, "t_h_count", "x", NULL, b, 2, &err) == NULL);
    CHECK_EQ_STR(err.msg, "histogram t_h_count: name must not end in _count");
    metrics_family *g = metrics_gauge(r, "t_g", "x", "a, b", &err);
    REQUIRE(g);
    CHECK(metrics_gauge(r, "t_g", "y", NULL, &err) == NULL);
    CHECK_EQ_STR(err.msg, "metric t_g registered twice");
    CHECK(metrics_with(g, (const char *[]){"x", NULL}, &err) == NULL);
    CHECK_EQ_STR(err.msg, "metric t_g: missing value for label 'b'");
    CHECK(metrics_with(g, NULL, &err) == NULL);
    metrics_gauge_set(NULL, 1); /* ignored, no crash */
    metrics_registry_free(r);
}

/* ---- concurrency -------------------------------------------------------- */

#define N_THREADS 8
#define N_ITERS 20000

typedef struct worker_arg {
    metrics_family *req, *lat, *inflight;
    metrics_registry *reg;
    int id;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    char stage[8];
    snprintf(stage, sizeof stage, "%d", a->id % 2);
    metrics_series *s200 = metrics_with(a->req, (const char *[]){"200"}, NULL);
    metrics_series *lat = metrics_with(a->lat, (const char *[]){stage}, NULL);
    metrics_series *inflight = metrics_with(a->inflight, NULL, NULL);
    for (int i = 0; i < N_ITERS; i++) {
        metrics_counter_add(s200, 1);
        /* a fresh lookup each time too, racing with series creation */
        char code[16];
        snprintf(code, sizeof code, "%d", 400 + (i % 4));
        metrics_counter_add(metrics_with(a->req, (const char *[]){code}, NULL), 1);
        metrics_histogram_observe(lat, (i % 3) * 0.5);
        metrics_gauge_add(inflight, 1);
        metrics_gauge_add(inflight, -1);
        if (i % 5000 == 0) free(metrics_render(a->reg, NULL, NULL));
    }
    return NULL;
}

static void test_concurrency(void) {
    st_err err = {{0}};
    metrics_registry *r = metrics_registry_new(&err);
    REQUIRE(r);
    static const double b[] = {0.25, 0.75};
    worker_arg args[N_THREADS];
    metrics_family *req = metrics_counter(r, "c_requests_total", "x", "status", &err);
    metrics_family *lat = metrics_histogram(r, "c_latency_seconds", "x", "stage", b, 2, &err);
    metrics_family *inflight = metrics_gauge(r, "c_in_flight", "x", NULL, &err);
    REQUIRE(req && lat && inflight);
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        args[i] = (worker_arg){req, lat, inflight, r, i};
        REQUIRE(pthread_create(&th[i], NULL, worker, &args[i]) == 0);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    CHECK_EQ_INT(metrics_value(metrics_with(req, (const char *[]){"200"}, NULL)),
                 N_THREADS * N_ITERS);
    for (int c = 400; c < 404; c++) {
        char code[16];
        snprintf(code, sizeof code, "%d", c);
        CHECK_EQ_INT(metrics_value(metrics_with(req, (const char *[]){code}, NULL)),
                     N_THREADS * N_ITERS / 4);
    }
    CHECK_EQ_INT(metrics_value(metrics_with(inflight, NULL, NULL)), 0);
    /* per stage: N_THREADS/2 threads x N_ITERS observations of 0, 0.5, 1 */
    metrics_series *s0 = metrics_with(lat, (const char *[]){"0"}, NULL);
    CHECK_EQ_INT(metrics_value(s0), N_THREADS / 2 * N_ITERS);
    char *text = metrics_render(r, NULL, &err);
    REQUIRE(text);
    /* i%3 over 0..19999: 6667 zeros, 6667 halves, 6666 ones; x4 threads;
     * sum = 4 * (6667 * 0.5 + 6666) */
    CHECK(strstr(text, "c_latency_seconds_bucket{stage=\"0\",le=\"0.25\"} 26668\n") != NULL);
    CHECK(strstr(text, "c_latency_seconds_bucket{stage=\"0\",le=\"0.75\"} 53336\n") != NULL);
    CHECK(strstr(text, "c_latency_seconds_bucket{stage=\"0\",le=\"+Inf\"} 80000\n") != NULL);
    CHECK(strstr(text, "c_latency_seconds_sum{stage=\"0\"} 39998\n") != NULL);
    CHECK(strstr(text, "c_requests_total{status=\"200\"} 160000\n") != NULL);
    free(text);
    metrics_registry_free(r);
}

/* ---- promtool ----------------------------------------------------------- */

/* The coordinator's metric set (docs/metrics.md), filled as under load. */
static void collect(metrics_registry *r, void *ud) {
    metrics_family **f = ud; /* [0] worker_state, [1] heartbeat age */
    metrics_family_reset(f[0]);
    metrics_family_reset(f[1]);
    static const char *workers[] = {"w1", "w2"};
    static const char *states[] = {"joining", "ready", "serving", "draining", "lost"};
    for (int w = 0; w < 2; w++) {
        for (int s = 0; s < 5; s++)
            metrics_gauge_set(metrics_with(f[0], (const char *[]){workers[w], states[s]}, NULL),
                              s == 2 ? 1 : 0);
        metrics_gauge_set(metrics_with(f[1], (const char *[]){workers[w]}, NULL), 0.25 * (w + 1));
    }
}

static metrics_registry *issue7_registry(metrics_family **collected, bool fill) {
    st_err err = {{0}};
    metrics_registry *r = metrics_registry_new(&err);
    REQUIRE(r);
    static const double ttft_b[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double tpot_b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
    metrics_family *req = metrics_counter(r, "strata_requests_total",
                                          "HTTP API requests answered, by status code.", "status", &err);
    metrics_family *ttft = metrics_histogram(r, "strata_time_to_first_token_seconds",
                                             "Time from request arrival to the first generated token.",
                                             NULL, ttft_b, 12, &err);
    metrics_family *tpot = metrics_histogram(r, "strata_time_per_output_token_seconds",
                                             "Time between consecutive generated tokens of a request.",
                                             NULL, tpot_b, 10, &err);
    metrics_family *prompt = metrics_counter(r, "strata_prompt_tokens_total",
                                             "Prompt tokens processed (prefill).", NULL, &err);
    metrics_family *gen = metrics_counter(r, "strata_generation_tokens_total",
                                          "Tokens generated (decode).", NULL, &err);
    metrics_family *queue = metrics_gauge(r, "strata_queue_depth",
                                          "Requests waiting for a scheduler slot.", NULL, &err);
    metrics_family *running = metrics_gauge(r, "strata_requests_running",
                                            "Requests being prefilled or decoded.", NULL, &err);
    metrics_family *kv_used = metrics_gauge(r, "strata_kv_blocks_used",
                                            "KV cache blocks held by sequences.", NULL, &err);
    metrics_family *kv_free = metrics_gauge(r, "strata_kv_blocks_free",
                                            "KV cache blocks free.", NULL, &err);
    metrics_family *busy = metrics_gauge(r, "strata_stage_busy_ratio",
                                         "Fraction of the last interval the stage spent computing.",
                                         "stage", &err);
    metrics_family *act = metrics_counter(r, "strata_stage_activation_bytes_total",
                                          "Activation bytes sent by the stage to the next hop.",
                                          "stage", &err);
    metrics_family *frames = metrics_counter(r, "strata_stage_frames_sent_total",
                                             "Data-plane frames sent by the stage.", "stage", &err);
    collected[0] = metrics_gauge(r, "strata_worker_state",
                                 "1 for the worker's current state, 0 for the others.",
                                 "worker,state", &err);
    collected[1] = metrics_gauge(r, "strata_worker_heartbeat_age_seconds",
                                 "Seconds since the worker's last heartbeat.", "worker", &err);
    REQUIRE_MSG(req && ttft && tpot && prompt && gen && queue && running && kv_used && kv_free &&
                    busy && act && frames && collected[0] && collected[1],
                "%s", err.msg);
    if (!fill) return r; /* as at start-up: labeled families have no series yet */
    metrics_registry_set_collector(r, collect, collected);

    static const char *codes[] = {"200", "400", "404", "429", "503"};
    for (int i = 0; i < 5; i++)
        metrics_counter_add(metrics_with(req, (const char *[]){codes[i]}, NULL), 100 - 19 * i);
    for (int i = 0; i < 200; i++) {
        metrics_histogram_observe(metrics_with(ttft, NULL, NULL), 0.003 * i);
        metrics_histogram_observe(metrics_with(tpot, NULL, NULL), 0.0004 * i);
    }
    metrics_counter_add(metrics_with(prompt, NULL, NULL), 12345);
    metrics_counter_add(metrics_with(gen, NULL, NULL), 67890);
    metrics_gauge_set(metrics_with(queue, NULL, NULL), 7);
    metrics_gauge_set(metrics_with(running, NULL, NULL), 64);
    metrics_gauge_set(metrics_with(kv_used, NULL, NULL), 300);
    metrics_gauge_set(metrics_with(kv_free, NULL, NULL), 724);
    for (int s = 0; s < 2; s++) {
        const char *st[] = {s ? "1" : "0"};
        metrics_gauge_set(metrics_with(busy, st, NULL), 0.8 + 0.1 * s);
        metrics_counter_add(metrics_with(act, st, NULL), 1.5e9 * (s + 1));
        metrics_counter_add(metrics_with(frames, st, NULL), 40000);
    }
    return r;
}

/* Runs promtool on text; returns its exit status and fills out (its output). */
static int run_promtool(const char *text, char *out, size_t out_size) {
    char in_path[] = "/tmp/strata-metrics-XXXXXX";
    int fd = mkstemp(in_path);
    REQUIRE(fd >= 0);
    size_t len = strlen(text);
    REQUIRE(write(fd, text, len) == (ssize_t)len);
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", in_path);
    FILE *p = popen(cmd, "r");
    REQUIRE(p);
    size_t n = fread(out, 1, out_size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    unlink(in_path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_promtool(void) {
    REQUIRE_MSG(system("command -v promtool >/dev/null 2>&1") == 0,
                "promtool not found: install Debian's prometheus package (scripts/bootstrap)");
    metrics_family *collected[2];
    st_err err = {{0}};
    char out[4096];
    metrics_registry *r = issue7_registry(collected, false);
    char *text = metrics_render(r, NULL, &err);
    REQUIRE(text);
    CHECK(strstr(text, "# TYPE strata_requests_total counter\n# HELP") != NULL);
    int rc = run_promtool(text, out, sizeof out);
    CHECK_MSG(rc == 0 && out[0] == '\0', "promtool rc %d: %s", rc, out);
    free(text);
    metrics_registry_free(r);

    r = issue7_registry(collected, true);
    text = metrics_render(r, NULL, &err);
    REQUIRE(text);
    /* The collector ran: the worker state-set is there. */
    CHECK(strstr(text, "strata_worker_state{worker=\"w2\",state=\"serving\"} 1\n") != NULL);
    CHECK(strstr(text, "strata_worker_heartbeat_age_seconds{worker=\"w2\"} 0.5\n") != NULL);
    CHECK(strstr(text, "strata_stage_activation_bytes_total{stage=\"1\"} 3e+09\n") != NULL);
    CHECK(strstr(text, "strata_time_to_first_token_seconds_bucket{le=\"+Inf\"} 200\n") != NULL);
    rc = run_promtool(text, out, sizeof out);
    CHECK_MSG(rc == 0 && out[0] == '\0', "promtool rc %d: %s", rc, out);
    free(text);
    /* A second scrape (collector resets and refills) is as valid. */
    text = metrics_render(r, NULL, &err);
    REQUIRE(text);
    rc = run_promtool(text, out, sizeof out);
    CHECK_MSG(rc == 0 && out[0] == '\0', "promtool rc %d: %s", rc, out);
    free(text);
    metrics_registry_free(r);

    /* Control: promtool does reject what we refuse to produce. */
    rc = run_promtool("# HELP bad_requests Requests.\n# TYPE bad_requests counter\nbad_requests 1\n",
                      out, sizeof out);
    CHECK_MSG(rc != 0 && strstr(out, "_total") != NULL, "promtool rc %d: %s", rc, out);
}

/* ---- collectors, merged histograms, process metrics ---------------------- */

static int n_first, n_second;
static void first_collector(metrics_registry *r, void *ud) {
    (void)r;
    n_first++;
    metrics_gauge_set(ud, n_first * 10);
}
static void second_collector(metrics_registry *r, void *ud) {
    (void)r;
    (void)ud;
    n_second++;
}

static void test_collectors_and_merge(void) {
    st_err err = {{0}};
    metrics_registry *r = metrics_registry_new(&err);
    REQUIRE(r);
    metrics_series *g = metrics_with(metrics_gauge(r, "t_g", "g", NULL, &err), NULL, &err);
    static const double b[] = {0.5, 1};
    metrics_series *h = metrics_with(metrics_histogram(r, "t_h", "h", NULL, b, 2, &err), NULL, &err);
    REQUIRE(g && h);
    metrics_registry_set_collector(r, first_collector, g);
    CHECK_EQ_INT(metrics_registry_add_collector(r, second_collector, NULL, &err), 0);
    for (int i = 2; i < METRICS_MAX_COLLECTORS; i++)
        CHECK_EQ_INT(metrics_registry_add_collector(r, second_collector, NULL, &err), 0);
    CHECK_EQ_INT(metrics_registry_add_collector(r, second_collector, NULL, &err), -1);
    /* Merged counts: per bucket (not cumulative), +Inf last; a wrong n is ignored. */
    metrics_histogram_observe(h, 0.25);
    metrics_histogram_merge(h, (const uint64_t[]){2, 0, 3}, 3, 7.5);
    metrics_histogram_merge(h, (const uint64_t[]){9, 9}, 2, 100);
    char *text = metrics_render(r, NULL, &err);
    REQUIRE(text);
    CHECK_EQ_INT(n_first, 1);
    CHECK_EQ_INT(n_second, METRICS_MAX_COLLECTORS - 1);
    CHECK(strstr(text, "t_g 10\n") != NULL);
    CHECK(strstr(text, "t_h_bucket{le=\"0.5\"} 3\nt_h_bucket{le=\"1\"} 3\nt_h_bucket{le=\"+Inf\"} 6\n"
                       "t_h_sum 7.75\nt_h_count 6\n") != NULL);
    free(text);
    metrics_registry_free(r);
}

static void test_process_metrics(void) {
    /* comm with spaces and ')' — fields count from the last ')'. */
    const char *stat = "1234 (a) b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 1 0 "
                       "5000 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0\n";
    process_facts pf = {0};
    CHECK_EQ_INT(process_facts_parse_stat(stat, 1700000000, 100, 4096, &pf), 0);
    CHECK(pf.cpu_seconds == 4.0);           /* (250 + 150) / 100 */
    CHECK(pf.start_time_s == 1700000050.0); /* btime + 5000 / 100 */
    CHECK(pf.virtual_bytes == 104857600.0);
    CHECK(pf.resident_bytes == 2560.0 * 4096);
    CHECK_EQ_INT(process_facts_parse_stat("1234 (x) S 1 2 3", 0, 100, 4096, &pf), -1);
    CHECK_EQ_INT(process_facts_parse_stat("no paren", 0, 100, 4096, &pf), -1);
    CHECK_EQ_INT(process_facts_parse_stat(stat, 0, 0, 4096, &pf), -1);
    CHECK_EQ_INT(process_facts_read(&pf), 0);
    CHECK(pf.resident_bytes > 0 && pf.virtual_bytes >= pf.resident_bytes && pf.open_fds >= 3 &&
          pf.max_fds >= pf.open_fds && pf.start_time_s > 1.6e9);

    st_err err = {{0}};
    metrics_registry *r = metrics_registry_new(&err);
    REQUIRE(r);
    CHECK_EQ_INT(process_metrics_register(r, &err), 0);
    char *text = metrics_render(r, NULL, &err);
    REQUIRE(text);
    CHECK(strstr(text, "# TYPE process_cpu_seconds_total counter\n") != NULL);
    CHECK(strstr(text, "# TYPE process_resident_memory_bytes gauge\n") != NULL);
    CHECK(strstr(text, "strata_build_info{version=\"") != NULL);
    free(text);
    metrics_registry_free(r);
}

int main(void) {
    test_format_double();
    test_exact_render();
    test_errors();
    test_concurrency();
    test_collectors_and_merge();
    test_process_metrics();
    test_promtool();
    return test_summary();
}
