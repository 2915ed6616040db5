/* xport_recv.h — the receive side of the data path: the two UCX AM
 * handlers (frames; handshake messages, kept for the handshake), a
 * rendezvous payload received into the rx sink's region, a pool buffer or
 * the heap, and the in-order delivery of frames to on_frame.
 *
 * Why AM: one AM carries our small header and the payload together, arrives
 * with its reply endpoint (so we know the sender), and lets the receiver
 * choose the destination buffer for rendezvous data after it has decoded and
 * validated the header: nothing is allocated for a bad frame. Per-peer
 * sequence numbers restore send order (a rendezvous frame can complete after
 * a later eager one). */
#ifndef STRATA_IB_XPORT_RECV_H
#define STRATA_IB_XPORT_RECV_H

#include <stdbool.h>
#include <stddef.h>
#include <ucp/api/ucp.h>

#include "ib/xport_types.h"

/* ucp AM handlers (arg: the xport): XPORT_AM_FRAME and XPORT_AM_AUTH. They
 * run inside progress and only record and queue. */
ucs_status_t xrecv_frame_am(void *arg, const void *header, size_t header_length, void *data, size_t length,
                            const ucp_am_recv_param_t *param);
ucs_status_t xrecv_auth_am(void *arg, const void *header, size_t header_length, void *data, size_t length,
                           const ucp_am_recv_param_t *param);

/* Delivers p's frames that are next in order and complete. Returns true
 * when it did anything. */
bool xrecv_deliver(xport *x, xport_peer *p);
/* Frees every frame p still holds (p is closed, its operations done). */
void xrecv_free_all(xport *x, xport_peer *p);
/* Teardown, before the worker goes: frees p's frames except the receives
 * UCX may still write into. */
void xrecv_free_settled(xport *x, xport_peer *p);
/* Teardown, after the worker went: frees the rest (UCX's descriptors went with it). */
void xrecv_free_after_worker(xport *x, xport_peer *p);

#endif
