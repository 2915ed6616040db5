"""test_control_py.py — a standard Python gRPC client against the C server.

Generates control_pb2 / control_pb2_grpc from proto/control.proto at test time
with Debian's grpc tools (python3 -m grpc_tools.protoc; run under
/usr/bin/python3, where python3-grpcio and python3-grpc-tools import), starts
ctl_test_server (rpc/grpc_server + a protobuf-c registry) and calls Register,
Heartbeat, ListNodes, AutoPlacement, GetPlacement and the streaming Generate,
plus the error paths: NOT_FOUND, UNIMPLEMENTED, INVALID_ARGUMENT for garbage
bytes, DEADLINE_EXCEEDED.

usage: /usr/bin/python3 test_control_py.py SERVER_BIN CONTROL_PROTO WORKDIR
"""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rpc_fixture import Checker, TestServer  # noqa: E402


def generate_stubs(proto, workdir):
    if os.path.isdir(workdir):
        shutil.rmtree(workdir)
    os.makedirs(workdir)
    proto_dir = os.path.dirname(os.path.abspath(proto))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", proto_dir,
                    "--python_out", workdir, "--grpc_python_out", workdir,
                    os.path.abspath(proto)], check=True, timeout=60)
    sys.path.insert(0, workdir)


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    server_bin, proto, workdir = sys.argv[1:]
    generate_stubs(proto, workdir)
    import grpc
    import control_pb2 as pb
    import control_pb2_grpc as pbg

    t = Checker()
    with TestServer(server_bin, ["--gen-delay-ms", "2"]) as srv:
        with grpc.insecure_channel(srv.addr) as ch:
            stub = pbg.ControlStub(ch)
            leases = {}
            for name, kind, count in (("node-a", "cuda", 2), ("node-b", "cuda", 1),
                                      ("node-c", "cpu", 1)):
                rep = stub.Register(pb.RegisterRequest(
                    node=name,
                    devices=[pb.Device(kind=kind, count=count, memory_bytes=80 << 30)],
                    host_memory_bytes=256 << 30, numa_nodes=2,
                    data_address="10.0.0.%d:7100" % (len(leases) + 1),
                    models=[pb.ModelFile(name="stories260K.gguf", size_bytes=1185376,
                                         sha256="ab" * 32)]), timeout=5)
                t.check(rep.lease_id != 0, "Register %s lease" % name)
                t.check(rep.heartbeat_interval_ms == 1000, "heartbeat interval")
                leases[name] = rep.lease_id
            t.check(len(set(leases.values())) == 3, "distinct leases")

            hb = stub.Heartbeat(pb.HeartbeatRequest(node="node-b", lease_id=leases["node-b"],
                                                    running_sequences=7, kv_blocks_used=10,
                                                    kv_blocks_free=90, busy_fraction=0.5,
                                                    bytes_sent=4096), timeout=5)
            t.check(not hb.reregister, "heartbeat accepted")

            nodes = stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes
            t.check([n.name for n in nodes] == ["node-a", "node-b", "node-c"],
                    "ListNodes names: %s" % [n.name for n in nodes])
            if len(nodes) == 3:
                t.check(nodes[0].state == pb.NODE_STATE_REGISTERED, "node-a registered")
                t.check(nodes[1].state == pb.NODE_STATE_READY, "node-b ready after heartbeat")
                t.check(nodes[1].running_sequences == 7 and nodes[1].kv_blocks_free == 90,
                        "node-b load")
                t.check(abs(nodes[1].busy_fraction - 0.5) < 1e-12, "busy fraction")
                t.check(nodes[0].devices[0].kind == "cuda" and nodes[0].devices[0].count == 2,
                        "node-a devices")
                t.check(nodes[2].data_address == "10.0.0.3:7100", "data address")
                t.check(0 <= nodes[0].heartbeat_age_s < 5, "heartbeat age")

            auto = stub.AutoPlacement(pb.AutoPlacementRequest(), timeout=5)
            layers = []
            for s in auto.current.stages:
                layers += list(range(s.first_layer, s.last_layer + 1))
            t.check(layers == [0, 1, 2, 3, 4], "auto placement covers every layer once: %s"
                    % layers)
            shown = stub.GetPlacement(pb.GetPlacementRequest(), timeout=5)
            t.check(shown.current == auto.current, "GetPlacement == AutoPlacement result")
            t.check(shown.current.epoch == 1 and len(shown.current.stages) == 3, "epoch/stages")

            # Streaming: 12 chunks, in order.
            chunks = list(stub.Generate(pb.GenerateRequest(prompt="once upon a time",
                                                           max_tokens=12), timeout=10))
            t.check(len(chunks) == 12, "12 chunks, got %d" % len(chunks))
            t.check([c.token_ids[0] for c in chunks] == list(range(100, 112)), "token order")
            t.check("".join(c.text for c in chunks) == "".join(" t%d" % i for i in range(12)),
                    "streamed text")
            if chunks:
                t.check(chunks[-1].finish_reason == "length", "finish reason")
                t.check(chunks[-1].prompt_tokens == 4 and chunks[-1].completion_tokens == 12,
                        "counts")

            # Errors come back as gRPC status codes with a message.
            def code_of(fn):
                try:
                    fn()
                except grpc.RpcError as e:
                    return e.code(), e.details()
                return grpc.StatusCode.OK, ""

            code, msg = code_of(lambda: stub.SetPlacement(pb.SetPlacementRequest(stages=[
                pb.Stage(node="node-a", first_layer=0, last_layer=2),
                pb.Stage(node="ghost", first_layer=3, last_layer=4)]), timeout=5))
            t.check(code == grpc.StatusCode.NOT_FOUND and "ghost" in msg,
                    "unknown node: %s %s" % (code, msg))
            code, msg = code_of(lambda: stub.SetPlacement(pb.SetPlacementRequest(stages=[
                pb.Stage(node="node-a", first_layer=0, last_layer=2)]), timeout=5))
            t.check(code == grpc.StatusCode.INVALID_ARGUMENT and "not covered" in msg,
                    "uncovered layers: %s %s" % (code, msg))
            code, msg = code_of(lambda: stub.Drain(pb.DrainRequest(node="ghost"), timeout=5))
            t.check(code == grpc.StatusCode.NOT_FOUND, "drain unknown node: %s" % code)
            raw = lambda m: ch.unary_unary(m, request_serializer=None,  # noqa: E731
                                           response_deserializer=None)
            code, msg = code_of(lambda: raw("/strata.v1.Control/Nope")(b"", timeout=5))
            t.check(code == grpc.StatusCode.UNIMPLEMENTED and "Nope" in msg,
                    "unknown method: %s %s" % (code, msg))
            code, msg = code_of(lambda: raw("/strata.v1.Control/Register")(b"\xff" * 8,
                                                                           timeout=5))
            t.check(code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in msg,
                    "garbage bytes: %s %s" % (code, msg))
            t0 = time.monotonic()
            code, msg = code_of(lambda: raw("/strata.v1.Test/Slow")(b"x", timeout=0.1))
            t.check(code == grpc.StatusCode.DEADLINE_EXCEEDED, "deadline: %s" % code)
            t.check(time.monotonic() - t0 < 1.0, "deadline is prompt")
            # A call whose deadline passes while it waits behind a busy loop
            # is answered DEADLINE_EXCEEDED and its handler never runs.
            blocked = raw("/strata.v1.Test/Block").future(b"b", timeout=5)
            time.sleep(0.1)  # Block holds the loop now
            code, msg = code_of(lambda: raw("/strata.v1.Test/Count")(b"", timeout=0.2))
            t.check(code == grpc.StatusCode.DEADLINE_EXCEEDED, "queued past its deadline: %s %s" % (code, msg))
            t.check(blocked.result() == b"b", "the blocking call completes")
            time.sleep(0.2)
            n = raw("/strata.v1.Test/Count")(b"", timeout=5)
            t.check(n == b"1", "the expired call's handler did not run: this is run %r" % n)
            # Priority (rpc_loop_add_urgent_method): while the loop is held,
            # four ordinary calls queue, then an urgent one; the urgent
            # handler runs first. One ordinary request is bigger than a job
            # slot's inline copy (512 bytes) and arrives whole.
            blocked = raw("/strata.v1.Test/Block").future(b"1500", timeout=10)
            time.sleep(0.2)  # Block holds the loop now
            sizes = [3, 4000, 5, 6]
            ordinary = []
            for n in sizes:
                ordinary.append(raw("/strata.v1.Test/Order").future(b"o" * n, timeout=10))
                time.sleep(0.02)
            time.sleep(0.1)
            urgent = raw("/strata.v1.Test/Urgent").future(b"u" * 7, timeout=10)
            t.check(blocked.result() == b"1500", "the blocking call completes")
            got_u = urgent.result().split()
            got_o = [f.result().split() for f in ordinary]
            t.check(got_u == [b"1", b"7"], "the urgent call ran first, with its 7 bytes: %r" % got_u)
            t.check(sorted(int(g[0]) for g in got_o) == [2, 3, 4, 5] and
                    [int(g[1]) for g in got_o] == sizes,
                    "the ordinary calls ran after it, with their bytes: %r" % got_o)
            # The heartbeat path allocates nothing of ours on the bridge: 200
            # heartbeats one after another reuse one pooled job slot, their
            # bytes fit its inline copy and their messages its arena.
            stats = lambda: [int(x) for x in raw("/strata.v1.Test/LoopStats")(b"", timeout=5).split()]  # noqa: E731
            before = stats()
            for _ in range(200):
                stub.Heartbeat(pb.HeartbeatRequest(node="node-a", lease_id=1, running_sequences=3,
                                                   kv_blocks_used=7, kv_blocks_free=9, busy_fraction=0.5,
                                                   bytes_sent=123456789), timeout=5)
            after = stats()
            t.check(after[0] - before[0] == 200, "200 heartbeats crossed the bridge (%r -> %r)" % (before, after))
            t.check(after[1:] == before[1:],
                    "and no job slot, request copy or message was malloc'd for them (%r -> %r)" % (before, after))
            t.check(before[2] >= 1, "the 4000-byte request above did take a malloc'd copy (%r)" % before)
            # The server still serves after the errors.
            t.check(len(stub.ListNodes(pb.ListNodesRequest(), timeout=5).nodes) == 3,
                    "still serving")
        code = srv.stop()
        t.check(code == 0, "server exit status %s" % code)
    return t.summary()


if __name__ == "__main__":
    sys.exit(main())
