#!/usr/bin/env bash
# test_systemd_units.sh SRC WORKER COORDINATOR TOPO — the unit files of
# systemd/: `systemd-analyze verify` on copies whose paths point at this
# build (no warning allowed; a misspelt key must be caught), the settings the
# deployment relies on, the variables ExecStart= uses against the
# environment files, the offline `systemd-analyze security` exposure, the
# strata-worker@.service template against strata-worker.service, and
# Type=notify for real: both daemons send READY=1 and STOPPING=1 to a
# NOTIFY_SOCKET of ours, and WATCHDOG=1 at the rate WATCHDOG_USEC asks, which
# stops when the loop is wedged (watchdog_check.py). No system service is
# started or touched.
set -euo pipefail
src=$1 worker=$2 coord=$3 topo=$4
here=$(cd "$(dirname "$0")" && pwd)
fail=0
check() { if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }
command -v systemd-analyze >/dev/null || { echo "FAIL: systemd-analyze missing (scripts/bootstrap installs systemd)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/units" "$tmp/etc"

# Test copies: binaries of this build, /etc/strata -> a temporary directory.
for u in worker coordinator worker@; do
  sed -e "s#/usr/local/bin/strata-worker#$worker#g; s#/usr/local/bin/strata-coordinator#$coord#g" \
      -e "s#/usr/local/bin/strata-topo#$topo#g; s#/etc/strata/#$tmp/etc/#g" \
      "$src/systemd/strata-$u.service" > "$tmp/units/strata-$u.service"
  [ "$u" = worker@ ] || cp "$src/systemd/strata-$u.env" "$tmp/etc/"
done
cp "$tmp/units/strata-worker@.service" "$tmp/units/strata-worker@gpu0.service" # an instance
check "copies reference no /usr/local/bin binary" bash -c "! grep -q /usr/local/bin/ '$tmp'/units/*.service"

# 1. systemd-analyze verify: exit 0 and not one message.
rc=0
( cd "$tmp/units" && systemd-analyze verify ./strata-worker.service ./strata-coordinator.service \
    ./strata-worker@.service ./strata-worker@gpu0.service ) > "$tmp/verify.out" 2>&1 || rc=$?
cat "$tmp/verify.out"
check "systemd-analyze verify exits 0" test "$rc" -eq 0
check "systemd-analyze verify prints nothing" test ! -s "$tmp/verify.out"
# ... and it does catch mistakes (so the check above means something).
sed 's/^ProtectSystem=strict/ProtectSystm=strict/; s/^Type=notify/Type=notfy/' "$tmp/units/strata-worker.service" > "$tmp/units/bad.service"
( cd "$tmp/units" && systemd-analyze verify ./bad.service ) > "$tmp/bad.out" 2>&1 || true
check "verify reports a misspelt key" grep -q "Unknown key 'ProtectSystm'" "$tmp/bad.out"
check "verify reports a bad Type=" grep -q "Failed to parse service type" "$tmp/bad.out"
rm "$tmp/units/bad.service"

# 2. What the deployment relies on, in the three units.
for u in worker coordinator worker@; do
  f=$src/systemd/strata-$u.service
  for kv in Type=notify Restart=on-failure User=strata NoNewPrivileges=yes ProtectSystem=strict \
            ReadWritePaths=/var/lib/strata PrivateTmp=yes LimitMEMLOCK=infinity LimitNOFILE=1048576 \
            StandardError=journal StateDirectory=strata "EnvironmentFile=/etc/strata/strata-${u%@}.env" \
            WatchdogSec=30 SystemCallFilter=@system-service SystemCallFilter=~@privileged \
            SystemCallErrorNumber=EPERM ProtectProc=invisible RemoveIPC=yes; do
    check "strata-$u.service: $kv" grep -qx "$kv" "$f"
  done
done
wf=$src/systemd/strata-worker.service
check "worker: strata-topo writes nccl.env before start" grep -qx 'ExecStartPre=-/usr/local/bin/strata-topo --nccl-env --output /run/strata-worker/nccl.env \$STRATA_TOPO_ARGS' "$wf"
check "worker: nccl.env is not loaded (the worker derives the settings itself; an operator's NCCL_* wins, logged)" \
  bash -c "! grep -q '^EnvironmentFile=.*nccl.env' '$wf'"
check "worker: the fabric policy (STRATA_TOPO_ARGS) reaches strata-worker" \
  grep -q '^ExecStart=/usr/local/bin/strata-worker .*\$STRATA_TOPO_ARGS' "$wf"
check "worker: RuntimeDirectory for nccl.env" grep -qx 'RuntimeDirectory=strata-worker' "$wf"
check "worker: devices stay visible (GPUs, uverbs)" bash -c "! grep -q '^PrivateDevices=yes' '$wf'"
check "worker: no ProcSubset=pid (it reads /proc/meminfo, /proc/cpuinfo)" bash -c "! grep -q '^ProcSubset=' '$wf'"
cf=$src/systemd/strata-coordinator.service
check "coordinator: ProcSubset=pid, MemoryDenyWriteExecute=yes" bash -c "grep -qx ProcSubset=pid '$cf' && grep -qx MemoryDenyWriteExecute=yes '$cf'"
stop=$(sed -n 's/^TimeoutStopSec=//p' "$cf")
check "coordinator: TimeoutStopSec=$stop leaves room after the default --shutdown-grace 30" test "${stop:-0}" -ge 45
# The template: an instance reads its own env file after the shared one, and
# has its own runtime directory, name and certificate; otherwise it is
# strata-worker.service.
tf=$src/systemd/strata-worker@.service
check "worker@: reads /etc/strata/strata-worker@%i.env after strata-worker.env" \
  test "$(grep -n '^EnvironmentFile=/etc/strata/strata-worker.env' "$tf" | cut -d: -f1)" -lt \
       "$(grep -n '^EnvironmentFile=/etc/strata/strata-worker@%i.env$' "$tf" | cut -d: -f1)"
check "worker@: RuntimeDirectory=strata-worker-%i, node name %H-%i" \
  bash -c "grep -qx 'RuntimeDirectory=strata-worker-%i' '$tf' && grep -qx 'Environment=STRATA_NODE_NAME=%H-%i' '$tf'"
norm() { grep -v '^#' "$1" | grep -v '%i' | grep -v -e '^Description=' -e '^Environment=STRATA_NODE_NAME=' \
           -e '^Environment=STRATA_CERT=' -e '^Environment=STRATA_KEY=' \
           -e 'nccl.env' -e '^RuntimeDirectory=' -e '^$'; }
check "worker@: otherwise the same settings as strata-worker.service" diff <(norm "$wf") <(norm "$tf")

# 3. Every variable ExecStart= uses is set by the unit or the env file.
for u in worker coordinator; do
  f=$src/systemd/strata-$u.service
  vars=$(grep '^ExecStart=' "$f" | grep -o '\$[{]*[A-Z_]*' | tr -d '${' | sort -u)
  for v in $vars; do
    check "strata-$u: \$$v is set" bash -c "grep -q '^Environment=$v=' '$f' || grep -q '^$v=' '$src/systemd/strata-$u.env'"
  done
  # The env file is plain KEY=VALUE / comments / blank lines.
  check "strata-$u.env: only KEY=VALUE and comments" bash -c "! grep -Ev '^(#.*|[A-Z_][A-Z0-9_]*=.*|)$' '$src/systemd/strata-$u.env'"
done

# 4. Exposure (systemd-analyze security, offline): a figure, and a bound
# (before issue 17's hardening: worker 3.5, coordinator 3.2; after: 1.7, 1.4).
for u in worker coordinator; do
  ( cd "$tmp/units" && systemd-analyze security --offline=true --no-pager ./strata-$u.service ) > "$tmp/sec-$u.out" 2>&1 || true
  score=$(grep -o 'Overall exposure level for [^:]*: [0-9.]*' "$tmp/sec-$u.out" | awk '{print $NF}')
  echo "strata-$u.service exposure: ${score:-?} (0 = locked down, 10 = unprotected)"
  check "strata-$u.service exposure below 2.5" awk -v s="${score:-10}" 'BEGIN { exit !(s < 2.5) }'
done

# 5. Type=notify: the daemons really notify (READY=1, then STOPPING=1 on SIGTERM).
py=/usr/bin/python3
check "strata-worker notifies READY=1 / STOPPING=1" "$py" "$here/notify_check.py" "$worker" --listen 127.0.0.1:0 --name notify-test
cat > "$tmp/cluster.ini" <<INI
[cluster]
model = ${STRATA_SHARED:-$src/../shared}/models/stories260K.gguf
listen = 127.0.0.1:0
INI
check "strata-coordinator notifies READY=1 / STOPPING=1" "$py" "$here/notify_check.py" "$coord" --live \
  --config "$tmp/cluster.ini" --grpc-listen 127.0.0.1:0 --state "$tmp/state.json"

# 6. The watchdog: WATCHDOG=1 at half of WATCHDOG_USEC from the event loop, and
# none once the loop is wedged (the STRATA_TEST_WEDGE_AFTER_MS hook).
if ldd "$worker" | grep -q libsystemd; then
  check "strata-worker: watchdog pings, and stops when wedged" "$py" "$here/watchdog_check.py" "$worker" \
    --listen 127.0.0.1:0 --name watchdog-test
  check "strata-coordinator: watchdog pings, and stops when wedged" "$py" "$here/watchdog_check.py" "$coord" \
    --live --config "$tmp/cluster.ini" --grpc-listen 127.0.0.1:0 --state "$tmp/state2.json"
else
  echo "skip: built without libsystemd: no sd_notify, no watchdog"
fi

[ "$fail" -eq 0 ] && echo "test_systemd_units: all checks passed"
exit "$fail"
