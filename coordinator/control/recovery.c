/* recovery.c — recovery from a lost stage (recovery.h, docs/recovery.md). */
#include "coordinator/control/recovery.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

void recovery_init(recovery *rec, epochs *ep, ctl_requests *rq, engine_totals *totals, double timeout_s) {
    memset(rec, 0, sizeof *rec);
    rec->ep = ep;
    rec->rq = rq;
    rec->totals = totals;
    rec->timeout_s = timeout_s;
}

bool recovery_holding(const recovery *rec) {
    return rec->lost && rec->lost == rec->ep->cur && !rec->expired;
}

void recovery_on_lost(recovery *rec, run *r, int stage, const char *msg) {
    epochs *ep = rec->ep;
    if (r != ep->cur && r != ep->from) return; /* retired: nothing depends on it */
    const char *node = stage >= 0 && stage < r->pl.n_stages ? r->pl.st[stage].node : "?";
    const reg_node *rn = registry_find(ep->o.reg, node);
    if (rec->n_excl < PLACE_STAGE_MAX) {
        snprintf(rec->excl[rec->n_excl].name, sizeof rec->excl[rec->n_excl].name, "%s", node);
        rec->excl[rec->n_excl].lease = rn ? rn->lease : 0;
        rec->n_excl++;
    }
    char ids[1024];
    int n = requests_held_ids(rec->rq, r->cl, ids, sizeof ids);
    if (r != ep->cur) {
        ST_WARN("control: recovery: epoch %" PRIu64 " (being switched away from) lost stage %d on %s: %s; "
                "its %d request(s) [%s] move to epoch %" PRIu64,
                r->pl.epoch, stage, node, msg, n, ids, ep->cur->pl.epoch);
        return;
    }
    if (!rec->lost) {
        rec->lost = r;
        ep->adopt_epoch = r->pl.epoch; /* survivors keep an unchanged stage of it */
        rec->lost_at = st_now_s();
        rec->expired = false;
        rec->stuck_logged = false;
        rec->recoveries++;
        ep->retry_at = 0;
    }
    snprintf(rec->msg, sizeof rec->msg, "%s", msg);
    snprintf(rec->node, sizeof rec->node, "%s", node);
    rec->stage = stage;
    ST_ERROR("control: recovery: epoch %" PRIu64 " lost stage %d on node %s: %s; holding %d request(s) [%s] "
             "for up to %.0f s while it is re-placed",
             r->pl.epoch, stage, node, msg, n, ids, rec->timeout_s);
    event_active(ep->o.tick, 0, 0);
}

int recovery_move(recovery *rec, run *from, run *to) {
    bool resume = from == rec->lost;
    char ids[1024];
    int64_t tokens = 0;
    if (resume) {
        requests_held_ids(rec->rq, from->cl, ids, sizeof ids);
        cluster_request_ids(from->cl, NULL, 0, &tokens);
    }
    int n = requests_move(rec->rq, from->cl, to->cl);
    if (resume) {
        rec->seqs_resumed += (uint64_t)n;
        rec->tokens_recomputed += (uint64_t)tokens;
        engine_totals_note_resume(rec->totals, st_now_s() - rec->lost_at);
        ST_INFO("control: recovery: epoch %" PRIu64 " serves %.2f s after the loss in epoch %" PRIu64
                "; resumed %d request(s) [%s] by re-prefilling %" PRId64 " token(s)",
                to->pl.epoch, st_now_s() - rec->lost_at, from->pl.epoch, n, ids, tokens);
        rec->lost = NULL;
        rec->ep->adopt_epoch = 0;
        rec->n_excl = 0;
    }
    return n;
}

static bool excluded(const recovery *rec, const char *name) {
    for (int i = 0; i < rec->n_excl; i++) {
        if (strcmp(rec->excl[i].name, name)) continue;
        const reg_node *n = registry_find(rec->ep->o.reg, name);
        if (n && n->lease == rec->excl[i].lease) return true;
    }
    return false;
}

void recovery_tick(recovery *rec, double t) {
    epochs *ep = rec->ep;
    char ids[1024];
    if (!rec->expired && t - rec->lost_at >= rec->timeout_s) {
        rec->expired = true;
        int n = requests_held_ids(rec->rq, rec->lost->cl, ids, sizeof ids);
        char msg[ST_ERR_MSG_MAX + 128];
        snprintf(msg, sizeof msg, "the cluster could not recover within %.0f s (recovery_timeout) from: %s",
                 rec->timeout_s, rec->msg);
        ST_ERROR("control: recovery: no placement serves %.0f s after the loss; failing %d request(s) [%s]; "
                 "new requests get 503 until one does",
                 rec->timeout_s, n, ids);
        cluster_fail_requests(rec->lost->cl, msg);
    }
    if (ep->pend || ep->from || t < ep->retry_at) return;
    place_node *nodes;
    int n_all = epochs_usable_nodes(ep, &nodes, NULL), n = 0;
    for (int i = 0; i < n_all; i++) /* in place: n <= i */
        if (!excluded(rec, nodes[i].name)) nodes[n++] = nodes[i];
    placement pl;
    int code = 0;
    st_err err = {{0}};
    if (n == 0) st_errf(&err, "no usable node is left");
    int rc = n == 0 ? -1 : place_auto(ep->o.pm, nodes, n, &pl, &code, &err);
    free(nodes);
    if (rc != 0) {
        if (!rec->stuck_logged)
            ST_ERROR("control: recovery: cannot re-place yet (%s); waiting for capacity%s", err.msg,
                     rec->expired ? "" : " (requests are held until recovery_timeout)");
        rec->stuck_logged = true;
        return;
    }
    if (epochs_change(ep, &pl, &code, &err) != 0) {
        ST_ERROR("control: recovery: %s", err.msg);
        ep->retry_at = t + EPOCHS_RETRY_S;
        return;
    }
    requests_held_ids(rec->rq, rec->lost->cl, ids, sizeof ids);
    ST_INFO("control: recovery: re-placing over %d node(s) as epoch %" PRIu64 "; requests [%s] resume when it serves",
            n, pl.epoch, ids);
}
