#!/usr/bin/python3
"""failover_test.py — issue 18's coordinator high availability on etcd
(docs/recovery.md "Coordinator failover"): a real etcd started by the test on
free loopback ports with a temporary data dir, two strata-coordinator --live
--etcd (A, then B) and two strata-worker processes on stories260K (PP 2,
`--coordinator A,B`).

  - A is elected; B is a standby: its HTTP API answers 503 with Retry-After
    and X-Strata-Leader = A's URL (code not_leader), /readyz 503, /livez 200;
    its gRPC calls UNAVAILABLE naming A.
  - The state is in etcd, one key per node (PREFIX/nodes/w-a, w-b) and the
    placement (PREFIX/state).
  - Greedy completions on A equal ../shared/reference.
  - SIGKILL A: B becomes the leader and answers 200 within TTL + the
    re-attach (bounded; the time is measured and printed); the placement
    (epoch, stages) is the same, no worker loaded its stage again (their
    logs: no new "ready in", an "already loaded"), and greedy output on B is
    identical to the reference.
  - A started again joins as a standby; SIGTERM B: it revokes its lease and
    A serves without waiting for the TTL (printed), still no stage reloaded.

Mode `fence`: the leader A loses etcd (SIGSTOP of etcd, a real fault): it
steps down on its own, exiting with status 75 within the TTL (measured and
printed), before its lease can expire on etcd, while B stays a standby (it
cannot reach etcd either). SIGCONT: B is elected and serves with the same
placement, no stage reloaded, greedy output identical. Then the leader key is
deleted by hand (HTTP deleterange): B, whose lease still lives, steps down
(75) within one renewal period.

Mode `tls`: etcd on https with client-certificate auth (a CA and
certificates made by the test with the openssl tool): a coordinator with
--etcd https://... --etcd-cacert/--etcd-cert/--etcd-key is elected and
writes its leader record; one without a client certificate is refused by
etcd's handshake and stays out of the election, with a log line naming etcd;
plaintext http:// to a non-loopback etcd and https:// without --etcd-cacert
do not start (a clear message).

Mode `stall` (issue 30, defect 1): only the leader A reaches etcd through a
TCP relay written here (B goes straight to etcd). Right after a lease renewal
of A passes through it, the relay stops forwarding for 1.3 s, closing
nothing (shorter than A's self-fencing limit, TTL - 1 s after that renewal);
meanwhile two placement changes are made through A (each writes the state
key twice: its epoch assigned, then serving). After the relay resumes, A is
still the leader and etcd holds A's newest epoch within the TTL; `stratactl
status` on A says its writes are in etcd and /metrics has the write path's
counters. Then A is SIGKILLed: B serves the newest epoch and placement, and
greedy output on B equals the reference. (Before the fix, etcd refused the
batch, "duplicate key given in txn request", and A retried it unchanged for
ever; B took over with the first epoch, which the workers refused.)

Mode `refuse`: etcd started with --max-request-bytes 400 refuses A's
placement write (about 600 bytes) on its own, while the node records pass:
A logs the refusal, counts it (/metrics), shows it in `stratactl status`,
does not retry it unchanged, and steps down (75) once the state has been
missing from etcd for the TTL.

Every process is started by the test and stopped by its pid, also on
failure. Exits 77 when there is no etcd binary (Debian: etcd-server).

  failover_test.py [failover|fence|tls|stall|refuse] --coordinator BIN --worker BIN
                   --proto control.proto --shared DIR --workdir DIR
"""
import argparse
import base64
import http.client
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import FAILS, LiveBase, check, control_stubs, eventually, free_port, reap, wait_for  # noqa: E402

TTL = 3
PREFIX = "/strata/failover-test"
# Takeover = the lease running out (<= TTL) + the election + the workers
# failing over and registering again + the placement re-attached (stages
# adopted, not loaded). Generous for an ASan build on a shared 2-core box.
TAKEOVER_BOUND_S = TTL + 12.0


