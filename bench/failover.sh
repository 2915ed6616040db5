#!/usr/bin/env bash
# failover.sh — issue 12's failover figures (a benchmark: figures, not pass/fail).
#
#   bench/failover.sh [--kills N] [--fault crash|hang|partition|all] [--build DIR]
#                     [--streams S] [--tokens T] [--kill-at K] [--threads N] [--keep]
#
# A live strata-coordinator and 3 strata-worker processes (PP 2 + one spare) on
# stories260K (../shared/models, or $STRATA_SHARED/models), or on $BENCH_MODEL
# (e.g. BENCH_MODEL=/work/models/bench-1b-f16.gguf with --tokens 48 --kill-at 8
# --streams 2 --threads 2: then the stage load is the larger part of the
# recovery). N times (default 10): S greedy SSE streams (default 4, T = 400
# tokens, ignore_eos), and once each has K = 32 tokens the worker holding stage
# 1 is faulted:
#   crash      SIGKILL (default);
#   hang       SIGSTOP, found by the per-micro-batch deadline;
#   partition  every worker in its own network namespace; nft drops every
#              packet of the victim's (needs root, ip netns, nft; else skipped);
#   all        the three in turn.
# The faulted worker is then started again (same name, same port) and becomes
# the spare of the next kill. Per kill: detection, kill-to-next-token, tokens
# recomputed, the coordinator's own recovery time and the stage load time
# (bench/failover.py has the definitions); then p50, p99 and the raw lists.
# Release build (default build/; the binaries are built when missing).
# Every process it starts is stopped by pid.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build=build
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --kills|--fault|--streams|--tokens|--kill-at|--threads) args+=("$1" "$2"); shift 2 ;;
    --keep) args+=("$1"); shift ;;
    *) echo "usage: $0 [--kills N] [--fault crash|hang|partition|all] [--build DIR] [--streams S] [--tokens T] [--kill-at K] [--threads N] [--keep]" >&2
       exit 2 ;;
  esac
done
shared="${STRATA_SHARED:-$root/../shared}"
if [ ! -x "$build/coordinator/strata-coordinator" ] || [ ! -x "$build/daemon/strata-worker" ] ||
   [ ! -x "$build/cli/stratactl" ]; then
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j2 --target strata-coordinator strata-worker stratactl >/dev/null
fi
[ -n "${BENCH_MODEL:-}" ] && args+=(--model "$BENCH_MODEL")
exec /usr/bin/python3 bench/failover.py --build "$build" --shared "$shared" "${args[@]}"
