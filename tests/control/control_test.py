#!/usr/bin/python3
"""control_test.py — issue 6's acceptance tests for the live control plane: a
real strata-coordinator --live and 3 real strata-worker processes on loopback
that register over gRPC (workers w-a, w-b, w-c; w-c advertises 3 MiB of
memory), driven with stratactl and a python3-grpcio client generated from
proto/control.proto at test time. Every process is started and always stopped
by the test; every wait is bounded.

  control_test.py MODE --coordinator BIN --worker BIN --stratactl BIN
                  --proto control.proto --shared DIR --workdir DIR

MODE
  register   the 3 workers register; automatic placement covers every layer
             exactly once over the 3 nodes; ListNodes / GetPlacement /
             GetStatus from Python; Generate (gRPC stream) and HTTP completions
             equal the reference; bad input (unknown node, overlapping and
             uncovered ranges, too much memory for a node, a malformed message,
             a different model checksum) gets its gRPC error with a clear
             message and leaves the placement unchanged
  move       stratactl placement set moves layers (loading line, epoch + 1);
             generation afterwards equals the reference; placement auto again
  drain      8 concurrent streams; stratactl drain w-b while they run: every
             stream completes with the reference tokens; w-b holds no stage
  failure    SIGSTOP w-c: suspect, then dead within dead_after + 1 heartbeat
             (measured and printed); SIGCONT: it registers again (ready)
  restart    SIGKILL the coordinator under 3 streams (they end with EOF, no
             [DONE]), start it again: same placement (epoch, stages) from the
             state file, workers re-register without loading their stage again
             (their logs: no new "ready in", an "already loaded"), serving
             resumes with reference output
  rejoin     3 times: SIGKILL w-b (it holds a stage) and start it again at once
             on the same data-plane port: it listens on the first try (no
             "Device is busy": the coordinator's connections left the port in
             TIME_WAIT) and registers again; then the old split (SetPlacement)
             or placement auto is a change, not `unchanged` (the restarted
             worker lost its stage): a new epoch loads and completions equal
             the reference

Runs under /usr/bin/python3 (Debian's python3-grpcio imports only there).
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import finish, LiveBase, check, control_stubs, eventually, free_port, reap, sse_events, wait_for  # noqa: E402

HB_MS = 200
DEAD_MS = 1000


class Live(LiveBase):
    def __init__(self, args):
        super().__init__(args, "strata-control-")
        self.ports = {}
        self.nstart = {}
        self.coord = None
        self.ncoord = 0
        self.state = os.path.join(self.tmp, "state.json")

    def start_coordinator(self):
        self.ncoord += 1
        log = open(os.path.join(self.tmp, "coordinator%d.log" % self.ncoord), "w")
        self.coord = subprocess.Popen(
            [self.args.coordinator, "--live", "--config", self.cfg, "--listen",
             "127.0.0.1:%d" % self.http_port, "--grpc-listen", self.grpc_addr, "--state",
             self.state, "--heartbeat-ms", str(HB_MS), "--dead-after-ms", str(DEAD_MS),
             "--min-workers", "3"], stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def start_worker(self, name, memory=None, port=None):
        self.nstart[name] = self.nstart.get(name, 0) + 1
        suffix = "" if self.nstart[name] == 1 else "-%d" % self.nstart[name]
        self.ports[name] = port or free_port()
        log = open(os.path.join(self.tmp, "%s%s.log" % (name, suffix)), "w")
        cmd = [self.args.worker, "--listen", "127.0.0.1:%d" % self.ports[name], "--coordinator",
               self.grpc_addr, "--name", name, "--model", self.model, "--threads", "1"]
        if memory:
            cmd += ["--memory", memory]
        self.workers[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                              env=self.env)

    def start(self):
        self.start_coordinator()
        for n in ("w-a", "w-b"):
            self.start_worker(n)
        self.start_worker("w-c", "3M")
        if not wait_for(lambda: self.stub.GetStatus(pb.GetStatusRequest(), timeout=2).serving, 90, 0.1):
            self.dump()
            raise RuntimeError("the live cluster did not start serving")

    @property
    def stub(self):
        if not hasattr(self, "_stub"):
            self._chan = grpc.insecure_channel(self.grpc_addr)
            self._stub = pbg.ControlStub(self._chan)
        return self._stub

    def ctl(self, *argv, timeout=120):
        p = subprocess.run([self.args.stratactl, "--addr", self.grpc_addr] + list(argv),
                           capture_output=True, text=True, timeout=timeout, env=self.env)
        return p.returncode, p.stdout, p.stderr

    def placement(self):
        return self.stub.GetPlacement(pb.GetPlacementRequest(), timeout=5)

    def nodes(self):
        return {n.name: n for n in self.stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes}

    def complete(self, prompt, n, stream=False, on_chunk=None, ignore_eos=False):
        c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=120)
        try:
            body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "return_token_ids": True}
            if ignore_eos:
                body["ignore_eos"] = True
            if stream:
                body["stream"] = True
            c.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if not stream:
                d = json.loads(r.read())
                return r.status, d["choices"][0].get("token_ids") if r.status == 200 else d
            ids, done = [], False
            for ch in sse_events(r):
                if ch is None:
                    done = True
                    break
                ids += ch["choices"][0].get("token_ids", [])
                if on_chunk:
                    on_chunk(len(ids))
            return (r.status if done else -1), ids
        finally:
            c.close()

    def stop(self):
        procs = list(self.workers.items()) + [("coordinator", self.coord)]
        for _, p in procs:
            if p and p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except OSError:
                    pass
        if self.coord and self.coord.poll() is None:
            self.coord.send_signal(signal.SIGTERM)
        for _, p in self.workers.items():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        rcs = reap([(name, p) for name, p in procs if p])
        if hasattr(self, "_chan"):
            self._chan.close()
        return rcs


def refs(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        return json.load(f)


def covers(pl, n_layers):
    layers = []
    for s in pl.stages:
        layers += list(range(s.first_layer, s.last_layer + 1))
    return layers == list(range(n_layers))


def exact(cl, rs, n=32, label=""):
    out = [None] * len(rs)

    def run(i):
        try:
            out[i] = cl.complete(rs[i]["prompt"], n)
        except Exception as e:  # noqa: BLE001
            out[i] = (0, repr(e))
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(rs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(180)
    good = sum(1 for r, o in zip(rs, out) if o and o[0] == 200 and o[1] == r["completion_tokens"][:n])
    for r, o in zip(rs, out):
        if not (o and o[0] == 200 and o[1] == r["completion_tokens"][:n]):
            print("  %r: %s" % (r["prompt"], str(o)[:300]))
    check(good == len(rs), "%s: %d/%d completions equal the reference" % (label, good, len(rs)))


def stage_str(pl):
    return ",".join("%s:%d-%d" % (s.node, s.first_layer, s.last_layer) for s in pl.stages)


# ---------------------------------------------------------------------- modes

def mode_register(cl, args):
    rs = refs(args)
    nodes = cl.nodes()
    check(sorted(nodes) == ["w-a", "w-b", "w-c"], "3 nodes registered: %s" % sorted(nodes))
    check(wait_for(lambda: all(n.state == pb.NODE_STATE_READY for n in cl.nodes().values()), 10),
          "every node READY")
    n = cl.nodes()["w-a"]
    check(n.devices and n.devices[0].kind == "cpu" and n.devices[0].count >= 1 and
          n.host_memory_bytes > (1 << 20) and n.numa_nodes >= 1 and n.data_address.startswith("127.0.0.1:")
          and n.lease_id != 0 and n.heartbeat_age_s < 2.0,
          "w-a: cpu devices, host memory, NUMA nodes, data address, lease, heartbeat age %.2f s"
          % n.heartbeat_age_s)
    check(cl.nodes()["w-c"].host_memory_bytes == 3 << 20, "w-c advertises --memory 3M")
    pl = cl.placement()
    cur = pl.current
    print("auto placement: epoch %d %s" % (cur.epoch, stage_str(cur)))
    check(cur.epoch >= 1 and cur.n_layers == 5 and covers(cur, 5),
          "automatic placement covers every layer exactly once")
    check(sorted(s.node for s in cur.stages) == ["w-a", "w-b", "w-c"] and all(s.tp == 1 for s in cur.stages),
          "every worker got a stage (TP 1 on CPU nodes)")
    st = cl.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
    check(st.serving and st.n_layers == 5 and st.placement_epoch == cur.epoch and st.nodes_total == 3,
          "GetStatus: serving, 5 layers, epoch, 3 nodes")
    exact(cl, rs[:4], 32, "auto placement (HTTP)")
    # Generate over gRPC (server streaming)
    ids, fin = [], None
    for ch in cl.stub.Generate(pb.GenerateRequest(prompt=rs[0]["prompt"], max_tokens=24), timeout=60):
        ids += list(ch.token_ids)
        fin = ch.finish_reason or fin
    check(ids == rs[0]["completion_tokens"][:24] and fin == "length",
          "Generate stream equals the reference (%d tokens, %s)" % (len(ids), fin))
    rc, out, err = cl.ctl("--json", "nodes")
    check(rc == 0 and len(json.loads(out)["nodes"]) == 3, "stratactl --json nodes")

    # ---- bad input: an error with a clear message, placement unchanged
    before = stage_str(cl.placement().current), cl.placement().current.epoch

    def bad(call, code, words, label):
        try:
            call()
            check(False, "%s: refused" % label)
        except grpc.RpcError as e:
            ok = e.code() == code and all(w in e.details() for w in words)
            check(ok, "%s: %s %r" % (label, e.code().name, e.details()))
        now = stage_str(cl.placement().current), cl.placement().current.epoch
        check(now == before and not cl.placement().HasField("pending"), "%s: placement unchanged" % label)

    S = pb.Stage
    bad(lambda: cl.stub.SetPlacement(pb.SetPlacementRequest(stages=[S(node="w-zz", first_layer=0, last_layer=4)]),
                                     timeout=5), grpc.StatusCode.NOT_FOUND, ["unknown node", "w-zz"], "unknown node")
    bad(lambda: cl.stub.SetPlacement(pb.SetPlacementRequest(stages=[S(node="w-a", first_layer=0, last_layer=2),
                                                                    S(node="w-b", first_layer=2, last_layer=4)]),
                                     timeout=5), grpc.StatusCode.INVALID_ARGUMENT, ["layer 2", "covered twice"],
        "overlapping ranges")
    bad(lambda: cl.stub.SetPlacement(pb.SetPlacementRequest(stages=[S(node="w-a", first_layer=0, last_layer=1),
                                                                    S(node="w-b", first_layer=2, last_layer=3)]),
                                     timeout=5), grpc.StatusCode.INVALID_ARGUMENT, ["layers 4-4", "not covered"],
        "uncovered ranges")
    bad(lambda: cl.stub.SetPlacement(pb.SetPlacementRequest(stages=[S(node="w-a", first_layer=0, last_layer=0),
                                                                    S(node="w-c", first_layer=1, last_layer=4)]),
                                     timeout=5), grpc.StatusCode.RESOURCE_EXHAUSTED, ["w-c", "short by"],
        "too much memory for w-c")
    raw = cl._chan.unary_unary("/strata.v1.Control/SetPlacement", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    bad(lambda: raw(b"\x0a\xff\xff\xff\x0f\x01", timeout=5), grpc.StatusCode.INVALID_ARGUMENT,
        ["malformed"], "malformed SetPlacementRequest")
    badmodel = pb.RegisterRequest(node="w-evil", data_address="127.0.0.1:1",
                                  devices=[pb.Device(kind="cpu", count=1, memory_bytes=1 << 30)],
                                  host_memory_bytes=1 << 30,
                                  models=[pb.ModelFile(name="stories260K.gguf", size_bytes=1, sha256="ab" * 32)])
    bad(lambda: cl.stub.Register(badmodel, timeout=5), grpc.StatusCode.FAILED_PRECONDITION,
        ["w-evil", "sha256", "different"], "different model checksum")
    check("w-evil" not in cl.nodes(), "the refused worker is not in the registry")
    rc, out, err = cl.ctl("placement", "set", "--stages", "w-a:0-1,w-zz:2-4")
    check(rc == 1 and "unknown node" in err, "stratactl placement set with an unknown node: exit 1, %r" % err.strip())

    # ---- a GPU node's devices and link matrix (issue 13): kept, listed, printed
    import hashlib
    with open(cl.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    model = pb.ModelFile(name=os.path.basename(cl.model), size_bytes=os.path.getsize(cl.model), sha256=sha)

    def gpu_node(name, rows, nic_rows, nics=("mlx5_0",)):
        gpus = [pb.Gpu(name="NVIDIA H100 80GB HBM3", memory_bytes=80 << 30, pci_bus_id="0000:%02x:00.0" % (0x17 + i),
                       links=rows[i], nic_links=nic_rows[i], numa_node=i) for i in range(len(rows))]
        return pb.RegisterRequest(node=name, data_address="127.0.0.1:1", host_memory_bytes=1 << 40,
                                  devices=[pb.Device(kind="cuda", count=len(rows), memory_bytes=80 << 30, gpus=gpus)],
                                  models=[model], tp_limit=2, nics=list(nics),
                                  link_summary="2 GPU, TP<=2 (2 of 2 GPUs NVLinked (NV18 or more)); 1 NIC, nearest PIX..SYS")

    good = gpu_node("w-gpu", [["X", "NV18"], ["NV18", "X"]], [["PIX"], ["SYS"]])
    check(cl.stub.Register(good, timeout=5).lease_id != 0, "a GPU node with its link matrix registers")
    g = cl.nodes()["w-gpu"]
    d = g.devices[0]
    check(d.kind == "cuda" and len(d.gpus) == 2 and list(d.gpus[1].links) == ["NV18", "X"] and
          list(d.gpus[1].nic_links) == ["SYS"] and d.gpus[1].numa_node == 1 and list(g.nics) == ["mlx5_0"] and
          g.tp_limit == 2, "ListNodes: the GPUs' links, NIC distances and NUMA nodes as registered")
    rc, out, err = cl.ctl("nodes")
    lines = [l.split() for l in out.splitlines()]
    check(rc == 0 and "  gpu 1: NVIDIA H100 80GB HBM3, 80.0 GiB, 0000:18:00.0, NUMA 1" in out.splitlines() and
          ["topo", "GPU0", "GPU1", "mlx5_0"] in lines and ["GPU0", "X", "NV18", "PIX"] in lines and
          ["GPU1", "NV18", "X", "SYS"] in lines and not any(l.endswith(" ") for l in out.splitlines()),
          "stratactl nodes: GPUs, links and the matrix:\n%s" % out)
    for label, req, words in [
            ("a short row", gpu_node("w-gpu2", [["X", "NV18"], ["NV18"]], [["PIX"], ["SYS"]]), ["GPU 1: 1 links"]),
            ("X off the diagonal", gpu_node("w-gpu2", [["X", "X"], ["NV18", "X"]], [["PIX"], ["SYS"]]),
             ["GPU 0: link to GPU 1 is 'X'"]),
            ("an unknown class", gpu_node("w-gpu2", [["X", "NV0"], ["NV18", "X"]], [["PIX"], ["SYS"]]),
             ["'NV0'"]),
            ("a NIC column missing", gpu_node("w-gpu2", [["X", "NV18"], ["NV18", "X"]], [["PIX"], []]),
             ["0 NIC links, want 2 and 1"])]:
        bad(lambda: cl.stub.Register(req, timeout=5), grpc.StatusCode.INVALID_ARGUMENT, ["w-gpu2"] + words,
            "Register with a malformed link matrix: " + label)
    check("w-gpu2" not in cl.nodes(), "the malformed registrations left no node")


def mode_move(cl, args):
    rs = refs(args)
    e0 = cl.placement().current.epoch
    rc, out, err = cl.ctl("placement", "set", "--stages", "w-c:0-0,w-b:1-1,w-a:2-4")
    print(out.strip())
    print("stratactl stderr: %r" % err[-300:])
    # stderr is a pipe here, so stratactl prints one line instead of \r progress frames.
    check(rc == 0 and "loading placement epoch %d\n" % (e0 + 1) in err and "\r" not in err and
          "placement epoch %d is serving" % (e0 + 1) in err,
          "placement set: exit 0, the loading and serving lines (no progress frames off a terminal)")
    cur = cl.placement().current
    check(cur.epoch == e0 + 1 and stage_str(cur) == "w-c:0-0,w-b:1-1,w-a:2-4",
          "the layers moved: epoch %d %s" % (cur.epoch, stage_str(cur)))
    exact(cl, rs, 32, "after placement set (10 concurrent)")
    rc, out, err = cl.ctl("placement", "set", "--stages", "w-b:0-2,w-a:3-4")
    cur = cl.placement().current
    check(rc == 0 and cur.epoch == e0 + 2 and stage_str(cur) == "w-b:0-2,w-a:3-4", "PP 2 placement: %s" % stage_str(cur))
    exact(cl, rs[:4], 32, "after the second move")
    rc, out, err = cl.ctl("placement", "auto")
    cur = cl.placement().current
    check(rc == 0 and cur.epoch == e0 + 3 and covers(cur, 5) and len(cur.stages) == 3,
          "placement auto again: %s" % stage_str(cur))
    exact(cl, rs[:4], 32, "after placement auto")
    # the same placement again: no new epoch, nothing reloaded
    rc, out, err = cl.ctl("placement", "auto")
    now = cl.placement()
    check(rc == 0 and "unchanged" in out and now.current.epoch == e0 + 3 and not now.HasField("pending")
          and stage_str(now.current) == stage_str(cur),
          "placement auto with nothing to change: exit 0, %r, epoch %d" % (out.splitlines()[-1:], now.current.epoch))
    same = [pb.Stage(node=s.node, first_layer=s.first_layer, last_layer=s.last_layer) for s in cur.stages]
    r = cl.stub.SetPlacement(pb.SetPlacementRequest(stages=same), timeout=5)
    check(r.unchanged and r.current.epoch == e0 + 3 and not r.HasField("pending"),
          "SetPlacement with the current stages: unchanged, epoch %d" % r.current.epoch)
    with open(os.path.join(cl.tmp, "coordinator1.log"), errors="replace") as f:
        loads = [l for l in f if "loading placement epoch" in l]
    check(loads and "epoch %d:" % (e0 + 3) in loads[-1] and not any("epoch %d:" % (e0 + 4) in l for l in loads),
          "no placement loaded for the unchanged requests (last: %r)" % loads[-1:])
    # /metrics: the registry's states, serving = holds a stage of the serving placement
    m = metrics(cl)
    for w in ("w-a", "w-b", "w-c"):
        check('strata_worker_state{worker="%s",state="serving"} 1' % w in m and
              'strata_worker_state{worker="%s",state="ready"} 0' % w in m and
              'strata_worker_state{worker="%s",state="dead"} 0' % w in m,
              "/metrics: %s serving" % w)


def metrics(cl):
    c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=10)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    return body


def mode_drain(cl, args):
    rs = refs(args)
    n_tok = 64
    # The streams run past the reference's 64 tokens (EOS ignored) so that
    # they are still running when the drain's new placement starts serving,
    # however fast the build; only their first 64 tokens are compared.
    n_run = 480
    progress = [0] * 8
    out = [None] * 8

    def run(i):
        try:
            st, ids = cl.complete(rs[i]["prompt"], n_run, stream=True, ignore_eos=True,
                                  on_chunk=lambda k, i=i: progress.__setitem__(i, k))
            out[i] = (st, ids[:n_tok] if isinstance(ids, list) else ids)
        except Exception as e:  # noqa: BLE001
            out[i] = (0, repr(e))
    ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    check(wait_for(lambda: min(progress) >= 2, 60, 0.01), "8 streams running")
    mid = list(progress)
    rc, o, err = cl.ctl("drain", "w-b")
    print("drain at tokens %s: %s %s" % (mid, o.strip(), err.strip()))
    check(rc == 0 and "draining" in o, "stratactl drain w-b: exit 0")
    for t in ts:
        t.join(180)
    good = sum(1 for i in range(8) if out[i] and out[i][0] == 200 and out[i][1] == rs[i]["completion_tokens"][:n_tok])
    for i in range(8):
        if not (out[i] and out[i][0] == 200 and out[i][1] == rs[i]["completion_tokens"][:n_tok]):
            print("  stream %d: %s" % (i, str(out[i])[:300]))
    check(good == 8, "drain under load: %d/8 streams complete with the reference tokens" % good)
    check(wait_for(lambda: not cl.placement().HasField("pending"), 60), "the drain's placement serves")
    cur = cl.placement().current
    check(covers(cur, 5) and "w-b" not in [s.node for s in cur.stages],
          "w-b holds no stage: %s" % stage_str(cur))
    check(cl.nodes()["w-b"].state == pb.NODE_STATE_DRAINING, "w-b is DRAINING")

    def moved_lines():
        with open(os.path.join(cl.tmp, "coordinator1.log"), errors="replace") as f:
            return [l for l in f if "sequence(s) moved" in l]
    moved = eventually(moved_lines)
    print("".join(moved).strip())
    check(moved and " 0 running sequence" not in moved[-1],
          "running sequences moved to the new placement (re-prefill), none dropped")
    exact(cl, rs[:4], 32, "after the drain")
    e1 = cl.placement().current.epoch
    rc, o, err = cl.ctl("placement", "set", "--stages", "w-b:0-4")
    check(rc == 1 and 'node "w-b" (stage 0) is draining' in err and "FAILED_PRECONDITION" in err,
          "placement set on a draining node names the state: %r" % err.strip())
    m = metrics(cl)
    check('strata_worker_state{worker="w-b",state="draining"} 1' in m and
          'strata_worker_state{worker="w-b",state="serving"} 0' in m and
          'strata_worker_state{worker="w-a",state="serving"} 1' in m,
          "/metrics: w-b draining, w-a serving")
    # drain w-c too: everything moves to w-a; then w-a has nowhere to go
    rc, o, err = cl.ctl("drain", "w-c")
    check(rc == 0 and wait_for(lambda: not cl.placement().HasField("pending"), 60) and
          stage_str(cl.placement().current) == "w-a:0-4", "drain w-c: %s" % stage_str(cl.placement().current))
    e2 = cl.placement().current.epoch
    rc, o, err = cl.ctl("drain", "w-a")
    check(rc == 1 and "no other usable node would be left (w-b, w-c are draining)" in err and
          cl.placement().current.epoch == e2 and cl.nodes()["w-a"].state == pb.NODE_STATE_READY,
          "drain of the last usable node refused: %r" % err.strip())
    # undrain: back to READY, no placement change
    rc, o, err = cl.ctl("undrain", "w-b")
    check(rc == 0 and o.strip() == "w-b: ready (placement epoch %d)" % e2 and
          cl.nodes()["w-b"].state == pb.NODE_STATE_READY and cl.placement().current.epoch == e2 and
          not cl.placement().HasField("pending"), "stratactl undrain w-b: %r" % o.strip())
    rc, o, err = cl.ctl("undrain", "w-b")
    check(rc == 1 and "w-b is ready, not draining" in err, "undrain of a ready node: %r" % err.strip())
    rc, o, err = cl.ctl("undrain", "w-zz")
    check(rc == 1 and "NOT_FOUND" in err and 'unknown node "w-zz"' in err, "undrain of an unknown node: %r" % err.strip())
    check(e2 > e1, "epochs %d -> %d" % (e1, e2))
    rc, o, err = cl.ctl("placement", "set", "--stages", "w-b:0-1,w-a:2-4")
    check(rc == 0 and stage_str(cl.placement().current) == "w-b:0-1,w-a:2-4",
          "the undrained w-b takes a stage again: %s" % stage_str(cl.placement().current))
    exact(cl, rs[:4], 32, "after undrain + placement set")


def mode_failure(cl, args):
    w = cl.workers["w-c"]
    check(wait_for(lambda: cl.nodes()["w-c"].state == pb.NODE_STATE_READY, 10), "w-c ready")
    lease0 = cl.nodes()["w-c"].lease_id
    os.kill(w.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    seen_suspect = None
    dead_at = None
    while time.monotonic() - t0 < 10:
        st = cl.nodes()["w-c"].state
        if st == pb.NODE_STATE_SUSPECT and seen_suspect is None:
            seen_suspect = time.monotonic() - t0
        if st == pb.NODE_STATE_DEAD:
            dead_at = time.monotonic() - t0
            break
        time.sleep(0.01)
    limit = (DEAD_MS + HB_MS) / 1000.0
    print("failure detection: suspect after %s s, dead after %s s (dead_after %d ms + 1 heartbeat %d ms = %.3f s)"
          % ("%.3f" % seen_suspect if seen_suspect is not None else "-",
             "%.3f" % dead_at if dead_at is not None else "-", DEAD_MS, HB_MS, limit))
    check(seen_suspect is not None, "w-c went SUSPECT first")
    check(dead_at is not None and dead_at <= limit, "w-c marked DEAD within the timeout + 1 heartbeat")
    check(cl.nodes()["w-c"].missed_heartbeats >= 3, "missed heartbeats counted")
    os.kill(w.pid, signal.SIGCONT)
    t1 = time.monotonic()
    ok = wait_for(lambda: cl.nodes()["w-c"].state == pb.NODE_STATE_READY, 10)
    n = cl.nodes()["w-c"]
    print("rejoin after SIGCONT: %.3f s" % (time.monotonic() - t1))
    check(ok and n.lease_id != lease0 and n.lease_id != 0, "after SIGCONT w-c registered again (new lease), READY")
    exact(cl, refs(args)[:2], 32, "serving after the rejoin")


def worker_logs(cl):
    """Every worker log's text, by file name."""
    return {f: read_text(os.path.join(cl.tmp, f)) for f in sorted(os.listdir(cl.tmp))
            if f.startswith("w-") and f.endswith(".log")}


