#!/usr/bin/env bash
# The GPU-machine workflow: build there, run the GPU tests, run the benchmark.
# Logs and JSON land in $OUT (the device tool's result folder; out/gpu when
# unset). The GPU machine has no network, so the call must carry what the
# build needs (made here by scripts/setup.sh):
#   device run, carry [".deps/googletest", ".deps/include", ".deps/peer"]:
#     scripts/gpu_run.sh [steps] [-- unimoe-bench arguments]
# steps: any of build,test,bench,sweep,pack (comma-separated; default
# build,test,bench). sweep: unimoe-bench --routing-sweep over the default
# grid, then scripts/analyze_routing_sweep.py (routing_sweep.json,
# routing_sweep.txt). pack, last: everything in $OUT into $OUT/results.tgz
# (scripts/pack_out.sh), for a tool that brings back few files.
# Environment: UNIMOE_GTEST_FILTER narrows the GPU tests; UNIMOE_TEST_TIMEOUT
# and UNIMOE_SWEEP_TIMEOUT (seconds) bound the test and sweep steps (a cut
# sweep keeps the points it saved, every 2000); UNIMOE_SWEEP_ITERS (default
# 20) sets the sweep's graph replays per point; UNIMOE_BUILD_DIR
# (default build-gpu) is where the build step builds and the other steps
# find the binaries: set it to build (and carry build/unimoe_gpu_tests and
# build/unimoe-bench) to run binaries built on another machine without the
# build step.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
steps=${1:-build,test,bench}
B=${UNIMOE_BUILD_DIR:-build-gpu}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
has() { [[ ",$steps," == *",$1,"* ]]; }
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

if has build; then
  echo "== build ($(nproc) cores)"
  if ! { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
         cmake --build "$B" -j "$(nproc)"; } >"$OUT/build.log" 2>&1; then
    tail -n 60 "$OUT/build.log"
    echo "gpu_run: build failed (whole log: build.log)"
    exit 1
  fi
  grep -E "warning|error" "$OUT/build.log" | head -n 20
fi

if has test; then
  echo "== GPU tests"
  timeout "${UNIMOE_TEST_TIMEOUT:-300}" "$B"/unimoe_gpu_tests --gtest_filter="${UNIMOE_GTEST_FILTER:-*}" \
    --gtest_output=xml:"$OUT/gpu_tests.xml" >"$OUT/gpu_tests.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|error:|rel|seed" "$OUT/gpu_tests.log" | head -n 60
fi

if has bench; then
  echo "== benchmark"
  "$B"/unimoe-bench "$@" --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1 || status=1
  tail -n 60 "$OUT/bench.log"
fi

if has sweep; then
  echo "== routing sweep"
  timeout "${UNIMOE_SWEEP_TIMEOUT:-1800}" "$B"/unimoe-bench --routing-sweep --iters "${UNIMOE_SWEEP_ITERS:-20}" \
    --json "$OUT/routing_sweep.json" >"$OUT/routing_sweep.log" 2>&1 || status=1
  tail -n 3 "$OUT/routing_sweep.log"
  python3 scripts/analyze_routing_sweep.py "$OUT/routing_sweep.json" --plot "$OUT/routing_sweep.png" \
    >"$OUT/routing_sweep.txt" 2>&1 || status=1
  cat "$OUT/routing_sweep.txt"
fi
if has pack; then
  scripts/pack_out.sh "$OUT" || status=1
fi
exit $status
