/* http_conn.c — connection cap, read deadlines and accept-error pauses for
 * evhttp (libevent 2.1). See http_conn.h.
 *
 * How a connection is followed. evhttp calls our bevcb for every accepted
 * socket, before it makes the connection object; it then sets its own
 * callbacks on that bufferevent, with the connection as their argument. A
 * one-shot event activated in bevcb runs later in the same loop pass (before
 * any read on the socket) and picks the connection up from
 * bufferevent_getcb, then installs the close callback that ends our record.
 * Until then we hold a reference on the bufferevent, so that it stays valid
 * memory even if evhttp gave up on the connection meanwhile (it only does on
 * allocation failures; it then has closed the socket itself).
 *
 * Where a request is. evhttp has no callback for "headers complete" on the
 * server side before 2.2, so an input-buffer callback watches the bytes of
 * a request's head for the blank line that ends it (LF or CRLF line ends, as
 * evhttp accepts). It parses nothing else: evhttp still parses the request.
 */
#include "coordinator/api/http_conn.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/log_limit.h"

enum phase { PH_HEADER, PH_BODY, PH_BUSY, PH_IDLE };

typedef struct hconn hconn;
struct hconn {
    http_conns *hc;
    struct bufferevent *bev;
    struct evhttp_connection *evcon; /* NULL until picked up */
    struct evbuffer_cb_entry *watch; /* on the input buffer */
    struct event *deadline, *pickup;
    enum phase phase;
    bool line_has_text, had_line; /* the head's blank-line search */
    bool over_cap;
    void (*user_cb)(struct evhttp_connection *, void *); /* http_conn_set_closecb */
    void *user_arg;
    void (*done_cb)(struct evhttp_request *, void *); /* http_conn_set_on_complete */
    void *done_arg;
    hconn *prev, *next;
};

struct http_conns {
    struct event_base *base;
    struct evhttp *http;
    http_conns *next_server; /* the registry below */
    http_tls *tls;
    coord_metrics *metrics;
    http_conn_limits lim;
    hconn *conns;
    int n_open;
    struct evconnlistener *listener;
    struct event *resume;
    double pause_s; /* the next accept pause */
    st_log_limit accept_log, cap_log, deadline_log;
};

/* Every server, so that accept errors (whose callbacks get evhttp's argument,
 * the evhttp) and the slot setters below find their records. Servers are few
 * and made at start-up, on the loop's thread. */
static http_conns *servers;

static const char *phase_reason(enum phase p) {
    return p == PH_HEADER ? "header_timeout" : p == PH_BODY ? "body_timeout" : "idle_timeout";
}

static const char *phase_name(enum phase p) {
    switch (p) {
    case PH_HEADER: return "the request headers";
    case PH_BODY: return "the request body";
    case PH_IDLE: return "a next request (idle keep-alive)";
    default: return "?";
    }
}

static void arm(hconn *c, enum phase p) {
    c->phase = p;
    double s = p == PH_HEADER ? c->hc->lim.header_timeout_s
             : p == PH_BODY   ? c->hc->lim.body_timeout_s
             : p == PH_IDLE   ? c->hc->lim.idle_timeout_s
                              : 0;
    if (p == PH_HEADER) c->line_has_text = c->had_line = false;
    if (s <= 0) {
        evtimer_del(c->deadline);
        return;
    }
    struct timeval tv = {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
    evtimer_add(c->deadline, &tv);
}

/* Drops the record (the connection is gone or going). */
static void forget(hconn *c) {
    http_conns *hc = c->hc;
    if (c->watch) evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->watch);
    if (c->evcon) evhttp_connection_set_closecb(c->evcon, NULL, NULL);
    event_free(c->deadline);
    event_free(c->pickup);
    if (c->prev)
        c->prev->next = c->next;
    else
        hc->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    hc->n_open--;
    coord_metrics_http_open(hc->metrics, hc->n_open);
    free(c);
}

static void on_close(struct evhttp_connection *evcon, void *arg) {
    hconn *c = arg;
    if (c->user_cb) c->user_cb(evcon, c->user_arg);
    forget(c);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    hconn *c = arg;
    coord_metrics_http_closed(c->hc->metrics, phase_reason(c->phase));
    unsigned long dropped = 0;
    if (st_log_limit_allow(&c->hc->deadline_log, st_now_s(), &dropped))
        ST_INFO("http: closing a connection that did not send %s in time (%lu more since the last message)",
                phase_name(c->phase), dropped);
    evhttp_connection_free(c->evcon); /* calls on_close, which frees c */
}

