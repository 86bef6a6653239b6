// The W4A16 grouped GEMM's wgmma form (sm_90a, prefill): the contract of
// stream_gemm_w4.cuh over schedules of w4_wgmma_tile_m (128) row tiles.
// launch_w4_stream_gemm validates the parameters and calls it for that M
// tile.
#pragma once

#include "kernels/common/common.cuh"
#include "kernels/gemm/stream_gemm_w4.cuh"

namespace unimoe {

// `scale_stride` is p.scale_stride resolved (k / block where p's is 0).
void launch_w4_wgmma_gemm(const W4StreamGemmParams& p, int scale_stride, KernelStream stream);

}  // namespace unimoe
