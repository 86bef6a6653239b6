#!/usr/bin/env bash
# NVIDIA compute-sanitizer's four tools over the GPU tests, on a machine
# with a Hopper GPU: memcheck (out-of-bounds and misaligned accesses,
# device leaks: --leak-check full), racecheck (shared-memory hazards),
# synccheck (barrier misuse) and initcheck (reads of device memory never
# written). Each tool runs the test binary once over a filter of tests that
# reaches every kernel family; its log (the tool's report and the tests'
# output) goes to $OUT/TOOL.log, and one line a tool sums it up.
#
#   scripts/sanitize.sh [--tools LIST] [--filter PATTERN] [--timeout S] [--dry-run]
#
#   --tools     comma-separated, any of memcheck,racecheck,synccheck,initcheck
#               (default: all four, in that order)
#   --filter    a gtest filter for every tool instead of the built-in ones
#   --timeout   seconds a tool may run (default 1800); a tool cut off fails
#   --dry-run   print each tool's command and exit
#
# Environment: OUT, the log folder (default out/sanitize); UNIMOE_BUILD_DIR,
# where unimoe_gpu_tests is (default build); COMPUTE_SANITIZER, the tool's
# path (default: compute-sanitizer on PATH, else
# /usr/local/cuda/bin/compute-sanitizer). Options are flags, not UNIMOE_*
# variables: the library refuses UNIMOE_* names it does not know.
#
# Exit status: 0 every tool ran clean and every test passed; 1 a tool
# reported an error, hazard or leak, a test failed or was skipped, a tool
# timed out or its log has no summary; 2 it cannot run here (bad
# arguments, no test binary, no compute-sanitizer, no usable GPU).
#
# The filters. The sanitizers slow kernels down 10-100x and add a cost to
# every launch, so each family is reached by its smaller tests:
#   routing, split variant   RoutingGpu.AdversarialLogits (warp a token, every
#                            policy, NaN/inf/tied rows), RoutingGpu.
#                            GroupedDeepSeekV3WhereRunsSort (sorted rounds, kept
#                            halves), RoutingGpu.NoTokensLaunchesNothing
#   routing, octet kernel    RoutingGpu.AdversarialLogitsOfOctets (filter and
#                            exact modes), PermuteGpu.GraphReplayOfRoutingAndPermute
#                            (split, octets and the permute chain in a graph)
#   routing, fused/cluster   FusedRoutingGpu.ExpertParallelRangeWithOffRankRows and
#                            .ClusterWaysAtTheirBound (each case runs the fused
#                            block, the cluster variant and split), .SpreadKernel
#                            OverClusterSizes (the spread kernel), .NoTokens...,
#                            .GraphReplayWithNewLogits and .ClusterOfTwoGraph...
#                            (captured and replayed)
#   permute                  PermuteGpu.EmptyExperts, .OneHotExpert, .NoTokens...,
#                            .GraphReplayOfRoutingAndPermute
#   GEMM, mma and stream     GroupedGemm.OddSizesEveryActivation (every tactic,
#                            the wgmma ones too), .StreamOneTokenTilesAtEveryKSplit,
#                            .GraphReplay..., .WgmmaTacticsAtPrefillSizes
#   GEMM, cutlass            Sm90GroupedGemmTest shapes 0, 1, 2 and 4 (every
#                            tactic; not the anchor-sized 5 and 6),
#                            Sm90GroupedGemm.GraphReplayServesNewOffsets,
#                            ExpertRows.* (gather), GatedActivationTest.*
#   fp8 activation quant     Fp8QuantGpu.* (racecheck and initcheck: the two
#                            special-values tests, both forms)
#   fp8 weight quant         Fp8WeightsGpu.* but .IndicesPast32Bits (2 GB of
#                            codes); racecheck and initcheck: .SpecialValues
#                            (both variants)
#   fp8 GEMMs                Sm90Fp8GroupedGemmTest shapes 0, 2 and 4 (both
#                            tactics, bf16 and fp32 D), Sm90Fp8GroupedGemm.
#                            GraphReplayServesNewOffsets, Fp8WgmmaGemm.OneHot...
#                            and .GraphReplays... (the wgmma kernel), Fp8StreamGemm.
#                            MultiRowTilesAndEmptyExperts, .GraphReplays...
#                            (both tile paths, every unit width) and .WideCtas
#                            (two column blocks a CTA), Fp8WideCtasGpu.Graph
#                            Replays... (the same in the dsv3-tp8 layer),
#                            Fp8RowsGpu.*
#                            (quantize with group-major scales, gather, fp32
#                            activation, the activation quantized in one kernel)
#   fp8 layer                LayerFp8Gpu.ExpertParallelRangeDropsOffRankRows and
#                            .PrecomputedRouting (every FP8 form on both paths);
#                            racecheck and initcheck: the first
#   4-bit weights            Fp4WeightsGpu.* but .IndicesPast32Bits (quantize
#                            both formats, special values, the prepare kernel
#                            with and without the gate/up reorder)
#   W4A16 layer              LayerW4Gpu.OddSizes (K of one lane and of one step,
#                            every tile path), .ExpertParallelRangeDropsOffRank
#                            Rows, .InterleavedGateUpMatchesBitForBit,
#                            .BlockScaleCodesOverTheirRange (both formats),
#                            .BothTileForms (16-row tiles and the rows form's
#                            shared-memory ring, forced);
#                            racecheck and initcheck: the second, fourth and
#                            fifth
#   GEMM2 gate, combine      Gemm2GateGpu.ExpertParallelRangeAndFewTilesSplittingK
#                            (the combine's K splits, off-rank rows), .Precomputed
#                            RoutingThroughTheGate, .CombinePathLeavesTheExpert
#                            RowsPoisoned, .OneGraphTakesBothPathsAsTheRouting
#                            Changes (the gate and both paths in one graph),
#                            .CallWithNoRowOnThisRankWritesZeros (no tiles),
#                            .GatedTailGivesEachForcedPathsBits (the tail's
#                            combine and finalize);
#                            racecheck and initcheck: the first two
#   decode folds             DecodeFoldsGpu.ExpertParallelRangeAndACallWith
#                            NoLocalRow (the FP8 GEMMs quantizing their own
#                            rows, the folded finalize's counters and its
#                            zeros, every FP8 form and both 4-bit formats),
#                            .RepeatedExpertAtOneTokenAgainstTheReference
#                            (a two-row tile a row at a time); racecheck and
#                            initcheck: the first
#   GEMM2's weights in L2    NextPrefetchGpu.SmallShapeEveryVariant and
#                            .ExpertParallelRange (the FP8 decode GEMM1's bulk
#                            L2 prefetch, on and off)
#   expert parallelism       EPLayerGpu.DispatchSlotsMatchTheReference (the
#                            slot scan, packing and padding over 4 loopback
#                            ranks), .EmptyCallsWriteNothing, .CapturedOnce
#                            ReplaysWithFreshRouting (every step of 4 ranks in
#                            one graph); racecheck and initcheck: the first two
#   finalize, the layer      LayerGpu.OddSizesAndEveryActivation (every backend
#                            and activation, b2 in the finalize on cutlass),
#                            .ExpertParallelRangeDropsOffRankRows, .Precomputed
#                            Routing, FusedRoutingGpu.LayerVariantMatchesSplit
#                            (each routing variant), LayerGraphGpu.* (graph
#                            replay on every backend)
#   shared scratch           SharedScratchGpu.LayersOfAModelMatchLayersWith
#                            BuffersOfTheirOwn (five layers of four variants
#                            on one caller's scratch), EPLayerGpu.LayersOfA
#                            ModelShareOneScratchARank (two EP layers a rank
#                            on one buffer)
# racecheck, the slowest tool (it tracks every shared-memory access), takes
# one small test a family: the split, octet and permute kernels through
# PermuteGpu.GraphReplayOfRoutingAndPermute, the fused, cluster and split
# variants through FusedRoutingGpu.ClusterWaysAtTheirBound and the cluster
# of two in a graph, every mma and stream tactic at 33 tokens, the stream
# kernel's K splits, the smallest CUTLASS shape, and the layer on every
# backend at E=32..64, H=256. It leaves out the layer's graph replay at
# Qwen3-30B-A3B size (the same kernels, at H=2048, as the other layer tests).
set -uo pipefail
cd "$(dirname "$0")/.."

