// The wgmma tactics of the mma path (sm_90a): 128-row tiles multiplied by
// two warp groups with wgmma from swizzled shared memory, fed by the same
// gathered cp.async copies and finished by the same epilogue as the mma.sync
// kernel (tile_operands.cuh). Called by grouped_gemm.cu's launcher, which has
// checked the arguments.
#pragma once

#include "core/tactics.h"
#include "kernels/common/common.cuh"
#include "kernels/gemm/grouped_gemm_args.cuh"

namespace unimoe {

// Launches one grouped GEMM of `tactic` (tactic.wgmma) over max_tiles x
// column blocks CTAs; args.n_blocks is set by the caller.
void launch_wgmma_gemm(const GroupedGemmArgs& args, const GemmTactic& tactic, int max_tiles,
                       KernelStream stream);

}  // namespace unimoe
