// Expert parallelism on the CPU: the group's geometry and its refusals, the
// dispatch slots against a direct count, and the reference EP output
// against the single-rank reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/expect_error.h"
#include "common/test_util.h"
#include "core/ep_geometry.h"
#include "ref/ep.h"
#include "ref/ref.h"
#include "ref/synthetic.h"
#include "unimoe/ep.h"

namespace unimoe {
namespace {

MoEConfig small_config(int experts = 16, int top_k = 4) {
  MoEConfig c;
  c.routing.policy = RoutingPolicy::Renormalize;
  c.routing.num_experts = experts;
  c.routing.top_k = top_k;
  c.experts.hidden = 64;
  c.experts.intermediate = 32;
  return c;
}

TEST(EPGeometry, RankRangesAndChunks) {
  const MoEConfig c = small_config(16, 4);
  const EPGeometry g = plan_ep(c, 100, 2, 4);
  EXPECT_EQ(g.experts_per_rank, 4);
  EXPECT_EQ(g.local_config.experts.local_expert_offset, 8);
  EXPECT_EQ(g.local_config.experts.num_local_experts, 4);
  EXPECT_EQ(g.local_tokens(), 400);
  EXPECT_EQ(g.rank_of_expert(0), 0);
  EXPECT_EQ(g.rank_of_expert(11), 2);
  EXPECT_EQ(g.rank_of_expert(15), 3);
  EXPECT_EQ(g.rank_of_expert(16), -1);
  EXPECT_EQ(g.rank_of_expert(-1), -1);
  EXPECT_EQ(g.x_chunk_bytes(), 100u * 64 * 2);
  EXPECT_EQ(g.ids_chunk_bytes(), 100u * 4 * 4);
  // Three other ranks, each sent x, ids, weights and a returned partial.
  EXPECT_EQ(g.bytes_sent_per_call(), 3u * (2 * 12800 + 1600 + 1600));
  // One rank sends nothing to others.
  EXPECT_EQ(plan_ep(c, 100, 0, 1).bytes_sent_per_call(), 0u);
}

TEST(EPGeometry, RefusesWithTheField) {
  const MoEConfig c = small_config(16, 4);
  EXPECT_EQ(test::error_of([&] { plan_ep(c, 8, 0, 3); }).field(), "routing.num_experts");
  EXPECT_EQ(test::error_of([&] { plan_ep(c, 8, 4, 4); }).field(), "ep.rank");
  EXPECT_EQ(test::error_of([&] { plan_ep(c, 8, -1, 4); }).field(), "ep.rank");
  EXPECT_EQ(test::error_of([&] { plan_ep(c, 8, 0, 0); }).field(), "ep.world_size");
  EXPECT_EQ(test::error_of([&] { plan_ep(c, 8, 0, 65); }).field(), "ep.world_size");
  EXPECT_EQ(test::error_of([&] { plan_ep(c, 0, 0, 4); }).field(), "ep.max_tokens");
  EXPECT_EQ(test::error_of([&] { plan_ep(c, 1 << 27, 0, 16); }).field(), "ep.max_tokens");
  MoEConfig ranged = c;
  ranged.experts.num_local_experts = 4;
  EXPECT_EQ(test::error_of([&] { plan_ep(ranged, 8, 0, 4); }).field(), "experts.num_local_experts");
  ranged = c;
  ranged.experts.local_expert_offset = 4;
  EXPECT_EQ(test::error_of([&] { plan_ep(ranged, 8, 0, 4); }).field(), "experts.local_expert_offset");
  MoEConfig bad = c;
  bad.routing.top_k = 0;
  EXPECT_EQ(test::error_of([&] { plan_ep(bad, 8, 0, 4); }).field(), "routing.top_k");
}

// Each variant's arrays advance by whole experts; shared scalars stay.
TEST(SliceExperts, OffsetsEveryArrayByWholeExperts) {
  char* base = reinterpret_cast<char*>(std::uintptr_t(1) << 40);
  ExpertWeights all;
  all.w13 = base;
  all.w2 = base + (1 << 30);
  all.b13 = reinterpret_cast<const float*>(base + (2u << 30));
  all.b2 = reinterpret_cast<const float*>(base + (3u << 30));
  all.w13_scale = reinterpret_cast<const float*>(base + (4ull << 30));
  all.w2_scale = reinterpret_cast<const float*>(base + (5ull << 30));
  all.w13_block_scale = reinterpret_cast<const uint8_t*>(base + (6ull << 30));
  all.w2_block_scale = reinterpret_cast<const uint8_t*>(base + (7ull << 30));
  all.x_scale = reinterpret_cast<const float*>(base + (8ull << 30));
  auto moved = [](const void* from, const void* to) {
    return static_cast<const char*>(to) - static_cast<const char*>(from);
  };
  MoEConfig c = small_config(16, 4);  // H 64, I 32, gated: gemm1_cols 64
  c.experts.has_bias = true;
  ExpertWeights s = slice_experts(all, c, 3, 2);
  EXPECT_EQ(moved(all.w13, s.w13), 3 * 64 * 64 * 2);
  EXPECT_EQ(moved(all.w2, s.w2), 3 * 64 * 32 * 2);
  EXPECT_EQ(moved(all.b13, s.b13), 3 * 64 * 4);
  EXPECT_EQ(moved(all.b2, s.b2), 3 * 64 * 4);
  EXPECT_EQ(s.x_scale, all.x_scale);

  c.experts.quant = QuantVariant::FP8Block128;
  c.experts.hidden = 256;
  c.experts.intermediate = 128;  // gemm1_cols 256: 2 x 2 blocks; w2 2 x 1
  s = slice_experts(all, c, 5, 1);
  EXPECT_EQ(moved(all.w13, s.w13), 5 * 256 * 256);
  EXPECT_EQ(moved(all.w2, s.w2), 5 * 256 * 128);
  EXPECT_EQ(moved(all.w13_scale, s.w13_scale), 5 * 4 * 4);
  EXPECT_EQ(moved(all.w2_scale, s.w2_scale), 5 * 2 * 4);

  c.experts.quant = QuantVariant::FP8PerTensor;
  s = slice_experts(all, c, 5, 1);
  EXPECT_EQ(moved(all.w13_scale, s.w13_scale), 5 * 4);
  EXPECT_EQ(moved(all.w2_scale, s.w2_scale), 5 * 4);

  c.experts.quant = QuantVariant::MXFP4;  // H 256, I 128
  s = slice_experts(all, c, 2, 1);
  EXPECT_EQ(moved(all.w13, s.w13), 2 * 256 * 128);
  EXPECT_EQ(moved(all.w2, s.w2), 2 * 256 * 64);
  EXPECT_EQ(moved(all.w13_block_scale, s.w13_block_scale), 2 * 256 * 8);
  EXPECT_EQ(moved(all.w2_block_scale, s.w2_block_scale), 2 * 256 * 4);

  c.experts.quant = QuantVariant::NVFP4;
  s = slice_experts(all, c, 2, 1);
  EXPECT_EQ(moved(all.w13_block_scale, s.w13_block_scale), 2 * 256 * 16);
  EXPECT_EQ(moved(all.w2_block_scale, s.w2_block_scale), 2 * 256 * 8);
  EXPECT_EQ(moved(all.w13_scale, s.w13_scale), 2 * 4);

  EXPECT_EQ(test::error_of([&] { slice_experts(all, c, 16, 1); }).field(), "first");
  EXPECT_EQ(test::error_of([&] { slice_experts(all, c, 15, 2); }).field(), "count");
  c.experts.num_local_experts = 8;
  EXPECT_EQ(test::error_of([&] { slice_experts(all, c, 0, 1); }).field(), "experts.num_local_experts");
}

// Slots by a direct definition: the number of earlier tokens with an expert
// on the rank.
TEST(EPSlots, MatchTheDefinition) {
  std::mt19937_64 rng(test::fresh_seed());
  for (int w : {1, 2, 3, 8, 64}) {
    const int e = w * 4, k = 5, t = 97;
    std::vector<int32_t> ids(std::size_t(t) * k);
    // Some ids outside [0, E): they go nowhere.
    for (int32_t& id : ids) id = int32_t(rng() % (e + 3)) - 1;
    const ref::EPSlots s = ref::ep_slots(ids.data(), t, k, e, w);
    std::vector<int> seen(w, 0);
    for (int r = 0; r < t; ++r) {
      for (int d = 0; d < w; ++d) {
        bool on = false;
        for (int j = 0; j < k; ++j) {
          const int id = ids[std::size_t(r) * k + j];
          on = on || (id >= 0 && id < e && id / (e / w) == d);
        }
        EXPECT_EQ(s.slot[std::size_t(r) * w + d], on ? seen[d] : -1) << "w " << w << " t " << r << " d " << d;
        seen[d] += on;
      }
    }
    for (int d = 0; d < w; ++d) EXPECT_EQ(s.counts[d], seen[d]);
  }
}

struct Model {
  explicit Model(const MoEConfig& c) : config(c), seeds(ref::seeds_for(test::fresh_seed())), weights(c, seeds) {}
  MoEConfig config;
  ref::Seeds seeds;
  ref::HostWeights weights;
};

// With every token's experts on one rank the EP output is the single-rank
// output rounded to bf16 (one partial, added to -0); otherwise it is within
// bf16 rounding of each partial.
TEST(EPReference, MatchesTheSingleRankLayer) {
  MoEConfig c = small_config(16, 4);
  c.experts.has_bias = true;
  Model m(c);
  const int t = 23;
  const std::vector<float> x = ref::host_x(c, t, m.seeds);
  const std::vector<float> logits = ref::make_logits(c, t, m.seeds.x + 1, "uniform");
  const ref::Routing routing = ref::route(c.routing, logits.data(), t, nullptr);
  const std::vector<float> single = ref::moe_forward(c, m.weights.source(), x.data(), routing, 2);
  for (int w : {1, 2, 4, 16}) {
    const std::vector<float> ep = ref::ep_forward(c, w, m.weights.source(), x.data(), routing, 2);
    ASSERT_EQ(ep.size(), single.size());
    if (w == 1) {
      for (std::size_t i = 0; i < ep.size(); ++i) ASSERT_EQ(ep[i], ref::round_bf16(single[i])) << i;
    }
    EXPECT_LT(test::rel_l2(ep, single), 1e-2) << "w " << w;
  }

  // Each token's experts within one rank of 4: bf16 of the single output.
  ref::Routing confined = routing;
  for (int r = 0; r < t; ++r)
    for (int j = 0; j < c.routing.top_k; ++j)
      confined.ids[std::size_t(r) * c.routing.top_k + j] = (r % 4) * 4 + j;
  const std::vector<float> one = ref::moe_forward(c, m.weights.source(), x.data(), confined, 2);
  const std::vector<float> ep = ref::ep_forward(c, 4, m.weights.source(), x.data(), confined, 2);
  for (std::size_t i = 0; i < ep.size(); ++i) ASSERT_EQ(ep[i], ref::round_bf16(one[i])) << i;
}

}  // namespace
}  // namespace unimoe
