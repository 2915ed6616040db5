"""rpc_fixture.py — starts and stops tests/rpc/ctl_test_server for the Python
tests (test_control_py.py, test_stratactl.py), with bounded timeouts.

with TestServer(path, ["--node", "node-a"]) as srv:  srv.port, srv.addr
On exit the server gets SIGTERM and must exit 0 within 20 s (a non-zero exit,
e.g. an ASan/LSan report, fails the test); it is SIGKILLed if it hangs.
"""
import os
import select
import signal
import socket
import subprocess
import sys
import time


class TestServer:
    def __init__(self, binary, args=()):
        self.binary = binary
        self.args = list(args)
        self.proc = None
        self.port = None
        self.exit_code = None

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def __enter__(self):
        self.proc = subprocess.Popen([self.binary] + self.args, stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        line = b""
        deadline = time.monotonic() + 20
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                ch = os.read(self.proc.stdout.fileno(), 1)
                if not ch:
                    break
                line += ch
        if not line.startswith(b"PORT "):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("ctl_test_server did not print its port: %r" % line)
        self.port = int(line.split()[1])
        return self

    def stop(self):
        if self.proc is None or self.exit_code is not None:
            return self.exit_code
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.exit_code = -9
        self.proc.stdout.close()
        return self.exit_code

    def __exit__(self, *exc):
        self.stop()
        return False


def closed_port():
    """A loopback TCP port nothing listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Checker:
    def __init__(self):
        self.checks = 0
        self.failures = 0

    def check(self, cond, what):
        self.checks += 1
        if not cond:
            self.failures += 1
            print("CHECK failed: %s" % what, file=sys.stderr)

    def summary(self):
        print("%d checks, %d failures" % (self.checks, self.failures))
        return 1 if self.failures else 0
