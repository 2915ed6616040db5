/* rpc_code.h — gRPC status codes, shared by rpc/grpc_server and rpc/grpc_client.
 *
 * The values are gRPC's wire values (grpc/status.h, doc/statuscodes.md in the
 * gRPC repository), so code that embeds rpc/ needs no gRPC header.
 */
#ifndef STRATA_RPC_RPC_CODE_H
#define STRATA_RPC_RPC_CODE_H

#include "common/err.h"

enum rpc_code {
    RPC_OK = 0,
    RPC_CANCELLED = 1,
    RPC_UNKNOWN = 2,
    RPC_INVALID_ARGUMENT = 3,
    RPC_DEADLINE_EXCEEDED = 4,
    RPC_NOT_FOUND = 5,
    RPC_ALREADY_EXISTS = 6,
    RPC_PERMISSION_DENIED = 7,
    RPC_RESOURCE_EXHAUSTED = 8,
    RPC_FAILED_PRECONDITION = 9,
    RPC_ABORTED = 10,
    RPC_OUT_OF_RANGE = 11,
    RPC_UNIMPLEMENTED = 12,
    RPC_INTERNAL = 13,
    RPC_UNAVAILABLE = 14,
    RPC_DATA_LOSS = 15,
    RPC_UNAUTHENTICATED = 16,
};

/* The outcome of a call as the client sees it: the gRPC status code and the
 * server's (or the library's) one-line message. */
typedef struct rpc_status {
    int code;                  /* enum rpc_code */
    char msg[ST_ERR_MSG_MAX];  /* "" for OK */
} rpc_status;

/* "OK", "INVALID_ARGUMENT", ... (static strings); "UNKNOWN_CODE" for values
 * outside 0..16. */
const char *rpc_code_name(int code);

#endif
