// The reference permutation and tile schedule: invariants on random routing,
// hand-computed cases, empty experts, one hot expert, ids outside the local
// range, bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "core/permute_launch_shape.h"
#include "ref/ref.h"

namespace unimoe::ref {
namespace {

// K distinct experts per token, uniformly drawn.
std::vector<int32_t> random_ids(int num_tokens, int top_k, int num_experts, std::mt19937_64& rng) {
  std::vector<int32_t> all(num_experts), ids;
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < num_tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + top_k);
  }
  return ids;
}

// Every property the contract in ref.h states, checked from the ids alone.
void expect_valid(const Permutation& p, const std::vector<int32_t>& ids, int local_offset,
                  int num_local) {
  ASSERT_EQ(p.expert_counts.size(), static_cast<size_t>(num_local));
  ASSERT_EQ(p.expert_offsets.size(), static_cast<size_t>(num_local) + 1);
  ASSERT_EQ(p.expanded_to_permuted.size(), ids.size());

  std::vector<int32_t> want_counts(num_local, 0);
  int on_rank = 0;
  for (int32_t id : ids)
    if (id >= local_offset && id < local_offset + num_local)
      ++want_counts[id - local_offset], ++on_rank;
  EXPECT_EQ(p.expert_counts, want_counts);
  EXPECT_EQ(p.expert_offsets[0], 0);
  for (int e = 0; e < num_local; ++e)
    EXPECT_EQ(p.expert_offsets[e + 1], p.expert_offsets[e] + p.expert_counts[e]) << "expert " << e;
  EXPECT_EQ(p.expert_offsets[num_local], on_rank);
  ASSERT_EQ(p.permuted_to_expanded.size(), static_cast<size_t>(on_rank));

  for (int e = 0; e < num_local; ++e) {
    for (int r = p.expert_offsets[e]; r < p.expert_offsets[e + 1]; ++r) {
      const int32_t i = p.permuted_to_expanded[r];
      ASSERT_GE(i, 0);
      ASSERT_LT(static_cast<size_t>(i), ids.size());
      EXPECT_EQ(ids[i], local_offset + e) << "permuted row " << r;
      EXPECT_EQ(p.expanded_to_permuted[i], r) << "permuted row " << r;
      // Stable: increasing expanded index within an expert.
      if (r > p.expert_offsets[e]) {
        EXPECT_LT(p.permuted_to_expanded[r - 1], i);
      }
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool local = ids[i] >= local_offset && ids[i] < local_offset + num_local;
    if (!local) {
      EXPECT_EQ(p.expanded_to_permuted[i], -1) << "expanded row " << i;
    } else {
      const int32_t r = p.expanded_to_permuted[i];
      ASSERT_GE(r, 0) << "expanded row " << i;
      EXPECT_EQ(p.permuted_to_expanded[r], static_cast<int32_t>(i));
    }
  }
}

// Tiles in expert order, each inside its expert, covering every row once.
void expect_valid_tiles(const Permutation& p, const std::vector<Tile>& tiles, int tile_m) {
  SCOPED_TRACE("tile_m " + std::to_string(tile_m));
  const int num_local = static_cast<int>(p.expert_counts.size());
  std::vector<int> covered(p.permuted_to_expanded.size(), 0);
  std::vector<int> per_expert(num_local, 0);
  for (size_t i = 0; i < tiles.size(); ++i) {
    const Tile& t = tiles[i];
    ASSERT_GE(t.expert, 0);
    ASSERT_LT(t.expert, num_local);
    if (i > 0) {
      EXPECT_LE(tiles[i - 1].expert, t.expert);
    }
    EXPECT_GE(t.rows, 1);
    EXPECT_LE(t.rows, tile_m);
    EXPECT_GE(t.row_start, p.expert_offsets[t.expert]);
    EXPECT_LE(t.row_start + t.rows, p.expert_offsets[t.expert + 1]);
    // Only an expert's last tile may be partial.
    if (t.row_start + t.rows < p.expert_offsets[t.expert + 1]) {
      EXPECT_EQ(t.rows, tile_m);
    }
    for (int r = t.row_start; r < t.row_start + t.rows; ++r) ++covered[r];
    ++per_expert[t.expert];
  }
  for (size_t r = 0; r < covered.size(); ++r) EXPECT_EQ(covered[r], 1) << "permuted row " << r;
  for (int e = 0; e < num_local; ++e)
    EXPECT_EQ(per_expert[e], (p.expert_counts[e] + tile_m - 1) / tile_m) << "expert " << e;
}

TEST(Permute, RandomIdsKeepInvariants) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Case {
    int tokens, top_k, experts, local_offset, num_local;
  };
  const Case cases[] = {{1, 1, 1, 0, 1},     {7, 2, 8, 0, 8},     {33, 8, 256, 0, 256},
                        {100, 4, 16, 4, 6},  {64, 6, 64, 48, 16}, {5, 3, 10, 9, 1},
                        {257, 8, 32, 0, 32}, {19, 2, 128, 64, 64}};
  for (const Case& c : cases) {
    SCOPED_TRACE("T " + std::to_string(c.tokens) + " K " + std::to_string(c.top_k) + " E " +
                 std::to_string(c.experts) + " local [" + std::to_string(c.local_offset) + ", +" +
                 std::to_string(c.num_local) + ")");
    const std::vector<int32_t> ids = random_ids(c.tokens, c.top_k, c.experts, rng);
    const Permutation p = permute(ids.data(), c.tokens, c.top_k, c.local_offset, c.num_local);
    expect_valid(p, ids, c.local_offset, c.num_local);
    for (int tile_m : {1, 16, 64, 128}) expect_valid_tiles(p, make_tiles(p, tile_m), tile_m);
  }
}