readonly kFullFilter="GpuSmoke.*\
:RoutingGpu.AdversarialLogits:RoutingGpu.GroupedDeepSeekV3WhereRunsSort:RoutingGpu.NoTokensLaunchesNothing\
:RoutingGpu.AdversarialLogitsOfOctets\
:PermuteGpu.GraphReplayOfRoutingAndPermute:PermuteGpu.EmptyExperts:PermuteGpu.OneHotExpert\
:PermuteGpu.NoTokensStillWritesCountsOffsetsAndTileCounts\
:FusedRoutingGpu.ExpertParallelRangeWithOffRankRows:FusedRoutingGpu.ClusterWaysAtTheirBound\
:FusedRoutingGpu.SpreadKernelOverClusterSizes:FusedRoutingGpu.NoTokensWritesZeroCountsOffsetsAndTiles\
:FusedRoutingGpu.GraphReplayWithNewLogits:FusedRoutingGpu.ClusterOfTwoGraphReplayWithNewLogits\
:GroupedGemm.OddSizesEveryActivation:GroupedGemm.StreamOneTokenTilesAtEveryKSplit\
:GroupedGemm.GraphReplayFollowsTheRouting\
:Shapes/Sm90GroupedGemmTest.*/0:Shapes/Sm90GroupedGemmTest.*/1:Shapes/Sm90GroupedGemmTest.*/2\
:Shapes/Sm90GroupedGemmTest.*/4:Sm90GroupedGemm.GraphReplayServesNewOffsets:ExpertRows.*\
:Activations/GatedActivationTest.*\
:LayerGpu.OddSizesAndEveryActivation:LayerGpu.ExpertParallelRangeDropsOffRankRows\
:LayerGpu.PrecomputedRouting:FusedRoutingGpu.LayerVariantMatchesSplit:Backends/LayerGraphGpu.*\
:Fp8QuantGpu.*\
:Fp8WeightsGpu.Bf16SourceMatchesReference:Fp8WeightsGpu.SyntheticSourceMatchesReference\
:Fp8WeightsGpu.SpecialValues:Fp8WeightsGpu.EmptyShapes:Fp8WeightsGpu.PerTensorLargeMatrix\
:Fp8WeightsGpu.BadArguments\
:Shapes/Sm90Fp8GroupedGemmTest.*/0:Shapes/Sm90Fp8GroupedGemmTest.*/2:Shapes/Sm90Fp8GroupedGemmTest.*/4\
:Sm90Fp8GroupedGemm.GraphReplayServesNewOffsets\
:Fp8StreamGemm.MultiRowTilesAndEmptyExperts:Fp8StreamGemm.GraphReplaysForTwoSchedules:Fp8RowsGpu.*\
:Fp8StreamGemm.WideCtas:Fp8WideCtasGpu.GraphReplaysWithFreshRouting\
:Fp8WgmmaGemm.OneHotExpert:Fp8WgmmaGemm.GraphReplaysForTwoSchedules:GroupedGemm.WgmmaTacticsAtPrefillSizes\
:LayerFp8Gpu.ExpertParallelRangeDropsOffRankRows:LayerFp8Gpu.PrecomputedRouting\
:Fp4WeightsGpu.Bf16SourceMatchesReference:Fp4WeightsGpu.SyntheticSourceMatchesReference\
:Fp4WeightsGpu.SpecialValues:Fp4WeightsGpu.EmptyShapes:Fp4WeightsGpu.PrepareMatchesHost\
:Fp4WeightsGpu.QuantizeBadArguments:Fp4WeightsGpu.PrepareBadArguments\
:LayerW4Gpu.OddSizes:LayerW4Gpu.ExpertParallelRangeDropsOffRankRows\
:LayerW4Gpu.InterleavedGateUpMatchesBitForBit:LayerW4Gpu.BlockScaleCodesOverTheirRange\
:LayerW4Gpu.EveryTileForm\
:Gemm2GateGpu.ExpertParallelRangeAndFewTilesSplittingK:Gemm2GateGpu.PrecomputedRoutingThroughTheGate\
:Gemm2GateGpu.CombinePathLeavesTheExpertRowsPoisoned:Gemm2GateGpu.OneGraphTakesBothPathsAsTheRoutingChanges\
:Gemm2GateGpu.CallWithNoRowOnThisRankWritesZeros:Gemm2GateGpu.GatedTailGivesEachForcedPathsBits\
:EPLayerGpu.DispatchSlotsMatchTheReference:EPLayerGpu.EmptyCallsWriteNothing\
:EPLayerGpu.CapturedOnceReplaysWithFreshRouting\
:NextPrefetchGpu.SmallShapeEveryVariant:NextPrefetchGpu.ExpertParallelRange\
:DecodeFoldsGpu.ExpertParallelRangeAndACallWithNoLocalRow\
:DecodeFoldsGpu.RepeatedExpertAtOneTokenAgainstTheReference\
:SharedScratchGpu.LayersOfAModelMatchLayersWithBuffersOfTheirOwn\
:EPLayerGpu.LayersOfAModelShareOneScratchARank"
readonly kRacecheckFilter="PermuteGpu.GraphReplayOfRoutingAndPermute\
:FusedRoutingGpu.ClusterWaysAtTheirBound:FusedRoutingGpu.ClusterOfTwoGraphReplayWithNewLogits\
:GroupedGemm.OddSizesEveryActivation:GroupedGemm.StreamOneTokenTilesAtEveryKSplit\
:Shapes/Sm90GroupedGemmTest.*/2\
:LayerGpu.PrecomputedRouting:LayerGpu.ExpertParallelRangeDropsOffRankRows\
:Fp8QuantGpu.RowsSpecialValues:Fp8QuantGpu.TensorSpecialValues:Fp8WeightsGpu.SpecialValues\
:Shapes/Sm90Fp8GroupedGemmTest.*/4:Fp8StreamGemm.GraphReplaysForTwoSchedules:Fp8RowsGpu.*\
:Fp8WgmmaGemm.GraphReplaysForTwoSchedules:GroupedGemm.GraphReplayFollowsTheRouting\
:LayerFp8Gpu.ExpertParallelRangeDropsOffRankRows\
:LayerW4Gpu.ExpertParallelRangeDropsOffRankRows:LayerW4Gpu.BlockScaleCodesOverTheirRange\
:LayerW4Gpu.EveryTileForm\
:Gemm2GateGpu.ExpertParallelRangeAndFewTilesSplittingK:Gemm2GateGpu.PrecomputedRoutingThroughTheGate\
:EPLayerGpu.DispatchSlotsMatchTheReference:EPLayerGpu.EmptyCallsWriteNothing\
:DecodeFoldsGpu.ExpertParallelRangeAndACallWithNoLocalRow"
# initcheck, which tracks every byte of device memory, runs the racecheck
# filter and the CUTLASS workspace's and the gather's tests (the whole
# filter took over 140 s on an H100, mostly in the layer tests at H=2048).
readonly kInitcheckFilter="$kRacecheckFilter\
:Sm90GroupedGemm.GraphReplayServesNewOffsets:ExpertRows.*:Activations/GatedActivationTest.*/0\
:FusedRoutingGpu.SpreadKernelOverClusterSizes"
readonly kAllTools="memcheck racecheck synccheck initcheck"

