// The fused routing + permute kernel (launch_fused_routing_permute) against
// the CPU reference (ref::route, ref::permute, ref::make_tiles) and against
// the split launches (launch_routing + launch_permute). Metric: ids exact,
// weights within 1e-6 relative of the reference, counts, offsets, both row
// maps and every tile schedule exact; against the split launches every output
// bit for bit (both run the same per-token device code). Outputs are
// poisoned before every launch. Covers every policy, fp32 and bf16 logits,
// T 0..512, E 8..1024, grouped DeepSeekV3 with bias, an EP range with
// off-rank rows, one hot expert, precomputed ids, the largest inputs, three
// tile sizes at once, a CUDA graph replayed with new logits, and the layer
// with routing_variant "fused" and "cluster". The cluster variant (the
// plan's cluster kinds) runs on every case of check_fused_and_split
// and in the graph test, held to the split launches bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "gpu/fused_routing_rig.h"
#include "gpu/gpu_test_util.h"
#include "gpu/layer_rig.h"
#include "gpu/routing_test_util.h"
#include "kernels/routing/fused_routing.cuh"
#include "kernels/routing/routing_device.cuh"
#include "support/presets.h"
#include "ref/ref.h"
#include "ref/synthetic.h"

namespace unimoe {
namespace {

using test::check_fused_and_split;
using test::DeviceBuffer;
using test::legal_routing;
using test::make_routing;
using test::precomputed_inputs;
using test::random_inputs;
using Problem = test::RoutingProblem;
using Inputs = test::RoutingInputs;
using Outputs = test::RoutingOutputs;
using Rig = test::RoutingRig;

constexpr LogitsType kTypes[] = {LogitsType::F32, LogitsType::BF16};
constexpr int kTokens[] = {0, 1, 2, 3, 7, 33, 100, 512};
constexpr int kExperts[] = {8, 64, 128, 256, 384, 1024};
constexpr int kTopKs[] = {1, 2, 3, 4, 6, 8, 22, 32};

TEST(FusedRoutingGpu, EveryPolicyAndShape) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (RoutingPolicy policy : test::kAllPolicies)
    for (LogitsType type : kTypes)
      for (int e : kExperts)
        for (int k : kTopKs) {
          const RoutingConfig c = make_routing(policy, e, k, type, cases % 3 != 0);
          if (!legal_routing(c)) continue;
          int t = kTokens[cases++ % std::size(kTokens)];
          while (t * k > kFusedMaxRows) t /= 2;
          Problem pr{c, t};
          check_fused_and_split(pr, random_inputs(pr, rng));
        }
  EXPECT_GT(cases, 300);  // the loops did run
}

TEST(FusedRoutingGpu, GroupedDeepSeekV3WithBias) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (int n_group : {2, 4, 8, 16})
    for (int topk_group : {1, n_group / 2, std::min(8, n_group)})
      for (int e : {64, 256, 384, 1024})
        for (int k : {1, 8, 22})
          for (LogitsType type : kTypes) {
            RoutingConfig c = make_routing(RoutingPolicy::DeepSeekV3, e, k, type, true);
            c.n_group = n_group;
            c.topk_group = topk_group;
            if (!legal_routing(c)) continue;
            const int t = std::array<int, 3>{1, 33, 100}[cases++ % 3];
            Problem pr{c, t};
            // A bias as large as the scores, so that it moves groups around.
            check_fused_and_split(
                pr, test::logits_inputs(pr, test::random_vector(std::size_t(t) * e, rng, -4, 4),
                                        test::random_vector(e, rng, -1, 1)));
          }
  EXPECT_GT(cases, 50);
}

// DeepSeek keys that tie or differ in the last few ulps
// (test::near_tie_logits), routed from the block-staged keys of the fused
// and cluster kernels.
TEST(FusedRoutingGpu, DeepSeekNearTies) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (int e : {64, 256})
    for (int k : {1, 8})
      for (int t : {1, 7, 100}) {
        RoutingConfig c = make_routing(RoutingPolicy::DeepSeekV3, e, k, LogitsType::F32, true);
        if (e == 256) {
          c.n_group = 8;
          c.topk_group = 4;
        }
        if (!legal_routing(c)) continue;
        Problem pr{c, t};
        check_fused_and_split(pr, test::logits_inputs(pr, test::near_tie_logits(t, e, k, rng),
                                                      std::vector<float>(e, 0.125f)));
        ++cases;
      }
  EXPECT_EQ(cases, 12);
}

