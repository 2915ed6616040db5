#!/usr/bin/python3
"""chaos_test.py — issue 12's chaos test (docs/recovery.md): a live cluster of
three workers on loopback (two serve PP 2, one is a spare) on stories260K.
For DURATION s, 8 client threads send greedy SSE completions back to back
(max_tokens 64, temperature 0, ignore_eos; prompt = the next of the ten in
../shared/reference/stories260K-greedy.json), while every KILL_EVERY s a
random worker is SIGKILLed and started again on the same data-plane port
with the same name (it registers again and becomes the spare, or serves).

Prints the number of requests completed. Every request must end with
[DONE], no error event, and exactly the reference's 64 tokens for its
prompt; none may be lost (every request sent gets its whole answer). Every
process is stopped by pid; every wait is bounded.

  chaos_test.py --coordinator BIN --worker BIN --proto control.proto
                --shared DIR --workdir DIR [--duration S] [--kill-every S]
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from harness import finish, check, control_stubs, free_port, sse_completion, wait_for  # noqa: E402
import recovery_test  # noqa: E402  (its Live cluster: coordinator --live + named workers)

N_CLIENTS = 8
N_TOK = 64
NAMES = ("w-a", "w-b", "w-c")


class ChaosLive(recovery_test.Live):
    """recovery_test.Live whose workers keep their data-plane port across restarts."""

    def __init__(self, args):
        super().__init__(args, 2)
        self.ports = {n: free_port() for n in NAMES}

    def start_worker(self, name):
        log = open(os.path.join(self.tmp, "%s.log" % name), "a")
        cmd = [self.args.worker, "--listen", "127.0.0.1:%d" % self.ports[name], "--coordinator", self.grpc_addr,
               "--name", name, "--model", self.model, "--threads", "1"]
        self.workers[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.killed.discard(name)

    def kill_and_restart(self, name):
        """SIGKILL name (by pid), reap it, start it again on its port."""
        p = self.workers[name]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
        self.start_worker(name)


def n_kills(args):
    """The kills at kill_every, 2 kill_every, ... strictly before duration."""
    n = int(args.duration // args.kill_every)
    return n - 1 if n * args.kill_every >= args.duration else n


def chaos(args, cl, refs):
    stop = threading.Event()
    results = []  # (prompt index, done, ids, errors, seconds)
    lock = threading.Lock()

    def client(c):
        k = c
        while not stop.is_set():
            i = k % len(refs)
            k += N_CLIENTS
            t0 = time.monotonic()
            try:
                done, ids, errs = sse_completion(cl.http_port, refs[i]["prompt"], N_TOK, timeout=120)
            except Exception as e:  # noqa: BLE001 - a lost request, reported below
                done, ids, errs = False, [], ["exception: %r" % e]
            with lock:
                results.append((i, done, ids, errs, time.monotonic() - t0))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(N_CLIENTS)]
    for t in threads:
        t.start()
    rng = random.Random(os.getpid())
    kills = []
    t0 = time.monotonic()
    t_end = t0 + args.duration
    try:
        for n in range(1, n_kills(args) + 1):  # at t0 + n * kill_every
            time.sleep(max(0.0, t0 + n * args.kill_every - time.monotonic()))
            victim = rng.choice(NAMES)
            pl = cl.placement().current
            role = next(("stage %d" % i for i, s in enumerate(pl.stages) if s.node == victim), "spare")
            with lock:
                n_done = len(results)
            print("t=%5.1f s: SIGKILL %s (%s of epoch %d), restart on port %d; %d requests completed so far"
                  % (time.monotonic() - t0, victim, role, pl.epoch, cl.ports[victim], n_done),
                  flush=True)
            cl.kill_and_restart(victim)
            kills.append((victim, role))
        time.sleep(max(0.0, t_end - time.monotonic()))
    finally:
        stop.set()
        for t in threads:
            t.join(180)
    return results, kills


def main():
    ap = argparse.ArgumentParser()
    for a in ("coordinator", "worker", "proto", "shared", "workdir"):
        ap.add_argument("--" + a, required=True)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--kill-every", type=float, default=10.0)
    args = ap.parse_args()
    recovery_test.grpc, recovery_test.pb, recovery_test.pbg = control_stubs(
        args.proto, os.path.join(args.workdir, "pygen-chaos"))
    pb = recovery_test.pb
    with open(os.path.join(args.shared, "reference", "stories260K-greedy.json")) as f:
        refs = json.load(f)
    cl = None
    try:
        cl = ChaosLive(args)
        cl.start_worker("w-a")
        cl.start_worker("w-b")
        if check(wait_for(cl.serving, 120, 0.1), "w-a, w-b serve"):
            cl.start_worker("w-c")
            check(wait_for(lambda: cl.nodes()["w-c"].state == pb.NODE_STATE_READY, 60), "the spare w-c is ready")
            results, kills = chaos(args, cl, refs)
            bad = [(i, d, len(ids), e[:1]) for i, d, ids, e, _ in results
                   if not d or e or ids != refs[i]["completion_tokens"][:N_TOK]]
            n_stage = sum(1 for _, role in kills if role != "spare")
            print("chaos: %d requests completed in %.0f s by %d clients; %d kills (%d of a stage holder): %s"
                  % (len(results), args.duration, N_CLIENTS, len(kills), n_stage, [v for v, _ in kills]))
            print("chaos: the slowest request took %.2f s" % max((r[4] for r in results), default=0))
            for b in bad[:10]:
                print("  bad: prompt %d done=%s %d tokens errors=%s" % b)
            check(len(results) > 0 and not bad,
                  "every one of the %d requests ended with [DONE], no error event and its reference tokens "
                  "(%d did not)" % (len(results), len(bad)))
            check(len(kills) == n_kills(args),
                  "a worker was killed every %.0f s (%d kills)" % (args.kill_every, len(kills)))
            m = dict(l.split() for l in cl.get("/metrics")[1].splitlines()
                     if l.startswith(("strata_recoveries_total ", "strata_sequences_resumed_total ")))
            print("chaos: /metrics %s" % m)
            check(float(m.get("strata_recoveries_total", -1)) == n_stage,
                  "one recovery per kill of a stage holder (%d)" % n_stage)
            st = cl.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
            check(st.serving, "the cluster serves at the end")
    except Exception as e:  # noqa: BLE001
        check(False, "exception: %r" % e)
    return finish(cl)


if __name__ == "__main__":
    sys.exit(main())
