// The routing distributions of the synthetic logits (ref/synthetic.h): what
// the CPU reference's routing of make_logits' output gives for each, and the
// names refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "ref/ref.h"
#include "ref/synthetic.h"
#include "unimoe/unimoe.h"

namespace unimoe {
namespace {

MoEConfig config(RoutingPolicy policy, int e, int k) {
  MoEConfig c;
  c.routing.policy = policy;
  c.routing.num_experts = e;
  c.routing.top_k = k;
  c.experts.hidden = 128;
  c.experts.intermediate = 128;
  return c;
}

// Tokens routed to each expert (each token counts once per expert it picks).
std::vector<int> expert_counts(const MoEConfig& c, int t, const std::string& routing) {
  const std::vector<float> logits = ref::make_logits(c, t, 7, routing);
  const ref::Routing r = ref::route(c.routing, logits.data(), t, nullptr);
  std::vector<int> counts(c.routing.num_experts, 0);
  for (int32_t id : r.ids) ++counts.at(id);
  return counts;
}

// hot:P: the hot expert is the first choice of a fraction P of the tokens,
// and by chance (K / E) of some of the rest: P + (1 - P) K / E in all.
TEST(SyntheticRouting, HotExpertTakesTheFractionAsked) {
  const int t = 8000, e = 64, k = 4;
  for (RoutingPolicy policy : {RoutingPolicy::Renormalize, RoutingPolicy::Sigmoid}) {
    const MoEConfig c = config(policy, e, k);
    for (double p : {0.1, 0.5, 1.0}) {
      const std::vector<int> counts = expert_counts(c, t, "hot:" + std::to_string(p));
      const double share = counts[ref::hot_expert(e)] / double(t);
      const double want = p + (1 - p) * k / e;
      EXPECT_NEAR(share, want, 0.02) << "p " << p;
    }
  }
}

// zipf:S: experts of popularity rank r are chosen about in proportion to
// 1 / (r + 1)^S (sampling without replacement flattens the head: the bound
// only asks for the order and a steep enough head).
TEST(SyntheticRouting, ZipfPopularityFollowsTheRank) {
  const int t = 6000, e = 32, k = 2;
  const MoEConfig c = config(RoutingPolicy::Renormalize, e, k);
  const std::vector<int> order = ref::popularity_order(e);
  ASSERT_EQ(std::set<int>(order.begin(), order.end()).size(), std::size_t(e));
  const std::vector<int> counts = expert_counts(c, t, "zipf:1.2");
  // Every token picks K distinct experts.
  int total = 0;
  for (int n : counts) total += n;
  EXPECT_EQ(total, t * k);
  // Decreasing over ranks 0, 1, 3, 7, 15, 31, and rank 0 well above rank 31.
  int last = t + 1;
  for (int r : {0, 1, 3, 7, 15, 31}) {
    EXPECT_LT(counts[order[r]], last) << "rank " << r;
    last = counts[order[r]];
  }
  EXPECT_GT(counts[order[0]], 20 * std::max(1, counts[order[31]]));
  // A flatter S spreads the load: rank 0 takes a smaller share.
  const std::vector<int> flat = expert_counts(c, t, "zipf:0.3");
  EXPECT_LT(flat[order[0]], counts[order[0]]);
}

// uniform and skewed keep their meaning: uniform spreads the load, skewed
// favours low ids.
TEST(SyntheticRouting, UniformAndSkewed) {
  const int t = 6000, e = 16, k = 2;
  const MoEConfig c = config(RoutingPolicy::Renormalize, e, k);
  const std::vector<int> uniform = expert_counts(c, t, "uniform");
  const double mean = double(t) * k / e;
  for (int n : uniform) EXPECT_NEAR(n, mean, 0.15 * mean);
  const std::vector<int> skewed = expert_counts(c, t, "skewed");
  EXPECT_GT(skewed[0], 3 * skewed[e - 1]);
}

TEST(SyntheticRouting, UnknownOrBadDistributionsAreRefused) {
  for (const char* bad : {"", "zipf", "zipf:", "zipf:0", "zipf:-1", "zipf:abc", "zipf:1.2x",
                          "hot:0", "hot:1.5", "hot:nan", "hot", "normal", "Uniform"}) {
    try {
      ref::check_routing_distribution(bad, "--routing");
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "--routing") << bad;
    }
    EXPECT_THROW(ref::make_logits(config(RoutingPolicy::Renormalize, 8, 2), 4, 1, bad), Error) << bad;
  }
  for (const char* good : {"uniform", "skewed", "zipf:1.2", "zipf:0.5", "hot:0.5", "hot:1"})
    EXPECT_NO_THROW(ref::check_routing_distribution(good, "--routing")) << good;
}

}  // namespace
}  // namespace unimoe