// The hard rows of test::adversarial_row (ties, signed zeros, NaN,
// infinities, huge magnitudes; non-finite DeepSeek biases) through the
// fused and cluster kernels: one token of each pattern, and a one-token call
// of a pattern in turn (the decode path). K from 1 to 8, odd sizes
// included.
TEST(FusedRoutingGpu, AdversarialLogits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (RoutingPolicy policy : test::kAllPolicies)
    for (LogitsType type : kTypes)
      for (int e : {8, 64, 160, 256, 1024})
        for (int k : {1, 2, 3, 6, 8})
          for (int bias_kind = 0; bias_kind < (test::is_deepseek(policy) ? 3 : 1); ++bias_kind) {
            const RoutingConfig c = make_routing(policy, e, k, type, bias_kind > 0);
            if (!legal_routing(c)) continue;
            SCOPED_TRACE("bias_kind " + std::to_string(bias_kind));
            const std::vector<float> bias = test::adversarial_bias(e, bias_kind == 2, rng);
            const Problem all{c, test::kAdversarialPatterns};
            check_fused_and_split(
                all, test::logits_inputs(all, test::adversarial_logits(all.num_tokens, e, k, rng), bias));
            const Problem one{c, 1};
            std::vector<float> row(e);
            test::adversarial_row(cases % test::kAdversarialPatterns, e, k, rng, row.data());
            check_fused_and_split(one, test::logits_inputs(one, std::move(row), bias));
            ++cases;
          }
  EXPECT_GT(cases, 200);
}

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

TEST(FusedRoutingGpu, ExpertParallelRangeWithOffRankRows) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::pair<int, int> ranges[] = {{0, 32}, {64, 32}, {224, 32}, {100, 1}, {1, 255}, {0, 256}};
  for (int t : {1, 33, 512})
    for (auto [offset, count] : ranges) {
      const RoutingConfig c =
          make_routing(RoutingPolicy::Renormalize, 256, 8, LogitsType::BF16, false);
      Problem pr{c, t, offset, count, {1, 7, 128}};
      check_fused_and_split(pr, random_inputs(pr, rng));
    }
  const RoutingConfig sigmoid =
      make_routing(RoutingPolicy::Sigmoid, 1024, 32, LogitsType::F32, false);
  Problem wide{sigmoid, 100, 512, 512};
  check_fused_and_split(wide, random_inputs(wide, rng));
}

// One shape of a permutation path's bound test, each against split and
// the reference: random logits (routed), precomputed ids all on local
// expert `one`, and random precomputed ids.
void check_bound_shape(const Problem& pr, int one, std::mt19937_64& rng) {
  check_fused_and_split(pr, random_inputs(pr, rng));
  const int t = pr.num_tokens, k = pr.config.top_k, e = pr.config.num_experts;
  Inputs same = precomputed_inputs(t, k, e, rng);
  std::fill(same.ids.begin(), same.ids.end(), pr.local_offset + one);
  check_fused_and_split(pr, same);
  check_fused_and_split(pr, precomputed_inputs(t, k, e, rng));
}

// Up to 32 rows the permute phases take a path of their own
// (permute_one_piece): both sides of that bound, routed and precomputed,
// with off-rank rows, every row on one expert, and tile sizes that split an
// expert's rows into several tiles.
TEST(FusedRoutingGpu, OnePiecePathAtItsBound) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 3, 16};
  struct Shape {
    int t, k;
  };
  const Shape shapes[] = {{1, 31}, {1, 32}, {4, 8}, {31, 1}, {33, 1}, {3, 11}};  // rows 24..33
  for (Shape s : shapes)
    for (auto [offset, count] : {std::pair{0, 64}, std::pair{16, 24}}) {
      const RoutingConfig c =
          make_routing(RoutingPolicy::Renormalize, 64, s.k, LogitsType::F32, false);
      check_bound_shape(Problem{c, s.t, offset, count, tile_m}, 5, rng);
    }
}

