#!/usr/bin/python3
"""failover.py — issue 12's failover figures (a benchmark: figures, not pass/fail).
Run through bench/failover.sh, which builds the binaries first.

  failover.py --build DIR [--kills N] [--fault crash|hang|partition|all]
              [--streams S] [--tokens T] [--kill-at K] [--threads N]
              [--model GGUF] [--shared DIR] [--keep]

A live coordinator (strata-coordinator --live, gRPC registration) and 3
strata-worker processes (w-a, w-b serve PP 2, w-c a spare; each worker keeps
its port for the whole run), stories260K unless --model. On loopback, or for
the partition fault each worker in its own network namespace (tests/harness.py
NetnsBridge; needs root, ip netns and nft, else that fault is skipped). N
times: S greedy SSE streams (temperature 0, ignore_eos, T tokens, the
reference prompts) start; once every stream has K tokens the worker holding
stage 1 (asked each time with `stratactl placement show`) gets
  crash:     SIGKILL;
  hang:      SIGSTOP (found by the coordinator's per-micro-batch deadline,
             cluster.c check_overdue); once the streams are over it is
             SIGCONTed and SIGKILLed;
  partition: nft in its namespace silently drops every packet through its
             veth (found by the deadline too); once the streams are over the
             link heals and the worker is SIGKILLed.
`all` runs the three in turn, N each, on a fresh cluster each. Then the
streams finish on the new placement, the faulted worker is started again with
the same name on the same port (it becomes the spare of the next kill) and the
cluster is waited for: serving, 3 nodes ready, one holding no stage.

Per kill:
  detection          kill -> the coordinator's `recovery: ... lost stage 1 ...
                     holding` log line (its timestamp, CLOCK_REALTIME, ms)
  kill-to-next-token kill -> the first token that any stream receives after the
                     kill (client side, time.monotonic()); tokens that were
                     already on their way before the hold line (computed before
                     the kill) are not counted: the first token received after
                     the hold line's time is, and the number skipped is printed
  tokens recomputed  the delta of /metrics strata_tokens_recomputed_total
  coordinator        the `epoch E serves X s after the loss` figure of the log
  stage load         the longest `stage K ready in X s` the workers logged
                     between the hold and the serve lines (the new stages'
                     loads), and its share of detection + recovery
p50 and p99 (linear interpolation) of each, and the raw lists.

Every process is started here and always stopped by pid (try/finally; SIGTERM
and SIGINT end the run through the same path); namespaces are removed.
/usr/bin/python3, stdlib only (the control API is read with stratactl --json).
"""
import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from harness import (NetnsBridge, free_port, http_get, insecure_flag, log_time, netns_unavailable, reap,  # noqa: E402
                     sse_completion, wait_for)

