#!/usr/bin/env bash
# test_ansible.sh SRC SHARED WORKER COORDINATOR TOPO STRATACTL — the Ansible
# roles and playbooks of ansible/ (docs/deployment.md), against this machine
# with ansible_connection=local, into a temporary root per host
# (strata_manage_system=false: no apt, no user, no systemctl; copy mode from
# this build directory):
#  1. --syntax-check of site.yml and rolling_restart.yml;
#  2. site.yml for real: files, modes, rendered settings, the package list;
#  3. site.yml in --check --diff mode: nothing changes (a second real run
#     changes nothing either: checked after the upgrade in 5);
#  4. systemd-analyze verify on the installed units (paths moved under the root);
#  5. a coordinator and two workers started from the installed units and
#     rendered files (local_service.sh), with the mutual-TLS certificates the
#     roles installed (made by scripts/strata-ca; docs/security.md), then
#     rolling_restart.yml against them:
#     each worker drained and restarted one at a time while a client keeps
#     generating; the cluster serves at the end with layers on both workers;
#     then site.yml with a changed setting: by default the changed workers are
#     rolled the same way (drained and restarted one at a time), no request
#     fails; site.yml once more changes nothing on any host, restarts nothing;
#  6. ownership, with the owner set (nobody:nogroup): system directories
#     (/usr/local/bin root:staff 2775, /etc/systemd/system) keep their owner,
#     group and mode, Strata's own get theirs; two worker instances on one
#     host (strata_worker_instances): the template unit, one env file each;
#  7. --check --diff on a new host (strata_manage_system=true, a user and group
#     that do not exist, no apt, no systemctl): it passes and creates nothing.
# The playbook runs of 6 and 7 need no cluster: they go on in the background
# during 5 (which mostly waits on the cluster); their checks come after it.
# Each ansible-playbook run's time is printed ("time: ...").
set -euo pipefail
src=$1 shared=$2 worker=$3 coord=$4 topo=$5 ctl=$6
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$(dirname "$(dirname "$worker")")" && pwd)
fail=0
check() { if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }
for t in ansible-playbook systemd-analyze; do
  command -v $t > /dev/null || { echo "FAIL: $t missing (scripts/bootstrap installs it)"; exit 1; }
