/* lifecycle.c — signals, graceful shutdown and systemd notifications of the
 * coordinator (lifecycle.h). */
#include "coordinator/lifecycle.h"

#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/notify.h"

#define POLL_S 0.05   /* how often the drain checks for the last completion */
#define FLUSH_S 0.25  /* the loop runs this long after the last replies are queued */
#define STATUS_S 1.0  /* STATUS= refresh */

struct lifecycle {
    lifecycle_opts o;
    struct event *sigterm, *sigint, *poll, *status;
    st_watchdog *wd;
    bool stopping, ending;
    int signals;
    double deadline;
};

static struct timeval tv_of(double s) {
    return (struct timeval){(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
}

static void send_status(lifecycle *l) {
    if (l->ending) return;
    if (l->stopping) {
        double left = l->deadline - st_now_s();
        st_notify_status("draining: %d request(s) in flight, %.0f s left", http_api_active(l->o.api),
                         left > 0 ? left : 0);
        return;
    }
    st_err err = {{0}};
    coord_engine *e = l->o.engine;
    if (e->ops->health && e->ops->health(e->impl, &err) != 0) {
        st_notify_status("not serving: %s", err.msg);
        return;
    }
    coord_engine_stats st = {0};
    if (e->ops->stats) e->ops->stats(e->impl, &st);
    coord_engine_stats_release(&st);
    st_notify_status("serving epoch %llu, %d stage(s): %d running, %d queued", (unsigned long long)st.epoch,
                     st.n_stages, st.running, st.queue_depth);
}

static void on_status(evutil_socket_t fd, short what, void *arg) { send_status(arg); }

/* Ends what is left and leaves the loop after FLUSH_S. */
static void end_now(lifecycle *l, const char *why) {
    if (l->ending) return;
    l->ending = true;
    int n = http_api_end_all(l->o.api, why);
    if (n) ST_WARN("coordinator: shutdown: ended %d request(s) in progress: %s", n, why);
    else ST_INFO("coordinator: shutdown: no request in progress; exiting");
    st_notify_status("stopping");
    struct timeval tv = tv_of(FLUSH_S); /* the last replies (and [DONE]s) are still in the buffers */
    event_base_loopexit(l->o.base, &tv);
}

static void on_poll(evutil_socket_t fd, short what, void *arg) {
    lifecycle *l = arg;
    if (http_api_active(l->o.api) == 0) {
        end_now(l, "drained");
        return;
    }
    if (st_now_s() >= l->deadline) {
        char why[160];
        snprintf(why, sizeof why, "the server shut down before this completion finished "
                                  "(shutdown grace period of %.0f s)", l->o.grace_s);
        end_now(l, why);
    }
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    lifecycle *l = arg;
    l->signals++;
    if (l->signals == 1) {
        l->stopping = true;
        l->deadline = st_now_s() + l->o.grace_s;
        http_api_drain(l->o.api, SHUTDOWN_RETRY_AFTER_S);
        st_notify_stopping();
        ST_INFO("coordinator: signal %d: draining; admissions closed, %d request(s) in flight get up to "
                "%.0f s (a second signal ends them now)",
                (int)sig, http_api_active(l->o.api), l->o.grace_s);
        send_status(l);
        struct timeval tv = tv_of(POLL_S);
        if (l->poll && event_add(l->poll, &tv) == 0) {
            on_poll(-1, 0, l);
            return;
        }
        end_now(l, "the server is shutting down");
        return;
    }
    ST_WARN("coordinator: signal %d again: ending the %d request(s) in flight now", (int)sig,
            http_api_active(l->o.api));
    end_now(l, "the server is shutting down (second signal: no grace period)");
}

lifecycle *lifecycle_start(const lifecycle_opts *o, st_err *err) {
    lifecycle *l = calloc(1, sizeof *l);
    if (!l) return (void)st_errf(err, "out of memory"), NULL;
    l->o = *o;
    signal(SIGPIPE, SIG_IGN);
    l->sigterm = evsignal_new(o->base, SIGTERM, on_signal, l);
    l->sigint = evsignal_new(o->base, SIGINT, on_signal, l);
    l->poll = event_new(o->base, -1, EV_PERSIST, on_poll, l);
    l->status = event_new(o->base, -1, EV_PERSIST, on_status, l);
    struct timeval tv = tv_of(STATUS_S);
    if (!l->sigterm || !l->sigint || !l->poll || !l->status || event_add(l->sigterm, NULL) ||
        event_add(l->sigint, NULL) || event_add(l->status, &tv)) {
        lifecycle_free(l);
        return (void)st_errf(err, "cannot install the signal handlers"), NULL;
    }
    l->wd = st_watchdog_start(o->base);
    st_notify_ready();
    send_status(l);
    return l;
}

bool lifecycle_stopping(const lifecycle *l) { return l && l->stopping; }

void lifecycle_free(lifecycle *l) {
    if (!l) return;
    st_watchdog_free(l->wd);
    if (l->sigterm) event_free(l->sigterm);
    if (l->sigint) event_free(l->sigint);
    if (l->poll) event_free(l->poll);
    if (l->status) event_free(l->status);
    free(l);
}
