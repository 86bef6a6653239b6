// The fused routing + permute kernel and the cluster variant against the CPU
// reference and, bit for bit, the split launches (check_fused_and_split):
// every policy and shape, grouped DeepSeekV3, near ties, adversarial rows, EP
// ranges, one hot expert, precomputed ids, no tokens, the largest inputs, refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "gpu/fused_routing_cases.h"
#include "gpu/gpu_test_util.h"
#include "kernels/routing/fused_routing.cuh"

namespace unimoe {
namespace {

using test::check_fused_and_split;
using test::DeviceBuffer;
using test::kTypes;
using test::legal_routing;
using test::make_routing;
using test::precomputed_inputs;
using test::random_inputs;
using Problem = test::RoutingProblem;
using Inputs = test::RoutingInputs;
using Outputs = test::RoutingOutputs;
using Rig = test::RoutingRig;

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

}  // namespace
}  // namespace unimoe