def etcd_binary():
    for p in (shutil.which("etcd"), "/usr/bin/etcd"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def b64(s):
    return base64.b64encode(s.encode()).decode()


class Cluster(LiveBase):
    def __init__(self, args):
        super().__init__(args, "strata-failover-")
        self.procs = {}
        self.logs = {}
        self.etcd_port = free_port()
        self.etcd_url = "http://127.0.0.1:%d" % self.etcd_port
        self.coords = {}
        for name in ("A", "B"):
            self.coords[name] = {"http": free_port(), "grpc": "127.0.0.1:%d" % free_port()}
        self.nstart = {}

    def spawn(self, name, cmd):
        self.nstart[name] = self.nstart.get(name, 0) + 1
        fn = os.path.join(self.tmp, "%s%s.log" % (name, "" if self.nstart[name] == 1 else "-%d" % self.nstart[name]))
        self.logs[name] = fn
        self.procs[name] = subprocess.Popen(cmd, stdout=open(fn, "w"), stderr=subprocess.STDOUT, env=self.env)

    def start_etcd(self, tls=None, extra=()):
        """tls: (ca, cert, key) files: https with client-certificate auth. extra: more etcd flags."""
        peer = free_port()
        cmd = [etcd_binary(), "--name", "t", "--data-dir", os.path.join(self.tmp, "etcd-data"),
               "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
               "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
               "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
               "--initial-cluster", "t=http://127.0.0.1:%d" % peer, "--log-level", "warn"] + list(extra)
        if tls:
            self.tls = tls
            cmd += ["--trusted-ca-file", tls[0], "--cert-file", tls[1], "--key-file", tls[2], "--client-cert-auth"]
        self.spawn("etcd", cmd)
        if not wait_for(lambda: self.etcd("/v3/kv/range", {"key": b64("x")}) is not None, 30, 0.1):
            self.dump()
            raise RuntimeError("etcd did not start")

    def etcd(self, path, body):
        if getattr(self, "tls", None):
            import ssl
            ctx = ssl.create_default_context(cafile=self.tls[0])
            ctx.load_cert_chain(self.tls[1], self.tls[2])
            c = http.client.HTTPSConnection("127.0.0.1", self.etcd_port, timeout=5, context=ctx)
        else:
            c = http.client.HTTPConnection("127.0.0.1", self.etcd_port, timeout=5)
        try:
            c.request("POST", path, body=json.dumps(body).encode())
            r = c.getresponse()
            return json.loads(r.read()) if r.status == 200 else None
        finally:
            c.close()

    def etcd_keys(self, prefix):
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        d = self.etcd("/v3/kv/range", {"key": b64(prefix), "range_end": b64(end)}) or {}
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
                for kv in d.get("kvs", [])}

    def coordinator_cmd(self, name, extra=()):
        c = self.coords[name]
        return [self.args.coordinator, "--live", "--config", self.cfg, "--listen",
                "127.0.0.1:%d" % c["http"], "--grpc-listen", c["grpc"], "--etcd", c.get("etcd", self.etcd_url),
                "--etcd-prefix", PREFIX, "--leader-ttl", str(TTL), "--heartbeat-ms", "200",
                "--dead-after-ms", "2000", "--min-workers", "2"] + list(extra)

    def start_coordinator(self, name, extra=()):
        self.spawn(name, self.coordinator_cmd(name, extra))

    def start_worker(self, name):
        addrs = ",".join(self.coords[n]["grpc"] for n in ("A", "B"))
        self.spawn(name, [self.args.worker, "--listen", "127.0.0.1:%d" % free_port(), "--coordinator", addrs,
                          "--name", name, "--model", self.model, "--threads", "1"])

    def stub(self, name):
        if not hasattr(self, "_stubs"):
            self._stubs, self._chans = {}, []
        if name not in self._stubs:
            ch = grpc.insecure_channel(self.coords[name]["grpc"])
            self._chans.append(ch)
            self._stubs[name] = pbg.ControlStub(ch)
        return self._stubs[name]

    def status(self, name):
        return self.stub(name).GetStatus(pb.GetStatusRequest(), timeout=2)

    def request(self, name, method, path, body=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.coords[name]["http"], timeout=timeout)
        try:
            c.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read().decode(errors="replace")
        finally:
            c.close()

    def complete(self, name, prompt, n, timeout=120):
        st, _, text = self.request(name, "POST", "/v1/completions",
                                   {"prompt": prompt, "max_tokens": n, "temperature": 0, "return_token_ids": True},
                                   timeout)
        return st, (json.loads(text)["choices"][0].get("token_ids") if st == 200 else text)

    def text(self, name):
        with open(self.logs[name], errors="replace") as f:
            return f.read()

    def stop(self):
        """SIGTERM by pid: the coordinators first (as control_test does: a
        worker leaving while a coordinator still runs would be re-placed onto
        one that is stopping), then the workers, then etcd."""
        rcs = {}
        for group in (("A", "B"), ("w-a", "w-b"), ("etcd",)):
            procs = [(n, self.procs[n]) for n in group if n in self.procs]
            for _, p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            rcs.update(reap(procs))
        for ch in getattr(self, "_chans", []):
            ch.close()
        return rcs


