// Shared by the routing tests (tests/cpu/test_routing*.cpp): configs, the
// weight tolerance, and row slices of a Routing.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "support/routing_sweep.h"
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

// `v` moved up by n fp32 ulps (finite, positive n).
inline float ulps_above(float v, int n) {
  for (int i = 0; i < n; ++i) v = std::nextafter(v, std::numeric_limits<float>::infinity());
  return v;
}

// [T, E] fp32 logits whose DeepSeek keys (without bias, or with one bias for
// every expert) tie or differ in their last few ulps, so that any error in a
// kernel's keys or tie-break shows as a wrong id. By kind
// (token % 3): every logit within 255 ulps of one value near 0, where the
// keys spread over a few 1e-6; random logits where 16 experts lie 1-40 ulps
// above another expert's; random logits whose K + 1 best lie within 100
// ulps of 3.
inline std::vector<float> near_tie_logits(int num_tokens, int num_experts, int top_k,
                                          std::mt19937_64& rng) {
  std::uniform_real_distribution<float> any(-4.0f, 2.0f), base(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expert(0, num_experts - 1), wide(0, 255), near(1, 40),
      close(0, 100);
  std::vector<float> out(static_cast<std::size_t>(num_tokens) * num_experts);
  std::vector<int> order(num_experts);
  for (int t = 0; t < num_tokens; ++t) {
    float* row = &out[static_cast<std::size_t>(t) * num_experts];
    if (t % 3 == 0) {
      const float b = base(rng);
      for (int e = 0; e < num_experts; ++e) row[e] = ulps_above(b, wide(rng));
      continue;
    }
    for (int e = 0; e < num_experts; ++e) row[e] = any(rng);
    if (t % 3 == 1) {
      for (int i = 0; i < 16; ++i) row[expert(rng)] = ulps_above(row[expert(rng)], near(rng));
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (int i = 0; i <= std::min(top_k, num_experts - 1); ++i)
        row[order[i]] = ulps_above(3.0f, close(rng));
    }
  }
  return out;
}

// Rows of hard patterns for the routing tests: ties, signed zeros, NaN,
// infinities, huge and tiny magnitudes, the sigmoid's flat ends.
inline constexpr int kAdversarialPatterns = 14;

// One row of E logits of pattern `pattern` (0 .. kAdversarialPatterns - 1).
inline void adversarial_row(int pattern, int num_experts, int top_k, std::mt19937_64& rng, float* row) {
  std::uniform_int_distribution<int> pick(0, num_experts - 1);
  std::uniform_real_distribution<float> any(-3, 3);
  const float huge[] = {1e30f, -1e30f, 3e38f, -3e38f, FLT_MAX, -FLT_MAX, 1e-40f, -1e-40f, 0.0f, -0.0f};
  for (int e = 0; e < num_experts; ++e) {
    switch (pattern) {
      case 0: row[e] = (e % 3 == 0) ? -0.0f : 0.0f; break;         // all equal, signed zeros
      case 1: row[e] = 1.5f; break;                                // all equal
      case 2: row[e] = -kInf; break;                               // all -inf
      case 3: row[e] = kNaN; break;                                // all NaN
      case 4: row[e] = e % 2 ? kNaN : -kInf; break;                // NaN ties -inf
      case 5: row[e] = any(rng); break;                            // one +inf (below)
      case 6: row[e] = e % 5 == 1 ? kNaN : any(rng); break;        // +infs and NaNs
      case 7: row[e] = e % 2 ? kNaN : -kInf; break;                // fewer finite than K
      case 8: row[e] = huge[pick(rng) % 10]; break;                // huge and tiny magnitudes
      case 9: row[e] = static_cast<float>(pick(rng) % 3 - 1); break;  // heavy ties
      case 10: row[e] = e % 3 ? -kInf : kInf; break;               // only infinities
      case 11: row[e] = -100.0f + any(rng) * 3; break;             // sigmoid underflow range
      case 12: row[e] = any(rng) * 70; break;                      // wide spread
      default: row[e] = 25.0f + any(rng) * 5; break;               // sigmoid saturates to 1
    }
  }
  if (pattern == 5) row[pick(rng)] = kInf;
  if (pattern == 6)
    for (int i = 0; i < 3; ++i) row[pick(rng)] = kInf;
  if (pattern == 7)
    for (int i = 0; i < std::max(1, top_k / 2); ++i) row[pick(rng)] = any(rng);
}

// [T, E] logits, token t of pattern t % kAdversarialPatterns.
inline std::vector<float> adversarial_logits(int num_tokens, int num_experts, int top_k,
                                             std::mt19937_64& rng) {
  std::vector<float> out(static_cast<std::size_t>(num_tokens) * num_experts);
  for (int t = 0; t < num_tokens; ++t)
    adversarial_row(t % kAdversarialPatterns, num_experts, top_k, rng,
                    &out[static_cast<std::size_t>(t) * num_experts]);
  return out;
}

// A DeepSeek bias in [-0.5, 0.5]; with `non_finite`, NaN, +-inf and 1e30
// at fixed strides too.
inline std::vector<float> adversarial_bias(int num_experts, bool non_finite, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> any(-0.5f, 0.5f);
  std::vector<float> bias(num_experts);
  for (float& b : bias) b = any(rng);
  if (non_finite) {
    for (int i = 0; i < num_experts; i += 7) bias[i] = kNaN;
    for (int i = 3; i < num_experts; i += 11) bias[i] = kInf;
    for (int i = 5; i < num_experts; i += 13) bias[i] = -kInf;
    for (int i = 1; i < num_experts; i += 17) bias[i] = 1e30f;
  }
  return bias;
}

}  // namespace unimoe::test
