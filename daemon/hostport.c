/* hostport.c — "host:port" split (hostport.h). */
#include "daemon/hostport.h"

#include <stdlib.h>
#include <string.h>

int hostport_parse(const char *s, char *host, size_t host_cap, int *port, int allow_zero, st_err *err)
{
    if (!s || !*s) return st_errf(err, "empty address (want HOST:PORT)");
    const char *colon = strrchr(s, ':');
    if (!colon) return st_errf(err, "address '%s' has no port (want HOST:PORT)", s);
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0) return st_errf(err, "address '%s' has no host", s);
    if (hl >= host_cap) return st_errf(err, "address '%s': host too long", s);
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (colon[1] == 0 || *end || p < (allow_zero ? 0 : 1) || p > 65535)
        return st_errf(err, "address '%s': bad port '%s'", s, colon + 1);
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (int)p;
    return 0;
}
