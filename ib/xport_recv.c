/* xport_recv.c — see xport_recv.h. */
#include "ib/xport_recv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hop_trace.h"
#include "common/log.h"
#include "ib/xport_auth.h"
#include "ib/xport_mem.h"
#include "ib/xport_peers.h"
#include "ib/xport_poll.h"
#include "ib/xport_wire.h"

#define XPORT_MAX_PENDING_RX 4096 /* out-of-order frames per peer */

static void rx_free(xport *x, struct rx *r)
{
    frame_header_free(r->hdr);
    switch (r->dkind) {
    case RXD_MALLOC: free(r->data); break;
    case RXD_UCX: ucp_am_data_release(x->worker, r->data); break;
    case RXD_POOL: r->rb->in_use = false; break;
    case RXD_SINK: x->sink.put(r->sink, r->delivered, x->sink.arg); break;
    case RXD_NONE: break;
    }
    free(r);
}

static void on_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    struct rx *r = user_data;
    r->peer->ops--;
    if (status == UCS_OK && length == r->len) {
        r->state = RX_READY;
    } else {
        r->state = RX_FAILED;
        ST_DEBUG("xport: receive from %s: %s", r->peer->name, ucs_status_string(status));
    }
    ucp_request_free(request);
}

static ucs_status_t bad_frame(xport_peer *p, bool rndv, const char *why)
{
    ST_WARN("xport: malformed frame from %s: %s; disconnecting it", p->name, why);
    p->x->stats.bad_frames++;
    char reason[160];
    snprintf(reason, sizeof reason, "malformed frame: %.140s", why);
    xp_fail(p, reason);
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
}

static void rx_insert(xport_peer *p, struct rx *r)
{
    struct rx **pp = &p->rx_head;
    while (*pp && (*pp)->seq < r->seq) pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
    p->n_rx++;
}

ucs_status_t xrecv_auth_am(void *arg, const void *header, size_t header_length, void *data, size_t length,
                           const ucp_am_recv_param_t *param)
{
    xport *x = arg;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_ERR_REJECTED;
    xport_peer *p = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? xp_find(x, param->reply_ep) : NULL;
    if (!p || p->state != PEER_OPEN || p->fail) return UCS_OK;
    if (xauth_receive(&x->auth, &p->auth, header_length, data, length)) xp_kick(x); /* handled in drain */
    return UCS_OK;
}

/* Starts the rendezvous receive of r's payload (length bytes) into the rx
 * sink's region, a pool buffer or the heap. UCS_OK, or bad_frame's status
 * (r freed). */
static ucs_status_t recv_rndv(xport *x, xport_peer *p, struct rx *r, frame_header *fh, void *data, size_t length)
{
    xport_mem *sm = fh && x->sink.get ? x->sink.get(p, fh, length, x->sink.arg) : NULL;
    if (sm && sm->len < length) {
        x->sink.put(sm, false, x->sink.arg);
        sm = NULL;
    }
    struct xm_rbuf *b = sm ? NULL : xm_pool_get(x->ctx, &x->pool, length);
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv_am = on_recv_cb,
                              .user_data = r};
    if (sm) { /* straight into the sink's region (device memory: no host staging) */
        r->dkind = RXD_SINK;
        r->sink = sm;
        r->data = sm->ptr;
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        rp.memh = sm->memh;
        rp.memory_type = sm->mtype;
    } else if (b) {
        r->dkind = RXD_POOL;
        r->rb = b;
        r->data = b->ptr;
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        rp.memh = b->memh;
    } else {
        r->dkind = RXD_MALLOC;
        r->data = malloc(length);
        if (!r->data) {
            rx_free(x, r);
            return bad_frame(p, true, "out of memory");
        }
    }
    x->stats.rndv_recv++;
    r->state = RX_WAITING;
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(x->worker, data, r->data, length, &rp);
    if (sp == NULL) {
        r->state = RX_READY;
    } else if (UCS_PTR_IS_ERR(sp)) {
        ST_WARN("xport: receive from %s failed: %s", p->name, ucs_status_string(UCS_PTR_STATUS(sp)));
        rx_free(x, r);
        xp_fail(p, "receive failed");
        return UCS_OK; /* descriptor is owned by UCX now */
    } else {
        p->ops++;
    }
    rx_insert(p, r);
    return UCS_OK;
}

