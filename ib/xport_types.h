/* xport_types.h — the transport's state as plain data: the transport, its
 * peers, and the send and receive records that the connection lifecycle
 * (xport_ucx.c), the peer table (xport_peers.c), the send side
 * (xport_send.c) and the receive side (xport_recv.c) share. Declares no
 * functions. The handshake, polling and registered memory keep their own
 * state in the structs of their headers, embedded here. */
#ifndef STRATA_IB_XPORT_TYPES_H
#define STRATA_IB_XPORT_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "ib/transport.h"
#include "ib/xport_auth.h"
#include "ib/xport_mem.h"
#include "ib/xport_poll.h"

struct event;
struct event_base;

enum peer_state { PEER_OPEN, PEER_CLOSING, PEER_CLOSED };

enum rx_state { RX_WAITING, RX_READY, RX_FAILED };
enum rx_data { RXD_NONE, RXD_MALLOC, RXD_UCX, RXD_POOL, RXD_SINK };

struct rx { /* a received frame waiting for in-order delivery */
    struct rx *next;
    xport_peer *peer;
    uint64_t seq;
    enum rx_state state;
    frame_header *hdr;  /* NULL with HDR_IN_DATA until complete */
    size_t hdr_in_data; /* header bytes at the start of data */
    enum rx_data dkind;
    void *data;
    size_t len;
    struct xm_rbuf *rb;
    xport_mem *sink; /* RXD_SINK: the region the sink lent */
    bool delivered;
};

struct send_ctx {
    struct send_ctx *next;
    xport_peer *peer;
    xport_send_cb cb;
    void *arg;
    int status;
    uint8_t *amhdr; /* prefix (+ header) */
    uint8_t *copy;  /* header || payload when HDR_IN_DATA; the message of a handshake send */
    size_t bytes;
    /* the UCX send, kept for a send deferred until the handshake is done */
    unsigned am_id;
    size_t amhdr_len;
    const void *data;
    size_t dlen;
    uint32_t flags;
    const xport_mem *mem;
    bool internal; /* a handshake message: no callback, not in the frame counters */
};

struct xport_peer {
    xport *x;
    xport_peer *next;
    ucp_ep_h ep;
    char name[80];
    bool inbound;
    bool connect_reported;
    bool user_knows; /* on_connect reported, or the user created it: on_disconnect is due */
    bool fail;       /* error or close requested: close at next drain */
    enum peer_state state;
    char reason[160];
    int ops; /* in-flight UCX sends and receives, and undelivered send completions */
    uint64_t tx_seq, rx_next;
    struct rx *rx_head;
    int n_rx;
    void *user;
    xauth_peer auth;
    struct send_ctx *deferred_head, *deferred_tail; /* sends waiting for the handshake */
};

struct xport {
    struct event_base *base;
    xport_callbacks cb;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    struct event *ev;
    int port;
    size_t max_am_header;
    size_t eager_max; /* force eager sends up to this payload size (0: UCX decides) */
    xport_peer *peers;
    int n_peers;
    struct send_ctx *done_head, *done_tail;
    xm_pool pool;
    xport_rx_sink sink;  /* xport_set_rx_sink (get NULL: none) */
    xport_stats stats;   /* less the handshake's and the polling's counters, kept in auth and poll */
    bool destroying;
    xauth auth;          /* xport_require_auth */
    struct event *auth_ev;
    bool in_event;       /* on_event is running: xp_kick() only notes the work */
    bool issued;         /* a UCX operation was started since the last progress */
    xport_poll poll;
};

#endif
