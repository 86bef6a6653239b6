// The arguments every grouped-GEMM kernel of the mma path takes (the tiled
// kernel of grouped_gemm.cu, the stream kernel of stream_gemm.cu): one
// description of GEMM1 (gathered x rows, gated or pointwise epilogue) and
// GEMM2 (contiguous rows) over the device tile schedule.
#pragma once

#include <cstdint>

#include "kernels/epilogue/grouped_gemm_epilogue.cuh"
#include "kernels/permute/permute.cuh"

namespace unimoe {

// One grouped GEMM over the tile schedule, for tile t and column block nb:
//   out[row_start + i, n] =
//       epilogue(sum_k A[i, k] * B[expert, b_row(n), k] + bias[expert, b_row(n)])
// for i < rows and n < n_out. Gated epilogues read two B rows per output
// column n: the gate row n and the up row up_offset + n.
struct GroupedGemmArgs {
  const uint16_t* a = nullptr;      // GEMM1: x [T, k]; GEMM2: act [P, k]
  const int32_t* gather = nullptr;  // GEMM1: permuted row r reads A row gather[r] / top_k;
                                    // GEMM2: nullptr, row r reads A row r
  int top_k = 1;
  const uint16_t* b = nullptr;      // [E_local, b_rows, k]
  const float* bias = nullptr;      // [E_local, b_rows] or nullptr
  int b_rows = 0;                   // B rows per expert
  const DeviceTile* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  int n_blocks = 0;                 // column blocks per tile
  int k = 0;                        // reduction length, a multiple of 8
  int n_out = 0;                    // output columns, a multiple of 8
  int up_offset = 0;                // gated only
  GemmEpilogue epilogue = GemmEpilogue::Identity;
  float alpha = 0.0f;               // SwiGLUOai
  float limit = 0.0f;               // SwiGLUOai
  uint16_t* out = nullptr;          // [P, n_out] bf16
  // Stream kernel only (Gemm1Params / Gemm2Params say when they hold).
  bool early_dependents = false;      // trigger the next launch after the loads
  bool prefetch_before_wait = false;  // read the schedule, load weights, then wait
};

}  // namespace unimoe
