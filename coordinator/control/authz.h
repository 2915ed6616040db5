/* authz.h — who may call what on the coordinator's strata.v1.Control
 * service (docs/security.md, "Control plane (gRPC)").
 *
 * With mutual TLS the caller is the subject CN of its verified client
 * certificate (rpc_call_peer), in one of two forms:
 *   "node:NAME"     a worker: Register, Heartbeat and Leave, as node NAME only;
 *   "operator:WHO"  an operator (stratactl): every other call.
 * A node certificate cannot call operator methods, an operator certificate
 * cannot register a node, and a CN of any other form can call nothing.
 * On a plaintext server (no TLS: loopback, or --insecure) every call is
 * allowed, as before.
 *
 * Refusals finish the call with PERMISSION_DENIED and a message that names
 * the certificate and what it may do, never cluster state (no model hash),
 * and are logged (warning) with the caller's address.
 */
#ifndef STRATA_COORDINATOR_CONTROL_AUTHZ_H
#define STRATA_COORDINATOR_CONTROL_AUTHZ_H

#include <stdbool.h>

#include "rpc/grpc_server.h"

enum ctl_role {
    CTL_ROLE_NODE = 1,     /* Register, Heartbeat, Leave */
    CTL_ROLE_OPERATOR = 2, /* everything else */
};

/* The CN prefixes of the two roles. */
#define CTL_CN_NODE "node:"
#define CTL_CN_OPERATOR "operator:"

/* True when the caller of c may make this call: `tls` says whether the
 * server authenticates clients; for CTL_ROLE_NODE, `node` is the node name
 * the request claims. Otherwise finishes c (PERMISSION_DENIED) and returns
 * false: the handler must not touch c again. */
bool ctl_authorize(bool tls, rpc_call *c, enum ctl_role role, const char *node);

#endif
