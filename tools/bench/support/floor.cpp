#include "support/floor.h"

#include <algorithm>
#include <cmath>

namespace unimoe {

double weight_bytes_per_value(QuantVariant q) {
  switch (q) {
    case QuantVariant::BF16: return 2.0;
    case QuantVariant::FP8PerTensor: return 1.0;
    case QuantVariant::FP8Block128: return 1.0 + 4.0 / (128.0 * 128.0);
    case QuantVariant::MXFP4: return 0.5 + 1.0 / 32.0;
    case QuantVariant::NVFP4: return 0.5 + 1.0 / 16.0;
  }
  return 2.0;
}

double expected_active_experts(int num_experts, int top_k, int num_tokens) {
  const double miss = std::pow(1.0 - static_cast<double>(top_k) / num_experts, num_tokens);
  return num_experts * (1.0 - miss);
}

namespace {

bool is_fp8(QuantVariant q) { return q == QuantVariant::FP8Block128 || q == QuantVariant::FP8PerTensor; }

double stage_time_us(double bytes, double flops, double rate_tflops, const Ceilings& ceil) {
  const double memory = ceil.bandwidth_tbps > 0 ? bytes / (ceil.bandwidth_tbps * 1e6) : 0;
  const double compute = rate_tflops > 0 ? flops / (rate_tflops * 1e6) : 0;
  return std::max(memory, compute);
}

}  // namespace

std::vector<StageFloor> stage_floors(const MoEConfig& c, int num_tokens, double active_experts,
                                     const Ceilings& ceil) {
  const double h = c.experts.hidden, i = c.experts.intermediate, t = num_tokens;
  const double k = c.routing.top_k, rows = t * k, e = c.routing.num_experts;
  const double cols1 = static_cast<double>(c.gemm1_cols());
  const double wb = weight_bytes_per_value(c.experts.quant);
  const bool fp8 = is_fp8(c.experts.quant);
  const double act_bytes = fp8 ? 1.0 + 4.0 / 128.0 : 2.0;
  const double logits_bytes = c.routing.logits_type == LogitsType::F32 ? 4.0 : 2.0;
  const double rate = fp8 ? ceil.fp8_matmul_tflops : ceil.matmul_tflops;
  std::vector<StageFloor> out = {
      {"routing", t * e * logits_bytes + rows * 8.0, 0},
      {"permute", rows * 4.0 + rows * 8.0, 0},
      {"gemm1", active_experts * cols1 * h * wb + t * h * 2.0 + rows * i * act_bytes, 2.0 * rows * cols1 * h},
      {"gemm2", active_experts * h * i * wb + rows * i * act_bytes + rows * h * 2.0, 2.0 * rows * h * i},
      {"finalize", rows * h * 2.0 + t * h * 2.0, 0},
  };
  for (StageFloor& s : out) s.floor_us = stage_time_us(s.bytes, s.flops, rate, ceil);
  return out;
}

FloorEstimate layer_floor(const MoEConfig& c, int num_tokens, double active_experts,
                          const Ceilings& ceil) {
  const double h = c.experts.hidden, i = c.experts.intermediate, t = num_tokens;
  const double per_expert = (static_cast<double>(c.gemm1_cols()) + i) * h;
  const double logits_bytes = c.routing.logits_type == LogitsType::F32 ? 4.0 : 2.0;
  FloorEstimate f;
  f.bytes = active_experts * per_expert * weight_bytes_per_value(c.experts.quant) +
            2.0 * t * h * 2.0 + t * c.routing.num_experts * logits_bytes;
  f.flops = 2.0 * t * c.routing.top_k * per_expert;
  f.memory_us = ceil.bandwidth_tbps > 0 ? f.bytes / (ceil.bandwidth_tbps * 1e6) : 0;
  const bool fp8 = is_fp8(c.experts.quant);
  const double rate = fp8 ? ceil.fp8_matmul_tflops : ceil.matmul_tflops;
  f.compute_us = rate > 0 ? f.flops / (rate * 1e6) : 0;
  f.floor_us = std::max(f.memory_us, f.compute_us);
  return f;
}

}  // namespace unimoe
