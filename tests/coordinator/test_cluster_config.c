/* test_cluster_config.c — the cluster INI: a full example, defaults, placement,
 * and errors that name the line. */
#include "coordinator/config/cluster_config.h"
#include "tests/testutil.h"

#include <unistd.h>

static int parse(const char *text, coord_config *c, st_err *e) {
    return coord_config_parse(text, "c.ini", c, e);
}

/* Expects a parse failure whose message contains `want`. */
static void expect_error(const char *text, const char *want) {
    coord_config c;
    st_err e = {{0}};
    int rc = parse(text, &c, &e);
    CHECK_MSG(rc == -1, "accepted: %s", text);
    CHECK_MSG(strstr(e.msg, want) != NULL, "got '%s', want '%s'", e.msg, want);
    if (rc == 0) coord_config_free(&c);
}

/* prefix_caching = true|false (docs/kv-cache.md). */
static void test_prefix_caching_key(void) {
    coord_config c;
    st_err e;
    REQUIRE_MSG(parse("[cluster]\nmodel = m.gguf\nprefix_caching = false\n[stage.0]\naddress = 1.2.3.4:5\n",
                      &c, &e) == 0, "%s", e.msg);
    CHECK(!c.prefix_caching);
    coord_config_free(&c);
    REQUIRE_MSG(parse("[cluster]\nmodel = m.gguf\nprefix_caching = on\n[stage.0]\naddress = 1.2.3.4:5\n",
                      &c, &e) == 0, "%s", e.msg);
    CHECK(c.prefix_caching);
    coord_config_free(&c);
    expect_error("[cluster]\nmodel = m.gguf\nprefix_caching = maybe\n[stage.0]\naddress = 1.2.3.4:5\n",
                 "c.ini:3: [cluster]: prefix_caching = 'maybe': expected true or false");
}

/* worker_model and cluster_key_file (docs/security.md, data plane). */
static void test_data_plane_keys(void) {
    coord_config c;
    st_err e;
    REQUIRE_MSG(parse("[cluster]\nmodel = /m/x.gguf\nworker_model = sub/x.gguf\ncluster_key_file = /etc/k\n"
                      "[stage.0]\naddress = 1.2.3.4:5\n", &c, &e) == 0, "%s", e.msg);
    CHECK(c.worker_model && !strcmp(c.worker_model, "sub/x.gguf"));
    CHECK(c.cluster_key_file && !strcmp(c.cluster_key_file, "/etc/k"));
    coord_config_free(&c);
    REQUIRE(parse("[cluster]\nmodel = /m/x.gguf\n[stage.0]\naddress = 1.2.3.4:5\n", &c, &e) == 0);
    CHECK(!c.worker_model && !c.cluster_key_file);
    coord_config_free(&c);
    expect_error("[cluster]\nmodel = m\nworker_model = /abs/x.gguf\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: worker_model must be a relative path");
    expect_error("[cluster]\nmodel = m\nworker_model = a/../../x.gguf\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: worker_model must not contain '..'");
    expect_error("[cluster]\nmodel = m\ncluster_key_file =\n[stage.0]\naddress=a:1\n",
                 "cluster_key_file must not be empty");
}

/* gpu_memory_utilization (placement's memory model, docs/control-api.md). */
static void test_gpu_memory_utilization(void) {
    coord_config c;
    st_err e;
    REQUIRE_MSG(parse("[cluster]\nmodel = m.gguf\n[stage.0]\naddress = 1.2.3.4:5\n", &c, &e) == 0, "%s", e.msg);
    CHECK(c.gpu_memory_utilization == 0.90);
    coord_config_free(&c);
    REQUIRE_MSG(parse("[cluster]\nmodel = m.gguf\ngpu_memory_utilization = 0.75\n[stage.0]\naddress = 1.2.3.4:5\n",
                      &c, &e) == 0, "%s", e.msg);
    CHECK(c.gpu_memory_utilization == 0.75);
    coord_config_free(&c);
    expect_error("[cluster]\nmodel = m\ngpu_memory_utilization = 1.5\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: gpu_memory_utilization = '1.5': expected a fraction in (0, 1]");
    expect_error("[cluster]\nmodel = m\ngpu_memory_utilization = 0\n[stage.0]\naddress=a:1\n",
                 "expected a fraction in (0, 1]");
    expect_error("[cluster]\nmodel = m\ngpu_memory_utilization = 90%\n[stage.0]\naddress=a:1\n",
                 "expected a fraction in (0, 1]");
}