// Routed rows beyond 32 place by per-expert token masks while every local
// expert's mask (ceil(T / 32) words) fits the 8192-word work area, and by
// the general path beyond: both sides of that bound (E_local = 1024 at
// T = 256 and 257), masks of many words with a hot expert whose rows fill
// many tiles, an EP range, and DeepSeekV3 over several CTA splits of the
// cluster variant (T = 5, 9, 57: 5, 9 and 15 routing CTAs besides CTA 0 in
// clusters of 16 at the wide choice's 1 token a CTA, the last of T=57
// short; T=64 5 tokens a CTA: the spread kernel from T=121 there).
TEST(FusedRoutingGpu, TokenMaskPathAtItsBound) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 3, 16};
  for (int t : {256, 257}) {
    Problem pr{make_routing(RoutingPolicy::Renormalize, 1024, 4, LogitsType::F32, false), t, 0, 0,
               tile_m};
    check_fused_and_split(pr, random_inputs(pr, rng));
    Problem ep{pr.config, t, 100, 200, tile_m};
    check_fused_and_split(ep, random_inputs(ep, rng));
  }
  Problem hot{make_routing(RoutingPolicy::Renormalize, 256, 8, LogitsType::F32, false), 300, 0, 0,
              tile_m};
  Inputs in = random_inputs(hot, rng);
  for (int t = 0; t < hot.num_tokens; ++t) in.logits[static_cast<std::size_t>(t) * 256 + 7] += 20.0f;
  check_fused_and_split(hot, in);
  for (int t : {5, 9, 57, 64}) {
    Problem ds{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::F32, true), t, 0, 0,
               tile_m};
    ASSERT_EQ(ds.config.n_group, 8);
    check_fused_and_split(ds, random_inputs(ds, rng));
  }
}

// The token masks at decode sizes, where each expert's layout is written
// after the barrier, beside the rows (permute_by_token_masks): E_local of
// 1, 3, 5 and 8 experts a lane of a warp, T where the masks take one and
// two words, K that takes the masks from 33 rows (K = 3 below 64 rows: the
// sorted pair takes 33..64 rows where a kernel holds it), an EP range with
// off-rank rows, tile sizes that split an expert's rows, and one hot expert
// that every token picks (64 rows at one expert: 64 tiles at tile_m 1).
// Each case runs with three tile sizes (the packed layout) and with one
// (lay_out_one_size, as the layer asks: 1, 3 and 16 in turn); with one, the
// cluster kernel's K = 8 cases up to T = 64 take the form with K and the
// mask words as constants (one word to T = 32, two from T = 33).
// TokenMaskPathAtItsBound covers E=1024 at T=256, where the layout is
// written before the barrier instead (its sums do not fit the work area).
TEST(FusedRoutingGpu, TokenMasksAtDecodeSizes) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 3, 16};
  int one_size = 0;  // the next single tile size, 1, 3, 16 in turn
  struct Case {
    RoutingPolicy policy;
    int experts, top_k, local_offset, num_local;  // num_local 0: every expert
  };
  const Case cases[] = {
      {RoutingPolicy::Renormalize, 32, 8, 0, 0},    {RoutingPolicy::Renormalize, 96, 8, 0, 0},
      {RoutingPolicy::TopK, 160, 3, 0, 0},          {RoutingPolicy::Renormalize, 128, 8, 0, 0},
      {RoutingPolicy::DeepSeekV3, 256, 8, 0, 0},    {RoutingPolicy::Default, 384, 6, 100, 256},
      {RoutingPolicy::DeepSeekV3, 256, 8, 40, 150},
  };
  for (const Case& c : cases)
    for (const LogitsType type : kTypes)
      for (const int t : {9, 12, 32, 33, 63, 64, 65})
        for (const std::vector<int>& sizes : {tile_m, std::vector<int>{tile_m[one_size++ % 3]}}) {
          SCOPED_TRACE("tile sizes " + std::to_string(sizes.size()) + ", first " +
                       std::to_string(sizes[0]));
          Problem pr{make_routing(c.policy, c.experts, c.top_k, type,
                                  c.policy == RoutingPolicy::DeepSeekV3),
                     t, c.local_offset, c.num_local, sizes};
          check_fused_and_split(pr, random_inputs(pr, rng));
        }
  for (const std::vector<int>& sizes : {tile_m, std::vector<int>{1}}) {
    Problem hot{make_routing(RoutingPolicy::Renormalize, 256, 8, LogitsType::F32, false), 64, 0, 0,
                sizes};
    Inputs in = random_inputs(hot, rng);
    for (int t = 0; t < hot.num_tokens; ++t)
      in.logits[static_cast<std::size_t>(t) * 256 + 200] += 20.0f;
    check_fused_and_split(hot, in);
  }
}

using test::ScopedDev;

// The cluster variant's use of the spread kernel for a scope: on, its
// largest cluster (0: the device's largest) and the tokens it serves from
// (0: the measured rule).
struct SpreadSetting {
  bool on;
  int max_ctas;
  int from_tokens;
};
struct ScopedSpread {
  explicit ScopedSpread(SpreadSetting s)
      : on(&DevOverrides::cluster_spread, s.on),
        max_ctas(&DevOverrides::spread_max_ctas, s.max_ctas),
        from_tokens(&DevOverrides::spread_from_tokens, s.from_tokens) {}
  ScopedDev<bool> on;
  ScopedDev<int> max_ctas, from_tokens;
};

