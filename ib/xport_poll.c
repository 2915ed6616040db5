/* xport_poll.c — see xport_poll.h. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "ib/xport_poll.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

/* STRATA_XPORT_POLL_US: the most one spin may last; unset: XPORT_POLL_DEFAULT_US. */
#define XPORT_POLL_MAX_US 10000
#define XPORT_POLL_DEFAULT_US 0 /* off: on the quiet test machine it did not win (docs/protocol.md) */
#define XPORT_SPARE_CHECK_NS 50000u /* a spin looks for a free CPU this often */
/* A window under 1/32 of its gap may take a busy CPU: it costs the compute
 * threads at most ~3% of one CPU; a longer one spins only on a free CPU. */
#define XPORT_SPIN_DUTY_DIV 32u

void xpoll_init(xport_poll *p)
{
    p->tfd = -1;
    p->loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    cpu_set_t cs;
    p->n_cpus = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (p->n_cpus < 1) p->n_cpus = 1;
}

int xpoll_read_env(xport_poll *p, st_err *err)
{
    p->poll_ns = (uint64_t)XPORT_POLL_DEFAULT_US * 1000u;
    const char *poll = getenv("STRATA_XPORT_POLL_US");
    if (poll && *poll) {
        char *end;
        errno = 0;
        long us = strtol(poll, &end, 10);
        if (errno || *end || us < 0 || us > XPORT_POLL_MAX_US)
            return st_errf(err, "STRATA_XPORT_POLL_US=%.40s: want a whole number of microseconds in [0, %d]",
                           poll, XPORT_POLL_MAX_US);
        p->poll_ns = (uint64_t)us * 1000u;
    }
    return 0;
}

