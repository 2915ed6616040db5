#!/usr/bin/python3
"""kv_live_test.py — issue 15's prefix caching across placement changes in
live mode, with real processes: strata-coordinator --live and three
strata-worker processes on loopback (w-a, w-b serve PP 2, w-c is a spare),
6 greedy SSE streams of 200 tokens (ignore_eos) whose prompts share a
~300-token system prompt (tests/cluster/kv_test.py's), on stories260K.

A first run fills the prefix cache and gives each stream's tokens. Then the
same 6 streams again: they map the cached prefix (hits counted), and

  replace   mid-stream (20 tokens each) SetPlacement moves the layers to
            w-c:0-2, w-a:3-4 (a new epoch, whose stages start with empty KV
            caches and whose pool starts with an empty prefix cache): the
            streams move by re-prefilling;
  recover   mid-stream stage 1's worker is SIGKILLed: the spare takes its
            place (recovery_test.py's checks: a new epoch without it, the
            recovery logged, /metrics counts it);

every stream ends with [DONE], no error event and the first run's tokens;
requests afterwards equal it too and map the new epoch's cache.

Every process is started and always stopped by the test, by pid; every wait
is bounded; no timing is asserted. Runs under /usr/bin/python3 (grpcio).
"""
import argparse
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from harness import finish, check, check_streams, control_stubs, http_get, stream_all, wait_for  # noqa: E402
import recovery_test as rt  # noqa: E402
from kv_test import QUESTIONS, SYSTEM  # noqa: E402


def hits(cl):
    st, m = http_get(cl.http_port, "/metrics")
    for line in m.splitlines():
        if line.startswith("strata_prefix_cache_hits_total "):
            return float(line.split()[1])
    return -1.0


def start(args):
    cl = rt.Live(args, 2)
    cl.start_worker("w-a")
    cl.start_worker("w-b")
    if not check(wait_for(cl.serving, 120, 0.1), "w-a, w-b serve"):
        return cl, None
    cl.start_worker("w-c")
    check(wait_for(lambda: cl.nodes()["w-c"].state == rt.pb.NODE_STATE_READY, 60), "the spare w-c is ready")
    rs = [{"prompt": SYSTEM + q + "."} for q in QUESTIONS[:rt.N_STREAMS]]
    out = rt.run_streams(cl, rs, rt.N_TOK)
    check(all(o[0] and not o[2] and len(o[1]) == rt.N_TOK for o in out),
          "first run: %d streams of %d tokens, [DONE], no error event" % (len(rs), rt.N_TOK))
    return cl, (rs, [o[1] for o in out])


def mode_replace(args):
    cl, run = start(args)
    if not run:
        return cl
    rs, base = run
    pl0 = cl.placement().current
    h0 = hits(cl)
    lock = threading.Lock()
    at = []
    setter = []

    def set_placement():
        stages = [rt.pb.Stage(node="w-c", first_layer=0, last_layer=2),
                  rt.pb.Stage(node="w-a", first_layer=3, last_layer=4)]
        try:
            cl.stub.SetPlacement(rt.pb.SetPlacementRequest(stages=stages), timeout=120)
        except Exception as e:  # noqa: BLE001 - reported below
            at.append("SetPlacement failed: %r" % e)

    def on_progress(progress):
        with lock:
            if not setter and min(progress) >= rt.KILL_AT:
                t = threading.Thread(target=set_placement)
                t.start()
                setter.append(t)
                at.append(list(progress))
    out = rt.run_streams(cl, rs, rt.N_TOK, on_progress)
    for t in setter:
        t.join(150)
    print("placement set with the streams at %s" % at)
    check(len(at) == 1 and max(at[0]) < rt.N_TOK, "SetPlacement mid-stream")
    check(hits(cl) > h0, "the second run mapped cached blocks")
    check_streams(out, base, "replace: ")
    pl1 = cl.placement().current
    print("placement after: epoch %d %s" % (pl1.epoch, rt.stage_str(pl1)))
    check(pl1.epoch > pl0.epoch and rt.stage_str(pl1) == "w-c:0-2,w-a:3-4",
          "a new epoch: %s" % rt.stage_str(pl1))
    h1 = hits(cl)
    again = stream_all(cl.http_port, [r["prompt"] for r in rs[:3]], 32)
    check(all(o[0] and not o[2] and o[1] == b[:32] for o, b in zip(again, base)),
          "requests on the new placement equal the first run")
    check(hits(cl) > h1, "and map the new epoch's prefix cache")
    return cl


def mode_recover(args):
    cl, run = start(args)
    if not run:
        return cl
    rs, base = run
    h0 = hits(cl)
    rt.kill_mid_stream(cl, rs, base, "recover")
    check(hits(cl) > h0, "the second run mapped cached blocks")
    check("w-c" in [s.node for s in cl.placement().current.stages], "the spare took a stage")
    h1 = hits(cl)
    again = stream_all(cl.http_port, [r["prompt"] for r in rs[:3]], 32)
    check(all(o[0] and not o[2] and o[1] == b[:32] for o, b in zip(again, base)),
          "requests after the recovery equal the first run")
    check(hits(cl) > h1, "and map the new epoch's prefix cache")
    return cl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["replace", "recover"])
    for a in ("coordinator", "worker", "proto", "shared", "workdir"):
        ap.add_argument("--" + a, required=True)
    args = ap.parse_args()
    wd = os.path.join(args.workdir, "pygen-kv-live-" + args.mode)
    rt.grpc, rt.pb, rt.pbg = control_stubs(args.proto, wd)
    cl = None
    try:
        cl = {"replace": mode_replace, "recover": mode_recover}[args.mode](args)
    except Exception as e:  # noqa: BLE001
        check(False, "exception: %r" % e)
    return finish(cl)


if __name__ == "__main__":
    sys.exit(main())
