#!/usr/bin/env bash
# roofline.sh — decode speed of a model against this machine's memory-read
# roofline, both measured in the same run, interleaved.
#
#   bench/roofline.sh MODEL.gguf [THREADS] [TP] [BUILD_DIR]
#   env: ROUNDS (default 3), MEMBW_RUNS (default 6), BENCH_REPS (default 2)
#
# Decode is memory-bound: each token streams every weight once, so
#   roofline tok/s = read bandwidth (bytes/s, strata-membw, THREADS threads:
#                    the best of its read kernels, an upper bound)
#                    / bytes read per token:
#                      the weights (strata-bench's backend accounting) less
#                      token_embd when the model has its own output.weight
#                      (decode reads one row of the embedding per token, not
#                      the table; with tied output the lm_head streams it)
#                    + the KV cache read by attention (strata-bench's
#                      kv_read_bytes_per_token: K and V of every position so
#                      far, every layer, averaged over the decode steps)
# and decode tok/s / roofline tok/s says how close the kernels get.
# The best read is a burst (strata-membw's comment: on a VM the same read
# swings 28-63 GB/s from run to run), so the rounds also print the sustained
# roofline, from strata-membw's "sustained_gbps" (the best kernel's median
# pass over its whole 2 GiB buffer, as a decode token streams the model), and
# decode's share of it: the bandwidth a decode can count on, not a bound.
#
# On a shared machine or a VM the bandwidth swings from minute to minute
# (26-75 GB/s were seen here within an hour), and a bandwidth taken a minute
# away from the decode makes the share noise. So each of ROUNDS rounds
# measures strata-membw and then strata-bench back to back with the same
# thread count, and the share is taken per round. Printed: every round, then
# the median over rounds (bandwidth, decode, share) and the best (the best
# decode over the best roofline), with the load average before and after.
# Use a Release build (README: build/), ideally on a quiet machine.
set -euo pipefail
model=${1:?usage: bench/roofline.sh MODEL.gguf [THREADS] [TP] [BUILD_DIR]}
threads=${2:-$(nproc)}
tp=${3:-1}
build=${4:-build}
rounds=${ROUNDS:-3}
membw_runs=${MEMBW_RUNS:-6}
bench_reps=${BENCH_REPS:-2}
py=/usr/bin/python3

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
tensors=$("$build/cli/strata-gguf" inspect "$model")
results=()
for ((r = 1; r <= rounds; r++)); do
    bw=$("$build/bench/strata-membw" --threads "$threads" --runs "$membw_runs" --json)
    bench=$("$build/bench/strata-bench" --model "$model" --threads "$threads" --tp "$tp" --gen 32 \
        --reps "$bench_reps" --json)
    results+=("{\"membw\": $bw, \"bench\": $bench}")
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
"$py" - "$threads" "$tensors" "$load_before" "$load_after" "${results[@]}" <<'PY'
import json, statistics, sys
threads, tensors, load0, load1 = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
rounds = [json.loads(a) for a in sys.argv[5:]]
# strata-gguf inspect's tensor rows: index, name, type, shape, bytes, offset.
tbytes = {}
for line in tensors.splitlines():
    f = line.split()
    if len(f) >= 6 and f[0].isdigit() and f[-2].isdigit():
        tbytes[f[1]] = int(f[-2])
embd = tbytes.get("token_embd.weight", 0) if "output.weight" in tbytes else 0
rows = []
for rd in rounds:
    best = max((r for r in rd["membw"]["results"] if r["threads"] == threads), key=lambda r: r["read_gbps"])
    b = rd["bench"]
    wbytes = b["weights_gib"] * 2**30 - embd
    tok_bytes = wbytes + b.get("kv_read_bytes_per_token", 0)
    roof = best["read_gbps"] * 1e9 / tok_bytes
    sust = best.get("sustained_gbps", 0.0)
    sroof = sust * 1e9 / tok_bytes
    rows.append(dict(gbps=best["read_gbps"], kern=best.get("best_kernel", "?"), roof=roof,
                     dec=b["decode_tok_s"], share=b["decode_tok_s"] / roof, bench=b,
                     wbytes=wbytes, tok_bytes=tok_bytes, sust=sust, sroof=sroof,
                     sshare=b["decode_tok_s"] / sroof if sroof else 0.0))
b0 = rows[0]["bench"]
print(f"model            {b0['model']} ({threads} threads, tp {b0['tp']}, prompt {b0['prompt_len']}, gen {b0['gen']})")
print(f"bytes per token  {rows[0]['tok_bytes'] / 1e9:.3f} GB: weights {rows[0]['wbytes'] / 1e9:.3f} GB"
      + (f" (token_embd's {embd / 1e9:.3f} GB read one row a token)" if embd else "")
      + f" + KV {b0.get('kv_read_bytes_per_token', 0) / 1e6:.2f} MB")
print(f"{'round':>5} {'membw GB/s':>11} {'best kernel':>18} {'roofline t/s':>13} {'decode t/s':>11} {'share':>6}"
      f" | {'sustained GB/s':>14} {'roofline t/s':>13} {'share':>6}")
for i, r in enumerate(rows, 1):
    print(f"{i:>5} {r['gbps']:>11.2f} {r['kern']:>18} {r['roof']:>13.2f} {r['dec']:>11.2f} {100 * r['share']:>5.0f}%"
          f" | {r['sust']:>14.2f} {r['sroof']:>13.2f} {100 * r['sshare']:>5.0f}%")
med = lambda k: statistics.median(r[k] for r in rows)
bw = [r["gbps"] for r in rows]
print(f"median           membw {med('gbps'):.2f} GB/s (range {min(bw):.2f}-{max(bw):.2f}), roofline {med('roof'):.2f} tok/s, "
      f"decode {med('dec'):.2f} tok/s, share {100 * med('share'):.0f}% (per round)")
print(f"sustained        membw {med('sust'):.2f} GB/s, roofline {med('sroof'):.2f} tok/s, "
      f"decode's share {100 * med('sshare'):.0f}% (per round)")
best_roof, best_dec = max(r["roof"] for r in rows), max(r["dec"] for r in rows)
print(f"best             roofline {best_roof:.2f} tok/s, decode {best_dec:.2f} tok/s, share {100 * best_dec / best_roof:.0f}%")
print(f"prefill          {statistics.median(r['bench']['prefill_tok_s'] for r in rows):8.2f} tok/s median "
      f"(TTFT {b0['ttft_s']:.3f} s, TPOT {b0['tpot_s'] * 1e3:.1f} ms, all-reduce {100 * b0['allreduce_share']:.1f}%, "
      f"peak RSS {b0['peak_rss_gib']:.2f} GiB in round 1)")
print(f"load average     {load0} before, {load1} after")
PY
