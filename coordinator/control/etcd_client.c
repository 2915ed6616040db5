/* etcd_client.c — etcd's v3 JSON gateway over evhttp on a private event
 * loop (etcd_client.h). */
#include "coordinator/control/etcd_client.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/exposure.h"

#define ETCD_MAX_ENDPOINTS 16
#define ETCD_MAX_BODY (64u << 20)

typedef struct endpoint {
    char url[300];
    char host[256];
    int port;
    bool tls;
} endpoint;

struct etcd_client {
    struct event_base *base;
    SSL_CTX *ssl;
    endpoint ep[ETCD_MAX_ENDPOINTS];
    int n_ep, cur;
    struct evhttp_connection *conn; /* unary calls to ep[cur], kept alive */
    bool conn_used;                 /* it answered before: a failure may be a stale keep-alive */
    double timeout_s;
};

/* ---------------------------------------------------------------- set-up */

static int parse_endpoint(const char *text, endpoint *e, bool insecure, st_err *err) {
    char url[300];
    if (strlen(text) >= sizeof url - 8) return st_errf(err, "--etcd %s: too long", text);
    snprintf(url, sizeof url, "%s%s", strstr(text, "://") ? "" : "http://", text);
    struct evhttp_uri *u = evhttp_uri_parse(url);
    const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL, *host = u ? evhttp_uri_get_host(u) : NULL;
    int port = u ? evhttp_uri_get_port(u) : -1;
    const char *path = u ? evhttp_uri_get_path(u) : NULL;
    int rc = 0;
    if (!u || !scheme || !host || !*host || (strcmp(scheme, "http") && strcmp(scheme, "https")))
        rc = st_errf(err, "--etcd %s: not an http:// or https:// URL", text);
    else if (path && *path && strcmp(path, "/"))
        rc = st_errf(err, "--etcd %s: a URL without a path (http://HOST:PORT)", text);
    else if (strlen(host) >= sizeof e->host)
        rc = st_errf(err, "--etcd %s: host name too long", text);
    if (rc == 0) {
        e->tls = !strcmp(scheme, "https");
        e->port = port > 0 ? port : 2379;
        snprintf(e->host, sizeof e->host, "%s", host);
        bool v6 = strchr(host, ':') != NULL;
        snprintf(e->url, sizeof e->url, "%s://%s%s%s:%d", scheme, v6 ? "[" : "", host, v6 ? "]" : "", e->port);
        char hp[300];
        snprintf(hp, sizeof hp, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", e->port);
        char why[300];
        if (!e->tls && st_exposure_check("etcd client", hp, false, insecure, why, sizeof why) != 0)
            rc = st_errf(err, "--etcd %s: plaintext to a non-loopback etcd; use https:// with --etcd-cacert "
                              "(and --etcd-cert/--etcd-key for client certificates), or --insecure",
                         e->url);
    }
    if (u) evhttp_uri_free(u);
    return rc;
}

static int tls_setup(etcd_client *c, const etcd_client_opts *o, st_err *err) {
    if (!o->cacert || !*o->cacert) return st_errf(err, "--etcd https://...: needs --etcd-cacert (etcd's CA)");
    if ((o->cert && *o->cert) != (o->key && *o->key))
        return st_errf(err, "--etcd-cert and --etcd-key go together");
    if (!(c->ssl = SSL_CTX_new(TLS_client_method()))) return st_errf(err, "etcd: TLS: out of memory");
    SSL_CTX_set_min_proto_version(c->ssl, TLS1_2_VERSION);
    SSL_CTX_set_verify(c->ssl, SSL_VERIFY_PEER, NULL);
    char e[256];
    if (SSL_CTX_load_verify_locations(c->ssl, o->cacert, NULL) != 1) {
        ERR_error_string_n(ERR_get_error(), e, sizeof e);
        return st_errf(err, "--etcd-cacert %s: %s", o->cacert, e);
    }
    if (o->cert && *o->cert) {
        if (SSL_CTX_use_certificate_chain_file(c->ssl, o->cert) != 1) {
            ERR_error_string_n(ERR_get_error(), e, sizeof e);
            return st_errf(err, "--etcd-cert %s: %s", o->cert, e);
        }
        if (SSL_CTX_use_PrivateKey_file(c->ssl, o->key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(c->ssl) != 1) {
            ERR_error_string_n(ERR_get_error(), e, sizeof e);
            return st_errf(err, "--etcd-key %s: %s", o->key, e);
        }
    }
    return 0;
}

etcd_client *etcd_client_create(const etcd_client_opts *o, st_err *err) {
    etcd_client *c = calloc(1, sizeof *c);
    if (!c) return st_errf(err, "etcd: out of memory"), NULL;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : 2.0;
    char *list = strdup(o->endpoints ? o->endpoints : "");
    bool any_tls = false;
    int rc = list ? 0 : st_errf(err, "etcd: out of memory");
    char *save = NULL;
    for (char *t = list ? strtok_r(list, ",", &save) : NULL; t && rc == 0; t = strtok_r(NULL, ",", &save)) {
        if (c->n_ep == ETCD_MAX_ENDPOINTS) rc = st_errf(err, "--etcd: at most %d endpoints", ETCD_MAX_ENDPOINTS);
        else if ((rc = parse_endpoint(t, &c->ep[c->n_ep], o->insecure, err)) == 0) any_tls |= c->ep[c->n_ep++].tls;
    }
    free(list);
    if (rc == 0 && c->n_ep == 0) rc = st_errf(err, "--etcd: no endpoint given");
    if (rc == 0 && any_tls) rc = tls_setup(c, o, err);
    if (rc == 0 && !(c->base = event_base_new())) rc = st_errf(err, "etcd: cannot create an event loop");
    if (rc) {
        etcd_client_destroy(c);
        return NULL;
    }
    return c;
}

void etcd_client_destroy(etcd_client *c) {
    if (!c) return;
    if (c->conn) evhttp_connection_free(c->conn);
    if (c->base) event_base_free(c->base);
    if (c->ssl) SSL_CTX_free(c->ssl);
    free(c);
}

const char *etcd_client_endpoint(const etcd_client *c) { return c->ep[c->cur].url; }

/* timeout_s: the connection's read/write timeout (a watch's is its whole
 * length: it may be silent that long). */
static struct evhttp_connection *connect_to(etcd_client *c, const endpoint *e, double timeout_s) {
    struct bufferevent *bev = NULL;
    if (e->tls) {
        SSL *ssl = SSL_new(c->ssl);
        if (!ssl) return NULL;
        unsigned char ip[16];
        if (inet_pton(AF_INET, e->host, ip) == 1 || inet_pton(AF_INET6, e->host, ip) == 1) {
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), e->host);
        } else {
            SSL_set1_host(ssl, e->host);
            SSL_set_tlsext_host_name(ssl, e->host);
        }
        bev = bufferevent_openssl_socket_new(c->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                             BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        if (!bev) {
            SSL_free(ssl);
            return NULL;
        }
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    }
    struct evhttp_connection *conn =
        evhttp_connection_base_bufferevent_new(c->base, NULL, bev, e->host, (unsigned short)e->port);
    if (!conn) {
        if (bev) bufferevent_free(bev);
        return NULL;
    }
    struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    evhttp_connection_set_timeout_tv(conn, &tv);
    return conn;
}

/* ---------------------------------------------------------------- one exchange */

typedef struct xfer {
    bool done, timed_out, stop;
    int status;               /* 0: no answer (connection failed) */
    struct evbuffer *body;
    /* a stream (watch): every "\n"-delimited message goes to on_msg; non-zero stops */
    int (*on_msg)(const char *msg, size_t len, void *ud);
    void *ud;
    struct event_base *base;
} xfer;

static void on_done(struct evhttp_request *req, void *arg) {
    xfer *x = arg;
    x->done = true;
    if (!req) return;
    x->status = evhttp_request_get_response_code(req);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (evbuffer_get_length(x->body) + evbuffer_get_length(in) <= ETCD_MAX_BODY) evbuffer_add_buffer(x->body, in);
}

static void on_chunk(struct evhttp_request *req, void *arg) {
    xfer *x = arg;
    x->status = evhttp_request_get_response_code(req);
    evbuffer_add_buffer(x->body, evhttp_request_get_input_buffer(req));
    while (!x->stop && x->status == 200) {
        struct evbuffer_ptr p = evbuffer_search(x->body, "\n", 1, NULL);
        if (p.pos < 0) break;
        size_t n = (size_t)p.pos;
        char *line = malloc(n + 1);
        if (!line) {
            x->stop = true;
            break;
        }
        evbuffer_remove(x->body, line, n);
        evbuffer_drain(x->body, 1);
        line[n] = 0;
        if (n && x->on_msg(line, n, x->ud)) x->stop = true;
        free(line);
    }
    if (evbuffer_get_length(x->body) > ETCD_MAX_BODY) x->stop = true;
    if (x->stop) event_base_loopbreak(x->base);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    xfer *x = arg;
    x->timed_out = true;
    event_base_loopbreak(x->base);
}

/* Sends one POST on conn and runs the loop until the answer, the deadline or
 * (a stream) on_msg said stop. Returns false when conn must be freed (the
 * request may still be pending in it). */
static bool exchange(etcd_client *c, struct evhttp_connection *conn, const endpoint *e, const char *path,
                     const char *body, double timeout_s, xfer *x) {
    struct evhttp_request *req = evhttp_request_new(on_done, x);
    if (!req) return false;
    if (x->on_msg) evhttp_request_set_chunked_cb(req, on_chunk);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char host[300];
    snprintf(host, sizeof host, "%s:%d", e->host, e->port);
    evhttp_add_header(h, "Host", host);
    evhttp_add_header(h, "Content-Type", "application/json");
    evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body));
    if (evhttp_make_request(conn, req, EVHTTP_REQ_POST, path) != 0) return false; /* req freed by libevent */
    struct event *dl = evtimer_new(c->base, on_deadline, x);
    struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    if (dl) evtimer_add(dl, &tv);
    while (!x->done && !x->timed_out && !x->stop && dl) event_base_loop(c->base, EVLOOP_ONCE);
    if (dl) event_free(dl);
    return x->done && !x->stop;
}