HB_MS = 1000
DEAD_MS = 10000
NAMES = ("w-a", "w-b", "w-c")


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Cluster:
    def __init__(self, a, nb=None):
        """nb: a NetnsBridge (partition faults): every worker in its own
        namespace, the coordinator's gRPC on the bridge address."""
        self.a = a
        self.nb = nb
        self.ns_of = {}
        self.tmp = tempfile.mkdtemp(prefix="strata-failover-")
        self.model = a.model
        self.env = dict(os.environ)
        self.env.pop("JOURNAL_STREAM", None)  # logs to stderr (the files below), not journald
        self.env.setdefault("UCX_TLS", "tcp")
        if nb:
            self.env.pop("UCX_NET_DEVICES", None)  # the bridge and the veths
        else:
            self.env.setdefault("UCX_NET_DEVICES", "lo")
        self.http_port = free_port()
        self.grpc_addr = "%s:%d" % (nb.host_ip if nb else "127.0.0.1", free_port())
        self.ports = {n: free_port() for n in NAMES}
        self.workers = {}      # name -> Popen (the latest process of that name)
        self.old = []          # earlier processes (killed), reaped at the end
        self.stopped = set()   # pids SIGSTOPped and not yet killed
        self.old_lease = {}    # name -> lease id of the process replaced (until the new one registers)
        self.coord = None
        cfg = os.path.join(self.tmp, "cluster.ini")
        with open(cfg, "w") as f:
            f.write("[cluster]\nmodel = %s\nkv_blocks = 256\n" % self.model)
        bindir = a.build
        self.bin_coord = os.path.join(bindir, "coordinator", "strata-coordinator")
        self.bin_worker = os.path.join(bindir, "daemon", "strata-worker")
        self.bin_ctl = os.path.join(bindir, "cli", "stratactl")
        log = open(os.path.join(self.tmp, "coordinator.log"), "w")
        self.coord = subprocess.Popen(
            [self.bin_coord, "--live", "--config", cfg, "--listen", "127.0.0.1:%d" % self.http_port,
             "--grpc-listen", self.grpc_addr, "--state", os.path.join(self.tmp, "state.json"),
             "--heartbeat-ms", str(HB_MS), "--dead-after-ms", str(DEAD_MS), "--min-workers", "2",
             "--ready-timeout", "600"] + (insecure_flag(self.bin_coord) if nb else []),
            stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()

    def start_worker(self, name):
        log = open(os.path.join(self.tmp, "%s.log" % name), "a")
        host, pre = "127.0.0.1", []
        if self.nb:
            if name not in self.ns_of:
                self.ns_of[name] = self.nb.add()
            host, pre = self.nb.ip(self.ns_of[name]), self.nb.exec_prefix(self.ns_of[name])
        cmd = pre + [self.bin_worker, "--listen", "%s:%d" % (host, self.ports[name]), "--coordinator", self.grpc_addr,
                     "--name", name, "--model", self.model, "--threads", str(self.a.threads)] + \
            (insecure_flag(self.bin_worker) if self.nb else [])
        self.workers[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()

    def fault(self, name, kind):
        p = self.workers[name]
        if kind == "partition":
            self.nb.drop(self.ns_of[name])  # nft in its namespace drops every packet, silently
            self.cut = name
        elif kind == "hang":
            self.stopped.add(p.pid)
            os.kill(p.pid, signal.SIGSTOP)
        else:
            os.kill(p.pid, signal.SIGKILL)

    def finish_victim(self, name):
        """The faulted process: healed if cut off, SIGCONT + SIGKILL if
        stopped, SIGKILL if partitioned; reaped."""
        if getattr(self, "cut", None) == name:
            self.nb.undrop(self.ns_of[name])
            self.cut = None
            self.workers[name].kill()
        p = self.workers.pop(name)
        if p.pid in self.stopped and p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            os.kill(p.pid, signal.SIGKILL)
        self.stopped.discard(p.pid)
        p.wait(timeout=30)
        self.old.append(p)

    def ctl(self, *words):
        r = subprocess.run([self.bin_ctl, "--addr", self.grpc_addr, "--json", "--timeout", "5"] + list(words),
                           capture_output=True, text=True, timeout=15)
        if r.returncode != 0:
            raise RuntimeError("stratactl %s: rc %d %s" % (" ".join(words), r.returncode, r.stderr.strip()))
        return json.loads(r.stdout)

    def get(self, path):
        return http_get(self.http_port, path)

    def metric(self, name):
        st, m = self.get("/metrics")
        for line in m.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.split()[-1])
        return 0.0

    def log(self, name="coordinator"):
        with open(os.path.join(self.tmp, "%s.log" % name), errors="replace") as f:
            return f.read().splitlines()

    def stage_loads(self, t0, t1):
        """The `stage K ready in X s` figures the workers logged between wall
        times t0 and t1 (the stages loaded for a recovery): [(worker, X)]."""
        out = []
        for n in NAMES:
            for l in self.log(n):
                if " ready in " in l and "worker: stage" in l and t0 <= log_time_safe(l) <= t1:
                    try:
                        out.append((n, float(l.split(" ready in ", 1)[1].split(" s", 1)[0])))
                    except (IndexError, ValueError):
                        pass
        return out

    def steady(self):
        """The placement when: serving, nothing pending, /health 200, the 3
        workers ready, 2 stages and one worker holding none (the spare)."""
        if not self.ctl("status").get("serving"):
            return None
        pl = self.ctl("placement", "show")
        if pl.get("pending"):
            return None
        nodes = self.ctl("nodes").get("nodes", [])
        ready = {n["name"] for n in nodes if n.get("state") in ("NODE_STATE_READY", 2)}
        # A restarted worker counts once it registered again (a new lease):
        # until then the registry still lists the old process as ready.
        lease = {n["name"]: str(n.get("lease_id")) for n in nodes}
        if any(lease.get(k) == v for k, v in self.old_lease.items()):
            return None
        self.old_lease.clear()
        stages = pl.get("current", {}).get("stages", [])
        holders = {s["node"] for s in stages}
        if not set(NAMES) <= ready or len(stages) != 2 or not set(NAMES) - holders:
            return None
        if self.get("/health")[0] != 200:
            return None
        return pl["current"]

    def stream(self, prompt, n, on_chunk):
        def chunk(ids, k):
            if k:
                on_chunk(len(ids), time.monotonic(), time.time())
        done, ids, errors = sse_completion(self.http_port, prompt, n, chunk)
        return done, len(ids), errors

    def stop(self):
        procs = list(self.workers.items())
        for n, p in procs:
            if p.pid in self.stopped and p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGKILL)
        if self.coord is not None:
            procs.append(("coordinator", self.coord))
        for n, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        rcs = reap(procs)
        for p in self.old:
            if p.poll() is None:
                p.kill()
                p.wait()
        return rcs


