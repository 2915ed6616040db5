/* requests.c — the live engine's requests and the cluster each lives in
 * (requests.h). */
#include "coordinator/control/requests.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A request through the engine: which cluster holds it now. */
struct lreq {
    struct lreq *prev, *next;
    ctl_requests *rq;
    uint64_t id;             /* the id the HTTP layer / Generate knows */
    cluster *cl;             /* the cluster of the epoch that holds it */
    uint64_t cid;            /* the id in cl */
    coord_sink sink;
    void *ctx;
    char request_id[64];     /* coord_request.request_id (the logs' req=), for recovery's log lines */
};

static void lreq_unlink(ctl_requests *rq, lreq *q) {
    if (q->prev)
        q->prev->next = q->next;
    else if (rq->head == q)
        rq->head = q->next;
    if (q->next) q->next->prev = q->prev;
    q->prev = q->next = NULL;
}

static void lr_on_prompt(void *ctx, const int32_t *ids, int n) {
    lreq *q = ctx;
    q->sink.on_prompt(q->ctx, ids, n);
}
static void lr_on_token(void *ctx, int32_t id, const char *piece, size_t len, const coord_logprobs *lp) {
    lreq *q = ctx;
    q->sink.on_token(q->ctx, id, piece, len, lp);
}
static void lr_on_finish(void *ctx, enum coord_finish reason, const char *message) {
    lreq *q = ctx;
    coord_sink sink = q->sink;
    void *uctx = q->ctx;
    lreq_unlink(q->rq, q);
    free(q);
    sink.on_finish(uctx, reason, message);
}
static const coord_sink lr_sink = {lr_on_prompt, lr_on_token, lr_on_finish, NULL};

int requests_submit(ctl_requests *rq, cluster *cl, const coord_request *req, const coord_sink *sink, void *ctx,
                    uint64_t *id_out, st_err *err) {
    lreq *q = calloc(1, sizeof *q);
    if (!q) return st_errf(err, "out of memory"), COORD_EINTERNAL;
    q->rq = rq;
    q->sink = *sink;
    q->ctx = ctx;
    snprintf(q->request_id, sizeof q->request_id, "%s", req->request_id);
    q->cl = cl;
    coord_engine e = cluster_engine(cl);
    int rc = e.ops->submit(e.impl, req, &lr_sink, q, &q->cid, err);
    if (rc != COORD_OK) {
        free(q);
        return rc;
    }
    q->id = ++rq->next_id;
    q->next = rq->head;
    if (rq->head) rq->head->prev = q;
    rq->head = q;
    *id_out = q->id;
    return COORD_OK;
}

void requests_cancel(ctl_requests *rq, uint64_t id) {
    for (lreq *q = rq->head; q; q = q->next)
        if (q->id == id) {
            coord_engine e = cluster_engine(q->cl);
            lreq_unlink(rq, q);
            e.ops->cancel(e.impl, q->cid);
            free(q);
            return;
        }
}

typedef struct move_ctx {
    ctl_requests *rq;
    cluster *from, *to;
} move_ctx;

/* Every request whose cluster is `from` now lives in `to` under new_id. */
static void on_moved(void *ud, uint64_t old_id, uint64_t new_id) {
    move_ctx *m = ud;
    for (lreq *q = m->rq->head; q; q = q->next)
        if (q->cl == m->from && q->cid == old_id) {
            if (new_id) {
                q->cl = m->to;
                q->cid = new_id;
            }
            return;
        }
}

int requests_move(ctl_requests *rq, cluster *from, cluster *to) {
    move_ctx m = {rq, from, to};
    return cluster_move_requests(from, to, on_moved, &m);
}

int requests_held_ids(const ctl_requests *rq, const cluster *cl, char *buf, size_t cap) {
    size_t off = 0;
    int n = 0;
    buf[0] = 0;
    for (const lreq *q = rq->head; q; q = q->next) {
        if (q->cl != cl) continue;
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

int requests_count(const ctl_requests *rq) {
    int n = 0;
    for (const lreq *q = rq->head; q; q = q->next) n++;
    return n;
}

void requests_free(ctl_requests *rq) {
    while (rq->head) {
        lreq *q = rq->head;
        lreq_unlink(rq, q);
        free(q);
    }
}
