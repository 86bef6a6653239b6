#!/usr/bin/env bash
# Installs what the build needs, once; a second run does nothing.
#   - Debian packages: cmake, ninja, g++, GoogleTest, nlohmann-json, CLI11, ccache
#   - CUTLASS/CuTe headers from the pinned PyPI wheel nvidia-cutlass, unpacked
#     into .deps/cutlass/include (ignored by git, never committed)
#   - NCCL's headers from the pinned PyPI wheel nvidia-nccl-cu13 (the NCCL
#     PyTorch uses), into .deps/nccl/include, for expert parallelism over
#     NCCL; the library itself is loaded at run time (docs/expert-parallel.md)
#   - copies of GoogleTest's source and the header-only libraries under .deps,
#     so that a copy of the tree with its .deps folder also builds on a
#     machine without network access or these packages.
#   - with --python: the Python package's test dependencies (torch,
#     transformers, pytest: python/requirements-test.txt) in the ignored
#     virtualenv .venv (see "Python test dependencies" below).
#   - with --peers: the sources the benchmark peers import, under
#     .deps/peers (see "Benchmark peers" below).
set -euo pipefail
cd "$(dirname "$0")/.."
with_python=0
with_peers=0
for arg in "$@"; do
  case "$arg" in
    --python) with_python=1 ;;
    --peers) with_peers=1 ;;
    *) echo "setup: unknown option '$arg' (known: --python, --peers)" >&2; exit 2 ;;
  esac
done

CUTLASS_VERSION=4.2.0.0
CUTLASS_SHA256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
DEPS=.deps

need_apt=()
for pkg in cmake ninja-build g++ libgtest-dev nlohmann-json3-dev libcli11-dev ccache python3-pip python3-venv unzip; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

