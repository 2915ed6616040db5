#!/usr/bin/env bash
# test_topo_tool.sh TOPO [WORKER [RDMA_DEVICES]] — strata-topo as the worker unit runs it: the report
# (CPU count = nproc, the NUMA nodes of sysfs, RDMA devices), --nccl-env on
# stdout and into a file (atomically, the format systemd's EnvironmentFile=
# reads), and bad flags (exit 2). With WORKER: strata-worker applies the same
# settings to itself at start (STRATA_SYSFS_ROOT = the fixture tree), the
# policy flags from its command line, an operator's variable winning, and the
# log saying which value won. With RDMA_DEVICES: strata-rdma-devices on the
# same tree prints the same settings as strata-topo (one derivation, one printer).
set -euo pipefail
topo=$1
worker=${2:-}
rdma=${3:-}
fail=0
check() { # check DESCRIPTION COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$topo" > "$tmp/report"
cat "$tmp/report"
ncpu=$(nproc)
numa=$( (ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null || true) | wc -l)
[ "$numa" -gt 0 ] || numa=1
check "cpus line says $ncpu logical CPUs" grep -q "^cpus: $ncpu logical CPUs, [0-9]* cores, [0-9]* package" "$tmp/report"
check "numa line says $numa node(s)" grep -Eq "^numa: $numa nodes?$" "$tmp/report"
check "one line per NUMA node" test "$(grep -c '^  node [0-9]*: [0-9]* CPUs (' "$tmp/report")" -eq "$numa"

# RDMA devices as the kernel lists them.
n_ib=$( (ls /sys/class/infiniband 2>/dev/null || true) | wc -l)
"$topo" --nccl-env > "$tmp/env.stdout"
check "--nccl-env first line names the tool" test "$(head -1 "$tmp/env.stdout")" = "# NCCL/UCX fabric settings from strata-topo --nccl-env (ib/fabric_env.h)"
if [ "$n_ib" -eq 0 ]; then
  check "report: no RDMA device" grep -q "^rdma: no RDMA device" "$tmp/report"
  check "--nccl-env: only comments when there is no RDMA device" \
    test "$(cat "$tmp/env.stdout")" = "$(printf '%s\n' '# NCCL/UCX fabric settings from strata-topo --nccl-env (ib/fabric_env.h)' \
      '# no RDMA device: NCCL_IB_* left unset (NCCL uses its socket transport)')"
else
  check "report: $n_ib RDMA device(s)" grep -Eq "^rdma: $n_ib devices?$" "$tmp/report"
  check "--nccl-env: KEY=VALUE or comment lines" bash -c "! grep -Ev '^(#.*|(NCCL|UCX)_[A-Z_]+=[^ ]+)$' '$tmp/env.stdout'"
fi

# --output: the same text, written through a .tmp file and renamed.
check "--output writes the file" "$topo" --nccl-env --output "$tmp/nccl.env"
check "--output file = stdout text" cmp -s "$tmp/nccl.env" "$tmp/env.stdout"
check "no .tmp file left" test ! -e "$tmp/nccl.env.tmp"
# The file is what a shell with `set -a` and systemd both read: no stray lines.
check "env file sources in sh" sh -c "set -a; . '$tmp/nccl.env'"

# A sysfs fixture tree (--sysroot): a GPU and a RoCE HCA under one PCIe
# switch; the policy flags reach the output.
fx="$tmp/sysfs"
gpu_dir="sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"
nic_dir="sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0"
port="$fx/sys/class/infiniband/mlx5_0/ports/1"
mkdir -p "$fx/$gpu_dir" "$fx/$nic_dir" "$fx/sys/bus/pci/devices" "$port/gids" "$port/gid_attrs/types" "$port/gid_attrs/ndevs"
echo 0x10de > "$fx/$gpu_dir/vendor"; echo 0x030200 > "$fx/$gpu_dir/class"; echo 0 > "$fx/$gpu_dir/numa_node"
ln -s "$fx/$gpu_dir" "$fx/sys/bus/pci/devices/0000:03:00.0"
ln -s "$fx/$nic_dir" "$fx/sys/class/infiniband/mlx5_0/device"
echo "4: ACTIVE" > "$port/state"; echo Ethernet > "$port/link_layer"
echo 0000:0000:0000:0000:0000:ffff:0a00:0001 > "$port/gids/1"; echo "RoCE v2" > "$port/gid_attrs/types/1"
echo eth2 > "$port/gid_attrs/ndevs/0"
check "--sysroot: the derived settings" test "$("$topo" --nccl-env --sysroot "$fx" --ib-tc 106 --ib-sl 3)" = "$(printf '%s\n' \
  '# NCCL/UCX fabric settings from strata-topo --nccl-env (ib/fabric_env.h)' 'NCCL_IB_HCA==mlx5_0:1' 'NCCL_IB_GID_INDEX=1' 'NCCL_NET_GDR_LEVEL=PIX' \
  'NCCL_SOCKET_IFNAME==eth2' 'NCCL_IB_TC=106' 'NCCL_IB_SL=3' 'NCCL_IB_QPS_PER_CONNECTION=4' \
  'UCX_NET_DEVICES=mlx5_0:1' 'UCX_IB_GID_INDEX=1' 'UCX_IB_TRAFFIC_CLASS=106')"

if [ -n "$rdma" ]; then
  "$rdma" --sysroot "$fx" > "$tmp/rdma.out"
  check "strata-rdma-devices --sysroot: the port" \
    test "$(head -1 "$tmp/rdma.out")" = "mlx5_0 port 1: active, Ethernet (RoCE), RoCE v2 GID index 1, netdev eth2"
  check "strata-rdma-devices prints strata-topo --nccl-env's settings (NCCL_IB_HCA==...)" \
    test "$(sed -n '/^# NCCL\/UCX/,$p' "$tmp/rdma.out")" = "$("$topo" --nccl-env --sysroot "$fx")"
  check "strata-rdma-devices: NCCL_IB_HCA with the exact-match '='" grep -qx 'NCCL_IB_HCA==mlx5_0:1' "$tmp/rdma.out"
fi

if [ -n "$worker" ]; then
  # The worker: the operator sets NCCL_IB_GID_INDEX=5 (it wins) and
  # NCCL_IB_SL=3, the same as the policy flag (logged as such).
  env STRATA_SYSFS_ROOT="$fx" NCCL_IB_GID_INDEX=5 NCCL_IB_SL=3 STRATA_LOG=info STRATA_LOG_JOURNAL=0 \
    "$worker" --listen 127.0.0.1:0 --ib-tc 106 --ib-sl 3 > "$tmp/worker.log" 2>&1 &
  wpid=$!
  for _ in $(seq 200); do
    grep -q 'fabric: UCX_IB_TRAFFIC_CLASS' "$tmp/worker.log" && break
    kill -0 "$wpid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$wpid" 2>/dev/null || true
  wait "$wpid" 2>/dev/null || true
  wlog() { grep -qF "msg=\"fabric: $1\"" "$tmp/worker.log"; }
  check "worker: NCCL_IB_HCA derived from the topology" wlog "NCCL_IB_HCA==mlx5_0:1 (derived from the topology)"
  check "worker: NCCL_NET_GDR_LEVEL from the GPU-NIC distance" wlog "NCCL_NET_GDR_LEVEL=PIX (derived from the topology)"
  check "worker: NCCL_IB_TC from the node's config (--ib-tc)" wlog "NCCL_IB_TC=106 (from the node's config)"
  check "worker: UCX_IB_TRAFFIC_CLASS from the node's config" wlog "UCX_IB_TRAFFIC_CLASS=106 (from the node's config)"
  check "worker: the operator's NCCL_IB_GID_INDEX wins, and the log says so" \
    wlog "NCCL_IB_GID_INDEX=5 from the operator's environment wins (derived: 1)"
  check "worker: the operator's NCCL_IB_SL equals the derived one" \
    wlog "NCCL_IB_SL=3 (operator's environment, same as derived)"
  check "worker: QPS per connection derived for RoCE" wlog "NCCL_IB_QPS_PER_CONNECTION=4 (derived from the topology)"
  set +e
  "$worker" --listen 127.0.0.1:0 --ib-tc 256 2> "$tmp/err"; rc=$?
  set -e
  check "worker: --ib-tc 256: exit 2 with the range" \
    test "$rc" -eq 2 -a -n "$(grep "^strata-worker: error: --ib-tc '256' is not a number in 0..255" "$tmp/err")"
  [ "$fail" -eq 0 ] || cat "$tmp/worker.log"
fi

# Errors: exit 2 for bad flags, 1 for an unwritable output, with a message.
set +e
"$topo" --bogus 2> "$tmp/err"; rc=$?
check "unknown flag: exit 2" test "$rc" -eq 2
check "unknown flag: message" grep -q "^strata-topo: error: unknown or incomplete option '--bogus'" "$tmp/err"
"$topo" --output "$tmp/x" 2> "$tmp/err"; rc=$?
check "--output without --nccl-env: exit 2" test "$rc" -eq 2
"$topo" --nccl-env --ib-tc 300 2> "$tmp/err"; rc=$?
check "--ib-tc 300: exit 2" test "$rc" -eq 2
"$topo" --nccl-env --ib-sl 16 2> "$tmp/err"; rc=$?
check "--ib-sl 16: exit 2 with the range" test "$rc" -eq 2 -a -n "$(grep "'16' is not a number in 0..15" "$tmp/err")"
"$topo" extra 2> "$tmp/err"; rc=$?
check "stray argument: exit 2" test "$rc" -eq 2
"$topo" --nccl-env --output "$tmp/no/such/dir/nccl.env" 2> "$tmp/err"; rc=$?
check "unwritable --output: exit 1" test "$rc" -eq 1
check "unwritable --output: message" grep -q "^strata-topo: cannot write $tmp/no/such/dir/nccl.env.tmp" "$tmp/err"
"$topo" --help > "$tmp/help"; rc=$?
check "--help: exit 0 and usage" test "$rc" -eq 0 -a -n "$(grep '^usage: strata-topo' "$tmp/help")"
set -e

[ "$fail" -eq 0 ] && echo "test_topo_tool: all checks passed"
exit "$fail"