def mode_restart(cl, args):
    rs = refs(args)
    rc, out, err = cl.ctl("placement", "set", "--stages", "w-b:0-1,w-a:2-3,w-c:4-4")
    check(rc == 0, "a non-default placement before the restart")
    pl0 = cl.placement().current
    check(os.path.exists(cl.state), "state file written")
    logs = worker_logs(cl)
    loads0 = {f: t.count(" ready in ") for f, t in logs.items()}
    again0 = {f: t.count("already loaded") for f, t in logs.items()}
    # Streams in flight die with the process: EOF, no error event, no [DONE].
    lock = threading.Lock()
    progress = [0] * 3
    results = [None] * 3

    def run(i):
        def on_chunk(n):
            with lock:
                progress[i] = n
        try:
            results[i] = cl.complete(rs[i]["prompt"], 200, stream=True, on_chunk=on_chunk, ignore_eos=True)
        except Exception as e:  # noqa: BLE001 - an incomplete read is the expected end
            results[i] = ("exception", repr(e))
    ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    wait_for(lambda: min(progress) >= 10, 60, 0.01)
    cl.coord.kill()
    cl.coord.wait()
    for t in ts:
        t.join(60)
    print("coordinator SIGKILLed at epoch %d %s with streams at %s tokens; they ended: %s"
          % (pl0.epoch, stage_str(pl0), progress, [r[0] for r in results]))
    check(all(r is not None and r[0] in (-1, "exception") for r in results),
          "in-flight streams end without [DONE] when the coordinator dies (EOF)")
    check(all(isinstance(r[1], list) and r[1] == rs[i]["completion_tokens"][:len(r[1])] for i, r in enumerate(results)
              if r and r[0] == -1), "what they got before the EOF is the reference's beginning")
    t0 = time.monotonic()
    cl.start_coordinator()
    ok = wait_for(lambda: cl.stub.GetStatus(pb.GetStatusRequest(), timeout=2).serving, 60, 0.1)
    print("serving again %.2f s after the restart" % (time.monotonic() - t0))
    check(bool(ok), "the restarted coordinator serves without a manual step")
    pl1 = cl.placement().current
    check(pl1.epoch == pl0.epoch and stage_str(pl1) == stage_str(pl0),
          "same placement after the restart: epoch %d %s" % (pl1.epoch, stage_str(pl1)))
    check(sorted(cl.nodes()) == ["w-a", "w-b", "w-c"], "every worker re-registered")
    exact(cl, rs[:6], 32, "after the coordinator restart")
    logs = worker_logs(cl)
    loads1 = {f: t.count(" ready in ") for f, t in logs.items()}
    print("stage loads per worker log before/after the restart: %s / %s" % (loads0, loads1))
    check(loads1 == loads0, "no worker loaded a stage again after the coordinator restart")
    check(eventually(lambda: all(t.count("already loaded") > again0[f] for f, t in worker_logs(cl).items())),
          "every worker answered the restored assignment with 'already loaded' (after the restart)")


