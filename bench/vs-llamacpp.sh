#!/usr/bin/env bash
# vs-llamacpp.sh — Strata against llama.cpp's llama-bench on the same models,
# thread count and machine (a benchmark: figures, not pass/fail).
#
#   bench/vs-llamacpp.sh --llama-bench PATH [--rounds N] [--threads T] [--build DIR] MODEL.gguf...
#
# Two figures, as llama-bench defines them:
#   pp64  prompt processing: a 64-token prompt in one batch, tok/s;
#   tg32  text generation: 32 tokens decoded one at a time, tok/s.
# llama-bench: `-m MODEL -p 64 -n 32 -t T -r 1 -o json` (one repetition after
# its own warm-up; pp64 and tg32 are separate tests, each from an empty KV
# cache). Strata: two strata-bench runs (--reps 1: one warm-up, one timed)
# with the same semantics:
#   pp64  --prompt-len 64 --gen 1   prefill of 64 tokens in one batch
#                                   (max batch = the prompt), its prefill tok/s;
#   tg32  --prompt-len 1 --gen 33   1 token of prefill, then 32 one-token
#                                   decode steps at positions 1..32 (llama-bench:
#                                   0..31), its decode tok/s (tokens after the
#                                   first / decode seconds).
# Each round runs both engines on a model, alternating which goes first from
# round to round so that drift (other load, clocks) hits both alike; the table
# gives the median over N rounds (default 4) per figure, and the ratio
# Strata / llama.cpp (> 1: Strata faster). Threads: default 2, both engines.
#
# STRATA_SIMD (scalar|avx2|avx512), when set, passes through to strata-bench;
# the header prints the level Strata uses (the rule of compute/cpu/matmul.c:
# the best of avx512 (F+BW+VL) / avx2 (+FMA+F16C) / scalar the CPU has,
# lowered by a valid STRATA_SIMD) and the CPU model. LLAMA_BENCH_ARGS adds
# arguments to llama-bench (e.g. "-fa 0" or "-rtr 1"); none by default.
# strata-bench comes from DIR/bench (default build/, a Release build; it is
# built when missing). Use a quiet machine: the figures are tok/s.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py=/usr/bin/python3
usage() {
  echo "usage: $0 --llama-bench PATH [--rounds N] [--threads T] [--build DIR] MODEL.gguf..." >&2
  exit 2
}
lb="" rounds=4 threads=2 build=build models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --llama-bench) [ $# -ge 2 ] || usage; lb="$2"; shift 2 ;;
    --rounds) [ $# -ge 2 ] || usage; rounds="$2"; shift 2 ;;
    --threads) [ $# -ge 2 ] || usage; threads="$2"; shift 2 ;;
    --build) [ $# -ge 2 ] || usage; build="$2"; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "$0: unknown option $1" >&2; usage ;;
    *) models+=("$1"); shift ;;
  esac
