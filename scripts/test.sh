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

# The Python package as users get it: `pip install .` into .venv (next to
# torch, transformers and pytest from scripts/setup.sh --python), then its
# tests (python/tests). The package's build (build-py/) compiles what
# build/ just compiled, so ccache serves it in about a minute.
.venv/bin/python -m pip install -q --no-build-isolation --no-deps --force-reinstall .
.venv/bin/python -m pytest -q -rs -p no:cacheprovider python/tests
