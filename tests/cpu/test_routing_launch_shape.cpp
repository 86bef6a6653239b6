// The fused, cluster and spread routing kernels' launch shape
// (src/core/routing_shape_fused.h): threads a block, routing CTAs a
// cluster, the cluster kernel's way, the spread kernel's shape.
//
// The GPU tests compare outputs only, so they cannot tell which way served a
// call; these pin the shapes they are written against
// (tests/gpu/test_fused_permute_paths_gpu.cu: TokenMaskPathAtItsBound;
// tests/gpu/test_cluster_routing_gpu.cu: ClusterWaysAtTheirBound). The split chain's rules:
// test_routing_split_rules.cpp; the decode choices:
// test_routing_choice_rules.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/routing_launch_shape.h"

namespace unimoe::routing_shape {
namespace {

constexpr int kDeepSeekMin = 2;  // the launcher's default minimum tokens a routing CTA
constexpr int kOtherMin = 4;

TEST(RoutingLaunchShape, BlockWidthPerExpertsALane) {
  // The work area holds every warp's group keys; registers bound the rest.
  EXPECT_EQ(fused_threads(1), 1024);
  EXPECT_EQ(fused_threads(8), 1024);
  EXPECT_EQ(fused_threads(16), 512);
  EXPECT_EQ(fused_threads(32), 256);
}

TEST(RoutingLaunchShape, BlockThreadsAreWholeWarpsWithinTheirBounds) {
  EXPECT_EQ(block_threads(1024, 1, 8, 0), 128);      // at least 4 warps
  EXPECT_EQ(block_threads(1024, 5, 8, 0), 160);      // a warp a token
  EXPECT_EQ(block_threads(1024, 1, 200, 0), 224);    // a thread an expert, whole warps
  EXPECT_EQ(block_threads(1024, 2, 256, 512), 512);  // a thread a DeepSeek key
  EXPECT_EQ(block_threads(256, 40, 1024, 0), 256);   // never above the kernel's bound
  for (int t : {0, 1, 7, 33})
    for (int e : {1, 100, 1024})
      EXPECT_EQ(block_threads(1024, t, e, 0) % kWarp, 0) << t << " " << e;
}

TEST(RoutingLaunchShape, ClusterSpreadsTokensOverAtMostSevenRoutingCtas) {
  // One routing CTA (the single block) while the minimum covers every token.
  for (int t : {0, 1, 2}) EXPECT_EQ(cluster_routing_ctas(1024, t, kDeepSeekMin), 1) << t;
  for (int t : {1, 4}) EXPECT_EQ(cluster_routing_ctas(1024, t, kOtherMin), 1) << t;
  EXPECT_EQ(cluster_routing_ctas(1024, 3, kDeepSeekMin), 2);
  EXPECT_EQ(cluster_routing_ctas(1024, 5, kOtherMin), 2);
  // DeepSeek T = 16: 3 tokens a CTA over 6 CTAs (a 7-CTA cluster).
  EXPECT_EQ(cluster_routing_ctas(1024, 16, kDeepSeekMin), 6);
  for (int t : {64, 256, 4096}) {
    EXPECT_EQ(cluster_routing_ctas(1024, t, kDeepSeekMin), kClusterMaxCtas - 1) << t;
    EXPECT_EQ(cluster_routing_ctas(256, t, kOtherMin), kClusterMaxCtas - 1) << t;
  }
}

TEST(RoutingLaunchShape, TheFusedVariantIsOneBlock) {
  const LaunchShape s = launch_shape(8, 100, 256, 256, true, false, 1);
  EXPECT_EQ(s.routing_ctas, 1);
  EXPECT_EQ(s.threads, 1024);
  EXPECT_FALSE(s.overlapped);
  EXPECT_EQ(launch_shape(4, 3, 128, 128, false, false, 1).threads, 128);
}

// TokenMaskPathAtItsBound's DeepSeekV3 E=256 K=8 cluster splits: T = 5, 9,
// 57, 64 on 3, 5, 7 and 7 routing CTAs, the last one short each time, every
// one overlapped.
TEST(RoutingLaunchShape, DeepSeekSplitsOfTheGpuTest) {
  struct Case {
    int tokens, routing_ctas;
  };
  for (Case c : {Case{5, 3}, Case{9, 5}, Case{57, 7}, Case{64, 7}}) {
    SCOPED_TRACE("T=" + std::to_string(c.tokens));
    const LaunchShape s = launch_shape(8, c.tokens, 256, 256, true, true, kDeepSeekMin);
    EXPECT_EQ(s.routing_ctas, c.routing_ctas);
    EXPECT_TRUE(s.overlapped);
    const int per_cta = tokens_per_routing_cta(c.tokens, s.routing_ctas + 1);
    EXPECT_GT(per_cta * s.routing_ctas, c.tokens);  // the last routing CTA is short
    EXPECT_LT(per_cta * (s.routing_ctas - 1), c.tokens);  // and not empty
  }
}

// ClusterWaysAtTheirBound: overlapped on one side, whole tokens on every
// CTA on the other.
TEST(RoutingLaunchShape, ClusterWaysChangeWhereTheGpuTestSaysTheyDo) {
  // DeepSeekV3 E=256: 32 warps a CTA and 32 tokens' keys in the work area.
  const LaunchShape ds224 = launch_shape(8, 224, 256, 256, true, true, kDeepSeekMin);
  const LaunchShape ds225 = launch_shape(8, 225, 256, 256, true, true, kDeepSeekMin);
  EXPECT_EQ(ds224.routing_ctas, 7);
  EXPECT_EQ(ds224.threads, 1024);
  EXPECT_TRUE(ds224.overlapped);
  EXPECT_EQ(ds225.routing_ctas, 7);
  EXPECT_FALSE(ds225.overlapped);
  // Renormalize E=1024 (E_local 400 in the GPU test): 8 warps a CTA.
  const LaunchShape r56 = launch_shape(32, 56, 400, 1024, false, true, kOtherMin);
  const LaunchShape r57 = launch_shape(32, 57, 400, 1024, false, true, kOtherMin);
  EXPECT_EQ(r56.threads, 256);
  EXPECT_TRUE(r56.overlapped);
  EXPECT_FALSE(r57.overlapped);
}

TEST(RoutingLaunchShape, OverlappedNeedsAWarpAndTheKeysOfEveryToken) {
  EXPECT_TRUE(cluster_overlapped(8, 8, false, 1024));
  EXPECT_FALSE(cluster_overlapped(9, 8, false, 1024));
  // DeepSeek: the keys of every token of the CTA fit the work area.
  EXPECT_TRUE(cluster_overlapped(8, 8, true, 1024));
  EXPECT_FALSE(cluster_overlapped(9, 16, true, 1024));
  EXPECT_TRUE(cluster_overlapped(9, 16, false, 1024));
  EXPECT_EQ(tokens_per_routing_cta(64, 8), 10);
  EXPECT_EQ(tokens_per_routing_cta(7, 8), 1);
}

// Where every CTA routes, the CTAs' contiguous runs cover the tokens with
// the shortest run that does.
TEST(RoutingLaunchShape, EveryCtaRoutesACoveringRun) {
  for (int ctas = 2; ctas <= kClusterMaxCtas; ++ctas)
    for (int t = 0; t <= 600; ++t) {
      const int per = tokens_per_cta(t, ctas);
      EXPECT_GE(per * ctas, t) << t << " tokens, " << ctas << " CTAs";
      if (t > 0) EXPECT_LT((per - 1) * ctas, t) << t << " tokens, " << ctas << " CTAs";
    }
}

// The permutation's runs of experts: together they cover the experts, the
// run is the shortest that does, and the threads past the owner warps own
// none (the block scan skips their shuffles).
TEST(RoutingLaunchShape, ExpertRunsCoverTheExpertsAndOwnersAreWholeWarps) {
  for (int threads = kWarp; threads <= kMaxThreads; threads += kWarp)
    for (int num_local = 1; num_local <= 1024; ++num_local) {
      const int run = experts_per_thread(num_local, threads);
      const int warps = owner_warps(num_local, run);
      const std::string where = std::to_string(num_local) + " experts, " + std::to_string(threads) +
                                " threads";
      ASSERT_GE(run * threads, num_local) << where;
      ASSERT_LT((run - 1) * threads, num_local) << where;
      ASSERT_LE(warps * kWarp, threads) << where;
      ASSERT_GE(warps * kWarp * run, num_local) << where;              // the owners cover them
      ASSERT_LT((warps - 1) * kWarp * run, num_local) << where;        // the last owner warp owns some
    }
}

// Where one routing CTA serves the cluster variant's call (Renormalize
// E=128 at T = 1..2 here), the policies without DeepSeek's decode path
// still take a cluster, of 2 CTAs, up to E = 128; DeepSeek's, and the
// others above E = 128, take the single block.
TEST(RoutingLaunchShape, OneRoutingCtaTakesAClusterOfTwoOutsideDeepSeekUpToE128) {
  for (int e : {8, 64, 128}) {
    EXPECT_TRUE(cluster_of_two_for_one_cta(false, e)) << e;
    EXPECT_FALSE(cluster_of_two_for_one_cta(true, e)) << e;
  }
  for (int e : {160, 256, 1024}) EXPECT_FALSE(cluster_of_two_for_one_cta(false, e)) << e;
  const int min_tokens = cluster_min_tokens_by_default(false, 128, false);
  EXPECT_EQ(launch_shape(4, 1, 128, 128, false, true, min_tokens).routing_ctas, 1);
  EXPECT_EQ(launch_shape(4, 2, 128, 128, false, true, min_tokens).routing_ctas, 1);
  EXPECT_EQ(launch_shape(4, 3, 128, 128, false, true, min_tokens).routing_ctas, 2);
}

// The spread kernel's launch: the CTAs' runs cover the tokens with no empty
// CTA, as many CTAs as T / min_tokens (rounded up) or max_ctas allow, a run
// at most a mask word;
// the routing warps and at least one permuting warp fit the kernel's
// bound; DeepSeek's keys of a CTA fit the work area; the permuting threads
// are a thread a local expert where there is room.
TEST(RoutingLaunchShape, SpreadCoversTheTokensWithinItsBounds) {
  int served = 0;
  for (int per_lane : {1, 2, 4, 8, 16, 32})
    for (bool deepseek : {false, true})
      for (int min_tokens : {1, 2, 4})
        for (int max_ctas : {2, 8, 16})
          for (int t = 0; t <= 600; ++t) {
            const int e = per_lane * kWarp, local = e - e / 4;
            const SpreadShape s = spread_shape(per_lane, t, local, e, deepseek, min_tokens, max_ctas);
            const std::string where = std::to_string(t) + " tokens, E=" + std::to_string(e) +
                                      (deepseek ? " DeepSeek" : "") + ", min " +
                                      std::to_string(min_tokens) + ", max " + std::to_string(max_ctas);
            if (s.ctas == 0) {
              // Not served: one CTA would do, or a CTA would take too much.
              const int ctas = std::min({max_ctas, (t + min_tokens - 1) / min_tokens,
                                         kSpreadTableBytes / spread_row_bytes(local)});
              if (ctas >= 2) {
                const int per = (t + ctas - 1) / ctas;
                EXPECT_TRUE(per > kSpreadMaxTokensPerCta || (deepseek && per * e > kWorkWords) ||
                            fused_threads(per_lane) - per * kWarp < kWarp)
                    << where;
              }
              continue;
            }
            ++served;
            ASSERT_GE(s.ctas, 2) << where;
            ASSERT_LE(s.ctas, max_ctas) << where;
            ASSERT_LE(s.ctas * spread_row_bytes(local), kSpreadTableBytes) << where;
            ASSERT_GE(s.ctas * s.tokens_per_cta, t) << where;
            ASSERT_LT((s.ctas - 1) * s.tokens_per_cta, t) << where;  // no empty CTA
            ASSERT_LE(s.tokens_per_cta, kSpreadMaxTokensPerCta) << where;
            ASSERT_LE(s.ctas, (t + min_tokens - 1) / min_tokens) << where;
            ASSERT_EQ(s.threads % kWarp, 0) << where;
            ASSERT_LE(s.threads, fused_threads(per_lane)) << where;
            ASSERT_EQ(s.threads - s.permute_threads, s.tokens_per_cta * kWarp) << where;
            ASSERT_GE(s.permute_threads, kWarp) << where;
            if (s.threads < fused_threads(per_lane)) ASSERT_GE(s.permute_threads, local) << where;
            if (deepseek) ASSERT_LE(s.tokens_per_cta * e, kWorkWords) << where;
          }
  EXPECT_GT(served, 10000);
  // DeepSeekV3 E=256 at its default minimum of 2 tokens: T=64 over 16 CTAs
  // of 4 tokens, 1024 threads (a thread a key); T=5 over 3 CTAs.
  const SpreadShape ds = spread_shape(8, 64, 256, 256, true, 2, 16);
  EXPECT_EQ(ds.ctas, 16);
  EXPECT_EQ(ds.tokens_per_cta, 4);
  EXPECT_EQ(ds.threads, 1024);
  EXPECT_EQ(spread_shape(8, 5, 256, 256, true, 2, 16).ctas, 3);
  // Renormalize E=128 at 4: T=4 is one CTA's, not served; T=64 on 16.
  EXPECT_EQ(spread_shape(4, 4, 128, 128, false, 4, 16).ctas, 0);
  EXPECT_EQ(spread_shape(4, 64, 128, 128, false, 4, 16).ctas, 16);
  EXPECT_EQ(spread_shape(4, 64, 128, 128, false, 4, 16).permute_threads, 128);
  // The table: rows of E_local rounded up to 16 bytes; 8 CTAs at E = 512,
  // 4 at 1024.
  EXPECT_EQ(spread_row_bytes(1), 16);
  EXPECT_EQ(spread_row_bytes(160), 160);
  EXPECT_EQ(spread_row_bytes(161), 176);
  EXPECT_EQ(spread_shape(16, 64, 512, 512, false, 2, 16).ctas, 8);
  EXPECT_EQ(spread_shape(32, 8, 1024, 1024, false, 2, 16).ctas, 4);
}

// The spread kernel's measured defaults: for the DeepSeek policies at
// E >= 128 from T=121 where the CTA-0 kernel runs in clusters of 16 (more
// than 8 tokens each of its 15 routing CTAs), from T=64 in clusters of 8;
// else from 128; K <= 8; a permuting thread per local expert.
TEST(RoutingLaunchShape, SpreadByDefaultWhereItWasMeasuredToWin) {
  auto by_default = [](int t, int e, int k, bool deepseek,
                       int cluster_ctas = kClusterMaxCtasNonPortable) {
    const SpreadShape s = spread_shape(slots_for_experts(e), t, e, e, deepseek,
                                       default_spread_min_tokens(deepseek), kSpreadMaxCtas);
    return spread_by_default(s, t, k, e, e, deepseek, cluster_ctas);
  };
  EXPECT_EQ(kSpreadFromTokensDeepSeekLarge, 121);
  EXPECT_FALSE(by_default(64, 256, 8, true));
  EXPECT_FALSE(by_default(120, 256, 8, true));
  EXPECT_TRUE(by_default(121, 256, 8, true));
  EXPECT_TRUE(by_default(121, 128, 8, true));
  // The CTA-0 kernel in clusters of 8 (a device without clusters of 16).
  EXPECT_FALSE(by_default(63, 256, 8, true, kClusterMaxCtas));
  EXPECT_TRUE(by_default(64, 256, 8, true, kClusterMaxCtas));
  EXPECT_TRUE(by_default(64, 128, 8, true, kClusterMaxCtas));
  EXPECT_FALSE(by_default(64, 64, 8, true, kClusterMaxCtas));  // E < 128: from 128
  EXPECT_FALSE(by_default(121, 64, 8, true));
  EXPECT_FALSE(by_default(127, 8, 1, true));
  EXPECT_TRUE(by_default(128, 8, 1, true));
  EXPECT_FALSE(by_default(127, 128, 8, false));
  EXPECT_TRUE(by_default(128, 128, 8, false));
  EXPECT_FALSE(by_default(128, 128, 16, false));  // K above 8: not measured
  // E = 384 at T=128: 13 tokens a CTA leave 96 permuting threads of the
  // kernel's 512 for 384 experts.
  EXPECT_FALSE(by_default(128, 384, 1, false));
  EXPECT_FALSE(by_default(192, 512, 1, true));
  EXPECT_EQ(slots_for_experts(8), 1);
  EXPECT_EQ(slots_for_experts(33), 2);
  EXPECT_EQ(slots_for_experts(256), 8);
  EXPECT_EQ(slots_for_experts(1024), 32);
}

// By default clusters of 16 for the DeepSeek policies from E = 128 and the
// others from E = 256.
TEST(RoutingLaunchShape, LargeClustersWhereMeasuredFaster) {
  EXPECT_EQ(cluster_max_ctas_by_default(true, 256), kClusterMaxCtasNonPortable);
  EXPECT_EQ(cluster_max_ctas_by_default(true, 128), kClusterMaxCtasNonPortable);
  EXPECT_EQ(cluster_max_ctas_by_default(true, 64), kClusterMaxCtas);
  EXPECT_EQ(cluster_max_ctas_by_default(false, 512), kClusterMaxCtasNonPortable);
  EXPECT_EQ(cluster_max_ctas_by_default(false, 256), kClusterMaxCtasNonPortable);
  EXPECT_EQ(cluster_max_ctas_by_default(false, 128), kClusterMaxCtas);  // 1.03-1.13x from T=36
}

// The cluster's minimum tokens a routing CTA: DeepSeek 1 with the wide
// kernels, else 2; the others 2 in clusters of 8 (E < 256), else 4.
TEST(RoutingLaunchShape, ClusterMinTokensWhereMeasuredFaster) {
  EXPECT_EQ(cluster_min_tokens_by_default(true, 256, true), 1);
  EXPECT_EQ(cluster_min_tokens_by_default(true, 256, false), 2);
  EXPECT_EQ(cluster_min_tokens_by_default(true, 64, false), 2);
  EXPECT_EQ(cluster_min_tokens_by_default(false, 128, false), 2);
  EXPECT_EQ(cluster_min_tokens_by_default(false, 8, false), 2);
  EXPECT_EQ(cluster_min_tokens_by_default(false, 256, false), 4);
  EXPECT_EQ(cluster_min_tokens_by_default(false, 1024, false), 4);
  // Renormalize E=128 T=3: two routing CTAs rather than the single block.
  const int min_tokens = cluster_min_tokens_by_default(false, 128, false);
  EXPECT_EQ(launch_shape(4, 3, 128, 128, false, true, min_tokens).routing_ctas, 2);
  // DeepSeekV3 E=256 T=5 with the wide choice: a routing CTA a token.
  EXPECT_EQ(launch_shape(8, 5, 256, 256, true, true, 1, kClusterMaxCtasNonPortable).routing_ctas, 5);
}

// The cluster's routing CTAs stay below its largest cluster, 8 or (where
// the launcher allows it) 16.
TEST(RoutingLaunchShape, ClusterRoutingCtasStayBelowTheLargestCluster) {
  for (int t = 1; t <= 256; ++t) {
    EXPECT_LE(cluster_routing_ctas(1024, t, 2), kClusterMaxCtas - 1) << t;
    EXPECT_LE(cluster_routing_ctas(1024, t, 2, kClusterMaxCtasNonPortable),
              kClusterMaxCtasNonPortable - 1)
        << t;
  }
  EXPECT_EQ(cluster_routing_ctas(1024, 64, 2, kClusterMaxCtasNonPortable), 13);  // 5 tokens a CTA
  EXPECT_EQ(cluster_routing_ctas(1024, 32, 2, kClusterMaxCtasNonPortable), 11);  // 3 a CTA
  EXPECT_EQ(cluster_routing_ctas(1024, 64, 2), 7);
  EXPECT_EQ(launch_shape(8, 64, 256, 256, true, true, 2, kClusterMaxCtasNonPortable).routing_ctas,
            13);
}

}  // namespace
}  // namespace unimoe::routing_shape
