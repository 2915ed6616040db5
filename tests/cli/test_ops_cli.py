#!/usr/bin/python3
"""test_ops_cli.py — issue 17's CLI details, as an operator runs the tools:

  --version on every binary (one line: NAME VERSION (commit C, T build), exit 0);
  stratactl mistakes, each with its documented message and exit code:
    --addr HOST without a port dials HOST:7070 (and says so), a bad port is a
    usage error (2), nothing listening is 3 with the --live hint, an HTTP port
    is 3 with the "not gRPC" hint, --wait without drain is 2;
  against a live cluster (coordinator --live, workers w-a, w-b on loopback):
    `nodes` says "serving" for the nodes of the serving placement (the
    /metrics word), --json gives 64-bit numbers (lease_id, epochs) as strings,
    `drain w-b --wait` returns only when w-b holds no stage and nothing loads
    (checked right after), its progress has no \\r frames when stderr is not
    a terminal; draining the last usable node is refused (FAILED_PRECONDITION, 1);
  strata-run --help in the llama-cli layout (descriptions and defaults),
    --max-tokens / --temperature / --top-p / --seed accepted and equal to
    -n / --temp (the same tokens), bad values named by their flag (exit 2).

usage: test_ops_cli.py BUILD_DIR SHARED_DIR
"""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import FAILS, LiveBase, check, closed_port, free_port, reap, wait_for  # noqa: E402

BUILD, SHARED = sys.argv[1], sys.argv[2]
BINS = {"strata-coordinator": "coordinator", "strata-worker": "daemon", "stratactl": "cli",
        "strata-run": "cli", "strata-gguf": "cli", "strata-topo": "ib", "strata-rdma-devices": "ib"}
CTL = os.path.join(BUILD, "cli", "stratactl")
RUN = os.path.join(BUILD, "cli", "strata-run")
MODEL = os.path.join(SHARED, "models", "stories260K.gguf")


def run(args, timeout=60, env=None):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


def ctl(*args, addr=None, timeout=60):
    return run([CTL] + (["--addr", addr] if addr is not None else []) + list(args), timeout=timeout)


def versions():
    lines = set()
    for name, d in BINS.items():
        rc, out, err = run([os.path.join(BUILD, d, name), "--version"])
        m = re.fullmatch(r"(\S+) (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}(\+dirty)?|unknown), (\w+) build\)\n", out)
        check(rc == 0 and m is not None and m.group(1) == name, "%s --version: %r" % (name, out))
        if m:
            lines.add(m.group(2, 3, 5))
    check(len(lines) == 1, "every binary reports the same version, commit and build type: %s" % lines)


