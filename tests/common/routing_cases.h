// Shared by the routing tests (tests/cpu/test_routing*.cpp): configs, the
// weight tolerance, and row slices of a Routing.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

#include "plan/routing_sweep.h"
#include "ref/ref.h"

namespace unimoe::test {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr double kRoutingRelTol = 1e-6;

inline constexpr RoutingPolicy kAllPolicies[] = {
    RoutingPolicy::Default,    RoutingPolicy::Renormalize,   RoutingPolicy::RenormalizeNaive,
    RoutingPolicy::TopK,       RoutingPolicy::Sigmoid,       RoutingPolicy::SigmoidRenorm,
    RoutingPolicy::TopKSigmoid, RoutingPolicy::Llama4,       RoutingPolicy::DeepSeekV3,
    RoutingPolicy::MiniMax2};

inline bool is_deepseek(RoutingPolicy p) {
  return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2;
}

// RoutingConfig is an aggregate: policy, E, K, n_group, topk_group, scale, has_bias.
inline RoutingConfig make_config(RoutingPolicy policy, int e, int k, int n_group = 1,
                                 int topk_group = 1, float scale = 1.0f, bool has_bias = false) {
  return RoutingConfig{policy, e, k, n_group, topk_group, scale, has_bias};
}

// Relative 1e-6; a non-finite expectation must match exactly.
inline bool weight_matches(float got, double want) {
  if (!std::isfinite(want)) return static_cast<double>(got) == want;
  return std::abs(got - want) <= kRoutingRelTol * std::abs(want) + 1e-30;
}

// Row `row` of a [T, K] array.
template <class V>
V row_of(const V& v, int row, int k) {
  return V(v.begin() + std::size_t{1} * row * k, v.begin() + std::size_t{1} * (row + 1) * k);
}

using unimoe::legal_routing;  // plan/routing_sweep.h

}  // namespace unimoe::test
