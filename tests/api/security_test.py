#!/usr/bin/python3
"""security_test.py — issue 14's HTTP API checks (docs/security.md, "HTTP API")
against real strata-coordinator processes on 127.0.0.1, each started and
always stopped by pid by the test.

  security_test.py MODE --coordinator BIN --worker BIN --shared DIR

MODE
  auth     a PP 2 cluster (2 workers) with an API key file of two named keys
           and STRATA_API_KEY, --max-requests-per-key 2:
           no key / a wrong key / a Basic header -> 401 with the OpenAI error
           body and WWW-Authenticate: Bearer; each key -> 200 with the reference
           tokens of stories260K (greedy); /metrics and /health open; key A with
           2 streams in flight gets 429 + Retry-After while key B gets the
           reference tokens; with a 0.4 s idle deadline, a stream whose stage 1
           worker is SIGSTOPped for 1 s mid-stream ends with [DONE] and all
           its tokens; an idle keep-alive connection is closed after the idle
           deadline; SIGHUP after a key is replaced in the file: the old key
           gets 401, the new one the reference tokens; a file that does not
           load leaves the keys in place
  tls      the same cluster over HTTPS (a CA and a server certificate made with
           openssl in a temp dir): the key gets the reference tokens, streamed
           and not; no key -> 401; a TLS 1.2-only client works, TLS 1.1 gets
           the server's protocol_version alert; a connection that never starts
           its handshake is closed at the header deadline; plain HTTP to
           the TLS port gets no HTTP answer and the server keeps serving; a
           missing certificate file stops the start with status 1
  conn     a coordinator whose worker is absent (the HTTP server runs; 503 for
           generation): slowloris connections (headers dribbled, and headers
           stopped) are closed after the 1 s header deadline while a normal
           request is answered; a stalled body after the 2 s body deadline;
           beyond --max-connections new connections are closed at once and
           the server still answers; conflicting / invalid Content-Length and
           Transfer-Encoding with Content-Length -> 400; --protect-metrics
           closes /metrics and /health to requests without the key; a
           non-loopback listen without a key exits 1 with the documented
           message, starts with --insecure (a warning) or with a key
  emfile   a coordinator whose RLIMIT_NOFILE is lowered (prlimit) to just above
           its open descriptors gets many connections: accept() fails with
           EMFILE; over 3 s its CPU time (/proc/PID/stat) stays < 0.5 s and its
           log grows < 4 KB; once the clients close it answers again
"""
import argparse
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
import cluster_test as ct  # noqa: E402  (Cluster)
from harness import FAILS, check, eventually, free_port, wait_for  # noqa: E402

KEY_A, KEY_B, KEY_ENV = "sk-alice-5f2b7c1d9e", "sk-bob-0a8c3e6f4d", "sk-env-77d1c0ffee"
KEY_C = "sk-carol-9e9e1a2b3c"


def auth(key):
    return {"Authorization": "Bearer " + key}