static void timer_set(xport_poll *p, uint64_t at_ns) /* 0: disarm */
{
    struct itimerspec its = {.it_value = {.tv_sec = (time_t)(at_ns / 1000000000u),
                                          .tv_nsec = (long)(at_ns % 1000000000u)}};
    if (p->tfd >= 0) timerfd_settime(p->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* Whether a CPU is free for a spin: fewer runnable threads on the machine
 * (the 4th field of /proc/loadavg, this one included) than the CPUs this
 * process may use. A spin on a busy machine takes the CPU that the sender
 * of the awaited frame, or a compute thread, needs: on the 2-CPU test
 * machine a PP 2 cluster of a tiny model (gaps of a few hundred us, as
 * long as the window) decoded at half the speed or less when it spun
 * regardless. */
static bool cpu_spare(xport_poll *p)
{
    if (p->loadavg_fd < 0) return true;
    char buf[128];
    ssize_t n = pread(p->loadavg_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return true;
    buf[n] = 0;
    const char *slash = strchr(buf, '/');
    if (!slash) return true;
    const char *s = slash;
    while (s > buf && s[-1] >= '0' && s[-1] <= '9') s--;
    long running = strtol(s, NULL, 10);
    return running - 1 < p->n_cpus; /* others runnable: fewer than the CPUs */
}

void xpoll_woke(xport_poll *p, uint64_t now) { p->ev_t0 = p->woke_ns = now; }

void xpoll_note_arrival(xport_poll *p)
{
    uint64_t now = st_now_ns();
    pp_note_arrival(&p->pred, now, p->spin_from && p->spin_from < now, p->ev_t0);
    p->data_in = true;
}

void xpoll_note_ref(xport_poll *p, uint64_t now) { pp_note_ref(&p->pred, now); }

/* Spins on the worker until progress finds work, the plan's end or poll_ns.
 * Returns whether it found work; a data frame among it is a hit. */
static bool poll_spin(xport_poll *p, uint64_t now, uint64_t end)
{
    if (end > now + p->poll_ns) end = now + p->poll_ns;
    struct timespec c0, c1; /* the spin's CPU time: its cost (wall time would count preemptions) */
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    bool hit = false;
    xpoll_woke(p, now);
    p->spin_from = 0;
    uint64_t check = now; /* the next look for a free CPU */
    while (now < end) {
        if (ucp_worker_progress(p->worker)) {
            hit = true;
            break;
        }
        now = st_now_ns();
        if (!p->spin_from) p->spin_from = now; /* one empty progress: a frame from now on is caught */
        if (p->plan_spare && now >= check) {
            if (!cpu_spare(p)) break; /* others want the CPUs: sleep instead */
            check = now + XPORT_SPARE_CHECK_NS;
        }
    }
    p->spin_from = 0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    p->spin_ns += (uint64_t)((c1.tv_sec - c0.tv_sec) * 1000000000ll + (c1.tv_nsec - c0.tv_nsec));
    if (hit && p->data_in) p->hits++;
    return hit;
}

void xpoll_plan(xport_poll *p)
{
    if (p->plan_timer && p->plan_ref != p->pred.ref_ns) { /* a newer gap: the old plan is void */
        timer_set(p, 0);
        p->plan_timer = false;
    }
    if (p->stopped || !p->ev) return;
    uint64_t start, end;
    if (!pp_plan(&p->pred, p->poll_ns, &start, &end)) return;
    uint64_t now = st_now_ns();
    p->plan_ref = p->pred.ref_ns;
    p->plan_at = start;
    p->plan_end = end;
    p->plan_spare = (end - start) * XPORT_SPIN_DUTY_DIV > p->pred.gap_ns;
    if (now >= end) return; /* late already: the usual wake-up takes it */
    p->plan_timer = start > now;
    if (p->plan_timer)
        timer_set(p, start);
    else
        event_active(p->ev, EV_READ, 0);
}

static void on_poll_timer(evutil_socket_t fd, short what, void *arg)
{
    xport_poll *p = arg;
    uint64_t v;
    ssize_t n = read(p->tfd, &v, sizeof v); /* reset readiness (EAGAIN when run at once) */
    (void)n;
    uint64_t now = st_now_ns();
    bool timer = p->plan_timer, resumed = p->resume;
    p->plan_timer = p->resume = false;
    if (p->plan_ref != p->pred.ref_ns || !p->plan_end || !p->poll_ns || p->stopped)
        return; /* a newer gap, spent, or polling turned off meanwhile */
    if (timer) pp_note_late(&p->pred, p->plan_at, now, p->poll_ns); /* the next plan's lead */
    if (!resumed) p->spins++;
    uint64_t end = p->plan_end;
    p->plan_end = 0; /* spent */
    p->data_in = false;
    if (poll_spin(p, now, end)) {
        if (!p->data_in) p->plan_end = end; /* a control frame: deliver it, then spin on */
        p->on_work(p->arg);
        if (p->plan_end && p->plan_ref == p->pred.ref_ns && !p->stopped) {
            p->resume = true;
            event_active(p->ev, EV_READ, 0);
        }
        return;
    }
    if (ucp_worker_arm(p->worker) == UCS_ERR_BUSY) p->on_work(p->arg);
}

int xpoll_start(xport_poll *p, struct event_base *base, ucp_worker_h worker, void (*on_work)(void *arg),
                void *arg, st_err *err)
{
    p->worker = worker;
    p->on_work = on_work;
    p->arg = arg;
    /* A timerfd, not a libevent timer (those round epoll's timeout up to
     * whole milliseconds). */
    p->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (p->tfd < 0) return st_errf(err, "xport: timerfd_create: %s", strerror(errno));
    p->ev = event_new(base, p->tfd, EV_READ | EV_PERSIST, on_poll_timer, p);
    if (!p->ev || event_add(p->ev, NULL)) return st_errf(err, "xport: cannot add the poll timer to the loop");
    return 0;
}

void xpoll_close(xport_poll *p)
{
    if (p->ev) event_free(p->ev);
    if (p->tfd >= 0) close(p->tfd);
    if (p->loadavg_fd >= 0) close(p->loadavg_fd);
}

int xpoll_set_us(xport_poll *p, long us, st_err *err)
{
    if (us < 0 || us > XPORT_POLL_MAX_US)
        return st_errf(err, "xport: idle poll of %ld us: want [0, %d]", us, XPORT_POLL_MAX_US);
    p->poll_ns = (uint64_t)us * 1000u;
    if (!p->poll_ns && p->plan_timer) {
        timer_set(p, 0);
        p->plan_timer = false;
    }
    return 0;
}

long xpoll_us(const xport_poll *p) { return (long)(p->poll_ns / 1000u); }
