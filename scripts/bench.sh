#!/usr/bin/env bash
# The main job: set-up, build, then unimoe-bench with the given arguments
# (default: the qwen3-30b-a3b preset). Without a GPU, unimoe-bench runs the CPU
# reference on a reduced size and says so. `scripts/bench.sh --help` lists options.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >&2
if [ $# -eq 0 ]; then set -- --preset qwen3-30b-a3b; fi
exec build/unimoe-bench "$@"
