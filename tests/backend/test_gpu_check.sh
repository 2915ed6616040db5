#!/bin/bash
# test_gpu_check.sh SRC — scripts/gpu-check without a GPU stops at once with
# exit 1 and says why (it never builds or passes silently). On a machine with
# nvidia-smi the real run is scripts/gpu-check itself: skipped (77) here.
set -u
src=$1
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: a GPU is present; run scripts/gpu-check itself"
  exit 77
fi
bash -n "$src/scripts/gpu-check" || { echo "FAIL: syntax"; exit 1; }
out=$(cd /tmp && timeout 30 "$src/scripts/gpu-check" "$(mktemp -d)/build" 2>&1); rc=$?
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: exit $rc, want 1"; exit 1; }
grep -qE "^gpu-check: FAIL: (no nvidia-smi|nvidia-smi lists no GPU)" <<<"$out" || { echo "FAIL: no reason given"; exit 1; }
echo "ok: gpu-check fails clearly without a GPU"
