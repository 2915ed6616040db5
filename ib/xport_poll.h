/* xport_poll.h — adaptive polling of the transport's ucp worker
 * (docs/protocol.md, "Polling"; the windows come from ib/poll_predict.h).
 *
 * Sleeping in epoll until the next data frame costs the wake-up of an idle
 * CPU after the frame came (on a VM 100+ us) and the cold caches after it.
 * So the loop spins on ucp_worker_progress over a window around the frame's
 * expected arrival, woken by a timer just before it: the wake-up happens
 * before the frame comes. A frame that misses the window is taken by the
 * usual epoll wake-up. Control frames (batch id 0) neither teach nor move
 * the plan.
 *
 * Takes the worker and one callback: on_work runs the transport's event
 * handler when a spin found work (or the worker could not be armed). */
#ifndef STRATA_IB_XPORT_POLL_H
#define STRATA_IB_XPORT_POLL_H

#include <stdbool.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "common/err.h"
#include "ib/poll_predict.h"

struct event;
struct event_base;

typedef struct xport_poll {
    ucp_worker_h worker;
    void (*on_work)(void *arg);
    void *arg;
    bool stopped;      /* the transport is being destroyed: no more plans or spins */
    uint64_t poll_ns;  /* the most one spin lasts (STRATA_XPORT_POLL_US; 0: never spin) */
    poll_predict pred;
    int tfd;           /* timerfd of the next spin */
    struct event *ev;
    uint64_t ev_t0;    /* when the event handler or the spin began */
    uint64_t woke_ns;  /* the same, for STRATA_HOP_TRACE's "wake" mark */
    uint64_t plan_ref; /* pred.ref_ns of the current plan */
    uint64_t plan_at, plan_end; /* the plan's start (timer) and end; end 0: none, or spent */
    bool plan_timer;   /* plan_at is on the timerfd (else it runs at once: no lateness sample) */
    bool plan_spare;   /* the window is long for its gap: spin only while a CPU is free */
    uint64_t spin_from; /* while spinning, after one empty progress: a frame now is caught exactly */
    bool data_in;       /* a data frame arrived since the spin began */
    int loadavg_fd;     /* /proc/loadavg: runnable threads, for cpu_spare (-1: unknown, always spare) */
    int n_cpus;         /* CPUs this process may run on */
    bool resume;        /* the spin was cut by a control frame: it goes on after its delivery */
    uint64_t spins, hits, spin_ns; /* xport_stats' poll_spins, poll_hits, poll_spin_ns */
} xport_poll;

/* First of all (xpoll_close is then safe): the CPU count and /proc/loadavg. */
void xpoll_init(xport_poll *p);
/* The longest spin: STRATA_XPORT_POLL_US, or the default (off). -1 + err
 * when the variable is not a number in range. */
int xpoll_read_env(xport_poll *p, st_err *err);
/* The spin's timer on base, for worker. -1 + err. */
int xpoll_start(xport_poll *p, struct event_base *base, ucp_worker_h worker, void (*on_work)(void *arg),
                void *arg, st_err *err);
void xpoll_close(xport_poll *p);

/* The event handler began at now. */
void xpoll_woke(xport_poll *p, uint64_t now);
/* A data frame arrived (inside progress). */
void xpoll_note_arrival(xport_poll *p);
/* A data frame was sent or delivered at now: the gap to the next is measured from here. */
void xpoll_note_ref(xport_poll *p, uint64_t now);
/* The loop has nothing left to do and sleeps: plan the spin for the next
 * data frame (the timer) or run it now (after the loop's other pending events). */
void xpoll_plan(xport_poll *p);

int xpoll_set_us(xport_poll *p, long us, st_err *err);
long xpoll_us(const xport_poll *p);

#endif
