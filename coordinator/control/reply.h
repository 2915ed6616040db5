/* reply.h — answers a unary gRPC call of strata.v1.Control with a protobuf
 * message (packed, then rpc_call_reply; RESOURCE_EXHAUSTED when out of
 * memory). Any thread that may answer the call. */
#ifndef STRATA_COORDINATOR_CONTROL_REPLY_H
#define STRATA_COORDINATOR_CONTROL_REPLY_H

#include <protobuf-c/protobuf-c.h>

#include "rpc/grpc_server.h"

void ctl_reply(rpc_call *c, const ProtobufCMessage *m);

#endif
