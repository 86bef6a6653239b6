// The fused and cluster routing kernels' launch shape
// (src/core/routing_launch_shape.h): threads a block, routing CTAs a
// cluster, and the cluster kernel's way; and where the split kernel weighs
// a block's tokens together. The GPU tests compare outputs only,
// so they cannot tell which way served a call; these pin the shapes they are
// written against (tests/gpu/test_fused_routing_gpu.cu: TokenMaskPathAtItsBound,
// ClusterWaysAtTheirBound).
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
  // DeepSeek T = 16: 3 tokens a CTA over 6 CTAs (the phase stamps' 7-CTA
  // cluster of session 10).
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

TEST(RoutingLaunchShape, SplitWeighsInBatchesFromItsBoundExceptWhereTheWeightIsTheLogit) {
  for (SplitWeight w : {SplitWeight::kRowSoftmax, SplitWeight::kChosen, SplitWeight::kDeepSeek}) {
    const int bound = split_batch_min_tokens(w);
    ASSERT_GT(bound, 1);
    EXPECT_FALSE(split_weighs_in_batches(1, w, 0));
    EXPECT_FALSE(split_weighs_in_batches(bound - 1, w, 0));
    EXPECT_TRUE(split_weighs_in_batches(bound, w, 0));
    EXPECT_TRUE(split_weighs_in_batches(1 << 20, w, 0));
    // An override replaces the bound; 0 or below keeps it.
    EXPECT_TRUE(split_weighs_in_batches(1, w, 1));
    EXPECT_FALSE(split_weighs_in_batches(99, w, 100));
    EXPECT_FALSE(split_weighs_in_batches(bound - 1, w, -5));
  }
  // The cheaper the weight, the later batching pays (the measured order).
  EXPECT_LT(split_batch_min_tokens(SplitWeight::kDeepSeek), split_batch_min_tokens(SplitWeight::kChosen));
  EXPECT_LT(split_batch_min_tokens(SplitWeight::kChosen), split_batch_min_tokens(SplitWeight::kRowSoftmax));
  // TopK's weight is the logit: never, whatever the override.
  EXPECT_FALSE(split_weighs_in_batches(1 << 20, SplitWeight::kLogit, 0));
  EXPECT_FALSE(split_weighs_in_batches(1 << 20, SplitWeight::kLogit, 1));
}

TEST(RoutingLaunchShape, SplitSortsRunsWhereTheSweepSaidSo) {
  for (bool deepseek : {false, true}) {
    const int k_min = deepseek ? kSortFromTopKDeepSeek : kSortFromTopK;
    const int t_min = deepseek ? kSortFromTokensDeepSeek : kSortFromTokens;
    for (int k = 1; k <= 32; ++k) {
      for (int t : {1, t_min - 1, t_min, 1 << 20}) {
        const bool sorts = split_sorts_runs(8, k, t, deepseek, 0);
        EXPECT_EQ(sorts, k > kSortAlwaysAboveTopK || (k >= k_min && t >= t_min)) << k << " " << t;
        EXPECT_FALSE(split_sorts_runs(16, k, t, deepseek, 0));  // more slots: the tree
        EXPECT_EQ(split_sorts_runs(4, k, t, deepseek, 3), k >= 3);  // the override
      }
    }
  }
  // DeepSeek sorts from a smaller K and T than the others.
  EXPECT_TRUE(split_sorts_runs(8, 6, 2048, true, 0));
  EXPECT_FALSE(split_sorts_runs(8, 6, 2048, false, 0));
  EXPECT_FALSE(split_sorts_runs(8, 8, 2048, false, 0));
  EXPECT_TRUE(split_sorts_runs(8, 8, 3072, false, 0));
}

// The octet kernel serves DeepSeek's policies at E = 64, 128, 256, 384 (an
// eighth a lane in registers), K <= 8 (a lane a chosen expert), groups of
// whole lanes, from the measured token bounds.
TEST(RoutingLaunchShape, SplitTakesOctetsWhereItServes) {
  for (int e : {64, 128, 256, 384})
    for (int k = 1; k <= 8; ++k)
      for (int n_group : {1, 2, 4, 8}) {
        const int t = octets_from_tokens(e, k, n_group > 1);
        EXPECT_TRUE(split_takes_octets(true, e, k, n_group, t, 0));
        EXPECT_FALSE(split_takes_octets(true, e, k, n_group, t - 1, 0));
        EXPECT_TRUE(split_takes_octets(true, e, k, n_group, 1 << 20, 0));
      }
  const int t = 1 << 20;
  EXPECT_FALSE(split_takes_octets(false, 256, 8, 1, t, 0));    // not DeepSeek
  EXPECT_FALSE(split_takes_octets(true, 256, 9, 1, t, 0));     // K > 8
  EXPECT_FALSE(split_takes_octets(true, 256, 8, 16, t, 0));    // two groups a lane
  EXPECT_FALSE(split_takes_octets(true, 256, 8, 3, t, 0));     // a group across lanes
  for (int e : {8, 160, 192, 320, 512, 1024}) EXPECT_FALSE(split_takes_octets(true, e, 1, 1, t, 0));
  // The measured bounds. K other than 4 and 8: groups from 4096 (2048 at
  // E = 384); one group later the fewer the experts.
  for (int k : {1, 2, 3, 5, 6, 7}) {
    EXPECT_EQ(octets_from_tokens(256, k, true), 4096);
    EXPECT_EQ(octets_from_tokens(384, k, true), 2048);
    EXPECT_EQ(octets_from_tokens(384, k, false), 3072);
    EXPECT_EQ(octets_from_tokens(256, k, false), 4096);
    EXPECT_EQ(octets_from_tokens(128, k, false), 8192);
    EXPECT_EQ(octets_from_tokens(64, k, false), 16384);
  }
  // K = 4 and 8: from 4096 rows (8192 at E = 384 with one group), where
  // that is earlier.
  for (int e : {64, 128, 256, 384}) {
    EXPECT_EQ(octets_from_tokens(e, 8, true), 512);
    EXPECT_EQ(octets_from_tokens(e, 4, true), 1024);
  }
  EXPECT_EQ(octets_from_tokens(256, 8, false), 512);
  EXPECT_EQ(octets_from_tokens(64, 4, false), 1024);
  EXPECT_EQ(octets_from_tokens(384, 8, false), 1024);
  EXPECT_EQ(octets_from_tokens(384, 4, false), 2048);
  // An override replaces the bound, not the shapes.
  EXPECT_TRUE(split_takes_octets(true, 256, 8, 8, 1, 1));
  EXPECT_FALSE(split_takes_octets(true, 256, 8, 8, 4096, 4097));
  EXPECT_FALSE(split_takes_octets(true, 512, 8, 8, 1, 1));
}

