#!/usr/bin/python3
"""kv_bench.py — issue 15's KV scheduling figures (a benchmark: figures, not
pass/fail); bench/kv_bench.sh runs it. See kv_bench.sh for the workloads.

For each build (--build NAME=DIR, in order) it starts a static PP 2 cluster
(strata-coordinator + two strata-worker processes on loopback, TP 1,
--threads each) on stories260K with a fixed KV pool, runs the workload with
--clients closed-loop streaming clients (each sends its next request when the
previous one ended) and prints:
  requests/s      requests completed / wall time
  tokens/s        completion tokens / wall time
  mean running    GET /v1/stages requests_running, sampled every 50 ms
  TTFT p50/p99    request sent -> first token chunk (client side)
  preemptions     /metrics strata_preemptions_total (builds that have it)
and, for the shared-system-prompt workload, prefill tokens/s = prompt tokens
of the completed requests / wall time, and the tokens the stages prefilled
(/metrics strata_prefill_tokens_computed_total, where the build has it).
Every process is stopped by pid; every wait is bounded.
"""
import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from harness import free_port, http_get, reap, sse_events  # noqa: E402

WORDS = ("the cat sat on a mat and looked at the big red ball while her friend Tom ran in the park "
         "with a little dog under the warm sun after the rain one day Lily found a shiny stone "
         "near the old tree").split()
SYSTEM = ("You are a helpful storyteller for young children. Always answer in simple words. "
          "Tell stories about animals, friends, parks, toys, the sun and the rain. Each story has "
          "a beginning, a middle and a happy end. Keep sentences short. Use the names Lily, Tom, "
          "Sue, Max and Ben. Never use scary things. The stories are kind and gentle, and every "
          "child in them learns something about sharing, helping or being brave. Once upon a "
          "time there was a little girl who liked to play in the garden with her dog. One day "
          "she found a shiny stone near the tree and showed it to her mom, who smiled. ")


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def metric(port, name):
    try:
        st, body = http_get(port, "/metrics", 10)
    except OSError:
        return None
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


