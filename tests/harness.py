"""harness.py — the pieces the Python integration tests (tests/control,
tests/cluster, tests/api) and bench/failover.py share: check() and its FAILS
list, free_port(), closed_port(), wait_for(), an SSE reader, a greedy SSE completion, and
the start of a live cluster's state (LiveBase), and eventually() for log
reads. stdlib only; scripts import it with sys.path.insert(0, <the tests/ folder>).
"""
import datetime
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

FAILS = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def log_time(line):
    """The wall-clock time (s since the epoch) of a Strata log line
    (common/log.c: `ts=2026-12-01T15:59:29.123Z level=...`); ValueError when
    the line has none."""
    stamp = line.split(" ", 1)[0]
    if stamp.startswith("ts="):
        stamp = stamp[3:]
    d = datetime.datetime.strptime(stamp.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
    return d.replace(tzinfo=datetime.timezone.utc).timestamp()


_PORT_LOCKS = []  # reservations of free_port, held until this test process exits


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host="127.0.0.1"):
    """A port for a server this test starts. It is
    - below the kernel's ephemeral range, so no outgoing connection of any
      process (UCX, gRPC, curl) takes it as its local port meanwhile: a port
      from bind(0) could be, and the server then failed with "in use";
    - reserved for this process's lifetime by an flock under
      $TMPDIR/strata-ports, so a test running beside this one does not pick
      it too;
    - bindable on host now."""
    import fcntl
    import random
    lock_dir = os.path.join(tempfile.gettempdir(), "strata-ports")
    os.makedirs(lock_dir, exist_ok=True)
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    ports = list(range(low, high))
    random.shuffle(ports)
    for p in ports:
        fd = os.open(os.path.join(lock_dir, str(p)), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        s = socket.socket()
        try:
            s.bind((host, p))
        except OSError:
            os.close(fd)  # in use by something else: the lock goes with it
            continue
        finally:
            s.close()
        _PORT_LOCKS.append(fd)
        return p
    raise RuntimeError("free_port: no free port in [%d, %d)" % (low, high))


def closed_port(host="127.0.0.1"):
    """A port that refuses connections for as long as the returned socket
    lives: bound but not listening, so no other process (a test running
    beside this one) can start listening there. Returns (socket, port)."""
    s = socket.socket()
    s.bind((host, 0))
    return s, s.getsockname()[1]


def wait_for(fn, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception:  # noqa: BLE001 - retried until the deadline
            pass
        time.sleep(step)
    return None


def eventually(fn, timeout=20, step=0.05):
    """fn() polled until it returns a true value or timeout s have passed:
    that value, else fn()'s last one. For what a log shows of an event the
    test has seen happen: a process may write the line after the test saw
    the effect (another process's answer, a completion), so one read can
    come too early on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            v = fn()
        except Exception:  # noqa: BLE001 - retried until the deadline
            v = None
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(step)


def sse_events(r):
    """The `data:` events of an SSE response r, parsed as JSON; None for
    [DONE], after which it stops (as it does at the end of the body)."""
    while True:
        line = r.readline()
        if not line:
            return
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if line[6:] == b"[DONE]":
            yield None
            return
        yield json.loads(line[6:])


def sse_completion(port, prompt, n, on_chunk=None, timeout=300):
    """One greedy SSE completion (ignore_eos, return_token_ids) on
    127.0.0.1:port: (saw [DONE], token ids, error messages). on_chunk(ids, k)
    after each chunk that is not an error (ids so far, k of them new)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                "stream": True, "return_token_ids": True}
        c.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return False, [], ["HTTP %d: %s" % (r.status, r.read()[:300])]
        ids, errors, done = [], [], False
        for ch in sse_events(r):
            if ch is None:
                done = True
                break
            if "error" in ch:
                errors.append(ch["error"].get("message", str(ch["error"])))
                continue
            new = ch["choices"][0].get("token_ids", [])
            ids += new
            if on_chunk:
                on_chunk(ids, len(new))
        return done, ids, errors
    finally:
        c.close()


class LiveBase:
    """What a live cluster (strata-coordinator --live on loopback, workers
    registering over gRPC) starts from: a temporary folder (prefix), the
    stories260K model, the environment of its processes, an HTTP port, a gRPC
    address and a cluster.ini."""

    def __init__(self, args, prefix):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.model = os.path.join(args.shared, "models", "stories260K.gguf")
        self.env = dict(os.environ)
        self.env.setdefault("UCX_TLS", "tcp")
        self.env.setdefault("UCX_NET_DEVICES", "lo")  # loopback only (other tests may add bridges)
        self.env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.grpc_addr = "127.0.0.1:%d" % self.grpc_port
        self.workers = {}
        self.cfg = os.path.join(self.tmp, "cluster.ini")
        with open(self.cfg, "w") as f:
            f.write("[cluster]\nmodel = %s\nkv_blocks = 256\n" % self.model)

    def dump(self, lines=25):
        for name in sorted(os.listdir(self.tmp)):
            if name.endswith(".log"):
                with open(os.path.join(self.tmp, name), errors="replace") as f:
                    text = f.readlines()
                print("---- %s (last %d lines)" % (name, lines))
                sys.stdout.write("".join(text[-lines:]))


def stream_all(port, prompts, n, on_progress=None):
    """sse_completion of every prompt at once (a thread each): their results,
    in order; an exception is the result (False, [], ["exception: ..."]).
    on_progress(token counts of every stream so far) after each chunk."""
    progress = [0] * len(prompts)
    out = [None] * len(prompts)

    def run(i):
        def chunk(ids, k):
            progress[i] = len(ids)
            if on_progress:
                on_progress(progress)
        try:
            out[i] = sse_completion(port, prompts[i], n, chunk)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            out[i] = (False, [], ["exception: %r" % e])
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    return out


def lsan_could_not_run(folder, name):
    """True when a log of process name (folder/NAME*.log) ends with
    LeakSanitizer's own fatal error: its tracer could not stop the threads
    (it happens on a loaded machine while a library thread starts or ends)
    and the process exits with ASan's status 1 without having checked."""
    try:
        logs = [f for f in os.listdir(folder) if f.startswith(name) and f.endswith(".log")]
    except OSError:
        return False
    for f in logs:
        with open(os.path.join(folder, f), errors="replace") as fh:
            if "LeakSanitizer has encountered a fatal error" in fh.read():
                return True
    return False


def finish(cl, after_stop=None):
    """The end of a live-cluster test: stops cl (every process by pid,
    cl.stop() -> {name: exit status}), runs after_stop() (e.g. removing
    namespaces), checks every process left exited 0 on SIGTERM, prints the
    logs when any check failed (that one included: a sanitizer report at exit
    is only in the logs) and removes cl.tmp when all passed. cl may be None
    (the set-up failed). The exit status for sys.exit."""
    rcs = cl.stop() if cl else {}
    if after_stop:
        after_stop()
    for name, rc in rcs.items():
        if rc == 1 and lsan_could_not_run(cl.tmp, name):
            print("note: %s exited 1 because LeakSanitizer itself failed (its stop-the-world tracer), not "
                  "for a leak or an error it found: not counted" % name)
            rcs[name] = 0
    check(all(rc == 0 for rc in rcs.values()), "every process left exited 0 on SIGTERM: %s" % rcs)
    if FAILS:
        if cl:
            cl.dump()
        print("%d FAILED: %s" % (len(FAILS), FAILS))
        return 1
    if cl:
        shutil.rmtree(cl.tmp, ignore_errors=True)
    print("all checks passed")
    return 0


def reap(procs, timeout=30):
    """Waits for each (name, Popen) of procs in turn, timeout s each (then
    SIGKILL): {name: exit status, None for one that had to be killed}."""
    rcs = {}
    for name, p in procs:
        try:
            rcs[name] = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rcs[name] = None
    return rcs


def http_get(port, path, timeout=30):
    """GET path on 127.0.0.1:port: (status, body as text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def check_streams(out, base, prefix=""):
    """check() per stream: out[i] (done, ids, errors) ended with [DONE], no
    error event and the token ids base[i]; the first difference printed."""
    for i, (o, b) in enumerate(zip(out, base)):
        done, ids, errs = o
        good = done and not errs and ids == b
        if not good:
            first = next((k for k in range(min(len(ids), len(b))) if ids[k] != b[k]), None)
            print("  stream %d: done=%s errors=%s %d tokens, first difference at %s"
                  % (i, done, errs[:2], len(ids), first))
        check(good, "%sstream %d ends with [DONE], no error event, the no-failure tokens" % (prefix, i))


def control_stubs(proto, wd):
    """The Python client of proto (control.proto), generated into wd (made
    afresh) with grpc_tools.protoc: the modules (grpc, control_pb2,
    control_pb2_grpc)."""
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", os.path.dirname(os.path.abspath(proto)),
                    "--python_out", wd, "--grpc_python_out", wd, os.path.abspath(proto)],
                   check=True, timeout=60)
    sys.path.insert(0, wd)
    import grpc
    import control_pb2
    import control_pb2_grpc
    return grpc, control_pb2, control_pb2_grpc


def insecure_flag(binary):
    """["--insecure"] when binary's --help offers it (a listener on a
    non-loopback address needs credentials or that flag, common/exposure.h),
    else []."""
    try:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        return ["--insecure"] if "--insecure" in out.stdout + out.stderr else []
    except (OSError, subprocess.TimeoutExpired):
        return []


def netns_unavailable():
    """Why network-namespace tests cannot run here (no root / CAP_NET_ADMIN,
    no `ip netns`, no nft, or nft not usable inside a namespace), or None.
    Tries the real thing in a scratch namespace, removed again."""
    if not shutil.which("ip"):
        return "no `ip` (iproute2; scripts/bootstrap installs it)"
    if not shutil.which("nft"):
        return "no `nft` (nftables; scripts/bootstrap installs it)"
    ns = "strata-probe-%d" % os.getpid()
    try:
        r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return "cannot create a network namespace (needs CAP_NET_ADMIN): %s" % r.stderr.strip()
        r = subprocess.run(["ip", "netns", "exec", ns, "nft", "add", "table", "inet", "probe"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return "nft does not work in a network namespace: %s" % r.stderr.strip()
        return None
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


class NetnsBridge:
    """Network namespaces joined by a bridge in the root namespace: the bridge
    holds 10.77.S.1/24 (the root namespace's address: the coordinator), and
    add(k) makes namespace k with a veth pair whose root end is a bridge port
    and whose inside end holds 10.77.S.(k+2)/24. One subnet on one bridge, not
    a routed /30 per veth: UCX's tcp transport binds a connection to the
    device it chose, and a routed path fails its wire-up (UCX 1.13).
    Faults: down(k)/up(k) set the root end of k's veth down/up (a cut
    cable); drop(k)/undrop(k) add/remove an nft table in namespace k that
    silently drops every packet through its veth (a partition with no reset
    and no carrier change). close() removes everything (namespaces, veths,
    bridge) and is safe to call twice; use it in a finally."""

    def __init__(self):
        self.sweep()
        tag = "%x" % os.getpid()  # <= 6 hex digits: interface names stay within 15 bytes
        addrs = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True, timeout=30).stdout
        self.sub = next(s for s in [os.getpid() % 200 + 20 + k for k in range(200)]
                        if "10.77.%d." % (s % 250) not in addrs) % 250
        self.br = "stbr%s" % tag
        self.tag = tag
        self.ns, self.host_ends, self.ns_ends = [], [], []
        self._made_br = False
        self.host_ip = "10.77.%d.1" % self.sub
        self._sh("ip", "link", "add", self.br, "type", "bridge")
        self._made_br = True
        self._sh("ip", "addr", "add", self.host_ip + "/24", "dev", self.br)
        self._sh("ip", "link", "set", self.br, "up")

    @staticmethod
    def sweep():
        """Removes what an earlier run left behind when it was killed before
        its close() (a ctest timeout): namespaces strata-nK-PID and links
        stbrPID / sthKPID whose process PID (hex) is gone."""
        def gone(tag):
            try:
                os.kill(int(tag, 16), 0)
                return False
            except ProcessLookupError:
                return True
            except (PermissionError, ValueError):
                return False
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
        for w in out.split():
            m = re.match(r"strata-n\d+-([0-9a-f]+)$", w)
            if m and gone(m.group(1)):
                subprocess.run(["ip", "netns", "del", w], stderr=subprocess.DEVNULL, timeout=30)
        out = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            name = line.split()[0].split("@")[0] if line.split() else ""
            m = re.match(r"(?:stbr|sth\d)([0-9a-f]+)$", name)
            if m and gone(m.group(1)):
                subprocess.run(["ip", "link", "del", name], stderr=subprocess.DEVNULL, timeout=30)

    @staticmethod
    def _sh(*cmd):
        subprocess.run(list(cmd), check=True, timeout=30)

    def add(self):
        """A new namespace: its index k (name self.ns[k], address ip(k))."""
        k = len(self.ns)
        ns = "strata-n%d-%s" % (k, self.tag)
        vh, vn = "sth%d%s" % (k, self.tag), "stn%d%s" % (k, self.tag)
        self._sh("ip", "netns", "add", ns)
        self.ns.append(ns)
        self._sh("ip", "link", "add", vh, "type", "veth", "peer", "name", vn)
        self.host_ends.append(vh)
        self.ns_ends.append(vn)
        self._sh("ip", "link", "set", vn, "netns", ns)
        self._sh("ip", "link", "set", vh, "master", self.br)
        self._sh("ip", "link", "set", vh, "up")
        self._sh("ip", "-n", ns, "addr", "add", self.ip(k) + "/24", "dev", vn)
        self._sh("ip", "-n", ns, "link", "set", vn, "up")
        self._sh("ip", "-n", ns, "link", "set", "lo", "up")
        return k

    def ip(self, k):
        return "10.77.%d.%d" % (self.sub, k + 2)

    def ucx_devices(self, k=None):
        """The environment that keeps UCX on this bridge's devices: the root
        namespace's bridge (k None: the coordinator) or namespace k's veth.
        Without it UCX also tries the bridges of other tests running at the
        same time, and those connections fail with "Endpoint timeout"."""
        return {"UCX_NET_DEVICES": self.br if k is None else self.ns_ends[k]}

    def exec_prefix(self, k):
        return ["ip", "netns", "exec", self.ns[k]]

    def down(self, k):
        self._sh("ip", "link", "set", self.host_ends[k], "down")

    def up(self, k):
        self._sh("ip", "link", "set", self.host_ends[k], "up")

    def drop(self, k):
        vn = self.ns_ends[k]
        rules = ("table inet strata_partition {\n"
                 "  chain in { type filter hook input priority 0; iifname \"%s\" drop; }\n"
                 "  chain out { type filter hook output priority 0; oifname \"%s\" drop; }\n}\n" % (vn, vn))
        subprocess.run(self.exec_prefix(k) + ["nft", "-f", "-"], input=rules, text=True, check=True, timeout=30)

    def undrop(self, k):
        self._sh(*(self.exec_prefix(k) + ["nft", "delete", "table", "inet", "strata_partition"]))

    def close(self):
        """Removes what was made; returns whether nothing of it is left."""
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, timeout=30)
        for v in self.host_ends:
            subprocess.run(["ip", "link", "del", v], stderr=subprocess.DEVNULL, timeout=30)
        if self._made_br:
            subprocess.run(["ip", "link", "del", self.br], stderr=subprocess.DEVNULL, timeout=30)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
        links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, timeout=30).stdout
        return (not any(ns in left.split() for ns in self.ns) and self.br not in links
                and not any(v in links for v in self.host_ends))
