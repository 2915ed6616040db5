#!/usr/bin/env bash
# cluster_bench.sh — issue 5's speed figures (a benchmark: figures, not pass/fail).
#
#   bench/cluster_bench.sh [--gen N] [--build DIR] [--model FILE] [--microbatch-only | --hop-only]
#
# 0. micro-batching on stories260K (../shared/models, or $STRATA_SHARED/models):
#    a PP 2 cluster (TP 1, 1 thread per worker) serving greedy completions of
#    64 tokens of the reference prompts; decode tok/s (completion tokens / wall
#    time) of 1 sequence vs 8 concurrent ones, best of 5 runs each, and their
#    ratio; and how long both stages computed at once during the runs
#    (intersection of the stages' forward intervals from GET /v1/stages,
#    CLOCK_MONOTONIC), as a share of the shorter stage's busy time (0 with 1
#    sequence: one micro-batch in flight). The same measurement as the
#    cluster_microbatch test, which asserts the overlap but only prints the
#    ratio. --microbatch-only stops after this part.
# On bench-1b F16 (generated with `strata-gguf synth --preset bench-1b` into
# the build dir when missing; --model or $BENCH_MODEL to use another file):
#  1. decode tok/s, batch 1: strata-bench in one process with 2 threads, vs a
#     PP 2 cluster (coordinator + two strata-worker processes, TP 1,
#     $WORKER_THREADS threads each, default 2: the same 2 cores) serving one streaming completion over HTTP
#     (tokens after the first / time from the first to the last token);
#  2. throughput with 8 sequences: strata-bench --batch 8 vs 8 concurrent
#     completions on the cluster (aggregate decode tok/s);
#  3. per-hop activation latency, from the 1-sequence run: each decode
#     micro-batch's round trip (coordinator -> stage 0 -> stage 1 ->
#     coordinator; GET /v1/stages batch_intervals) minus the forwards both
#     stages ran inside it (forward_intervals), over its 3 hops; median and
#     mean over the batches. Next to strata-bench-xport's one-hop latency and
#     ucx_perftest's (ucp_am_lat, polling, and -E sleep: a receiver that
#     sleeps as ours do) at the activation size of one token (n_embd x 4
#     bytes, f32), and the ratio to ucx_perftest's polling figure (medians:
#     both are one-way; on a shared machine means follow preemptions).
#     Then the floor: the same 40 ms gap over plain TCP loopback without
#     UCX (bench/tcp_floor.h), blocked and spinning, and the cluster's
#     ratio to it. ucx_perftest sends back to back with hot caches; a
#     pipeline's hop comes after an idle gap (a forward elsewhere), when
#     waking the idle CPUs, not the copies, costs the most.
#     Before that, where the hop's time goes: the cluster runs with
#     STRATA_HOP_TRACE (common/hop_trace.h) and bench/hop_breakdown.py splits
#     each batch's hops into wake-up, receive, hand-off and send. Unless
#     STRATA_XPORT_POLL_US=0, the 1-sequence run is repeated with it 0
#     (adaptive polling off), and both per-hop figures are printed.
# --hop-only: only the cluster's 1-sequence run and part 3.
# Release build (default build/, made with cmake if needed). UCX_TLS=tcp and
# UCX_NET_DEVICES=lo unless set (everything runs on 127.0.0.1; another
# interface, e.g. a test's veth, would only add lanes that may not connect).
# STRATA_XPORT_POLL_US passes through to the cluster (docs/protocol.md, "Polling";
# unset here: 1000, adaptive polling with spins of at most 1000 us, so that the
# run compares it with the product's default, 0: off); part 3 also
# prints strata-bench-xport's one-way latency after a 40 ms idle gap (a
# pipeline's) with the polling on and off, alternating in one run.
set -euo pipefail
export STRATA_XPORT_POLL_US="${STRATA_XPORT_POLL_US-1000}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
gen=32
build=build
model="${BENCH_MODEL:-}"
mb_only=0
hop_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --gen) gen="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --microbatch-only) mb_only=1; shift ;;
    --hop-only) hop_only=1; shift ;;
    *) echo "usage: $0 [--gen N] [--build DIR] [--model FILE] [--microbatch-only | --hop-only]" >&2; exit 2 ;;
  esac
