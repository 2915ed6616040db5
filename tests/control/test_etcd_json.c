/* test_etcd_json.c — etcd's v3 JSON gateway messages (coordinator/control/
 * etcd_json.h): base64, the requests' shapes, etcd 3.4's answers (int64 as
 * strings, zero fields left out) and broken ones (clear errors); and the
 * client (etcd_client.h) against a fake gateway on loopback that answers
 * garbage, HTTP errors and nothing, and against a closed port. */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/control/etcd_client.h"
#include "coordinator/control/etcd_json.h"
#include "tests/testutil.h"

#define LEN(s) (sizeof(s) - 1)

static void test_b64(void) {
    char *b = etcd_b64("/strata/default/leader", 22);
    CHECK_EQ_STR(b, "L3N0cmF0YS9kZWZhdWx0L2xlYWRlcg==");
    size_t n = 0;
    char *d = etcd_unb64(b, &n);
    CHECK_EQ_INT((int)n, 22);
    CHECK_EQ_STR(d, "/strata/default/leader");
    free(b), free(d);
    const char bin[] = {0, (char)0xff, 'a'};
    b = etcd_b64(bin, 3);
    d = etcd_unb64(b, &n);
    CHECK(n == 3 && !memcmp(d, bin, 3));
    free(b), free(d);
    d = etcd_unb64("", &n);
    CHECK(d && n == 0);
    free(d);
    CHECK(etcd_unb64("abc", &n) == NULL);   /* not a multiple of 4 */
    CHECK(etcd_unb64("ab!?", &n) == NULL);  /* not base64 */
}

static json_t *parse(char *text) {
    json_t *o = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    return o;
}

static const char *str(json_t *o, const char *path1, const char *path2) {
    json_t *v = json_object_get(o, path1);
    if (path2) v = json_object_get(v, path2);
    return json_string_value(v);
}

static void test_requests(void) {
    json_t *o = parse(etcd_req_range("/a/b", true));
    CHECK_EQ_STR(str(o, "key", NULL), "L2EvYg==");       /* /a/b */
    CHECK_EQ_STR(str(o, "range_end", NULL), "L2EvYw=="); /* /a/c */
    json_decref(o);
    o = parse(etcd_req_range("k", false));
    CHECK(json_object_get(o, "range_end") == NULL);
    json_decref(o);
    /* a prefix ending in 0xff: the last byte below 0xff is incremented */
    o = parse(etcd_req_range("a\xff", true));
    CHECK_EQ_STR(str(o, "range_end", NULL), "Yg=="); /* "b" */
    json_decref(o);

    etcd_cmp cmp = {"/p/leader", ETCD_CMP_CREATE, 0, NULL};
    etcd_op put = {"/p/leader", "me", 2, 0x1234};
    etcd_op del = {"/p/nodes/w-a", NULL, 0, 0};
    o = parse(etcd_req_txn(&cmp, 1, &put, 1, &del, 1));
    json_t *c = json_array_get(json_object_get(o, "compare"), 0);
    CHECK_EQ_STR(str(c, "target", NULL), "CREATE");
    CHECK_EQ_STR(str(c, "result", NULL), "EQUAL");
    CHECK_EQ_STR(str(c, "create_revision", NULL), "0");
    json_t *s = json_array_get(json_object_get(o, "success"), 0);
    CHECK_EQ_STR(str(s, "request_put", "value"), "bWU="); /* me */
    CHECK_EQ_STR(str(s, "request_put", "lease"), "4660");
    json_t *f = json_array_get(json_object_get(o, "failure"), 0);
    CHECK_EQ_STR(str(f, "request_delete_range", "key"), "L3Avbm9kZXMvdy1h");
    json_decref(o);

    o = parse(etcd_req_lease_grant(3));
    CHECK_EQ_STR(str(o, "TTL", NULL), "3");
    json_decref(o);
    o = parse(etcd_req_watch("/p/leader", 42));
    CHECK_EQ_STR(str(o, "create_request", "start_revision"), "42");
    json_decref(o);
}

