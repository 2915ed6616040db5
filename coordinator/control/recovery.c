/* recovery.c — recovery from a lost stage (control_service.h,
 * docs/recovery.md): the serving cluster holds its requests, the lost node is
 * left out, an automatic placement over the other usable nodes is loaded
 * (epochs.c switches to it), and the held requests fail after
 * recovery_timeout if none can be. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "coordinator/control/control_internal.h"

/* The ids of the requests run r holds (their request_id, the logs' req=,
 * else the engine's number), "cmpl-…01, cmpl-…02" (at most about cap bytes,
 * then "..."), into buf; their count. */
int ctl_held_ids(const ctl_service *s, const run *r, char *buf, size_t cap) {
    size_t off = 0;
    int n = 0;
    buf[0] = 0;
    for (const lreq *q = s->reqs; q; q = q->next) {
        if (q->r != r) continue;
        if (off + 64 < cap && q->request_id[0])
            off += (size_t)snprintf(buf + off, cap - off, "%s%s", n ? ", " : "", q->request_id);
        else if (off + 64 < cap)
            off += (size_t)snprintf(buf + off, cap - off, "%s#%" PRIu64, n ? ", " : "", q->id);
        else if (off + 5 < cap && !strstr(buf, "..."))
            off += (size_t)snprintf(buf + off, cap - off, ", ...");
        n++;
    }
    if (!n) snprintf(buf, cap, "none");
    return n;
}

/* A stage of a ready run was lost (its cluster holds the requests). */
void ctl_run_on_lost(void *ud, int stage, const char *msg) {
    run *r = ud;
    ctl_service *s = r->s;
    if (r != s->cur && r != s->from) return; /* retired: nothing depends on it */
    const char *node = stage >= 0 && stage < r->pl.n_stages ? r->pl.st[stage].node : "?";
    const reg_node *rn = registry_find(&s->reg, node);
    if (s->n_excl < PLACE_STAGE_MAX) {
        snprintf(s->excl[s->n_excl].name, sizeof s->excl[s->n_excl].name, "%s", node);
        s->excl[s->n_excl].lease = rn ? rn->lease : 0;
        s->n_excl++;
    }
    char ids[1024];
    int n = ctl_held_ids(s, r, ids, sizeof ids);
    if (r != s->cur) {
        ST_WARN("control: recovery: epoch %" PRIu64 " (being switched away from) lost stage %d on %s: %s; "
                "its %d request(s) [%s] move to epoch %" PRIu64,
                r->pl.epoch, stage, node, msg, n, ids, s->cur->pl.epoch);
        return;
    }
    if (!s->lost) {
        s->lost = r;
        s->lost_at = st_now_s();
        s->recovery_expired = false;
        s->recovery_stuck_logged = false;
        s->recoveries++;
        s->retry_at = 0;
    }
    snprintf(s->lost_msg, sizeof s->lost_msg, "%s", msg);
    snprintf(s->lost_name, sizeof s->lost_name, "%s", node);
    s->lost_stage = stage;
    ST_ERROR("control: recovery: epoch %" PRIu64 " lost stage %d on node %s: %s; holding %d request(s) [%s] "
             "for up to %.0f s while it is re-placed",
             r->pl.epoch, stage, node, msg, n, ids, s->o.recovery_timeout_s);
    event_active(s->tick_ev, 0, 0);
}

static bool excluded(ctl_service *s, const char *name) {
    for (int i = 0; i < s->n_excl; i++) {
        if (strcmp(s->excl[i].name, name)) continue;
        const reg_node *n = registry_find(&s->reg, name);
        if (n && n->lease == s->excl[i].lease) return true;
    }
    return false;
}

/* Recovery, from the tick: the held requests fail after recovery_timeout;
 * meanwhile (and after) an automatic placement over the usable nodes, less
 * the lost ones, is loaded as soon as there is one. */
void ctl_recovery_tick(ctl_service *s, double t) {
    char ids[1024];
    if (!s->recovery_expired && t - s->lost_at >= s->o.recovery_timeout_s) {
        s->recovery_expired = true;
        int n = ctl_held_ids(s, s->lost, ids, sizeof ids);
        char msg[ST_ERR_MSG_MAX + 128];
        snprintf(msg, sizeof msg, "the cluster could not recover within %.0f s (recovery_timeout) from: %s",
                 s->o.recovery_timeout_s, s->lost_msg);
        ST_ERROR("control: recovery: no placement serves %.0f s after the loss; failing %d request(s) [%s]; "
                 "new requests get 503 until one does",
                 s->o.recovery_timeout_s, n, ids);
        cluster_fail_requests(s->lost->cl, msg);
    }
    if (s->pend || s->from || t < s->retry_at) return;
    place_node *nodes;
    int n_all = ctl_usable_nodes(s, &nodes, NULL), n = 0;
    for (int i = 0; i < n_all; i++) /* in place: n <= i */
        if (!excluded(s, nodes[i].name)) nodes[n++] = nodes[i];
    placement pl;
    int code = 0;
    st_err err = {{0}};
    if (n == 0) st_errf(&err, "no usable node is left");
    int rc = n == 0 ? -1 : place_auto(&s->pm, nodes, n, &pl, &code, &err);
    free(nodes);
    if (rc != 0) {
        if (!s->recovery_stuck_logged)
            ST_ERROR("control: recovery: cannot re-place yet (%s); waiting for capacity%s", err.msg,
                     s->recovery_expired ? "" : " (requests are held until recovery_timeout)");
        s->recovery_stuck_logged = true;
        return;
    }
    if (ctl_change_placement(s, &pl, &code, &err) != 0) {
        ST_ERROR("control: recovery: %s", err.msg);
        s->retry_at = t + RETRY_START_S;
        return;
    }
    ctl_held_ids(s, s->lost, ids, sizeof ids);
    ST_INFO("control: recovery: re-placing over %d node(s) as epoch %" PRIu64 "; requests [%s] resume when it serves",
            n, pl.epoch, ids);
}

