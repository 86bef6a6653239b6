#!/usr/bin/env bash
# Build, GPU tests, benchmark and routing sweep on a machine with a Hopper
# GPU (H100/H200), each step's log and results written into an output
# folder: $OUT if set, else out/gpu.
#
#   scripts/gpu_run.sh [steps] [-- unimoe-bench arguments]
#
# steps, comma-separated (default build,test,bench):
#   build  configure and build into $UNIMOE_BUILD_DIR (build.log)
#   test   the GPU tests, unimoe_gpu_tests (gpu_tests.log, gpu_tests.xml)
#   bench  unimoe-bench with the arguments after -- (bench.log, bench.json)
#   sweep  unimoe-bench --routing-sweep over the default grid, then
#          scripts/analyze_routing_sweep.py (routing_sweep.{log,json,txt,png})
#   pack   last: every file of the output folder into results.tgz
#          (scripts/pack_out.sh)
# gpu.txt records the GPU, its driver and clocks.
#
# Environment:
#   OUT                   the output folder (default out/gpu)
#   UNIMOE_BUILD_DIR      where the build step builds and the other steps find
#                         the binaries (default build-gpu); point it at an
#                         existing build (e.g. build) and leave out the build
#                         step to run binaries built before
#   UNIMOE_GTEST_FILTER   narrows the GPU tests (default *)
#   UNIMOE_TEST_TIMEOUT   seconds for the test step (default 300)
#   UNIMOE_SWEEP_TIMEOUT  seconds for the sweep (default 1800); a cut sweep
#                         keeps the points it saved (every 2000)
#   UNIMOE_SWEEP_ITERS    the sweep's graph replays per point (default 20)
# The build needs what scripts/setup.sh prepares under .deps (on a machine
# without network access, copy the tree with its .deps folder).
#
# Example, the 30-point BF16 benchmark against the anchor peers:
#   scripts/gpu_run.sh build,test,bench -- \
#     -p mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,dsv3-tp8,gpt-oss-120b \
#     -t 1,8,64,512,4096,16384 --iters 30 --check-tokens 8 \
#     --anchors bench/peers/h200-bf16-peers.json
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