usage() { sed -n '10,16p' "$0" | sed 's/^# \{0,1\}//'; }
refuse() { echo "sanitize: $1" >&2; exit 2; }

tools=$kAllTools
filter=""
timeout_s=1800
dry_run=0
while [ $# -gt 0 ]; do
  case $1 in
    --tools) [ $# -ge 2 ] || refuse "--tools needs a list"; tools=${2//,/ }; shift 2 ;;
    --filter) [ $# -ge 2 ] || refuse "--filter needs a pattern"; filter=$2; shift 2 ;;
    --timeout) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || refuse "--timeout needs a number of seconds"
      timeout_s=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; refuse "unknown argument '$1'" ;;
  esac
done
[ -n "${tools// /}" ] || refuse "--tools is empty; allowed: ${kAllTools// /,}"
for t in $tools; do
  [[ " $kAllTools " == *" $t "* ]] || refuse "unknown tool '$t'; allowed: ${kAllTools// /,}"
done

out=${OUT:-out/sanitize}
bin=${UNIMOE_BUILD_DIR:-build}/unimoe_gpu_tests
cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}

tool_args() {  # the options of tool $1
  case $1 in
    memcheck) echo "--tool memcheck --leak-check full" ;;
    racecheck) echo "--tool racecheck --print-limit 1000" ;;
    *) echo "--tool $1" ;;
  esac
}
tool_filter() {  # the gtest filter of tool $1
  if [ -n "$filter" ]; then echo "$filter"
  elif [ "$1" = racecheck ]; then echo "$kRacecheckFilter"
  elif [ "$1" = initcheck ]; then echo "$kInitcheckFilter"
  else echo "$kFullFilter"; fi
}