static int http_error(const endpoint *e, const char *path, int status, struct evbuffer *b, st_err *err) {
    size_t n = evbuffer_get_length(b);
    const char *body = n ? (const char *)evbuffer_pullup(b, -1) : "";
    st_err ee = {{0}};
    if (n && etcd_parse_error(body, n, &ee)) return st_errf(err, "%s%s: HTTP %d: %s", e->url, path, status, ee.msg);
    return st_errf(err, "%s%s: HTTP %d: %.120s", e->url, path, status, body);
}

int etcd_call(etcd_client *c, const char *path, const char *body, char **out, size_t *out_len, st_err *err) {
    *out = NULL;
    *out_len = 0;
    if (!body) return st_errf(err, "etcd: out of memory");
    int tries = c->n_ep + 1; /* +1: a kept-alive connection the server closed meanwhile */
    st_err last = {{0}};
    for (int t = 0; t < tries; t++) {
        endpoint *e = &c->ep[c->cur];
        if (!c->conn) {
            c->conn_used = false;
            if (!(c->conn = connect_to(c, e, c->timeout_s))) return st_errf(err, "etcd: %s: cannot create a connection", e->url);
        }
        xfer x = {.body = evbuffer_new(), .base = c->base};
        if (!x.body) return st_errf(err, "etcd: out of memory");
        bool ok = exchange(c, c->conn, e, path, body, c->timeout_s, &x);
        if (ok && x.status == 200) {
            size_t n = evbuffer_get_length(x.body);
            char *b = malloc(n + 1);
            if (b) {
                evbuffer_remove(x.body, b, n);
                b[n] = 0;
            }
            evbuffer_free(x.body);
            c->conn_used = true;
            if (!b) return st_errf(err, "etcd: out of memory");
            *out = b;
            *out_len = n;
            return 0;
        }
        bool retry_same = false;
        if (!ok || x.status == 0) {
            st_errf(&last, "etcd %s: %s", e->url, x.timed_out ? "no answer within the timeout" : "cannot connect");
            retry_same = c->conn_used && !x.timed_out;
            evhttp_connection_free(c->conn);
            c->conn = NULL;
        } else {
            http_error(e, path, x.status, x.body, &last);
            if (x.status < 500) { /* etcd's answer: another member answers the same */
                evbuffer_free(x.body);
                return st_errf(err, "%s", last.msg);
            }
            evhttp_connection_free(c->conn);
            c->conn = NULL;
        }
        evbuffer_free(x.body);
        if (!retry_same) c->cur = (c->cur + 1) % c->n_ep;
    }
    return st_errf(err, "%s", last.msg);
}