def one_kill(cl, a, fault, i, prompts):
    pl = wait_for(cl.steady, 600, 0.1)
    if not pl:
        raise RuntimeError("kill %d: the cluster is not serving with a spare within 600 s" % i)
    victim = pl["stages"][1]["node"]
    epoch0 = int(pl["epoch"])
    rec0 = cl.metric("strata_tokens_recomputed_total")
    n_hold0 = sum(1 for l in cl.log() if "recovery:" in l and "holding" in l)
    lock = threading.Lock()
    progress = [0] * len(prompts)
    events = []      # (monotonic, wall) of every chunk with tokens
    kill_at = []     # (monotonic, wall, progress)

    def run(k, out):
        def chunk(n, mono, wall):
            with lock:
                progress[k] = n
                events.append((mono, wall))
                if not kill_at and min(progress) >= a.kill_at:
                    m0, w0 = time.monotonic(), time.time()
                    cl.fault(victim, fault)
                    kill_at.append((m0, w0, list(progress)))
        try:
            out[k] = cl.stream(prompts[k], a.tokens, chunk)
        except Exception as e:  # noqa: BLE001
            out[k] = (False, 0, ["exception: %r" % e])
    out = [None] * len(prompts)
    ts = [threading.Thread(target=run, args=(k, out)) for k in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    if not kill_at:
        raise RuntimeError("kill %d: the streams ended before %d tokens each: %s" % (i, a.kill_at, out))
    m0, w0, prog = kill_at[0]
    # The coordinator's figures: the hold line (detection) and the resume line.
    holds, serves, hold_w, serve_w = [], None, None, None
    wait_for(lambda: any("recovery: epoch" in l and "serves" in l and "after the loss" in l
                         for l in cl.log() if log_time_safe(l) >= w0 - 0.002), 30)
    for l in cl.log():
        if "recovery:" in l and "holding" in l:
            holds.append(l)
    new_holds = holds[n_hold0:]
    hung = False
    if new_holds:
        hold_w = log_time(new_holds[0])
        hung = " hung" in new_holds[0]
    for l in cl.log():
        if "recovery: epoch" in l and "serves" in l and "after the loss" in l and log_time_safe(l) >= w0 - 0.002:
            try:
                serves = float(l.split(" serves ", 1)[1].split(" s after", 1)[0])
                serve_w = log_time(l)
            except (IndexError, ValueError):
                pass
            break
    detect = hold_w - w0 if hold_w is not None else None
    after = sorted(e for e in events if e[0] > m0)
    # Tokens received after the kill but before the hold line were computed before the kill.
    resumed = [e for e in after if hold_w is None or e[1] > hold_w]
    early = len(after) - len(resumed)
    ktnt = resumed[0][0] - m0 if resumed else None
    rec = cl.metric("strata_tokens_recomputed_total") - rec0
    loads = cl.stage_loads(hold_w or w0, serve_w or time.time())
    load = max((x for _, x in loads), default=None)
    n_ok = sum(1 for o in out if o and o[0] and not o[2] and o[1] == a.tokens)
    errs = [e for o in out if o for e in o[2]]
    pl1 = cl.ctl("placement", "show").get("current", {})
    # The faulted worker goes (SIGCONT + SIGKILL when stopped) and comes back
    # with the same name on the same port: the spare of the next kill.
    cl.old_lease[victim] = next((str(n.get("lease_id")) for n in cl.ctl("nodes").get("nodes", [])
                                 if n["name"] == victim), None)
    cl.finish_victim(victim)
    cl.start_worker(victim)
    print("kill %d: %s %s (stage 1 of epoch %d) at %s tokens -> epoch %s %s: detection %s s%s, "
          "kill-to-next-token %s s (%d token chunk(s) already on the way skipped), recomputed %d tokens, "
          "coordinator recovery %s s (stage loads %s); streams %d/%d [DONE] with %d tokens%s"
          % (i, {"hang": "SIGSTOP", "partition": "nft drop of"}.get(fault, "SIGKILL"), victim, epoch0, prog,
             pl1.get("epoch"), ",".join("%s:%s-%s" % (s["node"], s.get("first_layer", 0), s.get("last_layer", 0))
                                         for s in pl1.get("stages", [])),
             "%.3f" % detect if detect is not None else "-", " (hung)" if hung else "",
             "%.3f" % ktnt if ktnt is not None else "-", early, rec,
             "%.2f" % serves if serves is not None else "-",
             ", ".join("%s %.2f s" % x for x in loads) or "none", n_ok, len(out), a.tokens,
             "; errors: %s" % errs[:2] if errs else ""), flush=True)
    return detect, ktnt, rec, serves, n_ok == len(out), load


def log_time_safe(l):
    try:
        return log_time(l)
    except (ValueError, IndexError):
        return 0.0


def header(a, cl, fault):
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = "?"
    how = {"hang": "SIGSTOP, later SIGCONT + SIGKILL,",
           "partition": "nft dropping every packet of the namespace of"}.get(fault, "SIGKILL")
    print("# failover: %d kill(s), fault %s (%s the worker holding stage 1)" % (a.kills, fault, how))
    print("# machine: %s, %d CPU(s), %s, load average %s; commit %s, build %s"
          % (cpu, os.cpu_count() or 0, platform.platform(), " ".join("%.2f" % x for x in os.getloadavg()),
             commit or "?", os.path.abspath(a.build)))
    print("# model: %s (%d bytes); live mode, 3 workers %s (PP 2 + 1 spare, %d thread(s) each), UCX_TLS=%s"
          % (cl.model, os.path.getsize(cl.model),
             "each in its own network namespace (veth + bridge)" if cl.nb else "on loopback",
             a.threads, cl.env.get("UCX_TLS")))
    print("# load: %d greedy SSE streams of %d tokens (ignore_eos), fault once every stream has %d tokens; "
          "heartbeat %d ms, dead after %d ms" % (a.streams, a.tokens, a.kill_at, HB_MS, DEAD_MS), flush=True)


def run_fault(a, fault, prompts):
    """a.kills faults of one kind on a fresh cluster: the per-kill results, 0
    or 1 (stopped early), and the figures' table printed."""
    nb = cl = None
    res = []
    rc = 0
    try:
        if fault == "partition":
            why = netns_unavailable()
            if why:
                print("# failover: partition skipped: %s" % why, flush=True)
                return res, 0
            nb = NetnsBridge()
        cl = Cluster(a, nb)
        header(a, cl, fault)
        cl.start_worker("w-a")
        cl.start_worker("w-b")
        if not wait_for(lambda: cl.ctl("status").get("serving"), 600, 0.1):
            raise RuntimeError("w-a, w-b do not serve within 600 s")
        cl.start_worker("w-c")
        for i in range(1, a.kills + 1):
            res.append(one_kill(cl, a, fault, i, prompts))
        # The last restarted worker registers before everything stops.
        wait_for(cl.steady, 600, 0.1)
    except BaseException as e:  # noqa: BLE001 - reported, the processes stopped below
        print("failover: stopped: %r (logs in %s)" % (e, cl.tmp if cl else "-"), flush=True)
        rc = 1
        if isinstance(e, KeyboardInterrupt):
            raise
    finally:
        rcs = cl.stop() if cl else {}
        if nb:
            nb.close()
        print("processes stopped: %s" % rcs, flush=True)
        if cl and not a.keep and rc == 0:
            shutil.rmtree(cl.tmp, ignore_errors=True)
        elif cl:
            print("logs: %s" % cl.tmp)
    if res:
        det = [r[0] for r in res if r[0] is not None]
        ktnt = [r[1] for r in res if r[1] is not None]
        rec = [r[2] for r in res]
        srv = [r[3] for r in res if r[3] is not None]
        load = [r[5] for r in res if r[5] is not None]
        share = [r[5] / (r[0] + r[3]) for r in res if r[5] is not None and r[0] and r[3] is not None]
        print("%-28s %9s %9s  raw" % ("figure (%d kills, %s)" % (len(res), fault), "p50", "p99"))
        for name, xs, fmt in (("detection (s)", det, "%.3f"), ("kill-to-next-token (s)", ktnt, "%.3f"),
                              ("tokens recomputed", rec, "%.0f"), ("coordinator recovery (s)", srv, "%.2f"),
                              ("stage load (s)", load, "%.2f"),
                              ("load / (detection+recovery)", share, "%.2f")):
            print("%-28s %9s %9s  [%s]" % (name, fmt % pct(xs, 50), fmt % pct(xs, 99),
                                            ", ".join(fmt % x for x in xs)))
        bad = sum(1 for r in res if not r[4])
        print("kills whose streams did not all end with [DONE] and all %d tokens: %d of %d"
              % (a.tokens, bad, len(res)), flush=True)
    return res, rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--fault", choices=["crash", "hang", "partition", "all"], default="crash")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--kill-at", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    ap.add_argument("--model", default=None, help="GGUF model (default: stories260K of --shared)")
    ap.add_argument("--shared", default=os.environ.get("STRATA_SHARED") or
                    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared"))
    ap.add_argument("--keep", action="store_true", help="keep the logs' directory")
    a = ap.parse_args()
    a.model = a.model or os.path.join(a.shared, "models", "stories260K.gguf")
    with open(os.path.join(a.shared, "reference", "stories260K-greedy.json")) as f:
        refs = json.load(f)
    prompts = [refs[k % len(refs)]["prompt"] for k in range(a.streams)]

    def on_term(sig, frame):
        raise KeyboardInterrupt("signal %d" % sig)
    signal.signal(signal.SIGTERM, on_term)
    rc = 0
    try:
        for fault in (["crash", "hang", "partition"] if a.fault == "all" else [a.fault]):
            rc |= run_fault(a, fault, prompts)[1]
    except KeyboardInterrupt as e:
        print("failover: interrupted: %s" % e, flush=True)
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
