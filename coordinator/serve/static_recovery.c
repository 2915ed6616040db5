/* static_recovery.c — the static recovery's state machine (static_recovery.h). */
#include "coordinator/serve/static_recovery.h"

#include <event2/event.h>
#include <time.h>

#include "common/clock.h"

static void on_timeout(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    static_recovery *r = arg;
    if (r->phase == RECOVERY_IDLE || r->expired) return;
    r->expired = true;
    r->ops.expire(r->ops.ud, r->timeout_s);
}

int static_recovery_init(static_recovery *r, struct event_base *base, double timeout_s,
                         const static_recovery_ops *ops) {
    *r = (static_recovery){.phase = RECOVERY_IDLE};
    r->timeout_s = timeout_s > 0 ? timeout_s : 60.0;
    r->ops = *ops;
    r->timer = evtimer_new(base, on_timeout, r);
    return r->timer ? 0 : -1;
}

void static_recovery_free(static_recovery *r) {
    if (r->timer) event_free(r->timer);
    r->timer = NULL;
}

void static_recovery_lost(static_recovery *r, int stage) {
    r->phase = RECOVERY_RECONNECTING;
    r->expired = false;
    r->lost_at = st_now_s();
    r->n_recoveries++;
    r->ops.relink(r->ops.ud, stage);
    double t = r->timeout_s;
    struct timeval tv = {(time_t)t, (int)((t - (double)(time_t)t) * 1e6)};
    event_add(r->timer, &tv);
}

void static_recovery_all_ready(static_recovery *r) {
    if (r->phase == RECOVERY_RECONNECTING) {
        r->phase = RECOVERY_REASSIGNING;
        r->ops.reassign_all(r->ops.ud);
    } else if (r->phase == RECOVERY_REASSIGNING) {
        event_del(r->timer);
        r->phase = RECOVERY_IDLE;
        r->expired = false;
        r->ops.resume(r->ops.ud, st_now_s() - r->lost_at);
    }
}

void static_recovery_stage_dropped(static_recovery *r) {
    if (r->phase == RECOVERY_REASSIGNING) r->phase = RECOVERY_RECONNECTING;
}

void static_recovery_load_failed(static_recovery *r, int stage) {
    if (r->phase == RECOVERY_IDLE) return;
    r->phase = RECOVERY_RECONNECTING;
    r->ops.relink(r->ops.ud, stage);
}

bool static_recovery_active(const static_recovery *r) { return r->phase != RECOVERY_IDLE; }

bool static_recovery_holding(const static_recovery *r) { return r->phase != RECOVERY_IDLE && !r->expired; }