/* Looks for the blank line that ends a request head in the bytes just added. */
static void on_input(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg) {
    hconn *c = arg;
    if (info->n_added == 0 || !c->evcon) return;
    if (c->phase == PH_IDLE) arm(c, PH_HEADER);
    if (c->phase != PH_HEADER) return;
    size_t len = evbuffer_get_length(buf);
    struct evbuffer_ptr at;
    if (evbuffer_ptr_set(buf, &at, len - info->n_added, EVBUFFER_PTR_SET) != 0) return;
    struct evbuffer_iovec v[8];
    size_t left = info->n_added;
    while (left > 0) {
        int n = evbuffer_peek(buf, (ev_ssize_t)left, &at, v, 8);
        if (n <= 0) return;
        for (int i = 0; i < n && i < 8 && left > 0; i++) {
            const char *p = v[i].iov_base;
            size_t m = v[i].iov_len < left ? v[i].iov_len : left;
            for (size_t j = 0; j < m; j++) {
                if (p[j] == '\n') {
                    if (!c->line_has_text && c->had_line) {
                        arm(c, PH_BODY);
                        return;
                    }
                    c->had_line |= c->line_has_text;
                    c->line_has_text = false;
                } else if (p[j] != '\r') {
                    c->line_has_text = true;
                }
            }
            left -= m;
            if (evbuffer_ptr_set(buf, &at, m, EVBUFFER_PTR_ADD) != 0) return;
        }
    }
}

static void on_pickup(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    hconn *c = arg;
    http_conns *hc = c->hc;
    struct bufferevent *bev = c->bev;
    bufferevent_event_cb ecb = NULL;
    void *cbarg = NULL;
    bufferevent_getcb(bev, NULL, NULL, &ecb, &cbarg);
    if (!ecb || !cbarg) {
        /* evhttp gave up on it (out of memory) and closed the socket. */
        bufferevent_setfd(bev, -1);
        forget(c);
        bufferevent_decref(bev);
        return;
    }
    c->evcon = cbarg;
    evhttp_connection_set_closecb(c->evcon, on_close, c);
    bufferevent_decref(bev); /* evhttp holds its own */
    if (c->over_cap) {
        coord_metrics_http_closed(hc->metrics, "cap");
        unsigned long dropped = 0;
        if (st_log_limit_allow(&hc->cap_log, st_now_s(), &dropped))
            ST_WARN("http: %d connections open (the --max-connections cap): closing new ones "
                    "(%lu more since the last message)", hc->lim.max_connections, dropped);
        evhttp_connection_free(c->evcon); /* calls on_close */
        return;
    }
    arm(c, PH_HEADER);
}

static struct bufferevent *on_new_bev(struct event_base *base, void *arg) {
    http_conns *hc = arg;
    hc->pause_s = 0; /* accept works again */
    /* A NULL return makes evhttp create a plain socket bufferevent itself;
     * that only happens when memory is exhausted. */
    struct bufferevent *bev = hc->tls ? http_tls_bufferevent(hc->tls, base)
                                      : bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) return NULL;
    hconn *c = calloc(1, sizeof *c);
    if (c) {
        c->hc = hc;
        c->bev = bev;
        c->deadline = evtimer_new(base, on_deadline, c);
        c->pickup = event_new(base, -1, 0, on_pickup, c);
        c->watch = evbuffer_add_cb(bufferevent_get_input(bev), on_input, c);
    }
    if (!c || !c->deadline || !c->pickup || !c->watch) {
        if (c) {
            if (c->watch) evbuffer_remove_cb_entry(bufferevent_get_input(bev), c->watch);
            if (c->deadline) event_free(c->deadline);
            if (c->pickup) event_free(c->pickup);
            free(c);
        }
        return bev; /* served, but not followed */
    }
    c->next = hc->conns;
    if (hc->conns) hc->conns->prev = c;
    hc->conns = c;
    hc->n_open++;
    coord_metrics_http_open(hc->metrics, hc->n_open);
    c->over_cap = hc->n_open > hc->lim.max_connections;
    c->phase = PH_HEADER;
    bufferevent_incref(bev);
    event_active(c->pickup, EV_TIMEOUT, 1);
    return bev;
}

static void on_resume(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    http_conns *hc = arg;
    if (hc->listener) evconnlistener_enable(hc->listener);
}


static void on_accept_error(struct evconnlistener *lev, void *arg) {
    http_conns *hc = servers;
    while (hc && hc->http != arg) hc = hc->next_server;
    if (!hc) return;
    int e = EVUTIL_SOCKET_ERROR();
    /* Pause on every error: none of them clears by retrying at once, and a
     * retry in a loop is the 100% CPU this avoids. */
    hc->pause_s = hc->pause_s <= 0 ? 0.1 : hc->pause_s * 2 > 1.0 ? 1.0 : hc->pause_s * 2;
    evconnlistener_disable(lev);
    coord_metrics_http_accept_error(hc->metrics);
    struct timeval tv = {0, (suseconds_t)(hc->pause_s * 1e6)};
    if (hc->pause_s >= 1.0) tv = (struct timeval){1, 0};
    evtimer_add(hc->resume, &tv);
    unsigned long dropped = 0;
    if (st_log_limit_allow(&hc->accept_log, st_now_s(), &dropped))
        ST_WARN("http: accept: %s (%d connections open); pausing new connections for %.0f ms "
                "(%lu more accept errors since the last message)",
                strerror(e), hc->n_open, hc->pause_s * 1e3, dropped);
}

