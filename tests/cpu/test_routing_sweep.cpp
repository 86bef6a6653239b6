// The routing sweep's grid: legal points only, the groupings the issue asks
// for, every point accepted by validate().
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "support/routing_sweep.h"

namespace unimoe {
namespace {

TEST(RoutingSweep, DefaultGridIsDenseAtSmallTAndReaches16384) {
  const RoutingSweepGrid g = default_routing_sweep_grid();
  EXPECT_EQ(g.policies.size(), 10u);
  for (int t = 1; t <= 16; ++t) EXPECT_EQ(g.tokens[t - 1], t);
  EXPECT_EQ(g.tokens.back(), 16384);
  EXPECT_EQ(g.experts, (std::vector<int>{8, 64, 128, 160, 256, 384, 512, 1024}));
  EXPECT_EQ(g.top_k, (std::vector<int>{1, 2, 4, 6, 8, 10, 16, 22, 32}));
}

TEST(RoutingSweep, EveryPointIsLegalAndGroupedAsDeepSeekWhereItFits) {
  const std::vector<RoutingSweepPoint> points = routing_sweep_points(default_routing_sweep_grid());
  ASSERT_FALSE(points.empty());
  bool headline = false, ungrouped_k32 = false;
  for (const RoutingSweepPoint& p : points) {
    const RoutingConfig& r = p.routing;
    SCOPED_TRACE(p.label());
    EXPECT_LE(r.top_k, r.num_experts);
    if (r.policy == RoutingPolicy::Llama4) EXPECT_EQ(r.top_k, 1);
    if (r.n_group > 1) {
      EXPECT_EQ(r.policy, RoutingPolicy::DeepSeekV3);
      EXPECT_EQ(r.n_group, 8);
      EXPECT_EQ(r.topk_group, 4);
      EXPECT_LE(r.top_k, 22);
    }
    MoEConfig c;
    c.routing = r;
    c.experts.hidden = c.experts.intermediate = 64;
    EXPECT_NO_THROW(validate(c));
    headline |= r.policy == RoutingPolicy::DeepSeekV3 && r.num_experts == 256 && r.top_k == 8 &&
                r.n_group == 8 && p.num_tokens == 16384;
    ungrouped_k32 |= r.policy == RoutingPolicy::DeepSeekV3 && r.top_k == 32 && r.n_group == 1;
  }
  EXPECT_TRUE(headline) << "DeepSeekV3 E=256 K=8 n_group=8 (the issue's target) is swept";
  EXPECT_TRUE(ungrouped_k32) << "K = 32 runs without groups";
}

// --deepseek-groups: DeepSeekV3 in G groups (G / 2 kept) where they fit,
// the other policies untouched; fewer than 2 groups is an error.
TEST(RoutingSweep, DeepSeekGroupsAreTheGridsWhereTheyFit) {
  RoutingSweepGrid g;
  g.policies = {RoutingPolicy::DeepSeekV3, RoutingPolicy::Renormalize};
  g.experts = {6, 128};
  g.top_k = {8, 22};
  g.tokens = {1};
  g.deepseek_groups = 4;
  int grouped = 0;
  for (const RoutingSweepPoint& p : routing_sweep_points(g)) {
    SCOPED_TRACE(p.label());
    const RoutingConfig& r = p.routing;
    const bool fits = r.policy == RoutingPolicy::DeepSeekV3 && r.num_experts == 128;
    EXPECT_EQ(r.n_group, fits ? 4 : 1);  // E=6: not divisible by 4
    EXPECT_EQ(r.topk_group, fits ? 2 : 1);
    grouped += fits;
  }
  EXPECT_EQ(grouped, 2);  // K = 8 and 22 (<= 2 kept groups of 32)
  g.deepseek_groups = 1;
  EXPECT_THROW(routing_sweep_points(g), std::invalid_argument);
  g.deepseek_groups = 17;
  EXPECT_THROW(routing_sweep_points(g), std::invalid_argument);
}

TEST(RoutingSweep, IllegalCombinationsAreLeftOut) {
  RoutingSweepGrid g;
  g.policies = {RoutingPolicy::Llama4, RoutingPolicy::Renormalize};
  g.experts = {8};
  g.top_k = {1, 8, 10};
  g.tokens = {1, 2};
  const std::vector<RoutingSweepPoint> points = routing_sweep_points(g);
  std::set<std::string> labels;
  for (const RoutingSweepPoint& p : points) labels.insert(p.label());
  // Llama4 only K = 1; K = 10 > E = 8 nowhere.
  EXPECT_EQ(labels, (std::set<std::string>{"Llama4 E=8 K=1 T=1", "Llama4 E=8 K=1 T=2",
                                           "Renormalize E=8 K=1 T=1", "Renormalize E=8 K=1 T=2",
                                           "Renormalize E=8 K=8 T=1", "Renormalize E=8 K=8 T=2"}));
  g.tokens = {0};
  EXPECT_THROW(routing_sweep_points(g), std::invalid_argument);
}

}  // namespace
}  // namespace unimoe
