#!/usr/bin/env bash
# test_coordinator_cli.sh BIN — strata-coordinator as a real process: config
# errors name file:line and exit 1; a good config serves HTTP (503 on /health
# and completions until workers serve, 400 on a bad body); SIGTERM exits 0.
set -u
BIN=$1
MODEL=${STRATA_SHARED:-../shared}/models/stories260K.gguf
[ -f "$MODEL" ] || { echo "FATAL: $MODEL not found"; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"; [ -n "${PID:-}" ] && kill "$PID" 2>/dev/null' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }

printf '[cluster]\nmodel = %s\nmodle = x\n[stage.0]\naddress = 127.0.0.1:7001\n' "$MODEL" > "$T/bad.ini"
"$BIN" --config "$T/bad.ini" 2> "$T/err"; rc=$?
check "unknown key exits 1" "[ $rc -eq 1 ]"
check "unknown key names file:line" "grep -q 'bad.ini:3: \[cluster\]: unknown key' '$T/err'"

printf '[cluster]\nmodel = %s\npartition = 3,3\n[stage.0]\naddress = 127.0.0.1:7001\n[stage.1]\naddress = 127.0.0.1:7002\n' "$MODEL" > "$T/part.ini"
"$BIN" --config "$T/part.ini" 2> "$T/err"; rc=$?
check "partition 3,3 on 5 layers refused" "[ $rc -eq 1 ] && grep -q 'hold 6 layers but the model has 5' '$T/err'"

"$BIN" 2> /dev/null; rc=$?
check "no --config is a usage error" "[ $rc -eq 2 ]"

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf '[cluster]\nmodel = %s\n[stage.0]\naddress = 127.0.0.1:7001\ntp = 2\n[stage.1]\naddress = 127.0.0.1:7002\ntp = 2\n' "$MODEL" > "$T/good.ini"
"$BIN" --config "$T/good.ini" --listen "127.0.0.1:$PORT" > "$T/out" 2> "$T/log" &
PID=$!
for _ in $(seq 100); do grep -q listening "$T/out" 2>/dev/null && break; sleep 0.1; done
check "placement logged 3,2" "grep -q 'stage 0 (stage.0): layers \[0, 3) TP 2' '$T/log' && grep -q 'stage 1 (stage.1): layers \[3, 5)' '$T/log'"
code=$(curl -s -o "$T/h" -w '%{http_code}' "http://127.0.0.1:$PORT/health")
check "/health 503 while no placement serves" "[ '$code' = 503 ]"
code=$(curl -s -o "$T/c" -w '%{http_code}' -X POST --data-binary '{"prompt":"Once upon a time"}' "http://127.0.0.1:$PORT/v1/completions")
check "completion 503 with an OpenAI error" "[ '$code' = 503 ] && grep -q '\"error\"' '$T/c'"
code=$(curl -s -o "$T/b" -w '%{http_code}' -X POST --data-binary '{"prompt":' "http://127.0.0.1:$PORT/v1/completions")
check "bad JSON 400" "[ '$code' = 400 ]"
kill -TERM "$PID"; wait "$PID"; rc=$?; PID=
check "SIGTERM exits 0" "[ $rc -eq 0 ]"
exit $fail
