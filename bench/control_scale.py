#!/usr/bin/python3
"""control_scale.py — the control plane under N simulated workers (issue 18).

For each N: a fresh strata-coordinator --live (no placement: --min-workers
above N, so only the control plane works), then N simulated workers started
all at once, one gRPC connection each as the worker daemons have:
  --sim c (default)  bench's strata-fleet-sim (bench/fleet_sim.c): one
                     process, all calls asynchronous on --threads completion
                     queues (gRPC's C core), Register and Heartbeat as
                     daemon/registration.c sends them, with its deadlines;
  --sim python       tests/control/fleet_sim.py (grpc.aio), split over
                     processes of --per-proc workers; on a small machine
                     the Python simulators saturate the CPU long before the
                     coordinator does (10k workers on 2 cores: heartbeat
                     p99 1.5 s from the simulators' own delay).
Prints one row per N:

  cpu%       the coordinator's CPU (utime + stime, % of one core) over the
             steady window (--window s, after every node is ready)
  rss        the coordinator's RSS at the end of the window
  hb p50/p99 Heartbeat round trips seen by the simulators in the window (ms;
             includes the simulators' own scheduling delay); C: also the max
  cold       cold start: from the first Register until ListNodes shows all
             N nodes ready (s)
  cold hb p99  Heartbeat round trips during the cold start (ms): the nodes
             registered first heartbeat while the others' Registers queue
             (Heartbeat is urgent on the coordinator's loop, rpc/grpc_loop.h)
  misses     Register / Heartbeat calls past their 2 s deadline
  suspects   nodes the coordinator declared suspect or dead ("is suspect",
             "is dead" in its log, until the window's end) + heartbeats
             answered reregister: false suspects, since every simulator is
             alive
  nodes      `stratactl nodes` wall time (median of 3 in the window, ms)
  sim cpu%   (C) the simulator's own CPU over the window (% of one core):
             it shares the machine with the coordinator
  sim lag    (C) p99 of how late the window's heartbeats went out after
             their slot (ms): when it is near hb p99, the tail is the
             simulator's (or the machine's), not the coordinator's
The row's full figures go to stderr as one JSON line.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "control"))
from harness import control_stubs, free_port, wait_for  # noqa: E402
import fleet_sim  # noqa: E402


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return int(parts[11]) + int(parts[12])  # utime + stime


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def start_coordinator(args, n, tmp):
    cfg = os.path.join(tmp, "cluster.ini")
    with open(cfg, "w") as f:
        f.write("[cluster]\nmodel = %s\nkv_blocks = 256\n" % args.model)
    addr = "127.0.0.1:%d" % free_port()
    log = os.path.join(tmp, "coordinator.log")
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
    coord = subprocess.Popen([args.coordinator, "--live", "--config", cfg, "--listen", "127.0.0.1:%d" % free_port(),
                              "--grpc-listen", addr, "--state", os.path.join(tmp, "state.json"),
                              "--min-workers", str(10 * n + 1)], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             env=env)
    return coord, addr, log


def stop(proc, timeout=30):
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def one_python(args, n, grpc, pb, pbg, pydir, sha):
    tmp = tempfile.mkdtemp(prefix="strata-scale-")
    coord, addr, log = start_coordinator(args, n, tmp)
    chan = grpc.insecure_channel(addr)
    stub = pbg.ControlStub(chan)
    sims = []
    row = {"n": n}
    try:
        if not wait_for(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=2) is not None, 60, 0.1):
            raise RuntimeError("the coordinator did not start: %s" % open(log).read()[-500:])
        k = (n + args.per_proc - 1) // args.per_proc
        total_s = args.settle + args.window + args.cold_max + 5
        t0 = time.time()
        for i in range(k):
            lo, hi = i * n // k, (i + 1) * n // k
            sims.append((subprocess.Popen(
                [sys.executable, fleet_sim.__file__, "--addr", addr, "--model", args.model, "--sha", sha,
                 "--proto-dir", pydir, "-n", str(hi - lo), "--first", str(lo), "--seconds", str(total_s),
                 "--out", os.path.join(tmp, "sim%d.json" % i)] +
                (["--shared-connections"] if args.shared_connections else []), stdout=subprocess.PIPE, text=True), i))

        def ready():
            nodes = stub.ListNodes(pb.ListNodesRequest(), timeout=30).nodes
            return sum(1 for x in nodes if x.state == pb.NODE_STATE_READY)
        ok = wait_for(lambda: ready() == n, args.cold_max, 0.2)
        t_ready = time.time()
        row["cold_s"] = t_ready - t0 if ok else None
        time.sleep(args.settle)
        c0, w0 = cpu_ticks(coord.pid), time.time()
        row["load1"] = os.getloadavg()[0]
        lat = []
        for _ in range(3):
            t = time.time()
            subprocess.run([args.stratactl, "--addr", addr, "nodes"], stdout=subprocess.DEVNULL, timeout=60)
            lat.append(time.time() - t)
            time.sleep(args.window / 4.0)
        time.sleep(max(0.0, args.window - (time.time() - w0)))
        c1, w1 = cpu_ticks(coord.pid), time.time()
        text = open(log, errors="replace").read()  # now: the simulators stop (and go suspect) after the window
        row["cpu_pct"] = 100.0 * (c1 - c0) / os.sysconf("SC_CLK_TCK") / (w1 - w0)
        row["rss_mb"] = rss_mb(coord.pid)
        row["nodes_ms"] = 1000 * statistics.median(lat)
        hb, cold_hb, stats = [], [], {"reg_misses": 0, "hb_misses": 0, "reregisters": 0, "errors": 0}
        row["lost_sims"] = 0
        for p, i in sims:
            try:
                p.wait(timeout=max(5.0, t0 + total_s + 60 - time.time()))
                with open(os.path.join(tmp, "sim%d.json" % i)) as f:
                    d = json.load(f)
            except (subprocess.TimeoutExpired, OSError, ValueError):
                # a starved simulator that never wrote its figures: the row
                # says so instead of being lost
                p.kill()
                p.wait()
                row["lost_sims"] += 1
                continue
            hb += [v for t, v in d["hb"] if w0 <= t <= w1]
            cold_hb += [v for t, v in d["hb"] if t <= t_ready]
            for key in stats:
                stats[key] += d[key]
            if d["first_error"]:
                row.setdefault("first_error", d["first_error"])
        hb.sort()
        row["hb_p50_ms"] = 1000 * fleet_sim.percentile(hb, 50)
        row["hb_p99_ms"] = 1000 * fleet_sim.percentile(hb, 99)
        row["hb_samples"] = len(hb)
        cold_hb.sort()
        row["cold_hb_p99_ms"] = 1000 * fleet_sim.percentile(cold_hb, 99)
        row["cold_hb_samples"] = len(cold_hb)
        row.update(stats)
        row["suspects"] = len(re.findall(r"registry: \S+ is (?:suspect|dead)", text))
        return row
    finally:
        for p, _ in sims:
            if p.poll() is None:
                p.kill()
                p.wait()
        chan.close()
        stop(coord)
        if args.keep:
            print("kept %s" % tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def one_c(args, n, grpc, pb, pbg):
    """One row with strata-fleet-sim: it measures the heartbeats, the cold
    start and both processes' CPU itself (--coordinator-pid); this times
    `stratactl nodes` in its window and counts the log's suspects."""
    tmp = tempfile.mkdtemp(prefix="strata-scale-")
    coord, addr, log = start_coordinator(args, n, tmp)
    chan = grpc.insecure_channel(addr)
    stub = pbg.ControlStub(chan)
    sim = None
    row = {"n": n}
    try:
        if not wait_for(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=2) is not None, 60, 0.1):
            raise RuntimeError("the coordinator did not start: %s" % open(log).read()[-500:])
        chan.close()
        sim = subprocess.Popen([args.fleet_sim, "--addr", addr, "--model", args.model, "-n", str(n),
                                "--threads", str(args.threads), "--settle", str(args.settle),
                                "--window", str(args.window), "--cold-max", str(args.cold_max),
                                "--coordinator-pid", str(coord.pid)] + (["--load"] if args.load else []) +
                               (["--shared-connections"] if args.shared_connections else []) +
                               (["--preconnect"] if args.preconnect else []),
                               stdout=subprocess.PIPE, text=True)
        lat, text, result = [], "", None
        for line in sim.stdout:
            ev = json.loads(line)
            if ev.get("event") == "window":
                w0 = time.time()
                for _ in range(3):
                    t = time.time()
                    subprocess.run([args.stratactl, "--addr", addr, "nodes"], stdout=subprocess.DEVNULL, timeout=60)
                    lat.append(time.time() - t)
                    time.sleep(max(0.0, min(args.window / 4.0, w0 + args.window - time.time() - 0.5)))
            elif ev.get("event") == "window_end":
                text = open(log, errors="replace").read()  # then the simulators stop (and would go suspect)
            elif "event" not in ev:
                result = ev
        sim.wait()
        if result is None:
            raise RuntimeError("strata-fleet-sim exited %d without a report" % sim.returncode)
        row.update(result)
        row["nodes_ms"] = 1000 * statistics.median(lat) if lat else float("nan")
        row["suspects"] = len(re.findall(r"registry: \S+ is (?:suspect|dead)", text))
        return row
    finally:
        if sim:
            stop(sim)
        chan.close()
        stop(coord)
        if args.keep:
            print("kept %s" % tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def fmt(v, spec):
    return spec % v if isinstance(v, (int, float)) else "%*s" % (len(spec % 0.0), "-")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--stratactl", required=True)
    ap.add_argument("--proto", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sizes", default="1000,5000,10000")
    ap.add_argument("--sim", choices=["c", "python"], default="c")
    ap.add_argument("--fleet-sim", help="strata-fleet-sim (--sim c)")
    ap.add_argument("--threads", type=int, default=2, help="--sim c: the simulator's completion-queue threads")
    ap.add_argument("--load", action="store_true", help="--sim c: heartbeats carry load reports")
    ap.add_argument("--preconnect", action="store_true",
                    help="--sim c: every connection is made before the first Register (the cold start is then "
                         "the registrations alone; a diagnostic)")
    ap.add_argument("--per-proc", type=int, default=2500)
    ap.add_argument("--window", type=float, default=15.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--cold-max", type=float, default=120.0)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--shared-connections", action="store_true",
                    help="the simulated workers of one process share gRPC connections (default: one each, as "
                         "the daemons); a small machine can then drive more of them")
    args = ap.parse_args()
    if args.sim == "c" and not args.fleet_sim:
        ap.error("--sim c needs --fleet-sim")
    pydir = tempfile.mkdtemp(prefix="strata-scale-py-")
    grpc, pb, pbg = control_stubs(args.proto, pydir)
    sha = fleet_sim.model_sha256(args.model)
    print("load average at start: %.2f %.2f %.2f (%d CPUs; the simulators share them with the coordinator); "
          "simulator: %s" % (os.getloadavg() + (os.cpu_count(), "strata-fleet-sim" if args.sim == "c" else "fleet_sim.py")),
          flush=True)
    print("%6s %6s %7s %9s %9s %9s %7s %12s %11s %9s %9s %8s %8s" % (
        "N", "cpu%", "rss MB", "hb p50ms", "hb p99ms", "hb max", "cold s", "cold hb p99", "misses r/h", "suspects",
        "nodes ms", "sim cpu%", "sim lag"), flush=True)
    for n in [int(x) for x in args.sizes.split(",")]:
        try:
            r = one_c(args, n, grpc, pb, pbg) if args.sim == "c" else one_python(args, n, grpc, pb, pbg, pydir, sha)
        except Exception as e:  # noqa: BLE001 (a size this machine cannot simulate is reported, not fatal)
            print("%6d failed: %r" % (n, e), flush=True)
            continue
        print("%6d %s %s %s %s %s %s %s %5d/%-5d %9d %s %s %s" % (
            n, fmt(r.get("cpu_pct"), "%6.1f"), fmt(r.get("rss_mb"), "%7.1f"), fmt(r.get("hb_p50_ms"), "%9.2f"),
            fmt(r.get("hb_p99_ms"), "%9.2f"), fmt(r.get("hb_max_ms"), "%9.1f"), fmt(r.get("cold_s"), "%7.2f"),
            fmt(r.get("cold_hb_p99_ms"), "%12.2f"), r["reg_misses"], r["hb_misses"],
            r["suspects"] + r["reregisters"], fmt(r.get("nodes_ms"), "%9.1f"), fmt(r.get("sim_cpu_pct"), "%8.1f"),
            fmt(r.get("sim_lag_p99_ms"), "%8.1f")),
            flush=True)
        if r.get("lost_sims"):
            print("       (%d simulator process(es) hung and were killed: their workers are not in the "
                  "figures)" % r["lost_sims"], flush=True)
        if r.get("cold_s") is None:
            print("       (no cold start within --cold-max: %s of %d registered; the window ran anyway)"
                  % (r.get("registered"), n), flush=True)
        print("       " + json.dumps(r), file=sys.stderr, flush=True)
    shutil.rmtree(pydir, ignore_errors=True)


if __name__ == "__main__":
    main()
