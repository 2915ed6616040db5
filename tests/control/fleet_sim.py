"""fleet_sim.py — simulated workers over the coordinator's real gRPC control
API (strata.v1.Control): each one Registers (name, a CPU device, host memory,
a data-plane address nobody listens on, the cluster's model file and sha256)
and then sends a Heartbeat every interval, one gRPC channel per worker as the
worker daemon uses. A heartbeat answered `reregister` registers again.

Used by tests/control/fleet_test.py (100 nodes) and bench/control_scale.sh
(thousands). Python asyncio on grpc.aio: one process keeps about 5k workers at
1 Hz on this machine; control_scale.py splits bigger fleets over processes.

Credentials: insecure by default (a loopback coordinator without TLS); with
ca/cert/key files it uses mTLS (the worker's certificate must allow its node
names, docs/security.md).
"""
import asyncio
import hashlib
import os
import time


def model_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


class Fleet:
    """n simulated workers named prefix-00000.. (zero-padded so that name
    order is number order). Statistics: register latencies, heartbeat
    latencies (seconds), deadline misses, reregisters (a lease the coordinator
    no longer knows: it declared the node dead)."""

    def __init__(self, grpc, pb, pbg, addr, model_path, n, prefix="sim", memory=1 << 30,
                 hb_s=1.0, deadline_s=2.0, creds=None, sha=None, first=0, shared_connections=False):
        self.grpc, self.pb, self.pbg = grpc, pb, pbg
        self.addr, self.n, self.prefix, self.memory = addr, n, prefix, memory
        self.hb_s, self.deadline_s, self.creds = hb_s, deadline_s, creds
        self.shared_connections = shared_connections
        self.model = pb.ModelFile(name=os.path.basename(model_path), size_bytes=os.path.getsize(model_path),
                                  sha256=sha or model_sha256(model_path))
        self.names = ["%s-%05d" % (prefix, first + i) for i in range(n)]
        self.reg_lat, self.hb_lat = [], []
        self.reg_misses = self.hb_misses = self.reregisters = self.errors = 0
        self.registered = 0
        self.acked = set()  # names whose Register was answered OK (at least once)
        self.first_error = None
        self.stopping = False
        self.started = None
        self.all_registered_at = None

    def _channel(self):
        # A local subchannel pool: one TCP connection per simulated worker, as
        # each daemon has its own (grpc shares one between channels to the same
        # target otherwise). shared_connections: grpc's sharing, so that one
        # process can drive more workers (the coordinator then sees few
        # connections: its registry and loop are measured, not its accepts).
        opts = [("grpc.enable_retries", 0)]
        if not self.shared_connections:
            opts.append(("grpc.use_local_subchannel_pool", 1))
        if self.creds:
            return self.grpc.aio.secure_channel(self.addr, self.creds, options=opts)
        return self.grpc.aio.insecure_channel(self.addr, options=opts)

    async def _register(self, stub, name, port):
        req = self.pb.RegisterRequest(node=name, host_memory_bytes=self.memory, numa_nodes=1,
                                      data_address="127.0.0.1:%d" % port, models=[self.model],
                                      devices=[self.pb.Device(kind="cpu", count=1, memory_bytes=self.memory)])
        while not self.stopping:
            t = time.monotonic()
            try:
                rep = await stub.Register(req, timeout=self.deadline_s)
                self.reg_lat.append(time.monotonic() - t)
                self.acked.add(name)
                return rep.lease_id
            except self.grpc.aio.AioRpcError as e:
                if e.code() == self.grpc.StatusCode.DEADLINE_EXCEEDED:
                    self.reg_misses += 1
                else:
                    self.errors += 1
                    self.first_error = self.first_error or "%s: Register: %s %s" % (name, e.code(), e.details())
                await asyncio.sleep(0.2)
        return 0

    async def _worker(self, i, start_at):
        name = self.names[i]
        ch = self._channel()
        stub = self.pbg.ControlStub(ch)
        try:
            await asyncio.sleep(max(0.0, start_at - time.monotonic()))
            lease = await self._register(stub, name, 20000 + i % 40000)
            self.registered += 1
            if self.registered == self.n:
                self.all_registered_at = time.monotonic()
            # spread the heartbeats over the interval, as independent daemons do
            await asyncio.sleep(self.hb_s * ((i * 0.6180339887) % 1.0))
            nxt = time.monotonic()
            while not self.stopping:
                nxt += self.hb_s
                t = time.monotonic()
                try:
                    rep = await stub.Heartbeat(self.pb.HeartbeatRequest(node=name, lease_id=lease),
                                               timeout=self.deadline_s)
                    self.hb_lat.append(time.monotonic() - t)
                    if rep.reregister:
                        self.reregisters += 1
                        lease = await self._register(stub, name, 20000 + i % 40000)
                except self.grpc.aio.AioRpcError as e:
                    if e.code() == self.grpc.StatusCode.DEADLINE_EXCEEDED:
                        self.hb_misses += 1
                    else:
                        self.errors += 1
                        self.first_error = self.first_error or "%s: Heartbeat: %s %s" % (name, e.code(), e.details())
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))
        finally:
            await ch.close()

    async def run(self, seconds=None, ramp_s=0.0):
        """Starts every worker (all at once, or spread over ramp_s) and runs
        until stop() or `seconds`."""
        self.started = time.monotonic()
        tasks = [asyncio.ensure_future(self._worker(i, self.started + ramp_s * i / max(1, self.n)))
                 for i in range(self.n)]
        try:
            if seconds is not None:
                await asyncio.sleep(seconds)
                self.stopping = True
            while not self.stopping:
                await asyncio.sleep(0.05)
        finally:
            self.stopping = True
            await asyncio.sleep(0)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self):
        self.stopping = True


