#include "support/device_weights.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/common/common.cuh"
#include "kernels/common/fill.cuh"
#include "kernels/quant/fp4_weights.cuh"
#include "kernels/quant/fp8_weights.cuh"

namespace unimoe {
namespace {

bool is_fp8(QuantVariant q) { return q == QuantVariant::FP8Block128 || q == QuantVariant::FP8PerTensor; }

// A scratch buffer of `floats` floats allocated and freed in stream order,
// so nothing waits for the kernels that use it.
class StreamScratch {
 public:
  StreamScratch(std::size_t floats, cudaStream_t stream) : stream_(stream) {
    if (floats > 0) UNIMOE_CUDA_CHECK(cudaMallocAsync(&p_, floats * sizeof(float), stream));
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  float* get() const { return p_; }

 private:
  float* p_ = nullptr;
  cudaStream_t stream_;
};

// The e4m3 codes and scales of the synthetic [experts, rows, cols] bf16
// fill (seed, scale), into new buffers.
void quantize_synthetic(QuantVariant q, int experts, int rows, int cols, uint64_t seed, float scale,
                        cudaStream_t stream, std::unique_ptr<DeviceMem>& codes,
                        std::unique_ptr<DeviceMem>& scales) {
  codes = std::make_unique<DeviceMem>(static_cast<std::size_t>(experts) * rows * cols);
  scales = std::make_unique<DeviceMem>(fp8_weight_scale_count(q, experts, rows, cols) * sizeof(float));
  const StreamScratch scratch(quantize_fp8_weights_scratch_floats(q, experts, rows, cols), stream);
  Fp8WeightQuantParams p;
  p.variant = q;
  p.experts = experts;
  p.rows = rows;
  p.cols = cols;
  p.source = synthetic_weight_source(seed, scale);
  p.codes = codes->as<uint8_t>();
  p.scales = scales->as<float>();
  p.scratch = scratch.get();
  launch_quantize_fp8_weights(p, stream);
}

// The packed e2m1 codes, block scale bytes and (NVFP4) matrix scales of the
// same fill, into new buffers.
void quantize_synthetic_fp4(QuantVariant q, int experts, int rows, int cols, uint64_t seed, float scale,
                            cudaStream_t stream, std::unique_ptr<DeviceMem>& codes,
                            std::unique_ptr<DeviceMem>& block_scales, std::unique_ptr<DeviceMem>& globals) {
  const std::size_t values = static_cast<std::size_t>(experts) * rows * cols;
  codes = std::make_unique<DeviceMem>(values / 2);
  block_scales = std::make_unique<DeviceMem>(values / fp4_block_size(q));
  if (q == QuantVariant::NVFP4) globals = std::make_unique<DeviceMem>(experts * sizeof(float));
  const StreamScratch scratch(quantize_fp4_weights_scratch_floats(q, experts, rows, cols), stream);
  Fp4WeightQuantParams p;
  p.variant = q;
  p.experts = experts;
  p.rows = rows;
  p.cols = cols;
  p.source = synthetic_weight_source(seed, scale);
  p.codes = codes->as<uint8_t>();
  p.block_scales = block_scales->as<uint8_t>();
  p.global_scales = globals ? globals->as<float>() : nullptr;
  p.scratch = scratch.get();
  launch_quantize_fp4_weights(p, stream);
}

// One device float holding `value` (its own allocation: ExpertWeights'
// pointers must be 16-byte aligned). The copy is from pageable memory, so
// `value` may go once this returns.
std::unique_ptr<DeviceMem> device_float(float value, cudaStream_t stream) {
  auto mem = std::make_unique<DeviceMem>(sizeof(float));
  UNIMOE_CUDA_CHECK(cudaMemcpyAsync(mem->p, &value, sizeof(float), cudaMemcpyHostToDevice, stream));
  return mem;
}

}  // namespace

SyntheticDeviceWeights::SyntheticDeviceWeights(const MoEConfig& c, const ref::Seeds& s,
                                               cudaStream_t stream, bool static_scales) {
  const QuantVariant q = c.experts.quant;
  if (static_scales && q != QuantVariant::FP8PerTensor)
    throw std::invalid_argument("static_scales: only FP8PerTensor takes static activation scales, not " +
                                to_string(q));
  const int e = c.local_experts(), h = c.experts.hidden, i = c.experts.intermediate;
  const int n1 = c.gemm1_cols();
  const std::size_t w13_values = static_cast<std::size_t>(n1) * h, w2_values = static_cast<std::size_t>(h) * i;
  if (q == QuantVariant::BF16) {
    w13_ = std::make_unique<DeviceMem>(e * w13_values * sizeof(uint16_t));
    w2_ = std::make_unique<DeviceMem>(e * w2_values * sizeof(uint16_t));
    launch_fill_bf16(w13_->as<uint16_t>(), e * w13_values, s.w13, ref::w13_scale(c), stream);
    launch_fill_bf16(w2_->as<uint16_t>(), e * w2_values, s.w2, ref::w2_scale(c), stream);
    weight_bytes_ = (w13_values + w2_values) * sizeof(uint16_t);
  } else if (is_fp8(q)) {
    quantize_synthetic(q, e, n1, h, s.w13, ref::w13_scale(c), stream, w13_, w13_scale_);
    quantize_synthetic(q, e, h, i, s.w2, ref::w2_scale(c), stream, w2_, w2_scale_);
    weights_.w13_scale = w13_scale_->as<float>();
    weights_.w2_scale = w2_scale_->as<float>();
    const std::size_t scales_per_expert =
        fp8_weight_scale_count(q, 1, n1, h) + fp8_weight_scale_count(q, 1, h, i);
    weight_bytes_ = w13_values + w2_values + scales_per_expert * sizeof(float);
  } else {
    quantize_synthetic_fp4(q, e, n1, h, s.w13, ref::w13_scale(c), stream, w13_, w13_block_scale_, w13_scale_);
    quantize_synthetic_fp4(q, e, h, i, s.w2, ref::w2_scale(c), stream, w2_, w2_block_scale_, w2_scale_);
    weights_.w13_block_scale = w13_block_scale_->as<uint8_t>();
    weights_.w2_block_scale = w2_block_scale_->as<uint8_t>();
    const std::size_t block = fp4_block_size(q);
    weight_bytes_ = (w13_values + w2_values) / 2 + (w13_values + w2_values) / block;
    if (q == QuantVariant::NVFP4) {
      weights_.w13_scale = w13_scale_->as<float>();
      weights_.w2_scale = w2_scale_->as<float>();
      weight_bytes_ += 2 * sizeof(float);
    }
  }
  weights_.w13 = w13_->p;
  weights_.w2 = w2_->p;
  if (c.experts.has_bias) {
    b13_ = std::make_unique<DeviceMem>(static_cast<std::size_t>(e) * n1 * sizeof(float));
    b2_ = std::make_unique<DeviceMem>(static_cast<std::size_t>(e) * h * sizeof(float));
    launch_fill_f32(b13_->as<float>(), static_cast<std::size_t>(e) * n1, s.b13, ref::kBiasScale, stream);
    launch_fill_f32(b2_->as<float>(), static_cast<std::size_t>(e) * h, s.b2, ref::kBiasScale, stream);
    weights_.b13 = b13_->as<float>();
    weights_.b2 = b2_->as<float>();
  }
  if (static_scales) {
    x_scale_ = device_float(kStaticXScale, stream);
    act_scale_ = device_float(kStaticActScale, stream);
    weights_.x_scale = x_scale_->as<float>();
    weights_.act_scale = act_scale_->as<float>();
    static_scales_ = {kStaticXScale, kStaticActScale};
  }
}

}  // namespace unimoe
