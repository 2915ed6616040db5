#!/usr/bin/env bash
# test_topo_tool.sh TOPO — strata-topo as the worker unit runs it: the report
# (CPU count = nproc, the NUMA nodes of sysfs, RDMA devices), --nccl-env on
# stdout and into a file (atomically, the format systemd's EnvironmentFile=
# reads), and bad flags (exit 2).
set -euo pipefail
topo=$1
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
check "--nccl-env first line names the tool" test "$(head -1 "$tmp/env.stdout")" = "# NCCL_IB_* from strata-topo --nccl-env (ib/topo.h)"
if [ "$n_ib" -eq 0 ]; then
  check "report: no RDMA device" grep -q "^rdma: no RDMA device" "$tmp/report"
  check "--nccl-env: only comments when there is no RDMA device" \
    test "$(cat "$tmp/env.stdout")" = "$(printf '%s\n' '# NCCL_IB_* from strata-topo --nccl-env (ib/topo.h)' \
      '# no RDMA device: NCCL_IB_* left unset (NCCL uses its socket transport)')"
else
  check "report: $n_ib RDMA device(s)" grep -Eq "^rdma: $n_ib devices?$" "$tmp/report"
  check "--nccl-env: KEY=VALUE or comment lines" bash -c "! grep -Ev '^(#.*|NCCL_IB_HCA==[^ ]+|NCCL_IB_GID_INDEX=[0-9]+)$' '$tmp/env.stdout'"
fi

# --output: the same text, written through a .tmp file and renamed.
check "--output writes the file" "$topo" --nccl-env --output "$tmp/nccl.env"
check "--output file = stdout text" cmp -s "$tmp/nccl.env" "$tmp/env.stdout"
check "no .tmp file left" test ! -e "$tmp/nccl.env.tmp"
# The file is what a shell with `set -a` and systemd both read: no stray lines.
check "env file sources in sh" sh -c "set -a; . '$tmp/nccl.env'"

# Errors: exit 2 for bad flags, 1 for an unwritable output, with a message.
set +e
"$topo" --bogus 2> "$tmp/err"; rc=$?
check "unknown flag: exit 2" test "$rc" -eq 2
check "unknown flag: message" grep -q "^strata-topo: error: unknown or incomplete option '--bogus'" "$tmp/err"
"$topo" --output "$tmp/x" 2> "$tmp/err"; rc=$?
check "--output without --nccl-env: exit 2" test "$rc" -eq 2
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
