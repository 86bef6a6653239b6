// The FP8Block128 grouped GEMM of the mma path (sm_90a, prefill): e4m3
// operands multiplied with wgmma over 128-row tiles, the numerics of the
// FP8 stream kernel (stream_gemm_fp8.cuh): each 128-wide K block summed in
// fp32 by the tensor cores, then scaled by a_scale(row, kb) *
// b_scale(e, brow / 128, kb) and added in fp32 ("promotion").
#pragma once

#include "kernels/common/common.cuh"
#include "kernels/gemm/stream_gemm_fp8.cuh"

namespace unimoe {

// The rows form of the contract in stream_gemm_fp8.cuh, over a schedule of
// kFp8WgmmaTileM-row tiles (p.tiles), with these differences: a gated
// n_out and up_offset must be multiples of 64 and 128 (a CTA's 64 output
// columns then lie in one 128-row scale block of gate rows and one of up
// rows), a plain n_out a multiple of 16; prefetch_before_wait and
// early_dependents are ignored (the kernel waits for its predecessor before
// reading anything and lets its dependents launch when it ends). Throws
// std::invalid_argument naming the field for bad parameters; max_tiles = 0
// launches nothing.
inline constexpr int kFp8WgmmaTileM = 128;
void launch_fp8_wgmma_gemm(const Fp8StreamGemmParams& p, KernelStream stream);

}  // namespace unimoe
