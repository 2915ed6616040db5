#!/usr/bin/python3
"""fleet_test.py — issue 18: the control plane at fleet scale, with simulated
workers (fleet_sim.py: real gRPC Register + Heartbeat) against a real
strata-coordinator --live on loopback.

  scale    --min-workers 100: 99 usable nodes do not place; the 100th does
           (the automatic placement takes the first n_layers nodes in name
           order); ListNodes and /metrics list all 100 workers (no 64 cap).
  journal  SIGKILL at random points of registration bursts: every
           acknowledged registration is known after the restart; a torn
           journal tail is logged and cut off.
  restart  1,000 registered nodes, the coordinator SIGKILLed and restarted:
           no live node is declared dead or suspect.
  remove   stratactl node remove; the removed node registers again as new;
           --dead-node-expiry removes a dead node; both survive a restart.
  fdlimit  the coordinator under an open-file hard limit of 256 and 300
           simulated workers: the limit is reported at start and when the
           live nodes reach it; the coordinator keeps serving, and exits 0.
  sim      bench's C load generator strata-fleet-sim (bench/fleet_sim.c)
           with 200 workers: one connection each, all registered and ready
           in ListNodes with their load reports, every heartbeat sent
           answered, no suspect; with --preconnect the connections come
           first; its bad input and a too-low open-file limit get clear
           errors.

Runs under /usr/bin/python3 (python3-grpcio).
"""
import argparse
import asyncio
import http.client
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import FAILS, LiveBase, check, control_stubs, eventually, reap, wait_for  # noqa: E402
import fleet_sim  # noqa: E402


class Coord(LiveBase):
    def __init__(self, args, extra, nofile=None):
        super().__init__(args, "strata-fleet-")
        self.state = os.path.join(self.tmp, "state.json")
        self.extra = extra
        self.nofile = nofile
        self.n = 0
        self.start()
        self.chan = grpc.insecure_channel(self.grpc_addr)
        self.stub = pbg.ControlStub(self.chan)

    def start(self):
        self.n += 1
        self.log = os.path.join(self.tmp, "coordinator%d.log" % self.n)
        self.proc = subprocess.Popen(
            [self.args.coordinator, "--live", "--config", self.cfg, "--listen", "127.0.0.1:%d" % self.http_port,
             "--grpc-listen", self.grpc_addr, "--state", self.state] + self.extra,
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=self.env,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile)))
            if self.nofile else None)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def up(self):
        return wait_for(lambda: self.stub.GetStatus(pb.GetStatusRequest(), timeout=2) is not None, 60, 0.1)

    def nodes(self):
        return self.stub.ListNodes(pb.ListNodesRequest(), timeout=10).nodes

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
        c.close()
        return body

    def stop(self):
        self.chan.close()
        if self.proc.poll() is None:
            self.proc.terminate()
        return reap([("coordinator", self.proc)]).get("coordinator")


class SimThread:
    """A Fleet run on the one asyncio loop of this process (a thread):
    grpc.aio misbehaves with several loops in several threads."""
    loop = None

    def __init__(self, fleet, ramp_s=0.0):
        if SimThread.loop is None:
            SimThread.loop = asyncio.new_event_loop()
            threading.Thread(target=SimThread.loop.run_forever, daemon=True).start()
        self.fleet = fleet
        self.fut = asyncio.run_coroutine_threadsafe(fleet.run(ramp_s=ramp_s), SimThread.loop)

    def stop(self):
        self.fleet.stop()
        try:
            self.fut.result(30)
        except Exception as e:  # noqa: BLE001 (a simulator failure is reported, not raised)
            print("simulator: %r" % e)


def finish(co, sims):
    """Every mode's teardown: stop the simulators, then the coordinator
    (SIGTERM, exit 0 checked); on failure, the tail of its log."""
    for s_ in sims:
        if s_:
            s_.stop()
    rc = co.stop()
    check(rc == 0, "the coordinator exits 0 on SIGTERM (%s)" % rc)
    if FAILS:
        print("---- %s (last 30 lines)\n" % co.log + "".join(co.log_text().splitlines(True)[-30:]))


