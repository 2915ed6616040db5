#!/usr/bin/env python3
"""hop_breakdown.py — where a pipeline hop's time goes, from STRATA_HOP_TRACE files.

    hop_breakdown.py PREFIX [T0_NS T1_NS]

Reads PREFIX.<pid> of the coordinator and every worker (common/hop_trace.h:
"event batch_id ns" lines, CLOCK_MONOTONIC) and, for each micro-batch the
coordinator sent in [T0_NS, T1_NS] (all when not given) except the first
(the prefill), follows it coordinator -> stage 0 -> ... -> coordinator:
  send->wake     sender's xport_send to the receiver's loop waking (on_event);
                 negative when the receiver was already awake (polling, or
                 busy in the loop);
  wake->recv     the receiver's UCX progress until the frame is parsed;
  recv->deliver  in-order delivery to on_frame;
  deliver->fwd   the stage's checks and hand-off until its forward starts;
  fwd->send      the forward's end until the result's xport_send;
  deliver->result  the coordinator's TOKENS handling until on_batch_result.
Prints each segment's median and mean (us) and the per-hop figure
cluster_bench.sh reports: (round trip - forwards) / hops.
"""
import glob
import statistics
import sys


def load(path):
    ev = {}
    for line in open(path):
        parts = line.split()
        if len(parts) != 3:
            continue
        e, b, ns = parts[0], int(parts[1]), int(parts[2])
        ev.setdefault((e, b), ns)  # a batch's first mark of each kind
    return ev


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    prefix = sys.argv[1]
    t0, t1 = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) == 4 else (0, 1 << 63)
    procs = [load(p) for p in sorted(glob.glob(glob.escape(prefix) + ".*"))]
    coord = [p for p in procs if any(e == "result" for e, _ in p)]
    stages = [p for p in procs if any(e == "fwd_start" for e, _ in p)]
    if len(coord) != 1 or not stages:
        sys.exit("hop_breakdown: want one coordinator trace and stage traces under %s.*" % prefix)
    c = coord[0]
    batches = sorted(b for (e, b), ns in c.items() if e == "send" and t0 <= ns <= t1 and ("result", b) in c)[1:]
    seg = {}
    hops = []

    def add(name, v):
        seg.setdefault(name, []).append(v / 1e3)

    for b in batches:
        # the stages that ran b, in the order the batch reached them
        chain = sorted((s for s in stages if ("recv", b) in s and ("fwd_end", b) in s), key=lambda s: s[("recv", b)])
        if not chain:
            continue
        sender, sname = c, "coordinator"
        fwd = 0
        for k, s in enumerate(chain):
            name = "%s -> stage %d" % (sname, k)
            add(name + ": send->wake", s[("wake", b)] - sender[("send", b)])
            add(name + ": wake->recv", s[("recv", b)] - s[("wake", b)])
            add(name + ": recv->deliver", s[("deliver", b)] - s[("recv", b)])
            add("stage %d: deliver->fwd" % k, s[("fwd_start", b)] - s[("deliver", b)])
            if ("send", b) in s:
                add("stage %d: fwd->send" % k, s[("send", b)] - s[("fwd_end", b)])
            fwd += s[("fwd_end", b)] - s[("fwd_start", b)]
            sender, sname = s, "stage %d" % k
        name = "%s -> coordinator" % sname
        if ("wake", b) in c and ("send", b) in sender:
            add(name + ": send->wake", c[("wake", b)] - sender[("send", b)])
            add(name + ": wake->recv", c[("recv", b)] - c[("wake", b)])
            add(name + ": recv->deliver", c[("deliver", b)] - c[("recv", b)])
        add("coordinator: deliver->result", c[("result", b)] - c[("deliver", b)])
        hops.append((c[("result", b)] - c[("send", b)] - fwd) / (len(chain) + 1) / 1e3)
    if not hops:
        sys.exit("hop_breakdown: no complete micro-batch in the traces")
    print("# where a hop's time goes (us, %d decode batches): median, mean" % len(hops))
    for name, v in seg.items():
        print("  %-44s %9.1f %9.1f" % (name, statistics.median(v), statistics.mean(v)))
    print("  %-44s %9.1f %9.1f" % ("per hop: (round trip - forwards) / hops", statistics.median(hops),
                                    statistics.mean(hops)))


if __name__ == "__main__":
    main()