http_conns *http_conns_new(struct event_base *base, struct evhttp *http, const http_conn_limits *lim,
                           http_tls *tls, coord_metrics *metrics, st_err *err) {
    http_conns *hc = calloc(1, sizeof *hc);
    if (!hc) return (void)st_errf(err, "http: out of memory"), NULL;
    hc->base = base;
    hc->http = http;
    hc->tls = tls;
    hc->metrics = metrics;
    hc->lim = *lim;
    if (hc->lim.max_connections <= 0) hc->lim.max_connections = 1024;
    if (hc->lim.header_timeout_s <= 0) hc->lim.header_timeout_s = 10;
    if (hc->lim.body_timeout_s <= 0) hc->lim.body_timeout_s = 60;
    if (hc->lim.idle_timeout_s <= 0) hc->lim.idle_timeout_s = 60;
    hc->accept_log = (st_log_limit)ST_LOG_LIMIT_INIT(10.0);
    hc->cap_log = (st_log_limit)ST_LOG_LIMIT_INIT(10.0);
    hc->deadline_log = (st_log_limit)ST_LOG_LIMIT_INIT(10.0);
    hc->resume = evtimer_new(base, on_resume, hc);
    if (!hc->resume) {
        free(hc);
        return (void)st_errf(err, "http: out of memory"), NULL;
    }
    evhttp_set_bevcb(http, on_new_bev, hc);
    hc->next_server = servers;
    servers = hc;
    return hc;
}

void http_conns_watch_listener(http_conns *hc, struct evhttp_bound_socket *sock) {
    hc->listener = evhttp_bound_socket_get_listener(sock);
    evconnlistener_set_error_cb(hc->listener, on_accept_error);
}

void http_conns_free(http_conns *hc) {
    if (!hc) return;
    for (http_conns **p = &servers; *p; p = &(*p)->next_server)
        if (*p == hc) {
            *p = hc->next_server;
            break;
        }
    /* evhttp_free closed every connection (on_close); what is left was never
     * picked up, and holds our reference on its bufferevent. */
    while (hc->conns) {
        hconn *c = hc->conns;
        struct bufferevent *bev = c->evcon ? NULL : c->bev;
        c->evcon = NULL;
        forget(c);
        if (bev) bufferevent_decref(bev);
    }
    event_free(hc->resume);
    free(hc);
}

/* The record of evcon, in whichever server follows it. */
static hconn *find(const struct evhttp_connection *evcon) {
    if (!evcon) return NULL;
    for (http_conns *hc = servers; hc; hc = hc->next_server)
        for (hconn *c = hc->conns; c; c = c->next)
            if (c->evcon == evcon) return c;
    return NULL;
}

static void on_answered(struct evhttp_request *req, void *arg) {
    hconn *c = arg;
    void (*cb)(struct evhttp_request *, void *) = c->done_cb;
    void *cb_arg = c->done_arg;
    c->done_cb = NULL;
    c->done_arg = NULL;
    arm(c, PH_IDLE); /* evhttp frees the connection next if it closes */
    if (cb) cb(req, cb_arg);
}

void http_conns_request_read(http_conns *hc, struct evhttp_request *req) {
    (void)hc;
    hconn *c = find(evhttp_request_get_connection(req));
    if (!c) return;
    arm(c, PH_BUSY);
    evhttp_request_set_on_complete_cb(req, on_answered, c);
}

void http_conn_set_closecb(struct evhttp_connection *evcon, void (*cb)(struct evhttp_connection *, void *),
                           void *arg) {
    hconn *c = find(evcon);
    if (!c) {
        evhttp_connection_set_closecb(evcon, cb, arg);
        return;
    }
    c->user_cb = cb;
    c->user_arg = arg;
}

void http_conn_set_on_complete(struct evhttp_request *req, void (*cb)(struct evhttp_request *, void *),
                               void *arg) {
    hconn *c = find(evhttp_request_get_connection(req));
    if (!c) {
        evhttp_request_set_on_complete_cb(req, cb, arg);
        return;
    }
    c->done_cb = cb;
    c->done_arg = arg;
    evhttp_request_set_on_complete_cb(req, on_answered, c);
}

int http_conns_open(const http_conns *hc) { return hc ? hc->n_open : 0; }