if [ $dry_run = 1 ]; then
  for t in $tools; do
    echo "$cs $(tool_args "$t") $bin --gtest_filter='$(tool_filter "$t")' >$out/$t.log 2>&1"
  done
  exit 0
fi

[ -x "$bin" ] || refuse "no test binary $bin; build it (cmake --build build --target unimoe_gpu_tests) or set UNIMOE_BUILD_DIR"
[ -x "$cs" ] || refuse "compute-sanitizer not found (not on PATH, not $cs); it comes with the CUDA toolkit"
reason=$("$bin" --gtest_filter='GpuSmoke.*' 2>&1 | grep -m1 -o "GPU test skipped: .*")
[ -z "$reason" ] || refuse "no usable GPU here (${reason#GPU test skipped: }); the tests would only skip"
mkdir -p "$out"

# "N" from the last "SUMMARY_NAME: N ..." of a log, or nothing.
last_count() { grep -oE "$2: [0-9]+" "$1" | tail -n 1 | grep -oE '[0-9]+$'; }

status=0
for t in $tools; do
  log=$out/$t.log
  start=$SECONDS
  # shellcheck disable=SC2046  # tool_args is a word list
  timeout "$timeout_s" "$cs" $(tool_args "$t") "$bin" --gtest_filter="$(tool_filter "$t")" >"$log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  errors=$(last_count "$log" "ERROR SUMMARY")
  if [ $t = racecheck ]; then
    line=$(grep -oE 'RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)' "$log" | tail -n 1)
    count=$(echo "$line" | grep -oE '[0-9]+ hazards?' | grep -oE '[0-9]+')
    summary="$count hazards (${line#*(}"
  else
    count=$errors
    summary="$count errors"
  fi
  bad=""
  [ -n "$count" ] || { bad="no summary in the log"; summary="no summary"; }
  [ "${count:-0}" = 0 ] && [ "${errors:-0}" = 0 ] || bad="findings"
  if [ $t = memcheck ]; then
    leaked=$(grep -oE 'LEAK SUMMARY: [0-9]+ bytes' "$log" | tail -n 1 | grep -oE '[0-9]+')
    [ -n "$leaked" ] && summary="$summary, $leaked bytes leaked"
    [ "${leaked:-0}" = 0 ] || bad="findings"
  fi
  passed=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+$')
  skipped=$(grep -c '^\[  SKIPPED \] .*(' "$log")
  if [ $rc = 124 ]; then bad="timed out after $timeout_s s"
  elif [ $rc != 0 ]; then bad="${bad:+$bad; }tests failed (exit $rc)"
  elif [ "${passed:-0}" = 0 ]; then bad="${bad:+$bad; }no test passed"
  elif [ "$skipped" != 0 ]; then bad="${bad:+$bad; }$skipped tests skipped"
  fi
  if [ -n "$bad" ]; then
    echo "$t: $summary, ${passed:-0} tests passed, ${took} s: FAILED: $bad (see $log)"
    status=1
  else
    echo "$t: $summary, $passed tests passed, ${took} s"
  fi
done
exit $status
