// The decode kernels' selection ways through the fused and cluster variants:
// the threshold at its list bound, the wide choice, the direct keys, the
// fixed choice and the ranked threshold, on and off where a setting turns
// them, held to the reference and, bit for bit, to the split launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "core/routing_launch_shape.h"
#include "gpu/fused_routing_cases.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_plan_util.h"
#include "gpu/routing_test_util.h"
#include "kernels/routing/routing_device.cuh"

namespace unimoe {
namespace {

using test::check_fused_and_split;
using test::kTypes;
using test::legal_routing;
using test::make_routing;
using test::ScopedDev;
using test::ScopedSpread;
using test::spread_serves;
using Problem = test::RoutingProblem;
using Inputs = test::RoutingInputs;

// The decode kernels' threshold selection (rounds_by_threshold) ranks at
// most 32 candidates, the keys at or above the K-th largest of the lanes'
// best keys, and takes the K rounds beyond: rows where `tied` experts share
// the largest logit (the rest random below it) give exactly `tied`
// candidates where they lie on at least K lanes, so 32 ranks them and 33
// falls back. Both sides, from the single block (T = 1, 7) and the cluster
// kernels (T = 33, 100), against split and the reference, where the kernels
// take it (E > 128, K = 8 and 16, and the ranked form at E = 100 and 128
// without groups: threshold_serves) and where they do not (K = 22).
TEST(FusedRoutingGpu, ThresholdSelectionAtItsListBound) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0, served = 0;
  for (RoutingPolicy policy :
       {RoutingPolicy::TopK, RoutingPolicy::Renormalize, RoutingPolicy::DeepSeekV3})
    for (int e : {100, 128, 160, 256, 512, 1024})
      for (int k : {8, 16, 22})
        for (int tied : {k, 31, 32, 33, 40}) {
          const RoutingConfig c = make_routing(policy, e, k, LogitsType::F32, false);
          if (!legal_routing(c) || tied > e) continue;
          const int t = std::array<int, 4>{1, 7, 33, 100}[cases++ % 4];
          SCOPED_TRACE("tied " + std::to_string(tied));
          std::vector<float> logits = test::random_vector(std::size_t(t) * e, rng, -4, 3);
          std::vector<int> experts(e);
          for (int i = 0; i < t; ++i) {
            std::iota(experts.begin(), experts.end(), 0);
            std::shuffle(experts.begin(), experts.end(), rng);
            for (int j = 0; j < tied; ++j) logits[std::size_t(i) * e + experts[j]] = 3.5f;
          }
          const Problem pr{c, t};
          check_fused_and_split(pr, test::logits_inputs(pr, std::move(logits),
                                                        std::vector<float>(e, 0.0f)));
          const bool grouped = c.policy == RoutingPolicy::DeepSeekV3 && c.n_group > 1;
          served += routing_shape::threshold_serves(k, routing_shape::slots_for_experts(e),
                                                    test::is_deepseek(policy),
                                                    grouped ? c.topk_group : 1,
                                                    grouped ? e / c.n_group : e);
        }
  EXPECT_GT(cases, 100);
  // Both ways ran: the threshold kernels and the rounds.
  EXPECT_GT(served, cases / 3);
  EXPECT_LT(served, cases);
}

// The wide choice for a scope.
struct ScopedWideChoice : ScopedDev<WideChoice> {
  explicit ScopedWideChoice(WideChoice setting) : ScopedDev(&DevOverrides::wide_choice, setting) {}
};

// Whether the DeepSeek kernels take the wide choice (routing_wide.cuh) for
// pr through the cluster variant without the spread kernel: the launch
// shape's routing CTAs (or the single block, in its one-piece way) seat
// their tokens at E / 32 warps each.
bool wide_serves(const Problem& pr) {
  const RoutingConfig& c = pr.config;
  if (!test::is_deepseek(c.policy)) return false;
  const int parts = routing_shape::wide_parts(c.num_experts, c.n_group, c.num_experts / c.n_group);
  // The device's clusters of 16 assumed (the H200 runs them); the test
  // turns the wide choice on everywhere, so 1 token a routing CTA (E <= 512:
  // the wide kernels exist).
  const routing_shape::LaunchShape shape = routing_shape::launch_shape(
      routing_detail::slots_per_lane(c.num_experts), pr.num_tokens, pr.local(), c.num_experts, true,
      true, routing_shape::cluster_min_tokens_by_default(true, c.num_experts, parts > 0),
      routing_shape::cluster_max_ctas_by_default(true, c.num_experts));
  const int warps = shape.threads / routing_shape::kWarp;
  if (shape.routing_ctas == 1)
    return pr.num_tokens * c.top_k <= routing_shape::kWarp && pr.num_tokens < warps &&
           routing_shape::wide_fits(pr.num_tokens, parts, warps,
                                    routing_shape::kWideMaxTokensBlock);
  const int per_cta = routing_shape::tokens_per_routing_cta(pr.num_tokens, shape.routing_ctas + 1);
  return shape.overlapped &&
         routing_shape::wide_fits(per_cta, parts, warps, routing_shape::kWideMaxTokensCluster);
}

// The wide choice: E / 32 warps a token, a thread an expert, each group a
// part of 32 (DeepSeekV3 E = 64, 128, 256, 512 at 2..16 groups), K 1..22
// (so each part's floor is its 1st to 11th best), kept groups 1..8. Random,
// near-tie and adversarial rows (ties, NaN, infinities; a non-finite bias
// on every other shape), from the single block (T <= 4), the cluster's
// routing CTAs (up to 2 tokens a CTA take it, 3 and 4 do not; 1 a CTA up
// to T = 15 in the clusters of 16 of E >= 128, 7 in those of 8 at E=64,
// then 2 up to 30 and 14) and the
// spread kernel (T = 5, 17, 64, forced), held to split bit for bit and to
// the reference. Most cases outside the spread kernel must take it.
TEST(FusedRoutingGpu, WideChoiceOverItsSeats) {
  UNIMOE_REQUIRE_GPU();
  ScopedWideChoice wide(WideChoice::kEverywhere);  // by default only where measured faster
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Shape {
    int e, k, n_group, topk_group;
  };
  const Shape shapes[] = {{256, 8, 8, 4}, {256, 8, 8, 1},  {256, 4, 8, 4}, {256, 22, 8, 8},
                          {64, 1, 2, 1},  {64, 22, 2, 1},  {128, 8, 4, 2}, {512, 22, 16, 3}};
  int cases = 0, served = 0, shape_index = 0;
  for (const Shape& sh : shapes) {
    const RoutingConfig c =
        test::grouped_deepseek(sh.e, sh.k, sh.n_group, sh.topk_group, LogitsType::F32);
    ASSERT_TRUE(legal_routing(c)) << "E=" << sh.e << " n_group=" << sh.n_group;
    ASSERT_GT(routing_shape::wide_parts(sh.e, sh.n_group, sh.e / sh.n_group), 0);
    const bool odd_bias = shape_index++ % 2 == 1;
    for (int t : {1, 2, 4, 5, 16, 30, 31}) {
      if (t * sh.k > kFusedMaxRows) continue;
      for (int kind = 0; kind < 3; ++kind) {
        SCOPED_TRACE("kind " + std::to_string(kind));
        const Problem pr{c, t};
        const std::size_t n = std::size_t(t) * sh.e;
        std::vector<float> logits = kind == 0   ? test::random_vector(n, rng, -4, 4)
                                    : kind == 1 ? test::near_tie_logits(t, sh.e, sh.k, rng)
                                                : test::adversarial_logits(t, sh.e, sh.k, rng);
        check_fused_and_split(pr, test::logits_inputs(pr, std::move(logits),
                                                      test::adversarial_bias(sh.e, odd_bias, rng)));
        served += wide_serves(pr);
        ++cases;
      }
    }
    ScopedSpread spread({true, 0, 1});
    for (int t : {5, 17, 64}) {
      const Problem pr{c, t};
      if (t * sh.k > kFusedMaxRows || !spread_serves(pr, 8)) continue;
      std::vector<float> logits = test::adversarial_logits(t, sh.e, sh.k, rng);
      check_fused_and_split(pr, test::logits_inputs(pr, std::move(logits),
                                                    test::adversarial_bias(sh.e, odd_bias, rng)));
    }
  }
  EXPECT_GT(cases, 100);
  EXPECT_GT(served, cases / 2);  // the wide choice ran on most of them
}

// The direct keys for a scope.
struct ScopedDirectKeys : ScopedDev<bool> {
  explicit ScopedDirectKeys(bool on) : ScopedDev(&DevOverrides::direct_keys, on) {}
};

// Whether the cluster variant without the spread kernel takes the
// direct-keys kernels for pr (default settings otherwise, clusters of 16
// where the device runs them, as the H200 does): DeepSeek at 8 slots a lane
// (E = 129..256), overlapped, the wide choice not seated, and more keys a
// routing CTA than threads.
bool direct_keys_serve(const Problem& pr) {
  const RoutingConfig& c = pr.config;
  if (!test::is_deepseek(c.policy) || routing_detail::slots_per_lane(c.num_experts) != 8)
    return false;
  const int parts = routing_shape::wide_parts(c.num_experts, c.n_group, c.num_experts / c.n_group);
  const bool wide_default = parts > 0 && routing_shape::wide_by_default(parts, c.top_k);
  const routing_shape::LaunchShape shape = routing_shape::launch_shape(
      8, pr.num_tokens, pr.local(), c.num_experts, true, true,
      routing_shape::cluster_min_tokens_by_default(true, c.num_experts, wide_default),
      routing_shape::cluster_max_ctas_by_default(true, c.num_experts));
  if (shape.routing_ctas == 1 || !shape.overlapped) return false;
  const int per_cta = routing_shape::tokens_per_routing_cta(pr.num_tokens, shape.routing_ctas + 1);
  const bool wide = wide_default && routing_shape::wide_fits(per_cta, parts,
                                                             shape.threads / routing_shape::kWarp,
                                                             routing_shape::kWideMaxTokensCluster);
  return !wide && per_cta * c.num_experts > shape.threads;
}

// The cluster kernel's routing CTAs computing DeepSeek's keys a warp a
// token (the plan's direct_keys_kernel), where the block would stage them in batches:
// DeepSeekV3 E=256 (8 groups, 4 kept) and E=160 (8 groups of 20, not whole
// lanes), MiniMax2 E=256 (one group), K = 8 and 6, T = 61..120 (clusters of
// 16: 5..8 tokens a routing CTA), random, near-tie and adversarial rows
// with an adversarial bias, with an EP range on some; each case with the
// direct keys on and off, held to split bit for bit and to the reference.
// Most cases must take the direct kernels.
TEST(FusedRoutingGpu, DirectKeysWhereKeysWouldBatch) {
  UNIMOE_REQUIRE_GPU();
  ScopedSpread spread({false, 0, 0});
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Shape {
    RoutingConfig config;
    int local_offset, num_local;  // num_local 0: every expert
  };
  const Shape shapes[] = {
      {test::grouped_deepseek(256, 8, 8, 4, LogitsType::F32), 0, 0},
      {test::grouped_deepseek(256, 8, 8, 4, LogitsType::BF16), 64, 128},
      {test::grouped_deepseek(160, 6, 8, 4, LogitsType::F32), 0, 0},
      {make_routing(RoutingPolicy::MiniMax2, 256, 8, LogitsType::BF16, true), 0, 0},
  };
  int cases = 0, served = 0;
  for (const Shape& sh : shapes) {
    const RoutingConfig& c = sh.config;
    ASSERT_TRUE(legal_routing(c));
    for (const int t : {61, 64, 65, 80, 97, 120})
      for (int kind = 0; kind < 3; ++kind) {
        SCOPED_TRACE("T=" + std::to_string(t) + " kind " + std::to_string(kind));
        const Problem pr{c, t, sh.local_offset, sh.num_local};
        const std::size_t n = std::size_t(t) * c.num_experts;
        std::vector<float> logits = kind == 0 ? test::random_vector(n, rng, -4, 4)
                                    : kind == 1
                                        ? test::near_tie_logits(t, c.num_experts, c.top_k, rng)
                                        : test::adversarial_logits(t, c.num_experts, c.top_k, rng);
        const Inputs in = test::logits_inputs(
            pr, std::move(logits), test::adversarial_bias(c.num_experts, kind == 2, rng));
        for (const bool on : {true, false}) {
          SCOPED_TRACE(on ? "direct keys" : "staged keys");
          ScopedDirectKeys direct(on);
          check_fused_and_split(pr, in);
        }
        served += direct_keys_serve(pr);
        ++cases;
      }
  }
  EXPECT_EQ(cases, 72);
  EXPECT_GT(served, cases * 2 / 3);
}

// The fixed choice for a scope.
struct ScopedFixedChoice : ScopedDev<bool> {
  explicit ScopedFixedChoice(bool on) : ScopedDev(&DevOverrides::fixed_choice, on) {}
};

// The fixed choice (routing_fixed.cuh: DeepSeek-V3/R1's E=256, 8 groups, 4
// kept, K=8 compiled in) wherever the decode kernels take it: the single
// block (T <= 2), the cluster's routing CTAs from staged keys (T = 3..60)
// and from direct keys (T = 61..120), the spread kernel (T >= 121), with it
// on and off (the group stage and rounds_by_threshold), held to split bit
// for bit and to the reference. Random, near-tie and adversarial rows with
// an adversarial (on some, non-finite) bias; tied rows: every logit equal
// (all 128 kept keys tie: past 32 candidates, so the rounds run), or 40 or
// 32 experts sharing the top logit, spread over the groups at random (the
// kept groups' candidates near 32, on either side of it); fp32 and bf16;
// an EP range with off-rank rows.
TEST(FusedRoutingGpu, FixedChoiceWhereItRuns) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ASSERT_TRUE(test::routing_dev().fixed_choice);  // on by default
  int cases = 0;
  for (const LogitsType type : kTypes)
    for (const int t : {1, 2, 3, 5, 16, 33, 60, 61, 64, 100, 121, 200})
      for (int kind = 0; kind < 5; ++kind) {
        SCOPED_TRACE("T=" + std::to_string(t) + " kind " + std::to_string(kind));
        const RoutingConfig c = test::grouped_deepseek(256, 8, 8, 4, type);
        ASSERT_TRUE(legal_routing(c));
        ASSERT_TRUE(routing_shape::fixed_choice_serves(256, 8, 4, 8));
        const bool ep = (cases % 3) == 2;
        const Problem pr{c, t, ep ? 64 : 0, ep ? 96 : 0};
        const std::size_t n = std::size_t(t) * 256;
        std::vector<float> logits;
        if (kind == 0) logits = test::random_vector(n, rng, -4, 4);
        if (kind == 1) logits = test::near_tie_logits(t, 256, 8, rng);
        if (kind == 2) logits = test::adversarial_logits(t, 256, 8, rng);
        if (kind >= 3) {
          // Ties: token i's first `tied` experts of a shuffled order share
          // the top logit (every logit for i % 3 == 0), the rest below.
          logits = test::random_vector(n, rng, -4, 2);
          std::vector<int> experts(256);
          for (int i = 0; i < t; ++i) {
            std::iota(experts.begin(), experts.end(), 0);
            std::shuffle(experts.begin(), experts.end(), rng);
            const int tied = i % 3 == 0 ? 256 : kind == 3 ? 40 : 32;
            for (int j = 0; j < tied; ++j) logits[std::size_t(i) * 256 + experts[j]] = 3.0f;
          }
        }
        const std::vector<float> bias =
            kind >= 3 ? std::vector<float>(256, 0.0f) : test::adversarial_bias(256, kind == 2, rng);
        const Inputs in = test::logits_inputs(pr, std::move(logits), bias);
        for (const bool on : {true, false}) {
          SCOPED_TRACE(on ? "fixed choice" : "group stage and threshold");
          ScopedFixedChoice fixed(on);
          check_fused_and_split(pr, in);
        }
        ++cases;
      }
  EXPECT_EQ(cases, 2 * 12 * 5);
  EXPECT_TRUE(test::routing_dev().fixed_choice);  // restored
}

