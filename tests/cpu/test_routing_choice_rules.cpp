// The decode kernels' choices (src/core/routing_shape_choice.h): where the
// threshold, the fixed DeepSeek-V3 choice and the wide choice serve and
// run by default, and the wide choice's floor rank and seats.
#include <gtest/gtest.h>

#include "core/routing_launch_shape.h"

namespace unimoe::routing_shape {
namespace {

// The decode kernels' threshold selection where A/B timing measured it
// faster: E > 128, K >= 8, and 1.5 K lanes holding candidates; and its ranked
// form at 4 strided slots (E = 65..128), K >= 8.
TEST(RoutingLaunchShape, ThresholdServesWhereItWasMeasuredToWin) {
  // Strided slots (the policies without groups): every lane.
  const auto strided = [](int e, int k) {
    return threshold_serves(k, slots_for_experts(e), false, 1, e);
  };
  // DeepSeek's runs, 8 groups of which 4 are kept (the sweep's DeepSeekV3).
  const auto grouped = [](int e, int k) {
    return threshold_serves(k, slots_for_experts(e), true, 4, e / 8);
  };
  EXPECT_TRUE(strided(128, 8));  // 4 slots a lane: the ranked form
  EXPECT_TRUE(strided(65, 8));
  EXPECT_FALSE(strided(128, 6));  // 1.02-1.04x slower from T = 48
  EXPECT_TRUE(strided(128, 21));
  EXPECT_FALSE(strided(128, 22));
  EXPECT_FALSE(strided(128, 4));  // slower at K = 4
  EXPECT_FALSE(strided(128, 5));
  EXPECT_FALSE(strided(64, 8));    // 2 slots a lane
  EXPECT_FALSE(grouped(128, 8));   // runs: not the ranked form
  EXPECT_TRUE(strided(160, 8));
  EXPECT_TRUE(strided(1024, 8));
  EXPECT_FALSE(strided(256, 4));  // below K = 8: its fixed steps cost more
  EXPECT_FALSE(strided(256, 7));
  EXPECT_TRUE(strided(256, 16));
  EXPECT_TRUE(strided(256, 21));
  EXPECT_FALSE(strided(256, 22));  // mixed: candidates often pass 32
  EXPECT_TRUE(grouped(256, 8));    // 16 kept lanes
  EXPECT_FALSE(grouped(256, 16));
  EXPECT_TRUE(grouped(384, 8));    // 4 * 48 / 16 = 12 lanes
  EXPECT_FALSE(grouped(160, 8));   // 4 * 20 / 8 = 10 lanes
  EXPECT_TRUE(grouped(1024, 8));
  EXPECT_TRUE(threshold_serves(16, 8, true, 1, 256));  // DeepSeek without groups: 32 lanes
}

// The fixed choice: DeepSeek-V3/R1's shape only (E=256, 8 groups, 4 kept),
// K up to the kept groups' two best keys each; and the threshold kernels
// that hold it serve it at K = 8 alone (the launcher asks both).
TEST(RoutingLaunchShape, FixedChoiceServesDeepSeekV3sShape) {
  EXPECT_TRUE(fixed_choice_serves(256, 8, 4, 8));
  EXPECT_TRUE(fixed_choice_serves(256, 8, 4, 1));
  EXPECT_FALSE(fixed_choice_serves(256, 8, 4, 9));  // 4 groups' top-2 hold 8 keys
  EXPECT_FALSE(fixed_choice_serves(256, 8, 4, 0));
  EXPECT_FALSE(fixed_choice_serves(256, 8, 3, 6));  // other kept counts are not compiled
  EXPECT_FALSE(fixed_choice_serves(256, 1, 1, 8));  // MiniMax2: one group
  EXPECT_FALSE(fixed_choice_serves(128, 8, 4, 8));  // 4 slots a lane
  EXPECT_FALSE(fixed_choice_serves(512, 8, 4, 8));
  EXPECT_FALSE(fixed_choice_serves(256, 16, 4, 8));  // groups of 16 experts
  const auto runs_fixed = [](int k) {
    return fixed_choice_serves(256, 8, 4, k) &&
           threshold_serves(k, slots_for_experts(256), true, 4, 256 / 8);
  };
  EXPECT_TRUE(runs_fixed(8));
  for (int k = 1; k < 8; ++k) EXPECT_FALSE(runs_fixed(k)) << k;
}

// The wide choice's parts: E / 32 where E is a whole number of warps from
// 64 to a block's 1024 threads and each group is one part (without groups
// it was measured slower: none).
TEST(RoutingLaunchShape, WidePartsAreWholeGroupsOfAWarp) {
  EXPECT_EQ(wide_parts(256, 8, 32), 8);  // DeepSeekV3
  EXPECT_EQ(wide_parts(64, 2, 32), 2);
  EXPECT_EQ(wide_parts(512, 16, 32), 16);
  EXPECT_EQ(wide_parts(256, 1, 256), 0);   // MiniMax2, no groups
  EXPECT_EQ(wide_parts(1024, 1, 1024), 0);
  EXPECT_EQ(wide_parts(32, 1, 32), 0);     // one warp: the warp's own choice
  EXPECT_EQ(wide_parts(2048, 64, 32), 0);  // past a block
  EXPECT_EQ(wide_parts(128, 8, 16), 0);    // groups of 16: two to a part
  EXPECT_EQ(wide_parts(1024, 16, 64), 0);  // groups of 64: a part each half
}

// Each kept part's floor rank m = ceil(K / kept), so the kept parts hold at
// least K keys at or above the least floor; the seats fit the block and
// the measured token bounds (4 in the single block, 2 a routing CTA).
TEST(RoutingLaunchShape, WideFloorRankCoversKAndSeatsFitTheBlock) {
  for (int k = 1; k <= 32; ++k)
    for (int kept = 1; kept <= 16; ++kept) {
      const int m = wide_floor_rank(k, 8, 16, kept);  // with groups: topk_group kept
      EXPECT_GE(m * kept, k) << "K=" << k << " kept=" << kept;
      EXPECT_LT((m - 1) * kept, k) << "K=" << k << " kept=" << kept;
    }
  EXPECT_EQ(wide_floor_rank(8, 8, 8, 4), 2);  // DeepSeekV3: 4 kept groups
  EXPECT_EQ(wide_floor_rank(8, 8, 1, 1), 1);  // no groups: all 8 parts kept
  EXPECT_EQ(wide_floor_rank(22, 2, 1, 1), 11);
  EXPECT_TRUE(wide_fits(4, 8, 32, kWideMaxTokensBlock));
  EXPECT_FALSE(wide_fits(3, 8, 32, kWideMaxTokensCluster));  // 24 busy warps: issue-bound
  EXPECT_TRUE(wide_fits(2, 8, 16, kWideMaxTokensCluster));
  EXPECT_FALSE(wide_fits(2, 8, 15, kWideMaxTokensCluster));
  EXPECT_TRUE(wide_fits(0, 8, 4, kWideMaxTokensCluster));  // a CTA with no token meets the barriers
  EXPECT_FALSE(wide_fits(1, 0, 32, kWideMaxTokensBlock));  // off
  EXPECT_FALSE(wide_fits(1, 1, 32, kWideMaxTokensBlock));  // one part: never wide
}

// By default the wide choice runs where it was measured faster: parts * K
// >= 48 (a long enough warp's chain); never where it does not serve.
TEST(RoutingLaunchShape, WideByDefaultWhereMeasuredFaster) {
  EXPECT_TRUE(wide_by_default(wide_parts(256, 8, 32), 8));  // DeepSeekV3
  EXPECT_TRUE(wide_by_default(wide_parts(256, 8, 32), 6));
  EXPECT_FALSE(wide_by_default(wide_parts(256, 8, 32), 4));   // 1.02-1.03x from T=3
  EXPECT_TRUE(wide_by_default(wide_parts(128, 4, 32), 16));
  EXPECT_FALSE(wide_by_default(wide_parts(128, 4, 32), 8));   // 1.01-1.05x
  EXPECT_FALSE(wide_by_default(wide_parts(64, 2, 32), 16));   // 1.07-1.11x
  EXPECT_TRUE(wide_by_default(wide_parts(512, 16, 32), 8));   // T=1 0.83x
  EXPECT_FALSE(wide_by_default(wide_parts(256, 1, 256), 22));  // does not serve
  EXPECT_FALSE(wide_by_default(0, 32));
}

}  // namespace
}  // namespace unimoe::routing_shape
