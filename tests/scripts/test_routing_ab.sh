#!/usr/bin/env bash
# scripts/routing_ab.sh with fake unimoe-bench builds (shell scripts that
# log their calls and write a sweep of fixed times): the runs interleave,
# gzipped builds run, the sweep arguments pass through, each build is
# compared with the first; bad calls are refused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ab="$here/../../scripts/routing_ab.sh"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fake() {  # name, time in us
  cat >"$d/$1" <<FAKE
#!/usr/bin/env bash
echo "$1 \$*" >>"$d/calls.log"
out=""
while [ \$# -gt 0 ]; do [ "\$1" = "--json" ] && out=\$2; shift; done
printf '{"points": [{"policy": "DeepSeekV3", "E": 256, "K": 8, "T": 4, "split_us": %s, "fused_us": %s, "cluster_us": %s}]}' $2 $2 $2 >"\$out"
FAKE
  chmod +x "$d/$1"
}
fake base 10.0
fake fast 8.0
fake slow 12.5
gzip "$d/slow"
out=$("$ab" -r 2 -o "$d/res" "$d/base" "$d/fast" "$d/slow.gz" -- --tokens 4 --iters 3)
order=$(cut -d' ' -f1 "$d/calls.log" | tr '\n' ' ')
[ "$order" = "base fast slow base fast slow " ] || { echo "FAILED: order $order"; exit 1; }
grep -q "^base --routing-sweep --tokens 4 --iters 3 --json $d/res/base-1.json$" "$d/calls.log" ||
  { echo "FAILED: arguments"; cat "$d/calls.log"; exit 1; }
for f in base-1.json base-2.json fast-2.json slow-1.json cmp_fast.txt cmp_slow.txt; do
  [ -f "$d/res/$f" ] || { echo "FAILED: no $f"; exit 1; }
done
grep -q "0.800" "$d/res/cmp_fast.txt" || { echo "FAILED: fast ratio"; cat "$d/res/cmp_fast.txt"; exit 1; }
grep -q "1.250" "$d/res/cmp_slow.txt" || { echo "FAILED: slow ratio"; cat "$d/res/cmp_slow.txt"; exit 1; }
echo "$out" | grep -q "== fast against base" || { echo "FAILED: printed comparison"; exit 1; }
# Without sweep arguments: the default decode grid.
rm "$d/calls.log"
"$ab" -r 1 -o "$d/res2" "$d/base" "$d/fast" >/dev/null
grep -q "^base --routing-sweep --policies DeepSeekV3,Renormalize,TopK,Default .* --iters 20 --json" \
  "$d/calls.log" || { echo "FAILED: default grid"; cat "$d/calls.log"; exit 1; }
# Refused: one build only; two builds of one name; a missing file.
if "$ab" -o "$d/res3" "$d/base" 2>/dev/null; then echo "FAILED: one build accepted"; exit 1; fi
mkdir "$d/other" && cp "$d/base" "$d/other/base"
if "$ab" -o "$d/res3" "$d/base" "$d/other/base" 2>/dev/null; then echo "FAILED: same names accepted"; exit 1; fi
if "$ab" -o "$d/res3" "$d/base" "$d/missing" 2>/dev/null; then echo "FAILED: missing file accepted"; exit 1; fi
echo "routing_ab: ok"
