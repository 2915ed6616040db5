#!/usr/bin/env bash
# control_scale.sh — issue 18's control-plane figures at fleet scale (a
# benchmark: figures, not pass/fail).
#
#   bench/control_scale.sh [--sizes 1000,5000,10000] [--build DIR] [--coordinator BIN]
#                          [--sim c|python] [--threads T] [--load] [--preconnect] [--window S] [--settle S]
#                          [--cold-max S] [--per-proc N] [--shared-connections] [--keep]
#
# For each N: a fresh strata-coordinator --live on loopback and N simulated
# workers over the real gRPC API, all started at once, one TCP connection per
# worker as the daemons have: Register as daemon/registration.c sends it (a
# CPU node), then Heartbeat at 1 Hz with phases spread over the second, the
# daemon's 2 s deadlines and retries.
#   --sim c (default): strata-fleet-sim (bench/fleet_sim.c), one process on
#     gRPC's C core, every call asynchronous on --threads (default 2)
#     completion queues; --load adds load reports to the heartbeats;
#     --preconnect makes every connection before the first Register (the
#     cold start is then the registrations alone: a diagnostic).
#   --sim python: tests/control/fleet_sim.py (grpc.aio) in processes of
#     --per-proc workers; too slow for 10k workers on a small machine.
# --shared-connections: gRPC's one connection per simulator process instead
# (the coordinator's registry and loop are measured, not its connections).
# Prints per N: coordinator CPU (% of one core, steady window), RSS,
# heartbeat p50/p99/max, cold start of the whole fleet (until ListNodes shows
# all N ready), Register/Heartbeat deadline misses, false suspects,
# `stratactl nodes` latency, and the simulator's own CPU
# (bench/control_scale.py has the definitions). The simulator shares the
# machine with the coordinator: on a small machine its own delay is part of
# the heartbeat round trip, and its CPU is shown beside the coordinator's.
# Release build (default build/; built when missing). --coordinator BIN
# measures another build's coordinator (e.g. an older commit's) with the same
# simulator. Raises the open-file limit to the hard limit (10k workers need
# 10k descriptors in the coordinator and as many in the simulator; both say
# so when the hard limit is too low).
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
    --sizes|--window|--per-proc|--settle|--cold-max|--sim|--threads) args+=("$1" "$2"); shift 2 ;;
    --keep|--shared-connections|--load|--preconnect) args+=("$1"); shift ;;
    *) echo "usage: $0 [--sizes N,N,...] [--build DIR] [--coordinator BIN] [--sim c|python] [--threads T] [--load] [--preconnect] [--window S] [--settle S] [--cold-max S] [--per-proc N] [--shared-connections] [--keep]" >&2
       exit 2 ;;
  esac
done
shared="${STRATA_SHARED:-$root/../shared}"
if [ ! -x "$build/coordinator/strata-coordinator" ] || [ ! -x "$build/cli/stratactl" ] ||
   [ ! -x "$build/bench/strata-fleet-sim" ]; then
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j2 --target strata-coordinator stratactl strata-fleet-sim >/dev/null
fi
ulimit -n "$(ulimit -Hn)"
exec /usr/bin/python3 bench/control_scale.py \
  --coordinator "${coordinator:-$build/coordinator/strata-coordinator}" --stratactl "$build/cli/stratactl" \
  --fleet-sim "$build/bench/strata-fleet-sim" \
  --proto proto/control.proto --model "$shared/models/stories260K.gguf" "${args[@]}"
