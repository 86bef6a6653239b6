#!/usr/bin/env bash
# An A/B of routing builds on one machine: each unimoe-bench binary
# (gzipped ones are unpacked first) runs the routing sweep REPS times,
# interleaved (base, new, ..., base, new, ...), so that every build meets
# the same GPU state; then scripts/compare_routing_sweeps.py compares each
# build with the first (per variant, policy family and range of T, each
# point's minimum over the repeats).
#
#   scripts/routing_ab.sh [-r REPS] [-o DIR] BASE NEW [NEW2 ...] [-- sweep arguments]
#
# REPS defaults to 2, DIR to $OUT (else out/ab). Sweep arguments default
# to a 1344-point decode grid (policies DeepSeekV3, Renormalize, TopK,
# Default; E 8..1024; K 1, 2, 4, 8; T 1..128; --iters 20). Writes
# DIR/NAME-REP.json and .log per sweep and DIR/cmp_NAME.txt per build
# after the first (NAME: the file name without .gz); prints the
# comparisons.
#
# The sweep arguments apply to every build. To compare settings of one
# build instead of two builds, give each setting as a small executable
# script that runs the binary with it, e.g. a file cluster16 holding
#   #!/bin/sh
#   exec build/unimoe-bench --dev cluster_max_ctas=16 "$@"
# (development knobs: unimoe-bench --dev NAME=VALUE; the routing variant:
# --routing-variant).
set -uo pipefail
cd "$(dirname "$0")/.."
reps=2
out=${OUT:-out/ab}
while getopts "r:o:" opt; do
  case $opt in
    r) reps=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: $0 [-r REPS] [-o DIR] BASE NEW [NEW2 ...] [-- sweep arguments]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
if [ ${#bins[@]} -lt 2 ]; then
  echo "routing_ab: needs a base build and at least one other" >&2
  exit 2
fi
if [ $# -gt 0 ]; then
  sweep=("$@")
else
  sweep=(--policies DeepSeekV3,Renormalize,TopK,Default --experts 8,64,128,256,512,1024
         --top-k 1,2,4,8 --tokens 1,2,3,4,6,8,12,16,24,32,48,64,96,128 --iters 20)
fi
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
names=()
paths=()
for b in "${bins[@]}"; do
  [ -f "$b" ] || { echo "routing_ab: no file $b" >&2; exit 2; }
  name=$(basename "$b" .gz)
  for n in "${names[@]}"; do
    [ "$n" != "$name" ] || { echo "routing_ab: two builds named $name" >&2; exit 2; }
  done
  if [[ "$b" == *.gz ]]; then
    gunzip -c "$b" > "$tmp/$name" && chmod +x "$tmp/$name"
    b="$tmp/$name"
  fi
  names+=("$name")
  paths+=("$b")
done
status=0
for ((rep = 1; rep <= reps; ++rep)); do
  for i in "${!paths[@]}"; do
    if ! "${paths[$i]}" --routing-sweep "${sweep[@]}" --json "$out/${names[$i]}-$rep.json" \
         > "$out/${names[$i]}-$rep.log" 2>&1; then
      echo "routing_ab: ${names[$i]} repeat $rep failed (${names[$i]}-$rep.log)"
      status=1
    fi
  done
done
base=${names[0]}
for name in "${names[@]:1}"; do
  echo "== $name against $base"
  a=() b=()
  for ((rep = 1; rep <= reps; ++rep)); do
    [ -f "$out/$base-$rep.json" ] && a+=("$out/$base-$rep.json")
    [ -f "$out/$name-$rep.json" ] && b+=("$out/$name-$rep.json")
  done
  if [ ${#a[@]} -eq 0 ] || [ ${#b[@]} -eq 0 ]; then
    echo "routing_ab: no sweep of $base or $name to compare"
    status=1
    continue
  fi
  python3 scripts/compare_routing_sweeps.py --a "${a[@]}" --b "${b[@]}" | tee "$out/cmp_$name.txt" || status=1
done
exit $status