done
export UCX_TLS="${UCX_TLS:-tcp}"
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=(strata-coordinator strata-worker)
[ "$mb_only" = 1 ] || targets+=(strata-bench strata-bench-xport strata-gguf)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >/dev/null

tmp="$(mktemp -d)"
pids=()
cleanup() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

shared="${STRATA_SHARED:-$root/../shared}"
if [ "$hop_only" = 0 ]; then
echo "## micro-batching: stories260K, PP 2 (2 workers x 1 thread, TP 1), $(nproc) CPUs, UCX_TLS=$UCX_TLS"
q0=$(free_port); q1=$(free_port); qh=$(free_port)
cat > "$tmp/mb.ini" <<EOF
[cluster]
model = $shared/models/stories260K.gguf
listen = 127.0.0.1:$qh
kv_blocks = 512
max_seqs = 64
[stage.0]
address = 127.0.0.1:$q0
[stage.1]
address = 127.0.0.1:$q1
EOF
"$build/daemon/strata-worker" --listen "127.0.0.1:$q0" --threads 1 --model-dir "$shared/models" >"$tmp/mw0.log" 2>&1 & pids+=($!)
"$build/daemon/strata-worker" --listen "127.0.0.1:$q1" --threads 1 --model-dir "$shared/models" >"$tmp/mw1.log" 2>&1 & pids+=($!)
"$build/coordinator/strata-coordinator" --config "$tmp/mb.ini" --ready-timeout 60 \
    >"$tmp/mc.out" 2>"$tmp/mc.log" & pids+=($!)
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$qh/health" >/dev/null 2>&1 && break
  kill -0 "${pids[2]}" 2>/dev/null || { tail "$tmp/mc.log"; exit 1; }
  sleep 0.1
done
/usr/bin/python3 -B - "$qh" "$shared" "$root/tests/cluster" <<'EOF'
import http.client, json, os, sys, threading, time
port, shared = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, sys.argv[3])
from cluster_test import merged_overlap, settled_stages, forward_window  # the test's measurement
refs = json.load(open(os.path.join(shared, "reference", "stories260K-greedy.json")))
class Cl:
    def stages_json(self):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("GET", "/v1/stages"); d = json.loads(c.getresponse().read()); c.close(); return d
cl = Cl()
def complete(i, k, out):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": refs[i]["prompt"], "max_tokens": 64,
              "temperature": 0, "return_token_ids": True}), headers={"Content-Type": "application/json"})
    d = json.loads(c.getresponse().read()); c.close()
    out[k] = (d["choices"][0]["token_ids"] == refs[i]["completion_tokens"][:64],
              d["usage"]["completion_tokens"])
def run(first, n):
    s0 = settled_stages(cl)
    idx = [(first + k) % len(refs) for k in range(n)]
    out = [(False, 0)] * n
    t0_ns = time.monotonic_ns(); t0 = time.time()
    ts = [threading.Thread(target=complete, args=(i, k, out)) for k, i in enumerate(idx)]
    for t in ts: t.start()
    for t in ts: t.join()
    dt = time.time() - t0; t1_ns = time.monotonic_ns()
    iv, _ = forward_window(s0, settled_stages(cl), t0_ns, t1_ns)
    busy = min(sum(b - a for a, b in v) for v in iv)
    return sum(o[1] for o in out) / dt, merged_overlap(iv[0], iv[1]), busy, all(o[0] for o in out)
r1 = [run(k, 1) for k in range(5)]
r8 = [run(2 * k, 8) for k in range(5)]
exact = all(r[3] for r in r1 + r8)
b1, b8 = max(r[0] for r in r1), max(r[0] for r in r8)
print("cluster PP2 stories260K, 1 sequence: decode %.0f tok/s (best of %s)" % (b1, [round(r[0]) for r in r1]))
print("cluster PP2 stories260K, 8 sequences: decode %.0f tok/s (best of %s)" % (b8, [round(r[0]) for r in r8]))
print("micro-batching ratio (8 vs 1 sequence): %.2fx%s"
      % (b8 / b1, "" if exact else "  (SOME OUTPUTS DIFFER FROM THE REFERENCE)"))
