#!/usr/bin/python3
"""lifecycle_test.py — issue 17: graceful shutdown of the coordinator and the
worker, with real processes on loopback (stories260K) driven over HTTP.

  lifecycle_test.py MODE --coordinator BIN --worker BIN --shared DIR
                    [--stratactl BIN --proto control.proto --workdir DIR]

MODE
  shutdown        static PP 1, --shutdown-grace 4, every forward 20 ms slower
                  (STRATA_TEST_FORWARD_DELAY_MS) so that streams last seconds:
                  8 greedy SSE streams (4 of 40 tokens, 4 of 300) and one
                  non-streaming request of 300, first without a signal (the
                  reference), then with SIGTERM to the coordinator once every
                  stream has 5 tokens. Every stream ends with [DONE]; the 40-token
                  ones finish within the grace period with the reference tokens
                  and no error; the 300-token ones end at the deadline with one
                  error event "shutting_down" after a prefix of the reference;
                  the non-streaming one gets the 503 error body; /readyz (polled
                  in a thread) is 200 before the signal and 503 from it on; a
                  new completion after the signal gets 503 shutting_down with
                  Retry-After; the coordinator exits 0 about 4 s after the
                  signal.
  second-signal   the same streams, --shutdown-grace 60: a second SIGTERM 0.5 s
                  after the first ends the open streams at once (error event
                  and [DONE]); exit 0 within a few seconds, far before 60 s.
  probes          static PP 1: /livez, /healthz, /readyz 200 and /version's
                  fields; HEAD works, POST gets 405 with Allow; X-Request-Id is
                  echoed and becomes req= in the log (an invalid one is replaced
                  by the cmpl-… id); after a SIGKILL of the worker /livez stays
                  200 while /readyz and /health answer 503 (not_ready).
  worker-leave    live mode, w-a and w-b serve (2 stages), w-c is a spare;
                  --dead-after-ms 30000. 6 greedy streams of 200 tokens; SIGTERM
                  to stage 1's worker at 20 tokens: it tells the coordinator it
                  leaves (Leave; the log says so), the spare serves its stage
                  in well under the heartbeat timeout (< 5 s; measured from the
                  signal by polling GetPlacement), the node is DEAD at once,
                  every stream ends with [DONE], no error event and the
                  no-failure tokens; the worker exits 0.
Every process is stopped by its pid in a finally block; every wait is bounded.
"""
import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
from harness import (FAILS, LiveBase, check, check_streams, control_stubs, eventually, free_port, reap,  # noqa: E402
                     sse_completion, stream_all, wait_for)
from cluster_test import Cluster  # noqa: E402

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom", "A big red ball",
           "One day, a girl", "The sun was", "Tim had a", "In the park"]
SHORT, LONG = 40, 300


def stream(port, prompt, n, on_chunk=None):
    """harness.sse_completion with the exceptions caught: (saw [DONE], ids,
    error messages); on_chunk(token count so far)."""
    try:
        return sse_completion(port, prompt, n, (lambda ids, k: on_chunk(len(ids))) if on_chunk else None,
                              timeout=60)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        return False, [], ["exception: %r" % e]


# The error event's message: at the end of the grace period, or at a second signal.
SHUTDOWN_MSG = ("the server shut down before this completion finished",
                "the server is shutting down (second signal")


def post(port, body, headers=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                  headers=dict({"Content-Type": "application/json"}, **(headers or {})))
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def run_streams(port, lengths, on_progress=None, nonstream=None):
    """The streams of PROMPTS with lengths, at once (a thread each), plus one
    non-streaming request of nonstream tokens when given: (stream results,
    (status, body) of the non-streaming one)."""
    progress = [0] * len(lengths)
    out = [None] * len(lengths)
    ns = [None]

    def one(i):
        def chunk(k):
            progress[i] = k
            if on_progress:
                on_progress(progress)
        out[i] = stream(port, PROMPTS[i], lengths[i], chunk)

    def plain():
        try:
            st, _, body = post(port, {"prompt": "Once upon a time", "max_tokens": nonstream,
                                      "temperature": 0, "ignore_eos": True})
            ns[0] = (st, body)
        except Exception as e:  # noqa: BLE001
            ns[0] = (None, repr(e).encode())
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(lengths))]
    if nonstream:
        ts.append(threading.Thread(target=plain))
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    return out, ns[0]