done
tmp=$(mktemp -d)
case $tmp in /tmp/*|/var/tmp/*) ;; *) echo "FAIL: odd temporary directory $tmp"; exit 1 ;; esac
cleanup() {
  for h in w1 w2; do "$here/local_service.sh" stop "$tmp/root/$h" strata-worker > /dev/null 2>&1 || true; done
  "$here/local_service.sh" stop "$tmp/root/coord" strata-coordinator > /dev/null 2>&1 || true
  [ -z "${load_pid:-}" ] || kill "$load_pid" 2> /dev/null || true
  [ -z "${side_pid:-}" ] || { kill "$side_pid" 2> /dev/null; wait "$side_pid"; } || true
  rm -rf "$tmp"
}
[ -n "${STRATA_TEST_KEEP:-}" ] || trap cleanup EXIT
export ANSIBLE_LOCAL_TEMP=$tmp/ansible-local ANSIBLE_REMOTE_TEMP=$tmp/ansible-remote
export ANSIBLE_NOCOLOR=1 ANSIBLE_RETRY_FILES_ENABLED=0 ANSIBLE_STDOUT_CALLBACK=default
# The test's cost is Ansible's, a dozen runs of it: the facts of this one
# machine are gathered once a host, not once a run (a fact cache in $tmp;
# the roles read none but ansible_processor_nproc).
export ANSIBLE_GATHERING=smart ANSIBLE_CACHE_PLUGIN=jsonfile \
  ANSIBLE_CACHE_PLUGIN_CONNECTION=$tmp/facts ANSIBLE_CACHE_PLUGIN_TIMEOUT=3600
grpc_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The control plane's certificates, made as docs/security.md says.
ca=$tmp/strata-ca
for a in init "coordinator --san IP:127.0.0.1" "node w1" "node w2" "operator ansible"; do
  bash "$src/scripts/strata-ca" --dir "$ca" $a > /dev/null
done

cat > "$tmp/inventory.ini" <<INV
[strata_coordinator]
coord ansible_host=127.0.0.1

[strata_workers]
w1 strata_worker_listen=127.0.0.1:0
w2 strata_worker_listen=127.0.0.1:0 strata_worker_args="--threads 1"

[all:vars]
ansible_connection=local
ansible_python_interpreter=/usr/bin/python3
strata_root=$tmp/root/{{ inventory_hostname }}
strata_manage_system=false
strata_install_method=copy
strata_local_build_dir=$build
strata_model_src=$shared/models/stories260K.gguf
strata_grpc_port=$grpc_port
strata_grpc_listen=127.0.0.1:$grpc_port
strata_cluster_extra={"listen": "127.0.0.1:0", "kv_blocks": 256}
strata_worker_env={"UCX_TLS": "tcp"}
strata_log_level=debug
strata_tls_dir=$ca
INV
# Each ansible-playbook run's wall time goes to the test's output (fd 3),
# whatever its own output is redirected to.
exec 3>&1
playbook() {
  local t0 rc=0
  t0=$(date +%s.%N)
  ansible-playbook "$@" || rc=$?
  echo "time: ansible-playbook $(printf '%s ' "$@" | grep -oE -- '[a-z_]+\.yml|--(check|diff|limit [^ ]+|syntax-check)' | tr '\n' ' ')$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s" >&3
  return $rc
}
# strata_root and strata_manage_system=false also as extra vars (the highest
# precedence): whatever the roles' defaults say, nothing is written outside $tmp.
play() {
  ( cd "$src/ansible" && playbook -i "$tmp/inventory.ini" -e strata_manage_system=false \
      -e "strata_root=$tmp/root/{{ inventory_hostname }}" "$@" )
}

# 1. Syntax.
check "syntax-check site.yml rolling_restart.yml" play --syntax-check site.yml rolling_restart.yml

# 2. A real run.
t0=$(date +%s.%N)
play site.yml > "$tmp/run1.log" 2>&1 || { cat "$tmp/run1.log"; echo "FAIL: site.yml"; exit 1; }
echo "site.yml, first run: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
grep -A4 '^PLAY RECAP' "$tmp/run1.log"
check "run 1: no host failed" bash -c "! grep -E 'failed=[1-9]|unreachable=[1-9]' '$tmp/run1.log'"
for h in coord w1 w2; do
  r=$tmp/root/$h
  for b in daemon/strata-worker coordinator/strata-coordinator cli/stratactl ib/strata-topo; do
    check "$h: $(basename $b) installed, executable" bash -c "cmp -s '$build/$b' '$r/usr/local/bin/$(basename $b)' && test -x '$r/usr/local/bin/$(basename $b)'"
  done
  if [ -f "$build/lib/libstrata-cuda.so" ]; then
    check "$h: the CUDA module in /usr/local/lib/strata (the worker's ../lib/strata)" \
      cmp -s "$build/lib/libstrata-cuda.so" "$r/usr/local/lib/strata/libstrata-cuda.so"
  else
    check "$h: no CUDA module from a build without CUDA" test ! -e "$r/usr/local/lib/strata/libstrata-cuda.so"
  fi
  check "$h: the model" cmp -s "$shared/models/stories260K.gguf" "$r/var/lib/strata/models/stories260K.gguf"
  check "$h: state dir 0750" test "$(stat -c %a "$r/var/lib/strata")" = 750
  check "$h: /etc/strata 0750" test "$(stat -c %a "$r/etc/strata")" = 750
  check "$h: deployment guide" cmp -s "$src/docs/deployment.md" "$r/usr/local/share/doc/strata/deployment.md"
  check "$h: package list from scripts/bootstrap" grep -qx libucx-dev "$r/usr/local/share/strata/apt-packages"
  check "$h: test-only packages left out" bash -c "! grep -qx -e prometheus -e nodejs -e ansible-core '$r/usr/local/share/strata/apt-packages'"
done
check "package count = bootstrap's less 8 excluded" test "$(wc -l < "$tmp/root/coord/usr/local/share/strata/apt-packages")" \
  -eq "$(( $(sed -n '/^PACKAGES=(/,/^)/p' "$src/scripts/bootstrap" | sed 's/#.*//' | tr -s ' ' '\n' | grep -cv -e '^$' -e 'PACKAGES=(' -e '^)$') - 8 ))"