def exact(cl, name, rs, n, label):
    good = 0
    for r in rs:
        st, ids = cl.complete(name, r["prompt"], n)
        ok = st == 200 and ids == r["completion_tokens"][:n]
        good += ok
        if not ok:
            print("  %r: %s %s" % (r["prompt"], st, str(ids)[:300]))
    check(good == len(rs), "%s: %d/%d greedy completions equal the reference" % (label, good, len(rs)))


def loads(cl):
    return {w: cl.text(w).count(" ready in ") for w in ("w-a", "w-b")}


def finish(cl, clean):
    """Stops every process (by pid), checks that those named in `clean` exited
    0, prints the logs' tails on a failure, removes the temporary folder."""
    rcs = cl.stop()
    print("exit statuses: %s" % rcs)
    check(all(rcs.get(n) == 0 for n in clean), "%s exit 0 on SIGTERM" % ", ".join(clean))
    if FAILS:
        cl.dump(40)
    if not os.environ.get("STRATA_KEEP_TMP"):
        shutil.rmtree(cl.tmp, ignore_errors=True)


def make_certs(d):
    """A CA, etcd's server certificate (IP:127.0.0.1) and a client certificate,
    with the openssl tool: (ca, server cert, server key, client cert, client key)."""
    def sh(*cmd):
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    p = lambda n: os.path.join(d, n)  # noqa: E731
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
       "-keyout", p("ca.key"), "-out", p("ca.pem"), "-subj", "/CN=failover-test-ca")
    for who, eku in (("server", "serverAuth,clientAuth"), ("client", "clientAuth")):
        sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
           p(who + ".key"), "-out", p(who + ".csr"), "-subj", "/CN=" + who)
        with open(p(who + ".ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=%s\n" % eku)
        sh("openssl", "x509", "-req", "-in", p(who + ".csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
           "-CAcreateserial", "-days", "1", "-out", p(who + ".pem"), "-extfile", p(who + ".ext"))
    return p("ca.pem"), p("server.pem"), p("server.key"), p("client.pem"), p("client.key")


def run_tls(args):
    cl = Cluster(args)
    try:
        ca, scert, skey, ccert, ckey = make_certs(cl.tmp)
        cl.etcd_url = "https://127.0.0.1:%d" % cl.etcd_port
        cl.start_etcd((ca, scert, skey))
        # refused at start: plaintext to a non-loopback etcd; https without the CA
        for url, extra, words in (("http://10.9.9.9:2379", [], "plaintext to a non-loopback etcd"),
                                  (cl.etcd_url, [], "needs --etcd-cacert")):
            cmd = cl.coordinator_cmd("A", extra)
            cmd[cmd.index("--etcd") + 1] = url
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=cl.env)
            check(p.returncode != 0 and words in p.stderr,
                  "--etcd %s%s refused at start: %r" % (url, " ".join(extra), (p.returncode, p.stderr.strip()[-200:])))
        cl.start_coordinator("A", ["--etcd-cacert", ca, "--etcd-cert", ccert, "--etcd-key", ckey])
        check(bool(wait_for(lambda: cl.status("A") is not None, 60, 0.1)), "A is elected over TLS to etcd")
        rec = json.loads(cl.etcd_keys(PREFIX + "/").get(PREFIX + "/leader", "{}"))
        check(rec.get("grpc") == cl.coords["A"]["grpc"], "etcd (read over TLS) names A the leader: %s" % rec)
        # no client certificate: etcd's handshake refuses B, which stays out of the election
        cl.start_coordinator("B", ["--etcd-cacert", ca])
        check(bool(wait_for(lambda: "leader: etcd https://127.0.0.1:%d: cannot connect" % cl.etcd_port in cl.text("B"),
                            30, 0.1)), "B without a client certificate logs that etcd cannot be reached")
        try:
            cl.status("B")
            check(False, "B (no etcd) refuses GetStatus")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE and "election is under way" in e.details(),
                  "B (no etcd) answers UNAVAILABLE: %s" % e.details())
        check(cl.procs["B"].poll() is None, "B keeps running (it retries)")
    except Exception as e:  # noqa: BLE001 - reported, the processes still stopped
        check(False, "no exception: %r" % e)
    finally:
        finish(cl, ("A", "B"))
    return 1 if FAILS else 0


