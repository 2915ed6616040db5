#!/usr/bin/python3
"""mtls_test.py — issue 14's control-plane tests (docs/security.md, "Control
plane (gRPC)"): real strata-coordinator --live and strata-worker processes on
loopback with mutual TLS, certificates made by scripts/strata-ca in a
temporary folder, driven with stratactl and python3-grpcio.

  mtls_test.py MODE --coordinator BIN --worker BIN --stratactl BIN --strata-ca SCRIPT
               --proto control.proto --shared DIR --workdir DIR

MODE
  mtls      the coordinator takes its CA, certificate and key from the live
            INI (grpc_ca / grpc_cert / grpc_key); workers w-a (flags) and w-b
            ($STRATA_CA / $STRATA_CERT / $STRATA_KEY) register with node
            certificates; then, each asserted on the status the client sees:
            a plaintext client and a certificate from another CA fail the
            handshake (UNAVAILABLE), a TLS client without a certificate gets
            UNAUTHENTICATED; a node certificate for "evil" gets
            PERMISSION_DENIED for SetPlacement, ListNodes, Drain, for Register
            and Heartbeat as w-b (w-b's registration unchanged), and a refusal
            that does not show the cluster model's hash; an operator
            certificate cannot Register; stratactl with the operator
            certificate (nodes, placement auto) works, without one or with a
            node's it fails, and dialling a name the coordinator's certificate
            lacks fails the host-name check; HTTP completions and Generate
            equal the stories260K reference; wrong TLS files stop the
            coordinator and a worker at start with a message naming the file;
            replacing the coordinator's certificate and the CA file (a bundle
            with a second CA) takes effect for new connections without a
            restart, the workers staying registered
  exposure  --grpc-listen 0.0.0.0:PORT without credentials: exit 1 and the
            documented message; with --insecure it starts and logs the
            warning; with the TLS files it starts without one
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import FAILS, LiveBase, check, control_stubs, eventually, free_port, reap, wait_for  # noqa: E402

SVC = "/strata.v1.Control/"


def make_certs(script, d):
    """A cluster CA with certificates for the coordinator (IP 127.0.0.1 only),
    nodes w-a, w-b, evil and operator alice; another CA with operator mallory."""
    def ca(*argv, where=d):
        subprocess.run(["bash", script, "--dir", where] + list(argv), check=True, capture_output=True, timeout=60)
    ca("init")
    ca("coordinator", "--san", "IP:127.0.0.1")
    for n in ("w-a", "w-b", "evil"):
        ca("node", n)
    ca("operator", "alice")
    other = os.path.join(d, "other")
    ca("init", where=other)
    ca("operator", "mallory", where=other)
    ca("node", "w-b", where=other)
    return other


def coordinator_log(cl):
    with open(os.path.join(cl.tmp, "coordinator.log"), errors="replace") as f:
        return f.read()


class Cluster(LiveBase):
    def __init__(self, args, prefix="strata-mtls-"):
        super().__init__(args, prefix)
        self.ca_dir = os.path.join(self.tmp, "ca")
        self.other = make_certs(args.strata_ca, self.ca_dir)
        self.coord = None
        self.chans = []

    def pem(self, name, where=None):
        return os.path.join(where or self.ca_dir, name)

    def read(self, name, where=None):
        with open(self.pem(name, where), "rb") as f:
            return f.read()

    def start_coordinator(self, extra_ini="", extra=(), log="coordinator.log"):
        cfg = os.path.join(self.tmp, "cluster-%s.ini" % log)
        with open(cfg, "w") as f:
            f.write("[cluster]\nmodel = %s\nkv_blocks = 256\n%s" % (self.model, extra_ini))
        out = open(os.path.join(self.tmp, log), "w")
        return subprocess.Popen(
            [self.args.coordinator, "--live", "--config", cfg, "--listen", "127.0.0.1:%d" % self.http_port,
             "--grpc-listen", self.grpc_addr, "--state", os.path.join(self.tmp, "state.json"),
             "--heartbeat-ms", "200", "--min-workers", "2"] + list(extra),
            stdout=out, stderr=subprocess.STDOUT, env=self.env)

    def worker_cmd(self, name, port):
        return [self.args.worker, "--listen", "127.0.0.1:%d" % port, "--coordinator", self.grpc_addr, "--name",
                name, "--model", self.model, "--threads", "1"]

    def start_worker(self, name, flags=True, cert=None):
        cmd = self.worker_cmd(name, free_port())
        env = dict(self.env)
        cert = cert or "node-%s" % name
        if flags:
            cmd += ["--grpc-ca", self.pem("ca.pem"), "--grpc-cert", self.pem(cert + ".pem"),
                    "--grpc-key", self.pem(cert + ".key")]
        else:
            env.update(STRATA_CA=self.pem("ca.pem"), STRATA_CERT=self.pem(cert + ".pem"),
                       STRATA_KEY=self.pem(cert + ".key"))
        out = open(os.path.join(self.tmp, "%s.log" % name), "w")
        self.workers[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def channel(self, cert=None, where=None, plaintext=False, ca_where=None, options=()):
        if plaintext:
            ch = grpc.insecure_channel(self.grpc_addr)
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=self.read("ca.pem", ca_where),
                private_key=self.read(cert + ".key", where) if cert else None,
                certificate_chain=self.read(cert + ".pem", where) if cert else None)
            ch = grpc.secure_channel(self.grpc_addr, creds, options=list(options))
        self.chans.append(ch)
        return pbg.ControlStub(ch), ch

    def ctl(self, *argv, certs="operator-alice", env_extra=None, timeout=120):
        cmd = [self.args.stratactl, "--addr", self.grpc_addr]
        if certs:
            cmd += ["--ca", self.pem("ca.pem"), "--cert", self.pem(certs + ".pem"), "--key",
                    self.pem(certs + ".key")]
        env = dict(self.env)
        env.update(env_extra or {})
        p = subprocess.run(cmd + list(argv), capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout, p.stderr

    def stop(self):
        for ch in self.chans:
            ch.close()
        procs = [(n, p) for n, p in self.workers.items()] + ([("coordinator", self.coord)] if self.coord else [])
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        return reap(procs)


def refs(args):
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        return json.load(f)


def expect(fn, code, words, label, absent=()):
    """Calls fn; checks that it raises grpc.RpcError with code and every word
    of words in its details (and none of absent)."""
    try:
        fn()
        check(False, "%s: refused with %s (it succeeded)" % (label, code.name))
        return None
    except grpc.RpcError as e:
        d = e.details() or ""
        ok = e.code() == code and all(w in d for w in words) and not any(a in d for a in absent)
        check(ok, "%s: %s %r" % (label, e.code().name, d[:240]))
        return d


def complete(port, prompt, n):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        c.request("POST", "/v1/completions",
                  body=json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0,
                                   "return_token_ids": True}).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        d = json.loads(r.read())
        return r.status, d["choices"][0].get("token_ids") if r.status == 200 else d
    finally:
        c.close()


# ---------------------------------------------------------------------- modes

def mode_mtls(cl, args):
    rs = refs(args)
    # scripts/strata-ca: files 0600, nothing overwritten, bad input refused
    modes = {f: oct(os.stat(cl.pem(f)).st_mode & 0o777) for f in os.listdir(cl.ca_dir) if f.endswith((".pem", ".key"))}
    check(len(modes) == 12 and set(modes.values()) == {"0o600"}, "strata-ca: 12 files, all mode 0600: %s" % sorted(set(modes.values())))
    for argv, words in ((["node", "w-a"], "exists"), (["node", "a b"], "use 1-63 letters"),
                        (["coordinator"], "needs --san"), (["coordinator", "--san", "IP:1.2.3.4;rm"], "want DNS:NAME")):
        p = subprocess.run(["bash", args.strata_ca, "--dir", cl.ca_dir] + argv, capture_output=True, text=True,
                           timeout=60)
        check(p.returncode == 2 and words in p.stderr, "strata-ca %s: exit 2, %r" % (" ".join(argv), p.stderr.strip()))
    p = subprocess.run(["openssl", "x509", "-in", cl.pem("node-w-a.pem"), "-noout", "-subject", "-ext",
                        "extendedKeyUsage"], capture_output=True, text=True, timeout=60)
    check("CN = node:w-a" in p.stdout and "Client Authentication" in p.stdout,
          "strata-ca node w-a: CN node:w-a, clientAuth")
    ini = "grpc_ca = %s\ngrpc_cert = %s\ngrpc_key = %s\n" % (cl.pem("ca.pem"), cl.pem("coordinator.pem"),
                                                            cl.pem("coordinator.key"))
    cl.coord = cl.start_coordinator(ini)
    cl.start_worker("w-a", flags=True)
    cl.start_worker("w-b", flags=False)
    op, _ = cl.channel("operator-alice")
    if not wait_for(lambda: op.GetStatus(pb.GetStatusRequest(), timeout=2).serving, 90, 0.1):
        cl.dump()
        check(False, "the mTLS cluster serves (operator GetStatus)")
        return
    check(True, "the mTLS cluster serves: w-a (flags) and w-b ($STRATA_CA/CERT/KEY) registered with node certificates")
    check(eventually(lambda: "mutual TLS" in coordinator_log(cl)),
          "the coordinator reports mutual TLS on its gRPC listener")

    # ---- who can connect
    plain, _ = cl.channel(plaintext=True)
    expect(lambda: plain.GetStatus(pb.GetStatusRequest(), timeout=5), grpc.StatusCode.UNAVAILABLE, [],
           "plaintext client: the handshake fails")
    # a peer that keeps failing the handshake cannot flood the log (gRPC's lines are rate-limited)
    import socket
    with open(os.path.join(cl.tmp, "coordinator.log")) as f:
        n0 = sum(1 for l in f if "ssl_transport_security" in l)
    t0 = time.monotonic()
    for _ in range(100):
        with socket.create_connection(("127.0.0.1", cl.grpc_port), timeout=5) as so:
            so.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                while so.recv(4096):
                    pass
            except OSError:
                pass
    dt = time.monotonic() - t0
    time.sleep(0.5)
    with open(os.path.join(cl.tmp, "coordinator.log")) as f:
        hs = [l for l in f if "ssl_transport_security" in l][n0:]
    check(len(hs) <= 2 + int(dt / 10), "100 plaintext connections in %.1f s: %d log line(s) from gRPC's handshake "
          "failures (at most one per 10 s)" % (dt, len(hs)))

    def one_more():
        with socket.create_connection(("127.0.0.1", cl.grpc_port), timeout=5) as so:
            so.sendall(b"GET / HTTP/1.1\r\n\r\n")
            try:
                while so.recv(4096):
                    pass
            except OSError:
                pass
        with open(os.path.join(cl.tmp, "coordinator.log")) as f:
            m = re.findall(r"ssl_transport_security\.cc:\d+; (\d+) more like it", f.read())
        return m and int(m[-1]) >= 100 and int(m[-1])
    left_out = wait_for(one_more, 15, 1.0)
    check(bool(left_out), "the next line counts the handshake failures left out: %s" % left_out)
    anon, _ = cl.channel(None)
    expect(lambda: anon.ListNodes(pb.ListNodesRequest(), timeout=5), grpc.StatusCode.UNAUTHENTICATED,
           ["client certificate", "cluster CA"], "TLS client without a certificate: ListNodes")
    expect(lambda: anon.Register(pb.RegisterRequest(node="w-b"), timeout=5), grpc.StatusCode.UNAUTHENTICATED,
           ["client certificate"], "TLS client without a certificate: Register")
    foreign, _ = cl.channel("operator-mallory", where=cl.other)
    expect(lambda: foreign.ListNodes(pb.ListNodesRequest(), timeout=5), grpc.StatusCode.UNAVAILABLE, [],
           "operator certificate from another CA: the handshake fails")
    foreign_node, _ = cl.channel("node-w-b", where=cl.other)
    expect(lambda: foreign_node.Heartbeat(pb.HeartbeatRequest(node="w-b", lease_id=1), timeout=5),
           grpc.StatusCode.UNAVAILABLE, [], "w-b certificate from another CA: the handshake fails")
    wrong_name, _ = cl.channel("operator-alice", options=[("grpc.ssl_target_name_override", "coordinator.example")])
    expect(lambda: wrong_name.GetStatus(pb.GetStatusRequest(), timeout=5), grpc.StatusCode.UNAVAILABLE, [],
           "a server name the coordinator's certificate lacks: the client refuses it")

    # ---- a fake node "evil"
    before = {n.name: n for n in op.ListNodes(pb.ListNodesRequest(), timeout=5).nodes}
    check(sorted(before) == ["w-a", "w-b"], "registered: %s" % sorted(before))
    pl_before = op.GetPlacement(pb.GetPlacementRequest(), timeout=5).current
    evil, _ = cl.channel("node-evil")
    S = pb.Stage
    node_op = ["certificate \"node:evil\" is a node's", "operator certificate"]
    expect(lambda: evil.SetPlacement(pb.SetPlacementRequest(stages=[S(node="evil", first_layer=0, last_layer=2),
                                                                   S(node="w-b", first_layer=3, last_layer=4)]),
                                     timeout=5), grpc.StatusCode.PERMISSION_DENIED, node_op, "evil: SetPlacement")
    expect(lambda: evil.ListNodes(pb.ListNodesRequest(), timeout=5), grpc.StatusCode.PERMISSION_DENIED, node_op,
           "evil: ListNodes")
    expect(lambda: evil.Drain(pb.DrainRequest(node="w-a"), timeout=5), grpc.StatusCode.PERMISSION_DENIED, node_op,
           "evil: Drain")
    expect(lambda: evil.RemoveNode(pb.RemoveNodeRequest(node="w-b"), timeout=5), grpc.StatusCode.PERMISSION_DENIED,
           node_op, "evil: RemoveNode w-b")
    expect(lambda: evil.AutoPlacement(pb.AutoPlacementRequest(), timeout=5), grpc.StatusCode.PERMISSION_DENIED,
           node_op, "evil: AutoPlacement")
    expect(lambda: list(evil.Generate(pb.GenerateRequest(prompt="My password is", max_tokens=4), timeout=5)),
           grpc.StatusCode.PERMISSION_DENIED, node_op, "evil: Generate")
    with open(cl.model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    reg = pb.RegisterRequest(node="w-b", data_address="127.0.0.1:1",
                             devices=[pb.Device(kind="cpu", count=1, memory_bytes=1 << 30)],
                             host_memory_bytes=1 << 30,
                             models=[pb.ModelFile(name=os.path.basename(cl.model), size_bytes=1, sha256=sha)])
    expect(lambda: evil.Register(reg, timeout=5), grpc.StatusCode.PERMISSION_DENIED,
           ["may act only as node \"evil\"", "not \"w-b\""], "evil: Register as w-b (the right model hash)",
           absent=[sha[:8]])
    expect(lambda: evil.Heartbeat(pb.HeartbeatRequest(node="w-b", lease_id=before["w-b"].lease_id), timeout=5),
           grpc.StatusCode.PERMISSION_DENIED, ["may act only as node \"evil\""], "evil: Heartbeat as w-b with its lease")
    expect(lambda: evil.Leave(pb.LeaveRequest(node="w-b", lease_id=before["w-b"].lease_id, reason="evil"), timeout=5),
           grpc.StatusCode.PERMISSION_DENIED, ["may act only as node \"evil\""], "evil: Leave as w-b with its lease")
    bad_model = pb.RegisterRequest(node="evil", data_address="127.0.0.1:1",
                                   devices=[pb.Device(kind="cpu", count=1, memory_bytes=1 << 30)],
                                   host_memory_bytes=1 << 30,
                                   models=[pb.ModelFile(name=os.path.basename(cl.model), size_bytes=1,
                                                        sha256="ab" * 32)])
    expect(lambda: evil.Register(bad_model, timeout=5), grpc.StatusCode.FAILED_PRECONDITION,
           ["evil", "sha256", "different"], "evil: Register as itself with another model: refused",
           absent=[sha[:8]])
    alice_reg = expect(lambda: op.Register(reg, timeout=5), grpc.StatusCode.PERMISSION_DENIED,
                       ["\"operator:alice\" is not a node's"], "operator certificate: Register as w-b")
    check(alice_reg is not None, "an operator cannot register a node")
    after = {n.name: n for n in op.ListNodes(pb.ListNodesRequest(), timeout=5).nodes}
    check(sorted(after) == ["w-a", "w-b"] and after["w-b"].data_address == before["w-b"].data_address and
          after["w-b"].lease_id == before["w-b"].lease_id,
          "w-b's registration unchanged (address %s, same lease); no node \"evil\"" % after["w-b"].data_address)
    pl_after = op.GetPlacement(pb.GetPlacementRequest(), timeout=5)
    check(pl_after.current.epoch == pl_before.epoch and not pl_after.HasField("pending"),
          "the placement is unchanged (epoch %d)" % pl_after.current.epoch)
    check(eventually(lambda: re.search(r"refused SetPlacement from ipv4:127\.0\.0\.1:\d+ \(certificate CN "
                                       r"\\?\"node:evil\\?\"\)", coordinator_log(cl))),
          "the coordinator logs the refusal with the caller's address and certificate")

    # ---- stratactl
    rc, out, err = cl.ctl("--json", "nodes")
    names = sorted(n["name"] for n in json.loads(out)["nodes"]) if rc == 0 else []
    check(rc == 0 and names == ["w-a", "w-b"], "stratactl --json nodes with the operator certificate: %s" % names)
    e0 = op.GetPlacement(pb.GetPlacementRequest(), timeout=5).current.epoch
    rc, out, err = cl.ctl("placement", "set", "--stages", "w-b:0-2,w-a:3-4")
    cur = op.GetPlacement(pb.GetPlacementRequest(), timeout=5).current
    check(rc == 0 and cur.epoch == e0 + 1 and [s.node for s in cur.stages] == ["w-b", "w-a"],
          "stratactl placement set (operator): epoch %d, rc %d %s" % (cur.epoch, rc, err.strip()[-200:]))
    rc, out, err = cl.ctl("placement", "auto")
    cur = op.GetPlacement(pb.GetPlacementRequest(), timeout=5).current
    check(rc == 0 and cur.epoch == e0 + 2 and sorted(s.node for s in cur.stages) == ["w-a", "w-b"],
          "stratactl placement auto (operator): epoch %d, rc %d" % (cur.epoch, rc))
    rc, out, err = cl.ctl("nodes", certs=None)
    check(rc == 3 and "UNAVAILABLE" in err, "stratactl without certificates: exit 3, %r" % err.strip()[:160])
    rc, out, err = cl.ctl("nodes", certs="node-evil")
    check(rc == 1 and "PERMISSION_DENIED" in err and "operator certificate" in err,
          "stratactl with a node certificate: exit 1, %r" % err.strip()[:200])
    rc, out, err = cl.ctl("nodes", certs=None, env_extra={"STRATA_CA": cl.pem("ca.pem"),
                                                          "STRATA_CERT": cl.pem("operator-alice.pem"),
                                                          "STRATA_KEY": cl.pem("operator-alice.key")})
    check(rc == 0 and "w-a" in out and "w-b" in out, "stratactl with $STRATA_CA/$STRATA_CERT/$STRATA_KEY")
    rc, out, err = cl.ctl("nodes", certs=None, env_extra={"STRATA_CA": cl.pem("ca.pem")})
    check(rc == 2 and "missing: --cert --key" in err, "stratactl with a CA only: exit 2, %r" % err.strip()[:200])
    # the host-name check: the coordinator's certificate names IP 127.0.0.1, not "localhost"
    p = subprocess.run([args.stratactl, "--addr", "localhost:%d" % cl.grpc_port, "--ca", cl.pem("ca.pem"),
                        "--cert", cl.pem("operator-alice.pem"), "--key", cl.pem("operator-alice.key"), "status"],
                       capture_output=True, text=True, timeout=60,
                       env=dict(cl.env, ASAN_OPTIONS="detect_leaks=0"))  # c-ares (DNS) leaks at exit
    check(p.returncode == 3 and "UNAVAILABLE" in p.stderr and "names the --addr host" in p.stderr,
          "stratactl dialling a name the certificate lacks: exit 3 with the TLS hint")

    # ---- serving: the reference tokens over HTTP and over Generate
    good = 0
    for r in rs[:4]:
        st, ids = complete(cl.http_port, r["prompt"], 32)
        good += st == 200 and ids == r["completion_tokens"][:32]
    check(good == 4, "HTTP completions equal the stories260K reference: %d/4" % good)
    ids = []
    for ch in op.Generate(pb.GenerateRequest(prompt=rs[0]["prompt"], max_tokens=24), timeout=60):
        ids += list(ch.token_ids)
    check(ids == rs[0]["completion_tokens"][:24], "Generate (operator) equals the reference (%d tokens)" % len(ids))

    # ---- wrong files stop the programs at start, naming the file
    w = subprocess.run(cl.worker_cmd("w-x", free_port()) + [
        "--grpc-ca", cl.pem("ca.pem"), "--grpc-cert", cl.pem("node-w-b.pem", cl.other),
        "--grpc-key", cl.pem("node-w-b.key", cl.other)], capture_output=True, text=True, timeout=60, env=cl.env)
    check(w.returncode == 1 and "is not issued by the CA" in w.stderr and "listening on" not in w.stdout,
          "a worker with a certificate from another CA: exit 1 before it listens, %r" % w.stderr.strip()[-200:])
    w = subprocess.run(cl.worker_cmd("w-x", free_port()) + ["--grpc-ca", cl.pem("ca.pem")], capture_output=True,
                       text=True, timeout=60, env=cl.env)
    check(w.returncode == 1 and "missing: --grpc-cert --grpc-key" in w.stderr,
          "a worker with --grpc-ca only: exit 1, %r" % w.stderr.strip()[-200:])
    port2 = free_port()
    c2 = subprocess.run(
        [args.coordinator, "--live", "--config", os.path.join(cl.tmp, "cluster-coordinator.log.ini"),
         "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:%d" % port2, "--state",
         os.path.join(cl.tmp, "state2.json"), "--grpc-key", cl.pem("node-evil.key")],
        capture_output=True, text=True, timeout=60, env=cl.env)
    check(c2.returncode == 1 and "does not belong to certificate" in c2.stderr and "node-evil.key" in c2.stderr,
          "a coordinator whose key is not its certificate's: exit 1, %r" % c2.stderr.strip()[-200:])


    rotate(cl, args, op)


def replace_file(dst, data):
    """Writes dst atomically (a new file renamed over it), as docs/security.md says."""
    tmp = dst + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, dst)


def rotate(cl, args, op):
    """Rotation without a restart: a new coordinator certificate (another key,
    one more SAN) and a CA bundle (ours + the other CA) replace the files; new
    connections use them, the workers stay registered."""
    rot = os.path.join(cl.tmp, "rot")
    os.makedirs(rot)
    for f in ("ca.pem", "ca.key"):
        shutil.copy(cl.pem(f), rot)
    subprocess.run(["bash", args.strata_ca, "--dir", rot, "coordinator", "--san", "IP:127.0.0.1,DNS:coordinator.example"],
                   check=True, capture_output=True, timeout=60)
    leases = {n.name: n.lease_id for n in op.ListNodes(pb.ListNodesRequest(), timeout=5).nodes}
    replace_file(cl.pem("ca.pem"), cl.read("ca.pem") + cl.read("ca.pem", cl.other))
    replace_file(cl.pem("coordinator.key"), cl.read("coordinator.key", rot))
    replace_file(cl.pem("coordinator.pem"), cl.read("coordinator.pem", rot))

    def status_via(name):
        stub, ch = cl.channel("operator-alice", options=[("grpc.ssl_target_name_override", name)])
        try:
            return stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        finally:
            ch.close()
    st = wait_for(lambda: status_via("coordinator.example"), 30, 0.2)
    check(st is not None and st.serving,
          "after replacing the files: a new connection gets the new certificate (SAN coordinator.example), no restart")
    mallory, _ = cl.channel("operator-mallory", where=cl.other)
    n = wait_for(lambda: len(mallory.ListNodes(pb.ListNodesRequest(), timeout=5).nodes), 30, 0.2)
    check(n == 2, "with the CA bundle, an operator certificate of the second CA is accepted (CA rotation)")
    time.sleep(1.0)
    after = {n.name: (n.lease_id, n.state) for n in op.ListNodes(pb.ListNodesRequest(), timeout=5).nodes}
    check(all(after.get(k, (0, 0)) == (v, pb.NODE_STATE_READY) for k, v in leases.items()),
          "the workers stay registered (same leases, ready) across the rotation")
    check(eventually(lambda: "reloaded" in coordinator_log(cl)), "the coordinator logs the reload")
    st, ids = complete(cl.http_port, refs(args)[0]["prompt"], 16)
    check(st == 200 and ids == refs(args)[0]["completion_tokens"][:16], "serving after the rotation")


def mode_exposure(cl, args):
    port = free_port("0.0.0.0")
    listen = "0.0.0.0:%d" % port
    base = [args.coordinator, "--live", "--config", cl.cfg, "--listen", "127.0.0.1:0", "--grpc-listen", listen,
            "--state", os.path.join(cl.tmp, "state.json")]
    p = subprocess.run(base, capture_output=True, text=True, timeout=60, env=cl.env)
    want = ("strata-coordinator: gRPC control: refusing to listen on non-loopback address %s without "
            "credentials; configure them (docs/security.md) or pass --insecure" % listen)
    check(p.returncode == 1 and want in p.stderr, "non-loopback without credentials: exit %d, %r"
          % (p.returncode, p.stderr.strip()[-300:]))

    def serve(extra, label, tls):
        log = os.path.join(cl.tmp, "%s.log" % label)
        out = open(log, "w")
        proc = subprocess.Popen(base + extra, stdout=out, stderr=subprocess.STDOUT, env=cl.env)
        try:
            if tls:
                creds = grpc.ssl_channel_credentials(cl.read("ca.pem"), cl.read("operator-alice.key"),
                                                     cl.read("operator-alice.pem"))
                ch = grpc.secure_channel("127.0.0.1:%d" % port, creds)
            else:
                ch = grpc.insecure_channel("127.0.0.1:%d" % port)
            stub = pbg.ControlStub(ch)
            st = wait_for(lambda: stub.GetStatus(pb.GetStatusRequest(), timeout=2), 60, 0.1)
            ch.close()
            check(st is not None and st.n_layers == 5, "%s: listening on %s, GetStatus answers" % (label, listen))
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = reap([(label, proc)])[label]
        with open(log) as f:
            text = f.read()
        return rc, text
    rc, text = serve(["--insecure"], "insecure", False)
    warn = "gRPC control listens on %s without credentials (--insecure): anyone who can reach it can use it" % listen
    check(rc == 0 and warn in text, "--insecure: starts, warns %r, exit %s" % (warn, rc))
    rc, text = serve(["--grpc-ca", cl.pem("ca.pem"), "--grpc-cert", cl.pem("coordinator.pem"), "--grpc-key",
                      cl.pem("coordinator.key")], "tls", True)
    check(rc == 0 and "without credentials" not in text and "mutual TLS" in text,
          "with the TLS files: starts on %s without the warning, exit %s" % (listen, rc))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["mtls", "exposure"])
    for k in ("coordinator", "worker", "stratactl", "strata_ca", "proto", "shared", "workdir"):
        ap.add_argument("--" + k.replace("_", "-"), required=True)
    args = ap.parse_args()
    if not shutil.which("openssl"):
        print("SKIP: no openssl command")
        return 77
    global grpc, pb, pbg
    grpc, pb, pbg = control_stubs(args.proto, os.path.join(args.workdir, "pygen-mtls-" + args.mode))
    cl = Cluster(args)
    try:
        {"mtls": mode_mtls, "exposure": mode_exposure}[args.mode](cl, args)
    except Exception as e:  # noqa: BLE001 - reported as a failure, processes still stopped
        import traceback
        traceback.print_exc()
        check(False, "exception: %r" % e)
    finally:
        rcs = cl.stop()
    bad = {n: rc for n, rc in rcs.items() if rc not in (0,)}
    check(not bad, "every process exits 0 on SIGTERM: %s" % rcs)
    if FAILS:
        cl.dump(40)
        print("%d check(s) failed" % len(FAILS))
        return 1
    shutil.rmtree(cl.tmp, ignore_errors=True)
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