// The octet kernel counts a permute chunk's rows where a chunk is 1 to 8
// whole blocks of 16 tokens (a byte each of an 8-byte word): K=8 with
// 256- and 1024-row chunks (the T=16384 target), K = 1, 2, 4 and 16 where
// their rows divide; never K = 3, 5, 6 or 7 (a block's rows do not divide
// a chunk), nor a chunk of more than 8 blocks (K=4 with 1024 rows is 16).
TEST(RoutingLaunchShape, OctetCountBlocksAreWholeBlocksOfAChunk) {
  EXPECT_EQ(octet_count_blocks(8, 1024), 8);
  EXPECT_EQ(octet_count_blocks(8, 256), 2);
  EXPECT_EQ(octet_count_blocks(8, 2048), 0);  // 16 blocks
  EXPECT_EQ(octet_count_blocks(8, 128), 1);
  EXPECT_EQ(octet_count_blocks(4, 256), 4);
  EXPECT_EQ(octet_count_blocks(4, 1024), 0);
  EXPECT_EQ(octet_count_blocks(2, 256), 8);
  EXPECT_EQ(octet_count_blocks(1, 256), 0);
  EXPECT_EQ(octet_count_blocks(16, 256), 1);
  EXPECT_EQ(octet_count_blocks(8, 768), 6);  // a 768-row chunk: 6 blocks
  for (int k : {3, 5, 6, 7}) EXPECT_EQ(octet_count_blocks(k, 1024), 0) << "K=" << k;
  EXPECT_EQ(octet_count_blocks(8, 0), 0);
  EXPECT_EQ(octet_count_blocks(0, 1024), 0);
  for (int k = 1; k <= 8; ++k)
    for (int rows = 256; rows <= 4096; rows += 256) {
      const int blocks = octet_count_blocks(k, rows);
      if (blocks > 0) {
        EXPECT_EQ(blocks * kOctetTokensPerBlock * k, rows) << "K=" << k << " rows=" << rows;
        EXPECT_LE(blocks * kOctetTokensPerBlock, 255) << "an expert's rows of a chunk fit a byte";
      }
    }
}

// The octet kernel's filter mode (session 15 run 7): with groups from 8192
// tokens at E = 256 and 384, never at E = 64 and 128; with one group from
// 4096 at E >= 256, 8192 at E = 128, never at E = 64. Never before the
// octet kernel itself takes the call. `forced` replaces the bound.
TEST(RoutingLaunchShape, OctetFilterModeFromItsMeasuredBounds) {
  EXPECT_EQ(octet_filter_from_tokens(384, true), 8192);
  EXPECT_EQ(octet_filter_from_tokens(256, true), 8192);
  EXPECT_EQ(octet_filter_from_tokens(128, true), 0);
  EXPECT_EQ(octet_filter_from_tokens(64, true), 0);
  EXPECT_EQ(octet_filter_from_tokens(384, false), 4096);
  EXPECT_EQ(octet_filter_from_tokens(256, false), 4096);
  EXPECT_EQ(octet_filter_from_tokens(128, false), 8192);
  EXPECT_EQ(octet_filter_from_tokens(64, false), 0);
  for (int e : {64, 128, 256, 384})
    for (int n_group : {1, 8}) {
      const int from = octet_filter_from_tokens(e, n_group > 1);
      if (from == 0) {
        EXPECT_FALSE(octets_filter(e, n_group, 1 << 20, 0));
        continue;
      }
      for (int k = 1; k <= 8; ++k) EXPECT_GE(from, octets_from_tokens(e, k, n_group > 1));
      EXPECT_TRUE(octets_filter(e, n_group, from, 0));
      EXPECT_FALSE(octets_filter(e, n_group, from - 1, 0));
    }
  EXPECT_TRUE(octets_filter(64, 1, 100, 100));  // forced
  EXPECT_FALSE(octets_filter(64, 1, 99, 100));
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

// The spread kernel's measured defaults (session 16 runs 8-9, session 21
// run 1): for the DeepSeek policies at E >= 128 from T=121 where the CTA-0
// kernel runs in clusters of 16 (more than 8 tokens each of its 15 routing
// CTAs), from T=64 in clusters of 8; else from 128; K <= 8; a permuting
// thread per local expert.
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

// The decode kernels' threshold selection where the A/Bs of session 17
// measured it faster: E > 128, K >= 8, and 1.5 K lanes holding candidates;
// and its ranked form at 4 strided slots (E = 65..128), K >= 8, where
// session 30's A/B measured it faster.
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
