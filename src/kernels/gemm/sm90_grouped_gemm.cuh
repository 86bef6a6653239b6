// Hopper grouped GEMM for the experts stages at large token counts, built on
// CUTLASS 3.x's ptr-array grouped kernel (TMA loads, wgmma, warp-specialized
// persistent CTAs). Group g is expert g:
//   D[offsets[g] + m, n] = sum_k A[offsets[g] + m, k] * B[g][n, k]
// for m < offsets[g+1] - offsets[g]: both operands K-major ("TN"), fp32
// accumulation, bf16 output rounded to nearest even.
//
// The per-expert row counts live on the device only. A one-block setup kernel
// turns expert_offsets into the problem shapes, pointers and strides that the
// CUTLASS kernel reads, so the launch needs no host sync and captures in a
// CUDA graph: replaying it serves any routing with at most the captured
// number of rows. This header needs no CUTLASS header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/tactics.h"
#include "kernels/common/common.cuh"

namespace unimoe {

// The compiled configurations, their names and parsing: Sm90GemmTactic in
// plan/tactics.h. All compiled tactics, in enum order (kSm90GemmTactics).
const Sm90GemmTactic* sm90_gemm_tactics(int* count);

struct Sm90GroupedGemmParams {
  const uint16_t* a = nullptr;               // [rows, k] bf16 row-major: permuted rows
  const int32_t* expert_offsets = nullptr;   // [num_groups + 1] device, exclusive scan
  const uint16_t* b = nullptr;               // [num_groups, n, k] bf16 row-major
  uint16_t* d = nullptr;                     // [rows, n] bf16; rows >= offsets[G] untouched
  int num_groups = 0;                        // G (E_local)
  int n = 0;                                 // output columns, a multiple of 8
  int k = 0;                                 // reduction depth, a multiple of 8
  void* workspace = nullptr;                 // sm90_grouped_gemm_workspace_bytes(G, sm_count),
                                             // 256-byte aligned (as cudaMalloc returns),
                                             // zeroed once before its first use (below)
  int sm_count = 0;                          // SMs of the device (persistent grid size)
  Sm90GemmTactic tactic = Sm90GemmTactic::Cooperative128x128;
};
// The workspace is zeroed once (at allocation), not per call: the kernels
// build their TMA descriptors in it, and CUTLASS's descriptor fence reads
// each whole 128-byte descriptor, padding the kernels never write included
// (compute-sanitizer's initcheck reports those reads on memory never set).

// Device workspace for any tactic with this many groups and SMs: per-group
// problem shapes, pointers and strides, and CUTLASS's per-SM TMA descriptors.
std::size_t sm90_grouped_gemm_workspace_bytes(int num_groups, int sm_count);

// Setup kernel + grouped GEMM on `stream`. No allocation, no sync, no
// device-to-host copy. Throws std::invalid_argument on bad parameters and
// std::runtime_error when CUDA or CUTLASS refuses the launch.
void launch_sm90_grouped_gemm(const Sm90GroupedGemmParams& p, KernelStream stream);

}  // namespace unimoe