class ReadyzPoller(threading.Thread):
    """GET /readyz in a loop: samples (t_start, t_end, status or None when refused)."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.samples, self.stop = port, [], False

    def run(self):
        while not self.stop:
            t = time.monotonic()
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/readyz")
                st = c.getresponse().status
                c.close()
            except OSError:
                st = None
            self.samples.append((t, time.monotonic(), st))
            time.sleep(0.02)


def mode_shutdown(args, second_signal=False):
    grace = 60 if second_signal else 4
    os.environ["STRATA_TEST_FORWARD_DELAY_MS"] = "20"
    cl = Cluster(args, [{"tp": 1}], coord_args=["--shutdown-grace", str(grace)])
    lengths = [SHORT] * 4 + [LONG] * 4
    try:
        cl.start()
        t0 = time.monotonic()
        base, _ = run_streams(cl.http_port, lengths)
        print("reference run: %.1f s" % (time.monotonic() - t0))
        for i, (done, ids, errs) in enumerate(base):
            check(done and not errs and len(ids) == lengths[i], "reference stream %d: [DONE], %d tokens" % (i, lengths[i]))
        poller = ReadyzPoller(cl.http_port)
        poller.start()
        sig = {"t": None}
        lock = threading.Lock()

        def on_progress(progress):
            with lock:
                if sig["t"] is None and min(progress) >= 5:
                    sig["t"] = time.monotonic()
                    cl.coordinator.send_signal(signal.SIGTERM)
                    if second_signal:
                        threading.Timer(0.5, lambda: cl.coordinator.send_signal(signal.SIGTERM)).start()
                    threading.Timer(0.3, late_request).start()

        late = {}

        def late_request():
            try:
                late["r"] = post(cl.http_port, {"prompt": "Hello", "max_tokens": 4}, timeout=10)
            except Exception as e:  # noqa: BLE001
                late["r"] = (None, {}, repr(e).encode())
        t1 = time.monotonic()
        out, ns = run_streams(cl.http_port, lengths, on_progress, nonstream=None if second_signal else LONG)
        print("streams returned %.2f s after they started (signal at %.2f s)"
              % (time.monotonic() - t1, (sig["t"] - t1) if sig["t"] else -1), flush=True)
        try:
            rc = cl.coordinator.wait(timeout=grace + 20)
        except subprocess.TimeoutExpired:
            rc = "still running"
        t_exit = time.monotonic()
        poller.stop = True
        poller.join(10)
        if not check(sig["t"] is not None, "SIGTERM sent once every stream had 5 tokens"):
            return
        took = t_exit - sig["t"]
        print("coordinator exited %.2f s after SIGTERM (grace %d s)" % (took, grace))
        check(rc == 0, "the coordinator exits 0 (got %r)" % rc)
        if second_signal:
            check(took < 10, "a second SIGTERM ends the drain at once (exit %.1f s after the first)" % took)
        else:
            check(grace - 0.5 <= took <= grace + 5, "exit at the end of the grace period (%.1f s, grace %d)" % (took, grace))
        # The streams.
        for i, (done, ids, errs) in enumerate(out):
            check(done, "stream %d ends with [DONE]" % i)
            ref = base[i][1]
            if lengths[i] == SHORT and not second_signal:
                check(not errs and ids == ref, "stream %d (%d tokens) finished within the grace period "
                      "with the reference tokens (errors %s)" % (i, SHORT, errs[:1]))
            elif not errs:  # a short stream that finished before the second signal
                check(lengths[i] == SHORT and ids == ref, "stream %d finished with the reference tokens" % i)
            else:
                check(len(errs) == 1 and errs[0].startswith(SHUTDOWN_MSG),
                      "stream %d (%d tokens) ends with one shutting_down error event (%s)" % (i, lengths[i], errs[:2]))
                check(0 < len(ids) < lengths[i] and ids == ref[:len(ids)],
                      "stream %d: its %d tokens before the end are the reference's prefix" % (i, len(ids)))
        if ns is not None:
            st, body = ns
            code = None
            try:
                code = json.loads(body)["error"]["code"]
            except Exception:  # noqa: BLE001
                pass
            check(st == 503 and code == "shutting_down",
                  "the non-streaming request cut at the deadline gets 503 shutting_down (%s %s)" % (st, body[:120]))
        r = late.get("r")
        check(r is not None and r[0] == 503 and r[1].get("Retry-After", "").isdigit()
              and b"shutting_down" in r[2],
              "a completion after the signal: 503 shutting_down with Retry-After (%s)"
              % (r[:2] if r else None,))
        # /readyz: 200 before, 503 (or refused, once it exited) from the signal on.
        # (A probe sent just after kill() may be read by the loop before the
        # signal is: delivery takes a scheduling slot, longer under load. So:
        # the first 503 comes within 1 s, and nothing but 503 after it.)
        # "Before" is a probe answered before the signal was sent: one in
        # flight across it may be read after the signal and rightly get 503.
        before = [s for t, end, s in poller.samples if end < sig["t"]]
        first = next((t for t, _, s in poller.samples if t >= sig["t"] and s == 503), None)
        after = [s for t, _, s in poller.samples if first is not None and t >= first]
        check(before and before[-1] == 200, "/readyz was 200 before the signal (%s)" % before[-3:])
        check(first is not None and first - sig["t"] < 1.0,
              "/readyz answered 503 %.3f s after the signal" % ((first - sig["t"]) if first else -1))
        check(len(after) > 10 and all(s in (503, None) for s in after),
              "/readyz stayed 503 from then on until the exit (%d samples: %s)"
              % (len(after), sorted(set(after), key=str)))
        log = open(cl.co_log, errors="replace").read()
        check("draining; admissions closed" in log, "the coordinator logs the drain")
    finally:
        if FAILS:
            cl.dump_logs()
        rcs = cl.stop()
        print("exit statuses: %s" % rcs)


def request(port, method, path, headers=None, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def mode_probes(args):
    import re
    cl = Cluster(args, [{"tp": 1}])
    try:
        cl.start()
        p = cl.http_port
        for path in ("/livez", "/healthz"):
            st, h, body = request(p, "GET", path)
            check(st == 200 and json.loads(body) == {"status": "alive"}, "GET %s: 200 alive (%d %s)" % (path, st, body))
        st, h, body = request(p, "GET", "/readyz")
        check(st == 200 and json.loads(body) == {"status": "ready"}, "GET /readyz: 200 ready (%d %s)" % (st, body))
        st, h, body = request(p, "GET", "/version")
        v = json.loads(body) if st == 200 else {}
        print("/version: %s" % v)
        check(re.fullmatch(r"\d+\.\d+\.\d+", v.get("version", "")) is not None, "/version: version x.y.z")
        check(re.fullmatch(r"[0-9a-f]{12}(\+dirty)?|unknown", v.get("git_commit", "")) is not None,
              "/version: git_commit is 12 hex digits or unknown")
        check(v.get("model") == "stories260K" and v.get("build_type"), "/version: model and build_type")
        st, h, body = request(p, "HEAD", "/livez")
        check(st == 200 and body == b"", "HEAD /livez: 200, no body")
        st, h, body = request(p, "POST", "/readyz", body=b"{}")
        check(st == 405 and "GET" in h.get("Allow", "") and b"method_not_allowed" in body,
              "POST /readyz: 405 with Allow (%d %s)" % (st, h.get("Allow")))
        # X-Request-Id
        st, h, body = post(p, {"prompt": "Once", "max_tokens": 3}, {"X-Request-Id": "trace-42.a:b"})
        check(st == 200 and h.get("X-Request-Id") == "trace-42.a:b", "a valid X-Request-Id is echoed (%s)" % h.get("X-Request-Id"))
        check(json.loads(body)["id"].startswith("cmpl-"), "the completion's id stays cmpl-…")
        st, h, body = post(p, {"prompt": "Once", "max_tokens": 3, "stream": True}, {"X-Request-Id": "sse-7"})
        check(st == 200 and h.get("X-Request-Id") == "sse-7", "a stream echoes X-Request-Id")
        for bad in ("has space", "x" * 64, "quote\"", "ctl\x01"):
            try:
                st, h, body = post(p, {"prompt": "Once", "max_tokens": 3}, {"X-Request-Id": bad})
            except Exception as e:  # noqa: BLE001 - http.client refuses some header values
                print("  (client refused %r: %s)" % (bad, e))
                continue
            rid = h.get("X-Request-Id", "")
            check(st == 200 and rid.startswith("cmpl-") and rid == json.loads(body)["id"],
                  "an invalid X-Request-Id %r is replaced by the cmpl-… id (%s)" % (bad[:12], rid))
        st, h, body = post(p, {"prompt": "Once", "max_tokens": 3})
        check(h.get("X-Request-Id", "") == json.loads(body)["id"], "no X-Request-Id: the cmpl-… id is sent back")
        st, h, body = request(p, "GET", "/v1/models", headers={"X-Request-Id": "models-1"})
        check(h.get("X-Request-Id") == "models-1", "other routes echo X-Request-Id too")
        time.sleep(0.3)

        def co_log():
            return open(cl.co_log, errors="replace").read()
        # a request's access line is written after its answer
        eventually(lambda: "req=trace-42.a:b" in co_log() and "req=sse-7" in co_log())
        log = co_log()
        check("req=trace-42.a:b" in log and "req=sse-7" in log, "the log lines carry the client's request id")
        check("has space" not in log, "an invalid id never reaches the log")
        # Liveness vs readiness: no placement serves.
        worker = [q for n, q in cl.procs if n == "worker0"][0]
        worker.kill()
        worker.wait(10)
        ok = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not ok:
            ok = request(p, "GET", "/readyz")[0] == 503
            time.sleep(0.05)
        st, h, body = request(p, "GET", "/readyz")
        check(st == 503 and b"not_ready" in body and h.get("Retry-After", "").isdigit(),
              "without a serving placement /readyz: 503 not_ready with Retry-After (%d %s)" % (st, body[:100]))
        check(request(p, "GET", "/health")[0] == 503, "/health: 503 too")
        check(request(p, "GET", "/livez")[0] == 200, "/livez stays 200 (the coordinator itself is alive)")
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_worker_leave(args):
    grpc, pb, pbg = control_stubs(args.proto, os.path.join(args.workdir, "pygen-lifecycle-leave"))
    lb = LiveBase(args, "strata-leave-")
    procs = {}
    logs = {}

    def start(name, cmd):
        logs[name] = os.path.join(lb.tmp, name + ".log")
        procs[name] = subprocess.Popen(cmd, stdout=open(logs[name], "w"), stderr=subprocess.STDOUT, env=lb.env)

    def start_worker(name):
        start(name, [args.worker, "--listen", "127.0.0.1:%d" % free_port(), "--coordinator", lb.grpc_addr,
                     "--name", name, "--model", lb.model, "--threads", "1"])
    start("coordinator", [args.coordinator, "--live", "--config", lb.cfg, "--listen", "127.0.0.1:%d" % lb.http_port,
                          "--grpc-listen", lb.grpc_addr, "--state", os.path.join(lb.tmp, "state.json"),
                          "--heartbeat-ms", "1000", "--dead-after-ms", "30000", "--min-workers", "2"])
    chan = grpc.insecure_channel(lb.grpc_addr)
    stub = pbg.ControlStub(chan)
    rcs = {}
    try:
        start_worker("w-a")
        start_worker("w-b")
        if not check(wait_for(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=2).serving, 120, 0.1),
                     "w-a, w-b serve"):
            return
        start_worker("w-c")
        nodes = lambda: {n.name: n for n in stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes}  # noqa: E731
        check(wait_for(lambda: nodes()["w-c"].state == pb.NODE_STATE_READY, 60), "the spare w-c is ready")
        pl0 = stub.GetPlacement(pb.GetPlacementRequest(), timeout=5).current
        victim = pl0.stages[1].node
        with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
            prompts = [r["prompt"] for r in json.load(f)[:6]]
        base = stream_all(lb.http_port, prompts, 200)
        check(all(o[0] and not o[2] and len(o[1]) == 200 for o in base), "no-signal run: 6 streams of 200 tokens")
        base = [o[1] for o in base]
        lock = threading.Lock()
        t_sig = []
        replaced = []

        def watch():  # from the signal on: when does a placement without the victim serve?
            while time.monotonic() - t_sig[0] < 60:
                try:
                    cur = stub.GetPlacement(pb.GetPlacementRequest(), timeout=2).current
                    if cur.epoch > pl0.epoch and victim not in [x.node for x in cur.stages] and \
                            stub.GetStatus(pb.GetStatusRequest(), timeout=2).serving:
                        replaced.append(time.monotonic() - t_sig[0])
                        return
                except Exception:  # noqa: BLE001 - polled again
                    pass
                time.sleep(0.05)
        watcher = threading.Thread(target=watch, daemon=True)

        def on_progress(progress):
            with lock:
                if not t_sig and min(progress) >= 20:
                    t_sig.append(time.monotonic())
                    procs[victim].send_signal(signal.SIGTERM)
                    watcher.start()
        out = stream_all(lb.http_port, prompts, 200, on_progress)
        check(bool(t_sig), "SIGTERM to %s (stage 1) at 20 tokens" % victim)
        check_streams(out, base, "worker SIGTERM: ")
        try:
            rc = procs[victim].wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = "still running"
        check(rc == 0, "%s exits 0 after SIGTERM (%r)" % (victim, rc))
        check(nodes()[victim].state == pb.NODE_STATE_DEAD,
              "%s is DEAD at once (Leave; the heartbeat timeout is 30 s)" % victim)
        watcher.join(60)
        print("a placement without %s serves %.2f s after the SIGTERM" % (victim, replaced[0] if replaced else -1))
        check(bool(replaced) and replaced[0] < 5.0,
              "its stage is re-placed well under the heartbeat timeout (%s s < 5 s; dead-after 30 s)"
              % (round(replaced[0], 2) if replaced else None))
        pl1 = stub.GetPlacement(pb.GetPlacementRequest(), timeout=5).current
        check("w-c" in [x.node for x in pl1.stages], "the spare w-c took the stage")
        check(eventually(lambda: "node %s is leaving (SIGTERM)" % victim
                         in open(logs["coordinator"], errors="replace").read()), "the coordinator logs the Leave")
        wlog = open(logs[victim], errors="replace").read()
        check("left the cluster (SIGTERM): 1 stage(s)" in wlog, "the worker logs that it left")
    except Exception as e:  # noqa: BLE001
        check(False, "exception: %r" % e)
    finally:
        for n, p in procs.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        rcs = reap(list(procs.items()))
        chan.close()
        if FAILS:
            lb.dump(40)
    check(all(rc == 0 for rc in rcs.values()), "every process exits 0 on SIGTERM: %s" % rcs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["shutdown", "second-signal", "probes", "worker-leave"])
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--stratactl")
    ap.add_argument("--shared", required=True)
    ap.add_argument("--proto")
    ap.add_argument("--workdir", default="/tmp")
    args = ap.parse_args()
    if args.mode == "shutdown":
        mode_shutdown(args)
    elif args.mode == "second-signal":
        mode_shutdown(args, second_signal=True)
    elif args.mode == "probes":
        mode_probes(args)
    else:
        mode_worker_leave(args)
    if FAILS:
        print("FAILED: %d check(s)" % len(FAILS))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
