/* notify.c — sd_notify messages and the watchdog timer (notify.h). */
#include "common/notify.h"

#include <event2/event.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#ifdef STRATA_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static void notify(const char *state) {
#ifdef STRATA_HAVE_SYSTEMD
    sd_notify(0, state);
#else
    (void)state;
#endif
}

void st_notify_ready(void) { notify("READY=1"); }
void st_notify_stopping(void) { notify("STOPPING=1"); }

void st_notify_status(const char *fmt, ...) {
    static char last[216]; /* loop thread only */
    char line[216] = "STATUS=";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + 7, sizeof line - 7, fmt, ap);
    va_end(ap);
    if (!strcmp(line, last)) return;
    memcpy(last, line, sizeof last);
    notify(line);
}

struct st_watchdog {
    struct event *ping, *wedge;
    unsigned long long interval_us;
};

static void on_ping(evutil_socket_t fd, short what, void *arg) { notify("WATCHDOG=1"); }

/* The test hook (notify.h): never returns, so nothing else on the loop runs. */
static void on_wedge(evutil_socket_t fd, short what, void *arg) {
    ST_WARN("STRATA_TEST_WEDGE_AFTER_MS: wedging the event loop on purpose (test hook)");
    for (;;) sleep(1);
}

static unsigned long long watchdog_usec(void) {
#ifdef STRATA_HAVE_SYSTEMD
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0) return usec;
#endif
    return 0;
}

st_watchdog *st_watchdog_start(struct event_base *base) {
    unsigned long long usec = watchdog_usec();
    const char *wedge = getenv("STRATA_TEST_WEDGE_AFTER_MS");
    long wedge_ms = wedge && *wedge ? strtol(wedge, NULL, 10) : -1;
    if (!usec && wedge_ms < 0) return NULL;
    st_watchdog *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    if (usec) {
        w->interval_us = usec / 2 ? usec / 2 : 1;
        struct timeval tv = {(time_t)(w->interval_us / 1000000), (suseconds_t)(w->interval_us % 1000000)};
        w->ping = event_new(base, -1, EV_PERSIST, on_ping, w);
        if (!w->ping || event_add(w->ping, &tv) != 0) {
            ST_ERROR("watchdog: cannot start the WATCHDOG=1 timer");
            st_watchdog_free(w);
            return NULL;
        }
        notify("WATCHDOG=1");
        ST_INFO("watchdog: WATCHDOG=1 every %.3f s (WatchdogSec %.3f s)", w->interval_us / 1e6, usec / 1e6);
    }
    if (wedge_ms >= 0) {
        struct timeval tv = {wedge_ms / 1000, (wedge_ms % 1000) * 1000};
        w->wedge = event_new(base, -1, 0, on_wedge, w);
        if (w->wedge) event_add(w->wedge, &tv);
    }
    return w;
}

unsigned long long st_watchdog_interval_us(const st_watchdog *w) { return w ? w->interval_us : 0; }

void st_watchdog_free(st_watchdog *w) {
    if (!w) return;
    if (w->ping) event_free(w->ping);
    if (w->wedge) event_free(w->wedge);
    free(w);
}
