#!/usr/bin/env bash
# Set-up plus a build into build/ (Release). Extra arguments go to cmake's
# configure step, e.g. scripts/build.sh -DUNIMOE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=${UNIMOE_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