for label, rs in (("1 sequence", r1), ("8 sequences", r8)):
    ov, sh = sum(r[1] for r in rs), sum(r[2] for r in rs)
    print("stages computing at once, %s: %.3f ms of %.3f ms (shorter stage's busy time) = %.1f%%; per run %s"
          % (label, ov / 1e6, sh / 1e6, 100 * ov / sh if sh else 0,
             ["%.1f%%" % (100 * r[1] / r[2] if r[2] else 0) for r in rs]))
EOF
for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()
fi
[ "$mb_only" = 1 ] && exit 0

if [ -z "$model" ]; then
  model="$root/$build/bench-1b.gguf"
  if [ ! -f "$model" ]; then
    echo "# generating $model (strata-gguf synth --preset bench-1b)"
    "$build/cli/strata-gguf" synth --preset bench-1b --out "$model" >/dev/null
  fi
fi
n_embd=$("$build/cli/strata-gguf" inspect "$model" | sed -n 's/.*embedding_length = \([0-9]*\).*/\1/p')
act_bytes=$((n_embd * 4))
echo "# model $model (n_embd $n_embd), $gen generated tokens, UCX_TLS=$UCX_TLS, $(nproc) CPUs," \
     "STRATA_XPORT_POLL_US=${STRATA_XPORT_POLL_US}, load average $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "$hop_only" = 0 ]; then
echo "## single process (strata-bench, 2 threads)"
for b in 1 8; do
  "$build/bench/strata-bench" --model "$model" --batch $b --prompt-len 16 --gen "$gen" --threads 2 \
      --reps 2 --json > "$tmp/sp$b.json"
  /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
r = d.get("results", d)
if isinstance(r, list): r = r[0]
def g(*ks):
    for k in ks:
        if k in r: return r[k]
    return float("nan")
print("single process, batch %s: decode %.2f tok/s" % (sys.argv[2], g("decode_tok_s", "decode_tps", "decode")))
' "$tmp/sp$b.json" "$b" || cat "$tmp/sp$b.json"
done
fi

