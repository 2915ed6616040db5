/* xport_peers.h — the peer table (new, linked, found by endpoint) and how
 * any part of the transport reports work to the loop: xp_kick wakes it,
 * xp_fail marks a peer for disconnection at the next drain. Safe inside UCX
 * progress (they only record and schedule). */
#ifndef STRATA_IB_XPORT_PEERS_H
#define STRATA_IB_XPORT_PEERS_H

#include <stdbool.h>
#include <ucp/api/ucp.h>

#include "ib/xport_types.h"

#define XPORT_MAX_PEERS 1024

/* New work for the loop (a UCX operation started, a completion or failure
 * queued): inside on_event it is picked up before the worker is armed again;
 * elsewhere on_event is scheduled. */
void xp_kick(xport *x);
/* Disconnect p at the next drain; the first reason is kept. */
void xp_fail(xport_peer *p, const char *reason);
/* For xauth_io: whether p is being disconnected. */
bool xp_failing(const xport_peer *p);
xport_peer *xp_find(xport *x, ucp_ep_h ep);
/* A new peer, not linked yet (its handshake started when x has a key). NULL: out of memory. */
xport_peer *xp_new(xport *x, bool inbound, const char *name);
void xp_link(xport *x, xport_peer *p);

#endif