// The ranked threshold for a scope.
struct ScopedRankedThreshold : ScopedDev<bool> {
  explicit ScopedRankedThreshold(bool on) : ScopedDev(&DevOverrides::ranked_threshold, on) {}
};

// The ranked threshold's kernels (4 strided slots a lane, E = 65..128, K =
// 8..21: rounds_by_ranked_threshold) wherever they run: the single block,
// the cluster kernel (overlapped and whole) and the spread kernel, T from
// 1 to 190 (T * K at most 4,096), with the setting on and off (the
// rounds), held to split bit for bit and to the reference. The seven policies without groups that take
// K > 1, fp32 and bf16; random, near-tie and adversarial rows (NaN, +-inf,
// huge magnitudes); rows where 32 or 33 experts share the top logit (the
// list's bound: 32 candidates are ranked, 33 take the rounds) and rows of
// one value (every expert a candidate: the rounds); an EP range.
TEST(FusedRoutingGpu, RankedThresholdWhereItRuns) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ASSERT_TRUE(test::routing_dev().ranked_threshold);  // on by default
  constexpr RoutingPolicy kPolicies[] = {
      RoutingPolicy::Renormalize, RoutingPolicy::TopK,          RoutingPolicy::Default,
      RoutingPolicy::Sigmoid,     RoutingPolicy::RenormalizeNaive, RoutingPolicy::SigmoidRenorm,
      RoutingPolicy::TopKSigmoid};
  constexpr int kExperts[] = {128, 65, 100};
  constexpr int kTopK[] = {8, 6, 16, 21, 10};  // 6: the rounds
  int cases = 0, served = 0;
  for (const LogitsType type : kTypes)
    for (const int t : {1, 3, 4, 9, 33, 64, 130, 190})
      for (int kind = 0; kind < 5; ++kind) {
        const RoutingPolicy policy = kPolicies[cases % 7];
        const int e = kExperts[cases % 3], k = kTopK[cases % 5];
        const RoutingConfig c = make_routing(policy, e, k, type, false);
        ASSERT_TRUE(legal_routing(c));
        SCOPED_TRACE("kind " + std::to_string(kind));
        const bool ep = (cases % 4) == 3;
        const Problem pr{c, t, ep ? 20 : 0, ep ? 40 : 0};
        const std::size_t n = std::size_t(t) * e;
        std::vector<float> logits;
        if (kind == 0) logits = test::random_vector(n, rng, -4, 4);
        if (kind == 1) logits = test::near_tie_logits(t, e, k, rng);
        if (kind == 2) logits = test::adversarial_logits(t, e, k, rng);
        if (kind >= 3) {
          // Token i's first `tied` experts of a shuffled order share the
          // top logit (every logit for i % 4 == 0), the rest below.
          logits = test::random_vector(n, rng, -4, 2);
          std::vector<int> experts(e);
          for (int i = 0; i < t; ++i) {
            std::iota(experts.begin(), experts.end(), 0);
            std::shuffle(experts.begin(), experts.end(), rng);
            const int tied = i % 4 == 0 ? e : kind == 3 ? 32 : 33;
            for (int j = 0; j < tied; ++j) logits[std::size_t(i) * e + experts[j]] = 3.0f;
          }
        }
        const Inputs in = test::logits_inputs(pr, std::move(logits), std::vector<float>(e, 0.0f));
        for (const bool on : {true, false}) {
          SCOPED_TRACE(on ? "ranked threshold" : "rounds");
          ScopedRankedThreshold ranked(on);
          check_fused_and_split(pr, in);
        }
        const int rows = t * k;
        served += routing_shape::threshold_serves(k, routing_shape::slots_for_experts(e), false,
                                                  1, e) &&
                  !(rows > 32 && rows <= 64);
        ++cases;
      }
  EXPECT_EQ(cases, 2 * 8 * 5);
  // Both ways ran with the setting on: the ranked kernels, and the rounds'
  // kernels where the sorted pair runs (33..64 rows).
  EXPECT_GT(served, cases / 2);
  EXPECT_LT(served, cases);
  EXPECT_TRUE(test::routing_dev().ranked_threshold);  // restored
}

}  // namespace
}  // namespace unimoe