/* Answers as etcd 3.4.23's gateway gives them. */
static const char RANGE[] =
    "{\"header\":{\"cluster_id\":\"14841639068965178418\",\"member_id\":\"10276657743932975437\",\"revision\":\"7\","
    "\"raft_term\":\"2\"},\"kvs\":[{\"key\":\"L3AvbGVhZGVy\",\"create_revision\":\"5\",\"mod_revision\":\"6\","
    "\"version\":\"2\",\"value\":\"eyJuYW1lIjoiYSJ9\",\"lease\":\"7587872233040781572\"},"
    "{\"key\":\"L3Avc3RhdGU=\",\"create_revision\":\"3\",\"mod_revision\":\"3\",\"version\":\"1\"}],\"count\":\"2\"}";

static void test_range(void) {
    etcd_kvs k;
    st_err err = {{0}};
    REQUIRE(etcd_parse_range(RANGE, LEN(RANGE), &k, &err) == 0);
    CHECK_EQ_INT((int)k.n, 2);
    CHECK(k.revision == 7);
    CHECK_EQ_STR(k.kv[0].key, "/p/leader");
    CHECK_EQ_STR(k.kv[0].value, "{\"name\":\"a\"}");
    CHECK(k.kv[0].lease == 7587872233040781572LL && k.kv[0].create_rev == 5 && k.kv[0].mod_rev == 6);
    CHECK_EQ_STR(k.kv[1].value, ""); /* an empty value is left out */
    CHECK(k.kv[1].value_len == 0 && k.kv[1].lease == 0);
    etcd_kvs_free(&k);
    /* no kvs at all (nothing under the key), and "count" left out */
    static const char EMPTY[] = "{\"header\":{\"revision\":\"9\"}}";
    REQUIRE(etcd_parse_range(EMPTY, LEN(EMPTY), &k, &err) == 0);
    CHECK(k.n == 0 && k.revision == 9);
    /* broken answers: each a clear error */
    static const struct {
        const char *body, *words;
    } bad[] = {
        {"", "not JSON"},
        {"<html>502 Bad Gateway</html>", "not JSON"},
        {"[1,2]", "not a JSON object"},
        {"{\"kvs\":[]}", "without a header"},
        {"{\"header\":{\"revision\":\"x7\"}}", "header.revision: not an integer"},
        {"{\"header\":{},\"kvs\":{}}", "kvs: not an array"},
        {"{\"header\":{},\"kvs\":[{\"value\":\"YQ==\"}]}", "kvs[0].key: missing"},
        {"{\"header\":{},\"kvs\":[{\"key\":\"%%%%\"}]}", "kvs[0].key: not base64"},
        {"{\"header\":{},\"kvs\":[{\"key\":\"YQ==\",\"value\":\"Y\"}]}", "kvs[0].value: not base64"},
        {"{\"header\":{},\"kvs\":[{\"key\":\"YQ==\",\"lease\":true}]}", "kvs[0].lease: not an integer"},
        {"{\"error\":\"etcdserver: mvcc: required revision has been compacted\",\"code\":11,"
         "\"message\":\"etcdserver: mvcc: required revision has been compacted\"}",
         "etcd: etcdserver: mvcc: required revision has been compacted (code 11)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&err, 0, sizeof err);
        CHECK_MSG(etcd_parse_range(bad[i].body, strlen(bad[i].body), &k, &err) == -1, "bad[%zu] refused", i);
        CHECK_MSG(strstr(err.msg, bad[i].words) != NULL, "bad[%zu]: \"%s\" names \"%s\"", i, err.msg, bad[i].words);
        CHECK(k.n == 0 && k.kv == NULL);
    }
}

static void test_txn_lease_watch(void) {
    st_err err = {{0}};
    bool ok = true;
    int64_t rev = 0;
    static const char LOST[] = "{\"header\":{\"revision\":\"12\"},\"responses\":[{\"response_range\":{\"header\":{}}}]}";
    REQUIRE(etcd_parse_txn(LOST, LEN(LOST), &ok, &rev, NULL, &err) == 0);
    CHECK(!ok && rev == 12); /* "succeeded" left out: false */
    static const char WON[] = "{\"header\":{\"revision\":\"13\"},\"succeeded\":true,\"responses\":[{\"response_put\":"
                              "{\"header\":{\"revision\":\"13\"}}}]}";
    REQUIRE(etcd_parse_txn(WON, LEN(WON), &ok, &rev, NULL, &err) == 0);
    CHECK(ok && rev == 13);
    static const char BADS[] = "{\"header\":{},\"succeeded\":\"yes\"}";
    CHECK(etcd_parse_txn(BADS, LEN(BADS), &ok, &rev, NULL, &err) == -1 && strstr(err.msg, "succeeded"));
    static const char TOOMANY[] = "{\"error\":\"etcdserver: too many operations in txn request\",\"code\":3}";
    CHECK(etcd_parse_txn(TOOMANY, LEN(TOOMANY), &ok, &rev, NULL, &err) == -1 &&
          strstr(err.msg, "too many operations in txn request (code 3)"));

    int64_t id = 0, ttl = 0;
    static const char GRANT[] = "{\"header\":{\"revision\":\"4\"},\"ID\":\"7587872233040781572\",\"TTL\":\"3\"}";
    REQUIRE(etcd_parse_lease(GRANT, LEN(GRANT), &id, &ttl, &err) == 0);
    CHECK(id == 7587872233040781572LL && ttl == 3);
    static const char KA[] = "{\"result\":{\"header\":{\"revision\":\"4\"},\"ID\":\"7587872233040781572\",\"TTL\":\"3\"}}";
    REQUIRE(etcd_parse_lease(KA, LEN(KA), &id, &ttl, &err) == 0);
    CHECK(ttl == 3);
    static const char GONE[] = "{\"result\":{\"header\":{\"revision\":\"4\"},\"ID\":\"7587872233040781572\"}}";
    REQUIRE(etcd_parse_lease(GONE, LEN(GONE), &id, &ttl, &err) == 0);
    CHECK(ttl == 0); /* expired: TTL left out */
    static const char NOID[] = "{\"header\":{}}";
    CHECK(etcd_parse_lease(NOID, LEN(NOID), &id, &ttl, &err) == -1 && strstr(err.msg, "without an ID"));
    static const char SERR[] = "{\"error\":{\"grpc_code\":5,\"http_code\":404,\"message\":\"etcdserver: requested "
                               "lease not found\",\"http_status\":\"Not Found\"}}";
    CHECK(etcd_parse_lease(SERR, LEN(SERR), &id, &ttl, &err) == -1 &&
          strstr(err.msg, "etcd: etcdserver: requested lease not found (code 5)"));

    etcd_watch_msg m;
    static const char CREATED[] = "{\"result\":{\"header\":{\"revision\":\"8\"},\"created\":true}}";
    REQUIRE(etcd_parse_watch(CREATED, LEN(CREATED), &m, &err) == 0);
    CHECK(m.created && !m.put && !m.deleted && m.revision == 8);
    static const char DEL[] = "{\"result\":{\"header\":{\"revision\":\"9\"},\"events\":[{\"type\":\"DELETE\",\"kv\":"
                              "{\"key\":\"L3AvbGVhZGVy\",\"mod_revision\":\"9\"}}]}}";
    REQUIRE(etcd_parse_watch(DEL, LEN(DEL), &m, &err) == 0);
    CHECK(m.deleted && !m.put);
    static const char PUT[] = "{\"result\":{\"header\":{\"revision\":\"10\"},\"events\":[{\"kv\":{\"key\":\"YQ==\"}}]}}";
    REQUIRE(etcd_parse_watch(PUT, LEN(PUT), &m, &err) == 0);
    CHECK(m.put && !m.deleted);
    static const char CANCEL[] = "{\"result\":{\"header\":{},\"canceled\":true,\"cancel_reason\":\"mvcc: required "
                                 "revision has been compacted\"}}";
    REQUIRE(etcd_parse_watch(CANCEL, LEN(CANCEL), &m, &err) == 0);
    CHECK(m.canceled && strstr(err.msg, "compacted"));
    static const char ODD[] = "{\"result\":{\"header\":{},\"events\":[{\"type\":\"MOVE\"}]}}";
    CHECK(etcd_parse_watch(ODD, LEN(ODD), &m, &err) == -1 && strstr(err.msg, "events[0].type: unknown \"MOVE\""));
    CHECK(etcd_parse_watch("{}", 2, &m, &err) == -1 && strstr(err.msg, "without a result"));
}

/* ---------------------------------------------------------------- the client */

typedef struct fake {
    struct event_base *base;
    struct evhttp *http;
    int port;
    const char *status_body; /* what /v3/kv/range answers */
    int status;
    bool silent;             /* never answer */
    volatile int stop;       /* set by the test's thread; the loop's own timer reads it */
} fake;

static void fake_poll(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    fake *f = arg;
    if (__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) event_base_loopbreak(f->base);
}

static void fake_cb(struct evhttp_request *req, void *arg) {
    fake *f = arg;
    if (f->silent) return; /* the client's timeout ends it */
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, f->status_body, strlen(f->status_body));
    evhttp_send_reply(req, f->status, "x", b);
    evbuffer_free(b);
}

