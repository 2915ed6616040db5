#!/bin/bash
# test_no_cuda_link.sh EXE... — one strata-worker for every node: none of the
# executables has a NEEDED entry for libcuda*, libcudart*, libnccl* or
# libcublas* (the CUDA backend is the module libstrata-cuda.so, dlopened by
# compute/registry.c). With STRATA_CUDA_MODULE set (a CUDA build) the module
# does need them and exports its entry point.
set -u
fails=0
check() { local what=$1; shift; if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi; }
command -v readelf >/dev/null || { echo "SKIP: no readelf"; exit 77; }
for exe in "$@"; do
  needed=$(readelf -d "$exe" | grep NEEDED)
  check "$(basename "$exe") has NEEDED entries" test -n "$needed"
  check "$(basename "$exe") links no CUDA library" bash -c "! grep -Ei 'libcuda|libcudart|libnccl|libcublas' <<<'$needed'"
done
if [ -n "${STRATA_CUDA_MODULE:-}" ]; then
  mneeded=$(readelf -d "$STRATA_CUDA_MODULE" | grep NEEDED)
  for lib in libcudart libnccl libcublas; do
    check "the module needs $lib" grep -q "$lib" <<<"$mneeded"
  done
  check "the module exports strata_backend_module_init" bash -c \
    "nm -D --defined-only '$STRATA_CUDA_MODULE' | grep -qw strata_backend_module_init"
fi
[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
