// The split routing kernel against the CPU reference (ref::route): every
// policy, fp32 and bf16 logits, random and adversarial rows, grouped DeepSeekV3,
// large T, no tokens, refusals; and DeepSeek's score functions on the device
// against the host's, bit for bit (sigmoid_fp32) or within their bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "core/routing_launch_shape.h"
#include "core/sigmoid_fp32.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_gpu_cases.h"
#include "kernels/routing/routing.cuh"
#include "kernels/routing/routing_device.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

using test::describe;
using test::DeviceBuffer;
using test::DeviceRouting;
using test::expect_matches_reference;
using test::grouped_deepseek;
using test::kTypes;
using test::Logits;
using test::make_logits;
using test::route_on_device;
using test::split_plan;
using test::uniform;
using test::with_groups;

constexpr RoutingPolicy kPolicies[] = {
    RoutingPolicy::Default,     RoutingPolicy::Renormalize,   RoutingPolicy::RenormalizeNaive,
    RoutingPolicy::TopK,        RoutingPolicy::Sigmoid,       RoutingPolicy::SigmoidRenorm,
    RoutingPolicy::TopKSigmoid, RoutingPolicy::Llama4,        RoutingPolicy::DeepSeekV3,
    RoutingPolicy::MiniMax2};

constexpr int kExperts[] = {8, 64, 128, 160, 256, 384, 1024};
constexpr int kTopKs[] = {1, 2, 4, 6, 8, 22, 32};
constexpr int kTokens[] = {1, 2, 3, 7, 33, 100, 1000, 4096};
constexpr long kMaxLogitsPerCase = 1 << 18;

bool is_deepseek(RoutingPolicy p) {
  return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2;
}

TEST(RoutingGpu, RandomLogitsEveryPolicy) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int case_index = 0;
  for (RoutingPolicy policy : kPolicies) {
    for (LogitsType type : kTypes) {
      for (int e : kExperts) {
        for (int k : kTopKs) {
          RoutingConfig c;
          c.policy = policy;
          c.num_experts = e;
          c.top_k = k;
          c.logits_type = type;
          c.has_bias = is_deepseek(policy) && case_index % 3 != 0;
          c.routed_scaling_factor = is_deepseek(policy) ? 2.5f : 1.0f;
          c = with_groups(c);
          if (!test::legal_routing(c)) continue;
          // Every T in turn, so each size meets many shapes; at most
          // kMaxLogitsPerCase logits keep the reference fast.
          int t = kTokens[case_index++ % std::size(kTokens)];
          while (static_cast<long>(t) * e > kMaxLogitsPerCase) t /= 2;
          SCOPED_TRACE(describe(c, t));
          const Logits l = make_logits(uniform(static_cast<std::size_t>(t) * e, rng, -6, 6), c);
          const std::vector<float> bias = uniform(e, rng, -0.3f, 0.3f);
          expect_matches_reference(c, l, t, bias);
        }
      }
    }
  }
  EXPECT_GT(case_index, 400);  // the loops above did run
}