def mode_scale(args):
    co = Coord(args, ["--heartbeat-ms", "1000", "--dead-after-ms", "10000", "--min-workers", "100"])
    sims = []
    try:
        check(wait_for(lambda: co.stub.GetStatus(pb.GetStatusRequest(), timeout=2) is not None, 60, 0.1),
              "coordinator answers GetStatus")
        sha = fleet_sim.model_sha256(co.model)
        a = SimThread(fleet_sim.Fleet(grpc, pb, pbg, co.grpc_addr, co.model, 99, prefix="sim", sha=sha))
        sims.append(a)
        check(wait_for(lambda: len(co.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes) == 99, 60, 0.2),
              "ListNodes lists the 99 simulated workers")
        time.sleep(2.5)  # several ticks of the placement loop
        pl = co.stub.GetPlacement(pb.GetPlacementRequest(), timeout=5)
        check(pl.current.epoch == 0 and pl.pending.epoch == 0 and not len(pl.current.stages),
              "99 usable nodes with --min-workers 100: no placement yet")
        b = SimThread(fleet_sim.Fleet(grpc, pb, pbg, co.grpc_addr, co.model, 1, prefix="sim", sha=sha, first=99))
        sims.append(b)

        def placed():
            r = co.stub.GetPlacement(pb.GetPlacementRequest(), timeout=5)
            p = r.pending if r.HasField("pending") else r.current
            return p if p.epoch >= 1 and len(p.stages) else None
        p = wait_for(placed, 30, 0.1)
        check(p is not None and p.epoch >= 1, "the 100th usable node triggers the automatic placement")
        if p is not None:
            L = p.n_layers
            want = ["sim-%05d" % i for i in range(min(L, 100))]
            check([s.node for s in p.stages] == want,
                  "the placement takes the first %d nodes in name order: %s" % (len(want), [s.node for s in p.stages]))
            check(p.stages[0].first_layer == 0 and p.stages[-1].last_layer == L - 1 and
                  all(p.stages[i].first_layer == p.stages[i - 1].last_layer + 1
                                                  for i in range(1, len(p.stages))),
                  "the stages cover layers 0..%d contiguously" % (L - 1))
        nodes = co.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes
        check(len(nodes) == 100 and sorted(n.name for n in nodes) == ["sim-%05d" % i for i in range(100)],
              "ListNodes lists all 100 nodes (%d)" % len(nodes))
        # Heartbeats are answered on the rpc thread and applied by the loop
        # (coordinator/control/hb_inbox.h): ListNodes sees every one applied.
        ready = [n.name for n in nodes if n.state == pb.NODE_STATE_READY]
        check(len(ready) == 100, "all 100 nodes are ready: their heartbeats were applied (%d ready)" % len(ready))
        body = co.metrics()
        workers = set(re.findall(r'^strata_worker_state\{worker="([^"]+)",state="[a-z]+"\}', body, re.M))
        ages = re.findall(r'^strata_worker_heartbeat_age_seconds\{worker="sim-\d+"\}', body, re.M)
        check(len(workers) == 100, "/metrics has strata_worker_state series for 100 workers (%d)" % len(workers))
        check(len(ages) == 100, "/metrics has 100 strata_worker_heartbeat_age_seconds series (%d)" % len(ages))
        f = a.fleet
        check(f.errors == 0 and f.reregisters == 0, "no simulated worker got an error or lost its lease (%d, %d; %s)"
              % (f.errors, f.reregisters, f.first_error))
    finally:
        finish(co, sims)