mkdir -p "$DEPS"
# headers_from_wheel PACKAGE VERSION SHA256 DIR_IN_WHEEL NAME: unpacks
# DIR_IN_WHEEL of the pinned wheel PACKAGE==VERSION into $DEPS/NAME/include,
# once (NAME/VERSION records what is there).
headers_from_wheel() {
  local package=$1 version=$2 sha=$3 dir=$4 name=$5
  local stamp="$DEPS/$name/VERSION"
  [ "$(cat "$stamp" 2>/dev/null)" = "$version" ] && return 0
  echo "setup: fetching $package==$version (headers only)"
  local tmp whl got
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: "$package==$version" -d "$tmp"
  whl=$(ls "$tmp"/*.whl)
  got=$(sha256sum "$whl" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "setup: $package wheel sha256 $got does not match the pinned $sha" >&2
    exit 1
  fi
  rm -rf "${DEPS:?}/$name"
  mkdir -p "$DEPS/$name"
  unzip -q "$whl" "$dir/*" -d "$tmp/x"
  mv "$tmp/x/$dir" "$DEPS/$name/include"
  echo "$version" >"$stamp"
  rm -rf "$tmp"
}
headers_from_wheel nvidia-cutlass "$CUTLASS_VERSION" "$CUTLASS_SHA256" cutlass_library/source/include cutlass
# NCCL's headers only: the library loads libnccl.so.2 when an EP transport
# over NCCL is made, so the build needs no NCCL library.
NCCL_VERSION=2.28.9
NCCL_SHA256=e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42
headers_from_wheel nvidia-nccl-cu13 "$NCCL_VERSION" "$NCCL_SHA256" nvidia/nccl/include nccl

# Copies for a machine without network access or these packages.
if [ ! -f "$DEPS/googletest/CMakeLists.txt" ]; then
  rm -rf "$DEPS/googletest" && cp -r /usr/src/googletest "$DEPS/googletest"
fi
if [ ! -f "$DEPS/include/CLI/CLI.hpp" ] || [ ! -f "$DEPS/include/nlohmann/json.hpp" ]; then
  mkdir -p "$DEPS/include"
  cp -r /usr/include/CLI /usr/include/nlohmann "$DEPS/include/"
fi
echo "setup: dependencies ready under $DEPS"

# ---- Benchmark peers, in .deps/peers -----------------------------------------
# The peers under bench/peers run code of the vllm==0.26.0 wheel (about
# 300 MB, downloaded once, then deleted) without vLLM itself; only the pure
# Python and Triton files they read are kept:
#   - .deps/peers/triton_kernels: OpenAI's triton_kernels as vendored in
#     vllm/third_party/triton_kernels (a few hundred KB), for
#     oai_mxfp4_peer.py. `sys.path.insert(0, ".deps/peers")` makes
#     `import triton_kernels` work; its modules import each other as
#     `triton_kernels.*`. (The PyPI project named triton-kernels is
#     unrelated and is not used.)
#   - .deps/peers/vllm_fused_moe: vLLM's Triton fused_moe files at their
#     wheel paths (fused_moe.py with its tuned configs/ folder, the
#     fused_moe utils, the FP8 quantization utilities) and the wheel's
#     LICENSE, about 2 MB, for vllm_fused_moe_peer.py, which reads the
#     functions it needs from them; they are never imported as `vllm`.
# SOURCE records the wheel's version and sha256 and the paths kept. A part
# that is missing is extracted; with both present nothing is fetched.
if [ "$with_peers" = 1 ]; then
  VLLM_VERSION=0.26.0
  peers="$DEPS/peers"
  fused_moe_files=(
    vllm/model_executor/layers/fused_moe/fused_moe.py
    vllm/model_executor/layers/fused_moe/utils.py
    'vllm/model_executor/layers/fused_moe/configs/*'
    vllm/model_executor/layers/quantization/utils/fp8_utils.py
    vllm/model_executor/layers/quantization/utils/quant_utils.py
  )
  same_version=0
  [ "$(sed -n 's/^vllm==//p' "$peers/SOURCE" 2>/dev/null)" = "$VLLM_VERSION" ] && same_version=1
  need_tk=1; need_fm=1
  [ "$same_version" = 1 ] && [ -f "$peers/triton_kernels/matmul_ogs.py" ] && need_tk=0
  [ "$same_version" = 1 ] && [ -f "$peers/vllm_fused_moe/vllm/model_executor/layers/fused_moe/fused_moe.py" ] && need_fm=0
  if [ "$need_tk" = 1 ] || [ "$need_fm" = 1 ]; then
    echo "setup: fetching vllm==$VLLM_VERSION (for its triton_kernels and Triton fused_moe files only)"
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: "vllm==$VLLM_VERSION" -d "$tmp"
    whl=$(ls "$tmp"/vllm-"$VLLM_VERSION"-*.whl)
    sha=$(sha256sum "$whl" | cut -d' ' -f1)
    mkdir -p "$peers"
    if [ "$need_tk" = 1 ]; then
      unzip -q "$whl" 'vllm/third_party/triton_kernels/*' -d "$tmp/tk"
      rm -rf "$peers/triton_kernels"
      mv "$tmp/tk/vllm/third_party/triton_kernels" "$peers/triton_kernels"
    fi
    if [ "$need_fm" = 1 ]; then
      unzip -q "$whl" "${fused_moe_files[@]}" "vllm-$VLLM_VERSION.dist-info/licenses/LICENSE" -d "$tmp/fm"
      mv "$tmp/fm/vllm-$VLLM_VERSION.dist-info/licenses/LICENSE" "$tmp/fm/LICENSE"
      rm -rf "$tmp/fm/vllm-$VLLM_VERSION.dist-info"
      rm -rf "$peers/vllm_fused_moe"
      mv "$tmp/fm" "$peers/vllm_fused_moe"
    fi
    {
      echo "vllm==$VLLM_VERSION"
      echo "wheel $(basename "$whl")"
      echo "sha256 $sha"
      echo "path vllm/third_party/triton_kernels"
      printf 'path %s\n' "${fused_moe_files[@]}"
    } >"$peers/SOURCE"
    cp "$peers/SOURCE" "$peers/vllm_fused_moe/SOURCE"
    rm -rf "$tmp"
  fi
  echo "setup: vllm==$VLLM_VERSION's triton_kernels and Triton fused_moe files in $peers ($(du -sh "$peers" | cut -f1))"
fi

# ---- Python test dependencies, in .venv --------------------------------------
# PyPI's torch for Linux is the CUDA build: the torch wheel (530 MB) needs
# about 2.2 GB of CUDA library wheels besides (cuBLAS, cuDNN, NCCL, ...). The
# tests use torch on the CPU only, and a machine with the CUDA toolkit
# (nvcc) already has most of those libraries, so the torch wheel goes in
# without its dependencies, with the few libraries the toolkit lacks
# (cuFile, cuSPARSELt, NVSHMEM) and torch's pure-Python dependencies. Where
# torch still does not import, the full set is installed. The CPU-only
# wheels of PyTorch's own index would be smaller, but only PyPI is reachable
# from the machines this runs on.
[ "$with_python" = 1 ] || exit 0
VENV=.venv
REQ=python/requirements-test.txt
stamp="$VENV/unimoe-requirements.sha256"
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing the Python test dependencies into $VENV ($REQ)"
  start=$SECONDS
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  torch_line=$(grep -E '^torch==' "$REQ")
  torch_slim=$(sed -n 's/^# slim: //p' "$REQ")
  # shellcheck disable=SC2086  # the slim list is words
  "${pip[@]}" --no-deps "$torch_line" $torch_slim
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "setup: torch needs its CUDA library wheels here; installing them"
    "${pip[@]}" "$torch_line"
  fi
  grep -v '^torch==' "$REQ" >"$VENV/requirements-rest.txt"
  "${pip[@]}" -r "$VENV/requirements-rest.txt"
  "$VENV/bin/python" -c "import torch, transformers, pytest"
  echo "$want" >"$stamp"
  echo "setup: Python test dependencies installed in $((SECONDS - start)) s"
fi
echo "setup: Python test dependencies ready in $VENV"