// DeepSeekV3 with groups, a bias and a scaling factor.
TEST(RoutingGpu, GroupedDeepSeekV3) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (int n_group : {2, 4, 8, 16}) {
    for (int topk_group : {1, n_group / 2, std::min(8, n_group)}) {
      for (int e : {64, 160, 256, 384, 1024}) {
        for (int k : {1, 6, 8, 22}) {
          for (LogitsType type : kTypes) {
            const RoutingConfig c = grouped_deepseek(e, k, n_group, topk_group, type);
            if (!test::legal_routing(c)) continue;
            const int t = cases++ % 2 ? 100 : 33;
            SCOPED_TRACE(describe(c, t));
            const Logits l = make_logits(uniform(static_cast<std::size_t>(t) * e, rng, -4, 4), c);
            // A bias as large as the scores, so that it moves groups around.
            expect_matches_reference(c, l, t, uniform(e, rng, -1, 1));
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

// The split kernel's sorted DeepSeek rounds (from
// routing_shape::kSortFromTokensDeepSeek tokens), most of them on the kept
// halves (rounds_by_kept_halves: the kept groups' lanes spread two to one).
TEST(RoutingGpu, GroupedDeepSeekV3WhereRunsSort) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int t = routing_shape::kSortFromTokensDeepSeek + 1;
  int cases = 0, halves = 0;
  for (int n_group : {2, 4, 8, 16}) {
    for (int topk_group : {1, n_group / 2, n_group}) {
      for (int e : {64, 256}) {
        for (int k : {6, 8, 22}) {
          const RoutingConfig c = grouped_deepseek(e, k, n_group, topk_group,
                                                   cases % 2 ? LogitsType::BF16 : LogitsType::F32);
          if (!test::legal_routing(c)) continue;
          RoutingParams rp;
          rp.config = c;
          const int slots = routing_detail::slots_per_lane(e);
          ASSERT_TRUE(routing_shape::split_sorts_runs(slots, k, t, true, 0));
          halves += routing_detail::compacts_kept_lanes(routing_detail::make_routing_kernel_params(rp),
                                                        slots);
          ++cases;
          SCOPED_TRACE(describe(c, t));
          const Logits l = make_logits(uniform(static_cast<std::size_t>(t) * e, rng, -4, 4), c);
          expect_matches_reference(c, l, t, uniform(e, rng, -1, 1));
        }
      }
    }
  }
  EXPECT_GT(cases, 30);
  EXPECT_GT(halves, 15);
}

TEST(RoutingGpu, AdversarialLogits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (RoutingPolicy policy : kPolicies) {
    for (LogitsType type : kTypes) {
      for (int e : {8, 64, 160, 256, 1024}) {
        for (int k : {1, 4, 8}) {
          for (int bias_kind = 0; bias_kind < (is_deepseek(policy) ? 3 : 1); ++bias_kind) {
            RoutingConfig c;
            c.policy = policy;
            c.num_experts = e;
            c.top_k = k;
            c.logits_type = type;
            c.has_bias = bias_kind > 0;
            c = with_groups(c);
            if (!test::legal_routing(c)) continue;
            const int t = 4 * test::kAdversarialPatterns;
            SCOPED_TRACE(describe(c, t) + " bias_kind " + std::to_string(bias_kind));
            std::vector<float> values = test::adversarial_logits(t, e, k, rng);
            const std::vector<float> bias = test::adversarial_bias(e, bias_kind == 2, rng);
            expect_matches_reference(c, make_logits(std::move(values), c), t, bias);
          }
        }
      }
    }
  }
}

TEST(RoutingGpu, LargeTokenCount) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int t = 16384 + 5;  // not a whole number of blocks
  for (RoutingPolicy policy : {RoutingPolicy::Renormalize, RoutingPolicy::DeepSeekV3}) {
    RoutingConfig c;
    c.policy = policy;
    c.num_experts = 256;
    c.top_k = 8;
    c.logits_type = policy == RoutingPolicy::Renormalize ? LogitsType::BF16 : LogitsType::F32;
    c.has_bias = is_deepseek(policy);
    c = with_groups(c);
    ASSERT_TRUE(test::legal_routing(c));
    SCOPED_TRACE(describe(c, t));
    const Logits l = make_logits(uniform(static_cast<std::size_t>(t) * 256, rng, -4, 4), c);
    expect_matches_reference(c, l, t, uniform(256, rng, -0.2f, 0.2f));
  }
}

// The split kernel weighs a block's tokens together from
// routing_shape::split_batch_min_tokens on (chosen_weight's segments): the
// hard rows there, every policy, K from 1 to 22 (one to four weighing
// warps, W = K and W > K), and a last block of 3 tokens.
TEST(RoutingGpu, AdversarialLogitsWhereBlocksWeighTogether) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (RoutingPolicy policy : kPolicies) {
    if (policy == RoutingPolicy::TopK) continue;  // never batched
    const int t = routing_shape::split_batch_min_tokens(split_weight(policy)) + 3;
    {
      RoutingConfig probe;
      probe.policy = policy;
      probe.num_experts = 64;
      probe.top_k = 1;
      ASSERT_TRUE(split_plan(probe, t).split_batched) << "UNIMOE_SPLIT_BATCH_MIN_TOKENS set?";
    }
    for (int k : {1, 3, 8, 22}) {
      RoutingConfig c;
      c.policy = policy;
      c.num_experts = 64;
      c.top_k = policy == RoutingPolicy::Llama4 ? 1 : k;
      c.logits_type = k == 3 ? LogitsType::BF16 : LogitsType::F32;
      c.has_bias = is_deepseek(policy);
      c.routed_scaling_factor = is_deepseek(policy) ? 2.5f : 1.0f;
      c = with_groups(c);
      if (!test::legal_routing(c) || (policy == RoutingPolicy::Llama4 && k > 1)) continue;
      SCOPED_TRACE(describe(c, t));
      std::vector<float> values = test::adversarial_logits(t, c.num_experts, c.top_k, rng);
      const std::vector<float> bias = test::adversarial_bias(c.num_experts, k == 8, rng);
      expect_matches_reference(c, make_logits(std::move(values), c), t, bias);
      ++cases;
    }
  }
  EXPECT_GT(cases, 25);
}

TEST(RoutingGpu, HandComputedSigmoidSaturation) {
  UNIMOE_REQUIRE_GPU();
  // x = [20, 30]: sigmoid rounds both to 1.0f. Policies that select on x pick
  // expert 1; DeepSeek keys on the fp32 score, a tie, so expert 0 wins.
  for (RoutingPolicy policy : {RoutingPolicy::Sigmoid, RoutingPolicy::MiniMax2}) {
    RoutingConfig c;
    c.policy = policy;
    c.num_experts = 2;
    c.top_k = 1;
    const Logits l = make_logits({20.0f, 30.0f}, c);
    const DeviceRouting got = route_on_device(c, l, 1, {});
    EXPECT_EQ(got.ids[0], policy == RoutingPolicy::Sigmoid ? 1 : 0) << to_string(policy);
    EXPECT_EQ(got.weights[0], 1.0f) << to_string(policy);
    expect_matches_reference(c, l, 1, {});
  }
}

// DeepSeek keys that tie or differ in the last few ulps
// (test::near_tie_logits): the ids must still be the reference's, ties to
// the lower expert.
TEST(RoutingGpu, DeepSeekNearTiesMatchTheReference) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (int e : {64, 256, 384})
    for (int k : {1, 8, 22})
      for (bool bias : {false, true}) {
        RoutingConfig c;
        c.policy = RoutingPolicy::DeepSeekV3;
        c.num_experts = e;
        c.top_k = k;
        c.has_bias = bias;
        c.routed_scaling_factor = 2.5f;
        c = with_groups(c);
        if (!test::legal_routing(c)) continue;
        const int t = 301;
        SCOPED_TRACE(describe(c, t));
        const Logits l = make_logits(test::near_tie_logits(t, e, k, rng), c);
        // One bias for every expert keeps the ties.
        expect_matches_reference(c, l, t, std::vector<float>(e, 0.125f));
        ++cases;
      }
  EXPECT_GT(cases, 10);
}

// Every 61st fp32 bit pattern from `first` on: sigmoid_fp32 on the device.
__global__ void sigmoid_fp32_kernel(uint32_t first, int n, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = sigmoid_fp32(__uint_as_float(first + 61u * static_cast<uint32_t>(i)));
}

// DeepSeek's score is the same fixed fp32 sequence on both sides
// (core/sigmoid_fp32.h): the device's bits must be the host's, for about 70
// million inputs over the whole float range (NaN, infinities and subnormals
// included). A contracted multiply-add or a different division would show.
TEST(RoutingGpu, DeepSeekScoreIsTheHostsBitForBit) {
  UNIMOE_REQUIRE_GPU();
  constexpr int kPerLaunch = 1 << 24;
  DeviceBuffer<float> out(kPerLaunch);
  int64_t checked = 0, mismatches = 0;
  std::string first;
  for (uint64_t start = 0; start < (1ull << 32); start += 61ull * kPerLaunch) {
    const int n = static_cast<int>(std::min<uint64_t>(kPerLaunch, ((1ull << 32) - start + 60) / 61));
    out.poison();
    sigmoid_fp32_kernel<<<(n + 255) / 256, 256>>>(static_cast<uint32_t>(start), n, out.get());
    UNIMOE_CUDA_CHECK(cudaGetLastError());
    const std::vector<float> got = out.download();
    for (int i = 0; i < n; ++i) {
      const uint32_t x_bits = static_cast<uint32_t>(start) + 61u * static_cast<uint32_t>(i);
      float x, want = 0;
      std::memcpy(&x, &x_bits, sizeof x);
      want = sigmoid_fp32(x);
      ++checked;
      if (std::memcmp(&got[i], &want, sizeof want) != 0) {
        if (mismatches++ == 0)
          first = "x = " + std::to_string(x) + " (bits " + std::to_string(x_bits) + "): device " +
                  std::to_string(got[i]) + ", host " + std::to_string(want);
      }
    }
  }
  EXPECT_GT(checked, 70000000);
  EXPECT_EQ(mismatches, 0) << first;
}

// sigmoid_fp32's device reciprocal (rcp.rn's fast path without its branch)
// against rcp.rn itself for every float a in [1, 2^126), the denominators
// 1 + exp(-x) it serves: counts the differences on the device.
__global__ void reciprocal_mismatches_kernel(unsigned long long* mismatches) {
  constexpr uint32_t kOne = 0x3f800000u, kEnd = 0x7e800000u;  // 1, 2^126
  unsigned long long local = 0;
  for (uint32_t u = kOne + blockIdx.x * blockDim.x + threadIdx.x; u < kEnd;
       u += gridDim.x * blockDim.x) {
    const float a = __uint_as_float(u);
    local += __float_as_uint(sigmoid_fp32_detail::rcp_rn(a)) != __float_as_uint(__frcp_rn(a));
  }
  if (local != 0) atomicAdd(mismatches, local);
}

TEST(RoutingGpu, SigmoidReciprocalIsCorrectlyRoundedOnEveryDenominator) {
  UNIMOE_REQUIRE_GPU();
  DeviceBuffer<unsigned long long> mismatches(1);
  UNIMOE_CUDA_CHECK(cudaMemset(mismatches.get(), 0, sizeof(unsigned long long)));
  reciprocal_mismatches_kernel<<<1024, 256>>>(mismatches.get());
  UNIMOE_CUDA_CHECK(cudaGetLastError());
  EXPECT_EQ(mismatches.download()[0], 0ull);
}

// approx_score against deepseek_score for every float: the largest
// difference, on the device (NaN, should one arise, wins the maximum).
__global__ void approx_score_error_kernel(uint32_t* worst_bits) {
  float worst = 0.0f;
  for (uint64_t u = blockIdx.x * blockDim.x + threadIdx.x; u < (1ull << 32);
       u += gridDim.x * blockDim.x) {
    const float x = __uint_as_float(static_cast<uint32_t>(u));
    const float d = fabsf(routing_detail::approx_score(x) - routing_detail::deepseek_score(x));
    if (!(d <= worst)) worst = d;
  }
  atomicMax(worst_bits, __float_as_uint(worst));
}

TEST(RoutingGpu, ApproxScoreIsWithinItsBoundOfEveryScore) {
  UNIMOE_REQUIRE_GPU();
  DeviceBuffer<uint32_t> worst_bits(1);
  UNIMOE_CUDA_CHECK(cudaMemset(worst_bits.get(), 0, sizeof(uint32_t)));
  approx_score_error_kernel<<<2048, 256>>>(worst_bits.get());
  UNIMOE_CUDA_CHECK(cudaGetLastError());
  const uint32_t bits = worst_bits.download()[0];
  float worst;
  std::memcpy(&worst, &bits, sizeof worst);
  std::cout << "largest |approx_score - deepseek_score| over every float: " << worst << "\n";
  EXPECT_LE(worst, routing_detail::kApproxScoreError);
}

TEST(RoutingGpu, NoTokensLaunchesNothing) {
  UNIMOE_REQUIRE_GPU();
  RoutingConfig c;
  c.num_experts = 64;
  c.top_k = 4;
  DeviceBuffer<int32_t> ids(16);
  DeviceBuffer<float> weights(16);
  ids.poison();
  weights.poison();
  RoutingParams p;
  p.config = c;
  p.num_tokens = 0;
  p.topk_ids = ids.get();
  p.topk_weights = weights.get();
  launch_routing(p, split_plan(c, 0), nullptr);  // no logits needed for T = 0
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
  for (int32_t v : ids.download()) EXPECT_EQ(v, -1);  // still the poison
}

TEST(RoutingGpu, RejectsConfigsBeyondTheKernel) {
  UNIMOE_REQUIRE_GPU();
  DeviceBuffer<float> logits(2048);
  DeviceBuffer<int32_t> ids(64);
  DeviceBuffer<float> weights(64);
  auto params = [&](int e, int k, int n_group) {
    RoutingParams p;
    p.logits = logits.get();
    p.num_tokens = 1;
    p.config.num_experts = e;
    p.config.top_k = k;
    p.config.policy = n_group > 1 ? RoutingPolicy::DeepSeekV3 : RoutingPolicy::Renormalize;
    p.config.n_group = n_group;
    p.config.topk_group = 1;
    p.topk_ids = ids.get();
    p.topk_weights = weights.get();
    return p;
  };
  EXPECT_THROW(launch_routing(params(1025, 4, 1), split_plan(params(1025, 4, 1).config, 1), nullptr), std::invalid_argument);
  EXPECT_THROW(launch_routing(params(256, 33, 1), split_plan(params(256, 33, 1).config, 1), nullptr), std::invalid_argument);
  EXPECT_THROW(launch_routing(params(8, 9, 1), split_plan(params(8, 9, 1).config, 1), nullptr), std::invalid_argument);
  EXPECT_THROW(launch_routing(params(64, 2, 32), split_plan(params(64, 2, 32).config, 1), nullptr), std::invalid_argument);
  EXPECT_NO_THROW(launch_routing(params(1024, 32, 1), split_plan(params(1024, 32, 1).config, 1), nullptr));
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace unimoe