// The cluster kernel's largest cluster for a scope.
struct ScopedClusterMaxCtas : ScopedDev<int> {
  explicit ScopedClusterMaxCtas(int max_ctas) : ScopedDev(&DevOverrides::cluster_max_ctas, max_ctas) {}
};

// Whether the cluster variant launches the spread kernel for pr, at most
// max_ctas CTAs (routing_shape::spread_shape at the launcher's default
// minimum tokens; the device's largest cluster is at least 8).
bool spread_serves(const Problem& pr, int max_ctas) {
  const bool deepseek = routing_detail::is_deepseek(pr.config.policy);
  const int per_lane = routing_detail::slots_per_lane(pr.config.num_experts);
  return routing_shape::spread_shape(per_lane, pr.num_tokens, pr.local(), pr.config.num_experts,
                                     deepseek, routing_shape::default_spread_min_tokens(deepseek),
                                     max_ctas)
             .ctas > 0;
}

// The spread kernel (the cluster variant where it serves, here from T = 1
// on) over clusters of 16 (the device's largest where it runs them), 8 and
// 3 CTAs: every policy, fp32 and bf16, E 8..1024, K 1..32, T from 5 (a short last CTA)
// to 130, grouped DeepSeekV3 with bias, EP ranges with off-rank rows, one
// hot expert, tile sizes that split an expert's rows. Held to the split
// launches bit for bit and to the reference (check_fused_and_split); the
// launch shape decides which cases the spread kernel serves, and most must.
TEST(FusedRoutingGpu, SpreadKernelOverClusterSizes) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::pair<int, int> shapes[] = {{8, 2}, {64, 6}, {128, 8}, {256, 8}, {384, 8}, {1024, 32},
                                        {160, 22}, {256, 1}};
  const int tokens[] = {5, 17, 64, 130};
  int cases = 0, served = 0, pick = 0;
  for (int max_ctas : {0, 8, 3}) {
    SCOPED_TRACE("max_ctas " + std::to_string(max_ctas));
    ScopedSpread spread({true, max_ctas, 1});  // at every T it serves
    for (RoutingPolicy policy : test::kAllPolicies) {
      // The next shape for each policy: every shape in turn (indexing by the
      // case count, a multiple of 4 tokens, would take only a few of them).
      const auto [e, k] = shapes[pick++ % std::size(shapes)];
      const RoutingConfig c =
          make_routing(policy, e, k, cases % 2 == 0 ? LogitsType::F32 : LogitsType::BF16, cases % 3 != 0);
      if (!legal_routing(c)) continue;
      for (int t : tokens) {
        if (t * k > kFusedMaxRows) continue;
        // Every third case an EP range with off-rank rows.
        const int offset = cases % 3 == 2 ? e / 4 : 0, count = cases % 3 == 2 ? e / 2 : 0;
        Problem pr{c, t, offset, count, {1, 3, 16}};
        served += spread_serves(pr, max_ctas == 0 ? 8 : max_ctas);
        check_fused_and_split(pr, random_inputs(pr, rng));
        ++cases;
      }
    }
    // One hot expert: every token's first choice (its count 130, the rows of
    // every CTA).
    Problem hot{make_routing(RoutingPolicy::Renormalize, 64, 8, LogitsType::F32, false), 130, 0, 0,
                {1, 128}};
    Inputs in = random_inputs(hot, rng);
    for (int t = 0; t < hot.num_tokens; ++t) in.logits[static_cast<std::size_t>(t) * 64 + 3] += 20.0f;
    served += spread_serves(hot, max_ctas == 0 ? 8 : max_ctas);
    check_fused_and_split(hot, in);
    ++cases;
  }
  EXPECT_GT(cases, 100);
  EXPECT_GT(served, cases * 2 / 3);
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

