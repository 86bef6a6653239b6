// Hopper FP8 grouped GEMM with DeepSeek-style block scaling (FP8Block128)
// for the experts stages at large token counts, built on CUTLASS's ptr-array
// grouped kernel with blockwise-scaled accumulation (TMA loads, wgmma,
// warp-specialized persistent CTAs). Group g is expert g; for a row
// r = offsets[g] + m with m < offsets[g+1] - offsets[g]:
//   D[r, c] = sum_kb a_scale(r, kb) * b_scale(g, c / 128, kb)
//                    * sum_{k in K block kb} A[r, k] * B[g][c, k]
// e4m3 operands, both K-major ("TN"); each 128-deep K block's tensor-core sum
// is multiplied by its two scales and added to an fp32 accumulator; bf16
// output rounded to nearest even. One A scale per row and K block (the
// activations' 1 x 128 groups), one B scale per 128 x 128 weight block.
//
// The per-expert row counts live on the device only. A one-block setup kernel
// turns expert_offsets into the problem shapes, pointers, strides and scale
// layouts that the CUTLASS kernel reads, so the launch needs no host sync and
// captures in a CUDA graph: replaying it serves any routing with at most the
// captured number of rows. This header needs no CUTLASS header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/tactics.h"
#include "kernels/common/common.cuh"

namespace unimoe {

// The tactics (Sm90Fp8GemmTactic, kSm90Fp8GemmTactics, to_string) are host
// data in core/tactics.h, which the plan chooses from.


struct Sm90Fp8GroupedGemmParams {
  const uint8_t* a = nullptr;               // [rows, k] e4m3 row-major: permuted rows, group g's
                                            // rows are [offsets[g], offsets[g+1])
  const float* a_scales = nullptr;          // MN-major: scale of (row r, K block kb) is
                                            // a_scales[kb * a_scales_ld + r]
  int a_scales_ld = 0;                      // >= offsets[G] (not checked: the count is on the
                                            // device), a positive multiple of 4
  const int32_t* expert_offsets = nullptr;  // [G + 1] device, exclusive scan
  const uint8_t* b = nullptr;               // [G, n, k] e4m3 row-major (K-major)
  const float* b_scales = nullptr;          // [G, ceil(n/128), k/128] row-major: scale of
                                            // (N block nb, K block kb) of group g
  uint16_t* d = nullptr;                    // [rows, n] bf16; rows >= offsets[G] untouched
  float* d_f32 = nullptr;                   // or [rows, n] fp32, unrounded (exactly one of d and
                                            // d_f32): GEMM1's output, which the FP8 path
                                            // quantizes after the activation
  int num_groups = 0;                       // G (E_local)
  int n = 0;                                // output columns, a positive multiple of 16 (the
                                            // last 128-column block may be ragged)
  int k = 0;                                // reduction depth, a positive multiple of 128
  void* workspace = nullptr;                // sm90_fp8_grouped_gemm_workspace_bytes(G, sm_count),
                                            // 256-byte aligned (as cudaMalloc returns),
                                            // zeroed once before its first use (below)
  int sm_count = 0;                         // SMs of the device (persistent grid size)
  Sm90Fp8GemmTactic tactic = Sm90Fp8GemmTactic::Cooperative128x128;
};
// The workspace is zeroed once (at allocation), not per call, for the reason
// sm90_grouped_gemm.cuh gives: the kernels build their TMA descriptors in it
// and the descriptor fence reads each whole 128-byte descriptor.

// Device workspace for any tactic with this many groups and SMs: per-group
// problem shapes, pointers, strides and scale layouts, and CUTLASS's per-SM
// TMA descriptors.
std::size_t sm90_fp8_grouped_gemm_workspace_bytes(int num_groups, int sm_count);

// Setup kernel + grouped GEMM on `stream`. No allocation, no sync, no
// device-to-host copy. Throws std::invalid_argument on bad parameters and
// std::runtime_error when CUDA or CUTLASS refuses the launch.
void launch_sm90_fp8_grouped_gemm(const Sm90Fp8GroupedGemmParams& p, KernelStream stream);

}  // namespace unimoe
