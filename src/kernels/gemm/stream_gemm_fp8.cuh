// The FP8Block128 stream (swap-AB) grouped GEMM for decode: e4m3 weights
// with an fp32 scale per 128 x 128 block, e4m3 activations with an fp32
// scale per row and 128 columns, the weights streamed from HBM straight
// into registers as in the BF16 stream kernel (stream_gemm.cuh). Serves the
// schedules of kStreamTileM (16) row tiles.
#pragma once

#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/epilogue/grouped_gemm_epilogue.cuh"
#include "kernels/gemm/grouped_gemm.cuh"
#include "kernels/permute/permute.cuh"
#include "kernels/quant/fp8_encode.cuh"

namespace unimoe {

struct Fp8StreamGemmParams {
  const uint8_t* a = nullptr;        // e4m3 A rows [rows_a, k], row-major, 16-byte aligned rows
  // Scale of (A row r, K block kb) = a_scales[kb * a_scales_ld + r] (MN-major).
  const float* a_scales = nullptr;
  int a_scales_ld = 0;               // >= rows_a
  // GEMM1: permuted row p reads A row gather[p] / top_k (A = the token rows);
  // GEMM2: nullptr, row p reads A row p.
  const int32_t* gather = nullptr;
  int top_k = 1;
  const uint8_t* b = nullptr;        // [E_local, b_rows, k] e4m3 row-major
  const float* b_scales = nullptr;   // [E_local, ceil(b_rows/128), k/128] row-major
  const float* bias = nullptr;       // [E_local, b_rows] fp32 or nullptr
  int b_rows = 0;                    // B rows per expert: gemm1_cols (2I gated, I for ReLU2) or H
  int k = 0;                         // a positive multiple of 128
  // Output columns, a multiple of 16: I for gated GEMM1 (gate rows [0, I),
  // up rows [up_offset, up_offset + I)), else b_rows.
  int n_out = 0;
  int up_offset = 0;                 // gated only (= I)
  GemmEpilogue epilogue = GemmEpilogue::Identity;  // kernels/epilogue/grouped_gemm_epilogue.cuh
  float alpha = 0.0f, limit = 0.0f;  // SwiGLUOai
  // The permute's tile schedule for tile_m = 16 (kStreamTileM):
  // tile -> (expert, row_start, rows <= 16).
  const DeviceTile* tiles = nullptr;
  const int32_t* num_tiles = nullptr;  // device count; CTAs of tiles >= *num_tiles exit at once
  int max_tiles = 0;                   // capacity (sizes the grid)
  // Exactly one of out_f32 / out_bf16: [P, n_out] permuted rows (GEMM1 writes
  // fp32 activated values for a later quantize kernel; GEMM2 writes bf16 y).
  float* out_f32 = nullptr;
  uint16_t* out_bf16 = nullptr;
  // As the BF16 stream kernel: pdl_launch_dependents() once the loads are done.
  bool early_dependents = false;
  // As the BF16 stream kernel: read the schedule and issue the first weight
  // loads (and stage the weight scales) before pdl_begin().
  bool prefetch_before_wait = false;
  // GEMM1 at decode: GEMM2's weights of each tile's expert, fetched into L2
  // (common.cuh); each of a tile's CTAs asks for its share.
  NextWeightsPrefetch next;
  // Whether the launch may give a CTA two column blocks of one-token work
  // where that fits the grid in one wave (fp8_stream_config's rule).
  bool wide_ctas = true;
  // Unquantized A instead of a and a_scales (decode: x at T = 1, GEMM1's
  // fp32 activation): the kernel quantizes each A row it reads into shared
  // memory, with the codes and scales the quantize kernels of fp8_quant.cuh
  // would have written (kernels/quant/fp8_encode.cuh), and serves every
  // tile by the one-token path, a row at a time (a tile of several rows
  // then reads its weights once a row, the later times mostly from L2: for
  // calls of one-row tiles). At most one of a_bf16 and a_f32; with either,
  // a and a_scales are not read. a_row_scale says how the scales are made:
  // kGroups per row and 128 columns (FP8Block128), kGiven *a_given_scale
  // for every value (FP8PerTensor, static), kRow one over the row
  // (FP8PerTensor, dynamic, only where A is a single row).
  const uint16_t* a_bf16 = nullptr;  // [rows_a, k] bf16, 16-byte aligned rows
  const float* a_f32 = nullptr;      // [rows_a, k] fp32, 16-byte aligned rows
  fp8_encode::RowScale a_row_scale = fp8_encode::RowScale::kGroups;
  const float* a_given_scale = nullptr;  // device float, with kGiven
  // With kMaxima: the number of maxima at a_given_scale (the previous
  // GEMM's out_maxima, as many as its grid has CTAs).
  int a_maxima = 0;
  // Optional, with kRow or kMaxima: the scale written here too (by one
  // CTA), where the quantize kernel would have left it
  // (Fp8TensorQuantParams::scale).
  float* a_scale_out = nullptr;
  // Optional, with a_bf16 or a_f32 (GEMM1 at one token, for FP8PerTensor's
  // dynamic activation scale): CTA b of the grid writes the largest |value|
  // it stored to out_maxima[b] (fmaxf, NaN skipped; 0 for a CTA with no
  // tile), fp8_stream_grid_ctas(params) floats in all, so that GEMM2 makes
  // the tensor's scale from them (kMaxima) without a pass over the output.
  float* out_maxima = nullptr;
  // GEMM2 at decode (out_bf16 = y): the finalize folded into the CTAs that
  // complete each column block (grouped_gemm.cuh); counters null: not.
  // Column block b of a tile is its CTA b: cols_per_cta x parts columns
  // (stream_gemm_fp8_config.h), at most ceil(n_out / 16) blocks.
  FinalizeFold fold;
};

// For tile t of the schedule (t < *num_tiles), row i < rows and column n < n_out:
//   out[row_start + i, n] = epilogue(bias[e][brow] + sum_kb a_scale(row_i, kb)
//       * b_scale(e, brow / 128, kb) * sum_{k in kb} A[row_i, k] * B[e][brow, k])
// with brow = n (and up_offset + n for the up value of gated epilogues);
// bias is added after scaling, before the activation. Rows no tile covers
// are not written. Throws std::invalid_argument naming the field for bad
// parameters; max_tiles = 0 launches nothing.
void launch_fp8_stream_gemm(const Fp8StreamGemmParams& p, KernelStream stream);

// The CTAs of the launch `p` would make (max_tiles x column blocks; the
// size of out_maxima).
int fp8_stream_grid_ctas(const Fp8StreamGemmParams& p);

}  // namespace unimoe