// The cluster variant's two ways (without the spread kernel) on both sides
// of their bound: overlapped while the routing CTAs (7 at most in
// clusters of 8, 15 in clusters of 16, besides CTA 0) have a warp for each
// of their tokens and, DeepSeek, room for all their keys; beyond, every
// CTA routes whole tokens. DeepSeekV3 E=256 (32 warps, 32 tokens' keys a
// CTA): T = 224 overlapped, 225 not (480 and 481 in clusters of 16);
// Renormalize E=1024 (8 warps a CTA): T = 56 and 57 (120 and 121), with an
// EP range and off-rank rows on the second. Clusters of 16 where the device
// runs them (else these calls take clusters of 8 and the smaller bound).
TEST(FusedRoutingGpu, ClusterWaysAtTheirBound) {
  UNIMOE_REQUIRE_GPU();
  ScopedSpread spread({false, 0, 0});  // where the spread kernel would serve
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 16};
  for (int max_ctas : {routing_shape::kClusterMaxCtas, routing_shape::kClusterMaxCtasNonPortable}) {
    SCOPED_TRACE("clusters of at most " + std::to_string(max_ctas));
    ScopedClusterMaxCtas clusters(max_ctas);
    const int routing_ctas = max_ctas - 1;
    for (int t : {32 * routing_ctas, 32 * routing_ctas + 1}) {
      Problem ds{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::F32, true), t, 0, 0,
                 tile_m};
      check_fused_and_split(ds, random_inputs(ds, rng));
    }
    for (int t : {8 * routing_ctas, 8 * routing_ctas + 1}) {
      Problem pr{make_routing(RoutingPolicy::Renormalize, 1024, 4, LogitsType::BF16, false), t, 300,
                 400, tile_m};
      check_fused_and_split(pr, random_inputs(pr, rng));
    }
  }
}

// The overlapped cluster kernel's routing lanes hand their rows to CTA 0
// by asynchronous stores on an mbarrier (open_row_handoff, hand_off_rows):
// a 32-bit word a row pair at even K, an or a row at odd K, where a word
// can hold the last row of one token and the first of the next, of two
// routing CTAs. Odd and even K and T (odd row counts, tokens split
// between routing CTAs at odd rows), off-rank rows (-1 in a half-word),
// clusters of 8 and 16, against split and the reference. The spread kernel
// is off, so that its range (DeepSeek from T=64 in clusters of 8) takes
// the handoff too.
TEST(FusedRoutingGpu, RowHandoffAtOddAndEvenK) {
  UNIMOE_REQUIRE_GPU();
  ScopedSpread spread({false, 0, 0});
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (int max_ctas : {routing_shape::kClusterMaxCtas, routing_shape::kClusterMaxCtasNonPortable}) {
    SCOPED_TRACE("clusters of at most " + std::to_string(max_ctas));
    ScopedClusterMaxCtas clusters(max_ctas);
    for (const RoutingPolicy policy : {RoutingPolicy::Renormalize, RoutingPolicy::DeepSeekV3})
      for (const int k : {1, 2, 3, 5, 7, 8})
        for (const int t : {1, 2, 3, 5, 9, 13, 33, 61, 97}) {
          const RoutingConfig c = make_routing(policy, 128, k, LogitsType::F32, cases % 2 == 0);
          if (!legal_routing(c)) continue;
          const bool ep = cases++ % 3 == 1;  // an EP range: off-rank rows
          Problem pr{c, t, ep ? 40 : 0, ep ? 48 : 0, {1, 16}};
          check_fused_and_split(pr, random_inputs(pr, rng));
        }
  }
  EXPECT_GT(cases, 100);  // the loops did run
}


// The one-warp sort of two keys a lane for a scope.
struct ScopedSortedPair : ScopedDev<bool> {
  explicit ScopedSortedPair(bool on) : ScopedDev(&DevOverrides::sorted_pair, on) {}
};

// From 33 to 64 rows the permutation takes one warp's sort of two keys a
// lane (permute_sorted_pair): both sides of its bounds, on and off, routed
// (the single block and the cluster variant) and precomputed (ids that
// repeat within a token), with off-rank rows, every row on one local
// expert, one hot expert, tile sizes that split an expert's rows into
// several tiles, E=1024 (several experts a searching thread) and grouped
// DeepSeekV3. (The threshold kernels of the policies without groups, E >
// 128 and K >= 8, do not hold the pair: there the masks serve, on or off.)
TEST(FusedRoutingGpu, SortedPairAtItsBounds) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 3, 16};
  struct Shape {
    int t, k;
  };
  // Rows 32, 33, 40, 63, 64, 65.
  const Shape shapes[] = {{4, 8}, {33, 1}, {5, 8}, {9, 7}, {8, 8}, {13, 5}};
  int cases = 0;
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "sorted pair on" : "sorted pair off");
    ScopedSortedPair scoped(on);
    for (Shape sh : shapes)
      for (auto [offset, count] : {std::pair{0, 128}, std::pair{40, 48}}) {
        const RoutingConfig c =
            make_routing(RoutingPolicy::Renormalize, 128, sh.k, LogitsType::F32, false);
        const Problem pr{c, sh.t, offset, count, tile_m};
        check_bound_shape(pr, 7, rng);
        Inputs hot = random_inputs(pr, rng);
        for (int t = 0; t < sh.t; ++t) hot.logits[static_cast<std::size_t>(t) * 128 + 45] += 20.0f;
        check_fused_and_split(pr, hot);
        cases += 4;
      }
    for (int t : {5, 8}) {
      Problem ds{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::BF16, true), t, 0, 0,
                 tile_m};
      check_fused_and_split(ds, random_inputs(ds, rng));
      // K=4: the threshold kernels (K >= 8 at E > 128) leave the pair out.
      Problem big{make_routing(RoutingPolicy::Renormalize, 1024, 4, LogitsType::F32, false), 2 * t,
                  0, 0, tile_m};
      check_fused_and_split(big, random_inputs(big, rng));
      cases += 2;
    }
  }
  EXPECT_EQ(cases, 2 * (6 * 2 * 4 + 2 * 2));
  EXPECT_TRUE(test::routing_dev().sorted_pair);  // restored
}