done
[ -n "$lb" ] && [ ${#models[@]} -gt 0 ] || usage
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "$0: --rounds: expected a positive integer" >&2; exit 2; }
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "$0: --threads: expected a positive integer" >&2; exit 2; }
[ -x "$lb" ] || { echo "$0: llama-bench '$lb' is not an executable" >&2; exit 2; }
for m in "${models[@]}"; do [ -r "$m" ] || { echo "$0: cannot read model '$m'" >&2; exit 2; }; done
sb="$build/bench/strata-bench"
if [ ! -x "$sb" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "$(nproc)" --target strata-bench >/dev/null
fi
read -r -a lb_extra <<< "${LLAMA_BENCH_ARGS:-}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# run NAME CMD...: stdout to $tmp/NAME.json, stderr to $tmp/NAME.err; on failure
# show the error and stop.
run() {
  local name="$1"; shift
  if ! "$@" >"$tmp/$name.json" 2>"$tmp/$name.err"; then
    echo "$0: failed: $*" >&2
    tail -n 20 "$tmp/$name.err" >&2
    exit 1
  fi
}
strata_round() { # MODEL-INDEX ROUND
  local m="${models[$1]}"
  run "s-pp-$1-$2" "$sb" --model "$m" --threads "$threads" --prompt-len 64 --gen 1 --reps 1 --json
  run "s-tg-$1-$2" "$sb" --model "$m" --threads "$threads" --prompt-len 1 --gen 33 --reps 1 --json
}
llama_round() {
  run "l-$1-$2" "$lb" -m "${models[$1]}" -p 64 -n 32 -t "$threads" -r 1 -o json "${lb_extra[@]}"
}
# One line per finished round on stderr, so a long run shows progress.
progress() {
  "$py" - "$tmp" "$1" "$2" "$rounds" "$(basename "${models[$1]}")" <<'PY' >&2
import json, sys
tmp, i, r, n, name = sys.argv[1:6]
s_pp = json.load(open(f"{tmp}/s-pp-{i}-{r}.json"))["prefill_tok_s"]
s_tg = json.load(open(f"{tmp}/s-tg-{i}-{r}.json"))["decode_tok_s"]
l = {(t["n_prompt"], t["n_gen"]): t["samples_ts"][0] for t in json.load(open(f"{tmp}/l-{i}-{r}.json"))}
print(f"  {name} round {r}/{n}: pp64 Strata {s_pp:.2f} llama.cpp {l[(64, 0)]:.2f} | "
      f"tg32 Strata {s_tg:.2f} llama.cpp {l[(0, 32)]:.2f} tok/s")
PY
}

"$py" - "$threads" "$rounds" "$lb" "$sb" <<'PY'
import os, sys
threads, rounds, lb, sb = sys.argv[1:5]
flags, cpu = set(), "unknown"
for line in open("/proc/cpuinfo"):
    k, _, v = line.partition(":")
    if k.strip() == "model name" and cpu == "unknown": cpu = v.strip()
    if k.strip() == "flags" and not flags: flags = set(v.split())
best = "scalar"
if {"avx2", "fma", "f16c"} <= flags:
    best = "avx2"
    if {"avx512f", "avx512bw", "avx512vl"} <= flags: best = "avx512"
levels = ["scalar", "avx2", "avx512"]
env = os.environ.get("STRATA_SIMD", "")
simd = env if env in levels and levels.index(env) <= levels.index(best) else best
note = f"STRATA_SIMD={env}" if env else "STRATA_SIMD unset"
if env and simd != env: note += f" (ignored: best here is {best})"
print(f"# Strata vs llama.cpp: pp64 / tg32, {threads} threads, median of {rounds} rounds")
print(f"CPU: {cpu} ({os.cpu_count()} CPUs); Strata SIMD: {simd} ({note})")
print(f"strata-bench: {sb}; llama-bench: {lb}")
print(f"load average at start: {open('/proc/loadavg').read().split()[0]} (other processes skew both engines)")
PY

for i in "${!models[@]}"; do
  for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then strata_round "$i" "$r"; llama_round "$i" "$r"
    else llama_round "$i" "$r"; strata_round "$i" "$r"; fi
    progress "$i" "$r"
  done
done

"$py" - "$tmp" "$rounds" "${models[@]}" <<'PY'
import json, statistics, sys
tmp, rounds, models = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for i, model in enumerate(models):
    s = {"pp64": [], "tg32": []}
    l = {"pp64": [], "tg32": []}
    info = {}
    for r in range(1, rounds + 1):
        s["pp64"].append(json.load(open(f"{tmp}/s-pp-{i}-{r}.json"))["prefill_tok_s"])
        s["tg32"].append(json.load(open(f"{tmp}/s-tg-{i}-{r}.json"))["decode_tok_s"])
        for t in json.load(open(f"{tmp}/l-{i}-{r}.json")):
            fig = {(64, 0): "pp64", (0, 32): "tg32"}.get((t["n_prompt"], t["n_gen"]))
            if fig: l[fig].append(t["samples_ts"][0])
            info = t
    print()
    print(f"## {model}")
    if info:
        print(f"llama.cpp: {info.get('model_type', '?')}, {info.get('model_size', 0) / 2**30:.2f} GiB, "
              f"build {info.get('build_commit', '?')} ({info.get('build_number', '?')}), "
              f"flash_attn {json.dumps(info.get('flash_attn'))}")
    print()
    print("| figure | Strata median tok/s | llama.cpp median tok/s | Strata/llama.cpp |")
    print("| --- | ---: | ---: | ---: |")
    for fig in ("pp64", "tg32"):
        sm, lm = statistics.median(s[fig]), statistics.median(l[fig])
        print(f"| {fig} | {sm:.2f} | {lm:.2f} | {sm / lm:.2f} |")
print()
print(f"load average at end: {open('/proc/loadavg').read().split()[0]}")
PY
