/* request_id.h — the request id of an HTTP request (X-Request-Id).
 *
 * A client (or a proxy in front) may send `X-Request-Id`. When it is 1 to
 * REQUEST_ID_MAX bytes of [A-Za-z0-9] and "-_.:/+=@" it becomes the request's
 * id: in every log line (req=, journald STRATA_REQUEST_ID), in the workers'
 * logs, and echoed in the response's X-Request-Id header. Otherwise (absent,
 * too long, other characters: never copied into logs) the coordinator's own
 * id, the response's "cmpl-…"/"chatcmpl-…" id, is used and sent back in
 * X-Request-Id. The completion's JSON "id" is always the cmpl-… id
 * (docs/api.md has the mapping).
 */
#ifndef STRATA_COORDINATOR_API_REQUEST_ID_H
#define STRATA_COORDINATOR_API_REQUEST_ID_H

#include <stdbool.h>
#include <stddef.h>

#define REQUEST_ID_MAX 63 /* bytes; fits coord_request.request_id */

/* True when value (may be NULL) is a usable X-Request-Id (above). */
bool request_id_valid(const char *value);

#endif