TEST(FusedRoutingGpu, OneHotExpert) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Routed: expert 3 is every token's first choice (512 tiles at tile_m 1).
  const std::vector<int> tile_m = {1, 64, 128};
  Problem pr{make_routing(RoutingPolicy::Renormalize, 64, 8, LogitsType::F32, false), 512, 0, 0,
             tile_m};
  Inputs in = random_inputs(pr, rng);
  for (int t = 0; t < pr.num_tokens; ++t) in.logits[static_cast<std::size_t>(t) * 64 + 3] += 20.0f;
  check_fused_and_split(pr, in);
  // Precomputed: every row to one expert (ids may repeat within a token).
  Problem all_rows{make_routing(RoutingPolicy::Renormalize, 1024, 1, LogitsType::F32, false), 4096,
                   0, 0, tile_m};
  Inputs one = precomputed_inputs(4096, 1, 1024, rng);
  std::fill(one.ids.begin(), one.ids.end(), 1023);
  check_fused_and_split(all_rows, one);
  Problem eight{make_routing(RoutingPolicy::Renormalize, 8, 8, LogitsType::F32, false), 512, 0, 0,
                tile_m};
  Inputs five = precomputed_inputs(512, 8, 8, rng);
  std::fill(five.ids.begin(), five.ids.end(), 5);
  check_fused_and_split(eight, five);
}

TEST(FusedRoutingGpu, PrecomputedIdsWriteNoRoutingOutputs) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Shape {
    int t, k, e, offset, local;
  };
  const Shape shapes[] = {{0, 8, 256, 0, 256},      {1, 1, 8, 0, 8},
                          {3, 8, 64, 8, 32},        {33, 6, 128, 0, 128},
                          {100, 22, 256, 0, 256},   {512, 8, 384, 100, 200},
                          {128, 32, 1024, 0, 1024}, {4096, 1, 1024, 512, 512}};
  for (const Shape& s : shapes) {
    Problem pr{make_routing(RoutingPolicy::Renormalize, s.e, s.k, LogitsType::F32, false), s.t,
               s.offset, s.local};
    const Inputs in = precomputed_inputs(s.t, s.k, s.e, rng);
    check_fused_and_split(pr, in);
    Rig rig(pr, in);
    rig.poison();
    rig.run_fused(nullptr);
    for (int32_t id : rig.download().ids) ASSERT_EQ(id, -1);  // still the poison
  }
}

TEST(FusedRoutingGpu, NoTokensWritesZeroCountsOffsetsAndTiles) {
  UNIMOE_REQUIRE_GPU();
  std::mt19937_64 rng(1);
  for (bool precomputed : {false, true}) {
    Problem pr{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::F32, true), 0, 32, 128};
    const Inputs in = precomputed ? precomputed_inputs(0, 8, 256, rng) : random_inputs(pr, rng);
    Rig rig(pr, in);
    rig.poison();
    rig.run_fused(nullptr);
    const Outputs o = rig.download();
    EXPECT_EQ(o.counts, std::vector<int32_t>(128, 0));
    EXPECT_EQ(o.offsets, std::vector<int32_t>(129, 0));
    for (int s = 0; s < 3; ++s) EXPECT_EQ(o.num_tiles[s], 0);
  }
}

TEST(FusedRoutingGpu, LargestInputs) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // T * K = 4096 exactly, at every kernel width's extreme.
  const RoutingConfig configs[] = {
      make_routing(RoutingPolicy::Renormalize, 1024, 1, LogitsType::BF16, false),
      make_routing(RoutingPolicy::TopK, 1024, 32, LogitsType::F32, false),
      make_routing(RoutingPolicy::DeepSeekV3, 1024, 8, LogitsType::F32, true),
      make_routing(RoutingPolicy::Default, 512, 4, LogitsType::BF16, false)};
  for (const RoutingConfig& c : configs) {
    ASSERT_TRUE(legal_routing(c));
    Problem pr{c, kFusedMaxRows / c.top_k};
    check_fused_and_split(pr, random_inputs(pr, rng));
  }
}

