#!/usr/bin/python3
"""partition_test.py — issue 12's network partition (docs/recovery.md): live
mode with every worker in its own network namespace (tests/harness.py
NetnsBridge: a veth pair per namespace, bridged in the root namespace, where
the coordinator stays), stories260K, 6 concurrent greedy SSE streams of 200
tokens (no-failure run first, on the same cluster), and the partition of the
worker that holds stage 0 once every stream has some 20 tokens:

  down  the root end of its veth is set down (a cut cable);
  drop  nft in its namespace silently drops every packet through its veth
        (no reset, no carrier change: only the per-micro-batch deadline
        can see it);
  late  as down, but the link heals only after the spare's epoch serves and
        the coordinator closed the old epoch's connections while the cable
        was cut: the StageRelease it sent there is lost, and the returning
        worker must release its old stage by itself (its heartbeat names the
        newer serving epoch, the stage's coordinator connection is gone).

Checks: the coordinator declares the stage lost within the deadline (the
bound its log line names, plus scheduling slack), the spare takes the stage,
every stream ends with [DONE], no error event and the no-failure tokens.
Then the link heals: the returning worker is fenced (its stale
ACTIVATIONS of the old epoch, queued in TCP during the cut, reach the stage
that now holds a newer epoch and are dropped and counted in its
StageStats.fenced_frames; its old stage is released, not used by accident),
new requests are still exact, and it can be re-used deliberately: a
SetPlacement of the original split loads it again as a new epoch and serves
the no-failure tokens.

Exits 77 (ctest skip) without root / CAP_NET_ADMIN, `ip netns` or nft. While the
requests are held, GetStatus and `stratactl status` show the recovery in
progress (state, lost node and stage, since when, sequences held). Every
process is stopped by pid and every namespace, veth and the bridge removed,
also on failure paths.

  partition_test.py MODE --coordinator BIN --worker BIN --stratactl BIN
                    --proto control.proto --shared DIR --workdir DIR
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import (finish, LiveBase, NetnsBridge, check, check_streams, control_stubs, eventually, free_port,  # noqa: E402
                     http_get, insecure_flag, log_time, netns_unavailable, reap, stream_all, wait_for)

N_STREAMS = 6
N_TOK = 200
FAULT_AT = 20
# stories260K: a layer needs 1.17 MiB (weights + KV), each stage 1.42 MiB of
# activations (512 tokens), the last its logits: 7.7 MiB on one node, so two
# nodes hold all 5 layers and one cannot (placement.h's memory model)
WORKER_MEMORY = "6M"
SLACK_S = 3.0  # scheduling slack on top of the deadline (ASan, 2 shared cores)


class NetLive(LiveBase):
    """A live coordinator in the root namespace (gRPC on the bridge address,
    HTTP on loopback) and workers in the namespaces of nb."""

    def __init__(self, args, nb):
        super().__init__(args, "strata-partition-")
        # Each forward 5 ms slower, so the streams are still running when the fault
        # comes at KILL_AT tokens: on an idle machine 200 tokens take only ~0.3 s.
        self.env.setdefault("STRATA_TEST_FORWARD_DELAY_MS", "5")
        self.nb = nb
        self.env.pop("UCX_NET_DEVICES", None)  # the bridge and the veths, not loopback (set per process)
        self.grpc_addr = "%s:%d" % (nb.host_ip, self.grpc_port)
        self.ns_of = {}
        log = open(os.path.join(self.tmp, "coordinator.log"), "w")
        self.coord = subprocess.Popen(
            [args.coordinator, "--live", "--config", self.cfg, "--listen", "127.0.0.1:%d" % self.http_port,
             "--grpc-listen", self.grpc_addr, "--state", os.path.join(self.tmp, "state.json"),
             "--heartbeat-ms", "1000", "--dead-after-ms", "10000", "--min-workers", "2"]
            + insecure_flag(args.coordinator), stdout=log, stderr=subprocess.STDOUT,
            env=dict(self.env, **nb.ucx_devices()))
        self._chan = grpc.insecure_channel(self.grpc_addr)
        self.stub = pbg.ControlStub(self._chan)

    def start_worker(self, name):
        k = self.nb.add()
        self.ns_of[name] = k
        log = open(os.path.join(self.tmp, "%s.log" % name), "w")
        cmd = self.nb.exec_prefix(k) + [
            self.args.worker, "--listen", "%s:%d" % (self.nb.ip(k), free_port()), "--coordinator", self.grpc_addr,
            "--name", name, "--model", self.model, "--threads", "1", "--memory", WORKER_MEMORY] \
            + insecure_flag(self.args.worker)
        # `ip netns exec` execs the worker: this pid is the worker's.
        self.workers[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                              env=dict(self.env, **self.nb.ucx_devices(k)))

    def serving(self):
        return self.stub.GetStatus(pb.GetStatusRequest(), timeout=2).serving

    def placement(self):
        return self.stub.GetPlacement(pb.GetPlacementRequest(), timeout=5)

    def nodes(self):
        return {n.name: n for n in self.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes}

    def log(self, name="coordinator"):
        with open(os.path.join(self.tmp, name + ".log"), errors="replace") as f:
            return f.read()

    def stages(self):
        return json.loads(http_get(self.http_port, "/v1/stages")[1])

    def stop(self):
        procs = list(self.workers.items()) + [("coordinator", self.coord)]
        for n, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        rcs = reap(procs)
        self._chan.close()
        return rcs


def stage_str(pl):
    return ",".join("%s:%d-%d" % (s.node, s.first_layer, s.last_layer) for s in pl.stages)


def metric(cl, name):
    for line in http_get(cl.http_port, "/metrics")[1].splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


def stage_fenced(cl):
    """fenced_frames of each stage of the serving epoch (StageStats, /v1/stages)."""
    return [s.get("fenced_frames", 0) for s in cl.stages().get("stages", [])]


def run(args, mode, cl):
    nb = cl.nb
    cl.start_worker("w-a")
    cl.start_worker("w-b")
    if not check(wait_for(cl.serving, 120, 0.1), "w-a, w-b (each in its namespace) serve"):
        return
    pl0 = cl.placement().current
    addrs = [s.get("address", "") for s in cl.stages().get("stages", [])]
    check(all(a.startswith("10.77.%d." % nb.sub) for a in addrs) and len(addrs) == 2,
          "the stages are at their namespaces' addresses: %s" % addrs)
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        rs = json.load(f)[:N_STREAMS]
    prompts = [r["prompt"] for r in rs]
    out = stream_all(cl.http_port, prompts, N_TOK)
    check(all(o[0] and not o[2] and len(o[1]) == N_TOK for o in out) and
          all(o[1][:64] == r["completion_tokens"][:64] for o, r in zip(out, rs)),
          "no-failure run: %d streams of %d tokens, [DONE], the reference's first 64 tokens" % (N_STREAMS, N_TOK))
    base = [o[1] for o in out]

    victim = pl0.stages[0].node
    k = cl.ns_of[victim]
    cut_off = (lambda: nb.drop(k)) if mode == "drop" else (lambda: nb.down(k))
    heal = (lambda: nb.undrop(k)) if mode == "drop" else (lambda: nb.up(k))
    print("placement before: epoch %d %s; partitioning %s (stage 0, %s) by %s at %d tokens"
          % (pl0.epoch, stage_str(pl0), victim, nb.ns[k], "nft drop" if mode == "drop" else "link down", FAULT_AT),
          flush=True)
    lock = threading.Lock()
    at = []
    cut = threading.Event()

    def on_progress(progress):
        with lock:
            if not at and min(progress) >= FAULT_AT:
                at.append(time.time())
                cut_off()
                at.append(list(progress))
                cut.set()
    res = []
    streams = threading.Thread(target=lambda: res.append(stream_all(cl.http_port, prompts, N_TOK, on_progress)))
    streams.start()
    try:
        if not check(cut.wait(120), "%s partitioned mid-stream" % victim):
            return
        t_fault = at[0]
        print("partitioned %s with the streams at %s tokens" % (victim, at[1]), flush=True)
        # Detection, then a hold: a layer needs 1.17 MiB and no node alone
        # has the memory (--memory), so nothing can serve until a spare comes.
        held = wait_for(lambda: [l for l in cl.log().splitlines() if "lost stage 0 on node %s" % victim in l], 30, 0.05)
        if not check(bool(held), "%s: the coordinator declares stage 0 (%s) lost" % (mode, victim)):
            return
        det = log_time(held[0]) - t_fault
        m = re.search(r"bound ([0-9.]+) s", held[0])
        bound = float(m.group(1)) if m else 2.0
        print(held[0][:300])
        print("detection: %.2f s after the partition (the batch deadline: %.1f s)" % (det, bound), flush=True)
        check(det <= bound + SLACK_S, "%s: detected within the deadline (%.2f s <= %.1f + %.1f s)"
              % (mode, det, bound, SLACK_S))
        check(wait_for(lambda: "cannot re-place yet" in cl.log(), 10, 0.05),
              "%s: no capacity without %s: the requests are held" % (mode, victim))
        check(http_get(cl.http_port, "/health")[0] == 503, "%s: /health 503 while nothing serves" % mode)
        rec = cl.stub.GetStatus(pb.GetStatusRequest(), timeout=5).recovery
        print("GetStatus.recovery: %s" % str(rec).replace("\n", "; "))
        check(rec.state == "placing" and rec.lost_node == victim and rec.lost_stage == 0 and
              rec.lost_epoch == pl0.epoch and rec.held_sequences == N_STREAMS and rec.since_s > 0 and
              "hung" in rec.reason and rec.timeout_s == 60,
              "%s: GetStatus shows the recovery in progress (placing, %s, stage 0, %d held)" % (mode, victim, N_STREAMS))
        p = subprocess.run([args.stratactl, "--addr", cl.grpc_addr, "status"], capture_output=True, text=True,
                           timeout=30, env=cl.env)
        print(p.stdout)
        check(p.returncode == 0 and re.search(r"recovery +placing: stage 0 of epoch %d lost on node %s [0-9.]+ s ago; "
                                              r"%d sequence\(s\) held" % (pl0.epoch, victim, N_STREAMS), p.stdout),
              "%s: stratactl status shows the recovery in progress" % mode)

        if mode == "late":
            # The spare comes while the cable is still cut: its epoch serves,
            # the StageRelease of epoch 1 goes to the cut connection, and the
            # old epoch's connections are closed (w-b, which also held a stage
            # of epoch 1, sees its one close). Only then the link heals.
            cl.start_worker("w-c")

            def old_closed():
                log = cl.log("w-b")
                i = log.find("releasing the stage of epoch %d" % pl0.epoch)
                return i >= 0 and "xport: disconnecting %s:" % nb.host_ip in log[i:]
            check(wait_for(old_closed, 30, 0.05),
                  "late: the old epoch's connections are closed while %s is cut off" % victim)
            heal()
            print("healed %.1f s after the partition, after the switch" % (time.time() - t_fault), flush=True)
        else:
            # Heal while the old epoch is held: the batch that was cut off
            # (queued in TCP) goes through the returning worker and stage 1 and
            # comes back to the coordinator for an epoch that lost a stage: it
            # must be dropped and counted, never delivered to the held requests.
            heal()
            print("healed %.1f s after the partition" % (time.time() - t_fault), flush=True)
            fenced = wait_for(lambda: metric(cl, "strata_fenced_frames_total"), 30, 0.1)
            print("fenced frames (coordinator): %s" % fenced)
            check(bool(fenced) and eventually(lambda: "(epoch lost: fenced)" in cl.log()),
                  "%s: the stale results of epoch %d are dropped and counted (strata_fenced_frames_total %s)"
                  % (mode, pl0.epoch, fenced))
            check(not cl.serving(), "%s: the returning %s is not used by accident (still held)"
                  % (mode, victim))

            # A spare registers: the recovery places the stage on it.
            cl.start_worker("w-c")
    finally:
        streams.join(300)
    out = res[0] if res else [(False, [], ["no result"])] * N_STREAMS
    check_streams(out, base, mode + ": ")
    # the resume's log line may trail the streams' end
    eventually(lambda: "resumed %d request(s)" % N_STREAMS in cl.log())
    steps = [l for l in cl.log().splitlines() if "recovery:" in l]
    print("\n".join(l[:250] for l in steps))
    check(any("resumed %d request(s)" % N_STREAMS in l for l in steps),
          "%s: the held requests resume (log, with their ids)" % mode)
    pl1 = cl.placement().current
    print("placement after: epoch %d %s" % (pl1.epoch, stage_str(pl1)), flush=True)
    check(pl1.epoch > pl0.epoch and victim not in [s.node for s in pl1.stages] and "w-c" in
          [s.node for s in pl1.stages], "%s: a new epoch without %s, on the spare" % (mode, victim))
    check(metric(cl, "strata_recoveries_total") == 1 and metric(cl, "strata_sequences_resumed_total") == N_STREAMS,
          "%s: /metrics counts 1 recovery and %d resumed sequences" % (mode, N_STREAMS))
    # StageRelease over the old connection (when it still carried it), or
    # the worker's own rule (late: always; the release was lost).
    why = ": the coordinator serves epoch %d and the stage's connection is gone" % pl1.epoch if mode == "late" else ""
    released = wait_for(lambda: "releasing the stage of epoch %d (stage 0, layers [0, 3))%s" % (pl0.epoch, why)
                        in cl.log(victim), 30, 0.1)
    check(bool(released), "%s: the returning %s releases its old stage (epoch %d%s) once the new epoch serves"
          % (mode, victim, pl0.epoch, why))
    out = stream_all(cl.http_port, prompts[:2], 48)
    check(all(o[0] and not o[2] and o[1] == b[:48] for o, b in zip(out, base)),
          "%s: after the recovery, new requests equal the no-failure run" % mode)

    # Re-used deliberately: the original split, with the returning worker.
    check(wait_for(lambda: cl.nodes()[victim].state == pb.NODE_STATE_READY, 60, 0.2),
          "%s: %s is ready again after the heal" % (mode, victim))
    S = pb.Stage
    cl.stub.SetPlacement(pb.SetPlacementRequest(stages=[S(node=s.node, first_layer=s.first_layer,
                                                          last_layer=s.last_layer) for s in pl0.stages]), timeout=10)
    ok = wait_for(lambda: (lambda c: c.epoch > pl1.epoch and stage_str(c) == stage_str(pl0))(cl.placement().current)
                  and cl.serving(), 60, 0.2)
    check(bool(ok), "%s: %s is placed again deliberately (SetPlacement %s: a new epoch)" % (mode, victim, stage_str(pl0)))
    out = stream_all(cl.http_port, prompts, 64)
    check(all(o[0] and not o[2] and o[1] == b[:64] for o, b in zip(out, base)),
          "%s: the re-used %s serves the no-failure tokens" % (mode, victim))
    print("fenced frames: coordinator %s, workers' StageStats %s"
          % (metric(cl, "strata_fenced_frames_total"), stage_fenced(cl)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["down", "drop", "late"])
    for a in ("coordinator", "worker", "stratactl", "proto", "shared", "workdir"):
        ap.add_argument("--" + a, required=True)
    args = ap.parse_args()
    why = netns_unavailable()
    if why:
        print("SKIP: %s" % why)
        return 77
    global grpc, pb, pbg
    grpc, pb, pbg = control_stubs(args.proto, os.path.join(args.workdir, "pygen-partition-" + args.mode))
    nb = cl = None
    try:
        nb = NetnsBridge()
        cl = NetLive(args, nb)
        run(args, args.mode, cl)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        check(False, "exception: %r" % e)
    return finish(cl, lambda: nb and check(nb.close(), "the namespaces, veths and bridge are removed"))


if __name__ == "__main__":
    sys.exit(main())
