#!/usr/bin/env bash
# The expert-parallel layer over NCCL on every GPU count of 2, 4 and 8 this
# machine has: presets of each routing family (softmax top-k, DeepSeek-V3's
# grouped sigmoid, Llama-4's top-1, gpt-oss's biased SwiGLU), uniform and
# hot-expert routing, T in {1, 7, 64, 1000, 4096}; every point checked
# against the CPU reference (unimoe-bench --ep, docs/expert-parallel.md).
# Exits 77 (ctest: skipped) with fewer than two GPUs.
#   scripts/ep_check.sh [BUILD_DIR] [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-out/ep_check}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 2 ]; then
  echo "ep_check: skipped: expert parallelism over NCCL needs 2 or more GPUs; this machine has ${gpus:-0}"
  exit 77
fi
# PyTorch's NCCL (the nvidia-nccl-cu13 wheel), where the loader does not find one.
lib=$(python3 -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
[ -n "$lib" ] && export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
status=0
for n in 2 4 8; do
  [ "$n" -le "$gpus" ] || break
  for routing in uniform hot:0.5; do
    name="ep${n}_${routing%%:*}"
    echo "ep_check: $n GPUs, $routing routing"
    if ! "$build/unimoe-bench" --ep "$n" --preset mixtral-8x7b,dsv3-tp8,llama4-maverick,gpt-oss-120b \
        --tokens 1,7,64,1000,4096 --routing "$routing" --iters 10 --check-tokens 8 \
        --json "$out/$name.json" >"$out/$name.log" 2>&1; then
      echo "ep_check: FAILED: $n GPUs, $routing routing (log: $out/$name.log)"
      tail -20 "$out/$name.log"
      status=1
    fi
  done
done
# Every run's points, read together (scripts/analyze_ep.py); its exit
# status fails the check too.
python3 scripts/analyze_ep.py "$out"/ep*.json || status=1
exit $status
