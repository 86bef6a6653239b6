// The W4A16 stream (swap-AB) grouped GEMM: MXFP4 or NVFP4 weights in the
// prepared nibble order (core/fp4_layout.h) streamed from HBM into
// registers, dequantized there to bf16 with their block scale applied, and
// multiplied with bf16 activations on mma.sync m16n8k16 (fp32
// accumulation). Serves the schedules of kStreamTileM (16) row tiles.
#pragma once

#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/epilogue/grouped_gemm_epilogue.cuh"
#include "kernels/gemm/grouped_gemm.cuh"
#include "kernels/gemm/stream_gemm.cuh"
#include "kernels/permute/permute.cuh"

namespace unimoe {

enum class W4Format : int { MXFP4, NVFP4 };

// Values of one block scale along K.
constexpr int w4_block_values(W4Format f) { return f == W4Format::MXFP4 ? 32 : 16; }

struct W4StreamGemmParams {
  W4Format format = W4Format::MXFP4;
  const uint16_t* a = nullptr;       // bf16 A rows [rows_a, k], 16-byte aligned rows
  // GEMM1: permuted row p reads A row gather[p] / top_k (A = the token
  // rows); GEMM2: nullptr, row p reads A row p.
  const int32_t* gather = nullptr;
  int top_k = 1;
  const uint8_t* b = nullptr;        // [E_local, b_rows, k / 2] prepared e2m1
  // [E_local, b_rows, scale_stride] bytes, the first k / block of each row
  // used: e8m0 (MXFP4) or e4m3 (NVFP4).
  const uint8_t* b_scales = nullptr;
  // Scale bytes from one B row to the next: 0 means k / block. The rows
  // form (tile_m 64) copies a row's scales 4 bytes at a time and needs a
  // stride that is a multiple of w4_scale_stride_multiple.
  int scale_stride = 0;
  const float* b_global = nullptr;   // NVFP4: [E_local] matrix scales; MXFP4: nullptr
  const float* bias = nullptr;       // [E_local, b_rows] fp32 or nullptr
  int b_rows = 0;                    // B rows per expert: gemm1_cols or H
  int k = 0;                         // a positive multiple of 32
  // Output columns, a multiple of 8: I for gated GEMM1 (gate rows [0, I),
  // up rows [up_offset, up_offset + I)), else b_rows.
  int n_out = 0;
  int up_offset = 0;                 // gated only (= I)
  GemmEpilogue epilogue = GemmEpilogue::Identity;
  float alpha = 0.0f, limit = 0.0f;  // SwiGLUOai
  // The permute's tile schedule and its M tile: kStreamTileM (16; each
  // warp streams its weights against at most 2 token fragments read from
  // L1), w4_rows_tile_m (64; the CTA stages the tile's token rows in
  // shared memory, each warp takes all of K; for 16 and more rows an
  // expert) or w4_wgmma_tile_m (128; the wgmma form).
  int tile_m = kStreamTileM;
  const DeviceTile* tiles = nullptr;
  const int32_t* num_tiles = nullptr;  // CTAs of tiles >= *num_tiles exit at once
  int max_tiles = 0;                   // capacity (sizes the grid)
  uint16_t* out = nullptr;             // [P, n_out] bf16, permuted rows
  // Read the schedule and issue the first weight loads before pdl_begin()
  // (only where the schedule is older than the previous kernel: GEMM2).
  bool prefetch_before_wait = false;
  bool early_dependents = false;       // pdl_launch_dependents() once the loads are done
  // The 16-row form refills each register slot of its weight ring as soon
  // as the slot's math is done (false: loads a round of steps, then does
  // their math).
  bool pipelined = false;
  // GEMM2 at decode (out = y), the 16-row form only: the finalize folded
  // into the CTAs that complete each column block (grouped_gemm.cuh);
  // counters null: not. Column block b of a tile is its CTA b, cols_per_cta
  // = (8 / splits) x 16 columns (16 gated), at most ceil(n_out / 16) blocks.
  FinalizeFold fold;
};

// For tile t (t < *num_tiles), row i < rows and column n < n_out:
//   out[row_start + i, n] = epilogue(bias[e][brow] + g_e * sum_k A[row_i, k] * W[e][brow, k])
// with W the dequantized weight (e2m1 times its block scale) and g_e the
// NVFP4 matrix scale (1 for MXFP4); brow = n, and up_offset + n for the up
// value of gated epilogues. Rows no tile covers are not written. Throws
// std::invalid_argument naming the field for bad parameters; max_tiles = 0
// launches nothing.
void launch_w4_stream_gemm(const W4StreamGemmParams& p, KernelStream stream);

// The K splits (warps along K) the launcher uses: the largest of 1, 2, 4, 8
// that leaves each warp at least 512 values of K.
int w4_stream_splits(int k);

// The multiple the rows form needs of scale_stride (bytes).
constexpr int w4_scale_stride_multiple = 8;
// The rows form's M tile.
constexpr int w4_rows_tile_m = 64;
// The wgmma form's M tile (sm90_w4_wgmma_gemm.cu: 128-row tiles on two warp
// groups, weights dequantized into shared memory, for prefill).
constexpr int w4_wgmma_tile_m = 128;

}  // namespace unimoe