TEST(FusedRoutingGpu, RefusesInputsBeyondOneBlock) {
  UNIMOE_REQUIRE_GPU();
  EXPECT_TRUE(routing_limits::fused_routing_fits(4096, 1, 1024));
  EXPECT_TRUE(routing_limits::fused_routing_fits(128, 32, 1));
  EXPECT_TRUE(routing_limits::fused_routing_fits(0, 8, 256));
  EXPECT_FALSE(routing_limits::fused_routing_fits(4097, 1, 8));
  EXPECT_FALSE(routing_limits::fused_routing_fits(513, 8, 8));
  EXPECT_FALSE(routing_limits::fused_routing_fits(1, 1, 1025));
  EXPECT_FALSE(routing_limits::fused_routing_fits(1, 1, 0));
  EXPECT_FALSE(routing_limits::fused_routing_fits(-1, 1, 8));
  EXPECT_FALSE(routing_limits::fused_routing_fits(1 << 20, 1 << 12, 8));  // T * K overflows int

  std::mt19937_64 rng(2);
  Problem pr{make_routing(RoutingPolicy::Renormalize, 64, 8, LogitsType::F32, false), 8};
  Rig rig(pr, random_inputs(pr, rng));
  DeviceBuffer<int32_t> other(64);
  auto refused = [&](auto change) {
    RoutingParams r = rig.routing();
    PermuteParams p = rig.permute();
    change(r, p);
    EXPECT_THROW(launch_fused_routing_permute(r, p, rig.plan("fused"), nullptr),
                 std::invalid_argument);
  };
  refused([](RoutingParams& r, PermuteParams& p) { r.num_tokens = p.num_tokens = 513; });
  refused([](RoutingParams&, PermuteParams& p) { p.num_local = 1025; });
  refused([](RoutingParams& r, PermuteParams&) { r.num_tokens = 7; });
  refused([&](RoutingParams&, PermuteParams& p) { p.topk_ids = other.get(); });
  refused([](RoutingParams& r, PermuteParams& p) {
    r.logits = nullptr;
    p.topk_ids = nullptr;
  });
  refused([](RoutingParams&, PermuteParams& p) { p.num_tile_sizes = kMaxTileSizes + 1; });
  refused([](RoutingParams& r, PermuteParams& p) { r.config.top_k = p.top_k = 33; });
  EXPECT_NO_THROW(rig.run_fused(nullptr));
  UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());
}

// Captures rig's fused block (cluster false) or cluster variant once and
// replays it three times, each with the logits make_logits(replay) gives
// (and `bias`): the outputs poisoned before each replay, then held to the
// reference and, bit for bit, to the split launches.
template <class MakeLogits>
void replay_with_new_logits(const Problem& pr, Rig& rig, bool cluster,
                            const std::vector<float>& bias, MakeLogits make_logits) {
  cudaStream_t stream;
  UNIMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  UNIMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  if (cluster)
    rig.run_cluster(stream);
  else
    rig.run_fused(stream);
  UNIMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  UNIMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const Inputs in = test::logits_inputs(pr, make_logits(replay), bias);
    rig.upload(in);
    rig.poison();
    UNIMOE_CUDA_CHECK(cudaDeviceSynchronize());  // uploads and poison land before the replay
    UNIMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    UNIMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const Outputs got = rig.download();
    test::expect_matches_reference(pr, in, got);
    rig.poison();
    rig.run_split(nullptr);
    test::expect_identical(got, rig.download(), false);
  }
  UNIMOE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  UNIMOE_CUDA_CHECK(cudaGraphDestroy(graph));
  UNIMOE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(FusedRoutingGpu, GraphReplayWithNewLogits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // T = 333 and T = 48 (the token masks at a decode size, here over an EP
  // range of 96 experts) with three tile sizes; T = 48 and T = 20 with one,
  // as the layer asks (the cluster kernel's token masks with K and the mask
  // words as constants: two words, then one).
  struct Case {
    int tokens;
    std::vector<int> tile_m;
  };
  const std::vector<int> three = {16, 64, 128};
  for (const Case& c : {Case{333, three}, Case{48, three}, Case{48, {16}}, Case{20, {16}}}) {
    const int t = c.tokens;
    SCOPED_TRACE("T=" + std::to_string(t) + ", tile sizes " + std::to_string(c.tile_m.size()));
    Problem pr{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::F32, true), t, 32,
               t == 333 ? 128 : 96, c.tile_m};
    ASSERT_EQ(pr.config.n_group, 8);
    const std::size_t cells = static_cast<std::size_t>(t) * 256;
    const std::vector<float> bias = test::random_vector(256, rng, -0.2f, 0.2f);
    Rig rig(pr, test::logits_inputs(pr, std::vector<float>(cells, 0.0f), bias));
    for (const bool cluster : {false, true}) {
      SCOPED_TRACE(cluster ? "cluster variant" : "fused block");
      replay_with_new_logits(pr, rig, cluster, bias, [&](int replay) {
        // A different skew each time, so that the routing outcome really changes.
        std::vector<float> values = test::random_vector(cells, rng, -4, 4);
        for (std::size_t i = 0; i < values.size(); ++i)
          if (static_cast<int>(i % 256) / 32 == replay) values[i] += 2.0f;
        return values;
      });
    }
  }
}

