/* reply.c — a protobuf reply to a unary call (reply.h). */
#include "coordinator/control/reply.h"

#include <stdint.h>
#include <stdlib.h>

void ctl_reply(rpc_call *c, const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    /* small replies (Heartbeat, Register) are packed on the stack: the
     * heartbeat path allocates nothing of ours (rpc_call_send copies) */
    uint8_t small[256];
    uint8_t *buf = len <= sizeof small ? small : malloc(len);
    if (!buf) {
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    protobuf_c_message_pack(m, buf);
    rpc_call_reply(c, buf, len);
    if (buf != small) free(buf);
}
