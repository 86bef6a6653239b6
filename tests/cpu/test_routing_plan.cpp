// plan_routing: the routing plan of a call, a pure function of (config, T,
// precomputed, device capabilities, development overrides).
#include <gtest/gtest.h>

#include <string>

#include "core/routing_limits.h"
#include "plan/routing_plan.h"
#include "support/presets.h"

namespace unimoe {
namespace {

// An H100/H200: 132 SMs, clusters of 16 for every routing kernel.
RoutingDeviceCaps hopper() {
  RoutingDeviceCaps caps;
  caps.sm_count = 132;
  caps.cluster_runs_16[0] = caps.cluster_runs_16[1] = true;
  caps.spread_runs_16[0] = caps.spread_runs_16[1] = true;
  return caps;
}

MoEConfig preset(const char* name, const char* variant = "auto") {
  MoEConfig c = find_preset(name).config;
  c.options.routing_variant = variant;
  return c;
}

RoutingPlan plan(const MoEConfig& c, int t, bool precomputed = false,
                 const DevOverrides& dev = DevOverrides{}, const RoutingDeviceCaps& caps = hopper()) {
  return plan_routing(c, t, precomputed, caps, dev);
}

TEST(RoutingPlan, AutoFollowsTheVariantRule) {
  for (const char* name : {"dsv3-tp8", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b"})
    for (int t : {0, 1, 7, 64, 100, 256, 385, 512, 4096, 16384}) {
      const MoEConfig c = preset(name);
      const RoutingVariant rule = routing_variant_for(c.routing, t);
      const bool fits = routing_limits::fused_routing_fits(t, c.routing.top_k, c.local_experts());
      EXPECT_EQ(plan(c, t).variant, fits ? rule : RoutingVariant::Split) << name << " T=" << t;
    }
}

TEST(RoutingPlan, ForcedVariantServesWhereItsKernelFits) {
  const MoEConfig fused = preset("qwen3-30b-a3b", "fused"), split = preset("qwen3-30b-a3b", "split");
  EXPECT_EQ(plan(fused, 8).variant, RoutingVariant::Fused);
  EXPECT_EQ(plan(fused, 8).kernel, RoutingKernel::Block);
  EXPECT_EQ(plan(fused, 512).variant, RoutingVariant::Fused);  // 4096 rows: one block still
  EXPECT_EQ(plan(fused, 513).variant, RoutingVariant::Split);  // beyond the block
  EXPECT_EQ(plan(split, 1).variant, RoutingVariant::Split);
  EXPECT_EQ(plan(split, 1).kernel, RoutingKernel::SplitWarps);
  EXPECT_THROW(plan(preset("qwen3-30b-a3b", "fast"), 1), Error);
}

TEST(RoutingPlan, NothingToRouteTakesThePermuteAlone) {
  for (const char* v : {"fused", "cluster"}) {
    EXPECT_EQ(plan(preset("dsv3-tp8", v), 0).kernel, RoutingKernel::PermuteOnly) << v;
    EXPECT_EQ(plan(preset("dsv3-tp8", v), 40, true).kernel, RoutingKernel::PermuteOnly) << v;
  }
  const RoutingPlan split = plan(preset("dsv3-tp8", "split"), 40, true);
  EXPECT_EQ(split.kernel, RoutingKernel::None);
  EXPECT_FALSE(split.routing_counts_rows);
  EXPECT_EQ(split.permute_chunks, 2);  // 320 rows in 256-row chunks
}

TEST(RoutingPlan, DeepSeekDecodeTakesTheFixedChoice) {
  const MoEConfig c = preset("dsv3-tp8");  // E=256 K=8, 8 groups, 4 kept
  for (int t : {1, 8, 64}) {
    const RoutingPlan p = plan(c, t);
    EXPECT_EQ(p.variant, RoutingVariant::Cluster) << t;
    EXPECT_TRUE(p.fixed_choice && p.threshold_kernel) << t;
    EXPECT_EQ(p.selection, RoutingSelection::FixedChoice) << p.to_string();
    EXPECT_EQ(p.slots, 8);
  }
  DevOverrides off;
  off.fixed_choice = false;
  const RoutingPlan p = plan(c, 1, false, off);
  EXPECT_FALSE(p.fixed_choice);
  EXPECT_NE(p.selection, RoutingSelection::FixedChoice) << p.to_string();
}

TEST(RoutingPlan, OverridesReachThePlan) {
  const MoEConfig c = preset("dsv3-tp8");
  DevOverrides no_spread;
  no_spread.cluster_spread = false;
  for (int t = 1; t <= 300; t += 13) EXPECT_NE(plan(c, t, false, no_spread).kernel, RoutingKernel::Spread);
  DevOverrides early;
  early.spread_from_tokens = 5;
  EXPECT_EQ(plan(c, 9, false, early).kernel, RoutingKernel::Spread);
  DevOverrides four;
  four.cluster_max_ctas = 4;
  four.cluster_spread = false;
  for (int t : {16, 64, 128}) EXPECT_LE(plan(c, t, false, four).ctas, 4) << t;
  DevOverrides no_pdl;
  no_pdl.pdl = false;
  EXPECT_FALSE(plan(c, 1, false, no_pdl).pdl);
  EXPECT_NE(plan(c, 1, false, no_pdl).to_string().find("pdl=0"), std::string::npos);
  DevOverrides no_pair;
  no_pair.sorted_pair = false;
  EXPECT_FALSE(plan(c, 5, false, no_pair).sorted_pair);
}

TEST(RoutingPlan, ClustersOfSixteenOnlyWhereTheDeviceRunsThem) {
  const MoEConfig c = preset("dsv3-tp8");
  RoutingDeviceCaps eight = hopper();
  eight.cluster_runs_16[0] = eight.cluster_runs_16[1] = false;
  eight.spread_runs_16[0] = eight.spread_runs_16[1] = false;
  int sixteen = 0;
  for (int t = 1; t <= 384; ++t) {
    EXPECT_LE(plan(c, t, false, DevOverrides{}, eight).ctas, 8) << t;
    sixteen += plan(c, t).ctas == 16;
  }
  EXPECT_GT(sixteen, 0);  // where the device runs them, some calls take 16
}

TEST(RoutingPlan, SplitChainAtLargeT) {
  const MoEConfig c = preset("dsv3-tp8");
  const RoutingPlan p = plan(c, 16384);
  EXPECT_EQ(p.variant, RoutingVariant::Split);
  EXPECT_EQ(p.kernel, RoutingKernel::SplitOctets);
  EXPECT_TRUE(p.routing_counts_rows);  // 131072 rows: the octet kernel counts them
  EXPECT_TRUE(p.scatter_masks);
  EXPECT_EQ(p.permute_chunks, permute_chunks::num_chunks(16384 * 8));
  DevOverrides no_count;
  no_count.split_octet_count = false;
  EXPECT_FALSE(plan(c, 16384, false, no_count).routing_counts_rows);
  EXPECT_FALSE(plan(c, 16384, false, no_count).scatter_masks);
  const RoutingPlan q = plan(preset("qwen3-30b-a3b"), 4096);
  EXPECT_EQ(q.kernel, RoutingKernel::SplitWarps);
  EXPECT_EQ(q.split_blocks, 1024);
  EXPECT_FALSE(q.routing_counts_rows);
}

TEST(RoutingLimits, LanesPerGroupAndKeptHalves) {
  for (int n_group = 1; n_group <= 32; ++n_group) {
    const int lanes = 1 << routing_limits::lanes_per_group_log2(n_group);
    EXPECT_LE(lanes * n_group, 32) << n_group;      // the groups fit one warp
    EXPECT_GT(2 * lanes * n_group, 32) << n_group;  // and take the most lanes that do
  }
  // DeepSeek-V3: 8 groups of 32 experts, 4 lanes a group of 8 slots, 4 kept:
  // 16 lanes, half the warp.
  EXPECT_TRUE(routing_limits::compacts_kept_lanes(8, 4, 32, 8));
  EXPECT_FALSE(routing_limits::compacts_kept_lanes(8, 5, 32, 8));  // 20 lanes
  EXPECT_FALSE(routing_limits::compacts_kept_lanes(1, 1, 256, 8));  // no groups
  EXPECT_FALSE(routing_limits::compacts_kept_lanes(8, 4, 32, 1));   // odd slots
}

TEST(RoutingPlan, PrintsWhatLaunches) {
  const std::string s = plan(preset("qwen3-30b-a3b"), 8).to_string();
  EXPECT_EQ(s.rfind("routing=cluster kernel=", 0), 0u) << s;
  EXPECT_NE(s.find(" select="), std::string::npos) << s;
  const std::string split = plan(preset("qwen3-30b-a3b"), 4096).to_string();
  EXPECT_EQ(split.rfind("routing=split kernel=warps blocks=1024", 0), 0u) << split;
  EXPECT_NE(split.find("permute_chunks="), std::string::npos) << split;
  // The same inputs, the same plan.
  EXPECT_EQ(plan(preset("dsv3-tp8"), 77), plan(preset("dsv3-tp8"), 77));
}

}  // namespace
}  // namespace unimoe
