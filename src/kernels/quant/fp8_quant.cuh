// Activation quantization bf16 (or fp32) -> e4m3 on the device, bit for bit the rule
// of the CPU reference (docs/quantization.md, "Activation rounding"): amax
// skips NaN, scale = amax / 448 in fp32 (1 when that is not > 0), code =
// e4m3(x / scale) with one IEEE fp32 division, RNE, saturating to +-448,
// NaN -> 0x7f. Two forms:
//   - per row and 128 columns (FP8Block128's activations);
//   - one dynamic scale over the whole tensor (FP8PerTensor's activations),
//     or a static scale the caller gives.
// No host synchronization: both capture in a CUDA graph. The grids are sized
// from `rows`, the capacity; an optional device row count (`rows_device`,
// e.g. the permute's expert_offsets[E_local]) is read on the device and the
// rows at or past it are left untouched, so a graph captured for a capacity
// serves any routing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/common.cuh"

namespace unimoe {

constexpr int kFp8GroupCols = 128;  // columns per scale of the row form

struct Fp8RowQuantParams {
  const uint16_t* x = nullptr;           // [rows, cols] bf16, 16-byte aligned
  const float* x_f32 = nullptr;          // or [rows, cols] fp32 (exactly one of x and x_f32)
  int rows = 0;                          // capacity: rows the grid covers (0: nothing launched)
  int cols = 0;                          // a positive multiple of 16
  const int32_t* rows_device = nullptr;  // live row count on the device, or nullptr for `rows`;
                                         // rows >= min(*rows_device, rows) are not written
  uint8_t* codes = nullptr;              // [rows, cols] e4m3, 16-byte aligned
  // [rows, ceil(cols / 128)] fp32, row-major: scales[r * groups + g] covers
  // columns [128 g, min(cols, 128 g + 128)) of row r (the last group ragged).
  // This is the reference's layout, used when scales_ld is 0. The FP8
  // GEMMs read the scales group-major (each group's scales of consecutive
  // rows contiguous, as DeepGEMM and CUTLASS's blockwise GEMM load them):
  // with scales_ld >= rows the scale of (r, g) goes to scales[g * scales_ld + r].
  float* scales = nullptr;
  int scales_ld = 0;
  // Let the next kernel in the stream launch as soon as this one's PDL wait
  // is over (its CTAs then wait for this grid's end), so that a stream GEMM
  // after it issues its weight loads while the codes are made. Honoured for
  // grids of at most kFp8QuantEarlyMaxCtas CTAs (decode), where every CTA of
  // this grid is resident before the next one's take the free slots.
  bool early_dependents = false;
};

constexpr int kFp8QuantEarlyMaxCtas = 64;

// One warp per (row, 128-column group).
void launch_quantize_fp8_rows(const Fp8RowQuantParams& p, KernelStream stream);

// The FP8 cutlass path (FP8Block128, and FP8PerTensor with a static scale of
// x): x's rows quantized as launch_quantize_fp8_rows quantizes them (or with
// the static scale), each row's codes and scales written straight to the
// permuted rows that read it, dst = expanded_to_permuted[r * top_k + k]
// for k < top_k (dst < 0: off this rank, skipped), instead of quantizing
// in token order and gathering (launch_gather_fp8_rows): the same codes
// and scales, without the token-order codes' write and read. Permuted rows
// no token row maps to are not written.
struct Fp8RowScatterParams {
  const uint16_t* x = nullptr;                    // [rows, cols] bf16, 16-byte aligned
  int rows = 0;                                   // tokens (0: nothing launched)
  int cols = 0;                                   // a positive multiple of 128
  const int32_t* expanded_to_permuted = nullptr;  // [rows * top_k] device
  int top_k = 0;
  int capacity = 0;                               // permuted rows: rows * top_k
  uint8_t* codes = nullptr;                       // [capacity, cols] e4m3, 16-byte aligned
  float* scales = nullptr;                        // scale of (permuted row r, group g) at
  int scales_ld = 0;                              //   scales[g * scales_ld + r]; scales_ld >= capacity
  // nullptr: each (row, 128 columns) takes amax / 448 (FP8Block128).
  // Otherwise one device float used for every group, as given (FP8PerTensor's
  // static scale of x): the codes and broadcast scales of
  // launch_quantize_fp8_tensor with that static scale, then the gather.
  const float* static_scale = nullptr;
};

void launch_quantize_fp8_rows_scatter(const Fp8RowScatterParams& p, KernelStream stream);

struct Fp8TensorQuantParams {
  const uint16_t* x = nullptr;           // [rows, cols] bf16, 16-byte aligned
  const float* x_f32 = nullptr;          // or [rows, cols] fp32 (exactly one of x and x_f32)
  int rows = 0;                          // capacity (may be 0)
  int cols = 0;                          // a positive multiple of 16
  const int32_t* rows_device = nullptr;  // as in Fp8RowQuantParams: amax is taken over the
                                         // live rows only, and only they are written
  // nullptr: the dynamic scale amax / 448 (1 when not > 0) over the live
  // rows. Otherwise a device float used as given, e.g. a calibrated scale.
  const float* static_scale = nullptr;
  uint8_t* codes = nullptr;              // [rows, cols] e4m3, 16-byte aligned
  float* scale = nullptr;                // one device float: the scale the codes were made with
                                         // (written even when no row is live: 1, or the static scale)
  float* scratch = nullptr;              // quantize_fp8_tensor_scratch_floats(rows, cols) floats;
                                         // need not be zeroed (unused with a static scale)
  // Optional: the scale also written to every (live row r, 128-column group
  // g) at row_scales[g * row_scales_ld + r], so that a GEMM that reads one
  // scale per row and group (the FP8 GEMMs) serves this form too.
  float* row_scales = nullptr;
  int row_scales_ld = 0;                 // >= rows when row_scales is set
  // As in Fp8RowQuantParams, for the quantize pass's grid (the one-block
  // kernel of small dynamic calls, or the static-scale pass).
  bool early_dependents = false;
};

// FP8PerTensor's dynamic scale alone: partial maxima of x's live rows into
// scratch, then launch_fp8_scale_from_partials writes amax / 448 (1 when
// not > 0) to *scale: the scale launch_quantize_fp8_tensor's dynamic form
// computes, bit for bit, for kernels that then take it as their static
// scale (the FP8 cutlass path's x, quantized straight into the permuted
// rows). Reads x, x_f32, rows, cols, rows_device, scratch and scale.
void launch_fp8_tensor_scale(const Fp8TensorQuantParams& p, KernelStream stream);

// One block: *scale = amax / 448 (1 when not > 0) for amax the largest of
// partials[0, num_partials) (num_partials >= 1): FP8PerTensor's dynamic
// scale from the partial maxima another kernel wrote (the activation
// kernel's, expert_rows.cuh).
void launch_fp8_scale_from_partials(const float* partials, int num_partials, float* scale,
                                    KernelStream stream);

// Floats of scratch launch_quantize_fp8_tensor needs for this capacity.
std::size_t quantize_fp8_tensor_scratch_floats(int rows, int cols);

// Two kernels, deterministic: the first writes one amax per block to
// scratch, the second reduces those in every block, then quantizes. With a
// static scale only the second runs; with a dynamic one and at most 32768
// elements (capacity), one kernel of one block holds every element in
// registers, takes the amax and quantizes.
void launch_quantize_fp8_tensor(const Fp8TensorQuantParams& p, KernelStream stream);

}  // namespace unimoe