TEST(Permute, HandComputedSmallCase) {
  // T = 3, K = 2; experts 0..3, this rank serves [1, 3).
  const std::vector<int32_t> ids = {2, 1, 3, 2, 1, 0};
  const Permutation p = permute(ids.data(), 3, 2, 1, 2);
  EXPECT_EQ(p.expert_counts, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(p.expert_offsets, (std::vector<int32_t>{0, 2, 4}));
  // Expert 1 (local 0): expanded rows 1, 4; expert 2 (local 1): rows 0, 3.
  EXPECT_EQ(p.permuted_to_expanded, (std::vector<int32_t>{1, 4, 0, 3}));
  EXPECT_EQ(p.expanded_to_permuted, (std::vector<int32_t>{2, 0, -1, 3, 1, -1}));

  const std::vector<Tile> tiles = make_tiles(p, 1);
  ASSERT_EQ(tiles.size(), 4u);
  EXPECT_EQ(tiles[2].expert, 1);
  EXPECT_EQ(tiles[2].row_start, 2);
  EXPECT_EQ(tiles[2].rows, 1);
}

TEST(Permute, HandComputedTiles) {
  // Counts 5, 0, 3 with tile_m 2: tiles (0,0,2) (0,2,2) (0,4,1) (2,5,2) (2,7,1).
  std::vector<int32_t> ids = {0, 0, 2, 0, 2, 0, 0, 2};
  const Permutation p = permute(ids.data(), 8, 1, 0, 3);
  const std::vector<Tile> tiles = make_tiles(p, 2);
  const std::vector<std::vector<int32_t>> want = {
      {0, 0, 2}, {0, 2, 2}, {0, 4, 1}, {2, 5, 2}, {2, 7, 1}};
  ASSERT_EQ(tiles.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(tiles[i].expert, want[i][0]) << "tile " << i;
    EXPECT_EQ(tiles[i].row_start, want[i][1]) << "tile " << i;
    EXPECT_EQ(tiles[i].rows, want[i][2]) << "tile " << i;
  }
}

TEST(Permute, EmptyExpertsGetNoRowsAndNoTiles) {
  // Only even experts are hit.
  const int tokens = 20, top_k = 2, experts = 12;
  std::vector<int32_t> ids;
  for (int t = 0; t < tokens; ++t) ids.insert(ids.end(), {2 * (t % 6), 2 * ((t + 1) % 6)});
  const Permutation p = permute(ids.data(), tokens, top_k, 0, experts);
  expect_valid(p, ids, 0, experts);
  for (int e = 1; e < experts; e += 2) EXPECT_EQ(p.expert_counts[e], 0) << "expert " << e;
  for (int tile_m : {1, 16, 64, 128}) {
    const std::vector<Tile> tiles = make_tiles(p, tile_m);
    expect_valid_tiles(p, tiles, tile_m);
    for (const Tile& t : tiles) EXPECT_EQ(t.expert % 2, 0);
  }
}

TEST(Permute, OneHotExpert) {
  // Every token routes its k = 0 choice to expert 5; the rest are spread.
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int tokens = 300, top_k = 4, experts = 16;
  std::vector<int32_t> others = random_ids(tokens, top_k - 1, experts - 1, rng), ids;
  for (int t = 0; t < tokens; ++t) {
    ids.push_back(5);
    for (int k = 0; k < top_k - 1; ++k) {
      const int32_t other = others[t * (top_k - 1) + k];  // 0..14, shifted past 5
      ids.push_back(other < 5 ? other : other + 1);
    }
  }
  const Permutation p = permute(ids.data(), tokens, top_k, 0, experts);
  expect_valid(p, ids, 0, experts);
  EXPECT_EQ(p.expert_counts[5], tokens);
  for (int tile_m : {1, 16, 64, 128}) {
    const std::vector<Tile> tiles = make_tiles(p, tile_m);
    expect_valid_tiles(p, tiles, tile_m);
    EXPECT_EQ(
        std::count_if(tiles.begin(), tiles.end(), [](const Tile& t) { return t.expert == 5; }),
        (tokens + tile_m - 1) / tile_m);
  }
}

TEST(Permute, AllRowsOffRank) {
  const std::vector<int32_t> ids = {0, 1, 7, 8};
  const Permutation p = permute(ids.data(), 2, 2, 2, 5);
  expect_valid(p, ids, 2, 5);
  EXPECT_TRUE(p.permuted_to_expanded.empty());
  EXPECT_EQ(p.expanded_to_permuted, (std::vector<int32_t>{-1, -1, -1, -1}));
  EXPECT_TRUE(make_tiles(p, 16).empty());
}

TEST(Permute, AnyIdOutsideTheLocalRangeIsOffRank) {
  // Precomputed routing may hold any int32 (docs/design.md, "Inputs outside
  // the usual range"): -1, E = 8, INT_MAX and INT_MIN place no row, and a
  // token's repeated id places one row per entry. T = 3, K = 3.
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  const std::vector<int32_t> ids = {3, -1, 8, 3, kMax, 2, kMin, 3, 3};
  // This rank serves [2, 6): expert 2 has expanded row 5, expert 3 rows 0, 3, 7, 8.
  Permutation p = permute(ids.data(), 3, 3, 2, 4);
  expect_valid(p, ids, 2, 4);
  EXPECT_EQ(p.expert_counts, (std::vector<int32_t>{1, 4, 0, 0}));
  EXPECT_EQ(p.permuted_to_expanded, (std::vector<int32_t>{5, 0, 3, 7, 8}));
  EXPECT_EQ(p.expanded_to_permuted, (std::vector<int32_t>{1, -1, -1, 2, -1, 0, -1, 3, 4}));
  // Every expert local: the out-of-range ids stay off rank.
  p = permute(ids.data(), 3, 3, 0, 8);
  expect_valid(p, ids, 0, 8);
  EXPECT_EQ(p.expert_counts, (std::vector<int32_t>{0, 0, 1, 4, 0, 0, 0, 0}));
  EXPECT_EQ(p.expanded_to_permuted, (std::vector<int32_t>{1, -1, -1, 2, -1, 0, -1, 3, 4}));
}

TEST(Permute, ZeroTokens) {
  const Permutation p = permute(nullptr, 0, 4, 0, 8);
  expect_valid(p, {}, 0, 8);
  EXPECT_TRUE(make_tiles(p, 64).empty());
}

TEST(Permute, RejectsBadArguments) {
  const std::vector<int32_t> good = {0, 3, 1, 2};
  EXPECT_NO_THROW(permute(good.data(), 2, 2, 0, 4));
  EXPECT_THROW(permute(good.data(), -1, 2, 0, 4), std::invalid_argument);
  EXPECT_THROW(permute(good.data(), 2, 0, 0, 4), std::invalid_argument);
  EXPECT_THROW(permute(good.data(), 2, -2, 0, 4), std::invalid_argument);
  EXPECT_THROW(permute(good.data(), 2, 2, -1, 4), std::invalid_argument);
  EXPECT_THROW(permute(good.data(), 2, 2, 0, -4), std::invalid_argument);
  EXPECT_THROW(permute(nullptr, 2, 2, 0, 4), std::invalid_argument);
  const Permutation p = permute(good.data(), 2, 2, 0, 4);
  EXPECT_THROW(make_tiles(p, 0), std::invalid_argument);
  EXPECT_THROW(make_tiles(p, -16), std::invalid_argument);
}

// The scan lets the votes' scatter launch early only where every scatter CTA
// finds an SM the scan leaves free (an H200 has 132 SMs):
// T=16384 K=8 (128 chunks) with E_local = 128 (4 scan CTAs) yes, 256 or 384
// (8, 12) no; K=4 there (64 chunks) yes. The masks' scatter, which ranks its
// rows before its wait, always.
TEST(PermuteShape, ScanTriggersTheScatterWhereEveryCtaFindsAFreeSm) {
  using permute_shape::scan_triggers_scatter;
  EXPECT_TRUE(scan_triggers_scatter(128, 4, 132, false));
  EXPECT_FALSE(scan_triggers_scatter(128, 8, 132, false));
  EXPECT_FALSE(scan_triggers_scatter(128, 12, 132, false));
  EXPECT_TRUE(scan_triggers_scatter(64, 12, 132, false));
  EXPECT_TRUE(scan_triggers_scatter(1, 1, 132, false));
  EXPECT_FALSE(scan_triggers_scatter(128, 4, 114, false));  // fewer SMs (an H100 PCIe)
  EXPECT_TRUE(scan_triggers_scatter(128, 8, 132, true));  // the masks rank before the wait
  EXPECT_TRUE(scan_triggers_scatter(256, 12, 114, true));
}

}  // namespace
}  // namespace unimoe::ref
