#!/usr/bin/python3
"""cluster_test.py — issue 5's integration tests: a real strata-coordinator and
real strata-worker processes, started and stopped by the test, driven over
HTTP (stdlib only: subprocess, http.client, threading, json).

  cluster_test.py MODE --coordinator BIN --worker BIN --shared DIR

MODE
  exact-pp2-tp2   PP 2 x TP 2 on loopback: the 10 prompts of
                  stories260K-greedy.json sent concurrently (non-streaming and
                  streaming), token ids == the reference
  exact-pp5       PP 5 x TP 1 (one layer per stage), the same
  exact-pp3-221   PP 3 with the explicit partition 2,2,1, the same
  long            the 480-token reference (ignore_eos), PP 2 x TP 2
  netns           PP 2 x TP 2, each worker in its own network namespace (veth
                  pairs joined by a bridge, 10.77.x.0/24); the coordinator in
                  the root one
  microbatch      PP 2: with 8 concurrent sequences both stages run forwards
                  at the same time (>= 10% of the shorter busy time, from the
                  stages' forward intervals), with 1 sequence never (< 1%);
                  every completion equals the reference; decode tok/s of 8 vs
                  1 sequence printed (a figure, not asserted)
  cancel          a streaming client disconnects mid-stream: the free KV block
                  count returns to its starting value
  bad-input       each bad request gets its 400; random bytes to a worker's
                  data port leave it serving (the next completion is exact)
  hang            PP 2: stage 1's worker is SIGSTOPped mid-stream (its
                  connection stays open); the per-micro-batch deadline finds
                  it hung; the static recovery waits for it (--recovery-timeout
                  3), it never comes back: the stream ends with one error event
                  naming stage 1 hung and [DONE], /health answers 503; the
                  stopped worker is SIGCONTed and SIGKILLed by pid at the end
  restart         static recovery, PP 2: 5 greedy SSE streams of 200 tokens;
                  stage 1's worker is SIGKILLed at 20 tokens and restarted on
                  its port; every stream ends with [DONE], no error event, and
                  the tokens of a no-failure run; the log names the held and
                  resumed requests; /health 200 and exact output afterwards
  stop-resume     the same, but stage 1's worker is SIGSTOPped (found hung by
                  the per-micro-batch deadline) and SIGCONTed once the
                  coordinator logged the hold: its connection is closed and
                  re-made, the stage re-assigned
  stage-failed    the same, but stage 1's stage fails for good (as when its
                  NCCL communicator is aborted; the test-only
                  STRATA_TEST_STAGE_FAIL_FILE): the worker reports
                  BatchError.stage_failed, the coordinator holds at once, the
                  worker loads the stage again and the streams resume

UCX transports: UCX_TLS=tcp unless UCX_TLS is set (as the ib/ tests do).
Every process is killed in a finally block; every wait is bounded.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import FAILS, NetnsBridge, check, eventually, netns_unavailable, check_streams, free_port, sse_events, stream_all, insecure_flag  # noqa: E402


class Cluster:
    """Workers + coordinator. stages: list of dicts {tp, host, netns, args (extra
    worker flags), cfg (extra [stage.N] lines), env (extra environment of that worker)}."""

    def __init__(self, args, stages, partition=None, extra_cfg="", threads_per_rank=1,
                 model=None, coord_args=(), kv_blocks=512, worker_args=()):
        self.args = args
        self.kv_blocks = kv_blocks
        self.coord_args = list(coord_args)
        self.worker_args = list(worker_args)
        self.stages = stages
        self.partition = partition
        self.extra_cfg = extra_cfg
        self.threads_per_rank = threads_per_rank
        self.model = model or os.path.join(args.shared, "models", "stories260K.gguf")
        self.tmp = tempfile.mkdtemp(prefix="strata-cluster-")
        self.procs = []
        self.http_port = None
        self.coord_env = {}  # the coordinator's own environment on top of the workers'

    def start(self, timeout=60):
        env = dict(os.environ)
        env.setdefault("UCX_TLS", "tcp")
        if not any(st.get("netns") for st in self.stages):
            env.setdefault("UCX_NET_DEVICES", "lo")  # loopback only (other tests may add bridges)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
        self.env = env
        cfg = ["[cluster]", "model = %s" % self.model, "kv_blocks = %d" % self.kv_blocks]
        if self.partition:
            cfg.append("partition = %s" % self.partition)
        cfg.append(self.extra_cfg)
        self.worker_addrs = []
        self.worker_cmds = []
        for i, st in enumerate(self.stages):
            host = st.get("host", "127.0.0.1")
            port = free_port("127.0.0.1")
            self.worker_addrs.append((host, port))
            cmd = [self.args.worker, "--listen", "%s:%d" % (host, port),
                   "--threads", str(st["tp"] * self.threads_per_rank), "--name", "w%d" % i,
                   "--model-dir", os.path.dirname(os.path.abspath(self.model))] + self.worker_args
            cmd += st.get("args", [])  # extra worker flags
            if not host.startswith("127.") and "--cluster-key-file" not in self.worker_args:
                cmd += insecure_flag(self.args.worker)  # a netns address: no key in this test
            if st.get("netns"):
                cmd = ["ip", "netns", "exec", st["netns"]] + cmd
            self.worker_cmds.append(cmd)
            log = open(os.path.join(self.tmp, "worker%d.log" % i), "w")
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env, **st.get("env", {})))
            self.procs.append(("worker%d" % i, p))
            cfg += ["[stage.%d]" % i, "address = %s:%d" % (host, port), "tp = %d" % st["tp"]]
            cfg += st.get("cfg", [])  # extra [stage.N] keys (backend = cuda, ...)
        path = os.path.join(self.tmp, "cluster.ini")
        with open(path, "w") as f:
            f.write("\n".join(cfg) + "\n")
        self.http_port = free_port()
        self.co_out = os.path.join(self.tmp, "coordinator.out")
        self.co_log = os.path.join(self.tmp, "coordinator.log")
        p = subprocess.Popen([self.args.coordinator, "--config", path, "--listen",
                              "127.0.0.1:%d" % self.http_port, "--ready-timeout", str(timeout)]
                             + self.coord_args,
                             stdout=open(self.co_out, "w"), stderr=open(self.co_log, "w"),
                             env=dict(env, **self.coord_env))
        self.procs.append(("coordinator", p))
        self.coordinator = p
        deadline = time.time() + timeout + 5
        while time.time() < deadline:
            if p.poll() is not None:
                break
            try:
                st, _ = self.get("/health")
                if st == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        self.dump_logs()
        raise RuntimeError("the cluster did not become healthy")

    def restart_worker(self, i):
        """Starts worker i again with its command (same address); replaces it in procs."""
        log = open(os.path.join(self.tmp, "worker%d.log" % i), "a")
        p = subprocess.Popen(self.worker_cmds[i], stdout=log, stderr=subprocess.STDOUT,
                             env=dict(self.env, **self.stages[i].get("env", {})))
        self.procs = [(n, q) for n, q in self.procs if n != "worker%d" % i]
        self.procs.insert(0, ("worker%d" % i, p))
        return p

    def dump_logs(self):
        for name in sorted(os.listdir(self.tmp)):
            if name.endswith(".log") or name.endswith(".out"):
                with open(os.path.join(self.tmp, name), errors="replace") as f:
                    lines = f.readlines()
                print("---- %s (last 30 lines)" % name)
                sys.stdout.write("".join(lines[-30:]))

    def stop(self):
        """SIGTERM everything; returns {name: exit status} (None = had to be killed)."""
        rcs = {}
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in reversed(self.procs):
            try:
                rcs[name] = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rcs[name] = None
        self.procs = []
        return rcs

    def kill(self):
        for _, p in self.procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self.procs = []

    # ---- HTTP
    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)

    def get(self, path):
        c = self.conn(10)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def stages_json(self):
        st, body = self.get("/v1/stages")
        assert st == 200, body
        return json.loads(body)

    def post_raw(self, body, ctype="application/json"):
        c = self.conn()
        try:
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": ctype})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def complete(self, req):
        st, body = self.post_raw(json.dumps(req).encode())
        return st, json.loads(body)

    def stream(self, req, on_event=None):
        """Streams; returns (status, list of chunk dicts, saw_done, timestamps)."""
        req = dict(req, stream=True)
        c = self.conn()
        chunks, stamps, done = [], [], False
        try:
            c.request("POST", "/v1/completions", body=json.dumps(req).encode(),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                return r.status, [json.loads(r.read())], False, []
            for ch in sse_events(r):
                if ch is None:
                    done = True
                    break
                chunks.append(ch)
                stamps.append(time.time())
                if on_event and on_event(chunks[-1]) is False:
                    return r.status, chunks, done, stamps
            return r.status, chunks, done, stamps
        finally:
            c.close()


def load_ref(args, name):
    with open(os.path.join(args.shared, "reference", name)) as f:
        return json.load(f)


def run_concurrent(fns):
    out = [None] * len(fns)
    errs = []

    def run(i):
        try:
            out[i] = fns[i]()
        except Exception as e:  # noqa: BLE001 - reported as a failure
            errs.append("%d: %r" % (i, e))

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    check(not errs, "no request raised (%s)" % "; ".join(errs))
    return out


def exact_checks(cl, refs, max_tokens=64, ignore_eos=False, label=""):
    def req(r):
        q = {"prompt": r["prompt"], "max_tokens": max_tokens, "temperature": 0,
             "return_token_ids": True}
        if ignore_eos:
            q["ignore_eos"] = True
        return q

    t0 = time.time()
    res = run_concurrent([lambda r=r: cl.complete(req(r)) for r in refs])
    print("%s: %d concurrent completions in %.2f s" % (label, len(refs), time.time() - t0))
    n_ok = 0
    for r, got in zip(refs, res):
        if got is None:
            continue
        st, body = got
        ch = body.get("choices", [{}])[0] if st == 200 else {}
        ok = st == 200 and ch.get("token_ids") == r["completion_tokens"][:max_tokens] \
            and ch.get("prompt_token_ids") == r["prompt_tokens"] \
            and ch.get("finish_reason") == "length"
        if not ok:
            print("  prompt %r: status %d, got %s" % (r["prompt"], st, json.dumps(body)[:600]))
        n_ok += ok
    check(n_ok == len(refs), "%s: %d/%d non-streaming completions equal the reference"
          % (label, n_ok, len(refs)))
    # Streaming: chunks concatenate to the same text and ids, end with [DONE].
    res = run_concurrent([lambda r=r: cl.stream(req(r)) for r in refs])
    n_ok = 0
    for r, got in zip(refs, res):
        if got is None:
            continue
        st, chunks, done, _ = got
        ids, text = [], ""
        finish = None
        for c in chunks:
            ch = c["choices"][0]
            ids += ch.get("token_ids", [])
            text += ch.get("text", "")
            finish = ch.get("finish_reason") or finish
        ok = st == 200 and done and ids == r["completion_tokens"][:max_tokens] \
            and finish == "length"
        if max_tokens == len(r["completion_tokens"]):
            ok = ok and text == r["completion_text"]
        if not ok:
            print("  stream %r: status %d done %s finish %s ids %s text %r" %
                  (r["prompt"], st, done, finish, ids[:8], text[:80]))
        n_ok += ok
    check(n_ok == len(refs), "%s: %d/%d streams concatenate to the reference and end with "
          "[DONE]" % (label, n_ok, len(refs)))


def finish(cl):
    rcs = cl.stop()
    print("exit statuses:", rcs)
    check(rcs.get("coordinator") == 0, "the coordinator exits 0 on SIGTERM")
    check(all(v == 0 for k, v in rcs.items() if k.startswith("worker")),
          "every worker exits 0 on SIGTERM")


# ---------------------------------------------------------------- modes

def mode_exact(args, stages, partition=None, label=""):
    refs = load_ref(args, "stories260K-greedy.json")
    cl = Cluster(args, stages, partition)
    try:
        cl.start()
        exact_checks(cl, refs, label=label)
        finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_long(args):
    ref = load_ref(args, "stories260K-long.json")
    cl = Cluster(args, [{"tp": 2}, {"tp": 2}])
    try:
        cl.start()
        exact_checks(cl, [ref], max_tokens=ref["n_predict"], ignore_eos=True, label="long 480")
        finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_netns(args):
    """Each worker in its own network namespace (harness.NetnsBridge: a veth
    pair each, bridged in the root namespace, which holds the coordinator's
    address)."""
    why = netns_unavailable()
    if why:
        print("SKIP: %s" % why)
        sys.exit(77)
    refs = load_ref(args, "stories260K-greedy.json")
    nb = cl = None
    try:
        nb = NetnsBridge()
        stages = []
        for i in range(2):
            k = nb.add()
            # UCX on this namespace's veth only (harness.NetnsBridge.ucx_devices)
            stages.append({"tp": 2, "host": nb.ip(k), "netns": nb.ns[k], "env": nb.ucx_devices(k)})
        cl = Cluster(args, stages)
        cl.coord_env = nb.ucx_devices()
        cl.start()
        s = cl.stages_json()
        check([x["address"].split(":")[0] for x in s["stages"]] == [st["host"] for st in stages],
              "the stages are at their namespaces' addresses %s" % [x["address"] for x in s["stages"]])
        exact_checks(cl, refs, label="netns PP2xTP2")
        finish(cl)
    finally:
        if cl:
            if FAILS:
                cl.dump_logs()
            cl.kill()
        if nb:
            check(nb.close(), "the namespaces, the bridge and the veths are removed")


def merged_overlap(x, y):
    """Total time (same unit) covered by both interval lists (each sorted by
    start and disjoint, as one stage's forwards are)."""
    i = j = 0
    tot = 0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            tot += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return tot


def settled_stages(cl, timeout=10.0):
    """/v1/stages once the coordinator's stats poll (every 100 ms) has caught
    up with work that ended before this call: after 0.3 s, two readings
    0.15 s apart with the same forward counters and intervals."""
    time.sleep(0.3)
    prev, s = None, None
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = cl.stages_json()
        key = [(x["forwards"], x["forward_intervals"][-1:]) for x in s["stages"]]
        if key == prev:
            break
        prev = key
        time.sleep(0.15)
    return s


def forward_window(s0, s, t0_ns, t1_ns):
    """Each stage's forward intervals inside [t0_ns, t1_ns] (CLOCK_MONOTONIC ns,
    = time.monotonic_ns()) from the settled /v1/stages s, and the forwards
    each stage ran between the settled snapshots s0 (before t0_ns) and s."""
    fw = [b["forwards"] - a["forwards"] for a, b in zip(s0["stages"], s["stages"])]
    iv = [[(a, b) for a, b in x["forward_intervals"] if a >= t0_ns and b <= t1_ns]
          for x in s["stages"]]
    return iv, fw


def mode_microbatch(args):
    """PP 2 x TP 1 (STRATA_MB_LAYOUT), greedy completions of 64 tokens of the
    reference prompts (stories260K-greedy.json), non-streaming so that the
    client's SSE parsing does not compete for the CPUs.
    Functional: every completion has 64 tokens equal to the reference.
    Overlap (the proof that micro-batches pipeline): each stage reports the
    [start, end) CLOCK_MONOTONIC times of its forwards (GET /v1/stages
    forward_intervals); the time in which stage 0 and stage 1 both run a
    forward is intersected from them. One sequence has one micro-batch in
    flight, which cannot be on two stages at once: overlap ~0 (< 1% of the
    shorter busy time; in fact exactly 0, by causality: this proves the
    measurement). 8 concurrent sequences (the default max_inflight = 2
    micro-batches of 4): overlap > 0, and >= 2% of the shorter stage's busy
    time summed over 5 runs. Why not more: on stories260K a 4-token forward
    (~0.1-0.3 ms) is about as long as a hop (UCX over loopback TCP plus the
    wake-ups, ~0.05-0.1 ms), so the two micro-batches' relative phase, which
    nothing pins, decides how much they overlap: per run 30-70% on a quiet
    2-core VM (sums over 5 runs 33-59%), but 1-60% (median 5% Release, 10%
    Asan) while other processes load it, which delays the hops' wake-ups.
    Throughput: decode tok/s for 1 (best of 3 runs) and for 8 sequences (best
    of 5), and their ratio: printed only (a figure, also in
    bench/cluster_bench.sh), because on a small shared machine it depends on
    the load."""
    refs = load_ref(args, "stories260K-greedy.json")
    layout = os.environ.get("STRATA_MB_LAYOUT", "1,1").split(",")
    cl = Cluster(args, [{"tp": int(t)} for t in layout],
                 extra_cfg="max_seqs = 64\n" + os.environ.get("STRATA_MB_CFG", ""))
    n_tok = 64
    try:
        cl.start()

        def req(i):
            return {"prompt": refs[i % len(refs)]["prompt"], "max_tokens": n_tok,
                    "temperature": 0, "return_token_ids": True}

        def run(first, n_seq):
            """n_seq concurrent completions of refs[first..]; returns (n exact,
            tok/s, tokens, intervals per stage, forwards per stage)."""
            s0 = settled_stages(cl)
            t0_ns = time.monotonic_ns()
            t0 = time.time()
            idx = [(first + k) % len(refs) for k in range(n_seq)]
            res = run_concurrent([lambda i=i: cl.complete(req(i)) for i in idx])
            dt = time.time() - t0
            t1_ns = time.monotonic_ns()
            n_ok, toks = 0, 0
            for i, r in zip(idx, res):
                if not r or r[0] != 200:
                    print("  prompt %d: %s" % (i, r and json.dumps(r[1])[:400]))
                    continue
                ch = r[1]["choices"][0]
                toks += r[1]["usage"]["completion_tokens"]
                ok = (r[1]["usage"]["completion_tokens"] == n_tok and
                      ch.get("token_ids") == refs[i]["completion_tokens"][:n_tok])
                if not ok:
                    print("  prompt %d: token_ids %s" % (i, ch.get("token_ids", [])[:12]))
                n_ok += ok
            iv, fw = forward_window(s0, settled_stages(cl), t0_ns, t1_ns)
            return n_ok, toks / dt, toks, iv, fw

        def overlap_figures(iv):
            busy = [sum(b - a for a, b in v) for v in iv]
            ov = merged_overlap(iv[0], iv[1]) if len(iv) >= 2 else 0
            short = min(busy[:2]) if len(busy) >= 2 else 0
            return ov, busy, (ov / short if short else 0.0)

        singles = [run(k, 1) for k in range(3)]
        check(all(r[0] == 1 and r[2] == n_tok for r in singles),
              "single sequences complete with the reference's %d tokens" % n_tok)
        multis = [run(2 * k, 8) for k in range(5)]
        check(all(r[0] == 8 and r[2] == 8 * n_tok for r in multis),
              "8 concurrent sequences complete with the reference's %d tokens each" % n_tok)
        for label, runs in (("1 sequence", singles), ("8 sequences", multis)):
            check(all(len(v) == n and n > 0 for r in runs for v, n in zip(r[3], r[4])),
                  "%s: every stage reports an interval for each of its forwards (%s)"
                  % (label, [r[4] for r in runs]))
            check(all(a < b for r in runs for v in r[3] for a, b in v) and
                  all(v[k][1] <= v[k + 1][0] for r in runs for v in r[3]
                      for k in range(len(v) - 1)),
                  "%s: each stage's intervals are ordered and disjoint" % label)

        single = max(r[1] for r in singles)
        multi = max(r[1] for r in multis)
        print("FIGURE decode tok/s (completion tokens / wall time, %d tokens each, PP 2 x TP 1): "
              "1 sequence %s, 8 sequences %s; best %.1f vs %.1f: ratio %.2fx (printed, not "
              "asserted)" %
              (n_tok, ["%.0f" % r[1] for r in singles], ["%.0f" % r[1] for r in multis],
               single, multi, multi / single if single else 0))

        for label, runs in (("1 sequence", singles), ("8 sequences", multis)):
            for r in runs:
                ov, busy, frac = overlap_figures(r[3])
                print("FIGURE overlap, %s: stage busy %s ms over %s forwards, both stages "
                      "computing %.3f ms = %.1f%% of the shorter busy time" %
                      (label, ["%.2f" % (b / 1e6) for b in busy], r[4], ov / 1e6, 100 * frac))
        sfr = [overlap_figures(r[3])[2] for r in singles]
        mfr = [overlap_figures(r[3])[2] for r in multis]
        check(all(f < 0.01 for f in sfr),
              "1 sequence: the stages never compute at once (overlap %s < 1%%)"
              % ["%.2f%%" % (100 * f) for f in sfr])
        ov_all = sum(overlap_figures(r[3])[0] for r in multis)
        short_all = sum(min(overlap_figures(r[3])[1][:2]) for r in multis)
        frac_all = ov_all / short_all if short_all else 0.0
        print("FIGURE overlap, 8 sequences, 5 runs: %.3f ms of %.3f ms = %.1f%% (per run %s)" %
              (ov_all / 1e6, short_all / 1e6, 100 * frac_all,
               ["%.1f%%" % (100 * f) for f in mfr]))
        check(ov_all > 0 and frac_all >= 0.02,
              "8 sequences: both stages compute at once (overlap %.3f ms = %.1f%% >= 2%% of the "
              "shorter stage's busy time over 5 runs)" % (ov_all / 1e6, 100 * frac_all))
        finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_cancel(args):
    cl = Cluster(args, [{"tp": 2}, {"tp": 2}])
    try:
        cl.start()
        s0 = cl.stages_json()
        free0 = s0["kv_blocks_free"]
        check(free0 == s0["kv_blocks_total"] and free0 > 0, "all %d KV blocks free at start" % free0)
        # A long streaming request; disconnect after a few chunks.
        req = {"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True,
               "temperature": 0, "stream": True}
        sock = socket.create_connection(("127.0.0.1", cl.http_port), timeout=30)
        body = json.dumps(req).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        deadline = time.time() + 30
        while got.count(b"data: ") < 5 and time.time() < deadline:
            d = sock.recv(4096)
            if not d:
                break
            got += d
        check(got.count(b"data: ") >= 5, "the stream started (%d chunks read)" % got.count(b"data: "))
        mid = cl.stages_json()
        check(mid["kv_blocks_free"] < free0,
              "KV blocks in use mid-stream (%d free of %d)" % (mid["kv_blocks_free"], free0))
        sock.close()
        freed = False
        deadline = time.time() + 20
        while time.time() < deadline:
            s = cl.stages_json()
            if s["kv_blocks_free"] == free0 and s["requests_running"] == 0:
                freed = True
                break
            time.sleep(0.1)
        check(freed, "after the disconnect the free KV block count returns to %d (now %d)"
              % (free0, s["kv_blocks_free"]))
        check(eventually(lambda: "cancelling" in open(cl.co_log).read()), "the coordinator logged the cancellation")
        # Still serving, exactly.
        ref = load_ref(args, "stories260K-greedy.json")[0]
        st, b = cl.complete({"prompt": ref["prompt"], "max_tokens": 64, "temperature": 0,
                             "return_token_ids": True})
        check(st == 200 and b["choices"][0]["token_ids"] == ref["completion_tokens"],
              "a completion after the cancellation is exact")
        check(cl.stages_json()["kv_blocks_free"] == free0, "and frees its blocks too")
        finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_hang(args):
    # Static recovery holds the stream while waiting for the stopped worker;
    # it never comes back, so the stream ends with the error after 3 s.
    cl = Cluster(args, [{"tp": 1}, {"tp": 1}], coord_args=["--recovery-timeout", "3"])
    victim = None
    try:
        cl.start()
        victim = [p for n, p in cl.procs if n == "worker1"][0]
        req = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True,
               "temperature": 0, "stream": True}
        c = cl.conn(300)
        c.request("POST", "/v1/completions", body=json.dumps(req).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        n, errors, done, stopped = 0, [], False, False
        for ch in sse_events(r):
            if ch is None:
                done = True
                break
            if "error" in ch:
                errors.append(ch["error"]["message"])
                continue
            n += 1
            if n == 20 and not stopped:
                os.kill(victim.pid, signal.SIGSTOP)
                stopped = True
        c.close()
        print("stream: %d chunks, errors %s, [DONE] %s" % (n, errors, done))
        check(stopped and n < req["max_tokens"], "worker1 stopped mid-stream")
        check(done and len(errors) == 1 and "stage 1" in errors[0] and "hung" in errors[0],
              "the stream ends with one error event naming stage 1 hung, then [DONE]")
        st, _ = cl.get("/health")
        check(st == 503, "/health answers 503 after the hang (%d)" % st)
    finally:
        if victim is not None and victim.poll() is None:
            os.kill(victim.pid, signal.SIGCONT)
            os.kill(victim.pid, signal.SIGKILL)
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_restart(args, stop=False, fail=False):
    """Static recovery: PP 2, 5 greedy SSE streams of 200 tokens; the worker of
    stage 1 is SIGKILLed once every stream has 20 tokens and started again on
    its port (stop: SIGSTOPped, and SIGCONTed once the coordinator logged the
    hold, i.e. found it hung; at most 60 s later; fail: its stage fails for
    good, as when its NCCL communicator is aborted, through the test-only
    STRATA_TEST_STAGE_FAIL_FILE, removed once the coordinator logged the hold,
    so the stage the worker loads again serves); every stream ends
    with [DONE], no error event, and the tokens of a run with no failure."""
    n_tok, kill_at = 200, 20
    stopped = []
    prompts = [r["prompt"] for r in load_ref(args, "stories260K-greedy.json")[:5]]
    fail_file = os.path.join(tempfile.gettempdir(), "strata-fail-stage-%d" % os.getpid())
    stage1 = {"tp": 1, "env": {"STRATA_TEST_STAGE_FAIL_FILE": fail_file}} if fail else {"tp": 1}
    cl = Cluster(args, [{"tp": 1}, stage1], coord_args=["--recovery-timeout", "120"])
    try:
        cl.start()
        base = stream_all(cl.http_port, prompts, n_tok)
        check(all(o[0] and not o[2] and len(o[1]) == n_tok for o in base),
              "no-failure run: %d streams of %d tokens, [DONE], no error event"
              % (len(prompts), n_tok))
        base = [o[1] for o in base]
        lock = threading.Lock()
        at = []

        def on_progress(progress):
            with lock:
                if not at and min(progress) >= kill_at:
                    victim = [p for n, p in cl.procs if n == "worker1"][0]
                    if fail:
                        open(fail_file, "w").close()

                        def heal():
                            deadline = time.time() + 60
                            while time.time() < deadline:
                                with open(cl.co_log, errors="replace") as f:
                                    if any("recovery:" in l and "holding" in l for l in f):
                                        break
                                time.sleep(0.02)
                            os.unlink(fail_file)
                        t = threading.Thread(target=heal)
                        t.start()
                        stopped.append(None)
                        stopped.append(t)
                    elif stop:
                        os.kill(victim.pid, signal.SIGSTOP)
                        stopped.append(victim)

                        def cont():
                            deadline = time.time() + 60
                            while time.time() < deadline:
                                with open(cl.co_log, errors="replace") as f:
                                    if any("recovery:" in l and "holding" in l for l in f):
                                        break
                                time.sleep(0.1)
                            os.kill(victim.pid, signal.SIGCONT)
                        t = threading.Thread(target=cont)
                        t.start()
                        stopped.append(t)
                    else:
                        victim.kill()
                        victim.wait(30)
                        cl.restart_worker(1)
                    at.append(list(progress))
        out = stream_all(cl.http_port, prompts, n_tok, on_progress)
        print("worker1 %s with the streams at %s tokens"
              % ("failed" if fail else "stopped until found hung" if stop else "killed and restarted",
                 at[0] if at else "-"),
              flush=True)
        check(bool(at) and max(at[0]) < n_tok,
              "worker1 %s mid-stream" % ("failed" if fail else "stopped" if stop else "killed"))
        check_streams(out, base)

        def recovery_steps():
            with open(cl.co_log, errors="replace") as f:
                return [l.rstrip() for l in f if "recovery:" in l]
        # the log's last step may trail the streams' end: wait for it
        eventually(lambda: any("resumed %d request(s)" % len(prompts) in l for l in recovery_steps()))
        steps = recovery_steps()
        print("\n".join(steps))
        if stop:
            stopped[1].join(70)
            check(any("stage 1" in l and "hung" in l and "holding" in l for l in steps),
                  "the loss is the per-batch deadline's (stage 1 hung)")
        if fail:
            stopped[1].join(70)
            check(any("stage 1" in l and "failed (" in l and "communicator aborted" in l and "holding" in l
                      for l in steps), "the loss is the stage's own report (BatchError.stage_failed)")

            def reloaded():
                with open(os.path.join(cl.tmp, "worker1.log"), errors="replace") as f:
                    wl = f.read()
                return "failed for good" in wl and wl.count(" ready in ") >= 2
            check(eventually(reloaded),
                  "worker1 reported its stage lost and loaded it again")
        check(any("stage 1" in l and "holding" in l for l in steps) and
              any("resumed %d request(s)" % len(prompts) in l for l in steps),
              "the coordinator logs the hold and the resume with the request ids")
        st, _ = cl.get("/health")
        check(st == 200, "/health 200 after the recovery (%d)" % st)
        again = stream_all(cl.http_port, prompts[:2], 32)
        check(all(o[0] and not o[2] and o[1] == b[:32] for o, b in zip(again, base)),
              "new requests after the recovery equal the no-failure run")
        finish(cl)
    finally:
        if stopped and stopped[0] is not None:
            if stopped[0].poll() is None:
                os.kill(stopped[0].pid, signal.SIGCONT)
        if fail and os.path.exists(fail_file):
            os.unlink(fail_file)
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_bad_input(args):
    ref = load_ref(args, "stories260K-greedy.json")[0]
    cl = Cluster(args, [{"tp": 2}, {"tp": 2}])
    try:
        cl.start()
        n_ctx = cl.stages_json()["n_ctx"]
        bad = [
            ("malformed JSON", b'{"prompt": "x", '),
            ("not an object", b'[1, 2]'),
            ("missing prompt", b'{"max_tokens": 4}'),
            ("prompt not a string", b'{"prompt": 12}'),
            ("max_tokens 0", b'{"prompt": "x", "max_tokens": 0}'),
            ("max_tokens negative", b'{"prompt": "x", "max_tokens": -3}'),
            ("max_tokens beyond the context",
             b'{"prompt": "x", "max_tokens": %d}' % (n_ctx + 1)),
            ("prompt + max_tokens beyond the context",
             b'{"prompt": "Once upon a time", "max_tokens": %d}' % (n_ctx - 2)),
            ("max_tokens a string", b'{"prompt": "x", "max_tokens": "4"}'),
            ("temperature a string", b'{"prompt": "x", "temperature": "hot"}'),
            ("stream not a boolean", b'{"prompt": "x", "stream": 1}'),
            ("stop a number", b'{"prompt": "x", "stop": 5}'),
            ("ignore_eos not a boolean", b'{"prompt": "x", "ignore_eos": "yes"}'),
            ("invalid UTF-8", b'{"prompt": "\xff\xfe"}'),
        ]
        for what, body in bad:
            st, b = cl.post_raw(body)
            try:
                e = json.loads(b)["error"]
                shaped = all(k in e for k in ("message", "type", "param", "code"))
            except (ValueError, KeyError, TypeError):
                shaped = False
            check(st == 400 and shaped, "%s -> %d with an OpenAI error body" % (what, st))
        # Random bytes to each worker's data port.
        rnd = random.Random(5)
        for host, port in cl.worker_addrs:
            for n in (1, 64, 4096):
                try:
                    s = socket.create_connection((host, port), timeout=5)
                    s.sendall(bytes(rnd.getrandbits(8) for _ in range(n)))
                    time.sleep(0.1)
                    s.close()
                except OSError as e:
                    print("  (socket to %s:%d: %s)" % (host, port, e))
        time.sleep(0.5)
        for name, p in cl.procs:
            check(p.poll() is None, "%s still running after random bytes" % name)
        st, b = cl.complete({"prompt": ref["prompt"], "max_tokens": 64, "temperature": 0,
                             "return_token_ids": True})
        check(st == 200 and b["choices"][0]["token_ids"] == ref["completion_tokens"],
              "the next completion returns the reference tokens")
        st, _ = cl.get("/health")
        check(st == 200, "/health is still 200")
        finish(cl)
    finally:
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_unreachable(args):
    """A worker that is not there: the coordinator exits 1 naming it."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="strata-cluster-")
    path = os.path.join(tmp, "c.ini")
    with open(path, "w") as f:
        f.write("[cluster]\nmodel = %s\n[stage.0]\naddress = 127.0.0.1:%d\n" %
                (os.path.join(args.shared, "models", "stories260K.gguf"), port))
    env = dict(os.environ)
    env.setdefault("UCX_TLS", "tcp")
    r = subprocess.run([args.coordinator, "--config", path, "--listen", "127.0.0.1:%d" % free_port(),
                        "--ready-timeout", "12"], capture_output=True, text=True, timeout=60, env=env)
    check(r.returncode == 1, "unreachable worker: exit status %d" % r.returncode)
    m = re.search(r"127\.0\.0\.1:%d is unreachable after 12 s \(([0-9]+) connection\(s\) failed; last: " % port,
                  r.stderr)
    check(bool(m) and int(m.group(1)) >= 20,
          "the error names the unreachable stage and counts the failed connections: %r"
          % r.stderr.strip().splitlines()[-1:])
    # Retries every 0.25 s: the 20th failure in a row gets one warning.
    warns = re.findall(r"127\.0\.0\.1:%d: ([0-9]+) connections in a row failed before the stage was ready"
                       % port, r.stderr)
    check(warns == ["20"], "one warning at the 20th failed connection in a row: %r" % warns)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--shared", default=os.environ.get("STRATA_SHARED", "../shared"))
    args = ap.parse_args()
    m = args.mode
    if m == "exact-pp2-tp2":
        mode_exact(args, [{"tp": 2}, {"tp": 2}], label="PP2xTP2")
    elif m == "exact-pp5":
        mode_exact(args, [{"tp": 1}] * 5, label="PP5xTP1")
    elif m == "exact-pp3-221":
        mode_exact(args, [{"tp": 1}] * 3, partition="2,2,1", label="PP3 2,2,1")
    elif m == "long":
        mode_long(args)
    elif m == "netns":
        mode_netns(args)
    elif m == "microbatch":
        mode_microbatch(args)
    elif m == "cancel":
        mode_cancel(args)
    elif m == "bad-input":
        mode_bad_input(args)
    elif m == "unreachable":
        mode_unreachable(args)
    elif m == "hang":
        mode_hang(args)
    elif m == "restart":
        mode_restart(args)
    elif m == "stop-resume":
        mode_restart(args, stop=True)
    elif m == "stage-failed":
        mode_restart(args, fail=True)
    else:
        print("unknown mode", m)
        return 2
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
