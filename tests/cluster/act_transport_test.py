#!/usr/bin/python3
"""act_transport_test.py — issue 13's per-boundary activation transport
(ib/act_transport.h, daemon/act_link.h): real strata-coordinator and
strata-worker processes on 127.0.0.1, and tests/daemon/rogue_peer.

  act_transport_test.py MODE --coordinator BIN --worker BIN --rogue BIN --shared DIR
                         [--fake-gpu MODULE]

MODE
  auto      PP 2 on the CPU: both workers log "boundary 0->1: ucx (both stages
            run on the CPU)" (the receiver's choice, and the sender's from the
            answer) and the cluster serves the reference tokens
  nccl      PP 2 with the test hook STRATA_TEST_ACT_TRANSPORT=nccl on both
            workers (each side claims a GPU stage with NCCL): stage 0 sends a
            128-byte NCCL id through the real CONTROL frames and stage 1 logs
            the same 256 hex digits; stage 1 chooses nccl, cannot start it
            (its stage runs on the CPU backend), falls back to ucx and says
            so, stage 0 logs that answer; the reference tokens come back
  pinned    PP 2 with both stages on backend "cuda" served by
            tests/backend/fake_gpu_module.c (a CUDA module that computes on
            the CPU, through STRATA_BACKEND_PATH): both workers log
            "boundary 0->1: ucx-pinned (...)", take their hand-off buffers
            from the module's pinned allocator (stage 0 its output rows,
            stage 1 its input rows), serve the reference tokens, and after
            SIGTERM have given every pinned buffer back (live 0)
  ucx-cuda  the same two fake GPU stages with the test hook
            STRATA_TEST_ACT_TRANSPORT=ucx-cuda-host (the module's "device"
            memory is host memory, registered with UCX as such): both log
            "boundary 0->1: ucx-cuda (...)", take no pinned hand-off buffer,
            stage 0 sends from and stage 1 receives into module device
            buffers, a handful made and reused over two rounds, the reference
            tokens come back, and SIGTERM frees every device buffer (live 0)
  p2p       PP 3 with the fake module's point-to-point (STRATA_FAKE_GPU_P2P=1,
            a Unix socket standing in for NCCL): each receiver chooses nccl
            (GPU stages on one node, distinct GPUs, no UCX CUDA memory), the
            stages join the communicators (stage 1: rank 1 of 0->1, rank 0 of
            1->2), and then every step's rows go over them (each receiver gets
            exactly what its sender sent, in order) with the reference tokens
  p2p-fail  the same, the 5th send failing (STRATA_FAKE_GPU_P2P_FAIL_AT=5,
            STRATA_NCCL_TIMEOUT_S=3): stage 0 logs "nccl failed ... the next
            batches go over UCX" and sends no more rows over it, stage 1's
            receive gives up at its deadline (no hang) and logs it, the failed
            batch is retried, and the reference tokens come back
  offers    one worker holding stage 1 of 2, offers from rogue_peer: a
            128-byte id arrives byte-exact; a 127-byte and a 129-byte id, a
            boundary the worker is not on and an epoch older than its stage
            each get an ActivationAnswer with a clear error (and a log
            line); the worker keeps running and still answers a good offer
            afterwards; an offer for an epoch not assigned yet is kept and
            answered when that StageAssign comes. With a cluster key, an offer
            from a peer that proved the coordinator role is refused (not a
            stage). A bad --activation-transport value stops the worker
            (exit 2) with a message naming the flag.

UCX_TLS=tcp and UCX_NET_DEVICES=lo unless set. Every process is stopped by
its pid in a finally block.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from harness import FAILS, check, eventually, wait_for  # noqa: E402
from cluster_test import Cluster, load_ref  # noqa: E402
from security_test import KEY, read, ref_tokens, rogue, start_worker, stop, write_key  # noqa: E402

HEX_ID = re.compile(r"boundary 0->1: nccl id (sent to|received from) \S+ \(128 bytes\): ([0-9a-f]+)")



def stop_and_check_released(cl, kind, what):
    """Stops cl; each worker exits 0 and its fake GPU module's last
    `fake-gpu: KIND_alloc|KIND_free ... live N` line says N = 0."""
    rcs = cl.stop()
    for i in (0, 1):
        check(rcs.get("worker%d" % i) == 0, "worker %d exits 0 on SIGTERM (%s)" % (i, rcs.get("worker%d" % i)))
        lives = re.findall(r"fake-gpu: %s_(?:alloc \d+|free) live (\d+)" % kind, logs(cl, i))
        check(lives and lives[-1] == "0", "worker %d %s (live %s at the end)" % (i, what, lives[-1] if lives else "?"))

def logs(cl, i):
    return read(os.path.join(cl.tmp, "worker%d.log" % i))


def pp2(args, hook):
    refs = load_ref(args, "stories260K-greedy.json")[:2]
    want = [r["completion_tokens"][:32] for r in refs]
    if hook:
        os.environ["STRATA_TEST_ACT_TRANSPORT"] = "nccl"
    else:
        os.environ.pop("STRATA_TEST_ACT_TRANSPORT", None)
    cl = Cluster(args, [{"tp": 1}, {"tp": 1}])
    try:
        check(cl.start(), "a PP 2 cluster starts")
        check(ref_tokens(cl, refs) == want, "it serves the reference tokens")
        # The answer may trail the first completion on a loaded machine.
        wait_for(lambda: re.search(r"boundary 0->1: (ucx|ucx-pinned|ucx-cuda|nccl) \(", logs(cl, 0)), 20)
        w0, w1 = logs(cl, 0), logs(cl, 1)
        if not hook:
            line = "boundary 0->1: ucx (both stages run on the CPU)"
            check(line in w1, "stage 1 chose: %s" % line)
            check(line in w0, "stage 0 logs the same from the answer")
            check("nccl id" not in w0 + w1, "no NCCL id on CPU stages")
            return
        sent = [m.group(2) for m in HEX_ID.finditer(w0) if m.group(1) == "sent to"]
        got = [m.group(2) for m in HEX_ID.finditer(w1) if m.group(1) == "received from"]
        check(len(sent) >= 1 and len(sent[0]) == 256, "stage 0 sent a 128-byte NCCL id (%s)" % sent[:1])
        # A reconnection sends a fresh id, so compare as sets: each id stage 1
        # received is, byte for byte, one stage 0 sent.
        check(len(got) >= 1 and all(g in sent for g in got),
              "stage 1 received them byte-exact (%d sent, %d received)" % (len(sent), len(got)))
        check(len(set(sent)) == len(sent), "every connection gets a fresh id")
        check(re.search(r"boundary 0->1: nccl \(GPU stages on one node; UCX without CUDA memory, NCCL on both\)", w1),
              "stage 1 chose nccl by the table")
        check("boundary 0->1: nccl cannot start: stage 1 runs on the cpu backend; falling back to ucx" in w1,
              "stage 1 refuses nccl cleanly and falls back to ucx")
        check(re.search(r"boundary 0->1: ucx \(nccl chosen \(.*\) but stage 1 runs on the cpu backend; falling back\)",
                        w0), "stage 0 logs the fallback from the answer")
        check(ref_tokens(cl, refs) == want, "the same reference tokens again")
    finally:
        os.environ.pop("STRATA_TEST_ACT_TRANSPORT", None)
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_pinned(args):
    refs = load_ref(args, "stories260K-greedy.json")[:2]
    want = [r["completion_tokens"][:32] for r in refs]
    os.environ["STRATA_BACKEND_PATH"] = args.fake_gpu
    cl = Cluster(args, [{"tp": 1, "cfg": ["backend = cuda"]}, {"tp": 1, "cfg": ["backend = cuda"]}])
    try:
        check(cl.start(), "a PP 2 cluster of two (fake) GPU stages starts")
        check(ref_tokens(cl, refs) == want, "it serves the reference tokens")
        wait_for(lambda: re.search(r"boundary 0->1: ucx-pinned \(", logs(cl, 0)), 20)
        line = ("boundary 0->1: ucx-pinned (GPU stages; UCX without CUDA memory on the sending side, "
                "no NCCL (NCCL is not available on the sending side))")
        for i in (0, 1):
            w = logs(cl, i)
            check(line in w, "worker %d logs: %s" % (i, line))
            allocs = re.findall(r"fake-gpu: host_alloc (\d+) live (\d+)", w)
            check(len(allocs) >= 1, "worker %d took %d pinned hand-off buffer(s) from the module" % (i, len(allocs)))
            check(all(int(b) >= 64 << 10 for b, _ in allocs), "each of at least 64 KiB (the pool's minimum)")
        stop_and_check_released(cl, "host", "gave every pinned buffer back")
    finally:
        os.environ.pop("STRATA_BACKEND_PATH", None)
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_ucx_cuda(args):
    """Two (fake) GPU stages on ucx-cuda: the test hook stands the module's
    host memory in for device memory (Debian's UCX has no CUDA)."""
    refs = load_ref(args, "stories260K-greedy.json")[:2]
    want = [r["completion_tokens"][:32] for r in refs]
    env = {"STRATA_BACKEND_PATH": args.fake_gpu, "STRATA_TEST_ACT_TRANSPORT": "ucx-cuda-host"}
    os.environ.update(env)
    cl = Cluster(args, [{"tp": 1, "cfg": ["backend = cuda"]}, {"tp": 1, "cfg": ["backend = cuda"]}])
    try:
        check(cl.start(), "a PP 2 cluster of two (fake) GPU stages starts")
        # batches sent before stage 0 has the answer go host-staged: wait for it
        check(wait_for(lambda: re.search(r"boundary 0->1: ucx-cuda \(", logs(cl, 0)), 20),
              "stage 0 has stage 1's answer")
        check(ref_tokens(cl, refs) == want, "it serves the reference tokens over ucx-cuda")
        line = "boundary 0->1: ucx-cuda (GPU stages on one node; UCX takes CUDA memory on both sides (cuda_ipc))"
        w = [logs(cl, i) for i in (0, 1)]
        for i in (0, 1):
            check(line in w[i], "worker %d logs: %s" % (i, line))
            # (the last stage's pinned logits buffer comes at load, before "ready")
            check("fake-gpu: host_alloc" not in w[i].split("worker: stage %d ready in" % i, 1)[-1],
                  "worker %d took no pinned hand-off buffer (no host staging)" % i)
            check("falling back" not in w[i], "worker %d did not fall back" % i)
        allocs = [re.findall(r"fake-gpu: dev_alloc (\d+) live", x) for x in w]
        check(len(allocs[0]) >= 1, "stage 0 writes its output rows into module device buffers (%d)" % len(allocs[0]))
        check(len(allocs[1]) >= 1, "stage 1 receives into module device buffers (%d)" % len(allocs[1]))
        # 2 requests x 32 tokens: over 60 forwards; buffers are made once per size and reused
        check(all(int(b) >= 64 << 10 for a in allocs for b in a), "each of at least 64 KiB")
        check(ref_tokens(cl, refs) == want, "the same reference tokens again")
        # 2 x 2 requests of 32 tokens: over 120 forwards a stage; a buffer is
        # made only when every one is busy (sends / receives in flight), so a
        # handful in all, and they are reused
        again = [re.findall(r"fake-gpu: dev_alloc (\d+) live", logs(cl, i)) for i in (0, 1)]
        fwd = len(re.findall(r'msg="seq starts" stage=0', logs(cl, 0)))
        check(fwd == 4, "stage 0 started the 4 sequences (%d)" % fwd)
        check(all(1 <= len(a) <= 6 for a in again), "a handful of device buffers, not one a forward (%s)"
              % [len(a) for a in again])
        stop_and_check_released(cl, "dev", "freed every device buffer")
    finally:
        for k in env:
            os.environ.pop(k, None)
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_p2p_fail(args):
    refs = load_ref(args, "stories260K-greedy.json")[:2]
    want = [r["completion_tokens"][:32] for r in refs]
    env = {"STRATA_BACKEND_PATH": args.fake_gpu, "STRATA_FAKE_GPU_P2P": "1", "STRATA_FAKE_GPU_P2P_FAIL_AT": "5",
           "STRATA_NCCL_TIMEOUT_S": "3"}
    os.environ.update(env)
    cl = Cluster(args, [{"tp": 1, "cfg": ["backend = cuda"]}, {"tp": 1, "cfg": ["backend = cuda"]}])
    try:
        check(cl.start(), "a PP 2 cluster of two (fake) GPU stages with a point-to-point starts")
        up = lambda: all("nccl communicator up (rank %d)" % i in logs(cl, i) for i in (0, 1))  # noqa: E731
        check(wait_for(up, 30), "both stages joined the boundary's communicator")
        t0 = time.monotonic()
        got = ref_tokens(cl, refs)
        check(got == want, "the reference tokens despite the failed send (%.1f s)" % (time.monotonic() - t0))
        # stage 1's receive gives up at its own deadline: its line may come
        # after the tokens
        check(eventually(lambda: re.search(r"fake-gpu: p2p send \d+ failed \(injected\)", logs(cl, 0))),
              "the 5th send failed")
        check(eventually(lambda: re.search(r"boundary 0->1: nccl failed: .*injected failure; the next batches go "
                                           r"over UCX", logs(cl, 0))), "stage 0 logs the failure and goes back to UCX")
        check(eventually(lambda: re.search(r"boundary 0->1: nccl failed: .*fake p2p recv: timed out", logs(cl, 1))),
              "stage 1's receive gave up at its deadline and logs it")
        sends = re.findall(r"fake-gpu: p2p send \d+$", logs(cl, 0), re.M)
        check(len(sends) == 4, "no rows over the link after the failure (%d sends before it)" % len(sends))
        check(ref_tokens(cl, refs) == want, "the reference tokens again, over UCX")
    finally:
        for k in env:
            os.environ.pop(k, None)
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_p2p(args):
    """PP 3: stage 1 receives its rows over one link and sends over the next."""
    refs = load_ref(args, "stories260K-greedy.json")[:2]
    want = [r["completion_tokens"][:32] for r in refs]
    os.environ["STRATA_BACKEND_PATH"] = args.fake_gpu
    os.environ["STRATA_FAKE_GPU_P2P"] = "1"
    cl = Cluster(args, [{"tp": 1, "cfg": ["backend = cuda"]} for _ in range(3)])
    try:
        check(cl.start(), "a PP 3 cluster of (fake) GPU stages with a point-to-point starts")
        # stage 1 joins two communicators: rank 1 of 0->1 and rank 0 of 1->2
        up = lambda: ("nccl communicator up (rank 0)" in logs(cl, 0)  # noqa: E731
                      and "communicator up (rank 1)" in logs(cl, 1) and "communicator up (rank 0)" in logs(cl, 1)
                      and "nccl communicator up (rank 1)" in logs(cl, 2))
        check(wait_for(up, 30), "every stage joined its boundaries' communicators")
        w = [logs(cl, i) for i in range(3)]
        for k in (0, 1):
            check("boundary %d->%d: nccl (GPU stages on one node; UCX without CUDA memory, NCCL on both)" % (k, k + 1)
                  in w[k + 1], "stage %d chose nccl" % (k + 1))
            check(re.search(r"boundary %d->%d: nccl \(GPU stages on one node.*\); joining the communicator as rank 0"
                            % (k, k + 1), w[k]), "stage %d joins as rank 0 after the answer" % k)
        before = len(re.findall(r"fake-gpu: p2p send \d+", w[1]))
        check(ref_tokens(cl, refs) == want, "the reference tokens with the rows over the point-to-point")

        def transfers():
            w = [logs(cl, i) for i in range(3)]
            sends = [[int(b) for b in re.findall(r"fake-gpu: p2p send (\d+)", w[i])] for i in range(3)]
            recvs = [[int(b) for b in re.findall(r"fake-gpu: p2p recv (\d+)", w[i])] for i in range(3)]
            return w, sends, recvs
        # A stage logs its "p2p send|recv" line after the transfer, and the
        # completion may come back before the last one is written (CI under
        # ctest -j read 63 receives of 64): wait until the counts agree (or
        # the deadline), then compare.
        def all_received():
            _, s, r = transfers()
            return len(s[0]) == len(r[1]) and len(s[1]) == len(r[2])
        wait_for(all_received, 30)
        w, sends, recvs = transfers()
        check(len(sends[1]) - before >= 2 * 31, "stage 1 sent every step's rows on (%d sends)" % (len(sends[1]) - before))
        check(sends[0] == recvs[1] and sends[1] == recvs[2],
              "each receiver got exactly what its sender sent, in order (%d/%d, %d/%d)"
              % (len(sends[0]), len(recvs[1]), len(sends[1]), len(recvs[2])))
        check(not sends[2] and not recvs[0], "the last stage sends nothing on, stage 0 receives nothing")
        check(all(b % (64 * 4) == 0 for b in sends[0] + sends[1]), "rows of n_embd 64 f32")
        check("nccl failed" not in "".join(w), "no transfer failed")
        rcs = cl.stop()
        for i in range(3):
            check(rcs.get("worker%d" % i) == 0, "worker %d exits 0 on SIGTERM (%s)" % (i, rcs.get("worker%d" % i)))
    finally:
        os.environ.pop("STRATA_BACKEND_PATH", None)
        os.environ.pop("STRATA_FAKE_GPU_P2P", None)
        if FAILS:
            cl.dump_logs()
        cl.kill()


def mode_offers(args):
    tmp = tempfile.mkdtemp(prefix="strata-act-")
    mdir = os.path.join(args.shared, "models")
    st1 = dict(stage=1, n_stages=2, first=3, last=5, kv_blocks=64)
    # debug: the worker logs a received NCCL id in hex (only then, or under the hook)
    p, port, log, ok = start_worker(args, tmp, "w1", ["--model-dir", mdir, "--log-level", "debug"])
    pk = None
    try:
        check(ok, "the worker starts")
        addr = "127.0.0.1:%d" % port
        out = rogue(args, addr, ["assign:stories260K.gguf"], wait=60, expect=1, **st1)
        check("ready ok=1" in out, "stage 1 of 2 loads")
        # (action, transport answered, error): a NCCL offer speaks for a GPU
        # stage, so a CPU receiver answers ucx-pinned (the GPU side pins).
        cases = [("offer:0:128", "ucx-pinned", ""),
                 ("offer:0:127", "ucx", "boundary 0->1: NCCL id of 127 bytes (want 128)"),
                 ("offer:0:129", "ucx", "boundary 0->1: NCCL id of 129 bytes (want 128)"),
                 ("offer:4:128", "ucx", "unknown boundary 4->5: this worker is stage 1 of epoch 1"),
                 ("offer:0:0", "ucx", "")]
        out = rogue(args, addr, [c[0] for c in cases], wait=30, expect=len(cases), **st1)
        answers = [l for l in out.splitlines() if l.startswith("answer")]
        check(len(answers) == len(cases), "one answer per offer (%d of %d)" % (len(answers), len(cases)))
        for (action, xport, err), line in zip(cases, answers):
            b = action.split(":")[1]
            check(line == "answer boundary=%s transport=%s error=%s" % (b, xport, err),
                  "%s: %s" % (action, "refused: " + err if err else "accepted, " + xport))
        want_hex = "".join("%02x" % ((i * 7 + 3) & 0xFF) for i in range(128))
        check(eventually(lambda: "boundary 0->1: nccl id received from 127.0.0.1:" in read(log)
                         and "(128 bytes): " + want_hex in read(log)), "the 128-byte id arrived byte-exact")
        check(eventually(lambda: "ActivationOffer from 127.0.0.1:" in read(log)
                         and "refused: boundary 0->1: NCCL id of 127 bytes" in read(log)),
              "the worker logs the refusal")
        out = rogue(args, addr, ["offer:0:128"], wait=20, expect=1, epoch=0, stage=1)
        check("error=unknown boundary 0->1: no stage of epoch 0 here" in out, "an older epoch it does not hold")
        out = rogue(args, addr, ["offer:0:0", "stats"], wait=20, expect=2, **st1)
        check("answer boundary=0 transport=ucx error=" in out and "loaded=1" in out,
              "the worker still answers and holds its stage")
        check(p.poll() is None, "the worker is still running")
        # An offer before its epoch's assignment (the sender's stage loaded
        # first) is kept and answered when the StageAssign comes.
        out = rogue(args, addr, ["offer:0:128", "assign:stories260K.gguf"], wait=60, expect=2,
                    **dict(st1, epoch=2))
        lines = [l for l in out.splitlines() if l.startswith(("answer", "ready"))]
        check(lines == ["answer boundary=0 transport=ucx-pinned error=", "ready ok=1 epoch=2 stage=1 error="],
              "an offer for epoch 2 before its StageAssign is answered once it comes (%s)" % lines)
        check(eventually(lambda: "offer from 127.0.0.1:" in read(log) and "came before its assignment" in read(log)),
              "the worker logs that it kept the offer")
        # With a key: an offer from the coordinator role is not a stage's.
        key = write_key(os.path.join(tmp, "cluster.key"), KEY)
        pk, kport, klog, ok = start_worker(args, tmp, "wk", ["--model-dir", mdir, "--cluster-key-file", key])
        check(ok, "a worker with a cluster key starts")
        out = rogue(args, "127.0.0.1:%d" % kport, ["offer:0:128"], key=key, wait=3, **st1)
        check("answer" not in out, "the coordinator role's offer gets no answer")
        check(wait_for(lambda: "it is a coordinator, not a stage" in read(klog), 10),
              "the keyed worker logs the refusal")
        # A bad flag value.
        r = subprocess.run([args.worker, "--listen", "127.0.0.1:0", "--activation-transport", "rdma"],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and "--activation-transport 'rdma' is not auto, ucx or nccl" in r.stderr,
              "--activation-transport rdma: exit 2 naming the flag (%d: %s)" % (r.returncode, r.stderr.strip()))
    finally:
        stop(p)
        if pk:
            stop(pk)
        if FAILS:
            print(read(log)[-4000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["auto", "nccl", "pinned", "ucx-cuda", "p2p", "p2p-fail", "offers"])
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--rogue", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--fake-gpu", help="tests/backend/fake_gpu_module.c's module (mode pinned)")
    args = ap.parse_args()
    os.environ.setdefault("UCX_TLS", "tcp")
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    if args.mode == "offers":
        mode_offers(args)
    elif args.mode == "pinned":
        mode_pinned(args)
    elif args.mode == "ucx-cuda":
        mode_ucx_cuda(args)
    elif args.mode == "p2p":
        mode_p2p(args)
    elif args.mode == "p2p-fail":
        mode_p2p_fail(args)
    else:
        pp2(args, args.mode == "nccl")
    print("%s: %s" % (args.mode, "FAIL (%d)" % len(FAILS) if FAILS else "ok"))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
