#!/usr/bin/python3
"""watchdog_check.py CMD... — the systemd watchdog of a Strata daemon, without
systemd: CMD runs with NOTIFY_SOCKET pointing at a datagram socket of ours,
WATCHDOG_USEC=500000 and WATCHDOG_PID = its own pid (set by a /bin/sh exec
wrapper), as systemd does for WatchdogSec=0.5s (systemd.service(5)).

  1. READY=1 arrives; then WATCHDOG=1 every 0.25 s (half the interval): 8 to
     16 of them in a 3 s window; a STATUS= line was sent; SIGTERM gives
     STOPPING=1 and exit status 0.
  2. With STRATA_TEST_WEDGE_AFTER_MS=2000 (the test-only hook of
     common/notify.h: the event loop is wedged 2 s after start): pings before
     the wedge, none in a 2 s window after it, the process still alive
     (systemd would now kill it); SIGKILLed by pid.
  3. With WATCHDOG_PID of another process: no WATCHDOG=1 at all.
Exit 0 when all of that held, 1 otherwise (the lines say what failed)."""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

USEC = 500000
FAILS = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILS.append(what)


class Run:
    def __init__(self, cmd, extra_env, own_pid=True):
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        env = dict(os.environ, NOTIFY_SOCKET=self.path, WATCHDOG_USEC=str(USEC), **extra_env)
        env.pop("JOURNAL_STREAM", None)
        pid_expr = "$$" if own_pid else "1"
        wrap = ["/bin/sh", "-c", 'WATCHDOG_PID=%s; export WATCHDOG_PID; exec "$0" "$@"' % pid_expr]
        self.out = open(os.path.join(self.dir, "out.log"), "w+")
        self.p = subprocess.Popen(wrap + cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT)
        self.msgs = []  # (monotonic time, line)

    def recv_until(self, t_end, stop_word=None):
        while True:
            left = t_end - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096).decode(errors="replace")
            except socket.timeout:
                return False
            now = time.monotonic()
            for line in data.split("\n"):
                self.msgs.append((now, line))
                if stop_word and line == stop_word:
                    return True

    def count(self, word, t0, t1):
        return sum(1 for t, l in self.msgs if l == word and t0 <= t < t1)

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        self.sock.close()
        os.unlink(self.path)
        self.out.seek(0)
        text = self.out.read()
        self.out.close()
        return text


def main():
    cmd = sys.argv[1:]
    name = os.path.basename(cmd[0])
    # 1. the pings, STATUS=, STOPPING=1
    r = Run(cmd, {})
    try:
        t0 = time.monotonic()
        ready = r.recv_until(t0 + 60, "READY=1")
        check(ready, "%s: READY=1 (after %.2f s)" % (name, time.monotonic() - t0))
        if ready:
            t_ready = time.monotonic()
            r.recv_until(t_ready + 3.5)
            n = r.count("WATCHDOG=1", t_ready + 0.5, t_ready + 3.5)
            check(8 <= n <= 16, "%s: %d WATCHDOG=1 in 3 s (every 0.25 s: 12 expected)" % (name, n))
            status = [l for _, l in r.msgs if l.startswith("STATUS=")]
            print("  %s" % status[:3])
            check(bool(status), "%s: a STATUS= line" % name)
            r.p.send_signal(signal.SIGTERM)
            check(r.recv_until(time.monotonic() + 30, "STOPPING=1"), "%s: STOPPING=1 after SIGTERM" % name)
            try:
                rc = r.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                rc = "still running"
            check(rc == 0, "%s: exit 0 after SIGTERM (%r)" % (name, rc))
            print("  after SIGTERM: %s" % [l for _, l in r.msgs if l.startswith("STATUS=")][-2:])
    finally:
        out = r.close()
        if FAILS:
            print(out[-3000:])
    # 2. the wedge
    r = Run(cmd, {"STRATA_TEST_WEDGE_AFTER_MS": "2000"})
    try:
        t0 = time.monotonic()
        if r.recv_until(t0 + 60, "READY=1"):
            t_ready = time.monotonic()
            r.recv_until(t_ready + 5.0)
            before = r.count("WATCHDOG=1", t_ready, t_ready + 1.5)
            after = r.count("WATCHDOG=1", t_ready + 3.0, t_ready + 5.0)
            check(before >= 3, "%s: %d WATCHDOG=1 in the 1.5 s before the wedge" % (name, before))
            check(after == 0, "%s: no WATCHDOG=1 once the loop is wedged (%d in 2 s)" % (name, after))
            check(r.p.poll() is None, "%s: the wedged process is still there (systemd would kill it)" % name)
        else:
            check(False, "%s (wedge run): READY=1" % name)
    finally:
        out = r.close()
        check("wedging the event loop on purpose" in out, "%s: the test hook logs the wedge" % name)
    # 3. WATCHDOG_PID of another process: not ours to ping
    r = Run(cmd, {}, own_pid=False)
    try:
        t0 = time.monotonic()
        if r.recv_until(t0 + 60, "READY=1"):
            t_ready = time.monotonic()
            r.recv_until(t_ready + 1.5)
            check(r.count("WATCHDOG=1", 0, t_ready + 2) == 0, "%s: no WATCHDOG=1 when WATCHDOG_PID is another process" % name)
        else:
            check(False, "%s (other pid): READY=1" % name)
    finally:
        r.close()
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
