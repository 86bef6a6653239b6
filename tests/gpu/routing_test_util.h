// Routing inputs shared by the GPU tests: a grouped DeepSeekV3 config and
// logits as the device reads them (bf16 rounded once) beside what the CPU
// reference sees.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ref/ref.h"
#include "unimoe/unimoe.h"

namespace unimoe::test {

// DeepSeekV3 with a bias and a routed scaling factor of 2.5.
inline RoutingConfig grouped_deepseek(int e, int k, int n_group, int topk_group, LogitsType type) {
  RoutingConfig c;
  c.policy = RoutingPolicy::DeepSeekV3;
  c.num_experts = e;
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.has_bias = true;
  c.routed_scaling_factor = 2.5f;
  c.logits_type = type;
  return c;
}

// The logits as the device reads them and as the reference sees them: bf16
// logits are rounded once, and the reference gets their exact fp32 widening.
struct Logits {
  std::vector<float> values;    // [T, E]
  std::vector<uint16_t> bf16;   // [T, E] bits, BF16 only
};

inline Logits make_logits(std::vector<float> values, const RoutingConfig& c) {
  Logits l;
  l.values = std::move(values);
  if (c.logits_type == LogitsType::BF16) {
    l.bf16.resize(l.values.size());
    for (std::size_t i = 0; i < l.values.size(); ++i) {
      l.bf16[i] = ref::f32_to_bf16(l.values[i]);
      l.values[i] = ref::bf16_to_f32(l.bf16[i]);
    }
  }
  return l;
}

}  // namespace unimoe::test
