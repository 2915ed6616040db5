/* hostport.h — "host:port" (or "[v6]:port") split into its host and port:
 * StageAssign.next_hop and the worker's command-line addresses
 * (worker_parse_hostport in daemon/worker.h is this function).
 */
#ifndef STRATA_DAEMON_HOSTPORT_H
#define STRATA_DAEMON_HOSTPORT_H

#include <stddef.h>

#include "common/err.h"

/* Splits s into host (NUL-terminated, at most host_cap bytes) and port
 * (1..65535, or 0 when allow_zero). 0 or -1 + err. */
int hostport_parse(const char *s, char *host, size_t host_cap, int *port, int allow_zero, st_err *err);

#endif
