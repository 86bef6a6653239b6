#!/usr/bin/env bash
# The test command: set-up, build (CUDA code included where nvcc exists), then
# every test under ctest. CPU tests always run; GPU tests run where a Hopper
# GPU is present and are reported as Skipped, with the reason, where not.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
if [ ! -x build/unimoe_gpu_tests ]; then
  echo "NOTE: GPU tests not built: nvcc was not found, so the CUDA library was not built."
else
  reason=$(build/unimoe_gpu_tests --gtest_filter='GpuSmoke.*' 2>&1 | grep -m1 -o "GPU test skipped: .*" || true)
  [ -n "$reason" ] && echo "NOTE: ${reason}; every GPU test below reports Skipped for this reason."
fi
ctest --test-dir build --output-on-failure -j "${UNIMOE_JOBS:-$(nproc)}"
