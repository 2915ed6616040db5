#!/usr/bin/env bash
# failover.sh — issue 12's failover figures (a benchmark: figures, not pass/fail).
#
#   bench/failover.sh [--kills N] [--fault crash|hang] [--build DIR] [--streams S] [--tokens T]
#                     [--kill-at K] [--keep]
#
# stories260K (../shared/models, or $STRATA_SHARED/models) in live mode: a
# strata-coordinator --live and 3 strata-worker processes on loopback (PP 2 +
# one spare). N times (default 10): S greedy SSE streams (default 4, T = 400
# tokens, ignore_eos), and once each has K = 32 tokens the worker holding stage
# 1 (stratactl placement show) is faulted:
#   crash  SIGKILL (default);
#   hang   SIGSTOP, found by the per-micro-batch deadline (cluster.c
#          check_overdue); SIGCONT + SIGKILL once the streams are over.
# The faulted worker is then started again (same name, same port) and becomes
# the spare of the next kill. Per kill: detection (kill -> the coordinator's
# `recovery: ... holding` log line), kill-to-next-token (client side,
# time.monotonic(); the first token received after the hold line), tokens
# recomputed (strata_tokens_recomputed_total delta) and the coordinator's own
# "serves X s after the loss"; then p50, p99 and the raw lists. A network
# partition is not injected here (it needs network namespaces).
# Release build (default build/; the binaries are built when missing).
# The work is bench/failover.py (/usr/bin/python3, stdlib only); every process
# it starts is stopped by pid.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build=build
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --kills|--fault|--streams|--tokens|--kill-at) args+=("$1" "$2"); shift 2 ;;
    --keep) args+=("$1"); shift ;;
    *) echo "usage: $0 [--kills N] [--fault crash|hang] [--build DIR] [--streams S] [--tokens T] [--kill-at K] [--keep]" >&2
       exit 2 ;;
  esac
done
shared="${STRATA_SHARED:-$root/../shared}"
if [ ! -x "$build/coordinator/strata-coordinator" ] || [ ! -x "$build/daemon/strata-worker" ] ||
   [ ! -x "$build/cli/stratactl" ]; then
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j2 --target strata-coordinator strata-worker stratactl >/dev/null
fi
exec /usr/bin/python3 bench/failover.py --build "$build" --shared "$shared" "${args[@]}"
