// What the CPU reference's check of a device output allows for the path
// that made it (the fuzzer, tests/gpu/layer_rig.h).
#pragma once

#include "plan/layer_plan.h"
#include "ref/ref.h"

namespace unimoe::bench {

// The precision of GEMM1's sums on the plan's path, as a fraction of the
// sum of their terms' magnitudes, for ref::moe_forward's flip allowance:
// the FP8 wgmma paths (cutlass, mma) sum in the FP8 tensor-core
// accumulator (ref::kFp8WgmmaSumPrecision); the stream path and every other
// variant sum in fp32, which the allowance's 1e-4 margin covers (0).
inline double gemm1_sum_precision(const LayerPlan& plan) {
  const bool wgmma = plan.path == ExpertsPath::Cutlass || plan.path == ExpertsPath::Mma;
  return plan.fp8 && wgmma ? ref::kFp8WgmmaSumPrecision : 0.0;
}

}  // namespace unimoe::bench
