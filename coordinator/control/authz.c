/* authz.c — the role and node-name checks of authz.h. */
#include "coordinator/control/authz.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"

/* "/strata.v1.Control/Register" -> "Register" */
static const char *short_method(rpc_call *c)
{
    const char *m = rpc_call_method(c);
    const char *s = strrchr(m, '/');
    return s ? s + 1 : m;
}

static bool refuse(rpc_call *c, const rpc_peer *p, const char *why)
{
    ST_WARN("control: refused %s from %s (certificate CN \"%s\"): %s", short_method(c), p->addr, p->cn, why);
    rpc_call_finishf(c, RPC_PERMISSION_DENIED, "%s: %s", short_method(c), why);
    return false;
}

bool ctl_authorize(bool tls, rpc_call *c, enum ctl_role role, const char *node)
{
    if (!tls) return true;
    const rpc_peer *p = rpc_call_peer(c);
    char why[512];
    bool is_node = !strncmp(p->cn, CTL_CN_NODE, strlen(CTL_CN_NODE)) && p->cn[strlen(CTL_CN_NODE)];
    bool is_op = !strncmp(p->cn, CTL_CN_OPERATOR, strlen(CTL_CN_OPERATOR)) && p->cn[strlen(CTL_CN_OPERATOR)];
    if (!p->authenticated || (!is_node && !is_op)) {
        snprintf(why, sizeof why,
                 "certificate CN \"%s\" is neither " CTL_CN_NODE "NAME nor " CTL_CN_OPERATOR "NAME", p->cn);
        return refuse(c, p, why);
    }
    if (role == CTL_ROLE_OPERATOR) {
        if (is_op) return true;
        snprintf(why, sizeof why, "certificate \"%s\" is a node's; this call needs an operator certificate (CN "
                 CTL_CN_OPERATOR "NAME)", p->cn);
        return refuse(c, p, why);
    }
    if (!is_node) {
        snprintf(why, sizeof why, "certificate \"%s\" is not a node's (CN " CTL_CN_NODE "NAME)", p->cn);
        return refuse(c, p, why);
    }
    const char *mine = p->cn + strlen(CTL_CN_NODE);
    if (!node || strcmp(mine, node)) {
        snprintf(why, sizeof why, "certificate \"%s\" may act only as node \"%s\", not \"%.*s\"", p->cn, mine, 64,
                 node ? node : "");
        return refuse(c, p, why);
    }
    return true;
}