def percentile(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def main():
    """One simulator process of bench/control_scale.py: runs n workers for
    --seconds, prints {"registered_at": wall time all had registered} when
    they all have, and writes its statistics as JSON to --out."""
    import argparse
    import json
    import resource
    import sys
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sha")
    ap.add_argument("--proto-dir", required=True, help="folder with control_pb2(_grpc).py")
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--prefix", default="sim")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared-connections", action="store_true")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sys.path.insert(0, a.proto_dir)
    import grpc
    import grpc.aio  # noqa: F401
    import control_pb2
    import control_pb2_grpc
    f = Fleet(grpc, control_pb2, control_pb2_grpc, a.addr, a.model, a.n, prefix=a.prefix, sha=a.sha, first=a.first,
              shared_connections=a.shared_connections)
    hb_t = []
    lat = f.hb_lat

    class Stamped(list):  # heartbeat latencies with their wall-clock time
        def append(self, v):
            hb_t.append((time.time(), v))
    f.hb_lat = Stamped()

    async def watch():
        while f.all_registered_at is None and not f.stopping:
            await asyncio.sleep(0.02)
        if f.all_registered_at is not None:
            print(json.dumps({"registered_at": time.time() - (time.monotonic() - f.all_registered_at)}), flush=True)

    async def go():
        w = asyncio.ensure_future(watch())
        await f.run(seconds=a.seconds)
        w.cancel()

    def dump_and_exit():
        with open(a.out + ".tmp", "w") as fh:
            json.dump({"hb": list(hb_t), "reg_lat": list(f.reg_lat), "reg_misses": f.reg_misses,
                       "hb_misses": f.hb_misses, "reregisters": f.reregisters, "errors": f.errors,
                       "first_error": f.first_error, "registered": f.registered}, fh)
        os.rename(a.out + ".tmp", a.out)
        sys.stdout.flush()
        os._exit(0)  # leave the channels to the kernel: a big fleet's teardown is slow
    # A starved process can hang closing thousands of grpc.aio channels: the
    # figures are written 20 s after the run's end whatever the loop does.
    import threading
    threading.Timer(a.seconds + 20, dump_and_exit).start()
    asyncio.run(go())
    del lat
    dump_and_exit()


if __name__ == "__main__":
    main()
