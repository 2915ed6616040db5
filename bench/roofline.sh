#!/usr/bin/env bash
# roofline.sh — decode speed of a model against this machine's memory-read
# roofline, measured in the same run.
#
#   bench/roofline.sh MODEL.gguf [THREADS] [TP] [BUILD_DIR]
#
# Decode is memory-bound: each token streams every weight once, so
#   roofline tok/s = read bandwidth (bytes/s, strata-membw, THREADS threads:
#                    the best of its read kernels, an upper bound)
#                    / weight bytes streamed per token: the resident weights
#                      (strata-bench's backend accounting) less token_embd
#                      when the model has its own output.weight (decode reads
#                      one row of the embedding per token, not the table;
#                      with tied output the lm_head streams it, so it counts)
# and the ratio decode tok/s / roofline tok/s says how close the kernels get.
# Use a Release build on a quiet machine.
set -euo pipefail
model=${1:?usage: bench/roofline.sh MODEL.gguf [THREADS] [TP] [BUILD_DIR]}
threads=${2:-$(nproc)}
tp=${3:-1}
build=${4:-build}  # a Release build (README: build/)
py=/usr/bin/python3

bw=$("$build/bench/strata-membw" --threads "$threads" --json)
bench=$("$build/bench/strata-bench" --model "$model" --threads "$threads" --tp "$tp" --gen 32 --json)
tensors=$("$build/cli/strata-gguf" inspect "$model")
"$py" - "$bw" "$bench" "$threads" "$tensors" <<'PY'
import json, sys
bw, bench, threads = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
# strata-gguf inspect's tensor rows: index, name, type, shape, bytes, offset.
tbytes = {}
for line in sys.argv[4].splitlines():
    f = line.split()
    if len(f) >= 6 and f[0].isdigit() and f[-2].isdigit():
        tbytes[f[1]] = int(f[-2])
best = max((r for r in bw["results"] if r["threads"] == threads), key=lambda r: r["read_gbps"])
gbps = best["read_gbps"]  # the best over strata-membw's kernels
kern = best.get("best_kernel", bw.get("kernel", "?"))
resident = bench["weights_gib"] * 2**30
embd = tbytes.get("token_embd.weight", 0) if "output.weight" in tbytes else 0
wbytes = resident - embd
roof = gbps * 1e9 / wbytes
print(f"memory read      {gbps:8.2f} GB/s ({threads} threads, best kernel {kern})")
print(f"weights          {resident / 1e9:8.3f} GB resident, {wbytes / 1e9:.3f} GB streamed per token"
      + (f" (token_embd's {embd / 1e9:.3f} GB read one row a token)" if embd else ""))
print(f"roofline         {roof:8.2f} tok/s")
print(f"decode           {bench['decode_tok_s']:8.2f} tok/s  ({100 * bench['decode_tok_s'] / roof:.0f}% of roofline)")
print(f"prefill          {bench['prefill_tok_s']:8.2f} tok/s  (prompt {bench['prompt_len']} tokens)")
print(f"TTFT {bench['ttft_s']:.3f} s, TPOT {bench['tpot_s'] * 1e3:.1f} ms, all-reduce share {100 * bench['allreduce_share']:.1f}%, peak RSS {bench['peak_rss_gib']:.2f} GiB")
PY
