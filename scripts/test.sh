#!/usr/bin/env bash
# The test command: set-up, build (CUDA code included where nvcc exists), then
# every test under ctest, then the Python package's tests under pytest. CPU
# tests always run; GPU tests run where a Hopper GPU is present and are
# reported as Skipped, with the reason, where not.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
scripts/build.sh
if [ ! -x build/unimoe_gpu_tests ]; then
  echo "NOTE: GPU tests not built: nvcc was not found, so the CUDA library was not built."
else
  reason=$(build/unimoe_gpu_tests --gtest_filter='GpuSmoke.*' 2>&1 | grep -m1 -o "GPU test skipped: .*" || true)
  [ -n "$reason" ] && echo "NOTE: ${reason}; every GPU test below reports Skipped for this reason."
fi
ctest --test-dir build --output-on-failure -j "${UNIMOE_JOBS:-$(nproc)}"

# The Python package (python/tests) against this build's libunimoe_c.so, with
# torch, transformers and pytest from .venv (scripts/setup.sh --python). The
# build tree rather than `pip install .`, which would compile the CUDA
# library a second time; tests/scripts/test_pip_install.sh checks that.
UNIMOE_LIBRARY="$PWD/build/libunimoe_c.so" PYTHONPATH="$PWD/python" \
  .venv/bin/python -m pytest -q -rs -p no:cacheprovider python/tests