def mode_journal(args):
    """SIGKILL during bursts of registrations at random points: after each
    restart every acknowledged registration is known (journal replay). Then a
    torn tail (the file cut mid-record) is skipped with a log line."""
    import random
    rnd = random.Random(int(os.environ.get("FLEET_SEED", "18")))
    co = Coord(args, ["--heartbeat-ms", "1000", "--dead-after-ms", "10000", "--min-workers", "100000"])
    sims = []
    try:
        check(co.up(), "coordinator answers GetStatus")
        sha = fleet_sim.model_sha256(co.model)
        acked_all = set()
        for rnd_i in range(3):
            f = fleet_sim.Fleet(grpc, pb, pbg, co.grpc_addr, co.model, 300, prefix="r%d" % rnd_i, sha=sha)
            sim = SimThread(f, ramp_s=1.5)
            sims.append(sim)
            wait_for(lambda: len(f.acked) >= 5, 30, 0.02)  # a loaded machine is slow to connect 300 workers
            time.sleep(rnd.uniform(0.0, 1.2))
            co.kill()
            acked = set(f.acked)
            sim.stop()
            acked_all |= acked
            co.start()
            check(co.up(), "round %d: the coordinator restarts after SIGKILL" % rnd_i)
            known = {n.name for n in co.nodes()}
            missing = sorted(acked_all - known)
            check(len(acked) > 0 and not missing,
                  "round %d: SIGKILL after %d acknowledged registrations: all %d so far known after the restart "
                  "(%d known; missing %s)" % (rnd_i, len(acked), len(acked_all), len(known), missing[:5]))
        # a clean baseline: every record whole, then the tail torn
        co.kill()
        jpath = co.state + ".journal"
        size = os.path.getsize(jpath)
        check(size > 0, "the journal holds the registrations since the snapshot (%d bytes)" % size)
        known_before = len(acked_all)
        with open(jpath, "r+b") as fh:
            fh.truncate(size - 7)  # mid-record: the last record's payload is cut
        co.start()
        check(co.up(), "the coordinator starts over a torn journal")
        text = co.log_text()
        m = re.search(r"journal \S+: torn record at byte (\d+) \(the file ends inside a record\); (\d+) byte\(s\) dropped",
                      text)
        check(m is not None, "the torn tail is logged: %s" % (m.group(0) if m else text[-400:]))
        known = {n.name for n in co.nodes()}
        check(len(acked_all - known) <= 1, "all but the torn record are replayed (%d of %d known)"
              % (len(acked_all & known), known_before))
        check(os.path.getsize(jpath) == int(m.group(1)) if m else False,
              "the torn tail is cut off (the journal ends at the last whole record)")
    finally:
        finish(co, sims)


def mode_restart(args):
    """A coordinator with 1,000 registered nodes restarts (SIGKILL): none of
    the live (still heartbeating) workers is declared dead or suspect; all are
    ready again through reregister."""
    N = int(os.environ.get("FLEET_RESTART_N", "1000"))
    co = Coord(args, ["--heartbeat-ms", "1000", "--dead-after-ms", "5000", "--min-workers", "100000"])
    sim = None
    try:
        check(co.up(), "coordinator answers GetStatus")
        # grpc's shared connections: one Python process cannot keep 1,000
        # connections at 1 Hz on a loaded 2-core machine, and the store's
        # replay and the heartbeats through the restart are what is tested
        # (control_fleet_scale/journal/remove/fdlimit use a connection each).
        f = fleet_sim.Fleet(grpc, pb, pbg, co.grpc_addr, co.model, N, prefix="n", deadline_s=5.0,
                            shared_connections=True)
        sim = SimThread(f, ramp_s=2.0)

        def ready():
            return sum(1 for n in co.nodes() if n.state == pb.NODE_STATE_READY)
        check(wait_for(lambda: ready() == N, 90, 0.5), "all %d simulated nodes are ready (%d)" % (N, ready()))
        co.kill()
        t0 = time.monotonic()
        co.start()
        check(co.up(), "the coordinator restarts after SIGKILL")
        known = co.nodes()
        check(len(known) == N, "the restarted coordinator knows all %d nodes from its store (%d)" % (N, len(known)))
        ok = wait_for(lambda: ready() == N, 60, 0.5)
        check(ok, "all %d nodes are ready again %.1f s after the restart (%d)" % (N, time.monotonic() - t0, ready()))
        time.sleep(6)  # past --dead-after-ms: a node the restart lost track of would be dead by now
        text = co.log_text()
        dead = re.findall(r"registry: (\S+) is dead", text)
        suspect = re.findall(r"registry: (\S+) is suspect", text)
        check(not dead and not suspect, "no live node declared dead (%d) or suspect (%d) after the restart: %s"
              % (len(dead), len(suspect), (dead + suspect)[:5]))
        check(ready() == N, "all %d still ready" % N)
    finally:
        finish(co, [sim])


