/* rpc_code.c — names of gRPC status codes (rpc_code.h). */
#include "rpc/rpc_code.h"

const char *rpc_code_name(int code) {
    static const char *const names[] = {
        "OK",        "CANCELLED",         "UNKNOWN",        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL",      "UNAVAILABLE",    "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "UNKNOWN_CODE";
    return names[code];
}
