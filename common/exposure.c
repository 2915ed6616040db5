/* exposure.c — the loopback-or-credentials rule of exposure.h. */
#include "common/exposure.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"

/* Copies the host part of "host", "host:port", "[v6]" or "[v6]:port" into out.
 * A bare IPv6 literal (two or more colons, no brackets) is kept whole. */
static void host_part(const char *addr, char *out, size_t n)
{
    out[0] = '\0';
    if (!addr)
        return;
    if (addr[0] == '[') {
        const char *end = strchr(addr, ']');
        if (!end)
            return; /* "[::1" is malformed, not loopback */
        size_t len = (size_t)(end - addr - 1);
        if (len >= n)
            len = n - 1;
        memcpy(out, addr + 1, len);
        out[len] = '\0';
        return;
    }
    const char *colon = strchr(addr, ':');
    size_t len = strlen(addr);
    if (colon && !strchr(colon + 1, ':'))
        len = (size_t)(colon - addr);
    if (len >= n)
        len = n - 1;
    memcpy(out, addr, len);
    out[len] = '\0';
}

bool st_addr_is_loopback(const char *addr)
{
    char host[256];
    host_part(addr, host, sizeof host);
    if (host[0] == '\0')
        return false;
    if (strcasecmp(host, "localhost") == 0)
        return true;
    struct in_addr v4;
    if (inet_pton(AF_INET, host, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    struct in6_addr v6;
    if (inet_pton(AF_INET6, host, &v6) == 1)
        return memcmp(&v6, &in6addr_loopback, sizeof v6) == 0;
    return false;
}

int st_exposure_check(const char *plane, const char *addr, bool have_credentials, bool insecure, char *err,
                      size_t errlen)
{
    if (have_credentials || st_addr_is_loopback(addr))
        return 0;
    if (insecure) {
        st_log(ST_LOG_WARN, "%s listens on %s without credentials (--insecure): anyone who can reach it can use it",
               plane, addr ? addr : "(null)");
        return 0;
    }
    snprintf(err, errlen,
             "%s: refusing to listen on non-loopback address %s without credentials; configure them "
             "(docs/security.md) or pass --insecure",
             plane, addr ? addr : "(null)");
    return -1;
}