def ctl_mistakes():
    # Ports held closed (bound, not listening) for the whole check: a port
    # that free_port() picked was once taken meanwhile by another test's HTTP
    # server, and "nothing listening" met an answer.
    hold, closed = closed_port()
    hold2, closed2 = closed_port()
    rc, out, err = ctl("status", addr="127.0.0.1", timeout=30)
    check("127.0.0.1:7070" in err or rc == 0, "--addr 127.0.0.1 dials the default port 7070: %d %r" % (rc, err[:200]))
    for bad in ("127.0.0.1:abc", "127.0.0.1:", "127.0.0.1:70000", ":7070", "[::1", ""):
        rc, out, err = ctl("status", addr=bad)
        check(rc == 2 and err.startswith("stratactl: --addr") and "--help" in err,
              "--addr %r: usage error 2: %r" % (bad, err.strip()[:120]))
    rc, out, err = ctl("status", addr="[::1]:%d" % closed)
    check(rc == 3, "--addr [::1]:PORT is accepted (3: nothing there): %d" % rc)
    for bad in (",", "127.0.0.1:1,127.0.0.1:abc", ",".join(["127.0.0.1:1"] * 9)):
        rc, out, err = ctl("status", addr=bad)
        check(rc == 2 and err.startswith("stratactl: --addr"), "--addr %r: usage error 2: %r" % (bad[:40], err.strip()[:120]))
    rc, out, err = ctl("status", addr="127.0.0.1:%d,127.0.0.1:%d" % (closed, closed2))
    check(rc == 3 and "none of the 2 coordinators answers as the leader" in err
          and "127.0.0.1:%d: UNAVAILABLE" % closed in err and "127.0.0.1:%d: UNAVAILABLE" % closed2 in err,
          "--addr A,B with neither there: exit 3, each one's error: %r" % err[-300:])
    rc, out, err = ctl("status", addr="127.0.0.1:%d" % closed)
    check(rc == 3 and "UNAVAILABLE" in err and "hint: is a coordinator running with --live" in err
          and "127.0.0.1:%d" % closed in err, "nothing listening: exit 3 with the --live hint: %r" % err[-200:])
    rc, out, err = ctl("status", "--wait", addr="127.0.0.1:%d" % closed)
    check(rc == 2 and "--wait goes with drain only" in err, "--wait without drain: 2: %r" % err.strip())
    rc, out, err = ctl("--help")
    check(rc == 0 and "drain NODE [--wait]" in out and "port 7070 when left out" in out, "--help documents --wait and the port")
    hold.close()
    hold2.close()


def live_cluster():
    class A:
        shared = SHARED
    lb = LiveBase(A, "strata-opscli-")
    procs = []
    coord = subprocess.Popen([os.path.join(BUILD, "coordinator", "strata-coordinator"), "--live", "--config", lb.cfg,
                              "--listen", "127.0.0.1:%d" % lb.http_port, "--grpc-listen", lb.grpc_addr,
                              "--state", os.path.join(lb.tmp, "state.json"), "--min-workers", "2"],
                             stdout=open(os.path.join(lb.tmp, "coordinator.log"), "w"), stderr=subprocess.STDOUT,
                             env=lb.env)
    procs.append(("coordinator", coord))
    for n in ("w-a", "w-b"):
        procs.append((n, subprocess.Popen(
            [os.path.join(BUILD, "daemon", "strata-worker"), "--listen", "127.0.0.1:%d" % free_port(),
             "--coordinator", lb.grpc_addr, "--name", n, "--model", lb.model, "--threads", "1"],
            stdout=open(os.path.join(lb.tmp, n + ".log"), "w"), stderr=subprocess.STDOUT, env=lb.env)))
    a = lb.grpc_addr
    try:
        serving = wait_for(lambda: json.loads(ctl("--json", "status", addr=a)[1])["serving"], 120, 0.2)
        if not check(serving, "the live cluster serves"):
            return
        def rows():
            rc, out, err = ctl("nodes", addr=a)
            return {l.split()[0]: l.split()[1] for l in out.splitlines()[1:] if l.strip()}
        wait_for(lambda: rows() == {"w-a": "serving", "w-b": "serving"}, 15, 0.2)  # after a heartbeat each
        r = rows()
        check(r == {"w-a": "serving", "w-b": "serving"}, "nodes: both 'serving' (as /metrics): %s" % r)
        rc, out, err = ctl("--json", "nodes", addr=a)
        nodes = json.loads(out)["nodes"] if rc == 0 else []
        check(nodes and all(isinstance(n["lease_id"], str) and n["lease_id"].isdigit() and int(n["lease_id"]) > 0
                            for n in nodes), "--json: lease_id is a decimal string: %s" % [n.get("lease_id") for n in nodes])
        big = [n["lease_id"] for n in nodes if int(n["lease_id"]) > 2 ** 53]
        print("lease ids above 2^53 (kept exact as strings): %d of %d" % (len(big), len(nodes)))
        rc, out, err = ctl("--json", "placement", "show", addr=a)
        cur = json.loads(out)["current"] if rc == 0 else {}
        check(isinstance(cur.get("epoch"), str) and isinstance(cur.get("n_layers"), int),
              "--json: the epoch (uint64) is a string, n_layers (uint32) a number: %r" % {k: cur.get(k) for k in ("epoch", "n_layers")})
        # An HTTP port instead of the control port.
        rc, out, err = ctl("status", addr="127.0.0.1:%d" % lb.http_port)
        check(rc == 3 and "answers, but not with gRPC" in err, "the HTTP port: exit 3 with the not-gRPC hint: %r" % err[-220:])
        # drain --wait
        t0 = time.monotonic()
        rc, out, err = ctl("drain", "w-b", "--wait", "--timeout", "120", addr=a, timeout=180)
        took = time.monotonic() - t0
        check(rc == 0 and "w-b: drained (no stage, no sequence)" in out, "drain w-b --wait: %d %r %r" % (rc, out, err[-200:]))
        check("\r" not in err, "no \\r progress frames when stderr is not a terminal")
        rc, out, err = ctl("--json", "placement", "show", addr=a)
        pl = json.loads(out) if rc == 0 else {}
        staged = [s["node"] for s in (pl.get("current") or {}).get("stages", [])]
        check(rc == 0 and pl.get("pending") is None and "w-b" not in staged and staged,
              "right after drain --wait (%.1f s): w-b holds no stage and nothing loads: %s" % (took, staged))
        rc, out, err = ctl("drain", "w-a", "--wait", "--timeout", "0.5", addr=a, timeout=60)
        check(rc == 1 and "FAILED_PRECONDITION" in err, "drain of the last usable node: refused (1): %r" % err[-160:])
        rc, out, err = ctl("undrain", "w-b", addr=a)
        check(rc == 0, "undrain w-b")
    finally:
        for n, p in procs:
            if p.poll() is None:
                p.terminate()
        rcs = reap(procs)
        check(all(v == 0 for v in rcs.values()), "the cluster exits 0 on SIGTERM: %s" % rcs)
        if FAILS:
            lb.dump(30)


