// The host side of the routing kernels: slots a lane per E, the config
// checks, RoutingKernelParams from RoutingParams, and the octet kernel's
// entry points. Part of routing_device.cuh.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/exact_quotient.h"
#include "core/group_index.h"
#include "core/routing_launch_shape.h"
#include "core/routing_limits.h"
#include "kernels/routing/routing.cuh"
#include "kernels/routing/routing_keys.cuh"

namespace unimoe::routing_detail {

// Experts per lane a kernel is instantiated for: a power of two, 1..32.
inline int slots_per_lane(int num_experts) { return routing_shape::slots_for_experts(num_experts); }
static_assert(kMaxExperts / kWarpSize == 32, "slots_for_experts stops at 32 slots");

// Calls f(std::integral_constant<int, S>{}) with S = slots_per_lane(E), so
// that a launcher picks the kernel instantiated for its slots.
template <class F>
void with_slots_per_lane(int num_experts, F&& f) {
  switch (slots_per_lane(num_experts)) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    default: f(std::integral_constant<int, 32>{}); break;
  }
}

inline bool is_deepseek(RoutingPolicy p) {
  return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2;
}

// The config limits the routing code is built for (validate() refuses the
// rest earlier); throws std::invalid_argument, the message prefixed by `who`.
inline void check_routing_config(const RoutingParams& params, const std::string& who) {
  auto require = [&](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(who + ": " + message);
  };
  const RoutingConfig& c = params.config;
  const int n_group = c.policy == RoutingPolicy::DeepSeekV3 ? c.n_group : 1;
  require(params.num_tokens >= 0, "num_tokens must be >= 0");
  require(c.num_experts >= 1 && c.num_experts <= kMaxExperts,
          "num_experts must be 1.." + std::to_string(kMaxExperts));
  require(c.top_k >= 1 && c.top_k <= kMaxTopK && c.top_k <= c.num_experts,
          "top_k must be 1..min(num_experts, " + std::to_string(kMaxTopK) + ")");
  require(c.policy != RoutingPolicy::Llama4 || c.top_k == 1, "Llama4 needs top_k = 1");
  require(n_group >= 1 && n_group <= kMaxGroups && c.num_experts % n_group == 0,
          "n_group must be 1.." + std::to_string(kMaxGroups) + " and divide num_experts");
  if (n_group > 1) {
    require(c.num_experts / n_group >= 2, "groups need at least 2 experts");
    require(c.topk_group >= 1 && c.topk_group <= n_group, "topk_group must be 1..n_group");
    require(c.top_k <= c.topk_group * (c.num_experts / n_group),
            "top_k exceeds the experts of the kept groups");
  }
  require(!(is_deepseek(c.policy) && c.has_bias) || params.bias != nullptr,
          "has_bias is set but bias is null");
}

// The kernel's view of checked params.
inline RoutingKernelParams make_routing_kernel_params(const RoutingParams& params) {
  const RoutingConfig& c = params.config;
  const bool deepseek = is_deepseek(c.policy);
  const int n_group = c.policy == RoutingPolicy::DeepSeekV3 ? c.n_group : 1;
  RoutingKernelParams p{};
  p.logits = params.logits;
  p.bias = deepseek && c.has_bias ? params.bias : nullptr;
  p.num_tokens = params.num_tokens;
  p.num_experts = c.num_experts;
  p.top_k = c.top_k;
  p.chosen_width = 1;
  while (p.chosen_width < c.top_k) p.chosen_width *= 2;
  p.policy = c.policy;
  p.n_group = n_group;
  p.topk_group = n_group > 1 ? c.topk_group : 1;
  p.lanes_per_group_log2 = routing_limits::lanes_per_group_log2(n_group);
  p.lanes_per_group = 1 << p.lanes_per_group_log2;
  p.experts_per_group = c.num_experts / n_group;
  p.inv_experts_per_group = inverse_group_size(p.experts_per_group);
  p.inv_num_experts = inverse_of(c.num_experts);
  p.routed_scaling_factor = c.routed_scaling_factor;
  p.topk_ids = params.topk_ids;
  p.topk_weights = params.topk_weights;
  return p;
}

}  // namespace unimoe::routing_detail

namespace unimoe {

// The split chain's DeepSeek routing kernel of eight lanes a token
// (routing_octets.cu), for the calls routing_shape::split_takes_octets
// allows (the routing plan decides). `filter`: its filter mode (16-byte
// aligned logits only). `counts` (nullptr: none): the permute's chunk
// counts to write as well, where the plan has it count the rows.
void launch_routing_octets(const routing_detail::RoutingKernelParams& p, bool bf16_logits,
                           bool filter, const PermuteCounts* counts, KernelStream stream);

}  // namespace unimoe