c=$tmp/root/coord
check "coord: unit = systemd/strata-coordinator.service" cmp -s "$src/systemd/strata-coordinator.service" "$c/etc/systemd/system/strata-coordinator.service"
check "coord: no worker unit" test ! -e "$c/etc/systemd/system/strata-worker.service"
check "coord: cluster.ini model" grep -qx "model = /var/lib/strata/models/stories260K.gguf" "$c/etc/strata/cluster.ini"
check "coord: cluster.ini model_name" grep -qx "model_name = stories260K" "$c/etc/strata/cluster.ini"
check "coord: cluster.ini listen (extra wins)" grep -qx "listen = 127.0.0.1:0" "$c/etc/strata/cluster.ini"
check "coord: cluster.ini kv_blocks (extra wins)" grep -qx "kv_blocks = 256" "$c/etc/strata/cluster.ini"
check "coord: env --min-workers 2" grep -qx "STRATA_COORDINATOR_ARGS=--min-workers 2" "$c/etc/strata/strata-coordinator.env"
check "coord: env grpc listen" grep -qx "STRATA_GRPC_LISTEN=127.0.0.1:$grpc_port" "$c/etc/strata/strata-coordinator.env"
check "coord: env mode 0640" test "$(stat -c %a "$c/etc/strata/strata-coordinator.env")" = 640
for h in w1 w2; do
  e=$tmp/root/$h/etc/strata/strata-worker.env
  check "$h: unit = systemd/strata-worker.service" cmp -s "$src/systemd/strata-worker.service" "$tmp/root/$h/etc/systemd/system/strata-worker.service"
  check "$h: STRATA_NODE_NAME=$h" grep -qx "STRATA_NODE_NAME=$h" "$e"
  check "$h: STRATA_COORDINATOR" grep -qx "STRATA_COORDINATOR=127.0.0.1:$grpc_port" "$e"
  check "$h: UCX_TLS from strata_worker_env" grep -qx "UCX_TLS=tcp" "$e"
  check "$h: env mode 0640" test "$(stat -c %a "$e")" = 640
  # The rendered file sets the STRATA_* variables the documented one does.
  check "$h: same STRATA_* variables as systemd/strata-worker.env" test \
    "$(grep -o '^STRATA_[A-Z_]*' "$src/systemd/strata-worker.env" | grep -v NODE_NAME | sort | tr '\n' ' ')" = \
    "$(grep -o '^STRATA_[A-Z_]*' "$e" | grep -v NODE_NAME | sort | tr '\n' ' ')"
done
check "w2: STRATA_WORKER_ARGS" grep -qx "STRATA_WORKER_ARGS=--threads 1" "$tmp/root/w2/etc/strata/strata-worker.env"
check "coord: env TLS files" grep -qx "STRATA_GRPC_KEY=/etc/strata/tls/coordinator.key" "$c/etc/strata/strata-coordinator.env"
check "coord: coordinator certificate and key, operator certificate: mode 0600" test \
  "$(stat -c %a "$c"/etc/strata/tls/{ca.pem,coordinator.pem,coordinator.key,operator.pem,operator.key} | sort -u)" = 600
check "coord: the operator certificate is operator-ansible's" cmp -s "$ca/operator-ansible.pem" "$c/etc/strata/tls/operator.pem"
check "coord: no node certificate" test ! -e "$c/etc/strata/tls/node.pem"
check "the controller's data-plane cluster key was made (mode 600)" test "$(stat -c %a "$ca/cluster.key")" = 600
for h in coord w1 w2; do
  check "$h: the cluster key, mode 600" bash -c "cmp -s '$ca/cluster.key' '$tmp/root/$h/etc/strata/tls/cluster.key' && [ \$(stat -c %a '$tmp/root/$h/etc/strata/tls/cluster.key') = 600 ]"
done
check "coord: env STRATA_CLUSTER_KEY_FILE" grep -qx "STRATA_CLUSTER_KEY_FILE=/etc/strata/tls/cluster.key" "$c/etc/strata/strata-coordinator.env"
check "w1: env STRATA_CLUSTER_KEY_FILE" grep -qx "STRATA_CLUSTER_KEY_FILE=/etc/strata/tls/cluster.key" "$tmp/root/w1/etc/strata/strata-worker.env"
for h in w1 w2; do
  check "$h: its node certificate" cmp -s "$ca/node-$h.pem" "$tmp/root/$h/etc/strata/tls/node.pem"
  check "$h: CA, node certificate and key mode 0600" test \
    "$(stat -c %a "$tmp/root/$h"/etc/strata/tls/{ca.pem,node.pem,node.key} | sort -u)" = 600
  check "$h: no operator or coordinator key" test ! -e "$tmp/root/$h/etc/strata/tls/operator.key" -a ! -e "$tmp/root/$h/etc/strata/tls/coordinator.key"
  check "$h: env STRATA_CERT" grep -qx "STRATA_CERT=/etc/strata/tls/node.pem" "$tmp/root/$h/etc/strata/strata-worker.env"
