#!/usr/bin/python3
"""fleet_test.py — issue 18: the control plane at fleet scale, with simulated
workers (fleet_sim.py: real gRPC Register + Heartbeat) against a real
strata-coordinator --live on loopback.

  scale   --min-workers 100: 99 usable nodes do not place; the 100th does
          (the automatic placement takes the first n_layers nodes in name
          order); ListNodes and /metrics list all 100 workers (no 64 cap).

Runs under /usr/bin/python3 (python3-grpcio).
"""
import argparse
import asyncio
import http.client
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import FAILS, LiveBase, check, control_stubs, reap, wait_for  # noqa: E402
import fleet_sim  # noqa: E402


class Coord(LiveBase):
    def __init__(self, args, extra):
        super().__init__(args, "strata-fleet-")
        self.state = os.path.join(self.tmp, "state.json")
        self.log = os.path.join(self.tmp, "coordinator.log")
        self.proc = subprocess.Popen(
            [args.coordinator, "--live", "--config", self.cfg, "--listen", "127.0.0.1:%d" % self.http_port,
             "--grpc-listen", self.grpc_addr, "--state", self.state] + extra,
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=self.env)
        self.chan = grpc.insecure_channel(self.grpc_addr)
        self.stub = pbg.ControlStub(self.chan)

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
    """A Fleet on its own asyncio loop in a thread."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.t = threading.Thread(target=lambda: asyncio.run(fleet.run()), daemon=True)
        self.t.start()

    def stop(self):
        self.fleet.stop()
        self.t.join(30)


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
        body = co.metrics()
        workers = set(re.findall(r'^strata_worker_state\{worker="([^"]+)",state="[a-z]+"\}', body, re.M))
        ages = re.findall(r'^strata_worker_heartbeat_age_seconds\{worker="sim-\d+"\}', body, re.M)
        check(len(workers) == 100, "/metrics has strata_worker_state series for 100 workers (%d)" % len(workers))
        check(len(ages) == 100, "/metrics has 100 strata_worker_heartbeat_age_seconds series (%d)" % len(ages))
        f = a.fleet
        check(f.errors == 0 and f.reregisters == 0, "no simulated worker got an error or lost its lease (%d, %d; %s)"
              % (f.errors, f.reregisters, f.first_error))
    finally:
        for s in sims:
            s.stop()
        rc = co.stop()
        check(rc == 0, "the coordinator exits 0 on SIGTERM (%s)" % rc)
        if FAILS:
            with open(co.log, errors="replace") as fh:
                print("---- coordinator.log (last 30 lines)\n" + "".join(fh.readlines()[-30:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["scale"])
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--proto", required=True)
    ap.add_argument("--shared", default=os.environ.get("STRATA_SHARED", "/work/shared"))
    ap.add_argument("--workdir", default="/tmp")
    args = ap.parse_args()
    global grpc, pb, pbg
    grpc, pb, pbg = control_stubs(args.proto, os.path.join(args.workdir, "fleet_py_" + args.mode))
    {"scale": mode_scale}[args.mode](args)
    print("FAILED: %d check(s)" % len(FAILS) if FAILS else "all checks passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
