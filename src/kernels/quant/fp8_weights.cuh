// Weight quantization to e4m3 on the device, bit for bit
// ref::quantize(variant, matrix) applied to each expert's matrix on its own
// (docs/quantization.md, "Quantized matrices"): the weights are
// [E, rows, cols] (w13: [E_local, gemm1_cols, H]; w2: [E_local, H, I]),
// quantized along cols.
//   - FP8Block128: one fp32 scale per 128 x 128 tile of each expert's
//     matrix, the last tiles ragged; scales [E, ceil(rows/128),
//     ceil(cols/128)] row-major, the layout of ExpertWeights::w13_scale.
//   - FP8PerTensor: one fp32 scale per expert's matrix; scales [E]. An
//     expert whose matrix is empty (rows or cols 0) still gets its scale, 1.
// scale = amax / 448 in fp32 (1 when that is not > 0), amax skipping NaN;
// code = e4m3(x / scale) with one IEEE fp32 division, RNE, saturating to
// +-448, NaN -> 0x7f.
//
// The values come from a WeightSource (kernels/quant/weight_source.cuh): a
// bf16 device array [E, rows, cols], or the synthetic values of
// launch_fill_bf16 generated on the fly.
//
// Weights are prepared once: these kernels are not on the forward's path.
// No host synchronization and no atomics: the per-tensor amax is two
// kernels (partial maxima, then each block of the second reduces its
// expert's partials before it encodes), so the result is deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/common.cuh"
#include "kernels/quant/weight_source.cuh"
#include "unimoe/unimoe.h"

namespace unimoe {

constexpr int kFp8WeightBlock = 128;  // rows and columns of an FP8Block128 scale tile

struct Fp8WeightQuantParams {
  QuantVariant variant = QuantVariant::FP8Block128;  // FP8Block128 or FP8PerTensor
  int experts = 0;  // E >= 0
  int rows = 0;     // >= 0
  int cols = 0;     // >= 0, a multiple of 16
  WeightSource source;
  uint8_t* codes = nullptr;   // [E, rows, cols] e4m3, 16-byte aligned
  float* scales = nullptr;    // fp8_weight_scale_count(variant, E, rows, cols) floats
  float* scratch = nullptr;   // FP8PerTensor: quantize_fp8_weights_scratch_floats(...) floats,
                              // need not be zeroed; unused by FP8Block128
};

// Floats of `scales`: E * ceil(rows/128) * ceil(cols/128) for FP8Block128,
// E for FP8PerTensor. Throws std::invalid_argument (field "variant") for
// another variant.
std::size_t fp8_weight_scale_count(QuantVariant variant, int experts, int rows, int cols);

// Floats of scratch launch_quantize_fp8_weights needs (0 for FP8Block128).
std::size_t quantize_fp8_weights_scratch_floats(QuantVariant variant, int experts, int rows, int cols);

// FP8Block128: one kernel, one CTA per (expert, tile), which holds its tile
// in registers between the amax and the encode. FP8PerTensor: partial maxima
// per (expert, chunk) into scratch, then a kernel whose CTAs each reduce
// their expert's partials and encode a share of its elements; the first CTA
// of each expert stores its scale. Nothing is launched when E is 0 (nor,
// for FP8Block128, when rows or cols is 0). Throws std::invalid_argument
// naming the field for a bad argument: variant, experts, rows, cols,
// source (null bf16, misaligned), codes, scales, scratch, or a grid too large.
void launch_quantize_fp8_weights(const Fp8WeightQuantParams& p, KernelStream stream);

}  // namespace unimoe
