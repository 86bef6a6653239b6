#!/usr/bin/env bash
# scripts/pack_out.sh on a scratch folder: every entry ends up in
# results.tgz and nothing else is left; a second pack adds what is new.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pack="$here/../../scripts/pack_out.sh"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
echo a >"$d/bench.json"
echo b >"$d/gpu tests.log"
mkdir "$d/sub" && echo c >"$d/sub/x.txt"
"$pack" "$d" >/dev/null
left=$(ls -A "$d")
[ "$left" = "results.tgz" ] || { echo "FAILED: left $left"; exit 1; }
listing=$(tar tzf "$d/results.tgz" | sort | tr '\n' ' ')
[ "$listing" = "bench.json gpu tests.log sub/ sub/x.txt " ] || { echo "FAILED: listing $listing"; exit 1; }
# A second pack adds a new file and keeps the first pack's.
echo d >"$d/later.json"
"$pack" "$d" >/dev/null
listing=$(tar tzf "$d/results.tgz" | sort | tr '\n' ' ')
[ "$listing" = "bench.json gpu tests.log later.json sub/ sub/x.txt " ] || { echo "FAILED: second pack $listing"; exit 1; }
[ "$(ls -A "$d")" = "results.tgz" ] || { echo "FAILED: second pack left files"; exit 1; }
# Empty folder but for the tarball: nothing to do, the tarball stays.
"$pack" "$d" | grep -q "nothing to pack" || { echo "FAILED: empty case"; exit 1; }
[ -f "$d/results.tgz" ] || { echo "FAILED: tarball removed"; exit 1; }
if "$pack" "$d/missing" 2>/dev/null; then echo "FAILED: missing folder accepted"; exit 1; fi
echo "pack_out: ok"
