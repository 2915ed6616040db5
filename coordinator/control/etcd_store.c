/* etcd_store.c — the live control plane's state in etcd instead of the
 * state file (strata-coordinator --etcd; leader.h has the keys and the
 * election). The file store (state_file.c + journal.c) stays the default.
 *
 * While a standby, the service serves nothing (every gRPC call answers
 * UNAVAILABLE naming the leader, the HTTP API 503; etcd_store_standby) and its tick
 * does not run. Once elected it takes the placement, the epochs and the known
 * nodes from etcd, exactly what a restarted coordinator takes from its state
 * file: it waits for the placement's nodes to register again (the workers
 * fail over to it: --coordinator a,b) and serves the same placement under the
 * same epoch, so the workers adopt it without reloading (docs/recovery.md).
 *
 * Writes: a changed placement puts PREFIX/state; a new node (or a new data
 * address) puts PREFIX/nodes/NAME; a removal deletes it: one key per change,
 * O(1), queued to the election thread, which writes them fenced (leader.h).
 * Heartbeats and registration leases are not written: a worker that fails
 * over registers again and gets a lease from the new leader.
 */
#include "coordinator/control/etcd_store.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "coordinator/control/leader.h"
#include "coordinator/control/state_file.h"

struct etcd_store {
    etcd_store_opts o;
    leader *ha;
    bool standby;            /* not (yet) the leader: nothing is served */
};

/* The key relative to the prefix ("state", "nodes/w-a"), NULL when not ours. */
static const char *relative(const etcd_store *s, const char *key) {
    const char *prefix = leader_prefix(s->ha);
    size_t pl = strlen(prefix);
    if (strncmp(key, prefix, pl) || key[pl] != '/') return NULL;
    return key + pl + 1;
}

static void fatal(const char *msg) {
    /* A store this leader cannot read: serving a guess could assign stale
     * stages. Stop; the operator fixes the store (docs/recovery.md). */
    ST_ERROR("control: %s; exiting", msg);
    _exit(1);
}

static void on_elected(void *ud, const etcd_kvs *kv) {
    etcd_store *s = ud;
    int nodes = 0, skipped = 0;
    for (size_t i = 0; i < kv->n; i++) {
        const char *rel = relative(s, kv->kv[i].key);
        st_err err = {{0}};
        if (!rel) continue;
        if (!strcmp(rel, "state")) {
            char what[ETCD_KEY_MAX + 16];
            snprintf(what, sizeof what, "etcd %s", kv->kv[i].key);
            if (state_parse(kv->kv[i].value, kv->kv[i].value_len, what, s->o.saved, s->o.last_epoch, s->o.model_sha,
                            NULL, &err) != 0)
                fatal(err.msg);
            if (s->o.saved->epoch && s->o.saved->n_layers != s->o.n_layers) {
                st_errf(&err, "%s: placement for %d layers, the model has %d", what, s->o.saved->n_layers,
                        s->o.n_layers);
                fatal(err.msg);
            }
        } else if (!strncmp(rel, "nodes/", 6)) {
            const char *name = NULL, *addr = NULL;
            json_t *o = json_loadb(kv->kv[i].value, kv->kv[i].value_len, 0, NULL);
            if (!o || json_unpack(o, "{s:s,s:s}", "name", &name, "addr", &addr) || strcmp(name, rel + 6) ||
                !registry_add_known(s->o.reg, name, addr)) {
                /* the worker's next Register writes it again */
                ST_WARN("control: etcd %s: not a node record (%.80s); skipped", kv->kv[i].key, kv->kv[i].value);
                skipped++;
            } else {
                nodes++;
            }
            json_decref(o);
        }
    }
    s->standby = false;
    ST_INFO("control: leader: state from etcd: placement epoch %" PRIu64 " (%d stages), last epoch %" PRIu64
            ", %d known node(s)%s; waiting for the placement's nodes to register",
            s->o.saved->epoch, s->o.saved->n_stages, *s->o.last_epoch, nodes, skipped ? " (some records skipped)" : "");
    s->o.elected(s->o.ud);
}

etcd_store *etcd_store_open(const etcd_store_opts *o, st_err *err) {
    etcd_store *s = calloc(1, sizeof *s);
    if (!s) return st_errf(err, "control: out of memory"), NULL;
    s->o = *o;
    s->o.ha = NULL; /* the caller's; the leader keeps copies */
    s->standby = true;
    if (!(s->ha = leader_start(o->ha, o->base, on_elected, s, err))) {
        free(s);
        return NULL;
    }
    return s;
}

void etcd_store_close(etcd_store *s) {
    if (!s) return;
    leader_stop(s->ha);
    free(s);
}

void etcd_store_save(etcd_store *s, const placement *p, uint64_t last_epoch) {
    char *text = state_dump(p, last_epoch, s->o.model_sha, NULL);
    if (!text) {
        ST_ERROR("control: out of memory; the placement is not written to etcd");
        return;
    }
    leader_write(s->ha, "state", text);
    free(text);
}

void etcd_store_node(etcd_store *s, const char *name, const char *addr) {
    char key[REG_NAME_MAX + 8];
    snprintf(key, sizeof key, "nodes/%s", name);
    json_t *o = addr ? json_pack("{s:s,s:s}", "name", name, "addr", addr) : NULL;
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (addr && !text) {
        ST_ERROR("control: out of memory; node %s is not written to etcd", name);
        return;
    }
    leader_write(s->ha, key, text); /* NULL: delete */
    free(text);
}

bool etcd_store_standby(etcd_store *s, char *msg, size_t cap, char *http, size_t http_cap) {
    if (!s || !s->standby) return false;
    if (!msg) return true;
    char grpc[256];
    leader_current(s->ha, http, http_cap, grpc, sizeof grpc);
    if (*grpc)
        snprintf(msg, cap, "this coordinator is a standby; the leader is %s (gRPC %s)", *http ? http : "?", grpc);
    else
        snprintf(msg, cap, "this coordinator is a standby; a leader election is under way");
    return true;
}

bool etcd_store_write_stats(etcd_store *s, leader_write_stats *out) {
    if (!s) return false;
    leader_stats(s->ha, out);
    return true;
}
