/* http_tls.h — TLS for the HTTP API through libevent's OpenSSL
 * bufferevents (docs/security.md, "HTTP API").
 *
 * The server context takes a PEM certificate chain (leaf first) and its PEM
 * private key, and speaks TLS 1.2 and 1.3 only, with OpenSSL's default
 * ciphers and no renegotiation. Clients are not asked for certificates: the
 * HTTP API authenticates clients by API key (http_auth.h).
 */
#ifndef STRATA_COORDINATOR_API_HTTP_TLS_H
#define STRATA_COORDINATOR_API_HTTP_TLS_H

#include "common/err.h"

struct event_base;
struct bufferevent;
typedef struct http_tls http_tls;

/* Loads cert_file and key_file and checks that they match. NULL + err
 * ("http tls: FILE: REASON" with OpenSSL's reason) on failure. */
http_tls *http_tls_new(const char *cert_file, const char *key_file, st_err *err);
void http_tls_free(http_tls *t);

/* A server-side (accepting) OpenSSL bufferevent without a socket yet (evhttp
 * sets it), freeing its socket and SSL object with it. NULL when out of memory. */
struct bufferevent *http_tls_bufferevent(http_tls *t, struct event_base *base);

#endif
