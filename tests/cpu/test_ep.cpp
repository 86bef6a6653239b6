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
