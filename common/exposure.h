/* exposure.h — which listening addresses need credentials (docs/security.md).
 *
 * Every plane (the HTTP API, the gRPC control API, the worker data plane)
 * applies one rule at start-up: a listener on a loopback address may run
 * without credentials; a listener on any other address (0.0.0.0, ::, a LAN
 * address, a host name) must have that plane's credentials configured, or the
 * operator must pass --insecure, in which case a warning is logged at every
 * start. This is the single implementation of that rule; daemons call it once
 * per listener before binding.
 */
#ifndef STRATA_COMMON_EXPOSURE_H
#define STRATA_COMMON_EXPOSURE_H

#include <stdbool.h>
#include <stddef.h>

/* True when `addr` names only loopback: "127.0.0.0/8", "::1", "localhost",
 * each optionally with ":port" ("[::1]:port" for IPv6). An empty host,
 * "0.0.0.0", "::", "*", any other literal or name is not loopback. */
bool st_addr_is_loopback(const char *addr);

/* The start-up check for one listener. `plane` names it in messages
 * ("HTTP API", "gRPC control", "data plane"), `addr` is what it will bind,
 * `have_credentials` says whether that plane's credentials are configured.
 * Returns 0 when the listener may start (logging a warning when only
 * `insecure` allows it), or -1 with a one-line reason in err (errlen bytes,
 * NUL-terminated) naming the flag that would fix it. */
int st_exposure_check(const char *plane, const char *addr, bool have_credentials, bool insecure, char *err,
                      size_t errlen);

#endif