def time_wait_on(port):
    """Sockets on local port `port` in TIME_WAIT or FIN_WAIT2 (/proc/net/tcp): what
    makes a bind without SO_REUSEADDR fail."""
    n = 0
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(f) as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] in ("06", "05"):
                        n += 1
        except OSError:
            pass
    return n


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def replace_until_accepted(call, what):
    """call() until the coordinator accepts it: a placement change still loading
    (FAILED_PRECONDITION "try again") is waited out, anything else is returned."""
    deadline = time.monotonic() + 90
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION or "try again" not in e.details() or \
                    time.monotonic() > deadline:
                raise
            print("%s: %s; retrying" % (what, e.details()))
            time.sleep(0.2)


def mode_rejoin(cl, args):
    rs = refs(args)
    pl0 = cl.placement().current
    old = [pb.Stage(node=s.node, first_layer=s.first_layer, last_layer=s.last_layer) for s in pl0.stages]
    check("w-b" in [s.node for s in pl0.stages], "w-b holds a stage: %s" % stage_str(pl0))
    exact(cl, rs[:2], 16, "before the kills")
    port = cl.ports["w-b"]
    stale_changes = 0
    for rep in range(1, 4):
        before = cl.placement().current
        lease0 = cl.nodes()["w-b"].lease_id
        w = cl.workers["w-b"]
        w.kill()
        w.wait()
        tw = time_wait_on(port)
        cl.start_worker("w-b", port=port)
        log = os.path.join(cl.tmp, "w-b-%d.log" % cl.nstart["w-b"])
        p = cl.workers["w-b"]
        wait_for(lambda: "strata-worker: listening on" in read_text(log) or p.poll() is not None, 60)
        text = read_text(log)
        print("restart %d: %d socket(s) on port %d in TIME_WAIT/FIN_WAIT2 at the restart; %s" %
              (rep, tw, port, [l for l in text.splitlines() if "listening on" in l or "error" in l][:2]))
        check(p.poll() is None and "strata-worker: listening on 127.0.0.1:%d" % port in text and
              "Device is busy" not in text, "restart %d: w-b listens on port %d on the first try" % (rep, port))
        ok = wait_for(lambda: cl.nodes()["w-b"].lease_id not in (0, lease0) and
                      cl.nodes()["w-b"].state in (pb.NODE_STATE_REGISTERED, pb.NODE_STATE_READY), 60)
        check(bool(ok), "restart %d: w-b registered again (new lease, %s)" %
              (rep, pb.NodeState.Name(cl.nodes()["w-b"].state)))
        # The re-placement: the old split (SetPlacement), or AutoPlacement
        # (which computes the same split). `stale`: the epoch of the kill still
        # is the current one (no recovery re-placed it meanwhile), so the same
        # stages must be a change now, not `unchanged`.
        if rep == 2:
            what = "AutoPlacement"
            r = replace_until_accepted(lambda: cl.stub.AutoPlacement(pb.AutoPlacementRequest(), timeout=10), what)
        else:
            what = "SetPlacement with the old split %s" % stage_str(pl0)
            r = replace_until_accepted(lambda: cl.stub.SetPlacement(pb.SetPlacementRequest(stages=old), timeout=10),
                                       what)
        stale = r.current.epoch == before.epoch
        stale_changes += stale and not r.unchanged
        check(not (r.unchanged and stale),
              "restart %d: %s onto the restarted w-b is not refused as unchanged (epoch %d -> %s%s)" %
              (rep, what, before.epoch, r.pending.epoch if r.HasField("pending") else r.current.epoch,
               (", unchanged" + ("" if stale else ": a recovery had re-placed it already")) if r.unchanged else ""))
        target = r.pending.epoch if r.HasField("pending") else r.current.epoch
        ok = wait_for(lambda: not cl.placement().HasField("pending") and cl.placement().current.epoch >= target and
                      cl.stub.GetStatus(pb.GetStatusRequest(), timeout=5).serving, 120, 0.1)
        cur = cl.placement().current
        check(bool(ok) and cur.epoch > before.epoch and stage_str(cur) == stage_str(pl0),
              "restart %d: the old split serves again on the restarted w-b: epoch %d %s" %
              (rep, cur.epoch, stage_str(cur)))
        exact(cl, rs[:4], 32, "restart %d: after the re-placement" % rep)
    # a placement that really is unchanged still is
    r = cl.stub.SetPlacement(pb.SetPlacementRequest(stages=old), timeout=10)
    check(r.unchanged and not r.HasField("pending"), "the same split once more: unchanged (epoch %d)" % r.current.epoch)

    def why_lines():
        with open(os.path.join(cl.tmp, "coordinator1.log"), errors="replace") as f:
            return [l.strip() for l in f if "registered again since" in l]
    eventually(lambda: len(why_lines()) >= stale_changes)
    why = why_lines()
    print("\n".join(why[:3]))
    check(len(why) >= stale_changes,
          "the coordinator logs why the same stages were a change (%d line(s), %d such re-placement(s))" %
          (len(why), stale_changes))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["register", "move", "drain", "failure", "restart", "rejoin"])
    for a in ("coordinator", "worker", "stratactl", "proto", "shared", "workdir"):
        ap.add_argument("--" + a, required=True)
    args = ap.parse_args()
    wd = os.path.join(args.workdir, "pygen-" + args.mode)
    global grpc, pb, pbg
    grpc, pb, pbg = control_stubs(args.proto, wd)
    cl = Live(args)
    t0 = time.monotonic()
    try:
        cl.start()
        print("cluster serving after %.2f s" % (time.monotonic() - t0))
        globals()["mode_" + args.mode](cl, args)
    except Exception as e:  # noqa: BLE001
        check(False, "exception: %r" % e)
    return finish(cl)


if __name__ == "__main__":
    sys.exit(main())