def mode_remove(args):
    """stratactl node remove frees a record; the removed node (still running)
    registers again as a new node; unknown -> NOT_FOUND; a dead node expires
    after --dead-node-expiry."""
    co = Coord(args, ["--heartbeat-ms", "500", "--dead-after-ms", "1500", "--min-workers", "100000",
                      "--dead-node-expiry", "2"])
    sims = []
    try:
        check(co.up(), "coordinator answers GetStatus")
        sha = fleet_sim.model_sha256(co.model)
        a = SimThread(fleet_sim.Fleet(grpc, pb, pbg, co.grpc_addr, co.model, 3, prefix="a", sha=sha, hb_s=0.5))
        gone = SimThread(fleet_sim.Fleet(grpc, pb, pbg, co.grpc_addr, co.model, 1, prefix="z", sha=sha, hb_s=0.5))
        sims += [a, gone]
        check(wait_for(lambda: len(co.nodes()) == 4, 30, 0.1), "4 nodes registered")

        def ctl(*argv):
            p = subprocess.run([args.stratactl, "--addr", co.grpc_addr] + list(argv), capture_output=True,
                               text=True, timeout=30)
            return p.returncode, (p.stdout + p.stderr).strip()
        check(wait_for(lambda: sum(n.state == pb.NODE_STATE_READY for n in co.nodes()) == 4, 30, 0.1),
              "all 4 are ready")
        rc, out = ctl("node", "remove", "a-00001")
        check(rc == 0 and "a-00001: removed (it was ready)" in out, "stratactl node remove a-00001: %d %r" % (rc, out))
        # it is still running: its next heartbeat gets reregister, and it comes back new
        check(wait_for(lambda: "a-00001" in {n.name for n in co.nodes()}, 10, 0.1),
              "the removed node, still running, registers again")
        # the registry logs the new registration beside (not before) the change ListNodes shows
        eventually(lambda: re.search(r"registry: a-00001 registered: ", co.log_text()))
        text = co.log_text()
        check("node a-00001 removed by the operator (it was ready)" in text, "the removal is logged")
        check(re.search(r"registry: a-00001 registered: ", text) and
              not re.search(r"registry: a-00001 registered again", text),
              "it registers as a new node (\"registered\", not \"registered again\")")
        check(a.fleet.reregisters >= 1, "the removed node's heartbeat was answered reregister (%d)"
              % a.fleet.reregisters)
        rc, out = ctl("node", "remove", "no-such-node")
        check(rc == 1 and "NOT_FOUND" in out and "no-such-node" in out, "unknown node: %d %r" % (rc, out))
        rc, out = ctl("node", "frobnicate", "x")
        check(rc == 2, "stratactl node with a bad subcommand: usage error %d %r" % (rc, out))
        # expiry: z-00000 stops; dead after 1.5 s; removed 2 s later
        gone.stop()
        t0 = time.monotonic()
        check(wait_for(lambda: "z-00000" not in {n.name for n in co.nodes()}, 20, 0.1),
              "the stopped node expires (%.1f s after it stopped; dead after 1.5 s + expiry 2 s)"
              % (time.monotonic() - t0))
        check(time.monotonic() - t0 >= 3.0, "not before dead-after + expiry (%.1f s)" % (time.monotonic() - t0))
        check(eventually(lambda: "z-00000 expired: dead for" in co.log_text()), "the expiry is logged")
        # both survive a restart: the journal holds the removal
        co.kill()
        for s_ in sims:
            s_.stop()
        co.extra = [x for x in co.extra if x not in ("--dead-node-expiry", "2")]  # keep what the store holds
        co.start()
        check(co.up(), "restart")
        names = sorted(n.name for n in co.nodes())
        check(names == ["a-00000", "a-00001", "a-00002"], "after a restart (SIGKILL): the store has a-00001 again and not the expired z-00000 (%s)" % names)
    finally:
        finish(co, sims)


def mode_fdlimit(args):
    """The open-file limit is the one real limit on the fleet's size (one
    gRPC connection per worker): under a hard limit of 256 it is reported at
    start, and again once the live nodes reach it; the workers past it cannot
    connect, and the coordinator keeps serving the connections it has."""
    L = 256
    co = Coord(args, ["--heartbeat-ms", "1000", "--dead-after-ms", "10000", "--min-workers", "100000"], nofile=L)
    sim = None
    try:
        check(co.up(), "coordinator answers GetStatus (its connection is made before the fleet's)")
        text = co.log_text()
        check("the open-file limit is %d (hard limit %d)" % (L, L) in text,
              "the low limit is reported at start: %s" % text[-300:])
        f = fleet_sim.Fleet(grpc, pb, pbg, co.grpc_addr, co.model, 300, prefix="f", deadline_s=5.0)
        sim = SimThread(f, ramp_s=2.0)
        full = "of the open-file limit %d: workers past it cannot connect (EMFILE)" % L
        check(wait_for(lambda: full in co.log_text(), 60, 0.2),
              "reaching the limit is logged as an error: %s" % co.log_text()[-400:])
        text = co.log_text()
        check(re.search(r"live nodes: close to the open-file limit %d" % L, text) is not None,
              "coming near it was logged first")
        seen = []

        def settled():  # registrations stop once the descriptors are gone
            seen.append(len(co.nodes()))
            return len(seen) >= 8 and seen[-1] == seen[-8]
        check(wait_for(settled, 60, 0.5), "the registrations stop (%s)" % seen[-8:])
        n = seen[-1]
        check(L - 64 <= n < 300, "the nodes that found a descriptor registered, the others did not (%d of 300)" % n)
        check(co.proc.poll() is None, "the coordinator is still running")
        st = co.stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        check(st.nodes_total == n, "and still answers (GetStatus: %d nodes)" % st.nodes_total)
    finally:
        finish(co, [sim])


