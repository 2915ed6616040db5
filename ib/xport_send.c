/* xport_send.c — see xport_send.h. Wire: AM id XPORT_AM_FRAME; AM header =
 * the 24-byte prefix (ib/xport_wire.h) followed by the packed FrameHeader
 * when it fits the worker's max AM header; otherwise flag HDR_IN_DATA and
 * the data is header || payload (copied). AM data = payload. The sender
 * sets UCP_AM_SEND_FLAG_REPLY so the receiver gets the endpoint. */
#include "ib/xport_send.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "ib/xport_auth.h"
#include "ib/xport_peers.h"
#include "ib/xport_wire.h"

static void ctx_free(struct send_ctx *c)
{
    free(c->amhdr);
    free(c->copy);
    free(c);
}

/* A completion, queued for the loop (UCX callbacks only record). */
static void send_done(xport *x, struct send_ctx *c, int status)
{
    c->status = status;
    c->next = NULL;
    if (x->done_tail)
        x->done_tail->next = c;
    else
        x->done_head = c;
    x->done_tail = c;
}

static void on_send_cb(void *request, ucs_status_t status, void *user_data)
{
    struct send_ctx *c = user_data;
    if (status != UCS_OK) ST_DEBUG("xport: send to %s: %s", c->peer->name, ucs_status_string(status));
    send_done(c->peer->x, c, status == UCS_OK ? 0 : -1);
    ucp_request_free(request);
}

/* Starts the UCX send of c (am_id, amhdr, data, flags, mem filled). 0, or
 * -1 + err (c untouched: the caller frees it). */
static int issue_send(xport_peer *p, struct send_ctx *c, st_err *err)
{
    xport *x = p->x;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = c->flags,
                              .cb.send = on_send_cb,
                              .user_data = c};
    if (c->mem && c->dlen) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        rp.memh = c->mem->memh;
        if (c->mem->device) {
            rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
            rp.memory_type = c->mem->mtype;
        }
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(p->ep, c->am_id, c->amhdr_len ? c->amhdr : NULL, c->amhdr_len,
                                          c->dlen ? c->data : NULL, c->dlen, &rp);
    if (UCS_PTR_IS_ERR(sp))
        return st_errf(err, "xport: send to %s: %s", p->name, ucs_status_string(UCS_PTR_STATUS(sp)));
    if (sp == NULL) send_done(x, c, 0); /* completed at once: report from the loop */
    xp_kick(x);
    return 0;
}

void xsend_flush_deferred(xport_peer *p)
{
    while (p->deferred_head) {
        struct send_ctx *c = p->deferred_head;
        p->deferred_head = c->next;
        if (!p->deferred_head) p->deferred_tail = NULL;
        st_err err;
        if (issue_send(p, c, &err)) {
            ST_WARN("%s", err.msg);
            send_done(p->x, c, -1);
            xp_fail(p, "send failed");
        }
    }
}

void xsend_fail_deferred(xport_peer *p)
{
    while (p->deferred_head) {
        struct send_ctx *c = p->deferred_head;
        p->deferred_head = c->next;
        send_done(p->x, c, -1);
    }
    p->deferred_tail = NULL;
}

