/* http_framing.h — request framing checks that evhttp (libevent 2.1) leaves
 * to the server (docs/security.md, "HTTP API").
 *
 * evhttp reads a body by the first Content-Length header and ignores the
 * others, and prefers "Transfer-Encoding: chunked" over a Content-Length. A
 * proxy in front that picks the other header would see a different request
 * boundary (request smuggling). So a request is refused (400, and the
 * connection closed) when it has:
 *   - two Content-Length headers with different values, or one that is not
 *     a plain decimal number;
 *   - Transfer-Encoding together with Content-Length;
 *   - a Transfer-Encoding other than a single "chunked".
 * Identical repeated Content-Length values are accepted (RFC 9110 8.6).
 */
#ifndef STRATA_COORDINATOR_API_HTTP_FRAMING_H
#define STRATA_COORDINATOR_API_HTTP_FRAMING_H

#include <stddef.h>

struct evkeyvalq;

/* 0 when the headers frame the request unambiguously, else -1 with the
 * reason in msg (n bytes, NUL-terminated). */
int http_check_framing(const struct evkeyvalq *headers, char *msg, size_t n);

#endif