class Cluster:
    def __init__(self, build, model, kv_blocks, threads, extra_args=()):
        self.tmp = tempfile.mkdtemp(prefix="strata-kvbench-")
        self.procs = []
        env = dict(os.environ)
        env.setdefault("UCX_TLS", "tcp")
        env.setdefault("UCX_NET_DEVICES", "lo")  # loopback only (tests may add bridges)
        cfg = ["[cluster]", "model = %s" % model, "kv_blocks = %d" % kv_blocks, "kv_block_size = 16",
               "max_seqs = 64", "max_queue = 1024"]
        worker = os.path.join(build, "daemon", "strata-worker")
        # Builds since issue 14 load models only from --model-dir; older
        # ones refuse it without --coordinator: try it, else go without.
        wargs = ["--model-dir", os.path.dirname(os.path.abspath(model))]
        probe = subprocess.Popen([worker, "--listen", "127.0.0.1:%d" % free_port()] + wargs,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            probe.wait(1.0)
            wargs = []
        except subprocess.TimeoutExpired:
            probe.send_signal(signal.SIGTERM)
            reap([("probe", probe)])
        for i in range(2):
            port = free_port()
            log = open(os.path.join(self.tmp, "worker%d.log" % i), "w")
            p = subprocess.Popen([worker, "--listen", "127.0.0.1:%d" % port, "--threads", str(threads),
                                  "--name", "w%d" % i] + wargs,
                                 stdout=log, stderr=subprocess.STDOUT, env=env)
            self.procs.append(("worker%d" % i, p))
            cfg += ["[stage.%d]" % i, "address = 127.0.0.1:%d" % port, "tp = 1"]
        path = os.path.join(self.tmp, "cluster.ini")
        with open(path, "w") as f:
            f.write("\n".join(cfg) + "\n")
        self.port = free_port()
        log = open(os.path.join(self.tmp, "coordinator.log"), "w")
        p = subprocess.Popen([os.path.join(build, "coordinator", "strata-coordinator"), "--config", path,
                              "--listen", "127.0.0.1:%d" % self.port] + list(extra_args),
                             stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(("coordinator", p))
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if http_get(self.port, "/health", 5)[0] == 200:
                    return
            except OSError:
                pass
            if p.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("cluster did not become healthy (logs in %s)" % self.tmp)

    def cpu_seconds(self):
        """User + system CPU seconds of the coordinator and the workers so far."""
        tck = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for _, p in self.procs:
            try:
                with open("/proc/%d/stat" % p.pid) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tck
            except (OSError, IndexError, ValueError):
                pass
        return total

    def stop(self):
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        reap(list(reversed(self.procs)))


def stream_one(port, req):
    """(ttft s or None, completion tokens, prompt tokens, ok). req["_end_after"]
    (client side, not sent): the client closes the stream after that many
    tokens, as an end-of-generation token would end it (the server cancels)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    ttft = None
    ntok = 0
    usage = None
    end_after = req.get("_end_after")
    try:
        body = {"stream": True, "temperature": 0, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        body.update({k: v for k, v in req.items() if not k.startswith("_")})
        c.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return None, 0, 0, False
        for ch in sse_events(r):
            if ch is None:
                break
            if ch.get("usage"):
                usage = ch["usage"]
            if ch.get("choices"):
                if ttft is None:
                    ttft = time.monotonic() - t0
                ntok += 1
                if end_after is not None and ntok >= end_after:
                    return ttft, ntok, 0, True
        if usage:
            ntok = usage["completion_tokens"]
            return ttft, ntok, usage["prompt_tokens"], True
        return ttft, 0, 0, False
    finally:
        c.close()


def run_workload(cl, reqs, clients):
    """Closed loop: clients threads take the requests in order. Stats dict."""
    lock = threading.Lock()
    nxt = [0]
    res = []
    running = []
    done = threading.Event()

    def sampler():
        while not done.is_set():
            try:
                st, body = http_get(cl.port, "/v1/stages", 5)
                if st == 200:
                    running.append(json.loads(body)["requests_running"])
            except (OSError, ValueError, KeyError):
                pass
            done.wait(0.05)

    def client():
        while True:
            with lock:
                if nxt[0] >= len(reqs):
                    return
                q = reqs[nxt[0]]
                nxt[0] += 1
            r = stream_one(cl.port, q)
            with lock:
                res.append(r)

    pre0 = metric(cl.port, "strata_preemptions_total")
    fill0 = metric(cl.port, "strata_prefill_tokens_computed_total")
    hit0 = metric(cl.port, "strata_prefix_cache_hits_total")
    cpu0 = cl.cpu_seconds()
    smp = threading.Thread(target=sampler)
    smp.start()
    t0 = time.monotonic()
    ts = [threading.Thread(target=client) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(3600)
    wall = time.monotonic() - t0
    done.set()
    smp.join(10)
    ok = [r for r in res if r[3]]
    cpu = cl.cpu_seconds() - cpu0
    try:
        stages = json.loads(http_get(cl.port, "/v1/stages", 10)[1])
    except (OSError, ValueError):
        stages = {}
    pre1 = metric(cl.port, "strata_preemptions_total")
    fill1 = metric(cl.port, "strata_prefill_tokens_computed_total")
    hit1 = metric(cl.port, "strata_prefix_cache_hits_total")
    return {
        "wall": wall, "ok": len(ok), "failed": len(res) - len(ok),
        "req_s": len(ok) / wall, "tok_s": sum(r[1] for r in ok) / wall,
        "prompt_tok_s": sum(r[2] for r in ok) / wall,
        "prompt_tokens": sum(r[2] for r in ok),
        "mean_running": sum(running) / len(running) if running else float("nan"),
        "ttft": [r[0] for r in ok if r[0] is not None],
        "preemptions": None if pre0 is None or pre1 is None else pre1 - pre0,
        "prefilled": None if fill0 is None or fill1 is None else fill1 - fill0,
        "hits": None if hit0 is None or hit1 is None else hit1 - hit0,
        "cpu": cpu, "batches": stages.get("batches_launched", 0),
        "rtt_ms": stages.get("batch_round_trip_ms", float("nan")),
    }


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def show(name, s):
    extra = ""
    if s["preemptions"] is not None:
        extra += ", %d preemptions" % s["preemptions"]
    if s["prefilled"] is not None:
        extra += ", %d tokens prefilled" % s["prefilled"]
    print("  %-8s %3d ok %d failed in %6.1f s: %5.2f req/s, %7.1f tok/s, mean running %5.1f, "
          "TTFT p50 %6.0f ms p99 %6.0f ms; %.1f CPU s, %d batches, round trip %.2f ms%s"
          % (name, s["ok"], s["failed"], s["wall"], s["req_s"], s["tok_s"], s["mean_running"],
             1e3 * pct(s["ttft"], 50), 1e3 * pct(s["ttft"], 99), s["cpu"], s["batches"], s["rtt_ms"],
             extra), flush=True)


def show_prefix(name, s):
    fill = ("%d tokens prefilled by the stages, %d from the cache" % (s["prefilled"], s["hits"] or 0)
            if s["prefilled"] is not None else "(no prefill counter)")
    print("  %-20s %3d ok in %5.1f s: TTFT p50 %6.1f ms p99 %6.1f ms, prefill %8.1f prompt tok/s, "
          "%.1f CPU s; %s" % (name, s["ok"], s["wall"], 1e3 * pct(s["ttft"], 50), 1e3 * pct(s["ttft"], 99),
                               s["prompt_tok_s"], s["cpu"], fill), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=True, help="NAME=DIR, in order")
    ap.add_argument("--shared", required=True)
    ap.add_argument("--kv-blocks", type=int, default=512)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--prompt-min", type=int, default=50)
    ap.add_argument("--prompt-max", type=int, default=500)
    ap.add_argument("--max-tokens-min", type=int, default=200)
    ap.add_argument("--max-tokens-max", type=int, default=1000)
    ap.add_argument("--prefix-requests", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    model = os.path.join(a.shared, "models", "stories260K.gguf")
    builds = [b.split("=", 1) for b in a.build]

    # Token counts of the word prompts, measured once (usage.prompt_tokens).
    cl = Cluster(builds[-1][1], model, a.kv_blocks, a.threads)
    try:
        _, _, n100, ok = stream_one(cl.port, {"prompt": words(random.Random(0), 100), "max_tokens": 1})
        _, _, nsys, ok2 = stream_one(cl.port, {"prompt": SYSTEM, "max_tokens": 1})
    finally:
        cl.stop()
    if not (ok and ok2):
        raise SystemExit("calibration failed")
    per_word = n100 / 100.0
    rng = random.Random(a.seed)
    mixed = []
    for _ in range(a.requests):
        pt = rng.randint(a.prompt_min, a.prompt_max)
        mixed.append({"prompt": words(rng, max(1, int(round(pt / per_word)))),
                      "max_tokens": rng.randint(a.max_tokens_min, a.max_tokens_max)})
    shared = [{"prompt": SYSTEM + words(rng, rng.randint(8, 24)) + ".", "max_tokens": 8}
              for _ in range(a.prefix_requests)]
    print("stories260K (n_ctx 2048), PP 2 (TP 1, %d thread(s) per worker), KV pool %d blocks x 16 "
          "tokens = %d tokens per stage" % (a.threads, a.kv_blocks, a.kv_blocks * 16))
    print("mixed: %d requests, prompt %d..%d tokens (%.2f tokens/word), max_tokens %d..%d, each "
          "running to max_tokens (ignore_eos), %d closed-loop clients, greedy" % (a.requests, a.prompt_min, a.prompt_max,
                                                            per_word, a.max_tokens_min, a.max_tokens_max,
                                                            a.clients))
    for name, d in builds:
        cl = Cluster(d, model, a.kv_blocks, a.threads)
        try:
            show(name, run_workload(cl, mixed, a.clients))
        finally:
            cl.stop()
    # The same requests, but each ends (as at an end-of-generation token)
    # after 10..60% of its max_tokens: the client closes the stream.
    early = [dict(q, _end_after=max(1, int(q["max_tokens"] * rng.uniform(0.1, 0.6)))) for q in mixed]
    print("mixed, ending early: the same requests, each stream closed by the client after 10..60%% of "
          "its max_tokens (%d tokens on average)" % (sum(q["_end_after"] for q in early) / len(early)))
    for name, d in builds:
        cl = Cluster(d, model, a.kv_blocks, a.threads)
        try:
            show(name, run_workload(cl, early, a.clients))
        finally:
            cl.stop()
    print("shared system prompt: %d requests of the %d-token system prompt + 8..24 words, "
          "max_tokens 8, %d clients" % (a.prefix_requests, nsys, a.clients))
    runs = [(n + " (caching on)" if n == builds[-1][0] else n, d, []) for n, d in builds]
    runs.append((builds[-1][0] + " (caching off)", builds[-1][1], ["--no-prefix-caching"]))
    for name, d, extra in runs:
        cl = Cluster(d, model, a.kv_blocks, a.threads, extra)
        try:
            show_prefix(name, run_workload(cl, shared, a.clients))
        finally:
            cl.stop()


if __name__ == "__main__":
    main()
