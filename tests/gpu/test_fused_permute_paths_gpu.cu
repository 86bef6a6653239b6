// The fused routing + permute kernel's permutation paths on both sides of
// their bounds (one piece up to 32 rows, the sorted pair, the token masks),
// routed and precomputed, against the reference and the split launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gpu/fused_routing_cases.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_plan_util.h"

namespace unimoe {
namespace {

using test::check_fused_and_split;
using test::kTypes;
using test::make_routing;
using test::precomputed_inputs;
using test::random_inputs;
using test::ScopedDev;
using Problem = test::RoutingProblem;
using Inputs = test::RoutingInputs;

// One shape of a permutation path's bound test, each against split and
// the reference: random logits (routed), precomputed ids all on local
// expert `one`, and random precomputed ids.
void check_bound_shape(const Problem& pr, int one, std::mt19937_64& rng) {
  check_fused_and_split(pr, random_inputs(pr, rng));
  const int t = pr.num_tokens, k = pr.config.top_k, e = pr.config.num_experts;
  Inputs same = precomputed_inputs(t, k, e, rng);
  std::fill(same.ids.begin(), same.ids.end(), pr.local_offset + one);
  check_fused_and_split(pr, same);
  check_fused_and_split(pr, precomputed_inputs(t, k, e, rng));
}

// Up to 32 rows the permute phases take a path of their own
// (permute_one_piece): both sides of that bound, routed and precomputed,
// with off-rank rows, every row on one expert, and tile sizes that split an
// expert's rows into several tiles.
TEST(FusedRoutingGpu, OnePiecePathAtItsBound) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 3, 16};
  struct Shape {
    int t, k;
  };
  const Shape shapes[] = {{1, 31}, {1, 32}, {4, 8}, {31, 1}, {33, 1}, {3, 11}};  // rows 24..33
  for (Shape s : shapes)
    for (auto [offset, count] : {std::pair{0, 64}, std::pair{16, 24}}) {
      const RoutingConfig c =
          make_routing(RoutingPolicy::Renormalize, 64, s.k, LogitsType::F32, false);
      check_bound_shape(Problem{c, s.t, offset, count, tile_m}, 5, rng);
    }
}

// Routed rows beyond 32 place by per-expert token masks while every local
// expert's mask (ceil(T / 32) words) fits the 8192-word work area, and by
// the general path beyond: both sides of that bound (E_local = 1024 at
// T = 256 and 257), masks of many words with a hot expert whose rows fill
// many tiles, an EP range, and DeepSeekV3 over several CTA splits of the
// cluster variant (T = 5, 9, 57: 5, 9 and 15 routing CTAs besides CTA 0 in
// clusters of 16 at the wide choice's 1 token a CTA, the last of T=57
// short; T=64 5 tokens a CTA: the spread kernel from T=121 there).
TEST(FusedRoutingGpu, TokenMaskPathAtItsBound) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 3, 16};
  for (int t : {256, 257}) {
    Problem pr{make_routing(RoutingPolicy::Renormalize, 1024, 4, LogitsType::F32, false), t, 0, 0,
               tile_m};
    check_fused_and_split(pr, random_inputs(pr, rng));
    Problem ep{pr.config, t, 100, 200, tile_m};
    check_fused_and_split(ep, random_inputs(ep, rng));
  }
  Problem hot{make_routing(RoutingPolicy::Renormalize, 256, 8, LogitsType::F32, false), 300, 0, 0,
              tile_m};
  Inputs in = random_inputs(hot, rng);
  for (int t = 0; t < hot.num_tokens; ++t) in.logits[static_cast<std::size_t>(t) * 256 + 7] += 20.0f;
  check_fused_and_split(hot, in);
  for (int t : {5, 9, 57, 64}) {
    Problem ds{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::F32, true), t, 0, 0,
               tile_m};
    ASSERT_EQ(ds.config.n_group, 8);
    check_fused_and_split(ds, random_inputs(ds, rng));
  }
}