# Each bench-1b worker gets both cores by default: with one sequence only one
# stage computes at a time, so a worker limited to 1 thread would stream its
# weights at one core's bandwidth. WORKER_THREADS=1 shows that case.
# One PP 2 cluster: start, measure, stop, split its hops. pp2_run SUFFIX
# HOP_ONLY (1: the 1-sequence run only); the caller sets STRATA_XPORT_POLL_US.
pp2_run() {
local sfx="$1" ho="$2"
wthreads=${WORKER_THREADS:-2}
echo "## PP 2 cluster (2 workers x $wthreads threads, TP 1), STRATA_XPORT_POLL_US=${STRATA_XPORT_POLL_US}"
local p0 p1 http win0 win1
p0=$(free_port); p1=$(free_port); http=$(free_port)
cat > "$tmp/cluster.ini" <<EOF
[cluster]
model = $model
listen = 127.0.0.1:$http
kv_blocks = 256
[stage.0]
address = 127.0.0.1:$p0
[stage.1]
address = 127.0.0.1:$p1
EOF
export STRATA_HOP_TRACE="$tmp/trace$sfx"  # written by each process at exit
"$build/daemon/strata-worker" --listen "127.0.0.1:$p0" --threads "$wthreads" --model-dir "$(dirname "$model")" >"$tmp/w0.log" 2>&1 & pids+=($!)
"$build/daemon/strata-worker" --listen "127.0.0.1:$p1" --threads "$wthreads" --model-dir "$(dirname "$model")" >"$tmp/w1.log" 2>&1 & pids+=($!)
"$build/coordinator/strata-coordinator" --config "$tmp/cluster.ini" --ready-timeout 600 \
    >"$tmp/c.out" 2>"$tmp/c.log" & pids+=($!)
unset STRATA_HOP_TRACE
for _ in $(seq 6000); do
  curl -sf "http://127.0.0.1:$http/health" >/dev/null 2>&1 && break
  kill -0 "${pids[2]}" 2>/dev/null || { tail "$tmp/c.log"; exit 1; }
  sleep 0.1
done
/usr/bin/python3 - "$http" "$gen" "$ho" "$tmp/hop_us$sfx" "$tmp/window$sfx" <<'EOF'
import http.client, json, sys, threading, time
port, gen, hop_only, hop_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
window_file = sys.argv[5]
prompt = "Once upon a time there was a little robot who"
def stages():
    time.sleep(0.3)  # the coordinator refreshes StageStats every 0.1 s
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/v1/stages"); d = json.loads(c.getresponse().read()); c.close(); return d
def stream(out, i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = json.dumps({"prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
                       "stream": True, "return_token_ids": True})
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse(); stamps = []; n = 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]": continue
        k = len(json.loads(line[6:])["choices"][0].get("token_ids", []))
        if k: n += k; stamps.append(time.time())
    out[i] = (stamps[0], stamps[-1], n)
def run(n_seq):
    out = [None] * n_seq
    ts = [threading.Thread(target=stream, args=(out, i)) for i in range(n_seq)]
    for t in ts: t.start()
    for t in ts: t.join()
    first = min(o[0] for o in out); last = max(o[1] for o in out)
    return sum(o[2] - 1 for o in out) / (last - first)
run(1)  # warm-up
s0 = stages()
t0_ns = time.monotonic_ns()
r1 = run(1)
t1_ns = time.monotonic_ns()
s1 = stages()
print("cluster PP2, 1 sequence: decode %.2f tok/s" % r1)
if not hop_only:
    r8 = run(8)
    s2 = stages()
    print("cluster PP2, 8 sequences: decode %.2f tok/s (aggregate)" % r8)
# Per-hop latency from the 1-sequence run, per micro-batch: its round trip
# (coordinator -> stage 0 -> stage 1 -> coordinator, batch_intervals) minus
# the forwards both stages ran inside it (forward_intervals), over 3 hops. The
# prefill batch is left out (its payload is not one token's). Median and mean:
# on a shared machine a few preempted batches move the mean a lot.
bats = sorted((a, b) for a, b in s1["batch_intervals"] if a >= t0_ns and b <= t1_ns)[1:]
fws = [[(a, b) for a, b in x["forward_intervals"] if a >= t0_ns and b <= t1_ns] for x in s1["stages"]]
hops, rtts, fwds = [], [], []
for a, b in bats:
    inside = sum(min(e, b) - max(f, a) for iv in fws for f, e in iv if f < b and e > a)
    rtts.append((b - a) / 1e6); fwds.append(inside / 1e6)
    hops.append((b - a - inside) / 3 / 1e3)
if not hops:
    sys.exit("no micro-batch round trips recorded (GET /v1/stages batch_intervals)")
hops.sort()
med = hops[len(hops) // 2] if len(hops) % 2 else (hops[len(hops) // 2 - 1] + hops[len(hops) // 2]) / 2
mean = sum(hops) / len(hops)
print("cluster PP2, batch 1: mean round trip %.3f ms, forwards %.3f ms (both stages); per hop "
      "median %.1f us, mean %.1f us (%d decode batches)"
      % (sum(rtts) / len(rtts), sum(fwds) / len(fwds), med, mean, len(hops)))
open(hop_file, "w").write("%.1f %.1f\n" % (med, mean))
open(window_file, "w").write("%d %d\n" % (t0_ns, t1_ns))
if not hop_only:
    print("busy fractions during the 8-sequence run: %s" % [round(x["busy_fraction"], 3) for x in s2["stages"]])
EOF

# The traces are written at exit: stop the cluster, then split its hops.
for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()
read -r win0 win1 < "$tmp/window$sfx" 2>/dev/null && /usr/bin/python3 "$root/bench/hop_breakdown.py" "$tmp/trace$sfx" "$win0" "$win1" || true
}
pp2_run "" "$hop_only"
# The same 1-sequence run with polling off, unless it was off already: the
# hop with and without adaptive polling, from one run of this script.
if [ "${STRATA_XPORT_POLL_US:-}" != 0 ]; then
  poll_saved="${STRATA_XPORT_POLL_US-__unset__}"
  export STRATA_XPORT_POLL_US=0
  pp2_run "_off" 1
  if [ "$poll_saved" = __unset__ ]; then unset STRATA_XPORT_POLL_US; else export STRATA_XPORT_POLL_US="$poll_saved"; fi
fi

echo "## one-hop latency at the activation size ($act_bytes B per token)"
"$build/bench/strata-bench-xport" --gap-ms 40 --gap-bytes "$act_bytes" 2>/dev/null > "$tmp/xport.txt" || true
grep -Ei "latency|bytes|gap|^ *[0-9]" "$tmp/xport.txt" | head -16 || true
# "... plain TCP loopback ...: receiver blocked in poll median X us, ...; spinning median Y us, ..."
read -r tcp_blocked tcp_spin < <(awk '/plain TCP loopback/ {
    for (i = 1; i <= NF; i++) if ($i == "median") m[++n] = $(i + 1); print m[1], m[2] }' "$tmp/xport.txt") || true
port=$(free_port)
ucx_perftest -t ucp_am_lat -s "$act_bytes" -n 2000 -w 200 -p "$port" >/dev/null 2>&1 & pids+=($!)
sleep 1
echo "# ucx_perftest -t ucp_am_lat -s $act_bytes (polling):"
ucx_perftest 127.0.0.1 -t ucp_am_lat -s "$act_bytes" -n 2000 -w 200 -p "$port" 2>/dev/null | tail -3 \
    | tee "$tmp/perftest.txt" || true
port=$(free_port)
ucx_perftest -t ucp_am_lat -s "$act_bytes" -n 1000 -w 100 -p "$port" -E sleep >/dev/null 2>&1 & pids+=($!)
sleep 1
echo "# ucx_perftest -t ucp_am_lat -s $act_bytes -E sleep (the receiver sleeps in epoll, as the cluster's do):"
ucx_perftest 127.0.0.1 -t ucp_am_lat -s "$act_bytes" -n 1000 -w 100 -p "$port" -E sleep 2>/dev/null \
    | grep '^Final' | tee "$tmp/perftest_sleep.txt" || true
# "Final: iterations 50%ile average overall" (us): one-way latency (half the round trip).
perf_med=$(awk '/^Final:/ {print $3}' "$tmp/perftest.txt")
perf_mean=$(awk '/^Final:/ {print $5}' "$tmp/perftest.txt")
perf_sleep=$(awk '/^Final:/ {print $3}' "$tmp/perftest_sleep.txt")
read -r hop_med hop_mean < "$tmp/hop_us" 2>/dev/null || true
read -r off_med off_mean < "$tmp/hop_us_off" 2>/dev/null || true
if [ -n "$perf_med" ] && [ -n "${hop_med:-}" ]; then
  awk -v hm="$hop_med" -v ha="$hop_mean" -v pm="$perf_med" -v pa="$perf_mean" -v ps="${perf_sleep:-0}" \
      -v b="$act_bytes" -v om="${off_med:-}" -v oa="${off_mean:-}" -v poll="${STRATA_XPORT_POLL_US:-1000}" 'BEGIN {
    printf "per hop at %d B: cluster median %.1f us (mean %.1f; STRATA_XPORT_POLL_US=%s)%s; ucx_perftest ucp_am_lat median %.1f us (mean %.1f), -E sleep median %.1f us; ratio to ucx_perftest %.2fx (medians), %.2fx (means)\n",
           b, hm, ha, poll, om == "" ? "" : sprintf(", polling off %.1f us (mean %.1f)", om, oa), pm, pa, ps, hm / pm, ha / pa }'
fi
if [ -n "${tcp_blocked:-}" ] && [ -n "${hop_med:-}" ]; then
  awk -v hm="$hop_med" -v om="${off_med:-}" -v tb="$tcp_blocked" -v ts="$tcp_spin" -v b="$act_bytes" \
      -v poll="${STRATA_XPORT_POLL_US:-1000}" 'BEGIN {
    printf "floor at %d B after the same 40 ms gap: plain TCP loopback without UCX %.1f us (receiver blocked), %.1f us (spinning); cluster %.1f us (STRATA_XPORT_POLL_US=%s) = %.2fx the blocked floor%s\n",
           b, tb, ts, hm, poll, hm / tb, om == "" ? "" : sprintf(", polling off %.1f us = %.2fx", om, om / tb) }'
fi