/* ---------------------------------------------------------------- the calls */

static int call_json(etcd_client *c, const char *path, char *req, char **out, size_t *len, st_err *err) {
    int rc = etcd_call(c, path, req, out, len, err);
    free(req);
    return rc;
}

int etcd_range(etcd_client *c, const char *key, bool prefix, etcd_kvs *out, st_err *err) {
    char *b;
    size_t n;
    memset(out, 0, sizeof *out);
    if (call_json(c, "/v3/kv/range", etcd_req_range(key, prefix), &b, &n, err)) return -1;
    int rc = etcd_parse_range(b, n, out, err);
    free(b);
    return rc;
}

int etcd_txn(etcd_client *c, const etcd_cmp *cmp, size_t n_cmp, const etcd_op *then, size_t n_then,
             const etcd_op *otherwise, size_t n_otherwise, bool *succeeded, int64_t *revision, etcd_kvs *out,
             st_err *err) {
    char *b;
    size_t n;
    *succeeded = false;
    if (call_json(c, "/v3/kv/txn", etcd_req_txn(cmp, n_cmp, then, n_then, otherwise, n_otherwise), &b, &n, err))
        return -1;
    int rc = etcd_parse_txn(b, n, succeeded, revision, out, err);
    free(b);
    return rc;
}

