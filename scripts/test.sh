#!/usr/bin/env bash
# The test command: set-up, build (CUDA code included where nvcc exists), then
# every test under ctest. CPU tests always run; GPU tests run where a GPU is
# present and are reported as skipped, with the reason, where not.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j "${UNIMOE_JOBS:-$(nproc)}"
