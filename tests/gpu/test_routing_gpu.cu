// Routing kernels against the CPU reference (ref::route): every policy, fp32
// and bf16 logits, random and adversarial rows, grouped DeepSeekV3, large T.
// Metric: ids exact (position by position), weights within 1e-6 relative
// (the kernel computes them in double, as the reference does). Outputs are
// poisoned before every launch, so a weight or id never written fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "core/routing_launch_shape.h"
#include "core/sigmoid_fp32.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_plan_util.h"
#include "gpu/routing_test_util.h"
#include "plan/routing_plan.h"
#include "kernels/routing/routing.cuh"
#include "kernels/routing/routing_device.cuh"
#include "ref/ref.h"

namespace unimoe {
namespace {

// The split chain's routing kernel as the plan takes it for (c, T), with
// no permute after it (so the octet kernel writes no chunk counts).
RoutingPlan split_plan(const RoutingConfig& c, int num_tokens) {
  RoutingPlan plan = test::routing_plan(c, 0, 0, num_tokens, false, "split");
  plan.routing_counts_rows = false;
  plan.scatter_masks = false;
  return plan;
}

using test::DeviceBuffer;

constexpr double kWeightTolerance = 1e-6;

constexpr RoutingPolicy kPolicies[] = {
    RoutingPolicy::Default,     RoutingPolicy::Renormalize,   RoutingPolicy::RenormalizeNaive,
    RoutingPolicy::TopK,        RoutingPolicy::Sigmoid,       RoutingPolicy::SigmoidRenorm,
    RoutingPolicy::TopKSigmoid, RoutingPolicy::Llama4,        RoutingPolicy::DeepSeekV3,
    RoutingPolicy::MiniMax2};
constexpr LogitsType kTypes[] = {LogitsType::F32, LogitsType::BF16};
constexpr int kExperts[] = {8, 64, 128, 160, 256, 384, 1024};
constexpr int kTopKs[] = {1, 2, 4, 6, 8, 22, 32};
constexpr int kTokens[] = {1, 2, 3, 7, 33, 100, 1000, 4096};
constexpr long kMaxLogitsPerCase = 1 << 18;

bool is_deepseek(RoutingPolicy p) {
  return p == RoutingPolicy::DeepSeekV3 || p == RoutingPolicy::MiniMax2;
}

std::string describe(const RoutingConfig& c, int num_tokens) {
  return to_string(c.policy) + " " + to_string(c.logits_type) + " E=" +
         std::to_string(c.num_experts) + " K=" + std::to_string(c.top_k) + " T=" +
         std::to_string(num_tokens) + " n_group=" + std::to_string(c.n_group) +
         " topk_group=" + std::to_string(c.topk_group) + (c.has_bias ? " bias" : "");
}

using test::grouped_deepseek;
using test::Logits;
using test::make_logits;

struct DeviceRouting {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// misalign: the logits start that many elements into their allocation
// (rows then miss 16-byte alignment: the kernels' narrow-load paths).
DeviceRouting route_on_device(const RoutingConfig& c, const Logits& l, int num_tokens,
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

bool weight_close(float got, float want) {
  if (std::isnan(got) || std::isnan(want)) return false;
  if (std::isinf(want)) return got == want;
  return std::fabs(static_cast<double>(got) - want) <=
         kWeightTolerance * std::fabs(want) + FLT_MIN;
}

// Compares every id and weight; reports the count and the first mismatch.
void expect_matches_reference(const RoutingConfig& c, const Logits& l, int num_tokens,
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

std::vector<float> uniform(std::size_t n, std::mt19937_64& rng, float lo, float hi) {
  return test::random_vector(n, rng, lo, hi);
}

// The DeepSeek variant a test uses for E: grouped (8 groups, 4 kept) where
// that is legal, else one group.
RoutingConfig with_groups(RoutingConfig c) {
  if (c.policy != RoutingPolicy::DeepSeekV3) return c;
  c.n_group = 8;
  c.topk_group = 4;
  if (!test::legal_routing(c)) c.n_group = c.topk_group = 1;
  return c;
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

// A T the octet kernel routes, plus `extra`: in its filter mode
// (routing_shape::octets_filter, for aligned logits) where `filter` and the
// shape has one, else in its exact mode where the shape has one below the
// filter's bound.
int octet_tokens(int e, int k, int n_group, bool filter, int extra) {
  const int octets = routing_shape::octets_from_tokens(e, k, n_group > 1);
  const int from = routing_shape::octet_filter_from_tokens(e, n_group > 1);
  return (filter && from > 0 ? std::max(octets, from) : octets) + extra;
}

// The octet kernel (routing_octets.cu; from routing_shape::octets_from_tokens
// tokens): every E and n_group it serves, K 1..8, kept groups from one to
// all, fp32 and bf16, MiniMax2, its filter and exact modes (octet_tokens);
// T leaves a partial last block and warp. Every fourth case has a hot
// expert (ahead in every token); every third case's logits are not
// 16-byte aligned (the exact mode, whatever T).
TEST(RoutingGpu, DeepSeekOctets) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (int e : {64, 128, 256, 384}) {
    for (int k : {1, 2, 3, 6, 8}) {
      for (int n_group : {0, 1, 2, 4, 8}) {  // 0: MiniMax2
        for (int topk_group : {1, std::max(1, n_group / 2), std::max(1, n_group)}) {
          if (n_group <= 1 && topk_group != 1) continue;
          RoutingConfig c = grouped_deepseek(e, k, std::max(1, n_group), topk_group,
                                             cases % 2 ? LogitsType::BF16 : LogitsType::F32);
          if (n_group == 0) c.policy = RoutingPolicy::MiniMax2;
          if (!test::legal_routing(c)) continue;
          const int t = octet_tokens(e, k, c.n_group, cases % 2 == 0, 13);  // both modes
          RoutingParams rp;
          rp.config = c;
          rp.num_tokens = t;
          ASSERT_EQ(split_plan(c, t).kernel, RoutingKernel::SplitOctets)
              << "UNIMOE_SPLIT_OCTETS_MIN_TOKENS set?";
          SCOPED_TRACE(describe(c, t));
          std::vector<float> values = uniform(static_cast<std::size_t>(t) * e, rng, -4, 4);
          if (cases % 4 == 3) {
            const int hot = static_cast<int>(rng() % static_cast<uint64_t>(e));
            for (int i = 0; i < t; ++i) values[static_cast<std::size_t>(i) * e + hot] += 8.0f;
          }
          const Logits l = make_logits(std::move(values), c);
          const int misalign = cases % 3 == 2 ? 1 : 0;  // the unaligned kernel too
          SCOPED_TRACE("logits misaligned by " + std::to_string(misalign));
          expect_matches_reference(c, l, t, uniform(e, rng, -1, 1), misalign);
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

// The octet kernel on the hard rows (ties, NaN, infinities, all equal: more
// candidates than its list holds, so K octet rounds instead; in the filter
// mode, exact keys for the warp first), with finite and non-finite biases,
// in both modes.
TEST(RoutingGpu, AdversarialLogitsOfOctets) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (RoutingPolicy policy : {RoutingPolicy::DeepSeekV3, RoutingPolicy::MiniMax2}) {
    for (int e : {64, 256, 384}) {
      for (int k : {1, 4, 8}) {
        for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {
          RoutingConfig c = grouped_deepseek(e, k, 1, 1, bias_kind == 1 ? LogitsType::BF16
                                                                        : LogitsType::F32);
          c.policy = policy;
          c.has_bias = bias_kind > 0;
          c = with_groups(c);
          if (!test::legal_routing(c)) continue;
          const int t = octet_tokens(e, k, c.n_group, cases % 2 == 0, 5);  // both modes
          ASSERT_TRUE(routing_shape::split_takes_octets(true, e, k, c.n_group, t, 0));
          SCOPED_TRACE(describe(c, t) + " bias_kind " + std::to_string(bias_kind));
          std::vector<float> values = test::adversarial_logits(t, e, k, rng);
          const std::vector<float> bias = test::adversarial_bias(e, bias_kind == 2, rng);
          expect_matches_reference(c, make_logits(std::move(values), c), t, bias);
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 3 * 3 * 3);
}

// The octet kernel's filter keys (approx_score) against near-ties, where the
// filter and the exact keys may order experts or groups differently: every
// token has a run of experts whose logits differ by a few ulps (mode 0), or
// groups whose two best logits do (mode 1: the kept groups are then not
// certain from the filter keys, so the warp takes the exact keys), or plain
// logits (mode 2); biases are absent or tiny (a few ulps of the keys, within
// the filter's margins). T puts each shape in the filter mode where it has
// one (E = 64 and grouped E = 128: the exact mode).
TEST(RoutingGpu, NearTiesOfOctets) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0, filter_cases = 0;
  for (int e : {64, 256, 384}) {
    for (int k : {2, 4, 8}) {
      for (int n_group : {1, 4, 8}) {
        for (LogitsType type : kTypes) {
          RoutingConfig c = grouped_deepseek(e, k, n_group, std::max(1, n_group / 2), type);
          c.has_bias = cases % 2 == 1;
          if (!test::legal_routing(c)) continue;
          const int t = octet_tokens(e, k, n_group, true, 3);  // the filter mode where it is
          ASSERT_TRUE(routing_shape::split_takes_octets(true, e, k, n_group, t, 0));
          filter_cases += routing_shape::octets_filter(e, n_group, t, 0);
          SCOPED_TRACE(describe(c, t));
          std::vector<float> values = uniform(static_cast<std::size_t>(t) * e, rng, -4, 0);
          for (int i = 0; i < t; ++i) {
            float* row = values.data() + static_cast<std::size_t>(i) * e;
            const float v = std::uniform_real_distribution<float>(0.5f, 3.0f)(rng);
            if (i % 3 == 0) {  // a run of near-equal experts, anywhere
              for (int n = 0; n < 3 * k / 2 + 2; ++n)
                row[rng() % static_cast<uint64_t>(e)] =
                    v + static_cast<float>(rng() % 4) * std::numeric_limits<float>::epsilon();
            } else if (i % 3 == 1) {  // every group's two best, near-equal across groups
              const int per_group = e / n_group;
              for (int g = 0; g < n_group; ++g) {
                row[g * per_group + static_cast<int>(rng() % static_cast<uint64_t>(per_group))] =
                    v + static_cast<float>(rng() % 3) * std::numeric_limits<float>::epsilon();
                row[g * per_group + static_cast<int>(rng() % static_cast<uint64_t>(per_group))] =
                    v - 0.5f;
              }
            } else {
              for (int j = 0; j < e; ++j) row[j] = std::uniform_real_distribution<float>(-4, 4)(rng);
            }
          }
          const std::vector<float> bias = uniform(e, rng, -3e-7f, 3e-7f);
          expect_matches_reference(c, make_logits(std::move(values), c), t, bias);
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 30);
  EXPECT_GT(filter_cases, 10);  // the filter mode's shapes are among them
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
