// One layer's synthetic expert weights on the device, for every variant,
// with the values ref::HostWeights regenerates on the host
// (ref/synthetic.h), so that a reference check needs no copy back:
//   BF16: w13, w2 the bf16 fills (seeds.w13, ref::w13_scale(c)) and
//     (seeds.w2, ref::w2_scale(c)) over [E_local, rows, cols];
//   FP8Block128, FP8PerTensor: e4m3 codes and fp32 scales of those same
//     values, quantized on the device from the generator
//     (kernels/quant/fp8_weights.cuh) with no bf16 copy, in
//     ExpertWeights' layouts;
//   MXFP4, NVFP4: packed e2m1 codes and block scale bytes of those same
//     values (w13_block_scale, w2_block_scale), and for NVFP4 each expert
//     matrix's fp32 scale (w13_scale, w2_scale), quantized on the device
//     from the generator (kernels/quant/fp4_weights.cuh) in the checkpoint
//     layout, gate rows before up rows (w13_interleaved false);
//   biases (has_bias): the fp32 fills (seeds.b13 / b2, ref::kBiasScale).
// FP8PerTensor may also carry static activation scales (below).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "layer/graph_timing.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "unimoe/unimoe.h"

namespace unimoe {

// Static activation scales of FP8PerTensor (ExpertWeights::x_scale,
// act_scale), chosen from the synthetic inputs' ranges:
// - x is bf16(uniform[-1, 1) * kXScale), so |x| < kXScale and
//   kXScale / 448 maps it onto e4m3's range without saturating;
// - GEMM1's outputs g, u have standard deviation sqrt(1/3) (x has variance
//   1/3, a w13 element 1 / H by ref::w13_scale, H terms), so within 6
//   deviations |g|, |u| < 3.5, where every activation is below 16
//   (SwiGLUOai, the largest: 3.5 * (3.5 + 1) = 15.75); act_scale maps 16
//   onto 448, and a rarer larger value saturates, as it would with a
//   checkpoint's calibrated scale.
inline constexpr float kStaticXScale = ref::kXScale / 448.0f;
inline constexpr float kStaticActivationBound = 16.0f;
inline constexpr float kStaticActScale = kStaticActivationBound / 448.0f;

class SyntheticDeviceWeights {
 public:
  // Allocates and fills (or quantizes) on `stream`, without waiting for it.
  // static_scales: FP8PerTensor only, the static activation scales above in
  // two device floats; otherwise the layer computes them per call. Throws
  // std::invalid_argument naming the field for static scales for another
  // variant ("static_scales").
  SyntheticDeviceWeights(const MoEConfig& c, const ref::Seeds& seeds, cudaStream_t stream,
                         bool static_scales = false);

  // Device pointers for MoELayer::set_weights; valid while this object lives.
  ExpertWeights weights() const { return weights_; }

  // The static scales in the reference's form (ref::moe_forward); {0, 0}
  // (dynamic) when there are none.
  ref::ActivationScales static_scales() const { return static_scales_; }

  // Bytes of one expert's weights that a forward streams: codes (or bf16
  // values) and scales of w13 and w2 (for the 4-bit variants the packed
  // codes, the block scale bytes and, NVFP4, the two matrix scales); biases
  // not counted (as layer_floor).
  std::size_t weight_bytes() const { return weight_bytes_; }

 private:
  std::unique_ptr<DeviceMem> w13_, w2_, w13_scale_, w2_scale_, w13_block_scale_, w2_block_scale_, b13_, b2_,
      x_scale_, act_scale_;
  ExpertWeights weights_;
  ref::ActivationScales static_scales_;
  std::size_t weight_bytes_ = 0;
};

}  // namespace unimoe
