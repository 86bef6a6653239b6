#!/usr/bin/env bash
# Packs an output folder into one tarball: every entry of DIR (default
# $OUT, else out/gpu) goes into DIR/results.tgz and is removed, so that the
# results of a GPU machine travel as one file. Packing again adds the new
# entries to the tarball and keeps what it held. Unpack with:
#   tar xzf results.tgz
set -euo pipefail
dir=${1:-${OUT:-out/gpu}}
[ -d "$dir" ] || { echo "pack_out: no folder $dir" >&2; exit 1; }
cd "$dir"
mapfile -t files < <(find . -mindepth 1 -maxdepth 1 ! -name results.tgz -printf '%P\n' | sort)
if [ ${#files[@]} -eq 0 ]; then
  echo "pack_out: nothing to pack in $dir"
  exit 0
fi
if [ -f results.tgz ]; then  # an earlier pack: keep what it holds
  mapfile -t old < <(tar tzf results.tgz | grep -v '/.' | sed 's:/$::' | sort -u)
  tar xzf results.tgz --skip-old-files
  mapfile -t files < <(printf '%s\n' "${files[@]}" "${old[@]}" | sort -u)
fi
tar czf results.tgz.part "${files[@]}"
mv results.tgz.part results.tgz
rm -rf "${files[@]}"
echo "pack_out: ${#files[@]} entries of $dir in results.tgz"