def request(port, method, path, body=None, headers=None, tls=None, timeout=60):
    """(status, headers dict (lower-case names), body bytes)."""
    if tls:
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=tls)
    else:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def error_of(body):
    try:
        e = json.loads(body)["error"]
        return e if isinstance(e.get("message"), str) and "type" in e and "code" in e else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def load_ref(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        return json.load(f)


def ref_body(ref, **kw):
    q = {"prompt": ref["prompt"], "max_tokens": 64, "temperature": 0, "return_token_ids": True}
    q.update(kw)
    return json.dumps(q).encode()


def check_reference(port, ref, key, what, tls=None):
    st, _, b = request(port, "POST", "/v1/completions", ref_body(ref), auth(key), tls)
    ids = json.loads(b)["choices"][0]["token_ids"] if st == 200 else None
    check(st == 200 and ids == ref["completion_tokens"],
          "%s: 200 with the reference tokens (%s, %s)" % (what, st, b[:120] if st != 200 else "%d ids" % len(ids)))


def check_401(port, headers, what, tls=None, path="/v1/completions", body=b'{"prompt": "x"}'):
    st, h, b = request(port, "POST" if body else "GET", path, body, headers, tls)
    e = error_of(b)
    check(st == 401 and e and e["code"] == "invalid_api_key" and e["type"] == "invalid_request_error"
          and h.get("www-authenticate") == "Bearer",
          "%s -> %s, WWW-Authenticate %s, %s" % (what, st, h.get("www-authenticate"), b[:160]))


def write_keys(tmp):
    path = os.path.join(tmp, "api-keys")
    with open(path, "w") as f:
        f.write("# Strata API keys (test)\n\nalice:%s\n  bob:%s  \n" % (KEY_A, KEY_B))
    os.chmod(path, 0o600)
    return path


def metric(port, name, headers=None):
    """The value of one sample line of /metrics (name with its labels), or None."""
    st, _, b = request(port, "GET", "/metrics", headers=headers, timeout=10)
    for line in b.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / float(tck)  # utime + stime


class Lone:
    """A strata-coordinator whose one stage's worker never comes: its HTTP
    server serves (health 503, completions 503) until stopped."""

    def __init__(self, args, extra=(), listen_host="127.0.0.1", env=None):
        self.tmp = tempfile.mkdtemp(prefix="strata-sec-")
        self.port = free_port()
        cfg = os.path.join(self.tmp, "c.ini")
        with open(cfg, "w") as f:
            f.write("[cluster]\nmodel = %s\n[stage.0]\naddress = 127.0.0.1:%d\n"
                    % (os.path.join(args.shared, "models", "stories260K.gguf"), free_port()))
        self.log = os.path.join(self.tmp, "coordinator.log")
        self.env = dict(os.environ)
        self.env.setdefault("UCX_TLS", "tcp")
        self.env.setdefault("UCX_NET_DEVICES", "lo")  # loopback only (other tests may add bridges)
        self.env.update(env or {})
        self.cmd = [args.coordinator, "--config", cfg, "--listen", "%s:%d" % (listen_host, self.port),
                    "--ready-timeout", "3600"] + list(extra)
        self.p = None

    def start(self, expect_up=True):
        self.p = subprocess.Popen(self.cmd, stdout=open(os.path.join(self.tmp, "coordinator.out"), "w"),
                                  stderr=open(self.log, "w"), env=self.env)
        if not expect_up:
            return
        def up():
            if self.p.poll() is not None:
                raise SystemExit("coordinator exited %s" % self.p.returncode)
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        if not wait_for(up, 30):
            self.dump()
            raise RuntimeError("the coordinator did not listen")

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def dump(self):
        print("---- coordinator.log (last 30 lines)")
        sys.stdout.write("".join(self.log_text().splitlines(True)[-30:]))

    def stop(self):
        """SIGTERM; a coordinator that was running must exit 0 (ASan: no leak)."""
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                rc = self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                rc = self.p.wait()
            if not check(rc == 0, "the coordinator exits 0 on SIGTERM (%s)" % rc):
                self.dump()

    def close(self):
        """stop(), then its folder goes unless a check failed."""
        self.stop()
        if not FAILS:
            shutil.rmtree(self.tmp, ignore_errors=True)


def closed_within(s, seconds):
    """Seconds until the peer closed s (EOF or reset), or None if still open
    after `seconds`. Reads and drops anything it sends."""
    t0 = time.monotonic()
    s.settimeout(0.05)
    while time.monotonic() - t0 < seconds:
        try:
            if s.recv(4096) == b"":
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


# ---------------------------------------------------------------- auth / tls

class KeyedCluster(ct.Cluster):
    """ct.Cluster whose HTTP client can speak TLS (its health polling too)."""
    tls = None

    def conn(self, timeout=120):
        if self.tls:
            return http.client.HTTPSConnection("127.0.0.1", self.http_port, timeout=timeout, context=self.tls)
        return super().conn(timeout)


def stages_json(cl, key):
    st, _, b = request(cl.http_port, "GET", "/v1/stages", None, auth(key), cl.tls)
    return json.loads(b) if st == 200 else {}


def raw_stream(port, key, max_tokens, tls=None):
    """Starts a streaming completion on a raw socket; returns the socket
    after the 200 status line (None otherwise)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    if tls:
        s = tls.wrap_socket(s, server_hostname="127.0.0.1")
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True, "return_token_ids": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_all(s, timeout=120):
    s.settimeout(timeout)
    out = b""
    while True:
        try:
            b = s.recv(65536)
        except OSError:
            break
        if not b:
            break
        out += b
        if b"data: [DONE]" in out:
            break
    return out


def sse_ids(raw):
    ids, done = [], False
    for line in raw.split(b"\n"):
        line = line.strip()
        if line == b"data: [DONE]":
            done = True
        elif line.startswith(b"data: {"):
            j = json.loads(line[6:])
            if "choices" in j:
                ids += j["choices"][0].get("token_ids", [])
    return done, ids


def mode_auth(args):
    refs = load_ref(args)
    tmp = tempfile.mkdtemp(prefix="strata-sec-")
    os.environ["STRATA_API_KEY"] = KEY_ENV
    keys_path = write_keys(tmp)
    cl = KeyedCluster(args, [{"tp": 1}, {"tp": 1}],
                      coord_args=["--api-key-file", keys_path, "--max-requests-per-key", "2",
                                  "--header-timeout", "5", "--body-timeout", "5", "--idle-timeout", "0.4"])
    try:
        cl.start()
        port = cl.http_port
        check_401(port, None, "no Authorization header")
        check_401(port, auth("sk-wrong-0000000000"), "a wrong key")
        check_401(port, auth(KEY_A + "x"), "the key with one more character")
        check_401(port, {"Authorization": "Basic " + KEY_A}, "the key as Basic")
        check_401(port, {"Authorization": "Bearer"}, "Bearer without a key")
        check_401(port, None, "GET /v1/models without a key", path="/v1/models", body=None)
        check_401(port, None, "GET /v1/stages without a key", path="/v1/stages", body=None)
        check_reference(port, refs[0], KEY_A, "key alice")
        check_reference(port, refs[1], KEY_B, "key bob")
        check_reference(port, refs[2], KEY_ENV, "STRATA_API_KEY")
        st, _, b = request(port, "POST", "/v1/chat/completions",
                           b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}',
                           {"Authorization": "bearer  " + KEY_B})
        check(st == 200, "the scheme is case-insensitive ('bearer'): %d" % st)
        for path in ("/metrics", "/health"):
            st, _, b = request(port, "GET", path)
            check(st == 200, "%s without a key -> %d (open by default)" % (path, st))
        st, _, m = request(port, "GET", "/metrics")
        check(any(l.startswith("strata_requests_total{") and 'status="401"' in l for l in m.decode().splitlines()),
              "401s are counted in strata_requests_total")

        # Per-key limit: alice holds 2 long streams; her third gets 429, bob is served.
        socks = [raw_stream(port, KEY_A, 400) for _ in range(2)]
        for i, s in enumerate(socks):
            s.settimeout(60)
            check(s.recv(12).startswith(b"HTTP/1.1 200"), "alice's stream %d accepted" % i)
        st, h, b = request(port, "POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 4}', auth(KEY_A))
        e = error_of(b)
        check(st == 429 and e and e["code"] == "rate_limit_exceeded" and h.get("retry-after") == "1",
              "alice's third request -> %d Retry-After %s %s" % (st, h.get("retry-after"), b[:160]))
        check_reference(port, refs[3], KEY_B, "bob while alice is at her limit")
        for s in socks:
            s.close()
        wait_for(lambda: stages_json(cl, KEY_B).get("requests_running") == 0, 30)
        check_reference(port, refs[4], KEY_A, "alice after her streams ended")

        # A stream outlives the 0.4 s idle deadline (the shortest; a read
        # timeout of any of the three would cut it): stage 1's worker is
        # stopped for 1 s mid-stream (under the 2 s hang bound,
        # docs/recovery.md), so client and server are both silent.
        s = raw_stream(port, KEY_B, 480)
        s.settimeout(30)
        raw = b""
        while b"token_ids" not in raw:
            raw += s.recv(4096)
        w = dict(cl.procs)["worker1"]
        os.kill(w.pid, signal.SIGSTOP)
        try:
            t_stop = time.monotonic()
            time.sleep(1.0)
        finally:
            os.kill(w.pid, signal.SIGCONT)
        gap, last = 0.0, t_stop
        while b"data: [DONE]" not in raw:
            b = s.recv(65536)
            if not b:
                break
            now = time.monotonic()
            gap, last = max(gap, now - last), now
            raw += b
        s.close()
        done, ids = sse_ids(raw)
        print("stream: %d tokens; longest silence %.2f s" % (len(ids), gap))
        check(done and len(ids) == 480 and gap > 0.8,
              "a stream silent for %.2f s (> 2x the 0.4 s idle deadline) ended with [DONE] and 480 tokens (%s, %d)"
              % (gap, done, len(ids)))

        # An idle keep-alive connection is closed after the idle deadline.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        dt = closed_within(c.sock, 5)
        c.close()
        check(dt is not None and 0.3 < dt < 3, "idle keep-alive connection closed after %s s (0.4 s deadline)" % dt)
        n_open = wait_for(lambda: metric(port, "strata_http_connections_open") == 1, 10)
        check(n_open, "every connection's record is gone: strata_http_connections_open = %s (the scrape's own)"
              % metric(port, "strata_http_connections_open"))

        # Rotation: bob's key is replaced by carol's in the file, SIGHUP.
        with open(keys_path, "w") as f:
            f.write("alice:%s\ncarol:%s\n" % (KEY_A, KEY_C))
        cl.coordinator.send_signal(signal.SIGHUP)
        check(wait_for(lambda: "SIGHUP: 3 API keys loaded" in open(cl.co_log).read(), 10),
              "SIGHUP: the coordinator logs the reload (3 keys: alice, carol, env)")
        check_401(port, auth(KEY_B), "bob's key after it was removed and SIGHUP")
        check_reference(port, refs[5], KEY_C, "carol's new key after SIGHUP")
        check_reference(port, refs[6], KEY_A, "alice's unchanged key after SIGHUP")
        # A file that does not load leaves the keys as they were.
        with open(keys_path, "w") as f:
            f.write("carol:short\n")
        cl.coordinator.send_signal(signal.SIGHUP)
        check(wait_for(lambda: "SIGHUP: keeping the current API keys" in open(cl.co_log).read(), 10),
              "SIGHUP with a bad file: the error is logged")
        check_reference(port, refs[7], KEY_C, "carol's key still works after a failed reload")
        ct.finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()
        os.environ.pop("STRATA_API_KEY", None)
        if not FAILS:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(cl.tmp, ignore_errors=True)


def make_certs(tmp):
    """A CA and a server certificate for 127.0.0.1 (openssl); (ca, cert, key)."""
    def run(*a):
        subprocess.run(["openssl"] + list(a), check=True, capture_output=True, timeout=60, cwd=tmp)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
        "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=strata test CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(tmp, "ext.cnf"), "w") as f:
        f.write("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return [os.path.join(tmp, n) for n in ("ca.pem", "server.pem", "server.key")]


def mode_tls(args):
    if not shutil.which("openssl"):
        print("skip: no openssl command")
        sys.exit(77)
    refs = load_ref(args)
    tmp = tempfile.mkdtemp(prefix="strata-sec-tls-")
    ca, cert, key = make_certs(tmp)
    bad = Lone(args, ["--tls-cert", os.path.join(tmp, "missing.pem"), "--tls-key", key])
    bad.start(expect_up=False)
    try:
        rc = bad.p.wait(60)
    except subprocess.TimeoutExpired:
        rc = None
    bad.stop()
    check(rc == 1 and "missing.pem" in bad.log_text() + open(os.path.join(bad.tmp, "coordinator.out")).read(),
          "a missing certificate file: exit status %s, named in the message" % rc)
    bad.close()

    cl = KeyedCluster(args, [{"tp": 1}, {"tp": 1}],
                      coord_args=["--api-key-file", write_keys(tmp), "--tls-cert", cert, "--tls-key", key,
                                  "--header-timeout", "2"])
    cl.tls = ssl.create_default_context(cafile=ca)
    try:
        cl.start()
        port = cl.http_port
        check_reference(port, refs[0], KEY_A, "https with key alice", cl.tls)
        s = raw_stream(port, KEY_B, 64, cl.tls)
        done, ids = sse_ids(read_all(s))
        s.close()
        check(done and ids == refs[0]["completion_tokens"][:len(ids)] and len(ids) == 64,
              "https stream: [DONE] and the greedy tokens of the prompt (%d)" % len(ids))
        check_401(port, None, "https without a key", cl.tls)
        t12 = ssl.create_default_context(cafile=ca)
        t12.maximum_version = ssl.TLSVersion.TLSv1_2
        st, _, _ = request(port, "GET", "/health", tls=t12)
        check(st == 200, "a TLS 1.2-only client is served (%d)" % st)
        # TLS 1.1 (offered by a client that allows it) gets the server's protocol_version alert.
        r = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % port, "-tls1_1", "-cipher",
                            "DEFAULT@SECLEVEL=0"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=30)
        check(r.returncode != 0 and "alert protocol version" in r.stdout + r.stderr,
              "a TLS 1.1 handshake is refused by the server (alert protocol version)")
        # A TCP connection that never starts its handshake is closed at the header deadline.
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        dt = closed_within(idle, 8)
        idle.close()
        check(dt is not None and 1.5 < dt < 6, "a connection without a TLS handshake closed after %s s "
              "(2 s header deadline)" % dt)
        # Plain HTTP to the TLS port: no HTTP answer, the connection ends.
        p = socket.create_connection(("127.0.0.1", port), timeout=10)
        p.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < 15:
                b = p.recv(4096)
                if not b:
                    break
                got += b
        except OSError:
            pass
        p.close()
        check(b"HTTP/1." not in got and time.monotonic() - t0 < 14,
              "plain HTTP to the TLS port gets no HTTP answer and is closed (%d bytes, %.1f s)"
              % (len(got), time.monotonic() - t0))
        check_reference(port, refs[1], KEY_B, "https after the plain-HTTP attempt", cl.tls)
        n_open = wait_for(lambda: request(port, "GET", "/metrics", tls=cl.tls)[2].decode().count(
            "\nstrata_http_connections_open 1\n"), 10)
        check(n_open, "every TLS connection's record is gone (strata_http_connections_open 1)")
        ct.finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()
        if not FAILS:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(cl.tmp, ignore_errors=True)


# ---------------------------------------------------------------- conn

def conn_deadlines(args):
    co = Lone(args, ["--header-timeout", "1", "--body-timeout", "2", "--idle-timeout", "3"])
    co.start()
    try:
        port = co.port
        dribblers, stalled = [], []
        for _ in range(5):  # headers one byte every 0.2 s, never ending
            dribblers.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        for _ in range(5):  # part of the headers, then nothing
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            stalled.append(s)
        body = socket.create_connection(("127.0.0.1", port), timeout=5)
        body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
        t0 = time.monotonic()
        closed = {}
        stop = threading.Event()

        def dribble():
            line = b"X-Slow: " + b"a" * 200
            i = 0
            while not stop.is_set():
                for k, s in enumerate(dribblers):
                    if k in closed:
                        continue
                    try:
                        s.sendall(line[i % len(line):i % len(line) + 1])
                    except OSError:
                        closed[k] = time.monotonic() - t0
                i += 1
                time.sleep(0.2)
        th = threading.Thread(target=dribble)
        th.start()
        st, _, _ = request(port, "GET", "/health", timeout=10)
        check(st == 503, "a normal request is answered while 10 slow clients are connected (%d)" % st)
        stall = [closed_within(s, 6) for s in stalled]
        bt = closed_within(body, 6)
        if bt is not None:
            bt = time.monotonic() - t0  # since the partial body was sent
        time.sleep(0.5)
        stop.set()
        th.join()
        for k, s in enumerate(dribblers):
            if k not in closed:
                closed[k] = closed_within(s, 0.1)
                if closed[k] is not None:
                    closed[k] = time.monotonic() - t0
        print("stalled headers closed after", stall, "; dribbling after", closed, "; stalled body after", bt)
        check(all(d is not None and d < 3 for d in stall), "stalled-header connections closed within 3 s (1 s deadline)")
        check(all(closed.get(k) is not None and closed[k] < 4 for k in range(5)),
              "dribbling-header connections closed although they keep sending (1 s deadline)")
        check(bt is not None and 1.5 < bt < 5, "a stalled body closed after %s s (2 s body deadline)" % bt)
        for s in dribblers + stalled + [body]:
            s.close()
        st, _, _ = request(port, "GET", "/health", timeout=10)
        check(st == 503, "the server still answers (%d)" % st)
        ht = metric(port, 'strata_http_connections_closed_total{reason="header_timeout"}')
        bt_n = metric(port, 'strata_http_connections_closed_total{reason="body_timeout"}')
        check(ht == 10 and bt_n == 1, "closed by deadline in /metrics: header_timeout %s (10), body_timeout %s (1)"
              % (ht, bt_n))
        log = co.log_text()
        check(log.count("did not send") <= 3, "the deadline closures are logged at most once per 10 s "
              "(%d lines)" % log.count("did not send"))
    finally:
        co.close()


def conn_cap(args):
    co = Lone(args, ["--max-connections", "16", "--header-timeout", "30"])
    co.start()
    try:
        socks = []
        for _ in range(40):
            socks.append(socket.create_connection(("127.0.0.1", co.port), timeout=5))
            time.sleep(0.01)
        time.sleep(1.0)
        n_closed = sum(1 for s in socks if closed_within(s, 0.05) is not None)
        print("%d of 40 idle connections closed by the server" % n_closed)
        check(n_closed >= 24 and n_closed <= 26,
              "beyond --max-connections 16, the other idle connections are closed at once (%d of 40)" % n_closed)
        for s in socks:
            s.close()
        t0 = time.monotonic()
        st = wait_for(lambda: request(co.port, "GET", "/health", timeout=5)[0], 10)
        check(st == 503, "after they close, the server answers at once (%s in %.2f s)" % (st, time.monotonic() - t0))
        check(eventually(lambda: "--max-connections" in co.log_text()), "the refusals are logged")
        closed = metric(co.port, 'strata_http_connections_closed_total{reason="cap"}')
        check(closed == n_closed, "strata_http_connections_closed_total{reason=\"cap\"} = %s (%d)" % (closed, n_closed))
        check(metric(co.port, "strata_http_connections_open") == 1,
              "strata_http_connections_open = 1 (the scrape's own connection)")
    finally:
        co.close()


def raw_exchange(port, data, timeout=10):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                return out, True  # the server closed
            out += b
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:") and len(rest) >= int(line.split(b":")[1]):
                        return out, closed_within(s, 2) is not None
    except socket.timeout:
        return out, False
    finally:
        s.close()


def conn_framing(args):
    co = Lone(args)
    co.start()
    try:
        body = b'{"prompt": "x"}'
        cases = [
            ("two different Content-Length", b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(body), len(body) + 5), True),
            ("Content-Length not a number", b"Content-Length: 1x\r\n", False),
            ("Content-Length with a sign", b"Content-Length: +%d\r\n" % len(body), False),
            ("Transfer-Encoding and Content-Length", b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n" % len(body), False),
            ("Transfer-Encoding gzip", b"Transfer-Encoding: gzip\r\n", True),
        ]
        for what, hdr, json_body in cases:
            data = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + hdr + b"\r\n" + body
            if b"Transfer-Encoding" in hdr:
                data = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + hdr + b"\r\n" +
                        b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
            out, closed = raw_exchange(co.port, data)
            st = out.split(b" ", 2)[1] if out.startswith(b"HTTP/1.1 ") else b"?"
            ok = st == b"400" and closed
            if json_body:
                ok = ok and error_of(out.partition(b"\r\n\r\n")[2]) is not None
            check(ok, "%s -> %s, connection closed %s: %s" % (what, st.decode(), closed, out[:200]))
        same = b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(body), len(body))
        out, _ = raw_exchange(co.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + same + b"\r\n" + body)
        check(out.startswith(b"HTTP/1.1 503"), "two equal Content-Length values pass the framing check "
              "(503: no worker) %s" % out[:40])
    finally:
        co.close()


def conn_protect(args):
    tmp = tempfile.mkdtemp(prefix="strata-sec-")
    co = Lone(args, ["--api-key-file", write_keys(tmp), "--protect-metrics"])
    co.start()
    try:
        for path in ("/metrics", "/health", "/readyz", "/livez"):
            check_401(co.port, None, "--protect-metrics: GET %s without a key" % path, path=path, body=None)
        st, _, _ = request(co.port, "GET", "/metrics", headers=auth(KEY_B))
        check(st == 200, "--protect-metrics: /metrics with a key -> %d" % st)
        st, _, _ = request(co.port, "GET", "/health", headers=auth(KEY_A))
        check(st == 503, "--protect-metrics: /health with a key -> %d (no worker)" % st)
    finally:
        co.close()
        shutil.rmtree(tmp, ignore_errors=True)


def conn_exposure(args):
    msg = "HTTP API: refusing to listen on non-loopback address 0.0.0.0:"
    co = Lone(args, listen_host="0.0.0.0", env={"STRATA_API_KEY": ""})
    co.start(expect_up=False)
    try:
        rc = co.p.wait(60)
    except subprocess.TimeoutExpired:
        rc = None
    co.stop()
    check(rc == 1 and msg in co.log_text() + open(os.path.join(co.tmp, "coordinator.out")).read(),
          "0.0.0.0 without a key: exit status %s and '%s...'" % (rc, msg))
    co.close()
    for what, extra, env, warn in (("--insecure", ["--insecure"], {}, True),
                                   ("STRATA_API_KEY", [], {"STRATA_API_KEY": KEY_ENV}, False)):
        co = Lone(args, extra, listen_host="0.0.0.0", env=env)
        try:
            co.start()
            st, _, _ = request(co.port, "GET", "/health", timeout=10)
            # (the warning comes at the start: waited for only when it is wanted)
            check(st == 503 and eventually(lambda: ("without credentials (--insecure)" in co.log_text()) == warn),
                  "0.0.0.0 with %s starts (health %d), warning logged: %s" % (what, st, warn))
        finally:
            co.close()


def mode_conn(args):
    conn_framing(args)
    conn_protect(args)
    conn_exposure(args)
    conn_cap(args)
    conn_deadlines(args)


# ---------------------------------------------------------------- emfile

def mode_emfile(args):
    co = Lone(args, ["--header-timeout", "60", "--max-connections", "100000"])
    co.start()
    socks = []
    try:
        pid = co.p.pid
        st, _, _ = request(co.port, "GET", "/health", timeout=10)
        n_fds = len(os.listdir("/proc/%d/fd" % pid))
        limit = n_fds + 12
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
        print("coordinator: %d descriptors open; RLIMIT_NOFILE lowered to %d" % (n_fds, limit))
        for _ in range(60):
            socks.append(socket.create_connection(("127.0.0.1", co.port), timeout=5))
        wait_for(lambda: "Too many open files" in co.log_text(), 10)
        time.sleep(0.5)
        log0, cpu0, t0 = os.path.getsize(co.log), cpu_seconds(pid), time.monotonic()
        time.sleep(3.0)
        log1, cpu1, t1 = os.path.getsize(co.log), cpu_seconds(pid), time.monotonic()
        print("at the fd limit: %.3f s CPU in %.1f s; log +%d bytes" % (cpu1 - cpu0, t1 - t0, log1 - log0))
        check("Too many open files" in co.log_text(), "accept() reached EMFILE (logged)")
        check(cpu1 - cpu0 < 0.5, "at the fd limit the coordinator used %.3f s CPU in %.1f s (< 0.5: no busy loop)"
              % (cpu1 - cpu0, t1 - t0))
        check(log1 - log0 < 4096, "its log grew %d bytes in 3 s (< 4 KB: no flood)" % (log1 - log0))
        check(co.p.poll() is None, "the coordinator is still running")
        for s in socks:
            s.close()
        socks = []
        st = wait_for(lambda: request(co.port, "GET", "/health", timeout=5)[0], 15)
        check(st == 503, "after the clients close it answers again (%s)" % st)
        errs = metric(co.port, "strata_http_accept_errors_total")
        check(errs is not None and 1 <= errs <= 60, "strata_http_accept_errors_total = %s (one per pause, "
              "not one per retry)" % errs)
    finally:
        for s in socks:
            s.close()
        co.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--shared", default=os.environ.get("STRATA_SHARED", "../shared"))
    args = ap.parse_args()
    modes = {"auth": mode_auth, "tls": mode_tls, "conn": mode_conn, "emfile": mode_emfile}
    if args.mode not in modes:
        print("unknown mode", args.mode)
        return 2
    modes[args.mode](args)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
