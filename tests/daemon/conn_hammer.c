/* conn_hammer.c — opens data-plane connections to a worker as fast as the
 * transport allows, for tests/cluster/stop_test.py: a worker that is
 * stopping (SIGTERM) keeps receiving UCX connection requests while it tears
 * its transport down. Each connection is closed as soon as it is up; at most
 * --max-open are in flight at once. Prints one line at the end:
 *   attempts=N connected=N lost=N
 *
 *   conn_hammer HOST:PORT [--seconds S] [--max-open N]
 * Exits 0 after S seconds (default 5), 2 on bad usage or when the transport
 * cannot be created.
 */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "ib/transport.h"

static struct {
    xport *x;
    struct event_base *base;
    char host[128];
    int port, max_open, open;
    double until;
    unsigned long attempts, connected, lost;
} g = {.max_open = 16};

static void on_connect(xport_peer *p, bool inbound, void *ud)
{
    (void)inbound, (void)ud;
    g.connected++;
    xport_peer_close(p);
}

static void on_disconnect(xport_peer *p, const char *reason, void *ud)
{
    (void)p, (void)reason, (void)ud;
    g.open--;
    g.lost++;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    if (st_now_s() >= g.until) {
        event_base_loopbreak(g.base);
        return;
    }
    while (g.open < g.max_open) {
        st_err err;
        g.attempts++;
        if (!xport_connect(g.x, g.host, g.port, &err)) break; /* refused at once: the worker is gone */
        g.open++;
    }
}

int main(int argc, char **argv)
{
    double seconds = 5;
    const char *addr = argc > 1 ? argv[1] : NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--max-open") && i + 1 < argc) g.max_open = atoi(argv[++i]);
        else addr = NULL;
    }
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof g.host || g.max_open < 1) {
        fprintf(stderr, "usage: conn_hammer HOST:PORT [--seconds S] [--max-open N]\n");
        return 2;
    }
    memcpy(g.host, addr, (size_t)(colon - addr));
    g.port = atoi(colon + 1);
    g.base = event_base_new();
    xport_callbacks cb = {.on_connect = on_connect, .on_disconnect = on_disconnect};
    st_err err;
    if (!g.base || !(g.x = xport_create(g.base, NULL, 0, &cb, &err))) {
        fprintf(stderr, "conn_hammer: %s\n", g.base ? err.msg : "no event base");
        return 2;
    }
    g.until = st_now_s() + seconds;
    struct event *tick = event_new(g.base, -1, EV_PERSIST, on_tick, NULL);
    struct timeval tv = {0, 2000};
    event_add(tick, &tv);
    event_base_dispatch(g.base);
    event_free(tick);
    xport_destroy(g.x);
    event_base_free(g.base);
    printf("attempts=%lu connected=%lu lost=%lu\n", g.attempts, g.connected, g.lost);
    return 0;
}