int etcd_lease_grant(etcd_client *c, int64_t ttl_s, int64_t *id, st_err *err) {
    char *b;
    size_t n;
    int64_t ttl = 0;
    if (call_json(c, "/v3/lease/grant", etcd_req_lease_grant(ttl_s), &b, &n, err)) return -1;
    int rc = etcd_parse_lease(b, n, id, &ttl, err);
    free(b);
    return rc;
}

int etcd_lease_keepalive(etcd_client *c, int64_t id, int64_t *ttl, st_err *err) {
    char *b;
    size_t n;
    int64_t got = 0;
    if (call_json(c, "/v3/lease/keepalive", etcd_req_lease_id(id), &b, &n, err)) return -1;
    /* a one-message stream: {"result":{...}}\n */
    int rc = etcd_parse_lease(b, n, &got, ttl, err);
    free(b);
    return rc;
}

int etcd_lease_revoke(etcd_client *c, int64_t id, st_err *err) {
    char *b;
    size_t n;
    int64_t rev;
    if (call_json(c, "/v3/lease/revoke", etcd_req_lease_id(id), &b, &n, err)) return -1;
    int rc = etcd_parse_header(b, n, &rev, err);
    free(b);
    return rc;
}

typedef struct watch_ud {
    etcd_watch_msg *m;
    st_err *err;
    int rc; /* 1 event, -1 error */
} watch_ud;

static int on_watch_msg(const char *msg, size_t len, void *arg) {
    watch_ud *w = arg;
    etcd_watch_msg m;
    if (etcd_parse_watch(msg, len, &m, w->err) != 0 || m.canceled) return w->rc = -1, 1;
    if (m.put || m.deleted) return *w->m = m, w->rc = 1, 1;
    return 0; /* "created" and progress messages */
}

int etcd_watch(etcd_client *c, const char *key, int64_t start_rev, double timeout_s, etcd_watch_msg *m,
               st_err *err) {
    memset(m, 0, sizeof *m);
    char *req = etcd_req_watch(key, start_rev);
    if (!req) return st_errf(err, "etcd: out of memory");
    endpoint *e = &c->ep[c->cur];
    /* its own connection: the stream ends only when we close it */
    struct evhttp_connection *conn = connect_to(c, e, timeout_s + c->timeout_s);
    watch_ud w = {m, err, 0};
    xfer x = {.body = evbuffer_new(), .base = c->base, .on_msg = on_watch_msg, .ud = &w};
    int rc;
    if (!conn || !x.body) {
        rc = st_errf(err, "etcd: out of memory");
    } else {
        exchange(c, conn, e, "/v3/watch", req, timeout_s, &x);
        if (w.rc)
            rc = w.rc;
        else if (x.timed_out)
            rc = 0;
        else if (x.status && x.status != 200)
            rc = http_error(e, "/v3/watch", x.status, x.body, err);
        else {
            rc = st_errf(err, "etcd %s: the watch stream ended", e->url);
            c->cur = (c->cur + 1) % c->n_ep;
        }
    }
    if (conn) evhttp_connection_free(conn);
    if (x.body) evbuffer_free(x.body);
    free(req);
    return rc;
}
