/* control_send.c — a CONTROL frame packed and sent (control_send.h). */
#include "daemon/control_send.h"

#include <stdlib.h>

#include "common/log.h"

int control_send(xport_peer *peer, const ctl_msg *m, uint64_t epoch, uint32_t stage, uint64_t batch_id,
                 const char *what)
{
    if (!peer) return -1;
    size_t n = strata__v1__control_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        ST_ERROR("worker: out of memory for a CONTROL reply");
        return -1;
    }
    strata__v1__control_message__pack(m, buf);
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    h.batch_id = batch_id;
    h.epoch = epoch;
    h.stage = stage;
    h.control.data = buf;
    h.control.len = n;
    st_err err;
    int rc = xport_send(peer, &h, NULL, 0, NULL, NULL, NULL, &err);
    free(buf);
    if (rc) ST_WARN("worker: %s to %s failed: %s", what, xport_peer_name(peer), err.msg);
    return rc;
}