int xsend_frame(xport_peer *p, const uint8_t *hb, size_t hl, const void *payload, size_t bytes,
                const xport_mem *mem, xport_send_cb cb, void *arg, st_err *err)
{
    if (!p) return st_errf(err, "xport: no peer (NULL)");
    xport *x = p->x;
    if (p->state != PEER_OPEN || p->fail) return st_errf(err, "xport: peer %s is disconnected", p->name);
    if (bytes && !payload) return st_errf(err, "xport: payload of %zu bytes is NULL", bytes);
    if (mem && bytes &&
        ((const uint8_t *)payload < (const uint8_t *)mem->ptr ||
         (const uint8_t *)payload + bytes > (const uint8_t *)mem->ptr + mem->len))
        return st_errf(err, "xport: payload is outside its registered region");
    struct send_ctx *c = calloc(1, sizeof *c);
    if (!c) return st_errf(err, "xport: out of memory");
    c->peer = p;
    c->cb = cb;
    c->arg = arg;
    c->bytes = bytes;
    bool inline_hdr = XPORT_PREFIX + hl <= x->max_am_header;
    const bool device = mem && bytes && mem->device;
    if (device && !inline_hdr) { /* the header cannot be copied in front of device memory */
        free(c);
        return st_errf(err, "xport: a header of %zu bytes with a device payload does not fit the AM header", hl);
    }
    c->amhdr = malloc(XPORT_PREFIX + (inline_hdr ? hl : 0));
    if (!c->amhdr) goto oom;
    xw_prefix_pack(c->amhdr, !inline_hdr, (uint32_t)hl, p->tx_seq);
    const void *data = payload;
    size_t dlen = bytes;
    if (inline_hdr) {
        if (hl) memcpy(c->amhdr + XPORT_PREFIX, hb, hl);
    } else {
        c->copy = malloc(hl + bytes);
        if (!c->copy) goto oom;
        memcpy(c->copy, hb, hl);
        if (bytes) memcpy(c->copy + hl, payload, bytes);
        data = c->copy;
        dlen = hl + bytes;
        mem = NULL;
    }
    c->am_id = XPORT_AM_FRAME;
    c->amhdr_len = XPORT_PREFIX + (inline_hdr ? hl : 0);
    c->data = data;
    c->dlen = dlen;
    c->flags = UCP_AM_SEND_FLAG_REPLY;
    if (device) c->flags |= UCP_AM_SEND_FLAG_RNDV; /* the receiver picks the (device) destination */
    else if (dlen && dlen <= x->eager_max) c->flags |= UCP_AM_SEND_FLAG_EAGER;
    c->mem = mem;
    if (xauth_pending(&p->auth)) { /* goes out once the peer proved the key (xsend_flush_deferred) */
        c->next = NULL;
        if (p->deferred_tail)
            p->deferred_tail->next = c;
        else
            p->deferred_head = c;
        p->deferred_tail = c;
    } else if (issue_send(p, c, err)) {
        ctx_free(c);
        return -1;
    }
    p->tx_seq++;
    p->ops++;
    return 0;
oom:
    free(c->amhdr);
    free(c);
    return st_errf(err, "xport: out of memory");
}

int xsend_handshake(xport_peer *p, const uint8_t *msg, size_t len, st_err *err)
{
    struct send_ctx *c = calloc(1, sizeof *c);
    uint8_t *m = malloc(len);
    if (!c || !m) {
        free(c);
        free(m);
        return st_errf(err, "out of memory");
    }
    memcpy(m, msg, len);
    c->peer = p;
    c->internal = true;
    c->copy = m;
    c->am_id = XPORT_AM_AUTH;
    c->data = m;
    c->dlen = len;
    c->flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    if (issue_send(p, c, err)) {
        free(m);
        free(c);
        return -1;
    }
    p->ops++;
    return 0;
}

bool xsend_run_completions(xport *x)
{
    bool did = false;
    while (x->done_head) {
        struct send_ctx *c = x->done_head;
        x->done_head = c->next;
        if (!x->done_head) x->done_tail = NULL;
        xport_peer *p = c->peer;
        p->ops--;
        if (!c->internal) {
            if (c->status == 0) {
                x->stats.frames_sent++;
                x->stats.bytes_sent += c->bytes;
            }
            if (c->cb) c->cb(p, c->status, c->arg);
        }
        ctx_free(c);
        did = true;
    }
    return did;
}

void xsend_run_completions_final(xport *x)
{
    while (x->done_head) {
        struct send_ctx *c = x->done_head;
        x->done_head = c->next;
        c->peer->ops--;
        if (c->cb) c->cb(c->peer, c->status, c->arg);
        ctx_free(c);
    }
    x->done_tail = NULL;
}
