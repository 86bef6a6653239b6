// 4-bit (MXFP4, NVFP4) weights on the device: quantization into the
// checkpoint layout, and the copy into the prepared layout the W4A16 GEMMs
// read (docs/quantization.md, "4-bit weights on the device").
//
// launch_quantize_fp4_weights: bit for bit ref::quantize(variant, matrix)
// applied to each expert's matrix of [E, rows, cols] (quantized along cols)
// on its own, in ExpertWeights' layouts:
//   codes         [E, rows, cols / 2] bytes, e2m1 two a byte, the even
//                 column in the low nibble;
//   block_scales  [E, rows, cols / 32] e8m0 (MXFP4) or [E, rows, cols / 16]
//                 e4m3 (NVFP4), one byte a block, row-major;
//   global_scales NVFP4: [E] fp32, each expert matrix's scale.
// The rules are core/e2m1.h's (the reference's, IEEE fp32 in its order):
//   MXFP4: code = mx_scale_code(block amax); element = e2m1(x * 2^(127 - code));
//   NVFP4: global = matrix amax / 2688 (1 when not > 0); code =
//          e4m3((block amax / 6) / global); element = e2m1(x / (e4m3 value
//          of code * global)), +0 when that divisor is 0.
// amax skips NaN. The values come from a WeightSource (weight_source.cuh).
// NVFP4's matrix amax is two kernels (partial maxima per expert and chunk,
// then each CTA of the second reduces its expert's partials before it
// encodes): deterministic, no atomics, no host synchronization.
//
// launch_prepare_fp4_weights: the prepared copy of checkpoint-layout codes
// and block scales [E, rows, ...]: every 32-bit word of codes goes through
// fp4_prepare_word (core/fp4_layout.h), block scale bytes are copied as
// they are. With `interleaved` (gpt-oss's w13, rows alternating gate, up,
// gate, up, ...; rows = 2 * I) the rows are reordered to gate rows then up
// rows: prepared row r < I is source row 2r, prepared row I + r is source
// row 2r + 1, for codes, block scales and the optional fp32 bias [E, rows].
//
// Weights are prepared once: these kernels are not on the forward's path.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/quant/weight_source.cuh"
#include "unimoe/unimoe.h"

namespace unimoe {

struct Fp4WeightQuantParams {
  QuantVariant variant = QuantVariant::MXFP4;  // MXFP4 or NVFP4
  int experts = 0;  // E >= 0
  int rows = 0;     // >= 0
  int cols = 0;     // >= 0, a multiple of fp4_block_size(variant)
  WeightSource source;
  uint8_t* codes = nullptr;          // [E, rows, cols / 2], 16-byte aligned
  uint8_t* block_scales = nullptr;   // [E, rows, cols / fp4_block_size(variant)]
  float* global_scales = nullptr;    // NVFP4: [E]; unused by MXFP4
  float* scratch = nullptr;          // NVFP4: quantize_fp4_weights_scratch_floats(...) floats,
                                     // need not be zeroed; unused by MXFP4
};

// Values a block scale covers: 32 for MXFP4, 16 for NVFP4. Throws
// std::invalid_argument (field "variant") for another variant.
int fp4_block_size(QuantVariant variant);

// Floats of scratch launch_quantize_fp4_weights needs (0 for MXFP4).
// Throws std::invalid_argument naming the field for a bad argument.
std::size_t quantize_fp4_weights_scratch_floats(QuantVariant variant, int experts, int rows, int cols);

// Nothing is launched when E is 0 (nor, for MXFP4, when rows or cols is 0;
// NVFP4 still writes each expert's global scale, 1). Throws
// std::invalid_argument naming the field for a bad argument: variant,
// experts, rows, cols, source (kind, null or misaligned bf16), codes,
// block_scales, global_scales, scratch, or a grid too large.
void launch_quantize_fp4_weights(const Fp4WeightQuantParams& p, KernelStream stream);

struct Fp4PrepareParams {
  int experts = 0;           // E >= 0
  int rows = 0;              // >= 0; even when interleaved
  int cols = 0;              // K > 0, a multiple of 32
  int block = 32;            // values a block scale covers: 32 (MXFP4) or 16 (NVFP4)
  bool interleaved = false;  // rows alternate gate, up: reorder to gate rows, then up rows
  const uint8_t* src_codes = nullptr;   // [E, rows, cols / 2], checkpoint layout, 16-byte aligned
  const uint8_t* src_scales = nullptr;  // [E, rows, cols / block]
  const float* src_bias = nullptr;      // optional [E, rows]
  uint8_t* dst_codes = nullptr;         // [E, rows, cols / 2], prepared layout, 16-byte aligned
  uint8_t* dst_scales = nullptr;        // [E, rows, dst_scale_stride], the first cols / block used
  int dst_scale_stride = 0;             // bytes from one row's scales to the next; 0: cols / block
  float* dst_bias = nullptr;            // [E, rows], set exactly when src_bias is
};

// One thread per 32 values of a row: its 16 code bytes, its 1 or 2 scale
// bytes and, for the row's first, the row's bias. Destinations must not
// overlap sources. Nothing is launched when there is no row (E or rows 0).
// Throws std::invalid_argument naming the field for a bad argument:
// experts, rows, cols, block, interleaved (odd rows), src_codes,
// dst_codes (null, misaligned, overlapping src_codes), src_scales,
// dst_scales, dst_bias (missing, or set without src_bias).
void launch_prepare_fp4_weights(const Fp4PrepareParams& p, KernelStream stream);

}  // namespace unimoe
