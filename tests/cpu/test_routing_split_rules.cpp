// The split routing chain's rules (src/core/routing_shape_split.h): where
// the split kernel weighs a block's tokens together and sorts its runs,
// where the octet kernel routes, takes its filter mode and counts the
// permute's rows.
#include <gtest/gtest.h>

#include "core/routing_launch_shape.h"

namespace unimoe::routing_shape {
namespace {

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

// The octet kernel's filter mode, as measured: with groups from 8192 tokens
// at E = 256 and 384, never at E = 64 and 128; with one group from 4096 at
// E >= 256, 8192 at E = 128, never at E = 64. Never before the octet kernel
// itself takes the call. `forced` replaces the bound.
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

}  // namespace
}  // namespace unimoe::routing_shape
