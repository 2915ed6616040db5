#!/usr/bin/python3
"""notify_check.py CMD... — runs CMD with NOTIFY_SOCKET pointing at a datagram
socket of ours (as systemd does for Type=notify), waits for READY=1, sends
SIGTERM, waits for STOPPING=1 and for exit status 0. Prints the time to READY.
Exit 0 when all of that happened, 1 otherwise."""
import os, signal, socket, subprocess, sys, tempfile, time

def main():
    cmd = sys.argv[1:]
    d = tempfile.mkdtemp()
    path = os.path.join(d, "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    env = dict(os.environ, NOTIFY_SOCKET=path)
    env.pop("JOURNAL_STREAM", None)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    got, ok = [], True

    def wait_for(word, timeout):
        s.settimeout(timeout)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = s.recv(4096).decode()
            except socket.timeout:
                break
            got.extend(msg.split("\n"))
            if word in got:
                return True
        return False

    if wait_for("READY=1", 60):
        print("READY=1 after %.3f s" % (time.monotonic() - t0))
    else:
        print("FAIL: no READY=1 within 60 s (got %r)" % got); ok = False
    if p.poll() is not None:
        print("FAIL: exited early with %d" % p.returncode); ok = False
    else:
        p.send_signal(signal.SIGTERM)
        if wait_for("STOPPING=1", 30):
            print("STOPPING=1 after SIGTERM")
        else:
            print("FAIL: no STOPPING=1 after SIGTERM (got %r)" % got); ok = False
    try:
        out, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill(); out, _ = p.communicate(); print("FAIL: no exit within 60 s of SIGTERM"); ok = False
    if p.returncode != 0:
        print("FAIL: exit status %d" % p.returncode); ok = False
    if not ok:
        print("--- output of %s ---\n%s" % (cmd[0], out))
    os.unlink(path); os.rmdir(d)
    return 0 if ok else 1

sys.exit(main())