done
check "coord env: same STRATA_* variables as systemd/strata-coordinator.env" test \
  "$(grep -o '^STRATA_[A-Z_]*' "$src/systemd/strata-coordinator.env" | sort | tr '\n' ' ')" = \
  "$(grep -o '^STRATA_[A-Z_]*' "$c/etc/strata/strata-coordinator.env" | sort | tr '\n' ' ')"

# Without credentials the roles refuse, naming the fix.
play site.yml --check --limit w1 -e strata_tls_dir= > "$tmp/notls.log" 2>&1 || true
check "no strata_tls_dir, no strata_insecure: refused" grep -q "set strata_tls_dir to a folder made with scripts/strata-ca" "$tmp/notls.log"

# 3. A dry run changes nothing. (A second real run changes nothing either:
# site.yml's last run in 5, after the upgrade, on every host.)
play site.yml --check --diff > "$tmp/check.log" 2>&1 || { cat "$tmp/check.log"; echo "FAIL: site.yml --check"; exit 1; }
check "--check --diff: changed=0 on every host" test "$(grep -cE '^(coord|w1|w2) .*changed=0 .*failed=0' "$tmp/check.log")" -eq 3
# ... and a changed setting shows up as a diff in check mode, and is not
# written. The same run (one run for two dry-run claims) uses the build
# method: the checkout is archived and would be copied and built (the build
# itself is minutes of compiling, not run here).
play site.yml --check --diff -e strata_log_level=warn -e strata_install_method=build -e "strata_archive=$tmp/src.tar.gz" \
  --limit w1 > "$tmp/build-check.log" 2>&1 || { cat "$tmp/build-check.log"; fail=1; }
check "--check --diff shows a changed setting" grep -q '^+STRATA_LOG=warn' "$tmp/build-check.log"
check "--check wrote nothing" grep -qx "STRATA_LOG=debug" "$tmp/root/w1/etc/strata/strata-worker.env"
check "build method, --check: no failure" grep -qE '^w1 .*failed=0' "$tmp/build-check.log"
check "build method: git archive of HEAD made" tar -tzf "$tmp/src.tar.gz" CMakeLists.txt scripts/bootstrap
check "build method: the archive would be copied" grep -q 'changed: \[w1\]' <(grep -A2 'Copy the sources to the node' "$tmp/build-check.log")

# 4. The installed units verify, with their paths under the root.
mkdir -p "$tmp/verify"
for h in coord w1; do
  u=$([ $h = coord ] && echo strata-coordinator || echo strata-worker)
  sed -e "s#/usr/local/bin/#$tmp/root/$h/usr/local/bin/#g; s#/etc/strata/#$tmp/root/$h/etc/strata/#g" \
    "$tmp/root/$h/etc/systemd/system/$u.service" > "$tmp/verify/$u.service"
done
rc=0; ( cd "$tmp/verify" && systemd-analyze verify ./strata-coordinator.service ./strata-worker.service ) > "$tmp/verify.out" 2>&1 || rc=$?
cat "$tmp/verify.out"
check "installed units: systemd-analyze verify clean" test "$rc" -eq 0 -a ! -s "$tmp/verify.out"

