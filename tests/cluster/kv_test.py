#!/usr/bin/python3
"""kv_test.py — issue 15's KV scheduling with real processes: a static PP 2
strata-coordinator and two strata-worker processes on loopback (stories260K,
n_ctx 2048), driven over HTTP.

  kv_test.py MODE --coordinator BIN --worker BIN --shared DIR

MODE
  preempt   kv_blocks = 40 of 16 tokens (640 tokens) and 8 concurrent greedy
            streams of 150 tokens (ignore_eos): up to 8 x 11 blocks would be
            needed at once, each alone needs at most 11. Every stream ends
            with [DONE], no error event, and the tokens of that prompt run
            alone; /metrics counts preemptions; /v1/stages's free blocks
            return to the pool size. Then again with --no-prefix-caching.
            A request whose prompt + max_tokens exceeds the whole pool gets a
            400 naming the blocks; a chat request without max_tokens is served
            (nothing reserved up front).
  prefix    16 requests sharing a ~300-token system prompt (each its own
            question), greedy, 24 tokens: the first alone, then the other 15
            at once. From /metrics: prefix cache queries = the prompt tokens,
            hits = for each request the full 16-token blocks of its longest
            common prefix with another request (the same for any order of
            arrival, checked), prefill tokens computed = queries - hits.
            Then the same on a cluster started with --no-prefix-caching: the
            same completions, no hits, every prompt token prefilled.

  restart   static recovery with the prefix cache: PP 2, 5 greedy streams of
            120 tokens sharing the system prompt, run once (filling the
            cache), then again: mid-stream (20 tokens each) stage 1's worker
            is SIGKILLed and restarted on its port. Its KV cache is empty, so
            the coordinator forgets its prefix cache before resuming: every
            stream ends with the tokens of the first run; requests afterwards
            map the cache again (hits counted) and are still identical.

Every process is started and always stopped by the test, by pid; every wait
is bounded; no timing is asserted.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import FAILS, check, check_streams, stream_all  # noqa: E402
from cluster_test import Cluster, load_ref, run_concurrent  # noqa: E402

BS = 16


def metrics(cl):
    st, body = cl.get("/metrics")
    vals = {}
    for line in body.decode().splitlines():
        if line.startswith("strata_") and " " in line and "{" not in line:
            k, v = line.split()
            vals[k] = float(v)
    return vals


def chat_no_max_tokens(cl, text):
    """A chat completion without max_tokens: (status, body)."""
    c = cl.conn()
    try:
        body = {"messages": [{"role": "user", "content": text}], "temperature": 0}
        c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def preempt_run(args, prompts, n_tok, coord_args, alone=None):
    """8 streams at once on a 40-block pool (each prompt alone first when
    alone is None): the alone completions."""
    label = "caching off: " if coord_args else "caching on: "
    cl = Cluster(args, [{"tp": 1}, {"tp": 1}], kv_blocks=40, extra_cfg="kv_block_size = 16",
                 coord_args=coord_args)
    try:
        cl.start()
        sj = cl.stages_json()
        check(sj["kv_blocks_total"] == 40 and sj["kv_blocks_free"] == 40,
              "%sthe pool: 40 blocks, all free (%d, %d)" % (label, sj["kv_blocks_total"], sj["kv_blocks_free"]))
        if alone is None:
            alone = []
            for p in prompts:
                out = stream_all(cl.http_port, [p], n_tok)
                alone.append(out[0][1])
                check(out[0][0] and not out[0][2] and len(out[0][1]) == n_tok,
                      "alone: %d tokens, [DONE], no error" % n_tok)
            check(metrics(cl).get("strata_preemptions_total", -1) == 0, "no preemption running alone")
        out = stream_all(cl.http_port, prompts, n_tok)
        check_streams(out, alone, label + "8 at once: ")
        m = metrics(cl)
        print("metrics: %s" % {k: v for k, v in m.items() if "preempt" in k or "prefix" in k or "kv_" in k})
        check(m.get("strata_preemptions_total", 0) >= 1,
              "%spreemptions happened and are counted: strata_preemptions_total %s"
              % (label, m.get("strata_preemptions_total")))
        sj = cl.stages_json()
        check(sj["kv_blocks_free"] == 40, "%severy block back in the pool: %d free" % (label, sj["kv_blocks_free"]))
        check(sj["kv"]["preemptions"] == m.get("strata_preemptions_total") and sj["kv"]["usage"] == 0.0,
              "%s/v1/stages shows the preemptions and a usage of 0: %s" % (label, sj["kv"]))
        if coord_args:
            check(sj["kv"]["prefix_cache_hit_tokens"] == 0 and sj["kv"]["blocks_cached"] == 0,
                  "caching off: no hits, nothing cached")
        else:
            # Could never fit, even alone: 400 naming the blocks.
            st, body = cl.complete({"prompt": prompts[0], "max_tokens": 700})
            msg = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
            check(st == 400 and "KV blocks but the cluster has 40" in msg,
                  "prompt + max_tokens beyond the pool: 400 (%d %r)" % (st, msg))
            # A chat request without max_tokens reserves nothing up front: it
            # runs (at most until the pool is full, alone).
            st, body = chat_no_max_tokens(cl, "Tell me a story about a cat.")
            fin = body.get("choices", [{}])[0].get("finish_reason") if st == 200 else None
            check(st == 200 and fin in ("stop", "length") and
                  body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] <= 640,
                  "chat without max_tokens on a 640-token pool: 200, finish %s, usage %s"
                  % (fin, body.get("usage")))
    finally:
        rcs = cl.stop()
        check(all(v == 0 for v in rcs.values()), "every process exits 0 on SIGTERM: %s" % rcs)
        if FAILS:
            cl.dump_logs()
    return alone


def mode_preempt(args):
    refs = load_ref(args, "stories260K-greedy.json")
    prompts = [r["prompt"] for r in refs[:8]]
    alone = preempt_run(args, prompts, 150, [])
    preempt_run(args, prompts, 150, ["--no-prefix-caching"], alone)


SYSTEM = ("You are a helpful storyteller for young children. Always answer in simple words. "
          "Tell stories about animals, friends, parks, toys, the sun and the rain. Each story has "
          "a beginning, a middle and a happy end. Keep sentences short. Use the names Lily, Tom, "
          "Sue, Max and Ben. Never use scary things. The stories are kind and gentle, and every "
          "child in them learns something about sharing, helping or being brave. Once upon a "
          "time there was a little girl who liked to play in the garden with her dog. One day "
          "she found a shiny stone near the tree and showed it to her mom, who smiled. ")
QUESTIONS = ["Why is the sky blue", "Where does the cat sleep", "Zebras run fast", "Big red ball",
             "Quiet mouse", "Jumping frogs", "Every little duck", "Kind old man", "Happy birthday",
             "Orange fish swims", "Green apples fall", "Under the bed", "Yellow sun shines",
             "Noisy bird sings", "Dancing bear", "Funny clown"]


def lcp(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def run_prefix(args, coord_args):
    """The 16 requests on a fresh cluster: (completions, prompt ids, metrics delta)."""
    cl = Cluster(args, [{"tp": 1}, {"tp": 1}], coord_args=coord_args)
    try:
        cl.start()
        m0 = metrics(cl)

        def req(q):
            return {"prompt": SYSTEM + q + ".", "max_tokens": 24, "temperature": 0,
                    "return_token_ids": True, "ignore_eos": True}
        first = cl.complete(req(QUESTIONS[0]))
        rest = run_concurrent([lambda q=q: cl.complete(req(q)) for q in QUESTIONS[1:]])
        res = [first] + rest
        ok = all(r and r[0] == 200 for r in res)
        check(ok, "16 requests: 200 each")
        if not ok:
            return None, None, None, cl
        comps = [r[1]["choices"][0]["token_ids"] for r in res]
        prompts = [r[1]["choices"][0]["prompt_token_ids"] for r in res]
        m1 = metrics(cl)
        delta = {k: m1.get(k, 0) - m0.get(k, 0) for k in
                 ("strata_prefix_cache_queries_total", "strata_prefix_cache_hits_total",
                  "strata_prefill_tokens_computed_total", "strata_preemptions_total",
                  "strata_recoveries_total")}
        sj = cl.stages_json()
        print("/v1/stages kv: %s" % sj["kv"])
        return comps, prompts, delta, cl
    finally:
        rcs = cl.stop()
        check(all(v == 0 for v in rcs.values()), "every process exits 0 on SIGTERM: %s" % rcs)
        if FAILS:
            cl.dump_logs()


def run_prefix_undisturbed(args, coord_args):
    """run_prefix, once more if a stage was taken for hung meanwhile (a
    starved process on a loaded machine: the recovery re-prefills, so the
    counters cannot be exact); the completions are checked either way."""
    res = run_prefix(args, coord_args)
    if res[2] is not None and res[2]["strata_recoveries_total"] > 0:
        print("a stage was found hung during the run (machine load); once more")
        res = run_prefix(args, coord_args)
    return res


def mode_prefix(args):
    comps, prompts, d, _ = run_prefix_undisturbed(args, [])
    if comps is None:
        return
    n = [len(p) for p in prompts]
    print("prompt lengths: %s" % n)
    # The blocks each request can map: its longest common prefix with any
    # other request, in full blocks, never its last token's block. The test
    # relies on that being the same whichever request came first.
    hits = []
    for k in range(1, 16):
        others = [lcp(prompts[k], prompts[j]) for j in range(16) if j != k]
        cap = (n[k] - 1) // BS
        hits.append(min(max(others) // BS, cap))
        with_first = min(lcp(prompts[k], prompts[0]) // BS, cap)
        check(hits[-1] == with_first, "request %d: its cached prefix (%d blocks) does not depend on the "
              "order of arrival" % (k, hits[-1]))
    want_q = sum(n)
    want_h = BS * sum(hits)
    print("metrics delta: %s; want queries %d, hits %d" % (d, want_q, want_h))
    check(min(n) >= 280 and hits[0] * BS >= 0.8 * min(n),
          "a shared system prompt of ~300 tokens (%d..%d, %d cached)" % (min(n), max(n), hits[0] * BS))
    check(d["strata_prefix_cache_queries_total"] == want_q,
          "prefix cache queries = the prompt tokens: %d" % want_q)
    check(d["strata_prefix_cache_hits_total"] == want_h,
          "prefix cache hits = 15 requests x their cached blocks: %d tokens" % want_h)
    check(d["strata_prefill_tokens_computed_total"] == want_q - want_h,
          "prefill tokens computed = %d - %d = %d" % (want_q, want_h, want_q - want_h))
    comps_off, prompts_off, d_off, _ = run_prefix_undisturbed(args, ["--no-prefix-caching"])
    if comps_off is None:
        return
    check(prompts_off == prompts, "--no-prefix-caching: the same prompt tokens")
    for k in range(16):
        check(comps_off[k] == comps[k], "request %d: the same %d tokens with caching on and off" % (k, len(comps[k])))
    check(d_off["strata_prefix_cache_hits_total"] == 0 and d_off["strata_prefill_tokens_computed_total"] == want_q,
          "--no-prefix-caching: no hits, every prompt token prefilled (%s)" % d_off)


def mode_restart(args):
    n_tok, kill_at = 120, 20
    prompts = [SYSTEM + q + "." for q in QUESTIONS[:5]]
    cl = Cluster(args, [{"tp": 1}, {"tp": 1}], coord_args=["--recovery-timeout", "120"])
    try:
        cl.start()
        base = stream_all(cl.http_port, prompts, n_tok)
        check(all(o[0] and not o[2] and len(o[1]) == n_tok for o in base),
              "first run: %d streams of %d tokens, [DONE], no error event" % (len(prompts), n_tok))
        base = [o[1] for o in base]
        m0 = metrics(cl)
        lock = threading.Lock()
        at = []

        def on_progress(progress):
            with lock:
                if not at and min(progress) >= kill_at:
                    victim = [p for n, p in cl.procs if n == "worker1"][0]
                    victim.kill()
                    victim.wait(30)
                    cl.restart_worker(1)
                    at.append(list(progress))
        out = stream_all(cl.http_port, prompts, n_tok, on_progress)
        check(bool(at) and max(at[0]) < n_tok, "worker1 killed and restarted mid-stream at %s" % at)
        check_streams(out, base, "after the restart: ")
        m1 = metrics(cl)
        hits = m1.get("strata_prefix_cache_hits_total", 0) - m0.get("strata_prefix_cache_hits_total", 0)
        check(hits > 0, "the second run mapped cached blocks before the kill (%d tokens)" % hits)
        with open(cl.co_log, errors="replace") as f:
            steps = [l.rstrip() for l in f if "recovery:" in l]
        check(any("resumed %d request(s)" % len(prompts) in l for l in steps),
              "the coordinator resumed the %d requests" % len(prompts))
        again = stream_all(cl.http_port, prompts[:3], 32)
        m2 = metrics(cl)
        check(all(o[0] and not o[2] and o[1] == b[:32] for o, b in zip(again, base)),
              "requests after the recovery equal the first run")
        check(m2.get("strata_prefix_cache_hits_total", 0) > m1.get("strata_prefix_cache_hits_total", 0),
              "and map the cache refilled after the recovery")
    finally:
        rcs = cl.stop()
        print("exit statuses: %s" % rcs)
        if FAILS:
            cl.dump_logs()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["preempt", "prefix", "restart"])
    for a in ("coordinator", "worker", "shared"):
        ap.add_argument("--" + a, required=True)
    args = ap.parse_args()
    # Loopback only: a recovery's reconnection must not try the bridges
    # other tests may create.
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    try:
        {"preempt": mode_preempt, "prefix": mode_prefix, "restart": mode_restart}[args.mode](args)
    except Exception as e:  # noqa: BLE001
        check(False, "exception: %r" % e)
    print("%d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
