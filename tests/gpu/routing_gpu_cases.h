// Shared by the split routing GPU tests (test_routing_gpu.cu,
// test_routing_octets_gpu.cu): the routing kernel launched as the plan takes
// it, its outputs poisoned before the launch, and the check against the CPU
// reference (ids exact, weights within 1e-6 relative).
#pragma once

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_plan_util.h"
#include "gpu/routing_test_util.h"
#include "kernels/routing/routing.cuh"
#include "plan/routing_plan.h"
#include "ref/ref.h"

namespace unimoe::test {
// Its own inline namespace: fused_routing_cases.h has a kTypes too.
inline namespace routing_gpu_cases {

// The split chain's routing kernel as the plan takes it for (c, T), with
// no permute after it (so the octet kernel writes no chunk counts).
inline RoutingPlan split_plan(const RoutingConfig& c, int num_tokens) {
  RoutingPlan plan = test::routing_plan(c, 0, 0, num_tokens, false, "split");
  plan.routing_counts_rows = false;
  plan.scatter_masks = false;
  return plan;
}

inline constexpr double kWeightTolerance = 1e-6;

inline constexpr LogitsType kTypes[] = {LogitsType::F32, LogitsType::BF16};

inline std::string describe(const RoutingConfig& c, int num_tokens) {
  return to_string(c.policy) + " " + to_string(c.logits_type) + " E=" +
         std::to_string(c.num_experts) + " K=" + std::to_string(c.top_k) + " T=" +
         std::to_string(num_tokens) + " n_group=" + std::to_string(c.n_group) +
         " topk_group=" + std::to_string(c.topk_group) + (c.has_bias ? " bias" : "");
}

struct DeviceRouting {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// misalign: the logits start that many elements into their allocation
// (rows then miss 16-byte alignment: the kernels' narrow-load paths).
inline DeviceRouting route_on_device(const RoutingConfig& c, const Logits& l, int num_tokens,
                                     const std::vector<float>& bias, int misalign = 0) {
  DeviceBuffer<float> logits_f32;
  DeviceBuffer<uint16_t> logits_bf16;
  if (c.logits_type == LogitsType::BF16) {
    std::vector<uint16_t> padded(static_cast<std::size_t>(misalign), 0);
    padded.insert(padded.end(), l.bf16.begin(), l.bf16.end());
    logits_bf16 = DeviceBuffer<uint16_t>(padded);
  } else {
    std::vector<float> padded(static_cast<std::size_t>(misalign), 0.0f);
    padded.insert(padded.end(), l.values.begin(), l.values.end());
    logits_f32 = DeviceBuffer<float>(padded);
  }
  DeviceBuffer<float> d_bias;
  if (!bias.empty()) d_bias = DeviceBuffer<float>(bias);
  const std::size_t n = static_cast<std::size_t>(num_tokens) * c.top_k;
  DeviceBuffer<int32_t> ids(n);
  DeviceBuffer<float> weights(n);
  ids.poison();
  weights.poison();

  RoutingParams p;
  p.logits = c.logits_type == LogitsType::BF16
                 ? static_cast<const void*>(logits_bf16.get() + misalign)
                 : static_cast<const void*>(logits_f32.get() + misalign);
  p.bias = c.has_bias ? d_bias.get() : nullptr;
  p.num_tokens = num_tokens;
  p.config = c;
  p.topk_ids = ids.get();
  p.topk_weights = weights.get();
  launch_routing(p, split_plan(c, num_tokens), nullptr);
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  return {ids.download(), weights.download()};
}

inline bool weight_close(float got, float want) {
  if (std::isnan(got) || std::isnan(want)) return false;
  if (std::isinf(want)) return got == want;
  return std::fabs(static_cast<double>(got) - want) <=
         kWeightTolerance * std::fabs(want) + FLT_MIN;
}

// Compares every id and weight; reports the count and the first mismatch.
inline void expect_matches_reference(const RoutingConfig& c, const Logits& l, int num_tokens,
                                     const std::vector<float>& bias, int misalign = 0) {
  const DeviceRouting got = route_on_device(c, l, num_tokens, bias, misalign);
  const ref::Routing want =
      ref::route(c, l.values.data(), num_tokens, c.has_bias ? bias.data() : nullptr);
  int id_errors = 0, weight_errors = 0;
  std::string first;
  for (std::size_t i = 0; i < want.ids.size(); ++i) {
    const bool id_ok = got.ids[i] == want.ids[i];
    const bool weight_ok = weight_close(got.weights[i], want.weights[i]);
    id_errors += !id_ok;
    weight_errors += !weight_ok;
    if ((!id_ok || !weight_ok) && first.empty()) {
      first = "token " + std::to_string(i / c.top_k) + " slot " + std::to_string(i % c.top_k) +
              ": id " + std::to_string(got.ids[i]) + " want " + std::to_string(want.ids[i]) +
              ", weight " + std::to_string(got.weights[i]) + " want " +
              std::to_string(want.weights[i]);
    }
  }
  EXPECT_EQ(id_errors, 0) << first;
  EXPECT_EQ(weight_errors, 0) << first;
}

inline std::vector<float> uniform(std::size_t n, std::mt19937_64& rng, float lo, float hi) {
  return test::random_vector(n, rng, lo, hi);
}

// The DeepSeek variant a test uses for E: grouped (8 groups, 4 kept) where
// that is legal, else one group.
inline RoutingConfig with_groups(RoutingConfig c) {
  if (c.policy != RoutingPolicy::DeepSeekV3) return c;
  c.n_group = 8;
  c.topk_group = 4;
  if (!test::legal_routing(c)) c.n_group = c.topk_group = 1;
  return c;
}

}  // namespace routing_gpu_cases
}  // namespace unimoe::test
