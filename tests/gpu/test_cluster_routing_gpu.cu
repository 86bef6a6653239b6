// The cluster variant's spread kernel over cluster sizes, its two ways at
// their bound, and the routing CTAs' row handoff to CTA 0, held to the
// reference and, bit for bit, to the split launches.
#include <gtest/gtest.h>

#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/routing_cases.h"
#include "common/test_util.h"
#include "core/routing_launch_shape.h"
#include "gpu/fused_routing_cases.h"
#include "gpu/gpu_test_util.h"
#include "gpu/routing_plan_util.h"

namespace unimoe {
namespace {

using test::check_fused_and_split;
using test::legal_routing;
using test::make_routing;
using test::random_inputs;
using test::ScopedDev;
using test::ScopedSpread;
using test::spread_serves;
using Problem = test::RoutingProblem;
using Inputs = test::RoutingInputs;

// The cluster kernel's largest cluster for a scope.
struct ScopedClusterMaxCtas : ScopedDev<int> {
  explicit ScopedClusterMaxCtas(int max_ctas) : ScopedDev(&DevOverrides::cluster_max_ctas, max_ctas) {}
};

// The spread kernel (the cluster variant where it serves, here from T = 1
// on) over clusters of 16 (the device's largest where it runs them), 8 and
// 3 CTAs: every policy, fp32 and bf16, E 8..1024, K 1..32, T from 5 (a short last CTA)
// to 130, grouped DeepSeekV3 with bias, EP ranges with off-rank rows, one
// hot expert, tile sizes that split an expert's rows. Held to the split
// launches bit for bit and to the reference (check_fused_and_split); the
// launch shape decides which cases the spread kernel serves, and most must.
TEST(FusedRoutingGpu, SpreadKernelOverClusterSizes) {
  UNIMOE_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::pair<int, int> shapes[] = {{8, 2}, {64, 6}, {128, 8}, {256, 8}, {384, 8}, {1024, 32},
                                        {160, 22}, {256, 1}};
  const int tokens[] = {5, 17, 64, 130};
  int cases = 0, served = 0, pick = 0;
  for (int max_ctas : {0, 8, 3}) {
    SCOPED_TRACE("max_ctas " + std::to_string(max_ctas));
    ScopedSpread spread({true, max_ctas, 1});  // at every T it serves
    for (RoutingPolicy policy : test::kAllPolicies) {
      // The next shape for each policy: every shape in turn (indexing by the
      // case count, a multiple of 4 tokens, would take only a few of them).
      const auto [e, k] = shapes[pick++ % std::size(shapes)];
      const RoutingConfig c =
          make_routing(policy, e, k, cases % 2 == 0 ? LogitsType::F32 : LogitsType::BF16, cases % 3 != 0);
      if (!legal_routing(c)) continue;
      for (int t : tokens) {
        if (t * k > kFusedMaxRows) continue;
        // Every third case an EP range with off-rank rows.
        const int offset = cases % 3 == 2 ? e / 4 : 0, count = cases % 3 == 2 ? e / 2 : 0;
        Problem pr{c, t, offset, count, {1, 3, 16}};
        served += spread_serves(pr, max_ctas == 0 ? 8 : max_ctas);
        check_fused_and_split(pr, random_inputs(pr, rng));
        ++cases;
      }
    }
    // One hot expert: every token's first choice (its count 130, the rows of
    // every CTA).
    Problem hot{make_routing(RoutingPolicy::Renormalize, 64, 8, LogitsType::F32, false), 130, 0, 0,
                {1, 128}};
    Inputs in = random_inputs(hot, rng);
    for (int t = 0; t < hot.num_tokens; ++t) in.logits[static_cast<std::size_t>(t) * 64 + 3] += 20.0f;
    served += spread_serves(hot, max_ctas == 0 ? 8 : max_ctas);
    check_fused_and_split(hot, in);
    ++cases;
  }
  EXPECT_GT(cases, 100);
  EXPECT_GT(served, cases * 2 / 3);
}

// The cluster variant's two ways (without the spread kernel) on both sides
// of their bound: overlapped while the routing CTAs (7 at most in
// clusters of 8, 15 in clusters of 16, besides CTA 0) have a warp for each
// of their tokens and, DeepSeek, room for all their keys; beyond, every
// CTA routes whole tokens. DeepSeekV3 E=256 (32 warps, 32 tokens' keys a
// CTA): T = 224 overlapped, 225 not (480 and 481 in clusters of 16);
// Renormalize E=1024 (8 warps a CTA): T = 56 and 57 (120 and 121), with an
// EP range and off-rank rows on the second. Clusters of 16 where the device
// runs them (else these calls take clusters of 8 and the smaller bound).
TEST(FusedRoutingGpu, ClusterWaysAtTheirBound) {
  UNIMOE_REQUIRE_GPU();
  ScopedSpread spread({false, 0, 0});  // where the spread kernel would serve
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int> tile_m = {1, 16};
  for (int max_ctas : {routing_shape::kClusterMaxCtas, routing_shape::kClusterMaxCtasNonPortable}) {
    SCOPED_TRACE("clusters of at most " + std::to_string(max_ctas));
    ScopedClusterMaxCtas clusters(max_ctas);
    const int routing_ctas = max_ctas - 1;
    for (int t : {32 * routing_ctas, 32 * routing_ctas + 1}) {
      Problem ds{make_routing(RoutingPolicy::DeepSeekV3, 256, 8, LogitsType::F32, true), t, 0, 0,
                 tile_m};
      check_fused_and_split(ds, random_inputs(ds, rng));
    }
    for (int t : {8 * routing_ctas, 8 * routing_ctas + 1}) {
      Problem pr{make_routing(RoutingPolicy::Renormalize, 1024, 4, LogitsType::BF16, false), t, 300,
                 400, tile_m};
      check_fused_and_split(pr, random_inputs(pr, rng));
    }
  }
}

// The overlapped cluster kernel's routing lanes hand their rows to CTA 0
// by asynchronous stores on an mbarrier (open_row_handoff, hand_off_rows):
// a 32-bit word a row pair at even K, an or a row at odd K, where a word
// can hold the last row of one token and the first of the next, of two
// routing CTAs. Odd and even K and T (odd row counts, tokens split
// between routing CTAs at odd rows), off-rank rows (-1 in a half-word),
// clusters of 8 and 16, against split and the reference. The spread kernel
// is off, so that its range (DeepSeek from T=64 in clusters of 8) takes
// the handoff too.
TEST(FusedRoutingGpu, RowHandoffAtOddAndEvenK) {
  UNIMOE_REQUIRE_GPU();
  ScopedSpread spread({false, 0, 0});
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int cases = 0;
  for (int max_ctas : {routing_shape::kClusterMaxCtas, routing_shape::kClusterMaxCtasNonPortable}) {
    SCOPED_TRACE("clusters of at most " + std::to_string(max_ctas));
    ScopedClusterMaxCtas clusters(max_ctas);
    for (const RoutingPolicy policy : {RoutingPolicy::Renormalize, RoutingPolicy::DeepSeekV3})
      for (const int k : {1, 2, 3, 5, 7, 8})
        for (const int t : {1, 2, 3, 5, 9, 13, 33, 61, 97}) {
          const RoutingConfig c = make_routing(policy, 128, k, LogitsType::F32, cases % 2 == 0);
          if (!legal_routing(c)) continue;
          const bool ep = cases++ % 3 == 1;  // an EP range: off-rank rows
          Problem pr{c, t, ep ? 40 : 0, ep ? 48 : 0, {1, 16}};
          check_fused_and_split(pr, random_inputs(pr, rng));
        }
  }
  EXPECT_GT(cases, 100);  // the loops did run
}

}  // namespace
}  // namespace unimoe