// The cluster variant's smallest calls outside DeepSeek's policies: one
// routing CTA, launched as a cluster of 2 (routing_shape::
// cluster_of_two_for_one_cta), captured once and replayed with new logits.
TEST(FusedRoutingGpu, ClusterOfTwoGraphReplayWithNewLogits) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const RoutingPolicy policy : {RoutingPolicy::Renormalize, RoutingPolicy::TopK})
    for (const int t : {1, 2}) {
      Problem pr{make_routing(policy, 128, 8, LogitsType::F32, false), t, 0, 0};
      SCOPED_TRACE(pr.describe());
      const std::size_t cells = static_cast<std::size_t>(t) * 128;
      Rig rig(pr, test::logits_inputs(pr, std::vector<float>(cells, 0.0f), {}));
      replay_with_new_logits(pr, rig, true, {},
                             [&](int) { return test::random_vector(cells, rng, -4, 4); });
    }
}

std::vector<int32_t> download_counts(test::LayerRig& rig, int num_local) {
  std::vector<int32_t> counts(num_local);
  UNIMOE_CUDA_CHECK(
      cudaMemcpy(counts.data(), rig.impl().expert_counts(), num_local * 4, cudaMemcpyDeviceToHost));
  return counts;
}

TEST(FusedRoutingGpu, LayerVariantMatchesSplit) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  MoEConfig c = moe_config(RoutingPolicy::Renormalize, 64, 8, 256, 128);
  c.experts.local_expert_offset = 16;
  c.experts.num_local_experts = 32;
  const int max_tokens = 600;  // T = 600 is 4800 rows: the fused layer falls back to split
  std::unique_ptr<test::LayerRig> fused, cluster, split;
  c.options.routing_variant = "fused";
  fused = std::make_unique<test::LayerRig>(c, max_tokens, seed);
  c.options.routing_variant = "cluster";
  cluster = std::make_unique<test::LayerRig>(c, max_tokens, seed);
  c.options.routing_variant = "split";
  split = std::make_unique<test::LayerRig>(c, max_tokens, seed);
  for (int t : {1, 7, 100, 512, 600}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    const std::vector<float> logits = ref::make_logits(c, t, seed + t, "uniform");
    for (auto* rig : {fused.get(), cluster.get(), split.get()}) {
      rig->load_inputs(t, seed ^ 0xabc, logits);
      rig->layer().forward(rig->args(t), nullptr);
    }
    EXPECT_EQ(cluster->error(t, logits), split->error(t, logits));  // the same output bits
    EXPECT_EQ(download_counts(*cluster, 32), download_counts(*split, 32));
    const double fused_error = fused->error(t, logits), split_error = split->error(t, logits);
    EXPECT_LT(fused_error, test::kLayerTolerance);
    EXPECT_EQ(fused_error, split_error);  // deterministic stages: the same output bits
    EXPECT_EQ(download_counts(*fused, 32), download_counts(*split, 32));
  }
  // Precomputed ids and weights through the fused Routing stage.
  const int t = 77;
  const std::vector<float> logits = ref::make_logits(c, t, seed, "uniform");
  const ref::Routing routing = ref::route(c.routing, logits.data(), t, nullptr);
  DeviceBuffer<int32_t> ids(routing.ids);
  DeviceBuffer<float> weights(routing.weights);
  fused->load_inputs(t, seed ^ 0xdef, logits);
  ForwardArgs args = fused->args(t);
  args.logits = nullptr;
  args.topk_ids = ids.get();
  args.topk_weights = weights.get();
  fused->layer().forward(args, nullptr);
  EXPECT_LT(fused->error(t, logits, &routing), test::kLayerTolerance);

  c.options.routing_variant = "fast";
  EXPECT_THROW(test::LayerRig(c, 8, seed), Error);
}

}  // namespace
}  // namespace unimoe
