#!/usr/bin/env bash
# local_service.sh start|stop|restart ROOT UNIT — runs an installed Strata
# unit the way systemd would, without systemd, for tests/deploy/test_ansible.sh:
# ROOT is the root directory site.yml installed into. The ExecStartPre= and
# ExecStart= lines of ROOT/etc/systemd/system/UNIT.service run with the unit's
# Environment= defaults and its EnvironmentFile= files (read in order, later
# wins, KEY=VALUE as systemd.exec(5) reads them), every absolute path moved
# under ROOT (the files of /etc/strata too). The process runs in the background (pid in ROOT/run/UNIT.pid,
# output in ROOT/UNIT.log); start waits for its "listening on" line, stop
# sends SIGTERM and waits for the exit.
set -euo pipefail
cmd=$1 root=$2 unit=$3
file=$root/etc/systemd/system/$unit.service
pidf=$root/run/$unit.pid
log=$root/$unit.log
mkdir -p "$root/run"

# /etc/strata/X is read from ROOT/run/etc/strata/X, a copy with its paths rerooted too.
reroot() { sed -e "s#/usr/local/bin/#$root/usr/local/bin/#g; s#/etc/strata/#$root/run/etc/strata/#g" \
               -e "s#/var/lib/strata#$root/var/lib/strata#g; s#\(^\|[ =-]\)/run/#\1$root/run/#g" -e "s#%H#$(hostname)#g"; }

load_env_file() { # KEY=VALUE lines; '#' comments; no expansion (systemd.exec(5))
  local f=$1 line
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in ''|'#'*|';'*) continue ;; esac
    export "${line%%=*}=${line#*=}"
  done < "$f"
}

start() {
  mkdir -p "$root/run/$unit" "$root/run/etc/strata"
  for f in "$root"/etc/strata/*; do
    if [ -d "$f" ]; then # tls/: certificates and keys, copied as they are
      rm -rf "$root/run/etc/strata/$(basename "$f")"; cp -a "$f" "$root/run/etc/strata/"
    else
      reroot < "$f" > "$root/run/etc/strata/$(basename "$f")"
    fi
  done
  (
    while IFS= read -r l; do export "${l#Environment=}"; done < <(grep '^Environment=' "$file" | reroot)
    pre=$(grep '^ExecStartPre=' "$file" | reroot | sed 's/^ExecStartPre=-\{0,1\}//' || true)
    [ -z "$pre" ] || eval "$pre" || true
    while IFS= read -r f; do
      f=${f#-}; [ ! -r "$f" ] || load_env_file "$f"
    done < <(grep '^EnvironmentFile=' "$file" | sed 's/^EnvironmentFile=//' | reroot)
    exe=$(grep '^ExecStart=' "$file" | reroot | sed 's/^ExecStart=//')
    cd "$root/var/lib/strata"
    ( eval "exec $exe" ) > "$log" 2>&1 < /dev/null &
    echo $! > "$pidf"
  )
  for _ in $(seq 300); do
    grep -q "listening on" "$log" 2>/dev/null && return 0
    kill -0 "$(cat "$pidf")" 2>/dev/null || { echo "$unit exited:"; cat "$log"; return 1; }
    sleep 0.1
  done
  echo "$unit: no 'listening on' within 30 s"; cat "$log"; return 1
}

stop() {
  [ -r "$pidf" ] || return 0
  local pid; pid=$(cat "$pidf")
  kill -TERM "$pid" 2>/dev/null || { rm -f "$pidf"; return 0; }
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || { rm -f "$pidf"; return 0; }; sleep 0.1; done
  echo "$unit (pid $pid) still running 60 s after SIGTERM"; return 1
}

case $cmd in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  *) echo "usage: $0 start|stop|restart ROOT UNIT" >&2; exit 2 ;;
esac