# 6 and 7 (below) need no cluster: their playbook runs (their own roots and
# inventories) go on in the background while 5 runs, which mostly waits on
# the cluster; their checks come after 5.
# An inventory of one host in both groups (copy mode, plaintext control plane).
one_host_inventory() {
  printf '%s\n' "[strata_coordinator]" "$1 ansible_host=127.0.0.1" "" "[strata_workers]" "$1" "" "[all:vars]" \
    "ansible_connection=local" "ansible_python_interpreter=/usr/bin/python3" "strata_install_method=copy" \
    "strata_local_build_dir=$build" "strata_model_src=$shared/models/stories260K.gguf" "strata_insecure=true" > "$2"
}
# 6: ownership and instances (a separate root; the owner is set to nobody:nogroup).
o=$tmp/own
mkdir -p "$o/usr/local/bin" "$o/etc/systemd/system"
chown 0:50 "$o/usr/local/bin" "$o/etc/systemd/system" 2> /dev/null && chmod 2775 "$o/usr/local/bin" && owned=1 || owned=0
before_bin=$(stat -c '%u:%g %a' "$o/usr/local/bin"); before_unit=$(stat -c '%u:%g %a' "$o/etc/systemd/system")
one_host_inventory own "$tmp/inv-own.ini"
own_play() {
  ( cd "$src/ansible" && playbook -i "$tmp/inv-own.ini" -e strata_manage_system=false -e "strata_root=$o" \
      -e strata_set_owner=true -e strata_user=nobody -e strata_group=nogroup \
      -e '{"strata_worker_instances": [{"name": "gpu0", "port": 7101, "env": {"CUDA_VISIBLE_DEVICES": "0"}}, {"name": "gpu1", "port": 7102, "args": "--threads 2"}]}' \
      "$@" site.yml )
}
# 7: --check --diff on a new host: system management on, with a user and
# group that do not exist (no apt, no systemctl).
nu=strata-t$$
one_host_inventory new "$tmp/inv-new.ini"
new_play() {
  ( cd "$src/ansible" && playbook -i "$tmp/inv-new.ini" --check --diff -e strata_manage_system=true \
      -e strata_install_packages=false -e strata_manage_services=false -e "strata_root=$tmp/new" \
      -e "strata_user=$nu" -e "strata_group=$nu" site.yml )
}
(
  own_play > "$tmp/own.log" 2>&1 || touch "$tmp/own.failed"
  own_play > "$tmp/own2.log" 2>&1 || true
  new_play > "$tmp/new.log" 2>&1 || true
) &
side_pid=$!

# 5. The installed cluster runs; rolling_restart.yml restarts it under load.
ctl_in() { "$c/usr/local/bin/stratactl" --addr "127.0.0.1:$grpc_port" --ca "$ca/ca.pem" --cert "$ca/operator-ansible.pem" --key "$ca/operator-ansible.key" "$@"; }
"$here/local_service.sh" start "$c" strata-coordinator
"$here/local_service.sh" start "$tmp/root/w1" strata-worker
"$here/local_service.sh" start "$tmp/root/w2" strata-worker
check "w1 ran strata-topo (ExecStartPre)" grep -q '^# NCCL/UCX fabric settings from strata-topo' "$tmp/root/w1/run/strata-worker/nccl.env"
serving=0
for _ in $(seq 120); do
  if ctl_in --json status 2> /dev/null | grep -q '"serving": *true'; then serving=1; break; fi
  sleep 0.5
done
check "cluster from the installed files serves" test "$serving" -eq 1
check "the coordinator serves gRPC with mutual TLS" grep -q "mutual TLS" "$c/strata-coordinator.log"
check "stratactl without a certificate is refused" bash -c "! '$c/usr/local/bin/stratactl' --addr 127.0.0.1:$grpc_port status 2> /dev/null"
ctl_in nodes || true
ctl_in placement show || true
pids_before="$(cat "$tmp/root/w1/run/strata-worker.pid") $(cat "$tmp/root/w2/run/strata-worker.pid")"

# A client generating all along: every request must complete.
( ok=0; bad=0
  while [ ! -e "$tmp/stop-load" ]; do
    if ctl_in generate "Once upon a time" --max-tokens 16 > "$tmp/gen.out" 2> "$tmp/gen.err"; then ok=$((ok+1));
    else bad=$((bad+1)); cp "$tmp/gen.err" "$tmp/gen.err.$bad"; fi
  done
  echo "$ok $bad" > "$tmp/load.result" ) &
load_pid=$!

t0=$(date +%s.%N)
rc=0
play rolling_restart.yml -e "strata_stratactl=$c/usr/local/bin/stratactl" -e "strata_ctl_tls_dir=$c/etc/strata/tls" \
  -e "strata_worker_restart_command='$here/local_service.sh restart $tmp/root/{{ inventory_hostname }} strata-worker'" \
  -e strata_wait_delay=1 > "$tmp/roll.log" 2>&1 || rc=$?
