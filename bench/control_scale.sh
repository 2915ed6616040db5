#!/usr/bin/env bash
# control_scale.sh — issue 18's control-plane figures at fleet scale (a
# benchmark: figures, not pass/fail).
#
#   bench/control_scale.sh [--sizes 1000,5000,10000] [--build DIR] [--coordinator BIN]
#                          [--window S] [--per-proc N] [--cold-max S] [--shared-connections] [--keep]
#
# For each N: a fresh strata-coordinator --live on loopback and N simulated
# workers over the real gRPC API (tests/control/fleet_sim.py: one channel per
# worker, Register, Heartbeat at 1 Hz; Python asyncio on grpc.aio, split over
# processes of --per-proc workers, default 2500), all started at once; one TCP
# connection per worker as the daemons have, or with --shared-connections
# grpc's sharing within a simulator process (a small machine cannot drive
# thousands of Python-side connections; the coordinator's registry and loop are
# still measured, its accepts and per-connection cost are not). Prints
# per N: coordinator CPU (% of one core, steady state), RSS, heartbeat
# p50/p99, cold start of the whole fleet (until ListNodes shows all N ready),
# Register/Heartbeat deadline misses, false suspects, `stratactl nodes`
# latency (bench/control_scale.py has the definitions). The simulators share
# the machine with the coordinator: on a small machine their own delay is part
# of the heartbeat round trip.
# Release build (default build/; built when missing). --coordinator BIN
# measures another build's coordinator (e.g. an older commit's) with the same
# simulators. Raises the open-file limit to the hard limit (10k workers need
# 10k descriptors in the coordinator and as many in the simulators).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build=build
coordinator=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --coordinator) coordinator="$2"; shift 2 ;;
    --sizes|--window|--per-proc|--settle|--cold-max) args+=("$1" "$2"); shift 2 ;;
    --keep|--shared-connections) args+=("$1"); shift ;;
    *) echo "usage: $0 [--sizes N,N,...] [--build DIR] [--coordinator BIN] [--window S] [--per-proc N] [--cold-max S] [--shared-connections] [--keep]" >&2
       exit 2 ;;
  esac
done
shared="${STRATA_SHARED:-$root/../shared}"
if [ ! -x "$build/coordinator/strata-coordinator" ] || [ ! -x "$build/cli/stratactl" ]; then
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j2 --target strata-coordinator stratactl >/dev/null
fi
ulimit -n "$(ulimit -Hn)"
exec /usr/bin/python3 bench/control_scale.py \
  --coordinator "${coordinator:-$build/coordinator/strata-coordinator}" --stratactl "$build/cli/stratactl" \
  --proto proto/control.proto --model "$shared/models/stories260K.gguf" "${args[@]}"
