/* lifecycle.h — the coordinator process under systemd or Kubernetes: the
 * signals, graceful shutdown, and what systemd is told (docs/deployment.md,
 * "Stopping and probes").
 *
 * Graceful shutdown, on the first SIGTERM or SIGINT:
 *   1. admissions close at once (http_api_drain): completions get 503
 *      "shutting_down" with Retry-After, GET /readyz answers 503; systemd
 *      gets STOPPING=1 and STATUS=draining: N request(s) in flight;
 *   2. the completions in progress go on, for up to grace_s seconds
 *      (--shutdown-grace; keep it below the unit's TimeoutStopSec=);
 *   3. at the deadline whatever is left ends with an SSE error event
 *      ("shutting_down") and data: [DONE] (a non-streaming request: the 503
 *      error body), the replies get FLUSH_S to go out, and the loop ends: the
 *      process exits 0.
 *   A second SIGTERM or SIGINT during the grace period does step 3 at once.
 *
 * systemd (common/notify.h): READY=1 once the HTTP API listens and the
 * engine runs (readiness to serve is /readyz, not READY=1); a STATUS= line
 * every second ("serving epoch 3, 2 stage(s): 3 running, 0 queued", "not serving:
 * recovering from: stage 1 at … was lost", "draining: 4 request(s) in
 * flight, 12 s left"); WATCHDOG=1 from the loop when WatchdogSec= is set.
 */
#ifndef STRATA_COORDINATOR_LIFECYCLE_H
#define STRATA_COORDINATOR_LIFECYCLE_H

#include <stdbool.h>

#include "common/err.h"
#include "coordinator/api/http_api.h"
#include "coordinator/serve/engine_api.h"

struct event_base;
typedef struct lifecycle lifecycle;

#define SHUTDOWN_GRACE_S 30.0  /* --shutdown-grace default */
#define SHUTDOWN_RETRY_AFTER_S 5 /* Retry-After of the 503s while draining */

typedef struct lifecycle_opts {
    struct event_base *base;
    http_api *api;
    coord_engine *engine;
    double grace_s; /* > 0 */
} lifecycle_opts;

/* Installs the SIGTERM / SIGINT handlers, the status timer and the
 * watchdog, and sends READY=1. NULL + err when the handlers cannot be
 * installed. */
lifecycle *lifecycle_start(const lifecycle_opts *o, st_err *err);
/* True once a signal started the shutdown. */
bool lifecycle_stopping(const lifecycle *l);
void lifecycle_free(lifecycle *l);

#endif
