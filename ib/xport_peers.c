/* xport_peers.c — see xport_peers.h. */
#include "ib/xport_peers.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>

#include "ib/xport_auth.h"

void xp_kick(xport *x)
{
    x->issued = true;
    if (x->in_event) return;
    if (x->ev && !x->destroying) event_active(x->ev, EV_READ, 0);
}

void xp_fail(xport_peer *p, const char *reason)
{
    if (!p->fail) {
        p->fail = true;
        snprintf(p->reason, sizeof p->reason, "%s", reason);
    }
    xp_kick(p->x);
}

bool xp_failing(const xport_peer *p) { return p->fail; }

xport_peer *xp_find(xport *x, ucp_ep_h ep)
{
    for (xport_peer *p = x->peers; p; p = p->next)
        if (p->ep == ep) return p;
    return NULL;
}

xport_peer *xp_new(xport *x, bool inbound, const char *name)
{
    xport_peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->x = x;
    p->inbound = inbound;
    p->user_knows = !inbound;
    p->state = PEER_OPEN;
    snprintf(p->name, sizeof p->name, "%s", name);
    xauth_peer_start(&x->auth, &p->auth, p, p->name, inbound);
    return p;
}

void xp_link(xport *x, xport_peer *p)
{
    p->next = x->peers;
    x->peers = p;
    x->n_peers++;
}