def mode_sim(args):
    """strata-fleet-sim (the C load generator of bench/control_scale.sh)
    against a real coordinator: its counts are checked against the
    coordinator's own view (ListNodes, its sockets, its log)."""
    N = int(os.environ.get("FLEET_SIM_N", "200"))
    co = Coord(args, ["--heartbeat-ms", "1000", "--dead-after-ms", "10000", "--min-workers", "100000"])
    sim = None
    try:
        check(co.up(), "coordinator answers GetStatus")

        def run(argv, nofile=None):
            return subprocess.run([args.fleet_sim] + argv, capture_output=True, text=True, timeout=60,
                                  preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
                                  if nofile else None)
        base = ["--addr", co.grpc_addr, "--model", co.model]
        for argv, rc, want in [([], 2, "--addr and --model are required"),
                               (base + ["-n", "0"], 2, "-n: expected an integer in [1, 1000000], got '0'"),
                               (base + ["-n", "12x"], 2, "-n: expected an integer in [1, 1000000], got '12x'"),
                               (base + ["--sha", "ABC"], 2, "--sha: 64 lowercase hex digits"),
                               (base + ["--ca", "/x"], 2, "--cert"),
                               (base + ["--bogus"], 2, "unknown or incomplete option '--bogus'"),
                               (["--addr", co.grpc_addr, "--model", "/nonexistent/m.gguf"], 1, "/nonexistent/m.gguf")]:
            p = run(argv)
            check(p.returncode == rc and want in p.stderr and not p.stdout,
                  "strata-fleet-sim %s: exit %d with %r (%d: %s)" % (argv[4:] or argv, rc, want, p.returncode,
                                                                    p.stderr.strip()[-300:]))
        p = run(base + ["-n", "1000"], nofile=256)
        check(p.returncode == 2 and "1000 simulated workers need about 1072 open files" in p.stderr and
              "hard limit 256" in p.stderr,
              "an open-file hard limit below what N needs is refused before any connection (%d: %s)"
              % (p.returncode, p.stderr.strip()[-300:]))
        check(len(co.nodes()) == 0, "the refused runs registered nothing")

        sim = subprocess.Popen([args.fleet_sim] + base + ["-n", str(N), "--settle", "1", "--window", "4",
                                                          "--cold-max", "90", "--load",
                                                          "--coordinator-pid", str(co.proc.pid)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        events = []
        for line in sim.stdout:
            events.append(json.loads(line))
            if events[-1].get("event") == "window":
                break
        check([e.get("event") for e in events] == ["listed", "window"],
              "the simulator reports the cold start, then opens its window: %s" % events)
        if events and events[0].get("event") == "listed":
            check(events[0]["ready"] == N, "all %d listed ready at the cold start (%s)" % (N, events[0]))
        socks = sum(1 for fd in os.listdir("/proc/%d/fd" % co.proc.pid)
                    if os.readlink("/proc/%d/fd/%s" % (co.proc.pid, fd)).startswith("socket:"))
        check(socks >= N, "one connection per simulated worker: the coordinator holds %d sockets for %d workers"
              % (socks, N))
        nodes = [n for n in co.nodes() if n.name.startswith("sim-")]
        check(sorted(n.name for n in nodes) == ["sim-%05d" % i for i in range(N)],
              "ListNodes lists sim-00000..sim-%05d (%d)" % (N - 1, len(nodes)))
        check(all(n.state == pb.NODE_STATE_READY for n in nodes),
              "all ready (%d not)" % sum(n.state != pb.NODE_STATE_READY for n in nodes))
        check(all(n.devices[0].kind == "cpu" and n.devices[0].count >= 1 and n.host_memory_bytes > 0 and
                  n.devices[0].memory_bytes == n.host_memory_bytes // n.devices[0].count for n in nodes),
              "each registered a CPU device as the daemon does (memory per core = host memory / cores)")
        check(all(n.kv_blocks_used + n.kv_blocks_free == 4096 for n in nodes),
              "the heartbeats' load reports arrived (kv blocks used + free = 4096 on every node)")
        out, err = sim.communicate(timeout=120)
        check(sim.returncode == 0, "the simulator exits 0 (%d): %s" % (sim.returncode, err[-500:]))
        r = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        print("strata-fleet-sim: %s" % json.dumps(r))
        check(r.get("n") == N and r.get("registered") == N and r.get("reg_ok") == N,
              "every simulated worker registered once (%s/%s of %d)" % (r.get("registered"), r.get("reg_ok"), N))
        check(r.get("reg_misses") == 0 and r.get("errors") == 0 and r.get("reregisters") == 0,
              "no Register missed its deadline, no error, no lease lost (%s, %s, %s; %s)"
              % (r.get("reg_misses"), r.get("errors"), r.get("reregisters"), r.get("first_error")))
        check(r.get("hb_sent", 0) >= N and r.get("hb_ok") == r.get("hb_sent") and r.get("hb_misses") == 0,
              "every heartbeat sent was answered (%s sent, %s answered, %s missed)"
              % (r.get("hb_sent"), r.get("hb_ok"), r.get("hb_misses")))
        check(r.get("hb_samples", 0) > 0 and r.get("hb_p50_ms") is not None and r.get("cold_s") is not None,
              "the window has heartbeat samples and the cold start a time (%s, %s)"
              % (r.get("hb_samples"), r.get("cold_s")))
        check(r.get("listed") == N and r.get("listed_ready") == N and r.get("listed_suspect") == 0 and
              r.get("listed_dead") == 0, "the final ListNodes: %s of %d ready, %s suspect, %s dead"
              % (r.get("listed_ready"), N, r.get("listed_suspect"), r.get("listed_dead")))
        check(r.get("cpu_pct") is not None and r.get("sim_cpu_pct") is not None,
              "the coordinator's and the simulator's CPU are measured (%s, %s)" % (r.get("cpu_pct"), r.get("sim_cpu_pct")))
        text = co.log_text()
        bad = re.findall(r"registry: (sim-\d+) is (?:suspect|dead)", text)
        check(not bad, "the coordinator declared no simulated worker suspect or dead (%s)" % bad[:5])
        # --preconnect: the connections first, then the registrations
        p = subprocess.run([args.fleet_sim] + base + ["-n", "50", "--prefix", "pc", "--preconnect", "--settle", "0",
                                                      "--window", "1", "--cold-max", "60"],
                           capture_output=True, text=True, timeout=120)
        lines = [json.loads(x) for x in p.stdout.splitlines()]
        check(p.returncode == 0 and [e.get("event") for e in lines][:2] == ["connected", "listed"] and
              lines[0].get("connected") == 50,
              "--preconnect: all 50 connect before the first Register (%d: %s %s)" % (p.returncode, lines[:2],
                                                                                 p.stderr[-300:]))
        r = lines[-1] if lines else {}
        check(r.get("reg_ok") == 50 and r.get("listed_ready") == 50 and r.get("hb_ok") == r.get("hb_sent") and
              r.get("errors") == 0 and r.get("connect_errors") == 0,
              "--preconnect: 50 registered and ready, every heartbeat answered (%s)" % r)
    finally:
        if sim and sim.poll() is None:
            sim.kill()
            sim.wait()
        finish(co, [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["scale", "journal", "restart", "remove", "fdlimit", "sim"])
    ap.add_argument("--fleet-sim", help="bench's strata-fleet-sim (mode sim)")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--stratactl")
    ap.add_argument("--proto", required=True)
    ap.add_argument("--shared", default=os.environ.get("STRATA_SHARED", "/work/shared"))
    ap.add_argument("--workdir", default="/tmp")
    args = ap.parse_args()
    global grpc, pb, pbg
    grpc, pb, pbg = control_stubs(args.proto, os.path.join(args.workdir, "fleet_py_" + args.mode))
    {"scale": mode_scale, "journal": mode_journal, "restart": mode_restart, "remove": mode_remove,
     "fdlimit": mode_fdlimit, "sim": mode_sim}[args.mode](args)
    print("FAILED: %d check(s)" % len(FAILS) if FAILS else "all checks passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
