/* probes.h — the coordinator's probe and build-info routes, for Kubernetes,
 * systemd and load balancers (docs/api.md, "Probes"):
 *
 *   GET /livez, /healthz  200 {"status":"alive"} whenever the event loop runs
 *                          the request: liveness. Never depends on workers, so
 *                          a liveness probe never restarts a healthy
 *                          coordinator that merely has no placement.
 *   GET /readyz            200 {"status":"ready"} when a placement serves AND
 *                          admissions are open; else 503 with the OpenAI error
 *                          body, code "not_ready" (no placement, recovering)
 *                          or "shutting_down" (SIGTERM: draining), and
 *                          Retry-After. Readiness for a load balancer.
 *   GET /version           200 {"version","git_commit","build_type","model"}
 *                          (common/version.h)
 * HEAD is accepted wherever GET is. Probes are answered here, before the API
 * routes, and do not count as API requests. (GET /health stays as it was in
 * http_api.c: 200 when a placement serves, else 503, whatever the
 * admissions; docs/api.md says what it means.)
 */
#ifndef STRATA_COORDINATOR_API_PROBES_H
#define STRATA_COORDINATOR_API_PROBES_H

#include <stdbool.h>

#include "coordinator/serve/engine_api.h"

struct evhttp_request;

typedef struct probes_state {
    coord_engine *engine;    /* its health() says whether a placement serves */
    const char *model_name;
    bool draining;           /* admissions are closed (graceful shutdown) */
    int retry_after_s;       /* Retry-After of a 503 (>= 1) */
} probes_state;

/* Answers req when path is a probe route (true: answered, 405 for another
 * method included); false: not a probe, the caller routes it. */
bool probes_handle(struct evhttp_request *req, const char *path, const probes_state *st);

#endif