def strata_run():
    rc, out, err = run([RUN, "--help"])
    check(rc == 0 and "----- sampling -----" in out and "--temp N, --temperature N" in out
          and "(default: 0.8)" in out and "-n,    --n-predict N, --max-tokens N" in out and "(default: 128)" in out,
          "strata-run --help: llama-cli layout with descriptions and defaults")
    rc, out, err = run([RUN, "-h"])
    check(rc == 0 and out.startswith("usage: strata-run"), "strata-run -h")
    base = [RUN, "-m", MODEL, "-p", "Once upon a time", "--json"]
    rc1, o1, e1 = run(base + ["-n", "12", "--temp", "0.7", "--top-p", "0.9", "-s", "7"])
    rc2, o2, e2 = run(base + ["--max-tokens", "12", "--temperature", "0.7", "--top-p", "0.9", "--seed", "7"])
    ids1 = json.loads(o1).get("completion_tokens") if rc1 == 0 else None
    ids2 = json.loads(o2).get("completion_tokens") if rc2 == 0 else None
    check(rc1 == 0 and rc2 == 0 and ids1 and ids1 == ids2 and len(ids1) == 12,
          "--max-tokens/--temperature/--seed equal -n/--temp/-s: %s" % ids2)
    for args, word in ((["--max-tokens", "abc"], "-n/--max-tokens"), (["--temperature", "x"], "--temp/--temperature"),
                       (["--seed", "-3"], "--seed"), (["--top-p", ""], "--top-p")):
        rc, out, err = run([RUN, "-m", MODEL, "-p", "hi"] + args)
        check(rc == 2 and err.startswith("strata-run: ") and word in err, "strata-run %s: exit 2 naming %s: %r" % (args, word, err.strip()))


versions()
ctl_mistakes()
live_cluster()
strata_run()
if FAILS:
    print("FAILED: %d check(s)" % len(FAILS))
    sys.exit(1)
print("all checks passed")
