/* requests.h — the requests of the live serving engine (control_service.h's
 * coord_engine): each one lives in the cluster of one placement epoch, under
 * that cluster's id, and follows its sequence when it moves to the cluster of
 * a new epoch (epochs.h: a switch; recovery.h: a resume). Loop thread only.
 *
 * Ownership: the list owns its entries; an entry is freed when its request
 * finishes (the cluster's on_finish, after the caller's sink is told), is
 * cancelled, or at requests_free. The clusters belong to the caller. */
#ifndef STRATA_COORDINATOR_CONTROL_REQUESTS_H
#define STRATA_COORDINATOR_CONTROL_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/serve/cluster.h"
#include "coordinator/serve/engine_api.h"

typedef struct lreq lreq;

typedef struct ctl_requests {
    lreq *head;
    uint64_t next_id; /* the ids the HTTP layer and Generate know: 1, 2, ... */
} ctl_requests;

/* Submits req to cluster cl's engine; the sink gets its callbacks (ctx).
 * COORD_OK and *id_out, else the engine's code and err. */
int requests_submit(ctl_requests *rq, cluster *cl, const coord_request *req, const coord_sink *sink, void *ctx,
                    uint64_t *id_out, st_err *err);
/* Cancels request id (its sink hears nothing more); unknown ids are ignored. */
void requests_cancel(ctl_requests *rq, uint64_t id);
/* Moves every sequence of cluster `from` to `to` (cluster_move_requests):
 * the requests follow. Returns how many moved. */
int requests_move(ctl_requests *rq, cluster *from, cluster *to);
/* The ids of the requests cluster cl holds (their request_id, the logs'
 * req=, else the engine's number), "cmpl-…01, cmpl-…02" (at most about cap
 * bytes, then "..."; "none"), into buf; their count. */
int requests_held_ids(const ctl_requests *rq, const cluster *cl, char *buf, size_t cap);
/* How many requests are running (every cluster). */
int requests_count(const ctl_requests *rq);
/* Frees every entry without telling the sinks (the service is stopping). */
void requests_free(ctl_requests *rq);

#endif
