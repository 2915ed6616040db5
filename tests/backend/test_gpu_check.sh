#!/bin/bash
# test_gpu_check.sh SRC — scripts/gpu-check without a GPU stops at once with
# exit 1 and says why (it never builds or passes silently); its --dry-run
# lists the seven steps and their commands and runs nothing (no build dir is
# made); --prebuilt on a directory --prepare did not make is refused. On a
# machine with nvidia-smi the real run is scripts/gpu-check itself: skipped
# (77) here.
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

d=$(mktemp -d)
out=$(cd /tmp && timeout 30 "$src/scripts/gpu-check" --dry-run "$d/build" 2>&1); rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: --dry-run exit $rc, want 0"; exit 1; }
n=$(grep -c "^gpu-check: step [0-6]:" <<<"$out")
[ "$n" -eq 7 ] || { echo "FAIL: --dry-run lists $n steps, want 7"; exit 1; }
for w in "test_backend_ops cuda" "test_backend_engine cuda" "tests/comm/test_nccl " "--backend cuda" \
         "strata-coordinator" "llama-3-8b" "nothing was run"; do
  grep -qF -- "$w" <<<"$out" || { echo "FAIL: --dry-run does not mention '$w'"; exit 1; }
done
grep -q "^gpu-check: ok:" <<<"$out" && { echo "FAIL: --dry-run claims a check passed"; exit 1; }
[ -e "$d/build" ] && { echo "FAIL: --dry-run made $d/build"; exit 1; }
out=$(cd /tmp && timeout 30 "$src/scripts/gpu-check" --prebuilt "$d" 2>&1); rc=$?
[ "$rc" -eq 1 ] && grep -q "no PREBUILT marker" <<<"$out" || { echo "FAIL: --prebuilt on a bare dir: exit $rc: $out"; exit 1; }
rm -rf "$d"
echo "ok: --dry-run lists the steps and runs nothing; --prebuilt refuses a bare directory"