echo "rolling_restart.yml: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
touch "$tmp/stop-load"; wait "$load_pid" || true; load_pid=
grep -E '^TASK|^(ok|changed|fatal)' "$tmp/roll.log" | grep -E 'Drain|Restart|fatal|changed' || true
grep -A4 '^PLAY RECAP' "$tmp/roll.log"
[ "$rc" -eq 0 ] || cat "$tmp/roll.log"
check "rolling_restart.yml succeeded" test "$rc" -eq 0
check "workers drained in turn: w1, then w2" test "$(grep -oE '^TASK \[Drain w[12]\]' "$tmp/roll.log" | tr '\n' ' ')" = "TASK [Drain w1] TASK [Drain w2] "
pids_after="$(cat "$tmp/root/w1/run/strata-worker.pid") $(cat "$tmp/root/w2/run/strata-worker.pid")"
for i in 1 2; do
  check "w$i restarted (new pid)" test "$(echo $pids_before | cut -d' ' -f$i)" != "$(echo $pids_after | cut -d' ' -f$i)"
done
read -r n_ok n_bad < "$tmp/load.result"
echo "generate requests during the roll: $n_ok completed, $n_bad failed"
for f in "$tmp"/gen.err.*; do [ -e "$f" ] && { echo "--- $f"; cat "$f"; }; done
check "requests completed during the roll" test "$n_ok" -gt 0
check "no request failed during the roll" test "$n_bad" -eq 0
ctl_in placement show
check "layers on both workers again" bash -c "ctl_out=\$('$c/usr/local/bin/stratactl' --addr 127.0.0.1:$grpc_port --ca '$ca/ca.pem' --cert '$ca/operator-ansible.pem' --key '$ca/operator-ansible.key' --json placement show); echo \"\$ctl_out\" | grep -q '\"w1\"' && echo \"\$ctl_out\" | grep -q '\"w2\"'"
check "both workers ready" test "$(ctl_in --json nodes | grep -c '"NODE_STATE_READY"')" -eq 2
check "generate after the roll" bash -c "'$c/usr/local/bin/stratactl' --addr 127.0.0.1:$grpc_port --ca '$ca/ca.pem' --cert '$ca/operator-ansible.pem' --key '$ca/operator-ansible.key' generate 'Once upon a time' --max-tokens 8 | grep -q ."

# site.yml with a changed setting while the cluster serves: the default upgrade
# (strata_upgrade_strategy=rolling) drains and restarts the changed workers
# one at a time; the client sees no failure.
pids_before="$(cat "$tmp/root/w1/run/strata-worker.pid") $(cat "$tmp/root/w2/run/strata-worker.pid")"
rm -f "$tmp/stop-load" "$tmp/load.result"
( ok=0; bad=0
  while [ ! -e "$tmp/stop-load" ]; do
    if ctl_in generate "Once upon a time" --max-tokens 16 > "$tmp/gen.out" 2> "$tmp/gen.err"; then ok=$((ok+1));
    else bad=$((bad+1)); cp "$tmp/gen.err" "$tmp/gen.err.up$bad"; fi
  done
  echo "$ok $bad" > "$tmp/load.result" ) &
load_pid=$!
rc=0
play site.yml -e "strata_stratactl=$c/usr/local/bin/stratactl" -e "strata_ctl_tls_dir=$c/etc/strata/tls" \
  -e strata_log_level=info -e strata_wait_delay=1 \
  -e "strata_worker_restart_command='$here/local_service.sh restart $tmp/root/{{ inventory_hostname }} strata-worker'" \
  > "$tmp/upgrade.log" 2>&1 || rc=$?
touch "$tmp/stop-load"; wait "$load_pid" || true; load_pid=
[ "$rc" -eq 0 ] || cat "$tmp/upgrade.log"
check "site.yml upgrade run succeeded" test "$rc" -eq 0
check "site.yml upgrade: the changed workers drained in turn (w1, then w2)" \
  test "$(grep -oE '^TASK \[Drain w[12]\]' "$tmp/upgrade.log" | tr '\n' ' ')" = "TASK [Drain w1] TASK [Drain w2] "
pids_after="$(cat "$tmp/root/w1/run/strata-worker.pid") $(cat "$tmp/root/w2/run/strata-worker.pid")"
for i in 1 2; do
  check "site.yml upgrade: w$i restarted (new pid)" test "$(echo $pids_before | cut -d' ' -f$i)" != "$(echo $pids_after | cut -d' ' -f$i)"
