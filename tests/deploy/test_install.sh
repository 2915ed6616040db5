#!/bin/bash
# test_install.sh BUILD_DIR MODEL CUDA(0|1) — the installed layout
# (CMakeLists.txt's install rules): `cmake --install` into a temporary prefix
# puts the executables in bin/ and, in a CUDA build, libstrata-cuda.so in
# lib/strata/, where the installed executables find it (their ../lib/strata)
# before any build tree; STRATA_BACKEND_PATH overrides that; without a module
# the same binaries run on the CPU.
set -u
build=$1 model=$2 cuda=$3
fails=0
check() { local what=$1; shift; if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi; }
prefix=$(mktemp -d /tmp/strata-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >"$prefix.log" 2>&1
rc=$?
check "cmake --install exits 0" test "$rc" -eq 0
[ "$rc" -eq 0 ] || { cat "$prefix.log"; rm -f "$prefix.log"; exit 1; }
rm -f "$prefix.log"
for exe in strata-worker strata-coordinator stratactl strata-topo strata-rdma-devices strata-run strata-gguf; do
  check "bin/$exe installed and executable" test -x "$prefix/bin/$exe"
done
check "docs installed (the units' Documentation=)" test -f "$prefix/share/doc/strata/deployment.md"
run() { STRATA_LOG=info "$prefix/bin/strata-run" --model "$model" --prompt "Once upon a time" -n 4 "$@" 2>&1; }
mod="$prefix/lib/strata/libstrata-cuda.so"
if [ "$cuda" = 1 ]; then
  check "lib/strata/libstrata-cuda.so installed" test -f "$mod"
  check "the installed module keeps a run path to the CUDA libraries" \
    bash -c "readelf -d '$mod' | grep -E 'RUNPATH|RPATH' | grep -q cuda"
  out=$(run --backend cuda)
  check "the installed strata-run loads the installed module (../lib/strata): $(grep -m1 'cuda module' <<<"$out")" \
    grep -q "cuda module $mod loaded" <<<"$out"
  mkdir -p "$prefix/alt" && cp "$mod" "$prefix/alt/"
  out=$(STRATA_BACKEND_PATH="$prefix/alt" run --backend cuda)
  check "STRATA_BACKEND_PATH overrides the search" grep -q "cuda module $prefix/alt/libstrata-cuda.so loaded" <<<"$out"
else
  check "no module in a build without CUDA" test ! -e "$mod"
fi
# A CPU node: no module where it looks, and the same binary serves on the CPU.
out=$(STRATA_BACKEND_PATH="$prefix/none" run --backend cuda)
check "without the module --backend cuda is a clear error: $(tail -1 <<<"$out")" \
  grep -q "backend cuda: no CUDA device (module libstrata-cuda.so: $prefix/none/libstrata-cuda.so" <<<"$out"
text=$(STRATA_BACKEND_PATH="$prefix/none" "$prefix/bin/strata-run" --model "$model" --prompt "Once upon a time" -n 4 \
       --backend cpu 2>/dev/null)
check "without the module the CPU backend generates stories260K's greedy text: '$text'" test "$text" = ", there was a"
[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all install checks passed"
