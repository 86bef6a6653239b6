#!/usr/bin/env bash
# scripts/sanitize.sh with a fake test binary and a fake compute-sanitizer
# (shell scripts that log their calls and print the summaries asked of
# them), so it runs without a GPU: the arguments and their refusals, exit 2
# where there is no binary, no sanitizer or no GPU, one summary line a tool,
# each tool's filter and options, and exit 1 on errors, hazards, a missing
# summary, failed or skipped tests.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
san="$here/../../scripts/sanitize.sh"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir "$d/build"
cat >"$d/build/unimoe_gpu_tests" <<FAKE
#!/usr/bin/env bash
if [ "\$*" = "--gtest_filter=GpuSmoke.*" ]; then
  [ -n "\${FAKE_NO_GPU:-}" ] && echo "GPU test skipped: no CUDA device"
  exit 0
fi
echo "\$*" >>"$d/tests.log"
[ -n "\${FAKE_SKIP:-}" ] && echo "[  SKIPPED ] Fake.Test (0 ms)"
echo "[  PASSED  ] 3 tests."
exit \${FAKE_TEST_RC:-0}
FAKE
cat >"$d/compute-sanitizer" <<FAKE
#!/usr/bin/env bash
echo "\$*" >>"$d/sanitizer.log"
tool=memcheck
while [ \$# -gt 0 ]; do
  case \$1 in
    --tool) tool=\$2; shift 2 ;;
    --leak-check|--print-limit) shift 2 ;;
    *) break ;;
  esac
done
"\$@"
rc=\$?
errors=FAKE_ERRORS_\$tool
if [ "\$tool" = racecheck ]; then
  h=\${FAKE_HAZARDS:-0}
  echo "========= RACECHECK SUMMARY: \$h hazards displayed (\$h errors, 0 warnings)"
elif [ "\$tool" != "\${FAKE_NO_SUMMARY:-}" ]; then
  echo "========= ERROR SUMMARY: \${!errors:-0} errors"
fi
exit \$rc
FAKE
chmod +x "$d/build/unimoe_gpu_tests" "$d/compute-sanitizer"
export UNIMOE_BUILD_DIR="$d/build" COMPUTE_SANITIZER="$d/compute-sanitizer" OUT="$d/out"

fail() { echo "FAILED: $1"; exit 1; }
# Runs sanitize.sh with the given arguments; $rc and $text hold its exit status and output.
run() { rc=0; text=$("$san" "$@" 2>&1) || rc=$?; }

run --help
[ $rc = 0 ] && echo "$text" | grep -q -- "--tools" || fail "--help: $rc $text"
for bad in "--tools memcheck,bogus" "--tools ," "--timeout soon" "--filter" "--frobnicate"; do
  # shellcheck disable=SC2086  # the words are the arguments
  run $bad
  [ $rc = 2 ] || fail "'$bad' gave exit $rc: $text"
done
UNIMOE_BUILD_DIR="$d/none" run
[ $rc = 2 ] && echo "$text" | grep -q "no test binary" || fail "no binary: $rc $text"
COMPUTE_SANITIZER="$d/none" run
[ $rc = 2 ] && echo "$text" | grep -q "compute-sanitizer not found" || fail "no sanitizer: $rc $text"
FAKE_NO_GPU=1 run
[ $rc = 2 ] && echo "$text" | grep -q "no usable GPU here (no CUDA device)" || fail "no GPU: $rc $text"

# Clean: one line a tool, in order; every log written; memcheck checks
# leaks; racecheck takes its own, smaller filter.
run
[ $rc = 0 ] || fail "clean run gave exit $rc: $text"
lines=$(echo "$text" | sed 's/, [0-9]* s$//' | tr '\n' '|')
want="memcheck: 0 errors, 3 tests passed|racecheck: 0 hazards (0 errors, 0 warnings), 3 tests passed|"
want+="synccheck: 0 errors, 3 tests passed|initcheck: 0 errors, 3 tests passed|"
[ "$lines" = "$want" ] || fail "summaries: $lines"
for t in memcheck racecheck synccheck initcheck; do [ -s "$d/out/$t.log" ] || fail "no $t.log"; done
grep -q "^--tool memcheck --leak-check full $d/build/unimoe_gpu_tests --gtest_filter=GpuSmoke" \
  "$d/sanitizer.log" || fail "memcheck call: $(cat "$d/sanitizer.log")"
grep -q "^--tool racecheck --print-limit 1000 $d/build/unimoe_gpu_tests --gtest_filter=PermuteGpu" "$d/sanitizer.log" ||
  fail "racecheck call: $(cat "$d/sanitizer.log")"

# Findings, a missing summary, failed or skipped tests: exit 1, the tool named.
FAKE_ERRORS_initcheck=3 run --tools synccheck,initcheck
[ $rc = 1 ] && echo "$text" | grep -q "^initcheck: 3 errors, .*FAILED: findings" &&
  echo "$text" | grep -q "^synccheck: 0 errors, 3 tests passed, [0-9]* s$" || fail "initcheck errors: $rc $text"
FAKE_HAZARDS=2 run --tools racecheck
[ $rc = 1 ] && echo "$text" | grep -q "^racecheck: 2 hazards (2 errors, 0 warnings), .*FAILED" ||
  fail "hazards: $rc $text"
FAKE_NO_SUMMARY=memcheck run --tools memcheck
[ $rc = 1 ] && echo "$text" | grep -q "no summary in the log" || fail "no summary: $rc $text"
FAKE_TEST_RC=1 run --tools synccheck
[ $rc = 1 ] && echo "$text" | grep -q "tests failed (exit 1)" || fail "test failure: $rc $text"
FAKE_SKIP=1 run --tools synccheck
[ $rc = 1 ] && echo "$text" | grep -q "1 tests skipped" || fail "skipped tests: $rc $text"

# --filter replaces every tool's filter; --dry-run only prints.
: >"$d/tests.log"
run --tools memcheck,racecheck --filter 'Only.This'
[ $rc = 0 ] && [ "$(sort -u "$d/tests.log")" = "--gtest_filter=Only.This" ] || fail "--filter: $(cat "$d/tests.log")"
: >"$d/tests.log"
run --dry-run
[ $rc = 0 ] && [ "$(echo "$text" | wc -l)" = 4 ] && [ ! -s "$d/tests.log" ] || fail "--dry-run: $rc $text"
echo "sanitize_args: ok"