static void *fake_main(void *arg) {
    fake *f = arg;
    struct event *poll = event_new(f->base, -1, EV_PERSIST, fake_poll, f);
    struct timeval tv = {0, 20000};
    event_add(poll, &tv);
    event_base_dispatch(f->base);
    event_free(poll);
    return NULL;
}

static void test_client(void) {
    st_err err = {{0}};
    etcd_client_opts o = {.endpoints = "ftp://127.0.0.1:2379"};
    CHECK(etcd_client_create(&o, &err) == NULL && strstr(err.msg, "not an http:// or https:// URL"));
    o.endpoints = "http://10.1.2.3:2379";
    CHECK(etcd_client_create(&o, &err) == NULL && strstr(err.msg, "plaintext to a non-loopback etcd"));
    o.endpoints = "https://10.1.2.3:2379";
    CHECK(etcd_client_create(&o, &err) == NULL && strstr(err.msg, "needs --etcd-cacert"));
    o.endpoints = "https://10.1.2.3:2379";
    o.cacert = "/nonexistent/ca.pem";
    CHECK(etcd_client_create(&o, &err) == NULL && strstr(err.msg, "--etcd-cacert /nonexistent/ca.pem"));
    o.cacert = NULL;
    o.endpoints = "";
    CHECK(etcd_client_create(&o, &err) == NULL && strstr(err.msg, "no endpoint"));

    /* nothing listens: a clear error, no hang */
    o.endpoints = "http://127.0.0.1:1";
    o.timeout_s = 0.5;
    etcd_client *c = etcd_client_create(&o, &err);
    REQUIRE(c != NULL);
    etcd_kvs k;
    CHECK(etcd_range(c, "/p/leader", false, &k, &err) == -1 && strstr(err.msg, "cannot connect"));
    etcd_client_destroy(c);

    fake f = {.base = event_base_new()};
    f.http = evhttp_new(f.base);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(f.http, "127.0.0.1", 0);
    REQUIRE(bs != NULL);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl);
    f.port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    evhttp_set_gencb(f.http, fake_cb, &f);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", f.port);
    o.endpoints = ep;
    c = etcd_client_create(&o, &err);
    REQUIRE(c != NULL);
    /* each case: set the answer while the server's loop is not running */
    static const struct {
        int status;
        const char *body;
        bool silent;
        const char *words;
    } cases[] = {
        {200, RANGE, false, NULL},
        {200, "this is not json", false, "answer is not JSON"},
        {404, "{\"error\":\"Not Found\",\"code\":5,\"message\":\"Not Found\"}", false, "HTTP 404: etcd: Not Found (code 5)"},
        {400, "bad", false, "HTTP 400: bad"},
        {503, "{\"error\":\"etcdserver: no leader\",\"code\":14}", false, "HTTP 503: etcd: etcdserver: no leader"},
        {200, "", true, "no answer within the timeout"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        f.status = cases[i].status;
        f.status_body = cases[i].body;
        f.silent = cases[i].silent;
        f.stop = 0;
        pthread_t t;
        pthread_create(&t, NULL, fake_main, &f);
        memset(&err, 0, sizeof err);
        int rc = etcd_range(c, "/p/leader", false, &k, &err);
        __atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE); /* libevent without threads: the loop polls the flag */
        pthread_join(t, NULL);
        if (!cases[i].words) {
            CHECK_MSG(rc == 0 && k.n == 2, "case %zu: %s", i, err.msg);
            etcd_kvs_free(&k);
        } else {
            CHECK_MSG(rc == -1 && strstr(err.msg, cases[i].words), "case %zu: \"%s\" names \"%s\"", i, err.msg,
                      cases[i].words);
        }
    }
    etcd_client_destroy(c);
    evhttp_free(f.http);
    event_base_free(f.base);
}

int main(void) {
    test_b64();
    test_requests();
    test_range();
    test_txn_lease_watch();
    test_client();
    return test_summary();
}