// The token masks at decode sizes, where each expert's layout is written
// after the barrier, beside the rows (permute_by_token_masks): E_local of
// 1, 3, 5 and 8 experts a lane of a warp, T where the masks take one and
// two words, K that takes the masks from 33 rows (K = 3 below 64 rows: the
// sorted pair takes 33..64 rows where a kernel holds it), an EP range with
// off-rank rows, tile sizes that split an expert's rows, and one hot expert
// that every token picks (64 rows at one expert: 64 tiles at tile_m 1).
// Each case runs with three tile sizes (the packed layout) and with one
// (lay_out_one_size, as the layer asks: 1, 3 and 16 in turn); with one, the
// cluster kernel's K = 8 cases up to T = 64 take the form with K and the
// mask words as constants (one word to T = 32, two from T = 33).
// TokenMaskPathAtItsBound covers E=1024 at T=256, where the layout is
// written before the barrier instead (its sums do not fit the work area).
TEST(FusedRoutingGpu, TokenMasksAtDecodeSizes) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 3, 16};
  int one_size = 0;  // the next single tile size, 1, 3, 16 in turn
  struct Case {
    RoutingPolicy policy;
    int experts, top_k, local_offset, num_local;  // num_local 0: every expert
  };
  const Case cases[] = {
      {RoutingPolicy::Renormalize, 32, 8, 0, 0},    {RoutingPolicy::Renormalize, 96, 8, 0, 0},
      {RoutingPolicy::TopK, 160, 3, 0, 0},          {RoutingPolicy::Renormalize, 128, 8, 0, 0},
      {RoutingPolicy::DeepSeekV3, 256, 8, 0, 0},    {RoutingPolicy::Default, 384, 6, 100, 256},
      {RoutingPolicy::DeepSeekV3, 256, 8, 40, 150},
  };
  for (const Case& c : cases)
    for (const LogitsType type : kTypes)
      for (const int t : {9, 12, 32, 33, 63, 64, 65})
        for (const std::vector<int>& sizes : {tile_m, std::vector<int>{tile_m[one_size++ % 3]}}) {
          SCOPED_TRACE("tile sizes " + std::to_string(sizes.size()) + ", first " +
                       std::to_string(sizes[0]));
          Problem pr{make_routing(c.policy, c.experts, c.top_k, type,
                                  c.policy == RoutingPolicy::DeepSeekV3),
                     t, c.local_offset, c.num_local, sizes};
          check_fused_and_split(pr, random_inputs(pr, rng));
        }
  for (const std::vector<int>& sizes : {tile_m, std::vector<int>{1}}) {
    Problem hot{make_routing(RoutingPolicy::Renormalize, 256, 8, LogitsType::F32, false), 64, 0, 0,
                sizes};
    Inputs in = random_inputs(hot, rng);
    for (int t = 0; t < hot.num_tokens; ++t)
      in.logits[static_cast<std::size_t>(t) * 256 + 200] += 20.0f;
    check_fused_and_split(hot, in);
  }
}

// The one-warp sort of two keys a lane for a scope.
struct ScopedSortedPair : ScopedDev<bool> {
  explicit ScopedSortedPair(bool on) : ScopedDev(&DevOverrides::sorted_pair, on) {}
};

// From 33 to 64 rows the permutation takes one warp's sort of two keys a
// lane (permute_sorted_pair): both sides of its bounds, on and off, routed
// (the single block and the cluster variant) and precomputed (ids that
// repeat within a token), with off-rank rows, every row on one local
// expert, one hot expert, tile sizes that split an expert's rows into
// several tiles, E=1024 (several experts a searching thread) and grouped
// DeepSeekV3. (The threshold kernels of the policies without groups, E >
// 128 and K >= 8, do not hold the pair: there the masks serve, on or off.)
TEST(FusedRoutingGpu, SortedPairAtItsBounds) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 3, 16};
  struct Shape {
    int t, k;
  };
  // Rows 32, 33, 40, 63, 64, 65.
  const Shape shapes[] = {{4, 8}, {33, 1}, {5, 8}, {9, 7}, {8, 8}, {13, 5}};
  int cases = 0;
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "sorted pair on" : "sorted pair off");
    ScopedSortedPair scoped(on);
    for (Shape sh : shapes)
      for (auto [offset, count] : {std::pair{0, 128}, std::pair{40, 48}}) {
        const RoutingConfig c =
            make_routing(RoutingPolicy::Renormalize, 128, sh.k, LogitsType::F32, false);
        const Problem pr{c, sh.t, offset, count, tile_m};
        check_bound_shape(pr, 7, rng);
        Inputs hot = random_inputs(pr, rng);
        for (int t = 0; t < sh.t; ++t) hot.logits[static_cast<std::size_t>(t) * 128 + 45] += 20.0f;
        check_fused_and_split(pr, hot);
        cases += 4;
      }
    for (int t : {5, 8}) {
      Problem ds{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::BF16, true), t, 0, 0,
                 tile_m};
      check_fused_and_split(ds, random_inputs(ds, rng));
      // K=4: the threshold kernels (K >= 8 at E > 128) leave the pair out.
      Problem big{make_routing(RoutingPolicy::Renormalize, 1024, 4, LogitsType::F32, false), 2 * t,
                  0, 0, tile_m};
      check_fused_and_split(big, random_inputs(big, rng));
      cases += 2;
    }
  }
  EXPECT_EQ(cases, 2 * (6 * 2 * 4 + 2 * 2));
  EXPECT_TRUE(test::routing_dev().sorted_pair);  // restored
}

}  // namespace
}  // namespace unimoe
