/* placement_rpc.h — the placement calls of strata.v1.Control
 * (proto/control.proto): GetPlacement, SetPlacement, AutoPlacement (a dry
 * run too), Drain and Undrain. A change starts a new epoch through epochs.h;
 * the same stages as the serving placement are answered unchanged. Each is
 * an rpc_handler_fn whose ud is the service's epochs; operator calls
 * (control_service.c checks the role). Loop thread. */
#ifndef STRATA_COORDINATOR_CONTROL_PLACEMENT_RPC_H
#define STRATA_COORDINATOR_CONTROL_PLACEMENT_RPC_H

#include "coordinator/control/epochs.h"
#include "rpc/grpc_server.h"

void placement_rpc_get(rpc_call *c, const rpc_request *req, void *ud);
void placement_rpc_set(rpc_call *c, const rpc_request *req, void *ud);
void placement_rpc_auto(rpc_call *c, const rpc_request *req, void *ud);
void placement_rpc_drain(rpc_call *c, const rpc_request *req, void *ud);
/* Wakes the owner's tick too: with no placement yet, it may place now. */
void placement_rpc_undrain(rpc_call *c, const rpc_request *req, void *ud);

#endif
