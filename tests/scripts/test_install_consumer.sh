#!/usr/bin/env bash
# The installed package works for a user's project: installs the build in
# BUILD_DIR into a fresh prefix, builds examples/consumer against it with
# find_package(unimoe), and runs it (it runs one GPU forward where a Hopper
# GPU is present, else checks the host side and says so).
set -euo pipefail
build=${1:?usage: test_install_consumer.sh BUILD_DIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/unimoe/unimoe.h"
test -f "$work/prefix/lib/cmake/unimoe/unimoeConfig.cmake" ||
  test -f "$work/prefix/lib64/cmake/unimoe/unimoeConfig.cmake"
cmake -S "$src/examples/consumer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/unimoe_consumer"
echo "install + consumer: passed"
