/* http_conn.h — the HTTP API's connections: TLS, a connection cap, read
 * deadlines, and accept errors at the fd limit (docs/security.md, "HTTP
 * API"). libevent 2.1's evhttp has none of these for a server, so this module
 * hooks into it: it creates every connection's bufferevent (evhttp_set_bevcb),
 * follows it until evhttp frees it (the connection's close callback), and
 * handles the listener's accept errors.
 *
 * Per connection, one deadline at a time:
 *   header   from the accept (or the first byte of a keep-alive connection's
 *            next request) until the blank line that ends the headers; a TLS
 *            handshake counts here too
 *   body     from the end of the headers until the request is complete
 *   idle     a keep-alive connection between its requests
 *   none     while a request is handled and answered: a streaming response
 *            is never cut by a deadline
 * A connection past its deadline is closed (evhttp_connection_free).
 *
 * Beyond max_connections open connections a new one is closed at once.
 * When accept() fails for lack of descriptors or memory (EMFILE, ENFILE,
 * ENOBUFS, ENOMEM) the listener pauses for 100 ms, doubling up to 1 s while
 * it keeps failing, with at most one log line per 10 s (and the count of
 * those left out) instead of libevent's busy loop and line per failure.
 */
#ifndef STRATA_COORDINATOR_API_HTTP_CONN_H
#define STRATA_COORDINATOR_API_HTTP_CONN_H

#include "common/err.h"
#include "coordinator/api/http_tls.h"
#include "coordinator/api/metrics_coord.h"

struct event_base;
struct evhttp;
struct evhttp_bound_socket;
struct evhttp_connection;
struct evhttp_request;

typedef struct http_conn_limits {
    int max_connections;     /* open connections; 0 = 1024 */
    double header_timeout_s; /* 0 = 10 */
    double body_timeout_s;   /* 0 = 60 */
    double idle_timeout_s;   /* 0 = 60 */
} http_conn_limits;

typedef struct http_conns http_conns;

/* Takes over the creation of evhttp's connections (TLS when tls is not NULL;
 * tls must outlive the result). Call before binding. The connection counts go
 * to metrics (may be NULL; it must outlive the result). */
http_conns *http_conns_new(struct event_base *base, struct evhttp *http, const http_conn_limits *lim,
                           http_tls *tls, coord_metrics *metrics, st_err *err);
/* Handles accept errors on a bound socket of that evhttp. */
void http_conns_watch_listener(http_conns *hc, struct evhttp_bound_socket *sock);
/* Free after evhttp_free (which closes the connections through it). */
void http_conns_free(http_conns *hc);

/* The request callback calls this first: the request is complete, so the
 * connection's deadline stops until the answer is sent. */
void http_conns_request_read(http_conns *hc, struct evhttp_request *req);

/* evhttp has one close callback per connection and one completion callback
 * per request, and this module needs both; the request handlers and the
 * access log use these in place of evhttp_connection_set_closecb and
 * evhttp_request_set_on_complete_cb (one user each, as with evhttp; cb NULL
 * removes it). On a connection this module does not follow they are
 * evhttp's own. Nothing else may call evhttp's setters on this server's
 * connections: the record would never end (ctest test_http_slots checks). */
void http_conn_set_closecb(struct evhttp_connection *evcon, void (*cb)(struct evhttp_connection *, void *),
                           void *arg);
void http_conn_set_on_complete(struct evhttp_request *req, void (*cb)(struct evhttp_request *, void *),
                               void *arg);
/* Open connections now. */
int http_conns_open(const http_conns *hc);

#endif