def start_pair(cl, rs):
    """etcd, A (elected), B (standby), w-a and w-b; A serves; greedy output on
    A equals the reference. The placement's stages."""
    cl.start_etcd()
    cl.start_coordinator("A")
    check(bool(wait_for(lambda: cl.status("A") is not None, 60, 0.1)), "A is elected (answers GetStatus)")
    cl.start_coordinator("B")
    check(bool(wait_for(lambda: "standby; the leader is" in cl.text("B"), 60, 0.1)), "B starts as a standby")
    for w in ("w-a", "w-b"):
        cl.start_worker(w)
    if not wait_for(lambda: cl.status("A").serving, 120, 0.1):
        cl.dump()
        raise RuntimeError("A did not start serving")
    pl0 = cl.stub("A").GetPlacement(pb.GetPlacementRequest(), timeout=5).current
    exact(cl, "A", rs, 24, "on A")
    return pl0.epoch, [(s.node, s.first_layer, s.last_layer) for s in pl0.stages]


def run_fence(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        rs = json.load(f)[:3]
    cl = Cluster(args)
    try:
        epoch0, stages0 = start_pair(cl, rs)
        loads0 = loads(cl)
        etcd = cl.procs["etcd"]
        t0 = time.monotonic()
        os.kill(etcd.pid, signal.SIGSTOP)
        try:
            rc = cl.procs["A"].wait(timeout=TTL + 10)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - t0
        print("A cut off from etcd: exited %s after %.2f s (TTL %d s)" % (rc, took, TTL))
        check(rc == 75 and took <= TTL + 1.0, "A steps down (status 75) within the TTL: %.2f s" % took)
        check("lost the leadership" in cl.text("A"), "A logged why it stepped down")
        check(cl.procs["B"].poll() is None, "B keeps running, a standby without etcd")
        st, _, _ = cl.request("B", "GET", "/readyz")
        check(st == 503, "B: /readyz 503 while etcd is stopped (%d)" % st)
        os.kill(etcd.pid, signal.SIGCONT)
        ok = wait_for(lambda: cl.complete("B", rs[0]["prompt"], 2, timeout=10)[0] == 200, TAKEOVER_BOUND_S + 30, 0.1)
        print("B serves %.2f s after etcd came back" % (time.monotonic() - t0 - took))
        check(bool(ok), "B is elected and serves once etcd is back")
        pl1 = cl.stub("B").GetPlacement(pb.GetPlacementRequest(), timeout=5).current
        check(pl1.epoch == epoch0 and [(s.node, s.first_layer, s.last_layer) for s in pl1.stages] == stages0,
              "same placement on B: epoch %d" % pl1.epoch)
        check(loads(cl) == loads0, "no worker loaded its stage again: %s" % loads(cl))
        exact(cl, "B", rs, 24, "on B")
        # The key deleted by hand: B's lease lives, yet it is not the leader any more.
        d = cl.etcd("/v3/kv/deleterange", {"key": b64(PREFIX + "/leader")})
        check(d is not None and d.get("deleted") == "1", "the leader key deleted by hand: %s" % d)
        t1 = time.monotonic()
        try:
            rc = cl.procs["B"].wait(timeout=TTL + 10)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - t1
        check(rc == 75 and took <= TTL, "B steps down (status 75) %.2f s after its key was deleted" % took)
    except Exception as e:  # noqa: BLE001 - reported, the processes still stopped
        check(False, "no exception: %r" % e)
    finally:
        if "etcd" in cl.procs and cl.procs["etcd"].poll() is None:
            os.kill(cl.procs["etcd"].pid, signal.SIGCONT)
        finish(cl, ("w-a", "w-b"))
    return 1 if FAILS else 0


def run(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        rs = json.load(f)[:4]
    cl = Cluster(args)
    try:
        epoch0, stages0 = start_pair(cl, rs)
        check(len(stages0) == 2, "PP 2 over w-a and w-b: epoch %d %s" % (epoch0, stages0))

        # The standby: 503 + Retry-After + the leader, no proxying.
        a_url = "http://127.0.0.1:%d" % cl.coords["A"]["http"]
        st, hdr, body = cl.request("B", "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 4})
        code = json.loads(body).get("error", {}).get("code") if body.startswith("{") else None
        check(st == 503 and hdr.get("Retry-After") == "1" and hdr.get("X-Strata-Leader") == a_url and
              code == "not_leader" and a_url in body,
              "standby B: completion 503, Retry-After 1, X-Strata-Leader %s, code not_leader (%d %s %s)"
              % (a_url, st, hdr.get("Retry-After"), body[:160]))
        st, _, _ = cl.request("B", "GET", "/readyz")
        check(st == 503, "standby B: /readyz 503 (%d)" % st)
        st, _, _ = cl.request("B", "GET", "/livez")
        check(st == 200, "standby B: /livez 200 (%d)" % st)
        try:
            cl.status("B")
            check(False, "standby B: GetStatus refused")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE and cl.coords["A"]["grpc"] in e.details(),
                  "standby B: GetStatus UNAVAILABLE naming the leader (%s: %s)" % (e.code(), e.details()))

        # The state in etcd: one key per node, the placement.
        keys = wait_for(lambda: (lambda k: k if {PREFIX + "/nodes/w-a", PREFIX + "/nodes/w-b", PREFIX + "/state"}
                                 <= set(k) else None)(cl.etcd_keys(PREFIX + "/")), 10, 0.1) or {}
        check(PREFIX + "/nodes/w-a" in keys and PREFIX + "/nodes/w-b" in keys,
              "etcd holds one key per node: %s" % sorted(k for k in keys if "/nodes/" in k))
        state = json.loads(keys.get(PREFIX + "/state", "{}"))
        check(state.get("epoch") == epoch0 and [(s["node"], s["first"], s["last"]) for s in state.get("stages", [])]
              == stages0, "etcd %s/state holds the placement (epoch %s)" % (PREFIX, state.get("epoch")))
        leader = json.loads(keys.get(PREFIX + "/leader", "{}"))
        check(leader.get("http") == a_url and leader.get("grpc") == cl.coords["A"]["grpc"],
              "etcd %s/leader names A: %s" % (PREFIX, leader))

        rc, out = stratactl(args, [cl.coords["B"]["grpc"]], "status")
        check(rc == 3 and "is a standby" in out, "stratactl --addr B (the standby) status: exit 3, 'is a standby' (%d)" % rc)
        rc, out = stratactl(args, [cl.coords["B"]["grpc"], cl.coords["A"]["grpc"]], "status")
        check(rc == 0 and "serving" in out and "yes" in out,
              "stratactl --addr B,A status: the leader A answers (exit %d)" % rc)

        loads0 = loads(cl)
        again0 = {w: cl.text(w).count("already loaded") for w in ("w-a", "w-b")}

        # SIGKILL the leader; the first 200 from B ends the takeover.
        t0 = time.monotonic()
        cl.procs["A"].kill()
        cl.procs["A"].wait()
        first = [None]

        def b_serves():
            st, _ = cl.complete("B", rs[0]["prompt"], 2, timeout=10)
            if st == 200:
                first[0] = time.monotonic() - t0
            return st == 200
        wait_for(b_serves, TAKEOVER_BOUND_S + 30, 0.05)
        took = first[0]
        text = cl.text("B")
        print("takeover: leader SIGKILLed -> first 200 from B in %s s (TTL %d s, bound %.0f s)"
              % ("%.2f" % took if took else "never", TTL, TAKEOVER_BOUND_S))
        check(took is not None and took <= TAKEOVER_BOUND_S,
              "B serves within TTL + re-attach: %s s <= %.0f s" % ("%.2f" % took if took else "never", TAKEOVER_BOUND_S))
        check(eventually(lambda: "is the leader" in cl.text("B")), "B logged its election")
        pl1 = cl.stub("B").GetPlacement(pb.GetPlacementRequest(), timeout=5).current
        stages1 = [(s.node, s.first_layer, s.last_layer) for s in pl1.stages]
        check(pl1.epoch == epoch0 and stages1 == stages0,
              "same placement after the takeover: epoch %d %s" % (pl1.epoch, stages1))
        loads1 = loads(cl)
        print("stage loads per worker before/after: %s / %s" % (loads0, loads1))
        check(loads1 == loads0 and all(v == 1 for v in loads0.values()),
              "no worker loaded its stage again (one load each)")
        check(eventually(lambda: all(cl.text(w).count("already loaded") > again0[w] for w in ("w-a", "w-b"))),
              "every worker answered B's assignment with 'already loaded'")
        exact(cl, "B", rs, 24, "after the failover (on B)")
        rc, out = stratactl(args, [cl.coords["A"]["grpc"], cl.coords["B"]["grpc"]], "nodes")
        check(rc == 0 and "w-a" in out and "w-b" in out,
              "stratactl --addr A,B nodes with A dead: B answers with w-a, w-b (exit %d)" % rc)
        st, _, _ = cl.request("B", "GET", "/readyz")
        check(st == 200, "B: /readyz 200 as the leader (%d)" % st)

        # A comes back as a standby; B stops cleanly (SIGTERM): it revokes its
        # lease, so A takes over without waiting for the TTL.
        cl.start_coordinator("A")
        check(bool(wait_for(lambda: "standby; the leader is" in cl.text("A"), 60, 0.1)),
              "the restarted A joins as a standby")
        t1 = time.monotonic()
        cl.procs["B"].send_signal(signal.SIGTERM)
        ok = wait_for(lambda: cl.complete("A", rs[0]["prompt"], 2, timeout=10)[0] == 200, TAKEOVER_BOUND_S + 30, 0.05)
        took = time.monotonic() - t1
        print("handover: leader SIGTERMed -> first 200 from A in %.2f s" % took)
        check(bool(ok) and took <= TAKEOVER_BOUND_S, "A serves after B's clean stop: %.2f s" % took)
        check(cl.procs["B"].wait(timeout=30) == 0 and "resigned (lease revoked)" in cl.text("B"),
              "B resigned (lease revoked) and exited 0")
        check(loads(cl) == loads0, "no worker loaded its stage again: %s" % loads(cl))
        exact(cl, "A", rs[:2], 24, "after the handover (on A)")
    except Exception as e:  # noqa: BLE001 - reported, the processes still stopped
        check(False, "no exception: %r" % e)
    finally:
        finish(cl, ("A", "B", "w-a", "w-b"))
    return 1 if FAILS else 0


def answered(b):
    """Whether b holds a whole HTTP response (Content-Length, or chunked up to its last chunk)."""
    head, sep, body = b.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if m:
        return len(body) >= int(m.group(1))
    return body.endswith(b"0\r\n\r\n")


class Relay(threading.Thread):
    """A TCP relay 127.0.0.1:port -> 127.0.0.1:upstream, one thread. freeze_after_renewal(s): once the next lease
    renewal of the leader (a keep-alive, then a read of its key) has been answered, it stops for s seconds: it reads,
    accepts and forwards nothing, and closes nothing (the kernel still completes new connections' handshakes and
    buffers what is sent), like a network path that stalls. Then it forwards what was held, in each connection's
    order (also what a client sent before giving up on a connection)."""

    def __init__(self, upstream):
        super().__init__(daemon=True)
        self.upstream = upstream
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        self.freeze_s = None  # armed: freeze for this long after the next renewal's answer
        self.frozen_until = 0.0
        self.frozen = threading.Event()
        self.stopping = False

    def freeze_after_renewal(self, s):
        self.frozen.clear()
        self.freeze_s = s

    def close_pair(self, conn):
        for sk in (conn["client"], conn["up"]):
            try:
                self.sel.unregister(sk)
            except (KeyError, ValueError):
                pass
            sk.close()

    def run(self):
        while not self.stopping:
            if time.monotonic() < self.frozen_until:
                time.sleep(0.002)
                continue
            for key, _ in self.sel.select(0.05):
                if key.data is None:
                    c, _ = self.lsock.accept()
                    try:
                        u = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
                    except OSError:
                        c.close()
                        continue
                    conn = {"client": c, "up": u, "phase": 0, "answer": b""}
                    self.sel.register(c, selectors.EVENT_READ, (conn, "client"))
                    self.sel.register(u, selectors.EVENT_READ, (conn, "up"))
                    continue
                conn, side = key.data
                src = conn[side]
                dst = conn["up" if side == "client" else "client"]
                try:
                    data = src.recv(65536)
                    if data:
                        dst.sendall(data)
                except OSError:
                    data = b""
                if not data:
                    self.close_pair(conn)
                    continue
                # A renewal is a keep-alive, then a read of the leader key (leader.c: keepalive()); the
                # freeze starts once both are answered, so that the next renewal is due 1 s later.
                if side == "client":
                    if data.startswith(b"POST "):  # a new request (the rest of one keeps the phase)
                        conn["phase"] = 1 if b"/v3/lease/keepalive" in data else 3 if conn["phase"] == 2 else 0
                        conn["answer"] = b""
                elif conn["phase"] in (1, 3):
                    conn["answer"] += data
                    if not answered(conn["answer"]):
                        continue
                    conn["phase"] = 2 if conn["phase"] == 1 else 0
                    if conn["phase"] == 0 and self.freeze_s:
                        self.frozen_until = time.monotonic() + self.freeze_s
                        self.freeze_s = None
                        self.frozen.set()

    def stop(self):
        self.stopping = True
        self.join(timeout=5)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def etcd_epoch(cl):
    st = cl.etcd_keys(PREFIX + "/").get(PREFIX + "/state")
    return json.loads(st).get("epoch") if st else None


def run_stall(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        rs = json.load(f)[:3]
    cl = Cluster(args)
    relay = None
    FREEZE_S = 1.3
    try:
        relay = Relay(cl.etcd_port)
        relay.start()
        cl.coords["A"]["etcd"] = "http://127.0.0.1:%d" % relay.port
        epoch0, stages0 = start_pair(cl, rs)
        check(len(stages0) == 2, "PP 2 over w-a and w-b: epoch %d %s" % (epoch0, stages0))
        check(bool(wait_for(lambda: etcd_epoch(cl) == epoch0, 10, 0.1)), "etcd holds epoch %d" % epoch0)
        # Two placement changes: another split, then back to the first one.
        (na, fa, la), (nb, fb, lb) = stages0
        S = pb.Stage
        other = [S(node=na, first_layer=fa, last_layer=la + 1 if lb > fb else la - 1),
                 S(node=nb, first_layer=fb + 1 if lb > fb else fb - 1, last_layer=lb)]
        first = [S(node=n, first_layer=f, last_layer=l) for n, f, l in stages0]

        def change(stages, deadline):
            while time.monotonic() < deadline:
                try:
                    return cl.stub("A").SetPlacement(pb.SetPlacementRequest(stages=stages), timeout=5).pending.epoch
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                        raise
                    time.sleep(0.02)
            return None

        relay.freeze_after_renewal(FREEZE_S)
        check(relay.frozen.wait(5), "the relay froze A's link to etcd right after a lease renewal")
        t0 = time.monotonic()
        e1 = change(other, t0 + 30)
        e2 = change(first, t0 + 30)
        t_changes = time.monotonic() - t0
        print("placement changes through A: epochs %s, %s, accepted %.2f s into the %.1f s freeze" %
              (e1, e2, t_changes, FREEZE_S))
        check(e1 == epoch0 + 1 and e2 == epoch0 + 2, "two placement changes accepted: epochs %s, %s" % (e1, e2))
        served = wait_for(lambda: (lambda p: p.current.epoch == e2 and not p.HasField("pending"))(
            cl.stub("A").GetPlacement(pb.GetPlacementRequest(), timeout=5)), 60, 0.05)
        check(bool(served), "A serves epoch %s" % e2)
        # etcd has A's newest epoch soon after the link is back (A's writes did not stall).
        frozen_left = t0 + FREEZE_S - time.monotonic()
        got = wait_for(lambda: etcd_epoch(cl) == e2, max(frozen_left, 0) + TTL, 0.05)
        print("etcd's epoch %.2f s after the link came back: %s (A serves %s)" %
              (time.monotonic() - t0 - FREEZE_S, etcd_epoch(cl), e2))
        check(bool(got), "etcd holds A's newest epoch %s within the TTL after the link came back" % e2)
        check(cl.procs["A"].poll() is None, "A is still running (the 1.3 s stall is below its fencing limit)")
        rc, out = stratactl(args, [cl.coords["A"]["grpc"]], "status")
        check(rc == 0 and re.search(r"etcd writes +all in etcd", out) is not None,
              "stratactl status on A: its writes are in etcd (exit %d)" % rc)
        st, _, met = cl.request("A", "GET", "/metrics")
        check(st == 200 and "strata_etcd_txns_refused_total 0" in met and "strata_etcd_changes_dropped_total 0" in met,
              "A's /metrics: strata_etcd_txns_refused_total 0, strata_etcd_changes_dropped_total 0")
        # SIGKILL A: B takes over with the newest epoch.
        t1 = time.monotonic()
        cl.procs["A"].kill()
        cl.procs["A"].wait()
        ok = wait_for(lambda: cl.complete("B", rs[0]["prompt"], 2, timeout=10)[0] == 200, TAKEOVER_BOUND_S, 0.05)
        print("takeover: A SIGKILLed -> first 200 from B in %s" %
              ("%.2f s" % (time.monotonic() - t1) if ok else "never (%.0f s)" % TAKEOVER_BOUND_S))
        check(bool(ok), "B serves after A's SIGKILL within %.0f s" % TAKEOVER_BOUND_S)
        if ok:
            pl = cl.stub("B").GetPlacement(pb.GetPlacementRequest(), timeout=5).current
            check(pl.epoch == e2 and [(s.node, s.first_layer, s.last_layer) for s in pl.stages] == stages0,
                  "B serves A's newest placement: epoch %d (want %s)" % (pl.epoch, e2))
            exact(cl, "B", rs, 24, "after the takeover (on B)")
    except Exception as e:  # noqa: BLE001 - reported, the processes still stopped
        check(False, "no exception: %r" % e)
    finally:
        finish(cl, ("B", "w-a", "w-b"))
        if relay:
            relay.stop()
    return 1 if FAILS else 0


def run_refuse(args):
    """etcd refuses the leader's placement write on its own (--max-request-bytes 400: the state's txn is about
    600 bytes, a node record's about 200): A logs it, counts it, shows it in stratactl status and /metrics, keeps
    writing the other keys, and steps down (75) once the state has been missing from etcd for the TTL."""
    cl = Cluster(args)
    try:
        cl.start_etcd(extra=["--max-request-bytes", "400"])
        cl.start_coordinator("A")
        check(bool(wait_for(lambda: cl.status("A") is not None, 60, 0.1)), "A is elected (answers GetStatus)")
        for w in ("w-a", "w-b"):
            cl.start_worker(w)
        seen = {}

        def refused():
            if cl.procs["A"].poll() is not None:
                return True
            rc, out = stratactl(args, [cl.coords["A"]["grpc"]], "status")
            if "etcd refused" in out and "request is too large" in out:
                seen["status"] = out
                seen["metrics"] = cl.request("A", "GET", "/metrics")[2]
                seen["at"] = time.monotonic()
                return True
            return False
        wait_for(refused, 120, 0.2)
        out, met = seen.get("status", ""), seen.get("metrics", "")
        check(re.search(r"etcd writes +NOT all in etcd", out) is not None and "1 change(s) dropped" in out and
              PREFIX + "/state" in out, "stratactl status on A shows the refused state write")
        check("strata_etcd_txns_refused_total 1" in met and "strata_etcd_changes_dropped_total 1" in met,
              "A's /metrics count the refusal: strata_etcd_txns_refused_total 1, strata_etcd_changes_dropped_total 1")
        keys = cl.etcd_keys(PREFIX + "/")
        state = json.loads(keys.get(PREFIX + "/state", "{}"))  # the first, small one (no stages yet) passed
        check(PREFIX + "/nodes/w-a" in keys and PREFIX + "/nodes/w-b" in keys and not state.get("stages"),
              "the node records are in etcd, the refused placement is not: %s, state %s" %
              (sorted(keys), {k: state.get(k) for k in ("epoch", "last_epoch", "stages")}))
        try:
            rc = cl.procs["A"].wait(timeout=TTL + 5)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - seen["at"] if "at" in seen else -1
        check(rc == 75 and took <= TTL + 1, "A steps down (status 75) %.2f s after the refusal was shown" % took)
        text = cl.text("A")
        check("etcd refused the change of %s/state on its own" % PREFIX in text and
              "have not reached etcd for" in text, "A logged the refusal and why it stepped down")
        check(text.count("request is too large") <= 3, "the refused change was not retried unchanged (%d lines)" %
              text.count("request is too large"))
    except Exception as e:  # noqa: BLE001 - reported, the processes still stopped
        check(False, "no exception: %r" % e)
    finally:
        finish(cl, ("w-a", "w-b"))
    return 1 if FAILS else 0


def stratactl(args, addrs, *words):
    """stratactl --addr A,B,... WORDS: (exit status, stdout + stderr)."""
    p = subprocess.run([args.stratactl, "--addr", ",".join(addrs), "--timeout", "5"] + list(words),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    print("  $ stratactl --addr %s %s -> %d\n%s" % (",".join(addrs), " ".join(words), p.returncode,
                                                    "\n".join("    " + l for l in p.stdout.splitlines()[:6])))
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="failover", choices=["failover", "fence", "tls", "stall", "refuse"])
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--stratactl", required=True)
    ap.add_argument("--proto", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    if not etcd_binary():
        print("skip: no etcd binary (Debian: apt-get install etcd-server)")
        return 77
    global grpc, pb, pbg
    grpc, pb, pbg = control_stubs(args.proto, os.path.join(args.workdir, "failover_stubs"))
    return {"tls": run_tls, "fence": run_fence, "stall": run_stall, "refuse": run_refuse}.get(args.mode, run)(args)


if __name__ == "__main__":
    sys.exit(main())