done
read -r n_ok n_bad < "$tmp/load.result"
echo "generate requests during the upgrade: $n_ok completed, $n_bad failed"
check "site.yml upgrade: requests completed, none failed" test "$n_ok" -gt 0 -a "$n_bad" -eq 0
play site.yml -e "strata_stratactl=$c/usr/local/bin/stratactl" -e "strata_ctl_tls_dir=$c/etc/strata/tls" \
  -e strata_log_level=info \
  -e "strata_worker_restart_command='$here/local_service.sh restart $tmp/root/{{ inventory_hostname }} strata-worker'" \
  > "$tmp/upgrade2.log" 2>&1 || true
check "site.yml with nothing changed restarts nothing" bash -c "! grep -qE 'TASK \[Drain w[12]\]' '$tmp/upgrade2.log' && grep -qE '^w1 .*changed=0 .*failed=0' '$tmp/upgrade2.log'"
check "site.yml again: changed=0 on every host" test "$(grep -cE '^(coord|w1|w2) .*changed=0 .*failed=0' "$tmp/upgrade2.log")" -eq 3

wait "$side_pid" || true; side_pid=

# 6. Ownership and instances: the runs' results.
[ ! -e "$tmp/own.failed" ] || { cat "$tmp/own.log"; echo "FAIL: site.yml (ownership)"; fail=1; }
check "ownership run: no host failed" grep -qE '^own .*failed=0' "$tmp/own.log"
if [ "$owned" -eq 1 ]; then
  check "/usr/local/bin keeps its owner, group and mode ($before_bin)" test "$(stat -c '%u:%g %a' "$o/usr/local/bin")" = "$before_bin"
  check "/etc/systemd/system keeps its owner, group and mode ($before_unit)" test "$(stat -c '%u:%g %a' "$o/etc/systemd/system")" = "$before_unit"
else
  echo "skip: cannot chown here (not root): system directory ownership not checked"
fi
ng=$(getent group nogroup | cut -d: -f3); nb=$(id -u nobody)
check "/etc/strata root:nogroup 0750" test "$(stat -c '%u:%g %a' "$o/etc/strata")" = "0:$ng 750"
check "/var/lib/strata nobody:nogroup 0750" test "$(stat -c '%u:%g %a' "$o/var/lib/strata")" = "$nb:$ng 750"
check "the model nobody:nogroup" test "$(stat -c '%u:%g' "$o/var/lib/strata/models/stories260K.gguf")" = "$nb:$ng"
check "strata-worker.env root:nogroup 0640" test "$(stat -c '%u:%g %a' "$o/etc/strata/strata-worker.env")" = "0:$ng 640"
check "instances: the template unit, no strata-worker.service" \
  bash -c "cmp -s '$src/systemd/strata-worker@.service' '$o/etc/systemd/system/strata-worker@.service' && test ! -e '$o/etc/systemd/system/strata-worker.service'"
check "instance gpu0: port 7101, node own-gpu0, CUDA_VISIBLE_DEVICES" bash -c \
  "grep -qx 'STRATA_WORKER_LISTEN=127.0.0.1:7101' '$o/etc/strata/strata-worker@gpu0.env' && grep -qx 'STRATA_NODE_NAME=own-gpu0' '$o/etc/strata/strata-worker@gpu0.env' && grep -qx 'CUDA_VISIBLE_DEVICES=0' '$o/etc/strata/strata-worker@gpu0.env'"
check "instance gpu1: port 7102, its args" bash -c \
  "grep -qx 'STRATA_WORKER_LISTEN=127.0.0.1:7102' '$o/etc/strata/strata-worker@gpu1.env' && grep -qx 'STRATA_WORKER_ARGS=--threads 2' '$o/etc/strata/strata-worker@gpu1.env'"
check "ownership run 2: changed=0" grep -qE '^own .*changed=0 .*failed=0' "$tmp/own2.log"

# 7. --check --diff on a new host: it must pass and create nothing.
grep -A2 '^PLAY RECAP' "$tmp/new.log" || tail -30 "$tmp/new.log"
check "--check --diff on a new host: no failure (no chgrp on a missing group)" grep -qE '^new .*failed=0' "$tmp/new.log"
check "--check --diff reports the user and group it would create" bash -c "grep -A1 'Create the strata group' '$tmp/new.log' | grep -q 'changed: \[new\]'"
check "--check created no group, no user, no root" bash -c "! getent group $nu && ! getent passwd $nu && test ! -e '$tmp/new'"
grep -q 'failed=[1-9]' "$tmp/new.log" && grep -B5 -A15 'fatal:' "$tmp/new.log" | head -60

[ "$fail" -eq 0 ] && echo "test_ansible: all checks passed"
exit "$fail"