int main(void) {
    coord_config c;
    st_err e;
    test_gpu_memory_utilization();
    test_prefix_caching_key();
    test_data_plane_keys();
    const char *full =
        "; PP 2 x TP 2\n"
        "[cluster]\n"
        "model = /models/stories260K.gguf\n"
        "act_dtype = bf16\n"
        "kv_block_size = 32\n"
        "kv_blocks = 512   ; per stage\n"
        "listen = 0.0.0.0:8080\n"
        "partition = 3,2\n"
        "max_queue = 10\n"
        "\n"
        "[stage.0]\n"
        "address = 10.0.0.1:7001\n"
        "tp = 2\n"
        "[stage.1]\n"
        "address = [fe80::1]:7002\n"
        "tp = 2\n";
    REQUIRE_MSG(parse(full, &c, &e) == 0, "%s", e.msg);
    CHECK_EQ_STR(c.model, "/models/stories260K.gguf");
    CHECK_EQ_STR(c.model_name, "stories260K");
    CHECK_EQ_INT(c.act_dtype, COORD_ACT_BF16);
    CHECK_EQ_INT(c.kv_block_size, 32);
    CHECK_EQ_INT(c.kv_blocks, 512);
    CHECK_EQ_STR(c.http_host, "0.0.0.0");
    CHECK_EQ_INT(c.http_port, 8080);
    CHECK_EQ_INT(c.n_partition, 2);
    CHECK_EQ_INT(c.max_queue, 10);
    CHECK_EQ_INT(c.max_seqs, 64); /* default */
    CHECK(c.prefix_caching);       /* default on (docs/kv-cache.md) */
    CHECK_EQ_INT(c.n_stages, 2);
    CHECK_EQ_STR(c.stages[0].host, "10.0.0.1");
    CHECK_EQ_INT(c.stages[0].port, 7001);
    CHECK_EQ_INT(c.stages[0].tp, 2);
    CHECK_EQ_STR(c.stages[1].host, "fe80::1");
    CHECK_EQ_INT(c.stages[1].port, 7002);
    CHECK_EQ_INT(c.stages[1].line, 14);
    place_range r[PLACE_MAX_STAGES];
    REQUIRE_MSG(coord_config_placement(&c, 5, r, &e) == 0, "%s", e.msg);
    CHECK_EQ_INT(r[0].last, 3);
    CHECK_EQ_INT(r[1].first, 3);
    CHECK_EQ_INT(r[1].last, 5);
    CHECK(coord_config_placement(&c, 6, r, &e) == -1); /* 3+2 != 6 */
    CHECK(strstr(e.msg, "hold 5 layers but the model has 6") != NULL);
    coord_config_free(&c);

    /* Named workers in file order, per-stage layers, defaults. */
    const char *workers =
        "[cluster]\nmodel = m.gguf\nmodel_name = tiny\n"
        "[worker node-b]\naddress = hostb:7001\nlayers = 2\n"
        "[worker node-a]\naddress = hosta:7001\nlayers = 2\n"
        "[worker node-c]\naddress = hostc:7001\nlayers = 1\ntp = 4\nbackend = cuda\n";
    REQUIRE_MSG(parse(workers, &c, &e) == 0, "%s", e.msg);
    CHECK_EQ_STR(c.stages[0].backend, "");
    CHECK_EQ_STR(c.stages[2].backend, "cuda");
    CHECK_EQ_INT(c.n_stages, 3);
    CHECK_EQ_STR(c.stages[0].name, "node-b");
    CHECK_EQ_STR(c.stages[1].name, "node-a");
    CHECK_EQ_STR(c.stages[2].host, "hostc");
    CHECK_EQ_INT(c.stages[0].tp, 1);
    CHECK_EQ_INT(c.stages[2].tp, 4);
    CHECK_EQ_STR(c.model_name, "tiny");
    CHECK_EQ_INT(c.act_dtype, COORD_ACT_F32);
    CHECK_EQ_INT(c.kv_block_size, 16);
    CHECK_EQ_STR(c.http_host, "127.0.0.1");
    CHECK_EQ_INT(c.http_port, 8000);
    REQUIRE_MSG(coord_config_placement(&c, 5, r, &e) == 0, "%s", e.msg);
    CHECK_EQ_INT(r[0].last, 2);
    CHECK_EQ_INT(r[1].last, 4);
    CHECK_EQ_INT(r[2].first, 4);
    coord_config_free(&c);

    /* The HTTP API's security keys (docs/security.md) and their defaults. */
    REQUIRE_MSG(parse("[cluster]\nmodel=m\napi_key_file = /etc/strata/api-keys\nhttp_tls_cert = c.pem\n"
                      "http_tls_key = k.pem\nprotect_metrics = true\nmax_connections = 50\n"
                      "header_timeout = 5\nbody_timeout = 30\nidle_timeout = 20\nmax_requests_per_key = 0\n"
                      "[stage.0]\naddress=a:1\n", &c, &e) == 0, "%s", e.msg);
    CHECK_EQ_STR(c.api_key_file, "/etc/strata/api-keys");
    CHECK_EQ_STR(c.http_tls_cert, "c.pem");
    CHECK_EQ_STR(c.http_tls_key, "k.pem");
    CHECK_EQ_INT(c.protect_metrics, 1);
    CHECK_EQ_INT(c.max_connections, 50);
    CHECK_EQ_INT(c.header_timeout_s, 5);
    CHECK_EQ_INT(c.body_timeout_s, 30);
    CHECK_EQ_INT(c.idle_timeout_s, 20);
    CHECK_EQ_INT(c.max_requests_per_key, 0);
    coord_config_free(&c);
    REQUIRE(parse("[cluster]\nmodel=m\n[stage.0]\naddress=a:1\n", &c, &e) == 0);
    CHECK(c.api_key_file == NULL && c.http_tls_cert == NULL && c.protect_metrics == 0);
    CHECK_EQ_INT(c.max_connections, 1024);
    CHECK_EQ_INT(c.header_timeout_s, 10);
    CHECK_EQ_INT(c.body_timeout_s, 60);
    CHECK_EQ_INT(c.idle_timeout_s, 60);
    CHECK_EQ_INT(c.max_requests_per_key, 128);
    coord_config_free(&c);
    expect_error("[cluster]\nmodel = m\nprotect_metrics = yes\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: protect_metrics = 'yes': expected true or false");
    expect_error("[cluster]\nmodel = m\nheader_timeout = 0\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: header_timeout = '0': expected an integer in [1, 3600]");
    expect_error("[cluster]\nmodel = m\napi_key_file =\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: api_key_file must not be empty");

    /* Default even split when nothing is given: 5 layers over 3 -> 2,2,1. */
    REQUIRE(parse("[cluster]\nmodel=m\n[stage.0]\naddress=a:1\n[stage.1]\naddress=b:1\n"
                  "[stage.2]\naddress=c:1\n", &c, &e) == 0);
    REQUIRE(coord_config_placement(&c, 5, r, &e) == 0);
    CHECK_EQ_INT(r[0].last - r[0].first, 2);
    CHECK_EQ_INT(r[1].last - r[1].first, 2);
    CHECK_EQ_INT(r[2].last - r[2].first, 1);
    CHECK(coord_config_placement(&c, 2, r, &e) == -1); /* more stages than layers */
    coord_config_free(&c);

    /* Errors, each with its file:line. */
    expect_error("[cluster]\nmodel = m\nmodle = x\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: unknown key 'modle'");
    expect_error("[cluster]\nmodel = m\n[stage.0]\naddress=a:1\nbackend = rocm\n",
                 "c.ini:5: [stage.0]: backend 'rocm' is not cpu or cuda");
    expect_error("[cluster]\nmodel = m\n[stage.0]\naddress=a:1\ntpp = 2\n",
                 "c.ini:5: [stage.0]: unknown key 'tpp'");
    expect_error("[cluster]\nmodel = m\nact_dtype = f16\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: act_dtype = 'f16': expected f32 or bf16");
    expect_error("[cluster]\nmodel = m\nkv_blocks = -3\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: [cluster]: kv_blocks = '-3'");
    expect_error("[cluster]\nmodel = m\nkv_blocks = 12x\n[stage.0]\naddress=a:1\n",
                 "c.ini:3:");
    expect_error("[cluster]\nmodel = m\n[stage.0]\naddress=a:99999\n",
                 "c.ini:4: [stage.0]: address: 'a:99999': port must be");
    expect_error("[cluster]\nmodel = m\n[stage.0]\naddress=nohost\n",
                 "c.ini:4: [stage.0]: address: 'nohost': expected host:port");
    expect_error("[cluster]\nmodel = m\n[stage.0]\naddress=a:1\ntp = 0\n", "c.ini:5:");
    expect_error("[cluster]\nmodel = m\n[stage.0]\naddress=a:1\naddress=b:2\n",
                 "c.ini:5: [stage.0]: duplicate key 'address'");
    expect_error("[cluster]\nmodel = m\n[stag.0]\naddress=a:1\n",
                 "c.ini:3: unknown section [stag.0]");
    expect_error("[cluster]\nmodel = m\n[stage.0]\naddress=a:1\n[stage.2]\naddress=a:1\n",
                 "c.ini:5: [stage.2]: stage numbers must run from 0 to 1");
    expect_error("[cluster]\nmodel = m\n[stage.0]\naddress=a:1\n[stage.1]\ntp=2\n",
                 "c.ini:5: [stage.1]: missing key 'address'");
    expect_error("[cluster]\nmodel = m\n", "no stages");
    expect_error("[stage.0]\naddress=a:1\n", "missing section [cluster]");
    expect_error("[cluster]\nact_dtype=f32\n[stage.0]\naddress=a:1\n",
                 "c.ini:1: [cluster]: missing key 'model'");
    expect_error("[cluster]\nmodel=m\n[stage.0]\naddress=a:1\n[worker x]\naddress=b:1\n",
                 "not both");
    expect_error("[cluster]\nmodel=m\npartition=3,2\n[stage.0]\naddress=a:1\n",
                 "partition lists 2 stages but 1 are defined");
    expect_error("[cluster]\nmodel=m\npartition=3,,2\n[stage.0]\naddress=a:1\n", "c.ini:3:");
    expect_error("[cluster]\nmodel=m\n[stage.0]\naddress=a:1\nlayers=2\n[stage.1]\naddress=a:2\n",
                 "'layers' is given for 1 of 2 stages");
    expect_error("[cluster]\nmodel=m\nthis is not ini\n[stage.0]\naddress=a:1\n",
                 "c.ini:3: syntax error");
    expect_error("[cluster]\nmodel=m\n[stage.0]\naddress=a:1\n[stage.0]\ntp=2\n",
                 "c.ini:5: section [stage.0] appears twice (first at line 3)");
    expect_error("model=m\n[cluster]\n", "c.ini:1: key 'model' outside any section");

    /* From a file, and a missing file. */
    char path[] = "/tmp/strata-cfg-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, full, strlen(full)) == (ssize_t)strlen(full));
    close(fd);
    REQUIRE_MSG(coord_config_load(path, &c, &e) == 0, "%s", e.msg);
    CHECK_EQ_INT(c.n_stages, 2);
    coord_config_free(&c);
    unlink(path);
    CHECK(coord_config_load("/nonexistent/cluster.ini", &c, &e) == -1);
    CHECK(strstr(e.msg, "/nonexistent/cluster.ini: cannot open") != NULL);

    /* A line too long for the parser is an error, not a silent cut. */
    char longl[400];
    snprintf(longl, sizeof longl, "[cluster]\nmodel = %0250d\n[stage.0]\naddress=a:1\n", 7);
    expect_error(longl, "c.ini:2: line longer than");

    /* The shipped examples parse and place stories260K's 5 layers. */
    REQUIRE_MSG(coord_config_load(STRATA_SOURCE_DIR "/deploy/cluster-pp2-tp2.ini", &c, &e) == 0,
                "%s", e.msg);
    CHECK_EQ_INT(c.n_stages, 2);
    CHECK_EQ_INT(c.stages[1].port, 7002);
    CHECK_EQ_STR(c.http_host, "127.0.0.1"); /* the examples listen on loopback (docs/security.md) */
    REQUIRE(coord_config_placement(&c, 5, r, &e) == 0);
    CHECK_EQ_INT(r[0].last, 3);
    coord_config_free(&c);
    REQUIRE_MSG(coord_config_load(STRATA_SOURCE_DIR "/deploy/cluster-named-workers.ini", &c, &e) == 0,
                "%s", e.msg);
    CHECK_EQ_INT(c.n_stages, 3);
    CHECK_EQ_STR(c.stages[2].name, "node-c");
    CHECK_EQ_INT(c.act_dtype, COORD_ACT_BF16);
    CHECK_EQ_STR(c.http_host, "127.0.0.1");
    REQUIRE(coord_config_placement(&c, 5, r, &e) == 0);
    CHECK_EQ_INT(r[2].first, 4);
    coord_config_free(&c);
    CHECK(strstr(e.msg, "/nonexistent/cluster.ini: cannot open") != NULL);
    return test_summary();
}
