#!/usr/bin/env bash
# The GPU-machine workflow: build there, run the GPU tests, run the benchmark.
# Logs and JSON land in $OUT (the device tool's result folder; out/gpu when
# unset). The GPU machine has no network, so the call must carry what the
# build needs (made here by scripts/setup.sh):
#   device run, carry [".deps/googletest", ".deps/include", ".deps/peer"]:
#     scripts/gpu_run.sh [steps] [-- unimoe-bench arguments]
# steps: any of build,test,bench (comma-separated; default all three).
# Environment: UNIMOE_GTEST_FILTER narrows the GPU tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
steps=${1:-build,test,bench}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
has() { [[ ",$steps," == *",$1,"* ]]; }
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

if has build; then
  echo "== build ($(nproc) cores)"
  if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release &&
         cmake --build build-gpu -j "$(nproc)"; } >"$OUT/build.log" 2>&1; then
    tail -n 60 "$OUT/build.log"
    echo "gpu_run: build failed (whole log: build.log)"
    exit 1
  fi
  grep -E "warning|error" "$OUT/build.log" | head -n 20
fi

if has test; then
  echo "== GPU tests"
  timeout "${UNIMOE_TEST_TIMEOUT:-300}" build-gpu/unimoe_gpu_tests --gtest_filter="${UNIMOE_GTEST_FILTER:-*}" \
    --gtest_output=xml:"$OUT/gpu_tests.xml" >"$OUT/gpu_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|error:|rel|seed" "$OUT/gpu_tests.log" | head -n 60
fi

if has bench; then
  echo "== benchmark"
  build-gpu/unimoe-bench "$@" --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1 || status=1
  tail -n 60 "$OUT/bench.log"
fi
exit $status