ucs_status_t xrecv_frame_am(void *arg, const void *header, size_t header_length, void *data, size_t length,
                            const ucp_am_recv_param_t *param)
{
    xport *x = arg;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    xport_peer *p = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? xp_find(x, param->reply_ep) : NULL;
    if (!p) {
        ST_WARN("xport: frame from an unknown endpoint dropped");
        return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    if (p->state != PEER_OPEN || p->fail) return rndv ? UCS_ERR_CANCELED : UCS_OK;
    if (xauth_pending(&p->auth)) {
        xauth_drop_frame(&x->auth, &p->auth);
        return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }

    const uint8_t *h = header;
    xw_prefix pre;
    const char *why = xw_prefix_parse(h, header_length, &pre);
    if (why) return bad_frame(p, rndv, why);
    uint64_t seq = pre.seq;
    if (seq < p->rx_next || seq - p->rx_next >= XPORT_MAX_PENDING_RX) return bad_frame(p, rndv, "bad sequence number");
    for (struct rx *q = p->rx_head; q; q = q->next)
        if (q->seq == seq) return bad_frame(p, rndv, "duplicate sequence number");

    frame_header *fh = NULL;
    size_t hdr_in_data = 0;
    st_err err;
    if (pre.flags & XPORT_FLAG_HDR_IN_DATA) {
        if (header_length != XPORT_PREFIX || pre.hdr_len > length || pre.hdr_len > FRAME_MAX_HEADER ||
            length - pre.hdr_len > FRAME_MAX_PAYLOAD)
            return bad_frame(p, rndv, "bad header-in-data length");
        hdr_in_data = pre.hdr_len;
    } else {
        if (header_length != XPORT_PREFIX + (size_t)pre.hdr_len) return bad_frame(p, rndv, "header length mismatch");
        fh = frame_header_unpack(h + XPORT_PREFIX, pre.hdr_len, &err);
        if (!fh) return bad_frame(p, rndv, err.msg);
        if (frame_validate(fh, length, &err)) {
            frame_header_free(fh);
            return bad_frame(p, rndv, err.msg);
        }
    }

    if (fh && fh->batch_id) xpoll_note_arrival(&x->poll);
    if (fh && st_hop_trace_on()) { /* common/hop_trace.h */
        st_hop_mark("wake", fh->batch_id, x->poll.woke_ns);
        st_hop_mark("recv", fh->batch_id, st_now_ns());
    }
    struct rx *r = calloc(1, sizeof *r);
    if (!r) {
        frame_header_free(fh);
        return bad_frame(p, rndv, "out of memory");
    }
    r->peer = p;
    r->seq = seq;
    r->hdr = fh;
    r->hdr_in_data = hdr_in_data;
    r->len = length;
    r->state = RX_READY;
    ucs_status_t ret = UCS_OK;
    if (length == 0) {
        r->dkind = RXD_NONE;
    } else if (rndv) {
        return recv_rndv(x, p, r, fh, data, length);
    } else if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) {
        r->dkind = RXD_UCX; /* keep UCX's descriptor, release after delivery */
        r->data = data;
        ret = UCS_INPROGRESS;
    } else {
        r->dkind = RXD_MALLOC;
        r->data = malloc(length);
        if (!r->data) {
            rx_free(x, r);
            return bad_frame(p, rndv, "out of memory");
        }
        memcpy(r->data, data, length);
    }
    rx_insert(p, r);
    return ret;
}

bool xrecv_deliver(xport *x, xport_peer *p)
{
    bool did = false;
    while (p->state == PEER_OPEN && !p->fail && p->rx_head && p->rx_head->seq == p->rx_next &&
           p->rx_head->state != RX_WAITING) {
        struct rx *r = p->rx_head;
        p->rx_head = r->next;
        p->n_rx--;
        p->rx_next++;
        did = true;
        if (r->state == RX_FAILED) {
            rx_free(x, r);
            xp_fail(p, "payload receive failed");
            break;
        }
        const uint8_t *payload = r->data;
        size_t bytes = r->len;
        if (!r->hdr) {
            st_err err;
            r->hdr = frame_header_unpack(r->data, r->hdr_in_data, &err);
            payload += r->hdr_in_data;
            bytes -= r->hdr_in_data;
            if (!r->hdr || frame_validate(r->hdr, bytes, &err)) {
                bad_frame(p, false, err.msg);
                rx_free(x, r);
                break;
            }
        }
        x->stats.frames_recv++;
        x->stats.bytes_recv += bytes;
        if (st_hop_trace_on()) st_hop_mark("deliver", r->hdr->batch_id, st_now_ns());
        if (r->hdr->batch_id) xpoll_note_ref(&x->poll, st_now_ns());
        r->delivered = x->cb.on_frame != NULL;
        if (x->cb.on_frame) x->cb.on_frame(p, r->hdr, bytes ? payload : NULL, bytes, x->cb.ud);
        rx_free(x, r);
    }
    return did;
}

void xrecv_free_all(xport *x, xport_peer *p)
{
    while (p->rx_head) {
        struct rx *r = p->rx_head;
        p->rx_head = r->next;
        rx_free(x, r);
    }
}

void xrecv_free_settled(xport *x, xport_peer *p)
{
    /* A waiting receive may still be written by UCX: kept until the worker
     * is gone. The others are released now (UCX-owned data needs the worker). */
    struct rx *keep = NULL;
    while (p->rx_head) {
        struct rx *r = p->rx_head;
        p->rx_head = r->next;
        if (r->state != RX_WAITING) {
            rx_free(x, r);
        } else {
            r->next = keep;
            keep = r;
        }
    }
    p->rx_head = keep;
}

void xrecv_free_after_worker(xport *x, xport_peer *p)
{
    while (p->rx_head) {
        struct rx *r = p->rx_head;
        p->rx_head = r->next;
        if (r->dkind == RXD_UCX) r->dkind = RXD_NONE; /* went with the worker */
        rx_free(x, r);
    }
}
