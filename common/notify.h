/* notify.h — the daemons' side of systemd's Type=notify protocol
 * (sd_notify(3), systemd.service(5)): READY=1, STOPPING=1, STATUS= lines and
 * the watchdog. Every call is a no-op when the process was not started with
 * $NOTIFY_SOCKET, or when Strata is built without libsystemd.
 *
 * The watchdog: with WatchdogSec= in the unit, systemd sets $WATCHDOG_USEC
 * (and $WATCHDOG_PID). st_watchdog_start then sends WATCHDOG=1 from a timer
 * on the daemon's libevent loop every half interval, so the pings stop when
 * that loop is wedged (a callback that never returns) and systemd kills and
 * restarts the service (Restart=on-failure).
 *
 * Test-only hook: with $STRATA_TEST_WEDGE_AFTER_MS = N set, the loop is
 * wedged on purpose N ms after st_watchdog_start (a timer callback that
 * sleeps forever), so tests/deploy can see the pings stop. Inert unless the
 * variable is set; docs/deployment.md documents it.
 */
#ifndef STRATA_COMMON_NOTIFY_H
#define STRATA_COMMON_NOTIFY_H

struct event_base;

void st_notify_ready(void);    /* READY=1: the daemon does what it is for */
void st_notify_stopping(void); /* STOPPING=1: it is shutting down */
/* STATUS=<text> (systemctl status shows it), printf-style; a line equal to the
 * previous one is not sent again. Cut to 200 bytes. */
void st_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

typedef struct st_watchdog st_watchdog;

/* Starts the WATCHDOG=1 timer on base when systemd asked for one (see
 * above), and the test wedge when $STRATA_TEST_WEDGE_AFTER_MS is set. NULL
 * when neither applies. Free it before the loop. */
st_watchdog *st_watchdog_start(struct event_base *base);
/* The ping interval in microseconds (half of $WATCHDOG_USEC); 0 = none. */
unsigned long long st_watchdog_interval_us(const st_watchdog *w);
void st_watchdog_free(st_watchdog *w);

#endif
