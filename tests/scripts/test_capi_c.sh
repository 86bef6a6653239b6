#!/usr/bin/env bash
# The C ABI from a C program: builds tests/capi/test_capi.c as C99 with
# -Werror against include/unimoe/unimoe_c.h and BUILD_DIR/libunimoe_c.so,
# and runs it.
set -euo pipefail
build=${1:?usage: test_capi_c.sh BUILD_DIR}
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -std=c99 -Wall -Wextra -Werror -I"$src/include" "$src/tests/capi/test_capi.c" \
  -L"$build" -lunimoe_c -lm -Wl,-rpath,"$(cd "$build" && pwd)" -o "$work/test_capi"
"$work/test_capi"
