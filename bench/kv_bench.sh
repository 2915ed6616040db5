#!/usr/bin/env bash
# kv_bench.sh — issue 15's KV scheduling figures (a benchmark: figures, not pass/fail).
#
#   bench/kv_bench.sh [--build DIR] [--before DIR | --before-commit REV] [--kv-blocks N]
#                     [--clients C] [--requests R] [--prefix-requests P] [--threads T]
#
# A static PP 2 cluster (strata-coordinator + two strata-worker processes on
# loopback, TP 1, T threads each, default 1) on stories260K (../shared/models,
# or $STRATA_SHARED/models; n_ctx 2048, so the issue's workload fits unscaled)
# with a fixed KV pool (N blocks of 16 tokens per stage, default 512 = 8192
# tokens), for the "before" build (if given) and then this one:
#  1. mixed: R (default 96) greedy streaming requests, prompt 50..500 tokens,
#     max_tokens 200..1000 (ignore_eos), the same seeded list for every build,
#     from C (default 32) closed-loop clients: requests/s, tokens/s, mean
#     concurrent running sequences (GET /v1/stages every 50 ms), TTFT p50/p99,
#     preemptions, and the CPU seconds of the coordinator and the workers (a
#     steadier figure than wall time on a shared machine), batches and their
#     mean round trip;
#  2. the same requests ending early: each stream is closed by its client after
#     10..60% of its max_tokens (as an end-of-generation token would end it);
#  3. shared system prompt: P (default 128) requests of the ~300-token system
#     prompt + a short question, max_tokens 8: TTFT p50/p99 and prefill
#     throughput (prompt tokens / wall time) with prefix caching on and off
#     (--no-prefix-caching), and the tokens the stages actually prefilled.
# --before DIR: a Release build dir of the old code; --before-commit REV
# builds REV (e.g. 2850ed2, the commit before issue 15) in a temporary git
# worktree first (removed at the end). Release build of this tree in DIR
# (default build/; built when missing). UCX_TLS=tcp unless set. Every process
# it starts is stopped by pid (bench/kv_bench.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build=build
before=""
before_commit=""
args=()
usage="usage: $0 [--build DIR] [--before DIR | --before-commit REV] [--kv-blocks N] [--clients C] [--requests R] [--prefix-requests P] [--threads T]"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --before) before="$2"; shift 2 ;;
    --before-commit) before_commit="$2"; shift 2 ;;
    --kv-blocks|--clients|--requests|--prefix-requests|--threads) args+=("$1" "$2"); shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
shared="${STRATA_SHARED:-$root/../shared}"
export UCX_TLS="${UCX_TLS:-tcp}"
build_tree() { # SRC DIR
  [ -f "$2/CMakeCache.txt" ] || cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$2" -j2 --target strata-coordinator strata-worker >/dev/null
}
wt=""
cleanup() { [ -z "$wt" ] || git worktree remove --force "$wt" >/dev/null 2>&1 || true; }
trap cleanup EXIT
builds=()
if [ -n "$before_commit" ]; then
  wt="$(mktemp -d)/before"
  git worktree add --detach "$wt" "$before_commit" >/dev/null
  build_tree "$wt" "$wt/build"
  before="$wt/build"
fi
[ -z "$before" ] || builds+=(--build "before=$before")
build_tree . "$build"
builds+=(--build "after=$build")
/usr/bin/python3 bench/kv_bench.py "${builds[@]}" --shared "$shared" "${args[@]}"
