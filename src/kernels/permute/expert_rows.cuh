// Row kernels around a grouped GEMM that has neither gather-on-load nor an
// activation epilogue (the sm90 CUTLASS path): gather (or scatter) the token
// rows into permuted order before GEMM1, and apply the activation between
// GEMM1 and GEMM2. The gather and the activation read the number of rows,
// expert_offsets[num_groups], on the device, the scatter each row's
// destination; their grids are sized from the capacity (T * top_k) or T
// alone, so they capture once in a CUDA graph. Rows at or beyond that count
// are untouched.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/common.cuh"
#include "unimoe/unimoe.h"

namespace unimoe {

struct GatherRowsParams {
  const uint16_t* x = nullptr;                     // [T, H] bf16
  const int32_t* permuted_to_expanded = nullptr;   // [capacity]: row r is expanded row p2e[r]
  const int32_t* expert_offsets = nullptr;         // [num_groups + 1] device
  int num_groups = 0;                              // E_local
  int top_k = 0;                                   // K: token of expanded row i is i / K
  int hidden = 0;                                  // H, a multiple of 8
  int capacity = 0;                                // T * K: rows the grid covers
  uint16_t* out = nullptr;                         // [capacity, H] bf16
};

// out[r, :] = x[permuted_to_expanded[r] / top_k, :] for r < expert_offsets[num_groups].
void launch_gather_rows(const GatherRowsParams& p, KernelStream stream);

// The gather's result written the other way round: each token row is read
// once and written to every permuted row of its K expanded rows, where the
// gather reads it once for each of them (K reads of a row, mostly from HBM
// when x exceeds L2). Copies, so the same bits.
struct ScatterRowsParams {
  const uint16_t* x = nullptr;                     // [T, H] bf16
  const int32_t* expanded_to_permuted = nullptr;   // [T * K] device: permuted row, -1 off this rank
  int num_tokens = 0;                              // T (0: nothing launched)
  int top_k = 0;                                   // K
  int hidden = 0;                                  // H, a multiple of 8
  uint16_t* out = nullptr;                         // [T * K, H] bf16
};

// out[expanded_to_permuted[t * K + k], :] = x[t, :] for every t < T, k < K
// whose permuted row is not negative; no other row is written. One warp a
// token row. The permute makes expanded_to_permuted a bijection from the
// on-rank expanded rows onto [0, expert_offsets[E_local]), so the rows
// written are the gather's, with its values.
void launch_scatter_rows(const ScatterRowsParams& p, KernelStream stream);

struct GatedActivationParams {
  // [capacity, cols] bf16, GEMM1's output: cols = 2I (gate columns [0, I),
  // then up columns [I, 2I)) for gated activations, cols = I for ReLU2.
  const uint16_t* h = nullptr;
  const float* h_f32 = nullptr;             // or [capacity, cols] fp32 (exactly one of h and h_f32)
  const float* b13 = nullptr;               // [num_groups, cols] fp32, or nullptr
  const int32_t* expert_offsets = nullptr;  // [num_groups + 1] device: row r is expert e's
                                            // when offsets[e] <= r < offsets[e + 1]
  int num_groups = 0;
  int capacity = 0;                         // T * K: rows the grid covers
  int intermediate = 0;                     // I, a multiple of 8
  Activation activation = Activation::SwiGLU;
  float swiglu_alpha = 1.702f;              // SwiGLUOai only
  float swiglu_limit = 7.0f;                // SwiGLUOai only
  uint16_t* out = nullptr;                  // [capacity, I] bf16
  float* out_f32 = nullptr;                 // or [capacity, I] fp32, unrounded (exactly one of
                                            // out and out_f32): the FP8 paths quantize it next
  // Optional, with out_f32: gated_activation_blocks(capacity) floats, each
  // CTA's largest magnitude over the activated values it writes (fmaxf:
  // NaN skipped; 0 for a CTA of no live row), every slot written: the
  // partial maxima of FP8PerTensor's dynamic scale
  // (launch_fp8_scale_from_partials), without reading the activation back.
  float* amax_partials = nullptr;
};

// CTAs of launch_gated_activation's grid for `capacity` rows (the number
// of its amax partials).
int gated_activation_blocks(int capacity);

// out[r, j] = act(h[r, j] + b13[e, j], h[r, I + j] + b13[e, I + j]) for gated
// activations, relu(h[r, j] + b13[e, j])^2 for ReLU2; fp32 math, bf16 rounded
// to nearest even; r < expert_offsets[num_groups].
void launch_gated_activation(const GatedActivationParams& p, KernelStream stream);

// The same activation of an fp32 h, quantized in the same kernel as
// launch_quantize_fp8_rows quantizes the fp32 activation (fp8_quant.cuh):
// per row and 128 columns, scale = amax / 448 (1 where that is not > 0),
// code = e4m3(value / scale). So the codes and scales are those of
// launch_gated_activation with out_f32 followed by that quantization, bit
// for bit, without the fp32 activation's write and read (FP8Block128's
// cutlass path).
struct GatedActivationFp8Params {
  const float* h_f32 = nullptr;             // [capacity, cols] fp32, as GatedActivationParams
  const float* b13 = nullptr;               // [num_groups, cols] fp32, or nullptr
  const int32_t* expert_offsets = nullptr;  // [num_groups + 1] device
  int num_groups = 0;
  int capacity = 0;                         // T * K: rows the grid covers
  int intermediate = 0;                     // I, a multiple of 128
  Activation activation = Activation::SwiGLU;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  uint8_t* out_codes = nullptr;             // [capacity, I] e4m3
  float* out_scales = nullptr;              // scale of (row r, group g) at out_scales[g * out_scales_ld + r]
  int out_scales_ld = 0;                    // >= capacity
  // nullptr: each (row, 128 columns) takes amax / 448 (FP8Block128).
  // Otherwise one device float used for every group, as given (FP8PerTensor's
  // static activation scale): the codes and the broadcast scales of
  // launch_quantize_fp8_tensor with that static scale.
  const float* static_scale = nullptr;
};

void launch_gated_activation_fp8(const GatedActivationFp8Params& p, KernelStream stream);

// The FP8 paths' gather: e4m3 token rows and their scales into permuted order.
struct GatherFp8RowsParams {
  const uint8_t* codes = nullptr;                  // [T, H] e4m3 (the quantized x)
  const float* scales = nullptr;                   // scale of (token t, group g) at scales[g * scales_ld + t]
  int scales_ld = 0;
  const int32_t* permuted_to_expanded = nullptr;   // [capacity]
  const int32_t* expert_offsets = nullptr;         // [num_groups + 1] device
  int num_groups = 0;
  int top_k = 0;
  int hidden = 0;                                  // H, a multiple of 128 (one scale per 128 columns)
  int capacity = 0;                                // T * K: rows the grid covers
  uint8_t* out_codes = nullptr;                    // [capacity, H]
  float* out_scales = nullptr;                     // scale of (row r, group g) at out_scales[g * out_scales_ld + r]
  int out_scales_ld = 0;                           // >= capacity
};

// out_codes[r, :] = codes[p2e[r] / top_k, :] and its H / 128 scales likewise,
// for r < expert_offsets[num_groups].
void launch_gather_fp8_rows(const GatherFp8RowsParams& p, KernelStream stream);

}  // namespace unimoe
