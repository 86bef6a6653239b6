// The split routing's octet kernel (routing_octets.cu) against the CPU
// reference: every E and n_group it serves, its filter and exact modes, hard
// rows and near ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "core/routing_launch_shape.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_gpu_cases.h"
#include "kernels/routing/routing_device.cuh"

namespace unimoe {
namespace {

using test::describe;
using test::expect_matches_reference;
using test::grouped_deepseek;
using test::kTypes;
using test::Logits;
using test::make_logits;
using test::split_plan;
using test::uniform;
using test::with_groups;

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

}  // namespace
}  // namespace unimoe
