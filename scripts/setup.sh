#!/usr/bin/env bash
# Installs what the build needs, once; a second run does nothing.
#   - Debian packages: cmake, ninja, g++, GoogleTest, nlohmann-json, CLI11, ccache
#   - CUTLASS/CuTe headers from the pinned PyPI wheel nvidia-cutlass, unpacked
#     into .deps/cutlass/include (ignored by git, never committed)
#   - copies of GoogleTest's source and the header-only libraries under .deps,
#     so that a copy of the tree with its .deps folder also builds on a
#     machine without network access or these packages.
set -euo pipefail
cd "$(dirname "$0")/.."

CUTLASS_VERSION=4.2.0.0
CUTLASS_SHA256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
DEPS=.deps

need_apt=()
for pkg in cmake ninja-build g++ libgtest-dev nlohmann-json3-dev libcli11-dev ccache python3-pip unzip; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

mkdir -p "$DEPS"
stamp="$DEPS/cutlass/VERSION"
if [ "$(cat "$stamp" 2>/dev/null)" != "$CUTLASS_VERSION" ]; then
  echo "setup: fetching nvidia-cutlass==$CUTLASS_VERSION (headers only)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cutlass==$CUTLASS_VERSION" -d "$tmp"
  whl=$(ls "$tmp"/nvidia_cutlass-*.whl)
  got=$(sha256sum "$whl" | cut -d' ' -f1)
  if [ "$got" != "$CUTLASS_SHA256" ]; then
    echo "setup: nvidia-cutlass wheel sha256 $got does not match the pinned $CUTLASS_SHA256" >&2
    exit 1
  fi
  rm -rf "$DEPS/cutlass"
  mkdir -p "$DEPS/cutlass"
  unzip -q "$whl" 'cutlass_library/source/include/*' -d "$tmp/x"
  mv "$tmp/x/cutlass_library/source/include" "$DEPS/cutlass/include"
  echo "$CUTLASS_VERSION" >"$stamp"
  rm -rf "$tmp"
fi

# Copies for a machine without network access or these packages.
if [ ! -f "$DEPS/googletest/CMakeLists.txt" ]; then
  rm -rf "$DEPS/googletest" && cp -r /usr/src/googletest "$DEPS/googletest"
fi
if [ ! -f "$DEPS/include/CLI/CLI.hpp" ] || [ ! -f "$DEPS/include/nlohmann/json.hpp" ]; then
  mkdir -p "$DEPS/include"
  cp -r /usr/include/CLI /usr/include/nlohmann "$DEPS/include/"
fi
echo "setup: dependencies ready under $DEPS"
